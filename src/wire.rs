//! The hixl wire protocol: one versioned, length-prefixed binary format for the handshake, the
//! region-table exchange, transfers and disconnect.
//!
//! Every frame starts with a 12-byte header: magic `"HIXL"`, version (u16), kind (u16) and the
//! payload length (u32), all little-endian. Bulk data (WRITE payloads, READ replies) follows its
//! frame raw and is not counted in the frame length: its size is the sum of the descriptor
//! lengths, which the receiver has validated before it reads or writes a byte of it.
//!
//! The decoder never trusts a length: every field is bounds-checked, counts are capped, and a
//! frame that is not consumed exactly is an error.

use crate::types::{Access, MemType, TransferOp};

/// `"HIXL"` in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HIXL");
/// The protocol version this build speaks.
pub const VERSION: u16 = 2;
/// Header size in bytes.
pub const HEADER_LEN: usize = 12;
/// Largest frame payload accepted (the bulk data that follows a frame is not limited by this).
pub const MAX_FRAME: u32 = 8 << 20;
/// Most descriptors in one XFER frame.
pub const MAX_DESCS_PER_FRAME: usize = 65_536;
/// Most regions in one WELCOME table.
pub const MAX_TABLE: usize = 65_536;
/// Longest engine name or reason string.
pub const MAX_STR: usize = 1024;
/// Bytes per encoded descriptor.
pub const DESC_LEN: usize = 20;
/// Bytes per encoded region-table entry.
pub const ENTRY_LEN: usize = 26;

pub use crate::types::{HostId, WireDesc};

fn put_host(out: &mut Vec<u8>, h: &Option<HostId>) {
    match h {
        None => out.push(0),
        Some(h) => {
            out.push(1);
            out.extend_from_slice(&h.boot);
            out.extend_from_slice(&h.pidns.to_le_bytes());
            out.extend_from_slice(&h.pid.to_le_bytes());
            out.extend_from_slice(&h.start.to_le_bytes());
        }
    }
}

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Client → server: open a link, or join a lane to one.
    Hello = 1,
    /// Server → client: accepted; carries the region table for a new link.
    Welcome = 2,
    /// Either way: refused, with a status and a reason; the connection closes.
    Refuse = 3,
    /// Client → server: a batch of descriptors (WRITE data follows).
    Xfer = 4,
    /// Server → client: a batch is done (READ data follows on success).
    Done = 5,
    /// Client → server: close the link.
    Bye = 6,
    /// Server → client: the link is closed.
    ByeAck = 7,
    /// Client → server: a notification (name and message); answered with DONE.
    Notify = 8,
    /// Server → client: prove the pre-shared key (server nonce and the server's proof).
    Challenge = 9,
    /// Client → server: the client's proof of the pre-shared key.
    Auth = 10,
    /// Client → server: are you there? (heartbeat; answered with PONG)
    Ping = 11,
    /// Server → client: the answer to PING.
    Pong = 12,
    /// Client → server: send your UCX worker address and remote keys (empty payload).
    UcxAsk = 13,
    /// Server → client: the UCX worker address and one packed remote key per region.
    UcxInfo = 14,
    /// Client → server, on a new link's first lane: the client's device (Ascend backend), to
    /// set up a device data path; answered with DEVICE_WELCOME, then DONE (request 0) once the
    /// server's side of the data path is ready.
    DeviceHello = 15,
    /// Server → client: the server's device, or why it has none (a status other than 0).
    DeviceWelcome = 16,
}

