"""A NIXL agent in a child process, driven over its stdin and stdout: one JSON command a line
in, one reply a line out (`@@ {json}`; other output, such as NIXL's logging, passes by). The
child's stderr goes to a file (NIXL logs there; a full pipe would stall the agent). Shared by
tests/two_agents.py and bench.py, which run their own file with `--child ...` as the child.

A reply with a `failed` key is an unexpected failure of the child: the call raises it, with
the end of the child's stderr.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile


def nixl_api():
    """NIXL's Python API: the `nixl` package where installed, else the `nixl_cu12` wheel's."""
    try:
        from nixl import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl_cu12 import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


def hixl_plugin():
    """libplugin_HIXL.so as a ctypes library: the copy NIXL loaded (the same file opens as the
    same library), beside the plugins of the wheel NIXL's Python API came from. Its
    hixl_nixl_alloc / hixl_nixl_free give engine memory (docs/nixl.md)."""
    import ctypes
    import importlib.util

    for name in ("nixl_cu12", "nixl_cu13"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin:
            site = os.path.dirname(os.path.dirname(spec.origin))
            path = os.path.join(site, f".{name}.mesonpy.libs", "plugins", "libplugin_HIXL.so")
            if os.path.exists(path):
                lib = ctypes.CDLL(path)
                lib.hixl_nixl_alloc.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                                ctypes.POINTER(ctypes.c_void_p)]
                lib.hixl_nixl_free.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
                return lib
    raise RuntimeError("no libplugin_HIXL.so beside a NIXL wheel's plugins (hixl-nixl/install.sh)")


def commands():
    """The child's side: the commands, one dict each."""
    for line in sys.stdin:
        yield json.loads(line)


def reply(**kw):
    """The child's side: answers the command being run."""
    sys.stdout.write("@@ " + json.dumps(kw) + "\n")
    sys.stdout.flush()


class PeerFailed(RuntimeError):
    pass


class Peer:
    def __init__(self, script, args, role, env=None):
        self.role = role
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(script), "--child", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def __call__(self, op, **kw):
        kw["op"] = op
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        for line in self.p.stdout:
            if line.startswith("@@ "):
                r = json.loads(line[3:])
                if "failed" in r:
                    raise PeerFailed(f"{self.role}: {op}: {r['failed']}\n--- its stderr:\n"
                                     f"{self.stderr()[-4000:]}")
                return r
        raise PeerFailed(f"{self.role}: it ended during {op}\n--- its stderr:\n"
                         f"{self.stderr()[-4000:]}")

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def close(self):
        """Says bye (the child releases what it holds), then waits; killed if it hangs."""
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGCONT)
                self("bye")
            except (PeerFailed, OSError):
                pass
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
