//! What the C boundary costs: `transfer_sync` WRITE through `libhixl.so` (the exported C
//! functions, loaded with `dlopen`) against the same call from Rust (the runtime-checked
//! `hixl::compat` engine, and the typed `Link` API), same block sizes and batch, one serving
//! engine in a child process, measured in one invocation with the three interleaved; beside
//! them the same blocks as a block-indexed batch through `hixl_transfer_blocks_sync` (beyond
//! HIXL), with wall ns per descriptor of both C forms (issue #35: `--batch 100000`).
//!
//! ```text
//! cargo build --release -p hixl-capi
//! cargo run --release -p hixl-capi --example capi_bench                  # 4 KiB, 64 KiB x 64
//! cargo run --release -p hixl-capi --example capi_bench -- --block 65536 --batch 64 --rounds 9 --tcp
//! cargo run --release -p hixl-capi --example capi_bench -- --block 64,2048,16384,65536 --batch 100000 --rounds 3
//! ```
//!
//! Options: `--block B,B,..` (bytes), `--batch N` (descriptors per call, default 64),
//! `--rounds N` (interleaved rounds per row; the median is printed, default 7), `--round-ms MS`
//! (default 300), `--tcp` (no same-host transport), `--memory caller|engine` (the serving
//! region a `Vec`, the default, or `alloc_host_mem`: a same-host peer maps engine memory,
//! caller memory goes to it over TCP), `--json` (one JSON object per row on stdout, the header
//! on stderr), `--lib PATH` (default: `libhixl.so` next to this
//! example's directory, i.e. `target/<profile>/`).

use std::ffi::{CString, c_char, c_void};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hixl_rs::compat::{self, TransferOpDesc};
use hixl_rs::{Hixl, HostBuffer, MemType, Options, SameHost, TransferDesc, TransferOp};

type Engine = *mut c_void;
type CreateFn = unsafe extern "C" fn(*mut Engine) -> u32;
type InitializeFn = unsafe extern "C" fn(
    Engine,
    *const c_char,
    *const *const c_char,
    *const *const c_char,
    usize,
) -> u32;
type RegisterFn = unsafe extern "C" fn(Engine, *const CMemDesc, i32, *mut *mut c_void) -> u32;
type ConnectFn = unsafe extern "C" fn(Engine, *const c_char, i32) -> u32;
type TransferSyncFn =
    unsafe extern "C" fn(Engine, *const c_char, i32, *const TransferOpDesc, usize, i32) -> u32;
type DestroyFn = unsafe extern "C" fn(Engine);
type BlocksSyncFn = unsafe extern "C" fn(
    Engine,
    *const c_char,
    i32,
    *const CBlockDesc,
    *const c_void,
    *const c_void,
    usize,
    i32,
    i32,
) -> u32;

/// The C functions the benchmark calls, from `dlsym`.
struct Api {
    create: CreateFn,
    initialize: InitializeFn,
    register: RegisterFn,
    connect: ConnectFn,
    transfer_sync: TransferSyncFn,
    transfer_blocks_sync: BlocksSyncFn,
    destroy: DestroyFn,
}

/// `hixl_block_desc` (include/hixl_c.h).
#[repr(C)]
struct CBlockDesc {
    local_addr: usize,
    remote_addr: usize,
    block_size: u64,
    local_stride: u64,
    remote_stride: u64,
}

#[repr(C)]
struct CMemDesc {
    addr: usize,
    len: usize,
    reserved: [u8; 128],
}

fn load(path: &str) -> Result<Api, String> {
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a NUL-terminated path; the handle is never closed (the functions are
    // used until the process exits).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!(
            "cannot load {path} (build it first: cargo build --release -p hixl-capi)"
        ));
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let n = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: a live handle and a NUL-terminated symbol name.
        let p = unsafe { libc::dlsym(h, n.as_ptr()) };
        if p.is_null() {
            Err(format!("{path} has no {name}"))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol is the function of that name in include/hixl_c.h, and the types
    // below are its signature there.
    unsafe {
        Ok(Api {
            create: std::mem::transmute::<*mut c_void, CreateFn>(sym("hixl_create")?),
            initialize: std::mem::transmute::<*mut c_void, InitializeFn>(sym("hixl_initialize")?),
            register: std::mem::transmute::<*mut c_void, RegisterFn>(sym("hixl_register_mem")?),
            connect: std::mem::transmute::<*mut c_void, ConnectFn>(sym("hixl_connect")?),
            transfer_sync: std::mem::transmute::<*mut c_void, TransferSyncFn>(sym(
                "hixl_transfer_sync",
            )?),
            transfer_blocks_sync: std::mem::transmute::<*mut c_void, BlocksSyncFn>(sym(
                "hixl_transfer_blocks_sync",
            )?),
            destroy: std::mem::transmute::<*mut c_void, DestroyFn>(sym("hixl_destroy")?),
        })
    }
}

