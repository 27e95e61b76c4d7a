//! The block-indexed form (`Link::transfer_blocks_sync`/`_async`): random blocks moved with it
//! land exactly where the list form of the same blocks puts them, over TCP and same-host (small
//! batches, batches of more than one XFER_BLOCKS frame, batches shared with the same-host
//! helper, batches split over two TCP lanes, a `Vec` region reached with `process_vm_*`), and
//! every bad input's exact error.

use crate::common;

use std::time::Duration;

use common::{Rng, client_with, expected_transport, server};
use hixl::{
    BlockIndices, BlockLayout, Error, Options, SameHost, Status, TransferArgs, TransferDesc,
    TransferOp, TransferStatus,
};

const T: Duration = Duration::from_secs(30);

/// `n` distinct random indices below `limit` (a shuffled prefix of 0..limit).
fn distinct(rng: &mut Rng, n: usize, limit: u64) -> Vec<u64> {
    let mut all: Vec<u64> = (0..limit).collect();
    for i in 0..n {
        let j = i + rng.below((limit as usize - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

#[test]
fn blocks_match_the_list_form_tcp() {
    blocks_match_the_list_form(SameHost::Forbid);
}

#[test]
fn blocks_match_the_list_form_same_host() {
    blocks_match_the_list_form(SameHost::Auto);
}

/// For each shape (block size, strides, count, index width): random data; WRITE it with the
/// block form from one half of the client's region and with the list form (the same blocks as
/// descriptors) from the other, into two halves of the server's region: the halves are equal
/// and hold the blocks where the layout says. Then READ back with the block form and compare
/// against the source blocks.
fn blocks_match_the_list_form(policy: SameHost) {
    let half = 24usize << 20;
    let (srv, mut cache) = server(2 * half, Options::default());
    let (cli, mut buf) = client_with(2 * half, Options::default().same_host(policy));
    let link = cli.connect(srv.name()).unwrap();
    assert_eq!(link.transport(), expected_transport(policy));
    let remote = link.regions().next().unwrap();
    let mut rng = Rng::new(35);
    // (block, local stride, remote stride, count, wide indices)
    let shapes: &[(u64, u64, u64, usize, bool)] = &[
        (64, 64, 64, 1, false),
        (64, 64, 64, 70_000, false),         // two frames over TCP
        (2048, 2048, 2048, 4000, true),      // 8 MiB: shared with the same-host helper
        (100, 300, 128, 5000, false),        // gaps on both sides, odd sizes
        (65_536, 65_536, 65_536, 300, true), // 19.7 MB: split over two TCP lanes
    ];
    for &(block, ls, rs, n, wide) in shapes {
        // the local blocks lie in the first half of the client's region, starting at 8
        let lbase = 8usize;
        let llimit = (half as u64 - lbase as u64 - block) / ls + 1;
        let rlimit = (half as u64 - 16 - block) / rs + 1;
        let li = distinct(&mut rng, n, llimit);
        let ri = distinct(&mut rng, n, rlimit);
        let src = rng.bytes(half);
        buf.write_at(0, &src).unwrap();
        buf.write_at(half, &src).unwrap();
        cache.write_at(0, &vec![0; 2 * half]).unwrap();
        // block form: client [lbase, half) -> server [16, half)
        let layout = BlockLayout::new(
            buf.range(lbase..half).unwrap(),
            remote.range(16..half as u64).unwrap(),
            block,
        )
        .strides(ls, rs);
        let (l32, r32): (Vec<u32>, Vec<u32>) = (
            li.iter().map(|&x| x as u32).collect(),
            ri.iter().map(|&x| x as u32).collect(),
        );
        if wide {
            link.transfer_blocks_sync(TransferOp::Write, &layout, &li, &ri, T)
        } else {
            link.transfer_blocks_sync(TransferOp::Write, &layout, &l32, &r32, T)
        }
        .unwrap();
        // list form of the same blocks: client [half + lbase, ..) -> server [half + 16, ..)
        let descs: Vec<TransferDesc<'_>> = li
            .iter()
            .zip(&ri)
            .map(|(&l, &r)| {
                let lo = half + lbase + (l * ls) as usize;
                let ro = half as u64 + 16 + r * rs;
                TransferDesc::new(
                    buf.range(lo..lo + block as usize).unwrap(),
                    remote.range(ro..ro + block).unwrap(),
                )
            })
            .collect();
        link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
        drop(descs);
        let mut got = vec![0; 2 * half];
        cache.read_at(0, &mut got).unwrap();
        assert!(
            got[..half] == got[half..],
            "block {block} x {n}: the block form and the list form put different bytes"
        );
        // and where the layout says (spot check of every block's first and last byte)
        for (&l, &r) in li.iter().zip(&ri) {
            let s = lbase + (l * ls) as usize;
            let d = 16 + (r * rs) as usize;
            let b = block as usize;
            assert_eq!(got[d], src[s]);
            assert_eq!(got[d + b - 1], src[s + b - 1]);
        }
        // READ back with the block form into the client's second half (cleared), compare
        buf.write_at(half, &vec![0; half]).unwrap();
        let back = BlockLayout::new(
            buf.range(half + lbase..2 * half).unwrap(),
            remote.range(16..half as u64).unwrap(),
            block,
        )
        .strides(ls, rs);
        let idx_l = BlockIndices::U64(&li);
        link.transfer_blocks_sync(TransferOp::Read, &back, idx_l, &ri, T)
            .unwrap();
        let mut mine = vec![0; half];
        buf.read_at(half, &mut mine).unwrap();
        for &l in &li {
            let s = lbase + (l * ls) as usize;
            let b = block as usize;
            assert!(
                mine[s..s + b] == src[s..s + b],
                "block {block}: READ back of block {l} differs"
            );
        }
    }
    drop(link);
    let _ = (cli.finalize(), srv.finalize());
}

#[test]
fn async_blocks_complete_and_move_the_data() {
    for policy in [SameHost::Forbid, SameHost::Auto] {
        let (srv, mut cache) = server(1 << 20, Options::default());
        let (cli, mut buf) = client_with(1 << 20, Options::default().same_host(policy));
        let link = cli.connect(srv.name()).unwrap();
        let remote = link.regions().next().unwrap();
        let mut rng = Rng::new(7);
        let data = rng.bytes(1 << 20);
        buf.write_at(0, &data).unwrap();
        let layout = BlockLayout::new(buf.range(..).unwrap(), remote.full(), 4096);
        let li: Vec<u32> = (0..256).collect();
        let ri: Vec<u32> = (0..256).rev().collect();
        let req = link
            .transfer_blocks_async(
                TransferOp::Write,
                &layout,
                &li,
                &ri,
                TransferArgs::tagged(9),
            )
            .unwrap();
        assert!(matches!(req.wait(T), TransferStatus::Completed));
        drop(req);
        let mut got = vec![0; 1 << 20];
        cache.read_at(0, &mut got).unwrap();
        for k in 0..256usize {
            let d = (255 - k) * 4096;
            assert!(got[d..d + 4096] == data[k * 4096..(k + 1) * 4096]);
        }
        drop(link);
        let _ = (cli.finalize(), srv.finalize());
    }
}

#[test]
fn bad_block_batches_get_their_exact_errors() {
    let (srv, _cache) = server(1 << 20, Options::default());
    let (cli, buf) = client_with(1 << 20, Options::default());
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    let lr = buf.range(..).unwrap();
    let ok = BlockLayout::new(lr, remote.full(), 4096);
    let w = TransferOp::Write;
    let run = |layout: &BlockLayout<'_>, l: &[u32], r: &[u32]| {
        link.transfer_blocks_sync(w, layout, l, r, T).unwrap_err()
    };
    let check = |e: Error, status: Status| assert_eq!(e.status(), status, "{e}");
    // zero block, and a stride smaller than the block
    let e = run(&BlockLayout::new(lr, remote.full(), 0), &[0], &[0]);
    assert!(
        matches!(e, Error::InvalidBlockLayout { block_size: 0, .. }),
        "{e}"
    );
    check(e, Status::PARAM_INVALID);
    let e = run(&ok.strides(4096, 2048), &[0], &[0]);
    assert!(
        matches!(
            e,
            Error::InvalidBlockLayout {
                remote_stride: 2048,
                ..
            }
        ),
        "{e}"
    );
    // arrays of different lengths; none at all
    let e = run(&ok, &[0, 1], &[0]);
    assert!(
        matches!(
            e,
            Error::BlockCountMismatch {
                local: 2,
                remote: 1
            }
        ),
        "{e}"
    );
    check(e, Status::PARAM_INVALID);
    let e = run(&ok, &[], &[]);
    assert!(matches!(e, Error::EmptyBatch), "{e}");
    // an index past the range: the largest one, at its first position
    let e = run(&ok, &[0, 256, 3, 256], &[0, 1, 2, 3]);
    assert!(
        matches!(
            e,
            Error::BlockOutOfBounds {
                side: "local",
                position: 1,
                block: 256,
                range_len: 1048576,
                ..
            }
        ),
        "{e}"
    );
    check(e, Status::PARAM_INVALID);
    let e = run(&ok, &[0, 1], &[255, 256]);
    assert!(
        matches!(
            e,
            Error::BlockOutOfBounds {
                side: "remote",
                position: 1,
                block: 256,
                ..
            }
        ),
        "{e}"
    );
    // the last block that fits is fine; a range shorter than the region bounds the blocks
    link.transfer_blocks_sync(w, &ok, &[255u32][..], &[255u32][..], T)
        .unwrap();
    let short = BlockLayout::new(lr, remote.range(4096..8192).unwrap(), 4096);
    let e = run(&short, &[0], &[1]);
    assert!(
        matches!(
            e,
            Error::BlockOutOfBounds {
                side: "remote",
                range_len: 4096,
                ..
            }
        ),
        "{e}"
    );
    // index x stride overflows u64
    let big = [u64::MAX / 2];
    let e = link
        .transfer_blocks_sync(w, &ok, &big[..], &[0u64][..], T)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::BlockOutOfBounds {
                side: "local",
                block: 0x7fff_ffff_ffff_ffff,
                ..
            }
        ),
        "{e}"
    );
    check(e, Status::PARAM_INVALID);
    // a zero timeout
    let e = link
        .transfer_blocks_sync(w, &ok, &[0u32][..], &[0u32][..], Duration::ZERO)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTimeout { .. }), "{e}");
    // a remote range of another link
    let (srv2, _c2) = server(1 << 20, Options::default());
    let link2 = cli.connect(srv2.name()).unwrap();
    let other = link2.regions().next().unwrap().full();
    let e = run(&BlockLayout::new(lr, other, 4096), &[0], &[0]);
    assert!(
        matches!(
            e,
            Error::ForeignHandle {
                what: "remote range",
                ..
            }
        ),
        "{e}"
    );
    // async: the same checks before anything starts
    let e = link
        .transfer_blocks_async(w, &ok, &[0u32, 1][..], &[0u32][..], TransferArgs::default())
        .unwrap_err();
    assert!(matches!(e, Error::BlockCountMismatch { .. }), "{e}");
    drop((link, link2));
    let _ = (cli.finalize(), srv.finalize(), srv2.finalize());
}

