"""What the graph rewrites know of a model's values: their shapes and element types
(:class:`Shapes`, also read by :mod:`ortrain.graph.repairs`), and the facts the gradient forms
test (``_Graph``: which values are computed, read or constant; ``_where`` names a node in
their errors).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.graph.builder import OPSET
from ortrain.graph.passes import inferred_shapes, int64_constants, node_inputs

__all__ = ["Shapes", "output_shape_at"]


class Shapes:
    """Shapes and element types of a graph's values, by what it declares or else onnx's inference
    (``None`` where neither knows; unknown dimensions are ``None``)."""

    def __init__(self, model: onnx.ModelProto):
        self._model = model
        self._declared, self._inferred = None, None

    def _info(self, name: str):
        if self._declared is None:
            self._declared = _declared(self._model.graph)
        found = self._declared.get(name)  # what the graph says; onnx's inference only for the rest
        if found is None or found[0] is None or None in found[0]:  # nothing declared, no shape, or a part
            if self._inferred is None:
                self._inferred = _inferred(self._model) or self._declared
            inferred = self._inferred.get(name)
            if found is None:
                found = inferred
            elif inferred is not None and inferred[0] is not None:
                if found[0] is None or len(found[0]) != len(inferred[0]):
                    found = (inferred[0], found[1] or inferred[1])
                else:  # the dimensions a declaration leaves unknown (an exporter's, after a computed resize)
                    found = ([d if d is not None else i for d, i in zip(found[0], inferred[0])], found[1] or inferred[1])
        return found or (None, 0)

    def shape(self, name: str) -> list | None:
        """Dimensions: ints, symbolic names (str) or None (unknown); None when the rank is unknown."""
        return self._info(name)[0]

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def sizes(self, name: str) -> list[int] | None:
        """The shape when every dimension is a known int, else None."""
        shape = self.shape(name)
        return shape if shape is not None and all(type(d) is int for d in shape) else None

    def same(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` surely have one shape: equal, every dimension known or named alike."""
        sa = self.shape(a)
        return sa is not None and None not in sa and sa == self.shape(b)

    def elem_type(self, name: str) -> int:
        return self._info(name)[1]


def _inferred(model: onnx.ModelProto) -> dict | None:
    """What onnx's inference finds of ``model``'s values (:func:`_declared`'s table, see
    :func:`~ortrain.graph.passes.inferred_shapes`); None where it does not run."""
    inferred = inferred_shapes(model)
    return _declared(inferred.graph) if inferred is not None else None


def _declared(g) -> dict[str, tuple[list | None, int]]:
    """``{name: (shape, element type)}`` for what graph ``g`` declares (a shape of ints, the names of
    symbolic dimensions and ``None`` for unknown ones; or ``None`` without one); an initializer
    first, then the first declaration among inputs, value_info and outputs."""
    table = {t.name: (list(t.dims), t.data_type) for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.name in table or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] \
            if tt.HasField("shape") else None
        table[vi.name] = (shape, tt.elem_type)
    return table


class _Graph:
    """What the tests and rewrites need to know of the whole graph. ``run``, where given, runs a
    small model in onnxruntime (``run(model, feeds) -> outputs``): the forms that must reproduce
    the runtime's own arithmetic of an op read it off the runtime."""

    def __init__(self, model: onnx.ModelProto, run=None):
        self.run = run
        self._propagated = None
        g = model.graph
        self.shapes = Shapes(model)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
        self.consumed = {i for n in g.node for i in node_inputs(n)} | {o.name for o in g.output}
        # values a node computes from the graph's inputs (the weights are inputs here), not constants;
        # a shape is a constant here too, as no gradient flows through it: the dynamo exporter writes
        # LayerNorm(elementwise_affine=False)'s scale as Expand(1, Shape(x))
        constant = {t.name for t in g.initializer}
        for n in g.node:
            if n.op_type in ("Constant", "ConstantOfShape", "Shape", "Size") or \
                    (n.input and all(i in constant for i in n.input if i)):
                constant.update(n.output)
        self.computed = ({o for n in g.node for o in n.output} | {i.name for i in g.input}) - constant
        self.norm_reads = collections.Counter(v for n in g.node if n.op_type == "LayerNormalization"
                                              for v in n.input[1:3] if v)
        self.consts = int64_constants(model)
        self.model = model

    def constant(self, name: str):
        """The value of ``name`` where the graph fixes it: see :func:`folded_value`."""
        return folded_value(self.model, name)

    def propagated_shape(self, name: str) -> list | None:
        """``name``'s shape, with the dimensions onnx's inference finds once it also propagates
        values (a ``Reshape`` to ``Shape(x)``, as torch exports ``GroupNorm``, keeps the sizes it
        otherwise loses) put in where the plain shape leaves them unknown."""
        shape = self.shapes.shape(name)
        if shape is not None and all(type(d) is int for d in shape):
            return shape
        if self._propagated is None:
            try:
                self._propagated = _declared(onnx.shape_inference.infer_shapes(self.model, data_prop=True).graph)
            except Exception:  # what the plain inference found stands
                self._propagated = {}
        found = self._propagated.get(name, (None, 0))[0]
        if found is None or (shape is not None and len(found) != len(shape)):
            return shape
        if shape is None:
            return found
        return [d if type(d) is int or type(f) is not int else f for d, f in zip(shape, found)]

    def floating(self, name: str) -> bool:
        """Whether ``name`` may hold floats (its element type is a float one, or not known): only
        such values carry a gradient, and the forms that stand for ops without one are written for
        them (onnxruntime lacks kernels the forms use, TopK of uint8 say, for other types)."""
        return self.shapes.elem_type(name) in (0, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                               onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)

    def smaller(self, value: str, out: str) -> bool:
        """A value a gradient reaches that may be broadcast to ``out``'s shape."""
        return value in self.computed and not self.shapes.same(value, out)


