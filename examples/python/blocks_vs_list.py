"""Block-indexed form against the list form from Python (issue 35): one engine serving engine
memory, one client in the same process, 100,000 blocks per call at random distinct indices,
WRITE and READ, the list form as an (N, 3) numpy array of descriptors and the block form as two
numpy index arrays, alternately A B A B; p50 ns per descriptor (wall and this process's CPU)
and GB/s (1e9 B/s). Anchors of the same invocation: `numpy_idx`, numpy moving the same blocks at
the same indices between two arrays in this process (`dst[ri] = src[li]` on (slots, block)
views, 16 MiB at a time: a gather and a scatter, one thread), and with `--anchors` over TCP,
iperf3 -P2 on loopback (`tools/bench-anchors.sh iperf 2 1M`, GB/s).

    python examples/python/blocks_vs_list.py [--batch 100000] [--rounds 5]
        [--block 64,2048,16384,65536] [--transport same-host|tcp] [--anchors]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np

import hixl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", default="64,2048,16384,65536")
    ap.add_argument("--transport", default="same-host", choices=["same-host", "tcp"])
    ap.add_argument("--region", type=int, default=256 << 20)
    ap.add_argument("--anchors", action="store_true", help="over TCP, run iperf3 -P2 as an anchor")
    a = ap.parse_args()
    iperf = None
    if a.anchors and a.transport == "tcp":
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                              "bench-anchors.sh")
        out = subprocess.run(["bash", script, "iperf", "2", "1M"], capture_output=True, text=True)
        try:
            iperf = float(out.stdout.split()[-1])
        except (IndexError, ValueError):
            print(f"iperf3 anchor unavailable: {out.stderr.strip()[-200:]}")
    with hixl.Engine("127.0.0.1:0") as server, hixl.Engine("127.0.0.1") as client:
        if a.transport == "same-host":
            served = server.alloc(a.region)
        else:
            backing = np.zeros(a.region, np.uint8)
            served = server.register(backing)
        local = client.alloc(a.region)
        local.numpy()[:] = 1
        link = client.connect(server.name, timeout=5)
        (region,) = link.remote_regions()
        rng = np.random.default_rng(35)
        for block in (int(b) for b in a.block.split(",")):
            slots = a.region // block
            li = np.resize(rng.permutation(slots).astype(np.uint32), a.batch)
            ri = np.resize(rng.permutation(slots).astype(np.uint32), a.batch)
            descs = np.empty((a.batch, 3), np.uint64)
            descs[:, 0] = local.addr + li.astype(np.uint64) * block
            descs[:, 1] = served.addr + ri.astype(np.uint64) * block
            descs[:, 2] = block
            # the anchor: numpy moving the same blocks between two arrays of this process
            src = np.ones((slots, block), np.uint8)
            dst = np.zeros((slots, block), np.uint8)
            step = max(1, (16 << 20) // block)  # the gather's temporary at most 16 MiB

            def numpy_idx():
                for i in range(0, a.batch, step):
                    dst[ri[i:i + step]] = src[li[i:i + step]]
            numpy_idx()
            aw = []
            for _ in range(a.rounds):
                t0 = time.perf_counter_ns()
                numpy_idx()
                aw.append((time.perf_counter_ns() - t0) / a.batch)
            del src, dst
            for op in (hixl.WRITE, hixl.READ):
                link.transfer(op, descs, timeout=120)
                link.transfer_blocks(op, local.addr, served.addr, block, li, ri, timeout=120)
                lw, lc, bw, bc = [], [], [], []
                for _ in range(a.rounds):
                    t0, c0 = time.perf_counter_ns(), time.process_time_ns()
                    link.transfer(op, descs, timeout=120)
                    t1, c1 = time.perf_counter_ns(), time.process_time_ns()
                    link.transfer_blocks(op, local.addr, served.addr, block, li, ri, timeout=120)
                    t2, c2 = time.perf_counter_ns(), time.process_time_ns()
                    lw.append((t1 - t0) / a.batch)
                    lc.append((c1 - c0) / a.batch)
                    bw.append((t2 - t1) / a.batch)
                    bc.append((c2 - c1) / a.batch)
                med = statistics.median
                print(json.dumps({
                    "metric": "python_blocks", "transport": region.transport, "op": op.name.lower(),
                    "block": block, "batch": a.batch, "rounds": a.rounds,
                    "list_ns_per_desc": round(med(lw), 1), "list_cpu_ns_per_desc": round(med(lc), 1),
                    "blocks_ns_per_desc": round(med(bw), 1), "blocks_cpu_ns_per_desc": round(med(bc), 1),
                    "list_gbps": round(block / med(lw), 3), "blocks_gbps": round(block / med(bw), 3),
                    "numpy_idx_ns_per_block": round(med(aw), 1),
                    "numpy_idx_gbps": round(block / med(aw), 3),
                    "iperf3_p2_gbps": iperf,
                }))


if __name__ == "__main__":
    main()
