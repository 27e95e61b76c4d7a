//! The same-host transport: two processes, both memory kinds, a stopped peer, a killed
//! peer, fallback to TCP (forbidden, or refused by the kernel), hostile memfds, and the copy a
//! shared region's deregistration hands back.

use crate::common;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    Peer, Rng, client_with, exercise_peer, fnv1a, kill_during_rounds, same_host_available, server,
};
use hixl::wire::HostId;
use hixl::{Access, Error, Options, SameHost, TransferDesc, TransferOp, TransportKind};

const T: Duration = Duration::from_secs(20);

/// Random data both ways with another process: one 64 MiB block, 4096 small sub-ranges at odd
/// offsets, and a WRITE batch the peer checks in its own memory; for a HostBuffer (mapped) and
/// for ordinary user memory (process_vm_readv/writev).
#[test]
fn two_processes_both_memory_kinds() {
    if !same_host_available() {
        return;
    }
    for memory in ["hostbuffer", "user"] {
        let size = 72 << 20;
        let mut peer = Peer::spawn("127.0.0.1", size, 31, memory);
        let (cli, mut buf) = client_with(size, Options::default().same_host(SameHost::Require));
        let link = cli.connect(&peer.name).unwrap();
        assert_eq!(link.transport(), TransportKind::SameHost, "{memory}");

        exercise_peer(&link, &mut peer, &mut buf, 31, 4096, memory);
        drop(link);
        peer.quit();
    }
}

/// The peer's CPU does nothing for a transfer: with the peer stopped (SIGSTOP), READ and WRITE
/// complete, for both memory kinds.
#[test]
fn stopped_peer_still_serves() {
    if !same_host_available() {
        return;
    }
    for memory in ["hostbuffer", "user"] {
        let size = 8 << 20;
        let mut peer = Peer::spawn("127.0.0.1", size, 41, memory);
        let (cli, mut buf) = client_with(size, Options::default().same_host(SameHost::Require));
        let link = cli.connect(&peer.name).unwrap();
        peer.signal(libc::SIGSTOP);
        let d = TransferDesc::new(buf.full(), link.remote(peer.addr, size as u64).unwrap());
        let t0 = Instant::now();
        link.transfer_sync(TransferOp::Read, &[d], Duration::from_secs(2))
            .unwrap();
        let data = Rng::new(42).bytes(size);
        let mut got = vec![0u8; size];
        buf.read_at(0, &mut got).unwrap();
        assert!(
            got == Rng::new(41).bytes(size),
            "{memory}: READ from a stopped peer differs"
        );
        buf.write_at(0, &data).unwrap();
        let d = TransferDesc::new(buf.full(), link.remote(peer.addr, size as u64).unwrap());
        link.transfer_sync(TransferOp::Write, &[d], Duration::from_secs(2))
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2));
        peer.signal(libc::SIGCONT);
        assert_eq!(
            peer.sum(0, size as u64),
            fnv1a(&data),
            "{memory}: WRITE to a stopped peer lost"
        );
        drop(link);
        peer.quit();
    }
}

/// A peer killed mid-transfer: the caller gets NOT_CONNECTED at once, and the link stays broken.
#[test]
fn killed_peer_over_same_host() {
    if !same_host_available() {
        return;
    }
    let size = 64 << 20;
    let peer = Peer::spawn("127.0.0.1", size, 51, "user");
    let (cli, buf) = client_with(size, Options::default().same_host(SameHost::Require));
    let link = cli.connect(&peer.name).unwrap();
    let mut child = peer.child;
    let d = TransferDesc::new(buf.full(), link.remote(peer.addr, size as u64).unwrap());
    let (rounds, err, _) = kill_during_rounds(&link, d, &[TransferOp::Write], T, &mut child, T);
    let _ = child.wait();
    assert!(rounds > 0);
    assert_eq!(err.status().code(), 103_902, "{err:?}");
    assert!(link.is_broken());
}

/// `SameHost::Forbid` keeps the link on TCP, with the same data.
#[test]
fn forbidden_same_host_uses_tcp() {
    let (srv, mut cache) = server(1 << 20, Options::default());
    let data = Rng::new(61).bytes(1 << 20);
    cache.write_at(0, &data).unwrap();
    let (cli, mut buf) = client_with(1 << 20, Options::default().same_host(SameHost::Forbid));
    let link = cli.connect(srv.name()).unwrap();
    assert_eq!(link.transport(), TransportKind::Tcp);
    let d = TransferDesc::new(buf.full(), link.regions().next().unwrap().full());
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    let mut got = vec![0u8; 1 << 20];
    buf.read_at(0, &mut got).unwrap();
    assert!(got == data);
}

