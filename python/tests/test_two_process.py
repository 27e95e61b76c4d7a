"""Two processes: this one (the flat API, CANN's calls) against a peer process (peer.py) with a
numpy buffer of random bytes. Every transfer is verified byte for byte against a model of both
buffers kept here."""
import hashlib
import json
import time

import numpy as np
import pytest

import hixl
from conftest import Peer, poll_until

SLOT = 512  # descriptors live in disjoint 512-byte slots, at odd offsets


def register(h, arr):
    ret, handle = h.register_mem(hixl.MemDesc(arr.ctypes.data, arr.nbytes), hixl.MEM_HOST)
    assert ret == hixl.SUCCESS, hixl.last_error_message()
    return handle


def random_batch(rng, n, local, peer):
    """n descriptors: random odd offsets and lengths in disjoint slots on both sides (a random
    slot permutation remotely), as (local_off, remote_off, len) rows."""
    lslots = rng.permutation(local.nbytes // SLOT)[:n]
    rslots = rng.permutation(peer.len // SLOT)[:n]
    rows = []
    for ls, rs in zip(lslots, rslots):
        lo = int(rng.integers(0, SLOT // 2)) | 1
        ro = int(rng.integers(0, SLOT // 2)) | 1
        ln = int(rng.integers(1, SLOT // 2))
        rows.append((int(ls) * SLOT + lo, int(rs) * SLOT + ro, ln))
    return rows


def descs(local, peer, rows):
    return [hixl.TransferOpDesc(local.ctypes.data + lo, peer.addr + ro, ln) for lo, ro, ln in rows]


@pytest.mark.parametrize("batch", [1, 64, 4096])
def test_write_then_read_odd_offsets(peer_factory, client, tmp_path, batch):
    size = 4096 * SLOT
    peer = peer_factory(size=size, seed=batch)
    local = np.random.default_rng(1000 + batch).integers(0, 256, size, dtype=np.uint8)
    register(client, local)
    assert client.connect(peer.name, 5000) == hixl.SUCCESS
    assert client.connect(peer.name, 5000) == hixl.ALREADY_CONNECTED
    rng = np.random.default_rng(batch)
    model = peer.initial()

    # WRITE: local → peer
    rows = random_batch(rng, batch, local, peer)
    assert client.transfer_sync(peer.name, hixl.WRITE, descs(local, peer, rows), 30000) == 0, (
        hixl.last_error_message()
    )
    for lo, ro, ln in rows:
        model[ro : ro + ln] = local[lo : lo + ln]
    assert np.array_equal(peer.buffer(tmp_path), model)

    # READ: peer → local, other places
    expect = local.copy()
    rows = random_batch(rng, batch, local, peer)
    assert client.transfer_sync(peer.name, hixl.READ, descs(local, peer, rows), 30000) == 0
    for lo, ro, ln in rows:
        expect[lo : lo + ln] = model[ro : ro + ln]
    assert np.array_equal(local, expect)
    assert client.disconnect(peer.name) == hixl.SUCCESS
    assert client.disconnect(peer.name) == hixl.NOT_CONNECTED


def test_async_polling_and_get_all(peer_factory, client, tmp_path):
    size = 4096 * SLOT
    peer = peer_factory(size=size, seed=7)
    local = np.random.default_rng(70).integers(0, 256, size, dtype=np.uint8)
    register(client, local)
    assert client.connect(peer.name, 5000) == hixl.SUCCESS
    rng = np.random.default_rng(8)
    model = peer.initial()

    # one request polled with get_transfer_status
    rows = random_batch(rng, 64, local, peer)
    ret, req = client.transfer_async(peer.name, hixl.WRITE, descs(local, peer, rows))
    assert ret == hixl.SUCCESS and req != 0
    st = poll_until(
        lambda: (s := client.get_transfer_status(req))[1] != hixl.TransferStatus.WAITING and s,
        30,
        "the async WRITE",
    )
    assert st == (hixl.SUCCESS, hixl.TransferStatus.COMPLETED)
    # a terminal status is reported once: the request is gone now
    assert client.get_transfer_status(req) == (hixl.PARAM_INVALID, hixl.TransferStatus.FAILED)
    for lo, ro, ln in rows:
        model[ro : ro + ln] = local[lo : lo + ln]
    assert np.array_equal(peer.buffer(tmp_path), model)

    # several requests, each in its own slots, collected with get_all_transfer_status
    all_rows = random_batch(rng, 8 * 32, local, peer)
    reqs = {}
    for i in range(8):
        rows = all_rows[i * 32 : (i + 1) * 32]
        args = hixl.TransferArgs()
        args.user_data = 0xABC0 + i
        ret, req = client.transfer_async(peer.name, hixl.READ, descs(local, peer, rows), args)
        assert ret == hixl.SUCCESS
        reqs[req] = (args.user_data, rows)
    done = {}

    def collect():
        ret, results = client.get_all_transfer_status(hixl.GetTransferStatusArgs(skip_waiting=True))
        assert ret == hixl.SUCCESS
        for r in results:
            assert r.status != hixl.TransferStatus.WAITING
            done[r.req] = (r.user_data, r.status)
        return len(done) == len(reqs)

    poll_until(collect, 30, "8 async READs")
    for req, (ud, rows) in reqs.items():
        assert done[req] == (ud, hixl.TransferStatus.COMPLETED)
        for lo, ro, ln in rows:
            assert np.array_equal(local[lo : lo + ln], model[ro : ro + ln])
    assert client.get_all_transfer_status() == (hixl.SUCCESS, [])


def test_notification_after_data(peer_factory, client):
    size = 1 << 20
    peer = peer_factory(size=size, seed=3)
    local = np.random.default_rng(30).integers(0, 256, size, dtype=np.uint8)
    register(client, local)
    assert client.connect(peer.name, 5000) == hixl.SUCCESS
    off, ln = 4097, 512 * 1024 + 3
    ret, req = client.transfer_async(
        peer.name, hixl.WRITE, [hixl.TransferOpDesc(local.ctypes.data + 1, peer.addr + off, ln)]
    )
    assert ret == hixl.SUCCESS
    # sent right after the async WRITE started: delivered only after its data
    assert client.send_notify(peer.name, hixl.NotifyDesc("kv_ready", "layer0"), 5000) == 0
    got = json.loads(peer.cmd(f"wait_notify kv_ready {off} {ln} 30"))
    assert got["msg"] == "layer0"
    assert got["sha"] == hashlib.sha256(local[1 : 1 + ln].tobytes()).hexdigest()
    poll_until(lambda: client.get_transfer_status(req)[1] != hixl.TransferStatus.WAITING, 30, "req")


def test_notifies_received(peer_factory):
    """get_notifies on the receiving side (this process)."""
    peer = peer_factory(size=1 << 16, seed=4)
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0") == hixl.SUCCESS
    ret, me = h.local_engine()
    # the peer cannot send to us by itself; use a second local engine as the sender
    s = hixl.Hixl()
    assert s.initialize("127.0.0.1", {hixl.OPTION_AUTO_CONNECT: "1"}) == hixl.SUCCESS
    assert s.send_notify(me, hixl.NotifyDesc("n1", "m1")) == hixl.SUCCESS
    assert s.send_notify(me, hixl.NotifyDesc("n2", "m2")) == hixl.SUCCESS
    got = []
    poll_until(lambda: got.extend(h.get_notifies()[1]) or len(got) >= 2, 30, "two notifies")
    assert [(n.name, n.notify_msg) for n in got] == [("n1", "m1"), ("n2", "m2")]
    s.finalize()
    h.finalize()
    assert peer.name


def test_auto_connect(peer_factory, tmp_path):
    peer = peer_factory(size=1 << 16, seed=5)
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1", {hixl.OPTION_AUTO_CONNECT: "1"}) == hixl.SUCCESS
    local = np.arange(1 << 16, dtype=np.uint32).view(np.uint8)[: 1 << 16].copy()
    register(h, local)
    # no connect: the transfer connects on demand
    d = [hixl.TransferOpDesc(local.ctypes.data + 3, peer.addr + 5, 1001)]
    assert h.transfer_sync(peer.name, hixl.WRITE, d) == hixl.SUCCESS, hixl.last_error_message()
    assert h.get_async_connect_status(peer.name) == (hixl.SUCCESS, hixl.CONNECTED)
    ret, all_ = h.get_all_async_connect_status()
    assert ret == hixl.SUCCESS and list(all_.values()) == [hixl.CONNECTED]
    model = peer.initial()
    model[5:1006] = local[3:1004]
    assert np.array_equal(peer.buffer(tmp_path), model)
    h.finalize()


def test_without_auto_connect_not_connected(peer_factory, client):
    peer = peer_factory(size=1 << 16, seed=6)
    local = np.zeros(1 << 16, np.uint8)
    register(client, local)
    d = [hixl.TransferOpDesc(local.ctypes.data, peer.addr, 16)]
    assert client.transfer_sync(peer.name, hixl.READ, d) == hixl.NOT_CONNECTED
    assert client.transfer_async(peer.name, hixl.READ, d) == (hixl.NOT_CONNECTED, 0)
    assert client.send_notify(peer.name, hixl.NotifyDesc("a", "b")) == hixl.NOT_CONNECTED


def test_async_connect(peer_factory, client):
    peer = peer_factory(size=1 << 16, seed=9)
    local = np.zeros(1 << 16, np.uint8)
    register(client, local)
    assert client.connect_async(peer.name, 5000) == hixl.SUCCESS
    poll_until(
        lambda: client.get_async_connect_status(peer.name) == (hixl.SUCCESS, hixl.CONNECTED),
        30,
        "async connect",
    )
    d = [hixl.TransferOpDesc(local.ctypes.data, peer.addr, 1 << 16)]
    assert client.transfer_sync(peer.name, hixl.READ, d) == hixl.SUCCESS
    assert np.array_equal(local, peer.initial())
    assert client.disconnect_async(peer.name) == hixl.SUCCESS


@pytest.mark.parametrize("auto", [False, True])
def test_peer_killed_then_restarted(peer_factory, auto):
    peer = peer_factory(size=1 << 16, seed=11)
    h = hixl.Hixl()
    opts = {hixl.OPTION_AUTO_CONNECT: "1" if auto else "0"}
    assert h.initialize("127.0.0.1", opts) == hixl.SUCCESS
    local = np.zeros(1 << 16, np.uint8)
    register(h, local)
    if not auto:
        assert h.connect(peer.name, 5000) == hixl.SUCCESS
    d = [hixl.TransferOpDesc(local.ctypes.data, peer.addr, 1 << 16)]
    assert h.transfer_sync(peer.name, hixl.READ, d) == hixl.SUCCESS
    assert np.array_equal(local, peer.initial())

    peer.kill()
    t0 = time.monotonic()
    ret = h.transfer_sync(peer.name, hixl.READ, d, 1000)
    took = time.monotonic() - t0
    assert ret == hixl.NOT_CONNECTED, (ret, hixl.last_error_message())
    assert took < 1.0 + 0.5  # within the call's timeout (and some scheduling slack)
    if auto:
        # the broken link was dropped; the next call tries to connect again, and nobody listens
        assert h.transfer_sync(peer.name, hixl.READ, d, 1000) != hixl.SUCCESS
    else:
        # without AutoConnect it stays NOT_CONNECTED until connected again
        assert h.transfer_sync(peer.name, hixl.READ, d, 1000) == hixl.NOT_CONNECTED

    # the peer comes back on the same name (same port), with other data
    port_name = peer.name
    back = deadline_restart(peer_factory, port_name, seed=12)
    if not auto:
        assert h.connect(back.name, 5000) == hixl.SUCCESS  # supersedes the broken link
    d = [hixl.TransferOpDesc(local.ctypes.data, back.addr, 1 << 16)]
    assert h.transfer_sync(back.name, hixl.READ, d, 5000) == hixl.SUCCESS, hixl.last_error_message()
    assert np.array_equal(local, back.initial())
    h.finalize()


def deadline_restart(peer_factory, name, seed, timeout=30.0):
    """Start a peer on `name` again (its port may take a moment to be free)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return peer_factory(size=1 << 16, seed=seed, local=name)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_peer_sanity_helper():
    p = Peer(1 << 12, 1)
    try:
        assert p.name.startswith("127.0.0.1:")
    finally:
        p.close()


@pytest.mark.parametrize("memory", ["caller", "engine"])
def test_deregister_while_an_async_read_writes_is_refused(peer_factory, memory):
    """Deregistering a bytearray that an async READ is still writing raises
    ResourceExhaustedError (RESOURCE_EXHAUSTED) and keeps it registered, with Python's
    reference to it; once the request ended it deregisters, and nothing writes it afterwards.
    (It used to succeed at once: the READ went on writing the freed bytearray, and freeing many
    such buffers aborted the interpreter on heap corruption, 10 of 10 runs.)"""
    size = 8 << 20
    peer = peer_factory(size=size, seed=41, memory=memory)
    with hixl.Engine("127.0.0.1") as e:
        for _ in range(3):
            buf = bytearray(size)
            region = e.register(buf)
            link = e.connect(peer.name, timeout=5)
            # the peer's buffer 256 times over into the same bytes: 2 GiB, far longer than the
            # calls below take
            req = link.read_async([(region.addr, peer.addr, size)] * 256)
            with pytest.raises(hixl.ResourceExhaustedError):
                e.deregister(region)
            assert region._keep is not None, "still registered, still referenced"
            req.cancel()
            try:
                req.wait(timeout=60)
            except hixl.FailedError:
                pass  # cancelled
            e.deregister(region)
            buf[:] = b"\xa5" * size
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.1:
                assert buf.count(0xA5) == size, "written after deregistration"
            link.close()
