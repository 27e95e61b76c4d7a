//! The compat engine's extensions the Python package uses: `wait_transfer`, `cancel_transfer`,
//! `remote_regions`, `transport`.

use std::time::Duration;

use hixl::compat::{Hixl, MemDesc, TransferArgs, TransferOpDesc, TransferStatus};
use hixl::{Access, MemType, Status, TransferOp};

fn desc(m: &mut [u8]) -> MemDesc {
    MemDesc {
        addr: m.as_mut_ptr() as usize,
        len: m.len(),
        local_only: false,
    }
}

#[test]
fn wait_cancel_regions_transport() {
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![5u8; 1 << 20]);
    let server = Hixl::new();
    server
        .initialize("127.0.0.1:0", [("AutoConnect", "0")])
        .unwrap();
    // SAFETY: both buffers outlive the engines (finalized below) and are read only after the
    // transfers ended.
    unsafe { server.register_mem(desc(&mut a), MemType::Host) }.unwrap();
    let client = Hixl::new();
    client
        .initialize("127.0.0.1", [("AutoConnect", "0")])
        .unwrap();
    // SAFETY: as above.
    unsafe { client.register_mem(desc(&mut b), MemType::Host) }.unwrap();
    let name = server.local_engine().unwrap();
    assert_eq!(
        client.remote_regions(&name).unwrap_err().status(),
        Status::NOT_CONNECTED
    );
    client.connect(&name, 5000).unwrap();

    let regions = client.remote_regions(&name).unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(regions[0].addr, a.as_ptr() as u64);
    assert_eq!(regions[0].len, 1 << 20);
    assert_eq!(regions[0].mem_type, MemType::Host);
    assert_eq!(regions[0].access, Access::ReadWrite);
    let _ = client.transport(&name).unwrap();

    let d = [TransferOpDesc {
        local_addr: b.as_ptr() as usize,
        remote_addr: a.as_ptr() as usize,
        len: 1 << 20,
    }];
    let req = client
        .transfer_async(&name, TransferOp::Write, &d, TransferArgs::default())
        .unwrap();
    assert_eq!(
        client.wait_transfer(req, Duration::from_secs(30)).unwrap(),
        TransferStatus::Completed
    );
    // reported once: unknown afterwards, for wait and cancel alike
    assert_eq!(
        client
            .wait_transfer(req, Duration::from_millis(1))
            .unwrap_err()
            .status(),
        Status::PARAM_INVALID
    );
    assert_eq!(
        client.cancel_transfer(req).unwrap_err().status(),
        Status::PARAM_INVALID
    );

    // a cancelled request ends (FAILED, or COMPLETED if it was quicker) and is reported once
    let req = client
        .transfer_async(&name, TransferOp::Write, &d, TransferArgs::default())
        .unwrap();
    client.cancel_transfer(req).unwrap();
    let st = client.wait_transfer(req, Duration::from_secs(30)).unwrap();
    assert!(
        matches!(st, TransferStatus::Failed | TransferStatus::Completed),
        "{st:?}"
    );
    assert_eq!(
        client.get_transfer_status(req).unwrap_err().status(),
        Status::PARAM_INVALID
    );
    // the link still works
    client
        .transfer_sync(&name, TransferOp::Write, &d, 5000)
        .unwrap();
    client.finalize();
    server.finalize();
    assert!(a.iter().all(|&x| x == 5));
}

