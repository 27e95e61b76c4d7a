//! The submodule `hixl._hixl.datadist`: the native half of the Python package `llm_datadist`
//! (CANN's LLM-DataDist), over [`hixl::datadist::DataDist`].
//!
//! It plays the part of CANN's `llm_datadist_wrapper`: plain functions on ints, strings, lists
//! and tuples that return LLM-DataDist's status codes (`0`, `0x5010B005`, ...) or
//! `(status, value)` tuples and never raise for an LLM-DataDist error; the message of the last
//! failure on the calling thread is `last_error_message()` (of `hixl._hixl`). The package's
//! Python layer (`llm_datadist/v2/*.py`) checks the arguments as CANN's does and raises
//! `LLMException` with the status. Every call that can block (initialize, finalize, role
//! changes, links, registrations, pulls and pushes) releases the GIL.
//!
//! A malformed argument the Python layer let through (a negative id, a wrong type) raises
//! `TypeError` / `OverflowError` from the conversion, never reaches the instance.

use std::net::IpAddr;
use std::sync::Arc;

use hixl::datadist::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataDist as Core, DataType, Error, IpInfo, Layers,
    LlmStatus, Placement, RemoteCache, Role,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::set_last_error;

/// The status of a result, recording its message for `last_error_message()`.
fn status<T>(r: &Result<T, Error>) -> u32 {
    match r {
        Ok(_) => LlmStatus::LLM_SUCCESS.code(),
        Err(e) => {
            set_last_error(e.message.clone());
            e.status.code()
        }
    }
}

/// The `(key, value)` pairs of a `dict[str, str]` (`None`: none).
fn options_of(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    let Some(o) = obj else {
        return Ok(Vec::new());
    };
    if o.is_none() {
        return Ok(Vec::new());
    }
    let d = o
        .downcast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("options must be a dict[str, str]"))?;
    let mut v = Vec::with_capacity(d.len());
    for (k, val) in d.iter() {
        v.push((k.extract::<String>()?, val.extract::<String>()?));
    }
    Ok(v)
}

fn role_of(v: i32) -> PyResult<Role> {
    Role::from_value(v).ok_or_else(|| PyValueError::new_err(format!("role {v}: 1, 2 or 3")))
}

/// One cluster as the Python layer packs it: `(remote_cluster_id, remote_role_type,
/// [(local_ip, port)], [(remote_ip, port)])`, addresses as text.
type ClusterTuple = (u64, i32, Vec<(String, u16)>, Vec<(String, u16)>);

fn clusters_of(v: Vec<ClusterTuple>) -> PyResult<Vec<ClusterInfo>> {
    let ips = |l: Vec<(String, u16)>| -> PyResult<Vec<IpInfo>> {
        l.into_iter()
            .map(|(ip, port)| {
                let ip: IpAddr = ip
                    .parse()
                    .map_err(|_| PyValueError::new_err(format!("{ip:?} is not an IP address")))?;
                Ok(IpInfo { ip, port })
            })
            .collect()
    };
    v.into_iter()
        .map(|(id, role, local, remote)| {
            Ok(ClusterInfo {
                remote_cluster_id: id,
                remote_role_type: role,
                local_ip_infos: ips(local)?,
                remote_ip_infos: ips(remote)?,
            })
        })
        .collect()
}

/// A peer's cache as the Python layer packs it: `(0, cluster, cache_id, batch_index)`
/// (`CacheKeyByIdAndIndex`), `(1, cluster, model_id, 0)` (`BlocksCacheKey`), `(2, cluster,
/// req_id, model_id)` (`CacheKey`).
fn remote_of(k: (u32, u64, u64, u64)) -> PyResult<RemoteCache> {
    let (kind, cluster_id, a, b) = k;
    Ok(match kind {
        0 => RemoteCache::ById {
            cluster_id,
            cache_id: i64::try_from(a)
                .map_err(|_| PyValueError::new_err(format!("cache id {a} is not an int64")))?,
            batch_index: u32::try_from(b)
                .map_err(|_| PyValueError::new_err(format!("batch index {b} is not a uint32")))?,
        },
        1 => RemoteCache::Blocks {
            cluster_id,
            model_id: a,
        },
        2 => RemoteCache::Request {
            cluster_id,
            req_id: a,
            model_id: b,
        },
        _ => return Err(PyValueError::new_err(format!("cache key kind {kind}"))),
    })
}

