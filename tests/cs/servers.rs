//! The server's rules (`HixlCSServerCreate`, `RegMem`, `Listen`, `UnregMem`, `Destroy`), each
//! with its exact status.

use std::net::Ipv4Addr;
use std::time::Duration;

use hixl::cs::{Endpoint, MAX_ENDPOINTS, MAX_MEMS, MAX_TAG, Mem, MemHandle, OpDesc, Server};
use hixl::{MemType, Status, TransferOp};

use super::support::{Buf, connected, free_port, listening, local, status};

fn server(port: u16, config: Option<&str>) -> hixl::cs::Result<Server> {
    let ep = [Endpoint::roce(Ipv4Addr::LOCALHOST.into())];
    Server::new(Ipv4Addr::LOCALHOST.into(), port, &ep, config)
}

/// One byte of host memory at `addr`.
fn byte(addr: usize) -> Mem {
    Mem {
        typ: MemType::Host,
        addr,
        size: 1,
    }
}

#[test]
fn create_refuses_bad_endpoints_and_configs() {
    let ip = Ipv4Addr::LOCALHOST.into();
    let ep = Endpoint::roce(Ipv4Addr::LOCALHOST.into());
    assert_eq!(status(Server::new(ip, 1, &[], None)), Status::PARAM_INVALID);
    let many = vec![ep; MAX_ENDPOINTS + 1];
    assert_eq!(
        status(Server::new(ip, 1, &many, None)),
        Status::PARAM_INVALID
    );
    assert!(Server::new(ip, 1, &many[..MAX_ENDPOINTS], None).is_ok());
    let reserved = ep.at(2);
    assert_eq!(
        status(Server::new(ip, 1, &[ep, reserved], None)),
        Status::PARAM_INVALID
    );
    for bad in [
        "[1, 2]",
        "{",
        "{\"comm_resource_config.listen_port\": 0}",
        "{\"comm_resource_config.max_active_channels\": 0}",
        "{\"hixl.NoSuchOption\": 1}",
    ] {
        assert_eq!(status(server(1, Some(bad))), Status::PARAM_INVALID, "{bad}");
    }
    // a client's key is not read by a server; an empty config is none
    assert!(server(1, Some("{\"comm_resource_config.qos\": 8}")).is_ok());
    assert!(server(1, Some("")).is_ok());
    // port 0 is accepted at Create and refused at Listen: nothing to listen on
    let s = server(
        0,
        Some("{\"comm_resource_config.max_active_channels\": 16}"),
    )
    .unwrap();
    assert_eq!(status(s.listen()), Status::PARAM_INVALID);
}

#[test]
fn registrations_are_checked_and_counted() {
    let s = server(0, None).unwrap();
    let mut buf = Buf::new(8192);
    let base = buf.addr();
    let mem = |addr, size| Mem {
        typ: MemType::Host,
        addr,
        size,
    };
    // SAFETY (every `register` below): `buf` outlives the server, which never listens.
    for (addr, size) in [(base, 0), (0, 16), (usize::MAX - 8, 16)] {
        let r = unsafe { s.register(b"t", mem(addr, size)) };
        assert_eq!(status(r), Status::PARAM_INVALID, "{addr:#x}+{size}");
    }
    let long = vec![b'x'; MAX_TAG + 1];
    assert_eq!(
        status(unsafe { s.register(&long, mem(base, 16)) }),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(unsafe { s.register(b"a\0b", mem(base, 16)) }),
        Status::PARAM_INVALID
    );
    // no tag is ""
    let h = unsafe { s.register(b"", mem(base, 4096)) }.unwrap();
    assert_eq!(
        status(unsafe { s.register(b"o", mem(base + 100, 4096)) }),
        Status::PARAM_INVALID,
        "overlaps"
    );
    let h2 = unsafe { s.register(&long[..MAX_TAG], mem(base + 4096, 4096)) }.unwrap();
    assert_eq!(
        status(s.deregister(MemHandle::from_raw(0x42))),
        Status::PARAM_INVALID
    );
    s.deregister(h).unwrap();
    assert_eq!(status(s.deregister(h)), Status::PARAM_INVALID);
    // its range is free again
    let h = unsafe { s.register(b"again", mem(base + 100, 100)) }.unwrap();
    s.close();
    // a closed server
    assert_eq!(status(s.deregister(h2)), Status::FAILED);
    assert_eq!(status(s.listen()), Status::FAILED);
    assert_eq!(
        status(unsafe { s.register(b"t", mem(base, 16)) }),
        Status::FAILED
    );
    let _ = h;
}

