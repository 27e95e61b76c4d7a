//! A same-host client that names, as its PROOF, a file whose close never finishes: a file on a
//! FUSE file system whose daemon (the client's) withholds its answer to FLUSH, which the kernel
//! sends on every close. The serving engine takes the descriptor with `pidfd_getfd` on its
//! poller thread; were it to close the copy there, every handshake and idle lane would wait on
//! the client. Taken descriptors that are not a memfd or a socket are closed on a thread of
//! their own (`src/process/taken.rs`), so an honest client still gets in.
//!
//! The FUSE daemon is `hixl-peer withhold-flush` (`src/bin/hixl-peer/withhold.rs`), a process
//! of its own; as root, with `/dev/fuse` (skipped with the reason otherwise).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use super::support::{
    Proof, Reply, connect, honest_client, honest_round, honest_rounds, open_link, serial,
    spawn_peer, wait_for,
};

/// The `hixl-peer withhold-flush` child and its mount point.
struct Withholding {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: std::path::PathBuf,
}

impl Withholding {
    /// Mounts it, or says why it cannot here.
    fn mount() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("hixl-withheld-{}", std::process::id()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
            .arg("withhold-flush")
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn hixl-peer withhold-flush: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut l = String::new();
        stdout.read_line(&mut l).unwrap();
        match l.trim_end() {
            "MOUNTED" => Ok(Self {
                child,
                stdin: Some(stdin),
                stdout,
                dir,
            }),
            other => {
                let _ = child.wait();
                Err(other.strip_prefix("SKIP ").unwrap_or(other).to_owned())
            }
        }
    }

    fn ask(&mut self, what: &str) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{what}").unwrap();
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim_end().to_owned()
    }

    /// How many FLUSH requests the daemon got so far.
    fn flushes(&mut self) -> usize {
        let l = self.ask("flushes");
        l.strip_prefix("FLUSHES ")
            .and_then(|n| n.parse().ok())
            .expect("FLUSHES n")
    }
}

impl Drop for Withholding {
    fn drop(&mut self) {
        // the end of its input: it answers every held FLUSH, unmounts and exits
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn a_proof_whose_close_never_ends_does_not_stall_the_poller() {
    let _one = serial();
    let mut fs = match Withholding::mount() {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("a_proof_whose_close_never_ends_does_not_stall_the_poller: skipped: {why}");
            return;
        }
    };
    // every process is started before the file is open: a fork's exec closes its copy
    // (close-on-exec), which would wait for its FLUSH too
    let peer = spawn_peer(&["--io-timeout-ms", "30000"]);
    let (cli, mut buf) = honest_client(false);
    honest_round(&cli, &mut buf, &peer);
    let file = File::open(fs.dir.join("f")).expect("open the FUSE file");
    // (a close of a copy of it does wait, or the test proves nothing)
    // SAFETY: dup of a descriptor this test owns; the result is checked.
    let copy = unsafe { libc::dup(file.as_raw_fd()) };
    assert!(copy >= 0);
    let closer = std::thread::spawn(move || {
        // SAFETY: the duplicate is this thread's alone.
        drop(unsafe { OwnedFd::from_raw_fd(copy) });
    });
    assert!(
        wait_for(Duration::from_secs(10), || fs.flushes() >= 1),
        "the close of a FUSE file sent no FLUSH"
    );
    assert!(
        !closer.is_finished(),
        "a close waits for its FLUSH's answer"
    );

    // raw same-host clients naming this process, each answering PROVE with the FUSE file
    let me = hixl::wire::HostId::current().expect("this process's identity");
    let mut held = Vec::new();
    for i in 0..2u64 {
        let mut s = connect(20 + i as u8, &peer.name).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let fd = Proof::At(file.as_raw_fd() as u64);
        match open_link(&mut s, 40_000 + i, Some(me), fd) {
            Reply::Welcome(w) => assert!(w.fence < 0, "no fence for a failed proof"),
            r => eprintln!("raw client {i}: {r:?}"),
        }
        held.push(s);
    }
    // the server took the file: its copy's close sent a FLUSH, held now
    let took = wait_for(Duration::from_secs(10), || fs.flushes() >= 2);
    let honest = honest_rounds(&cli, &mut buf, &peer, 10, Duration::ZERO);
    eprintln!(
        "PROOFs naming a FUSE file whose FLUSH is held ({} of the server's held): honest rounds {}",
        fs.flushes() - 1,
        honest.summary()
    );
    assert_eq!(fs.ask("release"), "RELEASED");
    let _ = closer.join();
    assert!(
        took,
        "the server never took the FUSE file (no FLUSH of its copy)"
    );
    assert!(
        honest.ok(),
        "while the server's copy's close is held: {}",
        honest.summary()
    );
    drop(held);
    drop(file);
}
