//! `hixl-peer`: a serving engine in its own process, for cross-process tests and benchmarks.
//!
//! ```text
//! hixl-peer serve [--name IP[:PORT]] [--size BYTES] [--seed N] [--memory hostbuffer|user]
//!                 [--heartbeat-ms MS] [--io-timeout-ms MS] [--psk KEY] [--ucx off|auto|require]
//!                 [--max-conns N] [--nofile N]
//! hixl-peer probe NAME [--uid UID] [--same-host auto|require|off]
//! hixl-peer serve-ascend --lib PATH --device-ip IP [--name IP[:PORT]] [--size BYTES] [--seed N]
//! hixl-peer hammer NAME [--len BYTES] [--regions N] [--repeat K] [--seed N] [--alternate] [--read]
//! hixl-peer pidreuse        (as the init of a fresh pid namespace, as root)
//! hixl-peer compat-serve [--name IP:PORT] [--size BYTES] [--seed N] [--option KEY=VALUE]...
//! hixl-peer norandom        (as root: a process whose OS random source fails)
//! hixl-peer ucx-client NAME --psk KEY   (a UCX client linking on command; see probes.rs)
//! hixl-peer forge-server    (a server that names its client's process as its own; forge.rs)
//! hixl-peer withhold-flush DIR   (a FUSE file whose closes never end; withhold.rs)
//! hixl-peer datadist-serve [--cluster ID] [--tensors N] [--blocks N] [--block BYTES] [--seed N] [--model ID]
//!                          (an LLM-DataDist prompt cluster with one blocks cache; see datadist.rs)
//! hixl-peer cs-serve [--size BYTES] [--seed N]
//!                          (a HIXL-CS server with one seeded host region; see cs.rs)
//! ```
//!
//! The command line is clap's (`hixl-peer --help`, `hixl-peer COMMAND --help`): flags in any
//! order, a bad or unknown one an error with the usage (exit status 2).
//!
//! `norandom` takes this process's random sources away and then initializes an engine: in a
//! mount namespace of its own it binds `/dev/null` over `/dev/urandom` and `/dev/random` (which
//! then read as empty), and a seccomp filter makes the `getrandom` system call fail with `EPERM`
//! (as a container's filter may). It prints `INIT ok` or `INIT err <HIXL status> <error>`, or
//! `SKIP <why>` when it may not do that (not root).
//!
//! `compat-serve` is `serve` through the runtime-checked [`hixl::compat::Hixl`] (HIXL's call
//! shape): it registers a `Vec<u8>` with `register_mem` (default name `127.0.0.1:0`, an
//! ephemeral port, and HIXL options from `--option`) and answers the same commands.
//!
//! `serve-ascend` is `serve` on the Ascend backend with ACL and HCCL loaded from `--lib` (the
//! ABI test double in tests): its region is a `DeviceBuffer`, filled through `aclrtMemcpy`, and
//! `sum` reads it back the same way.
//!
//! `--max-conns` is `Options::max_server_conns`; `--nofile N` sets this process's soft and hard
//! limits on open descriptors to `N` before the engine starts (as `ulimit -n N`).
//!
//! `serve` registers one region of `--size` bytes (default 64 MiB) filled with the
//! `testkit::Rng` bytes of `--seed` (a `HostBuffer`, or a `Vec<u8>` with `--memory user`), starts
//! serving, and prints `READY <name> <addr> <len> <pid>`. Then it reads commands on standard
//! input, one per line:
//!
//! - `sum OFF LEN`: prints `SUM <fnv1a of those bytes, hex>`;
//! - `notifies`: prints `NOTIFY <name> <msg>` for each notification received since the last
//!   `notifies` (oldest first), then `END`;
//! - `await-notify NAME OFF LEN`: waits (polling, at most 60 s) for a notification `NAME`
//!   (dropping others), then at once prints `NOTIFIED <fnv1a of those bytes, hex>`: what had
//!   landed when the notification was delivered (`TIMEOUT` if none came);
//! - `quit` (or the end of input): finalizes and exits.
//!
//! `probe` (after dropping to `--uid`, if given) connects to `NAME`, READs the first 64 bytes of
//! its first region, and prints `TRANSPORT <tcp|same-host> <fnv1a of the bytes, hex>`.
//!
//! `hammer` is a same-host client that keeps writing: it connects to `NAME` (same-host transport
//! required), prints `LINKED`, then WRITEs the first `--len` bytes (default: all) of each of the
//! peer's first `--regions` regions (default: all), `--repeat` times over (default 1), in one
//! batch, again and again. Batch `i` (from 1) carries the `testkit::Rng` bytes of `seed`, or
//! with `--alternate` those of `seed + i % 2` (both prepared up front, so the loop is all
//! transfer). After each batch that returns `Ok` it prints `OK i`; at the first error it prints
//! `ENDED <HIXL status code>` and exits. With `--read` it READs the same ranges instead, and
//! prints `OK i c`, `c` the number of bytes read that are 0xA5 (a sentinel a test's server
//! writes into memory it got back).
//!
//! `pidreuse` proves that a same-host write never lands in a process that took a dead peer's
//! pid. It must run as the first process of a new pid namespace with its own `/proc` (`unshare
//! --pid --fork --mount-proc`), where it alone makes processes, so it can pick the next pid
//! (`/proc/sys/kernel/ns_last_pid`). It starts a *victim* (`hixl-peer sink`: a static page of
//! known bytes, address space not randomised), opens it as a same-host link does, kills it, then
//! starts a *decoy* sink that gets the victim's pid and the same address. It writes through the
//! victim's handle, then with `process_vm_writev` by pid number (what a pid-addressed path would
//! do), and prints `PIDREUSE <write result> <decoy unchanged after it> <pid write reached the
//! decoy>`, or `SKIP <why>` when the kernel would not reuse the pid.