fn check(what: &str, status: u32) -> Result<(), String> {
    if status == 0 {
        Ok(())
    } else {
        Err(format!("{what}: status {status}"))
    }
}

/// The serving side: a compat engine with `size` bytes (a `Vec`, or `alloc_host_mem` with
/// `engine`), `READY <name> <addr>`, until stdin ends.
fn serve(size: usize, tcp: bool, engine_mem: bool) -> Result<(), Box<dyn std::error::Error>> {
    let mut mem = vec![0u8; if engine_mem { 0 } else { size }];
    let e = compat::Hixl::new();
    let opts: &[(&str, &str)] = if tcp {
        &[("hixl.SameHost", "off")]
    } else {
        &[]
    };
    e.initialize("127.0.0.1:0", opts.iter().copied())?;
    // engine memory: a same-host peer maps it (caller memory goes to it over TCP)
    let host = if engine_mem {
        Some(e.alloc_host_mem(size)?)
    } else {
        None
    };
    let addr = match &host {
        Some(h) => h.addr(),
        None => {
            let desc = compat::MemDesc {
                addr: mem.as_mut_ptr() as usize,
                len: size,
                local_only: false,
            };
            // SAFETY: `mem` outlives the engine (finalized below) and is never read here.
            unsafe { e.register_mem(desc, MemType::Host) }?;
            desc.addr
        }
    };
    println!("READY {} {addr}", e.local_engine()?);
    std::io::stdout().flush()?;
    for _ in std::io::stdin().lock().lines() {}
    e.finalize();
    drop((mem, host));
    Ok(())
}

struct Row {
    block: usize,
    typed: f64,
    compat: f64,
    capi: f64,
    /// The same blocks through `hixl_transfer_blocks_sync` (two `u32` index arrays).
    capi_blocks: f64,
    /// Nanoseconds per call refused at its last descriptor (everything but the data moved):
    /// from Rust, and through the C ABI.
    check_ns: (f64, f64),
    /// The anchor: one thread copying the same block size in sequence through a region of the
    /// same span, in this process, GB/s.
    memcpy: f64,
}

/// One thread's `memcpy` of `block`-byte chunks in sequence through `span` bytes, best of three
/// passes, GB/s (the bench's `memcpy` anchor, measured in this invocation).
fn memcpy_gbps(block: usize, span: usize) -> f64 {
    let span = span.max(block);
    let src = vec![7u8; span];
    let mut dst = vec![0u8; span];
    let mut best = 0.0f64;
    for _ in 0..3 {
        let start = Instant::now();
        for (d, s) in dst.chunks_exact_mut(block).zip(src.chunks_exact(block)) {
            d.copy_from_slice(std::hint::black_box(s));
        }
        std::hint::black_box(&mut dst);
        let bytes = (span / block * block) as f64;
        best = best.max(bytes / start.elapsed().as_nanos().max(1) as f64);
    }
    best
}

