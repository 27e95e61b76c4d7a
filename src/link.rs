//! Links: the capability to transfer with one remote engine.
//!
//! [`Hixl::connect`](crate::Hixl::connect) returns a [`Link`] that *borrows* the connected engine.
//! So a link cannot outlive its engine, the engine cannot leave `Connected` (to deregister memory
//! or finalize) while a link is alive, and `disconnect(self)` consumes the link: using it
//! afterwards does not compile. Several threads may share one link (`&Link` is `Sync`): over
//! TCP each transfer in flight takes a lane (TCP connection) of its own; the other data paths
//! take concurrent batches as their transport allows.
//!
//! The peer's region table arrives with the link. [`Link::remote`] and [`RemoteRegion::range`]
//! validate remote ranges against it locally; the serving side validates every range again.
//!
//! A [`TransferDesc`] pairs a [`LocalRange`] (a sub-range of a region registered with this
//! engine) with a [`RemoteRange`]. Both are capabilities that borrow what they came from, so a
//! descriptor cannot be built from a raw address, cannot outlive its region or link, and cannot
//! name memory that was never registered.

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, check_timeout};
use crate::memory::LocalRange;
use crate::request::{TransferArgs, TransferReq};
use crate::runtime::check::{self, Remote};
use crate::runtime::engine::EngineInner;
use crate::runtime::handle::close_link;
use crate::runtime::link::LinkShared;
use crate::runtime::region::RegionUse;
use crate::types::BatchDesc;
use crate::types::TransferOp;
use crate::types::blocks::{BlockBatch, BlockIndices};
use crate::types::{Access, MemType};
use crate::wire::TableEntry;

/// A connection to one remote engine, borrowed from the connected engine.
pub struct Link<'e> {
    engine: &'e EngineInner,
    pub(crate) shared: Arc<LinkShared>,
}

impl fmt::Debug for Link<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.shared.id)
            .field("peer", &self.shared.peer)
            .field("remote_instance", &self.shared.remote_instance)
            .field("regions", &self.shared.table.len())
            .finish()
    }
}

impl<'e> Link<'e> {
    pub(crate) fn from_shared(engine: &'e EngineInner, shared: Arc<LinkShared>) -> Self {
        Link { engine, shared }
    }

