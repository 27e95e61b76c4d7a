//! The Ascend tests' helpers: a private copy of the test double with its log and announce
//! directory, two Ascend engines in one process, and reading the double's log.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hixl::{AscendConfig, DeviceBuffer, Hixl, Options};

pub(crate) const T: Duration = Duration::from_secs(10);

/// A private copy of the double (its own globals), its log, and its announce directory.
pub(crate) struct Double {
    pub(crate) so: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) dir: PathBuf,
}

impl Double {
    /// `None` (with the reason printed) when the double cannot be built here.
    pub(crate) fn new(tag: &str) -> Option<Self> {
        if Command::new("cc").arg("--version").output().is_err() {
            eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
            return None;
        }
        let base = std::env::temp_dir().join(format!("hixl-ascend-it-{}", std::process::id()));
        let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
        let so = base.join(format!("{tag}.so"));
        std::fs::copy(&lib, &so).expect("copy the double");
        let log = base.join(format!("{tag}.log"));
        let dir = base.join(format!("{tag}.dir"));
        let _ = std::fs::remove_file(&log);
        std::fs::create_dir_all(&dir).unwrap();
        let d = Self { so, log, dir };
        d.control("log", Some(&d.log.to_string_lossy()));
        d.control("dir", Some(&d.dir.to_string_lossy()));
        d.control("fail", None);
        d.control("device_ip", None);
        Some(d)
    }

    /// Sets one of the double's settings in this process (`hixl_double_control`).
    pub(crate) fn control(&self, key: &str, value: Option<&str>) {
        use std::ffi::{CString, c_char, c_int};
        let path = CString::new(self.so.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: dlopen of our own copy of the double; the handle is kept (leaked) so the
        // library stays loaded, as the engines load it too.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null(), "dlopen the double");
        // SAFETY: a valid handle and a NUL-terminated symbol name.
        let f = unsafe { libc::dlsym(h, c"hixl_double_control".as_ptr()) };
        assert!(!f.is_null());
        // SAFETY: the double defines `int hixl_double_control(const char *, const char *)`.
        let f: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int =
            unsafe { std::mem::transmute(f) };
        let k = CString::new(key).unwrap();
        let v = value.map(|v| CString::new(v).unwrap());
        // SAFETY: NUL-terminated strings alive for the call; NULL unsets.
        let rc = unsafe {
            f(
                k.as_ptr(),
                v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
            )
        };
        assert_eq!(rc, 0, "unknown double setting {key}");
    }

    pub(crate) fn options(&self, device_ip: &str) -> Options {
        self.options_on(0, Some(device_ip))
    }

    /// Options for logical device `device_id`, with or without a device IP.
    pub(crate) fn options_on(&self, device_id: u32, device_ip: Option<&str>) -> Options {
        Options::default().ascend(AscendConfig {
            acl_lib: Some(self.so.clone()),
            hccl_lib: Some(self.so.clone()),
            device_id,
            device_ip: device_ip.map(|ip| ip.parse().unwrap()),
        })
    }

    pub(crate) fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Double {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.so);
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn first(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:#?}"))
}

/// The double's log lines of the calls that start with `prefix` (a call's name and a space), in
/// order.
pub(crate) fn calls<'a>(log: &'a [String], prefix: &str) -> Vec<&'a str> {
    log.iter()
        .filter(|l| l.starts_with(prefix))
        .map(String::as_str)
        .collect()
}

pub(crate) type Pair = (
    Hixl<hixl::Connected>,
    hixl::Region<DeviceBuffer>,
    Hixl<hixl::Connected>,
    u64,
);

/// Two Ascend engines in this process (the double copies between them with memmove).
pub(crate) fn pair(d: &Double, size: usize) -> Pair {
    pair_with(d, size, d.options("10.30.0.1"), d.options("10.30.0.2"))
}

/// [`pair`] with the client's and the server's options.
pub(crate) fn pair_with(
    d: &Double,
    size: usize,
    client_opts: Options,
    server_opts: Options,
) -> Pair {
    let _ = d;
    let server = Hixl::initialize_ephemeral("127.0.0.1", server_opts)
        .unwrap()
        .into_registered();
    let sreg = server
        .with_context(|ctx| {
            let b = server.alloc_device(ctx, size).unwrap();
            server.register_device(ctx, b).unwrap()
        })
        .unwrap();
    let saddr = sreg.addr() as u64;
    std::mem::forget(sreg); // stays registered until the engine is finalized
    let client = Hixl::initialize("127.0.0.1", client_opts)
        .unwrap()
        .into_registered();
    let creg = client
        .with_context(|ctx| {
            let b = client.alloc_device(ctx, size).unwrap();
            client.register_device(ctx, b).unwrap()
        })
        .unwrap();
    (
        client.activate().unwrap(),
        creg,
        server.activate().unwrap(),
        saddr,
    )
}