/// iperf3 with two streams of 1 MiB writes on loopback (`tools/bench-anchors.sh iperf 2 1M`),
/// GB/s, or `None` (said on stderr) when it cannot run.
fn iperf_p2() -> Option<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/bench-anchors.sh");
    let out = Command::new("bash")
        .args([script, "iperf", "2", "1M"])
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .and_then(|v| v.parse().ok());
    if v.is_none() {
        eprintln!(
            "iperf3 anchor unavailable: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut blocks, mut batch, mut rounds, mut round) = (
        vec![4096usize, 65536],
        64usize,
        7usize,
        Duration::from_millis(300),
    );
    let (mut tcp, mut lib, mut engine_mem, mut json, mut anchors) =
        (false, None, false, false, false);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "serve" => return serve(val()?.parse()?, val()? == "tcp", val()? == "engine"),
            "--block" => {
                blocks = val()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--batch" => batch = val()?.parse()?,
            "--rounds" => rounds = val()?.parse::<usize>()?.max(1),
            "--round-ms" => round = Duration::from_millis(val()?.parse()?),
            "--lib" => lib = Some(val()?),
            "--tcp" => tcp = true,
            "--memory" => engine_mem = val()? == "engine",
            "--json" => json = true,
            "--anchors" => anchors = true,
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    let lib = match lib {
        Some(l) => l,
        None => {
            let exe = std::env::current_exe()?;
            let dir = exe.parent().and_then(|p| p.parent()).ok_or("exe path")?;
            dir.join("libhixl.so").to_string_lossy().into_owned()
        }
    };
    let api = load(&lib)?;
    // each side's region: the batch's span, at most 256 MiB (a larger batch cycles through the
    // region's blocks: 64 KiB x 10^5 reuses each of its 4,096 blocks)
    let largest = blocks.iter().max().copied().unwrap_or(0);
    let span = (largest * batch).min(256 << 20).max(largest);

    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "serve",
            &span.to_string(),
            if tcp { "tcp" } else { "auto" },
            if engine_mem { "engine" } else { "caller" },
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("stdout")?).read_line(&mut line)?;
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.first() != Some(&"READY") {
        return Err(format!("server said {line:?}").into());
    }
    let (name, raddr): (String, usize) = (w[1].to_owned(), w[2].parse()?);

    // the typed API
    let opts = if tcp {
        Options::default().same_host(SameHost::Forbid)
    } else {
        Options::default()
    };
    let (typed, mut tbuf) =
        Hixl::initialize("127.0.0.1", opts)?.register(HostBuffer::new(span)?)?;
    let typed = typed.activate()?;
    tbuf.write_at(0, &vec![1u8; span])?;
    let link = typed.connect(&name)?;

    // the compat engine from Rust
    let option: &[(&str, &str)] = if tcp {
        &[("hixl.SameHost", "off")]
    } else {
        &[]
    };
    let mut cmem = vec![2u8; span];
    let ce = compat::Hixl::new();
    ce.initialize("127.0.0.1", option.iter().copied())?;
    let cdesc = compat::MemDesc {
        addr: cmem.as_mut_ptr() as usize,
        len: span,
        local_only: false,
    };
    // SAFETY: `cmem` outlives the engine (finalized at the end) and is not touched meanwhile.
    unsafe { ce.register_mem(cdesc, MemType::Host) }?;
    ce.connect(&name, 1000)?;

    // the compat engine through the C ABI
    let mut amem = vec![3u8; span];
    let cname = CString::new(name.clone())?;
    let local = CString::new("127.0.0.1")?;
    let (k, v) = (CString::new("hixl.SameHost")?, CString::new("off")?);
    let (keys, vals) = ([k.as_ptr()], [v.as_ptr()]);
    let mut engine: Engine = std::ptr::null_mut();
    let mut handle: *mut c_void = std::ptr::null_mut();
    let amd = CMemDesc {
        addr: amem.as_mut_ptr() as usize,
        len: span,
        reserved: [0; 128],
    };
    // SAFETY: the C functions with valid pointers (live locals, NUL-terminated strings); the
    // registered `amem` outlives the engine (destroyed at the end).
    unsafe {
        check("hixl_create", (api.create)(&mut engine))?;
        let n = usize::from(tcp);
        check(
            "hixl_initialize",
            (api.initialize)(engine, local.as_ptr(), keys.as_ptr(), vals.as_ptr(), n),
        )?;
        check(
            "hixl_register_mem",
            (api.register)(engine, &amd, 1, &mut handle),
        )?;
        check("hixl_connect", (api.connect)(engine, cname.as_ptr(), 1000))?;
    }

    let moved_over = ce
        .remote_regions(&name)?
        .first()
        .map_or("none", |r| r.transport.name());
    // with --json the header goes to stderr and stdout carries one JSON object per row
    let header = format!(
        "transfer_sync WRITE, {} transport (the server's region moved over {}), the server's region {} memory, batch {batch}, median of {rounds} interleaved rounds of {} ms; GB/s = 1e9 B/s",
        if tcp {
            "tcp"
        } else {
            "same-host (or tcp where refused)"
        },
        moved_over,
        if engine_mem { "engine" } else { "caller" },
        round.as_millis()
    );
    if json {
        eprintln!("{header}");
    } else {
        println!("{header}");
    }
    let mut rows = Vec::new();
    for &block in &blocks {
        // block i of the batch is block i % slots of each region, in order
        let slots = span / block;
        let descs = |base: usize| -> Vec<TransferOpDesc> {
            (0..batch)
                .map(|i| TransferOpDesc {
                    local_addr: base + (i % slots) * block,
                    remote_addr: raddr + (i % slots) * block,
                    len: block,
                })
                .collect()
        };
        let idx: Vec<u32> = (0..batch)
            .map(|i| u32::try_from(i % slots))
            .collect::<Result<_, _>>()?;
        let bdesc = CBlockDesc {
            local_addr: amd.addr,
            remote_addr: raddr,
            block_size: block as u64,
            local_stride: 0,
            remote_stride: 0,
        };
        let cd = descs(cdesc.addr);
        let ad = descs(amd.addr);
        let bytes = (block * batch) as f64;
        let timed = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < round {
                f()?;
                n += 1;
            }
            Ok(n as f64 * bytes / start.elapsed().as_secs_f64() / 1e9)
        };
        let (mut t, mut c, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in 0..=rounds {
            let mut typed_call = || {
                let d: Vec<TransferDesc<'_>> = (0..batch)
                    .map(|i| -> Result<_, hixl_rs::Error> {
                        let off = (i % slots) * block;
                        Ok(TransferDesc::new(
                            tbuf.range(off..off + block)?,
                            link.remote((raddr + off) as u64, block as u64)?,
                        ))
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?;
                link.transfer_sync(TransferOp::Write, &d, Duration::from_secs(5))
                    .map_err(|e| e.to_string())
            };
            let mut compat_call = || {
                ce.transfer_sync(&name, TransferOp::Write, &cd, 5000)
                    .map_err(|e| e.to_string())
            };
            let mut capi_call = || {
                // SAFETY: a live engine, a NUL-terminated name, `batch` descriptors in `ad`.
                let s = unsafe {
                    (api.transfer_sync)(engine, cname.as_ptr(), 1, ad.as_ptr(), ad.len(), 5000)
                };
                check("hixl_transfer_sync", s)
            };
            let mut capi_blocks_call = || {
                // SAFETY: a live engine, a NUL-terminated name, a live block descriptor and two
                // `batch`-long u32 index arrays (4-byte aligned).
                let s = unsafe {
                    (api.transfer_blocks_sync)(
                        engine,
                        cname.as_ptr(),
                        1,
                        &bdesc,
                        idx.as_ptr().cast(),
                        idx.as_ptr().cast(),
                        idx.len(),
                        4,
                        5000,
                    )
                };
                check("hixl_transfer_blocks_sync", s)
            };
            // a different order each round, so none of the four always runs first
            let (mut tr, mut cr, mut ar, mut br) = (0.0, 0.0, 0.0, 0.0);
            for k in 0..4 {
                match (r + k) % 4 {
                    0 => tr = timed(&mut typed_call)?,
                    1 => cr = timed(&mut compat_call)?,
                    2 => ar = timed(&mut capi_call)?,
                    _ => br = timed(&mut capi_blocks_call)?,
                }
            }
            if r > 0 {
                // round 0 warms up
                t.push(tr);
                c.push(cr);
                a.push(ar);
                b.push(br);
            }
        }
        // the boundary alone: the same batch, refused at its last descriptor (a remote range
        // past the server's region), after every other descriptor was validated
        let mut bad_c = cd.clone();
        let mut bad_a = ad.clone();
        for b in [&mut bad_c, &mut bad_a] {
            b.last_mut().expect("batch > 0").remote_addr = raddr + span;
        }
        // 20,000 calls of 64 descriptors; as many descriptors in all for larger batches (a
        // fixed 20,000 calls of 10^5 descriptors would validate for minutes)
        let calls = (1_280_000 / batch).clamp(3, 20_000);
        let (mut rn, mut an) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..calls {
                let r = ce.transfer_sync(&name, TransferOp::Write, &bad_c, 5000);
                assert!(r.is_err());
            }
            rn.push(start.elapsed().as_nanos() as f64 / calls as f64);
            let start = Instant::now();
            for _ in 0..calls {
                // SAFETY: as above.
                let s = unsafe {
                    (api.transfer_sync)(engine, cname.as_ptr(), 1, bad_a.as_ptr(), batch, 5000)
                };
                assert_eq!(s, 103_900);
            }
            an.push(start.elapsed().as_nanos() as f64 / calls as f64);
        }
        rows.push(Row {
            block,
            typed: median(t),
            compat: median(c),
            capi: median(a),
            capi_blocks: median(b),
            check_ns: (median(rn), median(an)),
            memcpy: memcpy_gbps(block, span),
        });
    }
    // iperf3 -P2 right after the rows (with --anchors, over TCP): what two TCP streams move on this machine
    let iperf = (anchors && moved_over == "tcp").then(iperf_p2).flatten();
    if json {
        let iperf_json = iperf.map_or("null".to_owned(), |g| format!("{g:.3}"));
        for r in &rows {
            let per_call_ns = (r.block * batch) as f64 / r.compat;
            println!(
                "{{\"metric\":\"capi\",\"moved_over\":\"{moved_over}\",\"server_memory\":\"{}\",\"op\":\"write\",\"block\":{},\"batch\":{batch},\"rounds\":{rounds},\"typed_gbps\":{:.3},\"compat_gbps\":{:.3},\"c_gbps\":{:.3},\"c_blocks_gbps\":{:.3},\"c_ns_per_desc\":{:.1},\"c_blocks_ns_per_desc\":{:.1},\"refused_rust_ns_per_call\":{:.0},\"refused_c_ns_per_call\":{:.0},\"boundary_pct\":{:.3},\"memcpy_gbps\":{:.3},\"iperf3_p2_gbps\":{iperf_json}}}",
                if engine_mem { "engine" } else { "caller" },
                r.block,
                r.typed,
                r.compat,
                r.capi,
                r.capi_blocks,
                r.block as f64 / r.capi,
                r.block as f64 / r.capi_blocks,
                r.check_ns.0,
                r.check_ns.1,
                (r.check_ns.1 - r.check_ns.0) / per_call_ns * 100.0,
                r.memcpy,
            );
        }
    } else {
        println!(
            "{:>9} {:>6} {:>11} {:>12} {:>11} {:>10} {:>13} {:>11} {:>14} {:>13} {:>13} {:>13} {:>12}",
            "block",
            "batch",
            "typed GB/s",
            "compat GB/s",
            "C ABI GB/s",
            "C vs Rust",
            "C blocks GB/s",
            "C ns/desc",
            "C blocks ns/d",
            "Rust ns/call",
            "C ns/call",
            "boundary",
            "memcpy GB/s"
        );
        for r in &rows {
            // the boundary's cost as a share of one transfer at the compat engine's median rate
            let per_call_ns = (r.block * batch) as f64 / r.compat;
            let boundary = (r.check_ns.1 - r.check_ns.0) / per_call_ns * 100.0;
            println!(
                "{:>9} {:>6} {:>11.2} {:>12.2} {:>11.2} {:>+9.1}% {:>13.2} {:>11.1} {:>14.1} {:>13.0} {:>13.0} {:>+12.2}% {:>12.2}",
                r.block,
                batch,
                r.typed,
                r.compat,
                r.capi,
                (r.capi / r.compat - 1.0) * 100.0,
                r.capi_blocks,
                // ns per descriptor: a block's bytes at the row's rate (GB/s = bytes per ns)
                r.block as f64 / r.capi,
                r.block as f64 / r.capi_blocks,
                r.check_ns.0,
                r.check_ns.1,
                boundary,
                r.memcpy
            );
        }
        println!(
            "C vs Rust: the C ABI's GB/s against the compat engine's (noise of a shared machine \
             included); C blocks: the same blocks through hixl_transfer_blocks_sync (two u32 index \
             arrays, beyond HIXL); ns/desc: wall ns per descriptor of the C ABI's list and block \
             forms; ns/call: a {batch}-descriptor call refused at its last descriptor (all \
             validation, no data), from Rust and through the C ABI; boundary: their difference as \
             a share of one transfer at the compat rate; memcpy: one thread copying the same \
             block size in sequence in this process (the anchor)"
        );
        if let Some(g) = iperf {
            println!("iperf3 -P2 (1 MiB writes, loopback) right after: {g:.2} GB/s");
        }
    }
    // SAFETY: the engine from hixl_create, destroyed once.
    unsafe { (api.destroy)(engine) };
    drop(amem);
    ce.finalize();
    drop(cmem);
    drop(link);
    drop(typed.finalize());
    drop(child.stdin.take());
    child.wait()?;
    Ok(())
}
