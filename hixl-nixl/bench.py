#!/usr/bin/env python3
"""NIXL's UCX backend against NIXL's HIXL backend, and hixl's own engine, in one invocation.

    <venv>/bin/python hixl-nixl/bench.py [--rounds 3] [--ops write,read]
        [--shapes 65536x16,1048576x16,32768x16384] [--paths tcp,same-host]
        [--no-ucx] [--no-own] [--json]

Run it with the interpreter of an environment that has the nixl-cu12 wheel and the HIXL backend
(hixl-nixl/install.sh). Every row is the same NIXL Python program, two agents in two processes
(the initiator's blocks i <-> the target's blocks perm[i], a random permutation, so NIXL merges
no descriptors: a batch is BLOCK x N descriptors for either backend), made once with
prep_xfer_dlist / make_prepped_xfer and then posted ITERS times (transfer, check_xfer_state until
DONE), each call timed; then the source gets fresh random bytes, one more transfer, and both
ends compare what they hold. Over TCP (--paths tcp, the default):
- ucx:   backends=["UCX"], UCX_TLS=tcp UCX_NET_DEVICES=lo (NIXL's UCX over loopback TCP)
- hixl:  backends=["HIXL"], ip 127.0.0.1 (numpy memory is the caller's: hixl serves it over TCP)
- own:   the anchor, hixl's own engine on the same shape without NIXL: examples/bench
         --transport tcp --memory user --op OP --block BLOCK --batch N --ws BLOCK*N (the typed
         engine, the serving engine in a child process, the same memory every call)
On the same host (--paths same-host):
- ucx:   UCX_TLS=sm,self,tcp (UCX's shared memory transports; numpy memory: CMA)
- hixl:  the target's memory from hixl_nixl_alloc (the HIXL engine's: hixl's same-host path)
- own:   examples/bench --transport same-host --memory hostbuffer (engine memory too)
Rounds interleave the three, so the machine's noise hits all alike; the figures are the median
GB/s (1e9 bytes/s) over the rounds, and the ratios hixl/ucx and hixl/own the median of the
rounds' own ratios (each row against its anchors of the same round, run back to back). No
fixed port: the agents' metadata goes through this process.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from peer import Peer, commands, hixl_plugin, nixl_api, reply  # noqa: E402


# ------------------------------------------------------------------------------- one agent


def child(role, backend):
    import numpy as np

    nixl_agent, nixl_agent_config = nixl_api()
    ag = nixl_agent(role, nixl_agent_config(backends=[]))
    params = {"ip": "127.0.0.1", **json.loads(os.environ.get("HIXL_NIXL_BENCH_PARAMS", "{}"))}
    ag.create_backend(backend, params if backend == "HIXL" else {})
    rng = np.random.default_rng(os.getpid())
    buf = None
    handle = None
    block = n = 0
    for cmd in commands():
        op = cmd["op"]
        if op == "alloc":
            block, n = cmd["block"], cmd["n"]
            if cmd.get("engine"):
                # the HIXL engine's memory (hixl_nixl_alloc): same-host peers reach it
                import ctypes
                p = ctypes.c_void_p()
                st = hixl_plugin().hixl_nixl_alloc(role.encode(), block * n, ctypes.byref(p))
                if st != 0:
                    reply(failed=f"hixl_nixl_alloc: {st}")
                    continue
                buf = np.ctypeslib.as_array((ctypes.c_uint8 * (block * n)).from_address(p.value))
                buf[:] = np.frombuffer(rng.bytes(block * n), dtype=np.uint8)
            else:
                buf = np.frombuffer(bytearray(rng.bytes(block * n)), dtype=np.uint8)
            ag.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
            reply(md=ag.get_agent_metadata().hex(), addr=buf.ctypes.data)
        elif op == "load":
            ag.add_remote_agent(bytes.fromhex(cmd["md"]))
            reply()
        elif op == "prep":
            raddr = cmd["raddr"]
            local = [(buf.ctypes.data + k * block, block, 0) for k in range(n)]
            remote = [(raddr + k * block, block, 0) for k in range(n)]
            lh = ag.prep_xfer_dlist("", local, "DRAM")
            rh = ag.prep_xfer_dlist("target", remote, "DRAM")
            handle = ag.make_prepped_xfer(cmd["xop"], lh, list(range(n)), rh, cmd["perm"])
            reply()
        elif op == "run":
            lat = []
            for k in range(cmd["warmup"] + cmd["iters"]):
                t0 = time.perf_counter()
                s = ag.transfer(handle)
                while s == "PROC":
                    s = ag.check_xfer_state(handle)
                if s != "DONE":
                    reply(failed=f"state {s}")
                    break
                if k >= cmd["warmup"]:
                    lat.append(time.perf_counter() - t0)
            else:
                reply(lat=lat)
        elif op == "fill":
            buf[:] = np.frombuffer(rng.bytes(buf.nbytes), dtype=np.uint8)
            reply()
        elif op == "digest":
            # the blocks in the order given, as one digest
            h = hashlib.sha256()
            for k in cmd["order"]:
                h.update(buf[k * block:(k + 1) * block].tobytes())
            reply(sha=h.hexdigest())
        elif op == "bye":
            if handle is not None:
                ag.release_xfer_handle(handle)
            reply()
            break


def nixl_row(backend, path, op, block, n, iters, warmup, seed):
    """One NIXL row: (GB/s, p50 us), data checked. `path`: tcp, or same-host (UCX's shared
    memory transports; HIXL's same-host path, the target's memory the engine's)."""
    env = dict(os.environ)
    if backend == "UCX":
        env.update(UCX_WARN_UNUSED_ENV_VARS="n")
        if path == "tcp":
            env.update(UCX_TLS="tcp", UCX_NET_DEVICES="lo")
        else:
            env.update(UCX_TLS="sm,self,tcp")  # (tools/bench-anchors.sh's, for NIXL's UCX)
    t = Peer(__file__, ["target", backend], "target", env)
    i = Peer(__file__, ["initiator", backend], "initiator", env)
    try:
        rt = t("alloc", block=block, n=n, engine=backend == "HIXL" and path == "same-host")
        ri = i("alloc", block=block, n=n)
        i("load", md=rt["md"])
        t("load", md=ri["md"])
        import random
        perm = list(range(n))
        random.Random(seed).shuffle(perm)
        i("prep", xop=op.upper(), raddr=rt["addr"], perm=perm)
        lat = i("run", iters=iters, warmup=warmup)["lat"]
        # fresh bytes at the source, one more transfer, both ends compared
        (i if op == "write" else t)("fill")
        i("run", iters=1, warmup=0)
        mine = i("digest", order=list(range(n)))["sha"]
        theirs = t("digest", order=perm)["sha"]
        if mine != theirs:
            raise SystemExit(f"{backend} {op} {block}x{n}: the two ends hold different bytes")
    finally:
        i.close()
        t.close()
    lat.sort()
    return block * n * len(lat) / sum(lat) / 1e9, lat[len(lat) // 2] * 1e6


def own_row(path, op, block, n, duration):
    """hixl's own engine (examples/bench) on the same shape: (GB/s, p50 us); the bench checks
    its data itself. Over TCP its serving region is caller memory (a Vec), on the same-host
    path engine memory (a HostBuffer), as the NIXL rows' targets."""
    exe = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                       "release", "examples", "bench")
    how = ["tcp", "--memory", "user"] if path == "tcp" else ["same-host", "--memory", "hostbuffer"]
    out = subprocess.run(
        [exe, "--transport", *how, "--op", op, "--block", str(block),
         "--batch", str(n), "--ws", str(block * n), "--no-extras", "--no-cold", "--json",
         "--duration", str(duration)],
        capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"examples/bench failed: {out.stderr[-2000:]}")
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    row = next(r for r in rows if r.get("op") == op.upper())
    return row["gbps"], row["p50_us"]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", default="write,read")
    p.add_argument("--shapes", default="65536x16,1048576x16,32768x16384",
                   help="BLOCKxN, comma separated")
    p.add_argument("--paths", default="tcp", help="tcp, same-host, or both (comma separated)")
    p.add_argument("--no-ucx", action="store_true")
    p.add_argument("--no-own", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    a = p.parse_args()
    if not a.no_own:
        subprocess.run(["cargo", "build", "-q", "--release", "--example", "bench"], cwd=ROOT,
                       check=True)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    ops = a.ops.split(",")
    paths = a.paths.split(",")
    kinds = (["ucx"] if not a.no_ucx else []) + ["hixl"] + (["own"] if not a.no_own else [])
    res = {}
    for rnd in range(a.rounds):
        for path in paths:
            for op in ops:
                for block, n in shapes:
                    total = block * n
                    iters = max(8, min(200, int(4e9 // total)))  # about 4 GB per row
                    warmup = 2 if total >= 64 << 20 else 10
                    for kind in kinds:
                        if kind == "own":
                            g, p50 = own_row(path, op, block, n, 2.0)
                        else:
                            g, p50 = nixl_row(kind.upper(), path, op, block, n, iters, warmup,
                                              rnd)
                        res.setdefault((path, op, block, n, kind), []).append((g, p50))
                        print(f"round {rnd + 1}: {path:9} {op:5} {block:>8} x {n:<6} {kind:5} "
                              f"{g:7.3f} GB/s", file=sys.stderr, flush=True)

    # the ratios: per round (a row and its anchors run back to back), their median; the
    # machine's load moves all three of a round alike more than it moves rounds alike
    def ratio(key, k):
        if k not in kinds:
            return None
        rs = [h[0] / o[0] for h, o in zip(res[key + ("hixl",)], res[key + (k,)])]
        return statistics.median(rs)

    for path in paths:
        if not a.json:
            print(f"{path}: {'op':5} {'block':>8} {'batch':>6} | "
                  + " | ".join(f"{k + ' GB/s':>10}" for k in kinds) + " | hixl/ucx | hixl/own")
        for op in ops:
            for block, n in shapes:
                key = (path, op, block, n)
                med = {k: statistics.median(g for g, _ in res[key + (k,)]) for k in kinds}
                ratio_u, ratio_o = ratio(key, "ucx"), ratio(key, "own")
                if a.json:
                    print(json.dumps({"path": path, "op": op.upper(), "block": block, "batch": n,
                                      "gbps": med,
                                      "rounds": {k: [round(g, 3) for g, _ in res[key + (k,)]]
                                                 for k in kinds},
                                      "hixl_over_ucx": ratio_u, "hixl_over_own": ratio_o}))
                else:
                    print(f"{path}: {op:5} {block:>8} {n:>6} | "
                          + " | ".join(f"{med[k]:10.3f}" for k in kinds)
                          + (f" | {ratio_u:7.2f}x" if ratio_u is not None else " |        -")
                          + (f" | {ratio_o:8.2f}" if ratio_o is not None else " |        -"))

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
