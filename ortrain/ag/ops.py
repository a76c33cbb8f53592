"""Ops on traced tensors. Each checks shapes and dtypes when it is called (at trace time)
and records how to emit its ONNX node; nothing is computed until a captured step runs.

Arrays are batch first. Python numbers and numpy arrays are accepted wherever a tensor
is, as constants.
"""

from __future__ import annotations

import math

import numpy as np

from ortrain._arrays import as_array, is_integer, is_real, read_array
from ortrain._random import draw_seed
from ortrain._warnings import warn
from ortrain.ag.tensor import FLOAT, INT, Const, Tensor
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.graph import MS_DOMAIN

__all__ = [
    "abs", "add", "concat", "div", "dropout", "exp", "gelu", "get_rows", "linear", "log", "log_softmax", "matmul",
    "mean", "mul", "neg", "pow", "relu", "reshape", "scale", "sigmoid", "softmax", "sqrt", "square", "sub", "sum",
    "tanh", "transpose",
]


def _shapes(*ts: Tensor) -> str:
    return " and ".join(describe_shape(t.shape) for t in ts)


def as_tensor(value, where: str, like: Tensor | None = None) -> Tensor:
    """``value`` itself if it is a Tensor, else a constant (of ``like``'s dtype when numeric)."""
    if isinstance(value, Tensor):
        return value
    a = read_array(value, where)
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


def _axis(where: str, axis, ndim: int) -> int:
    a = _int(where, "axis", axis)
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


# -- elementwise ----------------------------------------------------------------------------------
def _binary(where: str, op_type: str, a, b) -> Tensor:
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = as_tensor(a, where)
    a = as_tensor(a, where, like=b if isinstance(b, Tensor) else None)
    b = as_tensor(b, where, like=a)
    if a.dtype != b.dtype:
        raise ShapeError(f"{where}: operands have dtypes {a.dtype.name} and {b.dtype.name}; both must have the "
                         "same dtype")
    if a.dtype.kind not in "fi":
        raise ShapeError(f"{where}: expected float32 or int64 operands, received {a.dtype.name}")
    return Tensor(broadcast(where, a, b), a.dtype, where, (a, b), _node(op_type))


def add(a, b) -> Tensor:
    """``a + b`` with numpy broadcasting."""
    return _binary("add", "Add", a, b)


def sub(a, b) -> Tensor:
    """``a - b`` with numpy broadcasting."""
    return _binary("sub", "Sub", a, b)


def mul(a, b) -> Tensor:
    """Elementwise ``a * b`` with numpy broadcasting."""
    return _binary("mul", "Mul", a, b)


def div(a, b) -> Tensor:
    """Elementwise ``a / b`` with numpy broadcasting (float32)."""
    out = _binary("div", "Div", a, b)
    _float("div", out)
    return out


def scale(x, s: float) -> Tensor:
    """``x * s`` for a Python number ``s``."""
    if not is_real(s) and not isinstance(s, (bool, np.bool_)):
        raise OrtrainError(f"scale: s expected a number, received {type(s).__name__}; use ag.mul for tensors")
    x = as_tensor(x, "scale")
    _float("scale", x)
    return mul(x, float(s))


def _unary(where: str, op_type: str, x, domain: str = "") -> Tensor:
    x = as_tensor(x, where)
    _float(where, x)
    emit = (lambda gb, names: gb.op(op_type, names, domain=domain)) if domain else _node(op_type)
    return Tensor(x.shape, x.dtype, where, (x,), emit)


def neg(x) -> Tensor:
    """``-x``."""
    return _unary("neg", "Neg", x)


def relu(x) -> Tensor:
    """``max(x, 0)`` elementwise (gradient 0 at 0, as PyTorch's)."""
    return _unary("relu", "Relu", x)


