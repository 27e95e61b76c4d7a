"""The package's logger (CANN's ``llm_datadist.utils.log``): on stdout, at the level
``ASCEND_GLOBAL_LOG_LEVEL`` names (0 DEBUG, 1 INFO, 2 WARNING, 3 ERROR; ERROR by default)."""

import logging
import os
import sys

_LEVELS = {"0": logging.DEBUG, "1": logging.INFO, "2": logging.WARNING, "3": logging.ERROR}
_logger = None


def get_logger():
    """The logger ``llm_datadist``, configured once."""
    global _logger
    if _logger is None:
        lg = logging.getLogger("llm_datadist")
        lg.setLevel(_LEVELS.get(os.environ.get("ASCEND_GLOBAL_LOG_LEVEL", "3"), logging.ERROR))
        if not lg.handlers:
            h = logging.StreamHandler(sys.stdout)
            h.setFormatter(logging.Formatter("[%(levelname)s] LLMDATADIST(%(process)d) %(message)s"))
            lg.addHandler(h)
        lg.propagate = False
        _logger = lg
    return _logger


def info(msg, *args, **kwargs):
    get_logger().info(msg, *args, **kwargs)


def warn(msg, *args, **kwargs):
    get_logger().warning(msg, *args, **kwargs)


def error(msg, *args, **kwargs):
    get_logger().error(msg, *args, **kwargs)


def debug(msg, *args, **kwargs):
    get_logger().debug(msg, *args, **kwargs)
