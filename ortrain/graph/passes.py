"""Pure graph rewrites: of forward graphs before the gradient builder sees them, and of the training
graphs it writes. Each returns a new model (or the same one when there is nothing to rewrite) and
leaves its input alone."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import OrtrainError, UnsupportedOpError


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

    return replace_nodes(model, frozen, plain_ops)


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
    return same_pads(auto, shape[2:], kernel, strides)


def same_pads(auto: str, sizes: list[int], kernel: list[int], strides: list[int]) -> list[int]:
    """Explicit ``pads`` for ``auto_pad`` SAME_UPPER/SAME_LOWER (the odd cell at the end, or the start)."""
    begins, ends = [], []
    for size, k, st in zip(sizes, kernel, strides):
        total = max((-(-size // st) - 1) * st + k - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(large if auto == "SAME_LOWER" else small)
        ends.append(small if auto == "SAME_LOWER" else large)
    return begins + ends


# Elementwise ops whose inputs broadcast against each other (numpy's rules).
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where", "PRelu",
                          "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
                          "BitShift"})


def replace_nodes(model: onnx.ModelProto, match, expand, constants=()) -> onnx.ModelProto:
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


def average_pool_as_conv(model: onnx.ModelProto, trainable=None) -> onnx.ModelProto:
    """Rewrite 1-D and 2-D AveragePool nodes as a depthwise Conv with constant weights.

    onnxruntime-training 1.19.2's CPU ``AveragePoolGrad`` sizes its output from the
    shapes stored in the graph, so with a free dimension (the batch, a length) it writes an
    empty gradient and the process dies with SIGFPE. A depthwise convolution with weights
    ``1/(kh*kw)``, rescaled where a window holds fewer cells (borders, ``ceil_mode``),
    computes the same average and has a working gradient (a 1-D pool is the 2-D one over a
    height of 1). It needs the channels; the spatial sizes only where windows differ in size
    (``ceil_mode``, ``auto_pad`` SAME, padding not counted). Only the training and eval graphs
    get this form; exported models keep AveragePool. A pool this rewrite cannot express is
    refused rather than left to crash the process, unless no gradient reaches it: its input computed
    from none of the ``trainable`` weights (where given), it keeps its op and runs forward only.
    """
    def is_pool(n) -> bool:
        return n.op_type == "AveragePool"

    if not any(is_pool(n) for n in model.graph.node):
        return model
    inferred = inferred_shapes(model) or model
    trained = None
    if trainable is not None:  # the values a gradient can reach: those computed from a trainable weight
        trained = set(trainable)
        for n in model.graph.node:
            if any(i in trained for i in node_inputs(n)):
                trained.update(o for o in n.output if o)

    def as_conv(i, node):
        try:
            return _as_conv(i, node)
        except UnsupportedOpError:
            if trained is not None and node.input[0] not in trained:
                return [node], []
            raise

    def _as_conv(i, node):
        shape = _shape_of(inferred, node.input[0])
        if any(d != 1 for d in attribute(node, "dilations", [])):
            _refuse_pool(node, i, f"it has dilations {list(attribute(node, 'dilations', []))}, and ortrain trains "
                         "average pools without", "freeze the weights before it or replace the pool")
        if len(attribute(node, "kernel_shape", [])) == 1:
            if shape is None or len(shape) != 3 or shape[1] is None:
                _refuse_pool(node, i, f"ortrain trains 1-D average pools whose channels are known (input shape "
                             f"{shape})", "give the model a static channel count or replace the pool")
            return _pool_1d_as_2d(i, node, shape)
        return _pool_2d_as_conv(i, node, shape)

    return replace_nodes(model, is_pool, as_conv)


def _refuse_pool(node, i: int, why: str, fix: str):
    raise UnsupportedOpError(
        f"AveragePool node {node.name or i!r}: {why}; onnxruntime-training's own AveragePool gradient sizes "
        f"its output from the shapes the graph stores, and where one is free the process dies. To train, {fix}")


def _full_windows(node) -> bool:
    """Whether every window of the pool averages over the whole kernel, whatever the input's size:
    no ``ceil_mode``, no SAME padding, and padding counted or none."""
    return attribute(node, "ceil_mode", 0) == 0 and text_attribute(node, "auto_pad", "NOTSET") in (
        "NOTSET", "", "VALID") and (attribute(node, "count_include_pad", 0) or not any(attribute(node, "pads", [])))


def _pool_2d_as_conv(i: int, node, shape: list | None):
    kernel = list(attribute(node, "kernel_shape", []))
    if len(kernel) != 2:
        _refuse_pool(node, i, f"ortrain trains 1-D and 2-D average pools, this one is {len(kernel)}-D (kernel "
                     f"{kernel})", "freeze the weights before it or replace the pool")
    if shape is None or len(shape) != 4 or shape[1] is None:
        _refuse_pool(node, i, f"ortrain trains 2-D average pools whose channels are known (input shape {shape})",
                     "give the model a static channel count or replace the pool")
    c = shape[1]
    strides = list(attribute(node, "strides", [1, 1]))
    p = f"{node.name or 'AveragePool'}/as_conv_{i}/"
    kh, kw = kernel
    inits = [numpy_helper.from_array(np.full((c, 1, kh, kw), 1.0 / (kh * kw), np.float32), p + "weight")]
    if any(d is None for d in shape[2:]):
        if not _full_windows(node):
            _refuse_pool(node, i, f"with ceil_mode, auto_pad SAME or padding not counted its windows differ in "
                         f"size, and ortrain then needs the sizes (input shape {shape})",
                         "give the model static sizes or replace the pool")
        pads = list(attribute(node, "pads", [0, 0, 0, 0]))
        return [helper.make_node("Conv", [node.input[0], p + "weight"], [node.output[0]], name=p + "Conv",
                                 group=c, kernel_shape=kernel, strides=strides, pads=pads)], inits
    h, w = shape[2:]
    pads = _explicit_pads(node, shape)
    ho, end_h, rows = _pool_geometry(node, h, 0, kh, strides[0], pads)
    wo, end_w, cols = _pool_geometry(node, w, 1, kw, strides[1], pads)
    conv_pads = [pads[0], pads[1], end_h, end_w]
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


def name_free_dimensions(model: onnx.ModelProto) -> onnx.ModelProto:
    """An exported model's free sizes, named: axis 0 of its inputs and outputs ``batch``, an
    input's other free axes ``<input>_dim<k>``. Some runtimes (tract) cannot load a graph input
    whose size has neither a value nor a name."""
    out = copy.deepcopy(model)
    for vi, every_axis in [(vi, True) for vi in out.graph.input] + [(vi, False) for vi in out.graph.output]:
        if not vi.type.HasField("tensor_type"):
            continue
        for k, dim in enumerate(vi.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") or dim.dim_param or (k and not every_axis):
                continue
            dim.dim_param = BATCH_DIM if k == 0 else f"{vi.name}_dim{k}"
    return out


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

    return replace_nodes(model, column_sum, as_matmul,
                          [numpy_helper.from_array(np.array([1], np.int64), one),
                           numpy_helper.from_array(np.array([-1], np.int64), flat)])


_TWO_127 = float(2.0 ** 127)


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The values ``node`` reads: its inputs, then what its subgraphs read from outside."""
    return list(dict.fromkeys([i for i in node.input if i] + subgraph_reads(node)))


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs ``node`` holds as attributes (``Loop``, ``If`` and ``Scan`` bodies)."""
    return [g for attr in node.attribute for g in ([attr.g] if attr.HasField("g") else attr.graphs)]


def all_nodes(graph: onnx.GraphProto):
    """The nodes of ``graph`` and of the subgraphs they hold, depth first."""
    for node in graph.node:
        yield node
        for inner in subgraphs(node):
            yield from all_nodes(inner)


def subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """The outer values the subgraphs of ``node`` (``Loop``, ``If`` and ``Scan`` bodies) read by name."""
    names = []
    for g in subgraphs(node):
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


def int64_constants(model: onnx.ModelProto, also_int32: bool = False) -> dict[str, np.ndarray]:
    """The int64 values an initializer or a ``Constant`` node fixes (shapes, axes, steps), by name;
    with ``also_int32`` the int32 ones too (positions, which ONNX allows in either)."""
    kinds = {onnx.TensorProto.INT64, onnx.TensorProto.INT32} if also_int32 else {onnx.TensorProto.INT64}
    found = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type in kinds}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type in kinds:
                    found[n.output[0]] = numpy_helper.to_array(a.t)
                # the dynamo exporter writes a slice's steps, a reshape's shape... as value_ints
                elif a.name == "value_ints":
                    found[n.output[0]] = np.array(a.ints, np.int64)
                elif a.name == "value_int":
                    found[n.output[0]] = np.array(a.i, np.int64)
    return found


def inferred_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with onnx's inferred shapes, the small integer values the graph computes from
    constants alone folded first (the axes of a ``ReduceMean`` that the dynamo exporter writes as a
    ``Reshape`` of a constant, which onnx's inference does not follow: every size after it was
    unknown) and constant values propagated (a ``Reshape`` to ``[Shape(x)[0], 2, -1]`` keeps its 2),
    or without these where they fail; None where onnx cannot type the graph."""
    folded = _small_constants_folded(model)
    for data_prop in (True, False):
        try:
            return onnx.shape_inference.infer_shapes(folded, data_prop=data_prop)
        except Exception:  # noqa: BLE001 - a graph onnx cannot type
            continue
    return None


