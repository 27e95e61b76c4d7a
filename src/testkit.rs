//! Small helpers for examples, tests and benchmarks: reproducible random bytes and a checksum.
//! Neither is for cryptographic use.

/// xorshift64*: fast, reproducible pseudo-random numbers.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

/// FNV-1a over bytes, to compare memory across processes (the published tables' checksum).
pub use crate::published::fnv1a;

/// Builds the ACL/HCCL ABI test double (`tests/ascend_double/double.c`, compiled with the
/// system `cc`) into `dir` and returns the path of the shared library, for tests that run the
/// Ascend backend without CANN.
///
/// # Errors
/// What failed (no `cc`, a compiler error, an unwritable `dir`).
pub fn build_ascend_double(dir: &std::path::Path) -> Result<std::path::PathBuf, String> {
    crate::device::double::build(dir)
}

/// The same-host transport's write path to one process, for the pid-reuse test (`hixl-peer
/// pidreuse`): not part of the API.
#[doc(hidden)]
#[derive(Debug)]
pub struct SameHostPeer(crate::process::PeerProc);

#[doc(hidden)]
impl SameHostPeer {
    /// Pins process `pid` and opens its address space, as a same-host link does at connect.
    ///
    /// # Errors
    /// What the kernel says (no such process, no right to trace it).
    pub fn open(pid: u32) -> std::io::Result<Self> {
        let me = crate::types::HostId::current()
            .ok_or_else(|| std::io::Error::other("/proc does not say who this process is"))?;
        let start = crate::types::start_time(pid)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        let id = crate::types::HostId { pid, start, ..me };
        crate::process::PeerProc::open(&id).map(Self)
    }

    /// Writes `data` at `addr` in the process, the way a same-host WRITE does.
    ///
    /// # Safety
    /// `addr..addr + data.len()` must be memory of that process that nothing else reads or
    /// writes meanwhile and that may hold any bytes: if the process is this one, or one whose
    /// memory safety you rely on, the write is exactly as dangerous as a raw pointer write.
    ///
    /// # Errors
    /// The OS error (`ESRCH` once the process is gone, whatever now has its pid).
    pub unsafe fn write(&self, addr: usize, data: &[u8]) -> std::io::Result<()> {
        let mut local = [crate::io::IoVec {
            base: data.as_ptr() as usize,
            len: data.len(),
        }];
        let mut remote = [crate::io::IoVec {
            base: addr,
            len: data.len(),
        }];
        // SAFETY: the local iovec is `data`, valid for reads for the call.
        unsafe { self.0.pvm(true, &mut local, &mut remote) }.map_err(|(e, _)| e)
    }
}
