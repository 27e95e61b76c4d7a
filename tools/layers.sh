#!/usr/bin/env bash
# The layer check (issues #13 and #22). It reads every `crate::…` path each file under src/
# names (in `use` lines, groups and nested groups included, and in code) and fails on a
# violation of any of these rules that tools/layers.allow does not list:
#
# 1. layers: a file imports only from its own layer and the ones below it. Layers, lowest first:
#    0 leaf       src/types/, src/error.rs (and error/), src/sync.rs (lock helper, loom switch), src/wire/
#                 (the protocol's codec), src/io/ (deadline socket I/O), src/dl.rs (run-time
#                 loading), src/auth.rs, src/process.rs (other processes of this host, shared
#                 memory), src/device/ (ACL device memory, pinned host memory, device contexts)
#    1 transport  src/transport/mod.rs (the Backend and DataPath traits, probe) and one folder
#                 per transport, FFI included: tcp/, same_host/, ucx/, ascend/
#    2 runtime    src/runtime/ (engine core, link core, executor, region records, requests,
#                 connects, serve/, revoke/, transports.rs), src/options.rs (the engine's
#                 configuration), src/buffers.rs (HostBuffer), src/metrics.rs, src/notify.rs
#    3 api        src/lib.rs, src/engine/, src/link.rs, src/memory.rs,
#                 src/request.rs, src/compat/, src/spec.rs, src/bin/
#    4 products   src/datadist/ (LLM-DataDist), src/cs/ (HIXL-CS: client, server, memory list),
#                 both over compat; src/published.rs (the published table they share: header,
#                 seqlock, fetch with retry); src/testkit.rs (test support, over everything)
#    A root path (`crate::Name`, `crate::function`: a re-export of lib.rs) is api. A file, or a
#    module of lib.rs, that is in no layer fails the check: place it in this list and in
#    `file_layer`/`path_layer` below.
# 2. transports apart: no transport imports another (src/transport/mod.rs, the traits' home,
#    declares them all and may name them).
# 3. one registry: outside src/transport/, only src/runtime/transports.rs names a transport:
#    a `transport::tcp`, `::same_host`, `::ucx` or `::ascend` path, or a type a transport
#    implements `Backend` or `DataPath` for (read from src/transport/*/). The one exception:
#    src/runtime/serve/ and src/runtime/link/ may name `transport::tcp`: TCP is not a plug-in
#    but every link's control channel, its lanes the link core's and its serving half the
#    serving engine's, imported directly, not through a re-export in the registry.
# 4. named imports: no glob import (`use super::*;`, `use crate::a::*;`, a `*` in a group) at
#    a file's top level. Inside a file, `mod tests { use super::*; }` is fine.
# 5. faces and products apart: every face and product is a sibling on the core floor
#    (src/runtime/: its handle API), none reaching another's insides. The typed face
#    (src/engine/, src/link.rs, src/memory.rs, src/request.rs) names no `crate::compat` path;
#    the compat face and the products (src/datadist/, src/cs/, src/published.rs) name none of
#    the typed face's modules (`crate::engine`, `::link`, `::memory`, `::request`: the public
#    types re-exported at the root, `crate::TransferOp` and the like, are fine); the products
#    name no `crate::compat` path.
#
# Not read: comment lines, and `#[cfg(test)]` / `#[cfg(all(test, …))]` modules written inline
# (`mod tests { … }` up to the next `}` in column 0). A test module in a file of its own is read
# like any file. `super::` paths are not followed: inside a transport's folder they stay in it.
#
# Known violations are listed in tools/layers.allow (one `file -> what` a line, as this script
# prints them). A violation not in the list fails the check, and so does a listed one that is
# gone: the list only shrinks.
#
# Usage: tools/layers.sh             check src/
#        tools/layers.sh --list      also print every path read, with its layers, to stderr
#        tools/layers.sh --self-test check that each rule catches a violation planted in a copy
#                                    of src/ (and that the tree as it is passes)
set -euo pipefail
cd "$(dirname "$0")/.."
allow=tools/layers.allow

