//! Fair serving: no request holds a worker beyond its share while other work waits, welcoming a
//! new link is taken before queued requests, and a half-closed lane whose reply is parked costs
//! no CPU (`docs/serving.md`, "What a serving engine costs per connection").

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hixl::TransferOp;
use hixl::wire::{self, WireBlocks};

use super::support::{
    Proof, Reply, connect, honest_client, honest_round, honest_rounds, open_link, port_of,
    send_queues, serial, spawn_peer, wait_for,
};

/// An XFER_BLOCKS READ of block `block` of region `region` (at offset 0), `count` times over:
/// a 4-byte index each, so a 0.25 MiB frame asks for 65,536 times the block.
fn repeated_block_read(region: u32, block: u64, count: usize) -> Vec<u8> {
    let b = WireBlocks {
        region,
        offset: 0,
        block,
        stride: block,
    };
    let idx = vec![0u32; count];
    let mut out = Vec::new();
    wire::encode_xfer_blocks(
        &mut out,
        TransferOp::Read,
        1,
        &b,
        hixl::BlockIndices::U32(&idx),
    );
    out
}

/// A raw client's new link to `name` (no same-host claim): its socket and its server's first
/// region (id, length).
fn raw_link(src: u8, name: &str, instance: u64) -> (TcpStream, u32, u64) {
    let mut s = connect(src, name).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let Reply::Welcome(w) = open_link(&mut s, instance, None, Proof::Honest) else {
        panic!("no WELCOME for a raw client");
    };
    let e = w.table[0];
    (s, e.id, e.len)
}

/// CPU seconds process `pid` has used (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // fields 14 and 15 of the file (utime, stime), counted from the state (field 3)
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Four lanes each asking, in one 0.25 MiB XFER_BLOCKS frame, for 65,536 copies of a 1 MiB
/// region, and reading the reply as fast as it comes (never parked: they keep pace), against a
/// server with two workers: an honest client still connects and reads, within a second each
/// time. (Before requests yielded their worker, and welcomes were queued behind them, the
/// honest client got in 0 of 6 times while the four ran.)
#[test]
fn block_requests_do_not_starve_handshakes() {
    let _one = serial();
    let peer = spawn_peer(&["--max-threads", "2"]);
    let (cli, mut buf) = honest_client(false);
    honest_round(&cli, &mut buf, &peer);
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    // four links first, then their requests at once
    let links: Vec<_> = (0..4u8)
        .map(|i| raw_link(30 + i, &peer.name, 50_000 + u64::from(i)))
        .collect();
    for (mut s, region, len) in links {
        s.write_all(&repeated_block_read(region, len, 1 << 16))
            .unwrap();
        let (stop, read) = (stop.clone(), read.clone());
        readers.push(std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 20];
            let mut got = 0u64;
            while !stop.load(Ordering::SeqCst) {
                match s.read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        got += n as u64;
                        read.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            let _ = s.shutdown(Shutdown::Both);
            got
        }));
    }
    // the four replies are streaming before the honest rounds start (256 MiB read)
    let streaming = wait_for(Duration::from_secs(30), || {
        read.load(Ordering::Relaxed) >= 256 << 20
    });
    assert!(streaming, "the block replies did not stream");
    let honest = honest_rounds(&cli, &mut buf, &peer, 6, Duration::ZERO);
    stop.store(true, Ordering::SeqCst);
    let moved: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    eprintln!(
        "4 lanes streaming 64 GiB block replies ({:.1} GiB read meanwhile), max_server_threads 2: \
         {}",
        moved as f64 / (1u64 << 30) as f64,
        honest.summary()
    );
    assert!(
        honest.ok(),
        "during the block requests: {}",
        honest.summary()
    );
}

/// Eight lanes whose 64 MiB READ replies are parked on a full socket, each half-closed by its
/// client (FIN) and never read: the server waits for them without spending CPU. (Before, the
/// half-close was asked for with the wait for output: level triggered, every re-arm fired at
/// once, the request found its socket still full and parked again, and the server spun on
/// both cores until the request's deadline.)
#[test]
fn half_closed_lanes_with_parked_replies_do_not_spin() {
    let _one = serial();
    let peer = spawn_peer(&[]);
    let pid = peer.child.id();
    let mut lanes = Vec::new();
    for i in 0..8u8 {
        let (mut s, region, len) = raw_link(40 + i, &peer.name, 60_000 + u64::from(i));
        s.write_all(&repeated_block_read(region, len, 64)).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        lanes.push(s);
    }
    // the replies fill the eight sockets and park; from then on the server has nothing to do
    let port = port_of(&peer.name);
    let full = wait_for(Duration::from_secs(30), || {
        send_queues(port).iter().filter(|&&q| q >= 1 << 20).count() >= 8
    });
    assert!(
        full,
        "the replies did not fill the sockets: {:?}",
        send_queues(port)
    );
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    while t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let used = cpu_seconds(pid) - c0;
    let share = used / t0.elapsed().as_secs_f64();
    eprintln!(
        "8 half-closed lanes with parked 64 MiB replies: the server used {used:.2} s of CPU in \
         {:.2} s ({:.0}% of one core)",
        t0.elapsed().as_secs_f64(),
        share * 100.0
    );
    assert!(
        share < 0.1,
        "the server spun on half-closed lanes: {:.0}% of a core",
        share * 100.0
    );
    // an honest client is still served
    let (cli, mut buf) = honest_client(false);
    honest_round(&cli, &mut buf, &peer);
    drop(lanes);
}
