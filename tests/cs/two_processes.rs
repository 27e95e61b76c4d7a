//! A server in another process (`hixl-peer cs-serve`): random data PUT over TCP and checked by
//! the server in its own memory, GET back; then, with the server process stopped (SIGSTOP), a
//! batch times out and latches the client (upstream's failure latch).

use std::io::{BufRead, Write};
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use hixl::cs::{MAX_TAG, OpDesc};
use hixl::{Status, TransferOp};

use super::support::{Buf, client_with, local, status};
use crate::common::{self, Rng, fnv1a};

/// Whether every thread of process `pid` is stopped (`/proc/PID/task/TID/stat` says `T` or
/// `t`), waiting for it at most 20 s: SIGSTOP takes effect as each thread next leaves the
/// kernel.
fn all_stopped(pid: u32) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        let running = tasks.flatten().any(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // "tid (comm) S ...": the state follows the last ')'
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, s)| s.trim_start().chars().next());
            !matches!(state, Some('T' | 't'))
        });
        if !running {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// `hixl-peer cs-serve` with `size` bytes of kv seeded with `seed`: the child, its port, kv's
/// address.
fn cs_serve(size: usize, seed: u64) -> (common::Ready, u16, usize) {
    let r = common::ready(Command::new(env!("CARGO_BIN_EXE_hixl-peer")).args([
        "cs-serve",
        "--size",
        &size.to_string(),
        "--seed",
        &seed.to_string(),
    ]));
    let port: u16 = r.words[0].parse().unwrap();
    let kv: usize = r.words[1].parse().unwrap();
    (r, port, kv)
}

/// Sends `cmd` to a `cs-serve` child and returns its answer's line.
fn ask(r: &mut common::Ready, cmd: &str) -> String {
    writeln!(r.stdin, "{cmd}").unwrap();
    let mut line = String::new();
    r.stdout.read_line(&mut line).unwrap();
    line.trim().to_owned()
}

/// Stops (SIGSTOP) child `pid` until every thread of it is stopped.
fn stop(pid: u32) {
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    assert!(all_stopped(pid), "the server did not stop");
}

/// Lets a stopped child `pid` go on (SIGCONT).
fn resume(pid: u32) {
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
}

#[test]
fn a_batch_against_a_stopped_server_times_out_and_latches() {
    let size = 1usize << 20;
    let (mut r, port, kv) = cs_serve(size, 5);
    let pid = r.child.id();
    // over TCP (the extension "hixl.SameHost": "off"; same-host copies need nothing of the
    // server's CPU, so a stopped server would still be served)
    let c = client_with(
        port,
        Ipv4Addr::LOCALHOST,
        Some("{\"hixl.SameHost\": \"off\"}"),
    );
    c.connect(Duration::from_secs(5)).unwrap();
    let list = c.remote_mems(Duration::from_secs(5)).unwrap();
    assert_eq!(list[1].tag, b"kv");
    assert_eq!((list[1].addr, list[1].size), (kv as u64, size as u64));
    assert!(list.iter().all(|m| m.tag.len() <= MAX_TAG));
    let mut mine = Buf::new(2 * size);
    local(&c, &mut mine);
    let base = mine.addr();
    let d = |off: usize, at: usize, len: usize| OpDesc {
        remote_addr: (kv + off) as u64,
        local_addr: base + at,
        len: len as u64,
    };
    // PUT random data at an odd offset; the server hashes its memory; GET it back
    let data = Rng::new(31).bytes(100_003);
    mine.write(0, &data);
    (c.batch_sync(
        TransferOp::Write,
        &[d(4097, 0, data.len())],
        Duration::from_secs(10),
    ))
    .unwrap();
    assert_eq!(
        ask(&mut r, &format!("sum 4097 {}", data.len())),
        format!("SUM {:016x}", fnv1a(&data))
    );
    (c.batch_sync(
        TransferOp::Read,
        &[d(0, size, size)],
        Duration::from_secs(10),
    ))
    .unwrap();
    let mut expect = Rng::new(5).bytes(size);
    expect[4097..4097 + data.len()].copy_from_slice(&data);
    assert!(
        mine.read(size, size) == expect,
        "the server's bytes read back"
    );

    // the server stops: a batch times out and latches the client
    stop(pid);
    let timed_out = c.batch_sync(
        TransferOp::Read,
        &[d(0, size, size)],
        Duration::from_millis(300),
    );
    resume(pid);
    assert_eq!(status(timed_out), Status::TIMEOUT);
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[d(0, 0, 8)], Duration::from_secs(5))),
        Status::FAILED
    );
    assert_eq!(
        status(c.batch_async(TransferOp::Write, &[d(0, 0, 8)])),
        Status::FAILED
    );
    c.close();
    writeln!(r.stdin, "quit").unwrap();
    assert!(r.child.wait().unwrap().success());
}

/// `remote_mems` that must reconnect (the server registered memory after the client connected)
/// while the server process is stopped keeps to its timeout: the list is read (same host: the
/// list's region needs none of the server's CPU), then neither the goodbye nor a new connect is
/// answered. The client is not connected afterwards; connecting again imports the new memory.
#[test]
fn a_reconnect_to_a_stopped_server_keeps_to_its_timeout() {
    let (mut r, port, _kv) = cs_serve(4096, 6);
    let pid = r.child.id();
    let c = client_with(port, Ipv4Addr::LOCALHOST, None);
    c.connect(Duration::from_secs(5)).unwrap();
    assert_eq!(c.remote_mems(Duration::from_secs(5)).unwrap().len(), 2);
    let reg = ask(&mut r, "more 4096");
    let more: u64 = (reg.strip_prefix("REG "))
        .unwrap_or_else(|| panic!("the server said {reg:?}"))
        .parse()
        .unwrap();
    stop(pid);
    let timeout = Duration::from_millis(300);
    let t0 = Instant::now();
    let got = c.remote_mems(timeout);
    let took = t0.elapsed();
    resume(pid);
    assert_eq!(status(got), Status::TIMEOUT);
    // far below the overrun of a goodbye waited for 1 s whatever the deadline
    assert!(took < timeout + Duration::from_millis(500), "took {took:?}");
    assert_eq!(
        status(c.remote_mems(Duration::from_secs(5))),
        Status::FAILED,
        "not connected"
    );
    c.connect(Duration::from_secs(5)).unwrap();
    let list = c.remote_mems(Duration::from_secs(5)).unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!((list[2].tag.as_slice(), list[2].addr), (&b"more"[..], more));
    c.close();
    writeln!(r.stdin, "quit").unwrap();
    assert!(r.child.wait().unwrap().success());
}
