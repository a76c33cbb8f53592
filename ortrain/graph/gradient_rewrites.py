"""Rewrites around onnxruntime-training's gradient builder: of the graph it reads
(:func:`unnamed_broadcast_dims`) and of the training graph it writes (:func:`for_gradients`),
among them the gradient of a max pool whose sizes are free, written as a scatter of the output
gradient.

onnxruntime-training 1.19.2's CPU ``MaxPoolGrad`` sizes the gradient it writes from the shapes the
graph stores for it, not from the tensors it is given. Where a pool's channels or spatial sizes
are free (a sequence of any length, images of any size; a free batch is fine) it writes an empty
gradient: the step fails in the next node ("GEMM: Dimension mismatch") or the process dies
reading past it (a Conv before the pool). The indices ``MaxPool`` returns for its gradient count
over the whole input (batch and channels included), so the gradient is

    dX = Reshape(ScatterElements(zeros(Size(X)), Flatten(indices), Flatten(dY), reduction="add"), Shape(X))

which sizes itself from the tensors (``add``: overlapping windows may share a maximum). Pools
whose sizes the graph fixes keep ``MaxPoolGrad``, which is a little faster (1.2 ms against
1.4 ms for a 64 x 16 x 28 x 28 input, measured).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.builder import FreshNames
from ortrain.graph.kernel_forms import (
    batch_norm_2d_in_standard_ops,
    conv_input_grad_as_conv,
    gelu_grad_in_standard_ops,
    grouped_conv_grads_kept_in_bounds,
)
from ortrain.graph.opsets import default_opset
from ortrain.graph.passes import (
    BROADCASTING,
    attribute,
    bias_grad_as_matmul,
    float32_values,
    relu_grad_as_mask,
    replace_nodes,
    scatter_nd_add,
    subgraph_reads,
    subgraphs,
)
from ortrain.graph.scalar_folds import scalars_folded
from ortrain.graph.shapes import Shapes

__all__ = ["control_flow_out_of_the_walk", "for_gradients", "gather_grad_as_scatter", "max_pool_grad_as_scatter",
           "unconfirmed_sizes_dropped", "unnamed_broadcast_dims"]

_ONE, _FLAT = "ortrain.max_pool_grad/one", "ortrain.max_pool_grad/flat"


def for_gradients(model: onnx.ModelProto, forward: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrites of a training graph as onnxruntime-training's gradient builder wrote it from
    ``forward`` (standard ONNX, whose value types and shapes the rewrites may need)."""
    model = max_pool_grad_as_scatter(model, forward)
    float32 = float32_values(forward)
    model = gather_grad_as_scatter(sum_after_gemm_as_add(bias_grad_as_matmul(relu_grad_as_mask(model, float32))),
                                   float32)
    model = gelu_grad_in_standard_ops(batch_norm_2d_in_standard_ops(model, forward, float32), float32)
    model = grouped_conv_grads_kept_in_bounds(conv_input_grad_as_conv(model, forward, float32), forward)
    return scalars_folded(model)


def repeated_inputs_apart(model: onnx.ModelProto) -> onnx.ModelProto:
    """A value a node reads at two or more of its inputs (``Concat(h, x, x)``, ``MatMul(h, h)``), or
    that two of the nodes whose gradient writes one for an input whether or not it needs one read
    (a concatenation, a batch or layer norm: a data input joined to two hidden layers, DenseNet's
    skips, ``concat([x, batch_norm(x)])``), read through an ``Identity`` at each place after the
    first: onnxruntime-training's gradient builder names what it writes for an input after the
    input (``x_grad``, the ``Shape`` of a ``MatMul``'s operands) and fails on the second definition
    of that name ("Duplicate definition of name"). The training session's optimizer removes the
    ``Identity`` nodes again. ``model`` itself when no node repeats an input and no two such nodes
    share one; nodes holding subgraphs are left as they are."""
    joined = [i for n in model.graph.node for i in set(_written_for_every_input(n))]
    if not any(len(set(i for i in n.input if i)) < len([i for i in n.input if i]) for n in model.graph.node) and \
            len(set(joined)) == len(joined):
        return model
    out = copy.deepcopy(model)
    nodes = []
    written = set()  # values whose gradient a node before writes whether or not it is needed
    for k, node in enumerate(out.graph.node):
        seen = set()
        writes = set(_written_for_every_input(node))
        for j, name in enumerate(node.input if not subgraphs(node) else ()):
            if not name:
                continue
            if name in seen or (name in writes and name in written):
                copy_name = f"{name}/repeated_input_{k}_{j}"
                nodes.append(helper.make_node("Identity", [name], [copy_name], name=copy_name))
                node.input[j] = copy_name
            seen.add(name)
        written |= writes
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _written_for_every_input(node) -> list[str]:
    """The inputs of ``node`` for which the gradient builder writes a gradient whether or not one
    is needed: every input of a concatenation (the session's optimizer writes a ``Concat`` as
    com.microsoft's ``ConcatTraining``), the data input of a batch or layer norm (the others are
    their own weights)."""
    if node.op_type in ("Concat", "ConcatTraining"):
        return [i for i in node.input if i]
    if node.op_type in _NORMS_WRITING_EVERY_INPUT and node.input and node.input[0]:
        return [node.input[0]]
    return []


