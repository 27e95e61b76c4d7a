//! The device data path of a link between two Ascend engines, as HIXL's default engine builds
//! it: the handshake exchanges each side's device (DEVICE_HELLO / DEVICE_WELCOME), both build
//! the same two-rank HCCL rank table (rank 0: the serving engine, rank 1: the client; version
//! "1.0", or "1.2" with super-device ids when both sides are A3), then
//! `HcclCommInitClusterInfoMemConfig`, `HcclCommBindMem` for every region, `HcclCommPrepare`;
//! transfers are `HcclBatchPut`/`HcclBatchGet` on the link's stream (at most 256 descriptors
//! per call, 64 on Ascend950) and `aclrtSynchronizeStreamWithTimeout`.
//!
//! As in HIXL's `CommChannel`: a failed transfer aborts the stream (`aclrtStreamAbort`), waits
//! [`ABORT_GUARD`] and tears the communicator down (unbind, destroy); a communicator whose
//! name and rank a new link needs is torn down before the new one is created (a fast
//! reconnect must not meet `HCCL_E_PARA` for a name still in use).
//!
//! In DEVICE_HELLO / DEVICE_WELCOME with status 0 the text field carries, on A3, this side's
//! super-pod ids as a JSON object (`{"super_device_id":"..","super_pod_id":".."}`, what HIXL's
//! local comm res carries for rank table 1.2); it is empty otherwise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::rank_table::{
    CLIENT_RANK, SERVER_RANK, comm_name, my_dev, my_info, parse_dev, rank_table,
};
use super::{Comm, Direction, OneSideDesc, Runtime, hccl_mem};
use crate::device::acl::Stream;
use crate::error::{Error, Status};
use crate::sync::lock;
use crate::transport::ascend::path::AscendLink;
use crate::transport::{Batch, Control, PathFail, Region};
use crate::types::TransferOp;
use crate::types::batch::Descs;
use crate::types::{Access, BatchDesc, RegionView};
use crate::wire::{DeviceInfo, Kind, TableEntry};

/// How long a failed link waits after `aclrtStreamAbort` before it destroys the communicator:
/// the abort cannot stop tasks the AI CPU is already unfolding (HIXL's `kAicpuUnfoldGuardMs`).
pub(crate) const ABORT_GUARD: Duration = Duration::from_millis(100);

/// The HCCL resources of one side of a link, shared with the process-wide table of live
/// communicators (so a new link with the same name and rank can tear them down first).
struct Path {
    rt: Arc<Runtime>,
    bound: Vec<Arc<dyn Region>>,
    comm: Option<Comm>,
    stream: Option<Stream>,
    /// A failed transfer could not abort the stream: copies may still be queued, so nothing
    /// they touch may be unbound, deregistered or freed.
    dirty: bool,
}

impl Path {
    /// Aborts the stream after a failure; on success waits [`ABORT_GUARD`] and tears down.
    fn fail(&mut self, peer: &str) {
        let aborted = match &self.stream {
            Some(s) => self.rt.acl().abort(s),
            None => Ok(()),
        };
        match aborted {
            Ok(()) => {
                std::thread::sleep(ABORT_GUARD);
                self.close(peer);
            }
            Err(e) => {
                tracing::error!(
                    peer,
                    "aclrtStreamAbort failed after a failed transfer ({e}); \
                    the link keeps its memory until the stream can be aborted"
                );
                self.dirty = true;
            }
        }
    }

