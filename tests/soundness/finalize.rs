//! "Once `deactivate`, `finalize` or drop returns, nothing of this engine touches registered
//! memory again": with requests that were started and then forgotten (the caller cannot wait for
//! them), on TCP and same-host links, for the typed engine and for the compat engine (whose
//! `transfer_async` may race `finalize` from another thread).
//!
//! How a write after the return is seen: the caller's memory is filled with a sentinel right
//! after the call returns (the caller may reuse it then), and must still hold it after a window
//! several times longer than the transfer would take.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Peer, same_host_available};
use hixl::{Hixl, MemDesc, MemType, Options, SameHost, TransferArgs, TransferDesc, TransferOp};

const SENTINEL: u8 = 0xA5;

/// Caller-managed memory (what `register_raw` and the compat engine register), read and written
/// only through raw pointers while an engine may use it.
struct Raw {
    mem: Box<[u8]>,
}

impl Raw {
    fn new(len: usize) -> Self {
        Raw {
            mem: vec![0u8; len].into_boxed_slice(),
        }
    }
    fn desc(&mut self) -> MemDesc {
        MemDesc {
            addr: self.mem.as_mut_ptr() as usize,
            len: self.mem.len(),
        }
    }
    fn ptr(&self) -> *const u8 {
        self.mem.as_ptr()
    }
    /// Whether the first bytes are no longer zero (the READ has begun to land).
    fn started(&self) -> bool {
        // SAFETY: in bounds; volatile because the engine writes the memory meanwhile.
        (0..64).any(|i| unsafe { std::ptr::read_volatile(self.ptr().add(i)) } != 0)
    }
    /// Overwrites the whole buffer with `SENTINEL`: legal once the engine let go of it.
    fn fill_sentinel(&mut self) {
        self.mem.fill(SENTINEL);
    }
    /// Waits `window` and returns how many 4 KiB pages no longer hold the sentinel (checked at
    /// one byte each, then every byte).
    fn pages_written_within(&self, window: Duration) -> usize {
        let until = Instant::now() + window;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.mem
            .chunks(4096)
            .filter(|p| {
                p.iter()
                    // SAFETY: in bounds; volatile: a straggling transfer may still write.
                    .any(|b| unsafe { std::ptr::read_volatile(b) } != SENTINEL)
            })
            .count()
    }
}

enum End {
    /// `deactivate` then `finalize` (after the link and the region were dropped).
    Finalize,
    /// Dropping the engine (after the link and the region were dropped).
    Drop,
    /// `Link::disconnect`, the engine and region staying.
    Disconnect,
}

/// One round: a client engine registers caller-managed memory, starts one READ of all of the
/// peer's region into it, forgets the request, waits until the READ is landing, and then ends it
/// the way `end` says. From the moment that call returns the memory must not change.
fn forgotten_read_round(peer: &Peer, policy: SameHost, end: End) {
    let len = peer.len as usize;
    let mut mem = Raw::new(len);
    let desc = mem.desc();
    let engine = Hixl::initialize("127.0.0.1", Options::default().same_host(policy))
        .unwrap()
        .into_registered();
    // SAFETY: `mem` stays allocated until the end of this function, after the engine is
    // gone; the test reads it only volatilely while the engine may write it.
    let region = unsafe { engine.register_raw(desc, MemType::Host) }.unwrap();
    let engine = engine.activate().unwrap();
    let link = engine.connect(&peer.name).unwrap();
    let want = match policy {
        SameHost::Forbid => hixl::TransportKind::Tcp,
        _ => hixl::TransportKind::SameHost,
    };
    assert_eq!(link.transport(), want);
    let d = TransferDesc::new(
        region.range(..).unwrap(),
        link.remote(peer.addr, len as u64).unwrap(),
    );
    let req = link
        .transfer_async(
            TransferOp::Read,
            &[d],
            TransferArgs::default().timeout(Duration::from_secs(60)),
        )
        .unwrap();
    std::mem::forget(req);
    // the READ is under way: its first bytes landed
    let t0 = Instant::now();
    while !mem.started() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the READ never started"
        );
        std::thread::yield_now();
    }
    let t1 = Instant::now();
    let (what, rest) = match end {
        End::Finalize => {
            drop((region, link));
            drop(engine.deactivate().finalize());
            ("the engine was finalized", None)
        }
        End::Drop => {
            drop((region, link));
            drop(engine);
            ("the engine was dropped", None)
        }
        End::Disconnect => {
            link.disconnect(Duration::from_secs(1)).unwrap();
            ("the link was disconnected", Some((region, engine)))
        }
    };
    let took = t1.elapsed();
    mem.fill_sentinel();
    // the READ takes tens of ms at most on any machine this runs on: 300 ms would see it land
    let written = mem.pages_written_within(Duration::from_millis(300));
    assert_eq!(
        written, 0,
        "{written} pages were written after {what} ({policy:?}; it took {took:?})"
    );
    assert!(took < Duration::from_secs(10), "{what} after {took:?}");
    // with `Disconnect` the engine and the region are still there: the request was cancelled,
    // not the engine; they go before `mem`
    drop(rest);
}

