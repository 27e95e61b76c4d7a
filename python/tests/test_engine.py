"""The Pythonic layer: hixl.Engine, Region, Link, Request, the exceptions."""
import asyncio
import ctypes
import gc
import weakref

import numpy as np
import pytest

import hixl
from conftest import poll_until


@pytest.fixture
def engines():
    with hixl.Engine("127.0.0.1:0") as server, hixl.Engine("127.0.0.1", auto_connect=True) as client:
        yield server, client


def test_exceptions_carry_the_status():
    assert issubclass(hixl.ParamInvalidError, hixl.HixlError)
    assert issubclass(hixl.ParamInvalidError, ValueError)
    assert issubclass(hixl.HixlTimeoutError, TimeoutError)
    assert issubclass(hixl.NotConnectedError, ConnectionError)
    for cls, status in [
        (hixl.ParamInvalidError, hixl.PARAM_INVALID),
        (hixl.HixlTimeoutError, hixl.TIMEOUT),
        (hixl.NotConnectedError, hixl.NOT_CONNECTED),
        (hixl.AlreadyConnectedError, hixl.ALREADY_CONNECTED),
        (hixl.NotifyFailedError, hixl.NOTIFY_FAILED),
        (hixl.UnsupportedError, hixl.UNSUPPORTED),
        (hixl.ResourceExhaustedError, hixl.RESOURCE_EXHAUSTED),
        (hixl.FailedError, hixl.FAILED),
    ]:
        assert issubclass(cls, hixl.HixlError)
        assert hixl._engine._ERRORS[status] is cls
    with pytest.raises(hixl.ParamInvalidError) as e:
        hixl.Engine("not an address")
    assert e.value.status == hixl.PARAM_INVALID and e.value.message


def test_register_kinds_and_transfer(engines):
    server, client = engines
    dst = bytearray(8192)
    mv_backing = bytearray(8192)
    src = np.arange(2048, dtype=np.uint32).reshape(32, 64)  # 2-D, 8 KiB
    rd = server.register(dst)
    rm = server.register(memoryview(mv_backing))
    rs = client.register(src)
    assert rs.nbytes == src.nbytes and rs.addr == src.ctypes.data
    link = client.link(server.name)
    link.write([(rs.addr + 1, rd.addr + 3, 1001), (rs.addr, rm.addr, 8192)])
    raw = src.tobytes()
    assert dst[3:1004] == raw[1:1002] and bytes(mv_backing) == raw
    # an (N, 3) numpy array of descriptors works too
    d = np.array([[rs.addr, rd.addr, 4096], [rs.addr + 4096, rd.addr + 4096, 4096]], dtype=np.uint64)
    link.write(d)
    assert bytes(dst) == raw
    # READ back into the client
    src[:] = 0
    link.read([(rs.addr, rd.addr, 8192)])
    assert src.tobytes() == raw


def test_register_keeps_the_object_alive(engines):
    server, _ = engines
    a = np.zeros(4096, np.uint8)
    ref = weakref.ref(a)
    region = server.register(a)
    del a
    gc.collect()
    assert ref() is not None and region.obj is ref()
    region.deregister()
    del region
    gc.collect()
    assert ref() is None


def test_registered_bytearray_cannot_be_resized(engines):
    server, _ = engines
    b = bytearray(4096)
    r = server.register(b)
    with pytest.raises(BufferError):
        b.extend(b"x")
    r.deregister()
    b.extend(b"x")  # released once deregistered


def test_register_refuses_what_it_cannot_hold(engines):
    server, _ = engines
    with pytest.raises(TypeError):
        server.register(b"immutable")
    with pytest.raises(TypeError):
        server.register(12345)
    with pytest.raises(TypeError):
        server.register(None)
    with pytest.raises(ValueError):
        server.register(bytearray())
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        server.register(ro)
    with pytest.raises(ValueError):
        server.register(np.zeros((16, 16), np.uint8)[:, ::2])  # not contiguous
    a = np.zeros(64, np.uint8)
    server.register(a)
    with pytest.raises(hixl.ParamInvalidError):
        server.register(a[8:16])  # overlaps a registered region


class FakeTensor:
    """Duck-typed torch tensor: data_ptr(), nbytes, device, is_contiguous()."""

    class _Dev:
        def __init__(self, t):
            self.type = t

    def __init__(self, n, device="cpu"):
        self._buf = (ctypes.c_char * n)()
        self.nbytes = n
        self.device = self._Dev(device)

    def data_ptr(self):
        return ctypes.addressof(self._buf)

    def is_contiguous(self):
        return True