_FOLDED_OPS = ("Reshape", "Unsqueeze", "Squeeze", "Concat", "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
               "Neg")


def _small_float_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The float values of at most 64 elements a ``Constant`` node fixes, by name."""
    found = {}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) and int(np.prod(t.dims)) <= 64:
                found[n.output[0]] = numpy_helper.to_array(t)
    return found


def _small_constants_folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the nodes of :data:`_FOLDED_OPS` that compute small integer values (or a few
    floats: a resize's scales the TorchScript exporter concatenates) from constants alone written as
    ``Constant`` nodes (for onnx's inference only); ``model`` itself where there are none."""
    known = {**_small_float_constants(model), **int64_constants(model, also_int32=True)}
    folded = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in _FOLDED_OPS or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or \
                not node.input or not all(x in known for x in node.input if x):
            continue
        try:
            value = _fold(node, [known[x] if x else None for x in node.input])
        except Exception:  # noqa: BLE001 - a form this small folder does not take: left to the inference
            continue
        if value is not None and value.dtype.kind in "iuf" and value.size <= 64:
            known[node.output[0]] = folded[i] = value
    # a Pad's amounts TorchScript computes from constants through ops this folder does not take
    # (ConstantOfShape, a reversed Slice, Transpose): onnx's reference evaluator folds them
    producers = {o: k for k, n in enumerate(model.graph.node) for o in n.output}
    for node in model.graph.node:
        pads = node.input[1] if node.op_type == "Pad" and len(node.input) > 1 else ""
        if pads and pads not in known and pads in producers and len(model.graph.node[producers[pads]].output) == 1:
            from ortrain.graph.shapes import folded_value
            value = folded_value(model, pads)
            if value is not None and np.asarray(value).dtype.kind == "i":
                known[pads] = folded[producers[pads]] = np.asarray(value, np.int64)
    if not folded:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, value in folded.items():
        node = out.graph.node[i]
        node.CopyFrom(helper.make_node("Constant", [], [node.output[0]], name=node.name,
                                       value=numpy_helper.from_array(value, node.output[0])))
    return out


