"""Block-indexed form against the list form from Python (issue 35): one engine serving engine
memory, one client in the same process, 100,000 blocks per call at random distinct indices,
WRITE and READ, the list form as an (N, 3) numpy array of descriptors and the block form as two
numpy index arrays, alternately A B A B; p50 ns per descriptor (wall and this process's CPU).

    python examples/python/blocks_vs_list.py [--batch 100000] [--rounds 5] [--block 64,2048] [--transport same-host|tcp]
"""
import argparse
import json
import statistics
import time

import numpy as np

import hixl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", default="64,2048")
    ap.add_argument("--transport", default="same-host", choices=["same-host", "tcp"])
    ap.add_argument("--region", type=int, default=256 << 20)
    a = ap.parse_args()
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
                }))


if __name__ == "__main__":
    main()
