//! The Ascend backend end to end, on the ACL/HCCL ABI test double (`tests/ascend_double`):
//! two processes, device memory, HCCL batch transfers, the recorded call sequence, error
//! mapping and link poisoning. The double is compiled with the system `cc`; without one these
//! tests print why and pass without running.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::support;

use hixl::testkit::{Rng, fnv1a};
use hixl::{
    DeviceBuffer, Error, Hixl, MemType, Options, Status, TransferDesc, TransferOp, TransportKind,
};
use support::{Double, T, calls, first, pair};

struct AscendPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    name: String,
    addr: u64,
}

impl AscendPeer {
    fn spawn(d: &Double, device_ip: &str, size: usize, seed: u64, log: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
            .args(["serve-ascend", "--lib"])
            .arg(&d.so)
            .args(["--device-ip", device_ip, "--size", &size.to_string()])
            .args(["--seed", &seed.to_string()])
            .env("HIXL_ASCEND_DOUBLE_DIR", &d.dir)
            .env("HIXL_ASCEND_DOUBLE_LOG", log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hixl-peer");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.first(), Some(&"READY"), "peer said {line:?}");
        Self {
            name: w[1].to_owned(),
            addr: w[2].parse().unwrap(),
            child,
            stdin,
            stdout,
        }
    }

    fn sum(&mut self, off: usize, len: usize) -> String {
        writeln!(self.stdin, "sum {off} {len}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().strip_prefix("SUM ").expect("SUM").to_owned()
    }

    fn quit(mut self) {
        let _ = writeln!(self.stdin, "quit");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "peer exited with {status}");
    }
}

/// The whole lifecycle across two processes: device memory allocated and registered under the
/// engine's context, a device link, random data WRITE (600 descriptors: 256/256/88 per HCCL
/// call) checked in the peer, and the peer's seeded memory READ back byte for byte; then the
/// recorded call sequence.
#[test]
fn two_processes_write_and_read_device_memory() {
    let Some(d) = Double::new("lifecycle") else {
        return;
    };
    let size = 4 << 20;
    let peer_log = d.dir.with_extension("peer.log");
    let _ = std::fs::remove_file(&peer_log);
    let mut peer = AscendPeer::spawn(&d, "10.20.0.2", size, 7, &peer_log);

    let engine = Hixl::initialize("127.0.0.1", d.options("10.20.0.1"))
        .unwrap()
        .into_registered();
    let mut data = vec![0u8; 600 * 1000];
    Rng::new(99).fill(&mut data);
    let (mut src, mut dst) = engine
        .with_context(|ctx| {
            let mut a = engine.alloc_device(ctx, size).unwrap();
            a.write(ctx, 0, &data).unwrap();
            let b = engine.alloc_device(ctx, size).unwrap();
            (
                engine.register_device(ctx, a).unwrap(),
                engine.register_device(ctx, b).unwrap(),
            )
        })
        .unwrap();
    assert_eq!(src.mem_type(), MemType::Device);
    let engine = engine.activate().unwrap();
    {
        let link = engine.connect_timeout(&peer.name, T).unwrap();
        assert_eq!(link.transport(), TransportKind::Ascend);
        assert_eq!(link.remote_pid(), peer.child.id());
        let descs: Vec<TransferDesc<'_>> = (0..600u64)
            .map(|i| {
                let off = (i * 1000) as usize;
                TransferDesc::new(
                    src.range(off..off + 1000).unwrap(),
                    link.remote(peer.addr + 4096 + i * 1000, 1000).unwrap(),
                )
            })
            .collect();
        link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
        assert_eq!(peer.sum(4096, data.len()), format!("{:016x}", fnv1a(&data)));

        let remote = link.remote(peer.addr, size as u64).unwrap();
        link.transfer_sync(
            TransferOp::Read,
            &[TransferDesc::new(dst.full(), remote)],
            T,
        )
        .unwrap();
        link.disconnect(T).unwrap();
    }
    // the peer's memory: the seed-7 bytes, with the WRITE in the middle
    let mut want = vec![0u8; size];
    Rng::new(7).fill(&mut want);
    want[4096..4096 + data.len()].copy_from_slice(&data);
    let mut got = vec![0u8; size];
    // read on another thread through a detached context: binding switches contexts there
    let ctx = engine.detach_context();
    std::thread::scope(|s| {
        s.spawn(|| {
            ctx.bind(|tok| dst.read_device(tok, 0, &mut got))
                .unwrap()
                .unwrap();
        });
    });
    assert!(got == want, "READ brought back the peer's bytes");
    let e = src.read_at(0, &mut [0u8; 4]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::UnsupportedMemory {
                mem_type: MemType::Device,
                ..
            }
        ),
        "{e:?}"
    );
    let engine = engine.deactivate();
    let buf: DeviceBuffer = engine.deregister(src).unwrap();
    let mut back = vec![0u8; 16];
    engine
        .with_context(|ctx| buf.read(ctx, 0, &mut back))
        .unwrap()
        .unwrap();
    assert_eq!(back, data[..16]);
    drop(buf);
    let _ = engine.finalize();
    drop(dst); // its registration is released with the last handle
    let peer_name = peer.name.clone();
    peer.quit();

