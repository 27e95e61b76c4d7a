//! The memory a caller can register: `Box<[u8]>`, `Vec<u8>`, and [`HostBuffer`] (page-aligned,
//! zeroed, in a sealed memfd that same-host peers can map), each with its [`RegistrableMemory`]
//! implementation.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::error::Error;
use crate::process::sealed_memfd;
use crate::types::MemType;
use crate::types::raw::{RawMemory, RegistrableMemory};

// SAFETY: `Box::into_raw` gives up ownership of a heap allocation of exactly `len` bytes that
// nothing else references; `Box::from_raw` on the same pointer and length restores it.
unsafe impl RegistrableMemory for Box<[u8]> {
    fn into_raw_parts(self) -> RawMemory {
        let len = self.len();
        let ptr =
            NonNull::new(Box::into_raw(self).cast::<u8>()).expect("Box pointers are non-null");
        RawMemory::new(ptr, len, 0, MemType::Host)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        let slice = std::ptr::slice_from_raw_parts_mut(raw.ptr.as_ptr(), raw.len);
        // SAFETY: the caller passes the parts `into_raw_parts` produced from a `Box<[u8]>`.
        unsafe { Box::from_raw(slice) }
    }
}

// SAFETY: the `Vec` is taken apart with its capacity, so its buffer is neither resized nor freed
// until `Vec::from_raw_parts` rebuilds it with the same pointer, length and capacity.
unsafe impl RegistrableMemory for Vec<u8> {
    fn into_raw_parts(self) -> RawMemory {
        let mut v = std::mem::ManuallyDrop::new(self);
        let ptr = NonNull::new(v.as_mut_ptr()).expect("Vec pointers are non-null");
        RawMemory::new(ptr, v.len(), v.capacity(), MemType::Host)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: the caller passes the parts `into_raw_parts` produced from a `Vec<u8>`.
        unsafe { Vec::from_raw_parts(raw.ptr.as_ptr(), raw.len, raw.extra) }
    }
}

/// A page-aligned, zero-initialised host buffer owned by the caller until it is registered.
///
/// While you own it, it is an ordinary byte slice (`Deref<Target = [u8]>`). Registering it moves
/// it into the engine; deregistering gives it back.
///
/// Its pages live in a sealed `memfd` (it can neither shrink nor grow), which lets same-host peers
/// map the region and move data with a plain memory copy. If a same-host peer may have mapped it,
/// deregistration hands back a private copy, never pages a peer can still write.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes mapped (`len` rounded up to a page).
    map_len: usize,
    /// The memfd, or -1 when the buffer is anonymous memory (memfd unavailable).
    fd: i32,
}

// SAFETY: HostBuffer owns its mapping exclusively, like `Box<[u8]>`.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out `&[u8]`, like `Box<[u8]>`.
unsafe impl Sync for HostBuffer {}

