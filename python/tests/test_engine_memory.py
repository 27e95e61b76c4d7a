"""Engine-allocated memory (``Engine.alloc``, ``Hixl.alloc_host_mem``; hixl extensions): the
same-host one-sided path between two processes, zero-copy numpy views, their lifetimes, and
bad input."""
import gc
import sys

import numpy as np
import pytest

import hixl


def same_host_link(link):
    if link.transport() != "same-host":
        pytest.skip("the same-host transport is not available here (kernel policy)")


def test_two_processes_one_sided(peer_factory, tmp_path):
    """A peer serving engine memory is reached one-sidedly (its region's transport says so);
    random data moved both ways at odd offsets is verified byte for byte on both sides."""
    size = 4 << 20
    peer = peer_factory(size=size, seed=31, memory="engine")
    with hixl.Engine("127.0.0.1") as e:
        local = e.alloc(size)
        arr = local.numpy()
        assert arr.nbytes == size and not arr.any(), "zeroed"
        assert local.addr % 4096 == 0
        link = e.connect(peer.name, timeout=5)
        same_host_link(link)
        (region,) = link.remote_regions()
        assert region.transport == "same-host"
        assert (region.addr, region.len) == (peer.addr, size)
        # READ the peer's whole buffer in 256 blocks of 16 KiB
        blk = size // 256
        link.read([(local.addr + i * blk, region.addr + i * blk, blk) for i in range(256)], timeout=30)
        assert np.array_equal(arr, peer.initial())
        # WRITE random bytes at odd offsets
        rng = np.random.default_rng(32)
        arr[:] = rng.integers(0, 256, size, dtype=np.uint8)
        descs = [(local.addr + 1 + i * 40_000, region.addr + 3 + i * 40_001, 39_999) for i in range(64)]
        link.write(descs, timeout=30)
        got = peer.buffer(tmp_path)
        want = peer.initial()
        for la, ra, n in descs:
            want[ra - region.addr : ra - region.addr + n] = arr[la - local.addr : la - local.addr + n]
        assert np.array_equal(got, want)


def test_caller_memory_goes_over_tcp(peer_factory):
    """The same peer serving its own (numpy) memory: TCP, although the link is same-host."""
    peer = peer_factory(size=1 << 16, seed=33)
    with hixl.Engine("127.0.0.1") as e:
        local = e.alloc(1 << 16)
        link = e.connect(peer.name, timeout=5)
        same_host_link(link)
        (region,) = link.remote_regions()
        assert region.transport == "tcp"
        link.read([(local.addr, region.addr, 1 << 16)])
        assert np.array_equal(local.numpy(), peer.initial())


def test_views_outlive_deregistration_and_close():
    """Views keep the memory: after deregister and close, writing and reading through them is
    fine; the engine refuses the range for transfers once it is deregistered."""
    with hixl.Engine("127.0.0.1:0") as server, hixl.Engine("127.0.0.1") as client:
        kv = server.alloc(1 << 16)
        mine = client.alloc(1 << 16)
        a = np.asarray(mine)  # __array__: zero copy
        assert a.ctypes.data == mine.addr and a.flags.writeable
        a[:] = np.random.default_rng(34).integers(0, 256, 1 << 16, dtype=np.uint8)
        assert bytes(mine.memoryview()[:100]) == a[:100].tobytes()
        link = client.connect(server.name, timeout=5)
        link.write([(mine.addr, kv.addr, 1 << 16)])
        k = kv.numpy()
        assert np.array_equal(k, a)
        client.deregister(mine)
        with pytest.raises(hixl.ParamInvalidError):
            link.write([(mine.addr, kv.addr, 64)])
        with pytest.raises(hixl.ParamInvalidError):
            client.deregister(mine)  # already
        server.deregister(kv)
        a[:10] = 7  # still mapped
        assert (a[:10] == 7).all()
        link.close()
    del kv, mine
    gc.collect()
    # both engines closed, the buffers gone: the views still hold the memory
    k[:] = 1
    a[:] = 2
    assert int(k.sum()) == (1 << 16) and int(a.sum()) == 2 * (1 << 16)


def test_engine_close_with_buffers_registered():
    e = hixl.Engine("127.0.0.1")
    view = e.alloc(4096).memoryview()
    e.close()
    view[0] = 9
    assert view[0] == 9
    with pytest.raises(hixl.FailedError):
        e.alloc(4096)


