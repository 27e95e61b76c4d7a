"""Bad input from Python never crashes: wrong types, None, negative and huge ints raise
TypeError / ValueError; addresses outside the registered regions (a bogus address, a
deregistered buffer, a length past the region) are refused with a status, not a segfault. And
the GIL is released while a call blocks."""
import ctypes
import sys
import threading
import time

import numpy as np
import pytest

import hixl

# hixl::MAX_BATCH: the most descriptors one call takes
MAX_BATCH = 1 << 20


@pytest.fixture
def pair():
    """A server (one registered buffer) and a connected client (one registered buffer), in
    this process."""
    s, c = hixl.Hixl(), hixl.Hixl()
    assert s.initialize("127.0.0.1:0") == hixl.SUCCESS
    srv = np.zeros(1 << 16, np.uint8)
    cli = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)[: 1 << 16].copy()
    ret, sh = s.register_mem(hixl.MemDesc(srv.ctypes.data, srv.nbytes), hixl.MEM_HOST)
    assert ret == 0
    assert c.initialize("127.0.0.1") == hixl.SUCCESS
    ret, ch = c.register_mem(hixl.MemDesc(cli.ctypes.data, cli.nbytes), hixl.MEM_HOST)
    assert ret == 0
    name = s.local_engine()[1]
    assert c.connect(name, 5000) == hixl.SUCCESS
    yield s, c, name, srv, cli, sh, ch
    c.finalize()
    s.finalize()


def test_bogus_addresses_are_refused(pair):
    s, c, name, srv, cli, sh, ch = pair
    R, W = hixl.READ, hixl.WRITE
    D = hixl.TransferOpDesc
    bad = [
        D(0x10, srv.ctypes.data, 16),  # local: not registered (and unmapped)
        D(cli.ctypes.data, 0x10, 16),  # remote: not in the peer's table
        D(cli.ctypes.data, srv.ctypes.data, srv.nbytes + 1),  # past the end
        D(cli.ctypes.data + cli.nbytes - 8, srv.ctypes.data, 16),  # local past the end
        D(cli.ctypes.data, srv.ctypes.data + srv.nbytes - 1, 2),  # remote past the end
        D(cli.ctypes.data, srv.ctypes.data, 0),  # zero length
        D(2**64 - 8, srv.ctypes.data, 16),  # wraps around
        D(cli.ctypes.data, 2**64 - 8, 16),
        D(cli.ctypes.data, srv.ctypes.data, 2**64 - 1),
    ]
    for d in bad:
        for op in (R, W):
            assert c.transfer_sync(name, op, [d]) == hixl.PARAM_INVALID, d
            assert c.transfer_async(name, op, [d]) == (hixl.PARAM_INVALID, 0), d
    # one bad descriptor among good ones: nothing moves
    good = D(cli.ctypes.data, srv.ctypes.data, 4096)
    assert c.transfer_sync(name, W, [good] * 10 + [bad[1]]) == hixl.PARAM_INVALID
    assert not srv.any()
    assert c.transfer_sync(name, W, [good]) == hixl.SUCCESS
    assert np.array_equal(srv[:4096], cli[:4096])


def test_deregistered_buffer_is_refused(pair):
    s, c, name, srv, cli, sh, ch = pair
    assert c.disconnect(name) == hixl.SUCCESS
    # the client's buffer is deregistered (allowed: no link): its range is refused now
    assert c.deregister_mem(ch) == hixl.SUCCESS
    assert c.deregister_mem(ch) == hixl.SUCCESS  # already: no effect (CANN's)
    assert c.deregister_mem(0) == hixl.PARAM_INVALID  # the null handle
    assert c.deregister_mem(2**64 - 1) == hixl.SUCCESS  # unknown: no effect
    assert c.connect(name, 5000) == hixl.SUCCESS
    d = [hixl.TransferOpDesc(cli.ctypes.data, srv.ctypes.data, 16)]
    assert c.transfer_sync(name, hixl.WRITE, d) == hixl.PARAM_INVALID
    # registering while linked works, as in HIXL, and the range is usable at once
    ret, h = c.register_mem(hixl.MemDesc(cli.ctypes.data, 16), hixl.MEM_HOST)
    assert ret == hixl.SUCCESS and h != 0
    cli[:16] = 7
    assert c.transfer_sync(name, hixl.WRITE, d) == hixl.SUCCESS
    assert np.array_equal(srv[:16], cli[:16])


