//! The UCX transport across two processes: random data READ and WRITE, sub-ranges, batches and
//! block batches, a killed peer, fallbacks, and a missing library. `.ci/run` runs this file under `UCX_TLS=tcp`
//! and under `UCX_TLS=sm` as well as with UCX's own choice; where UCX cannot be loaded the
//! tests that need it say so and return.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Peer, Rng, exercise_peer, fnv1a, kill_during_rounds, ucx_available};
use hixl::{
    Access, Error, Hixl, HostBuffer, Options, SameHost, TransferArgs, TransferDesc, TransferOp,
    TransportKind, Ucx,
};

const T: Duration = Duration::from_secs(20);
const KEY: &str = "hixl-ucx-test-key-0123";

fn ucx_opts() -> Options {
    Options::default()
        .psk(KEY)
        .ucx(Ucx::Require)
        .same_host(SameHost::Auto)
}

fn ucx_peer(size: usize, seed: u64) -> Peer {
    Peer::spawn_in(
        &[],
        "127.0.0.1",
        size,
        seed,
        "user",
        &["--psk", KEY, "--ucx", "require"],
    )
}

fn ucx_client(len: usize) -> (hixl::Hixl<hixl::Connected>, hixl::Region) {
    common::client_with(len, ucx_opts())
}

/// Random data both ways with another process over UCX: a 64 MiB READ at odd offsets, 4096
/// small READs, a 40 MiB WRITE and a batch of 512 WRITEs, every byte checked on both sides.
#[test]
fn random_data_across_processes() {
    let Some(_devices) = ucx_available("random_data_across_processes") else {
        return;
    };
    let size = 72 << 20;
    let mut peer = ucx_peer(size, 41);
    let (cli, mut buf) = ucx_client(size);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.transport(), TransportKind::Ucx);
    eprintln!(
        "UCX_TLS={}",
        std::env::var("UCX_TLS").unwrap_or_else(|_| "(UCX's choice)".into())
    );
    exercise_peer(&link, &mut peer, &mut buf, 41, 512, "ucx");
    // async requests ride the same endpoint
    let data = Rng::new(42).bytes(1 << 20);
    buf.write_at(0, &data).unwrap();
    let reqs: Vec<_> = (0..8u64)
        .map(|i| {
            let d = TransferDesc::new(
                buf.range((i as usize) << 17..((i as usize) + 1) << 17)
                    .unwrap(),
                link.remote(peer.addr + (i << 20) + 5, 1 << 17).unwrap(),
            );
            link.transfer_async(TransferOp::Write, &[d], TransferArgs::tagged(i).timeout(T))
                .unwrap()
        })
        .collect();
    for r in &reqs {
        assert!(
            matches!(r.wait(T), hixl::TransferStatus::Completed),
            "{:?}",
            r.status()
        );
    }
    drop(reqs);
    for i in 0..8usize {
        assert_eq!(
            peer.sum(((i as u64) << 20) + 5, 1 << 17),
            fnv1a(&data[i << 17..(i + 1) << 17]),
            "async WRITE {i}"
        );
    }
    let m = cli.metrics();
    let lm = m.links.iter().find(|l| l.link == link.id()).unwrap();
    assert!(lm.write.ops >= 9, "{lm:?}");
    assert!(lm.write.errors.is_empty(), "{lm:?}");
    link.disconnect(T).unwrap();
    peer.quit();
}

