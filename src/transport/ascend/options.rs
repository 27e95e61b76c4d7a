//! The Ascend backend's options: HIXL's keys with their documented ranges, and hixl's own
//! `hixl.ascend.*` keys.
//!
//! Ranges follow HIXL's docs (hicann/hixl `docs/zh/api/cpp/HIXL-interface.md`) and parsers
//! (`hixl_options.cc`, `adxl_inner_engine.cc`).
//! JSON values are parsed with `serde_json` (strict RFC 8259), duplicate keys refused.

// Used only by the unit tests yet, each marked `cfg_attr(not(test), allow(dead_code))`: `validate`
// and `from_pairs` (the engine parses through `AscendOptions::set`) and the `BufferPool` helpers
// (no staging pool yet).

use std::net::IpAddr;
use std::path::PathBuf;

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
#[cfg_attr(not(test), allow(dead_code))]
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
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn enabled(self) -> bool {
        self.count > 0
    }

    /// Bytes of one pool (HIXL allocates two).
    #[cfg_attr(not(test), allow(dead_code))]
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
}

fn digits(s: &str) -> Option<u64> {
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
    #[cfg_attr(not(test), allow(dead_code))]
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
    /// As [`validate`].
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

// ---------------------------------------------------------------------------------------------
// LocalCommRes
// ---------------------------------------------------------------------------------------------

fn parse_local_comm_res(value: &str) -> Result<Option<LocalCommRes>, &'static str> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    if value.len() > MAX_COMM_RES_BYTES {
        return Err("at most 64 KiB of JSON");
    }
    let json = parse_json(value)?;
    let obj = json.as_object().ok_or("a JSON object")?;
    let version = match get(obj, "version") {
        Some(Json::Str(v)) => v.clone(),
        _ => return Err("a JSON object with a \"version\" string"),
    };
    match version.as_str() {
        "1.3" => check_comm_res_v13(obj)?,
        "1.0" | "1.2" => check_rank_table(obj)?,
        _ => return Err("\"version\" must be \"1.0\", \"1.2\" or \"1.3\""),
    }
    Ok(Some(LocalCommRes {
        version,
        json: value.to_owned(),
    }))
}

fn check_comm_res_v13(obj: &[(String, Json)]) -> Result<(), &'static str> {
    for (k, v) in obj {
        match (k.as_str(), v) {
            ("version", _) => {}
            ("net_instance_id" | "server_id", Json::Str(s)) if !s.is_empty() => {}
            ("net_instance_id" | "server_id", _) => {
                return Err("version 1.3: net_instance_id and server_id are non-empty strings");
            }
            ("endpoint_list", Json::Arr(list)) => {
                for ep in list {
                    check_endpoint(ep)?;
                }
            }
            ("endpoint_list", _) => return Err("version 1.3: endpoint_list is an array"),
            _ => {
                return Err(
                    "version 1.3 allows only version, net_instance_id, server_id and endpoint_list",
                );
            }
        }
    }
    Ok(())
}

fn check_endpoint(ep: &Json) -> Result<(), &'static str> {
    const FIELDS: &str = "endpoint_list[]: {protocol: roce|ub_ctp|uboe|ub_rtp, comm_id, placement: host|device, plane?, dst_eid?}";
    let obj = ep.as_object().ok_or(FIELDS)?;
    let mut protocol = None;
    let mut comm_id = None;
    let mut placement = false;
    for (k, v) in obj {
        let Json::Str(s) = v else { return Err(FIELDS) };
        match k.as_str() {
            "protocol" if matches!(s.as_str(), "roce" | "ub_ctp" | "uboe" | "ub_rtp") => {
                protocol = Some(s.as_str());
            }
            "comm_id" if !s.is_empty() => comm_id = Some(s.as_str()),
            "placement" if matches!(s.as_str(), "host" | "device") => placement = true,
            "plane" | "dst_eid" if !s.is_empty() => {}
            _ => return Err(FIELDS),
        }
    }
    let (Some(protocol), Some(comm_id), true) = (protocol, comm_id, placement) else {
        return Err(FIELDS);
    };
    let ok = match protocol {
        "roce" | "uboe" => comm_id.parse::<IpAddr>().is_ok(),
        _ => comm_id.bytes().all(|b| b.is_ascii_hexdigit()),
    };
    if ok {
        Ok(())
    } else {
        Err("endpoint_list[].comm_id: an IP address for roce/uboe, a hex EID for ub_ctp/ub_rtp")
    }
}