# ops whose value is not fixed by the graph's constants alone
# A Shape or Size is folded where what it reads is (a weight's, or a constant's: a TorchScript export
# without constant folding reads them); of a graph input it is not, as the walk ends there.
_UNFOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                       "Bernoulli", "Multinomial", "Dropout", "Loop", "If", "Scan"})


def folded_value(model: onnx.ModelProto, name: str, initializers: dict | None = None,
                 producers: dict | None = None):
    """The value of ``name`` where ``model`` fixes it: an initializer, a ``Constant`` node, or a few
    nodes computing it from those alone (torch exports a resize's scales unfolded as a ``Concat`` of
    constants, an ``expand(n, -1)``'s shape as a ``Where`` of constants), by onnx's reference
    evaluator. None otherwise. ``initializers`` and ``producers`` (by name) save rebuilding them."""
    g = model.graph
    if initializers is None:
        initializers = {t.name: t for t in g.initializer}
    if producers is None:
        producers = {o: n for n in g.node for o in n.output}
    needed, stack = [], [name]
    while stack:
        value = stack.pop()
        if not value or value in initializers or value in {n.output[0] for n in needed}:
            continue
        node = producers.get(value)
        if node is None or node.op_type in _UNFOLDED or len(needed) >= 32 or node.domain not in ("", "ai.onnx"):
            return None
        needed.append(node)
        stack.extend(node_inputs(node))
    if name in initializers:
        return numpy_helper.to_array(initializers[name])
    if len(needed) == 1 and needed[0].op_type == "Constant":
        a = needed[0].attribute[0]
        value = helper.get_attribute_value(a)
        return numpy_helper.to_array(value) if a.name == "value" else np.asarray(value)
    from onnx.reference import ReferenceEvaluator

    reads = {i for n in needed for i in node_inputs(n)}
    position = {id(n): i for i, n in enumerate(g.node)}  # the graph's order is a topological one
    needed.sort(key=lambda n: position[id(n)])
    sub = helper.make_graph(needed, "fold", [], [helper.make_value_info(name, onnx.TypeProto())],
                            [initializers[i] for i in reads if i in initializers])
    try:
        probe = helper.make_model(sub, opset_imports=list(model.opset_import))
        return np.asarray(ReferenceEvaluator(probe).run(None, {})[0])
    except Exception:  # what the reference evaluator cannot fold is not a constant here
        return None


def _where(node, i: int) -> str:
    return f"{node.op_type} node {node.name or i!r}"


def output_shape_at(proto: onnx.ModelProto, params, sizes) -> tuple | None:
    """The first output's shape when the data inputs (those not named in ``params``) have the
    dimensions ``sizes`` after their batch axis, by onnx's shape inference (the batch left free);
    None where onnx cannot infer it."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    del probe.graph.value_info[:]
    data = [vi for vi in probe.graph.input if vi.name not in params]
    for vi, dims in zip(data, sizes):
        shape = vi.type.tensor_type.shape
        if len(shape.dim) != len(dims) + 1:
            return None
        for d, size in zip(shape.dim[1:], dims):
            d.Clear()
            d.dim_value = size
    try:
        out = onnx.shape_inference.infer_shapes(probe, data_prop=True).graph.output[0]
    except Exception:  # what the graph declares stands; onnxruntime has the last word
        return None
    if not out.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim)