    /// The remote engine's name.
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }
    /// This link's id: unique in the process, and increasing, so it is also the link's
    /// generation: a link that supersedes a broken one to the same peer has a larger id.
    pub fn id(&self) -> u64 {
        self.shared.id
    }
    /// The remote engine's per-process instance id (changes when the peer restarts).
    pub fn remote_instance(&self) -> u64 {
        self.shared.remote_instance
    }
    /// The remote engine's process id, as it reported it.
    pub fn remote_pid(&self) -> u32 {
        self.shared.remote_pid
    }
    /// The transport carrying this link's data: [`TransportKind::SameHost`](crate::TransportKind::SameHost)
    /// when the peer is on this host and the kernel allows it, TCP otherwise.
    pub fn transport(&self) -> crate::TransportKind {
        self.shared.transport()
    }
    /// Whether the link broke (its peer went away or refused a lane). A broken link stays
    /// broken: disconnect it and connect again.
    pub fn is_broken(&self) -> bool {
        self.shared.is_broken()
    }

    /// The peer's registered regions, as it sent them at connect, sorted by address.
    pub fn regions(&self) -> impl ExactSizeIterator<Item = RemoteRegion<'_>> + '_ {
        self.shared.table.iter().map(move |e| RemoteRegion {
            link: self,
            entry: *e,
        })
    }

    /// The peer's region with this id.
    ///
    /// # Errors
    /// [`Error::UnknownRemoteRegion`] (`PARAM_INVALID`) if the peer's table has no such region.
    pub fn region(&self, id: u32) -> Result<RemoteRegion<'_>, Error> {
        self.shared
            .table
            .iter()
            .find(|e| e.id == id)
            .map(|e| RemoteRegion {
                link: self,
                entry: *e,
            })
            .ok_or_else(|| Error::UnknownRemoteRegion {
                peer: self.shared.peer.clone(),
                region: id,
                offset: 0,
                len: 0,
            })
    }

    /// The remote range `addr..addr+len` in the peer's address space (HIXL's form); it must lie
    /// inside one region of the peer's table.
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] (`PARAM_INVALID`) if it does not, or `len` is zero.
    pub fn remote(&self, addr: u64, len: u64) -> Result<RemoteRange<'_>, Error> {
        Ok(RemoteRange::of(self.shared.remote(addr, len)?))
    }

    #[inline]
    fn make_range(&self, e: &TableEntry, offset: u64, len: u64) -> RemoteRange<'_> {
        RemoteRange::of(Remote {
            link: self.shared.id,
            region: e.id,
            offset,
            len,
            access: e.access,
            mem_type: e.mem_type,
        })
    }

    /// Checks a batch (`runtime::check::list`) and turns it into batch descriptors; returns the
    /// byte count.
    fn prepare(
        &self,
        op: TransferOp,
        descs: &[TransferDesc<'_>],
        xds: &mut Vec<BatchDesc>,
    ) -> Result<u64, Error> {
        let pairs = descs.iter().map(|d| Ok((d.local.span(), d.remote.span)));
        check::list(&self.shared, op, descs.len(), pairs, xds)
    }

    /// Runs a batch of READ or WRITE descriptors and returns when all have completed (HIXL
    /// `TransferSync`). The batch goes to the link's first data path that covers it, never one
    /// round trip per descriptor: over TCP in requests of up to 65,536 descriptors (a large
    /// batch split over two lanes), on the other paths in the transport's own batch calls.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`], [`Error::EmptyBatch`],
    ///   [`Error::BatchTooLarge`], [`Error::ForeignHandle`] (a region of another engine or a
    ///   range of another link), [`Error::LengthMismatch`], [`Error::AccessDenied`] (the peer's
    ///   table forbids `op`), or [`Error::Refused`] when the peer's own validation refuses it;
    /// - `TIMEOUT`: [`Error::Timeout`], and the data of the batch is unspecified;
    /// - `NOT_CONNECTED`: [`Error::NotConnected`] when the peer went away (the link is broken);
    /// - `RESOURCE_EXHAUSTED`: [`Error::LanesExhausted`];
    /// - `FAILED`: [`Error::Io`] or [`Error::Protocol`].
    pub fn transfer_sync(
        &self,
        op: TransferOp,
        descs: &[TransferDesc<'_>],
        timeout: Duration,
    ) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let mut xds = Vec::new();
        let bytes = self.prepare(op, descs, &mut xds)?;
        self.shared.run(op, &xds, bytes, timeout)
    }

    /// Starts a batch and returns at once (HIXL `TransferAsync`).
    ///
    /// The request borrows what its descriptors borrow (the link, and each local region), so
    /// while it is held its regions cannot be written or read with `write_at`/`read_at` (they
    /// need `&mut`) and cannot be deregistered: the engine may still be copying them. Starting
    /// many requests and then waiting for all of them is fine (shared borrows). It also owns
    /// what it touches: the local regions stay alive and registered until it ends, even if the
    /// request is dropped or `mem::forget`ten; while a forgotten request has not ended, its
    /// regions answer `read_at`, `write_at` and `deregister` with `RegionBusy` (203900).
    ///
    /// ```no_run
    /// # use hixl::{Error, Link, Region, TransferArgs, TransferDesc, TransferOp, TransferReq, TransferStatus};
    /// # use std::time::Duration;
    /// # fn layers(link: &Link<'_>, kv: &mut Region, remote: u64) -> Result<(), Error> {
    /// // one request per layer, all in flight at once, then wait for every one
    /// let reqs = (0..4usize)
    ///     .map(|i| {
    ///         let local = kv.range(i * 4096..(i + 1) * 4096)?;
    ///         let d = TransferDesc::new(local, link.remote(remote + (i * 4096) as u64, 4096)?);
    ///         link.transfer_async(TransferOp::Write, &[d], TransferArgs::tagged(i as u64))
    ///     })
    ///     .collect::<Result<Vec<TransferReq<'_>>, Error>>()?;
    /// for r in &reqs {
    ///     assert!(matches!(r.wait(Duration::from_secs(5)), TransferStatus::Completed));
    /// }
    /// drop(reqs);
    /// kv.write_at(0, b"next layer")?; // the requests are gone: the region is ours again
    /// # Ok(()) }
    /// ```
    ///
    /// The engine enforces the deadline (`args.timeout` from now): a request that has not
    /// finished by then ends [`TransferStatus::TimedOut`](crate::TransferStatus::TimedOut). Many
    /// requests may be in flight on one link; they run on up to `max_lanes` lanes and complete
    /// in any order.
    ///
    /// # Errors
    /// The validation errors of [`Link::transfer_sync`] (before anything starts), and
    /// [`Error::NotConnected`] if the link is broken.
    pub fn transfer_async<'s>(
        &'s self,
        op: TransferOp,
        descs: &[TransferDesc<'s>],
        args: TransferArgs,
    ) -> Result<TransferReq<'s>, Error> {
        let timeout = check_timeout(args.timeout)?;
        self.shared.check_usable()?;
        let mut xds = Vec::new();
        let bytes = self.prepare(op, descs, &mut xds)?;
        let mut keep: Vec<RegionUse> = Vec::new();
        for d in descs {
            if !keep.iter().any(|k| Arc::ptr_eq(k.core(), d.local.core)) {
                keep.push(RegionUse::new(d.local.core));
            }
        }
        let h = (self.shared).start(op, xds, bytes, keep, timeout, args.user_data)?;
        Ok(TransferReq::new(h))
    }

    /// Checks a block batch's layout once (`runtime::check::layouts`: nothing is checked
    /// per block), then hands the checked batch to `then`.
    fn place<R>(
        &self,
        op: TransferOp,
        layout: &BlockLayout<'_>,
        local_idx: BlockIndices<'_>,
        remote_idx: BlockIndices<'_>,
        then: impl FnOnce(BlockBatch<'_>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let l = check::Layout {
            local: layout.local.span(),
            remote: layout.remote.span,
            block: layout.block_size,
            local_stride: layout.local_stride,
            remote_stride: layout.remote_stride,
        };
        let layouts = check::layouts(&self.shared, op, &[l], local_idx, remote_idx)?;
        then(BlockBatch {
            layouts: &layouts,
            local_idx,
            remote_idx,
        })
    }

    /// Runs a block-indexed batch and returns when every block has moved (an extension of
    /// HIXL: none of its peers has it). Block `i` is `layout.block_size()` bytes at
    /// `local_idx[i] * local_stride` in the layout's local range and at
    /// `remote_idx[i] * remote_stride` in its remote range; the index arrays (`&[u32]` or
    /// `&[u64]`) have the same length, at most [`MAX_BATCH`](crate::MAX_BATCH).
    ///
    /// The batch is checked once, not per block: the layout, the arrays' lengths, and each
    /// side's largest index against its range (overflow-checked). It moves without being
    /// expanded into descriptors over TCP (the wire carries the remote indices; the server
    /// checks the largest against its region once) and same-host (a copy loop over the
    /// indices); UCX and Ascend links expand it once into descriptors.
    ///
    /// Blocks that overlap on the destination side (a repeated destination index) are not
    /// refused: such a block ends with the bytes of one of its sources, or a mix of them (as
    /// for overlapping descriptors of a list batch); checking costs a sort per call.
    ///
    /// ```no_run
    /// # use hixl::{BlockLayout, Error, Link, Region, TransferOp};
    /// # use std::time::Duration;
    /// # fn pull(link: &Link<'_>, kv: &Region, remote: u64, len: u64) -> Result<(), Error> {
    /// let layout = BlockLayout::new(kv.range(..)?, link.remote(remote, len)?, 16 << 10);
    /// let (mine, theirs): (Vec<u32>, Vec<u32>) = ((0..64).collect(), (100..164).collect());
    /// link.transfer_blocks_sync(TransferOp::Read, &layout, &mine, &theirs, Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidBlockLayout`] (a zero block, a stride smaller than
    ///   the block), [`Error::BlockCountMismatch`], [`Error::EmptyBatch`],
    ///   [`Error::BatchTooLarge`], [`Error::BlockOutOfBounds`] (the largest index of a side,
    ///   also when its offset overflows), and the others of [`Link::transfer_sync`];
    /// - `TIMEOUT`, `NOT_CONNECTED`, `RESOURCE_EXHAUSTED`, `FAILED` as for
    ///   [`Link::transfer_sync`].
    pub fn transfer_blocks_sync<'i>(
        &self,
        op: TransferOp,
        layout: &BlockLayout<'_>,
        local_idx: impl Into<BlockIndices<'i>>,
        remote_idx: impl Into<BlockIndices<'i>>,
        timeout: Duration,
    ) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        self.place(op, layout, local_idx.into(), remote_idx.into(), |b| {
            self.shared.run(op, b, b.bytes(), timeout)
        })
    }

    /// Starts a block-indexed batch ([`Link::transfer_blocks_sync`]) and returns at once, as
    /// [`Link::transfer_async`] does; the request keeps a copy of the indices (4 or 8 bytes a
    /// block).
    ///
    /// # Errors
    /// The validation errors of [`Link::transfer_blocks_sync`] (before anything starts), and
    /// [`Error::NotConnected`] if the link is broken.
    pub fn transfer_blocks_async<'s, 'i>(
        &'s self,
        op: TransferOp,
        layout: &BlockLayout<'s>,
        local_idx: impl Into<BlockIndices<'i>>,
        remote_idx: impl Into<BlockIndices<'i>>,
        args: TransferArgs,
    ) -> Result<TransferReq<'s>, Error> {
        let timeout = check_timeout(args.timeout)?;
        self.shared.check_usable()?;
        self.place(op, layout, local_idx.into(), remote_idx.into(), |b| {
            let keep = vec![RegionUse::new(layout.local.core)];
            let h = (self.shared).start(op, b, b.bytes(), keep, timeout, args.user_data)?;
            Ok(TransferReq::new(h))
        })
    }

    /// Sends a notification to the peer and waits for its acknowledgement (HIXL `SendNotify`).
    ///
    /// It is delivered after every transfer started earlier on this link has ended: a
    /// notification sent after a WRITE (sync, also one still running on another thread, or
    /// async and still running) reaches the peer only once that WRITE's data has landed. That
    /// makes it the KV-ready signal.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`], [`Error::NotifyTooLong`];
    /// - `RESOURCE_EXHAUSTED`: the peer has 4096 notifications of this link pending (in
    ///   [`Error::Refused`]);
    /// - `TIMEOUT`: [`Error::Timeout`] (no acknowledgement, or earlier transfers still running);
    /// - `NOT_CONNECTED` and `FAILED` as for transfers.
    pub fn send_notify(&self, name: &str, msg: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        crate::notify::check_lengths(name, msg)?;
        self.shared.notify(name, msg, Instant::now(), timeout)
    }

    /// Closes the link (HIXL `Disconnect`): tells the peer, waits for its acknowledgement up to
    /// `timeout`, and closes every lane. Consumes the link. Async requests of the link that
    /// were dropped or `mem::forget`ten and have not ended are cancelled, and this returns only
    /// once they have ended (a held request borrows the link, so none is held here). Dropping a
    /// link does the same.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`] for a zero timeout (the link is closed anyway); otherwise the
    /// error of the goodbye exchange. The link is closed on the local side in every case.
    pub fn disconnect(self, timeout: Duration) -> Result<(), Error> {
        let r = check_timeout(timeout).and_then(|t| self.shared.close(t));
        self.shared.close_quietly();
        r
    }
}

