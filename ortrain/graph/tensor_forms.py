"""Gradient forms of tensor ops (the ``FORMS`` entries of :mod:`ortrain.graph.gradient_forms`):
``MatMul`` with a 1-D operand, ``Pow`` and ``Where`` with a broadcast operand, ``Split`` with an
unread output, ``Transpose`` without ``perm``, ``ReduceL2``/``ReduceLogSumExp`` without ``keepdims``,
``ReduceMax``/``ReduceMin`` (no gradient at all: a ``TopK``), ``Einsum`` (none either: matrix
products), ``Pad`` in the modes other than ``constant`` or with an ``axes`` input, ``ScatterElements``/``ScatterND``
that add; and :func:`matmul_vectors_as_matrices` for the graphs that only run forward.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.gradient_ops import pad_plan
from ortrain.graph.passes import attribute, replace_nodes, scatter_nd_add, text_attribute
from ortrain.graph.shapes import _Graph, _where

__all__ = ["matmul_vectors_as_matrices"]

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


# -- MatMul with a 1-D operand ------------------------------------------------------------------

def _matmul_needs(node, g: _Graph) -> bool:
    return any(g.shapes.rank(v) == 1 for v in node.input)


def _matmul_as_matrix(node, i: int, p: str, g: _Graph):
    """A ``MatMul`` with a 1-D operand as the matrix product of that operand made a column (the
    second) or a row (the first), the added dimension squeezed out of the product: onnxruntime-
    training 1.19.2's ``MatMul`` gradient is wrong for a 1-D operand (``x @ w`` with ``w`` of shape
    ``(k,)`` trained 0.1 off PyTorch's weights after one SGD step), while ``x @ w.reshape(k, 1)``
    trains exactly. Only the 1-D operand's rank is needed; the other's may be unknown."""
    a, b = node.input
    row, column = g.shapes.rank(a) == 1, g.shapes.rank(b) == 1
    nodes, inits = [], []
    if row:
        inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), p + "row_shape"))
        nodes.append(helper.make_node("Reshape", [a, p + "row_shape"], [p + "row"], name=p + "Row"))
        a = p + "row"
    if column:
        inits.append(numpy_helper.from_array(np.array([-1, 1], np.int64), p + "column_shape"))
        nodes.append(helper.make_node("Reshape", [b, p + "column_shape"], [p + "column"], name=p + "Column"))
        b = p + "column"
    # The dimension the row or column added: (..., m, 1) -> (..., m), (..., 1, n) -> (..., n), (1, 1) -> ().
    axes = [-2] * row + [-1] * column
    nodes.append(helper.make_node("MatMul", [a, b], [p + "product"], name=p + "MatMul"))
    if g.opset >= 13:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), p + "added_axes"))
        nodes.append(helper.make_node("Squeeze", [p + "product", p + "added_axes"], [node.output[0]], name=p + "Out"))
    else:
        nodes.append(helper.make_node("Squeeze", [p + "product"], [node.output[0]], name=p + "Out", axes=axes))
    return nodes, inits


def matmul_vectors_as_matrices(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every ``MatMul`` with a 1-D operand in the matrix form of :func:`_matmul_as_matrix`, for
    the graphs that only run forward (predictions, the exported model). onnxruntime 1.19's
    graph optimizer (level ``EXTENDED`` and above, the default) fuses a ``Transpose`` into such a
    ``MatMul`` wrongly: ``x.transpose(0, 2, 1) @ w`` with ``w`` of shape ``(k,)`` came out 5.7 off
    numpy. The matrix form has the same values and is fused right."""
    if not any(n.op_type == "MatMul" for n in model.graph.node):
        return model
    g = _Graph(model)
    return replace_nodes(model, lambda node: node.op_type == "MatMul" and _matmul_needs(node, g),
                         lambda i, node: _matmul_as_matrix(node, i, f"{node.name or node.op_type}/as_matrix_{i}/", g))


# -- Pow and Where with a broadcast operand ------------------------------------------------------

def _pow_needs(node, g: _Graph) -> bool:
    return g.smaller(node.input[0], node.output[0]) or \
        g.shapes.elem_type(node.input[1]) != g.shapes.elem_type(node.input[0])