/// Batches from several threads on one link share its endpoint, and one waits for its flush
/// with the endpoint free, so another posts meanwhile: three threads each WRITE 20 MiB of
/// random data (one descriptor crossing the 16 MiB flush chunk, then 64 KiB descriptors) into
/// their own part of the peer and READ it back into other memory, three rounds; every byte is
/// checked on both sides.
#[test]
fn concurrent_batches_on_one_endpoint() {
    let Some(_devices) = ucx_available("concurrent_batches_on_one_endpoint") else {
        return;
    };
    const PART: usize = 20 << 20;
    let size = 3 * PART;
    let mut peer = ucx_peer(size, 43);
    let (cli, mut buf) = ucx_client(2 * size);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.transport(), TransportKind::Ucx);
    for round in 0..3u64 {
        let data = Rng::new(100 + round).bytes(size);
        buf.write_at(0, &data).unwrap();
        buf.write_at(size, &vec![0u8; size]).unwrap();
        std::thread::scope(|s| {
            for t in 0..3usize {
                let (buf, link) = (&buf, &link);
                let remote = peer.addr + (t * PART) as u64;
                s.spawn(move || {
                    let local = t * PART;
                    // round 0: one descriptor over the flush chunk; later rounds: 64 KiB ones
                    let step = if round == 0 { PART } else { 64 << 10 };
                    let descs = |base: usize| -> Vec<TransferDesc<'_>> {
                        (0..PART / step)
                            .map(|i| {
                                TransferDesc::new(
                                    buf.range(base + i * step..base + (i + 1) * step).unwrap(),
                                    link.remote(remote + (i * step) as u64, step as u64)
                                        .unwrap(),
                                )
                            })
                            .collect()
                    };
                    link.transfer_sync(TransferOp::Write, &descs(local), T)
                        .unwrap();
                    link.transfer_sync(TransferOp::Read, &descs(size + local), T)
                        .unwrap();
                });
            }
        });
        let mut got = vec![0u8; size];
        buf.read_at(size, &mut got).unwrap();
        for t in 0..3 {
            let part = t * PART..(t + 1) * PART;
            assert!(
                got[part.clone()] == data[part.clone()],
                "round {round}: thread {t}'s READ differs"
            );
            assert_eq!(
                peer.sum((t * PART) as u64, PART as u64),
                fnv1a(&data[part]),
                "round {round}: thread {t}'s WRITE differs at the peer"
            );
        }
    }
    link.disconnect(T).unwrap();
    peer.quit();
}

/// A region peers may only READ gets no UCX key: transfers touching it go over the link's TCP
/// lanes, where the server enforces the access rights (a WRITE is refused).
#[test]
fn narrow_access_rights_fall_back_to_checked_tcp() {
    let Some(_devices) = ucx_available("narrow_access_rights_fall_back_to_checked_tcp") else {
        return;
    };
    let seed = Rng::new(9).bytes(4096);
    let srv = Hixl::initialize_ephemeral("127.0.0.1", ucx_opts())
        .unwrap()
        .into_registered();
    let ro = srv.register_with(seed.clone(), Access::Read).unwrap();
    let rw = srv
        .register_with(vec![0u8; 4096], Access::ReadWrite)
        .unwrap();
    let srv = srv.activate().unwrap();
    let (cli, mut buf) = ucx_client(8192);
    {
        let link = cli.connect(srv.name()).unwrap();
        assert_eq!(link.transport(), TransportKind::Ucx);
        let rr = link.region(ro.id()).unwrap();
        let rw_r = link.region(rw.id()).unwrap();
        // READ from the read-only region (over TCP) and WRITE to the read-write one (over UCX)
        let d = TransferDesc::new(buf.range(0..4096).unwrap(), rr.range(..).unwrap());
        link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
        let d = TransferDesc::new(buf.range(0..4096).unwrap(), rw_r.range(..).unwrap());
        link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
        // a WRITE to the read-only region is refused locally, before anything moves
        let d = TransferDesc::new(buf.range(0..16).unwrap(), rr.range(0..16).unwrap());
        let e = link.transfer_sync(TransferOp::Write, &[d], T).unwrap_err();
        assert!(matches!(e, Error::AccessDenied { .. }), "{e:?}");
        assert_eq!(e.status().code(), 103_900);
        link.disconnect(T).unwrap();
    }
    let mut got = vec![0u8; 4096];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, seed);
    let srv = srv.finalize();
    assert_eq!(srv.deregister(rw).unwrap(), seed, "the UCX WRITE landed");
    assert_eq!(srv.deregister(ro).unwrap(), seed);
}

