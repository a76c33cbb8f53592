"""The scalar arithmetic of a training graph folded into the nodes that need it.

onnxruntime-training's gradient builder writes the gradient of a mean as ``Size``, ``Scale`` and an
``Expand`` of the scaled scalar to the mean's input shape, and a square ``d * d`` as a ``Sum`` of two
equal products. On a small model every node costs the runtime a fraction of a microsecond (about
0.2-0.4 us here) whatever its size, so this arithmetic is much of a step: a tiny captured step's
gradient graph ran 14 nodes where 8 compute the same (9.9 us against 7.7 us a run, measured).
:func:`scalars_folded` rewrites it:

* equal nodes are one (``Shape`` nodes that return the same sizes too);
* ``Size`` and ``Shape`` of a value whose sizes onnx's inference fixes become constants;
* a node that computes from small constants alone becomes its constant (``Scale`` as the runtime's
  kernel computes it: by ``1.0f / scale`` in single precision);
* an ``Expand`` of a one-element value goes where what reads it (through ``Cast``, ``Neg`` or
  ``Identity``) is a broadcasting ``Mul``, ``Div``, ``Add`` or ``Sub`` whose other operand has the
  expanded shape, or another ``Expand`` to a shape that covers it: the broadcast does the expanding;
* an ``Identity``, and a product or quotient by a constant one, is its other operand;
* a ``Gemm`` operand ``c * t``, ``c`` a one-element constant, is ``t`` with ``c`` in ``alpha``, and
  an operand ``Sum(a, a)`` is ``a`` with 2 in ``alpha``;
* the nodes that are left unread go.

The values stay bit for bit, but for the moves into ``alpha``, which round in another order (as
another GEMM kernel would). Shapes come from onnx's inference from the graph's inputs and constants
alone, not from what it declares of other values (a declared -1 is a free size); sizes of one name
are one size wherever they appear, as ONNX reads a ``dim_param`` (ortrain checks that the arrays it
feeds agree). The rewrites run until none applies. They touch no node of another domain but
``Scale``, no node that holds a subgraph and no value a subgraph reads: the in-place accumulators
and optimizer kernels stay as they are.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.graph.builder import MS_DOMAIN
from ortrain.graph.passes import _fold, subgraph_reads, subgraphs
from ortrain.graph.shapes import _declared

__all__ = ["scalars_folded"]

_BROADCASTING = frozenset({"Mul", "Div", "Add", "Sub"})
_UNARY = frozenset({"Cast", "Neg", "Identity"})
_FOLDABLE = frozenset({"Cast", "Neg", "Identity", "Mul", "Div", "Add", "Sub", "Sum", "Scale", "Reshape",
                       "Unsqueeze", "Squeeze", "Concat"})
_PURE = _FOLDABLE | {"Size", "Shape", "Expand"}
_SMALL = 64  # elements a folded constant may have
# the types numpy computes as the runtime does (half floats and bfloat16 are left to the runtime)
_EXACT = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.bool_))


def scalars_folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the training graph ``model`` with its scalar arithmetic folded (see the module's
    docstring); ``model`` itself when nothing folds."""
    out = copy.deepcopy(model)
    folds = _Folds(out.graph, _inferred_shapes(out))
    changed = False
    for _ in range(4 * len(out.graph.node) + 4):  # each round removes a node or folds one away
        if not folds.round():
            break
        changed = True
    if not changed:
        return model
    folds.unread_dropped()
    return out


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list]:
    """Shapes by onnx's inference from the graph's inputs and constants alone (what the graph
    declares for values in between is not taken: an exporter's may be wrong); dimensions are
    ints, dimension names (str) or None."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    for output in bare.graph.output:  # the runtime only warns where an output's declared shape is wrong
        output.type.tensor_type.ClearField("shape")
    try:
        g = onnx.shape_inference.infer_shapes(bare).graph
    except Exception:  # noqa: BLE001 - a graph onnx cannot type: nothing is known
        g = bare.graph
    overridable = {i.name for i in g.input} & {t.name for t in g.initializer}  # a caller may feed another
    return {name: [None if type(d) is int and d < 0 else d for d in shape]  # -1: a free size, to the runtime
            for name, (shape, _) in _declared(g).items() if shape is not None and name not in overridable}


class _Folds:
    """The rewrites over one graph, changing it in place; ``shapes`` holds the inferred shapes of
    the values the rewrites leave as they were."""

    def __init__(self, graph: onnx.GraphProto, shapes: dict[str, list]):
        self.g, self.shapes = graph, shapes
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name for i in graph.input}
        self._holds_subgraphs = any(subgraphs(n) for n in graph.node)
        self._stale = True

    # what the graph holds now

    def _reads(self, node) -> list[str]:
        """What the subgraphs of ``node`` read from outside."""
        return subgraph_reads(node) if self._holds_subgraphs else []

    def _index(self) -> None:
        if not self._stale:
            return
        self._stale = False
        self.constants = {t.name: t for t in self.g.initializer if t.name not in self.inputs}  # an input overrides
        self.producer = {o: n for n in self.g.node for o in n.output if o}
        self.readers: dict[str, list] = {}
        for n in self.g.node:
            for name in dict.fromkeys([*n.input, *self._reads(n)]):
                if name:
                    self.readers.setdefault(name, []).append(n)
        self._one: dict[str, bool] = {}

    def _value(self, name: str) -> np.ndarray | None:
        t = self.constants.get(name)
        return numpy_helper.to_array(t) if t is not None else None

    def _only_reader(self, name: str):
        """The one node that reads ``name`` (None when another node, a subgraph or an output reads it)."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or name in self.outputs or name in self._reads(readers[0]):
            return None
        return readers[0]

    def _one_element(self, name: str) -> bool:
        """Whether ``name`` surely holds a single element."""
        if name not in self._one:
            self._one[name] = False  # a cycle (none in a valid graph) ends here
            const = self.constants.get(name)
            shape = list(const.dims) if const is not None else self.shapes.get(name)
            node = self.producer.get(name)
            self._one[name] = (shape is not None and all(d == 1 for d in shape)) or (
                node is not None and _plain(node) and (node.op_type == "Size" or (
                    node.op_type in _FOLDABLE - {"Reshape", "Concat", "Squeeze", "Unsqueeze"} and
                    all(self._one_element(i) for i in (node.input[:1] if node.op_type == "Scale" else node.input)))))
        return self._one[name]

    def _target(self, node) -> list | None:
        """The shape an ``Expand`` expands to, where known."""
        value = self._value(node.input[1])
        if value is not None:
            return [int(d) for d in value]
        source = self.producer.get(node.input[1])
        if source is not None and source.op_type == "Shape" and _plain(source):
            shape = self.shapes.get(source.input[0])
            return None if shape is None else shape[_shape_slice(source)]
        return None

    # the rewrites

    def round(self) -> bool:
        """Fold what folds at once (equal nodes, identities, sizes, constants), then make one rewrite
        that moves reads; whether anything changed. The graph's index is made afresh after each change."""
        changed = False
        for rewrite in (self._equal_merged, self._ones_dropped, self._sizes_known, self._constants_folded,
                        self._one_moved):
            self._index()
            if rewrite():
                changed = self._stale = True
        return changed

    def _one_moved(self) -> bool:
        return any(rewrite() for rewrite in (self._expand_dropped, self._factor_into_gemm))

    def _as_constant(self, node, value: np.ndarray) -> None:
        self.g.initializer.append(numpy_helper.from_array(np.asarray(value), node.output[0]))
        self.constants[node.output[0]] = self.g.initializer[-1]
        self.g.node.remove(node)

    def _renamed_away(self, same_as) -> bool:
        """Remove the plain nodes whose outputs ``same_as(node)`` names other values for (one name an
        output), in graph order so that the nodes after read those; not a node whose output the
        graph returns or a subgraph reads."""
        renamed = {}
        for node in list(self.g.node):
            if renamed:
                node.input[:] = [renamed.get(i, i) for i in node.input]
            same = same_as(node) if _plain(node) else None
            if same is None or any(o in self.outputs or any(o in self._reads(r) for r in self.readers.get(o, []))
                                   for o in node.output):
                continue
            renamed.update(zip(node.output, same))
            self.g.node.remove(node)
        return bool(renamed)

    def _equal_merged(self) -> bool:
        """Equal plain nodes (the same op, inputs and attributes, ``Mul(a, b)`` and ``Mul(b, a)``;
        ``Shape`` nodes that return the same sizes) as one: the builder writes the gradient of ``d * d``
        as two equal products."""
        seen = {}

        def earlier(node):
            if node.op_type not in _PURE:
                return None
            inputs = sorted(node.input) if node.op_type in ("Mul", "Add") else node.input  # both commute exactly
            key = self._shape_key(node) or (node.domain, node.op_type, tuple(inputs),
                                            tuple(sorted(a.SerializeToString() for a in node.attribute)))
            first = seen.setdefault(key, node)
            return None if first is node else list(first.output)
        return self._renamed_away(earlier)

    def _shape_key(self, node) -> tuple | None:
        """The sizes a ``Shape`` node returns, where every one is known or named: two that return the
        same (the batch size of two layers' gradients) are one."""
        if node.op_type != "Shape":
            return None
        shape = self.shapes.get(node.input[0])
        dims = None if shape is None else shape[_shape_slice(node)]
        return ("Shape", tuple(dims)) if dims is not None and None not in dims else None

    def _sizes_known(self) -> bool:
        changed = False
        for node in [n for n in self.g.node if n.op_type in ("Size", "Shape") and _plain(n)]:
            shape = self.shapes.get(node.input[0])
            if shape is None or not all(type(d) is int for d in shape) or node.output[0] in self.outputs:
                continue
            if node.op_type == "Size":
                self._as_constant(node, np.array(int(np.prod(shape)), np.int64))
            else:
                self._as_constant(node, np.array(shape[_shape_slice(node)], np.int64))
            changed = True
        return changed

    def _constants_folded(self) -> bool:
        changed = False
        for node in list(self.g.node):
            if node.op_type not in _FOLDABLE or not _plain(node) or len(node.output) != 1 or \
                    node.output[0] in self.outputs or not all(i in self.constants for i in node.input if i):
                continue
            values = [self._value(i) if i else None for i in node.input]
            if not values or any(v is not None and (v.size > _SMALL or v.dtype not in _EXACT) for v in values):
                continue
            try:
                value = _scaled(node, values) if node.op_type == "Scale" else _summed(values) \
                    if node.op_type == "Sum" else _fold(node, values)
            except Exception:  # noqa: BLE001 - a form the folder does not take stays a node
                continue
            value = None if value is None else np.asarray(value)
            if value is not None and value.size <= _SMALL and value.dtype in _EXACT:
                self._as_constant(node, value)
                changed = True
        return changed

    def _expand_dropped(self) -> bool:
        for node in [n for n in self.g.node if n.op_type == "Expand" and _plain(n)]:
            target = self._target(node)
            if target is None or None in target or not self._one_element(node.input[0]):
                continue
            chain, end = [], node.output[0]
            reader = self._only_reader(end)
            while reader is not None and reader.op_type in _UNARY and _plain(reader):
                chain.append(reader)
                end = reader.output[0]
                reader = self._only_reader(end)
            if reader is None or not _plain(reader) or not self._covers(reader, end, target):
                continue
            first = chain[0] if chain else reader
            first.input[list(first.input).index(node.output[0])] = node.input[0]
            for n in chain:  # one element now: what was known of their shapes no longer holds
                self.shapes.pop(n.output[0], None)
                _forget(self.g, n.output[0])
            self.g.node.remove(node)
            return True
        return False

    def _read_once_by(self, name: str, node) -> bool:
        """Whether ``node`` is what alone reads ``name``, and at one of its inputs only."""
        return self._only_reader(name) is node and list(node.input).count(name) == 1

    def _covers(self, reader, end: str, target: list) -> bool:
        """Whether ``reader``, which reads the expanded value as ``end``, gives the same without the
        expanding: the other operand of a broadcasting op has the expanded shape, or a later
        ``Expand`` goes to a shape the expanded one broadcasts to."""
        if reader.op_type in _BROADCASTING and len(reader.input) == 2 and list(reader.input).count(end) == 1:
            return self.shapes.get(reader.input[1 - list(reader.input).index(end)]) == target
        if reader.op_type == "Expand" and reader.input[0] == end:
            later = self._target(reader)
            return later is not None and len(later) == len(target) and all(
                a == 1 or (a is not None and a == b) for a, b in zip(target, later))
        return False

    def _ones_dropped(self) -> bool:
        """Every ``Identity``, ``Mul(x, 1)``, ``Mul(1, x)`` and ``Div(x, 1)`` gone, its readers reading
        ``x`` (a chain of them at once)."""
        def operand(node):
            if node.op_type == "Identity":
                return [node.input[0]]
            kept = _other_of_one(self, node) if node.op_type in ("Mul", "Div") else None
            return None if kept is None else [kept]
        return self._renamed_away(operand)

    def _factor_into_gemm(self) -> bool:
        for node in [n for n in self.g.node if n.op_type == "Gemm" and _plain(n)]:
            for k in (0, 1):
                producer = self.producer.get(node.input[k])
                split = _factored(self, producer)
                if split is None or not self._read_once_by(node.input[k], node):
                    continue
                operand, factor = split
                alpha = np.float32(next((a.f for a in node.attribute if a.name == "alpha"), 1.0)) * factor
                if not np.isfinite(alpha):
                    continue
                node.input[k] = operand
                _set_float(node, "alpha", float(alpha))
                self.g.node.remove(producer)
                return True
        return False

    # what is left

    def unread_dropped(self) -> None:
        """Drop the plain nodes nothing reads, then the constants nothing reads."""
        while True:
            self._index()
            dead = [n for n in self.g.node if n.op_type in _PURE and _plain(n) and
                    not any(o in self.readers or o in self.outputs for o in n.output if o)]
            if not dead:
                break
            for n in dead:
                self.g.node.remove(n)
                for o in n.output:
                    _forget(self.g, o)
        for t in [t for t in self.g.initializer if t.name not in self.readers and t.name not in self.outputs
                  and t.name not in self.inputs]:
            self.g.initializer.remove(t)