mod cs;
mod datadist;
mod forge;
mod probes;
mod withhold;

use probes::{hammer, norandom, pidreuse, sink, ucx_client};

use std::io::{BufRead, Write};
use std::process::ExitCode;

use hixl::testkit::{Rng, fnv1a};
use std::time::Duration;

use hixl::{
    Hixl, HostBuffer, Options, Reclaim, Region, Registered, SameHost, TransferDesc, TransferOp, Ucx,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hixl-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line (the module docs say what each command does).
#[derive(clap::Parser)]
#[command(
    name = "hixl-peer",
    about = "A hixl engine in its own process, for cross-process tests"
)]
enum Cli {
    /// A serving engine with one seeded region, answering commands on standard input
    Serve {
        #[command(flatten)]
        common: Common,
        /// The region: hostbuffer (a HostBuffer, memfd) or user (a Vec<u8>)
        #[arg(long, default_value = "hostbuffer", value_parser = ["hostbuffer", "user"])]
        memory: String,
        /// Options::heartbeat_interval, in milliseconds
        #[arg(long)]
        heartbeat_ms: Option<u64>,
        /// Options::server_io_timeout, in milliseconds
        #[arg(long)]
        io_timeout_ms: Option<u64>,
        /// Options::psk
        #[arg(long)]
        psk: Option<String>,
        /// Options::ucx
        #[arg(long, value_enum)]
        ucx: Option<UcxArg>,
        /// Options::max_server_conns
        #[arg(long)]
        max_conns: Option<usize>,
        /// Options::max_server_threads
        #[arg(long)]
        max_threads: Option<usize>,
        /// The soft and hard limits on open descriptors, set before the engine starts
        #[arg(long)]
        nofile: Option<libc::rlim_t>,
    },
    /// Connects to NAME, reads 64 bytes of its first region, prints the transport and a sum
    Probe {
        /// The serving engine
        name: String,
        /// Drop to this uid (and gid) first
        #[arg(long)]
        uid: Option<u32>,
        /// Options::same_host
        #[arg(long, value_enum, default_value = "auto")]
        same_host: SameHostArg,
    },
    /// `serve` on the Ascend backend, its region a DeviceBuffer
    ServeAscend {
        #[command(flatten)]
        common: Common,
        /// The ACL and HCCL library (the ABI test double in tests)
        #[arg(long)]
        lib: std::path::PathBuf,
        /// The device's RoCE address
        #[arg(long)]
        device_ip: std::net::IpAddr,
    },
    /// A same-host client that keeps writing the peer NAME's regions
    Hammer {
        /// The serving engine
        name: String,
        /// Bytes written of each region (default: all)
        #[arg(long)]
        len: Option<usize>,
        /// How many of the peer's regions (default: all)
        #[arg(long)]
        regions: Option<usize>,
        /// Each region this many times over, in one batch
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// The testkit::Rng seed of the bytes
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Alternate the seeds seed and seed + 1 from batch to batch
        #[arg(long)]
        alternate: bool,
        /// READ the regions instead (each `OK i` then says how many bytes read were 0xA5)
        #[arg(long)]
        read: bool,
    },
    /// A static page of known bytes, for `pidreuse`
    Sink,
    /// Proves a same-host write never lands in a process that took a dead peer's pid
    Pidreuse,
    /// `serve` through hixl::compat::Hixl (HIXL's call shape)
    CompatServe {
        #[command(flatten)]
        common: Common,
        /// A HIXL option, KEY=VALUE (repeatable)
        #[arg(long = "option", value_parser = key_value)]
        options: Vec<(String, String)>,
    },
    /// Initializes an engine with no OS random source (as root)
    Norandom,
    /// An LLM-DataDist prompt cluster (the typed layer) with one seeded blocks cache
    DatadistServe(datadist::Args),
    /// A HIXL-CS server with one seeded host region tagged `kv` (see cs.rs)
    CsServe {
        /// Bytes of the region
        #[arg(long, default_value_t = 1 << 20)]
        size: usize,
        /// The testkit::Rng seed of its bytes
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// A hostile server naming its client's own process as itself (see forge.rs)
    ForgeServer,
    /// A FUSE file system of one file whose FLUSHes are held (see withhold.rs; as root)
    WithholdFlush {
        /// Where to mount it
        dir: std::path::PathBuf,
    },
    /// A client engine that requires UCX, linking to NAME on command (`link`, `drop`, `quit`)
    UcxClient {
        /// The serving engine
        name: String,
        /// Options::psk
        #[arg(long)]
        psk: String,
    },
}

/// The flags of the serving commands.
#[derive(clap::Args)]
struct Common {
    /// The engine name, IP[:PORT] (default: 127.0.0.1, or 127.0.0.1:0 for compat-serve)
    #[arg(long)]
    name: Option<String>,
    /// Bytes of the region (default: 64 MiB, or 8 MiB for serve-ascend)
    #[arg(long)]
    size: Option<usize>,
    /// The testkit::Rng seed of its bytes
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl Common {
    /// The name, size and seed, with this command's defaults.
    fn or(self, name: &str, size: usize) -> (String, usize, u64) {
        (
            self.name.unwrap_or_else(|| name.to_owned()),
            self.size.unwrap_or(size),
            self.seed,
        )
    }
}

/// `--ucx`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum UcxArg {
    Off,
    Auto,
    Require,
}

/// `--same-host`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum SameHostArg {
    Auto,
    Require,
    Off,
}

