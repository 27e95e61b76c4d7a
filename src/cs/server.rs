//! The HIXL-CS server: an engine listening on its control address, its tagged registrations,
//! and the memory list it publishes (rewritten at every registration).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard};

use super::config::{self, Side};
use super::engine::{self, Buffer, Engine, Registration};
use super::list::{self, ENDPOINT_LEN, FORMAT, MAX_ENDPOINTS, MAX_MEMS, MAX_TAG};
use super::{Endpoint, Error, Mem, MemHandle, Result, comm_type, overlaps};
use crate::Access;
use crate::published::Publisher;
use crate::sync::lock;

/// The engine option that bounds its regions (a config may set it; else [`Server::new`] makes
/// room for [`MAX_MEMS`] and the list's own region).
const MAX_REGIONS_KEY: &str = "hixl.MaxRegions";

/// A registration of the server's.
struct SMem {
    tag: Vec<u8>,
    mem: Mem,
    /// The engine's registration, once listening.
    engine: Option<Registration>,
}

struct State {
    name: String,
    port: u16,
    /// The engine's options (`hixl.*` keys of the config).
    options: Vec<(String, String)>,
    endpoints: Vec<[u8; ENDPOINT_LEN]>,
    /// Started at Listen.
    engine: Option<Engine>,
    /// The published list's region, once listening.
    table: Option<Buffer>,
    publisher: Publisher,
    mems: BTreeMap<MemHandle, SMem>,
    closed: bool,
}

/// A HIXL-CS server (`HixlCSServerCreate`): `Send + Sync`. Its engine stops when it is closed
/// or dropped.
pub struct Server {
    state: Mutex<State>,
}

impl State {
    /// The list as it is published.
    fn list(&self) -> list::Table {
        list::Table {
            endpoints: self.endpoints.clone(),
            mems: (self.mems.values())
                .map(|m| list::Entry {
                    typ: comm_type(m.mem.typ),
                    addr: m.mem.addr as u64,
                    size: m.mem.size as u64,
                    tag: m.tag.clone(),
                })
                .collect(),
        }
    }

    /// Rewrites the published list (nothing before Listen).
    fn publish(&mut self) -> Result<()> {
        let ids = (self.mems.values()).filter_map(|m| m.engine.as_ref().map(|r| r.id));
        let list = self.list().encode_payload();
        let ids = list::encode_ids(&list, &ids.collect::<Vec<_>>());
        match &self.table {
            Some(table) => write(&mut self.publisher, table, &list, &ids),
            None => Ok(()),
        }
    }

    /// A registration of `mem` under `tag` is refused: a tag too long or with a NUL, a full
    /// table, a list that would not fit its region, a range that overlaps a registered one.
    fn check_new(&self, mem: &Mem, tag: &[u8]) -> Result<()> {
        if tag.len() > MAX_TAG {
            return Err(Error::invalid(format!(
                "mem_tag is {} bytes (at most {MAX_TAG})",
                tag.len()
            )));
        }
        if tag.contains(&0) {
            return Err(Error::invalid("mem_tag has a NUL byte"));
        }
        if self.mems.len() >= MAX_MEMS {
            return Err(Error::exhausted(format!(
                "the server has {MAX_MEMS} registrations already"
            )));
        }
        let mut t = self.list();
        t.mems.push(list::Entry {
            typ: comm_type(mem.typ),
            addr: mem.addr as u64,
            size: mem.size as u64,
            tag: tag.to_vec(),
        });
        if t.payload_len() + list::ids_len(t.mems.len()) > FORMAT.max_payload() {
            return Err(Error::exhausted(
                "the memory list would not fit the server's table (1 MiB)",
            ));
        }
        let (addr, size) = (mem.addr, mem.size);
        if let Some(m) = (self.mems.values()).find(|m| overlaps(m.mem.addr, m.mem.size, addr, size))
        {
            return Err(Error::invalid(format!(
                "{addr:#x}+{size} overlaps memory registered already ({:#x}+{})",
                m.mem.addr, m.mem.size
            )));
        }
        Ok(())
    }
}

