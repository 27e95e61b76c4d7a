//! The engine under LLM-DataDist: the core floor's handle API (`runtime::handle`: an engine and
//! its regions' records, links by remote name through `runtime::peers`), beside the compat face
//! rather than on it. A cache keeps its tensors' region records; a block pull or push resolves
//! the peer's tensors in the link's table once per tensor, and moves every tensor pair in one
//! checked block batch, a layout per pair over the same index arrays (`check::layouts`:
//! XFER_BLOCKS frames on the wire, the remote indices checked once by the server).

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::Error;
use crate::runtime::address::{self, AddrDesc};
use crate::runtime::check::{self, Layout, Local};
use crate::runtime::handle::{LinkHandle, RegionHandle};
pub(super) use crate::runtime::named::Buffer;
use crate::runtime::named::Named;
use crate::types::blocks::{BlockBatch, BlockIndices};
use crate::{Access, DetachedContext, MemDesc, MemType, Notify, Options, TransferOp};

/// A timeout in HIXL's milliseconds (≤ 0: `PARAM_INVALID`).
fn millis(ms: i32) -> Result<Duration, Error> {
    crate::timeout_from_millis(ms)
}

/// One tensor pair of a block batch: the local tensor's address and the peer's, each `len`
/// bytes long.
#[derive(Debug, Clone, Copy)]
pub(super) struct TensorPair {
    pub(super) local: usize,
    pub(super) remote: u64,
    pub(super) local_len: usize,
    pub(super) remote_len: u64,
}

/// A block move: block `local_idx[i]` of each pair's local tensor and block `remote_idx[i]` of
/// its remote tensor, blocks of `block` bytes, packed.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockMove<'a> {
    pub(super) op: TransferOp,
    pub(super) pairs: &'a [TensorPair],
    pub(super) block: u64,
    pub(super) local_idx: &'a [u64],
    pub(super) remote_idx: &'a [u64],
}

