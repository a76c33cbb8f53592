"""Which operators onnxruntime-training 1.19.2 can differentiate, and a check of a graph against them.

The gradient builder fails on the first node it cannot differentiate, naming only
that op. ortrain checks the whole graph first and names every offending op and
node at once, so one error tells a user everything to freeze or replace.

``GRADIENT_OPS`` was measured, not copied from documentation: every single-node
model of the ONNX backend test suite (the ``onnx`` wheel's
``backend/test/data/node``) whose float inputs were made trainable was handed to
the gradient builder of the installed wheel; an op is listed when the builder
knows it (``tests/data/probe_gradient_ops.py`` repeats the measurement and the
test suite checks a sample of it against the engine). Ops of the ``com.microsoft``
domain are those the builder registers for graphs ORT's own optimisers fuse.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

__all__ = ["GRADIENT_OPS", "NON_DIFFERENTIABLE_INPUTS", "nodes_without_gradient"]

GRADIENT_OPS = frozenset({
    # ai.onnx, measured on the installed onnxruntime-training 1.19.2
    "Abs", "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Conv", "ConvTranspose",
    "Cos", "Div", "Dropout", "Erf", "Exp", "Expand", "Flatten", "GRU", "Gather", "GatherElements", "GatherND",
    "Gelu", "Gemm", "GlobalAveragePool", "Identity", "LSTM", "LayerNormalization", "LeakyRelu", "Log",
    "LogSoftmax", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg", "Pad", "Pow", "Reciprocal", "ReduceL2",
    "ReduceLogSumExp", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Resize", "ScatterElements", "ScatterND",
    "Sigmoid", "Sin", "Slice", "Softmax", "SoftmaxCrossEntropyLoss", "Split", "Sqrt", "Squeeze", "Sub",
    "Tanh", "Tile", "TopK", "Transpose", "Unsqueeze", "Where",
    # com.microsoft
    "BatchNormInternal", "BiasGelu", "ConcatTraining", "FastGelu", "SimplifiedLayerNormalization",
    "SoftmaxCrossEntropy", "SoftmaxCrossEntropyLossInternal", "SparseSoftmaxCrossEntropy",
})

# Inputs no gradient flows into: shapes, indices, ratios, running statistics, exponents.
# A float initializer used only at such positions is a constant, never a weight.
NON_DIFFERENTIABLE_INPUTS = {
    "BatchNormalization": {3, 4}, "Clip": {1, 2}, "ConstantOfShape": {0}, "Dropout": {1, 2},
    "Expand": {1}, "Gather": {1}, "GatherElements": {1}, "GatherND": {1}, "OneHot": {0, 1, 2},
    "Pad": {1, 2, 3}, "Pow": {1}, "Range": {0, 1, 2}, "ReduceL2": {1}, "ReduceMean": {1}, "ReduceSum": {1},
    "Reshape": {1}, "Resize": {1, 2, 3}, "Slice": {1, 2, 3, 4}, "Split": {1}, "Squeeze": {1}, "Tile": {1},
    "TopK": {1}, "Unsqueeze": {1}, "Upsample": {1},
}

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def nodes_without_gradient(model: onnx.ModelProto, trainable, target: str | None = None) -> dict[str, list[str]]:
    """``{op_type: [node names]}`` for nodes a backward pass from ``target`` to ``trainable`` must cross
    but the gradient builder cannot differentiate.

    A node needs a gradient when one of its inputs depends on a trainable weight through
    float tensors and one of its float outputs leads to ``target`` (default: the first
    graph output, where ortrain's loss attaches). Integer and boolean values (shapes,
    indices, masks) carry no gradient, so ``Shape`` or ``ArgMax`` on the way are fine.
    Values of unknown type count as float.
    """
    target = target or model.graph.output[0].name
    types = _value_types(model)
    tainted = set(trainable)
    candidates = []
    for node in model.graph.node:
        if not any(i in tainted for i in node.input if i):
            continue
        outs = [o for o in node.output if o and types.get(o, TensorProto.FLOAT) in _FLOATS]
        if outs:
            tainted.update(outs)
            candidates.append(node)
    needed = ancestors(model, target)
    missing: dict[str, list[str]] = {}
    for i, node in enumerate(candidates):
        if node.op_type not in GRADIENT_OPS and any(o in needed for o in node.output):
            missing.setdefault(node.op_type, []).append(node.name or f"{node.op_type}#{i}")
    return missing


def ancestors(model: onnx.ModelProto, target: str) -> set[str]:
    """Every value ``target`` is computed from (itself included)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    seen, stack = {target}, [target]
    while stack:
        node = producer.get(stack.pop())
        if node is None:
            continue
        for i in node.input:
            if i and i not in seen:
                seen.add(i)
                stack.append(i)
    return seen
