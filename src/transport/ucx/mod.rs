//! UCX transport (UCP RMA over verbs, tcp or shared memory), loaded at run time.
//!
//! hixl keeps its own control plane: the link is opened over TCP as always (handshake, region
//! table, authentication), then the client asks for the server's UCP worker address and one
//! packed remote key per region (`UCXASK` / `UCXINFO`), connects a UCP endpoint (error mode
//! `PEER`) and moves the bytes with `ucp_put_nbx` / `ucp_get_nbx`, completed by a flush.
//!
//! Safety of the remote keys: over UCX's tcp and shared-memory transports a remote key grants
//! access that UCX does not bound-check. So a serving engine hands out keys only for host regions
//! peers may both read and write, only over authenticated links (UCX requires
//! [`Options::psk`](crate::Options::psk)), and a transfer that touches any other region goes
//! over the link's TCP lanes, where the server checks every descriptor.

mod backend;
pub(crate) use backend::UcxBackend;
pub(crate) mod ffi;
pub(crate) mod ucp;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::types::BatchDesc;
use crate::types::TransferOp;
use crate::types::{Access, MemType, RegionView};
use crate::wire::{TableEntry, UcxInfo};

use crate::sync::lock;
use crate::transport::{Batch, DataPath, Health, PathFail, TransportKind};
use ucp::{
    Context, Endpoint, MemHandle, PendingFlush, SETTLE_BOUND, ThreadMode, Waker, Worker,
    is_no_device,
};

/// The bytes a batch posts before it waits for them to complete (a flush), and between which
/// a cancel stops it: a flush round trip costs about nothing beside 16 MiB, and a cancel waits
/// for at most that much to move.
const CHUNK: usize = 16 << 20;

/// How long the serving progress thread keeps polling after its last event before it sleeps on
/// the worker's event descriptor (tcp needs the target to progress; polling keeps it fast).
const SERVE_POLL: Duration = Duration::from_micros(50);

/// An engine's UCX context (both sides). A context lists the host's network devices once,
/// when it is made; when one of them goes away (a veth removed, a NIC reset), every later
/// worker of that context fails `UCS_ERR_NO_DEVICE`. Then a new context is made on the devices
/// there are, and the engine's later workers (new links, a new serving worker) and memory
/// mappings are made in it; what lived on the old one (links over the lost device) fails with
/// its own status and goes with its last user.
#[derive(Debug)]
pub(crate) struct UcxEngine {
    ctx: Mutex<Context>,
}
impl UcxEngine {
    /// Loads UCX and creates a context (the user's `UCX_*` environment applies).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] without a usable `libucp.so.0`; [`Error::Native`] if UCX
    /// fails.
    pub(crate) fn new() -> Result<Self, Error> {
        Ok(Self {
            ctx: Mutex::new(Context::new()?),
        })
    }

    /// A new worker, in the current context, or in a new one if the current one lost a device.
    ///
    /// # Errors
    /// UCX failures ([`Error::Native`]).
    fn worker(&self) -> Result<Worker, Error> {
        let ctx = lock(&self.ctx).clone();
        match Worker::new(&ctx, ThreadMode::Serialized) {
            Err(e) if is_no_device(&e) => {
                let fresh = self.renew(&ctx)?;
                Worker::new(&fresh, ThreadMode::Serialized)
            }
            r => r,
        }
    }

    /// Replaces `stale` by a new context (unless another caller did already) and returns the
    /// current one.
    fn renew(&self, stale: &Context) -> Result<Context, Error> {
        let mut cur = lock(&self.ctx);
        if cur.same(stale) {
            *cur = Context::new()?;
            tracing::warn!(
                "a network device of the UCX context went away (UCS_ERR_NO_DEVICE): UCX starts \
                 anew on the devices there are"
            );
        }
        Ok(cur.clone())
    }
}

/// The serving side: a worker progressed by its own thread, the regions' memory handles, and
/// the encoded `UCXINFO` frame sent to clients.
pub(crate) struct UcxServer {
    waker: Waker,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    mems: Vec<MemHandle>,
    frame: Vec<u8>,
}

