"""Element types (CANN's ``llm_datadist.data_type``): ``DataType`` over GE's numeric values, the
14 members CANN's package has."""

from enum import Enum


class DataType(Enum):
    """A tensor element type (``ge::DataType`` values)."""

    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_BF16 = 27
    DT_INT8 = 2
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT8 = 4
    DT_INT32 = 3
    DT_INT64 = 9
    DT_UINT32 = 8
    DT_UINT64 = 10
    DT_BOOL = 12
    DT_DOUBLE = 11
    DT_STRING = 13

    def __str__(self):
        return f"{self.__class__.__name__}.{self.name}"


_NP_NAMES = {
    DataType.DT_FLOAT: "float32",
    DataType.DT_FLOAT16: "float16",
    DataType.DT_INT8: "int8",
    DataType.DT_INT16: "int16",
    DataType.DT_UINT16: "uint16",
    DataType.DT_UINT8: "uint8",
    DataType.DT_INT32: "int32",
    DataType.DT_INT64: "int64",
    DataType.DT_UINT32: "uint32",
    DataType.DT_UINT64: "uint64",
    DataType.DT_BOOL: "bool",
    DataType.DT_DOUBLE: "float64",
}


def dtype_to_np_dtype(data_type: DataType):
    """The numpy dtype of a ``DataType`` (numpy is imported only here; ``DT_BF16`` and
    ``DT_STRING`` have none: ``KeyError``)."""
    import numpy as np

    return np.dtype(_NP_NAMES[data_type])


def get_python_dtype_from_wrapper_dtype(wrapper_dtype):
    """The ``DataType`` of a GE value."""
    return DataType(int(wrapper_dtype))
