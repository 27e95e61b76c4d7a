//! LLM-DataDist's cases through `hixl::datadist::DataDist` (the Rust API).

use hixl::datadist::{
    CacheKey, CacheKind, ClusterInfo, DataDist, Error, IpInfo, Layers, LlmStatus, RemoteCache, Role,
};

use crate::peer::{self, BATCHES_SHAPE, BLOCKS_SHAPE, DdPeer, ME, PEER, TENSORS};
use crate::table::Case;

fn status<T>(r: Result<T, Error>) -> u32 {
    r.map_or_else(|e| e.status.code(), |_| 0)
}

/// The peer's cache a case names, as the Rust API names it for its call.
fn key(case: &Case, peer: &DdPeer) -> RemoteCache {
    let k = case.arg("key");
    let cluster_id = match k["cluster"].as_str() {
        Some("own") => ME,
        Some("unknown") => 77,
        _ => PEER,
    };
    let cache = k["cache"].as_str().unwrap();
    let cache_id = k["id"].as_i64().unwrap_or(match cache {
        "blocks" => peer.blocks_id,
        "batches" => peer.batches_id,
        _ => 99,
    });
    let batch_index = k["batch"].as_u64().unwrap_or(0) as u32;
    let blocks_call = case.call.ends_with("_blocks");
    match k["by"].as_str() {
        Some("request") => RemoteCache::Request {
            cluster_id,
            req_id: 7,
            model_id: 1,
        },
        Some("id") => RemoteCache::ById {
            cluster_id,
            cache_id,
            batch_index,
        },
        _ if blocks_call && cache != "batches" => RemoteCache::Blocks {
            cluster_id,
            model_id: if cache == "blocks" { 0 } else { 99 },
        },
        _ => RemoteCache::ById {
            cluster_id,
            cache_id,
            batch_index,
        },
    }
}

/// A case's layers (`-1, -1`: no range on that side).
fn layers(case: &Case) -> Layers {
    let l = case.ints("layers");
    let side = |f: i64, last: i64| (f >= 0).then_some((f as u32, last as u32));
    Layers {
        src: l.first().and_then(|&f| side(f, l[1])),
        dst: l.get(2).and_then(|&f| side(f, l[3])),
        per_layer: case.int("per_layer", 2) as u32,
    }
}

/// The cluster a link or unlink names.
fn cluster(case: &Case, peer: &DdPeer) -> ClusterInfo {
    let id = if case.str("cluster", "peer") == "own" {
        ME
    } else {
        PEER
    };
    let mut c = ClusterInfo::at(id, peer.addr);
    if case.arg("address") == &serde_json::Value::Bool(false) {
        c.remote_ip_infos.clear();
    }
    c.local_ip_infos = vec![IpInfo {
        ip: peer.addr.ip(),
        port: 0,
    }];
    c
}

/// `case`'s status, from a fresh instance (cluster 2, a decoder) brought to its state (and
/// finalized after).
pub fn run(case: &Case, peer: &DdPeer) -> u32 {
    let me = DataDist::new(ME, Role::Decoder);
    // its caches' memory, and a registration's: all outlive the instance (finalized below)
    let mut blocks = peer::tensors(&BLOCKS_SHAPE, 1);
    let mut batches = peer::tensors(&BATCHES_SHAPE, 2);
    let mut extra = vec![vec![0u8; 128]; 2];
    let (mut blocks_id, mut batches_id) = (1, 2);
    if case.state != "uninit" {
        me.initialize(&[]).expect("initialize");
        let addrs = |t: &mut Vec<Vec<u8>>| -> Vec<u64> {
            t.iter_mut().map(|m| m.as_mut_ptr() as u64).collect()
        };
        // SAFETY: the tensors outlive the registrations (the instance is finalized before
        // they drop) and are touched only by transfers meanwhile.
        blocks_id = unsafe {
            me.register_cache(
                &peer::desc(&BLOCKS_SHAPE),
                &addrs(&mut blocks),
                CacheKind::Blocks,
                0,
                &[],
            )
        }
        .expect("the blocks cache");
        // SAFETY: as above.
        batches_id = unsafe {
            me.register_cache(
                &peer::desc(&BATCHES_SHAPE),
                &addrs(&mut batches),
                CacheKind::Cache,
                0,
                &[],
            )
        }
        .expect("the cache of batches");
    }
    if case.state == "linked" {
        let (ret, _) = me
            .link_clusters(&[ClusterInfo::at(PEER, peer.addr)], 5000)
            .expect("link");
        assert_eq!(ret, LlmStatus::LLM_SUCCESS, "{}: the link", case.id);
    }
    if case.state == "finalized" {
        me.finalize();
    }
    let local = match case.str("local", "") {
        "blocks" => blocks_id,
        "batches" => batches_id,
        _ => 99,
    };
    let u64s = |name: &str| -> Vec<u64> { case.ints(name).iter().map(|&v| v as u64).collect() };
    let (src, dst) = (u64s("src"), u64s("dst"));
    let batch = case.int("batch", 0) as u32;
    let got = match case.call.as_str() {
        "pull_blocks" => status(me.pull(
            &key(case, peer),
            local,
            0,
            -1,
            Some((&src, &dst)),
            &layers(case),
        )),
        "pull_cache" => status(me.pull(
            &key(case, peer),
            local,
            batch,
            case.int("size", -1),
            None,
            &layers(case),
        )),
        "push_blocks" => status(me.push(
            local,
            &key(case, peer),
            0,
            Some((&src, &dst)),
            &layers(case),
        )),
        "push_cache" => status(me.push(local, &key(case, peer), batch, None, &layers(case))),
        "register" => {
            let mut addrs: Vec<u64> = extra.iter_mut().map(|m| m.as_mut_ptr() as u64).collect();
            match case.str("addrs", "ok") {
                "none" => addrs.clear(),
                "one" => addrs.truncate(1),
                "zero" => addrs[1] = 0,
                _ => {}
            }
            let keys: Vec<CacheKey> = (0..case.int("keys", 0) as u64)
                .map(|r| CacheKey {
                    req_id: r,
                    model_id: 0,
                })
                .collect();
            let mut d = peer::desc(&[4, 8]);
            d.num_tensors = 2;
            // SAFETY: `extra` outlives the instance; a refused registration registers nothing.
            status(unsafe { me.register_cache(&d, &addrs, CacheKind::Cache, 0, &keys) })
        }
        "unregister" => status(me.unregister_cache(case.int("id", 0))),
        "link" => {
            match me.link_clusters(&[cluster(case, peer)], case.int("timeout", 1000) as i32) {
                Ok((ret, _)) => ret.code(),
                Err(e) => e.status.code(),
            }
        }
        "unlink" => {
            let r = me.unlink_clusters(
                &[cluster(case, peer)],
                case.int("timeout", 1000) as i32,
                false,
            );
            match r {
                Ok((ret, _)) => ret.code(),
                Err(e) => e.status.code(),
            }
        }
        other => panic!("{}: call {other}", case.id),
    };
    me.finalize();
    drop((blocks, batches, extra));
    let _ = TENSORS;
    got
}
