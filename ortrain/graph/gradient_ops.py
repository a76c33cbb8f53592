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

``InstanceNormalization``, ``GroupNormalization``, ``ReduceMax``, ``ReduceMin``, ``GlobalMaxPool`` and ``Einsum`` are not among
them, but ortrain's training graphs write them in ops that are (:mod:`ortrain.graph.norm_forms`,
:mod:`ortrain.graph.tensor_forms`), so they are trained through all the same (``FORM_OPS``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ortrain.errors import UnsupportedOpError
from ortrain.graph.passes import (
    attribute,
    elem_types,
    inferred_shapes,
    int64_constants,
    node_inputs,
    subgraph_reads,
    text_attribute,
)
from ortrain.graph.shapes import folded_value

__all__ = ["FORM_OPS", "GRADIENT_OPS", "NON_DIFFERENTIABLE_INPUTS", "gradient_reach", "may_stop_gradients",
           "nodes_without_gradient", "pad_plan", "recurrent_weights_differentiated_whole", "recurrent_forms_not_run_in_training",
           "pool_attributes", "refuse_empty_pool_windows", "refuse_recurrent_forms", "untrainable_form"]

# Ops without a gradient that every training graph holds in other ops (gradient_forms.FORMS)
FORM_OPS = frozenset({"InstanceNormalization", "GroupNormalization", "ReduceMax", "ReduceMin", "GlobalMaxPool",
                      "Einsum"})

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
    # a loss's labels and class weights (the runtime's gradients give them none)
    "SoftmaxCrossEntropyLoss": {1, 2}, "NegativeLogLikelihoodLoss": {1, 2},
    "SoftmaxCrossEntropy": {1}, "SparseSoftmaxCrossEntropy": {1, 2}, "SoftmaxCrossEntropyLossInternal": {1, 2, 3},
    "Pad": {1, 2, 3}, "Pow": {1}, "Range": {0, 1, 2}, "ReduceL2": {1}, "ReduceMean": {1}, "ReduceSum": {1},
    "RandomNormalLike": {0}, "RandomUniformLike": {0}, "EyeLike": {0},  # only the input's shape is read
    "Reshape": {1}, "Resize": {1, 2, 3}, "Slice": {1, 2, 3, 4}, "Split": {1}, "Squeeze": {1}, "Tile": {1},
    "TopK": {1}, "Unsqueeze": {1}, "Upsample": {1},
    "DequantizeLinear": {1, 2},  # a quantized weight's scale and zero point (per channel: float vectors)
}

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


# Ops whose outputs may be integers or booleans (a gradient stops there), or that hold subgraphs.
_TYPE_CHANGING = frozenset({
    "And", "ArgMax", "ArgMin", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike",
    "DynamicQuantizeLinear", "Equal", "Greater", "GreaterOrEqual", "If", "IsInf", "IsNaN", "Less", "LessOrEqual",
    "Loop", "Multinomial", "NonMaxSuppression", "NonZero", "Not", "Or", "QuantizeLinear", "Scan", "Shape", "Size",
    "TopK", "Unique", "Xor"})


def may_stop_gradients(model: onnx.ModelProto, weights) -> bool:
    """False when :func:`ancestors` answers what :func:`gradient_reach` would for ``weights``,
    without its type inference (milliseconds that a warm start would pay): the graph has no op
    that may make integers or booleans and no subgraph, and nothing computed from a weight is
    read at a position no gradient enters."""
    derived = set(weights)
    for node in model.graph.node:
        if node.op_type in _TYPE_CHANGING:
            return True
        skip = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ())
        read = [(pos, name) for pos, name in enumerate(node.input) if name in derived]
        if any(pos in skip for pos, _ in read):
            return True
        if read:
            derived.update(o for o in node.output if o)
    return False


