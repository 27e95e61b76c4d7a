//! The serving budget, as the docs state it (docs/serving.md, "What a serving engine costs per
//! connection"): requests are served by at most `max_server_threads` worker threads besides the
//! one poller, however many lanes are busy; same-host fences are at most a quarter of
//! `max_server_conns`, each taken only after the same-host proof and given back when its link
//! goes; and the process's soft descriptor limit covers every descriptor the server may hold.
//! Measured on a `hixl-peer serve` child (its own process). The tests run one at a time.

#[allow(dead_code)]
#[path = "attack/support.rs"]
mod attack_support;
mod common;
#[allow(dead_code)]
#[path = "limits/support.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use attack_support::{Proof, Reply, Stop, connect, open_link};
use common::Rng;
use hixl::wire::HostId;
use hixl::{Options, TransferDesc, TransferOp};
use support::{back_to_baseline, honest_client, honest_round, serial, spawn_peer, usage, wait_for};

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
    let (most, polls) = (AtomicUsize::new(0), AtomicUsize::new(usize::MAX));
    let batches = std::thread::scope(|sc| {
        let stopper = Stop(&stop);
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(named(pid, "hixl-worker"), Ordering::Relaxed);
                polls.fetch_min(named(pid, "hixl-serve"), Ordering::Relaxed);
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
    let (most, polls) = (most.load(Ordering::Relaxed), polls.load(Ordering::Relaxed));
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