/// The peer is killed while UCX transfers run: the call returns an error within its deadline,
/// the link is poisoned (`NOT_CONNECTED`), and a new connect works once the peer is back.
#[test]
fn peer_killed_then_restarted() {
    let Some(_devices) = ucx_available("peer_killed_then_restarted") else {
        return;
    };
    let size = 16 << 20;
    let peer = ucx_peer(size, 43);
    let name = peer.name.clone();
    let (cli, buf) = ucx_client(size);
    let link = cli.connect(&name).unwrap();
    let deadline = Duration::from_secs(3);
    let mut child = peer.child;
    let d = TransferDesc::new(
        buf.range(..).unwrap(),
        link.remote(peer.addr, size as u64).unwrap(),
    );
    let ops = [TransferOp::Write, TransferOp::Read];
    let (rounds, err, took) = kill_during_rounds(&link, d, &ops, deadline, &mut child, T);
    let _ = child.wait();
    drop((peer.stdin, peer.stdout));
    assert!(rounds > 0);
    assert!(took < deadline + Duration::from_secs(2), "{took:?}");
    assert!(
        [103_901, 103_902, 503_900].contains(&err.status().code()),
        "{err:?}"
    );
    let d = TransferDesc::new(buf.range(0..8).unwrap(), link.remote(peer.addr, 8).unwrap());
    let t0 = Instant::now();
    let again = link
        .transfer_sync(TransferOp::Read, &[d], deadline)
        .unwrap_err();
    assert_eq!(again.status().code(), 103_902, "{again:?}");
    assert!(t0.elapsed() < Duration::from_millis(500));
    // back under the same name: a new link (it supersedes the broken one)
    let peer = Peer::spawn_in(
        &[],
        &name,
        4096,
        44,
        "user",
        &["--psk", KEY, "--ucx", "require"],
    );
    let new = cli.connect(&name).unwrap();
    assert_eq!(new.transport(), TransportKind::Ucx);
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        new.remote(peer.addr, 4096).unwrap(),
    );
    new.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    new.disconnect(T).unwrap();
    drop(link);
    let mut b = buf;
    peer.check_read_back_and_quit(&mut b, 4096, 44);
}

/// `Ucx::Require` against a peer that does not serve over UCX fails the connect with
/// `UNSUPPORTED`; `Ucx::Auto` falls back to TCP; UCX without a pre-shared key is refused at
/// initialize.
#[test]
fn policies_and_fallbacks() {
    let Some(_devices) = ucx_available("policies_and_fallbacks") else {
        return;
    };
    let e = Hixl::initialize("127.0.0.1", Options::default().ucx(Ucx::Auto))
        .expect_err("UCX without a key");
    assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
    assert_eq!(e.status().code(), 103_900);

    let plain = Hixl::initialize_ephemeral("127.0.0.1", Options::default().psk(KEY))
        .unwrap()
        .into_registered();
    let r = plain.register(HostBuffer::new(4096).unwrap()).unwrap();
    let plain = plain.activate().unwrap();
    let (cli, _b) = ucx_client(64);
    let e = cli.connect(plain.name()).expect_err("no UCX there");
    assert!(
        matches!(
            e,
            Error::TransportUnavailable {
                transport: "ucx",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status().code(), 103_905);
    let auto = Options::default()
        .psk(KEY)
        .ucx(Ucx::Auto)
        .same_host(SameHost::Forbid);
    let (cli2, _b2) = common::client_with(64, auto);
    let l = cli2.connect(plain.name()).unwrap();
    assert_eq!(l.transport(), TransportKind::Tcp);
    drop(l);
    let plain = plain.finalize();
    plain.deregister(r).unwrap();
}

/// Where libucp cannot be loaded, asking for UCX is a typed error naming the library, and
/// `probe()` says why. Run in a child process whose `HIXL_UCX_LIB` names a missing file.
#[test]
fn missing_library_is_a_typed_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
        .args(["serve", "--size", "4096", "--psk", KEY, "--ucx", "require"])
        .env("HIXL_UCX_LIB", "/nonexistent/libucp.so.0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot load") && err.contains("/nonexistent/libucp.so.0"),
        "{err}"
    );
}

