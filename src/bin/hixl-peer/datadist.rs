//! `datadist-serve`: an LLM-DataDist prompt cluster in its own process, through the typed
//! layer (`hixl::datadist::typed`), for the two-process tests of `tests/datadist/datadist_typed.rs`.
//!
//! It listens on `127.0.0.1:0`, registers one blocks cache of `--tensors` tensors of
//! `--blocks` blocks of `--block` bytes (tensor `t` holds the `testkit::Rng` bytes of
//! `--seed + t`) under `BlocksCacheKey` model `--model`, and prints `READY <ip:port> <cache id>
//! <pid>`. Then, one command per line on standard input:
//! - `sum T OFF LEN`: `SUM <fnv1a of those bytes of tensor T, hex>` (registered or not);
//! - `unregister`: unregisters the cache (its memory comes back) and prints `UNREGISTERED`;
//! - `link ID IP:PORT`: links to cluster `ID` listening there (`link_clusters`, which tells it
//!   where to link back) and prints `LINKED <LLM status>`;
//! - `write NAME ADDR LEN SEED`: a plain engine of this process (`hixl::compat::Hixl`, made at
//!   the first `write`) connects to the engine `NAME`, WRITEs the `Rng` bytes of `SEED` to
//!   `LEN` bytes at `ADDR` there, disconnects, and prints `WROTE <HIXL status, 0 for Ok>`;
//! - `quit` (or the end of input): finalizes and exits.

use std::io::{BufRead, Write};

use hixl::HostBuffer;
use hixl::datadist::typed::{Cluster, Layout, Prompt};
use hixl::datadist::{CacheDesc, CacheKey, ClusterInfo, DataType, LlmStatus, Placement};
use hixl::testkit::{Rng, fnv1a};

/// `datadist-serve`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The cluster id
    #[arg(long, default_value_t = 7)]
    cluster: u64,
    /// Tensors of the cache
    #[arg(long, default_value_t = 4)]
    tensors: u32,
    /// Blocks per tensor
    #[arg(long, default_value_t = 64)]
    blocks: u64,
    /// Bytes per block (even: the cache holds FLOAT16)
    #[arg(long, default_value_t = 4096)]
    block: u64,
    /// The seed of tensor 0's bytes (tensor t: seed + t)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The model id of its BlocksCacheKey
    #[arg(long, default_value_t = 9)]
    model: u64,
}

type Failure = Box<dyn std::error::Error>;

pub fn datadist_serve(a: Args) -> Result<(), Failure> {
    let listen = [("llm.ListenIpInfo", "127.0.0.1:0")];
    Cluster::<Prompt>::scope(a.cluster, &listen, |cluster| -> Result<(), Failure> {
        let desc = CacheDesc {
            placement: Placement::Host,
            num_tensors: a.tensors,
            data_type: DataType::FLOAT16,
            shape: vec![a.blocks as i64, (a.block / 2) as i64],
        };
        let len = (a.blocks * a.block) as usize;
        let tensors = (0..u64::from(a.tensors))
            .map(|t| HostBuffer::from_slice(&Rng::new(a.seed + t).bytes(len)))
            .collect::<Result<Vec<_>, _>>()?;
        let key = CacheKey {
            req_id: u64::MAX,
            model_id: a.model,
        };
        let mut cache = Some(cluster.register_cache(&desc, Layout::Blocks, tensors, &[key])?);
        let mut back: Vec<HostBuffer> = Vec::new();
        let mut writer: Option<Writer> = None;
        let addr = cluster.listen_addr().ok_or("the cluster does not listen")?;
        let mut out = std::io::stdout().lock();
        let id = cache.as_ref().map_or(0, |c| c.id());
        writeln!(out, "READY {addr} {id} {}", std::process::id())?;
        out.flush()?;
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["sum", t, off, n] => {
                    let (t, off, n): (usize, usize, usize) = (t.parse()?, off.parse()?, n.parse()?);
                    let mut buf = vec![0u8; n];
                    match cache.as_mut() {
                        Some(c) => c.read_at(t, off as u64, &mut buf)?,
                        None => buf.copy_from_slice(
                            back.get(t)
                                .and_then(|b| b.get(off..off + n))
                                .ok_or("out of range")?,
                        ),
                    }
                    writeln!(out, "SUM {:016x}", fnv1a(&buf))?;
                }
                ["unregister"] => {
                    if let Some(c) = cache.take() {
                        back = c.unregister().map_err(|r| r.error)?;
                    }
                    writeln!(out, "UNREGISTERED")?;
                }
                ["link", id, addr] => {
                    let status = link(cluster.as_runtime(), id.parse()?, addr.parse()?);
                    writeln!(out, "LINKED {:#x}", status.code())?;
                }
                ["write", name, addr, n, seed] => {
                    let w = writer.get_or_insert_with(Writer::default);
                    let status = w.write(name, addr.parse()?, n.parse()?, seed.parse()?)?;
                    writeln!(out, "WROTE {status}")?;
                }
                ["quit"] => break,
                _ => writeln!(out, "ERR unknown command {line:?}")?,
            }
            out.flush()?;
        }
        drop(cache);
        cluster.finalize();
        Ok(())
    })?
}

/// Links `dd` to cluster `id` at `addr`: its status.
fn link(dd: &hixl::datadist::DataDist, id: u64, addr: std::net::SocketAddr) -> LlmStatus {
    let c = ClusterInfo::at(id, addr);
    match dd.link_clusters(&[c], 10_000) {
        Ok((status, _)) => status,
        Err(e) => e.status,
    }
}

/// The plain engine of `write`, and the buffer it WRITEs from.
#[derive(Default)]
struct Writer {
    engine: Option<(hixl::compat::Hixl, Vec<u8>)>,
}

impl Writer {
    /// WRITEs the `Rng` bytes of `seed` to `len` bytes at `addr` of the engine `name`: the HIXL
    /// status (0 for Ok) of the connect or the WRITE.
    fn write(&mut self, name: &str, addr: usize, len: usize, seed: u64) -> Result<u32, Failure> {
        use hixl::compat::{Hixl, MemDesc, TransferOpDesc};
        if self.engine.as_ref().is_none_or(|(_, b)| b.len() < len) {
            let e = Hixl::new();
            e.initialize("127.0.0.1", [("AutoConnect", "0")])?;
            let mut buf = vec![0u8; len];
            let desc = MemDesc {
                addr: buf.as_mut_ptr() as usize,
                len,
                local_only: false,
            };
            // SAFETY: the buffer's heap block is owned by `self.engine` beside the engine and
            // dropped after it (the tuple's fields drop in order: the engine finalizes first);
            // it is written below only while no transfer runs, and no peer connects to this
            // client-only engine.
            unsafe { e.register_mem(desc, hixl::MemType::Host) }?;
            self.engine = Some((e, buf));
        }
        let (e, buf) = self.engine.as_mut().ok_or("no engine")?;
        buf[..len].copy_from_slice(&Rng::new(seed).bytes(len));
        if let Err(err) = e.connect(name, 10_000) {
            return Ok(err.status().code());
        }
        let d = TransferOpDesc {
            local_addr: buf.as_ptr() as usize,
            remote_addr: addr,
            len,
        };
        let r = e.transfer_sync(name, hixl::TransferOp::Write, &[d], 10_000);
        let _ = e.disconnect(name, 10_000);
        Ok(r.map_or_else(|err| err.status().code(), |()| 0))
    }
}
