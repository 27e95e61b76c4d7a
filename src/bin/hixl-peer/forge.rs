//! `hixl-peer forge-server`: a hostile serving engine, for the test that a client trusts
//! nothing same-host of a server that has not proved which process it is
//! (`tests/serving/trust.rs`).
//!
//! It listens on an ephemeral port of 127.0.0.1 and prints `READY <addr>`. Then, for each line
//! `next ADDR LEN FD FENCE LANEFD` on standard input (LANEFD a number or `none`), it prints
//! `ARMED`, takes the next connection that opens a new link, and answers its HELLO with a
//! WELCOME that names *the client's own process* (the host id the HELLO carried) as the server:
//! one read-write region `ADDR..ADDR+LEN` backed by the client's descriptor `FD` (-1: none),
//! the client's descriptor `FENCE` as the fence, and `LANEFD` as the proof of its process
//! (`none`: the field left out). It then reads one frame of that connection (the client's first
//! request) and closes it without an answer, so the client's transfer fails at once. Connections
//! that join a lane are closed unanswered. A client that believed the WELCOME would write into its
//! own memory over the same-host path, with no byte reaching this process.

use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};

use hixl::wire::{self, Hello, Kind, LaneRole, TableEntry, Welcome};
use hixl::{Access, MemType};

/// Reads one frame: its kind and payload (`None` once the peer closed or sent garbage).
fn frame(s: &mut TcpStream) -> Option<(Kind, Vec<u8>)> {
    let mut h = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut h).ok()?;
    let h = wire::decode_header(&h).ok()?;
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h.kind, p))
}

/// `hixl-peer forge-server`: see the file's docs.
pub(crate) fn forge_server() -> Result<(), Box<dyn std::error::Error>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {}", l.local_addr()?)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let ["next", addr, len, fd, fence, lane_fd] = w[..] else {
            writeln!(out, "ERR {line:?}")?;
            out.flush()?;
            continue;
        };
        let (addr, len): (u64, u64) = (addr.parse()?, len.parse()?);
        let (fd, fence): (i32, i32) = (fd.parse()?, fence.parse()?);
        let lane_fd = match lane_fd {
            "none" => None,
            n => Some(n.parse::<i32>()?),
        };
        writeln!(out, "ARMED")?;
        out.flush()?;
        loop {
            let (mut s, _) = l.accept()?;
            let Some((Kind::Hello, p)) = frame(&mut s) else {
                continue;
            };
            let Ok(hello) = Hello::decode(&p) else {
                continue;
            };
            if hello.role != LaneRole::NewLink {
                continue; // a lane joining: closed unanswered
            }
            let mut w = Vec::new();
            Welcome {
                instance: 0x0bad_5e17e4,
                token: 1,
                pid: hello.host.map_or(0, |h| h.pid),
                table: vec![TableEntry {
                    id: 0,
                    addr,
                    len,
                    mem_type: MemType::Host,
                    access: Access::ReadWrite,
                    fd,
                }],
                // the client's own process, named as the server
                host: hello.host,
                fence,
                lane_fd,
            }
            .encode(&mut w);
            s.write_all(&w)?;
            writeln!(out, "WELCOMED")?;
            out.flush()?;
            // the client's first request, never answered: the connection closes
            let _ = frame(&mut s);
            break;
        }
    }
    Ok(())
}
