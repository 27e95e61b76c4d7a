"""The package ``llm_datadist`` (CANN's LLM-DataDist Python API on hixl): two clusters, this
process and a peer process (dd_peer.py), with caches of seeded random bytes in host memory;
every pull and push is verified byte for byte against a model of both sides, every bad input
against its exact ``LLMStatusCode``. Device memory (through the ACL double): test_llm_datadist_device.py."""
import ctypes
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import llm_datadist as ld
from llm_datadist import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LayerSynchronizer,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
    TransferWithCacheKeyConfig,
)

HERE = os.path.dirname(os.path.abspath(__file__))
NT, BLOCKS, BLOCK = 4, 16, 128  # as dd_peer.py: 4 tensors x 16 blocks x 128 bytes
BATCHES, BATCH = 4, 256
PROMPT, DECODER = 1, 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DDPeer:
    """dd_peer.py: a cluster with a blocks cache and a cache of batches of seeded bytes."""

    def __init__(self, cluster=PROMPT, role=1, port=None, placement="host", seed=1, env=None, timeout=60.0):
        self.cluster, self.seed = cluster, seed
        self.port = free_port() if port is None else port
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "dd_peer.py"), str(cluster), str(role), str(self.port), placement,
             str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        info = json.loads(self._line(timeout))
        self.blocks_id, self.cache_id = info["blocks_id"], info["cache_id"]

    def initial(self):
        rng = np.random.default_rng(self.seed)
        blocks = rng.integers(0, 256, (NT, BLOCKS * BLOCK), dtype=np.uint8)
        cache = rng.integers(0, 256, (NT, BATCHES * BATCH), dtype=np.uint8)
        return blocks, cache

    def _line(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                raise TimeoutError("the peer did not answer in time")
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if r:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the peer exited ({self.proc.wait()})")
                return line.strip()

    def cmd(self, line, timeout=60.0):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def dump(self, tmp_path):
        path = os.path.join(str(tmp_path), f"dd-{self.proc.pid}-{time.monotonic_ns()}.npz")
        assert self.cmd(f"dump {path}") == "ok"
        with np.load(path) as z:
            return z["blocks"].copy(), z["cache"].copy()

    def close(self):
        if self.proc.poll() is None:
            try:
                assert self.cmd("quit", timeout=30) == "bye"
            except Exception:
                self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def peers():
    made = []

    def make(**kw):
        p = DDPeer(**kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


class Local:
    """This process's cluster (decoder): a blocks cache and a cache of batches, numpy, zeroed."""

    def __init__(self, listen_port=None, cluster=DECODER, role=LLMRole.DECODER, host_pool=None):
        cfg = LLMConfig()
        cfg.local_comm_res = ""
        if listen_port:
            cfg.listen_ip_info = f"127.0.0.1:{listen_port}"
        if host_pool:
            cfg.host_mem_pool_cfg = json.dumps({"memory_size": host_pool})
        self.dd = LLMDataDist(role, cluster)
        self.dd.init(cfg.generate_options())
        self.cm = self.dd.cache_manager
        self.blocks = np.zeros((NT, BLOCKS * BLOCK), np.uint8)
        self.cache = np.zeros((NT, BATCHES * BATCH), np.uint8)
        self.bc = self.cm.register_blocks_cache(
            CacheDesc(NT, [BLOCKS, BLOCK // 4], DataType.DT_INT32, Placement.HOST),
            [int(r.ctypes.data) for r in self.blocks], BlocksCacheKey(cluster, 0))
        self.cc = self.cm.register_cache(
            CacheDesc(NT, [BATCHES, BATCH // 4], DataType.DT_INT32, Placement.HOST),
            [int(r.ctypes.data) for r in self.cache], [CacheKey(cluster, 7, 1)])

    def link(self, peer, timeout=5000):
        return self.dd.link_clusters([cluster_info(peer.cluster, peer.port)], timeout)


def cluster_info(cid, port):
    c = LLMClusterInfo()
    c.remote_cluster_id = cid
    c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    return c


@pytest.fixture
def local():
    made = []

    def make(**kw):
        lc = Local(**kw)
        made.append(lc)
        return lc

    yield make
    for lc in made:
        lc.dd.finalize()


def status_of(fn, *args, **kwargs):
    with pytest.raises(LLMException) as e:
        fn(*args, **kwargs)
    return e.value.status_code


def blk(arr, b, n=1):
    return arr[:, b * BLOCK:(b + n) * BLOCK]


def bat(arr, b):
    return arr[:, b * BATCH:(b + 1) * BATCH]


# ---- surface ----


def test_names_values_and_options():
    assert LLMStatusCode.LLM_SUCCESS == 0 and LLMStatusCode.LLM_FAILED == 0xFFFFFFFF
    assert LLMStatusCode.LLM_PARAM_INVALID == 0x5010B005
    assert LLMStatusCode.LLM_NOT_YET_LINK == 0x5010B007 and LLMStatusCode.LLM_ALREADY_LINK == 0x5010B008
    assert LLMStatusCode.LLM_KV_CACHE_NOT_EXIST == 0x5010B002
    assert LLMStatusCode.LLM_FEATURE_NOT_ENABLED == 0x5010B019 and LLMStatusCode.LLM_TIMEOUT == 0x5010B01A
    assert LLMStatusCode.LLM_WAIT_PROCESS_TIMEOUT == 0x5010B001 and LLMStatusCode.LLM_UNKNOWN_ERROR == -1
    assert (LLMRole.PROMPT, LLMRole.DECODER, LLMRole.MIX) == (1, 2, 3)
    assert (Placement.HOST, Placement.DEVICE) == (0, 1)
    assert [m.value for m in ld.RegisterMemStatus] == [0, 1, 2]
    assert {d.name: d.value for d in DataType} == {
        "DT_FLOAT": 0, "DT_FLOAT16": 1, "DT_BF16": 27, "DT_INT8": 2, "DT_INT16": 6, "DT_UINT16": 7, "DT_UINT8": 4,
        "DT_INT32": 3, "DT_INT64": 9, "DT_UINT32": 8, "DT_UINT64": 10, "DT_BOOL": 12, "DT_DOUBLE": 11,
        "DT_STRING": 13}
    assert ld.LLMConfig is ld.LlmConfig and issubclass(LLMException, RuntimeError)
    cfg = LLMConfig()
    cfg.device_id = 3
    cfg.listen_ip_info = "127.0.0.1:26000"
    cfg.sync_kv_timeout = 2000
    cfg.local_comm_res = ""
    cfg.transfer_backend = "hixl"
    cfg.enable_switch_role = True
    assert cfg.generate_options() == {
        "ge.exec.deviceId": "3", "ge.session_device_id": "3", "llm.SyncKvCacheWaitTime": "2000",
        "llm.listenIpInfo": "127.0.0.1:26000", "llm.LocalCommRes": "", "llm.TransferBackend": "hixl",
        "llm.EnableSwitchRole": "1"}
    assert status_of(setattr, cfg, "device_id", -1) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(setattr, cfg, "sync_kv_timeout", 0) == LLMStatusCode.LLM_PARAM_INVALID
    d = CacheDesc(2, [8, 16], DataType.DT_FLOAT16, batch_dim_index=1)
    assert (d.size, d.batch_size, d.placement) == (256, 16, Placement.DEVICE)
    assert status_of(CacheDesc, 2, [8, 16], DataType.DT_FLOAT16, batch_dim_index=2) == \
        LLMStatusCode.LLM_PARAM_INVALID
    k = CacheKey(prompt_cluster_id=1, req_id=5)
    assert (k.cluster_id, k.req_id, k.model_id, k.prefix_id) == (1, 5, 0, 2**64 - 1)
    assert BlocksCacheKey(3).model_id == 0 and BlocksCacheKey(cluster_id=3, model_id=2).model_id == 2
    assert status_of(CacheKey, 1) == LLMStatusCode.LLM_PARAM_INVALID  # no req_id
    c = LLMClusterInfo()
    c.append_remote_ip_info("10.1.2.3", 26000)
    assert c.remote_ip_info_list == [(0x0302010A, 26000)]  # CANN's inet_aton, little-endian


# ---- pulls ----


def test_pull_blocks_and_cache_verified(peers, local):
    peer = peers(seed=11)
    me = local()
    pblocks, pcache = peer.initial()
    # before a link: LLM_NOT_YET_LINK
    assert status_of(me.cm.pull_blocks, BlocksCacheKey(PROMPT, 0), me.bc, [0], [0]) == LLMStatusCode.LLM_NOT_YET_LINK
    assert me.link(peer) == (LLMStatusCode.LLM_SUCCESS, [LLMStatusCode.LLM_SUCCESS])

    rng = np.random.default_rng(5)
    expect_b = me.blocks.copy()
    for _ in range(4):
        n = int(rng.integers(1, BLOCKS))
        src = [int(x) for x in rng.permutation(BLOCKS)[:n]]
        dst = [int(x) for x in rng.permutation(BLOCKS)[:n]]
        me.cm.pull_blocks(BlocksCacheKey(PROMPT, 0), me.bc, src, dst)
        for s, d in zip(src, dst):
            blk(expect_b, d)[:] = blk(pblocks, s)
        assert np.array_equal(me.blocks, expect_b)
    # a run consecutive on both sides (one descriptor per tensor), by cache id
    me.cm.pull_blocks(BlocksCacheKey(PROMPT, 0), me.bc, [3, 4, 5, 6], [9, 10, 11, 12])
    blk(expect_b, 9, 4)[:] = blk(pblocks, 3, 4)
    assert np.array_equal(me.blocks, expect_b)
    # layers: the peer's layer 1 (tensors 2, 3) into this side's layer 0 (tensors 0, 1)
    me.cm.pull_blocks(BlocksCacheKey(PROMPT, 0), me.bc, [0], [15], src_layer_range=range(1, 2),
                      dst_layer_range=range(0, 1), tensor_num_per_layer=2)
    blk(expect_b, 15)[0:2] = blk(pblocks, 0)[2:4]
    assert np.array_equal(me.blocks, expect_b)

    expect_c = me.cache.copy()
    me.cm.pull_cache(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 2), me.cc, batch_index=1)
    bat(expect_c, 1)[:] = bat(pcache, 2)
    me.cm.pull_cache(CacheKey(PROMPT, 7, 1), me.cc, batch_index=3, size=100)  # by request key, 100 bytes
    bat(expect_c, 3)[:, :100] = bat(pcache, 0)[:, :100]
    me.cm.pull_cache(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 3), me.cc, 0, src_layer_range=range(0, 1),
                     dst_layer_range=range(1, 2))
    bat(expect_c, 0)[2:4] = bat(pcache, 3)[0:2]
    assert np.array_equal(me.cache, expect_c)
    assert np.array_equal(me.blocks, expect_b)  # untouched by the cache pulls

    # a cache over ctypes buffers (any memory with an address), 8 blocks of the same size
    import ctypes

    bufs = [ctypes.create_string_buffer(8 * BLOCK) for _ in range(NT)]
    cbc = me.cm.register_blocks_cache(CacheDesc(NT, [8, BLOCK // 4], DataType.DT_INT32, Placement.HOST),
                                      [ctypes.addressof(b) for b in bufs], BlocksCacheKey(DECODER, 1))
    me.cm.pull_blocks(BlocksCacheKey(PROMPT, 0), cbc, [15, 0], [7, 0])
    for t, b in enumerate(bufs):
        got = np.frombuffer(b.raw, np.uint8)
        assert np.array_equal(got[7 * BLOCK:8 * BLOCK], blk(pblocks, 15)[t])
        assert np.array_equal(got[:BLOCK], blk(pblocks, 0)[t])
        assert not got[BLOCK:7 * BLOCK].any()
    me.cm.unregister_cache(cbc.cache_id)


# ---- pushes ----


def test_push_blocks_and_cache_with_layer_ranges(peers, local, tmp_path):
    peer = peers(seed=12)
    me = local()
    pblocks, pcache = peer.initial()
    rng = np.random.default_rng(6)
    me.blocks[:] = rng.integers(0, 256, me.blocks.shape, dtype=np.uint8)
    me.cache[:] = rng.integers(0, 256, me.cache.shape, dtype=np.uint8)
    assert me.link(peer)[0] == LLMStatusCode.LLM_SUCCESS

    me.cm.push_blocks(BlocksCacheKey(PROMPT, 0), me.bc, [0, 1, 7], [4, 5, 2])  # every layer
    for s, d in zip([0, 1, 7], [4, 5, 2]):
        blk(pblocks, d)[:] = blk(me.blocks, s)
    # this side's layer 1 into the peer's layer 0, one tensor a layer: tensor 1 → tensor 0
    me.cm.push_blocks(BlocksCacheKey(PROMPT, 0), me.bc, [9], [9], src_layer_range=range(1, 2),
                      dst_layer_range=range(0, 1), tensor_num_per_layer=1)
    blk(pblocks, 9)[0] = blk(me.blocks, 9)[1]
    me.cm.push_cache(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 3), me.cc, src_batch_index=1)
    bat(pcache, 3)[:] = bat(me.cache, 1)
    me.cm.push_cache(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), me.cc, src_batch_index=2,
                     src_layer_range=range(0, 1), dst_layer_range=range(1, 2))
    bat(pcache, 0)[2:4] = bat(me.cache, 2)[0:2]
    got_b, got_c = peer.dump(tmp_path)
    assert np.array_equal(got_b, pblocks) and np.array_equal(got_c, pcache)

    # a layer range past the tensors, ranges of different lengths, size other than -1
    assert status_of(me.cm.push_blocks, BlocksCacheKey(PROMPT, 0), me.bc, [0], [0], src_layer_range=range(0, 3),
                     dst_layer_range=range(0, 3)) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.push_blocks, BlocksCacheKey(PROMPT, 0), me.bc, [0], [0], src_layer_range=range(0, 1),
                     dst_layer_range=range(0, 2)) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.push_cache, CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), me.cc,
                     size=8) == LLMStatusCode.LLM_PARAM_INVALID
    got_b2, got_c2 = peer.dump(tmp_path)
    assert np.array_equal(got_b2, pblocks) and np.array_equal(got_c2, pcache)  # nothing moved


class Sync(LayerSynchronizer):
    def __init__(self, ok=True):
        self.ok, self.layers = ok, []

    def synchronize_layer(self, layer_index, timeout_in_millis):
        self.layers.append(layer_index)
        return self.ok


class Raising(LayerSynchronizer):
    def synchronize_layer(self, layer_index, timeout_in_millis):
        raise RuntimeError("no layer today")


def test_transfer_cache_async_layer_by_layer(peers, local, tmp_path):
    peer = peers(seed=13)
    me = local()
    pblocks, pcache = peer.initial()
    rng = np.random.default_rng(7)
    me.blocks[:] = rng.integers(0, 256, me.blocks.shape, dtype=np.uint8)
    me.cache[:] = rng.integers(0, 256, me.cache.shape, dtype=np.uint8)
    assert me.link(peer)[0] == LLMStatusCode.LLM_SUCCESS
    sync = Sync()
    task = me.cm.transfer_cache_async(me.bc, sync, [TransferWithCacheKeyConfig(BlocksCacheKey(PROMPT, 0),
                                                                              range(0, 2), range(0, 2))],
                                      [1, 2], [6, 7])
    assert task.get_results(10000) == [LLMStatusCode.LLM_SUCCESS] and sync.layers == [0, 1]
    blk(pblocks, 6, 2)[:] = blk(me.blocks, 1, 2)
    cfg = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 2), range(1, 2), range(0, 1), 3)
    assert me.cm.transfer_cache_async(me.cc, Sync(), [cfg]).synchronize(10000) == LLMStatusCode.LLM_SUCCESS
    bat(pcache, 2)[0:2] = bat(me.cache, 3)[2:4]
    got_b, got_c = peer.dump(tmp_path)
    assert np.array_equal(got_b, pblocks) and np.array_equal(got_c, pcache)
    # a synchronizer that fails: the destination's status, nothing moved
    bad = me.cm.transfer_cache_async(me.cc, Sync(False), [cfg])
    assert bad.get_results(10000) == [LLMStatusCode.LLM_PARAM_INVALID]
    # a synchronizer that raises: failed, not a success (the results stayed empty)
    raised = me.cm.transfer_cache_async(me.cc, Raising(), [cfg])
    assert raised.get_results(10000) == [LLMStatusCode.LLM_FAILED]
    assert raised.synchronize(10000) == LLMStatusCode.LLM_FAILED
    # two configs to one cluster: every layer of each, a result each (the second's last layer
    # was skipped once the first had finished)
    two = [TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), range(0, 1), range(0, 1), 1),
           TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 1), range(0, 2), range(0, 2), 2)]
    assert me.cm.transfer_cache_async(me.cc, Sync(), two).get_results(10000) == [LLMStatusCode.LLM_SUCCESS] * 2
    bat(pcache, 0)[0:2] = bat(me.cache, 1)[0:2]
    bat(pcache, 1)[:] = bat(me.cache, 2)
    got_b, got_c = peer.dump(tmp_path)
    assert np.array_equal(got_b, pblocks) and np.array_equal(got_c, pcache)


