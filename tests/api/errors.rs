//! Every bad input a caller can give: the exact error variant and its HIXL numeric status.

use crate::common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{client, server};
use hixl::{Access, Error, Hixl, HostBuffer, MemDesc, MemType, Options, TransferDesc, TransferOp};

// Upper time bounds leave about a second of slack for a loaded 2-core CI machine (CI slack);
// lower bounds are exact.
const T: Duration = Duration::from_secs(5);

#[test]
fn bad_engine_names_are_param_invalid() {
    for name in [
        "",
        "localhost:1",
        "1.2.3.4:99999",
        "1.2.3.4:x",
        "[::1",
        "1.2.3",
        "[::1]:abc",
    ] {
        let e = Hixl::initialize(name, Options::default()).unwrap_err();
        assert!(
            matches!(e, Error::InvalidEngineName { .. }),
            "{name:?}: {e:?}"
        );
        assert_eq!(e.status().code(), 103_900);
    }
    // a name without a port is a client; ip:0 too (as in HIXL)
    for name in ["127.0.0.1", "127.0.0.1:0", "[::1]"] {
        let e = Hixl::initialize(name, Options::default()).unwrap();
        assert!(!e.is_server(), "{name}");
    }
    // with a port, it listens on exactly that address
    let e = Hixl::initialize_ephemeral("127.0.0.1", Options::default()).unwrap();
    assert!(e.is_server());
    let port: u16 = e.name().rsplit(':').next().unwrap().parse().unwrap();
    let again = Hixl::initialize(&format!("127.0.0.1:{port}"), Options::default()).unwrap_err();
    assert!(matches!(again, Error::Listen { .. }), "{again:?}");
    assert_eq!(again.status().code(), 503_900);
}

/// The compat engine's errors keep the typed error they came from as their `source()`, with its
/// status and text.
#[test]
fn compat_errors_keep_the_typed_error_as_their_source() {
    use std::error::Error as _;
    let e = hixl::compat::Hixl::new()
        .initialize("localhost:1", [("", ""); 0])
        .unwrap_err();
    assert_eq!(e.status().code(), 103_900);
    let typed = e
        .source()
        .and_then(|s| s.downcast_ref::<Error>())
        .expect("the typed error is the source");
    assert!(
        matches!(typed, Error::InvalidEngineName { .. }),
        "{typed:?}"
    );
    assert!(e.message().contains(&typed.to_string()), "{e}");
    // the compat layer's own checks have no typed error behind them
    let e = hixl::compat::Hixl::new().local_engine().unwrap_err();
    assert!(e.source().is_none(), "{e:?}");
}

