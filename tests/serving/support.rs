//! The serving tests' helpers, one module for the family: one lock that keeps the tests which
//! measure a process or open hundreds of sockets apart from every other test of this crate;
//! resource usage of a process, raw connections from chosen loopback addresses, hand-made
//! HELLOs, an honest client's round (the limits tests'); an honest client's rounds that report
//! instead of panicking, raw clients that open a link (answering PROVE honestly or not), the
//! identity of process 1, and what a server holds (threads; the send queues of its sockets in
//! /proc/net/tcp) (the attack tests').

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use super::common::{self, Peer, read_frame};
use hixl::wire::{self, Hello, HostId, Kind, LaneRole};
use hixl::{Options, TransferDesc, TransferOp};

/// The family's one lock. The limits, attack and budget tests and the load test each take it
/// alone ([`serial`]): they measure processes (this one too:
/// `limits::notifications_are_bounded_over_all_links`,
/// `limits::established_lanes_are_bounded_per_link_per_address_and_in_all`), open hundreds of
/// sockets, raise this process's descriptor limit, or time honest clients and a loaded server,
/// as each did alone in a test binary of its own. The hostile tests share it ([`alongside`]):
/// they run with each other, as in their own binary, but never beside a measuring test.
pub(crate) static ONE_AT_A_TIME: RwLock<()> = RwLock::new(());

/// This test runs alone among the family's tests.
pub(crate) fn serial() -> RwLockWriteGuard<'static, ()> {
    ONE_AT_A_TIME.write().unwrap_or_else(|e| e.into_inner())
}

/// This test may run beside other [`alongside`] tests, never beside a [`serial`] one.
pub(crate) fn alongside() -> RwLockReadGuard<'static, ()> {
    ONE_AT_A_TIME.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) const KEY: &str = "a pre-shared key of the limits tests";

/// Threads, open descriptors and resident memory of a process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) threads: usize,
    pub(crate) fds: usize,
    pub(crate) rss_kib: usize,
}

pub(crate) fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> usize {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    Usage {
        threads: field("Threads:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count(),
        rss_kib: field("VmRSS:"),
    }
}

/// A memory budget of these tests, in KiB: `kib`, or no limit in the AddressSanitizer build
/// (`.ci/run` sets `--cfg hixl_asan` with `-Zsanitizer=address`), where resident memory is
/// ASan's (shadow memory, redzones, per-thread fake stacks, and an allocator that keeps freed
/// memory: measured there, 324 KiB per idle lane and +58 MiB kept after 8 large requests). The
/// budgets are checked by the plain `cargo test` run; the ASan run checks everything else here
/// (threads, descriptors, honest clients) and the memory accesses themselves.
pub(crate) fn rss_budget(kib: usize) -> usize {
    if cfg!(hixl_asan) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "under AddressSanitizer: memory budgets not checked (threads and descriptors are)"
            )
        });
        usize::MAX / 4
    } else {
        kib
    }
}

/// Polls until `pid`'s usage is back near `base` (a couple of threads and descriptors, 8 MiB of
/// memory), for up to 10 s.
pub(crate) fn back_to_baseline(pid: u32, base: Usage, what: &str) {
    back_near(pid, base, 8 << 10, what)
}

