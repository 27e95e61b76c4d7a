//! Load: 8 client engines, each with concurrent WRITE and READ-back threads, against one server
//! for a bounded time; random data, every byte compared. Zero corrupted bytes, zero errors.

use crate::{common, support};

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Rng, client_with, server};
use hixl::{Options, SameHost, TransferArgs, TransferDesc, TransferOp};

const CLIENTS: usize = 8;
const THREADS: usize = 2;
const SLOT: usize = 1 << 20;

#[test]
fn eight_clients_concurrent_read_write() {
    let _one = support::serial();
    let (srv, _cache) = server(CLIENTS * THREADS * SLOT, Options::default());
    let moved = AtomicU64::new(0);
    let ops = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (srv, moved, ops) = (&srv, &moved, &ops);
            s.spawn(move || {
                // half the clients over TCP, half over the same-host path where available
                let policy = if c % 2 == 0 {
                    SameHost::Forbid
                } else {
                    SameHost::Auto
                };
                let (cli, mut buf) =
                    client_with(THREADS * 2 * SLOT, Options::default().same_host(policy));
                // each thread's random payload, and its complement where the data comes back: a
                // byte read back must equal the payload, one never read back its complement
                for t in 0..THREADS {
                    let data = Rng::new((c * THREADS + t) as u64).bytes(SLOT);
                    let inverse: Vec<u8> = data.iter().map(|b| !b).collect();
                    buf.write_at(t * 2 * SLOT, &data).unwrap();
                    buf.write_at(t * 2 * SLOT + SLOT, &inverse).unwrap();
                }
                let link = cli.connect(srv.name()).unwrap();
                let remote = link.regions().next().unwrap();
                std::thread::scope(|s2| {
                    for t in 0..THREADS {
                        let (link, buf) = (&link, &buf);
                        s2.spawn(move || {
                            let mut rng = Rng::new(1000 + (c * THREADS + t) as u64);
                            let slot = ((c * THREADS + t) * SLOT) as u64;
                            let (src, back) = (t * 2 * SLOT, t * 2 * SLOT + SLOT);
                            while Instant::now() < until {
                                let len = 1 + rng.below(256 << 10) as usize;
                                let off = rng.below((SLOT - len) as u64) as usize;
                                let w = TransferDesc::new(
                                    buf.range(src + off..src + off + len).unwrap(),
                                    remote
                                        .range(slot + off as u64..slot + (off + len) as u64)
                                        .unwrap(),
                                );
                                let r = TransferDesc::new(
                                    buf.range(back + off..back + off + len).unwrap(),
                                    remote
                                        .range(slot + off as u64..slot + (off + len) as u64)
                                        .unwrap(),
                                );
                                // alternate sync and async, so both paths carry load
                                if rng.below(2) == 0 {
                                    link.transfer_sync(
                                        TransferOp::Write,
                                        &[w],
                                        Duration::from_secs(10),
                                    )
                                    .unwrap();
                                } else {
                                    let req = link
                                        .transfer_async(
                                            TransferOp::Write,
                                            &[w],
                                            TransferArgs::default()
                                                .timeout(Duration::from_secs(10)),
                                        )
                                        .unwrap();
                                    assert!(
                                        req.wait(Duration::from_secs(20))
                                            .code()
                                            .is_some_and(|s| s.code() == 0)
                                    );
                                }
                                link.transfer_sync(TransferOp::Read, &[r], Duration::from_secs(10))
                                    .unwrap();
                                moved.fetch_add(2 * len as u64, Ordering::Relaxed);
                                ops.fetch_add(2, Ordering::Relaxed);
                            }
                        });
                    }
                });
                drop(link);
                let mut written = vec![0u8; SLOT];
                let mut read = vec![0u8; SLOT];
                for t in 0..THREADS {
                    buf.read_at(t * 2 * SLOT, &mut written).unwrap();
                    buf.read_at(t * 2 * SLOT + SLOT, &mut read).unwrap();
                    let mut came_back = 0;
                    for (i, (a, b)) in written.iter().zip(&read).enumerate() {
                        assert!(
                            a == b || *b == !a,
                            "client {c} thread {t}: corrupted byte at {i}"
                        );
                        came_back += usize::from(a == b);
                    }
                    assert!(came_back > 0, "client {c} thread {t}: nothing came back");
                }
            });
        }
    });
    let (bytes, n) = (moved.load(Ordering::Relaxed), ops.load(Ordering::Relaxed));
    eprintln!(
        "load: {CLIENTS} clients x {THREADS} threads moved {bytes} bytes in {n} operations, 0 errors"
    );
    assert!(n > 0);
}