def _plain(node) -> bool:
    """A node of the standard domain (or the runtime's ``Scale``) that holds no subgraph."""
    return (node.domain in ("", "ai.onnx") or (node.domain == MS_DOMAIN and node.op_type == "Scale")) and \
        not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _shape_slice(node) -> slice:
    """The dimensions a ``Shape`` node returns (its ``start`` and ``end``, as Python slices them)."""
    attrs = {a.name: a.i for a in node.attribute}
    return slice(attrs.get("start", 0), attrs.get("end"))


def _scaled(node, values: list) -> np.ndarray:
    """onnxruntime's CPU ``Scale``: the input times its scale, or times ``1.0f / scale`` with
    ``scale_down``, the factor taken in single precision and cast to the input's type."""
    x, scale = values
    down = any(a.name == "scale_down" and a.i for a in node.attribute)
    factor = np.float32(scale.reshape(-1)[0])
    if factor == 0:
        raise ZeroDivisionError("the runtime refuses a scale of 0; left to it")
    if down:
        factor = np.float32(1) / factor
    return x * x.dtype.type(factor)


def _summed(values: list) -> np.ndarray:
    return functools.reduce(np.add, values)


def _factored(folds: _Folds, producer) -> tuple[str, np.float32] | None:
    """``(t, c)`` where ``producer`` computes ``c * t``, ``c`` a constant: ``Sum(t, t)`` (``c`` = 2),
    or ``Mul(t, c)`` or ``Mul(c, t)`` with ``c`` one float32 element (``t`` not a constant)."""
    if producer is None or not _plain(producer) or len(producer.input) != 2:
        return None
    if producer.op_type == "Sum" and producer.input[0] == producer.input[1]:
        return producer.input[0], np.float32(2)
    if producer.op_type != "Mul":
        return None
    for k in (0, 1):
        c, t = folds._value(producer.input[k]), producer.input[1 - k]
        if c is not None and c.size == 1 and c.ndim <= 1 and c.dtype == np.float32 and t not in folds.constants:
            return t, c.reshape(())
    return None


def _other_of_one(folds: _Folds, node) -> str | None:
    """The operand of ``Mul(x, 1)``, ``Mul(1, x)`` or ``Div(x, 1)`` whose value the node returns
    unchanged (the constant one no wider than ``x``)."""
    if len(node.input) != 2:
        return None
    for k in ((0, 1) if node.op_type == "Mul" else (1,)):
        one, x = folds._value(node.input[k]), node.input[1 - k]
        if one is None or one.size != 1 or one.reshape(-1)[0] != 1:
            continue
        shape = folds.shapes.get(x)
        if one.ndim == 0 or (shape is not None and len(shape) >= one.ndim):
            return x
    return None


def _forget(graph: onnx.GraphProto, name: str) -> None:
    for vi in [v for v in graph.value_info if v.name == name]:
        graph.value_info.remove(vi)


def _set_float(node, name: str, value: float) -> None:
    for a in node.attribute:
        if a.name == name:
            a.f = value
            return
    node.attribute.append(helper.make_attribute(name, value))
