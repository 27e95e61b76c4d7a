//! `cs-serve`: a HIXL-CS server (`hixl::cs::Server`) in its own process, for the two-process
//! tests of `tests/cs/`.
//!
//! It listens on a free port of 127.0.0.1 with one endpoint (RoCE, 127.0.0.1, host), registers
//! one host region tagged `kv` of `--size` bytes (the `testkit::Rng` bytes of `--seed`), and
//! prints `READY <port> <kv address> <size> <pid>`. Then, one command per line on standard
//! input:
//! - `sum OFF LEN`: `SUM <fnv1a of those bytes of kv, hex>`;
//! - `more LEN`: registers LEN more bytes (zeroed) tagged `more`: `REG <address>`;
//! - `quit` (or the end of input): closes the server and exits.

use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, TcpListener};

use hixl::MemType;
use hixl::cs::{Endpoint, Mem, Server};
use hixl::testkit::{Rng, fnv1a};

type Failure = Box<dyn std::error::Error>;

pub fn cs_serve(size: usize, seed: u64) -> Result<(), Failure> {
    let mut kv = Rng::new(seed).bytes(size);
    let base = kv.as_mut_ptr();
    let ep = [Endpoint::roce(Ipv4Addr::LOCALHOST.into())];
    let mut listening = None;
    for _ in 0..50 {
        // a port free a moment ago: another process may take it first, then the next one
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let s = Server::new(Ipv4Addr::LOCALHOST.into(), port, &ep, None)?;
        let mem = Mem {
            typ: MemType::Host,
            addr: base as usize,
            size,
        };
        // SAFETY: `kv` lives until the server is closed below, and this process reads it only
        // through raw copies (`sum`), after the client's batches ended.
        unsafe { s.register(b"kv", mem) }?;
        if s.listen().is_ok() {
            listening = Some((s, port));
            break;
        }
    }
    let (server, port) = listening.ok_or("no port to listen on")?;
    // the memory of `more`, kept until the server is closed
    let mut more: Vec<Vec<u8>> = Vec::new();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "READY {port} {} {size} {}",
        base as usize,
        std::process::id()
    )?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["sum", off, len] => {
                let (off, len): (usize, usize) = (off.parse()?, len.parse()?);
                if off.checked_add(len).is_none_or(|end| end > size) {
                    writeln!(out, "ERR out of range")?;
                } else {
                    let mut copy = vec![0u8; len];
                    // SAFETY: inside `kv` (checked); a raw copy, no reference to memory the
                    // client writes.
                    unsafe { std::ptr::copy_nonoverlapping(base.add(off), copy.as_mut_ptr(), len) };
                    writeln!(out, "SUM {:016x}", fnv1a(&copy))?;
                }
            }
            ["more", len] => {
                let mut m = vec![0u8; len.parse()?];
                let mem = Mem {
                    typ: MemType::Host,
                    addr: m.as_mut_ptr() as usize,
                    size: m.len(),
                };
                // SAFETY: `m` is kept in `more` until the server is closed below, and this
                // process never reads it.
                match unsafe { server.register(b"more", mem) } {
                    Ok(_) => writeln!(out, "REG {}", mem.addr)?,
                    Err(e) => writeln!(out, "ERR {e}")?,
                }
                more.push(m);
            }
            ["quit"] => break,
            _ => writeln!(out, "ERR")?,
        }
        out.flush()?;
    }
    server.close();
    drop((kv, more));
    Ok(())
}
