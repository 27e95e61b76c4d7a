//! `hixl-peer datadist-serve`, an LLM-DataDist cluster in a child process, as the two-process
//! tests drive it.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command};

use hixl::datadist::LlmStatus;

/// A `hixl-peer datadist-serve` child: a prompt cluster with one seeded blocks cache.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its cache's id.
    pub cache_id: i64,
}

impl Peer {
    /// Cluster `cluster` with a blocks cache of `tensors` tensors of `blocks` blocks of `block`
    /// bytes (tensor `t`: the `Rng` bytes of `seed + t`) under `BlocksCacheKey` model `model`.
    pub fn spawn(
        cluster: u64,
        tensors: u32,
        blocks: u64,
        block: u64,
        seed: u64,
        model: u64,
    ) -> Peer {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hixl-peer"));
        cmd.args(["datadist-serve", "--cluster", &cluster.to_string()])
            .args(["--tensors", &tensors.to_string()])
            .args(["--blocks", &blocks.to_string()])
            .args(["--block", &block.to_string()])
            .args(["--seed", &seed.to_string(), "--model", &model.to_string()]);
        let r = crate::common::ready(&mut cmd);
        Peer {
            addr: r.words[0].parse().unwrap(),
            cache_id: r.words[1].parse().unwrap(),
            child: r.child,
            stdin: r.stdin,
            stdout: r.stdout,
        }
    }

    /// Sends one command and returns the answer line.
    pub fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// The FNV-1a of `len` bytes at `off` of the peer's tensor `t`.
    pub fn sum(&mut self, t: usize, off: u64, len: u64) -> u64 {
        let line = self.ask(&format!("sum {t} {off} {len}"));
        let hex = line
            .strip_prefix("SUM ")
            .unwrap_or_else(|| panic!("peer said {line:?}"));
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// Finalizes the peer and checks that it exited well.
    pub fn quit(mut self) {
        writeln!(self.stdin, "quit").unwrap();
        assert!(self.child.wait().unwrap().success());
    }

    /// Kills the peer (a crash: it finalizes nothing, tells no one) and waits for it to end.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Links the peer to cluster `id` listening at `addr`: the status of its `link_clusters`.
    pub fn link(&mut self, id: u64, addr: SocketAddr) -> LlmStatus {
        let line = self.ask(&format!("link {id} {addr}"));
        let hex = line
            .strip_prefix("LINKED 0x")
            .unwrap_or_else(|| panic!("peer said {line:?}"));
        LlmStatus(u32::from_str_radix(hex, 16).unwrap())
    }

    /// A plain engine of the peer's process WRITEs the `Rng` bytes of `seed` to `len` bytes at
    /// `addr` of the engine `name`: the HIXL status (0 for Ok) of its connect or WRITE.
    pub fn write(&mut self, name: &str, addr: u64, len: usize, seed: u64) -> u32 {
        let line = self.ask(&format!("write {name} {addr} {len} {seed}"));
        line.strip_prefix("WROTE ")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("peer said {line:?}"))
    }
}