impl Drop for Link<'_> {
    fn drop(&mut self) {
        close_link(&self.shared, Some(self.engine));
    }
}

/// One region of the peer's table, seen through a link.
#[derive(Clone, Copy)]
pub struct RemoteRegion<'l> {
    link: &'l Link<'l>,
    entry: TableEntry,
}

impl<'l> RemoteRegion<'l> {
    /// The region's id in the peer's table.
    pub fn id(&self) -> u32 {
        self.entry.id
    }
    /// Its start address in the peer's address space.
    pub fn addr(&self) -> u64 {
        self.entry.addr
    }
    /// Its length.
    pub fn len(&self) -> u64 {
        self.entry.len
    }
    /// Always false: empty regions are never registered.
    pub fn is_empty(&self) -> bool {
        self.entry.len == 0
    }
    /// Its memory type.
    pub fn mem_type(&self) -> MemType {
        self.entry.mem_type
    }
    /// What this engine may do with it.
    pub fn access(&self) -> Access {
        self.entry.access
    }
    /// The transport that moves this link's batches on it: the link's
    /// [`transport`](Link::transport), except where the peer does not offer the region to it
    /// (a same-host peer serves memory it cannot keep from its owner, caller-managed memory
    /// registered with `register_raw`, over TCP only).
    pub fn transport(&self) -> crate::TransportKind {
        self.link.shared.transport_of(self.entry.id)
    }
    /// A validated sub-range (offsets relative to the region start).
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] (`PARAM_INVALID`) when it is empty or leaves the region.
    pub fn range(&self, range: impl RangeBounds<u64>) -> Result<RemoteRange<'l>, Error> {
        use std::ops::Bound::*;
        let total = self.entry.len;
        let start = match range.start_bound() {
            Included(&s) => Some(s),
            Excluded(&s) => s.checked_add(1),
            Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Included(&e) => e.checked_add(1),
            Excluded(&e) => Some(e),
            Unbounded => Some(total),
        };
        match (start, end) {
            (Some(s), Some(e)) if s < e && e <= total => {
                Ok(self.link.make_range(&self.entry, s, e - s))
            }
            _ => Err(Error::RangeOutOfBounds {
                region: self.entry.id,
                offset: start.unwrap_or(u64::MAX),
                len: match (start, end) {
                    (Some(s), Some(e)) => e.saturating_sub(s),
                    _ => u64::MAX,
                },
                region_len: total,
            }),
        }
    }
    /// The whole region.
    pub fn full(&self) -> RemoteRange<'l> {
        self.link.make_range(&self.entry, 0, self.entry.len)
    }
}

