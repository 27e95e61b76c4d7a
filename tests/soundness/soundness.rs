//! Soundness of one-sided same-host access, across two processes: once `deactivate`,
//! `deregister` or `finalize` returns (or the engine is dropped), no same-host client writes the
//! memory again; a client that cannot confirm it stopped gets that memory quarantined; and no
//! transfer that returned `Ok` has bytes missing from the memory the server got back.
//!
//! The client is `hixl-peer hammer`, an ordinary hixl client in its own process that WRITEs the
//! server's regions in a loop (see `src/bin/hixl-peer/`).

use crate::common;

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::hammer::{Hammer, T};
use common::{Rng, same_host_available};
use hixl::{Error, Hixl, HostBuffer, Options};

/// Checks for `window` that `bytes` keeps the value `want` everywhere (a same-host client still
/// writing would change it).
fn unchanged_for(bytes: &[u8], want: u8, window: Duration, what: &str) {
    let t0 = Instant::now();
    while t0.elapsed() < window {
        // read through a volatile view: another process writing here is what is being looked for
        let bad = bytes
            .iter()
            // SAFETY: a read of a live byte of `bytes`.
            .position(|b| unsafe { std::ptr::read_volatile(b) } != want);
        assert!(
            bad.is_none(),
            "{what}: byte {} changed after the memory came back, {:?} in",
            bad.unwrap_or(0),
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `Vec` region written by a same-host client in a loop: after `deactivate` and `deregister`
/// the memory is the caller's, and for a second nothing else writes it. The client's next batch
/// fails with `NOT_CONNECTED`.
#[test]
fn a_deregistered_vec_is_never_written_again() {
    if !same_host_available() {
        return;
    }
    let len = 64 << 20;
    let (srv, region) = Hixl::initialize_ephemeral("127.0.0.1", Options::default())
        .unwrap()
        .register(Rng::new(1).bytes(len))
        .unwrap();
    let srv = srv.activate().unwrap();
    // batches of 16 x 64 MiB: the server stops in the middle of one
    let mut h = Hammer::spawn(srv.name(), &["--repeat", "16"], false);
    h.wait_ok(1);
    let srv = srv.deactivate();
    let mut mem = srv.deregister(region).unwrap();
    mem.fill(0xA5);
    unchanged_for(&mem, 0xA5, Duration::from_secs(1), "64 MiB Vec");
    let (_, code) = h.ended();
    assert_eq!(code, 103_902, "the client's next batch is refused");
    assert_eq!(
        srv.metrics().quarantines,
        0,
        "a healthy client confirms in time"
    );
}

/// The READ side of the same promise: a same-host client READing a `Vec` region in a loop
/// reads none of it once `deactivate` and `deregister` returned. The region's bytes hold no
/// 0xA5; the memory the owner gets back is filled with 0xA5 at once; no batch that returns `Ok`
/// to the client read a 0xA5 byte, and its next batch is refused.
#[test]
fn a_deregistered_vec_is_never_read_again() {
    if !same_host_available() {
        return;
    }
    let len = 16 << 20;
    let mut data = Rng::new(11).bytes(len);
    for b in &mut data {
        if *b == 0xA5 {
            *b = 0;
        }
    }
    let (srv, region) = Hixl::initialize_ephemeral("127.0.0.1", Options::default())
        .unwrap()
        .register(data)
        .unwrap();
    let srv = srv.activate().unwrap();
    let mut h = Hammer::spawn(srv.name(), &["--read"], false);
    h.wait_ok(2);
    let srv = srv.deactivate();
    let mut mem = srv.deregister(region).unwrap();
    mem.fill(0xA5);
    let (last, code, sentinels) = h.ended_reading();
    assert_eq!(code, 103_902, "the client's next batch is refused");
    assert!(last >= 2);
    assert_eq!(
        sentinels, 0,
        "a batch that returned Ok read memory handed back to its owner"
    );
}

/// Caller-managed memory (`register_raw`) cannot be quarantined, so same-host peers never get
/// one-sided access to it: their batches go over TCP, served by threads `deactivate` joins.
/// After `deregister` returns, nothing writes it.
#[test]
fn raw_memory_is_served_over_tcp_and_never_written_after_deregister() {
    if !same_host_available() {
        return;
    }
    let len = 16 << 20;
    let mut backing = Rng::new(2).bytes(len);
    let desc = hixl::MemDesc {
        addr: backing.as_mut_ptr() as usize,
        len,
    };
    let srv = Hixl::initialize_ephemeral("127.0.0.1", Options::default())
        .unwrap()
        .into_registered();
    // SAFETY: `backing` stays allocated, and is not touched by this test, until the region is
    // deregistered below.
    let region = unsafe { srv.register_raw(desc, hixl::MemType::Host) }.unwrap();
    let srv = srv.activate().unwrap();
    let mut h = Hammer::spawn(srv.name(), &["--repeat", "8"], false);
    h.wait_ok(1);
    let srv = srv.deactivate();
    assert_eq!(srv.deregister(region).unwrap(), desc);
    backing.fill(0x3C);
    unchanged_for(&backing, 0x3C, Duration::from_secs(1), "raw memory");
    let (_, code) = h.ended();
    assert_eq!(code, 103_902);
}

/// Many small `Vec` regions deregistered and dropped while a same-host client writes them all:
/// fresh allocations (which reuse the freed heap) are never written, and the process lives.
#[test]
fn small_vecs_dropped_under_load_are_never_written() {
    if !same_host_available() {
        return;
    }
    let (n, rlen) = (2048usize, 64usize << 10);
    let srv = Hixl::initialize_ephemeral("127.0.0.1", Options::default().max_regions(4096))
        .unwrap()
        .into_registered();
    // small allocations between the regions keep the heap from shrinking when they are freed,
    // so the fresh allocations below reuse their addresses
    let mut pins = Vec::with_capacity(n);
    let regions: Vec<_> = (0..n)
        .map(|i| {
            let r = srv.register(Rng::new(i as u64).bytes(rlen)).unwrap();
            pins.push(vec![1u8; 64]);
            r
        })
        .collect();
    let srv = srv.activate().unwrap();
    // batches of 8 x 2048 x 64 KiB: the server stops in the middle of one
    let mut h = Hammer::spawn(srv.name(), &["--repeat", "8"], false);
    h.wait_ok(1);
    let srv = srv.deactivate();
    for r in regions {
        drop(srv.deregister(r).unwrap());
    }
    let fresh: Vec<Box<[u8]>> = (0..n).map(|_| vec![0u8; rlen].into_boxed_slice()).collect();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        for b in &fresh {
            unchanged_for(b, 0, Duration::ZERO, "a fresh 64 KiB allocation");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, code) = h.ended();
    assert_eq!(code, 103_902);
    assert!(pins.iter().all(|p| p.iter().all(|&b| b == 1)));
}

/// A same-host client stopped (SIGSTOP) in the middle of a batch cannot confirm that it stopped
/// writing: `deactivate` still returns within its grace period; the region is quarantined (its
/// owner gets a copy; the original is kept); when the client resumes, the batch it was in
/// reports failure (the server did not wait for its bytes), never `Ok`; and the quarantined
/// memory is freed once the client has left its fence. A client killed instead frees it too.
#[test]
fn a_stopped_client_gets_its_memory_quarantined() {
    if !same_host_available() {
        return;
    }
    for resume in [true, false] {
        let len = 8 << 20;
        let data = Rng::new(7).bytes(len);
        let grace = Duration::from_millis(300);
        let (srv, region) =
            Hixl::initialize_ephemeral("127.0.0.1", Options::default().finalize_timeout(grace))
                .unwrap()
                .register(data.clone())
                .unwrap();
        let original = region.addr();
        let srv = srv.activate().unwrap();
        let mut h = Hammer::spawn(srv.name(), &["--seed", "8"], true);
        h.wait_stopped();
        let t0 = Instant::now();
        let srv = srv.deactivate();
        let took = t0.elapsed();
        assert!(
            took >= grace,
            "it gave the client its grace period: {took:?}"
        );
        assert!(took < grace + Duration::from_secs(3), "bounded: {took:?}");
        // the client may still write the region: the owner's own copies wait (they read what
        // it wrote after deactivate returned, before)
        let mut region = region;
        let mut b = [0u8; 16];
        assert!(
            matches!(region.read_at(0, &mut b), Err(Error::RegionBusy { .. })),
            "read_at while a client given up on may write the region"
        );
        assert!(
            matches!(region.write_at(0, &b), Err(Error::RegionBusy { .. })),
            "write_at while a client given up on may write the region"
        );
        let mem = srv.deregister(region).unwrap();
        assert_ne!(mem.as_ptr() as usize, original, "a copy, not the original");
        assert!(mem == data, "the copy holds the region's bytes");
        let m = srv.metrics();
        assert_eq!(
            (m.quarantined_regions, m.quarantined_bytes, m.quarantines),
            (1, len, 1)
        );
        if resume {
            h.signal(libc::SIGCONT);
            // its batch copies into the quarantined original, then learns it was given up on
            assert_eq!(
                h.ended(),
                (0, 103_902),
                "a batch the server gave up on is not Ok"
            );
        } else {
            h.signal(libc::SIGKILL);
        }
        let t0 = Instant::now();
        while srv.metrics().quarantined_regions > 0 {
            assert!(t0.elapsed() < T, "the quarantine was never released");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(srv.metrics().quarantined_bytes, 0);
        assert!(mem == data, "the copy never changes");
    }
}

/// A same-host client stopped with SIGSTOP in the middle of a copy (not at the fence's test
/// hook: between parts of a batch over a 128 MiB `Vec`) and given up on by
/// `deactivate`, once resumed, stops at its next part: it moves at most the parts its two
/// threads had begun (`process_vm_writev` parts are up to 8 MiB: 0 to 8.4 MB changed in runs
/// here), and its batch reports 103902. Before, it finished its whole batch into the region the
/// owner still held (67 M of 134 M bytes changed after `deactivate` returned; 159 M of 268 M
/// with 256 MiB). Meanwhile the owner's own copies answer `RegionBusy`.
#[test]
fn a_resumed_client_that_was_given_up_on_stops_at_its_next_part() {
    if !same_host_available() {
        return;
    }
    let len = 128 << 20;
    let grace = Duration::from_millis(300);
    let mut attempt = 0;
    let (srv, mut region, mut h) = loop {
        attempt += 1;
        let (srv, mut region) =
            Hixl::initialize_ephemeral("127.0.0.1", Options::default().finalize_timeout(grace))
                .unwrap()
                .register(Rng::new(7).bytes(len))
                .unwrap();
        let srv = srv.activate().unwrap();
        // batches of the whole region, alternating two patterns, stopped from outside mid-copy
        let mut h = Hammer::spawn(srv.name(), &["--alternate", "--seed", "100"], false);
        h.wait_ok(2);
        h.signal(libc::SIGSTOP);
        h.wait_stopped();
        let srv = srv.deactivate();
        let mut b = [0u8; 16];
        match region.read_at(0, &mut b) {
            Err(Error::RegionBusy { .. }) => break (srv, region, h),
            // stopped between two batches (outside its fence: a few microseconds of each
            // batch's tens of milliseconds), so nobody was given up on: again
            r => {
                assert!(r.is_ok(), "{r:?}");
                assert!(attempt < 5, "the client was never stopped inside a batch");
                h.signal(libc::SIGCONT);
                let _ = h.ended();
                drop(srv);
            }
        }
    };
    // the client is stopped: nothing writes the region while it is copied here
    let mut before = vec![0u8; len];
    // SAFETY: `len` bytes of the live region; the only writer is stopped (and the owner's
    // own copies are refused meanwhile).
    unsafe { std::ptr::copy_nonoverlapping(region.addr() as *const u8, before.as_mut_ptr(), len) };
    h.signal(libc::SIGCONT);
    assert_eq!(h.ended().1, 103_902, "a batch given up on is not Ok");
    // the client left its fence: the region is its owner's again
    let t0 = Instant::now();
    let mut after = vec![0u8; len];
    while let Err(e) = region.read_at(0, &mut after) {
        assert!(matches!(e, Error::RegionBusy { .. }), "{e:?}");
        assert!(t0.elapsed() < T, "the client never left its fence");
        std::thread::sleep(Duration::from_millis(10));
    }
    let changed = after.iter().zip(&before).filter(|(a, b)| a != b).count();
    eprintln!("bytes changed after deactivate returned: {changed} of {len}");
    assert!(
        changed <= 16 << 20,
        "{changed} bytes written after the client was given up on: more than a part a thread"
    );
    drop(srv);
}

/// Whether an address of this process is mapped (read from `/proc/self/maps`).
fn mapped(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| {
        let range = l.split(' ').next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        (a..b).contains(&addr)
    })
}

/// A region dropped instead of deregistered is quarantined the same way (docs/guarantees.md):
/// with a same-host client stopped in its fence, the region handle is dropped and then the
/// engine; the allocation stays mapped (not freed) while the client lives, and is freed once
/// it is killed (not checked under AddressSanitizer). 64 MiB, above glibc's largest mmap threshold, so freeing it unmaps it: a drop
/// that freed it at once would leave the address unmapped.
#[test]
fn a_dropped_region_is_quarantined_too() {
    if !same_host_available() {
        return;
    }
    let len = 64 << 20;
    let grace = Duration::from_millis(300);
    let (srv, region) =
        Hixl::initialize_ephemeral("127.0.0.1", Options::default().finalize_timeout(grace))
            .unwrap()
            .register(Rng::new(9).bytes(len))
            .unwrap();
    let original = region.addr();
    let srv = srv.activate().unwrap();
    let h = Hammer::spawn(srv.name(), &["--seed", "10"], true);
    h.wait_stopped();
    assert!(mapped(original));
    drop(region);
    // the engine gives the client its grace, then lets go of the region's memory
    drop(srv);
    assert!(
        mapped(original) && mapped(original + len - 1),
        "a dropped region was freed while a stopped client may still write it"
    );
    h.signal(libc::SIGKILL);
    // (under AddressSanitizer, freed memory sits in ASan's own quarantine, still mapped)
    if cfg!(hixl_asan) {
        return;
    }
    let t0 = Instant::now();
    while mapped(original) {
        assert!(t0.elapsed() < T, "the quarantine was never released");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Deregistering a `HostBuffer` that a same-host client keeps writing (through its mapping):
/// every batch that returned `Ok` to the client is in the buffer the server got back — it holds
/// exactly the bytes of the last `Ok` batch.
#[test]
fn every_ok_write_is_in_the_handed_back_host_buffer() {
    if !same_host_available() {
        return;
    }
    let len = 16 << 20;
    let seed = 300;
    let (srv, region) = Hixl::initialize_ephemeral("127.0.0.1", Options::default())
        .unwrap()
        .register(HostBuffer::new(len).unwrap())
        .unwrap();
    let srv = srv.activate().unwrap();
    let mut h = Hammer::spawn(
        srv.name(),
        &["--alternate", "--seed", &seed.to_string()],
        false,
    );
    h.wait_ok(3);
    let srv = srv.deactivate();
    let mem = srv.deregister(region).unwrap();
    let (last, code) = h.ended();
    assert_eq!(code, 103_902);
    let last = last.max(3);
    let want = Rng::new(seed + last % 2).bytes(len);
    let diff = mem.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        diff.is_none(),
        "the bytes of batch {last} (Ok to the client) differ at {diff:?}"
    );
}

/// Never a write into another process. In a fresh pid namespace (`hixl-peer pidreuse`, see
/// its docs) a same-host peer is opened as a link opens it, killed, and its pid handed to a
/// decoy whose page sits at the same address: a write through the dead peer's handle fails
/// with `ESRCH` and leaves the decoy unchanged, while a `process_vm_writev` by pid number (a
/// pid-addressed data path) does reach the decoy, which shows the pid really was reused.
#[test]
fn a_write_never_lands_in_a_process_that_took_the_peers_pid() {
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_hixl-peer"))
        .arg("pidreuse")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: cannot run unshare(1): {e}");
            return;
        }
    };
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if !out.status.success() && stderr.starts_with("unshare:") {
        eprintln!(
            "skipped: no new pid namespace here (needs root): {}",
            stderr.trim()
        );
        return;
    }
    assert!(out.status.success(), "pidreuse failed: {stderr}");
    if let Some(why) = stdout.trim().strip_prefix("SKIP ") {
        eprintln!("skipped: the kernel did not reuse the pid as asked: {why}");
        return;
    }
    assert_eq!(
        stdout.trim(),
        "PIDREUSE errno=3 true true",
        "expected: the write fails with ESRCH, the decoy is unchanged, and a write by pid \
         number would have reached it"
    );
}

/// A same-host peer killed in the middle of a long WRITE batch: the batch fails with
/// `NOT_CONNECTED`, never `Ok`.
#[test]
fn a_peer_killed_mid_batch_fails_the_batch() {
    if !same_host_available() {
        return;
    }
    let len = 32 << 20;
    let mut peer = common::Peer::spawn("127.0.0.1", len, 5, "user");
    let (cli, buf) = Hixl::initialize(
        "127.0.0.1",
        Options::default().same_host(hixl::SameHost::Require),
    )
    .unwrap()
    .register(vec![7u8; len])
    .unwrap();
    let cli = cli.activate().unwrap();
    let link = cli.connect(&peer.name).unwrap();
    let remote = link.remote(peer.addr, len as u64).unwrap();
    // one batch writes the peer's region 32 times over (1 GiB): long enough to be killed in
    let descs = vec![hixl::TransferDesc::new(buf.full(), remote); 32];
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            loop {
                let r = link.transfer_sync(hixl::TransferOp::Write, &descs, T);
                let done = r.is_err();
                tx.send(r).unwrap();
                if done {
                    return;
                }
            }
        });
        let first = rx.recv_timeout(T).unwrap();
        assert!(first.is_ok(), "{first:?}");
        let t0 = Instant::now();
        peer.child.kill().unwrap();
        peer.child.wait().unwrap();
        let mut last = None;
        while let Ok(r) = rx.recv_timeout(T) {
            last = Some(r);
            if last.as_ref().is_some_and(|r| r.is_err()) {
                break;
            }
        }
        let e = last.expect("the writer ended").unwrap_err();
        assert_eq!(e.status().code(), 103_902, "{e:?}");
        assert!(t0.elapsed() < T);
    });
}
