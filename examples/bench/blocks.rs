//! `--blocks`: the block-indexed form against the list form at serving-scale batches (issue
//! 35). For each transport (TCP, then same-host), block size (`--blocks-sizes`, default 64 B,
//! 2 KiB, 16 KiB, 64 KiB), and op, one batch of `--batch` blocks (default 100,000) at random
//! distinct block indices on both sides (cycling when the region, `--region`, holds fewer
//! blocks than the batch; `--blocks-seq`: blocks in order, back to back, the same on both sides), moved as descriptors (`transfer_sync`) and as a block batch
//! (`transfer_blocks_sync`) in alternation, A B A B, `--blocks-rounds` times (default 5). Each
//! row: p50 wall time per call as ns per descriptor and GB/s, the client process's CPU time per
//! descriptor (`CLOCK_PROCESS_CPUTIME_ID`: the caller and the same-host helper; a TCP server in
//! its child process is not in it), the p50 of the per-round ratio list / blocks (each round's
//! two calls back to back, so a loaded machine shifts both), and the anchors of the same
//! invocation: memcpy of the same block size in sequence (`memcpy`, GB/s) and a one-thread copy
//! of the same blocks at the same indices between two buffers (`memcpy_idx`, ns per block).
//! Before the timed rounds, one block WRITE of fresh bytes is read back with the list form and
//! compared (the distinct blocks of the batch).

use std::time::{Duration, Instant};

use hixl::testkit::Rng;
use hixl::{BlockLayout, Hixl, HostBuffer, TransferDesc, TransferOp};

use super::{
    Args, ServeSpec, anchors::memcpy_gbps, client_options, human, progress, server_stop,
    start_server, ws,
};

/// What `--blocks` runs.
#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) sizes: Vec<usize>,
    pub(crate) batch: usize,
    pub(crate) rounds: usize,
    pub(crate) transports: Vec<String>,
    /// Random distinct indices (`false`), or blocks in order, back to back (`true`).
    pub(crate) sequential: bool,
}

