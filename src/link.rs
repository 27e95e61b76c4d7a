//! Links: the capability to transfer with one remote engine.
//!
//! [`Hixl::connect`](crate::Hixl::connect) returns a [`Link`] that *borrows* the connected engine.
//! So a link cannot outlive its engine, the engine cannot leave `Connected` (to deregister memory
//! or finalize) while a link is alive, and `disconnect(self)` consumes the link: using it
//! afterwards does not compile. Several threads may share one link (`&Link` is `Sync`): each
//! transfer takes a lane (TCP connection) of its own.
//!
//! The peer's region table arrives with the link. [`Link::remote`] and [`RemoteRegion::range`]
//! validate remote ranges against it locally; the serving side validates every range again.

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::engine::EngineInner;
use crate::error::{Error, RemoteRefusal, check_timeout};
use crate::memory::{Access, MemType};
use crate::transfer::{TransferDesc, TransferOp};
use crate::transport::tcp::{Lane, LaneFail};
use crate::wire::{self, Hello, LaneRole, TableEntry};

/// Most descriptors in one `transfer_sync` call.
pub const MAX_BATCH: usize = 1 << 20;

struct Pool {
    idle: Vec<Lane>,
    open: usize,
    broken: Option<String>,
    /// Set once the link was closed (by `disconnect` or `Drop`).
    closed: bool,
}

/// A connection to one remote engine, borrowed from the connected engine.
pub struct Link<'e> {
    engine: &'e EngineInner,
    id: u64,
    peer: String,
    addr: SocketAddr,
    token: u64,
    remote_instance: u64,
    remote_pid: u32,
    /// Sorted by address, disjoint (checked when decoded).
    table: Vec<TableEntry>,
    pool: Mutex<Pool>,
    freed: Condvar,
    next_req: AtomicU64,
    span: tracing::Span,
    _engine: PhantomData<&'e ()>,
}

impl fmt::Debug for Link<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .field("remote_instance", &self.remote_instance)
            .field("regions", &self.table.len())
            .finish()
    }
}

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

impl<'e> Link<'e> {
    pub(crate) fn open(
        engine: &'e EngineInner,
        peer: String,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        let deadline = started + timeout;
        let hello = Hello {
            role: LaneRole::NewLink,
            instance: engine.instance,
            token: 0,
            name: engine.name.clone(),
            target: peer.clone(),
        };
        let (lane, welcome) = Lane::open(addr, &hello, deadline)
            .map_err(|f| lane_error(f, "connect", &peer, started, true))?;
        let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!(parent: &engine.span, "link", id, peer = %peer);
        tracing::debug!(parent: &span, regions = welcome.table.len(), remote_instance = welcome.instance,
            elapsed_us = started.elapsed().as_micros() as u64, "connected");
        Ok(Link {
            engine,
            id,
            peer,
            addr,
            token: welcome.token,
            remote_instance: welcome.instance,
            remote_pid: welcome.pid,
            table: welcome.table,
            pool: Mutex::new(Pool {
                idle: vec![lane],
                open: 1,
                broken: None,
                closed: false,
            }),
            freed: Condvar::new(),
            next_req: AtomicU64::new(1),
            span,
            _engine: PhantomData,
        })
    }

    /// The remote engine's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }
    /// This link's id (unique in the process).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The remote engine's per-process instance id (changes when the peer restarts).
    pub fn remote_instance(&self) -> u64 {
        self.remote_instance
    }
    /// The remote engine's process id, as it reported it.
    pub fn remote_pid(&self) -> u32 {
        self.remote_pid
    }
    /// The transport carrying this link's data.
    pub fn transport(&self) -> crate::TransportKind {
        crate::TransportKind::Tcp
    }
    /// Whether the link broke (its peer went away or refused a lane). A broken link stays
    /// broken: disconnect it and connect again.
    pub fn is_broken(&self) -> bool {
        self.lock().broken.is_some()
    }

    /// The peer's registered regions, as it sent them at connect, sorted by address.
    pub fn regions(&self) -> impl ExactSizeIterator<Item = RemoteRegion<'_>> + '_ {
        self.table.iter().map(move |e| RemoteRegion {
            link: self,
            entry: *e,
        })
    }

