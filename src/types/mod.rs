//! The crate's plain data: what a transfer is (TransferOp), where memory lives (MemType, MemDesc,
//! Access), who a process is (HostId), and the descriptors that go on the wire
//! and down a data path (WireDesc, BatchDesc). A leaf: it imports nothing from the crate.
//!
//! (The parsed engine name, which reports errors, is in [`engine_name`].)

use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

pub(crate) mod batch;
pub(crate) mod blocks;
pub(crate) mod engine_name;
pub(crate) mod raw;
pub(crate) mod split;

/// The direction of a transfer (HIXL `TransferOp`, same numeric values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TransferOp {
    /// Remote → local: `READ` (0).
    Read = 0,
    /// Local → remote: `WRITE` (1).
    Write = 1,
}

impl TransferOp {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Read),
            1 => Some(Self::Write),
            _ => None,
        }
    }

    /// `"READ"` or `"WRITE"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
        }
    }
}

impl fmt::Display for TransferOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where memory lives (HIXL `MemType`, same numeric values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MemType {
    /// Accelerator (device) memory: `MEM_DEVICE` (0).
    Device = 0,
    /// Host memory: `MEM_HOST` (1).
    Host = 1,
}

impl MemType {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Device),
            1 => Some(Self::Host),
            _ => None,
        }
    }
}

/// HIXL's `MemDesc`: an address range managed by the caller, for [`register_raw`].
///
/// [`register_raw`]: crate::Hixl::register_raw
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemDesc {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// What remote peers may do with a region. The serving engine enforces it on every request, and
/// a client refuses locally what the peer's table forbids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Access {
    /// Peers may neither read nor write it (local use only).
    None = 0,
    /// Peers may READ from it.
    Read = 1,
    /// Peers may WRITE into it.
    Write = 2,
    /// Peers may READ and WRITE (the default, as in HIXL).
    #[default]
    ReadWrite = 3,
}

impl Access {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::None),
            1 => Some(Self::Read),
            2 => Some(Self::Write),
            3 => Some(Self::ReadWrite),
            _ => None,
        }
    }

    /// Whether a peer's `op` is allowed on a region with these rights.
    pub fn permits(self, op: TransferOp) -> bool {
        let bit = match op {
            TransferOp::Read => 1,
            TransferOp::Write => 2,
        };
        (self as u8) & bit != 0
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Read => "read",
            Self::Write => "write",
            Self::ReadWrite => "read-write",
        }
    }
}

/// Who a process is, as far as the same-host transport cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostId {
    /// `/proc/sys/kernel/random/boot_id`, as 16 bytes.
    pub boot: [u8; 16],
    /// The inode of `/proc/self/ns/pid`.
    pub pidns: u64,
    /// The process id (in that namespace).
    pub pid: u32,
    /// The process start time, in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start: u64,
}

impl HostId {
    /// This process's identity, or `None` where `/proc` does not tell (then the same-host transport is off).
    pub fn current() -> Option<HostId> {
        static ME: OnceLock<Option<HostId>> = OnceLock::new();
        *ME.get_or_init(|| {
            let pid = std::process::id();
            Some(HostId {
                boot: boot_id()?,
                pidns: fs::metadata("/proc/self/ns/pid").ok()?.ino(),
                pid,
                start: start_time(pid)?,
            })
        })
    }

    /// Same machine, same pid namespace (so the pid means the same process for both).
    pub fn same_host(&self, other: &HostId) -> bool {
        self.boot == other.boot && self.pidns == other.pidns && self.boot != [0; 16]
    }
}

fn boot_id() -> Option<[u8; 16]> {
    let s = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(b)
}

/// The start time of `pid`, from `/proc/PID/stat` (field 22, after the parenthesised name).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// One descriptor on the wire: a range of a region of the serving engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireDesc {
    /// Region id in the server's table.
    pub region: u32,
    /// Offset in the region.
    pub offset: u64,
    /// Length.
    pub len: u64,
}

/// One descriptor of a batch as a data path moves it: a local address (already resolved from a
/// region the caller keeps alive) and the peer's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchDesc {
    /// Local address (inside a registered region the caller keeps alive).
    pub local: usize,
    /// The peer's region range; its `len` is the length of both sides.
    pub remote: WireDesc,
}

#[cfg(test)]
impl BatchDesc {
    /// A descriptor from `local` to `len` bytes at `offset` of the peer's region `region`.
    pub(crate) fn of(local: usize, region: u32, offset: u64, len: u64) -> Self {
        BatchDesc {
            local,
            remote: WireDesc {
                region,
                offset,
                len,
            },
        }
    }
}

impl split::Cut for BatchDesc {
    fn bytes(&self) -> u64 {
        self.remote.len
    }
    fn cut(&self, at: u64) -> (Self, Self) {
        let head = BatchDesc {
            local: self.local,
            remote: WireDesc {
                len: at,
                ..self.remote
            },
        };
        let tail = BatchDesc {
            local: self.local + at as usize,
            remote: WireDesc {
                region: self.remote.region,
                offset: self.remote.offset + at,
                len: self.remote.len - at,
            },
        };
        (head, tail)
    }
}

/// What a transport needs to know of a registered region: its id in the engine's table, where
/// it is, what memory it is, and what peers may do with it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionView {
    pub(crate) id: u32,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) mem_type: MemType,
    pub(crate) access: Access,
}

/// Options from HIXL's string pairs: the defaults, then `set` for each pair in order (a later
/// pair overrides an earlier one); the first error stops it. For every options type set one
/// string key at a time ([`Options::from_pairs`](crate::Options::from_pairs)).
pub(crate) fn options_from_pairs<T: Default, E, K: AsRef<str>, V: AsRef<str>>(
    pairs: impl IntoIterator<Item = (K, V)>,
    mut set: impl FnMut(&mut T, &str, &str) -> Result<(), E>,
) -> Result<T, E> {
    let mut o = T::default();
    for (k, v) in pairs {
        set(&mut o, k.as_ref(), v.as_ref())?;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rights() {
        assert!(Access::ReadWrite.permits(TransferOp::Read));
        assert!(Access::ReadWrite.permits(TransferOp::Write));
        assert!(Access::Read.permits(TransferOp::Read));
        assert!(!Access::Read.permits(TransferOp::Write));
        assert!(!Access::Write.permits(TransferOp::Read));
        assert!(!Access::None.permits(TransferOp::Write));
    }
}