def _where_needs(node, g: _Graph) -> bool:
    # values of an unknown type are widened too: Expand takes any
    return g.shapes.elem_type(node.output[0]) in (*_FLOAT_TYPES, 0) and \
        any(g.smaller(v, node.output[0]) for v in node.input[1:])


def _pow_widened(node, i: int, p: str, g: _Graph):
    """``Pow`` with a base smaller than the result: its gradient is never summed back over the
    broadcast axes (a base of shape ``(m,)`` took a gradient of shape ``(n, m)``), so the base is
    ``Expand``-ed to the result's shape first, whose gradient sums correctly. An exponent that is
    not of the base's type (the builder's ``Sub`` fails on the types) is cast to it."""
    inputs = list(node.input)
    nodes = []
    base_type = g.shapes.elem_type(inputs[0])
    if g.shapes.elem_type(inputs[1]) != base_type and base_type:
        nodes.append(helper.make_node("Cast", [inputs[1]], [p + "exponent"], name=p + "Cast", to=base_type))
        inputs[1] = p + "exponent"
    return _widened(node, inputs, {0: [inputs[1]]}, p, g, nodes)


def _where_widened(node, i: int, p: str, g: _Graph):
    """``Where`` with a value operand smaller than the result (``masked_fill`` of a weight): as for
    ``Pow``'s base, its gradient is not summed over the broadcast axes; it is ``Expand``-ed."""
    inputs = list(node.input)
    return _widened(node, inputs, {1: [inputs[0], inputs[2]], 2: [inputs[0], inputs[1]]}, p, g, [])


def _widened(node, inputs: list[str], widen: dict[int, list[str]], p: str, g: _Graph, nodes: list):
    """``node`` over ``inputs``, each input ``k`` of ``widen`` that may be broadcast first expanded
    to the shapes of the operands ``widen[k]`` it is broadcast against."""
    for k, others in widen.items():
        if not g.smaller(inputs[k], node.output[0]):
            continue
        value = inputs[k]
        for j, other in enumerate(others):
            nodes += [helper.make_node("Shape", [other], [f"{p}shape_{k}_{j}"], name=f"{p}Shape_{k}_{j}"),
                      helper.make_node("Expand", [value, f"{p}shape_{k}_{j}"], [f"{p}wide_{k}_{j}"],
                                       name=f"{p}Expand_{k}_{j}")]
            value = f"{p}wide_{k}_{j}"
        inputs[k] = value
    nodes.append(helper.make_node(node.op_type, inputs, list(node.output), name=node.name))
    return nodes, []


# -- Split with an unread output ----------------------------------------------------------------

def _split_needs(node, g: _Graph) -> bool:
    return any(not o or o not in g.consumed for o in node.output)


