"""Dropout masks drawn by ortrain, not by onnxruntime's ``Dropout`` kernel.

onnxruntime's CPU ``Dropout`` seeds a fresh ``minstd_rand0`` generator with ``seed + k`` at its
k-th run and takes one draw per element. Draws from consecutive seeds of that generator are
nearly the same sequence shifted: element 0 is dropped (or kept) at every step for tens of
thousands of steps, and every other element cycles through a fixed pattern. A training graph
therefore reads each mask from an input instead (``x * mask``, whose gradient is dropout's),
and :class:`MaskSource` fills it at every step from a counter-based generator (Philox) keyed by
the dropout's seed and its index, at a counter of the step number: each step's masks are
independent of the others', and a resumed session draws exactly what an uninterrupted one
would have drawn, from the step count alone.

The mask is fed flat and reshaped to the dropout's input in the graph, so its input may have
any shape whose size is fixed per row of the batch (after a transpose or a reshape of the
batch axis too). Sizes come from onnx's shape inference at a few batch sizes, or, where it
loses them (an exporter's computed reshapes), from running the forward graph there. A
``Dropout`` over a size that only a step can tell (a free sequence length in an imported model,
a size that depends on the values), inside a control-flow subgraph, whose ratio or training
flag is computed, or whose mask output another node reads keeps the runtime's kernel; the
training graph records which, and a session opening it warns.
"""

from __future__ import annotations

import json
import secrets

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.graph.builder import FreshNames
from ortrain.graph.gradient_ops import ancestors

__all__ = ["MASK_PREFIX", "METADATA_KEY", "MaskSource", "dropout_as_mask_inputs", "kernel_warning",
           "with_mask_metadata"]

MASK_PREFIX = "ortrain.dropout_mask/"
METADATA_KEY = "ortrain.dropout_masks"
KERNEL_KEY = "ortrain.dropout_kernel"
_FLOAT = onnx.TensorProto.FLOAT
_ROWS = (2, 3, 7)  # batch sizes at which a size is checked to grow with the rows
_KERNEL = ("That kernel draws masks whose elements repeat patterns from step to step (its first element is dropped, "
           "or kept, at every step); ortrain draws independent masks for a dropout over a tensor of fixed size per row")


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _elements(inferred: onnx.ModelProto | None, names: list[str]) -> dict[str, int | None]:
    """How many elements each float32 value of ``names`` holds, where inference fixes them all."""
    out = dict.fromkeys(names)
    if inferred is None:
        return out
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if vi.name in out and t.elem_type == _FLOAT and t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
            out[vi.name] = int(np.prod(dims, dtype=np.int64)) if all(d > 0 for d in dims) else None
    return out


def _infer(model: onnx.ModelProto, batch: tuple[list[str], int] | None = None) -> onnx.ModelProto | None:
    """``model`` with inferred shapes; ``batch`` = (inputs, rows) first gives those inputs' free
    first dimension that many rows."""
    if batch is not None:
        fixed = onnx.ModelProto()
        fixed.CopyFrom(model)
        for vi in fixed.graph.input:
            if vi.name in batch[0]:
                vi.type.tensor_type.shape.dim[0].dim_value = batch[1]
        model = fixed
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer keeps the runtime's dropout
        return None


def _nested_dropouts(graph: onnx.GraphProto, depth: int = 0):
    """The ``Dropout`` nodes inside the subgraphs of ``graph``'s nodes (If, Loop, Scan)."""
    for node in graph.node:
        if depth and node.op_type == "Dropout":
            yield node
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _nested_dropouts(g, depth + 1)


def _batch(graph: onnx.GraphProto, data: list[str]) -> tuple[list[str], str] | None:
    """(inputs, input) when the only free dimension of every data input is its first: the rows of
    a batch, whatever each input names it (a model's ``N``, the label's ``batch``: a step feeds
    them all the same rows), whose count a step's first such input gives."""
    batched = []
    for vi in graph.input:
        if vi.name not in data:
            continue
        dims = list(vi.type.tensor_type.shape.dim)
        free = [i for i, d in enumerate(dims) if not d.HasField("dim_value")]
        if free and free != [0]:
            return None
        if free:
            batched.append(vi.name)
    return (batched, batched[0]) if batched else None


