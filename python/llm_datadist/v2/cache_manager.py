"""The cache manager (CANN's ``llm_datadist.v2.cache_manager``): registers caches, pulls from
and pushes to linked clusters' caches. Every transfer is a batch of one-sided READs (pull) or
WRITEs (push, one batch per layer) of hixl's engine; the native calls release the GIL.

This layer translates: it checks the Python classes of its arguments (a ``Cache``, a key) and
hands everything else to the native instance as it came, whose Rust rules
(``hixl::datadist::args``) check the values (block lists, batch indices, sizes, layer ranges,
tensors per layer, addresses) and whose typing reads the ints and lists (a wrong type is
``LLM_PARAM_INVALID`` there, as upstream's checks raise it). No block list is walked here."""

import ctypes
import json
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple, Union

from llm_datadist.status import (
    LLMException,
    LLMStatusCode,
    handle_llm_status,
    raise_if_false,
    raise_if_true,
)
from llm_datadist.utils import log
from llm_datadist.utils.utils import check_isinstance
from llm_datadist.v2.llm_types import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    CacheTask,
    LayerSynchronizer,
    MemInfo,
    Placement,
)
from llm_datadist.v2.llm_utils import NUM_TENSORS_PER_LAYER, start_transfer

_INVALID_ID = 2**64 - 1
_SUCCESS = int(LLMStatusCode.LLM_SUCCESS)
# the classes a move's arguments may be (checked by one isinstance each)
_CACHE = (Cache,)
_ID_KEY = (CacheKeyByIdAndIndex,)
_BLOCKS_KEY = (BlocksCacheKey,)
_BATCH_KEYS = (CacheKey, CacheKeyByIdAndIndex)
_ANY_KEY = (CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey)
_KIND_CACHE = 0
_KIND_BLOCKS = 1


_ACL = None