# Random draws whose inputs take no gradient (PyTorch's bernoulli gives its probabilities none): a
# constant there is no weight. onnxruntime-training has no gradient for them at all, so a weight
# feeding one is still refused (nodes_without_gradient).
_DRAWS = frozenset({"Bernoulli", "Multinomial"})


def gradient_reach(model: onnx.ModelProto, targets=None, straight_through=(), crossed: dict | None = None) -> set[str]:
    """The values a gradient from ``targets`` (default: every graph output) flows into: backwards
    through the inputs of nodes one of whose float outputs it reaches, except at positions no
    gradient enters (``NON_DIFFERENTIABLE_INPUTS``), and into what their subgraphs read from
    outside. Integer and boolean values (shapes, a comparison's mask, an arg-max) stop it, so a
    float tensor read only through ``Equal`` is a constant, except that nodes of the op types
    ``straight_through`` names pass it to their first input (what a gradient would reach through
    ``QuantizeLinear``'s integers). Values of unknown type count as float. ``crossed`` (a dict)
    receives, for each value a gradient reaches through such a node, the index in the graph's nodes
    of the first one it crosses."""
    types = elem_types(model, lenient=True)
    reach = set(targets) if targets is not None else {o.name for o in model.graph.output}
    nodes = model.graph.node
    for i in reversed(range(len(nodes))):  # topological order, so consumers come first
        node = nodes[i]
        if node.op_type in straight_through and any(o in reach for o in node.output):
            reach.add(node.input[0])  # the value quantized; not its scale or zero point
            if crossed is not None:
                crossed[node.input[0]] = min(i, crossed.get(node.input[0], i))
            continue
        flowing = [o for o in node.output if o in reach and types.get(o, TensorProto.FLOAT) in _FLOATS]
        if node.op_type in _DRAWS or not flowing:
            continue
        skip = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ())
        into = [name for pos, name in enumerate(node.input) if name and pos not in skip]
        into += subgraph_reads(node)
        reach.update(into)
        if crossed is not None:
            first = min((crossed[o] for o in flowing if o in crossed), default=None)
            if first is not None:
                for name in into:
                    crossed[name] = min(first, crossed.get(name, first))
    return reach


def nodes_without_gradient(model: onnx.ModelProto, trainable, target: str | None = None) -> dict[str, list[str]]:
    """``{op_type: [node names]}`` for nodes a backward pass from ``target`` to ``trainable`` must cross
    but the gradient builder cannot differentiate, nor ortrain's training graphs write in ops it can
    (``FORM_OPS``).

    A node needs a gradient when one of its inputs depends on a trainable weight through
    float tensors and one of its float outputs leads to ``target`` (default: the first
    graph output, where ortrain's loss attaches). Integer and boolean values (shapes,
    indices, masks) carry no gradient, so ``Shape`` or ``ArgMax`` on the way are fine.
    Values of unknown type count as float.
    """
    target = target or model.graph.output[0].name
    candidates = nodes_reached(model, trainable)
    needed = ancestors(model, target)
    consts = int64_constants(model, also_int32=True)  # ONNX takes a slice's steps, a pad's pads... in either
    missing: dict[str, list[str]] = {}
    ranks = types = None
    for i, node in candidates:
        if not any(o in needed for o in node.output):
            continue
        known = node.op_type in GRADIENT_OPS or node.op_type in FORM_OPS
        rank = None
        if node.op_type == "Pad" and (text_attribute(node, "mode", "constant") != "constant" or
                                      len(node.input) > 3 and node.input[3]):
            # torch computes a reflect pad's amounts from constants; the axes need the rank
            for name in node.input[1::2]:
                if name and name not in consts:
                    folded = folded_value(model, name)
                    if folded is not None and np.asarray(folded).dtype.kind == "i":
                        consts[name] = np.asarray(folded, np.int64)
            if len(node.input) > 3 and node.input[3]:
                ranks = ranks if ranks is not None else _ranks(model)
                rank = ranks.get(node.input[0])
            types = types if types is not None else elem_types(model, lenient=True)
            if types.get(node.input[0]) == TensorProto.DOUBLE and text_attribute(node, "mode", "constant") != "constant":
                missing.setdefault(f"Pad in {text_attribute(node, 'mode', 'constant')!r} mode over float64 values (its training "
                                   "form, a Concat, has no float64 gradient kernel)", []).append(
                                       node.name or f"{node.op_type}#{i}")
                continue
        what = untrainable_form(node, consts, rank) if known else node.op_type
        if what:
            missing.setdefault(what, []).append(node.name or f"{node.op_type}#{i}")
    return missing


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of each value onnx's inference (:func:`~ortrain.graph.passes.inferred_shapes`) finds."""
    typed = inferred_shapes(model)
    g = (typed or model).graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in (*g.input, *g.value_info, *g.output)
            if v.type.tensor_type.HasField("shape")}


