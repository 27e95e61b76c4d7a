//! Transfers and notifications: sync and async batches (validated against this engine's
//! regions and the peer's table), request status, and notifies.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{
    ASYNC_DEADLINE, BlockDesc, Core, Error, GetTransferStatusArgs, Hixl, NotifyDesc, Pending, Reg,
    RemoteRegionDesc, Result, TransferArgs, TransferOpDesc, TransferReq, TransferResult,
    TransferStatus, Typed, millis, not_initialized,
};
use crate::sync::lock;
use crate::{Link, Status, TransferOp};

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
        let timeout = millis(timeout_in_millis)?;
        self.on_link(remote_engine, |core, link| {
            with_descriptors(core, link, op_descs, |descs| {
                Ok(link.transfer_sync(op, descs, timeout)?)
            })
        })
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
        self.on_link(remote_engine, |core, link| {
            let targs = crate::TransferArgs::tagged(args.user_data).timeout(deadline);
            let req: crate::TransferReq<'static> =
                with_descriptors(
                    core,
                    link,
                    op_descs,
                    |d| Ok(link.start_async(op, d, targs)?),
                )?;
            // recorded while the core's read lock is held: `finalize` (which takes the write
            // lock) either runs before the request starts, or finds it here
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            lock(&self.reqs).insert(
                id,
                Pending {
                    req: Arc::new(req),
                    user_data: args.user_data,
                },
            );
            Ok(id)
        })
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
        let timeout = millis(timeout_in_millis)?;
        self.on_link(remote_engine, |core, link| {
            let (region, off) = local_base(core, desc.local_addr)?;
            let layout = block_layout(link, &region, off, desc)?;
            Ok(link.transfer_blocks_sync(op, &layout, local_idx, remote_idx, timeout)?)
        })
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
        self.on_link(remote_engine, |core, link| {
            let (region, off) = local_base(core, desc.local_addr)?;
            let layout = block_layout(link, &region, off, desc)?;
            let targs = crate::TransferArgs::tagged(args.user_data).timeout(ASYNC_DEADLINE);
            let req: crate::TransferReq<'static> =
                link.start_blocks_async(op, &layout, local_idx, remote_idx, targs)?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            lock(&self.reqs).insert(
                id,
                Pending {
                    req: Arc::new(req),
                    user_data: args.user_data,
                },
            );
            Ok(id)
        })
    }

    /// HIXL `GetTransferStatus` for one request. A terminal status (completed, timeout,
    /// failed) is reported once: the request is forgotten then.
    ///
    /// # Errors
    /// `FAILED` for an unknown request (never issued, or already reported).
    pub fn get_transfer_status(&self, req: TransferReq) -> Result<TransferStatus> {
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
            Some(Typed::Connected(e)) if e.options().ascend.enable_fabric_mem => {
                return Err(Error::new(
                    Status::UNSUPPORTED,
                    "GetTransferStatus(args, results) is not supported with EnableUseFabricMem=1",
                ));
            }
            Some(Typed::Registered(e)) if e.options().ascend.enable_fabric_mem => {
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
    /// `FAILED` for an unknown request (never issued, or already reported).
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
    /// `FAILED` for an unknown request (never issued, or already reported).
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
            Ok(link
                .regions()
                .map(|r| RemoteRegionDesc {
                    addr: r.addr(),
                    len: r.len(),
                    mem_type: r.mem_type(),
                    access: r.access(),
                    transport: r.transport(),
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
    /// without a link (and no AutoConnect); `NOTIFY_FAILED` when the peer did not take it
    /// (`TIMEOUT`, `RESOURCE_EXHAUSTED` and `NOT_CONNECTED` keep their codes).
    pub fn send_notify(
        &self,
        remote_engine: &str,
        notify: &NotifyDesc,
        timeout_in_millis: i32,
    ) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.on_link(remote_engine, |_, link| {
            link.send_notify(&notify.name, &notify.notify_msg, timeout)
                .map_err(|e| {
                    let mut e = Error::from(e);
                    if e.status == Status::FAILED {
                        e.status = Status::NOTIFY_FAILED;
                    }
                    e
                })
        })
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
            Some(Typed::Connected(e)) => Ok(e.get_notifies()),
            Some(Typed::Registered(e)) => Ok(e.get_notifies()),
            _ => Err(not_initialized()),
        }
    }
}

/// `FAILED` for a request id that is not known (never issued, or its end already reported).
fn unknown_request(req: TransferReq) -> Error {
    Error::new(
        Status::FAILED,
        format!("no transfer request {req:#x} (unknown, or its end was already reported)"),
    )
}

fn status_of(r: &crate::TransferReq<'static>) -> TransferStatus {
    match r.status() {
        crate::TransferStatus::Waiting => TransferStatus::Waiting,
        crate::TransferStatus::Completed => TransferStatus::Completed,
        crate::TransferStatus::TimedOut => TransferStatus::Timeout,
        crate::TransferStatus::Failed(_) | crate::TransferStatus::Cancelled => {
            TransferStatus::Failed
        }
    }
}

/// Runs `f` on the typed descriptors of a batch.
///
/// The common case in one pass ([`registered_descriptors`]); a fabric-memory engine whose batch
/// names local memory that is not registered takes the two-pass path ([`local_regions`], which
/// finds the device allocations, then [`descriptors`]).
fn with_descriptors<T>(
    core: &Core,
    link: &Link<'static>,
    op_descs: &[TransferOpDesc],
    f: impl FnOnce(&[crate::TransferDesc<'_>]) -> Result<T>,
) -> Result<T> {
    match registered_descriptors(core, link, op_descs)? {
        Some(descs) => f(&descs),
        None => {
            let regions = local_regions(core, op_descs)?;
            let descs = descriptors(link, &regions, op_descs)?;
            f(&descs)
        }
    }
}

/// The typed descriptors of a batch whose local ranges all lie in regions registered with
/// this engine, in one pass (each remote range inside one region of the peer's table); `None`
/// when a fabric-memory engine's batch names other local memory.
///
/// A batch's descriptors mostly fall in the region the one before fell in (a KV cache is one
/// region, or a few), so that region is tried first; the region table is searched only when it
/// does not hold the range. One vector, nothing cloned per descriptor (10^5-descriptor batches:
/// issue #35).
fn registered_descriptors<'a>(
    core: &'a Core,
    link: &'a Link<'static>,
    descs: &[TransferOpDesc],
) -> Result<Option<Vec<crate::TransferDesc<'a>>>> {
    let holds = |r: &Reg, d: &TransferOpDesc| {
        d.len > 0
            && d.local_addr >= r.addr()
            && d.local_addr
                .checked_add(d.len)
                .is_some_and(|end| end <= r.addr() + r.len())
    };
    let mut out = Vec::with_capacity(descs.len());
    let mut last: Option<&'a Reg> = None;
    for (i, d) in descs.iter().enumerate() {
        let region = match last {
            Some(r) if holds(r, d) => r,
            _ => {
                let found = core
                    .regions
                    .range(..=d.local_addr)
                    .next_back()
                    .map(|(_, r)| &**r)
                    .filter(|r| holds(r, d));
                let Some(r) = found else {
                    if matches!(&core.engine,
                        Some(Typed::Connected(e)) if e.options().ascend.enable_fabric_mem)
                    {
                        return Ok(None);
                    }
                    return Err(Error::new(
                        Status::PARAM_INVALID,
                        format!(
                            "descriptor {i}: local range {:#x}+{} is not inside one region \
                             registered with this engine",
                            d.local_addr, d.len
                        ),
                    ));
                };
                last = Some(r);
                r
            }
        };
        let off = d.local_addr - region.addr();
        let local = region.range(off..off + d.len)?;
        let remote = link.remote(d.remote_addr as u64, d.len as u64)?;
        out.push(crate::TransferDesc::new(local, remote));
    }
    Ok(Some(out))
}

/// For each descriptor, the registered region holding its local range, and the offset in it
/// (a fabric-memory engine: or the live device allocation ACL says holds it).
fn local_regions(core: &Core, descs: &[TransferOpDesc]) -> Result<Vec<(Arc<Reg>, usize)>> {
    let mut out = Vec::with_capacity(descs.len());
    // unregistered device allocations found in this call (a fabric-memory engine's)
    let mut found_unregistered: Vec<Arc<Reg>> = Vec::new();
    for (i, d) in descs.iter().enumerate() {
        let found = core
            .regions
            .range(..=d.local_addr)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| {
                d.len > 0
                    && d.local_addr
                        .checked_add(d.len)
                        .is_some_and(|end| end <= r.addr() + r.len())
            });
        match found {
            Some(r) => out.push((r.clone(), d.local_addr - r.addr())),
            None => {
                // a fabric-memory engine also copies local device memory that is not
                // registered, as upstream's FabricMem engine does, when ACL says it lies inside
                // one live device allocation
                let inside = |r: &Arc<Reg>| {
                    d.local_addr >= r.addr()
                        && d.local_addr
                            .checked_add(d.len)
                            .is_some_and(|end| end <= r.addr() + r.len())
                };
                if d.len > 0
                    && let Some(r) = found_unregistered.iter().find(|r| inside(r))
                {
                    out.push((r.clone(), d.local_addr - r.addr()));
                    continue;
                }
                let why = match &core.engine {
                    Some(Typed::Connected(e))
                        if e.options().ascend.enable_fabric_mem && d.len > 0 =>
                    {
                        match e.unregistered_device(d.local_addr, d.len) {
                            Ok(r) => {
                                let r = Arc::new(Reg::Caller(r));
                                out.push((r.clone(), d.local_addr - r.addr()));
                                found_unregistered.push(r);
                                continue;
                            }
                            Err(why) => why,
                        }
                    }
                    _ => "",
                };
                return Err(Error::new(
                    Status::PARAM_INVALID,
                    format!(
                        "descriptor {i}: local range {:#x}+{} is not inside one region registered \
                         with this engine{}{why}",
                        d.local_addr,
                        d.len,
                        if why.is_empty() {
                            ""
                        } else {
                            ", nor unregistered device memory a fabric-memory engine copies: "
                        }
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// The typed descriptors: local ranges from the regions found, remote ranges validated against
/// the peer's table.
fn descriptors<'a>(
    link: &'a Link<'static>,
    regions: &'a [(Arc<Reg>, usize)],
    descs: &[TransferOpDesc],
) -> Result<Vec<crate::TransferDesc<'a>>> {
    descs
        .iter()
        .zip(regions)
        .map(|(d, (region, off))| {
            let local = region.range(*off..*off + d.len)?;
            let remote = link.remote(d.remote_addr as u64, d.len as u64)?;
            Ok(crate::TransferDesc::new(local, remote))
        })
        .collect()
}

/// The registered region holding local address `addr`, and its offset in it.
fn local_base(core: &Core, addr: usize) -> Result<(Arc<Reg>, usize)> {
    core.regions
        .range(..=addr)
        .next_back()
        .map(|(_, r)| r)
        .filter(|r| addr < r.addr() + r.len())
        .map(|r| (r.clone(), addr - r.addr()))
        .ok_or_else(|| {
            Error::new(
                Status::PARAM_INVALID,
                format!("block base {addr:#x} is not inside a region registered with this engine"),
            )
        })
}

/// A block transfer's typed layout: from each base address to the end of its region.
fn block_layout<'a>(
    link: &'a Link<'static>,
    region: &'a Reg,
    off: usize,
    desc: &BlockDesc,
) -> Result<crate::BlockLayout<'a>> {
    let local = region.range(off..region.len())?;
    let addr = desc.remote_addr as u64;
    let r = link
        .regions()
        .find(|r| r.addr() <= addr && addr - r.addr() < r.len())
        .ok_or_else(|| {
            Error::new(
                Status::PARAM_INVALID,
                format!("remote block base {addr:#x} is not inside a region of the peer's table"),
            )
        })?;
    let remote = r.range(addr - r.addr()..)?;
    let stride = |s: u64| if s == 0 { desc.block_size } else { s };
    Ok(crate::BlockLayout::new(local, remote, desc.block_size)
        .strides(stride(desc.local_stride), stride(desc.remote_stride)))
}
