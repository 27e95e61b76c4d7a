//! The Ascend backend's options: HIXL's keys with their documented ranges, and hixl's own
//! `hixl.ascend.*` keys.
//!
//! Ranges follow HIXL's docs (hicann/hixl `docs/zh/api/cpp/HIXL-interface.md`) and parsers
//! (`hixl_options.cc`, `adxl_inner_engine.cc`).
//! JSON values are parsed with `serde_json` (strict RFC 8259), duplicate keys refused.

// Test helpers (`cfg(test)`): `validate` and `from_pairs` (the engine parses through
// `AscendOptions::set`) and the `BufferPool` helpers (no staging pool yet).

use std::net::IpAddr;
use std::path::PathBuf;

mod comm_res;
mod json;
mod resource_config;

use self::comm_res::parse_local_comm_res;
use self::resource_config::parse_global_resource_config;
use crate::error::Error;

/// The keys this module validates (the `adxl.` synonyms of `RdmaTrafficClass`,
/// `RdmaServiceLevel`, `BufferPool` and `LocalCommRes` are accepted too).
pub(crate) const ASCEND_KEYS: &[&str] = &[
    "EnableUseFabricMem",
    "RdmaTrafficClass",
    "RdmaServiceLevel",
    "BufferPool",
    "LocalCommRes",
    "GlobalResourceConfig",
    "hixl.ascend.acl_lib",
    "hixl.ascend.hccl_lib",
    "hixl.ascend.device_id",
    "hixl.ascend.device_ip",
    "hixl.ascend.require_device",
];

/// Where NPU RoCE addresses are configured (`address_<phy_id>=<ip>` and
/// `IPv6address_<phy_id>=<ip>` lines).
pub(crate) const HCCN_CONF: &str = "/etc/hccn.conf";

/// Largest `LocalCommRes` HIXL accepts (`kMaxCommResSizeInBytes`, 64 KiB).
pub(crate) const MAX_COMM_RES_BYTES: usize = 64 * 1024;

/// The canonical form of `key`: `adxl.X` → `X` for HIXL's four synonyms.
pub(crate) fn canonical_key(key: &str) -> &str {
    match key.strip_prefix("adxl.") {
        Some(k @ ("RdmaTrafficClass" | "RdmaServiceLevel" | "BufferPool" | "LocalCommRes")) => k,
        _ => key,
    }
}

/// Whether `key` (or its `adxl.` synonym) is one of [`ASCEND_KEYS`].
pub(crate) fn is_ascend_key(key: &str) -> bool {
    ASCEND_KEYS.contains(&canonical_key(key))
}

/// Checks one option.
///
/// # Errors
/// [`Error::UnknownOption`] for a key that is not an Ascend key; [`Error::InvalidOption`]
/// (`PARAM_INVALID`) for a value outside its documented range or format.
#[cfg(test)]
pub(crate) fn validate(key: &str, value: &str) -> Result<(), Error> {
    AscendOptions::default().set(key, value)
}

/// The staging pool (`BufferPool`, `"<num>:<size_MB>"`; `"0:0"` turns it off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferPool {
    /// Buffers per pool.
    pub(crate) count: u64,
    /// Size of each buffer in MiB.
    pub(crate) size_mb: u64,
}

impl Default for BufferPool {
    /// HIXL's default, `"4:8"`.
    fn default() -> Self {
        Self {
            count: 4,
            size_mb: 8,
        }
    }
}

impl BufferPool {
    /// The pool is off (`"0:0"`).
    pub(crate) const OFF: Self = Self {
        count: 0,
        size_mb: 0,
    };

    /// Whether staging is on.
    #[cfg(test)]
    pub(crate) fn enabled(self) -> bool {
        self.count > 0
    }

    /// Bytes of one pool (HIXL allocates two).
    #[cfg(test)]
    pub(crate) fn pool_bytes(self) -> u64 {
        self.count * self.size_mb * (1 << 20)
    }
}

