"""Stand-in `torch.distributed` (test fixture): a process group over TCP. Rank 0 listens on
MASTER_ADDR:MASTER_PORT (or `init_method="tcp://ip:port"`); the other ranks connect (retrying
until `timeout`); `barrier()` is one message from each rank to rank 0 and one back."""
import datetime
import os
import socket
import time

_group = None


class _Group:
    def __init__(self, rank, world_size, addr, port, timeout):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.peers = []
        if world_size == 1:
            return
        if rank == 0:
            srv = socket.create_server((addr, port), reuse_port=False)
            srv.settimeout(timeout)
            seen = {}
            while len(seen) < world_size - 1:
                c, _ = srv.accept()
                c.settimeout(timeout)
                r = int(self._recv(c))
                seen[r] = c
            srv.close()
            self.peers = [seen[r] for r in sorted(seen)]
            for c in self.peers:
                c.sendall(b"ready\n")
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    c = socket.create_connection((addr, port), timeout=timeout)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"cannot reach the process group's rank 0 at {addr}:{port}")
                    time.sleep(0.05)
            c.settimeout(timeout)
            c.sendall(f"{rank}\n".encode())
            if self._recv(c) != "ready":
                raise RuntimeError("process group: bad answer from rank 0")
            self.peers = [c]

    @staticmethod
    def _recv(c):
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = c.recv(1)
            if not chunk:
                raise RuntimeError("process group: a peer closed its connection")
            buf += chunk
        return buf[:-1].decode()

    def barrier(self):
        if self.world_size == 1:
            return
        if self.rank == 0:
            for c in self.peers:
                if self._recv(c) != "barrier":
                    raise RuntimeError("process group: out of step")
            for c in self.peers:
                c.sendall(b"go\n")
        else:
            self.peers[0].sendall(b"barrier\n")
            if self._recv(self.peers[0]) != "go":
                raise RuntimeError("process group: out of step")

    def close(self):
        for c in self.peers:
            c.close()
        self.peers = []


def is_available():
    return True


def is_initialized():
    return _group is not None


def init_process_group(backend="gloo", init_method=None, timeout=None, world_size=-1, rank=-1, **kwargs):
    global _group
    if init_method and init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rpartition(":")
    else:
        host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "29500")
    if world_size < 0:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if rank < 0:
        rank = int(os.environ.get("RANK", "0"))
    t = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else (timeout or 1800)
    _group = _Group(rank, world_size, host, int(port), t)


def barrier(group=None, **kwargs):
    if _group is None:
        raise RuntimeError("Default process group has not been initialized")
    _group.barrier()


def get_rank(group=None):
    return _group.rank if _group else 0


def get_world_size(group=None):
    return _group.world_size if _group else 1


def destroy_process_group(group=None):
    global _group
    if _group is not None:
        _group.close()
        _group = None
