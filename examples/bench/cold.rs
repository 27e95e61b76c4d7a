//! The first round after connect against the warm rounds that follow it, on the same link: a
//! row per op (`metric` `cold_first_round`), printed after the op x block table.
//!
//! A round is one pass over the whole region (`--region`, default 256 MiB) in calls of
//! `--cold-batch` blocks of `--cold-block` bytes (default 256 x 32 KiB = 8 MiB a call). For each
//! op, `--cold-reps` times (default 3), a fresh client engine registers its memory (touched
//! first, as a KV cache is), connects to the serving process (which filled its region when it
//! started), and runs the cold round right away, then `--cold-warm` warm rounds (default 3) on
//! the same link. The row gives the median connect time, the median cold round's GB/s, the
//! median warm round's, and `cold_over_warm`: the median cold round's time over the median warm
//! round's (1.0: the first round as fast as a warm one; medians, as the machine may be busy). Same-host,
//! what the cold round pays is the first touch of the peer's pages through a fresh mapping
//! (`Options::prefault_budget` populates them at connect); over TCP, its lanes' first use.
//! One call of the row is verified afterwards, as every row is ([`super::verify`]).

use std::time::{Duration, Instant};

use hixl::testkit::Rng;
use hixl::{Hixl, HostBuffer, TransferOp};

use super::verify::{CALL_TIMEOUT, check_call};
use super::{
    Args, ServeSpec, Server, client_options, descs, human, plan, progress, server_stop,
    start_server, ws,
};

/// What the cold rows are run with (from the command line).
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub block: usize,
    pub batch: usize,
    pub warm: usize,
    pub reps: usize,
}

/// One op's cold row.
struct Cold {
    op: TransferOp,
    connect_ms: f64,
    cold_s: f64,
    warm_s: f64,
}

/// Runs and prints the cold rows of `a`'s ops over `a`'s transport.
pub(crate) fn rows(a: &Args, s: Spec) -> Result<(), Box<dyn std::error::Error>> {
    let region = ws();
    let block = s.block.clamp(1, region);
    let batch = s.batch.clamp(1, (region / block).max(1));
    let mut server = start_server(a.processes, ServeSpec::of(a, region))?;
    let mut out = Vec::new();
    for &op in &a.ops {
        let (mut colds, mut warms, mut connects) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..s.reps.max(1) {
            progress(&format!(
                "cold first round: {op} {} x{batch} ({}/{}) ...",
                human(block),
                rep + 1,
                s.reps.max(1)
            ));
            let (connect_ms, cold_s, warm) = once(a, &mut server, op, (region, block, batch), s)?;
            connects.push(connect_ms);
            colds.push(cold_s);
            warms.extend(warm);
        }
        out.push(Cold {
            op,
            connect_ms: median(&mut connects),
            cold_s: median(&mut colds),
            warm_s: median(&mut warms),
        });
    }
    server_stop(server)?;
    progress("");
    eprint!("\r\x1b[2K");
    let bytes = plan(region, block, batch, 0, 0).len() * batch * block;
    for c in &out {
        let (cold, warm) = (bytes as f64 / c.cold_s / 1e9, bytes as f64 / c.warm_s / 1e9);
        let ratio = c.cold_s / c.warm_s;
        if a.json {
            println!(
                "{{\"metric\":\"cold_first_round\",\"op\":\"{}\",\"transport\":\"{}\",\"block\":{block},\"batch\":{batch},\"bytes\":{bytes},\"processes\":{},\"connect_ms\":{:.3},\"cold_gbps\":{cold:.3},\"warm_gbps\":{warm:.3},\"cold_over_warm\":{ratio:.3}}}",
                c.op.name(),
                a.transport,
                a.processes,
                c.connect_ms
            );
        } else {
            println!(
                "first round after connect: {} {} {} x{batch}, {} a round: cold {cold:.3} GB/s, warm {warm:.3} GB/s (medians of {} cold and {} warm rounds), cold/warm time {ratio:.2}, connect {:.2} ms",
                c.op.name(),
                a.transport,
                human(block),
                human(bytes),
                s.reps.max(1),
                s.reps.max(1) * s.warm.max(1),
                c.connect_ms
            );
        }
    }
    Ok(())
}

/// The median of `xs` (not empty).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One fresh client engine and link: the connect time (ms), the first round's time and the
/// warm rounds' (s).
fn once(
    a: &Args,
    server: &mut Server,
    op: TransferOp,
    (region, block, batch): (usize, usize, usize),
    s: Spec,
) -> Result<(f64, f64, Vec<f64>), Box<dyn std::error::Error>> {
    let mut mem = HostBuffer::new(region)?;
    Rng::new(3).fill(&mut mem); // touch every page
    let (client, mut buf) =
        Hixl::initialize("127.0.0.1", client_options(&a.transport))?.register(mem)?;
    let client = client.activate()?;
    let t0 = Instant::now();
    let link = client.connect_timeout(server.name(), Duration::from_secs(5))?;
    let connect_ms = t0.elapsed().as_secs_f64() * 1e3;
    let plan = plan(region, block, batch, 0, 0);
    let calls = descs(&buf, &link, &plan)?;
    let round = || -> Result<f64, hixl::Error> {
        let t = Instant::now();
        for d in &calls {
            link.transfer_sync(op, d, CALL_TIMEOUT)?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let cold_s = round()?;
    let warm = (0..s.warm.max(1))
        .map(|_| round())
        .collect::<Result<Vec<_>, _>>()?;
    drop(calls);
    let checks = check_call(&link, &mut buf, op, &plan[0])?;
    server.confirm(&checks, &format!("cold {op} {} x{batch}", human(block)))?;
    drop(link);
    Ok((connect_ms, cold_s, warm))
}
