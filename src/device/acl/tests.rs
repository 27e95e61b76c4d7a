//! Tests of the ACL wrappers against the test double (`double.rs`), and the [`Fixture`] the
//! other Ascend tests build on (a private double instance with its own log).

use std::path::PathBuf;
use std::time::Duration;

use super::{Acl, MallocPolicy, MemLocation, VMM_GRANULE, timeout_ms};
use crate::device::double;
use crate::device::sys::acl as sys;
use crate::error::{Error, Status};

/// A private double instance with its own log file; removes both on drop.
pub(crate) struct Fixture {
    pub(crate) so: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) acl: Acl,
}

impl Fixture {
    pub(crate) fn new(tag: &str) -> Self {
        let so = double::test_instance(tag);
        let log = so.with_extension("log");
        let _ = std::fs::remove_file(&log);
        let acl = Acl::load(Some(&so)).expect("load the double as ACL");
        double::control(&so, "log", Some(&log.to_string_lossy()));
        double::control(&so, "fail", Some(""));
        double::control(&so, "dir", Some(""));
        double::control(&so, "device_ip", Some(""));
        Self { so, log, acl }
    }

    /// [`new`](Self::new), then `aclInit` and device 0 current on this thread.
    pub(crate) fn on_device(tag: &str) -> Self {
        let f = Self::new(tag);
        f.acl.init().unwrap();
        f.acl.set_device(0).unwrap();
        f
    }

    pub(crate) fn fail(&self, what: &str) {
        double::control(&self.so, "fail", Some(what));
    }

    pub(crate) fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.so);
        let _ = std::fs::remove_file(&self.log);
    }
}

#[test]
fn device_context_and_memory_round_trip() {
    let f = Fixture::new("acl-basic");
    let acl = &f.acl;
    acl.init().unwrap();
    acl.init().expect("a repeated aclInit is fine");
    acl.set_device(3).unwrap();
    assert_eq!(acl.device().unwrap(), 3);
    let ctx = acl.current_context().unwrap();
    let buf = acl.malloc_device(4 << 20, MallocPolicy::HugeOnly).unwrap();
    assert_eq!(buf.addr() % sys::HUGE_PAGE, 0, "HUGE_ONLY is 2 MiB aligned");
    assert_eq!(buf.len(), 4 << 20);
    acl.write(&buf, 10, b"hello ascend").unwrap();
    let mut back = [0u8; 12];
    acl.read(&buf, 10, &mut back).unwrap();
    assert_eq!(&back, b"hello ascend");
    let e = acl.write(&buf, (4 << 20) - 2, b"abc").unwrap_err();
    assert!(matches!(e, Error::RangeOutOfBounds { .. }), "{e:?}");
    let host = acl.malloc_host(4096).unwrap();
    assert!(host.is_host());
    acl.write(&host, 0, b"pinned").unwrap();
    let stream = acl.create_stream().unwrap();
    assert_eq!(stream.context(), Some(ctx));
    acl.synchronize(&stream, Duration::from_millis(100), "WRITE", "peer")
        .unwrap();
    acl.destroy_stream(stream).unwrap();
    buf.free().unwrap();
    drop(host);
    acl.reset_device(3).unwrap();
    acl.finalize().unwrap();
    let log = f.log_lines();
    assert!(
        log.iter()
            .any(|l| l.starts_with("aclrtMalloc size=4194304 policy=1 ")),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with("aclrtFreeHost ") && l.ends_with("rc=0"))
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with("aclrtDestroyStream ") && l.ends_with("rc=0"))
    );
}