def test_registration_while_linked_as_hixl_does_it():
    """The server registers a buffer while a client is linked (a client that connects later
    sees it; the linked one keeps its table), then deregisters its first buffer while linked:
    the linked client's writes to it are refused and do not land."""
    s, c1, c2 = hixl.Hixl(), hixl.Hixl(), hixl.Hixl()
    assert s.initialize("127.0.0.1:0") == 0
    assert c1.initialize("127.0.0.1") == 0 and c2.initialize("127.0.0.1") == 0
    name = s.local_engine()[1]
    first = np.zeros(4096, np.uint8)
    later = np.zeros(4096, np.uint8)
    src = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    ret, h_first = s.register_mem(hixl.MemDesc(first.ctypes.data, first.nbytes), hixl.MEM_HOST)
    assert ret == hixl.SUCCESS
    for c in (c1, c2):
        assert c.register_mem(hixl.MemDesc(src.ctypes.data, src.nbytes), hixl.MEM_HOST)[0] == 0
    assert c1.connect(name, 5000) == hixl.SUCCESS
    ret, h_later = s.register_mem(hixl.MemDesc(later.ctypes.data, later.nbytes), hixl.MEM_HOST)
    assert ret == hixl.SUCCESS
    to_later = [hixl.TransferOpDesc(src.ctypes.data, later.ctypes.data, 4096)]
    assert c1.transfer_sync(name, hixl.WRITE, to_later) == hixl.PARAM_INVALID
    assert c2.connect(name, 5000) == hixl.SUCCESS
    assert c2.transfer_sync(name, hixl.WRITE, to_later) == hixl.SUCCESS
    assert np.array_equal(later, src)
    assert s.deregister_mem(h_first) == hixl.SUCCESS
    to_first = [hixl.TransferOpDesc(src.ctypes.data, first.ctypes.data, 4096)]
    assert c1.transfer_sync(name, hixl.WRITE, to_first) == hixl.PARAM_INVALID
    assert not first.any()
    assert s.deregister_mem(h_later) == hixl.SUCCESS
    s.finalize()
    # the server went away first: Disconnect still succeeds, as in HIXL
    assert c1.disconnect(name) == hixl.SUCCESS
    assert c2.disconnect(name) == hixl.SUCCESS
    c1.finalize()
    c2.finalize()


def test_peer_deregistered_region_is_refused():
    """The peer deregisters (and frees) its buffer: its old address is not in the table a new
    link gets, so a transfer to it is refused."""
    s, c = hixl.Hixl(), hixl.Hixl()
    assert s.initialize("127.0.0.1:0") == 0 and c.initialize("127.0.0.1") == 0
    srv = np.zeros(4096, np.uint8)
    keep = np.zeros(4096, np.uint8)
    cli = np.zeros(4096, np.uint8)
    _, sh = s.register_mem(hixl.MemDesc(srv.ctypes.data, srv.nbytes), hixl.MEM_HOST)
    s.register_mem(hixl.MemDesc(keep.ctypes.data, keep.nbytes), hixl.MEM_HOST)
    c.register_mem(hixl.MemDesc(cli.ctypes.data, cli.nbytes), hixl.MEM_HOST)
    old = srv.ctypes.data
    assert s.deregister_mem(sh) == hixl.SUCCESS
    del srv
    name = s.local_engine()[1]
    assert c.connect(name, 5000) == hixl.SUCCESS
    d = [hixl.TransferOpDesc(cli.ctypes.data, old, 16)]
    assert c.transfer_sync(name, hixl.WRITE, d) == hixl.PARAM_INVALID
    assert c.transfer_sync(name, hixl.READ, d) == hixl.PARAM_INVALID
    c.finalize()
    s.finalize()


