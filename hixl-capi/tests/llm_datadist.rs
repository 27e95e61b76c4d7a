//! LLM-DataDist from C++ (`llm_datadist::LlmDataDist`, in `libllm_datadist.so`):
//! `tests/cpp/llm_datadist.cpp`, a program in the style of CANN's LLM-DataDist samples, built
//! with CANN's example flags against `include/llm_datadist/llm_datadist.h` and linked with
//! `-lllm_datadist` (device memory: `-lacl_rt -lascend_hal` too, the ACL/HCCL double that
//! `tools/ascend-double.sh` builds), run as a prompt and a decoder process, with device memory
//! and with host memory, with `llm.TransferBackend=hixl` and without. Every call's exact status
//! is checked, and every byte moved is compared with the random data it came from:
//!
//! - the decoder pulls blocks and a batch from the prompt, and blocks and a batch of chosen
//!   layers into other layers; pushes blocks layer by layer and a batch of two layers into the
//!   prompt's cache;
//! - the roles switch (the decoder listens on a new address, the prompt links to it and pushes
//!   and pulls the other way), as CANN's switch-roles samples;
//! - bad inputs: calls before `Initialize` (`LLM_FAILED`), `Initialize` without `llm.DeviceId`,
//!   a pull before the link (`LLM_NOT_YET_LINK`), a second link (`LLM_ALREADY_LINK`), unknown
//!   remote and local caches and a cache registered after the link's table was fetched
//!   (`LLM_KV_CACHE_NOT_EXIST`), blocks and batches outside a cache, reversed or oversized layer
//!   ranges, sizes, list lengths, the own cluster, a push's argument checks
//!   (`LLM_PARAM_INVALID`), a new listen address while linked (`LLM_EXIST_LINK`), the four calls
//!   CANN's C++ API does not implement (`LLM_FEATURE_NOT_ENABLED`); the bytes a refused call
//!   names are untouched.
//!
//! And the library exports `llm_datadist::LlmDataDist`'s methods by CANN's mangled names.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

// LLM-DataDist's status codes (llm_datadist.h)
const SUCCESS: u64 = 0;
const FAILED: u64 = 0xFFFF_FFFF;
const KV_CACHE_NOT_EXIST: u64 = 0x5010_B002;
const PARAM_INVALID: u64 = 0x5010_B005;
const NOT_YET_LINK: u64 = 0x5010_B007;
const ALREADY_LINK: u64 = 0x5010_B008;
const EXIST_LINK: u64 = 0x5010_B018;
const FEATURE_NOT_ENABLED: u64 = 0x5010_B019;

/// Bytes of one block (and batch) of each tensor: int32 [8, 64] has 8 of 256.
const BLOCK: u64 = 256;
const TENSORS: u64 = 4;

/// `llm_datadist::LlmDataDist`'s methods by the mangled names CANN's library exports.
const EXPORTED: &[&str] = &[
    "_ZN12llm_datadist11LlmDataDistC1EmNS_7LlmRoleE",
    "_ZN12llm_datadist11LlmDataDistD1Ev",
    "_ZN12llm_datadist11LlmDataDist10InitializeERKSt3mapIN2ge12AscendStringES3_St4lessIS3_ESaISt4pairIKS3_S3_EEE",
    "_ZN12llm_datadist11LlmDataDist8FinalizeEv",
    "_ZN12llm_datadist11LlmDataDist7SetRoleENS_7LlmRoleERKSt3mapIN2ge12AscendStringES4_St4lessIS4_ESaISt4pairIKS4_S4_EEE",
    "_ZN12llm_datadist11LlmDataDist15LinkLlmClustersERKSt6vectorINS_11ClusterInfoESaIS2_EERS1_IjSaIjEEi",
    "_ZN12llm_datadist11LlmDataDist17UnlinkLlmClustersERKSt6vectorINS_11ClusterInfoESaIS2_EERS1_IjSaIjEEib",
    "_ZN12llm_datadist11LlmDataDist13AllocateCacheERKNS_9CacheDescERNS_5CacheE",
    "_ZN12llm_datadist11LlmDataDist15DeallocateCacheEl",
    "_ZN12llm_datadist11LlmDataDist11PullKvCacheERKNS_10CacheIndexERKNS_5CacheEjlRKNS_15KvCacheExtParamE",
    "_ZN12llm_datadist11LlmDataDist12PullKvBlocksERKNS_10CacheIndexERKNS_5CacheERKSt6vectorImSaImEESB_RKNS_15KvCacheExtParamE",
    "_ZN12llm_datadist11LlmDataDist11CopyKvCacheERKNS_5CacheES3_jjml",
    "_ZN12llm_datadist11LlmDataDist12CopyKvBlocksERKNS_5CacheES3_RKSt6vectorImSaImEERKS4_IS6_SaIS6_EE",
    "_ZN12llm_datadist11LlmDataDist11PushKvCacheERKNS_5CacheERKNS_10CacheIndexEjlRKNS_15KvCacheExtParamE",
    "_ZN12llm_datadist11LlmDataDist12PushKvBlocksERKNS_5CacheERKNS_10CacheIndexERKSt6vectorImSaImEESB_RKNS_15KvCacheExtParamE",
    "_ZN12llm_datadist11LlmDataDist15RegisterKvCacheERKNS_9CacheDescERKSt6vectorImSaImEERKNS_11RegisterCfgERl",
    "_ZN12llm_datadist11LlmDataDist17UnregisterKvCacheEl",
];

