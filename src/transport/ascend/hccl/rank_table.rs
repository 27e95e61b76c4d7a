//! The device description each side of a device link sends (DEVICE_HELLO / DEVICE_WELCOME)
//! and the two-rank HCCL rank table both sides build from the two, in the shape of HIXL's
//! rank table generators (versions 1.0 and 1.2).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Runtime, SuperIds};
use crate::error::Error;
use crate::wire::DeviceInfo;

/// The server's rank in a link's communicator.
pub(crate) const SERVER_RANK: u32 = 0;
/// The client's rank.
pub(crate) const CLIENT_RANK: u32 = 1;

fn ip_of_name(name: &str) -> String {
    crate::types::engine_name::EngineName::parse(name)
        .map(|n| n.ip.to_string())
        .unwrap_or_else(|_| "0.0.0.0".into())
}

/// A rank's device, as the rank table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankDev {
    /// The physical device id (`aclrtGetPhyDevIdByLogicDevId`), which HCCL compares with the
    /// current device's.
    pub(crate) device_id: u32,
    /// The device's RoCE address; `None` where HCCL needs none (one server; one A3 super pod).
    pub(crate) device_ip: Option<IpAddr>,
    /// The host's address, the rank table's `server_id`.
    pub(crate) host_ip: IpAddr,
    /// On A3: the super-device and super-pod ids (rank table 1.2).
    pub(crate) super_ids: Option<SuperIds>,
}

/// The HCCL rank table of a link, built with `serde_json` in the shape of HIXL's generators:
/// rank 0 is the server's device, rank 1 the client's; one `server_list` entry per host.
///
/// Version "1.2" (`RankTableGeneratorV2`) when both sides are A3: every device also has
/// `super_device_id`, and `super_pod_list` lists each super pod's servers. Else version "1.0"
/// (`RankTableGeneratorV1`; HIXL also takes the lower version of the two sides). `device_ip`
/// is left out where a side has none, as HIXL does.
///
/// # Errors
/// [`Error::InvalidOption`] (`hixl.ascend.device_ip`) when a side has no device IP although
/// HCCL needs one: the devices are on different servers and not in one A3 super pod.
pub(crate) fn rank_table(server: &RankDev, client: &RankDev) -> Result<String, Error> {
    let v12 = match (server.super_ids, client.super_ids) {
        (Some(s), Some(c)) => Some((s, c)),
        _ => None,
    };
    let one_server = server.host_ip == client.host_ip;
    let one_pod = v12.is_some_and(|(s, c)| s.pod == c.pod);
    if !one_server && !one_pod && (server.device_ip.is_none() || client.device_ip.is_none()) {
        return Err(Error::InvalidOption {
            key: "hixl.ascend.device_ip".into(),
            value: String::new(),
            problem: "a device IP on both sides: the devices are on different servers, not in one \
                      A3 super pod (set it, or address_<physical id> in /etc/hccn.conf)",
        });
    }
    let dev = |d: &RankDev, rank: u32| {
        let mut o = serde_json::Map::new();
        o.insert("device_id".into(), json!(d.device_id.to_string()));
        if let Some(ip) = d.device_ip {
            o.insert("device_ip".into(), json!(ip.to_string()));
        }
        if let (Some(ids), true) = (d.super_ids, v12.is_some()) {
            o.insert("super_device_id".into(), json!(ids.device.to_string()));
        }
        o.insert("rank_id".into(), json!(rank.to_string()));
        Value::Object(o)
    };
    let server_list: Vec<Value> = if one_server {
        vec![json!({
            "server_id": server.host_ip.to_string(),
            "device": [dev(server, SERVER_RANK), dev(client, CLIENT_RANK)],
        })]
    } else {
        vec![
            json!({"server_id": server.host_ip.to_string(), "device": [dev(server, SERVER_RANK)]}),
            json!({"server_id": client.host_ip.to_string(), "device": [dev(client, CLIENT_RANK)]}),
        ]
    };
    let mut table = json!({
        "version": if v12.is_some() { "1.2" } else { "1.0" },
        "server_count": server_list.len().to_string(),
        "server_list": server_list,
        "status": "completed",
    });
    if let Some((s, c)) = v12 {
        // HIXL's MergeSuperPods: pod id → the set of its servers
        let mut pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (ids, host) in [(s, server.host_ip), (c, client.host_ip)] {
            let servers = pods.entry(ids.pod.to_string()).or_default();
            if !servers.contains(&host.to_string()) {
                servers.push(host.to_string());
            }
        }
        let list: Vec<Value> = pods
            .into_iter()
            .map(|(pod, servers)| {
                let servers: Vec<Value> = servers
                    .into_iter()
                    .map(|s| json!({ "server_id": s }))
                    .collect();
                json!({"super_pod_id": pod, "server_list": servers})
            })
            .collect();
        table["super_pod_list"] = Value::Array(list);
    }
    Ok(table.to_string())
}