/// `KEY=VALUE`.
fn key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or("KEY=VALUE")?;
    Ok((k.to_owned(), v.to_owned()))
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    match <Cli as clap::Parser>::parse() {
        Cli::Serve {
            common,
            memory,
            heartbeat_ms,
            io_timeout_ms,
            psk,
            ucx,
            max_conns,
            max_threads,
            nofile,
        } => {
            let mut opts = Options::default();
            if let Some(ms) = heartbeat_ms {
                opts = opts.heartbeat_interval(Some(Duration::from_millis(ms)));
            }
            if let Some(ms) = io_timeout_ms {
                opts = opts.server_io_timeout(Duration::from_millis(ms));
            }
            if let Some(key) = psk {
                opts = opts.psk(key.as_bytes());
            }
            if let Some(n) = max_conns {
                opts = opts.max_server_conns(n);
            }
            if let Some(n) = max_threads {
                opts = opts.max_server_threads(n);
            }
            if let Some(u) = ucx {
                opts = opts.ucx(match u {
                    UcxArg::Off => Ucx::Off,
                    UcxArg::Auto => Ucx::Auto,
                    UcxArg::Require => Ucx::Require,
                });
            }
            if let Some(n) = nofile {
                let r = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                // SAFETY: `r` is a live rlimit; the result is checked.
                if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
                    return Err(format!("--nofile {n}: {}", std::io::Error::last_os_error()).into());
                }
            }
            serve_host(common.or("127.0.0.1", 64 << 20), memory == "user", opts)
        }
        Cli::Probe {
            name,
            uid,
            same_host,
        } => probe(&name, uid, same_host),
        Cli::ServeAscend {
            common,
            lib,
            device_ip,
        } => serve_ascend(common.or("127.0.0.1", 8 << 20), lib, device_ip),
        Cli::Hammer {
            name,
            len,
            regions,
            repeat,
            seed,
            alternate,
            read,
        } => hammer(
            &name,
            len.unwrap_or(usize::MAX),
            regions.unwrap_or(usize::MAX),
            repeat,
            seed,
            alternate,
            read,
        ),
        Cli::Sink => sink(),
        Cli::Pidreuse => pidreuse(),
        Cli::CompatServe { common, options } => {
            compat_serve(common.or("127.0.0.1:0", 64 << 20), options)
        }
        Cli::Norandom => norandom(),
        Cli::DatadistServe(a) => datadist::datadist_serve(a),
        Cli::CsServe { size, seed } => cs::cs_serve(size, seed),
        Cli::UcxClient { name, psk } => ucx_client(&name, &psk),
        Cli::ForgeServer => forge::forge_server(),
        Cli::WithholdFlush { dir } => withhold::withhold_flush(&dir),
    }
}

