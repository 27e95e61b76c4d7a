//! The serving budget, as the docs state it (docs/serving.md, "What a serving engine costs per
//! connection"): requests are served by at most `max_server_threads` worker threads besides the
//! one poller, however many lanes are busy; same-host fences are at most a quarter of
//! `max_server_conns`, each taken only after the same-host proof and given back when its link
//! goes; and the process's soft descriptor limit covers every descriptor the server may hold.
//! Measured on a `hixl-peer serve` child (its own process). The tests run one at a time.

use crate::{common, support};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::Rng;
use hixl::wire::HostId;
use hixl::{Options, TransferDesc, TransferOp};
use support::{Proof, Reply, Stop, connect, honest_rounds, open_link};
use support::{
    back_to_baseline, hello, honest_client, honest_round, serial, spawn_peer, usage, wait_for,
};

/// The threads of process `pid` named `name`.
fn named(pid: u32, name: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end() == name)
        .count()
}

/// Eight clients, each on its own link, WRITE and READ back 64 KiB batches as fast as they can
/// against a server with `max_server_threads` 3: every batch's bytes come back, and the server
/// never runs more than 3 worker threads (sampled every millisecond) besides its one poller.
#[test]
fn serving_threads_never_exceed_max_server_threads() {
    let _one = serial();
    let peer = spawn_peer(&["--max-threads", "3"]);
    let pid = peer.child.id();
    let stop = AtomicBool::new(false);
    let most = AtomicUsize::new(0);
    let batches = std::thread::scope(|sc| {
        let stopper = Stop(&stop);
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(named(pid, "hixl-worker"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let clients: Vec<_> = (0..8u64)
            .map(|c| {
                let name = peer.name.clone();
                sc.spawn(move || {
                    let opts = Options::default().same_host(hixl::SameHost::Forbid);
                    let (cli, mut buf) = common::client_with(128 << 10, opts);
                    let link = cli.connect(&name).unwrap();
                    let mut n = 0;
                    for round in 0..40u64 {
                        let data = Rng::new(c * 1000 + round).bytes(64 << 10);
                        buf.write_at(0, &data).unwrap();
                        let at = c as usize * (64 << 10) % (1 << 20);
                        let remote =
                            |off: usize| link.remote(peer_addr(&link) + (at + off) as u64, 4096);
                        let descs = |local: usize| -> Vec<TransferDesc> {
                            (0..16)
                                .map(|i| {
                                    TransferDesc::new(
                                        buf.range(local + i * 4096..local + (i + 1) * 4096)
                                            .unwrap(),
                                        remote(i * 4096).unwrap(),
                                    )
                                })
                                .collect()
                        };
                        let t = Duration::from_secs(10);
                        link.transfer_sync(TransferOp::Write, &descs(0), t).unwrap();
                        link.transfer_sync(TransferOp::Read, &descs(64 << 10), t)
                            .unwrap();
                        let mut back = vec![0u8; 64 << 10];
                        buf.read_at(64 << 10, &mut back).unwrap();
                        assert_eq!(back, data, "client {c}, round {round}");
                        n += 1;
                    }
                    link.disconnect(Duration::from_secs(5)).unwrap();
                    n
                })
            })
            .collect();
        let n: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
        drop(stopper);
        n
    });
    // the poller, counted once no thread is being started (a thread the poller starts is
    // named after it until it names itself `hixl-worker`)
    let polls = named(pid, "hixl-serve");
    let most = most.load(Ordering::Relaxed);
    eprintln!("{batches} batch pairs from 8 links: at most {most} worker threads, {polls} poller");
    assert_eq!(batches, 8 * 40);
    assert!(most <= 3, "{most} worker threads with max_server_threads 3");
    assert!(
        most >= 1,
        "no worker thread seen: the sampling measured nothing"
    );
    assert_eq!(polls, 1, "one poller thread");
    peer.quit();
}

/// The address of the peer's region (its first, as the WELCOME listed it).
fn peer_addr(link: &hixl::Link<'_>) -> u64 {
    link.regions().next().expect("the peer's region").addr()
}

/// A server with `max_server_conns` 16 gives at most 4 same-host links a fence at once: of 12
/// links opened honestly (the same-host proof answered) and kept open, 4 get one and 8 are served
/// over TCP; its descriptors stay within one per connection plus two per fence; a fence closed
/// without BYE gives its place back at once (a new link gets one); the soft descriptor limit
/// covers 16 + 64 connections, 2 × 4 fence descriptors and the process's 256.
#[test]
fn fences_stay_within_the_descriptor_budget() {
    let _one = serial();
    let peer = spawn_peer(&["--max-conns", "16", "--io-timeout-ms", "30000"]);
    let pid = peer.child.id();
    let (cli, mut buf) = honest_client(false);
    honest_round(&cli, &mut buf, &peer);
    let base = usage(pid);
    let me = HostId::current().expect("/proc tells this process's identity");
    let mut links = Vec::new();
    for i in 0..12u64 {
        let mut s = connect(20 + i as u8, &peer.name).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        match open_link(&mut s, 5000 + i, Some(me), Proof::Honest) {
            Reply::Welcome(w) => links.push((s, w.fence >= 0)),
            r => panic!("link {i}: {r:?}"),
        }
    }
    let fenced = links.iter().filter(|(_, f)| *f).count();
    let u = usage(pid);
    eprintln!(
        "12 same-host links: {fenced} with a fence; {} descriptors more than before",
        u.fds - base.fds
    );
    if common::same_host_available() {
        assert_eq!(
            fenced, 4,
            "fences beyond the budget of max_server_conns / 4"
        );
    } else {
        assert!(fenced <= 4);
    }
    assert!(
        u.fds <= base.fds + 12 + 2 * fenced + 2,
        "{} descriptors for 12 links and {fenced} fences",
        u.fds - base.fds
    );
    if fenced > 0 {
        // a fenced link closed without BYE gives its place back at once
        let at = links.iter().position(|(_, f)| *f).unwrap();
        drop(links.remove(at));
        let mut again = None;
        let got = wait_for(Duration::from_secs(2), || {
            let mut s = connect(40, &peer.name).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            match open_link(&mut s, 6000, Some(me), Proof::Honest) {
                Reply::Welcome(w) if w.fence >= 0 => {
                    again = Some(s);
                    true
                }
                _ => false,
            }
        });
        assert!(got, "the fence of a closed link was not given back");
        drop(again);
    }
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .expect("the soft limit on open files");
    let hard: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(
        soft >= (16 + 64 + 2 * 4 + 4 + 256).min(hard),
        "soft limit {soft} below the budget"
    );
    drop(links);
    honest_round(&cli, &mut buf, &peer);
    back_to_baseline(pid, base, "after the same-host links");
    drop(cli);
    peer.quit();
}

/// Peers that stall hold no serving thread: with `max_server_threads` 2 and a 3 s I/O timeout, 8
/// lanes that send a READ of 8 × 1 MiB and never read it, and 8 that announce a 1 MiB WRITE and
/// trickle its payload a byte every 20 ms, are parked by the server; meanwhile an honest client
/// is served 10 times out of 10, each within 1 s (were the stalled requests to keep their
/// threads, it would wait for their deadline).
#[test]
fn stalled_peers_hold_no_serving_thread() {
    use std::io::Write;
    let _one = serial();
    let peer = common::Peer::spawn_in(
        &[],
        "127.0.0.1",
        8 << 20,
        1,
        "hostbuffer",
        &["--io-timeout-ms", "3000", "--max-threads", "2"],
    );
    let (cli, mut buf) = honest_client(false);
    honest_round(&cli, &mut buf, &peer);
    let mut region = 0;
    let mut lanes: Vec<std::net::TcpStream> = (0..16u64)
        .map(|i| {
            let mut s = connect(10 + i as u8, &peer.name).unwrap();
            region = hello(&mut s, 40_000 + i).table[0].id;
            s
        })
        .collect();
    // the WRITEs go to the region's second half: the honest client READs its first bytes
    let xfer = |op, n: u32, first: u32| {
        let mut req = Vec::new();
        hixl::wire::encode_xfer(
            &mut req,
            op,
            1,
            (0..n).map(|i| hixl::wire::WireDesc {
                region,
                offset: u64::from(first + i) << 20,
                len: 1 << 20,
            }),
        );
        req
    };
    let (read, write) = (xfer(TransferOp::Read, 8, 0), xfer(TransferOp::Write, 1, 4));
    for s in &mut lanes[..8] {
        s.write_all(&read).unwrap();
    }
    for s in &mut lanes[8..] {
        s.write_all(&write).unwrap();
    }
    let stop = AtomicBool::new(false);
    let honest = std::thread::scope(|sc| {
        let stopper = Stop(&stop);
        let trickling = &mut lanes[8..];
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for s in trickling.iter_mut() {
                    let _ = s.write_all(&[0x5A]);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let honest = honest_rounds(&cli, &mut buf, &peer, 10, Duration::from_millis(100));
        drop(stopper);
        honest
    });
    eprintln!("16 stalled lanes, 2 serving threads: {}", honest.summary());
    assert_eq!(honest.fast(), 10, "{}", honest.summary());
    peer.quit();
}

/// CPU time (user + system) of process `pid` so far, from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the state field
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Workers of process `pid` on a CPU or ready for one (state `R`).
fn running_workers(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| {
            let p = t.ok()?.path();
            let comm = std::fs::read_to_string(p.join("comm")).ok()?;
            let stat = std::fs::read_to_string(p.join("stat")).ok()?;
            let state = stat[stat.rfind(')')? + 2..].chars().next()?;
            (comm.trim_end() == "hixl-worker" && state == 'R').then_some(())
        })
        .count()
}

/// Peers that move nothing are parked, not served: 100 lanes from one address each queue 8
/// READs of 1 MiB and never read a byte (I/O timeout 3 s). The burst of requests may start many
/// workers (up to `max_server_threads`), but once the sockets are full the server does nothing
/// for those peers: over the second after the first 300 ms it uses at most 100 ms of CPU and at
/// most 2 of its workers are ever seen running (sampled every 5 ms), while an honest client is
/// served. (The workers the burst started are idle then, and leave after the executor's idle
/// period, 2 s.)
#[test]
fn peers_that_move_nothing_take_no_worker() {
    use std::io::Write;
    let _one = serial();
    let peer = common::Peer::spawn_in(
        &[],
        "127.0.0.1",
        8 << 20,
        1,
        "hostbuffer",
        &["--io-timeout-ms", "3000"],
    );
    let pid = peer.child.id();
    let (cli, mut buf) = honest_client(false);
    honest_round(&cli, &mut buf, &peer);
    let mut region = 0;
    let mut lanes: Vec<std::net::TcpStream> = (0..100u64)
        .map(|i| {
            let mut s = connect(10, &peer.name).unwrap();
            region = hello(&mut s, 50_000 + i).table[0].id;
            s
        })
        .collect();
    let mut reads = Vec::new();
    for i in 0..8u32 {
        hixl::wire::encode_xfer(
            &mut reads,
            TransferOp::Read,
            u64::from(i) + 1,
            std::iter::once(hixl::wire::WireDesc {
                region,
                offset: u64::from(i) << 20,
                len: 1 << 20,
            }),
        );
    }
    for s in &mut lanes {
        s.write_all(&reads).unwrap();
    }
    let sent = std::time::Instant::now();
    // the sockets fill (a few MiB each) within the first moments; then nothing moves
    let mut burst = 0;
    while sent.elapsed() < Duration::from_millis(300) {
        burst = burst.max(named(pid, "hixl-worker"));
        std::thread::yield_now();
    }
    let (cpu0, t0) = (cpu_time(pid), std::time::Instant::now());
    let mut most = 0;
    while t0.elapsed() < Duration::from_secs(1) {
        most = most.max(running_workers(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
    let used = cpu_time(pid).saturating_sub(cpu0);

    let said = format!(
        "100 lanes x 8 READs of 1 MiB never read: {burst} workers for the burst of requests; from \
         {:?} on the server used {used:?} of CPU in {:?}, at most {most} workers running at once",
        t0 - sent,
        t0.elapsed()
    );
    let honest = honest_rounds(&cli, &mut buf, &peer, 10, Duration::ZERO);
    eprintln!("{said}; {}", honest.summary());
    assert!(used <= Duration::from_millis(100), "{said}");
    assert!(most <= 2, "{said}");
    assert!(honest.ok(), "{}", honest.summary());
    drop(lanes);
    peer.quit();
}
