//! The runtime-checked engine in HIXL's shape (`hixl::compat`), across two processes: data
//! moved at odd offsets and verified, every runtime check with its status, AutoConnect across a
//! peer restart, poll-many semantics, finalize twice.

use crate::common;

use common::compat::{NO_OPTIONS, client, desc, register, status, wait};
use common::{Peer, Rng, fnv1a};
use hixl::compat::{
    self, FeatureType, GetTransferStatusArgs, Hixl, MemDesc, NotifyDesc, TransferArgs,
    TransferOpDesc, TransferStatus,
};
use hixl::{AsyncConnectStatus, MemType, Status, TransferOp};
use std::time::{Duration, Instant};

#[test]
fn write_then_read_at_odd_offsets_across_processes() {
    let mut peer = Peer::spawn_compat("127.0.0.1:0", 1 << 20, 11, &[]);
    let mut mem = vec![0u8; 1 << 20];
    let (e, _h) = client(&[], &mut mem);
    e.connect(&peer.name, 1000).unwrap();
    // three odd-sized pieces at odd offsets, one batch
    let data = Rng::new(5).bytes(70_001);
    mem[..data.len()].copy_from_slice(&data);
    let pieces = [
        (0usize, 13u64, 1usize),
        (1, 4097, 65_537),
        (65_538, 999_001, 4463),
    ];
    let descs: Vec<_> = pieces
        .iter()
        .map(|&(lo, ro, len)| desc(&mem, lo, peer.addr, ro, len))
        .collect();
    e.transfer_sync(&peer.name, TransferOp::Write, &descs, 1000)
        .unwrap();
    for &(lo, ro, len) in &pieces {
        assert_eq!(peer.sum(ro, len as u64), fnv1a(&data[lo..lo + len]), "{ro}");
    }
    // READ the same pieces back into another part of the buffer, and a seeded piece of the
    // peer's untouched memory
    let back = 200_001usize;
    let descs: Vec<_> = pieces
        .iter()
        .map(|&(lo, ro, len)| desc(&mem, back + lo, peer.addr, ro, len))
        .chain([desc(&mem, 500_003, peer.addr, 300_007, 777)])
        .collect();
    e.transfer_sync(&peer.name, TransferOp::Read, &descs, 1000)
        .unwrap();
    for &(lo, _, len) in &pieces {
        assert_eq!(&mem[back + lo..back + lo + len], &data[lo..lo + len]);
    }
    let seeded = Rng::new(11).bytes(1 << 20);
    assert_eq!(&mem[500_003..500_780], &seeded[300_007..300_784]);
    // async, then a notification that lands after it
    let fresh = Rng::new(6).bytes(3001);
    mem[700_001..703_002].copy_from_slice(&fresh);
    let req = e
        .transfer_async(
            &peer.name,
            TransferOp::Write,
            &[desc(&mem, 700_001, peer.addr, 50_001, 3001)],
            TransferArgs { user_data: 42 },
        )
        .unwrap();
    assert_ne!(req, 0);
    let n = NotifyDesc {
        name: "kv".into(),
        notify_msg: "ready".into(),
    };
    e.send_notify(&peer.name, &n, 1000).unwrap();
    assert_eq!(wait(&e, req), TransferStatus::Completed);
    assert_eq!(peer.sum(50_001, 3001), fnv1a(&fresh));
    assert_eq!(peer.notifies(), vec![("kv".to_owned(), "ready".to_owned())]);
    // reported once: the id is forgotten (HIXL: PARAM_INVALID, "request not found")
    assert_eq!(status(e.get_transfer_status(req)), Status::PARAM_INVALID);
    e.disconnect(&peer.name, 1000).unwrap();
    e.finalize();
    e.finalize();
    peer.quit();
}

