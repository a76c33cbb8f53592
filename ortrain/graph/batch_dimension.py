"""The free dimensions of an imported model: a fixed first dimension of its data inputs made
symbolic, unless a hard-coded shape in the graph pins it, and an output declared with a fixed
size the graph computes from a free input dimension declared free."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import numpy_helper

from ortrain.graph.passes import BROADCASTING, _small_constants_folded, attribute, int64_constants
from ortrain.graph.shapes import folded_value

__all__ = ["free_batch_dimension", "free_output_batch", "free_output_dimensions"]

BATCH = "batch"


def _dim0(vi: onnx.ValueInfoProto):
    return (_dims(vi) or [None])[0]


def _dims(vi: onnx.ValueInfoProto) -> list | None:
    """Each dimension of a value: a number, a symbol or None."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def _set_dim0(vi: onnx.ValueInfoProto, param: str) -> None:
    d = vi.type.tensor_type.shape.dim[0]
    d.Clear()
    d.dim_param = param


def free_batch_dimension(model: onnx.ModelProto, data_inputs: list[str]) -> tuple[onnx.ModelProto, list[str]]:
    """Make a fixed first dimension of the data inputs symbolic where the graph allows it.

    Returns the new model and an empty list, or the unchanged model and what pins the
    batch: a ``Reshape`` to a constant shape whose first entry is a number (e.g. ``[1, 2048]``),
    a recurrent layer's initial state made for the fixed batch, or an output whose first
    dimension stays a number once the inputs' is free.
    """
    ins = [vi for vi in model.graph.input if vi.name in set(data_inputs)]
    fixed = {_dim0(vi) for vi in ins}
    if not ins or len(fixed) != 1 or not isinstance(next(iter(fixed)), int) or not next(iter(fixed)):
        return model, []
    batch = next(iter(fixed))
    cand = copy.deepcopy(model)
    del cand.graph.value_info[:]
    for vi in cand.graph.input:
        if vi.name in set(data_inputs):
            _set_dim0(vi, BATCH)
    probe = copy.deepcopy(cand)
    for vi in probe.graph.output:
        vi.type.tensor_type.ClearField("shape")
    consts = int64_constants(model)
    _fold_shapes(probe, model, consts)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception as exc:
        return model, [f"shape inference with a free batch ({str(exc).splitlines()[0]})"]
    dims = {vi.name: _dim0(vi) for vi in list(inferred.graph.value_info) + list(inferred.graph.input)
            + list(inferred.graph.output)}
    blockers = []
    for node in model.graph.node:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in consts:
            shape = consts[node.input[1]].reshape(-1)
            if dims.get(node.input[0]) == BATCH and shape.size and shape[0] > 0:
                blockers.append(f"Reshape {node.name or node.output[0]!r} to the constant shape {shape.tolist()}")
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    shapes.update((vi.name, _dims(vi)) for vi in list(inferred.graph.value_info) + list(inferred.graph.input))
    for node in model.graph.node:
        if node.op_type in ("LSTM", "GRU", "RNN") and len(node.input) > 5:
            # the initial states (inputs 5, and 6 for LSTM) are laid out (directions, batch, hidden),
            # or (batch, directions, hidden) with layout=1, as X is (seq, batch, in) or (batch, seq, in)
            axis = 0 if attribute(node, "layout", 0) == 1 else 1
            x_batch = (shapes.get(node.input[0]) or [None, None])[axis]
            for state in node.input[5:7]:
                if state and x_batch == BATCH and (shapes.get(state) or [None, None])[axis] == batch:
                    blockers.append(f"{node.op_type} {node.name or node.output[0]!r}'s initial state {state!r} "
                                    f"has a fixed batch of {batch}")
    blockers += _mixed_with_batch(model, shapes, batch)
    for vi in inferred.graph.output:
        if dims.get(vi.name) == batch:
            blockers.append(f"output {vi.name!r} keeps a first dimension of {batch}")
    if blockers:
        return model, blockers
    for vi in cand.graph.output:
        if _dim0(vi) == batch:
            _set_dim0(vi, BATCH)
    return cand, []


def _fold_shapes(probe: onnx.ModelProto, model: onnx.ModelProto, consts: dict) -> None:
    """Values the graph computes from constants alone, fed to ``probe``'s nodes as initializers so
    that shape inference sees the sizes they make: the shapes ``Reshape``, ``Expand`` and
    ``ConstantOfShape`` take (torch writes ``p.expand(x.shape[0], -1)`` of a fixed batch as a
    ``Where`` of constants), also added to ``consts``; and the operands of ``Concat`` and of the
    broadcasting ops (``torch.arange(n)`` beside the batch)."""
    initializers = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    found: dict[str, np.ndarray | None] = {}
    fed = set()
    for node in probe.graph.node:
        at = {"Reshape": [1], "Expand": [1], "ConstantOfShape": [0]}.get(node.op_type)
        if at is None and (node.op_type == "Concat" or node.op_type in BROADCASTING):
            at = range(len(node.input))  # a tensor made from constants alone (torch.arange(n)) has fixed sizes
        for k in at or ():
            name = node.input[k]
            if not name or name in initializers:
                continue
            if name not in found:
                value = consts.get(name)
                found[name] = value if value is not None else folded_value(model, name, initializers, producers)
            value = found[name]
            if value is None or value.size > 1 << 16 or (k and node.op_type in ("Reshape", "Expand")
                                                          and value.dtype != np.int64):
                continue
            if node.op_type in ("Reshape", "Expand", "ConstantOfShape"):
                consts[name] = value
            folded = f"{name}/ortrain.folded"
            if folded not in fed:
                fed.add(folded)
                probe.graph.initializer.append(numpy_helper.from_array(np.asarray(value), folded))
            node.input[k] = folded


