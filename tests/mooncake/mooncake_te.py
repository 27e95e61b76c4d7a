#!/usr/bin/env python3
"""Mooncake's NPU wheel on hixl: its TransferEngine with protocol "ascend" between two processes.

mooncake.engine.TransferEngine (PyPI mooncake-transfer-engine-npu, the wheel as published)
reaches HIXL through ADXL: its ascend_transport.so links adxl::AdxlEngine from
libllm_datadist.so, CANN's libascendcl.so and libmetadef.so. Run with hixl's libraries
(libllm_datadist.so, libcann_hixl.so) and the ACL/HCCL test double (tools/ascend-double.sh DIR,
which also gives libmetadef.so) on LD_LIBRARY_PATH, and nothing else:

    LD_LIBRARY_PATH=DIR:<hixl>/target/release python3 tests/mooncake/mooncake_te.py

This process is the initiator (device 0); it starts a target process (device 1) running this
file with `target`. Each side registers 1 MiB of host memory and 1 MiB of device memory
(aclrtMalloc) with its engine. The initiator then moves random data in every direction of host
and device memory, with batch_transfer_sync_write/_read (four pieces) and
transfer_sync_write/_read (one piece), and checks the bytes at both ends (the target reports the
SHA-256 of its ranges); a transfer past the end of the target's registered memory must be
refused with nothing written on either side. Prints PASS at the end; any failure raises.
"""

import ctypes
import hashlib
import os
import subprocess
import sys

REGION = 1 << 20
PIECE = 64 << 10
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2


class Acl:
    """The few ACL calls this program makes itself (CANN's libascendcl.so, here the double)."""

    def __init__(self):
        lib = ctypes.CDLL("libascendcl.so", mode=ctypes.RTLD_GLOBAL)
        lib.aclrtSetDevice.argtypes = [ctypes.c_int32]
        lib.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
        lib.aclrtMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_int]
        lib.aclrtFree.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def check(self, what, rc):
        if rc != 0:
            raise RuntimeError(f"{what}: ACL error {rc}")

    def set_device(self, device):
        self.check("aclrtSetDevice", self.lib.aclrtSetDevice(device))

    def malloc(self, size):
        p = ctypes.c_void_p()
        self.check("aclrtMalloc", self.lib.aclrtMalloc(ctypes.byref(p), size, 0))
        return p.value

    def free(self, p):
        self.check("aclrtFree", self.lib.aclrtFree(p))

    def write(self, dev, data):
        buf = ctypes.create_string_buffer(data, len(data))
        self.check("aclrtMemcpy H2D",
                   self.lib.aclrtMemcpy(dev, len(data), buf, len(data), ACL_MEMCPY_HOST_TO_DEVICE))

    def read(self, dev, n):
        buf = ctypes.create_string_buffer(n)
        self.check("aclrtMemcpy D2H", self.lib.aclrtMemcpy(buf, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST))
        return buf.raw


class Side:
    """One process's engine and its two registered regions: host and device memory."""

    def __init__(self, device):
        self.acl = Acl()
        self.acl.set_device(device)  # Mooncake's ascend transport takes the thread's device
        from mooncake.engine import TransferEngine  # after ACL: the wheel loads it too

        self.engine = TransferEngine()
        rc = self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend", "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize: {rc}")
        self.name = f"127.0.0.1:{self.engine.get_rpc_port()}"
        self.host_buf = ctypes.create_string_buffer(REGION)
        self.addr = {"host": ctypes.addressof(self.host_buf), "dev": self.acl.malloc(REGION)}
        for kind, addr in self.addr.items():
            rc = self.engine.register_memory(addr, REGION)
            if rc != 0:
                raise RuntimeError(f"register_memory({kind}): {rc}")

    def put(self, kind, off, data):
        if kind == "host":
            ctypes.memmove(self.addr["host"] + off, data, len(data))
        else:
            self.acl.write(self.addr["dev"] + off, data)

    def get(self, kind, off, n):
        if kind == "host":
            return ctypes.string_at(self.addr["host"] + off, n)
        return self.acl.read(self.addr["dev"] + off, n)

    def close(self):
        for addr in self.addr.values():
            self.engine.unregister_memory(addr)
        self.acl.free(self.addr["dev"])


def digest(data):
    return hashlib.sha256(data).hexdigest()


