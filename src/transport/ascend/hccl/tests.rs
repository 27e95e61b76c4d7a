//! Tests of the HCCL wrappers against the test double (`double.rs`): two ranks in one process,
//! batching, error mapping, comm names, the init lock and the shared registry.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use super::sys as ffi;
use super::{
    Comm, CommConfig, Direction, GlobalMem, Hccl, MAX_DESCS_PER_CALL, MemKind, OneSideDesc,
};
use crate::device::acl::tests::Fixture;
use crate::device::acl::{MallocPolicy, Stream};
use crate::error::{Error, Status};

/// A one-server rank table; every rank on physical device `phy` (the double maps logical
/// device 0 to physical 10).
fn rank_table_on(ips: &[&str], phy: u32) -> String {
    let devices: Vec<serde_json::Value> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            serde_json::json!({"device_id": phy.to_string(), "device_ip": ip, "rank_id": i.to_string()})
        })
        .collect();
    serde_json::json!({"version": "1.0", "server_count": "1", "status": "completed",
        "server_list": [{"server_id": "10.0.0.1", "device": devices}]})
    .to_string()
}

fn rank_table(ips: &[&str]) -> String {
    rank_table_on(ips, 10)
}

// fields drop in order: the fixture (which deletes the log) goes last
struct Ranks {
    hccl: Hccl,
    stream: Stream,
    comms: Vec<Comm>,
    mems: Vec<GlobalMem>,
    bufs: Vec<crate::device::acl::AclBuffer>,
    f: Fixture,
}

/// Two ranks in this process, each with a 1 MiB HUGE_ONLY buffer registered and bound.
fn two_ranks(tag: &str) -> Ranks {
    let f = Fixture::on_device(tag);
    let hccl = Hccl::load(Some(&f.so)).expect("load the double as HCCL");
    let table = rank_table(&["192.168.100.1", "192.168.100.2"]);
    let cfg = CommConfig {
        comm_name: "hixl_a_b".into(),
        traffic_class: Some(132),
        ..CommConfig::default()
    };
    let mut comms = Vec::new();
    let mut bufs = Vec::new();
    let mut mems = Vec::new();
    for rank in 0..2 {
        let comm = hccl.init_comm(&table, rank, &cfg).unwrap();
        assert_eq!(comm.rank(), rank);
        let buf = f
            .acl
            .malloc_device(1 << 20, MallocPolicy::HugeOnly)
            .unwrap();
        // SAFETY: the buffer outlives the registration (dropped after `mems`), and no Rust
        // reference to its bytes exists.
        let mem =
            unsafe { hccl.register_global_mem(MemKind::Device, buf.addr(), 1 << 20) }.unwrap();
        hccl.bind(&comm, &mem).unwrap();
        comms.push(comm);
        bufs.push(buf);
        mems.push(mem);
    }
    for comm in &comms {
        hccl.prepare(comm, Duration::from_millis(1500), "peer")
            .unwrap();
    }
    let stream = f.acl.create_stream().unwrap();
    Ranks {
        f,
        hccl,
        stream,
        comms,
        bufs,
        mems,
    }
}

impl Ranks {
    /// [`Hccl::transfer`] from rank 0 to rank 1 on the ranks' stream, in batches of at most
    /// [`MAX_DESCS_PER_CALL`].
    ///
    /// # Safety
    /// As [`Hccl::transfer`] for rank 0's communicator.
    unsafe fn transfer(
        &self,
        direction: Direction,
        descs: &[OneSideDesc],
        timeout: Duration,
        peer: &str,
    ) -> Result<(), Error> {
        // SAFETY: the caller keeps the contract of `Hccl::transfer`.
        unsafe {
            self.hccl.transfer(
                &self.f.acl,
                &self.comms[0],
                1,
                direction,
                descs,
                MAX_DESCS_PER_CALL,
                &self.stream,
                timeout,
                peer,
            )
        }
    }

    fn teardown(mut self) {
        for (comm, mem) in self.comms.iter().zip(&self.mems) {
            self.hccl.unbind(comm, mem).unwrap();
        }
        for mem in self.mems.drain(..) {
            mem.deregister().unwrap();
        }
        for comm in self.comms.drain(..) {
            comm.destroy().unwrap();
        }
    }
}

