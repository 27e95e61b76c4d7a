//! Async transfers (deadlines, cancellation, futures, batch polling), notifications, async
//! connect, and metrics.

use crate::common;

use std::future::Future;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{Rng, client, fnv1a, server};
use hixl::{
    Access, AsyncConnectStatus, Error, Options, TransferArgs, TransferDesc, TransferOp,
    TransferReq, TransferStatus,
};

// Upper time bounds leave about a second of slack for a loaded 2-core CI machine (CI slack);
// lower bounds are exact.
const T: Duration = Duration::from_secs(20);

/// A peer that completes the handshake (one region at `BASE`) on every lane, then never answers.
fn mute_peer() -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let name = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        l.set_nonblocking(false).unwrap();
        let mut lanes = Vec::new();
        // serve lanes until the test drops its engine (the accept times out)
        l.set_nonblocking(true).unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            match l.accept() {
                Ok((s, _)) => lanes.push(std::thread::spawn(move || mute_lane(s))),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    (name, h)
}

const BASE: u64 = 0x7000_0000;

fn mute_lane(s: TcpStream) {
    s.set_nonblocking(false).unwrap();
    common::fake_serve(
        s,
        vec![common::entry(0, BASE, 1 << 20, Access::ReadWrite, -1)],
        None,
    );
}

