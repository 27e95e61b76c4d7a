//! Ascend by default, as HIXL does it: with CANN's libraries found through `$ASCEND_HOME_PATH`
//! (here: the ACL/HCCL ABI test double installed as `lib64/libacl_rt.so` and `libhcomm.so`),
//! a compat engine registers `MEM_DEVICE` memory and moves it over HCCL with no hixl option, on
//! the device `aclrtGetDevice` reports on the thread that called `initialize`.
//!
//! One test in this binary: it sets the process environment before any engine or thread runs.

use hixl::compat::{Hixl, MemDesc, TransferOpDesc};
use hixl::testkit::{Rng, fnv1a};
use hixl::{MemType, Status, TransferOp};
use std::ffi::{CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

const LEN: usize = 1 << 20;
const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;

type InitFn = unsafe extern "C" fn(*const c_char) -> c_int;
type SetDeviceFn = unsafe extern "C" fn(i32) -> c_int;
type GetDeviceFn = unsafe extern "C" fn(*mut i32) -> c_int;
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> c_int;
type MemcpyFn = unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int) -> c_int;

/// The double's ACL entry points a CANN program calls itself.
struct Acl {
    init: InitFn,
    set_device: SetDeviceFn,
    get_device: GetDeviceFn,
    malloc: MallocFn,
    memcpy: MemcpyFn,
}

impl Acl {
    fn open(so: &Path) -> Self {
        let path = CString::new(so.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: dlopen of the double built for this test; the handle is leaked (the library
        // stays loaded, as the engines load the same file).
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null(), "dlopen the double");
        let sym = |name: &str| {
            let n = CString::new(name).unwrap();
            // SAFETY: a valid handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, n.as_ptr()) };
            assert!(!p.is_null(), "{name}");
            p
        };
        // SAFETY: each symbol has the signature of CANN's acl_rt.h declaration (aclError is
        // int; aclrtMemMallocPolicy and aclrtMemcpyKind are C enums).
        unsafe {
            Self {
                init: std::mem::transmute::<*mut c_void, InitFn>(sym("aclInit")),
                set_device: std::mem::transmute::<*mut c_void, SetDeviceFn>(sym("aclrtSetDevice")),
                get_device: std::mem::transmute::<*mut c_void, GetDeviceFn>(sym("aclrtGetDevice")),
                malloc: std::mem::transmute::<*mut c_void, MallocFn>(sym("aclrtMalloc")),
                memcpy: std::mem::transmute::<*mut c_void, MemcpyFn>(sym("aclrtMemcpy")),
            }
        }
    }

    /// `aclrtSetDevice(device)` on this thread, as a CANN program does before `Initialize`
    /// (`aclInit` too, harmless where it is not needed).
    fn use_device(&self, device: i32) {
        // SAFETY: NULL is "no config file"; a repeated aclInit returns 100002.
        let rc = unsafe { (self.init)(std::ptr::null()) };
        assert!(rc == 0 || rc == 100_002, "aclInit: {rc}");
        // SAFETY: plain integer argument.
        assert_eq!(unsafe { (self.set_device)(device) }, 0, "aclrtSetDevice");
    }

    fn device(&self) -> Option<i32> {
        let mut d = -1;
        // SAFETY: a valid out-pointer.
        (unsafe { (self.get_device)(&mut d) } == 0).then_some(d)
    }

    /// Device memory holding `data` (the double's device memory is host memory, which hixl
    /// never touches directly: it moves it with HCCL and copies it with aclrtMemcpy).
    fn device_buffer(&self, data: &[u8]) -> usize {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; policy 0 is ACL_MEM_MALLOC_HUGE_FIRST.
        assert_eq!(unsafe { (self.malloc)(&mut p, data.len(), 0) }, 0);
        // SAFETY: `p` holds data.len() bytes; `data` is readable.
        let rc = unsafe {
            (self.memcpy)(
                p,
                data.len(),
                data.as_ptr().cast(),
                data.len(),
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        assert_eq!(rc, 0);
        p as usize
    }

    fn read(&self, addr: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: `addr` is a device buffer of at least `len` bytes from `device_buffer`,
        // which no transfer touches while it is read (the transfers returned).
        let rc = unsafe {
            (self.memcpy)(
                v.as_mut_ptr().cast(),
                len,
                addr as *const c_void,
                len,
                ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        assert_eq!(rc, 0);
        v
    }
}

fn desc(addr: usize, len: usize) -> MemDesc {
    MemDesc {
        addr,
        len,
        local_only: false,
    }
}

/// A CANN install with the double as its libraries: `<root>/lib64/libacl_rt.so` and
/// `libhcomm.so` (a symlink: one object, as CANN's share one runtime).
fn install(root: &Path) -> PathBuf {
    let lib64 = root.join("lib64");
    std::fs::create_dir_all(&lib64).unwrap();
    let built = hixl::testkit::build_ascend_double(&root.join("build")).expect("build the double");
    let acl = lib64.join("libacl_rt.so");
    std::fs::copy(built, &acl).unwrap();
    let hccl = lib64.join("libhcomm.so");
    let _ = std::fs::remove_file(&hccl);
    std::os::unix::fs::symlink("libacl_rt.so", &hccl).unwrap();
    acl
}

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn device_memory_by_default_where_cann_loads() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
        return;
    }
    let root = std::env::temp_dir().join(format!("hixl-cann-{}", std::process::id()));
    let acl_so = install(&root);
    let log = root.join("double.log");
    let dir = root.join("announce");
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: the only test of this binary, before it starts any thread or engine: nothing
    // reads the environment concurrently.
    unsafe {
        std::env::set_var("ASCEND_HOME_PATH", &root);
        std::env::set_var("HIXL_ASCEND_DOUBLE_LOG", &log);
        std::env::set_var("HIXL_ASCEND_DOUBLE_DIR", &dir);
    }
    let acl = Acl::open(&acl_so);

    // the server: device 3 set on its thread before Initialize, as HIXL's examples do
    let server = Hixl::new();
    let seeded = Rng::new(1).bytes(LEN);
    let (sname, sdev) = std::thread::scope(|s| {
        s.spawn(|| {
            acl.use_device(3);
            server
                .initialize("127.0.0.1:0", [("AutoConnect", "0")])
                .unwrap();
            let dev = acl.device_buffer(&seeded);
            // SAFETY: `dev` is device memory of LEN bytes that stays allocated (never freed
            // in this test) and is read only with aclrtMemcpy after transfers returned.
            unsafe { server.register_mem(desc(dev, LEN), MemType::Device) }.unwrap();
            (server.local_engine().unwrap(), dev)
        })
        .join()
        .unwrap()
    });

    // the client, on device 5
    acl.use_device(5);
    let client = Hixl::new();
    client
        .initialize("127.0.0.1", [("AutoConnect", "0")])
        .unwrap();
    let cdev = acl.device_buffer(&vec![0u8; LEN]);
    // SAFETY: as above.
    unsafe { client.register_mem(desc(cdev, LEN), MemType::Device) }.unwrap();
    client.connect(&sname, 5000).unwrap();
    let op = |off: usize, len: usize| TransferOpDesc {
        local_addr: cdev + off,
        remote_addr: sdev + off,
        len,
    };
    client
        .transfer_sync(&sname, TransferOp::Read, &[op(0, LEN)], 5000)
        .unwrap();
    assert_eq!(fnv1a(&acl.read(cdev, LEN)), fnv1a(&seeded));
    let lines = log_lines(&log);
    assert!(
        lines.iter().any(|l| l.starts_with("HcclBatchGet")),
        "the READ did not go over HCCL"
    );
    // each side's communicator names the physical id of the device aclrtGetDevice reported
    // (the double maps logical L to physical L + 10)
    let init = |rank: u32| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("HcclCommInitClusterInfoMemConfig rank={rank} ")))
            .unwrap_or_else(|| panic!("no init of rank {rank}"))
            .clone()
    };
    assert!(init(0).contains("device_ip=phy_13"), "{}", init(0));
    assert!(init(1).contains("device_ip=phy_15"), "{}", init(1));

