"""Block-indexed transfers (``Link.transfer_blocks`` / ``read_blocks`` / ``write_blocks`` /
``transfer_blocks_async``; beyond HIXL): numpy index arrays, no Python object per block; random
blocks land where the list form of the same blocks puts them, over TCP (caller memory) and
same-host (engine memory); bad inputs raise their exact errors."""
import array

import numpy as np
import pytest

import hixl

SIZE = 4 << 20


@pytest.fixture(params=["tcp", "same-host"])
def pair(request):
    """(server region array, client region, link, remote base) with the server's memory its
    own numpy array (served over TCP) or engine memory (same-host, where the kernel allows)."""
    with hixl.Engine("127.0.0.1:0") as server, hixl.Engine("127.0.0.1") as client:
        if request.param == "tcp":
            backing = np.zeros(SIZE, np.uint8)
            served = server.register(backing)
            view = backing
        else:
            served = server.alloc(SIZE)
            view = served.numpy()
        local = client.alloc(SIZE)
        link = client.connect(server.name, timeout=5)
        (region,) = link.remote_regions()
        if request.param == "same-host" and region.transport != "same-host":
            pytest.skip("the same-host transport is not available here (kernel policy)")
        assert region.transport == request.param
        yield view, local, link, served.addr


def test_blocks_match_the_list_form(pair):
    view, local, link, raddr = pair
    arr = local.numpy()
    rng = np.random.default_rng(35)
    half = SIZE // 2
    for block, n, dtype in [(64, 20_000, np.uint32), (2048, 700, np.uint64), (16384, 60, np.int64)]:
        slots = half // block
        li = rng.permutation(slots)[:n].astype(dtype)
        ri = rng.permutation(slots)[:n].astype(dtype)
        arr[:] = rng.integers(0, 256, SIZE, dtype=np.uint8)
        view[:] = 0
        # the block form into the server's first half, the list form into its second
        link.write_blocks(local.addr, raddr, block, li, ri, timeout=30)
        descs = np.empty((n, 3), np.uint64)
        descs[:, 0] = local.addr + li.astype(np.uint64) * block
        descs[:, 1] = raddr + half + ri.astype(np.uint64) * block
        descs[:, 2] = block
        link.write(descs, timeout=30)
        assert np.array_equal(view[:half], view[half:]), f"block {block}: forms differ"
        # READ back with the block form into the client's second half (64-bit remote indices)
        arr[half:] = 0
        link.read_blocks(local.addr + half, raddr, block, li, ri.astype(np.uint64), timeout=30)
        for l in li[:50]:
            o = int(l) * block
            assert np.array_equal(arr[half + o : half + o + block], arr[o : o + block])
        got = arr[half:].reshape(-1, block)[li.astype(np.int64)]
        want = arr[:half].reshape(-1, block)[li.astype(np.int64)]
        assert np.array_equal(got, want)


def test_strides_buffers_and_async(pair):
    view, local, link, raddr = pair
    arr = local.numpy()
    arr[:] = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
    view[:] = 0
    # every other local block (stride 2 blocks), packed on the remote side; array('I') indices
    li, ri = array.array("I", range(16)), array.array("I", range(15, -1, -1))
    link.write_blocks(local.addr, raddr, 4096, li, ri, local_stride=8192)
    for k in range(16):
        r = (15 - k) * 4096
        assert np.array_equal(view[r : r + 4096], arr[2 * k * 4096 : 2 * k * 4096 + 4096])
    # big-endian and strided numpy indices are read as the numbers they hold
    view[:] = 0
    be = np.arange(16, dtype=">u4")
    strided = np.arange(32, dtype=np.uint64)[::2] // 2  # 0..15, not contiguous
    link.write_blocks(local.addr, raddr, 4096, be, strided[::-1].copy())
    link.write_blocks(local.addr, raddr, 4096, be, strided[::-1])
    link.write_blocks(local.addr, raddr, 4096, be.astype(">i8"), strided[::-1])
    for k in range(16):
        r = (15 - k) * 4096
        assert np.array_equal(view[r : r + 4096], arr[k * 4096 : (k + 1) * 4096])
    # async READ, a plain list of ints on one side and a numpy array on the other
    arr[1 << 20 :] = 0
    req = link.transfer_blocks_async(
        hixl.READ, local.addr + (1 << 20), raddr, 4096, list(range(16)), np.arange(16, dtype=np.uint32), user_data=5
    )
    req.wait(30)  # raises unless it completed
    assert np.array_equal(arr[1 << 20 : (1 << 20) + 65536], view[:65536])