def dropout_as_mask_inputs(model: onnx.ModelProto, params=(), run=None) -> tuple[onnx.ModelProto, list, list]:
    """``model`` with every active ``Dropout`` it can take written as ``x * mask``, the mask a new
    graph input (flat, reshaped to ``x``'s shape in the graph). Returns the model, one record per
    mask (input name, rate, seed, and its size, fixed or per row of the batch) and one per
    dropout left to the runtime's kernel (node, why). ``params``: the graph inputs that are
    weights, not data. ``run(model, feeds)``: runs a graph, to measure the sizes onnx's shape
    inference cannot work out (an exporter's computed reshapes) at a few batch sizes."""
    graph = model.graph
    kept = [{"node": inner.name or inner.output[0], "why": "it lies inside a control-flow subgraph (If, Loop, Scan)"}
            for inner in _nested_dropouts(graph)]
    dropouts = [n for n in graph.node if n.op_type == "Dropout" and n.domain in ("", "ai.onnx")]
    if not dropouts:
        return model, [], kept
    xs = [n.input[0] for n in dropouts]
    # Only the inputs the dropouts read count: the labels and sample weights a loss reads (these with
    # a free axis after the batch where the outputs have more than two) tell nothing of their sizes.
    upstream = set().union(*(ancestors(model, x) for x in xs))
    data = [vi.name for vi in graph.input if vi.name not in set(params) and vi.name in upstream]
    batch = _batch(graph, data)
    static = _elements(_infer(model), xs)
    # The elements at three batch sizes: a size proportional to the rows is known from the rows.
    sizes = [dict.fromkeys(xs)] * len(_ROWS)
    unknown = [x for x in xs if static[x] is None]
    if (batch is not None or not data) and unknown:  # (without data read, no size grows with the rows)
        batched = batch[0] if batch is not None else []
        sizes = [_elements(_infer(model, (batched, rows)), xs) for rows in _ROWS]
        if run is not None and any(sized[x] is None for sized in sizes for x in unknown):
            sizes = _measured(model, batched, unknown, upstream, run) or sizes
    consts = _constants(graph)
    read = [i for n in graph.node for i in n.input] + [o.name for o in graph.output]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = FreshNames(out)
    nodes, masks = [], []
    for node in out.graph.node:
        x = node.input[0] if node.op_type == "Dropout" and node.input else None
        size = _size(static.get(x), [sized.get(x) for sized in sizes], batch)
        record = _record(node, consts, read, size, names, len(masks))
        if record is None or "why" in record:
            nodes.append(node)
            if record is not None:
                kept.append(record)
            continue
        rows = f"ortrain_mask_rows_{len(masks)}" if record["per_row"] else record["elements"]
        out.graph.input.append(helper.make_tensor_value_info(record["input"], _FLOAT, [rows]))
        base = node.name or "Dropout"
        shape = names.fresh(f"{base}/shape")
        mask = names.fresh(f"{base}/mask")
        nodes += [helper.make_node("Shape", [x], [shape], name=names.fresh(f"{base}/Shape")),
                  helper.make_node("Reshape", [record["input"], shape], [mask], name=names.fresh(f"{base}/Reshape")),
                  helper.make_node("Mul", [x, mask], [node.output[0]], name=names.fresh(f"{base}/Mul"))]
        masks.append(record)
    if not masks:
        return model, [], kept
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, masks, kept


def _measured(model: onnx.ModelProto, batched: list[str], names: list[str], upstream: set[str],
              run) -> list[dict] | None:
    """The elements of ``names`` when the part of the forward graph they are computed from
    (``upstream``) runs at each of ``_ROWS`` rows, on zeros and on ones: a size that differs between
    the two depends on the values (a ``NonZero``, a ``Range`` up to an input) and is None. None for
    all when some input cannot be given a shape, or the graph does not run on such inputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    kept = [n for n in probe.graph.node if any(o in upstream for o in n.output)]
    inputs = [vi for vi in probe.graph.input if vi.name in upstream]
    for field, values in ((probe.graph.node, kept), (probe.graph.input, inputs), (probe.graph.output, [])):
        del field[:]
        field.extend(values)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    constants = {t.name for t in probe.graph.initializer}
    out = []
    for rows in _ROWS:
        shapes = {}
        for vi in probe.graph.input:
            if vi.name in constants:
                continue
            t = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else (rows if vi.name in batched and i == 0 else -1)
                    for i, d in enumerate(t.shape.dim)]
            if min(dims, default=0) < 0:
                return None
            shapes[vi.name] = (dims, helper.tensor_dtype_to_np_dtype(t.elem_type))
        sized = []
        for fill in (np.zeros, np.ones):
            try:
                values = run(probe, {n: fill(dims, dtype) for n, (dims, dtype) in shapes.items()})
            except Exception:  # noqa: BLE001 - a graph that does not run on these keeps the runtime's dropout
                return None
            sized.append([int(v.size) for v in values])
        out.append({n: a if a == b else None for n, a, b in zip(names, *sized, strict=True)})
    return out


def _size(static, at_rows: list, batch) -> tuple[int, bool, str | None] | None:
    """(elements, per row, batch input) of a dropout's input, or None when they are not known
    before a step runs. ``at_rows``: its elements when the batch has each of ``_ROWS`` rows."""
    if static:
        return static, False, None
    if at_rows[0] and all(n == at_rows[0] for n in at_rows):  # measured, and not growing with the batch
        return at_rows[0], False, None
    per_row = at_rows[0] // _ROWS[0] if batch is not None and at_rows[0] else 0
    if per_row and all(n == per_row * rows for n, rows in zip(at_rows, _ROWS, strict=True)):
        return per_row, True, batch[1]
    return None


def _record(node, consts, read, size, names, index: int) -> dict | None:
    """The mask record of a dropout ortrain takes, ``{"node", "why"}`` for one it leaves to the
    runtime's kernel, None for a node that is no active dropout."""
    if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    ratio, flag = consts.get(node.input[1]), consts.get(node.input[2])
    if flag is not None and flag.size == 1 and not bool(flag.reshape(-1)[0]):
        return None  # never drops
    why = None
    if ratio is None or flag is None or ratio.size != 1 or flag.size != 1:
        why = "its ratio or training flag is computed in the graph"
    elif len(node.output) > 1 and node.output[1] and node.output[1] in read:
        why = "another node reads its mask"
    elif size is None:
        why = ("the size of its input is not known before a step runs (it depends on a free dimension besides the "
               "batch or on the input values, or ortrain could not work it out)")
    elif not 0.0 <= float(ratio.reshape(-1)[0]) < 1.0:
        return None
    if why:
        return {"node": node.name or node.output[0], "why": why}
    elements, per_row, batch = size
    seed = next((a.i for a in node.attribute if a.name == "seed"), None)
    return {"input": names.fresh(f"{MASK_PREFIX}{index}"), "rate": float(ratio.reshape(-1)[0]), "seed": seed,
            "elements": elements, "per_row": per_row, "batch": batch}


