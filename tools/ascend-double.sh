#!/usr/bin/env bash
# Builds the ACL/HCCL ABI test double (tests/ascend_double/double.c) as shared libraries under
# CANN's names in DIR, so that a program built against CANN (HIXL's examples, hixl's own C/C++
# bindings) links and runs on it unchanged:
#
#   tools/ascend-double.sh /tmp/cann && LD_LIBRARY_PATH=/tmp/cann ./program
#
# DIR gets one real object, libacl_rt.so (SONAME libacl_rt.so), and libascendcl.so,
# libhcomm.so, libhccl.so and libascend_hal.so as symlinks to it: the loader keys a loaded
# object by its file, so every name opens the same object and ACL and HCCL share their state,
# and `-lacl_rt -lascend_hal` (the link line of HIXL's examples/cpp/CMakeLists.txt) links.
# Needs only `cc` (and a C++ compiler for libmetadef.so, below). Nothing to set at run time: processes find each other through a private
# directory of the user's (see the header of double.c, HIXL_ASCEND_DOUBLE_DIR).
#
# The double moves host memory and proves nothing about Ascend hardware.
set -euo pipefail

if [[ $# -ne 1 || $1 == -* ]]; then
  echo "usage: $0 DIR   (builds libacl_rt.so and CANN's other library names in DIR)" >&2
  exit 2
fi
dir=$1
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/ascend_double/double.c"
[[ -f $src ]] || { echo "$0: no $src" >&2; exit 1; }
mkdir -p "$dir"

# built under a temporary name and renamed, so a program running on the old one keeps it
tmp=$(mktemp "$dir/.libacl_rt.so.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cc -shared -fPIC -O1 -Wall -Wextra -Wl,-soname,libacl_rt.so -o "$tmp" "$src" -lpthread
chmod 0755 "$tmp"
mv -f "$tmp" "$dir/libacl_rt.so"
trap - EXIT
echo "built $dir/libacl_rt.so (the ACL/HCCL test double, from $src)"
# CANN's samples and headers include securec.h (Huawei's bounds-checked C library, on a CANN
# install's include path; hcomm/hcomm_res_defs.h among them): hixl's minimal stand-in
# (tools/securec.h) in DIR/include, unless one is there already
mkdir -p "$dir/include"
if [[ ! -e $dir/include/securec.h ]]; then
  cp "$(dirname "$src")/../../tools/securec.h" "$dir/include/securec.h"
  echo "installed $dir/include/securec.h (a minimal stand-in for CANN's securec.h)"
fi
for name in libascendcl.so libhcomm.so libhccl.so libascend_hal.so; do
  ln -sfn libacl_rt.so "$dir/$name"
  echo "linked $dir/$name -> libacl_rt.so"
done
# libmetadef.so: what callers need of CANN's GE metadata library, ge::AscendString's out-of-line
# methods (prebuilt programs such as Mooncake's ascend_transport.so name it in DT_NEEDED and take
# AscendString(const char*) and operator< from it). Built from hixl's own definitions
# (hixl-capi/cxx/ascend_string.cc, the ones libllm_datadist.so and libcann_hixl.so export) with
# CANN's C++ ABI, -D_GLIBCXX_USE_CXX11_ABI=0; it needs a C++ compiler, and is skipped without one.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cxx=${CXX:-c++}
if command -v "$cxx" >/dev/null; then
  tmp=$(mktemp "$dir/.libmetadef.so.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  "$cxx" -std=c++17 -shared -fPIC -O2 -Wall -Wextra -D_GLIBCXX_USE_CXX11_ABI=0 \
    -Wl,-soname,libmetadef.so -I "$root/include" -o "$tmp" "$root/hixl-capi/cxx/ascend_string.cc"
  chmod 0755 "$tmp"
  mv -f "$tmp" "$dir/libmetadef.so"
  trap - EXIT
  echo "built $dir/libmetadef.so (ge::AscendString, a stand-in for CANN's libmetadef.so)"
else
  echo "skipped $dir/libmetadef.so: no C++ compiler ($cxx) for ge::AscendString" >&2
fi