BAD_INTS = [None, -1, 2**64, 2**200, 1.5, "1", b"1", [], object()]


@pytest.mark.parametrize("v", BAD_INTS, ids=repr)
def test_bad_ints_raise(v):
    for make in (
        lambda: hixl.MemDesc(v, 1),
        lambda: hixl.MemDesc(1, v),
        lambda: hixl.TransferOpDesc(v, 1, 1),
        lambda: hixl.TransferOpDesc(1, v, 1),
        lambda: hixl.TransferOpDesc(1, 1, v),
    ) + ((lambda: hixl.GetTransferStatusArgs(max_query_count=v)),) * (v is not None):
        # (None is the default's spelling there)
        with pytest.raises((TypeError, ValueError)):
            make()
    d = hixl.TransferOpDesc(1, 2, 3)
    for attr in ("local_addr", "remote_addr", "len"):
        with pytest.raises((TypeError, ValueError)):
            setattr(d, attr, v)
    a = hixl.TransferArgs()
    with pytest.raises((TypeError, ValueError)):
        a.user_data = v
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0") == 0
    for call in (
        lambda: h.deregister_mem(v),
        lambda: h.get_transfer_status(v),
        lambda: h.connect("127.0.0.1:1", v),
        lambda: h.transfer_sync("127.0.0.1:1", hixl.READ, [d], v),
        lambda: h.register_mem(v, hixl.MEM_HOST),
        lambda: h.register_mem(hixl.MemDesc(1, 1), v),
        lambda: h.transfer_sync("127.0.0.1:1", v, [d]),
        lambda: h.transfer_sync("127.0.0.1:1", hixl.READ, v),
        lambda: h.transfer_sync(v, hixl.READ, [d]),
        lambda: h.transfer_async("127.0.0.1:1", hixl.READ, [d], v),
        lambda: h.send_notify("127.0.0.1:1", v),
        lambda: hixl.Hixl().initialize(v),
    ):
        try:
            r = call()
        except (TypeError, ValueError):
            continue
        # the few that accept it (a str "1" is a remote name, ...) answer with a status
        assert isinstance(r, (int, tuple)) and r != 0 and r != (0, 0)
    h.finalize()


def test_bad_values_give_a_status():
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0") == 0
    d = [hixl.TransferOpDesc(1, 2, 3)]
    assert h.connect("127.0.0.1:1", 0) == hixl.PARAM_INVALID  # timeout ≤ 0
    assert h.connect("127.0.0.1:1", -5) == hixl.PARAM_INVALID
    assert h.connect("not a name") == hixl.PARAM_INVALID
    assert h.connect(h.local_engine()[1]) == hixl.PARAM_INVALID  # itself
    assert h.transfer_sync("127.0.0.1:1", hixl.READ, []) != hixl.SUCCESS
    with pytest.raises(ValueError):
        h.transfer_sync("127.0.0.1:1", 7, d)  # no such op
    with pytest.raises(TypeError):
        h.transfer_sync("127.0.0.1:1", hixl.READ, [1, 2, 3])
    with pytest.raises(TypeError):
        h.transfer_sync("127.0.0.1:1", hixl.READ, "abc")
    assert h.register_mem(hixl.MemDesc(0, 16), hixl.MEM_HOST)[0] == hixl.PARAM_INVALID  # null
    assert h.register_mem(hixl.MemDesc(4096, 0), hixl.MEM_HOST)[0] == hixl.PARAM_INVALID
    assert h.register_mem(hixl.MemDesc(2**64 - 4096, 8192), hixl.MEM_HOST)[0] == hixl.PARAM_INVALID
    assert h.send_notify("127.0.0.1:1", hixl.NotifyDesc("x" * 5000, "")) != hixl.SUCCESS
    assert hixl.get_capability(99) == (hixl.SUCCESS, hixl.FEATURE_NOT_SUPPORTED)
    assert hixl.get_capability(2**70) == (hixl.SUCCESS, hixl.FEATURE_NOT_SUPPORTED)
    # a negative feature is refused, as HIXL's GetCapability and the C ABI refuse it
    assert hixl.get_capability(-1) == (hixl.PARAM_INVALID, hixl.FEATURE_NOT_SUPPORTED)
    assert hixl.get_capability(-2**70) == (hixl.PARAM_INVALID, hixl.FEATURE_NOT_SUPPORTED)
    with pytest.raises(TypeError):
        hixl.get_capability(None)
    with pytest.raises(TypeError):
        h.initialize("127.0.0.1:0", {"AutoConnect": 1})
    h.finalize()


