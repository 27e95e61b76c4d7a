"""A cluster process for the llm_datadist tests: an LLMDataDist with a blocks cache and a cache
of batches of seeded random bytes, in host memory (numpy) or device memory (the ACL double's
aclrtMalloc), driven by line commands on stdin (one reply line each on stdout).

usage: python dd_peer.py CLUSTER_ID ROLE LISTEN_PORT PLACEMENT SEED
  ROLE 1 prompt / 2 decoder; LISTEN_PORT 0: no listen address; PLACEMENT host | device
with DD_BIG=N in the environment it also registers a blocks cache of one tensor of N bytes
(blocks of 4096), the seeded bytes of SEED + 1000, under BlocksCacheKey(CLUSTER, 1)
first line out: {"blocks_id": ..., "cache_id": ...}
commands (reply "ok", or the LLMStatusCode name of the failure):
  dump PATH                        np.save of {blocks, cache} (uint8, one row per tensor)
  link CLUSTER PORT | unlink CLUSTER
  pull_blocks CLUSTER SRC DST      comma-separated block lists, from BlocksCacheKey(CLUSTER, 0)
  switch ROLE PORT                 switch_role (PORT 0: no options)
  rtlink FILE MY_RANK PEER PEER_RANK   link by the rank table in FILE, wait for OK
  rtunlink                         unlink the last rtlink's comm
  alloc PATH REQS                  allocate_cache (host pool: DD_HOST_POOL bytes in the environment)
                                   of 4 tensors x 2 batches x 256 bytes under CacheKey(CLUSTER, req)
                                   for each comma-separated req, filled with seeded bytes, np.save'd
  rmkey REQ | dealloc              remove_cache_key(CacheKey(CLUSTER, REQ)); deallocate_cache (last)
  quit
"""
import ctypes
import json
import os
import sys
import time

import numpy as np

from llm_datadist import (
    BlocksCacheKey,
    CacheDesc,
    CacheKey,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
    RegisterMemStatus,
)

NT, BLOCKS, BLOCK_INTS = 4, 16, 32  # blocks cache: 4 tensors x 16 blocks x 128 bytes
BATCHES, BATCH_INTS = 4, 64  # cache: 4 tensors x 4 batches x 256 bytes

cluster, role, port, placement, seed = (int(sys.argv[1]), LLMRole(int(sys.argv[2])), int(sys.argv[3]),
                                        sys.argv[4], int(sys.argv[5]))
rng = np.random.default_rng(seed)
blocks = rng.integers(0, 256, (NT, BLOCKS * BLOCK_INTS * 4), dtype=np.uint8)
cache = rng.integers(0, 256, (NT, BATCHES * BATCH_INTS * 4), dtype=np.uint8)

cfg = LLMConfig()
cfg.local_comm_res = ""
if port:
    cfg.listen_ip_info = f"127.0.0.1:{port}"
if placement == "device":
    cfg.device_id = 1 if role == LLMRole.PROMPT else 0
if os.environ.get("DD_HOST_POOL"):
    cfg.host_mem_pool_cfg = json.dumps({"memory_size": int(os.environ["DD_HOST_POOL"])})
dd = LLMDataDist(role, cluster)
dd.init(cfg.generate_options())
cm = dd.cache_manager

if placement == "device":
    acl = ctypes.CDLL("libacl_rt.so")

    def to_device(rows):
        addrs = []
        for row in rows:
            p = ctypes.c_void_p()
            assert acl.aclrtMalloc(ctypes.byref(p), ctypes.c_size_t(row.nbytes), 1) == 0
            assert acl.aclrtMemcpy(p, ctypes.c_size_t(row.nbytes), ctypes.c_void_p(row.ctypes.data),
                                   ctypes.c_size_t(row.nbytes), 1) == 0
            addrs.append(p.value)
        return addrs

    def read(addrs, rows):
        out = np.zeros_like(rows)
        for i, a in enumerate(addrs):
            assert acl.aclrtMemcpy(ctypes.c_void_p(out[i].ctypes.data), ctypes.c_size_t(out[i].nbytes),
                                   ctypes.c_void_p(a), ctypes.c_size_t(out[i].nbytes), 2) == 0
        return out

    baddrs, caddrs = to_device(blocks), to_device(cache)
    where = Placement.DEVICE