_NORMS_WRITING_EVERY_INPUT = ("BatchNormalization", "BatchNormInternal", "LayerNormalization",
                              "SimplifiedLayerNormalization")


def sum_after_gemm_as_add(model: onnx.ModelProto) -> onnx.ModelProto:
    """A two-input ``Sum`` of a ``Gemm``'s output written as ``Add``: onnxruntime 1.19.2's
    ``GemmSumFusion`` asserts on a ``Gemm`` that reads the third or a later output of a node (a
    concatenation's gradient, split three ways, feeding a dense layer's; ``src_arg_index < 2``) and
    the training session fails to open. Which output a ``Gemm`` reads is known only after the
    session's own rewrites (a ``Reshape`` or ``Identity`` between them removed), so every such
    ``Sum`` goes. ``Add`` computes the same sum; the fusion leaves it."""
    gemms = {n.output[0] for n in model.graph.node if n.op_type == "Gemm" and n.output}
    for node in model.graph.node:
        if node.op_type == "Sum" and node.domain in ("", "ai.onnx") and len(node.input) == 2 and \
                any(i in gemms for i in node.input):
            node.op_type = "Add"
    return model


def max_pool_grad_as_scatter(model: onnx.ModelProto, forward: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (a training graph) with the ``MaxPoolGrad`` of every pool whose input has a free
    dimension after the batch (by the shapes of ``forward``, the standard-ONNX graph it was built
    from), or whose output the training graph does not declare with every size after the batch
    (the kernel sizes its output from that declaration when the session opens: one missing killed
    the process, one free gave a gradient of 0 cells), written as a scatter; ``model`` itself when
    there is none."""
    producer = {o: n for n in model.graph.node for o in n.output}
    shapes = None
    typed = {v.name for v in [*model.graph.value_info, *model.graph.output]
             if v.type.tensor_type.HasField("shape") and len(v.type.tensor_type.shape.dim) > 1
             and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim[1:])}

    def pool_of(node):
        pool = producer.get(node.input[1]) if node.op_type == "MaxPoolGrad" and len(node.input) > 1 else None
        return pool if pool is not None and pool.op_type == "MaxPool" else None

    def free(node) -> bool:
        nonlocal shapes
        pool = pool_of(node)
        if pool is None:
            return False
        shapes = shapes or Shapes(forward)
        shape = shapes.shape(pool.input[0])
        return shape is None or any(type(d) is not int for d in shape[1:]) or node.output[0] not in typed

    def as_scatter(i, node):
        pool = pool_of(node)
        name = pool.name or f"#{i}"
        if attribute(pool, "storage_order", 0) != 0 or default_opset(model) < 16:
            raise UnsupportedOpError(
                f"MaxPool node {name!r}: onnxruntime-training 1.19.2's gradient of a max pool whose sizes are "
                "free writes an empty gradient, and ortrain's replacement needs storage_order 0 and opset 16 or "
                "newer; give the model static sizes, or freeze the weights before the pool")
        x, p = pool.input[0], f"{node.name or 'MaxPoolGrad'}/as_scatter_{i}/"
        nodes = [
            helper.make_node("Shape", [x], [p + "shape"], name=p + "Shape"),
            helper.make_node("Size", [x], [p + "size"], name=p + "Size"),
            helper.make_node("Reshape", [p + "size", _ONE], [p + "size_1d"], name=p + "Reshape_size"),
            helper.make_node("ConstantOfShape", [p + "size_1d"], [p + "zeros"], name=p + "Zeros",
                             value=numpy_helper.from_array(np.zeros(1, np.float32))),
            helper.make_node("Reshape", [node.input[1], _FLAT], [p + "indices"], name=p + "Reshape_indices"),
            helper.make_node("Reshape", [node.input[0], _FLAT], [p + "updates"], name=p + "Reshape_updates"),
            helper.make_node("ScatterElements", [p + "zeros", p + "indices", p + "updates"], [p + "flat"],
                             name=p + "Scatter", axis=0, reduction="add"),
            helper.make_node("Reshape", [p + "flat", p + "shape"], [node.output[0]], name=p + "Reshape_grad"),
        ]
        return nodes, []

    return replace_nodes(model, free, as_scatter, [numpy_helper.from_array(np.array([1], np.int64), _ONE),
                                                  numpy_helper.from_array(np.array([-1], np.int64), _FLAT)])


def gather_grad_as_scatter(model: onnx.ModelProto, float32: set[str]) -> onnx.ModelProto:
    """``model`` (a training graph) with each ``GatherGrad`` over axis 0 of a ``float32`` value (an
    embedding table's, by the ``Shape`` node the gradient builder reads its size from) written as

        dW = ScatterND(zeros(Shape(W)), Unsqueeze(i, -1), dY, reduction="add")

    in the form of :func:`~ortrain.graph.passes.scatter_nd_add` (one ``ScatterElements``: the
    runtime's ``ScatterND`` loses additions on several threads). onnxruntime-training 1.19.2's CPU
    ``GatherGrad`` takes about 460 ns a row of the indices (15 ms for 32,768 rows of 16 values into
    a 1,000-row table, measured), the scatter about a fifth of that; a row taken twice, or more,
    gets the sum of its gradients, and a negative index counts from the end, as in ``Gather``.
    Needs opset 16 (``reduction``); ``model`` itself without it, or when there is nothing to rewrite."""
    if default_opset(model) < 16:
        return model
    producer = {o: n for n in model.graph.node for o in n.output}

    def rewritable(node) -> bool:
        if node.op_type != "GatherGrad" or attribute(node, "axis", 0) != 0:
            return False
        shape = producer.get(node.input[0])
        return shape is not None and shape.op_type == "Shape" and shape.input[0] in float32 and \
            attribute(shape, "start", 0) == 0 and attribute(shape, "end", None) is None  # the whole shape

    def as_scatter(i, node):
        shape, indices, dy = node.input
        p = f"{node.name or 'GatherGrad'}/as_scatter_{i}/"
        zeros = helper.make_node("ConstantOfShape", [shape], [p + "zeros"], name=p + "Zeros",
                                 value=numpy_helper.from_array(np.zeros(1, np.float32)))
        return [zeros, *scatter_nd_add(p, p + "zeros", indices, dy, 1, node.output[0])], []

    return replace_nodes(model, rewritable, as_scatter)


def unnamed_broadcast_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (before the gradient builder reads it) with the names taken off the free dimensions
    that meet another name or a size other than 1 in a broadcast; ``model`` itself when none do.

    onnxruntime-training 1.19.2's gradient builder decides which axes of a broadcast operand's
    gradient to sum from the stored shapes: it takes two differently named free dimensions as
    equal, and a named one as equal to any size it meets. Where such a dimension is 1 at run time
    (``x @ w + y @ v`` with ``y`` of one step against ``x`` of six) the gradient is not summed
    over it and the step fails ("GEMM: Dimension mismatch"). A free dimension without a name makes
    the builder sum by the sizes at run time (``BroadcastGradientArgs``), which is right whatever
    they are; dimensions that only ever meet their own name or 1 keep it, and pay nothing.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnxruntime has the last word on a graph onnx cannot type
        return model
    g = inferred.graph
    # The names the file gives (onnx's inference makes up others, unk__N, for what it cannot tell:
    # those are unknown sizes, which the builder sums at run time already).
    named = {d.dim_param for vi in [*model.graph.input, *model.graph.output]
             for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}
    dims = {t.name: list(t.dims) for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.tensor_type.HasField("shape"):
            dims[vi.name] = [d.dim_param if d.HasField("dim_param") and d.dim_param in named
                             else d.dim_value if d.HasField("dim_value") else None
                             for d in vi.type.tensor_type.shape.dim]
    ambiguous = set()
    for node in g.node:
        shapes = [dims.get(i) for i in node.input if i]
        if node.op_type not in BROADCASTING or len(shapes) < 2 or any(s is None for s in shapes):
            continue
        for k in range(1, max(len(s) for s in shapes) + 1):
            column = [s[-k] for s in shapes if len(s) >= k]
            names = {d for d in column if isinstance(d, str)}
            if len(names) > 1 or (names and any(isinstance(d, int) and d != 1 for d in column)):
                ambiguous |= names
    if not ambiguous:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in [*out.graph.input, *out.graph.value_info, *out.graph.output]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in ambiguous:
                d.ClearField("dim_param")
    return out


def control_flow_out_of_the_walk(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (before the gradient builder reads it) with the outputs of each ``If``, ``Loop`` or
    ``Scan`` whose body reads a value another node computes passed through a one-tensor sequence;
    ``model`` itself when there is none.

    onnxruntime-training 1.19.2's gradient builder walks back from the loss over every input edge of
    the nodes it meets, looking each edge's input up among the node's explicit inputs. The edge of
    a value a body reads from outside lies past them, and the builder aborts the process (an
    out-of-range index: ``x -> Relu -> If(then: Identity, else: Neg) -> MatMul(., W)``). The walk
    does not follow a sequence, so ``SequenceAt(SequenceConstruct(out), 0)`` keeps it off such a
    node. No gradient is lost: these ops have none in the runtime, and a weight behind one is refused
    at import (``from_onnx``)."""
    produced = {o for n in model.graph.node for o in n.output if o}
    held = {i for i, n in enumerate(model.graph.node) if subgraphs(n) and produced.intersection(subgraph_reads(n))}
    if not held:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = FreshNames(out)
    first = names.fresh("ortrain.control_flow/first")
    out.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), first))
    nodes = []
    for i, node in enumerate(out.graph.node):
        nodes.append(node)
        if i not in held:
            continue
        for k, value in enumerate(node.output):
            if not value or not _a_tensor(node, k):
                continue
            inside, sequence = names.fresh(f"{value}/held"), names.fresh(f"{value}/as_sequence")
            node.output[k] = inside
            nodes += [helper.make_node("SequenceConstruct", [inside], [sequence], name=names.fresh(f"{value}/hold")),
                      helper.make_node("SequenceAt", [sequence, first], [value], name=names.fresh(f"{value}/take"))]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _a_tensor(node: onnx.NodeProto, k: int) -> bool:
    """Whether output ``k`` of ``node`` (an ``If``, ``Loop`` or ``Scan``) is a tensor, as its body
    declares it (a sequence an ``If`` returns cannot go into a sequence of tensors; undeclared:
    taken for a tensor)."""
    bodies = {a.name: a.g for a in node.attribute if a.HasField("g")}
    body = bodies.get("then_branch") or bodies.get("body")
    position = k + 1 if node.op_type == "Loop" else k  # a Loop body's first output is its condition
    if body is None or position >= len(body.output):
        return True
    return body.output[position].type.WhichOneof("value") in (None, "tensor_type")


