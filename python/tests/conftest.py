"""Helpers of the hixl Python tests: peer processes on ephemeral ports, deadlines, buffers."""
import json
import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest

import hixl

HERE = os.path.dirname(os.path.abspath(__file__))


class Peer:
    """A peer process (peer.py): a listening engine with one buffer of seeded random bytes, in
    its own memory (`memory="caller"`) or the engine's (`"engine"`: `Engine.alloc`)."""

    def __init__(self, size, seed, local="127.0.0.1:0", start_timeout=60.0, memory="caller"):
        self.size, self.seed = size, seed
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer.py"), str(size), str(seed), local, memory],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        info = json.loads(self._line(start_timeout))
        self.name, self.addr, self.len = info["name"], info["addr"], info["len"]

    def initial(self):
        """The bytes the peer's buffer started with."""
        return np.random.default_rng(self.seed).integers(0, 256, self.size, dtype=np.uint8)

    def _line(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TimeoutError("the peer did not answer in time")
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if r:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the peer exited ({self.proc.wait()})")
                return line.strip()

    def cmd(self, line, timeout=60.0):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def buffer(self, tmp_path):
        """The peer's whole buffer now, byte for byte."""
        path = os.path.join(str(tmp_path), f"peer-{self.proc.pid}-{time.monotonic_ns()}.bin")
        assert self.cmd(f"dump {path}") == "ok"
        data = np.fromfile(path, dtype=np.uint8)
        os.unlink(path)
        return data

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.cmd("quit", timeout=30)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def peer_factory():
    peers = []

    def make(size=1 << 20, seed=1, local="127.0.0.1:0", memory="caller"):
        p = Peer(size, seed, local, memory=memory)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()


@pytest.fixture
def client():
    """A client engine (flat API) with AutoConnect off."""
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1", {}) == hixl.SUCCESS
    yield h
    h.finalize()


def poll_until(pred, timeout, what):
    """Poll `pred` (fast, then backing off) until it is true or the deadline passes."""
    deadline = time.monotonic() + timeout
    pause = 0.0001
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
