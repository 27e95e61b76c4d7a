//! Every same-host one-sided path is fenced, UCX included, whatever the client says about
//! itself: a client on the server's host that does not name its process (`SameHost::Forbid`)
//! gets no UCX keys (UCX could reach the server's memory through shared memory, straight from the
//! client's process, where `deactivate` could not revoke it). A client that names its process
//! gets UCX inside the server's fence, which `deactivate` revokes.

use crate::common;

use std::time::Duration;

use common::{Peer, ucx_available};
use hixl::{Error, Options, SameHost, Status, TransferDesc, TransferOp, TransportKind, Ucx};

const KEY: &str = "hixl-fenced-ucx-key-01";
const T: Duration = Duration::from_secs(20);

fn client(same_host: SameHost, ucx: Ucx) -> (hixl::Hixl<hixl::Connected>, hixl::Region) {
    common::client_with(
        1 << 20,
        Options::default().psk(KEY).ucx(ucx).same_host(same_host),
    )
}

/// A `hixl-peer` serving 1 MiB of user memory over UCX (required), seeded with `seed`.
fn ucx_peer(seed: u64) -> Peer {
    Peer::spawn_in(
        &[],
        "127.0.0.1",
        1 << 20,
        seed,
        "user",
        &["--psk", KEY, "--ucx", "require"],
    )
}

/// Another process serves over UCX on this host; a client that hides its process is refused
/// UCX (`TransportUnavailable`, `UNSUPPORTED`, saying why) when it requires it, and moves its
/// data over TCP when UCX is only preferred.
#[test]
fn an_unnamed_client_on_this_host_gets_no_ucx() {
    let Some(_devices) = ucx_available("an_unnamed_client_on_this_host_gets_no_ucx") else {
        return;
    };
    let peer = ucx_peer(71);
    let (cli, _buf) = client(SameHost::Forbid, Ucx::Require);
    let e = cli
        .connect(&peer.name)
        .expect_err("an unfenced same-host UCX link");
    match &e {
        Error::TransportUnavailable {
            transport: "ucx",
            why,
            ..
        } => assert!(why.contains("inside its fence"), "{e:?}"),
        other => panic!("expected TransportUnavailable, got {other:?}"),
    }
    assert_eq!(e.status(), Status::UNSUPPORTED);
    assert_eq!(e.status().code(), 103_905);
    drop(cli);

    let (cli, mut buf) = client(SameHost::Forbid, Ucx::Auto);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.transport(), TransportKind::Tcp);
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    link.disconnect(T).unwrap();
    let cli = cli.deactivate();
    let mut got = vec![0u8; 4096];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, common::Rng::new(71).bytes(4096));
    drop(cli);
    peer.quit();
}

/// A client that names its process gets UCX, inside the server's fence: once the server (another
/// process) has finalized, which revokes the fence, the client's next UCX batch is refused as
/// revoked (`NOT_CONNECTED`), before UCX is asked to move a byte.
#[test]
fn a_named_client_runs_ucx_inside_the_fence() {
    let Some(_devices) = ucx_available("a_named_client_runs_ucx_inside_the_fence") else {
        return;
    };
    let peer = ucx_peer(72);
    let (cli, buf) = client(SameHost::Auto, Ucx::Require);
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.transport(), TransportKind::Ucx);
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Write, &[d], T).unwrap();
    // finalizing revokes every fence the server handed out, before the process exits
    peer.quit();
    let e = link
        .transfer_sync(TransferOp::Write, &[d], T)
        .expect_err("revoked");
    assert_eq!(e.status().code(), 103_902, "{e:?}");
    assert!(e.to_string().contains("revoked"), "{e}");
    drop(link);
    drop(cli);
}

/// The first IPv4 address of this host's interfaces that is up and not loopback.
fn host_ipv4() -> Option<std::net::Ipv4Addr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list this function frees below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        let lo = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        // SAFETY: a non-null ifa_addr whose family is AF_INET is a sockaddr_in.
        let v4 = (!ifa.ifa_addr.is_null()
            && unsafe { (*ifa.ifa_addr).sa_family } == libc::AF_INET as libc::sa_family_t)
            .then(|| unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() })
            .map(|a| std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)));
        if let (true, false, Some(ip)) = (up, lo, v4) {
            found = Some(ip);
            break;
        }
        at = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once, after its last use.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// The same refusal off loopback (docs/guarantees.md: "loopback, the address it reached, or
/// any of the host's interface addresses"): the server and the client on the first
/// non-loopback IPv4 of this host (the client connects from the address it reached, which is
/// also one of the host's interface addresses; `src/process/host.rs` checks either).
#[test]
fn an_unnamed_client_on_an_interface_address_gets_no_ucx() {
    let Some(_devices) = ucx_available("an_unnamed_client_on_an_interface_address_gets_no_ucx")
    else {
        return;
    };
    let Some(ip) = host_ipv4() else {
        eprintln!(
            "an_unnamed_client_on_an_interface_address_gets_no_ucx: skipped: no interface \
             address but loopback here"
        );
        return;
    };
    let ip = ip.to_string();
    let peer = Peer::spawn_in(
        &[],
        &ip,
        1 << 20,
        73,
        "user",
        &["--psk", KEY, "--ucx", "require"],
    );
    let opts = |ucx| {
        Options::default()
            .psk(KEY)
            .ucx(ucx)
            .same_host(SameHost::Forbid)
    };
    let cli = hixl::Hixl::initialize(&ip, opts(Ucx::Require))
        .unwrap()
        .into_registered()
        .activate()
        .unwrap();
    let e = cli
        .connect(&peer.name)
        .expect_err("an unfenced same-host UCX link on an interface address");
    assert!(
        matches!(&e, Error::TransportUnavailable { transport: "ucx", why, .. }
            if why.contains("inside its fence")),
        "{e:?}"
    );
    assert_eq!(e.status().code(), 103_905);
    drop(cli);
    let (cli, mut buf) = hixl::Hixl::initialize(&ip, opts(Ucx::Auto))
        .unwrap()
        .register(hixl::HostBuffer::new(4096).unwrap())
        .unwrap();
    let cli = cli.activate().unwrap();
    let link = cli.connect(&peer.name).unwrap();
    assert_eq!(link.transport(), TransportKind::Tcp);
    let d = TransferDesc::new(
        buf.range(0..4096).unwrap(),
        link.remote(peer.addr, 4096).unwrap(),
    );
    link.transfer_sync(TransferOp::Read, &[d], T).unwrap();
    link.disconnect(T).unwrap();
    let cli = cli.deactivate();
    let mut got = vec![0u8; 4096];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, common::Rng::new(73).bytes(4096));
    drop(cli);
    peer.quit();
}
