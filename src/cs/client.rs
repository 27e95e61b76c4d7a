//! The HIXL-CS client: its engine, the connection to the server, the server's memory list
//! (READ from the server's memory and imported), and client registrations. Its batches are
//! `batch.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::config::{self, Side};
use super::engine::{Buffer, Engine, Registration, RemoteRegion, Request};
use super::list::{self, FORMAT};
use super::{
    BUILTIN_TAG, Completion, Endpoint, Error, Mem, MemHandle, RemoteMem, Result, mem_type, overlaps,
};
use crate::error::deadline_after;
use crate::published::FetchError;
use crate::sync::lock;
use crate::{Access, MemType};

/// The longest a disconnect waits for the server's answer (the link is closed either way).
const BYE_WAIT: Duration = Duration::from_secs(1);

/// What a client is created with (`HixlClientDesc`; `tc` and `sl`, RDMA's, are not used).
#[derive(Debug, Clone, Copy)]
pub struct ClientDesc {
    /// The server's control address.
    pub server_ip: IpAddr,
    /// Its port (not 0).
    pub server_port: u16,
    /// The client's endpoint: device (the engine takes the thread's device) or host.
    pub local_endpoint: Endpoint,
    /// The server endpoint asked for: it must match one of the server's.
    pub remote_endpoint: Endpoint,
}

/// A client registration (identical ranges share one engine registration).
pub(super) struct CMem {
    pub(super) len: usize,
    typ: MemType,
    engine: Registration,
    refs: usize,
}

pub(super) struct State {
    pub(super) engine: Engine,
    /// The server's engine name.
    pub(super) remote: String,
    remote_endpoint: Endpoint,
    pub(super) connected: bool,
    /// A batch failed or timed out: every later batch is `FAILED`.
    pub(super) latched: bool,
    /// Where the server's list is READ into (not offered to peers).
    download: Buffer,
    /// By start address.
    pub(super) mems: BTreeMap<usize, CMem>,
    /// Registration handle → start address.
    mem_handles: HashMap<MemHandle, usize>,
    /// The imported server ranges, by start address: their ends.
    pub(super) remote_mems: BTreeMap<u64, u64>,
    /// Async batches not yet reported COMPLETED or FAILED.
    pub(super) handles: HashMap<Completion, Request>,
    closed: bool,
}

/// A HIXL-CS client (`HixlCSClientCreate`): `Send + Sync`; its calls are serialized. Its
/// engine stops when it is closed or dropped.
pub struct Client {
    pub(super) state: Mutex<State>,
}

/// The server's ranges (the built-in one, then its list) by start address, with their ends;
/// `Err` when two overlap (the list comes from the peer).
fn disjoint(
    builtin: (u64, u64),
    mems: &[list::Entry],
) -> std::result::Result<BTreeMap<u64, u64>, String> {
    let mut ranges = BTreeMap::new();
    for (addr, size) in std::iter::once(builtin).chain(mems.iter().map(|m| (m.addr, m.size))) {
        let end = addr
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or_else(|| format!("the server's region {addr:#x}+{size} is empty or wraps"))?;
        // the range starting last before `end` is the one that would overlap, if any does
        if let Some((&a, &e)) = ranges.range(..end).next_back()
            && e > addr
        {
            return Err(format!(
                "the server's region {addr:#x}+{size} overlaps its region {a:#x}+{}",
                e - a
            ));
        }
        ranges.insert(addr, end);
    }
    Ok(ranges)
}

impl State {
    /// READs the server's list within `deadline` (retried while the server rewrites it), and
    /// the region it lives in.
    fn fetch(&self, deadline: Instant) -> Result<(list::Table, RemoteRegion)> {
        self.fetch_ids(deadline).map(|(t, _, region)| (t, region))
    }

