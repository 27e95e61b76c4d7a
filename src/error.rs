//! HIXL status codes and the crate's error type.
//!
//! Every failure is one variant of [`Error`], with the context a caller needs (peer, region,
//! descriptor index, operation) and its cause. [`Error::status`] maps each variant onto the numeric
//! status code HIXL would return, so code written against HIXL's codes keeps working.

mod handed;
mod status;

use std::io;
use std::time::Duration;

pub use handed::HandedBack;
pub use status::{RemoteRefusal, Status};

use crate::types::MemType;
use crate::types::TransferOp;

/// Every error hixl returns.
///
/// Match on the variant for the details, or call [`Error::status`] for HIXL's numeric code and
/// [`Error::is_retryable`] to decide whether trying again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine name is not `ip`, `ip:port`, `[ipv6]` or `[ipv6]:port`.
    #[error("invalid engine name {name:?}: {problem}")]
    InvalidEngineName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// An option key HIXL does not define (HIXL answers `PARAM_INVALID`).
    #[error("unknown option key {key:?}")]
    UnknownOption {
        /// The key as given.
        key: String,
    },
    /// A valid option value this build cannot honour.
    #[error("option {key}={value} is not supported: {why}")]
    UnsupportedOption {
        /// The option key.
        key: String,
        /// The value as given.
        value: String,
        /// Why not.
        why: &'static str,
    },
    /// An option value outside its documented range or format.
    #[error("invalid value {value:?} for option {key}: {problem}")]
    InvalidOption {
        /// The option key.
        key: String,
        /// The value as given.
        value: String,
        /// The documented constraint.
        problem: &'static str,
    },
    /// A timeout of zero (HIXL: `timeout_in_millis <= 0`).
    #[error("timeout must be positive, got {millis} ms")]
    InvalidTimeout {
        /// The timeout in milliseconds as given.
        millis: i64,
    },
    /// A region of zero bytes.
    #[error("cannot register a zero-length region")]
    ZeroLengthRegion,
    /// A null address was registered.
    #[error("cannot register a null address")]
    NullAddress,
    /// `addr + len` overflows the address space.
    #[error("region {addr:#x}+{len} overflows the address space")]
    AddressOverflow {
        /// Start address.
        addr: usize,
        /// Length in bytes.
        len: usize,
    },
    /// The same `(addr, len)` is registered already.
    #[error("region {addr:#x}+{len} is already registered as region {existing}")]
    AlreadyRegistered {
        /// Start address.
        addr: usize,
        /// Length in bytes.
        len: usize,
        /// The id of the existing registration.
        existing: u32,
    },
    /// The range overlaps an existing registration without being identical to it.
    #[error("region {addr:#x}+{len} overlaps registered region {existing}")]
    OverlappingRegion {
        /// Start address.
        addr: usize,
        /// Length in bytes.
        len: usize,
        /// The id of the registration it overlaps.
        existing: u32,
    },
    /// The engine already holds its maximum number of regions.
    #[error("region limit reached: {limit} regions are registered")]
    TooManyRegions {
        /// The configured limit (`Options::max_regions`, 4000 by default).
        limit: usize,
    },
    /// A memory type this engine cannot serve yet.
    #[error("{mem_type:?} memory is not supported: {why}")]
    UnsupportedMemory {
        /// The memory type asked for.
        mem_type: MemType,
        /// Why not.
        why: &'static str,
    },
    /// A region, range or link of one engine was used with another.
    #[error("{what} belongs to engine {owner}, not to engine {engine}")]
    ForeignHandle {
        /// What was passed (`"region"`, `"remote range"`, ...).
        what: &'static str,
        /// The owning engine (or link) id.
        owner: u64,
        /// The engine (or link) it was used with.
        engine: u64,
    },
    /// A sub-range that does not fit in its region, or is empty.
    #[error("range {offset}+{len} is outside region {region} of {region_len} bytes (or empty)")]
    RangeOutOfBounds {
        /// The region id.
        region: u32,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// A local address range (HIXL's integer form) that lies in no region registered with
    /// this engine; `why` says what else was tried (a fabric-memory engine's device memory).
    #[error(
        "descriptor {index}: local range {addr:#x}+{len} is not inside one region registered with this engine{why}"
    )]
    LocalNotRegistered {
        /// The descriptor's index in its batch.
        index: usize,
        /// The local address.
        addr: usize,
        /// The length.
        len: usize,
        /// What else was tried, and why it did not hold (empty when nothing was).
        why: String,
    },
    /// A remote address range that lies in no region of the peer's table.
    #[error("remote range {addr:#x}+{len} is not inside any region registered by {peer}")]
    RemoteNotRegistered {
        /// The peer's engine name.
        peer: String,
        /// The remote address.
        addr: u64,
        /// The length.
        len: u64,
    },
    /// A region id the peer's table (as this link or data path got it) does not have.
    #[error("{peer} has no region {region} (range +{offset}, {len} bytes)")]
    UnknownRemoteRegion {
        /// The peer's engine name.
        peer: String,
        /// The region id asked for.
        region: u32,
        /// The offset in that region.
        offset: u64,
        /// The length.
        len: u64,
    },
    /// The region's access rights forbid the operation.
    #[error("{op:?} is not permitted on region {region} (access {access})")]
    AccessDenied {
        /// The operation.
        op: TransferOp,
        /// The region id.
        region: u32,
        /// The region's access rights.
        access: &'static str,
    },
    /// A descriptor whose local and remote lengths differ.
    #[error("descriptor {index}: local length {local} != remote length {remote}")]
    LengthMismatch {
        /// Descriptor index in the batch.
        index: usize,
        /// Local length.
        local: u64,
        /// Remote length.
        remote: u64,
    },
    /// A block-indexed transfer whose layout is invalid: a zero block size, or a stride
    /// smaller than the block (blocks would overlap).
    #[error(
        "invalid block layout (block {block_size}, strides {local_stride}/{remote_stride}): {problem}"
    )]
    InvalidBlockLayout {
        /// The block size.
        block_size: u64,
        /// The local stride.
        local_stride: u64,
        /// The remote stride.
        remote_stride: u64,
        /// What is wrong.
        problem: &'static str,
    },
    /// A block-indexed transfer whose local and remote index arrays differ in length.
    #[error("{local} local block indices but {remote} remote ones")]
    BlockCountMismatch {
        /// Local indices given.
        local: usize,
        /// Remote indices given.
        remote: usize,
    },
    /// A block index whose block leaves its range (or whose offset overflows): reported for the
    /// largest index of the side, at its first position.
    #[error(
        "{side} block index {block} (position {position}): stride {stride} x index + {block_size} bytes leaves the {side} range of {range_len} bytes"
    )]
    BlockOutOfBounds {
        /// `"local"` or `"remote"`.
        side: &'static str,
        /// Position of the index in its array.
        position: usize,
        /// The index.
        block: u64,
        /// The side's stride.
        stride: u64,
        /// The block size.
        block_size: u64,
        /// The length of the side's range.
        range_len: u64,
    },
    /// An empty descriptor list.
    #[error("a transfer needs at least one descriptor")]
    EmptyBatch,
    /// Too many descriptors in one call.
    #[error("{count} descriptors in one call; the limit is {limit}")]
    BatchTooLarge {
        /// Descriptors given.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// Connecting to a remote engine that already has a link from this engine.
    #[error("already connected to {peer}")]
    AlreadyConnected {
        /// The remote engine name.
        peer: String,
    },
    /// Connecting to a name that does not listen (no port) or to this engine itself.
    #[error("cannot connect to {peer:?}: {problem}")]
    NotConnectable {
        /// The remote engine name.
        peer: String,
        /// Why.
        problem: &'static str,
    },
    /// The link is broken (its peer went away or a lane failed) or was closed; connect again.
    #[error("link to {peer} is not usable: {why}")]
    NotConnected {
        /// The remote engine name.
        peer: String,
        /// Why the link is unusable.
        why: String,
    },
    /// The operation did not finish within its deadline.
    #[error("{op} with {peer} timed out after {elapsed:?}")]
    Timeout {
        /// What timed out (`"connect"`, `"WRITE"`, ...).
        op: &'static str,
        /// The peer's engine name.
        peer: String,
        /// How long it ran.
        elapsed: Duration,
    },
    /// The connection could not be made (refused, unreachable, ...).
    #[error("cannot connect to {peer}")]
    ConnectFailed {
        /// The remote engine name.
        peer: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The engine's listening socket could not be set up.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An I/O error on a link while a transfer or handshake ran.
    #[error("{op} with {peer} failed")]
    Io {
        /// The operation.
        op: &'static str,
        /// The remote engine name.
        peer: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The peer refused the request (its own validation failed) or the connection.
    #[error("{peer} refused {op}: {refusal}")]
    Refused {
        /// The operation.
        op: &'static str,
        /// The remote engine name.
        peer: String,
        /// The peer's code and reason.
        refusal: RemoteRefusal,
    },
    /// The peer sent something that is not valid hixl protocol.
    #[error("protocol error with {peer}: {problem}")]
    Protocol {
        /// The remote engine name.
        peer: String,
        /// What was wrong.
        problem: String,
    },
    /// All lanes of a link are busy and no more may be opened before the deadline.
    #[error("no free lane to {peer} within the deadline ({lanes} lanes busy)")]
    LanesExhausted {
        /// The remote engine name.
        peer: String,
        /// Lanes in use.
        lanes: usize,
    },
    /// Memory for a buffer could not be allocated.
    #[error("cannot allocate {len} bytes")]
    OutOfMemory {
        /// The size asked for.
        len: usize,
    },
    /// A transport that was required cannot be used with this peer.
    #[error("transport {transport} is not available with {peer}: {why}")]
    TransportUnavailable {
        /// The remote engine name.
        peer: String,
        /// The transport's name ([`TransportKind::name`](crate::TransportKind::name)).
        transport: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// A vendor library (UCX, ACL, HCCL) could not be loaded, or lacks a symbol hixl needs.
    #[error("cannot load {library}: {why}")]
    LibraryUnavailable {
        /// The library (or the list of candidates tried).
        library: String,
        /// What `dlopen`/`dlsym` said.
        why: String,
    },
    /// A vendor library call failed; the native code is kept.
    #[error("{library} call {call} failed with code {code}: {detail}")]
    Native {
        /// `"ucx"`, `"acl"` or `"hccl"`.
        library: &'static str,
        /// The C function.
        call: &'static str,
        /// The native status code (`ucs_status_t`, `aclError`, `HcclResult`).
        code: i64,
        /// The library's text for the code, or hixl's explanation.
        detail: String,
    },
    /// A same-host transfer failed in the kernel (`process_vm_readv`/`writev`).
    #[error("{op} with {peer} failed at descriptor {index}")]
    SameHost {
        /// The operation.
        op: &'static str,
        /// The remote engine name.
        peer: String,
        /// The descriptor where it stopped.
        index: usize,
        /// The cause (`EFAULT`: the peer's memory is not mapped there; `EPERM`: not allowed).
        #[source]
        source: io::Error,
    },
    /// Peer authentication failed: a key on one side only, or different keys.
    #[error("authentication with {peer} failed: {why}")]
    AuthFailed {
        /// The remote engine name.
        peer: String,
        /// What went wrong.
        why: &'static str,
    },
    /// A notification name or message over 1024 bytes.
    #[error("notification {what} of {len} bytes exceeds {limit}")]
    NotifyTooLong {
        /// `"name"` or `"message"`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// An async request was cancelled.
    #[error("{op} with {peer} was cancelled")]
    Cancelled {
        /// The operation.
        op: &'static str,
        /// The remote engine name.
        peer: String,
    },
    /// An async connect or disconnect was refused because its queue is full.
    #[error("the async connect queue is full ({capacity} tasks)")]
    QueueFull {
        /// The queue's capacity.
        capacity: usize,
    },
    /// The error of an async request (shared by every handle that reports it).
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
    /// The region is still referenced elsewhere and cannot be handed back yet.
    #[error("region {region} is still in use")]
    RegionBusy {
        /// The region id.
        region: u32,
    },
    /// The operating system's random source failed. Nonces, instance ids and link tokens come
    /// only from it (never from time or pids, which a peer could guess), so nothing that needs
    /// one proceeds: `initialize` fails with this, as does a connect or a handshake.
    #[error("the operating system's random source failed: {source}")]
    NoRandomness {
        /// What `getrandom` reported.
        source: std::io::Error,
    },
    /// On a fabric-memory engine's link to itself (both sides are this process's memory), a
    /// descriptor's source overlaps a destination of the same batch: refused before anything
    /// moves (the copies run in no defined order, and one may read what another writes).
    #[error(
        "descriptor {src}'s source overlaps descriptor {dst}'s destination: this link is the \
         engine's link to itself, and a batch may not read memory it writes"
    )]
    OverlappingTransfer {
        /// The descriptor whose source overlaps.
        src: usize,
        /// The descriptor whose destination it overlaps.
        dst: usize,
    },
}

impl Error {
    /// ACL's own error code when an engine could not read its device as it started
    /// (`aclrtGetDevice` failed: 107002 `ACL_ERROR_RT_CONTEXT_NULL` on a thread with no device),
    /// which HIXL, ADXL and HIXL-CS return as it is (`HIXL_CHK_ACL_RET` on `aclrtGetDevice`);
    /// `None` for any other failure.
    pub fn acl_start_code(&self) -> Option<u32> {
        match self {
            Error::Native {
                library: "acl",
                call: "aclrtGetDevice",
                code,
                ..
            } => u32::try_from(*code).ok(),
            Error::Shared(e) => e.acl_start_code(),
            _ => None,
        }
    }

    /// [`Error::InvalidOption`]: `key=value` is outside what `problem` says the key takes.
    pub(crate) fn invalid_option(key: &str, value: &str, problem: &'static str) -> Self {
        Error::InvalidOption {
            key: key.to_owned(),
            value: value.to_owned(),
            problem,
        }
    }

    /// The HIXL status code this error maps to.
    pub fn status(&self) -> Status {
        use Error::*;
        match self {
            InvalidEngineName { .. }
            | UnknownOption { .. }
            | InvalidOption { .. }
            | InvalidTimeout { .. }
            | ZeroLengthRegion
            | NullAddress
            | AddressOverflow { .. }
            | AlreadyRegistered { .. }
            | OverlappingRegion { .. }
            | ForeignHandle { .. }
            | RangeOutOfBounds { .. }
            | RemoteNotRegistered { .. }
            | LocalNotRegistered { .. }
            | UnknownRemoteRegion { .. }
            | AccessDenied { .. }
            | LengthMismatch { .. }
            | InvalidBlockLayout { .. }
            | BlockCountMismatch { .. }
            | BlockOutOfBounds { .. }
            | EmptyBatch
            | BatchTooLarge { .. }
            | NotifyTooLong { .. }
            | OverlappingTransfer { .. }
            | AuthFailed { .. }
            | NotConnectable { .. } => Status::PARAM_INVALID,
            Shared(e) => e.status(),
            UnsupportedMemory { .. }
            | UnsupportedOption { .. }
            | TransportUnavailable { .. }
            | LibraryUnavailable { .. } => Status::UNSUPPORTED,
            TooManyRegions { .. }
            | LanesExhausted { .. }
            | RegionBusy { .. }
            | OutOfMemory { .. }
            | QueueFull { .. } => Status::RESOURCE_EXHAUSTED,
            AlreadyConnected { .. } => Status::ALREADY_CONNECTED,
            NotConnected { .. } => Status::NOT_CONNECTED,
            Timeout { .. } => Status::TIMEOUT,
            Refused { refusal, .. } => refusal.status,
            ConnectFailed { .. }
            | Listen { .. }
            | Io { .. }
            | Protocol { .. }
            | Native { .. }
            | SameHost { .. }
            | NoRandomness { .. }
            | Cancelled { .. } => Status::FAILED,
        }
    }

    /// Whether the same call may succeed if tried again (after reconnecting, for link errors).
    ///
    /// Parameter errors are not retryable: the same arguments fail the same way.
    pub fn is_retryable(&self) -> bool {
        if let Error::Shared(e) = self {
            return e.is_retryable();
        }
        matches!(
            self,
            Error::Timeout { .. }
                | Error::NotConnected { .. }
                | Error::ConnectFailed { .. }
                | Error::LanesExhausted { .. }
                | Error::QueueFull { .. }
                | Error::Io { .. }
        )
    }
}

/// Converts a HIXL-style `timeout_in_millis` into a [`Duration`]; `<= 0` is `PARAM_INVALID`, as in HIXL.
///
/// # Errors
/// [`Error::InvalidTimeout`] for zero or negative values.
pub fn timeout_from_millis(millis: i32) -> Result<Duration, Error> {
    if millis <= 0 {
        return Err(Error::InvalidTimeout {
            millis: i64::from(millis),
        });
    }
    Ok(Duration::from_millis(millis as u64))
}

/// The longest wait a timeout gives: HIXL's `i32` milliseconds (about 24.8 days). A longer
/// `Duration` (up to `Duration::MAX`) waits this long: a deadline is never computed past what
/// the clock can hold.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(i32::MAX as u64);

/// A caller's timeout: zero is [`Error::InvalidTimeout`]; one past [`MAX_WAIT`] is that.
pub(crate) fn check_timeout(t: Duration) -> Result<Duration, Error> {
    if t.is_zero() {
        return Err(Error::InvalidTimeout { millis: 0 });
    }
    Ok(t.min(MAX_WAIT))
}

/// `from + t`, with `t` at most [`MAX_WAIT`] (never an overflow, whatever a caller passes).
pub(crate) fn deadline_after(from: std::time::Instant, t: Duration) -> std::time::Instant {
    let t = t.min(MAX_WAIT);
    from.checked_add(t).unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_keep_hixl_values() {
        assert_eq!(Status::PARAM_INVALID.code(), 103900);
        assert_eq!(Status::TIMEOUT.code(), 103901);
        assert_eq!(Status::NOT_CONNECTED.code(), 103902);
        assert_eq!(Status::ALREADY_CONNECTED.code(), 103903);
        assert_eq!(Status::NOTIFY_FAILED.code(), 103904);
        assert_eq!(Status::UNSUPPORTED.code(), 103905);
        assert_eq!(Status::RESOURCE_EXHAUSTED.code(), 203900);
        assert_eq!(Status::FAILED.code(), 503900);
        for s in [Status::SUCCESS, Status::TIMEOUT, Status::FAILED] {
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(7), None);
        assert_eq!(Status::from_peer(7), Status::FAILED);
        for (s, name) in [
            (Status::SUCCESS, "SUCCESS"),
            (Status::PARAM_INVALID, "PARAM_INVALID"),
            (Status::RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED"),
            (Status::FAILED, "FAILED"),
        ] {
            assert_eq!(s.name(), name);
        }
        assert_eq!(format!("{}", Status::TIMEOUT), "TIMEOUT (103901)");
    }

    #[test]
    fn timeouts_from_millis() {
        assert_eq!(timeout_from_millis(5).unwrap(), Duration::from_millis(5));
        for bad in [0, -1, i32::MIN] {
            let e = timeout_from_millis(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidTimeout { millis } if millis == i64::from(bad)));
            assert_eq!(e.status(), Status::PARAM_INVALID);
        }
    }
}
