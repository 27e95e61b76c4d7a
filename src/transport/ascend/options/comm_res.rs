//! `LocalCommRes`: the local communication resources (a rank table 1.0/1.2 or a 1.3
//! endpoint list), checked against HIXL's format before it is handed to HCCL.

use std::net::IpAddr;

use super::json::{Json, get, parse_json};
use super::{LocalCommRes, MAX_COMM_RES_BYTES, digits};

pub(super) fn parse_local_comm_res(value: &str) -> Result<Option<LocalCommRes>, &'static str> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ascend::options::AscendOptions;
    use crate::transport::ascend::options::tests::{bad, ok};

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
}