def _split_as_slices(node, i: int, p: str, g: _Graph):
    """``Split`` with an output nothing reads: its gradient concatenates only the gradients that
    exist, one piece short. The read outputs become ``Slice``-s of the input (sizes from the
    ``split`` input, or equal parts of a known axis length; opset 17 or later, as from_onnx makes
    every model)."""
    shape = g.shapes.shape(node.input[0])
    axis = attribute(node, "axis", 0)
    n = len(node.output)
    sizes = g.consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    sizes = None if sizes is None else [int(v) for v in np.ravel(sizes)]
    if sizes is None and (len(node.input) < 2 or not node.input[1]) and shape is not None and \
            type(shape[axis]) is int:
        length = shape[axis]
        part = -(-length // n)  # opset 18's rule: equal parts, the last one smaller
        sizes = [min(part, max(length - k * part, 0)) for k in range(n)]
    if sizes is None:
        raise UnsupportedOpError(f"{_where(node, i)} leaves an output unread, and the sizes of its parts are "
                                 f"not known (input {shape}); onnxruntime-training's gradient of that form is "
                                 "wrong. Give the split sizes, or read every output")
    nodes, inits = [], []
    start = 0
    for k, (out, size) in enumerate(zip(node.output, sizes)):
        if out and out in g.consumed:
            vals = {"starts": [start], "ends": [start + size], "axes": [axis]}
            for key, v in vals.items():
                inits.append(numpy_helper.from_array(np.array(v, np.int64), f"{p}{key}_{k}"))
            nodes.append(helper.make_node("Slice", [node.input[0], f"{p}starts_{k}", f"{p}ends_{k}", f"{p}axes_{k}"],
                                          [out], name=f"{p}Slice_{k}"))
        start += size
    return nodes, inits


# -- forms the builder fails on -----------------------------------------------------------------

def _transpose_needs(node, g: _Graph) -> bool:
    return attribute(node, "perm", None) is None


def _transpose_with_perm(node, i: int, p: str, g: _Graph):
    """``Transpose`` without ``perm`` (the builder fails on it): the explicit reversing ``perm``."""
    shape = g.shapes.shape(node.input[0])
    if shape is None:
        return [node], []
    return [helper.make_node("Transpose", list(node.input), list(node.output), name=node.name,
                             perm=list(range(len(shape)))[::-1])], []


def _reduce_needs(node, g: _Graph) -> bool:
    return not attribute(node, "keepdims", 1) and attribute(node, "axes", None) is not None


def _reduce_kept(node, i: int, p: str, g: _Graph):
    """``ReduceL2``/``ReduceLogSumExp`` without ``keepdims`` and with ``axes`` as an attribute (the
    builder fails on them): ``keepdims`` with a ``Squeeze`` after."""
    axes = list(attribute(node, "axes", []))
    kept = p + "kept"
    # from_onnx brings every model to opset 17 or later, where Squeeze takes its axes as an input
    return [helper.make_node(node.op_type, list(node.input), [kept], name=node.name, axes=axes, keepdims=1),
            helper.make_node("Squeeze", [kept, p + "axes"], list(node.output), name=p + "Squeeze")], \
        [numpy_helper.from_array(np.array(axes, np.int64), p + "axes")]


# -- ReduceMax / ReduceMin ----------------------------------------------------------------------

def _extreme_needs(node, g: _Graph) -> bool:
    return node.input[0] in g.computed and g.floating(node.input[0])


def _extreme_as_top_k(node, i: int, p: str, g: _Graph):
    """``ReduceMax``/``ReduceMin``, which have no gradient in onnxruntime-training 1.19.2, as a
    ``TopK`` of one element (which has one): the reduced axes moved last and merged into one. The
    gradient reaches the first extreme element along them, as PyTorch's ``max(dim)`` sends it to
    the index it returns (``amax`` shares it among ties instead)."""
    rank = g.shapes.rank(node.input[0])
    if rank is None:
        raise UnsupportedOpError(f"{_where(node, i)}: onnxruntime-training 1.19.2 has no gradient for {node.op_type}, "
                                 f"and ortrain trains through it as a TopK, which needs its input's rank; the rank of "
                                 f"{node.input[0]!r} is not known. Export with known ranks")
    if len(node.input) > 1 and node.input[1]:  # opset 18: axes as an input
        axes = g.consts.get(node.input[1])
        if axes is None:  # the dynamo exporter without its optimizer: Reshape(Constant, Constant)
            axes = g.constant(node.input[1])
        if axes is None:
            raise UnsupportedOpError(f"{_where(node, i)}: its axes are computed in the graph, and ortrain trains "
                                     f"through a {node.op_type} as a TopK over axes known when the graph is built. "
                                     "Export with constant axes")
        axes = [int(a) for a in np.ravel(axes)]
    else:
        axes = list(attribute(node, "axes", []))
    keepdims = attribute(node, "keepdims", 1)
    if not axes and attribute(node, "noop_with_empty_axes", 0):
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=p + "Identity")], []
    axes = sorted({a % rank for a in axes} if axes else set(range(rank)))
    rest = [a for a in range(rank) if a not in axes]
    nodes, inits = [], []
    x = node.input[0]
    if rest + axes != list(range(rank)):
        nodes.append(helper.make_node("Transpose", [x], [p + "moved"], name=p + "Transpose", perm=rest + axes))
        x = p + "moved"
    if len(axes) > 1:  # Reshape's 0 keeps the leading (unreduced) sizes, even free ones
        inits.append(numpy_helper.from_array(np.array([0] * len(rest) + [-1], np.int64), p + "merged_shape"))
        nodes.append(helper.make_node("Reshape", [x, p + "merged_shape"], [p + "merged"], name=p + "Merge"))
        x = p + "merged"
    inits += [numpy_helper.from_array(np.array([1], np.int64), p + "k"),
              numpy_helper.from_array(np.array([len(rest)], np.int64), p + "last"),
              numpy_helper.from_array(np.array(axes, np.int64), p + "axes")]
    nodes += [helper.make_node("TopK", [x, p + "k"], [p + "top", p + "index"], name=p + "TopK", axis=-1,
                               largest=int(node.op_type == "ReduceMax"), sorted=1),
              helper.make_node("Squeeze", [p + "top", p + "last"],
                               [node.output[0] if not keepdims else p + "squeezed"], name=p + "Squeeze")]
    if keepdims:
        nodes.append(helper.make_node("Unsqueeze", [p + "squeezed", p + "axes"], [node.output[0]], name=p + "Unsqueeze"))
    return nodes, inits


