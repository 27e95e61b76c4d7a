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
//! - `--ws BYTES`: the part of the region (`--region`) each row cycles through (default all of it, so
//!   transfers come from memory, not caches); `--ws 0` means one block, as `ucx_perftest` does
//!   (the same buffer every time)
//! - `--region BYTES`: memory per side (default 256 MiB, or the largest block x `--batch` asked
//!   for, so one 16384 x 32 KiB batch moves 512 MiB of distinct memory)
//! - `--lanes N`: lanes one large TCP batch may use at once (`Options::parallel_lanes`)
//! - `--prefault-budget BYTES`: the clients' `Options::prefault_budget` (0: off)
//! - `--no-extras`: skip the 8-byte latency, connect-with-4000-regions and registration rows
//! - `--plot FILE.svg`: draw GB/s by block size (log2 axis), a solid series per op, the anchors
//!   of the same run dashed, the transport, date, commit and machine in the title;
//!   `--plot-from FILE.jsonl` (repeatable) draws the rows of earlier `--json` runs instead of
//!   measuring (e.g. `--transport tcp --json > a.jsonl`, `--transport cma --json > b.jsonl`,
//!   then `--plot-from a.jsonl --plot-from b.jsonl --plot both.svg`: both transports in one image)
//! - `--fan in,out`, `--peers N` (default 8): many-to-many rows, each op x block (x `--batch`)
//!   against one pair measured the same way in the same invocation. `in`: N client processes
//!   (`bench --client`), one link each, to one serving process; `out`: one client engine with N
//!   links to N serving processes, one caller thread per link. The working set is split
//!   between the links (each has 1/N of it, so N links move over the same memory one pair
//!   does), the batch is capped to fit in a link's share, and the aggregate GB/s is all links'
//!   bytes over the time from the first link's start to the last one's end. One caller per link
//!   (`--threads` does not apply), serving engines always in child processes
//! - `--link-cost [1,8,64,512]`: what a link costs. For each count, a fresh serving process and a
//!   client process (`bench --links`) with that many client engines, one link each (an engine
//!   has one link per peer: `ALREADY_CONNECTED`), to it: resident memory (VmRSS), threads and
//!   open descriptors of both processes before any link, after connecting, and after one 4 KiB
//!   WRITE on each link, with the growth per link. The serving process raises
//!   `max_server_conns` and `max_server_conns_per_peer` (1024 and 256 by default; every link
//!   here comes from 127.0.0.1) and its handshake limits to fit; both raise RLIMIT_NOFILE
//! - `--no-main`: skip the op x block table (and the extra rows), e.g. for `--fan` alone
//! - the first round after connect against the warm rounds after it, per op, after the table
//!   (`--cold-block` 32768, `--cold-batch` 256, `--cold-warm` 3 rounds, `--cold-reps` 3 links; `--no-cold` skips them,
//!   `--no-main --cold` runs them alone; [`cold`])
//! - `--blocks`: the block-indexed form (`transfer_blocks_sync`) against the list form of
//!   the same blocks, `--batch` (default 100,000) blocks a call at `--blocks-sizes` (64 B,
//!   2 KiB, 16 KiB, 64 KiB), over `--blocks-transports` (tcp, same-host), A B A B for
//!   `--blocks-rounds` (5): ns per descriptor (wall and CPU) beside GB/s, the list / blocks
//!   ratio, and memcpy anchors of the same invocation ([`blocks`]). `--no-main --blocks` for
//!   these rows alone
//! - `--datadist`: LLM-DataDist rows: `pull_blocks` of 64 and 4096 blocks (the typed layer)
//!   against the engine's own READ of the same descriptors, interleaved, the median of
//!   `--dd-rounds` rounds (default 9), with the overhead; `--dd-tensors` (4) tensors of 4096
//!   blocks of `--dd-block` bytes (16384) per side, the prompt in a child process
//!   ([`datadist`]); same host unless `--dd-tcp` (`hixl.SameHost=off` on the decoder and the
//!   baseline engine). `--no-main --datadist` for these rows alone
//!
//! Every row verifies its data (one call of the row again on fresh bytes, checked by the serving
//! process: [`verify`]); a mismatch ends the benchmark with status 1 and says which row and
//! range. With `--json`, the first line is `{"metric":"run",...}` (date, commit, machine: what
//! `--plot-from` titles its image with).