#[test]
fn every_runtime_check_has_hixl_status() {
    let mut peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 3, &[]);
    let mut mem = vec![0u8; 1 << 16];
    let mut other = vec![0u8; 4096];
    let e = Hixl::new();
    // before initialize
    assert_eq!(status(e.connect(&peer.name, 1000)), Status::FAILED);
    assert_eq!(status(register(&e, &mut mem)), Status::FAILED);
    assert_eq!(status(e.get_notifies()), Status::FAILED);
    // bad options and names
    assert_eq!(
        status(e.initialize("127.0.0.1", [("NoSuchKey", "1")])),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(e.initialize("localhost", NO_OPTIONS)),
        Status::PARAM_INVALID
    );
    e.initialize("127.0.0.1", NO_OPTIONS).unwrap();
    assert_eq!(
        status(e.initialize("127.0.0.1", NO_OPTIONS)),
        Status::FAILED
    );
    let h = register(&e, &mut mem).unwrap();
    assert_ne!(h, 0);
    // overlapping and repeated registrations, zero length, device memory without Ascend
    assert_eq!(status(register(&e, &mut mem[8..16])), Status::PARAM_INVALID);
    assert_eq!(status(register(&e, &mut mem)), Status::PARAM_INVALID);
    assert_eq!(status(register(&e, &mut other[..0])), Status::PARAM_INVALID);
    let dev = MemDesc {
        addr: other.as_ptr() as usize,
        len: other.len(),
        local_only: false,
    };
    // SAFETY: refused before anything is registered.
    let r = unsafe { e.register_mem(dev, MemType::Device) };
    // (no CANN on the loader path here: the test machines have none)
    let err = r.expect_err("device memory without CANN");
    assert_eq!(err.status(), Status::UNSUPPORTED);
    assert!(
        err.to_string().contains("CANN's ACL runtime and HCCL"),
        "{err}"
    );
    // an unknown handle: SUCCESS with no effect (HIXL); the null handle: PARAM_INVALID
    e.deregister_mem(h + 1000).unwrap();
    assert_eq!(status(e.deregister_mem(0)), Status::PARAM_INVALID);
    // a transfer to a remote never connected (no AutoConnect)
    let d = [desc(&mem, 0, peer.addr, 0, 64)];
    assert_eq!(
        status(e.transfer_sync(&peer.name, TransferOp::Write, &d, 1000)),
        Status::NOT_CONNECTED
    );
    assert_eq!(
        status(e.send_notify(&peer.name, &NotifyDesc::default(), 1000)),
        Status::NOT_CONNECTED
    );
    assert_eq!(
        status(e.disconnect(&peer.name, 1000)),
        Status::NOT_CONNECTED
    );
    // timeouts and names
    assert_eq!(status(e.connect(&peer.name, 0)), Status::PARAM_INVALID);
    assert_eq!(status(e.connect(&peer.name, -5)), Status::PARAM_INVALID);
    assert_eq!(status(e.connect("127.0.0.1", 1000)), Status::PARAM_INVALID);
    assert_eq!(status(e.connect("not a name", 1000)), Status::PARAM_INVALID);
    // a name nobody listens on (a port just released): the connect fails, nothing is held
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    assert_eq!(status(e.connect(&gone, 1000)), Status::FAILED);
    assert_eq!(
        e.get_async_connect_status(&gone).unwrap(),
        AsyncConnectStatus::NotConnect
    );
    e.connect(&peer.name, 1000).unwrap();
    assert_eq!(
        status(e.connect(&peer.name, 1000)),
        Status::ALREADY_CONNECTED
    );
    assert_eq!(
        e.get_async_connect_status(&peer.name).unwrap(),
        AsyncConnectStatus::Connected
    );
    // registration while a link exists (HIXL's lifecycle): usable by this engine at once (a
    // READ, so the peer keeps its seeded bytes for the checks below)
    let h_other = register(&e, &mut other).unwrap();
    e.transfer_sync(
        &peer.name,
        TransferOp::Read,
        &[desc(&other, 0, peer.addr, 60_000, 4096)],
        1000,
    )
    .unwrap();
    assert_eq!(other[..4096], Rng::new(3).bytes(1 << 16)[60_000..64_096]);
    // and deregistered while linked: local ranges in it are refused from then on
    e.deregister_mem(h_other).unwrap();
    assert_eq!(
        status(e.transfer_sync(
            &peer.name,
            TransferOp::Write,
            &[desc(&other, 0, peer.addr, 0, 8)],
            1000
        )),
        Status::PARAM_INVALID
    );
    // local ranges: unregistered, partly outside, zero length; remote ranges outside the table
    let w = |d: TransferOpDesc| e.transfer_sync(&peer.name, TransferOp::Write, &[d], 1000);
    assert_eq!(
        status(w(desc(&other, 0, peer.addr, 0, 8))),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(w(desc(&mem, (1 << 16) - 4, peer.addr, 0, 8))),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(w(desc(&mem, 0, peer.addr, 0, 0))),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(w(desc(&mem, 0, peer.addr, (1 << 16) - 4, 8))),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(w(desc(&mem, 0, peer.addr + (1 << 20), 0, 8))),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(w(TransferOpDesc {
            local_addr: usize::MAX - 2,
            remote_addr: peer.addr as usize,
            len: 8
        })),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(e.transfer_sync(&peer.name, TransferOp::Write, &[], 1000)),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(e.transfer_async(&peer.name, TransferOp::Read, &[], TransferArgs::default())),
        Status::PARAM_INVALID
    );
    // nothing moved by the refused calls: the peer still holds its seeded bytes
    assert_eq!(peer.sum(0, 1 << 16), fnv1a(&Rng::new(3).bytes(1 << 16)));
    let long = NotifyDesc {
        name: "x".repeat(2000),
        notify_msg: String::new(),
    };
    assert_eq!(
        status(e.send_notify(&peer.name, &long, 1000)),
        Status::PARAM_INVALID
    );
    // unknown request ids: the null one FAILED, any other PARAM_INVALID (HIXL's)
    assert_eq!(status(e.get_transfer_status(0)), Status::FAILED);
    assert_eq!(
        status(e.get_transfer_status(u64::MAX)),
        Status::PARAM_INVALID
    );
    // capabilities
    assert_eq!(
        compat::get_capability(FeatureType::AutoConnect),
        compat::FEATURE_SUPPORTED
    );
    assert_eq!(
        compat::get_capability(FeatureType::ClientServerComm),
        compat::FEATURE_NOT_SUPPORTED
    );
    assert_eq!(FeatureType::from_i32(7), None);
    assert_eq!(
        compat::capability_of(7).unwrap(),
        compat::FEATURE_NOT_SUPPORTED
    );
    assert_eq!(compat::capability_of(0).unwrap(), compat::FEATURE_SUPPORTED);
    assert_eq!(status(compat::capability_of(-1)), Status::PARAM_INVALID);
    // after disconnect the region table may change again
    e.disconnect(&peer.name, 1000).unwrap();
    let h2 = register(&e, &mut other).unwrap();
    e.deregister_mem(h2).unwrap();
    e.deregister_mem(h2).unwrap(); // already deregistered: SUCCESS, no effect (HIXL)
    e.deregister_mem(h).unwrap();
    e.finalize();
    e.finalize();
    // finalized: everything is FAILED, and it cannot be initialized again
    assert_eq!(status(e.connect(&peer.name, 1000)), Status::FAILED);
    assert_eq!(
        status(e.initialize("127.0.0.1", NO_OPTIONS)),
        Status::FAILED
    );
    peer.quit();
}

/// A descriptor with a null local or remote address is `PARAM_INVALID` before the link is
/// looked up or made, in HIXL's order (`CheckTransferOpDescs` first): not `NOT_CONNECTED`
/// without a link, and with AutoConnect no connect is tried first.
#[test]
fn a_null_address_is_refused_before_the_link() {
    let mut mem = vec![0u8; 4096];
    // nothing listens on port 1: a link there would be NOT_CONNECTED
    let nobody = "127.0.0.1:1";
    for auto in ["0", "1"] {
        let e = Hixl::new();
        e.initialize("127.0.0.1", [("AutoConnect", auto)]).unwrap();
        register(&e, &mut mem).unwrap();
        let local = mem.as_ptr() as usize;
        let op_desc = |local_addr, remote_addr| TransferOpDesc {
            local_addr,
            remote_addr,
            len: 64,
        };
        let (null_local, null_remote) = (op_desc(0, 0x1000), op_desc(local, 0));
        for d in [null_local, null_remote] {
            for op in [TransferOp::Read, TransferOp::Write] {
                let sync = e.transfer_sync(nobody, op, &[d], 1000);
                assert_eq!(status(sync), Status::PARAM_INVALID, "{auto} {op:?} {d:?}");
                let started = e.transfer_async(nobody, op, &[d], TransferArgs::default());
                assert_eq!(
                    status(started),
                    Status::PARAM_INVALID,
                    "{auto} {op:?} {d:?}"
                );
            }
        }
        // the same call without a null: the link's failure
        let fine = op_desc(local, 0x1000);
        let sync = e.transfer_sync(nobody, TransferOp::Read, &[fine], 1000);
        assert_ne!(status(sync), Status::PARAM_INVALID);
        e.finalize();
    }
}

