"""Elementwise ag ops: arithmetic, activations, powers, softmax along an axis and dropout."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from ortrain._arrays import checked_seed, is_real, one_of_two_names, read_array
from ortrain._random import draw_seed
from ortrain.ag._checks import LAST_AXIS, _axis, _either, _float, _node, as_tensor, broadcast
from ortrain.ag.tensor import FLOAT, INT, RECORDING, Tensor
from ortrain.errors import OrtrainError, ShapeError
from ortrain.graph import MS_DOMAIN
from ortrain.graph.activations import sigmoid as graph_sigmoid

__all__ = [
    "abs", "add", "div", "dropout", "exp", "gelu", "log", "log_softmax", "mul", "neg", "pow", "relu", "scale",
    "sigmoid", "softmax", "sqrt", "square", "sub", "tanh",
]


# -- elementwise ----------------------------------------------------------------------------------
def _float_constant(value, where: str) -> bool:
    """A float constant (``0.5``, ``2.0``, ``np.float32(3)``): an int tensor meeting one is computed in
    float32, as PyTorch promotes it, whole or not."""
    if isinstance(value, Tensor):
        return False
    return read_array(value, where).dtype.kind == "f"


def _to_float(t: Tensor) -> Tensor:
    return t if t.dtype == FLOAT else Tensor(t.shape, FLOAT, "cast", (t,), _node("Cast", to=TensorProto.FLOAT))


def _binary(where: str, op_type: str, a, b, promote: bool = False) -> Tensor:
    """``a op b``. As in PyTorch, an int64 operand meeting a float32 tensor or a float constant
    (``k * 0.5``, ``k * 2.0``) is computed in float32 (``promote``: always, for ``div``'s true
    division); two int64 operands or an int64 and an int constant (``k + 1``) stay int64."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = as_tensor(a, where)
    tensor = a if isinstance(a, Tensor) else b
    if tensor.dtype == INT and (promote or _float_constant(a, where) or _float_constant(b, where)):
        a, b = (_to_float(v) if isinstance(v, Tensor) else v for v in (a, b))
    a = as_tensor(a, where, like=b if isinstance(b, Tensor) else None)
    b = as_tensor(b, where, like=a)
    if a.dtype != b.dtype and {a.dtype, b.dtype} == {FLOAT, INT}:
        a, b = _to_float(a), _to_float(b)
    if a.dtype != b.dtype or a.dtype.kind not in "fi":
        raise ShapeError(f"{where}: expected float32 or int64 operands, received {a.dtype.name} and "
                         f"{b.dtype.name}")
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
    """Elementwise true division ``a / b`` with numpy broadcasting, in float32 (int64 operands too,
    as PyTorch's ``/``)."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = as_tensor(a, "div")
    return _binary("div", "Div", a, b, promote=True)


def scale(x, s: float) -> Tensor:
    """``x * s`` for a Python number ``s``."""
    if not is_real(s) and not isinstance(s, (bool, np.bool_)):
        raise OrtrainError(f"scale: s expected a number, received {type(s).__name__}; use ag.mul for tensors")
    x = as_tensor(x, "scale")
    _float("scale", x)
    return mul(x, float(s))


def _unary(where: str, op_type: str, x, domain: str = "", ints: bool = False) -> Tensor:
    """``ints``: int64 tensors too (``-k``, ``abs(k)`` stay int64, as in PyTorch)."""
    x = as_tensor(x, where)
    if not (ints and x.dtype == INT):
        _float(where, x)
    emit = (lambda gb, names: gb.op(op_type, names, domain=domain)) if domain else _node(op_type)
    return Tensor(x.shape, x.dtype, where, (x,), emit)


def neg(x) -> Tensor:
    """``-x`` (int64 stays int64)."""
    return _unary("neg", "Neg", x, ints=True)


def relu(x) -> Tensor:
    """``max(x, 0)`` elementwise (gradient 0 at 0, as PyTorch's)."""
    return _unary("relu", "Relu", x)


def sigmoid(x) -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise, exact to float32 rounding in both tails (written in ``Exp``:
    onnxruntime's ``Sigmoid`` kernel is 0 from about -18)."""
    x = as_tensor(x, "sigmoid")
    _float("sigmoid", x)
    return Tensor(x.shape, x.dtype, "sigmoid", (x,), lambda gb, names: graph_sigmoid(gb, names[0]))


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
    """``|x|`` elementwise; also ``abs(x)`` (int64 stays int64). Its gradient is ``sign(x)``: 0 at 0, as
    PyTorch's."""
    return _unary("abs", "Abs", x, ints=True)


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


def softmax(x, axis: int = LAST_AXIS, *, dim: int | None = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis`` (the last by default; ``dim`` is PyTorch's name)."""
    x = as_tensor(x, "softmax")
    _float("softmax", x)
    a = _axis("softmax", _either("softmax", axis, dim, -1), x.ndim, scalar=False)
    return Tensor(x.shape, x.dtype, "softmax", (x,), _node("Softmax", axis=a))


def log_softmax(x, axis: int = LAST_AXIS, *, dim: int | None = None) -> Tensor:
    """``log(softmax(x))`` along ``axis`` (the last by default; ``dim`` in PyTorch), computed stably."""
    x = as_tensor(x, "log_softmax")
    _float("log_softmax", x)
    a = _axis("log_softmax", _either("log_softmax", axis, dim, -1), x.ndim, scalar=False)
    return Tensor(x.shape, x.dtype, "log_softmax", (x,), _node("LogSoftmax", axis=a))


# -- dropout --------------------------------------------------------------------------------------
def dropout(x, rate: float = 0.5, *, p: float | None = None, seed: int | None = None) -> Tensor:
    """Zero each element with probability ``rate`` (``p`` in PyTorch) and scale the rest by
    ``1 / (1 - rate)``.

    Active in captured training steps (a new mask at every call, a function of ``seed`` and the
    optimizer's step count); ``ot.capture`` runs without it. ``seed``: the masks' seed (as Keras'
    ``Dropout(seed=)``); by default one is drawn from ortrain's generator (``ot.set_seed``) when
    ``fn`` is recorded, so a step recorded again, after ``opt.load_state`` say, draws other masks
    unless it passes ``seed`` or calls ``ot.set_seed`` with the same value first.
    """
    x = as_tensor(x, "dropout")
    _float("dropout", x)
    rate = one_of_two_names("dropout", "rate", rate, 0.5, "p", p)
    if not is_real(rate) or not 0.0 <= rate < 1.0:
        raise OrtrainError(f"dropout: {'rate' if p is None else 'p'} expected a number in [0, 1), received {rate!r}")
    seed = checked_seed(seed, "dropout(seed=...)")
    if rate == 0:
        return x
    if seed is None:  # a forward-only capture draws no masks, and leaves ot.set_seed's generator alone
        seed = draw_seed() if getattr(RECORDING, "training", True) else 0

    def emit(gb, names):
        ratio = gb.const(float(rate), hint="ratio")
        training = gb.const(True, np.bool_, hint="training_mode")
        out, _ = gb.op("Dropout", [names[0], ratio, training], outputs=2, seed=seed)
        return out
    return Tensor(x.shape, x.dtype, "dropout", (x,), emit)