/// A server region that is a `Vec<u8>` (no memfd): a same-host client reaches it with
/// `process_vm_readv`/`writev` over the blocks' iovecs (adjacent blocks in one); the block form
/// puts the same bytes where the list form does.
#[test]
fn blocks_into_a_vec_region_same_host() {
    let len = 4usize << 20;
    let e = hixl::Hixl::initialize_ephemeral("127.0.0.1", Options::default())
        .unwrap()
        .into_registered();
    let mut cache = e.register(vec![0u8; len]).unwrap();
    let srv = e.activate().unwrap();
    let (cli, mut buf) = client_with(len, Options::default().same_host(SameHost::Auto));
    let link = cli.connect(srv.name()).unwrap();
    let remote = link.regions().next().unwrap();
    assert_eq!(
        remote.transport(),
        expected_transport(SameHost::Auto),
        "a Vec region is reached one-sidedly where the kernel allows"
    );
    let mut rng = Rng::new(36);
    let data = rng.bytes(len);
    buf.write_at(0, &data).unwrap();
    let half = len / 2;
    let block = 1000u64;
    let n = 1500usize;
    // runs of adjacent blocks (coalesced) and scattered ones
    let li: Vec<u64> = (0..n as u64).collect();
    let ri: Vec<u64> = (0..n as u64)
        .map(|k| if k < 500 { k } else { 600 + (k * 7) % 1400 })
        .collect();
    let ri: Vec<u64> = {
        let mut seen = std::collections::HashSet::new();
        ri.into_iter()
            .map(|r| {
                let mut r = r;
                while !seen.insert(r) {
                    r += 1;
                }
                r
            })
            .collect()
    };
    assert!(ri.iter().all(|&r| (r + 1) * block <= half as u64));
    let layout = BlockLayout::new(
        buf.range(..half).unwrap(),
        remote.range(..half as u64).unwrap(),
        block,
    );
    link.transfer_blocks_sync(TransferOp::Write, &layout, &li, &ri, T)
        .unwrap();
    let descs: Vec<TransferDesc<'_>> = li
        .iter()
        .zip(&ri)
        .map(|(&l, &r)| {
            let (l, r) = ((l * block) as usize, half as u64 + r * block);
            TransferDesc::new(
                buf.range(l..l + block as usize).unwrap(),
                remote.range(r..r + block).unwrap(),
            )
        })
        .collect();
    link.transfer_sync(TransferOp::Write, &descs, T).unwrap();
    drop(descs);
    let mut got = vec![0; len];
    cache.read_at(0, &mut got).unwrap();
    assert!(got[..half] == got[half..], "the forms put different bytes");
    for (&l, &r) in li.iter().zip(&ri) {
        let (l, r, b) = (l as usize * 1000, r as usize * 1000, 1000);
        assert!(got[r..r + b] == data[l..l + b]);
    }
    // READ back by blocks into the second half (cleared), compare
    buf.write_at(half, &vec![0; half]).unwrap();
    let back = BlockLayout::new(
        buf.range(half..).unwrap(),
        remote.range(..half as u64).unwrap(),
        block,
    );
    link.transfer_blocks_sync(TransferOp::Read, &back, &li, &ri, T)
        .unwrap();
    let mut mine = vec![0; len];
    buf.read_at(0, &mut mine).unwrap();
    assert!(mine[half..half + n * 1000] == data[..n * 1000]);
    drop(link);
    let _ = (cli.finalize(), srv.finalize());
}
