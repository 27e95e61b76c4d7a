//! Block-indexed batches: a local and a remote base, a block size, a stride per side and two
//! index arrays of the same length (what a paged KV cache is). Transfer `i` moves `block`
//! bytes between `local + local_idx[i] * local_stride` and `remote.offset +
//! remote_idx[i] * remote_stride` of the peer's region. A batch is checked once per call
//! (the largest index of each side against its range), never per block, and moves down a data
//! path without being expanded into descriptors where the path can take it as it is (TCP and
//! same-host; the others expand it once).

use super::{BatchDesc, WireDesc};

/// Block indices: a borrowed array of `u32` or `u64` (what numpy, C and Rust callers hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockIndices<'a> {
    /// 32-bit indices.
    U32(&'a [u32]),
    /// 64-bit indices.
    U64(&'a [u64]),
}

impl<'a> From<&'a [u32]> for BlockIndices<'a> {
    fn from(v: &'a [u32]) -> Self {
        Self::U32(v)
    }
}
impl<'a> From<&'a [u64]> for BlockIndices<'a> {
    fn from(v: &'a [u64]) -> Self {
        Self::U64(v)
    }
}
impl<'a> From<&'a Vec<u32>> for BlockIndices<'a> {
    fn from(v: &'a Vec<u32>) -> Self {
        Self::U32(v)
    }
}
impl<'a> From<&'a Vec<u64>> for BlockIndices<'a> {
    fn from(v: &'a Vec<u64>) -> Self {
        Self::U64(v)
    }
}
impl<'a, const N: usize> From<&'a [u32; N]> for BlockIndices<'a> {
    fn from(v: &'a [u32; N]) -> Self {
        Self::U32(v)
    }
}
impl<'a, const N: usize> From<&'a [u64; N]> for BlockIndices<'a> {
    fn from(v: &'a [u64; N]) -> Self {
        Self::U64(v)
    }
}

impl<'a> BlockIndices<'a> {
    /// How many indices.
    pub fn len(&self) -> usize {
        match self {
            Self::U32(v) => v.len(),
            Self::U64(v) => v.len(),
        }
    }
    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Index `i` (`i < len()`).
    #[inline]
    pub(crate) fn at(&self, i: usize) -> u64 {
        match self {
            Self::U32(v) => u64::from(v[i]),
            Self::U64(v) => v[i],
        }
    }
    /// The largest index, in one (vectorized) pass; `None` when empty.
    pub(crate) fn max(&self) -> Option<u64> {
        match self {
            Self::U32(v) => v.iter().copied().max().map(u64::from),
            Self::U64(v) => v.iter().copied().max(),
        }
    }
    /// The first position of index `x` (0 if absent): for an error's report.
    pub(crate) fn position(&self, x: u64) -> usize {
        match self {
            Self::U32(v) => v.iter().position(|&i| u64::from(i) == x),
            Self::U64(v) => v.iter().position(|&i| i == x),
        }
        .unwrap_or(0)
    }
    /// Indices `range` of these.
    pub(crate) fn slice(&self, range: std::ops::Range<usize>) -> BlockIndices<'a> {
        match *self {
            Self::U32(v) => Self::U32(&v[range]),
            Self::U64(v) => Self::U64(&v[range]),
        }
    }
    /// An owned copy (an async request keeps its indices).
    pub(crate) fn to_owned(self) -> OwnedIndices {
        match self {
            Self::U32(v) => OwnedIndices::U32(v.to_vec()),
            Self::U64(v) => OwnedIndices::U64(v.to_vec()),
        }
    }
}

/// Owned block indices (an async request's).
#[derive(Debug, Clone)]
pub(crate) enum OwnedIndices {
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl OwnedIndices {
    pub(crate) fn borrow(&self) -> BlockIndices<'_> {
        match self {
            Self::U32(v) => BlockIndices::U32(v),
            Self::U64(v) => BlockIndices::U64(v),
        }
    }
}

/// The remote half of a block batch on the wire: the peer's region, the offset of block 0 in
/// it, the block size and the stride between blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireBlocks {
    /// Region id in the server's table.
    pub region: u32,
    /// Offset of block 0 in the region.
    pub offset: u64,
    /// Bytes per block (not zero).
    pub block: u64,
    /// Bytes from one block to the next (at least `block`).
    pub stride: u64,
}

impl WireBlocks {
    /// The offset in the region of block `index`, when block `index` lies inside a region of
    /// `region_len` bytes (overflow-checked); `None` otherwise.
    pub fn block_offset(&self, index: u64, region_len: u64) -> Option<u64> {
        let at = index.checked_mul(self.stride)?.checked_add(self.offset)?;
        (at.checked_add(self.block)? <= region_len).then_some(at)
    }
}

/// One layout of a checked block batch: the local base address (inside a registered region
/// the caller keeps alive: every block of it, `local + idx * local_stride` for each local
/// index, lies in it), the local stride and the remote half. `local_extent` and
/// `remote_extent` are the bytes from each base to the end of its furthest block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) local: usize,
    pub(crate) local_stride: u64,
    pub(crate) remote: WireBlocks,
    pub(crate) local_extent: u64,
    pub(crate) remote_extent: u64,
}

