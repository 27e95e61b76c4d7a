//! Transfers between two processes: this test process connects to a `hixl-peer` child.

use crate::common;

use std::time::{Duration, Instant};

use common::{Peer, client, exercise_peer, kill_during_rounds};
use hixl::{Error, TransferDesc, TransferOp};

const T: Duration = Duration::from_secs(20);

/// WRITE random data at sub-ranges and in batches into another process, check it there (the
/// peer hashes its own memory), and READ the peer's seeded memory back.
#[test]
fn two_processes_random_data() {
    let size = 72 << 20;
    let mut peer = Peer::spawn("127.0.0.1", size, 11, "hostbuffer");
    assert_eq!(peer.len, size as u64);
    let (cli, mut buf) = client(size);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.remote_pid(), peer.child.id());

    exercise_peer(&link, &mut peer, &mut buf, 11, 64, "tcp");
    link.disconnect(T).unwrap();
    peer.quit();
}

/// The peer is killed while transfers run: the call returns an error within its timeout; the
/// link is broken; once the peer is back under the same name, connecting again works.
#[test]
fn peer_killed_mid_transfer_then_restarted() {
    let size = 64 << 20;
    let peer = Peer::spawn("127.0.0.1", size, 3, "hostbuffer");
    let name = peer.name.clone();
    let (cli, buf) = client(size);
    let link = cli.connect(&name).unwrap();
    let timeout = Duration::from_secs(3);
    let mut child = peer.child;
    let d = TransferDesc::new(
        buf.range(..).unwrap(),
        link.remote(peer.addr, size as u64).unwrap(),
    );
    let ops = [TransferOp::Write, TransferOp::Read];
    let (rounds, err, took) = kill_during_rounds(&link, d, &ops, timeout, &mut child, T);
    let _ = child.wait();
    drop((peer.stdin, peer.stdout));
    assert!(rounds > 0, "no transfer completed before the kill");
    assert!(
        took < timeout + Duration::from_millis(1500),
        "returned after {took:?}"
    );
    assert!(
        matches!(
            err,
            Error::NotConnected { .. } | Error::Io { .. } | Error::Timeout { .. }
        ),
        "{err:?}"
    );
    assert!([103_902, 503_900, 103_901].contains(&err.status().code()));
    // the link stays broken
    let d = TransferDesc::new(buf.range(0..8).unwrap(), link.remote(peer.addr, 8).unwrap());
    let again = link
        .transfer_sync(TransferOp::Read, &[d], timeout)
        .unwrap_err();
    assert_eq!(again.status().code(), 103_902, "{again:?}");
    drop(link);

    // the peer comes back under the same name; a new link works, with the new memory
    let peer = Peer::spawn(&name, 4096, 99, "hostbuffer");
    assert_eq!(peer.name, name);
    let link = cli.connect(&name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], timeout).unwrap();
    drop(link);
    let mut b = buf;
    peer.check_read_back_and_quit(&mut b, 4096, 99);
}

/// A silent peer (stopped with SIGSTOP) is noticed by the heartbeat within about two intervals:
/// the link breaks, and transfers say NOT_CONNECTED at once instead of waiting for their
/// deadline.
#[test]
fn heartbeat_notices_a_silent_peer() {
    let peer = Peer::spawn("127.0.0.1", 1 << 20, 5, "hostbuffer");
    let every = Duration::from_millis(200);
    let opts = hixl::Options::default()
        .same_host(hixl::SameHost::Forbid)
        .heartbeat_interval(Some(every));
    let (cli, buf) = common::client_with(1 << 20, opts);
    let link = cli.connect(&peer.name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    // a live but idle peer keeps its link
    std::thread::sleep(every * 4);
    assert!(!link.is_broken(), "an answering peer lost its link");
    peer.signal(libc::SIGSTOP);
    let t0 = Instant::now();
    while !link.is_broken() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the heartbeat never noticed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let noticed = t0.elapsed();
    assert!(
        noticed < every * 3 + Duration::from_millis(500),
        "noticed after {noticed:?}"
    );
    let t0 = Instant::now();
    let e = link.transfer_sync(TransferOp::Read, &[d], T).unwrap_err();
    assert_eq!(e.status().code(), 103_902, "{e:?}");
    assert!(t0.elapsed() < Duration::from_millis(100));
    peer.signal(libc::SIGCONT);
    drop(link);
    peer.quit();
}

/// Several peers go silent at once (stopped): the heartbeat pings their links side by side, so
/// each link breaks within the bound one silent peer gets (three intervals and half a second)
/// instead of one interval per silent peer after it (a round pinged its links one after
/// another: the fifth silent peer's link broke after five); a live peer beside them keeps its
/// link.
#[test]
fn the_heartbeat_notices_silent_peers_side_by_side() {
    let silent: Vec<Peer> = (0..5)
        .map(|i| Peer::spawn("127.0.0.1", 1 << 16, 40 + i, "hostbuffer"))
        .collect();
    let live = Peer::spawn("127.0.0.1", 1 << 16, 50, "hostbuffer");
    let every = Duration::from_millis(500);
    let opts = hixl::Options::default()
        .same_host(hixl::SameHost::Forbid)
        .heartbeat_interval(Some(every));
    let (cli, mut buf) = common::client_with(1 << 16, opts);
    let links: Vec<_> = (silent.iter())
        .map(|p| cli.connect(&p.name).unwrap())
        .collect();
    let live_link = cli.connect(&live.name).unwrap();
    let pauses: Vec<_> = silent.iter().map(Peer::stopped).collect();
    let t0 = Instant::now();
    while links.iter().any(|l| !l.is_broken()) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the heartbeat never noticed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let noticed = t0.elapsed();
    assert!(
        noticed < every * 3 + Duration::from_millis(500),
        "the last of {} silent peers noticed after {noticed:?}",
        links.len()
    );
    assert!(!live_link.is_broken(), "a live peer lost its link");
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        live_link.remote(live.addr, 4096).unwrap(),
    );
    live_link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    drop(pauses);
    drop(links);
    drop(live_link);
    for p in silent {
        p.quit();
    }
    live.check_read_back_and_quit(&mut buf, 4096, 50);
}
