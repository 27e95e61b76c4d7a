//! Helpers of the tests of the runtime-checked engine (`hixl::compat`): a client with one
//! registered buffer, registration, statuses, descriptors, polling.

use hixl::compat::{self, Hixl, MemDesc, TransferOpDesc, TransferStatus};
use hixl::{MemType, Status};
use std::time::{Duration, Instant};

pub const NO_OPTIONS: [(&str, &str); 0] = [];

/// A compat client engine (no listening port) with `mem` registered; returns the handle.
pub fn client(options: &[(&str, &str)], mem: &mut [u8]) -> (Hixl, u64) {
    let e = Hixl::new();
    e.initialize("127.0.0.1", options.iter().copied()).unwrap();
    let h = register(&e, mem).unwrap();
    (e, h)
}

pub fn register(e: &Hixl, mem: &mut [u8]) -> Result<u64, compat::Error> {
    let desc = MemDesc {
        addr: mem.as_mut_ptr() as usize,
        len: mem.len(),
        local_only: false,
    };
    // SAFETY: every test keeps its buffers alive and unmoved until after `finalize`, and reads
    // them only after the transfers touching them returned.
    unsafe { e.register_mem(desc, MemType::Host) }
}

pub fn status<T: std::fmt::Debug>(r: Result<T, compat::Error>) -> Status {
    r.expect_err("expected an error").status()
}

pub fn desc(local: &[u8], loff: usize, remote: u64, roff: u64, len: usize) -> TransferOpDesc {
    TransferOpDesc {
        local_addr: local.as_ptr() as usize + loff,
        remote_addr: (remote + roff) as usize,
        len,
    }
}

/// Polls one request until it is no longer waiting (each poll is a real query; the request's
/// own deadline bounds the loop).
pub fn wait(e: &Hixl, req: u64) -> TransferStatus {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let st = e.get_transfer_status(req).unwrap();
        if st != TransferStatus::Waiting || Instant::now() > until {
            return st;
        }
        std::thread::yield_now();
    }
}