# layer of a source file, in LR (rank) and LN (name: the transport, for layer 1), or "- none"
# (variables, not output: no subshell a line of imports)
file_layer() {
  case "$1" in
    src/types/* | src/error.rs | src/error/* | src/sync.rs | src/wire/* | src/io/* | src/dl.rs | src/auth.rs \
      | src/process.rs | src/process/* | src/device/*)
      LR=0 LN=leaf ;;
    src/transport/mod.rs) LR=1 LN=transport ;;
    src/transport/tcp/*) LR=1 LN=tcp ;;
    src/transport/same_host/*) LR=1 LN=same_host ;;
    src/transport/ucx/*) LR=1 LN=ucx ;;
    src/transport/ascend/*) LR=1 LN=ascend ;;
    src/runtime/* | src/options.rs | src/buffers.rs | src/metrics.rs | src/notify.rs)
      LR=2 LN=runtime ;;
    src/lib.rs | src/engine/* | src/link.rs | src/memory.rs | src/request.rs \
      | src/compat/* | src/spec.rs | src/bin/*)
      LR=3 LN=api ;;
    src/datadist/* | src/cs/* | src/published.rs | src/testkit.rs) LR=4 LN=products ;;
    *) LR=- LN=none ;;
  esac
}

# layer of a path (crate::a::b…), in LR and LN as file_layer's, or "- none"
path_layer() {
  local p=${1#crate::}
  local a=${p%%::*} rest=${p#*::}
  [ "$rest" = "$p" ] && rest=
  local b=${rest%%::*}
  case "$a" in
    types | error | sync | wire | io | dl | auth | process | device) LR=0 LN=leaf ;;
    transport)
      case "$b" in
        tcp | same_host | ucx | ascend) LR=1 LN=$b ;;
        *) LR=1 LN=transport ;;
      esac ;;
    runtime | options | buffers | metrics | notify) LR=2 LN=runtime ;;
    engine | link | memory | request | compat | spec) LR=3 LN=api ;;
    datadist | cs | published | testkit) LR=4 LN=products ;;
    *)
      # a module of lib.rs this list does not place; anything else is a root item (api)
      if grep -qxE "(pub(\([a-z]+\))? )?mod $a;" src/lib.rs; then LR=- LN=none; else LR=3 LN=api; fi ;;
  esac
}

# "Type:transport" for every type a transport implements Backend or DataPath for (the std
# wrappers around one, as in `Mutex<Option<DeviceLink>>`, dropped)
transport_types() {
  local t
  for t in src/transport/*/; do
    t=${t%/}
    t=${t##*/}
    grep -rhoE 'impl (Backend|DataPath) for [A-Za-z0-9_<>, ]+' "src/transport/$t" \
      | sed -E 's/^impl (Backend|DataPath) for //' | tr '<>, ' '\n\n\n\n' \
      | grep -vxE 'Mutex|RwLock|Option|Arc|Box|' | sed "s/\$/:$t/" || true
  done | sort -u | tr '\n' ' '
}

# every (file, what) pair: crate paths cut to two segments (crate::engine), or three for a
# transport (crate::transport::tcp); a transport's type as its path; a top-level glob import
# as `use …::*`
imports() {
  local types
  types=$(transport_types)
  # one awk over every file (its state reset at each file's first line)
  find src -name '*.rs' | sort | tr '\n' '\0' | xargs -0 awk -v TYPES="$types" '
      BEGIN {
        nt = split(TYPES, tt, " ")
        for (i = 1; i <= nt; i++) { split(tt[i], kv, ":"); tname[i] = kv[1]; tpath[i] = kv[2] }
      }
      function emit(p,   n, s) {
        n = split(p, s, "::")
        if (s[2] == "transport" && n >= 3 && s[3] ~ /^[a-z_]+$/) print F, "crate::transport::" s[3]
        else print F, "crate::" s[2]
      }
      # a::b::{c, d::e} -> a::b::c a::b::d::e, innermost group first
      function flatten(s,   m, i, pre, inner, n, it, k, x, rep) {
        while (match(s, /[A-Za-z_$][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*::\{[^{}]*\}/)) {
          m = substr(s, RSTART, RLENGTH)
          i = index(m, "::{")
          pre = substr(m, 1, i - 1)
          inner = substr(m, i + 3, length(m) - i - 3)
          n = split(inner, it, ",")
          rep = ""
          for (k = 1; k <= n; k++) {
            x = it[k]
            sub(/^[ \t]+/, "", x)
            sub(/[ \t].*$/, "", x)
            if (x == "") continue
            rep = rep " " (x == "self" ? pre : pre "::" x)
          }
          s = substr(s, 1, RSTART - 1) rep " " substr(s, RSTART + RLENGTH)
        }
        return s
      }
      function scan(s, top,   w, i, pat) {
        s = flatten(s)
        if (top && s ~ /^(pub(\([a-z]+\))? )?use / && s ~ /::\*/) {
          w = s
          sub(/^(pub(\([a-z]+\))? )?use /, "", w)
          sub(/::\*.*$/, "::*", w)
          sub(/^.* /, "", w)
          print F, "use " w
        }
        w = s
        while (match(w, /crate::[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)?/)) {
          emit(substr(w, RSTART, RLENGTH)); w = substr(w, RSTART + RLENGTH)
        }
        for (i = 1; i <= nt; i++) {
          pat = "(^|[^A-Za-z0-9_])" tname[i] "([^A-Za-z0-9_]|$)"
          if (s ~ pat) print F, "crate::transport::" tpath[i]
        }
      }
      FNR == 1 { F = FILENAME; skip = 0; pend = 0; stmt = "" }
      skip == 0 && /^#\[cfg\((all\()?test[,)]/ { pend = 1; next }
      pend == 1 { pend = 0; if ($0 ~ /^(pub(\([a-z]+\))? )?mod [a-z_]+ \{/) { skip = 1; next } }
      skip == 1 { if ($0 ~ /^\}/) skip = 0; next }
      /^[ \t]*\/\// { next }
      {
        line = $0
        if (stmt != "") {
          stmt = stmt " " line
          if (stmt ~ /;/) { scan(stmt, stop); stmt = "" }
          next
        }
        if (line ~ /^[ \t]*(pub(\([a-z]+\))? )?use / && line !~ /;/) {
          stmt = line; stop = (line ~ /^(pub(\([a-z]+\))? )?use /); next
        }
        scan(line, line ~ /^(pub(\([a-z]+\))? )?use /)
      }' | sort -u
}

# rule 5: which face or product a file is, and which one a path names, in FACE ("-": neither)
face_of() {
  case "$1" in
    src/engine/* | src/link.rs | src/memory.rs | src/request.rs) FACE=typed ;;
    src/compat/*) FACE=compat ;;
    src/datadist/* | src/cs/* | src/published.rs) FACE=product ;;
    *) FACE=- ;;
  esac
}
face_path() {
  case "${1#crate::}" in
    engine | engine::* | link | link::* | memory | memory::* | request | request::*) FACE=typed ;;
    compat | compat::*) FACE=compat ;;
    *) FACE=- ;;
  esac
}

# rule 3's one exception: the serving engine and the link core may name TCP
tcp_exception() {
  [ "$2" = crate::transport::tcp ] || return 1
  case "$1" in
    src/runtime/serve/* | src/runtime/link/*) return 0 ;;
    *) return 1 ;;
  esac
}

# Checks src/; prints what fails and returns non-zero on any failure.
check() {
  local list=$1 status=0 rule title hits
  local found=$work/found allowed=$work/allowed new=$work/new unplaced=$work/unplaced
  find src -name '*.rs' | sort | while read -r f; do
    file_layer "$f"
    if [ "$LR" = - ]; then echo "$f: in no layer"; fi
  done >"$unplaced"
  imports | while read -r f p; do
    file_layer "$f"
    fr=$LR fn=$LN
    if [ "${p#use }" != "$p" ]; then
      if [ "$list" = 1 ]; then printf '%-34s %-11s -> %s   VIOLATION (4)\n' "$f" "$fn" "$p" >&2; fi
      echo "4 $f -> $p"
      continue
    fi
    path_layer "$p"
    pr=$LR pn=$LN
    if [ "$pr" = - ]; then
      echo "$p (in $f): in no layer" >>"$unplaced"
      continue
    fi
    if [ "$fr" = - ]; then continue; fi
    rule=
    if [ "$pr" -gt "$fr" ]; then rule=1
    elif [ "$fr" = 1 ] && [ "$pr" = 1 ] && [ "$fn" != transport ] && [ "$pn" != transport ] \
      && [ "$fn" != "$pn" ]; then rule=2
    elif [ "$pr" = 1 ] && [ "$pn" != transport ] && [ "${f#src/transport/}" = "$f" ] \
      && [ "$f" != src/runtime/transports.rs ] && ! tcp_exception "$f" "$p"; then rule=3
    else
      face_of "$f"
      local ff=$FACE
      face_path "$p"
      case "$ff $FACE" in
        "typed compat" | "compat typed" | "product typed" | "product compat") rule=5 ;;
      esac
    fi
    if [ "$list" = 1 ]; then
      printf '%-34s %-11s -> %-28s %s%s\n' "$f" "$fn" "$p" "$pn" "${rule:+   VIOLATION ($rule)}" >&2
    fi
    if [ -n "$rule" ]; then echo "$rule $f -> $p"; fi
  done >"$found"

  if [ -s "$unplaced" ]; then
    echo "layers: files and modules in no layer (place them in the header and in file_layer/path_layer):"
    sed 's/^/  /' "$unplaced"
    status=1
  fi
  { grep -v '^#' "$allow" || true; } | sed '/^$/d' >"$allowed"
  cut -d' ' -f2- "$found" | grep -vxF -f "$allowed" >"$new" || true
  for rule in 1 2 3 4 5; do
    case $rule in
      1) title="imports that go up a layer" ;;
      2) title="a transport that imports another" ;;
      3) title="a transport named outside src/transport/ and src/runtime/transports.rs" ;;
      4) title="glob imports at a file's top level (name what you import)" ;;
      5) title="a face or product reaching another's insides (siblings on the core floor)" ;;
    esac
    hits=$(grep "^$rule " "$found" | cut -d' ' -f2- | grep -xF -f "$new" || true)
    if [ -n "$hits" ]; then
      echo "layers: rule $rule, $title:"
      echo "$hits" | sed 's/^/  /'
      status=1
    fi
  done
  local gone
  gone=$(cut -d' ' -f2- "$found" | grep -vxF -f - "$allowed" || true)
  if [ -n "$gone" ]; then
    echo "layers: allowed violations that are gone — delete them from $allow:"
    echo "$gone" | sed 's/^/  /'
    status=1
  fi
  if [ "$status" = 0 ]; then
    echo "layers: ok ($(wc -l <"$allowed" | tr -d ' ') known violations left in $allow)"
  fi
  return $status
}

# Plants one violation of each rule in a copy of src/ and tools/ and checks that the copy then
# fails, naming it.
self_test() {
  local tmp=$work/self-test fail=0
  fresh() {
    rm -rf "$tmp/t"
    mkdir -p "$tmp/t"
    cp -r src tools "$tmp/t/"
  }
  run() { bash "$tmp/t/tools/layers.sh" 2>&1; }
  # expect_fail WHAT EXPECTED: the planted copy must fail, printing EXPECTED
  expect_fail() {
    local out
    if out=$(run); then
      echo "self-test: not caught: $1"
      fail=1
    elif ! grep -qF -- "$2" <<<"$out"; then
      printf 'self-test: %s: failed without naming %s:\n%s\n' "$1" "$2" "$out"
      fail=1
    else
      echo "self-test: caught: $1"
    fi
  }
  expect_ok() {
    local out
    if ! out=$(run); then
      printf 'self-test: %s: fails:\n%s\n' "$1" "$out"
      fail=1
    else
      echo "self-test: passes: $1"
    fi
  }
  plant() { printf '%s\n' "$2" >>"$tmp/t/$1"; }

  fresh
  expect_ok "the tree as it is"

  # rule 1, from a leaf and from the transport layer
  fresh; plant src/io/mod.rs 'use crate::runtime::region::RegionCore;'
  expect_fail "rule 1: a leaf importing the runtime" "src/io/mod.rs -> crate::runtime"
  fresh; plant src/transport/mod.rs 'fn planted(_: &crate::options::Options) {}'
  expect_fail "rule 1: the transport layer importing the runtime" \
    "src/transport/mod.rs -> crate::options"
  fresh; plant src/compat/mod.rs 'use crate::published::Format;'
  expect_fail "rule 1: a face importing a product" "src/compat/mod.rs -> crate::published"
  # rule 2
  fresh; plant src/transport/same_host/backend.rs 'use crate::transport::ucx::UcxBackend;'
  expect_fail "rule 2: same_host importing ucx" \
    "src/transport/same_host/backend.rs -> crate::transport::ucx"
  # rule 3: each transport's name, a path in a group and in a nested multi-line group, a type
  local t
  for t in tcp same_host ucx ascend; do
    fresh; plant src/memory.rs "fn planted() { let _ = crate::transport::$t::X; }"
    expect_fail "rule 3: $t named in src/memory.rs" "src/memory.rs -> crate::transport::$t"
  done
  # ... and its exception: TCP in the serving engine and the link core, nothing else there,
  # nor TCP anywhere else
  fresh; plant src/runtime/serve/worker.rs 'use crate::transport::ucx::UcxEngine;'
  expect_fail "rule 3: ucx named in the serving engine" \
    "src/runtime/serve/worker.rs -> crate::transport::ucx"
  fresh; plant src/runtime/engine.rs 'use crate::transport::tcp::Lanes;'
  expect_fail "rule 3: tcp named in the engine core" "src/runtime/engine.rs -> crate::transport::tcp"
  fresh; plant src/link.rs 'use crate::transport::{Backend, ascend::Runtime};'
  expect_fail "rule 3: a transport in a use group" "src/link.rs -> crate::transport::ascend"
  fresh; plant src/request.rs $'use crate::{\n    error::Error,\n    transport::{ucx::UcxEngine, Backend},\n};'
  expect_fail "rule 3: a transport in a nested multi-line group" \
    "src/request.rs -> crate::transport::ucx"
  fresh; plant src/compat/mod.rs 'fn planted(_: SameHostBackend) {}'
  expect_fail "rule 3: a transport's Backend type" "src/compat/mod.rs -> crate::transport::same_host"
  # rule 4
  fresh; plant src/engine/connected.rs 'use super::*;'
  expect_fail "rule 4: use super::* at the top of a file" "src/engine/connected.rs -> use super::*"
  fresh; plant src/link.rs 'use crate::types::{*, raw::RawMemory};'
  expect_fail "rule 4: a glob in a group" "src/link.rs -> use crate::types::*"
  # rule 5: each direction
  fresh; plant src/compat/mod.rs 'fn planted(_: &crate::link::Link<'"'"'_>) {}'
  expect_fail "rule 5: compat naming the typed face" "src/compat/mod.rs -> crate::link"
  fresh; plant src/link.rs 'fn planted(_: &crate::compat::Hixl) {}'
  expect_fail "rule 5: the typed face naming compat" "src/link.rs -> crate::compat"
  fresh; plant src/cs/mod.rs 'fn planted(_: &crate::compat::Hixl) {}'
  expect_fail "rule 5: a product naming compat" "src/cs/mod.rs -> crate::compat"
  fresh; plant src/cs/mod.rs 'fn planted(_: &crate::engine::Connected) {}'
  expect_fail "rule 5: a product naming the typed face" "src/cs/mod.rs -> crate::engine"
  # a file or a module in no layer
  fresh; plant src/planted.rs 'use crate::types::MemType;'
  expect_fail "a file in no layer" "src/planted.rs: in no layer"
  fresh; plant src/lib.rs 'mod planted;'; plant src/memory.rs 'use crate::planted::Thing;'
  expect_fail "a module in no layer" "crate::planted (in src/memory.rs): in no layer"
  # the allow list: a listed violation passes, a listed one that is gone fails
  fresh; plant src/io/mod.rs 'use crate::runtime::region::RegionCore;'
  plant tools/layers.allow 'src/io/mod.rs -> crate::runtime'
  expect_ok "a violation listed in layers.allow"
  fresh; plant tools/layers.allow 'src/io/mod.rs -> crate::runtime'
  expect_fail "a listed violation that is gone" "delete them from tools/layers.allow"
  # what is not read
  fresh; plant src/io/mod.rs $'#[cfg(test)]\nmod planted_tests {\n    use super::*;\n    use crate::runtime::region::RegionCore;\n}'
  expect_ok "an inline test module"
  fresh; plant src/memory.rs '// crate::transport::ucx::UcxBackend in a comment'
  expect_ok "a comment"

  if [ "$fail" = 0 ]; then echo "layers: self-test ok"; else echo "layers: self-test FAILED"; fi
  return $fail
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "${1:-}" in
  --self-test) self_test ;;
  --list) check 1 ;;
  "") check 0 ;;
  *) echo "usage: $0 [--list | --self-test]" >&2; exit 2 ;;
esac
