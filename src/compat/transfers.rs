//! Transfers and notifications: sync and async batches (validated against this engine's
//! regions and the peer's table), request status, and notifies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::connections::time_left;
use super::{
    ASYNC_DEADLINE, BlockDesc, Error, GetTransferStatusArgs, Hixl, NotifyDesc, Pending,
    RemoteRegionDesc, Result, TransferArgs, TransferOpDesc, TransferReq, TransferResult,
    TransferStatus, millis, not_initialized,
};
use crate::runtime::address::{self, AddrDesc};
use crate::runtime::check;
use crate::runtime::handle::{Engine, ReqHandle};
use crate::runtime::link::LinkShared;
use crate::runtime::region::RegionUse;
use crate::sync::lock;
use crate::types::blocks::{BlockBatch, Placed};
use crate::{Status, TransferOp};

impl Hixl {
    /// HIXL `TransferSync`: READ (remote → local) or WRITE (local → remote) a batch.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad timeout, an empty batch, a zero length, a local range not in
    /// one registered region (a fabric-memory engine also takes one inside a live ACL device
    /// allocation, as upstream's FabricMem engine does: `docs/ascend.md`), a remote range not
    /// in one region of the peer's table (or one it forbids), a source overlapping a
    /// destination on a fabric-memory engine's link to itself; `NOT_CONNECTED` without a link
    /// (and no AutoConnect), or when the peer went away; `TIMEOUT`; `FAILED`.
    pub fn transfer_sync(
        &self,
        remote_engine: &str,
        op: TransferOp,
        op_descs: &[TransferOpDesc],
        timeout_in_millis: i32,
    ) -> Result<()> {
        let deadline = Instant::now() + millis(timeout_in_millis)?;
        self.no_null(remote_engine, op_descs)?;
        self.on_link_by(
            remote_engine,
            Some(deadline),
            |e, link| {
                let mut keep = Vec::new();
                let (xds, bytes) = address::batch(e, link, op, addrs(op_descs), Some(&mut keep))?;
                Ok((keep, xds, bytes))
            },
            |link, (_in_use, xds, bytes)| {
                let left = time_left(deadline, op.name(), remote_engine)?;
                Ok(link.run(op, &xds, bytes, left)?)
            },
            |_| true,
        )
    }

    /// HIXL `TransferAsync`: starts a batch and returns its request id (non-zero). The engine
    /// enforces a deadline of [`ASYNC_DEADLINE`] on it (then its status is `Timeout`).
    ///
    /// # Errors
    /// The validation errors of [`Hixl::transfer_sync`], before anything starts.
    pub fn transfer_async(
        &self,
        remote_engine: &str,
        op: TransferOp,
        op_descs: &[TransferOpDesc],
        args: TransferArgs,
    ) -> Result<TransferReq> {
        self.start_async(remote_engine, op, op_descs, args, ASYNC_DEADLINE)
    }

    /// [`Hixl::transfer_async`] with the request's deadline `timeout_in_millis` from now (an
    /// extension of HIXL, whose requests carry none: what NIXL's HIXL backend gives each
    /// posted transfer). Past it the request ends `Timeout`, and from then on the engine no
    /// longer touches its local buffers.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a timeout ≤ 0; the validation errors of [`Hixl::transfer_sync`],
    /// before anything starts.
    pub fn transfer_async_within(
        &self,
        remote_engine: &str,
        op: TransferOp,
        op_descs: &[TransferOpDesc],
        args: TransferArgs,
        timeout_in_millis: i32,
    ) -> Result<TransferReq> {
        let deadline = millis(timeout_in_millis)?;
        self.start_async(remote_engine, op, op_descs, args, deadline)
    }

    fn start_async(
        &self,
        remote_engine: &str,
        op: TransferOp,
        op_descs: &[TransferOpDesc],
        args: TransferArgs,
        deadline: Duration,
    ) -> Result<TransferReq> {
        self.no_null(remote_engine, op_descs)?;
        self.on_link(remote_engine, |e, link| {
            let mut keep = Vec::new();
            let (xds, bytes) = address::batch(e, link, op, addrs(op_descs), Some(&mut keep))?;
            let req = (link.shared()).start(op, xds, bytes, keep, deadline, args.user_data)?;
            Ok(self.record(req, args.user_data))
        })
    }

