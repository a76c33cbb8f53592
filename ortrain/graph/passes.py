"""Pure graph rewrites: of forward graphs before the gradient builder sees them, and of the training
graphs it writes. Each returns a new model (or the same one when there is nothing to rewrite) and
leaves its input alone."""

from __future__ import annotations

import collections
import copy
import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import OrtrainError, UnsupportedOpError
from ortrain.graph.builder import OPSET


def freeze_batchnorm_stats(model: onnx.ModelProto, running_means: set[str]) -> onnx.ModelProto:
    """Write out the BatchNormalization nodes whose running mean is in ``running_means`` in inference form.

    ``(x - mean) * gamma / sqrt(var + eps) + beta`` in plain ops normalises by the running
    statistics in training steps too (onnxruntime-training turns every BatchNormalization
    node into a batch-statistics node), and leaves the statistics unchanged.
    """
    if not running_means:
        return model
    inferred = onnx.shape_inference.infer_shapes(model)
    counter = itertools.count()

    def frozen(node) -> bool:
        return node.op_type == "BatchNormalization" and len(node.input) >= 5 and node.input[3] in running_means

    def plain_ops(_, node):
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        x, gamma, beta, mean, var = node.input[:5]
        shape = _shape_of(inferred, x)
        if shape is None:
            raise OrtrainError(f"BatchNormalization node {node.name!r}: the rank of its input is unknown, so its "
                               "statistics cannot be frozen; give the model's inputs a rank")
        rank = len(shape)
        p = f"{node.name or 'bn'}/frozen_{next(counter)}/"
        nodes, inits = [], []
        params = [gamma, beta, mean, var]
        if rank > 2:
            axes = p + "axes"
            inits.append(numpy_helper.from_array(np.arange(1, rank - 1, dtype=np.int64), axes))
            params = []
            for i, n in enumerate((gamma, beta, mean, var)):
                nodes.append(helper.make_node("Unsqueeze", [n, axes], [f"{p}u{i}"], name=f"{p}Unsqueeze_{i}"))
                params.append(f"{p}u{i}")
        g, b, m, v = params
        inits.append(numpy_helper.from_array(np.array(eps, np.float32), p + "eps"))
        nodes += [
            helper.make_node("Add", [v, p + "eps"], [p + "var_eps"], name=p + "Add_eps"),
            helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "Sqrt"),
            helper.make_node("Div", [g, p + "std"], [p + "scale"], name=p + "Div"),
            helper.make_node("Sub", [x, m], [p + "centered"], name=p + "Sub"),
            helper.make_node("Mul", [p + "centered", p + "scale"], [p + "scaled"], name=p + "Mul"),
            helper.make_node("Add", [p + "scaled", b], [node.output[0]], name=p + "Add"),
        ]
        return nodes, inits

    return _replace_nodes(model, frozen, plain_ops)


def batchnorm_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """BatchNormalization nodes in graph order (their inputs 3 and 4 are the running statistics)."""
    return [n for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) >= 5]


def with_extra_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The same graph also returning the intermediate values ``names``."""
    out = copy.deepcopy(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    return out


def _shape_of(inferred: onnx.ModelProto, name: str) -> list | None:
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    return None


def attribute(node: onnx.NodeProto, name: str, default):
    """The value of ``node``'s attribute ``name`` (strings as bytes), or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def text_attribute(node: onnx.NodeProto, name: str, default: str) -> str:
    """A string attribute of ``node`` as text (``auto_pad``, ``mode``, ``direction``), or ``default``."""
    value = attribute(node, name, default)
    return value.decode() if isinstance(value, bytes) else value


SAME = ("SAME_UPPER", "SAME_LOWER")