/// A non-empty `LocalCommRes`: the JSON and its version (`"1.0"`, `"1.2"` or `"1.3"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalCommRes {
    /// `version`.
    pub(crate) version: String,
    /// The JSON as given.
    pub(crate) json: String,
}

/// `GlobalResourceConfig`, parsed. Every field is optional; HIXL's defaults apply when unset.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct GlobalResourceConfig {
    /// `fabric_memory.max_capacity` (TB, (0, 1024]).
    pub(crate) fabric_max_capacity: Option<u64>,
    /// `fabric_memory.start_address` (TB, [0, 1024]).
    pub(crate) fabric_start_address: Option<u64>,
    /// `fabric_memory.task_stream_num` ([1, 8]; only 1 while AICPU unfolding is on).
    pub(crate) fabric_task_stream_num: Option<u64>,
    /// `fabric_memory.enable_aicpu_unfold` (JSON boolean, default true).
    pub(crate) fabric_enable_aicpu_unfold: Option<bool>,
    /// `connect_pool.thread_num` ([1, 64]).
    pub(crate) connect_pool_thread_num: Option<u64>,
    /// `connect_pool.task_queue_capacity` ([1, 65535]).
    pub(crate) connect_pool_task_queue_capacity: Option<u64>,
    /// `comm_resource_config.listen_port` ([1, 65535]; device NIC port, default 16666).
    pub(crate) listen_port: Option<u64>,
    /// `comm_resource_config.max_active_channels` ([1, 8192]).
    pub(crate) max_active_channels: Option<u64>,
    /// `comm_resource_config.qos` ([0, 7]).
    pub(crate) qos: Option<u64>,
    /// `comm_resource_config.protocol_desc` (`"roce:device"`, `"hccs:device"`, ...).
    pub(crate) protocol_desc: Vec<String>,
    /// `comm_resource_config.multi_channel.num_workers` ([1, 16]).
    pub(crate) multi_channel_num_workers: Option<u64>,
    /// `comm_resource_config.multi_channel.split_batch_size` ([1, 4294967295]).
    pub(crate) multi_channel_split_batch_size: Option<u64>,
    /// `transfer_config.max_transfer_count_per_batch` ([1, 32766]).
    pub(crate) max_transfer_count_per_batch: Option<u64>,
    /// `local_comm_res_path`.
    pub(crate) local_comm_res_path: Option<String>,
    /// `topo_file_path`.
    pub(crate) topo_file_path: Option<String>,
    /// `channel_pool.max_channel` ((0, 512]; only with both waterlines).
    pub(crate) channel_pool_max_channel: Option<u64>,
    /// `channel_pool.high_waterline` ((0, 1)).
    pub(crate) channel_pool_high_waterline: Option<f64>,
    /// `channel_pool.low_waterline` ((0, 1), below the high one).
    pub(crate) channel_pool_low_waterline: Option<f64>,
}

/// The Ascend backend's options, parsed.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct AscendOptions {
    /// `EnableUseFabricMem`.
    pub(crate) enable_fabric_mem: bool,
    /// `RdmaTrafficClass` (0–255, a multiple of 4).
    pub(crate) rdma_traffic_class: Option<u32>,
    /// `RdmaServiceLevel` (0–7).
    pub(crate) rdma_service_level: Option<u32>,
    /// `BufferPool` (default `"4:8"`).
    pub(crate) buffer_pool: BufferPool,
    /// `LocalCommRes`; `None` when unset or empty (generated).
    pub(crate) local_comm_res: Option<LocalCommRes>,
    /// `GlobalResourceConfig`.
    pub(crate) global_resource_config: Option<GlobalResourceConfig>,
    /// `hixl.ascend.acl_lib`: the ACL runtime to load.
    pub(crate) acl_lib: Option<PathBuf>,
    /// `hixl.ascend.hccl_lib`: the HCCL library to load.
    pub(crate) hccl_lib: Option<PathBuf>,
    /// `hixl.ascend.device_id`: the logical device (`aclrtSetDevice`).
    pub(crate) device_id: Option<u32>,
    /// `hixl.ascend.device_ip`: the device's RoCE address (else read from `/etc/hccn.conf`).
    pub(crate) device_ip: Option<IpAddr>,
    /// `hixl.ascend.require_device` `"1"`: without `device_id`, the device `aclrtGetDevice`
    /// reports or its error (HIXL's ADXL and HIXL-CS), never device 0 in its place.
    pub(crate) require_device: bool,
}