impl Kind {
    /// Every frame kind.
    pub const ALL: [Kind; 16] = [
        Kind::Hello,
        Kind::Welcome,
        Kind::Refuse,
        Kind::Xfer,
        Kind::Done,
        Kind::Bye,
        Kind::ByeAck,
        Kind::Notify,
        Kind::Challenge,
        Kind::Auth,
        Kind::Ping,
        Kind::Pong,
        Kind::UcxAsk,
        Kind::UcxInfo,
        Kind::DeviceHello,
        Kind::DeviceWelcome,
    ];

    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Welcome,
            3 => Self::Refuse,
            4 => Self::Xfer,
            5 => Self::Done,
            6 => Self::Bye,
            7 => Self::ByeAck,
            8 => Self::Notify,
            9 => Self::Challenge,
            10 => Self::Auth,
            11 => Self::Ping,
            12 => Self::Pong,
            13 => Self::UcxAsk,
            14 => Self::UcxInfo,
            15 => Self::DeviceHello,
            16 => Self::DeviceWelcome,
            _ => return None,
        })
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The first four bytes are not `"HIXL"`.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// A version this build does not speak.
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u16),
    /// A frame longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u32),
    /// The frame ends before a field.
    #[error("truncated frame: {0}")]
    Truncated(&'static str),
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// A count or string length above its limit.
    #[error("{what} of {got} exceeds the limit {limit}")]
    OverLimit {
        /// The field.
        what: &'static str,
        /// The value received.
        got: u64,
        /// The limit.
        limit: u64,
    },
    /// A field with a value outside its domain.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// A frame kind that is not allowed at this point.
    #[error("unexpected {0:?} frame")]
    Unexpected(Kind),
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The frame kind.
    pub kind: Kind,
    /// The payload length.
    pub len: u32,
}

/// Encodes a header.
pub fn header(kind: Kind, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    h[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Decodes and checks a header.
///
/// # Errors
/// A [`WireError`] for a bad magic, version, kind or length.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    let k = u16::from_le_bytes([b[6], b[7]]);
    let kind = Kind::from_u16(k).ok_or(WireError::UnknownKind(k))?;
    let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if len > MAX_FRAME {
        return Err(WireError::TooLarge(len));
    }
    Ok(Header { kind, len })
}

/// A bounds-checked reader over a frame payload.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated(what))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(WireError::Truncated(what))?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes(s.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        let s = self.take(8, what)?;
        Ok(u64::from_le_bytes(s.try_into().expect("8 bytes")))
    }
    fn string(&mut self, what: &'static str) -> Result<String, WireError> {
        let n = self.u16(what)? as usize;
        if n > MAX_STR {
            return Err(WireError::OverLimit {
                what,
                got: n as u64,
                limit: MAX_STR as u64,
            });
        }
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| WireError::Invalid(what))
    }
    fn count(&mut self, what: &'static str, limit: usize, each: usize) -> Result<usize, WireError> {
        let n = self.u32(what)? as usize;
        if n > limit {
            return Err(WireError::OverLimit {
                what,
                got: n as u64,
                limit: limit as u64,
            });
        }
        // the entries must fit in what is left, before anything is allocated for them
        if n.saturating_mul(each) > self.buf.len() - self.pos {
            return Err(WireError::Truncated(what));
        }
        Ok(n)
    }
    fn host(&mut self) -> Result<Option<HostId>, WireError> {
        match self.u8("host flag")? {
            0 => Ok(None),
            1 => Ok(Some(HostId {
                boot: self.take(16, "boot id")?.try_into().expect("16 bytes"),
                pidns: self.u64("pid namespace")?,
                pid: self.u32("pid")?,
                start: self.u64("start time")?,
            })),
            _ => Err(WireError::Invalid("host flag")),
        }
    }
    fn finish(self) -> Result<(), WireError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(MAX_STR)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

/// Starts a frame in `out` (cleared); finish it with [`seal`].
pub fn begin(out: &mut Vec<u8>, kind: Kind) {
    out.clear();
    out.extend_from_slice(&header(kind, 0));
}

/// Writes the payload length into a frame begun with [`begin`].
pub fn seal(out: &mut [u8]) {
    let len = (out.len() - HEADER_LEN) as u32;
    out[8..12].copy_from_slice(&len.to_le_bytes());
}

/// Whether a HELLO opens a new link or joins a lane to an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneRole {
    /// The first lane of a new link; the server answers with its region table.
    NewLink,
    /// Another lane of the link identified by the token.
    Join,
}

/// Client → server greeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// New link or additional lane.
    pub role: LaneRole,
    /// The client engine's per-process instance id.
    pub instance: u64,
    /// The link token (for [`LaneRole::Join`]; 0 otherwise).
    pub token: u64,
    /// The client's engine name.
    pub name: String,
    /// The engine name the client believes it is talking to.
    pub target: String,
    /// The client process, for same-host transfers (`None` if it does not offer them).
    pub host: Option<HostId>,
    /// A fresh random nonce, for peer authentication.
    pub nonce: [u8; 32],
}

