//! A claim on a linked-back cluster (a link note from another engine, or from its engine
//! restarted on its address), settled at the next push: a broken link back is no proof that
//! its peer is gone, so a live decoder keeps its cluster; its engine restarted on its
//! address gets the push; a claim is bound when the engine it contested unlinks.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::datadist::DataDist;
use crate::datadist::types::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataType, Layers, LlmStatus, Placement, Result,
};
use crate::datadist::{RemoteCache, Role};
use crate::sync::lock;
use crate::testkit::Rng;

thread_local! {
    /// Run after each READ of a peer's cache table, before its bytes are copied out.
    pub(in crate::datadist::core) static AFTER_TABLE_READ: RefCell<Option<Box<dyn FnMut()>>> =
        const { RefCell::new(None) };
}

const DECODER: u64 = 7;
const BLOCKS: u64 = 8;
const BLOCK: u64 = 4096;

/// A cluster listening at `at` (`127.0.0.1:0`: a port of its own).
fn listening(cluster: u64, role: Role, at: &str) -> DataDist {
    let dd = DataDist::new(cluster, role);
    let opts = [
        ("llm.ListenIpInfo".to_owned(), at.to_owned()),
        ("llm.SyncKvCacheWaitTime".to_owned(), "10000".to_owned()),
    ];
    dd.initialize(&opts).unwrap();
    dd
}

/// Registers `mem` as a blocks cache of one tensor under model 9.
fn register(dd: &DataDist, mem: &mut [u8]) -> i64 {
    let desc = CacheDesc {
        placement: Placement::Host,
        num_tensors: 1,
        data_type: DataType::FLOAT16,
        shape: vec![BLOCKS as i64, (BLOCK / 2) as i64],
    };
    let key = CacheKey {
        req_id: u64::MAX,
        model_id: 9,
    };
    let addrs = [mem.as_mut_ptr() as u64];
    // SAFETY: the test keeps `mem` allocated and unmoved until the instance is finalized,
    // and reads it only after the pushes into it returned.
    unsafe { dd.register_cache(&desc, &addrs, CacheKind::Blocks, 0, &[key]) }.unwrap()
}

fn link(dd: &DataDist, to: &DataDist, id: u64) {
    let c = ClusterInfo::at(id, to.listen_addr().unwrap());
    let (ret, rets) = dd.link_clusters(&[c], 10_000).unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS, "{rets:?}");
}

/// A decoder cluster listening at `at`, its cache zeroed (the `Vec`'s heap buffer stays
/// where it is registered when the pair moves), linked to `prompt`.
fn linked_decoder(prompt: &DataDist, at: &str) -> (DataDist, Vec<u8>) {
    let d = listening(DECODER, Role::Decoder, at);
    let mut mem = vec![0u8; (BLOCKS * BLOCK) as usize];
    register(&d, &mut mem);
    link(&d, prompt, 100);
    (d, mem)
}

/// The prompt pushes its block `from` into block `to` of the decoder cluster's cache.
fn push(prompt: &DataDist, pid: i64, from: u64, to: u64) -> Result<()> {
    let key = RemoteCache::Blocks {
        cluster_id: DECODER,
        model_id: 9,
    };
    prompt.push(pid, &key, 0, Some((&[from], &[to])), &Layers::all())
}

