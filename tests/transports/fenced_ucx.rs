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