impl fmt::Debug for RemoteRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRegion")
            .field("id", &self.entry.id)
            .field("addr", &format_args!("{:#x}", self.entry.addr))
            .field("len", &self.entry.len)
            .field("access", &self.entry.access)
            .finish()
    }
}

/// A validated, non-empty range of a region in the peer's table; it borrows its link.
#[derive(Clone, Copy)]
pub struct RemoteRange<'l> {
    pub(crate) span: Remote,
    _link: PhantomData<&'l ()>,
}

impl RemoteRange<'_> {
    fn of(span: Remote) -> Self {
        Self {
            span,
            _link: PhantomData,
        }
    }
    /// The peer's region id.
    pub fn region_id(&self) -> u32 {
        self.span.region
    }
    /// Offset in that region.
    pub fn offset(&self) -> u64 {
        self.span.offset
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.span.len
    }
    /// Always false: ranges are never empty.
    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }
}

impl fmt::Debug for RemoteRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRange")
            .field("link", &self.span.link)
            .field("region", &self.span.region)
            .field("offset", &self.span.offset)
            .field("len", &self.span.len)
            .finish()
    }
}

/// One `{local, remote, len}` descriptor (HIXL `TransferOpDesc`), built from capabilities.
///
/// The lengths of both sides must match; the transfer checks it and reports the index of a
/// descriptor that does not ([`Error::LengthMismatch`](crate::Error::LengthMismatch)).
#[derive(Clone, Copy, Debug)]
pub struct TransferDesc<'a> {
    pub(crate) local: LocalRange<'a>,
    pub(crate) remote: RemoteRange<'a>,
}

