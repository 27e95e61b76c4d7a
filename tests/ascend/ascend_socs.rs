//! The Ascend backend's rank tables, SoCs and libraries, on the ACL/HCCL ABI test double:
//! physical device ids in the rank table, a reconnect destroying the previous communicator of
//! its name first, rank table 1.2 on A3, no device IP within one server, 64-descriptor batches on
//! Ascend950, a missing library as `LibraryUnavailable`.

use crate::support;

use hixl::testkit::Rng;
use hixl::{AscendConfig, Error, Hixl, Options, Status, TransferDesc, TransferOp, TransportKind};
use support::{Double, T, calls, first, pair, pair_with};

/// Item 1: the rank table carries the physical id of the engine's logical device
/// (`aclrtGetPhyDevIdByLogicDevId`); HCCL (the double) refuses the logical one with
/// HCCL_E_UNAVAIL. Logical 1 is physical 5 and logical 2 physical 6 here.
#[test]
fn the_rank_table_names_physical_devices() {
    let Some(d) = Double::new("phy") else {
        return;
    };
    d.control("phy_map", Some("1:5,2:6"));
    let (client, creg, server, saddr) = pair_with(
        &d,
        1 << 20,
        d.options_on(1, Some("10.31.0.1")),
        d.options_on(2, Some("10.31.0.2")),
    );
    let link = client.connect_timeout(server.name(), T).unwrap();
    assert_eq!(link.transport(), TransportKind::Ascend);
    let desc = TransferDesc::new(creg.range(0..64).unwrap(), link.remote(saddr, 64).unwrap());
    link.transfer_sync(TransferOp::Write, &[desc], T).unwrap();
    let log = d.log_lines();
    let init = |rank: u32| {
        log.iter()
            .find(|l| {
                l.starts_with(&format!("HcclCommInitClusterInfoMemConfig rank={rank} "))
                    && l.ends_with("rc=0")
            })
            .unwrap_or_else(|| panic!("no rank {rank} init in {log:#?}"))
    };
    assert!(init(0).contains(" device_id=6 "), "{}", init(0));
    assert!(init(1).contains(" device_id=5 "), "{}", init(1));
}

/// Item 3: a fast reconnect while the old link's communicators are still alive (the broken
/// link is still held, so the server has not dropped its side either) destroys the old
/// communicator of the same name before creating the new one; HCCL refuses a name in use.
#[test]
fn a_reconnect_destroys_the_communicator_of_the_same_name_first() {
    let Some(d) = Double::new("rename") else {
        return;
    };
    let (client, creg, server, saddr) = pair(&d, 1 << 20);
    let old = client.connect_timeout(server.name(), T).unwrap();
    d.control("fail", Some("HcclBatchGet=4"));
    let desc = TransferDesc::new(creg.range(0..64).unwrap(), old.remote(saddr, 64).unwrap());
    old.transfer_sync(TransferOp::Read, &[desc], T).unwrap_err();
    d.control("fail", None);
    assert!(old.is_broken());
    // `old` stays alive: its server side is still up
    let link = client.connect_timeout(server.name(), T).unwrap();
    let desc = TransferDesc::new(creg.range(0..64).unwrap(), link.remote(saddr, 64).unwrap());
    link.transfer_sync(TransferOp::Write, &[desc], T).unwrap();
    let log = d.log_lines();
    let inits: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("HcclCommInitClusterInfoMemConfig rank=0 "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(inits.len(), 2, "{log:#?}");
    assert!(log[inits[1]].ends_with("rc=0"), "{}", log[inits[1]]);
    let first_comm = log[inits[0]]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("comm="))
        .unwrap()
        .to_owned();
    let destroyed = first(&log, &format!("HcclCommDestroy comm={first_comm} "));
    assert!(
        destroyed < inits[1] && log[destroyed].ends_with("rc=0"),
        "the old server communicator is destroyed before the new one is made: {log:#?}"
    );
    let name = |l: &str| {
        l.split_whitespace()
            .find(|w| w.starts_with("name="))
            .map(str::to_owned)
    };
    assert_eq!(
        name(&log[inits[0]]),
        name(&log[inits[1]]),
        "HIXL's name, reused"
    );
    drop(old);
    drop(link);
}