#[test]
fn put_and_get_move_bytes_between_two_ranks() {
    let r = two_ranks("hccl-move");
    let acl = &r.f.acl;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    acl.write(&r.bufs[0], 0, &pattern).unwrap();
    let descs: Vec<OneSideDesc> = (0..4)
        .map(|i| OneSideDesc {
            local: (r.bufs[0].addr() + i * 1024) as u64,
            remote: (r.bufs[1].addr() + 8192 + i * 1024) as u64,
            len: 1024,
        })
        .collect();
    // SAFETY: every local range is inside rank 0's registered, bound, live buffer.
    unsafe { r.transfer(Direction::Put, &descs, Duration::from_secs(1), "b") }.unwrap();
    let mut got = vec![0u8; 4096];
    acl.read(&r.bufs[1], 8192, &mut got).unwrap();
    assert_eq!(got, pattern, "WRITE landed in rank 1");

    // READ it back into rank 0 at another offset
    let back = [OneSideDesc {
        local: (r.bufs[0].addr() + 65536) as u64,
        remote: (r.bufs[1].addr() + 8192) as u64,
        len: 4096,
    }];
    // SAFETY: the local range is inside rank 0's registered, bound, live buffer, and no
    // Rust reference to it exists.
    unsafe { r.transfer(Direction::Get, &back, Duration::from_secs(1), "b") }.unwrap();
    let mut got = vec![0u8; 4096];
    acl.read(&r.bufs[0], 65536, &mut got).unwrap();
    assert_eq!(got, pattern, "READ brought it back");

    // a local range outside bound memory is refused by HCCL
    let bad = [OneSideDesc {
        local: (r.bufs[0].addr() + (1 << 20) - 10) as u64,
        remote: r.bufs[1].addr() as u64,
        len: 20,
    }];
    // SAFETY: the double checks and refuses the range before touching memory.
    let e = unsafe { r.transfer(Direction::Put, &bad, Duration::from_secs(1), "b") }.unwrap_err();
    assert!(
        matches!(&e, Error::Native { library: "hccl", call: "HcclBatchPut", code: 1, detail, .. } if detail == "HCCL_E_PARA"),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::FAILED);
    // SAFETY: empty batches are refused before any call.
    let e = unsafe { r.transfer(Direction::Put, &[], Duration::from_secs(1), "b") }.unwrap_err();
    assert!(matches!(e, Error::EmptyBatch));

    let log = r.f.log_lines();
    assert!(
        log.iter().any(|l| l.starts_with(
            "HcclCommInitClusterInfoMemConfig rank=0 nranks=2 device_ip=192.168.100.1 name=hixl_a_b version=5 size=304 bufsize=200 tc=132 sl=4294967295 table=1.0 device_id=10 "
        )),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with("HcclBatchGet rank=1 num=1 rc=0"))
    );
    r.teardown();
}

#[test]
fn batches_are_issued_in_chunks_of_256() {
    let r = two_ranks("hccl-chunk");
    let descs: Vec<OneSideDesc> = (0..600)
        .map(|i| OneSideDesc {
            local: (r.bufs[0].addr() + i * 1000) as u64,
            remote: (r.bufs[1].addr() + i * 1000) as u64,
            len: 1000,
        })
        .collect();
    // SAFETY: every local range is inside rank 0's registered, bound, live buffer.
    unsafe { r.transfer(Direction::Put, &descs, Duration::from_secs(2), "b") }.unwrap();
    let log = r.f.log_lines();
    let calls: Vec<&str> = log
        .iter()
        .filter(|l| l.starts_with("HcclBatchPut "))
        .map(String::as_str)
        .collect();
    assert_eq!(
        calls,
        [
            "HcclBatchPut rank=1 num=256 rc=0",
            "HcclBatchPut rank=1 num=256 rc=0",
            "HcclBatchPut rank=1 num=88 rc=0"
        ]
    );
    let syncs: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout "))
        .collect();
    assert_eq!(syncs.len(), 1, "one sync after all chunks: {syncs:?}");
    assert!(syncs[0].contains(" ops=600 rc=0"), "{syncs:?}");
    r.teardown();
}

