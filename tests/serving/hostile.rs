//! A raw socket that speaks the protocol badly never crashes the serving engine, never makes it
//! touch memory outside a registered, permitted range, and the engine keeps serving others.

use crate::{common, support};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Rng, client, read_frame};
use hixl::wire::{self, Hello, Kind, LaneRole, WireDesc};
use hixl::{Access, Connected, Hixl, MemDesc, MemType, Options, Region, TransferDesc, TransferOp};

const GUARD: usize = 4096;
const LEN: usize = 64 << 10;
const T: Duration = Duration::from_secs(5);

/// A server whose one region sits between two guard areas that are not registered.
struct Guarded {
    engine: Hixl<Connected>,
    region: Region<MemDesc>,
    ro: Region<Vec<u8>>,
    mem: Box<[u8]>,
    pattern: Vec<u8>,
}

fn guarded() -> Guarded {
    let mut rng = Rng::new(42);
    let pattern = rng.bytes(GUARD * 2 + LEN);
    let mut mem = pattern.clone().into_boxed_slice();
    let base = mem.as_mut_ptr() as usize;
    let e = Hixl::initialize_ephemeral(
        "127.0.0.1",
        Options::default().server_io_timeout(Duration::from_secs(2)),
    )
    .unwrap()
    .into_registered();
    // SAFETY: `mem` outlives the engine (the engine is finalized before `mem` is dropped, in
    // `check`), and the test only reads it through the engine's transfers and after finalize.
    let region = unsafe {
        e.register_raw(
            MemDesc {
                addr: base + GUARD,
                len: LEN,
            },
            MemType::Host,
        )
    }
    .unwrap();
    let ro = e.register_with(vec![0xAAu8; 256], Access::Read).unwrap();
    Guarded {
        engine: e.activate().unwrap(),
        region,
        ro,
        mem,
        pattern,
    }
}

impl Guarded {
    /// Still serves an honest client; then, after finalize, the guards are intact.
    fn check(self) {
        {
            let (cli, buf) = client(64);
            let link = cli.connect(self.engine.name()).unwrap();
            let d = TransferDesc::new(
                buf.range(0..64).unwrap(),
                link.region(self.region.id()).unwrap().range(0..64).unwrap(),
            );
            link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
        }
        let e = self.engine.finalize();
        let _ = e.deregister(self.region).unwrap();
        assert_eq!(
            e.deregister(self.ro).unwrap(),
            vec![0xAAu8; 256],
            "a read-only region was written"
        );
        assert!(
            self.mem[..GUARD] == self.pattern[..GUARD],
            "the guard before the region was touched"
        );
        assert!(
            self.mem[GUARD + LEN..] == self.pattern[GUARD + LEN..],
            "the guard after the region was touched"
        );
    }
}

fn connect_raw(name: &str) -> TcpStream {
    let s = TcpStream::connect(name).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s
}

fn hello(s: &mut TcpStream) -> wire::Welcome {
    hello_as(s, 77)
}

/// The next thing the engine does is close the connection, perhaps after a REFUSE; anything
/// else means `what` was answered.
fn refused_and_closed(s: &mut TcpStream, what: &str) {
    match read_frame(s) {
        None => {}
        Some((Kind::Refuse, _)) => assert!(closed(s), "{what}: still open after REFUSE"),
        Some((k, _)) => panic!("{what} was answered with {k:?}"),
    }
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn xfer(op: TransferOp, descs: &[WireDesc]) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_xfer(&mut out, op, 1, descs.iter().copied());
    out
}

/// Out-of-range, overflowing, unknown-region and forbidden descriptors are refused with
/// PARAM_INVALID before any byte moves; READ refusals keep the lane, WRITE refusals close it.
#[test]
fn bad_descriptors_are_refused() {
    let _many = support::alongside();
    let g = guarded();
    let id = g.region.id();
    let bad: Vec<(TransferOp, WireDesc)> = vec![
        (
            TransferOp::Write,
            WireDesc {
                region: id,
                offset: LEN as u64 - 10,
                len: 11,
            },
        ),
        (
            TransferOp::Write,
            WireDesc {
                region: id,
                offset: u64::MAX - 5,
                len: 10,
            },
        ),
        (
            TransferOp::Write,
            WireDesc {
                region: id,
                offset: 0,
                len: u64::MAX,
            },
        ),
        (
            TransferOp::Write,
            WireDesc {
                region: id,
                offset: 5,
                len: 0,
            },
        ),
        (
            TransferOp::Write,
            WireDesc {
                region: 999,
                offset: 0,
                len: 1,
            },
        ),
        (
            TransferOp::Write,
            WireDesc {
                region: g.ro.id(),
                offset: 0,
                len: 8,
            },
        ),
        (
            TransferOp::Read,
            WireDesc {
                region: id,
                offset: LEN as u64,
                len: 1,
            },
        ),
        (
            TransferOp::Read,
            WireDesc {
                region: id,
                offset: 1 << 63,
                len: 1 << 63,
            },
        ),
        (
            TransferOp::Read,
            WireDesc {
                region: 12345,
                offset: 0,
                len: 1,
            },
        ),
    ];
    for (op, d) in bad {
        let mut s = connect_raw(g.engine.name());
        hello(&mut s);
        // a good descriptor first, so a refusal must cover the whole batch
        let good = WireDesc {
            region: id,
            offset: 0,
            len: 16,
        };
        let mut frame = xfer(op, &[good, d]);
        if op == TransferOp::Write {
            frame.extend_from_slice(&[0xEE; 16]); // the payload of the good descriptor, nothing more
        }
        s.write_all(&frame).unwrap();
        let (k, p) = read_frame(&mut s).expect("a DONE");
        assert_eq!(k, Kind::Done);
        let (_, status, reason) = wire::decode_done(&p).unwrap();
        assert_eq!(status, 103_900, "{op:?} {d:?}: {reason}");
        assert!(reason.contains("descriptor 1"), "{reason}");
        if op == TransferOp::Write {
            assert!(closed(&mut s), "a refused WRITE must close the lane");
        } else {
            // the lane stays in step: a valid READ on it still works
            s.write_all(&xfer(op, &[good])).unwrap();
            let (k, p) = read_frame(&mut s).unwrap();
            assert_eq!((k, wire::decode_done(&p).unwrap().1), (Kind::Done, 0));
            let mut data = [0u8; 16];
            s.read_exact(&mut data).unwrap();
            assert_eq!(&data[..], &g.pattern[GUARD..GUARD + 16]);
        }
    }
    g.check();
}

