//! Links by an explicit rank table (the Python package's `link(comm_name, {cluster_id: rank},
//! rank_table)` → comm id, `query_register_mem_status(comm_id)`, `unlink(comm_id)`): the mode
//! vllm-ascend's llmdatadist connector, omni-infer's P/D manager and Mooncake's Ascend
//! bandwidth scripts use.
//!
//! The rendezvous is HCCL's own, as upstream's (`CommLinkManager`): [`DataDist::link_comm`]
//! makes the communicator the rank table describes for this cluster's rank
//! (`HcclCommInitClusterInfoMemConfig`, synchronously) and returns its id (from 1, at most
//! [`MAX_COMMS`] at a time); a task of its own then runs `HcclCommPrepare` and, with each
//! peer rank, `HcclExchangeMemDesc`, swapping a descriptor (JSON: this instance's cluster id,
//! its engine's name `ip:port`, its cache table's address and size). Then, where upstream
//! talks HCCL one-sided over that communicator, hixl links its engine to each peer's engine by
//! the name exchanged, as [`DataDist::link_clusters`] does (both sides do: pulls and pushes go
//! both ways), checks that the peer engine serves a cache table at the address exchanged, and
//! the peers are linked clusters: pulls and pushes to them are those of any link.
//! [`DataDist::query_register_mem_status`] reports the task: `PREPARING`, then `OK` or
//! `FAILED` (a peer that never joins: `FAILED` once `llm.LinkTotalTime` has passed, 30 s by
//! default; a peer rank that is this instance's own or not in the table: `FAILED`).
//!
//! [`DataDist::unlink_comm`] (and `finalize`, for every communicator) stops a task still
//! preparing at its next step, waiting for an HCCL call under way (at most
//! `llm.LinkTotalTime`), as upstream's `Unlink` does.
//!
//! An instance with no `llm.ListenIpInfo` listens for this mode on an ephemeral port of its
//! rank's `server_id` (the rank table's host address), made when it first links this way (the
//! engine is made anew, as `SetRole` with a listen address does: not while other links exist).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::runtime::handle::LinkHandle;
use std::thread::JoinHandle;
use std::time::Duration;

use super::engine::DdEngine;
use super::{Config, DataDist, PeerLink, set_device};
use crate::datadist::table::TABLE_LEN;
use crate::datadist::types::{Error, LlmStatus, Result, valued};
use crate::runtime::transports::{RankComm, rank_server_ip};
use crate::sync::lock;
use crate::{Access, DetachedContext, MemType};

/// Most communicators an instance holds at a time (upstream's `kMaxLinkNum`).
pub const MAX_COMMS: usize = 512;

valued! {
    /// What [`DataDist::link_comm`]'s task is at (upstream's `RegisterMemStatus`; its value is
    /// the Python package's: `OK` 0, `PREPARING` 1, `FAILED` 2).
    pub enum RegisterMemStatus: i32 {
        /// Linked: every peer's engine is linked, pulls and pushes work.
        Ok = 0,
        /// Still preparing (the communicator, the descriptor exchange, the engine links).
        Preparing = 1,
        /// It failed; [`DataDist::unlink_comm`] releases it.
        Failed = 2,
    }
}

/// The default of `llm.LinkTotalTime` (s): upstream's wait for the descriptor exchange.
const DEFAULT_TOTAL_S: u32 = 30;

/// The instance's communicators. Lock order: `serial`, then `by_id`, then the instance's
/// `links` (never `by_id` while holding `links`).
#[derive(Default)]
pub(super) struct Comms {
    by_id: Mutex<BTreeMap<i64, CommLink>>,
    /// Serializes `link_comm` and `unlink_comm` (upstream's `mutex_`).
    serial: Mutex<()>,
    /// The last id handed out.
    last: AtomicI64,
}

impl Comms {
    /// Whether any communicator exists.
    pub(super) fn any(&self) -> bool {
        !lock(&self.by_id).is_empty()
    }
}

