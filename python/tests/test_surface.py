"""The flat API's surface: CANN HIXL's module `hixl` name for name, value for value, default for
default, return shape for return shape (src/python/hixl_py/hixl_py.cc of hicann/hixl)."""
import inspect

import pytest

import hixl

STATUS = {
    "SUCCESS": 0,
    "PARAM_INVALID": 103900,
    "TIMEOUT": 103901,
    "NOT_CONNECTED": 103902,
    "ALREADY_CONNECTED": 103903,
    "NOTIFY_FAILED": 103904,
    "UNSUPPORTED": 103905,
    "RESOURCE_EXHAUSTED": 203900,
    "FAILED": 503900,
}

OPTIONS = {
    "OPTION_ENABLE_USE_FABRIC_MEM": "EnableUseFabricMem",
    "OPTION_RDMA_TRAFFIC_CLASS": "RdmaTrafficClass",
    "OPTION_RDMA_SERVICE_LEVEL": "RdmaServiceLevel",
    "OPTION_BUFFER_POOL": "BufferPool",
    "OPTION_GLOBAL_RESOURCE_CONFIG": "GlobalResourceConfig",
    "OPTION_AUTO_CONNECT": "AutoConnect",
    "OPTION_LOCAL_COMM_RES": "LocalCommRes",
}

ENUMS = {
    "MemType": ({"MEM_DEVICE": 0, "MEM_HOST": 1}, True),
    "TransferOp": ({"READ": 0, "WRITE": 1}, True),
    "TransferStatus": ({"WAITING": 0, "COMPLETED": 1, "TIMEOUT": 2, "FAILED": 3}, False),
    "AsyncConnectStatus": (
        {
            "NOT_CONNECT": 0,
            "CONNECT_PENDING": 1,
            "CONNECTING": 2,
            "CONNECTED": 3,
            "CONNECT_FAILED": 4,
            "DISCONNECT_PENDING": 5,
            "DISCONNECTING": 6,
        },
        True,
    ),
    "FeatureType": ({"AUTO_CONNECT": 0, "CLIENT_SERVER_COMM": 1}, True),
}


@pytest.mark.parametrize("name,value", sorted(STATUS.items()))
def test_status_ints(name, value):
    v = getattr(hixl, name)
    assert type(v) is int and v == value


@pytest.mark.parametrize("name,value", sorted(OPTIONS.items()))
def test_option_strings(name, value):
    assert getattr(hixl, name) == value


def test_feature_ints():
    assert hixl.FEATURE_SUPPORTED == 1 and hixl.FEATURE_NOT_SUPPORTED == 0


@pytest.mark.parametrize("enum", sorted(ENUMS))
def test_enums(enum):
    members, exported = ENUMS[enum]
    cls = getattr(hixl, enum)
    for name, value in members.items():
        m = getattr(cls, name)
        assert isinstance(m, cls)
        assert int(m) == value and m.value == value and m.name == name
        assert m == getattr(cls, name) and hash(m) == hash(getattr(cls, name))
        if exported:  # pybind11's export_values(): the bare module-level name
            assert getattr(hixl, name) == m and isinstance(getattr(hixl, name), cls)
    if not exported:
        # TransferStatus is not exported: hixl.TIMEOUT / hixl.FAILED stay the status ints
        assert hixl.TIMEOUT == 103901 and hixl.FAILED == 503900


def test_mem_desc():
    d = hixl.MemDesc(addr=0x1000, len=64)
    assert (d.addr, d.len, d.local_only) == (0x1000, 64, False)
    d.addr, d.len, d.local_only = 0x2000, 128, True
    assert (d.addr, d.len, d.local_only) == (0x2000, 128, True)
    assert hixl.MemDesc(1, 2).len == 2  # positional too


def test_transfer_op_desc():
    d = hixl.TransferOpDesc(local_addr=1, remote_addr=2, len=3)
    assert (d.local_addr, d.remote_addr, d.len) == (1, 2, 3)
    d.local_addr, d.remote_addr, d.len = 4, 5, 6
    assert (d.local_addr, d.remote_addr, d.len) == (4, 5, 6)


