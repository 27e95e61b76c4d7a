//! Memory shared with other processes: a memfd sealed against shrinking and growing
//! ([`sealed_memfd`]), and a shared mapping of a peer's ([`Mapping`], checked first: shared
//! memory, sealed, large enough, so no access can fault).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

#[cfg(test)]
thread_local! {
    /// Tests: `sealed_memfd` fails on this thread (as at the descriptor limit).
    pub(crate) static NO_MEMFD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A memfd of `len` bytes sealed against shrinking, growing and further sealing.
pub(crate) fn sealed_memfd(len: usize) -> Option<i32> {
    #[cfg(test)]
    if NO_MEMFD.get() {
        return None;
    }
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"hixl".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return None;
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: sizing and sealing the descriptor we just created.
    let ok = unsafe {
        libc::ftruncate(fd, len as libc::off_t) == 0
            && libc::fcntl(fd, libc::F_ADD_SEALS, seals) == 0
    };
    if !ok {
        // SAFETY: closing our own descriptor, once.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// Whether `fd` is a file of shared memory: tmpfs, which plain memfds live on (`fstatfs`
/// reports `TMPFS_MAGIC` for them), as opposed to hugetlbfs (`MFD_HUGETLB`) or any other file
/// system.
fn is_shmem(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: a zeroed statfs is valid output space for fstatfs on a descriptor we own.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the result is checked.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // the magic is 32 bits; `f_type`'s C type (and sign) differs between targets
    Ok(sfs.f_type as u32 == libc::TMPFS_MAGIC as u32)
}

/// A peer's sealed memfd, mapped into this process.
#[derive(Debug)]
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
    /// Whether the memfd held every one of its pages when it was mapped (no holes): then
    /// [`Mapping::populate`] need not ask `mincore` which pages it holds.
    dense: bool,
}

impl Mapping {
    /// Maps `len` bytes of `fd`, after checking that it is a regular file of shared memory
    /// (tmpfs/shmem) of at least `len` bytes sealed against shrinking (so no access can ever
    /// fault with SIGBUS). Shared memory only: a hugetlbfs memfd can be sealed too, but its
    /// owner can punch a hole and take the huge pages back, and a fault on a hole with no huge
    /// page free is SIGBUS (hugetlbfs has no fallback); a shmem hole is filled with a zeroed
    /// page of the owner's memfd.
    pub fn new(fd: impl AsFd, len: u64, writable: bool) -> io::Result<Self> {
        let fd = fd.as_fd();
        let bad = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        // SAFETY: fcntl(F_GET_SEALS) on a descriptor we own; the result is checked.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("the peer's memory is not sealed against shrinking"));
        }
        if !is_shmem(fd)? {
            return Err(bad(
                "the peer's memory is not shared memory (tmpfs): hugetlbfs or another file system",
            ));
        }
        // SAFETY: a zeroed stat is valid output space for fstat on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < len || len == 0 {
            return Err(bad("the peer's memory is smaller than its region"));
        }
        let len = len as usize;
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new shared mapping of a sealed regular file of at least `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            addr: p as usize,
            len,
            dense: (st.st_blocks as u64).saturating_mul(512) >= st.st_size as u64,
        })
    }

    /// Maps the pages of bytes `off..off + len` (widened to whole pages, cut at the mapping's
    /// end) into this process's page tables now, so copies through them take no page fault:
    /// only pages the peer's memfd holds (as `mincore` reports them, unless the memfd had no
    /// holes when mapped: `mincore` took a third of the time), one `MADV_POPULATE_READ` per run
    /// of them, so holes the peer never touched stay holes (a read fault of a shmem hole
    /// allocates a page). Read population of a shared mapping of shmem
    /// maps a writable entry when the mapping is writable, and maps the pages around the one
    /// faulted in (the kernel's fault-around): measured here, 512 MiB took 43 ms where copying
    /// 512 MiB into a fresh mapping took 300 ms (80 ms warm). Returns the bytes of pages
    /// populated.
    ///
    /// # Errors
    /// `mincore` or `madvise` failed (`EINVAL` on kernels before 5.14, which lack
    /// `MADV_POPULATE_READ`); pages it did not map fault on first touch, as without it.
    pub fn populate(&self, off: usize, len: usize) -> io::Result<usize> {
        const PAGE: usize = 4096;
        let start = (off / PAGE) * PAGE;
        let end = off.saturating_add(len).min(self.len).div_ceil(PAGE) * PAGE;
        let end = end.min(self.len.div_ceil(PAGE) * PAGE);
        if start >= end {
            return Ok(0);
        }
        let pages = (end - start) / PAGE;
        if self.dense {
            // SAFETY: as below, for the whole range: every page of it is held (the memfd had no
            // holes when mapped; hixl's engines never punch any), so nothing is allocated. A
            // hostile peer that punched holes since gets them filled with zeroed pages of its
            // own memfd, inside the mapping it offered (within the budget): no byte of data
            // changes, and no memory of this process's is touched.
            if unsafe {
                libc::madvise(
                    (self.addr + start) as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_READ,
                )
            } != 0
            {
                return Err(io::Error::last_os_error());
            }
            return Ok(end - start);
        }
        let mut held = vec![0u8; pages];
        // SAFETY: `start..end` lies in this mapping (page aligned: the mapping starts on a page
        // and `start` is a multiple of the page size); `held` has one byte per page. mincore
        // reads page tables and the memfd's page cache, nothing of the memory's contents.
        if unsafe {
            libc::mincore(
                (self.addr + start) as *mut libc::c_void,
                end - start,
                held.as_mut_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut done = 0;
        let mut i = 0;
        while i < pages {
            if held[i] & 1 == 0 {
                i += 1;
                continue;
            }
            let run = held[i..].iter().take_while(|&&b| b & 1 != 0).count();
            let at = self.addr + start + i * PAGE;
            // SAFETY: the run lies in this mapping. MADV_POPULATE_READ only faults the pages in
            // (as a read of each would): it changes no byte of the memory, so the peer writing
            // these pages meanwhile, or a copy of this process reading them, sees the same
            // contents with or without it; the memfd is sealed against shrinking, so no page of
            // the range can be beyond its end (no SIGBUS: the kernel would answer EFAULT).
            if unsafe {
                libc::madvise(
                    at as *mut libc::c_void,
                    run * PAGE,
                    libc::MADV_POPULATE_READ,
                )
            } != 0
            {
                return Err(io::Error::last_os_error());
            }
            done += run * PAGE;
            i += run;
        }
        Ok(done)
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The local address of byte `offset` of the peer's region.
    pub fn at(&self, offset: u64) -> usize {
        debug_assert!(offset as usize <= self.len);
        self.addr + offset as usize
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping `new` made, once; nothing refers to it after the
        // link (its owner) is gone.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    /// A sealed hugetlbfs memfd is refused before it is mapped (its owner could punch a hole
    /// and take the huge pages: a fault there is SIGBUS), with the error kind of the other
    /// refusals; a sealed memfd of shared memory is mapped.
    #[test]
    fn a_sealed_hugetlbfs_memfd_is_refused() {
        let (lo, hi) = (4096u64, 2u64 << 20);
        let ok = Mapping::new(
            // SAFETY: a new descriptor nothing else owns.
            unsafe { OwnedFd::from_raw_fd(sealed_memfd(lo as usize).expect("a memfd")) },
            lo,
            true,
        );
        assert!(ok.is_ok(), "{ok:?}");
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"hixl-huge".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
            )
        };
        if fd < 0 {
            eprintln!(
                "SKIPPED: no hugetlbfs memfd here: {}",
                io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // one huge page (sizing reserves none: mapping would), sealed as a peer would seal it
        // SAFETY: sizing and sealing our own descriptor; the results are checked.
        let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), hi as libc::off_t) } == 0;
        // SAFETY: as above.
        let sealed =
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } == 0;
        assert!(sealed, "sealing: {}", io::Error::last_os_error());
        // unsized (no huge page size could be set), it is refused too: as too small without
        // the file system check, so the message tells the refusal apart
        let len = if sized { hi } else { 1 };
        let err = Mapping::new(&fd, len, true).expect_err("a hugetlbfs memfd mapped");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("not shared memory"), "{err}");
    }

    /// Populating a mapping maps the pages the memfd holds and allocates none of its holes: of
    /// an 8 MiB memfd whose first 1 MiB and last page were written, exactly those are
    /// populated, and the memfd holds no more blocks after than before.
    #[test]
    fn populate_maps_held_pages_and_leaves_holes() {
        let len = 8 << 20;
        let fd = sealed_memfd(len).expect("a memfd");
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let data = vec![7u8; 1 << 20];
        // SAFETY: writes from a live buffer into our own memfd, within its size.
        let ok = unsafe {
            libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) == 1 << 20
                && libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), 1, (len - 1) as i64) == 1
        };
        assert!(ok);
        let blocks = || {
            // SAFETY: a zeroed stat is valid output space for fstat on our own descriptor.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
            st.st_blocks
        };
        let before = blocks();
        let m = Mapping::new(&fd, len as u64, true).unwrap();
        match m.populate(0, len) {
            // a kernel before 5.14 has no MADV_POPULATE_READ: nothing to check
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            r => assert_eq!(r.unwrap(), (1 << 20) + 4096),
        }
        assert_eq!(blocks(), before, "populating allocated memory in the memfd");
        assert_eq!(
            m.populate(len - 10, 100).unwrap(),
            4096,
            "cut at the mapping's end"
        );
        assert_eq!(m.populate(len, 1).unwrap(), 0);
        // a memfd with every page written is dense: populated whole, without mincore
        let full = sealed_memfd(1 << 20).expect("a memfd");
        // SAFETY: a new descriptor nothing else owns.
        let full = unsafe { OwnedFd::from_raw_fd(full) };
        // SAFETY: a write from a live buffer into our own memfd, within its size.
        let n = unsafe { libc::pwrite(full.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) };
        assert_eq!(n, 1 << 20);
        let d = Mapping::new(&full, 1 << 20, false).unwrap();
        assert!(d.dense && !m.dense);
        assert_eq!(d.populate(4096, 100).unwrap(), 4096);
        // the contents are as written
        // SAFETY: the mapping is `len` bytes long and holds what was written above.
        let mapped = unsafe { std::slice::from_raw_parts(m.at(0) as *const u8, 1 << 20) };
        assert!(mapped == &data[..]);
    }
}
