#!/usr/bin/env python3
# Usage: python3 tools/cycles.py [src]   (issue #33: "no import circle in the crate")
"""Import graph of src/ by file: every crate::/super::/self:: path a file names (use lines,
groups flattened, and paths in code), outside inline #[cfg(test)] modules and comments; prints
the strongly connected components (import circles) with more than one file, largest first."""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "src"
mods = {}  # module path tuple -> file
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs"): continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"): rel = rel[:-1]
        mods[tuple(rel)] = p
def flatten(s):
    pat = re.compile(r'([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*)\}')
    while True:
        m = pat.search(s)
        if not m: return s
        pre, inner = m.group(1), m.group(2)
        items = [x.strip().split(" ")[0] for x in inner.split(",")]
        rep = " ".join(pre if x == "self" else pre + "::" + x for x in items if x)
        s = s[:m.start()] + " " + rep + " " + s[m.end():]
def strip_tests(text):
    out, skip, pend = [], False, False
    for line in text.split("\n"):
        if skip:
            if line.startswith("}"): skip = False
            continue
        if pend:
            pend = False
            if re.match(r'^(pub(\([a-z]+\))? )?mod [a-z_]+ \{', line): skip = True; continue
        if re.match(r'^#\[cfg\((all\()?test[,)]', line): pend = True; continue
        if re.match(r'^\s*//', line): continue
        out.append(line)
    return "\n".join(out)
def resolve(me, segs):
    # longest prefix that is a module file
    for n in range(len(segs), -1, -1):
        if tuple(segs[:n]) in mods: return mods[tuple(segs[:n])]
    return None
graph = {}
for m, f in mods.items():
    text = flatten(strip_tests(open(f).read()))
    deps = set()
    is_dir = os.path.basename(f) in ("mod.rs", "lib.rs", "main.rs")
    for p in re.findall(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
        segs = p.split("::")
        if segs[0] == "crate": base = []; segs = segs[1:]
        else:
            base = list(m) if is_dir else list(m)
            # self:: is this module; super:: its parent
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super": base = base[:-1]
                segs = segs[1:]
        t = resolve(m, base + segs)
        if t and t != f:
            # a file naming its own folder's mod.rs (super::Thing) is the folder's face, not a
            # sibling: not counted (as the structure tool does)
            if os.path.basename(t) == "mod.rs" and f.startswith(os.path.dirname(t) + os.sep):
                continue
            deps.add(t)
    graph[f] = deps
# Tarjan
idx, low, st, on, comps, c = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in graph[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        comps.append(comp)
for v in graph:
    if v not in idx: sc(v)
cyc = sorted([x for x in comps if len(x) > 1], key=len, reverse=True)
print(f"files {len(graph)}, arrows {sum(len(d) for d in graph.values())}, circles {len(cyc)}, largest {len(cyc[0]) if cyc else 0}")
for x in cyc: print(len(x), sorted(x))
sys.exit(1 if cyc else 0)
