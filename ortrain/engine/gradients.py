"""Offline construction of the training and eval graphs and the initial checkpoint.

Given a forward graph that already ends in a loss, onnxruntime-training's
gradient builder adds the backward pass. This is the same sequence
``onnxruntime.training.artifacts.generate_artifacts`` runs, without its global
model accessor or temporary files in the working directory, and with quiet
session options.
"""

from __future__ import annotations

import copy
import os
import re

import numpy as np
import onnx
from onnx import numpy_helper

from ortrain.engine import denormals
from ortrain.engine._runtime import C, runtime_path, training_graph_utils
from ortrain.engine.device import session_options
from ortrain.engine.inference import run_model
from ortrain.errors import OrtrainError, UnsupportedOpError
from ortrain.graph import IR_VERSION
from ortrain.graph.dropout_masks import dropout_as_mask_inputs, with_mask_metadata
from ortrain.graph.gradient_ops import (
    nodes_reached,
    recurrent_weights_differentiated_whole,
    refuse_recurrent_forms,
)
from ortrain.graph.gradient_rewrites import (
    control_flow_out_of_the_walk,
    for_gradients,
    repeated_inputs_apart,
    unconfirmed_sizes_dropped,
    unnamed_broadcast_dims,
)
from ortrain.graph.passes import inferred_shapes, subgraphs

_NO_BUILDER = re.compile(r"gradient builder has not been registered:\s*(\S+)")


