//! LLM-DataDist on hixl (`hixl::datadist::DataDist`, the runtime-checked instance the C ABI and
//! the Python package sit on): a prompt and a decoder cluster, each listening, linked both
//! ways; pulls and pushes of blocks and batches of host caches with random data, checked byte
//! for byte against a model; layer ranges; and each bad input's LLM status.

// tensors are compared by index on both sides
#![allow(clippy::needless_range_loop)]

use crate::common;

use std::time::Duration;

use common::Rng;
use hixl::datadist::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataDist, DataType, IpInfo, Layers, LlmStatus,
    Placement, RemoteCache, Role,
};

const PROMPT: u64 = 0;
const DECODER: u64 = 1;

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An instance listening on a port of its own (retried if another takes it first).
fn instance(cluster: u64, role: Role) -> (DataDist, u16) {
    for _ in 0..20 {
        let port = free_port();
        let dd = DataDist::new(cluster, role);
        let opts = [
            ("llm.ListenIpInfo".to_owned(), format!("127.0.0.1:{port}")),
            ("llm.DeviceId".to_owned(), "0".to_owned()),
            ("llm.SyncKvCacheWaitTime".to_owned(), "5000".to_owned()),
        ];
        if dd.initialize(&opts).is_ok() {
            return (dd, port);
        }
    }
    panic!("no port to listen on");
}

fn cluster(id: u64, port: u16) -> ClusterInfo {
    ClusterInfo {
        remote_cluster_id: id,
        remote_role_type: 0,
        local_ip_infos: vec![],
        remote_ip_infos: vec![IpInfo {
            ip: "127.0.0.1".parse().unwrap(),
            port,
        }],
    }
}

/// `n` tensors of `blocks` blocks of `block` bytes each, in host memory.
struct Tensors {
    mem: Vec<Vec<u8>>,
    blocks: usize,
    block: usize,
}

impl Tensors {
    fn new(n: usize, blocks: usize, block: usize, seed: u64) -> Tensors {
        let mut rng = Rng::new(seed);
        Tensors {
            mem: (0..n).map(|_| rng.bytes(blocks * block)).collect(),
            blocks,
            block,
        }
    }
    fn desc(&self) -> CacheDesc {
        CacheDesc {
            placement: Placement::Host,
            num_tensors: self.mem.len() as u32,
            data_type: DataType::FLOAT16,
            shape: vec![self.blocks as i64, (self.block / 2) as i64],
        }
    }
    fn addrs(&mut self) -> Vec<u64> {
        self.mem.iter_mut().map(|m| m.as_mut_ptr() as u64).collect()
    }
    fn block(&self, t: usize, b: usize) -> &[u8] {
        &self.mem[t][b * self.block..(b + 1) * self.block]
    }
}

/// Registers `t` as a cache of `kind` under `keys`.
fn register(dd: &DataDist, t: &mut Tensors, kind: CacheKind, keys: &[CacheKey]) -> i64 {
    let (desc, addrs) = (t.desc(), t.addrs());
    // SAFETY: every test keeps its tensors alive and unmoved until after the instance is
    // finalized, and reads them only after the transfers touching them returned.
    unsafe { dd.register_cache(&desc, &addrs, kind, 0, keys) }.unwrap()
}

fn status<T: std::fmt::Debug>(r: hixl::datadist::Result<T>) -> LlmStatus {
    r.expect_err("expected an error").status
}