/// HIXL's communicator name, `hixl_<client>_<server>`, cut to 127 bytes, without NUL.
pub(super) fn comm_name(client: &str, server: &str) -> String {
    let mut s: String = format!("hixl_{client}_{server}")
        .chars()
        .filter(|c| *c != '\0')
        .collect();
    while s.len() > 127 {
        s.pop();
    }
    s
}

/// The A3 ids a peer sends in the text field of a DEVICE_HELLO / DEVICE_WELCOME with status 0.
fn parse_extras(text: &str) -> Result<Option<SuperIds>, &'static str> {
    const WHAT: &str = "a JSON object {\"super_device_id\": digits, \"super_pod_id\": digits}";
    if text.is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(text).map_err(|_| WHAT)?;
    let id = |k: &str| -> Result<i64, &'static str> {
        match v.get(k) {
            Some(Value::String(s))
                if !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit()) =>
            {
                s.parse().map_err(|_| WHAT)
            }
            _ => Err(WHAT),
        }
    };
    if !v.is_object() {
        return Err(WHAT);
    }
    Ok(Some(SuperIds {
        device: id("super_device_id")?,
        pod: id("super_pod_id")?,
    }))
}

pub(super) fn parse_dev(info: &DeviceInfo) -> Result<RankDev, &'static str> {
    Ok(RankDev {
        device_id: info.device_id,
        device_ip: match info.device_ip.as_str() {
            "" => None,
            ip => Some(ip.parse().map_err(|_| "a device IP address (or none)")?),
        },
        host_ip: info.host_ip.parse().map_err(|_| "a host IP address")?,
        super_ids: parse_extras(&info.reason)?,
    })
}

pub(super) fn my_dev(rt: &Runtime, name: &str) -> RankDev {
    RankDev {
        device_id: rt.device.phy_id,
        device_ip: rt.device_ip,
        host_ip: ip_of_name(name)
            .parse()
            .unwrap_or(IpAddr::from([0, 0, 0, 0])),
        super_ids: rt.super_ids,
    }
}

