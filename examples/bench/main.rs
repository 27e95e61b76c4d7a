//! hixl's benchmark, in the manner of nixlbench: op x transport x block size x batch, GB/s
//! (1e9 bytes/s), p50/p99 latency per call, and the anchors measured in the same invocation.
//!
//! ```text
//! cargo run --release --example bench                      # a useful table in about a minute
//! cargo run --release --example bench -- --anchors         # plus iperf3 / Mooncake / NIXL / ucx_perftest
//! cargo run --release --example bench -- --op write --block 1048576 --batch 4 --duration 5 --json
//! ```
//!
//! Options:
//! - `--transport tcp|same-host|ucx` (same-host, or `cma` for short: the same-host transport,
//!   required; tcp: never the same-host one; ucx: UCX required, over the transports `UCX_TLS` names, e.g.
//!   `UCX_TLS=tcp UCX_NET_DEVICES=lo` or `UCX_TLS=sm`; its anchor is `ucx_perftest ucp_put_bw`
//!   with the same `UCX_TLS`)
//! - `--memory hostbuffer|user`: the serving region is a `HostBuffer` (memfd, mapped by
//!   same-host clients) or a `Vec<u8>` (reached with `process_vm_readv`/`writev`)
//! - `--op write,read`; `--block 4096,65536,1048576,16777216` (bytes, comma lists)
//! - `--batch N` (descriptors per call; default 256 below 64 KiB, 64 below 1 MiB, 4 from 1 MiB)
//! - `--iters N` or `--duration SECONDS` per row (default 2 s)
//! - `--processes 1|2` (default 2: the serving engine runs in a child process)
//! - `--threads N`: callers sharing the one link (default 1)
//! - `--json`: one JSON object per row on stdout
//! - `--anchors`: run `tools/bench-anchors.sh` for the matching anchors (`bench-anchors.sh install`
//!   first); `HIXL_PEERS` overrides the script's path. Over TCP, iperf3 twice: one stream with its
//!   default 128 KiB writes (`iperf3`), and two streams of 1 MiB writes (`iperf3_x2`: what a large
//!   batch, which hixl splits over two lanes, is measured against). Same-host rows always carry
//!   memcpy of the same blocks on one thread (`memcpy`) and on two (`memcpy_x2`)
//! - `--ws BYTES`: the part of the 256 MiB region each row cycles through (default all of it, so
//!   transfers come from memory, not caches); `--ws 0` means one block, as `ucx_perftest` does
//!   (the same buffer every time)
//! - `--no-extras`: skip the 8-byte latency, connect-with-4000-regions and registration rows

mod anchors;

use anchors::{anchor, memcpy_gbps, memcpy2_gbps, pvm_gbps};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hixl::testkit::Rng;
use hixl::{Hixl, HostBuffer, Options, SameHost, TransferDesc, TransferOp, Ucx};

const WS: usize = 256 << 20; // working set per side, as the memcpy anchor uses

struct Args {
    transport: String,
    ops: Vec<TransferOp>,
    blocks: Vec<usize>,
    batch: Option<usize>,
    iters: Option<usize>,
    duration: Duration,
    processes: u32,
    threads: usize,
    user_memory: bool,
    json: bool,
    anchors: bool,
    ws: usize,
    extras: bool,
}