#[test]
fn pull_and_push_blocks_and_batches_between_two_clusters() {
    let (prompt, pport) = instance(PROMPT, Role::Prompt);
    let (decoder, dport) = instance(DECODER, Role::Decoder);
    // 4 tensors (2 layers of K and V) of 8 blocks of 4 KiB
    let mut pk = Tensors::new(4, 8, 4096, 1);
    let mut dk = Tensors::new(4, 8, 4096, 2);
    let model = CacheKey {
        req_id: u64::MAX,
        model_id: 7,
    };
    let pid = register(&prompt, &mut pk, CacheKind::Blocks, &[model]);
    let did = register(&decoder, &mut dk, CacheKind::Blocks, &[model]);
    assert_eq!((pid, did), (1, 1), "cache ids count from 1 per instance");

    // nothing linked yet
    let by_key = RemoteCache::Blocks {
        cluster_id: PROMPT,
        model_id: 7,
    };
    assert_eq!(
        status(decoder.pull(&by_key, did, 0, -1, Some((&[1], &[1])), &Layers::all())),
        LlmStatus::LLM_NOT_YET_LINK
    );
    let (ret, rets) = decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(
        (ret, rets),
        (LlmStatus::LLM_SUCCESS, vec![LlmStatus::LLM_SUCCESS])
    );
    let (ret, rets) = prompt
        .link_clusters(&[cluster(DECODER, dport)], 5000)
        .unwrap();
    assert_eq!(
        (ret, rets),
        (LlmStatus::LLM_SUCCESS, vec![LlmStatus::LLM_SUCCESS])
    );
    let (ret, rets) = decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(
        (ret, rets),
        (
            LlmStatus::LLM_ALREADY_LINK,
            vec![LlmStatus::LLM_ALREADY_LINK]
        )
    );

    // the decoder pulls prompt blocks 1, 2, 3 (one run) and 6 into its blocks 5, 6, 7 and 0
    decoder
        .pull(
            &by_key,
            did,
            0,
            -1,
            Some((&[1, 2, 3, 6], &[5, 6, 7, 0])),
            &Layers::all(),
        )
        .unwrap();
    for t in 0..4 {
        for (s, d) in [(1, 5), (2, 6), (3, 7), (6, 0)] {
            assert_eq!(
                dk.block(t, d),
                pk.block(t, s),
                "tensor {t} block {s} -> {d}"
            );
        }
    }
    // layer 1 only (tensors 2 and 3) of block 4, by cache id, into layer 0 of the decoder
    let fresh = Tensors::new(4, 8, 4096, 3);
    let before = dk.mem.clone();
    let by_id = RemoteCache::ById {
        cluster_id: PROMPT,
        cache_id: pid,
        batch_index: 0,
    };
    let layer = Layers {
        src: Some((1, 1)),
        dst: Some((0, 0)),
        per_layer: 2,
    };
    decoder
        .pull(&by_id, did, 0, -1, Some((&[4], &[4])), &layer)
        .unwrap();
    assert_eq!(dk.block(0, 4), pk.block(2, 4));
    assert_eq!(dk.block(1, 4), pk.block(3, 4));
    assert_eq!(dk.mem[2], before[2], "layer 1 of the decoder untouched");
    drop(fresh);

    // the decoder pushes its blocks 0 and 1 into the prompt's blocks 2 and 3, layer by layer
    let pbefore = pk.mem.clone();
    decoder
        .push(did, &by_key, 0, Some((&[0, 1], &[2, 3])), &Layers::all())
        .unwrap();
    for t in 0..4 {
        assert_eq!(pk.block(t, 2), dk.block(t, 0));
        assert_eq!(pk.block(t, 3), dk.block(t, 1));
        assert_eq!(
            pk.block(t, 5),
            &pbefore[t][5 * 4096..6 * 4096],
            "other blocks untouched"
        );
    }

    // bad input
    let pull = |src: &RemoteCache, s: &[u64], d: &[u64]| {
        status(decoder.pull(src, did, 0, -1, Some((s, d)), &Layers::all()))
    };
    assert_eq!(
        pull(&by_key, &[8], &[0]),
        LlmStatus::LLM_PARAM_INVALID,
        "block past the end"
    );
    assert_eq!(pull(&by_key, &[0], &[9]), LlmStatus::LLM_PARAM_INVALID);
    assert_eq!(
        pull(&by_key, &[0, 1], &[0]),
        LlmStatus::LLM_PARAM_INVALID,
        "lengths differ"
    );
    assert_eq!(
        pull(&by_key, &[], &[]),
        LlmStatus::LLM_PARAM_INVALID,
        "no block"
    );
    let unknown = RemoteCache::Blocks {
        cluster_id: PROMPT,
        model_id: 99,
    };
    assert_eq!(
        pull(&unknown, &[0], &[0]),
        LlmStatus::LLM_KV_CACHE_NOT_EXIST
    );
    let own = RemoteCache::Blocks {
        cluster_id: DECODER,
        model_id: 7,
    };
    assert_eq!(
        pull(&own, &[0], &[0]),
        LlmStatus::LLM_PARAM_INVALID,
        "its own cluster"
    );
    assert_eq!(
        status(decoder.pull(&by_key, 99, 0, -1, Some((&[0], &[0])), &Layers::all())),
        LlmStatus::LLM_KV_CACHE_NOT_EXIST,
        "no such local cache"
    );
    let reversed = Layers {
        src: Some((1, 0)),
        dst: Some((0, 1)),
        per_layer: 2,
    };
    assert_eq!(
        status(decoder.pull(&by_key, did, 0, -1, Some((&[0], &[0])), &reversed)),
        LlmStatus::LLM_PARAM_INVALID
    );
    let beyond = Layers {
        src: Some((2, 2)),
        dst: Some((0, 0)),
        per_layer: 2,
    };
    assert_eq!(
        status(decoder.pull(&by_key, did, 0, -1, Some((&[0], &[0])), &beyond)),
        LlmStatus::LLM_PARAM_INVALID
    );

    // unlinked: refused again; the prompt still has its link to the decoder
    let (ret, _) = decoder
        .unlink_clusters(&[cluster(PROMPT, pport)], 5000, false)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    assert_eq!(pull(&by_key, &[0], &[0]), LlmStatus::LLM_NOT_YET_LINK);
    let (ret, rets) = decoder
        .unlink_clusters(&[cluster(PROMPT, pport)], 5000, true)
        .unwrap();
    assert_eq!(
        (ret, rets),
        (
            LlmStatus::LLM_NOT_YET_LINK,
            vec![LlmStatus::LLM_NOT_YET_LINK]
        )
    );
    // linked again: a pull runs on the new link (not on the one its table was fetched over)
    let (ret, _) = decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    decoder
        .pull(&by_key, did, 0, -1, Some((&[7], &[3])), &Layers::all())
        .unwrap();
    for t in 0..4 {
        assert_eq!(dk.block(t, 3), pk.block(t, 7), "tensor {t}, relinked");
    }
    prompt.unregister_cache(pid).unwrap();
    prompt.unregister_cache(pid).unwrap(); // unknown: fine, as upstream's
    decoder.finalize();
    prompt.finalize();
}

