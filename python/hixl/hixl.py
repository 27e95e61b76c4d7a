"""CANN HIXL's module path: ``from hixl.hixl import ...`` and ``import hixl.hixl`` work as with
CANN's package (whose ``hixl/__init__.py`` re-exports its native ``hixl.hixl``). Everything here
is the flat layer of :mod:`hixl` (hixl's native extension ``hixl._hixl``)."""

from ._hixl import *  # noqa: F401,F403