# ---- roles ----


def test_switch_role_then_the_peer_pulls(peers, local, tmp_path):
    peer = peers(seed=14)
    me = local()  # a decoder with no listen address
    pblocks, _ = peer.initial()
    assert me.link(peer)[0] == LLMStatusCode.LLM_SUCCESS
    me.cm.pull_blocks(BlocksCacheKey(PROMPT, 0), me.bc, [2], [2])
    assert np.array_equal(blk(me.blocks, 2), blk(pblocks, 2))
    port = free_port()
    # listening elsewhere while linked: LLM_EXIST_LINK, the role unchanged
    assert status_of(me.dd.switch_role, LLMRole.PROMPT,
                     {"llm.listenIpInfo": f"127.0.0.1:{port}"}) == LLMStatusCode.LLM_EXIST_LINK
    assert me.dd.unlink_clusters([cluster_info(PROMPT, peer.port)], 5000) == (LLMStatusCode.LLM_SUCCESS,
                                                                             [LLMStatusCode.LLM_SUCCESS])
    me.dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{port}"})
    # the peer (a prompt switched to decoder) links here and pulls this side's blocks
    assert peer.cmd(f"switch 2 0") == "ok"
    assert peer.cmd(f"link {DECODER} {port}") == "ok"
    assert peer.cmd(f"link {DECODER} {port}") == "LLM_ALREADY_LINK"
    mine = np.random.default_rng(8).integers(0, 256, me.blocks.shape, dtype=np.uint8)
    me.blocks[:] = mine
    assert peer.cmd(f"pull_blocks {DECODER} 0,1,2,3 12,13,14,15") == "ok"
    assert peer.cmd(f"pull_blocks {DECODER} 16 0") == "LLM_PARAM_INVALID"  # outside the cache
    got_b, _ = peer.dump(tmp_path)
    blk(pblocks, 12, 4)[:] = blk(mine, 0, 4)
    assert np.array_equal(got_b, pblocks)
    assert peer.cmd(f"unlink {DECODER}") == "ok"


