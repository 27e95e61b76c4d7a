"""The Pythonic layer over the flat (CANN) API: ``Engine``, ``Region``, ``Link``, ``Request``.

Errors are exceptions (``HixlError`` and one subclass per status), timeouts are seconds, memory is
registered as Python objects (kept referenced, and their buffer kept exported, while registered,
so Python can neither free nor resize them underneath a transfer), descriptors are
``(local_addr, remote_addr, len)`` triples (a list, or an ``(N, 3)`` integer numpy array).
"""

import array
import asyncio
import ctypes
import math
import threading
import time
import weakref
from collections import namedtuple

from . import _hixl as _n

__all__ = [
    "Engine",
    "Region",
    "HostBuffer",
    "Link",
    "Request",
    "RemoteRegion",
    "HixlError",
    "ParamInvalidError",
    "HixlTimeoutError",
    "NotConnectedError",
    "AlreadyConnectedError",
    "NotifyFailedError",
    "UnsupportedError",
    "ResourceExhaustedError",
    "FailedError",
]

_STATUS_NAMES = {
    _n.SUCCESS: "SUCCESS",
    _n.PARAM_INVALID: "PARAM_INVALID",
    _n.TIMEOUT: "TIMEOUT",
    _n.NOT_CONNECTED: "NOT_CONNECTED",
    _n.ALREADY_CONNECTED: "ALREADY_CONNECTED",
    _n.NOTIFY_FAILED: "NOTIFY_FAILED",
    _n.UNSUPPORTED: "UNSUPPORTED",
    _n.FAILED: "FAILED",
    _n.RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
}


class HixlError(Exception):
    """A call the engine refused or that failed: ``.status`` is HIXL's status int."""

    status = _n.FAILED

    def __init__(self, status, message=""):
        self.status = status
        self.message = message
        name = _STATUS_NAMES.get(status, str(status))
        super().__init__(f"{name} ({status}): {message}" if message else f"{name} ({status})")


class ParamInvalidError(HixlError, ValueError):
    """``PARAM_INVALID``: a bad argument (an address outside every registered region, ...)."""


class HixlTimeoutError(HixlError, TimeoutError):
    """``TIMEOUT``: the call (or a wait) did not finish in time."""


class NotConnectedError(HixlError, ConnectionError):
    """``NOT_CONNECTED``: no usable link to the remote (never connected, or the peer went away)."""


class AlreadyConnectedError(HixlError):
    """``ALREADY_CONNECTED``."""


class NotifyFailedError(HixlError):
    """``NOTIFY_FAILED`` (103904): reserved by HIXL and never returned; kept so that every
    status code maps to a class."""


class UnsupportedError(HixlError):
    """``UNSUPPORTED``: e.g. device memory where CANN does not load."""


class ResourceExhaustedError(HixlError):
    """``RESOURCE_EXHAUSTED``."""


class FailedError(HixlError):
    """``FAILED``: anything else (an unreachable peer, a failed request, a finalized engine)."""


_ERRORS = {
    _n.PARAM_INVALID: ParamInvalidError,
    _n.TIMEOUT: HixlTimeoutError,
    _n.NOT_CONNECTED: NotConnectedError,
    _n.ALREADY_CONNECTED: AlreadyConnectedError,
    _n.NOTIFY_FAILED: NotifyFailedError,
    _n.UNSUPPORTED: UnsupportedError,
    _n.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    _n.FAILED: FailedError,
}


def _error(status, message=None):
    if message is None:
        message = _n.last_error_message()
    return _ERRORS.get(status, HixlError)(status, message)


def _check(ret):
    if ret != _n.SUCCESS:
        raise _error(ret)


def _millis(seconds, what="timeout"):
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    # (inf and nan are out of range too, and a finite number whose milliseconds are not
    # (1e306 s), not an OverflowError)
    ms = int(round(seconds * 1000)) if math.isfinite(seconds * 1000) else 0
    if not 0 < ms <= 2**31 - 1:
        raise ValueError(f"{what} must be between 1 ms and about 24 days, got {seconds!r} s")
    return ms


def _op(op):
    if isinstance(op, str):
        try:
            return {"read": _n.READ, "write": _n.WRITE}[op.lower()]
        except KeyError:
            raise ValueError(f"op must be 'read' or 'write', not {op!r}") from None
    if isinstance(op, _n.TransferOp):
        return op
    raise TypeError(f"op must be hixl.READ / hixl.WRITE or 'read' / 'write', not {op!r}")


