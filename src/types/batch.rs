//! One batch type for every floor below the checks: a checked batch's descriptors are a list
//! ([`BatchDesc`]s) or a block batch ([`BlockBatch`]: layouts sharing a pair of index arrays),
//! and each floor writes its logic once over [`Descs`], taking the block form as it is where it
//! can (TCP's XFER_BLOCKS, same-host copy loops) and expanding it once where it cannot.

use std::borrow::Cow;

use super::blocks::{BlockBatch, OwnedBlocks, Placed, WireBlocks};
use super::split::split;
use super::{BatchDesc, WireDesc};

/// A batch's remote half as a server receives it (not checked yet): an XFER's descriptors, or
/// an XFER_BLOCKS' layout and indices.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WireDescs<'a> {
    List(&'a [WireDesc]),
    Blocks(&'a WireBlocks, &'a [u64]),
}

/// A checked batch's descriptors.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Descs<'a> {
    /// One descriptor per range.
    List(&'a [BatchDesc]),
    /// Blocks by index, layout after layout.
    Blocks(BlockBatch<'a>),
}

impl<'a> Descs<'a> {
    /// How many descriptors (or blocks, in all layouts).
    pub(crate) fn count(&self) -> usize {
        match self {
            Self::List(x) => x.len(),
            Self::Blocks(b) => b.count(),
        }
    }

    /// What a data path must reach: each descriptor of a list, one descriptor spanning each
    /// layout of a block batch (its local range and its remote region).
    pub(crate) fn spans(&self) -> impl Iterator<Item = BatchDesc> + 'a {
        let (list, layouts): (&'a [BatchDesc], &'a [Placed]) = match *self {
            Self::List(x) => (x, &[]),
            Self::Blocks(b) => (&[], b.layouts),
        };
        (list.iter().copied()).chain(layouts.iter().map(Placed::span))
    }

    /// As descriptors (a block batch expanded once: for data paths that take descriptors only).
    pub(crate) fn expand(&self) -> Cow<'a, [BatchDesc]> {
        match *self {
            Self::List(x) => Cow::Borrowed(x),
            Self::Blocks(b) => Cow::Owned(b.expand()),
        }
    }

    /// Each local range in order, as `(address, length)`: what a WRITE sends and a READ
    /// receives into.
    pub(crate) fn for_each_local(&self, mut f: impl FnMut(usize, usize)) {
        match self {
            Self::List(x) => x.iter().for_each(|d| f(d.local, d.remote.len as usize)),
            Self::Blocks(b) => {
                for l in b.layouts {
                    let block = l.remote.block as usize;
                    for i in 0..b.indices() {
                        f(l.local_at(b.local_idx.at(i)), block);
                    }
                }
            }
        }
    }

    /// Runs `f` on frames of at most `max` descriptors, in order: a list in chunks, a block
    /// batch one layout at a time in runs of its indices (a frame carries one layout).
    ///
    /// # Errors
    /// The first of `f`'s (the frames after it are not run).
    pub(crate) fn try_frames<E>(
        &self,
        max: usize,
        mut f: impl FnMut(Descs<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        match *self {
            Self::List(x) => x.chunks(max).try_for_each(|c| f(Self::List(c))),
            Self::Blocks(b) => {
                let n = b.indices();
                for l in 0..b.layouts.len() {
                    let one = b.layout(l);
                    let mut at = 0;
                    while at < n {
                        let end = n.min(at + max);
                        f(Self::Blocks(one.slice(at..end)))?;
                        at = end;
                    }
                }
                Ok(())
            }
        }
    }

    /// The batch in up to `parts` parts of about equal bytes, in order: a list cut where a
    /// part is full; a block batch of at least `parts` layouts in runs of whole layouts (each
    /// layout still one frame, not one a part: LLM-DataDist's layout a tensor), else in runs of
    /// its index pairs, every layout in each.
    pub(crate) fn split(&self, parts: usize) -> Parts<'a> {
        match *self {
            Self::List(x) => Parts::List(split(x, parts)),
            Self::Blocks(b) if b.layouts.len() >= parts.max(2) => {
                let n = b.layouts.len();
                let cut = |k: usize| n * k / parts;
                let part = |k: usize| BlockBatch {
                    layouts: &b.layouts[cut(k)..cut(k + 1)],
                    ..b
                };
                Parts::Blocks((0..parts).map(part).collect())
            }
            Self::Blocks(b) => {
                let n = b.indices();
                let parts = parts.clamp(1, n.max(1));
                let cut = |k: usize| n * k / parts;
                Parts::Blocks((0..parts).map(|k| b.slice(cut(k)..cut(k + 1))).collect())
            }
        }
    }
}