def kernel_warning(kept: list[dict]) -> str:
    """What to say of the dropouts a training graph leaves to the runtime's kernel."""
    nodes = "; ".join(f"{k['node']!r}: {k['why']}" for k in kept)
    return (f"Dropout node{'s' if len(kept) > 1 else ''} keep{'' if len(kept) > 1 else 's'} onnxruntime's kernel "
            f"({nodes}). {_KERNEL}")


def with_mask_metadata(model: onnx.ModelProto, masks: list[dict], kept: list[dict] = ()) -> onnx.ModelProto:
    """Record the masks a training graph reads (for :class:`MaskSource`) and the dropouts it leaves
    to the runtime's kernel (said when a session opens it)."""
    for key, value in ((METADATA_KEY, masks), (KERNEL_KEY, list(kept))):
        for p in [p for p in model.metadata_props if p.key == key]:
            model.metadata_props.remove(p)
        if value:
            model.metadata_props.add(key=key, value=json.dumps(value, sort_keys=True))
    return model


class MaskSource:
    """Fills a training graph's mask inputs at every step (see the module's docstring)."""

    def __init__(self, model: onnx.ModelProto, feed_names: list[str]):
        """``feed_names``: the training graph's fed inputs in the runtime's order, masks included."""
        meta = {p.key: p.value for p in model.metadata_props}
        records = json.loads(meta.get(METADATA_KEY, "[]"))
        self.kept = json.loads(meta.get(KERNEL_KEY, "[]"))  # dropouts left to the runtime's kernel
        by_name = {r["input"]: r for r in records}
        self.data_names = [n for n in feed_names if n not in by_name]
        self._slots = []
        for k, r in enumerate(records):
            # An unseeded dropout draws masks no other session repeats, as the runtime's does.
            seed = r["seed"] if r["seed"] is not None else secrets.randbits(63)
            rate = np.float32(r["rate"])
            bits = np.random.Philox(key=np.array([seed % 2**64, k], np.uint64))
            # set whole at every step, with nothing buffered: the draws start at the step's counter
            state = dict(bits.state, buffer_pos=4, has_uint32=0, uinteger=0)
            self._slots.append((feed_names.index(r["input"]),
                                self.data_names.index(r["batch"]) if r["per_row"] else None,
                                int(r["elements"]), rate, np.float32(1) / (np.float32(1) - rate),
                                bits, np.random.Generator(bits), state))
        self._slots.sort(key=lambda s: s[0])  # inserted in order, each lands at its own slot
        self._buffers: dict[tuple, tuple] = {}

    def __bool__(self) -> bool:
        return bool(self._slots)

    def feeds(self, data: list, step: int) -> list:
        """``data`` (the fed inputs without the masks) with the masks of training step ``step``."""
        full = list(data)
        for slot, batch, elements, rate, scale, bits, gen, state in self._slots:
            n = elements * data[batch].shape[0] if batch is not None else elements
            u, keep, mask = self._arrays(slot, n)
            state["state"]["counter"] = np.array([0, step, 0, 0], np.uint64)
            bits.state = state
            gen.random(out=u, dtype=np.float32)
            np.greater_equal(u, rate, out=keep)
            np.multiply(keep, scale, out=mask)
            full.insert(slot, mask)
        return full

    def _arrays(self, slot: int, n: int):
        arrays = self._buffers.get((slot, n))
        if arrays is None:
            arrays = self._buffers[(slot, n)] = (np.empty(n, np.float32), np.empty(n, np.bool_),
                                                 np.empty(n, np.float32))
        return arrays