/// `serve`: the engine, its seeded region (a `Vec<u8>` with `user`, else a `HostBuffer`), and
/// the command loop.
fn serve_host(
    (name, size, seed): (String, usize, u64),
    user: bool,
    opts: Options,
) -> Result<(), Box<dyn std::error::Error>> {
    let engine = Hixl::initialize_ephemeral(&name, opts)?;
    if user {
        let mut mem = vec![0u8; size];
        Rng::new(seed).fill(&mut mem);
        let (engine, region) = engine.register(mem)?;
        return serve(engine, region);
    }
    let mut mem = HostBuffer::new(size)?;
    Rng::new(seed).fill(&mut mem);
    let (engine, region) = engine.register(mem)?;
    serve(engine, region)
}

fn probe(
    name: &str,
    uid: Option<u32>,
    same_host: SameHostArg,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(uid) = uid {
        // SAFETY: plain system calls with no memory arguments; the results are checked.
        if unsafe { libc::setgid(uid) != 0 || libc::setuid(uid) != 0 } {
            return Err(format!(
                "cannot become uid {uid}: {}",
                std::io::Error::last_os_error()
            )
            .into());
        }
    }
    let policy = match same_host {
        SameHostArg::Auto => SameHost::Auto,
        SameHostArg::Require => SameHost::Require,
        SameHostArg::Off => SameHost::Forbid,
    };
    let (engine, mut buf) = Hixl::initialize("127.0.0.1", Options::default().same_host(policy))?
        .register(HostBuffer::new(64)?)?;
    let engine = engine.activate()?;
    let transport = {
        let link = engine.connect(name)?;
        let remote = link
            .regions()
            .next()
            .ok_or("the peer has no region")?
            .range(0..64)?;
        let d = TransferDesc::new(buf.full(), remote);
        link.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(5))?;
        link.transport()
    };
    let mut got = [0u8; 64];
    buf.read_at(0, &mut got)?;
    println!("TRANSPORT {} {:016x}", transport.name(), fnv1a(&got));
    Ok(())
}

fn serve<M: Reclaim + 'static>(
    engine: Hixl<Registered>,
    region: Region<M>,
) -> Result<(), Box<dyn std::error::Error>> {
    serve_with(engine, region, |_, region, off, buf| {
        Ok(region.read_at(off, buf)?)
    })
}

/// Serves `region` (activates the engine and [`answer`]s, reading its bytes with `read`), then
/// finalizes the engine and deregisters the region.
fn serve_with<M: Reclaim + 'static>(
    engine: Hixl<Registered>,
    mut region: Region<M>,
    mut read: impl FnMut(
        &Hixl<hixl::Connected>,
        &mut Region<M>,
        usize,
        &mut [u8],
    ) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let engine = engine.activate()?;
    let (addr, len) = (region.addr(), region.len());
    answer(
        engine.name(),
        addr,
        len,
        |off, buf| read(&engine, &mut region, off, buf),
        || Ok(typed_notifies(&engine)),
    )?;
    let engine = engine.finalize();
    engine.deregister(region)?;
    Ok(())
}

fn typed_notifies(engine: &Hixl<hixl::Connected>) -> Vec<(String, String)> {
    engine
        .get_notifies()
        .into_iter()
        .map(|n| (n.name, n.msg))
        .collect()
}

type Failure = Box<dyn std::error::Error>;

