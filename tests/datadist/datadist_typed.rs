//! LLM-DataDist's typed layer (`hixl::datadist::typed`): a decoder cluster in this process and
//! a prompt cluster in another (`hixl-peer datadist-serve`) or in this one, random blocks and
//! batches pulled and pushed and compared byte for byte, layer ranges, role switches, and the
//! exact LLM status of every error only the run time can see.

// tensors are compared by index on both sides
#![allow(clippy::needless_range_loop)]

use crate::common;
use crate::serve_child::Peer;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Rng, fnv1a};
use hixl::HostBuffer;
use hixl::datadist::typed::{Cache, Cluster, Decoder, Layout, PeerCache, Prompt};
use hixl::datadist::{CacheDesc, CacheKey, DataType, Layers, LlmStatus, Placement, Role};

const T: Duration = Duration::from_secs(10);
const LISTEN: [(&str, &str); 2] = [
    ("llm.ListenIpInfo", "127.0.0.1:0"),
    ("llm.SyncKvCacheWaitTime", "10000"),
];
const CLIENT: [(&str, &str); 1] = [("llm.SyncKvCacheWaitTime", "10000")];

/// A cache description of `tensors` tensors of `blocks` blocks of `block` bytes (FLOAT16).
fn desc(tensors: u32, blocks: u64, block: u64) -> CacheDesc {
    CacheDesc {
        placement: Placement::Host,
        num_tensors: tensors,
        data_type: DataType::FLOAT16,
        shape: vec![blocks as i64, (block / 2) as i64],
    }
}

/// `n` host tensors of `len` random bytes (seeds `seed`, `seed + 1`, ...), and their bytes.
fn tensors(n: u64, len: usize, seed: u64) -> (Vec<HostBuffer>, Vec<Vec<u8>>) {
    let bytes: Vec<Vec<u8>> = (0..n).map(|t| Rng::new(seed + t).bytes(len)).collect();
    let bufs = bytes
        .iter()
        .map(|b| HostBuffer::from_slice(b).unwrap())
        .collect();
    (bufs, bytes)
}

/// `n` distinct block indices below `count`, in random order, with a few consecutive runs.
fn blocks(rng: &mut Rng, n: usize, count: u64) -> Vec<u64> {
    let mut all: Vec<u64> = (0..count).collect();
    for i in (1..all.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        all.swap(i, j);
    }
    let mut v: Vec<u64> = all[..n].to_vec();
    // make a run: sort the first quarter
    v[..n / 4].sort_unstable();
    v
}

fn status<T: std::fmt::Debug>(r: hixl::datadist::Result<T>) -> LlmStatus {
    r.expect_err("expected an error").status
}

/// Tensor `t`'s block `b` of the host cache `c`.
fn block<M: hixl::Reclaim>(c: &mut Cache<'_, M>, t: usize, b: u64) -> Vec<u8> {
    let mut v = vec![0u8; c.block_size() as usize];
    c.read_at(t, b * c.block_size(), &mut v).unwrap();
    v
}