pub(super) fn my_info(rt: &Runtime, name: &str, timeout: Duration) -> DeviceInfo {
    DeviceInfo {
        status: 0,
        device_id: rt.device.phy_id,
        device_ip: rt.device_ip.map(|ip| ip.to_string()).unwrap_or_default(),
        host_ip: ip_of_name(name),
        timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
        reason: rt
            .super_ids
            .map(|ids| {
                json!({
                    "super_device_id": ids.device.to_string(),
                    "super_pod_id": ids.pod.to_string(),
                })
                .to_string()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    fn dev(id: u32, ip: Option<&str>, host: &str, ids: Option<(i64, i64)>) -> RankDev {
        RankDev {
            device_id: id,
            device_ip: ip.map(|ip| ip.parse().unwrap()),
            host_ip: host.parse().unwrap(),
            super_ids: ids.map(|(device, pod)| SuperIds { device, pod }),
        }
    }

    fn keys(v: &Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    /// Version 1.0, the fields of HIXL's `RankTableGeneratorV1` (`to_json` of RankTableInfo,
    /// ServerInfo, DeviceInfo): `version`, `server_count`, `server_list[{server_id, device[
    /// {device_id, device_ip?, rank_id}]}]`, `status`.
    #[test]
    fn rank_table_1_0_has_hixls_v1_fields() {
        let s = dev(4, Some("192.168.1.8"), "10.0.0.1", None);
        let mut c = dev(7, Some("192.168.1.9"), "10.0.0.1", None);
        let t: Value = serde_json::from_str(&rank_table(&s, &c).unwrap()).unwrap();
        assert_eq!(
            t,
            json!({"version":"1.0","server_count":"1","status":"completed","server_list":[
                {"server_id":"10.0.0.1","device":[
                    {"device_id":"4","device_ip":"192.168.1.8","rank_id":"0"},
                    {"device_id":"7","device_ip":"192.168.1.9","rank_id":"1"}]}]})
        );
        assert_eq!(
            keys(&t),
            ["server_count", "server_list", "status", "version"]
        );
        c.host_ip = "10.0.0.2".parse().unwrap();
        let t: Value = serde_json::from_str(&rank_table(&s, &c).unwrap()).unwrap();
        assert_eq!(t["server_count"], "2");
        assert_eq!(
            t["server_list"][1],
            json!({"server_id":"10.0.0.2","device":[{"device_id":"7","device_ip":"192.168.1.9","rank_id":"1"}]})
        );
        // one A3 side is not enough: HIXL takes the lower version of the two
        let a3 = dev(4, Some("192.168.1.8"), "10.0.0.1", Some((65536, 3)));
        let t: Value = serde_json::from_str(&rank_table(&a3, &c).unwrap()).unwrap();
        assert_eq!(t["version"], "1.0");
        assert!(t.get("super_pod_list").is_none());
        assert!(
            t["server_list"][0]["device"][0]
                .get("super_device_id")
                .is_none()
        );
        // a device IP needs no JSON escaping, but a host name would be refused before this
        assert_eq!(comm_name("a", "b"), "hixl_a_b");
        assert_eq!(comm_name(&"x".repeat(300), "b").len(), 127);
        assert_eq!(comm_name("a\0", "b"), "hixl_a_b");
    }

    /// Version 1.2, the fields of HIXL's `RankTableGeneratorV2`: every device also has
    /// `super_device_id`; `super_pod_list[{super_pod_id, server_list[{server_id}]}]` groups the
    /// servers by super pod (`MergeSuperPods`).
    #[test]
    fn rank_table_1_2_has_hixls_v2_fields() {
        let s = dev(0, Some("192.168.1.8"), "10.0.0.1", Some((98369551, 11)));
        let c = dev(3, Some("192.168.1.9"), "10.0.0.2", Some((190644239, 11)));
        let t: Value = serde_json::from_str(&rank_table(&s, &c).unwrap()).unwrap();
        assert_eq!(
            t,
            json!({"version":"1.2","server_count":"2","status":"completed",
                "server_list":[
                    {"server_id":"10.0.0.1","device":[{"device_id":"0","device_ip":"192.168.1.8",
                        "super_device_id":"98369551","rank_id":"0"}]},
                    {"server_id":"10.0.0.2","device":[{"device_id":"3","device_ip":"192.168.1.9",
                        "super_device_id":"190644239","rank_id":"1"}]}],
                "super_pod_list":[{"super_pod_id":"11","server_list":[
                    {"server_id":"10.0.0.1"},{"server_id":"10.0.0.2"}]}]})
        );
        assert_eq!(
            keys(&t),
            [
                "server_count",
                "server_list",
                "status",
                "super_pod_list",
                "version"
            ]
        );
        // two pods, and one server
        let c2 = dev(3, Some("192.168.1.9"), "10.0.0.2", Some((7, 12)));
        let s2 = dev(0, Some("192.168.1.8"), "10.0.0.1", Some((6, 11)));
        let t: Value = serde_json::from_str(&rank_table(&s2, &c2).unwrap()).unwrap();
        assert_eq!(
            t["super_pod_list"],
            json!([{"super_pod_id":"11","server_list":[{"server_id":"10.0.0.1"}]},
                   {"super_pod_id":"12","server_list":[{"server_id":"10.0.0.2"}]}])
        );
        let one = dev(1, None, "10.0.0.1", Some((9, 11)));
        let t: Value = serde_json::from_str(&rank_table(&s, &one).unwrap()).unwrap();
        assert_eq!(
            t["super_pod_list"],
            json!([{"super_pod_id":"11","server_list":[{"server_id":"10.0.0.1"}]}])
        );
        assert_eq!(
            t["server_list"][0]["device"][1],
            json!({"device_id":"1","super_device_id":"9","rank_id":"1"}),
            "no device_ip key without a device IP"
        );
    }

    /// HCCL needs no device IP within one server or one A3 super pod; elsewhere both sides
    /// need one.
    #[test]
    fn device_ips_are_optional_only_where_hccl_allows() {
        let with = dev(0, Some("192.168.1.8"), "10.0.0.1", None);
        let without = dev(1, None, "10.0.0.1", None);
        assert!(rank_table(&with, &without).is_ok(), "one server");
        let mut remote = without.clone();
        remote.host_ip = "10.0.0.2".parse().unwrap();
        let e = rank_table(&with, &remote).unwrap_err();
        assert_eq!(e.status(), Status::PARAM_INVALID, "{e:?}");
        let a = dev(0, None, "10.0.0.1", Some((1, 5)));
        let b = dev(0, None, "10.0.0.2", Some((2, 5)));
        assert!(rank_table(&a, &b).is_ok(), "one super pod");
        let c = dev(0, None, "10.0.0.2", Some((2, 6)));
        assert!(rank_table(&a, &c).is_err(), "two super pods");
    }

    #[test]
    fn peer_strings_never_reach_the_rank_table_unparsed() {
        let ok = DeviceInfo {
            status: 0,
            device_id: 1,
            device_ip: "192.168.1.9".into(),
            host_ip: "::1".into(),
            timeout_ms: 1,
            reason: String::new(),
        };
        assert_eq!(parse_dev(&ok).unwrap().super_ids, None);
        let mut none = ok.clone();
        none.device_ip = String::new();
        assert_eq!(parse_dev(&none).unwrap().device_ip, None, "no device IP");
        for inject in [
            r#"1.2.3.4","rank_id":"0"#,
            "1.2.3.4 ",
            "fe80::1%eth0",
            "../../etc/passwd",
        ] {
            let mut d = ok.clone();
            d.device_ip = inject.into();
            assert!(parse_dev(&d).is_err(), "device ip {inject:?}");
            let mut d = ok.clone();
            d.host_ip = inject.into();
            assert!(parse_dev(&d).is_err(), "host ip {inject:?}");
        }
        let mut d = ok.clone();
        d.host_ip = String::new();
        assert!(parse_dev(&d).is_err());
        let mut a3 = ok.clone();
        a3.reason = r#"{"super_device_id":"98369551","super_pod_id":"11","later":1}"#.into();
        assert_eq!(
            parse_dev(&a3).unwrap().super_ids,
            Some(SuperIds {
                device: 98369551,
                pod: 11
            })
        );
        for bad in [
            "x",
            "[]",
            r#"{"super_device_id":"1"}"#,
            r#"{"super_device_id":1,"super_pod_id":"1"}"#,
            r#"{"super_device_id":"-1","super_pod_id":"1"}"#,
            r#"{"super_device_id":"1\",\"x","super_pod_id":"1"}"#,
            r#"{"super_device_id":"9999999999999999999","super_pod_id":"1"}"#,
        ] {
            let mut d = ok.clone();
            d.reason = bad.into();
            assert!(parse_dev(&d).is_err(), "{bad:?}");
        }
    }
}