def _pool_geometry(node, size: int, axis: int, kernel: int, stride: int, pads: list[int]):
    """Output length, end padding actually covered, and the divisor of every window on one axis.

    Follows onnxruntime 1.19.2's AveragePool: ``ceil_mode`` adds a last window that may run past
    the padded input, and keeps it even where it holds no cell of the input (PyTorch, and
    later ONNX specifications, drop such a window; onnxruntime reads past the input for it,
    the rewrite gives 0); ``count_include_pad=0`` divides by the real cells in a window, ``1``
    by the full kernel size, whatever part of the window lies beyond the padding.
    """
    begin, end = pads[axis], pads[axis + 2]
    span = size + begin + end - kernel
    out = (-(-span // stride) if attribute(node, "ceil_mode", 0) else span // stride) + 1
    covered_end = max(end, (out - 1) * stride + kernel - size - begin)
    if attribute(node, "count_include_pad", 0):
        return out, covered_end, np.full(out, kernel, np.float32)
    counts = [min(o * stride - begin + kernel, size) - max(o * stride - begin, 0) for o in range(out)]
    return out, covered_end, np.array(counts, np.float32)


def _explicit_pads(node, shape: list) -> list[int]:
    auto = text_attribute(node, "auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(attribute(node, "pads", [0, 0, 0, 0]))
    if auto == "VALID":
        return [0, 0, 0, 0]
    kernel, strides = list(attribute(node, "kernel_shape", [])), list(attribute(node, "strides", [1, 1]))
    return _same_pads(auto, shape[2:], kernel, strides)


def _replace_nodes(model: onnx.ModelProto, match, expand, constants=()) -> onnx.ModelProto:
    """A copy of ``model`` in which every node ``match(node)`` picks is replaced by the nodes
    ``expand(i, node)`` returns with the initializers they need (``(nodes, initializers)``);
    ``constants`` are initializers shared by all replacements. ``model`` itself when nothing matches."""
    if not any(match(n) for n in model.graph.node):
        return model
    out = copy.deepcopy(model)
    out.graph.initializer.extend(constants)
    nodes = []
    for i, node in enumerate(out.graph.node):
        if not match(node):
            nodes.append(node)
            continue
        new_nodes, initializers = expand(i, node)
        nodes += new_nodes
        out.graph.initializer.extend(initializers)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def average_pool_as_conv(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite 1-D and 2-D AveragePool nodes as a depthwise Conv with constant weights.

    onnxruntime-training 1.19.2's CPU ``AveragePoolGrad`` sizes its output from the
    shapes stored in the graph, so with a free batch dimension it writes an empty
    gradient and the process dies with SIGFPE. A depthwise convolution with weights
    ``1/(kh*kw)``, rescaled where a window holds fewer cells (borders, ``ceil_mode``),
    computes the same average and has a working gradient (a 1-D pool is the 2-D one over a
    height of 1). Only the training and eval graphs get this form; exported models keep
    AveragePool. A pool this rewrite cannot express (3-D, or sizes unknown) is refused rather
    than left to crash the process.
    """
    def is_pool(n) -> bool:
        return n.op_type == "AveragePool"

    if not any(is_pool(n) for n in model.graph.node):
        return model
    inferred = onnx.shape_inference.infer_shapes(model)

    def as_conv(i, node):
        shape = _shape_of(inferred, node.input[0])
        if any(d != 1 for d in attribute(node, "dilations", [])):
            raise UnsupportedOpError(
                f"AveragePool node {node.name or i!r} has dilations {list(attribute(node, 'dilations', []))}; "
                "ortrain trains average pools without dilation (onnxruntime-training's own AveragePool gradient "
                "crashes with a free batch size). Freeze the weights before it or replace the pool")
        if len(attribute(node, "kernel_shape", [])) == 1:
            if shape is None or len(shape) != 3 or any(d is None for d in shape[1:]):
                raise UnsupportedOpError(
                    f"AveragePool node {node.name or i!r}: ortrain trains 1-D average pools whose channels and "
                    f"length are known (input shape {shape}); onnxruntime-training's own AveragePool gradient "
                    "crashes with a free batch size. Give the model a static length or replace the pool")
            return _pool_1d_as_2d(i, node, shape)
        return _pool_2d_as_conv(i, node, shape)

    return _replace_nodes(model, is_pool, as_conv)


def _pool_2d_as_conv(i: int, node, shape: list | None):
    kernel = list(attribute(node, "kernel_shape", []))
    if len(kernel) != 2:
        raise UnsupportedOpError(
            f"AveragePool node {node.name or i!r}: ortrain trains 1-D and 2-D average pools, this one is "
            f"{len(kernel)}-D (kernel {kernel}); onnxruntime-training's own AveragePool gradient crashes with "
            "a free batch size. Freeze the weights before it or replace the pool")
    if shape is None or len(shape) != 4 or any(d is None for d in shape[1:]):
        raise UnsupportedOpError(
            f"AveragePool node {node.name or i!r}: ortrain trains 2-D average pools whose channels, height "
            f"and width are known (input shape {shape}); onnxruntime-training's own AveragePool gradient "
            "crashes with a free batch size. Give the model static image sizes or replace the pool")
    c, h, w = shape[1:]
    strides = list(attribute(node, "strides", [1, 1]))
    pads = _explicit_pads(node, shape)
    kh, kw = kernel
    ho, end_h, rows = _pool_geometry(node, h, 0, kh, strides[0], pads)
    wo, end_w, cols = _pool_geometry(node, w, 1, kw, strides[1], pads)
    conv_pads = [pads[0], pads[1], end_h, end_w]
    p = f"{node.name or 'AveragePool'}/as_conv_{i}/"
    weight = np.full((c, 1, kh, kw), 1.0 / (kh * kw), np.float32)
    inits = [numpy_helper.from_array(weight, p + "weight")]
    counts = np.outer(rows, cols)
    # A window with no cell of the input averages to 0 (onnxruntime reads past the input there).
    scale = np.divide(kh * kw, counts, out=np.zeros_like(counts), where=counts > 0)
    exact = np.all(scale == 1.0)
    conv_out = node.output[0] if exact else p + "sum"
    nodes = [helper.make_node("Conv", [node.input[0], p + "weight"], [conv_out], name=p + "Conv",
                              group=c, kernel_shape=kernel, strides=strides, pads=conv_pads)]
    if not exact:
        inits.append(numpy_helper.from_array(scale.reshape(1, 1, ho, wo).astype(np.float32), p + "scale"))
        nodes.append(helper.make_node("Mul", [conv_out, p + "scale"], [node.output[0]], name=p + "Mul"))
    return nodes, inits


def _pool_1d_as_2d(i: int, node, shape: list):
    """A 1-D ``AveragePool`` over ``(n, c, l)`` as the 2-D one over ``(n, c, 1, l)``, between an
    ``Unsqueeze`` and a ``Squeeze`` of axis 2."""
    p = f"{node.name or 'AveragePool'}/as_2d_{i}/"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["kernel_shape"] = [1, *attrs["kernel_shape"]]
    attrs["strides"] = [1, *attrs.get("strides", [1])]
    if "pads" in attrs:
        attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    attrs.pop("dilations", None)  # all 1: as_conv refuses others
    pool = helper.make_node("AveragePool", [p + "rows"], [p + "pooled"], name=p + "AveragePool", **attrs)
    conv_nodes, inits = _pool_2d_as_conv(i, pool, [shape[0], shape[1], 1, shape[2]])
    nodes = [helper.make_node("Unsqueeze", [node.input[0], p + "axis"], [p + "rows"], name=p + "Unsqueeze"),
             *conv_nodes,
             helper.make_node("Squeeze", [p + "pooled", p + "axis"], [node.output[0]], name=p + "Squeeze")]
    return nodes, [numpy_helper.from_array(np.array([2], np.int64), p + "axis"), *inits]


BATCH_DIM = "batch"


def name_batch_dimension(model: onnx.ModelProto) -> onnx.ModelProto:
    """Name the free leading dimension of every graph input ``batch``.

    Axis 0 of every data input of an ortrain step is the batch (the inputs, the label and the
    sample weights hold the same rows; the Trainer checks it), so the name states what is already
    true. With it, shape inference carries one symbol through the graph, and onnxruntime-training's
    gradient builder can see that two operands of an elementwise op have the same shape: it then
    emits the gradient alone, without the run-time broadcast reduction (``Shape``,
    ``BroadcastGradientArgs``, ``ReduceSum``, ``Reshape``) it adds when it cannot tell; that
    ``ReduceSum`` copies the whole gradient.
    """
    free = [vi for vi in model.graph.input
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.shape.dim
            and not vi.type.tensor_type.shape.dim[0].HasField("dim_value")
            and not vi.type.tensor_type.shape.dim[0].dim_param]
    if not free:
        return model
    out = copy.deepcopy(model)
    names = {vi.name for vi in free}
    for vi in out.graph.input:
        if vi.name in names:
            vi.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    return out


def _matmul_as_matrix(node, i: int, p: str, ra: int | None, rb: int | None):
    """A ``MatMul`` with a 1-D operand as the matrix product of that operand made a column (the
    second) or a row (the first), reshaped back: onnxruntime-training 1.19.2's ``MatMul`` gradient
    is wrong for a 1-D operand (``x @ w`` with ``w`` of shape ``(k,)`` trained 0.1 off PyTorch's
    weights after one SGD step), while ``x @ w.reshape(k, 1)`` trains exactly. A 1-D operand
    beside one of unknown rank is refused."""
    a, b = node.input
    if ra is None or rb is None:
        raise UnsupportedOpError(
            f"MatMul node {node.name or i!r} multiplies a 1-D operand with one whose rank is not known "
            f"(ranks {ra} and {rb}); onnxruntime-training's MatMul gradient is wrong for 1-D operands and "
            "ortrain cannot rewrite it without the rank. Export with known ranks (e.g. Squeeze with axes) or "
            "reshape the 1-D operand into a matrix")
    nodes, inits = [], []
    if ra == 1:
        inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), p + "row_shape"))
        nodes.append(helper.make_node("Reshape", [a, p + "row_shape"], [p + "row"], name=p + "Row"))
        a = p + "row"
    if rb == 1:
        inits.append(numpy_helper.from_array(np.array([-1, 1], np.int64), p + "column_shape"))
        nodes.append(helper.make_node("Reshape", [b, p + "column_shape"], [p + "column"], name=p + "Column"))
        b = p + "column"
    # Drop the dimension the row or column added (a 0 in Reshape's shape keeps that dimension of
    # its input, so batch dimensions of any size pass): (..., m, 1) -> (..., m), (..., 1, n) ->
    # (..., n), (1, 1) -> ().
    if ra == 1 and rb == 1:
        keep = []
    elif rb == 1:
        keep = [0] * (ra - 1)
    else:
        keep = [0] * (rb - 2) + [-1]
    inits.append(numpy_helper.from_array(np.array(keep, np.int64), p + "out_shape"))
    nodes += [helper.make_node("MatMul", [a, b], [p + "product"], name=p + "MatMul"),
              helper.make_node("Reshape", [p + "product", p + "out_shape"], [node.output[0]], name=p + "Out")]
    return nodes, inits


class Shapes:
    """Shapes and element types of a graph's values, by what it declares or else onnx's inference
    (``None`` where neither knows; unknown dimensions are ``None``)."""

    def __init__(self, model: onnx.ModelProto):
        self._model, self._inferred = model, None

    def _graph(self):
        if self._inferred is None:
            try:
                self._inferred = onnx.shape_inference.infer_shapes(self._model).graph
            except Exception:  # a graph onnx cannot type: what it declares is all there is
                self._inferred = self._model.graph
        return self._inferred

    def _info(self, name: str):
        found = _declared(self._model.graph, name)  # what the graph says; onnx's inference only for the rest
        return found if found is not None else (_declared(self._graph(), name) or (None, 0))

    def shape(self, name: str) -> list | None:
        """Dimensions: ints, symbolic names (str) or None (unknown); None when the rank is unknown."""
        return self._info(name)[0]

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


def _declared(g, name: str) -> tuple[list | None, int] | None:
    """``(shape, element type)`` of ``name`` as graph ``g`` declares it (a shape of ints, the names
    of symbolic dimensions and ``None`` for unknown ones; or ``None`` without one), or None when it
    declares nothing."""
    for t in g.initializer:
        if t.name == name:
            return list(t.dims), t.data_type
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.name == name and vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] \
                if tt.HasField("shape") else None
            return shape, tt.elem_type
    return None


def _consumed(model: onnx.ModelProto) -> set[str]:
    """The values some node reads or the graph returns."""
    return {i for n in model.graph.node for i in node_inputs(n)} | {o.name for o in model.graph.output}


def gradient_forms(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite forms whose gradient onnxruntime-training 1.19.2 builds wrong, silently or not,
    into forms with the same values whose gradient it builds right (measured against PyTorch):

    - ``MatMul`` with a 1-D operand: see :func:`_matmul_as_matrix`.
    - ``Pow`` with a base smaller than the result, and ``Where`` with a value operand smaller
      than the result: their gradients are never summed back over the broadcast axes (a base of
      shape ``(m,)`` took a gradient of shape ``(n, m)``). The operand is ``Expand``-ed to the
      result's shape first, whose gradient sums correctly.
    - ``Split`` with an output nothing reads: its gradient concatenates only the gradients that
      exist, one piece short. The outputs that are read become ``Slice``-s.
    - ``Conv`` with ``auto_pad`` SAME_UPPER/SAME_LOWER: the gradient is wrong (and with stride 2
      reads uninitialized memory). The padding becomes explicit ``pads``.
    - ``Pow`` with an exponent that is not float32 (the builder's ``Sub`` fails on the types):
      the exponent is cast to the base's type.
    - ``LayerNormalization`` whose ``Mean``/``InvStdDev`` outputs are read: the gradient
      ignores what flows into them (silently wrong). It is written out in plain ops.
    - ``LayerNormalization`` without a bias input, with a constant bias or scale, or with a
      weight another LayerNormalization reads too (the builder fails on each, see below),
      ``Transpose`` without ``perm``, and
      ``ReduceL2``/``ReduceLogSumExp`` without ``keepdims`` and with ``axes`` as an attribute,
      which the builder fails on: a bias computed from the scale (``scale * 0``, plus the
      constant) where only the bias is at fault, else the node written out in plain ops; the
      explicit reversing ``perm``; ``keepdims`` with a ``Squeeze`` after.
    - ``LSTM``/``GRU`` without initial states or naming only some outputs (the builder's graph
      fails to type): zero initial states, as PyTorch's exports write them, and every output named.

    A form that cannot be rewritten because a shape is unknown is refused, naming the node.
    """
    ops = {"MatMul", "Pow", "Where", "Split", "Conv", "LayerNormalization", "Transpose", "ReduceL2",
           "ReduceLogSumExp", "LSTM", "GRU"}
    if not any(n.op_type in ops for n in model.graph.node):
        return model
    shapes = Shapes(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    consumed = _consumed(model)
    # values a node computes from the graph's inputs (the weights are inputs here), not constants
    constant = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type in ("Constant", "ConstantOfShape") or (n.input and all(i in constant for i in n.input if i)):
            constant.update(n.output)
    computed = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    computed -= constant
    norm_reads = collections.Counter(v for n in model.graph.node if n.op_type == "LayerNormalization"
                                     for v in n.input[1:3] if v)
    consts = int64_constants(model)
    float_types = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)

    def where_of(node, i) -> str:
        return f"{node.op_type} node {node.name or i!r}"

    def smaller(value: str, out: str) -> bool:
        """A value a gradient reaches that may be broadcast to ``out``'s shape."""
        return value in computed and not shapes.same(value, out)

    def rank(name: str) -> int | None:
        shape = shapes.shape(name)
        return None if shape is None else len(shape)

    def needs(node) -> bool:
        op = node.op_type
        if op == "MatMul":
            return any(rank(v) == 1 for v in node.input)
        if op == "Pow":
            return smaller(node.input[0], node.output[0]) or \
                shapes.elem_type(node.input[1]) != shapes.elem_type(node.input[0])
        if op == "Where":  # values of an unknown type are widened too: Expand takes any
            return shapes.elem_type(node.output[0]) in (*float_types, 0) and \
                any(smaller(v, node.output[0]) for v in node.input[1:])
        if op == "Split":
            return any(o and o not in consumed for o in node.output) or any(not o for o in node.output)
        if op == "Conv":
            return text_attribute(node, "auto_pad", "NOTSET") in SAME
        if op == "LayerNormalization":
            bias = node.input[2] if len(node.input) > 2 else ""
            return not bias or bias not in computed or node.input[1] not in computed or \
                any(norm_reads[v] > 1 for v in node.input[1:3] if v) or \
                any(o in consumed for o in node.output[1:] if o)
        if op == "Transpose":
            return attribute(node, "perm", None) is None
        if op in ("ReduceL2", "ReduceLogSumExp"):
            return not attribute(node, "keepdims", 1) and attribute(node, "axes", None) is not None
        if op in ("LSTM", "GRU"):
            full = 3 if op == "LSTM" else 2
            states = (5, 6) if op == "LSTM" else (5,)
            return len(node.output) < full or any(len(node.input) <= k or not node.input[k] for k in states)
        return False

    def rewrite(i, node):
        op, p = node.op_type, f"{node.name or node.op_type}/gradient_form_{i}/"
        nodes, inits = [], []
        if op == "MatMul":
            return _matmul_as_matrix(node, i, p, rank(node.input[0]), rank(node.input[1]))
        if op in ("Pow", "Where"):
            inputs = list(node.input)
            if op == "Pow":
                if shapes.elem_type(inputs[1]) != shapes.elem_type(inputs[0]) and shapes.elem_type(inputs[0]):
                    nodes.append(helper.make_node("Cast", [inputs[1]], [p + "exponent"], name=p + "Cast",
                                                  to=shapes.elem_type(inputs[0])))
                    inputs[1] = p + "exponent"
                widen = {0: [inputs[1]]}
            else:
                widen = {1: [inputs[0], inputs[2]], 2: [inputs[0], inputs[1]]}
            for k, others in widen.items():
                if not smaller(inputs[k], node.output[0]):
                    continue
                value = inputs[k]
                for j, other in enumerate(others):
                    nodes += [helper.make_node("Shape", [other], [f"{p}shape_{k}_{j}"], name=f"{p}Shape_{k}_{j}"),
                              helper.make_node("Expand", [value, f"{p}shape_{k}_{j}"], [f"{p}wide_{k}_{j}"],
                                               name=f"{p}Expand_{k}_{j}")]
                    value = f"{p}wide_{k}_{j}"
                inputs[k] = value
            nodes.append(helper.make_node(op, inputs, list(node.output), name=node.name))
            return nodes, inits
        if op == "Split":
            return _split_as_slices(node, p, shapes, consts, consumed, where_of(node, i))
        if op == "Conv":
            explicit = conv_with_explicit_pads(node, shapes)
            if explicit is None:
                raise UnsupportedOpError(f"{where_of(node, i)} pads with auto_pad, and its input's sizes are not "
                                         f"known (input {shapes.shape(node.input[0])}); onnxruntime-training's "
                                         "gradient of that form is wrong. Export with explicit padding or static "
                                         "image sizes")
            return [explicit], []
        if op == "LayerNormalization":
            # The builder's LayerNormalization gradient takes only a weight of its own as the scale: it
            # fails on a constant scale and on a weight two such nodes read ("Duplicate definition of
            # name (..._grad)"), and on a missing or constant bias. Those nodes are written out in
            # plain ops; a node whose only fault is its bias gets one computed from the scale
            # (scale * 0, plus the constant bias), which keeps the fused kernel.
            scale = node.input[1]
            bias = node.input[2] if len(node.input) > 2 else ""
            if scale not in computed or any(norm_reads[v] > 1 for v in (scale, bias) if v) or \
                    any(o in consumed for o in node.output[1:] if o):
                return _layer_norm_decomposed(node, i, p, shapes, opset, consumed)
            dtype = onnx.helper.tensor_dtype_to_np_dtype(shapes.elem_type(scale) or onnx.TensorProto.FLOAT)
            inits.append(numpy_helper.from_array(np.zeros((), dtype), p + "zero"))
            nodes.append(helper.make_node("Mul", [scale, p + "zero"], [p + "zero_bias" if bias else p + "bias"],
                                          name=p + "ZeroBias"))
            if bias:
                nodes.append(helper.make_node("Add", [p + "zero_bias", bias], [p + "bias"], name=p + "Bias"))
            bias = p + "bias"
            new = helper.make_node(op, [node.input[0], scale, bias], list(node.output), name=node.name)
            new.attribute.extend(node.attribute)
            return nodes + [new], inits
        if op == "Transpose":
            shape = shapes.shape(node.input[0])
            if shape is None:
                return [node], []
            return [helper.make_node("Transpose", list(node.input), list(node.output), name=node.name,
                                     perm=list(range(len(shape)))[::-1])], []
        if op in ("ReduceL2", "ReduceLogSumExp"):
            axes = list(attribute(node, "axes", []))
            kept = p + "kept"
            nodes.append(helper.make_node(op, list(node.input), [kept], name=node.name, axes=axes, keepdims=1))
            # from_onnx brings every model to opset 17 or later, where Squeeze takes its axes as an input
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), p + "axes"))
            nodes.append(helper.make_node("Squeeze", [kept, p + "axes"], list(node.output), name=p + "Squeeze"))
            return nodes, inits
        # LSTM / GRU: name every output, and give zero initial states where there are none
        full, states = (3, (5, 6)) if op == "LSTM" else (2, (5,))
        outputs = list(node.output) + [""] * (full - len(node.output))
        outputs = [o or f"{p}output_{k}" for k, o in enumerate(outputs)]
        inputs = list(node.input) + [""] * (max(states) + 1 - len(node.input))
        if any(not inputs[k] for k in states):
            directions = 2 if attribute(node, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
            hidden = attribute(node, "hidden_size", None)
            batch_first = attribute(node, "layout", 0) == 1
            inits += [numpy_helper.from_array(np.array([1 if not batch_first else 0], np.int64), p + "batch_axis"),
                      numpy_helper.from_array(np.array([directions], np.int64), p + "directions"),
                      numpy_helper.from_array(np.array([hidden], np.int64), p + "hidden")]
            dims = [p + "batch", p + "directions"] if batch_first else [p + "directions", p + "batch"]
            nodes += [helper.make_node("Shape", [inputs[0]], [p + "x_shape"], name=p + "Shape"),
                      helper.make_node("Gather", [p + "x_shape", p + "batch_axis"], [p + "batch"], name=p + "Batch",
                                       axis=0),
                      helper.make_node("Concat", [*dims, p + "hidden"], [p + "state_shape"], name=p + "StateShape",
                                       axis=0),
                      helper.make_node("ConstantOfShape", [p + "state_shape"], [p + "zeros"], name=p + "Zeros",
                                       value=numpy_helper.from_array(np.zeros(1, np.float32)))]
            for k in states:
                inputs[k] = inputs[k] or p + "zeros"
        new = helper.make_node(op, inputs, outputs, name=node.name)
        new.attribute.extend(node.attribute)
        return nodes + [new], inits

    return _replace_nodes(model, needs, rewrite)


def _layer_norm_decomposed(node, i: int, p: str, shapes: Shapes, opset: int, consumed: set[str]):
    """``LayerNormalization`` as the ops it stands for, ``(x - mean) / sqrt(var + eps) * scale +
    bias`` over the axes from ``axis`` on, with its ``Mean`` and ``InvStdDev`` outputs where they
    are read. For a node whose scale or bias is a constant or a value other such nodes read too
    (the gradient builder fails on those: "Duplicate definition of name (..._grad)"), and for one
    whose statistics are read (the builder's gradient ignores what flows into them: silently
    wrong). These ops have gradients."""
    shape = shapes.shape(node.input[0])
    if shape is None:
        raise UnsupportedOpError(f"LayerNormalization node {node.name or i!r} has weights onnxruntime-training's "
                                 "gradient cannot take (constant or shared), or its statistics are read, and its "
                                 "input's rank is not known, so ortrain cannot write it out in plain ops. Export "
                                 "with known ranks")
    rank = len(shape)
    axes = list(range(attribute(node, "axis", -1) % rank, rank))
    eps = attribute(node, "epsilon", 1e-5)
    inits = [numpy_helper.from_array(np.array(eps, np.float32), p + "eps")]

    def mean(x: str, out: str) -> onnx.NodeProto:
        if opset >= 18:  # axes became an input
            return helper.make_node("ReduceMean", [x, p + "axes"], [out], name=out, keepdims=1)
        return helper.make_node("ReduceMean", [x], [out], name=out, axes=axes, keepdims=1)

    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), p + "axes"))
    y = p + "normed"
    nodes = [mean(node.input[0], p + "mean"),
             helper.make_node("Sub", [node.input[0], p + "mean"], [p + "centred"], name=p + "Sub"),
             helper.make_node("Mul", [p + "centred", p + "centred"], [p + "squares"], name=p + "Square"),
             mean(p + "squares", p + "var"),
             helper.make_node("Add", [p + "var", p + "eps"], [p + "var_eps"], name=p + "AddEps"),
             helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "Sqrt"),
             helper.make_node("Div", [p + "centred", p + "std"], [y], name=p + "Div"),
             helper.make_node("Mul", [y, node.input[1]], [p + "scaled"], name=p + "Scale")]
    if len(node.input) > 2 and node.input[2]:
        nodes.append(helper.make_node("Add", [p + "scaled", node.input[2]], [node.output[0]], name=p + "Bias"))
    else:
        nodes.append(helper.make_node("Identity", [p + "scaled"], [node.output[0]], name=p + "Out"))
    statistics = list(node.output[1:3]) + [""] * (3 - len(node.output))
    if statistics[0] in consumed:
        nodes.append(helper.make_node("Identity", [p + "mean"], [statistics[0]], name=p + "Mean"))
    if statistics[1] in consumed:
        nodes.append(helper.make_node("Reciprocal", [p + "std"], [statistics[1]], name=p + "InvStdDev"))
    return nodes, inits