    // the recorded sequence, against HIXL's
    let log = d.log_lines();
    let set = first(&log, "aclrtSetDevice ");
    let malloc = first(&log, "aclrtMalloc ");
    assert!(first(&log, "aclInit") < set && set < malloc, "{log:#?}");
    let mallocs: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("aclrtMalloc "))
        .collect();
    assert_eq!(mallocs.len(), 2);
    assert!(
        mallocs
            .iter()
            .all(|l| l.starts_with(&format!("aclrtMalloc size={size} policy=1 "))),
        "HUGE_ONLY: {mallocs:#?}"
    );
    let regs: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("HcclRegisterGlobalMem ") && l.ends_with("rc=0"))
        .collect();
    assert_eq!(regs.len(), 2, "one registration per region: {regs:#?}");
    assert!(regs.iter().all(|l| l.contains("type=0")), "{regs:#?}");
    let init = first(
        &log,
        "HcclCommInitClusterInfoMemConfig rank=1 nranks=2 device_ip=10.20.0.1",
    );
    let bind = first(&log, "HcclCommBindMem ");
    let prep = first(&log, "HcclCommPrepare ");
    assert!(init < bind && bind < prep, "{log:#?}");
    assert!(
        log[init].contains(&format!(" name=hixl_127.0.0.1_{peer_name} ")),
        "HIXL's comm name: {}",
        log[init]
    );
    // the double maps logical device 0 to physical 10: the rank table carries the physical id
    assert!(
        log[init].contains(" table=1.0 device_id=10 "),
        "physical id: {}",
        log[init]
    );
    assert!(
        log.iter()
            .any(|l| l == "aclrtGetPhyDevIdByLogicDevId logic=0 phy=10 rc=0"),
        "{log:#?}"
    );
    let puts = calls(&log, "HcclBatchPut ");
    assert_eq!(
        puts,
        [
            "HcclBatchPut rank=0 num=256 rc=0",
            "HcclBatchPut rank=0 num=256 rc=0",
            "HcclBatchPut rank=0 num=88 rc=0"
        ]
    );
    assert!(
        log.iter().any(|l| l == "HcclBatchGet rank=0 num=1 rc=0"),
        "{log:#?}"
    );
    let syncs = log
        .iter()
        .filter(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout ") && l.ends_with("rc=0"))
        .count();
    assert_eq!(syncs, 2, "one stream sync per transfer");
    let switches = log
        .iter()
        .filter(|l| l.starts_with("aclrtSetCurrentContext ") && l.ends_with("rc=0"))
        .count();
    assert!(switches >= 1, "the detached context was bound: {log:#?}");
    let ctx_of = |l: &str| {
        l.split_whitespace()
            .find(|w| w.starts_with("ctx="))
            .map(str::to_owned)
    };
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("aclrtSetCurrentContext "))
            .find_map(|l| ctx_of(l)),
        ctx_of(&log[set]),
        "the engine's context (from aclrtSetDevice) was bound on the other thread"
    );
    assert!(
        log.iter().any(|l| l.starts_with("HcclCommDestroy ")),
        "{log:#?}"
    );
    let dereg = log
        .iter()
        .filter(|l| l.starts_with("HcclDeregisterGlobalMem ") && l.ends_with("rc=0"))
        .count();
    assert_eq!(dereg, 2, "{log:#?}");
    let plog = std::fs::read_to_string(&peer_log).unwrap_or_default();
    assert!(
        plog.lines().any(|l| l
            .starts_with("HcclCommInitClusterInfoMemConfig rank=0 nranks=2 device_ip=10.20.0.2")),
        "{plog}"
    );
}