#[test]
fn registration_errors() {
    let (e, r) = Hixl::initialize("127.0.0.1", Options::default().max_regions(3))
        .unwrap()
        .register(HostBuffer::new(8192).unwrap())
        .unwrap();
    // zero length: the memory comes back
    let err = e.register(Vec::<u8>::new()).unwrap_err();
    assert!(matches!(err.error, Error::ZeroLengthRegion));
    assert_eq!(err.status().code(), 103_900);
    assert!(err.into_inner().is_empty());

    let base = r.addr();
    // SAFETY (for the raw registrations below): every range either fails to register or lies
    // inside `r`'s buffer, which outlives the engine's use of it (the engine is finalized first).
    let raw = |d: MemDesc, t: MemType| unsafe { e.register_raw(d, t) };
    let same = raw(
        MemDesc {
            addr: base,
            len: 8192,
        },
        MemType::Host,
    )
    .unwrap_err();
    assert!(
        matches!(same, Error::AlreadyRegistered { existing, .. } if existing == r.id()),
        "{same:?}"
    );
    assert_eq!(same.status().code(), 103_900);
    for (addr, len) in [
        (base + 100, 10),
        (base - 100, 200),
        (base + 8000, 500),
        (base - 10, 9000),
    ] {
        let over = raw(MemDesc { addr, len }, MemType::Host).unwrap_err();
        assert!(
            matches!(over, Error::OverlappingRegion { .. }),
            "{addr:#x}+{len}: {over:?}"
        );
        assert_eq!(over.status().code(), 103_900);
    }
    let zero = raw(
        MemDesc {
            addr: base + 9000,
            len: 0,
        },
        MemType::Host,
    )
    .unwrap_err();
    assert!(matches!(zero, Error::ZeroLengthRegion));
    let null = raw(MemDesc { addr: 0, len: 10 }, MemType::Host).unwrap_err();
    assert!(matches!(null, Error::NullAddress));
    assert_eq!(null.status().code(), 103_900);
    let wrap = raw(
        MemDesc {
            addr: usize::MAX - 10,
            len: 100,
        },
        MemType::Host,
    )
    .unwrap_err();
    assert!(matches!(wrap, Error::AddressOverflow { .. }));
    assert_eq!(wrap.status().code(), 103_900);
    let dev = raw(
        MemDesc {
            addr: base + 100_000,
            len: 10,
        },
        MemType::Device,
    )
    .unwrap_err();
    assert!(matches!(
        dev,
        Error::UnsupportedMemory {
            mem_type: MemType::Device,
            ..
        }
    ));
    assert_eq!(dev.status().code(), 103_905);
    // device memory through the typed path needs a context token, and is UNSUPPORTED too
    let dev = e
        .with_context(|tok| e.register_device(tok, vec![1u8; 16]))
        .unwrap()
        .unwrap_err();
    assert_eq!(dev.status().code(), 103_905);
    assert_eq!(dev.into_inner(), vec![1u8; 16]);

    // the region limit
    let _two = e.register(vec![0u8; 10]).unwrap();
    let _three = e.register(vec![0u8; 10]).unwrap();
    let full = e.register(vec![0u8; 10]).unwrap_err();
    assert!(
        matches!(full.error, Error::TooManyRegions { limit: 3 }),
        "{:?}",
        full.error
    );
    assert_eq!(full.status().code(), 203_900);
    assert_eq!(e.region_count(), 3);

    // a region of another engine cannot be deregistered here, and comes back
    let (other, foreign) = Hixl::initialize("127.0.0.1", Options::default())
        .unwrap()
        .register(vec![1u8; 4])
        .unwrap();
    let refused = e.deregister(foreign).unwrap_err();
    assert!(matches!(
        refused.error,
        Error::ForeignHandle { what: "region", .. }
    ));
    assert_eq!(refused.status().code(), 103_900);
    assert_eq!(
        other.deregister(refused.into_inner()).unwrap(),
        vec![1u8; 4]
    );
    let _ = e.finalize();
}

#[test]
fn first_registration_failure_hands_back_engine_and_memory() {
    let e = Hixl::initialize("127.0.0.1", Options::default()).unwrap();
    let err = e.register(Vec::<u8>::new()).unwrap_err();
    assert_eq!(err.status().code(), 103_900);
    let (error, engine, mem) = err.into_parts();
    assert!(matches!(error, Error::ZeroLengthRegion));
    assert!(mem.is_empty());
    // the engine is usable again, in Initialized
    let (engine, r) = engine.register(vec![9u8; 3]).unwrap();
    assert_eq!(engine.deregister(r).unwrap(), vec![9u8; 3]);
    // `?` works through TransitionError
    fn first(e: Hixl<hixl::Initialized>) -> Result<(), Error> {
        let (_e, _r) = e.register(Vec::<u8>::new())?;
        Ok(())
    }
    let e = Hixl::initialize("127.0.0.1", Options::default()).unwrap();
    assert!(matches!(first(e), Err(Error::ZeroLengthRegion)));
}

