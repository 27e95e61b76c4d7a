//! The soundness probes of `hixl-peer` (see `main.rs`'s docs): `norandom` (an engine without an
//! OS random source), `sink` and `pidreuse` (a same-host write never lands in a process that took
//! a dead peer's pid), `hammer` (a same-host client that keeps writing), and `ucx-client` (a
//! UCX client that links on command).

use std::io::{BufRead, Write};
use std::time::Duration;

use hixl::testkit::{Rng, fnv1a};
use hixl::{Hixl, Options, SameHost, TransferDesc, TransferOp};

/// The page `sink` serves: a static, so its address depends only on where the binary is mapped.
static SINK: SinkPage = SinkPage(std::cell::UnsafeCell::new([0x5A; 4096]));

struct SinkPage(std::cell::UnsafeCell<[u8; 4096]>);
// SAFETY: only read (volatile, through a raw pointer) by one thread; other processes may write
// it, which is what `pidreuse` looks for.
unsafe impl Sync for SinkPage {}

/// `hixl-peer norandom`: see the file's docs.
pub(crate) fn norandom() -> Result<(), Box<dyn std::error::Error>> {
    // this thread's hash keys are taken while the sources still work (std takes them from the
    // same sources, once per thread)
    let _keys = std::collections::HashMap::<u8, u8>::new();
    // a client engine made while they work, and a listener for it to connect to (its kernel
    // completes the TCP handshake; the engine's HELLO needs a nonce first)
    let client = Hixl::initialize("127.0.0.1", Options::default().same_host(SameHost::Forbid))?
        .into_registered()
        .activate()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    // SAFETY: unshare and mount have no memory-safety preconditions; the strings are
    // NUL-terminated literals.
    let isolated = unsafe {
        libc::unshare(libc::CLONE_NEWNS) == 0
            && libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) == 0
            && [c"/dev/urandom", c"/dev/random"].iter().all(|dev| {
                libc::mount(
                    c"/dev/null".as_ptr(),
                    dev.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) == 0
            })
    };
    if !isolated {
        println!(
            "SKIP cannot bind /dev/null over /dev/urandom in a mount namespace of its own: {}",
            std::io::Error::last_os_error()
        );
        return Ok(());
    }
    // seccomp: getrandom(2) fails with EPERM, every other call is allowed
    let filter = [
        // load the system call number (offset 0 of struct seccomp_data)
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_getrandom as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points to `filter`, both alive for the call (the kernel copies them).
    let filtered = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) == 0
    };
    if !filtered {
        println!(
            "SKIP cannot install the seccomp filter: {}",
            std::io::Error::last_os_error()
        );
        return Ok(());
    }
    match Hixl::initialize("127.0.0.1", Options::default()) {
        Ok(_) => println!("INIT ok"),
        Err(e) => println!("INIT err {} {e}", e.status().code()),
    }
    match client.connect(&listener.local_addr()?.to_string()) {
        Ok(_) => println!("CONNECT ok"),
        Err(e) => println!("CONNECT err {} {e}", e.status().code()),
    }
    Ok(())
}

/// Prints `SINK ADDR PID`; then, for each line on standard input, the FNV-1a of the page.
pub(crate) fn sink() -> Result<(), Box<dyn std::error::Error>> {
    let p = SINK.0.get().cast::<u8>();
    let mut out = std::io::stdout().lock();
    writeln!(out, "SINK {} {}", p as usize, std::process::id())?;
    out.flush()?;
    for _ in std::io::stdin().lock().lines() {
        // SAFETY: reads of the live static page, through a raw pointer.
        let bytes: Vec<u8> = (0..4096)
            .map(|i| unsafe { p.add(i).read_volatile() })
            .collect();
        writeln!(out, "{:016x}", fnv1a(&bytes))?;
        out.flush()?;
    }
    Ok(())
}

struct Sink {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    addr: usize,
    pid: u32,
}

impl Sink {
    /// A `sink` child with its address space not randomised (so two sinks share addresses).
    fn spawn() -> Result<Sink, Box<dyn std::error::Error>> {
        use std::os::unix::process::CommandExt;
        use std::process::{Command, Stdio};
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("sink").stdin(Stdio::piped()).stdout(Stdio::piped());
        // SAFETY: personality() is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                Ok(())
            })
        };
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() != 3 || w[0] != "SINK" {
            return Err(format!("the sink said {line:?}").into());
        }
        Ok(Sink {
            addr: w[1].parse()?,
            pid: w[2].parse()?,
            child,
            stdin,
            stdout,
        })
    }

    fn sum(&mut self) -> Result<String, Box<dyn std::error::Error>> {
        writeln!(self.stdin)?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim().to_owned())
    }
}