def test_register_duck_typed_tensor(engines):
    server, client = engines
    t = FakeTensor(4096)
    r = server.register(t)
    assert r.addr == t.data_ptr() and r.nbytes == 4096 and r.obj is t
    src = np.full(4096, 7, np.uint8)
    rs = client.register(src)
    client.link(server.name).write([(rs.addr, r.addr, 4096)])
    assert bytes(t._buf) == b"\x07" * 4096
    with pytest.raises(hixl.UnsupportedError):
        server.register(FakeTensor(4096, device="npu"))  # device memory without Ascend


def test_errors_are_exceptions(engines):
    server, client = engines
    a, b = bytearray(4096), bytearray(4096)
    ra, rb = server.register(a), client.register(b)
    link = client.link(server.name)
    with pytest.raises(hixl.ParamInvalidError) as e:
        link.write([(rb.addr, 0x1000, 16)])  # bogus remote address
    assert e.value.status == hixl.PARAM_INVALID
    with pytest.raises(hixl.ParamInvalidError):
        link.write([(rb.addr, ra.addr, 4097)])  # past the region
    with pytest.raises(ValueError):
        link.write([(rb.addr, ra.addr, -1)])
    with pytest.raises(ValueError):
        link.write([(rb.addr, ra.addr, 2**64)])
    with pytest.raises(TypeError):
        link.write([(rb.addr, None, 1)])
    with pytest.raises(ValueError):
        link.write([])
    with pytest.raises(ValueError):
        link.write([(1, 2)])
    with pytest.raises(ValueError):
        link.transfer("sideways", [(rb.addr, ra.addr, 1)])
    with pytest.raises(ValueError):
        link.write([(rb.addr, ra.addr, 1)], timeout=0)
    with pytest.raises(ValueError):
        link.write(np.array([[rb.addr, ra.addr, -1]], dtype=np.int64))
    # registering while linked works, as in HIXL: usable on the existing link at once
    c = bytearray(b"\x5a" * 16)
    rc = client.register(c)
    link.write([(rc.addr, ra.addr + 100, 16)])
    assert bytes(a[100:116]) == bytes(c)
    with pytest.raises(hixl.NotConnectedError):
        hixl.Engine("127.0.0.1").link(server.name).write([(rb.addr, ra.addr, 1)])


def test_context_managers_and_close():
    e = hixl.Engine()
    b = bytearray(64)
    r = e.register(b)
    with e:
        pass
    e.close()  # twice is fine
    with pytest.raises(hixl.FailedError):
        e.register(bytearray(8))
    assert r._keep is None  # the buffer was released at close
    b.extend(b"x")
    with hixl.Engine() as s, hixl.Engine("127.0.0.1") as c:
        s.register(bytearray(64))
        with c.connect(s.name) as link:
            assert link.remote_regions()[0].len == 64
            with pytest.raises(hixl.AlreadyConnectedError):
                c.connect(s.name)
        # closed: not connected any more
        with pytest.raises(hixl.NotConnectedError):
            link.remote_regions()


def test_remote_regions_replace_shipped_addresses(peer_factory, tmp_path):
    """The peer's table arrives at connect: no base address shipped out of band."""
    peer = peer_factory(size=1 << 16, seed=21)
    with hixl.Engine("127.0.0.1") as e:
        local = np.zeros(1 << 16, np.uint8)
        r = e.register(local)
        link = e.connect(peer.name, timeout=5)
        (region,) = link.remote_regions()
        assert region[:5] == (peer.addr, 1 << 16, hixl.MEM_HOST, True, True)
        assert region.transport == "tcp"  # the peer's own memory: TCP, also on the same host
        link.read([(r.addr, region.addr, region.len)])
        assert np.array_equal(local, peer.initial())
        assert link.transport() in ("tcp", "same-host", "ucx")


def test_requests(engines):
    server, client = engines
    n = 4 << 20
    dst = np.zeros(n, np.uint8)
    src = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)
    rd, rs = server.register(dst), client.register(src)
    link = client.link(server.name)
    blk = 65536
    descs = [(rs.addr + i, rd.addr + i, blk) for i in range(0, n, blk)]
    req = link.write_async(descs, user_data=42)
    req.wait(30)
    assert req.status() == hixl.TransferStatus.COMPLETED and req.done()
    assert req.status() == hixl.TransferStatus.COMPLETED  # remembered after being reported
    assert np.array_equal(dst, src)
    assert req.cancel() is False  # already over
    # polling with status()
    dst[:] = 0
    req = link.write_async(descs)
    poll_until(req.done, 30, "async write")
    assert req.status() == hixl.TransferStatus.COMPLETED and np.array_equal(dst, src)


