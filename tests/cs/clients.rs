//! The client's rules (`HixlCSClientCreate`, `Connect`, `GetRemoteMem`, `RegMem`, `UnregMem`,
//! `Destroy`) with their exact statuses, the server's tagged list as a client gets it, and
//! memory the server registers after the client connected.

use std::net::Ipv4Addr;
use std::time::Duration;

use hixl::cs::{BUILTIN_TAG, Client, ClientDesc, Endpoint, Mem, MemHandle, OpDesc};
use hixl::{MemType, Status, TransferOp};

use super::support::{Buf, client_with, connected, listening, local, serve, status};
use crate::common::Rng;

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn create_refuses_bad_input() {
    let desc = |port: u16, local| ClientDesc {
        server_ip: Ipv4Addr::LOCALHOST.into(),
        server_port: port,
        local_endpoint: local,
        remote_endpoint: Endpoint::roce(Ipv4Addr::LOCALHOST.into()),
    };
    let host = Endpoint::roce(Ipv4Addr::LOCALHOST.into());
    assert_eq!(
        status(Client::new(&desc(0, host), None)),
        Status::PARAM_INVALID,
        "port 0"
    );
    assert_eq!(
        status(Client::new(&desc(1, host.at(2)), None)),
        Status::PARAM_INVALID,
        "a location neither device nor host"
    );
    for bad in [
        "{\"comm_resource_config.qos\": 8}",
        "{\"comm_resource_config.qos\": 7",
        "{\"hixl.NoSuchOption\": 1}",
        "{\"hixl.SameHost\": [1]}",
    ] {
        assert_eq!(
            status(Client::new(&desc(1, host), Some(bad))),
            Status::PARAM_INVALID,
            "{bad}"
        );
    }
    // a server's key is not read by a client; nothing is connected at Create
    let c = Client::new(
        &desc(1, host),
        Some("{\"comm_resource_config.listen_port\": 0}"),
    )
    .unwrap();
    c.close();
}

#[test]
fn connect_then_the_tagged_list_and_registrations() {
    let (mut kv0, mut kv1) = (Buf::new(1 << 16), Buf::new(1 << 12));
    let (server, port) = listening(|s| {
        serve(s, "kv0", &mut kv0);
    });
    let h1 = serve(&server, "kv1", &mut kv1);
    let c = client_with(port, Ipv4Addr::LOCALHOST, None);
    assert_eq!(
        status(c.remote_mems(SECOND)),
        Status::FAILED,
        "not connected"
    );
    assert_eq!(status(c.connect(Duration::ZERO)), Status::TIMEOUT);
    c.connect(5 * SECOND).unwrap();
    assert_eq!(status(c.connect(5 * SECOND)), Status::FAILED, "twice");
    assert_eq!(status(c.remote_mems(Duration::ZERO)), Status::TIMEOUT);
    let list = c.remote_mems(5 * SECOND).unwrap();
    let tags: Vec<&[u8]> = list.iter().map(|m| m.tag.as_slice()).collect();
    assert_eq!(tags, [BUILTIN_TAG.as_bytes(), b"kv0", b"kv1"]);
    assert!(list.iter().all(|m| m.typ == MemType::Host));
    assert_eq!(
        (list[1].addr, list[1].size),
        (kv0.addr() as u64, kv0.len() as u64)
    );
    assert_eq!(
        (list[2].addr, list[2].size),
        (kv1.addr() as u64, kv1.len() as u64)
    );
    // the server's own list: GET works, PUT does not (read-only to clients)
    let mut mine = Buf::new(1 << 20);
    let h = local(&c, &mut mine);
    let builtin = OpDesc {
        remote_addr: list[0].addr,
        local_addr: mine.addr(),
        len: 64,
    };
    c.batch_sync(TransferOp::Read, &[builtin], 5 * SECOND)
        .unwrap();
    assert_eq!(
        status(c.batch_sync(TransferOp::Write, &[builtin], 5 * SECOND)),
        Status::PARAM_INVALID
    );

    // client registrations: identical ones share a registration; partial overlaps are refused
    let base = mine.addr();
    let mem = |addr, size| Mem {
        typ: MemType::Host,
        addr,
        size,
    };
    // SAFETY (each `register`): `mine` outlives the client.
    assert_eq!(
        status(unsafe { c.register(mem(base, 0)) }),
        Status::PARAM_INVALID
    );
    let again = unsafe { c.register(mem(base, mine.len())) }.unwrap();
    for (addr, size) in [(base + 4096, mine.len()), (base + 4096, 4096)] {
        let r = unsafe { c.register(mem(addr, size)) };
        assert_eq!(status(r), Status::PARAM_INVALID, "{addr:#x}+{size}");
    }
    // unregistration counts: the range stays until its last handle goes
    let get = OpDesc {
        remote_addr: kv1.addr() as u64,
        local_addr: base,
        len: 8,
    };
    c.deregister(again).unwrap();
    assert_eq!(status(c.deregister(again)), Status::PARAM_INVALID);
    c.batch_sync(TransferOp::Read, &[get], 5 * SECOND).unwrap();
    c.deregister(h).unwrap();
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[get], 5 * SECOND)),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(c.deregister(MemHandle::from_raw(0x4242))),
        Status::PARAM_INVALID
    );
    // a server handle is not a client's
    assert_eq!(status(c.deregister(h1)), Status::PARAM_INVALID);

    // the server's kv1 leaves its list at the next fetch
    server.deregister(h1).unwrap();
    let list = c.remote_mems(5 * SECOND).unwrap();
    assert_eq!(list.len(), 2);
    c.close();
    server.close();
}

