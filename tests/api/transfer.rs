//! Random data moved between two engines in one process, and compared byte for byte.

use crate::common;

use std::time::Duration;

use common::{Rng, client, client_with, expected_transport, server};
use hixl::{Options, SameHost, TransferDesc, TransferOp};

const T: Duration = Duration::from_secs(20);

#[test]
fn write_then_read_back_block_sizes_tcp() {
    write_then_read_back_block_sizes(SameHost::Forbid);
}

#[test]
fn write_then_read_back_block_sizes_same_host() {
    write_then_read_back_block_sizes(SameHost::Auto);
}

/// One descriptor per block size, 1 B to 64 MiB, at odd offsets on both sides: WRITE random
/// data, check it landed in the server's memory, READ it back into another place, compare.
fn write_then_read_back_block_sizes(policy: SameHost) {
    let big = 64 << 20;
    let (srv, mut cache) = server(big + 4096, Options::default());
    let (cli, mut buf) = client_with(2 * big + 8192, Options::default().same_host(policy));
    let mut rng = Rng::new(1);
    let link = cli.connect(srv.name()).unwrap();
    assert_eq!(link.transport(), expected_transport(policy));
    let remote = link.regions().next().unwrap();
    assert_eq!(remote.len(), (big + 4096) as u64);
    for &size in &[1usize, 7, 4095, 4096, 65_537, 1 << 20, 3 << 20, big] {
        let loff = 3 + rng.below(4000) as usize;
        let roff = 1 + rng.below(4000);
        let data = rng.bytes(size);
        buf.write_at(loff, &data).unwrap();
        let w = TransferDesc::new(
            buf.range(loff..loff + size).unwrap(),
            remote.range(roff..roff + size as u64).unwrap(),
        );
        link.transfer_sync(TransferOp::Write, &[w], T).unwrap();
        // it landed in the server's memory, where it was sent
        let mut landed = vec![0; size];
        cache.read_at(roff as usize, &mut landed).unwrap();
        assert!(landed == data, "WRITE of {size} bytes did not land intact");

        let back_off = big + 4096 + 5;
        let r = TransferDesc::new(
            buf.range(back_off..back_off + size).unwrap(),
            remote.range(roff..roff + size as u64).unwrap(),
        );
        link.transfer_sync(TransferOp::Read, &[r], T).unwrap();
        let mut got = vec![0; size];
        buf.read_at(back_off, &mut got).unwrap();
        assert!(got == data, "READ back of {size} bytes differs");
    }
    drop(link);
    let _ = (cli.finalize(), srv.finalize());
}

#[test]
fn batches_of_many_descriptors_tcp() {
    batches_of_many_descriptors(SameHost::Forbid);
}

#[test]
fn batches_of_many_descriptors_same_host() {
    batches_of_many_descriptors(SameHost::Auto);
}

/// Batches of 1, 64 and 4096 descriptors, random sizes and sub-ranges, in one call each.
fn batches_of_many_descriptors(policy: SameHost) {
    let (srv, mut cache) = server(32 << 20, Options::default());
    let (cli, mut buf) = client_with(32 << 20, Options::default().same_host(policy));
    let link = cli.connect(srv.name()).unwrap();
    assert_eq!(link.transport(), expected_transport(policy));
    let remote = link.regions().next().unwrap();
    let mut rng = Rng::new(2);
    for &n in &[1usize, 64, 4096] {
        // non-overlapping slots of 4 KiB on both sides, a random length and offset inside each
        let slot = 4096usize;
        let mut spans = Vec::with_capacity(n);
        for i in 0..n {
            let len = 1 + rng.below(slot as u64 - 64) as usize;
            let off = rng.below((slot - len) as u64) as usize;
            spans.push((i * slot + off, (n - 1 - i) * slot + (slot - len - off), len));
        }
        let payload = rng.bytes(n * slot);
        buf.write_at(0, &payload).unwrap();
        let descs: Vec<_> = spans
            .iter()
            .map(|&(l, r, len)| {
                TransferDesc::new(
                    buf.range(l..l + len).unwrap(),
                    remote.range(r as u64..(r + len) as u64).unwrap(),
                )
            })
            .collect();
        link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
        drop(descs);
        // the server's memory holds each span where it was sent
        let mut remote_mem = vec![0u8; n * slot];
        cache.read_at(0, &mut remote_mem).unwrap();
        for &(l, r, len) in &spans {
            assert_eq!(
                &remote_mem[r..r + len],
                &payload[l..l + len],
                "batch {n}: span at {r} differs"
            );
        }
        // READ them all back, into the second half of the local buffer
        let base = 16 << 20;
        let descs: Vec<_> = spans
            .iter()
            .map(|&(l, r, len)| {
                TransferDesc::new(
                    buf.range(base + l..base + l + len).unwrap(),
                    remote.range(r as u64..(r + len) as u64).unwrap(),
                )
            })
            .collect();
        link.transfer_sync(TransferOp::Read, &descs, T).unwrap();
        drop(descs);
        let mut got = vec![0u8; n * slot];
        buf.read_at(base, &mut got).unwrap();
        for &(l, _, len) in &spans {
            assert_eq!(
                &got[l..l + len],
                &payload[l..l + len],
                "batch {n}: READ back differs"
            );
        }
    }
    drop(link);
    let _ = (cli.finalize(), srv.finalize());
}