    /// [`State::fetch`], and the ids of the list's regions in the server's engine (`None` from
    /// a server that publishes none).
    fn fetch_ids(
        &self,
        deadline: Instant,
    ) -> Result<(list::Table, Option<Vec<u32>>, RemoteRegion)> {
        let region = (self.engine.remote_regions(&self.remote)?)
            .into_iter()
            .find(|r| FORMAT.is_region(r.access, r.mem_type, r.len))
            .ok_or_else(|| {
                Error::failed(format!(
                    "{} publishes no HIXL-CS memory list (not a HIXL-CS server?)",
                    self.remote
                ))
            })?;
        let read = |buf: &mut [u8]| {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout("timed out reading the server's memory list"));
            }
            // SAFETY: the download buffer is this client's, offered to no peer, and its READs
            // are serialized by the client's lock (held by the caller of `fetch`).
            unsafe { (self.engine).read(&self.remote, &self.download, region.addr, buf, left) }
        };
        let bad = |w: String| Error::failed(format!("the server's memory list: {w}"));
        let (payload, ids) = (FORMAT)
            .fetch_trailed(read, list::ids_len_after, list::decode_ids, deadline)
            .map_err(|e| match e {
                FetchError::Read(e) => e,
                FetchError::Changing => Error::timeout(format!(
                    "the server's memory list was being rewritten at every read until the \
                     deadline ({e})"
                )),
                e => bad(e.to_string()),
            })?;
        let t = list::decode_payload(&payload).map_err(|w| bad(w.into()))?;
        if let Some(ids) = &ids
            && ids.len() != t.mems.len()
        {
            let (n, m) = (ids.len(), t.mems.len());
            return Err(bad(format!("ids of {n} regions for {m}")));
        }
        Ok((t, ids, region))
    }

    /// [`State::fetch`] over a link that reaches every region of the list it READs: memory the
    /// server registered after the link was made (its table is fixed per link) is listed but
    /// not in the link's table, so the link is made again, by `deadline` (three times at most:
    /// a server that keeps registering is not chased; what the link lacks then is reached after
    /// [`Client::remote_mems`]).
    fn fetch_covered(&mut self, deadline: Instant) -> Result<(list::Table, RemoteRegion)> {
        #[cfg(test)]
        tests::AFTER_LINK.with_borrow_mut(|h| h.as_mut().map(|f| f()));
        let mut relinks = 0;
        loop {
            let (t, ids, builtin) = self.fetch_ids(deadline)?;
            if relinks == 3 || self.link_covers(&t, ids.as_deref())? {
                return Ok((t, builtin));
            }
            relinks += 1;
            self.disconnect_by(deadline);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(
                    "timed out linking again for memory the server registered meanwhile",
                ));
            }
            self.engine.connect(&self.remote, left)?;
        }
    }

    /// Records the list (the ranges batches are checked against) and returns it as
    /// [`Client::remote_mems`] gives it: the built-in region first.
    fn import(&mut self, t: &list::Table, builtin: RemoteRegion) -> Result<Vec<RemoteMem>> {
        self.remote_mems =
            disjoint((builtin.addr, builtin.len), &t.mems).map_err(Error::invalid)?;
        let mut out = Vec::with_capacity(1 + t.mems.len());
        out.push(RemoteMem {
            typ: MemType::Host,
            addr: builtin.addr,
            size: builtin.len,
            tag: BUILTIN_TAG.into(),
        });
        out.extend(t.mems.iter().map(|m| RemoteMem {
            typ: mem_type(m.typ),
            addr: m.addr,
            size: m.size,
            tag: m.tag.clone(),
        }));
        Ok(out)
    }

    /// Closes the link to the server, waiting for its answer until `deadline` ([`BYE_WAIT`] at
    /// most, 1 ms at least: the link is closed either way); the client is not connected then.
    fn disconnect_by(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = left.clamp(Duration::from_millis(1), BYE_WAIT);
        self.engine.disconnect(&self.remote, wait);
        self.connected = false;
        self.remote_mems.clear();
    }

    /// Whether every region of the list is in the link's table: memory the server registered
    /// after this client connected is not, nor memory it registered again (the same addresses,
    /// a new region of its engine), told apart by `ids` when the server gives them.
    fn link_covers(&self, t: &list::Table, ids: Option<&[u32]>) -> Result<bool> {
        let regions = self.engine.remote_regions(&self.remote)?;
        Ok(t.mems.iter().enumerate().all(|(i, m)| {
            (regions.iter()).any(|r| {
                r.addr <= m.addr
                    && m.addr + m.size <= r.addr + r.len
                    && ids.is_none_or(|ids| ids.get(i) == Some(&r.id))
            })
        }))
    }
}

impl Client {
    /// A client of the server at `desc`'s address, not connected yet (`HixlCSClientCreate`).
    /// `config` is `global_resource_config` (`None` or "" for none). A device local endpoint
    /// makes the engine take the calling thread's device now, as upstream's client does.
    ///
    /// # Errors
    /// `PARAM_INVALID`: port 0, a local endpoint whose location is neither device nor host, a
    /// bad config, `HCCL_RDMA_RETRY_CNT` or `HCCL_RDMA_TIMEOUT` set out of range; ACL's own code
    /// (107002) for a device endpoint on a thread with no device; the engine's errors.
    pub fn new(desc: &ClientDesc, config: Option<&str>) -> Result<Client> {
        let mut options = config::check(config, Side::Client).map_err(Error::invalid)?;
        if desc.server_port == 0 {
            return Err(Error::invalid("server_port 0 is not in 1..=65535"));
        }
        desc.local_endpoint.check_location("local endpoint")?;
        config::check_env().map_err(Error::invalid)?;
        if desc.local_endpoint.location() == 0 {
            // a device endpoint: the engine reads the thread's device at Create, and fails with
            // ACL's error where none is set, as upstream's client (InitDeviceResource)
            options.push(("hixl.ascend.require_device".into(), "1".into()));
        }
        let me = if desc.server_ip.is_ipv4() {
            "127.0.0.1"
        } else {
            "[::1]"
        };
        let engine = Engine::start(me, options)?;
        let download = engine.buffer(FORMAT.region_len(), Access::None)?;
        Ok(Client {
            state: Mutex::new(State {
                engine,
                remote: SocketAddr::new(desc.server_ip, desc.server_port).to_string(),
                remote_endpoint: desc.remote_endpoint,
                connected: false,
                latched: false,
                download,
                mems: BTreeMap::new(),
                mem_handles: HashMap::new(),
                remote_mems: BTreeMap::new(),
                handles: HashMap::new(),
                closed: false,
            }),
        })
    }

