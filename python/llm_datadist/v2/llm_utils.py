"""Helpers of the cache manager (CANN's ``llm_datadist.v2.llm_utils``): ``transfer_cache_async``'s
worker thread (a key reaches the native module as its ``_packed`` form, made when the key is). The values are the native instance's
to check (``hixl::datadist::args``)."""

import sys
from threading import Thread
from typing import Dict, List, Optional

from llm_datadist.status import LLMStatusCode, code_2_status, handle_llm_status, raise_if_false, raise_if_true
from llm_datadist.utils import log
from llm_datadist.utils.utils import check_isinstance
from llm_datadist.v2.llm_types import (
    BlocksCacheKey,
    CacheKey,
    LayerSynchronizer,
    TransferConfig,
    TransferWithCacheKeyConfig,
)

NUM_TENSORS_PER_LAYER = 2


class TransferCacheJob:
    """Pushes `src_cache` layer by layer to each destination, each layer once
    `synchronize_layer` says it is ready."""

    def __init__(self, cache_manager, src_cache, transfer_configs, layer_synchronizer, src_blocks, dst_blocks):
        self._cm = cache_manager
        self._cache = src_cache
        self._configs = list(transfer_configs)
        self._sync = layer_synchronizer
        self._src_blocks = list(src_blocks) if src_blocks else None
        self._dst_blocks = list(dst_blocks) if dst_blocks else None
        # each config's result, by its position (two configs may push to one cluster)
        self._rets: Dict[int, LLMStatusCode] = {}
        desc = src_cache.cache_desc
        raise_if_false(desc.num_tensors % NUM_TENSORS_PER_LAYER == 0, "cache_desc.num_tensors ({0}) is not even",
                       desc.num_tensors)
        self._num_layers = desc.num_tensors // NUM_TENSORS_PER_LAYER
        for c in self._configs:
            if c.src_layer_range is None:
                c.src_layer_range = range(0, self._num_layers)
            raise_if_false(0 <= c.src_layer_range.start < c.src_layer_range.stop <= self._num_layers,
                           "src_layer_range: {0} out of range, src_layer_num = {1}", c.src_layer_range,
                           self._num_layers)

    def _push_layer(self, config, src_layer, dst_layer) -> LLMStatusCode:
        key = config.cache_key
        if isinstance(key, BlocksCacheKey):
            n = self._cache.cache_desc.shape[0]
            src = self._src_blocks if self._src_blocks is not None else list(range(n))
            dst = self._dst_blocks if self._dst_blocks is not None else list(range(n))
            blocks = (src, dst)
            batch = 0
        else:
            blocks = None
            batch = config.src_batch_index
        ret = self._cm._native.push(self._cache.cache_id, key._packed, batch, -1, blocks,
                                    range(src_layer, src_layer + 1), range(dst_layer, dst_layer + 1),
                                    NUM_TENSORS_PER_LAYER, self._cache.cache_desc.num_tensors)
        return code_2_status(ret)

    def run(self):
        for src_layer in range(self._num_layers):
            todo = [(i, c) for i, c in enumerate(self._configs)
                    if src_layer in c.src_layer_range and i not in self._rets]
            if not todo:
                continue
            if not self._sync.synchronize_layer(src_layer, None):
                log.error("failed to synchronize layer %d", src_layer)
                for i, _ in todo:
                    self._rets[i] = LLMStatusCode.LLM_PARAM_INVALID
                continue
            for i, c in todo:
                offset = src_layer - c.src_layer_range.start
                dst_layer = src_layer if c.dst_layer_range is None else c.dst_layer_range[offset]
                ret = self._push_layer(c, src_layer, dst_layer)
                if ret != LLMStatusCode.LLM_SUCCESS:
                    log.error("failed to transfer layer %d to cluster %d: %s", src_layer, c.dst_cluster_id, ret)
                    self._rets[i] = ret
                elif src_layer == c.src_layer_range.stop - 1:
                    self._rets[i] = LLMStatusCode.LLM_SUCCESS

    def fail_unfinished(self):
        """Every config without a result failed (the job stopped on an exception)."""
        for i in range(len(self._configs)):
            self._rets.setdefault(i, LLMStatusCode.LLM_FAILED)

    def results(self) -> List[Optional[LLMStatusCode]]:
        return [self._rets.get(i) for i in range(len(self._configs))]


class TransferAsyncThread(Thread):
    """Runs a `TransferCacheJob`; a wait that ends before it does reports `LLM_TIMEOUT`."""

    def __init__(self, job: TransferCacheJob):
        # (not a daemon, as upstream's: the interpreter's exit waits for its layers)
        super().__init__()
        self._job = job

    def run(self):
        try:
            self._job.run()
        except BaseException:
            # (a synchronizer or a push that raised: what did not finish failed, not succeeded)
            log.error("transfer_cache_async stopped: %s", sys.exc_info()[1])
            self._job.fail_unfinished()

    def get_results(self, timeout) -> List[LLMStatusCode]:
        self.join(timeout)
        if self.is_alive():
            return [LLMStatusCode.LLM_TIMEOUT] * len(self._job.results())
        return self._job.results()

    def get(self, timeout) -> LLMStatusCode:
        rets = self.get_results(timeout)
        for r in rets:
            if r is not None and r != LLMStatusCode.LLM_SUCCESS:
                return r
        return LLMStatusCode.LLM_SUCCESS


def start_transfer(cache_manager, src_cache, layer_synchronizer, transfer_configs, src_blocks, dst_blocks,
                   dst_block_memory_size):
    """Checks `transfer_cache_async`'s arguments and starts its thread (the block indices read
    natively, as the pushes take them)."""
    ret, lists = cache_manager._native.block_indices(src_blocks, dst_blocks)
    handle_llm_status(ret, "[transfer_cache_async]", "block indices")
    src_blocks, dst_blocks = lists
    check_isinstance("layer_synchronizer", layer_synchronizer, LayerSynchronizer, allow_none=False)
    check_isinstance("transfer_configs", transfer_configs, [list, tuple], allow_none=False)
    for c in transfer_configs:
        raise_if_true(isinstance(c, TransferConfig),
                      "TransferConfig (raw destination addresses) is not supported: use TransferWithCacheKeyConfig",
                      status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        check_isinstance("transfer_configs item", c, TransferWithCacheKeyConfig, allow_none=False)
    raise_if_true(dst_block_memory_size not in (None, 0),
                  "dst_block_memory_size (a cache pushed into blocks) is not supported",
                  status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
    if src_blocks or dst_blocks:
        raise_if_false(src_blocks and dst_blocks and len(src_blocks) == len(dst_blocks),
                       "num_block_indices mismatches, src_num = {0}, dst_num = {1}",
                       len(src_blocks or []), len(dst_blocks or []))
    job = TransferCacheJob(cache_manager, src_cache, transfer_configs, layer_synchronizer, src_blocks, dst_blocks)
    t = TransferAsyncThread(job)
    t.start()
    return t


__all__ = ["CacheKey", "start_transfer", "NUM_TENSORS_PER_LAYER"]
