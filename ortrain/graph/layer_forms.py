"""Gradient forms of layer ops (the ``FORMS`` entries of :mod:`ortrain.graph.gradient_forms`):
``Conv`` with ``auto_pad`` SAME, ``LayerNormalization`` the builder cannot take, ``LSTM``/``GRU``
without initial states or with unnamed outputs; and :func:`conv_with_explicit_pads`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.passes import SAME, attribute, same_pads, text_attribute
from ortrain.graph.shapes import Shapes, _Graph, _where

__all__ = ["conv_with_explicit_pads"]


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
    a weight another LayerNormalization reads too, its statistics are read, or it normalises one
    element (the runtime's ``LayerNormalizationGrad`` fails on rows of one: PyTorch's
    ``LayerNorm(1)`` exported, a normalisation after ``Dense(1)``)."""
    scale = node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    return scale not in g.computed or any(g.norm_reads[v] > 1 for v in (scale, bias) if v) or \
        any(o in g.consumed for o in node.output[1:] if o) or _normalises_one(node, g)


def _normalises_one(node, g: _Graph) -> bool:
    """By the input's shape, or where its sizes are known only at run time by the scale's, which
    holds one value per element normalised."""
    shape = g.shapes.shape(node.input[0])
    if shape:
        normalised = shape[attribute(node, "axis", -1) % len(shape):]
        if normalised and all(d == 1 for d in normalised):
            return True
        if all(type(d) is int for d in normalised):
            return False
    scale = g.shapes.sizes(node.input[1])
    return scale is not None and int(np.prod(scale)) == 1


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
                                 f"input's rank is not known, so ortrain cannot write it out in plain ops. Export "
                                 f"with known ranks, or give the file a value_info of {node.input[0]!r} with its shape "
                                 "(onnx's shape inference stops at ops it does not know, such as com.microsoft ones "
                                 "an onnxruntime-optimized file holds)")
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


# -- LSTM and GRU, which the builder fails on ---------------------------------------------------

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