def _pack(descs):
    """Descriptors as native u64 triples: from an (N, 3) integer array, or an iterable of
    ``(local_addr, remote_addr, len)`` / ``TransferOpDesc``."""
    if hasattr(descs, "__array_interface__") and hasattr(descs, "dtype"):
        import numpy as np  # only reached with a numpy array

        a = np.asarray(descs)
        if a.ndim != 2 or a.shape[1] != 3 or a.dtype.kind not in "iu":
            raise ValueError("descriptors must be an (N, 3) integer array")
        if a.dtype.kind == "i" and a.size and a.min() < 0:
            raise ValueError("descriptors must not be negative")
        packed = np.ascontiguousarray(a, dtype=np.uint64).tobytes()
    else:
        if isinstance(descs, (str, bytes)):
            raise TypeError("descriptors must be (local_addr, remote_addr, len) triples")
        flat = array.array("Q")
        try:
            for d in descs:
                if isinstance(d, _n.TransferOpDesc):
                    flat.extend((d.local_addr, d.remote_addr, d.len))
                    continue
                if len(d) != 3:
                    raise ValueError("a descriptor is a (local_addr, remote_addr, len) triple")
                flat.extend(d)
        except OverflowError:
            raise ValueError("descriptor values must be in 0..2**64-1") from None
        packed = flat.tobytes()
    if not packed:
        raise ValueError("no descriptors")
    return packed


def _indices(idx, what):
    """(native bytes, width) of block indices: a 1-D numpy array of unsigned (or non-negative
    signed) 32- or 64-bit integers, any buffer of unsigned 4- or 8-byte items (``array('I')``,
    ``array('Q')``, a memoryview), or a sequence of ints. One copy, no Python object per index
    (but for a sequence of ints, which has them already)."""
    if hasattr(idx, "__array_interface__") and hasattr(idx, "dtype"):
        import numpy as np  # only reached with a numpy array

        a = np.asarray(idx)
        if a.ndim != 1:
            raise ValueError(f"{what} must be a 1-D array")
        if a.dtype.kind == "i" and a.itemsize in (4, 8):
            if a.size and a.min() < 0:
                raise ValueError(f"{what} must not be negative")
            a = a.astype(np.uint32 if a.itemsize == 4 else np.uint64)  # values, native order
        if a.dtype.kind != "u" or a.itemsize not in (4, 8):
            raise TypeError(f"{what} must hold 32- or 64-bit integers, not {a.dtype}")
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))  # the engine reads native byte order
        return np.ascontiguousarray(a).tobytes(), a.itemsize
    if isinstance(idx, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be an array of integers, not {type(idx).__name__}")
    try:
        mv = memoryview(idx)
    except TypeError:
        mv = None
    if mv is not None:
        fmt = mv.format.lstrip("@=")
        if mv.ndim != 1 or fmt not in ("I", "L", "Q") or mv.itemsize not in (4, 8):
            raise TypeError(f"{what}: a buffer of unsigned 4- or 8-byte integers, not {mv.format!r}")
        return mv.tobytes(), mv.itemsize
    try:
        return array.array("Q", idx).tobytes(), 8
    except (OverflowError, TypeError):
        raise ValueError(f"{what} must be integers in 0..2**64-1") from None


RemoteRegion = namedtuple("RemoteRegion", "addr len mem_type readable writable transport")
RemoteRegion.__doc__ = """One region of a peer's table, as it sent it at connect, and the transport that moves it
(``"same-host"`` for a same-host peer's ``Engine.alloc`` buffers, ``"tcp"`` for memory it
registered)."""


def _buffer_of(obj):
    """(address, nbytes, keep-alive, MemType) of a Python object."""
    if isinstance(obj, (bytes, str)):
        raise TypeError(f"{type(obj).__name__} is immutable: register a writable buffer")
    if hasattr(obj, "data_ptr") and hasattr(obj, "nbytes") and not hasattr(obj, "__array_interface__"):
        # a torch tensor (duck-typed, no torch dependency)
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("register a contiguous tensor")
        addr, n = obj.data_ptr(), obj.nbytes
        if not isinstance(addr, int) or not isinstance(n, int):
            raise TypeError("data_ptr() and nbytes must be ints")
        device = getattr(getattr(obj, "device", None), "type", "cpu")
        mem = _n.MEM_HOST if device == "cpu" else _n.MEM_DEVICE
        if n <= 0:
            raise ValueError("cannot register an empty object")
        return addr, n, obj, mem
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"register() needs a writable buffer (bytearray, memoryview, numpy array) or an "
            f"object with data_ptr() and nbytes, not {type(obj).__name__}"
        ) from None
    if mv.readonly:
        raise ValueError("the buffer is read-only: register a writable one")
    if not mv.c_contiguous:
        raise ValueError("the buffer is not contiguous")
    if mv.nbytes == 0:
        raise ValueError("cannot register an empty buffer")
    flat = mv.cast("B") if (mv.ndim != 1 or mv.format != "B") else mv
    # a ctypes view holds the buffer exported: the exporter cannot resize or free it while we
    # keep it (a bytearray refuses to resize with BufferError)
    view = (ctypes.c_char * flat.nbytes).from_buffer(flat)
    return ctypes.addressof(view), flat.nbytes, (obj, mv, flat, view), _n.MEM_HOST