#[test]
fn a_server_holds_at_most_its_limits() {
    let s = server(0, None).unwrap();
    let mut buf = Buf::new(MAX_MEMS + 1);
    let base = buf.addr();
    let one = |i: usize| byte(base + i);
    for i in 0..MAX_MEMS {
        // SAFETY: `buf` outlives the server, which never listens.
        unsafe { s.register(b"", one(i)) }.unwrap();
    }
    // SAFETY: as above.
    let r = unsafe { s.register(b"", one(MAX_MEMS)) };
    assert_eq!(status(r), Status::RESOURCE_EXHAUSTED, "upstream's 4096");
    // a list that would not fit its region (1 MiB + 4 KiB): tags of MAX_TAG bytes
    let s = server(0, None).unwrap();
    let tag = vec![b't'; MAX_TAG];
    let mut fitted = 0;
    let r = loop {
        // SAFETY: as above.
        match unsafe { s.register(&tag, one(fitted)) } {
            Ok(_) => fitted += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(r.status(), Some(Status::RESOURCE_EXHAUSTED), "{r}");
    assert!((200..MAX_MEMS).contains(&fitted), "{fitted} fitted");
}

/// A listening server holds MAX_MEMS registrations, as one that never listened does: its
/// engine has room for them and the list's own region (4000 registered before Listen, the rest
/// after), a client reaches the last one, and one more is refused by the server's own limit.
#[test]
fn a_listening_server_holds_max_mems_registrations() {
    let mut buf = Buf::new(MAX_MEMS + 1);
    let base = buf.addr();
    let one = |i: usize| byte(base + i);
    let before = 4000;
    let (s, port) = listening(|s| {
        for i in 0..before {
            // SAFETY: `buf` outlives the server.
            unsafe { s.register(b"", one(i)) }.unwrap();
        }
    });
    for i in before..MAX_MEMS {
        // SAFETY: as above.
        unsafe { s.register(b"", one(i)) }.unwrap();
    }
    // SAFETY: as above.
    let e = unsafe { s.register(b"", one(MAX_MEMS)) }.unwrap_err();
    assert_eq!(e.status(), Some(Status::RESOURCE_EXHAUSTED), "{e}");
    assert!(
        e.message().contains(&format!("{MAX_MEMS} registrations")),
        "the server's limit, not the engine's: {e}"
    );
    let c = connected(port);
    let list = c.remote_mems(Duration::from_secs(5)).unwrap();
    assert_eq!(
        list.len(),
        1 + MAX_MEMS,
        "the built-in region and every registration"
    );
    let mut mine = Buf::new(1);
    local(&c, &mut mine);
    mine.write(0, &[0x5a]);
    let last = OpDesc {
        remote_addr: (base + MAX_MEMS - 1) as u64,
        local_addr: mine.addr(),
        len: 1,
    };
    (c.batch_sync(TransferOp::Write, &[last], Duration::from_secs(5))).unwrap();
    assert_eq!(buf.read(MAX_MEMS - 1, 1), [0x5a]);
    c.close();
    s.close();
}

/// A config that sets the engine's region limit bounds the list's region and the registrations
/// together: two registrations and the list do not fit two regions.
#[test]
fn a_config_s_region_limit_bounds_the_list_s_region_too() {
    let mut buf = Buf::new(2);
    let base = buf.addr();
    for _ in 0..50 {
        let s = server(free_port(), Some("{\"hixl.MaxRegions\": 2}")).unwrap();
        for i in 0..2 {
            // SAFETY: `buf` outlives the server.
            unsafe { s.register(b"", byte(base + i)) }.unwrap();
        }
        match s.listen() {
            // another process took the port first
            Err(e) if e.status() == Some(Status::FAILED) => s.close(),
            r => {
                assert_eq!(status(r), Status::RESOURCE_EXHAUSTED);
                return;
            }
        }
    }
    panic!("no port to listen on");
}

#[test]
fn a_server_listens_once() {
    let (s, _port) = listening(|_| {});
    assert_eq!(status(s.listen()), Status::FAILED, "twice");
    s.close();
    assert_eq!(status(s.listen()), Status::FAILED, "closed");
}