impl Placed {
    /// The local address of the block at index `idx`.
    #[inline]
    pub(crate) fn local_at(&self, idx: u64) -> usize {
        self.local + (idx * self.local_stride) as usize
    }
    /// The offset in the peer's region of the block at index `idx`.
    #[inline]
    pub(crate) fn remote_at(&self, idx: u64) -> u64 {
        self.remote.offset + idx * self.remote.stride
    }
    /// One descriptor spanning both extents: what a data path needs to see of the layout (the
    /// local range and the remote region of every block).
    pub(crate) fn span(&self) -> BatchDesc {
        BatchDesc {
            local: self.local,
            remote: WireDesc {
                region: self.remote.region,
                offset: self.remote.offset,
                len: self.local_extent.max(self.remote_extent),
            },
        }
    }
}

/// A checked block batch as a data path moves it: one or more layouts (LLM-DataDist's tensors
/// of one cache: the same blocks of each) sharing one pair of index arrays (same length, not
/// empty). Block `i` of layout `l` moves between `layouts[l].local_at(local_idx[i])` and
/// `layouts[l].remote_at(remote_idx[i])`; the layouts move one after the other.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockBatch<'a> {
    pub(crate) layouts: &'a [Placed],
    pub(crate) local_idx: BlockIndices<'a>,
    pub(crate) remote_idx: BlockIndices<'a>,
}

impl<'a> BlockBatch<'a> {
    /// How many index pairs (blocks a layout).
    pub(crate) fn indices(&self) -> usize {
        self.local_idx.len()
    }
    /// How many blocks in all (every layout's).
    pub(crate) fn count(&self) -> usize {
        self.layouts.len() * self.indices()
    }
    /// Bytes in all.
    pub(crate) fn bytes(&self) -> u64 {
        let per: u64 = self.layouts.iter().map(|l| l.remote.block).sum();
        per * self.indices() as u64
    }
    /// Block `i` of layout `l` as a descriptor.
    #[inline]
    pub(crate) fn desc(&self, l: &Placed, i: usize) -> BatchDesc {
        BatchDesc {
            local: l.local_at(self.local_idx.at(i)),
            remote: WireDesc {
                region: l.remote.region,
                offset: l.remote_at(self.remote_idx.at(i)),
                len: l.remote.block,
            },
        }
    }
    /// The whole batch as descriptors, layout after layout (for data paths that take
    /// descriptors only).
    pub(crate) fn expand(&self) -> Vec<BatchDesc> {
        let mut out = Vec::with_capacity(self.count());
        for l in self.layouts {
            out.extend((0..self.indices()).map(|i| self.desc(l, i)));
        }
        out
    }
    /// Layout `l` alone, with the same indices.
    pub(crate) fn layout(&self, l: usize) -> BlockBatch<'a> {
        BlockBatch {
            layouts: &self.layouts[l..=l],
            ..*self
        }
    }
    /// Index pairs `range` of the batch, in every layout (the extents stay those of the whole
    /// batch: an upper bound).
    pub(crate) fn slice(&self, range: std::ops::Range<usize>) -> BlockBatch<'a> {
        BlockBatch {
            layouts: self.layouts,
            local_idx: self.local_idx.slice(range.clone()),
            remote_idx: self.remote_idx.slice(range),
        }
    }
    /// An owned copy, for an async request.
    pub(crate) fn to_owned(self) -> OwnedBlocks {
        OwnedBlocks {
            layouts: self.layouts.to_vec(),
            local_idx: self.local_idx.to_owned(),
            remote_idx: self.remote_idx.to_owned(),
        }
    }
}

/// A [`BlockBatch`] that owns its layouts and indices (an async request's).
#[derive(Debug, Clone)]
pub(crate) struct OwnedBlocks {
    layouts: Vec<Placed>,
    local_idx: OwnedIndices,
    remote_idx: OwnedIndices,
}

impl OwnedBlocks {
    pub(crate) fn batch(&self) -> BlockBatch<'_> {
        BlockBatch {
            layouts: &self.layouts,
            local_idx: self.local_idx.borrow(),
            remote_idx: self.remote_idx.borrow(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_and_offsets() {
        let v = [3u32, 9, 1, 9];
        assert_eq!(BlockIndices::from(&v).max(), Some(9));
        assert_eq!(BlockIndices::from(&v).position(9), 1);
        assert_eq!(BlockIndices::U64(&[]).max(), None);
        let w = WireBlocks {
            region: 1,
            offset: 8,
            block: 16,
            stride: 32,
        };
        assert_eq!(w.block_offset(2, 8 + 64 + 16), Some(72));
        assert_eq!(w.block_offset(2, 8 + 64 + 15), None);
        assert_eq!(w.block_offset(u64::MAX / 2, u64::MAX), None);
    }
}