#[test]
fn batches_of_a_cache_by_id_and_by_request() {
    let (prompt, pport) = instance(PROMPT, Role::Prompt);
    let (decoder, _) = instance(DECODER, Role::Decoder);
    // a cache of 4 batches (shape[0]) of 2 tensors
    let mut pc = Tensors::new(2, 4, 8192, 11);
    let mut dc = Tensors::new(2, 4, 8192, 12);
    let req = CacheKey {
        req_id: 42,
        model_id: 0,
    };
    let pid = register(&prompt, &mut pc, CacheKind::Cache, &[req]);
    let did = register(&decoder, &mut dc, CacheKind::Cache, &[]);
    decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    // batch 3 of the prompt into batch 1 of the decoder, by id; then 1000 bytes of batch 2 by
    // request into batch 0
    let by_id = RemoteCache::ById {
        cluster_id: PROMPT,
        cache_id: pid,
        batch_index: 3,
    };
    decoder
        .pull(&by_id, did, 1, -1, None, &Layers::all())
        .unwrap();
    let by_req = RemoteCache::Request {
        cluster_id: PROMPT,
        req_id: 42,
        model_id: 0,
    };
    let before = dc.mem.clone();
    // (a request key names the cache; its batch index is 0)
    decoder
        .pull(&by_req, did, 0, 1000, None, &Layers::all())
        .unwrap();
    for t in 0..2 {
        assert_eq!(dc.block(t, 1), pc.block(t, 3));
        assert_eq!(dc.mem[t][..1000], pc.mem[t][..1000]);
        assert_eq!(
            dc.mem[t][1000..8192],
            before[t][1000..8192],
            "only `size` bytes"
        );
    }
    assert_eq!(
        status(decoder.pull(&by_id, did, 4, -1, None, &Layers::all())),
        LlmStatus::LLM_PARAM_INVALID,
        "batch past the end"
    );
    assert_eq!(
        status(decoder.pull(&by_id, did, 0, 8193, None, &Layers::all())),
        LlmStatus::LLM_PARAM_INVALID,
        "more than a batch"
    );
    // push batch 2 of the decoder into the prompt's batch 0 (by id)
    let dst = RemoteCache::ById {
        cluster_id: PROMPT,
        cache_id: pid,
        batch_index: 0,
    };
    let (ret, _) = prompt.link_clusters(&[cluster(DECODER, 1)], 5000).unwrap();
    assert_eq!(ret, LlmStatus::LLM_LINK_FAILED, "nobody listens on port 1");
    decoder.push(did, &dst, 2, None, &Layers::all()).unwrap();
    for t in 0..2 {
        assert_eq!(pc.block(t, 0), dc.block(t, 2));
    }
    decoder.finalize();
    prompt.finalize();
}

