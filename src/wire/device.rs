//! The DEVICE_HELLO / DEVICE_WELCOME frames: a peer's Ascend device, for the device data path.

use super::codec::put_str;
use super::{Kind, Reader, WireError, begin, seal};

/// A device announcement (DEVICE_HELLO and DEVICE_WELCOME): what a peer needs to build the
/// two-rank HCCL rank table of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// 0, or the HIXL status code of why the sender has no device data path.
    pub status: u32,
    /// The device (physical) id.
    pub device_id: u32,
    /// The device's RoCE address (`/etc/hccn.conf` `address_<id>`, or an option).
    pub device_ip: String,
    /// The host's address (the rank table's `server_id`).
    pub host_ip: String,
    /// How long the sender waits for the data path to be ready, in milliseconds.
    pub timeout_ms: u32,
    /// Why not (with a non-zero status).
    pub reason: String,
}

impl DeviceInfo {
    /// Encodes the frame (`kind` is [`Kind::DeviceHello`] or [`Kind::DeviceWelcome`]).
    pub fn encode(&self, kind: Kind, out: &mut Vec<u8>) {
        begin(out, kind);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.device_id.to_le_bytes());
        put_str(out, &self.device_ip);
        put_str(out, &self.host_ip);
        out.extend_from_slice(&self.timeout_ms.to_le_bytes());
        put_str(out, &self.reason);
        seal(out);
    }
    /// Decodes a DEVICE_HELLO or DEVICE_WELCOME payload.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let d = DeviceInfo {
            status: r.u32("status")?,
            device_id: r.u32("device id")?,
            device_ip: r.string("device ip")?,
            host_ip: r.string("host ip")?,
            timeout_ms: r.u32("timeout")?,
            reason: r.string("reason")?,
        };
        r.finish()?;
        Ok(d)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::payload;
    use crate::wire::{MAX_STR, WireError};

    #[test]
    fn device_info_round_trip_and_hostile_payloads() {
        let info = DeviceInfo {
            status: 0,
            device_id: 7,
            device_ip: "192.168.1.9".into(),
            host_ip: "10.0.0.2".into(),
            timeout_ms: 5000,
            reason: String::new(),
        };
        let mut out = Vec::new();
        info.encode(Kind::DeviceHello, &mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::DeviceHello);
        assert_eq!(DeviceInfo::decode(p).unwrap(), info);
        // every truncation is an error, never a panic
        for n in 0..p.len() {
            assert!(DeviceInfo::decode(&p[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut long = p.to_vec();
        long.push(0);
        assert!(DeviceInfo::decode(&long).is_err(), "trailing bytes");
        // a string length past MAX_STR, and bytes that are not UTF-8
        let mut over = 0u32.to_le_bytes().to_vec();
        over.extend_from_slice(&0u32.to_le_bytes());
        over.extend_from_slice(&((MAX_STR + 1) as u16).to_le_bytes());
        over.extend(std::iter::repeat_n(b'1', MAX_STR + 1));
        assert!(matches!(
            DeviceInfo::decode(&over),
            Err(WireError::OverLimit { .. })
        ));
        let mut bad = 0u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&0u32.to_le_bytes());
        bad.extend_from_slice(&2u16.to_le_bytes());
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert!(DeviceInfo::decode(&bad).is_err());
        // strings that are not addresses decode (the device link refuses them), unchanged
        let odd = DeviceInfo {
            device_ip: r#"1.2.3.4","rank_id":"0"#.into(),
            host_ip: "x".repeat(MAX_STR),
            ..info
        };
        odd.encode(Kind::DeviceWelcome, &mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::DeviceWelcome);
        assert_eq!(DeviceInfo::decode(p).unwrap(), odd);
    }
}
