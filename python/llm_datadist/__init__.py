"""llm_datadist: CANN's LLM-DataDist Python package (the KV-cache manager of prefill/decode
disaggregated serving) on hixl's engine.

CANN's module layout, names and values: ``LLMDataDist``, ``LLMRole``, ``LLMConfig`` /
``LlmConfig``, ``LLMClusterInfo``, ``CacheDesc``, ``CacheKey``, ``CacheKeyByIdAndIndex``,
``BlocksCacheKey``, ``Cache``, ``Placement``, ``DataType``, ``RegisterMemStatus``,
``LLMStatusCode``, ``LLMException`` ... Caches are registered tensors (their addresses: numpy,
ctypes, ``torch`` ``data_ptr()``); pulls and pushes are one-sided READ/WRITE batches of hixl's
engine (``hixl::datadist::DataDist`` in Rust). What differs from CANN's: see docs/python.md.
"""

import os

from llm_datadist.status import LLMException, LLMStatusCode, Status
from llm_datadist.configs import LLMClusterInfo, LLMRole, LlmConfig, LlmConfig as LLMConfig
from llm_datadist.data_type import DataType
from llm_datadist.v2.llm_types import (
    KvCache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    BlocksCacheKey,
    Placement,
    RegisterMemStatus,
    Cache,
    LayerSynchronizer,
    TransferConfig,
    CacheTask,
    TransferWithCacheKeyConfig,
    Memtype,
    MemInfo,
)
from llm_datadist.v2.llm_datadist import LLMDataDist

__all__ = [
    "LLMClusterInfo",
    "LLMStatusCode",
    "LLMException",
    "LLMRole",
    "LlmConfig",
    "LLMConfig",
    "DataType",
    "Status",
    "CacheDesc",
    "CacheKey",
    "CacheKeyByIdAndIndex",
    "KvCache",
    "Cache",
    "BlocksCacheKey",
    "LLMDataDist",
    "Placement",
    "RegisterMemStatus",
    "LayerSynchronizer",
    "TransferConfig",
    "CacheTask",
    "TransferWithCacheKeyConfig",
    "Memtype",
    "MemInfo",
]


def __getattr__(name):
    # CANN loads these from its separate non cache-manager package (llm_datadist_v1)
    if name in ("TensorDesc", "Tensor", "KvCacheManager"):
        raise ImportError(f"llm_datadist.{name} belongs to CANN's llm_datadist_v1 (the non cache-manager mode), "
                          "which hixl does not provide")
    raise AttributeError(f"Module 'llm_datadist' has no attribute '{name}'")


os.environ.setdefault("AUTO_USE_UC_MEMORY", "0")
