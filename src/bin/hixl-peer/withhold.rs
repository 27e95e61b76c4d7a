//! `hixl-peer withhold-flush DIR`: a FUSE file system of one file, `DIR/f`, whose daemon (this
//! process) holds every FLUSH the kernel sends on a close of that file, so the close does not
//! return; for the test that a serving engine never closes a client's descriptor on its poller
//! thread (`tests/serving/withheld.rs`). As root, with `/dev/fuse`.
//!
//! It mounts, prints `MOUNTED` (or `SKIP <why>` and exits), then serves the file system on one
//! thread and reads commands on standard input: `flushes` prints `FLUSHES <n>` (how many FLUSH
//! requests came so far), `release` answers every held FLUSH and every later one at once. At the
//! end of its input (the test ended, or died) it releases, unmounts (lazily) and exits: the
//! daemon is a process of its own so that no close can outlive the daemon, which a FUSE
//! flush (waited for uninterruptibly) would otherwise do in a process that exits.

use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const FUSE_LOOKUP: u32 = 1;
const FUSE_GETATTR: u32 = 3;
const FUSE_OPEN: u32 = 14;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
/// `fuse_in_header`'s size.
const IN_HEADER: usize = 40;

/// The daemon's state, shared with the command loop.
struct Daemon {
    dev: File,
    held: Mutex<Vec<u64>>,
    flushes: AtomicUsize,
    release: AtomicBool,
}

impl Daemon {
    fn reply(&self, unique: u64, error: i32, payload: &[u8]) {
        let mut out = Vec::with_capacity(16 + payload.len());
        out.extend_from_slice(&((16 + payload.len()) as u32).to_le_bytes());
        out.extend_from_slice(&error.to_le_bytes());
        out.extend_from_slice(&unique.to_le_bytes());
        out.extend_from_slice(payload);
        if let Err(e) = (&self.dev).write_all(&out) {
            eprintln!("withhold-flush: reply to {unique}: {e}");
        }
    }

    /// Answers every FLUSH held so far, and every later one at once.
    fn release(&self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        self.release.store(true, Ordering::SeqCst);
        for u in std::mem::take(&mut *held) {
            self.reply(u, 0, &[]);
        }
    }

    /// Answers INIT, LOOKUP, GETATTR, OPEN and RELEASE; holds FLUSH; ENOSYS to the rest.
    fn serve(&self) {
        let mut buf = vec![0u8; 1 << 17];
        loop {
            match (&self.dev).read(&mut buf) {
                Ok(n) if n >= IN_HEADER => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                _ => return, // ENODEV: unmounted
            }
            let opcode = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
            let unique = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
            let nodeid = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
            match opcode {
                FUSE_INIT => {
                    // fuse_init_out (64 bytes): protocol 7.31, max_write 4096, time_gran 1
                    let mut o = Vec::with_capacity(64);
                    for w in [7u32, 31, 0, 0] {
                        o.extend_from_slice(&w.to_le_bytes());
                    }
                    o.extend_from_slice(&[0u8; 4]); // max_background, congestion_threshold
                    o.extend_from_slice(&4096u32.to_le_bytes());
                    o.extend_from_slice(&1u32.to_le_bytes());
                    o.resize(64, 0);
                    self.reply(unique, 0, &o);
                }
                FUSE_LOOKUP => {
                    // fuse_entry_out: node 2, no caching, then its attributes
                    let mut o = 2u64.to_le_bytes().to_vec();
                    o.extend_from_slice(&[0u8; 32]);
                    o.extend_from_slice(&attr(2, libc::S_IFREG | 0o644, 1));
                    self.reply(unique, 0, &o);
                }
                FUSE_GETATTR => {
                    let a = match nodeid {
                        1 => attr(1, libc::S_IFDIR | 0o755, 2),
                        _ => attr(2, libc::S_IFREG | 0o644, 1),
                    };
                    let mut o = vec![0u8; 16]; // fuse_attr_out: no caching
                    o.extend_from_slice(&a);
                    self.reply(unique, 0, &o);
                }
                FUSE_OPEN => self.reply(unique, 0, &[0u8; 16]),
                FUSE_RELEASE => self.reply(unique, 0, &[]),
                FUSE_FLUSH => {
                    let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                    self.flushes.fetch_add(1, Ordering::SeqCst);
                    if self.release.load(Ordering::SeqCst) {
                        self.reply(unique, 0, &[]);
                    } else {
                        held.push(unique);
                    }
                }
                FUSE_INTERRUPT => {} // a held request stays held
                _ => self.reply(unique, -libc::ENOSYS, &[]),
            }
        }
    }
}

/// A `fuse_attr` (88 bytes): inode `ino` of mode `mode`, empty.
fn attr(ino: u64, mode: u32, nlink: u32) -> Vec<u8> {
    let mut a = ino.to_le_bytes().to_vec();
    a.extend_from_slice(&[0u8; 52]); // size, blocks, three times and their nanoseconds
    a.extend_from_slice(&mode.to_le_bytes());
    a.extend_from_slice(&nlink.to_le_bytes());
    a.extend_from_slice(&[0u8; 12]); // uid, gid, rdev
    a.extend_from_slice(&4096u32.to_le_bytes()); // blksize
    a.extend_from_slice(&[0u8; 4]); // flags
    a
}

/// `hixl-peer withhold-flush DIR`: see the file's docs.
pub(crate) fn withhold_flush(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        writeln!(out, "SKIP not root (mounting FUSE needs it)")?;
        return Ok(());
    }
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(d) => d,
        Err(e) => {
            writeln!(out, "SKIP /dev/fuse: {e}")?;
            return Ok(());
        }
    };
    std::fs::create_dir_all(dir)?;
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    let data = std::ffi::CString::new(format!(
        "fd={},rootmode=40000,user_id=0,group_id=0",
        dev.as_raw_fd()
    ))?;
    // SAFETY: mount with NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            c"hixl-withhold".as_ptr(),
            target.as_ptr(),
            c"fuse".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        writeln!(out, "SKIP mount fuse: {}", std::io::Error::last_os_error())?;
        return Ok(());
    }
    let d = Arc::new(Daemon {
        dev,
        held: Mutex::new(Vec::new()),
        flushes: AtomicUsize::new(0),
        release: AtomicBool::new(false),
    });
    let serving = {
        let d = d.clone();
        std::thread::spawn(move || d.serve())
    };
    writeln!(out, "MOUNTED")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "flushes" => writeln!(out, "FLUSHES {}", d.flushes.load(Ordering::SeqCst))?,
            "release" => {
                d.release();
                writeln!(out, "RELEASED")?;
            }
            other => writeln!(out, "ERR {other:?}")?,
        }
        out.flush()?;
    }
    d.release();
    // SAFETY: umount2 with a NUL-terminated path.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    // the daemon's read ends once the file system is gone (every file of it closed); the
    // process exits regardless, which ends the connection
    drop(serving);
    let _ = std::fs::remove_dir(dir);
    Ok(())
}
