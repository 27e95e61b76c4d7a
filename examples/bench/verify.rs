//! Every row checks its data after its timed loop: one call of the row's own descriptors runs
//! again on fresh random bytes, and the serving process (which holds the remote memory) hashes
//! the remote ranges; they must hash as the client's local ranges do after the call. A WRITE
//! first fills the local ranges with the fresh bytes; a READ fills them too, so bytes it did not
//! move would still be there and fail the check. The server's side is read by the serving
//! process itself (`SUM OFFSET LEN` on its stdin), not by another transfer, so a READ and a
//! WRITE that were wrong the same way cannot vouch for each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hixl::testkit::Rng;
use hixl::{Link, Region, TransferDesc, TransferOp};

/// The timeout of every call of the benchmark.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A remote range and the hash its bytes must have.
pub(crate) struct Check {
    pub off: u64,
    pub len: usize,
    pub hash: u64,
}

/// A fast 64-bit hash of `data` (eight bytes a step: the server hashes up to one call's bytes,
/// 64 MiB at 16 MiB x 4); not a cryptographic one, a check of what was moved.
pub(crate) fn hash(data: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ data.len() as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    for &b in words.remainder() {
        h = (h.rotate_left(23) ^ u64::from(b)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

/// A seed not used before in this process (nor, likely, in another).
pub(crate) fn fresh_seed() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
        ^ N.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x1_0001)
}

/// Runs `call` ((local offset, remote offset, length) per descriptor, on `link`'s first remote
/// region) once more as `op` on fresh random bytes, and returns what the remote ranges must
/// hash to now.
pub(crate) fn check_call<M>(
    link: &Link<'_>,
    buf: &mut Region<M>,
    op: TransferOp,
    call: &[(usize, u64, usize)],
) -> Result<Vec<Check>, Box<dyn std::error::Error>> {
    let mut rng = Rng::new(fresh_seed());
    for &(l, _, len) in call {
        buf.write_at(l, &rng.bytes(len))?;
    }
    {
        let remote = link.regions().next().ok_or("the server has no region")?;
        let descs = call
            .iter()
            .map(|&(l, r, len)| {
                Ok(TransferDesc::new(
                    buf.range(l..l + len)?,
                    remote.range(r..r + len as u64)?,
                ))
            })
            .collect::<Result<Vec<_>, hixl::Error>>()?;
        link.transfer_sync(op, &descs, CALL_TIMEOUT)?;
    }
    let mut bytes = Vec::new();
    call.iter()
        .map(|&(l, r, len)| {
            bytes.resize(len, 0);
            buf.read_at(l, &mut bytes)?;
            Ok(Check {
                off: r,
                len,
                hash: hash(&bytes),
            })
        })
        .collect()
}

/// Compares `checks` with the serving side's hashes (`sum(offset, len)`); `what` names the row.
pub(crate) fn confirm(
    checks: &[Check],
    what: &str,
    mut sum: impl FnMut(u64, usize) -> Result<u64, Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    for c in checks {
        let there = sum(c.off, c.len)?;
        if there != c.hash {
            return Err(format!(
                "data check failed ({what}): after the call, bytes {}..{} of the server's region \
                 (hash {there:016x}) differ from the client's local range (hash {:016x})",
                c.off,
                c.off + c.len as u64,
                c.hash
            )
            .into());
        }
    }
    Ok(())
}
