#!/usr/bin/env python3
"""kv_pull.py's shape on NIXL's Python API (UCX backend), adapted from the shared NIXL anchor
(`tools/bench-anchors-nixl.py`): 32 layers x 256 blocks x 32 KiB READ by the decode side, one transfer per
layer, all posted, then waited; repeated. For `bench_compare.py`; runs in the venv that has
`nixl` (`tools/bench-anchors.sh install`). UCX_TLS chooses UCX's transport (tcp, sm).

    python nixl_kv_pull.py both PORT [--layers 32 --blocks 256 --block 32768 --iters 8]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

try:
    from nixl import nixl_agent, nixl_agent_config
except ImportError:
    from nixl_cu12 import nixl_agent, nixl_agent_config

GOLD = np.uint64(0x9E3779B97F4A7C15)


def pattern(n):
    return (np.arange(n // 8, dtype=np.uint64) * GOLD).view(np.uint8)


p = argparse.ArgumentParser()
p.add_argument("role", choices=["both", "target", "initiator"])
p.add_argument("port", type=int)
p.add_argument("--layers", type=int, default=32)
p.add_argument("--blocks", type=int, default=256)
p.add_argument("--block", type=int, default=32768)
p.add_argument("--iters", type=int, default=8)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()
L, B, bs = a.layers, a.blocks, a.block
size = L * B * bs

if a.role == "both":
    t = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "target"] + sys.argv[2:], stdout=subprocess.PIPE, text=True
    )
    try:
        for line in t.stdout:  # (NIXL logs on stdout too)
            if line.strip() == "ready":  # the target listens: start the initiator
                break
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "initiator"] + sys.argv[2:], check=True)
        t.wait(timeout=120)
    finally:
        if t.poll() is None:
            t.kill()
    sys.exit(0)

buf = pattern(size).copy() if a.role == "target" else np.zeros(size, np.uint8)
ag = nixl_agent(a.role, nixl_agent_config(True, True, a.port if a.role == "target" else 0, backends=["UCX"]))
ag.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
if a.role == "target":
    print("ready", flush=True)
    while not ag.check_remote_metadata("initiator"):
        time.sleep(0.001)
    ag.send_notif("initiator", str(buf.ctypes.data).encode())
    while b"done" not in ag.get_new_notifs().get("initiator", []):
        time.sleep(0.001)
    sys.exit(0)

deadline = time.monotonic() + 60
while not ag.check_remote_metadata("target"):
    ag.fetch_remote_metadata("target", "127.0.0.1", a.port)
    t = time.monotonic() + 1
    while time.monotonic() < t and not ag.check_remote_metadata("target"):
        time.sleep(0.001)
    assert time.monotonic() < deadline, "no metadata from the target"
ag.send_local_metadata("127.0.0.1", a.port)
n = {}
while "target" not in n:
    n = ag.get_new_notifs()
remote_base = int(n["target"][0])
rng = np.random.default_rng(a.seed)
tables = [rng.permutation(B) for _ in range(L)]
handles = []
for layer, perm in enumerate(tables):
    first = layer * B
    loc = np.array([[buf.ctypes.data + (first + j) * bs, bs, 0] for j in range(B)], dtype=np.uint64)
    rem = np.array([[remote_base + (first + int(perm[j])) * bs, bs, 0] for j in range(B)], dtype=np.uint64)
    handles.append(
        ag.initialize_xfer("READ", ag.get_xfer_descs(loc, "DRAM"), ag.get_xfer_descs(rem, "DRAM"), "target")
    )


def pull():
    t = time.perf_counter()
    states = [ag.transfer(h) for h in handles]
    for i, h in enumerate(handles):
        s = states[i]
        while s == "PROC":
            s = ag.check_xfer_state(h)
        assert s == "DONE", s
    return time.perf_counter() - t


def verify():
    src = pattern(size).reshape(L, B, bs)
    got = buf.reshape(L, B, bs)
    for layer, perm in enumerate(tables):
        assert np.array_equal(got[layer], src[layer][perm]), f"layer {layer} differs"


pull()
verify()
for _ in range(a.warmup):
    pull()
times = sorted(pull() for _ in range(a.iters))
gbs = [size / t / 1e9 for t in times]
print(
    json.dumps(
        {
            "impl": "nixl-python",
            "transport": "ucx:" + os.environ.get("UCX_TLS", "default"),
            "gbps_median": round(gbs[len(gbs) // 2], 3),
            "gbps_best": round(max(gbs), 3),
            "gbps_total": round(size * len(times) / sum(times) / 1e9, 3),
            "verified": True,
        }
    ),
    flush=True,
)
ag.send_notif("target", b"done")
for h in handles:
    ag.release_xfer_handle(h)
ag.remove_remote_agent("target")
# (NIXL's agent can crash in its teardown at interpreter exit; the measurement is done)
sys.stdout.flush()
os._exit(0)
