"""Sequence ops with constant sizes and indices written as tensor ops.

The dynamo exporter writes ``q, k, v = qkv.split(d, dim=-1)`` (and ``unbind``) as a
``SplitToSequence`` that only ``SequenceAt`` nodes with constant indices read, unless its own
optimizer runs. onnxruntime-training 1.19.2 has no gradient through sequence ops, so such a
model could not train. With the sizes fixed, the same values are a ``Split`` (and a ``Squeeze``
per part where ``unbind`` drops the axis), whose gradient the builder has.
"""

from __future__ import annotations

import collections
import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.graph.builder import FreshNames
from ortrain.graph.passes import attribute, int64_constants, node_inputs
from ortrain.graph.shapes import Shapes

__all__ = ["split_to_sequence_as_split"]


def split_to_sequence_as_split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Each ``SplitToSequence`` whose part sizes are known and which only ``SequenceAt`` nodes with
    constant indices read becomes a ``Split``; each ``SequenceAt`` the ``Identity`` of its part.
    Any other (sizes unknown, the sequence read whole) is left, and the gradient check names it."""
    plans = _plans(model)
    if not plans:
        return model, 0
    out = copy.deepcopy(model)
    names, nodes, parts, consts = FreshNames(out), [], {}, int64_constants(out, also_int32=True)
    for node in out.graph.node:
        plan = plans.get(node.output[0]) if node.op_type == "SplitToSequence" else None
        if plan is not None:
            new, parts[node.output[0]] = _as_split(node, *plan, names, out)
            nodes += new
        elif node.op_type == "SequenceAt" and node.input[0] in parts:
            index = int(consts[node.input[1]].reshape(-1)[0])
            nodes.append(helper.make_node("Identity", [parts[node.input[0]][index]], [node.output[0]],
                                          name=node.name or names.fresh(node.output[0] + "/Identity")))
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, len(plans)


def _plans(model: onnx.ModelProto) -> dict[str, tuple[list[int], int, bool, set[int]]]:
    """``{sequence name: (part sizes, axis, drop the axis, the parts read)}`` for the
    ``SplitToSequence`` nodes to rewrite (by output: node names need not be unique)."""
    g = model.graph
    readers = collections.defaultdict(list)
    for n in g.node:
        for v in node_inputs(n):
            readers[v].append(n)
    outputs = {o.name for o in g.output}
    # Positions and split sizes may be int32 or int64 in ONNX.
    consts, shapes, plans = int64_constants(model, also_int32=True), None, {}
    for n in g.node:
        if n.op_type != "SplitToSequence":
            continue
        seq, reads = n.output[0], readers[n.output[0]]
        if seq in outputs or not reads or not all(
                r.op_type == "SequenceAt" and r.input[0] == seq and r.input[1] in consts
                and consts[r.input[1]].size == 1 for r in reads):
            continue
        shapes = shapes or Shapes(model)
        sizes = _sizes(n, shapes.shape(n.input[0]), consts)
        if sizes is None:
            continue
        indices = [int(consts[r.input[1]].reshape(-1)[0]) for r in reads]
        if all(-len(sizes) <= k < len(sizes) for k in indices):
            drop = not (len(n.input) > 1 and n.input[1]) and attribute(n, "keepdims", 1) == 0
            read = {k % len(sizes) for k in indices}
            plans[seq] = (sizes, attribute(n, "axis", 0), drop, read)
    return plans


def _sizes(node: onnx.NodeProto, dims: list | None, consts: dict) -> list[int] | None:
    """The part sizes along the axis: the ``split`` list, chunks of a scalar ``split`` (the last
    one shorter), or ones without ``split``; None when they depend on a size not known."""
    split = node.input[1] if len(node.input) > 1 and node.input[1] else None
    if split is not None and split not in consts:
        return None
    if split is not None and consts[split].ndim == 1:
        return [int(v) for v in consts[split]]
    if dims is None:
        return None
    size = dims[attribute(node, "axis", 0) % len(dims)]
    if type(size) is not int:
        return None
    if split is None:
        return [1] * size
    chunk = int(consts[split])
    count = -(-size // chunk)
    return [chunk] * (count - 1) + [size - chunk * (count - 1)]


def _as_split(node, sizes: list[int], axis: int, drop: bool, read: set[int], names: FreshNames,
              model: onnx.ModelProto):
    """The ``Split`` (and a ``Squeeze`` for each part read) standing for ``node``, and the names of
    its parts in order. A part nothing reads stays an unread output of the ``Split``, which the
    training graph's ``Split`` form then handles (a squeezed copy would look read)."""
    seq = node.output[0]
    split_sizes, parts = names.fresh(seq + "/sizes"), [names.fresh(f"{seq}/part_{k}") for k in range(len(sizes))]
    model.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), split_sizes))
    nodes = [helper.make_node("Split", [node.input[0], split_sizes], parts, name=node.name or names.fresh(seq + "/Split"),
                              axis=axis)]
    if not drop:
        return nodes, parts
    axes = names.fresh(seq + "/axis")
    model.graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
    items = [names.fresh(f"{seq}/item_{k}") if k in read else part for k, part in enumerate(parts)]
    nodes += [helper.make_node("Squeeze", [parts[k], axes], [items[k]], name=names.fresh(items[k] + "/Squeeze"))
              for k in sorted(read)]
    return nodes, items
