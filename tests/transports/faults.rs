//! Faults survived: a peer killed during async transfers of each direction, a peer restarted
//! under the same name while the old link handle is still held (link generations), and a link cut
//! on a veth pair between network namespaces. Every wait here is bounded.

use crate::common;

use std::time::{Duration, Instant};

use common::netns::{Netns, sh};
use common::{Peer, Rng, client, client_with, fnv1a};
use hixl::{Error, TransferArgs, TransferDesc, TransferOp, TransferStatus};

const T: Duration = Duration::from_secs(20);

/// SIGKILL while async transfers of one direction are in flight: every request ends with an
/// error (never `Completed` after the kill is noticed, never stuck `Waiting`) within its
/// deadline; the link is broken; when the peer is back under the same name a new connect works
/// while the old handle is still held, and the old one stays `NOT_CONNECTED`.
fn killed_during_async(op: TransferOp, seed: u64) {
    let size = 32 << 20;
    let peer = Peer::spawn("127.0.0.1", size, seed, "user");
    let name = peer.name.clone();
    let (cli, buf) = client(size);
    let old = cli.connect(&name).unwrap();
    let deadline = Duration::from_secs(4);
    let chunk = 4u64 << 20;
    let mut reqs = Vec::new();
    let mut child = peer.child;
    let started = Instant::now();
    // keep 8 requests of 4 MiB in flight; kill the peer once some have completed
    let mut completed = 0u32;
    let mut killed_at = None;
    let mut ended_after_kill = Vec::new();
    let mut refused_after_kill: Option<Error> = None;
    while killed_at.is_none() || !reqs.is_empty() {
        assert!(started.elapsed() < T, "requests did not end");
        if killed_at.is_none() && completed >= 8 {
            child.kill().unwrap();
            killed_at = Some(Instant::now());
        }
        // keep submitting after the kill too, until the engine notices it
        let noticed = ended_after_kill
            .iter()
            .any(|(s, _, _): &(TransferStatus, _, _)| !matches!(s, TransferStatus::Completed))
            || refused_after_kill.is_some();
        while !noticed && reqs.len() < 8 {
            let i = reqs.len() as u64;
            let d = TransferDesc::new(
                buf.range((i * chunk) as usize..((i + 1) * chunk) as usize)
                    .unwrap(),
                old.remote(peer.addr + i * chunk, chunk).unwrap(),
            );
            match old.transfer_async(op, &[d], TransferArgs::tagged(i).timeout(deadline)) {
                Ok(r) => reqs.push(r),
                Err(e) if killed_at.is_some() => {
                    refused_after_kill = Some(e);
                    break;
                }
                Err(e) => panic!("submit before the kill: {e:?}"),
            }
        }
        let mut still = Vec::new();
        for r in reqs {
            match r.status() {
                TransferStatus::Waiting => still.push(r),
                TransferStatus::Completed if killed_at.is_none() => completed += 1,
                s => {
                    if let Some(k) = killed_at {
                        ended_after_kill.push((s, k.elapsed(), r.deadline()));
                    } else {
                        panic!("request failed before the kill: {s:?}");
                    }
                }
            }
        }
        reqs = still;
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(reqs);
    let _ = child.wait();
    drop((peer.stdin, peer.stdout));
    assert!(completed >= 8, "{completed} completed before the kill");
    for (s, after, _) in &ended_after_kill {
        // a request that was already done on the wire may still complete; anything else is an
        // error with a HIXL code, within the deadline (plus scheduling slack)
        assert!(
            *after < deadline + Duration::from_millis(1500),
            "ended {after:?} after the kill"
        );
        if !matches!(s, TransferStatus::Completed) {
            let code = s.code().unwrap().code();
            assert!([103_901, 103_902, 503_900].contains(&code), "{s:?}");
        }
    }
    match &refused_after_kill {
        Some(e) => assert_eq!(e.status().code(), 103_902, "{e:?}"),
        None => assert!(
            ended_after_kill
                .iter()
                .any(|(s, _, _)| !matches!(s, TransferStatus::Completed)),
            "no request saw the kill"
        ),
    }
    // the link is broken; new async requests are refused at once
    let d = TransferDesc::new(
        buf.range(0..64).unwrap(),
        old.remote(peer.addr, 64).unwrap(),
    );
    let t0 = Instant::now();
    while !old.is_broken() {
        assert!(t0.elapsed() < deadline, "the link did not break");
        let _ = old.transfer_sync(TransferOp::Read, &[d], Duration::from_millis(500));
    }
    let e = old
        .transfer_async(TransferOp::Read, &[d], TransferArgs::default())
        .expect_err("refused");
    assert_eq!(e.status().code(), 103_902, "{e:?}");

    let old_d = d;
    // the peer restarts under the same name with other memory; the old handle is still held
    let mut peer = Peer::spawn(&name, 1 << 20, seed + 100, "user");
    let new = cli
        .connect(&name)
        .expect("a broken link does not block a new connect");
    assert!(new.id() > old.id(), "generations increase");
    assert_ne!(new.remote_instance(), old.remote_instance());
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        new.remote(peer.addr, 4096).unwrap(),
    );
    new.transfer_async(op, &[d], TransferArgs::default().timeout(T))
        .unwrap()
        .wait(T);
    // the stale handle stays stale, even with the peer back
    let stale = old
        .transfer_sync(TransferOp::Read, &[old_d], Duration::from_secs(1))
        .err()
        .map(|e| e.status().code());
    assert_eq!(stale, Some(103_902));
    // a second connect while the new link is healthy is refused
    assert!(matches!(
        cli.connect(&name).err(),
        Some(Error::AlreadyConnected { .. })
    ));
    drop(old);
    // dropping the stale handle does not free the name held by the new link
    assert!(matches!(
        cli.connect(&name).err(),
        Some(Error::AlreadyConnected { .. })
    ));
    let mut b = buf;
    let mut got = vec![0u8; 4096];
    b.read_at(0, &mut got).unwrap();
    match op {
        TransferOp::Read => assert_eq!(got, Rng::new(seed + 100).bytes(4096)),
        TransferOp::Write => assert_eq!(peer.sum(0, 4096), fnv1a(&got)),
    }
    new.disconnect(T).unwrap();
    peer.quit();
}