def build_training_graphs(model: onnx.ModelProto, requires_grad: list[str], frozen: list[str],
                          outputs: list[str]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Return ``(training_model, eval_model)`` for a forward graph whose first output is the loss.

    ``requires_grad`` and ``frozen`` name initializers of ``model``: both become graph
    inputs fed from the checkpoint state; every other initializer stays a constant.
    Inputs of the training model: the model's own inputs, then the parameters, then one
    gradient accumulation buffer per trainable parameter, then ``lazy_reset_grad``; the
    masks of its dropout (:mod:`ortrain.graph.dropout_masks`) are inputs too.
    """
    if not requires_grad:
        raise OrtrainError("nothing to train: no parameter requires a gradient (all are frozen or constants)")
    refuse_recurrent_forms(model)
    model = merge_equal_nodes(copy.deepcopy(model))
    grads, frozen_set = set(requires_grad), set(frozen)
    whole = recurrent_weights_differentiated_whole(model, grads)  # their gradients are dropped below
    training_graph_utils._move_initializers_to_inputs(model, grads | frozen_set)
    eval_model = copy.deepcopy(model)
    training_graph_utils._disable_training_mode(eval_model)
    model, masks, kept = dropout_as_mask_inputs(model, grads | frozen_set, run=run_model)

    so = session_options(threads=1)
    try:
        unnamed = unnamed_broadcast_dims(unconfirmed_sizes_dropped(control_flow_out_of_the_walk(model)))
        with denormals.kept():  # the optimizer opens a session, which sets the flush on the first thread
            optimized = onnx.load_from_string(C.get_optimized_model(unnamed.SerializeToString(), grads | whole, so))
        optimized = max_pool_inputs_typed(repeated_inputs_apart(optimized), unnamed)
        builder = C.GradientGraphBuilder(optimized.SerializeToString(), {outputs[0]}, grads | whole, outputs[0], so)
        builder.build()
    except Exception as exc:  # the builder reports everything as RuntimeError / Fail
        if "Pow's input exponent" in str(exc):  # the builder differentiates a Pow in its base only
            trained = grads | {o for _, n in nodes_reached(model, grads) for o in n.output}
            nodes = [n.name or f"Pow#{i}" for i, n in enumerate(model.graph.node)
                     if n.op_type == "Pow" and len(n.input) > 1 and {n.input[0], n.input[1]} <= trained]
            raise UnsupportedOpError(
                f"Pow {', '.join(map(repr, nodes)) or 'node'}: its base and its exponent both depend on trained "
                "weights, and onnxruntime-training differentiates a Pow in its base only (where the base is "
                "not trained, an exponent's gradient is left out, with a warning at import). Freeze the weights "
                "that reach the exponent, or write b ** e as exp(e * log(b)) for a positive base") from exc
        match = _NO_BUILDER.search(str(exc))
        if match:
            op = match.group(1).rstrip(".,;")
            nodes = [n.name or f"#{i}" for i, n in enumerate(model.graph.node) if n.op_type == op]
            raise UnsupportedOpError(f"operator {op} has no gradient in onnxruntime-training 1.19.2 "
                                     f"(nodes: {', '.join(nodes) or 'inserted by graph optimisation'}); "
                                     f"freeze the weights before it or replace the op") from exc
        raise OrtrainError(f"onnxruntime-training could not build the gradient graph: "
                           f"{str(exc).splitlines()[0]}") from exc
    built = onnx.load_from_string(builder.get_model())
    unused = [o for o in built.graph.output if o.name in {f"{name}_grad" for name in whole}]
    for output in unused:
        built.graph.output.remove(output)
    training = for_gradients(chain_shared_statistics(built, model), model)  # chained before rewritten
    training_graph_utils._reorder_outputs(training, outputs, grads)
    training_graph_utils.build_gradient_accumulation_graph(training, grads)
    for m in (training, eval_model):
        if m.ir_version > 10 or m.ir_version < IR_VERSION:
            m.ir_version = IR_VERSION
    return with_mask_metadata(training, masks, kept), eval_model


# Ops whose equal calls compute different values (a draw each), never merged as equal.
_DRAWS = frozenset({"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                    "Bernoulli", "Multinomial"})


def merge_equal_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Equal nodes (the same op, inputs and attributes; not those that draw random numbers or hold
    subgraphs) as one, in graph order, as the runtime's optimizer would merge them, but counting
    the batch norms: one applied k times to one value (``bn(x) + bn(x)``, or to equal computations
    of it, ``bn(relu(a)) + bn(relu(a))``) becomes one node of momentum ``momentum ** k``, since the
    calls' outputs are equal and k updates by the same batch statistics move the running ones as
    one update by ``momentum ** k`` does (merged by the runtime, the statistics moved once).
    Changes ``model`` in place and returns it."""
    graph = model.graph
    renamed: dict[str, str] = {}
    seen: dict[tuple, onnx.NodeProto] = {}
    merged: dict[int, int] = {}  # id of a batch norm kept -> how many calls it stands for
    kept = []
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
        bodies = subgraphs(node)
        if bodies:  # an If/Loop/Scan body reads outer values by name: it reads the merged ones
            for body in bodies:
                _rename_reads(body, renamed)
        if node.op_type in _DRAWS or bodies:
            kept.append(node)
            continue
        key = (node.domain, node.op_type, tuple(node.input), tuple(bool(o) for o in node.output),
               tuple(sorted(a.SerializeToString() for a in node.attribute)))
        first = seen.get(key)
        if first is None:
            seen[key] = node
            kept.append(node)
            continue
        renamed.update((o, f) for o, f in zip(node.output, first.output) if o)
        if node.op_type == "BatchNormalization":
            merged[id(first)] = merged.get(id(first), 1) + 1
    if not renamed:
        return model
    for node in kept:
        count = merged.get(id(node))
        if count is not None:
            momentum = next((a for a in node.attribute if a.name == "momentum"), None)
            if momentum is None:
                momentum = node.attribute.add()
                momentum.name, momentum.type, momentum.f = "momentum", onnx.AttributeProto.FLOAT, 0.9
            momentum.f = float(np.float32(momentum.f) ** count)
    del graph.node[:]
    graph.node.extend(kept)
    for out in graph.output:
        if out.name in renamed:  # a graph output keeps its name: an Identity of the value it equals
            graph.node.append(onnx.helper.make_node("Identity", [renamed[out.name]], [out.name]))
    return model


def _rename_reads(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
        for body in subgraphs(node):
            _rename_reads(body, renamed)


def chain_shared_statistics(training: onnx.ModelProto, forward: onnx.ModelProto) -> onnx.ModelProto:
    """A batch norm applied more than once (a shared layer, one backbone over two inputs) updates its
    running statistics once per application, in the order of the calls, as PyTorch does.

    The runtime's training-mode ``BatchNormInternal`` writes the new statistics into the buffers it
    reads (its outputs 1 and 2 alias inputs 3 and 4), so applications that read the same buffers
    update them in whatever order the runtime runs the nodes, which follows neither the calls nor
    the training graph's listing (its optimizer reorders nodes). Each later application, in the
    order of the ``forward`` graph (the calls'), reads the statistics the one before it wrote (its
    outputs, the same buffers). Changes ``training`` in place and returns it.
    """
    called = {n.output[0]: i for i, n in enumerate(forward.graph.node)
              if n.op_type == "BatchNormalization" and n.output}
    shared: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    for node in training.graph.node:
        if node.op_type == "BatchNormInternal" and len(node.input) >= 5 and len(node.output) >= 3:
            shared.setdefault((node.input[3], node.input[4]), []).append(node)
    for nodes in shared.values():
        nodes.sort(key=lambda n: called.get(n.output[0], len(called)))  # stable: unknown ones keep their place
        for before, node in zip(nodes, nodes[1:]):
            node.input[3], node.input[4] = before.output[1], before.output[2]
    return training


def write_initial_checkpoint(path: str | os.PathLike, trainable: dict[str, np.ndarray],
                             frozen: dict[str, np.ndarray]) -> None:
    """A weights-only checkpoint in onnxruntime-training's format."""
    t = [numpy_helper.from_array(np.ascontiguousarray(a), n).SerializeToString() for n, a in trainable.items()]
    f = [numpy_helper.from_array(np.ascontiguousarray(a), n).SerializeToString() for n, a in frozen.items()]
    C.save_checkpoint(t, f, runtime_path(path, "checkpoint"), False)


def max_pool_inputs_typed(model: onnx.ModelProto, before: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (the session optimizer's graph) with the shapes of its ``MaxPool`` inputs declared
    (``value_info``) where it declares none, as onnx's inference finds them in ``before``, the graph
    the optimizer was given (in the optimized one it stops at com.microsoft ops: a
    ``ConcatTraining``, a fused activation): the gradient builder types a ``MaxPoolGrad``'s output by
    the pool's input, and onnxruntime-training's kernel reads its shape when the session opens;
    where the builder's own inference had lost it (after the arithmetic forms of ``Softplus`` or
    ``HardSwish``, after a reshape to ``x.shape[0]``), opening the training session killed the
    process (SIGSEGV)."""
    pooled = {n.input[0] for n in model.graph.node if n.op_type == "MaxPool" and n.input}
    declared = {v.name for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    missing = pooled - declared
    if not missing:
        return model
    found = {}
    for source in (before, model):  # (a value the optimizer made is typed in its own graph, if at all)
        inferred = inferred_shapes(source)  # None where onnx cannot type the graph
        for v in inferred.graph.value_info if inferred is not None else ():
            dims = v.type.tensor_type.shape.dim if v.type.tensor_type.HasField("shape") else []
            # every size after the batch known: the kernel reads a size it is not told as 0
            if v.name in missing and v.name not in found and len(dims) > 1 and \
                    all(d.HasField("dim_value") for d in dims[1:]):
                found[v.name] = v
    if not found:
        return model
    out = copy.deepcopy(model)
    out.graph.value_info.extend(found.values())
    return out
