"""``from_onnx``: any ONNX model as a trainable :class:`~ortrain.nn.graph_model.GraphModel`."""

from __future__ import annotations

import copy
import fnmatch
import os

import numpy as np
import onnx
from onnx import numpy_helper

from ortrain.errors import OrtrainError
from ortrain.graph import OPSET
from ortrain.graph.forward import ForwardGraph, ParamSpec


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _patterns(value, argument: str) -> list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(v, str) for v in items):
        raise OrtrainError(f"{argument}: expected weight names or glob patterns (strings), received {value!r}")
    return items


def reassign_roles(fg: ForwardGraph, trainable=None, frozen=None) -> ForwardGraph:
    """Apply ``trainable=``/``frozen=`` name patterns to a forward graph's weights.

    ``trainable`` given: only matching weights train (others are frozen). ``frozen``: matching
    weights do not train. Buffers (running statistics) keep their role.
    """
    t, f = _patterns(trainable, "trainable"), _patterns(frozen, "frozen")
    names = [p.name for p in fg.params]
    for pats, arg in ((t, "trainable"), (f, "frozen")):
        for pat in pats or ():
            if not any(fnmatch.fnmatchcase(n, pat) for n in names):
                raise OrtrainError(f"{arg}: {pat!r} matches no weight; weights are {', '.join(names)}")
    params = []
    for p in fg.params:
        role = p.role
        if role != "buffer":
            role = "trainable"
            if t is not None and not _matches(p.name, t):
                role = "frozen"
            if f is not None and _matches(p.name, f):
                role = "frozen"
        params.append(ParamSpec(p.name, p.shape, p.dtype, role))
    return ForwardGraph(fg.proto, tuple(params), fg.weights)


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model)
    path = os.fspath(model)
    try:
        return onnx.load(path)
    except FileNotFoundError:
        raise OrtrainError(f"from_onnx: no such file {path!r}") from None
    except Exception as exc:
        raise OrtrainError(f"from_onnx: {path!r} is not a readable ONNX model ({exc})") from exc


def _default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 1


def canonical_forward(model: onnx.ModelProto, trainable=None, frozen=None) -> ForwardGraph:
    """Classify initializers and move the weights to graph inputs.

    Float32 initializers of rank >= 1 are weights (trainable unless frozen); the running
    statistics of BatchNormalization nodes (inputs 3 and 4, found by position) are buffers;
    everything else (scalars, integers, shapes) stays a constant.
    """
    model = copy.deepcopy(model)
    inits = {t.name: t for t in model.graph.initializer}
    # Old exporters list initializers among the graph inputs too.
    keep_inputs = [vi for vi in model.graph.input if vi.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep_inputs)
    buffers = set()
    for node in model.graph.node:
        if node.op_type == "BatchNormalization" and len(node.input) >= 5:
            buffers.update(node.input[3:5])
    params, weights, constants = [], {}, []
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 1:
            arr = numpy_helper.to_array(t).astype(np.float32, copy=False)
            role = "buffer" if t.name in buffers else "trainable"
            params.append(ParamSpec(t.name, tuple(arr.shape), np.dtype(np.float32), role))
            weights[t.name] = np.ascontiguousarray(arr)
        else:
            constants.append(t)
    del model.graph.initializer[:]
    model.graph.initializer.extend(constants)
    model.graph.input.extend(ps_to_vi(p) for p in params)
    fg = ForwardGraph(model, tuple(params), weights)
    return reassign_roles(fg, trainable, frozen) if (trainable is not None or frozen is not None) else fg


def ps_to_vi(p: ParamSpec) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(p.name, onnx.TensorProto.FLOAT, list(p.shape))


def from_onnx(model, trainable=None, frozen=None, input_names=None, name: str | None = None):
    """Turn an ONNX model (path or ``ModelProto``) into a trainable model."""
    from ortrain.nn.graph_model import GraphModel
    proto = _load(model)
    if _default_opset(proto) < OPSET:
        from onnx import version_converter
        try:
            proto = version_converter.convert_model(proto, OPSET)
        except Exception as exc:
            raise OrtrainError(f"from_onnx: could not upgrade opset {_default_opset(proto)} to {OPSET}: {exc}") \
                from exc
    fg = canonical_forward(proto, trainable, frozen)
    return GraphModel(fg, name=name or (proto.graph.name or "onnx_model"))
