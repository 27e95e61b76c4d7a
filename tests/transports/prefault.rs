//! Same-host prefaulting (`Options::prefault_budget`, the string key `hixl.PrefaultBudget`): the first transfers after connect take
//! no page fault per page of the peer's memory, and a link populates no more than its budget.
//! Faults are counted with `getrusage(RUSAGE_THREAD)` on the calling thread (every call here
//! is below the 1 MiB from which a batch shares its copies with a helper thread), mappings'
//! resident bytes read from `/proc/self/smaps`: no timing.

use crate::common;

use std::time::Duration;

use common::{Peer, Rng, client_with, fnv1a, same_host_available};
use hixl::{Options, SameHost, TransferDesc, TransferOp, TransportKind};

const T: Duration = Duration::from_secs(20);
const PAGE: usize = 4096;
/// Bytes per call: below the helper thread's 1 MiB, so this thread makes every copy.
const CALL: usize = 512 << 10;
/// Bytes per descriptor.
const BLOCK: usize = 32 << 10;

/// Minor page faults this thread has taken so far.
fn thread_faults() -> i64 {
    // SAFETY: a zeroed rusage is valid output space for getrusage.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a live rusage the call fills.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) }, 0);
    r.ru_minflt
}

/// The resident bytes of this process's one mapping of exactly `len` bytes (the peer's region,
/// given an odd size no other mapping has), from `/proc/self/smaps`.
fn mapping_rss(len: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_it = false;
    let mut found = Vec::new();
    for line in smaps.lines() {
        let mut w = line.split_whitespace();
        if let Some(range) = w.next().filter(|r| r.contains('-') && !r.ends_with(':')) {
            let (a, b) = range.split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            in_it = b - a == len && line.contains("memfd:");
        } else if in_it && line.starts_with("Rss:") {
            found.push(w.next().unwrap().parse::<usize>().unwrap() * 1024);
        }
    }
    assert_eq!(found.len(), 1, "one mapping of {len} bytes: {found:?}");
    found[0]
}

/// WRITEs `data` over the peer's region from its start in calls of [`CALL`] bytes (descriptors
/// of [`BLOCK`]), from this thread; the faults this thread took meanwhile.
fn write_all(link: &hixl::Link<'_>, buf: &hixl::Region, peer: &Peer, len: usize) -> i64 {
    let f0 = thread_faults();
    for call in (0..len).step_by(CALL) {
        let descs: Vec<_> = (call..(call + CALL).min(len))
            .step_by(BLOCK)
            .map(|off| {
                let n = BLOCK.min(len - off);
                TransferDesc::new(
                    buf.range(off..off + n).unwrap(),
                    link.remote(peer.addr + off as u64, n as u64).unwrap(),
                )
            })
            .collect();
        link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
    }
    thread_faults() - f0
}

/// The first WRITE of a 16 MiB region after connect: about one fault per page of the peer's
/// memory with prefaulting off (the control; measured 4098 for 4096 pages), next to none with
/// the default budget (measured 1); the data arrives either way.
#[test]
fn first_transfer_after_connect_takes_no_page_faults() {
    if !same_host_available() {
        return;
    }
    let len = 16 << 20;
    let pages = (len / PAGE) as i64;
    for (budget, seed) in [(Some(0), 71), (None, 72)] {
        let mut peer = Peer::spawn("127.0.0.1", len, seed, "hostbuffer");
        // no budget through the string key the C ABI, C++ and Python pass (their options maps)
        let opts = match budget {
            Some(b) => Options::from_pairs([
                ("hixl.SameHost", "require".to_owned()),
                ("hixl.PrefaultBudget", b.to_string()),
            ])
            .unwrap(),
            None => Options::default().same_host(SameHost::Require),
        };
        let (cli, mut buf) = client_with(len, opts);
        let data = Rng::new(seed + 100).bytes(len);
        buf.write_at(0, &data).unwrap(); // the local pages are touched before counting
        let link = cli.connect_timeout(&peer.name, T).unwrap();
        assert_eq!(link.transport(), TransportKind::SameHost);
        let faults = write_all(&link, &buf, &peer, len);
        if budget == Some(0) {
            assert!(
                faults >= pages * 9 / 10,
                "without prefaulting, a fault per page: {faults} for {pages} pages"
            );
        } else {
            // none where the connect populated it all (a connect slowed past half its
            // deadline leaves the rest to the WRITE, whose populate faults sixteen pages at once)
            assert!(
                faults <= pages / 8,
                "prefaulted: {faults} faults for {pages} pages"
            );
        }
        assert_eq!(peer.sum(0, len as u64), fnv1a(&data), "budget {budget:?}");
        drop(link);
        peer.quit();
    }
}

/// A 40 MiB (and 12 KiB) region with a budget of 16 MiB: connect populates at most the budget
/// (the mapping's resident bytes), and the first WRITE of the whole region faults on about every
/// page beyond it (no batch populates past the budget) and on none within it (measured: 6137-6147
/// faults for 6147 pages beyond).
#[test]
fn prefault_stays_within_its_budget() {
    if !same_host_available() {
        return;
    }
    let len = (40 << 20) + 3 * PAGE;
    let budget = 16 << 20;
    let mut peer = Peer::spawn("127.0.0.1", len, 73, "hostbuffer");
    let opts = Options::default()
        .same_host(SameHost::Require)
        .prefault_budget(budget as u64);
    // the local region one page longer: the peer's is the only mapping of `len` bytes
    let (cli, mut buf) = client_with(len + PAGE, opts);
    let data = Rng::new(173).bytes(len);
    buf.write_at(0, &data).unwrap();
    let link = cli.connect_timeout(&peer.name, T).unwrap();
    assert_eq!(link.transport(), TransportKind::SameHost);
    let rss = mapping_rss(len);
    // the kernel's fault-around maps the rest of a 64 KiB-aligned window past the last page
    // populated (pages the peer's memory holds already): at most 15 pages
    assert!(
        rss <= budget + 15 * PAGE,
        "connect populated {rss} bytes, over its budget"
    );
    let faults = write_all(&link, &buf, &peer, len);
    let beyond = ((len - budget) / PAGE) as i64;
    assert!(
        faults >= beyond * 9 / 10 && faults <= beyond + (budget / PAGE) as i64 / 8,
        "{faults} faults; {beyond} pages lie beyond the budget"
    );
    assert_eq!(
        mapping_rss(len),
        len,
        "every page is mapped after the WRITE"
    );
    assert_eq!(peer.sum(0, len as u64), fnv1a(&data));
    drop(link);
    peer.quit();
}