fn layers_of(src: Option<(u32, u32)>, dst: Option<(u32, u32)>, per_layer: u32) -> Layers {
    Layers {
        src,
        dst,
        per_layer,
    }
}

/// One LLM-DataDist instance (a cluster): `DataDist(cluster_id, role)`, role 1 (prompt),
/// 2 (decoder) or 3 (mix). Thread-safe; the Python layer keeps one per process, as CANN's.
#[pyclass(module = "hixl._hixl.datadist", name = "DataDist", frozen)]
pub struct PyDataDist {
    dd: Arc<Core>,
}

impl Drop for PyDataDist {
    fn drop(&mut self) {
        let dd = self.dd.clone();
        // collected while initialized: finalize without the GIL (it waits for transfers)
        Python::with_gil(|py| py.allow_threads(move || dd.finalize()));
    }
}

#[pymethods]
impl PyDataDist {
    #[new]
    fn new(cluster_id: u64, role: i32) -> PyResult<Self> {
        Ok(Self {
            dd: Arc::new(Core::new(cluster_id, role_of(role)?)),
        })
    }

    /// The cluster id.
    #[getter]
    fn cluster_id(&self) -> u64 {
        self.dd.cluster_id()
    }

    /// The role's value (1, 2, 3).
    #[getter]
    fn role(&self) -> i32 {
        self.dd.role() as i32
    }

    /// `initialize(options: dict[str, str]) -> int` (CANN's option keys; a second call
    /// succeeds and changes nothing).
    #[pyo3(signature = (options = None))]
    fn initialize(&self, py: Python<'_>, options: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
        let opts = options_of(options)?;
        let dd = self.dd.clone();
        Ok(py.allow_threads(move || status(&dd.initialize(&opts))))
    }

    /// `finalize()`: every link goes, every cache is deregistered. Safe twice.
    fn finalize(&self, py: Python<'_>) {
        let dd = self.dd.clone();
        py.allow_threads(move || dd.finalize());
    }

    /// `set_role(role, options) -> int`.
    #[pyo3(signature = (role, options = None))]
    fn set_role(
        &self,
        py: Python<'_>,
        role: i32,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let role = role_of(role)?;
        let opts = options_of(options)?;
        let dd = self.dd.clone();
        Ok(py.allow_threads(move || status(&dd.set_role(role, &opts))))
    }