fn check_rank_table(obj: &[(String, Json)]) -> Result<(), &'static str> {
    const SERVERS: &str = "rank table: server_list is an array of {server_id: string, device: [one {device_id: digits, device_ip?: IP, device_port?: 1..=65535}]}";
    let Some(list) = get(obj, "server_list") else {
        return Ok(());
    };
    let servers = list.as_array().ok_or(SERVERS)?;
    for server in servers {
        let s = server.as_object().ok_or(SERVERS)?;
        if !matches!(get(s, "server_id"), Some(Json::Str(_))) {
            return Err(SERVERS);
        }
        let devices = get(s, "device").and_then(Json::as_array).ok_or(SERVERS)?;
        if devices.len() != 1 {
            return Err("rank table: exactly one device per server (the one this engine uses)");
        }
        let d = devices[0].as_object().ok_or(SERVERS)?;
        match get(d, "device_id") {
            Some(Json::Str(id)) if digits(id).is_some() => {}
            _ => return Err(SERVERS),
        }
        match get(d, "device_ip") {
            None => {}
            Some(Json::Str(ip)) if ip.parse::<IpAddr>().is_ok() => {}
            _ => return Err(SERVERS),
        }
        match get(d, "device_port") {
            None => {}
            Some(Json::Str(p)) if digits(p).is_some_and(|p| (1..=65535).contains(&p)) => {}
            _ => return Err(SERVERS),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// GlobalResourceConfig
// ---------------------------------------------------------------------------------------------

/// An integer given as a JSON number without fraction/exponent or as a string of digits.
fn json_uint(v: &Json) -> Option<u64> {
    match v {
        Json::Num(n) | Json::Str(n) => digits(n),
        _ => None,
    }
}

fn json_ratio(v: &Json) -> Option<f64> {
    let s = match v {
        Json::Num(n) | Json::Str(n) => n,
        _ => return None,
    };
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    s.parse::<f64>().ok().filter(|r| *r > 0.0 && *r < 1.0)
}

const PROTOCOLS: &[&str] = &[
    "ub_ctp",
    "roce:device",
    "hccs:device",
    "ub_ctp:device",
    "ub_ctp:host",
    "uboe:device",
    "ub_rtp:device",
    "roce:host",
    "ubmem",
];

fn parse_global_resource_config(value: &str) -> Result<GlobalResourceConfig, &'static str> {
    if value.trim().is_empty() {
        return Ok(GlobalResourceConfig::default());
    }
    let json = parse_json(value)?;
    let top = json.as_object().ok_or("a JSON object")?;
    // `{"fabric_memory": {"max_capacity": ...}}` is the same as `{"fabric_memory.max_capacity": ...}`.
    let mut flat: Vec<(String, &Json)> = Vec::new();
    for (k, v) in top {
        match v {
            Json::Obj(inner) if !k.contains('.') => {
                flat.extend(inner.iter().map(|(ik, iv)| (format!("{k}.{ik}"), iv)));
            }
            _ => flat.push((k.clone(), v)),
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for (k, _) in &flat {
        if seen.contains(&k.as_str()) {
            return Err("a field is given twice (nested and dotted)");
        }
        seen.push(k);
    }
    let mut c = GlobalResourceConfig::default();
    for (k, v) in &flat {
        let uint = |lo: u64, hi: u64, msg: &'static str| -> Result<Option<u64>, &'static str> {
            match json_uint(v) {
                Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                _ => Err(msg),
            }
        };
        match k.as_str() {
            "fabric_memory.max_capacity" => {
                c.fabric_max_capacity = uint(
                    1,
                    1024,
                    "fabric_memory.max_capacity: an integer in (0, 1024] (TB)",
                )?
            }
            "fabric_memory.start_address" => {
                c.fabric_start_address = uint(
                    0,
                    1024,
                    "fabric_memory.start_address: an integer in [0, 1024] (TB)",
                )?
            }
            "fabric_memory.task_stream_num" => {
                c.fabric_task_stream_num =
                    uint(1, 8, "fabric_memory.task_stream_num: an integer in [1, 8]")?
            }
            "fabric_memory.enable_aicpu_unfold" => match v {
                Json::Bool(b) => c.fabric_enable_aicpu_unfold = Some(*b),
                _ => return Err("fabric_memory.enable_aicpu_unfold: a JSON boolean"),
            },
            "connect_pool.thread_num" => {
                c.connect_pool_thread_num =
                    uint(1, 64, "connect_pool.thread_num: an integer in [1, 64]")?
            }
            "connect_pool.task_queue_capacity" => {
                c.connect_pool_task_queue_capacity = uint(
                    1,
                    65535,
                    "connect_pool.task_queue_capacity: an integer in [1, 65535]",
                )?
            }
            "comm_resource_config.listen_port" => {
                c.listen_port = uint(
                    1,
                    65535,
                    "comm_resource_config.listen_port: an integer in [1, 65535]",
                )?
            }
            "comm_resource_config.max_active_channels" => {
                c.max_active_channels = uint(
                    1,
                    8192,
                    "comm_resource_config.max_active_channels: an integer in [1, 8192]",
                )?
            }
            "comm_resource_config.qos" => {
                c.qos = uint(0, 7, "comm_resource_config.qos: an integer in [0, 7]")?
            }
            "comm_resource_config.multi_channel.num_workers" => {
                c.multi_channel_num_workers = uint(
                    1,
                    16,
                    "comm_resource_config.multi_channel.num_workers: an integer in [1, 16]",
                )?
            }
            "comm_resource_config.multi_channel.split_batch_size" => {
                c.multi_channel_split_batch_size = uint(
                    1,
                    u64::from(u32::MAX),
                    "comm_resource_config.multi_channel.split_batch_size: an integer in [1, 4294967295]",
                )?
            }
            "comm_resource_config.protocol_desc" => {
                const MSG: &str = "comm_resource_config.protocol_desc: one or an array of \"roce:device\", \"roce:host\", \"hccs:device\", \"ub_ctp\", \"ub_ctp:device\", \"ub_ctp:host\", \"uboe:device\", \"ub_rtp:device\", \"ubmem\"";
                let items: Vec<&Json> = match v {
                    Json::Arr(a) if !a.is_empty() => a.iter().collect(),
                    Json::Str(_) => vec![*v],
                    _ => return Err(MSG),
                };
                for item in items {
                    match item {
                        Json::Str(s) if PROTOCOLS.contains(&s.as_str()) => {
                            c.protocol_desc.push(s.clone())
                        }
                        _ => return Err(MSG),
                    }
                }
            }
            "transfer_config.max_transfer_count_per_batch" => {
                c.max_transfer_count_per_batch = uint(
                    1,
                    32766,
                    "transfer_config.max_transfer_count_per_batch: an integer in [1, 32766]",
                )?
            }
            "local_comm_res_path" | "topo_file_path" => match v {
                Json::Str(s) if !s.contains('\0') => {
                    let s = (!s.is_empty()).then(|| s.clone());
                    if k == "topo_file_path" {
                        c.topo_file_path = s;
                    } else {
                        c.local_comm_res_path = s;
                    }
                }
                _ => return Err("local_comm_res_path / topo_file_path: a path string"),
            },
            "channel_pool.max_channel" => {
                c.channel_pool_max_channel =
                    uint(1, 512, "channel_pool.max_channel: an integer in (0, 512]")?
            }
            "channel_pool.high_waterline" | "channel_pool.low_waterline" => {
                let r = json_ratio(v).ok_or("channel_pool waterlines: decimals in (0, 1)")?;
                if k.ends_with("high_waterline") {
                    c.channel_pool_high_waterline = Some(r);
                } else {
                    c.channel_pool_low_waterline = Some(r);
                }
            }
            _ => return Err("an unknown field (see HIXL's GlobalResourceConfig field list)"),
        }
    }
    // cross-field rules (hixl_options.cc, adxl_inner_engine.cc)
    if c.fabric_task_stream_num.is_some_and(|n| n != 1)
        && c.fabric_enable_aicpu_unfold != Some(false)
    {
        return Err(
            "fabric_memory.task_stream_num above 1 needs fabric_memory.enable_aicpu_unfold: false",
        );
    }
    match (c.channel_pool_high_waterline, c.channel_pool_low_waterline) {
        (Some(high), Some(low)) => {
            let max = c.channel_pool_max_channel.unwrap_or(512) as f64;
            let mark = |r: f64| ((max * r) as u64).max(1);
            if mark(high) < mark(low) + 1 {
                return Err(
                    "channel_pool: the high waterline's channel count must exceed the low one's by at least 1",
                );
            }
        }
        (None, None) if c.channel_pool_max_channel.is_some() => {
            return Err("channel_pool.max_channel needs both waterlines");
        }
        (None, None) => {}
        _ => return Err("channel_pool.high_waterline and channel_pool.low_waterline go together"),
    }
    Ok(c)
}

// ---------------------------------------------------------------------------------------------
// JSON (serde_json, with duplicate keys refused and depth ≤ 64)
// ---------------------------------------------------------------------------------------------

/// A parsed JSON value, object members in order. Integers keep their decimal text; other
/// numbers are written with a fraction or exponent (`1.5`, `1000.0`, `1e21`), so they are never
/// taken for integers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as text.
    Num(String),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, in order.
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn as_object(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Obj(o) => Some(o),
            _ => None,
        }
    }
    fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(a) => Some(a),
            _ => None,
        }
    }
}