#[test]
fn hccl_failures_map_to_timeout_and_native() {
    let r = two_ranks("hccl-fail");
    let descs = [OneSideDesc {
        local: r.bufs[0].addr() as u64,
        remote: r.bufs[1].addr() as u64,
        len: 64,
    }];
    r.f.fail("HcclBatchGet=9");
    // SAFETY: the local range is inside rank 0's registered, bound, live buffer.
    let e = unsafe { r.transfer(Direction::Get, &descs, Duration::from_secs(1), "10.0.0.9") }
        .unwrap_err();
    assert!(
        matches!(&e, Error::Timeout { op: "READ", peer, .. } if peer == "10.0.0.9"),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::TIMEOUT);
    assert!(
        r.f.log_lines()
            .iter()
            .any(|l| l == "HcclBatchGet rank=1 num=1 rc=9"),
        "{:#?}",
        r.f.log_lines()
    );
    r.f.fail("HcclCommPrepare=9");
    let e = r
        .hccl
        .prepare(&r.comms[0], Duration::from_millis(10), "p")
        .unwrap_err();
    assert!(matches!(&e, Error::Timeout { op: "connect", .. }), "{e:?}");
    r.f.fail("HcclCommBindMem");
    let e = r.hccl.bind(&r.comms[0], &r.mems[1]).unwrap_err();
    assert!(
        matches!(&e, Error::Native { library: "hccl", call: "HcclCommBindMem", code: 4, detail, .. } if detail == "HCCL_E_INTERNAL"),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::FAILED);
    r.f.fail("sync_timeout");
    // SAFETY: as above.
    let e = unsafe { r.transfer(Direction::Put, &descs, Duration::from_secs(1), "p") }.unwrap_err();
    assert!(matches!(&e, Error::Timeout { op: "WRITE", .. }), "{e:?}");
    r.f.fail("");
    // the timed-out copy is still queued: nothing it touches may be unbound before an abort
    let e = r.hccl.unbind(&r.comms[0], &r.mems[0]).unwrap_err();
    assert!(matches!(&e, Error::Native { code: 1, .. }), "{e:?}");
    r.f.acl.abort(&r.stream).unwrap();
    assert!(
        r.f.log_lines()
            .iter()
            .any(|l| l.starts_with("aclrtStreamAbort ") && l.ends_with(" dropped=1 rc=0")),
        "{:#?}",
        r.f.log_lines()
    );
    r.teardown();
}

#[test]
fn prepare_times_out_when_a_peer_never_announces() {
    let f = Fixture::new("hccl-lonely");
    let dir = f.so.with_extension("dir");
    std::fs::create_dir_all(&dir).unwrap();
    crate::device::double::control(&f.so, "dir", Some(&dir.to_string_lossy()));
    let hccl = Hccl::load(Some(&f.so)).unwrap();
    f.acl.init().unwrap();
    f.acl.set_device(0).unwrap();
    let cfg = CommConfig {
        comm_name: "lonely".into(),
        ..CommConfig::default()
    };
    let comm = hccl
        .init_comm(&rank_table(&["10.1.1.1", "10.1.1.2"]), 0, &cfg)
        .unwrap();
    assert!(dir.join("10.1.1.1").exists(), "rank 0 announced itself");
    let t = Instant::now();
    let e = hccl
        .prepare(&comm, Duration::from_millis(200), "10.1.1.2")
        .unwrap_err();
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "rounded up to a whole second"
    );
    assert!(
        matches!(&e, Error::Timeout { op: "connect", peer, .. } if peer == "10.1.1.2"),
        "{e:?}"
    );
    drop(comm);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn comm_names_are_bounded() {
    let ok = CommConfig {
        comm_name: "x".repeat(127),
        service_level: Some(4),
        ..CommConfig::default()
    }
    .to_ffi()
    .unwrap();
    assert_eq!(ok.comm_name[126], b'x' as std::ffi::c_char);
    assert_eq!(ok.comm_name[127], 0);
    assert_eq!(ok.rdma_service_level, 4);
    assert_eq!(ok.rdma_traffic_class, u32::MAX);
    for bad in ["x".repeat(128), "a\0b".to_owned(), String::new()] {
        let e = CommConfig {
            comm_name: bad,
            ..CommConfig::default()
        }
        .to_ffi()
        .unwrap_err();
        assert_eq!(e.status(), Status::PARAM_INVALID);
    }
}

fn init_fixture(tag: &str) -> (Fixture, Hccl) {
    let f = Fixture::on_device(tag);
    let hccl = Hccl::load(Some(&f.so)).expect("load the double as HCCL");
    (f, hccl)
}

fn named(name: &str) -> CommConfig {
    CommConfig {
        comm_name: name.into(),
        ..CommConfig::default()
    }
}

