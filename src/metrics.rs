//! Metrics: per link and per operation, lock-free counters and a latency histogram, cheap enough
//! to stay on. [`Hixl::metrics`](crate::Hixl::metrics) takes a snapshot.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Status;
use crate::sync::lock;
use crate::types::TransferOp;

/// Histogram buckets: four per power of two of nanoseconds, up to 2^44 ns (about 4.9 hours).
const SUB: u32 = 4;
const BUCKETS: usize = 44 * SUB as usize;

fn bucket(ns: u64) -> usize {
    if ns < 2 {
        return 0;
    }
    let log = 63 - ns.leading_zeros();
    // the two bits below the leading one pick the quarter-octave
    let frac = if log >= 2 {
        (ns >> (log - 2)) & 3
    } else {
        (ns << (2 - log)) & 3
    };
    ((log * SUB + frac as u32) as usize).min(BUCKETS - 1)
}

/// The lower bound of a bucket, in nanoseconds.
fn bucket_floor(i: usize) -> f64 {
    let log = (i as u32) / SUB;
    let frac = (i as u32) % SUB;
    (1u64 << log) as f64 * (1.0 + frac as f64 / SUB as f64)
}

pub(crate) struct OpCounters {
    ops: AtomicU64,
    bytes: AtomicU64,
    in_flight: AtomicU64,
    hist: [AtomicU64; BUCKETS],
    errors: Mutex<BTreeMap<u32, u64>>,
}

impl Default for OpCounters {
    fn default() -> Self {
        Self {
            ops: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
            errors: Mutex::new(BTreeMap::new()),
        }
    }
}

/// Counters of one link.
#[derive(Default)]
pub(crate) struct LinkCounters {
    read: OpCounters,
    write: OpCounters,
    notifies: AtomicU64,
}

impl LinkCounters {
    fn op(&self, op: TransferOp) -> &OpCounters {
        match op {
            TransferOp::Read => &self.read,
            TransferOp::Write => &self.write,
        }
    }
    pub fn start(&self, op: TransferOp) {
        self.op(op).in_flight.fetch_add(1, Ordering::Relaxed);
    }
    pub fn finish(&self, op: TransferOp, bytes: u64, took: Duration, error: Option<Status>) {
        let c = self.op(op);
        c.in_flight.fetch_sub(1, Ordering::Relaxed);
        match error {
            None => {
                c.ops.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(bytes, Ordering::Relaxed);
                c.hist[bucket(took.as_nanos() as u64)].fetch_add(1, Ordering::Relaxed);
            }
            Some(s) => {
                *lock(&c.errors).entry(s.code()).or_insert(0) += 1;
            }
        }
    }
    pub fn notified(&self) {
        self.notifies.fetch_add(1, Ordering::Relaxed);
    }
    pub fn snapshot(&self, link: u64, peer: &str) -> LinkMetrics {
        LinkMetrics {
            link,
            peer: peer.to_owned(),
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            notifies: self.notifies.load(Ordering::Relaxed),
        }
    }
}

impl OpCounters {
    fn snapshot(&self) -> OpMetrics {
        let counts: Vec<u64> = self
            .hist
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let pct = |p: f64| -> Option<Duration> {
            if total == 0 {
                return None;
            }
            let rank = ((total as f64) * p).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    // the middle of the bucket
                    let ns = (bucket_floor(i) + bucket_floor(i + 1)) / 2.0;
                    return Some(Duration::from_nanos(ns as u64));
                }
            }
            None
        };
        OpMetrics {
            ops: self.ops.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            errors: lock(&self.errors).clone(),
            p50: pct(0.50),
            p99: pct(0.99),
        }
    }
}

/// Metrics of one operation on one link.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpMetrics {
    /// Completed operations (calls, not descriptors).
    pub ops: u64,
    /// Bytes moved by completed operations.
    pub bytes: u64,
    /// Operations running or queued now.
    pub in_flight: u64,
    /// Failed operations by HIXL status code.
    pub errors: BTreeMap<u32, u64>,
    /// Median latency of completed operations (within a quarter octave), if any completed.
    pub p50: Option<Duration>,
    /// 99th-percentile latency (within a quarter octave).
    pub p99: Option<Duration>,
}

/// Metrics of one link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkMetrics {
    /// The link id.
    pub link: u64,
    /// The remote engine's name.
    pub peer: String,
    /// READ operations.
    pub read: OpMetrics,
    /// WRITE operations.
    pub write: OpMetrics,
    /// Notifications sent and acknowledged.
    pub notifies: u64,
}

/// A snapshot of an engine's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// Registered regions.
    pub regions: usize,
    /// Registered bytes.
    pub registered_bytes: usize,
    /// Every link this engine opened that still exists.
    pub links: Vec<LinkMetrics>,
    /// Allocations of this engine held in quarantine right now: deregistered or freed while a
    /// same-host client that did not confirm it stopped could still write them (its owner got a
    /// copy). Freed once that client leaves its fence or exits.
    pub quarantined_regions: usize,
    /// Their bytes.
    pub quarantined_bytes: usize,
    /// Allocations ever quarantined by this engine.
    pub quarantines: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in [1u64, 2, 3, 4, 5, 7, 8, 100, 1000, 1_000_000, 1 << 40] {
            let b = bucket(ns);
            assert!(b >= last);
            last = b;
            assert!(
                bucket_floor(b) <= ns as f64 && (ns as f64) < bucket_floor(b + 1) * 1.0001,
                "{ns}"
            );
        }
    }

    #[test]
    fn percentiles() {
        let c = LinkCounters::default();
        for i in 1..=100u64 {
            c.start(TransferOp::Read);
            c.finish(TransferOp::Read, 10, Duration::from_micros(i), None);
        }
        c.start(TransferOp::Read);
        c.finish(
            TransferOp::Read,
            10,
            Duration::from_micros(1),
            Some(Status::TIMEOUT),
        );
        let m = c.snapshot(1, "p").read;
        assert_eq!((m.ops, m.bytes, m.in_flight), (100, 1000, 0));
        assert_eq!(m.errors.get(&103_901), Some(&1));
        let p50 = m.p50.unwrap().as_secs_f64() * 1e6;
        let p99 = m.p99.unwrap().as_secs_f64() * 1e6;
        assert!((40.0..=62.0).contains(&p50), "{p50}");
        assert!((80.0..=125.0).contains(&p99), "{p99}");
    }
}