class Region:
    """A registered object. ``addr`` / ``nbytes`` are its range; ``obj`` (read-only) the object
    kept alive."""

    def __init__(self, engine, handle, addr, nbytes, obj, keep):
        self.engine = engine
        self.handle = handle
        self.addr = addr
        self.nbytes = nbytes
        self._obj = obj
        self._keep = keep

    @property
    def obj(self):
        """The registered object (for a ``HostBuffer``: the ctypes array over its memory)."""
        return self._obj

    def ptr(self, offset=0):
        """The address ``offset`` bytes into the region."""
        if not 0 <= offset < self.nbytes:
            raise ValueError(f"offset {offset} outside the region ({self.nbytes} bytes)")
        return self.addr + offset

    def deregister(self):
        """Deregister (the object is released only if that succeeds)."""
        self.engine.deregister(self)

    def __len__(self):
        return self.nbytes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._keep is not None and self.engine._h is not None:
            self.deregister()

    def __repr__(self):
        return f"<hixl.Region handle={self.handle} addr={self.addr:#x} nbytes={self.nbytes}>"


class HostBuffer(Region):
    """Host memory the engine allocated and registered (``Engine.alloc``): the same-host fast
    path. A peer on this host maps it and moves data with a memory copy, while memory Python
    allocates (``Engine.register``) is served to it over TCP.

    Zero-copy views: ``buf.numpy(dtype)`` (or ``np.asarray(buf)``, ``np.frombuffer(buf.obj)``),
    ``buf.memoryview()``; ``buf.obj`` (read-only) is a ctypes ``c_char`` array over the memory.
    No view can outlive the memory, whatever the program does with this object: the memory is
    kept by the ctypes array's own lifetime (a finalizer holds it until the array is
    collected), and every numpy array, memoryview or ctypes view made from the buffer holds
    that array through CPython's buffer exports, which Python code cannot reach.
    ``deregister()`` (or closing the engine) only stops serving it: this engine's transfers and
    peers' TCP requests refuse it, and if a same-host peer may have mapped it, the buffer's
    pages are replaced in place by a private copy first, so no peer reaches what the views
    show any more. The engine frees the memory once the buffer and every view of it are gone
    and no same-host link can reach the pages it shared."""

    def __init__(self, engine, mem):
        view = (ctypes.c_char * mem.nbytes).from_address(mem.addr)
        # the memory lives as long as `view` does: the finalizer holds `mem` until `view` is
        # collected, and every view made from `view` keeps `view` (a buffer export)
        # (and not at interpreter exit: a view may still be used there, by an atexit function,
        # a daemon thread or a __del__; the memory goes with the process)
        weakref.finalize(view, _keep_until_collected, mem).atexit = False
        super().__init__(engine, mem.handle, mem.addr, mem.nbytes, view, mem)

    def numpy(self, dtype=None):
        """A numpy array over the memory (zero copy; ``uint8`` unless ``dtype`` is given)."""
        import numpy as np

        return np.frombuffer(self._obj, dtype=np.uint8 if dtype is None else dtype)

    def memoryview(self):
        """A writable ``memoryview`` of the bytes (format ``B``)."""
        return memoryview(self._obj).cast("B")

    def __array__(self, dtype=None, copy=None):
        # `np.asarray(buf)`: a view whose base is the ctypes array (through its buffer), never
        # this object, so the array's lifetime holds the memory by itself
        import numpy as np

        a = np.frombuffer(self._obj, dtype=np.uint8)
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __buffer__(self, flags):  # Python >= 3.12 (PEP 688): np.frombuffer(buf), memoryview(buf)
        return memoryview(self._obj).cast("B")

    def __repr__(self):
        return f"<hixl.HostBuffer handle={self.handle} addr={self.addr:#x} nbytes={self.nbytes}>"