/// A minimal executor: polls a future on this thread, parking between wake-ups.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Many requests in flight on one link, finishing in any order; tags come back; data is right.
#[test]
fn many_requests_in_flight() {
    let block = 256 << 10;
    let n = 64;
    let (srv, mut cache) = server(n * block, Options::default());
    let (cli, mut buf) = client(2 * n * block);
    let data = Rng::new(21).bytes(n * block);
    buf.write_at(0, &data).unwrap();
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    let reqs: Vec<TransferReq<'_>> = (0..n)
        .map(|i| {
            let (a, b) = (i * block, (i + 1) * block);
            let d = TransferDesc::new(
                buf.range(a..b).unwrap(),
                remote.range(a as u64..b as u64).unwrap(),
            );
            link.transfer_async(
                TransferOp::Write,
                &[d],
                TransferArgs::tagged(1000 + i as u64).timeout(T),
            )
            .unwrap()
        })
        .collect();
    // poll them all until every one is done; check tags and order of the report
    let t0 = Instant::now();
    loop {
        let done = TransferReq::poll_many(&reqs, usize::MAX, true);
        for (i, tag, st) in &done {
            assert_eq!(*tag, 1000 + *i as u64);
            assert!(matches!(st, TransferStatus::Completed), "{st:?}");
        }
        if done.len() == n {
            break;
        }
        assert!(t0.elapsed() < T, "requests did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(TransferReq::poll_many(&reqs, 5, false).len(), 5);
    drop(reqs);
    let mut got = vec![0u8; n * block];
    cache.read_at(0, &mut got).unwrap();
    assert!(got == data);

    // READ back asynchronously, awaiting each request as a future
    let reqs: Vec<_> = (0..n)
        .map(|i| {
            let (a, b) = (i * block, (i + 1) * block);
            let d = TransferDesc::new(
                buf.range(n * block + a..n * block + b).unwrap(),
                remote.range(a as u64..b as u64).unwrap(),
            );
            link.transfer_async(TransferOp::Read, &[d], TransferArgs::default().timeout(T))
                .unwrap()
        })
        .collect();
    for r in reqs {
        block_on(r).unwrap();
    }
    drop(link);
    let mut got = vec![0u8; n * block];
    buf.read_at(n * block, &mut got).unwrap();
    assert!(got == data);
    let m = cli.metrics();
    assert_eq!(m.links.len(), 0, "a dropped link is not reported");
}

/// The engine enforces deadlines: a request on a silent peer ends `TimedOut` on time, for
/// `status`, `wait` and the future alike; the buffers are released then.
#[test]
fn deadlines_are_enforced() {
    let (name, _peer) = mute_peer();
    let (cli, buf) = client(1 << 20);
    let link = cli.connect(&name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(BASE, 4096).unwrap(),
    );
    for op in [TransferOp::Read, TransferOp::Write] {
        let t0 = Instant::now();
        let r = link
            .transfer_async(
                op,
                &[d],
                TransferArgs::default().timeout(Duration::from_millis(300)),
            )
            .unwrap();
        assert!(matches!(r.status(), TransferStatus::Waiting));
        let st = r.wait(Duration::from_secs(5));
        let took = t0.elapsed();
        assert!(matches!(st, TransferStatus::TimedOut), "{op}: {st:?}");
        assert_eq!(st.code().unwrap().code(), 103_901);
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_millis(2000),
            "{op}: {took:?}"
        );
    }
    // more requests than lanes: the queued ones time out on time too, and their futures wake
    let reqs: Vec<_> = (0..20)
        .map(|i| {
            link.transfer_async(
                TransferOp::Read,
                &[d],
                TransferArgs::tagged(i).timeout(Duration::from_millis(200 + 10 * i)),
            )
            .unwrap()
        })
        .collect();
    let t0 = Instant::now();
    for r in reqs {
        let e = block_on(r).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert_eq!(e.status().code(), 103_901);
    }
    assert!(
        t0.elapsed() < Duration::from_millis(3000),
        "{:?}",
        t0.elapsed()
    );
    let m = cli.metrics();
    let read = &m.links[0].read;
    assert_eq!(read.in_flight, 0);
    assert!(
        read.errors.get(&103_901).copied().unwrap_or(0) >= 20,
        "{read:?}"
    );
}

/// A request queued behind running ones (both lanes busy until their 30 s deadlines) ends
/// `TimedOut` at its own deadline with nobody asking (only the link's metrics watched): the
/// deadline watcher ends it while it waits for a lane, not a worker when one frees up (README: "a request not finished by its deadline ends
/// `TimedOut`"; guarantees.md: "on time, even while queued"). The running ones are unaffected.
#[test]
fn a_queued_request_times_out_at_its_own_deadline() {
    let (name, _peer) = mute_peer();
    let opts = Options::default()
        .same_host(hixl::SameHost::Forbid)
        .max_lanes(2);
    let (cli, buf) = common::client_with(1 << 20, opts);
    let link = cli.connect(&name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(BASE, 4096).unwrap(),
    );
    let long = TransferArgs::default().timeout(Duration::from_secs(30));
    let running: Vec<_> = (0..2)
        .map(|_| link.transfer_async(TransferOp::Read, &[d], long).unwrap())
        .collect();
    let short = TransferArgs::default().timeout(Duration::from_millis(200));
    let t0 = Instant::now();
    let queued = link.transfer_async(TransferOp::Read, &[d], short).unwrap();
    // the link's metrics watched, the request left alone (its `status` and `wait` would end it
    // at its deadline themselves)
    let timed_out = || {
        let m = cli.metrics();
        m.links[0].read.errors.get(&103_901).copied().unwrap_or(0)
    };
    while timed_out() == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = t0.elapsed();
    assert_eq!(timed_out(), 1, "nothing ended it by {took:?}");
    let st = queued.status();
    assert!(
        matches!(st, TransferStatus::TimedOut),
        "{st:?} after {took:?}"
    );
    assert_eq!(st.code().unwrap().code(), 103_901);
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    for r in &running {
        assert!(matches!(r.status(), TransferStatus::Waiting));
        r.cancel();
    }
    for r in running {
        let st = r.wait(Duration::from_secs(5));
        assert!(matches!(st, TransferStatus::Cancelled), "{st:?}");
    }
}

/// The status follows the caller's latest call, as HIXL's: a `disconnect_async` while a
/// connect runs (to a peer that never answers its HELLO) shows `DisconnectPending` at once, not
/// `Connecting` until the connect gives up; the connect's failure does not show either; the
/// disconnect then runs, and the remote ends `NotConnect`, no longer listed.
#[test]
fn the_async_connect_status_follows_the_latest_call() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let name = silent.local_addr().unwrap().to_string();
    let (cli, _buf) = client(4096);
    cli.connect_async(&name, Duration::from_millis(1500))
        .unwrap();
    let t0 = Instant::now();
    while cli.async_connect_status(&name) != AsyncConnectStatus::Connecting {
        assert!(t0.elapsed() < T, "{:?}", cli.async_connect_status(&name));
        std::thread::sleep(Duration::from_millis(1));
    }
    cli.disconnect_async(&name, T).unwrap();
    assert_eq!(
        cli.async_connect_status(&name),
        AsyncConnectStatus::DisconnectPending
    );
    let mut seen = Vec::new();
    let t0 = Instant::now();
    loop {
        let st = cli.async_connect_status(&name);
        if seen.last() != Some(&st) {
            seen.push(st);
        }
        if st == AsyncConnectStatus::NotConnect {
            break;
        }
        assert!(t0.elapsed() < T, "{seen:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        !seen.contains(&AsyncConnectStatus::Connecting)
            && !seen.contains(&AsyncConnectStatus::ConnectFailed),
        "{seen:?}"
    );
    assert!(cli.async_connect_statuses().is_empty());
    drop(silent);
}

/// Cancel: a queued request ends at once; a running one is stopped well before its deadline.
#[test]
fn cancellation() {
    let (name, _peer) = mute_peer();
    let (cli, buf) = client(1 << 20);
    let link = cli.connect(&name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(BASE, 4096).unwrap(),
    );
    let long = TransferArgs::default().timeout(Duration::from_secs(30));
    let running = link.transfer_async(TransferOp::Read, &[d], long).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    running.cancel();
    let st = running.wait(Duration::from_secs(5));
    assert!(matches!(st, TransferStatus::Cancelled), "{st:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        running.result(),
        Some(Err(Error::Cancelled { .. }))
    ));
    // the link survives a cancel
    assert!(!link.is_broken());
    // fill every lane, then cancel one that is still queued
    let busy: Vec<_> = (0..8)
        .map(|_| link.transfer_async(TransferOp::Read, &[d], long).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let queued = link.transfer_async(TransferOp::Read, &[d], long).unwrap();
    let st = queued.cancel();
    assert!(matches!(st, TransferStatus::Cancelled), "{st:?}");
    for b in &busy {
        b.cancel();
    }
    for b in &busy {
        assert!(b.wait(Duration::from_secs(5)).is_terminal());
    }
}

/// Dropping or forgetting requests is safe: the memory stays alive (and registered) until the
/// request has ended, and nothing grows.
#[test]
fn dropped_and_forgotten_requests() {
    let (srv, _cache) = server(1 << 20, Options::default());
    let (cli, buf) = client(1 << 20);
    {
        let link = cli.connect(srv.name()).unwrap();
        let d = TransferDesc::new(
            buf.range(0..65536).unwrap(),
            link.regions().next().unwrap().range(0..65536).unwrap(),
        );
        for _ in 0..2000 {
            drop(
                link.transfer_async(TransferOp::Write, &[d], TransferArgs::default())
                    .unwrap(),
            );
        }
        // the link settles: nothing left in flight
        let t0 = Instant::now();
        while cli.metrics().links[0].write.in_flight > 0 {
            assert!(t0.elapsed() < T);
            std::thread::sleep(Duration::from_millis(5));
        }
        link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    }
    // a forgotten request on a silent peer keeps its region busy while its link lives; closing
    // the link (here: dropping it) cancels the request and waits for it, so the region is free
    // when the drop returns, long before the request's own deadline
    let (name, _peer) = mute_peer();
    let mut buf = buf;
    let cli = {
        let link = cli.connect(&name).unwrap();
        let d = TransferDesc::new(
            buf.range(0..4096).unwrap(),
            link.remote(BASE, 4096).unwrap(),
        );
        let r = link
            .transfer_async(
                TransferOp::Read,
                &[d],
                TransferArgs::default().timeout(Duration::from_secs(60)),
            )
            .unwrap();
        std::mem::forget(r);
        let mut one = [0u8; 1];
        let busy = buf.read_at(0, &mut one).unwrap_err();
        assert!(matches!(busy, Error::RegionBusy { .. }), "{busy:?}");
        assert_eq!(busy.status().code(), 203_900);
        let t0 = Instant::now();
        drop(link);
        assert!(t0.elapsed() < T, "closing the link took {:?}", t0.elapsed());
        cli.deactivate()
    };
    let mem = cli
        .deregister(buf)
        .expect("the cancelled request let go of the region");
    assert_eq!(mem.len(), 1 << 20);
}

/// A notification sent right after an async WRITE reaches the peer only after that WRITE's data
/// has landed.
#[test]
fn notify_after_write_is_ordered() {
    let len = 64 << 20;
    let (srv, mut cache) = server(len, Options::default());
    let (cli, mut buf) = client(len);
    let link = cli.connect(srv.name()).unwrap();
    for round in 0..3u64 {
        let data = Rng::new(100 + round).bytes(len);
        buf.write_at(0, &data).unwrap();
        let d = TransferDesc::new(buf.full(), link.regions().next().unwrap().full());
        let w = link
            .transfer_async(TransferOp::Write, &[d], TransferArgs::default().timeout(T))
            .unwrap();
        link.send_notify("kv-ready", &format!("round {round}"), T)
            .unwrap();
        // the WRITE has ended by the time the notification was acknowledged
        assert!(matches!(w.status(), TransferStatus::Completed));
        let got = srv.get_notifies();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].name.as_str(), got[0].msg.clone()),
            ("kv-ready", format!("round {round}"))
        );
        assert_eq!(got[0].from, cli.name());
        let mut landed = vec![0u8; len];
        cache.read_at(0, &mut landed).unwrap();
        assert_eq!(
            fnv1a(&landed),
            fnv1a(&data),
            "round {round}: notified before the data landed"
        );
    }
}

