//! Prefill/decode disaggregation in two processes: the prefill side WRITEs KV-cache blocks into
//! the decode side's registered cache, then WRITEs a ready marker; the decode side waits for the
//! marker and checks every block.
//!
//! ```text
//! # two terminals
//! cargo run --release --example prefill_decode -- decode  --listen 127.0.0.1:26000
//! cargo run --release --example prefill_decode -- prefill --peer   127.0.0.1:26000
//! # or one command that starts the decode side as a child process
//! cargo run --release --example prefill_decode -- both
//! ```
//!
//! Options: `--blocks N` (default 256) and `--block-size BYTES` (default 256 KiB), the same on
//! both sides; `--seed N` for the KV contents.
//!
//! Why the marker is safe: `transfer_sync` returns only after the peer has acknowledged that the
//! data landed in its memory, so a marker written afterwards is seen after the blocks.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hixl::testkit::{Rng, fnv1a};
use hixl::{Hixl, HostBuffer, Options, TransferDesc, TransferOp};

struct Args {
    role: String,
    listen: String,
    peer: String,
    blocks: usize,
    block: usize,
    seed: u64,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it.next().ok_or("usage: prefill_decode decode|prefill|both [--listen A] [--peer A] [--blocks N] [--block-size B] [--seed S]")?;
    let mut a = Args {
        role,
        listen: "127.0.0.1:26000".into(),
        peer: "127.0.0.1:26000".into(),
        blocks: 256,
        block: 256 << 10,
        seed: 7,
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--listen" => a.listen = v,
            "--peer" => a.peer = v,
            "--blocks" => a.blocks = num(&v)?,
            "--block-size" => a.block = num(&v)?,
            "--seed" => a.seed = num(&v)? as u64,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// The KV contents of block `i`, as both sides compute them.
fn block_bytes(seed: u64, i: usize, len: usize) -> Vec<u8> {
    Rng::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9)).bytes(len)
}

fn decode(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let engine = if a.listen.ends_with(":0") {
        Hixl::initialize_ephemeral(&a.listen, Options::default())?
    } else {
        Hixl::initialize(&a.listen, Options::default())?
    };
    // a cache in use has its pages touched already
    let mut mem = HostBuffer::new(a.blocks * a.block)?;
    mem.fill(0);
    let (engine, cache) = engine.register(mem)?;
    let mut ready = engine.register(HostBuffer::new(8)?)?;
    let engine = engine.activate()?;
    // tell the prefill side (and a parent process) where to connect
    println!(
        "DECODE READY {} cache={:#x} ready={:#x}",
        engine.name(),
        cache.addr(),
        ready.addr()
    );
    let t0 = Instant::now();
    let mut flag = [0u8; 8];
    loop {
        ready.read_at(0, &mut flag)?;
        if u64::from_le_bytes(flag) == a.seed + 1 {
            break;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("no prefill within 120 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let engine = engine.deactivate();
    let cache = engine.deregister(cache)?;
    // the prefill side stores block i in slot blocks-1-i
    for i in 0..a.blocks {
        let slot = a.blocks - 1 - i;
        let want = block_bytes(a.seed, i, a.block);
        if fnv1a(&cache[slot * a.block..(slot + 1) * a.block]) != fnv1a(&want) {
            return Err(format!("block {i} (slot {slot}) differs").into());
        }
    }
    println!(
        "decode: all {} KV blocks ({} MiB) arrived intact",
        a.blocks,
        (a.blocks * a.block) >> 20
    );
    let _ = engine.finalize();
    Ok(())
}

fn prefill(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (engine, mut kv) = Hixl::initialize("127.0.0.1", Options::default())?
        .register(HostBuffer::new(a.blocks * a.block)?)?;
    let mut marker = engine.register(HostBuffer::new(8)?)?;
    for i in 0..a.blocks {
        kv.write_at(i * a.block, &block_bytes(a.seed, i, a.block))?;
    }
    marker.write_at(0, &(a.seed + 1).to_le_bytes())?;
    let engine = engine.activate()?;
    let t = Duration::from_secs(30);
    let elapsed = {
        let link = engine.connect_timeout(&a.peer, Duration::from_secs(10))?;
        println!(
            "prefill: link to {} over {:?}",
            link.peer(),
            link.transport()
        );
        // the decode side registered the cache first, then the 8-byte marker
        let mut regions = link.regions().collect::<Vec<_>>();
        regions.sort_by_key(|r| r.id());
        let (cache, ready) = (regions[0], regions[1]);
        // the decode side's block order is reversed, to show any remote layout works
        let descs: Vec<_> = (0..a.blocks)
            .map(|i| {
                let r = ((a.blocks - 1 - i) * a.block) as u64;
                Ok(TransferDesc::new(
                    kv.range(i * a.block..(i + 1) * a.block)?,
                    cache.range(r..r + a.block as u64)?,
                ))
            })
            .collect::<Result<_, hixl::Error>>()?;
        let t0 = Instant::now();
        link.transfer_sync(TransferOp::Write, &descs, t)?;
        let elapsed = t0.elapsed();
        link.transfer_sync(
            TransferOp::Write,
            &[TransferDesc::new(marker.full(), ready.full())],
            t,
        )?;
        // the decode side stops serving as soon as it sees the marker, so it may have closed
        // the link before our goodbye arrives: that is a disconnect too
        match link.disconnect(t) {
            Ok(()) | Err(hixl::Error::NotConnected { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        elapsed
    };
    let bytes = (a.blocks * a.block) as f64;
    println!(
        "prefill: wrote {} KV blocks of {} KiB in one batch: {:.2} GB/s",
        a.blocks,
        a.block >> 10,
        bytes / elapsed.as_secs_f64() / 1e9
    );
    let _ = engine.finalize();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut a = args()?;
    match a.role.as_str() {
        "decode" => decode(&a),
        "prefill" => prefill(&a),
        "both" => {
            // the decode side in a child process, on a port the OS picks
            let mut child = Command::new(std::env::current_exe()?)
                .args([
                    "decode",
                    "--listen",
                    "127.0.0.1:0",
                    "--blocks",
                    &a.blocks.to_string(),
                ])
                .args([
                    "--block-size",
                    &a.block.to_string(),
                    "--seed",
                    &a.seed.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()?;
            let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
            let mut line = String::new();
            out.read_line(&mut line)?;
            a.peer = line
                .split_whitespace()
                .nth(2)
                .ok_or(format!("decode said {line:?}"))?
                .to_owned();
            println!("decode process {} listens on {}", child.id(), a.peer);
            prefill(&a)?;
            line.clear();
            out.read_line(&mut line)?;
            print!("{line}");
            if !child.wait()?.success() {
                return Err("the decode process failed".into());
            }
            Ok(())
        }
        r => Err(format!("unknown role {r}: decode, prefill or both").into()),
    }
}