/// A decimal integer of at most 20 ASCII digits (no sign, no spaces).
pub(super) fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl AscendOptions {
    /// Parses every pair; later pairs override earlier ones.
    ///
    /// # Errors
    /// As [`validate`].
    #[cfg(test)]
    pub(crate) fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, Error> {
        let mut o = Self::default();
        for (k, v) in pairs {
            o.set(k.as_ref(), v.as_ref())?;
        }
        Ok(o)
    }

    /// Sets one option.
    ///
    /// # Errors
    /// [`Error::UnknownOption`] for a key that is not an Ascend key; [`Error::InvalidOption`]
    /// (`PARAM_INVALID`) for a value outside its documented range or format.
    pub(crate) fn set(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let bad = |problem: &'static str| Error::InvalidOption {
            key: key.to_owned(),
            value: value.to_owned(),
            problem,
        };
        match canonical_key(key) {
            "EnableUseFabricMem" => {
                self.enable_fabric_mem = match value {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad("\"0\" or \"1\"")),
                }
            }
            "RdmaTrafficClass" => match digits(value) {
                Some(tc) if tc <= 255 && tc % 4 == 0 => self.rdma_traffic_class = Some(tc as u32),
                _ => return Err(bad("an integer in 0..=255 and a multiple of 4")),
            },
            "RdmaServiceLevel" => match digits(value) {
                Some(sl) if sl <= 7 => self.rdma_service_level = Some(sl as u32),
                _ => return Err(bad("an integer in 0..=7")),
            },
            "BufferPool" => self.buffer_pool = parse_buffer_pool(value).map_err(bad)?,
            "LocalCommRes" => self.local_comm_res = parse_local_comm_res(value).map_err(bad)?,
            "GlobalResourceConfig" => {
                self.global_resource_config =
                    Some(parse_global_resource_config(value).map_err(bad)?)
            }
            "hixl.ascend.acl_lib" | "hixl.ascend.hccl_lib" => {
                if value.is_empty() || value.contains('\0') {
                    return Err(bad("a library path or soname (non-empty, no NUL)"));
                }
                let p = Some(PathBuf::from(value));
                if key.ends_with("acl_lib") {
                    self.acl_lib = p;
                } else {
                    self.hccl_lib = p;
                }
            }
            "hixl.ascend.device_id" => match digits(value).and_then(|d| u32::try_from(d).ok()) {
                Some(d) => self.device_id = Some(d),
                None => return Err(bad("a device id (an unsigned 32-bit integer)")),
            },
            "hixl.ascend.require_device" => {
                self.require_device = match value {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad("\"0\" or \"1\"")),
                }
            }
            "hixl.ascend.device_ip" => match value.parse::<IpAddr>() {
                Ok(ip) => self.device_ip = Some(ip),
                Err(_) => return Err(bad("an IPv4 or IPv6 address (no brackets, no port)")),
            },
            _ => {
                return Err(Error::UnknownOption {
                    key: key.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// The device's RoCE address: `hixl.ascend.device_ip`, else `address_<phy_id>`, else
    /// `IPv6address_<phy_id>` from `/etc/hccn.conf` (HIXL's `GetDeviceIp`; `phy_id` is the
    /// physical device id); `None` when none is configured.
    pub(crate) fn resolve_device_ip(&self, phy_id: u32) -> Option<IpAddr> {
        self.device_ip.or_else(|| {
            let text = std::fs::read_to_string(HCCN_CONF).ok()?;
            device_ip_from_hccn(&text, phy_id)
        })
    }
}

/// The address of device `phy_id` in the text of `/etc/hccn.conf`: the first line
/// `address_<phy_id>=<ip>` whose value is an IPv4 or IPv6 address, else the first such
/// `IPv6address_<phy_id>=<ip>` line (spaces around key and value allowed; `#` comments skipped).
pub(crate) fn device_ip_from_hccn(conf_text: &str, phy_id: u32) -> Option<IpAddr> {
    let find = |want: String| {
        conf_text.lines().find_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            if k.trim() != want {
                return None;
            }
            v.trim().parse().ok()
        })
    };
    find(format!("address_{phy_id}")).or_else(|| find(format!("IPv6address_{phy_id}")))
}

