//! The peers the conformance cases run against, in the reader's process: an engine (HIXL) and
//! an LLM-DataDist cluster, each listening on 127.0.0.1 at a port the OS chose. Shared by
//! `tests/conformance/` and `hixl-capi/tests/conformance.rs` (which names the crate `hixl`).
#![allow(dead_code)]

use std::net::SocketAddr;

use hixl::compat;
use hixl::datadist::{CacheDesc, CacheKey, CacheKind, DataDist, DataType, Placement, Role};

/// The peer cluster's id, and this side's.
pub const PEER: u64 = 1;
pub const ME: u64 = 2;
/// Tensors per cache; a blocks cache's shape ([16, 32] int32: 16 blocks of 128 bytes) and a
/// cache of batches' ([4, 64] int32: 4 batches of 256 bytes).
pub const TENSORS: usize = 4;
pub const BLOCKS_SHAPE: [i64; 2] = [16, 32];
pub const BATCHES_SHAPE: [i64; 2] = [4, 64];

/// A cache's description of `shape` (int32, host memory, four tensors).
pub fn desc(shape: &[i64]) -> CacheDesc {
    CacheDesc {
        placement: Placement::Host,
        num_tensors: TENSORS as u32,
        data_type: DataType::INT32,
        shape: shape.to_vec(),
    }
}

/// Bytes of one tensor of `shape` (int32).
pub fn tensor_bytes(shape: &[i64]) -> usize {
    shape.iter().product::<i64>() as usize * 4
}

/// Four tensors of `shape`, each its own allocation, filled with `seed`'s bytes.
pub fn tensors(shape: &[i64], seed: u8) -> Vec<Vec<u8>> {
    let n = tensor_bytes(shape);
    (0..TENSORS)
        .map(|t| (0..n).map(|i| (i as u8) ^ seed ^ (t as u8) << 4).collect())
        .collect()
}

/// The peer cluster: its blocks cache (under `BlocksCacheKey` model 0) and cache of batches
/// (batch 0 under `CacheKey` request 7 model 1).
pub struct DdPeer {
    pub dd: DataDist,
    pub addr: SocketAddr,
    pub blocks_id: i64,
    pub batches_id: i64,
    _mem: Vec<Vec<u8>>,
}

impl DdPeer {
    pub fn start() -> DdPeer {
        let dd = DataDist::new(PEER, Role::Prompt);
        dd.initialize(&[("llm.ListenIpInfo".into(), "127.0.0.1:0".into())])
            .expect("the peer initializes");
        let addr = dd.listen_addr().expect("the peer listens");
        let mut mem = tensors(&BLOCKS_SHAPE, 0x5a);
        mem.extend(tensors(&BATCHES_SHAPE, 0xa5));
        let addrs: Vec<u64> = mem.iter_mut().map(|t| t.as_mut_ptr() as u64).collect();
        let blocks_key = CacheKey {
            req_id: u64::MAX,
            model_id: 0,
        };
        let request = CacheKey {
            req_id: 7,
            model_id: 1,
        };
        // SAFETY: `mem` is moved into the peer (its heap buffers do not move), which finalizes
        // the instance before it drops them (`Drop`); nothing else touches them.
        let blocks_id = unsafe {
            dd.register_cache(
                &desc(&BLOCKS_SHAPE),
                &addrs[..TENSORS],
                CacheKind::Blocks,
                0,
                &[blocks_key],
            )
        }
        .expect("the peer's blocks cache");
        // SAFETY: as above.
        let batches_id = unsafe {
            dd.register_cache(
                &desc(&BATCHES_SHAPE),
                &addrs[TENSORS..],
                CacheKind::Cache,
                0,
                &[request],
            )
        }
        .expect("the peer's cache of batches");
        DdPeer {
            dd,
            addr,
            blocks_id,
            batches_id,
            _mem: mem,
        }
    }
}

impl Drop for DdPeer {
    fn drop(&mut self) {
        self.dd.finalize();
    }
}

/// The peer engine: its name and the address of its one registered region
/// ([`REGION`] bytes).
pub struct EnginePeer {
    pub engine: compat::Hixl,
    pub name: String,
    pub region: usize,
    _mem: compat::HostMem,
}

/// Bytes of the peer's region (and of this side's, in the engine cases).
pub const REGION: usize = 4096;

impl EnginePeer {
    pub fn start() -> EnginePeer {
        let engine = compat::Hixl::new();
        engine
            .initialize("127.0.0.1:0", Vec::<(String, String)>::new())
            .expect("the peer engine initializes");
        let name = engine.local_engine().expect("its name");
        let mem = engine.alloc_host_mem(REGION).expect("its region");
        EnginePeer {
            region: mem.addr(),
            engine,
            name,
            _mem: mem,
        }
    }
}

impl Drop for EnginePeer {
    fn drop(&mut self) {
        self.engine.finalize();
    }
}