/// The command line (the module docs say more about each option).
#[derive(clap::Parser)]
#[command(about = "hixl's benchmark: op x transport x block size x batch")]
struct Cli {
    /// tcp, same-host (the same-host transport, required; `cma` for short) or ucx (required)
    #[arg(long, default_value = "tcp", value_parser = transports())]
    transport: String,
    /// Operations, a comma list of write and read
    #[arg(long = "op", value_delimiter = ',', default_value = "write,read", value_parser = parse_op)]
    ops: Vec<TransferOp>,
    /// Block sizes in bytes, a comma list
    #[arg(
        long = "block",
        value_delimiter = ',',
        default_value = "4096,65536,1048576,16777216"
    )]
    blocks: Vec<usize>,
    /// Descriptors per call (default 256 below 64 KiB, 64 below 1 MiB, 4 from 1 MiB)
    #[arg(long)]
    batch: Option<usize>,
    /// Calls per row (instead of --duration)
    #[arg(long)]
    iters: Option<usize>,
    /// Seconds per row
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// 1, or 2: the serving engine runs in a child process
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    processes: u32,
    /// Callers sharing the one link
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The serving region: hostbuffer (memfd) or user (a Vec<u8>)
    #[arg(long, default_value = "hostbuffer", value_parser = ["hostbuffer", "user"])]
    memory: String,
    /// One JSON object per row on stdout
    #[arg(long)]
    json: bool,
    /// Run tools/bench-anchors.sh for the matching anchors
    #[arg(long)]
    anchors: bool,
    /// Bytes of the 256 MiB region each row cycles through (0: one block)
    #[arg(long, default_value_t = WS)]
    ws: usize,
    /// Skip the 8-byte latency, connect-with-4000-regions and registration rows
    #[arg(long)]
    no_extras: bool,
}

/// The transports `--transport` takes, `cma` an alias of `same-host`.
fn transports() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    [
        PossibleValue::new("tcp"),
        PossibleValue::new("same-host").alias("cma"),
        PossibleValue::new("ucx"),
    ]
    .into()
}

fn parse_op(o: &str) -> Result<TransferOp, String> {
    match o.trim().to_ascii_lowercase().as_str() {
        "write" => Ok(TransferOp::Write),
        "read" => Ok(TransferOp::Read),
        o => Err(format!("unknown op {o}")),
    }
}

fn parse() -> Result<Args, String> {
    let c = <Cli as clap::Parser>::parse();
    let a = Args {
        // one name in the rows: `cma` is only an alias on the command line
        transport: match c.transport.as_str() {
            "cma" => "same-host".to_owned(),
            _ => c.transport,
        },
        ops: c.ops,
        blocks: c.blocks,
        batch: c.batch,
        iters: c.iters,
        duration: Duration::try_from_secs_f64(c.duration)
            .map_err(|e| format!("--duration: {e}"))?,
        processes: c.processes,
        threads: c.threads.max(1),
        user_memory: c.memory == "user",
        json: c.json,
        anchors: c.anchors,
        ws: c.ws,
        extras: !c.no_extras,
    };
    if let Some(&b) = a.blocks.iter().find(|&&b| b == 0 || b > WS) {
        return Err(format!("block {b} must be in 1..={WS}"));
    }
    Ok(a)
}

/// The client's options for the chosen transport: TCP only, the same-host transport required,
/// or UCX required (naming its process, as a client on the server's host must to get UCX: its
/// batches run inside the server's fence).
fn client_options(a: &Args) -> Options {
    let o = Options::default().same_host(match a.transport.as_str() {
        "same-host" => SameHost::Require,
        "ucx" => SameHost::Auto,
        _ => SameHost::Forbid,
    });
    if a.transport == "ucx" {
        o.psk(BENCH_KEY).ucx(Ucx::Require)
    } else {
        o
    }
}

/// The pre-shared key of the UCX rows (UCX needs authenticated peers).
const BENCH_KEY: &str = "hixl-bench-ucx-key";

fn default_batch(block: usize) -> usize {
    match block {
        b if b < 65536 => 256,
        b if b < 1 << 20 => 64,
        _ => 4,
    }
}

/// The serving side: in this process, or a child (`bench --serve SIZE REGIONS`).
enum Server {
    Local(Box<Hixl<hixl::Connected>>, String),
    Child(Child, String),
}

impl Server {
    fn name(&self) -> &str {
        match self {
            Server::Local(_, n) | Server::Child(_, n) => n,
        }
    }
}

