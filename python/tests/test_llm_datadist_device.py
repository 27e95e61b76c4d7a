"""``llm_datadist`` with device memory, as a CANN program has it: the ACL/HCCL test double
(tools/ascend-double.sh, under CANN's library names) on the loader path, caches in
``aclrtMalloc`` memory on the device ``LLMConfig.device_id`` names, two cluster processes; the
pulls and pushes move over HCCL (the double's HcclBatchGet/HcclBatchPut) and are verified;
``swap_blocks`` copies blocks between the device cache and a host one.

Each case runs in a fresh interpreter whose ``LD_LIBRARY_PATH`` names the double (read at
startup), as test_device.py does."""
import os
import subprocess
import sys
import textwrap

from test_device import cann  # noqa: F401  (the fixture building the double)

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cann, tmp_path, body):
    log = tmp_path / "double.log"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(cann)
    env["HIXL_ASCEND_DOUBLE_LOG"] = str(log)
    env["TMPDIR"] = str(tmp_path)  # the double's announce directory: private to this test
    prelude = textwrap.dedent(
        f"""
        import ctypes, sys
        sys.path.insert(0, {HERE!r})
        import numpy as np
        from test_llm_datadist import *
        acl = ctypes.CDLL("libacl_rt.so")
        def dev_alloc(rows):
            addrs = []
            for row in rows:
                p = ctypes.c_void_p()
                assert acl.aclrtMalloc(ctypes.byref(p), ctypes.c_size_t(row.nbytes), 1) == 0
                assert acl.aclrtMemcpy(p, ctypes.c_size_t(row.nbytes), ctypes.c_void_p(row.ctypes.data),
                                       ctypes.c_size_t(row.nbytes), 1) == 0
                addrs.append(p.value)
            return addrs
        def dev_read(addrs, like):
            out = np.zeros_like(like)
            for i, a in enumerate(addrs):
                assert acl.aclrtMemcpy(ctypes.c_void_p(out[i].ctypes.data), ctypes.c_size_t(out[i].nbytes),
                                       ctypes.c_void_p(a), ctypes.c_size_t(out[i].nbytes), 2) == 0
            return out
        """
    )
    r = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return [line.split(" ", 1)[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_device_caches_pull_and_push_over_hccl(cann, tmp_path):
    calls = run(
        cann,
        tmp_path,
        f"""
        tmp = {str(tmp_path)!r}
        peer = DDPeer(placement="device", seed=21)
        pblocks, pcache = peer.initial()
        cfg = LLMConfig()
        cfg.device_id = 0
        cfg.local_comm_res = ""
        dd = LLMDataDist(LLMRole.DECODER, DECODER)
        dd.init(cfg.generate_options())
        cm = dd.cache_manager
        rng = np.random.default_rng(22)
        mine = rng.integers(0, 256, (NT, BLOCKS * BLOCK), dtype=np.uint8)
        addrs = dev_alloc(mine)
        bc = cm.register_blocks_cache(CacheDesc(NT, [BLOCKS, BLOCK // 4], DataType.DT_INT32, Placement.DEVICE),
                                      addrs, BlocksCacheKey(DECODER, 0))
        assert dd.link_clusters([cluster_info(PROMPT, peer.port)], 5000)[0] == LLMStatusCode.LLM_SUCCESS
        cm.pull_blocks(BlocksCacheKey(PROMPT, 0), bc, [1, 2, 3, 9], [0, 1, 2, 15])
        for s, d in zip([1, 2, 3, 9], [0, 1, 2, 15]):
            blk(mine, d)[:] = blk(pblocks, s)
        assert np.array_equal(dev_read(addrs, mine), mine)
        # swap_blocks: device → host and host → device (aclrtMemcpy), block by block
        host = np.zeros((NT, BLOCKS * BLOCK), np.uint8)
        cpu = Cache.create_cpu_cache(CacheDesc(NT, [BLOCKS, BLOCK // 4], DataType.DT_INT32, Placement.HOST),
                                     [int(r.ctypes.data) for r in host])
        cm.swap_blocks(bc, cpu, {{0: 3, 15: 4}})
        assert np.array_equal(blk(host, 3), blk(mine, 0)) and np.array_equal(blk(host, 4), blk(mine, 15))
        blk(host, 3)[:] = 7
        cm.swap_blocks(cpu, bc, {{3: 5}})
        blk(mine, 5)[:] = 7
        assert np.array_equal(dev_read(addrs, mine), mine)
        try:
            cm.swap_blocks(bc, cpu, {{BLOCKS: 0}})
            raise AssertionError("a block outside the cache was swapped")
        except LLMException as e:
            assert e.status_code == LLMStatusCode.LLM_PARAM_INVALID
        cm.push_blocks(BlocksCacheKey(PROMPT, 0), bc, [4, 5], [10, 11], src_layer_range=range(1, 2),
                       dst_layer_range=range(0, 1))
        blk(pblocks, 10, 2)[0:2] = blk(mine, 4, 2)[2:4]
        got_b, got_c = peer.dump(tmp)
        assert np.array_equal(got_b, pblocks) and np.array_equal(got_c, pcache)
        assert dd.unlink_clusters([cluster_info(PROMPT, peer.port)])[0] == LLMStatusCode.LLM_SUCCESS
        cm.unregister_cache(bc.cache_id)
        dd.finalize()
        peer.close()
        print("OK")
        """,
    )
    assert "HcclBatchGet" in calls and "HcclBatchPut" in calls, sorted(set(calls))


def test_link_by_rank_table_both_ways(cann, tmp_path):
    """vllm-ascend's and omni-infer's mode: both clusters call link(comm_name, {cluster: rank},
    rank_table) with one rank table, poll query_register_mem_status until OK (HCCL's rendezvous:
    the communicator, then HcclExchangeMemDesc swapping the engines' names), then each pulls
    from the other over its own link; the bad inputs with their status."""
    calls = run(
        cann,
        tmp_path,
        f"""
        import json, threading, time
        tmp = {str(tmp_path)!r}
        table = json.dumps({{
            "server_count": "1", "status": "completed", "version": "1.0",
            "server_list": [{{"server_id": "127.0.0.1", "device": [
                {{"device_id": "11", "device_ip": "192.168.1.1", "rank_id": "0"}},
                {{"device_id": "10", "device_ip": "192.168.1.2", "rank_id": "1"}}]}}]}})
        path = tmp + "/rank_table.json"
        with open(path, "w") as f:
            f.write(table)
        peer = DDPeer(placement="device", seed=31, port=0)  # the prompt, device 1, no listen address
        pblocks, _ = peer.initial()
        cfg = LLMConfig()
        cfg.device_id = 0
        cfg.local_comm_res = ""
        dd = LLMDataDist(LLMRole.DECODER, DECODER)
        dd.init(cfg.generate_options())
        cm = dd.cache_manager
        mine = np.random.default_rng(32).integers(0, 256, (NT, BLOCKS * BLOCK), dtype=np.uint8)
        addrs = dev_alloc(mine)
        bc = cm.register_blocks_cache(CacheDesc(NT, [BLOCKS, BLOCK // 4], DataType.DT_INT32, Placement.DEVICE),
                                      addrs, BlocksCacheKey(DECODER, 0))
        reply = {{}}
        t = threading.Thread(target=lambda: reply.setdefault("r", peer.cmd(f"rtlink {{path}} 0 {{DECODER}} 1")))
        t.start()
        comm = dd.link("rt", {{PROMPT: 0, DECODER: 1}}, table)  # the name dd_peer.py links under
        assert comm == 1, comm
        deadline = time.monotonic() + 30
        while dd.query_register_mem_status(comm) == ld.RegisterMemStatus.PREPARING:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert dd.query_register_mem_status(comm) == ld.RegisterMemStatus.OK
        t.join(60)
        assert reply["r"] == "ok", reply
        cm.pull_blocks(BlocksCacheKey(PROMPT, 0), bc, [5, 6], [0, 1])
        blk(mine, 0, 2)[:] = blk(pblocks, 5, 2)
        assert np.array_equal(dev_read(addrs, mine), mine)
        assert peer.cmd(f"pull_blocks {{DECODER}} 7 3") == "ok"  # the other way, on the peer's link
        got_b, _ = peer.dump(tmp)
        blk(pblocks, 3)[:] = blk(mine, 7)
        assert np.array_equal(got_b, pblocks)
        # bad comm ids; a rank table without this cluster's rank; a malformed one
        assert status_of(dd.query_register_mem_status, 9) == LLMStatusCode.LLM_PARAM_INVALID
        assert status_of(dd.link, "x", {{PROMPT: 0, 5: 1}}, table) == LLMStatusCode.LLM_PARAM_INVALID
        assert status_of(dd.link, "x", {{PROMPT: 0, DECODER: 2}}, table) == LLMStatusCode.LLM_PARAM_INVALID
        assert status_of(dd.link, "x", {{PROMPT: 0, DECODER: 1}}, "{{") == LLMStatusCode.LLM_PARAM_INVALID
        dd.unlink(comm)
        assert status_of(dd.unlink, comm) == LLMStatusCode.LLM_PARAM_INVALID
        assert status_of(cm.pull_blocks, BlocksCacheKey(PROMPT, 0), bc, [0], [0]) == LLMStatusCode.LLM_NOT_YET_LINK
        assert peer.cmd("rtunlink") == "ok"
        cm.unregister_cache(bc.cache_id)
        dd.finalize()
        peer.close()
        print("OK")
        """,
    )
    assert "HcclExchangeMemDesc" in calls, sorted(set(calls))
