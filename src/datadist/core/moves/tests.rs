//! The moves' unit tests: a pull's arithmetic stays inside the peer's tensors; and a block
//! move of many tensor pairs over TCP, whose frames (a tensor each) are pipelined on a lane
//! (`transport::tcp::lane`): every tensor's blocks land where they should in both directions,
//! past the lane's limits on unanswered requests, and a request the server refuses in the
//! middle of a pipeline fails the move and leaves the link usable.

use std::time::Duration;

use super::{BlockMove, DdEngine, TensorPair, batch_ops, run_blocks};
use crate::datadist::table::Entry;
use crate::datadist::types::Placement;
use crate::datadist::types::{CacheKind, LlmStatus, Result};
use crate::runtime::handle::{LinkHandle, RegionHandle};
use crate::testkit::Rng;
use crate::{MemType, TransferOp};

fn entry(addr: u64, stride: u64, count: u64) -> Entry {
    Entry {
        cache_id: 1,
        kind: CacheKind::Cache,
        placement: Placement::Host,
        tensor_size: stride * count,
        stride,
        count,
        addrs: vec![addr],
    }
}

/// A pull offsets the peer's side by the local stride (upstream's rule): a peer's tensor
/// that ends at the top of the address space, with a smaller stride than the local one,
/// is refused with `LLM_PARAM_INVALID`, not an overflow; every range stays inside its
/// tensors.
#[test]
fn a_pull_stays_inside_the_peers_tensors() {
    let remote = entry(u64::MAX - 4 * 64, 64, 4);
    let local = entry(0x1000, 256, 4);
    for size in [1, 64] {
        let e = batch_ops(&remote, &local, &[0], &[0], 3, 0, size, TransferOp::Read).unwrap_err();
        assert_eq!(e.status, LlmStatus::LLM_PARAM_INVALID, "{e}");
    }
    // the first batch fits, at the peer's tensor's start
    let ops = batch_ops(&remote, &local, &[0], &[0], 0, 2, 64, TransferOp::Read).unwrap();
    assert_eq!(
        (ops[0].remote, ops[0].local, ops[0].len),
        (remote.addrs[0], 0x1200, 64)
    );
    // a push offsets each side by its own stride: the peer's last batch ends its tensor
    let ops = batch_ops(&local, &remote, &[0], &[0], 1, 3, 64, TransferOp::Write).unwrap();
    assert_eq!(ops[0].remote + 64, remote.addrs[0] + remote.tensor_size);
}

/// Tensors of `blocks` blocks of `block` bytes, as `Vec`s (registered raw by the tests).
fn tensors(n: usize, blocks: usize, block: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|t| Rng::new(seed + t as u64).bytes(blocks * block))
        .collect()
}

/// `n` distinct block indices below `blocks`, in random order.
fn shuffled(rng: &mut Rng, blocks: usize, n: usize) -> Vec<u64> {
    let mut v: Vec<u64> = (0..blocks as u64).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v.truncate(n);
    v
}

/// A server engine and a client engine that links over TCP (same host off).
fn engines() -> (DdEngine, DdEngine, String) {
    let server = DdEngine::initialize("127.0.0.1:0", &[]).unwrap();
    let off = [("hixl.SameHost".to_string(), "off".to_string())];
    let client = DdEngine::initialize("127.0.0.1", &off).unwrap();
    let name = server.local_engine();
    (server, client, name)
}

/// Registers each tensor with `e`.
fn register(e: &DdEngine, ts: &mut [Vec<u8>]) -> Vec<RegionHandle> {
    ts.iter_mut()
        .map(|t| {
            // SAFETY: each tensor stays allocated, unmoved, until after its engine is
            // finalized at the end of the test; the tests touch its bytes only between
            // transfers (a sync transfer has ended when it returns).
            unsafe { e.register_mem(t.as_mut_ptr() as usize, t.len(), MemType::Host) }.unwrap()
        })
        .collect()
}

/// The pairs `which` of the local tensors (registered as `regions`) and the remote ones.
fn pairs<'a>(
    local: &[Vec<u8>],
    regions: &'a [RegionHandle],
    remote: &[Vec<u8>],
    which: &[usize],
) -> Vec<TensorPair<'a>> {
    (which.iter())
        .map(|&t| TensorPair {
            region: Some(&regions[t]),
            local: local[t].as_ptr() as usize,
            remote: remote[t].as_ptr() as u64,
            local_len: local[t].len(),
            remote_len: remote[t].len() as u64,
        })
        .collect()
}