/// Prints `READY NAME ADDR LEN PID`, then answers the commands on standard input until `quit`
/// (or the end of input), reading the region's bytes with `read` and the notifications
/// received with `notifies`.
fn answer(
    name: &str,
    addr: usize,
    len: usize,
    mut read: impl FnMut(usize, &mut [u8]) -> Result<(), Failure>,
    mut notifies: impl FnMut() -> Result<Vec<(String, String)>, Failure>,
) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {name} {addr} {len} {}", std::process::id())?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["sum", off, len] => {
                let (off, len): (usize, usize) = (off.parse()?, len.parse()?);
                let mut buf = vec![0u8; len];
                read(off, &mut buf)?;
                writeln!(out, "SUM {:016x}", fnv1a(&buf))?;
            }
            ["notifies"] => {
                for (name, msg) in notifies()? {
                    writeln!(out, "NOTIFY {name} {msg}")?;
                }
                writeln!(out, "END")?;
            }
            ["await-notify", want, off, len] => {
                // polls until notification `want` arrives (others are dropped), then hashes
                // the bytes at once: what had landed when the notification was delivered
                let (off, len): (usize, usize) = (off.parse()?, len.parse()?);
                let until = std::time::Instant::now() + Duration::from_secs(60);
                let mut seen = false;
                while !seen && std::time::Instant::now() < until {
                    seen = notifies()?.iter().any(|(name, _)| name == want);
                    if !seen {
                        std::thread::yield_now();
                    }
                }
                if seen {
                    let mut buf = vec![0u8; len];
                    read(off, &mut buf)?;
                    writeln!(out, "NOTIFIED {:016x}", fnv1a(&buf))?;
                } else {
                    writeln!(out, "TIMEOUT")?;
                }
            }
            ["quit"] => break,
            _ => writeln!(out, "ERR unknown command {line:?}")?,
        }
        out.flush()?;
    }
    Ok(())
}

fn serve_ascend(
    (name, size, seed): (String, usize, u64),
    lib: std::path::PathBuf,
    ip: std::net::IpAddr,
) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = hixl::AscendConfig {
        acl_lib: Some(lib.clone()),
        hccl_lib: Some(lib),
        device_id: 0,
        device_ip: Some(ip),
    };
    let engine =
        Hixl::initialize_ephemeral(&name, Options::default().ascend(cfg))?.into_registered();
    let mut data = vec![0u8; size];
    Rng::new(seed).fill(&mut data);
    let region = engine.with_context(|ctx| -> Result<_, hixl::Error> {
        let mut buf = engine.alloc_device(ctx, size)?;
        buf.write(ctx, 0, &data)?;
        engine.register_device(ctx, buf).map_err(|r| r.error)
    })??;
    serve_with(engine, region, |engine, region, off, buf| {
        Ok(engine.with_context(|ctx| region.read_device(ctx, off, buf))??)
    })
}

fn compat_serve(
    (name, size, seed): (String, usize, u64),
    options: Vec<(String, String)>,
) -> Result<(), Box<dyn std::error::Error>> {
    use hixl::compat;
    let mut mem = Rng::new(seed).bytes(size);
    let engine = compat::Hixl::new();
    engine.initialize(&name, options)?;
    let desc = compat::MemDesc {
        addr: mem.as_mut_ptr() as usize,
        len: mem.len(),
        local_only: false,
    };
    // SAFETY: `mem` stays allocated and is not resized until after `finalize` below; this
    // process only reads it (the `sum` command) after the test's transfers have returned.
    unsafe { engine.register_mem(desc, hixl::MemType::Host) }?;
    answer(
        &engine.local_engine()?,
        desc.addr,
        desc.len,
        |off, buf| {
            let end = off
                .checked_add(buf.len())
                .filter(|&e| e <= size)
                .ok_or("out of range")?;
            // SAFETY: `off..end` is in bounds of `mem`, which is alive; peers write it only
            // while the test's transfers run, and the test asks for sums after they returned.
            let bytes =
                unsafe { std::slice::from_raw_parts((desc.addr + off) as *const u8, end - off) };
            buf.copy_from_slice(bytes);
            Ok(())
        },
        || {
            Ok(engine
                .get_notifies()?
                .into_iter()
                .map(|n| (n.name, n.notify_msg))
                .collect())
        },
    )?;
    engine.finalize();
    drop(mem);
    Ok(())
}
