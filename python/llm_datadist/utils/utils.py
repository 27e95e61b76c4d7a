"""Argument checks (CANN's ``llm_datadist.utils.utils``): each raises ``LLMException`` with
``LLM_PARAM_INVALID`` for a bad value, as CANN's do."""

from llm_datadist.status import raise_if_false


def _type_names(classes):
    return "|".join(c.__name__ for c in classes)


def check_isinstance(arg_name, arg_value, classes, inner_class=None, extra_fmt="", allow_none=True):
    """`arg_value` is an instance of `classes` (a class or a list of them), or `None` where
    allowed; with `inner_class`, each item of it is one too. `bool` is not an `int` here."""
    if arg_value is None and allow_none:
        return
    if not isinstance(classes, (list, tuple)):
        classes = [classes]
    ok = isinstance(arg_value, tuple(classes))
    if ok and isinstance(arg_value, bool) and bool not in classes:
        ok = False
    raise_if_false(
        ok,
        "{0} should be {1}, but got {2}{3}",
        arg_name,
        _type_names(classes),
        type(arg_value).__name__,
        extra_fmt,
    )
    if inner_class is not None:
        check_inner(arg_name, arg_value, inner_class)


def check_inner(arg_name, arg_value, inner_class):
    for i, item in enumerate(arg_value):
        ok = isinstance(item, inner_class) and not (isinstance(item, bool) and inner_class is not bool)
        raise_if_false(ok, "{0}[{1}] should be {2}, but got {3}", arg_name, i, inner_class.__name__,
                       type(item).__name__)


def check_dict(arg_name, arg_value, k_class, v_class, v_inner_class=None):
    for k, v in arg_value.items():
        check_isinstance(f"{arg_name} key", k, k_class, allow_none=False)
        check_isinstance(f"{arg_name}[{k!r}]", v, v_class, v_inner_class, allow_none=False)


def _check_range(arg_name, arg_value, lo, hi, what):
    check_isinstance(arg_name, arg_value, int, allow_none=False)
    raise_if_false(lo <= arg_value <= hi, "{0} ({1}) should be in the range of {2} [{3}, {4}]",
                   arg_name, arg_value, what, lo, hi)


def check_uint64(arg_name, arg_value):
    _check_range(arg_name, arg_value, 0, 2**64 - 1, "uint64")


def check_int64(arg_name, arg_value):
    _check_range(arg_name, arg_value, -(2**63), 2**63 - 1, "int64")


def check_int32(arg_name, arg_value):
    _check_range(arg_name, arg_value, -(2**31), 2**31 - 1, "int32")


def check_uint32(arg_name, arg_value):
    _check_range(arg_name, arg_value, 0, 2**32 - 1, "uint32")


def check_uint16(arg_name, arg_value):
    _check_range(arg_name, arg_value, 0, 2**16 - 1, "uint16")


def check_uint8(arg_name, arg_value):
    _check_range(arg_name, arg_value, 0, 2**8 - 1, "uint8")


def check_positive_or_set_default(arg_name, arg_value, default=-1):
    if arg_value is None:
        return default
    check_isinstance(arg_name, arg_value, int, allow_none=False)
    raise_if_false(arg_value > 0, "{0} ({1}) should be positive", arg_name, arg_value)
    return arg_value


def check_list_uint64(arg_name, arg_value):
    for i, v in enumerate(arg_value):
        check_uint64(f"{arg_name}[{i}]", v)


def check_list_int64(arg_name, arg_value):
    for i, v in enumerate(arg_value):
        check_int64(f"{arg_name}[{i}]", v)


def check_list_int32(arg_name, arg_value):
    for i, v in enumerate(arg_value):
        check_int32(f"{arg_name}[{i}]", v)