class _ScriptedNative:
    """A native handle whose wait takes a request's end and holds it until a status query
    found the request unknown (the engine reports an end once): the order that made
    ``status()`` raise ``FailedError`` for a transfer that completed."""

    def __init__(self):
        import threading

        self.taken, self.asked = threading.Event(), threading.Event()

    def wait_transfer(self, req, ms):
        self.taken.set()
        assert self.asked.wait(10), "nobody asked"
        return hixl.SUCCESS, hixl.TransferStatus.COMPLETED

    def get_transfer_status(self, req):
        assert self.taken.is_set()
        self.asked.set()
        return hixl.FAILED, None


def test_a_query_beside_a_wait_sees_the_end_the_wait_took():
    import threading
    import types

    native = _ScriptedNative()
    link = types.SimpleNamespace(engine=types.SimpleNamespace(_h=native))
    req = hixl.Request(link, 7)
    errors = []

    def waiter():
        try:
            req.wait(10)
        except Exception as e:  # noqa: BLE001 - the test reports whatever it was
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    assert native.taken.wait(10)
    # the wait holds the end; the engine answers this query "unknown"
    assert req.status() == hixl.TransferStatus.COMPLETED
    assert req.done()
    t.join(10)
    assert not t.is_alive() and errors == []


def test_timeouts_out_of_range_are_value_errors(engines):
    import math

    server, client = engines
    link = client.link(server.name)
    for bad in (math.inf, -math.inf, math.nan, 0, 1e12, 1e306):
        with pytest.raises(ValueError):
            link.notify("n", "m", timeout=bad)
        # (a NaN or infinite wait polled for ever)
        with pytest.raises(ValueError):
            server.wait_notify("n", timeout=bad)


def test_cancel(engines):
    server, client = engines
    n = 64 << 20
    dst = np.zeros(n, np.uint8)
    src = np.ones(n, np.uint8)
    rd, rs = server.register(dst), client.register(src)
    link = client.link(server.name)
    blk = 16384
    descs = np.array([(rs.addr + i, rd.addr + i, blk) for i in range(0, n, blk)], dtype=np.uint64)
    link.write([tuple(int(x) for x in descs[0])])  # connected
    req = link.write_async(descs)
    req.cancel()
    try:
        req.wait(60)
        outcome = "completed"  # it was quicker than the cancel
    except hixl.FailedError:
        outcome = "cancelled"
    assert req.done() and outcome in ("completed", "cancelled")
    if outcome == "completed":
        assert req.status() == hixl.TransferStatus.COMPLETED
    else:
        assert req.status() == hixl.TransferStatus.FAILED
    # the link still works after a cancel
    dst[:16] = 0
    link.write([(rs.addr, rd.addr, 16)])
    assert dst[:16].all()


def test_await_does_not_block_the_loop(engines):
    server, client = engines
    n = 64 << 20
    dst = np.zeros(n, np.uint8)
    src = np.ones(n, np.uint8)
    rd, rs = server.register(dst), client.register(src)
    link = client.link(server.name)
    blk = 65536
    descs = [(rs.addr + i, rd.addr + i, blk) for i in range(0, n, blk)]

    async def main():
        ticks = 0
        stop = False

        async def ticker():
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        reqs = [link.write_async(descs) for _ in range(2)]
        await asyncio.gather(*reqs)
        during = ticks  # the loop ran the ticker while the requests were awaited
        stop = True
        await t
        return during

    during = asyncio.run(main())
    assert during > 10 and dst.all()


def test_notifications(engines):
    server, client = engines
    a, b = np.zeros(4096, np.uint8), np.full(4096, 9, np.uint8)
    ra, rb = server.register(a), client.register(b)
    link = client.link(server.name)
    req = link.write_async([(rb.addr, ra.addr, 4096)])
    link.notify("done", "layer 0")
    name, msg = server.wait_notify("done", timeout=30)
    assert (name, msg) == ("done", "layer 0")
    assert a.all()  # the data arrived before the notification
    req.wait(30)
    link.notify("other", "x")
    link.notify("done", "y")
    assert server.wait_notify("done", timeout=30) == ("done", "y")
    assert server.notifies() == [("other", "x")]