/// A notification sent while another thread's sync WRITE runs on the same link reaches the
/// peer (another process, which hashes the WRITE's last block the moment the notification is
/// delivered) only after that WRITE's data has landed: over the same-host path and over TCP.
/// (Notifications waited for async requests only: the peer saw the last block unwritten in 10
/// of 10 rounds.)
#[test]
fn notify_during_a_sync_write_follows_its_data() {
    const MIB: usize = 1 << 20;
    const LEN: usize = 128 * MIB;
    let mut early = Vec::new();
    for policy in [hixl::SameHost::Auto, hixl::SameHost::Forbid] {
        let mut peer = common::Peer::spawn("127.0.0.1", LEN, 81, "hostbuffer");
        let (cli, mut buf) = common::client_with(LEN, Options::default().same_host(policy));
        let link = cli.connect(&peer.name).unwrap();
        let mut data = Rng::new(200).bytes(LEN);
        for round in 0..5u64 {
            // each round's last block is new (the one the peer hashes)
            data[LEN - MIB..].copy_from_slice(&Rng::new(201 + round).bytes(MIB));
            buf.write_at(0, &data).unwrap();
            // the peer's region 1 MiB a descriptor, in order: the last block lands last
            let descs: Vec<_> = (0..LEN / MIB)
                .map(|i| {
                    let local = buf.range(i * MIB..(i + 1) * MIB).unwrap();
                    let remote = link.remote(peer.addr + (i * MIB) as u64, MIB as u64);
                    TransferDesc::new(local, remote.unwrap())
                })
                .collect();
            let last = fnv1a(&data[LEN - MIB..]);
            use std::io::Write;
            writeln!(peer.stdin, "await-notify kv {} {MIB}", LEN - MIB).unwrap();
            std::thread::scope(|s| {
                let writer = s.spawn(|| link.transfer_sync(TransferOp::Write, &descs, T));
                // the WRITE has started (it counts as in flight once it is listed)
                while cli.metrics().links[0].write.in_flight == 0 && !writer.is_finished() {
                    std::thread::yield_now();
                }
                link.send_notify("kv", "ready", T).unwrap();
                writer.join().unwrap().unwrap();
            });
            let mut line = String::new();
            std::io::BufRead::read_line(&mut peer.stdout, &mut line).unwrap();
            let sum = line.trim().strip_prefix("NOTIFIED ").expect(&line);
            early.push(u64::from_str_radix(sum, 16).unwrap() != last);
        }
        drop(link);
        peer.quit();
    }
    let n = early.iter().filter(|&&e| e).count();
    assert_eq!(
        n,
        0,
        "{n} of {} notifications reached the peer before the WRITE's data: {early:?}",
        early.len()
    );
}