/// As in CANN (hicann/runtime `aclrtSetDeviceImpl`, `ApiImpl::GetDevice`, `aclInitImpl`,
/// `aclFinalizeImpl`): no `aclInit` is needed, `aclrtGetDevice` answers for the calling thread
/// and is `ACL_ERROR_RT_CONTEXT_NULL` where no device was set, `aclInit` is reference counted
/// and only a second `aclFinalize` in a row is refused.
#[test]
fn set_device_needs_no_acl_init_and_get_device_is_per_thread() {
    let f = Fixture::new("acl-noinit");
    let acl = &f.acl;
    let native = |e: Error| match e {
        Error::Native { code, .. } => code,
        other => panic!("wrong error {other:?}"),
    };
    assert_eq!(native(acl.device().unwrap_err()), 107_002);
    acl.set_device(2).expect("aclrtSetDevice without aclInit");
    assert_eq!(acl.device().unwrap(), 2);
    let buf = acl.malloc_device(2 << 20, MallocPolicy::HugeOnly).unwrap();
    acl.write(&buf, 0, b"no aclInit").unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(native(acl.device().unwrap_err()), 107_002);
            acl.set_device(5).unwrap();
            assert_eq!(acl.device().unwrap(), 5);
            acl.reset_device(5).unwrap();
        });
    });
    assert_eq!(
        acl.device().unwrap(),
        2,
        "the other thread's device is its own"
    );
    drop(buf);
    acl.reset_device(2).unwrap();
    assert_eq!(native(acl.device().unwrap_err()), 107_002);
    // CANN: "the device has not been set or has already been reset"
    assert_eq!(native(acl.reset_device(2).unwrap_err()), 507_007);
    assert_eq!(native(acl.reset_device(99).unwrap_err()), 107_001);
    let e = acl.set_device(16).unwrap_err();
    assert_eq!(native(e), 107_001, "16 devices by default");

    acl.finalize()
        .expect("aclFinalize without aclInit, as CANN");
    assert_eq!(native(acl.finalize().unwrap_err()), 100_037);
    acl.init().unwrap();
    acl.init().expect("a repeated aclInit (100002) is fine");
    acl.finalize().unwrap();
    let log = f.log_lines();
    assert!(
        log.iter().any(|l| l == "aclInit config=(null) rc=100002"),
        "{log:#?}"
    );
}

#[test]
fn calls_without_a_context_fail_and_guards_switch_and_restore() {
    let f = Fixture::new("acl-ctx");
    let acl = f.acl.clone();
    acl.init().unwrap();
    acl.set_device(1).unwrap();
    let ctx = acl.current_context().unwrap();
    let buf = std::thread::scope(|s| {
        s.spawn(|| {
            // a fresh thread has no current context
            let e = acl
                .malloc_device(4096, MallocPolicy::HugeFirst)
                .unwrap_err();
            match &e {
                Error::Native {
                    library: "acl",
                    call: "aclrtMalloc",
                    code,
                    detail,
                } => {
                    assert_eq!(*code, 107_002);
                    assert!(detail.starts_with("ACL_ERROR_RT_CONTEXT_NULL"), "{detail}");
                    assert!(detail.contains("without a current context"), "{detail}");
                }
                other => panic!("wrong error {other:?}"),
            }
            assert_eq!(e.status(), Status::FAILED);
            let guard = acl.enter(ctx).unwrap();
            let buf = acl.malloc_device(4096, MallocPolicy::HugeFirst).unwrap();
            drop(guard);
            buf
        })
        .join()
        .unwrap()
    });
    // freed on this thread, under the context it remembers
    drop(buf);
    let log = f.log_lines();
    let sets = log
        .iter()
        .filter(|l| l.starts_with("aclrtSetCurrentContext ctx=") && l.ends_with("rc=0"))
        .count();
    assert!(sets >= 1, "{log:#?}");
    assert!(
        log.iter()
            .any(|l| l.starts_with("aclrtFree ") && l.ends_with("rc=0"))
    );
}

#[test]
fn injected_failures_map_to_hixl_statuses() {
    let f = Fixture::on_device("acl-fail");
    let acl = &f.acl;
    f.fail("aclrtMalloc");
    let e = acl
        .malloc_device(1 << 20, MallocPolicy::HugeOnly)
        .unwrap_err();
    match &e {
        Error::Native {
            library,
            call,
            code,
            detail,
        } => {
            assert_eq!(*library, "acl");
            assert_eq!(*call, "aclrtMalloc");
            assert_eq!(*code, 207_001);
            assert!(
                detail.starts_with("ACL_ERROR_RT_MEMORY_ALLOCATION: "),
                "{detail}"
            );
            assert!(detail.contains("injected failure"), "{detail}");
        }
        other => panic!("wrong error {other:?}"),
    }
    assert_eq!(e.status(), Status::FAILED);
    assert_eq!(e.status().code(), 503_900);

    f.fail("sync_timeout");
    let stream = acl.create_stream().unwrap();
    let e = acl
        .synchronize(&stream, Duration::from_millis(5), "WRITE", "10.0.0.2:16000")
        .unwrap_err();
    assert!(
        matches!(&e, Error::Timeout { op: "WRITE", peer, .. } if peer == "10.0.0.2:16000"),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::TIMEOUT);
    assert_eq!(e.status().code(), 103_901);
    for code in [107_019, 107_020, 207_020] {
        f.fail(&format!("aclrtSynchronizeStreamWithTimeout={code}"));
        let e = acl
            .synchronize(&stream, Duration::from_millis(5), "READ", "p")
            .unwrap_err();
        assert_eq!(e.status(), Status::TIMEOUT, "{code}: {e:?}");
    }
    f.fail("aclrtSynchronizeStreamWithTimeout=507899");
    let e = acl
        .synchronize(&stream, Duration::from_millis(5), "READ", "p")
        .unwrap_err();
    assert!(matches!(&e, Error::Native { code: 507_899, .. }), "{e:?}");
    assert_eq!(e.status(), Status::FAILED);
    f.fail("");
    drop(stream);
    let log = f.log_lines();
    assert!(
        log.iter().any(
            |l| l.starts_with("aclrtSynchronizeStreamWithTimeout ") && l.ends_with("rc=507046")
        ),
        "{log:#?}"
    );
}