/// What a transfer moves: address descriptors (one READ or WRITE), or a block move.
#[derive(Debug, Clone, Copy)]
pub(super) enum Moved<'a> {
    Addrs(TransferOp, &'a [AddrDesc]),
    Blocks(BlockMove<'a>),
}

/// An engine and its links by remote name (finalized when dropped).
pub(super) struct DdEngine(Named);

impl DdEngine {
    /// An engine named `name` (`"ip:port"` listens there, port 0 on one the OS chooses;
    /// `"ip"` is a client only) with HIXL's options, open to links at once.
    ///
    /// # Errors
    /// The options' and the engine's start errors.
    pub(super) fn initialize(name: &str, options: &[(String, String)]) -> Result<Self, Error> {
        let opts = Options::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        Ok(DdEngine(Named::start(name, opts)?))
    }

    /// The engine's name as peers connect to it (with the port it got, for port 0).
    pub(super) fn local_engine(&self) -> String {
        self.0.core.name.clone()
    }

    /// The engine's device context, detached (what a rank-table link runs HCCL under).
    pub(super) fn detach_context(&self) -> DetachedContext {
        DetachedContext::new(self.0.core.id, self.0.core.device.clone())
    }

    /// A host buffer of `len` bytes that peers may access as `access` says.
    ///
    /// # Errors
    /// The allocation's or the registration's.
    pub(super) fn alloc_host_mem_with(&self, len: usize, access: Access) -> Result<Buffer, Error> {
        self.0.buffer(len, access)
    }

    /// Registers `len` bytes at `addr` of `mem_type`, read-write for peers.
    ///
    /// # Safety
    /// [`Engine::register_raw`]'s contract: the memory stays valid for reads and writes of any
    /// bytes until it is deregistered or the engine finalized, and peers and transfers access it
    /// meanwhile.
    ///
    /// # Errors
    /// [`Engine::register_raw`]'s.
    pub(super) unsafe fn register_mem(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<RegionHandle, Error> {
        let desc = MemDesc { addr, len };
        // SAFETY: the caller's contract.
        unsafe { self.0.core.register_raw(desc, mem_type, Access::ReadWrite) }
    }

    /// Ends a registration, through the core's one in-use rule (refused while a transfer of
    /// this engine uses it).
    ///
    /// # Errors
    /// [`Engine::deregister`]'s: a region of another engine, one in use.
    pub(super) fn deregister_mem(&self, r: &RegionHandle) -> Result<(), Error> {
        self.0.core.deregister(r)
    }

    /// Connects to the engine named `remote`: the link made (the engine holds it under that
    /// name; a caller that keeps it keeps the link it made, not whatever link the name reaches
    /// later).
    ///
    /// # Errors
    /// A bad name or timeout, `ALREADY_CONNECTED`, the connect's own.
    pub(super) fn connect(&self, remote: &str, timeout_ms: i32) -> Result<Arc<LinkHandle>, Error> {
        self.0.connect(remote, millis(timeout_ms)?)
    }

    /// Closes `link`, a link to `remote` [`DdEngine::connect`] made, telling the peer (one the
    /// engine let go of already, or a peer already gone, is not an error); a link that
    /// superseded it under that name stays.
    ///
    /// # Errors
    /// A bad name or timeout; the goodbye's other errors.
    pub(super) fn disconnect(
        &self,
        remote: &str,
        link: &Weak<LinkHandle>,
        timeout_ms: i32,
    ) -> Result<(), Error> {
        self.0.disconnect_link(remote, link, millis(timeout_ms)?)
    }

    /// Sends a notification on `link` (delivered after every transfer started before it on
    /// the link).
    ///
    /// # Errors
    /// A bad timeout, a name or message over 1024 bytes, a link gone, the peer's refusal.
    pub(super) fn send_notify(
        &self,
        link: &LinkHandle,
        name: &str,
        msg: &str,
        timeout_ms: i32,
    ) -> Result<(), Error> {
        let timeout = millis(timeout_ms)?;
        for (what, s) in [("name", name), ("message", msg)] {
            if s.len() > crate::notify::MAX_NOTIFY_LEN {
                return Err(Error::NotifyTooLong {
                    what,
                    len: s.len(),
                    limit: crate::notify::MAX_NOTIFY_LEN,
                });
            }
        }
        link.notify(name, msg, std::time::Instant::now(), timeout)
    }

    /// Every notification received so far, oldest first, with the name each sender's engine
    /// gave in its handshake.
    pub(super) fn take_notifies(&self) -> Vec<Notify> {
        self.0.core.notifies.drain()
    }

    /// A READ or WRITE on `link` (held by the caller: not looked up by name per move), waited
    /// for within `timeout`: a batch of address descriptors, or a block move (one checked block
    /// batch whose layouts are the tensor pairs, all checked before anything moves).
    ///
    /// # Errors
    /// The batch's checks (a tensor in no region of this engine or of the peer's table); the
    /// transfer's errors (a deadline missed: `TIMEOUT`).
    pub(super) fn transfer(
        &self,
        link: &LinkHandle,
        what: Moved<'_>,
        timeout: Duration,
    ) -> Result<(), Error> {
        let m = match what {
            Moved::Addrs(op, descs) => {
                let (xds, bytes) =
                    address::batch(&self.0.core, link, op, descs.iter().copied(), None)?;
                return link.run(op, &xds, bytes, timeout);
            }
            Moved::Blocks(m) => m,
        };
        let BlockMove {
            op,
            pairs,
            block,
            local_idx,
            remote_idx,
        } = m;
        // each tensor's region and the peer's table entry, once per tensor (not per block)
        // (the engine's regions locked once for every tensor's lookup)
        let spans = self.0.core.with_index(|ix| {
            (pairs.iter().enumerate())
                .map(|(index, p)| {
                    let region = ix.find(p.local, p.local_len).cloned().ok_or_else(|| {
                        Error::LocalNotRegistered {
                            index,
                            addr: p.local,
                            len: p.local_len,
                            why: " (a cache tensor)".into(),
                        }
                    })?;
                    let remote = link.remote(p.remote, p.remote_len)?;
                    Ok((region, p.local, p.local_len, remote))
                })
                .collect::<Result<Vec<_>, Error>>()
        })?;
        let layouts: Vec<Layout<'_>> = (spans.iter())
            .map(|(region, addr, len, remote)| Layout {
                local: Local {
                    core: region,
                    offset: addr - region.addr,
                    len: *len,
                },
                remote: *remote,
                block,
                local_stride: block,
                remote_stride: block,
            })
            .collect();
        // all checked before anything moves; then one batch: the same blocks of every tensor,
        // tensor after tensor (XFER_BLOCKS frames on one request's lanes over TCP, one copy
        // loop a tensor on the same host)
        if layouts.is_empty() {
            return Ok(()); // a cache of no tensor: nothing moves
        }
        let (local_idx, remote_idx) = (BlockIndices::U64(local_idx), BlockIndices::U64(remote_idx));
        let placed = check::layouts(link, op, &layouts, local_idx, remote_idx)?;
        let b = BlockBatch {
            layouts: &placed,
            local_idx,
            remote_idx,
        };
        link.run(op, b, b.bytes(), timeout)
    }

    /// Finalizes the engine: its links, listener and registrations end; the buffers it
    /// allocated get private pages.
    pub(super) fn finalize(&self) {
        self.0.finalize();
    }
}

#[cfg(test)]
mod tests {
    //! A block move of many tensor pairs over TCP: its frames (a tensor each) are pipelined on a
    //! lane (`transport::tcp::lane`), so these check that every tensor's blocks land where they
    //! should in both directions, past the lane's limits on unanswered requests, and that a
    //! request the server refuses in the middle of a pipeline fails the move and leaves the
    //! link usable.

    use super::*;
    use crate::error::Status;
    use crate::testkit::Rng;

    /// Tensors of `blocks` blocks of `block` bytes, as `Vec`s (registered raw by the tests).
    fn tensors(n: usize, blocks: usize, block: usize, seed: u64) -> Vec<Vec<u8>> {
        (0..n)
            .map(|t| Rng::new(seed + t as u64).bytes(blocks * block))
            .collect()
    }

    /// `n` distinct block indices below `blocks`, in random order.
    fn shuffled(rng: &mut Rng, blocks: usize, n: usize) -> Vec<u64> {
        let mut v: Vec<u64> = (0..blocks as u64).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, rng.below(i as u64 + 1) as usize);
        }
        v.truncate(n);
        v
    }

    /// A server engine and a client engine that links over TCP (same host off).
    fn engines() -> (DdEngine, DdEngine, String) {
        let server = DdEngine::initialize("127.0.0.1:0", &[]).unwrap();
        let off = [("hixl.SameHost".to_string(), "off".to_string())];
        let client = DdEngine::initialize("127.0.0.1", &off).unwrap();
        let name = server.local_engine();
        (server, client, name)
    }

    /// Registers each tensor with `e`.
    fn register(e: &DdEngine, ts: &mut [Vec<u8>]) -> Vec<RegionHandle> {
        ts.iter_mut()
            .map(|t| {
                // SAFETY: each tensor stays allocated, unmoved, until after its engine is
                // finalized at the end of the test; the tests touch its bytes only between
                // transfers (a sync transfer has ended when it returns).
                unsafe { e.register_mem(t.as_mut_ptr() as usize, t.len(), MemType::Host) }.unwrap()
            })
            .collect()
    }

    fn pairs(local: &[Vec<u8>], remote: &[Vec<u8>], which: &[usize]) -> Vec<TensorPair> {
        (which.iter())
            .map(|&t| TensorPair {
                local: local[t].as_ptr() as usize,
                remote: remote[t].as_ptr() as u64,
                local_len: local[t].len(),
                remote_len: remote[t].len() as u64,
            })
            .collect()
    }

    fn moved(
        e: &DdEngine,
        link: &LinkHandle,
        op: TransferOp,
        pairs: &[TensorPair],
        block: usize,
        local_idx: &[u64],
        remote_idx: &[u64],
    ) -> Result<(), Error> {
        let m = BlockMove {
            op,
            pairs,
            block: block as u64,
            local_idx,
            remote_idx,
        };
        e.transfer(link, Moved::Blocks(m), Duration::from_secs(10))
    }

    /// Block `from[i]` of each `src` tensor is block `to[i]` of its `dst` tensor.
    fn same_blocks(
        src: &[Vec<u8>],
        dst: &[Vec<u8>],
        which: &[usize],
        block: usize,
        from: &[u64],
        to: &[u64],
    ) {
        for &t in which {
            for (&f, &d) in from.iter().zip(to) {
                let (f, d) = (f as usize * block, d as usize * block);
                assert!(
                    src[t][f..f + block] == dst[t][d..d + block],
                    "tensor {t}: block {} should be block {}",
                    d / block,
                    f / block
                );
            }
        }
    }

    /// `n` tensors of `blocks` blocks of `block` bytes on each side: `picked` random blocks of
    /// each READ into random blocks, then `written` of them WRITTEN back with new bytes, every
    /// block compared; with `tiny`, over the smallest socket buffers (`io::tiny`).
    fn both_ways(n: usize, blocks: usize, block: usize, picked: usize, written: usize, tiny: bool) {
        let mut rng = Rng::new(n as u64);
        let mut srv = tensors(n, blocks, block, 100);
        let mut cli = vec![vec![0u8; blocks * block]; n];
        crate::io::tiny::TINY_LISTENER.set(tiny);
        let (server, client, name) = engines();
        crate::io::tiny::TINY_LISTENER.set(false);
        register(&server, &mut srv);
        register(&client, &mut cli);
        let link = client.connect(&name, 5000).unwrap();
        let all: Vec<usize> = (0..n).collect();
        let ps = pairs(&cli, &srv, &all);
        let (from, to) = (
            shuffled(&mut rng, blocks, picked),
            shuffled(&mut rng, blocks, picked),
        );
        moved(&client, &link, TransferOp::Read, &ps, block, &to, &from).unwrap();
        same_blocks(&srv, &cli, &all, block, &from, &to);
        // and back: other blocks of the client's, new bytes, into other blocks of the server's
        for (t, c) in cli.iter_mut().enumerate() {
            c.copy_from_slice(&Rng::new(500 + t as u64).bytes(blocks * block));
        }
        let (from, to) = (
            shuffled(&mut rng, blocks, written),
            shuffled(&mut rng, blocks, written),
        );
        moved(&client, &link, TransferOp::Write, &ps, block, &from, &to).unwrap();
        same_blocks(&cli, &srv, &all, block, &from, &to);
        client.finalize();
        server.finalize();
        if tiny {
            crate::io::tiny::forget();
        }
    }

    #[test]
    fn pipelined_block_moves_land_every_tensor_in_both_directions() {
        // 80 tensors: more requests than a lane leaves unanswered; 3000 indices of 8 bytes a
        // request: more than a READ's window, one request at a time
        both_ways(80, 16, 64, 12, 12, false);
        both_ways(5, 4096, 32, 3000, 3000, false);
    }

    #[test]
    fn a_pipelined_read_lands_with_the_smallest_socket_buffers() {
        // under memory pressure TCP gives a connection its smallest buffers (a few KiB): the
        // lane's unanswered READ requests (256 indices, 2 KiB each) no longer fit them while the
        // server sends a 1 MiB payload the lane has not started reading; the lane must read
        // replies while a request waits to go out, or both sides wait until the deadline (the
        // WRITE back moves a few blocks a tensor: the server's small receive buffer is slow)
        both_ways(32, 256, 4096, 256, 32, true);
    }

    #[test]
    fn a_request_refused_amid_a_pipeline_fails_the_move_and_leaves_the_link_usable() {
        let (n, blocks, block) = (10, 64, 128);
        let mut srv = tensors(n, blocks, block, 200);
        let mut cli = vec![vec![0u8; blocks * block]; n];
        let (server, client, name) = engines();
        let regions = register(&server, &mut srv);
        register(&client, &mut cli);
        let link = client.connect(&name, 5000).unwrap();
        // the client's table still has tensor 3 (fetched at connect): the server refuses the
        // request of that tensor, with requests for later tensors already sent behind it
        server.deregister_mem(&regions[3]).unwrap();
        let all: Vec<usize> = (0..n).collect();
        let rest: Vec<usize> = all.iter().copied().filter(|&t| t != 3).collect();
        let mut rng = Rng::new(9);
        for round in 0..3u64 {
            let (from, to) = (
                shuffled(&mut rng, blocks, 20),
                shuffled(&mut rng, blocks, 20),
            );
            let e = moved(
                &client,
                &link,
                TransferOp::Read,
                &pairs(&cli, &srv, &all),
                block,
                &to,
                &from,
            )
            .unwrap_err();
            assert_eq!(e.status(), Status::PARAM_INVALID, "{e}");
            // the same link, right after: every other tensor's blocks, read whole
            for c in cli.iter_mut() {
                c.fill(0);
            }
            for (t, s) in srv.iter_mut().enumerate() {
                if t != 3 {
                    s.copy_from_slice(&Rng::new(300 + round * 16 + t as u64).bytes(blocks * block));
                }
            }
            let ps = pairs(&cli, &srv, &rest);
            moved(&client, &link, TransferOp::Read, &ps, block, &to, &from).unwrap();
            same_blocks(&srv, &cli, &rest, block, &from, &to);
            // a WRITE refused the same way (the server closes that lane) changes nothing of the
            // deregistered tensor, and the next WRITE lands
            let before = srv[3].clone();
            for (t, c) in cli.iter_mut().enumerate() {
                c.copy_from_slice(&Rng::new(700 + round * 16 + t as u64).bytes(blocks * block));
            }
            let e = moved(
                &client,
                &link,
                TransferOp::Write,
                &pairs(&cli, &srv, &all),
                block,
                &from,
                &to,
            )
            .unwrap_err();
            assert_eq!(e.status(), Status::PARAM_INVALID, "{e}");
            assert!(srv[3] == before, "a deregistered tensor was written");
            moved(&client, &link, TransferOp::Write, &ps, block, &from, &to).unwrap();
            same_blocks(&cli, &srv, &rest, block, &from, &to);
        }
        client.finalize();
        server.finalize();
    }
}
