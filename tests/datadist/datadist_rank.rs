//! LLM-DataDist's link by an explicit rank table (`DataDist::link_comm`,
//! `query_register_mem_status`, `unlink_comm`: the Python package's `link`, as vllm-ascend's
//! and omni-infer's connectors call it), on the ACL/HCCL test double: two processes, each an
//! instance on its own (double) device, given a generated rank table of two ranks; HCCL's
//! rendezvous (`HcclCommInitClusterInfoMemConfig`, `HcclCommPrepare`, `HcclExchangeMemDesc`),
//! the status polled to OK, blocks of random device memory pulled and pushed both ways and
//! compared byte for byte, unlinked; every bad input's exact status, a peer that never joins
//! (FAILED by `llm.LinkTotalTime`), and the 512-communicator limit.
//!
//! Both instances run in child processes (this test binary run again with
//! `datadist_rank::child` as its filter and the role in the environment), so that each loads its
//! own double with its own settings. Without a system C compiler (to build the double) the tests
//! say why and pass.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use hixl::datadist::{
    CacheDesc, CacheKey, CacheKind, DataDist, DataType, Layers, LlmStatus, Placement,
    RegisterMemStatus, RemoteCache, Role,
};
use hixl::testkit::Rng;

const TENSORS: usize = 2;
const BLOCKS: usize = 8;
const BLOCK: usize = 512;

// ---------------------------------------------------------------------------------------------
// the parent's side
// ---------------------------------------------------------------------------------------------

/// The double built for this test process, its announce directory and logs.
struct Double {
    so: PathBuf,
    dir: PathBuf,
    base: PathBuf,
}

impl Double {
    fn new(tag: &str) -> Option<Double> {
        if Command::new("cc").arg("--version").output().is_err() {
            eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
            return None;
        }
        let base = std::env::temp_dir().join(format!("hixl-dd-rank-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let so = hixl::testkit::build_ascend_double(&base).expect("build the test double");
        let dir = base.join("ranks");
        std::fs::create_dir_all(&dir).unwrap();
        // the double uses the directory only while it is private
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        Some(Double { so, dir, base })
    }

    fn log(&self, cluster: u64) -> PathBuf {
        self.base.join(format!("cluster{cluster}.log"))
    }
}

impl Drop for Double {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// An instance in a child process, driven line by line.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    /// Cluster `cluster` on device `device`; `listen`: `llm.ListenIpInfo` (none: the instance
    /// listens for rank-table links on its rank's server_id); `total`: `llm.LinkTotalTime`.
    fn spawn(d: &Double, cluster: u64, device: u32, listen: Option<&str>, total: u32) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "datadist_rank::child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("HIXL_DD_RANK_CHILD", format!("{cluster},{device},{total}"))
            .env("HIXL_DD_RANK_LISTEN", listen.unwrap_or(""))
            .env("HIXL_ACL_LIB", &d.so)
            .env("HIXL_HCCL_LIB", &d.so)
            .env("HIXL_ASCEND_DOUBLE_DIR", &d.dir)
            .env("HIXL_ASCEND_DOUBLE_LOG", d.log(cluster))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
        };
        assert_eq!(p.answer(), ["READY"]);
        p
    }

