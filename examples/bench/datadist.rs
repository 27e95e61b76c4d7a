//! `--datadist`: LLM-DataDist's `pull_blocks` (the typed layer, `hixl::datadist::typed`)
//! against the engine's own block READ of the same blocks, in one invocation.
//!
//! A prompt cluster runs in a child process (`bench --datadist-serve`): one blocks cache of
//! `--dd-tensors` tensors (default 4: two layers of K and V) of 4096 blocks of `--dd-block`
//! bytes (default 16 KiB), seeded. This process is the decoder: a cache of the same geometry,
//! linked to the prompt. For 64 and for 4096 blocks (random, distinct block lists on both
//! sides, so no two blocks merge into one descriptor: blocks x tensors descriptors per call)
//! each round times
//! - `typed`: `LinkedCluster::pull_blocks` (cache table lookup, checks, one block batch a
//!   tensor pair on the DataDist's engine, all in flight at once), and
//! - `engine`: `compat::Hixl::transfer_blocks_sync(READ)` of the same blocks, one call a tensor
//!   in turn (the same local and remote bases and index lists), by a second engine in this
//!   process that registers the decoder cache's memory and links to the prompt's engine,
//!
//! interleaved (ABBA from round to round), each a batch of calls sized to about 0.2 s. The row
//! has each side's median over `--dd-rounds` rounds (default 9) of the wall time per call and of
//! the calling thread's CPU time per call, and the overhead: the median over the rounds of
//! `typed / engine - 1` of the round's two samples (run back to back, so a loaded machine's
//! drift cancels out more than in the ratio of the medians). `checks us` is the typed layer's
//! own work per call (cache table lookup, block checks, tensor pairs), timed on pulls that the
//! last remote block check refuses (`LLM_PARAM_INVALID`), so nothing moves. Both sides' data is
//! checked against the prompt's seeded bytes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hixl::HostBuffer;
use hixl::compat::{self, BlockDesc};
use hixl::datadist::typed::{Cache, Cluster, Decoder, Layout, PeerCache, Prompt};
use hixl::datadist::{CacheDesc, CacheKey, DataType, Placement};
use hixl::testkit::Rng;
use hixl::{MemType, TransferOp};

type Failure = Box<dyn std::error::Error>;

/// Blocks per tensor of both caches.
const BLOCKS: u64 = 4096;
/// The prompt's model id.
const MODEL: u64 = 1;
/// The seed of the prompt's tensor 0 (tensor t: SEED + t).
const SEED: u64 = 1000;

/// What `--datadist` measures with.
#[derive(Clone)]
pub struct Spec {
    /// Tensors per cache.
    pub tensors: u32,
    /// Bytes per block.
    pub block: u64,
    /// Rounds (the median is over them).
    pub rounds: usize,
    /// JSON rows.
    pub json: bool,
    /// Over TCP (`hixl.SameHost` off on the decoder and the baseline engine), not same host.
    pub tcp: bool,
}

fn desc(tensors: u32, block: u64) -> CacheDesc {
    CacheDesc {
        placement: Placement::Host,
        num_tensors: tensors,
        data_type: DataType::UINT8,
        shape: vec![BLOCKS as i64, block as i64],
    }
}

/// The prompt side (`bench --datadist-serve TENSORS BLOCK`): prints `READY ip:port addr...`
/// and serves until its standard input ends.
pub fn serve_main(argv: &[String]) -> Result<(), Failure> {
    let tensors: u32 = argv.first().ok_or("tensors")?.parse()?;
    let block: u64 = argv.get(1).ok_or("block")?.parse()?;
    let listen = [("llm.ListenIpInfo", "127.0.0.1:0")];
    Cluster::<Prompt>::scope(1, &listen, |prompt| -> Result<(), Failure> {
        let len = (BLOCKS * block) as usize;
        let kv = (0..u64::from(tensors))
            .map(|t| HostBuffer::from_slice(&Rng::new(SEED + t).bytes(len)))
            .collect::<Result<Vec<_>, _>>()?;
        let key = CacheKey {
            req_id: u64::MAX,
            model_id: MODEL,
        };
        let cache = prompt.register_cache(&desc(tensors, block), Layout::Blocks, kv, &[key])?;
        let addr = prompt.listen_addr().ok_or("not listening")?;
        let addrs: Vec<String> = (0..tensors as usize)
            .map(|t| cache.tensor_addr(t).unwrap_or(0).to_string())
            .collect();
        println!("READY {addr} {}", addrs.join(" "));
        std::io::stdout().flush()?;
        let mut line = String::new();
        while std::io::stdin().lock().read_line(&mut line)? > 0 {
            line.clear();
        }
        drop(cache);
        Ok(())
    })?
}

