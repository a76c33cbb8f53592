"""A model whose forward graph is fixed ONNX (from ``from_onnx``, traced functions or artifacts)."""

from __future__ import annotations

import numpy as np

from ortrain._arrays import run_chunks
from ortrain._keywords import name_unknown_arguments, names_unknown_arguments_of_methods
from ortrain.errors import OrtrainError
from ortrain.graph import TensorSpec, spec_of
from ortrain.graph.forward import ForwardGraph, ParamSpec
from ortrain.graph.shapes import output_shape_at
from ortrain.nn.base_layer import WEIGHTS_LOCK, sync_live
from ortrain.nn.base_model import Model, check_print_fn


class GraphModel(Model):
    """Everything a :class:`Model` offers, over a given forward graph.

    ``forward`` holds the graph with parameters as graph inputs; ``weights`` their values.
    """

    def __init__(self, forward: ForwardGraph, name: str = "onnx_model"):
        self._init_state(name)
        self._proto = forward.proto
        self._params = tuple(forward.params)
        self._weights = {p.name: np.ascontiguousarray(forward.weights[p.name]) for p in self._params}
        self.layers = []
        self._nodes = []
        self._bounds = None
        self._edits: set[str] = set()  # the edit log (see Model._take_edits)
        self._output_shapes: dict[tuple, tuple | None] = {}  # by input sizes after the batch
        listed = {vi.name for vi in self._proto.graph.input}
        missing = [p.name for p in self._params if p.name not in listed]
        if missing:
            raise OrtrainError(f"parameters {missing} are not graph inputs of the forward graph")

    def _base_params(self) -> list[ParamSpec]:
        return list(self._params)

    def _weight_table(self) -> dict[str, np.ndarray]:
        sync_live(self)
        with WEIGHTS_LOCK:
            return dict(self._weights)

    def _store_weights(self, staged) -> None:
        for name, value in staged:
            if name not in self._weights:
                raise KeyError(name)
            self._weights[name] = value
            self._edits.add(name)

    def _take_edits(self) -> set[str]:
        edits, self._edits = self._edits, set()
        return edits

    def _keep_edits(self, names: set[str]) -> None:
        self._edits |= names

    def _edits_pending(self) -> bool:
        return bool(self._edits)

    def _base_proto(self):
        return self._proto

    @property
    def input_specs(self) -> list[TensorSpec]:
        pnames = {p.name for p in self._params}
        return [spec_of(vi) for vi in self._proto.graph.input if vi.name not in pnames]

    @property
    def output_specs(self) -> list[TensorSpec]:
        return [spec_of(vi) for vi in self._proto.graph.output]

    def _output_shape_for(self, input_shapes) -> tuple | None:
        """The first output's shape for inputs of ``input_shapes``, by onnx's shape inference at those
        sizes (the batch size left free), found once for each set of sizes: an output as wide as a free
        input dimension (a class count only the input fixes) then has a width, and class labels are
        checked against it. Where onnx cannot infer a dimension after the batch (a recurrent
        layer's length, written through computed shapes), the runtime's predictions for one and
        for two rows of zeros at those sizes tell it, where they agree (an output sized by the
        batch, ``x @ x.T``, stays unknown). None where neither can."""
        key = tuple(tuple(int(d) for d in s[1:]) for s in input_shapes)
        if key not in self._output_shapes:
            self._output_shapes[key] = self._infer_output_shape(key)
        return self._output_shapes[key]

    def _infer_output_shape(self, sizes) -> tuple | None:
        shape = output_shape_at(self._proto, {p.name for p in self._params}, sizes)
        if shape is not None and all(isinstance(d, int) for d in shape[1:]):
            return shape
        found = set()
        for rows in (1, 2):
            try:
                zeros = [np.zeros((rows, *dims), s.dtype) for s, dims in zip(self.input_specs, sizes, strict=True)]
                found.add(run_chunks(self._runner("predict"), self.input_specs, zeros, None, None)[0].shape[1:])
            except Exception:  # onnxruntime has the last word at the step
                return shape
        return (None, *found.pop()) if len(found) == 1 else shape

    def index_bounds(self) -> dict[str, tuple[int, int, str]]:
        """Inputs that index a weight's rows straight away (``Gather`` on axis 0): ONNX allows
        ``[-rows, rows - 1]``, negative ones counting from the end. Found once: the graph and the
        weights' shapes never change."""
        if self._bounds is None:
            self._bounds = self._find_index_bounds()
        return self._bounds

    def _find_index_bounds(self) -> dict[str, tuple[int, int, str]]:
        rows = {p.name: p.shape[0] for p in self._params if p.shape}
        inputs = {s.name for s in self.input_specs}
        bounds: dict[str, tuple[int, int, str]] = {}
        for n in self._proto.graph.node:
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            if n.op_type == "Gather" and axis == 0 and len(n.input) == 2 and n.input[0] in rows \
                    and n.input[1] in inputs:
                k = rows[n.input[0]]
                if n.input[1] not in bounds or k - 1 < bounds[n.input[1]][1]:
                    bounds[n.input[1]] = (-k, k - 1, f"Gather node {n.name or n.output[0]!r}")
        return bounds

    def summary(self, print_fn=print) -> None:
        check_print_fn(print_fn)
        ops: dict[str, int] = {}
        for n in self._proto.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        print_fn(f"{self.name}: {len(self._proto.graph.node)} nodes "
                 f"({', '.join(f'{k} x{v}' for k, v in sorted(ops.items()))})")
        for s in self.input_specs:
            print_fn(f"  input  {s.name}: {s.shape} {np.dtype(s.dtype).name}")
        for s in self.output_specs:
            print_fn(f"  output {s.name}: {s.shape} {np.dtype(s.dtype).name}")
        print_fn(self._param_totals())


name_unknown_arguments(GraphModel)
names_unknown_arguments_of_methods(GraphModel, "index_bounds", "summary")