impl std::fmt::Debug for UcxServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxServer")
            .field("regions", &self.mems.len())
            .finish_non_exhaustive()
    }
}

impl UcxServer {
    /// Maps the regions peers may read and write, packs their keys, and starts progressing a
    /// worker.
    ///
    /// # Errors
    /// UCX failures ([`Error::Native`]), or a thread that cannot be spawned ([`Error::Io`]).
    pub(crate) fn start(eng: &UcxEngine, regions: &[RegionView]) -> Result<Self, Error> {
        let worker = eng.worker()?;
        let ctx = worker.context().clone();
        let mut mems = Vec::new();
        let mut rkeys = Vec::new();
        for r in regions
            .iter()
            .filter(|r| r.access == Access::ReadWrite && r.mem_type == MemType::Host)
        {
            // SAFETY: the region is registered host memory, valid for reads and writes by peers
            // while it is registered; the engine stops this server (dropping the handles, which
            // unmaps them) before any region can be deregistered.
            let m = unsafe { ctx.map(r.addr as *mut u8, r.len) }?;
            rkeys.push((r.id, m.packed_rkey().to_vec()));
            mems.push(m);
        }
        let mut frame = Vec::new();
        UcxInfo {
            worker: worker.address().to_vec(),
            rkeys,
        }
        .encode(&mut frame);
        let stop = Arc::new(AtomicBool::new(false));
        let waker = worker.waker();
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hixl-ucx-serve".into())
            .spawn(move || {
                let mut last = Instant::now();
                while !s.load(Ordering::Acquire) {
                    if worker.progress() != 0 {
                        last = Instant::now();
                        continue;
                    }
                    if last.elapsed() < SERVE_POLL {
                        std::hint::spin_loop();
                        continue;
                    }
                    if let Err(e) = worker.wait_event(Some(Duration::from_millis(100))) {
                        tracing::warn!(error = %e, "UCX progress thread: waiting failed");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    last = Instant::now();
                }
            })
            .map_err(|source| Error::Io {
                peer: String::new(),
                op: "spawn the UCX progress thread",
                source,
            })?;
        Ok(Self {
            waker,
            stop,
            thread: Some(thread),
            mems,
            frame,
        })
    }

    /// The encoded `UCXINFO` frame.
    pub(crate) fn frame(&self) -> &[u8] {
        &self.frame
    }
}

impl Drop for UcxServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // the worker is gone with the thread; now the memory handles are unmapped (field drop)
    }
}

/// An engine's own host regions mapped with UCX (`ucp_mem_map`) in one context, for local use
/// only (no key is handed out): passing the mapping with each PUT/GET of a worker of that
/// context lets UCX pick zero-copy protocols.
pub(crate) struct UcxLocal {
    ctx: Context,
    /// Sorted by address, disjoint (regions are).
    mems: Vec<MemHandle>,
}

impl std::fmt::Debug for UcxLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxLocal")
            .field("regions", &self.mems.len())
            .finish()
    }
}

impl UcxLocal {
    /// Maps every host region of the engine in the engine's current context.
    ///
    /// # Errors
    /// UCX failures ([`Error::Native`]).
    pub(crate) fn map(eng: &UcxEngine, regions: &[RegionView]) -> Result<Self, Error> {
        let ctx = lock(&eng.ctx).clone();
        Self::map_in(&ctx, regions)
    }

    /// Maps every host region of the engine in `ctx`.
    fn map_in(ctx: &Context, regions: &[RegionView]) -> Result<Self, Error> {
        let mut mems = Vec::new();
        for r in regions.iter().filter(|r| r.mem_type == MemType::Host) {
            // SAFETY: registered host memory stays valid while the engine is connected; the
            // engine drops these mappings (with its links) before a region can be deregistered.
            mems.push(unsafe { ctx.map(r.addr as *mut u8, r.len) }?);
        }
        mems.sort_by_key(|m| m.addr());
        Ok(Self {
            ctx: ctx.clone(),
            mems,
        })
    }

    /// Whether the mappings are of `ctx` (a worker of another context cannot use them).
    fn of(&self, ctx: &Context) -> bool {
        self.ctx.same(ctx)
    }