# ---- bad inputs ----


def test_bad_inputs_and_their_status(peers, local):
    peer = peers(seed=15)
    # calls before init
    dd = LLMDataDist(LLMRole.DECODER, DECODER)
    assert status_of(lambda: dd.cache_manager) == LLMStatusCode.LLM_FAILED
    me = local()
    # a second instance in the process
    other = LLMDataDist(LLMRole.PROMPT, 9)
    assert status_of(other.init, LLMConfig().generate_options()) == LLMStatusCode.LLM_FAILED
    # a link to a port nobody listens on; an address to link to missing; linking to oneself
    assert me.dd.link_clusters([cluster_info(PROMPT, free_port())], 1000)[1] == [LLMStatusCode.LLM_LINK_FAILED]
    no_addr = LLMClusterInfo()
    no_addr.remote_cluster_id = PROMPT
    assert me.dd.link_clusters([no_addr], 1000) == (LLMStatusCode.LLM_PARAM_INVALID,
                                                    [LLMStatusCode.LLM_PARAM_INVALID])
    assert me.dd.link_clusters([cluster_info(DECODER, peer.port)], 1000)[0] == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.dd.link_clusters, [cluster_info(PROMPT, peer.port)], 0) == LLMStatusCode.LLM_PARAM_INVALID
    # pull and push before a link
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, 2, 0), me.cc) == LLMStatusCode.LLM_NOT_YET_LINK
    assert status_of(me.cm.push_blocks, BlocksCacheKey(PROMPT, 0), me.bc, [0], [0]) == \
        LLMStatusCode.LLM_NOT_YET_LINK
    # unlink what is not linked: LLM_NOT_YET_LINK; forced: nothing to do
    assert me.dd.unlink_clusters([cluster_info(PROMPT, peer.port)]) == (LLMStatusCode.LLM_NOT_YET_LINK,
                                                                       [LLMStatusCode.LLM_NOT_YET_LINK])
    assert me.dd.unlink_clusters([cluster_info(PROMPT, peer.port)], force=True)[0] == LLMStatusCode.LLM_SUCCESS

    assert me.link(peer) == (LLMStatusCode.LLM_SUCCESS, [LLMStatusCode.LLM_SUCCESS])
    assert me.link(peer) == (LLMStatusCode.LLM_ALREADY_LINK, [LLMStatusCode.LLM_ALREADY_LINK])
    key = BlocksCacheKey(PROMPT, 0)
    # unknown cache keys
    assert status_of(me.cm.pull_blocks, BlocksCacheKey(PROMPT, 5), me.bc, [0], [0]) == \
        LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, 99, 0), me.cc) == \
        LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    assert status_of(me.cm.pull_cache, CacheKey(PROMPT, 8, 1), me.cc) == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    # an unknown cluster; the own cluster
    assert status_of(me.cm.pull_blocks, BlocksCacheKey(77, 0), me.bc, [0], [0]) == LLMStatusCode.LLM_NOT_YET_LINK
    assert status_of(me.cm.pull_blocks, BlocksCacheKey(DECODER, 0), me.bc, [0], [0]) == \
        LLMStatusCode.LLM_PARAM_INVALID
    # blocks outside either cache, batches outside, sizes past a batch
    before = me.blocks.copy()
    for src, dst in [([BLOCKS], [0]), ([0], [BLOCKS]), ([0, 1], [0]), ([], [0]), ([0], [])]:
        assert status_of(me.cm.pull_blocks, key, me.bc, src, dst) == LLMStatusCode.LLM_PARAM_INVALID, (src, dst)
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, peer.cache_id, BATCHES), me.cc) == \
        LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), me.cc,
                     batch_index=BATCHES) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), me.cc,
                     size=BATCH + 1) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), me.cc,
                     size=0) == LLMStatusCode.LLM_PARAM_INVALID
    # the wrong kind of local cache; a layer range without its pair; tensor_num_per_layer 0
    assert status_of(me.cm.pull_cache, CacheKeyByIdAndIndex(PROMPT, peer.cache_id, 0), me.bc) == \
        LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.pull_blocks, key, me.cc, [0], [0]) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.pull_blocks, key, me.bc, [0], [0], src_layer_range=range(0, 1)) == \
        LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.pull_blocks, key, me.bc, [0], [0], tensor_num_per_layer=0) == \
        LLMStatusCode.LLM_PARAM_INVALID
    assert np.array_equal(me.blocks, before)
    # registrations: no address, a count other than num_tensors, a zero address, after link
    desc = CacheDesc(2, [4, 8], DataType.DT_INT32, Placement.HOST)
    buf = np.zeros((2, 128), np.uint8)
    addrs = [int(r.ctypes.data) for r in buf]
    assert status_of(me.cm.register_cache, desc, []) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.register_cache, desc, addrs[:1]) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.register_cache, desc, [addrs[0], 0]) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.register_cache, desc, addrs, [CacheKey(DECODER, r) for r in range(5)]) == \
        LLMStatusCode.LLM_PARAM_INVALID  # key i names batch i: five keys, four batches
    # rank tables: ranks out of order, not a table, unknown comm ids; no memory pool configured
    assert status_of(me.dd.link, "comm", {PROMPT: 1, DECODER: 0}, "{}") == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.dd.link, "comm", {PROMPT: 0, DECODER: 1}, "{}") == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.dd.link, "", {PROMPT: 0, DECODER: 1}, "{}") == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.dd.query_register_mem_status, 1) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.dd.unlink, 1) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(me.cm.allocate_cache, desc) == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    # after an unlink, pulls are LLM_NOT_YET_LINK again
    assert me.dd.unlink_clusters([cluster_info(PROMPT, peer.port)])[0] == LLMStatusCode.LLM_SUCCESS
    assert status_of(me.cm.pull_blocks, key, me.bc, [0], [0]) == LLMStatusCode.LLM_NOT_YET_LINK
    # finalize: the cache manager refuses; finalize twice is fine
    me.dd.finalize()
    me.dd.finalize()
    assert status_of(me.cm.pull_blocks, key, me.bc, [0], [0]) == LLMStatusCode.LLM_FAILED