def _global_max_as_top_k(node, i: int, p: str, g: _Graph):
    """``GlobalMaxPool`` (no gradient in onnxruntime-training 1.19.2; an adaptive max pool to one
    cell over an image size the export left free) as the ``ReduceMax`` over the spatial axes it
    is, held as a ``TopK``: the gradient reaches the first largest element, as PyTorch's
    ``adaptive_max_pool2d`` sends it to the index it returns."""
    rank = g.shapes.rank(node.input[0])
    if rank is None:
        raise UnsupportedOpError(f"{_where(node, i)}: onnxruntime-training 1.19.2 has no gradient for GlobalMaxPool, "
                                 f"and ortrain trains through it as a TopK, which needs its input's rank; the rank "
                                 f"of {node.input[0]!r} is not known. Export with known ranks")
    reduce = helper.make_node("ReduceMax", [node.input[0]], list(node.output), name=node.name,
                              axes=list(range(2, rank)), keepdims=1)
    return _extreme_as_top_k(reduce, i, p, g)


# -- Einsum -------------------------------------------------------------------------------------

def _einsum_needs(node, g: _Graph) -> bool:
    return g.floating(node.output[0])  # the runtime has no gradient for Einsum in any form


def _equation(node) -> str:
    equation = attribute(node, "equation", b"")
    return equation.decode() if isinstance(equation, bytes) else equation


def _refuse_einsum(node, i: int, why: str):
    raise UnsupportedOpError(f"{_where(node, i)} (equation {_equation(node)!r}): {why}. "
                             "onnxruntime-training 1.19.2 has no gradient for Einsum, and ortrain trains through it "
                             "as transposes, sums and matrix products. Write it with matmul, sum and transpose")


def _einsum_labels(node, i: int, g: _Graph) -> tuple[list[list[str]], list[str]]:
    """The labels of each operand and of the output, one letter an axis, an ellipsis spelt out in
    letters the equation does not use (aligned from the right, as numpy broadcasts it)."""
    equation = _equation(node).replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(node.input):
        _refuse_einsum(node, i, f"it has {len(node.input)} inputs for {len(terms)} terms")
    spare = iter(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in equation)
    width = 0
    for term, name in zip(terms, node.input):
        if "..." in term:
            rank = g.shapes.rank(name)
            if rank is None:
                _refuse_einsum(node, i, f"the rank of {name!r}, which its ellipsis spans, is not known")
            width = max(width, rank - len(term.replace("...", "")))
    ellipsis = [next(spare) for _ in range(width)]
    labels = []
    for term, name in zip(terms, node.input):
        if "..." in term:
            head, _, tail = term.partition("...")
            n = g.shapes.rank(name) - len(head) - len(tail)
            labels.append(list(head) + ellipsis[width - n:] + list(tail))
        else:
            labels.append(list(term))
    if arrow:
        out = list(rhs.replace("...", "".join(ellipsis)))
    else:  # implicit output: the ellipsis, then the letters used once, in alphabetical order
        counts = collections.Counter(c for term in labels for c in term if c not in ellipsis)
        out = ellipsis + sorted(c for c, k in counts.items() if k == 1)
    for term in labels:
        if len(set(term)) != len(term):
            _refuse_einsum(node, i, "a label repeats within one operand (a diagonal or a trace)")
        if not all(c.isalpha() for c in term):
            _refuse_einsum(node, i, "it is not a valid equation")
    return labels, out