    /// Unbinds every region, destroys the communicator and the stream. A dirty path aborts its
    /// stream first; if that fails, the communicator, the stream and the regions are leaked
    /// rather than released under a copy the device may still run.
    fn close(&mut self, peer: &str) {
        let rt = self.rt.clone();
        let guard = rt.enter();
        if self.dirty {
            let aborted = match &self.stream {
                Some(s) => rt.acl().abort(s),
                None => Ok(()),
            };
            if let Err(e) = aborted {
                tracing::error!(
                    peer,
                    "the device stream cannot be aborted ({e}); leaking the link's communicator, \
                     stream and {} regions",
                    self.bound.len()
                );
                std::mem::forget(self.comm.take());
                std::mem::forget(self.stream.take());
                std::mem::forget(std::mem::take(&mut self.bound));
                return;
            }
            self.dirty = false;
            std::thread::sleep(ABORT_GUARD);
        }
        if let Some(comm) = self.comm.take() {
            for r in &self.bound {
                if let Some(d) = hccl_mem(&**r)
                    && let Err(e) = rt.hccl.unbind(&comm, d)
                {
                    tracing::warn!("HcclCommUnbindMem failed: {e}");
                }
            }
            if let Err(e) = comm.destroy() {
                tracing::warn!("HcclCommDestroy failed: {e}");
            }
        }
        self.bound.clear();
        if let Some(s) = self.stream.take()
            && let Err(e) = rt.acl().destroy_stream(s)
        {
            tracing::warn!("aclrtDestroyStream failed: {e}");
        }
        drop(guard);
    }
}

/// A live communicator of this process: HCCL library, name, rank.
struct Live {
    lib: String,
    name: String,
    rank: u32,
    path: Weak<Mutex<Path>>,
}

/// Every communicator this process's links hold (dead entries are pruned on the next build).
static LIVE: Mutex<Vec<Live>> = Mutex::new(Vec::new());

/// The live paths of `rt`'s engine.
fn paths_of(rt: &Arc<Runtime>) -> Vec<(u32, Arc<Mutex<Path>>)> {
    let mut live = lock(&LIVE);
    live.retain(|l| l.path.strong_count() > 0);
    live.iter()
        .filter_map(|l| l.path.upgrade().map(|p| (l.rank, p)))
        .filter(|(_, p)| Arc::ptr_eq(&lock(p).rt, rt))
        .collect()
}

/// Binds a region registered while the engine is linked to the communicators of its own links
/// (client side: their transfers may then use it at once; peers learn of it only on a new
/// link). A path that cannot bind it leaves it out (`covers` then keeps batches touching it off
/// the device path).
pub(crate) fn bind_everywhere(rt: &Arc<Runtime>, region: &Arc<dyn Region>) {
    let Some(d) = hccl_mem(&**region) else { return };
    let Ok(_guard) = rt.enter() else { return };
    for (rank, path) in paths_of(rt) {
        if rank != CLIENT_RANK {
            continue;
        }
        let mut p = lock(&path);
        let Some(comm) = &p.comm else { continue };
        match rt.hccl.bind(comm, d) {
            Ok(()) => p.bound.push(region.clone()),
            Err(e) => tracing::warn!("HcclCommBindMem of a new region failed: {e}"),
        }
    }
}

/// Closes every device path of `rt`'s engine that binds region `id` (waiting for a transfer
/// running on it): when this returns, no communicator of the engine holds the memory, so no
/// peer reaches it through HCCL.
pub(crate) fn close_binding(rt: &Arc<Runtime>, id: u32) {
    for (_, path) in paths_of(rt) {
        let mut p = lock(&path);
        if p.bound.iter().any(|r| r.view().id == id) {
            p.close("(a region was deregistered)");
        }
    }
}

/// One side of a link's device data path: the communicator (with this engine's regions bound),
/// the stream, and the peer's rank. Unbinds and destroys everything when dropped.
pub(crate) struct DeviceLink {
    path: Arc<Mutex<Path>>,
    remote_rank: u32,
    per_call: usize,
    peer: String,
    /// Peer region id → its start address (client side).
    remote: HashMap<u32, u64>,
}

impl std::fmt::Debug for DeviceLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLink")
            .field("peer", &self.peer)
            .field("remote_rank", &self.remote_rank)
            .field("per_call", &self.per_call)
            .finish()
    }
}

impl Drop for DeviceLink {
    fn drop(&mut self) {
        lock(&self.path).close(&self.peer);
    }
}

