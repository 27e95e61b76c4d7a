//! The fuzz targets' bodies: one function per decoder a peer or a caller reaches. Each must not
//! panic on any input, and checks a property of what it accepts (it re-encodes to an equal
//! value, or its invariants hold).
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`, coverage-guided, run for a bounded
//! time in CI) and by the stable replay of the checked-in corpus (`tests/fuzz_corpus.rs` in the
//! main crate, run by `cargo test`): an input a fuzzer found goes into `fuzz/corpus/<target>/` and
//! is a regression test from then on. Only `hixl`'s public API is used.

use hixl::cs::list as cs_list;
use hixl::wire::{self, DeviceInfo, FabricInfo, Hello, Kind, Refuse, UcxInfo, Welcome};

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
    ("serve_handshake", serve_handshake),
    ("fabric", fabric),
    ("cs_list", cs_list),
    ("xfer_blocks", xfer_blocks),
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

/// FABRIC_HELLO / FABRIC_WELCOME: a peer's VMM blocks and fabric handles. What decodes has
/// non-empty blocks without overflow, and re-encodes to the same bytes.
pub fn fabric(data: &[u8]) {
    if let Ok(f) = FabricInfo::decode(data) {
        for b in &f.blocks {
            assert!(b.len > 0 && b.base.checked_add(b.len).is_some());
        }
        let mut out = Vec::new();
        f.encode(Kind::FabricWelcome, &mut out);
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

/// The serving engine's handshake machine (`hixl::handshake`), driven as the poller drives it
/// over whole frame sequences: the first byte picks the server (a key, an allow-list, same-host
/// transfers, room for a fence), then each op appends to the client's byte stream raw bytes, a
/// HELLO, the honest (or a corrupted) AUTH for the last CHALLENGE, or a PROOF. Whole frames are
/// cut from the stream as the poller cuts them (a header past the handshake limit is a protocol
/// violation) and fed to the machine until it ends. Checked: a keyed server completes only
/// after an honest AUTH, an allow-listed one only for a listed name, a PROVE only for a new
/// link from this host with room for a fence, each frame is sent at most once and in order,
/// and every refusal is a REFUSE with the status of its cause.
pub fn serve_handshake(data: &[u8]) {
    use hixl::handshake::{Admission, Handshake, MAX_HANDSHAKE_FRAME, Refusal, Step, client_proof};
    use hixl::wire::{HostId, LaneRole};
    use hixl::{Psk, Status};
    use std::time::{Duration, Instant};

    let Some((&flags, mut ops)) = data.split_first() else {
        return;
    };
    let me = HostId {
        boot: [1; 16],
        pidns: 7,
        pid: 100,
        start: 1,
    };
    let elsewhere = HostId {
        boot: [2; 16],
        ..me
    };
    let key = Psk::new("fuzz key");
    let names = ["a", "b", "10.0.0.7"];
    let allow = vec!["a".to_owned()];
    let adm = Admission {
        psk: (flags & 1 != 0).then_some(&key),
        allow: (flags & 2 != 0).then_some(allow.as_slice()),
        host: (flags & 4 != 0).then_some(me),
        fence_room: flags & 8 != 0,
        client: "10.0.0.7:4000".parse().expect("an address"),
        server: Some("10.0.0.1:5000".parse().expect("an address")),
    };
    let now = Instant::now();
    let mut hs = Some(Box::new(Handshake::new(now, now + Duration::from_secs(1))));
    let mut stream: Vec<u8> = Vec::new();
    // what the client side knows: its last HELLO, the CHALLENGE's nonce, the PROVE's nonce;
    // and what the server was sent
    let mut last_hello: Option<Hello> = None;
    let mut fed_hello: Option<Hello> = None;
    let mut sn: Option<[u8; 32]> = None;
    let mut honest_auth_fed = false;
    let mut prove_nonce: Option<[u8; 32]> = None;
    fn next(ops: &mut &[u8]) -> u8 {
        let (b, rest) = ops.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        *ops = rest;
        b
    }
    while !ops.is_empty() {
        let op = next(&mut ops);
        match op % 4 {
            0 => {
                let n = usize::from(next(&mut ops)).min(ops.len());
                stream.extend_from_slice(&ops[..n]);
                ops = &ops[n..];
            }
            1 => {
                let c = next(&mut ops);
                let h = Hello {
                    role: if c & 1 == 0 {
                        LaneRole::NewLink
                    } else {
                        LaneRole::Join
                    },
                    instance: 1,
                    token: u64::from(c >> 6),
                    name: names[usize::from(c >> 1) % names.len()].into(),
                    // the server's address (a keyed server refuses any other), or not
                    target: if c & 0x20 == 0 {
                        "10.0.0.1:5000".into()
                    } else {
                        String::new()
                    },
                    host: match (c >> 3) & 3 {
                        0 => None,
                        1 => Some(me),
                        _ => Some(elsewhere),
                    },
                    nonce: [c; 32],
                };
                h.encode(&mut stream);
                last_hello = Some(h);
            }
            2 => {
                let corrupt = next(&mut ops) & 1 != 0;
                let (cn, name, target) = last_hello.as_ref().map_or(([0; 32], "", ""), |h| {
                    (h.nonce, h.name.as_str(), h.target.as_str())
                });
                let mut proof = client_proof(&key, &cn, &sn.unwrap_or([0; 32]), name, target);
                if corrupt {
                    proof[0] ^= 1;
                }
                wire::encode_auth(&mut stream, Kind::Auth, &[&proof]);
            }
            _ => wire::encode_proof(&mut stream, u64::from(next(&mut ops))),
        }
        // the poller's part: cut whole frames and feed them
        let mut at = 0;
        let step = loop {
            let Some(h) = stream.get(at..at + wire::HEADER_LEN) else {
                break None;
            };
            let h: [u8; wire::HEADER_LEN] = h.try_into().expect("a header");
            let h = match wire::decode_header(&h) {
                Ok(h) if h.len > MAX_HANDSHAKE_FRAME => {
                    break Some(Step::Refuse(Refusal::violation(
                        &wire::WireError::OverLimit {
                            what: "handshake frame length",
                            got: h.len.into(),
                            limit: MAX_HANDSHAKE_FRAME.into(),
                        },
                    )));
                }
                Ok(h) => h,
                Err(e) => break Some(Step::Refuse(Refusal::violation(&e))),
            };
            let end = at + wire::HEADER_LEN + h.len as usize;
            let Some(p) = stream.get(at + wire::HEADER_LEN..end) else {
                break None;
            };
            if h.kind == Kind::Hello {
                fed_hello = Hello::decode(p).ok();
            }
            // an AUTH that proves the key for the HELLO fed and the CHALLENGE sent
            if h.kind == Kind::Auth
                && let (Some(hello), Some(sn)) = (&fed_hello, &sn)
                && wire::decode_auth(p, 1).is_ok_and(|f| {
                    f[0] == client_proof(&key, &hello.nonce, sn, &hello.name, &hello.target)
                })
            {
                honest_auth_fed = true;
            }
            let step = (hs.take().expect("a handshake in progress")).on_frame(h.kind, p, &adm);
            at = end;
            match step {
                Step::Send(f, more) => {
                    let fh: [u8; wire::HEADER_LEN] =
                        f[..wire::HEADER_LEN].try_into().expect("a header");
                    let k = wire::decode_header(&fh)
                        .expect("a sent header decodes")
                        .kind;
                    let fp = payload(&f);
                    if k == Kind::Challenge {
                        assert!(adm.psk.is_some(), "a CHALLENGE without a key");
                        assert!(sn.is_none(), "a second CHALLENGE");
                        let fields = wire::decode_auth(fp, 2).expect("a CHALLENGE decodes");
                        sn = Some(fields[0]);
                    } else {
                        assert_eq!(k, Kind::Prove, "an unexpected frame");
                        assert!(prove_nonce.is_none(), "a second PROVE");
                        assert!(
                            adm.psk.is_none() || honest_auth_fed,
                            "a PROVE before the key"
                        );
                        prove_nonce = Some(fp.try_into().expect("a PROVE holds its nonce"));
                    }
                    hs = Some(more);
                }
                other => break Some(other),
            }
        };
        stream.drain(..at.min(stream.len()));
        let Some(step) = step else { continue };
        let completed = |h: &Hello| {
            assert_eq!(Some(h), fed_hello.as_ref(), "completed with another HELLO");
            assert!(
                adm.psk.is_none() || honest_auth_fed,
                "completed without the key"
            );
            if let Some(allow) = adm.allow {
                assert!(allow.contains(&h.name), "completed for a name not allowed");
            }
        };
        match step {
            Step::Done(h) => completed(&h),
            Step::Prove { hello, nonce, .. } => {
                completed(&hello);
                assert_eq!(Some(nonce), prove_nonce, "proved another nonce");
                assert!(hello.role == LaneRole::NewLink && adm.fence_room);
                assert!(adm.same_host(&hello), "a proof asked of another host");
            }
            Step::Refuse(r) => {
                let f = r.frame();
                let back = Refuse::decode(payload(&f)).expect("a REFUSE decodes");
                assert_eq!(
                    (back.status, back.reason.as_str()),
                    (r.status.code(), r.told.as_str())
                );
                assert!(
                    [Status::FAILED, Status::PARAM_INVALID].contains(&r.status),
                    "refused with {:?}",
                    r.status
                );
            }
            Step::Send(..) => unreachable!("sends are handled in the loop"),
        }
        return;
    }
}

/// The HIXL-CS server's memory list (`hixl::cs::list`, a published table:
/// `hixl::published`), which a client READs one-sidedly from the server's memory (so a peer
/// writes every byte of it): the bytes as the whole region (a header, then the payload it
/// announces, whatever its checksum; and opened, checksum checked) and as a bare payload. What
/// decodes holds its limits (counts, memory types, non-empty ranges without overflow, tags
/// without a NUL) and re-encodes to the same bytes.
pub fn cs_list(data: &[u8]) {
    use hixl::published::{HEADER_LEN, Trailer};
    let format = cs_list::FORMAT;
    if let Ok(h) = format.decode_header(data) {
        assert!(h.len <= format.max_payload() && h.version % 2 == 0);
        if let Some(p) = data.get(HEADER_LEN..HEADER_LEN + h.len) {
            cs_list_payload(p);
            // the ids trailer after it: what decodes re-encodes to the bytes it was read from
            let after = &data[HEADER_LEN + h.len..];
            if let Trailer::Found(ids) = cs_list::decode_ids(p, after) {
                assert!(ids.len() <= cs_list::MAX_MEMS);
                let again = cs_list::encode_ids(p, &ids);
                assert_eq!(&after[..again.len()], again);
            }
        }
    }
    if let Ok(p) = format.open(data) {
        assert_eq!(format.decode_header(data).map(|h| h.len), Ok(p.len()));
    }
    cs_list_payload(data);
}

fn cs_list_payload(p: &[u8]) {
    let Ok(t) = cs_list::decode_payload(p) else {
        return;
    };
    assert!(t.endpoints.len() <= cs_list::MAX_ENDPOINTS && t.mems.len() <= cs_list::MAX_MEMS);
    for m in &t.mems {
        assert!(m.typ == 0 || m.typ == 1, "memory type {}", m.typ);
        assert!(m.size > 0 && m.addr.checked_add(m.size).is_some());
        assert!(m.tag.len() <= cs_list::MAX_TAG && !m.tag.contains(&0));
    }
    assert_eq!(t.payload_len(), p.len());
    assert_eq!(t.encode_payload(), p);
}

/// Seeds of the `cs_list` corpus, encoded by the list's own encoder: whole regions (a header
/// as the server writes it, then the payload, with and without the ids trailer, whole or torn)
/// and bare payloads, an empty list, and truncated ones. `tests/fuzz_corpus.rs` writes them (`HIXL_WRITE_FUZZ_SEEDS=1`).
pub fn cs_list_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use cs_list::{ENDPOINT_LEN, Entry as Mem, FORMAT, Table};
    use hixl::published::HEADER_LEN;
    let region = |p: &[u8]| FORMAT.image(2, p);
    let mut endpoint = [0u8; ENDPOINT_LEN];
    endpoint[..4].copy_from_slice(&1i32.to_ne_bytes()); // RoCE
    endpoint[8..12].copy_from_slice(&[127, 0, 0, 1]);
    endpoint[44..48].copy_from_slice(&1i32.to_ne_bytes()); // host
    let list = Table {
        endpoints: vec![endpoint, [0; ENDPOINT_LEN]],
        mems: vec![
            Mem {
                typ: 1,
                addr: 0x7f00_0000_1000,
                size: 1 << 20,
                tag: b"kv_cache".to_vec(),
            },
            Mem {
                typ: 0,
                addr: 0x1_0000_0000,
                size: 4096,
                tag: Vec::new(),
            },
            Mem {
                typ: 1,
                addr: u64::MAX - 1,
                size: 1,
                tag: b"last byte".to_vec(),
            },
        ],
    };
    let p = list.encode_payload();
    let empty = Table::default().encode_payload();
    let mut with_ids = region(&p);
    with_ids.extend_from_slice(&cs_list::encode_ids(&p, &[1, 2, 0xffff_fffe]));
    let mut torn_ids = with_ids.clone();
    *torn_ids.last_mut().expect("a trailer") ^= 1;
    vec![
        ("payload", p.clone()),
        ("region", region(&p)),
        ("region_with_ids", with_ids),
        ("region_with_torn_ids", torn_ids),
        ("empty_payload", empty.clone()),
        ("empty_region", region(&empty)),
        ("truncated_payload", p[..p.len() - 3].to_vec()),
        ("truncated_in_endpoints", p[..8 + ENDPOINT_LEN + 7].to_vec()),
        (
            "truncated_region",
            region(&p)[..HEADER_LEN + p.len() / 2].to_vec(),
        ),
        ("header_only", region(&p)[..HEADER_LEN].to_vec()),
    ]
}

/// XFER_BLOCKS (a block-indexed batch): what decodes has at least one index, a non-zero block,
/// a stride of at least the block, the largest index it reports, and re-encodes to the same
/// bytes; the server's bounds check (`WireBlocks::block_offset`) never panics on it, and accepts
/// the largest index exactly when its block fits.
pub fn xfer_blocks(data: &[u8]) {
    let mut idx = Vec::new();
    let Ok(x) = wire::decode_xfer_blocks(data, &mut idx) else {
        return;
    };
    assert!(!idx.is_empty() && x.blocks.block > 0 && x.blocks.stride >= x.blocks.block);
    assert_eq!(idx.iter().copied().max(), Some(x.max));
    let mut out = Vec::new();
    if x.wide {
        wire::encode_xfer_blocks(
            &mut out,
            x.op,
            x.req,
            &x.blocks,
            hixl::BlockIndices::U64(&idx),
        );
    } else {
        let narrow: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        wire::encode_xfer_blocks(
            &mut out,
            x.op,
            x.req,
            &x.blocks,
            hixl::BlockIndices::U32(&narrow),
        );
    }
    assert_eq!(payload(&out), data);
    for len in [
        0,
        1,
        x.blocks.block,
        x.blocks.offset,
        u64::MAX,
        u64::MAX / 2,
    ] {
        if let Some(at) = x.blocks.block_offset(x.max, len) {
            assert!(at + x.blocks.block <= len);
            // every other index's block lies at or below the largest's
            assert!(idx.iter().all(|&i| x.blocks.block_offset(i, len).is_some()));
        }
    }
}