#[test]
fn an_endpoint_the_server_lacks_is_refused() {
    let (server, port) = listening(|_| {});
    let c = client_with(port, Ipv4Addr::new(127, 0, 0, 2), None);
    assert_eq!(status(c.connect(5 * SECOND)), Status::PARAM_INVALID);
    assert_eq!(
        status(c.remote_mems(SECOND)),
        Status::FAILED,
        "not connected"
    );
    server.close();
}

/// Memory the server registers after the client connected is not in the link's table: a batch
/// to it is refused until `remote_mems` imports it (reconnecting); a server that goes fails
/// the next batch, which latches the client.
#[test]
fn memory_registered_after_connect_is_reached_after_remote_mems() {
    let (server, port) = listening(|_| {});
    let c = connected(port);
    assert_eq!(
        c.remote_mems(5 * SECOND).unwrap().len(),
        1,
        "the built-in region"
    );
    let (mut late, mut mine) = (Buf::new(4096), Buf::new(4096));
    serve(&server, "late", &mut late);
    local(&c, &mut mine);
    let data = Rng::new(44).bytes(4096);
    mine.write(0, &data);
    let d = OpDesc {
        remote_addr: late.addr() as u64,
        local_addr: mine.addr(),
        len: 4096,
    };
    assert_eq!(
        status(c.batch_sync(TransferOp::Write, &[d], 5 * SECOND)),
        Status::PARAM_INVALID,
        "not imported yet"
    );
    let list = c.remote_mems(5 * SECOND).unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[1].tag, b"late");
    assert_eq!((list[1].addr, list[1].size), (late.addr() as u64, 4096));
    c.batch_sync(TransferOp::Write, &[d], 5 * SECOND).unwrap();
    assert_eq!(late.read(0, 4096), data);
    // the server goes: the next batch fails and latches
    server.close();
    let s = status(c.batch_sync(TransferOp::Write, &[d], 2 * SECOND));
    assert!(s == Status::FAILED || s == Status::TIMEOUT, "{s:?}");
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[d], 2 * SECOND)),
        Status::FAILED
    );
}

/// Memory the server deregisters and registers again (the same range: a new region of its
/// engine) is reached after `remote_mems`, which sees by the list's region ids that the link's
/// table has the old region and reconnects; before it, a batch is refused by the server (the
/// old region is gone: PARAM_INVALID, no latch).
#[test]
fn memory_registered_again_is_reached_after_remote_mems() {
    let mut kv = Buf::new(4096);
    let (server, port) = listening(|_| {});
    let h = serve(&server, "kv", &mut kv);
    let c = connected(port);
    assert_eq!(c.remote_mems(5 * SECOND).unwrap().len(), 2);
    let mut mine = Buf::new(4096);
    local(&c, &mut mine);
    let d = OpDesc {
        remote_addr: kv.addr() as u64,
        local_addr: mine.addr(),
        len: 4096,
    };
    mine.write(0, &[1; 4096]);
    c.batch_sync(TransferOp::Write, &[d], 5 * SECOND).unwrap();
    assert_eq!(kv.read(0, 4096), [1; 4096]);
    server.deregister(h).unwrap();
    serve(&server, "kv", &mut kv);
    // (a GET: a PUT the server refuses closes its lane, and with it this link)
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[d], 5 * SECOND)),
        Status::PARAM_INVALID,
        "the link's region is gone"
    );
    let list = c.remote_mems(5 * SECOND).unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(
        (list[1].tag.as_slice(), list[1].addr),
        (&b"kv"[..], kv.addr() as u64)
    );
    mine.write(0, &[2; 4096]);
    c.batch_sync(TransferOp::Write, &[d], 5 * SECOND).unwrap();
    assert_eq!(kv.read(0, 4096), [2; 4096]);
    c.close();
    server.close();
}
