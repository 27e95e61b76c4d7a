//! The Ascend backend end to end, on the ACL/HCCL ABI test double (`tests/ascend_double`):
//! two processes, device memory, HCCL batch transfers, the recorded call sequence, error
//! mapping and link poisoning. The double is compiled with the system `cc`; without one these
//! tests print why and pass without running.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use hixl::testkit::{Rng, fnv1a};
use hixl::{
    AscendConfig, DeviceBuffer, Error, Hixl, MemType, Options, Status, TransferDesc, TransferOp,
    TransportKind,
};

const T: Duration = Duration::from_secs(10);

/// A private copy of the double (its own globals), its log, and its announce directory.
struct Double {
    so: PathBuf,
    log: PathBuf,
    dir: PathBuf,
}

impl Double {
    /// `None` (with the reason printed) when the double cannot be built here.
    fn new(tag: &str) -> Option<Self> {
        if Command::new("cc").arg("--version").output().is_err() {
            eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
            return None;
        }
        let base = std::env::temp_dir().join(format!("hixl-ascend-it-{}", std::process::id()));
        let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
        let so = base.join(format!("{tag}.so"));
        std::fs::copy(&lib, &so).expect("copy the double");
        let log = base.join(format!("{tag}.log"));
        let dir = base.join(format!("{tag}.dir"));
        let _ = std::fs::remove_file(&log);
        std::fs::create_dir_all(&dir).unwrap();
        let d = Self { so, log, dir };
        d.control("log", Some(&d.log.to_string_lossy()));
        d.control("dir", Some(&d.dir.to_string_lossy()));
        d.control("fail", None);
        d.control("device_ip", None);
        Some(d)
    }

