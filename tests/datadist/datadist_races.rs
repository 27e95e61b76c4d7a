//! LLM-DataDist's registrations against what runs beside them (issue #42, items 7 and 8):
//! unregistering a cache carved from a memory pool while this instance's own pull writes it,
//! and registering or unregistering while a role switch replaces the engine. The peer (the
//! prompt whose cache is pulled, or a plain engine that writes at the address a cache had) is
//! another process, `hixl-peer datadist-serve`.

use crate::common;
use crate::serve_child::Peer;

use std::sync::Barrier;

use common::Rng;
use hixl::datadist::{
    CacheDesc, CacheKind, ClusterInfo, DataDist, DataType, Layers, LlmStatus, Placement,
    RemoteCache, Role,
};

const PAGE: usize = 4096;
/// `PARAM_INVALID`: what a WRITE to memory outside the peer's table gets.
const PARAM_INVALID: u32 = 103_900;

/// A cluster of this process that does not listen, with pulls and pushes of `wait_ms`.
fn client(cluster: u64, wait_ms: u32) -> DataDist {
    let dd = DataDist::new(cluster, Role::Decoder);
    let opts = [("llm.SyncKvCacheWaitTime".to_owned(), wait_ms.to_string())];
    dd.initialize(&opts).unwrap();
    dd
}

/// A one-tensor host cache of `blocks` blocks of `block` bytes.
fn desc(blocks: u64, block: u64) -> CacheDesc {
    CacheDesc {
        placement: Placement::Host,
        num_tensors: 1,
        data_type: DataType::FLOAT16,
        shape: vec![blocks as i64, (block / 2) as i64],
    }
}

/// Registers the blocks cache `desc` over the one tensor at `addr`.
///
/// # Safety
/// `DataDist::register_cache`'s, for `addr..addr + desc`'s tensor size.
unsafe fn register(dd: &DataDist, desc: &CacheDesc, addr: u64) -> hixl::datadist::Result<i64> {
    // SAFETY: the caller's.
    unsafe { dd.register_cache(desc, &[addr], CacheKind::Blocks, 0, &[]) }
}

/// The pages (4 KiB from `p`) of `len` bytes at `p` in which some byte is not `sentinel`.
///
/// # Safety
/// `p..p + len` is allocated and readable, and `p` is 8-byte aligned.
unsafe fn pages_not(p: *const u8, len: usize, sentinel: u8) -> usize {
    let word = u64::from_ne_bytes([sentinel; 8]);
    let words = p.cast::<u64>();
    (0..len / PAGE)
        .filter(|i| {
            (0..PAGE / 8).any(|j| {
                // SAFETY: inside the caller's range, aligned (the caller's); volatile,
                // as another thread of this process (the engine's) may still be writing it
                // when the rule under test is broken
                (unsafe { words.add(i * PAGE / 8 + j).read_volatile() }) != word
            })
        })
        .count()
}

