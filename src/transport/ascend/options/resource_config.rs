//! `GlobalResourceConfig`: HIXL's JSON of fabric-memory, connect-pool, channel and transfer
//! settings (nested or dotted field names), each field checked against its documented range.

use super::json::{Json, parse_json};
use super::{GlobalResourceConfig, digits};

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

/// The integer fields: where each goes, its range, and the problem to report for a value that
/// is not an integer in it.
fn uint_field<'c>(
    c: &'c mut GlobalResourceConfig,
    key: &str,
) -> Option<(&'c mut Option<u64>, u64, u64, &'static str)> {
    Some(match key {
        "fabric_memory.max_capacity" => (
            &mut c.fabric_max_capacity,
            1,
            1024,
            "fabric_memory.max_capacity: an integer in (0, 1024] (TB)",
        ),
        "fabric_memory.start_address" => (
            &mut c.fabric_start_address,
            0,
            1024,
            "fabric_memory.start_address: an integer in [0, 1024] (TB)",
        ),
        "fabric_memory.task_stream_num" => (
            &mut c.fabric_task_stream_num,
            1,
            8,
            "fabric_memory.task_stream_num: an integer in [1, 8]",
        ),
        "connect_pool.thread_num" => (
            &mut c.connect_pool_thread_num,
            1,
            64,
            "connect_pool.thread_num: an integer in [1, 64]",
        ),
        "connect_pool.task_queue_capacity" => (
            &mut c.connect_pool_task_queue_capacity,
            1,
            65535,
            "connect_pool.task_queue_capacity: an integer in [1, 65535]",
        ),
        "comm_resource_config.listen_port" => (
            &mut c.listen_port,
            1,
            65535,
            "comm_resource_config.listen_port: an integer in [1, 65535]",
        ),
        "comm_resource_config.max_active_channels" => (
            &mut c.max_active_channels,
            1,
            8192,
            "comm_resource_config.max_active_channels: an integer in [1, 8192]",
        ),
        "comm_resource_config.qos" => (
            &mut c.qos,
            0,
            7,
            "comm_resource_config.qos: an integer in [0, 7]",
        ),
        "comm_resource_config.multi_channel.num_workers" => (
            &mut c.multi_channel_num_workers,
            1,
            16,
            "comm_resource_config.multi_channel.num_workers: an integer in [1, 16]",
        ),
        "comm_resource_config.multi_channel.split_batch_size" => (
            &mut c.multi_channel_split_batch_size,
            1,
            u64::from(u32::MAX),
            "comm_resource_config.multi_channel.split_batch_size: an integer in [1, 4294967295]",
        ),
        "transfer_config.max_transfer_count_per_batch" => (
            &mut c.max_transfer_count_per_batch,
            1,
            32766,
            "transfer_config.max_transfer_count_per_batch: an integer in [1, 32766]",
        ),
        "channel_pool.max_channel" => (
            &mut c.channel_pool_max_channel,
            1,
            512,
            "channel_pool.max_channel: an integer in (0, 512]",
        ),
        _ => return None,
    })
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

pub(super) fn parse_global_resource_config(
    value: &str,
) -> Result<GlobalResourceConfig, &'static str> {
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
        if let Some((field, lo, hi, msg)) = uint_field(&mut c, k) {
            *field = match json_uint(v) {
                Some(n) if (lo..=hi).contains(&n) => Some(n),
                _ => return Err(msg),
            };
            continue;
        }
        match k.as_str() {
            "fabric_memory.enable_aicpu_unfold" => match v {
                Json::Bool(b) => c.fabric_enable_aicpu_unfold = Some(*b),
                _ => return Err("fabric_memory.enable_aicpu_unfold: a JSON boolean"),
            },
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

#[cfg(test)]
mod tests {
    use crate::transport::ascend::options::AscendOptions;
    use crate::transport::ascend::options::tests::{bad, ok};

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
}
