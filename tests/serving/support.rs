//! The limits tests' helpers: resource usage of a process, raw connections from chosen loopback
//! addresses, hand-made HELLOs, an honest client's round.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::common::{Peer, read_frame};
use hixl::wire::{self, Hello, Kind, LaneRole};
use hixl::{Options, TransferDesc, TransferOp};

pub(crate) static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
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
    let mut out = Vec::new();
    Hello {
        role: LaneRole::NewLink,
        instance,
        token: 0,
        name: "10.7.7.7".into(),
        target: String::new(),
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