def _fold(node: onnx.NodeProto, values: list) -> np.ndarray | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x = values[0]
    if node.op_type in ("Identity",):
        return x
    if node.op_type == "Cast":
        return x.astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if node.op_type == "Concat":
        return np.concatenate([v for v in values if v is not None], axis=attrs.get("axis", 0))
    if node.op_type == "Neg":
        return -x
    if node.op_type in ("Add", "Sub", "Mul", "Div", "Mod"):  # the sizes TorchScript computes (unflatten's Mod)
        a, b = np.asarray(x), np.asarray(values[1])
        if a.dtype != b.dtype:
            return None
        if node.op_type in ("Div", "Mod") and (b == 0).any():  # left to the runtime (an error, or inf)
            return None
        if node.op_type == "Div" and a.dtype.kind in "iu":  # integer division truncates, as onnxruntime's
            if a.dtype.kind == "i" and np.any((a == np.iinfo(a.dtype).min) & (b == -1)):
                return None  # overflows: left to the runtime
            floor = np.floor_divide(a, b)
            return (floor + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))).astype(a.dtype)
        if node.op_type == "Mod":  # the divisor's sign (fmod=0, integers only), or the dividend's (fmod=1)
            return np.fmod(a, b) if attrs.get("fmod", 0) else (np.mod(a, b) if a.dtype.kind in "iu" else None)
        return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[node.op_type](a, b)
    if node.op_type == "Reshape":
        shape = [int(d) for d in values[1]]
        if not attrs.get("allowzero", 0):
            shape = [x.shape[k] if d == 0 and k < x.ndim else d for k, d in enumerate(shape)]
        return np.reshape(x, shape)
    axes = values[1] if len(values) > 1 and values[1] is not None else attrs.get("axes")
    if node.op_type == "Unsqueeze":
        out = x
        for a in sorted(int(a) % (x.ndim + len(axes)) for a in axes):
            out = np.expand_dims(out, a)
        return out
    if node.op_type == "Squeeze":
        return np.squeeze(x, axis=tuple(int(a) for a in axes)) if axes is not None else np.squeeze(x)
    return None



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

    return replace_nodes(model, rewritable, as_mask,
                          [numpy_helper.from_array(np.array(v, np.float32), name)
                           for v, name in ((_TWO_127, scale), (0.0, zero), (1.0, one))])