#[test]
fn calls_before_initialize_and_bad_registrations() {
    let dd = DataDist::new(5, Role::Mix);
    let mut t = Tensors::new(2, 2, 64, 1);
    let (desc, addrs) = (t.desc(), t.addrs());
    // SAFETY: refused before anything is registered
    let r = unsafe { dd.register_cache(&desc, &addrs, CacheKind::Mix, 0, &[]) };
    assert_eq!(status(r), LlmStatus::LLM_FAILED, "not initialized");
    assert_eq!(
        status(dd.link_clusters(&[cluster(1, 1)], 1000)),
        LlmStatus::LLM_FAILED
    );
    let bad = [("llm.SyncKvCacheWaitTime".to_owned(), "0".to_owned())];
    assert_eq!(status(dd.initialize(&bad)), LlmStatus::LLM_PARAM_INVALID);
    let bad = [("llm.ListenIpInfo".to_owned(), "nowhere".to_owned())];
    assert_eq!(status(dd.initialize(&bad)), LlmStatus::LLM_PARAM_INVALID);
    let bad = [("llm.TransferBackend".to_owned(), "hccl".to_owned())];
    assert_eq!(status(dd.initialize(&bad)), LlmStatus::LLM_PARAM_INVALID);
    dd.initialize(&[]).unwrap();
    dd.initialize(&[]).unwrap(); // again: fine
    let reg = |desc: &CacheDesc, addrs: &[u64]| {
        // SAFETY: each case is refused before anything is registered
        status(unsafe { dd.register_cache(desc, addrs, CacheKind::Mix, 0, &[]) })
    };
    assert_eq!(
        reg(&desc, &addrs[..1]),
        LlmStatus::LLM_PARAM_INVALID,
        "one address of two"
    );
    assert_eq!(
        reg(&desc, &[addrs[0], 0]),
        LlmStatus::LLM_PARAM_INVALID,
        "a null address"
    );
    let mut d = desc.clone();
    d.shape = vec![];
    assert_eq!(reg(&d, &addrs), LlmStatus::LLM_PARAM_INVALID, "no shape");
    d.shape = vec![2, 0];
    assert_eq!(
        reg(&d, &addrs),
        LlmStatus::LLM_PARAM_INVALID,
        "a zero dimension"
    );
    d = desc.clone();
    d.data_type = DataType::UNDEFINED;
    assert_eq!(
        reg(&d, &addrs),
        LlmStatus::LLM_PARAM_INVALID,
        "no element size"
    );
    d = desc.clone();
    d.placement = Placement::Device;
    let st = reg(&d, &addrs);
    assert!(
        st == LlmStatus::LLM_FEATURE_NOT_ENABLED || st == LlmStatus::LLM_PARAM_INVALID,
        "device memory without Ascend: {st}"
    );
    assert_eq!(
        status(dd.link_clusters(&[cluster(1, 1)], 0)),
        LlmStatus::LLM_PARAM_INVALID,
        "timeout 0"
    );
    let (_, rets) = dd
        .link_clusters(
            &[
                cluster(5, 1),
                ClusterInfo {
                    remote_ip_infos: vec![],
                    ..cluster(6, 1)
                },
            ],
            1000,
        )
        .unwrap();
    assert_eq!(
        rets,
        vec![LlmStatus::LLM_PARAM_INVALID; 2],
        "itself; no address"
    );
    dd.finalize();
    dd.finalize();
    assert_eq!(
        status(dd.link_clusters(&[cluster(1, 1)], 1000)),
        LlmStatus::LLM_FAILED,
        "finalized"
    );
    let _ = Duration::ZERO;
}