    // device memory registered while linked is usable at once on the existing link
    let fresh = Rng::new(2).bytes(4096);
    let extra = acl.device_buffer(&fresh);
    // SAFETY: as above.
    unsafe { client.register_mem(desc(extra, 4096), MemType::Device) }.unwrap();
    client
        .transfer_sync(
            &sname,
            TransferOp::Write,
            &[TransferOpDesc {
                local_addr: extra,
                remote_addr: sdev + 8192,
                len: 4096,
            }],
            5000,
        )
        .unwrap();
    assert_eq!(acl.read(sdev + 8192, 4096), fresh);

    // a thread with no device: device 0 (torch_npu's convention), and host memory registered
    // as MEM_DEVICE is accepted, as by HIXL over CANN (CANN's own Python suite expects it)
    let (third, was) = std::thread::scope(|s| {
        s.spawn(|| {
            let was = acl.device();
            let e = Hixl::new();
            e.initialize("127.0.0.1", [("AutoConnect", "0")]).unwrap();
            (e, (was, acl.device()))
        })
        .join()
        .unwrap()
    });
    assert_eq!(was, (None, Some(0)));
    let mut host = vec![0u8; 4096];
    // SAFETY: `host` outlives the engine (finalized below) and is not touched meanwhile.
    let h = unsafe { third.register_mem(desc(host.as_mut_ptr() as usize, 4096), MemType::Device) }
        .unwrap();
    third.deregister_mem(h).unwrap();
    third.finalize();

    // the typed API has the same default; AscendMode::Off turns it off
    let typed = hixl::Hixl::initialize("127.0.0.1", hixl::Options::default()).unwrap();
    assert!(typed.uses_ascend());
    drop(typed);
    let typed = hixl::Hixl::initialize(
        "127.0.0.1",
        hixl::Options::default().ascend_mode(hixl::AscendMode::Off),
    )
    .unwrap();
    assert!(!typed.uses_ascend());
    drop(typed);

    // hixl.ascend.enable=0: host memory only, even where CANN loads
    let off = Hixl::new();
    off.initialize("127.0.0.1", [("hixl.ascend.enable", "0")])
        .unwrap();
    // SAFETY: refused before anything is registered.
    let r = unsafe { off.register_mem(desc(host.as_mut_ptr() as usize, 4096), MemType::Device) };
    assert_eq!(r.unwrap_err().status(), Status::UNSUPPORTED);
    off.finalize();

    // the server deregisters while linked: the device paths binding the region are closed, so
    // the client's next transfer fails instead of reaching the memory, and its Disconnect
    // succeeds once the server is gone
    let h_srv = 1; // the first handle an engine hands out
    server.deregister_mem(h_srv).unwrap();
    let r = client.transfer_sync(&sname, TransferOp::Read, &[op(0, 4096)], 5000);
    assert!(
        r.is_err(),
        "a transfer from a deregistered region succeeded"
    );
    server.finalize();
    client.disconnect(&sname, 1000).unwrap();
    client.finalize();
    let _ = std::fs::remove_dir_all(&root);
}
