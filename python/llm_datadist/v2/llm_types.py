"""The cache manager's types (CANN's ``llm_datadist.v2.llm_types``): cache descriptions, keys,
caches, placements, the layer-synchronizing transfer configuration and its task."""

from abc import ABC, abstractmethod
from enum import Enum, IntEnum
from typing import List, Optional, Tuple, Union

from hixl._hixl import datadist as _native
from llm_datadist.data_type import DataType
from llm_datadist.status import LLMException, LLMStatusCode, raise_if_false, raise_if_true
from llm_datadist.utils.utils import (
    check_int32,
    check_int64,
    check_isinstance,
    check_list_int64,
    check_list_uint64,
    check_uint32,
    check_uint64,
)

_INVALID_ID = 2**64 - 1


class PushType(Enum):
    """How a push names its destination."""

    NO_CACHE_KEY = 0
    BLOCKS_CACHE_KEY = 1
    CACHE_KEY_BY_ID = 2


class RegisterMemStatus(Enum):
    """``query_register_mem_status``'s answer."""

    OK = 0
    PREPARING = 1
    FAILED = 2


class Memtype(Enum):
    """A memory type of ``MemInfo``."""

    MEM_TYPE_DEVICE = 0
    MEM_TYPE_HOST = 1


class MemInfo:
    """A memory range (``remap_registered_memory``)."""

    def __init__(self, mem_type: Memtype, addr: int, size: int):
        check_isinstance("mem_type", mem_type, Memtype, allow_none=False)
        check_uint64("addr", addr)
        check_uint64("size", size)
        self._mem_type, self._addr, self._size = mem_type, addr, size

    @property
    def mem_type(self):
        return self._mem_type

    @property
    def addr(self):
        return self._addr

    @property
    def size(self):
        return self._size

    def __repr__(self):
        return f"MemInfo(mem_type={self._mem_type}, addr={self._addr:#x}, size={self._size})"

    __str__ = __repr__


class Placement(IntEnum):
    """Where a cache's tensors live."""

    HOST = 0
    DEVICE = 1

    def __str__(self):
        return f"{self.__class__.__name__}.{self.name}"


class CacheDesc:
    """``num_tensors`` tensors of ``shape`` elements of ``data_type`` each, at ``placement``;
    ``shape[batch_dim_index]`` batches (or, for a blocks cache, ``shape[0]`` blocks)."""

    def __init__(self,
                 num_tensors: int,
                 shape: Union[Tuple[int], List[int]],
                 data_type: DataType,
                 placement: Placement = Placement.DEVICE,
                 batch_dim_index: int = 0,
                 seq_len_dim_index: int = -1,
                 kv_tensor_format: str = None):
        check_uint32("num_tensors", num_tensors)
        check_isinstance("shape", shape, [tuple, list], int, allow_none=False)
        check_isinstance("data_type", data_type, DataType, allow_none=False)
        check_isinstance("placement", placement, Placement, allow_none=False)
        check_isinstance("batch_dim_index", batch_dim_index, int, allow_none=False)
        check_int32("seq_len_dim_index", seq_len_dim_index)
        check_isinstance("kv_tensor_format", kv_tensor_format, str)
        raise_if_false(0 <= batch_dim_index < len(shape), "batch_dim_index {0} out of range, [0, {1})",
                       batch_dim_index, len(shape))
        raise_if_false(seq_len_dim_index == -1 or 0 <= seq_len_dim_index < len(shape),
                       "seq_len_dim_index {0} is invalid, should be -1 or in range [0, {1})",
                       seq_len_dim_index, len(shape))
        check_list_int64("shape", shape)
        self._num_tensors = num_tensors
        self._shape = list(shape)
        self._data_type = data_type
        self._placement = placement
        self._batch_dim = batch_dim_index
        self._seq_len_dim_index = seq_len_dim_index
        self._kv_tensor_format = kv_tensor_format
        self._size = -1
        self._is_blocks = False

    def __repr__(self):
        return (f"CacheDesc(num_tensors={self._num_tensors}, shape={self._shape}, "
                f"data_type={self._data_type}, placement={self._placement}, "
                f"batch_dim_index={self._batch_dim}, seq_len_dim_index={self._seq_len_dim_index})")

    @property
    def num_tensors(self) -> int:
        return self._num_tensors

    @property
    def shape(self) -> List[int]:
        return self._shape

    def update_dim(self, dim_index: int, dim_value: int) -> None:
        raise_if_false(0 <= dim_index < len(self._shape), "dim_index {0} out of range", dim_index)
        self._shape[dim_index] = dim_value
        self._size = -1

    @property
    def data_type(self) -> DataType:
        return self._data_type

    @property
    def batch_dim(self) -> int:
        return self._batch_dim

    @property
    def batch_size(self) -> int:
        return self._shape[self._batch_dim]

    @property
    def seq_len_dim_index(self) -> int:
        return self._seq_len_dim_index

    @property
    def size(self) -> int:
        """Bytes of one tensor."""
        if self._size == -1:
            self._size = _native.tensor_size(self._shape, self._data_type.value)
            if self._size < 0:
                raise LLMException(f"Failed to calc tensor size, shape = {self._shape}, "
                                   f"data_type = {self._data_type}",
                                   status_code=LLMStatusCode.LLM_PARAM_INVALID)
        return self._size

    @property
    def kv_tensor_format(self) -> str:
        return self._kv_tensor_format

    @property
    def placement(self) -> Placement:
        return self._placement