    /// The mapping that covers `addr..addr+len`, if any.
    fn find(&self, addr: usize, len: usize) -> Option<&MemHandle> {
        let i = self.mems.partition_point(|m| m.addr() <= addr);
        let m = self.mems.get(i.checked_sub(1)?)?;
        (addr.checked_add(len)? <= m.addr() + m.len()).then_some(m)
    }
}

/// The client side of one link: its own worker and an endpoint to the server's worker, with
/// the server's keys.
pub(crate) struct UcxLink {
    ep: Mutex<Endpoint>,
    /// This engine's mapped regions (zero-copy sources and targets).
    local: Option<Arc<UcxLocal>>,
    /// Region id → (rkey index, the region's address in the server).
    keys: HashMap<u32, (usize, u64)>,
}

impl std::fmt::Debug for UcxLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxLink")
            .field("regions", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl UcxLink {
    /// Connects to the server's worker and unpacks its keys (only for regions of its table).
    ///
    /// # Errors
    /// [`Error::Protocol`] for a malformed address or key, UCX failures otherwise.
    pub(crate) fn connect(
        worker: &Worker,
        peer: &str,
        info: &UcxInfo,
        table: &[TableEntry],
        local: Option<Arc<UcxLocal>>,
    ) -> Result<Self, Error> {
        let local = local.filter(|l| l.of(worker.context()));
        let mut ep = Endpoint::connect(worker, &info.worker, peer)?;
        // the table by id, once: it is sorted by address (`Welcome::decode`), and a search of
        // it per key would cost the square of its size (65,536 regions: 2^31 comparisons)
        let addrs: HashMap<u32, u64> = table.iter().map(|e| (e.id, e.addr)).collect();
        let mut keys = HashMap::with_capacity(info.rkeys.len());
        for (id, packed) in &info.rkeys {
            let Some(&addr) = addrs.get(id) else {
                return Err(Error::Protocol {
                    peer: peer.to_owned(),
                    problem: format!("a UCX key for region {id}, which is not in the table"),
                });
            };
            let idx = ep.add_rkey(packed)?;
            keys.insert(*id, (idx, addr));
        }
        Ok(Self {
            ep: Mutex::new(ep),
            local,
            keys,
        })
    }

    /// Whether the peer's region `region` has a key (otherwise its batches go over TCP).
    pub(crate) fn reaches(&self, region: u32) -> bool {
        self.keys.contains_key(&region)
    }

    /// Whether the endpoint failed (the peer died, a flush timed out).
    pub(crate) fn is_failed(&self) -> bool {
        lock(&self.ep).is_failed()
    }

    /// Moves a batch and waits for it to complete at the peer, by the deadline, in chunks of at
    /// most [`CHUNK`] bytes posted and then flushed; `stop` (a cancel) is looked at between
    /// chunks, once the chunk in flight has completed, so a cancel never tears the endpoint
    /// down with operations pending (UCX 1.13's tcp transport then aborts the process of the
    /// side whose endpoint is destroyed with replies still pending, `uct_tcp_ep_pending_purge`,
    /// `stubs.c:102`: the peer's, for a READ) and the link stays usable. When this returns, UCX
    /// no longer touches the local buffers (a timeout force-closes the endpoint).
    ///
    /// # Safety
    /// Every descriptor's local range must be valid registered memory (readable for WRITE,
    /// writable and unaliased for READ) for the whole call, and inside the peer's region of its
    /// descriptor (checked by the caller against the table).
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Cancelled`], [`Error::NotConnected`] (the peer went away),
    /// [`Error::Native`].
    pub(crate) unsafe fn run(
        &self,
        op: TransferOp,
        xds: &[BatchDesc],
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), Error> {
        let mut ep = lock(&self.ep);
        let mut in_flight = 0usize;
        // the flush of the chunk before the one being posted: at most two chunks in flight, the
        // older one's completion waited for while the newer one's bytes move
        let mut older: Option<PendingFlush> = None;
        for d in xds {
            let Some(&(idx, base)) = self.keys.get(&d.remote.region) else {
                let _ = ep.flush(Some(Instant::now() + SETTLE_BOUND));
                return Err(Error::Protocol {
                    peer: ep.peer().to_owned(),
                    problem: format!("no UCX key for region {}", d.remote.region),
                });
            };
            let len = d.remote.len as usize;
            // the local mapping covering the range, if any (zero-copy)
            let memh = self.local.as_deref().and_then(|l| l.find(d.local, len));
            let mut off = 0;
            while off < len {
                if in_flight >= CHUNK {
                    // this chunk's flush is posted, the one before it completes first; a
                    // cancel then waits for this one too and stops the batch with nothing in
                    // flight
                    let newer = ep.flush_post(Some(deadline))?;
                    if let Some(p) = older.replace(newer) {
                        ep = self.wait_unlocked(ep, p, deadline)?;
                    }
                    in_flight = 0;
                    if stop() {
                        let peer = ep.peer().to_owned();
                        if let Some(p) = older.take() {
                            drop(self.wait_unlocked(ep, p, deadline)?);
                        }
                        return Err(Error::Cancelled {
                            op: "UCX transfer",
                            peer,
                        });
                    }
                }
                let piece = (len - off).min(CHUNK - in_flight);
                let (local, remote) = (d.local + off, base + d.remote.offset + off as u64);
                // SAFETY: the caller guarantees the local range (`memh` covers it, by `find`);
                // the flushes (or a failure, which force-closes the endpoint) end UCX's use of
                // it before this returns.
                let posted = unsafe {
                    match op {
                        TransferOp::Write => {
                            ep.put_in(local as *const u8, piece, remote, idx, memh)
                        }
                        TransferOp::Read => ep.get_in(local as *mut u8, piece, remote, idx, memh),
                    }
                };
                if let Err(e) = posted {
                    // earlier operations may be in flight: end them before returning
                    let _ = ep.flush(Some(Instant::now() + SETTLE_BOUND));
                    return Err(e);
                }
                (off, in_flight) = (off + piece, in_flight + piece);
            }
        }
        let last = ep.flush_post(Some(deadline))?;
        if let Some(p) = older {
            ep = self.wait_unlocked(ep, p, deadline)?;
        }
        self.wait_unlocked(ep, last, deadline).map(drop)
    }

    /// Waits for a posted flush with the endpoint's lock released (another batch on this link
    /// may post meanwhile, overlapping its bytes with this flush's round trip), then ends the
    /// flush under the lock again.
    ///
    /// # Errors
    /// As [`Endpoint::flush`].
    fn wait_unlocked<'a>(
        &'a self,
        ep: MutexGuard<'a, Endpoint>,
        pending: PendingFlush,
        deadline: Instant,
    ) -> Result<MutexGuard<'a, Endpoint>, Error> {
        drop(ep);
        let outcome = pending.wait(Some(deadline));
        let mut ep = lock(&self.ep);
        ep.flush_end(outcome)?;
        Ok(ep)
    }
}
impl DataPath for UcxLink {
    fn kind(&self) -> TransportKind {
        TransportKind::Ucx
    }

    fn reaches(&self, region: u32) -> bool {
        UcxLink::reaches(self, region)
    }

    fn fenced(&self) -> bool {
        true
    }

    fn refused_when_broken(&self) -> bool {
        true
    }

    fn health(&self) -> Health {
        if self.is_failed() {
            Health::Failed("the UCX endpoint failed (peer unreachable)".into())
        } else {
            Health::Unknown
        }
    }

    /// A failure or a timeout poisons the link (the endpoint is closed: HIXL's rule, reconnect
    /// to go on). A cancel stops the batch between chunks and leaves the link usable.
    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        batch.start(None)?;
        let stop = || batch.cancel_requested() || batch.given_up();
        // a block batch as descriptors: UCX posts one operation each
        let xds = batch.descs.expand();
        // SAFETY: the caller's promise is `UcxLink::run`'s; `run` ends UCX's use of the
        // buffers before it returns.
        let r = unsafe { UcxLink::run(self, batch.op, &xds, batch.deadline, &stop) };
        r.map_err(|e| match e {
            Error::Cancelled { .. } => PathFail::Failed(e),
            e => PathFail::Poisoned {
                why: format!("UCX transfer failed: {e}"),
                error: e,
            },
        })
    }
}