    /// The next answer line (the words after "DD ").
    fn answer(&mut self) -> Vec<String> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the child ended without answering");
            if let Some(rest) = line.trim_end().strip_prefix("DD ") {
                return rest.split(' ').map(str::to_owned).collect();
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> Vec<String> {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.answer()
    }

    /// Sends `cmd` and returns the status of its answer (its first word).
    fn status(&mut self, cmd: &str) -> u32 {
        let a = self.ask(cmd);
        a[0].parse().unwrap_or_else(|_| panic!("{cmd}: {a:?}"))
    }

    fn quit(mut self) {
        writeln!(self.stdin, "quit").unwrap();
        let s = self.child.wait().unwrap();
        assert!(s.success(), "the child exited with {s}");
    }
}

/// A version 1.0 rank table: rank i on physical device `10 + i` (the double maps logical
/// device i to physical i + 10) of server 127.0.0.1, with device IP `<prefix>.<i + 1>`.
fn rank_table(ranks: u32, prefix: &str) -> String {
    let devices: Vec<serde_json::Value> = (0..ranks)
        .map(|i| {
            serde_json::json!({"device_id": (10 + i).to_string(),
                "device_ip": format!("{prefix}.{}", i + 1), "rank_id": i.to_string()})
        })
        .collect();
    serde_json::json!({"version": "1.0", "server_count": "1", "status": "completed",
        "server_list": [{"server_id": "127.0.0.1", "device": devices, "host_nic_ip": "reserve"}]})
    .to_string()
}

const SUCCESS: u32 = LlmStatus::LLM_SUCCESS.code();

/// Two instances link by the rank table (one with a listen address of its own, one that
/// listens on its rank's server_id for this), poll to OK, pull and push blocks of device
/// memory both ways (checked byte for byte, and the blocks not moved unchanged), unlink.
#[test]
fn two_processes_link_by_rank_table_and_move_device_blocks() {
    let Some(d) = Double::new("pair") else {
        return;
    };
    let table = rank_table(2, "10.91.0");
    let mut a = Peer::spawn(&d, 0, 0, None, 10);
    let mut b = Peer::spawn(&d, 1, 1, Some("127.0.0.1:0"), 10);
    let start = Instant::now();
    assert_eq!(
        a.ask(&format!("link vllm_p0_d1 0:0,1:1 {table}")),
        ["0", "1"]
    );
    assert_eq!(
        b.ask(&format!("link vllm_p0_d1 0:0,1:1 {table}")),
        ["0", "1"]
    );
    assert_eq!(a.ask("wait 1")[..2], ["0", "0"], "OK");
    assert_eq!(b.ask("wait 1")[..2], ["0", "0"], "OK");
    let linked = start.elapsed();
    assert_eq!(a.ask("query 1"), ["0", "0"]);

    // the decoder pulls blocks 1..=3 of the prompt's (one run) and 6 into 0
    assert_eq!(b.status("pull 0 1,2,3,6 1,2,3,0"), SUCCESS);
    assert_eq!(b.ask("check 0 1,2,3,6 1,2,3,0"), ["OK"]);
    assert_eq!(
        b.ask("check 1 4,5,6,7 4,5,6,7"),
        ["OK"],
        "the others unchanged"
    );
    // the prompt pushes its blocks 5..=7 into the decoder's 4..=6
    assert_eq!(a.status("push 1 5,6,7 4,5,6"), SUCCESS);
    assert_eq!(b.ask("check 0 5,6,7 4,5,6"), ["OK"]);
    assert_eq!(b.ask("check 1 7 7"), ["OK"]);
    // and pulls the other way (the decoder's block 7 is the only one still its own)
    assert_eq!(a.status("pull 1 7 0"), SUCCESS);
    assert_eq!(a.ask("check 1 7 0"), ["OK"]);
    assert_eq!(a.ask("check 0 1,2,3,4,5,6,7 1,2,3,4,5,6,7"), ["OK"]);

    assert_eq!(a.status("unlink 1"), SUCCESS);
    assert_eq!(b.status("unlink 1"), SUCCESS);
    let not_yet = LlmStatus::LLM_NOT_YET_LINK.code();
    assert_eq!(a.status("query 1"), not_yet);
    assert_eq!(a.status("unlink 1"), not_yet);
    assert_eq!(a.status("pull 1 0 0"), not_yet);
    assert_eq!(b.status("push 0 0 0"), not_yet);

    // linked again under the same name, after the unlink: a new comm, id 2
    assert_eq!(
        a.ask(&format!("link vllm_p0_d1 0:0,1:1 {table}")),
        ["0", "2"]
    );
    assert_eq!(
        b.ask(&format!("link vllm_p0_d1 0:0,1:1 {table}")),
        ["0", "2"]
    );
    assert_eq!(a.ask("wait 2")[..2], ["0", "0"]);
    assert_eq!(b.ask("wait 2")[..2], ["0", "0"]);
    assert_eq!(b.status("pull 0 2 7"), SUCCESS);
    assert_eq!(b.ask("check 0 2 7"), ["OK"]);
    a.quit(); // finalize unlinks
    b.quit();

    // what HCCL was asked, in the prompt's process
    let log = std::fs::read_to_string(d.log(0)).unwrap();
    let has = |s: &str| log.lines().any(|l| l.contains(s));
    assert!(
        has("HcclCommInitClusterInfoMemConfig rank=0 nranks=2 device_ip=10.91.0.1 name=vllm_p0_d1"),
        "{log}"
    );
    assert!(has("HcclCommPrepare"), "{log}");
    assert!(has("rank=0 remote=1 num=1 got=1 timeout=10 rc=0"), "{log}");
    // both of its communicators (made twice under the name) destroyed, by unlink and finalize
    let ours: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("name=vllm_p0_d1 ") && l.ends_with("rc=0"))
        .filter_map(|l| l.split(" comm=").nth(1)?.split(' ').next())
        .collect();
    assert_eq!(ours.len(), 2, "{log}");
    for c in ours {
        assert!(
            has(&format!("HcclCommDestroy comm={c} bound=0 rc=0")),
            "{c}: {log}"
        );
    }
    eprintln!("linked by the rank table in {linked:?}");
}