def test_bad_block_inputs_raise_their_exact_errors(pair):
    _, local, link, raddr = pair
    i = np.arange(4, dtype=np.uint32)
    with pytest.raises(hixl.ParamInvalidError) as e:
        link.read_blocks(local.addr, raddr, 0, i, i)  # zero block
    assert e.value.status == hixl.PARAM_INVALID and "block" in e.value.message
    with pytest.raises(hixl.ParamInvalidError) as e:
        link.read_blocks(local.addr, raddr, 4096, i, i, remote_stride=2048)  # stride < block
    with pytest.raises(hixl.ParamInvalidError) as e:
        link.read_blocks(local.addr, raddr, 4096, i, i[:3])  # lengths differ
    assert "4 local block indices but 3 remote" in e.value.message
    with pytest.raises(hixl.ParamInvalidError):
        link.read_blocks(local.addr, raddr, 4096, i[:0], i[:0])  # none
    past = np.array([0, SIZE // 4096], np.uint64)  # the largest leaves the region
    with pytest.raises(hixl.ParamInvalidError) as e:
        link.read_blocks(local.addr, raddr, 4096, np.arange(2, dtype=np.uint64), past)
    assert "remote block index 1024 (position 1)" in e.value.message
    with pytest.raises(hixl.ParamInvalidError):  # index x stride overflows
        link.read_blocks(local.addr, raddr, 4096, np.array([2**63], np.uint64), i[:1])
    with pytest.raises(hixl.ParamInvalidError):  # a base in no region of the peer
        link.read_blocks(local.addr, raddr + SIZE + 4096, 4096, i, i)
    with pytest.raises(ValueError):
        link.read_blocks(local.addr, raddr, 4096, np.array([-1, 0, 1, 2]), i)
    # a negative or too large geometry: ValueError (was OverflowError, from the binding)
    la, ra = local.addr, raddr
    for args, kw in [((la, ra, -4096), {}), ((la, ra, 4096), {"local_stride": -1}),
                     ((la, ra, 4096), {"remote_stride": 2**64}), ((-1, ra, 4096), {}),
                     ((la, 2**64, 4096), {})]:
        with pytest.raises(ValueError):
            link.read_blocks(*args, i, i, **kw)
        with pytest.raises(ValueError):
            link.transfer_blocks_async(hixl.READ, *args, i, i, **kw)
    with pytest.raises(TypeError):
        link.read_blocks(local.addr, raddr, 4096, np.zeros(4, np.float64), i)
    with pytest.raises(TypeError):
        link.read_blocks(local.addr, raddr, 4096, np.zeros(4, np.uint16), i)
    with pytest.raises(ValueError):
        link.read_blocks(local.addr, raddr, 4096, i.reshape(2, 2), i)
    with pytest.raises(hixl.ParamInvalidError):
        link.transfer_blocks_async(hixl.READ, local.addr, raddr, 4096, i, i[:2])


def test_packed_list_form_sync_and_async(pair):
    """The list form's packed descriptors are read in place (no per-call copy): 20,000 random
    64-byte descriptors READ by ``read`` and by ``read_async`` land where they belong, and a
    packing that is not whole u64 triples is refused."""
    view, local, link, raddr = pair
    arr = local.numpy()
    rng = np.random.default_rng(36)
    block, n, half = 64, 20_000, SIZE // 2
    view[:] = rng.integers(0, 256, SIZE, dtype=np.uint8)
    li = rng.permutation(half // block)[:n].astype(np.uint64)
    ri = rng.permutation(SIZE // block)[:n].astype(np.uint64)
    want = view.reshape(-1, block)[ri.astype(np.int64)]
    for first, start in [(0, lambda d: link.read(d, timeout=30)),
                         (half, lambda d: link.read_async(d).wait(30))]:
        arr[:] = 0
        descs = np.empty((n, 3), np.uint64)
        descs[:, 0] = local.addr + first + li * block
        descs[:, 1] = raddr + ri * block
        descs[:, 2] = block
        start(descs)
        got = arr[first:].reshape(-1, block)[li.astype(np.int64)]
        assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="multiple of 24 bytes"):
        link.engine._handle()._transfer_sync_packed(link.remote, hixl.READ, b"\0" * 25, 1000)