/// A list from anything that lends its descriptors as a slice (a slice, a `Vec`, an array).
impl<'a, T: AsRef<[BatchDesc]> + ?Sized> From<&'a T> for Descs<'a> {
    fn from(x: &'a T) -> Self {
        Self::List(x.as_ref())
    }
}
impl<'a> From<BlockBatch<'a>> for Descs<'a> {
    fn from(b: BlockBatch<'a>) -> Self {
        Self::Blocks(b)
    }
}

/// A batch cut into parts ([`Descs::split`]).
pub(crate) enum Parts<'a> {
    List(Vec<Vec<BatchDesc>>),
    Blocks(Vec<BlockBatch<'a>>),
}

impl Parts<'_> {
    /// How many parts.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::List(p) => p.len(),
            Self::Blocks(p) => p.len(),
        }
    }

    /// Part `i`.
    pub(crate) fn get(&self, i: usize) -> Descs<'_> {
        match self {
            Self::List(p) => Descs::List(&p[i]),
            Self::Blocks(p) => Descs::Blocks(p[i]),
        }
    }
}

/// A batch's descriptors owned (an async request's).
#[derive(Debug, Clone)]
pub(crate) enum OwnedDescs {
    List(Vec<BatchDesc>),
    Blocks(OwnedBlocks),
}

impl From<Vec<BatchDesc>> for OwnedDescs {
    fn from(x: Vec<BatchDesc>) -> Self {
        Self::List(x)
    }
}
impl From<BlockBatch<'_>> for OwnedDescs {
    fn from(b: BlockBatch<'_>) -> Self {
        Self::Blocks(b.to_owned())
    }
}

impl OwnedDescs {
    /// The descriptors, borrowed.
    pub(crate) fn borrow(&self) -> Descs<'_> {
        match self {
            Self::List(x) => Descs::List(x),
            Self::Blocks(b) => Descs::Blocks(b.batch()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::blocks::BlockIndices;

    fn placed(local: usize, region: u32, block: u64) -> Placed {
        Placed {
            local,
            local_stride: block * 2,
            remote: WireBlocks {
                region,
                offset: 100,
                block,
                stride: block * 3,
            },
            local_extent: 1 << 20,
            remote_extent: 1 << 20,
        }
    }

    /// A block batch of two layouts: its frames, parts, local ranges and expansion name the
    /// same blocks in the same order (layout after layout).
    #[test]
    fn block_frames_parts_and_locals_agree_with_the_expansion() {
        let layouts = [placed(0x1000, 3, 16), placed(0x9000, 4, 8)];
        let (li, ri): (Vec<u32>, Vec<u32>) = ((0..7).rev().collect(), (10..17).collect());
        let b = BlockBatch {
            layouts: &layouts,
            local_idx: BlockIndices::U32(&li),
            remote_idx: BlockIndices::U32(&ri),
        };
        let d = Descs::Blocks(b);
        let all = d.expand().into_owned();
        assert_eq!((d.count(), all.len(), b.bytes()), (14, 14, 7 * 24));
        assert_eq!(
            all[8],
            BatchDesc {
                local: 0x9000 + 5 * 16,
                remote: WireDesc {
                    region: 4,
                    offset: 100 + 11 * 24,
                    len: 8
                }
            }
        );
        let mut framed = Vec::new();
        d.try_frames::<()>(3, |f| {
            let Descs::Blocks(fb) = f else { panic!() };
            assert_eq!(fb.layouts.len(), 1);
            assert!(fb.indices() <= 3);
            framed.extend(fb.expand());
            Ok(())
        })
        .unwrap();
        assert_eq!(framed, all);
        let mut locals = Vec::new();
        d.for_each_local(|a, n| locals.push((a, n)));
        let want: Vec<_> = all
            .iter()
            .map(|x| (x.local, x.remote.len as usize))
            .collect();
        assert_eq!(locals, want);
        let parts = d.split(3);
        assert_eq!(parts.len(), 3);
        let mut n = 0;
        for k in 0..parts.len() {
            n += parts.get(k).count();
        }
        assert_eq!(n, 14);
        // no more parts than layouts: whole layouts, each with every index
        let parts = d.split(2);
        assert_eq!(parts.len(), 2);
        let mut joined = Vec::new();
        for k in 0..parts.len() {
            let Descs::Blocks(p) = parts.get(k) else {
                panic!("a block part")
            };
            assert_eq!((p.layouts.len(), p.indices()), (1, 7));
            joined.extend(p.expand());
        }
        assert_eq!(joined, all);
        let owned = OwnedDescs::from(b);
        assert_eq!(owned.borrow().expand().into_owned(), all);
    }
}