def test_gil_released_during_transfer_sync():
    """A Python thread keeps running while another blocks in a long transfer_sync."""
    s, c = hixl.Hixl(), hixl.Hixl()
    assert s.initialize("127.0.0.1:0") == 0 and c.initialize("127.0.0.1") == 0
    n = 64 << 20
    srv = np.ones(n, np.uint8)
    cli = np.zeros(n, np.uint8)
    s.register_mem(hixl.MemDesc(srv.ctypes.data, n), hixl.MEM_HOST)
    c.register_mem(hixl.MemDesc(cli.ctypes.data, n), hixl.MEM_HOST)
    name = s.local_engine()[1]
    assert c.connect(name, 5000) == 0
    blk = 16384
    descs = [hixl.TransferOpDesc(cli.ctypes.data + i, srv.ctypes.data + i, blk) for i in range(0, n, blk)]
    stamps = []
    stop = threading.Event()

    def count():
        i = 0
        while not stop.is_set():
            i += 1
            if i % 200 == 0:
                stamps.append(time.monotonic())

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    t = threading.Thread(target=count)
    t.start()
    try:
        # a call long enough to tell, on any machine: the batch reads the buffer `reps` times
        # over, doubled until one call lasts over 30 ms (up to hixl's MAX_BATCH descriptors)
        reps = 1
        while True:
            batch = descs * reps
            t0 = time.monotonic()
            assert c.transfer_sync(name, hixl.READ, batch, 60000) == 0
            t1 = time.monotonic()
            if t1 - t0 > 0.03 or len(batch) * 2 > MAX_BATCH:
                break
            reps *= 2
        inside = [x for x in list(stamps) if t0 + 0.01 < x < t1]
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert t1 - t0 > 0.03, ("the transfer was too quick to tell", reps, t1 - t0)
    # with the GIL held through the call the counter could not run after its first few ms
    assert len(inside) > 10, (len(inside), t1 - t0)
    assert cli.all()
    c.finalize()
    s.finalize()


def test_threads_share_one_engine():
    """Calls from several threads while another initializes and finalizes: no deadlock (each
    waits without holding the GIL), every answer a status."""
    h = hixl.Hixl()
    stop = threading.Event()
    seen = set()

    def hammer():
        while not stop.is_set():
            ret, _ = h.get_all_transfer_status()
            seen.add(ret)
            h.get_notifies()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            assert h.initialize("127.0.0.1:0") == hixl.SUCCESS
            h.finalize()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    assert seen <= {hixl.SUCCESS, hixl.FAILED}


def test_a_sequence_whose_len_lies_is_no_panic(pair):
    """A sequence's ``__len__`` is a hint: one claiming 2**62 descriptors (a preallocation
    panicked with "capacity overflow", 2**40 aborted the process) gets the status of what it
    holds."""
    s, c, name, srv, cli, sh, ch = pair

    class Lying:
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return 2**62

        def __iter__(self):
            return iter(self.items)

    good = hixl.TransferOpDesc(cli.ctypes.data, srv.ctypes.data, 4096)
    assert c.transfer_sync(name, hixl.WRITE, Lying([good])) == hixl.SUCCESS
    assert bytes(srv[:4096]) == bytes(cli[:4096])
    bad = hixl.TransferOpDesc(0x10, srv.ctypes.data, 16)
    assert c.transfer_sync(name, hixl.READ, Lying([bad])) == hixl.PARAM_INVALID
    ret, _ = c.transfer_async(name, hixl.READ, Lying([bad]))
    assert ret == hixl.PARAM_INVALID

