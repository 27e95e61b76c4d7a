//! The attack tests' helpers: an honest client's rounds that report instead of panicking, raw
//! clients that open a link (answering PROVE honestly or not), the identity of process 1, and
//! what a server holds (threads; the send queues of its sockets in /proc/net/tcp).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::common::{self, Peer};
use hixl::wire::{self, HostId, Kind};
use hixl::{TransferDesc, TransferOp};

/// A TCP connection to `to` from `127.0.0.<src>`, given up after 2 s (a full accept queue makes
/// the kernel retry a connect for minutes): no attacker thread or test blocks long on one.
pub(crate) fn connect(src: u8, to: &str) -> std::io::Result<TcpStream> {
    super::support::connect_from_within(src, to, Some(Duration::from_secs(2)))
}

/// How long an honest round may take.
pub(crate) const ROUND_LIMIT: Duration = Duration::from_secs(1);

/// One honest round that reports instead of panicking: connect, READ 64 bytes, check them,
/// disconnect. Returns how long the whole round took.
pub(crate) fn try_round(
    cli: &hixl::Hixl<hixl::Connected>,
    buf: &mut hixl::Region,
    peer: &Peer,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    buf.write_at(0, &[0u8; 64])
        .map_err(|e| format!("local: {e}"))?;
    let link = cli
        .connect_timeout(&peer.name, ROUND_LIMIT)
        .map_err(|e| format!("connect: {e}"))?;
    let remote = link
        .remote(peer.addr, 64)
        .map_err(|e| format!("remote: {e}"))?;
    let d = TransferDesc::new(buf.range(0..64).unwrap(), remote);
    link.transfer_sync(TransferOp::Read, &[d], ROUND_LIMIT)
        .map_err(|e| format!("read: {e}"))?;
    link.disconnect(ROUND_LIMIT)
        .map_err(|e| format!("disconnect: {e}"))?;
    let took = t0.elapsed();
    let mut got = [0u8; 64];
    buf.read_at(0, &mut got).unwrap();
    if got[..] != common::Rng::new(1).bytes(64)[..] {
        return Err("wrong bytes".into());
    }
    Ok(took)
}

/// The outcome of an honest client's rounds.
pub(crate) struct Honest(Vec<Result<Duration, String>>);

impl Honest {
    /// Rounds that succeeded within [`ROUND_LIMIT`].
    pub(crate) fn fast(&self) -> usize {
        self.0
            .iter()
            .filter(|r| matches!(r, Ok(d) if *d < ROUND_LIMIT))
            .count()
    }

    /// Whether at least 9 of 10 rounds succeeded within the limit.
    pub(crate) fn ok(&self) -> bool {
        self.fast() * 10 >= self.0.len() * 9
    }

    pub(crate) fn summary(&self) -> String {
        let mut errors: Vec<&str> = self
            .0
            .iter()
            .filter_map(|r| r.as_ref().err().map(String::as_str))
            .collect();
        errors.dedup();
        let mut took: Vec<Duration> = self.0.iter().filter_map(|r| r.clone().ok()).collect();
        took.sort();
        format!(
            "{}/{} honest rounds within {ROUND_LIMIT:?} (times {took:?}; errors {errors:?})",
            self.fast(),
            self.0.len()
        )
    }
}

/// `n` honest rounds, round `i` starting `i * every` after the first (or at once, after the one
/// before it, if that took longer).
pub(crate) fn honest_rounds(
    cli: &hixl::Hixl<hixl::Connected>,
    buf: &mut hixl::Region,
    peer: &Peer,
    n: u32,
    every: Duration,
) -> Honest {
    let t0 = Instant::now();
    let mut out = Vec::new();
    for i in 0..n {
        // pacing, not synchronisation: the rounds are spread over the attack
        let at = t0 + every * i;
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        out.push(try_round(cli, buf, peer));
    }
    Honest(out)
}

/// How a raw client answers PROVE.
#[derive(Clone, Copy)]
pub(crate) enum Proof {
    /// Puts the nonce in a write-sealed memfd of this process and sends its number.
    Honest,
    /// Sends this descriptor number, which does not hold the nonce.
    At(u64),
}

/// A write-sealed memfd holding `nonce`, as an honest same-host client makes it.
fn proof_memfd(nonce: &[u8; 32]) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"proof".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    // SAFETY: writing 32 bytes from a live array to our own memfd, then sealing it.
    let ok = unsafe {
        libc::write(fd.as_raw_fd(), nonce.as_ptr().cast(), 32) == 32
            && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) == 0
    };
    assert!(ok, "sealing the proof: {}", std::io::Error::last_os_error());
    fd
}

