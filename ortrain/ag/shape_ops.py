"""ag ops that change shape: matrix products, reductions, reshape, transpose, concat and row lookups."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ortrain._arrays import checked_flag, is_integer, one_of_two_names, read_array
from ortrain._warnings import warn
from ortrain.ag._checks import FIRST_AXIS, _axis, _either, _float, _ints, _node, _shapes, as_tensor
from ortrain.ag.elementwise import add, div
from ortrain.ag.tensor import FLOAT, Const, Tensor
from ortrain.errors import OrtrainError, ShapeError, describe_shape

__all__ = ["concat", "get_rows", "linear", "matmul", "mean", "reshape", "sum", "transpose"]


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


def _float_operand(value, where: str) -> Tensor:
    """A tensor as it is, or a constant as float32, integers included (``W.T @ [1, 2, 3]``), as the
    elementwise ops take constants beside float32 tensors."""
    t = as_tensor(value, where)
    if isinstance(t, Const) and t.dtype != FLOAT:
        return Const(t.value.astype(np.float32))
    return t


def matmul(a, b) -> Tensor:
    """Matrix product with numpy's ``@`` rules (1-d operands, broadcast batch dimensions); an integer
    constant operand is taken as float32."""
    a, b = _float_operand(a, "matmul"), _float_operand(b, "matmul")
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
    x, weight = _float_operand(x, "linear"), _float_operand(weight, "linear")
    _float("linear", x, weight)  # before the transpose hides an input's name and shape as given
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


# From this many elements added into one value, a float32 sum is taken in float64: onnxruntime's
# float32 ReduceSum/ReduceMean add in turn (about 1e-3 off over a million alike values, where
# PyTorch's and numpy's pairwise sums stay near 1e-8); below it the two casts would cost more.
WIDE_REDUCTION = 4096


def _reduce(op_type: str, x: Tensor, axes: tuple, keepdims: bool):
    """How ``sum``/``mean`` emit their node: in float64 between two casts when many float32
    elements go into each value."""
    count = int(np.prod([x.shape[a] for a in axes]))
    wide = x.dtype == FLOAT and count >= WIDE_REDUCTION
    every = len(axes) == x.ndim

    def emit(gb, names):
        x_name = gb.op("Cast", [names[0]], to=TensorProto.DOUBLE) if wide else names[0]
        if every:
            out = gb.op(op_type, [x_name], keepdims=int(keepdims))
        elif op_type == "ReduceSum":  # axes an input from opset 13
            out = gb.op(op_type, [x_name, gb.const(list(axes), np.int64, hint="axes")], keepdims=int(keepdims))
        else:
            out = gb.op(op_type, [x_name], keepdims=int(keepdims), axes=list(axes))
        return gb.op("Cast", [out], to=TensorProto.FLOAT) if wide else out
    return emit


def _keep(keepdims, op: str) -> bool:
    """``keepdims`` as a bool: True, False, or 1 and 0 as numpy takes them; anything else (2 was
    recorded as kept and computed as dropped) is refused."""
    if is_integer(keepdims) and int(keepdims) in (0, 1):
        return bool(keepdims)
    return checked_flag(keepdims, f"{op}: keepdims")


def _reduced(x: Tensor, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def sum(x, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool | None = None) -> Tensor:  # noqa: A001 - the ag op is called sum
    """Sum over ``axis`` (an int, a tuple, or ``None`` for every axis; PyTorch's ``dim`` and
    ``keepdim`` are taken too).

    ``axis=()`` reduces nothing and returns ``x``, as ``np.sum(x, axis=())`` does. (ONNX's
    ReduceSum would read empty axes as "all axes", so no node is emitted for it.)
    """
    x = as_tensor(x, "sum")
    axis = one_of_two_names("sum", "axis", axis, None, "dim", dim)
    keepdims = _keep(one_of_two_names("sum", "keepdims", keepdims, False, "keepdim", keepdim), "sum")
    axes = _reduce_axes("sum", x, axis)
    if not x.ndim or not axes:
        return x
    return Tensor(_reduced(x, axes, keepdims), x.dtype, "sum", (x,), _reduce("ReduceSum", x, axes, keepdims))


def mean(x, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool | None = None) -> Tensor:
    """Mean over ``axis`` (an int, a tuple, or ``None`` for every axis; PyTorch's ``dim`` and
    ``keepdim`` are taken too).

    ``axis=()`` reduces nothing and returns ``x``, as ``np.mean(x, axis=())`` does (see :func:`sum`).
    The mean over no elements (an axis of length 0) is NaN with a warning, as numpy's.
    """
    x = as_tensor(x, "mean")
    _float("mean", x)
    axis = one_of_two_names("mean", "axis", axis, None, "dim", dim)
    keepdims = _keep(one_of_two_names("mean", "keepdims", keepdims, False, "keepdim", keepdim), "mean")
    axes = _reduce_axes("mean", x, axis)
    if not x.ndim or not axes:
        return x
    if not all(x.shape[a] for a in axes):
        # ReduceMean gives 0 here; 0 / 0 is the NaN numpy and PyTorch give.
        warn(f"mean: axes {axes} of a tensor of shape {describe_shape(x.shape)} hold no elements; their "
             "mean is NaN, as numpy's mean of an empty slice", RuntimeWarning)
        return div(sum(x, axis=axes, keepdims=keepdims), 0.0)
    return Tensor(_reduced(x, axes, keepdims), x.dtype, "mean", (x,), _reduce("ReduceMean", x, axes, keepdims))


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
    # a 0 in the shape is a size of 0, not ONNX's "as the input's" (allowzero, opset 14)
    zero = {"allowzero": 1} if 0 in target else {}
    return Tensor(tuple(target), x.dtype, "reshape", (x,),
                  lambda gb, names: gb.op("Reshape", [names[0], gb.const(target, np.int64, hint="shape")], **zero))


def transpose(x, *dims, perm=None) -> Tensor:
    """Permute dimensions: ``transpose(x, perm)`` with a tuple (negative axes count from the end),
    ``transpose(x, 2, 0, 1)``, or ``transpose(x, d0, d1)``, which swaps two dimensions as
    ``torch.transpose`` does; with neither, the dimensions are reversed, as numpy's."""
    x = as_tensor(x, "transpose")
    if dims and perm is not None:
        raise OrtrainError(f"transpose: the dimensions were given twice ({dims!r} and perm={perm!r}); pass one")
    if len(dims) == 1:
        perm = dims[0]
    elif len(dims) == 2:  # torch.transpose(x, d0, d1): a swap
        a, b = (_axis("transpose", d, x.ndim, scalar=False) for d in dims)
        perm = list(range(x.ndim))
        perm[a], perm[b] = perm[b], perm[a]
    elif dims:
        perm = dims
    p = list(range(x.ndim))[::-1] if perm is None else list(_ints("transpose", "perm", perm, "a tuple of ints"))
    p = [i + x.ndim if -x.ndim <= i < 0 else i for i in p]
    if sorted(p) != list(range(x.ndim)):
        raise ShapeError(f"transpose: perm {perm!r} is not a permutation of the {x.ndim} dimensions of "
                         f"{describe_shape(x.shape)}")
    if not p:  # a 0-d tensor is its own transpose, as numpy's and PyTorch's
        return x
    return Tensor(tuple(x.shape[i] for i in p), x.dtype, "transpose", (x,), _node("Transpose", perm=p))


def concat(tensors, axis: int = FIRST_AXIS, *, dim: int | None = None) -> Tensor:
    """Join tensors along ``axis`` (0 by default, as numpy; ``dim`` is PyTorch's name); other
    dimensions must agree."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise OrtrainError("concat: tensors expected a non-empty list or tuple of tensors")
    # Constants take the dtype of the first tensor, as in the binary ops (an int array joins float32 rows).
    first = next((t for t in tensors if isinstance(t, Tensor)), None)
    first = as_tensor(tensors[0], "concat") if first is None else first
    ts = [as_tensor(t, "concat", like=first) for t in tensors]
    if first.ndim == 0:
        raise ShapeError("concat: expected tensors with at least one dimension, received 0-d ones (as numpy, "
                         "which cannot join them either); give them one first: ag.reshape(t, (1,))")
    a = _axis("concat", _either("concat", axis, dim, 0), first.ndim)
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
    ``idx.shape + table.shape[1:]``. Indices are checked on every call, those from ``fn``'s arguments
    and those computed inside ``fn`` (read from an int buffer, int arithmetic) alike, and must lie in
    ``[0, rows)``; a constant ``idx`` may also count from the end, ``-1`` for the last row, as numpy's.
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