fn moved(
    link: &LinkHandle,
    op: TransferOp,
    pairs: &[TensorPair],
    block: usize,
    local_idx: &[u64],
    remote_idx: &[u64],
) -> Result<()> {
    let m = BlockMove {
        op,
        pairs,
        block: block as u64,
        local_idx,
        remote_idx,
    };
    run_blocks(link, m, Duration::from_secs(10))
}

/// Block `from[i]` of each `src` tensor is block `to[i]` of its `dst` tensor.
fn same_blocks(
    src: &[Vec<u8>],
    dst: &[Vec<u8>],
    which: &[usize],
    block: usize,
    from: &[u64],
    to: &[u64],
) {
    for &t in which {
        for (&f, &d) in from.iter().zip(to) {
            let (f, d) = (f as usize * block, d as usize * block);
            assert!(
                src[t][f..f + block] == dst[t][d..d + block],
                "tensor {t}: block {} should be block {}",
                d / block,
                f / block
            );
        }
    }
}

/// `n` tensors of `blocks` blocks of `block` bytes on each side: `picked` random blocks of
/// each READ into random blocks, then `written` of them WRITTEN back with new bytes, every
/// block compared; with `tiny`, over the smallest socket buffers (`io::tiny`).
fn both_ways(n: usize, blocks: usize, block: usize, picked: usize, written: usize, tiny: bool) {
    let mut rng = Rng::new(n as u64);
    let mut srv = tensors(n, blocks, block, 100);
    let mut cli = vec![vec![0u8; blocks * block]; n];
    crate::io::tiny::TINY_LISTENER.set(tiny);
    let (server, client, name) = engines();
    crate::io::tiny::TINY_LISTENER.set(false);
    register(&server, &mut srv);
    let mine = register(&client, &mut cli);
    let link = client.connect(&name, 5000).unwrap();
    let all: Vec<usize> = (0..n).collect();
    let ps = pairs(&cli, &mine, &srv, &all);
    let (from, to) = (
        shuffled(&mut rng, blocks, picked),
        shuffled(&mut rng, blocks, picked),
    );
    moved(&link, TransferOp::Read, &ps, block, &to, &from).unwrap();
    same_blocks(&srv, &cli, &all, block, &from, &to);
    // and back: other blocks of the client's, new bytes, into other blocks of the server's
    for (t, c) in cli.iter_mut().enumerate() {
        c.copy_from_slice(&Rng::new(500 + t as u64).bytes(blocks * block));
    }
    let (from, to) = (
        shuffled(&mut rng, blocks, written),
        shuffled(&mut rng, blocks, written),
    );
    moved(&link, TransferOp::Write, &ps, block, &from, &to).unwrap();
    same_blocks(&cli, &srv, &all, block, &from, &to);
    client.finalize();
    server.finalize();
    if tiny {
        crate::io::tiny::forget();
    }
}

#[test]
fn pipelined_block_moves_land_every_tensor_in_both_directions() {
    // 80 tensors: more requests than a lane leaves unanswered; 3000 indices of 8 bytes a
    // request: more than a READ's window, one request at a time
    both_ways(80, 16, 64, 12, 12, false);
    both_ways(5, 4096, 32, 3000, 3000, false);
}

#[test]
fn a_pipelined_read_lands_with_the_smallest_socket_buffers() {
    // under memory pressure TCP gives a connection its smallest buffers (a few KiB): the
    // lane's unanswered READ requests (256 indices, 2 KiB each, eight of them within the
    // lane's windows: 16 KiB of requests, 256 KiB of 32 KiB payloads) no longer fit them
    // while the server sends a payload the lane has not started reading (the server's send
    // buffer and the client's receive buffer are the smallest too); the lane must read
    // replies while a request waits to go out, or both sides wait until the deadline (the
    // WRITE back moves a few blocks a tensor: the server's small receive buffer is slow)
    crate::io::tiny::TINY_BOTH_WAYS.set(true);
    both_ways(32, 256, 128, 256, 32, true);
    crate::io::tiny::TINY_BOTH_WAYS.set(false);
    // 1 MiB payloads (256 indices of 4 KiB blocks) go one at a time (the payload window),
    // over the smallest buffers on the server's side
    both_ways(32, 256, 4096, 256, 32, true);
}