def _keep_until_collected(mem):
    """A ``HostBuffer``'s finalizer: its only job was to hold ``mem`` until now."""
    del mem


class Request:
    """An async transfer: ``status()``, ``done()``, ``wait(timeout)``, ``cancel()``, ``await``."""

    def __init__(self, link, req):
        self.link = link
        self.req = req
        self._h = link.engine._h
        self._final = None
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)
        # native queries under way: the engine reports a final status once, to one of them
        self._asking = 0

    def _ask(self, query):
        """One native status query (``query()``: ``(ret, status)``), without the lock (a
        cancel() from another thread must not wait for it). The engine forgets a request once
        it reported its end, so a query that finds it unknown while another is under way waits
        for that one to record what it got."""
        with self._lock:
            if self._final is not None:
                return self._final
            self._asking += 1
        ret, st = _n.FAILED, None
        try:
            ret, st = query()
        finally:
            with self._lock:
                self._asking -= 1
                if ret != _n.SUCCESS:
                    self._recorded.wait_for(lambda: self._final is not None or self._asking == 0)
                self._recorded.notify_all()
        with self._lock:
            return self._record(ret, st)

    def _record(self, ret, st):
        if ret != _n.SUCCESS:
            if self._final is not None:
                return self._final
            raise _error(ret)
        if st != _n.TransferStatus.WAITING:
            self._final = st
            self._recorded.notify_all()
        return st

    def status(self):
        """The request's ``TransferStatus`` (a terminal one is remembered)."""
        return self._ask(lambda: self._h.get_transfer_status(self.req))

    def done(self):
        """Whether it ended (completed, timed out, failed or cancelled)."""
        return self.status() != _n.TransferStatus.WAITING

    def wait(self, timeout=None):
        """Wait for the end (without the GIL); raise if it did not complete. ``timeout`` in
        seconds (``None``: until the engine's deadline for the request). A wait that runs out
        raises ``HixlTimeoutError`` and leaves the request running."""
        # (math.inf: no limit, as None)
        deadline = None if timeout is None or timeout == math.inf else time.monotonic() + timeout
        while True:
            st = self._final
            if st is None:
                left = 1000 if deadline is None else (deadline - time.monotonic()) * 1000
                ms = max(0, min(1000, int(left)))
                st = self._ask(lambda: self._h.wait_transfer(self.req, ms))
            if st == _n.TransferStatus.COMPLETED:
                return
            if st == _n.TransferStatus.TIMEOUT:
                raise HixlTimeoutError(_n.TIMEOUT, "the request reached its deadline")
            if st == _n.TransferStatus.FAILED:
                raise FailedError(_n.FAILED, "the request failed (or was cancelled)")
            if deadline is not None and time.monotonic() >= deadline:
                raise HixlTimeoutError(_n.TIMEOUT, f"still running after {timeout} s")

    def cancel(self):
        """Ask the engine to stop it: queued descriptors are skipped, a running one is cut.
        The request then ends ``FAILED`` (or ``COMPLETED`` if the data had moved); ``wait``
        for its end before reusing the buffers. Returns whether a request was still there."""
        with self._lock:
            if self._final is not None:
                return False
            return self._h.cancel_transfer(self.req) == _n.SUCCESS

    def __await__(self):
        loop = asyncio.get_event_loop()
        return (yield from loop.run_in_executor(None, self.wait).__await__())

    def __repr__(self):
        return f"<hixl.Request {self.req} {self._final or 'pending'}>"