/// As [`back_to_baseline`], with `rss_slack_kib` of resident memory.
pub(crate) fn back_near(pid: u32, base: Usage, rss_slack_kib: usize, what: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if pid == std::process::id() {
            // glibc keeps freed memory in its per-thread arenas; give it back, so that resident
            // memory counts what is still allocated
            // SAFETY: malloc_trim has no preconditions.
            unsafe { libc::malloc_trim(0) };
        }
        let u = usage(pid);
        let near = u.threads <= base.threads + 2
            && u.fds <= base.fds + 2
            && u.rss_kib <= base.rss_kib + rss_budget(rss_slack_kib);
        if near {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: usage {u:?} did not return near the baseline {base:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` every 10 ms until it holds or `limit` passes; says whether it held.
pub(crate) fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A TCP connection to `to` from the loopback address `127.0.0.<src>` (all of 127/8 is local
/// on Linux): connections from different addresses count as different peers.
pub(crate) fn connect_from(src: u8, to: &str) -> std::io::Result<TcpStream> {
    connect_from_within(src, to, None)
}

/// As [`connect_from`], giving up after `limit` (if given) when the server's accept queue is
/// full and the kernel keeps retrying the connection (`SO_SNDTIMEO` bounds a blocking connect).
pub(crate) fn connect_from_within(
    src: u8,
    to: &str,
    limit: Option<Duration>,
) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to.parse::<SocketAddr>().unwrap() else {
        panic!("IPv4 only")
    };
    let sin = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nothing else owns; the stream closes it.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let from = sin([127, 0, 0, src], 0);
    let dest = sin(to.ip().octets(), to.port());
    // SAFETY: `from` is a live sockaddr_in of `len` bytes.
    if unsafe { libc::bind(fd, (&from as *const libc::sockaddr_in).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    s.set_write_timeout(limit)?;
    // SAFETY: `dest` is a live sockaddr_in of `len` bytes.
    if unsafe { libc::connect(fd, (&dest as *const libc::sockaddr_in).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    s.set_write_timeout(None)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

pub(crate) fn hello_frame(instance: u64) -> Vec<u8> {
    hello_frame_naming(instance, None)
}

/// A new link's HELLO from client "10.7.7.7", naming the process `host` (if any).
pub(crate) fn hello_frame_naming(instance: u64, host: Option<hixl::wire::HostId>) -> Vec<u8> {
    hello_frame_for(instance, host, "")
}

/// A new link's HELLO from client "10.7.7.7" that dialed `target` (a keyed server refuses any
/// other than its own address), naming the process `host` (if any).
pub(crate) fn hello_frame_for(
    instance: u64,
    host: Option<hixl::wire::HostId>,
    target: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    Hello {
        role: LaneRole::NewLink,
        instance,
        token: 0,
        name: "10.7.7.7".into(),
        target: target.into(),
        host,
        nonce: [7; 32],
    }
    .encode(&mut out);
    out
}

/// Raises this process's soft descriptor limit to its hard limit; returns the limit.
pub(crate) fn raise_own_nofile() -> libc::rlim_t {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a live rlimit the call fills.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r.rlim_cur = r.rlim_max;
    // SAFETY: `r` is a live rlimit within the hard limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    r.rlim_max
}

/// Opens a new link (client "10.7.7.7", `instance`) on `s` and reads the WELCOME.
pub(crate) fn hello(s: &mut TcpStream, instance: u64) -> wire::Welcome {
    s.write_all(&hello_frame(instance)).unwrap();
    let (k, p) = read_frame(s).expect("a WELCOME");
    assert_eq!(k, Kind::Welcome);
    wire::Welcome::decode(&p).unwrap()
}

/// Whether the other side has closed `s` (without waiting).
pub(crate) fn closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut r: &TcpStream = s;
    let mut b = [0u8; 256];
    let r = loop {
        match r.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue, // a REFUSE before the close
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    r
}

/// An honest client of `peer`: connects, READs 64 bytes and checks them, disconnects. Returns
/// how long that took.
pub(crate) fn honest_round(
    cli: &hixl::Hixl<hixl::Connected>,
    buf: &mut hixl::Region,
    peer: &Peer,
) -> Duration {
    let t0 = Instant::now();
    let link = cli.connect(&peer.name).unwrap();
    let d = TransferDesc::new(
        buf.range(0..64).unwrap(),
        link.remote(peer.addr, 64).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(5))
        .unwrap();
    let took = t0.elapsed();
    link.disconnect(Duration::from_secs(5)).unwrap();
    let mut got = [0u8; 64];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got[..], super::common::Rng::new(1).bytes(64)[..]);
    took
}

pub(crate) fn spawn_peer(extra: &[&str]) -> Peer {
    Peer::spawn_in(&[], "127.0.0.1", 1 << 20, 1, "hostbuffer", extra)
}

pub(crate) fn honest_client(psk: bool) -> (hixl::Hixl<hixl::Connected>, hixl::Region) {
    let mut o = Options::default().same_host(hixl::SameHost::Forbid);
    if psk {
        o = o.psk(KEY);
    }
    super::common::client_with(64, o)
}

// ---------------------------------------------------------------------------------------------
// the attack tests' helpers

/// A TCP connection to `to` from `127.0.0.<src>`, given up after 2 s (a full accept queue makes
/// the kernel retry a connect for minutes): no attacker thread or test blocks long on one.
pub(crate) fn connect(src: u8, to: &str) -> std::io::Result<TcpStream> {
    connect_from_within(src, to, Some(Duration::from_secs(2)))
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
    hello_frame_naming(instance, host)
}

/// As [`hello_bytes`], to a server at `target` (a keyed server refuses a HELLO that dialed
/// another address before it sends its CHALLENGE: churn must name it to hold a slot).
pub(crate) fn hello_bytes_to(instance: u64, host: Option<HostId>, target: &str) -> Vec<u8> {
    hello_frame_for(instance, host, target)
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
    (common::tcp_sockets().iter())
        .filter(|s| s.local == port && s.state != "0A")
        .map(|s| s.tx)
        .collect()
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