/// Cancelling a running async request over UCX: the request ends `Cancelled` well before its
/// deadline, between the batch's chunks (once the chunk in flight completed: UCX no longer
/// touches the buffers, and no endpoint is torn down with operations pending), and the link
/// stays usable; a new connect works too. Over shared memory a batch may finish before the
/// cancel lands (process_vm copies are synchronous); over tcp a batch scaled to last about a
/// second is cancelled once its first bytes have landed.
#[test]
fn cancel_a_running_request() {
    let Some(_devices) = ucx_available("cancel_a_running_request") else {
        return;
    };
    let size = 64 << 20;
    let peer = ucx_peer(size, 45);
    let (cli, mut buf) = ucx_client(size);
    let link = cli.connect(&peer.name).unwrap();
    // the batch READs the peer's 64 MiB `n` times: enough to last about a second here (at
    // least 4 times), so that it still runs when the cancel lands, on any machine
    let one = TransferDesc::new(
        buf.range(..).unwrap(),
        link.remote(peer.addr, size as u64).unwrap(),
    );
    // the faster of two (the first may pay for setting the endpoint up)
    let per = (0..2)
        .map(|_| {
            let t0 = Instant::now();
            link.transfer_sync(TransferOp::Read, &[one], T).unwrap();
            t0.elapsed()
        })
        .min()
        .unwrap();
    let n = (Duration::from_secs(1).as_nanos() / per.as_nanos().max(1)).clamp(4, 256) as usize;
    // zeros where the peer's bytes (random) will land: a byte that is no longer zero shows
    // the batch is moving data, that is, it runs (a request still queued is cancelled
    // without touching the link)
    buf.write_at(0, &vec![0u8; size]).unwrap();
    let descs: Vec<_> = (0..n)
        .map(|_| {
            TransferDesc::new(
                buf.range(..).unwrap(),
                link.remote(peer.addr, size as u64).unwrap(),
            )
        })
        .collect();
    let deadline = Duration::from_secs(15);
    let r = link
        .transfer_async(
            TransferOp::Read,
            &descs,
            TransferArgs::default().timeout(deadline),
        )
        .unwrap();
    let landed = || {
        (0..size).step_by(512).any(|i| {
            // SAFETY: inside the registered buffer, alive for the test; UCX writes it
            // meanwhile, so the bytes are only looked at (volatile), never relied on.
            unsafe { std::ptr::read_volatile(buf.as_ptr().add(i)) != 0 }
        })
    };
    let waiting = Instant::now();
    // the pause between looks ends early if the request ends
    while !landed() && !r.wait(Duration::from_millis(1)).is_terminal() {
        assert!(
            waiting.elapsed() < T,
            "no byte of the batch ({n} x 64 MiB) landed in {T:?}"
        );
    }
    eprintln!(
        "one 64 MiB READ took {per:?}; the batch has {n}; data landed after {:?}",
        waiting.elapsed()
    );
    let t0 = Instant::now();
    r.cancel();
    let end = r.wait(deadline);
    let took = t0.elapsed();
    let tcp_only = std::env::var("UCX_TLS").is_ok_and(|t| t == "tcp");
    match end {
        hixl::TransferStatus::Cancelled => {
            assert!(took < Duration::from_secs(3), "cancel took {took:?}");
            drop(r);
            drop(descs);
            let d = TransferDesc::new(buf.range(0..8).unwrap(), link.remote(peer.addr, 8).unwrap());
            link.transfer_sync(TransferOp::Read, &[d], T)
                .expect("the link survives a cancel");
        }
        hixl::TransferStatus::Completed if !tcp_only => {
            eprintln!("cancel_a_running_request: the batch finished before the cancel landed");
            drop(r);
            drop(descs);
        }
        other => panic!("{other:?} after {took:?}"),
    }
    // once it is closed, a new link to the same peer works
    drop(link);
    let again = cli.connect(&peer.name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        again.remote(peer.addr, 4096).unwrap(),
    );
    again.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    drop(again);
    let mut b = buf;
    peer.check_read_back_and_quit(&mut b, 4096, 45);
}

/// Many cancels of running READs never kill the peer: UCX 1.13's tcp transport aborts a process
/// (`uct_tcp_ep_pending_purge`, `stubs.c:102`) whose endpoint is destroyed with replies still
/// pending, which a client force-closing its endpoint on a cancel caused in the serving peer
/// about once in 80 to 110 cancels. Now a cancel waits for the chunk in flight and leaves the
/// endpoint (and the link) as it was: 500 rounds under `UCX_TLS=tcp` (50 otherwise), each a
/// 64 MiB READ cancelled at once or a moment after it started, with the link used again after
/// every round and the peer's bytes checked at the end.
#[test]
fn many_cancels_never_kill_the_peer() {
    let tcp_only = std::env::var("UCX_TLS").is_ok_and(|t| t == "tcp");
    let rounds = if tcp_only { 500 } else { 50 };
    let mut rng = Rng::new(47);
    let ended = read_rounds(
        "many_cancels_never_kill_the_peer",
        46,
        rounds,
        |round, link, descs| {
            let r = link
                .transfer_async(TransferOp::Read, descs, TransferArgs::default().timeout(T))
                .unwrap();
            // at once, or up to about 2 ms later (in the first chunk, or between chunks)
            let spin = Duration::from_micros(u64::from(rng.bytes(1)[0]) * 8);
            let t0 = Instant::now();
            while t0.elapsed() < spin {
                std::hint::spin_loop();
            }
            r.cancel();
            match r.wait(T) {
                hixl::TransferStatus::Cancelled => true,
                hixl::TransferStatus::Completed => false,
                other => panic!("round {round}: {other:?}"),
            }
        },
    );
    if let Some((cancelled, reconnects)) = ended {
        eprintln!("{rounds} rounds: {cancelled} cancelled while running, {reconnects} reconnects");
        assert_eq!(reconnects, 0, "a cancel broke the link");
    }
}