    /// The peer's region with this id.
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] if the peer's table has no such region.
    pub fn region(&self, id: u32) -> Result<RemoteRegion<'_>, Error> {
        self.table
            .iter()
            .find(|e| e.id == id)
            .map(|e| RemoteRegion {
                link: self,
                entry: *e,
            })
            .ok_or_else(|| Error::RemoteNotRegistered {
                peer: self.peer.clone(),
                addr: 0,
                len: 0,
            })
    }

    /// The remote range `addr..addr+len` in the peer's address space (HIXL's form); it must lie
    /// inside one region of the peer's table.
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] (`PARAM_INVALID`) if it does not, or `len` is zero.
    pub fn remote(&self, addr: u64, len: u64) -> Result<RemoteRange<'_>, Error> {
        let not_registered = || Error::RemoteNotRegistered {
            peer: self.peer.clone(),
            addr,
            len,
        };
        let end = addr
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or_else(not_registered)?;
        let i = self.table.partition_point(|e| e.addr <= addr);
        let e = i
            .checked_sub(1)
            .map(|i| &self.table[i])
            .ok_or_else(not_registered)?;
        if end > e.addr + e.len {
            return Err(not_registered());
        }
        Ok(self.make_range(e, addr - e.addr, len))
    }

    fn make_range(&self, e: &TableEntry, offset: u64, len: u64) -> RemoteRange<'_> {
        RemoteRange {
            link: self.id,
            region: e.id,
            offset,
            len,
            access: e.access,
            _link: PhantomData,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes an idle lane, opens a new one (up to the engine's `max_lanes`), or waits for one.
    fn checkout(
        &self,
        deadline: Instant,
        started: Instant,
        op: &'static str,
    ) -> Result<Lane, Error> {
        let mut pool = self.lock();
        loop {
            if let Some(why) = &pool.broken {
                return Err(Error::NotConnected {
                    peer: self.peer.clone(),
                    why: why.clone(),
                });
            }
            if let Some(l) = pool.idle.pop() {
                return Ok(l);
            }
            if pool.open < self.engine.options.max_lanes {
                pool.open += 1;
                drop(pool);
                let hello = Hello {
                    role: LaneRole::Join,
                    instance: self.engine.instance,
                    token: self.token,
                    name: self.engine.name.clone(),
                    target: self.peer.clone(),
                };
                return match Lane::open(self.addr, &hello, deadline) {
                    Ok((lane, _)) => {
                        tracing::trace!(parent: &self.span, "lane opened");
                        Ok(lane)
                    }
                    Err(f) => {
                        let dead = match &f {
                            LaneFail::Refused { .. } => true,
                            LaneFail::Io(e) => is_gone(e),
                            LaneFail::Protocol(_) => false,
                        };
                        let e = lane_error(f, op, &self.peer, started, false);
                        self.discard(dead.then(|| format!("cannot open a new lane: {e}")));
                        Err(e)
                    }
                };
            }
            let rem = deadline.saturating_duration_since(Instant::now());
            if rem.is_zero() {
                return Err(Error::LanesExhausted {
                    peer: self.peer.clone(),
                    lanes: pool.open,
                });
            }
            pool = self
                .freed
                .wait_timeout(pool, rem)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn checkin(&self, lane: Lane) {
        self.lock().idle.push(lane);
        self.freed.notify_one();
    }

    /// Forgets a dead lane; `broken` marks the whole link unusable.
    fn discard(&self, broken: Option<String>) {
        let mut pool = self.lock();
        pool.open -= 1;
        if let Some(why) = broken {
            if pool.broken.is_none() {
                tracing::debug!(parent: &self.span, why = %why, "link broken");
                pool.broken = Some(why);
            }
            pool.idle.clear();
            self.freed.notify_all();
        } else {
            self.freed.notify_one();
        }
    }

    /// Runs a batch of READ or WRITE descriptors and returns when all have completed (HIXL
    /// `TransferSync`). The batch is sent in one request (up to 65,536 descriptors per frame),
    /// not one round trip per descriptor.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`], [`Error::EmptyBatch`],
    ///   [`Error::BatchTooLarge`], [`Error::ForeignHandle`] (a region of another engine or a
    ///   range of another link), [`Error::LengthMismatch`], [`Error::AccessDenied`] (the peer's
    ///   table forbids `op`), or [`Error::Refused`] when the peer's own validation refuses it;
    /// - `TIMEOUT`: [`Error::Timeout`], and the data of the batch is unspecified;
    /// - `NOT_CONNECTED`: [`Error::NotConnected`] when the peer went away (the link is broken);
    /// - `RESOURCE_EXHAUSTED`: [`Error::LanesExhausted`];
    /// - `FAILED`: [`Error::Io`] or [`Error::Protocol`].
    pub fn transfer_sync(
        &self,
        op: TransferOp,
        descs: &[TransferDesc<'_>],
        timeout: Duration,
    ) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let started = Instant::now();
        let deadline = started + timeout;
        self.validate(op, descs)?;
        let mut lane = self.checkout(deadline, started, op.name())?;
        for chunk in descs.chunks(wire::MAX_DESCS_PER_FRAME) {
            let req = self.next_req.fetch_add(1, Ordering::Relaxed);
            if let Err(f) = lane.xfer(op, req, chunk, deadline) {
                let (usable, broken) = match &f {
                    LaneFail::Refused { usable, .. } => (*usable, None),
                    LaneFail::Io(e) if is_gone(e) => (false, Some(format!("peer went away: {e}"))),
                    _ => (false, None),
                };
                let e = lane_error(f, op.name(), &self.peer, started, false);
                if usable {
                    self.checkin(lane);
                } else {
                    drop(lane);
                    self.discard(broken);
                }
                tracing::trace!(parent: &self.span, %op, descs = descs.len(), error = %e, "transfer failed");
                return Err(e);
            }
        }
        self.checkin(lane);
        tracing::trace!(parent: &self.span, %op, descs = descs.len(), us = started.elapsed().as_micros() as u64, "transfer done");
        Ok(())
    }

    fn validate(&self, op: TransferOp, descs: &[TransferDesc<'_>]) -> Result<(), Error> {
        if descs.is_empty() {
            return Err(Error::EmptyBatch);
        }
        if descs.len() > MAX_BATCH {
            return Err(Error::BatchTooLarge {
                count: descs.len(),
                limit: MAX_BATCH,
            });
        }
        for (index, d) in descs.iter().enumerate() {
            if d.local.core.engine != self.engine.id {
                return Err(Error::ForeignHandle {
                    what: "local region",
                    owner: d.local.core.engine,
                    engine: self.engine.id,
                });
            }
            if d.remote.link != self.id {
                return Err(Error::ForeignHandle {
                    what: "remote range",
                    owner: d.remote.link,
                    engine: self.id,
                });
            }
            if d.local.len as u64 != d.remote.len {
                return Err(Error::LengthMismatch {
                    index,
                    local: d.local.len as u64,
                    remote: d.remote.len,
                });
            }
            if !d.remote.access.permits(op) {
                return Err(Error::AccessDenied {
                    op,
                    region: d.remote.region,
                    access: d.remote.access.name(),
                });
            }
            if d.local.core.mem_type != MemType::Host {
                return Err(Error::UnsupportedMemory {
                    mem_type: d.local.core.mem_type,
                    why: "the tcp transport moves host memory only",
                });
            }
        }
        Ok(())
    }

    /// Closes the link (HIXL `Disconnect`): tells the peer, waits for its acknowledgement up to
    /// `timeout`, and closes every lane. Consumes the link.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`] for a zero timeout (the link is closed anyway); otherwise the
    /// error of the goodbye exchange. The link is closed on the local side in every case.
    pub fn disconnect(self, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        self.close(timeout)
    }

    fn close(&self, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        let deadline = started + timeout;
        let (lane, broken) = {
            let mut pool = self.lock();
            (pool.idle.pop(), pool.broken.is_some())
        };
        let r = match (lane, broken) {
            (_, true) => Ok(()),
            (Some(mut lane), false) => lane
                .bye(deadline)
                .map_err(|f| lane_error(f, "disconnect", &self.peer, started, false)),
            (None, false) => Ok(()),
        };
        {
            let mut pool = self.lock();
            pool.idle.clear();
            pool.broken.get_or_insert_with(|| "disconnected".into());
            pool.closed = true;
        }
        tracing::debug!(parent: &self.span, ok = r.is_ok(), "disconnected");
        r
    }
}

impl Drop for Link<'_> {
    fn drop(&mut self) {
        if !self.lock().closed {
            let _ = self.close(Duration::from_millis(200));
        }
        self.engine.forget_peer(&self.peer);
    }
}

fn is_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof
            | ConnectionReset
            | ConnectionAborted
            | BrokenPipe
            | NotConnected
            | ConnectionRefused
    )
}

fn lane_error(
    f: LaneFail,
    op: &'static str,
    peer: &str,
    started: Instant,
    connecting: bool,
) -> Error {
    match f {
        LaneFail::Refused { status, reason, .. } => Error::Refused {
            op,
            peer: peer.to_owned(),
            refusal: RemoteRefusal { status, reason },
        },
        LaneFail::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            Error::Timeout {
                op,
                peer: peer.to_owned(),
                elapsed: started.elapsed(),
            }
        }
        LaneFail::Io(e) if connecting => Error::ConnectFailed {
            peer: peer.to_owned(),
            source: e,
        },
        LaneFail::Io(e) if is_gone(&e) => Error::NotConnected {
            peer: peer.to_owned(),
            why: format!("peer went away during {op}: {e}"),
        },
        LaneFail::Io(e) => Error::Io {
            op,
            peer: peer.to_owned(),
            source: e,
        },
        LaneFail::Protocol(problem) => Error::Protocol {
            peer: peer.to_owned(),
            problem,
        },
    }
}

