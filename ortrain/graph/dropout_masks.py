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

A ``Dropout`` whose input shape is not fixed apart from the batch (a free sequence length in
an imported model), whose ratio or training flag is computed, or whose mask output another node
reads keeps the runtime's kernel.
"""

from __future__ import annotations

import json
import secrets

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.graph.builder import FreshNames

__all__ = ["MASK_PREFIX", "METADATA_KEY", "MaskSource", "dropout_as_mask_inputs", "with_mask_metadata"]

MASK_PREFIX = "ortrain.dropout_mask/"
METADATA_KEY = "ortrain.dropout_masks"
_FLOAT = onnx.TensorProto.FLOAT


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _dims(inferred: onnx.ModelProto, name: str) -> list | None:
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        if vi.name == name:
            t = vi.type.tensor_type
            if t.elem_type != _FLOAT or not t.HasField("shape"):
                return None
            return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return None


def _batch_input(graph: onnx.GraphProto, symbol: str) -> str | None:
    """The graph input whose first dimension is ``symbol``: its rows are the mask's."""
    for vi in graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].dim_param == symbol:
            return vi.name
    return None


def dropout_as_mask_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[dict]]:
    """``model`` with every active ``Dropout`` it can take written as ``x * mask``, the mask a new
    graph input; returns the model and one record per mask (input name, rate, seed, and the input
    whose rows give the mask's first dimension when that dimension is free)."""
    graph = model.graph
    if not any(n.op_type == "Dropout" and n.domain in ("", "ai.onnx") for n in graph.node):
        return model, []
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer keeps the runtime's dropout
        return model, []
    consts = _constants(graph)
    read = [i for n in graph.node for i in n.input] + [o.name for o in graph.output]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = FreshNames(out)
    nodes, masks = [], []
    for node in out.graph.node:
        record = _record(node, consts, inferred, read, out.graph, names, len(masks))
        if record is None:
            nodes.append(node)
            continue
        dims = record.pop("dims")
        out.graph.input.append(helper.make_tensor_value_info(record["input"], _FLOAT, dims))
        nodes.append(helper.make_node("Mul", [node.input[0], record["input"]], [node.output[0]],
                                      name=names.fresh(f"{node.name or 'Dropout'}/mask")))
        masks.append(record)
    if not masks:
        return model, []
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, masks


def _record(node, consts, inferred, read, graph, names, index: int) -> dict | None:
    if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    ratio, flag = consts.get(node.input[1]), consts.get(node.input[2])
    if ratio is None or flag is None or ratio.size != 1 or flag.size != 1 or not bool(flag.reshape(-1)[0]):
        return None
    rate = float(ratio.reshape(-1)[0])
    if not 0.0 <= rate < 1.0 or (len(node.output) > 1 and node.output[1] and node.output[1] in read):
        return None
    dims = _dims(inferred, node.input[0])
    if not dims or any(not isinstance(d, int) or d <= 0 for d in dims[1:]):
        return None
    batch = None
    if not isinstance(dims[0], int) or dims[0] <= 0:
        batch = _batch_input(graph, dims[0]) if isinstance(dims[0], str) else None
        if batch is None:
            return None
    seed = next((a.i for a in node.attribute if a.name == "seed"), None)
    return {"input": names.fresh(f"{MASK_PREFIX}{index}"), "rate": rate, "seed": seed, "batch": batch,
            "dims": dims}


def with_mask_metadata(model: onnx.ModelProto, masks: list[dict]) -> onnx.ModelProto:
    """Record the masks a training graph reads, for :class:`MaskSource`."""
    if masks:
        for p in [p for p in model.metadata_props if p.key == METADATA_KEY]:
            model.metadata_props.remove(p)
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps(masks, sort_keys=True))
    return model


class MaskSource:
    """Fills a training graph's mask inputs at every step (see the module's docstring)."""

    def __init__(self, model: onnx.ModelProto, feed_names: list[str]):
        """``feed_names``: the training graph's fed inputs in the runtime's order, masks included."""
        meta = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)
        records = json.loads(meta) if meta else []
        shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
                  for vi in model.graph.input}
        by_name = {r["input"]: r for r in records}
        self.data_names = [n for n in feed_names if n not in by_name]
        self._slots = []
        for k, r in enumerate(records):
            # An unseeded dropout draws masks no other session repeats, as the runtime's does.
            seed = r["seed"] if r["seed"] is not None else secrets.randbits(63)
            rate = np.float32(r["rate"])
            self._slots.append((feed_names.index(r["input"]),
                                None if r["batch"] is None else self.data_names.index(r["batch"]),
                                tuple(shapes[r["input"]]), rate, np.float32(1) / (np.float32(1) - rate),
                                np.array([seed % 2**64, k], np.uint64)))
        self._slots.sort(key=lambda s: s[0])  # inserted in order, each lands at its own slot
        self._buffers: dict[tuple, tuple] = {}

    def __bool__(self) -> bool:
        return bool(self._slots)

    def feeds(self, data: list, step: int) -> list:
        """``data`` (the fed inputs without the masks) with the masks of training step ``step``."""
        full = list(data)
        counter = np.array([0, step, 0, 0], np.uint64)
        for slot, batch, shape, rate, scale, key in self._slots:
            if batch is not None:
                shape = (data[batch].shape[0],) + shape[1:]
            u, keep, mask = self._arrays(slot, shape)
            np.random.Generator(np.random.Philox(counter=counter, key=key)).random(out=u, dtype=np.float32)
            np.greater_equal(u, rate, out=keep)
            np.multiply(keep, scale, out=mask)
            full.insert(slot, mask)
        return full

    def _arrays(self, slot: int, shape: tuple):
        arrays = self._buffers.get((slot, shape))
        if arrays is None:
            arrays = self._buffers[(slot, shape)] = (np.empty(shape, np.float32), np.empty(shape, np.bool_),
                                                    np.empty(shape, np.float32))
        return arrays