/// An instance that does not listen (upstream's decoder), with `llm.SyncKvCacheWaitTime` 5 s.
fn client_instance(cluster: u64, role: Role) -> DataDist {
    let dd = DataDist::new(cluster, role);
    let opts = [
        ("llm.DeviceId".to_owned(), "0".to_owned()),
        ("llm.SyncKvCacheWaitTime".to_owned(), "5000".to_owned()),
    ];
    dd.initialize(&opts).unwrap();
    dd
}

#[test]
fn a_link_serves_both_sides_until_either_unlinks() {
    // upstream's switch_role_sample: the cluster that listens pushes into (and pulls from) the
    // one that linked to it, over that link, without linking itself
    let (prompt, pport) = instance(PROMPT, Role::Prompt);
    let decoder = client_instance(DECODER, Role::Decoder);
    assert_eq!(decoder.listen_addr(), None, "a decoder does not listen");
    let mut pk = Tensors::new(2, 4, 4096, 11);
    let mut dk = Tensors::new(2, 4, 4096, 12);
    let key = |cluster_id| RemoteCache::Blocks {
        cluster_id,
        model_id: 0,
    };
    let k0 = CacheKey {
        req_id: u64::MAX,
        model_id: 0,
    };
    let pid = register(&prompt, &mut pk, CacheKind::Blocks, &[k0]);
    let did = register(&decoder, &mut dk, CacheKind::Blocks, &[k0]);
    let push =
        |blocks: (&[u64], &[u64])| prompt.push(pid, &key(DECODER), 0, Some(blocks), &Layers::all());
    assert_eq!(
        status(push((&[0], &[0]))),
        LlmStatus::LLM_NOT_YET_LINK,
        "nobody linked yet"
    );

    // the decoder links, naming its own address: it listens from now on, for the way back
    let mut to_prompt = cluster(PROMPT, pport);
    to_prompt.local_ip_infos = vec![IpInfo {
        ip: "127.0.0.1".parse().unwrap(),
        port: 0,
    }];
    let (ret, _) = decoder.link_clusters(&[to_prompt.clone()], 5000).unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    assert!(decoder.listen_addr().is_some());
    assert!(!prompt.is_linked(DECODER), "the prompt made no link");

    // the prompt pushes its blocks 0, 1 into the decoder's 2, 3 and pulls the decoder's 3 into
    // its own 0: over the link the decoder made, linked back on first use
    push((&[0, 1], &[2, 3])).unwrap();
    for t in 0..2 {
        assert_eq!(dk.block(t, 2), pk.block(t, 0));
        assert_eq!(dk.block(t, 3), pk.block(t, 1));
    }
    let by_id = RemoteCache::ById {
        cluster_id: DECODER,
        cache_id: did,
        batch_index: 0,
    };
    prompt
        .pull(&by_id, pid, 0, -1, Some((&[3], &[0])), &Layers::all())
        .unwrap();
    for t in 0..2 {
        assert_eq!(pk.block(t, 0), dk.block(t, 3));
    }

    // the decoder unlinks: the prompt's way back goes with it
    let (ret, _) = decoder
        .unlink_clusters(&[to_prompt.clone()], 5000, false)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    let before = dk.mem.clone();
    assert_eq!(status(push((&[0], &[0]))), LlmStatus::LLM_NOT_YET_LINK);
    assert_eq!(dk.mem, before, "nothing pushed after the unlink");

    // linked again: the prompt unlinks a cluster it never linked itself (the sample's last
    // step), which ends the way back as well
    let (ret, _) = decoder.link_clusters(&[to_prompt.clone()], 5000).unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    push((&[2], &[1])).unwrap();
    assert_eq!(dk.block(0, 1), pk.block(0, 2));
    let (ret, rets) = prompt
        .unlink_clusters(&[cluster(DECODER, 0)], 5000, true)
        .unwrap();
    assert_eq!(
        (ret, rets),
        (LlmStatus::LLM_SUCCESS, vec![LlmStatus::LLM_SUCCESS])
    );
    assert_eq!(status(push((&[0], &[0]))), LlmStatus::LLM_NOT_YET_LINK);
    decoder.finalize();
    prompt.finalize();
}