#[test]
fn notify_limits() {
    let (srv, _cache) = server(4096, Options::default());
    let (cli, _buf) = client(4096);
    let link = cli.connect(srv.name()).unwrap();
    let long = "x".repeat(1025);
    let e = link.send_notify(&long, "m", T).unwrap_err();
    assert!(matches!(
        e,
        Error::NotifyTooLong {
            what: "name",
            len: 1025,
            ..
        }
    ));
    assert_eq!(e.status().code(), 103_900);
    let e = link.send_notify("n", &long, T).unwrap_err();
    assert!(matches!(
        e,
        Error::NotifyTooLong {
            what: "message",
            ..
        }
    ));
    link.send_notify(&"y".repeat(1024), &"z".repeat(1024), T)
        .unwrap();
    for i in 1..4096 {
        link.send_notify("n", &i.to_string(), T).unwrap();
    }
    let e = link.send_notify("n", "one too many", T).unwrap_err();
    assert_eq!(e.status().code(), 203_900, "{e:?}");
    assert!(!link.is_broken());
    let got = srv.get_notifies();
    assert_eq!(got.len(), 4096);
    assert_eq!(got[1].msg, "1");
    assert_eq!(got[4095].msg, "4095");
    link.send_notify("n", "room again", T).unwrap();
    assert_eq!(srv.get_notifies().len(), 1);
    assert_eq!(cli.metrics().links[0].notifies, 4097);
}