/// Every bad input's status; a peer that never joins, a peer given the own rank or a rank not
/// in the table: FAILED in the query; the 512-communicator limit.
#[test]
fn bad_inputs_a_peer_that_never_joins_and_the_comm_limit() {
    // before initialize: LLM_FAILED, as every call
    let dd = DataDist::new(0, Role::Prompt);
    let failed = LlmStatus::LLM_FAILED;
    assert_eq!(
        dd.link_comm("x", &[(0, 0), (1, 1)], "{}")
            .unwrap_err()
            .status,
        failed
    );
    assert_eq!(dd.query_register_mem_status(1).unwrap_err().status, failed);
    assert_eq!(dd.unlink_comm(1).unwrap_err().status, failed);

    let Some(d) = Double::new("bad") else {
        return;
    };
    let table = rank_table(2, "10.92.0");
    let mut c = Peer::spawn(&d, 0, 0, None, 1);
    let param = LlmStatus::LLM_PARAM_INVALID.code();
    let link_failed = LlmStatus::LLM_LINK_FAILED.code();
    let not_yet = LlmStatus::LLM_NOT_YET_LINK.code();
    assert_eq!(c.status("query 99"), not_yet);
    assert_eq!(c.status("unlink 99"), not_yet);
    assert_eq!(
        c.status(&format!("link - 0:0,1:1 {table}")),
        param,
        "empty name"
    );
    let long = "n".repeat(128);
    assert_eq!(c.status(&format!("link {long} 0:0,1:1 {table}")), param);
    assert_eq!(
        c.status(&format!("link x 1:0,2:1 {table}")),
        param,
        "own cluster missing"
    );
    assert_eq!(
        c.status(&format!("link x 0:0,0:1 {table}")),
        param,
        "a cluster twice"
    );

    // without llm.ListenIpInfo the instance listens on its rank's server_id: not an address
    let by_name = table.replace("\"127.0.0.1\"", "\"node-a\"");
    assert_eq!(c.status(&format!("link x 0:0,1:1 {by_name}")), link_failed);

    // a peer that never joins: PREPARING, then FAILED once llm.LinkTotalTime (1 s) passed
    let a = c.ask(&format!("link lonely 0:0,1:1 {table}"));
    assert_eq!(a, ["0", "1"]);
    let w = c.ask("wait 1");
    assert_eq!(w[..2], ["0", "2"], "FAILED");
    let waited: u64 = w[2].parse().unwrap();
    assert!((900..8000).contains(&waited), "FAILED after {waited} ms");
    assert_eq!(c.status("pull 1 0 0"), not_yet);
    // the name of a live comm: HCCL refuses it
    assert_eq!(
        c.status(&format!("link lonely 0:0,1:1 {table}")),
        link_failed
    );
    assert_eq!(c.status("unlink 1"), SUCCESS);

    // this cluster's rank not in the table, a table HCCL cannot read: LLM_LINK_FAILED now
    assert_eq!(c.status(&format!("link x 0:5,1:1 {table}")), link_failed);
    assert_eq!(c.status("link x 0:0,1:1 {\"version\":"), link_failed);
    // a peer given this cluster's own rank, or a rank not in the table: FAILED, at once
    for (map, id) in [("0:0,1:0", 2), ("0:0,1:7", 3)] {
        let a = c.ask(&format!("link y{id} {map} {table}"));
        assert_eq!(a, ["0", &id.to_string()]);
        let w = c.ask(&format!("wait {id}"));
        assert_eq!(w[..2], ["0", "2"], "{map}: FAILED");
        assert!(
            w[2].parse::<u64>().unwrap() < 900,
            "{map}: FAILED at once, not by the timeout"
        );
        assert_eq!(c.status(&format!("unlink {id}")), SUCCESS);
    }

    // 512 communicators at most: the 513th is LLM_PARAM_INVALID
    assert_eq!(
        c.ask(&format!("many 512 {table}")),
        ["512", &param.to_string()]
    );
    c.quit();
}

