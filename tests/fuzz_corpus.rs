//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz targets'
//! bodies on the stable toolchain: every input a fuzzer ever kept or found (a crash becomes a
//! file here) is a regression test of `cargo test`. The coverage-guided runs themselves are
//! `cargo +nightly fuzz run <target>` (`.ci/run` runs each for a bounded time).
//!
//! Seeds: valid frames of every kind, written by `seeds()` below when
//! `HIXL_WRITE_FUZZ_SEEDS=1` is set (run it after a wire format change, then commit the files);
//! the `cs_list` seeds (HIXL-CS memory lists, whole and truncated) come from
//! `bodies::cs_list_seeds`.

#[path = "../fuzz/src/bodies.rs"]
mod bodies;

use std::path::{Path, PathBuf};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

#[test]
fn every_corpus_input_replays_cleanly() {
    if std::env::var_os("HIXL_WRITE_FUZZ_SEEDS").is_some_and(|v| v == "1") {
        write_seeds();
    }
    let mut total = 0;
    for (name, body) in bodies::TARGETS {
        let dir = corpus_dir(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no corpus for target {name}");
        for f in &files {
            let data = std::fs::read(f).unwrap();
            let r = std::panic::catch_unwind(|| body(&data));
            assert!(r.is_ok(), "target {name} panicked on {}", f.display());
        }
        total += files.len();
    }
    eprintln!(
        "replayed {total} corpus inputs over {} targets",
        bodies::TARGETS.len()
    );
}

/// Writes a valid encoding of each frame the targets decode into their corpus folders.
fn write_seeds() {
    use hixl::wire::{
        self, DeviceInfo, Hello, Kind, LaneRole, Refuse, TableEntry, UcxInfo, Welcome,
    };
    use hixl::{Access, MemType, TransferOp};
    let payload = |f: Vec<u8>| f[wire::HEADER_LEN..].to_vec();
    let mut seeds: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    let host = wire::HostId::current();
    let hello = Hello {
        role: LaneRole::NewLink,
        instance: 7,
        token: 0,
        name: "127.0.0.1".into(),
        target: "127.0.0.1:26000".into(),
        host,
        nonce: [3; 32],
    };
    let mut out = Vec::new();
    hello.encode(&mut out);
    seeds.push(("handshake", "hello", payload(out.clone())));
    seeds.push(("decode", "hello_frame", out));
    let mut out = Vec::new();
    Refuse {
        status: 103_900,
        reason: "no".into(),
    }
    .encode(&mut out);
    seeds.push(("handshake", "refuse", payload(out)));
    let mut out = Vec::new();
    wire::encode_auth(&mut out, Kind::Challenge, &[&[1; 32], &[2; 32]]);
    seeds.push(("handshake", "challenge", payload(out)));
    let e = |id, addr, len, fd| TableEntry {
        id,
        addr,
        len,
        mem_type: MemType::Host,
        access: Access::ReadWrite,
        fd,
    };
    let welcome = Welcome {
        instance: 9,
        token: 11,
        pid: 1234,
        table: vec![e(0, 0x1000, 4096, -1), e(1, 0x10_0000, 1 << 20, 5)],
        host,
        fence: 6,
        lane_fd: None,
    };
    let mut out = Vec::new();
    welcome.encode(&mut out);
    seeds.push(("table", "welcome", payload(out.clone())));
    seeds.push(("decode", "welcome_frame", out));
    let mut out = Vec::new();
    wire::encode_notify(&mut out, 5, "kv-ready", "layer 12");
    seeds.push(("notify", "notify", payload(out)));
    let mut out = Vec::new();
    wire::encode_done(&mut out, 5, 0, "");
    seeds.push(("notify", "done", payload(out)));
    let mut out = Vec::new();
    let descs = [wire::WireDesc {
        region: 1,
        offset: 64,
        len: 4096,
    }];
    wire::encode_xfer(&mut out, TransferOp::Write, 3, descs.iter().copied());
    seeds.push(("decode", "xfer", payload(out.clone())));
    seeds.push(("decode", "xfer_frame", out));
    let blocks = wire::WireBlocks {
        region: 1,
        offset: 64,
        block: 4096,
        stride: 8192,
    };
    let mut out = Vec::new();
    let idx = [3u32, 0, 7, 7, 1];
    wire::encode_xfer_blocks(
        &mut out,
        TransferOp::Read,
        4,
        &blocks,
        hixl::BlockIndices::U32(&idx),
    );
    seeds.push(("xfer_blocks", "u32", payload(out.clone())));
    seeds.push(("decode", "xfer_blocks_frame", out));
    let mut out = Vec::new();
    let idx = [u64::MAX / 8192, 0];
    wire::encode_xfer_blocks(
        &mut out,
        TransferOp::Write,
        5,
        &blocks,
        hixl::BlockIndices::U64(&idx),
    );
    seeds.push(("xfer_blocks", "u64", payload(out)));
    let mut out = Vec::new();
    DeviceInfo {
        status: 0,
        device_id: 1,
        device_ip: "10.0.0.1".into(),
        host_ip: "127.0.0.1".into(),
        timeout_ms: 1000,
        reason: String::new(),
    }
    .encode(Kind::DeviceHello, &mut out);
    seeds.push(("device", "device_hello", payload(out)));
    let mut out = Vec::new();
    UcxInfo {
        worker: b"worker address".to_vec(),
        rkeys: vec![(0, b"rkey 0".to_vec()), (1, b"rkey 1".to_vec())],
    }
    .encode(&mut out);
    seeds.push(("ucx_info", "ucx_info", payload(out)));
    seeds.push((
        "options",
        "hixl_keys",
        b"AutoConnect=1\nRdmaTrafficClass=132\nRdmaServiceLevel=4\nhixl.ConnectTimeoutMs=500\n"
            .to_vec(),
    ));
    seeds.push((
        "options",
        "global_resource_config",
        b"OPTION_GLOBAL_RESOURCE_CONFIG={\"protocol_desc\":[\"roce:device\"],\"channel_num\":1}\n"
            .to_vec(),
    ));
    seeds.push((
        "options",
        "local_comm_res",
        b"LocalCommRes={\"version\":\"1.3\",\"net_instance_id\":\"x\"}\n".to_vec(),
    ));
    for (name, data) in bodies::cs_list_seeds() {
        seeds.push(("cs_list", name, data));
    }
    for (target, name, data) in seeds {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed_{name}")), data).unwrap();
    }
    for (name, _) in bodies::TARGETS {
        let dir = corpus_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        if std::fs::read_dir(&dir).unwrap().next().is_none() {
            std::fs::write(dir.join("seed_empty"), b"").unwrap();
        }
    }
}