/// A stream-sync timeout is HIXL's TIMEOUT (103901) and poisons the link: later transfers are
/// NOT_CONNECTED until the link is replaced; a new link works.
#[test]
fn sync_timeout_is_timeout_and_poisons_the_link() {
    let Some(d) = Double::new("timeout") else {
        return;
    };
    let (client, creg, server, saddr) = pair(&d, 1 << 20);
    let link = client.connect_timeout(server.name(), T).unwrap();
    assert_eq!(link.transport(), TransportKind::Ascend);
    let desc = || {
        TransferDesc::new(
            creg.range(0..4096).unwrap(),
            link.remote(saddr, 4096).unwrap(),
        )
    };
    link.transfer_sync(TransferOp::Write, &[desc()], T).unwrap();
    d.control("fail", Some("sync_timeout"));
    let e = link
        .transfer_sync(TransferOp::Write, &[desc()], Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { op: "WRITE", .. }), "{e:?}");
    assert_eq!(e.status(), Status::TIMEOUT);
    assert_eq!(e.status().code(), 103_901);
    d.control("fail", None);
    assert!(link.is_broken());
    let e = link
        .transfer_sync(TransferOp::Read, &[desc()], T)
        .unwrap_err();
    assert!(matches!(e, Error::NotConnected { .. }), "{e:?}");
    assert_eq!(e.status().code(), 103_902);
    let e = link
        .transfer_async(TransferOp::Read, &[desc()], hixl::TransferArgs::default())
        .expect_err("poisoned");
    assert_eq!(e.status(), Status::NOT_CONNECTED);
    let _ = link.disconnect(T);
    // reconnecting replaces the poisoned link
    let link = client.connect_timeout(server.name(), T).unwrap();
    let d2 = TransferDesc::new(
        creg.range(0..4096).unwrap(),
        link.remote(saddr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d2], T).unwrap();
    drop(link);
    let log = d.log_lines();
    let timed_out = log
        .iter()
        .position(|l| {
            l.starts_with("aclrtSynchronizeStreamWithTimeout ") && l.ends_with("rc=507046")
        })
        .unwrap_or_else(|| panic!("no sync timeout in {log:#?}"));
    // item 8: the failed transfer aborted the stream (the timed-out copy stays queued until
    // then), and the communicator was unbound and destroyed right after, not at drop time
    let comm = client_comm(&log);
    let abort = first(&log, "aclrtStreamAbort ");
    let unbind = first(&log, &format!("HcclCommUnbindMem comm={comm} "));
    let destroy = first(&log, &format!("HcclCommDestroy comm={comm} "));
    assert!(
        timed_out < abort && abort < unbind && unbind < destroy,
        "timeout {timed_out}, abort {abort}, unbind {unbind}, destroy {destroy}: {log:#?}"
    );
    assert!(log[abort].ends_with(" dropped=1 rc=0"), "{}", log[abort]);
    assert!(log[unbind].ends_with("rc=0") && log[destroy].ends_with("rc=0"));
    assert!(
        !log[timed_out + 1..unbind]
            .iter()
            .any(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout ")),
        "no second wait for a drain: {log:#?}"
    );
    let reconnect = log
        .iter()
        .rposition(|l| l.starts_with("HcclCommInitClusterInfoMemConfig rank=1 "))
        .unwrap();
    assert!(destroy < reconnect, "torn down before the reconnect");
    // nothing leaked: the region is free again
    let client = client.deactivate();
    let buf = client.deregister(creg).expect("no link holds the region");
    drop(buf);
    drop(server);
}

/// The `comm=` of the first client-side (rank 1) communicator in a double's log.
fn client_comm(log: &[String]) -> String {
    let init = first(log, "HcclCommInitClusterInfoMemConfig rank=1 ");
    log[init]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("comm="))
        .unwrap_or_else(|| panic!("no comm= in {:?}", log[init]))
        .to_owned()
}

