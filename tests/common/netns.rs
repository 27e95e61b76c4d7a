//! A network namespace joined to this one by a veth pair (the cut-link and lost-device tests),
//! and a command runner for `ip`.

use std::process::Command;

/// Runs a command; its standard error on failure.
pub fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace joined to this one by a veth pair, removed on drop.
pub struct Netns {
    pub name: String,
    /// The host's end of the pair.
    pub host_if: String,
    /// No UCX test of this binary runs while the pair exists (`super::NET_DEVICES`); dropped
    /// after the pair is removed.
    _devices: std::sync::RwLockWriteGuard<'static, ()>,
}

impl Netns {
    pub fn create(tag: u32) -> Result<(Netns, String, String), String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let name = format!("hixl-t{}-{tag}", std::process::id());
        let (host_if, ns_if) = (
            format!("hx{tag}a{}", std::process::id() % 10000),
            format!("hx{tag}b"),
        );
        let net = format!("10.{}.{}", 200 + tag, std::process::id() % 250);
        let (mine, theirs) = (format!("{net}.1"), format!("{net}.2"));
        // (a test that panicked holding it poisoned nothing it guards)
        let devices = super::NET_DEVICES
            .write()
            .unwrap_or_else(|e| e.into_inner());
        sh(&["ip", "netns", "add", &name])?;
        let ns = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            _devices: devices,
        };
        sh(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ])?;
        sh(&["ip", "link", "set", &ns_if, "netns", &name])?;
        sh(&["ip", "addr", "add", &format!("{mine}/24"), "dev", &host_if])?;
        sh(&["ip", "link", "set", &host_if, "up"])?;
        let inns = |a: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", name.as_str()];
            v.extend_from_slice(a);
            sh(&v)
        };
        inns(&["ip", "addr", "add", &format!("{theirs}/24"), "dev", &ns_if])?;
        inns(&["ip", "link", "set", &ns_if, "up"])?;
        inns(&["ip", "link", "set", "lo", "up"])?;
        Ok((ns, ns_if, theirs))
    }

    pub fn exec(&self, args: &[&str]) -> Result<(), String> {
        let mut v = vec!["ip", "netns", "exec", self.name.as_str()];
        v.extend_from_slice(args);
        sh(&v)
    }

    /// Established TCP connections inside the namespace to `port`.
    pub fn established(&self, port: u16) -> usize {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "ss",
                "-Htn",
                "state",
                "established",
            ])
            .arg(format!("( sport = :{port} )"))
            .output()
            .expect("ss");
        String::from_utf8_lossy(&out.stdout).lines().count()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // the pair is deleted from the host's end first, and the drop waits until the host no
        // longer lists it: deleting only the namespace removes the pair in the background, and a
        // UCX context created in the meantime (the next test binary's) lists the dying device and
        // then fails every worker it creates (UCS_ERR_NO_DEVICE)
        let _ = sh(&["ip", "link", "del", &self.host_if]);
        let _ = sh(&["ip", "netns", "del", &self.name]);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < until
            && Command::new("ip")
                .args(["link", "show", &self.host_if])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        {
            std::thread::yield_now();
        }
    }
}