def test_link_releases_the_gil(local):
    """A link that waits (a peer that accepts the TCP connection and never answers) runs without
    the GIL: another Python thread keeps running meanwhile; the link ends by its timeout."""
    import threading

    me = local()
    silent = socket.create_server(("127.0.0.1", 0))  # never accepts: the handshake stalls
    port = silent.getsockname()[1]
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    start = time.monotonic()
    ret, rets = me.dd.link_clusters([cluster_info(PROMPT, port)], 500)
    elapsed = time.monotonic() - start
    done.set()
    t.join()
    silent.close()
    assert (ret, rets) == (LLMStatusCode.LLM_TIMEOUT, [LLMStatusCode.LLM_TIMEOUT])
    assert elapsed >= 0.4, elapsed
    assert len(ticks) > 5, len(ticks)  # the other thread ran while the link waited


def test_memory_pool_caches_of_requests_and_a_pull_into_blocks(peers, local, tmp_path):
    """CANN's pull_cache_sample / pull_from_cache_to_blocks shape on host pools: the prompt
    allocates a cache of two requests after the link, the decoder pulls each by its CacheKey,
    one into a pooled cache of batches, one cut into two blocks of a pooled blocks cache."""
    env = dict(os.environ, DD_HOST_POOL=str(1 << 20))
    p = peers(env=env)
    lc = local(host_pool=1 << 16)
    assert lc.link(p)[0] == LLMStatusCode.LLM_SUCCESS
    path = os.path.join(str(tmp_path), "alloc.npy")
    assert p.cmd(f"alloc {path} 10,11") == "ok"
    rows = np.load(path)  # 4 tensors x (2 batches x 256 bytes)

    def mem(cache, n):
        return np.stack([np.frombuffer(ctypes.string_at(a, n), np.uint8) for a in cache.tensor_addrs])

    desc = CacheDesc(NT, [2, 64], DataType.DT_INT32, Placement.HOST)
    c = lc.cm.allocate_cache(desc)
    lc.cm.pull_cache(CacheKey(PROMPT, 11), c, batch_index=0)
    assert np.array_equal(mem(c, 512)[:, :256], rows[:, 256:])
    bdesc = CacheDesc(NT, [4, 32], DataType.DT_INT32, Placement.HOST)  # blocks of 128 bytes
    b = lc.cm.allocate_blocks_cache(bdesc)
    lc.cm.pull_blocks(CacheKey(PROMPT, 10), b, src_blocks=[], dst_blocks=[3, 1])
    got = mem(b, 512)
    assert np.array_equal(got[:, 384:512], rows[:, 0:128])
    assert np.array_equal(got[:, 128:256], rows[:, 128:256])
    assert status_of(lc.cm.pull_blocks, CacheKey(PROMPT, 10), b, [], [3]) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(lc.cm.pull_cache, CacheKey(PROMPT, 12), c) == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST

    # the pool: full, given back, none for device memory; caches not from it are not its
    big = CacheDesc(NT, [64, 64], DataType.DT_INT32, Placement.HOST)  # 4 x 16 KiB: the 64 KiB pool is taken
    assert status_of(lc.cm.allocate_cache, big) == LLMStatusCode.LLM_OUT_OF_MEMORY
    lc.cm.deallocate_cache(c)
    lc.cm.deallocate_blocks_cache(b)
    lc.cm.deallocate_cache(lc.cm.allocate_cache(big))
    dev = CacheDesc(NT, [2, 64], DataType.DT_INT32, Placement.DEVICE)
    assert status_of(lc.cm.allocate_cache, dev) == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
    assert status_of(lc.cm.deallocate_cache, lc.cc) == LLMStatusCode.LLM_PARAM_INVALID
    assert status_of(lc.cm.allocate_cache, desc, [CacheKey(DECODER, r) for r in range(3)]) == \
        LLMStatusCode.LLM_PARAM_INVALID  # three keys for two batches

    # the prompt removes request 11's key: a link made afterwards does not find it
    assert p.cmd("rmkey 11") == "ok"
    assert p.cmd("rmkey 99") == "ok"
    c = lc.cm.allocate_cache(desc)
    assert lc.dd.unlink_clusters([cluster_info(PROMPT, p.port)], 5000, force=True)[0] == LLMStatusCode.LLM_SUCCESS
    assert lc.link(p)[0] == LLMStatusCode.LLM_SUCCESS
    assert status_of(lc.cm.pull_cache, CacheKey(PROMPT, 11), c) == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST
    lc.cm.pull_cache(CacheKey(PROMPT, 10), c, batch_index=1)
    assert np.array_equal(mem(c, 512)[:, 256:], rows[:, :256])
    assert p.cmd("dealloc") == "ok"


