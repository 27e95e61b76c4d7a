"""Status codes and the exception (CANN's ``llm_datadist.status``): ``LLMStatusCode`` has
CANN's names and numeric values (``LLM_PARAM_INVALID`` = 0x5010B005 ...), ``LLMException`` (a
``RuntimeError``) carries one as ``status_code``."""

from enum import IntEnum

from hixl._hixl import datadist as _native
from hixl._hixl import last_error_message as _last_error_message
from llm_datadist.utils import log


class LLMStatusCode(IntEnum):
    """LLM-DataDist's status codes."""

    LLM_SUCCESS = _native.LLM_SUCCESS
    LLM_FAILED = _native.LLM_FAILED
    LLM_PARAM_INVALID = _native.LLM_PARAM_INVALID
    LLM_WAIT_PROCESS_TIMEOUT = _native.LLM_WAIT_PROC_TIMEOUT
    LLM_KV_CACHE_NOT_EXIST = _native.LLM_KV_CACHE_NOT_EXIST
    LLM_REPEAT_REQUEST = _native.LLM_REPEAT_REQUEST
    LLM_REQUEST_ALREADY_COMPLETED = _native.LLM_REQUEST_ALREADY_COMPLETED
    LLM_ENGINE_FINALIZED = _native.LLM_ENGINE_FINALIZED
    LLM_NOT_YET_LINK = _native.LLM_NOT_YET_LINK
    LLM_ALREADY_LINK = _native.LLM_ALREADY_LINK
    LLM_LINK_FAILED = _native.LLM_LINK_FAILED
    LLM_UNLINK_FAILED = _native.LLM_UNLINK_FAILED
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = _native.LLM_NOTIFY_PROMPT_UNLINK_FAILED
    LLM_CLUSTER_NUM_EXCEED_LIMIT = _native.LLM_CLUSTER_NUM_EXCEED_LIMIT
    LLM_PROCESSING_LINK = _native.LLM_PROCESSING_LINK
    LLM_DEVICE_OUT_OF_MEMORY = _native.LLM_DEVICE_OUT_OF_MEMORY
    LLM_PREFIX_ALREADY_EXIST = _native.LLM_PREFIX_ALREADY_EXIST
    LLM_PREFIX_NOT_EXIST = _native.LLM_PREFIX_NOT_EXIST
    LLM_SEQ_LENOVERLIMIT = _native.LLM_SEQ_LEN_OVER_LIMIT  # CANN's spelling
    LLM_NO_FREE_BLOCK = _native.LLM_NO_FREE_BLOCK
    LLM_BLOCKS_OUT_OF_MEMORY = _native.LLM_BLOCKS_OUT_OF_MEMORY
    LLM_CACHE_INCOMPATIBLE = _native.LLM_CACHE_INCOMPATIBLE
    LLM_CACHE_KEY_ALREADY_EXIST = _native.LLM_CACHE_KEY_ALREADY_EXIST
    LLM_COPY_CACHE_FAILED = _native.LLM_COPY_CACHE_FAILED
    LLM_CACHE_ID_ALREADY_EXIST = _native.LLM_CACHE_ID_ALREADY_EXIST
    LLM_EXIST_LINK = _native.LLM_EXIST_LINK
    LLM_FEATURE_NOT_ENABLED = _native.LLM_FEATURE_NOT_ENABLED
    LLM_TIMEOUT = _native.LLM_TIMEOUT
    LLM_LINK_BUSY = _native.LLM_LINK_BUSY
    LLM_OUT_OF_MEMORY = _native.LLM_OUT_OF_MEMORY
    LLM_DEVICE_MEM_ERROR = 507053  # ACL_ERROR_RT_DEVICE_MEM_ERROR
    LLM_SUSPECT_REMOTE_ERROR = 507057  # ACL_ERROR_RT_SUSPECT_REMOTE_ERROR
    LLM_UNKNOWN_ERROR = -1

    def __str__(self):
        return f"{self.__class__.__name__}.{self.name}"


class LLMException(RuntimeError):
    """A failed LLM-DataDist call; ``status_code`` is its ``LLMStatusCode``."""

    def __init__(self, *args, status_code=LLMStatusCode.LLM_SUCCESS):
        super().__init__(*args)
        self._status_code = status_code

    @property
    def status_code(self):
        """The status code of the failure."""
        return self._status_code


class Status:
    """A status code with ``is_ok()``."""

    def __init__(self, status):
        self._status_code = status

    def is_ok(self):
        return self._status_code == LLMStatusCode.LLM_SUCCESS

    @property
    def status_code(self):
        return self._status_code


_BY_VALUE = {int(s): s for s in LLMStatusCode}


def code_2_status(status) -> LLMStatusCode:
    """The ``LLMStatusCode`` of a native code (``LLM_FAILED`` for one LLM-DataDist does not
    name, as CANN's)."""
    return _BY_VALUE.get(int(status), LLMStatusCode.LLM_FAILED)


def handle_llm_status(status, func_name, other_info):
    """Raises ``LLMException`` for a native status other than success, with the native
    layer's reason."""
    if int(status) != int(LLMStatusCode.LLM_SUCCESS):
        code = code_2_status(status)
        why = _last_error_message()
        raise LLMException(f"{func_name} failed, error code is {code}, {other_info}. {why}",
                           status_code=code)


def raise_if_false(pred, fmt, *args, status_code=LLMStatusCode.LLM_PARAM_INVALID, **kwargs):
    if not pred:
        msg = fmt.format(*args, **kwargs)
        log.error(msg)
        raise LLMException(msg, status_code=status_code)


def raise_if_true(pred, fmt, *args, status_code=LLMStatusCode.LLM_PARAM_INVALID, **kwargs):
    raise_if_false(not pred, fmt, *args, status_code=status_code, **kwargs)