    /// Sets one of the double's settings in this process (`hixl_double_control`).
    fn control(&self, key: &str, value: Option<&str>) {
        use std::ffi::{CString, c_char, c_int};
        let path = CString::new(self.so.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: dlopen of our own copy of the double; the handle is kept (leaked) so the
        // library stays loaded, as the engines load it too.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null(), "dlopen the double");
        // SAFETY: a valid handle and a NUL-terminated symbol name.
        let f = unsafe { libc::dlsym(h, c"hixl_double_control".as_ptr()) };
        assert!(!f.is_null());
        // SAFETY: the double defines `int hixl_double_control(const char *, const char *)`.
        let f: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int =
            unsafe { std::mem::transmute(f) };
        let k = CString::new(key).unwrap();
        let v = value.map(|v| CString::new(v).unwrap());
        // SAFETY: NUL-terminated strings alive for the call; NULL unsets.
        let rc = unsafe {
            f(
                k.as_ptr(),
                v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
            )
        };
        assert_eq!(rc, 0, "unknown double setting {key}");
    }

    fn options(&self, device_ip: &str) -> Options {
        self.options_on(0, Some(device_ip))
    }

    /// Options for logical device `device_id`, with or without a device IP.
    fn options_on(&self, device_id: u32, device_ip: Option<&str>) -> Options {
        Options::default().ascend(AscendConfig {
            acl_lib: Some(self.so.clone()),
            hccl_lib: Some(self.so.clone()),
            device_id,
            device_ip: device_ip.map(|ip| ip.parse().unwrap()),
        })
    }

    fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Double {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.so);
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn first(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:#?}"))
}

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
    let puts: Vec<&str> = log
        .iter()
        .filter(|l| l.starts_with("HcclBatchPut "))
        .map(String::as_str)
        .collect();
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

type Pair = (
    Hixl<hixl::Connected>,
    hixl::Region<DeviceBuffer>,
    Hixl<hixl::Connected>,
    u64,
);

/// Two Ascend engines in this process (the double copies between them with memmove).
fn pair(d: &Double, size: usize) -> Pair {
    pair_with(d, size, d.options("10.30.0.1"), d.options("10.30.0.2"))
}

/// [`pair`] with the client's and the server's options.
fn pair_with(d: &Double, size: usize, client_opts: Options, server_opts: Options) -> Pair {
    let _ = d;
    let server = Hixl::initialize_ephemeral("127.0.0.1", server_opts)
        .unwrap()
        .into_registered();
    let sreg = server
        .with_context(|ctx| {
            let b = server.alloc_device(ctx, size).unwrap();
            server.register_device(ctx, b).unwrap()
        })
        .unwrap();
    let saddr = sreg.addr() as u64;
    std::mem::forget(sreg); // stays registered until the engine is finalized
    let client = Hixl::initialize("127.0.0.1", client_opts)
        .unwrap()
        .into_registered();
    let creg = client
        .with_context(|ctx| {
            let b = client.alloc_device(ctx, size).unwrap();
            client.register_device(ctx, b).unwrap()
        })
        .unwrap();
    (
        client.activate().unwrap(),
        creg,
        server.activate().unwrap(),
        saddr,
    )
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
/// 1.2 with `super_device_id`s and a `super_pod_list` (the double refuses a 1.2 table without
/// them); data still moves.
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
    let puts: Vec<&str> = log
        .iter()
        .filter(|l| l.starts_with("HcclBatchPut "))
        .map(String::as_str)
        .collect();
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

/// Compiles one of the double's C test programs (`tests/ascend_double/<src>`) into `out` with
/// `-Wall -Wextra -Werror` and the link arguments `link`.
fn build_c_program(src: &str, out: &Path, link: &[std::ffi::OsString]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let r = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(root.join("tests/ascend_double").join(src))
        .args(link)
        .output()
        .expect("run cc");
    assert!(r.status.success(), "{r:?}");
}

/// A command for `prog` without the double's settings this process may have inherited.
fn clean_command(prog: &Path) -> Command {
    let mut run = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HIXL_ASCEND_DOUBLE_") {
            run.env_remove(k);
        }
    }
    run
}

/// `tools/ascend-double.sh DIR` builds the double under CANN's library names, and a program
/// written and linked as CANN's users do (`-lacl_rt -lascend_hal`, HIXL's examples' line; no
/// `aclInit`) runs on it with `LD_LIBRARY_PATH` alone: every name is one object, ACL behaves as
/// CANN's where programs depend on it, and two processes (devices 0 and 2, no device IPs) find
/// each other with no `HIXL_ASCEND_DOUBLE_*` variable (`tests/ascend_double/cann_program.c`).
#[test]
fn cann_layout_runs_a_cann_program_with_nothing_set() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = std::env::temp_dir().join(format!("hixl-ascend-cann-{}", std::process::id()));
    let lib = base.join("lib");
    let tmp = base.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = Command::new("bash")
        .arg(root.join("tools/ascend-double.sh"))
        .arg(&lib)
        .output()
        .expect("run tools/ascend-double.sh");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    for name in [
        "libascendcl.so",
        "libhcomm.so",
        "libhccl.so",
        "libascend_hal.so",
    ] {
        let target = std::fs::read_link(lib.join(name)).expect("a symlink");
        assert_eq!(target, Path::new("libacl_rt.so"), "{name}");
        assert!(said.contains(name), "{said}");
    }
    let prog = base.join("cann_program");
    let link: Vec<std::ffi::OsString> = vec!["-L".into(), lib.clone().into()];
    let libs = ["-lacl_rt", "-lascend_hal", "-lpthread", "-ldl"].map(Into::into);
    build_c_program("cann_program.c", &prog, &[link, libs.to_vec()].concat());
    let mut run = clean_command(&prog);
    // a private TMPDIR, so the default directory the processes meet in is this test's own
    let out = run
        .env("LD_LIBRARY_PATH", &lib)
        .env("TMPDIR", &tmp)
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "OK"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let meet = tmp.join(format!("hixl-ascend-ranks-{uid}"));
    let mode = std::fs::metadata(&meet)
        .expect("the default directory was made")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// The double's rule across processes: a one-sided call reaches only remote memory bound to the
/// remote rank's live communicator, as the remote process published it in the announce
/// directory. `tests/ascend_double/remote_ranges.c` forks a server and a client: the server
/// unbinds, binds and prepares again, unbinds under a queued copy, destroys its communicator;
/// the client's calls then fail `HCCL_E_PARA` (its sync 507899 for the queued copy) and the
/// server's memory is unchanged. The published files are gone once both processes end.
#[test]
fn two_processes_reach_only_remote_memory_that_is_bound() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
        return;
    }
    let base = std::env::temp_dir().join(format!("hixl-ascend-remote-{}", std::process::id()));
    let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
    let dir = base.join("announce");
    std::fs::create_dir_all(&dir).unwrap();
    let log = base.join("double.log");
    let _ = std::fs::remove_file(&log);
    let prog = base.join("remote_ranges");
    let link: Vec<std::ffi::OsString> = vec![
        "-L".into(),
        lib.parent().unwrap().into(),
        format!("-l:{}", lib.file_name().unwrap().to_string_lossy()).into(),
        "-lpthread".into(),
    ];
    build_c_program("remote_ranges.c", &prog, &link);
    let mut run = clean_command(&prog);
    let out = run
        .env("LD_LIBRARY_PATH", lib.parent().unwrap())
        .env("HIXL_ASCEND_DOUBLE_DIR", &dir)
        .env("HIXL_ASCEND_DOUBLE_LOG", &log)
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.lines().any(|l| l == "client OK")
            && stdout.lines().any(|l| l == "OK"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    for want in [
        "HcclBatchGet rank=1 num=1 remote_unbound=0 rc=1",
        "HcclBatchPut rank=1 num=1 remote_unbound=0 rc=1",
    ] {
        assert!(lines.iter().any(|l| l == want), "no {want:?} in {lines:#?}");
    }
    assert!(
        lines.iter().any(|l| {
            l.starts_with("aclrtSynchronizeStreamWithTimeout ") && l.ends_with(" ops=1 rc=507899")
        }),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("publish ")),
        "every rewrite of the published ranges succeeded: {lines:#?}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the announce directory: {left:?}");
    let _ = std::fs::remove_dir_all(&base);
}
