//! The client-side checks of a batch, once for every face: a batch is a list of (local span,
//! remote span) pairs, or block layouts sharing two index arrays, and what it may move is decided
//! here before any data path sees it. The typed face builds the spans from its capabilities
//! ([`LocalRange`](crate::LocalRange), [`RemoteRange`](crate::RemoteRange)); the compat engine,
//! LLM-DataDist and HIXL-CS from addresses, through the engine's region index and the link's
//! peer table ([`LinkShared::remote`]).

use crate::error::Error;
use crate::runtime::link::{LinkShared, MAX_BATCH};
use crate::runtime::region::RegionCore;
use crate::types::blocks::{BlockIndices, Placed, WireBlocks};
use crate::types::{Access, BatchDesc, MemType, TransferOp, WireDesc};
use crate::wire::TableEntry;

/// A local span: `len` bytes at `offset` in a region of this engine (checked against the region
/// when it was made).
#[derive(Clone, Copy)]
pub(crate) struct Local<'a> {
    pub(crate) core: &'a RegionCore,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl Local<'_> {
    /// The address of its first byte.
    pub(crate) fn ptr(&self) -> usize {
        self.core.ptr_at(self.offset) as usize
    }
}

/// A remote span: `len` bytes at `offset` in region `region` of link `link`'s peer table, with
/// what the peer lets this engine do there (checked against the table when it was made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remote {
    pub(crate) link: u64,
    pub(crate) region: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) mem_type: MemType,
}

impl LinkShared {
    /// The remote span `addr..addr+len` in the peer's address space: it must lie inside one
    /// region of the peer's table (the one lookup of the peer's table a face does per range).
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] (`PARAM_INVALID`) if it does not, or `len` is zero.
    #[inline]
    pub(crate) fn remote(&self, addr: u64, len: u64) -> Result<Remote, Error> {
        let not_registered = || Error::RemoteNotRegistered {
            peer: self.peer.clone(),
            addr,
            len,
        };
        let table = &self.table;
        let end = addr
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or_else(not_registered)?;
        let i = table.partition_point(|e| e.addr <= addr);
        let e = i
            .checked_sub(1)
            .map(|i| &table[i])
            .ok_or_else(not_registered)?;
        if end > e.addr + e.len {
            return Err(not_registered());
        }
        Ok(self.in_entry(e, addr - e.addr, len))
    }

    /// The span `offset..offset+len` of table entry `e` (checked by the caller).
    fn in_entry(&self, e: &TableEntry, offset: u64, len: u64) -> Remote {
        Remote {
            link: self.id,
            region: e.id,
            offset,
            len,
            access: e.access,
            mem_type: e.mem_type,
        }
    }

    /// The span from `addr` to the end of the peer's region that holds it (a block layout's
    /// remote base).
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] (`PARAM_INVALID`) if no region of the table holds `addr`.
    pub(crate) fn remote_from(&self, addr: u64) -> Result<Remote, Error> {
        let i = self.table.partition_point(|e| e.addr <= addr);
        let e = i
            .checked_sub(1)
            .map(|i| &self.table[i])
            .filter(|e| addr - e.addr < e.len)
            .ok_or_else(|| Error::RemoteNotRegistered {
                peer: self.peer.clone(),
                addr,
                len: 0,
            })?;
        Ok(self.in_entry(e, addr - e.addr, e.len - (addr - e.addr)))
    }
}

/// A batch of `n` descriptors or blocks: not empty ([`Error::EmptyBatch`]), at most
/// [`MAX_BATCH`] ([`Error::BatchTooLarge`]).
fn count(n: usize) -> Result<(), Error> {
    if n == 0 {
        return Err(Error::EmptyBatch);
    }
    if n > MAX_BATCH {
        return Err(Error::BatchTooLarge {
            count: n,
            limit: MAX_BATCH,
        });
    }
    Ok(())
}

/// A span of another engine or link: [`Error::ForeignHandle`].
fn owned(link: &LinkShared, local: &Local<'_>, remote: &Remote) -> Result<(), Error> {
    let (engine, id) = (link.engine_id, link.id);
    if local.core.engine != engine {
        return Err(Error::ForeignHandle {
            what: "local region",
            owner: local.core.engine,
            engine,
        });
    }
    if remote.link != id {
        return Err(Error::ForeignHandle {
            what: "remote range",
            owner: remote.link,
            engine: id,
        });
    }
    Ok(())
}

/// A side the peer forbids ([`Error::AccessDenied`]), or memory the link cannot move
/// ([`Error::UnsupportedMemory`]).
fn permitted(
    op: TransferOp,
    host_only: bool,
    local: &Local<'_>,
    remote: &Remote,
) -> Result<(), Error> {
    if !remote.access.permits(op) {
        return Err(Error::AccessDenied {
            op,
            region: remote.region,
            access: remote.access.name(),
        });
    }
    if host_only && local.core.mem_type != MemType::Host {
        return Err(Error::UnsupportedMemory {
            mem_type: local.core.mem_type,
            why: "the tcp and same-host transports move host memory only",
        });
    }
    if host_only && remote.mem_type != MemType::Host {
        return Err(Error::UnsupportedMemory {
            mem_type: remote.mem_type,
            why: "the peer's region is device memory: it needs a device link (Ascend on both \
                  engines)",
        });
    }
    Ok(())
}

