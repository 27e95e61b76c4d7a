//! The fabric path on the test double: a foreign VMM region registered block by block, and the
//! self-link's overlap rule. (The VMM calls themselves, a fabric handle round trip and a gone
//! exporter's handle, are the device floor's tests: `device/acl/tests.rs`.)

use std::sync::Arc;

use super::link::loopback_overlap;
use super::rt::FabricRt;
use crate::device::acl::tests::Fixture;
use crate::device::acl::{MemLocation, VMM_GRANULE};

/// A private double (`tag`) with device 0 current, and a fabric runtime of one stream on it.
fn runtime(tag: &str) -> (Fixture, Arc<FabricRt>) {
    let f = Fixture::on_device(tag);
    let device = crate::device::Device::open(f.acl.clone(), Some(0), false).unwrap();
    let rt = Arc::new(FabricRt {
        device: Arc::new(device),
        streams: 1,
    });
    (f, rt)
}

/// One VMM granule of device memory, mapped into a reservation of this process and exported
/// as a fabric block (a genuine handle a peer could import): its address, its physical handle
/// and its registration. The caller unmaps, frees and releases them.
fn exported_granule(rt: &Arc<FabricRt>) -> (usize, usize, super::rt::FabricReg) {
    let acl = rt.acl();
    let g = VMM_GRANULE;
    let va = acl.reserve(g).unwrap();
    let h = acl.malloc_physical(g, MemLocation::device(0)).unwrap();
    // SAFETY: a granule of our own reservation, unmapped; a live handle.
    unsafe { acl.map(va, g, h) }.unwrap();
    let reg = (rt.export_range(va, g, crate::types::MemType::Device)).expect("one block");
    (va, h, reg)
}

/// Memory the engine's allocator made registers with the allocator's handle and its one
/// export, as upstream's does: ACL holds a handle and its shareable handle one to one within a
/// process (the double refuses a second export), and HDK 25.5 has no retain. After
/// `export_to_shareable_handle`, and again after the registration ended, with retain failing
/// as on 25.5: each registration hands peers the allocator's export and releases nothing of
/// the allocator's. Before, every registration retained and exported again: the first failed
/// `UNSUPPORTED` without retain, and any second export `Native`.
#[test]
fn the_allocators_memory_registers_with_its_one_export() {
    use crate::device::{Holder, free_mem, malloc_with};
    use crate::types::MemType;
    let (f, rt) = runtime("fabric-own");
    let va = malloc_with(rt.acl(), MemType::Device, 4096, Holder::Caller).unwrap();
    let h = crate::device::export_to_shareable_handle(va).unwrap();
    f.fail("aclrtMemRetainAllocationHandle=207000");
    for round in 0..2 {
        let reg = (rt.export_range(va, 4096, MemType::Device))
            .unwrap_or_else(|e| panic!("registration {round}: {e}"));
        assert_eq!(reg.blocks.len(), 1);
        assert_eq!((reg.blocks[0].base, reg.blocks[0].handle), (va, h));
        assert!(!reg.blocks[0].retained);
        drop(reg);
    }
    // the allocator's handle is still live: freed once, by its owner
    free_mem(va).unwrap();
}

