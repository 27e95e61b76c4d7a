//! Helpers shared by the integration tests.
#![allow(dead_code)]

use hixl::{Connected, Hixl, HostBuffer, Options, Region};

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
    let cma = hixl::probe()
        .iter()
        .any(|t| t.kind == hixl::TransportKind::Cma && t.available);
    match policy {
        hixl::SameHost::Forbid => hixl::TransportKind::Tcp,
        _ if cma => hixl::TransportKind::Cma,
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
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
            .args([
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
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hixl-peer");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.first(), Some(&"READY"), "peer said {line:?}");
        Peer {
            name: w[1].to_owned(),
            addr: w[2].parse().unwrap(),
            len: w[3].parse().unwrap(),
            child,
            stdin,
            stdout,
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

    /// Asks the peer to finalize and exit, and checks that it did.
    pub fn quit(mut self) {
        use std::io::Write;
        writeln!(self.stdin, "quit").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}
