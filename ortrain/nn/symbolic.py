"""The functional graph of layers: :class:`SymbolicTensor` (a value in the graph), the nodes
layer calls add (``_Node``), ``Input`` and the dependency order a model runs them in."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ortrain._arrays import is_integer
from ortrain._dag import post_order
from ortrain._keywords import names_unknown_arguments_of
from ortrain.errors import OrtrainError, describe_shape

if TYPE_CHECKING:
    from ortrain.nn.base_layer import Layer

__all__ = ["Input", "SymbolicTensor"]


class _Node:
    __slots__ = ("layer", "inputs", "output")

    def __init__(self, layer, inputs, output):
        self.layer, self.inputs, self.output = layer, inputs, output


class SymbolicTensor:
    """A placeholder for a value in a functional model: shape (batch first, ``None`` = free) and dtype."""

    def __init__(self, shape: tuple, dtype, node: _Node | None = None, name: str | None = None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.node = node
        self.name = name

    @classmethod
    def from_layer(cls, layer: Layer, tensors: list[SymbolicTensor]) -> SymbolicTensor:
        for t in tensors:
            if t.dtype != layer.input_dtype:
                raise OrtrainError(f"{type(layer).__name__} takes {layer.input_dtype.name} inputs, received "
                                   f"{t.dtype.name}" + ("; give ot.Input(..., dtype='int64') for indices"
                                                         if layer.input_dtype.kind == "i" else ""))
        shapes = [t.shape for t in tensors]
        layer.build(shapes)
        out = cls(layer.output_shape(shapes), np.float32)
        out.node = _Node(layer, list(tensors), out)
        return out

    def __repr__(self) -> str:
        return f"SymbolicTensor(shape={describe_shape(self.shape)}, dtype={self.dtype.name})"


@names_unknown_arguments_of
def Input(shape, dtype="float32", name: str | None = None) -> SymbolicTensor:  # noqa: N802 - Keras' name
    """A model input of per-sample ``shape`` (the batch dimension is added in front)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise OrtrainError(f"Input(shape=...): expected a tuple of positive ints (None for a free size), received "
                           f"{shape!r}")
    if any(not (d is None or (is_integer(d) and d > 0)) for d in shape):
        raise OrtrainError(f"Input(shape=...): expected positive ints (None for a free size), received {shape!r}")
    shape = tuple(None if d is None else int(d) for d in shape)  # numpy ints reach onnx and JSON as ints
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.int64)):
        fix = ""
        if dt is not None and dt.kind in "iub":
            fix = "; declare integer inputs (token ids for an Embedding) as 'int64': data of other integer types is cast"
        elif dt is not None and dt.kind == "f":
            fix = "; declare float inputs as 'float32': data of other float types is cast"
        raise OrtrainError(f"Input(dtype=...): expected 'float32' or 'int64', received {dtype!r}{fix}")
    if name is not None and (not isinstance(name, str) or not name):
        raise OrtrainError(f"Input(name=...): expected a non-empty string, received {name!r}")
    return SymbolicTensor((None,) + shape, dt, name=name)


def _first_call_tensors(layer) -> list[SymbolicTensor]:
    called = layer.__dict__.get("_first_call")
    if called is None:
        return []
    inputs, output = called
    return [*(inputs if isinstance(inputs, list) else [inputs]), output]


def tensors_in_order(tensors, layers=()) -> list[SymbolicTensor]:
    """Every tensor that ``tensors`` and the first calls of ``layers`` lead to (through the layers'
    inputs and their first calls), each after those it is computed from. A pickle or deep copy
    that takes them in this order first recurses one layer deep at a time; through the chain of
    a deep model's tensors, it overflowed Python's stack from some 80 layers on."""
    roots = [*tensors, *(t for lyr in layers for t in _first_call_tensors(lyr))]
    return post_order(roots, lambda t: [*t.node.inputs, *_first_call_tensors(t.node.layer)] if t.node else ())


def _topological(outputs: list[SymbolicTensor]) -> tuple[list[_Node], list[SymbolicTensor]]:
    """Nodes in dependency order and the input tensors reached."""
    tensors = post_order(outputs, lambda t: t.node.inputs if t.node is not None else ())
    return [t.node for t in tensors if t.node is not None], [t for t in tensors if t.node is None]
