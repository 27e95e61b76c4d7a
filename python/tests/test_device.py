"""Device memory as a CANN program moves it: with CANN's libraries on the loader path (here the
ACL/HCCL test double, built by tools/ascend-double.sh under CANN's names), ``hixl`` registers
``MEM_DEVICE`` memory and moves it over HCCL with no hixl option, on the device
``aclrtSetDevice`` chose on the thread that called ``initialize``.

Each case runs in a fresh interpreter whose ``LD_LIBRARY_PATH`` names the double (the loader path
is read at startup), as a CANN user's ``set_env.sh`` would set it."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "ascend-double.sh"


@pytest.fixture(scope="module")
def cann(tmp_path_factory):
    if shutil.which("cc") is None:
        print("SKIPPED: no C compiler (cc) to build the ACL/HCCL test double")
        pytest.skip("no C compiler (cc) to build the ACL/HCCL test double")
    if not SCRIPT.exists():
        print(f"SKIPPED: {SCRIPT} not found (the tests run from the repository)")
        pytest.skip("tools/ascend-double.sh not found")
    d = tmp_path_factory.mktemp("cann")
    subprocess.run(["bash", str(SCRIPT), str(d)], check=True, capture_output=True)
    return d


def run(cann, tmp_path, body):
    """Runs `body` in a fresh interpreter with the double on the loader path; returns the
    double's log lines."""
    log = tmp_path / "double.log"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(cann)
    env["HIXL_ASCEND_DOUBLE_LOG"] = str(log)
    env["TMPDIR"] = str(tmp_path)  # the double's announce directory: private to this test
    prelude = textwrap.dedent(
        """
        import ctypes, threading
        import numpy as np
        import hixl
        acl = ctypes.CDLL("libacl_rt.so")
        def set_device(d):
            assert acl.aclrtSetDevice(ctypes.c_int32(d)) == 0
        def get_device():
            d = ctypes.c_int32(-1)
            return d.value if acl.aclrtGetDevice(ctypes.byref(d)) == 0 else None
        def dev_alloc(data):
            p = ctypes.c_void_p()
            assert acl.aclrtMalloc(ctypes.byref(p), ctypes.c_size_t(data.nbytes), 1) == 0
            assert acl.aclrtMemcpy(p, ctypes.c_size_t(data.nbytes), data.ctypes.data_as(ctypes.c_void_p),
                                   ctypes.c_size_t(data.nbytes), 1) == 0
            return p.value
        def dev_read(addr, n):
            out = np.zeros(n, np.uint8)
            assert acl.aclrtMemcpy(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(n),
                                   ctypes.c_void_p(addr), ctypes.c_size_t(n), 2) == 0
            return out
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_device_memory_moves_over_hccl_by_default(cann, tmp_path):
    log = run(
        cann,
        tmp_path,
        """
        N = 1 << 20
        rng = np.random.default_rng(7)
        seeded = rng.integers(0, 256, N, dtype=np.uint8)
        s, c = hixl.Hixl(), hixl.Hixl()
        srv = {}
        def server():
            set_device(2)
            assert s.initialize("127.0.0.1:0") == hixl.SUCCESS
            srv["dev"] = dev_alloc(seeded)
            ret, srv["h"] = s.register_mem(hixl.MemDesc(srv["dev"], N), hixl.MEM_DEVICE)
            assert ret == hixl.SUCCESS, ret
        t = threading.Thread(target=server); t.start(); t.join()
        name = s.local_engine()[1]
        set_device(0)
        assert c.initialize("127.0.0.1") == hixl.SUCCESS
        cdev = dev_alloc(np.zeros(N, np.uint8))
        assert c.register_mem(hixl.MemDesc(cdev, N), hixl.MEM_DEVICE)[0] == hixl.SUCCESS
        assert c.connect(name, 5000) == hixl.SUCCESS
        op = hixl.TransferOpDesc(cdev, srv["dev"], N)
        assert c.transfer_sync(name, hixl.READ, [op], 5000) == hixl.SUCCESS
        assert np.array_equal(dev_read(cdev, N), seeded)
        # device memory registered while linked: usable at once on the existing link
        fresh = rng.integers(0, 256, 4096, dtype=np.uint8)
        extra = dev_alloc(fresh)
        assert c.register_mem(hixl.MemDesc(extra, 4096), hixl.MEM_DEVICE)[0] == hixl.SUCCESS
        w = hixl.TransferOpDesc(extra, srv["dev"] + 8192, 4096)
        assert c.transfer_sync(name, hixl.WRITE, [w], 5000) == hixl.SUCCESS
        assert np.array_equal(dev_read(srv["dev"] + 8192, 4096), fresh)
        # the server goes away while linked; the client's disconnect succeeds (HIXL's semantics)
        assert s.deregister_mem(srv["h"]) == hixl.SUCCESS
        s.finalize()
        assert c.disconnect(name) == hixl.SUCCESS
        c.finalize()
        print("OK")
        """,
    )
    calls = [line.split(" ", 1)[0] for line in log]
    assert "HcclBatchGet" in calls and "HcclBatchPut" in calls, calls
    assert "aclInit" not in calls, "hixl called aclInit although the program set its device"


def test_host_memory_as_mem_device_without_a_device_set(cann, tmp_path):
    """CANN's own suite registers host memory as MEM_DEVICE on an engine initialized on a thread
    with no device: device 0 is taken (torch_npu's convention), and HCCL accepts the range."""
    run(
        cann,
        tmp_path,
        """
        assert get_device() is None
        e = hixl.Hixl()
        assert e.initialize("127.0.0.1:0", {hixl.OPTION_AUTO_CONNECT: "1"}) == hixl.SUCCESS
        assert get_device() == 0
        buf = ctypes.create_string_buffer(4096)
        ret, h = e.register_mem(hixl.MemDesc(ctypes.addressof(buf), 4096), hixl.MEM_DEVICE)
        assert ret == hixl.SUCCESS and h != 0, ret
        assert e.deregister_mem(h) == hixl.SUCCESS
        e.finalize()
        print("OK")
        """,
    )
