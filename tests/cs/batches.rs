//! Batches (`HixlCSClientBatch{Put,Get}{Sync,Async}`, `QueryCompleteStatus`): random data both
//! ways, the address checks with their exact statuses, the completion table's limit, and the
//! failure latch.

use std::net::Ipv4Addr;
use std::time::Duration;

use hixl::cs::{Client, CompleteStatus, Completion, MAX_HANDLES, OpDesc, Server};
use hixl::{Status, TransferOp};

use super::support::{Buf, client_with, connected, listening, serve, status, wait};
use crate::common::Rng;

const SECOND: Duration = Duration::from_secs(1);
const KV: usize = 1 << 20;

/// A server with two regions of `KV` bytes (kv0 seeded), a connected client with 4 MiB of its
/// own registered.
struct Pair {
    server: Server,
    client: Client,
    kv0: Buf,
    kv1: Buf,
    local: Buf,
    port: u16,
}

fn pair() -> Pair {
    let (mut kv0, mut kv1) = (Buf::new(KV), Buf::new(KV));
    kv0.write(0, &Rng::new(7).bytes(KV));
    let (server, port) = listening(|s| {
        serve(s, "kv0", &mut kv0);
        serve(s, "kv1", &mut kv1);
    });
    let client = connected(port);
    let mut local = Buf::new(4 << 20);
    super::support::local(&client, &mut local);
    Pair {
        server,
        client,
        kv0,
        kv1,
        local,
        port,
    }
}

fn desc(remote: usize, local: usize, len: usize) -> OpDesc {
    OpDesc {
        remote_addr: remote as u64,
        local_addr: local,
        len: len as u64,
    }
}

#[test]
fn random_data_put_and_get_sync_and_async() {
    let mut p = pair();
    let (kv0, kv1, local) = (p.kv0.addr(), p.kv1.addr(), p.local.addr());
    // sync PUT of random data to kv0 at three offsets, then GET back elsewhere
    let offs = [0usize, 12_345, KV / 2 + 7];
    let lens = [4096usize, 65_536 + 3, KV / 4];
    let data = Rng::new(21).bytes(lens.iter().sum());
    p.local.write(0, &data);
    let (mut put, mut get, mut at) = (Vec::new(), Vec::new(), 0);
    for (&off, &len) in offs.iter().zip(&lens) {
        put.push(desc(kv0 + off, local + at, len));
        get.push(desc(kv0 + off, local + (2 << 20) + at, len));
        at += len;
    }
    p.client
        .batch_sync(TransferOp::Write, &put, 10 * SECOND)
        .unwrap();
    let mut at = 0;
    for (&off, &len) in offs.iter().zip(&lens) {
        assert_eq!(p.kv0.read(off, len), data[at..at + len], "kv0 {off}+{len}");
        at += len;
    }
    p.client
        .batch_sync(TransferOp::Read, &get, 10 * SECOND)
        .unwrap();
    assert_eq!(p.local.read(2 << 20, data.len()), data);
    // GET of the server's own bytes
    let seeded = Rng::new(7).bytes(KV);
    let pg = desc(kv0 + KV - 1000, local + (3 << 20), 1000);
    p.client
        .batch_sync(TransferOp::Read, &[pg], 10 * SECOND)
        .unwrap();
    assert_eq!(p.local.read(3 << 20, 1000), seeded[KV - 1000..]);

    // async PUT to kv1, async GET back
    let data = Rng::new(22).bytes(100_000);
    p.local.write(0, &data);
    let h = (p.client)
        .batch_async(TransferOp::Write, &[desc(kv1 + 333, local, 100_000)])
        .unwrap();
    assert_eq!(wait(&p.client, h), CompleteStatus::Completed);
    assert_eq!(p.kv1.read(333, 100_000), data);
    let h = (p.client)
        .batch_async(
            TransferOp::Read,
            &[desc(kv1 + 333, local + (1 << 20), 100_000)],
        )
        .unwrap();
    assert_eq!(wait(&p.client, h), CompleteStatus::Completed);
    assert_eq!(p.local.read(1 << 20, 100_000), data);
    p.client.close();
    p.server.close();
}

#[test]
fn bad_batches_move_nothing_and_do_not_latch() {
    let mut p = pair();
    let (kv0, kv1, local, lsize) = (p.kv0.addr(), p.kv1.addr(), p.local.addr(), p.local.len());
    let c = &p.client;
    let mut unregistered = Buf::new(64);
    let bad = [
        desc(kv0, local, 0),                // length 0
        desc(kv0, local + lsize - 8, 16),   // local past its range's end
        desc(kv0, unregistered.addr(), 16), // local not registered
        desc(kv0 + KV - 8, local, 16),      // remote past kv0's end
        desc(0x10, local, 16),              // remote outside every range
        desc(usize::MAX - 4, local, 16),    // remote wraps
        desc(kv0, local, usize::MAX / 2),   // longer than every range
    ];
    for d in bad {
        for op in [TransferOp::Write, TransferOp::Read] {
            assert_eq!(
                status(c.batch_sync(op, &[d], SECOND)),
                Status::PARAM_INVALID,
                "{op:?} {d:?}"
            );
            assert_eq!(
                status(c.batch_async(op, &[d])),
                Status::PARAM_INVALID,
                "{op:?} {d:?}"
            );
        }
    }
    // a bad descriptor after a good one: the whole batch is refused, nothing moves
    p.local.write(0, &[0xaa; 16]);
    let good = desc(kv1, local, 16);
    assert_eq!(
        status(c.batch_sync(TransferOp::Write, &[good, bad[4]], SECOND)),
        Status::PARAM_INVALID
    );
    assert_eq!(p.kv1.read(0, 16), [0; 16]);
    assert_eq!(
        status(c.batch_sync(TransferOp::Write, &[], SECOND)),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(c.batch_async(TransferOp::Read, &[])),
        Status::PARAM_INVALID
    );
    assert_eq!(
        status(c.query(Completion::from_raw(0x4242))),
        Status::PARAM_INVALID
    );
    // not latched: a good batch moves
    c.batch_sync(TransferOp::Write, &[good], SECOND).unwrap();
    assert_eq!(p.kv1.read(0, 16), [0xaa; 16]);
    let h = c.batch_async(TransferOp::Read, &[good]).unwrap();
    assert_eq!(wait(c, h), CompleteStatus::Completed);
    p.client.close();
    p.server.close();
}