/// Writes `list` (a payload) and its `ids` trailer in `table`, the server's list region.
fn write(publisher: &mut Publisher, table: &Buffer, list: &[u8], ids: &[u8]) -> Result<()> {
    // SAFETY: the region is FORMAT's region_len bytes (allocated so at Listen), alive while
    // `table` (its record) is, and written only here, under the server's lock (the callers
    // hold it); clients only READ it.
    unsafe { publisher.publish_trailed(&FORMAT, table.as_ptr(), list, ids) }
        .map_err(|_| Error::exhausted("the memory list does not fit the server's table"))
}

/// Registers `m` with `e`.
///
/// # Safety
/// [`Server::register`]'s contract, under which the memory was given.
unsafe fn engine_register(e: &Engine, m: &Mem) -> Result<Registration> {
    // SAFETY: the caller's contract.
    unsafe { e.register(m.typ, m.addr, m.size, false) }
}

impl Server {
    /// A server for `server_ip:server_port` with `endpoints`, not listening yet
    /// (`HixlCSServerCreate`). `config` is `global_resource_config` (`None` or "" for none).
    /// With a device endpoint, the calling thread's device is read now, as upstream's Create
    /// does, and the engine at [`Server::listen`] takes it. Port 0 is accepted here and refused
    /// by [`Server::listen`]. The engine has room for [`MAX_MEMS`] registrations and the list's
    /// own region, unless `config` sets `"hixl.MaxRegions"` (then that bounds them all, the
    /// list's region included).
    ///
    /// # Errors
    /// `PARAM_INVALID`: no endpoint or more than [`MAX_ENDPOINTS`], an endpoint whose location
    /// is neither device nor host, a bad config; ACL's own code (107002) for a device endpoint
    /// on a thread with no device.
    pub fn new(
        server_ip: IpAddr,
        server_port: u16,
        endpoints: &[Endpoint],
        config: Option<&str>,
    ) -> Result<Server> {
        let mut options = config::check(config, Side::Server).map_err(Error::invalid)?;
        if !options.iter().any(|(k, _)| k == MAX_REGIONS_KEY) {
            // the engine holds the list's own region beside the server's: room for MAX_MEMS
            // of those (its default, 4000, would refuse the last ones, at Listen or after)
            options.push((MAX_REGIONS_KEY.into(), (MAX_MEMS + 1).to_string()));
        }
        if endpoints.is_empty() {
            return Err(Error::invalid("a server needs an endpoint (none given)"));
        }
        if endpoints.len() > MAX_ENDPOINTS {
            return Err(Error::invalid(format!(
                "{} endpoints (at most {MAX_ENDPOINTS})",
                endpoints.len()
            )));
        }
        for (i, e) in endpoints.iter().enumerate() {
            e.check_location(&format!("endpoint {i}"))?;
        }
        if endpoints.iter().any(|e| e.location() == 0) {
            // device endpoints: the thread's device is read now, as upstream's Create does
            // (RegisterDeviceTransFinishedFlag), and its engine at Listen takes that device
            options.push(("hixl.ascend.require_device".into(), "1".into()));
            engine::check_device(&options)?;
        }
        Ok(Server {
            state: Mutex::new(State {
                name: SocketAddr::new(server_ip, server_port).to_string(),
                port: server_port,
                options,
                endpoints: endpoints.iter().map(Endpoint::published).collect(),
                engine: None,
                table: None,
                publisher: Publisher::default(),
                mems: BTreeMap::new(),
                closed: false,
            }),
        })
    }

