"""Forms whose gradient onnxruntime-training 1.19.2 builds wrong, silently or not, rewritten into
forms with the same values whose gradient it builds right (each measured against PyTorch).

Only the training and eval graphs are rewritten (:func:`for_training`); the model a user exports
keeps its own ops, but for one form that onnxruntime's inference optimizer gets wrong as well
(:func:`matmul_vectors_as_matrices`). Each entry of ``FORMS`` pairs a test (does this node need
a rewrite?) with the rewrite, which returns the nodes and initializers that stand for the node.
A form that cannot be rewritten because a shape is unknown is refused, naming the node.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.builder import OPSET
from ortrain.graph.passes import (
    SAME,
    attribute,
    average_pool_as_conv,
    int64_constants,
    name_batch_dimension,
    node_inputs,
    replace_nodes,
    same_pads,
    text_attribute,
)

__all__ = ["FORMS", "Shapes", "conv_with_explicit_pads", "for_training", "gradient_forms",
           "matmul_vectors_as_matrices"]

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def for_training(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrites that only the training and eval graphs need (the exported model is left alone)."""
    return name_batch_dimension(gradient_forms(average_pool_as_conv(model)))


class Shapes:
    """Shapes and element types of a graph's values, by what it declares or else onnx's inference
    (``None`` where neither knows; unknown dimensions are ``None``)."""

    def __init__(self, model: onnx.ModelProto):
        self._model = model
        self._declared, self._inferred = None, None

    def _info(self, name: str):
        if self._declared is None:
            self._declared = _declared(self._model.graph)
        found = self._declared.get(name)  # what the graph says; onnx's inference only for the rest
        if found is None:
            if self._inferred is None:
                try:
                    self._inferred = _declared(onnx.shape_inference.infer_shapes(self._model).graph)
                except Exception:  # a graph onnx cannot type: what it declares is all there is
                    self._inferred = self._declared
            found = self._inferred.get(name)
        return found or (None, 0)

    def shape(self, name: str) -> list | None:
        """Dimensions: ints, symbolic names (str) or None (unknown); None when the rank is unknown."""
        return self._info(name)[0]

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def sizes(self, name: str) -> list[int] | None:
        """The shape when every dimension is a known int, else None."""
        shape = self.shape(name)
        return shape if shape is not None and all(type(d) is int for d in shape) else None

    def same(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` surely have one shape: equal, every dimension known or named alike."""
        sa = self.shape(a)
        return sa is not None and None not in sa and sa == self.shape(b)

    def elem_type(self, name: str) -> int:
        return self._info(name)[1]


def _declared(g) -> dict[str, tuple[list | None, int]]:
    """``{name: (shape, element type)}`` for what graph ``g`` declares (a shape of ints, the names of
    symbolic dimensions and ``None`` for unknown ones; or ``None`` without one); an initializer
    first, then the first declaration among inputs, value_info and outputs."""
    table = {t.name: (list(t.dims), t.data_type) for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.name in table or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] \
            if tt.HasField("shape") else None
        table[vi.name] = (shape, tt.elem_type)
    return table


class _Graph:
    """What the tests and rewrites need to know of the whole graph."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.shapes = Shapes(model)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
        self.consumed = {i for n in g.node for i in node_inputs(n)} | {o.name for o in g.output}
        # values a node computes from the graph's inputs (the weights are inputs here), not constants
        constant = {t.name for t in g.initializer}
        for n in g.node:
            if n.op_type in ("Constant", "ConstantOfShape") or (n.input and all(i in constant for i in n.input if i)):
                constant.update(n.output)
        self.computed = ({o for n in g.node for o in n.output} | {i.name for i in g.input}) - constant
        self.norm_reads = collections.Counter(v for n in g.node if n.op_type == "LayerNormalization"
                                              for v in n.input[1:3] if v)
        self.consts = int64_constants(model)

    def smaller(self, value: str, out: str) -> bool:
        """A value a gradient reaches that may be broadcast to ``out``'s shape."""
        return value in self.computed and not self.shapes.same(value, out)


def _where(node, i: int) -> str:
    return f"{node.op_type} node {node.name or i!r}"


# Each rewrite: (node, its index, a prefix for new names, the graph) -> (nodes, initializers)
Rewrite = Callable[[onnx.NodeProto, int, str, _Graph], tuple[list, list]]


class Form(NamedTuple):
    needs: Callable[[onnx.NodeProto, _Graph], bool]
    rewrite: Rewrite


def gradient_forms(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every node that ``FORMS`` says needs it rewritten (``model`` itself when none does).
    The forms are listed in the docstrings of the ``FORMS`` entries."""
    if not any(n.op_type in FORMS for n in model.graph.node):
        return model
    g = _Graph(model)

    def needs(node) -> bool:
        form = FORMS.get(node.op_type)
        return form is not None and form.needs(node, g)

    def rewrite(i, node):
        return FORMS[node.op_type].rewrite(node, i, f"{node.name or node.op_type}/gradient_form_{i}/", g)

    return replace_nodes(model, needs, rewrite)


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


# -- Conv with auto_pad SAME --------------------------------------------------------------------

def _conv_needs(node, g: _Graph) -> bool:
    return text_attribute(node, "auto_pad", "NOTSET") in SAME


def _conv_explicit(node, i: int, p: str, g: _Graph):
    """``Conv`` with ``auto_pad`` SAME_UPPER/SAME_LOWER: the gradient is wrong (and with stride 2
    reads uninitialized memory). The padding becomes explicit ``pads``."""
    explicit = conv_with_explicit_pads(node, g.shapes)
    if explicit is None:
        raise UnsupportedOpError(f"{_where(node, i)} pads with auto_pad, and its input's sizes are not known "
                                 f"(input {g.shapes.shape(node.input[0])}); onnxruntime-training's gradient of "
                                 "that form is wrong. Export with explicit padding or static image sizes")
    return [explicit], []


def conv_with_explicit_pads(node: onnx.NodeProto, shapes: Shapes) -> onnx.NodeProto | None:
    """``node``, a ``Conv`` with ``auto_pad`` SAME_UPPER/SAME_LOWER, with the same padding written as
    ``pads`` (dilations counted); None when the input's or the kernel's sizes are not known."""
    shape, wshape = shapes.shape(node.input[0]), shapes.sizes(node.input[1])
    if shape is None or wshape is None:
        return None
    kernel = list(attribute(node, "kernel_shape", wshape[2:]))
    dilations = list(attribute(node, "dilations", [1] * len(kernel)))
    strides = list(attribute(node, "strides", [1] * len(kernel)))
    effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    # at stride 1 the padding is k - 1 whatever the size; other strides need the size
    sizes = [d if type(d) is int else (1 if st == 1 else None) for d, st in zip(shape[2:], strides)]
    if None in sizes:
        return None
    pads = same_pads(text_attribute(node, "auto_pad", "SAME_UPPER"), sizes, effective, strides)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "auto_pad"}
    return helper.make_node("Conv", list(node.input), list(node.output), name=node.name, **attrs, pads=pads)


# -- LayerNormalization -------------------------------------------------------------------------

def _layer_norm_needs(node, g: _Graph) -> bool:
    bias = node.input[2] if len(node.input) > 2 else ""
    return not bias or bias not in g.computed or _layer_norm_decompose(node, g)


def _layer_norm_decompose(node, g: _Graph) -> bool:
    """Whether the builder's gradient cannot take ``node`` with any bias: its scale is a constant,
    a weight another LayerNormalization reads too, or its statistics are read."""
    scale = node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    return scale not in g.computed or any(g.norm_reads[v] > 1 for v in (scale, bias) if v) or \
        any(o in g.consumed for o in node.output[1:] if o)


def _layer_norm_rewritten(node, i: int, p: str, g: _Graph):
    """``LayerNormalization`` the builder cannot take. Its gradient takes only a weight of the
    node's own as the scale: it fails on a constant scale and on a weight two such nodes read
    ("Duplicate definition of name (..._grad)"), and on a missing or constant bias; and where the
    ``Mean``/``InvStdDev`` outputs are read it ignores what flows into them (silently wrong).
    Those nodes are written out in plain ops; a node whose only fault is its bias gets one
    computed from the scale (``scale * 0``, plus the constant bias), which keeps the fused kernel."""
    if _layer_norm_decompose(node, g):
        return _layer_norm_decomposed(node, i, p, g)
    scale = node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(g.shapes.elem_type(scale) or onnx.TensorProto.FLOAT)
    inits = [numpy_helper.from_array(np.zeros((), dtype), p + "zero")]
    nodes = [helper.make_node("Mul", [scale, p + "zero"], [p + "zero_bias" if bias else p + "bias"],
                              name=p + "ZeroBias")]
    if bias:
        nodes.append(helper.make_node("Add", [p + "zero_bias", bias], [p + "bias"], name=p + "Bias"))
    new = helper.make_node(node.op_type, [node.input[0], scale, p + "bias"], list(node.output), name=node.name)
    new.attribute.extend(node.attribute)
    return nodes + [new], inits


def _layer_norm_decomposed(node, i: int, p: str, g: _Graph):
    """``LayerNormalization`` as the ops it stands for, ``(x - mean) / sqrt(var + eps) * scale +
    bias`` over the axes from ``axis`` on, with its ``Mean`` and ``InvStdDev`` outputs where they
    are read. These ops have gradients."""
    shape = g.shapes.shape(node.input[0])
    if shape is None:
        raise UnsupportedOpError(f"LayerNormalization node {node.name or i!r} has weights onnxruntime-training's "
                                 "gradient cannot take (constant or shared), or its statistics are read, and its "
                                 "input's rank is not known, so ortrain cannot write it out in plain ops. Export "
                                 "with known ranks")
    rank = len(shape)
    axes = list(range(attribute(node, "axis", -1) % rank, rank))
    eps = attribute(node, "epsilon", 1e-5)
    inits = [numpy_helper.from_array(np.array(eps, np.float32), p + "eps")]

    def mean(x: str, out: str) -> onnx.NodeProto:
        if g.opset >= 18:  # axes became an input
            return helper.make_node("ReduceMean", [x, p + "axes"], [out], name=out, keepdims=1)
        return helper.make_node("ReduceMean", [x], [out], name=out, axes=axes, keepdims=1)

    if g.opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), p + "axes"))
    y = p + "normed"
    nodes = [mean(node.input[0], p + "mean"),
             helper.make_node("Sub", [node.input[0], p + "mean"], [p + "centred"], name=p + "Sub"),
             helper.make_node("Mul", [p + "centred", p + "centred"], [p + "squares"], name=p + "Square"),
             mean(p + "squares", p + "var"),
             helper.make_node("Add", [p + "var", p + "eps"], [p + "var_eps"], name=p + "AddEps"),
             helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "Sqrt"),
             helper.make_node("Div", [p + "centred", p + "std"], [y], name=p + "Div"),
             helper.make_node("Mul", [y, node.input[1]], [p + "scaled"], name=p + "Scale")]
    if len(node.input) > 2 and node.input[2]:
        nodes.append(helper.make_node("Add", [p + "scaled", node.input[2]], [node.output[0]], name=p + "Bias"))
    else:
        nodes.append(helper.make_node("Identity", [p + "scaled"], [node.output[0]], name=p + "Out"))
    statistics = list(node.output[1:3]) + [""] * (3 - len(node.output))
    if statistics[0] in g.consumed:
        nodes.append(helper.make_node("Identity", [p + "mean"], [statistics[0]], name=p + "Mean"))
    if statistics[1] in g.consumed:
        nodes.append(helper.make_node("Reciprocal", [p + "std"], [statistics[1]], name=p + "InvStdDev"))
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


def _recurrent_layout(op: str) -> tuple[int, tuple[int, ...]]:
    """How many outputs an ``LSTM``/``GRU`` has, and which inputs are its initial states."""
    return (3, (5, 6)) if op == "LSTM" else (2, (5,))


def _recurrent_needs(node, g: _Graph) -> bool:
    full, states = _recurrent_layout(node.op_type)
    return len(node.output) < full or any(len(node.input) <= k or not node.input[k] for k in states)


def _recurrent_complete(node, i: int, p: str, g: _Graph):
    """``LSTM``/``GRU`` without initial states or naming only some outputs (the builder's graph fails
    to type): zero initial states, as PyTorch's exports write them, and every output named."""
    full, states = _recurrent_layout(node.op_type)
    outputs = list(node.output) + [""] * (full - len(node.output))
    outputs = [o or f"{p}output_{k}" for k, o in enumerate(outputs)]
    inputs = list(node.input) + [""] * (max(states) + 1 - len(node.input))
    nodes, inits = [], []
    if any(not inputs[k] for k in states):
        directions = 2 if text_attribute(node, "direction", "forward") == "bidirectional" else 1
        hidden = attribute(node, "hidden_size", None)
        batch_first = attribute(node, "layout", 0) == 1
        inits += [numpy_helper.from_array(np.array([1 if not batch_first else 0], np.int64), p + "batch_axis"),
                  numpy_helper.from_array(np.array([directions], np.int64), p + "directions"),
                  numpy_helper.from_array(np.array([hidden], np.int64), p + "hidden")]
        dims = [p + "batch", p + "directions"] if batch_first else [p + "directions", p + "batch"]
        nodes += [helper.make_node("Shape", [inputs[0]], [p + "x_shape"], name=p + "Shape"),
                  helper.make_node("Gather", [p + "x_shape", p + "batch_axis"], [p + "batch"], name=p + "Batch",
                                   axis=0),
                  helper.make_node("Concat", [*dims, p + "hidden"], [p + "state_shape"], name=p + "StateShape",
                                   axis=0),
                  helper.make_node("ConstantOfShape", [p + "state_shape"], [p + "zeros"], name=p + "Zeros",
                                   value=numpy_helper.from_array(np.zeros(1, np.float32)))]
        for k in states:
            inputs[k] = inputs[k] or p + "zeros"
    new = helper.make_node(node.op_type, inputs, outputs, name=node.name)
    new.attribute.extend(node.attribute)
    return nodes + [new], inits


FORMS: dict[str, Form] = {
    "MatMul": Form(_matmul_needs, _matmul_as_matrix),
    "Pow": Form(_pow_needs, _pow_widened),
    "Where": Form(_where_needs, _where_widened),
    "Split": Form(_split_needs, _split_as_slices),
    "Conv": Form(_conv_needs, _conv_explicit),
    "LayerNormalization": Form(_layer_norm_needs, _layer_norm_rewritten),
    "Transpose": Form(_transpose_needs, _transpose_with_perm),
    "ReduceL2": Form(_reduce_needs, _reduce_kept),
    "ReduceLogSumExp": Form(_reduce_needs, _reduce_kept),
    "LSTM": Form(_recurrent_needs, _recurrent_complete),
    "GRU": Form(_recurrent_needs, _recurrent_complete),
}