#[test]
fn libllm_datadist_exports_llm_datadist() {
    let lib = common::lib_dir().join("libllm_datadist.so");
    let Some(missing) = common::missing_exports(&lib, EXPORTED) else {
        return;
    };
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// One of the two processes: commands on its stdin, answers on its stdout, stderr in a file.
struct Peer {
    role: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
}

impl Peer {
    fn spawn(role: &'static str, mut cmd: Command, stderr: PathBuf) -> (Peer, u16, u64) {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).expect("the stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {role}: {e}"));
        let mut p = Peer {
            role,
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            stderr,
        };
        let ready = p.line();
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert!(
            w.len() == 3 && w[0] == "READY",
            "{role} said {ready:?}; its stderr:\n{}",
            p.stderr()
        );
        let (port, id) = (w[1].parse().unwrap(), w[2].parse().unwrap());
        (p, port, id)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        if self.stdout.read_line(&mut line).unwrap() == 0 {
            let status = self.child.wait();
            panic!(
                "the {} ended ({status:?}); its stderr:\n{}",
                self.role,
                self.stderr()
            );
        }
        line.trim_end().to_owned()
    }

    /// Sends `cmd`; returns its answer.
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{cmd}")
            .unwrap_or_else(|e| panic!("{} gone ({e}); its stderr:\n{}", self.role, self.stderr()));
        self.line()
    }

    /// Sends `cmd` and checks its `STATUS` numbers.
    fn status(&mut self, cmd: &str, want: &[u64]) {
        let got = self.ask(cmd);
        let nums: Vec<u64> = got
            .strip_prefix("STATUS ")
            .unwrap_or_else(|| panic!("{} answered `{cmd}` with {got:?}", self.role))
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(
            nums, want,
            "{}: `{cmd}` (got {:x?}, want {:x?})",
            self.role, nums, want
        );
    }

    /// `cmd`'s first `STATUS` number must be `want`; returns the rest.
    fn status_then(&mut self, cmd: &str, want: u64) -> Vec<u64> {
        let got = self.ask(cmd);
        let nums: Vec<u64> = got
            .strip_prefix("STATUS ")
            .unwrap_or_else(|| panic!("{} answered `{cmd}` with {got:?}", self.role))
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(nums[0], want, "{}: `{cmd}` ({nums:x?})", self.role);
        nums[1..].to_vec()
    }

    /// Its tensor `t`'s bytes `off..off+len` are tensor `src_t` of cluster `src` from `src_off`,
    /// as that cluster filled it.
    fn expect(&mut self, t: u64, off: u64, len: u64, src: u64, src_t: u64, src_off: u64) {
        let cmd = format!("expect {t} {off} {len} {src} {src_t} {src_off}");
        let got = self.ask(&cmd);
        assert_eq!(got, "OK", "{}: `{cmd}`", self.role);
    }

    /// Blocks `b..b+n` of every tensor are the source cluster's same tensor's blocks `sb..`.
    fn expect_blocks(&mut self, b: u64, n: u64, src: u64, sb: u64) {
        for t in 0..TENSORS {
            self.expect(t, b * BLOCK, n * BLOCK, src, t, sb * BLOCK);
        }
    }

    fn quit(&mut self) {
        let bye = self.ask("quit");
        assert_eq!(
            bye,
            "BYE 0",
            "{}; its stderr:\n{}",
            self.role,
            self.stderr()
        );
        self.stdin = None;
        let st = self.child.wait().unwrap();
        assert!(
            st.success(),
            "{}: {st}; its stderr:\n{}",
            self.role,
            self.stderr()
        );
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The program and the double's directory (device memory), built once per memory kind for all
/// the tests of this binary. `None`: skipped (printed why).
fn program(device: bool) -> Option<(PathBuf, Option<PathBuf>)> {
    type Built = OnceLock<Option<(PathBuf, Option<PathBuf>)>>;
    static DEVICE: Built = OnceLock::new();
    static HOST: Built = OnceLock::new();
    let (cell, tag) = if device {
        (&DEVICE, "llm-datadist-device")
    } else {
        (&HOST, "llm-datadist-host")
    };
    cell.get_or_init(|| build(&common::scratch(tag), device))
        .clone()
}

/// Builds the program: `device` with ACL (`-DHIXL_TEST_ACL`, linked with the double), `host`
/// with `-lllm_datadist` alone. `None`: skipped (printed why).
fn build(dir: &Path, device: bool) -> Option<(PathBuf, Option<PathBuf>)> {
    let cxx = common::compiler("c++")?;
    if device && common::compiler("cc").is_none() {
        return None;
    }
    let lib = common::lib_dir();
    if !lib.join("libllm_datadist.so").exists() {
        eprintln!("skipped: no libllm_datadist.so (built only where a C++ compiler is)");
        return None;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let double = if device {
        let d = dir.join("cann");
        common::build_double(&d);
        Some(d)
    } else {
        None
    };
    let exe = dir.join(if device { "dd_device" } else { "dd_host" });
    let asan = common::asan_flags();
    let mut cmd = Command::new(&cxx);
    cmd.args(common::HIXL_EXAMPLE_FLAGS)
        .args(asan)
        .arg("-I")
        .arg(common::include_dir());
    if device {
        cmd.arg("-DHIXL_TEST_ACL")
            .arg("-I")
            .arg(manifest.join("tests/cpp"));
    }
    cmd.arg(manifest.join("tests/cpp/llm_datadist.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg("-lllm_datadist");
    if let Some(d) = &double {
        // CANN's samples' link line
        cmd.arg("-L")
            .arg(d)
            .args(["-lacl_rt", "-lascend_hal", "-lpthread", "-lrt"]);
    }
    let out = cmd.output().expect("run c++");
    assert!(
        out.status.success(),
        "c++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(n) = common::needed(&exe) {
        assert!(n.iter().any(|x| x == "libllm_datadist.so"), "{n:?}");
        assert_eq!(n.iter().any(|x| x == "libacl_rt.so"), device, "{n:?}");
    }
    Some((exe, double))
}

/// A prompt (cluster 0) and a decoder (cluster 1) through the whole flow.
fn prompt_and_decoder(memory: &str, backend: &str) {
    let dir = common::scratch(&format!("llm-datadist-{memory}-{backend}"));
    let device = memory == "device";
    let Some((exe, double)) = program(device) else {
        return;
    };
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ u64::from(std::process::id());
    eprintln!("seed {seed}");
    let lib = common::lib_dir();
    let spawn = |role: &'static str, cluster: &str, device_id: &str| {
        let mut cmd = Command::new(&exe);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HIXL") {
                cmd.env_remove(k);
            }
        }
        let mut path = vec![lib.clone()];
        path.extend(double.clone());
        cmd.env("LD_LIBRARY_PATH", std::env::join_paths(path).unwrap())
            .env("TMPDIR", &tmp)
            .args([cluster, device_id, memory, backend, &seed.to_string()]);
        Peer::spawn(role, cmd, dir.join(format!("{role}.err")))
    };
    let (mut p, p_port, p_cache) = spawn("prompt", "0", "0");
    let (mut d, _d_port, d_cache) = spawn("decoder", "1", "1");
    // cache ids count from 1 per instance (CANN's decoder samples pull the prompt's cache 1)
    assert_eq!((p_cache, d_cache), (1, 1));
    let all = "-1 -1 -1 -1 2";

    // no peer needed: calls before Initialize, the calls CANN's C++ API refuses, argument checks
    d.status(
        "uninit",
        &[
            FAILED,
            FAILED,
            FAILED,
            FAILED,
            FAILED,
            FAILED,
            FAILED,
            FAILED,
            PARAM_INVALID,
            PARAM_INVALID,
        ],
    );
    d.status(
        "misc",
        &[
            FEATURE_NOT_ENABLED,
            FEATURE_NOT_ENABLED,
            FEATURE_NOT_ENABLED,
            FEATURE_NOT_ENABLED,
            SUCCESS,
            PARAM_INVALID,
            PARAM_INVALID,
            PARAM_INVALID,
            SUCCESS,
            PARAM_INVALID,
            PARAM_INVALID,
            PARAM_INVALID,
            PARAM_INVALID,
            PARAM_INVALID,
            PARAM_INVALID,
            PARAM_INVALID,
        ],
    );

    // a pull before the link; then the link, twice
    d.status(
        &format!("pull_blocks 0 1 0 1,2,3 1,2,3 {all} 1"),
        &[NOT_YET_LINK],
    );
    d.status(&format!("link 0 {p_port}"), &[SUCCESS, SUCCESS]);
    d.status(&format!("link 0 {p_port}"), &[ALREADY_LINK, ALREADY_LINK]);

    // pull blocks 1..3 and batch 0 (CANN's pull sample), then chosen layers
    d.status(
        &format!("pull_blocks 0 1 0 1,2,3 1,2,3 {all} 1"),
        &[SUCCESS],
    );
    d.status(&format!("pull_cache 0 1 0 0 -1 {all} 1"), &[SUCCESS]);
    d.expect_blocks(0, 4, 0, 0);
    // the prompt's layer 1 (tensors 2, 3) of block 6 into the decoder's layer 0 of block 4
    d.status("pull_blocks 0 1 0 6 4 1 1 0 0 2 1", &[SUCCESS]);
    for k in 0..2 {
        d.expect(k, 4 * BLOCK, BLOCK, 0, 2 + k, 6 * BLOCK);
        d.expect(2 + k, 4 * BLOCK, BLOCK, 1, 2 + k, 4 * BLOCK); // untouched
    }
    // 100 bytes of the prompt's batch 5, layer 0, into the decoder's batch 6, layer 1
    d.status("pull_cache 0 1 5 6 100 0 0 1 1 2 1", &[SUCCESS]);
    for k in 0..2 {
        d.expect(2 + k, 6 * BLOCK, 100, 0, k, 5 * BLOCK);
        d.expect(
            2 + k,
            6 * BLOCK + 100,
            BLOCK - 100,
            1,
            2 + k,
            6 * BLOCK + 100,
        );
        d.expect(k, 6 * BLOCK, BLOCK, 1, k, 6 * BLOCK);
    }

    // bad pulls on the link: each refused, block 7 untouched
    for (cmd, want) in [
        (format!("pull_blocks 0 9 0 7 7 {all} 1"), KV_CACHE_NOT_EXIST), // no remote cache 9
        (format!("pull_blocks 0 1 0 7 7 {all} 9"), KV_CACHE_NOT_EXIST), // no local cache 9
        (format!("pull_blocks 0 1 0 8 7 {all} 1"), PARAM_INVALID),      // remote block 8 of 8
        (format!("pull_blocks 0 1 0 7 8 {all} 1"), PARAM_INVALID),      // local block 8 of 8
        (format!("pull_blocks 0 1 1 7 7 {all} 1"), PARAM_INVALID),      // batch index for blocks
        (format!("pull_blocks 0 1 0 6,7 7 {all} 1"), PARAM_INVALID),    // lengths differ
        (format!("pull_blocks 0 1 0 - - {all} 1"), PARAM_INVALID),      // no blocks
        (format!("pull_blocks 1 1 0 7 7 {all} 1"), PARAM_INVALID),      // own cluster
        ("pull_blocks 0 1 0 7 7 1 0 1 0 2 1".into(), PARAM_INVALID),    // reversed range
        ("pull_blocks 0 1 0 7 7 0 0 0 0 0 1".into(), PARAM_INVALID),    // 0 tensors per layer
        ("pull_blocks 0 1 0 7 7 2 2 2 2 2 1".into(), PARAM_INVALID),    // layer 2 of 2
        ("pull_blocks 0 1 0 7 7 0 1 0 0 2 1".into(), PARAM_INVALID),    // spans differ
        (format!("pull_cache 0 1 7 7 0 {all} 1"), PARAM_INVALID),       // size 0
        (format!("pull_cache 0 1 7 7 257 {all} 1"), PARAM_INVALID),     // over a batch
        (format!("pull_cache 0 1 8 7 -1 {all} 1"), PARAM_INVALID),      // remote batch 8 of 8
        (format!("pull_cache 0 1 7 8 -1 {all} 1"), PARAM_INVALID),      // local batch 8 of 8
    ] {
        d.status(&cmd, &[want]);
    }
    d.expect_blocks(7, 1, 1, 7);
    // a cache registered after the link's table was fetched is not known to that link
    p.status("register", &[SUCCESS, 2]);
    d.status(
        &format!("pull_blocks 0 2 0 0 0 {all} 1"),
        &[KV_CACHE_NOT_EXIST],
    );

    // pushes over the decoder's link into the prompt's cache: its blocks 5, 7 into blocks 5, 6
    // layer by layer (one tensor each, as CANN's push sample), batch 7 of two layers of two
    // tensors
    for t in 0..TENSORS {
        d.status(
            &format!("push_blocks 0 1 0 5,7 5,6 {t} {t} {t} {t} 1 1 1 0"),
            &[SUCCESS],
        );
    }
    p.expect_blocks(5, 1, 1, 5);
    p.expect_blocks(6, 1, 1, 7);
    d.status("push_cache 0 1 7 7 -1 0 1 0 1 2 1 1 0", &[SUCCESS]);
    p.expect_blocks(7, 1, 1, 7);
    // no range: every layer, as the argument's num_tensors counts them (decoder block 5 →
    // prompt block 4)
    d.status(&format!("push_blocks 0 1 0 5 4 {all} 1 1 4"), &[SUCCESS]);
    p.expect_blocks(4, 1, 1, 5);
    let no_range = format!("push_cache 0 1 0 0 -1 {all} 1 1 0");
    for (cmd, want) in [
        ("push_cache 0 1 0 0 100 0 0 0 0 2 1 1 0", PARAM_INVALID), // size other than -1
        ("push_cache 0 1 0 0 -1 0 0 0 0 2 1 0 0", PARAM_INVALID),  // the argument says host
        (no_range.as_str(), PARAM_INVALID),                        // no range, no num_tensors
        ("push_cache 0 1 0 0 -1 0 1 0 0 2 1 1 0", PARAM_INVALID),  // spans differ
        ("push_blocks 0 1 1 0 0 0 0 0 0 2 1 1 0", PARAM_INVALID),  // batch index for blocks
        ("push_blocks 0 1 0 0 8 0 0 0 0 2 1 1 0", PARAM_INVALID),  // remote block 8 of 8
        ("push_blocks 0 9 0 0 0 0 0 0 0 2 1 1 0", KV_CACHE_NOT_EXIST), // no remote cache 9
        ("push_blocks 0 1 0 0 0 0 0 0 0 2 9 1 0", KV_CACHE_NOT_EXIST), // no local cache 9
        ("push_blocks 5 1 0 0 0 0 0 0 0 2 1 1 0", NOT_YET_LINK),   // cluster 5 is not linked
    ] {
        d.status(cmd, &[want]);
    }
    p.expect_blocks(0, 1, 0, 0);

    // listening elsewhere needs no link; unlinking twice is SUCCESS (CANN's: nothing to unlink)
    d.status_then("set_role 1 1", EXIST_LINK);
    d.status(&format!("unlink 0 {p_port}"), &[SUCCESS, SUCCESS]);
    d.status(&format!("unlink 0 {p_port}"), &[SUCCESS, SUCCESS]);
    d.status(&format!("pull_blocks 0 1 0 1 1 {all} 1"), &[NOT_YET_LINK]);

    // switch roles (CANN's switch-roles samples): the decoder becomes a prompt listening on a
    // new address, the prompt a decoder that links to it, pushes and pulls
    let new_port = d.status_then("set_role 1 1", SUCCESS)[0];
    p.status_then("set_role 2 0", SUCCESS);
    p.status(&format!("link 1 {new_port}"), &[SUCCESS, SUCCESS]);
    // the prompt's layer 0 of blocks 1, 2 into the decoder's layer 1 of blocks 2, 3
    p.status("push_blocks 1 1 0 1,2 2,3 0 0 1 1 2 1 1 0", &[SUCCESS]);
    for k in 0..2 {
        d.expect(2 + k, 2 * BLOCK, 2 * BLOCK, 0, k, BLOCK);
    }
    // and back: the decoder's (pulled-into) block 6 into the prompt's block 6
    p.status(&format!("pull_blocks 1 1 0 6 6 {all} 1"), &[SUCCESS]);
    for k in 0..2 {
        p.expect(2 + k, 6 * BLOCK, 100, 0, k, 5 * BLOCK);
        p.expect(k, 6 * BLOCK, BLOCK, 1, k, 6 * BLOCK);
    }
    p.status(&format!("unlink 1 {new_port}"), &[SUCCESS, SUCCESS]);
    p.status("unlink_force 1", &[SUCCESS, SUCCESS]);

    p.quit();
    d.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prompt_and_decoder_on_device_memory_with_the_hixl_backend() {
    prompt_and_decoder("device", "hixl");
}

#[test]
fn prompt_and_decoder_on_device_memory_with_the_default_backend() {
    prompt_and_decoder("device", "default");
}

#[test]
fn prompt_and_decoder_on_host_memory_with_the_hixl_backend() {
    prompt_and_decoder("host", "hixl");
}

#[test]
fn prompt_and_decoder_on_host_memory_with_the_default_backend() {
    prompt_and_decoder("host", "default");
}