/// Request ids are unique in the process, not per engine: one engine's request id given to
/// another engine is unknown there (`PARAM_INVALID`, as a request never issued) for status, cancel
/// and wait alike, and touches neither engine's own request, which both still complete.
#[test]
fn a_request_id_of_one_engine_is_unknown_to_another() {
    const HALF: usize = 1 << 19;
    let mut s = vec![0u8; 2 * HALF];
    let (mut ma, mut mb) = (vec![1u8; HALF], vec![2u8; HALF]);
    let server = Hixl::new();
    server
        .initialize("127.0.0.1:0", [("AutoConnect", "0")])
        .unwrap();
    // SAFETY: every buffer outlives the engines (finalized below) and is read only after the
    // transfers ended.
    unsafe { server.register_mem(desc(&mut s), MemType::Host) }.unwrap();
    let name = server.local_engine().unwrap();
    let mut reqs = Vec::new();
    let mut clients = Vec::new();
    for (i, m) in [&mut ma, &mut mb].into_iter().enumerate() {
        let c = Hixl::new();
        c.initialize("127.0.0.1", [("AutoConnect", "0")]).unwrap();
        // SAFETY: as above.
        unsafe { c.register_mem(desc(m), MemType::Host) }.unwrap();
        c.connect(&name, 5000).unwrap();
        let d = [TransferOpDesc {
            local_addr: m.as_ptr() as usize,
            remote_addr: s.as_ptr() as usize + i * HALF,
            len: HALF,
        }];
        let req = c
            .transfer_async(&name, TransferOp::Write, &d, TransferArgs::default())
            .unwrap();
        reqs.push(req);
        clients.push(c);
    }
    let (a, b) = (&clients[0], &clients[1]);
    let (ra, rb) = (reqs[0], reqs[1]);
    assert_ne!(ra, rb, "each engine's first request");
    // A's request, asked of B: unknown, whatever it is asked
    assert_eq!(
        b.get_transfer_status(ra).unwrap_err().status(),
        Status::PARAM_INVALID
    );
    assert_eq!(
        b.cancel_transfer(ra).unwrap_err().status(),
        Status::PARAM_INVALID
    );
    assert_eq!(
        b.wait_transfer(ra, Duration::from_millis(1))
            .unwrap_err()
            .status(),
        Status::PARAM_INVALID
    );
    assert_eq!(b.pending_transfers(), 1, "B's own request untouched");
    // each engine's own request completes, reported to it
    for (c, r) in [(a, ra), (b, rb)] {
        assert_eq!(
            c.wait_transfer(r, Duration::from_secs(30)).unwrap(),
            TransferStatus::Completed
        );
    }
    for c in &clients {
        c.finalize();
    }
    server.finalize();
    assert!(s[..HALF].iter().all(|&x| x == 1));
    assert!(s[HALF..].iter().all(|&x| x == 2));
}

/// `transfer_async_within` (what NIXL's HIXL backend posts): the request ends `Timeout` at its
/// own deadline, a cancel ends it well before, and neither writes the local buffer; a timeout
/// that is not positive is refused before anything starts.
#[test]
fn requests_end_at_their_own_deadline_or_when_cancelled() {
    // a serving engine that handshakes and then answers nothing
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let name = l.local_addr().unwrap().to_string();
    const BASE: u64 = 0x7000_0000;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                crate::common::fake_serve(
                    s,
                    vec![crate::common::entry(
                        0,
                        BASE,
                        1 << 20,
                        Access::ReadWrite,
                        -1,
                    )],
                    None,
                )
            });
        }
    });
    let mut b = hixl::testkit::Rng::new(46).bytes(1 << 16);
    let before = b.clone();
    let client = Hixl::new();
    client
        .initialize("127.0.0.1", [("AutoConnect", "0")])
        .unwrap();
    // SAFETY: `b` outlives the engine (finalized below) and is read only after every request
    // ended.
    unsafe { client.register_mem(desc(&mut b), MemType::Host) }.unwrap();
    client.connect(&name, 5000).unwrap();
    let d = [TransferOpDesc {
        local_addr: b.as_ptr() as usize,
        remote_addr: BASE as usize,
        len: 1 << 16,
    }];
    for bad in [0, -1] {
        assert_eq!(
            client
                .transfer_async_within(&name, TransferOp::Read, &d, TransferArgs::default(), bad)
                .unwrap_err()
                .status(),
            Status::PARAM_INVALID
        );
    }
    assert_eq!(client.pending_transfers(), 0);

    let t0 = std::time::Instant::now();
    let req = client
        .transfer_async_within(&name, TransferOp::Read, &d, TransferArgs::default(), 300)
        .unwrap();
    let st = client.wait_transfer(req, Duration::from_secs(30)).unwrap();
    let took = t0.elapsed();
    assert_eq!(st, TransferStatus::Timeout);
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(10),
        "{took:?}"
    );

    let t0 = std::time::Instant::now();
    let req = client
        .transfer_async_within(&name, TransferOp::Read, &d, TransferArgs::default(), 60_000)
        .unwrap();
    client.cancel_transfer(req).unwrap();
    let st = client.wait_transfer(req, Duration::from_secs(30)).unwrap();
    assert_eq!(st, TransferStatus::Failed);
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    client.finalize();
    assert!(
        b == before,
        "a request that ended without data wrote the buffer"
    );
}
