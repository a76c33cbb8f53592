"""Rewrites that make an ONNX graph from elsewhere acceptable to onnxruntime-training.

Each pass takes a model and returns a new one with the same forward results;
``repair`` runs them all and reports what it changed. They exist because the
gradient builder or the eval graph it derives cannot take some valid ONNX:

* ``Sum`` has no gradient builder: it becomes a chain of ``Add`` (same broadcasting).
* single-output ``LayerNormalization`` (opset 17 exports) has no gradient: it gets
  the mean and inverse-std outputs the builder needs; a ``SoftmaxCrossEntropyLoss`` (a loss
  exported with the model) gets its ``log_prob`` output likewise.
* ``BatchNormalization`` exported in training mode (three outputs) makes the eval
  graph invalid: it is written in inference form, running statistics as inputs.
  ortrain's training graph turns every batch norm into batch statistics anyway.
* ``Dropout`` without a ``training_mode`` input never drops: it gets one, so it is
  active in training steps and a no-op in evaluation, prediction and export.
* ``Gelu(approximate="tanh")`` (opset 20, torch's default export of ``nn.GELU("tanh")``)
  gets the exact GELU's gradient from the runtime: it is written out as the tanh formula
  in plain arithmetic, whose gradient the builder derives correctly.
* ``PRelu``, ``Elu``, ``Selu``, ``Celu``, ``Softsign``, ``ThresholdedRelu``, ``Softplus``, ``HardSigmoid``
  and ``HardSwish`` have no gradient builder,
  and neither has ``CastLike`` (the dynamo exporter's): they are written in ops that have one.
* ``SplitToSequence`` read only by ``SequenceAt`` at constant indices (the dynamo exporter's
  ``split`` and ``unbind``) has no gradient: it becomes a ``Split``
  (:mod:`ortrain.graph.sequences`).
* ``Conv`` with ``auto_pad`` SAME and dilations, and ``Split`` with an unnamed output, which
  onnxruntime cannot run (the first is refused, the second kills the process): explicit ``pads``,
  and a name for the output.
* ``MaxPool`` with ``storage_order`` 1 whose indices nothing reads, whose gradient the runtime
  puts on the wrong cells: the attribute goes (it only sets how the indices count).
* ``MaxPool`` and ``AveragePool`` with ``ceil_mode``, whose last window onnxruntime 1.19.2 computes
  where the specification drops it, or divides otherwise than the specification and current
  onnxruntime: the padding the windows reach and a ``Mul`` that rescales, or trimmed end padding
  (:func:`ceil_pools_in_spec_form`).
* A reduction with ``noop_with_empty_axes`` and no axes, which onnxruntime 1.19.2 reduces over every
  axis (and fails): its elementwise part (an ``Identity``, or a ``Mul`` for ``ReduceSumSquare``), as
  the specification says.
* ``Split`` by ``num_outputs`` (opset 18) whose last part is empty (6 into 4 parts: 2, 2, 2, 0), which
  onnxruntime 1.19.2 refuses at run time: the sizes, given as an input (:func:`split_sizes_given`).
* A comparison of 8- or 16-bit integers, ``uint32`` or ``bfloat16``, which onnxruntime 1.19.2 has
  no kernel for (the dynamo exporter's ``torch.eye``): its inputs cast to a wider type
  (:func:`comparisons_widened`).
* ``LSTM`` and ``GRU`` naming their default activations as the spec spells them (``"Sigmoid"``),
  which onnxruntime-training's kernels refuse (they compare lower-case names): the attribute goes.

Before these passes :mod:`ortrain.graph.opsets` brings the opset into the range onnxruntime
reads; after them :mod:`ortrain.graph.batch_dimension` frees a fixed batch dimension.
``read_as_scalars`` (a scalar weight read through a ``Reshape``) is here as well.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import OrtrainError, UnsupportedOpError
from ortrain.graph.builder import FreshNames
from ortrain.graph.gradient_ops import (
    DEFAULT_RECURRENT_ACTIVATIONS,
    ceil_last_start,
    pad_plan,
    pool_attributes,
)
from ortrain.graph.layer_forms import conv_with_explicit_pads
from ortrain.graph.opsets import default_opset
from ortrain.graph.passes import (
    SAME,
    attribute,
    elem_types,
    inferred_shapes,
    int64_constants,
    node_inputs,
    replace_nodes,
    subgraphs,
    text_attribute,
)
from ortrain.graph.sequences import split_to_sequence_as_split
from ortrain.graph.shapes import Shapes, folded_value

__all__ = ["repair", "sum_to_add", "layernorm_with_statistics", "batchnorm_inference_form",
           "dropout_with_training_input", "gelu_tanh_as_arithmetic", "activations_as_arithmetic",
           "dilated_same_conv_with_pads", "split_outputs_named", "comparisons_widened", "refuse_pads_past_their_rows", "split_sizes_given", "read_as_scalars"]


def read_as_scalars(model: onnx.ModelProto, names: list[str]) -> None:
    """Nodes read each one-element weight in ``names`` through ``Reshape(name, [])`` (in place).

    ortrain's weight tables and onnxruntime-training's checkpoints hold arrays of rank >= 1, so
    a scalar weight is stored with shape (1,); the reshape keeps the graph's arithmetic (output
    ranks included) that of the original scalar.
    """
    if not names:
        return
    g = model.graph
    fresh = FreshNames(model).fresh
    empty = fresh("scalar_shape")
    g.initializer.append(numpy_helper.from_array(np.zeros(0, np.int64), empty))
    renamed = {n: fresh(f"{n}/scalar") for n in names}
    for node in g.node:
        for i, x in enumerate(node.input):
            if x in renamed:
                node.input[i] = renamed[x]
    reshapes = [onnx.helper.make_node("Reshape", [n, empty], [r], name=r) for n, r in renamed.items()]
    nodes = reshapes + list(g.node)
    del g.node[:]
    g.node.extend(nodes)


def sum_to_add(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Sum(a, b, c)`` -> ``Add(Add(a, b), c)``; returns the model and the number of nodes rewritten."""
    if not any(n.op_type == "Sum" for n in model.graph.node):
        return model, 0
    out = copy.deepcopy(model)
    names = FreshNames(out)
    nodes, count = [], 0
    for node in out.graph.node:
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        count += 1
        base = node.name or names.fresh("Sum")
        ins = list(node.input)
        if len(ins) == 1:
            nodes.append(helper.make_node("Identity", ins, [node.output[0]], name=f"{base}/Identity"))
            continue
        acc = ins[0]
        for k, nxt in enumerate(ins[1:], start=1):
            last = k == len(ins) - 1
            result = node.output[0] if last else names.fresh(f"{base}/partial_{k}")
            nodes.append(helper.make_node("Add", [acc, nxt], [result], name=names.fresh(f"{base}/Add_{k}")))
            acc = result
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, count


