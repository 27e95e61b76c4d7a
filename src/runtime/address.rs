//! Batches given as addresses (HIXL's integer form), once for the faces and products that take
//! them (the compat engine, HIXL-CS): each descriptor's local range is found in the engine's
//! regions (its index, [`Engine::with_index`]), its remote range in the link's peer table
//! ([`LinkShared::remote`]), then the batch is checked as any other (`check::list`,
//! `check::layouts`).

use std::sync::Arc;

use crate::error::Error;
use crate::runtime::check::{self, Layout, Local};
use crate::runtime::handle::{Engine, RegionHandle};
use crate::runtime::link::LinkShared;
use crate::runtime::region::RegionUse;
use crate::types::{BatchDesc, TransferOp};

/// One descriptor as addresses: `len` bytes at local address `local` and remote address
/// `remote`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddrDesc {
    pub(crate) local: usize,
    pub(crate) remote: u64,
    pub(crate) len: usize,
}

/// A batch's descriptors checked (`check::list`) against this engine's regions (one lookup per
/// descriptor, the region the one before fell in tried first) and the peer's table; with
/// `keep`, the regions it touches, for an async request to hold. A fabric-memory engine's batch
/// may also name local device memory that is not registered (upstream's FabricMem engine copies
/// such memory): it takes [`batch_fabric`].
///
/// # Errors
/// [`Error::LocalNotRegistered`], [`Error::RemoteNotRegistered`] and `check::list`'s
/// (`PARAM_INVALID` all but [`Error::UnsupportedMemory`]).
pub(crate) fn batch(
    e: &Engine,
    link: &LinkShared,
    op: TransferOp,
    descs: impl ExactSizeIterator<Item = AddrDesc> + Clone,
    keep: Option<&mut Vec<RegionUse>>,
) -> Result<(Vec<BatchDesc>, u64), Error> {
    let mut xds = Vec::new();
    let n = descs.len();
    let mut keep = keep;
    let r = e.with_index(|ix| {
        let pairs = descs.clone().enumerate().map(|(index, d)| {
            let core = ix
                .find(d.local, d.len)
                .ok_or_else(|| Error::LocalNotRegistered {
                    index,
                    addr: d.local,
                    len: d.len,
                    why: String::new(),
                })?;
            let remote = link.remote(d.remote, d.len as u64)?;
            let local = Local {
                core,
                offset: d.local - core.addr,
                len: d.len,
            };
            Ok((local, remote))
        });
        let bytes = check::list(link, op, n, pairs, &mut xds)?;
        if let Some(keep) = keep.as_deref_mut() {
            for d in descs.clone() {
                keep_use(keep, ix.find(d.local, d.len).expect("found above"));
            }
        }
        Ok(bytes)
    });
    match r {
        Ok(bytes) => Ok((xds, bytes)),
        Err(Error::LocalNotRegistered { .. }) if e.options.ascend.enable_fabric_mem => {
            batch_fabric(e, link, op, descs, keep)
        }
        Err(err) => Err(err),
    }
}

/// [`batch`] on a fabric-memory engine whose batch names local memory that is not registered:
/// each such range must lie inside one live ACL device allocation, which carries it as a region
/// of its own for this call (and its async request: with `keep`, every region the batch
/// touches, registered or not, goes there, as [`batch`]'s do).
fn batch_fabric(
    e: &Engine,
    link: &LinkShared,
    op: TransferOp,
    descs: impl ExactSizeIterator<Item = AddrDesc> + Clone,
    keep: Option<&mut Vec<RegionUse>>,
) -> Result<(Vec<BatchDesc>, u64), Error> {
    // the region (registered, or an unregistered device allocation found in this call) and
    // the offset of each descriptor's local range
    let mut found: Vec<RegionHandle> = Vec::new();
    let mut at: Vec<(RegionHandle, usize)> = Vec::with_capacity(descs.len());
    for (index, d) in descs.clone().enumerate() {
        let inside = |r: &RegionHandle| {
            d.len > 0
                && d.local >= r.addr
                && d.local
                    .checked_add(d.len)
                    .is_some_and(|end| end <= r.addr + r.len)
        };
        let registered = e.with_index(|ix| ix.find(d.local, d.len).cloned());
        let region = match registered.or_else(|| found.iter().find(|r| inside(r)).cloned()) {
            Some(r) => r,
            None => {
                let r = e.unregistered_device(d.local, d.len).map_err(|why| {
                    Error::LocalNotRegistered {
                        index,
                        addr: d.local,
                        len: d.len,
                        why: format!(
                            ", nor unregistered device memory a fabric-memory engine copies: \
                             {why}"
                        ),
                    }
                })?;
                found.push(r.clone());
                r
            }
        };
        let off = d.local - region.addr;
        at.push((region, off));
    }
    let n = descs.len();
    let pairs = descs.zip(&at).map(|(d, (region, off))| {
        let remote = link.remote(d.remote, d.len as u64)?;
        let local = Local {
            core: region,
            offset: *off,
            len: d.len,
        };
        Ok((local, remote))
    });
    let mut xds = Vec::new();
    let bytes = check::list(link, op, n, pairs, &mut xds)?;
    if let Some(keep) = keep {
        for (region, _) in &at {
            keep_use(keep, region);
        }
    }
    Ok((xds, bytes))
}

/// Adds a use of `core` to an async request's `keep`, once per region.
fn keep_use(keep: &mut Vec<RegionUse>, core: &RegionHandle) {
    if !keep.iter().any(|k| Arc::ptr_eq(k.core(), core)) {
        keep.push(RegionUse::new(core));
    }
}

/// The registered region holding local address `addr`, and its offset in it (a block batch's
/// local base).
///
/// # Errors
/// [`Error::LocalNotRegistered`] (`PARAM_INVALID`).
pub(crate) fn local_base(e: &Engine, addr: usize) -> Result<(RegionHandle, usize), Error> {
    e.with_index(|ix| ix.at(addr).cloned())
        .map(|r| {
            let off = addr - r.addr;
            (r, off)
        })
        .ok_or_else(|| Error::LocalNotRegistered {
            index: 0,
            addr,
            len: 0,
            why: " (a block batch's local base)".into(),
        })
}

/// A block batch's layout given as base addresses: from each base to the end of its region
/// (the local one `region`, at `off`), blocks of `block` bytes, strides `0` meaning the block.
///
/// # Errors
/// [`Error::RemoteNotRegistered`] (`PARAM_INVALID`) for a remote base in no region of the
/// peer's table.
pub(crate) fn block_layout<'a>(
    link: &LinkShared,
    region: &'a RegionHandle,
    off: usize,
    remote_base: u64,
    block: u64,
    strides: (u64, u64),
) -> Result<Layout<'a>, Error> {
    let local = Local {
        core: region,
        offset: off,
        len: region.len - off,
    };
    let remote = link.remote_from(remote_base)?;
    let stride = |s: u64| if s == 0 { block } else { s };
    Ok(Layout {
        local,
        remote,
        block,
        local_stride: stride(strides.0),
        remote_stride: stride(strides.1),
    })
}