/// Checks a list batch on `link` and turns it into batch descriptors (appended to `out`);
/// returns the byte count. `n` is the number of pairs `descs` yields; a face that resolves
/// addresses into spans as it goes yields its lookup's error in place of a pair.
///
/// # Errors
/// `PARAM_INVALID`: [`Error::EmptyBatch`], [`Error::BatchTooLarge`], [`Error::ForeignHandle`],
/// [`Error::LengthMismatch`], [`Error::AccessDenied`]; `UNSUPPORTED`:
/// [`Error::UnsupportedMemory`] (device memory on a link without a device path).
pub(crate) fn list<'a>(
    link: &LinkShared,
    op: TransferOp,
    n: usize,
    descs: impl Iterator<Item = Result<(Local<'a>, Remote), Error>>,
    out: &mut Vec<BatchDesc>,
) -> Result<u64, Error> {
    count(n)?;
    let mut bytes = 0u64;
    out.reserve(n);
    let host_only = !link.has_device_path();
    for (index, pair) in descs.enumerate() {
        let (local, remote) = pair?;
        owned(link, &local, &remote)?;
        if local.len as u64 != remote.len {
            return Err(Error::LengthMismatch {
                index,
                local: local.len as u64,
                remote: remote.len,
            });
        }
        permitted(op, host_only, &local, &remote)?;
        bytes += remote.len;
        out.push(BatchDesc {
            local: local.ptr(),
            remote: WireDesc {
                region: remote.region,
                offset: remote.offset,
                len: remote.len,
            },
        });
    }
    Ok(bytes)
}

/// A block layout in spans (one of a block batch's): blocks of `block` bytes, block `k` of a side at `k * stride` in
/// its span.
#[derive(Clone, Copy)]
pub(crate) struct Layout<'a> {
    pub(crate) local: Local<'a>,
    pub(crate) remote: Remote,
    pub(crate) block: u64,
    pub(crate) local_stride: u64,
    pub(crate) remote_stride: u64,
}

/// Checks a block batch once: each layout (its block and strides; ownership, access and
/// memory type as for a list batch), both index arrays' lengths, and each side's largest index
/// (found once) against each layout's span, overflow-checked: nothing is checked per block.
/// Returns the layouts as a data path moves them, for a [`BlockBatch`] over the same indices.
///
/// # Errors
/// `PARAM_INVALID`: [`Error::InvalidBlockLayout`], [`Error::BlockCountMismatch`],
/// [`Error::EmptyBatch`] (no index, or no layout), [`Error::BatchTooLarge`],
/// [`Error::BlockOutOfBounds`], and those of [`list`].
pub(crate) fn layouts(
    link: &LinkShared,
    op: TransferOp,
    layouts: &[Layout<'_>],
    local_idx: BlockIndices<'_>,
    remote_idx: BlockIndices<'_>,
) -> Result<Vec<Placed>, Error> {
    if local_idx.len() != remote_idx.len() {
        return Err(Error::BlockCountMismatch {
            local: local_idx.len(),
            remote: remote_idx.len(),
        });
    }
    count(local_idx.len())?;
    if layouts.is_empty() {
        return Err(Error::EmptyBatch);
    }
    let host_only = !link.has_device_path();
    // each side's largest index, once for every layout
    let (lmax, rmax) = (local_idx.max().unwrap_or(0), remote_idx.max().unwrap_or(0));
    let mut out = Vec::with_capacity(layouts.len());
    for layout in layouts {
        let (block, ls, rs) = (layout.block, layout.local_stride, layout.remote_stride);
        let bad_layout = |problem| Error::InvalidBlockLayout {
            block_size: block,
            local_stride: ls,
            remote_stride: rs,
            problem,
        };
        if block == 0 {
            return Err(bad_layout("the block size is zero"));
        }
        if ls < block || rs < block {
            return Err(bad_layout(
                "a stride is smaller than the block (its blocks would overlap)",
            ));
        }
        let (local, remote) = (&layout.local, &layout.remote);
        owned(link, local, remote)?;
        permitted(op, host_only, local, remote)?;
        let extent = |side, idx: BlockIndices<'_>, max: u64, stride: u64, span_len: u64| match max
            .checked_mul(stride)
            .and_then(|o| o.checked_add(block))
        {
            Some(end) if end <= span_len => Ok(end),
            _ => Err(Error::BlockOutOfBounds {
                side,
                position: idx.position(max),
                block: max,
                stride,
                block_size: block,
                range_len: span_len,
            }),
        };
        out.push(Placed {
            local: local.ptr(),
            local_stride: ls,
            remote: WireBlocks {
                region: remote.region,
                offset: remote.offset,
                block,
                stride: rs,
            },
            local_extent: extent("local", local_idx, lmax, ls, local.len as u64)?,
            remote_extent: extent("remote", remote_idx, rmax, rs, remote.len)?,
        });
    }
    Ok(out)
}
