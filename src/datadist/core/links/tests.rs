//! A claim on a linked-back cluster (a link note from another engine, or from its engine
//! restarted on its address), settled at the next push: a broken link back is no proof that
//! its peer is gone, so a live decoder keeps its cluster; its engine restarted on its
//! address gets the push; a claim is bound when the engine it contested unlinks.

use crate::datadist::DataDist;
use crate::datadist::types::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataType, Layers, LlmStatus, Placement, Result,
};
use crate::datadist::{RemoteCache, Role};
use crate::sync::lock;
use crate::testkit::Rng;

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

#[test]
fn a_broken_link_back_is_no_proof_and_a_restart_on_the_address_gets_the_push() {
    let len = (BLOCKS * BLOCK) as usize;
    let prompt = listening(100, Role::Prompt, "127.0.0.1:0");
    let mut pk = Rng::new(5).bytes(len);
    let pid = register(&prompt, &mut pk);
    let (decoder, dk) = linked_decoder(&prompt, "127.0.0.1:0");
    push(&prompt, pid, 1, 0).unwrap();
    assert!(block(&dk, 0) == block(&pk, 1), "the first push");

    // the link back breaks while the decoder lives (as an unanswered heartbeat breaks it),
    // and another engine claims the decoder's id
    let back = lock(&prompt.links)
        .get(&DECODER)
        .unwrap()
        .link
        .upgrade()
        .unwrap();
    back.break_for_test();
    drop(back);
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
