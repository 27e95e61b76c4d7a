//! The control plane's server: accepts connections on the engine's listener, runs each one's
//! handshake (HELLO, CHALLENGE/AUTH with a key, the allow-list, the region table in WELCOME),
//! keeps the link registry, and dispatches each established lane's frames (XFER served over TCP,
//! NOTIFY, UCXASK, DEVICE_HELLO, PING, BYE) within the bounds of [`limits`](super::limits).
//!
//! The serving side runs one thread per lane: handshakes and established lanes are counted
//! apart, per peer address too, and once a request's first byte arrives the whole request has
//! `server_io_timeout`. It validates every descriptor against its frozen region table (region
//! id, bounds with overflow checks, access rights) before it touches a byte, and never trusts a
//! length it has not checked.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::Psk;
use crate::error::Status;
use crate::io::{Inbound, IoVec, Sock, read_frame};
use crate::memory::RegionCore;
use crate::notify::{Notify, NotifyQueue};
use crate::runtime::control::limits::{self, ConnTable, Limits};
use crate::sync::lock;
use crate::transport::same_host::fence::ServerFence;
use crate::types::HostId;
use crate::types::TransferOp;
use crate::types::WireDesc;
use crate::wire::{self, Hello, Kind, LaneRole, Refuse, TableEntry, Welcome, WireError};

/// How long a serving thread polls for the next request before sleeping: back-to-back small
/// requests skip a wake-up.
const SERVE_SPIN: Duration = Duration::from_micros(20);

/// The frozen region table a serving engine exposes, indexed by region id.
pub(crate) struct ServeTable {
    by_id: Vec<Arc<RegionCore>>,
}

impl ServeTable {
    pub fn new(mut regions: Vec<Arc<RegionCore>>) -> Self {
        regions.sort_by_key(|r| r.id);
        Self { by_id: regions }
    }
    /// The regions served.
    pub(crate) fn cores(&self) -> &[Arc<RegionCore>] {
        &self.by_id
    }
    fn get(&self, id: u32) -> Option<&RegionCore> {
        self.by_id
            .binary_search_by_key(&id, |r| r.id)
            .ok()
            .map(|i| &*self.by_id[i])
    }
    /// The table as peers see it. With `same_host` (a same-host peer with a fence), each region
    /// says how that peer may reach it: the memfd of a shareable region (the region is then
    /// marked as possibly mapped by a peer), `-1` for `/proc/PID/mem` at its address, or
    /// [`wire::FD_TCP_ONLY`] for memory the engine could not quarantine (caller-managed raw
    /// memory, types it cannot copy): served over TCP only.
    pub fn entries(&self, same_host: bool) -> Vec<TableEntry> {
        self.by_id
            .iter()
            .map(|r| TableEntry {
                fd: if !same_host {
                    -1
                } else if !r.one_sided() || r.access == crate::types::Access::None {
                    wire::FD_TCP_ONLY
                } else if r.fd >= 0 {
                    r.exposed.store(true, Ordering::SeqCst);
                    r.fd
                } else {
                    -1
                },
                id: r.id,
                addr: r.addr as u64,
                len: r.len as u64,
                mem_type: r.mem_type,
                access: r.access,
            })
            .collect()
    }
}

/// Checks a batch against the table and computes the memory it touches.
///
/// Never trusts the peer: unknown regions, empty, overflowing or out-of-bounds ranges and
/// forbidden operations are refused before any memory is touched.
pub(crate) fn validate(
    table: &ServeTable,
    op: TransferOp,
    descs: &[WireDesc],
    targets: &mut Vec<IoVec>,
) -> Result<(), (Status, String)> {
    targets.clear();
    for (i, d) in descs.iter().enumerate() {
        let Some(r) = table.get(d.region) else {
            return Err((
                Status::PARAM_INVALID,
                format!("descriptor {i}: no region {}", d.region),
            ));
        };
        let in_bounds = d.len > 0
            && d.offset
                .checked_add(d.len)
                .is_some_and(|end| end <= r.len as u64);
        if !in_bounds {
            return Err((
                Status::PARAM_INVALID,
                format!(
                    "descriptor {i}: range {}+{} outside region {} of {} bytes",
                    d.offset, d.len, r.id, r.len
                ),
            ));
        }
        if !r.access.permits(op) {
            return Err((
                Status::PARAM_INVALID,
                format!(
                    "descriptor {i}: {op} not permitted on region {} ({})",
                    r.id,
                    r.access.name()
                ),
            ));
        }
        if r.mem_type != crate::types::MemType::Host {
            return Err((
                Status::UNSUPPORTED,
                format!("descriptor {i}: device memory over tcp"),
            ));
        }
        targets.push(IoVec {
            base: r.addr + d.offset as usize,
            len: d.len as usize,
        });
    }
    Ok(())
}

