#!/usr/bin/env bash
# Mooncake's own benchmark, transfer_engine_bench from its NPU wheel (mooncake-transfer-engine-npu,
# unchanged), over its "ascend" transport on hixl (ADXL from hixl's libllm_datadist.so, the
# ACL/HCCL test double), with its anchors in the same invocation: the same binary over Mooncake's
# own TCP transport, hixl's own engine over TCP (examples/bench, caller memory, the same op, block
# and batch) and iperf3 -P2 on loopback. Rows are printed as a Markdown table. On hixl the
# ascend transport's host and device memory alike go over HCCL's one-sided calls, which the
# double performs with process_vm_readv/writev: the figure is the double's copies, not a device.
#
#   tools/mooncake-bench.sh [VENV] [DURATION_S]
#
# VENV: a venv with the wheel installed (default: a new one, pip install from the registry);
# hixl's release libraries in ${CARGO_TARGET_DIR:-target}/release (cargo build --release -p
# hixl-capi). The wheel's benchmark never calls aclrtSetDevice (its ascend transport reads the
# thread's device, and fails without one, on CANN as on the double), so each process gets its
# device from a small preloaded library of this script's (aclrtSetDevice(SETDEV) before main,
# as torch_npu sets it in a serving process): target device 1, initiator device 0.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-}
duration=${2:-5}
target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target="$PWD/$target"
lib="$target/release"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
if [[ -z $venv ]]; then
  venv="$work/venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q mooncake-transfer-engine-npu==0.3.13.post1
fi
mc=$("$venv/bin/python" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')
bash tools/ascend-double.sh "$work/cann" >/dev/null
cat >"$work/setdev.c" <<'EOF'
#include <stdlib.h>
int aclrtSetDevice(int);
__attribute__((constructor)) static void set_device(void) {
  const char *d = getenv("SETDEV");
  (void)aclrtSetDevice(d ? atoi(d) : 0);
}
EOF
cc -shared -fPIC -o "$work/setdev.so" "$work/setdev.c" -L "$work/cann" -lascendcl
export LD_LIBRARY_PATH="$work/cann:$lib:$mc" TMPDIR="$work"
bench=$mc/transfer_engine_bench

# one run: PROTOCOL OP BLOCK BATCH -> GB/s
run() {
  local proto=$1 op=$2 block=$3 batch=$4 flags=() t tp out
  [[ $proto == ascend ]] && flags=(--auto_discovery=true) || flags=(--protocol="$proto")
  out="$work/target.$proto.log"
  SETDEV=1 LD_PRELOAD="$work/setdev.so" "$bench" --mode=target "${flags[@]}" \
    --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1:17777 --buffer_size=268435456 \
    >"$out" 2>&1 &
  t=$!
  pids+=("$t")
  until grep -aq 'register mem\|registerLocalMemory\|TcpTransport: listen' "$out"; do
    kill -0 "$t" 2>/dev/null || { cat "$out" >&2; return 1; }
    sleep 0.1
  done
  tp=$(grep -a -o 'listening on [0-9.:]*' "$out" | awk '{print $3}')
  SETDEV=0 LD_PRELOAD="$work/setdev.so" timeout $((duration + 60)) "$bench" --mode=initiator \
    "${flags[@]}" --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1:17778 \
    --segment_id="$tp" --operation="$op" --block_size="$block" --batch_size="$batch" \
    --buffer_size=268435456 --duration="$duration" --threads=2 >"$work/init.log" 2>&1
  kill "$t"
  wait "$t" 2>/dev/null || true
  grep -a -o 'throughput [0-9.]* GB/s' "$work/init.log" | awk '{print $2}'
}

iperf() {
  local s
  iperf3 -s -1 -p 15201 >/dev/null 2>&1 &
  s=$!
  pids+=("$s")
  until iperf3 -c 127.0.0.1 -p 15201 -t "$duration" -P 2 -l 1M -J >"$work/iperf.json" 2>/dev/null; do
    kill -0 "$s" 2>/dev/null || return 1
    sleep 0.1
  done
  python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/8e9, 2))' "$work/iperf.json"
}

# hixl's own engine, same op, block and batch, over TCP with caller memory (examples/bench)
engine() {
  env -u LD_LIBRARY_PATH "$target/release/examples/bench" --transport tcp --memory user --op "$1" \
    --block "$2" --batch "$3" --duration "$duration" --no-extras --no-cold --json 2>/dev/null |
    python3 -c 'import json,sys; print([json.loads(l)["gbps"] for l in sys.stdin if "gbps" in l][0])'
}
cargo build -q --release --example bench

echo "| op | block | batch | ascend on hixl GB/s | Mooncake tcp GB/s | hixl engine tcp GB/s | iperf3 -P2 GB/s | ascend/iperf3 |"
echo "|---|---|---|---|---|---|---|---|"
anchor=$(command -v iperf3 >/dev/null && iperf || echo "-")
for op in read write; do
  for spec in 65536:32 1048576:8; do
    block=${spec%:*} batch=${spec#*:}
    a=$(run ascend "$op" "$block" "$batch")
    t=$(run tcp "$op" "$block" "$batch")
    h=$(engine "$op" "$block" "$batch")
    ratio=$([[ $anchor != - ]] && python3 -c "print(round($a/$anchor, 2))" || echo "-")
    echo "| $op | $block | $batch | $a | $t | $h | $anchor | $ratio |"
  done
done
