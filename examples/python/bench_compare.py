#!/usr/bin/env python3
"""One invocation, one shape (READ, 32 KiB blocks, 256 per call, 32 layers = 256 MiB per pull):
hixl's Python package (kv_pull.py) next to the Rust benchmark (examples/bench.rs) and NIXL's
Python API (nixl_kv_pull.py), on the same transports, rounds interleaved so the machine's noise
hits all alike.

    python examples/python/bench_compare.py [--rounds 3] [--transports tcp,same-host] [--no-nixl]
    python examples/python/bench_compare.py --memory engine --transports same-host --no-nixl

`--memory engine` (issue 35: "Python within 10% of Rust" on kv_pull.py's own shape): kv_pull.py's
default, Engine.alloc memory on both sides (a same-host peer maps it), against compat_kv_pull
--memory engine (the same calls from Rust, alloc_host_mem) and the typed engine's bench with its
HostBuffer region (`--memory hostbuffer`).

Rows:
- rust        `bench --op read --block 32768 --batch 256 --memory user`: one blocking call of 256
              blocks at a time over a 256 MiB working set (the serving region a Vec<u8>,
              caller-managed as the compat engine's regions are)
- rust compat sync / async   examples/compat_kv_pull.rs: kv_pull.py's shape and calls on the
              engine the Python package drives (`hixl::compat`, caller-managed memory), from Rust
- python sync kv_pull.py --mode sync --memory caller: one `link.read` per layer (the same calls
              on the same kind of memory as rust compat sync)
- python async kv_pull.py --memory caller: one `transfer_async` per layer, all 32 in flight
              (kv_pull.py's default, engine-allocated memory, is the same-host fast path: see
              docs/benchmarks.md)
- nixl        nixl_kv_pull.py: NIXL's Python API, UCX backend, one xfer per layer, all posted;
              UCX_TLS=tcp for the tcp column, UCX_TLS=sm,self,tcp for the same-host column

GB/s are 1e9 bytes/s, aggregate over each run; the figure is the median over rounds.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NIXL_PY = os.path.expanduser(os.environ.get("HIXL_PEERS_VENV", "~/.cache/hixl-peers/venv")) + "/bin/python"
SHAPE = ["--layers", "32", "--blocks", "256", "--block", "32768"]


def run_json(cmd, env=None, timeout=600):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {out.stderr[-2000:]}")
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--transports", default="tcp,same-host")
    p.add_argument("--iters", type=int, default=8, help="pulls of 256 MiB per Python/NIXL run")
    p.add_argument("--duration", default="2", help="seconds per Rust bench row")
    p.add_argument("--no-nixl", action="store_true")
    p.add_argument("--boundary", type=int, default=2000, help="refused calls timed per run")
    p.add_argument("--memory", choices=["caller", "engine"], default="caller",
                   help="caller: registered numpy arrays / Vec<u8> (the default); engine: Engine.alloc / alloc_host_mem")
    a = p.parse_args()
    subprocess.run(
        ["cargo", "build", "-q", "--release", "--example", "bench", "--example", "compat_kv_pull"],
        cwd=ROOT,
        check=True,
    )
    bench = os.path.join(ROOT, "target", "release", "examples", "bench")
    compat = os.path.join(ROOT, "target", "release", "examples", "compat_kv_pull")
    nixl = not a.no_nixl and os.path.exists(NIXL_PY)
    transports = a.transports.split(",")
    res = {}  # (impl, transport) -> [GB/s per round]
    calls = {}  # (layer, transport) -> [ns per refused 256-descriptor call, per round]
    actual = {}  # (impl, transport) -> the transport the run reported

    def add(key, gbps, used):
        res.setdefault(key, []).append(gbps)
        actual[key] = used

    for rnd in range(a.rounds):
        for t in transports:
            print(f"round {rnd + 1}/{a.rounds}, {t} ...", file=sys.stderr)
            (row,) = [
                r
                for r in run_json(
                    [bench, "--op", "read", "--block", "32768", "--batch", "256", "--memory",
                     "user" if a.memory == "caller" else "hostbuffer",
                     "--transport", t, "--duration", a.duration, "--no-extras", "--json"]
                )
                if "gbps" in r
            ]
            add(("rust (bench)", t), row["gbps"], row["transport"])
            for mode in ("sync", "async"):
                extra = ["--boundary", str(a.boundary)] if mode == "sync" else []
                (row,) = run_json(
                    [compat, "--mode", mode, "--transport", t, "--memory", a.memory, "--iters", str(a.iters), "--json"]
                    + SHAPE + extra
                )
                add((f"rust compat {mode}", t), row["gbps_total"], row["transport"])
                if extra:
                    calls.setdefault(("rust", t), []).append(row["refused_call_ns"])
                (row,) = run_json(
                    [sys.executable, os.path.join(HERE, "kv_pull.py"), "--mode", mode, "--transport", t,
                     "--memory", a.memory, "--iters", str(a.iters), "--json"] + SHAPE + extra
                )
                add((f"python {mode} (kv_pull)", t), row["gbps_total"], row["transport"])
                if extra:
                    calls.setdefault(("pythonic", t), []).append(row["refused_call_ns_pythonic"])
                    calls.setdefault(("flat", t), []).append(row["refused_call_ns_flat"])
            if nixl:
                # as tools/bench-anchors.sh runs NIXL: tcp over lo, or shared memory (with
                # self and tcp for UCX's active messages)
                env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
                if t == "tcp":
                    env.update(UCX_TLS="tcp", UCX_NET_DEVICES="lo")
                else:
                    env.update(UCX_TLS="sm,self,tcp")
                rows = run_json(
                    [NIXL_PY, os.path.join(HERE, "nixl_kv_pull.py"), "both", str(free_port()),
                     "--iters", str(a.iters)] + SHAPE,
                    env=env,
                )
                add(("nixl python (UCX)", t), rows[0]["gbps_total"], rows[0]["transport"])

    print(f"\nREAD, 32 KiB x 256 per call/request, 32 layers (256 MiB per pull), {a.memory} memory;"
          f" median of {a.rounds} rounds, GB/s")
    print(f"{'':26}" + "".join(f"{t:>24}" for t in transports))
    order = ["rust (bench)", "rust compat sync", "rust compat async", "python sync (kv_pull)",
             "python async (kv_pull)", "nixl python (UCX)"]
    impls = [i for i in order if any(k[0] == i for k in res)]
    med = {k: statistics.median(v) for k, v in res.items()}
    for i in impls:
        cells = []
        for t in transports:
            k = (i, t)
            cells.append(f"{med[k]:.3f} ({actual[k]})" if k in med else "-")
        print(f"{i:26}" + "".join(f"{c:>24}" for c in cells))
    for t in transports:
        for mode in ("sync", "async"):
            r = med.get((f"rust compat {mode}", t))
            s = med.get((f"python {mode} (kv_pull)", t))
            if r and s:
                print(f"{t}: Python vs Rust, the same {mode} calls on hixl::compat: {100 * (s - r) / r:+.1f}%")
            b = med.get(("rust (bench)", t))
            if b and s:
                print(f"{t}: Python {mode} vs the typed engine's bench: {s / b:.2f}x")
        n = med.get(("nixl python (UCX)", t))
        py = med.get(("python async (kv_pull)", t))
        if n and py:
            print(f"{t}: hixl Python (async) vs NIXL Python: {py / n:.2f}x")
    print(
        "\nPer call (a 256-descriptor READ refused at its last descriptor: everything validated, no"
        " data moved), median ns; the Python layer's cost per call against one 8 MiB call at the"
        " Rust compat sync rate:"
    )
    for t in transports:
        r = statistics.median(calls[("rust", t)])
        rate = med[("rust compat sync", t)] * 1e9
        call_ns = 256 * 32768 / rate * 1e9
        for layer in ("flat", "pythonic"):
            p_ns = statistics.median(calls[(layer, t)])
            print(
                f"{t}: rust {r:.0f} ns, python {layer} {p_ns:.0f} ns: +{p_ns - r:.0f} ns per call ="
                f" {100 * (p_ns - r) / call_ns:.2f}% of one {call_ns / 1e3:.0f} us call"
            )
    print(json.dumps({f"{k[0]}|{k[1]}": v for k, v in res.items()}))
    print(json.dumps({f"{k[0]}|{k[1]}": v for k, v in calls.items()}))


if __name__ == "__main__":
    main()