/// CPU time of this process so far.
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `n` block indices below `limit`: a random permutation, repeated when `n > limit`.
fn indices(rng: &mut Rng, n: usize, limit: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..limit as u32).collect();
    let m = n.min(limit);
    for i in 0..m {
        let j = i + rng.below((limit - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(m);
    (0..n).map(|k| all[k % m]).collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A one-thread copy of `block`-byte blocks at the given indices between two buffers of the
/// working set's size, ns per block (best of three).
fn memcpy_idx_ns(block: usize, from: &[u32], to: &[u32]) -> f64 {
    let mut src = vec![0u8; ws()];
    let mut dst = vec![0u8; ws()];
    Rng::new(4).fill(&mut src);
    dst.copy_from_slice(&src);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        for (&f, &t) in from.iter().zip(to) {
            let (f, t) = (f as usize * block, t as usize * block);
            dst[t..t + block].copy_from_slice(&src[f..f + block]);
        }
        std::hint::black_box(&dst);
        best = best.min(t0.elapsed().as_nanos() as f64 / from.len() as f64);
    }
    best
}

/// The `--blocks` rows.
pub(crate) fn rows(a: &Args, s: &Spec) -> Result<(), Box<dyn std::error::Error>> {
    let server = start_server(
        a.processes,
        ServeSpec {
            size: ws(),
            regions: 1,
            user: false,
            ucx: false,
            conns: 0,
        },
    )?;
    if !a.json {
        println!(
            "\n{:<10} {:<6} {:>7} {:>7} {:>6} | {:>9} {:>9} {:>7} | {:>9} {:>9} {:>7} | {:>7} | {:>7} {:>9}",
            "transport",
            "op",
            "block",
            "batch",
            "order",
            "list ns",
            "list cpu",
            "GB/s",
            "blk ns",
            "blk cpu",
            "GB/s",
            "ratio",
            "memcpy",
            "idx ns",
        );
    }
    for t in &s.transports {
        let mut mem = HostBuffer::new(ws())?;
        Rng::new(2).fill(&mut mem); // touch every page
        let (client, mut buf) = Hixl::initialize("127.0.0.1", client_options(t))?.register(mem)?;
        let client = client.activate()?;
        let link = client.connect_timeout(server.name(), Duration::from_secs(5))?;
        let remote = link.regions().next().ok_or("the server has no region")?;
        for &block in &s.sizes {
            let slots = ws() / block;
            let mut rng = Rng::new(block as u64);
            let (li, ri) = match s.sequential {
                true => {
                    let v: Vec<u32> = (0..s.batch).map(|k| (k % slots) as u32).collect();
                    (v.clone(), v)
                }
                false => (
                    indices(&mut rng, s.batch, slots),
                    indices(&mut rng, s.batch, slots),
                ),
            };
            let pattern = if s.sequential { "seq" } else { "random" };
            let idx_ns = memcpy_idx_ns(block, &li, &ri);
            let mc = memcpy_gbps(block);
            for &op in &a.ops {
                progress(&format!(
                    "blocks: {t} {op} {} x{} ...",
                    human(block),
                    s.batch
                ));
                // the data: fresh bytes written with the blocks, read back as descriptors
                {
                    let distinct = s.batch.min(slots);
                    let fresh = Rng::new(block as u64 ^ 0x35).bytes(ws());
                    buf.write_at(0, &fresh)?;
                    link.transfer_blocks_sync(
                        TransferOp::Write,
                        &BlockLayout::new(buf.range(..)?, remote.full(), block as u64),
                        &li[..distinct],
                        &ri[..distinct],
                        Duration::from_secs(120),
                    )?;
                    buf.write_at(0, &vec![0u8; ws()])?;
                    let back: Vec<TransferDesc<'_>> = li[..distinct]
                        .iter()
                        .zip(&ri[..distinct])
                        .map(|(&l, &r)| {
                            let (l, r) = (l as usize * block, r as u64 * block as u64);
                            Ok(TransferDesc::new(
                                buf.range(l..l + block)?,
                                remote.range(r..r + block as u64)?,
                            ))
                        })
                        .collect::<Result<_, hixl::Error>>()?;
                    link.transfer_sync(TransferOp::Read, &back, Duration::from_secs(120))?;
                    drop(back);
                    let mut got = vec![0u8; ws()];
                    buf.read_at(0, &mut got)?;
                    for &l in &li[..distinct] {
                        let l = l as usize * block;
                        if got[l..l + block] != fresh[l..l + block] {
                            return Err(format!(
                                "blocks {t} {} at local offset {l}: the block WRITE read back \
                                 as descriptors differs",
                                human(block)
                            )
                            .into());
                        }
                    }
                }
                let layout = BlockLayout::new(buf.range(..)?, remote.full(), block as u64);
                let descs: Vec<TransferDesc<'_>> = li
                    .iter()
                    .zip(&ri)
                    .map(|(&l, &r)| {
                        let (l, r) = (l as usize * block, r as u64 * block as u64);
                        Ok(TransferDesc::new(
                            buf.range(l..l + block)?,
                            remote.range(r..r + block as u64)?,
                        ))
                    })
                    .collect::<Result<_, hixl::Error>>()?;
                let timeout = Duration::from_secs(120);
                let (mut lw, mut lc, mut bw, mut bc, mut ratio) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
                // one warm-up call of each
                link.transfer_sync(op, &descs, timeout)?;
                link.transfer_blocks_sync(op, &layout, &li, &ri, timeout)?;
                for _ in 0..s.rounds {
                    let (t0, c0) = (Instant::now(), cpu_now());
                    link.transfer_sync(op, &descs, timeout)?;
                    let (t1, c1) = (Instant::now(), cpu_now());
                    link.transfer_blocks_sync(op, &layout, &li, &ri, timeout)?;
                    let (t2, c2) = (Instant::now(), cpu_now());
                    let n = s.batch as f64;
                    lw.push((t1 - t0).as_nanos() as f64 / n);
                    lc.push((c1 - c0).as_nanos() as f64 / n);
                    bw.push((t2 - t1).as_nanos() as f64 / n);
                    bc.push((c2 - c1).as_nanos() as f64 / n);
                    ratio.push((t1 - t0).as_secs_f64() / (t2 - t1).as_secs_f64());
                }
                drop(descs);
                let (lw, lc, bw, bc, ratio) = (
                    median(&mut lw),
                    median(&mut lc),
                    median(&mut bw),
                    median(&mut bc),
                    median(&mut ratio),
                );
                let gbps = |ns_per: f64| block as f64 / ns_per;
                if a.json {
                    for (form, w, c) in [("list", lw, lc), ("blocks", bw, bc)] {
                        println!(
                            "{{\"metric\":\"blocks\",\"pattern\":\"{pattern}\",\"transport\":\"{t}\",\"op\":\"{}\",\"block\":{block},\"batch\":{},\"form\":\"{form}\",\"rounds\":{},\"ns_per_desc\":{w:.1},\"cpu_ns_per_desc\":{c:.1},\"gbps\":{:.3},\"list_over_blocks\":{ratio:.3},\"memcpy_gbps\":{mc:.3},\"memcpy_idx_ns_per_block\":{idx_ns:.1}}}",
                            op.name().to_ascii_lowercase(),
                            s.batch,
                            s.rounds,
                            gbps(w),
                        );
                    }
                } else {
                    progress("");
                    println!(
                        "{:<10} {:<6} {:>7} {:>7} {pattern:>6} | {:>9.1} {:>9.1} {:>7.2} | {:>9.1} {:>9.1} {:>7.2} | {:>7.2} | {:>7.2} {:>9.1}",
                        t,
                        op.name(),
                        human(block),
                        s.batch,
                        lw,
                        lc,
                        gbps(lw),
                        bw,
                        bc,
                        gbps(bw),
                        ratio,
                        mc,
                        idx_ns,
                    );
                }
            }
        }
        drop(link);
        let _ = client.finalize();
    }
    progress("");
    server_stop(server)
}
