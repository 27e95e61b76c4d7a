"""Stand-in `torch` (test fixture, see python/tests/fakes/README.md): numpy-backed tensors,
"npu" tensors in the ACL test double's device memory, `torch.npu`, `torch.distributed`."""
import ctypes
import math

import numpy as np

from . import distributed  # noqa: F401

__version__ = "0.0-hixl-fixture"

_ACL = None


def _acl():
    global _ACL
    if _ACL is None:
        _ACL = ctypes.CDLL("libacl_rt.so")
    return _ACL


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: ACL error {rc}")


class dtype:
    def __init__(self, name, np_dtype, itemsize):
        self.name, self.np, self.itemsize = name, np.dtype(np_dtype), itemsize

    def __repr__(self):
        return f"torch.{self.name}"


float32 = float = dtype("float32", np.float32, 4)
float16 = half = dtype("float16", np.float16, 2)
bfloat16 = dtype("bfloat16", np.uint16, 2)  # bit patterns only
float64 = double = dtype("float64", np.float64, 8)
int8 = dtype("int8", np.int8, 1)
uint8 = dtype("uint8", np.uint8, 1)
int16 = short = dtype("int16", np.int16, 2)
int32 = int = dtype("int32", np.int32, 4)
int64 = long = dtype("int64", np.int64, 8)
bool = dtype("bool", np.bool_, 1)
_BY_NP = {d.np: d for d in (float32, float16, float64, int8, uint8, int16, int32, int64, bool)}


class device:
    def __init__(self, spec, index=None):
        spec = str(spec)
        self.type, _, idx = spec.partition(":")
        self.index = index if index is not None else (builtins_int(idx) if idx else None)

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type + (f":{self.index}" if self.index is not None else "")


import builtins as _b  # noqa: E402

builtins_int = _b.int


def _is_npu(dev):
    return dev is not None and str(dev).startswith("npu")