impl Hello {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::Hello);
        out.push(match self.role {
            LaneRole::NewLink => 0,
            LaneRole::Join => 1,
        });
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        put_str(out, &self.name);
        put_str(out, &self.target);
        put_host(out, &self.host);
        out.extend_from_slice(&self.nonce);
        seal(out);
    }
    /// Decodes a HELLO payload.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let role = match r.u8("lane role")? {
            0 => LaneRole::NewLink,
            1 => LaneRole::Join,
            _ => return Err(WireError::Invalid("lane role")),
        };
        let h = Hello {
            role,
            instance: r.u64("instance")?,
            token: r.u64("token")?,
            name: r.string("name")?,
            target: r.string("target")?,
            host: r.host()?,
            nonce: r.take(32, "nonce")?.try_into().expect("32 bytes"),
        };
        r.finish()?;
        Ok(h)
    }
}

/// One entry of a region table, as a peer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    /// Region id.
    pub id: u32,
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Memory type.
    pub mem_type: MemType,
    /// Remote access rights.
    pub access: Access,
    /// The owner's descriptor of the sealed memfd behind the region, for same-host peers
    /// (`-1`: none, or not offered to this peer).
    pub fd: i32,
}

/// [`TableEntry::fd`] of a region same-host peers must reach over TCP (no one-sided access).
pub const FD_TCP_ONLY: i32 = -2;

/// Server → client acceptance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// The server engine's per-process instance id.
    pub instance: u64,
    /// The link token, for joining more lanes and for BYE.
    pub token: u64,
    /// The server's process id (informational; used by same-host transports).
    pub pid: u32,
    /// The server's region table (empty for joined lanes).
    pub table: Vec<TableEntry>,
    /// The server process, for same-host transfers (`None` if it does not offer them).
    pub host: Option<HostId>,
    /// The server's descriptor of this link's fence page (same-host one-sided access it can
    /// revoke), or `-1`.
    pub fence: i32,
}

impl Welcome {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::Welcome);
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&(self.table.len() as u32).to_le_bytes());
        for e in &self.table {
            out.extend_from_slice(&e.id.to_le_bytes());
            out.extend_from_slice(&e.addr.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.push(e.mem_type as u8);
            out.push(e.access as u8);
            out.extend_from_slice(&e.fd.to_le_bytes());
        }
        put_host(out, &self.host);
        out.extend_from_slice(&self.fence.to_le_bytes());
        seal(out);
    }
    /// Decodes a WELCOME payload and checks the table: lengths non-zero, no overflow, ids unique,
    /// ranges sorted by address and disjoint.
    ///
    /// # Errors
    /// A [`WireError`] if the payload or the table is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let instance = r.u64("instance")?;
        let token = r.u64("token")?;
        let pid = r.u32("pid")?;
        let n = r.count("region count", MAX_TABLE, ENTRY_LEN)?;
        let mut table = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32("region id")?;
            let addr = r.u64("region addr")?;
            let len = r.u64("region len")?;
            let mem_type =
                MemType::from_u8(r.u8("mem type")?).ok_or(WireError::Invalid("mem type"))?;
            let access = Access::from_u8(r.u8("access")?).ok_or(WireError::Invalid("access"))?;
            let fd = r.u32("region fd")? as i32;
            if len == 0 || addr.checked_add(len).is_none() {
                return Err(WireError::Invalid("region range"));
            }
            table.push(TableEntry {
                id,
                addr,
                len,
                mem_type,
                access,
                fd,
            });
        }
        let host = r.host()?;
        let fence = r.u32("fence fd")? as i32;
        r.finish()?;
        let mut ids: Vec<u32> = table.iter().map(|e| e.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(WireError::Invalid("duplicate region id"));
        }
        table.sort_by_key(|e| e.addr);
        if table.windows(2).any(|w| w[0].addr + w[0].len > w[1].addr) {
            return Err(WireError::Invalid("overlapping regions"));
        }
        Ok(Welcome {
            instance,
            token,
            pid,
            table,
            host,
            fence,
        })
    }
}

