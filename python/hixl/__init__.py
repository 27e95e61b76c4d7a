"""hixl: one-sided memory transfer (READ/WRITE) between processes.

Two layers in one module:

* the flat layer, exactly CANN HIXL's Python API (its pybind module ``hixl``): the status ints
  (``hixl.SUCCESS`` ...), the ``OPTION_*`` strings, the enums (``hixl.MemType``, ``hixl.READ``
  ...), the data classes (``hixl.MemDesc``, ``hixl.TransferOpDesc`` ...) and ``hixl.Hixl`` whose
  methods return status ints or ``(status, value)`` tuples;
* the Pythonic layer, ``hixl.Engine``: exceptions instead of status ints, registration of Python
  objects (buffer protocol, or ``data_ptr()``/``nbytes``) kept alive while registered, links and
  requests as objects, ``asyncio`` support, context managers.

Both run on hixl's runtime-checked compat engine (``hixl::compat`` in Rust).
"""

from ._hixl import *  # noqa: F401,F403  (the flat layer: CANN's names)
from ._hixl import (  # noqa: F401  (explicit, for linters and readers)
    AsyncConnectStatus,
    FeatureType,
    GetTransferStatusArgs,
    Hixl,
    HostMem,
    MemDesc,
    MemType,
    NotifyDesc,
    TransferArgs,
    TransferOp,
    TransferOpDesc,
    TransferResult,
    TransferStatus,
    get_capability,
    last_error_message,
)
from ._engine import (  # noqa: F401
    AlreadyConnectedError,
    Engine,
    FailedError,
    HixlError,
    HixlTimeoutError,
    HostBuffer,
    Link,
    NotConnectedError,
    NotifyFailedError,
    ParamInvalidError,
    Region,
    RemoteRegion,
    Request,
    ResourceExhaustedError,
    UnsupportedError,
)

__version__ = "0.1.0"
