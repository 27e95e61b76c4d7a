//! The first round after connect against the warm rounds that follow it, on the same link: a
//! row per op (`metric` `cold_first_round`), printed after the op x block table.
//!
//! A round is one pass over the whole region (`--region`, default 256 MiB) in calls of
//! `--cold-batch` blocks of `--cold-block` bytes (default 256 x 32 KiB = 8 MiB a call). For each
//! op a fresh client engine registers its memory (touched first, as a KV cache is), connects to
//! the serving process (which filled its region when it started), and runs the cold round right
//! away, then `--cold-warm` warm rounds (default 3) on the same link. The row gives the connect
//! time, the cold round's GB/s, the median warm round's, and `cold_over_warm`: the cold round's
//! time over the median warm round's (1.0: the first round as fast as a warm one). Same-host,
//! what the cold round pays is the first touch of the peer's pages through a fresh mapping
//! (`Options::prefault_budget` populates them at connect); over TCP, its lanes' first use.
//! One call of the row is verified afterwards, as every row is ([`super::verify`]).

use std::time::{Duration, Instant};

use hixl::testkit::Rng;
use hixl::{Hixl, HostBuffer, TransferOp};

use super::verify::{CALL_TIMEOUT, check_call};
use super::{
    Args, ServeSpec, client_options, descs, human, plan, progress, server_stop, start_server, ws,
};

/// What the cold rows are run with (from the command line).
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub block: usize,
    pub batch: usize,
    pub warm: usize,
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
        progress(&format!(
            "cold first round: {op} {} x{batch} ...",
            human(block)
        ));
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
        let mut warm = (0..s.warm.max(1))
            .map(|_| round())
            .collect::<Result<Vec<_>, _>>()?;
        warm.sort_by(f64::total_cmp);
        let warm_s = warm[warm.len() / 2];
        drop(calls);
        let checks = check_call(&link, &mut buf, op, &plan[0])?;
        server.confirm(&checks, &format!("cold {op} {} x{batch}", human(block)))?;
        drop(link);
        out.push(Cold {
            op,
            connect_ms,
            cold_s,
            warm_s,
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
                "first round after connect: {} {} {} x{batch}, {} a round: cold {cold:.3} GB/s, warm {warm:.3} GB/s (median of {}), cold/warm time {ratio:.2}, connect {:.2} ms",
                c.op.name(),
                a.transport,
                human(block),
                human(bytes),
                s.warm.max(1),
                c.connect_ms
            );
        }
    }
    Ok(())
}