def target():
    side = Side(1)
    print(f"READY {side.name} {side.addr['host']} {side.addr['dev']}", flush=True)
    for line in sys.stdin:
        w = line.split()
        if w[0] == "sum":  # sum KIND OFF LEN: the SHA-256 of that range
            print(digest(side.get(w[1], int(w[2]), int(w[3]))), flush=True)
        elif w[0] == "fill":  # fill KIND OFF LEN: random bytes there, and their SHA-256
            data = os.urandom(int(w[3]))
            side.put(w[1], int(w[2]), data)
            print(digest(data), flush=True)
        elif w[0] == "quit":
            side.close()
            print("BYE", flush=True)
            return


class Target:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "target"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        w = self.proc.stdout.readline().split()
        if not w or w[0] != "READY":
            raise RuntimeError(f"the target said {w!r}")
        self.name = w[1]
        self.addr = {"host": int(w[2]), "dev": int(w[3])}

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def quit(self):
        said = self.ask("quit")
        if said != "BYE" or self.proc.wait() != 0:
            raise RuntimeError(f"the target did not end cleanly: {said!r}")


def expect(ok, what):
    if not ok:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def initiator():
    me = Side(0)
    peer = Target()
    e = me.engine
    kinds = ("host", "dev")
    for lk in kinds:
        for rk in kinds:
            tag = f"{lk}->{rk}"
            offs = [i * PIECE for i in range(4)]
            # batch WRITE: four random pieces of local memory into the target's
            data = [os.urandom(PIECE) for _ in offs]
            for off, d in zip(offs, data):
                me.put(lk, off, d)
            remote = [peer.addr[rk] + 8 * PIECE + off for off in offs]
            rc = e.batch_transfer_sync_write(peer.name, [me.addr[lk] + o for o in offs], remote, [PIECE] * 4)
            expect(rc == 0, f"{tag} batch_transfer_sync_write rc={rc}")
            expect(all(peer.ask(f"sum {rk} {8 * PIECE + off} {PIECE}") == digest(d) for off, d in zip(offs, data)),
                   f"{tag} batch WRITE: the target holds the bytes written")
            # batch READ: the target fills four pieces, read into local memory
            sums = [peer.ask(f"fill {rk} {12 * PIECE + off} {PIECE}") for off in offs]
            rc = e.batch_transfer_sync_read(peer.name, [me.addr[lk] + 4 * PIECE + o for o in offs],
                                            [peer.addr[rk] + 12 * PIECE + o for o in offs], [PIECE] * 4)
            expect(rc == 0, f"{tag} batch_transfer_sync_read rc={rc}")
            expect(all(digest(me.get(lk, 4 * PIECE + off, PIECE)) == s for off, s in zip(offs, sums)),
                   f"{tag} batch READ: the bytes read are the target's")
            # single WRITE and READ
            d = os.urandom(PIECE)
            me.put(lk, 0, d)
            rc = e.transfer_sync_write(peer.name, me.addr[lk], peer.addr[rk], PIECE)
            expect(rc == 0 and peer.ask(f"sum {rk} 0 {PIECE}") == digest(d), f"{tag} transfer_sync_write rc={rc}")
            s = peer.ask(f"fill {rk} {PIECE} {PIECE}")
            rc = e.transfer_sync_read(peer.name, me.addr[lk] + PIECE, peer.addr[rk] + PIECE, PIECE)
            expect(rc == 0 and digest(me.get(lk, PIECE, PIECE)) == s, f"{tag} transfer_sync_read rc={rc}")
    # past the end of the target's registered memory: refused, and nothing written either side
    for rk in kinds:
        before = peer.ask(f"sum {rk} 0 {REGION}")
        me.put("host", 0, os.urandom(2 * PIECE))
        local_before = digest(me.get("host", 0, 2 * PIECE))
        past = peer.addr[rk] + REGION - PIECE // 2
        rc = e.transfer_sync_write(peer.name, me.addr["host"], past, PIECE)
        expect(rc != 0, f"WRITE past the end of the target's {rk} memory refused (rc={rc})")
        rc = e.transfer_sync_read(peer.name, me.addr["host"], past, PIECE)
        expect(rc != 0, f"READ past the end of the target's {rk} memory refused (rc={rc})")
        expect(peer.ask(f"sum {rk} 0 {REGION}") == before, f"the target's {rk} memory is unchanged")
        expect(digest(me.get("host", 0, 2 * PIECE)) == local_before, "the local memory is unchanged")
    peer.quit()
    me.close()
    print("PASS", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "target":
        target()
    else:
        initiator()
