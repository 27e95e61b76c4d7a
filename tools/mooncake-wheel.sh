#!/usr/bin/env bash
# Mooncake's NPU wheel (vllm-ascend's path to HIXL) on hixl, as a user installs it: the wheel
# mooncake-transfer-engine-npu from the package registry, unchanged, into a fresh venv; hixl's
# release libraries (libllm_datadist.so, libcann_hixl.so) and the ACL/HCCL test double
# (tools/ascend-double.sh, with its libmetadef.so) on LD_LIBRARY_PATH, nothing else set; then
# tests/mooncake/mooncake_te.py: its TransferEngine with protocol "ascend" moving host and device
# memory both ways between two processes; then tests/mooncake/mooncake_store.py: Mooncake Store
# (mooncake_master and two store clients) putting and getting device memory over that transport.
#
#   tools/mooncake-wheel.sh [TARGET_DIR]    (default: target; needs target/release/libllm_datadist.so:
#                                            cargo build --release -p hixl-capi)
#
# Skips (exit 0, saying why) only when the registry cannot be reached; any other failure fails.
# Installs libibverbs1 with apt-get when it is missing and this runs as root (the wheel's
# libtransfer_engine.so links libibverbs.so.1; no RDMA device is used).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-${CARGO_TARGET_DIR:-target}}
version=0.3.13.post1
[[ $target == /* ]] || target="$PWD/$target"
lib="$target/release"
if [[ ! -e $lib/libllm_datadist.so || ! -e $lib/libcann_hixl.so ]]; then
  echo "$0: no $lib/libllm_datadist.so: run cargo build --release -p hixl-capi first" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the wheel's system libraries (Debian's names)
missing=()
ldconfig -p | grep -q 'libibverbs\.so\.1 ' || missing+=(libibverbs1)
ldconfig -p | grep -q 'libnuma\.so\.1 ' || missing+=(libnuma1)
ldconfig -p | grep -q 'libcurl\.so\.4 ' || missing+=(libcurl4)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "$0: the wheel needs ${missing[*]} (apt-get install them as root)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python3 -m venv "$work/venv"
py="$work/venv/bin/python"
# fetched first on its own, so that a registry out of reach is told from any other failure:
# when pip fails, the index it used (its "Looking in indexes" line, else pip's default) is
# asked directly; if that cannot be reached either, the step is skipped
if ! "$py" -m pip download --no-deps --dest "$work/wheel" \
     "mooncake-transfer-engine-npu==$version" >"$work/pip.log" 2>&1; then
  index=$(sed -n 's/^Looking in indexes: \([^ ,]*\).*/\1/p' "$work/pip.log" | head -n 1)
  if [[ -z $index ]]; then
    index=$("$py" -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)')
  fi
  if ! "$py" - "$index" >"$work/probe.log" 2>&1 <<'PROBE'
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/mooncake-transfer-engine-npu/", timeout=30).read(1)
PROBE
  then
    echo "SKIPPED: the package registry ($index) cannot be reached, so Mooncake's wheel cannot be installed:"
    tail -n 1 "$work/probe.log"
    exit 0
  fi
  cat "$work/pip.log" >&2
  echo "$0: pip could not fetch mooncake-transfer-engine-npu==$version, though $index answers" >&2
  exit 1
fi
"$py" -m pip install -q "$work/wheel"/mooncake_transfer_engine_npu-*.whl

bash tools/ascend-double.sh "$work/cann" >/dev/null
# a private TMPDIR: the double's processes meet in $TMPDIR/hixl-ascend-ranks-<uid>
mkdir -p "$work/tmp"
for k in $(env | grep -o '^HIXL[A-Z_]*' || true); do unset "$k"; done
LD_LIBRARY_PATH="$work/cann:$lib" TMPDIR="$work/tmp" GLOG_minloglevel=1 \
  timeout 300 "$py" tests/mooncake/mooncake_te.py
# Mooncake Store on the same transport: the wheel's mooncake_master and two store clients,
# device memory put by one and got by the other
LD_LIBRARY_PATH="$work/cann:$lib" TMPDIR="$work/tmp" GLOG_minloglevel=1 \
  timeout 300 "$py" tests/mooncake/mooncake_store.py
