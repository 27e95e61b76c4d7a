//! Helpers shared by the integration tests.
#![allow(dead_code)]

use hixl::{Connected, Hixl, HostBuffer, Options, Region};

pub mod compat;
pub mod hammer;
pub mod netns;

#[allow(unused_imports)]
pub use hixl::testkit::{Rng, fnv1a};

/// A serving engine on an ephemeral loopback port with one region of `len` bytes, activated.
pub fn server(len: usize, opts: Options) -> (Hixl<Connected>, Region) {
    let (e, r) = Hixl::initialize_ephemeral("127.0.0.1", opts)
        .unwrap()
        .register(HostBuffer::new(len).unwrap())
        .unwrap();
    (e.activate().unwrap(), r)
}

/// A client-only engine with one region of `len` bytes, activated, moving data over TCP only.
pub fn client(len: usize) -> (Hixl<Connected>, Region) {
    client_with(len, Options::default().same_host(hixl::SameHost::Forbid))
}

/// A client-only engine with one region of `len` bytes and these options, activated.
pub fn client_with(len: usize, opts: Options) -> (Hixl<Connected>, Region) {
    let (e, r) = Hixl::initialize("127.0.0.1", opts)
        .unwrap()
        .register(HostBuffer::new(len).unwrap())
        .unwrap();
    (e.activate().unwrap(), r)
}

/// The transport a link must use under `policy` on this machine (the same-host transport where
/// the kernel offers it).
pub fn expected_transport(policy: hixl::SameHost) -> hixl::TransportKind {
    let same_host = hixl::probe()
        .iter()
        .any(|t| t.kind == hixl::TransportKind::SameHost && t.available);
    match policy {
        hixl::SameHost::Forbid => hixl::TransportKind::Tcp,
        _ if same_host => hixl::TransportKind::SameHost,
        _ => hixl::TransportKind::Tcp,
    }
}

/// A `hixl-peer serve` child process: a serving engine with one seeded region.
pub struct Peer {
    pub child: std::process::Child,
    pub stdin: std::process::ChildStdin,
    pub stdout: std::io::BufReader<std::process::ChildStdout>,
    pub name: String,
    pub addr: u64,
    pub len: u64,
}

impl Peer {
    /// Starts a peer named `name` with `size` bytes of `memory` ("hostbuffer" or "user") holding
    /// the `Rng` bytes of `seed`.
    pub fn spawn(name: &str, size: usize, seed: u64, memory: &str) -> Peer {
        Self::spawn_in(&[], name, size, seed, memory, &[])
    }

    /// As [`Peer::spawn`], run under the command `prefix` (e.g. `ip netns exec NS`), with extra
    /// `serve` flags.
    pub fn spawn_in(
        prefix: &[&str],
        name: &str,
        size: usize,
        seed: u64,
        memory: &str,
        extra: &[&str],
    ) -> Peer {
        use std::process::Command;
        let exe = env!("CARGO_BIN_EXE_hixl-peer");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args([
            "serve",
            "--name",
            name,
            "--size",
            &size.to_string(),
            "--seed",
            &seed.to_string(),
            "--memory",
            memory,
        ])
        .args(extra);
        Self::launch(cmd)
    }

    /// A `hixl-peer compat-serve` child: the same, through `hixl::compat::Hixl` (name
    /// `127.0.0.1:0` for an ephemeral port), with HIXL options `KEY=VALUE`.
    pub fn spawn_compat(name: &str, size: usize, seed: u64, options: &[&str]) -> Peer {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hixl-peer"));
        cmd.args([
            "compat-serve",
            "--name",
            name,
            "--size",
            &size.to_string(),
            "--seed",
            &seed.to_string(),
        ]);
        for o in options {
            cmd.args(["--option", o]);
        }
        Self::launch(cmd)
    }

    fn launch(mut cmd: std::process::Command) -> Peer {
        let r = ready(&mut cmd);
        Peer {
            name: r.words[0].clone(),
            addr: r.words[1].parse().unwrap(),
            len: r.words[2].parse().unwrap(),
            child: r.child,
            stdin: r.stdin,
            stdout: r.stdout,
        }
    }