/// How the server answered a raw client's new link.
#[derive(Debug)]
pub(crate) enum Reply {
    Welcome(wire::Welcome),
    Refused(wire::Refuse),
    /// The server closed the connection.
    Closed,
    /// Nothing within the socket's read timeout.
    Silent,
}

/// One frame read from a raw socket, telling a close from a timeout.
pub(crate) enum Next {
    Frame(Kind, Vec<u8>),
    Closed,
    Silent,
}

pub(crate) fn next_frame(s: &mut TcpStream) -> Next {
    let mut h = [0u8; wire::HEADER_LEN];
    let fail = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Next::Silent,
        _ => Next::Closed,
    };
    if let Err(e) = s.read_exact(&mut h) {
        return fail(e);
    }
    let h = wire::decode_header(&h).expect("a frame header");
    let mut p = vec![0u8; h.len as usize];
    if let Err(e) = s.read_exact(&mut p) {
        return fail(e);
    }
    Next::Frame(h.kind, p)
}

/// A new link's HELLO from client "10.7.7.7", naming the process `host` (if any).
pub(crate) fn hello_bytes(instance: u64, host: Option<HostId>) -> Vec<u8> {
    super::support::hello_frame_naming(instance, host)
}

/// Opens a new link on `s` (naming the process `host`), answering a PROVE as `proof` says, and
/// returns the server's answer (within the socket's read timeout).
pub(crate) fn open_link(
    s: &mut TcpStream,
    instance: u64,
    host: Option<HostId>,
    proof: Proof,
) -> Reply {
    if s.write_all(&hello_bytes(instance, host)).is_err() {
        return Reply::Closed;
    }
    // the nonce's memfd, kept open until the server has answered
    let mut placed: Option<std::os::fd::OwnedFd> = None;
    let reply = loop {
        match next_frame(s) {
            Next::Frame(Kind::Prove, p) => {
                let nonce = wire::decode_prove(&p).expect("a PROVE payload");
                let addr = match proof {
                    Proof::Honest => {
                        std::os::fd::AsRawFd::as_raw_fd(placed.insert(proof_memfd(&nonce))) as u64
                    }
                    Proof::At(a) => a,
                };
                let mut out = Vec::new();
                wire::encode_proof(&mut out, addr);
                if s.write_all(&out).is_err() {
                    break Reply::Closed;
                }
            }
            Next::Frame(Kind::Welcome, p) => {
                break Reply::Welcome(wire::Welcome::decode(&p).expect("a WELCOME payload"));
            }
            Next::Frame(Kind::Refuse, p) => {
                break Reply::Refused(wire::Refuse::decode(&p).expect("a REFUSE payload"));
            }
            Next::Frame(k, p) => panic!("a {k:?} frame ({} bytes) in a handshake", p.len()),
            Next::Closed => break Reply::Closed,
            Next::Silent => break Reply::Silent,
        }
    };
    drop(placed);
    reply
}

/// The identity of process 1 (this host's init, in this pid namespace): what an attacker names
/// to be given a fence and a pidfd.
pub(crate) fn pid1_host() -> HostId {
    let me = HostId::current().expect("/proc tells this process's identity");
    let stat = std::fs::read_to_string("/proc/1/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    HostId {
        boot: me.boot,
        // the init of this pid namespace lives in it (and /proc/1/ns may not be readable)
        pidns: std::fs::metadata("/proc/1/ns/pid").map_or(me.pidns, |m| m.ino()),
        pid: 1,
        start: after.split_whitespace().nth(19).unwrap().parse().unwrap(),
    }
}

/// The threads of process `pid` (cheaper than [`usage`]: no descriptor count).
pub(crate) fn threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// The port of an engine name `IP:PORT`.
pub(crate) fn port_of(name: &str) -> u16 {
    name.rsplit(':').next().unwrap().parse().unwrap()
}

/// The send queues (unsent or unacknowledged bytes) of the sockets whose local port is `port`,
/// listening socket excepted, from /proc/net/tcp and /proc/net/tcp6. The server's sockets it
/// closed with data still queued are counted too: the kernel keeps them (orphaned) until that
/// data is sent or dropped.
pub(crate) fn send_queues(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.len() < 5 {
                continue;
            }
            let local = w[1].rsplit(':').next().unwrap_or("");
            if u16::from_str_radix(local, 16) != Ok(port) || w[3] == "0A" {
                continue;
            }
            let tx = w[4].split(':').next().unwrap_or("0");
            out.push(u64::from_str_radix(tx, 16).unwrap_or(0));
        }
    }
    out
}

/// Closes `s` with a reset (no TIME_WAIT left behind), as a churning attacker does.
pub(crate) fn reset(s: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` is a live linger of the size given; `s` is an open socket.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    drop(s);
}

/// Sets a flag when dropped, however the scope that holds it ends (stops attacker threads).
pub(crate) struct Stop<'a>(pub(crate) &'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