/// Builds this side's communicator: tears down a live communicator of this process with the
/// same name and rank (a fast reconnect), init from the rank table, bind every region, prepare.
#[allow(clippy::too_many_arguments)]
fn build(
    rt: &Arc<Runtime>,
    table: &str,
    rank: u32,
    name: String,
    regions: &[Arc<dyn Region>],
    peer: &str,
    timeout: Duration,
    remote: HashMap<u32, u64>,
) -> Result<DeviceLink, Error> {
    let _guard = rt.enter()?;
    let cfg = super::CommConfig {
        comm_name: name.clone(),
        ..rt.comm.clone()
    };
    let path = Arc::new(Mutex::new(Path {
        rt: rt.clone(),
        bound: Vec::with_capacity(regions.len()),
        comm: None,
        stream: None,
        dirty: false,
    }));
    // from here on, dropping `link` unbinds and destroys
    let link = DeviceLink {
        path: path.clone(),
        remote_rank: if rank == SERVER_RANK {
            CLIENT_RANK
        } else {
            SERVER_RANK
        },
        per_call: rt.soc.max_descs_per_call(),
        peer: peer.to_owned(),
        remote,
    };
    {
        let lib = rt.hccl.library().to_owned();
        let mut live = lock(&LIVE);
        live.retain(|l| l.path.strong_count() > 0);
        let same = |l: &Live| l.lib == lib && l.name == name && l.rank == rank;
        let old: Vec<Arc<Mutex<Path>>> = live
            .iter()
            .filter(|l| same(l))
            .filter_map(|l| l.path.upgrade())
            .collect();
        live.retain(|l| !same(l));
        for o in old {
            tracing::debug!(peer, comm = %name, rank, "destroying the previous communicator of this name first");
            lock(&o).close(peer);
        }
        let comm = rt.hccl.init_comm(table, rank, &cfg)?;
        lock(&path).comm = Some(comm);
        live.push(Live {
            lib,
            name,
            rank,
            path: Arc::downgrade(&path),
        });
    }
    {
        let mut p = lock(&path);
        let Path { comm, bound, .. } = &mut *p;
        let comm = comm.as_ref().expect("just set");
        for r in regions {
            if let Some(d) = hccl_mem(&**r) {
                rt.hccl.bind(comm, d)?;
                bound.push(r.clone());
            }
        }
        rt.hccl.prepare(comm, timeout, peer)?;
        p.stream = Some(rt.acl().create_stream()?);
    }
    Ok(link)
}

/// Client side, on a new link's first lane right after WELCOME: sets up the device data path
/// with the server. `Ok(None)` when the server has no Ascend runtime (the link stays on TCP or
/// the same-host path).
///
/// # Errors
/// Failures of the control channel; HCCL/ACL errors; the server's failure as its refusal.
pub(crate) fn connect(
    rt: &Arc<Runtime>,
    ctl: &mut dyn Control,
    regions: &[Arc<dyn Region>],
    table: &[TableEntry],
    me: &str,
    peer: &str,
    deadline: Instant,
) -> Result<Option<DeviceLink>, Error> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut out = Vec::new();
    my_info(rt, me, left).encode(Kind::DeviceHello, &mut out);
    ctl.send(&out, deadline)?;
    let theirs = match ctl.recv(deadline)? {
        (Kind::DeviceWelcome, p) => {
            DeviceInfo::decode(&p).map_err(|e| ctl.protocol(e.to_string()))?
        }
        (k, _) => return Err(ctl.protocol(format!("expected DeviceWelcome, got {k:?}"))),
    };
    if theirs.status != 0 {
        tracing::debug!(peer, reason = %theirs.reason, "the peer has no device data path");
        return Ok(None);
    }
    let server = parse_dev(&theirs)
        .map_err(|what| ctl.protocol(format!("DEVICE_WELCOME without {what}")))?;
    let client = my_dev(rt, me);
    let remote = table.iter().map(|e| (e.id, e.addr)).collect();
    let left = deadline.saturating_duration_since(Instant::now());
    let link = build(
        rt,
        &rank_table(&server, &client)?,
        CLIENT_RANK,
        comm_name(me, peer),
        regions,
        peer,
        left,
        remote,
    )?;
    // the server reports its own side with DONE for request 0
    let wait = deadline.max(Instant::now() + Duration::from_millis(100));
    let (status, reason) = match ctl.recv(wait)? {
        (Kind::Done, p) => match crate::wire::decode_done(&p) {
            Ok((0, status, reason)) => (status, reason),
            Ok((got, ..)) => {
                return Err(ctl.protocol(format!("DONE for request {got}, expected 0")));
            }
            Err(e) => return Err(ctl.protocol(e.to_string())),
        },
        (k, _) => return Err(ctl.protocol(format!("expected DONE, got {k:?}"))),
    };
    if status != 0 {
        return Err(ctl.refused(Status::from_peer(status), reason));
    }
    Ok(Some(link))
}