fn block(mem: &[u8], b: u64) -> &[u8] {
    &mem[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
}

/// A prompt (its blocks random from `seed`, registered) and a decoder linked to it, which has
/// its first push (the prompt's block 1 in its block 0): the prompt, its cache id and memory,
/// the decoder and its memory.
fn pushed_once(seed: u64) -> (DataDist, i64, Vec<u8>, DataDist, Vec<u8>) {
    let prompt = listening(100, Role::Prompt, "127.0.0.1:0");
    let mut pk = Rng::new(seed).bytes((BLOCKS * BLOCK) as usize);
    let pid = register(&prompt, &mut pk);
    let (decoder, dk) = linked_decoder(&prompt, "127.0.0.1:0");
    push(&prompt, pid, 1, 0).unwrap();
    assert!(block(&dk, 0) == block(&pk, 1), "the first push");
    (prompt, pid, pk, decoder, dk)
}

/// Breaks the prompt's link back to the decoder, as an unanswered heartbeat would (the
/// decoder lives).
fn break_link_back(prompt: &DataDist) {
    let back = lock(&prompt.links)
        .get(&DECODER)
        .unwrap()
        .link
        .upgrade()
        .unwrap();
    back.break_for_test();
}

#[test]
fn a_broken_link_back_is_no_proof_and_a_restart_on_the_address_gets_the_push() {
    let (prompt, pid, pk, decoder, dk) = pushed_once(5);

    // the link back breaks while the decoder lives (as an unanswered heartbeat breaks it),
    // and another engine claims the decoder's id
    break_link_back(&prompt);
    let (impostor, ik) = linked_decoder(&prompt, "127.0.0.1:0");
    push(&prompt, pid, 2, 1).unwrap();
    assert!(block(&dk, 1) == block(&pk, 2), "the live decoder's push");
    assert!(
        ik.iter().all(|&b| b == 0),
        "the claim got the prompt's blocks"
    );
    impostor.finalize();

    // the decoder restarts on its address (a new engine: its note is a claim from the
    // engine it had); the prompt's next push reaches the new one
    let at = decoder.listen_addr().unwrap().to_string();
    decoder.finalize();
    let (again, ak) = linked_decoder(&prompt, &at);
    push(&prompt, pid, 3, 2).unwrap();
    assert!(
        block(&ak, 2) == block(&pk, 3),
        "the restarted decoder's push"
    );

    // another engine claims the id while the decoder is linked; the decoder unlinks: the
    // claim is bound in its place, and gets the next push
    let (next, nk) = linked_decoder(&prompt, "127.0.0.1:0");
    let c = ClusterInfo::at(100, prompt.listen_addr().unwrap());
    let (ret, _) = again.unlink_clusters(&[c], 10_000, false).unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    push(&prompt, pid, 4, 3).unwrap();
    assert!(block(&nk, 3) == block(&pk, 4), "the claim's push");
    assert!(block(&ak, 3).iter().all(|&b| b == 0), "the unlinked one's");
    next.finalize();
    again.finalize();
    prompt.finalize();
}

/// A decoder's link back breaks while the decoder lives (as an unanswered heartbeat breaks
/// it), and no other engine claims its id: the prompt's next push links back anew and lands.
/// Once the decoder is gone, another cluster listening at its address, which never linked to
/// the prompt, gets no push (`LLM_NOT_YET_LINK`).
#[test]
fn a_broken_link_back_is_made_again_at_the_next_push() {
    let (prompt, pid, pk, decoder, dk) = pushed_once(6);
    for (from, to) in [(2, 1), (3, 2)] {
        break_link_back(&prompt);
        push(&prompt, pid, from, to).unwrap();
        assert!(
            block(&dk, to) == block(&pk, from),
            "the push after the break"
        );
    }
    // the decoder goes; another cluster's engine listens at its address, with a cache under
    // the same model, and never links to the prompt
    let at = decoder.listen_addr().unwrap().to_string();
    decoder.finalize();
    let other = listening(DECODER + 1, Role::Decoder, &at);
    let mut ok = vec![0u8; (BLOCKS * BLOCK) as usize];
    register(&other, &mut ok);
    // (the first push meets the old link, and breaks it; the next ones link back anew)
    let mut last = None;
    for _ in 0..3 {
        last = Some(push(&prompt, pid, 4, 3).expect_err("a push into a process that never linked"));
    }
    let e = last.unwrap();
    assert_eq!(e.status, LlmStatus::LLM_NOT_YET_LINK, "{e}");
    assert!(
        ok.iter().all(|&b| b == 0),
        "another cluster at the address got the push"
    );
    other.finalize();
    prompt.finalize();
}

/// A decoder that pulls from `prompt` by a blocks key, block 0 into its block 0, with the
/// sync timeout `ms`.
fn pulling_decoder(prompt: &DataDist, ms: u32) -> (Arc<DataDist>, i64, Vec<u8>) {
    let d = DataDist::new(DECODER, Role::Decoder);
    let opts = [
        ("llm.ListenIpInfo".to_owned(), "127.0.0.1:0".to_owned()),
        ("llm.SyncKvCacheWaitTime".to_owned(), ms.to_string()),
    ];
    d.initialize(&opts).unwrap();
    let mut mem = vec![0u8; (BLOCKS * BLOCK) as usize];
    let id = register(&d, &mut mem);
    link(&d, prompt, 100);
    (Arc::new(d), id, mem)
}

fn pull(d: &DataDist, id: i64) -> Result<()> {
    let key = RemoteCache::Blocks {
        cluster_id: 100,
        model_id: 9,
    };
    d.pull(&key, id, 0, -1, Some((&[0], &[0])), &Layers::all())
}

/// A peer whose cache table never reads whole (its version stays odd, as if always being
/// rewritten), and answers slowly: the fetch ends within the pull's sync timeout
/// (`LLM_TIMEOUT`), not after every retry of every region shaped like a table.
#[test]
fn a_table_that_never_reads_whole_costs_one_sync_timeout() {
    let prompt = listening(100, Role::Prompt, "127.0.0.1:0");
    let mut pk = Rng::new(7).bytes((BLOCKS * BLOCK) as usize);
    register(&prompt, &mut pk);
    // the version word (after the magic) made odd: "being rewritten"
    {
        let s = lock(&prompt.state);
        let table = s.as_ref().unwrap().table.as_ptr();
        // SAFETY: the table buffer is this process's, mapped while the instance lives, and
        // its 32-byte header is in it; the serving engine only reads it (by syscalls).
        unsafe {
            let v = table.add(8).cast::<u64>();
            v.write_unaligned(v.read_unaligned() | 1);
        }
    }
    let ms = 300;
    let (d, id, _mem) = pulling_decoder(&prompt, ms);
    // each READ of the table answered 40 ms late
    AFTER_TABLE_READ.set(Some(Box::new(|| {
        std::thread::sleep(Duration::from_millis(40))
    })));
    let t = Instant::now();
    let e = pull(&d, id).unwrap_err();
    AFTER_TABLE_READ.set(None);
    assert_eq!(e.status, LlmStatus::LLM_TIMEOUT, "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(ms.into()) * 4,
        "the fetch took {:?}",
        t.elapsed()
    );
    d.finalize();
    prompt.finalize();
}

/// The instance is finalized while a pull's READ of the peer's table has just returned:
/// the bytes are copied out of a buffer still mapped (the pull fails; nothing is read from
/// freed memory).
#[test]
fn a_finalize_under_a_table_fetch_frees_nothing_it_reads() {
    let prompt = listening(100, Role::Prompt, "127.0.0.1:0");
    let mut pk = Rng::new(8).bytes((BLOCKS * BLOCK) as usize);
    register(&prompt, &mut pk);
    let (d, id, _mem) = pulling_decoder(&prompt, 10_000);
    let ended = d.clone();
    AFTER_TABLE_READ.set(Some(Box::new(move || ended.finalize())));
    let r = pull(&d, id);
    AFTER_TABLE_READ.set(None);
    assert!(
        r.is_err(),
        "a pull of an instance finalized under it: {r:?}"
    );
    prompt.finalize();
}

/// Two prompts (clusters 100 and 101, their blocks random from `seed` and `seed + 1`) and a
/// decoder linked to both, whose pull from 100 (block 0 into its block 0) runs on a thread held
/// inside its table fetch (after the first READ, before the bytes are copied out, as a slow or
/// stopped peer holds it) until `go` is sent (or for 20 s).
struct HeldPull {
    a: DataDist,
    ak: Vec<u8>,
    b: DataDist,
    bk: Vec<u8>,
    d: Arc<DataDist>,
    id: i64,
    mem: Vec<u8>,
    slow: std::thread::JoinHandle<Result<()>>,
    go: std::sync::mpsc::Sender<()>,
}

impl HeldPull {
    fn new(seed: u64) -> Self {
        let a = listening(100, Role::Prompt, "127.0.0.1:0");
        let mut ak = Rng::new(seed).bytes((BLOCKS * BLOCK) as usize);
        register(&a, &mut ak);
        let b = listening(101, Role::Prompt, "127.0.0.1:0");
        let mut bk = Rng::new(seed + 1).bytes((BLOCKS * BLOCK) as usize);
        register(&b, &mut bk);
        let (d, id, mem) = pulling_decoder(&a, 20_000);
        link(&d, &b, 101);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let slow = {
            let d = d.clone();
            std::thread::spawn(move || {
                // (the first READ of the table held: its header's)
                let mut first = Some((held_tx, go_rx));
                AFTER_TABLE_READ.set(Some(Box::new(move || {
                    if let Some((held, go)) = first.take() {
                        held.send(()).unwrap();
                        let _ = go.recv_timeout(Duration::from_secs(20));
                    }
                })));
                let r = pull(&d, id);
                AFTER_TABLE_READ.set(None);
                r
            })
        };
        held_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        HeldPull {
            a,
            ak,
            b,
            bk,
            d,
            id,
            mem,
            slow,
            go,
        }
    }

    /// Lets the held pull go on, checks it landed its block, runs `then` on the decoder and
    /// its cache id, and finalizes the three.
    fn finish(self, then: impl FnOnce(&DataDist, i64)) {
        self.go.send(()).unwrap();
        self.slow.join().unwrap().unwrap();
        assert_eq!(block(&self.mem, 0), &self.ak[..BLOCK as usize]);
        then(&self.d, self.id);
        self.d.finalize();
        self.a.finalize();
        self.b.finalize();
    }
}

/// A pull from cluster 101 into `id`, block 1 into block 1.
fn pull_b(d: &DataDist, id: i64) -> Result<()> {
    let key = RemoteCache::Blocks {
        cluster_id: 101,
        model_id: 9,
    };
    d.pull(&key, id, 0, -1, Some((&[1], &[1])), &Layers::all())
}

/// A fetch of one peer's table that waits (here: its READ returned, and it is held before the
/// bytes are copied out, as a slow or stopped peer holds it) does not hold up a fetch of
/// another peer's: each fetch READs into a buffer of its own (they were serialised by one lock
/// of the instance, so a pull from a healthy peer waited out the slow one's sync timeout), and
/// neither overwrites the other's (both pulls land their own peer's bytes).
#[test]
fn a_slow_table_fetch_holds_up_no_fetch_from_another_peer() {
    let h = HeldPull::new(31);
    let t = Instant::now();
    pull_b(&h.d, h.id).unwrap();
    let took = t.elapsed();
    assert!(
        !h.slow.is_finished() && took < Duration::from_secs(10),
        "the pull from the healthy peer waited for the slow fetch ({took:?})"
    );
    assert_eq!(block(&h.mem, 1), &h.bk[BLOCK as usize..2 * BLOCK as usize]);
    h.finish(|_, _| {});
}

/// Unregistering a cache waits for its running pulls without the instance's registration lock:
/// while a pull into it waits on its peer (here: held inside its table fetch), a registration
/// of another cache goes on (it waited for the pull, since the unregistration held the lock
/// across that wait); the unregistration returns once the pull ended, and the pull's bytes
/// landed.
#[test]
fn an_unregistration_waiting_for_a_pull_holds_up_no_registration() {
    let h = HeldPull::new(33);
    let closing = {
        let d = h.d.clone();
        let id = h.id;
        std::thread::spawn(move || d.unregister_cache(id))
    };
    // the cache is being unregistered once a pull into it is refused
    let t0 = Instant::now();
    loop {
        match pull_b(&h.d, h.id) {
            Ok(()) => {}
            Err(e) if e.status == LlmStatus::LLM_KV_CACHE_NOT_EXIST => break,
            Err(e) => panic!("{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never closing");
    }
    let mut other = vec![0u8; (BLOCKS * BLOCK) as usize];
    let desc = CacheDesc {
        placement: Placement::Host,
        num_tensors: 1,
        data_type: DataType::FLOAT16,
        shape: vec![BLOCKS as i64, (BLOCK / 2) as i64],
    };
    let t = Instant::now();
    // SAFETY: `other` outlives the instance's registration (finalized by `finish`, before it
    // goes).
    let r = unsafe {
        h.d.register_cache(
            &desc,
            &[other.as_mut_ptr() as u64],
            CacheKind::Blocks,
            0,
            &[],
        )
    };
    let took = t.elapsed();
    assert!(r.is_ok(), "{r:?}");
    assert!(
        !h.slow.is_finished() && !closing.is_finished() && took < Duration::from_secs(10),
        "the registration waited for the pull the unregistration waited for ({took:?})"
    );
    h.finish(|d, id| {
        closing.join().unwrap().unwrap();
        let e = pull(d, id).unwrap_err();
        assert_eq!(e.status, LlmStatus::LLM_KV_CACHE_NOT_EXIST);
    });
    drop(other);
}

/// Clusters of one `link_clusters` call link side by side, as upstream's (16 at once): two
/// that never answer the HELLO (a listener that accepts nothing) and a live one take one
/// timeout, not two (each waited out the ones before it), and the live one is linked.
#[test]
fn clusters_that_do_not_answer_hold_up_no_other_link() {
    let prompt = listening(1, Role::Prompt, "127.0.0.1:0");
    let d = listening(DECODER, Role::Decoder, "127.0.0.1:0");
    let silent: Vec<std::net::TcpListener> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut clusters: Vec<ClusterInfo> = (silent.iter().enumerate())
        .map(|(i, l)| ClusterInfo::at(200 + i as u64, l.local_addr().unwrap()))
        .collect();
    clusters.push(ClusterInfo::at(100, prompt.listen_addr().unwrap()));
    let timeout_ms = 1500;
    let t0 = Instant::now();
    let (ret, rets) = d.link_clusters(&clusters, timeout_ms).unwrap();
    let took = t0.elapsed();
    assert_ne!(ret, LlmStatus::LLM_SUCCESS, "{rets:?}");
    assert_ne!(rets[0], LlmStatus::LLM_SUCCESS, "{rets:?}");
    assert_ne!(rets[1], LlmStatus::LLM_SUCCESS, "{rets:?}");
    assert_eq!(rets[2], LlmStatus::LLM_SUCCESS, "{rets:?}");
    assert!(
        took < Duration::from_millis(2 * timeout_ms as u64),
        "two silent clusters took {took:?} of a {timeout_ms} ms timeout each"
    );
    // unlinking them all at once: the live one goes, the others were never linked
    let (_, rets) = d.unlink_clusters(&clusters, 1000, false).unwrap();
    assert_eq!(
        rets,
        [
            LlmStatus::LLM_NOT_YET_LINK,
            LlmStatus::LLM_NOT_YET_LINK,
            LlmStatus::LLM_SUCCESS
        ]
    );
    d.finalize();
    prompt.finalize();
}