def pad_plan(node: onnx.NodeProto, value, rank: int | None = None) -> list[tuple[int, int]] | None:
    """A ``Pad``'s ``(before, after)`` amounts on each axis, where its ``pads`` (and ``axes``) are
    constants (``value(name)``: the array, or None); None where they are not, or where an ``axes``
    input leaves the rank to be known (``rank``). Negative axes count from the end."""
    pads = value(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if pads is None:
        return None
    pads = [int(v) for v in np.ravel(pads)]
    half = len(pads) // 2
    has_axes = len(node.input) > 3 and bool(node.input[3])
    axes = value(node.input[3]) if has_axes else None
    if not has_axes:
        return list(zip(pads[:half], pads[half:]))
    if axes is None or rank is None:
        return None
    plan = [(0, 0)] * rank
    for k, axis in enumerate(int(a) for a in np.ravel(axes)):
        plan[axis % rank] = (pads[k], pads[half + k])
    return plan


def untrainable_form(node: onnx.NodeProto, consts: dict, rank: int | None = None) -> str | None:
    """How ``node``, of an op the gradient builder knows, still cannot be trained through in
    onnxruntime-training 1.19.2, or None: its builder takes only ``Pad`` in mode ``constant``,
    differentiates ``ScatterElements``/``ScatterND`` as overwrites whatever their ``reduction`` (an
    add is trained as ``data + scatter(zeros)``, :mod:`ortrain.graph.tensor_forms`)
    and reads a ``MaxPool``'s column-major indices (``storage_order`` 1) as row-major,
    builds an invalid graph for ``ReduceL2`` over every axis without ``keepdims`` and for ``Pad``
    with an ``axes`` input, and its gradient kernels fail on negative ``Slice`` steps and run
    ``LSTM``/``GRU`` forward only and without ``sequence_lens``.
    Steps and axes are seen where an int64 initializer or ``Constant`` holds them.
    ``consts``: the graph's int64 constants (``passes.int64_constants``); ``rank``: the input's,
    where known (a ``Pad``'s ``axes`` need it)."""
    op = node.op_type
    if op == "Pad":
        # ortrain's training graphs write the other modes and an axes input in ops the builder takes
        # (tensor_forms._pad_as_gathers) where the amounts are constants
        mode = text_attribute(node, "mode", "constant")
        has_axes = len(node.input) > 3 and bool(node.input[3])
        if mode == "constant" and not has_axes:
            return None
        plan = pad_plan(node, lambda name: consts.get(name), rank)
        if mode not in ("constant", "reflect", "edge", "wrap"):
            return f"Pad in {mode!r} mode"
        if plan is None:
            return f"Pad in {mode!r} mode with pads computed in the graph" if not has_axes else \
                "Pad with an axes input (opset 18) computed in the graph, or over a tensor of unknown rank"
        if mode != "constant" and any(b < 0 or e < 0 for b, e in plan):
            return f"Pad in {mode!r} mode with negative pads"
    elif op == "Slice" and len(node.input) > 4 and node.input[4] in consts and (consts[node.input[4]] < 0).any():
        return "Slice with a negative step"
    elif op == "ReduceL2" and not attribute(node, "keepdims", 1) and not attribute(node, "axes", None) and \
            (len(node.input) < 2 or not node.input[1]):
        return "ReduceL2 over every axis without keepdims"
    elif op in ("ScatterElements", "ScatterND") and text_attribute(node, "reduction", "none") not in ("none", "add"):
        # the runtime's gradient is that of an overwrite (an add is written as one, tensor_forms)
        return f"{op} with reduction {text_attribute(node, 'reduction', 'none')!r}"
    elif op == "MaxPool" and attribute(node, "storage_order", 0) != 0:
        # the runtime's MaxPoolGrad reads the column-major indices as row-major (repairs.py drops
        # the attribute where the indices are not used)
        return "MaxPool with storage_order 1 and its indices used"
    elif op in ("LSTM", "GRU"):
        if op == "LSTM" and len(node.input) > 7 and node.input[7]:
            # the training kernel runs it forward right, but its gradient leaves the peepholes out
            # (2-5% off, measured against finite differences)
            return "LSTM with peepholes (input P)"
        return recurrent_form_not_run_in_training(node)
    return None


FLOAT32_MAX = float(np.finfo(np.float32).max)
# the activations an LSTM or GRU has when it names none, lower-case as the training kernels compare them
DEFAULT_RECURRENT_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}