    /// The FNV-1a of `len` bytes at `off` of the peer's region, as the peer computes it.
    pub fn sum(&mut self, off: u64, len: u64) -> u64 {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "sum {off} {len}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let hex = line
            .strip_prefix("SUM ")
            .unwrap_or_else(|| panic!("peer said {line:?}"));
        u64::from_str_radix(hex.trim(), 16).unwrap()
    }

    /// Sends `sig` to the peer.
    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Stops the peer (`SIGSTOP`) and waits until it is stopped; it resumes (`SIGCONT`) when
    /// the guard goes, a failing test's included (a stopped child would keep its inherited
    /// output open, and the test run's with it).
    pub fn stopped(&self) -> Stopped<'_> {
        self.signal(libc::SIGSTOP);
        wait_stopped(self.child.id() as i32);
        Stopped(self)
    }

    /// Checks that the first `len` bytes of `buf` are this peer's seeded bytes (`seed`), READ
    /// from it, and that the peer hashes its own memory the same way; then quits the peer.
    pub fn check_read_back_and_quit(mut self, buf: &mut Region, len: usize, seed: u64) {
        let mut got = vec![0u8; len];
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(got, Rng::new(seed).bytes(len));
        assert_eq!(self.sum(0, len as u64), fnv1a(&got));
        self.quit();
    }

    /// Asks the peer to finalize and exit, and checks that it did.
    pub fn quit(mut self) {
        use std::io::Write;
        writeln!(self.stdin, "quit").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

/// A peer stopped by [`Peer::stopped`], until this goes.
pub struct Stopped<'a>(&'a Peer);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.signal(libc::SIGCONT);
    }
}

/// A TCP socket of this network namespace, as /proc/net/tcp and tcp6 show it.
pub struct TcpSocket {
    pub local: u16,
    pub remote: u16,
    /// `"01"` ESTABLISHED, `"0A"` LISTEN, ...
    pub state: String,
    /// Bytes sent and not acknowledged yet (or not sent).
    pub tx: u64,
    /// Bytes received and not read yet.
    pub rx: u64,
}

/// This network namespace's TCP sockets (IPv4 and IPv6).
pub fn tcp_sockets() -> Vec<TcpSocket> {
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
            let port = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap_or(""), 16);
            let (tx, rx) = w[4].split_once(':').unwrap_or(("0", "0"));
            let queue = |q: &str| u64::from_str_radix(q, 16).unwrap_or(0);
            if let (Ok(local), Ok(remote)) = (port(w[1]), port(w[2])) {
                out.push(TcpSocket {
                    local,
                    remote,
                    state: w[3].to_owned(),
                    tx: queue(tx),
                    rx: queue(rx),
                });
            }
        }
    }
    out
}

/// The TCP sockets connected (ESTABLISHED) to `port`: a client's sockets to a listening peer (a
/// stopped peer's kernel completes the handshakes its process never answers).
pub fn connections_to(port: u16) -> usize {
    (tcp_sockets().iter())
        .filter(|s| s.remote == port && s.state == "01")
        .count()
}

/// The bytes received and not read yet by the sockets whose local port is `port` (a listening
/// peer's connections; its listening socket's count excepted).
pub fn unread_at(port: u16) -> u64 {
    (tcp_sockets().iter())
        .filter(|s| s.local == port && s.state != "0A")
        .map(|s| s.rx)
        .sum()
}

/// The port of an engine name `IP:PORT`.
pub fn port_of(name: &str) -> u16 {
    name.rsplit(':').next().unwrap().parse().unwrap()
}