/// Many READs that miss their deadline never kill the peer: as for a cancel
/// (`many_cancels_never_kill_the_peer`), a client tearing its endpoint down with the peer's
/// replies still pending lets UCX 1.13's tcp transport abort the serving process. 200 rounds
/// under `UCX_TLS=tcp` (30 otherwise), each a 64 MiB READ with a deadline of 1 to 3 ms, so it
/// times out with its first chunk in flight; the link a timeout poisoned is connected again; the
/// peer's bytes are checked at the end.
#[test]
fn many_timeouts_never_kill_the_peer() {
    let tcp_only = std::env::var("UCX_TLS").is_ok_and(|t| t == "tcp");
    let rounds = if tcp_only { 200 } else { 30 };
    let mut rng = Rng::new(50);
    let ended = read_rounds(
        "many_timeouts_never_kill_the_peer",
        49,
        rounds,
        |round, link, descs| {
            let ms = 1 + u64::from(rng.bytes(1)[0] % 3);
            match link.transfer_sync(TransferOp::Read, descs, Duration::from_millis(ms)) {
                Ok(()) => false,
                Err(e) if e.status() == hixl::Status::TIMEOUT => true,
                Err(e) => panic!("round {round}: {e}"),
            }
        },
    );
    if let Some((timed_out, reconnects)) = ended {
        eprintln!("{rounds} rounds: {timed_out} timed out, {reconnects} reconnects");
    }
}

/// `rounds` rounds against a UCX peer of 16 MiB (`seed` its bytes): `round` moves a 64 MiB READ
/// (four descriptors of the whole region) on the link and says whether it ended early
/// (cancelled, timed out); after each round a 64-byte READ checks the link, which is connected
/// again if it fails (the peer gone: a panic). At the end the peer's bytes are checked. `None`
/// (printed why) without UCX; else how many rounds ended early and how many reconnects there
/// were.
fn read_rounds(
    test: &str,
    seed: u64,
    rounds: usize,
    mut round: impl FnMut(usize, &hixl::Link<'_>, &[TransferDesc<'_>]) -> bool,
) -> Option<(usize, usize)> {
    let _devices = ucx_available(test)?;
    let size = 16 << 20;
    let peer = ucx_peer(size, seed);
    let (cli, buf) = ucx_client(size);
    let mut link = cli.connect(&peer.name).unwrap();
    let (mut early, mut reconnects) = (0, 0);
    for r in 0..rounds {
        let descs: Vec<_> = (0..4)
            .map(|_| TransferDesc::new(buf.full(), link.remote(peer.addr, size as u64).unwrap()))
            .collect();
        early += usize::from(round(r, &link, &descs));
        drop(descs);
        let d = TransferDesc::new(
            buf.range(0..64).unwrap(),
            link.remote(peer.addr, 64).unwrap(),
        );
        if link.transfer_sync(TransferOp::Read, &[d], T).is_err() {
            reconnects += 1;
            drop(link);
            link = cli
                .connect(&peer.name)
                .unwrap_or_else(|e| panic!("round {r}: the peer is gone: {e}"));
        }
    }
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    drop(link);
    let mut b = buf;
    peer.check_read_back_and_quit(&mut b, 4096, seed);
    Some((early, reconnects))
}

