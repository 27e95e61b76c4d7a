#!/usr/bin/env bash
# Builds NIXL's HIXL backend plugin, libplugin_HIXL.so, beside libhixl.so:
#   hixl-nixl/build.sh [DIR]     DIR: where libhixl.so is (default: ${CARGO_TARGET_DIR:-target}/release)
# C++20 and libstdc++'s new ABI, as NIXL 1.5.1 is built; against this directory's own
# declarations of NIXL's plugin interface (nixl_abi.h: no NIXL header is needed) and hixl's C
# ABI (include/hixl_c.h). The plugin needs libhixl.so at run time, found beside it
# ($ORIGIN): install.sh copies both into NIXL's plugin directory.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DIR=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
if [ ! -f "$DIR/libhixl.so" ]; then
  echo "build.sh: no $DIR/libhixl.so (build it first: cargo build --release -p hixl-capi)" >&2
  exit 1
fi
CXX=${CXX:-c++}
"$CXX" -std=c++20 -O2 -g -fPIC -shared -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=1 \
  -Wall -Wextra -Werror ${HIXL_NIXL_CXXFLAGS:-} \
  -I "$ROOT/include" -I "$HERE" \
  "$HERE/engine.cc" "$HERE/settings.cc" "$HERE/notif.cc" "$HERE/plugin.cc" \
  -o "$DIR/libplugin_HIXL.so.tmp" \
  -L "$DIR" -lhixl -Wl,-z,defs -Wl,-rpath,'$ORIGIN'
# moved into place whole: a process never loads half a library
mv -f "$DIR/libplugin_HIXL.so.tmp" "$DIR/libplugin_HIXL.so"
echo "$DIR/libplugin_HIXL.so"