/// Item 2: HCCL does not support parallel `HcclCommInitClusterInfoMemConfig` (the double
/// fails every call that overlaps another); `init_comm` serialises them process-wide.
#[test]
fn concurrent_comm_inits_are_serialised() {
    let (f, hccl) = init_fixture("hccl-serial");
    crate::device::double::control(&f.so, "init_hold_ms", Some("100"));
    let ctx = f.acl.current_context().unwrap();
    let table = rank_table(&["10.2.0.1", "10.2.0.2"]);
    let start = std::sync::Barrier::new(4);
    let results: Vec<Result<Comm, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (hccl, acl, table, start) = (&hccl, &f.acl, &table, &start);
                s.spawn(move || {
                    let _g = acl.enter(ctx).unwrap();
                    start.wait();
                    hccl.init_comm(table, 0, &named(&format!("serial_{i}")))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert!(r.is_ok(), "{r:?}");
    }
    drop(results);
    let log = f.log_lines();
    assert!(!log.iter().any(|l| l.contains(" overlap=1 ")), "{log:#?}");
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("HcclCommInitClusterInfoMemConfig ") && l.ends_with("rc=0"))
            .count(),
        4
    );
}

/// Item 1 (the double's side): a rank table naming the logical id where HCCL expects the
/// physical one is `HCCL_E_UNAVAIL`; item 3: an empty or live name is `HCCL_E_PARA`.
#[test]
fn the_double_checks_device_ids_and_names_like_hccl() {
    let (f, hccl) = init_fixture("hccl-strict");
    assert_eq!(f.acl.physical_device_id(0).unwrap(), 10);
    crate::device::double::control(&f.so, "phy_map", Some("0:3,1:0"));
    assert_eq!(f.acl.physical_device_id(0).unwrap(), 3);
    assert_eq!(f.acl.physical_device_id(1).unwrap(), 0);
    let e = hccl
        .init_comm(&rank_table_on(&["10.3.0.1"], 0), 0, &named("logical"))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Native { call: "HcclCommInitClusterInfoMemConfig", code: 7, detail, .. } if detail == "HCCL_E_UNAVAIL"),
        "{e:?}"
    );
    let comm = hccl
        .init_comm(&rank_table_on(&["10.3.0.1"], 3), 0, &named("physical"))
        .unwrap();
    let e = hccl
        .init_comm(&rank_table_on(&["10.3.0.1"], 3), 0, &named("physical"))
        .unwrap_err();
    assert!(matches!(&e, Error::Native { code: 1, .. }), "{e:?}");
    comm.destroy().unwrap();
    let again = hccl
        .init_comm(&rank_table_on(&["10.3.0.1"], 3), 0, &named("physical"))
        .expect("the name is free once the comm is destroyed");
    drop(again);
}

/// The double's rank-table rule accepts what upstream's own programs build: HIXL's Python
/// samples (pull_cache_sample.py and two more) build version "1.2" tables with neither a
/// `super_pod_list` nor `super_device_id`s, read as 1.0 tables; a 1.2 table with a
/// `super_pod_list` (A3's layout) still needs a `super_device_id` in every device.
#[test]
fn a_1_2_rank_table_without_super_pods_is_read_as_1_0() {
    let (_f, hccl) = init_fixture("hccl-v12");
    let table = |extra: serde_json::Value| {
        let mut t = serde_json::json!({"version": "1.2", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "1", "host_ip": "127.0.0.1", "device": [
                {"device_id": "10", "device_ip": "10.4.0.1", "rank_id": "0"}]}]});
        if let (Some(t), Some(e)) = (t.as_object_mut(), extra.as_object()) {
            t.extend(e.clone());
        }
        t.to_string()
    };
    let comm = hccl
        .init_comm(&table(serde_json::json!({})), 0, &named("v12_samples"))
        .expect("a 1.2 table as upstream's samples build it");
    comm.destroy().unwrap();
    let pods = serde_json::json!({"super_pod_list": [{"super_pod_id": "0", "server_list": [{"server_id": "1"}]}]});
    let e = hccl
        .init_comm(&table(pods), 0, &named("v12_pods"))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Native {
                call: "HcclCommInitClusterInfoMemConfig",
                code: 1,
                ..
            }
        ),
        "{e:?}"
    );
}