/// Item 5: on A3 (Ascend910_93xx) both sides send their super-pod ids and build rank table
/// 1.2 with `super_device_id`s and a `super_pod_list` (the double refuses a 1.2 table whose
/// `super_pod_list` comes without `super_device_id`s); data still moves.
#[test]
fn a3_links_use_rank_table_1_2() {
    let Some(d) = Double::new("a3") else {
        return;
    };
    d.control("soc", Some("Ascend910_9391"));
    d.control("super_pod_id", Some("7"));
    let (client, mut creg, server, saddr) = pair(&d, 1 << 20);
    let link = client.connect_timeout(server.name(), T).unwrap();
    let mut data = vec![0u8; 4096];
    Rng::new(5).fill(&mut data);
    client
        .with_context(|ctx| creg.write_device(ctx, 0, &data))
        .unwrap()
        .unwrap();
    let w = TransferDesc::new(
        creg.range(0..4096).unwrap(),
        link.remote(saddr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[w], T).unwrap();
    let r = TransferDesc::new(
        creg.range(8192..8192 + 4096).unwrap(),
        link.remote(saddr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[r], T).unwrap();
    let mut back = vec![0u8; 4096];
    client
        .with_context(|ctx| creg.read_device(ctx, 8192, &mut back))
        .unwrap()
        .unwrap();
    assert!(back == data, "WRITE then READ on the 1.2 communicator");
    let log = d.log_lines();
    for rank in [0, 1] {
        let l = &log[first(
            &log,
            &format!("HcclCommInitClusterInfoMemConfig rank={rank} "),
        )];
        assert!(l.contains(" table=1.2 ") && l.ends_with("rc=0"), "{l}");
    }
    assert!(
        log.iter()
            .any(|l| l.starts_with("aclrtGetDeviceInfo device=0 attr=403 value=1010 rc=0")),
        "{log:#?}"
    );
}

/// Item 6: within one server no device IP is needed (HIXL only warns): engines without one
/// (and without /etc/hccn.conf entries) still link and move data.
#[test]
fn no_device_ip_is_needed_within_one_server() {
    let Some(d) = Double::new("noip") else {
        return;
    };
    let (client, creg, server, saddr) =
        pair_with(&d, 1 << 20, d.options_on(0, None), d.options_on(1, None));
    let link = client.connect_timeout(server.name(), T).unwrap();
    assert_eq!(link.transport(), TransportKind::Ascend);
    let desc = TransferDesc::new(
        creg.range(0..4096).unwrap(),
        link.remote(saddr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[desc], T).unwrap();
    let log = d.log_lines();
    let l = &log[first(&log, "HcclCommInitClusterInfoMemConfig rank=1 ")];
    if std::path::Path::new("/etc/hccn.conf").exists() {
        return; // this machine configures device IPs: nothing more to check
    }
    assert!(
        l.contains(" device_ip=phy_10 "),
        "no device_ip in the table: {l}"
    );
}

/// Item 7: on Ascend950 (A5) HCCL's batch calls take at most 64 descriptors (the double
/// refuses more with HCCL_E_PARA); hixl issues them in chunks of 64.
#[test]
fn ascend950_batches_are_chunked_by_64() {
    let Some(d) = Double::new("a5") else {
        return;
    };
    d.control("soc", Some("Ascend950PR_9599"));
    let (client, creg, server, saddr) = pair(&d, 1 << 20);
    let link = client.connect_timeout(server.name(), T).unwrap();
    let descs: Vec<TransferDesc<'_>> = (0..150u64)
        .map(|i| {
            let off = (i * 1000) as usize;
            TransferDesc::new(
                creg.range(off..off + 1000).unwrap(),
                link.remote(saddr + i * 1000, 1000).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
    let log = d.log_lines();
    let puts = calls(&log, "HcclBatchPut ");
    assert_eq!(
        puts,
        [
            "HcclBatchPut rank=0 num=64 rc=0",
            "HcclBatchPut rank=0 num=64 rc=0",
            "HcclBatchPut rank=0 num=22 rc=0"
        ]
    );
}

/// A missing library is LibraryUnavailable at initialize (UNSUPPORTED), never a panic; probe()
/// reports the backend honestly.
#[test]
fn missing_library_is_library_unavailable() {
    let opts = Options::default().ascend(AscendConfig {
        acl_lib: Some("/nonexistent/libacl_rt.so".into()),
        hccl_lib: None,
        device_id: 0,
        device_ip: Some("10.0.0.1".parse().unwrap()),
    });
    let e = Hixl::initialize("127.0.0.1", opts).unwrap_err();
    assert!(
        matches!(&e, Error::LibraryUnavailable { library, .. } if library == "/nonexistent/libacl_rt.so"),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::UNSUPPORTED);
    let e = Hixl::initialize(
        "127.0.0.1",
        Options::from_pairs([
            ("hixl.ascend.acl_lib", "/nonexistent/libx.so"),
            ("hixl.ascend.device_ip", "10.0.0.1"),
        ])
        .unwrap(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::LibraryUnavailable { .. }), "{e:?}");
    let info = hixl::probe()
        .into_iter()
        .find(|t| t.kind == TransportKind::Ascend)
        .unwrap();
    if std::env::var_os("HIXL_ACL_LIB").is_none() && !info.available {
        assert!(info.detail.contains("libacl_rt.so"), "{info:?}");
    }
}