/// Foreign VMM memory (mapped by the caller, not by `malloc_mem`): one reservation holding two
/// physical allocations is registered as two blocks, each retained and exported; memory that is
/// not VMM memory is `UNSUPPORTED`; the retained handles go with the registration.
#[test]
fn foreign_vmm_memory_registers_block_by_block() {
    let (_f, rt) = runtime("fabric-foreign");
    let g = VMM_GRANULE;
    let acl = rt.acl();
    let va = acl.reserve(2 * g).unwrap();
    let mut hs = [0usize; 2];
    for (i, h) in hs.iter_mut().enumerate() {
        *h = acl.malloc_physical(g, MemLocation::device(0)).unwrap();
        // SAFETY: a granule of our own reservation, unmapped; a live handle.
        unsafe { acl.map(va + i * g, g, *h) }.unwrap();
    }
    let reg = rt
        .export_range(va + 4096, 2 * g - 8192, crate::types::MemType::Device)
        .expect("two blocks");
    assert_eq!(reg.blocks.len(), 2);
    assert_eq!(reg.blocks[0].base, va);
    assert_eq!(reg.blocks[1].base, va + g);
    assert!(
        reg.blocks
            .iter()
            .all(|b| b.len == g && b.handle != [0; 128])
    );
    let mut plain = vec![0u8; 4096];
    let e = rt
        .export_range(
            plain.as_mut_ptr() as usize,
            plain.len(),
            crate::types::MemType::Host,
        )
        .err()
        .expect("not VMM memory");
    assert_eq!(e.status(), crate::error::Status::UNSUPPORTED);
    drop(reg); // releases the retained handles
    // SAFETY: teardown of what this test made, once each.
    unsafe {
        for (i, h) in hs.iter().enumerate() {
            acl.unmap(va + i * g).unwrap();
            acl.free_physical(*h).unwrap();
        }
        acl.release(va).unwrap();
    }
    // a handle freed once more is refused: the retained references were released
    // SAFETY: a stale handle is looked up by the double, never dereferenced.
    assert!(unsafe { acl.free_physical(hs[0]) }.is_err());
}