#[test]
fn a_switch_to_decoder_closes_the_listener() {
    // upstream's switch_role_sample on one host: the prompt's port is free for the other side
    // once it switched to decoder
    let (prompt, pport) = instance(PROMPT, Role::Prompt);
    prompt.set_role(Role::Decoder, &[]).unwrap();
    assert_eq!(prompt.role(), Role::Decoder);
    assert_eq!(prompt.listen_addr(), None);
    std::net::TcpListener::bind(("127.0.0.1", pport)).expect("the port is free again");
    let opts = [("llm.ListenIpInfo".to_owned(), format!("127.0.0.1:{pport}"))];
    prompt.set_role(Role::Prompt, &opts).unwrap();
    assert_eq!(prompt.listen_addr().map(|a| a.port()), Some(pport));
    prompt.finalize();
}

#[test]
fn caches_of_requests_one_key_a_batch_found_after_the_link_and_cut_into_blocks() {
    // upstream's pull_cache_sample and pull_from_cache_to_blocks shape: the prompt's cache of
    // batches holds one request a batch, each under its CacheKey
    let (prompt, pport) = instance(PROMPT, Role::Prompt);
    let decoder = client_instance(DECODER, Role::Decoder);
    let req = |req_id| CacheKey {
        req_id,
        model_id: 0,
    };
    let by_req = |req_id| RemoteCache::Request {
        cluster_id: PROMPT,
        req_id,
        model_id: 0,
    };
    // 2 tensors of 4 batches of 4 KiB; requests 10, 11, 12 in batches 0, 1, 2
    let mut pk = Tensors::new(2, 4, 4096, 31);
    let pid = register(
        &prompt,
        &mut pk,
        CacheKind::Cache,
        &[req(10), req(11), req(12)],
    );
    // a pool registered before the link: caches carved from it later are reachable over it
    let mut pool = Rng::new(30).bytes(4 * 4096);
    let base = pool.as_mut_ptr() as u64;
    // SAFETY: `pool` outlives the instance (finalized below) and is read only after the
    // transfers into it returned
    unsafe { prompt.register_pool(Placement::Host, base, pool.len() as u64) }.unwrap();
    for (addr, len) in [(0, 16), (base + 4096, 16), (base, 0), (u64::MAX - 8, 16)] {
        // SAFETY: refused before anything is registered
        let r = unsafe { prompt.register_pool(Placement::Host, addr, len) };
        assert_eq!(
            status(r),
            LlmStatus::LLM_PARAM_INVALID,
            "a pool at {addr:#x} of {len}"
        );
    }
    let mut too_many = Tensors::new(2, 4, 4096, 32);
    let (desc, addrs) = (too_many.desc(), too_many.addrs());
    let keys: Vec<CacheKey> = (0..5).map(req).collect();
    // SAFETY: refused before anything is registered
    let r = unsafe { prompt.register_cache(&desc, &addrs, CacheKind::Cache, 0, &keys) };
    assert_eq!(status(r), LlmStatus::LLM_PARAM_INVALID, "5 keys, 4 batches");
    // SAFETY: as above
    let r = unsafe { prompt.register_cache(&desc, &addrs, CacheKind::Blocks, 0, &keys[..2]) };
    assert_eq!(
        status(r),
        LlmStatus::LLM_PARAM_INVALID,
        "2 keys, a blocks cache"
    );

    let (ret, _) = decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    let mut dk = Tensors::new(2, 4, 4096, 33);
    let did = register(&decoder, &mut dk, CacheKind::Cache, &[]);
    // request 11 (the prompt's batch 1) into the decoder's batch 3
    decoder
        .pull(&by_req(11), did, 3, -1, None, &Layers::all())
        .unwrap();
    for t in 0..2 {
        assert_eq!(dk.block(t, 3), pk.block(t, 1), "tensor {t}");
    }
    assert_eq!(
        status(decoder.pull(&by_req(13), did, 0, -1, None, &Layers::all())),
        LlmStatus::LLM_KV_CACHE_NOT_EXIST
    );

    // a cache the prompt carves from its pool after the decoder fetched its table: found by
    // its key all the same (the table is fetched again on a CacheKey it lacks); 2 tensors of
    // 2 batches of 4 KiB
    let late = Tensors::new(2, 2, 4096, 34);
    let addrs = [base, base + 8192];
    let keys = [req(20), req(21)];
    // SAFETY: inside the pool, which outlives the instance
    unsafe { prompt.register_cache(&late.desc(), &addrs, CacheKind::Cache, 0, &keys) }.unwrap();
    decoder
        .pull(&by_req(21), did, 0, -1, None, &Layers::all())
        .unwrap();
    for t in 0..2 {
        let at = t * 8192 + 4096;
        assert_eq!(dk.block(t, 0), &pool[at..at + 4096], "tensor {t}");
    }

    // request 12's batch (4 KiB) cut into two blocks of 2 KiB: its first half into block 5,
    // its second into block 2
    let mut blocks = Tensors::new(2, 8, 2048, 35);
    let bid = register(&decoder, &mut blocks, CacheKind::Blocks, &[]);
    decoder
        .pull(
            &by_req(12),
            bid,
            0,
            -1,
            Some((&[], &[5, 2])),
            &Layers::all(),
        )
        .unwrap();
    for t in 0..2 {
        assert_eq!(blocks.block(t, 5), &pk.block(t, 2)[..2048]);
        assert_eq!(blocks.block(t, 2), &pk.block(t, 2)[2048..]);
    }
    let before = blocks.mem.clone();
    for (dst, why) in [
        (&[5u64][..], "one block for two pieces"),
        (&[5, 8], "block 8 of 8"),
        (&[1, 2, 3], "three blocks for two pieces"),
    ] {
        assert_eq!(
            status(decoder.pull(&by_req(12), bid, 0, -1, Some((&[], dst)), &Layers::all())),
            LlmStatus::LLM_PARAM_INVALID,
            "{why}"
        );
    }
    assert_eq!(blocks.mem, before, "nothing moved by a refused pull");

    // the prompt removes request 11's key: a cluster that fetches its table from now on does
    // not find it; the others stay; a key nobody has is fine
    prompt.remove_cache_key(&req(11)).unwrap();
    prompt.remove_cache_key(&req(99)).unwrap();
    let other = client_instance(7, Role::Decoder);
    let (ret, _) = other
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    let mut ok = Tensors::new(2, 4, 4096, 36);
    let oid = register(&other, &mut ok, CacheKind::Cache, &[]);
    assert_eq!(
        status(other.pull(&by_req(11), oid, 0, -1, None, &Layers::all())),
        LlmStatus::LLM_KV_CACHE_NOT_EXIST
    );
    other
        .pull(&by_req(12), oid, 0, -1, None, &Layers::all())
        .unwrap();
    for t in 0..2 {
        assert_eq!(ok.block(t, 0), pk.block(t, 2));
    }
    prompt.unregister_cache(pid).unwrap();
    other.finalize();
    decoder.finalize();
    prompt.finalize();
}