#[test]
fn unregistering_a_pool_cache_waits_for_the_pull_that_writes_it() {
    // a decoder with a 64 MiB host pool pulls a prompt's 64 MiB blocks cache into a cache
    // carved from the pool; once the first bytes landed it unregisters that cache, and the
    // range is handed out again at once (a new cache over the same bytes, filled with a
    // sentinel), as the Python package's deallocate/allocate do
    const ROUNDS: usize = 6;
    const BLOCKS: u64 = 16_384;
    const BLOCK: u64 = PAGE as u64;
    let len = (BLOCKS * BLOCK) as usize;
    let peer = Peer::spawn(7, 1, BLOCKS, BLOCK, 300, 9);
    let theirs_last = Rng::new(300).bytes(len)[len - PAGE..].to_vec();
    let dd = client(2, 60_000);
    let mut pool = vec![0u64; len / 8];
    let base = pool.as_mut_ptr().cast::<u8>();
    // SAFETY: `pool` stays allocated and unmoved until after `dd` is finalized below; this
    // test touches it only through `base`, and checks what a pull wrote only after the pull
    // returned (or, where the rule under test is broken, reads it volatile while it may run)
    unsafe { dd.register_pool(Placement::Host, base as u64, len as u64) }.unwrap();
    let (ret, _) = dd
        .link_clusters(&[ClusterInfo::at(7, peer.addr)], 10_000)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    let key = RemoteCache::Blocks {
        cluster_id: 7,
        model_id: 9,
    };
    let all: Vec<u64> = (0..BLOCKS).collect();
    let (mut incomplete, mut written) = (0, 0);
    let mut raced = 0;
    for round in 0..ROUNDS {
        // SAFETY: inside the pool; nothing moves into it between rounds
        unsafe { base.write_bytes(0, len) };
        // SAFETY: inside the pool (registered until finalize)
        let id = unsafe { register(&dd, &desc(BLOCKS, BLOCK), base as u64) }.unwrap();
        std::thread::scope(|s| {
            let pull = s.spawn(|| dd.pull(&key, id, 0, -1, Some((&all, &all)), &Layers::all()));
            // the pull's first bytes landed (its first 8 are the peer's random bytes, which
            // are not all 0), or it ended already
            // SAFETY: inside the pool; volatile, as the pull writes it
            while unsafe { base.cast::<u64>().read_volatile() } == 0 && !pull.is_finished() {
                std::thread::yield_now();
            }
            raced += usize::from(!pull.is_finished());
            dd.unregister_cache(id).unwrap();
            // what the pull moved is all there once the cache is unregistered: its last page
            // SAFETY: inside the pool; volatile, as the pull writes it when the rule is broken
            let last: Vec<u8> = (len - PAGE..len)
                .map(|i| unsafe { base.add(i).read_volatile() })
                .collect();
            if last[..] != theirs_last[..] {
                incomplete += 1;
            }
            // handed out again at once
            // SAFETY: inside the pool
            let again = unsafe { register(&dd, &desc(BLOCKS, BLOCK), base as u64) }.unwrap();
            // SAFETY: inside the pool; the new cache is this test's, no transfer of its runs
            unsafe { base.write_bytes(0xA5, len) };
            pull.join().unwrap().expect("the pull succeeds");
            // SAFETY: inside the pool
            let w = unsafe { pages_not(base, len, 0xA5) };
            if w > 0 {
                eprintln!(
                    "round {round}: {w} of {} pages written after unregister returned",
                    len / PAGE
                );
                written += 1;
            }
            dd.unregister_cache(again).unwrap();
        });
    }
    eprintln!("{raced} of {ROUNDS} rounds unregistered while the pull ran");
    assert_eq!(
        (incomplete, written),
        (0, 0),
        "of {ROUNDS} rounds: the pull was not complete when unregister returned; it wrote the \
         range after it was handed out again"
    );
    dd.finalize();
    drop(pool);
    peer.quit();
}

/// Caches of one page that the instances of the role-switch races hold besides the one under
/// test: a switch registers each again with its new engine, so the switch spends a while on
/// them (as one of a serving instance does), and the race has room to land there.
const FILLERS: usize = 48;

/// Rounds of a race between a role switch that replaces a client-only instance's engine with
/// one listening on an ephemeral port and `other` (given the instance and the address of a
/// cache over `mem`, registered first when `registered`); after both, `check` sees the
/// instance, the peer and the result of `other`, and says whether the round broke the rule.
///
/// `other` starts after a random part of how long a switch takes (measured first, on an
/// instance of the same caches): the rounds spread it over the switch, so that some land while
/// the switch registers the caches with the new engine. That is not a synchronization: every
/// round checks the rule, wherever it landed.
fn race_role_switch<T: Send>(
    rounds: usize,
    registered: bool,
    other: impl Fn(&DataDist, Option<i64>, u64) -> T + Sync,
    mut check: impl FnMut(&DataDist, &mut Peer, &mut [u8], T, usize) -> bool,
) -> usize {
    let mut peer = Peer::spawn(7, 1, 1, PAGE as u64, 1, 9);
    let mut words = vec![0u64; 16 * PAGE / 8];
    // SAFETY: the bytes of `words`, which outlives `mem` and is not used otherwise
    let mem = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 16 * PAGE) };
    let mut fillers = vec![0u8; FILLERS * PAGE];
    let listen = [("llm.ListenIpInfo".to_owned(), "127.0.0.1:0".to_owned())];
    let instance = |mem: &mut [u8], fillers: &mut [u8]| {
        let dd = client(2, 10_000);
        for f in fillers.chunks_mut(PAGE) {
            // SAFETY: `fillers` outlives every instance (each is finalized in its round) and
            // is not touched otherwise
            unsafe { register(&dd, &desc(1, PAGE as u64), f.as_mut_ptr() as u64) }.unwrap();
        }
        // SAFETY: `mem` outlives `dd` (finalized at the end of the round) and is read or
        // written by this test only while no transfer of the peer's runs (between its
        // commands)
        let id = registered
            .then(|| unsafe { register(&dd, &desc(16, PAGE as u64), mem.as_mut_ptr() as u64) });
        (dd, id.map(Result::unwrap))
    };
    let switch_takes = {
        let (dd, _) = instance(mem, &mut fillers);
        let t = std::time::Instant::now();
        dd.set_role(Role::Prompt, &listen).unwrap();
        let t = t.elapsed();
        dd.finalize();
        t
    };
    let mut rng = Rng::new(77);
    let mut broken = 0;
    for round in 0..rounds {
        let (dd, id) = instance(mem, &mut fillers);
        let addr = mem.as_mut_ptr() as u64;
        let delay = switch_takes.mul_f64(rng.below(1000) as f64 / 1000.0);
        let barrier = Barrier::new(2);
        let (switched, got) = std::thread::scope(|s| {
            let switch = s.spawn(|| {
                barrier.wait();
                dd.set_role(Role::Prompt, &listen)
            });
            let got = s.spawn(|| {
                barrier.wait();
                let start = std::time::Instant::now();
                while start.elapsed() < delay {
                    std::hint::spin_loop();
                }
                other(&dd, id, addr)
            });
            (switch.join().unwrap(), got.join().unwrap())
        });
        switched.unwrap();
        if check(&dd, &mut peer, mem, got, round) {
            broken += 1;
        }
        dd.finalize();
    }
    peer.quit();
    drop(words);
    broken
}

