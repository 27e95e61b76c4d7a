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
use std::time::Duration;

use super::engine::{DdEngine, Moved};
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
        let mut rets = Vec::with_capacity(clusters.len());
        for c in clusters {
            rets.push(match self.link_one(&engine, c, timeout_ms) {
                Ok(()) => LlmStatus::LLM_SUCCESS,
                Err(e) => {
                    tracing::debug!(cluster = c.remote_cluster_id, error = %e, "link failed");
                    e.status
                }
            });
        }
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
        let notes = engine.take_notifies();
        for n in notes {
            match n.name.as_str() {
                LINK_NOTE => {
                    if let Err(why) = self.bind(engine, &n.from, &n.msg) {
                        tracing::debug!(from = n.from, msg = n.msg, why, "a link note refused");
                    }
                }
                UNLINK_NOTE => {
                    let Ok(id) = n.msg.parse::<u64>() else {
                        continue;
                    };
                    let mut links = lock(&self.links);
                    let mut inbound = lock(&self.inbound);
                    if inbound.get(&id).is_some_and(|b| b.from == n.from) {
                        inbound.remove(&id);
                    }
                    drop(inbound);
                    if links
                        .get(&id)
                        .is_some_and(|l| l.back.as_deref() == Some(n.from.as_str()))
                        && let Some(l) = links.remove(&id)
                    {
                        drop(links);
                        let _ = engine.disconnect(&l.remote, &l.link, NOTE_MS);
                    }
                }
                _ => tracing::debug!(name = n.name, "a notification that is not a link's"),
            }
        }
    }

    /// Binds the cluster a link note (`"<cluster id> <ip:port>"`) names to the engine `from`
    /// that sent it, or says why not. A link back to that cluster, or a binding of it to
    /// another engine, whose peer went away gives way first ([`Self::drop_dead_link_back`],
    /// [`Self::try_binding`]).
    fn bind(
        &self,
        engine: &DdEngine,
        from: &str,
        msg: &str,
    ) -> std::result::Result<(), &'static str> {
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
        self.drop_dead_link_back(engine, id);
        self.try_binding(engine, id, from);
        let links = lock(&self.links);
        if links.contains_key(&id) {
            return Err("that cluster is linked already");
        }
        let mut inbound = lock(&self.inbound);
        match inbound.get(&id) {
            Some(b) if b.from == from => return Ok(()),
            Some(_) => return Err("that cluster is bound to another engine"),
            None => {}
        }
        if links.len() + inbound.len() >= MAX_LINKS {
            return Err("as many clusters are linked or bound as an instance holds");
        }
        let from = from.to_owned();
        let addr = addr.to_string();
        inbound.insert(id, Inbound { from, addr });
        Ok(())
    }

    /// Lets go of the link back to cluster `id` (made on a link note of that cluster) once its
    /// peer went away: the link is gone, or fails a heartbeat now. A cluster that crashed or
    /// restarted and links here again is bound anew (its note would find the cluster linked
    /// already, and its pushes would fail until this cluster unlinked one it never linked). A
    /// link that still reaches its peer stays; a link this cluster made itself is the caller's
    /// to unlink.
    fn drop_dead_link_back(&self, engine: &DdEngine, id: u64) {
        let held = (lock(&self.links).get(&id))
            .filter(|l| l.back.is_some())
            .map(|l| (l.remote.clone(), l.link.clone()));
        let Some((remote, own)) = held else { return };
        let probe = Duration::from_millis(NOTE_MS.unsigned_abs().into());
        if own.upgrade().is_some_and(|l| l.reaches_peer(probe)) {
            return;
        }
        let gone = {
            let mut links = lock(&self.links);
            match links.get(&id) {
                // (not a record made since)
                Some(l) if Weak::ptr_eq(&l.link, &own) => links.remove(&id),
                _ => None,
            }
        };
        if gone.is_some() {
            tracing::debug!(
                cluster = id,
                remote,
                "a link back whose peer went away gives way"
            );
            let _ = engine.disconnect(&remote, &own, NOTE_MS);
        }
    }

    /// A binding of cluster `id` to another engine than `from` is tried at once: it becomes
    /// the link back if that engine is reached (the note of `from` is then refused: the cluster
    /// is linked), and goes if it is not (a cluster that crashed before this one linked back,
    /// and links here again from elsewhere; its pushes went to the dead engine's address).
    fn try_binding(&self, engine: &DdEngine, id: u64, from: &str) {
        let other = (lock(&self.inbound).get(&id))
            .filter(|b| b.from != from)
            .map(|b| b.from.clone());
        let Some(old) = other else { return };
        if let Err(e) = self.link_back(engine, id, NOTE_MS) {
            tracing::debug!(cluster = id, old, error = %e, "a binding whose engine is not reached gives way");
            let mut inbound = lock(&self.inbound);
            if inbound.get(&id).is_some_and(|b| b.from == old) {
                inbound.remove(&id);
            }
        }
    }

    /// Links back to cluster `id` if it linked to this one and said where it listens.
    fn link_back(&self, engine: &DdEngine, id: u64, timeout_ms: i32) -> Result<()> {
        let Some(bound) = lock(&self.inbound).get(&id).cloned() else {
            return Err(Error::new(
                LlmStatus::LLM_NOT_YET_LINK,
                format!("cluster {id} is not linked"),
            ));
        };
        let remote = bound.addr;
        let link = connect_to(engine, &remote, timeout_ms)?;
        let mut links = lock(&self.links);
        if links.contains_key(&id) {
            // linked meanwhile (by another call): that link serves
            drop(links);
            let _ = engine.disconnect(&remote, &Arc::downgrade(&link), NOTE_MS);
            return Ok(());
        }
        lock(&self.inbound).remove(&id);
        links.insert(
            id,
            PeerLink::new(remote, Arc::downgrade(&link), Some(bound.from)),
        );
        Ok(())
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
        let mut rets = Vec::with_capacity(clusters.len());
        for c in clusters {
            let link = lock(&self.links).remove(&c.remote_cluster_id);
            // one link between two clusters, as upstream's: the peer's way back goes too
            let inbound = lock(&self.inbound).remove(&c.remote_cluster_id).is_some();
            // the record's own link (gone: the engine let it go when it broke)
            if let Some(k) = link.as_ref().and_then(|l| l.link.upgrade()) {
                // the peer drops its link back (best effort: it may be gone)
                let msg = self.cluster_id.to_string();
                let _ = engine.send_notify(&k, UNLINK_NOTE, &msg, timeout_ms.min(NOTE_MS));
            }
            rets.push(match link {
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
            });
        }
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
        // the link record: the engine name, the table if fetched (`None`: not linked) and the
        // record's link, by one lock of the links
        let known = || {
            (lock(&self.links).get(&cluster))
                .map(|l| (l.remote.clone(), l.table.clone(), l.link.clone()))
        };
        let mut link = known();
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
        let (remote, table, own) = link.ok_or_else(|| not_linked(""))?;
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
    /// is being rewritten) from the first region of the link's table that holds one.
    fn fetch_table(&self, engine: &DdEngine, link: &LinkHandle, remote: &str) -> Result<Table> {
        let regions = &link.table;
        let (timeout, download) = {
            let s = lock(&self.state);
            let l = s.as_ref().ok_or_else(not_initialized)?;
            (
                l.config.sync_timeout(),
                (l.download.addr(), l.download.as_ptr(), l.download.len()),
            )
        };
        let _one = lock(&self.fetch);
        let mut why = String::from("the peer publishes no cache table");
        for r in regions
            .iter()
            .filter(|r| FORMAT.is_region(r.access, r.mem_type, r.len))
        {
            let read = |buf: &mut [u8]| -> Result<()> {
                if buf.len() > download.2 {
                    return Err(Error::new(
                        LlmStatus::LLM_FAILED,
                        "a READ past the download buffer",
                    ));
                }
                let d = AddrDesc {
                    local: download.0,
                    remote: r.addr,
                    len: buf.len(),
                };
                engine.transfer(link, Moved::Addrs(TransferOp::Read, &[d]), timeout)?;
                // SAFETY: the download buffer holds buf.len() bytes (checked) and is alive
                // while the instance is (this call holds the engine); only this instance's
                // READs write it, one at a time (`fetch`), and that READ returned.
                unsafe { std::ptr::copy_nonoverlapping(download.1, buf.as_mut_ptr(), buf.len()) };
                Ok(())
            };
            match FORMAT.fetch(read) {
                Ok(p) => match Table::decode_payload(&p) {
                    Ok(t) => return Ok(t),
                    Err(e) => why = e.to_string(),
                },
                Err(FetchError::Read(e)) => return Err(e),
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
/// `LLM_LINK_FAILED`, as upstream's).
pub(super) fn connect_to(
    engine: &DdEngine,
    remote: &str,
    timeout_ms: i32,
) -> Result<Arc<LinkHandle>> {
    engine.connect(remote, timeout_ms).map_err(|e| {
        let mut e = Error::from(e);
        if e.status == LlmStatus::LLM_FAILED {
            e.status = LlmStatus::LLM_LINK_FAILED;
        }
        e
    })
}

/// Whether `addr`, the address a link note names, is the address of `from`, the engine that
/// sent it: its port, and its IP unless the engine listens on a wildcard (then the note names
/// the address it is reached at, `announce`).
fn names_itself(from: &str, addr: SocketAddr) -> bool {
    from.parse::<SocketAddr>()
        .is_ok_and(|f| f.port() == addr.port() && (f.ip() == addr.ip() || f.ip().is_unspecified()))
}
