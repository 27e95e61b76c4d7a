#!/usr/bin/env bash
# Anchors for the hixl benchmarks, measured on this machine, on loopback only.
#   bench-anchors.sh install            install the anchors (ucx-utils, iperf3, Mooncake's transfer_engine_bench, NIXL)
#   bench-anchors.sh iperf              loopback TCP ceiling, one stream, GB/s (1e9)
#   bench-anchors.sh memcpy [SIZE]      single-thread memcpy, SIZE-byte chunks over a 256 MiB working set, GB/s
#   bench-anchors.sh ucx-tcp  SIZE      ucx_perftest ucp_put_bw over tcp/lo, GB/s
#   bench-anchors.sh ucx-sm   SIZE      ucx_perftest ucp_put_bw over shared memory with ordinary (CMA) buffers, GB/s
#   bench-anchors.sh mooncake OP SIZE   Mooncake transfer_engine_bench over tcp, OP = read|write, GB/s
#   bench-anchors.sh nixl OP SIZE TLS   NIXL (UCX backend) two-process READ/WRITE, TLS = tcp|sm, GB/s
# Each measurement prints one number (GB/s, 1e9 bytes) on its last line, so a benchmark can run an
# anchor and its own case in one invocation and print the ratio.
#
# `cargo run --release --example bench -- --anchors` runs this script (HIXL_PEERS names another
# one); examples/python/bench_compare.py uses the venv it installs. Run it from anywhere: it finds
# its NIXL helper (bench-anchors-nixl.py) beside itself. `install` needs root for apt-get (ucx-utils,
# libucx-dev, iperf3) and network access for PyPI (mooncake-transfer-engine-non-cuda, nixl-cu12,
# numpy, into $HIXL_PEERS_VENV, default ~/.cache/hixl-peers/venv). Ports: $HIXL_PEERS_PORT
# (default 14900).
#
# Provenance: this is `peers.sh` (with its helper `nixl_pair.py`, here bench-anchors-nixl.py) of
# the benchmark anchors set up for hixl outside the repository (shared/bench/ beside the project's
# design notes), brought in unchanged but for its name, this comment and the helper's path, so
# that a reader can rerun the anchors from the repository. The original carried no license or
# author header, and none is added here.
set -euo pipefail
VENV=${HIXL_PEERS_VENV:-$HOME/.cache/hixl-peers/venv}
PORT=${HIXL_PEERS_PORT:-14900}
HERE=$(cd "$(dirname "$0")" && pwd)

need() { command -v "$1" >/dev/null 2>&1; }

install() {
  if ! need ucx_perftest || ! need iperf3; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq ucx-utils libucx-dev iperf3 >/dev/null
  fi
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  if [ ! -x "$VENV/bin/transfer_engine_bench" ]; then
    "$VENV/bin/pip" install -q mooncake-transfer-engine-non-cuda
  fi
  if ! "$VENV/bin/python" -c "import nixl_cu12" >/dev/null 2>&1; then
    # NIXL's wheel bundles its own UCX; torch is only needed for tensors, so it is left out
    "$VENV/bin/pip" install -q --no-deps nixl-cu12
    "$VENV/bin/pip" install -q numpy
  fi
  echo "anchors installed"
}

# iperf [STREAMS [WRITE_LEN]]: one stream with iperf3's default 128 KiB writes, or e.g. `2 1M`
# (two streams of 1 MiB writes: what one large batch over two lanes is measured against)
iperf() {
  local streams=${1:-1} len=${2:-}
  iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$PORT" -t 5 -J -P "$streams" ${len:+-l "$len"} \
    | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9, 3))'
  wait
}

memcpy() {
  python3 -c '
import ctypes, sys, time
n = 256 << 20
size = min(int(sys.argv[1]), n)
a = ctypes.create_string_buffer(n); b = ctypes.create_string_buffer(n)
ctypes.memmove(b, a, n)
pa, pb = ctypes.addressof(a), ctypes.addressof(b)
best = 0.0
for _ in range(5):
    t = time.perf_counter()
    for off in range(0, n - size + 1, size):
        ctypes.memmove(pb + off, pa + off, size)
    dt = time.perf_counter() - t
    best = max(best, (n // size) * size / dt / 1e9)
print(round(best, 3))
' "$1"
}

ucx() {
  local tls=$1 size=$2 iters
  iters=$(( size >= 1048576 ? 2000 : 20000 ))
  export UCX_WARN_UNUSED_ENV_VARS=n UCX_TLS=$tls
  if [ "$tls" = tcp ]; then export UCX_NET_DEVICES=lo; else export UCX_ALLOC_PRIO=mmap,heap; fi
  timeout 120 ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  sleep 0.7
  # the 6th column of the Final line is the overall bandwidth in MiB/s
  timeout 120 ucx_perftest 127.0.0.1 -p "$PORT" -t ucp_put_bw -s "$size" -n "$iters" -w 100 2>&1 \
    | awk '/Final/ {printf "%.3f\n", $6*1048576/1e9}'
  wait
}

mooncake() {
  local op=$1 size=$2 log pid seg=""
  log=$(mktemp)
  timeout 60 "$VENV/bin/transfer_engine_bench" --mode=target --metadata_server=P2PHANDSHAKE --protocol=tcp \
    --local_server_name=127.0.0.1 --buffer_size=268435456 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do
    seg=$(sed -n 's/.*P2P handshake, listening on \([0-9.]*:[0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$seg" ] && break
    sleep 0.2
  done
  "$VENV/bin/transfer_engine_bench" --mode=initiator --metadata_server=P2PHANDSHAKE --protocol=tcp \
    --local_server_name=127.0.0.1 --segment_id="$seg" --operation="$op" --block_size="$size" \
    --batch_size=$(( size >= 1048576 ? 4 : 64 )) --threads=1 --duration=5 --buffer_size=268435456 \
    --report_unit=GB 2>&1 | sed -n 's/.*throughput \([0-9.]*\) GB\/s.*/\1/p'
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$log"
}

nixl() {
  local op=${1^^} size=$2 tls=$3 nblk iters
  nblk=$(( size >= 16777216 ? 4 : 16 )); iters=$(( size >= 16777216 ? 30 : 100 ))
  export UCX_WARN_UNUSED_ENV_VARS=n
  if [ "$tls" = tcp ]; then export UCX_TLS=tcp UCX_NET_DEVICES=lo; else export UCX_TLS=sm,self,tcp; fi
  timeout 120 "$VENV/bin/python" "$HERE/bench-anchors-nixl.py" target "$op" "$size" "$nblk" "$iters" "$PORT" >/dev/null 2>&1 &
  sleep 3
  # NIXL 1.5.1 can crash while tearing down after a finished run; the figure is printed before that
  local out
  out=$(timeout 120 "$VENV/bin/python" "$HERE/bench-anchors-nixl.py" initiator "$op" "$size" "$nblk" "$iters" "$PORT" 2>/dev/null \
    | sed -n 's/.*GB\/s=\([0-9.]*\).*/\1/p') || true
  wait || true
  echo "$out"
}

case "${1:-}" in
  install) install ;;
  iperf) iperf "${2:-1}" "${3:-}" ;;
  memcpy) memcpy "${2:-1048576}" ;;
  ucx-tcp) ucx tcp "${2:-1048576}" ;;
  ucx-sm) ucx sm "${2:-1048576}" ;;
  mooncake) mooncake "${2:-write}" "${3:-1048576}" ;;
  nixl) nixl "${2:-write}" "${3:-1048576}" "${4:-tcp}" ;;
  *) sed -n '2,11p' "$0"; exit 2 ;;
esac
