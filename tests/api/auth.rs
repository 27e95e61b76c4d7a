//! Peer authentication with a pre-shared key (HMAC-SHA256 challenge-response).

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Rng, client_with, read_frame, server};
use hixl::wire::{self, Hello, Kind, LaneRole};
use hixl::{Error, Options, SameHost, TransferDesc, TransferOp};

const T: Duration = Duration::from_secs(10);
const KEY: &str = "correct horse battery staple";

fn opts() -> Options {
    Options::default().same_host(SameHost::Forbid)
}

/// Both sides with the same key: connect, several lanes at once, data intact.
#[test]
fn same_key_connects() {
    let (srv, mut cache) = server(4 << 20, Options::default().psk(KEY));
    let data = Rng::new(1).bytes(4 << 20);
    cache.write_at(0, &data).unwrap();
    let (cli, buf) = client_with(4 << 20, opts().psk(KEY));
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    // four threads at once: new lanes authenticate too
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (link, buf) = (&link, &buf);
            s.spawn(move || {
                let (a, b) = (t << 20, (t + 1) << 20);
                let d = TransferDesc::new(
                    buf.range(a..b).unwrap(),
                    remote.range(a as u64..b as u64).unwrap(),
                );
                for _ in 0..20 {
                    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
                }
            });
        }
    });
    drop(link);
    let mut b = buf;
    let mut got = vec![0u8; 4 << 20];
    b.read_at(0, &mut got).unwrap();
    assert!(got == data);
}

/// A key on one side only, or different keys: a typed error on the client, and the server
/// keeps serving the clients that do authenticate.
#[test]
fn mismatches_are_refused() {
    let (srv, _cache) = server(4096, Options::default().psk(KEY));
    for (opts, why) in [
        (opts(), "none is configured"),
        (opts().psk("another key, 28 bytes long.."), "does not know"),
    ] {
        let (cli, _b) = client_with(4096, opts);
        let e = cli.connect(srv.name()).unwrap_err();
        match &e {
            Error::AuthFailed { why: w, .. } => assert!(w.contains(why), "{w}"),
            e => panic!("{e:?}"),
        }
        assert_eq!(e.status().code(), 103_900);
    }
    // a client with a key refuses a server without one
    let (open, _c) = server(4096, Options::default());
    let (cli, _b) = client_with(4096, opts().psk(KEY));
    let e = cli.connect(open.name()).unwrap_err();
    assert!(
        matches!(e, Error::AuthFailed { why, .. } if why.contains("did not authenticate")),
        "{e:?}"
    );
    // the keyed server still serves a keyed client
    let (cli, _b) = client_with(4096, opts().psk(KEY));
    assert!(cli.connect(srv.name()).is_ok());
    // a short key is refused at initialize
    let e = hixl::Hixl::initialize("127.0.0.1", Options::default().psk("short")).unwrap_err();
    assert!(matches!(e, Error::InvalidOption { ref key, .. } if key == "psk"));
    assert!(
        !format!("{:?}", Options::default().psk(KEY)).contains("horse"),
        "the key shows in Debug"
    );
}

/// A raw client that answers the challenge with a forged proof is refused (`PARAM_INVALID`, a
/// failed authentication); one that skips the answer and sends a request is refused too
/// (`FAILED`, a protocol violation, as at any stage); the key never appears on the wire.
#[test]
fn forged_answers_are_refused() {
    let (srv, _cache) = server(4096, Options::default().psk(KEY));
    for forge in [true, false] {
        let mut s = TcpStream::connect(srv.name()).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut out = Vec::new();
        Hello {
            role: LaneRole::NewLink,
            instance: 1,
            token: 0,
            name: "10.1.1.1".into(),
            target: srv.name().into(),
            host: None,
            nonce: [7; 32],
        }
        .encode(&mut out);
        s.write_all(&out).unwrap();
        let (kind, p) = read_frame(&mut s).unwrap();
        assert_eq!(kind, Kind::Challenge);
        assert!(!p.windows(KEY.len()).any(|w| w == KEY.as_bytes()));
        if forge {
            wire::encode_auth(&mut out, Kind::Auth, &[&[0x5a; 32]]);
        } else {
            wire::encode_xfer(
                &mut out,
                TransferOp::Read,
                1,
                [wire::WireDesc {
                    region: 0,
                    offset: 0,
                    len: 8,
                }]
                .into_iter(),
            );
        }
        s.write_all(&out).unwrap();
        let (kind, p) = read_frame(&mut s).unwrap();
        assert_eq!(kind, Kind::Refuse, "forge={forge}");
        let r = wire::Refuse::decode(&p).unwrap();
        // a wrong proof fails authentication; a frame that is not an AUTH breaks the protocol,
        // and gets what it gets at every other stage (tests/serving/hostile.rs)
        let want = if forge { 103_900 } else { 503_900 };
        assert_eq!(r.status, want, "forge={forge}");
        let mut rest = [0u8; 1];
        assert!(
            matches!(s.read(&mut rest), Ok(0) | Err(_)),
            "the connection stays open"
        );
    }
}
