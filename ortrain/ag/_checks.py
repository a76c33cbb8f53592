"""What every ag op checks of its arguments: tensors or constants (``as_tensor``), dtypes, int
arguments and axes, broadcasting; and ``_node``, the emit of a single ONNX node."""

from __future__ import annotations

import numpy as np

from ortrain._arrays import as_array, is_integer, one_of_two_names, read_array
from ortrain.ag.tensor import FLOAT, INT, Const, Input, Tensor
from ortrain.errors import OrtrainError, ShapeError, describe_shape


def _shapes(*ts: Tensor) -> str:
    return " and ".join(describe_shape(t.shape) for t in ts)


def as_tensor(value, where: str, like: Tensor | None = None) -> Tensor:
    """``value`` itself if it is a Tensor, else a constant (of ``like``'s dtype when numeric)."""
    if isinstance(value, Tensor):
        return value
    a = read_array(value, where)
    if a.dtype == object and isinstance(value, int) and not isinstance(value, bool):  # past numpy's int range
        raise ShapeError(f"{where}: the constant {value} lies beyond int64; write it as a float "
                         f"({float(value):.6g}) to compute in float32")
    if a.dtype.kind not in "fiub":
        raise OrtrainError(f"{where}: expected an ag tensor, a number or a numeric array, received "
                           f"{type(value).__name__} of dtype {a.dtype}")
    dtype = like.dtype if like is not None else (FLOAT if a.dtype.kind == "f" else INT)
    if dtype.kind in "iu" and a.dtype.kind == "f" and np.any(a != np.round(a)):
        raise ShapeError(f"{where}: the constant {value!r} has a fractional part but the other operand is "
                         f"{dtype.name}")
    return Const(as_array(a, dtype, where))  # keeps a number 0-d; refuses ints beyond int64


def _float(where: str, *ts: Tensor) -> None:
    for t in ts:
        if t.dtype != FLOAT and isinstance(t, Input):
            raise ShapeError(f"{where}: expected float32 tensors, received the input {t.name!r}, an integer array "
                             f"of shape {describe_shape(t.shape)} (integer inputs are kept as int64, for indices "
                             f"and labels); pass {t.name}= as float32, e.g. {t.name}.astype(np.float32)")
        if t.dtype != FLOAT:
            raise ShapeError(f"{where}: expected float32 tensors, received {t.dtype.name} "
                             f"(shape {describe_shape(t.shape)})")


# Every int argument of the ops (an axis, axes, a shape, a permutation) goes through _int or _ints:
# integers as numpy takes them (is_integer), the rest refused with one message.
def _not_ints(where: str, argument: str, value, expected: str) -> ShapeError:
    return ShapeError(f"{where}: {argument} expected {expected}, received {value!r} ({type(value).__name__}); "
                      "give Python or numpy ints (floats and bools are not read as integers)")


def _int(where: str, argument: str, value, expected: str = "an int") -> int:
    if not is_integer(value):
        raise _not_ints(where, argument, value, expected)
    return int(value)


def _ints(where: str, argument: str, value, expected: str) -> tuple[int, ...]:
    """An int or a sequence of ints (what numpy takes for axes and shapes) as a tuple of Python ints."""
    if is_integer(value):
        return (int(value),)
    try:
        items = None if isinstance(value, (str, bytes, Tensor)) else tuple(value)
    except TypeError:  # a float, None, a 0-d float array: nothing to iterate
        items = None
    if items is None or not all(is_integer(i) for i in items):
        raise _not_ints(where, argument, value, expected)
    return tuple(int(i) for i in items)


class _Unset:
    """An argument left out, told apart from every value given (None included); ``shown`` is how
    signatures show it (the value it stands for)."""

    def __init__(self, shown: str = "<unset>"):
        self._shown = shown

    def __repr__(self) -> str:
        return self._shown


UNSET = _Unset()
LAST_AXIS = _Unset("-1")  # an axis left out that means the last one
FIRST_AXIS = _Unset("0")  # an axis left out that means the first one


def _either(where: str, axis, dim, default: int):
    """An axis given as numpy's ``axis`` or PyTorch's ``dim`` (neither: ``default``); both given
    with different values are refused, whichever equals the default."""
    if isinstance(axis, _Unset):
        return default if dim is None else dim
    return one_of_two_names(where, "axis", axis, UNSET, "dim", dim)


def _axis(where: str, axis, ndim: int, scalar: bool = True) -> int:
    """``axis`` counted from 0; ``scalar=False`` for ops that need a real axis, which a 0-d tensor lacks
    (a reduction over axis 0 of one is the value itself, as in PyTorch)."""
    a = _int(where, "axis", axis)
    if not scalar and ndim == 0:
        raise ShapeError(f"{where}: a 0-d tensor has no axis {a}; give it one first: ag.reshape(t, (1,))")
    if not -ndim <= a < max(ndim, 1):
        raise ShapeError(f"{where}: axis {a} is out of range for a tensor of {ndim} dimensions")
    return a % max(ndim, 1)


def broadcast(where: str, a: Tensor, b: Tensor) -> tuple:
    try:
        return tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ShapeError(f"{where}: shapes {_shapes(a, b)} do not broadcast (numpy rules: trailing "
                         "dimensions must be equal or 1)") from None


def _node(op_type: str, **attrs):
    return lambda gb, names: gb.op(op_type, names, **attrs)
