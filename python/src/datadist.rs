//! The submodule `hixl._hixl.datadist`: the native half of the Python package `llm_datadist`
//! (CANN's LLM-DataDist), over [`hixl::datadist::DataDist`].
//!
//! It plays the part of CANN's `llm_datadist_wrapper`: plain functions on ints, strings, lists
//! and tuples that return LLM-DataDist's status codes (`0`, `0x5010B005`, ...) or
//! `(status, value)` tuples and never raise for an LLM-DataDist error; the message of the last
//! failure on the calling thread is `last_error_message()` (of `hixl._hixl`). The package's
//! Python layer (`llm_datadist/v2/*.py`) raises `LLMException` with the status. Every call that
//! can block (initialize, finalize, role changes, links, registrations, pulls and pushes)
//! releases the GIL.
//!
//! The arguments a caller of the package gives (block lists, batch indices, sizes, layer
//! ranges, tensors per layer, addresses, ids, timeouts) arrive as Python objects: `typing.rs`
//! reads them into the instance's types, a wrong type or a value beyond its type being
//! `LLM_PARAM_INVALID` (as upstream's checks raise it), reported after the instance's own
//! failure ([`Core::refuse`]: `LLM_FAILED` when not initialized). What a value may be is the
//! instance's rules' (`hixl::datadist::args`): the Python layer checks none of them. Arguments
//! the package itself builds (cluster tuples, cache descriptions) are extracted by PyO3.

use std::net::IpAddr;
use std::sync::Arc;

use hixl::datadist::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataDist as Core, DataType, Error, IpInfo,
    LayerRange, LlmStatus, Placement, Role, args,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::set_last_error;

mod typing;
use typing::{int, layer_range, remote, u64s};

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

/// The status of a call whose arguments `args` read (or the failure reading them, reported
/// after the instance's own), running `call` on them without the GIL.
fn run<A: Send>(
    py: Python<'_>,
    dd: &Arc<Core>,
    args: Result<A, Error>,
    call: impl FnOnce(&Core, A) -> Result<(), Error> + Send,
) -> u32 {
    match args {
        Err(e) => status::<()>(&Err(dd.refuse(e))),
        Ok(a) => {
            let dd = dd.clone();
            py.allow_threads(move || status(&call(&dd, a)))
        }
    }
}

/// `(src_blocks, dst_blocks)` of a pull or push, as the Python layer hands them (`None`: a
/// transfer of batches).
type BlockArgs<'py> = Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>;

/// Two block lists read.
type Lists = (Vec<u64>, Vec<u64>);

fn block_lists(blocks: &BlockArgs<'_>) -> Result<Option<Lists>, Error> {
    blocks
        .as_ref()
        .map(|(s, d)| Ok((u64s(s, "src_blocks")?, u64s(d, "dst_blocks")?)))
        .transpose()
}

/// Two block lists read, each `None` where none was given.
type MaybeLists = (Option<Vec<u64>>, Option<Vec<u64>>);

/// A link call's `(status, each cluster's status)` from `call` on the read timeout `t`, or
/// `(status, None)` when the call failed before the clusters.
type Links = (u32, Option<Vec<u32>>);

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

impl PyDataDist {
    /// See [`Links`].
    fn links(
        &self,
        py: Python<'_>,
        t: Result<i32, Error>,
        call: impl FnOnce(&Core, i32) -> Result<(LlmStatus, Vec<LlmStatus>), Error> + Send,
    ) -> Links {
        let r = match t {
            Err(e) => Err(self.dd.refuse(e)),
            Ok(t) => {
                let dd = self.dd.clone();
                py.allow_threads(move || call(&dd, t))
            }
        };
        let c = status(&r);
        match r {
            Ok((last, rets)) => (last.code(), Some(rets.iter().map(|s| s.code()).collect())),
            Err(_) => (c, None),
        }
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

    /// `link_clusters([(id, role, [(ip, port)], [(ip, port)])], timeout_ms) -> (int, [int] |
    /// None)`: `None` when the call failed before the clusters (then the package raises).
    fn link_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<ClusterTuple>,
        timeout_ms: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, Option<Vec<u32>>)> {
        let clusters = clusters_of(clusters)?;
        let t = int(timeout_ms, "timeout", "int32");
        Ok(self.links(py, t, move |dd, t| dd.link_clusters(&clusters, t)))
    }

