"""The functional graph of layers: :class:`SymbolicTensor` (a value in the graph), the nodes
layer calls add (``_Node``), ``Input`` and the dependency order a model runs them in."""

from __future__ import annotations

import collections
import threading
import weakref
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

    def __getstate__(self) -> tuple:  # pickle protocols 0 and 1 take __slots__ only this way
        return self.layer, self.inputs, self.output

    def __setstate__(self, state) -> None:
        if len(state) == 2:  # pickled by ortrain 0.1.0 before __getstate__: (None, {slot: value})
            state = tuple(state[1][k] for k in self.__slots__)
        self.layer, self.inputs, self.output = state


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

    def __getstate__(self) -> dict:
        return ordered_state(self.__dict__, [self])  # see ordered_state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(unordered_state(state))


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


def tensors_in_order(tensors, layers=(), taken=frozenset(), nearest: int | None = None) -> list[SymbolicTensor]:
    """Every tensor that ``tensors`` and the first calls of ``layers`` lead to (through the layers'
    inputs and their first calls), each after those it is computed from, short of those whose id
    is in ``taken`` and what leads to them; with ``nearest``, only that many, the nearest ones."""
    def inputs_of(t):
        return [*t.node.inputs, *_first_call_tensors(t.node.layer)] if t.node and id(t) not in taken else ()
    roots = [*tensors, *(t for lyr in layers for t in _first_call_tensors(lyr))]
    if nearest is not None:  # breadth first from the roots
        near, queue = {}, collections.deque(roots)
        while queue and len(near) < nearest:
            t = queue.popleft()
            if id(t) not in near:
                near[id(t)] = t
                queue.extend(inputs_of(t))
        inputs_of_all = inputs_of

        def inputs_of(t):
            return [i for i in inputs_of_all(t) if id(i) in near]
    return [t for t in post_order(roots, inputs_of) if id(t) not in taken]


# A pickle or deep copy of a model, a layer or a tensor recursed through the chain of tensors and
# layers before it, and overflowed Python's stack from some 80 layers on. Their states list those
# tensors first, each after those it is computed from, so that the copy recurses one layer deep at
# a time; the tensors a copy in progress has listed are not listed again by the states inside it
# (which would cost the whole chain for each layer) until the mark at the end of the state that
# listed them is copied. A model lists all of its tensors; a layer or a tensor the nearest NEAREST
# (each of those lists the next ones in turn: one more level of recursion every NEAREST tensors,
# and a list of a deep model's layers copied in linear time).
NEAREST = 64
_ORDER, _END = "_tensors_in_order", "_end_of_tensors_in_order"
# In this thread, the ids of the tensors listed by states being copied, each to the (weak reference
# to the) mark that ends its listing. A copy that fails half-way never copies its marks: they are
# dropped with its states, and their entries with them, so no later copy finds them taken.
_listed = threading.local()


def _marks() -> dict:
    marks = getattr(_listed, "marks", None)
    if marks is None:
        marks = _listed.marks = {}
    return marks


def ordered_state(state: dict, tensors=(), layers=(), nearest: int | None = NEAREST) -> dict:
    """``state`` (an object's, for a copy) with the tensors ``tensors`` and ``layers`` lead to listed
    first (the ``nearest``, or all with None), and the mark that ends their listing last;
    :func:`unordered_state` takes both out."""
    marks = _marks()
    # All (a model's) are listed even where marked: a copy around this one that listed some has
    # copied them by then (each costs a reference), and a copy that failed while its exception is
    # kept (Python's REPL keeps the last one, Jupyter all) keeps its states and their marks alive
    order = tensors_in_order(tensors, layers, marks if nearest is not None else frozenset(), nearest)
    if not order:
        return state
    mark = _EndOfOrder()
    mark.listing(marks, frozenset(id(t) for t in order))
    return {_ORDER: order, **state, _END: mark}


def unordered_state(state: dict) -> dict:
    state = dict(state)
    state.pop(_ORDER, None)
    end = state.pop(_END, None)
    if end is not None:  # copy.copy hands the state over as it is: the mark was not copied
        end.end()
    return state


class _EndOfOrder:
    """Copied last of a state: the tensors its state listed may be listed again."""

    def __init__(self):
        self._end = None

    def listing(self, marks: dict, ids: frozenset) -> None:
        def end(_=None):
            for i in ids:
                if marks.get(i) is ref:  # not where a later state listed it again
                    del marks[i]
        ref = weakref.ref(self, end)
        for i in ids:
            marks[i] = ref
        self._end = end

    def end(self) -> None:
        if self._end is not None:
            self._end()

    def __reduce__(self):
        self.end()
        return _EndOfOrder, ()

    def __deepcopy__(self, memo):
        self.end()
        return _EndOfOrder()


def _topological(outputs: list[SymbolicTensor]) -> tuple[list[_Node], list[SymbolicTensor]]:
    """Nodes in dependency order and the input tensors reached."""
    tensors = post_order(outputs, lambda t: t.node.inputs if t.node is not None else ())
    return [t.node for t in tensors if t.node is not None], [t for t in tensors if t.node is None]