fn start_server(
    processes: u32,
    size: usize,
    regions: usize,
    user: bool,
    ucx: bool,
) -> Result<Server, Box<dyn std::error::Error>> {
    if processes == 1 {
        let (e, name) = serve(size, regions, user, ucx)?;
        return Ok(Server::Local(Box::new(e), name));
    }
    let kind = if user { "user" } else { "hostbuffer" };
    let with = if ucx { "ucx" } else { "plain" };
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--serve",
            &size.to_string(),
            &regions.to_string(),
            kind,
            with,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let name = line
        .strip_prefix("READY ")
        .ok_or(format!("server said {line:?}"))?
        .trim()
        .to_owned();
    Ok(Server::Child(child, name))
}

fn serve(
    size: usize,
    regions: usize,
    user: bool,
    ucx: bool,
) -> Result<(Hixl<hixl::Connected>, String), hixl::Error> {
    let mut opts = Options::default().max_regions(regions.max(1) + 1);
    if ucx {
        opts = opts.psk(BENCH_KEY).ucx(Ucx::Require);
    }
    let e = Hixl::initialize_ephemeral("127.0.0.1", opts)?.into_registered();
    if regions <= 1 && user {
        // ordinary user memory: same-host clients reach it with process_vm_readv/writev
        let mut v = vec![0u8; size];
        Rng::new(1).fill(&mut v);
        std::mem::forget(e.register(v)?);
    } else if regions <= 1 {
        // touch every page (random bytes), as a real KV cache is
        let mut buf = HostBuffer::new(size)?;
        Rng::new(1).fill(&mut buf);
        let r = e.register(buf)?;
        std::mem::forget(r); // stays registered until the engine goes away
    } else {
        for _ in 0..regions {
            std::mem::forget(e.register(HostBuffer::new(size / regions)?)?);
        }
    }
    let e = e.activate()?;
    let name = e.name().to_owned();
    Ok((e, name))
}

fn serve_main(
    size: usize,
    regions: usize,
    user: bool,
    ucx: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let (e, name) = serve(size, regions, user, ucx)?;
    println!("READY {name}");
    std::io::stdout().flush()?;
    // serve until the parent closes our stdin
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {}
    let _ = e.finalize();
    Ok(())
}

