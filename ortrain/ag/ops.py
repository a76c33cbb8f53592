"""Ops on traced tensors. Each checks shapes and dtypes when it is called (at trace time)
and records how to emit its ONNX node; nothing is computed until a captured step runs.

Arrays are batch first. Python numbers and numpy arrays are accepted wherever a tensor
is, as constants.

This module is the ops' namespace and gives ``Tensor`` its Python operators; the ops are
defined in :mod:`ortrain.ag.elementwise` (arithmetic, activations, powers, softmax, dropout)
and :mod:`ortrain.ag.shape_ops` (matrix products, reductions, reshapes, joins, row lookups),
on the argument checks of ``ortrain.ag._checks``.
"""

from __future__ import annotations

from ortrain.ag.elementwise import (
    _power_of,
    abs,
    add,
    div,
    dropout,
    exp,
    gelu,
    log,
    log_softmax,
    mul,
    neg,
    pow,
    relu,
    scale,
    sigmoid,
    softmax,
    sqrt,
    square,
    sub,
    tanh,
)
from ortrain.ag.shape_ops import concat, get_rows, linear, matmul, mean, reshape, sum, transpose
from ortrain.ag.tensor import Tensor
from ortrain.errors import OrtrainError

__all__ = [
    "abs", "add", "concat", "div", "dropout", "exp", "gelu", "get_rows", "linear", "log", "log_softmax", "matmul",
    "mean", "mul", "neg", "pow", "relu", "reshape", "scale", "sigmoid", "softmax", "sqrt", "square", "sub", "sum",
    "tanh", "transpose",
]


# -- Python operators -----------------------------------------------------------------------------
# Defined here rather than in tensor.py so the op functions and the operators are one
# implementation; ``Tensor`` only names the slots.
Tensor.__add__ = lambda a, b: add(a, b)
Tensor.__radd__ = lambda a, b: add(b, a)
Tensor.__sub__ = lambda a, b: sub(a, b)
Tensor.__rsub__ = lambda a, b: sub(b, a)
Tensor.__mul__ = lambda a, b: mul(a, b)
Tensor.__rmul__ = lambda a, b: mul(b, a)
Tensor.__truediv__ = lambda a, b: div(a, b)
Tensor.__rtruediv__ = lambda a, b: div(b, a)
Tensor.__matmul__ = lambda a, b: matmul(a, b)
Tensor.__rmatmul__ = lambda a, b: matmul(b, a)
Tensor.__neg__ = lambda a: neg(a)


def _pow_operator(a, p, modulo=None):
    if modulo is not None:
        raise OrtrainError(f"pow: a modulo is not supported on ag tensors, received pow(x, p, {modulo!r}); use "
                           "ag.pow(x, p)")
    return pow(a, p)


Tensor.__pow__ = _pow_operator

# numpy's ufuncs on a tensor: its operators stay the tensor's (``array * t`` is ``t.__rmul__(array)``,
# comparisons and ``//`` are refused as for tensors); any other ufunc (``np.exp(t)``) is refused with
# the ag op to use. (With ``__array_ufunc__ = None`` numpy deferred the operators but raised a bare
# TypeError for the rest.)
_UFUNC_OPERATORS = {"add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "truediv", "divide": "truediv",
                    "matmul": "matmul", "power": "pow", "floor_divide": "floordiv", "remainder": "mod"}
# (the tensor's own comparison, with the operands swapped where the array comes first)
_UFUNC_COMPARISONS = {"less": ("lt", "gt"), "less_equal": ("le", "ge"), "greater": ("gt", "lt"),
                      "greater_equal": ("ge", "le"), "equal": ("eq", "eq"), "not_equal": ("ne", "ne")}


def _array_ufunc(t, ufunc, method, *inputs, **kwargs):
    name = ufunc.__name__
    if method == "__call__" and not kwargs:
        if name in ("negative", "absolute") and len(inputs) == 1:
            return neg(t) if name == "negative" else abs(t)
        if len(inputs) == 2 and (name in _UFUNC_OPERATORS or name in _UFUNC_COMPARISONS):
            a, b = inputs
            forward, reflected = _UFUNC_COMPARISONS.get(name, (_UFUNC_OPERATORS.get(name),) * 2)
            return getattr(a, f"__{forward}__")(b) if isinstance(a, Tensor) else \
                getattr(b, f"__r{reflected}__" if name in _UFUNC_OPERATORS else f"__{reflected}__")(a)
    import ortrain.ag as ag_module
    op = {"absolute": "abs", "true_divide": "div", "divide": "div", "subtract": "sub", "multiply": "mul",
          "negative": "neg"}.get(name, name)
    if method != "__call__":  # np.add.reduce(t) is a sum, np.multiply.outer(a, b) a product of reshapes
        op = "sum" if (name, method) == ("add", "reduce") else ""
    hint = f"ag.{op}(...)" if op in ag_module.__all__ else "the ag ops (ot.ag)"
    raise OrtrainError(f"np.{name}{'' if method == '__call__' else '.' + method} on an ag tensor: numpy computes "
                       f"on values, which a traced tensor has not; write it with {hint}")


Tensor.__array_ufunc__ = _array_ufunc
Tensor.__rpow__ = lambda a, base: _power_of("pow", base, a)
Tensor.__abs__ = lambda a: abs(a)
Tensor.T = property(lambda a: transpose(a))
