//! The benchmark's anchors measured in the same run: memcpy and `process_vm_readv`/`writev`
//! of the same blocks here, and the peers' tools through `tools/bench-anchors.sh`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hixl::TransferOp;
use hixl::testkit::Rng;

use super::ws;

/// A source and a destination of the working set's size, both written once (no page is
/// faulted in during a measured pass).
fn working_set() -> (Vec<u8>, Vec<u8>) {
    let mut src = vec![0u8; ws()];
    let mut dst = vec![0u8; ws()];
    Rng::new(3).fill(&mut src);
    dst.copy_from_slice(&src);
    (src, dst)
}

/// Single-thread memcpy in `block` chunks over the working set, best of three passes, GB/s.
pub(crate) fn memcpy_gbps(block: usize) -> f64 {
    let (src, mut dst) = working_set();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut moved = 0usize;
        for off in (0..=ws() - block).step_by(block) {
            dst[off..off + block].copy_from_slice(&src[off..off + block]);
            moved += block;
            if moved % (64 << 20) < block && t0.elapsed() > Duration::from_millis(300) {
                break;
            }
        }
        std::hint::black_box(&dst);
        best = best.max(moved as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Two threads copying one half of the working set each, in `block` chunks, best of three
/// passes, GB/s in all: what a transfer that runs on two cores (the caller's and a helper) can
/// reach at most.
pub(crate) fn memcpy2_gbps(block: usize) -> f64 {
    let half = ws() / 2;
    if block > half {
        return memcpy_gbps(block);
    }
    let (src, mut dst) = working_set();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let moved: usize = std::thread::scope(|s| {
            let parts: Vec<_> = (src.chunks(half))
                .zip(dst.chunks_mut(half))
                .map(|(from, to)| {
                    s.spawn(move || {
                        let mut moved = 0usize;
                        for off in (0..=from.len().saturating_sub(block)).step_by(block) {
                            to[off..off + block].copy_from_slice(&from[off..off + block]);
                            moved += block;
                        }
                        std::hint::black_box(&to);
                        moved
                    })
                })
                .collect();
            parts.into_iter().map(|p| p.join().unwrap_or(0)).sum()
        });
        best = best.max(moved as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// A bare `process_vm_readv` (READ) or `process_vm_writev` (WRITE) loop between `buf` and the
/// peer's region, `block` bytes a call, over the working set, best of three passes, GB/s.
pub(crate) fn pvm_gbps(
    op: TransferOp,
    pid: u32,
    remote: u64,
    block: usize,
    buf: &hixl::Region,
) -> Option<f64> {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut moved = 0usize;
        for off in (0..=ws() - block).step_by(block) {
            if moved % (1 << 20) < block && t0.elapsed() > Duration::from_millis(300) {
                break;
            }
            moved += block;
            let local = libc::iovec {
                iov_base: (buf.addr() + off) as *mut libc::c_void,
                iov_len: block,
            };
            let rem = libc::iovec {
                iov_base: (remote as usize + off) as *mut libc::c_void,
                iov_len: block,
            };
            // SAFETY: the local iovec lies in `buf`, a registered region this thread owns and
            // nothing else uses during the measurement; the kernel checks the remote one.
            let n = unsafe {
                match op {
                    TransferOp::Read => {
                        libc::process_vm_readv(pid as libc::pid_t, &local, 1, &rem, 1, 0)
                    }
                    TransferOp::Write => {
                        libc::process_vm_writev(pid as libc::pid_t, &local, 1, &rem, 1, 0)
                    }
                }
            };
            if n != block as isize {
                return None;
            }
        }
        best = best.max(moved as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    Some(best)
}

fn peers_script() -> std::path::PathBuf {
    std::env::var_os("HIXL_PEERS")
        .map(Into::into)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/bench-anchors.sh")
        })
}

/// Runs `bench-anchors.sh ARGS` and reads the number on its last line.
pub(crate) fn anchor(args: &[&str]) -> Option<f64> {
    let out = Command::new("bash")
        .arg(peers_script())
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .rev()
        .find_map(|l| l.trim().parse::<f64>().ok())
        .filter(|v| *v > 0.0)
}
