//! `hixl-peer hammer`: a same-host client in its own process that WRITEs a server's regions in a
//! loop (see `src/bin/hixl-peer/`), and can stop itself inside its fence.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Upper bound for anything that should happen "soon" on a loaded 2-core machine.
pub const T: Duration = Duration::from_secs(20);

/// A `hixl-peer hammer` child: its standard output, line by line, through a channel (so every
/// wait is bounded).
pub struct Hammer {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Hammer {
    pub fn spawn(server: &str, args: &[&str], stop_in_fence: bool) -> Hammer {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hixl-peer"));
        cmd.arg("hammer").arg(server).args(args);
        if stop_in_fence {
            cmd.env("HIXL_TEST_STOP_IN_FENCE", "1");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn hixl-peer hammer");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let mut h = Hammer { child, lines };
        assert_eq!(h.line(), "LINKED");
        h
    }

    pub fn line(&mut self) -> String {
        match self.lines.recv_timeout(T) {
            Ok(l) => l,
            Err(e) => panic!(
                "the hammer said nothing for {T:?}: {e}\nwhere its threads wait:\n{}",
                self.threads()
            ),
        }
    }

    /// Where each thread of the hammer waits (its name, kernel wait channel and, as root, its
    /// kernel stack): what a silent hammer was doing.
    fn threads(&self) -> String {
        let dir = format!("/proc/{}/task", self.pid());
        let Ok(tasks) = std::fs::read_dir(&dir) else {
            return format!("({dir} unreadable)");
        };
        let mut out = String::new();
        for t in tasks.flatten() {
            let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
            let stack: Vec<String> = (read("stack").lines())
                .map(|l| l.split_whitespace().nth(1).unwrap_or(l).to_owned())
                .take(8)
                .collect();
            out += &format!(
                "  {} {}: {} [{}]\n",
                t.file_name().to_string_lossy(),
                read("comm").trim(),
                read("wchan").trim(),
                stack.join(" < ")
            );
        }
        out
    }

    /// Waits until batch `n` returned `Ok`, then for about a third of a batch's time, so the
    /// caller acts in the middle of the next batch (where a missing fence shows; with the
    /// fence, any moment is safe).
    pub fn wait_ok(&mut self, n: u64) {
        let t0 = Instant::now();
        loop {
            let l = self.line();
            if let Some(i) = l.strip_prefix("OK ") {
                let i = i.split(' ').next().unwrap();
                if i.parse::<u64>().unwrap() >= n {
                    std::thread::sleep(t0.elapsed() / (3 * n as u32));
                    return;
                }
            } else {
                panic!("the hammer ended before batch {n}: {l}");
            }
        }
    }

    /// Reads to the end: the last batch that returned `Ok` (0: none) and the final status code.
    pub fn ended(&mut self) -> (u64, u32) {
        let (last, code, _) = self.ended_reading();
        (last, code)
    }

    /// As [`Hammer::ended`], with the most 0xA5 bytes a `--read` hammer's batch read (0 for a
    /// writing one).
    pub fn ended_reading(&mut self) -> (u64, u32, usize) {
        let (mut last, mut most) = (0, 0);
        loop {
            let l = self.line();
            if let Some(ok) = l.strip_prefix("OK ") {
                let mut words = ok.split(' ');
                last = words.next().unwrap().parse().unwrap();
                let sentinels = words.next().map_or(0, |c| c.parse().unwrap());
                most = most.max(sentinels);
            } else if let Some(code) = l.strip_prefix("ENDED ") {
                return (last, code.parse().unwrap(), most);
            } else {
                panic!("unexpected line {l:?}");
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until the process is stopped (it stops itself inside its fence).
    pub fn wait_stopped(&self) {
        super::wait_stopped(self.pid());
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