class Cache:
    """A registered cache (made by ``CacheManager.register_cache`` / ``register_blocks_cache``;
    not constructed by users)."""

    def __init__(self, cache_id: int, cache_desc: CacheDesc, tensor_addrs: List[int], cache_manager,
                 is_registered, is_blocks_cache):
        check_int64("cache_id", cache_id)
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._tensor_addrs = tensor_addrs
        self._cache_manager = cache_manager
        self._is_registered = is_registered
        self._is_blocks_cache = is_blocks_cache

    @property
    def cache_id(self) -> int:
        return self._cache_id

    @property
    def cache_desc(self) -> CacheDesc:
        return self._cache_desc

    @classmethod
    def create_cpu_cache(cls, cache_desc: CacheDesc, addrs: List[int]):
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_isinstance("addrs", addrs, list, int, allow_none=False)
        raise_if_false(cache_desc.placement == Placement.HOST, "cache_desc placement must be HOST")
        raise_if_false(cache_desc.num_tensors == len(addrs),
                       "cache_desc num_tensors:{0} not equal addrs num:{1}", cache_desc.num_tensors, len(addrs))
        return cls(-1, cache_desc, addrs, None, False, True)

    @property
    def tensor_addrs(self) -> List[int]:
        return self._tensor_addrs

    @property
    def is_blocks_cache(self):
        return self._is_blocks_cache

    def __str__(self):
        return (f"Cache(cache_id = {self._cache_id}, device_tensor_addrs = {len(self._tensor_addrs)}, "
                f"is_blocks_cache = {self._is_blocks_cache})")

    __repr__ = __str__


def _key_kwargs(args, kwargs, names, limit):
    raise_if_false(len(args) + len(kwargs) <= limit, "Param num is over limit")
    for name, value in zip(names, args):
        kwargs[name] = value
    raise_if_false("prompt_cluster_id" in kwargs or "cluster_id" in kwargs,
                   "Param prompt_cluster_id or cluster_id is required")
    valid = ["prompt_cluster_id"] + list(names)
    for k in kwargs:
        raise_if_false(k in valid, "Unsupported param:{0}", k)
    cid = kwargs["cluster_id"] if "cluster_id" in kwargs else kwargs["prompt_cluster_id"]
    return cid, kwargs


