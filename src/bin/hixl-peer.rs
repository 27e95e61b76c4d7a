//! `hixl-peer`: a serving engine in its own process, for cross-process tests and benchmarks.
//!
//! ```text
//! hixl-peer serve [--name IP[:PORT]] [--size BYTES] [--seed N]
//! ```
//!
//! Registers one region of `--size` bytes (default 64 MiB) filled with the `testkit::Rng` bytes of
//! `--seed`, starts serving, and prints `READY <name> <addr> <len> <pid>`. Then it reads commands
//! on standard input, one per line:
//!
//! - `sum OFF LEN`: prints `SUM <fnv1a of those bytes, hex>`;
//! - `quit` (or the end of input): finalizes and exits.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use hixl::testkit::{Rng, fnv1a};
use hixl::{Hixl, HostBuffer, Options};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hixl-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("serve") {
        return Err("usage: hixl-peer serve [--name IP[:PORT]] [--size BYTES] [--seed N]".into());
    }
    let (mut name, mut size, mut seed) = ("127.0.0.1".to_owned(), 64usize << 20, 1u64);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--name" => name = value,
            "--size" => size = value.parse()?,
            "--seed" => seed = value.parse()?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let mut mem = HostBuffer::new(size)?;
    Rng::new(seed).fill(&mut mem);
    let (engine, mut region) =
        Hixl::initialize_ephemeral(&name, Options::default())?.register(mem)?;
    let engine = engine.activate()?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "READY {} {} {} {}",
        engine.name(),
        region.addr(),
        region.len(),
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
                region.read_at(off, &mut buf)?;
                writeln!(out, "SUM {:016x}", fnv1a(&buf))?;
            }
            ["quit"] => break,
            _ => writeln!(out, "ERR unknown command {line:?}")?,
        }
        out.flush()?;
    }
    let engine = engine.finalize();
    engine.deregister(region)?;
    Ok(())
}