#[test]
fn auto_connect_connects_on_demand_and_after_a_restart() {
    let mut peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 21, &[]);
    let name = peer.name.clone();
    let mut mem = vec![0u8; 1 << 16];
    let opts = [("AutoConnect", "1"), ("hixl.SameHost", "off")];
    let (e, _) = client(&opts, &mut mem);
    let data = Rng::new(22).bytes(5000);
    mem[..5000].copy_from_slice(&data);
    // no connect: the transfer connects
    e.transfer_sync(
        &name,
        TransferOp::Write,
        &[desc(&mem, 0, peer.addr, 7, 5000)],
        1000,
    )
    .unwrap();
    assert_eq!(peer.sum(7, 5000), fnv1a(&data));
    assert_eq!(
        e.get_async_connect_status(&name).unwrap(),
        AsyncConnectStatus::Connected
    );
    // the peer dies: the next call fails, and drops the link
    peer.signal(libc::SIGKILL);
    peer.child.wait().unwrap();
    let addr = peer.addr;
    let r = e.transfer_sync(
        &name,
        TransferOp::Write,
        &[desc(&mem, 0, addr, 7, 5000)],
        1000,
    );
    let st = status(r);
    assert!(
        [Status::NOT_CONNECTED, Status::FAILED, Status::TIMEOUT].contains(&st),
        "{st:?}"
    );
    // restarted under the same name: the next call reconnects (new table, new addresses)
    let mut peer = Peer::spawn_compat(&name, 1 << 16, 23, &[]);
    assert_eq!(peer.name, name);
    e.transfer_sync(
        &name,
        TransferOp::Write,
        &[desc(&mem, 0, peer.addr, 9, 5000)],
        1000,
    )
    .unwrap();
    assert_eq!(peer.sum(9, 5000), fnv1a(&data));
    let n = NotifyDesc {
        name: "after".into(),
        notify_msg: "restart".into(),
    };
    e.send_notify(&name, &n, 1000).unwrap();
    assert_eq!(peer.notifies(), vec![("after".into(), "restart".into())]);
    e.finalize();
    peer.quit();
}

#[test]
fn poll_many_respects_max_query_count_and_skip_waiting() {
    let mut peer = Peer::spawn_compat("127.0.0.1:0", 64 << 20, 31, &[]);
    let mut mem = vec![0u8; 64 << 20];
    // TCP only: a stopped peer then really holds a large transfer up
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    e.connect(&peer.name, 1000).unwrap();
    let small: Vec<u64> = (0..3u64)
        .map(|i| {
            let d = [desc(&mem, 4096 * i as usize, peer.addr, 4096 * i, 4096)];
            e.transfer_async(
                &peer.name,
                TransferOp::Read,
                &d,
                TransferArgs { user_data: 100 + i },
            )
            .unwrap()
        })
        .collect();
    // waited for through the many-request form only
    let until = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while seen.len() < 3 && Instant::now() < until {
        let got = e
            .get_transfer_statuses(GetTransferStatusArgs {
                max_query_count: 1,
                skip_waiting: true,
            })
            .unwrap();
        assert!(got.len() <= 1, "{got:?}");
        for r in got {
            assert_eq!(r.status, TransferStatus::Completed);
            seen.push((r.req, r.user_data));
        }
        std::thread::yield_now();
    }
    seen.sort();
    assert_eq!(
        seen,
        small
            .iter()
            .zip(100..)
            .map(|(&r, u)| (r, u))
            .collect::<Vec<_>>()
    );
    // reported: forgotten
    for &r in &small {
        assert_eq!(status(e.get_transfer_status(r)), Status::PARAM_INVALID);
    }
    assert_eq!(e.pending_transfers(), 0);
    // a large WRITE to a stopped peer stays waiting: skip_waiting leaves it out, the default
    // reports it (and keeps it)
    peer.signal(libc::SIGSTOP);
    let big = e
        .transfer_async(
            &peer.name,
            TransferOp::Write,
            &[desc(&mem, 0, peer.addr, 0, 64 << 20)],
            TransferArgs { user_data: 7 },
        )
        .unwrap();
    let skipped = e
        .get_transfer_statuses(GetTransferStatusArgs {
            max_query_count: u32::MAX,
            skip_waiting: true,
        })
        .unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let all = e
        .get_transfer_statuses(GetTransferStatusArgs::default())
        .unwrap();
    assert_eq!(
        all,
        vec![compat::TransferResult {
            req: big,
            user_data: 7,
            status: TransferStatus::Waiting
        }]
    );
    assert_eq!(
        e.get_transfer_statuses(GetTransferStatusArgs {
            max_query_count: 0,
            skip_waiting: false
        })
        .unwrap(),
        vec![]
    );
    peer.signal(libc::SIGCONT);
    assert_eq!(wait(&e, big), TransferStatus::Completed);
    assert_eq!(peer.sum(0, 64 << 20), fnv1a(&mem));
    e.finalize();
    e.finalize();
    peer.quit();
}

#[test]
fn async_connect_then_transfer() {
    let peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 41, &[]);
    let mut mem = vec![0u8; 1 << 16];
    let (e, _) = client(&[], &mut mem);
    e.connect_async(&peer.name, 1000).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let st = loop {
        let st = e.get_async_connect_status(&peer.name).unwrap();
        if !matches!(
            st,
            AsyncConnectStatus::ConnectPending | AsyncConnectStatus::Connecting
        ) || Instant::now() > until
        {
            break st;
        }
        std::thread::yield_now();
    };
    assert_eq!(st, AsyncConnectStatus::Connected);
    assert_eq!(
        e.get_all_async_connect_status().unwrap().get(&peer.name),
        Some(&AsyncConnectStatus::Connected)
    );
    e.transfer_sync(
        &peer.name,
        TransferOp::Read,
        &[desc(&mem, 1, peer.addr, 3, 1000)],
        1000,
    )
    .unwrap();
    assert_eq!(&mem[1..1001], &Rng::new(41).bytes(1003)[3..]);
    e.disconnect_async(&peer.name, 1000).unwrap();
    assert_eq!(
        e.get_async_connect_status(&peer.name).unwrap(),
        AsyncConnectStatus::NotConnect
    );
    assert_eq!(
        status(e.transfer_sync(
            &peer.name,
            TransferOp::Read,
            &[desc(&mem, 1, peer.addr, 3, 1000)],
            1000
        )),
        Status::NOT_CONNECTED
    );
    e.finalize();
    peer.quit();
}