#[test]
fn connect_errors() {
    let (srv, _r) = server(4096, Options::default());
    let (cli, _b) = client(4096);
    let e = cli.connect_timeout(srv.name(), Duration::ZERO).unwrap_err();
    assert!(matches!(e, Error::InvalidTimeout { millis: 0 }));
    assert_eq!(e.status().code(), 103_900);
    assert_eq!(
        hixl::timeout_from_millis(-5).unwrap_err().status().code(),
        103_900
    );
    let e = cli.connect("127.0.0.1").unwrap_err();
    assert!(matches!(e, Error::NotConnectable { .. }), "{e:?}");
    assert_eq!(e.status().code(), 103_900);
    let e = cli.connect("not-an-ip:5").unwrap_err();
    assert!(matches!(e, Error::InvalidEngineName { .. }));
    let e = srv.connect(srv.name()).unwrap_err();
    assert!(matches!(e, Error::NotConnectable { .. }), "{e:?}");

    let link = cli.connect(srv.name()).unwrap();
    let e = cli.connect(srv.name()).unwrap_err();
    assert!(matches!(e, Error::AlreadyConnected { .. }), "{e:?}");
    assert_eq!(e.status().code(), 103_903);
    drop(link);
    // after the link is gone, connecting again works
    let link = cli.connect(srv.name()).unwrap();
    link.disconnect(T).unwrap();

    // nobody listening: a connect error with its cause, fast
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let t0 = Instant::now();
    let e = cli
        .connect_timeout(&addr.to_string(), Duration::from_millis(500))
        .unwrap_err();
    assert!(matches!(e, Error::ConnectFailed { .. }), "{e:?}");
    assert_eq!(e.status().code(), 503_900);
    assert!(t0.elapsed() < Duration::from_secs(2));

    // a peer that accepts but never answers: TIMEOUT, within the timeout
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let t0 = Instant::now();
    let e = cli
        .connect_timeout(
            &mute.local_addr().unwrap().to_string(),
            Duration::from_millis(300),
        )
        .unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, Error::Timeout { op: "connect", .. }), "{e:?}");
    assert_eq!(e.status().code(), 103_901);
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    // a failed connect does not leave the peer marked as connected
    let e = cli
        .connect_timeout(
            &mute.local_addr().unwrap().to_string(),
            Duration::from_millis(50),
        )
        .unwrap_err();
    assert_eq!(e.status().code(), 103_901);
}

#[test]
fn transfer_errors() {
    let (srv, cache) = server(4096, Options::default());
    let (cli, buf) = client(4096);
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();

    let e = link.transfer_sync(TransferOp::Write, &[], T).unwrap_err();
    assert!(matches!(e, Error::EmptyBatch));
    assert_eq!(e.status().code(), 103_900);

    let d = TransferDesc::new(buf.range(0..10).unwrap(), remote.range(0..10).unwrap());
    let e = link
        .transfer_sync(TransferOp::Write, &[d], Duration::ZERO)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTimeout { .. }));

    let bad = TransferDesc::new(buf.range(0..10).unwrap(), remote.range(0..11).unwrap());
    let e = link
        .transfer_sync(TransferOp::Write, &[d, d, bad], T)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                index: 2,
                local: 10,
                remote: 11
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status().code(), 103_900);

    // local and remote ranges outside their regions
    let e = buf.range(4000..4097).unwrap_err();
    assert!(matches!(e, Error::RangeOutOfBounds { .. }));
    assert_eq!(e.status().code(), 103_900);
    assert!(matches!(
        buf.range(5..5),
        Err(Error::RangeOutOfBounds { .. })
    ));
    assert!(matches!(
        remote.range(4000..4097),
        Err(Error::RangeOutOfBounds { .. })
    ));
    let base = cache.addr() as u64;
    for (addr, len) in [
        (base + 4000, 97),
        (base - 1, 2),
        (base, 0),
        (u64::MAX, 2),
        (1, 1),
    ] {
        let e = link.remote(addr, len).unwrap_err();
        assert!(
            matches!(e, Error::RemoteNotRegistered { .. }),
            "{addr:#x}+{len}"
        );
        assert_eq!(e.status().code(), 103_900);
    }
    assert!(link.remote(base + 4000, 96).is_ok());
    let e = link.region(99).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::UnknownRemoteRegion {
                region: 99,
                offset: 0,
                len: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status().code(), 103_900);

    // a region of another engine
    let (other, foreign) = client(4096);
    let f = TransferDesc::new(foreign.range(0..10).unwrap(), remote.range(0..10).unwrap());
    let e = link.transfer_sync(TransferOp::Read, &[f], T).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForeignHandle {
                what: "local region",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.status().code(), 103_900);

    // a remote range of another link
    let (srv2, _c2) = server(4096, Options::default());
    let link2 = cli.connect(srv2.name()).unwrap();
    let r2 = link2.regions().next().unwrap().range(0..10).unwrap();
    let e = link
        .transfer_sync(
            TransferOp::Read,
            &[TransferDesc::new(buf.range(0..10).unwrap(), r2)],
            T,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForeignHandle {
                what: "remote range",
                ..
            }
        ),
        "{e:?}"
    );
    // ...works on its own link
    link2
        .transfer_sync(
            TransferOp::Read,
            &[TransferDesc::new(buf.range(0..10).unwrap(), r2)],
            T,
        )
        .unwrap();
    drop((link, link2));
    let _ = (other, srv2, srv, cli);
}