    pub(super) fn state(&self) -> Result<MutexGuard<'_, State>> {
        let st = lock(&self.state);
        if st.closed {
            return Err(Error::failed("the client is closed"));
        }
        Ok(st)
    }

    /// Connects to the server within `timeout` (`HixlCSClientConnect`), matches the remote
    /// endpoint among the server's, and imports its memory list, over a link that reaches every
    /// region of it (memory the server registered while this connected: linked again).
    ///
    /// # Errors
    /// `TIMEOUT` for a zero timeout or when it passes; `PARAM_INVALID` when the remote endpoint
    /// matches none of the server's (the link is dropped); `FAILED` when connected already, for
    /// a peer that publishes no list, once closed; the engine's errors.
    pub fn connect(&self, timeout: Duration) -> Result<()> {
        let mut st = self.state()?;
        if st.connected {
            return Err(Error::failed("the client is connected already"));
        }
        if timeout.is_zero() {
            return Err(Error::timeout("timeout_ms is 0"));
        }
        let deadline = deadline_after(Instant::now(), timeout);
        st.engine.connect(&st.remote, timeout)?;
        let fetched = st.fetch_covered(deadline).and_then(|(t, builtin)| {
            if !t
                .endpoints
                .iter()
                .any(|e| Endpoint { bytes: *e }.matches(&st.remote_endpoint))
            {
                return Err(Error::invalid(
                    "remote_endpoint matches none of the server's endpoints",
                ));
            }
            st.import(&t, builtin)
        });
        if let Err(e) = fetched {
            st.disconnect_by(deadline);
            return Err(e);
        }
        st.connected = true;
        Ok(())
    }

    /// The server's memory list, READ again within `timeout` (`HixlCSClientGetRemoteMem`): the
    /// built-in region ([`BUILTIN_TAG`]) first, then each registration. When the server
    /// registered memory the link's table lacks (tables are fixed per link), or registered it
    /// again (the link's region of those addresses has another id than the list gives; a
    /// server that gives no ids is checked by address only), the client reconnects first: the
    /// link is closed (waiting for the server's answer until the deadline, 1 s at most), then a
    /// new one made in what is left of `timeout`. The engine
    /// holds one link to a server, so the old link goes before the new one is made: when the
    /// deadline passes before the reconnect begins, the old link is kept (and the list as
    /// imported before); when it passes while the old link closes, or the new connect fails,
    /// the client is not connected (connect again).
    ///
    /// # Errors
    /// `FAILED` when not connected, once closed, or when a reconnect is due while async batches
    /// are outstanding; `TIMEOUT` for a zero timeout or when it passes (a reconnect included);
    /// the engine's errors.
    pub fn remote_mems(&self, timeout: Duration) -> Result<Vec<RemoteMem>> {
        let mut st = self.state()?;
        if !st.connected {
            return Err(Error::failed("the client is not connected"));
        }
        if timeout.is_zero() {
            return Err(Error::timeout("timeout_ms is 0"));
        }
        let deadline = deadline_after(Instant::now(), timeout);
        let (mut t, ids, mut builtin) = st.fetch_ids(deadline)?;
        if !st.link_covers(&t, ids.as_deref())? {
            // the server registered memory after this link was made (or again): a new link gets
            // a table with it (the engine's tables are fixed per link)
            if !st.handles.is_empty() {
                return Err(Error::failed(format!(
                    "the server's list changed; {} async batches must be queried to their end before \
                     it can be imported",
                    st.handles.len()
                )));
            }
            let out_of_time =
                || Error::timeout("timed out reconnecting to import the server's list");
            if Instant::now() >= deadline {
                return Err(out_of_time()); // the link is kept: no new one could be made in time
            }
            st.disconnect_by(deadline);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(out_of_time());
            }
            st.engine.connect(&st.remote, left)?;
            st.connected = true;
            (t, builtin) = st.fetch(deadline)?;
        }
        st.import(&t, builtin)
    }

    /// Registers client memory (`HixlCSClientRegMem`; its tag is not used: nobody sees client
    /// memory), local-only. A range identical to a registered one shares its registration
    /// (counted: each handle is deregistered once).
    ///
    /// # Safety
    /// The memory stays valid for reads and writes of any bytes until it is deregistered or
    /// the client closed or dropped, and nothing else accesses it in a way that conflicts with
    /// the batches that move it (the engine's `register_mem` contract).
    ///
    /// # Errors
    /// `PARAM_INVALID`: a null, empty or wrapping range, one that partially overlaps a
    /// registered one; the engine's errors; `FAILED` once closed.
    pub unsafe fn register(&self, mem: Mem) -> Result<MemHandle> {
        mem.check()?;
        let (addr, size) = (mem.addr, mem.size);
        let mut st = self.state()?;
        let same = (st.mems.get(&addr)).is_some_and(|m| m.len == size && m.typ == mem.typ);
        if !same {
            if let Some((&a, m)) = (st.mems.iter()).find(|(a, m)| overlaps(**a, m.len, addr, size))
            {
                return Err(Error::invalid(format!(
                    "{addr:#x}+{size} partially overlaps the registered {a:#x}+{}",
                    m.len
                )));
            }
            // SAFETY: this function's contract.
            let r = unsafe { st.engine.register(mem.typ, addr, size, true) }?;
            st.mems.insert(
                addr,
                CMem {
                    len: size,
                    typ: mem.typ,
                    engine: r,
                    refs: 0,
                },
            );
        }
        if let Some(m) = st.mems.get_mut(&addr) {
            m.refs += 1;
        }
        let h = MemHandle::next();
        st.mem_handles.insert(h, addr);
        Ok(h)
    }

    /// Deregisters `h` (`HixlCSClientUnregMem`); the range's engine registration ends with its
    /// last handle.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a handle that is not a registration of this client; the engine's
    /// errors (it stays registered then: `RESOURCE_EXHAUSTED` while an async batch not yet
    /// ended moves the range, to retry once its query said COMPLETED or FAILED); `FAILED` once
    /// closed.
    pub fn deregister(&self, h: MemHandle) -> Result<()> {
        let mut st = self.state()?;
        let Some(&addr) = st.mem_handles.get(&h) else {
            return Err(Error::invalid(format!(
                "{:#x} is not a registration of this client",
                h.into_raw()
            )));
        };
        let Some(m) = st.mems.get(&addr) else {
            return Err(Error::failed("internal: a handle without its range"));
        };
        if m.refs == 1 {
            st.engine.deregister(&m.engine)?;
            st.mems.remove(&addr);
        } else if let Some(m) = st.mems.get_mut(&addr) {
            m.refs -= 1;
        }
        st.mem_handles.remove(&h);
        Ok(())
    }

    /// Closes the client (`HixlCSClientDestroy`): its engine is finalized (the link and the
    /// registrations end, async batches with it), and every later call is `FAILED`.
    pub fn close(&self) {
        let mut st = lock(&self.state);
        st.closed = true;
        st.handles.clear();
        st.engine.finalize();
        st.mems.clear();
        st.mem_handles.clear();
        st.connected = false;
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("cs::Client")
            .field("server", &st.remote)
            .field("connected", &st.connected)
            .field("latched", &st.latched)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// Run by Connect on its thread once its link is made, before it READs the list.
        pub(in crate::cs) static AFTER_LINK: RefCell<Option<Box<dyn FnMut()>>> =
            const { RefCell::new(None) };
    }

    #[test]
    fn server_ranges_must_be_disjoint() {
        let m = |addr, size| list::Entry {
            typ: 1,
            addr,
            size,
            tag: Vec::new(),
        };
        let ok = disjoint(
            (0x1000, 0x100),
            &[m(0x2000, 0x100), m(0x1100, 0xf00), m(0x3000, 1)],
        );
        assert_eq!(ok.unwrap().len(), 4);
        for bad in [
            vec![m(0x1000, 0x100)],                  // the built-in one again
            vec![m(0x10ff, 2)],                      // straddles its end
            vec![m(0x800, 0x900)],                   // straddles its start
            vec![m(0x2000, 0x100), m(0x2010, 0x10)], // inside another
            vec![m(0x2010, 0x10), m(0x2000, 0x100)], // around another
            vec![m(0x3000, 0)],                      // empty
            vec![m(u64::MAX - 1, 4)],                // wraps
        ] {
            assert!(disjoint((0x1000, 0x100), &bad).is_err(), "{bad:?}");
        }
    }
}