#[test]
fn pulls_and_pushes_blocks_with_a_prompt_in_another_process() {
    const TENSORS: u32 = 4;
    const BLOCKS: u64 = 64;
    const BLOCK: u64 = 4096;
    let len = (BLOCKS * BLOCK) as usize;
    let mut peer = Peer::spawn(7, TENSORS, BLOCKS, BLOCK, 100, 9);
    // what the peer's tensors hold (its seeds 100 + t), kept up to date with our pushes
    let mut theirs: Vec<Vec<u8>> = (0..4).map(|t| Rng::new(100 + t).bytes(len)).collect();
    let mut rng = Rng::new(5);

    Cluster::<Decoder>::scope(2, &CLIENT, |decoder| {
        let (bufs, mut ours) = tensors(4, len, 200);
        let mut cache = decoder
            .register_cache(&desc(TENSORS, BLOCKS, BLOCK), Layout::Blocks, bufs, &[])
            .unwrap();
        assert_eq!(cache.block_count(), BLOCKS);
        assert_eq!(cache.block_size(), BLOCK);
        assert_eq!(cache.num_tensors(), 4);
        let link = decoder.link(7, peer.addr, T).unwrap();
        assert_eq!(link.remote_cluster_id(), 7);
        let by_model = PeerCache::Blocks { model_id: 9 };
        let by_id = PeerCache::Id {
            cache_id: peer.cache_id,
            batch_index: 0,
        };

        // pulls of random blocks, by key and by id
        for (round, key) in [by_model, by_id, by_model].into_iter().enumerate() {
            let n = [16, 40, 64][round];
            let (src, dst) = (blocks(&mut rng, n, BLOCKS), blocks(&mut rng, n, BLOCKS));
            link.pull_blocks(key, &cache, &src, &dst).unwrap();
            for (&s, &d) in src.iter().zip(&dst) {
                let r = (s * BLOCK) as usize..((s + 1) * BLOCK) as usize;
                let l = (d * BLOCK) as usize..((d + 1) * BLOCK) as usize;
                for t in 0..4 {
                    ours[t][l.clone()].copy_from_slice(&theirs[t][r.clone()]);
                }
            }
            for t in 0..4 {
                for b in 0..BLOCKS {
                    let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                    assert!(
                        block(&mut cache, t, b) == ours[t][r],
                        "round {round}: tensor {t} block {b}"
                    );
                }
            }
        }

        // pushes of random blocks (fresh random data first), checked by the peer's sums
        for t in 0..4 {
            ours[t] = Rng::new(300 + t as u64).bytes(len);
            cache.write_at(t, 0, &ours[t]).unwrap();
        }
        let (src, dst) = (blocks(&mut rng, 48, BLOCKS), blocks(&mut rng, 48, BLOCKS));
        link.push_blocks(&cache, &src, by_model, &dst).unwrap();
        for (&s, &d) in src.iter().zip(&dst) {
            let l = (s * BLOCK) as usize..((s + 1) * BLOCK) as usize;
            let r = (d * BLOCK) as usize..((d + 1) * BLOCK) as usize;
            for t in 0..4 {
                theirs[t][r.clone()].copy_from_slice(&ours[t][l.clone()]);
            }
        }
        for t in 0..4 {
            assert_eq!(peer.sum(t, 0, len as u64), fnv1a(&theirs[t]), "tensor {t}");
        }

        // one layer: the peer's layer 1 (tensors 2, 3) into our layer 0 (tensors 0, 1)
        let layers = Layers {
            src: Some((1, 1)),
            dst: Some((0, 0)),
            per_layer: 2,
        };
        let (src, dst) = (blocks(&mut rng, 8, BLOCKS), blocks(&mut rng, 8, BLOCKS));
        link.pull_blocks_layers(by_model, &cache, &src, &dst, &layers)
            .unwrap();
        for (&s, &d) in src.iter().zip(&dst) {
            for (lt, rt) in [(0, 2), (1, 3)] {
                let r = (s * BLOCK) as usize..((s + 1) * BLOCK) as usize;
                assert!(block(&mut cache, lt, d) == theirs[rt][r]);
            }
            for t in 2..4 {
                let l = (d * BLOCK) as usize..((d + 1) * BLOCK) as usize;
                assert!(block(&mut cache, t, d) == ours[t][l], "layer 1 untouched");
            }
        }
        // the rest of our cache, as it was: the copy of it from now on
        for t in 0..4 {
            cache.read_at(t, 0, &mut ours[t]).unwrap();
        }

        // what only the run time knows, each with its status; nothing moves
        let p = LlmStatus::LLM_PARAM_INVALID;
        assert_eq!(
            status(link.pull_blocks(by_model, &cache, &[0], &[BLOCKS])),
            p
        );
        assert_eq!(
            status(link.pull_blocks(by_model, &cache, &[BLOCKS], &[0])),
            p
        );
        assert_eq!(
            status(link.push_blocks(&cache, &[BLOCKS], by_model, &[0])),
            p
        );
        assert_eq!(
            status(link.push_blocks(&cache, &[0], by_model, &[BLOCKS])),
            p
        );
        assert_eq!(status(link.pull_blocks(by_model, &cache, &[0, 1], &[0])), p);
        assert_eq!(status(link.pull_blocks(by_model, &cache, &[], &[])), p);
        let bad_layers = Layers {
            src: Some((2, 2)),
            dst: Some((0, 0)),
            per_layer: 2,
        };
        assert_eq!(
            status(link.pull_blocks_layers(by_model, &cache, &[0], &[0], &bad_layers)),
            p
        );
        let none = LlmStatus::LLM_KV_CACHE_NOT_EXIST;
        let other_model = PeerCache::Blocks { model_id: 10 };
        assert_eq!(
            status(link.pull_blocks(other_model, &cache, &[0], &[0])),
            none
        );
        let other_id = PeerCache::Id {
            cache_id: peer.cache_id + 1,
            batch_index: 0,
        };
        assert_eq!(status(link.push_blocks(&cache, &[0], other_id, &[0])), none);
        assert_eq!(
            status(decoder.link(7, peer.addr, T)),
            LlmStatus::LLM_ALREADY_LINK
        );
        for t in 0..4 {
            assert!(block(&mut cache, t, 0) == ours[t][..BLOCK as usize]);
            assert_eq!(peer.sum(t, 0, len as u64), fnv1a(&theirs[t]));
        }

        // the peer unregisters its cache: from then on nothing of ours reaches that memory
        assert_eq!(peer.ask("unregister"), "UNREGISTERED");
        let (src, dst) = (blocks(&mut rng, 8, BLOCKS), blocks(&mut rng, 8, BLOCKS));
        let pushed = link.push_blocks(&cache, &src, by_model, &dst);
        let pulled = link.pull_blocks(by_model, &cache, &src, &dst);
        assert_eq!(
            status(pushed),
            LlmStatus::LLM_PARAM_INVALID,
            "push after unregister"
        );
        assert_eq!(
            status(pulled),
            LlmStatus::LLM_PARAM_INVALID,
            "pull after unregister"
        );
        for t in 0..4 {
            assert_eq!(peer.sum(t, 0, len as u64), fnv1a(&theirs[t]), "untouched");
            cache.read_at(t, 0, &mut ours[t][..]).unwrap();
        }

        link.unlink(T).unwrap();
        let kv = cache.unregister().unwrap();
        for t in 0..4 {
            assert!(kv[t][..] == ours[t][..]);
        }
    })
    .unwrap();
    peer.quit();
}