/// A link that broke (its peer restarted on the same address) gives way to the link an async
/// connect made since: the transfers after it reach the new process (before, every transfer
/// still ran on the broken link, `NOT_CONNECTED`, until a disconnect).
#[test]
fn an_async_connect_after_a_peer_restarted_replaces_the_broken_link() {
    let peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 61, &[]);
    let port = peer.name.rsplit(':').next().unwrap().to_owned();
    let mut mem = vec![0u8; 1 << 16];
    let (e, _) = client(&[], &mut mem);
    e.connect(&peer.name, 5000).unwrap();
    let read = |e: &compat::Hixl, mem: &[u8], name: &str, addr: u64| {
        e.transfer_sync(name, TransferOp::Read, &[desc(mem, 0, addr, 0, 4096)], 5000)
    };
    read(&e, &mem, &peer.name, peer.addr).unwrap();
    assert_eq!(&mem[..4096], &Rng::new(61).bytes(4096)[..]);
    let (name, old) = (peer.name.clone(), peer.addr);
    peer.quit();
    let peer = Peer::spawn_compat(&format!("127.0.0.1:{port}"), 1 << 16, 62, &[]);
    assert_eq!(peer.name, name);
    // the old link (its table the old process's) is found broken
    assert_eq!(status(read(&e, &mem, &name, old)), Status::NOT_CONNECTED);
    e.connect_async(&name, 5000).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while matches!(
        e.get_async_connect_status(&name).unwrap(),
        AsyncConnectStatus::ConnectPending | AsyncConnectStatus::Connecting
    ) && Instant::now() < until
    {
        std::thread::yield_now();
    }
    assert_eq!(
        e.get_async_connect_status(&name).unwrap(),
        AsyncConnectStatus::Connected
    );
    read(&e, &mem, &name, peer.addr).unwrap();
    assert_eq!(&mem[..4096], &Rng::new(62).bytes(4096)[..]);
    e.finalize();
    peer.quit();
}

/// An async connect to a peer whose link still waits in its slot (connected, no transfer yet)
/// checks that link first: after the peer restarted on its address, the connect makes a new
/// link and the next transfer reaches the new process (before, it reported the dead link as
/// `Connected` and the transfer failed, `NOT_CONNECTED`). Over the same-host path (the peer's
/// process checked) and over TCP (a PING).
#[test]
fn an_async_connect_checks_the_link_its_slot_holds() {
    for opts in [&[][..], &[("hixl.SameHost", "off")][..]] {
        let peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 63, &[]);
        let port = peer.name.rsplit(':').next().unwrap().to_owned();
        let mut mem = vec![0u8; 1 << 16];
        let (e, _) = client(opts, &mut mem);
        let connected = |e: &compat::Hixl, name: &str| {
            e.connect_async(name, 5000).unwrap();
            let until = Instant::now() + Duration::from_secs(30);
            while matches!(
                e.get_async_connect_status(name).unwrap(),
                AsyncConnectStatus::ConnectPending | AsyncConnectStatus::Connecting
            ) && Instant::now() < until
            {
                std::thread::yield_now();
            }
            e.get_async_connect_status(name).unwrap()
        };
        assert_eq!(connected(&e, &peer.name), AsyncConnectStatus::Connected);
        let name = peer.name.clone();
        peer.quit();
        let peer = Peer::spawn_compat(&format!("127.0.0.1:{port}"), 1 << 16, 64, &[]);
        assert_eq!(peer.name, name);
        assert_eq!(
            connected(&e, &name),
            AsyncConnectStatus::Connected,
            "{opts:?}"
        );
        e.transfer_sync(
            &name,
            TransferOp::Read,
            &[desc(&mem, 0, peer.addr, 0, 4096)],
            5000,
        )
        .unwrap_or_else(|err| panic!("{opts:?}: {err}"));
        assert_eq!(&mem[..4096], &Rng::new(64).bytes(4096)[..], "{opts:?}");
        e.finalize();
        peer.quit();
    }
}

#[test]
fn threads_share_one_engine_with_auto_connect() {
    let mut peer = Peer::spawn_compat("127.0.0.1:0", 1 << 20, 51, &[]);
    let mut mem = vec![0u8; 1 << 20];
    let (e, _) = client(&[("AutoConnect", "1")], &mut mem);
    let chunk = 1 << 17;
    let data = Rng::new(52).bytes(4 * chunk);
    mem[..4 * chunk].copy_from_slice(&data);
    let (base, raddr, name) = (mem.as_ptr() as usize, peer.addr as usize, peer.name.clone());
    std::thread::scope(|s| {
        for t in 0..4 {
            let (e, name) = (&e, &name);
            s.spawn(move || {
                // the first caller connects, the others use its link
                let w = TransferOpDesc {
                    local_addr: base + t * chunk,
                    remote_addr: raddr + t * chunk + 1,
                    len: chunk,
                };
                e.transfer_sync(name, TransferOp::Write, &[w], 5000)
                    .unwrap();
                let r = TransferOpDesc {
                    local_addr: base + 4 * chunk + t * chunk,
                    ..w
                };
                e.transfer_sync(name, TransferOp::Read, &[r], 5000).unwrap();
            });
        }
    });
    assert_eq!(&mem[4 * chunk..8 * chunk], &data[..]);
    assert_eq!(peer.sum(1, 4 * chunk as u64), fnv1a(&data));
    assert_eq!(e.get_all_async_connect_status().unwrap().len(), 1);
    e.finalize();
    peer.quit();
}

#[test]
fn auto_connect_replaces_a_link_the_heartbeat_found_dead() {
    let peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 61, &[]);
    let mut mem = vec![0u8; 1 << 16];
    // TCP links (same-host links watch the peer's process instead of pinging it)
    let opts = [
        ("AutoConnect", "1"),
        ("hixl.SameHost", "off"),
        ("hixl.HeartbeatMs", "250"),
    ];
    let (e, _) = client(&opts, &mut mem);
    let d = [desc(&mem, 0, peer.addr, 0, 512)];
    e.transfer_sync(&peer.name, TransferOp::Read, &d, 1000)
        .unwrap();
    assert_eq!(
        e.get_async_connect_status(&peer.name).unwrap(),
        AsyncConnectStatus::Connected
    );
    // a stopped peer does not answer the heartbeat: the link breaks without any transfer
    peer.signal(libc::SIGSTOP);
    let until = Instant::now() + Duration::from_secs(30);
    while e.get_async_connect_status(&peer.name).unwrap() == AsyncConnectStatus::Connected
        && Instant::now() < until
    {
        std::thread::yield_now();
    }
    assert_eq!(
        e.get_async_connect_status(&peer.name).unwrap(),
        AsyncConnectStatus::NotConnect
    );
    // back again: the next call drops the dead link and connects anew
    peer.signal(libc::SIGCONT);
    mem[..512].fill(0);
    e.transfer_sync(&peer.name, TransferOp::Read, &d, 5000)
        .unwrap();
    assert_eq!(&mem[..512], &Rng::new(61).bytes(512)[..]);
    e.finalize();
    peer.quit();
}