/// Where the kernel refuses (a client without the right to trace the server), the link falls
/// back to TCP; with `Require`, connect fails with UNSUPPORTED.
#[test]
fn kernel_refusal_falls_back_to_tcp() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !same_host_available() {
        eprintln!(
            "skipped: needs root, to run a client as another user (this is uid {})",
            unsafe { libc::geteuid() }
        );
        return;
    }
    let (srv, mut cache) = server(4096, Options::default());
    let data = Rng::new(71).bytes(4096);
    cache.write_at(0, &data).unwrap();
    let probe = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hixl-peer"))
            .arg("probe")
            .arg(srv.name())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let want = format!("{:016x}", fnv1a(&data[..64]));
    let (ok, out, err) = probe(&[]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("TRANSPORT same-host {want}"));
    let (ok, out, err) = probe(&["--uid", "65534"]);
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        format!("TRANSPORT tcp {want}"),
        "an unprivileged client must fall back to tcp"
    );
    let (ok, _, err) = probe(&["--uid", "65534", "--same-host", "require"]);
    assert!(!ok);
    assert!(
        err.contains("transport same-host is not available"),
        "{err}"
    );
}

/// A same-host "server" that offers descriptors which are not sealed memfds, or shorter than
/// the region it claims: the client refuses to map them (no SIGBUS possible) and stays on TCP;
/// with `Require`, connect says UNSUPPORTED.
#[test]
fn unsafe_memfds_are_refused() {
    let Some(me) = HostId::current() else {
        eprintln!("skipped: /proc does not identify this process");
        return;
    };
    // SAFETY: creating and sizing descriptors this test owns.
    let (unsealed, short) = unsafe {
        let a = libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC);
        assert!(a >= 0 && libc::ftruncate(a, 1 << 20) == 0);
        let b = libc::memfd_create(
            c"short".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(b >= 0 && libc::ftruncate(b, 4096) == 0);
        assert_eq!(
            libc::fcntl(
                b,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0
        );
        (a, b)
    };
    let mut pipe = [0i32; 2];
    // SAFETY: a pipe into a live two-element array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    for (what, fd) in [
        ("unsealed memfd", unsealed),
        ("memfd shorter than its region", short),
        ("pipe", pipe[0]),
    ] {
        for policy in [SameHost::Auto, SameHost::Require] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let name = l.local_addr().unwrap().to_string();
            let fake = std::thread::spawn(move || {
                let Ok((s, _)) = l.accept() else { return };
                common::fake_serve(
                    s,
                    vec![common::entry(0, 0x10_0000, 1 << 20, Access::ReadWrite, fd)],
                    Some(me),
                );
            });
            let (cli, _buf) = client_with(4096, Options::default().same_host(policy));
            match policy {
                SameHost::Require => {
                    let e = cli.connect(&name).unwrap_err();
                    assert!(
                        matches!(
                            e,
                            Error::TransportUnavailable {
                                transport: "same-host",
                                ..
                            }
                        ),
                        "{what}: {e:?}"
                    );
                    assert_eq!(e.status().code(), 103_905);
                }
                _ => {
                    let link = cli.connect(&name).unwrap();
                    assert_eq!(
                        link.transport(),
                        TransportKind::Tcp,
                        "{what}: mapped anyway"
                    );
                }
            }
            drop(cli);
            fake.join().unwrap();
        }
    }
}

/// Deregistering a HostBuffer that was offered to a same-host peer hands back a private copy
/// (never pages the peer may still have mapped); one never offered comes back as it was.
#[test]
fn shared_region_is_handed_back_as_a_copy() {
    if !same_host_available() {
        return;
    }
    for (policy, copied) in [(SameHost::Auto, true), (SameHost::Forbid, false)] {
        let (srv, cache) = server(1 << 20, Options::default());
        let addr = cache.addr();
        let data = Rng::new(81).bytes(1 << 20);
        let (cli, mut buf) = client_with(1 << 20, Options::default().same_host(policy));
        buf.write_at(0, &data).unwrap();
        {
            let link = cli.connect(srv.name()).unwrap();
            let d = TransferDesc::new(buf.full(), link.regions().next().unwrap().full());
            link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
        }
        let srv = srv.deactivate();
        let mem = srv.deregister(cache).unwrap();
        assert!(mem[..] == data[..], "{policy:?}: contents lost");
        assert_eq!(mem.as_ptr() as usize != addr, copied, "{policy:?}");
    }
}