def _mixed_with_batch(model: onnx.ModelProto, shapes: dict, batch: int) -> list[str]:
    """Nodes that meet the free batch and a tensor made for the fixed one on the same axis (with the
    inputs' shapes of the graph whose batch is free): a ``Concat`` beside the batch of a learned token
    expanded to ``x.shape[0]`` rows, an elementwise op between the batch and a tensor of ``batch``
    rows (a size of 1 broadcasts). The graph would fail on any other batch."""
    found = []
    for node in model.graph.node:
        if node.op_type == "Concat":
            rank = len(shapes.get(node.output[0]) or shapes.get(node.input[0]) or [])
            if rank and attribute(node, "axis", 0) % rank == 0:
                continue
        elif node.op_type not in BROADCASTING or batch == 1:  # a size of 1 broadcasts
            continue
        ins = [shapes.get(i) for i in node.input if i]
        ranks = {len(sh) for sh in ins if sh}
        firsts = {sh[0] for sh in ins if sh}
        if len(ranks) == 1 and BATCH in firsts and batch in firsts:
            made = next(i for i, sh in zip((i for i in node.input if i), ins) if sh and sh[0] == batch)
            found.append(f"{node.op_type} {node.name or node.output[0]!r} meets the batch with {made!r}, made for "
                         f"{batch} rows")
    return found