def _acl():
    """ACL's runtime library (CANN's ``libacl_rt.so``, or ``libascendcl.so``), loaded once;
    ``LLM_FEATURE_NOT_ENABLED`` where there is none."""
    global _ACL
    if _ACL is None:
        for name in ("libacl_rt.so", "libascendcl.so"):
            try:
                _ACL = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise LLMException("ACL (libacl_rt.so) is not loadable: device memory copies need CANN",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
    return _ACL


def _not_enabled(what):
    raise LLMException(f"{what} is not supported by hixl's llm_datadist",
                       status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)


_ALIGN = 512


class _Pool:
    """A memory pool (``llm.MemPoolConfig`` for device memory, ``llm.HostMemPoolConfig`` for
    host memory): one allocation made at ``init`` and registered with the engine once, before
    any link, so that caches carved from it later are reachable over links made before them.
    Freed after the instance is finalized. First fit over a free list, 512-byte aligned."""

    def __init__(self, placement, size):
        self.placement = placement
        self.size = size
        if placement == Placement.DEVICE:
            ptr = ctypes.c_void_p()
            rc = _acl().aclrtMalloc(ctypes.byref(ptr), ctypes.c_size_t(size), 0)  # ACL_MEM_MALLOC_HUGE_FIRST
            raise_if_false(rc == 0 and ptr.value, "aclrtMalloc of the memory pool ({0} bytes) failed: {1}", size, rc,
                           status_code=LLMStatusCode.LLM_OUT_OF_MEMORY)
            self.base = ptr.value
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
            addr = libc.mmap(None, size, 0x3, 0x22, -1, 0)
            raise_if_false(addr not in (None, ctypes.c_void_p(-1).value), "mmap of the host memory pool ({0} bytes) "
                           "failed: errno {1}", size, ctypes.get_errno(), status_code=LLMStatusCode.LLM_OUT_OF_MEMORY)
            self.base = addr
        self._free = [(0, size)]  # (offset, length), sorted, not adjacent

    def alloc(self, n):
        n = (n + _ALIGN - 1) // _ALIGN * _ALIGN
        for i, (off, length) in enumerate(self._free):
            if length >= n:
                self._free[i:i + 1] = [(off + n, length - n)] if length > n else []
                return self.base + off
        return None

    def free(self, addr, n):
        n = (n + _ALIGN - 1) // _ALIGN * _ALIGN
        off = addr - self.base
        self._free.append((off, n))
        self._free.sort()
        merged = []
        for o, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((o, length))
        self._free = merged

    def close(self):
        if self.base is None:
            return
        if self.placement == Placement.DEVICE:
            _acl().aclrtFree(ctypes.c_void_p(self.base))
        else:
            libc = ctypes.CDLL(None)
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.munmap(ctypes.c_void_p(self.base), ctypes.c_size_t(self.size))
        self.base = None


def _pool_size(name, text):
    """``memory_size`` of a pool configuration (``'{"memory_size": N}'``)."""
    try:
        cfg = json.loads(text)
        size = cfg["memory_size"]
    except (ValueError, TypeError, KeyError) as e:
        raise LLMException(f"{name} {text!r}: a JSON object with memory_size ({e})",
                           status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
    raise_if_false(isinstance(size, int) and not isinstance(size, bool) and 0 < size < 2**63,
                   "{0} memory_size {1!r}: a positive integer", name, size,
                   status_code=LLMStatusCode.LLM_PARAM_INVALID)
    return size


class CacheManager:
    """The cache manager of an initialized ``LLMDataDist`` (``datadist.cache_manager``)."""

    def __init__(self, native, options) -> None:
        self._native = native
        self._options = options
        self._initialized = True
        self._is_call_linked = False
        self._caches: Dict[int, Cache] = {}
        self._pools: Dict[Placement, _Pool] = {}
        # caches carved from a pool: cache id -> (pool, tensor addresses, bytes each)
        self._allocated: Dict[int, Tuple[_Pool, List[int], int]] = {}

    def _open_pools(self):
        """The pools ``init``'s options ask for, made and registered before any link."""
        for key, placement in (("llm.MemPoolConfig", Placement.DEVICE), ("llm.HostMemPoolConfig", Placement.HOST)):
            if key not in self._options:
                continue
            size = _pool_size(key, self._options[key])
            pool = _Pool(placement, size)
            ret = self._native.register_pool(int(placement), pool.base, size)
            if ret != LLMStatusCode.LLM_SUCCESS:
                pool.close()
                handle_llm_status(ret, "[LLMDataDist.init]", f"memory pool {key}")
            self._pools[placement] = pool
            log.info("[memory pool] %s: %d bytes", key, size)

    def _close_pools(self):
        """Frees the pools (the instance is finalized: nothing reaches them any more)."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._allocated.clear()

    def _check(self):
        raise_if_false(self._initialized, "the LLMDataDist of this cache manager is finalized",
                       status_code=LLMStatusCode.LLM_FAILED)

    @contextmanager
    def _typing(self, func):
        """The Python classes of a call's arguments, checked here: a failure is raised after the
        instance's own (not initialized: ``LLM_FAILED``), which every call reports first."""
        try:
            yield
        except LLMException:
            handle_llm_status(self._native.ready(), f"[{func}]", "the instance is not initialized")
            raise

    def _classes(self, func, *args):
        """Each ``(name, value, classes)`` of a move's arguments is an instance of `classes` (a
        tuple); else ``LLM_PARAM_INVALID`` as ``check_isinstance`` words it, after the
        instance's own failure. One ``isinstance`` each on the way to the native call."""
        for name, value, classes in args:
            if not isinstance(value, classes):
                with self._typing(func):
                    check_isinstance(name, value, list(classes), allow_none=False)

    def _refuse(self, func, fmt, *args):
        """Raises ``LLM_PARAM_INVALID`` with `fmt`, after the instance's own failure."""
        with self._typing(func):
            raise_if_true(True, fmt, *args)

    def set_is_call_linked(self):
        self._is_call_linked = True

    # ---- registration ----

    def _register(self, func, cache_desc, addrs, kind, keys, remote_accessible, is_blocks):
        with self._typing(func):
            check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
            check_isinstance("addrs", addrs, list, allow_none=False)
            check_isinstance("remote_accessible", remote_accessible, bool)
            # (this package's link mode: the instance does not know it)
            raise_if_true(self._is_call_linked and remote_accessible,
                          "you can not register remote accessible cache after link.")
        batch_dim = cache_desc.batch_dim if kind == _KIND_CACHE else 0
        ret, cache_id = self._native.register_cache(int(cache_desc.placement), cache_desc.num_tensors,
                                                    cache_desc.data_type.value, list(cache_desc.shape),
                                                    addrs, kind, batch_dim, keys)
        handle_llm_status(ret, f"[{func}]", f"cache_desc = {cache_desc}")
        cache = Cache(cache_id, cache_desc, list(addrs), self, True, is_blocks)
        self._caches[cache_id] = cache
        log.info("[%s] success, cache_id = %d", func, cache_id)
        return cache

    def register_cache(self, cache_desc: CacheDesc, addrs: List[int],
                       cache_keys: Union[Tuple[CacheKey], List[CacheKey]] = (),
                       remote_accessible: Optional[bool] = None) -> Cache:
        """Registers `num_tensors` tensors at `addrs` as a cache of batches (peers find it by
        its id, or by one of `cache_keys`). The tensors must stay allocated until
        ``unregister_cache``."""
        with self._typing("register_cache"):
            check_isinstance("cache_keys", cache_keys, [tuple, list], CacheKey, allow_none=False)
        # key i names batch i (one request a batch): at most one key a batch
        keys = [(k.req_id, k.model_id) for k in cache_keys]
        return self._register("register_cache", cache_desc, addrs, _KIND_CACHE, keys, remote_accessible, False)

    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: List[int],
                              blocks_cache_key: Optional[BlocksCacheKey] = None,
                              remote_accessible: Optional[bool] = None) -> Cache:
        """Registers `num_tensors` tensors at `addrs` as a blocks cache (`shape[0]` blocks per
        tensor); peers find it by `blocks_cache_key` (or its id)."""
        with self._typing("register_blocks_cache"):
            check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        keys = [] if blocks_cache_key is None else [(_INVALID_ID, blocks_cache_key.model_id)]
        cache_desc._is_blocks = True
        return self._register("register_blocks_cache", cache_desc, addrs, _KIND_BLOCKS, keys,
                              remote_accessible, True)

    def unregister_cache(self, cache_id: int) -> None:
        """Unregisters a cache (an unknown id is fine). When it returns, no peer reads or writes
        its tensors."""
        ret = self._native.unregister_cache(cache_id)
        handle_llm_status(ret, "[unregister_cache]", f"cache_id = {cache_id}")
        self._caches.pop(cache_id, None)
        log.info("[unregister_cache] success, cache_id = %d", cache_id)

    # ---- pulls ----

    def _pull(self, func, key, dst_cache, batch_index, size, blocks, kwargs):
        src_layer_range = kwargs.pop("src_layer_range", None)
        dst_layer_range = kwargs.pop("dst_layer_range", None)
        tnpl = kwargs.pop("tensor_num_per_layer", NUM_TENSORS_PER_LAYER)
        if kwargs:
            self._refuse(func, "[{0}] unsupported arguments: {1}", func, sorted(kwargs))
        ret = self._native.pull(key._packed, dst_cache.cache_id, batch_index, size, blocks, src_layer_range,
                                dst_layer_range, tnpl)
        if ret != _SUCCESS:
            handle_llm_status(ret, f"[{func}]", f"cache_key = {key}")
        log.info("[%s] success", func)

    def pull_cache(self, cache_key: Union[CacheKey, CacheKeyByIdAndIndex], cache: Cache, batch_index: int = 0,
                   size: int = -1, **kwargs) -> None:
        """Pulls a peer's batch (the key's `batch_index`, or the batch its `CacheKey` names)
        into batch `batch_index` of `cache`: `size` bytes of each tensor (`-1`: a whole batch).
        ``src_layer_range``/``dst_layer_range``/``tensor_num_per_layer`` select layers."""
        self._classes("pull_cache", ("cache_key", cache_key, _BATCH_KEYS), ("cache", cache, _CACHE))
        self._pull("pull_cache", cache_key, cache, batch_index, size, None, kwargs)

    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey], dst_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int], List[int]]] = (),
                    dst_blocks: Union[Tuple[int], List[int]] = (), **kwargs):
        """Pulls block `src_blocks[i]` of each of a peer's blocks cache's tensors into block
        `dst_blocks[i]` of `dst_cache`'s (consecutive runs as one descriptor). With a
        ``CacheKey`` or ``CacheKeyByIdAndIndex`` (CANN's cache-to-blocks pull) the peer's batch
        is cut into blocks of `dst_cache`, piece j into `dst_blocks[j]`, and `src_blocks` stays
        empty."""
        self._classes("pull_blocks", ("src_cache_key", src_cache_key, _ANY_KEY), ("dst_cache", dst_cache, _CACHE))
        # which key names blocks is this API's: the C ABI pulls blocks by a cache id
        if (not isinstance(src_cache_key, BlocksCacheKey) and isinstance(src_blocks, (list, tuple))
                and len(src_blocks) > 0):
            self._refuse("pull_blocks",
                         "src_blocks should be empty when src_cache_key is not instance of BlocksCacheKey.")
        self._pull("pull_blocks", src_cache_key, dst_cache, 0, -1, (src_blocks, dst_blocks), kwargs)

    # ---- pushes ----

    def _push(self, func, key, src_cache, batch, size, blocks, src_layer_range, dst_layer_range, tnpl):
        ret = self._native.push(src_cache.cache_id, key._packed, batch, size, blocks, src_layer_range,
                                dst_layer_range, tnpl, src_cache.cache_desc.num_tensors)
        if ret != _SUCCESS:
            handle_llm_status(ret, f"[{func}]", f"dst_cache_key = {key}")
        log.info("[%s] success", func)

    def push_cache(self, dst_cache_key: CacheKeyByIdAndIndex, src_cache: Cache, src_batch_index: int = 0,
                   src_layer_range: range = None, dst_layer_range: range = None, size: int = -1,
                   tensor_num_per_layer=NUM_TENSORS_PER_LAYER) -> None:
        """Pushes batch `src_batch_index` of `src_cache` into the peer's batch the key names,
        one WRITE batch per layer (every layer by default)."""
        self._classes("push_cache", ("dst_cache_key", dst_cache_key, _ID_KEY), ("src_cache", src_cache, _CACHE))
        self._push("push_cache", dst_cache_key, src_cache, src_batch_index, size, None, src_layer_range,
                   dst_layer_range, tensor_num_per_layer)

    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int], List[int]]] = (),
                    dst_blocks: Union[Tuple[int], List[int]] = (), src_layer_range: range = None,
                    dst_layer_range: range = None, tensor_num_per_layer=NUM_TENSORS_PER_LAYER):
        """Pushes block `src_blocks[i]` of `src_cache`'s tensors into block `dst_blocks[i]` of the
        peer's blocks cache, one WRITE batch per layer (every layer by default)."""
        self._classes("push_blocks", ("dst_cache_key", dst_cache_key, _BLOCKS_KEY), ("src_cache", src_cache, _CACHE))
        self._push("push_blocks", dst_cache_key, src_cache, 0, -1, (src_blocks, dst_blocks), src_layer_range,
                   dst_layer_range, tensor_num_per_layer)

    def transfer_cache_async(self, src_cache: Cache, layer_synchronizer: LayerSynchronizer, transfer_configs,
                             src_block_indices: Optional[Union[List[int], Tuple[int]]] = None,
                             dst_block_indices: Optional[Union[List[int], Tuple[int]]] = None,
                             dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Pushes `src_cache` layer by layer (two tensors a layer) to each destination of
        `transfer_configs` (``TransferWithCacheKeyConfig``), each layer once
        `layer_synchronizer.synchronize_layer` returns True, on a thread; the task's
        ``synchronize()`` / ``get_results()`` wait for it."""
        handle_llm_status(self._native.ready(), "[transfer_cache_async]", "the instance is not initialized")
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        # CANN refuses a host `src_cache` here (its layer pushes run on device streams); hixl's
        # engine pushes host memory as it pushes device memory
        log.info("[transfer_cache_async] start, cache_id = %d", src_cache.cache_id)
        return CacheTask(start_transfer(self, src_cache, layer_synchronizer, transfer_configs, src_block_indices,
                                        dst_block_indices, dst_block_memory_size))

    # ---- the memory pools ----

    def _allocate(self, func, cache_desc, kind, keys, is_blocks):
        self._check()
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        pool = self._pools.get(cache_desc.placement)
        if pool is None:
            cfg = "mem_pool_cfg" if cache_desc.placement == Placement.DEVICE else "host_mem_pool_cfg"
            raise LLMException(f"[{func}] no memory pool for {cache_desc.placement}: set LLMConfig.{cfg}",
                               status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        size = cache_desc.size
        raise_if_false(size > 0, "[{0}] a tensor of {1} bytes", func, size)
        addrs = []
        for _ in range(cache_desc.num_tensors):
            a = pool.alloc(size)
            if a is None:
                for x in addrs:
                    pool.free(x, size)
                raise LLMException(f"[{func}] the memory pool ({pool.size} bytes) has no room for "
                                   f"{cache_desc.num_tensors} tensors of {size} bytes",
                                   status_code=LLMStatusCode.LLM_OUT_OF_MEMORY)
            addrs.append(a)
        try:
            cache = self._register(func, cache_desc, addrs, kind, keys, None, is_blocks)
        except BaseException:
            for x in addrs:
                pool.free(x, size)
            raise
        self._allocated[cache.cache_id] = (pool, addrs, size)
        return cache

    def allocate_cache(self, cache_desc: CacheDesc, cache_keys: Union[Tuple[CacheKey], List[CacheKey]] = ()) -> Cache:
        """Allocates a cache of batches from the memory pool of its placement (``mem_pool_cfg``
        or ``host_mem_pool_cfg``) and registers it; key i names batch i."""
        check_isinstance("cache_keys", cache_keys, [tuple, list], CacheKey, allow_none=False)
        keys = [(k.req_id, k.model_id) for k in cache_keys]
        return self._allocate("allocate_cache", cache_desc, _KIND_CACHE, keys, False)

    def allocate_blocks_cache(self, cache_desc: CacheDesc, blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
        """Allocates a blocks cache from the memory pool of its placement and registers it."""
        check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        keys = [] if blocks_cache_key is None else [(_INVALID_ID, blocks_cache_key.model_id)]
        cache_desc._is_blocks = True
        return self._allocate("allocate_blocks_cache", cache_desc, _KIND_BLOCKS, keys, True)

    def _deallocate(self, func, cache):
        self._check()
        check_isinstance("cache", cache, Cache, allow_none=False)
        got = self._allocated.get(cache.cache_id)
        raise_if_true(got is None, "[{0}] cache {1} was not allocated from a memory pool", func, cache.cache_id,
                      status_code=LLMStatusCode.LLM_PARAM_INVALID)
        self.unregister_cache(cache.cache_id)
        pool, addrs, size = self._allocated.pop(cache.cache_id)
        for a in addrs:
            pool.free(a, size)
        log.info("[%s] success, cache_id = %d", func, cache.cache_id)

    def deallocate_cache(self, cache: Cache) -> None:
        """Unregisters a cache ``allocate_cache`` made and gives its memory back to the pool."""
        self._deallocate("deallocate_cache", cache)

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        """Unregisters a cache ``allocate_blocks_cache`` made and gives its memory back."""
        self._deallocate("deallocate_blocks_cache", cache)

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Removes a key from the cache it names: a peer that fetches this cluster's cache table
        from now on does not find it (a key no cache has: nothing happens)."""
        with self._typing("remove_cache_key"):
            check_isinstance("cache_key", cache_key, CacheKey, allow_none=False)
        ret = self._native.remove_cache_key(cache_key.req_id, cache_key.model_id)
        handle_llm_status(ret, "[remove_cache_key]", f"cache_key = {cache_key}")
        log.info("[remove_cache_key] success")

    # ---- CANN's copy calls: not here ----

    def copy_cache(self, dst: Cache, src: Cache, dst_batch_index: int = 0, src_batch_index: int = 0,
                   offset: int = 0, size: int = -1, req_id: Optional[int] = None):
        _not_enabled("copy_cache")

    def copy_blocks(self, cache: Cache, copy_block_info: Dict[int, List[int]]):
        _not_enabled("copy_blocks")

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
        """Copies blocks between a host and a device blocks cache of this process (block
        `s` of each tensor of `src_cache` to block `src_to_dst[s]` of `dst_cache`'s), with ACL's
        synchronous ``aclrtMemcpy`` on the calling thread's device, as CANN's does. Either cache
        may be unregistered (``Cache.create_cpu_cache``)."""
        self._check()
        check_isinstance("src", src_cache, Cache, allow_none=False)
        check_isinstance("dst", dst_cache, Cache, allow_none=False)
        raise_if_false(src_cache.is_blocks_cache, "param check failed, src cache should be blocks cache.")
        raise_if_false(dst_cache.is_blocks_cache, "param check failed, dst cache should be blocks cache.")
        check_isinstance("src_to_dst", src_to_dst, dict, allow_none=False)
        sd, dd = src_cache.cache_desc, dst_cache.cache_desc
        block = sd.size // sd.shape[0]
        raise_if_false(block == dd.size // dd.shape[0], "src block size:{0} and dst block size:{1} must be equal",
                       block, dd.size // dd.shape[0])
        raise_if_false(sd.num_tensors == dd.num_tensors, "src num_tensors:{0} and dst num_tensors:{1} must be equal",
                       sd.num_tensors, dd.num_tensors)
        for s, d in src_to_dst.items():
            check_isinstance("src_to_dst key", s, int, allow_none=False)
            check_isinstance("src_to_dst value", d, int, allow_none=False)
            raise_if_false(0 <= s < sd.shape[0], "src_block_index:{0} must be in [0, {1})", s, sd.shape[0])
            raise_if_false(0 <= d < dd.shape[0], "dst_block_index:{0} must be in [0, {1})", d, dd.shape[0])
        if sd.placement == Placement.HOST and dd.placement == Placement.DEVICE:
            kind = 1  # ACL_MEMCPY_HOST_TO_DEVICE
        elif sd.placement == Placement.DEVICE and dd.placement == Placement.HOST:
            kind = 2  # ACL_MEMCPY_DEVICE_TO_HOST
        else:
            raise LLMException(f"swap src placement:{sd.placement} to dst placement:{dd.placement} is not support",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        acl = _acl()
        for src_addr, dst_addr in zip(src_cache.tensor_addrs, dst_cache.tensor_addrs):
            for s, d in src_to_dst.items():
                rc = acl.aclrtMemcpy(ctypes.c_void_p(dst_addr + d * block), ctypes.c_size_t(block),
                                     ctypes.c_void_p(src_addr + s * block), ctypes.c_size_t(block), kind)
                raise_if_false(rc == 0, "[swap_blocks] aclrtMemcpy failed: {0}", rc,
                               status_code=LLMStatusCode.LLM_FAILED)
        log.info("[swap_blocks] success")

    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """HCCL's fault recovery: hixl's registrations need no remapping, so after its argument
        checks this does nothing."""
        self._check()
        items = mem_infos if isinstance(mem_infos, (list, tuple)) else [mem_infos]
        for m in items:
            check_isinstance("mem_infos", m, MemInfo, allow_none=False)