#[test]
fn threads_share_one_link_tcp() {
    threads_share_one_link(SameHost::Forbid);
}

#[test]
fn threads_share_one_link_same_host() {
    threads_share_one_link(SameHost::Auto);
}

/// Several threads transfer at once on one engine and one link, each on its own ranges.
fn threads_share_one_link(policy: SameHost) {
    let per = 2 << 20;
    let threads = 6;
    let (srv, _cache) = server(per * threads, Options::default());
    let (cli, mut buf) = client_with(2 * per * threads, Options::default().same_host(policy));
    let mut rng = Rng::new(3);
    let data = rng.bytes(per * threads);
    buf.write_at(0, &data).unwrap();
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (link, buf) = (&link, &buf);
            s.spawn(move || {
                for round in 0..20 {
                    let (a, b) = (t * per, (t + 1) * per);
                    let chunk = 512 + round * 4099;
                    let w = TransferDesc::new(
                        buf.range(a..b).unwrap(),
                        remote.range(a as u64..b as u64).unwrap(),
                    );
                    link.transfer_sync(TransferOp::Write, &[w], T).unwrap();
                    let descs: Vec<_> = (a..b)
                        .step_by(chunk)
                        .map(|o| {
                            let e = (o + chunk).min(b);
                            TransferDesc::new(
                                buf.range(threads * per + o..threads * per + e).unwrap(),
                                remote.range(o as u64..e as u64).unwrap(),
                            )
                        })
                        .collect();
                    link.transfer_sync(TransferOp::Read, &descs, T).unwrap();
                }
            });
        }
    });
    let mut got = vec![0u8; per * threads];
    drop(link);
    buf.read_at(per * threads, &mut got).unwrap();
    assert!(got == data, "a thread's data was corrupted");
    let _ = (cli.finalize(), srv.finalize());
}

/// The engine goes back to Registered, memory comes back with the data in it, more memory is
/// registered, and the engine serves again.
#[test]
fn full_lifecycle_with_reactivation() {
    let (srv, cache) = server(1 << 20, Options::default());
    let (cli, mut buf) = client(1 << 20);
    let mut rng = Rng::new(4);
    let data = rng.bytes(1000);
    buf.write_at(10, &data).unwrap();
    {
        let link = cli.connect(srv.name()).unwrap();
        let remote = link.remote(cache.addr() as u64 + 500, 1000).unwrap();
        link.transfer_sync(
            TransferOp::Write,
            &[TransferDesc::new(buf.range(10..1010).unwrap(), remote)],
            T,
        )
        .unwrap();
        link.disconnect(T).unwrap();
    }
    let srv = srv.deactivate();
    let mem = srv.deregister(cache).unwrap();
    assert_eq!(&mem[500..1500], &data[..]);
    assert_eq!(srv.region_count(), 0);
    // register again (the same buffer, handed back) plus a second one, serve again
    let cache = srv.register(mem).unwrap();
    let extra = srv.register(vec![7u8; 333]).unwrap();
    assert_eq!(srv.region_count(), 2);
    assert_eq!(srv.registered_bytes(), (1 << 20) + 333);
    let srv = srv.activate().unwrap();
    {
        let link = cli.connect(srv.name()).unwrap();
        assert_eq!(link.regions().len(), 2);
        let remote = link.region(extra.id()).unwrap();
        let d = TransferDesc::new(buf.range(0..333).unwrap(), remote.full());
        link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    }
    let mut got = vec![0u8; 333];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, vec![7u8; 333]);
    let srv = srv.finalize();
    // after finalize, held regions can still be handed back
    assert_eq!(srv.deregister(extra).unwrap(), vec![7u8; 333]);
    assert_eq!(&srv.deregister(cache).unwrap()[500..1500], &data[..]);
    let _ = cli.finalize();
}