def test_bad_input():
    with hixl.Engine("127.0.0.1") as e:
        with pytest.raises(hixl.ParamInvalidError):
            e.alloc(0)
        with pytest.raises(hixl.ResourceExhaustedError):
            e.alloc(2**64 - 1)
        with pytest.raises(ValueError):
            e.alloc(-1)
        with pytest.raises(ValueError):
            e.alloc(2**64)
        with pytest.raises(TypeError):
            e.alloc("4096")
        with pytest.raises(TypeError):
            e.alloc(True)
        h = e.hixl
        assert h.alloc_host_mem(0) == (hixl.PARAM_INVALID, None)
        ret, mem = h.alloc_host_mem(100)
        assert ret == hixl.SUCCESS and len(mem) == mem.nbytes == 100 and mem.handle != 0
        assert h.deregister_mem(mem.handle) == hixl.SUCCESS
        assert h.deregister_mem(mem.handle) == hixl.SUCCESS  # already: no effect (CANN's)
    flat = hixl.Hixl()
    ret, mem = flat.alloc_host_mem(4096)
    assert (ret, mem) == (hixl.FAILED, None)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the buffer protocol in Python (PEP 688)")
def test_buffer_protocol():
    with hixl.Engine("127.0.0.1") as e:
        buf = e.alloc(4096)
        a = np.frombuffer(buf, dtype=np.uint8)
        a[5] = 3
        assert memoryview(buf)[5] == 3


# Run in a child interpreter: a view that outlived its memory segfaults on write, which would
# take pytest down with it.
_CUT_VIEWS = r"""
import gc, sys
import numpy as np
import hixl

how = sys.argv[1]
e = hixl.Engine("127.0.0.1")
views = []
for i in range(64):
    buf = e.alloc(1 << 20)
    # one kind of view per buffer, so no view keeps another's memory
    views.append((np.asarray, lambda b: b.numpy(), lambda b: b.memoryview())[i % 3](buf))
    try:
        buf.obj = None  # what the review did: cut the attribute the view's lifetime hung on
        reassigned = True
    except AttributeError:
        reassigned = False
    for attr in ("_obj", "_keep"):
        setattr(buf, attr, None)  # and the private ones too: the views must not care
    if how == "deregister":
        e.deregister(buf)
    del buf
if how == "close":
    e.close()
gc.collect()
# other allocations now may reuse freed memory: the views must still own theirs
junk = [bytearray(1 << 20) for _ in range(64)]
for i, v in enumerate(views):
    v[0] = i
    v[len(v) - 1] = 0x5A
for i, v in enumerate(views):
    assert v[0] == i and v[len(v) - 1] == 0x5A, i
assert all(j.count(0) == len(j) for j in junk), "a view wrote into another allocation"
assert not reassigned, "buf.obj could be reassigned"
e.close()
print("ok")
"""


_AT_EXIT = r"""
import atexit

views = []


def touch():
    for i, v in enumerate(views):
        v[0] = i
        v[len(v) - 1] = 0x5A
    assert all(v[0] == i and v[len(v) - 1] == 0x5A for i, v in enumerate(views))
    print("ok", flush=True)


# registered before anything else: it runs after every atexit function registered later
# (weakref.finalize's among them)
atexit.register(touch)
import numpy as np
import hixl

e = hixl.Engine("127.0.0.1")
for i in range(8):
    buf = e.alloc(1 << 20)
    views.append((lambda b: b.numpy(), lambda b: b.memoryview())[i % 2](buf))
e.close()
del buf
"""


def test_views_keep_their_memory_through_interpreter_exit():
    """A view used by an atexit function (or a daemon thread, a ``__del__``) at interpreter
    exit still has its memory: the buffer's finalizer does not run at exit (it did, and the
    write segfaulted once the engine was closed)."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", _AT_EXIT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("how", ["deregister", "close"])
def test_no_view_outlives_its_memory_whatever_the_program_cuts(how):
    """``np.asarray(buf)``, ``buf.numpy()`` and ``buf.memoryview()`` keep their memory after
    the program drops or overwrites every attribute of the buffer (``obj`` is read-only now;
    the private ones are cleared too) and deregisters it or closes the engine. (Views made
    with ``np.asarray`` hung on ``buf.obj``: setting it to None and deregistering made a write
    through the view segfault, 10 of 10.)"""
    import subprocess

    r = subprocess.run(
        [sys.executable, "-c", _CUT_VIEWS, how], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)