#[test]
fn finalize_waits_for_a_forgotten_tcp_read() {
    let peer = Peer::spawn("127.0.0.1:0", 64 << 20, 11, "hostbuffer");
    for _ in 0..2 {
        forgotten_read_round(&peer, SameHost::Forbid, End::Finalize);
    }
    peer.quit();
}

#[test]
fn drop_waits_for_a_forgotten_tcp_read() {
    let peer = Peer::spawn("127.0.0.1:0", 64 << 20, 12, "hostbuffer");
    for _ in 0..2 {
        forgotten_read_round(&peer, SameHost::Forbid, End::Drop);
    }
    peer.quit();
}

#[test]
fn finalize_and_drop_wait_for_a_forgotten_same_host_read() {
    if !same_host_available() {
        return;
    }
    let peer = Peer::spawn("127.0.0.1:0", 64 << 20, 13, "hostbuffer");
    for _ in 0..2 {
        forgotten_read_round(&peer, SameHost::Require, End::Finalize);
        forgotten_read_round(&peer, SameHost::Require, End::Drop);
    }
    peer.quit();
}

/// A disconnect cancels the link's forgotten requests and waits for them (the engine and the
/// region stay).
#[test]
fn disconnect_cancels_and_waits_for_forgotten_requests() {
    let peer = Peer::spawn("127.0.0.1:0", 64 << 20, 14, "hostbuffer");
    forgotten_read_round(&peer, SameHost::Forbid, End::Disconnect);
    if same_host_available() {
        forgotten_read_round(&peer, SameHost::Require, End::Disconnect);
    }
    peer.quit();
}

/// compat: `transfer_async` on one thread while another calls `finalize`. Every request either
/// was refused, or `finalize` found it, cancelled it and waited for it: none is left pending
/// (known to `pending_transfers`) and nothing writes the caller's memory after `finalize`
/// returned.
#[test]
fn compat_finalize_racing_transfer_async_leaves_nothing_running() {
    use hixl::compat::{self, TransferOpDesc};
    let server = compat::Hixl::new();
    server
        .initialize("127.0.0.1:0", [("AutoConnect", "0")])
        .unwrap();
    let src_len = 1 << 20;
    let mut src = vec![0x5Au8; src_len];
    let name = server.local_engine().unwrap();
    // SAFETY: `src` outlives `server` (finalized at the end of this test).
    unsafe {
        server.register_mem(
            compat::MemDesc {
                addr: src.as_mut_ptr() as usize,
                len: src_len,
                local_only: false,
            },
            MemType::Host,
        )
    }
    .unwrap();
    let rounds = 150;
    let mut refused_after = 0;
    let mut escaped = 0;
    for round in 0..rounds {
        let mut dst = Raw::new(src_len);
        let client = Arc::new(compat::Hixl::new());
        client
            .initialize("127.0.0.1", [("AutoConnect", "1")])
            .unwrap();
        // SAFETY: `dst` outlives `client`'s registration: the client is finalized below, and
        // `dst` is dropped at the end of the round.
        unsafe {
            client.register_mem(
                compat::MemDesc {
                    addr: dst.mem.as_mut_ptr() as usize,
                    len: src_len,
                    local_only: false,
                },
                MemType::Host,
            )
        }
        .unwrap();
        let d = TransferOpDesc {
            local_addr: dst.ptr() as usize,
            remote_addr: src.as_ptr() as usize,
            len: src_len,
        };
        let started = Arc::new(AtomicUsize::new(0));
        let finalized = Arc::new(AtomicBool::new(false));
        let spinner = {
            let (client, started, finalized, name) = (
                client.clone(),
                started.clone(),
                finalized.clone(),
                name.clone(),
            );
            std::thread::spawn(move || {
                let mut ok_after = 0;
                loop {
                    let after = finalized.load(Ordering::SeqCst);
                    let r = client.transfer_async(
                        &name,
                        TransferOp::Read,
                        &[d],
                        compat::TransferArgs::default(),
                    );
                    match r {
                        Ok(_) if after => ok_after += 1,
                        Ok(_) => {
                            started.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            assert_eq!(e.status(), hixl::Status::FAILED, "{e:?}");
                            return ok_after;
                        }
                    }
                }
            })
        };
        // let the spinner get going (a few requests in), then finalize under it
        let want = 1 + round % 4;
        while started.load(Ordering::SeqCst) < want {
            std::thread::yield_now();
        }
        client.finalize();
        finalized.store(true, Ordering::SeqCst);
        dst.fill_sentinel();
        let ok_after = spinner.join().unwrap();
        // every call of the spinner has returned: a request it started must have been seen by
        // finalize (and so forgotten by it), or refused
        let after = client.pending_transfers();
        refused_after += usize::from(ok_after == 0);
        assert_eq!(
            ok_after, 0,
            "round {round}: a transfer started after finalize"
        );
        if after > 0 {
            escaped += 1;
        }
        assert_eq!(
            after, 0,
            "round {round}: {after} request(s) outlived finalize"
        );
        let written =
            dst.pages_written_within(Duration::from_millis(if round % 10 == 0 { 100 } else { 2 }));
        assert_eq!(
            written, 0,
            "round {round}: {written} pages written after finalize"
        );
    }
    assert_eq!(escaped, 0);
    assert_eq!(refused_after, rounds);
    server.finalize();
}