    /// A descriptor with a null local or remote address: `PARAM_INVALID` before the link is
    /// looked up or made, as HIXL's `CheckTransferOpDescs` runs before its engine looks for the
    /// channel (after its initialized check: `FAILED` first).
    fn no_null(&self, remote_engine: &str, op_descs: &[TransferOpDesc]) -> Result<()> {
        self.connected(&self.read())?;
        for (index, d) in op_descs.iter().enumerate() {
            let err = if d.local_addr == 0 {
                crate::Error::LocalNotRegistered {
                    index,
                    addr: 0,
                    len: d.len,
                    why: " (a null address)".into(),
                }
            } else if d.remote_addr == 0 {
                crate::Error::RemoteNotRegistered {
                    peer: remote_engine.into(),
                    addr: 0,
                    len: d.len as u64,
                }
            } else {
                continue;
            };
            return Err(err.into());
        }
        Ok(())
    }

    /// A started request's id, the request recorded under it. Called while the core's read
    /// lock is held: `finalize` (which takes the write lock) either runs before the request
    /// starts, or finds it here.
    fn record(&self, req: ReqHandle, user_data: u64) -> TransferReq {
        let id = next_request();
        let req = Arc::new(req);
        lock(&self.reqs).insert(id, Pending { req, user_data });
        id
    }

    /// A block-indexed READ or WRITE (an extension of HIXL; see
    /// [`crate::Link::transfer_blocks_sync`]): block `i` moves between local block
    /// `local_idx[i]` and remote block `remote_idx[i]` of `desc`'s geometry. Checked once per
    /// call: each side's largest index against the rest of its region from its base address.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad timeout, a base address in no registered region (local) or in
    /// no region of the peer's table (remote), a zero block size, a stride smaller than the
    /// block, index arrays of different lengths (or none), an index whose block leaves its
    /// region; the others as [`Hixl::transfer_sync`].
    pub fn transfer_blocks_sync(
        &self,
        remote_engine: &str,
        op: TransferOp,
        desc: &BlockDesc,
        local_idx: crate::BlockIndices<'_>,
        remote_idx: crate::BlockIndices<'_>,
        timeout_in_millis: i32,
    ) -> Result<()> {
        let deadline = Instant::now() + millis(timeout_in_millis)?;
        self.on_link_by(
            remote_engine,
            Some(deadline),
            |e, link| placed(e, link, op, desc, local_idx, remote_idx),
            |link, (_in_use, layouts)| {
                let b = BlockBatch {
                    layouts: &layouts,
                    local_idx,
                    remote_idx,
                };
                let left = time_left(deadline, op.name(), remote_engine)?;
                Ok(link.run(op, b, b.bytes(), left)?)
            },
            |_| true,
        )
    }

    /// [`Hixl::transfer_blocks_sync`] started as an async request, as
    /// [`Hixl::transfer_async`] (its indices are copied).
    ///
    /// # Errors
    /// The validation errors of [`Hixl::transfer_blocks_sync`], before anything starts.
    pub fn transfer_blocks_async(
        &self,
        remote_engine: &str,
        op: TransferOp,
        desc: &BlockDesc,
        local_idx: crate::BlockIndices<'_>,
        remote_idx: crate::BlockIndices<'_>,
        args: TransferArgs,
    ) -> Result<TransferReq> {
        self.on_link(remote_engine, |e, link| {
            let (in_use, layouts) = placed(e, link, op, desc, local_idx, remote_idx)?;
            let b = BlockBatch {
                layouts: &layouts,
                local_idx,
                remote_idx,
            };
            let user_data = args.user_data;
            let req =
                (link.shared()).start(op, b, b.bytes(), vec![in_use], ASYNC_DEADLINE, user_data)?;
            Ok(self.record(req, user_data))
        })
    }

    /// HIXL `GetTransferStatus` for one request. A terminal status (completed, timeout,
    /// failed) is reported once: the request is forgotten then.
    ///
    /// # Errors
    /// `PARAM_INVALID` for an unknown request (never issued, or already reported), `FAILED`
    /// for request 0 (as HIXL's `GetTransferStatus`).
    pub fn get_transfer_status(&self, req: TransferReq) -> Result<TransferStatus> {
        self.initialized()?;
        let mut reqs = lock(&self.reqs);
        let Some(p) = reqs.get(&req) else {
            return Err(unknown_request(req));
        };
        let st = status_of(&p.req);
        if st != TransferStatus::Waiting {
            reqs.remove(&req);
        }
        Ok(st)
    }