/// A cluster is reached only over the link it was linked with. Its peer restarts on the same
/// address and the next pull finds the link broken (`LLM_NOT_YET_LINK`); another cluster id
/// linked at that address gets a new link, which the first cluster never uses (before, a pull
/// of the first cluster ran on it: with the old process's table it was refused, with a table
/// fetched again it read the other cluster's memory); unlinking the first cluster leaves the
/// second's link alone; linked again by its own id, the first cluster reads the new process's
/// blocks.
#[test]
fn a_cluster_is_reached_only_over_its_own_link() {
    let (prompt, pport) = instance(PROMPT, Role::Prompt);
    let (decoder, _) = instance(DECODER, Role::Decoder);
    let model = CacheKey {
        req_id: u64::MAX,
        model_id: 7,
    };
    let mut pk = Tensors::new(2, 4, 4096, 21);
    let mut dk = Tensors::new(2, 4, 4096, 22);
    register(&prompt, &mut pk, CacheKind::Blocks, &[model]);
    let did = register(&decoder, &mut dk, CacheKind::Blocks, &[model]);
    let (ret, _) = decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    let key = |cluster_id| RemoteCache::Blocks {
        cluster_id,
        model_id: 7,
    };
    let pull = |cluster_id, from: u64, to: u64| {
        decoder.pull(
            &key(cluster_id),
            did,
            0,
            -1,
            Some((&[from], &[to])),
            &Layers::all(),
        )
    };
    pull(PROMPT, 1, 1).unwrap();
    assert_eq!(dk.block(0, 1), pk.block(0, 1));

    // the prompt restarts on its port, its cache elsewhere with other bytes
    prompt.finalize();
    drop(prompt);
    let again = DataDist::new(PROMPT, Role::Prompt);
    let opts = [
        ("llm.ListenIpInfo".to_owned(), format!("127.0.0.1:{pport}")),
        ("llm.DeviceId".to_owned(), "0".to_owned()),
    ];
    again.initialize(&opts).unwrap();
    let mut pk2 = Tensors::new(2, 4, 4096, 23);
    register(&again, &mut pk2, CacheKind::Blocks, &[model]);
    let e = pull(PROMPT, 2, 0).unwrap_err();
    assert_eq!(e.status, LlmStatus::LLM_NOT_YET_LINK, "{e:?}");

    // another cluster id at that address: a new link, its own
    let (ret, rets) = decoder.link_clusters(&[cluster(2, pport)], 5000).unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS, "{rets:?}");
    let e = pull(PROMPT, 2, 0).unwrap_err();
    assert_eq!(e.status, LlmStatus::LLM_NOT_YET_LINK, "{e:?}");
    pull(2, 3, 2).unwrap();
    for t in 0..2 {
        assert_eq!(dk.block(t, 2), pk2.block(t, 3), "tensor {t}, cluster 2");
    }
    // unlinking the first cluster closes its link, not the second's
    let (ret, _) = decoder
        .unlink_clusters(&[cluster(PROMPT, pport)], 5000, false)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    pull(2, 1, 3).unwrap();
    for t in 0..2 {
        assert_eq!(
            dk.block(t, 3),
            pk2.block(t, 1),
            "tensor {t}, cluster 2 after"
        );
    }
    // linked again by its own id (the address is cluster 2's now: unlinked first)
    let (ret, _) = decoder
        .unlink_clusters(&[cluster(2, pport)], 5000, false)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS);
    let (ret, rets) = decoder
        .link_clusters(&[cluster(PROMPT, pport)], 5000)
        .unwrap();
    assert_eq!(ret, LlmStatus::LLM_SUCCESS, "{rets:?}");
    pull(PROMPT, 2, 0).unwrap();
    for t in 0..2 {
        assert_eq!(
            dk.block(t, 0),
            pk2.block(t, 2),
            "tensor {t}: the new process's block"
        );
    }
    decoder.finalize();
    again.finalize();
}