/// A link whose stream cannot be aborted after a failed transfer is not torn down under the
/// copies it may still run: its communicator, stream and regions are leaked, so the memory is
/// never unbound, deregistered or freed (deregistering the region reports it busy).
#[test]
fn an_unabortable_link_keeps_its_memory() {
    let Some(d) = Double::new("drain") else {
        return;
    };
    let (client, creg, server, saddr) = pair(&d, 1 << 20);
    let link = client.connect_timeout(server.name(), T).unwrap();
    d.control("fail", Some("sync_timeout,aclrtStreamAbort"));
    let desc = TransferDesc::new(
        creg.range(0..4096).unwrap(),
        link.remote(saddr, 4096).unwrap(),
    );
    let e = link
        .transfer_sync(TransferOp::Read, &[desc], Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(e.status(), Status::TIMEOUT, "{e:?}");
    // the abort right after the failure and the abort at disconnect fail as well
    let _ = link.disconnect(T);
    d.control("fail", None);
    let client = client.deactivate();
    let r = client.deregister(creg).unwrap_err();
    assert!(
        matches!(r.error, Error::RegionBusy { .. }),
        "the leaked link still holds the region: {:?}",
        r.error
    );
    let log = d.log_lines();
    let comm = client_comm(&log);
    assert!(
        !log.iter().any(|l| l.contains(&format!("comm={comm} "))
            && (l.starts_with("HcclCommUnbindMem ") || l.starts_with("HcclCommDestroy "))),
        "the unaborted communicator was torn down: {log:#?}"
    );
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("aclrtStreamAbort ") && l.ends_with("rc=500000"))
            .count(),
        2,
        "the abort after the failure, and the one at disconnect: {log:#?}"
    );
    drop(server);
}

/// A failed HCCL call keeps its native code (FAILED) and poisons the link too.
#[test]
fn hccl_failure_keeps_the_native_code() {
    let Some(d) = Double::new("native") else {
        return;
    };
    let (client, creg, server, saddr) = pair(&d, 1 << 20);
    let link = client.connect_timeout(server.name(), T).unwrap();
    d.control("fail", Some("HcclBatchGet=4"));
    let desc = TransferDesc::new(creg.range(0..64).unwrap(), link.remote(saddr, 64).unwrap());
    let e = link
        .transfer_sync(TransferOp::Read, &[desc], T)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Native {
                library: "hccl",
                call: "HcclBatchGet",
                code: 4,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::FAILED);
    d.control("fail", None);
    assert!(link.is_broken());
}

/// An allocation failure is a typed error with ACL's code; a host-only engine refuses device
/// memory; an engine's token does not work for another engine.
#[test]
fn malloc_failure_and_refusals_are_typed() {
    let Some(d) = Double::new("malloc") else {
        return;
    };
    let engine = Hixl::initialize("127.0.0.1", d.options("10.40.0.1"))
        .unwrap()
        .into_registered();
    d.control("fail", Some("aclrtMalloc"));
    let e = engine
        .with_context(|ctx| engine.alloc_device(ctx, 2 << 20))
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Native {
                library: "acl",
                call: "aclrtMalloc",
                code: 207_001,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status().code(), 503_900);
    d.control("fail", None);
    let buf = engine
        .with_context(|ctx| engine.alloc_device(ctx, 2 << 20))
        .unwrap()
        .unwrap();
    // device memory needs the token path
    let r = engine.register(buf).unwrap_err();
    assert!(
        matches!(r.error, Error::UnsupportedMemory { .. }),
        "{:?}",
        r.error
    );
    let host = Hixl::initialize("127.0.0.1", Options::default())
        .unwrap()
        .into_registered();
    let r = host
        .with_context(|ctx| engine.register_device(ctx, r.value))
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            Error::ForeignHandle {
                what: "context token",
                ..
            }
        ),
        "{:?}",
        r.error
    );
    let r = host
        .with_context(|ctx| host.register_device(ctx, r.value))
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(r.error, Error::UnsupportedMemory { .. }),
        "{:?}",
        r.error
    );
    assert_eq!(r.error.status(), Status::UNSUPPORTED);
}