def conv_with_explicit_pads(node: onnx.NodeProto, shapes: Shapes) -> onnx.NodeProto | None:
    """``node``, a ``Conv`` with ``auto_pad`` SAME_UPPER/SAME_LOWER, with the same padding written as
    ``pads`` (dilations counted); None when the input's or the kernel's sizes are not known."""
    shape, wshape = shapes.shape(node.input[0]), shapes.sizes(node.input[1])
    if shape is None or wshape is None:
        return None
    kernel = list(attribute(node, "kernel_shape", wshape[2:]))
    dilations = list(attribute(node, "dilations", [1] * len(kernel)))
    strides = list(attribute(node, "strides", [1] * len(kernel)))
    effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    # at stride 1 the padding is k - 1 whatever the size; other strides need the size
    sizes = [d if type(d) is int else (1 if st == 1 else None) for d, st in zip(shape[2:], strides)]
    if None in sizes:
        return None
    pads = _same_pads(text_attribute(node, "auto_pad", "SAME_UPPER"), sizes, effective, strides)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "auto_pad"}
    return helper.make_node("Conv", list(node.input), list(node.output), name=node.name, **attrs, pads=pads)


def _same_pads(auto: str, sizes: list[int], kernel: list[int], strides: list[int]) -> list[int]:
    """Explicit ``pads`` for ``auto_pad`` SAME_UPPER/SAME_LOWER (the odd cell at the end, or the start)."""
    begins, ends = [], []
    for size, k, st in zip(sizes, kernel, strides):
        total = max((-(-size // st) - 1) * st + k - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(large if auto == "SAME_LOWER" else small)
        ends.append(small if auto == "SAME_LOWER" else large)
    return begins + ends


def _split_as_slices(node, p: str, shapes: Shapes, consts: dict, consumed: set[str], where: str):
    """The read outputs of a ``Split`` as ``Slice``-s of its input (sizes from the ``split`` input, or
    equal parts of a known axis length; opset 17 or later, as from_onnx makes every model)."""
    shape = shapes.shape(node.input[0])
    axis = attribute(node, "axis", 0)
    n = len(node.output)
    sizes = consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    sizes = None if sizes is None else [int(v) for v in np.ravel(sizes)]
    if sizes is None and (len(node.input) < 2 or not node.input[1]) and shape is not None and \
            type(shape[axis]) is int:
        length = shape[axis]
        part = -(-length // n)  # opset 18's rule: equal parts, the last one smaller
        sizes = [min(part, max(length - k * part, 0)) for k in range(n)]
    if sizes is None:
        raise UnsupportedOpError(f"{where} leaves an output unread, and the sizes of its parts are not known "
                                 f"(input {shape}); onnxruntime-training's gradient of that form is wrong. Give the "
                                 "split sizes, or read every output")
    nodes, inits = [], []
    start = 0
    for k, (out, size) in enumerate(zip(node.output, sizes)):
        if out and out in consumed:
            vals = {"starts": [start], "ends": [start + size], "axes": [axis]}
            for key, v in vals.items():
                inits.append(numpy_helper.from_array(np.array(v, np.int64), f"{p}{key}_{k}"))
            nodes.append(helper.make_node("Slice", [node.input[0], f"{p}starts_{k}", f"{p}ends_{k}", f"{p}axes_{k}"],
                                          [out], name=f"{p}Slice_{k}"))
        start += size
    return nodes, inits


def for_training(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrites that only the training and eval graphs need (the exported model is left alone)."""
    return name_batch_dimension(gradient_forms(average_pool_as_conv(model)))


# -- rewrites of the gradient graphs onnxruntime-training builds --------------------------------

def bias_grad_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite the column sums of a ``Gemm`` operand, ``ReduceSum(t, axes=[0])``, as ``ones(1, n) @ t``.

    The gradient builder sums ``Gemm``'s output gradient over the batch for the bias that way, and
    onnxruntime's CPU ``ReduceSum`` over axis 0 of a 2-D tensor is slow (about 50 us for 128 x 512,
    measured), where the same sums as a one-row matrix product cost a few microseconds. ``t`` is 2-D
    because a ``Gemm`` reads it, and float32 because that ``Gemm`` also reads a tensor declared
    float32 (its operands share one type); other column sums are left alone. The sums are the same
    up to the order of float additions.
    """
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]}
    declared.update((t.name, t.data_type) for t in g.initializer)
    gemm_inputs = {i for n in g.node if n.op_type == "Gemm"
                   and any(declared.get(x) == onnx.TensorProto.FLOAT for x in n.input) for i in n.input[:2]}

    def column_sum(n) -> bool:
        if n.op_type != "ReduceSum" or n.input[0] not in gemm_inputs or len(n.input) < 2 or n.input[1] not in inits:
            return False
        return list(numpy_helper.to_array(inits[n.input[1]]).ravel()) in ([0], [-2])

    one, flat = "ortrain.bias_grad/one", "ortrain.bias_grad/flat"

    def as_matmul(i, node):
        keep = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        p = f"{node.name or 'ReduceSum'}/as_matmul_{i}/"
        row = p + "row" if not keep else node.output[0]
        nodes = [helper.make_node("Shape", [node.input[0]], [p + "rows"], name=p + "Shape", end=1),
                 helper.make_node("Concat", [one, p + "rows"], [p + "ones_shape"], name=p + "Concat", axis=0),
                 helper.make_node("ConstantOfShape", [p + "ones_shape"], [p + "ones"], name=p + "Ones",
                                  value=numpy_helper.from_array(np.array([1.0], np.float32))),
                 helper.make_node("MatMul", [p + "ones", node.input[0]], [row], name=p + "MatMul")]
        if not keep:
            nodes.append(helper.make_node("Reshape", [row, flat], [node.output[0]], name=p + "Reshape"))
        return nodes, []

    return _replace_nodes(model, column_sum, as_matmul,
                          [numpy_helper.from_array(np.array([1], np.int64), one),
                           numpy_helper.from_array(np.array([-1], np.int64), flat)])


_TWO_127 = float(2.0 ** 127)


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The values ``node`` reads: its inputs, then what its subgraphs read from outside."""
    return list(dict.fromkeys([i for i in node.input if i] + subgraph_reads(node)))


def subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """The outer values the subgraphs of ``node`` (``Loop``, ``If`` and ``Scan`` bodies) read by name."""
    names = []
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {v.name for v in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                names += [i for i in node_inputs(n) if i not in inner]
                inner.update(n.output)
    return list(dict.fromkeys(names))


def elem_types(model: onnx.ModelProto, lenient: bool = False) -> dict[str, int]:
    """Element types (``onnx.TensorProto`` codes) of a standard-ONNX graph's values, by onnx's
    type inference; values it cannot type are left out. ``lenient``: where onnx cannot type the
    graph at all (an unknown op, a damaged part), the types the graph declares."""
    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        if not lenient:
            raise
        g = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]
             if vi.type.HasField("tensor_type")}
    types.update((t.name, t.data_type) for t in g.initializer)
    return {k: v for k, v in types.items() if v}


def int64_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The int64 values an initializer or a ``Constant`` node fixes (shapes, axes, steps), by name."""
    values = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    values[n.output[0]] = a.t
    return {name: numpy_helper.to_array(t) for name, t in values.items() if t.data_type == onnx.TensorProto.INT64}


def float32_values(model: onnx.ModelProto) -> set[str]:
    """Names of the float32 values of a standard-ONNX graph, by onnx's type inference (values it
    cannot type are left out)."""
    return {name for name, t in elem_types(model).items() if t == onnx.TensorProto.FLOAT}


def relu_grad_as_mask(model: onnx.ModelProto, float32: set[str]) -> onnx.ModelProto:
    """Rewrite ``ReluGrad(dy, v)``, ``v`` one of the ``float32`` values, as ``dy * clip(v * 2^127 * 2^127, 0, 1)``.

    onnxruntime-training 1.19.2's CPU ``ReluGrad`` kernel is slow (5 ns an element: 8.7 ms for a
    64 x 32 x 28 x 28 activation, measured), where multiplications and ``Clip`` are vectorised
    and threaded. ``v`` is the Relu's input or output, whichever the builder kept; the mask is
    exact either way: any ``v > 0``, down to the smallest subnormal 2^-149, times 2^254 is at
    least 1 (inf included) and clips to 1; ``v <= 0`` clips to 0. So for finite values each element
    of the result is ``dy`` or zero, as ``ReluGrad`` gives (up to the sign of zero). The one
    difference: where ``v`` is NaN, or ``dy`` is infinite or NaN over a zero mask, the product is
    NaN where ``ReluGrad`` gives 0; a step with such values has diverged anyway. The constants are
    float32, so a ``ReluGrad`` over another type (float16 has a kernel) is left as it is.
    """
    def rewritable(n) -> bool:
        return n.op_type == "ReluGrad" and n.input[1] in float32

    scale, zero, one = "ortrain.relu_grad/two_127", "ortrain.relu_grad/zero", "ortrain.relu_grad/one"

    def as_mask(i, node):
        p = f"{node.name or 'ReluGrad'}/as_mask_{i}/"
        return [helper.make_node("Mul", [node.input[1], scale], [p + "scaled"], name=p + "Mul_0"),
                helper.make_node("Mul", [p + "scaled", scale], [p + "huge"], name=p + "Mul_1"),
                helper.make_node("Clip", [p + "huge", zero, one], [p + "mask"], name=p + "Clip"),
                helper.make_node("Mul", [node.input[0], p + "mask"], [node.output[0]], name=p + "Mul_2")], []

    return _replace_nodes(model, rewritable, as_mask,
                          [numpy_helper.from_array(np.array(v, np.float32), name)
                           for v, name in ((_TWO_127, scale), (0.0, zero), (1.0, one))])


def for_gradients(model: onnx.ModelProto, forward: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrites of a training graph as onnxruntime-training's gradient builder wrote it from
    ``forward`` (standard ONNX, whose value types the rewrites may need)."""
    return bias_grad_as_matmul(relu_grad_as_mask(model, float32_values(forward)))