#[test]
fn access_rights_are_enforced_locally() {
    let (e, ro) = Hixl::initialize_ephemeral("127.0.0.1", Options::default())
        .unwrap()
        .register_with(vec![5u8; 64], Access::Read)
        .unwrap();
    let wo = e.register_with(vec![0u8; 64], Access::Write).unwrap();
    let none = e.register_with(vec![0u8; 64], Access::None).unwrap();
    let srv = e.activate().unwrap();
    let (cli, buf) = client(4096);
    let link = cli.connect(srv.name()).unwrap();
    let r = |id| link.region(id).unwrap().range(0..64).unwrap();
    let l = buf.range(0..64).unwrap();
    let err = link
        .transfer_sync(TransferOp::Write, &[TransferDesc::new(l, r(ro.id()))], T)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::AccessDenied {
                op: TransferOp::Write,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.status().code(), 103_900);
    let err = link
        .transfer_sync(TransferOp::Read, &[TransferDesc::new(l, r(wo.id()))], T)
        .unwrap_err();
    assert!(matches!(
        err,
        Error::AccessDenied {
            op: TransferOp::Read,
            ..
        }
    ));
    for op in [TransferOp::Read, TransferOp::Write] {
        let err = link
            .transfer_sync(op, &[TransferDesc::new(l, r(none.id()))], T)
            .unwrap_err();
        assert!(matches!(err, Error::AccessDenied { .. }));
    }
    link.transfer_sync(TransferOp::Read, &[TransferDesc::new(l, r(ro.id()))], T)
        .unwrap();
    link.transfer_sync(TransferOp::Write, &[TransferDesc::new(l, r(wo.id()))], T)
        .unwrap();
    assert!(!link.is_broken());
}

/// A server I/O timeout of zero is refused at initialize (it failed every handshake within
/// milliseconds); one of `Duration::MAX` is capped where it is used: a client links and its
/// data lands (it panicked the serving thread at its first accept, and the engine never
/// served again).
#[test]
fn server_io_timeouts_at_the_ends_of_duration() {
    let e = Hixl::initialize_ephemeral(
        "127.0.0.1",
        Options::default().server_io_timeout(Duration::ZERO),
    )
    .expect_err("a zero server I/O timeout");
    assert!(matches!(e, Error::InvalidTimeout { millis: 0 }), "{e:?}");
    assert_eq!(e.status().code(), 103_900);
    let (srv, mut region) = server(4096, Options::default().server_io_timeout(Duration::MAX));
    let data = common::Rng::new(11).bytes(64);
    region.write_at(0, &data).unwrap();
    for round in 0..2 {
        let (cli, mut buf) = client(4096);
        let link = cli
            .connect(srv.name())
            .unwrap_or_else(|e| panic!("link {round}: {e}"));
        let d = TransferDesc::new(
            buf.range(0..64).unwrap(),
            link.regions().next().unwrap().range(0..64).unwrap(),
        );
        link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
        drop(link);
        let mut got = vec![0u8; 64];
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(got, data, "round {round}");
    }
}