    /// `link_clusters([(id, role, [(ip, port)], [(ip, port)])], timeout_ms) -> (int, [int])`.
    fn link_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<ClusterTuple>,
        timeout_ms: i32,
    ) -> PyResult<(u32, Vec<u32>)> {
        let clusters = clusters_of(clusters)?;
        let dd = self.dd.clone();
        let r = py.allow_threads(move || dd.link_clusters(&clusters, timeout_ms));
        let c = status(&r);
        Ok(match r {
            Ok((last, rets)) => (last.code(), rets.into_iter().map(|s| s.code()).collect()),
            Err(_) => (c, Vec::new()),
        })
    }

    /// `unlink_clusters([(id, role, [(ip, port)], [(ip, port)])], timeout_ms, force) -> (int,
    /// [int])`.
    fn unlink_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<ClusterTuple>,
        timeout_ms: i32,
        force: bool,
    ) -> PyResult<(u32, Vec<u32>)> {
        let clusters = clusters_of(clusters)?;
        let dd = self.dd.clone();
        let r = py.allow_threads(move || dd.unlink_clusters(&clusters, timeout_ms, force));
        let c = status(&r);
        Ok(match r {
            Ok((last, rets)) => (last.code(), rets.into_iter().map(|s| s.code()).collect()),
            Err(_) => (c, Vec::new()),
        })
    }

    /// `link_comm(comm_name, [(cluster_id, rank)], rank_table) -> (int, comm_id)`: CANN's
    /// explicit-rank-table link (HCCL's rendezvous, then engine links by what it exchanged);
    /// comm id -1 on failure.
    fn link_comm(
        &self,
        py: Python<'_>,
        comm_name: String,
        clusters: Vec<(u64, u32)>,
        rank_table: String,
    ) -> (u32, i64) {
        let dd = self.dd.clone();
        let r = py.allow_threads(move || dd.link_comm(&comm_name, &clusters, &rank_table));
        (status(&r), r.unwrap_or(-1))
    }

    /// `query_register_mem_status(comm_id) -> (int, 0 OK / 1 PREPARING / 2 FAILED)` (-1 on
    /// failure).
    fn query_register_mem_status(&self, py: Python<'_>, comm_id: i64) -> (u32, i32) {
        let dd = self.dd.clone();
        let r = py.allow_threads(move || dd.query_register_mem_status(comm_id));
        (status(&r), r.map(|s| s.value()).unwrap_or(-1))
    }

    /// `unlink_comm(comm_id) -> int`: waits for a link still being made to give up (at most
    /// `llm.LinkTotalTime`), without the GIL.
    fn unlink_comm(&self, py: Python<'_>, comm_id: i64) -> u32 {
        let dd = self.dd.clone();
        status(&py.allow_threads(move || dd.unlink_comm(comm_id)))
    }

    /// Whether cluster `cluster_id` is linked.
    fn is_linked(&self, cluster_id: u64) -> bool {
        self.dd.is_linked(cluster_id)
    }

    /// `register_cache(placement, num_tensors, data_type, shape, addrs, kind, batch_dim,
    /// [(req_id, model_id)]) -> (int, cache_id)`; kind 0 a cache of batches, 1 blocks; cache id
    /// -1 on failure. The tensors must stay allocated until the cache is unregistered or the
    /// instance finalized (CANN's contract).
    #[allow(clippy::too_many_arguments)]
    fn register_cache(
        &self,
        py: Python<'_>,
        placement: u32,
        num_tensors: u32,
        data_type: i32,
        shape: Vec<i64>,
        addrs: Vec<u64>,
        kind: u32,
        batch_dim: usize,
        keys: Vec<(u64, u64)>,
    ) -> PyResult<(u32, i64)> {
        let placement = Placement::from_value(placement)
            .ok_or_else(|| PyValueError::new_err(format!("placement {placement}: 0 or 1")))?;
        let kind = CacheKind::from_value(kind)
            .ok_or_else(|| PyValueError::new_err(format!("cache kind {kind}")))?;
        let desc = CacheDesc {
            placement,
            num_tensors,
            data_type: DataType(data_type),
            shape,
        };
        let keys: Vec<CacheKey> = keys
            .into_iter()
            .map(|(req_id, model_id)| CacheKey { req_id, model_id })
            .collect();
        let dd = self.dd.clone();
        let r = py.allow_threads(move || {
            // SAFETY: CANN's `register_cache` contract, which this package's users accept as
            // they do CANN's (their tensors are torch/numpy allocations they keep alive): each
            // tensor stays allocated, and is touched only as transfers allow, until the cache
            // is unregistered or the instance finalized.
            unsafe { dd.register_cache(&desc, &addrs, kind, batch_dim, &keys) }
        });
        let c = status(&r);
        Ok((c, r.unwrap_or(-1)))
    }

    /// `register_pool(placement, addr, size) -> int`: the package's memory pool (its own ACL
    /// allocation, kept until it finalized the instance), registered once.
    fn register_pool(&self, py: Python<'_>, placement: u32, addr: u64, size: u64) -> PyResult<u32> {
        let placement = Placement::from_value(placement)
            .ok_or_else(|| PyValueError::new_err(format!("placement {placement}: 0 or 1")))?;
        let dd = self.dd.clone();
        Ok(py.allow_threads(move || {
            // SAFETY: the package allocates the pool itself (`aclrtMalloc` / `aclrtMallocHost`)
            // and frees it only after it finalized this instance; transfers touch it only as
            // the caches carved from it allow
            status(&unsafe { dd.register_pool(placement, addr, size) })
        }))
    }

    /// `remove_cache_key(req_id, model_id) -> int` (a key no cache has succeeds, as CANN's).
    fn remove_cache_key(&self, py: Python<'_>, req_id: u64, model_id: u64) -> u32 {
        let dd = self.dd.clone();
        let key = CacheKey { req_id, model_id };
        py.allow_threads(move || status(&dd.remove_cache_key(&key)))
    }

    /// `unregister_cache(cache_id) -> int` (an unknown id succeeds, as CANN's).
    fn unregister_cache(&self, py: Python<'_>, cache_id: i64) -> u32 {
        let dd = self.dd.clone();
        py.allow_threads(move || status(&dd.unregister_cache(cache_id)))
    }

    /// `pull(key, dst_cache_id, dst_batch, size, blocks, src_layers, dst_layers, per_layer) ->
    /// int`: `key` as `remote_of` reads it, `blocks` `None` or `(src_blocks, dst_blocks)`, layer
    /// ranges `None` or inclusive `(first, last)`.
    #[allow(clippy::too_many_arguments)]
    fn pull(
        &self,
        py: Python<'_>,
        key: (u32, u64, u64, u64),
        dst_cache_id: i64,
        dst_batch: u32,
        size: i64,
        blocks: Option<(Vec<u64>, Vec<u64>)>,
        src_layers: Option<(u32, u32)>,
        dst_layers: Option<(u32, u32)>,
        per_layer: u32,
    ) -> PyResult<u32> {
        let src = remote_of(key)?;
        let layers = layers_of(src_layers, dst_layers, per_layer);
        let dd = self.dd.clone();
        Ok(py.allow_threads(move || {
            let b = blocks.as_ref().map(|(s, d)| (s.as_slice(), d.as_slice()));
            status(&dd.pull(&src, dst_cache_id, dst_batch, size, b, &layers))
        }))
    }

    /// `push(src_cache_id, key, src_batch, blocks, src_layers, dst_layers, per_layer) -> int`
    /// (arguments as `pull`'s): one WRITE per layer.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        py: Python<'_>,
        src_cache_id: i64,
        key: (u32, u64, u64, u64),
        src_batch: u32,
        blocks: Option<(Vec<u64>, Vec<u64>)>,
        src_layers: Option<(u32, u32)>,
        dst_layers: Option<(u32, u32)>,
        per_layer: u32,
    ) -> PyResult<u32> {
        let dst = remote_of(key)?;
        let layers = layers_of(src_layers, dst_layers, per_layer);
        let dd = self.dd.clone();
        Ok(py.allow_threads(move || {
            let b = blocks.as_ref().map(|(s, d)| (s.as_slice(), d.as_slice()));
            status(&dd.push(src_cache_id, &dst, src_batch, b, &layers))
        }))
    }
}

/// `tensor_size(shape, data_type) -> int`: bytes of one tensor (`-1` for a shape or type a
/// cache cannot have).
#[pyfunction]
fn tensor_size(shape: Vec<i64>, data_type: i32) -> i64 {
    let d = CacheDesc {
        placement: Placement::Host,
        num_tensors: 1,
        data_type: DataType(data_type),
        shape,
    };
    d.tensor_size()
        .ok()
        .and_then(|n| i64::try_from(n).ok())
        .unwrap_or(-1)
}

/// Fills the submodule: the class, the status codes by CANN's names, `tensor_size`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDataDist>()?;
    for (name, s) in LlmStatus::ALL {
        m.add(*name, s.code())?;
    }
    m.add_function(wrap_pyfunction!(tensor_size, m)?)?;
    Ok(())
}
