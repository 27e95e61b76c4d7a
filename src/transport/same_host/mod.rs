//! The same-host transport: one-sided transfers between processes of one machine, with no
//! work by the peer's CPU.
//!
//! - Memory the engine allocates ([`HostBuffer`](crate::HostBuffer)) lives in a sealed `memfd`
//!   (it can neither shrink nor grow). A same-host client takes a duplicate of that descriptor
//!   with `pidfd_getfd`, checks the seals and size, and maps it: READ and WRITE are then a plain
//!   memory copy into or out of the peer's pages, at memory speed, no system call per descriptor.
//!   A memfd region is reached through its mapping only: one whose memfd fails the checks goes
//!   over TCP, never `process_vm_*` at its address (what the peer revokes is its pages).
//! - `Vec<u8>`/`Box<[u8]>` regions are written through the peer's `/proc/PID/mem` and read with
//!   `process_vm_readv`, batched by `IOV_MAX`, partial transfers continued. Other memory (which
//!   the server could not quarantine) is not offered one-sidedly: it goes over TCP.
//!
//! Every batch runs inside the server's fence for the link (`runtime::revoke`), so the server
//! can revoke one-sided access and wait for copies in flight before it hands memory back.
//!
//! Both need the right to trace the peer (same user, or `CAP_SYS_PTRACE`): exactly the right to
//! read and write its memory anyway. Where the kernel refuses, the link stays on TCP.
//!
//! The peer is identified by boot id, pid namespace, pid and process start time; the pid is
//! pinned with a pidfd right after the start time is checked, and every transfer first checks
//! (one `poll`) that the peer is alive and the link's control connection open.
//!
//! A pid number can be reused once its process is gone, so nothing is ever *written* by pid
//! number: writes go through the peer's `/proc/PID/mem`, opened once at connect and checked
//! against the pidfd after opening. That descriptor is bound to the peer's address space, not
//! to its pid: once the peer is gone it writes nothing (the kernel answers 0 bytes), whichever
//! process gets the pid next. Reads use `process_vm_readv` (one copy, faster) and are followed by
//! a pidfd check: a peer still alive after the read was alive for all of it, so the bytes came
//! from it; a read the peer did not outlive fails (`ESRCH`).

mod backend;
mod copy;
mod parts;
pub(crate) mod path;

pub(crate) use backend::SameHostBackend;

use crate::process::PeerProc;
use crate::types::HostId;

/// Whether this kernel has what the same-host transport needs.
pub fn available() -> Result<(), &'static str> {
    let me = HostId::current().ok_or("/proc does not say who this process is")?;
    PeerProc::open(&me)
        .map(drop)
        .map_err(|_| "pidfd_open is not available")
}
