//! Engine-allocated buffers of the compat engine (`alloc_host_mem`, hixl's extension): the
//! same-host one-sided path for compat callers (C, C++, Python), its statuses, and when the
//! memory is let go.

use crate::common;

use std::time::{Duration, Instant};

use common::Rng;
use common::compat::{NO_OPTIONS, register, status};
use hixl::compat::{Hixl, HostMem, TransferOpDesc};
use hixl::{Status, TransferOp, TransportKind};

fn server() -> Hixl {
    let e = Hixl::new();
    e.initialize("127.0.0.1:0", NO_OPTIONS).unwrap();
    e
}

fn client() -> Hixl {
    let e = Hixl::new();
    e.initialize("127.0.0.1", NO_OPTIONS).unwrap();
    e
}

fn fill(m: &HostMem, data: &[u8]) {
    assert!(data.len() <= m.len());
    // SAFETY: `m` keeps its memory mapped for its lifetime; no transfer or peer touches it
    // while the test writes it (the test starts them afterwards).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), m.as_ptr(), data.len()) };
}

fn contents(m: &HostMem) -> Vec<u8> {
    let mut v = vec![0u8; m.len()];
    // SAFETY: as in `fill`: read after the transfers that wrote it returned.
    unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), v.as_mut_ptr(), m.len()) };
    v
}

fn op(local: usize, remote: usize, len: usize) -> TransferOpDesc {
    TransferOpDesc {
        local_addr: local,
        remote_addr: remote,
        len,
    }
}

/// The transport the peer's region at `addr` is moved with, from the client's table.
fn transport_of(c: &Hixl, server: &str, addr: usize) -> TransportKind {
    c.remote_regions(server)
        .unwrap()
        .into_iter()
        .find(|r| r.addr == addr as u64)
        .expect("the region is in the table")
        .transport
}

/// Whether this machine lets links use the same-host transport (its kernel and policy).
fn same_host() -> bool {
    common::expected_transport(hixl::SameHost::Auto) == TransportKind::SameHost
}