def recurrent_form_not_run_in_training(node: onnx.NodeProto) -> str | None:
    """What ``node``, an ``LSTM`` or ``GRU``, has that onnxruntime-training 1.19.2's training kernels
    (``LSTMTraining``/``GRUTraining``, which replace every one in a training graph, frozen or not)
    refuse, or None: a direction other than forward, ``sequence_lens``, ``clip``, ``input_forget``
    and other activations."""
    op = node.op_type
    direction = text_attribute(node, "direction", "forward")
    if direction != "forward":
        return f"{op} in direction {direction!r}"
    if len(node.input) > 4 and node.input[4]:
        return f"{op} with sequence_lens"
    if attribute(node, "clip", FLOAT32_MAX) != FLOAT32_MAX:  # the kernels' own "no clip" (inf, NaN: refused)
        return f"{op} with clip"
    if op == "LSTM" and attribute(node, "input_forget", 0):
        return "LSTM with input_forget"
    names = [a.decode() if isinstance(a, bytes) else a for a in attribute(node, "activations", [])]
    if names and [n.lower() for n in names] != DEFAULT_RECURRENT_ACTIVATIONS[op]:
        return f"{op} with activations {names}"
    return None


def recurrent_forms_not_run_in_training(model: onnx.ModelProto) -> dict[str, list[str]]:
    """``{form: [node names]}`` for the ``LSTM`` and ``GRU`` nodes no training graph can hold
    (:func:`recurrent_form_not_run_in_training`), trained through or not."""
    found: dict[str, list[str]] = {}
    for i, node in enumerate(model.graph.node):
        what = recurrent_form_not_run_in_training(node) if node.op_type in ("LSTM", "GRU") else None
        if what:
            found.setdefault(what, []).append(node.name or f"{node.op_type}#{i}")
    return found


def nodes_reached(model: onnx.ModelProto, trainable) -> list[tuple[int, onnx.NodeProto]]:
    """``(position, node)`` in graph order for the nodes a gradient from ``trainable`` enters: an
    input where one flows (not ``NON_DIFFERENTIABLE_INPUTS``) depends on a trainable weight through
    float values, and the node has a float output (values of unknown type count as float). The
    position names a node without a name."""
    types = elem_types(model, lenient=True)
    tainted = set(trainable)
    found = []
    for i, node in enumerate(model.graph.node):
        skip = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, ())
        read = [name for pos, name in enumerate(node.input) if pos not in skip] + subgraph_reads(node)
        if not any(name in tainted for name in read):
            continue
        outs = [o for o in node.output if o and types.get(o, TensorProto.FLOAT) in _FLOATS]
        if outs:
            tainted.update(outs)
            found.append((i, node))
    return found