/// The name of `dd`'s engine, where it listens now.
fn name(dd: &DataDist) -> String {
    dd.listen_addr()
        .expect("it listens after the switch")
        .to_string()
}

#[test]
fn unregister_racing_a_role_switch_leaves_nothing_a_peer_can_write() {
    // a cache over this test's 16 pages is unregistered while a role switch replaces the
    // engine; when both returned, a peer that connects to the new address must not reach them
    const ROUNDS: usize = 200;
    let unregister = |dd: &DataDist, id: Option<i64>, _| dd.unregister_cache(id.unwrap());
    let broken = race_role_switch(ROUNDS, true, unregister, |dd, peer, mem, r, round| {
        if let Err(e) = r {
            // (it ran on the engine the switch finalized)
            eprintln!("round {round}: unregister failed: {e}");
            return true;
        }
        mem.fill(0x5A);
        let status = peer.write(&name(dd), mem.as_ptr() as u64, mem.len(), round as u64);
        // SAFETY: `mem` is alive; the peer's WRITE returned
        let w = unsafe { pages_not(mem.as_ptr(), mem.len(), 0x5A) };
        if status == 0 || w > 0 {
            eprintln!("round {round}: the peer wrote {w} of 16 pages after unregister returned");
            return true;
        }
        assert_eq!(status, PARAM_INVALID, "round {round}");
        false
    });
    eprintln!("unregister racing a switch: {broken} of {ROUNDS} rounds broke the rule");
    assert_eq!(
        broken, 0,
        "of {ROUNDS} rounds, a peer wrote after unregister"
    );
}

#[test]
fn register_racing_a_role_switch_is_reachable_at_the_new_address_and_unregisters() {
    // a cache over this test's 16 pages is registered while a role switch replaces the engine;
    // when both returned, a peer that connects to the new address reaches it, and once it is
    // unregistered no longer
    const ROUNDS: usize = 100;
    // SAFETY: the 16 pages at `addr` are the round's `mem` (see `race_role_switch`)
    let register_now =
        |dd: &DataDist, _, addr| unsafe { register(dd, &desc(16, PAGE as u64), addr) };
    let broken = race_role_switch(ROUNDS, false, register_now, |dd, peer, mem, r, round| {
        let id = match r {
            Ok(id) => id,
            Err(e) => {
                eprintln!("round {round}: register failed: {e}");
                return true;
            }
        };
        let seed = 1000 + round as u64;
        let status = peer.write(&name(dd), mem.as_ptr() as u64, mem.len(), seed);
        if status != 0 || mem[..] != Rng::new(seed).bytes(mem.len())[..] {
            eprintln!("round {round}: the peer's WRITE at the new address got {status}");
            return true;
        }
        if let Err(e) = dd.unregister_cache(id) {
            eprintln!("round {round}: unregister failed: {e}");
            return true;
        }
        mem.fill(0x5A);
        let status = peer.write(&name(dd), mem.as_ptr() as u64, mem.len(), seed);
        // SAFETY: `mem` is alive; the peer's WRITE returned
        let w = unsafe { pages_not(mem.as_ptr(), mem.len(), 0x5A) };
        if status != PARAM_INVALID || w > 0 {
            eprintln!("round {round}: after unregister the peer got {status}, wrote {w} pages");
            return true;
        }
        false
    });
    eprintln!("register racing a switch: {broken} of {ROUNDS} rounds broke the rule");
    assert_eq!(
        broken, 0,
        "of {ROUNDS} rounds, the cache was not the new engine's"
    );
}