def free_output_dimensions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Declare free the positions of an output (the dimensions between its batch and its last
    axis) that the file declares fixed but that follow the inputs' free dimensions; returns the
    model and the dimensions changed (``output[axis]``).

    PyTorch's dynamo exporter declares a recurrent layer's output with the example's length
    (``(batch, 7, classes)`` for an input of free length): predictions run at any length, since
    onnxruntime computes the shape, but the loss's labels took the declared 7. onnx's shape
    inference runs with the inputs' free dimensions set to two different sizes: a position it
    finds the same at both (``h.reshape(b, -1, 3)`` after pooling a sequence away, ``x[:, :5]``)
    keeps the declared size; one it finds different, or cannot find (the recurrent layer's), is
    declared free, and the labels of each batch are then checked against the prediction the
    runtime makes (``GraphModel._output_shape_for``). The batch has its own rule
    (:func:`free_batch_dimension`), and the last axis stays declared.
    """
    if not any(d is None or isinstance(d, str) for vi in model.graph.input for d in (_dims(vi) or [])[1:]):
        return model, []
    found = [_outputs_at(model, size) for size in (5, 7)]
    if found[0] is None or found[1] is None:
        return model, []
    out, changed = None, []
    for i, declared in enumerate(model.graph.output):
        want, small, large = _dims(declared), found[0][i], found[1][i]
        if not want or small is None or large is None or not len(want) == len(small) == len(large):
            continue
        for axis in range(1, len(want) - 1):
            a, b = small[axis], large[axis]
            if isinstance(want[axis], int) and not (isinstance(a, int) and a == b):
                out = out or copy.deepcopy(model)
                out.graph.output[i].type.tensor_type.shape.dim[axis].Clear()  # free, without a name
                changed.append(f"{declared.name}[{axis}]")
    return (out, changed) if out is not None else (model, [])


def free_output_batch(model: onnx.ModelProto, data_inputs: list[str], run=None) -> tuple[onnx.ModelProto, list[str]]:
    """Declare free the first dimension of an output that the file declares fixed while the batch of
    every data input (``data_inputs``) is free, where it follows the batch: by onnx's inference, or
    where that cannot follow it, by the rows of a run at two batch sizes on zeros (``run(model,
    feeds) -> outputs``, where given); returns the model and the outputs changed. TorchScript's
    exporter declares an output it was not told is dynamic with the example's batch (``[2, 3]`` for
    inputs ``[batch, 32]``): predictions ran at any batch, but the loss's labels took the 2 (fit
    refused 4 rows with the runtime's message). An output whose rows the graph fixes (a ``Reshape``
    to ``[2, -1]``, a mean over the batch) keeps them, and so does every output where neither
    inference nor a run tells."""
    data = [vi for vi in model.graph.input if vi.name in set(data_inputs)]
    if not data or any(isinstance((_dims(vi) or [1])[0], int) for vi in data) or \
            not any(isinstance((_dims(o) or [None])[0], int) for o in model.graph.output):
        return model, []
    sizes = (4, 6)
    found = [_outputs_at(model, 5, batch) for batch in sizes]
    if found[0] is None or found[1] is None:
        return model, []
    ran, tried = None, False
    out, changed = None, []
    for i, declared in enumerate(model.graph.output):
        want, a, b = _dims(declared), found[0][i], found[1][i]
        if not want or not isinstance(want[0], int):
            continue
        rows = (a[0], b[0]) if a and b else (None, None)
        if not all(isinstance(r, int) for r in rows) and run is not None:  # inference cannot follow them
            if not tried:
                ran, tried = _rows_at_run_time(model, set(data_inputs), sizes, run), True
            rows = tuple(r[i] for r in ran) if ran else rows
        if rows != sizes:
            continue  # fixed by the graph, or not known to follow the batch: as declared
        out = out or copy.deepcopy(model)
        out.graph.output[i].type.tensor_type.shape.dim[0].Clear()
        out.graph.output[i].type.tensor_type.shape.dim[0].dim_param = "batch"
        changed.append(declared.name)
    return (out, changed) if out is not None else (model, [])


# Ops a run on zeros may not end in (a loop until a value is reached), or whose outputs' sizes follow
# values; and ops that read sizes or indices, which must come from constants and shapes alone for such a run
_VALUES_DECIDE = frozenset({"Loop", "Scan", "If", "NonZero", "Compress", "Unique", "NonMaxSuppression",
                            "SequenceConstruct", "SplitToSequence"})
_READ_SIZES = frozenset({"Range", "ConstantOfShape", "Expand", "Tile", "TopK", "OneHot", "Resize", "Upsample", "Pad",
                         "Slice"})


def _sizes_from_constants_or_shapes(node, producers: dict, fixed: set[str]) -> bool:
    """Whether the inputs ``node`` reads as sizes or indices (all but its first; all of a ``Range``'s
    or ``ConstantOfShape``'s) are computed from constants (``fixed``, or ``Constant`` nodes) and
    tensors' shapes alone, not from values (``producers``: each value's node)."""
    reads = list(node.input) if node.op_type in ("Range", "ConstantOfShape") else list(node.input[1:])
    seen, stack = set(), [r for r in reads if r]
    while stack:
        name = stack.pop()
        if name in seen or name in fixed:
            continue
        seen.add(name)
        producer = producers.get(name)
        if producer is None or producer.op_type in _VALUES_DECIDE:  # a graph input's values
            return False
        if producer.op_type not in ("Shape", "Size", "Constant"):
            stack.extend(i for i in producer.input if i)
    return True


def _rows_at_run_time(model: onnx.ModelProto, data: set[str], sizes, run) -> list | None:
    """The outputs' rows (``[batch][output]``) in a run of ``model`` on zeros at each batch size of
    ``sizes`` (other free data dimensions at 5, other inputs, such as weights kept out of the graph,
    at their declared shapes); None where a run fails or an input's shape is not known, and for a
    graph with an op whose run on zeros could loop without end or size a tensor from the values
    (``_VALUES_DECIDE``) or read a value computed from the data as a size (``_READ_SIZES``)."""
    weights = {t.name for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    if any(n.op_type in _VALUES_DECIDE or
           (n.op_type in _READ_SIZES and not _sizes_from_constants_or_shapes(n, producers, weights))
           for n in model.graph.node):
        return None
    found = []
    for batch in sizes:
        feeds = {}
        for vi in model.graph.input:
            dims = _dims(vi)
            if vi.name in weights:
                continue
            if dims is None or (vi.name not in data and not all(isinstance(d, int) for d in dims)):
                return None
            shape = [batch if k == 0 and vi.name in data else d if isinstance(d, int) else 5
                     for k, d in enumerate(dims)]
            feeds[vi.name] = np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        try:
            outputs = run(model, feeds)
        except Exception:  # noqa: BLE001 - zeros the graph refuses: what the file declares stands
            return None
        found.append([np.shape(o)[0] if np.ndim(o) else None for o in outputs])
    return found


def _outputs_at(model: onnx.ModelProto, size: int, batch: int = 2) -> list | None:
    """The outputs' dimensions by onnx's shape inference with every free input dimension (the
    batch at ``batch``) set to ``size``, after folding the small values the graph computes from
    constants alone; None when inference fails."""
    probe = copy.deepcopy(model)
    del probe.graph.value_info[:]
    for vi in probe.graph.output:
        vi.type.tensor_type.ClearField("shape")
    for vi in probe.graph.input:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                d.Clear()
                d.dim_value = batch if axis == 0 else size
    try:
        inferred = onnx.shape_inference.infer_shapes(_small_constants_folded(probe), data_prop=True)
    except Exception:  # what the file declares stands; onnxruntime has the last word
        return None
    return [_dims(vi) for vi in inferred.graph.output]
