//! `hixl-peer`: a serving engine in its own process, for cross-process tests and benchmarks.
//!
//! ```text
//! hixl-peer serve [--name IP[:PORT]] [--size BYTES] [--seed N] [--memory hostbuffer|user]
//!                 [--heartbeat-ms MS] [--io-timeout-ms MS] [--psk KEY] [--ucx off|auto|require]
//!                 [--max-conns N] [--nofile N]
//! hixl-peer probe NAME [--uid UID] [--same-host auto|require|off]
//! hixl-peer serve-ascend --lib PATH --device-ip IP [--name IP[:PORT]] [--size BYTES] [--seed N]
//! ```
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
//! - `quit` (or the end of input): finalizes and exits.
//!
//! `probe` (after dropping to `--uid`, if given) connects to `NAME`, READs the first 64 bytes of
//! its first region, and prints `TRANSPORT <tcp|cma> <fnv1a of the bytes, hex>`.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use hixl::testkit::{Rng, fnv1a};
use std::time::Duration;

use hixl::{
    Hixl, HostBuffer, Options, Reclaim, Region, Registered, SameHost, TransferDesc, TransferOp,
    TransportKind, Ucx,
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

const USAGE: &str =
    "usage: hixl-peer serve [--name IP[:PORT]] [--size BYTES] [--seed N] [--memory hostbuffer|user]
                       [--heartbeat-ms MS] [--io-timeout-ms MS] [--psk KEY] [--ucx off|auto|require]
                       [--max-conns N] [--nofile N]
       hixl-peer probe NAME [--uid UID] [--same-host auto|require|off]";

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("serve") => {}
        Some("probe") => return probe(args),
        Some("serve-ascend") => return serve_ascend(args),
        _ => return Err(USAGE.into()),
    }
    let (mut name, mut size, mut seed, mut user) =
        ("127.0.0.1".to_owned(), 64usize << 20, 1u64, false);
    let mut opts = Options::default();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => name = value,
            "--size" => size = value.parse()?,
            "--seed" => seed = value.parse()?,
            "--memory" => user = value == "user",
            "--heartbeat-ms" => {
                opts = opts.heartbeat_interval(Some(Duration::from_millis(value.parse()?)))
            }
            "--io-timeout-ms" => {
                opts = opts.server_io_timeout(Duration::from_millis(value.parse()?))
            }
            "--psk" => opts = opts.psk(value.as_bytes()),
            "--max-conns" => opts = opts.max_server_conns(value.parse()?),
            "--nofile" => {
                let n: libc::rlim_t = value.parse()?;
                let r = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                // SAFETY: `r` is a live rlimit; the result is checked.
                if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
                    return Err(format!("--nofile {n}: {}", std::io::Error::last_os_error()).into());
                }
            }
            "--ucx" => {
                opts = opts.ucx(match value.as_str() {
                    "off" => Ucx::Off,
                    "auto" => Ucx::Auto,
                    "require" => Ucx::Require,
                    _ => return Err(format!("--ucx {value}: off, auto or require").into()),
                })
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
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

fn probe(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let name = args.next().ok_or(USAGE)?;
    let mut policy = SameHost::Auto;
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--uid" => {
                let uid: u32 = value.parse()?;
                // SAFETY: plain system calls with no memory arguments; the results are checked.
                if unsafe { libc::setgid(uid) != 0 || libc::setuid(uid) != 0 } {
                    return Err(format!(
                        "cannot become uid {uid}: {}",
                        std::io::Error::last_os_error()
                    )
                    .into());
                }
            }
            "--same-host" => {
                policy = match value.as_str() {
                    "require" => SameHost::Require,
                    "off" => SameHost::Forbid,
                    _ => SameHost::Auto,
                }
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let (engine, mut buf) = Hixl::initialize("127.0.0.1", Options::default().same_host(policy))?
        .register(HostBuffer::new(64)?)?;
    let engine = engine.activate()?;
    let transport = {
        let link = engine.connect(&name)?;
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
    let t = if transport == TransportKind::Cma {
        "cma"
    } else {
        "tcp"
    };
    println!("TRANSPORT {t} {:016x}", fnv1a(&got));
    Ok(())
}

fn serve<M: Reclaim + 'static>(
    engine: Hixl<Registered>,
    mut region: Region<M>,
) -> Result<(), Box<dyn std::error::Error>> {
    let engine = engine.activate()?;
    let (addr, len) = (region.addr(), region.len());
    answer(&engine, addr, len, |off, buf| Ok(region.read_at(off, buf)?))?;
    let engine = engine.finalize();
    engine.deregister(region)?;
    Ok(())
}

/// Prints `READY NAME ADDR LEN PID`, then answers the commands on standard input until `quit`
/// (or the end of input), reading the region's bytes with `read`.
fn answer(
    engine: &Hixl<hixl::Connected>,
    addr: usize,
    len: usize,
    mut read: impl FnMut(usize, &mut [u8]) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "READY {} {addr} {len} {}",
        engine.name(),
        std::process::id()
    )?;
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
            ["quit"] => break,
            _ => writeln!(out, "ERR unknown command {line:?}")?,
        }
        out.flush()?;
    }
    Ok(())
}

fn serve_ascend(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let (mut name, mut size, mut seed) = ("127.0.0.1".to_owned(), 8usize << 20, 1u64);
    let (mut lib, mut ip) = (None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => name = value,
            "--size" => size = value.parse()?,
            "--seed" => seed = value.parse()?,
            "--lib" => lib = Some(std::path::PathBuf::from(value)),
            "--device-ip" => ip = Some(value.parse()?),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let cfg = hixl::AscendConfig {
        acl_lib: lib.clone(),
        hccl_lib: lib,
        device_id: 0,
        device_ip: ip,
    };
    let engine =
        Hixl::initialize_ephemeral(&name, Options::default().ascend(cfg))?.into_registered();
    let mut data = vec![0u8; size];
    Rng::new(seed).fill(&mut data);
    let mut region = engine.with_context(|ctx| -> Result<_, hixl::Error> {
        let mut buf = engine.alloc_device(ctx, size)?;
        buf.write(ctx, 0, &data)?;
        engine.register_device(ctx, buf).map_err(|r| r.error)
    })??;
    let engine = engine.activate()?;
    let (addr, len) = (region.addr(), region.len());
    answer(&engine, addr, len, |off, buf| {
        Ok(engine.with_context(|ctx| region.read_device(ctx, off, buf))??)
    })?;
    let engine = engine.finalize();
    engine.deregister(region)?;
    Ok(())
}
