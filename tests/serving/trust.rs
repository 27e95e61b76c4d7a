//! What a client trusts of a server: nothing same-host that the server has not proved.
//!
//! A server on this host that names a process (its WELCOME's host id) must prove it is that
//! process before the client uses anything same-host of the WELCOME: the client takes the
//! server's descriptor of this very connection from the named process and checks that it is
//! the other end of the client's socket (`src/process.rs`, `Pinned::holds_peer_of`). A server
//! that names the *client itself* (with the client's own memfd as its region and its fence)
//! would otherwise turn the client's WRITE into a write into the client's own, unregistered
//! memory, reported as a success over the same-host path.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use hixl::{Options, SameHost, TransferDesc, TransferOp, TransportKind};

/// A `hixl-peer forge-server` child (`src/bin/hixl-peer/forge.rs`).
struct Forger {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    name: String,
}

impl Forger {
    fn spawn() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
            .arg("forge-server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hixl-peer forge-server");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let name = Self::line(&mut stdout);
        let name = name.strip_prefix("READY ").expect("READY").to_owned();
        Self {
            child,
            stdin,
            stdout,
            name,
        }
    }

    fn line(out: &mut BufReader<ChildStdout>) -> String {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l.trim_end().to_owned()
    }

    /// Arms the next link's WELCOME.
    fn arm(&mut self, addr: u64, len: u64, fd: i32, fence: i32, lane_fd: Option<i32>) {
        let lane = lane_fd.map_or("none".to_owned(), |f| f.to_string());
        writeln!(self.stdin, "next {addr} {len} {fd} {fence} {lane}").unwrap();
        // (the last round's WELCOMED first)
        let mut l = Self::line(&mut self.stdout);
        while l == "WELCOMED" {
            l = Self::line(&mut self.stdout);
        }
        assert_eq!(l, "ARMED");
    }
}