fn get<'a>(obj: &'a [(String, Json)], key: &str) -> Option<&'a Json> {
    obj.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

const MALFORMED: &str = "well-formed JSON";
const TOO_DEEP: &str = "JSON nested at most 64 levels deep";
const DUPLICATE: &str = "JSON without duplicate keys";
const MAX_DEPTH: usize = 64;

/// Parses a complete JSON text with `serde_json` (RFC 8259: no comments, no trailing commas,
/// no lone surrogates, nothing after the value).
///
/// # Errors
/// A short description for malformed input, duplicate keys or nesting beyond 64 levels.
pub(crate) fn parse_json(text: &str) -> Result<Json, &'static str> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Seed { depth: 0 }.deserialize(&mut de).map_err(|e| {
        let e = e.to_string();
        if e.starts_with(TOO_DEEP) {
            TOO_DEEP
        } else if e.starts_with(DUPLICATE) {
            DUPLICATE
        } else {
            MALFORMED
        }
    })?;
    de.end().map_err(|_| MALFORMED)?;
    Ok(v)
}

/// Builds a [`Json`] at nesting depth `depth`.
struct Seed {
    depth: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for Seed {
    type Value = Json;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Seed {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Num(n.to_string()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Num(n.to_string()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Json, E> {
        Ok(Json::Num(format!("{n:?}")))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::Str(s))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(serde::de::Error::custom(TOO_DEEP));
        }
        let mut v = Vec::new();
        while let Some(x) = a.next_element_seed(Seed {
            depth: self.depth + 1,
        })? {
            v.push(x);
        }
        Ok(Json::Arr(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(serde::de::Error::custom(TOO_DEEP));
        }
        let mut o: Vec<(String, Json)> = Vec::new();
        while let Some(k) = a.next_key::<String>()? {
            if o.iter().any(|(seen, _)| *seen == k) {
                return Err(serde::de::Error::custom(DUPLICATE));
            }
            let v = a.next_value_seed(Seed {
                depth: self.depth + 1,
            })?;
            o.push((k, v));
        }
        Ok(Json::Obj(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    fn ok(k: &str, v: &str) {
        if let Err(e) = validate(k, v) {
            panic!("{k}={v:?} refused: {e}");
        }
    }

    fn bad(k: &str, v: &str) {
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
    fn local_comm_res() {
        for v in [
            "",
            "  ",
            r#"{"version":"1.3"}"#,
            r#"{"version":"1.2"}"#,
            r#"{"version":"1.0","server_count":"1","server_list":[{"server_id":"10.0.0.1","device":[{"device_id":"0","device_ip":"192.168.1.8","device_port":"16666"}]}],"status":"completed"}"#,
            r#"{"version":"1.3","net_instance_id":"superpod1_1","endpoint_list":[{"protocol":"roce","comm_id":"10.10.10.1","placement":"device"}]}"#,
            r#"{"version":"1.3","net_instance_id":"sp","server_id":"server_0","endpoint_list":[{"protocol":"ub_ctp","comm_id":"00000000007f020000100000df149001","placement":"host","dst_eid":"00000000007f030000100000df141c01","plane":"plane-a"}]}"#,
            r#"{"version":"1.3","endpoint_list":[{"protocol":"uboe","comm_id":"fe80::1","placement":"device"}]}"#,
        ] {
            ok("LocalCommRes", v);
            ok("adxl.LocalCommRes", v);
        }
        for v in [
            "version",
            "{}",
            "[]",
            r#"{"version":1.3}"#,
            r#"{"version":"2.0"}"#,
            r#"{"version":"1.3",}"#,
            r#"{"version":"1.3","version":"1.3"}"#,
            r#"{"version":"1.3","extra":1}"#,
            r#"{"version":"1.3","endpoint_list":{}}"#,
            r#"{"version":"1.3","endpoint_list":[{"protocol":"tcp","comm_id":"10.0.0.1","placement":"device"}]}"#,
            r#"{"version":"1.3","endpoint_list":[{"protocol":"roce","comm_id":"not-an-ip","placement":"device"}]}"#,
            r#"{"version":"1.3","endpoint_list":[{"protocol":"roce","comm_id":"10.0.0.1"}]}"#,
            r#"{"version":"1.3","endpoint_list":[{"protocol":"roce","comm_id":"10.0.0.1","placement":"nic"}]}"#,
            r#"{"version":"1.3","endpoint_list":[{"protocol":"ub_ctp","comm_id":"xyz","placement":"host"}]}"#,
            r#"{"version":"1.0","server_list":[{"server_id":"a","device":[]}]}"#,
            r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"device_id":"0"},{"device_id":"1"}]}]}"#,
            r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"device_id":"x"}]}]}"#,
            r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"device_id":"0","device_ip":"999.1.1.1"}]}]}"#,
            r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"device_id":"0","device_port":"0"}]}]}"#,
        ] {
            bad("LocalCommRes", v);
        }
        let big = format!(
            r#"{{"version":"1.2","pad":"{}"}}"#,
            "x".repeat(MAX_COMM_RES_BYTES)
        );
        bad("LocalCommRes", &big);
        let o = AscendOptions::from_pairs([("LocalCommRes", r#"{"version":"1.3"}"#)]).unwrap();
        assert_eq!(o.local_comm_res.unwrap().version, "1.3");
        let o = AscendOptions::from_pairs([("LocalCommRes", "")]).unwrap();
        assert!(o.local_comm_res.is_none());
    }

    #[test]
    fn global_resource_config() {
        for v in [
            "",
            "{}",
            r#"{"fabric_memory.max_capacity":"1024","fabric_memory.start_address":"0","fabric_memory.task_stream_num":"1","fabric_memory.enable_aicpu_unfold":true}"#,
            r#"{"fabric_memory":{"max_capacity":"10","start_address":"50","task_stream_num":"4","enable_aicpu_unfold":false}}"#,
            r#"{"fabric_memory.max_capacity":1,"fabric_memory.start_address":1024}"#,
            r#"{"connect_pool.thread_num":"1","connect_pool.task_queue_capacity":"65535"}"#,
            r#"{"connect_pool.thread_num":64,"connect_pool.task_queue_capacity":1}"#,
            r#"{"comm_resource_config.listen_port":"1","comm_resource_config.max_active_channels":8192,"comm_resource_config.qos":0}"#,
            r#"{"comm_resource_config.listen_port":65535,"comm_resource_config.max_active_channels":"1","comm_resource_config.qos":7}"#,
            r#"{"comm_resource_config.protocol_desc":["hccs:device","roce:device"]}"#,
            r#"{"comm_resource_config.protocol_desc":"roce:host"}"#,
            r#"{"comm_resource_config.multi_channel.num_workers":16,"comm_resource_config.multi_channel.split_batch_size":4294967295}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":1}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":"1024"}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":32766}"#,
            r#"{"local_comm_res_path":"/path/to/local_comm_res.json","topo_file_path":""}"#,
            r#"{"channel_pool.max_channel":"10","channel_pool.high_waterline":"0.3","channel_pool.low_waterline":"0.1"}"#,
            r#"{"channel_pool.max_channel":512,"channel_pool.high_waterline":0.99,"channel_pool.low_waterline":0.01}"#,
            r#"{"channel_pool.high_waterline":"0.5","channel_pool.low_waterline":"0.4"}"#,
        ] {
            ok("GlobalResourceConfig", v);
        }
        for v in [
            "not json",
            "[]",
            r#"{"fabric_memory.max_capacity":"0"}"#,
            r#"{"fabric_memory.max_capacity":"1025"}"#,
            r#"{"fabric_memory.start_address":"1025"}"#,
            r#"{"fabric_memory.task_stream_num":"0"}"#,
            r#"{"fabric_memory.task_stream_num":"9","fabric_memory.enable_aicpu_unfold":false}"#,
            r#"{"fabric_memory":{"task_stream_num":"4"}}"#,
            r#"{"fabric_memory.enable_aicpu_unfold":"true"}"#,
            r#"{"fabric_memory":{"max_capacity":"10"},"fabric_memory.max_capacity":"10"}"#,
            r#"{"connect_pool.thread_num":"0"}"#,
            r#"{"connect_pool.thread_num":"65"}"#,
            r#"{"connect_pool.task_queue_capacity":"65536"}"#,
            r#"{"comm_resource_config.listen_port":0}"#,
            r#"{"comm_resource_config.listen_port":"65536"}"#,
            r#"{"comm_resource_config.max_active_channels":8193}"#,
            r#"{"comm_resource_config.qos":8}"#,
            r#"{"comm_resource_config.protocol_desc":["tcp:host"]}"#,
            r#"{"comm_resource_config.protocol_desc":[]}"#,
            r#"{"comm_resource_config.protocol_desc":1}"#,
            r#"{"comm_resource_config.multi_channel.num_workers":17}"#,
            r#"{"comm_resource_config.multi_channel.split_batch_size":0}"#,
            r#"{"comm_resource_config.multi_channel.split_batch_size":4294967296}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":0}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":-1}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":32767}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":1.5}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":true}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":null}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":[]}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":{}}"#,
            r#"{"transfer_config.max_transfer_count_per_batch":"invalid"}"#,
            r#"{"local_comm_res_path":7}"#,
            r#"{"channel_pool.max_channel":"0","channel_pool.high_waterline":"0.3","channel_pool.low_waterline":"0.1"}"#,
            r#"{"channel_pool.max_channel":"513","channel_pool.high_waterline":"0.3","channel_pool.low_waterline":"0.1"}"#,
            r#"{"channel_pool.max_channel":"10"}"#,
            r#"{"channel_pool.high_waterline":"0.3"}"#,
            r#"{"channel_pool.high_waterline":"1","channel_pool.low_waterline":"0.1"}"#,
            r#"{"channel_pool.high_waterline":"0.3","channel_pool.low_waterline":"0"}"#,
            r#"{"channel_pool.high_waterline":"0.1","channel_pool.low_waterline":"0.3"}"#,
            r#"{"channel_pool.max_channel":"2","channel_pool.high_waterline":"0.6","channel_pool.low_waterline":"0.5"}"#,
            r#"{"no_such_field":1}"#,
        ] {
            bad("GlobalResourceConfig", v);
        }
        let o = AscendOptions::from_pairs([(
            "GlobalResourceConfig",
            r#"{"comm_resource_config":{"listen_port":"26666","protocol_desc":["roce:device"]}}"#,
        )])
        .unwrap();
        let g = o.global_resource_config.unwrap();
        assert_eq!(g.listen_port, Some(26666));
        assert_eq!(g.protocol_desc, ["roce:device"]);
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
        assert_eq!(
            device_ip_from_hccn(conf, 0),
            Some("192.168.100.101".parse().unwrap())
        );
        assert_eq!(
            device_ip_from_hccn(conf, 1),
            Some("192.168.100.102".parse().unwrap())
        );
        assert_eq!(
            device_ip_from_hccn(conf, 10),
            Some("192.168.100.110".parse().unwrap())
        );
        assert_eq!(
            device_ip_from_hccn(conf, 2),
            Some("192.168.100.103".parse().unwrap())
        );
        assert_eq!(
            device_ip_from_hccn(conf, 3),
            Some("fe80::3".parse().unwrap())
        );
        assert_eq!(device_ip_from_hccn(conf, 4), None);
        // HIXL's fallback: IPv6address_<physical id> when there is no address_<physical id>
        let v6 = "address_0=192.168.100.101\nIPv6address_0=fd00::100\nIPv6address_1=fd00::101\n";
        assert_eq!(
            device_ip_from_hccn(v6, 0),
            Some("192.168.100.101".parse().unwrap()),
            "address_ first"
        );
        assert_eq!(
            device_ip_from_hccn(v6, 1),
            Some("fd00::101".parse().unwrap())
        );
        assert_eq!(device_ip_from_hccn(v6, 2), None);
        assert_eq!(device_ip_from_hccn("#address_0=1.2.3.4\n", 0), None);
        assert_eq!(device_ip_from_hccn("", 0), None);
    }

    #[test]
    fn json_parser_is_strict() {
        assert_eq!(
            parse_json(r#" {"a":[1,-2.5e3,true,false,null,"x\u00e9\ud83d\ude00\n"]} "#).unwrap(),
            Json::Obj(vec![(
                "a".into(),
                Json::Arr(vec![
                    Json::Num("1".into()),
                    Json::Num("-2500.0".into()),
                    Json::Bool(true),
                    Json::Bool(false),
                    Json::Null,
                    Json::Str("xé😀\n".into()),
                ])
            )])
        );
        for bad in [
            "",
            "{\"a\":1,\"a\":2}",
            "{\"a\":{\"b\":1,\"b\":1}}",
            "{",
            "}",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "'a'",
            "\"\\x\"",
            "\"\t\"",
            "\"\\ud800\"",
            "{\"a\" 1}",
            "[1 2]",
            "nul",
            "truex",
            "{} {}",
            "/* c */ {}",
        ] {
            assert!(parse_json(bad).is_err(), "{bad:?} accepted");
        }
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert!(parse_json(&deep).is_err());
        let ok_deep = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(parse_json(&ok_deep).is_ok());
    }
}
