//! Transfers between two processes: this test process connects to a `hixl-peer` child.

mod common;

use std::time::{Duration, Instant};

use common::{Peer, Rng, client, fnv1a};
use hixl::{Error, TransferDesc, TransferOp};

const T: Duration = Duration::from_secs(20);

/// WRITE random data at sub-ranges and in batches into another process, check it there (the
/// peer hashes its own memory), and READ the peer's seeded memory back.
#[test]
fn two_processes_random_data() {
    let size = 72 << 20;
    let mut peer = Peer::spawn("127.0.0.1", size, 11, "hostbuffer");
    assert_eq!(peer.len, size as u64);
    let expected = Rng::new(11).bytes(size);
    let (cli, mut buf) = client(size);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.remote_pid(), peer.child.id());

    // READ the peer's seeded memory: one 64 MiB descriptor, then 4096 small ones at odd offsets
    let d = TransferDesc::new(
        buf.range(1..(64 << 20) + 1).unwrap(),
        link.remote(peer.addr + 3, 64 << 20).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    let mut got = vec![0u8; 64 << 20];
    buf.read_at(1, &mut got).unwrap();
    assert!(
        got[..] == expected[3..3 + (64 << 20)],
        "64 MiB READ differs"
    );

    let mut rng = Rng::new(12);
    let spans: Vec<(u64, usize)> = (0..4096)
        .map(|i| (i * 17_000 + rng.below(1000), 1 + rng.below(15_000) as usize))
        .collect();
    let descs: Vec<_> = spans
        .iter()
        .enumerate()
        .map(|(i, &(r, len))| {
            TransferDesc::new(
                buf.range(i * 16_384..i * 16_384 + len).unwrap(),
                link.remote(peer.addr + r, len as u64).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Read, &descs, T).unwrap();
    drop(descs);
    let mut got = vec![0u8; 4096 * 16_384];
    buf.read_at(0, &mut got).unwrap();
    for (i, &(r, len)) in spans.iter().enumerate() {
        assert_eq!(
            &got[i * 16_384..i * 16_384 + len],
            &expected[r as usize..r as usize + len],
            "descriptor {i}"
        );
    }

    // WRITE: random data, one big block and a batch of 64, then the peer checks its memory
    let data = rng.bytes(size);
    buf.write_at(0, &data).unwrap();
    let big = 40 << 20;
    let d = TransferDesc::new(
        buf.range(0..big).unwrap(),
        link.remote(peer.addr + 5, big as u64).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    assert_eq!(peer.sum(5, big as u64), fnv1a(&data[..big]));
    let descs: Vec<_> = (0..64)
        .map(|i| {
            let (l, r, len) = (big + i * 4097, (48 << 20) + i * 5000 + 7, 4097);
            TransferDesc::new(
                buf.range(l..l + len).unwrap(),
                link.remote(peer.addr + r as u64, len as u64).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
    drop(descs);
    for i in [0usize, 31, 63] {
        let (l, r) = (big + i * 4097, (48 << 20) + i * 5000 + 7);
        assert_eq!(
            peer.sum(r as u64, 4097),
            fnv1a(&data[l..l + 4097]),
            "descriptor {i}"
        );
    }
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
    let outcome = std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let d = TransferDesc::new(
                buf.range(..).unwrap(),
                link.remote(peer.addr, size as u64).unwrap(),
            );
            let mut rounds = 0u32;
            loop {
                let op = if rounds.is_multiple_of(2) {
                    TransferOp::Write
                } else {
                    TransferOp::Read
                };
                let t0 = Instant::now();
                match link.transfer_sync(op, &[d], timeout) {
                    Ok(()) => rounds += 1,
                    Err(e) => return (rounds, e, t0.elapsed()),
                }
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        child.kill().unwrap();
        worker.join().unwrap()
    });
    let (rounds, err, took) = outcome;
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
    let mut peer = Peer::spawn(&name, 4096, 99, "hostbuffer");
    assert_eq!(peer.name, name);
    let link = cli.connect(&name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], timeout).unwrap();
    drop(link);
    let mut b = buf;
    let mut got = vec![0u8; 4096];
    b.read_at(0, &mut got).unwrap();
    assert_eq!(got, Rng::new(99).bytes(4096));
    assert_eq!(peer.sum(0, 4096), fnv1a(&got));
    peer.quit();
}