impl Drop for Forger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A memfd of `len` bytes sealed against shrinking and growing (as a real server's memory and
/// fence are), mapped shared into this process and filled with `fill`.
fn sealed_mapping(len: usize, fill: u8) -> (OwnedFd, *mut u8) {
    // SAFETY: creating, sizing, sealing and mapping a memfd this test owns; results checked.
    unsafe {
        let fd = libc::memfd_create(c"victim".as_ptr(), libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::write_bytes(p.cast::<u8>(), fill, len);
        (fd, p.cast())
    }
}

/// How many bytes of `len` at `p` are no longer `fill`.
fn changed(p: *const u8, len: usize, fill: u8) -> usize {
    (0..len)
        // SAFETY: `p` is a live mapping (or allocation) of `len` bytes; volatile, as another
        // path of this process could have written it behind the compiler's back.
        .filter(|&i| unsafe { p.add(i).read_volatile() } != fill)
        .count()
}

#[test]
fn a_server_cannot_name_the_client_as_itself() {
    if !super::common::same_host_available() {
        eprintln!(
            "a_server_cannot_name_the_client_as_itself: skipped: no same-host transport here"
        );
        return;
    }
    const LEN: usize = 1 << 16;
    // the client's own memory the forger aims at: a memfd it maps (what a server's region
    // is), and plain heap memory (reached through /proc/PID/mem), never registered
    let (victim_fd, victim) = sealed_mapping(LEN, 0x5A);
    let mut heap = vec![0x5Au8; LEN];
    let (fence_fd, _fence) = sealed_mapping(4096, 0);
    let (cli, mut buf) =
        super::common::client_with(LEN, Options::default().same_host(SameHost::Auto));
    let data = super::common::Rng::new(42).bytes(LEN);
    buf.write_at(0, &data).unwrap();
    let mut forger = Forger::spawn();

    // the proofs a forger can offer: none, none given, and every descriptor number the client
    // has (its memfds, its sockets, this very connection's end among them)
    let mut proofs = vec![
        None,
        Some(-1),
        Some(victim_fd.as_raw_fd()),
        Some(fence_fd.as_raw_fd()),
    ];
    proofs.extend((0..48).map(Some));
    let (mut rounds, mut same_host, mut written) = (0, 0, 0);
    for (i, proof) in proofs.into_iter().enumerate() {
        let (addr, fd) = if i % 2 == 0 {
            (victim as u64, victim_fd.as_raw_fd())
        } else {
            (heap.as_mut_ptr() as u64, -1)
        };
        forger.arm(addr, LEN as u64, fd, fence_fd.as_raw_fd(), proof);
        let link = cli
            .connect_timeout(&forger.name, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("round {i}: connect: {e}"));
        rounds += 1;
        if link.transport() == TransportKind::SameHost {
            same_host += 1;
        }
        let remote = link.remote(addr, LEN as u64).unwrap();
        let desc = TransferDesc::new(buf.range(0..LEN).unwrap(), remote);
        let r = link.transfer_sync(TransferOp::Write, &[desc], Duration::from_secs(10));
        let hit = changed(victim, LEN, 0x5A) + changed(heap.as_ptr(), LEN, 0x5A);
        if hit > 0 {
            written += 1;
            eprintln!(
                "round {i} (proof {proof:?}): {hit} bytes of the client's own memory written, transfer {r:?}"
            );
            // SAFETY: `victim` is this test's live mapping of LEN bytes.
            unsafe { std::ptr::write_bytes(victim, 0x5A, LEN) };
            heap.fill(0x5A);
        } else {
            assert!(
                r.is_err(),
                "round {i}: a WRITE the forger never answered returned Ok"
            );
        }
        drop(link);
    }
    eprintln!(
        "forged WELCOMEs naming the client: {same_host} of {rounds} links same-host, \
         {written} of {rounds} WRITEs landed in the client's own memory"
    );
    assert_eq!(
        (same_host, written),
        (0, 0),
        "a server that named the client's own process was trusted"
    );
    let _ = cli.finalize();
}

#[test]
fn an_honest_server_on_this_host_still_proves_itself() {
    if !super::common::same_host_available() {
        return;
    }
    // a real serving engine in another process: the proof holds and the link is same-host
    let peer = super::common::Peer::spawn("127.0.0.1", 1 << 20, 3, "hostbuffer");
    let (cli, mut buf) =
        super::common::client_with(4096, Options::default().same_host(SameHost::Require));
    let link = cli.connect(&peer.name).expect("a proven same-host link");
    assert_eq!(link.transport(), TransportKind::SameHost);
    let remote = link.remote(peer.addr, 4096).unwrap();
    let d = TransferDesc::new(buf.range(0..4096).unwrap(), remote);
    link.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(10))
        .unwrap();
    let mut got = vec![0u8; 4096];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, super::common::Rng::new(3).bytes(4096));
    link.disconnect(Duration::from_secs(5)).unwrap();
    let _ = cli.finalize();
}

/// A TCP relay (threads copying bytes both ways), listening on its own port.
fn relay(to: &str) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let name = l.local_addr().unwrap().to_string();
    let to = to.to_owned();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(a) = c else { return };
            let Ok(b) = std::net::TcpStream::connect(&to) else {
                return;
            };
            for (mut from, mut into) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    name
}