/// Item 4: HCCL keeps one registry per process (the same range gets the same handle back);
/// two registrations of one range share it, and only the last one deregisters. An
/// overlapping range is refused before HCCL is called.
#[test]
fn one_range_registered_twice_shares_one_hccl_registration() {
    let (f, hccl) = init_fixture("hccl-shared");
    let buf = f
        .acl
        .malloc_device(1 << 20, MallocPolicy::HugeOnly)
        .unwrap();
    let cfg = named("shared");
    let comm = hccl
        .init_comm(&rank_table(&["10.4.0.1", "10.4.0.2"]), 0, &cfg)
        .unwrap();
    // SAFETY: the buffer outlives both registrations, and no Rust reference to its bytes
    // exists.
    let a = unsafe { hccl.register_global_mem(MemKind::Device, buf.addr(), 1 << 20) }.unwrap();
    // SAFETY: as above.
    let b = unsafe { hccl.register_global_mem(MemKind::Device, buf.addr(), 1 << 20) }.unwrap();
    assert_eq!(a.as_raw(), b.as_raw());
    // SAFETY: as above (refused before any HCCL call).
    let e =
        unsafe { hccl.register_global_mem(MemKind::Device, buf.addr() + 4096, 4096) }.unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Native {
                call: "HcclRegisterGlobalMem",
                code: 1,
                ..
            }
        ),
        "{e:?}"
    );
    a.deregister().unwrap();
    // still registered for `b`
    hccl.bind(&comm, &b)
        .expect("the handle outlives the first deregistration");
    hccl.unbind(&comm, &b).unwrap();
    let log = f.log_lines();
    assert!(
        !log.iter()
            .any(|l| l.starts_with("HcclDeregisterGlobalMem ")),
        "{log:#?}"
    );
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("HcclRegisterGlobalMem "))
            .count(),
        1,
        "{log:#?}"
    );
    drop(b);
    let log = f.log_lines();
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("HcclDeregisterGlobalMem ") && l.ends_with("rc=0"))
            .count(),
        1,
        "{log:#?}"
    );
    drop(comm);
    drop(buf);
}