/// A sync transfer waiting on a stopped peer holds up no other call of the engine: while it
/// waits, a registration returns and a transfer to another peer completes (the engine's lock is
/// not held across the wait: before, the registration queued behind it as a writer, and every
/// call after the registration behind that), and a deregistration of the memory it uses is
/// refused (`RESOURCE_EXHAUSTED`) instead of handing the memory back under it. Once the peer
/// resumes, its bytes land.
#[test]
fn a_sync_transfer_to_a_stopped_peer_holds_up_no_other_call() {
    let stopped = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 71, &[]);
    let healthy = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 72, &[]);
    let mut mem = vec![0u8; 4096];
    let mut side = vec![0u8; 4096];
    let mut other = vec![0u8; 4096];
    // TCP links: a stopped peer leaves a READ waiting for its answer
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    let h_side = register(&e, &mut side).unwrap();
    e.connect(&stopped.name, 1000).unwrap();
    e.connect(&healthy.name, 1000).unwrap();
    let pause = stopped.stopped();
    let into_side = [desc(&side, 0, stopped.addr, 0, 4096)];
    std::thread::scope(|s| {
        let stalled =
            s.spawn(|| e.transfer_sync(&stopped.name, TransferOp::Read, &into_side, 20_000));
        let t0 = Instant::now();
        while !(e.metrics().unwrap().links.iter())
            .any(|l| l.peer == stopped.name && l.read.in_flight > 0)
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20) && !stalled.is_finished(),
                "the READ from the stopped peer never started"
            );
            std::thread::yield_now();
        }
        let h_other = register(&e, &mut other).unwrap();
        let d = [desc(&other, 0, healthy.addr, 100, 4096)];
        e.transfer_sync(&healthy.name, TransferOp::Read, &d, 5000)
            .unwrap();
        assert_eq!(status(e.deregister_mem(h_side)), Status::RESOURCE_EXHAUSTED);
        assert!(
            !stalled.is_finished(),
            "the other calls waited for the READ from the stopped peer to end"
        );
        e.deregister_mem(h_other).unwrap();
        drop(pause);
        stalled.join().unwrap().unwrap();
    });
    assert_eq!(other, Rng::new(72).bytes(1 << 16)[100..4196]);
    assert_eq!(side, Rng::new(71).bytes(4096));
    e.deregister_mem(h_side).unwrap();
    e.finalize();
    stopped.quit();
    healthy.quit();
}

/// A connect to a peer that does not answer (stopped: its kernel completes the handshake, its
/// process never sends the welcome), by `connect` or by a transfer with AutoConnect, holds up
/// no other call of the engine: a registration, a connect to and a transfer with another peer
/// go on meanwhile (the connect held the core's read lock while it waited: the registration
/// queued behind it as a writer, every later call behind that; AutoConnect's connects were
/// serialised by one lock, so a connect to a healthy peer waited for the stopped one). A second
/// connect to the same peer waits for the first by its own deadline. Once the peers resume,
/// both connects end well and the transfer's bytes land.
#[test]
fn a_connect_to_a_stopped_peer_holds_up_no_other_call() {
    let a = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 73, &[]);
    let b = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 74, &[]);
    let healthy = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 75, &[]);
    let mut mem = vec![0u8; 4096];
    let mut other = vec![0u8; 4096];
    let opts = [
        ("AutoConnect", "1"),
        ("hixl.ConnectTimeoutMs", "20000"),
        ("hixl.SameHost", "off"),
    ];
    let (e, _) = client(&opts, &mut mem);
    let (pause_a, pause_b) = (a.stopped(), b.stopped());
    let from_b = [desc(&mem, 0, b.addr, 0, 4096)];
    std::thread::scope(|s| {
        let connect = s.spawn(|| e.connect(&a.name, 20_000));
        let auto = s.spawn(|| e.transfer_sync(&b.name, TransferOp::Read, &from_b, 20_000));
        let t0 = Instant::now();
        while common::connections_to(common::port_of(&a.name)) == 0
            || common::connections_to(common::port_of(&b.name)) == 0
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20)
                    && !connect.is_finished()
                    && !auto.is_finished(),
                "the connects to the stopped peers never reached them"
            );
            std::thread::yield_now();
        }
        let h_other = register(&e, &mut other).unwrap();
        e.connect(&healthy.name, 5000).unwrap();
        let d = [desc(&other, 0, healthy.addr, 100, 4096)];
        e.transfer_sync(&healthy.name, TransferOp::Read, &d, 5000)
            .unwrap();
        e.deregister_mem(h_other).unwrap();
        let t = Instant::now();
        assert_eq!(status(e.connect(&a.name, 300)), Status::TIMEOUT);
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(
            !connect.is_finished() && !auto.is_finished(),
            "the other calls waited for the connects to the stopped peers to end"
        );
        drop((pause_a, pause_b));
        connect.join().unwrap().unwrap();
        auto.join().unwrap().unwrap();
    });
    assert_eq!(other, Rng::new(75).bytes(1 << 16)[100..4196]);
    assert_eq!(mem, Rng::new(74).bytes(4096));
    assert_eq!(status(e.connect(&a.name, 1000)), Status::ALREADY_CONNECTED);
    e.finalize();
    a.quit();
    b.quit();
    healthy.quit();
}

/// `finalize` during a connect to a stopped peer returns without waiting for it (it waited
/// for the connect's whole timeout behind the core's lock), and the connect, once the peer
/// resumes and answers, fails and leaves no link: its socket is closed.
#[test]
fn finalize_during_a_connect_leaves_no_link() {
    let a = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 78, &[]);
    let mut mem = vec![0u8; 4096];
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    let port = common::port_of(&a.name);
    let pause = a.stopped();
    std::thread::scope(|s| {
        let connect = s.spawn(|| e.connect(&a.name, 20_000));
        let t0 = Instant::now();
        while common::connections_to(port) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(20) && !connect.is_finished(),
                "the connect never reached the stopped peer"
            );
            std::thread::yield_now();
        }
        e.finalize();
        assert!(!connect.is_finished(), "finalize waited for the connect");
        drop(pause);
        let s = status(connect.join().unwrap());
        assert!(
            s == Status::FAILED || s == Status::NOT_CONNECTED,
            "the connect after finalize: {s:?}"
        );
    });
    let t0 = Instant::now();
    while common::connections_to(port) > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the connect that ended after finalize left its link open"
        );
        std::thread::yield_now();
    }
    assert_eq!(status(e.connect(&a.name, 1000)), Status::FAILED);
    a.quit();
}