class BlocksCacheKey:
    """A blocks cache's key: ``BlocksCacheKey(cluster_id, model_id=0)`` (also
    ``prompt_cluster_id=``)."""

    def __init__(self, *args, **kwargs):
        self._cluster_id, kwargs = _key_kwargs(args, kwargs, ["cluster_id", "model_id"], 2)
        self._model_id = kwargs.get("model_id", 0)
        check_uint64("cluster_id", self._cluster_id)
        check_uint64("model_id", self._model_id)
        # the native module's form of a key, made once (a key does not change): (kind, cluster, a, b)
        self._packed = (1, self._cluster_id, self._model_id, 0)

    @property
    def prompt_cluster_id(self) -> int:
        return self._cluster_id

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def model_id(self) -> int:
        return self._model_id

    def __repr__(self):
        return f"BlocksCacheKey(cluster_id={self._cluster_id}, model_id={self._model_id})"


class CacheKey:
    """A request's cache key: ``CacheKey(cluster_id, req_id, model_id=0, prefix_id=2**64-1)``
    (also ``prompt_cluster_id=``)."""

    def __init__(self, *args, **kwargs):
        self._cluster_id, kwargs = _key_kwargs(
            args, kwargs, ["cluster_id", "req_id", "model_id", "prefix_id"], 4)
        raise_if_false("req_id" in kwargs, "Param req_id is required")
        self._req_id = kwargs["req_id"]
        self._model_id = kwargs.get("model_id", 0)
        self._prefix_id = kwargs.get("prefix_id", _INVALID_ID)
        check_uint64("cluster_id", self._cluster_id)
        check_uint64("req_id", self._req_id)
        check_uint64("model_id", self._model_id)
        check_uint64("prefix_id", self._prefix_id)
        self._packed = (2, self._cluster_id, self._req_id, self._model_id)

    @property
    def prompt_cluster_id(self) -> int:
        return self._cluster_id

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def req_id(self) -> int:
        return self._req_id

    @property
    def prefix_id(self) -> int:
        return self._prefix_id

    @property
    def model_id(self) -> int:
        return self._model_id

    def __repr__(self):
        return (f"CacheKey(cluster_id={self._cluster_id}, req_id={self._req_id}, "
                f"model_id={self._model_id}, prefix_id={self._prefix_id})")


class CacheKeyByIdAndIndex:
    """A peer's cache by its id: ``CacheKeyByIdAndIndex(cluster_id, cache_id, batch_index=0)``."""

    def __init__(self, cluster_id: int, cache_id: int, batch_index=0):
        check_uint64("cluster_id", cluster_id)
        check_int64("cache_id", cache_id)
        check_uint32("batch_index", batch_index)
        self._cluster_id, self._cache_id, self._batch_index = cluster_id, cache_id, batch_index
        self._packed = (0, cluster_id, cache_id, batch_index)

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def cache_id(self) -> int:
        return self._cache_id

    @property
    def batch_index(self) -> int:
        return self._batch_index

    def __repr__(self):
        return (f"CacheKeyByIdAndIndex(cluster_id={self._cluster_id}, cache_id={self._cache_id}, "
                f"batch_index={self._batch_index})")


class KvCache:
    """CANN's multi-device cache of the old (non cache-manager) mode: not available here."""

    def __init__(self, *args, **kwargs):
        raise LLMException("KvCache belongs to the non cache-manager mode, which this package has not",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)


class LayerSynchronizer(ABC):
    """Implemented by the caller of ``transfer_cache_async``: wait until a layer is computed."""

    @abstractmethod
    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        """Blocks until layer `layer_index` is ready; `False` ends the transfer."""


def check_layer_range(name, layer_range: Optional[range], allow_none=True):
    if allow_none and layer_range is None:
        return
    check_isinstance(name, layer_range, range, allow_none=allow_none)
    raise_if_false(layer_range.step == 1, "check {0}.step == 1 failed", name)
    raise_if_false(0 <= layer_range.start < layer_range.stop,
                   "check 0 <= range.start < range.stop failed, {0} = {1}", name, layer_range)