/// A device announcement (DEVICE_HELLO and DEVICE_WELCOME): what a peer needs to build the
/// two-rank HCCL rank table of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// 0, or the HIXL status code of why the sender has no device data path.
    pub status: u32,
    /// The device (physical) id.
    pub device_id: u32,
    /// The device's RoCE address (`/etc/hccn.conf` `address_<id>`, or an option).
    pub device_ip: String,
    /// The host's address (the rank table's `server_id`).
    pub host_ip: String,
    /// How long the sender waits for the data path to be ready, in milliseconds.
    pub timeout_ms: u32,
    /// Why not (with a non-zero status).
    pub reason: String,
}

impl DeviceInfo {
    /// Encodes the frame (`kind` is [`Kind::DeviceHello`] or [`Kind::DeviceWelcome`]).
    pub fn encode(&self, kind: Kind, out: &mut Vec<u8>) {
        begin(out, kind);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.device_id.to_le_bytes());
        put_str(out, &self.device_ip);
        put_str(out, &self.host_ip);
        out.extend_from_slice(&self.timeout_ms.to_le_bytes());
        put_str(out, &self.reason);
        seal(out);
    }
    /// Decodes a DEVICE_HELLO or DEVICE_WELCOME payload.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let d = DeviceInfo {
            status: r.u32("status")?,
            device_id: r.u32("device id")?,
            device_ip: r.string("device ip")?,
            host_ip: r.string("host ip")?,
            timeout_ms: r.u32("timeout")?,
            reason: r.string("reason")?,
        };
        r.finish()?;
        Ok(d)
    }
}

/// A refusal: status code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refuse {
    /// HIXL status code.
    pub status: u32,
    /// Why.
    pub reason: String,
}

impl Refuse {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::Refuse);
        out.extend_from_slice(&self.status.to_le_bytes());
        put_str(out, &self.reason);
        seal(out);
    }
    /// Decodes a REFUSE payload.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let f = Refuse {
            status: r.u32("status")?,
            reason: r.string("reason")?,
        };
        r.finish()?;
        Ok(f)
    }
}

/// Encodes an XFER frame header and its descriptors into `out`.
pub fn encode_xfer(
    out: &mut Vec<u8>,
    op: TransferOp,
    req: u64,
    descs: impl ExactSizeIterator<Item = WireDesc>,
) {
    begin(out, Kind::Xfer);
    out.push(op as u8);
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&(descs.len() as u32).to_le_bytes());
    for d in descs {
        out.extend_from_slice(&d.region.to_le_bytes());
        out.extend_from_slice(&d.offset.to_le_bytes());
        out.extend_from_slice(&d.len.to_le_bytes());
    }
    seal(out);
}

/// Decodes an XFER payload into `descs` (cleared first); returns the op and request id.
///
/// # Errors
/// A [`WireError`] if the payload is malformed or holds no descriptor.
pub fn decode_xfer(p: &[u8], descs: &mut Vec<WireDesc>) -> Result<(TransferOp, u64), WireError> {
    let mut r = Reader::new(p);
    let op = TransferOp::from_u8(r.u8("op")?).ok_or(WireError::Invalid("op"))?;
    let req = r.u64("request id")?;
    let n = r.count("descriptor count", MAX_DESCS_PER_FRAME, DESC_LEN)?;
    if n == 0 {
        return Err(WireError::Invalid("empty batch"));
    }
    descs.clear();
    descs.reserve(n);
    for _ in 0..n {
        descs.push(WireDesc {
            region: r.u32("desc region")?,
            offset: r.u64("desc offset")?,
            len: r.u64("desc len")?,
        });
    }
    r.finish()?;
    Ok((op, req))
}

/// Encodes a DONE frame.
pub fn encode_done(out: &mut Vec<u8>, req: u64, status: u32, reason: &str) {
    begin(out, Kind::Done);
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&status.to_le_bytes());
    put_str(out, reason);
    seal(out);
}

/// Decodes a DONE payload: request id, status and reason.
///
/// # Errors
/// A [`WireError`] if the payload is malformed.
pub fn decode_done(p: &[u8]) -> Result<(u64, u32, String), WireError> {
    let mut r = Reader::new(p);
    let req = r.u64("request id")?;
    let status = r.u32("status")?;
    let reason = r.string("reason")?;
    r.finish()?;
    Ok((req, status, reason))
}

