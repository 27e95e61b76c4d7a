//! A link's routes: for each region of the peer's table, which of the link's data paths reach
//! it (a bit per path, in the link's preference order; TCP's, the last, reaches every region).
//! A region's route is decided the first time a batch touches it (a same-host path maps the
//! region's memfd then, so connecting to an engine with thousands of regions stays fast) and
//! kept for the link's life: a batch costs one lookup per region it names, not a question to
//! every path.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::transport::DataPath;
use crate::types::batch::Descs;
use crate::wire::TableEntry;

/// Set in a region's mask once its route is decided.
const DECIDED: u32 = 1 << 31;

/// The routes of a link's regions, by region id.
pub(super) struct Routes {
    /// `(region id, mask)`, sorted by id; a mask without [`DECIDED`] is not decided yet.
    by_id: Vec<(u32, AtomicU32)>,
}

impl Routes {
    /// Routes for `table`'s regions, none decided yet.
    pub(super) fn new(table: &[TableEntry]) -> Self {
        let mut by_id: Vec<(u32, AtomicU32)> =
            table.iter().map(|e| (e.id, AtomicU32::new(0))).collect();
        by_id.sort_by_key(|r| r.0);
        by_id.dedup_by_key(|r| r.0);
        Routes { by_id }
    }

    /// The paths that reach region `id` (decided now if it was not): a bit per path of
    /// `paths`; TCP's (the last) always. A region the table lacks gets TCP only (the server
    /// refuses it).
    pub(super) fn mask(&self, id: u32, paths: &[Box<dyn DataPath>]) -> u32 {
        let tcp = 1 << (paths.len() - 1);
        let Ok(i) = self.by_id.binary_search_by_key(&id, |r| r.0) else {
            return tcp;
        };
        let slot = &self.by_id[i].1;
        let m = slot.load(Ordering::Acquire);
        if m & DECIDED != 0 {
            return m & !DECIDED;
        }
        let mut m = tcp;
        for (k, p) in paths[..paths.len() - 1].iter().enumerate() {
            if p.reaches(id) {
                m |= 1 << k;
            }
        }
        // two threads deciding at once reach the same answer
        slot.store(m | DECIDED, Ordering::Release);
        m
    }

    /// The data path a batch runs on: the first that reaches every region of it and covers
    /// it; TCP's when no other does.
    pub(super) fn path<'p>(
        &self,
        descs: &Descs<'_>,
        paths: &'p [Box<dyn DataPath>],
    ) -> &'p dyn DataPath {
        if let [only] = paths {
            return &**only; // TCP alone (a link to another host with no UCX or device path)
        }
        let tcp = 1u32 << (paths.len() - 1);
        let mut mask = u32::MAX;
        let mut last = None;
        for d in descs.spans() {
            let r = d.remote.region;
            if last == Some(r) {
                continue; // the common case: a batch into one region
            }
            last = Some(r);
            mask &= self.mask(r, paths);
            if mask == tcp {
                break;
            }
        }
        (paths.iter())
            .enumerate()
            .find(|(k, p)| mask & (1 << k) != 0 && (*k == paths.len() - 1 || p.covers(descs)))
            .map_or(&*paths[paths.len() - 1], |(_, p)| &**p)
    }
}