def scatter_nd_add(p: str, data: str, indices: str, updates: str, k: int, output: str) -> list[onnx.NodeProto]:
    """Nodes writing ``output = ScatterND(data, indices, updates, reduction="add")`` (``indices`` of last
    axis ``k``; names prefixed ``p``) as one ``ScatterElements`` that adds over a ``(rows, -1)`` view of
    ``data``. onnxruntime 1.19.2's CPU ``ScatterND`` splits the index rows over its threads and adds
    without a lock: two threads adding to one row (a row indexed twice) lose one of the additions,
    from about 200,000 updated values on (an embedding's gradient 3.7 times off on two cores,
    measured); its ``ScatterElements`` adds on one thread. Negative indices count from the end, as
    in ``ScatterND``."""
    def const(name, values):
        return helper.make_node("Constant", [], [p + name], name=p + name,
                                value=numpy_helper.from_array(np.array(values, np.int64)))

    nodes = [const("zero", [0]), const("k", [k]), const("minus_one", [-1]),
             const("one", [1]), const("two", [2]), const("column", [-1, 1]),
             helper.make_node("Shape", [data], [p + "shape"], name=p + "Shape"),
             helper.make_node("Slice", [p + "shape", p + "zero", p + "k"], [p + "lead"], name=p + "Lead"),
             helper.make_node("ReduceProd", [p + "lead"], [p + "rows"], name=p + "Rows", keepdims=1),
             helper.make_node("Concat", [p + "rows", p + "minus_one"], [p + "shape2d"], name=p + "Shape2d", axis=0),
             helper.make_node("Reshape", [data, p + "shape2d"], [p + "data2d"], name=p + "Data2d"),
             helper.make_node("Cast", [indices], [p + "int64"], name=p + "Cast", to=onnx.TensorProto.INT64),
             helper.make_node("Less", [p + "int64", p + "zero"], [p + "negative"], name=p + "Less"),
             helper.make_node("Cast", [p + "negative"], [p + "wrap"], name=p + "Wrap", to=onnx.TensorProto.INT64),
             helper.make_node("Mul", [p + "wrap", p + "lead"], [p + "shift"], name=p + "Shift"),
             helper.make_node("Add", [p + "int64", p + "shift"], [p + "from_start"], name=p + "FromStart")]
    if k == 1:
        flat = p + "from_start"
    else:  # row-major offsets over the first k axes: stride j is the product of the sizes after it
        strides = []
        for j in range(k - 1):
            nodes += [const(f"after_{j}", [j + 1]),
                      helper.make_node("Slice", [p + "lead", p + f"after_{j}", p + "k"], [p + f"sizes_{j}"],
                                       name=p + f"Sizes_{j}"),
                      helper.make_node("ReduceProd", [p + f"sizes_{j}"], [p + f"stride_{j}"], name=p + f"Stride_{j}",
                                       keepdims=1)]
            strides.append(p + f"stride_{j}")
        nodes += [helper.make_node("Concat", [*strides, p + "one"], [p + "strides"], name=p + "Strides", axis=0),
                  helper.make_node("Mul", [p + "from_start", p + "strides"], [p + "terms"], name=p + "Terms"),
                  helper.make_node("ReduceSum", [p + "terms", p + "minus_one"], [p + "offsets"], name=p + "Offsets",
                                   keepdims=1)]
        flat = p + "offsets"
    nodes += [helper.make_node("Reshape", [flat, p + "column"], [p + "index_column"], name=p + "IndexColumn"),
              helper.make_node("Shape", [p + "data2d"], [p + "shape_of_2d"], name=p + "ShapeOf2d"),
              helper.make_node("Slice", [p + "shape_of_2d", p + "one", p + "two"], [p + "width"], name=p + "Width"),
              helper.make_node("Concat", [p + "minus_one", p + "width"], [p + "updates_shape"], name=p + "UpdatesShape",
                               axis=0),
              helper.make_node("Reshape", [updates, p + "updates_shape"], [p + "updates2d"], name=p + "Updates2d"),
              helper.make_node("Shape", [p + "updates2d"], [p + "updates2d_shape"], name=p + "Updates2dShape"),
              helper.make_node("Expand", [p + "index_column", p + "updates2d_shape"], [p + "indices2d"],
                               name=p + "Indices2d"),
              helper.make_node("ScatterElements", [p + "data2d", p + "indices2d", p + "updates2d"], [p + "out2d"],
                               name=p + "Scatter", axis=0, reduction="add"),
              helper.make_node("Reshape", [p + "out2d", p + "shape"], [output], name=p + "Reshape")]
    return nodes
