"""The conformance table (tests/conformance/cases.json, issue 44) through Python: the engine's
cases through ``hixl.Hixl`` (CANN's flat layer), LLM-DataDist's through the ``llm_datadist``
package. The peers live in this process: an engine and an LLM-DataDist cluster (the native
instance: the package keeps one ``LLMDataDist`` per process), each on a port the OS chose. The
same table runs through Rust (tests/conformance/) and C and C++ (hixl-capi/tests/conformance.rs);
the table says what each case means."""
import json
import os

import numpy as np
import pytest

import hixl
from hixl._hixl import datadist as native
from llm_datadist import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LLMDataDist,
    LLMException,
    LLMRole,
    LLMStatusCode,
    Placement,
)

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "..", "..", "tests", "conformance", "cases.json")
PEER, ME, TENSORS, REGION = 1, 2, 4, 4096
BLOCKS_SHAPE, BATCHES_SHAPE = [16, 32], [4, 64]
HIXL_CODES = {"SUCCESS": 0, "PARAM_INVALID": 103900, "TIMEOUT": 103901, "NOT_CONNECTED": 103902,
              "ALREADY_CONNECTED": 103903, "NOTIFY_FAILED": 103904, "UNSUPPORTED": 103905,
              "RESOURCE_EXHAUSTED": 203900, "FAILED": 503900}


def load():
    with open(TABLE) as f:
        doc = json.load(f)
    cases = []
    for c in doc["cases"]:
        absent = c.get("absent", {})
        if "python" in doc["surfaces"][c["product"]] and "python" not in absent:
            cases.append(c)
    return cases


CASES = load()


def expected(case):
    name = case["expect"]
    return int(getattr(LLMStatusCode, name)) if name.startswith("LLM_") else HIXL_CODES[name]


def tensors(shape):
    return np.zeros((TENSORS, int(np.prod(shape)) * 4), np.uint8)


def addrs(arr):
    return [int(r.ctypes.data) for r in arr]


# ---- the peers ----


@pytest.fixture(scope="module")
def engine_peer():
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0", {}) == hixl.SUCCESS
    ret, name = h.local_engine()
    assert ret == hixl.SUCCESS
    ret, mem = h.alloc_host_mem(REGION)
    assert ret == hixl.SUCCESS
    yield name, mem.addr
    h.finalize()


@pytest.fixture(scope="module")
def dd_peer():
    peer = native.DataDist(PEER, 1)
    assert peer.initialize({"llm.ListenIpInfo": "127.0.0.1:0"}) == 0
    blocks, batches = tensors(BLOCKS_SHAPE), tensors(BATCHES_SHAPE)
    ret, blocks_id = peer.register_cache(0, TENSORS, int(DataType.DT_INT32.value), BLOCKS_SHAPE, addrs(blocks),
                                         1, 0, [(2**64 - 1, 0)])
    assert ret == 0
    ret, batches_id = peer.register_cache(0, TENSORS, int(DataType.DT_INT32.value), BATCHES_SHAPE,
                                          addrs(batches), 0, 0, [(7, 1)])
    assert ret == 0
    ip, port = peer.listen_addr.rsplit(":", 1)
    yield {"ip": ip, "port": int(port), "blocks": blocks_id, "batches": batches_id}
    peer.finalize()
    del blocks, batches


# ---- the engine ----


def engine_status(case, peer_name, peer_region):
    args = case.get("args", {})
    me = hixl.Hixl()
    region, unregistered, fresh = (np.zeros(REGION, np.uint8) for _ in range(3))
    base = int(region.ctypes.data)
    if case["state"] != "fresh":
        assert me.initialize("127.0.0.1", {}) == hixl.SUCCESS
        assert me.register_mem(hixl.MemDesc(base, REGION), hixl.MemType.MEM_HOST)[0] == hixl.SUCCESS
    if case["state"] == "connected":
        assert me.connect(peer_name, 5000) == hixl.SUCCESS
    if case["state"] == "finalized":
        me.finalize()
    remote = peer_name if args.get("remote", "peer") == "peer" else "not an engine name"
    timeout = args.get("timeout", 1000)
    call = case["call"]
    try:
        if call == "initialize":
            return me.initialize(args.get("name", ""), args.get("options", {}))
        if call == "register":
            addr = {"null": 0, "overlap": base + 1024}.get(args.get("addr"), int(fresh.ctypes.data))
            return me.register_mem(hixl.MemDesc(addr, args.get("len", 0)), hixl.MemType.MEM_HOST)[0]
        if call == "deregister":
            return me.deregister_mem(0xdeadbeef)
        if call == "transfer_status":
            return me.get_transfer_status(0xdeadbeef)[0]
        if call == "connect":
            return me.connect(remote, timeout)
        if call == "disconnect":
            return me.disconnect(remote, timeout)
        if call == "notify":
            # a name and a message of name_len and msg_len bytes (by default short ones)
            notify = hixl.NotifyDesc("n" * args.get("name_len", 11), "m" * args.get("msg_len", 1))
            return me.send_notify(remote, notify, timeout)
        if call == "transfer":
            op = hixl.TransferOp.READ if args["op"] == "read" else hixl.TransferOp.WRITE
            descs = []
            for local, loff, rem, roff, n in args["descs"]:
                lbase = base if local == "region" else int(unregistered.ctypes.data)
                rbase = peer_region if rem == "peer" else peer_region + 16 * REGION
                descs.append(hixl.TransferOpDesc(lbase + loff, rbase + roff, n))
            return me.transfer_sync(peer_name, op, descs, timeout)
        raise AssertionError(f"{case['id']}: call {call}")
    finally:
        me.finalize()