/// The self-link's overlap check against a brute-force one, on random batches over a small
/// address range (so that overlaps, touching ranges and equal starts are frequent).
#[test]
fn loopback_overlap_matches_brute_force() {
    use crate::types::{BatchDesc, TransferOp, WireDesc};
    use std::collections::HashMap;
    let table: HashMap<u32, u64> = [(1, 0x1000), (2, 0x1400)].into_iter().collect();
    // xorshift64*: reproducible, and no test-support feature needed
    let mut state = 0x0E1Au64;
    let mut next = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut refused = 0;
    for round in 0..4000 {
        let n = 1 + (next() % 4) as usize;
        let descs: Vec<BatchDesc> = (0..n)
            .map(|_| BatchDesc {
                local: 0x1000 + (next() % 0x800) as usize,
                remote: WireDesc {
                    region: 1 + (next() % 2) as u32,
                    offset: next() % 0x300,
                    len: 1 + next() % 0x100,
                },
            })
            .collect();
        let op = if round % 2 == 0 {
            TransferOp::Write
        } else {
            TransferOp::Read
        };
        let span = |d: &BatchDesc| {
            let remote = table[&d.remote.region] + d.remote.offset;
            let local = d.local as u64;
            let (dst, src) = match op {
                TransferOp::Write => (remote, local),
                TransferOp::Read => (local, remote),
            };
            (src, dst, d.remote.len)
        };
        let brute = descs.iter().any(|a| {
            descs.iter().any(|b| {
                let (src, _, la) = span(a);
                let (_, dst, lb) = span(b);
                src < dst + lb && dst < src + la
            })
        });
        match loopback_overlap(op, &descs, &table) {
            Ok(()) => assert!(!brute, "missed an overlap: {op:?} {descs:?}"),
            Err(crate::error::Error::OverlappingTransfer { src, dst }) => {
                assert!(brute, "refused a batch without overlap: {op:?} {descs:?}");
                let (s, _, ls) = span(&descs[src]);
                let (_, d, ld) = span(&descs[dst]);
                assert!(s < d + ld && d < s + ls, "named the wrong pair {src} {dst}");
                refused += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(refused > 100 && refused < 3900, "{refused}");
}

/// A peer's block whose length rounds up past the address space (`u64::MAX`, with a genuine
/// handle the peer exported) is refused as `AddressOverflow` before anything is imported: no
/// overflow (a panic in a debug build, a reservation of 0 bytes in a release one), and no
/// imported handle left behind.
#[test]
fn a_block_longer_than_the_address_space_is_refused_before_its_import() {
    use super::link::FabricLink;
    use crate::wire::{FabricBlock, TableEntry};
    let (f, rt) = runtime("fabric-overflow");
    let acl = rt.acl();
    let (va, h, reg) = exported_granule(&rt);
    let block = FabricBlock {
        region: 1,
        base: 0,
        len: u64::MAX,
        handle: reg.blocks[0].handle,
    };
    let table = [TableEntry {
        id: 1,
        addr: 0,
        len: u64::MAX,
        mem_type: crate::types::MemType::Device,
        access: crate::types::Access::ReadWrite,
        fd: -1,
    }];
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let e = FabricLink::import(&rt, "peer", &[block], &table, &live)
        .err()
        .expect("refused");
    assert!(
        matches!(e, crate::error::Error::AddressOverflow { .. }),
        "{e:?}"
    );
    let imports = (f.log_lines().iter())
        .filter(|l| l.contains("aclrtMemImportFromShareableHandle"))
        .count();
    assert_eq!(imports, 0, "imported before the length was checked");
    drop(reg);
    // SAFETY: teardown of what this test made, once each.
    unsafe {
        acl.unmap(va).unwrap();
        acl.free_physical(h).unwrap();
        acl.release(va).unwrap();
    }
}

/// A failed batch whose streams cannot be aborted (a sync timeout, then `aclrtStreamAbort`
/// failing: the device may still run the copies) poisons the link, and the link, when it goes,
/// leaks its imported mapping and its streams instead of unmapping them under those copies
/// (as the HCCL path leaks its communicator). Before, the failure was only logged: the link
/// stayed usable and its drop unmapped the import.
#[test]
fn an_unabortable_fabric_link_keeps_its_imports() {
    use super::link::FabricLink;
    use crate::transport::ascend::path::AscendLink;
    use crate::transport::{Batch, Mode, PathFail};
    use crate::types::{BatchDesc, TransferOp};
    use crate::wire::TableEntry;
    let (f, rt) = runtime("fabric-stuck");
    let acl = rt.acl();
    let g = VMM_GRANULE;
    let (va, h, reg) = exported_granule(&rt);
    let block = crate::wire::FabricBlock {
        region: 1,
        base: reg.blocks[0].base as u64,
        len: reg.blocks[0].len as u64,
        handle: reg.blocks[0].handle,
    };
    let table = [TableEntry {
        id: 1,
        addr: va as u64,
        len: g as u64,
        mem_type: crate::types::MemType::Device,
        access: crate::types::Access::ReadWrite,
        fd: -1,
    }];
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let link = FabricLink::import(&rt, "peer", &[block], &table, &live).expect("imported");
    let mut local = vec![0u8; 4096];
    let descs = [BatchDesc::of(local.as_mut_ptr() as usize, 1, 0, 4096)];
    let started = std::time::Instant::now();
    let batch = Batch {
        peer: "peer",
        op: TransferOp::Read,
        descs: (&descs[..]).into(),
        bytes: 4096,
        started,
        deadline: started + std::time::Duration::from_millis(50),
        mode: Mode::Sync,
        given_up: None,
    };
    f.fail("sync_timeout,aclrtStreamAbort");
    // SAFETY: `local` is this test's memory, alive for the call and after it (the copy the
    // device may still run is the double's, and it ran already); the remote range is inside
    // the imported block.
    match unsafe { link.run(&batch) } {
        Err(PathFail::Poisoned { error, .. }) => {
            assert_eq!(error.status(), crate::error::Status::TIMEOUT, "{error:?}")
        }
        Err(other) => panic!("expected a poisoned link, got {other:?}"),
        Ok(()) => panic!("the batch succeeded under a sync timeout"),
    }
    f.fail("");
    let unmaps = |f: &Fixture| {
        (f.log_lines().iter())
            .filter(|l| l.starts_with("aclrtUnmapMem "))
            .count()
    };
    let before = unmaps(&f);
    drop(link);
    assert_eq!(unmaps(&f), before, "the stuck link unmapped its import");
    drop(reg);
    drop(local);
    // SAFETY: teardown of what this test made (the leaked import keeps its own references).
    unsafe {
        acl.unmap(va).unwrap();
        let _ = acl.free_physical(h);
        acl.release(va).unwrap();
    }
}