/// Encodes a NOTIFY frame (name and message are cut at [`MAX_STR`] bytes; callers check first).
pub fn encode_notify(out: &mut Vec<u8>, req: u64, name: &str, msg: &str) {
    begin(out, Kind::Notify);
    out.extend_from_slice(&req.to_le_bytes());
    put_str(out, name);
    put_str(out, msg);
    seal(out);
}

/// Decodes a NOTIFY payload: request id, name and message.
///
/// # Errors
/// A [`WireError`] if the payload is malformed.
pub fn decode_notify(p: &[u8]) -> Result<(u64, String, String), WireError> {
    let mut r = Reader::new(p);
    let req = r.u64("request id")?;
    let name = r.string("notify name")?;
    let msg = r.string("notify message")?;
    r.finish()?;
    Ok((req, name, msg))
}

/// Encodes a CHALLENGE or AUTH frame: 32-byte fields, as given.
pub fn encode_auth(out: &mut Vec<u8>, kind: Kind, fields: &[&[u8; 32]]) {
    begin(out, kind);
    for f in fields {
        out.extend_from_slice(&f[..]);
    }
    seal(out);
}

/// Decodes a CHALLENGE (`n == 2`: server nonce, proof) or AUTH (`n == 1`: proof) payload.
///
/// # Errors
/// A [`WireError`] if the payload is not `n` 32-byte fields.
pub fn decode_auth(p: &[u8], n: usize) -> Result<Vec<[u8; 32]>, WireError> {
    let mut r = Reader::new(p);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(r.take(32, "auth field")?.try_into().expect("32 bytes"));
    }
    r.finish()?;
    Ok(v)
}

/// The longest UCX worker address or packed remote key accepted (UCX's are a few hundred bytes).
pub const MAX_UCX_BLOB: usize = 64 << 10;

/// Server → client: what a UCX client needs to reach the server's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxInfo {
    /// The server's UCP worker address (opaque bytes from `ucp_worker_get_address`).
    pub worker: Vec<u8>,
    /// Region id → its packed remote key (opaque bytes from `ucp_rkey_pack`).
    pub rkeys: Vec<(u32, Vec<u8>)>,
}

impl UcxInfo {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::UcxInfo);
        out.extend_from_slice(&(self.worker.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.worker);
        out.extend_from_slice(&(self.rkeys.len() as u32).to_le_bytes());
        for (id, k) in &self.rkeys {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
        }
        seal(out);
    }

    /// Decodes a UCXINFO payload: blobs non-empty and at most [`MAX_UCX_BLOB`] bytes, region ids
    /// unique.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let blob = |r: &mut Reader<'_>, what: &'static str| -> Result<Vec<u8>, WireError> {
            let n = r.u32(what)? as usize;
            if n == 0 || n > MAX_UCX_BLOB {
                return Err(WireError::Invalid(what));
            }
            Ok(r.take(n, what)?.to_vec())
        };
        let worker = blob(&mut r, "ucx worker address")?;
        let n = r.count("rkey count", MAX_TABLE, 9)?;
        let mut rkeys = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32("region id")?;
            rkeys.push((id, blob(&mut r, "ucx rkey")?));
        }
        r.finish()?;
        let mut ids: Vec<u32> = rkeys.iter().map(|(i, _)| *i).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(WireError::Invalid("duplicate region id"));
        }
        Ok(UcxInfo { worker, rkeys })
    }
}