/// The rows.
pub fn rows(s: &Spec) -> Result<(), Failure> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--datadist-serve",
            &s.tensors.to_string(),
            &s.block.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let input = child.stdin.take().ok_or("no stdin")?;
    let mut output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    output.read_line(&mut line)?;
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.first() != Some(&"READY") {
        return Err(format!("the prompt process said {line:?}").into());
    }
    let addr: std::net::SocketAddr = w[1].parse()?;
    let remote: Vec<u64> = w[2..].iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
    let same_host = if s.tcp { "off" } else { "auto" };
    let options = [
        ("llm.SyncKvCacheWaitTime", "60000"),
        ("hixl.SameHost", same_host),
    ];
    let r = Cluster::<Decoder>::scope(2, &options, |decoder| measure(s, &decoder, addr, &remote));
    drop(input);
    child.wait()?;
    r?
}

fn measure(
    s: &Spec,
    decoder: &Cluster<'_, Decoder>,
    addr: std::net::SocketAddr,
    remote: &[u64],
) -> Result<(), Failure> {
    let len = (BLOCKS * s.block) as usize;
    let kv = (0..s.tensors)
        .map(|_| HostBuffer::new(len))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cache = decoder.register_cache(&desc(s.tensors, s.block), Layout::Blocks, kv, &[])?;
    let link = decoder.link(1, addr, Duration::from_secs(10))?;
    // the engine of the baseline: the same local memory, linked to the prompt's engine
    let engine = compat::Hixl::new();
    let same_host = if s.tcp { "off" } else { "auto" };
    engine.initialize(
        "127.0.0.1",
        [("AutoConnect", "0"), ("hixl.SameHost", same_host)],
    )?;
    for t in 0..s.tensors as usize {
        let d = compat::MemDesc {
            addr: cache.tensor_addr(t).ok_or("tensor")?,
            len,
            local_only: false,
        };
        // SAFETY: the cache's tensors stay allocated (the cache owns them) until after
        // `engine.finalize()` below; this engine only READs into them, while nothing else
        // touches them (the pulls of the typed side run at other times).
        unsafe { engine.register_mem(d, MemType::Host) }?;
    }
    let peer = addr.to_string();
    engine.connect(&peer, 10_000)?;
    let transport = engine.transport(&peer)?;
    let key = PeerCache::Blocks { model_id: MODEL };
    link.pull_blocks(key, &cache, &[0], &[0])?; // the link's first use fetches the table
    let mut rng = Rng::new(7);
    if !s.json {
        println!(
            "\nLLM-DataDist pull_blocks vs the engine's block READ of the same blocks ({} tensors \
             x {} B blocks, random blocks, {transport:?}, median of {} rounds)",
            s.tensors, s.block, s.rounds
        );
        println!(
            "{:>7} {:>7} {:>10} | {:>11} {:>6} {:>9} | {:>11} {:>6} {:>9} | {:>9} | {:>9}",
            "blocks",
            "descs",
            "bytes",
            "typed us",
            "GB/s",
            "cpu us",
            "engine us",
            "GB/s",
            "cpu us",
            "overhead",
            "checks us"
        );
    }
    for n in [64usize, 4096] {
        let (src, dst) = (shuffled(&mut rng, n), shuffled(&mut rng, n));
        let bs = s.block;
        // the engine's block READ: one call a tensor, from each tensor's base
        let bases: Vec<BlockDesc> = (0..s.tensors as usize)
            .map(|t| BlockDesc {
                local_addr: cache.tensor_addr(t).unwrap_or(0),
                remote_addr: remote[t] as usize,
                block_size: bs,
                local_stride: 0,
                remote_stride: 0,
            })
            .collect();
        let descs = n * s.tensors as usize;
        let typed = || {
            link.pull_blocks(key, &cache, &src, &dst)
                .map_err(Failure::from)
        };
        let read = || -> Result<(), Failure> {
            for b in &bases {
                let (l, r) = (hixl::BlockIndices::U64(&dst), hixl::BlockIndices::U64(&src));
                engine.transfer_blocks_sync(&peer, TransferOp::Read, b, l, r, 60_000)?;
            }
            Ok(())
        };
        // warm-up, and the calls per sample (about 0.2 s)
        let t0 = Instant::now();
        typed()?;
        read()?;
        let per = t0.elapsed().as_secs_f64() / 2.0;
        let calls = ((0.2 / per).ceil() as usize).clamp(2, 2000);
        // per round and side: (wall, this thread's CPU) per call
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..s.rounds {
            let time = |f: &dyn Fn() -> Result<(), Failure>| -> Result<(f64, f64), Failure> {
                let (t, c) = (Instant::now(), cpu());
                for _ in 0..calls {
                    f()?;
                }
                let n = calls as f64;
                Ok((t.elapsed().as_secs_f64() / n, (cpu() - c) / n))
            };
            if round % 2 == 0 {
                a.push(time(&typed)?);
                b.push(time(&read)?);
            } else {
                b.push(time(&read)?);
                a.push(time(&typed)?);
            }
        }
        // the typed layer's own work (lookups, checks, pairs): a pull the peer's last block check
        // refuses, so it goes as far as it can without moving anything
        let mut bad = src.clone();
        if let Some(last) = bad.last_mut() {
            *last = BLOCKS;
        }
        let mut checks = Vec::new();
        for _ in 0..s.rounds {
            let t = Instant::now();
            for _ in 0..100 {
                match link.pull_blocks(key, &cache, &bad, &dst) {
                    Err(e) if e.status == hixl::datadist::LlmStatus::LLM_PARAM_INVALID => {}
                    other => return Err(format!("a refused pull returned {other:?}").into()),
                }
            }
            checks.push(t.elapsed().as_secs_f64() / 100.0);
        }
        let checks = median(&mut checks);
        // both sides' data: zero the blocks, move them, compare with the prompt's bytes
        let zero = vec![0u8; bs as usize];
        for engine_side in [false, true] {
            for t in 0..s.tensors as usize {
                for &d in &dst {
                    cache.write_at(t, d * bs, &zero)?;
                }
            }
            if engine_side {
                read()?;
            } else {
                link.pull_blocks(key, &cache, &src, &dst)?;
            }
            check(&mut cache, &src, &dst, bs)?;
        }
        let wall = |v: &[(f64, f64)]| median(&mut v.iter().map(|x| x.0).collect::<Vec<_>>());
        let busy = |v: &[(f64, f64)]| median(&mut v.iter().map(|x| x.1).collect::<Vec<_>>());
        let (ta, tb, ca, cb) = (wall(&a), wall(&b), busy(&a), busy(&b));
        // the overhead: the median of each round's pair (the two samples ran back to back)
        let mut ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x.0 / y.0 - 1.0).collect();
        let over = median(&mut ratios) * 100.0;
        let bytes = (n as u64 * bs * u64::from(s.tensors)) as f64;
        let us = |v: &[(f64, f64)]| {
            v.iter()
                .map(|x| (x.0 * 1e7).round() / 10.0)
                .collect::<Vec<_>>()
        };
        if s.json {
            println!(
                "{{\"metric\":\"datadist_pull_blocks\",\"blocks\":{n},\"descs\":{},\"bytes\":{bytes},\
                 \"tensors\":{},\"block\":{bs},\"transport\":\"{transport:?}\",\"rounds\":{},\
                 \"calls\":{calls},\"typed_us\":{:.1},\"engine_us\":{:.1},\"overhead_pct\":{over:.2},\
                 \"typed_cpu_us\":{:.1},\"engine_cpu_us\":{:.1},\"typed_checks_us\":{:.1},\
                 \"typed_samples_us\":{:?},\"engine_samples_us\":{:?}}}",
                descs,
                s.tensors,
                s.rounds,
                ta * 1e6,
                tb * 1e6,
                ca * 1e6,
                cb * 1e6,
                checks * 1e6,
                us(&a),
                us(&b),
            );
        } else {
            println!(
                "{n:>7} {:>7} {:>10} | {:>11.1} {:>6.2} {:>9.1} | {:>11.1} {:>6.2} {:>9.1} | {:>+8.2}% | {:>9.1}",
                descs,
                bytes as u64,
                ta * 1e6,
                bytes / ta / 1e9,
                ca * 1e6,
                tb * 1e6,
                bytes / tb / 1e9,
                cb * 1e6,
                over,
                checks * 1e6
            );
        }
    }
    link.unlink(Duration::from_secs(5))?;
    engine.finalize();
    drop(cache);
    Ok(())
}

/// `n` distinct blocks in random order.
fn shuffled(rng: &mut Rng, n: usize) -> Vec<u64> {
    let mut all: Vec<u64> = (0..BLOCKS).collect();
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    all.truncate(n);
    all
}

/// Block `dst[i]` of every tensor holds the prompt's block `src[i]`.
fn check(cache: &mut Cache<'_>, src: &[u64], dst: &[u64], bs: u64) -> Result<(), Failure> {
    let mut got = vec![0u8; bs as usize];
    for t in 0..cache.num_tensors() {
        let want = Rng::new(SEED + t as u64).bytes((BLOCKS * bs) as usize);
        for (&s, &d) in src.iter().zip(dst) {
            cache.read_at(t, d * bs, &mut got)?;
            if got[..] != want[(s * bs) as usize..((s + 1) * bs) as usize] {
                return Err(format!("tensor {t}: block {d} is not the prompt's block {s}").into());
            }
        }
    }
    Ok(())
}

/// This thread's CPU time, in seconds.
fn cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write; CLOCK_THREAD_CPUTIME_ID is always there on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}