def test_deallocating_a_pool_cache_waits_for_the_pull_that_writes_it(peers, local):
    """A 64 MiB pull_blocks into a cache of the host pool; once its first bytes landed the cache
    is deallocated and the next allocate_blocks_cache gets the same bytes, filled with a
    sentinel at once. The deallocation returns only once the pull ended: the pulled bytes are
    all there, and none lands in the new cache (the rule is the Rust layer's, under Python)."""
    size, page = 64 << 20, 4096
    p = peers(env=dict(os.environ, DD_BIG=str(size)))
    lc = local(host_pool=size)
    assert lc.link(p)[0] == LLMStatusCode.LLM_SUCCESS
    blocks = size // page
    desc = CacheDesc(1, [blocks, page // 4], DataType.DT_INT32, Placement.HOST)
    theirs_last = np.random.default_rng(p.seed + 1000).integers(0, 256, size, dtype=np.uint8)[-page:]
    rounds, raced, incomplete, written = 5, 0, 0, 0
    for r in range(rounds):
        c = lc.cm.allocate_blocks_cache(desc)
        base = c.tensor_addrs[0]
        ctypes.memset(base, 0, size)
        failed = []

        def pull():
            try:
                lc.cm.pull_blocks(BlocksCacheKey(PROMPT, 1), c, list(range(blocks)), list(range(blocks)))
            except LLMException as e:
                failed.append(e)

        t = threading.Thread(target=pull)
        t.start()
        first = ctypes.c_uint64.from_address(base)
        while first.value == 0 and t.is_alive():  # until its first bytes landed (or it ended)
            pass
        raced += t.is_alive()
        lc.cm.deallocate_blocks_cache(c)
        last = np.frombuffer(ctypes.string_at(base + size - page, page), np.uint8)
        incomplete += not np.array_equal(last, theirs_last)
        again = lc.cm.allocate_blocks_cache(desc)
        assert again.tensor_addrs[0] == base, "the same bytes, handed out again"
        ctypes.memset(base, 0xA5, size)
        t.join()
        assert not failed, failed
        got = np.frombuffer(ctypes.string_at(base, size), np.uint8).reshape(blocks, page)
        pages = int(np.count_nonzero((got != 0xA5).any(axis=1)))
        if pages:
            print(f"round {r}: {pages} of {blocks} pages written after deallocate returned")
        written += pages > 0
        lc.cm.deallocate_blocks_cache(again)
    print(f"{raced} of {rounds} rounds deallocated while the pull ran")
    assert (incomplete, written) == (0, 0), f"of {rounds} rounds: pull incomplete; new cache written"


def test_a_bad_pool_configuration_fails_init():
    for bad in ['{"memory_size": 0}', '{"memory_size": "1"}', "not json", "{}", '{"memory_size": true}']:
        cfg = LLMConfig()
        cfg.local_comm_res = ""
        cfg.host_mem_pool_cfg = bad
        dd = LLMDataDist(LLMRole.DECODER, DECODER)
        assert status_of(dd.init, cfg.generate_options()) == LLMStatusCode.LLM_PARAM_INVALID, bad