/// Decodes any frame payload of `kind`, for fuzzing and property tests: `Ok` means the decoder
/// accepted it, and nothing it does may panic.
///
/// # Errors
/// The decoder's [`WireError`].
pub fn decode_any(kind: Kind, p: &[u8]) -> Result<(), WireError> {
    match kind {
        Kind::Hello => Hello::decode(p).map(drop),
        Kind::Welcome => Welcome::decode(p).map(drop),
        Kind::Refuse => Refuse::decode(p).map(drop),
        Kind::Xfer => decode_xfer(p, &mut Vec::new()).map(drop),
        Kind::Done => decode_done(p).map(drop),
        Kind::Notify => decode_notify(p).map(drop),
        Kind::Challenge => decode_auth(p, 2).map(drop),
        Kind::Auth => decode_auth(p, 1).map(drop),
        Kind::UcxInfo => UcxInfo::decode(p).map(drop),
        Kind::Bye | Kind::ByeAck | Kind::Ping | Kind::Pong | Kind::UcxAsk => {
            Reader::new(p).finish()
        }
        Kind::DeviceHello | Kind::DeviceWelcome => DeviceInfo::decode(p).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(frame: &[u8]) -> (Header, &[u8]) {
        let h = decode_header(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.len as usize, frame.len() - HEADER_LEN);
        (h, &frame[HEADER_LEN..])
    }

    #[test]
    fn device_info_round_trip_and_hostile_payloads() {
        let info = DeviceInfo {
            status: 0,
            device_id: 7,
            device_ip: "192.168.1.9".into(),
            host_ip: "10.0.0.2".into(),
            timeout_ms: 5000,
            reason: String::new(),
        };
        let mut out = Vec::new();
        info.encode(Kind::DeviceHello, &mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::DeviceHello);
        assert_eq!(DeviceInfo::decode(p).unwrap(), info);
        // every truncation is an error, never a panic
        for n in 0..p.len() {
            assert!(DeviceInfo::decode(&p[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut long = p.to_vec();
        long.push(0);
        assert!(DeviceInfo::decode(&long).is_err(), "trailing bytes");
        // a string length past MAX_STR, and bytes that are not UTF-8
        let mut over = 0u32.to_le_bytes().to_vec();
        over.extend_from_slice(&0u32.to_le_bytes());
        over.extend_from_slice(&((MAX_STR + 1) as u16).to_le_bytes());
        over.extend(std::iter::repeat_n(b'1', MAX_STR + 1));
        assert!(matches!(
            DeviceInfo::decode(&over),
            Err(WireError::OverLimit { .. })
        ));
        let mut bad = 0u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&0u32.to_le_bytes());
        bad.extend_from_slice(&2u16.to_le_bytes());
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert!(DeviceInfo::decode(&bad).is_err());
        // strings that are not addresses decode (the device link refuses them), unchanged
        let odd = DeviceInfo {
            device_ip: r#"1.2.3.4","rank_id":"0"#.into(),
            host_ip: "x".repeat(MAX_STR),
            ..info
        };
        odd.encode(Kind::DeviceWelcome, &mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::DeviceWelcome);
        assert_eq!(DeviceInfo::decode(p).unwrap(), odd);
    }

    #[test]
    fn ucx_info_round_trip_and_limits() {
        let info = UcxInfo {
            worker: vec![1, 2, 3],
            rkeys: vec![(4, vec![9; 40]), (7, vec![8; 1])],
        };
        let mut out = Vec::new();
        info.encode(&mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::UcxInfo);
        assert_eq!(UcxInfo::decode(p).unwrap(), info);
        // a duplicate id, an empty blob, an oversized blob, a count past the payload
        let dup = UcxInfo {
            worker: vec![1],
            rkeys: vec![(4, vec![1]), (4, vec![2])],
        };
        out.clear();
        dup.encode(&mut out);
        assert_eq!(
            UcxInfo::decode(payload(&out).1),
            Err(WireError::Invalid("duplicate region id"))
        );
        let mut p = Vec::new();
        p.extend_from_slice(&0u32.to_le_bytes());
        assert!(UcxInfo::decode(&p).is_err());
        let mut p = Vec::new();
        p.extend_from_slice(&((MAX_UCX_BLOB + 1) as u32).to_le_bytes());
        assert!(UcxInfo::decode(&p).is_err());
        let mut p = Vec::new();
        p.extend_from_slice(&1u32.to_le_bytes());
        p.push(5);
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(UcxInfo::decode(&p).is_err());
    }

    #[test]
    fn hello_round_trip() {
        let h = Hello {
            role: LaneRole::Join,
            instance: 7,
            token: 99,
            name: "10.0.0.1:5".into(),
            target: "[::1]:6".into(),
            host: Some(HostId {
                boot: [7; 16],
                pidns: 4_026_531_836,
                pid: 42,
                start: 99,
            }),
            nonce: [9; 32],
        };
        let mut out = Vec::new();
        h.encode(&mut out);
        let (hd, p) = payload(&out);
        assert_eq!(hd.kind, Kind::Hello);
        assert_eq!(Hello::decode(p).unwrap(), h);
        // every truncation is an error, never a panic
        for cut in 0..p.len() {
            assert!(Hello::decode(&p[..cut]).is_err());
        }
        let mut longer = p.to_vec();
        longer.push(0);
        assert_eq!(Hello::decode(&longer), Err(WireError::Trailing(1)));
    }

    #[test]
    fn welcome_checks_the_table() {
        let e = |id, addr, len| TableEntry {
            id,
            addr,
            len,
            mem_type: MemType::Host,
            access: Access::ReadWrite,
            fd: -1,
        };
        let w = Welcome {
            instance: 1,
            token: 2,
            pid: 3,
            table: vec![e(0, 4096, 100), e(1, 8192, 10)],
            host: None,
            fence: 7,
        };
        let mut out = Vec::new();
        w.encode(&mut out);
        assert_eq!(Welcome::decode(payload(&out).1).unwrap(), w);
        for (bad, why) in [
            (vec![e(0, 4096, 100), e(1, 4100, 10)], "overlapping regions"),
            (vec![e(0, 4096, 100), e(0, 9000, 10)], "duplicate region id"),
            (vec![e(0, 4096, 0)], "region range"),
            (vec![e(0, u64::MAX, 2)], "region range"),
        ] {
            let mut out = Vec::new();
            Welcome {
                table: bad,
                ..w.clone()
            }
            .encode(&mut out);
            assert_eq!(
                Welcome::decode(payload(&out).1),
                Err(WireError::Invalid(why))
            );
        }
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut p = Vec::new();
        p.push(1u8);
        p.extend_from_slice(&5u64.to_le_bytes());
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_xfer(&p, &mut Vec::new()),
            Err(WireError::OverLimit { .. })
        ));
        let mut p = Vec::new();
        p.push(1u8);
        p.extend_from_slice(&5u64.to_le_bytes());
        p.extend_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            decode_xfer(&p, &mut Vec::new()),
            Err(WireError::Truncated("descriptor count"))
        );
    }

    #[test]
    fn headers_are_checked() {
        let mut h = header(Kind::Bye, 0);
        assert!(decode_header(&h).is_ok());
        h[6] = 99;
        assert_eq!(decode_header(&h), Err(WireError::UnknownKind(99)));
        let mut h = header(Kind::Bye, 0);
        h[4] = 1;
        assert_eq!(decode_header(&h), Err(WireError::BadVersion(1)));
        let h = header(Kind::Xfer, MAX_FRAME as usize + 1);
        assert_eq!(decode_header(&h), Err(WireError::TooLarge(MAX_FRAME + 1)));
        let mut h = header(Kind::Bye, 0);
        h[0] = b'X';
        assert!(matches!(decode_header(&h), Err(WireError::BadMagic(_))));
    }

    /// Property: random bytes never make any decoder panic, and whatever decodes re-encodes to
    /// the same bytes (for the kinds with a canonical encoding).
    #[test]
    fn decoders_survive_random_input() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let kinds = Kind::ALL;
        let mut accepted = 0;
        for i in 0..200_000 {
            let len = (next() % 96) as usize;
            let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // bias toward plausible frames: small counts and string lengths
            if len > 20 && i % 2 == 0 {
                p[17] = 0;
                p[18] = 0;
                p[19] &= 3;
            }
            let kind = kinds[(next() % kinds.len() as u64) as usize];
            if decode_any(kind, &p).is_ok() {
                accepted += 1;
                if kind == Kind::Xfer {
                    let mut d = Vec::new();
                    let (op, req) = decode_xfer(&p, &mut d).unwrap();
                    let mut out = Vec::new();
                    encode_xfer(&mut out, op, req, d.iter().copied());
                    assert_eq!(&out[HEADER_LEN..], &p[..]);
                }
            }
        }
        assert!(
            accepted > 0,
            "the property test never produced a valid frame"
        );
    }
}
