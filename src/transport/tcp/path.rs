//! TCP as a link's data path: the last one a link tries, since it covers every batch.

use std::sync::Arc;

use super::lanes::{LaneAfter, Lanes, lane_error};
use crate::error::Error;
use crate::transport::{Batch, DataPath, Mode, PathFail, TransportKind};
use crate::types::batch::Descs;

/// Bytes per lane below which a TCP transfer is not split across lanes.
pub(crate) const SPLIT_MIN: u64 = 8 << 20;

/// A link's TCP data path: its batches on its lanes.
pub(crate) struct TcpPath {
    lanes: Arc<Lanes>,
    /// How many lanes one large sync transfer may use at once.
    parallel: usize,
}

impl TcpPath {
    /// The data path over `lanes`; a large sync batch uses up to `parallel` of them.
    pub(crate) fn new(lanes: Arc<Lanes>, parallel: usize) -> Self {
        Self { lanes, parallel }
    }

    /// A sync batch: when it is large, in parts of about equal bytes (a list cut where a part
    /// is full, a block batch in runs of its indices) on up to `parallel` lanes side by side.
    ///
    /// # Safety
    /// [`DataPath::run`]'s.
    unsafe fn run_sync(&self, b: &Batch<'_>) -> Result<(), Error> {
        // SAFETY: each part's local ranges are ranges of the batch's (a descriptor cut where a
        // part was full, or some of its blocks): valid for the whole call (this function's
        // contract), and the scope below ends every helper before it returns.
        let run = |p: Descs<'_>| unsafe { self.lanes.transfer(b.op, p, b.started, b.deadline) };
        let n = (self.parallel as u64).min(b.bytes / SPLIT_MIN) as usize;
        if n < 2 {
            return run(b.descs);
        }
        let parts = b.descs.split(n);
        std::thread::scope(|s| {
            // a part whose helper thread could not be made (the system's thread limit) runs
            // here after the first: spawn's panic would have been the caller's
            let (mut helpers, mut here) = (Vec::new(), Vec::new());
            for k in 1..parts.len() {
                let p = parts.get(k);
                match std::thread::Builder::new().spawn_scoped(s, move || run(p)) {
                    Ok(h) => helpers.push(h),
                    Err(_) => here.push(p),
                }
            }
            let first = run(parts.get(0));
            let first = here
                .into_iter()
                .fold(first, |acc, p| acc.and_then(|()| run(p)));
            helpers
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Protocol {
                            peer: b.peer.to_owned(),
                            problem: "a transfer helper thread panicked".into(),
                        })
                    })
                })
                .fold(first, |acc, r| acc.and(r))
        })
    }

    /// An async request's batch: on one lane, whose socket a cancel shuts down. The request is
    /// queued (a cancel or its deadline ends it at once) until it has a lane.
    ///
    /// # Safety
    /// [`DataPath::run`]'s.
    unsafe fn run_request(&self, b: &Batch<'_>) -> Result<(), PathFail> {
        let lanes = &self.lanes;
        let mut lane = lanes
            .checkout(b.deadline, b.started, b.op.name())
            .map_err(PathFail::Failed)?;
        if let Err(e) = b.start(Some(lane.fd())) {
            lanes.checkin(lane);
            return Err(e);
        }
        // SAFETY: the batch's local ranges are valid for the whole call (this function's
        // contract).
        let r = unsafe { lane.xfer(b.op, b.descs, &lanes.next_req, b.deadline) };
        // the lane (and its socket) stays open until a cancel can no longer shut it down
        let after = if b.unwatch() {
            // a cancel may have shut the socket down: that says nothing about the peer
            LaneAfter::Discard
        } else {
            LaneAfter::of(r.as_ref().err())
        };
        let e = r
            .err()
            .map(|f| lane_error(f, b.op.name(), b.peer, b.started, false));
        lanes.release(lane, after);
        e.map_or(Ok(()), |e| Err(PathFail::Failed(e)))
    }
}

impl DataPath for TcpPath {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    /// Every region: the server validates each descriptor (each block batch, by its largest
    /// index) against its table.
    fn reaches(&self, _region: u32) -> bool {
        true
    }

    fn fenced(&self) -> bool {
        false
    }

    /// The lanes refuse a broken link themselves (and break it when the peer went away).
    fn refused_when_broken(&self) -> bool {
        false
    }

    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        match batch.mode {
            // SAFETY: the caller's promise, `DataPath::run`'s.
            Mode::Sync => unsafe { self.run_sync(batch) }.map_err(PathFail::Failed),
            // SAFETY: as above.
            Mode::Request(_) => unsafe { self.run_request(batch) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::BatchDesc;
    use crate::types::batch::Parts;

    /// A sync batch's parts as `TcpPath::run_sync` cuts them (none when it runs whole).
    fn split(xds: &[BatchDesc], bytes: u64, lanes: usize, min_part: u64) -> Vec<Vec<BatchDesc>> {
        let n = (lanes as u64).min(bytes / min_part) as usize;
        if n < 2 {
            return Vec::new();
        }
        match Descs::List(xds).split(n) {
            Parts::List(p) => p,
            Parts::Blocks(_) => unreachable!("a list"),
        }
    }

    fn xd(local: usize, region: u32, offset: u64, len: u64) -> BatchDesc {
        BatchDesc::of(local, region, offset, len)
    }

    #[test]
    fn split_keeps_every_byte_once_and_in_place() {
        let m = 1u64 << 20;
        // too small to split
        assert!(split(&[xd(0, 0, 0, 15 * m)], 15 * m, 2, SPLIT_MIN).is_empty());
        assert!(split(&[xd(0, 0, 0, 64 * m)], 64 * m, 1, SPLIT_MIN).is_empty());
        let cases: Vec<Vec<BatchDesc>> = vec![
            vec![xd(0x1000, 1, 7, 64 * m)],
            vec![
                xd(0x1000, 1, 0, 16 * m),
                xd(0x9000_0000, 2, 5, 16 * m),
                xd(0x5000_0000, 3, 9, 3),
            ],
            (0..4)
                .map(|i| xd(i * 0x100_0000, 0, i as u64 * 0x200_0000, 5 * m + 1))
                .collect(),
        ];
        for xds in cases {
            let bytes: u64 = xds.iter().map(|d| d.remote.len).sum();
            for lanes in [2usize, 3, 8] {
                let parts = split(&xds, bytes, lanes, SPLIT_MIN);
                let want = (lanes as u64).min(bytes / SPLIT_MIN) as usize;
                assert_eq!(parts.len(), want);
                // parts differ by at most one share's rounding, and cover the batch in order
                let flat: Vec<BatchDesc> = parts.iter().flatten().copied().collect();
                let mut i = 0;
                for d in &xds {
                    let (mut local, mut off, mut left) = (d.local, d.remote.offset, d.remote.len);
                    while left > 0 {
                        let p = flat[i];
                        assert_eq!(
                            (p.local, p.remote.region, p.remote.offset),
                            (local, d.remote.region, off)
                        );
                        assert!(p.remote.len > 0 && p.remote.len <= left);
                        local += p.remote.len as usize;
                        off += p.remote.len;
                        left -= p.remote.len;
                        i += 1;
                    }
                }
                assert_eq!(i, flat.len());
                let sizes: Vec<u64> = parts
                    .iter()
                    .map(|p| p.iter().map(|d| d.remote.len).sum())
                    .collect();
                let share = bytes.div_ceil(want as u64);
                assert!(sizes.iter().all(|&s| s <= share), "{sizes:?}");
            }
        }
    }
}