/// One communicator and its task.
struct CommLink {
    status: RegisterMemStatus,
    task: Option<JoinHandle<Outcome>>,
    cancel: Arc<AtomicBool>,
    ctx: DetachedContext,
    /// The communicator, once the task returned it.
    comm: Option<RankComm>,
    /// The clusters it linked, once `OK`.
    linked: Vec<Linked>,
}

/// A peer cluster a rank-table task linked: its id, its engine's name and the link made (the
/// engine owns it).
type Linked = (u64, String, Weak<LinkHandle>);

/// What the task hands back: the communicator, and the peers it linked (or why not).
struct Outcome {
    comm: RankComm,
    result: Result<Vec<Linked>>,
}

/// What the task needs.
struct Job {
    ctx: DetachedContext,
    engine: Arc<DdEngine>,
    own_rank: u32,
    /// The peer clusters and their ranks.
    peers: Vec<(u64, u32)>,
    /// This instance's descriptor (JSON).
    desc: String,
    total: Duration,
    retries: u32,
    cancel: Arc<AtomicBool>,
}

/// The descriptor each side posts (JSON, upstream's `cache_table_addr` and `cache_table_size`
/// with hixl's `cluster_id` and `engine`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Desc {
    cluster_id: u64,
    engine: String,
    cache_table_addr: u64,
    cache_table_size: u64,
}

impl Desc {
    fn to_json(&self) -> String {
        serde_json::json!({
            "cluster_id": self.cluster_id,
            "engine": self.engine,
            "cache_table_addr": self.cache_table_addr,
            "cache_table_size": self.cache_table_size,
        })
        .to_string()
    }

    fn parse(text: &str) -> Option<Desc> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        Some(Desc {
            cluster_id: n("cluster_id")?,
            engine: v.get("engine")?.as_str()?.to_owned(),
            cache_table_addr: n("cache_table_addr")?,
            cache_table_size: n("cache_table_size")?,
        })
    }
}

fn link_failed(e: impl std::fmt::Display) -> Error {
    Error::new(LlmStatus::LLM_LINK_FAILED, e.to_string())
}

