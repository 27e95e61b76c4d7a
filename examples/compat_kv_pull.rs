//! `examples/python/kv_pull.py` in Rust, on the same engine the Python package drives
//! (`hixl::compat`, caller-managed memory, remote addresses from the peer's table): a prefill
//! process holds 32 layers x 256 blocks x 32 KiB, decode pulls them (one `transfer_async` per
//! layer, or one `transfer_sync` per layer with `--mode sync`) and tells prefill by a
//! notification that it may free the blocks. The Rust side of `bench_compare.py`'s "Python vs
//! Rust" figure: the same calls, without Python.
//!
//! ```text
//! cargo run --release --example compat_kv_pull -- [--mode async|sync] [--transport auto|tcp|same-host] (`cma`: same-host) [--memory caller|engine] [--iters 8] [--json]
//! ```
//!
//! `--memory engine` puts both sides' memory in `alloc_host_mem` (kv_pull.py's default,
//! `Engine.alloc`: a same-host peer maps it); the default `caller` registers `Vec<u8>`s.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hixl::compat::{Hixl, MemDesc, NotifyDesc, TransferArgs, TransferOpDesc};
use hixl::testkit::Rng;
use hixl::{MemType, TransferOp};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    prefill: bool,
    layers: usize,
    blocks: usize,
    block: usize,
    iters: usize,
    warmup: usize,
    sync: bool,
    transport: String,
    json: bool,
    boundary: usize,
    engine_memory: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        prefill: false,
        layers: 32,
        blocks: 256,
        block: 32768,
        iters: 8,
        warmup: 1,
        sync: false,
        transport: "auto".into(),
        json: false,
        boundary: 0,
        engine_memory: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        let mut val = || it.next().ok_or(format!("{f} needs a value"));
        let num = |v: String| v.parse::<usize>().map_err(|e| format!("{e}"));
        match f.as_str() {
            "prefill" => a.prefill = true,
            "decode" => a.prefill = false,
            "--layers" => a.layers = num(val()?)?,
            "--blocks" => a.blocks = num(val()?)?,
            "--block" => a.block = num(val()?)?,
            "--iters" => a.iters = num(val()?)?,
            "--warmup" => a.warmup = num(val()?)?,
            "--mode" => a.sync = val()? == "sync",
            "--transport" => a.transport = val()?,
            "--json" => a.json = true,
            "--boundary" => a.boundary = num(val()?)?,
            "--memory" => a.engine_memory = val()? == "engine",
            _ => return Err(format!("unknown argument {f}")),
        }
    }
    if !a.block.is_multiple_of(8) {
        return Err("--block must be a multiple of 8".into());
    }
    Ok(a)
}

/// The KV cache's contents (as kv_pull.py's `pattern`): distinct 8-byte words.
fn pattern(n: usize) -> Vec<u8> {
    (0..n / 8)
        .flat_map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_ne_bytes())
        .collect()
}

fn same_host(t: &str) -> &'static str {
    match t {
        "tcp" => "off",
        "same-host" | "cma" => "require",
        _ => "auto",
    }
}

fn prefill(a: &Args) -> Res<()> {
    let size = a.layers * a.blocks * a.block;
    let engine = Hixl::new();
    engine.initialize("127.0.0.1:0", [("hixl.SameHost", same_host(&a.transport))])?;
    let mut kv = pattern(size);
    let mem = if a.engine_memory {
        let m = engine.alloc_host_mem(size)?;
        // SAFETY: the engine's mapping of `size` bytes, live while `m` is; no peer is connected
        // yet, so nothing else touches it while it is written.
        unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), size) }.copy_from_slice(&kv);
        Some(m)
    } else {
        let desc = MemDesc {
            addr: kv.as_mut_ptr() as usize,
            len: kv.len(),
            local_only: false,
        };
        // SAFETY: `kv` is neither moved nor dropped nor touched until the engine is finalized
        // below.
        unsafe { engine.register_mem(desc, MemType::Host) }?;
        None
    };
    println!("{{\"name\":\"{}\"}}", engine.local_engine()?);
    std::io::stdout().flush()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !engine.get_notifies()?.iter().any(|n| n.name == "free") {
        assert!(Instant::now() < deadline, "no \"free\" notification");
        std::thread::sleep(Duration::from_micros(500));
    }
    engine.finalize();
    drop((kv, mem));
    Ok(())
}

