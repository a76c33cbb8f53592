"""Gradient forms of the normalizations onnxruntime-training 1.19.2 cannot differentiate (the
``FORMS`` entries of :mod:`ortrain.graph.gradient_forms`): ``InstanceNormalization`` and
``GroupNormalization`` (opset 18, a scale and bias per group; opset 21, per channel), written out
as the ops they stand for, whose gradients the builder has:

    mean = ReduceMean(x, stats axes);  d = x - mean;  var = ReduceMean(d * d, stats axes)
    y = d / Sqrt(var + epsilon) * scale + bias

with the population variance, as the ops' definitions and PyTorch compute it. PyTorch exports
``nn.InstanceNorm1d/2d/3d`` as ``InstanceNormalization``, and ``nn.GroupNorm`` as ``Reshape`` to
``(N, groups, -1)``, an ``InstanceNormalization`` with constant ones and zeros, ``Reshape`` back
and a per-channel ``Mul`` and ``Add`` (its dynamo exporter at opset 21: ``GroupNormalization``).
Only the training and eval graphs hold these forms; the model predictions run and the exported
model keep the original op, which onnxruntime runs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.passes import attribute
from ortrain.graph.shapes import _Graph, _where

__all__: list[str] = []


def _norm_needs(node, g: _Graph) -> bool:
    return True  # the runtime has no gradient for either op in any form


def _dtype(g: _Graph, name: str):
    return helper.tensor_dtype_to_np_dtype(g.shapes.elem_type(name) or onnx.TensorProto.FLOAT)


def _normalized(x: str, axes: list[int], eps: float, p: str, g: _Graph, dtype):
    """Nodes and initializers computing ``(x - mean) / sqrt(var + eps)`` over ``axes`` (kept);
    returns them and the name of the result."""
    inits = [numpy_helper.from_array(np.array(eps, dtype), p + "eps")]
    if g.opset >= 18:  # axes became an input
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), p + "axes"))

    def mean(v: str, out: str) -> onnx.NodeProto:
        if g.opset >= 18:
            return helper.make_node("ReduceMean", [v, p + "axes"], [out], name=out, keepdims=1)
        return helper.make_node("ReduceMean", [v], [out], name=out, axes=axes, keepdims=1)

    nodes = [mean(x, p + "mean"),
             helper.make_node("Sub", [x, p + "mean"], [p + "centred"], name=p + "Sub"),
             helper.make_node("Mul", [p + "centred", p + "centred"], [p + "squares"], name=p + "Square"),
             mean(p + "squares", p + "var"),
             helper.make_node("Add", [p + "var", p + "eps"], [p + "var_eps"], name=p + "AddEps"),
             helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "Sqrt"),
             helper.make_node("Div", [p + "centred", p + "std"], [p + "normed"], name=p + "Div")]
    return nodes, inits, p + "normed"


def _affine(normed: str, scale: str, bias: str, trailing: int, out: str, p: str):
    """``normed * scale + bias``, ``scale`` and ``bias`` (vectors) read as ``(-1, 1, ..., 1)`` with
    ``trailing`` ones, so they broadcast over the axes after theirs."""
    shape = p + "param_shape"
    inits = [numpy_helper.from_array(np.array([-1] + [1] * trailing, np.int64), shape)]
    nodes = [helper.make_node("Reshape", [scale, shape], [p + "scale"], name=p + "ScaleShape"),
             helper.make_node("Reshape", [bias, shape], [p + "bias"], name=p + "BiasShape"),
             helper.make_node("Mul", [normed, p + "scale"], [p + "scaled"], name=p + "Scale"),
             helper.make_node("Add", [p + "scaled", p + "bias"], [out], name=p + "Bias")]
    return nodes, inits


def _rank(node, i: int, g: _Graph, least: int) -> int:
    rank = g.shapes.rank(node.input[0])
    if rank is None or rank < least:
        found = "is not known" if rank is None else f"is {rank}"
        raise UnsupportedOpError(
            f"{_where(node, i)}: onnxruntime-training 1.19.2 has no gradient for {node.op_type}, and ortrain writes "
            f"it out in ops that have one over the axes after the channels, which needs its input's rank; the "
            f"rank of input {node.input[0]!r} {found} (at least {least} needed). Export with known ranks")
    return rank


def _instance_norm_decomposed(node, i: int, p: str, g: _Graph):
    """``InstanceNormalization(x, scale, B)``: each (sample, channel) normalized over the axes from 2
    on, then ``scale`` and ``B`` (one per channel) applied."""
    rank = _rank(node, i, g, 3)
    x, scale, bias = node.input[0], node.input[1], node.input[2]
    nodes, inits, normed = _normalized(x, list(range(2, rank)), attribute(node, "epsilon", 1e-5), p, g,
                                       _dtype(g, x))
    more, more_inits = _affine(normed, scale, bias, rank - 2, node.output[0], p)
    return nodes + more, inits + more_inits


def _group_norm_decomposed(node, i: int, p: str, g: _Graph):
    """``GroupNormalization(X, scale, bias, num_groups)``: ``X`` read as ``(N, num_groups, -1)``, each
    (sample, group) normalized, then ``scale`` and ``bias`` applied per group (opset 18, where
    they have ``num_groups`` values) or per channel (opset 21, ``C`` values) and the result read
    back in ``X``'s shape. ``stash_type`` (opset 21) is the precision of the statistics: float32
    inputs, the only ones ortrain trains, keep float32 statistics at its default."""
    x, scale, bias = node.input[0], node.input[1], node.input[2]
    groups = attribute(node, "num_groups", None)
    if not groups:
        raise UnsupportedOpError(f"{_where(node, i)} has no num_groups attribute; the model is invalid")
    per_group = g.opset < 21
    rank = None if per_group else _rank(node, i, g, 2)
    inits = [numpy_helper.from_array(np.array([0, groups, -1], np.int64), p + "grouped_shape")]
    nodes = [helper.make_node("Reshape", [x, p + "grouped_shape"], [p + "grouped"], name=p + "Group"),
             helper.make_node("Shape", [x], [p + "x_shape"], name=p + "Shape")]
    more, more_inits, normed = _normalized(p + "grouped", [2], attribute(node, "epsilon", 1e-5), p, g,
                                           _dtype(g, x))
    nodes += more
    inits += more_inits
    if per_group:
        more, more_inits = _affine(normed, scale, bias, 1, p + "affine", p)
        nodes += more + [helper.make_node("Reshape", [p + "affine", p + "x_shape"], [node.output[0]],
                                          name=p + "Ungroup")]
    else:
        nodes.append(helper.make_node("Reshape", [normed, p + "x_shape"], [p + "ungrouped"], name=p + "Ungroup"))
        more, more_inits = _affine(p + "ungrouped", scale, bias, rank - 2, node.output[0], p)
        nodes += more
    return nodes, inits + more_inits