    /// `unlink_clusters([(id, role, [(ip, port)], [(ip, port)])], timeout_ms, force) -> (int,
    /// [int] | None)`, as `link_clusters`.
    fn unlink_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<ClusterTuple>,
        timeout_ms: &Bound<'_, PyAny>,
        force: bool,
    ) -> PyResult<(u32, Option<Vec<u32>>)> {
        let clusters = clusters_of(clusters)?;
        let t = int(timeout_ms, "timeout", "int32");
        Ok(self.links(py, t, move |dd, t| dd.unlink_clusters(&clusters, t, force)))
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

    /// The address peers link to (`"ip:port"`, the port chosen for `llm.ListenIpInfo` port
    /// 0), or `None` for an instance that does not listen.
    #[getter]
    fn listen_addr(&self) -> Option<String> {
        self.dd.listen_addr().map(|a| a.to_string())
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
        addrs: &Bound<'_, PyAny>,
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
        let addrs = match u64s(addrs, "addrs") {
            Ok(a) => a,
            Err(e) => return Ok((status::<()>(&Err(self.dd.refuse(e))), -1)),
        };
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
    fn unregister_cache(&self, py: Python<'_>, cache_id: &Bound<'_, PyAny>) -> u32 {
        let id = int(cache_id, "cache_id", "int64");
        run(py, &self.dd, id, |dd, id| dd.unregister_cache(id))
    }

    /// `pull(key, dst_cache_id, dst_batch, size, blocks, src_layers, dst_layers, per_layer) ->
    /// int`: `key` as `typing::remote` reads it, `blocks` `None` or `(src_blocks, dst_blocks)`
    /// (lists or tuples of ints), layer ranges `None` or `range`s.
    #[allow(clippy::too_many_arguments)]
    fn pull(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        dst_cache_id: i64,
        dst_batch: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        blocks: BlockArgs<'_>,
        src_layers: &Bound<'_, PyAny>,
        dst_layers: &Bound<'_, PyAny>,
        per_layer: &Bound<'_, PyAny>,
    ) -> u32 {
        let args = (|| {
            let src = remote(key)?;
            let dst_batch: u32 = int(dst_batch, "batch_index", "uint32")?;
            let size: i64 = int(size, "size", "int64")?;
            let blocks = block_lists(&blocks)?;
            let per = int(per_layer, "tensor_num_per_layer", "uint32")?;
            let layers = LayerRange::pull_layers(
                layer_range(src_layers, "src_layer_range")?,
                layer_range(dst_layers, "dst_layer_range")?,
                per,
            )?;
            Ok((src, dst_batch, size, blocks, layers))
        })();
        run(
            py,
            &self.dd,
            args,
            move |dd, (src, batch, size, blocks, layers)| {
                let b = blocks.as_ref().map(|(s, d)| (s.as_slice(), d.as_slice()));
                dd.pull(&src, dst_cache_id, batch, size, b, &layers)
            },
        )
    }

    /// `push(src_cache_id, key, src_batch, size, blocks, src_layers, dst_layers, per_layer,
    /// num_tensors) -> int` (arguments as `pull`'s; `size` -1; a side without a range: every
    /// layer of `num_tensors`, the source cache's): one WRITE per layer.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        py: Python<'_>,
        src_cache_id: i64,
        key: &Bound<'_, PyAny>,
        src_batch: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        blocks: BlockArgs<'_>,
        src_layers: &Bound<'_, PyAny>,
        dst_layers: &Bound<'_, PyAny>,
        per_layer: &Bound<'_, PyAny>,
        num_tensors: u32,
    ) -> u32 {
        let args = (|| {
            let dst = remote(key)?;
            let src_batch: u32 = int(src_batch, "src_batch_index", "uint32")?;
            args::push_size(int(size, "size", "int64")?)?;
            let blocks = block_lists(&blocks)?;
            let per = int(per_layer, "tensor_num_per_layer", "uint32")?;
            let layers = LayerRange::push_layers(
                layer_range(src_layers, "src_layer_range")?,
                layer_range(dst_layers, "dst_layer_range")?,
                per,
                num_tensors,
            )?;
            Ok((dst, src_batch, blocks, layers))
        })();
        run(
            py,
            &self.dd,
            args,
            move |dd, (dst, batch, blocks, layers)| {
                let b = blocks.as_ref().map(|(s, d)| (s.as_slice(), d.as_slice()));
                dd.push(src_cache_id, &dst, batch, b, &layers)
            },
        )
    }

    /// `ready() -> int`: `LLM_FAILED` when the instance is not initialized (or finalized),
    /// which the package reports before its own typing of a call's Python objects.
    fn ready(&self) -> u32 {
        status(&self.dd.ready())
    }

    /// `block_indices(src, dst) -> (int, (list | None, list | None))`: `transfer_cache_async`'s
    /// block indices (`None`, or lists or tuples of ints) read as the pushes take them.
    fn block_indices(
        &self,
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
    ) -> (u32, Option<MaybeLists>) {
        let read = |o: &Bound<'_, PyAny>, what| (!o.is_none()).then(|| u64s(o, what)).transpose();
        let r = (|| {
            Ok((
                read(src, "src_block_indices")?,
                read(dst, "dst_block_indices")?,
            ))
        })();
        let r = r.map_err(|e| self.dd.refuse(e));
        (status(&r), r.ok())
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