/// `len` bytes at `addr`.
///
/// # Safety
/// They must be mapped, live for `'a`, and not written while the slice is used.
unsafe fn view<'a>(addr: usize, len: usize) -> &'a [u8] {
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

fn decode(a: &Args) -> Res<()> {
    let size = a.layers * a.blocks * a.block;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("prefill")
        .args(std::env::args().skip(1).filter(|s| s != "decode"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let name = line
        .trim()
        .strip_prefix("{\"name\":\"")
        .and_then(|s| s.strip_suffix("\"}"))
        .ok_or("bad line from prefill")?
        .to_owned();

    let engine = Hixl::new();
    engine.initialize("127.0.0.1", [("hixl.SameHost", same_host(&a.transport))])?;
    let mut owned = Vec::new();
    let mem = if a.engine_memory {
        Some(engine.alloc_host_mem(size)?)
    } else {
        owned = vec![0u8; size];
        let desc = MemDesc {
            addr: owned.as_mut_ptr() as usize,
            len: size,
            local_only: false,
        };
        // SAFETY: `owned` is read below only after the transfers writing it ended, and outlives
        // the engine (finalized before it is dropped).
        unsafe { engine.register_mem(desc, MemType::Host) }?;
        None
    };
    let base = mem
        .as_ref()
        .map_or(owned.as_mut_ptr() as usize, |m| m.addr());

    engine.connect(&name, 10_000)?;
    let remote = engine.remote_regions(&name)?;
    let remote = remote.first().ok_or("prefill has no region")?;
    let mut rng = Rng::new(1);
    let tables: Vec<Vec<usize>> = (0..a.layers)
        .map(|_| {
            let mut p: Vec<usize> = (0..a.blocks).collect();
            for i in (1..p.len()).rev() {
                p.swap(i, rng.below(i as u64 + 1) as usize);
            }
            p
        })
        .collect();
    let descs: Vec<Vec<TransferOpDesc>> = tables
        .iter()
        .enumerate()
        .map(|(layer, perm)| {
            perm.iter()
                .enumerate()
                .map(|(j, &k)| TransferOpDesc {
                    local_addr: base + (layer * a.blocks + j) * a.block,
                    remote_addr: remote.addr as usize + (layer * a.blocks + k) * a.block,
                    len: a.block,
                })
                .collect()
        })
        .collect();
    let timeout = Duration::from_secs(120);
    let pull = || -> Res<f64> {
        let t = Instant::now();
        if a.sync {
            for d in &descs {
                engine.transfer_sync(&name, TransferOp::Read, d, 120_000)?;
            }
        } else {
            let reqs = descs
                .iter()
                .enumerate()
                .map(|(layer, d)| {
                    let args = TransferArgs {
                        user_data: layer as u64,
                    };
                    engine.transfer_async(&name, TransferOp::Read, d, args)
                })
                .collect::<Result<Vec<_>, _>>()?;
            for r in reqs {
                let st = engine.wait_transfer(r, timeout)?;
                if st != hixl::compat::TransferStatus::Completed {
                    return Err(format!("request ended {st:?}").into());
                }
            }
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let verify = |dst: &[u8]| -> Res<()> {
        let src = pattern(size);
        for (layer, perm) in tables.iter().enumerate() {
            for (j, &k) in perm.iter().enumerate() {
                let d = (layer * a.blocks + j) * a.block;
                let s = (layer * a.blocks + k) * a.block;
                if dst[d..d + a.block] != src[s..s + a.block] {
                    return Err(format!("layer {layer} block {j} differs").into());
                }
            }
        }
        Ok(())
    };
    pull()?;
    // SAFETY: the destination (the engine's mapping or `owned`, both live until the end of this
    // function), read between pulls: no transfer writing it is in flight.
    verify(unsafe { view(base, size) })?;
    for _ in 0..a.warmup {
        pull()?;
    }
    let mut times: Vec<f64> = (0..a.iters).map(|_| pull()).collect::<Res<_>>()?;
    times.push(pull()?);
    // SAFETY: as above.
    verify(unsafe { view(base, size) })?;
    let transport = engine.transport(&name)?.name();
    // the cost of one call, as kv_pull.py --boundary times it from Python: a 256-descriptor READ
    // refused at its last descriptor (every other one validated, no data moved)
    let mut refused_ns = 0.0;
    if a.boundary > 0 {
        let mut bad = descs[0].clone();
        bad.last_mut().ok_or("no descriptors")?.remote_addr = 0x10;
        let t = Instant::now();
        for _ in 0..a.boundary {
            let r = engine.transfer_sync(&name, TransferOp::Read, &bad, 1000);
            assert!(r.is_err());
        }
        refused_ns = t.elapsed().as_nanos() as f64 / a.boundary as f64;
    }
    let notify = NotifyDesc {
        name: "free".into(),
        notify_msg: "decode pulled the layers".into(),
    };
    engine.send_notify(&name, &notify, 5000)?;
    engine.finalize();
    drop((owned, mem));
    child.wait()?;

    times.sort_by(f64::total_cmp);
    let gbs: Vec<f64> = times.iter().map(|t| size as f64 / t / 1e9).collect();
    let total = size as f64 * times.len() as f64 / times.iter().sum::<f64>() / 1e9;
    let mode = if a.sync { "sync" } else { "async" };
    if a.json {
        println!(
            "{{\"impl\":\"hixl-rust-compat\",\"mode\":\"{mode}\",\"transport\":\"{transport}\",\"memory\":\"{}\",\"gbps_median\":{:.3},\"gbps_best\":{:.3},\"gbps_total\":{total:.3},\"verified\":true,\"refused_call_ns\":{refused_ns:.0}}}",
            if a.engine_memory { "engine" } else { "caller" },
            gbs[gbs.len() / 2],
            gbs.iter().cloned().fold(0.0, f64::max)
        );
    } else {
        println!(
            "compat_kv_pull ({mode}, {transport}): {} layers x {} blocks x {} B, {} pulls: median {:.3} GB/s, total {total:.3} GB/s; data verified",
            a.layers,
            a.blocks,
            a.block,
            times.len(),
            gbs[gbs.len() / 2]
        );
    }
    Ok(())
}

fn main() -> Res<()> {
    let a = args()?;
    if a.prefill { prefill(&a) } else { decode(&a) }
}
