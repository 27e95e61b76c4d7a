#!/usr/bin/env bash
# The import check (issue #13): lists every `crate::…` path each module under src/ uses and fails
# if a lower layer imports a higher one, or if one transport imports another.
#
# Layers, lowest first (a module may import its own layer and the ones below it):
#   0 leaf       types, sync (the lock helper), error, wire, io (deadline socket I/O), dl (runtime
#                loading), auth, the FFI `sys` tables — import nothing above them
#   1 transport  src/transport/: mod.rs (the DataPath trait, probe) and one folder per transport
#                — tcp, same_host, ucx, ascend — none of which imports another transport
#                (transport/mod.rs may name them all: it is the registry)
#   2 runtime    src/runtime/ (engine core, link core, executor, region records, control/), and
#                what they are built of: quarantine.rs, metrics.rs, notify.rs, options.rs (the
#                engine's configuration), buffers.rs (HostBuffer, memory the engine can share)
#   3 api        engine.rs, link.rs, memory.rs, transfer.rs, request.rs, context.rs, options.rs,
#                spec.rs, testkit.rs, compat.rs, lib.rs (`crate::Name`, a root re-export, counts
#                as api)
#
# What is read: every non-comment line outside `#[cfg(test)] mod … { … }` blocks; `crate::a::b`
# and `use crate::{a, b::c}` (one line or several). `super::` paths are not followed: inside a
# transport's folder they stay in that transport.
#
# Also: outside src/transport/, the backends (and anything of UCX) are named only in
# src/runtime/transports.rs, the one place a transport is registered.
#
# Known violations are listed in tools/layers.allow (one `file -> crate::path` a line). A
# violation not in the list fails the check, and so does a listed one that is gone: the list only
# shrinks. Usage: tools/layers.sh [--list]   (--list prints every import with its layers)
set -euo pipefail
cd "$(dirname "$0")/.."
allow=tools/layers.allow

# layer of a source file: "<rank> <name>" (name: the transport, for layer 1)
file_layer() {
  case "$1" in
    src/types.rs | src/types/* | src/error.rs | src/error/* | src/wire.rs | src/wire/* | src/io.rs \
      | src/dl.rs | src/auth.rs | src/process.rs | src/device/* | */sys.rs | */sys/*)
      echo "0 leaf" ;;
    src/transport/mod.rs) echo "1 transport" ;;
    src/transport/same_host/*) echo "1 same_host" ;;
    src/transport/tcp.rs | src/transport/tcp/*) echo "1 tcp" ;;
    src/transport/ucx/*) echo "1 ucx" ;;
    src/transport/ascend/*) echo "1 ascend" ;;
    src/runtime/* | src/metrics.rs | src/notify.rs | src/options.rs \
      | src/buffers.rs)
      echo "2 runtime" ;;
    *) echo "3 api" ;;
  esac
}

# layer of an imported path (crate::a::b…)
path_layer() {
  local p=${1#crate::}
  local a=${p%%::*} rest=${p#*::}
  [ "$rest" = "$p" ] && rest=
  local b=${rest%%::*}
  case "$a" in
    [A-Z]*) echo "3 api" ;;
    types | sync | error | wire | io | dl | auth | process | device) echo "0 leaf" ;;
    transport)
      case "$b" in
        same_host) echo "1 same_host" ;;
        tcp) echo "1 tcp" ;;
        ucx) echo "1 ucx" ;;
        ascend) echo "1 ascend" ;;
        *) echo "1 transport" ;;
      esac ;;
    runtime | metrics | notify | options | buffers) echo "2 runtime" ;;
    *) echo "3 api" ;;
  esac
}

# every (file, crate path) pair, paths cut to two segments (crate::transport::tcp, crate::engine)
imports() {
  find src -name '*.rs' | sort | while read -r f; do
    awk -v F="$f" '
      function emit(p,   n, s) {
        n = split(p, s, "::")
        if (s[2] == "transport" && n >= 3 && s[3] ~ /^[a-z_]+$/) print F, "crate::transport::" s[3]
        else print F, "crate::" s[2]
      }
      skip == 0 && /^#\[cfg\(test\)\]/ { pend = 1; next }
      pend == 1 { pend = 0; if ($0 ~ /^(pub(\([a-z]+\))? )?mod [a-z_]+ \{/) { skip = 1; next } }
      skip == 1 { if ($0 ~ /^\}/) skip = 0; next }
      /^[ \t]*\/\// { next }
      {
        line = $0
        if (group != "") { group = group " " line; if (line ~ /\}/) { line = group; group = "" } else next }
        else if (line ~ /crate::\{/ && line !~ /crate::\{[^}]*\}/) { group = line; next }
        while (match(line, /crate::\{[^}]*\}/)) {
          g = substr(line, RSTART + 8, RLENGTH - 9)
          n = split(g, items, ",")
          for (i = 1; i <= n; i++) { it = items[i]; gsub(/[ \t{}]/, "", it); if (it != "") emit("crate::" it) }
          line = substr(line, RSTART + RLENGTH)
        }
        while (match(line, /crate::[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)?/)) {
          emit(substr(line, RSTART, RLENGTH)); line = substr(line, RSTART + RLENGTH)
        }
      }' "$f"
  done | sort -u
}

list=0
[ "${1:-}" = "--list" ] && list=1
found=$(mktemp)
trap 'rm -f "$found"' EXIT
imports | while read -r f p; do
  read -r fr fn <<<"$(file_layer "$f")"
  read -r pr pn <<<"$(path_layer "$p")"
  bad=
  if [ "$pr" -gt "$fr" ]; then bad="layer $fn($fr) imports $pn($pr)"
  elif [ "$fr" = 1 ] && [ "$pr" = 1 ] && [ "$fn" != transport ] && [ "$pn" != transport ] \
    && [ "$fn" != "$pn" ]; then bad="transport $fn imports transport $pn"
  fi
  [ "$list" = 1 ] && printf '%-34s %-11s -> %-28s %s%s\n' "$f" "$fn" "$p" "$pn" "${bad:+   VIOLATION}" >&2
  if [ -n "$bad" ]; then echo "$f -> $p"; fi
done >"$found"

status=0
# the backend registry: outside src/transport/, a transport's backend and UCX are named only in
# src/runtime/transports.rs (the one place a transport is registered)
registry=$(grep -rnE 'UcxBackend|SameHostBackend|AscendBackend|SameHostPath|transport::ucx' src \
  --include='*.rs' | grep -v '^src/transport/' | grep -v '^src/runtime/transports.rs:' \
  | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [ -n "$registry" ]; then
  echo "layers: a transport named outside src/transport/ and src/runtime/transports.rs:"
  echo "$registry" | sed 's/^/  /'
  status=1
fi
new=$(grep -vxFf <(grep -v '^#' "$allow" | sed '/^$/d') "$found" || true)
gone=$(grep -v '^#' "$allow" | sed '/^$/d' | grep -vxFf "$found" || true)
if [ -n "$new" ]; then
  echo "layers: imports that go up a layer or across transports (fix them; see the header):"
  echo "$new" | sed 's/^/  /'
  status=1
fi
if [ -n "$gone" ]; then
  echo "layers: allowed violations that are gone — delete them from $allow:"
  echo "$gone" | sed 's/^/  /'
  status=1
fi
[ "$status" = 0 ] && echo "layers: ok ($(wc -l <"$found" | tr -d ' ') known violations left in $allow)"
exit $status