def layernorm_with_statistics(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Give single-output ``LayerNormalization`` nodes their ``Mean`` and ``InvStdDev`` outputs,
    and ``SoftmaxCrossEntropyLoss`` nodes (a loss exported inside the model) their ``log_prob``
    (left out at the end, or named ""):
    the gradient builder reads these optional outputs, and asserted on a node without them
    ("GradientBuilderBase::O ... i < node_->OutputDefs().size() was false")."""
    def missing(n) -> list[tuple[int, str]]:
        """(position, name suffix) of each optional output left out: past the end, or named ""."""
        wanted = _OUTPUTS_THE_GRADIENT_READS.get(n.op_type, ()) if n.domain in ("", "ai.onnx") else ()
        return [(k, suffix) for k, suffix in enumerate(wanted, start=1)
                if n.output and (k >= len(n.output) or not n.output[k])]

    targets = [i for i, n in enumerate(model.graph.node) if missing(n)]
    if not targets:
        return model, 0
    out = copy.deepcopy(model)
    names = FreshNames(out)
    for i in targets:
        node = out.graph.node[i]
        base = node.name or f"{node.op_type}_{i}"
        for k, suffix in missing(node):
            if k < len(node.output):
                node.output[k] = names.fresh(f"{base}/{suffix}")
            else:
                node.output.append(names.fresh(f"{base}/{suffix}"))
    return out, len(targets)


# the optional outputs (after the first) of nodes whose gradient reads them
_OUTPUTS_THE_GRADIENT_READS = {"LayerNormalization": ("mean", "inv_std_dev"), "SoftmaxCrossEntropyLoss": ("log_prob",)}


def batchnorm_inference_form(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Training-mode ``BatchNormalization`` (running-statistics outputs) -> inference form."""
    targets = [i for i, n in enumerate(model.graph.node) if n.op_type == "BatchNormalization"
               and (len(n.output) > 1 or any(a.name == "training_mode" and a.i for a in n.attribute))]
    if not targets:
        return model, 0
    out = copy.deepcopy(model)
    dropped = set()
    for i in targets:
        node = out.graph.node[i]
        dropped.update(o for o in node.output[1:] if o)
        del node.output[1:]
        for attr in [a for a in node.attribute if a.name == "training_mode"]:
            node.attribute.remove(attr)
    users = sorted({n.name or n.op_type for n in out.graph.node if any(i in dropped for i in n.input)})
    if users:
        raise OrtrainError(f"from_onnx: nodes {users} read the updated running statistics of a training-mode "
                           "BatchNormalization; ortrain cannot rewrite that graph. Export the model in eval mode")
    keep = [o for o in out.graph.output if o.name not in dropped]
    del out.graph.output[:]
    out.graph.output.extend(keep)
    return out, len(targets)


def dropout_with_training_input(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Dropout`` gets a constant ``True`` training input (its ratio made explicit) and the mask
    output the gradient builder reads."""
    targets = [i for i, n in enumerate(model.graph.node)
               if n.op_type == "Dropout" and (len(n.input) < 3 or not n.input[2] or len(n.output) < 2)]
    if not targets or default_opset(model) < 12:
        return model, 0
    out = copy.deepcopy(model)
    names = FreshNames(out)
    for i in targets:
        node = out.graph.node[i]
        base = node.name or f"Dropout_{i}"
        if len(node.input) < 3 or not node.input[2]:
            if len(node.input) < 2 or not node.input[1]:
                ratio = names.fresh(f"{base}/ratio")
                out.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), ratio))
                del node.input[1:]
                node.input.append(ratio)
            flag = names.fresh(f"{base}/training_mode")
            out.graph.initializer.append(numpy_helper.from_array(np.array(True), flag))
            del node.input[2:]
            node.input.append(flag)
        if len(node.output) < 2:
            node.output.append(names.fresh(f"{base}/mask"))
    return out, len(targets)


class _Expansion:
    """Writes the nodes that replace one node: constants in the element type of its input, fresh
    names under the node's own."""

    def __init__(self, graph, names: FreshNames, base: str, dtype):
        self.graph, self.names, self.base, self.dtype, self.nodes = graph, names, base, dtype, []

    def const(self, hint: str, value: float) -> str:
        name = self.names.fresh(f"{self.base}/{hint}")
        self.graph.initializer.append(numpy_helper.from_array(np.array(value, self.dtype), name))
        return name

    def op(self, kind: str, *args: str, result: str | None = None, **attrs) -> str:
        result = result or self.names.fresh(f"{self.base}/{kind.lower()}")
        self.nodes.append(helper.make_node(kind, list(args), [result], name=self.names.fresh(f"{self.base}/{kind}"),
                                           **attrs))
        return result


def _expand(model: onnx.ModelProto, ops: set[str], rewrite) -> tuple[onnx.ModelProto, int]:
    """Replace every node of a type in ``ops`` for which ``rewrite(expansion, node, elem_types)``
    writes nodes (it returns False to keep a node as it is); returns the new model and the count
    replaced."""
    def candidate(node) -> bool:
        return node.op_type in ops and node.domain in ("", "ai.onnx") and len(node.input) > 0
    if not any(candidate(n) for n in model.graph.node):
        return model, 0
    out = copy.deepcopy(model)
    names = FreshNames(out)
    dtypes = elem_types(out, lenient=True)  # untyped values count as float32
    nodes, count = [], 0
    for node in out.graph.node:
        if not candidate(node):
            nodes.append(node)
            continue
        dtype = helper.tensor_dtype_to_np_dtype(dtypes.get(node.input[0], onnx.TensorProto.FLOAT))
        e = _Expansion(out.graph, names, node.name or names.fresh(node.op_type), dtype)
        if rewrite(e, node, dtypes):
            count += 1
            nodes.extend(e.nodes)
        else:
            nodes.append(node)
    if not count:
        return model, 0
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, count


def gelu_tanh_as_arithmetic(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Gelu(x, approximate="tanh")`` -> ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``.

    onnxruntime-training 1.19.2 differentiates every ``Gelu`` as the exact (erf) one, so the
    tanh form would train with a wrong gradient (off by up to 5e-4 relative); the same formula
    in ``Mul``/``Add``/``Tanh`` (what torch exports below opset 20) has the right one.
    """
    def rewrite(e: _Expansion, node, _types) -> bool:
        if attribute(node, "approximate", b"none") != b"tanh":
            return False
        x = node.input[0]
        k, c, one, half = e.const("k", np.sqrt(2.0 / np.pi)), e.const("c", 0.044715), e.const("one", 1.0), \
            e.const("half", 0.5)
        cube = e.op("Mul", e.op("Mul", x, x), x)
        inner = e.op("Mul", e.op("Add", x, e.op("Mul", cube, c)), k)
        e.op("Mul", e.op("Mul", x, e.op("Add", e.op("Tanh", inner), one)), half, result=node.output[0])
        return True
    return _expand(model, {"Gelu"}, rewrite)


def activations_as_arithmetic(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Activations the runtime cannot differentiate, written in ops it can, with PyTorch's
    derivative at every point (the kinks included):

    * ``PRelu(x, slope)`` -> ``Where(x > 0, x, slope * x)``;
    * ``Elu(x)`` -> ``Where(x > 0, x, alpha * (exp(u) - 1))`` with ``u = Where(x > 0, 0, x)``, so
      the unused branch never overflows;
    * ``Softplus(x)`` -> ``max(x, 0) + log(1 + exp(-|x|))``, both written with ``Where`` on one
      ``x >= 0`` test (the runtime's ``Relu`` and ``Abs`` have derivative 0 at 0);
    * ``HardSigmoid(x)`` -> ``z = alpha * x + beta`` clamped to [0, 1] by ``Where`` on ``x``
      (derivative ``alpha`` strictly inside, 0 on the edges, ``x = -beta / alpha`` and
      ``(1 - beta) / alpha``);
    * ``HardSwish(x)`` -> ``0`` up to -3, ``x * (x + 3) / 6`` between, ``x`` from 3 (derivative
      ``x / 3 + 1 / 2`` strictly inside, 0 at -3, 1 at 3);
    * ``Selu(x)`` -> ``Where(x > 0, gamma * x, alpha * gamma * (exp(u) - 1))`` and ``Celu(x)`` ->
      ``Where(x > 0, x, alpha * (exp(u / alpha) - 1))`` (``u`` as for ``Elu``; the derivative at 0
      is the left one, ``alpha * gamma`` and 1, as PyTorch's);
    * ``Softsign(x)`` -> ``x / (1 + |x|)``;
    * ``Mish(x)`` -> ``x * tanh(softplus(x))``, the softplus as above;
    * ``ThresholdedRelu(x)`` -> ``Where(x > alpha, x, 0)`` (derivative 0 at ``alpha``);
    * ``CastLike(x, like)`` -> ``Cast(x, to=<like's element type>)`` where that type is known.

    The constants are rounded as PyTorch's kernels round them: ``alpha * gamma`` and ``1 / alpha``
    are computed in float32 once, not per element.
    """
    def rewrite(e: _Expansion, node, types) -> bool:
        kind, x, y = node.op_type, node.input[0], node.output[0]
        if kind == "CastLike":
            to = types.get(node.input[1]) if len(node.input) > 1 else None
            if not to:
                return False
            e.op("Cast", x, result=y, to=to)
            return True
        zero = e.const("zero", 0.0)
        if kind == "PRelu":
            e.op("Where", e.op("Greater", x, zero), x, e.op("Mul", node.input[1], x), result=y)
        elif kind == "Elu":
            positive = e.op("Greater", x, zero)
            u = e.op("Where", positive, zero, x)
            tail = e.op("Mul", e.const("alpha", attribute(node, "alpha", 1.0)), e.op("Sub", e.op("Exp", u),
                                                                                 e.const("one", 1.0)))
            e.op("Where", positive, x, tail, result=y)
        elif kind in ("Selu", "Celu"):
            positive = e.op("Greater", x, zero)
            u = e.op("Where", positive, zero, x)
            alpha = np.float32(attribute(node, "alpha", 1.67326319217681884765625 if kind == "Selu" else 1.0))
            if kind == "Selu":
                gamma = np.float32(attribute(node, "gamma", 1.05070102214813232421875))
                e.op("Where", positive, e.op("Mul", x, e.const("gamma", gamma)),
                     e.op("Mul", e.op("Sub", e.op("Exp", u), e.const("one", 1.0)), e.const("alpha_gamma", alpha * gamma)),
                     result=y)
            else:
                inner = e.op("Mul", u, e.const("inverse_alpha", np.float32(1.0 / float(alpha))))
                e.op("Where", positive, x, e.op("Mul", e.op("Sub", e.op("Exp", inner), e.const("one", 1.0)),
                                                e.const("alpha", alpha)), result=y)
        elif kind == "Softsign":
            e.op("Div", x, e.op("Add", e.op("Abs", x), e.const("one", 1.0)), result=y)
        elif kind == "ThresholdedRelu":
            e.op("Where", e.op("Greater", x, e.const("alpha", attribute(node, "alpha", 1.0))), x, zero, result=y)
        elif kind in ("Softplus", "Mish"):
            nonneg = e.op("GreaterOrEqual", x, zero)
            relu = e.op("Where", nonneg, x, zero)
            exp = e.op("Exp", e.op("Where", nonneg, e.op("Neg", x), x))
            if kind == "Softplus":
                e.op("Add", relu, e.op("Log", e.op("Add", exp, e.const("one", 1.0))), result=y)
            else:  # x * tanh(softplus(x))
                softplus = e.op("Add", relu, e.op("Log", e.op("Add", exp, e.const("one", 1.0))))
                e.op("Mul", x, e.op("Tanh", softplus), result=y)
        elif kind == "HardSigmoid":
            alpha, beta = float(attribute(node, "alpha", 0.2)), float(attribute(node, "beta", 0.5))
            z = e.op("Add", e.op("Mul", x, e.const("alpha", alpha)), e.const("beta", beta))
            if alpha == 0.0:
                e.op("Clip", z, zero, e.const("one", 1.0), result=y)  # a constant: no derivative to match
                return True
            # The edges are tested on x (where z is exactly 0 and 1), not on the rounded z.
            at_zero, at_one = e.const("x_at_0", -beta / alpha), e.const("x_at_1", (1.0 - beta) / alpha)
            low, high = ("LessOrEqual", "GreaterOrEqual") if alpha > 0 else ("GreaterOrEqual", "LessOrEqual")
            e.op("Where", e.op(low, x, at_zero), zero,
                 e.op("Where", e.op(high, x, at_one), e.const("one", 1.0), z), result=y)
        else:  # HardSwish: x * max(0, min(1, x / 6 + 1 / 2))
            three = e.const("three", 3.0)
            middle = e.op("Div", e.op("Mul", x, e.op("Add", x, three)), e.const("six", 6.0))
            e.op("Where", e.op("LessOrEqual", x, e.op("Neg", three)), zero,
                 e.op("Where", e.op("Less", x, three), middle, x), result=y)
        return True
    return _expand(model, {"CastLike", "PRelu", "Elu", "Selu", "Celu", "Softsign", "ThresholdedRelu", "Softplus",
                           "Mish", "HardSigmoid", "HardSwish"}, rewrite)


def dilated_same_conv_with_pads(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Conv`` with ``auto_pad`` SAME and dilations -> the same padding as ``pads``: onnxruntime runs
    no dilated SAME convolution ("Dilation not supported for AutoPadType::SAME_UPPER"), so neither
    predictions nor the exported model would run (``Conv(padding='same', dilation=2)`` in PyTorch)."""
    def dilated_same(n) -> bool:
        return n.op_type == "Conv" and text_attribute(n, "auto_pad", "NOTSET") in SAME and \
            any(d != 1 for d in attribute(n, "dilations", []))

    targets = [i for i, n in enumerate(model.graph.node) if dilated_same(n)]
    if not targets:
        return model, 0
    shapes, out, count = Shapes(model), copy.deepcopy(model), 0
    for i in targets:
        explicit = conv_with_explicit_pads(model.graph.node[i], shapes)
        if explicit is not None:  # sizes unknown: left, and onnxruntime says why when it runs
            out.graph.node[i].CopyFrom(explicit)
            count += 1
    return (out, count) if count else (model, 0)


def split_outputs_named(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``Split`` outputs left without a name (``["a", ""]``: the checker takes it) get one:
    onnxruntime 1.19's ``Split`` kernel writes to the unnamed output and the process dies
    (SIGSEGV), in plain onnxruntime as in ortrain, in ``If``/``Loop``/``Scan`` bodies as well.
    Named, they are unread outputs."""
    if not any(_unnamed_split_outputs(model.graph)):
        return model, 0
    out = copy.deepcopy(model)
    taken = {name for g in _graphs(out.graph) for name in _names_in(g)}
    targets = list(_unnamed_split_outputs(out.graph))
    for node in targets:
        for k, name in enumerate(node.output):
            if not name:
                name = f"{node.name or 'Split'}/unread_{k}"
                while name in taken:
                    name += "_"
                taken.add(name)
                node.output[k] = name
    return out, len(targets)


def split_sizes_given(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A ``Split`` into ``num_outputs`` equal parts (opset 18) of an axis of known length, whose last
    part is empty under the specification's rule (parts of ``ceil(length / num_outputs)``, the last
    ones smaller: 6 into 4 gives 2, 2, 2, 0), gets those sizes as an input: onnxruntime 1.19.2 refuses
    an empty part ("Sum of sizes in 'split' ... was 8"), in prediction and export checks alike."""
    def equal_parts(n) -> bool:
        return n.op_type == "Split" and attribute(n, "num_outputs", None) is not None and \
            (len(n.input) < 2 or not n.input[1])

    if not any(equal_parts(n) for n in model.graph.node):
        return model, 0
    shapes, fresh, plans = Shapes(model), FreshNames(model).fresh, {}
    for node in model.graph.node:
        shape = shapes.shape(node.input[0]) if equal_parts(node) else None
        if shape is None:
            continue
        length = shape[attribute(node, "axis", 0) % len(shape)]
        if type(length) is int:
            n = len(node.output)
            part = -(-length // n)
            sizes = [min(part, max(length - k * part, 0)) for k in range(n)]
            if 0 in sizes:
                plans[node.output[0]] = sizes

    def rewrite(i, node):
        sizes = fresh(f"{node.name or 'Split'}/sizes")
        split = helper.make_node("Split", [node.input[0], sizes], list(node.output), name=node.name,
                                 axis=attribute(node, "axis", 0))
        return [helper.make_node("Constant", [], [sizes], name=fresh(f"{node.name or 'Split'}/Constant"),
                                 value=numpy_helper.from_array(np.array(plans[node.output[0]], np.int64), sizes)),
                split], []

    if not plans:
        return model, 0
    return replace_nodes(model, lambda n: equal_parts(n) and n.output[0] in plans, rewrite), len(plans)


def default_recurrent_activations_dropped(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """An ``LSTM`` or ``GRU`` that names its default activations (``["Sigmoid", "Tanh", "Tanh"]``, as
    the ONNX spec spells them) loses the attribute (and any ``activation_alpha``/``beta``, which
    sigmoid and tanh do not read): onnxruntime-training's kernels compare the names with their own
    lower-case ones and refuse the spec's spelling."""
    def named_defaults(n):
        names = [s.decode().lower() for a in n.attribute if a.name == "activations" for s in a.strings]
        return n.op_type in DEFAULT_RECURRENT_ACTIVATIONS and names == DEFAULT_RECURRENT_ACTIVATIONS[n.op_type]
    # alpha and beta too: sigmoid and tanh take none, and the kernels read them with the names
    return _attributes_dropped(model, named_defaults, ("activations", "activation_alpha", "activation_beta"))


def row_major_max_pools(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A ``MaxPool`` of ``storage_order`` 1 whose indices nothing reads loses the attribute, which
    sets only how the indices count: onnxruntime-training's gradient reads them as row-major, so
    such a pool trained with its gradient on the wrong cells."""
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    return _attributes_dropped(model, lambda n: n.op_type == "MaxPool" and attribute(n, "storage_order", 0) != 0
                               and (len(n.output) < 2 or n.output[1] not in read), ("storage_order",))


def ceil_pools_in_spec_form(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``MaxPool`` and ``AveragePool`` with ``ceil_mode``, explicit ``pads`` and known spatial sizes, in
    a form onnxruntime 1.19.2 reads as the ONNX specification, PyTorch and current onnxruntime do
    (:func:`_spec_pool_plan`). onnxruntime 1.19.2 differs from them in two places:

    * a last window that starts past the input and its leading padding is dropped by them, and
      computed by onnxruntime 1.19.2 (-3.4e38, or an average of cells of other rows);
    * an ``AveragePool`` counting its padding divides a last window that runs past the padding by the
      cells inside the padded input, where onnxruntime 1.19.2 divides by the whole kernel: the pool
      divides every window by the whole kernel, and a ``Mul`` by a constant (a ``Constant`` node, no
      weight) rescales those windows. (A ``Pad`` before a pool that counts no padding is no such form:
      onnxruntime 1.19.2's optimizer folds the ``Pad`` into the pool's padding, uncounted.)

    A model trained here then computes the same once served by current onnxruntime. Pools whose
    spatial sizes are free are left (training refuses their ``ceil_mode`` windows anyway)."""
    def candidate(n) -> bool:
        return n.op_type in ("MaxPool", "AveragePool") and bool(attribute(n, "ceil_mode", 0)) and \
            text_attribute(n, "auto_pad", "NOTSET") in ("NOTSET", "")

    if not any(candidate(n) for n in model.graph.node):
        return model, 0
    fresh = FreshNames(model).fresh

    def rewrite(i, node, plan):
        pads, ceil, scale = plan
        pool = copy.deepcopy(node)
        for attr in [a for a in pool.attribute if a.name in ("pads", "ceil_mode")]:
            pool.attribute.remove(attr)
        pool.attribute.extend([helper.make_attribute("ceil_mode", int(ceil)), helper.make_attribute("pads", pads)])
        if scale is None:
            return [pool], []
        prefix = f"{node.name or node.op_type}/spec_form_{i}/"
        whole, factor = fresh(prefix + "whole_kernel"), fresh(prefix + "rescale")
        pool.output[0] = whole
        return [pool,
                helper.make_node("Constant", [], [factor], name=fresh(prefix + "Constant"),
                                 value=numpy_helper.from_array(scale, factor)),
                helper.make_node("Mul", [whole, factor], [node.output[0]], name=fresh(prefix + "Mul"))], []

    # One pool at a time, in the graph's order, each planned on the sizes the pools before it give in
    # their new form: onnx's shape inference (and the value_info exporters wrote from it) keeps a
    # dropped window, so a second pool planned on it would be planned for a longer input.
    done, count = set(), 0
    while True:
        planning = copy.deepcopy(model)
        _sizes_after_pools_dropped(planning)
        shapes, target = Shapes(planning), None
        for node in planning.graph.node:
            if candidate(node) and node.output[0] not in done:
                done.add(node.output[0])
                plan = _spec_pool_plan(node, shapes.shape(node.input[0]))
                if plan is not None:
                    target = (node.output[0], plan)
                    break
        if target is None:
            break
        name, plan = target
        model = replace_nodes(model, lambda n, name=name: candidate(n) and n.output[0] == name,
                              lambda i, n, plan=plan: rewrite(i, n, plan))
        _sizes_after_pools_dropped(model)  # sizes inferred with the window kept, after it
        count += 1
    return (_output_sizes_after_pools(model) if count else model), count


def _sizes_after_pools_dropped(model: onnx.ModelProto) -> None:
    """Drop the sizes ``model`` declares (its value_info) for values computed from the output of a
    pool, which an exporter (or onnx's inference, saved with the file) may have inferred with a
    window the specification drops, also after a pool already rewritten; those before every pool
    stay (a dynamo export's ``view(x.size(0), 2, 5, 5)``, whose sizes onnx's own inference cannot
    follow through the computed shape)."""
    after = set()
    for node in model.graph.node:  # topological order
        if node.op_type in ("MaxPool", "AveragePool") or any(i in after for i in node_inputs(node)):
            after.update(o for o in node.output if o)
    kept = [v for v in model.graph.value_info if v.name not in after]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def _output_sizes_after_pools(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the sizes its outputs declare brought to those of its pools' new forms: an
    exporter's (and onnx's) inference keeps a window the specification drops, so a declared output
    after such a pool was a row or column too long (fit refused targets of the right shape)."""
    bare = copy.deepcopy(model)
    for o in bare.graph.output:
        o.type.tensor_type.ClearField("shape")
    inferred = {o.name: o for o in (inferred_shapes(bare) or bare).graph.output}
    out = None
    for k, o in enumerate(model.graph.output):
        found = inferred.get(o.name)
        if found is None or not found.type.tensor_type.HasField("shape") or \
                len(found.type.tensor_type.shape.dim) != len(o.type.tensor_type.shape.dim):
            continue
        for j, (d, f) in enumerate(zip(o.type.tensor_type.shape.dim, found.type.tensor_type.shape.dim)):
            if d.HasField("dim_value") and f.HasField("dim_value") and d.dim_value != f.dim_value:
                out = out or copy.deepcopy(model)
                out.graph.output[k].type.tensor_type.shape.dim[j].dim_value = f.dim_value
    return out or model


def _spec_pool_plan(node, shape):
    """(the pool's pads, its ``ceil_mode``, the factor of each window or None) of the form
    :func:`ceil_pools_in_spec_form` gives ``node``: the padding the windows reach with ``ceil_mode=0``
    and a rescale where overhanging windows count padding; else, where a window is dropped, the end
    padding trimmed on those axes. None where it needs neither, onnxruntime would refuse the padding
    (as large as the kernel), or the spatial sizes are not known."""
    if shape is None:  # nothing known of the input: every size is as good as free
        shape = [None] * (2 + len(attribute(node, "kernel_shape", [])))
    attributes = pool_attributes(node, shape)
    if attributes is None:
        return None
    if any(type(d) is not int for d in shape[2:]):
        _refuse_free_sizes_that_differ(node, shape, attributes)
        return None
    kernel, strides, dilations, pads = attributes
    rank = len(kernel)
    begin, end = pads[:rank], pads[rank:]
    reaches, counts, outs, dropped = [], [], [], []  # per axis
    for axis, size in enumerate(shape[2:]):
        k, d, stride, b, e = kernel[axis], dilations[axis], strides[axis], begin[axis], end[axis]
        reach = (k - 1) * d + 1
        last = ceil_last_start(size, reach, stride, b, e)
        out = last // stride + 1
        dropped.append(last >= size + b)  # the specification drops such a last window
        out -= dropped[-1]
        outs.append(out)
        reaches.append(max(0, (out - 1) * stride + reach - size - b))  # the end padding the windows reach
        counts.append(np.array([sum(o * stride - b + j * d < size + e for j in range(k)) for o in range(out)],
                               np.float32))  # the taps of each window inside the padded input
    rescaled = node.op_type == "AveragePool" and attribute(node, "count_include_pad", 0) and \
        any(r > e for r, e in zip(reaches, end))

    def fits(pads, ceil) -> bool:
        """Whether onnxruntime takes these pads (each below the kernel) and gives the windows kept."""
        if any(p >= k for p, k in zip(pads, kernel + kernel)):
            return False
        for axis, size in enumerate(shape[2:]):
            span = size + pads[axis] + pads[axis + rank] - ((kernel[axis] - 1) * dilations[axis] + 1)
            if (-(-span // strides[axis]) if ceil else span // strides[axis]) + 1 != outs[axis]:
                return False
        return True

    reaching = [*begin, *reaches]
    if rescaled and fits(reaching, False):  # every window inside the padding, then rescaled
        inside = counts[0]
        for c in counts[1:]:
            inside = np.multiply.outer(inside, c)
        return reaching, False, (np.prod(kernel) / inside).astype(np.float32).reshape(1, 1, *inside.shape)
    if any(dropped):  # (an overhanging window's divisor left as onnxruntime 1.19.2 has it, where rescaled)
        trimmed = [*begin, *(r if drop else e for r, e, drop in zip(reaches, end, dropped))]
        for pads, ceil in ((trimmed, True), (reaching, False)):
            if fits(pads, ceil):
                return pads, ceil, None
        axis = dropped.index(True)
        raise UnsupportedOpError(
            f"{node.op_type} node {node.name or node.output[0]!r}: with ceil_mode its last window on spatial axis "
            f"{axis} starts past the input (size {shape[2 + axis]}, kernel {kernel}, strides {strides}, dilations "
            f"{dilations}): PyTorch and the ONNX specification drop that window, onnxruntime 1.19.2 computes it, and "
            "no padding onnxruntime takes (below the kernel) makes the two agree. Export the pool without ceil_mode "
            "(pad its input to the size the windows cover), or give the input a size the windows cover")
    return None


def _free_size(size) -> str:
    """How a pool input's unknown size is said: a name the file gives it, or none (onnx's inference
    names the sizes it cannot follow through a computation ``unk__N``)."""
    if isinstance(size, str) and not size.startswith("unk__"):
        return f"a size the file leaves free ({size!r})"
    return ("a size not known before run time (one the file leaves free, or one computed where onnx's shape "
            "inference cannot follow)")


def _refuse_free_sizes_that_differ(node, shape, attributes) -> None:
    """A ``ceil_mode`` pool with a spatial size the file leaves free, on an axis where for some sizes
    onnxruntime 1.19.2 computes otherwise than the specification and PyTorch: a last window that
    starts in the end padding (possible where stride + end padding exceeds the window), which they
    drop; or, counting padding in an average, a last window overhanging the padded input (possible
    with a stride above 1), which they divide by the cells inside. The form that agrees depends on
    the size, and training through a dropped window of padding alone corrupts memory: refused."""
    kernel, strides, dilations, pads = attributes
    rank = len(kernel)
    counted = node.op_type == "AveragePool" and attribute(node, "count_include_pad", 0)
    for axis, size in enumerate(shape[2:]):
        reach, stride, begin, end = (kernel[axis] - 1) * dilations[axis] + 1, strides[axis], pads[axis], pads[rank + axis]
        if type(size) is int:  # the rewrite needs every size: a fixed axis where the two differ is refused too
            last = ceil_last_start(size, reach, stride, begin, end)
            if last >= size + begin or (counted and last - begin + reach > size + end):
                free = next(a for a, d in enumerate(shape[2:]) if type(d) is not int)
                raise UnsupportedOpError(
                    f"{node.op_type} node {node.name or node.output[0]!r}: with ceil_mode its last window on "
                    f"spatial axis {axis} (size {size}) {'starts in the end padding' if last >= size + begin else 'overhangs the padded input'}, "
                    f"where onnxruntime 1.19.2 computes otherwise than the ONNX specification and PyTorch, and "
                    f"spatial axis {free} has {_free_size(shape[2 + free])}, so from_onnx cannot "
                    "write the pool in the form that agrees. Export the model with fixed spatial sizes (dynamic axes "
                    "on the batch only), or the pool without ceil_mode")
            continue
        if stride + end > reach or (counted and stride > 1):
            why = "starts in the end padding, which the ONNX specification and PyTorch drop" if stride + end > reach \
                else "overhangs the padded input, whose average they divide by the cells inside it, not the kernel"
            raise UnsupportedOpError(
                f"{node.op_type} node {node.name or node.output[0]!r}: with ceil_mode and spatial axis {axis} of "
                f"{_free_size(size)}, for some sizes its last window {why} (kernel {kernel}, "
                f"strides {strides}, pads {pads}), and onnxruntime 1.19.2 computes it otherwise; the form that agrees "
                "depends on the size. Export the model with fixed spatial sizes (dynamic axes on the batch only), "
                "which from_onnx rewrites exactly, or the pool without ceil_mode"
                + ("" if stride + end > reach else " or with count_include_pad=False"))


def empty_reductions_as_identity(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A reduction with ``noop_with_empty_axes=1`` and no axes (none given, or an empty constant) is its
    elementwise part (the identity for a sum, a square for ``ReduceSumSquare``), as the specification
    says; onnxruntime 1.19.2 reduced over every axis and failed ("Reduction on all axes, output size
    should be 1") in training and prediction alike."""
    empty = {t.name for t in model.graph.initializer if not np.prod(t.dims) and t.dims}
    empty |= {n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.attribute
              and n.attribute[0].HasField("t") and not np.prod(n.attribute[0].t.dims) and n.attribute[0].t.dims}

    def noop(n) -> bool:
        if n.op_type not in _ELEMENTWISE_PART or not attribute(n, "noop_with_empty_axes", 0):
            return False
        axes = n.input[1] if len(n.input) > 1 else ""
        return (not axes or axes in empty) and not attribute(n, "axes", [])

    def elementwise(i, n):
        op = _ELEMENTWISE_PART[n.op_type]
        x = n.input[0]
        return [helper.make_node(op, [x, x] if op == "Mul" else [x], [n.output[0]], name=n.name)], []

    count = sum(noop(n) for n in model.graph.node)
    if not count:
        return model, 0
    return replace_nodes(model, noop, elementwise), count


# What a reduction over no axis leaves: its elementwise part, where onnx's reference evaluator and the
# current specification agree (ReduceL1, ReduceL2 and ReduceLogSum, the identity in the one and an
# absolute value or a log in the other, are left)
_ELEMENTWISE_PART = {"ReduceSum": "Identity", "ReduceMean": "Identity", "ReduceMax": "Identity",
                     "ReduceMin": "Identity", "ReduceProd": "Identity", "ReduceLogSumExp": "Identity",
                     "ReduceSumSquare": "Mul"}


def refuse_pads_past_their_rows(model: onnx.ModelProto) -> None:
    """Refuse a ``Pad`` in ``reflect`` mode by as many rows as its (known) axis has, or more, or in
    ``wrap`` mode by more: onnxruntime 1.19.2's kernel reads past its input there (values from
    memory, changing from run to run), where PyTorch and current onnxruntime refuse a reflect pad,
    and the specification repeats rows again for a wrap."""
    reflecting = [n for n in model.graph.node if n.op_type == "Pad" and text_attribute(n, "mode", "constant")
                  in ("reflect", "wrap")]
    if not reflecting:
        return
    shapes = Shapes(model)
    consts = int64_constants(model)
    for node in reflecting:
        shape = shapes.shape(node.input[0])
        plan = pad_plan(node, lambda name: consts[name] if name in consts else folded_value(model, name),
                        None if shape is None else len(shape))
        if plan is None or shape is None:
            continue
        mode = text_attribute(node, "mode", "constant")
        for axis, ((b, e), size) in enumerate(zip(plan, shape)):
            most = (size - 1 if mode == "reflect" else size) if type(size) is int else None
            if most is not None and max(b, e) > most:
                raise UnsupportedOpError(
                    f"Pad node {node.name or node.output[0]!r} pads axis {axis} (size {size}) by {max(b, e)} in "
                    f"{mode!r} mode, which repeats at most {most} rows there; onnxruntime 1.19.2 reads past the "
                    "input for it (" + ("PyTorch and current onnxruntime refuse it" if mode == "reflect" else
                                        "the specification wraps around again") +
                    "). Pad less, or in 'edge' or 'constant' mode")


_COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
# the types onnxruntime 1.19.2 has no comparison kernel for, and the wider type each compares alike in
# (uint64 has none: no wider integer holds it)
_COMPARED_WIDER = {onnx.TensorProto.UINT8: onnx.TensorProto.INT32, onnx.TensorProto.INT8: onnx.TensorProto.INT32,
                   onnx.TensorProto.UINT16: onnx.TensorProto.INT32, onnx.TensorProto.INT16: onnx.TensorProto.INT32,
                   onnx.TensorProto.UINT32: onnx.TensorProto.INT64, onnx.TensorProto.BFLOAT16: onnx.TensorProto.FLOAT}


def comparisons_widened(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A comparison (``Equal``, ``Less``...) of 8- or 16-bit integers, ``uint32`` or ``bfloat16``,
    which onnxruntime 1.19.2 has no kernel for (the dynamo exporter writes ``torch.eye`` as an
    ``Equal`` of ``uint8`` ranges: neither prediction nor training opened), compares its inputs cast to
    a type that holds every value of theirs (``int32``, ``int64``, ``float``): the same answers."""
    if not any(n.op_type in _COMPARISONS for n in model.graph.node):
        return model, 0
    types = elem_types(model, lenient=True)
    fresh = FreshNames(model).fresh

    def narrow(n) -> bool:
        return n.op_type in _COMPARISONS and types.get(n.input[0]) in _COMPARED_WIDER

    def rewrite(i, node):
        to = _COMPARED_WIDER[types[node.input[0]]]
        casts = [helper.make_node("Cast", [x], [fresh(f"{x}/widened")], name=fresh(f"{node.name or node.op_type}/Cast"),
                                  to=to) for x in node.input]
        compared = helper.make_node(node.op_type, [c.output[0] for c in casts], list(node.output), name=node.name)
        return [*casts, compared], []

    matched = sum(map(narrow, model.graph.node))
    return (replace_nodes(model, narrow, rewrite), matched) if matched else (model, 0)


def _attributes_dropped(model: onnx.ModelProto, matches, names) -> tuple[onnx.ModelProto, int]:
    """``model`` without the attributes ``names`` on the nodes ``matches`` picks, and their count."""
    targets = [i for i, n in enumerate(model.graph.node) if matches(n)]
    if not targets:
        return model, 0
    out = copy.deepcopy(model)
    for i in targets:
        node = out.graph.node[i]
        for attr in [a for a in node.attribute if a.name in names]:
            node.attribute.remove(attr)
    return out, len(targets)


def _unnamed_split_outputs(graph: onnx.GraphProto):
    return (n for g in _graphs(graph) for n in g.node if n.op_type == "Split" and "" in n.output)


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph under it, depth first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from _graphs(sub)


def _names_in(graph: onnx.GraphProto) -> set[str]:
    return ({o for n in graph.node for o in n.output} | {v.name for v in graph.input}
            | {t.name for t in graph.initializer})


def repair(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Every rewrite above, in order; returns the model and ``{pass name: nodes changed}``."""
    report = {}
    for fn in (split_to_sequence_as_split, sum_to_add, layernorm_with_statistics, batchnorm_inference_form, dropout_with_training_input,
               gelu_tanh_as_arithmetic, activations_as_arithmetic, dilated_same_conv_with_pads,
               split_outputs_named, split_sizes_given, default_recurrent_activations_dropped, row_major_max_pools,
               ceil_pools_in_spec_form, empty_reductions_as_identity, comparisons_widened):
        model, n = fn(model)
        if n:
            report[fn.__name__] = n
    return model, report