/// Waits until the engine holds no memory for peers any more (the quarantine frees it in the
/// background once every link that could reach it ended), or a minute passed.
fn held_until_released(e: &Hixl) -> usize {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let held = e.metrics().unwrap().quarantined_regions;
        if held == 0 || Instant::now() > until {
            return held;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn engine_memory_moves_one_sided_and_caller_memory_over_tcp() {
    const LEN: usize = 1 << 20;
    let s = server();
    let name = s.local_engine().unwrap();
    let kv = s.alloc_host_mem(LEN).unwrap();
    assert_eq!(kv.addr() % 4096, 0, "page-aligned");
    assert_eq!(kv.len(), LEN);
    assert!(contents(&kv).iter().all(|&b| b == 0), "zeroed");
    let mut caller = vec![0u8; LEN];
    register(&s, &mut caller).unwrap();
    let mut rng = Rng::new(24);
    let data = rng.bytes(LEN);
    fill(&kv, &data);

    let c = client();
    let dst = c.alloc_host_mem(LEN).unwrap();
    c.connect(&name, 5000).unwrap();
    let expected = if same_host() {
        TransportKind::SameHost
    } else {
        TransportKind::Tcp
    };
    assert_eq!(transport_of(&c, &name, kv.addr()), expected);
    assert_eq!(
        transport_of(&c, &name, caller.as_ptr() as usize),
        TransportKind::Tcp,
        "caller-managed memory is served to same-host peers over TCP"
    );

    // READ the server's buffer in 64 odd-sized pieces, then WRITE new bytes back at an offset
    let descs: Vec<_> = (0..64)
        .map(|i| op(dst.addr() + i * 16_000, kv.addr() + i * 16_000 + 7, 16_000))
        .collect();
    c.transfer_sync(&name, TransferOp::Read, &descs, 10_000)
        .unwrap();
    let got = contents(&dst);
    for i in 0..64 {
        let (l, r) = (i * 16_000, i * 16_000 + 7);
        assert_eq!(got[l..l + 16_000], data[r..r + 16_000], "piece {i}");
    }
    let back = rng.bytes(LEN - 4096);
    fill(&dst, &back);
    c.transfer_sync(
        &name,
        TransferOp::Write,
        &[op(dst.addr(), kv.addr() + 4096, LEN - 4096)],
        10_000,
    )
    .unwrap();
    let now = contents(&kv);
    assert_eq!(now[..4096], data[..4096]);
    assert_eq!(now[4096..], back[..]);
    // and the caller-managed region over TCP, from engine memory
    c.transfer_sync(
        &name,
        TransferOp::Write,
        &[op(dst.addr(), caller.as_ptr() as usize, LEN)],
        10_000,
    )
    .unwrap();
    c.finalize();
    s.finalize();
    assert_eq!(caller[..LEN - 4096], back[..]);
    // the keep-alives outlive the engines: the memory is still there
    assert_eq!(contents(&kv)[4096..], back[..]);
}

#[test]
fn statuses() {
    let e = Hixl::new();
    assert_eq!(status(e.alloc_host_mem(4096)), Status::FAILED);
    e.initialize("127.0.0.1", NO_OPTIONS).unwrap();
    assert_eq!(status(e.alloc_host_mem(0)), Status::PARAM_INVALID);
    assert_eq!(
        status(e.alloc_host_mem(usize::MAX)),
        Status::RESOURCE_EXHAUSTED
    );
    let m = e.alloc_host_mem(100).unwrap();
    assert_ne!(m.handle(), 0);
    assert_eq!(e.metrics().unwrap().registered_bytes, 100);
    // the engine's transfers check local ranges against it like any region
    let c = server();
    let name = c.local_engine().unwrap();
    let peer = c.alloc_host_mem(4096).unwrap();
    e.connect(&name, 5000).unwrap();
    let past_end = op(m.addr() + 1, peer.addr(), 100);
    assert_eq!(
        status(e.transfer_sync(&name, TransferOp::Write, &[past_end], 1000)),
        Status::PARAM_INVALID
    );
    e.transfer_sync(
        &name,
        TransferOp::Write,
        &[op(m.addr(), peer.addr(), 100)],
        1000,
    )
    .unwrap();
    e.deregister_mem(m.handle()).unwrap();
    e.deregister_mem(m.handle()).unwrap(); // already deregistered: SUCCESS, no effect (HIXL)
    assert_eq!(e.metrics().unwrap().registered_bytes, 0);
    // deregistered: no longer a local region of the engine's transfers
    assert_eq!(
        status(e.transfer_sync(
            &name,
            TransferOp::Write,
            &[op(m.addr(), peer.addr(), 100)],
            1000
        )),
        Status::PARAM_INVALID
    );
    e.finalize();
    assert_eq!(status(e.alloc_host_mem(4096)), Status::FAILED);
    c.finalize();
}

#[test]
fn allocated_and_freed_while_linked() {
    if !same_host() {
        eprintln!("skipped: the same-host transport is not available here");
        return;
    }
    const LEN: usize = 256 << 10;
    let s = server();
    let name = s.local_engine().unwrap();
    let first = s.alloc_host_mem(LEN).unwrap();
    let c = client();
    c.connect(&name, 5000).unwrap();

    // allocated while linked: usable at once by a new link, one-sided
    let second = s.alloc_host_mem(LEN).unwrap();
    let data = Rng::new(7).bytes(LEN);
    fill(&second, &data);
    let c2 = client();
    let dst2 = c2.alloc_host_mem(LEN).unwrap();
    c2.connect(&name, 5000).unwrap();
    assert_eq!(
        transport_of(&c2, &name, second.addr()),
        TransportKind::SameHost
    );
    c2.transfer_sync(
        &name,
        TransferOp::Read,
        &[op(dst2.addr(), second.addr(), LEN)],
        10_000,
    )
    .unwrap();
    assert_eq!(contents(&dst2), data);
    // the first link's table is the one it got at connect
    assert!(
        c.remote_regions(&name)
            .unwrap()
            .iter()
            .all(|r| r.addr != second.addr() as u64)
    );

    // freed while both links are up: the second buffer was in c2's table, so its memory is
    // held (not freed, not reused) until c2's link ends
    let (handle, addr) = (second.handle(), second.addr());
    drop(second);
    s.deregister_mem(handle).unwrap();
    let m = s.metrics().unwrap();
    assert_eq!((m.quarantined_regions, m.quarantined_bytes), (1, LEN));
    // c2 may still reach it one-sidedly (a link's access cannot be taken back for one
    // region): the memory it writes is kept, not freed
    c2.transfer_sync(
        &name,
        TransferOp::Write,
        &[op(dst2.addr(), addr, LEN)],
        10_000,
    )
    .unwrap();
    // a new link does not get it
    let c3 = client();
    c3.connect(&name, 5000).unwrap();
    assert!(
        c3.remote_regions(&name)
            .unwrap()
            .iter()
            .all(|r| r.addr != addr as u64)
    );
    c3.finalize();
    // the first buffer, freed while linked but never in a table of a link that is still up
    // except c's and c2's: held as well, then released with the links
    s.deregister_mem(first.handle()).unwrap();
    assert_eq!(
        s.metrics().unwrap().quarantined_regions,
        1,
        "`first` is still kept alive by its HostMem"
    );
    drop(first);
    assert_eq!(s.metrics().unwrap().quarantined_regions, 2);
    c2.disconnect(&name, 1000).unwrap();
    c.disconnect(&name, 1000).unwrap();
    assert_eq!(held_until_released(&s), 0, "released once the links ended");
    c.finalize();
    c2.finalize();
    s.finalize();
}

#[test]
fn freed_with_no_link_is_released_at_once() {
    let s = server();
    let m = s.alloc_host_mem(8192).unwrap();
    let h = m.handle();
    drop(m);
    s.deregister_mem(h).unwrap();
    let metrics = s.metrics().unwrap();
    assert_eq!(metrics.quarantined_regions, 0);
    assert_eq!(metrics.quarantines, 0);
    assert_eq!(metrics.regions, 0);
    // finalize releases the rest
    let _ = s.alloc_host_mem(8192).unwrap();
    s.finalize();
}

#[test]
fn freed_while_linked_by_links_that_never_got_it_is_released_at_once() {
    if !same_host() {
        eprintln!("skipped: the same-host transport is not available here");
        return;
    }
    let s = server();
    let name = s.local_engine().unwrap();
    let old = s.alloc_host_mem(8192).unwrap();
    // a same-host link made before the buffer below exists: its table does not have it
    let c = client();
    let dst = c.alloc_host_mem(8192).unwrap();
    c.connect(&name, 5000).unwrap();
    assert_eq!(transport_of(&c, &name, old.addr()), TransportKind::SameHost);
    let fresh = s.alloc_host_mem(8192).unwrap();
    let h = fresh.handle();
    drop(fresh);
    s.deregister_mem(h).unwrap();
    // no link can reach it: let go at once, not held until `c`'s link ends
    let m = s.metrics().unwrap();
    assert_eq!((m.quarantined_regions, m.quarantines), (0, 0));
    // the link is untouched: it still moves data one-sidedly from the old buffer
    let data = Rng::new(9).bytes(8192);
    fill(&old, &data);
    c.transfer_sync(
        &name,
        TransferOp::Read,
        &[op(dst.addr(), old.addr(), 8192)],
        10_000,
    )
    .unwrap();
    assert_eq!(contents(&dst), data);
    c.finalize();
    s.finalize();
}

/// Engine memory whose keep-alive outlives `finalize` is never written by a same-host peer
/// that `finalize` gave up on: a client in another process that keeps WRITEing the buffer is
/// stopped (SIGSTOP) in the middle of a batch, so it cannot confirm within the server's grace;
/// after `finalize` it is resumed, the rest of its batch copies into the pages it mapped and it
/// then learns it was given up on (`NOT_CONNECTED`, never `Ok`), and the keep-alive's bytes
/// are those it had when `finalize` returned. (Before the keep-alive's pages were made private,
/// the resumed batch landed in them: in every round that stopped the client inside a batch.)
#[test]
fn a_keep_alive_is_never_written_by_a_peer_that_finalize_gave_up_on() {
    if !same_host() {
        eprintln!("skipped: the same-host transport is not available here");
        return;
    }
    const LEN: usize = 64 << 20;
    let grace = Duration::from_millis(200);
    let (mut given_up, mut written) = (0, Vec::new());
    for round in 0..4u64 {
        let s = Hixl::new();
        let ms = grace.as_millis().to_string();
        s.initialize("127.0.0.1:0", [("hixl.FinalizeTimeoutMs", ms.as_str())])
            .unwrap();
        let name = s.local_engine().unwrap();
        let kv = s.alloc_host_mem(LEN).unwrap();
        // batches of 64 MiB, each of other bytes than the one before: the client is inside
        // one nearly all the time, and a batch resumed halfway changes what it did not write
        let mut h = common::hammer::Hammer::spawn(&name, &["--alternate"], false);
        h.wait_ok(1);
        h.signal(libc::SIGSTOP);
        h.wait_stopped();
        let t0 = Instant::now();
        s.finalize();
        let gave_up = t0.elapsed() >= grace;
        let data = contents(&kv);
        h.signal(libc::SIGCONT);
        let (_, code) = h.ended();
        assert_eq!(code, 103_902, "round {round}: the client's batch is not Ok");
        // the resumed batch has copied all it will: count the pages it changed
        let now = contents(&kv);
        let changed = now
            .chunks(4096)
            .zip(data.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
        given_up += usize::from(gave_up);
        written.push(changed);
    }
    eprintln!("finalize gave up on the stopped client in {given_up} of 4 rounds");
    assert!(given_up > 0, "no round stopped the client inside a batch");
    assert_eq!(
        written,
        [0; 4],
        "pages (of {}) written after finalize returned, per round",
        LEN / 4096
    );
}