def recurrent_weights_differentiated_whole(model: onnx.ModelProto, trainable) -> set[str]:
    """The frozen weights (``W``, ``R``, ``B``) of each ``LSTM`` and ``GRU`` a gradient from
    ``trainable`` crosses. onnxruntime-training 1.19.2's ``LSTMGrad`` and ``GRUGrad`` kernels
    crash the process (a segmentation fault) when asked for some of a node's weight gradients
    and not the others, or for its input's gradient alone (a frozen layer after a trained one):
    the training graph asks for them all and leaves the frozen ones' gradients unused. A weight
    asked for is asked for of every node reading it (a frozen ``W`` two LSTMs share), so those
    nodes get all of theirs too."""
    trainable = set(trainable)
    whole: set[str] = set()
    while True:  # until no more: a weight requested for one node is requested of every node reading it
        tainted, found = trainable | whole, set()
        for node in model.graph.node:
            if not any(i in tainted for i in node_inputs(node)):
                continue
            tainted.update(o for o in node.output if o)
            if node.op_type in ("LSTM", "GRU"):
                found.update(n for n in node.input[1:4] if n and n not in trainable)
        if found <= whole:
            return whole
        whole |= found


def ancestors(model: onnx.ModelProto, target: str) -> set[str]:
    """Every value ``target`` is computed from (itself included)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    seen, stack = {target}, [target]
    while stack:
        node = producer.get(stack.pop())
        if node is None:
            continue
        for i in node_inputs(node):
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen


def refuse_recurrent_forms(model: onnx.ModelProto) -> None:
    """An ``LSTM`` or ``GRU`` that onnxruntime-training's training kernels cannot run, which replace
    every one in a training graph, frozen or not (a frozen bidirectional one failed only as the
    session opened, with the kernel's own text)."""
    found = recurrent_forms_not_run_in_training(model)
    if found:
        listing = "; ".join(f"{form} (nodes: {', '.join(nodes)})" for form, nodes in sorted(found.items()))
        raise UnsupportedOpError(
            f"onnxruntime-training 1.19.2 cannot train a model holding {listing}: its training graphs run every "
            f"LSTM and GRU with training kernels, which take only the forward direction, no sequence_lens, clip or "
            f"input_forget and the default activations, whether or not the layer is frozen. Export "
            f"the layer in that form (bidirectional=False), or compute its outputs with onnxruntime "
            f"(InferenceSession) and train the rest of the model on them; predict and evaluate run it as it is")


def refuse_empty_pool_windows(model: onnx.ModelProto) -> None:
    """A ``MaxPool`` or ``AveragePool`` with ``ceil_mode`` whose last window starts past its (padded)
    input, where its sizes are fixed: onnxruntime 1.19.2 computes that window (an output of -3.4e38, or
    an average of cells from other rows), PyTorch and current onnxruntime drop it, and the training
    graph failed in the loss ("Incompatible dimensions") without naming the pool, or trained on other
    values than predict gave. And a ``MaxPool`` with a window of padding alone, whose gradient
    onnxruntime-training writes outside its buffer (a segfault, or a corrupted heap later)."""
    from ortrain.graph.shapes import Shapes
    shapes = None
    for i, node in enumerate(model.graph.node):
        if node.op_type == "MaxPool" and text_attribute(node, "auto_pad", "NOTSET") in ("NOTSET", ""):
            shapes = shapes or Shapes(model)
            blind = window_without_input(node, shapes.shape(node.input[0]))
            if blind is not None:
                raise UnsupportedOpError(
                    f"MaxPool node {node.name or f'#{i}'!r}: a window on spatial axis {blind} holds no cell of the "
                    f"input, only padding (kernel {list(attribute(node, 'kernel_shape', []))}, dilations "
                    f"{list(attribute(node, 'dilations', []))}): onnxruntime-training's gradient of such a window "
                    "writes outside its buffer and corrupts the process's memory (PyTorch gives -inf there). "
                    "Use less padding or dilation, or freeze the weights before the pool")
        if node.op_type not in ("MaxPool", "AveragePool") or not attribute(node, "ceil_mode", 0) or \
                text_attribute(node, "auto_pad", "NOTSET") not in ("NOTSET", ""):
            continue
        shapes = shapes or Shapes(model)
        past = window_past_input(node, shapes.shape(node.input[0]))
        if past is not None:
            axis, size, reach, stride = past
            raise UnsupportedOpError(
                f"{node.op_type} node {node.name or f'#{i}'!r}: with ceil_mode its last window on spatial axis "
                f"{axis} starts past the input (size {size}, window {reach}, stride {stride}): onnxruntime "
                f"computes it ({'an output of -3.4e38' if node.op_type == 'MaxPool' else 'from cells of other rows'})"
                f" where PyTorch and the ONNX specification drop it, and training cannot take the two sizes. Give "
                f"the input a size the windows cover, ceil_mode=0, or padding")


def pool_attributes(node: onnx.NodeProto, shape):
    """(kernel, strides, dilations, pads) of a pool with explicit padding, defaults filled in, or None
    where the input's rank is not known to fit the kernel."""
    kernel = list(attribute(node, "kernel_shape", []))
    if shape is None or len(shape) != len(kernel) + 2:
        return None
    rank = len(kernel)
    return (kernel, list(attribute(node, "strides", [])) or [1] * rank,
            list(attribute(node, "dilations", [])) or [1] * rank, list(attribute(node, "pads", [])) or [0] * (2 * rank))


def window_without_input(node: onnx.NodeProto, shape) -> int | None:
    """The first spatial axis on which a window of the pool (as onnxruntime 1.19.2 counts them, a
    ``ceil_mode`` window past the input included) takes no cell of the input, only padding, where the
    sizes are known; else None."""
    attributes = pool_attributes(node, shape)
    if attributes is None:
        return None
    kernel, strides, dilations, pads = attributes
    rank = len(kernel)
    ceil = attribute(node, "ceil_mode", 0)
    for axis, size in enumerate(shape[2:]):
        if type(size) is not int:
            continue
        k, s, d, b = kernel[axis], strides[axis], dilations[axis], pads[axis]
        span = size + b + pads[axis + rank] - ((k - 1) * d + 1)
        out = (-(-span // s) if ceil else span // s) + 1
        for o in range(max(out, 0)):
            if not any(0 <= o * s - b + j * d < size for j in range(k)):
                return axis
    return None


def window_past_input(node: onnx.NodeProto, shape) -> tuple[int, int, int, int] | None:
    """For a pool with ``ceil_mode`` and explicit ``pads``: (spatial axis, its size, the window's reach,
    the stride) of the first axis whose last window starts past the input and its leading padding,
    where the sizes are known; else None."""
    attributes = pool_attributes(node, shape)
    if attributes is None:
        return None
    kernel, strides, dilations, pads = attributes
    rank = len(kernel)
    for axis, size in enumerate(shape[2:]):
        if type(size) is not int:
            continue
        reach = (kernel[axis] - 1) * dilations[axis] + 1
        if ceil_last_start(size, reach, strides[axis], pads[axis], pads[axis + rank]) >= size + pads[axis]:
            return axis, size, reach, strides[axis]
    return None


def ceil_last_start(size: int, reach: int, stride: int, begin: int, end: int) -> int:
    """Where a ``ceil_mode`` pool's last window starts, counted from the start of the padding
    before the input: past ``size + begin`` the specification and PyTorch drop it, and past
    ``size + end`` padded cells it overhangs the padded input (onnxruntime 1.19.2 computes both)."""
    return -(-(size + begin + end - reach) // stride) * stride