/// One region of the peer's table, seen through a link.
#[derive(Clone, Copy)]
pub struct RemoteRegion<'l> {
    link: &'l Link<'l>,
    entry: TableEntry,
}

impl<'l> RemoteRegion<'l> {
    /// The region's id in the peer's table.
    pub fn id(&self) -> u32 {
        self.entry.id
    }
    /// Its start address in the peer's address space.
    pub fn addr(&self) -> u64 {
        self.entry.addr
    }
    /// Its length.
    pub fn len(&self) -> u64 {
        self.entry.len
    }
    /// Always false: empty regions are never registered.
    pub fn is_empty(&self) -> bool {
        self.entry.len == 0
    }
    /// Its memory type.
    pub fn mem_type(&self) -> MemType {
        self.entry.mem_type
    }
    /// What this engine may do with it.
    pub fn access(&self) -> Access {
        self.entry.access
    }
    /// A validated sub-range (offsets relative to the region start).
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] (`PARAM_INVALID`) when it is empty or leaves the region.
    pub fn range(&self, range: impl RangeBounds<u64>) -> Result<RemoteRange<'l>, Error> {
        use std::ops::Bound::*;
        let total = self.entry.len;
        let start = match range.start_bound() {
            Included(&s) => Some(s),
            Excluded(&s) => s.checked_add(1),
            Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Included(&e) => e.checked_add(1),
            Excluded(&e) => Some(e),
            Unbounded => Some(total),
        };
        match (start, end) {
            (Some(s), Some(e)) if s < e && e <= total => {
                Ok(self.link.make_range(&self.entry, s, e - s))
            }
            _ => Err(Error::RangeOutOfBounds {
                region: self.entry.id,
                offset: start.unwrap_or(u64::MAX),
                len: match (start, end) {
                    (Some(s), Some(e)) => e.saturating_sub(s),
                    _ => u64::MAX,
                },
                region_len: total,
            }),
        }
    }
    /// The whole region.
    pub fn full(&self) -> RemoteRange<'l> {
        self.link.make_range(&self.entry, 0, self.entry.len)
    }
}

impl fmt::Debug for RemoteRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRegion")
            .field("id", &self.entry.id)
            .field("addr", &format_args!("{:#x}", self.entry.addr))
            .field("len", &self.entry.len)
            .field("access", &self.entry.access)
            .finish()
    }
}

/// A validated, non-empty range of a region in the peer's table; it borrows its link.
#[derive(Clone, Copy)]
pub struct RemoteRange<'l> {
    pub(crate) link: u64,
    pub(crate) region: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    _link: PhantomData<&'l ()>,
}

impl RemoteRange<'_> {
    /// The peer's region id.
    pub fn region_id(&self) -> u32 {
        self.region
    }
    /// Offset in that region.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Always false: ranges are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for RemoteRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRange")
            .field("link", &self.link)
            .field("region", &self.region)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}