class Link:
    """The link to one remote engine (by name). Descriptors are ``(local_addr, remote_addr,
    len)`` triples: a list, or an ``(N, 3)`` integer numpy array."""

    def __init__(self, engine, remote):
        self.engine = engine
        self.remote = remote

    def transfer(self, op, descs, timeout=1.0):
        """READ (remote → local) or WRITE (local → remote) a batch; returns when done."""
        h = self.engine._handle()
        _check(h._transfer_sync_packed(self.remote, _op(op), _pack(descs), _millis(timeout)))

    def read(self, descs, timeout=1.0):
        """``transfer(hixl.READ, ...)``."""
        self.transfer(_n.READ, descs, timeout)

    def write(self, descs, timeout=1.0):
        """``transfer(hixl.WRITE, ...)``."""
        self.transfer(_n.WRITE, descs, timeout)

    def transfer_async(self, op, descs, user_data=0):
        """Start a batch; returns a ``Request``."""
        h = self.engine._handle()
        ret, req = h._transfer_async_packed(self.remote, _op(op), _pack(descs), user_data)
        _check(ret)
        return Request(self, req)

    def read_async(self, descs, user_data=0):
        """``transfer_async(hixl.READ, ...)``."""
        return self.transfer_async(_n.READ, descs, user_data)

    def write_async(self, descs, user_data=0):
        """``transfer_async(hixl.WRITE, ...)``."""
        return self.transfer_async(_n.WRITE, descs, user_data)

    def transfer_blocks(self, op, local_addr, remote_addr, block_size, local_idx, remote_idx,
                        *, local_stride=0, remote_stride=0, timeout=1.0):
        """Block-indexed READ or WRITE (beyond HIXL): block ``i`` (``block_size`` bytes) moves
        between ``local_addr + local_idx[i] * local_stride`` and ``remote_addr + remote_idx[i]
        * remote_stride`` (a stride of 0: the block size). The index arrays are numpy arrays
        (uint32/uint64, or non-negative int32/int64), other buffers of unsigned 4- or 8-byte
        items, or sequences of ints, of the same length; the call is checked once (each side's
        largest index against its region), with no Python object per block."""
        h = self.engine._handle()
        (l, lw), (r, rw) = _indices(local_idx, "local_idx"), _indices(remote_idx, "remote_idx")
        desc = (local_addr, remote_addr, block_size, local_stride, remote_stride)
        _check(h._transfer_blocks_sync_packed(self.remote, _op(op), desc, l, lw, r, rw, _millis(timeout)))

    def read_blocks(self, *args, **kw):
        """``transfer_blocks(hixl.READ, ...)``."""
        self.transfer_blocks(_n.READ, *args, **kw)

    def write_blocks(self, *args, **kw):
        """``transfer_blocks(hixl.WRITE, ...)``."""
        self.transfer_blocks(_n.WRITE, *args, **kw)

    def transfer_blocks_async(self, op, local_addr, remote_addr, block_size, local_idx,
                              remote_idx, *, local_stride=0, remote_stride=0, user_data=0):
        """Start a block-indexed batch (``transfer_blocks``); returns a ``Request``. The indices
        are copied: the arrays may change once this returns."""
        h = self.engine._handle()
        (l, lw), (r, rw) = _indices(local_idx, "local_idx"), _indices(remote_idx, "remote_idx")
        desc = (local_addr, remote_addr, block_size, local_stride, remote_stride)
        ret, req = h._transfer_blocks_async_packed(self.remote, _op(op), desc, l, lw, r, rw, user_data)
        _check(ret)
        return Request(self, req)

    def notify(self, name, msg="", timeout=1.0):
        """Send a notification, delivered after every transfer started before it."""
        _check(self.engine._handle().send_notify(self.remote, _n.NotifyDesc(name, msg), _millis(timeout)))

    def remote_regions(self):
        """The peer's region table as it sent it at connect: ``RemoteRegion``s by address."""
        ret, regions = self.engine._handle().remote_regions(self.remote)
        _check(ret)
        return [RemoteRegion(*r) for r in regions]

    def transport(self):
        """``"tcp"``, ``"same-host"`` (one-sided), ``"ucx"`` or ``"ascend"``."""
        ret, t = self.engine._handle().transport(self.remote)
        _check(ret)
        return t

    def close(self, timeout=1.0):
        """Disconnect (telling the peer). Closing a link that is gone already is fine."""
        if self.engine._h is None:
            return
        ret = self.engine._h.disconnect(self.remote, _millis(timeout))
        if ret not in (_n.SUCCESS, _n.NOT_CONNECTED):
            raise _error(ret)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<hixl.Link to {self.remote}>"