    /// HIXL's many-request `GetTransferStatus`: up to `max_query_count` requests, oldest
    /// first, leaving out waiting ones with `skip_waiting`; terminal ones are forgotten once
    /// reported.
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub fn get_transfer_statuses(
        &self,
        args: GetTransferStatusArgs,
    ) -> Result<Vec<TransferResult>> {
        match &self.read().engine {
            None => return Err(not_initialized()),
            // upstream's FabricMem engine answers the many-request form with UNSUPPORTED
            Some(e) if e.options.ascend.enable_fabric_mem => {
                return Err(Error::new(
                    Status::UNSUPPORTED,
                    "GetTransferStatus(args, results) is not supported with EnableUseFabricMem=1",
                ));
            }
            Some(_) => {}
        }
        let mut reqs = lock(&self.reqs);
        let mut out = Vec::new();
        let mut done = Vec::new();
        for (&id, p) in reqs.iter() {
            if out.len() >= args.max_query_count as usize {
                break;
            }
            let status = status_of(&p.req);
            if status == TransferStatus::Waiting {
                if args.skip_waiting {
                    continue;
                }
            } else {
                done.push(id);
            }
            out.push(TransferResult {
                req: id,
                user_data: p.user_data,
                status,
            });
        }
        for id in done {
            reqs.remove(&id);
        }
        Ok(out)
    }

    /// Cancels an async request (an extension of HIXL, which has no cancel): descriptors not
    /// yet started are skipped, and its status becomes `Failed` once what was running ended.
    /// The request stays known until its terminal status is reported.
    ///
    /// # Errors
    /// `PARAM_INVALID` for an unknown request (never issued, or already reported), `FAILED`
    /// for request 0 (as HIXL's `GetTransferStatus`).
    pub fn cancel_transfer(&self, req: TransferReq) -> Result<()> {
        match lock(&self.reqs).get(&req) {
            Some(p) => {
                p.req.cancel();
                Ok(())
            }
            None => Err(unknown_request(req)),
        }
    }

    /// Waits up to `timeout` for a request to end (an extension of HIXL, whose callers poll
    /// [`Hixl::get_transfer_status`]); reports its status as that call does (a terminal status
    /// once, then the request is forgotten).
    ///
    /// # Errors
    /// `PARAM_INVALID` for an unknown request (never issued, or already reported), `FAILED`
    /// for request 0 (as HIXL's `GetTransferStatus`).
    pub fn wait_transfer(&self, req: TransferReq, timeout: Duration) -> Result<TransferStatus> {
        let Some(r) = lock(&self.reqs).get(&req).map(|p| p.req.clone()) else {
            return Err(unknown_request(req));
        };
        r.wait(timeout);
        drop(r);
        self.get_transfer_status(req)
    }

    /// The region table `remote_engine` sent at connect (an extension of HIXL, whose users
    /// ship base addresses out of band), sorted by address.
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for a bad name; `NOT_CONNECTED` without a
    /// usable link (with AutoConnect, one is made).
    pub fn remote_regions(&self, remote_engine: &str) -> Result<Vec<RemoteRegionDesc>> {
        self.on_link(remote_engine, |_, link| {
            Ok((link.table.iter())
                .map(|r| RemoteRegionDesc {
                    addr: r.addr,
                    len: r.len,
                    mem_type: r.mem_type,
                    access: r.access,
                    transport: link.transport_of(r.id),
                })
                .collect())
        })
    }

    /// The transport of the link to `remote_engine` (TCP, same-host, UCX, Ascend), if one
    /// is held.
    ///
    /// # Errors
    /// As [`Hixl::remote_regions`].
    pub fn transport(&self, remote_engine: &str) -> Result<crate::TransportKind> {
        self.on_link(remote_engine, |_, link| Ok(link.transport()))
    }

    /// How many async requests have not been reported terminal yet.
    pub fn pending_transfers(&self) -> usize {
        lock(&self.reqs).len()
    }