/// Two engines can serve and connect to each other at the same time (both directions).
#[test]
fn both_engines_serve_and_connect() {
    let (a, ra) = server(8192, Options::default());
    let (b, mut rb) = server(8192, Options::default());
    let mut rng = Rng::new(5);
    let data = rng.bytes(4096);
    rb.write_at(0, &data).unwrap();
    {
        let ab = a.connect(b.name()).unwrap();
        let ba = b.connect(a.name()).unwrap();
        // a reads the first half of b's region into the first half of its own...
        let d = TransferDesc::new(
            ra.range(0..4096).unwrap(),
            ab.regions().next().unwrap().range(0..4096).unwrap(),
        );
        ab.transfer_sync(TransferOp::Read, &[d], T).unwrap();
        // ...and b, at the same time connected to a, reads it from there into its second half
        let d = TransferDesc::new(
            rb.range(4096..8192).unwrap(),
            ba.regions().next().unwrap().range(0..4096).unwrap(),
        );
        ba.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    }
    let mut got = vec![0u8; 4096];
    rb.read_at(4096, &mut got).unwrap();
    assert_eq!(got, data);
    let a = a.deactivate();
    let mem = a.deregister(ra).unwrap();
    assert_eq!(&mem[..4096], &data[..]);
    let _ = (a.finalize(), b.finalize());
}

/// Finalizing a server waits (bounded) for the request it is serving: a large WRITE that is in
/// flight when the server finalizes completes intact.
#[test]
fn finalize_waits_for_in_flight_work() {
    let len = 256 << 20;
    let (srv, mut cache) = server(
        len,
        Options::default().finalize_timeout(Duration::from_secs(10)),
    );
    let (cli, mut buf) = client(len);
    let data = Rng::new(6).bytes(len);
    buf.write_at(0, &data).unwrap();
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    let d = TransferDesc::new(buf.full(), remote.full());
    // warm up the lane, then start a WRITE and finalize while it runs
    link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    let result = std::thread::scope(|s| {
        let w = s.spawn(|| link.transfer_sync(TransferOp::Write, &[d], T));
        std::thread::sleep(Duration::from_millis(15));
        let t0 = std::time::Instant::now();
        let _ = srv.finalize();
        (w.join().unwrap(), t0.elapsed())
    });
    let (r, waited) = result;
    assert!(r.is_ok(), "in-flight WRITE cut by finalize: {r:?}");
    assert!(waited < Duration::from_secs(10));
    // Ok means every byte landed before finalize returned
    let mut got = vec![0u8; len];
    cache.read_at(0, &mut got).unwrap();
    assert!(
        got == data,
        "the WRITE that finalize waited for did not land whole"
    );
    // afterwards the link is dead
    let e = link.transfer_sync(TransferOp::Write, &[d], T).unwrap_err();
    assert_eq!(e.status().code(), 103_902, "{e:?}");
}

/// The device context travels to another thread only as a `DetachedContext`, bound there.
#[test]
fn detached_context_binds_on_another_thread() {
    let (cli, _buf) = client(4096);
    let cli = cli.deactivate();
    let ctx = cli.detach_context();
    let engine = &cli;
    std::thread::scope(|s| {
        s.spawn(move || {
            let refused = ctx
                .bind(|tok| engine.register_device(tok, vec![3u8; 8]))
                .unwrap()
                .unwrap_err();
            assert_eq!(refused.status().code(), 103_905);
            assert_eq!(refused.into_inner(), vec![3u8; 8]);
        });
    });
    // a token of one engine is refused by another
    let (other, _b) = client(4096);
    let other = other.deactivate();
    let e = other
        .with_context(|tok| cli.register_device(tok, vec![1u8]))
        .unwrap()
        .unwrap_err();
    assert!(matches!(
        e.error,
        hixl::Error::ForeignHandle {
            what: "context token",
            ..
        }
    ));
}