#[test]
fn two_clusters_in_one_process_batches_roles_and_statuses() {
    Cluster::<Prompt>::scope(1, &LISTEN, |prompt| {
        assert_eq!(prompt.role(), Role::Prompt);
        assert_eq!(Cluster::<Prompt>::ROLE, Role::Prompt);
        let addr = prompt.listen_addr().unwrap();
        // a batches cache: 2 tensors of 4 batches of 8 KiB, and a blocks cache
        let (bufs, pb) = tensors(2, 4 * 8192, 1);
        let pcache = prompt
            .register_cache(
                &desc(2, 4, 8192),
                Layout::Batches { batch_dim: 0 },
                bufs,
                &[CacheKey {
                    req_id: 5,
                    model_id: 3,
                }],
            )
            .unwrap();
        let (bufs, _) = tensors(2, 16 * 1024, 2);
        let pblocks = prompt
            .register_cache(&desc(2, 16, 1024), Layout::Blocks, bufs, &[])
            .unwrap();

        // bad registrations hand the memory back
        let p = LlmStatus::LLM_PARAM_INVALID;
        let (bufs, _) = tensors(3, 1024, 9);
        let r = prompt
            .register_cache(&desc(2, 1, 1024), Layout::Blocks, bufs, &[])
            .unwrap_err();
        assert_eq!((r.status(), r.value.len()), (p, 3));
        let (bufs, _) = tensors(2, 1000, 9);
        let r = prompt
            .register_cache(&desc(2, 1, 1024), Layout::Blocks, bufs, &[])
            .unwrap_err();
        assert_eq!((r.status(), r.value.len()), (p, 2), "tensors too small");
        let (bufs, _) = tensors(2, 1024, 9);
        let r = prompt
            .register_cache(
                &desc(2, 1, 1024),
                Layout::Batches { batch_dim: 2 },
                bufs,
                &[],
            )
            .unwrap_err();
        assert_eq!(r.status(), p, "batch_dim outside the shape");
        let mut bad = desc(2, 1, 1024);
        bad.shape = vec![0, 512];
        let (bufs, _) = tensors(2, 1024, 9);
        assert_eq!(
            prompt
                .register_cache(&bad, Layout::Blocks, bufs, &[])
                .unwrap_err()
                .status(),
            p
        );

        Cluster::<Decoder>::scope(2, &CLIENT, |decoder| {
            let (bufs, _) = tensors(2, 4 * 8192, 3);
            let mut dcache = decoder
                .register_cache(&desc(2, 4, 8192), Layout::Mix, bufs, &[])
                .unwrap();
            // links that cannot be
            assert_eq!(status(decoder.link(2, addr, T)), p, "its own cluster");
            assert_eq!(status(decoder.link(1, addr, Duration::ZERO)), p);
            let nobody: SocketAddr = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap()
            };
            assert_eq!(
                status(decoder.link(3, nobody, T)),
                LlmStatus::LLM_LINK_FAILED
            );

            let link = decoder.link(1, addr, T).unwrap();
            // batches: the peer's batch 2 (by request key... and by id) into ours
            let by_req = PeerCache::Request {
                req_id: 5,
                model_id: 3,
            };
            link.pull_cache(by_req, &dcache, 1, None).unwrap();
            let by_id = PeerCache::Id {
                cache_id: pcache.id(),
                batch_index: 2,
            };
            link.pull_cache(by_id, &dcache, 3, Some(4096)).unwrap();
            for t in 0..2 {
                assert!(block(&mut dcache, t, 1) == pb[t][0..8192], "batch 0 into 1");
                assert!(block(&mut dcache, t, 3)[..4096] == pb[t][2 * 8192..2 * 8192 + 4096]);
            }
            // a push of our batch 0 into the peer's blocks? no: into its batch 3
            let fresh = Rng::new(77).bytes(8192);
            dcache.write_at(1, 0, &fresh).unwrap();
            let to = PeerCache::Id {
                cache_id: pcache.id(),
                batch_index: 3,
            };
            link.push_cache(&dcache, 0, to).unwrap();
            assert_eq!(status(link.push_cache(&dcache, 4, to)), p);
            assert_eq!(status(link.pull_cache(by_id, &dcache, 4, None)), p);
            assert_eq!(status(link.pull_cache(by_id, &dcache, 0, Some(0))), p);
            assert_eq!(status(link.pull_cache(by_id, &dcache, 0, Some(8193))), p);
            let far = PeerCache::Id {
                cache_id: pcache.id(),
                batch_index: 4,
            };
            assert_eq!(status(link.pull_cache(far, &dcache, 0, None)), p);
            // blocks of the blocks cache (1 KiB blocks: counted in our 8 KiB blocks, as
            // upstream's, the peer's 16 KiB tensor has 2)
            let blocks_id = PeerCache::Id {
                cache_id: pblocks.id(),
                batch_index: 0,
            };
            link.pull_blocks(blocks_id, &dcache, &[1], &[2]).unwrap();
            assert_eq!(status(link.pull_blocks(blocks_id, &dcache, &[2], &[2])), p);
            let mut got = block(&mut dcache, 0, 2);
            let want = Rng::new(2).bytes(16 * 1024);
            assert!(got[..] == want[8192..]);
            // caller-managed memory (the unsafe registration), pulled into from two threads
            // through one link at once
            let mut raw_mem: Vec<Vec<u8>> = vec![vec![0u8; 16 * 1024]; 2];
            let addrs: Vec<u64> = raw_mem.iter_mut().map(|m| m.as_mut_ptr() as u64).collect();
            // SAFETY: `raw_mem` is neither touched nor dropped until after the cache is
            // unregistered below.
            let rcache = unsafe {
                decoder.register_cache_raw(&desc(2, 16, 1024), Layout::Blocks, &addrs, &[])
            }
            .unwrap();
            assert_eq!((rcache.block_count(), rcache.block_size()), (16, 1024));
            std::thread::scope(|s| {
                for half in 0..2u64 {
                    let (link, rcache) = (&link, &rcache);
                    s.spawn(move || {
                        let src: Vec<u64> = (half * 8..half * 8 + 8).collect();
                        let dst: Vec<u64> = src.iter().map(|b| 15 - b).collect();
                        link.pull_blocks(blocks_id, rcache, &src, &dst).unwrap();
                    });
                }
            });
            let descs = rcache.unregister().unwrap();
            assert_eq!(descs.len(), 2);
            assert_eq!(
                (descs[1].addr, descs[1].len),
                (addrs[1] as usize, 16 * 1024)
            );
            for t in 0..2 {
                let want = Rng::new(2 + t as u64).bytes(16 * 1024);
                for b in 0..16 {
                    let d = 15 - b;
                    assert!(raw_mem[t][d * 1024..(d + 1) * 1024] == want[b * 1024..(b + 1) * 1024]);
                }
            }
            // the prompt unregisters its blocks cache: from then on nothing reaches that memory
            let kept = pblocks.unregister().unwrap();
            let before: Vec<Vec<u8>> = kept.iter().map(|b| b.to_vec()).collect();
            assert_eq!(status(link.pull_blocks(blocks_id, &dcache, &[0], &[0])), p);
            assert_eq!(status(link.push_blocks(&dcache, &[0], blocks_id, &[1])), p);
            for (k, b) in kept.iter().zip(&before) {
                assert!(k[..] == b[..], "untouched after unregister");
            }
            // reads and writes outside the cache
            assert_eq!(status(dcache.read_at(2, 0, &mut got)), p);
            assert_eq!(status(dcache.read_at(0, 4 * 8192 - 10, &mut got)), p);
            assert_eq!(status(dcache.write_at(0, u64::MAX, &got)), p);
            link.unlink(T).unwrap();

            // a leaked link: the run time refuses to listen elsewhere while it exists
            let link = decoder.link(1, addr, T).unwrap();
            std::mem::forget(link);
            let moved = [("llm.ListenIpInfo", "127.0.0.1:0")];
            let r = decoder.switch_role::<Prompt, _, _>(&moved).unwrap_err();
            assert_eq!(r.status(), LlmStatus::LLM_EXIST_LINK);
            let decoder = r.value;
            assert!(decoder.as_runtime().is_linked(1));
            let bad = [("llm.ListenIpInfo", "127.0.0.1")];
            let r = decoder.switch_role::<Prompt, _, _>(&bad).unwrap_err();
            assert_eq!(r.status(), p);
            let decoder = r.value;
            // without a new address the role changes all the same (links or not)
            let decoder = decoder.switch_role::<Prompt, _, _>(&CLIENT).unwrap();
            assert_eq!(decoder.role(), Role::Prompt);
            // unlinked by the runtime instance, it may listen: the caches stay
            let info = hixl::datadist::ClusterInfo {
                remote_cluster_id: 1,
                remote_role_type: 0,
                local_ip_infos: vec![],
                remote_ip_infos: vec![],
            };
            let (s, _) = decoder
                .as_runtime()
                .unlink_clusters(&[info], 1000, true)
                .unwrap();
            assert_eq!(s, LlmStatus::LLM_SUCCESS);
            let listening = decoder.switch_role::<Prompt, _, _>(&moved).unwrap();
            let new_addr = listening.listen_addr().unwrap();

            // the prompt side links to it now and pulls our batch 1 (its batch 0, pulled
            // before) into its batch 1
            let back = prompt.link(2, new_addr, T).unwrap();
            let theirs = PeerCache::Id {
                cache_id: dcache.id(),
                batch_index: 1,
            };
            back.pull_cache(theirs, &pcache, 1, None).unwrap();
            drop(back); // unlinks
            assert!(!prompt.as_runtime().is_linked(2));

            // finalized while the cache is held: it hands its memory back
            listening.finalize();
            let kv = dcache.unregister().unwrap();
            assert!(kv[1][..8192] == fresh[..]);
        })
        .unwrap();

        let mut pcache = pcache;
        for t in 0..2 {
            assert!(
                block(&mut pcache, t, 1) == pb[t][..8192],
                "batch 0 came back in 1"
            );
        }
        let mut last = vec![0u8; 8192];
        pcache.read_at(1, 3 * 8192, &mut last).unwrap();
        assert!(last == Rng::new(77).bytes(8192), "the pushed batch");
        let kv = pcache.unregister().unwrap();
        assert_eq!(kv.len(), 2);
    })
    .unwrap();
}

