#!/usr/bin/env python3
"""Disaggregated serving in miniature: a prefill process holds a KV cache, a decode process pulls
it with hixl's Python package, one `transfer_async` per layer, then tells prefill by a
notification that it may free the blocks.

    python examples/python/kv_pull.py                 # both roles (prefill runs as a child)
    python examples/python/kv_pull.py --mode sync     # one blocking READ per layer instead
    python examples/python/kv_pull.py --transport tcp # hixl.SameHost=off (tcp) / require (same-host)
    python examples/python/kv_pull.py --memory caller # numpy arrays registered, not Engine.alloc

Memory (`--memory`): `engine` (the default) puts prefill's KV cache and decode's destination in
memory the engine allocates (`Engine.alloc`, numpy views over it), which a same-host peer maps
and copies one-sidedly; `caller` registers numpy arrays, which a same-host peer reaches over
TCP (the engine cannot keep caller memory from its owner while a one-sided peer may write it).

Shape (defaults): 32 layers x 256 blocks x 32 KiB = 256 MiB per pull. Decode's block table maps
its block j of layer l to a random prefill block of that layer; the descriptors are built once
(an (N, 3) numpy array per layer) and the pull is repeated `--iters` times. Prints GB/s (1e9
bytes/s) and verifies every byte after the first pull and the last.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

import hixl

GOLD = np.uint64(0x9E3779B97F4A7C15)


def pattern(n_bytes):
    """Prefill's KV cache contents: distinct 8-byte words, cheap to regenerate for checking."""
    return (np.arange(n_bytes // 8, dtype=np.uint64) * GOLD).view(np.uint8)


def same_host(transport):
    return {"auto": "auto", "tcp": "off", "same-host": "require", "cma": "require"}[transport]


def prefill(a):
    size = a.layers * a.blocks * a.block
    with hixl.Engine("127.0.0.1:0", {"hixl.SameHost": same_host(a.transport)}) as engine:
        # the KV cache: layers x blocks x block bytes
        if a.memory == "engine":
            kv = engine.alloc(size).numpy()  # engine memory, a zero-copy numpy view
            kv[:] = pattern(size)
        else:
            kv = pattern(size).copy()
            engine.register(kv)
        print(json.dumps({"name": engine.name}), flush=True)
        # decode pulls on its own (one-sided); we only wait to be told the blocks are free
        name, msg = engine.wait_notify("free", timeout=a.timeout)
        print(f"prefill: {msg}; freeing the blocks", file=sys.stderr)
    del kv


def decode(a):
    size = a.layers * a.blocks * a.block
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "prefill"] + sys.argv[1:],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        prefill_name = json.loads(child.stdout.readline())["name"]
        with hixl.Engine("127.0.0.1", {"hixl.SameHost": same_host(a.transport)}) as engine:
            if a.memory == "engine":
                local = engine.alloc(size)  # zeroed; register everything first, then connect
                dst = local.numpy()
            else:
                dst = np.zeros(size, np.uint8)
                local = engine.register(dst)
            link = engine.connect(prefill_name, timeout=10)
            (remote,) = link.remote_regions()  # prefill's table came with the link
            assert remote.len == size
            rng = np.random.default_rng(a.seed)
            tables = [rng.permutation(a.blocks) for _ in range(a.layers)]
            descs = []
            for layer, perm in enumerate(tables):
                d = np.empty((a.blocks, 3), np.uint64)
                first = layer * a.blocks
                d[:, 0] = local.addr + (first + np.arange(a.blocks, dtype=np.uint64)) * a.block
                d[:, 1] = remote.addr + (first + perm.astype(np.uint64)) * a.block
                d[:, 2] = a.block
                descs.append(d)

            def pull():
                t = time.perf_counter()
                if a.mode == "async":
                    reqs = [link.read_async(d, user_data=layer) for layer, d in enumerate(descs)]
                    for r in reqs:
                        r.wait(a.timeout)
                else:
                    for d in descs:
                        link.read(d, timeout=a.timeout)
                return time.perf_counter() - t

            def verify():
                src = pattern(size).reshape(a.layers, a.blocks, a.block)
                got = dst.reshape(a.layers, a.blocks, a.block)
                for layer, perm in enumerate(tables):
                    if not np.array_equal(got[layer], src[layer][perm]):
                        raise SystemExit(f"layer {layer}: data differs")

            times = [pull()]
            verify()
            for _ in range(a.warmup):
                pull()
            times = [pull() for _ in range(a.iters)]
            dst[:] = 0
            times.append(pull())
            verify()
            transport = link.transport()
            remote_transport = link.remote_regions()[0].transport  # what moved the KV cache
            boundary = {}
            if a.boundary:
                # the cost of one call through Python: a 256-descriptor READ refused at its last
                # descriptor (every other one validated, no data moved), timed per call
                bad = descs[0].copy()
                bad[-1, 1] = 0x10  # not in prefill's table
                t = time.perf_counter()
                for _ in range(a.boundary):
                    try:
                        link.read(bad)
                    except hixl.ParamInvalidError:
                        pass
                boundary["refused_call_ns_pythonic"] = round((time.perf_counter() - t) / a.boundary * 1e9)
                flat = [hixl.TransferOpDesc(int(l), int(r), int(n)) for l, r, n in bad]
                h = engine.hixl
                t = time.perf_counter()
                for _ in range(a.boundary):
                    assert h.transfer_sync(prefill_name, hixl.READ, flat) == hixl.PARAM_INVALID
                boundary["refused_call_ns_flat"] = round((time.perf_counter() - t) / a.boundary * 1e9)
            link.notify("free", f"decode pulled {a.layers} layers; the blocks may be freed")
        child.wait(timeout=a.timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    times.sort()
    gbs = [size / t / 1e9 for t in times]
    result = {
        "impl": "hixl-python",
        "mode": a.mode,
        "transport": transport,
        "memory": a.memory,
        "kv_transport": remote_transport,
        "layers": a.layers,
        "blocks": a.blocks,
        "block": a.block,
        "bytes_per_pull": size,
        "pulls": len(times),
        "gbps_median": round(gbs[len(gbs) // 2], 3),
        "gbps_best": round(max(gbs), 3),
        "gbps_total": round(size * len(times) / sum(times) / 1e9, 3),
        "verified": True,
        **boundary,
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(
            f"kv_pull ({a.mode}, {transport} link, {a.memory} memory moved over {remote_transport}): "
            f"{a.layers} layers x {a.blocks} blocks x "
            f"{a.block} B = {size / 2**20:.0f} MiB per pull, {len(times)} pulls: "
            f"median {result['gbps_median']} GB/s, best {result['gbps_best']} GB/s; data verified"
        )
        if boundary:
            print(f"per refused 256-descriptor call: {boundary}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", default="decode", choices=["decode", "prefill"])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--block", type=int, default=32768)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--mode", choices=["async", "sync"], default="async")
    # cma: an alias of same-host
    p.add_argument("--transport", choices=["auto", "tcp", "same-host", "cma"], default="auto")
    p.add_argument("--memory", choices=["engine", "caller"], default="engine",
                   help="KV cache and destination in Engine.alloc memory (same-host one-sided) or registered numpy arrays")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--boundary", type=int, default=0, help="also time N refused calls (the per-call cost)")
    a = p.parse_args()
    if a.block % 8:
        p.error("--block must be a multiple of 8")
    prefill(a) if a.role == "prefill" else decode(a)


if __name__ == "__main__":
    main()