/// Why a serving connection ended.
#[derive(Debug, thiserror::Error)]
enum ConnEnd {
    #[error("peer closed the connection")]
    Closed,
    #[error("link closed by BYE")]
    Bye,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(#[from] WireError),
    #[error("refused: {0}")]
    Refused(String),
}

/// Reads one handshake frame (HELLO, AUTH) by `deadline`: a header declaring more than
/// [`limits::MAX_HANDSHAKE_FRAME`] bytes is refused before anything is allocated for it.
fn read_handshake_frame<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    deadline: Option<Instant>,
) -> Result<Result<(Kind, &'a [u8]), WireError>, io::Error> {
    inb.fill(sock, wire::HEADER_LEN, deadline)?;
    let h: [u8; wire::HEADER_LEN] = inb.take(wire::HEADER_LEN).try_into().expect("header size");
    let h = match wire::decode_header(&h) {
        Ok(h) if h.len > limits::MAX_HANDSHAKE_FRAME => {
            return Ok(Err(WireError::OverLimit {
                what: "handshake frame length",
                got: h.len.into(),
                limit: limits::MAX_HANDSHAKE_FRAME.into(),
            }));
        }
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    inb.fill(sock, h.len as usize, deadline)?;
    Ok(Ok((h.kind, inb.take(h.len as usize))))
}

/// Reads the next request of an established connection: waits as long as it takes for its
/// first byte, then the whole frame must arrive within `timeout`. Returns the frame and that
/// deadline, which also bounds the rest of the request (a WRITE's payload, the reply).
#[allow(clippy::type_complexity)]
fn read_request<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    timeout: Duration,
) -> Result<(Result<(Kind, &'a [u8]), WireError>, Instant), io::Error> {
    inb.fill(sock, 1, None)?;
    let deadline = Instant::now() + timeout;
    let frame = read_frame(sock, inb, Some(deadline), || Some(deadline))?;
    Ok((frame, deadline))
}

/// Most entries a serving connection keeps in its descriptor vectors between requests.
const KEEP_DESCS: usize = 4096;

/// Gives back what a large request made a connection's buffers grow to.
fn trim(
    inb: &mut Inbound,
    descs: &mut Vec<WireDesc>,
    targets: &mut Vec<IoVec>,
    iov: &mut Vec<IoVec>,
    out: &mut Vec<u8>,
) {
    inb.trim();
    if descs.capacity() > KEEP_DESCS {
        *descs = Vec::new();
    }
    if targets.capacity() > KEEP_DESCS {
        *targets = Vec::new();
    }
    if iov.capacity() > KEEP_DESCS {
        *iov = Vec::new();
    }
    if out.capacity() > 64 << 10 {
        *out = Vec::with_capacity(256);
    }
}

/// Ends a handshake that failed on I/O: past its deadline the client is told so (`REFUSE`
/// `TIMEOUT`) before the connection closes.
fn handshake_failed(sock: &mut Sock, out: &mut Vec<u8>, e: io::Error) -> ConnEnd {
    if e.kind() == io::ErrorKind::TimedOut {
        // the send buffer is empty this early: the short deadline only guards a stuck peer
        let quick = Some(Instant::now() + Duration::from_millis(100));
        refuse(sock, out, Status::TIMEOUT, "handshake timed out", quick);
    }
    ConnEnd::Io(e)
}

/// Counts connection `id` as an established lane (it finished its handshake).
fn establish(shared: &ServerShared, id: u64) -> Result<(), limits::Refusal> {
    lock(&shared.conns).establish(id, &shared.limits)
}

struct LinkRec {
    client: String,
    instance: u64,
    conns: HashSet<u64>,
    /// Cleared when the link is superseded or closed: its lanes apply nothing more.
    live: Arc<AtomicBool>,
    /// Requests of this link being applied right now.
    busy: Arc<AtomicUsize>,
    /// The server's side of the link's device data path (Ascend), dropped with the link.
    device: Option<crate::transport::ascend::link::DeviceLink>,
    /// The link's fence, when its client is on this host: revoked when the link ends.
    fence: Option<Arc<ServerFence>>,
}

impl Drop for LinkRec {
    fn drop(&mut self) {
        // a link that ended grants no more one-sided access
        if let Some(f) = &self.fence {
            f.revoke();
        }
    }
}

impl LinkRec {
    /// Stops the link's lanes: they apply no request after this returns, except those already
    /// being applied, which [`LinkRec::drain`] waits for.
    fn retire(&self, shared: &ServerShared) {
        self.live.store(false, Ordering::SeqCst);
        let conns = lock(&shared.conns);
        for c in self.conns.iter().filter_map(|c| conns.get(c)) {
            Sock::shutdown(c);
        }
    }
    /// Waits (up to `limit`) until no request of this retired link is being applied.
    fn drain(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.busy.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

/// State shared by the accept thread and every serving thread of one engine.
pub(crate) struct ServerShared {
    name: String,
    instance: u64,
    table: ServeTable,
    io_timeout: Duration,
    limits: Limits,
    stop: AtomicBool,
    /// Requests being served right now.
    active: AtomicUsize,
    /// Every connection, from accept until its thread ends, with the counts [`Limits`] bound.
    conns: Mutex<ConnTable>,
    links: Mutex<HashMap<u64, LinkRec>>,
    next_id: AtomicU64,
    notifies: Arc<NotifyQueue>,
    /// This process, offered to same-host clients (`None`: same-host transfers are off).
    host: Option<HostId>,
    /// The client engine names served (`None`: all).
    allow: Option<Vec<String>>,
    /// The pre-shared key clients must prove (`None`: no authentication).
    psk: Option<Psk>,
    /// Keepalive interval for served connections (`None`: off).
    keepalive: Option<Duration>,
    /// The encoded UCXINFO frame, when the engine serves over UCX.
    ucx: Option<Vec<u8>>,
    /// The engine's Ascend runtime, for device data paths (`None`: none).
    device: Option<Arc<crate::transport::ascend::Runtime>>,
    /// Every fence handed to a same-host client that may still be in use: revoked (and waited
    /// for) when serving stops; dropped once revoked and settled.
    fences: Mutex<Vec<Arc<ServerFence>>>,
    span: tracing::Span,
}

impl ServerShared {
    /// Forgets fences that are revoked and settled: their clients start no batch and have
    /// none in flight.
    fn prune_fences(&self) {
        lock(&self.fences).retain(|f| !(f.is_revoked() && f.settled()));
    }
}

/// A running server: the accept thread and the serving threads.
pub(crate) struct Server {
    shared: Arc<ServerShared>,
    accept: Option<JoinHandle<()>>,
    wake: OwnedFd,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// Options for [`Server::start`].
pub(crate) struct ServerConfig {
    pub name: String,
    pub instance: u64,
    pub io_timeout: Duration,
    pub limits: Limits,
    pub notifies: Arc<NotifyQueue>,
    pub host: Option<HostId>,
    pub allow: Option<Vec<String>>,
    pub psk: Option<Psk>,
    /// Keepalive interval for served connections (the engine's heartbeat interval).
    pub keepalive: Option<Duration>,
    /// The encoded UCXINFO frame, when the engine serves over UCX.
    pub ucx: Option<Vec<u8>>,
    /// The engine's Ascend runtime, for device data paths.
    pub device: Option<Arc<crate::transport::ascend::Runtime>>,
    pub span: tracing::Span,
}

impl Server {
    /// Starts accepting on `listener` (a clone of the engine's listening socket).
    pub fn start(listener: TcpListener, table: ServeTable, cfg: ServerConfig) -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        listener.set_nonblocking(true)?;
        let nofile = limits::raise_nofile(cfg.limits.descriptors());
        tracing::debug!(parent: &cfg.span, nofile, "descriptor limit");
        let shared = Arc::new(ServerShared {
            name: cfg.name,
            instance: cfg.instance,
            table,
            io_timeout: cfg.io_timeout,
            limits: cfg.limits,
            stop: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            conns: Mutex::new(ConnTable::default()),
            links: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            notifies: cfg.notifies,
            host: cfg.host,
            allow: cfg.allow,
            psk: cfg.psk,
            keepalive: cfg.keepalive,
            ucx: cfg.ucx,
            device: cfg.device,
            fences: Mutex::new(Vec::new()),
            span: cfg.span,
        });
        let handles = Arc::new(Mutex::new(Vec::new()));
        let (s, h, wfd) = (shared.clone(), handles.clone(), wake.as_raw_fd());
        let accept = std::thread::Builder::new()
            .name("hixl-accept".into())
            .spawn(move || accept_loop(listener, wfd, s, h))?;
        Ok(Self {
            shared,
            accept: Some(accept),
            wake,
            handles,
        })
    }

    /// How many client links are being served right now.
    pub fn served_links(&self) -> usize {
        lock(&self.shared.links).len()
    }

    /// The regions served.
    pub fn regions(&self) -> &[Arc<RegionCore>] {
        self.shared.table.cores()
    }

    /// Stops serving: no new connections; revokes every same-host client's one-sided access;
    /// waits up to `grace` for requests being served to finish and for every same-host client
    /// to leave its fence; then closes every connection and joins every thread. When this
    /// returns, no serving thread touches registered memory any more, and neither does any
    /// same-host client, except those returned: their fences did not settle in time (the
    /// client is stopped or hung), so the memory they can reach must be quarantined.
    pub fn stop(mut self, grace: Duration) -> crate::quarantine::Blockers {
        self.shared.stop.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let fences = std::mem::take(&mut *lock(&self.shared.fences));
        for f in &fences {
            f.revoke();
        }
        let until = Instant::now() + grace;
        while (self.shared.active.load(Ordering::SeqCst) > 0 || fences.iter().any(|f| !f.settled()))
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // a client still inside its fence is given up on: its batch will report failure
        let stuck: Vec<Arc<ServerFence>> = fences.into_iter().filter(|f| !f.abandon()).collect();
        if !stuck.is_empty() {
            tracing::warn!(parent: &self.shared.span, clients = stuck.len(), ?grace,
                "same-host clients did not leave their fences in time; their memory will be quarantined");
        }
        let busy = self.shared.active.load(Ordering::SeqCst);
        for s in lock(&self.shared.conns).values() {
            Sock::shutdown(s);
        }
        let handles = std::mem::take(&mut *lock(&self.handles));
        for h in handles {
            let _ = h.join();
        }
        tracing::debug!(parent: &self.shared.span, cut_requests = busy, "server stopped");
        stuck
    }
}

fn accept_loop(
    listener: TcpListener,
    wake: i32,
    shared: Arc<ServerShared>,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
) {
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let mut backoff = limits::Backoff::default();
    loop {
        // SAFETY: `fds` is a live array of two pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if r < 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, from)) => {
                backoff.reset();
                admit(&shared, &handles, stream, from);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if limits::wait_out(&e) => {
                // out of descriptors (or memory): established links keep being served by their
                // threads; wait for the stop signal or a while, longer each time, and retry
                let wait = backoff.step();
                tracing::debug!(parent: &shared.span, error = %e, ?wait, "accept failed; backing off");
                let mut w = [fds[1]];
                // SAFETY: `w` is a live array of one pollfd.
                unsafe { libc::poll(w.as_mut_ptr(), 1, wait.as_millis() as libc::c_int) };
            }
            Err(e) => {
                // about one connection (reset before it was accepted, ...): the next may work
                tracing::debug!(parent: &shared.span, error = %e, "accept failed");
            }
        }
    }
}

/// Takes an accepted connection into the handshake budget and starts its serving thread, or
/// closes it at once (no thread) when its peer address is over its limit.
fn admit(
    shared: &Arc<ServerShared>,
    handles: &Mutex<Vec<JoinHandle<()>>>,
    stream: TcpStream,
    from: SocketAddr,
) {
    let mut hs = lock(handles);
    // reap finished threads so handles do not pile up
    let mut i = 0;
    while i < hs.len() {
        if hs[i].is_finished() {
            let _ = hs.swap_remove(i).join();
        } else {
            i += 1;
        }
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    // the table stays locked until the thread has the socket, or the socket is closed and out of
    // the table: nobody can shut down its descriptor number after it is closed
    let mut conns = lock(&shared.conns);
    if let Err(why) = conns.admit(id, stream.as_raw_fd(), from.ip(), &shared.limits) {
        let (handshakes, established) = conns.counts();
        tracing::debug!(parent: &shared.span, %from, why, handshakes, established, "refused at accept");
        return;
    }
    let s = shared.clone();
    match std::thread::Builder::new()
        .name("hixl-serve".into())
        .spawn(move || serve_conn(s, id, stream, from))
    {
        Ok(h) => hs.push(h),
        Err(e) => {
            conns.remove(&id);
            tracing::warn!(parent: &shared.span, error = %e, "cannot spawn a serving thread");
        }
    }
}

struct ActiveGuard<'a>(&'a AtomicUsize);
impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve_conn(shared: Arc<ServerShared>, id: u64, stream: TcpStream, from: SocketAddr) {
    let mut link = None;
    let end = serve(&shared, id, stream, &mut link);
    if let Some(token) = link {
        let mut links = lock(&shared.links);
        let gone = match links.get_mut(&token) {
            Some(l) => {
                l.conns.remove(&id);
                l.conns.is_empty()
            }
            None => true, // closed by BYE or replaced
        };
        if gone {
            // its fence (if any) is revoked as the record goes
            links.remove(&token);
            drop(links);
            shared.notifies.link_closed(token);
        } else {
            drop(links);
        }
        shared.prune_fences();
    }
    match end {
        ConnEnd::Closed | ConnEnd::Bye => {
            tracing::trace!(parent: &shared.span, %from, reason = %end, "lane closed")
        }
        _ => tracing::debug!(parent: &shared.span, %from, reason = %end, "lane closed"),
    }
}

/// Ends a connection that broke the protocol: tells the peer why, then closes.
fn violation(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    e: WireError,
    deadline: Option<Instant>,
) -> ConnEnd {
    refuse(sock, out, Status::FAILED, &e.to_string(), deadline);
    ConnEnd::Protocol(e)
}

fn refuse(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    status: Status,
    reason: &str,
    deadline: Option<Instant>,
) {
    Refuse {
        status: status.code(),
        reason: reason.to_owned(),
    }
    .encode(out);
    let _ = sock.send_bytes(out, deadline);
}

fn serve(shared: &ServerShared, id: u64, stream: TcpStream, link: &mut Option<u64>) -> ConnEnd {
    let mut sock = Sock::adopt(stream);
    // declared after `sock`, so the connection leaves the table before its socket closes
    let _entry = limits::Entry {
        table: &shared.conns,
        id,
    };
    // the whole handshake, up to the WELCOME, has one deadline
    let handshake = Some(Instant::now() + shared.io_timeout);
    if let Err(e) = sock.stream.set_nodelay(true) {
        return ConnEnd::Io(e);
    }
    if let Err(e) = sock.set_fixed_timeout(shared.io_timeout) {
        return ConnEnd::Io(e);
    }
    sock.set_spin(SERVE_SPIN);
    if let Some(every) = shared.keepalive
        && let Err(e) = sock.set_keepalive(every)
    {
        return ConnEnd::Io(e);
    }
    // handshake frames are small: so is the buffer until the client is welcomed
    let mut inb = Inbound::with_capacity(limits::MAX_HANDSHAKE_FRAME as usize);
    let mut out = Vec::with_capacity(256);
    let io_deadline = || Some(Instant::now() + shared.io_timeout);

    // handshake: the first frame must be HELLO, within the I/O timeout
    let hello = match read_handshake_frame(&mut sock, &mut inb, handshake) {
        Err(e) => return handshake_failed(&mut sock, &mut out, e),
        Ok(Err(e)) => {
            return violation(&mut sock, &mut out, e, io_deadline());
        }
        Ok(Ok((Kind::Hello, p))) => match Hello::decode(p) {
            Ok(h) => h,
            Err(e) => {
                return violation(&mut sock, &mut out, e, io_deadline());
            }
        },
        Ok(Ok((k, _))) => {
            let e = WireError::Unexpected(k);
            refuse(
                &mut sock,
                &mut out,
                Status::FAILED,
                "expected HELLO",
                io_deadline(),
            );
            return ConnEnd::Protocol(e);
        }
    };
    if let Some(key) = &shared.psk {
        let sn = crate::auth::nonce();
        let proof = key.server_proof(&hello.nonce, &sn, &hello.name);
        wire::encode_auth(&mut out, Kind::Challenge, &[&sn, &proof]);
        if let Err(e) = sock.send_bytes(&out, handshake) {
            return handshake_failed(&mut sock, &mut out, e);
        }
        let answer = match read_handshake_frame(&mut sock, &mut inb, handshake) {
            Err(e) => return handshake_failed(&mut sock, &mut out, e),
            Ok(Ok((Kind::Auth, p))) => wire::decode_auth(p, 1).ok().map(|f| f[0]),
            Ok(_) => None,
        };
        if !answer.is_some_and(|a| key.check_client(&hello.nonce, &sn, &hello.name, &a)) {
            let why = format!("engine {:?} failed authentication", hello.name);
            refuse(
                &mut sock,
                &mut out,
                Status::PARAM_INVALID,
                "authentication failed",
                io_deadline(),
            );
            return ConnEnd::Refused(why);
        }
    }
    if let Some(allow) = &shared.allow
        && !allow.contains(&hello.name)
    {
        let why = format!("engine {:?} is not on the allow-list", hello.name);
        refuse(
            &mut sock,
            &mut out,
            Status::PARAM_INVALID,
            &why,
            io_deadline(),
        );
        return ConnEnd::Refused(why);
    }
    if let Err(why) = establish(shared, id) {
        refuse(
            &mut sock,
            &mut out,
            Status::RESOURCE_EXHAUSTED,
            why,
            io_deadline(),
        );
        return ConnEnd::Refused(why.into());
    }
    let same_host = matches!((&hello.host, &shared.host), (Some(c), Some(s)) if c.same_host(s));
    let (token, live, busy, fence) = match hello.role {
        LaneRole::NewLink => {
            // a same-host client gets a fence: one-sided access this server can revoke
            let fence = match &hello.host {
                Some(client) if same_host => match ServerFence::new(client) {
                    Ok(f) => Some(Arc::new(f)),
                    Err(e) => {
                        tracing::debug!(parent: &shared.span, error = %e, "no fence for a same-host client; serving it over tcp");
                        None
                    }
                },
                _ => None,
            };
            let token = loop {
                let t = crate::types::random_u64();
                if t != 0 {
                    break t;
                }
            };
            let mut links = lock(&shared.links);
            // a new link from the same client engine (name and instance) replaces its old one,
            // whose lanes may linger; clients are told apart by name *and* instance, since many
            // client-only engines on one host share the name of its address
            let stale: Vec<u64> = links
                .iter()
                .filter(|(_, l)| l.client == hello.name && l.instance == hello.instance)
                .map(|(t, _)| *t)
                .collect();
            let mut retired = Vec::new();
            for t in stale {
                if let Some(old) = links.remove(&t) {
                    tracing::debug!(parent: &shared.span, server = %shared.name, client = %old.client,
                        instance = old.instance, "replacing the old link of a reconnecting client");
                    old.retire(shared);
                    retired.push(old);
                }
            }
            let rec = LinkRec {
                client: hello.name.clone(),
                instance: hello.instance,
                conns: HashSet::from([id]),
                live: Arc::new(AtomicBool::new(true)),
                busy: Arc::new(AtomicUsize::new(0)),
                device: None,
                fence: fence.clone(),
            };
            let (live, busy) = (rec.live.clone(), rec.busy.clone());
            links.insert(token, rec);
            drop(links);
            if let Some(f) = &fence {
                shared.prune_fences();
                lock(&shared.fences).push(f.clone());
            }
            // nothing of the old link is applied once the new one exists: wait for requests
            // it was applying (each is bounded by the I/O timeout) before welcoming the new one
            for old in retired {
                if !old.drain(shared.io_timeout) {
                    refuse(
                        &mut sock,
                        &mut out,
                        Status::FAILED,
                        "the previous link is still busy",
                        io_deadline(),
                    );
                    return ConnEnd::Refused("the previous link did not drain".into());
                }
            }
            tracing::debug!(parent: &shared.span, client = %hello.name, "link opened");
            (token, live, busy, fence)
        }
        LaneRole::Join => {
            let mut links = lock(&shared.links);
            match links.get_mut(&hello.token) {
                Some(l)
                    if l.instance == hello.instance
                        && l.client == hello.name
                        && l.conns.len() < shared.limits.max_lanes_per_link =>
                {
                    l.conns.insert(id);
                    (hello.token, l.live.clone(), l.busy.clone(), None)
                }
                Some(l) if l.instance == hello.instance && l.client == hello.name => {
                    drop(links);
                    let why = "too many lanes on this link";
                    refuse(
                        &mut sock,
                        &mut out,
                        Status::RESOURCE_EXHAUSTED,
                        why,
                        io_deadline(),
                    );
                    return ConnEnd::Refused(why.into());
                }
                _ => {
                    drop(links);
                    refuse(
                        &mut sock,
                        &mut out,
                        Status::NOT_CONNECTED,
                        "unknown link",
                        io_deadline(),
                    );
                    return ConnEnd::Refused("join to an unknown link".into());
                }
            }
        }
    };
    *link = Some(token);
    Welcome {
        instance: shared.instance,
        token,
        pid: std::process::id(),
        table: match hello.role {
            LaneRole::NewLink => shared.table.entries(fence.is_some()),
            LaneRole::Join => Vec::new(),
        },
        host: if same_host { shared.host } else { None },
        fence: fence.as_ref().map_or(-1, |f| f.fd()),
    }
    .encode(&mut out);
    if let Err(e) = sock.send_bytes(&out, io_deadline()) {
        return ConnEnd::Io(e);
    }

    // a device data path is set up once per link, on the lane that opened it
    let mut device_asked = hello.role != LaneRole::NewLink;
    let mut descs = Vec::new();
    let mut targets = Vec::new();
    let mut iov: Vec<IoVec> = Vec::new();
    loop {
        // between requests a connection keeps no more memory than a small one needs
        trim(&mut inb, &mut descs, &mut targets, &mut iov, &mut out);
        // idle: wait for the next request as long as it takes (shutdown wakes us); once its
        // first byte is in, the whole request has `io_timeout`
        let (frame, deadline) = match read_request(&mut sock, &mut inb, shared.io_timeout) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return ConnEnd::Closed,
            Err(e) => return ConnEnd::Io(e),
            Ok((Err(e), _)) => {
                return violation(&mut sock, &mut out, e, io_deadline());
            }
            Ok((Ok(f), deadline)) => (f, Some(deadline)),
        };
        shared.active.fetch_add(1, Ordering::SeqCst);
        let _guard = ActiveGuard(&shared.active);
        busy.fetch_add(1, Ordering::SeqCst);
        let _busy = ActiveGuard(&busy);
        if !live.load(Ordering::SeqCst) {
            // superseded (or closed) while this request was on its way: apply nothing
            return ConnEnd::Refused("request on a superseded link".into());
        }
        match frame {
            (Kind::Xfer, p) => {
                let (op, req) = match wire::decode_xfer(p, &mut descs) {
                    Ok(x) => x,
                    Err(e) => {
                        return violation(&mut sock, &mut out, e, deadline);
                    }
                };
                if let Err((status, reason)) = validate(&shared.table, op, &descs, &mut targets) {
                    wire::encode_done(&mut out, req, status.code(), &reason);
                    let _ = sock.send_bytes(&out, deadline);
                    if op == TransferOp::Write {
                        // the payload that follows cannot be skipped safely: close the lane
                        return ConnEnd::Refused(reason);
                    }
                    continue;
                }
                match op {
                    TransferOp::Write => {
                        // SAFETY: `validate` checked every target against the frozen table: each
                        // lies inside a registered host region, kept alive by the table's `Arc`s,
                        // whose memory is valid for writes of any bytes (RegistrableMemory /
                        // register_raw contracts).
                        if let Err(e) = unsafe { inb.recv_into(&mut sock, &targets, deadline) } {
                            return ConnEnd::Io(e);
                        }
                        wire::encode_done(&mut out, req, 0, "");
                        if let Err(e) = sock.send_bytes(&out, deadline) {
                            return ConnEnd::Io(e);
                        }
                    }
                    TransferOp::Read => {
                        wire::encode_done(&mut out, req, 0, "");
                        iov.clear();
                        iov.push(IoVec {
                            base: out.as_ptr() as usize,
                            len: out.len(),
                        });
                        iov.extend_from_slice(&targets);
                        // SAFETY: the first iovec is `out`, alive for the call; the others were
                        // validated as above and are valid for reads.
                        if let Err(e) = unsafe { sock.send_all(&mut iov, deadline) } {
                            return ConnEnd::Io(e);
                        }
                    }
                }
            }
            (Kind::Notify, p) => {
                let (req, name, msg) = match wire::decode_notify(p) {
                    Ok(x) => x,
                    Err(e) => {
                        return violation(&mut sock, &mut out, e, deadline);
                    }
                };
                let from = lock(&shared.links)
                    .get(&token)
                    .map(|l| l.client.clone())
                    .unwrap_or_default();
                match shared.notifies.push(token, Notify { from, name, msg }) {
                    Ok(()) => wire::encode_done(&mut out, req, 0, ""),
                    Err(reason) => {
                        wire::encode_done(&mut out, req, Status::RESOURCE_EXHAUSTED.code(), &reason)
                    }
                }
                if let Err(e) = sock.send_bytes(&out, deadline) {
                    return ConnEnd::Io(e);
                }
            }
            (Kind::UcxAsk, p) => {
                if !p.is_empty() {
                    return violation(&mut sock, &mut out, WireError::Trailing(p.len()), deadline);
                }
                let sent = match &shared.ucx {
                    Some(frame) => sock.send_bytes(frame, deadline),
                    None => {
                        wire::encode_done(
                            &mut out,
                            0,
                            Status::UNSUPPORTED.code(),
                            "this engine does not serve over UCX",
                        );
                        sock.send_bytes(&out, deadline)
                    }
                };
                if let Err(e) = sent {
                    return ConnEnd::Io(e);
                }
            }
            (Kind::DeviceHello, p) => {
                if std::mem::replace(&mut device_asked, true) {
                    let e = WireError::Unexpected(Kind::DeviceHello);
                    return violation(&mut sock, &mut out, e, deadline);
                }
                let info = match wire::DeviceInfo::decode(p) {
                    Ok(i) => i,
                    Err(e) => return violation(&mut sock, &mut out, e, deadline),
                };
                let sent = crate::transport::ascend::link::serve(
                    shared.device.as_ref(),
                    &info,
                    shared.table.cores(),
                    &shared.name,
                    &hello.name,
                    |f| sock.send_bytes(f, deadline),
                );
                match sent {
                    Ok(Some(dev)) => {
                        let mut links = lock(&shared.links);
                        if let Some(l) = links.get_mut(&token) {
                            l.device = Some(dev);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return ConnEnd::Io(e),
                }
            }
            (Kind::Ping, p) => {
                if !p.is_empty() {
                    return violation(&mut sock, &mut out, WireError::Trailing(p.len()), deadline);
                }
                if let Err(e) = sock.send_bytes(&wire::header(Kind::Pong, 0), deadline) {
                    return ConnEnd::Io(e);
                }
            }
            (Kind::Bye, p) => {
                if !p.is_empty() {
                    return ConnEnd::Protocol(WireError::Trailing(p.len()));
                }
                let rec = lock(&shared.links).remove(&token);
                if let Some(rec) = rec {
                    rec.live.store(false, Ordering::SeqCst);
                    let conns = lock(&shared.conns);
                    for c in rec
                        .conns
                        .iter()
                        .filter(|&&c| c != id)
                        .filter_map(|c| conns.get(c))
                    {
                        Sock::shutdown(c);
                    }
                    tracing::debug!(parent: &shared.span, client = %rec.client, "link closed by client");
                    drop(rec);
                    shared.prune_fences();
                }
                out.clear();
                out.extend_from_slice(&wire::header(Kind::ByeAck, 0));
                let _ = sock.send_bytes(&out, deadline);
                return ConnEnd::Bye;
            }
            (k, _) => {
                let e = WireError::Unexpected(k);
                return violation(&mut sock, &mut out, e, deadline);
            }
        }
    }
}