#[test]
fn scope_reports_initialize_errors() {
    let bad = [("llm.ListenIpInfo", "not an address")];
    let r = Cluster::<Prompt>::scope(1, &bad, |_| unreachable!("f does not run"));
    assert_eq!(status(r), LlmStatus::LLM_PARAM_INVALID);
    let bad = [("llm.SyncKvCacheWaitTime", "0")];
    let r = Cluster::<Decoder>::scope(1, &bad, |_| ());
    assert_eq!(status(r), LlmStatus::LLM_PARAM_INVALID);
}

#[test]
fn a_cache_the_table_cannot_hold_is_not_registered() {
    // two caches of 65,536 tensors (one 1 KiB buffer each, named 65,536 times) need more than
    // the 1 MiB cache table: the second is refused, and its memory is not left registered
    Cluster::<Prompt>::scope(1, &LISTEN, |prompt| {
        let n = 1u32 << 16;
        let mut a = vec![0u8; 1024];
        let mut b = Rng::new(4).bytes(1024);
        let desc = |tensors: u32| CacheDesc {
            placement: Placement::Host,
            num_tensors: tensors,
            data_type: DataType::UINT8,
            shape: vec![1, 1024],
        };
        let (pa, pb) = (a.as_mut_ptr() as u64, b.as_mut_ptr() as u64);
        // SAFETY: `a` and `b` are neither touched nor dropped until after the caches are
        // unregistered (or refused) below.
        let big = unsafe {
            prompt.register_cache_raw(&desc(n), Layout::Blocks, &vec![pa; n as usize], &[])
        }
        .unwrap();
        assert_eq!(big.num_tensors(), n as usize);
        // SAFETY: as above.
        let r = unsafe {
            prompt.register_cache_raw(&desc(n), Layout::Blocks, &vec![pb; n as usize], &[])
        };
        assert_eq!(status(r), LlmStatus::LLM_OUT_OF_MEMORY);
        // `b` is free: it registers again, as a small cache
        // SAFETY: as above.
        let small =
            unsafe { prompt.register_cache_raw(&desc(1), Layout::Blocks, &[pb], &[]) }.unwrap();
        assert_eq!(small.unregister().unwrap().len(), 1);
        assert_eq!(big.unregister().unwrap().len(), n as usize);
    })
    .unwrap();
}