/// Waits until process `pid` is stopped (its state `T`), 20 s at most.
pub fn wait_stopped(pid: i32) {
    let t0 = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let state = stat[stat.rfind(')').unwrap() + 2..].chars().next();
        if state == Some('T') {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "process {pid} did not stop ({state:?})"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A `hixl-peer` child started with piped standard input and output, once it printed its first
/// line, `READY` and the words after it.
pub struct Ready {
    pub child: std::process::Child,
    pub stdin: std::process::ChildStdin,
    pub stdout: std::io::BufReader<std::process::ChildStdout>,
    /// The words of its `READY` line after `READY`.
    pub words: Vec<String>,
}

/// Starts `cmd` (a `hixl-peer` command) and waits for its `READY` line.
pub fn ready(cmd: &mut std::process::Command) -> Ready {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hixl-peer");
    let stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let mut words = line.split_whitespace().map(str::to_owned);
    assert_eq!(words.next().as_deref(), Some("READY"), "peer said {line:?}");
    Ready {
        child,
        stdin,
        stdout,
        words: words.collect(),
    }
}

/// Moves random data both ways with a `hixl-peer` of at least 72 MiB seeded with `seed`, and
/// checks every byte: READ one 64 MiB descriptor and 4096 small ones at odd offsets (against the
/// seeded bytes), then WRITE a 40 MiB block and a batch of `batch` small descriptors (the peer
/// hashes its own memory). `buf` must be at least 72 MiB.
pub fn exercise_peer(
    link: &hixl::Link<'_>,
    peer: &mut Peer,
    buf: &mut Region,
    seed: u64,
    batch: usize,
    what: &str,
) {
    use hixl::{TransferDesc, TransferOp};
    let t = std::time::Duration::from_secs(20);
    let expected = Rng::new(seed).bytes(72 << 20);
    let d = TransferDesc::new(
        buf.range(1..(64 << 20) + 1).unwrap(),
        link.remote(peer.addr + 3, 64 << 20).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], t).unwrap();
    let mut got = vec![0u8; 64 << 20];
    buf.read_at(1, &mut got).unwrap();
    assert!(
        got[..] == expected[3..3 + (64 << 20)],
        "{what}: 64 MiB READ differs"
    );

    let mut rng = Rng::new(seed + 1);
    let spans: Vec<(u64, usize)> = (0..4096)
        .map(|i| (i * 17_000 + rng.below(1000), 1 + rng.below(15_000) as usize))
        .collect();
    let descs: Vec<_> = spans
        .iter()
        .enumerate()
        .map(|(i, &(r, len))| {
            TransferDesc::new(
                buf.range(i * 16_384..i * 16_384 + len).unwrap(),
                link.remote(peer.addr + r, len as u64).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Read, &descs, t).unwrap();
    drop(descs);
    let mut got = vec![0u8; 4096 * 16_384];
    buf.read_at(0, &mut got).unwrap();
    for (i, &(r, len)) in spans.iter().enumerate() {
        assert_eq!(
            &got[i * 16_384..i * 16_384 + len],
            &expected[r as usize..r as usize + len],
            "{what}: descriptor {i}"
        );
    }

    let data = rng.bytes(72 << 20);
    buf.write_at(0, &data).unwrap();
    let big = 40 << 20;
    let d = TransferDesc::new(
        buf.range(0..big).unwrap(),
        link.remote(peer.addr + 5, big as u64).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[d], t).unwrap();
    assert_eq!(peer.sum(5, big as u64), fnv1a(&data[..big]), "{what}");
    let span = |i: usize| (big + i * 4000, (48 << 20) + i * 5000 + 7, 3999usize);
    let descs: Vec<_> = (0..batch)
        .map(|i| {
            let (l, r, len) = span(i);
            TransferDesc::new(
                buf.range(l..l + len).unwrap(),
                link.remote(peer.addr + r as u64, len as u64).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Write, &descs, t).unwrap();
    drop(descs);
    for i in [0, batch / 2, batch - 1] {
        let (l, r, len) = span(i);
        assert_eq!(
            peer.sum(r as u64, len as u64),
            fnv1a(&data[l..l + len]),
            "{what}: descriptor {i}"
        );
    }
}

/// Reads one frame from a raw socket: its kind and payload; `None` once the other side closed.
pub fn read_frame(s: &mut std::net::TcpStream) -> Option<(hixl::wire::Kind, Vec<u8>)> {
    use std::io::Read;
    let mut h = [0u8; hixl::wire::HEADER_LEN];
    s.read_exact(&mut h).ok()?;
    let h = hixl::wire::decode_header(&h).unwrap();
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h.kind, p))
}

/// A host region entry of a fake server's table.
pub fn entry(
    id: u32,
    addr: u64,
    len: u64,
    access: hixl::Access,
    fd: i32,
) -> hixl::wire::TableEntry {
    hixl::wire::TableEntry {
        id,
        addr,
        len,
        mem_type: hixl::MemType::Host,
        access,
        fd,
    }
}

/// Plays a fake serving engine on one accepted connection: reads the HELLO, answers with a
/// WELCOME of `table` (offering `host` for same-host transfers: this process, proven with its
/// end of the connection), then answers nothing until the client closes.
pub fn fake_serve(
    mut s: std::net::TcpStream,
    table: Vec<hixl::wire::TableEntry>,
    host: Option<hixl::wire::HostId>,
) {
    use std::io::{Read, Write};
    let Some((kind, _)) = read_frame(&mut s) else {
        return;
    };
    assert_eq!(kind, hixl::wire::Kind::Hello);
    // a same-host "server" offers a fence page, as a real one does (it never revokes it),
    // tagged with the link's token (the WELCOME's, below) after its three protocol words
    const TOKEN: u64 = 2;
    let fence = host.map_or(-1, |_| {
        // SAFETY: creating and sealing a descriptor this fake server owns; it stays open for
        // the connection (and is leaked with the test process).
        unsafe {
            let f = libc::memfd_create(
                c"fence".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            );
            assert!(f >= 0 && libc::ftruncate(f, 4096) == 0);
            let tag = TOKEN.to_ne_bytes();
            assert_eq!(libc::pwrite(f, tag.as_ptr().cast(), 8, 16), 8);
            assert_eq!(
                libc::fcntl(
                    f,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
                ),
                0
            );
            f
        }
    });
    let mut out = Vec::new();
    hixl::wire::Welcome {
        instance: 1,
        token: TOKEN,
        pid: host.map_or(3, |h| h.pid),
        table,
        host,
        fence,
        // it is the process it names: its proof is its end of this connection
        lane_fd: host.map(|_| std::os::fd::AsRawFd::as_raw_fd(&s)),
    }
    .encode(&mut out);
    let _ = s.write_all(&out);
    let mut sink = [0u8; 4096];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
}

/// The host's network devices, as the tests of one binary see them: a test that adds and removes
/// a veth pair (`netns::Netns`) holds this for writing while the pair exists; a UCX test holds
/// it for reading (UCX lists the devices when a context is made, and a device that goes while
/// a concurrent test's context uses it fails that test's transfers).
pub static NET_DEVICES: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Whether UCX can be loaded here; if not, says so for `test` (which then returns). While UCX
/// is used, `test` holds the guard returned ([`NET_DEVICES`], for reading).
pub fn ucx_available(test: &str) -> Option<std::sync::RwLockReadGuard<'static, ()>> {
    let p = hixl::probe();
    let u = p
        .iter()
        .find(|t| t.kind == hixl::TransportKind::Ucx)
        .unwrap();
    if !u.available {
        eprintln!("{test}: skipped: {}", u.detail);
        return None;
    }
    // (a test that panicked holding it poisoned nothing it guards)
    Some(NET_DEVICES.read().unwrap_or_else(|e| e.into_inner()))
}

/// Whether the same-host transport works here; if not, says so (its tests then check less).
pub fn same_host_available() -> bool {
    let ok = hixl::probe()
        .iter()
        .any(|t| t.kind == hixl::TransportKind::SameHost && t.available);
    if !ok {
        eprintln!(
            "same-host transport unavailable here ({:?}); its tests check the TCP fallback only",
            hixl::probe()
        );
    }
    ok
}

impl Peer {
    /// The notifications the peer received so far, as `(name, msg)`.
    pub fn notifies(&mut self) -> Vec<(String, String)> {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "notifies").unwrap();
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line == "END" {
                return out;
            }
            let rest = line
                .strip_prefix("NOTIFY ")
                .unwrap_or_else(|| panic!("peer said {line:?}"));
            let (n, m) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push((n.to_owned(), m.to_owned()));
        }
    }
}

