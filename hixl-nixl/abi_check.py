#!/usr/bin/env python3
"""Checks libplugin_HIXL.so's engine against the NIXL wheel installed beside it: the engine's
vtable must list, slot by slot, the same functions (name and parameter types, demangled) as an
engine the wheel ships (nixlPosixEngine in libplugin_POSIX.so, whose symbol table is kept), and
the plugin's exported C entry points must be NIXL's two and hixl's two.

    python3 hixl-nixl/abi_check.py PLUGIN.so WHEEL_PLUGIN_DIR

Needs nm, readelf and c++filt (binutils). Exits 1 naming the first slot that differs.
"""
import re
import subprocess
import sys


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def vtable(lib, name_re):
    """The functions of the vtable whose symbol matches name_re, in slot order (the offset-to-top
    and typeinfo words left out), each as 'method(params) const?' without its class."""
    syms = {}
    table = None
    for line in run("nm", "-S", lib).splitlines():
        p = line.split()
        if len(p) == 4 and re.fullmatch(name_re, p[3]):
            table = (int(p[0], 16), int(p[1], 16), p[3])
        if len(p) >= 3:
            try:
                syms.setdefault(int(p[0], 16), p[-1])
            except ValueError:
                pass
    if table is None:
        sys.exit(f"abi_check: no vtable matching {name_re} in {lib}")
    addr, size, sym = table
    relocs = {}
    for line in run("readelf", "-rW", lib).splitlines():
        p = line.split()
        if len(p) >= 4 and re.fullmatch(r"[0-9a-f]{16}", p[0]):
            off = int(p[0], 16)
            if p[2] == "R_X86_64_RELATIVE":
                relocs[off] = syms.get(int(p[3], 16), p[3])
            elif len(p) >= 5:
                relocs[off] = p[4].split("@")[0]
    names = [relocs.get(addr + 8 * i, "") for i in range(2, size // 8)]
    demangled = run("c++filt", *names).splitlines() if names else []
    out = []
    for d in demangled:
        # strip the class ("ns::Class::method(...)" -> "method(...)"), at the last "::" before "("
        head, paren, tail = d.partition("(")
        out.append(head.rsplit("::", 1)[-1] + paren + tail)
    return sym, out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plugin, wheel_dir = sys.argv[1], sys.argv[2]
    _, ours = vtable(plugin, r"_ZTVN9hixl_nixl14nixlHixlEngineE")
    _, theirs = vtable(f"{wheel_dir}/libplugin_POSIX.so", r"_ZTV15nixlPosixEngine")
    if len(ours) != len(theirs):
        sys.exit(f"abi_check: {len(ours)} vtable slots, the wheel's engine has {len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        # the destructors are named after their classes
        if a.startswith("~") and b.startswith("~"):
            continue
        if a != b:
            sys.exit(f"abi_check: slot {i}: ours {a!r}, the wheel's {b!r}")
    # the C functions it exports: NIXL's two, and hixl's own two (engine-allocated memory)
    exported = sorted(
        l.split()[-1] for l in run("nm", "-D", "--defined-only", plugin).splitlines()
        if " T " in l and ("nixl_plugin" in l or "hixl_nixl_" in l)
    )
    want = ["hixl_nixl_alloc", "hixl_nixl_free", "nixl_plugin_fini", "nixl_plugin_init"]
    if exported != want:
        sys.exit(f"abi_check: exported C entry points {exported}, expected {want}")
    print(f"abi_check: {len(ours)} vtable slots match the wheel's nixlPosixEngine; "
          "nixl_plugin_init and nixl_plugin_fini exported")


if __name__ == "__main__":
    main()
