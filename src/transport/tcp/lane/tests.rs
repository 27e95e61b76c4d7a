//! The client lane's unit tests: a list's descriptors joined, the PING and BYE answers it
//! accepts, and the buffer it keeps after a large frame.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{Lane, LaneFail, join_list};
use crate::io::{Inbound, Sock};
use crate::types::{Access, BatchDesc, MemType, WireDesc};
use crate::wire::{self, Hello, Kind, Welcome};

fn d(local: usize, region: u32, offset: u64, len: u64) -> BatchDesc {
    BatchDesc::of(local, region, offset, len)
}

/// A lane over a fresh connection on 127.0.0.1 (a port the OS chooses), and the
/// server's end of it.
fn lane_pair() -> (Lane, TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    let lane = Lane {
        sock: Sock::new(c).unwrap(),
        inb: Inbound::new(),
        out: Vec::new(),
        iov: Vec::new(),
        wire: Vec::new(),
        sent: VecDeque::new(),
        spare: Vec::new(),
    };
    (lane, s)
}

/// On the server's end `s`: reads one empty frame of kind `ask`, answers with a frame of
/// kind `answer` carrying `payload` bytes (as far as the client reads them).
fn answer(mut s: TcpStream, ask: Kind, answer: Kind, payload: usize) {
    use std::io::{Read, Write};
    let mut h = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = wire::decode_header(&h).unwrap();
    assert_eq!((h.kind, h.len), (ask, 0));
    let mut frame = wire::header(answer, payload).to_vec();
    frame.resize(wire::HEADER_LEN + payload, 0x5A);
    // a client that refused the answer closes its end before reading all of it
    let _ = s.write_all(&frame);
}

/// A PONG or BYE_ACK must be empty (the server's are): one with a payload is a protocol
/// error (the lane is dropped), its payload never read beyond what the lane's usual buffer
/// takes in (the buffer does not grow for it); empty ones are answers.
#[test]
fn a_pong_or_bye_ack_with_a_payload_breaks_the_protocol() {
    let deadline = || Instant::now() + Duration::from_secs(30);
    for (ask, ans) in [(Kind::Ping, Kind::Pong), (Kind::Bye, Kind::ByeAck)] {
        let run = |lane: &mut Lane| match ask {
            Kind::Ping => lane.ping(deadline()),
            _ => lane.bye(deadline()),
        };
        let (mut lane, s) = lane_pair();
        let server = std::thread::spawn(move || answer(s, ask, ans, 0));
        assert!(run(&mut lane).is_ok(), "an empty {ans:?}");
        server.join().unwrap();

        let (mut lane, s) = lane_pair();
        let server = std::thread::spawn(move || answer(s, ask, ans, 1 << 20));
        match run(&mut lane) {
            Err(LaneFail::Protocol(why)) => assert!(why.contains("payload"), "{why}"),
            r => panic!("{ans:?} with 1 MiB of payload: {r:?}"),
        }
        assert!(
            lane.inb.capacity() <= 64 << 10,
            "the payload was received: {} bytes of buffer",
            lane.inb.capacity()
        );
        drop(lane);
        server.join().unwrap();
    }
}