/// `finalize` does not wait for an async connect waiting on a stopped peer (it joined the
/// connect queue, for the connect's whole timeout, with the engine's write lock held); the
/// connect, once the peer resumes, leaves no link behind.
#[test]
fn finalize_during_an_async_connect_waits_for_nothing() {
    let a = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 79, &[]);
    let mut mem = vec![0u8; 4096];
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    let port = common::port_of(&a.name);
    let pause = a.stopped();
    e.connect_async(&a.name, 20_000).unwrap();
    let t0 = Instant::now();
    while common::connections_to(port) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the async connect never reached the stopped peer"
        );
        std::thread::yield_now();
    }
    std::thread::scope(|s| {
        let finalize = s.spawn(|| e.finalize());
        let t0 = Instant::now();
        while !finalize.is_finished() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "finalize waited for the async connect"
            );
            std::thread::yield_now();
        }
    });
    drop(pause);
    let t0 = Instant::now();
    while common::connections_to(port) > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the async connect that ended after finalize left its link open"
        );
        std::thread::yield_now();
    }
    a.quit();
}

/// Async connects to peers that do not answer hold up no async connect to another peer (two
/// ran at once, HIXL's default: two stopped peers kept a third connect pending for their
/// timeouts).
#[test]
fn async_connects_to_stopped_peers_hold_up_no_other() {
    let a = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 80, &[]);
    let b = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 81, &[]);
    let healthy = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 82, &[]);
    let mut mem = vec![0u8; 4096];
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    let (pause_a, pause_b) = (a.stopped(), b.stopped());
    e.connect_async(&a.name, 20_000).unwrap();
    e.connect_async(&b.name, 20_000).unwrap();
    let t0 = Instant::now();
    while common::connections_to(common::port_of(&a.name)) == 0
        || common::connections_to(common::port_of(&b.name)) == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the async connects never reached the stopped peers"
        );
        std::thread::yield_now();
    }
    e.connect_async(&healthy.name, 5000).unwrap();
    let t0 = Instant::now();
    while e.get_async_connect_status(&healthy.name).unwrap() != AsyncConnectStatus::Connected {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the connect to the healthy peer waited behind the stopped ones"
        );
        std::thread::yield_now();
    }
    let mut other = vec![0u8; 4096];
    let h = register(&e, &mut other).unwrap();
    let d = [desc(&other, 0, healthy.addr, 300, 4096)];
    e.transfer_sync(&healthy.name, TransferOp::Read, &d, 5000)
        .unwrap();
    assert_eq!(other, Rng::new(82).bytes(1 << 16)[300..4396]);
    drop((pause_a, pause_b));
    e.deregister_mem(h).unwrap();
    e.finalize();
    a.quit();
    b.quit();
    healthy.quit();
}

/// With AutoConnect, a notification whose time goes by waiting for this engine's earlier
/// transfers (`TIMEOUT`: a local wait) leaves the link alone: the transfer it waited for goes on
/// and completes (the link was dropped as failed, which cancelled that transfer: `FAILED`).
#[test]
fn a_notify_timing_out_behind_a_transfer_keeps_the_link() {
    let len = 64 << 20;
    let stopped = Peer::spawn_compat("127.0.0.1:0", len, 83, &[]);
    let mut mem = Rng::new(84).bytes(len);
    let opts = [("AutoConnect", "1"), ("hixl.SameHost", "off")];
    let (e, _) = client(&opts, &mut mem);
    e.connect(&stopped.name, 1000).unwrap();
    let pause = stopped.stopped();
    let req = e
        .transfer_async(
            &stopped.name,
            TransferOp::Write,
            &[desc(&mem, 0, stopped.addr, 0, len)],
            TransferArgs { user_data: 1 },
        )
        .unwrap();
    let t0 = Instant::now();
    while !(e.metrics().unwrap().links.iter())
        .any(|l| l.peer == stopped.name && l.write.in_flight > 0)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the WRITE never started"
        );
        std::thread::yield_now();
    }
    let n = NotifyDesc {
        name: "kv".into(),
        notify_msg: "after".into(),
    };
    assert_eq!(
        status(e.send_notify(&stopped.name, &n, 200)),
        Status::TIMEOUT
    );
    assert_eq!(
        e.get_transfer_status(req).unwrap(),
        TransferStatus::Waiting,
        "the notification's timeout ended the transfer it waited for"
    );
    drop(pause);
    assert_eq!(wait(&e, req), TransferStatus::Completed);
    let mut stopped = stopped;
    assert_eq!(stopped.sum(0, len as u64), fnv1a(&mem));
    e.finalize();
    stopped.quit();
}

/// A sync transfer waiting on a stopped peer on another thread holds `disconnect` up only for
/// the disconnect's own timeout: its lane is then cut and it ends `NOT_CONNECTED` at once (the
/// close waited for it until its 20 s deadline); the same under `finalize`.
#[test]
fn closing_a_link_cuts_a_transfer_stalled_on_it() {
    for finalize in [false, true] {
        let stopped = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 85, &[]);
        let mut mem = vec![0u8; 4096];
        let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
        e.connect(&stopped.name, 1000).unwrap();
        let pause = stopped.stopped();
        let from = [desc(&mem, 0, stopped.addr, 0, 4096)];
        std::thread::scope(|s| {
            let stalled =
                s.spawn(|| e.transfer_sync(&stopped.name, TransferOp::Read, &from, 20_000));
            let t0 = Instant::now();
            while !(e.metrics().unwrap().links.iter())
                .any(|l| l.peer == stopped.name && l.read.in_flight > 0)
            {
                assert!(
                    t0.elapsed() < Duration::from_secs(20) && !stalled.is_finished(),
                    "the READ from the stopped peer never started"
                );
                std::thread::yield_now();
            }
            let t = Instant::now();
            if finalize {
                e.finalize();
            } else {
                // (its goodbye goes unanswered: TIMEOUT, the link closed anyway)
                let _ = e.disconnect(&stopped.name, 300);
            }
            let took = t.elapsed();
            assert!(
                took < Duration::from_secs(10),
                "closing (finalize: {finalize}) waited {took:?} for the stalled READ"
            );
            let r = stalled.join().unwrap();
            assert_eq!(status(r), Status::NOT_CONNECTED, "finalize: {finalize}");
        });
        drop(pause);
        e.finalize();
        stopped.quit();
    }
}