#[test]
fn async_connect() {
    let (srv, _cache) = server(4096, Options::default());
    let (cli, buf) = client(4096);
    assert_eq!(
        cli.async_connect_status(srv.name()),
        AsyncConnectStatus::NotConnect
    );
    cli.connect_async(srv.name(), T).unwrap();
    let t0 = Instant::now();
    while cli.async_connect_status(srv.name()) != AsyncConnectStatus::Connected {
        assert!(t0.elapsed() < T);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cli.async_connect_statuses().len(), 1);
    // the link is held by the engine: a sync connect to the same peer is ALREADY_CONNECTED
    assert_eq!(
        cli.connect(srv.name()).unwrap_err().status().code(),
        103_903
    );
    {
        let link = cli.take_link(srv.name()).unwrap();
        assert_eq!(
            cli.async_connect_status(srv.name()),
            AsyncConnectStatus::NotConnect
        );
        let d = TransferDesc::new(
            buf.range(0..8).unwrap(),
            link.regions().next().unwrap().range(0..8).unwrap(),
        );
        link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    }
    // FIFO per remote: connect, disconnect, connect queued back to back ends connected
    cli.connect_async(srv.name(), T).unwrap();
    cli.disconnect_async(srv.name(), T).unwrap();
    cli.connect_async(srv.name(), T).unwrap();
    let t0 = Instant::now();
    while cli.async_connect_status(srv.name()) != AsyncConnectStatus::Connected {
        assert!(t0.elapsed() < T);
        std::thread::sleep(Duration::from_millis(1));
    }
    cli.disconnect_async(srv.name(), T).unwrap();
    let t0 = Instant::now();
    while cli.async_connect_status(srv.name()) != AsyncConnectStatus::NotConnect {
        assert!(t0.elapsed() < T);
        std::thread::sleep(Duration::from_millis(1));
    }
    // disconnected: no entry left, as HIXL's (it erases a remote that reaches NOT_CONNECT), so
    // remotes connected and disconnected in turn do not grow the table
    assert!(
        cli.async_connect_statuses().is_empty(),
        "{:?}",
        cli.async_connect_statuses()
    );
    // a failed connect reports its error through take_link
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap().to_string();
    drop(closed);
    cli.connect_async(&gone, Duration::from_millis(500))
        .unwrap();
    let t0 = Instant::now();
    while cli.async_connect_status(&gone) != AsyncConnectStatus::ConnectFailed {
        assert!(t0.elapsed() < T);
        std::thread::sleep(Duration::from_millis(1));
    }
    let e = cli.take_link(&gone).unwrap_err();
    assert_eq!(e.status().code(), 503_900, "{e:?}");
    assert!(matches!(
        cli.disconnect_async(&gone, T),
        Err(Error::NotConnected { .. })
    ));
    assert!(matches!(
        cli.connect_async(&gone, Duration::ZERO),
        Err(Error::InvalidTimeout { .. })
    ));
}