def test_transfer_args():
    a = hixl.TransferArgs()
    assert a.user_data == 0
    a.user_data = 2**64 - 1
    assert a.user_data == 2**64 - 1


def test_get_transfer_status_args():
    a = hixl.GetTransferStatusArgs()
    assert a.max_query_count == 4294967295 and a.skip_waiting is False
    a = hixl.GetTransferStatusArgs(max_query_count=3, skip_waiting=True)
    assert a.max_query_count == 3 and a.skip_waiting is True
    a.max_query_count, a.skip_waiting = 7, False
    assert (a.max_query_count, a.skip_waiting) == (7, False)


def test_transfer_result():
    r = hixl.TransferResult()
    assert r.req == 0 and r.user_data == 0 and r.status == hixl.TransferStatus.WAITING
    r.req, r.user_data = 5, 6
    assert (r.req, r.user_data) == (5, 6)
    with pytest.raises(AttributeError):
        r.status = hixl.TransferStatus.COMPLETED  # read-only, as CANN's


def test_notify_desc():
    n = hixl.NotifyDesc(name="a", notify_msg="b")
    assert (n.name, n.notify_msg) == ("a", "b")
    n.name, n.notify_msg = "c", "d"
    assert (n.name, n.notify_msg) == ("c", "d")


def test_get_capability():
    assert hixl.get_capability(hixl.AUTO_CONNECT) == (hixl.SUCCESS, hixl.FEATURE_SUPPORTED)
    assert hixl.get_capability(hixl.FeatureType.CLIENT_SERVER_COMM) == (
        hixl.SUCCESS,
        hixl.FEATURE_NOT_SUPPORTED,
    )