/// A large frame (a transport's setup answer, 1 MiB here; a WELCOME with a large table)
/// leaves the lane with its usual buffer, not one of the frame's size for the lane's life.
#[test]
fn a_lane_keeps_no_large_buffer_after_a_large_frame() {
    use std::io::Write;
    let (mut lane, mut s) = lane_pair();
    let mut frame = wire::header(Kind::UcxInfo, 1 << 20).to_vec();
    frame.resize(wire::HEADER_LEN + (1 << 20), 7);
    // and the start of the next frame, which stays buffered
    frame.extend_from_slice(&wire::header(Kind::Pong, 0)[..4]);
    let server = std::thread::spawn(move || s.write_all(&frame).map(|()| s));
    let deadline = Instant::now() + Duration::from_secs(30);
    let (k, p) = lane.recv_any(deadline).unwrap();
    assert_eq!((k, p.len()), (Kind::UcxInfo, 1 << 20));
    let mut s = server.join().unwrap().unwrap();
    assert!(
        lane.inb.capacity() <= 64 << 10,
        "{} bytes of buffer kept",
        lane.inb.capacity()
    );
    // the rest of the PONG arrives; the bytes kept are its start
    s.write_all(&wire::header(Kind::Pong, 0)[4..]).unwrap();
    assert!(matches!(lane.recv_any(deadline), Ok((Kind::Pong, p)) if p.is_empty()));

    // a WELCOME with a large table (40,000 regions, several times the usual buffer)
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut h = [0u8; wire::HEADER_LEN];
        std::io::Read::read_exact(&mut s, &mut h).unwrap();
        let h = wire::decode_header(&h).unwrap();
        assert_eq!(h.kind, Kind::Hello);
        let mut hello = vec![0u8; h.len as usize];
        std::io::Read::read_exact(&mut s, &mut hello).unwrap();
        let table = (1..=40_000u32)
            .map(|id| wire::TableEntry {
                id,
                addr: u64::from(id) << 20,
                len: 4096,
                mem_type: MemType::Host,
                access: Access::ReadWrite,
                fd: -1,
            })
            .collect();
        let mut out = Vec::new();
        let w = Welcome {
            instance: 1,
            token: 2,
            pid: 3,
            table,
            host: None,
            fence: -1,
            lane_fd: None,
        };
        w.encode(&mut out);
        assert!(out.len() > 4 * (64 << 10), "{} bytes", out.len());
        s.write_all(&out).unwrap();
        s
    });
    let hello = Hello {
        role: wire::LaneRole::NewLink,
        instance: 7,
        token: 0,
        name: "127.0.0.1:1".into(),
        target: addr.to_string(),
        host: None,
        nonce: [5; 32],
    };
    let (lane, w) = Lane::open(addr, &hello, None, deadline, |_| Ok(())).unwrap();
    assert_eq!(w.table.len(), 40_000);
    assert!(
        lane.inb.capacity() <= 64 << 10,
        "{} bytes of buffer kept after the WELCOME",
        lane.inb.capacity()
    );
    drop(server.join().unwrap());
}

/// Descriptors adjacent on both sides join; adjacent on one side only, or in another
/// region, they stay apart (local ranges that follow each other still join); the bytes
/// and their order are the list's.
#[test]
fn a_list_joins_runs_adjacent_on_both_sides() {
    let list = [
        d(1000, 1, 0, 64),
        d(1064, 1, 64, 64),   // joins: next local, next offset
        d(1128, 1, 128, 32),  // joins
        d(1160, 1, 4096, 64), // local adjacent, remote not: a new descriptor, same range
        d(5000, 1, 4160, 64), // remote adjacent, local not: a new descriptor and range
        d(5064, 2, 4224, 64), // local adjacent, another region
        d(5128, 2, 4288, 8),  // joins the one before
    ];
    let (mut wire, mut targets) = (vec![d(9, 9, 9, 9).remote], vec![]);
    join_list(&list, &mut wire, &mut targets);
    let w = |region, offset, len| WireDesc {
        region,
        offset,
        len,
    };
    assert_eq!(
        wire,
        [w(1, 0, 160), w(1, 4096, 64), w(1, 4160, 64), w(2, 4224, 72)]
    );
    let t: Vec<(usize, usize)> = targets.iter().map(|v| (v.base, v.len)).collect();
    assert_eq!(t, [(1000, 224), (5000, 136)]);
    let bytes = |it: &mut dyn Iterator<Item = u64>| it.sum::<u64>();
    assert_eq!(
        bytes(&mut wire.iter().map(|x| x.len)),
        bytes(&mut list.iter().map(|x| x.remote.len))
    );
}