else:
    baddrs = [int(r.ctypes.data) for r in blocks]
    caddrs = [int(r.ctypes.data) for r in cache]
    where = Placement.HOST

    def read(addrs, rows):
        return rows.copy()

bc = cm.register_blocks_cache(CacheDesc(NT, [BLOCKS, BLOCK_INTS], DataType.DT_INT32, where), baddrs,
                              BlocksCacheKey(cluster, 0))
cc = cm.register_cache(CacheDesc(NT, [BATCHES, BATCH_INTS], DataType.DT_INT32, where), caddrs,
                       [CacheKey(cluster, 7, 1)])
if os.environ.get("DD_BIG"):
    big = np.random.default_rng(seed + 1000).integers(0, 256, int(os.environ["DD_BIG"]), dtype=np.uint8)
    cm.register_blocks_cache(CacheDesc(1, [big.nbytes // 4096, 1024], DataType.DT_INT32, Placement.HOST),
                             [int(big.ctypes.data)], BlocksCacheKey(cluster, 1))
print(json.dumps({"blocks_id": bc.cache_id, "cache_id": cc.cache_id}), flush=True)


comms = []
allocated = []


def blist(s):
    return [int(x) for x in s.split(",")] if s else []


for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    try:
        if cmd[0] == "dump":
            np.savez(cmd[1], blocks=read(baddrs, blocks), cache=read(caddrs, cache))
        elif cmd[0] == "link":
            c = LLMClusterInfo()
            c.remote_cluster_id = int(cmd[1])
            c.append_local_ip_info("127.0.0.1", 0)
            c.append_remote_ip_info("127.0.0.1", int(cmd[2]))
            ret, rets = dd.link_clusters([c], 5000)
            if ret != 0:
                raise LLMException("link", status_code=ret)
        elif cmd[0] == "unlink":
            c = LLMClusterInfo()
            c.remote_cluster_id = int(cmd[1])
            ret, _ = dd.unlink_clusters([c], 5000, force=True)
            if ret != 0:
                raise LLMException("unlink", status_code=ret)
        elif cmd[0] == "pull_blocks":
            cm.pull_blocks(BlocksCacheKey(int(cmd[1]), 0), bc, blist(cmd[2]), blist(cmd[3]))
        elif cmd[0] == "switch":
            opts = {"llm.listenIpInfo": f"127.0.0.1:{cmd[2]}"} if int(cmd[2]) else None
            dd.switch_role(LLMRole(int(cmd[1])), opts)
        elif cmd[0] == "rtlink":  # rtlink RANK_TABLE_FILE MY_RANK PEER_CLUSTER PEER_RANK
            with open(cmd[1]) as f:
                table = f.read()
            comm = dd.link("rt", dict(sorted({cluster: int(cmd[2]), int(cmd[3]): int(cmd[4])}.items(),
                                             key=lambda kv: kv[1])), table)
            while dd.query_register_mem_status(comm) == RegisterMemStatus.PREPARING:
                time.sleep(0.01)
            if dd.query_register_mem_status(comm) != RegisterMemStatus.OK:
                raise LLMException("rtlink", status_code=LLMStatusCode.LLM_LINK_FAILED)
            comms.append(comm)
        elif cmd[0] == "rtunlink":
            dd.unlink(comms.pop())
        elif cmd[0] == "alloc":
            desc = CacheDesc(NT, [2, 64], DataType.DT_INT32, Placement.HOST)
            c = cm.allocate_cache(desc, [CacheKey(cluster, int(r)) for r in cmd[2].split(",")])
            rows = rng.integers(0, 256, (NT, 512), dtype=np.uint8)
            for a, row in zip(c.tensor_addrs, rows):
                ctypes.memmove(a, row.ctypes.data, row.nbytes)
            np.save(cmd[1], rows)
            allocated.append(c)
        elif cmd[0] == "rmkey":
            cm.remove_cache_key(CacheKey(cluster, int(cmd[1])))
        elif cmd[0] == "dealloc":
            cm.deallocate_cache(allocated.pop())
        elif cmd[0] == "quit":
            break
        print("ok", flush=True)
    except LLMException as e:
        print(e.status_code.name, flush=True)
cm.unregister_cache(bc.cache_id)
cm.unregister_cache(cc.cache_id)
dd.finalize()
print("bye", flush=True)