    /// HIXL `SendNotify`: delivered after every transfer started before it on the link.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad timeout or a name/message over 1024 bytes; `NOT_CONNECTED`
    /// without a link (and no AutoConnect); `TIMEOUT` when the peer did not acknowledge it in
    /// time; the cause's own code otherwise (HIXL never returns `NOTIFY_FAILED`). A failed
    /// notification drops an AutoConnect link only when the link broke (`NOT_CONNECTED`): as
    /// HIXL's `SendNotify`, it does not end the link's transfers in flight.
    pub fn send_notify(
        &self,
        remote_engine: &str,
        notify: &NotifyDesc,
        timeout_in_millis: i32,
    ) -> Result<()> {
        // the arguments first, as HIXL's SendNotify: before the engine's state and its link
        let deadline = Instant::now() + millis(timeout_in_millis)?;
        crate::notify::check_lengths(&notify.name, &notify.notify_msg)?;
        // sent without the core's lock: the acknowledgement may be slow to come. Only a link
        // that broke counts as the link's failure (with AutoConnect, dropping it would end the
        // transfers in flight on it): not a slow acknowledgement, nor its time going by while
        // this engine's earlier transfers run
        self.on_link_by(
            remote_engine,
            Some(deadline),
            |_, _| Ok(()),
            |link, ()| {
                let timeout = time_left(deadline, "notify", remote_engine)?;
                Ok(link.notify(&notify.name, &notify.notify_msg, Instant::now(), timeout)?)
            },
            |e| e.status == Status::NOT_CONNECTED,
        )
    }

    /// HIXL `GetNotifies`: every notification received so far, oldest first.
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub fn get_notifies(&self) -> Result<Vec<NotifyDesc>> {
        Ok(self
            .take_notifies()?
            .into_iter()
            .map(|n| NotifyDesc {
                name: n.name,
                notify_msg: n.msg,
            })
            .collect())
    }

    /// [`Hixl::get_notifies`] with the name each sender's engine gave in its handshake (what
    /// LLM-DataDist binds a cluster's link notes to).
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub(crate) fn take_notifies(&self) -> Result<Vec<crate::Notify>> {
        match &self.read().engine {
            Some(e) => Ok(e.notifies.drain()),
            None => Err(not_initialized()),
        }
    }
}

/// The next async request id: unique in the process, not per engine (as memory handles are,
/// `lifecycle::next_handle`), so an id one engine gave out never names a request of another:
/// given to another engine it is unknown there (`FAILED`), never that engine's own request's
/// status, wait or cancel. Increasing, so an engine's table stays oldest first. Never 0.
fn next_request() -> TransferReq {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `FAILED` for a request id that is not known (never issued, or its end already reported).
/// HIXL's answer for a request it does not know: `FAILED` for request 0 (a null `TransferReq`),
/// `PARAM_INVALID` for any other (never issued, or its end already reported), as HIXL's
/// `GetTransferStatus`.
fn unknown_request(req: TransferReq) -> Error {
    if req == 0 {
        return Error::new(Status::FAILED, "request 0 (a null request)");
    }
    Error::new(
        Status::PARAM_INVALID,
        format!("no transfer request {req:#x} (unknown, or its end was already reported)"),
    )
}

fn status_of(r: &ReqHandle) -> TransferStatus {
    match r.status() {
        crate::TransferStatus::Waiting => TransferStatus::Waiting,
        crate::TransferStatus::Completed => TransferStatus::Completed,
        crate::TransferStatus::TimedOut => TransferStatus::Timeout,
        crate::TransferStatus::Failed(_) | crate::TransferStatus::Cancelled => {
            TransferStatus::Failed
        }
    }
}

/// A batch's descriptors as the core's address descriptors.
fn addrs(descs: &[TransferOpDesc]) -> impl ExactSizeIterator<Item = AddrDesc> + Clone + '_ {
    descs.iter().map(|d| AddrDesc {
        local: d.local_addr,
        remote: d.remote_addr as u64,
        len: d.len,
    })
}

/// A block batch checked (`check::layouts`): its layouts, and the registered region holding its
/// local base (its layout runs from each base address to the end of its region), kept in use.
fn placed(
    e: &Engine,
    link: &LinkShared,
    op: TransferOp,
    desc: &BlockDesc,
    local_idx: crate::BlockIndices<'_>,
    remote_idx: crate::BlockIndices<'_>,
) -> Result<(RegionUse, Vec<Placed>)> {
    let (region, off) = address::local_base(e, desc.local_addr).map_err(|_| {
        Error::new(
            Status::PARAM_INVALID,
            format!(
                "block base {:#x} is not inside a region registered with this engine",
                desc.local_addr
            ),
        )
    })?;
    let strides = (desc.local_stride, desc.remote_stride);
    let remote = desc.remote_addr as u64;
    let layout = address::block_layout(link, &region, off, remote, desc.block_size, strides)
        .map_err(|_| {
            Error::new(
                Status::PARAM_INVALID,
                format!("remote block base {remote:#x} is not inside a region of the peer's table"),
            )
        })?;
    let layouts = check::layouts(link, op, &[layout], local_idx, remote_idx)?;
    Ok((RegionUse::new(&region), layouts))
}