#[test]
fn peer_finalized_gives_not_connected() {
    let (srv, _cache) = server(4096, Options::default());
    let (cli, buf) = client(4096);
    let link = cli.connect(srv.name()).unwrap();
    let d = TransferDesc::new(
        buf.range(0..8).unwrap(),
        link.regions().next().unwrap().range(0..8).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    let _ = srv.finalize();
    let t0 = Instant::now();
    let e = link.transfer_sync(TransferOp::Write, &[d], T).unwrap_err();
    assert!(t0.elapsed() < T);
    assert_eq!(e.status().code(), 103_902, "{e:?}");
    assert!(link.is_broken());
    // the broken link stays broken and says so at once
    let e = link.transfer_sync(TransferOp::Read, &[d], T).unwrap_err();
    assert!(matches!(e, Error::NotConnected { .. }));
    assert!(link.disconnect(T).is_ok());
}

#[test]
fn stopped_peer_times_out_within_the_deadline() {
    // a server whose serving threads are slowed to a halt is indistinguishable from a stopped
    // one: use a raw listener that completes the handshake and then never answers
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = mute.local_addr().unwrap();
    let base = 0x10_0000u64;
    let serve = move |s| {
        common::fake_serve(
            s,
            vec![common::entry(0, base, 4096, Access::ReadWrite, -1)],
            None,
        )
    };
    // every lane the client opens gets a handshake and then silence
    let srv = std::thread::spawn(move || {
        let mut lanes = Vec::new();
        for _ in 0..2 {
            let (s, _) = mute.accept().unwrap();
            lanes.push(std::thread::spawn(move || serve(s)));
        }
        for l in lanes {
            l.join().unwrap();
        }
    });
    let (cli, buf) = client(4096);
    let link = cli.connect(&addr.to_string()).unwrap();
    let d = TransferDesc::new(buf.range(0..64).unwrap(), link.remote(base, 64).unwrap());
    for op in [TransferOp::Read, TransferOp::Write] {
        let t0 = Instant::now();
        let e = link
            .transfer_sync(op, &[d], Duration::from_millis(300))
            .unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert_eq!(e.status().code(), 103_901);
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_millis(2000),
            "{op}: {took:?}"
        );
    }
    drop(link);
    srv.join().unwrap();
}

/// The declarative graph in `hixl::spec` and the real engine have the same edges.
#[test]
fn spec_edges_match_the_engine() {
    use std::collections::BTreeSet;
    let mut seen = BTreeSet::new();
    let mut edge = |a: &'static str, m: &'static str, b: &'static str| {
        seen.insert((a, m, b));
    };
    let e = Hixl::initialize_ephemeral("127.0.0.1", Options::default()).unwrap();
    let e = e.register(Vec::<u8>::new()).unwrap_err().into_engine();
    edge("Initialized", "register", "Initialized");
    let (e, r) = e.register(vec![1u8; 8]).unwrap();
    edge("Initialized", "register", "Registered");
    let e = e.activate().unwrap();
    edge("Registered", "activate", "Connected");
    let e = e.deactivate();
    edge("Connected", "deactivate", "Registered");
    let _ = e.deregister(r).unwrap();
    let _ = e.finalize();
    edge("Registered", "finalize", "Finalized");
    let e = Hixl::initialize("127.0.0.1", Options::default()).unwrap();
    let _ = e.finalize();
    edge("Initialized", "finalize", "Finalized");
    let e = Hixl::initialize("127.0.0.1", Options::default())
        .unwrap()
        .into_registered();
    edge("Initialized", "into_registered", "Registered");
    let _ = e.activate().unwrap().finalize();
    edge("Connected", "finalize", "Finalized");
    // activate fails only when serving threads cannot start; the engine comes back Registered
    edge("Registered", "activate", "Registered");
    let spec: BTreeSet<_> = hixl::spec::EDGES.iter().copied().collect();
    assert_eq!(seen, spec);
}

/// A server with an allow-list refuses other engines at the handshake, and serves those listed.
#[test]
fn allow_list_refuses_unlisted_engines() {
    let (srv, _cache) = server(4096, Options::default().allow_peers(["127.0.0.9"]));
    let (cli, _buf) = client(4096);
    let e = cli.connect(srv.name()).unwrap_err();
    match &e {
        Error::Refused { refusal, .. } => {
            assert!(refusal.reason.contains("allow-list"), "{refusal:?}")
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(e.status().code(), 103_900);
    let (listed, _r) = Hixl::initialize(
        "127.0.0.9",
        Options::default().same_host(hixl::SameHost::Forbid),
    )
    .unwrap()
    .register(vec![0u8; 64])
    .unwrap();
    let listed = listed.activate().unwrap();
    let link = listed.connect(srv.name()).unwrap();
    assert_eq!(link.regions().len(), 1);
}
