//! The engine's cases through `hixl::compat::Hixl` (HIXL's shape in Rust).

use hixl::compat::{Hixl, MemDesc, NotifyDesc, TransferOpDesc};
use hixl::{MemType, TransferOp};

use crate::peer::{EnginePeer, REGION};
use crate::table::Case;

fn status<T>(r: Result<T, hixl::compat::Error>) -> u32 {
    r.map_or_else(|e| e.status().code(), |_| 0)
}

/// `case`'s status, from a fresh engine brought to its state (and finalized after).
pub fn run(case: &Case, peer: &EnginePeer) -> u32 {
    let me = Hixl::new();
    // this side's region, an unregistered buffer, and what the case registers: all outlive
    // the engine (finalized below, before they drop)
    let mut region = vec![0u8; REGION];
    let mut unregistered = vec![0u8; REGION];
    let mut fresh = vec![0u8; REGION];
    let base = region.as_mut_ptr() as usize;
    if case.state != "fresh" {
        me.initialize("127.0.0.1", Vec::<(String, String)>::new())
            .expect("initialize");
        let d = MemDesc {
            addr: base,
            len: REGION,
            local_only: false,
        };
        // SAFETY: `region` outlives the registration (the engine is finalized before it drops)
        // and is touched only by transfers meanwhile.
        unsafe { me.register_mem(d, MemType::Host) }.expect("register");
    }
    if case.state == "connected" {
        me.connect(&peer.name, 5000).expect("connect");
    }
    if case.state == "finalized" {
        me.finalize();
    }
    let remote = |c: &Case| match c.str("remote", "peer") {
        "peer" => peer.name.clone(),
        _ => "not an engine name".to_owned(),
    };
    let timeout = case.int("timeout", 1000) as i32;
    let got = match case.call.as_str() {
        "initialize" => {
            let opts: Vec<(String, String)> = case
                .arg("options")
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            status(me.initialize(case.str("name", ""), opts))
        }
        "register" => {
            let addr = match case.str("addr", "fresh") {
                "null" => 0,
                "overlap" => base + 1024,
                _ => fresh.as_mut_ptr() as usize,
            };
            let d = MemDesc {
                addr,
                len: case.int("len", 0) as usize,
                local_only: false,
            };
            // SAFETY: `fresh` (or the overlapping `region`) outlives the engine; a null
            // address or zero length is refused before anything is registered.
            status(unsafe { me.register_mem(d, MemType::Host) })
        }
        "deregister" => status(me.deregister_mem(0xdead_beef)),
        "connect" => status(me.connect(&remote(case), timeout)),
        "disconnect" => status(me.disconnect(&remote(case), timeout)),
        "notify" => {
            // a name and a message of name_len and msg_len bytes (by default short ones)
            let n = NotifyDesc {
                name: "n".repeat(case.int("name_len", 11) as usize),
                notify_msg: "m".repeat(case.int("msg_len", 1) as usize),
            };
            status(me.send_notify(&remote(case), &n, timeout))
        }
        "transfer_status" => status(me.get_transfer_status(0xdead_beef)),
        "transfer" => {
            let op = match case.arg("op").as_str() {
                Some("read") => TransferOp::Read,
                Some("write") => TransferOp::Write,
                other => panic!("{}: op {other:?}", case.id),
            };
            let descs: Vec<TransferOpDesc> = case
                .arg("descs")
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let f = |i: usize| d[i].as_i64().unwrap() as usize;
                    let local = match d[0].as_str().unwrap() {
                        "region" => base,
                        _ => unregistered.as_mut_ptr() as usize,
                    };
                    let remote = match d[2].as_str().unwrap() {
                        "peer" => peer.region,
                        _ => peer.region + 16 * REGION,
                    };
                    TransferOpDesc {
                        local_addr: local + f(1),
                        remote_addr: remote + f(3),
                        len: f(4),
                    }
                })
                .collect();
            status(me.transfer_sync(&peer.name, op, &descs, timeout))
        }
        other => panic!("{}: call {other}", case.id),
    };
    me.finalize();
    drop((region, unregistered, fresh));
    got
}
