//! What the HIXL-CS tests share: endpoints, a listening server on a free port, clients, memory
//! the engine moves, statuses.

use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use hixl::cs::{Client, ClientDesc, CompleteStatus, Completion, Endpoint, Mem, MemHandle, Server};
use hixl::{MemType, Status};

/// The HIXL status of a failed call.
#[track_caller]
pub fn status<T: std::fmt::Debug>(r: hixl::cs::Result<T>) -> Status {
    let e = r.expect_err("the call should fail");
    e.status()
        .unwrap_or_else(|| panic!("not a HIXL status: {e}"))
}

/// Memory the engine moves: a heap buffer read and written only by copies, never through a
/// reference while a batch may move it.
pub struct Buf {
    mem: Vec<u8>,
}

impl Buf {
    pub fn new(len: usize) -> Buf {
        Buf { mem: vec![0; len] }
    }
    pub fn addr(&mut self) -> usize {
        self.mem.as_mut_ptr() as usize
    }
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    /// Its whole range, of host memory.
    pub fn mem(&mut self) -> Mem {
        Mem {
            typ: MemType::Host,
            addr: self.addr(),
            size: self.len(),
        }
    }
    pub fn read(&mut self, off: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        assert!(off + len <= self.len());
        // SAFETY: inside the buffer (asserted); no batch runs on it now (the tests' order).
        unsafe { std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(off), out.as_mut_ptr(), len) };
        out
    }
    pub fn write(&mut self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len());
        // SAFETY: as `read`.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_mut_ptr().add(off), data.len())
        };
    }
}

/// A port free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server listening on a free port of 127.0.0.1 (another one if a process takes the port
/// first: Listen is `FAILED`; any other error of Listen panics), with `before(server)` run
/// before it listens (registrations to serve from the start).
pub fn listening(mut before: impl FnMut(&Server)) -> (Server, u16) {
    for _ in 0..50 {
        let port = free_port();
        let s = Server::new(
            Ipv4Addr::LOCALHOST.into(),
            port,
            &[Endpoint::roce(Ipv4Addr::LOCALHOST.into())],
            None,
        )
        .unwrap();
        before(&s);
        match s.listen() {
            Ok(()) => return (s, port),
            Err(e) if e.status() == Some(Status::FAILED) => s.close(),
            Err(e) => panic!("listen: {e}"),
        }
    }
    panic!("no port to listen on");
}

/// Registers `buf` with `server` under `tag`.
pub fn serve(server: &Server, tag: &str, buf: &mut Buf) -> MemHandle {
    // SAFETY: the tests keep each buffer until its server is closed or dropped.
    unsafe { server.register(tag.as_bytes(), buf.mem()) }.unwrap()
}

/// A client of the server on `port` asking for the endpoint of `remote_ip`, with `config`.
pub fn client_with(port: u16, remote_ip: Ipv4Addr, config: Option<&str>) -> Client {
    let desc = ClientDesc {
        server_ip: Ipv4Addr::LOCALHOST.into(),
        server_port: port,
        local_endpoint: Endpoint::roce(Ipv4Addr::LOCALHOST.into()),
        remote_endpoint: Endpoint::roce(remote_ip.into()),
    };
    Client::new(&desc, config).unwrap()
}

/// A client of the server on `port`, connected.
pub fn connected(port: u16) -> Client {
    let c = client_with(port, Ipv4Addr::LOCALHOST, None);
    c.connect(Duration::from_secs(5)).unwrap();
    c
}

/// Registers `buf` with `client`.
pub fn local(client: &Client, buf: &mut Buf) -> MemHandle {
    // SAFETY: the tests keep each buffer until its client is closed or dropped.
    unsafe { client.register(buf.mem()) }.unwrap()
}

/// Queries completion `h` until it is no longer waiting (20 s at most), and checks that it was
/// freed once reported.
pub fn wait(c: &Client, h: Completion) -> CompleteStatus {
    let t0 = Instant::now();
    let s = loop {
        let s = c.query(h).unwrap();
        if s != CompleteStatus::Waiting || t0.elapsed() > Duration::from_secs(20) {
            break s;
        }
        std::thread::yield_now();
    };
    assert_eq!(
        status(c.query(h)),
        Status::PARAM_INVALID,
        "freed once reported"
    );
    s
}