// ---------------------------------------------------------------------------------------------
// the child's side
// ---------------------------------------------------------------------------------------------

/// The bytes of block `b` of tensor `t` of cluster `cluster`'s cache, as registered.
fn block_of(cluster: u64, t: usize, b: usize) -> Vec<u8> {
    let mut all = vec![0u8; BLOCKS * BLOCK];
    Rng::new(1000 + cluster * 10 + t as u64).fill(&mut all);
    all[b * BLOCK..(b + 1) * BLOCK].to_vec()
}

type MallocFn = unsafe extern "C" fn(*mut *mut u8, usize, u32) -> i32;
type MemcpyFn = unsafe extern "C" fn(*mut u8, usize, *const u8, usize, i32) -> i32;

/// The double's ACL calls the child uses for device memory.
struct Acl {
    malloc: MallocFn,
    memcpy: MemcpyFn,
}

const H2D: i32 = 1;
const D2H: i32 = 2;

impl Acl {
    fn load(so: &Path) -> Acl {
        use std::ffi::CString;
        let path = CString::new(so.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: dlopen of the double (already loaded by the engine: the same object); the
        // handle is kept for the process's life.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null());
        // SAFETY: valid handle, NUL-terminated names; the double declares `aclError
        // aclrtMalloc(void **, size_t, aclrtMemMallocPolicy)` and `aclError aclrtMemcpy(void *,
        // size_t, const void *, size_t, aclrtMemcpyKind)`.
        unsafe {
            let m = libc::dlsym(h, c"aclrtMalloc".as_ptr());
            let c = libc::dlsym(h, c"aclrtMemcpy".as_ptr());
            assert!(!m.is_null() && !c.is_null());
            Acl {
                malloc: std::mem::transmute::<*mut libc::c_void, MallocFn>(m),
                memcpy: std::mem::transmute::<*mut libc::c_void, MemcpyFn>(c),
            }
        }
    }
}

/// The child: an instance of cluster `HIXL_DD_RANK_CHILD`'s, answering commands on stdin.
#[test]
fn child() {
    let Ok(spec) = std::env::var("HIXL_DD_RANK_CHILD") else {
        return; // run by the parent only
    };
    let spec: Vec<u64> = spec.split(',').map(|v| v.parse().unwrap()).collect();
    let (cluster, device, total) = (spec[0], spec[1], spec[2]);
    let listen = std::env::var("HIXL_DD_RANK_LISTEN").unwrap_or_default();
    let so = PathBuf::from(std::env::var_os("HIXL_ACL_LIB").unwrap());
    let dd = DataDist::new(cluster, Role::Mix);
    let mut opts = vec![
        ("llm.DeviceId".to_owned(), device.to_string()),
        ("llm.SyncKvCacheWaitTime".to_owned(), "10000".to_owned()),
        ("llm.LinkTotalTime".to_owned(), total.to_string()),
    ];
    if !listen.is_empty() {
        opts.push(("llm.ListenIpInfo".to_owned(), listen));
    }
    dd.initialize(&opts).unwrap();
    // device memory on this thread's device (llm.DeviceId made it current), random bytes
    let acl = Acl::load(&so);
    let size = BLOCKS * BLOCK;
    let mut addrs = Vec::new();
    for t in 0..TENSORS {
        let mut p = std::ptr::null_mut();
        // SAFETY: the double's aclrtMalloc writes a pointer to `size` bytes.
        assert_eq!(unsafe { (acl.malloc)(&mut p, size, 0) }, 0);
        let data: Vec<u8> = (0..BLOCKS).flat_map(|b| block_of(cluster, t, b)).collect();
        // SAFETY: `p` holds `size` bytes, `data` as many.
        assert_eq!(
            unsafe { (acl.memcpy)(p, size, data.as_ptr(), size, H2D) },
            0
        );
        addrs.push(p as u64);
    }
    let desc = CacheDesc {
        placement: Placement::Device,
        num_tensors: TENSORS as u32,
        data_type: DataType::INT8,
        shape: vec![BLOCKS as i64, BLOCK as i64],
    };
    let key = CacheKey {
        req_id: u64::MAX,
        model_id: 0,
    };
    // SAFETY: the tensors are never freed (the process ends with them), and read only between
    // transfers (the parent's commands come one at a time).
    let cache = unsafe { dd.register_cache(&desc, &addrs, CacheKind::Blocks, 0, &[key]) }.unwrap();
    let code = |r: Result<(), hixl::datadist::Error>| match r {
        Ok(()) => SUCCESS,
        Err(e) => {
            eprintln!("child {cluster}: {}", e.message);
            e.status.code()
        }
    };
    let list = |s: &str| -> Vec<u64> { s.split(',').map(|v| v.parse().unwrap()).collect() };
    // on a line of its own (libtest printed "test child ... " without a newline)
    println!("\nDD READY");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.splitn(4, ' ').collect();
        let answer = match w[0] {
            "link" => {
                let name = if w[1] == "-" { "" } else { w[1] };
                let map: Vec<(u64, u32)> = w[2]
                    .split(',')
                    .map(|p| {
                        let (c, r) = p.split_once(':').unwrap();
                        (c.parse().unwrap(), r.parse().unwrap())
                    })
                    .collect();
                match dd.link_comm(name, &map, w[3]) {
                    Ok(id) => format!("{SUCCESS} {id}"),
                    Err(e) => {
                        eprintln!("child {cluster}: {}", e.message);
                        e.status.code().to_string()
                    }
                }
            }
            "wait" => {
                let id = w[1].parse().unwrap();
                let start = Instant::now();
                loop {
                    match dd.query_register_mem_status(id) {
                        Ok(RegisterMemStatus::Preparing)
                            if start.elapsed() < Duration::from_secs(30) =>
                        {
                            // polled, as the connectors do (they poll every few seconds)
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Ok(s) => {
                            break format!(
                                "{SUCCESS} {} {}",
                                s.value(),
                                start.elapsed().as_millis()
                            );
                        }
                        Err(e) => break e.status.code().to_string(),
                    }
                }
            }
            "query" => match dd.query_register_mem_status(w[1].parse().unwrap()) {
                Ok(s) => format!("{SUCCESS} {}", s.value()),
                Err(e) => e.status.code().to_string(),
            },
            "unlink" => code(dd.unlink_comm(w[1].parse().unwrap())).to_string(),
            "pull" | "push" => {
                let peer = RemoteCache::Blocks {
                    cluster_id: w[1].parse().unwrap(),
                    model_id: 0,
                };
                let (s, d) = (list(w[2]), list(w[3]));
                let r = if w[0] == "pull" {
                    dd.pull(&peer, cache, 0, -1, Some((&s, &d)), &Layers::all())
                } else {
                    dd.push(cache, &peer, 0, Some((&s, &d)), &Layers::all())
                };
                code(r).to_string()
            }
            "check" => {
                // own block d[i] of each tensor == block s[i] of cluster w[1]'s
                let from: u64 = w[1].parse().unwrap();
                let (s, d) = (list(w[2]), list(w[3]));
                let mut bad = Vec::new();
                for (t, &addr) in addrs.iter().enumerate() {
                    let mut now = vec![0u8; size];
                    // SAFETY: `addr` holds `size` bytes; no transfer runs now.
                    let rc = unsafe {
                        (acl.memcpy)(now.as_mut_ptr(), size, addr as *const u8, size, D2H)
                    };
                    assert_eq!(rc, 0);
                    for (&sb, &db) in s.iter().zip(&d) {
                        let (sb, db) = (sb as usize, db as usize);
                        if now[db * BLOCK..(db + 1) * BLOCK] != block_of(from, t, sb)[..] {
                            bad.push(format!("t{t}b{db}"));
                        }
                    }
                }
                if bad.is_empty() {
                    "OK".to_owned()
                } else {
                    format!("BAD {}", bad.join(","))
                }
            }
            "many" => {
                // comms whose peer is given the own rank (FAILED at once) up to the limit,
                // then one more; each unlinked
                let n: usize = w[1].parse().unwrap();
                let table = &line[line.find('{').unwrap()..];
                let mut ids = Vec::new();
                let mut last = SUCCESS;
                for i in 0..=n {
                    match dd.link_comm(&format!("m{i}"), &[(cluster, 0), (cluster + 1, 0)], table) {
                        Ok(id) => ids.push(id),
                        Err(e) => {
                            last = e.status.code();
                            break;
                        }
                    }
                }
                let made = ids.len();
                for id in ids {
                    assert_eq!(code(dd.unlink_comm(id)), SUCCESS);
                }
                format!("{made} {last}")
            }
            "quit" => break,
            other => panic!("unknown command {other}"),
        };
        println!("DD {answer}");
    }
    dd.finalize();
}