pub(crate) fn pidreuse() -> Result<(), Box<dyn std::error::Error>> {
    if std::process::id() != 1 {
        return Err("pidreuse runs as the init of a fresh pid namespace (unshare --pid --fork --mount-proc)".into());
    }
    let mut victim = Sink::spawn()?;
    let handle = hixl::testkit::SameHostPeer::open(victim.pid)?;
    victim.child.kill()?;
    victim.child.wait()?;
    // the next process of this namespace gets the victim's pid
    std::fs::write("/proc/sys/kernel/ns_last_pid", (victim.pid - 1).to_string())?;
    let mut decoy = Sink::spawn()?;
    if decoy.pid != victim.pid || decoy.addr != victim.addr {
        println!(
            "SKIP the decoy got pid {} at {:#x}, the victim had pid {} at {:#x}",
            decoy.pid, decoy.addr, victim.pid, victim.addr
        );
        return Ok(());
    }
    let before = decoy.sum()?;
    let data = [0xEEu8; 4096];
    // SAFETY: the target is a sink process's static page, which nothing reads or writes but its
    // `sum` command, and which may hold any bytes; through the old handle it must not land at all.
    let write = match unsafe { handle.write(victim.addr, &data) } {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("errno={}", e.raw_os_error().unwrap_or(0)),
    };
    let unchanged = decoy.sum()? == before;
    // what a write by pid number does now: it reaches the decoy
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: victim.addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: one local iovec over `data` (valid for reads) and one remote iovec; the kernel
    // checks the remote side against the decoy's address space.
    let n = unsafe { libc::process_vm_writev(victim.pid as i32, &local, 1, &remote, 1, 0) };
    let reached = n == 4096 && decoy.sum()? != before;
    println!("PIDREUSE {write} {unchanged} {reached}");
    decoy.child.kill()?;
    decoy.child.wait()?;
    Ok(())
}

pub(crate) fn hammer(
    name: &str,
    len: usize,
    regions: usize,
    repeat: usize,
    seed: u64,
    alternate: bool,
    read: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let opts = Options::default().same_host(SameHost::Require);
    let engine = Hixl::initialize("127.0.0.1", opts)?.into_registered();
    let link_len = {
        // size the local buffer from the peer's table
        let probe = engine.activate()?;
        let l = probe.connect(name)?;
        let n: usize = l
            .regions()
            .take(regions)
            .map(|r| (r.len() as usize).min(len))
            .sum();
        l.disconnect(Duration::from_secs(5))?;
        (probe.deactivate(), n)
    };
    let (engine, total) = link_len;
    let mut buf = engine.register(vec![0u8; 2 * total.max(1)])?;
    for k in 0..2 {
        let mut data = vec![0u8; total];
        Rng::new(seed + k).fill(&mut data);
        buf.write_at(k as usize * total, &data)?;
    }
    let engine = engine.activate()?;
    let link = engine.connect(name)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "LINKED")?;
    out.flush()?;
    for i in 1u64.. {
        let mut descs = Vec::new();
        let mut at = if alternate {
            (i % 2) as usize * total
        } else {
            0
        };
        for r in link.regions().take(regions) {
            let n = (r.len() as usize).min(len);
            for _ in 0..repeat {
                descs.push(TransferDesc::new(
                    buf.range(at..at + n)?,
                    r.range(0..n as u64)?,
                ));
            }
            at += n;
        }
        let op = if read {
            TransferOp::Read
        } else {
            TransferOp::Write
        };
        match link.transfer_sync(op, &descs, Duration::from_secs(30)) {
            Ok(()) if read => {
                let mut got = vec![0u8; at];
                buf.read_at(0, &mut got)?;
                let sentinels = got.iter().filter(|&&b| b == 0xA5).count();
                writeln!(out, "OK {i} {sentinels}")?
            }
            Ok(()) => writeln!(out, "OK {i}")?,
            Err(e) => {
                writeln!(out, "ENDED {}", e.status().code())?;
                out.flush()?;
                return Ok(());
            }
        }
        out.flush()?;
    }
    Ok(())
}

/// `hixl-peer ucx-client NAME --psk KEY`: a client engine that requires UCX, driven by commands
/// on standard input: `link` connects to `NAME` and READs the first 64 bytes of its first region,
/// then prints `LINKED <transport> <fnv1a of the bytes, hex>` (or `ERR <HIXL status> <error>`);
/// `drop` disconnects (`DROPPED`); `quit` (or the end of input) finalizes. Its UCX context is
/// made at start, so a test can change the host's network devices between links.
pub(crate) fn ucx_client(name: &str, psk: &str) -> Result<(), Box<dyn std::error::Error>> {
    // (a server serves UCX to a client on its host only inside its fence: the default
    // SameHost::Auto names this process)
    let opts = Options::default()
        .psk(psk.as_bytes())
        .ucx(hixl::Ucx::Require);
    let (engine, mut buf) = Hixl::initialize("127.0.0.1", opts)?.register(vec![0u8; 64])?;
    let engine = engine.activate()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY")?;
    out.flush()?;
    let mut link = None;
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "link" => {
                let read = |l: &hixl::Link<'_>| -> Result<(), hixl::Error> {
                    let remote = l
                        .regions()
                        .next()
                        .ok_or(hixl::Error::EmptyBatch)?
                        .range(0..64)?;
                    let d = TransferDesc::new(buf.full(), remote);
                    l.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(10))
                };
                match engine.connect(name).and_then(|l| read(&l).map(|()| l)) {
                    Ok(l) => {
                        let t = l.transport();
                        link = Some(l);
                        let mut got = [0u8; 64];
                        buf.read_at(0, &mut got)?;
                        writeln!(out, "LINKED {} {:016x}", t.name(), fnv1a(&got))?;
                    }
                    Err(e) => writeln!(out, "ERR {} {e}", e.status().code())?,
                }
            }
            "drop" => {
                if let Some(l) = link.take() {
                    let _ = l.disconnect(Duration::from_secs(5));
                }
                writeln!(out, "DROPPED")?;
            }
            "quit" => break,
            other => writeln!(out, "ERR 0 unknown command {other:?}")?,
        }
        out.flush()?;
    }
    drop(link);
    let _ = engine.finalize();
    Ok(())
}