mod anchors;
mod blocks;
mod cold;
mod datadist;
mod many;
mod plot;
mod verify;

use anchors::{anchor, memcpy_gbps, memcpy2_gbps, pvm_gbps};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use hixl::testkit::Rng;
use hixl::{Hixl, HostBuffer, Link, Options, Region, SameHost, TransferDesc, TransferOp, Ucx};
use verify::{CALL_TIMEOUT, check_call, confirm};

/// The region per side (`--region`, default 256 MiB): what the rows cycle through and the memcpy
/// anchors copy. Set once from the command line, before any row.
static REGION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(256 << 20);

/// `--lanes`: lanes one large TCP batch may use at once (0: the engine's default).
static LANES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `--prefault-budget`: the client's `Options::prefault_budget` (`u64::MAX`: the engine's default).
static PREFAULT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// The region per side (see [`REGION`]).
fn ws() -> usize {
    REGION.load(std::sync::atomic::Ordering::Relaxed)
}

#[derive(Clone)]
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
    plot: Option<std::path::PathBuf>,
    plot_from: Vec<String>,
    fan: Vec<String>,
    peers: usize,
    link_cost: Vec<usize>,
    main: bool,
    datadist: Option<datadist::Spec>,
    cold: Option<cold::Spec>,
    block_rows: Option<blocks::Spec>,
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
    /// Bytes of the region each row cycles through (0: one block; default all of it)
    #[arg(long, default_value_t = usize::MAX)]
    ws: usize,
    /// Bytes of memory per side (default 256 MiB, or the largest block x batch asked for):
    /// the region the rows cycle through and the memcpy anchors copy
    #[arg(long)]
    region: Option<usize>,
    /// Lanes one large TCP batch may use at once (`Options::parallel_lanes`; default the
    /// engine's)
    #[arg(long)]
    lanes: Option<usize>,
    /// Skip the 8-byte latency, connect-with-4000-regions and registration rows
    #[arg(long)]
    no_extras: bool,
    /// Draw the rows into this SVG file
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Draw the rows of this earlier --json output (repeatable) instead of measuring
    #[arg(long, requires = "plot")]
    plot_from: Vec<String>,
    /// Many-to-many rows: in (N client processes, one server), out (one client, N servers)
    #[arg(long, value_delimiter = ',', value_parser = ["in", "out"])]
    fan: Vec<String>,
    /// N of the many-to-many rows
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    peers: u32,
    /// Resident memory, threads and descriptors per link, for these link counts
    #[arg(long, value_delimiter = ',', num_args = 0..=1, default_missing_value = "1,8,64,512")]
    link_cost: Option<Vec<usize>>,
    /// Skip the op x block table and the extra rows
    #[arg(long)]
    no_main: bool,
    /// LLM-DataDist rows: pull_blocks of 64 and 4096 blocks against the engine's READ
    #[arg(long)]
    datadist: bool,
    /// Tensors per cache of the --datadist rows
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    dd_tensors: u32,
    /// Bytes per block of the --datadist rows
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u64).range(2..=1 << 20))]
    dd_block: u64,
    /// Rounds of the --datadist rows (the median is over them)
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u64).range(1..=1000))]
    dd_rounds: u64,
    /// The --datadist rows over TCP (same host off), not the same-host path
    #[arg(long)]
    dd_tcp: bool,
    /// Skip the first-round-after-connect rows (`cold`)
    #[arg(long)]
    no_cold: bool,
    /// Run the first-round-after-connect rows even with --no-main
    #[arg(long)]
    cold: bool,
    /// The clients' `Options::prefault_budget` in bytes (default the engine's; 0: off)
    #[arg(long)]
    prefault_budget: Option<u64>,
    /// Bytes per block of the first-round-after-connect rows
    #[arg(long, default_value_t = 32768)]
    cold_block: usize,
    /// Blocks per call of the first-round-after-connect rows
    #[arg(long, default_value_t = 256)]
    cold_batch: usize,
    /// Warm rounds after the cold one (the median is the warm figure)
    #[arg(long, default_value_t = 3)]
    cold_warm: usize,
    /// Fresh links (each a cold round and its warm rounds) per first-round-after-connect row
    #[arg(long, default_value_t = 3)]
    cold_reps: usize,
    /// Block-indexed form against the list form (`--batch`, default 100000), TCP and same-host
    #[arg(long = "blocks")]
    block_form: bool,
    /// Block sizes of the --blocks rows
    #[arg(long, value_delimiter = ',', default_value = "64,2048,16384,65536")]
    blocks_sizes: Vec<usize>,
    /// Rounds (A B pairs) of the --blocks rows
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    blocks_rounds: u64,
    /// Transports of the --blocks rows
    #[arg(long, value_delimiter = ',', default_value = "tcp,same-host", value_parser = ["tcp", "same-host"])]
    blocks_transports: Vec<String>,
    /// --blocks rows with blocks in order (0, 1, 2, ...) instead of random distinct indices
    #[arg(long)]
    blocks_seq: bool,
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
        extras: !c.no_extras && !c.no_main,
        plot: c.plot,
        plot_from: c.plot_from,
        fan: c.fan,
        peers: c.peers as usize,
        link_cost: c.link_cost.unwrap_or_default(),
        main: !c.no_main,
        datadist: c.datadist.then_some(datadist::Spec {
            tensors: c.dd_tensors,
            block: c.dd_block,
            rounds: c.dd_rounds as usize,
            tcp: c.dd_tcp,
            json: c.json,
        }),
        cold: (!c.no_cold && (!c.no_main || c.cold)).then_some(cold::Spec {
            block: c.cold_block,
            batch: c.cold_batch,
            warm: c.cold_warm,
            reps: c.cold_reps,
        }),
        block_rows: c.block_form.then(|| blocks::Spec {
            sizes: c.blocks_sizes.clone(),
            batch: c.batch.unwrap_or(100_000),
            rounds: c.blocks_rounds as usize,
            transports: c.blocks_transports.clone(),
            sequential: c.blocks_seq,
        }),
    };
    if let Some(&n) = a.link_cost.iter().find(|&&n| n == 0 || n > 4096) {
        return Err(format!("--link-cost {n}: counts must be in 1..=4096"));
    }
    // a batch asked for gets distinct memory for every descriptor (one 16384 x 32 KiB batch:
    // 512 MiB per side)
    // (the --blocks rows cycle through the region: they ask for none of their own)
    let asked = match a.main {
        true => (a.batch.unwrap_or(1)).saturating_mul(a.blocks.iter().copied().max().unwrap_or(0)),
        false => 0,
    };
    let region = c.region.unwrap_or(asked.max(256 << 20));
    if region == 0 || region > 1 << 36 {
        return Err(format!("--region {region}: must be in 1..=64 GiB"));
    }
    REGION.store(region, std::sync::atomic::Ordering::Relaxed);
    LANES.store(c.lanes.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    if let Some(b) = c.prefault_budget {
        PREFAULT.store(b, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(&b) = a.blocks.iter().find(|&&b| b == 0 || b > region) {
        return Err(format!("block {b} must be in 1..={region}"));
    }
    Ok(a)
}

/// The client's options for `transport`: TCP only, the same-host transport required, or UCX
/// required (naming its process, as a client on the server's host must to get UCX: its
/// batches run inside the server's fence).
fn client_options(transport: &str) -> Options {
    let o = Options::default().same_host(match transport {
        "same-host" => SameHost::Require,
        "ucx" => SameHost::Auto,
        _ => SameHost::Forbid,
    });
    let o = match LANES.load(std::sync::atomic::Ordering::Relaxed) {
        0 => o,
        n => o.parallel_lanes(n),
    };
    let o = match PREFAULT.load(std::sync::atomic::Ordering::Relaxed) {
        u64::MAX => o,
        b => o.prefault_budget(b),
    };
    if transport == "ucx" {
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

/// What a serving engine is started with.
#[derive(Clone, Copy)]
struct ServeSpec {
    /// Bytes of memory, in `regions` regions (one: filled with random bytes; more: empty)
    size: usize,
    regions: usize,
    /// The region is a `Vec<u8>`, not a `HostBuffer`
    user: bool,
    ucx: bool,
    /// Established connections allowed (in all and from one address; 0: the defaults)
    conns: usize,
}

impl ServeSpec {
    fn of(a: &Args, size: usize) -> Self {
        ServeSpec {
            size,
            regions: 1,
            user: a.user_memory,
            ucx: a.transport == "ucx",
            conns: 0,
        }
    }
}

/// The serving side: in this process, or a child (`bench --serve SIZE REGIONS KIND WITH CONNS`)
/// that answers `SUM OFFSET LEN` on its stdin with the hash of those bytes of its region.
struct Server {
    name: String,
    at: ServerAt,
}

enum ServerAt {
    Local(Box<Hixl<hixl::Connected>>, Served),
    Child {
        child: Child,
        input: ChildStdin,
        output: BufReader<ChildStdout>,
    },
}

/// The region a server fills with data (none when it serves many empty ones).
enum Served {
    Host(Region<HostBuffer>),
    User(Region<Vec<u8>>),
    None,
}

impl Served {
    fn sum(&mut self, off: u64, len: usize) -> Result<u64, Box<dyn std::error::Error>> {
        let mut bytes = vec![0u8; len];
        match self {
            Served::Host(r) => r.read_at(off as usize, &mut bytes)?,
            Served::User(r) => r.read_at(off as usize, &mut bytes)?,
            Served::None => return Err("this server has no data region".into()),
        }
        Ok(verify::hash(&bytes))
    }
}

impl Server {
    fn name(&self) -> &str {
        &self.name
    }

    /// The serving process's id.
    fn pid(&self) -> u32 {
        match &self.at {
            ServerAt::Local(..) => std::process::id(),
            ServerAt::Child { child, .. } => child.id(),
        }
    }

    /// The hash of bytes `off..off + len` of the server's region, as the server reads them.
    fn sum(&mut self, off: u64, len: usize) -> Result<u64, Box<dyn std::error::Error>> {
        match &mut self.at {
            ServerAt::Local(_, served) => served.sum(off, len),
            ServerAt::Child { input, output, .. } => {
                writeln!(input, "SUM {off} {len}")?;
                input.flush()?;
                let line = read_line(output)?;
                let h = line
                    .strip_prefix("SUM ")
                    .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
                    .ok_or(format!("the server answered {line:?} to SUM"))?;
                Ok(h)
            }
        }
    }

    /// Checks `checks` against the server's region (`what` names the row).
    fn confirm(
        &mut self,
        checks: &[verify::Check],
        what: &str,
    ) -> Result<(), Box<dyn std::error::Error>> {
        confirm(checks, what, |off, len| self.sum(off, len))
    }
}

/// One line from a child, or an error when it has ended.
fn read_line(from: &mut impl BufRead) -> Result<String, Box<dyn std::error::Error>> {
    let mut line = String::new();
    if from.read_line(&mut line)? == 0 {
        return Err("a child process of the benchmark ended early (its error is above)".into());
    }
    Ok(line.trim_end().to_owned())
}

fn start_server(processes: u32, spec: ServeSpec) -> Result<Server, Box<dyn std::error::Error>> {
    if processes == 1 {
        let (e, served, name) = serve(spec)?;
        return Ok(Server {
            name,
            at: ServerAt::Local(Box::new(e), served),
        });
    }
    let kind = if spec.user { "user" } else { "hostbuffer" };
    let with = if spec.ucx { "ucx" } else { "plain" };
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--serve",
            &spec.size.to_string(),
            &spec.regions.to_string(),
            kind,
            with,
            &spec.conns.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let input = child.stdin.take().ok_or("no stdin")?;
    let mut output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let line = read_line(&mut output)?;
    let name = line
        .strip_prefix("READY ")
        .ok_or(format!("server said {line:?}"))?
        .trim()
        .to_owned();
    Ok(Server {
        name,
        at: ServerAt::Child {
            child,
            input,
            output,
        },
    })
}

fn serve(spec: ServeSpec) -> Result<(Hixl<hixl::Connected>, Served, String), hixl::Error> {
    let ServeSpec {
        size,
        regions,
        user,
        ucx,
        conns,
    } = spec;
    let mut opts = Options::default().max_regions(regions.max(1) + 1);
    if conns > 0 {
        // every client of the benchmark comes from 127.0.0.1
        opts = opts
            .max_server_conns(conns)
            .max_server_conns_per_peer(conns)
            .max_server_handshakes(256)
            .max_server_handshakes_per_peer(256);
    }
    if ucx {
        opts = opts.psk(BENCH_KEY).ucx(Ucx::Require);
    }
    let e = Hixl::initialize_ephemeral("127.0.0.1", opts)?.into_registered();
    let served = if regions <= 1 && user {
        // ordinary user memory: same-host clients reach it with process_vm_readv/writev
        let mut v = vec![0u8; size];
        Rng::new(1).fill(&mut v);
        Served::User(e.register(v)?)
    } else if regions <= 1 {
        // touch every page (random bytes), as a real KV cache is
        let mut buf = HostBuffer::new(size)?;
        Rng::new(1).fill(&mut buf);
        Served::Host(e.register(buf)?) // stays registered until the engine goes away
    } else {
        for _ in 0..regions {
            std::mem::forget(e.register(HostBuffer::new(size / regions)?)?);
        }
        Served::None
    };
    let e = e.activate()?;
    let name = e.name().to_owned();
    Ok((e, served, name))
}

fn serve_main(spec: ServeSpec) -> Result<(), Box<dyn std::error::Error>> {
    raise_nofile();
    let (e, mut served, name) = serve(spec)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {name}")?;
    out.flush()?;
    // answer SUM requests until the parent closes our stdin
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut w = line.split_whitespace();
        if let (Some("SUM"), Some(off), Some(len)) = (
            w.next(),
            w.next().and_then(|o| o.parse().ok()),
            w.next().and_then(|l| l.parse().ok()),
        ) {
            writeln!(out, "SUM {:016x}", served.sum(off, len)?)?;
            out.flush()?;
        }
    }
    drop(served);
    let _ = e.finalize();
    Ok(())
}

/// Raises this process's soft descriptor limit to its hard limit (hundreds of links).
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a live rlimit the call fills.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur = r.rlim_max;
        // SAFETY: `r` is a live rlimit within the hard limit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
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

/// The calls of a row, each descriptor as (local offset, remote offset, length): `batch`
/// blocks a call, cycling through `ws` bytes from `local` in local memory and from `remote` in
/// the remote region (the same offsets from there).
type Plan = Vec<Vec<(usize, u64, usize)>>;

fn plan(ws: usize, block: usize, batch: usize, local: usize, remote: u64) -> Plan {
    let slots = (ws / block).max(1);
    (0..(slots / batch).max(1))
        .map(|c| {
            (0..batch)
                .map(|j| {
                    let off = ((c * batch + j) % slots) * block;
                    (local + off, remote + off as u64, block)
                })
                .collect()
        })
        .collect()
}

/// The descriptors of `plan` between `buf` and `link`'s first remote region.
fn descs<'a, M>(
    buf: &'a Region<M>,
    link: &'a Link<'_>,
    plan: &Plan,
) -> Result<Vec<Vec<TransferDesc<'a>>>, Box<dyn std::error::Error>> {
    let remote = link.regions().next().ok_or("the server has no region")?;
    Ok(plan
        .iter()
        .map(|call| {
            call.iter()
                .map(|&(l, r, len)| {
                    Ok(TransferDesc::new(
                        buf.range(l..l + len)?,
                        remote.range(r..r + len as u64)?,
                    ))
                })
                .collect::<Result<Vec<_>, hixl::Error>>()
        })
        .collect::<Result<_, _>>()?)
}

/// Warms a row up: every lane, and every page of the working set once (steady state: a
/// long-lived link has its mappings populated; the first touch of a page costs more than its
/// copy), for at most 3 s.
fn warm_up(
    link: &Link<'_>,
    op: TransferOp,
    descs: &[Vec<TransferDesc<'_>>],
) -> Result<(), hixl::Error> {
    let warm = Instant::now();
    for d in descs {
        link.transfer_sync(op, d, CALL_TIMEOUT)?;
        if warm.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    Ok(())
}

/// One caller's timed loop: calls `descs[(i * stride + first) % len]` for i = 0.. until
/// `done(i)`; the number of calls and each one's latency.
fn run_calls(
    link: &Link<'_>,
    op: TransferOp,
    descs: &[Vec<TransferDesc<'_>>],
    (first, stride): (usize, usize),
    done: impl Fn(usize) -> bool,
) -> Result<(usize, Vec<Duration>), hixl::Error> {
    let mut lat = Vec::with_capacity(100_000);
    let mut i = 0;
    while !done(i) {
        let t0 = Instant::now();
        link.transfer_sync(op, &descs[(i * stride + first) % descs.len()], CALL_TIMEOUT)?;
        lat.push(t0.elapsed());
        i += 1;
    }
    Ok((i, lat))
}

/// Runs one (op, block, batch) row against `server`, then checks one call's data.
fn measure(
    a: &Args,
    server: &mut Server,
    op: TransferOp,
    block: usize,
    batch: usize,
) -> Result<Row, Box<dyn std::error::Error>> {
    let mut mem = HostBuffer::new(ws())?;
    Rng::new(2).fill(&mut mem); // touch every page
    let (client, mut buf) =
        Hixl::initialize("127.0.0.1", client_options(&a.transport))?.register(mem)?;
    let client = client.activate()?;
    let link = client.connect_timeout(server.name(), Duration::from_secs(5))?;
    let ws = if a.ws == 0 {
        block
    } else {
        a.ws.clamp(block, ws())
    };
    let plan = plan(ws, block, batch, 0, 0);
    let descs = descs(&buf, &link, &plan)?;
    warm_up(&link, op, &descs)?;
    // `threads` callers share the link, each on its own share of the working set
    let started = Instant::now();
    let per_thread: Vec<Result<(usize, Vec<Duration>), hixl::Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.threads)
            .map(|th| {
                let (link, descs) = (&link, &descs);
                s.spawn(move || {
                    run_calls(link, op, descs, (th, a.threads), |i| match a.iters {
                        Some(n) => i >= n.div_ceil(a.threads),
                        None => started.elapsed() >= a.duration,
                    })
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
            let remote = link.regions().next().ok_or("the server has no region")?;
            anchors.push((
                "process_vm".to_owned(),
                pvm_gbps(op, link.remote_pid(), remote.addr(), block, &buf),
            ));
        }
    }
    drop(descs);
    let checks = check_call(&link, &mut buf, op, &plan[0])?;
    server.confirm(&checks, &format!("{op} {} x{batch}", human(block)))?;
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

fn main() {
    if let Err(e) = run() {
        eprintln!("\r\x1b[2Kbench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        Some("--serve") => {
            let arg = |i: usize| argv.get(i).map(String::as_str);
            let num = |i: usize, or: usize| arg(i).and_then(|s| s.parse().ok()).unwrap_or(or);
            return serve_main(ServeSpec {
                size: num(2, ws()),
                regions: num(3, 1),
                user: arg(4) == Some("user"),
                ucx: arg(5) == Some("ucx"),
                conns: num(6, 0),
            });
        }
        Some("--client") => return many::client_main(&argv[2..]),
        Some("--links") => return many::links_main(&argv[2..]),
        Some("--datadist-serve") => return datadist::serve_main(&argv[2..]),
        _ => {}
    }
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(2);
        }
    };
    if !a.plot_from.is_empty() {
        let (rows, metas) = plot::read_jsonl(&a.plot_from)?;
        let path = a.plot.as_deref().ok_or("--plot-from needs --plot")?;
        plot::draw(path, &rows, &metas)?;
        eprintln!("bench: drew {} rows into {}", rows.len(), path.display());
        return Ok(());
    }
    let meta = plot::RunMeta::here();
    if a.json {
        println!("{}", meta.json());
    }
    let rows = if a.main { main_table(&a)? } else { Vec::new() };
    if let Some(s) = a.cold {
        cold::rows(&a, s)?;
    }
    if !a.fan.is_empty() {
        many::fan_rows(&a)?;
    }
    if !a.link_cost.is_empty() {
        many::link_cost(&a)?;
    }
    if let Some(s) = &a.datadist {
        datadist::rows(s)?;
    }
    if let Some(s) = &a.block_rows {
        blocks::rows(&a, s)?;
    }
    if let Some(path) = &a.plot {
        let rows: Vec<plot::PlotRow> = rows
            .iter()
            .map(|r| plot::PlotRow {
                op: r.op.to_owned(),
                transport: a.transport.clone(),
                block: r.block,
                gbps: r.gbps,
                anchors: r.anchors.clone(),
            })
            .collect();
        plot::draw(path, &rows, std::slice::from_ref(&meta))?;
        eprintln!("bench: drew {} rows into {}", rows.len(), path.display());
    }
    Ok(())
}

/// The op x block table (and the extra rows), printed; its rows.
fn main_table(a: &Args) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut server = start_server(a.processes, ServeSpec::of(a, ws()))?;
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
            .clamp(1, (ws() / block).max(1));
        progress(&format!(
            "[{}/{}] {} {} x{} ...",
            k + 1,
            total,
            op,
            human(block),
            batch
        ));
        rows.push(measure(a, &mut server, op, block, batch)?);
    }
    let mut extra = Vec::new();
    if a.extras {
        for op in [TransferOp::Write, TransferOp::Read] {
            progress(&format!("8-byte {op} latency ..."));
            let mut r = measure(
                &Args {
                    iters: Some(20_000),
                    ..a.clone()
                },
                &mut server,
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
    print_rows(a, &rows);
    if a.extras {
        let (conn, reg) = connect_and_register_costs(a)?;
        print_rows(a, &extra);
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
    Ok(rows)
}

fn server_stop(s: Server) -> Result<(), Box<dyn std::error::Error>> {
    match s.at {
        ServerAt::Local(e, served) => {
            drop(served);
            let _ = e.finalize();
        }
        ServerAt::Child {
            mut child, input, ..
        } => {
            drop(input);
            child.wait()?;
        }
    }
    Ok(())
}

/// Connect time to a server with 4000 regions (p50/p99 ms), and registration cost per region (us).
fn connect_and_register_costs(a: &Args) -> Result<((f64, f64), f64), Box<dyn std::error::Error>> {
    progress("connect with 4000 regions ...");
    let server = start_server(
        a.processes,
        ServeSpec {
            regions: 4000,
            user: false,
            ..ServeSpec::of(a, 4000 * 4096)
        },
    )?;
    let client = Hixl::initialize("127.0.0.1", client_options(&a.transport))?
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