class Tensor:
    """A tensor: host (a numpy array) or npu (an `aclrtMalloc` block of the double)."""

    def __init__(self, array=None, *, dtype_=None, shape=None, dev_ptr=None, owner=None):
        self._np = array
        self.dtype = dtype_ or _BY_NP.get(array.dtype, float32)
        self._shape = tuple(array.shape) if array is not None else tuple(shape)
        self._dev = dev_ptr
        self._owner = owner  # keeps a view's base alive

    # -- geometry --
    @property
    def shape(self):
        return self._shape

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[dim]

    def dim(self):
        return len(self._shape)

    def numel(self):
        return builtins_int(math.prod(self._shape))

    def element_size(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.numel() * self.element_size()

    @property
    def device(self):
        return device("npu", 0) if self._dev is not None else device("cpu")

    @property
    def is_npu(self):
        return self._dev is not None

    def data_ptr(self):
        if self._dev is not None:
            return self._dev
        return self._np.ctypes.data

    def is_contiguous(self):
        return True

    def contiguous(self):
        return self

    # -- moves --
    def npu(self, *args, **kwargs):
        if self._dev is not None:
            return self
        return _to_npu(self._np, self.dtype)

    def cpu(self):
        if self._dev is None:
            return self
        out = np.empty(self._shape, self.dtype.np)
        if out.nbytes:
            _check(_acl().aclrtMemcpy(ctypes.c_void_p(out.ctypes.data), ctypes.c_size_t(out.nbytes),
                                      ctypes.c_void_p(self._dev), ctypes.c_size_t(out.nbytes), 2),
                   "aclrtMemcpy(D2H)")
        return Tensor(out, dtype_=self.dtype)

    def to(self, *args, **kwargs):
        dev = kwargs.get("device")
        dt = kwargs.get("dtype")
        for a in args:
            if isinstance(a, dtype):
                dt = a
            else:
                dev = a
        t = self
        if dt is not None and dt is not t.dtype:
            t = Tensor(t.cpu()._np.astype(dt.np), dtype_=dt)
        if dev is not None:
            t = t.npu() if _is_npu(dev) else t.cpu()
        return t

    def numpy(self):
        if self._dev is not None:
            raise TypeError("can't convert npu tensor to numpy. Use Tensor.cpu() first.")
        return self._np

    def tolist(self):
        return self.cpu()._np.tolist()

    def item(self):
        return self.cpu()._np.item()

    def view(self, *shape):
        if self._dev is not None:
            raise NotImplementedError("the stand-in views host tensors only")
        return Tensor(self._np.reshape(*shape), dtype_=self.dtype)

    reshape = view

    def fill_(self, v):
        if self._dev is not None:
            src = np.full(self._shape, v, self.dtype.np)
            _copy_h2d(self._dev, src)
        else:
            self._np.fill(v)
        return self

    def zero_(self):
        return self.fill_(0)

    def copy_(self, other):
        src = other.cpu()._np.astype(self.dtype.np)
        if self._dev is not None:
            _copy_h2d(self._dev, np.ascontiguousarray(src))
        else:
            self._np[...] = src
        return self

    def __getitem__(self, idx):
        return Tensor(np.asarray(self.cpu()._np[idx]), dtype_=self.dtype)

    def __eq__(self, other):
        o = other.cpu()._np if isinstance(other, Tensor) else other
        return Tensor(self.cpu()._np == o, dtype_=bool)

    def all(self):
        return Tensor(np.asarray(self.cpu()._np.all()), dtype_=bool)

    def __bool__(self):
        return _b.bool(self.cpu()._np.all())

    def sum(self):
        return Tensor(np.asarray(self.cpu()._np.sum()), dtype_=self.dtype)

    def __repr__(self):
        host = self.cpu()._np
        body = np.array2string(host, separator=", ", threshold=64)
        suffix = ", device='npu:0'" if self._dev is not None else ""
        return f"tensor({body}{suffix}, dtype={self.dtype!r})"

    __str__ = __repr__

    def __del__(self):
        if self._dev is not None and self._owner is None and _ACL is not None:
            try:
                _ACL.aclrtFree(ctypes.c_void_p(self._dev))
            except Exception:
                pass
            self._dev = None


def _copy_h2d(dst, arr):
    if arr.nbytes:
        _check(_acl().aclrtMemcpy(ctypes.c_void_p(dst), ctypes.c_size_t(arr.nbytes), ctypes.c_void_p(arr.ctypes.data),
                                  ctypes.c_size_t(arr.nbytes), 1), "aclrtMemcpy(H2D)")


def _to_npu(arr, dt):
    arr = np.ascontiguousarray(arr)
    p = ctypes.c_void_p()
    _check(_acl().aclrtMalloc(ctypes.byref(p), ctypes.c_size_t(max(arr.nbytes, 1)), 0), "aclrtMalloc")
    _copy_h2d(p.value, arr)
    return Tensor(None, dtype_=dt, shape=arr.shape, dev_ptr=p.value)


def _shape(size, kw=None):
    if not size and kw and "size" in kw:
        size = (kw["size"],)
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def _make(arr, dt, dev):
    t = Tensor(arr, dtype_=dt)
    return t.npu() if _is_npu(dev) else t


def zeros(*size, dtype=None, device=None, **kw):
    dt = dtype or float32
    return _make(np.zeros(_shape(size, kw), dt.np), dt, device)


def ones(*size, dtype=None, device=None, **kw):
    dt = dtype or float32
    return _make(np.ones(_shape(size, kw), dt.np), dt, device)


def empty(*size, dtype=None, device=None, **kw):
    dt = dtype or float32
    return _make(np.zeros(_shape(size, kw), dt.np), dt, device)


def full(size, fill_value, dtype=None, device=None, **kw):
    dt = dtype or float32
    return _make(np.full(tuple(size), fill_value, dt.np), dt, device)


def rand(*size, dtype=None, device=None, **kw):
    dt = dtype or float32
    return _make(np.random.random_sample(_shape(size, kw)).astype(dt.np), dt, device)


def randint(low, high=None, size=(), dtype=None, device=None, **kw):
    if high is None:
        low, high = 0, low
    dt = dtype or int64
    return _make(np.random.randint(low, high, size=tuple(size)).astype(dt.np), dt, device)


def arange(*args, dtype=None, device=None, **kw):
    dt = dtype or int64
    return _make(np.arange(*args).astype(dt.np), dt, device)


def tensor(data, dtype=None, device=None, **kw):
    arr = np.asarray(data)
    dt = dtype or _BY_NP.get(arr.dtype, float32)
    return _make(arr.astype(dt.np), dt, device)


def equal(a, b):
    x, y = a.cpu()._np, b.cpu()._np
    return x.shape == y.shape and _b.bool(np.array_equal(x, y))


def allclose(a, b, rtol=1e-05, atol=1e-08):
    return _b.bool(np.allclose(a.cpu()._np, b.cpu()._np, rtol=rtol, atol=atol))


def manual_seed(seed):
    np.random.seed(seed)


class _Npu:
    """`torch.npu`: ACL's device calls."""

    @staticmethod
    def set_device(dev):
        idx = dev if isinstance(dev, builtins_int) else (device(dev).index or 0)
        _check(_acl().aclrtSetDevice(ctypes.c_int32(idx)), "aclrtSetDevice")

    @staticmethod
    def current_device():
        d = ctypes.c_int32(-1)
        _check(_acl().aclrtGetDevice(ctypes.byref(d)), "aclrtGetDevice")
        return d.value

    @staticmethod
    def device_count():
        n = ctypes.c_uint32(0)
        _check(_acl().aclrtGetDeviceCount(ctypes.byref(n)), "aclrtGetDeviceCount")
        return n.value

    @staticmethod
    def synchronize(*args):
        _check(_acl().aclrtSynchronizeDevice(), "aclrtSynchronizeDevice")

    @staticmethod
    def is_available():
        try:
            _acl()
            return True
        except OSError:
            return False


npu = _Npu()