impl DataDist {
    /// Links to the clusters of `clusters` by an explicit rank table (the Python package's
    /// `link(comm_name, {cluster_id: rank}, rank_table)`): `clusters` maps cluster ids to
    /// their ranks in `rank_table` (HCCL's rank-table JSON, version "1.0" or "1.2") and must
    /// hold this instance's own cluster. The communicator `comm_name` is made now; linking
    /// the peers goes on in the background: poll [`DataDist::query_register_mem_status`]
    /// until it is not `PREPARING`. Returns the comm id (from 1).
    ///
    /// Options of [`DataDist::initialize`] it reads: `llm.LinkTotalTime` (s, the wait for the
    /// peers, 30 by default), `llm.LinkRetryCount` (`HcclCommPrepare` attempts sharing it),
    /// `llm.RdmaTrafficClass`, `llm.RdmaServiceLevel` (the communicator's).
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_PARAM_INVALID` for an empty comm name, one of
    /// 128 bytes or more (or with NUL), `clusters` without this cluster or with a cluster twice,
    /// and with [`MAX_COMMS`] communicators already; `LLM_FEATURE_NOT_ENABLED` where HCCL does
    /// not load or has no `HcclExchangeMemDesc`; `LLM_LINK_FAILED` when HCCL refuses the table
    /// or this cluster's rank in it (or the name of a live communicator), or, for an instance
    /// without a listen address, when its rank's `server_id` is not an IP address;
    /// `LLM_EXIST_LINK` when such an instance has links already (it cannot start listening).
    pub fn link_comm(
        &self,
        comm_name: &str,
        clusters: &[(u64, u32)],
        rank_table: &str,
    ) -> Result<i64> {
        let (_, config) = self.live()?;
        if comm_name.is_empty() || comm_name.len() >= 128 || comm_name.contains('\0') {
            return Err(Error::param(format!(
                "comm name {comm_name:?}: 1 to 127 bytes, no NUL"
            )));
        }
        let mut own = None;
        for (i, &(cluster, rank)) in clusters.iter().enumerate() {
            if clusters[..i].iter().any(|&(c, _)| c == cluster) {
                return Err(Error::param(format!("cluster {cluster} is given twice")));
            }
            if cluster == self.cluster_id {
                own = Some(rank);
            }
        }
        let own_rank = own.ok_or_else(|| {
            Error::param(format!(
                "this instance's cluster {} is not among the clusters",
                self.cluster_id
            ))
        })?;
        let _serial = lock(&self.comms.serial);
        if lock(&self.comms.by_id).len() >= MAX_COMMS {
            return Err(Error::param(format!(
                "at most {MAX_COMMS} communicators: unlink one first"
            )));
        }
        if config.listen.is_none() {
            // (the engine replaced is the one read under the lock)
            let regs = lock(&self.regs);
            let (_, config) = self.live()?;
            if config.listen.is_none() {
                self.listen_for_comms(&regs, config, rank_table, own_rank)?;
            }
        }
        let (engine, config) = self.live()?;
        let table_addr = {
            let s = lock(&self.state);
            s.as_ref().map(|l| l.table.addr() as u64).unwrap_or(0)
        };
        let mut name = engine.local_engine();
        // a wildcard listen address is no name to reach: the rank's host address is
        if let Ok(sa) = name.parse::<std::net::SocketAddr>()
            && sa.ip().is_unspecified()
            && let Some(ip) = rank_server_ip(rank_table, own_rank)
        {
            name = std::net::SocketAddr::new(ip, sa.port()).to_string();
        }
        let desc = Desc {
            cluster_id: self.cluster_id,
            engine: name,
            cache_table_addr: table_addr,
            cache_table_size: TABLE_LEN as u64,
        }
        .to_json();
        let ctx = engine.detach_context();
        let option = |k: &str| {
            config
                .engine_options
                .iter()
                .find(|(key, _)| key == k)
                .and_then(|(_, v)| v.parse::<u32>().ok())
        };
        let (tc, sl) = (option("RdmaTrafficClass"), option("RdmaServiceLevel"));
        let comm = ctx
            .bind(|_| RankComm::init(rank_table, own_rank, comm_name, tc, sl))
            .map_err(link_failed)?
            .map_err(|e| match e.status() {
                crate::Status::UNSUPPORTED => {
                    Error::new(LlmStatus::LLM_FEATURE_NOT_ENABLED, e.to_string())
                }
                _ => link_failed(e),
            })?;
        let id = self.comms.last.fetch_add(1, Ordering::Relaxed) + 1;
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            ctx: ctx.clone(),
            engine,
            own_rank,
            peers: clusters
                .iter()
                .copied()
                .filter(|&(c, _)| c != self.cluster_id)
                .collect(),
            desc,
            total: Duration::from_secs(u64::from(
                config.link_total_time_s.unwrap_or(DEFAULT_TOTAL_S),
            )),
            retries: config.link_retry_count.max(1),
            cancel: cancel.clone(),
        };
        // the thread takes the communicator and hands it back; if it cannot start, it is
        // dropped with the closure (`Comm`'s drop destroys it)
        let task = std::thread::Builder::new()
            .name(format!("hixl-dd-comm-{id}"))
            .spawn(move || run(job, comm))
            .map_err(link_failed)?;
        lock(&self.comms.by_id).insert(
            id,
            CommLink {
                status: RegisterMemStatus::Preparing,
                task: Some(task),
                cancel,
                ctx,
                comm: None,
                linked: Vec::new(),
            },
        );
        tracing::debug!(
            cluster = self.cluster_id,
            comm_id = id,
            comm_name,
            "rank-table link started"
        );
        Ok(id)
    }

    /// The state of communicator `comm_id`'s links (`query_register_mem_status`): `PREPARING`
    /// while its task runs, then `OK` (the peers are linked clusters) or `FAILED`.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_NOT_YET_LINK` for an id that is not a live
    /// communicator's (never made, or unlinked).
    pub fn query_register_mem_status(&self, comm_id: i64) -> Result<RegisterMemStatus> {
        self.live()?;
        self.settle_comms();
        lock(&self.comms.by_id)
            .get(&comm_id)
            .map(|c| c.status)
            .ok_or_else(|| {
                Error::new(
                    LlmStatus::LLM_NOT_YET_LINK,
                    format!("no communicator {comm_id}"),
                )
            })
    }