impl<'a> TransferDesc<'a> {
    /// Pairs a local and a remote range.
    pub fn new(local: LocalRange<'a>, remote: RemoteRange<'a>) -> Self {
        Self { local, remote }
    }
    /// The local side.
    pub fn local(&self) -> LocalRange<'a> {
        self.local
    }
    /// The remote side.
    pub fn remote(&self) -> RemoteRange<'a> {
        self.remote
    }
}

/// The geometry of a block-indexed transfer ([`Link::transfer_blocks_sync`]): a local range
/// and a remote range (each the base of its blocks: block `k` of a side starts at `k * stride`
/// in its range), the block size, and a stride per side (by default the block size: blocks
/// packed back to back, as in a paged KV cache; a larger stride leaves gaps, as a layer of a
/// layer-interleaved cache). An extension of HIXL.
///
/// It is checked when a transfer uses it ([`Error::InvalidBlockLayout`]), with the indices.
#[derive(Clone, Copy, Debug)]
pub struct BlockLayout<'a> {
    pub(crate) local: LocalRange<'a>,
    pub(crate) remote: RemoteRange<'a>,
    pub(crate) block_size: u64,
    pub(crate) local_stride: u64,
    pub(crate) remote_stride: u64,
}

impl<'a> BlockLayout<'a> {
    /// Blocks of `block_size` bytes packed back to back in `local` and in `remote`.
    pub fn new(local: LocalRange<'a>, remote: RemoteRange<'a>, block_size: u64) -> Self {
        Self {
            local,
            remote,
            block_size,
            local_stride: block_size,
            remote_stride: block_size,
        }
    }
    /// The same layout with these strides (bytes from one block's start to the next's).
    pub fn strides(self, local_stride: u64, remote_stride: u64) -> Self {
        Self {
            local_stride,
            remote_stride,
            ..self
        }
    }
    /// The block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }
    /// The local and remote strides.
    pub fn stride(&self) -> (u64, u64) {
        (self.local_stride, self.remote_stride)
    }
    /// The local range.
    pub fn local(&self) -> LocalRange<'a> {
        self.local
    }
    /// The remote range.
    pub fn remote(&self) -> RemoteRange<'a> {
        self.remote
    }
}