/// A relay cannot pass on another process's proof (docs/guarantees.md): a client on this host
/// that reaches an honest same-host server through a relay sees a WELCOME naming the server's
/// process, whose end of the connection is the relay's connection, not the client's; the proof
/// fails both ways (the server's of the client as well), so the link moves its data over TCP,
/// through the relay, and a client that requires the same-host path is refused.
#[test]
fn a_relay_cannot_pass_on_a_servers_proof() {
    if !super::common::same_host_available() {
        return;
    }
    let peer = super::common::Peer::spawn("127.0.0.1", 1 << 20, 4, "hostbuffer");
    let via = relay(&peer.name);
    let (cli, mut buf) =
        super::common::client_with(4096, Options::default().same_host(SameHost::Auto));
    let link = cli.connect(&via).expect("a link through the relay");
    assert_eq!(
        link.transport(),
        TransportKind::Tcp,
        "a relayed proof was taken"
    );
    let remote = link.remote(peer.addr, 4096).unwrap();
    let d = TransferDesc::new(buf.range(0..4096).unwrap(), remote);
    link.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(10))
        .unwrap();
    let mut got = vec![0u8; 4096];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, super::common::Rng::new(4).bytes(4096));
    link.disconnect(Duration::from_secs(5)).unwrap();
    let _ = cli.finalize();
    let (cli, _buf) =
        super::common::client_with(4096, Options::default().same_host(SameHost::Require));
    let e = cli.connect(&via).map(|_| ()).unwrap_err();
    assert_eq!(e.status().code(), 103_905, "{e:?}");
    let _ = cli.finalize();
}

/// A keyed client that dials a relay without the key (at another address, forwarding every
/// byte to the keyed server) gets no link: the server refuses a keyed HELLO that dialed
/// another address than its own, before it proves anything (the proofs also bind the address
/// dialed, so rewriting it in the HELLO does not help the relay: `auth.rs`'s unit test). The
/// same client reaches the server directly and moves data. Before, the relay passed the
/// server's proof on, the client took it for the server, and the relay kept the authenticated
/// connection to the server (a review's scratch test READ the server's memory through it).
#[test]
fn a_keyed_client_gets_no_link_through_a_keyless_relay() {
    let key = b"the relay does not know this key";
    let (srv, mut region) = super::common::server(
        4096,
        Options::default().psk(key).same_host(SameHost::Forbid),
    );
    let data = super::common::Rng::new(21).bytes(4096);
    region.write_at(0, &data).unwrap();
    let via = relay(srv.name());
    let keyed = || {
        super::common::client_with(
            4096,
            Options::default().psk(key).same_host(SameHost::Forbid),
        )
    };
    let (cli, _b) = keyed();
    let e = cli.connect(&via).map(|_| ()).unwrap_err();
    assert_eq!(e.status().code(), 103_900, "{e:?}");
    let _ = cli.finalize();
    let (cli, mut buf) = keyed();
    let link = cli.connect(srv.name()).expect("a direct keyed link");
    assert_eq!(read_first(&link, &mut buf, 4096), data);
}

/// READs the first `n` bytes of the link's first region into `buf`, and returns them.
fn read_first(link: &hixl::Link<'_>, buf: &mut hixl::Region, n: usize) -> Vec<u8> {
    let d = TransferDesc::new(
        buf.range(0..n).unwrap(),
        link.regions().next().unwrap().range(0..n as u64).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(10))
        .unwrap();
    let mut got = vec![0u8; n];
    buf.read_at(0, &mut got).unwrap();
    got
}

/// With a key, the target a HELLO names is the address its connection reached: a server named
/// by a wildcard address (`0.0.0.0`) is dialed by that name and reached at loopback, and the
/// keyed link is made (the server compares the target with its end of the connection).
#[test]
fn a_keyed_client_links_to_a_server_named_by_a_wildcard_address() {
    let key = b"a key of sixteen bytes or more";
    let (srv, mut region) = hixl::Hixl::initialize_ephemeral(
        "0.0.0.0",
        Options::default().psk(key).same_host(SameHost::Forbid),
    )
    .unwrap()
    .register(hixl::HostBuffer::new(4096).unwrap())
    .unwrap();
    let srv = srv.activate().unwrap();
    assert!(srv.name().starts_with("0.0.0.0:"), "{}", srv.name());
    let data = super::common::Rng::new(23).bytes(64);
    region.write_at(0, &data).unwrap();
    let (cli, mut buf) = super::common::client_with(
        4096,
        Options::default().psk(key).same_host(SameHost::Forbid),
    );
    let link = cli.connect(srv.name()).expect("a keyed link to 0.0.0.0");
    assert_eq!(read_first(&link, &mut buf, 64), data);
}
