"""The opsets and IR versions onnxruntime-training 1.19.2 reads, and the conversion of a model
from elsewhere into them (onnx's version converter)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from ortrain.errors import OrtrainError
from ortrain.graph.builder import IR_VERSION, OPSET
from ortrain.graph.passes import all_nodes, subgraphs

__all__ = ["MAX_OPSET", "default_opset", "upgrade_opset"]

MAX_OPSET = 21  # the newest default-domain opset onnxruntime 1.19.2 loads
MAX_IR = 10  # the newest IR version it reads


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _asymmetric_resizes(model: onnx.ModelProto) -> dict[str, bytes | None]:
    """The outputs of ``Upsample`` and ``Resize`` nodes of opsets before 11, which sample at
    ``x_out / scale`` (``asymmetric``), each with the ``nearest_mode`` that picks the input
    onnxruntime's nearest mode picks there (the one below when every scale enlarges, the one above
    when every scale shrinks; None where the scales are not known or mixed, where onnxruntime picks
    per axis and no opset-11 mode says so). A linear resize maps to ``b"linear"``."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value":
            constants[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    found: dict[str, bytes | None] = {}
    for n in model.graph.node:
        if n.op_type not in ("Upsample", "Resize") or not n.output:
            continue
        given = next((list(a.floats) for a in n.attribute if a.name == "scales"), None)
        if given is None and len(n.input) > 1:
            given = constants.get(n.input[1])
        scales = [float(s) for s in np.ravel(given)] if given is not None else []
        mode = next((a.s for a in n.attribute if a.name == "mode"), b"nearest")
        found[n.output[0]] = (b"linear" if mode != b"nearest" else b"floor" if scales and min(scales) >= 1 else
                              b"ceil" if scales and max(scales) <= 1 else None)
    return found


def _keep_asymmetric(model: onnx.ModelProto, outputs: dict[str, bytes | None]) -> None:
    """Give the ``Resize`` nodes converted from ``outputs`` (in the graph's order) their old
    sampling: onnx's converter keeps only the mode, and opset 11 reads a missing coordinate mode as ``half_pixel`` (a linear resize
    of a row of 0..3 by 2 was ``0 .25 .75 ...`` where onnxruntime computes ``0 .5 1 ...``)."""
    resizes = [n for n in model.graph.node if n.op_type == "Resize" and n.output]
    # in order where the converter made one Resize of each node (it renames some outputs: an Upsample
    # of opset 9 read by another node), else by name
    by_order = len(resizes) == len(outputs)
    for k, node in enumerate(resizes):
        sampled = list(outputs.values())[k] if by_order else outputs.get(node.output[0])
        if sampled is not None:
            settings = {"coordinate_transformation_mode": b"asymmetric"}
            if sampled != b"linear":  # nearest: the converter's form is kept where no mode fits (None)
                settings["nearest_mode"] = sampled
            for attr in node.attribute:
                settings.pop(attr.name, None)
            node.attribute.extend(helper.make_attribute(k, v) for k, v in settings.items())


def _shape_constants_as_vectors(model: onnx.ModelProto) -> None:
    """onnx's converter writes a ``Reshape``'s old ``shape`` attribute (opsets before 5) as a
    ``Constant`` tensor without dims, which no reader can take as the vector it is."""
    shapes = {n.input[1] for n in model.graph.node if n.op_type == "Reshape" and len(n.input) > 1}
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.output or node.output[0] not in shapes:
            continue
        for attr in node.attribute:
            if attr.name == "value" and not attr.t.dims:
                attr.t.dims.append(len(attr.t.int64_data) or len(attr.t.int32_data) or 1)


def _without_test_flags(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Dropout`` and ``BatchNormalization`` of opsets before 7 carry ``is_test``, which onnx's
    converter takes only as 1 (it refused a training-mode export, ``is_test=0``). ortrain picks the
    mode itself, as it does for the later opsets without the flag: the training form in training
    steps, the inference form in evaluation, prediction and export. So the flag is set to 1."""
    flagged = [n for n in model.graph.node if n.op_type in ("Dropout", "BatchNormalization")
               and any(a.name == "is_test" and a.i != 1 for a in n.attribute)]
    if not flagged:
        return model
    out = copy.deepcopy(model)
    for node in out.graph.node:
        for attr in node.attribute:
            if node.op_type in ("Dropout", "BatchNormalization") and attr.name == "is_test":
                attr.i = 1
    return out


def _pad_values_of_constant_mode_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A ``Pad`` of opsets before 11 in ``reflect`` or ``edge`` mode loses its ``value`` attribute,
    which only the ``constant`` mode reads: onnx's converter moves it to an input in that mode alone,
    and left it in the others, where the converted model is invalid."""
    def stray(n) -> bool:
        mode = next((a.s for a in n.attribute if a.name == "mode"), b"constant")
        return n.op_type == "Pad" and mode != b"constant" and any(a.name == "value" for a in n.attribute)

    if not any(stray(n) for n in model.graph.node):
        return model
    out = copy.deepcopy(model)
    for node in out.graph.node:
        if stray(node):
            kept = [a for a in node.attribute if a.name != "value"]
            del node.attribute[:]
            node.attribute.extend(kept)
    return out


# Stand-ins for free sizes while onnx's converter runs: far from any size a model writes down.
_STAND_IN = 1_000_003


def _convert(model: onnx.ModelProto, want: int) -> onnx.ModelProto:
    """onnx's converter, which refuses free sizes where an adapter checks a broadcast (opset 6's
    ``Gemm`` and arithmetic with ``broadcast=1``: "Dimension is a param instead of an int"). There it
    converts the model with each free size (each name, each unnamed axis) as a large stand-in number
    and puts the free sizes back (a size the converter computed from stand-ins becomes unnamed),
    unless the converted graph wrote a stand-in down (then the first error stands)."""
    try:
        return version_converter.convert_version(model, want)
    except Exception as exc:  # noqa: BLE001 - onnx's converter raises RuntimeError, IndexError, ...
        if "is a param instead of an int" not in str(exc):
            raise
        first = exc
    fixed = copy.deepcopy(model)
    free: dict[int, str] = {}  # stand-in -> dim_param ('' for an unnamed axis)
    names: dict[str, int] = {}
    for dim in _dims(fixed.graph):
        if dim.HasField("dim_value"):
            continue
        name = dim.dim_param
        value = names.setdefault(name, _STAND_IN + len(free)) if name else _STAND_IN + len(free)
        free[value] = name
        dim.dim_value = value
    try:
        out = version_converter.convert_version(fixed, want)
    except Exception:  # noqa: BLE001
        raise first from None
    if any(v in free for v in _written_integers(out.graph)):
        raise first
    for dim in _dims(out.graph):
        if dim.HasField("dim_value") and dim.dim_value >= _STAND_IN:  # a stand-in, or a size computed from one
            name = free.get(dim.dim_value, "")
            dim.Clear()
            if name:
                dim.dim_param = name
    return out


def _dims(graph: onnx.GraphProto):
    """Every dimension of the graph's declared inputs, outputs and value infos, subgraphs included."""
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            yield from info.type.tensor_type.shape.dim
    for node in graph.node:
        for sub in subgraphs(node):
            yield from _dims(sub)


def _written_integers(graph: onnx.GraphProto):
    """The integers a graph writes down: integer initializers and constants, integer attributes."""
    tensors = list(graph.initializer)
    for node in all_nodes(graph):
        for attr in node.attribute:
            yield from attr.ints
            if attr.type == onnx.AttributeProto.INT:
                yield attr.i
            tensors.extend([attr.t] if attr.HasField("t") else attr.tensors)
    for sub in (g for n in all_nodes(graph) for g in subgraphs(n)):
        tensors.extend(sub.initializer)
    for t in tensors:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            yield from numpy_helper.to_array(t).ravel().tolist()


def upgrade_opset(model: onnx.ModelProto, target: int = OPSET) -> onnx.ModelProto:
    """Convert opsets older than ``target`` (and newer than onnxruntime reads) with onnx's converter.

    Opsets from ``target`` to ``MAX_OPSET`` are kept: converting down can lose ops, and
    ortrain's loss graphs are valid at all of them.
    """
    have = default_opset(model)
    want = target if have < target else MAX_OPSET if have > MAX_OPSET else None
    out = model
    if want is not None:
        resized = _asymmetric_resizes(model) if have < 11 else {}
        if have < 7:
            model = _without_test_flags(model)
        if have < 11:
            model = _pad_values_of_constant_mode_only(model)
        try:
            out = _convert(model, want)
        except Exception as exc:
            raise OrtrainError(f"from_onnx: the model uses opset {have}; converting it to opset {want} (what "
                               f"onnxruntime-training 1.19.2 trains) failed: {str(exc).splitlines()[0]}. "
                               f"Re-export it with opset_version between {target} and {MAX_OPSET}") from exc
        _keep_asymmetric(out, resized)
        _shape_constants_as_vectors(out)
    else:
        out = copy.deepcopy(model)
    needed = helper.find_min_ir_version_for(list(out.opset_import), ignore_unknown=True)
    out.ir_version = min(max(needed, IR_VERSION), MAX_IR)
    return out
