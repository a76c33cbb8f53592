"""A small, deterministic builder for ONNX graphs.

Names are generated from per-hint counters (``MatMul_0``, ``relu_3``), so the
same description always yields byte-identical models; that is what makes the
artifact cache's content hash meaningful.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortrain._version import __version__
from ortrain.errors import OrtrainError

# onnxruntime-training 1.19.2 reads IR version 10 at most (onnx>=1.18 writes 11).
# Opset 17 needs IR 8; everything ortrain writes states both explicitly.
OPSET = 17
IR_VERSION = 8
MS_DOMAIN = "com.microsoft"

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint64): TensorProto.UINT64,
    np.dtype(np.uint32): TensorProto.UINT32,
    np.dtype(np.uint16): TensorProto.UINT16,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}
_ONNX_TO_NP = {v: k for k, v in _NP_TO_ONNX.items()}


def onnx_dtype(dtype) -> int:
    """The ``TensorProto`` element type of a numpy dtype."""
    try:
        return _NP_TO_ONNX[np.dtype(dtype)]
    except KeyError:
        raise OrtrainError(f"dtype {np.dtype(dtype)} has no ONNX tensor type in ortrain") from None


def np_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type."""
    try:
        return _ONNX_TO_NP[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise OrtrainError(f"ONNX element type {name} is not supported by ortrain") from None


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of a graph input or output; ``None`` marks a free dimension."""

    name: str
    dtype: np.dtype
    shape: tuple

    def to_value_info(self) -> onnx.ValueInfoProto:
        dims = [d if isinstance(d, int) else (d or None) for d in self.shape]
        return helper.make_tensor_value_info(self.name, onnx_dtype(self.dtype), dims)

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": np.dtype(self.dtype).name, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict) -> TensorSpec:
        return cls(d["name"], np.dtype(d["dtype"]), tuple(d["shape"]))


def spec_of(value_info: onnx.ValueInfoProto) -> TensorSpec:
    """A :class:`TensorSpec` from a graph input/output; symbolic dimensions become ``None``."""
    tt = value_info.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return TensorSpec(value_info.name, np_dtype(tt.elem_type), dims)


class GraphBuilder:
    """Collects nodes, initializers, inputs and outputs, then emits a checked ``ModelProto``."""

    def __init__(self, name: str = "ortrain", prefix: str = ""):
        self.name = name
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.domains: set[str] = set()
        self._counters: dict[str, int] = {}
        self._inputs: set[str] = set()

    def unique(self, hint: str) -> str:
        """A fresh name ``{prefix}{hint}_{n}``, stable across runs, never an input's name (a model
        input may be called ``dense_0/gemm_0``)."""
        while True:
            n = self._counters.get(hint, 0)
            self._counters[hint] = n + 1
            name = f"{self.prefix}{hint}_{n}"
            if name not in self._inputs:
                return name

    @contextlib.contextmanager
    def scope(self, name: str):
        """Prefix generated names with ``name/`` inside the block (one scope per layer)."""
        saved = self.prefix
        self.prefix = f"{saved}{name}/"
        try:
            yield self
        finally:
            self.prefix = saved

    def add_input(self, name: str, dtype, shape: Sequence) -> str:
        self.inputs.append(TensorSpec(name, np.dtype(dtype), tuple(shape)).to_value_info())
        self._inputs.add(name)
        return name

    def add_output(self, name: str, dtype=np.float32, shape: Sequence | None = None) -> str:
        if shape is None:
            self.outputs.append(helper.make_tensor_value_info(name, onnx_dtype(dtype), None))
        else:
            self.outputs.append(TensorSpec(name, np.dtype(dtype), tuple(shape)).to_value_info())
        return name

    def add_initializer(self, name: str, array: np.ndarray) -> str:
        if name in self.initializers:
            raise OrtrainError(f"initializer {name!r} is defined twice")
        self.initializers[name] = numpy_helper.from_array(np.asarray(array), name)
        return name

    def const(self, value, dtype=np.float32, hint: str = "const") -> str:
        """A constant initializer holding ``value``."""
        return self.add_initializer(self.unique(hint), np.asarray(value, dtype=dtype))

    def op(self, op_type: str, inputs: Sequence[str], *, outputs: int | Sequence[str] = 1,
           domain: str = "", name: str | None = None, **attrs):
        """Append one node; returns its output name, or the list of names when there are several."""
        if isinstance(outputs, int):
            out_names = [self.unique(op_type.lower()) for _ in range(outputs)]
        else:
            out_names = list(outputs)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(op_type, list(inputs), out_names, name=name or self.unique(op_type),
                                domain=domain or None, **attrs)
        self.nodes.append(node)
        if domain:
            self.domains.add(domain)
        return out_names[0] if len(out_names) == 1 else out_names

    def to_model(self, doc: str = "", check: bool = True) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  list(self.initializers.values()))
        return finish_model(graph, extra_domains=self.domains, doc=doc, check=check)


def finish_model(graph: onnx.GraphProto, extra_domains=(), doc: str = "", check: bool = True,
                 opset: int = OPSET) -> onnx.ModelProto:
    """Wrap a graph with ortrain's opset/IR pins and producer fields, and check it."""
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, 1) for d in sorted(set(extra_domains)) if d]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ortrain", producer_version=__version__,
                              doc_string=doc)
    model.ir_version = IR_VERSION
    if check:
        check_model(model)
    return model


def check_model(model: onnx.ModelProto, what: str = "model") -> None:
    """``onnx.checker`` with ortrain's error type and a message that says which model failed."""
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as exc:
        raise OrtrainError(f"the {what} ortrain built is not valid ONNX: {exc}") from exc


class FreshNames:
    """Fresh tensor and node names that collide with nothing already in the graph."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.taken = {t.name for t in g.initializer} | {v.name for v in g.input} | {v.name for v in g.output}
        for n in g.node:
            self.taken.update(n.input)
            self.taken.update(n.output)
            self.taken.add(n.name)

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.taken:
            k += 1
            name = f"{hint}_{k}"
        self.taken.add(name)
        return name
