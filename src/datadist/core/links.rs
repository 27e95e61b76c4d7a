//! Links to peer clusters by their listen addresses, and the peer's cache table, fetched once per link.
//!
//! A link serves both sides, as upstream's does: the cluster that links tells the other, by a
//! notification on the new link ([`LINK_NOTE`]: its cluster id and the address it listens on),
//! where to link back; the other's first pull or push there makes that link (an instance
//! without `llm.ListenIpInfo` listens for it on an ephemeral port of its `local_ip_infos`
//! address, made when it links first). Unlinking tells the other side too ([`UNLINK_NOTE`]),
//! which then drops its link back.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::engine::DdEngine;
use super::{
    DataDist, Inbound, MAX_LINKS, PeerLink, args, last_failure, not_initialized, set_device,
};
use crate::TransferOp;
use crate::datadist::table::{FORMAT, Table};
use crate::datadist::types::{ClusterInfo, Error, LlmStatus, Result};
use crate::published::FetchError;
use crate::runtime::address::AddrDesc;
use crate::runtime::handle::LinkHandle;
use crate::sync::lock;

/// The notification a cluster sends on a link it made: `"<its cluster id> <ip:port it listens on>"`.
pub(super) const LINK_NOTE: &str = "hixl.datadist.link";
/// The notification a cluster sends before it unlinks: `"<its cluster id>"`.
pub(super) const UNLINK_NOTE: &str = "hixl.datadist.unlink";
/// How long a link-back notification may take to be acknowledged (ms).
const NOTE_MS: i32 = 1000;