#[test]
fn a_misaligned_huge_only_allocation_is_refused_and_freed() {
    let f = Fixture::on_device("acl-align");
    let acl = &f.acl;
    f.fail("misalign");
    let e = acl
        .malloc_device(2 << 20, MallocPolicy::HugeOnly)
        .unwrap_err();
    assert!(
        matches!(&e, Error::Native { call: "aclrtMalloc", code: 200_003, detail, .. } if detail.contains("2 MiB")),
        "{e:?}"
    );
    // not a multiple of 2 MiB: no alignment promise to check
    let odd = acl.malloc_device(3 << 19, MallocPolicy::HugeOnly).unwrap();
    drop(odd);
    // other policies make no alignment promise
    let normal = acl.malloc_device(2 << 20, MallocPolicy::HugeFirst).unwrap();
    drop(normal);
    let log = f.log_lines();
    let frees = log
        .iter()
        .filter(|l| l.starts_with("aclrtFree ") && l.ends_with("rc=0"))
        .count();
    assert_eq!(frees, 3, "the refused allocation was freed too: {log:#?}");
}

#[test]
fn timeouts_round_up_to_whole_milliseconds() {
    assert_eq!(timeout_ms(Duration::ZERO), 1);
    assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
    assert_eq!(timeout_ms(Duration::from_micros(1500)), 2);
    assert_eq!(timeout_ms(Duration::from_secs(3)), 3000);
    assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), i32::MAX);
    assert!(MallocPolicy::HugeOnly.huge_only());
    assert!(MallocPolicy::HugeOnlyP2p.huge_only());
    assert!(!MallocPolicy::Raw(0x1000).huge_only());
    assert!(MallocPolicy::Raw(0x1001).huge_only());
}

/// The VMM calls on the double: physical memory reserved, mapped, exported as a fabric handle
/// and imported at another address (the same physical memory); the handle of a process that
/// has gone, and garbage, are ACL errors (`ACL_ERROR_RT_PARAM_INVALID`), never a crash.
#[test]
fn fabric_handles_round_trip_and_a_gone_exporter_is_an_acl_error() {
    let f = Fixture::on_device("fabric-handles");
    let acl = &f.acl;
    acl.check_vmm().expect("the double has the VMM calls");
    let g = VMM_GRANULE;
    let h = acl.malloc_physical(g, MemLocation::device(0)).unwrap();
    let va = acl.reserve(g).unwrap();
    // SAFETY: a fresh reservation and a live handle.
    unsafe { acl.map(va, g, h) }.unwrap();
    // SAFETY: `va` is a live mapping of one granule (host memory on the double).
    unsafe { std::ptr::write_bytes(va as *mut u8, 0x5A, 4096) };
    // SAFETY: a live handle.
    let handle = unsafe { acl.export_fabric(h) }.unwrap();
    // imported and mapped at another address: the same physical memory
    let h2 = acl.import_fabric(&handle).unwrap();
    let va2 = acl.reserve(g).unwrap();
    // SAFETY: as above; both mappings are the double's host memory, one granule each.
    unsafe {
        acl.map(va2, g, h2).unwrap();
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
    let e = acl.import_fabric(&gone).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Native {
                call: "aclrtMemImportFromShareableHandleV2",
                code: 107_000,
                ..
            }
        ),
        "ACL_ERROR_RT_PARAM_INVALID: {e:?}"
    );
    assert!(e.to_string().contains("is gone"), "{e}");
    // garbage is refused too
    let e = acl.import_fabric(&[0xEE; 128]).unwrap_err();
    assert!(matches!(&e, Error::Native { code: 107_000, .. }), "{e:?}");
    // SAFETY: teardown in order, each once.
    unsafe {
        acl.unmap(va2).unwrap();
        acl.release(va2).unwrap();
        acl.free_physical(h2).unwrap();
        acl.unmap(va).unwrap();
        acl.release(va).unwrap();
        acl.free_physical(h).unwrap();
    }
}
