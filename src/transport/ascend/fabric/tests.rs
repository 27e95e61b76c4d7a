//! The fabric path's ACL calls on the test double: a fabric handle round trip within the
//! process, and the handle of a process that has gone (an ACL error, never a crash).

use std::ffi::c_void;

use super::ffi::{self, FabricApi, PhysicalMemProp};
use crate::device::acl::tests::Fixture;

fn alloc(api: &FabricApi) -> (usize, usize) {
    let prop = PhysicalMemProp {
        mem_attr: ffi::ACL_HBM_MEM_HUGE,
        location: ffi::MemLocation {
            id: 0,
            kind: ffi::LOCATION_DEVICE,
        },
        ..PhysicalMemProp::default()
    };
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer and a valid property struct.
    let rc = unsafe { (api.malloc_physical)(&mut h, super::GRANULE, &prop, 0) };
    assert_eq!(rc, 0);
    let mut va: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer; one granule.
    let rc = unsafe { (api.reserve)(&mut va, super::GRANULE, 0, std::ptr::null_mut(), 1) };
    assert_eq!(rc, 0);
    // SAFETY: a fresh reservation and a live handle.
    assert_eq!(unsafe { (api.map)(va, super::GRANULE, 0, h, 0) }, 0);
    (va as usize, h as usize)
}

#[test]
fn handles_round_trip_and_a_gone_exporter_is_an_acl_error() {
    let f = Fixture::on_device("fabric-handles");
    let api = FabricApi::load(f.acl.library()).expect("the double has the VMM calls");
    let (va, h) = alloc(&api);
    // SAFETY: `va` is a live mapping of one granule.
    unsafe { std::ptr::write_bytes(va as *mut u8, 0x5A, 4096) };
    let mut handle = [0u8; 128];
    // SAFETY: a live handle; 128 writable bytes.
    let rc = unsafe {
        (api.export)(
            h as *mut c_void,
            1,
            ffi::SHARE_FABRIC,
            handle.as_mut_ptr().cast(),
        )
    };
    assert_eq!(rc, 0);
    // imported and mapped at another address: the same physical memory
    let mut h2: *mut c_void = std::ptr::null_mut();
    // SAFETY: 128 readable bytes and an out-pointer.
    let rc = unsafe { (api.import)(handle.as_mut_ptr().cast(), ffi::SHARE_FABRIC, 0, &mut h2) };
    assert_eq!(rc, 0);
    let mut va2: *mut c_void = std::ptr::null_mut();
    // SAFETY: as in `alloc`.
    unsafe {
        assert_eq!(
            (api.reserve)(&mut va2, super::GRANULE, 0, std::ptr::null_mut(), 1),
            0
        );
        assert_eq!((api.map)(va2, super::GRANULE, 0, h2, 0), 0);
        assert_eq!(*(va2 as *const u8).add(100), 0x5A);
        *(va2 as *mut u8).add(200) = 0x11;
        assert_eq!(*(va as *const u8).add(200), 0x11);
    }
    // the handle of a process that has gone: its pid (bytes 8..12 of the double's handle)
    // replaced by a reaped child's
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    let mut gone = handle;
    gone[8..12].copy_from_slice(&pid.to_ne_bytes());
    let mut h3: *mut c_void = std::ptr::null_mut();
    // SAFETY: 128 readable bytes and an out-pointer.
    let rc = unsafe { (api.import)(gone.as_mut_ptr().cast(), ffi::SHARE_FABRIC, 0, &mut h3) };
    assert_eq!(rc, 107_000, "ACL_ERROR_RT_PARAM_INVALID");
    let e = f.acl.error("aclrtMemImportFromShareableHandleV2", rc);
    assert!(e.to_string().contains("is gone"), "{e}");
    // garbage is refused too
    let mut junk = [0xEEu8; 128];
    // SAFETY: as above.
    let rc = unsafe { (api.import)(junk.as_mut_ptr().cast(), ffi::SHARE_FABRIC, 0, &mut h3) };
    assert_eq!(rc, 107_000);
    // SAFETY: teardown in order, each once.
    unsafe {
        assert_eq!((api.unmap)(va2), 0);
        assert_eq!((api.release)(va2), 0);
        assert_eq!((api.free_physical)(h2), 0);
        assert_eq!((api.unmap)(va as *mut c_void), 0);
        assert_eq!((api.release)(va as *mut c_void), 0);
        assert_eq!((api.free_physical)(h as *mut c_void), 0);
    }
}

/// Foreign VMM memory (mapped by the caller, not by `malloc_mem`): one reservation holding two
/// physical allocations is registered as two blocks, each retained and exported; memory that is
/// not VMM memory is `UNSUPPORTED`; the retained handles go with the registration.
#[test]
fn foreign_vmm_memory_registers_block_by_block() {
    let f = Fixture::on_device("fabric-foreign");
    let api = FabricApi::load(f.acl.library()).unwrap();
    let device = crate::device::Device::open(f.acl.clone(), Some(0), false).unwrap();
    let rt = std::sync::Arc::new(super::FabricRt {
        device: std::sync::Arc::new(device),
        api,
        streams: 1,
    });
    let g = super::GRANULE;
    let api = &rt.api;
    let mut va: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer; two granules.
    let rc = unsafe { (api.reserve)(&mut va, 2 * g, 0, std::ptr::null_mut(), 1) };
    assert_eq!(rc, 0);
    let prop = PhysicalMemProp {
        mem_attr: ffi::ACL_HBM_MEM_HUGE,
        location: ffi::MemLocation {
            id: 0,
            kind: ffi::LOCATION_DEVICE,
        },
        ..PhysicalMemProp::default()
    };
    let mut hs = [std::ptr::null_mut::<c_void>(); 2];
    for (i, h) in hs.iter_mut().enumerate() {
        // SAFETY: out-pointer, valid property struct; then a range of our own reservation.
        unsafe {
            assert_eq!((api.malloc_physical)(h, g, &prop, 0), 0);
            assert_eq!((api.map)(va.cast::<u8>().add(i * g).cast(), g, 0, *h, 0), 0);
        }
    }
    let reg = rt
        .export_range(
            va as usize + 4096,
            2 * g - 8192,
            crate::types::MemType::Device,
        )
        .expect("two blocks");
    assert_eq!(reg.blocks.len(), 2);
    assert_eq!(reg.blocks[0].base, va as usize);
    assert_eq!(reg.blocks[1].base, va as usize + g);
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
            assert_eq!((api.unmap)(va.cast::<u8>().add(i * g).cast()), 0);
            assert_eq!((api.free_physical)(*h), 0);
        }
        assert_eq!((api.release)(va), 0);
    }
    // a handle freed once more is refused: the retained references were released
    // SAFETY: a stale handle is looked up by the double, never dereferenced.
    assert_ne!(unsafe { (api.free_physical)(hs[0]) }, 0);
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
        match super::loopback_overlap(op, &descs, &table) {
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