class Engine:
    """An engine: ``Engine("127.0.0.1:0")`` listens on an ephemeral port (``.name`` is the name
    peers connect to); ``Engine("127.0.0.1")`` is a client only. ``auto_connect=True`` connects
    on demand (HIXL's ``AutoConnect``). Use it as a context manager, or call ``close()``."""

    def __init__(self, local_engine="127.0.0.1:0", options=None, *, auto_connect=None):
        opts = {str(k): str(v) for k, v in dict(options or {}).items()}
        if auto_connect is not None:
            opts[_n.OPTION_AUTO_CONNECT] = "1" if auto_connect else "0"
        self._regions = {}
        self._pending_notifies = []
        self._lock = threading.Lock()
        h = _n.Hixl()
        _check(h.initialize(local_engine, opts))
        ret, self.name = h.local_engine()
        _check(ret)
        self._h = h

    @property
    def hixl(self):
        """The flat ``hixl.Hixl`` underneath (CANN's API), for calls this layer does not wrap."""
        return self._handle()

    def _handle(self):
        h = self._h
        if h is None:
            raise FailedError(_n.FAILED, "the engine is closed")
        return h

    def register(self, obj, *, local_only=False):
        """Register a writable buffer (bytearray, memoryview, numpy array) or an object with
        ``data_ptr()`` and ``nbytes`` (a torch tensor; on a device: ``UnsupportedError`` without
        an Ascend runtime). The object stays referenced (and its buffer exported) until
        deregistered or the engine closes. Register everything before connecting."""
        addr, n, keep, mem = _buffer_of(obj)
        desc = _n.MemDesc(addr, n)
        desc.local_only = bool(local_only)
        ret, handle = self._handle().register_mem(desc, mem)
        _check(ret)
        region = Region(self, handle, addr, n, obj, keep)
        with self._lock:
            self._regions[handle] = region
        return region

    def alloc(self, nbytes):
        """Allocate ``nbytes`` zeroed, page-aligned bytes of host memory owned by the engine and
        register them: a ``HostBuffer`` (a ``Region`` with zero-copy numpy and memoryview views).
        Peers on this host reach it one-sidedly, with no work by this process (memory of
        ``register`` goes to them over TCP). ``deregister(buf)`` or ``close()`` ends the
        registration; views keep the memory alive after it. Links may exist."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
        ret, mem = self._handle().alloc_host_mem(nbytes)
        _check(ret)
        buf = HostBuffer(self, mem)
        with self._lock:
            self._regions[buf.handle] = buf
        return buf

    def deregister(self, region):
        """Deregister a region; the object is released once that succeeded (a ``HostBuffer``'s
        memory lives on while the buffer or a view of it does)."""
        if not isinstance(region, Region) or region.engine is not self:
            raise TypeError("deregister() takes a Region of this engine")
        h = self._handle()
        with self._lock:
            registered = region.handle in self._regions
        if not registered:
            # (CANN's deregister_mem takes an unknown handle as SUCCESS; a Region knows)
            raise _error(_n.PARAM_INVALID, f"{region!r} is not registered (deregistered already)")
        _check(h.deregister_mem(region.handle))
        with self._lock:
            self._regions.pop(region.handle, None)
        region._keep = None

    def connect(self, remote, timeout=1.0):
        """Connect to ``remote`` (its ``name``); returns the ``Link``."""
        _check(self._handle().connect(remote, _millis(timeout)))
        return Link(self, remote)

    def link(self, remote):
        """A ``Link`` to ``remote`` without connecting: with ``auto_connect``, or after
        ``hixl.connect_async``, or when already connected."""
        if not isinstance(remote, str):
            raise TypeError("remote must be a str")
        return Link(self, remote)

    def notifies(self):
        """Every notification received so far, oldest first, as ``(name, msg)`` pairs."""
        ret, got = self._handle().get_notifies()
        _check(ret)
        with self._lock:
            out = self._pending_notifies + [(n.name, n.notify_msg) for n in got]
            self._pending_notifies = []
        return out

    def wait_notify(self, name=None, timeout=10.0):
        """Wait (polling) for a notification (with this name, if given); returns ``(name, msg)``.
        Others received meanwhile stay for ``notifies()``. ``timeout`` as every timeout here
        (``ValueError`` out of range: a NaN or infinite one never ended)."""
        deadline = time.monotonic() + _millis(timeout) / 1000
        pause = 0.0001
        while True:
            got = self.notifies()
            hit = None
            for i, n in enumerate(got):
                if name is None or n[0] == name:
                    hit = got.pop(i)
                    break
            with self._lock:
                self._pending_notifies = got + self._pending_notifies
            if hit is not None:
                return hit
            if time.monotonic() >= deadline:
                raise HixlTimeoutError(_n.TIMEOUT, f"no notification {name!r} within {timeout} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def close(self):
        """Finalize: links close, requests end, serving stops; then registered objects are
        released. Safe twice."""
        h, self._h = self._h, None
        if h is not None:
            h.finalize()
        with self._lock:
            for r in self._regions.values():
                r._keep = None
            self._regions.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return f"<hixl.Engine {self.name}{' closed' if self._h is None else ''}>"