    /// Unlinks communicator `comm_id` (`unlink(comm_id)`): a task still preparing is stopped
    /// (at its next step: an HCCL call under way runs to its end), the clusters it linked are
    /// unlinked and the communicator destroyed (`HcclCommDestroy`).
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_NOT_YET_LINK` for an unknown id;
    /// `LLM_UNLINK_FAILED` when HCCL does not destroy the communicator (it is forgotten all
    /// the same).
    pub fn unlink_comm(&self, comm_id: i64) -> Result<()> {
        let (engine, _) = self.live()?;
        let _serial = lock(&self.comms.serial);
        let c = lock(&self.comms.by_id).remove(&comm_id).ok_or_else(|| {
            Error::new(
                LlmStatus::LLM_NOT_YET_LINK,
                format!("no communicator {comm_id}"),
            )
        })?;
        self.release(Some(&engine), c)
    }

    /// Unlinks every communicator (at `finalize`).
    pub(super) fn unlink_all_comms(&self) {
        let engine = self.live().ok().map(|(e, _)| e);
        let _serial = lock(&self.comms.serial);
        let all = std::mem::take(&mut *lock(&self.comms.by_id));
        for (id, c) in all {
            if let Err(e) = self.release(engine.as_deref(), c) {
                tracing::warn!(comm_id = id, error = %e.message, "unlink at finalize");
            }
        }
    }

    /// Stops `c`'s task, unlinks what it linked, destroys its communicator.
    fn release(&self, engine: Option<&DdEngine>, mut c: CommLink) -> Result<()> {
        c.cancel.store(true, Ordering::Relaxed);
        let mut linked = std::mem::take(&mut c.linked);
        let mut unadopted = Vec::new();
        if let Some(task) = c.task.take()
            && let Ok(out) = task.join()
        {
            c.comm = Some(out.comm);
            // linked by the task, not yet taken as links
            unadopted = out.result.unwrap_or_default();
        }
        {
            // the records of these links (a cluster unlinked and linked again since has another)
            let mut links = lock(&self.links);
            linked.retain(|(cluster, _, link)| match links.get(cluster) {
                Some(l) if Weak::ptr_eq(&l.link, link) => {
                    links.remove(cluster);
                    true
                }
                _ => false,
            });
        }
        if let Some(engine) = engine {
            for (_, name, link) in linked.iter().chain(&unadopted) {
                if let Err(e) = engine.disconnect(name, link, DISCONNECT_MS) {
                    tracing::debug!(peer = %name, error = %e, "unlink: the engine link was gone");
                }
            }
        }
        match c.comm.take() {
            None => Ok(()),
            Some(comm) => match c.ctx.bind(|_| comm.destroy()) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::new(LlmStatus::LLM_UNLINK_FAILED, e.to_string())),
                Err(e) => Err(Error::new(LlmStatus::LLM_UNLINK_FAILED, e.to_string())),
            },
        }
    }

    /// Collects the tasks that finished: the peers of one that linked them become linked
    /// clusters (`OK`); one that failed, or whose peers are linked already, is `FAILED`.
    pub(super) fn settle_comms(&self) {
        // links of tasks whose peers could not be adopted: closed once the lock is let go (a
        // goodbye waits for its peer; status queries and moves need the lock meanwhile)
        let mut surplus = Vec::new();
        let mut by_id = lock(&self.comms.by_id);
        for (id, c) in by_id.iter_mut() {
            if !c.task.as_ref().is_some_and(JoinHandle::is_finished) {
                continue;
            }
            let Some(task) = c.task.take() else {
                continue;
            };
            let result = match task.join() {
                Ok(out) => {
                    c.comm = Some(out.comm);
                    out.result.and_then(|peers| match self.adopt(&peers) {
                        Ok(()) => Ok(peers),
                        Err(e) => {
                            surplus.extend(peers);
                            Err(e)
                        }
                    })
                }
                Err(_) => Err(Error::new(LlmStatus::LLM_FAILED, "the link task panicked")),
            };
            match result {
                Ok(peers) => {
                    tracing::debug!(comm_id = id, peers = ?peers, "rank-table link ready");
                    c.status = RegisterMemStatus::Ok;
                    c.linked = peers;
                }
                Err(e) => {
                    tracing::info!(comm_id = id, status = ?e.status, error = %e.message, "rank-table link failed");
                    c.status = RegisterMemStatus::Failed;
                }
            }
        }
        drop(by_id);
        if let (false, Ok((engine, _))) = (surplus.is_empty(), self.live()) {
            for (_, name, link) in &surplus {
                let _ = engine.disconnect(name, link, DISCONNECT_MS);
            }
        }
    }

    /// Takes the peers a task linked as linked clusters, all or none.
    fn adopt(&self, peers: &[Linked]) -> Result<()> {
        let mut links = lock(&self.links);
        if let Some((c, _, _)) = peers.iter().find(|(c, _, _)| links.contains_key(c)) {
            return Err(Error::new(
                LlmStatus::LLM_ALREADY_LINK,
                format!("cluster {c} is linked already"),
            ));
        }
        if links.len() + peers.len() > super::MAX_LINKS {
            return Err(Error::new(
                LlmStatus::LLM_CLUSTER_NUM_EXCEED_LIMIT,
                format!("at most {} linked clusters", super::MAX_LINKS),
            ));
        }
        for (c, name, link) in peers {
            links.insert(*c, PeerLink::new(name.clone(), link.clone(), None));
        }
        Ok(())
    }

    /// Makes the engine listen for this mode: on an ephemeral port of `own_rank`'s
    /// `server_id`.
    fn listen_for_comms(
        &self,
        regs: &MutexGuard<'_, ()>,
        config: Arc<Config>,
        rank_table: &str,
        own_rank: u32,
    ) -> Result<()> {
        let ip = rank_server_ip(rank_table, own_rank).ok_or_else(|| {
            link_failed(format!(
                "this instance has no llm.ListenIpInfo, and the server_id of its rank {own_rank} \
                 in the rank table is not an IP address to listen on"
            ))
        })?;
        if !lock(&self.links).is_empty() {
            return Err(Error::new(
                LlmStatus::LLM_EXIST_LINK,
                "an instance without llm.ListenIpInfo listens for its first rank-table link, \
                 which it cannot while links exist: unlink them, or give llm.ListenIpInfo",
            ));
        }
        if let Some(dev) = config.device_id {
            set_device(dev)?;
        }
        let addr = std::net::SocketAddr::new(ip, 0).to_string();
        self.relisten(regs, config, Some(addr))
    }
}

/// How long an unlink waits for the engine to close a link (ms).
const DISCONNECT_MS: i32 = 3000;

/// The task: under the engine's context, prepares the communicator, swaps descriptors with
/// each peer rank, links the engine to each peer's.
fn run(job: Job, comm: RankComm) -> Outcome {
    let result = match job.ctx.bind(|_| link_peers(&job, &comm)) {
        Ok(r) => r,
        Err(e) => Err(link_failed(e)),
    };
    Outcome { comm, result }
}

fn link_peers(job: &Job, comm: &RankComm) -> Result<Vec<Linked>> {
    for &(cluster, rank) in &job.peers {
        if rank == job.own_rank {
            return Err(Error::param(format!(
                "cluster {cluster} is given this instance's own rank {rank}"
            )));
        }
        if comm.has_rank(rank) == Some(false) {
            return Err(Error::param(format!(
                "rank {rank} (cluster {cluster}) is not in the rank table"
            )));
        }
    }
    let go_on = || {
        if job.cancel.load(Ordering::Relaxed) {
            Err(Error::new(LlmStatus::LLM_FAILED, "unlinked while linking"))
        } else {
            Ok(())
        }
    };
    // HcclCommPrepare: the attempts share the total time (upstream's LinkRetryCount)
    let per = (job.total / job.retries).max(Duration::from_secs(1));
    let mut prepared = Ok(());
    for _ in 0..job.retries {
        go_on()?;
        prepared = comm.prepare(per);
        if prepared.is_ok() {
            break;
        }
    }
    prepared.map_err(hccl_failed)?;
    let mut descs = Vec::with_capacity(job.peers.len());
    for &(cluster, rank) in &job.peers {
        go_on()?;
        let text = comm
            .exchange(rank, &job.desc, job.total)
            .map_err(hccl_failed)?
            .ok_or_else(|| link_failed(format!("rank {rank} exchanged no descriptor")))?;
        let d = Desc::parse(&text).ok_or_else(|| {
            Error::param(format!("rank {rank}'s descriptor {text:?} is not hixl's"))
        })?;
        if d.cluster_id != cluster {
            return Err(Error::param(format!(
                "rank {rank} is cluster {}'s, not cluster {cluster}'s",
                d.cluster_id
            )));
        }
        descs.push((cluster, d));
    }
    let mut linked = Vec::with_capacity(descs.len());
    let r = connect_all(job, &descs, &mut linked, go_on);
    if let Err(e) = r {
        for (_, name, link) in &linked {
            let _ = job.engine.disconnect(name, link, DISCONNECT_MS);
        }
        return Err(e);
    }
    Ok(linked)
}

/// Links the engine to each peer's and checks that it serves the cache table exchanged.
fn connect_all(
    job: &Job,
    descs: &[(u64, Desc)],
    linked: &mut Vec<Linked>,
    go_on: impl Fn() -> Result<()>,
) -> Result<()> {
    let timeout_ms = i32::try_from(job.total.as_millis())
        .unwrap_or(i32::MAX)
        .max(1);
    for (cluster, d) in descs {
        go_on()?;
        let link = super::links::connect_to(&job.engine, &d.engine, timeout_ms)?;
        linked.push((*cluster, d.engine.clone(), Arc::downgrade(&link)));
        // (the table of the link made: the one the cluster's moves run on)
        let serves = link.table.iter().any(|r| {
            r.addr == d.cache_table_addr
                && r.len == d.cache_table_size
                && r.access == Access::Read
                && r.mem_type == MemType::Host
        });
        if !serves {
            return Err(link_failed(format!(
                "the engine at {} serves no cache table at {:#x}: not the instance that \
                 exchanged its descriptor",
                d.engine, d.cache_table_addr
            )));
        }
    }
    Ok(())
}

/// An HCCL failure of the task: `LLM_TIMEOUT` for a timeout, else `LLM_LINK_FAILED`.
fn hccl_failed(e: crate::error::Error) -> Error {
    let status = match e.status() {
        crate::Status::TIMEOUT => LlmStatus::LLM_TIMEOUT,
        _ => LlmStatus::LLM_LINK_FAILED,
    };
    Error::new(status, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_fit_hccl() {
        let d = Desc {
            cluster_id: u64::MAX,
            engine: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535".into(),
            cache_table_addr: u64::MAX,
            cache_table_size: TABLE_LEN as u64,
        };
        let text = d.to_json();
        assert!(text.len() < 200, "{text}");
        assert_eq!(Desc::parse(&text), Some(d));
        assert_eq!(Desc::parse("{\"cache_table_addr\":1}"), None);
        assert_eq!(Desc::parse("upstream"), None);
        assert_eq!(RegisterMemStatus::Ok.value(), 0);
        assert_eq!(RegisterMemStatus::Preparing.value(), 1);
        assert_eq!(RegisterMemStatus::Failed.value(), 2);
    }
}