def sigmoid(x) -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise."""
    return _unary("sigmoid", "Sigmoid", x)


def tanh(x) -> Tensor:
    """Hyperbolic tangent, elementwise."""
    return _unary("tanh", "Tanh", x)


def gelu(x) -> Tensor:
    """Exact GELU, ``x * Phi(x)`` (PyTorch's default, ``approximate='none'``)."""
    return _unary("gelu", "Gelu", x, domain=MS_DOMAIN)


def exp(x) -> Tensor:
    """``e^x`` elementwise."""
    return _unary("exp", "Exp", x)


def log(x) -> Tensor:
    """Natural logarithm (``-inf`` at 0, NaN below)."""
    return _unary("log", "Log", x)


def sqrt(x) -> Tensor:
    """Square root elementwise (NaN below 0; the gradient ``1 / (2 sqrt(x))`` is ``inf`` at 0, as PyTorch's)."""
    return _unary("sqrt", "Sqrt", x)


def abs(x) -> Tensor:  # noqa: A001 - the ag op is called abs
    """``|x|`` elementwise; also ``abs(x)``. Its gradient is ``sign(x)``: 0 at 0, as PyTorch's."""
    return _unary("abs", "Abs", x)


# -- powers ---------------------------------------------------------------------------------------
def _exponent(where: str, p) -> float:
    """``p`` as a Python float: one real number that float32 holds. The graph stores it as float32: the
    runtime's Pow gradient computes ``p - 1`` in the base's type and fails on a float64 exponent."""
    if isinstance(p, Tensor):
        raise OrtrainError(f"{where}: p expected a real number (a Python or numpy int or float), received {p!r}; "
                           "onnxruntime-training has no gradient for a tensor exponent. For a positive base write "
                           "ag.exp(p * ag.log(x))")
    if not is_real(p):
        fix = ("one exponent per call; for one per element of a positive base write ag.exp(ag.log(x) * p)"
               if isinstance(p, (list, tuple, np.ndarray)) else "pass an int or a float, e.g. x ** 2")
        raise OrtrainError(f"{where}: p expected a real number (a Python or numpy int or float), received {p!r} "
                           f"({type(p).__name__}); {fix}")
    try:
        e = float(p)
    except OverflowError:  # a Python int beyond float64
        e = math.inf
    with np.errstate(over="ignore"):
        finite = bool(np.isfinite(np.float32(e)))
    if not finite:
        raise OrtrainError(f"{where}: p expected a finite number within float32's range, received {p!r:.40}; "
                           "give a smaller exponent")
    return e


def _power(where: str, x, p) -> Tensor:
    """``x ** p`` as one Pow node, whose gradient the runtime builds as ``p * x^(p-1) * dy``. (Pow(x, 2) and
    Mul(x, x) measured equal against PyTorch float64, values and gradients; Pow is one node for every p.)"""
    e = _exponent(where, p)
    x = as_tensor(x, where)
    _float(where, x)
    if e == 0:
        # x ** 0 is 1 with gradient 0 everywhere, as in PyTorch; Pow's gradient p * x^(p-1) would be
        # 0 * inf = NaN at x = 0, so the base is made |x| + 1 (never 0) first. x stays an input, so a
        # param read only here still gets its (zero) gradient.
        x = _binary(where, "Add", _unary(where, "Abs", x), 1.0)
    return Tensor(x.shape, x.dtype, where, (x, as_tensor(e, where, like=x)), _node("Pow"))


def pow(x, p) -> Tensor:  # noqa: A001 - the ag op is called pow
    """``x ** p`` elementwise for a real number ``p`` (an int or a float), as ``torch.pow``.

    Defined for negative ``x`` when ``p`` is an integer (``(-2) ** 3 == -8``, gradient ``3 * 4``);
    a fractional power of a negative number is NaN, as in PyTorch. ``p == 0`` gives 1 with
    gradient 0 everywhere, 0 included. ``ag.pow(2.0, t)`` (also ``2.0 ** t``) raises a constant
    base > 0 to a tensor, as ``exp(t * log(2.0))``. A tensor exponent of a tensor is refused: the
    runtime has no gradient for Pow's exponent.

    >>> import numpy as np, ortrain as ot
    >>> from ortrain import ag
    >>> f = ot.capture(lambda x: {"cube": x ** 3, "root": ag.pow(x, 0.5), "two": 2.0 ** x})
    >>> {k: v.tolist() for k, v in f(x=np.array([-2.0, 0.0, 4.0])).items()}
    {'cube': [-8.0, 0.0, 64.0], 'root': [nan, 0.0, 2.0], 'two': [0.25, 1.0, 16.0]}
    >>> f.free()
    """
    if isinstance(p, Tensor) and not isinstance(x, Tensor):
        return _power_of("pow", x, p)
    return _power("pow", x, p)


def square(x) -> Tensor:
    """``x ** 2`` elementwise."""
    return _power("square", x, 2)


def _power_of(where: str, base, x: Tensor) -> Tensor:
    """``base ** x`` for a constant ``base > 0``, as ``exp(x * log(base))``: the log is taken by numpy in
    float64, then rounded once to float32."""
    b = read_array(base, where)
    if b.dtype.kind not in "iuf" or not b.size or not np.all(np.isfinite(b) & (b > 0)):
        raise OrtrainError(f"{where}: base expected positive finite numbers for a tensor exponent (base ** x is "
                           f"computed as exp(x * log(base))), received {base!r}; a zero or negative base has no real "
                           "logarithm: give a base > 0")
    _float(where, x)
    return _unary(where, "Exp", _binary(where, "Mul", x, np.log(b.astype(np.float64))))


def softmax(x, axis: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis`` (the last by default)."""
    x = as_tensor(x, "softmax")
    _float("softmax", x)
    a = _axis("softmax", axis, x.ndim)
    return Tensor(x.shape, x.dtype, "softmax", (x,), _node("Softmax", axis=a))


def log_softmax(x, axis: int = -1) -> Tensor:
    """``log(softmax(x))`` along ``axis``, computed stably."""
    x = as_tensor(x, "log_softmax")
    _float("log_softmax", x)
    a = _axis("log_softmax", axis, x.ndim)
    return Tensor(x.shape, x.dtype, "log_softmax", (x,), _node("LogSoftmax", axis=a))


# -- matrix products ------------------------------------------------------------------------------
def _matmul_shape(a: Tensor, b: Tensor) -> tuple:
    if not a.shape or not b.shape:
        raise ShapeError(f"matmul: operands need at least 1 dimension, received shapes {_shapes(a, b)}")
    sa = (1,) + a.shape if a.ndim == 1 else a.shape
    sb = b.shape + (1,) if b.ndim == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise ShapeError(f"matmul: shapes {_shapes(a, b)} do not chain: the last dimension of the first "
                         f"({sa[-1]}) must equal the {'only' if b.ndim == 1 else 'second-to-last'} dimension of "
                         f"the second ({sb[-2]})")
    try:
        batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError:
        raise ShapeError(f"matmul: the batch dimensions of shapes {_shapes(a, b)} do not broadcast") from None
    out = batch + (sa[-2], sb[-1])
    if a.ndim == 1:
        out = out[:-2] + out[-1:]
    if b.ndim == 1:
        out = out[:-1]
    return out


def matmul(a, b) -> Tensor:
    """Matrix product with numpy's ``@`` rules (1-d operands, broadcast batch dimensions)."""
    a, b = as_tensor(a, "matmul"), as_tensor(b, "matmul")
    _float("matmul", a, b)
    out = _matmul_shape(a, b)
    if a.ndim > 1 and b.ndim > 1:
        return Tensor(out, FLOAT, "matmul", (a, b), _node("MatMul"))
    # A 1-d operand is made a matrix (row for the first, column for the second) and the product
    # reshaped back: the runtime's MatMul gradient gets 1-d operands wrong.
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    return reshape(Tensor(_matmul_shape(a2, b2), FLOAT, "matmul", (a2, b2), _node("MatMul")), out)


def linear(x, weight, bias=None) -> Tensor:
    """``x @ weight.T + bias`` as ``torch.nn.functional.linear``: ``weight`` is ``(out, in)``,
    ``x`` is ``(..., in)``, ``bias`` is ``(out,)``."""
    x, weight = as_tensor(x, "linear"), as_tensor(weight, "linear")
    if weight.ndim != 2:
        raise ShapeError(f"linear: weight expected shape (out, in), received {describe_shape(weight.shape)}")
    if not x.shape or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear: x of shape {describe_shape(x.shape)} does not match weight of shape "
                         f"{describe_shape(weight.shape)}; x's last dimension must be {weight.shape[1]} (in)")
    y = matmul(x, transpose(weight))
    if bias is None:
        return y
    bias = as_tensor(bias, "linear")
    if bias.shape != (weight.shape[0],):
        raise ShapeError(f"linear: bias expected shape {describe_shape((weight.shape[0],))}, received "
                         f"{describe_shape(bias.shape)}")
    return add(y, bias)


# -- reductions -----------------------------------------------------------------------------------
def _reduce_axes(where: str, x: Tensor, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = _ints(where, "axis", axis, "an int, a sequence of ints or None")
    out = tuple(sorted({_axis(where, a, x.ndim) for a in axes}))
    if len(out) != len(axes):
        raise ShapeError(f"{where}: axis {axis!r} names a dimension twice")
    return out


def _reduced(x: Tensor, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def sum(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001 - the ag op is called sum
    """Sum over ``axis`` (an int, a tuple, or ``None`` for every axis).

    ``axis=()`` reduces nothing and returns ``x``, as ``np.sum(x, axis=())`` does. (ONNX's
    ReduceSum would read empty axes as "all axes", so no node is emitted for it.)
    """
    x = as_tensor(x, "sum")
    axes = _reduce_axes("sum", x, axis)
    if not x.ndim or not axes:
        return x

    def emit(gb, names):
        if len(axes) == x.ndim:
            return gb.op("ReduceSum", names, keepdims=int(keepdims))
        return gb.op("ReduceSum", [names[0], gb.const(list(axes), np.int64, hint="axes")], keepdims=int(keepdims))
    return Tensor(_reduced(x, axes, keepdims), x.dtype, "sum", (x,), emit)


def mean(x, axis=None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis`` (an int, a tuple, or ``None`` for every axis).

    ``axis=()`` reduces nothing and returns ``x``, as ``np.mean(x, axis=())`` does (see :func:`sum`).
    The mean over no elements (an axis of length 0) is NaN with a warning, as numpy's.
    """
    x = as_tensor(x, "mean")
    _float("mean", x)
    axes = _reduce_axes("mean", x, axis)
    if not x.ndim or not axes:
        return x
    if not all(x.shape[a] for a in axes):
        # ReduceMean gives 0 here; 0 / 0 is the NaN numpy and PyTorch give.
        warn(f"mean: axes {axes} of a tensor of shape {describe_shape(x.shape)} hold no elements; their "
             "mean is NaN, as numpy's mean of an empty slice", RuntimeWarning)
        return div(sum(x, axis=axes, keepdims=keepdims), 0.0)
    attrs = {} if len(axes) == x.ndim else {"axes": list(axes)}
    return Tensor(_reduced(x, axes, keepdims), x.dtype, "mean", (x,),
                  _node("ReduceMean", keepdims=int(keepdims), **attrs))


# -- shapes ---------------------------------------------------------------------------------------
def reshape(x, shape) -> Tensor:
    """A new shape with the same number of elements; one dimension may be ``-1``."""
    x = as_tensor(x, "reshape")
    dims = list(_ints("reshape", "shape", shape, "an int or a tuple of ints"))
    if [d for d in dims if d < 1 and d != -1] or dims.count(-1) > 1:
        raise ShapeError(f"reshape: shape expected positive ints with at most one -1, received {shape!r}")
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
        if x.size % known:
            raise ShapeError(f"reshape: cannot reshape {describe_shape(x.shape)} ({x.size} elements) into "
                             f"{tuple(dims)}")
        dims[dims.index(-1)] = x.size // known
    if int(np.prod(dims, dtype=np.int64)) != x.size:
        raise ShapeError(f"reshape: cannot reshape {describe_shape(x.shape)} ({x.size} elements) into "
                         f"{describe_shape(dims)} ({int(np.prod(dims, dtype=np.int64))} elements)")
    target = [int(d) for d in dims]
    return Tensor(tuple(target), x.dtype, "reshape", (x,),
                  lambda gb, names: gb.op("Reshape", [names[0], gb.const(target, np.int64, hint="shape")]))


def transpose(x, perm=None) -> Tensor:
    """Permute dimensions (reverse them when ``perm`` is None, as numpy does)."""
    x = as_tensor(x, "transpose")
    p = list(range(x.ndim))[::-1] if perm is None else list(_ints("transpose", "perm", perm, "a tuple of ints"))
    if sorted(p) != list(range(x.ndim)):
        raise ShapeError(f"transpose: perm {perm!r} is not a permutation of the {x.ndim} dimensions of "
                         f"{describe_shape(x.shape)}")
    return Tensor(tuple(x.shape[i] for i in p), x.dtype, "transpose", (x,), _node("Transpose", perm=p))


def concat(tensors, axis: int = 0) -> Tensor:
    """Join tensors along ``axis`` (0 by default, as numpy); other dimensions must agree."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise OrtrainError("concat: tensors expected a non-empty list or tuple of tensors")
    # Constants take the dtype of the first tensor, as in the binary ops (an int array joins float32 rows).
    first = next((t for t in tensors if isinstance(t, Tensor)), None)
    first = as_tensor(tensors[0], "concat") if first is None else first
    ts = [as_tensor(t, "concat", like=first) for t in tensors]
    a = _axis("concat", axis, first.ndim)
    for t in ts:
        if t.dtype != first.dtype or t.ndim != first.ndim or \
                any(d != e for i, (d, e) in enumerate(zip(t.shape, first.shape, strict=True)) if i != a):
            raise ShapeError(f"concat: shapes {_shapes(*ts)} (dtypes {', '.join(t.dtype.name for t in ts)}) "
                             f"must agree in every dimension but axis {a}, and in dtype")
    shape = list(first.shape)
    shape[a] = int(np.sum([t.shape[a] for t in ts]))
    return Tensor(tuple(shape), first.dtype, "concat", tuple(ts), _node("Concat", axis=a))


def get_rows(table, idx) -> Tensor:
    """Rows ``table[idx]`` of a param (an embedding: the read rows get gradients) or a buffer.

    ``idx`` is an int64 tensor (an argument of ``fn``) or an int array; the result has shape
    ``idx.shape + table.shape[1:]``. Indices from ``fn``'s arguments are checked on every call and
    must lie in ``[0, rows)``; a constant ``idx`` may also count from the end, ``-1`` for the last row,
    as numpy's.
    """
    if not isinstance(table, Tensor) or not table.shape:
        raise OrtrainError(f"get_rows: table expected an ag.param, ag.buffer or tensor with rows, received "
                           f"{table!r}")
    if not isinstance(idx, Tensor):
        idx = read_array(idx, "get_rows")
        if idx.dtype.kind == "b":
            raise ShapeError("get_rows: idx expected integer row indices, received booleans (a mask); pass the "
                             "rows it selects, np.flatnonzero(mask)")
    idx = as_tensor(idx, "get_rows", like=None)
    if idx.dtype.kind not in "iu":
        raise ShapeError(f"get_rows: idx expected integer indices (int64), received {idx.dtype.name}; pass the "
                         "indices as an int array")
    n = table.shape[0]
    if isinstance(idx, Const) and idx.value.size:
        low, high = idx.value.min(), idx.value.max()
        if low < -n or high >= n:
            raise ShapeError(f"get_rows: indices must lie in [{-n}, {n - 1}] for a table of {n} rows (negative "
                             f"ones count from the end), received values from {low} to {high}")
        if low < 0:
            idx = Const(np.asarray(idx.value % n, dtype=idx.dtype))
    return Tensor(idx.shape + table.shape[1:], table.dtype, "get_rows", (table, idx), _node("Gather", axis=0))


def dropout(x, rate: float = 0.5) -> Tensor:
    """Zero each element with probability ``rate`` and scale the rest by ``1 / (1 - rate)``.

    Active in captured training steps (a new mask at every call); ``ot.capture`` runs without it.
    """
    x = as_tensor(x, "dropout")
    _float("dropout", x)
    if not is_real(rate) or not 0.0 <= rate < 1.0:
        raise OrtrainError(f"dropout: rate expected a number in [0, 1), received {rate!r}")
    if rate == 0:
        return x
    seed = draw_seed()

    def emit(gb, names):
        ratio = gb.const(float(rate), hint="ratio")
        training = gb.const(True, np.bool_, hint="training_mode")
        out, _ = gb.op("Dropout", [names[0], ratio, training], outputs=2, seed=seed)
        return out
    return Tensor(x.shape, x.dtype, "dropout", (x,), emit)


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
Tensor.__rpow__ = lambda a, base: _power_of("pow", base, a)
Tensor.__abs__ = lambda a: abs(a)
Tensor.T = property(lambda a: transpose(a))
