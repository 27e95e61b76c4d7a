//! Long-running use leaks nothing: after 1000 connect/transfer/disconnect cycles and 1000
//! register/deregister cycles, open descriptors, threads and registered bytes are back where
//! they started.

mod common;

use std::time::{Duration, Instant};

use common::{client_with, server};
use hixl::{HostBuffer, Options, SameHost, TransferDesc, TransferOp};

const T: Duration = Duration::from_secs(10);

/// The tests count the process's descriptors and threads: they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Waits (bounded) for descriptors and threads to come back to `base`; returns what it saw.
fn settle(base: (usize, usize)) -> (usize, usize) {
    let t0 = Instant::now();
    loop {
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        if now.0 <= base.0 && now.1 <= base.1 || t0.elapsed() > Duration::from_secs(10) {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cycles(policy: SameHost, n: usize) {
    let (srv, _cache) = server(1 << 20, Options::default());
    let (cli, buf) = client_with(1 << 20, Options::default().same_host(policy));
    let one = |i: usize| {
        let link = cli.connect(srv.name()).unwrap();
        let d = TransferDesc::new(
            buf.range(0..4096).unwrap(),
            link.regions().next().unwrap().range(0..4096).unwrap(),
        );
        let op = if i.is_multiple_of(2) {
            TransferOp::Write
        } else {
            TransferOp::Read
        };
        link.transfer_sync(op, &[d], T).unwrap();
        link.disconnect(T).unwrap();
    };
    // warm up: lazily created helper threads exist from here on
    one(0);
    let base = settle((usize::MAX, usize::MAX));
    for i in 0..n {
        one(i);
    }
    let after = settle(base);
    assert!(
        after.0 <= base.0,
        "{policy:?}: descriptors {} -> {}",
        base.0,
        after.0
    );
    assert!(
        after.1 <= base.1,
        "{policy:?}: threads {} -> {}",
        base.1,
        after.1
    );
}

#[test]
fn connect_disconnect_cycles_leak_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    cycles(SameHost::Forbid, 1000);
    cycles(SameHost::Auto, 1000);
}

#[test]
fn register_deregister_cycles_leak_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let e = hixl::Hixl::initialize("127.0.0.1", Options::default())
        .unwrap()
        .into_registered();
    let base = (
        count("/proc/self/fd"),
        e.registered_bytes(),
        e.region_count(),
    );
    let mut mem = HostBuffer::new(64 << 10).unwrap();
    for i in 0..1000 {
        mem[0] = i as u8;
        let r = e.register(mem).unwrap();
        let v = e.register(vec![i as u8; 100]).unwrap();
        assert_eq!(e.region_count(), 2);
        mem = e.deregister(r).unwrap();
        assert_eq!(mem[0], i as u8);
        assert_eq!(e.deregister(v).unwrap(), vec![i as u8; 100]);
    }
    drop(mem);
    assert_eq!(
        (
            count("/proc/self/fd"),
            e.registered_bytes(),
            e.region_count()
        ),
        base
    );
}