#[test]
fn peer_killed_during_async_writes() {
    killed_during_async(TransferOp::Write, 21);
}

#[test]
fn peer_killed_during_async_reads() {
    killed_during_async(TransferOp::Read, 22);
}

/// A link cut on a veth pair (the peer's end set down inside its namespace, so packets are
/// dropped and nothing says goodbye): a transfer in flight fails within its deadline, the client's
/// heartbeat breaks the idle link within a few intervals, the server's keepalive drops the
/// silent client's connections, and once the wire is back a new connect works.
#[test]
fn cut_link_on_a_veth_pair() {
    let (ns, ns_if, ip) = match Netns::create(1) {
        Ok(x) => x,
        Err(why) => {
            eprintln!(
                "cut_link_on_a_veth_pair: skipped: cannot create a network namespace ({why})"
            );
            return;
        }
    };
    if let Err(why) = sh(&["ss", "-V"]) {
        eprintln!("cut_link_on_a_veth_pair: skipped: no ss ({why})");
        return;
    }
    let every = Duration::from_millis(250);
    let prefix = ["ip", "netns", "exec", ns.name.as_str()];
    let mut peer = Peer::spawn_in(
        &prefix,
        &ip,
        8 << 20,
        31,
        "user",
        &["--heartbeat-ms", "1000", "--io-timeout-ms", "3000"],
    );
    let port: u16 = peer.name.rsplit(':').next().unwrap().parse().unwrap();
    let opts = hixl::Options::default()
        .same_host(hixl::SameHost::Forbid)
        .heartbeat_interval(Some(every));
    let (cli, buf) = client_with(8 << 20, opts);
    let link = cli.connect(&peer.name).unwrap();
    let all = TransferDesc::new(
        buf.range(..).unwrap(),
        link.remote(peer.addr, 8 << 20).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[all], T).unwrap();
    let mut b = vec![0u8; 8 << 20];
    {
        let mut r = buf;
        r.read_at(0, &mut b).unwrap();
        assert_eq!(b, Rng::new(31).bytes(8 << 20));
        // cut the wire while a WRITE is running: the call fails within its deadline
        ns.exec(&["ip", "link", "set", &ns_if, "down"]).unwrap();
        let deadline = Duration::from_secs(2);
        let all = TransferDesc::new(
            r.range(..).unwrap(),
            link.remote(peer.addr, 8 << 20).unwrap(),
        );
        let t0 = Instant::now();
        let mut err = None;
        for _ in 0..3 {
            if let Err(e) = link.transfer_sync(TransferOp::Write, &[all], deadline) {
                err = Some(e);
                break;
            }
        }
        let took = t0.elapsed();
        let err = err.expect("a transfer over a cut wire failed");
        assert!(took < deadline + Duration::from_secs(1), "{took:?}");
        assert!(
            [103_901, 103_902, 503_900].contains(&err.status().code()),
            "{err:?}"
        );
        // the idle link is declared dead by the heartbeat
        let t0 = Instant::now();
        while !link.is_broken() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "heartbeat never noticed the cut"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // the server drops the silent client's connections (keepalive/user timeout: about three
        // of its 1 s intervals after the wire went quiet, which was before the 2 s READ above;
        // serving.md's "after about three")
        let t0 = Instant::now();
        while ns.established(port) > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the server kept {} connections of a cut client",
                ns.established(port)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // the wire comes back: a new link works (the broken one is superseded)
        ns.exec(&["ip", "link", "set", &ns_if, "up"]).unwrap();
        // (the neighbour entry may need a moment after the carrier returns)
        let t0 = Instant::now();
        let again = loop {
            match cli.connect(&peer.name) {
                Ok(l) => break l,
                Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                    // a SYN sent before the neighbour entry is back is lost: refused or timed out
                    assert!(
                        matches!(e, Error::ConnectFailed { .. } | Error::Timeout { .. }),
                        "{e:?}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("no reconnect after the wire came back: {e:?}"),
            }
        };
        let data = Rng::new(77).bytes(4096);
        r.write_at(0, &data).unwrap();
        let d = TransferDesc::new(
            r.range(0..4096).unwrap(),
            again.remote(peer.addr, 4096).unwrap(),
        );
        again.transfer_sync(TransferOp::Write, &[d], T).unwrap();
        assert_eq!(peer.sum(0, 4096), fnv1a(&data));
        again.disconnect(T).unwrap();
    }
    drop(link);
    peer.quit();
    drop(ns);
}