#[test]
fn async_connect_queue_is_bounded() {
    // a listener that never accepts: connects complete in the kernel, and the handshake times out
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let name = silent.local_addr().unwrap().to_string();
    let (cli, _buf) = client(4096);
    let mut full = None;
    for i in 0..200 {
        match cli.connect_async(&name, Duration::from_millis(300)) {
            Ok(()) => {}
            Err(e) => {
                full = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = full.expect("the queue never filled");
    assert!((128..=140).contains(&i), "filled after {i}");
    assert!(matches!(e, Error::QueueFull { capacity: 128 }));
    assert_eq!(e.status().code(), 203_900);
    // finalize does not wait for the queue to drain
    let t0 = Instant::now();
    let _ = cli.finalize();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn metrics_count_what_happened() {
    let (srv, _cache) = server(1 << 20, Options::default());
    let (cli, buf) = client(1 << 20);
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    let d = TransferDesc::new(buf.range(0..1000).unwrap(), remote.range(0..1000).unwrap());
    for _ in 0..10 {
        link.transfer_sync(TransferOp::Write, &[d, d], T).unwrap();
    }
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    let m = cli.metrics();
    assert_eq!((m.regions, m.registered_bytes), (1, 1 << 20));
    let l = &m.links[0];
    assert_eq!((l.link, l.peer.as_str()), (link.id(), srv.name()));
    assert_eq!((l.write.ops, l.write.bytes), (10, 20_000));
    assert_eq!((l.read.ops, l.read.bytes), (1, 1000));
    let (p50, p99) = (l.write.p50.unwrap(), l.write.p99.unwrap());
    assert!(p50 <= p99 && p99 < T, "{p50:?} {p99:?}");
    assert!(l.write.errors.is_empty());
}

/// `mem::forget` ends the borrows a request holds on its regions, so the compiler no longer
/// stops `read_at`/`write_at` (`ui-tests/write_at_while_request_held.rs` is the held form): the
/// engine checks at run time, and both say `RegionBusy` until the request has ended, instead of
/// racing the copy. Once it ends, the region is the caller's again.
#[test]
fn forgotten_request_makes_region_copies_busy() {
    let (cli, mut buf) = client(1 << 20);
    let (name, _peer) = mute_peer();
    let link = cli.connect(&name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(BASE, 4096).unwrap(),
    );
    let r = link
        .transfer_async(
            TransferOp::Read,
            &[d],
            TransferArgs::default().timeout(Duration::from_secs(3)),
        )
        .unwrap();
    std::mem::forget(r);
    let mut one = [0u8; 1];
    for e in [
        buf.read_at(0, &mut one).unwrap_err(),
        buf.write_at(0, b"x").unwrap_err(),
    ] {
        assert!(matches!(e, Error::RegionBusy { .. }), "{e:?}");
        assert_eq!(e.status().code(), 203_900);
    }
    // the deadline ends the request (the peer never answers); then the region is free again
    let t0 = Instant::now();
    while buf.write_at(0, b"x").is_err() {
        assert!(t0.elapsed() < T, "the forgotten request never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    buf.read_at(0, &mut one).unwrap();
    assert_eq!(one[0], b'x');
    // a request that ended (waited for, then dropped) leaves nothing busy
    let r = link
        .transfer_async(
            TransferOp::Read,
            &[TransferDesc::new(
                buf.range(0..4096).unwrap(),
                link.remote(BASE, 4096).unwrap(),
            )],
            TransferArgs::default().timeout(Duration::from_millis(200)),
        )
        .unwrap();
    assert!(matches!(r.wait(T), TransferStatus::TimedOut));
    drop(r);
    buf.write_at(0, b"y")
        .expect("an ended request releases its region at once");
}

/// A `Link` that was `mem::forget`ten no longer borrows its engine, so `deactivate` compiles;
/// it must still end that link: none is listed afterwards, and after re-activation a new connect
/// to the same peer works (it is not `ALREADY_CONNECTED` for the life of the engine).
#[test]
fn deactivate_ends_forgotten_links() {
    let (srv, _cache) = server(1 << 20, Options::default());
    let (cli, mut buf) = client(1 << 20);
    let link = cli.connect(srv.name()).unwrap();
    std::mem::forget(link);
    assert_eq!(cli.metrics().links.len(), 1);
    let cli = cli.deactivate();
    assert!(cli.metrics().links.is_empty(), "{:?}", cli.metrics().links);
    let cli = cli.activate().unwrap();
    let link = cli
        .connect(srv.name())
        .expect("the forgotten link no longer holds the peer's name");
    let data = Rng::new(77).bytes(4096);
    buf.write_at(0, &data).unwrap();
    let remote = link.regions().next().unwrap().range(0..4096).unwrap();
    link.transfer_sync(
        TransferOp::Write,
        &[TransferDesc::new(buf.range(0..4096).unwrap(), remote)],
        T,
    )
    .unwrap();
    link.transfer_sync(
        TransferOp::Read,
        &[TransferDesc::new(buf.range(4096..8192).unwrap(), remote)],
        T,
    )
    .unwrap();
    let mut got = vec![0u8; 4096];
    buf.read_at(4096, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(cli.metrics().links.len(), 1);
    // finalize ends forgotten links too
    std::mem::forget(link);
    drop(cli.finalize());
}

/// Same-host batches meet their deadline and their cancel: against a peer in another process
/// (its memory mapped, or a `Vec` reached with `process_vm_*`), a batch far longer than its
/// deadline ends `TimedOut` (async) or `TIMEOUT` (sync) in a small part of the time it would
/// take, a cancelled one `Cancelled`, and nothing lands in the local buffer once it ended. (The
/// same-host copy did not look at either: the 4 GiB batch ended `Completed`.)
#[test]
fn same_host_batches_stop_at_their_deadline_and_cancel() {
    if !common::same_host_available() {
        return;
    }
    const LEN: usize = 64 << 20;
    for memory in ["hostbuffer", "user"] {
        let peer = common::Peer::spawn("127.0.0.1", LEN, 71, memory);
        let (cli, mut buf) =
            common::client_with(LEN, Options::default().same_host(hixl::SameHost::Require));
        let link = cli.connect(&peer.name).unwrap();
        let remote = link.remote(peer.addr, LEN as u64).unwrap();
        let one = TransferDesc::new(buf.full(), remote);
        // what one descriptor (64 MiB) takes here, now, warm (the first touches the pages):
        // the batches below are 64 of them
        let whole = (0..3)
            .map(|_| {
                let t0 = Instant::now();
                link.transfer_sync(TransferOp::Read, &[one], T).unwrap();
                t0.elapsed()
            })
            .min()
            .unwrap()
            * 64;
        let batch = vec![one; 64];
        let short = Duration::from_millis(5);
        let mut cases = Vec::new();
        for op in [TransferOp::Read, TransferOp::Write] {
            let t0 = Instant::now();
            let r = link
                .transfer_async(op, &batch, TransferArgs::default().timeout(short))
                .unwrap();
            let st = r.wait(T);
            cases.push((format!("{memory} async {op}"), st, t0.elapsed()));
            drop(r);
            let t0 = Instant::now();
            let st = match link.transfer_sync(op, &batch, short) {
                Ok(()) => TransferStatus::Completed,
                Err(Error::Timeout { .. }) => TransferStatus::TimedOut,
                Err(e) => TransferStatus::Failed(Arc::new(e)),
            };
            cases.push((format!("{memory} sync {op}"), st, t0.elapsed()));
            let long = TransferArgs::default().timeout(T);
            let t0 = Instant::now();
            let r = link.transfer_async(op, &batch, long).unwrap();
            r.cancel();
            let st = r.wait(T);
            cases.push((format!("{memory} cancelled {op}"), st, t0.elapsed()));
        }
        for (what, st, took) in &cases {
            let want = if what.contains("cancelled") {
                matches!(st, TransferStatus::Cancelled)
            } else {
                matches!(st, TransferStatus::TimedOut)
            };
            assert!(
                want,
                "{what}: {st:?} after {took:?} (the whole batch: {whole:?})"
            );
            assert!(
                *took < whole / 4,
                "{what}: ended after {took:?}, the whole batch takes {whole:?}"
            );
        }
        // no request runs now: nothing writes the buffer any more
        buf.write_at(0, &vec![0xA5; 4096]).unwrap();
        let mut got = vec![0u8; 4096];
        for _ in 0..20 {
            buf.read_at(0, &mut got).unwrap();
            assert!(
                got.iter().all(|&b| b == 0xA5),
                "{memory}: written after the end"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(link);
        peer.quit();
    }
}

/// Dropping an engine while one of its async connects waits on a peer that never answers (a
/// listener that never accepts) tears it down on return: a peer linked to it can no longer
/// reach its memory (the connect held the engine, which served on until the connect's timeout;
/// `finalize` and `deactivate` waited for it instead).
#[test]
fn dropping_an_engine_with_an_async_connect_pending_stops_it_at_once() {
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_name = mute.local_addr().unwrap().to_string();
    let (srv, _cache) = server(4096, Options::default());
    let (cli, buf) = client(4096);
    let link = cli.connect(srv.name()).unwrap();
    let d = TransferDesc::new(
        buf.range(0..8).unwrap(),
        link.regions().next().unwrap().range(0..8).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    srv.connect_async(&mute_name, T).unwrap();
    let t0 = Instant::now();
    while srv.async_connect_status(&mute_name) != AsyncConnectStatus::Connecting {
        assert!(t0.elapsed() < T, "the async connect never started");
        std::thread::yield_now();
    }
    let t = Instant::now();
    drop(srv);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let e = link
        .transfer_sync(TransferOp::Write, &[d], Duration::from_secs(5))
        .unwrap_err();
    assert_eq!(e.status().code(), 103_902, "{e:?}");
    drop(mute);
}

/// Timeouts past what the clock can hold (`Duration::MAX`) wait as long as HIXL's longest
/// (`i32::MAX` ms) and panic nowhere: a connect, an async connect (its worker panicked, which
/// left the remote `Connecting` for good), a sync and an async transfer, a request's wait, a
/// notification and a disconnect all end as with any other timeout.
#[test]
fn the_longest_timeouts_panic_nowhere() {
    let (srv, mut cache) = server(4096, Options::default());
    let opts = Options::default()
        .same_host(hixl::SameHost::Forbid)
        .connect_timeout(Duration::MAX);
    let (cli, mut buf) = common::client_with(4096, opts);
    cli.connect_async(srv.name(), Duration::MAX).unwrap();
    let t0 = Instant::now();
    while cli.async_connect_status(srv.name()) != AsyncConnectStatus::Connected {
        assert!(t0.elapsed() < T, "the async connect never ended");
        std::thread::yield_now();
    }
    let link = cli.take_link(srv.name()).unwrap();
    let data = Rng::new(91).bytes(4096);
    buf.write_at(0, &data).unwrap();
    let remote = link.regions().next().unwrap();
    let d = TransferDesc::new(buf.range(0..2048).unwrap(), remote.range(0..2048).unwrap());
    link.transfer_sync(TransferOp::Write, &[d], Duration::MAX)
        .unwrap();
    let d2 = TransferDesc::new(
        buf.range(2048..4096).unwrap(),
        remote.range(2048..4096).unwrap(),
    );
    let req = link
        .transfer_async(
            TransferOp::Write,
            &[d2],
            TransferArgs::default().timeout(Duration::MAX),
        )
        .unwrap();
    let st = req.wait(Duration::MAX);
    assert!(matches!(st, TransferStatus::Completed), "{st:?}");
    link.send_notify("n", "long", Duration::MAX).unwrap();
    link.disconnect(Duration::MAX).unwrap();
    let mut got = vec![0u8; 4096];
    cache.read_at(0, &mut got).unwrap();
    assert_eq!(got, data);
    let link = cli.connect(srv.name()).unwrap();
    link.disconnect(T).unwrap();
}