struct Row {
    op: &'static str,
    block: usize,
    batch: usize,
    gbps: f64,
    p50_us: f64,
    p99_us: f64,
    calls: usize,
    anchors: Vec<(String, Option<f64>)>,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

fn progress(msg: &str) {
    eprint!("\r\x1b[2K{msg}");
    let _ = std::io::stderr().flush();
}

/// Runs one (op, block, batch) row against `server`.
fn measure(
    a: &Args,
    server: &Server,
    op: TransferOp,
    block: usize,
    batch: usize,
) -> Result<Row, Box<dyn std::error::Error>> {
    let mut mem = HostBuffer::new(WS)?;
    Rng::new(2).fill(&mut mem); // touch every page
    let (client, buf) = Hixl::initialize("127.0.0.1", client_options(a))?.register(mem)?;
    let client = client.activate()?;
    let link = client.connect_timeout(server.name(), Duration::from_secs(5))?;
    let remote = link.regions().next().ok_or("the server has no region")?;
    let ws = if a.ws == 0 {
        block
    } else {
        a.ws.clamp(block, WS)
    };
    let slots = (ws / block).max(1);
    let calls_in_ws = (slots / batch).max(1);
    let descs: Vec<Vec<TransferDesc<'_>>> = (0..calls_in_ws)
        .map(|c| {
            (0..batch)
                .map(|j| {
                    let off = ((c * batch + j) % slots) * block;
                    Ok(TransferDesc::new(
                        buf.range(off..off + block)?,
                        remote.range(off as u64..(off + block) as u64)?,
                    ))
                })
                .collect::<Result<Vec<_>, hixl::Error>>()
        })
        .collect::<Result<_, _>>()?;
    let t = Duration::from_secs(30);
    // warm up: every lane, and every page of the working set once (steady state: a long-lived
    // link has its mappings populated; the first touch of a page costs more than its copy)
    let warm = Instant::now();
    for d in descs.iter() {
        link.transfer_sync(op, d, t)?;
        if warm.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    // `threads` callers share the link, each on its own share of the working set
    let started = Instant::now();
    let per_thread: Vec<Result<(usize, Vec<Duration>), hixl::Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.threads)
            .map(|th| {
                let (link, descs) = (&link, &descs);
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(100_000);
                    let mut i = 0;
                    loop {
                        let done = match a.iters {
                            Some(n) => i >= n.div_ceil(a.threads),
                            None => started.elapsed() >= a.duration,
                        };
                        if done {
                            break;
                        }
                        let t0 = Instant::now();
                        link.transfer_sync(op, &descs[(i * a.threads + th) % calls_in_ws], t)?;
                        lat.push(t0.elapsed());
                        i += 1;
                    }
                    Ok((i, lat))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread panicked"))
            .collect()
    });
    let total = started.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    let mut i = 0;
    for r in per_thread {
        let (n, l) = r?;
        i += n;
        lat.extend(l);
    }
    lat.sort_unstable();
    let mut anchors = Vec::new();
    if a.transport == "same-host" {
        progress(&format!("anchors: memcpy {} ...", human(block)));
        anchors.push(("memcpy".to_owned(), Some(memcpy_gbps(block))));
        progress(&format!("anchors: memcpy x2 {} ...", human(block)));
        anchors.push(("memcpy_x2".to_owned(), Some(memcpy2_gbps(block))));
        if a.user_memory {
            progress(&format!("anchors: process_vm {} ...", human(block)));
            anchors.push((
                "process_vm".to_owned(),
                pvm_gbps(op, link.remote_pid(), remote.addr(), block, &buf),
            ));
        }
    }
    drop(descs);
    drop(link);
    Ok(Row {
        op: op.name(),
        block,
        batch,
        gbps: (i * batch * block) as f64 / total / 1e9,
        p50_us: pct(&lat, 0.5),
        p99_us: pct(&lat, 0.99),
        calls: i,
        anchors,
    })
}

fn human(b: usize) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1024 && b % 1024 == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--serve") {
        let size = argv.get(2).and_then(|s| s.parse().ok()).unwrap_or(WS);
        let regions = argv.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
        let user = argv.get(4).map(String::as_str) == Some("user");
        let ucx = argv.get(5).map(String::as_str) == Some("ucx");
        return serve_main(size, regions, user, ucx);
    }
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(2);
        }
    };
    let server = start_server(a.processes, WS, 1, a.user_memory, a.transport == "ucx")?;
    let mut rows = Vec::new();
    let total = a.ops.len() * a.blocks.len();
    for (k, (&block, &op)) in a
        .blocks
        .iter()
        .flat_map(|b| a.ops.iter().map(move |o| (b, o)))
        .enumerate()
    {
        let batch = a
            .batch
            .unwrap_or_else(|| default_batch(block))
            .clamp(1, (WS / block).max(1));
        progress(&format!(
            "[{}/{}] {} {} x{} ...",
            k + 1,
            total,
            op,
            human(block),
            batch
        ));
        rows.push(measure(&a, &server, op, block, batch)?);
    }
    let mut extra = Vec::new();
    if a.extras {
        for op in [TransferOp::Write, TransferOp::Read] {
            progress(&format!("8-byte {op} latency ..."));
            let mut r = measure(
                &Args {
                    iters: Some(20_000),
                    ..clone_args(&a)
                },
                &server,
                op,
                8,
                1,
            )?;
            r.op = match op {
                TransferOp::Write => "WRITE 8B",
                TransferOp::Read => "READ 8B",
            };
            extra.push(r);
        }
    }
    drop(server_stop(server));
    if a.anchors && a.transport == "same-host" {
        for r in &mut rows {
            let op = r.op.to_ascii_lowercase();
            let size = r.block.to_string();
            progress(&format!("anchors: {} {} ...", r.op, human(r.block)));
            r.anchors
                .push(("nixl_sm".into(), anchor(&["nixl", &op, &size, "sm"])));
            r.anchors
                .push(("ucx_sm".into(), anchor(&["ucx-sm", &size])));
        }
    } else if a.anchors && a.transport == "ucx" {
        let tls = std::env::var("UCX_TLS").unwrap_or_default();
        let which = if tls.contains("tcp") {
            "ucx-tcp"
        } else {
            "ucx-sm"
        };
        for r in &mut rows {
            let size = r.block.to_string();
            progress(&format!("anchors: {which} {} ...", human(r.block)));
            r.anchors
                .push(("ucx_perftest".into(), anchor(&[which, &size])));
        }
    } else if a.anchors {
        progress("anchors: iperf3 ...");
        let iperf = anchor(&["iperf"]);
        progress("anchors: iperf3 -P 2 -l 1M ...");
        let iperf2 = anchor(&["iperf", "2", "1M"]);
        for r in &mut rows {
            let op = r.op.to_ascii_lowercase();
            let size = r.block.to_string();
            progress(&format!("anchors: {} {} ...", r.op, human(r.block)));
            r.anchors.push(("iperf3".into(), iperf));
            r.anchors.push(("iperf3_x2".into(), iperf2));
            r.anchors
                .push(("mooncake".into(), anchor(&["mooncake", &op, &size])));
            r.anchors
                .push(("nixl".into(), anchor(&["nixl", &op, &size, "tcp"])));
            if r.block < 1 << 20 {
                r.anchors
                    .push(("ucx_perftest".into(), anchor(&["ucx-tcp", &size])));
            }
        }
    }
    progress("");
    eprint!("\r\x1b[2K");
    print_rows(&a, &rows);
    if a.extras {
        let (conn, reg) = connect_and_register_costs(&a)?;
        print_rows(&a, &extra);
        if a.json {
            println!(
                "{{\"metric\":\"connect_4000_regions\",\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
                conn.0, conn.1
            );
            println!("{{\"metric\":\"register_per_region\",\"us\":{reg:.3}}}");
        } else {
            println!(
                "connect with 4000 registered regions: p50 {:.2} ms, p99 {:.2} ms",
                conn.0, conn.1
            );
            println!("registration: {reg:.2} us per region (4000 regions of 4 KiB)");
        }
    }
    Ok(())
}