/// Server side of DEVICE_HELLO: answers with DEVICE_WELCOME, builds its side, and reports the
/// outcome with DONE (request 0). `send` writes a frame to the client.
///
/// # Errors
/// Only I/O errors from `send`; device failures are reported to the client.
pub(crate) fn serve(
    rt: Option<&Arc<Runtime>>,
    hello: &DeviceInfo,
    regions: &[Arc<dyn Region>],
    me: &str,
    client_name: &str,
    send: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<Option<DeviceLink>> {
    let mut out = Vec::new();
    let refuse = |status: Status, reason: &str, out: &mut Vec<u8>| {
        DeviceInfo {
            status: status.code(),
            device_id: 0,
            device_ip: String::new(),
            host_ip: String::new(),
            timeout_ms: 0,
            reason: reason.to_owned(),
        }
        .encode(Kind::DeviceWelcome, out);
    };
    let Some(rt) = rt else {
        refuse(
            Status::UNSUPPORTED,
            "this engine has no Ascend runtime",
            &mut out,
        );
        send(&out)?;
        return Ok(None);
    };
    let client = match parse_dev(hello) {
        Ok(c) if hello.status == 0 => c,
        Ok(_) => {
            refuse(
                Status::PARAM_INVALID,
                "DEVICE_HELLO with a status",
                &mut out,
            );
            send(&out)?;
            return Ok(None);
        }
        Err(what) => {
            refuse(
                Status::PARAM_INVALID,
                &format!("DEVICE_HELLO without {what}"),
                &mut out,
            );
            send(&out)?;
            return Ok(None);
        }
    };
    // at most a minute: the client's connect timeout bounds the wait, capped against abuse
    let timeout = Duration::from_millis(u64::from(hello.timeout_ms).clamp(1, 60_000));
    my_info(rt, me, timeout).encode(Kind::DeviceWelcome, &mut out);
    send(&out)?;
    let server = my_dev(rt, me);
    // regions peers may neither read nor write are not exposed through the communicator
    let served: Vec<Arc<dyn Region>> = regions
        .iter()
        .filter(|r| r.view().access != Access::None)
        .cloned()
        .collect();
    let r = rank_table(&server, &client).and_then(|table| {
        build(
            rt,
            &table,
            SERVER_RANK,
            comm_name(client_name, me),
            &served,
            client_name,
            timeout,
            HashMap::new(),
        )
    });
    out.clear();
    match r {
        Ok(link) => {
            crate::wire::encode_done(&mut out, 0, 0, "");
            send(&out)?;
            Ok(Some(link))
        }
        Err(e) => {
            crate::wire::encode_done(&mut out, 0, e.status().code(), &e.to_string());
            send(&out)?;
            Ok(None)
        }
    }
}

impl DeviceLink {
    /// Moves `xds` (local addresses inside this engine's bound regions, peer ranges validated
    /// against its table) with HCCL, within `timeout`.
    ///
    /// # Safety
    /// Every local range lies in a region of this engine that stays registered and alive for
    /// the call; for READ, no Rust reference to a local range is live.
    ///
    /// # Errors
    /// [`Error::UnknownRemoteRegion`] for a region the peer's table lacks; what
    /// [`Hccl::transfer`](super::Hccl::transfer) returns.
    pub(crate) unsafe fn transfer(
        &self,
        op: TransferOp,
        xds: &[BatchDesc],
        timeout: Duration,
    ) -> Result<(), Error> {
        let mut p = lock(&self.path);
        let rt = p.rt.clone();
        let r = {
            let (Some(comm), Some(stream)) = (&p.comm, &p.stream) else {
                return Err(Error::NotConnected {
                    peer: self.peer.clone(),
                    why: "the device data path is closed".into(),
                });
            };
            let mut descs = Vec::with_capacity(xds.len());
            for d in xds {
                let Some(base) = self.remote.get(&d.remote.region) else {
                    return Err(Error::UnknownRemoteRegion {
                        peer: self.peer.clone(),
                        region: d.remote.region,
                        offset: d.remote.offset,
                        len: d.remote.len,
                    });
                };
                descs.push(OneSideDesc {
                    local: d.local as u64,
                    remote: base + d.remote.offset,
                    len: d.remote.len,
                });
            }
            let dir = match op {
                TransferOp::Write => Direction::Put,
                TransferOp::Read => Direction::Get,
            };
            // SAFETY: forwarded from the caller; the regions are bound to `comm` (every region
            // of the engine was bound when the link was built), and a failure aborts the
            // stream below before anything is released.
            unsafe {
                rt.hccl.transfer(
                    rt.acl(),
                    comm,
                    self.remote_rank,
                    dir,
                    &descs,
                    self.per_call,
                    stream,
                    timeout,
                    &self.peer,
                )
            }
        };
        if r.is_err() {
            // copies may still be queued (a stream-sync timeout does not cancel them): abort the
            // stream, so that when this call returns the device no longer touches the caller's
            // buffers, and tear the communicator down (the link is unusable now, as in HIXL);
            // if the abort fails, the path stays dirty and keeps its regions
            p.fail(&self.peer);
        }
        r
    }
}

/// The device data path of a link (`ClosablePath` closes it: the communicator is destroyed
/// and the regions unbound when the link closes, not when the last worker lets go of it).
impl AscendLink for DeviceLink {
    const ENTERS_FENCE: bool = false;

    /// Every region of the peer: its table's regions are the communicator's to reach.
    fn reaches(&self, _region: u32) -> bool {
        true
    }

    /// A link with a device path moves every batch whose local ranges lie in regions bound to
    /// its communicator (all of the engine's when the link was made, and those registered
    /// since that could be bound).
    fn covers(&self, descs: &Descs<'_>) -> bool {
        let p = lock(&self.path);
        if p.comm.is_none() {
            return true; // closed: `run` says so
        }
        // the region of the span before is looked at first (a batch in one region: one scan)
        let mut last: Option<RegionView> = None;
        descs.spans().all(|x| {
            let inside = |v: &RegionView| {
                x.local >= v.addr && x.local - v.addr + x.remote.len as usize <= v.len
            };
            if last.as_ref().is_some_and(inside) {
                return true;
            }
            last = p.bound.iter().map(|r| r.view()).find(inside);
            last.is_some()
        })
    }

    /// A failure poisons the link (HIXL: a failed channel is unusable until reconnected).
    /// A batch is not cancelled once it started (it ends by its deadline).
    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        let (op, deadline) = (batch.op, batch.deadline);
        let descs = &batch.descs.expand();
        let timeout = deadline.saturating_duration_since(Instant::now());
        // SAFETY: the caller keeps every local range registered and alive (sync: borrowed
        // ranges; async: the job holds the regions), and no Rust reference to registered memory
        // is ever made.
        let r = unsafe { self.transfer(op, descs, timeout.max(Duration::from_millis(1))) };
        r.map_err(|e| PathFail::Poisoned {
            why: format!("a device transfer failed: {e}"),
            error: e,
        })
    }
}