/// HCCL reaches only remote memory bound to the remote rank's live communicator (bound before
/// its prepare). Both ranks in this process: rank 1 unbinds its buffer, and rank 0's calls on
/// it fail `HCCL_E_PARA` before anything is queued, leaving both buffers as they were; bound
/// and prepared again it is reachable again; a copy queued before an unbind fails at the sync
/// without moving a byte; a destroyed remote communicator reaches nothing.
#[test]
fn remote_ranges_must_be_bound_to_the_remote_ranks_live_comm() {
    let mut r = two_ranks("hccl-remote");
    let acl = &r.f.acl;
    let (remote_bytes, local_bytes) = (vec![0xA5u8; 4096], vec![0x3Cu8; 4096]);
    acl.write(&r.bufs[1], 0, &remote_bytes).unwrap();
    acl.write(&r.bufs[0], 0, &local_bytes).unwrap();
    let whole = [OneSideDesc {
        local: r.bufs[0].addr() as u64,
        remote: r.bufs[1].addr() as u64,
        len: 4096,
    }];
    let t = Duration::from_secs(1);
    let is_para = |e: &Error, call: &str| matches!(e, Error::Native { library: "hccl", call: c, code: 1, detail, .. } if *c == call && detail == "HCCL_E_PARA");
    let bytes = |buf: &crate::device::acl::AclBuffer| {
        let mut v = vec![0u8; 4096];
        acl.read(buf, 0, &mut v).unwrap();
        v
    };

    // bound: a READ works; a remote range running past rank 1's registration does not, and a
    // call with one such descriptor queues none of its others
    let probe = [OneSideDesc {
        local: (r.bufs[0].addr() + 65536) as u64,
        remote: r.bufs[1].addr() as u64,
        len: 64,
    }];
    // SAFETY: every local range is inside rank 0's registered, bound, live buffer, and no Rust
    // reference to it exists.
    unsafe { r.transfer(Direction::Get, &probe, t, "b") }.unwrap();
    let past = [
        whole[0],
        OneSideDesc {
            local: r.bufs[0].addr() as u64,
            remote: (r.bufs[1].addr() + (1 << 20) - 10) as u64,
            len: 20,
        },
    ];
    // SAFETY: as above; the double refuses the call before it queues anything.
    let e = unsafe { r.transfer(Direction::Put, &past, t, "b") }.unwrap_err();
    assert!(is_para(&e, "HcclBatchPut"), "{e:?}");
    r.f.acl
        .synchronize(&r.stream, t, "WRITE", "b")
        .expect("nothing queued");
    let log = r.f.log_lines();
    assert!(
        log.iter()
            .any(|l| l == "HcclBatchPut rank=1 num=2 remote_unbound=1 rc=1"),
        "{log:#?}"
    );
    assert!(
        log.last().is_some_and(|l| l.ends_with(" ops=0 rc=0")),
        "{log:#?}"
    );
    assert_eq!(bytes(&r.bufs[1]), remote_bytes);

    // unbound on the remote side: refused both ways, nothing moves
    r.hccl.unbind(&r.comms[1], &r.mems[1]).unwrap();
    for (direction, call) in [
        (Direction::Put, "HcclBatchPut"),
        (Direction::Get, "HcclBatchGet"),
    ] {
        // SAFETY: as above.
        let e = unsafe { r.transfer(direction, &whole, t, "b") }.unwrap_err();
        assert!(is_para(&e, call), "{e:?}");
    }
    assert_eq!(bytes(&r.bufs[1]), remote_bytes, "rank 1's memory unchanged");
    assert_eq!(bytes(&r.bufs[0]), local_bytes, "rank 0's memory unchanged");
    let log = r.f.log_lines();
    assert!(
        log.iter()
            .any(|l| l == "HcclBatchGet rank=1 num=1 remote_unbound=0 rc=1"),
        "{log:#?}"
    );

    // bound again: unreachable until rank 1 prepares again (HCCL exchanges keys at prepare)
    r.hccl.bind(&r.comms[1], &r.mems[1]).unwrap();
    // SAFETY: as above.
    let e = unsafe { r.transfer(Direction::Put, &whole, t, "b") }.unwrap_err();
    assert!(is_para(&e, "HcclBatchPut"), "{e:?}");
    r.hccl
        .prepare(&r.comms[1], Duration::from_millis(1500), "a")
        .unwrap();
    // SAFETY: as above.
    unsafe { r.transfer(Direction::Put, &whole, t, "b") }.unwrap();
    assert_eq!(bytes(&r.bufs[1]), local_bytes, "the WRITE landed");

    // queued while bound, unbound before the sync: the copy fails there and moves nothing
    let fresh = vec![0x77u8; 4096];
    acl.write(&r.bufs[0], 0, &fresh).unwrap();
    let mut raw = [ffi::HcclOneSideOpDesc {
        local_addr: r.bufs[0].addr() as *mut c_void,
        remote_addr: r.bufs[1].addr() as *mut c_void,
        count: 4096,
        data_type: ffi::HCCL_DATA_TYPE_UINT8,
    }];
    // SAFETY: one initialised descriptor whose local range is inside rank 0's registered,
    // bound, live buffer; the communicator and stream are alive, under this thread's context.
    let rc = unsafe {
        (r.hccl.api.batch_put)(
            r.comms[0].as_raw(),
            1,
            raw.as_mut_ptr(),
            1,
            r.stream.as_raw(),
        )
    };
    assert_eq!(rc, ffi::HCCL_SUCCESS, "queued");
    r.hccl.unbind(&r.comms[1], &r.mems[1]).unwrap();
    let e = r.f.acl.synchronize(&r.stream, t, "WRITE", "b").unwrap_err();
    assert!(
        matches!(&e, Error::Native { library: "acl", code: 507_899, detail, .. }
            if detail.contains("is not inside memory bound to rank 1's live communicator \"hixl_a_b\"")),
        "{e:?}"
    );
    assert_eq!(
        bytes(&r.bufs[1]),
        local_bytes,
        "the queued copy did not run"
    );

    // a destroyed remote communicator reaches nothing
    r.hccl.bind(&r.comms[1], &r.mems[1]).unwrap();
    r.hccl
        .prepare(&r.comms[1], Duration::from_millis(1500), "a")
        .unwrap();
    r.comms.pop().expect("rank 1's comm").destroy().unwrap();
    // SAFETY: as above.
    let e = unsafe { r.transfer(Direction::Get, &whole, t, "b") }.unwrap_err();
    assert!(is_para(&e, "HcclBatchGet"), "{e:?}");
    assert_eq!(bytes(&r.bufs[0]), fresh, "rank 0's memory unchanged");

    r.hccl.unbind(&r.comms[0], &r.mems[0]).unwrap();
    for mem in r.mems.drain(..) {
        mem.deregister().unwrap();
    }
    for comm in r.comms.drain(..) {
        comm.destroy().unwrap();
    }
}
