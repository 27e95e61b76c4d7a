//! `datadist-serve`: an LLM-DataDist prompt cluster in its own process, through the typed
//! layer (`hixl::datadist::typed`), for the two-process tests of `tests/datadist/datadist_typed.rs`.
//!
//! It listens on `127.0.0.1:0`, registers one blocks cache of `--tensors` tensors of
//! `--blocks` blocks of `--block` bytes (tensor `t` holds the `testkit::Rng` bytes of
//! `--seed + t`) under `BlocksCacheKey` model `--model`, and prints `READY <ip:port> <cache id>
//! <pid>`. Then, one command per line on standard input:
//! - `sum T OFF LEN`: `SUM <fnv1a of those bytes of tensor T, hex>` (registered or not);
//! - `unregister`: unregisters the cache (its memory comes back) and prints `UNREGISTERED`;
//! - `quit` (or the end of input): finalizes and exits.

use std::io::{BufRead, Write};

use hixl::HostBuffer;
use hixl::datadist::typed::{Cluster, Layout, Prompt};
use hixl::datadist::{CacheDesc, CacheKey, DataType, Placement};
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