impl DataDist {
    /// Links to each cluster (`LinkLlmClusters`): the engine connects to its one
    /// `remote_ip_infos` address by `timeout_ms`, and tells the peer where to link back (see
    /// the module's header). Returns the last failure (or success) and each cluster's status.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_PARAM_INVALID` for `timeout_ms <= 0`.
    pub fn link_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout_ms: i32,
    ) -> Result<(LlmStatus, Vec<LlmStatus>)> {
        let (mut engine, config) = self.live()?;
        args::timeout(timeout_ms)?;
        if config.listen.is_none() && lock(&self.links).is_empty() && !self.comms.any() {
            // a cluster that does not listen starts to, so that its peers can link back
            let ip = clusters
                .iter()
                .find_map(|c| c.local_ip_infos.first().map(|i| i.ip));
            // (the engine replaced is the one read under the lock)
            let regs = lock(&self.regs);
            let (_, config) = self.live()?;
            if let Some(ip) = ip.filter(|_| config.listen.is_none()) {
                if let Some(dev) = config.device_id {
                    set_device(dev)?;
                }
                let addr = SocketAddr::new(ip, 0).to_string();
                if let Err(e) = self.relisten(&regs, config, Some(addr)) {
                    tracing::debug!(
                        error = %e,
                        "cannot listen for links back: peers cannot pull from or push to this cluster"
                    );
                }
            }
            engine = self.live()?.0;
        }
        let rets = each_cluster(clusters, |c| match self.link_one(&engine, c, timeout_ms) {
            Ok(()) => LlmStatus::LLM_SUCCESS,
            Err(e) => {
                tracing::debug!(cluster = c.remote_cluster_id, error = %e, "link failed");
                e.status
            }
        });
        Ok((last_failure(&rets), rets))
    }

    fn link_one(&self, engine: &DdEngine, c: &ClusterInfo, timeout_ms: i32) -> Result<()> {
        let ip = args::link_target(self.cluster_id, c)?;
        let remote = std::net::SocketAddr::new(ip.ip, ip.port).to_string();
        {
            let links = lock(&self.links);
            if links.contains_key(&c.remote_cluster_id) {
                return Err(Error::new(
                    LlmStatus::LLM_ALREADY_LINK,
                    format!("cluster {} is linked already", c.remote_cluster_id),
                ));
            }
            if links.len() >= MAX_LINKS {
                return Err(Error::new(
                    LlmStatus::LLM_CLUSTER_NUM_EXCEED_LIMIT,
                    format!("at most {MAX_LINKS} linked clusters"),
                ));
            }
        }
        let link = connect_to(engine, &remote, timeout_ms)?;
        {
            let mut links = lock(&self.links);
            if links.contains_key(&c.remote_cluster_id) {
                // linked meanwhile (by another call, elsewhere): that link serves
                drop(links);
                let _ = engine.disconnect(&remote, &Arc::downgrade(&link), NOTE_MS);
                return Err(Error::new(
                    LlmStatus::LLM_ALREADY_LINK,
                    format!("cluster {} is linked already", c.remote_cluster_id),
                ));
            }
            links.insert(
                c.remote_cluster_id,
                PeerLink::new(remote, Arc::downgrade(&link), None),
            );
        }
        self.announce(engine, c, &link);
        Ok(())
    }

    /// Tells the cluster at the other end of `link` where it can link back to this one (best
    /// effort: a peer that does not take it cannot pull from or push to this cluster, nothing
    /// else).
    fn announce(&self, engine: &DdEngine, c: &ClusterInfo, link: &LinkHandle) {
        let Some(mut me) = self.listen_addr() else {
            return;
        };
        if me.ip().is_unspecified() {
            // a wildcard is no address to reach: this side's address as the link names it
            match c.local_ip_infos.first() {
                Some(ip) => me.set_ip(ip.ip),
                None => return,
            }
        }
        let msg = format!("{} {me}", self.cluster_id);
        if let Err(e) = engine.send_notify(link, LINK_NOTE, &msg, NOTE_MS) {
            tracing::debug!(remote = link.peer, error = %e, "the peer did not take where to link back");
        }
    }

    /// Takes the link notifications peers sent: where clusters that linked here listen, and
    /// which of them unlinked (their links back go). Anything else is not this layer's.
    ///
    /// A note speaks for a cluster only from the engine that cluster linked from: a link note
    /// must name its sender's own address and binds the cluster to the sender, until an unlink
    /// note from that same engine (or an unlink here) ends it; a link note for a cluster that
    /// is bound to another engine, or linked already, changes nothing, and a new binding counts
    /// against [`MAX_LINKS`] with the links.
    pub(super) fn take_notes(&self, engine: &DdEngine) {
        // (links back that unlink notes ended: closed once the notes are applied)
        let mut ended = Vec::new();
        let order = lock(&self.notes);
        for n in engine.take_notifies() {
            match n.name.as_str() {
                LINK_NOTE => {
                    if let Err(why) = self.bind(&n.from, &n.msg) {
                        tracing::debug!(from = n.from, msg = n.msg, why, "a link note refused");
                    }
                }
                UNLINK_NOTE => {
                    let Ok(id) = n.msg.parse::<u64>() else {
                        continue;
                    };
                    // (a claim on the cluster, a note of another engine, is bound in its
                    // place: that engine linked here, and the one it contested is gone)
                    let mut links = lock(&self.links);
                    let mut inbound = lock(&self.inbound);
                    if inbound.get(&id).is_some_and(|b| b.from == n.from)
                        && let Some(b) = inbound.remove(&id)
                        && let Some(c) = b.claim
                    {
                        inbound.insert(id, *c);
                    }
                    if links
                        .get(&id)
                        .is_some_and(|l| l.back.as_deref() == Some(n.from.as_str()))
                        && let Some(l) = links.remove(&id)
                    {
                        if let Some(c) = l.claim {
                            inbound.insert(id, c);
                        }
                        ended.push((l.remote, l.link));
                    }
                }
                _ => tracing::debug!(name = n.name, "a notification that is not a link's"),
            }
        }
        drop(order);
        for (remote, link) in ended {
            let _ = engine.disconnect(&remote, &link, NOTE_MS);
        }
    }

    /// Binds the cluster a link note (`"<cluster id> <ip:port>"`) names to the engine `from`
    /// that sent it, or says why not. A note for a cluster linked back to already, or bound to
    /// another engine, is kept as the cluster's claim (the latest one): it is taken at the
    /// cluster's next pull or push only if the engine it has is gone by then
    /// ([`Self::settle_link_back`], [`Self::link_back`]). Nothing here waits on the network.
    fn bind(&self, from: &str, msg: &str) -> std::result::Result<(), &'static str> {
        let (id, addr) = msg
            .split_once(' ')
            .and_then(|(id, addr)| {
                Some((id.parse::<u64>().ok()?, addr.parse::<SocketAddr>().ok()?))
            })
            .ok_or("malformed")?;
        if id == self.cluster_id {
            return Err("it names this cluster");
        }
        if !names_itself(from, addr) {
            return Err("the address it names is not its sender's");
        }
        let note = Inbound {
            from: from.to_owned(),
            addr: addr.to_string(),
            claim: None,
            instance: None,
        };
        let mut links = lock(&self.links);
        if let Some(l) = links.get_mut(&id) {
            if l.back.is_none() {
                return Err("that cluster is linked already (by this one)");
            }
            // (its engine, restarted on its address, too: the link back is to the old process)
            l.claim = Some(note);
            l.claim_probed = false;
            return Err("that cluster is linked back to: kept as its claim");
        }
        let mut inbound = lock(&self.inbound);
        match inbound.get_mut(&id) {
            Some(b) if b.from == from => {
                // (its engine linked again: whichever process it is now)
                b.instance = None;
                return Ok(());
            }
            Some(b) => {
                b.claim = Some(Box::new(note));
                return Err("that cluster is bound to another engine: kept as its claim");
            }
            None => {}
        }
        if links.len() + inbound.len() >= MAX_LINKS {
            return Err("as many clusters are linked or bound as an instance holds");
        }
        inbound.insert(id, note);
        Ok(())
    }

    /// Cluster `id`'s link back, settled before a pull or push uses it. If the link is gone or
    /// broken, the record becomes a binding again, to be linked back to now
    /// ([`Self::link_back`]): to a claim's engine if that is the engine it had (restarted on
    /// its address), else to the old engine, with a claim taken only if that connect is
    /// refused. A broken link is no proof that its peer is gone (a heartbeat not answered in
    /// time breaks it too), so a live engine keeps its cluster, over a new link. A claim on a
    /// link that looks sound is settled by a PING
    /// ([`peer_gone`](crate::runtime::link::LinkShared::peer_gone)): answered, the claim goes;
    /// no answer in time, both stay.
    fn settle_link_back(&self, engine: &DdEngine, id: u64) {
        let held = (lock(&self.links).get(&id)).and_then(|l| {
            l.back.as_ref()?;
            Some((
                l.remote.clone(),
                l.link.clone(),
                l.claim.as_ref().map(|c| c.from.clone()),
                l.claim_probed,
            ))
        });
        let Some((remote, own, claimant, probed)) = held else {
            return;
        };
        // one PING a claim: once it went unanswered, only the link's own breaking decides
        // (the pulls and pushes of a busy decoder do not wait a probe each)
        let gone = match own.upgrade() {
            None => Some(true),
            Some(l) if probed || claimant.is_none() => l.is_broken().then_some(true),
            Some(l) => l.peer_gone(Duration::from_millis(NOTE_MS.unsigned_abs().into())),
        };
        let mut links = lock(&self.links);
        let Some(l) = links.get_mut(&id).filter(|l| Weak::ptr_eq(&l.link, &own)) else {
            return; // (a record made since)
        };
        match gone {
            Some(true) => {
                let Some(rec) = links.remove(&id) else {
                    return;
                };
                let old = rec.back.unwrap_or_default();
                // the latest claim (another note may have come meanwhile); the engine the
                // cluster had, restarted where it was, is linked back to at once, any other
                // only if nothing listens at the old address any more (`link_back`)
                let binding = match rec.claim {
                    Some(c) if c.from == old && c.addr == remote => c,
                    claim => Inbound {
                        from: old,
                        addr: remote.clone(),
                        claim: claim.map(Box::new),
                        // (not a new process at the address that never linked here)
                        instance: rec.instance,
                    },
                };
                lock(&self.inbound).insert(id, binding);
                drop(links);
                tracing::debug!(cluster = id, remote, "a broken link back: linked back anew");
                let _ = engine.disconnect(&remote, &own, NOTE_MS);
            }
            // (not a claim that came meanwhile)
            Some(false)
                if claimant.is_some() && l.claim.as_ref().map(|c| &c.from) == claimant.as_ref() =>
            {
                l.claim = None;
            }
            None if claimant.is_some() => l.claim_probed = true,
            None | Some(false) => {}
        }
    }

    /// Links back to cluster `id` if it linked to this one and said where it listens. If
    /// nothing listens there any more (the connect is refused: that engine went away) and
    /// another engine claimed the cluster since, that engine is bound and linked back to.
    fn link_back(&self, engine: &DdEngine, id: u64, timeout_ms: i32) -> Result<()> {
        let Some(mut bound) = lock(&self.inbound).get(&id).cloned() else {
            return Err(Error::new(
                LlmStatus::LLM_NOT_YET_LINK,
                format!("cluster {id} is not linked"),
            ));
        };
        let link = loop {
            match engine.connect(&bound.addr, timeout_ms) {
                Ok(l) => break l,
                Err(crate::Error::ConnectFailed { source, .. })
                    if source.kind() == std::io::ErrorKind::ConnectionRefused
                        && bound.claim.is_some() =>
                {
                    // the latest claim, from the binding as it is now
                    let claim = {
                        let mut inbound = lock(&self.inbound);
                        match inbound.get_mut(&id) {
                            Some(b) if b.from == bound.from => b.claim.take().map(|c| {
                                *b = (*c).clone();
                                *c
                            }),
                            _ => None,
                        }
                    };
                    let Some(claim) = claim else {
                        // bound or linked anew meanwhile (by another call)
                        return self.linked_now(id);
                    };
                    tracing::debug!(
                        cluster = id,
                        old = bound.from,
                        new = claim.from,
                        "a binding whose engine went away gives way to the cluster's claim"
                    );
                    bound = claim;
                }
                // another call linked back to it meanwhile
                Err(crate::Error::AlreadyConnected { .. }) => return self.linked_now(id),
                Err(e) => return Err(link_error(e)),
            }
        };
        if bound.instance.is_some_and(|i| i != link.remote_instance) {
            let _ = engine.disconnect(&bound.addr, &Arc::downgrade(&link), NOTE_MS);
            return Err(Error::new(
                LlmStatus::LLM_NOT_YET_LINK,
                format!(
                    "cluster {id}: another process listens at {} than the one linked back to \
                     (it must link here again)",
                    bound.addr
                ),
            ));
        }
        let remote = bound.addr;
        let mut links = lock(&self.links);
        let mut inbound = lock(&self.inbound);
        if links.contains_key(&id) || inbound.get(&id).is_none_or(|b| b.from != bound.from) {
            // linked or bound anew meanwhile (by another call): not this link
            drop((links, inbound));
            let _ = engine.disconnect(&remote, &Arc::downgrade(&link), NOTE_MS);
            return self.linked_now(id);
        }
        inbound.remove(&id);
        drop(inbound);
        let mut rec = PeerLink::new(remote, Arc::downgrade(&link), Some(bound.from));
        rec.instance = Some(link.remote_instance);
        links.insert(id, rec);
        Ok(())
    }

    /// After a link back that another call overtook: fine if the cluster is linked now,
    /// `LLM_NOT_YET_LINK` if it was bound anew meanwhile (the next pull or push links it).
    fn linked_now(&self, id: u64) -> Result<()> {
        if self.is_linked(id) {
            return Ok(());
        }
        Err(Error::new(
            LlmStatus::LLM_NOT_YET_LINK,
            format!("cluster {id} was bound anew while it was linked back to; try again"),
        ))
    }

    /// Unlinks each cluster (`UnlinkLlmClusters`); `force` needs no address. An unknown
    /// cluster is `LLM_NOT_YET_LINK` in its status.
    ///
    /// # Errors
    /// As [`DataDist::link_clusters`].
    pub fn unlink_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout_ms: i32,
        force: bool,
    ) -> Result<(LlmStatus, Vec<LlmStatus>)> {
        let (engine, _) = self.live()?;
        args::timeout(timeout_ms)?;
        self.take_notes(&engine);
        let rets = each_cluster(clusters, |c| {
            let link = lock(&self.links).remove(&c.remote_cluster_id);
            // one link between two clusters, as upstream's: the peer's way back goes too
            let inbound = lock(&self.inbound).remove(&c.remote_cluster_id).is_some();
            // the record's own link (gone: the engine let it go when it broke)
            if let Some(k) = link.as_ref().and_then(|l| l.link.upgrade()) {
                // the peer drops its link back (best effort: it may be gone)
                let msg = self.cluster_id.to_string();
                let _ = engine.send_notify(&k, UNLINK_NOTE, &msg, timeout_ms.min(NOTE_MS));
            }
            match link {
                // a cluster that linked here, and was never linked back to
                None if inbound => LlmStatus::LLM_SUCCESS,
                None => LlmStatus::LLM_NOT_YET_LINK,
                Some(l) => match engine.disconnect(&l.remote, &l.link, timeout_ms) {
                    Ok(()) => LlmStatus::LLM_SUCCESS,
                    // the peer went away first: unlinked all the same
                    Err(e) if force || e.status() == crate::Status::NOT_CONNECTED => {
                        LlmStatus::LLM_SUCCESS
                    }
                    Err(_) => LlmStatus::LLM_UNLINK_FAILED,
                },
            }
        });
        Ok((last_failure(&rets), rets))
    }

    /// The address peers link to: the engine's listen address, with the port it got when
    /// `llm.ListenIpInfo` asks for port 0. `None` before `initialize`, after `finalize`, or for
    /// an instance that does not listen.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        let (engine, config) = self.live().ok()?;
        config.listen.as_ref()?;
        engine.local_engine().parse().ok()
    }

    /// Whether cluster `id` is linked.
    pub fn is_linked(&self, id: u64) -> bool {
        lock(&self.links).contains_key(&id)
    }

    /// The cluster's link (the one its record made) and the peer's table, fetched over that
    /// link at its first use. Once that link went (the engine let it go when it broke), the
    /// cluster is not linked until it is linked again by its own id: a link the engine made
    /// since to the same address is another cluster's.
    pub(super) fn peer(
        &self,
        engine: &DdEngine,
        cluster: u64,
    ) -> Result<(Arc<LinkHandle>, Arc<Table>)> {
        // a peer that unlinked, or linked here, said so
        self.take_notes(engine);
        // the link record: the engine name, the table if fetched (`None`: not linked), the
        // record's link, and whether it is a link back to settle (a note claimed the cluster
        // since, or its link broke or went), by one lock of the links
        let known = || {
            (lock(&self.links).get(&cluster)).map(|l| {
                let settle = l.claim.is_some()
                    || (l.back.is_some() && l.link.upgrade().is_none_or(|k| k.is_broken()));
                (l.remote.clone(), l.table.clone(), l.link.clone(), settle)
            })
        };
        let mut link = known();
        if link.as_ref().is_some_and(|(.., settle)| *settle) {
            // a cluster linked back to that linked here again since, or whose link back
            // broke: linked back anew if its engine is gone or the link broke
            self.settle_link_back(engine, cluster);
            link = known();
        }
        if link.is_none() {
            // a rank-table link may have linked it since the last status query
            self.settle_comms();
            link = known();
        }
        if link.is_none() {
            let (_, config) = self.live()?;
            self.link_back(engine, cluster, config.sync_timeout_ms)?;
            link = known();
        }
        let not_linked = |why: &str| {
            Error::new(
                LlmStatus::LLM_NOT_YET_LINK,
                format!("cluster {cluster} is not linked{why}"),
            )
        };
        let (remote, table, own, _) = link.ok_or_else(|| not_linked(""))?;
        let l = own
            .upgrade()
            .ok_or_else(|| not_linked(&format!(": its link to {remote} broke; link it again")))?;
        if let Some(t) = table {
            return Ok((l, t));
        }
        let t = Arc::new(self.fetch_table(engine, &l, &remote)?);
        // (into this record: not into one a later link of the cluster made)
        if let Some(p) = lock(&self.links).get_mut(&cluster)
            && Weak::ptr_eq(&p.link, &own)
        {
            p.table = Some(t.clone());
        }
        Ok((l, t))
    }

    /// The engine's link to the peer and its table fetched anew.
    pub(super) fn refetch(
        &self,
        engine: &DdEngine,
        cluster: u64,
    ) -> Result<(Arc<LinkHandle>, Arc<Table>)> {
        if let Some(l) = lock(&self.links).get_mut(&cluster) {
            l.table = None;
        }
        self.peer(engine, cluster)
    }

    /// READs `remote`'s cache table (a published table: [`FORMAT`]'s fetch, retried while it
    /// is being rewritten) from the first region of the link's table that holds one, all within
    /// one sync timeout (a peer whose table never reads whole, or that offers many regions
    /// shaped like one, costs no more).
    fn fetch_table(&self, engine: &DdEngine, link: &LinkHandle, remote: &str) -> Result<Table> {
        let regions = &link.table;
        // a buffer of its own (the buffer itself, not its address: it stays mapped while this
        // call holds it, whatever a finalize or an engine swap does to the instance
        // meanwhile): fetches from other peers go on beside this one
        let (timeout, downloads) = {
            let s = lock(&self.state);
            let l = s.as_ref().ok_or_else(not_initialized)?;
            (l.config.sync_timeout(), l.downloads.clone())
        };
        let deadline = Instant::now() + timeout;
        let download = downloads.take(engine, deadline, remote)?;
        let mut why = String::from("the peer publishes no cache table");
        for r in regions
            .iter()
            .filter(|r| FORMAT.is_region(r.access, r.mem_type, r.len))
        {
            let read = |buf: &mut [u8]| -> Result<()> {
                if buf.len() > download.len() {
                    return Err(Error::new(
                        LlmStatus::LLM_FAILED,
                        "a READ past the download buffer",
                    ));
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::new(
                        LlmStatus::LLM_TIMEOUT,
                        format!("reading {remote}'s cache table took over {timeout:?}"),
                    ));
                }
                let d = AddrDesc {
                    local: download.addr(),
                    remote: r.addr,
                    len: buf.len(),
                };
                engine.transfer(link, TransferOp::Read, &[d], left)?;
                #[cfg(test)]
                tests::AFTER_TABLE_READ.with_borrow_mut(|h| h.as_mut().map(|f| f()));
                // SAFETY: the download buffer holds buf.len() bytes (checked) and stays mapped
                // while `download` (its record) lives; no peer may access it (`Access::None`)
                // and only this fetch's READs write it (`Downloads::take` hands a buffer to one
                // fetch at a time), and that READ returned.
                unsafe {
                    std::ptr::copy_nonoverlapping(download.as_ptr(), buf.as_mut_ptr(), buf.len())
                };
                Ok(())
            };
            match FORMAT.fetch(read, deadline) {
                Ok(p) => match Table::decode_payload(&p) {
                    Ok(t) => return Ok(t),
                    Err(e) => why = e.to_string(),
                },
                Err(FetchError::Read(e)) => return Err(e),
                Err(FetchError::Changing) => {
                    return Err(Error::new(
                        LlmStatus::LLM_TIMEOUT,
                        format!(
                            "{remote}'s cache table was being rewritten at every read for {timeout:?}"
                        ),
                    ));
                }
                Err(e) => why = e.to_string(),
            }
        }
        Err(Error::new(
            LlmStatus::LLM_FAILED,
            format!("cannot read {remote}'s cache table: {why}"),
        ))
    }
}