#[test]
fn completions_not_yet_reported_are_bounded() {
    let mut p = pair();
    let (kv1, local) = (p.kv1.addr(), p.local.addr());
    let c = &p.client;
    let small = |i: usize| desc(kv1 + i * 8 % KV, local, 8);
    let many: Vec<_> = (0..MAX_HANDLES)
        .map(|i| c.batch_async(TransferOp::Read, &[small(i)]).unwrap())
        .collect();
    for op in [TransferOp::Read, TransferOp::Write] {
        assert_eq!(
            status(c.batch_async(op, &[small(0)])),
            Status::RESOURCE_EXHAUSTED
        );
    }
    // a sync batch needs no completion
    c.batch_sync(TransferOp::Read, &[small(1)], 5 * SECOND)
        .unwrap();
    for h in many {
        assert_eq!(wait(c, h), CompleteStatus::Completed);
    }
    let h = c.batch_async(TransferOp::Read, &[small(2)]).unwrap();
    assert_eq!(wait(c, h), CompleteStatus::Completed);
    p.client.close();
    p.server.close();
}

/// A batch that timed out latches its client: every later batch is FAILED; bad arguments stay
/// PARAM_INVALID; another client of the same server is not latched. (A batch timed out against
/// a stopped server: `two_processes.rs`.)
#[test]
fn a_timed_out_batch_latches_its_client() {
    let mut p = pair();
    let (kv1, local) = (p.kv1.addr(), p.local.addr());
    let d = desc(kv1, local, 8);
    let c = &p.client;
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[d], Duration::ZERO)),
        Status::TIMEOUT
    );
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[d], SECOND)),
        Status::FAILED
    );
    assert_eq!(
        status(c.batch_async(TransferOp::Write, &[d])),
        Status::FAILED
    );
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[], SECOND)),
        Status::PARAM_INVALID
    );
    let other = client_with(p.port, Ipv4Addr::LOCALHOST, None);
    other.connect(5 * SECOND).unwrap();
    super::support::local(&other, &mut p.local);
    other
        .batch_sync(TransferOp::Read, &[d], 5 * SECOND)
        .unwrap();
    other.close();
    p.client.close();
    p.server.close();
}

#[test]
fn a_closed_client_refuses_every_call() {
    let mut p = pair();
    let (kv1, local) = (p.kv1.addr(), p.local.addr());
    let d = desc(kv1, local, 8);
    let h = p.client.batch_async(TransferOp::Read, &[d]).unwrap();
    p.client.close();
    let c = &p.client;
    assert_eq!(status(c.connect(SECOND)), Status::FAILED);
    assert_eq!(status(c.remote_mems(SECOND)), Status::FAILED);
    assert_eq!(
        status(c.batch_sync(TransferOp::Read, &[d], SECOND)),
        Status::FAILED
    );
    assert_eq!(
        status(c.batch_async(TransferOp::Read, &[d])),
        Status::FAILED
    );
    assert_eq!(status(c.query(h)), Status::FAILED);
    // SAFETY: never registered (the client is closed).
    assert_eq!(status(unsafe { c.register(p.local.mem()) }), Status::FAILED);
    p.server.close();
}

/// A range the server stopped serving (it deregistered it after the client imported its list)
/// is refused alike in a sync batch (`PARAM_INVALID`) and an async one (its query `FAILED`),
/// and neither latches the client: the next batch into a range still served moves, as
/// upstream latches only on a batch that failed or timed out.
#[test]
fn a_range_the_server_stopped_serving_fails_without_latching() {
    let (mut kv0, mut kv1) = (Buf::new(KV), Buf::new(KV));
    let mut gone = None;
    let (server, port) = listening(|s| {
        serve(s, "kv0", &mut kv0);
        gone = Some(serve(s, "kv1", &mut kv1));
    });
    let c = connected(port);
    let mut local = Buf::new(KV);
    super::support::local(&c, &mut local);
    server.deregister(gone.unwrap()).unwrap();
    local.write(0, &Rng::new(11).bytes(64));
    let (stale, good) = (
        desc(kv1.addr(), local.addr(), 64),
        desc(kv0.addr(), local.addr(), 64),
    );
    assert_eq!(
        status(c.batch_sync(TransferOp::Write, &[stale], SECOND)),
        Status::PARAM_INVALID
    );
    c.batch_sync(TransferOp::Write, &[good], SECOND).unwrap();
    let h = c.batch_async(TransferOp::Write, &[stale]).unwrap();
    assert_eq!(wait(&c, h), CompleteStatus::Failed);
    assert_eq!(
        kv1.read(0, 64),
        [0; 64],
        "a range no longer served was written"
    );
    // not latched: the next batches move
    kv0.write(0, &[0; 64]);
    c.batch_sync(TransferOp::Write, &[good], SECOND).unwrap();
    assert_eq!(kv0.read(0, 64), local.read(0, 64));
    let h = c.batch_async(TransferOp::Read, &[good]).unwrap();
    assert_eq!(wait(&c, h), CompleteStatus::Completed);
    c.close();
    server.close();
}