#[test]
fn a_request_refused_amid_a_pipeline_fails_the_move_and_leaves_the_link_usable() {
    let (n, blocks, block) = (10, 64, 128);
    let mut srv = tensors(n, blocks, block, 200);
    let mut cli = vec![vec![0u8; blocks * block]; n];
    let (server, client, name) = engines();
    let regions = register(&server, &mut srv);
    let mine = register(&client, &mut cli);
    let link = client.connect(&name, 5000).unwrap();
    // the client's table still has tensor 3 (fetched at connect): the server refuses the
    // request of that tensor, with requests for later tensors already sent behind it
    server.deregister_mem(&regions[3]).unwrap();
    let all: Vec<usize> = (0..n).collect();
    let rest: Vec<usize> = all.iter().copied().filter(|&t| t != 3).collect();
    let mut rng = Rng::new(9);
    for round in 0..3u64 {
        let (from, to) = (
            shuffled(&mut rng, blocks, 20),
            shuffled(&mut rng, blocks, 20),
        );
        let e = moved(
            &link,
            TransferOp::Read,
            &pairs(&cli, &mine, &srv, &all),
            block,
            &to,
            &from,
        )
        .unwrap_err();
        assert_eq!(e.status, LlmStatus::LLM_PARAM_INVALID, "{e}");
        // the same link, right after: every other tensor's blocks, read whole
        for c in cli.iter_mut() {
            c.fill(0);
        }
        for (t, s) in srv.iter_mut().enumerate() {
            if t != 3 {
                s.copy_from_slice(&Rng::new(300 + round * 16 + t as u64).bytes(blocks * block));
            }
        }
        let ps = pairs(&cli, &mine, &srv, &rest);
        moved(&link, TransferOp::Read, &ps, block, &to, &from).unwrap();
        same_blocks(&srv, &cli, &rest, block, &from, &to);
        // a WRITE refused the same way (the server closes that lane) changes nothing of the
        // deregistered tensor, and the next WRITE lands
        let before = srv[3].clone();
        for (t, c) in cli.iter_mut().enumerate() {
            c.copy_from_slice(&Rng::new(700 + round * 16 + t as u64).bytes(blocks * block));
        }
        let e = moved(
            &link,
            TransferOp::Write,
            &pairs(&cli, &mine, &srv, &all),
            block,
            &from,
            &to,
        )
        .unwrap_err();
        assert_eq!(e.status, LlmStatus::LLM_PARAM_INVALID, "{e}");
        assert!(srv[3] == before, "a deregistered tensor was written");
        moved(&link, TransferOp::Write, &ps, block, &from, &to).unwrap();
        same_blocks(&cli, &srv, &rest, block, &from, &to);
    }
    client.finalize();
    server.finalize();
}

/// A tensor whose registration went (no region), or a span that passes the end of the region
/// it names, moves nothing: `LLM_PARAM_INVALID` before any byte moves, and the link stays
/// usable for the right pair.
#[test]
fn a_tensor_without_its_region_moves_nothing() {
    let (blocks, block) = (8, 64);
    let mut srv = tensors(1, blocks, block, 40);
    let mut cli = vec![vec![0u8; blocks * block]; 1];
    let (server, client, name) = engines();
    register(&server, &mut srv);
    let mine = register(&client, &mut cli);
    let link = client.connect(&name, 5000).unwrap();
    let idx = [0u64, 3];
    let mut gone = pairs(&cli, &mine, &srv, &[0]);
    gone[0].region = None;
    let mut past = pairs(&cli, &mine, &srv, &[0]);
    past[0].local += 1; // its last byte one past the region's end
    for ps in [&gone, &past] {
        let e = moved(&link, TransferOp::Read, ps, block, &idx, &idx).unwrap_err();
        assert_eq!(e.status, LlmStatus::LLM_PARAM_INVALID, "{e}");
        assert!(cli[0].iter().all(|&b| b == 0), "a refused move wrote");
    }
    let ps = pairs(&cli, &mine, &srv, &[0]);
    moved(&link, TransferOp::Read, &ps, block, &idx, &idx).unwrap();
    same_blocks(&srv, &cli, &[0], block, &idx, &idx);
    client.finalize();
    server.finalize();
}