/// A region whose memfd fails the checks is not mapped, and not reached with process_vm at its
/// address either: its batches go over TCP (what a server revokes of a memfd region is its
/// pages, so a client reaches them only through the mapping). A region without a memfd is
/// reached with process_vm (checked by the kernel), and a remote address the peer does not
/// have gives `SameHost` with the descriptor index and EFAULT.
#[test]
fn unmappable_memfds_go_over_tcp_and_faults_name_the_descriptor() {
    let Some(me) = HostId::current() else {
        eprintln!("skipped: /proc does not identify this process");
        return;
    };
    if !same_host_available() {
        return;
    }
    let p0 = Rng::new(91).bytes(4096);
    let p1 = Rng::new(92).bytes(4096);
    let b = p1.clone();
    // SAFETY: creating, filling and sealing descriptors this test owns.
    let (good, bad) = unsafe {
        let g = libc::memfd_create(
            c"good".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(g >= 0 && libc::ftruncate(g, 4096) == 0);
        assert_eq!(libc::pwrite(g, p0.as_ptr().cast(), 4096, 0), 4096);
        assert_eq!(
            libc::fcntl(
                g,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0
        );
        let u = libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC);
        assert!(u >= 0 && libc::ftruncate(u, 4096) == 0);
        (g, u)
    };
    // The client sorts a WELCOME table by address and checks the lowest-addressed memfd at
    // connect: if that one fails the checks, the link stays on TCP (`unsafe_memfds_are_refused`);
    // only the others fall back to process_vm one by one. So the good memfd must have the
    // lowest address of the two, whatever the layout: `b` is wherever the allocator put it
    // (below 0x7f00_0000_0000 under ASan, with MALLOC_ARENA_MAX=1, with an unlimited stack
    // rlimit, and in about 1% of ASLR layouts). Region 0 is only reached through its mapping, so
    // its address is a label: one below vm.mmap_min_addr, like region 2's, where nothing of this
    // process is mapped (a process_vm access to it could only fail).
    let (a_addr, b_addr) = (0x8000u64, b.as_ptr() as u64);
    assert!(a_addr + 4096 <= b_addr, "the good memfd must sort first");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let name = l.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let Ok((s, _)) = l.accept() else { return };
        let e = |id, addr, fd, access| common::entry(id, addr, 4096, access, fd);
        let table = vec![
            e(0, a_addr, good, Access::ReadWrite),
            e(1, b_addr, bad, Access::ReadWrite),
            e(2, 0x1000, -1, Access::Write),
        ];
        common::fake_serve(s, table, Some(me));
    });
    {
        let (cli, mut buf) = client_with(8192, Options::default().same_host(SameHost::Require));
        let link = cli.connect(&name).unwrap();
        assert_eq!(link.transport(), TransportKind::SameHost);
        let r = |id: u32| link.region(id).unwrap();
        assert_eq!(r(0).transport(), TransportKind::SameHost);
        assert_eq!(
            r(1).transport(),
            TransportKind::Tcp,
            "the unsealed memfd would be reached at its address"
        );
        assert_eq!(r(2).transport(), TransportKind::SameHost);
        let reads = [TransferDesc::new(buf.range(0..4096).unwrap(), r(0).full())];
        link.transfer_sync(TransferOp::Read, &reads, T).unwrap();
        let mut got = vec![0u8; 4096];
        buf.read_at(0, &mut got).unwrap();
        assert!(
            got[..] == p0[..],
            "the sealed memfd was not read through its mapping"
        );
        let writes = [
            TransferDesc::new(buf.range(0..100).unwrap(), r(0).range(0..100).unwrap()),
            TransferDesc::new(buf.range(0..100).unwrap(), r(2).range(0..100).unwrap()),
        ];
        let e = link
            .transfer_sync(TransferOp::Write, &writes, T)
            .unwrap_err();
        match &e {
            Error::SameHost { index, source, .. } => {
                assert_eq!(*index, 1);
                assert_eq!(source.raw_os_error(), Some(libc::EFAULT));
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(e.status().code(), 503_900);
    }
    fake.join().unwrap();
    drop(b);
}