fn parse_buffer_pool(value: &str) -> Result<BufferPool, &'static str> {
    const FORMAT: &str = "\"<num>:<size_MB>\" with both positive (and num*size MiB fitting in 64 bits), or \"0:0\" to turn it off";
    if value == "0:0" {
        return Ok(BufferPool::OFF);
    }
    let (n, s) = value.split_once(':').ok_or(FORMAT)?;
    let (Some(count), Some(size_mb)) = (digits(n), digits(s)) else {
        return Err(FORMAT);
    };
    if count == 0 || size_mb == 0 {
        return Err(FORMAT);
    }
    count
        .checked_mul(size_mb)
        .and_then(|m| m.checked_mul(1 << 20))
        .ok_or(FORMAT)?;
    Ok(BufferPool { count, size_mb })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    pub(super) fn ok(k: &str, v: &str) {
        if let Err(e) = validate(k, v) {
            panic!("{k}={v:?} refused: {e}");
        }
    }

    pub(super) fn bad(k: &str, v: &str) {
        match validate(k, v) {
            Err(e @ Error::InvalidOption { .. }) => assert_eq!(e.status(), Status::PARAM_INVALID),
            other => panic!("{k}={v:?}: expected InvalidOption, got {other:?}"),
        }
    }

    #[test]
    fn fabric_mem() {
        ok("EnableUseFabricMem", "0");
        ok("EnableUseFabricMem", "1");
        for v in ["", "2", "true", " 1", "01"] {
            bad("EnableUseFabricMem", v);
        }
        let o = AscendOptions::from_pairs([("EnableUseFabricMem", "1")]).unwrap();
        assert!(o.enable_fabric_mem);
    }

    #[test]
    fn traffic_class_and_service_level() {
        for v in ["0", "4", "132", "252"] {
            ok("RdmaTrafficClass", v);
            ok("adxl.RdmaTrafficClass", v);
        }
        for v in [
            "",
            "256",
            "130",
            "-4",
            "+4",
            "4.0",
            "0x84",
            "1000000000000000000000",
        ] {
            bad("RdmaTrafficClass", v);
        }
        for v in ["0", "4", "7"] {
            ok("RdmaServiceLevel", v);
            ok("adxl.RdmaServiceLevel", v);
        }
        for v in ["", "8", "-1", "seven", " 4"] {
            bad("RdmaServiceLevel", v);
        }
        let o = AscendOptions::from_pairs([
            ("RdmaTrafficClass", "252"),
            ("adxl.RdmaServiceLevel", "7"),
        ])
        .unwrap();
        assert_eq!(
            (o.rdma_traffic_class, o.rdma_service_level),
            (Some(252), Some(7))
        );
    }

    #[test]
    fn buffer_pool() {
        for v in ["0:0", "4:8", "1:1"] {
            ok("BufferPool", v);
            ok("adxl.BufferPool", v);
        }
        ok("BufferPool", "1:17592186044415"); // (2^44 - 1) MiB still fits in 64 bits
        for v in [
            "",
            "4",
            "4:",
            ":8",
            "0:8",
            "4:0",
            "00:0",
            "4:8:1",
            "a:b",
            "-1:8",
            "4 :8",
            "1:17592186044416",
        ] {
            bad("BufferPool", v);
        }
        let o = AscendOptions::default();
        assert_eq!(o.buffer_pool, BufferPool::default());
        assert_eq!(o.buffer_pool.pool_bytes(), 32 << 20);
        let o = AscendOptions::from_pairs([("BufferPool", "0:0")]).unwrap();
        assert!(!o.buffer_pool.enabled());
    }

    #[test]
    fn hixl_ascend_keys() {
        ok(
            "hixl.ascend.acl_lib",
            "/usr/local/Ascend/cann/lib64/libacl_rt.so",
        );
        ok("hixl.ascend.hccl_lib", "libhcomm.so");
        bad("hixl.ascend.acl_lib", "");
        bad("hixl.ascend.hccl_lib", "a\0b");
        for v in ["0", "7", "4294967295"] {
            ok("hixl.ascend.device_id", v);
        }
        for v in ["", "-1", "4294967296", "x", "+1", " 1"] {
            bad("hixl.ascend.device_id", v);
        }
        for v in ["192.168.100.101", "0.0.0.0", "fe80::1", "2001:db8::8"] {
            ok("hixl.ascend.device_ip", v);
        }
        for v in [
            "",
            "192.168.100",
            "[fe80::1]",
            "10.0.0.1:16666",
            "npu0",
            "256.1.1.1",
        ] {
            bad("hixl.ascend.device_ip", v);
        }
        let o = AscendOptions::from_pairs([
            ("hixl.ascend.acl_lib", "/x/libacl_rt.so"),
            ("hixl.ascend.hccl_lib", "/x/libhcomm.so"),
            ("hixl.ascend.device_id", "3"),
            ("hixl.ascend.device_ip", "10.1.2.3"),
        ])
        .unwrap();
        assert_eq!(
            o.acl_lib.as_deref(),
            Some(std::path::Path::new("/x/libacl_rt.so"))
        );
        assert_eq!(
            o.hccl_lib.as_deref(),
            Some(std::path::Path::new("/x/libhcomm.so"))
        );
        assert_eq!(o.device_id, Some(3));
        assert_eq!(o.resolve_device_ip(3), Some("10.1.2.3".parse().unwrap()));
    }

    #[test]
    fn unknown_keys_and_synonyms() {
        let e = validate("AutoConnect", "0").unwrap_err();
        assert!(matches!(e, Error::UnknownOption { ref key } if key == "AutoConnect"));
        assert_eq!(e.status(), Status::PARAM_INVALID);
        assert!(matches!(
            validate("adxl.EnableUseFabricMem", "0"),
            Err(Error::UnknownOption { .. })
        ));
        assert!(is_ascend_key("adxl.BufferPool"));
        assert!(is_ascend_key("hixl.ascend.device_ip"));
        assert!(!is_ascend_key("hixl.MaxLanes"));
        assert_eq!(canonical_key("adxl.LocalCommRes"), "LocalCommRes");
        assert_eq!(
            canonical_key("adxl.GlobalResourceConfig"),
            "adxl.GlobalResourceConfig"
        );
    }

    #[test]
    fn device_ip_from_hccn_conf() {
        let conf = "\
# generated by hccn_tool
address_0=192.168.100.101
netmask_0=255.255.255.0
address_1 = 192.168.100.102
address_10=192.168.100.110
address_2=garbage
address_2=192.168.100.103
address_3=fe80::3
";
        // (text, physical id, expected address)
        let v6 = "address_0=192.168.100.101\nIPv6address_0=fd00::100\nIPv6address_1=fd00::101\n";
        let cases = [
            (conf, 0, Some("192.168.100.101")),
            (conf, 1, Some("192.168.100.102")),
            (conf, 10, Some("192.168.100.110")),
            (conf, 2, Some("192.168.100.103")),
            (conf, 3, Some("fe80::3")),
            (conf, 4, None),
            // HIXL's fallback: IPv6address_<physical id> when there is no address_<physical
            // id>; address_ first
            (v6, 0, Some("192.168.100.101")),
            (v6, 1, Some("fd00::101")),
            (v6, 2, None),
            ("#address_0=1.2.3.4\n", 0, None),
            ("", 0, None),
        ];
        for (text, phy, want) in cases {
            let want: Option<IpAddr> = want.map(|w| w.parse().unwrap());
            assert_eq!(device_ip_from_hccn(text, phy), want, "{text:?} {phy}");
        }
    }
}