/// Links `engine` to the engine named `remote`: the link made (an engine failure is
/// `LLM_LINK_FAILED`, as upstream's: [`link_error`]).
/// Clusters one call links or unlinks at once (upstream's thread pool for `LinkClusters` and
/// `UnlinkClusters` has 16).
const LINKERS: usize = 16;

/// `one` on each cluster, up to [`LINKERS`] at once, the statuses in the clusters' order: a
/// cluster that does not answer holds up none of the others (sequentially, each waited out the
/// timeouts of those before it).
fn each_cluster(
    clusters: &[ClusterInfo],
    one: impl Fn(&ClusterInfo) -> LlmStatus + Sync,
) -> Vec<LlmStatus> {
    if clusters.len() <= 1 {
        return clusters.iter().map(&one).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rets: Vec<std::sync::Mutex<Option<LlmStatus>>> = clusters
        .iter()
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..clusters.len().min(LINKERS) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(c) = clusters.get(i) else { break };
                    let got = one(c);
                    *rets[i]
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(got);
                }
            });
        }
    });
    rets.into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .unwrap_or(LlmStatus::LLM_FAILED)
        })
        .collect()
}

pub(super) fn connect_to(
    engine: &DdEngine,
    remote: &str,
    timeout_ms: i32,
) -> Result<Arc<LinkHandle>> {
    engine.connect(remote, timeout_ms).map_err(link_error)
}

/// A connect's engine error as LLM-DataDist's: `LLM_LINK_FAILED` where the engine's status
/// is `FAILED`.
fn link_error(e: crate::Error) -> Error {
    let mut e = Error::from(e);
    if e.status == LlmStatus::LLM_FAILED {
        e.status = LlmStatus::LLM_LINK_FAILED;
    }
    e
}

/// Whether `addr`, the address a link note names, is the address of `from`, the engine that
/// sent it: its port, and its IP unless the engine listens on a wildcard (then the note names
/// the address it is reached at, `announce`).
fn names_itself(from: &str, addr: SocketAddr) -> bool {
    from.parse::<SocketAddr>()
        .is_ok_and(|f| f.port() == addr.port() && (f.ip() == addr.ip() || f.ip().is_unspecified()))
}

#[cfg(test)]
mod tests;