fn clone_args(a: &Args) -> Args {
    Args {
        transport: a.transport.clone(),
        ops: a.ops.clone(),
        blocks: a.blocks.clone(),
        batch: a.batch,
        iters: a.iters,
        duration: a.duration,
        processes: a.processes,
        threads: a.threads,
        user_memory: a.user_memory,
        json: a.json,
        anchors: a.anchors,
        extras: a.extras,
        ws: a.ws,
    }
}

fn server_stop(s: Server) -> Result<(), Box<dyn std::error::Error>> {
    match s {
        Server::Local(e, _) => {
            let _ = e.finalize();
        }
        Server::Child(mut c, _) => {
            drop(c.stdin.take());
            c.wait()?;
        }
    }
    Ok(())
}

/// Connect time to a server with 4000 regions (p50/p99 ms), and registration cost per region (us).
fn connect_and_register_costs(a: &Args) -> Result<((f64, f64), f64), Box<dyn std::error::Error>> {
    progress("connect with 4000 regions ...");
    let server = start_server(a.processes, 4000 * 4096, 4000, false, a.transport == "ucx")?;
    let client = Hixl::initialize("127.0.0.1", client_options(a))?
        .into_registered()
        .activate()?;
    let mut lat = Vec::new();
    for _ in 0..50 {
        let t0 = Instant::now();
        let link = client.connect_timeout(server.name(), Duration::from_secs(5))?;
        lat.push(t0.elapsed());
        assert_eq!(link.regions().len(), 4000);
        link.disconnect(Duration::from_secs(5))?;
    }
    lat.sort_unstable();
    server_stop(server)?;
    progress("registration cost ...");
    let e = Hixl::initialize("127.0.0.1", Options::default())?.into_registered();
    let bufs: Vec<HostBuffer> = (0..4000)
        .map(|_| HostBuffer::new(4096))
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    let regions: Vec<_> = bufs
        .into_iter()
        .map(|b| e.register(b))
        .collect::<Result<_, _>>()?;
    let per = t0.elapsed().as_secs_f64() * 1e6 / 4000.0;
    drop(regions);
    eprint!("\r\x1b[2K");
    Ok(((pct(&lat, 0.5) / 1000.0, pct(&lat, 0.99) / 1000.0), per))
}

