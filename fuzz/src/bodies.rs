//! The fuzz targets' bodies: one function per decoder a peer or a caller reaches. Each must not
//! panic on any input, and checks a property of what it accepts (it re-encodes to an equal
//! value, or its invariants hold).
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`, coverage-guided, run for a bounded
//! time in CI) and by the stable replay of the checked-in corpus (`tests/fuzz_corpus.rs` in the
//! main crate, run by `cargo test`): an input a fuzzer found goes into `fuzz/corpus/<target>/` and
//! is a regression test from then on. Only `hixl`'s public API is used.

use hixl::wire::{self, DeviceInfo, Hello, Kind, Refuse, UcxInfo, Welcome};

/// A target's body.
pub type Body = fn(&[u8]);

/// Every target, by name (the corpus folder of each is `fuzz/corpus/<name>/`).
pub const TARGETS: &[(&str, Body)] = &[
    ("decode", decode),
    ("handshake", handshake),
    ("table", table),
    ("notify", notify),
    ("device", device),
    ("ucx_info", ucx_info),
    ("options", options),
];

/// Frames as they arrive: a header, then the payload it announces; and the bytes as the payload
/// of every kind. An accepted XFER re-encodes to the same bytes.
pub fn decode(data: &[u8]) {
    if let Some(h) = data.get(..wire::HEADER_LEN) {
        let h: [u8; wire::HEADER_LEN] = h.try_into().expect("12 bytes");
        if let Ok(hd) = wire::decode_header(&h) {
            let _ = wire::decode_any(hd.kind, &data[wire::HEADER_LEN..]);
        }
    }
    for kind in Kind::ALL {
        let _ = wire::decode_any(kind, data);
    }
    let mut descs = Vec::new();
    if let Ok((op, req)) = wire::decode_xfer(data, &mut descs) {
        let mut out = Vec::new();
        wire::encode_xfer(&mut out, op, req, descs.iter().copied());
        assert_eq!(&out[wire::HEADER_LEN..], data);
    }
}

/// The payload of an encoded frame (its header checked against it).
fn payload(frame: &[u8]) -> &[u8] {
    let h: [u8; wire::HEADER_LEN] = frame[..wire::HEADER_LEN].try_into().expect("a header");
    let h = wire::decode_header(&h).expect("an encoded header decodes");
    assert_eq!(h.len as usize, frame.len() - wire::HEADER_LEN);
    &frame[wire::HEADER_LEN..]
}

/// The handshake: HELLO, REFUSE, CHALLENGE and AUTH. What decodes re-encodes to a payload that
/// decodes to the same value.
pub fn handshake(data: &[u8]) {
    if let Ok(h) = Hello::decode(data) {
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(Hello::decode(payload(&out)).expect("re-decodes"), h);
    }
    if let Ok(r) = Refuse::decode(data) {
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(Refuse::decode(payload(&out)).expect("re-decodes"), r);
    }
    for (kind, n) in [(Kind::Challenge, 2), (Kind::Auth, 1)] {
        if let Ok(fields) = wire::decode_auth(data, n) {
            assert_eq!(fields.len(), n);
            let refs: Vec<&[u8; 32]> = fields.iter().collect();
            let mut out = Vec::new();
            wire::encode_auth(&mut out, kind, &refs);
            assert_eq!(payload(&out), data);
        }
    }
}

/// WELCOME, with the region table a link trusts: ranges non-empty, without overflow, ids
/// unique, sorted by address and disjoint.
pub fn table(data: &[u8]) {
    let Ok(w) = Welcome::decode(data) else { return };
    let mut ids = std::collections::HashSet::new();
    for e in &w.table {
        assert!(e.len > 0 && e.addr.checked_add(e.len).is_some());
        assert!(ids.insert(e.id), "duplicate id {}", e.id);
    }
    for pair in w.table.windows(2) {
        assert!(pair[0].addr + pair[0].len <= pair[1].addr, "overlap");
    }
    let mut out = Vec::new();
    w.encode(&mut out);
    assert_eq!(Welcome::decode(payload(&out)).expect("re-decodes"), w);
}

/// NOTIFY and DONE: re-encoded, the same bytes.
pub fn notify(data: &[u8]) {
    if let Ok((req, name, msg)) = wire::decode_notify(data) {
        let mut out = Vec::new();
        wire::encode_notify(&mut out, req, &name, &msg);
        assert_eq!(payload(&out), data);
    }
    if let Ok((req, status, reason)) = wire::decode_done(data) {
        let mut out = Vec::new();
        wire::encode_done(&mut out, req, status, &reason);
        assert_eq!(payload(&out), data);
    }
}

/// DEVICE_HELLO / DEVICE_WELCOME: a peer's device description.
pub fn device(data: &[u8]) {
    if let Ok(d) = DeviceInfo::decode(data) {
        let mut out = Vec::new();
        d.encode(Kind::DeviceHello, &mut out);
        assert_eq!(payload(&out), data);
    }
}

/// UCXINFO: a peer's UCX worker address and keys.
pub fn ucx_info(data: &[u8]) {
    if let Ok(u) = UcxInfo::decode(data) {
        let mut out = Vec::new();
        u.encode(&mut out);
        assert_eq!(UcxInfo::decode(payload(&out)).expect("re-decodes"), u);
    }
}

/// The option strings a caller passes (HIXL's keys through `compat` and the C ABI, the
/// `hixl.*` keys, and the Ascend options whose values are JSON: `GlobalResourceConfig`,
/// `LocalCommRes`, `BufferPool`): lines of `KEY=VALUE`, or a known key chosen by the first byte
/// with the rest as its value. Errors are fine; panics are not, and an accepted set is accepted
/// again.
pub fn options(data: &[u8]) {
    const KEYS: &[&str] = &[
        "OPTION_GLOBAL_RESOURCE_CONFIG",
        "GlobalResourceConfig",
        "LocalCommRes",
        "OPTION_LOCAL_COMM_RES",
        "BufferPool",
        "RdmaTrafficClass",
        "RdmaServiceLevel",
        "AutoConnect",
        "EnableUseFabricMem",
        "hixl.ascend.device_id",
        "hixl.ascend.device_ip",
        "hixl.ascend.enable",
        "hixl.ConnectTimeoutMs",
        "hixl.psk",
    ];
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once('=')).collect();
    if hixl::Options::from_pairs(lines.iter().copied()).is_ok() {
        assert!(hixl::Options::from_pairs(lines.iter().copied()).is_ok());
    }
    if let Some((&first, rest)) = data.split_first()
        && let Ok(value) = std::str::from_utf8(rest)
    {
        let key = KEYS[first as usize % KEYS.len()];
        let _ = hixl::Options::from_pairs([(key, value)]);
    }
}