class _Einsum:
    """Nodes written for one Einsum; ``op`` appends one and returns its output's name."""

    def __init__(self, p: str):
        self.p, self.nodes, self.inits, self.n = p, [], [], 0

    def const(self, value) -> str:
        self.n += 1
        name = f"{self.p}c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name

    def op(self, kind: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        self.n += 1
        out = out or f"{self.p}{kind}{self.n}"
        self.nodes.append(helper.make_node(kind, inputs, [out], name=f"{self.p}{kind}{self.n}", **attrs))
        return out

    def transpose(self, x: str, have: list[str], want: list[str]) -> str:
        return x if have == want else self.op("Transpose", [x], perm=[have.index(c) for c in want])

    def sum_out(self, x: str, have: list[str], keep) -> tuple[str, list[str]]:
        """``x`` summed over the labels not in ``keep``."""
        gone = [k for k, c in enumerate(have) if c not in keep]
        if not gone:
            return x, have
        return self.op("ReduceSum", [x, self.const(gone)], keepdims=0), [c for c in have if c in keep]


def _einsum_pair(e: _Einsum, a: str, la: list[str], b: str, lb: list[str], keep: set[str], out: str | None):
    """The product of ``a`` and ``b`` summed over their shared labels not in ``keep``: its name and
    labels, in the order ``batch, a's own, b's own``. ``MatMul`` does the work: the shared labels
    kept are its batch axes, each operand's own labels but the last are axes of size 1 in the other
    (broadcast), and the summed labels are merged into the inner axis."""
    a, la = e.sum_out(a, la, keep | set(lb))
    b, lb = e.sum_out(b, lb, keep | set(la))
    batch = [c for c in la if c in lb and c in keep]
    inner = [c for c in la if c in lb and c not in keep]
    own_a = [c for c in la if c not in lb]
    own_b = [c for c in lb if c not in la]
    # the rows and columns of the product: each operand's last own label (or an axis of size 1)
    lead_a, lead_b = own_a[:-1], own_b[:-1]
    lead = batch + lead_a + lead_b
    a = e.transpose(a, la, batch + lead_a + own_a[-1:] + inner)
    b = e.transpose(b, lb, batch + lead_b + own_b[-1:] + inner)
    a = _einsum_shape(e, a, len(batch), lead_a, lead_b, bool(own_a[-1:]), len(inner), first=True)
    b = _einsum_shape(e, b, len(batch), lead_a, lead_b, bool(own_b[-1:]), len(inner), first=False)
    product = e.op("MatMul", [a, e.op("Transpose", [b], perm=[*range(len(lead)), len(lead) + 1, len(lead)])])
    # (lead..., rows, columns): drop the axes of size 1 stood in for an absent last own label
    drop = [len(lead)] if not own_a else []
    drop += [len(lead) + 1] if not own_b else []
    labels = lead + own_a[-1:] + own_b[-1:]
    if drop:
        product = e.op("Squeeze", [product, e.const(drop)], out)
    elif out is not None:
        product = e.op("Identity", [product], out)
    return product, labels


def _einsum_shape(e: _Einsum, x: str, n_batch: int, lead_a: list, lead_b: list, has_own: bool, n_inner: int,
                  first: bool) -> str:
    """An operand (``batch, its lead, its last own label, inner``) as the matrix product takes it:
    the other operand's lead as axes of size 1, an absent own label as an axis of size 1, the inner
    labels merged into one axis (one of size 1 where there is none)."""
    own_lead = len(lead_a if first else lead_b)
    if n_inner != 1:  # Reshape's 0s keep the axes before the inner ones, even free ones
        keep = n_batch + own_lead + int(has_own)
        x = e.op("Reshape", [x, e.const([0] * keep + [-1 if n_inner else 1])])
    axes = []
    if not has_own:
        axes.append(n_batch + own_lead)  # before the inner axis
    if first and lead_b:
        axes = [a + len(lead_b) for a in axes]
        axes = list(range(n_batch + own_lead, n_batch + own_lead + len(lead_b))) + axes
    if not first and lead_a:
        axes = [a + len(lead_a) for a in axes]
        axes = list(range(n_batch, n_batch + len(lead_a))) + axes
    return e.op("Unsqueeze", [x, e.const(sorted(axes))]) if axes else x


def _einsum_as_matmuls(node, i: int, p: str, g: _Graph):
    """``Einsum`` as ``Transpose``, ``ReduceSum``, ``Reshape`` and ``MatMul`` (the operands taken two
    at a time, left to right), which the gradient builder differentiates."""
    labels, out = _einsum_labels(node, i, g)
    e = _Einsum(p)
    inputs = _einsum_unbroadcast(e, list(node.input), labels, out, g)
    current, have = inputs[0], labels[0]
    for k in range(1, len(labels)):
        later = set(out).union(*map(set, labels[k + 1:]))
        current, have = _einsum_pair(e, current, have, inputs[k], labels[k], later, None)
    current, have = e.sum_out(current, have, set(out))
    if have == out:
        e.op("Identity", [current], node.output[0])
    else:
        e.op("Transpose", [current], node.output[0], perm=[have.index(c) for c in out])
    return e.nodes, e.inits


def _einsum_unbroadcast(e: _Einsum, inputs: list[str], labels: list[list[str]], out: list[str], g: _Graph):
    """``inputs`` with the axes of size 1 squeezed out where another operand has that summed label
    at a larger size (``"bj,jk->bk"`` with ``x`` of shape ``(b, 1)``: ``x`` broadcast along ``j``),
    which the matrix product would refuse; ``labels`` is updated in place."""
    sizes: dict[str, set] = collections.defaultdict(set)
    shapes = [g.shapes.shape(name) for name in inputs]
    for shape, term in zip(shapes, labels):
        for c, d in zip(term, shape or []):
            sizes[c].add(d)
    for k, (shape, term) in enumerate(zip(shapes, labels)):
        if shape is None:
            continue
        ones = [j for j, (c, d) in enumerate(zip(term, shape))
                if d == 1 and c not in out and any(type(v) is not int or v > 1 for v in sizes[c])]
        if ones:
            inputs[k] = e.op("Squeeze", [inputs[k], e.const(ones)])
            labels[k] = [c for j, c in enumerate(term) if j not in ones]
    return inputs


# -- ScatterElements and ScatterND that add ------------------------------------------------------

def _scatter_add_needs(node, g: _Graph) -> bool:
    return text_attribute(node, "reduction", "none") == "add" and \
        g.shapes.elem_type(node.input[0]) == onnx.TensorProto.FLOAT


def _scatter_add_split(node, i: int, p: str, g: _Graph):
    """``ScatterElements``/``ScatterND`` with ``reduction="add"`` as ``data + scatter(zeros, ...)``:
    the runtime differentiates a scatter as an overwrite, which gives the data a gradient of 0 at
    every target (PyTorch's ``scatter_add`` trained 0.69 off); through the ``Add`` the data's gradient
    passes whole, and the updates' is the runtime's gather, which is right for an add. A ``ScatterND``
    whose indices' last size is known is written as :func:`~ortrain.graph.passes.scatter_nd_add` (the
    runtime's own loses additions to one place on several threads)."""
    data = node.input[0]
    indices = g.shapes.shape(node.input[1]) if node.op_type == "ScatterND" else None
    k = indices[-1] if indices else None
    if type(k) is int and k >= 1:
        added = scatter_nd_add(p + "as_elements/", p + "zeros", node.input[1], node.input[2], k, p + "added")
    else:
        scatter = helper.make_node(node.op_type, [p + "zeros", *node.input[1:]], [p + "added"], name=p + node.op_type)
        scatter.attribute.extend(node.attribute)
        added = [scatter]
    nodes = [helper.make_node("Shape", [data], [p + "shape"], name=p + "Shape"),
             helper.make_node("ConstantOfShape", [p + "shape"], [p + "zeros"], name=p + "Zeros",
                              value=numpy_helper.from_array(np.zeros(1, np.float32))),
             *added,
             helper.make_node("Add", [data, p + "added"], [node.output[0]], name=p + "Add")]
    return nodes, []


# -- Pad in reflect, edge or wrap mode, or with an axes input ------------------------------------

def _pad_needs(node, g: _Graph) -> bool:
    return text_attribute(node, "mode", "constant") != "constant" or \
        (len(node.input) > 3 and bool(node.input[3]))


def _pad_as_gathers(node, i: int, p: str, g: _Graph):
    """``Pad`` in ``reflect``, ``edge`` or ``wrap`` mode, which onnxruntime-training 1.19.2's builder
    refuses (it takes ``constant`` only), as a ``Concat`` on each padded axis of the input and two
    ``Gather``-s of it: the rows the pad repeats, counted from the start before it and from the
    end after it, so no axis length need be known (reflect: ``b..1`` and ``-2..-1-e``; edge: ``0``
    and ``-1``; wrap: ``-b..-1`` and ``0..e-1``). Their gradient adds each repeated row's back into
    it, as PyTorch's ``ReflectionPad``/``ReplicationPad``/``CircularPad`` do. A ``Pad`` with an
    ``axes`` input (opset 18), which the builder also refuses, gets every axis's amounts instead.
    Pads that are not constants, or negative in these modes, leave the node as it is (refused by
    :func:`~ortrain.graph.gradient_ops.untrainable_form` where a gradient must cross it)."""
    shape = g.shapes.shape(node.input[0])
    plan = pad_plan(node, lambda name: g.consts[name] if name in g.consts else g.constant(name),
                    None if shape is None else len(shape))
    mode = text_attribute(node, "mode", "constant")
    if plan is None or (mode != "constant" and any(b < 0 or e < 0 for b, e in plan)):
        return [node], []
    if mode != "constant" and g.shapes.elem_type(node.input[0]) == onnx.TensorProto.DOUBLE:
        return [node], []  # a Concat's gradient has no float64 kernel: kept, for a pad no gradient crosses
    if mode == "constant":
        flat = [b for b, _ in plan] + [e for _, e in plan]
        inputs = [node.input[0], p + "pads"] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else [])
        return [helper.make_node("Pad", inputs, list(node.output), name=node.name or p + "Pad", mode="constant")], \
            [numpy_helper.from_array(np.array(flat, np.int64), p + "pads")]
    nodes, inits = [], []
    x = node.input[0]
    padded = [(axis, b, e) for axis, (b, e) in enumerate(plan) if b or e]
    for k, (axis, b, e) in enumerate(padded):
        before = {"reflect": range(b, 0, -1), "edge": [0] * b, "wrap": range(-b, 0)}[mode]
        after = {"reflect": range(-2, -2 - e, -1), "edge": [-1] * e, "wrap": range(e)}[mode]
        parts = {}
        for side, rows in (("before", before), ("after", after)):
            if len(rows):
                inits.append(numpy_helper.from_array(np.array(list(rows), np.int64), f"{p}{side}_rows_{axis}"))
                nodes.append(helper.make_node("Gather", [x, f"{p}{side}_rows_{axis}"], [f"{p}{side}_{axis}"],
                                              name=f"{p}Gather_{side}_{axis}", axis=axis))
                parts[side] = [f"{p}{side}_{axis}"]
        out = node.output[0] if k == len(padded) - 1 else f"{p}padded_{axis}"
        nodes.append(helper.make_node("Concat", parts.get("before", []) + [x] + parts.get("after", []), [out],
                                      name=f"{p}Concat_{axis}", axis=axis))
        x = out
    if not padded:
        nodes.append(helper.make_node("Identity", [x], list(node.output), name=p + "Identity"))
    return nodes, inits