    fn state(&self) -> Result<MutexGuard<'_, State>> {
        let st = lock(&self.state);
        if st.closed {
            return Err(Error::failed("the server is closed"));
        }
        Ok(st)
    }

    /// Registers `mem` under `tag` (`HixlCSServerRegMem`; no NUL inside, at most
    /// [`MAX_TAG`] bytes): in the list clients fetch, and with the engine once listening.
    ///
    /// # Safety
    /// The memory stays valid for reads and writes of any bytes until it is deregistered or
    /// the server closed or dropped, and nothing else accesses it in a way that conflicts with
    /// transfers: clients PUT into it and GET from it at any time (the engine's `register_mem`
    /// contract).
    ///
    /// # Errors
    /// `PARAM_INVALID`: a null, empty or wrapping range, a bad tag, a range that overlaps a
    /// registered one; `RESOURCE_EXHAUSTED`: [`MAX_MEMS`] registrations, or a list that would
    /// not fit its region; the engine's errors; `FAILED` once closed.
    pub unsafe fn register(&self, tag: &[u8], mem: Mem) -> Result<MemHandle> {
        mem.check()?;
        let mut st = self.state()?;
        st.check_new(&mem, tag)?;
        let mut m = SMem {
            tag: tag.to_vec(),
            mem,
            engine: None,
        };
        if let Some(e) = &st.engine {
            // SAFETY: this function's contract.
            m.engine = Some(unsafe { engine_register(e, &mem) }?);
        }
        let h = MemHandle::next();
        st.mems.insert(h, m);
        st.publish()?;
        Ok(h)
    }

    /// Starts listening (`HixlCSServerListen`): the engine starts on the server's address,
    /// registers the memory registered so far, the list is written, and only then does the
    /// engine serve: a client that connects meanwhile waits, and finds the whole list and every
    /// region of it in its link's table.
    ///
    /// # Errors
    /// `PARAM_INVALID` for port 0 (nothing to listen on); `FAILED` when listening already, when
    /// the engine cannot listen, once closed; the engine's errors.
    pub fn listen(&self) -> Result<()> {
        let mut st = self.state()?;
        if st.engine.is_some() {
            return Err(Error::failed("the server is listening already"));
        }
        if st.port == 0 {
            return Err(Error::invalid(
                "server_port is 0: there is nothing to listen on",
            ));
        }
        let cannot = |e: Error| Error::failed(format!("cannot listen: {}", e.message()));
        let e = Engine::initialize(&st.name, st.options.clone()).map_err(cannot)?;
        // (the engine is finalized when dropped, on every error below)
        let table = e.buffer(FORMAT.region_len(), Access::Read)?;
        let mut regs = Vec::with_capacity(st.mems.len());
        for m in st.mems.values() {
            // SAFETY: `register`'s contract, under which the memory was given.
            regs.push(unsafe { engine_register(&e, &m.mem) }?);
        }
        let list = st.list().encode_payload();
        let ids = list::encode_ids(&list, &regs.iter().map(|r| r.id).collect::<Vec<_>>());
        #[cfg(test)]
        tests::BEFORE_PUBLISH.with_borrow_mut(|h| h.as_mut().map(|f| f()));
        write(&mut st.publisher, &table, &list, &ids)?;
        e.open().map_err(cannot)?;
        for (m, r) in st.mems.values_mut().zip(regs) {
            m.engine = Some(r);
        }
        st.table = Some(table);
        st.engine = Some(e);
        Ok(())
    }

    /// Deregisters `h` (`HixlCSServerUnregMem`): it leaves the list and the engine.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a handle that is not a registration of this server; the engine's
    /// errors (it stays registered then); `FAILED` once closed.
    pub fn deregister(&self, h: MemHandle) -> Result<()> {
        let mut st = self.state()?;
        let Some(m) = st.mems.get(&h) else {
            return Err(Error::invalid(format!(
                "{:#x} is not a registration of this server",
                h.into_raw()
            )));
        };
        if let (Some(e), Some(r)) = (&st.engine, &m.engine) {
            e.deregister(r)?;
        }
        st.mems.remove(&h);
        st.publish()
    }

    /// Stops the server (`HixlCSServerDestroy`): its engine is finalized (links, listener and
    /// registrations end), and every later call is `FAILED`.
    pub fn close(&self) {
        let mut st = lock(&self.state);
        st.closed = true;
        if let Some(e) = st.engine.take() {
            e.finalize();
        }
        st.table = None;
        st.mems.clear();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("cs::Server")
            .field("name", &st.name)
            .field("listening", &st.engine.is_some())
            .field("mems", &st.mems.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::net::{IpAddr, Ipv4Addr, TcpListener};
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;
    use crate::cs::{BUILTIN_TAG, Client, ClientDesc, OpDesc};
    use crate::published::HEADER_LEN;
    use crate::{MemType, Status, TransferOp};

    thread_local! {
        /// Run by Listen on its thread before it writes the list.
        pub(super) static BEFORE_PUBLISH: RefCell<Option<Box<dyn FnMut()>>> =
            const { RefCell::new(None) };
    }

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const SECONDS: Duration = Duration::from_secs(5);

    /// A server of `kv` (tagged "kv") listening on a port free a moment ago (another one if a
    /// process takes it first), with `hook(port)` as Listen's [`BEFORE_PUBLISH`].
    ///
    /// # Safety
    /// `kv` is valid for reads and writes until the server is closed, and nothing reads it
    /// while a client may write it.
    unsafe fn serving(kv: Mem, hook: impl Fn(u16) -> Box<dyn FnMut()>) -> (Server, u16) {
        for _ in 0..50 {
            let port = (TcpListener::bind("127.0.0.1:0").unwrap())
                .local_addr()
                .unwrap()
                .port();
            let server = Server::new(IP, port, &[Endpoint::roce(IP)], None).unwrap();
            // SAFETY: the caller's.
            unsafe { server.register(b"kv", kv) }.unwrap();
            BEFORE_PUBLISH.set(Some(hook(port)));
            let listened = server.listen();
            BEFORE_PUBLISH.set(None);
            match listened {
                Err(e) if e.status() == Some(Status::FAILED) => {} // the port was taken
                r => return r.map(|()| (server, port)).unwrap(),
            }
        }
        panic!("no port to listen on");
    }

    /// A client of the server on `port`.
    fn client(port: u16) -> Client {
        let desc = ClientDesc {
            server_ip: IP,
            server_port: port,
            local_endpoint: Endpoint::roce(IP),
            remote_endpoint: Endpoint::roce(IP),
        };
        Client::new(&desc, None).unwrap()
    }

    /// Host memory of `buf`.
    fn mem(buf: &mut [u8]) -> Mem {
        Mem {
            typ: MemType::Host,
            addr: buf.as_mut_ptr() as usize,
            size: buf.len(),
        }
    }

    /// Connects a client of `port`, checks the list is [built-in, kv], and PUTs `mine` at
    /// kv's start.
    fn connect_and_put(port: u16, mine: &mut [u8]) {
        let c = client(port);
        c.connect(SECONDS).unwrap();
        let list = c.remote_mems(SECONDS).unwrap();
        let tags: Vec<&[u8]> = list.iter().map(|m| m.tag.as_slice()).collect();
        assert_eq!(tags, [BUILTIN_TAG.as_bytes(), b"kv"]);
        let local = mem(mine);
        // SAFETY: `mine` outlives the client; nothing touches it during the batch.
        unsafe { c.register(local) }.unwrap();
        let put = OpDesc {
            remote_addr: list[1].addr,
            local_addr: local.addr,
            len: local.size as u64,
        };
        c.batch_sync(TransferOp::Write, &[put], SECONDS).unwrap();
        c.close();
    }

    /// A client that connects while Listen runs, before the list is written, is answered only
    /// once Listen has written it and registered every region: here it times out (nothing
    /// serves yet), where it would find the list's region zeroed; after Listen a client
    /// connects, lists every region and writes one.
    /// The list a server publishes holds of each endpoint only what names it
    /// ([`Endpoint::published`]), not the rest of the caller's bytes.
    #[test]
    fn the_list_publishes_no_byte_of_an_endpoint_nothing_reads() {
        let mut e = Endpoint::roce(IP);
        e.bytes[12..44].fill(0xAB); // what a C caller's stack left there
        e.bytes[48..].fill(0xAB);
        let server = Server::new(IP, 0, &[e], None).unwrap();
        let listed = lock(&server.state).list().endpoints;
        assert_eq!(listed, vec![Endpoint::roce(IP).bytes]);
    }

    #[test]
    fn a_client_connecting_during_listen_waits_for_the_list() {
        let mut kv = vec![0u8; 4096];
        let early = Rc::new(RefCell::new(None));
        let got = early.clone();
        // SAFETY: `kv` outlives the server; it is read once the server is closed.
        let (server, port) = unsafe {
            serving(mem(&mut kv), |port| {
                let got = got.clone();
                Box::new(move || {
                    let r = client(port).connect(Duration::from_millis(300));
                    *got.borrow_mut() = Some(r);
                })
            })
        };
        let early = early.take().expect("the hook ran").unwrap_err();
        assert_eq!(early.status(), Some(Status::TIMEOUT), "{early}");
        connect_and_put(port, &mut [0x3c; 64]);
        server.close();
        assert_eq!(kv[..64], [0x3c; 64]);
    }

    /// Memory the server registers while a client connects (after the client's link was made,
    /// before it READs the list) is listed but not in the link's table: the client links again
    /// and reaches it (a batch into it was `PARAM_INVALID`, no such region, until a
    /// `remote_mems` relinked).
    #[test]
    fn memory_registered_while_a_client_connects_is_reached() {
        let mut kv = vec![0u8; 4096];
        let mut late = vec![0u8; 4096];
        // SAFETY: `kv` outlives the server; it is read once the server is closed.
        let (server, port) = unsafe { serving(mem(&mut kv), |_| Box::new(|| {})) };
        let server = Rc::new(server);
        let late_mem = mem(&mut late);
        let mut first = Some(server.clone());
        crate::cs::client::tests::AFTER_LINK.set(Some(Box::new(move || {
            if let Some(s) = first.take() {
                // SAFETY: `late` outlives the server (closed below, before it goes).
                unsafe { s.register(b"late", late_mem) }.unwrap();
            }
        })));
        let c = client(port);
        let connected = c.connect(SECONDS);
        crate::cs::client::tests::AFTER_LINK.set(None);
        connected.unwrap();
        let mut mine = [0x5au8; 64];
        let local = mem(&mut mine);
        // SAFETY: `mine` outlives the client; nothing touches it during the batch.
        unsafe { c.register(local) }.unwrap();
        // (the list connect imported has it: no `remote_mems`, which would link again itself)
        let put = OpDesc {
            remote_addr: late_mem.addr as u64,
            local_addr: local.addr,
            len: 64,
        };
        c.batch_sync(TransferOp::Write, &[put], SECONDS).unwrap();
        let list = c.remote_mems(SECONDS).unwrap();
        let tags: Vec<&[u8]> = list.iter().map(|m| m.tag.as_slice()).collect();
        assert_eq!(tags, [BUILTIN_TAG.as_bytes(), b"kv", b"late"]);
        c.close();
        server.close();
        assert_eq!(late[..64], [0x5a; 64]);
    }

    /// The list stays readable both ways: a reader that knows no ids trailer (an older
    /// client: the published table's fetch, then the payload's decoder) reads a list with one;
    /// a list without one (as an older server writes it) is read, and its regions reached.
    #[test]
    fn lists_with_and_without_ids_are_read() {
        let mut kv = vec![0u8; 4096];
        // SAFETY: `kv` outlives the server; it is read once the server is closed.
        let (server, port) = unsafe { serving(mem(&mut kv), |_| Box::new(|| {})) };
        {
            let mut st = lock(&server.state);
            let table = st.table.clone().expect("listening");
            // SAFETY: the list's region, alive while `table` is, written only under the
            // server's lock (held) and so not while these bytes are read.
            let image = unsafe { std::slice::from_raw_parts(table.as_ptr(), table.len()) };
            let h = FORMAT.decode_header(image).unwrap();
            let older = FORMAT.fetch(
                |buf: &mut [u8]| -> std::result::Result<(), ()> {
                    buf.copy_from_slice(&image[..buf.len()]);
                    Ok(())
                },
                std::time::Instant::now(),
            );
            let t = list::decode_payload(&older.unwrap()).unwrap();
            assert_eq!(t, st.list());
            let after = &image[HEADER_LEN + h.len..];
            let ids = list::decode_ids(&image[HEADER_LEN..HEADER_LEN + h.len], after);
            assert!(matches!(ids, crate::published::Trailer::Found(ids) if ids.len() == 1));
            // an older server's list: no trailer (the bytes after the payload cleared)
            let payload = t.encode_payload();
            let at = HEADER_LEN + payload.len();
            // SAFETY: as above; the bytes after the payload are inside the region.
            unsafe { std::ptr::write_bytes(table.as_ptr().add(at), 0, table.len() - at) };
            // SAFETY: as above.
            unsafe { st.publisher.publish(&FORMAT, table.as_ptr(), &payload) }.unwrap();
        }
        connect_and_put(port, &mut [0x3c; 64]);
        server.close();
        assert_eq!(kv[..64], [0x3c; 64]);
    }
}