@pytest.mark.parametrize("case", [c for c in CASES if c["product"] == "engine"], ids=lambda c: c["id"])
def test_engine_case(case, engine_peer):
    assert engine_status(case, *engine_peer) == expected(case)


# ---- LLM-DataDist ----


def cluster(args, peer):
    c = LLMClusterInfo()
    c.remote_cluster_id = ME if args.get("cluster", "peer") == "own" else PEER
    c.append_local_ip_info(peer["ip"], 0)
    if args.get("address", True):
        c.append_remote_ip_info(peer["ip"], peer["port"])
    return c


def key(case, peer):
    k = case["args"]["key"]
    cl = {"own": ME, "unknown": 77}.get(k.get("cluster"), PEER)
    cache = k["cache"]
    cache_id = k.get("id", peer.get(cache, 99))
    by = k.get("by", "default")
    if by == "request":
        return CacheKey(cl, 7, 1)
    if by == "default" and case["call"].endswith("_blocks") and cache != "batches":
        return BlocksCacheKey(cl, 0 if cache == "blocks" else 99)
    return CacheKeyByIdAndIndex(cl, cache_id, k.get("batch", 0))


def layer_kwargs(args):
    kw = {}
    lay = args.get("layers")
    if lay is not None:
        kw["src_layer_range"] = None if lay[0:2] == [-1, -1] else range(lay[0], lay[1] + 1)
        kw["dst_layer_range"] = None if lay[2:4] == [-1, -1] else range(lay[2], lay[3] + 1)
    if "per_layer" in args:
        kw["tensor_num_per_layer"] = args["per_layer"]
    return kw


def dd_status(case, peer):
    """The case's status: a call's returned status (links), or its exception's."""
    args = case["args"]
    dd = LLMDataDist(LLMRole.DECODER, ME)
    blocks, batches = tensors(BLOCKS_SHAPE), tensors(BATCHES_SHAPE)
    extra = np.zeros((2, 128), np.uint8)
    blocks_desc = CacheDesc(TENSORS, BLOCKS_SHAPE, DataType.DT_INT32, Placement.HOST)
    batches_desc = CacheDesc(TENSORS, BATCHES_SHAPE, DataType.DT_INT32, Placement.HOST)
    caches = {}
    cm = None
    if case["state"] != "uninit":
        cfg = LLMConfig()
        cfg.local_comm_res = ""
        dd.init(cfg.generate_options())
        cm = dd.cache_manager
        caches["blocks"] = cm.register_blocks_cache(blocks_desc, addrs(blocks))
        caches["batches"] = cm.register_cache(batches_desc, addrs(batches))
    caches["unknown"] = Cache(99, blocks_desc, [], cm, True, True)
    if case["state"] == "linked":
        assert dd.link_clusters([cluster({}, peer)], 5000)[0] == LLMStatusCode.LLM_SUCCESS
    if case["state"] == "finalized":
        dd.finalize()

    def manager():
        return cm if cm is not None else dd.cache_manager

    call = case["call"]
    try:
        local = caches.get(args.get("local"))
        if call == "pull_blocks":
            manager().pull_blocks(key(case, peer), local, args["src"], args["dst"], **layer_kwargs(args))
        elif call == "pull_cache":
            manager().pull_cache(key(case, peer), local, args.get("batch", 0), args.get("size", -1),
                                 **layer_kwargs(args))
        elif call == "push_blocks":
            manager().push_blocks(key(case, peer), local, args["src"], args["dst"], **layer_kwargs(args))
        elif call == "push_cache":
            manager().push_cache(key(case, peer), local, args.get("batch", 0), size=args.get("size", -1),
                                 **layer_kwargs(args))
        elif call == "register":
            a = addrs(extra)
            a = {"none": [], "one": a[:1], "zero": [a[0], 0]}.get(args["addrs"], a)
            desc = CacheDesc(2, [4, 8], DataType.DT_INT32, Placement.HOST)
            manager().register_cache(desc, a, [CacheKey(ME, r) for r in range(args.get("keys", 0))])
        elif call == "unregister":
            manager().unregister_cache(args["id"])
        elif call == "link":
            return int(dd.link_clusters([cluster(args, peer)], args["timeout"])[0])
        elif call == "unlink":
            return int(dd.unlink_clusters([cluster(args, peer)], args["timeout"])[0])
        else:
            raise AssertionError(f"{case['id']}: call {call}")
        return 0
    except LLMException as e:
        return int(e.status_code)
    finally:
        dd.finalize()
        del blocks, batches, extra


@pytest.mark.parametrize("case", [c for c in CASES if c["product"] == "datadist"], ids=lambda c: c["id"])
def test_datadist_case(case, dd_peer):
    got = dd_status(case, dd_peer)
    assert got == expected(case), f"{case['id']}: {got:#x}, the table: {case['expect']}"


def test_every_product_runs_here():
    assert {c["product"] for c in CASES} == {"engine", "datadist"}
    assert len(CASES) > 80
