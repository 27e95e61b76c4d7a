#!/usr/bin/env bash
# Installs NIXL's HIXL backend beside the plugins of the NIXL wheel of a Python environment,
# so `backends=["HIXL"]` works there and the wheel's own backends (UCX, ...) stay available.
#
#   hixl-nixl/install.sh [PYTHON]            PYTHON: the environment's interpreter (default: python3)
#   hixl-nixl/install.sh --uninstall [PYTHON]
#
# Builds libhixl.so (cargo build --release -p hixl-capi) when target/release has none, then
# libplugin_HIXL.so (build.sh), checks it against the wheel's own engines (abi_check.py: it
# refuses a wheel whose plugin interface differs), and copies both into the wheel's plugin
# directory: the
# `plugins` directory beside the wheel's libnixl.so (what NIXL searches when NIXL_PLUGIN_DIR
# is not set: setting it replaces that directory, so the wheel's UCX would be gone). Works for
# the wheels nixl-cu12 and nixl-cu13 (and `nixl`, which installs one of them); checked with
# nixl-cu12 1.5.1, whose plugin interface hixl-nixl/nixl_abi.h declares (abi_check.py checks
# it against the installed wheel).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
UNINSTALL=0
if [ "${1:-}" = "--uninstall" ]; then UNINSTALL=1; shift; fi
PY=${1:-python3}

# the wheel's plugin directory, found without importing NIXL
DIR=$("$PY" - <<'PY'
import importlib.util, os, sys
for name in ("nixl_cu12", "nixl_cu13"):
    spec = importlib.util.find_spec(name)
    if spec and spec.origin:
        site = os.path.dirname(os.path.dirname(spec.origin))
        d = os.path.join(site, f".{name}.mesonpy.libs", "plugins")
        if os.path.isfile(os.path.join(d, "..", "libnixl.so")):
            print(os.path.normpath(d))
            sys.exit(0)
sys.exit("no NIXL wheel (nixl-cu12 or nixl-cu13) in this environment: pip install nixl-cu12")
PY
)

if [ "$UNINSTALL" = 1 ]; then
  rm -f "$DIR/libplugin_HIXL.so" "$DIR/libhixl.so"
  echo "removed the HIXL backend from $DIR"
  exit 0
fi

LIB=${HIXL_NIXL_LIB_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
if [ ! -f "$LIB/libhixl.so" ]; then
  (cd "$ROOT" && cargo build --release -p hixl-capi)
fi
"$HERE/build.sh" "$LIB" >/dev/null
if command -v nm >/dev/null && command -v readelf >/dev/null && command -v c++filt >/dev/null; then
  "$PY" "$HERE/abi_check.py" "$LIB/libplugin_HIXL.so" "$DIR"
else
  echo "install.sh: no binutils (nm, readelf, c++filt): the plugin is not checked against this wheel" >&2
fi
install -m 0755 "$LIB/libhixl.so" "$DIR/libhixl.so.tmp"
install -m 0755 "$LIB/libplugin_HIXL.so" "$DIR/libplugin_HIXL.so.tmp"
mv -f "$DIR/libhixl.so.tmp" "$DIR/libhixl.so"
mv -f "$DIR/libplugin_HIXL.so.tmp" "$DIR/libplugin_HIXL.so"
echo "installed the HIXL backend in $DIR (use it with backends=[\"HIXL\"])"