/// Malformed frames close the connection with a reason; the engine lives on.
#[test]
fn malformed_frames_close_the_connection() {
    let _many = support::alongside();
    let g = guarded();
    let name = g.engine.name().to_owned();
    let header = |kind: u16, len: u32| {
        let mut h = wire::header(Kind::Bye, 0);
        h[6..8].copy_from_slice(&kind.to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h.to_vec()
    };
    let mut wrong_version = wire::header(Kind::Hello, 0).to_vec();
    wrong_version[4] = 9;
    let cases: Vec<(&str, bool, Vec<u8>)> = vec![
        (
            "request before the handshake",
            false,
            xfer(
                TransferOp::Read,
                &[WireDesc {
                    region: 0,
                    offset: 0,
                    len: 1,
                }],
            ),
        ),
        ("unknown version", false, wrong_version),
        ("unknown frame kind", true, header(99, 0)),
        ("length 2^32-1", true, header(Kind::Xfer as u16, u32::MAX)),
        ("garbage", false, b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("handshake twice", true, {
            let mut out = Vec::new();
            Hello {
                role: LaneRole::NewLink,
                instance: 1,
                token: 0,
                name: "x".into(),
                target: String::new(),
                host: None,
                nonce: [0; 32],
            }
            .encode(&mut out);
            out
        }),
        ("descriptor count 2^32-1", true, {
            let mut f = header(Kind::Xfer as u16, 13);
            f.push(1);
            f.extend_from_slice(&1u64.to_le_bytes());
            f.extend_from_slice(&u32::MAX.to_le_bytes());
            f
        }),
        ("truncated descriptors", true, {
            let mut f = header(Kind::Xfer as u16, 13 + 10);
            f.push(1);
            f.extend_from_slice(&1u64.to_le_bytes());
            f.extend_from_slice(&5u32.to_le_bytes());
            f.extend_from_slice(&[0u8; 10]);
            f
        }),
        ("join to an unknown link", false, {
            let mut out = Vec::new();
            Hello {
                role: LaneRole::Join,
                instance: 1,
                token: 12345,
                name: "x".into(),
                target: String::new(),
                host: None,
                nonce: [0; 32],
            }
            .encode(&mut out);
            out
        }),
    ];
    for (what, after_hello, bytes) in cases {
        let mut s = connect_raw(&name);
        if after_hello {
            hello(&mut s);
        }
        s.write_all(&bytes).unwrap();
        // the engine answers with a REFUSE (or just closes), and the connection ends
        let mut saw_refuse = false;
        while let Some((k, p)) = read_frame(&mut s) {
            assert_eq!(k, Kind::Refuse, "{what}");
            let r = wire::Refuse::decode(&p).unwrap();
            assert!(r.status == 503_900 || r.status == 103_902, "{what}: {r:?}");
            saw_refuse = true;
        }
        assert!(saw_refuse, "{what}: no reason given");
    }
    // a frame cut short, then silence: the serving thread gives up after its I/O timeout
    let mut s = connect_raw(&name);
    hello(&mut s);
    s.write_all(
        &xfer(
            TransferOp::Read,
            &[WireDesc {
                region: 0,
                offset: 0,
                len: 1,
            }],
        )[..15],
    )
    .unwrap();
    assert!(closed(&mut s));
    g.check();
}

/// A WRITE that announces more payload than it sends, then disconnects, leaves only bytes of
/// its own valid range changed.
#[test]
fn truncated_write_payload() {
    let _many = support::alongside();
    let g = guarded();
    let mut s = connect_raw(g.engine.name());
    hello(&mut s);
    let mut f = xfer(
        TransferOp::Write,
        &[WireDesc {
            region: g.region.id(),
            offset: 100,
            len: 1000,
        }],
    );
    f.extend_from_slice(&[1u8; 500]);
    s.write_all(&f).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(50));
    g.check();
}

/// Opens a new link as client engine "10.9.9.9" with the given instance id.
/// Sends the HELLO of client "10.9.9.9" (`instance`) for a lane of `role` on link `token`, and
/// reads the server's answer.
fn send_hello(
    s: &mut TcpStream,
    role: LaneRole,
    instance: u64,
    token: u64,
) -> Option<(Kind, Vec<u8>)> {
    let mut out = Vec::new();
    Hello {
        role,
        instance,
        token,
        name: "10.9.9.9".into(),
        target: String::new(),
        host: None,
        nonce: [0; 32],
    }
    .encode(&mut out);
    s.write_all(&out).unwrap();
    read_frame(s)
}

fn hello_as(s: &mut TcpStream, instance: u64) -> wire::Welcome {
    let (k, p) = send_hello(s, LaneRole::NewLink, instance, 0).expect("a WELCOME");
    assert_eq!(k, Kind::Welcome);
    wire::Welcome::decode(&p).unwrap()
}

/// WRITEs `data` at `offset` of `region` on a raw lane; returns the status of its DONE.
fn write_raw(s: &mut TcpStream, region: u32, offset: u64, data: &[u8]) -> u32 {
    s.write_all(&xfer(
        TransferOp::Write,
        &[WireDesc {
            region,
            offset,
            len: data.len() as u64,
        }],
    ))
    .unwrap();
    s.write_all(data).unwrap();
    let (k, p) = read_frame(s).expect("DONE");
    assert_eq!(k, Kind::Done);
    wire::decode_done(&p).unwrap().1
}

/// The region's current bytes, READ by an honest client.
fn contents(g: &Guarded) -> Vec<u8> {
    let (cli, mut buf) = client(LEN);
    {
        let link = cli.connect(g.engine.name()).unwrap();
        let d = TransferDesc::new(
            buf.range(..).unwrap(),
            link.region(g.region.id()).unwrap().range(..).unwrap(),
        );
        link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    }
    let mut v = vec![0u8; LEN];
    buf.read_at(0, &mut v).unwrap();
    v
}

/// Link generations on the serving side: when a client engine (same name, same instance) opens
/// a new link, the rest of a WRITE still arriving on its old link is not applied (the server
/// waits for the old link's requests to stop before welcoming the new one), and the old
/// connection is closed; the new link works.
#[test]
fn a_superseded_link_applies_nothing() {
    let _many = support::alongside();
    let g = guarded();
    let id = g.region.id();
    let mut old = connect_raw(g.engine.name());
    hello_as(&mut old, 91);
    // half of a WRITE of the whole region is on the wire when the new link opens
    let junk = vec![0x5Au8; LEN];
    old.write_all(&xfer(
        TransferOp::Write,
        &[WireDesc {
            region: id,
            offset: 0,
            len: LEN as u64,
        }],
    ))
    .unwrap();
    old.write_all(&junk[..LEN / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut new = connect_raw(g.engine.name());
    hello_as(&mut new, 91);
    let _ = old.write_all(&junk[LEN / 2..]);
    assert!(closed(&mut old), "the superseded connection stayed open");
    // the half that arrived before the new link existed may be in memory (an interrupted
    // WRITE leaves its range unspecified); nothing sent after it was applied
    let now = contents(&g);
    let half = GUARD + LEN / 2;
    assert!(
        now[LEN / 2..] == g.pattern[half..GUARD + LEN],
        "a superseded link's WRITE was applied after the new link opened ({} bytes changed)",
        now[LEN / 2..]
            .iter()
            .zip(&g.pattern[half..])
            .filter(|(a, b)| a != b)
            .count()
    );
    // the new link is served
    let data = Rng::new(5).bytes(100);
    assert_eq!(write_raw(&mut new, id, 10, &data), 0);
    assert_eq!(contents(&g)[10..110], data[..]);
    drop(new);
    g.check();
}

/// A client that floods requests past the window (one outstanding request per connection) and
/// never reads the answers: the server stops reading it, gives up after its I/O timeout and
/// closes that connection only; other clients are served meanwhile, and no memory outside the
/// region is touched.
#[test]
fn a_flood_past_the_window_closes_only_that_connection() {
    let _many = support::alongside();
    let g = guarded();
    let id = g.region.id();
    let mut s = connect_raw(g.engine.name());
    hello(&mut s);
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let req = xfer(
        TransferOp::Read,
        &[WireDesc {
            region: id,
            offset: 0,
            len: LEN as u64,
        }],
    );
    let flood: Vec<u8> = req.iter().copied().cycle().take(req.len() * 4096).collect();
    let t0 = std::time::Instant::now();
    let mut sent = 0usize;
    let mut served_meanwhile = false;
    let end = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the flooding connection was never closed"
        );
        match s.write(&flood[sent % flood.len()..]) {
            Ok(n) => sent += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                // the server stopped reading us; it still serves an honest client
                if !served_meanwhile {
                    assert_eq!(contents(&g), g.pattern[GUARD..GUARD + LEN]);
                    served_meanwhile = true;
                }
            }
            Err(e) => break e,
        }
    };
    let took = t0.elapsed();
    assert!(served_meanwhile, "the flood never filled the window");
    assert!(
        matches!(
            end.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{end:?}"
    );
    // the server's I/O timeout is 2 s
    assert!(took < Duration::from_secs(8), "closed after {took:?}");
    assert!(sent > req.len() * 100, "only {sent} bytes were accepted");
    g.check();
}

/// A device handshake is set up once per link, on the lane that opened it: a second
/// DEVICE_HELLO closes the connection (it would rebuild the communicator under a running link).
/// An engine without a device answers the first with a DEVICE_WELCOME that says why not.
#[test]
fn a_second_device_hello_closes_the_connection() {
    let _many = support::alongside();
    let g = guarded();
    let mut s = connect_raw(g.engine.name());
    hello(&mut s);
    let mut out = Vec::new();
    wire::DeviceInfo {
        status: 0,
        device_id: 0,
        device_ip: "10.0.0.9".into(),
        host_ip: "10.9.9.9".into(),
        timeout_ms: 1000,
        reason: String::new(),
    }
    .encode(Kind::DeviceHello, &mut out);
    s.write_all(&out).unwrap();
    let (k, p) = read_frame(&mut s).expect("an answer");
    assert_eq!(k, Kind::DeviceWelcome);
    let answer = wire::DeviceInfo::decode(&p).unwrap();
    assert_eq!(answer.status, 103_905, "{answer:?}");
    s.write_all(&out).unwrap();
    refused_and_closed(&mut s, "a second DEVICE_HELLO");
    g.check();
}

/// UCXASK: answered with DONE `UNSUPPORTED` by an engine that does not serve over UCX (the lane
/// stays usable); with a payload it is a protocol violation that closes the connection.
#[test]
fn ucx_ask_is_checked() {
    let _many = support::alongside();
    let g = guarded();
    let mut s = connect_raw(g.engine.name());
    hello(&mut s);
    s.write_all(&wire::header(Kind::UcxAsk, 0)).unwrap();
    let (k, p) = read_frame(&mut s).expect("an answer");
    assert_eq!(k, Kind::Done);
    assert_eq!(wire::decode_done(&p).unwrap().1, 103_905);
    // the lane still serves a READ
    s.write_all(&xfer(
        TransferOp::Read,
        &[WireDesc {
            region: g.region.id(),
            offset: 0,
            len: 16,
        }],
    ))
    .unwrap();
    let (k, p) = read_frame(&mut s).expect("DONE");
    assert_eq!(k, Kind::Done);
    assert_eq!(wire::decode_done(&p).unwrap().1, 0);
    let mut data = [0u8; 16];
    s.read_exact(&mut data).unwrap();
    assert_eq!(data[..], g.pattern[GUARD..GUARD + 16]);
    // a UCXASK with a payload closes the connection
    let mut bad = wire::header(Kind::UcxAsk, 4).to_vec();
    bad.extend_from_slice(&[1, 2, 3, 4]);
    s.write_all(&bad).unwrap();
    refused_and_closed(&mut s, "a UCXASK with a payload");
    g.check();
}

/// Opens a lane of link `token` (HELLO with role JOIN) and returns the server's answer.
fn join_as(s: &mut TcpStream, instance: u64, token: u64) -> Option<(Kind, Vec<u8>)> {
    send_hello(s, LaneRole::Join, instance, token)
}

/// A link whose only lane closed is kept for its client to rejoin: a client that cancels a
/// running request closes that request's lane, which may be the link's only one, and its next
/// transfer opens a new lane. The JOIN is welcomed and served whether the server saw the close
/// first or not; a JOIN to a token the server never gave is still refused.
#[test]
fn a_link_whose_only_lane_closed_can_be_rejoined() {
    let _many = support::alongside();
    let g = guarded();
    let id = g.region.id();
    for round in 0..10u64 {
        let instance = 200 + round;
        let mut first = connect_raw(g.engine.name());
        let w = hello_as(&mut first, instance);
        // a WRITE cut in the middle, as a cancel cuts it
        first
            .write_all(&xfer(
                TransferOp::Write,
                &[WireDesc {
                    region: id,
                    offset: 0,
                    len: 64,
                }],
            ))
            .unwrap();
        first.write_all(&[0x11; 16]).unwrap();
        drop(first);
        let mut lane = connect_raw(g.engine.name());
        match join_as(&mut lane, instance, w.token) {
            Some((Kind::Welcome, _)) => {}
            other => panic!("round {round}: the rejoin was answered with {other:?}"),
        }
        let data = Rng::new(round).bytes(32);
        assert_eq!(write_raw(&mut lane, id, 100, &data), 0, "round {round}");
        assert_eq!(contents(&g)[100..132], data[..], "round {round}");
    }
    let mut stranger = connect_raw(g.engine.name());
    match join_as(&mut stranger, 999, 0x5EC2E7) {
        Some((Kind::Refuse, p)) => {
            assert_eq!(wire::Refuse::decode(&p).unwrap().status, 103_902)
        }
        other => panic!("a JOIN to an unknown link was answered with {other:?}"),
    }
    g.check();
}

/// A HELLO, or an AUTH, longer than 4 KiB before authentication is refused from its header: the
/// server answers `REFUSE` and closes without waiting for (or allocating) the payload.
#[test]
fn an_oversized_handshake_is_refused_from_its_header() {
    let _many = support::alongside();
    let (srv, _region) = common::server(4096, Options::default());
    for kind in [Kind::Hello, Kind::Auth] {
        let mut s = connect_raw(srv.name());
        // the header alone: no payload byte follows
        s.write_all(&wire::header(kind, 4097)).unwrap();
        match read_frame(&mut s) {
            Some((Kind::Refuse, _)) => assert!(closed(&mut s), "{kind:?}: open after REFUSE"),
            other => panic!("{kind:?} of 4097 bytes: expected REFUSE, got {other:?}"),
        }
    }
}

/// On an established lane, a request declaring more than its kind's largest honest frame
/// (`wire::max_request`: an XFER of 65,536 descriptors, 1.25 MiB; a NOTIFY, about 2 KiB; a PING,
/// nothing) is refused from its header: `REFUSE` 503900 and closed, without the server waiting
/// for (or buffering) the payload. Before, any kind could declare 8 MiB and the lane held what
/// came of it until `server_io_timeout`.
#[test]
fn an_oversized_request_is_refused_from_its_header() {
    let _many = support::alongside();
    let (srv, _region) = common::server(4096, Options::default());
    for kind in [
        Kind::Xfer,
        Kind::XferBlocks,
        Kind::Notify,
        Kind::Ping,
        Kind::UcxAsk,
    ] {
        let mut s = connect_raw(srv.name());
        hello(&mut s);
        // the header alone: no payload byte follows
        let len = wire::max_request(kind) as usize + 1;
        s.write_all(&wire::header(kind, len)).unwrap();
        assert_eq!(refusal(&mut s), Some(503_900), "{kind:?} of {len} bytes");
    }
}

/// The listener binds only the address in the engine's name: another loopback address of this
/// host (127.0.0.2) is refused on the same port.
#[test]
fn the_listener_binds_only_the_named_address() {
    let _many = support::alongside();
    let (srv, _region) = common::server(4096, Options::default());
    let port = srv.name().rsplit_once(':').unwrap().1.to_owned();
    assert!(TcpStream::connect(format!("127.0.0.1:{port}")).is_ok());
    let other = TcpStream::connect(format!("127.0.0.2:{port}"));
    assert_eq!(
        other.map(drop).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
}

/// One malformed input, one status: a frame that does not decode (bad magic, unknown version,
/// unknown kind), one of a kind its stage does not expect, or one with a malformed payload is
/// refused with `FAILED` (503900) and the connection closed, whatever the stage: as the first
/// frame (with a key and without), as the answer to the key's CHALLENGE, as the answer to the
/// same-host PROVE, and on an established lane. (An answer to the CHALLENGE that was not a
/// well-formed AUTH was refused `PARAM_INVALID`, as a failed authentication, and everywhere
/// else `FAILED`.) A well-formed AUTH with a wrong proof still fails authentication
/// (`PARAM_INVALID`): that is a bad key, not malformed input.
#[test]
fn one_status_for_malformed_input_at_every_stage() {
    let _many = support::alongside();
    let key = b"one status, whatever the stage";
    let (plain, _r1) = common::server(4096, Options::default());
    let (keyed, _r2) = common::server(4096, Options::default().psk(key));
    let raw = |kind: u16, version: Option<u16>, magic: Option<u32>, payload: &[u8]| {
        let mut f = wire::header(Kind::Ping, payload.len()).to_vec();
        f[6..8].copy_from_slice(&kind.to_le_bytes());
        if let Some(v) = version {
            f[4..6].copy_from_slice(&v.to_le_bytes());
        }
        if let Some(m) = magic {
            f[0..4].copy_from_slice(&m.to_le_bytes());
        }
        f.extend_from_slice(payload);
        f
    };
    // (the address dialed: a keyed server refuses any other)
    let hello_frame = |host: Option<wire::HostId>, target: &str| {
        let mut out = Vec::new();
        Hello {
            role: LaneRole::NewLink,
            instance: 4242,
            token: 0,
            name: "10.9.9.8".into(),
            target: target.into(),
            host,
            nonce: [3; 32],
        }
        .encode(&mut out);
        out
    };
    // (what, bytes), each malformed at any stage: the last two are a kind no stage expects from
    // a client and a payload no kind of the stage accepts
    let inputs = |stage_kind: Kind| -> Vec<(String, Vec<u8>)> {
        vec![
            (
                "bad magic".into(),
                raw(stage_kind as u16, None, Some(0x5859_5A5A), &[]),
            ),
            (
                "unknown version".into(),
                raw(stage_kind as u16, Some(99), None, &[]),
            ),
            ("unknown kind".into(), raw(999, None, None, &[])),
            (
                "unexpected kind".into(),
                raw(Kind::Welcome as u16, None, None, &[1, 2, 3]),
            ),
            (
                format!("malformed {stage_kind:?}"),
                raw(stage_kind as u16, None, None, &[0xFF; 3]),
            ),
        ]
    };
    let mut seen = Vec::new();
    for (what, bytes) in inputs(Kind::Hello) {
        for (server, name) in [(&plain, "no key"), (&keyed, "key")] {
            let mut s = connect_raw(server.name());
            s.write_all(&bytes).unwrap();
            seen.push((format!("first frame ({name}): {what}"), refusal(&mut s)));
        }
    }
    for (what, bytes) in inputs(Kind::Auth) {
        let mut s = connect_raw(keyed.name());
        s.write_all(&hello_frame(None, keyed.name())).unwrap();
        let (k, _) = read_frame(&mut s).expect("a CHALLENGE");
        assert_eq!(k, Kind::Challenge);
        s.write_all(&bytes).unwrap();
        seen.push((format!("answer to CHALLENGE: {what}"), refusal(&mut s)));
    }
    if let Some(me) = wire::HostId::current() {
        for (what, bytes) in inputs(Kind::Proof) {
            let mut s = connect_raw(plain.name());
            s.write_all(&hello_frame(Some(me), plain.name())).unwrap();
            match read_frame(&mut s) {
                Some((Kind::Prove, _)) => {}
                other => {
                    eprintln!("no PROVE here ({other:?}): the same-host stage is not checked");
                    break;
                }
            }
            s.write_all(&bytes).unwrap();
            seen.push((format!("answer to PROVE: {what}"), refusal(&mut s)));
        }
    }
    for (what, bytes) in inputs(Kind::Xfer) {
        let mut s = connect_raw(plain.name());
        hello(&mut s);
        s.write_all(&bytes).unwrap();
        seen.push((format!("on a lane: {what}"), refusal(&mut s)));
    }
    // frames whose kinds carry no payload, with one (a BYE's was closed without a REFUSE)
    for kind in [Kind::Bye, Kind::Ping] {
        let mut s = connect_raw(plain.name());
        hello(&mut s);
        s.write_all(&raw(kind as u16, None, None, &[1])).unwrap();
        seen.push((
            format!("on a lane: {kind:?} with a payload"),
            refusal(&mut s),
        ));
    }
    let odd: Vec<_> = seen.iter().filter(|(_, st)| *st != Some(503_900)).collect();
    assert!(
        odd.is_empty(),
        "not REFUSE 503900: {odd:?} (of {} cases)",
        seen.len()
    );
    // a well-formed AUTH with a wrong proof: a failed authentication
    let mut s = connect_raw(keyed.name());
    s.write_all(&hello_frame(None, keyed.name())).unwrap();
    assert_eq!(read_frame(&mut s).map(|f| f.0), Some(Kind::Challenge));
    let mut auth = Vec::new();
    wire::encode_auth(&mut auth, Kind::Auth, &[&[0u8; 32]]);
    s.write_all(&auth).unwrap();
    assert_eq!(refusal(&mut s), Some(103_900), "a wrong proof");
}

/// The status of the REFUSE the server answers with before it closes the connection.
fn refusal(s: &mut TcpStream) -> Option<u32> {
    let got = match read_frame(s) {
        Some((Kind::Refuse, p)) => Some(wire::Refuse::decode(&p).unwrap().status),
        _ => None,
    };
    assert!(closed(s), "open after the refusal");
    got
}

/// XFER_BLOCKS from a raw socket: a largest index whose block leaves the region (also through
/// an overflowing index x stride, or a base past the end), an unknown region and a forbidden
/// WRITE are refused with PARAM_INVALID before any byte moves (READ refusals keep the lane,
/// WRITE refusals close it); a malformed layout (zero block, stride below the block, an index
/// width of 3, no index) closes the connection. The guards stay intact.
#[test]
fn bad_block_batches_are_refused() {
    let _many = support::alongside();
    let g = guarded();
    let id = g.region.id();
    let frame = |op: TransferOp, b: wire::WireBlocks, idx: &[u64]| {
        let mut out = Vec::new();
        wire::encode_xfer_blocks(&mut out, op, 1, &b, hixl::BlockIndices::U64(idx));
        out
    };
    let blocks = |region, offset, block, stride| wire::WireBlocks {
        region,
        offset,
        block,
        stride,
    };
    let per = (LEN / 1024) as u64; // blocks of 1 KiB in the region
    let bad: Vec<(TransferOp, wire::WireBlocks, Vec<u64>)> = vec![
        (TransferOp::Read, blocks(id, 0, 1024, 1024), vec![0, per, 1]),
        (TransferOp::Write, blocks(id, 0, 1024, 1024), vec![0, per]),
        (TransferOp::Read, blocks(id, 1, 1024, 1024), vec![per - 1]),
        (
            TransferOp::Read,
            blocks(id, 0, 1024, 4096),
            vec![u64::MAX / 4096 + 1],
        ),
        (TransferOp::Read, blocks(id, u64::MAX - 10, 8, 8), vec![0]),
        (TransferOp::Read, blocks(999, 0, 8, 8), vec![0]),
        (TransferOp::Write, blocks(g.ro.id(), 0, 8, 8), vec![0]),
    ];
    for (op, b, idx) in bad {
        let mut s = connect_raw(g.engine.name());
        hello(&mut s);
        let mut f = frame(op, b, &idx);
        if op == TransferOp::Write {
            f.extend_from_slice(&[0xEE; 8]); // less than the batch: nothing may land
        }
        s.write_all(&f).unwrap();
        let (k, p) = read_frame(&mut s).expect("a DONE");
        assert_eq!(k, Kind::Done);
        let (_, status, reason) = wire::decode_done(&p).unwrap();
        assert_eq!(status, 103_900, "{op:?} {b:?} {idx:?}: {reason}");
        assert!(reason.contains("block batch"), "{reason}");
        if op == TransferOp::Write {
            assert!(closed(&mut s), "a refused WRITE must close the lane");
        } else {
            // the lane stays in step: a valid block READ on it returns the blocks asked for
            let ok = blocks(id, 16, 1024, 2048);
            s.write_all(&frame(op, ok, &[3, 0])).unwrap();
            let (k, p) = read_frame(&mut s).unwrap();
            assert_eq!((k, wire::decode_done(&p).unwrap().1), (Kind::Done, 0));
            let mut data = vec![0u8; 2048];
            s.read_exact(&mut data).unwrap();
            let at = |i: usize| GUARD + 16 + i * 2048;
            assert_eq!(&data[..1024], &g.pattern[at(3)..at(3) + 1024]);
            assert_eq!(&data[1024..], &g.pattern[at(0)..at(0) + 1024]);
        }
    }
    // malformed layouts: a protocol violation, the connection closes
    let raw = |block: u64, stride: u64, width: u8, count: u32| {
        let mut p = vec![0u8]; // READ
        p.extend_from_slice(&1u64.to_le_bytes());
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&block.to_le_bytes());
        p.extend_from_slice(&stride.to_le_bytes());
        p.push(width);
        p.extend_from_slice(&count.to_le_bytes());
        p.extend(std::iter::repeat_n(
            0u8,
            count as usize * width.max(4) as usize,
        ));
        let mut f = wire::header(Kind::XferBlocks, p.len()).to_vec();
        f.extend_from_slice(&p);
        f
    };
    for (what, f) in [
        ("zero block", raw(0, 8, 4, 1)),
        ("stride below the block", raw(16, 8, 4, 1)),
        ("index width 3", raw(8, 8, 3, 1)),
        ("no index", raw(8, 8, 4, 0)),
    ] {
        let mut s = connect_raw(g.engine.name());
        hello(&mut s);
        s.write_all(&f).unwrap();
        refused_and_closed(&mut s, what);
    }
    g.check();
}

/// A WRITE still arriving when its server stops serving gets `finalize_timeout`, and then its
/// connection is cut (docs/guarantees.md, TCP): `deactivate` returns after the grace period,
/// not before it and not at the request's pace; nothing of the WRITE lands once it returned,
/// while the client keeps sending until its socket fails. A raw client announces 1 MiB and
/// sends a byte every 10 ms.
#[test]
fn a_write_trickling_past_finalize_timeout_is_cut() {
    let _many = support::alongside();
    let len = 1 << 20;
    let grace = Duration::from_millis(300);
    let mut mem = vec![0u8; len].into_boxed_slice();
    let p = mem.as_mut_ptr();
    let e = Hixl::initialize_ephemeral(
        "127.0.0.1",
        Options::default()
            .finalize_timeout(grace)
            .server_io_timeout(Duration::from_secs(30)),
    )
    .unwrap()
    .into_registered();
    // SAFETY: `mem` outlives the engine (finalized below, before `mem` is dropped); the test
    // reads it only through volatile reads while the engine may serve it.
    let region = unsafe {
        e.register_raw(
            MemDesc {
                addr: p as usize,
                len,
            },
            MemType::Host,
        )
    }
    .unwrap();
    let e = e.activate().unwrap();
    let mut s = connect_raw(e.name());
    hello(&mut s);
    let announce = xfer(
        TransferOp::Write,
        &[WireDesc {
            region: region.id(),
            offset: 0,
            len: len as u64,
        }],
    );
    s.write_all(&announce).unwrap();
    let trickler = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < 3000 && s.write_all(&[0x11]).is_ok() {
            sent += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        sent
    });
    // SAFETY (both closures): reads of live bytes of `mem`, volatile: the serving engine writing
    // them is what is being looked for.
    let byte = |i: usize| unsafe { std::ptr::read_volatile(p.add(i)) };
    let t0 = Instant::now();
    while byte(0) != 0x11 {
        assert!(t0.elapsed() < T, "the WRITE never started landing");
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    let e = e.deactivate();
    let took = t0.elapsed();
    assert!(
        took >= grace && took < grace + Duration::from_millis(1500),
        "deactivate with a WRITE in flight took {took:?} (grace {grace:?})"
    );
    // SAFETY: `p` points to `len` bytes of `mem`; the engine no longer serves them (the claim
    // under test: a write by it would show below).
    unsafe { std::ptr::write_bytes(p, 0xA5, len) };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        let changed = (0..len).find(|&i| byte(i) != 0xA5);
        assert_eq!(changed, None, "a byte landed {:?} after", t0.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = trickler.join().unwrap();
    assert!(sent < 3000, "the connection was never cut");
    let _ = e.deregister(region).unwrap();
    drop(e);
    drop(mem);
}

/// A compat engine's live deregistration (`DeregisterMem` while serving) waits for the requests
/// applied to the region for `finalize_timeout`, then cuts their lanes: a raw client that asks
/// for a READ of the whole region and never reads the reply holds it up about that long, not
/// for the request's `server_io_timeout` (20 s here), under the compat engine's lock. Before,
/// it waited the whole 20 s (a review measured 3.7 s with 4 s).
#[test]
fn a_reader_that_never_reads_holds_a_deregistration_only_for_the_grace() {
    let _many = support::alongside();
    let e = hixl::compat::Hixl::new();
    e.initialize(
        "127.0.0.1:0",
        [
            ("hixl.ServerIoTimeoutMs", "20000"),
            ("hixl.FinalizeTimeoutMs", "300"),
            ("hixl.SameHost", "off"),
        ],
    )
    .unwrap();
    let mut mem = vec![7u8; 32 << 20];
    let desc = hixl::compat::MemDesc {
        addr: mem.as_mut_ptr() as usize,
        len: mem.len(),
        local_only: false,
    };
    // SAFETY: `mem` outlives its registration (deregistered below, before it drops).
    let h = unsafe { e.register_mem(desc, MemType::Host) }.unwrap();
    let mut s = connect_raw(&e.local_engine().unwrap());
    let w = hello(&mut s);
    let r = w
        .table
        .iter()
        .find(|r| r.addr == desc.addr as u64)
        .expect("the region");
    let whole = WireDesc {
        region: r.id,
        offset: 0,
        len: r.len,
    };
    s.write_all(&xfer(TransferOp::Read, &[whole])).unwrap();
    // the reply has begun: the DONE comes first (then the client reads no more)
    let (k, _) = read_frame(&mut s).expect("the DONE");
    assert_eq!(k, Kind::Done);
    let t0 = Instant::now();
    e.deregister_mem(h).unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "deregister_mem took {took:?} with a grace of 300 ms"
    );
    // the lane was cut: the rest of the reply never comes whole
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!((rest.len() as u64) < r.len, "the whole region was sent");
    e.finalize();
    drop(mem);
}

/// A server replaces a client's link with a new one of the same name and instance id (a
/// reconnecting client). The id a client's HELLOs name is not the instance its own server's
/// WELCOMEs send: a peer that connected to engine A's server learns nothing with which to
/// pose as A to another server and cut A's links there. Before, both were one id: the raw
/// HELLO below, naming A and A's server instance, replaced A's link, whose next READ failed
/// `NOT_CONNECTED`.
#[test]
fn a_peer_of_a_server_cannot_pose_as_it_to_cut_its_links() {
    let _many = support::alongside();
    let (s, mut region) = common::server(4096, Options::default());
    let data = Rng::new(31).bytes(4096);
    region.write_at(0, &data).unwrap();
    // A serves too, and links to S
    let (a, mut buf) = common::server(4096, Options::default().same_host(hixl::SameHost::Forbid));
    let link = a.connect(s.name()).unwrap();
    let remote = link.regions().next().unwrap().range(0..4096).unwrap();
    // E learns A's server instance from A's WELCOME, then says HELLO to S as A
    let mut to_a = connect_raw(a.name());
    let seen = hello(&mut to_a);
    let mut to_s = connect_raw(s.name());
    let mut out = Vec::new();
    Hello {
        role: LaneRole::NewLink,
        instance: seen.instance,
        token: 0,
        name: a.name().into(),
        target: s.name().into(),
        host: None,
        nonce: [9; 32],
    }
    .encode(&mut out);
    to_s.write_all(&out).unwrap();
    let (k, _) = read_frame(&mut to_s).expect("an answer");
    assert_eq!(k, Kind::Welcome, "S links E as a new client");
    // A's link is untouched: its data comes
    let d = TransferDesc::new(buf.range(0..4096).unwrap(), remote);
    link.transfer_sync(TransferOp::Read, &[d], T)
        .expect("A's link after E posed as A");
    let mut got = vec![0u8; 4096];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, data);
}