/// The rounds of a transfer loop running on another thread, as that thread reports them, so
/// that a test can act (kill the peer) once the loop has demonstrably completed a round and
/// started the next one, whatever the speed of the machine.
#[derive(Default)]
pub struct Rounds {
    m: std::sync::Mutex<RoundsSeen>,
    cv: std::sync::Condvar,
}

/// What the loop reported so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct RoundsSeen {
    /// Rounds started (a transfer call was about to be made).
    pub started: u64,
    /// Rounds that completed.
    pub completed: u64,
    /// The loop ended (it returned or panicked).
    pub ended: bool,
}

/// Marks its loop ended when dropped, however the loop ends.
pub struct RoundsEnd<'a>(&'a Rounds);

impl Drop for RoundsEnd<'_> {
    fn drop(&mut self) {
        self.0.update(|s| s.ended = true);
    }
}

impl Rounds {
    fn update(&self, f: impl FnOnce(&mut RoundsSeen)) {
        let mut g = self.m.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g);
        drop(g);
        self.cv.notify_all();
    }

    /// The loop's thread: call first; the loop counts as ended when the guard drops.
    pub fn ender(&self) -> RoundsEnd<'_> {
        RoundsEnd(self)
    }

    /// The loop's thread: a round is about to start.
    pub fn start(&self) {
        self.update(|s| s.started += 1);
    }

    /// The loop's thread: the round completed.
    pub fn complete(&self) {
        self.update(|s| s.completed += 1);
    }

    /// Waits until at least one round completed and a later one started (so the loop is in a
    /// transfer, or just past one), or the loop ended, for at most `limit`. Returns what the
    /// loop had reported then (the caller acts anyway, so that the loop ends, and its own
    /// assertions judge: no round completed is a failure).
    pub fn wait_running_after_one(&self, limit: std::time::Duration) -> RoundsSeen {
        let g = self.m.lock().unwrap_or_else(|e| e.into_inner());
        let running_after_one = |s: &RoundsSeen| s.completed >= 1 && s.started > s.completed;
        let (g, _) = self
            .cv
            .wait_timeout_while(g, limit, |s| !(s.ended || running_after_one(s)))
            .unwrap_or_else(|e| e.into_inner());
        *g
    }
}