/// A UCX context lists the host's network devices once; when one goes away, every later worker
/// of that context fails `UCS_ERR_NO_DEVICE`. A client (another process, `UCX_TLS=tcp` over
/// every device, `Ucx::Require`) links over UCX, its link is dropped, a veth pair that was up
/// when its context was made is removed, and it links again: over UCX, with the peer's bytes,
/// and no restart (the engine made a new context on the devices there are). Before, the second
/// link failed `UNSUPPORTED` (no UCX worker could be made) until the process restarted.
#[test]
fn a_lost_network_device_costs_no_restart() {
    use std::io::{BufRead, BufReader, Write};
    let Some(devices) = ucx_available("a_lost_network_device_costs_no_restart") else {
        return;
    };
    // (the veth pair's own hold on the devices follows)
    drop(devices);
    let ns = match common::netns::Netns::create(7) {
        Ok((ns, _, _)) => ns,
        Err(why) => {
            eprintln!("a_lost_network_device_costs_no_restart: skipped: no veth pair ({why})");
            return;
        }
    };
    let size = 1 << 20;
    // both over UCX's tcp on every device, whatever this run's UCX_TLS says
    let peer = Peer::spawn_in(
        &["env", "-u", "UCX_NET_DEVICES", "UCX_TLS=tcp"],
        "127.0.0.1",
        size,
        48,
        "user",
        &["--psk", KEY, "--ucx", "require"],
    );
    let want = fnv1a(&Rng::new(48).bytes(64));
    let mut child = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
        .args(["ucx-client", &peer.name, "--psk", KEY])
        .env("UCX_TLS", "tcp")
        .env_remove("UCX_NET_DEVICES")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = child.stdin.take().unwrap();
    let mut from = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |cmd: &str| {
        if !cmd.is_empty() {
            writeln!(to, "{cmd}").unwrap();
        }
        let mut l = String::new();
        from.read_line(&mut l).unwrap();
        l.trim().to_owned()
    };
    assert_eq!(ask(""), "READY");
    assert_eq!(
        ask("link"),
        format!("LINKED ucx {want:016x}"),
        "with the veth up"
    );
    assert_eq!(ask("drop"), "DROPPED");
    drop(ns); // the veth pair goes (and the drop waits until the host no longer lists it)
    assert_eq!(
        ask("link"),
        format!("LINKED ucx {want:016x}"),
        "after the veth went"
    );
    assert_eq!(ask("drop"), "DROPPED");
    ask("quit");
    assert!(child.wait().unwrap().success());
    peer.quit();
}

/// A block-indexed batch over UCX (which expands it once into descriptors): random blocks
/// written at distinct remote indices land there (checked by the peer), and read back by block
/// index they equal what was sent.
#[test]
fn block_batches_over_ucx() {
    let Some(_devices) = ucx_available("block_batches_over_ucx") else {
        return;
    };
    let size = 8 << 20;
    let mut peer = ucx_peer(size, 43);
    let (cli, mut buf) = ucx_client(size);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.transport(), TransportKind::Ucx);
    let block = 4096usize;
    let data = Rng::new(44).bytes(256 * block);
    buf.write_at(0, &data).unwrap();
    let li: Vec<u32> = (0..256).collect();
    let mut rng = Rng::new(45);
    let mut ri: Vec<u32> = (0..(size / block) as u32).collect();
    for i in 0..256 {
        let j = i + rng.below((ri.len() - i) as u64) as usize;
        ri.swap(i, j);
    }
    ri.truncate(256);
    let remote = link.remote(peer.addr, size as u64).unwrap();
    let layout = hixl::BlockLayout::new(buf.range(..).unwrap(), remote, block as u64);
    link.transfer_blocks_sync(TransferOp::Write, &layout, &li, &ri, T)
        .unwrap();
    for (k, &r) in ri.iter().enumerate() {
        let want = fnv1a(&data[k * block..(k + 1) * block]);
        assert_eq!(
            peer.sum(r as u64 * block as u64, block as u64),
            want,
            "block {k}"
        );
    }
    buf.write_at(0, &vec![0; 256 * block]).unwrap();
    let layout = hixl::BlockLayout::new(
        buf.range(..).unwrap(),
        link.remote(peer.addr, size as u64).unwrap(),
        block as u64,
    );
    link.transfer_blocks_sync(TransferOp::Read, &layout, &li, &ri, T)
        .unwrap();
    let mut got = vec![0; 256 * block];
    buf.read_at(0, &mut got).unwrap();
    assert!(got == data, "the blocks read back differ");
    link.disconnect(T).unwrap();
    peer.quit();
}