/// A client that reconnects over its own link, whose READ reply it never read (parked),
/// replaces the link at once: the old link's lane ends in the poller when its socket is shut
/// down, so the new link's opening, which waits until the old link's requests have stopped,
/// does not wait for a worker. With one serving thread that worker was the one waiting: the
/// new link was welcomed only at the parked request's `server_io_timeout` (3.9 s of 4 s in a
/// review), and nothing else was served meanwhile.
#[test]
fn a_reconnect_over_a_parked_request_is_welcomed_at_once() {
    let _many = support::alongside();
    // (32 MiB: more than loopback's socket buffers take, so the reply stalls)
    let (srv, _r) = common::server(
        32 << 20,
        Options::default()
            .max_server_threads(1)
            .server_io_timeout(Duration::from_secs(20)),
    );
    let mut first = connect_raw(srv.name());
    let w = hello_as(&mut first, 4711);
    let r = &w.table[0];
    let whole = WireDesc {
        region: r.id,
        offset: 0,
        len: r.len,
    };
    first.write_all(&xfer(TransferOp::Read, &[whole])).unwrap();
    let (k, _) = read_frame(&mut first).expect("the DONE");
    assert_eq!(k, Kind::Done);
    // (the reply stalls on the unread socket: the request parks; a NEW_LINK of the same client
    // name and instance replaces the link)
    let t0 = Instant::now();
    let mut again = connect_raw(srv.name());
    let (k, _) = send_hello(&mut again, LaneRole::NewLink, 4711, 0).expect("an answer");
    let took = t0.elapsed();
    assert_eq!(k, Kind::Welcome);
    assert!(
        took < Duration::from_secs(3),
        "the new link was welcomed after {took:?} (io timeout 20 s)"
    );
}
