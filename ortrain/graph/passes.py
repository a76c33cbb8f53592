"""Pure rewrites of forward graphs. Each returns a new model and leaves its input alone."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _rank_of(model: onnx.ModelProto, name: str) -> int | None:
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    return None


def freeze_batchnorm_stats(model: onnx.ModelProto, running_means: set[str]) -> onnx.ModelProto:
    """Write out the BatchNormalization nodes whose running mean is in ``running_means`` in inference form.

    ``(x - mean) * gamma / sqrt(var + eps) + beta`` in plain ops normalises by the running
    statistics in training steps too (onnxruntime-training turns every BatchNormalization
    node into a batch-statistics node), and leaves the statistics unchanged.
    """
    if not running_means:
        return model
    out = copy.deepcopy(model)
    nodes = []
    counter = 0
    for node in out.graph.node:
        if node.op_type != "BatchNormalization" or len(node.input) < 5 or node.input[3] not in running_means:
            nodes.append(node)
            continue
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        x, gamma, beta, mean, var = node.input[:5]
        rank = _rank_of(model, x) or 2
        p = f"{node.name or 'bn'}/frozen_{counter}/"
        counter += 1
        params = [gamma, beta, mean, var]
        if rank > 2:
            axes = p + "axes"
            out.graph.initializer.append(numpy_helper.from_array(np.arange(1, rank - 1, dtype=np.int64), axes))
            params = []
            for i, n in enumerate((gamma, beta, mean, var)):
                nodes.append(helper.make_node("Unsqueeze", [n, axes], [f"{p}u{i}"], name=f"{p}Unsqueeze_{i}"))
                params.append(f"{p}u{i}")
        g, b, m, v = params
        out.graph.initializer.append(numpy_helper.from_array(np.array(eps, np.float32), p + "eps"))
        nodes += [
            helper.make_node("Add", [v, p + "eps"], [p + "var_eps"], name=p + "Add_eps"),
            helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "Sqrt"),
            helper.make_node("Div", [g, p + "std"], [p + "scale"], name=p + "Div"),
            helper.make_node("Sub", [x, m], [p + "centered"], name=p + "Sub"),
            helper.make_node("Mul", [p + "centered", p + "scale"], [p + "scaled"], name=p + "Mul"),
            helper.make_node("Add", [p + "scaled", b], [node.output[0]], name=p + "Add"),
        ]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def batchnorm_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """BatchNormalization nodes in graph order (their inputs 3 and 4 are the running statistics)."""
    return [n for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) >= 5]


def with_extra_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The same graph also returning the intermediate values ``names``."""
    out = copy.deepcopy(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    return out