fn print_rows(a: &Args, rows: &[Row]) {
    if a.json {
        for r in rows {
            // the primary anchor: iperf3 with two streams of 1 MiB writes from 1 MiB,
            // ucx_perftest below (the targets' references)
            let primary = r
                .anchors
                .iter()
                .find(|(n, _)| {
                    n == if r.block >= 1 << 20 {
                        "iperf3_x2"
                    } else {
                        "ucx_perftest"
                    }
                })
                .or(r.anchors.first());
            let (an, ag) = match primary {
                Some((n, Some(g))) => (format!("\"{n}\""), format!("{g:.3}")),
                Some((n, None)) => (format!("\"{n}\""), "null".into()),
                None => ("null".into(), "null".into()),
            };
            let ratio = match primary {
                Some((_, Some(g))) => format!("{:.3}", r.gbps / g),
                _ => "null".into(),
            };
            let all: Vec<String> = r
                .anchors
                .iter()
                .map(|(n, g)| format!("\"{n}\":{}", g.map_or("null".into(), |g| format!("{g:.3}"))))
                .collect();
            println!(
                "{{\"op\":\"{}\",\"transport\":\"{}\",\"block\":{},\"batch\":{},\"gbps\":{:.3},\"p50_us\":{:.2},\"p99_us\":{:.2},\"calls\":{},\"processes\":{},\"anchor\":{an},\"anchor_gbps\":{ag},\"ratio\":{ratio},\"anchors\":{{{}}}}}",
                r.op,
                a.transport,
                r.block,
                r.batch,
                r.gbps,
                r.p50_us,
                r.p99_us,
                r.calls,
                a.processes,
                all.join(",")
            );
        }
        return;
    }
    let names: Vec<String> = {
        let mut n: Vec<String> = Vec::new();
        for r in rows {
            for (a, _) in &r.anchors {
                if !n.contains(a) {
                    n.push(a.clone());
                }
            }
        }
        n
    };
    print!(
        "{:<9} {:<9} {:>8} {:>6} {:>8} {:>9} {:>9}",
        "op", "transport", "block", "batch", "GB/s", "p50 us", "p99 us"
    );
    for n in &names {
        print!(" {:>13} {:>6}", format!("{n} GB/s"), "ratio");
    }
    println!();
    for r in rows {
        print!(
            "{:<9} {:<9} {:>8} {:>6} {:>8.3} {:>9.1} {:>9.1}",
            r.op,
            a.transport,
            human(r.block),
            r.batch,
            r.gbps,
            r.p50_us,
            r.p99_us
        );
        for n in &names {
            match r.anchors.iter().find(|(a, _)| a == n) {
                Some((_, Some(g))) => print!(" {:>13.3} {:>6.2}", g, r.gbps / g),
                Some((_, None)) => print!(" {:>13} {:>6}", "n/a", "-"),
                None => print!(" {:>13} {:>6}", "", ""),
            }
        }
        println!();
    }
}