METHODS = {
    # name: (parameters after self, {parameter: default})
    "initialize": (["local_engine", "options"], {"options": None}),
    "finalize": ([], {}),
    "register_mem": (["mem_desc", "mem_type"], {}),
    "deregister_mem": (["mem_handle"], {}),
    "connect": (["remote_engine", "timeout_in_millis"], {"timeout_in_millis": None}),
    "disconnect": (["remote_engine", "timeout_in_millis"], {"timeout_in_millis": None}),
    "connect_async": (["remote_engine", "timeout_in_millis"], {"timeout_in_millis": None}),
    "disconnect_async": (["remote_engine", "timeout_in_millis"], {"timeout_in_millis": None}),
    "get_async_connect_status": (["remote_engine"], {}),
    "get_all_async_connect_status": ([], {}),
    "transfer_sync": (
        ["remote_engine", "op", "op_descs", "timeout_in_millis"],
        {"timeout_in_millis": None},
    ),
    "transfer_async": (["remote_engine", "op", "op_descs", "args"], {"args": None}),
    "get_transfer_status": (["req"], {}),
    "get_all_transfer_status": (["args"], {"args": None}),
    "send_notify": (["remote_engine", "notify", "timeout_in_millis"], {"timeout_in_millis": None}),
    "get_notifies": ([], {}),
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_hixl_method_signatures(method):
    """Every method and argument name of CANN's `Hixl` (defaults that are objects or 1000 in
    CANN are spelled `None` here and mean the same: {} / TransferArgs() / 1000 ms)."""
    params, defaults = METHODS[method]
    sig = inspect.signature(getattr(hixl.Hixl, method))
    got = [p for p in sig.parameters.values() if p.name != "self"]
    assert [p.name for p in got] == params
    for p in got:
        if p.name in defaults:
            assert p.default is defaults[p.name]
        else:
            assert p.default is inspect.Parameter.empty


def test_return_shapes_before_initialize():
    """Every call on an engine that is not initialized: FAILED, in CANN's return shapes."""
    h = hixl.Hixl()
    F = hixl.FAILED
    assert h.finalize() is None
    assert h.register_mem(hixl.MemDesc(0x1000, 8), hixl.MEM_HOST) == (F, 0)
    assert h.deregister_mem(1) == F
    assert h.connect("127.0.0.1:1") == F
    assert h.disconnect("127.0.0.1:1") == F
    assert h.connect_async("127.0.0.1:1") == F
    assert h.disconnect_async("127.0.0.1:1") == F
    assert h.get_async_connect_status("127.0.0.1:1") == (F, hixl.NOT_CONNECT)
    assert h.get_all_async_connect_status() == (F, {})
    d = [hixl.TransferOpDesc(1, 2, 3)]
    assert h.transfer_sync("127.0.0.1:1", hixl.READ, d) == F
    assert h.transfer_async("127.0.0.1:1", hixl.READ, d) == (F, 0)
    assert h.get_transfer_status(1) == (F, hixl.TransferStatus.FAILED)
    assert h.get_all_transfer_status() == (F, [])
    assert h.send_notify("127.0.0.1:1", hixl.NotifyDesc("a", "b")) == F
    assert h.get_notifies() == (F, [])


def test_return_shapes_initialized():
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0") == hixl.SUCCESS
    assert h.initialize("127.0.0.1:0", {}) == hixl.SUCCESS  # twice: SUCCESS, as CANN's
    ret, name = h.local_engine()
    assert ret == hixl.SUCCESS and name.startswith("127.0.0.1:") and not name.endswith(":0")
    buf = bytearray(4096)
    import ctypes

    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    ret, handle = h.register_mem(hixl.MemDesc(addr, len(buf)), hixl.MEM_HOST)
    assert ret == hixl.SUCCESS and type(handle) is int and handle != 0
    assert h.get_all_async_connect_status() == (hixl.SUCCESS, {})
    assert h.get_all_transfer_status() == (hixl.SUCCESS, [])
    # an unknown request: PARAM_INVALID, a null one FAILED (CANN's GetTransferStatus)
    assert h.get_transfer_status(12345) == (hixl.PARAM_INVALID, hixl.TransferStatus.FAILED)
    assert h.get_transfer_status(0) == (hixl.FAILED, hixl.TransferStatus.FAILED)
    assert h.get_notifies() == (hixl.SUCCESS, [])
    assert h.deregister_mem(handle) == hixl.SUCCESS
    assert h.deregister_mem(handle) == hixl.SUCCESS  # already: no effect (CANN's)
    assert h.finalize() is None
    assert h.finalize() is None  # twice is fine
    assert h.get_notifies() == (hixl.FAILED, [])
    # and it can be initialized again (CANN's wrapper makes a new engine)
    assert h.initialize("127.0.0.1:0") == hixl.SUCCESS
    h.finalize()


def test_mem_device_refused_without_ascend():
    """MEM_DEVICE without an Ascend runtime: UNSUPPORTED, never accepted."""
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0") == hixl.SUCCESS
    buf = bytearray(4096)
    import ctypes

    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    assert h.register_mem(hixl.MemDesc(addr, len(buf)), hixl.MEM_DEVICE) == (hixl.UNSUPPORTED, 0)
    h.finalize()


def test_unsupported_and_invalid_options():
    """Fabric memory needs ACL's virtual-memory calls: in this process no ACL loads (no CANN, and
    the test double is not on the library path here), so EnableUseFabricMem=1 is UNSUPPORTED
    (tests/fabric.rs and hixl-capi's cpp_fabric run it on the double). An unknown option is
    PARAM_INVALID."""
    h = hixl.Hixl()
    assert h.initialize("127.0.0.1:0", {hixl.OPTION_ENABLE_USE_FABRIC_MEM: "1"}) == hixl.UNSUPPORTED
    assert h.initialize("127.0.0.1:0", {"NoSuchOption": "1"}) == hixl.PARAM_INVALID
    assert h.initialize("127.0.0.1:0", {hixl.OPTION_AUTO_CONNECT: "1"}) == hixl.SUCCESS
    h.finalize()


def test_cann_module_path_hixl_hixl():
    """CANN's package re-exports its native module ``hixl.hixl``: that path works too."""
    import hixl.hixl as native
    from hixl.hixl import Hixl, MemDesc, MemType

    assert native.SUCCESS == hixl.SUCCESS == 0
    assert native.RESOURCE_EXHAUSTED == 203900
    assert Hixl is hixl.Hixl and MemDesc is hixl.MemDesc and MemType is hixl.MemType
    assert native.MEM_DEVICE == 0 and native.READ == 0