/// The heartbeat's break reaches a lane in use: a READ stalled on a stopped peer ends
/// `NOT_CONNECTED` once the heartbeat's PING on the link's other lane goes unanswered (it waited
/// for its 20 s deadline: a break shut down only idle lanes and lanes being opened).
#[test]
fn a_heartbeat_break_ends_a_transfer_stalled_on_another_lane() {
    let len = 32 << 20;
    let mut peer = Peer::spawn_compat("127.0.0.1:0", len, 86, &[]);
    let mut mem = vec![0u8; len];
    let opts = [("hixl.SameHost", "off"), ("hixl.HeartbeatMs", "300")];
    let (e, _) = client(&opts, &mut mem);
    e.connect(&peer.name, 1000).unwrap();
    // a READ large enough to run on two lanes: both idle afterwards
    let all = [desc(&mem, 0, peer.addr, 0, len)];
    e.transfer_sync(&peer.name, TransferOp::Read, &all, 20_000)
        .unwrap();
    assert!(mem == Rng::new(86).bytes(len), "the READ's bytes");
    let pause = peer.stopped();
    let t = Instant::now();
    let small = [desc(&mem, 0, peer.addr, 0, 4096)];
    let r = e.transfer_sync(&peer.name, TransferOp::Read, &small, 20_000);
    let took = t.elapsed();
    assert_eq!(status(r), Status::NOT_CONNECTED);
    // "at once" (serving.md): within a few heartbeat intervals, with slack for a loaded machine
    // (about 1 s here, and under AddressSanitizer; the READ's deadline is 20 s)
    assert!(
        took < Duration::from_secs(4),
        "the READ ended after {took:?}"
    );
    drop(pause);
    assert_eq!(peer.sum(0, 4096), fnv1a(&mem[..4096]));
    e.finalize();
    peer.quit();
}

/// Closing a link cancels its async requests at once, before its goodbye and before it waits
/// for its lanes in use: an async WRITE running to a stopped peer ends while the disconnect
/// still waits for the peer's answer (by its own 20 s timeout); it ended only when the close
/// gave up on that answer.
#[test]
fn a_disconnect_cancels_a_running_async_request_at_once() {
    let len = 64 << 20;
    let stopped = Peer::spawn_compat("127.0.0.1:0", len, 87, &[]);
    let mut mem = vec![0u8; len];
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    e.connect(&stopped.name, 1000).unwrap();
    let pause = stopped.stopped();
    let req = e
        .transfer_async(
            &stopped.name,
            TransferOp::Write,
            &[desc(&mem, 0, stopped.addr, 0, len)],
            TransferArgs { user_data: 2 },
        )
        .unwrap();
    let t0 = Instant::now();
    while !(e.metrics().unwrap().links.iter())
        .any(|l| l.peer == stopped.name && l.write.in_flight > 0)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the WRITE never started"
        );
        std::thread::yield_now();
    }
    std::thread::scope(|s| {
        let disconnect = s.spawn(|| e.disconnect(&stopped.name, 20_000));
        let t = Instant::now();
        let st = loop {
            let st = e.get_transfer_status(req).unwrap();
            if st != TransferStatus::Waiting {
                break st;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the request still ran {:?} into the disconnect",
                t.elapsed()
            );
            std::thread::yield_now();
        };
        assert_eq!(st, TransferStatus::Failed);
        drop(pause);
        let _ = disconnect.join().unwrap();
    });
    e.finalize();
    stopped.quit();
}

/// A notification to a stopped peer (sent, its acknowledgement never coming) holds up no other
/// call of the engine (it waited for the acknowledgement under the core's read lock); once the
/// peer resumes, it is delivered.
#[test]
fn a_notify_to_a_stopped_peer_holds_up_no_other_call() {
    let mut stopped = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 76, &[]);
    let healthy = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 77, &[]);
    let mut mem = vec![0u8; 4096];
    let mut other = vec![0u8; 4096];
    // TCP links, no heartbeat: the only bytes the stopped peer gets are the notification's
    let (e, _) = client(
        &[("hixl.SameHost", "off"), ("hixl.HeartbeatMs", "0")],
        &mut mem,
    );
    e.connect(&stopped.name, 1000).unwrap();
    e.connect(&healthy.name, 1000).unwrap();
    let pause = stopped.stopped();
    let port = common::port_of(&stopped.name);
    let unread = common::unread_at(port);
    let n = NotifyDesc {
        name: "kv".into(),
        notify_msg: "late".into(),
    };
    std::thread::scope(|s| {
        let notify = s.spawn(|| e.send_notify(&stopped.name, &n, 20_000));
        let t0 = Instant::now();
        while common::unread_at(port) <= unread {
            assert!(
                t0.elapsed() < Duration::from_secs(20) && !notify.is_finished(),
                "the notification never reached the stopped peer"
            );
            std::thread::yield_now();
        }
        let h_other = register(&e, &mut other).unwrap();
        let d = [desc(&other, 0, healthy.addr, 200, 4096)];
        e.transfer_sync(&healthy.name, TransferOp::Read, &d, 5000)
            .unwrap();
        e.deregister_mem(h_other).unwrap();
        assert!(
            !notify.is_finished(),
            "the other calls waited for the notification to the stopped peer"
        );
        drop(pause);
        notify.join().unwrap().unwrap();
    });
    assert_eq!(other, Rng::new(77).bytes(1 << 16)[200..4296]);
    assert_eq!(
        stopped.notifies(),
        vec![("kv".to_owned(), "late".to_owned())]
    );
    e.finalize();
    stopped.quit();
    healthy.quit();
}