const PAGE: usize = 4096;

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to a 4 KiB page.
    ///
    /// # Errors
    /// [`Error::ZeroLengthRegion`] for `len == 0`; [`Error::OutOfMemory`] when the allocation fails.
    pub fn new(len: usize) -> Result<Self, Error> {
        if len == 0 {
            return Err(Error::ZeroLengthRegion);
        }
        let map_len = len
            .checked_next_multiple_of(PAGE)
            .ok_or(Error::OutOfMemory { len })?;
        let fd = sealed_memfd(map_len);
        let (flags, mfd) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new mapping of `map_len` bytes, of our own memfd or anonymous memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                mfd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            if mfd >= 0 {
                // SAFETY: closing the memfd we just created, once.
                unsafe { libc::close(mfd) };
            }
            return Err(Error::OutOfMemory { len });
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::OutOfMemory { len })?;
        Ok(Self {
            ptr,
            len,
            map_len,
            fd: mfd,
        })
    }

    /// A buffer whose memory the engine keeps mapped at its address for a keep-alive (the
    /// compat engine's `HostMem`, LLM-DataDist's buffers) after its registration ends: it must
    /// be a memfd, whose pages at that address are replaced by private ones then, so a
    /// same-host peer that mapped it writes its own mapping, never what the keep-alive shows.
    /// Anonymous memory (no memfd could be made: the descriptor limit, a seccomp filter) would
    /// be reached by such a peer at its address, through `/proc/PID/mem`, after it was handed
    /// back.
    ///
    /// # Errors
    /// As [`HostBuffer::new`]; [`Error::OutOfMemory`] when no memfd could be made.
    pub(crate) fn shared(len: usize) -> Result<Self, Error> {
        let b = Self::new(len)?;
        if !b.is_shareable() {
            tracing::warn!(
                len,
                "no memfd for an engine-kept buffer (memfd_create failed)"
            );
            return Err(Error::OutOfMemory { len });
        }
        Ok(b)
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Errors
    /// As [`HostBuffer::new`].
    pub fn from_slice(data: &[u8]) -> Result<Self, Error> {
        let mut b = Self::new(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }

    /// Whether the buffer is backed by a sealed memfd (same-host peers can map it).
    pub fn is_shareable(&self) -> bool {
        self.fd >= 0
    }

    /// Replaces the pages of a buffer's mapping, at their address, by private anonymous pages
    /// holding the same bytes (`mremap` of a filled copy over it, which swaps the mapping in one
    /// step: the address is never unmapped). A same-host peer that mapped the buffer's memfd
    /// keeps its mapping of the memfd's pages, which this process no longer sees: what it
    /// writes from then on lands nowhere that is read here, and it reads nothing written here.
    /// The memfd stays open (and `raw` valid for [`RegistrableMemory::from_raw_parts`]) until
    /// the buffer is dropped. A write by this process racing the swap may be lost (it lands
    /// in the old pages after they were copied), never anywhere else.
    ///
    /// # Safety
    /// `raw` must be the parts of a live `HostBuffer` (`into_raw_parts`) with a memfd
    /// (`raw.fd >= 0`), which nothing else unmaps or remaps meanwhile.
    pub(crate) unsafe fn privatize(raw: &RawMemory) -> Result<(), Error> {
        let (addr, len, map_len) = (raw.ptr.as_ptr(), raw.len, raw.extra);
        // SAFETY: a new private mapping of `map_len` bytes, ours alone.
        let copy = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if copy == libc::MAP_FAILED {
            return Err(Error::OutOfMemory { len });
        }
        // SAFETY: `addr` is the buffer's mapping of `map_len >= len` readable bytes (the
        // caller's contract), which a peer may write meanwhile (read as raw bytes, never through
        // a reference); `copy` is the fresh mapping above; they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(addr, copy.cast::<u8>(), len) };
        // The system call itself, not glibc's wrapper: UCX's memory hooks (libucm, loaded with
        // UCX) replace `mremap` in the process with one that drops the fifth argument, the new
        // address, so the call fails with EINVAL (seen with UCX 1.13). The range is never UCX's
        // here (engine memory is mapped with UCX only while registered).
        // SAFETY: moves the private mapping onto the buffer's range (same length, page
        // aligned), which atomically replaces the shared one there; the caller's contract says
        // nothing else remaps it meanwhile.
        let moved = unsafe {
            libc::syscall(
                libc::SYS_mremap,
                copy,
                map_len,
                map_len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                addr.cast::<libc::c_void>(),
            )
        };
        if moved == -1 {
            // SAFETY: unmapping the copy made above, which nothing else refers to.
            unsafe { libc::munmap(copy, map_len) };
            return Err(Error::OutOfMemory { len });
        }
        Ok(())
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by `self`; no peer can have
        // mapped them (a buffer handed back after sharing is a private copy).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new` and closing its memfd, once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
            if self.fd >= 0 {
                libc::close(self.fd);
            }
        }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("shareable", &(self.fd >= 0))
            .finish()
    }
}

// SAFETY: a HostBuffer is taken apart without unmapping; only `from_raw_parts` rebuilds it. Its
// `fd`, when set, is a sealed memfd whose first `len` bytes are the memory at `ptr`.
unsafe impl RegistrableMemory for HostBuffer {
    fn into_raw_parts(self) -> RawMemory {
        let this = std::mem::ManuallyDrop::new(self);
        let mut raw = RawMemory::new(this.ptr, this.len, this.map_len, MemType::Host);
        raw.fd = this.fd;
        raw
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        Self {
            ptr: raw.ptr,
            len: raw.len,
            map_len: raw.extra,
            fd: raw.fd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_is_page_aligned_and_zeroed() {
        let b = HostBuffer::new(10_000).unwrap();
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        assert!(b.iter().all(|&x| x == 0));
        assert!(b.is_shareable());
        // SAFETY: reading the seals of the buffer's own memfd.
        let seals = unsafe { libc::fcntl(b.fd, libc::F_GET_SEALS) };
        assert_eq!(
            seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW),
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
        );
        assert!(matches!(HostBuffer::new(0), Err(Error::ZeroLengthRegion)));
    }

    #[test]
    fn raw_parts_round_trip() {
        let v: Vec<u8> = (0..=255).collect();
        let raw = RegistrableMemory::into_raw_parts(v.clone());
        // SAFETY: parts from `into_raw_parts` of the same type, used once.
        let back = unsafe { <Vec<u8> as RegistrableMemory>::from_raw_parts(raw) };
        assert_eq!(back, v);
        let b: Box<[u8]> = v.clone().into_boxed_slice();
        let raw = RegistrableMemory::into_raw_parts(b);
        // SAFETY: as above.
        let back = unsafe { <Box<[u8]> as RegistrableMemory>::from_raw_parts(raw) };
        assert_eq!(&back[..], &v[..]);
    }
}