class TransferWithCacheKeyConfig:
    """A destination of ``transfer_cache_async``: the peer's cache by key, the layers."""

    def __init__(self, cache_key: Union[BlocksCacheKey, CacheKeyByIdAndIndex], src_layer_range: range = None,
                 dst_layer_range: range = None, src_batch_index: int = 0):
        check_isinstance("cache_key", cache_key, [BlocksCacheKey, CacheKeyByIdAndIndex], allow_none=False)
        check_layer_range("src_layer_range", src_layer_range, allow_none=False)
        check_layer_range("dst_layer_range", dst_layer_range, allow_none=False)
        raise_if_false(len(src_layer_range) == len(dst_layer_range),
                       "src_layer_range size should be equal to dst_layer_range size")
        check_uint32("src_batch_index", src_batch_index)
        raise_if_true(isinstance(cache_key, BlocksCacheKey) and src_batch_index != 0,
                      "src_batch_index should be 0 when cache_key is BlocksCacheKey.")
        self._cache_key = cache_key
        self._src_layer_range = src_layer_range
        self._dst_layer_range = dst_layer_range
        self._src_batch_index = src_batch_index
        self.dst_cluster_id = cache_key.cluster_id

    def __repr__(self):
        return (f"TransferWithCacheKeyConfig(cache_key={self._cache_key}, src_layer_range={self._src_layer_range},"
                f" dst_layer_range={self._dst_layer_range}, src_batch_index={self._src_batch_index})")

    @property
    def cache_key(self):
        return self._cache_key

    @cache_key.setter
    def cache_key(self, v):
        check_isinstance("cache_key", v, [BlocksCacheKey, CacheKeyByIdAndIndex], allow_none=False)
        self._cache_key = v
        self.dst_cluster_id = v.cluster_id

    @property
    def src_layer_range(self):
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, v):
        check_layer_range("src_layer_range", v)
        self._src_layer_range = v

    @property
    def dst_layer_range(self):
        return self._dst_layer_range

    @dst_layer_range.setter
    def dst_layer_range(self, v):
        check_layer_range("dst_layer_range", v)
        self._dst_layer_range = v

    @property
    def src_batch_index(self):
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, v):
        check_uint32("src_batch_index", v)
        raise_if_true(isinstance(self._cache_key, BlocksCacheKey) and v != 0,
                      "src_batch_index should be 0 when cache_key is BlocksCacheKey.")
        self._src_batch_index = v


class TransferConfig:
    """A destination of ``transfer_cache_async`` by raw addresses (CANN's non remote-accessible
    mode): accepted, and refused by ``transfer_cache_async`` (``LLM_FEATURE_NOT_ENABLED``)."""

    def __init__(self, dst_cluster_id: int, dst_addrs: List[int], src_layer_range: Optional[range] = None,
                 src_batch_index: int = 0):
        check_uint64("dst_cluster_id", dst_cluster_id)
        check_isinstance("dst_addrs", dst_addrs, [list, tuple], int, allow_none=False)
        check_list_uint64("dst_addrs", dst_addrs)
        check_layer_range("src_layer_range", src_layer_range)
        check_uint32("src_batch_index", src_batch_index)
        self.dst_cluster_id = dst_cluster_id
        self.dst_addrs = dst_addrs
        self.src_layer_range = src_layer_range
        self.src_batch_index = src_batch_index
        self.dst_layer_range = None

    def __repr__(self):
        return (f"TransferConfig(dst_cluster_id={self.dst_cluster_id}, dst_addrs={self.dst_addrs},"
                f" src_layer_range={self.src_layer_range}, src_batch_index={self.src_batch_index})")


class CacheTask:
    """The task of ``transfer_cache_async``."""

    def __init__(self, transfer_async_task):
        self._task = transfer_async_task

    @staticmethod
    def _seconds(timeout_in_millis):
        if timeout_in_millis is None:
            return None
        check_uint32("timeout_in_millis", timeout_in_millis)
        return timeout_in_millis / 1000

    def synchronize(self, timeout_in_millis: Optional[int] = None) -> LLMStatusCode:
        """Waits for the task; its first failure, or success (``LLM_TIMEOUT`` if it did not end
        in time)."""
        return self._task.get(self._seconds(timeout_in_millis))

    def get_results(self, timeout_in_millis: Optional[int] = None) -> List[LLMStatusCode]:
        """Waits for the task; each destination's status."""
        return self._task.get_results(self._seconds(timeout_in_millis))
