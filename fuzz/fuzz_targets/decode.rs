//! Fuzzes the wire decoder: no input may make it panic, and what it accepts must survive a
//! re-encode. Run with `cargo +nightly fuzz run decode` from the repository root.
#![no_main]

use hixl::wire::{self, Kind};
use libfuzzer_sys::fuzz_target;


fuzz_target!(|data: &[u8]| {
    // as a frame: header, then the payload it announces
    if let Some(h) = data.get(..wire::HEADER_LEN) {
        let h: [u8; wire::HEADER_LEN] = h.try_into().expect("12 bytes");
        if let Ok(hd) = wire::decode_header(&h) {
            let _ = wire::decode_any(hd.kind, &data[wire::HEADER_LEN..]);
        }
    }
    // as the payload of every kind
    for kind in Kind::ALL {
        let _ = wire::decode_any(kind, data);
    }
    // an accepted XFER re-encodes to the same bytes
    let mut descs = Vec::new();
    if let Ok((op, req)) = wire::decode_xfer(data, &mut descs) {
        let mut out = Vec::new();
        wire::encode_xfer(&mut out, op, req, descs.iter().copied());
        assert_eq!(&out[wire::HEADER_LEN..], data);
    }
});