def unconfirmed_sizes_dropped(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (before onnxruntime optimizes it for the gradient builder) without the ``value_info``
    of intermediate values that give a fixed size onnx's inference does not confirm; ``model``
    itself when there is none.

    onnxruntime's constant folding takes a declared size for the truth: a ``Shape`` of a value
    declared ``[s77, 5, 6]`` becomes the constant ``[., 5, .]``. The dynamo exporter declares the
    first of two stacked LSTMs' output at the export's sequence length, though the file runs at
    any, so the training graph trained at that length only ("cannot be reshaped to the requested
    shape"). Without the annotation the runtime works the sizes out as it runs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(probe)
    except Exception:  # onnxruntime has the last word on a graph onnx cannot type
        return model
    known = {vi.name: vi.type.tensor_type.shape.dim for vi in inferred.graph.value_info
             if vi.type.tensor_type.HasField("shape")}

    def confirmed(vi) -> bool:
        dims = vi.type.tensor_type.shape.dim
        found = known.get(vi.name)
        if not any(d.HasField("dim_value") for d in dims):
            return True
        return found is not None and len(found) == len(dims) and all(
            not d.HasField("dim_value") or (k.HasField("dim_value") and k.dim_value == d.dim_value)
            for d, k in zip(dims, found))
    kept = [vi for vi in model.graph.value_info if confirmed(vi)]
    if len(kept) == len(model.graph.value_info):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    out.graph.value_info.extend(kept)
    return out
