#!/usr/bin/env python3
"""Mooncake Store over the ascend transport on hixl: mooncake_master and two store clients.

The wheel's own mooncake_master (with its HTTP metadata server) runs as a child; two store
clients (MooncakeDistributedStore.setup(..., protocol="ascend")), each a process on its own
device, each contributing a global segment: the first puts random data from its device memory
(aclrtMalloc, register_buffer, put_from and batch_put_from), the second gets it into its device
memory (get_into, batch_get_into) and into host memory, and compares. Run as mooncake_te.py is
(hixl's release libraries and the test double on LD_LIBRARY_PATH):

    LD_LIBRARY_PATH=DIR:<hixl>/target/release python3 tests/mooncake/mooncake_store.py

Prints what each step returned and PASS at the end; any failure raises.
"""

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mooncake_te import Acl  # noqa: E402

SIZE = 4 << 20
PIECE = 1 << 20
SEGMENT = 64 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(role, device, metadata, master, keys_file):
    acl = Acl()
    acl.set_device(device)
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(f"127.0.0.1:{free_port()}", metadata, SEGMENT, 16 << 20, "ascend", "", master)
    print(f"{role}: setup rc={rc}", flush=True)
    assert rc == 0
    dev = acl.malloc(SIZE)
    rc = store.register_buffer(dev, SIZE)
    print(f"{role}: register_buffer(device) rc={rc}", flush=True)
    assert rc == 0
    if role == "put":
        data = os.urandom(SIZE)
        acl.write(dev, data)
        rc = store.put_from("k0", dev, PIECE)
        print(f"put: put_from(k0, device, 1 MiB) rc={rc}", flush=True)
        assert rc == 0
        rcs = store.batch_put_from(["k1", "k2", "k3"], [dev + i * PIECE for i in (1, 2, 3)], [PIECE] * 3)
        print(f"put: batch_put_from(k1..k3) rc={rcs}", flush=True)
        assert list(rcs) == [0, 0, 0]
        with open(keys_file, "w") as f:
            f.write(" ".join(hashlib.sha256(data[i * PIECE:(i + 1) * PIECE]).hexdigest() for i in range(4)))
        print("put: PASS", flush=True)
        sys.stdin.readline()  # stays up (its segment may hold replicas) until told
    else:
        want = open(keys_file).read().split()
        n = store.get_into("k0", dev, PIECE)
        print(f"get: get_into(k0, device) -> {n}", flush=True)
        assert n == PIECE
        ns = store.batch_get_into(["k1", "k2", "k3"], [dev + i * PIECE for i in (1, 2, 3)], [PIECE] * 3)
        print(f"get: batch_get_into(k1..k3, device) -> {list(ns)}", flush=True)
        assert list(ns) == [PIECE] * 3
        got = acl.read(dev, SIZE)
        ok = all(hashlib.sha256(got[i * PIECE:(i + 1) * PIECE]).hexdigest() == want[i] for i in range(4))
        print(f"get: device bytes equal the put's: {ok}", flush=True)
        assert ok
        import ctypes

        host = ctypes.create_string_buffer(PIECE)
        rc = store.register_buffer(ctypes.addressof(host), PIECE)
        n = store.get_into("k2", ctypes.addressof(host), PIECE)
        ok = n == PIECE and hashlib.sha256(host.raw).hexdigest() == want[2]
        print(f"get: get_into(k2, host) -> {n}, bytes equal: {ok}", flush=True)
        assert rc == 0 and ok
        print(f"get: is_exist(k3)={store.is_exist('k3')} is_exist(nope)={store.is_exist('nope')}", flush=True)
        rounds = int(os.environ.get("MOONCAKE_STORE_ROUNDS", "0"))
        if rounds > 0:  # by hand: the get path's rate, and memmove of the same bytes in this process
            keys4, addrs, lens = ["k0", "k1", "k2", "k3"], [dev + i * PIECE for i in range(4)], [PIECE] * 4
            t = time.perf_counter()
            for _ in range(rounds):
                assert list(store.batch_get_into(keys4, addrs, lens)) == lens
            got_s = time.perf_counter() - t
            src, dst = ctypes.create_string_buffer(SIZE), ctypes.create_string_buffer(SIZE)
            t = time.perf_counter()
            for _ in range(rounds):
                ctypes.memmove(dst, src, SIZE)
            copy_s = time.perf_counter() - t
            print(f"get: batch_get_into 4 x 1 MiB into device memory, {rounds} rounds: "
                  f"{rounds * SIZE / got_s / 1e9:.2f} GB/s ({got_s / rounds * 1e6:.0f} us a batch); "
                  f"memmove of 4 MiB here: {rounds * SIZE / copy_s / 1e9:.2f} GB/s", flush=True)
        print("get: PASS", flush=True)
    store.close()


def main():
    import mooncake

    mc = os.path.dirname(mooncake.__file__)
    http, rpc, metrics = free_port(), free_port(), free_port()
    master = subprocess.Popen([os.path.join(mc, "mooncake_master"), "--enable_http_metadata_server=true",
                               f"--http_metadata_server_port={http}", f"--rpc_port={rpc}",
                               f"--metrics_port={metrics}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "GLOG_minloglevel": "0", "GLOG_logtostderr": "1"})
    keys = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"mooncake-store-keys-{os.getpid()}")
    meta, addr = f"http://127.0.0.1:{http}/metadata", f"127.0.0.1:{rpc}"
    try:
        # the master logs each service as it starts: both up before any client
        seen = set()
        for line in master.stderr:
            if "Master service started" in line:
                seen.add("rpc")
            if "HTTP metadata server started successfully" in line:
                seen.add("http")
            if seen == {"rpc", "http"}:
                break
        else:
            raise SystemExit("mooncake_master ended before it started")
        threading.Thread(target=lambda: [None for _ in master.stderr], daemon=True).start()
        put = subprocess.Popen([sys.executable, __file__, "put", "1", meta, addr, keys],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for line in put.stdout:
            print(line, end="", flush=True)
            if line.startswith("put: PASS"):
                break
        get = subprocess.run([sys.executable, __file__, "get", "2", meta, addr, keys], check=False)
        put.stdin.write("\n")
        put.stdin.flush()
        put.wait(timeout=60)
        if get.returncode != 0:
            raise SystemExit("the get client failed")
        print("PASS")
    finally:
        master.terminate()
        master.wait()
        if os.path.exists(keys):
            os.remove(keys)


if __name__ == "__main__":
    if len(sys.argv) == 6:
        client(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        main()
