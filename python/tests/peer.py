"""A peer process for the two-process tests: a listening engine with one registered numpy
buffer of random bytes, driven by line commands on stdin (one reply line each on stdout).

usage: python peer.py SIZE SEED [LOCAL_ENGINE [MEMORY]]
MEMORY: `caller` (a numpy buffer, registered; the default) or `engine` (Engine.alloc)
first line out: {"name": ..., "addr": ..., "len": ...}
commands: dump PATH | wait_notify NAME OFF LEN TIMEOUT_S | notifies | quit
"""
import hashlib
import json
import sys
import time

import numpy as np

import hixl

size, seed = int(sys.argv[1]), int(sys.argv[2])
local = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1:0"
memory = sys.argv[4] if len(sys.argv) > 4 else "caller"
data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
if memory == "engine":
    engine = hixl.Engine(local)
    h = engine.hixl
    buf = engine.alloc(size).numpy()
    buf[:] = data
else:
    buf = data
    h = hixl.Hixl()
    ret = h.initialize(local, {})
    assert ret == hixl.SUCCESS, (ret, hixl.last_error_message())
    ret, handle = h.register_mem(hixl.MemDesc(buf.ctypes.data, buf.nbytes), hixl.MEM_HOST)
    assert ret == hixl.SUCCESS, ret
ret, name = h.local_engine()
print(json.dumps({"name": name, "addr": buf.ctypes.data, "len": buf.nbytes}), flush=True)

pending = []
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "dump":
        buf.tofile(cmd[1])
        print("ok", flush=True)
    elif cmd[0] == "wait_notify":
        name, off, ln, timeout = cmd[1], int(cmd[2]), int(cmd[3]), float(cmd[4])
        deadline = time.monotonic() + timeout
        found = None
        while found is None and time.monotonic() < deadline:
            ret, got = h.get_notifies()
            pending += [(n.name, n.notify_msg) for n in got]
            for i, n in enumerate(pending):
                if n[0] == name:
                    found = pending.pop(i)
                    break
            else:
                time.sleep(0.0005)
        if found is None:
            print("timeout", flush=True)
        else:
            # the data as it is the moment the notification is seen
            digest = hashlib.sha256(buf[off : off + ln].tobytes()).hexdigest()
            print(json.dumps({"msg": found[1], "sha": digest}), flush=True)
    elif cmd[0] == "notifies":
        ret, got = h.get_notifies()
        pending += [(n.name, n.notify_msg) for n in got]
        print(json.dumps(pending), flush=True)
        pending = []
    elif cmd[0] == "quit":
        break
h.finalize()
print("bye", flush=True)