/// Kills a peer in the middle of a transfer: on another thread, rounds of `ops` (taken in turn)
/// over `d` on `link`, each within `timeout`, until one fails; `child` (the peer) is killed once
/// a round completed and the next one started, however fast the machine (waiting at most
/// `wait`). Returns the rounds completed, the error of the one that failed and how long it took.
pub fn kill_during_rounds(
    link: &hixl::Link<'_>,
    d: hixl::TransferDesc<'_>,
    ops: &[hixl::TransferOp],
    timeout: std::time::Duration,
    child: &mut std::process::Child,
    wait: std::time::Duration,
) -> (u32, hixl::Error, std::time::Duration) {
    let progress = Rounds::default();
    std::thread::scope(|s| {
        let w = s.spawn(|| {
            let _end = progress.ender();
            let mut rounds = 0u32;
            loop {
                let op = ops[rounds as usize % ops.len()];
                let t0 = std::time::Instant::now();
                progress.start();
                match link.transfer_sync(op, &[d], timeout) {
                    Ok(()) => rounds += 1,
                    Err(e) => return (rounds, e, t0.elapsed()),
                }
                progress.complete();
            }
        });
        let at_kill = progress.wait_running_after_one(wait);
        child.kill().unwrap();
        let r = w.join().unwrap();
        eprintln!(
            "the peer was killed in round {} ({at_kill:?}); round {} failed",
            at_kill.started,
            r.0 + 1
        );
        r
    })
}