/// A READ whose deadline passed while its peer was stopped: once it returned `TIMEOUT` the
/// memory is the caller's (README: "a terminal status means the engine no longer touches the
/// local buffers"). The peer, resumed, answers the READ late: none of that answer lands in the
/// caller's memory, then or in a later transfer on the link (which moves its own bytes).
#[test]
fn a_late_answer_to_a_timed_out_read_lands_nowhere() {
    let len = 8 << 20;
    let mut peer = Peer::spawn_compat("127.0.0.1:0", len, 88, &[]);
    let mut mem = vec![0u8; len];
    let (e, _) = client(&[("hixl.SameHost", "off")], &mut mem);
    e.connect(&peer.name, 1000).unwrap();
    let all = [desc(&mem, 0, peer.addr, 0, len)];
    e.transfer_sync(&peer.name, TransferOp::Read, &all, 20_000)
        .unwrap();
    assert!(mem == Rng::new(88).bytes(len), "the READ's bytes");
    let pause = peer.stopped();
    let r = e.transfer_sync(&peer.name, TransferOp::Read, &all, 300);
    assert_eq!(status(r), Status::TIMEOUT);
    // the caller's again: a sentinel, then the peer resumes and answers
    let p = mem.as_mut_ptr();
    // SAFETY: `p` points to `len` bytes of `mem`; the engine no longer touches them (the claim
    // under test: a write by it would show below, not be undefined behaviour of the test's own
    // making, as the test only reads them back through volatile reads).
    unsafe { std::ptr::write_bytes(p, 0xA5, len) };
    drop(pause);
    assert_eq!(peer.sum(0, 4096), fnv1a(&Rng::new(88).bytes(4096)));
    let changed = || {
        // SAFETY: reads of live bytes of `mem`, volatile: another thread writing them is what is
        // being looked for.
        (0..len).find(|&i| unsafe { std::ptr::read_volatile(p.add(i)) } != 0xA5)
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        assert_eq!(
            changed(),
            None,
            "the late answer landed, {:?} after",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // a later READ of the last 4 KiB moves those bytes, and only those
    let tail = [desc(&mem, len - 4096, peer.addr, (len - 4096) as u64, 4096)];
    e.transfer_sync(&peer.name, TransferOp::Read, &tail, 20_000)
        .unwrap();
    assert!(mem[len - 4096..] == Rng::new(88).bytes(len)[len - 4096..]);
    assert!(mem[..len - 4096].iter().all(|&b| b == 0xA5));
    e.finalize();
    peer.quit();
}

/// `DisconnectAsync` of a remote this engine never connected is `SUCCESS`, its status
/// `NotConnect`, as HIXL's (`tests/cpp/hixl/engine/test_hixl_api.cc`'s
/// `TestHixlDisconnectAsyncFailed`: a remote nobody listens on); it was `NOT_CONNECTED`.
#[test]
fn disconnect_async_of_an_unknown_remote_succeeds() {
    let mut mem = vec![0u8; 4096];
    let (e, _) = client(&NO_OPTIONS, &mut mem);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = closed.local_addr().unwrap().to_string();
    drop(closed);
    e.disconnect_async(&nobody, 1000).unwrap();
    assert_eq!(
        e.get_async_connect_status(&nobody).unwrap(),
        AsyncConnectStatus::NotConnect
    );
    assert!(e.get_all_async_connect_status().unwrap().is_empty());
    e.finalize();
}

/// With AutoConnect, a call that makes its link connects within what is left of its own
/// timeout, not the engine's `hixl.ConnectTimeoutMs`: to a listener that accepts and never
/// greets, `TransferSync`, the block form and `SendNotify` with 300 ms each end `TIMEOUT`
/// within about their timeout, while the engine's connect timeout is 10 s (HIXL's
/// `TransferSync` connects within the call's timeout too). Before, each waited out the
/// engine's connect timeout.
#[test]
fn an_auto_connect_keeps_the_calls_own_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let name = silent.local_addr().unwrap().to_string();
    let mut mem = vec![0u8; 4096];
    let (e, _) = client(
        &[("AutoConnect", "1"), ("hixl.ConnectTimeoutMs", "10000")],
        &mut mem,
    );
    let d = desc(&mem, 0, 0x1000, 0, 64);
    let block = compat::BlockDesc {
        local_addr: mem.as_ptr() as usize,
        remote_addr: 0x1000,
        block_size: 64,
        local_stride: 0,
        remote_stride: 0,
    };
    let note = NotifyDesc {
        name: "n".into(),
        notify_msg: "m".into(),
    };
    let bounded = |what: &str, f: &dyn Fn() -> Status| {
        let t = Instant::now();
        let s = f();
        let took = t.elapsed();
        assert_eq!(s, Status::TIMEOUT, "{what}");
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(3),
            "{what} took {took:?} with a timeout of 300 ms"
        );
    };
    bounded("transfer_sync", &|| {
        status(e.transfer_sync(&name, TransferOp::Read, &[d], 300))
    });
    bounded("transfer_blocks_sync", &|| {
        let idx = [0u64];
        status(e.transfer_blocks_sync(
            &name,
            TransferOp::Read,
            &block,
            hixl::BlockIndices::U64(&idx),
            hixl::BlockIndices::U64(&idx),
            300,
        ))
    });
    bounded("send_notify", &|| status(e.send_notify(&name, &note, 300)));
    drop(silent);
    e.finalize();
}

/// With AutoConnect, a notification that the peer does not acknowledge in time (the peer
/// stopped) ends `TIMEOUT` and leaves the link as it was: HIXL's `SendNotify` never disconnects
/// on an error, and dropping the link would end every transfer in flight on it. The same link
/// (by its id in the engine's metrics) moves the next transfer once the peer resumes. Before,
/// the link was dropped and the next call connected again; and the notify's `FAILED` was
/// rewritten to `NOTIFY_FAILED`, a code HIXL never returns.
#[test]
fn a_notify_that_times_out_keeps_the_auto_connect_link() {
    let peer = Peer::spawn_compat("127.0.0.1:0", 1 << 16, 71, &[]);
    let mut mem = vec![0u8; 1 << 16];
    let (e, _) = client(&[("AutoConnect", "1"), ("hixl.SameHost", "off")], &mut mem);
    let d = [desc(&mem, 0, peer.addr, 0, 4096)];
    e.transfer_sync(&peer.name, TransferOp::Read, &d, 5000)
        .unwrap();
    let ids = |e: &Hixl| -> Vec<u64> {
        let m = e.metrics().unwrap();
        m.links.iter().map(|l| l.link).collect()
    };
    let before = ids(&e);
    assert_eq!(before.len(), 1);
    let note = NotifyDesc {
        name: "kv".into(),
        notify_msg: "ready".into(),
    };
    {
        let _stopped = peer.stopped();
        assert_eq!(
            status(e.send_notify(&peer.name, &note, 300)),
            Status::TIMEOUT
        );
        assert_eq!(ids(&e), before, "the notify's timeout dropped the link");
    }
    e.transfer_sync(&peer.name, TransferOp::Read, &d, 5000)
        .unwrap();
    assert_eq!(&mem[..4096], &Rng::new(71).bytes(4096)[..]);
    assert_eq!(ids(&e), before, "the next transfer connected again");
    e.finalize();
    peer.quit();
}

/// With AutoConnect, a transfer to a remote whose async connect is still running answers
/// `NOT_CONNECTED` (HIXL's transfers never answer `ALREADY_CONNECTED`); the async connect goes
/// on and ends as it would have. Before, the transfer's own connect was refused by the engine
/// and came back as 103903.
#[test]
fn a_transfer_during_an_async_connect_is_not_connected_yet() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let name = silent.local_addr().unwrap().to_string();
    let mut mem = vec![0u8; 4096];
    let (e, _) = client(&[("AutoConnect", "1")], &mut mem);
    e.connect_async(&name, 5000).unwrap();
    // running (not only queued): the engine holds the remote's slot
    let until = Instant::now() + Duration::from_secs(10);
    while e.get_async_connect_status(&name).unwrap() != AsyncConnectStatus::Connecting {
        assert!(Instant::now() < until, "the async connect never ran");
        std::thread::yield_now();
    }
    let d = desc(&mem, 0, 0x1000, 0, 64);
    for op in [TransferOp::Read, TransferOp::Write] {
        assert_eq!(
            status(e.transfer_sync(&name, op, &[d], 1000)),
            Status::NOT_CONNECTED
        );
    }
    drop(silent);
    e.finalize();
}
