"""``from_onnx``: any ONNX model as a trainable :class:`~ortrain.nn.graph_model.GraphModel`.

The steps, each a pure function of the model before it:

1. load without trusting the file (:mod:`ortrain.graph.loading`);
2. bring the opset into the range onnxruntime-training trains (onnx's version converter,
   :mod:`ortrain.graph.opsets`);
3. choose the data inputs (initializers listed as graph inputs, as IR 3 files do, are weights);
4. rewrite what the gradient builder cannot take (:mod:`ortrain.graph.repairs`);
5. free a fixed batch dimension unless a hard-coded shape pins it (:mod:`ortrain.graph.batch_dimension`);
6. give every ``Identity(initializer)`` its own copy (exporters merge equal tensors that way),
   classify initializers into weights, batch-norm buffers and constants, and move the
   weights to graph inputs (the :class:`~ortrain.graph.forward.ForwardGraph` form);
7. refuse, in one error, every op on the way back to a trainable weight that has no gradient.

>>> import onnx, numpy as np
>>> from onnx import helper, numpy_helper
>>> g = helper.make_graph(
...     [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
...     [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
...     [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 1])],
...     [numpy_helper.from_array(np.ones((3, 1), np.float32), "w")])
>>> m = from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
>>> [(p.name, p.role) for p in m.params()], m.input_specs[0].shape
([('w', 'trainable')], (None, 3))
"""

from __future__ import annotations

import ast
import collections
import copy
import os
import re

import numpy as np
import onnx
from onnx import numpy_helper

from ortrain import _random
from ortrain._arrays import FLOAT32_TINY
from ortrain._keywords import names_unknown_arguments_of
from ortrain._names import picked
from ortrain._warnings import warn
from ortrain.errors import OrtrainError, ShapeError, UnsupportedOpError
from ortrain.graph import check_model
from ortrain.graph.batch_dimension import free_batch_dimension, free_output_batch, free_output_dimensions
from ortrain.graph.forward import ForwardGraph, ParamSpec, reserved_input_name
from ortrain.graph.gradient_ops import gradient_reach, nodes_without_gradient
from ortrain.graph.loading import load_untrusted
from ortrain.graph.opsets import default_opset, upgrade_opset
from ortrain.graph.passes import all_nodes, attribute, node_inputs, subgraph_reads, subgraphs
from ortrain.graph.repairs import (
    batchnorm_inference_form,
    read_as_scalars,
    refuse_pads_past_their_rows,
    repair,
)

__all__ = ["canonical_forward", "from_onnx", "reassign_roles"]


def _picked_by(patterns, names) -> set[str]:
    """The ``names`` one of ``patterns`` picks (see :func:`picked`)."""
    return {n for p in patterns for n in picked(names, p)}


def _patterns(value, argument: str) -> list[str] | None:
    if value is None:
        return None
    try:
        items = [value] if isinstance(value, str) else list(value)
    except TypeError:
        items = None
    if items is None or not all(isinstance(v, str) for v in items):
        raise OrtrainError(f"{argument}: expected weight names or glob patterns (strings), received {value!r}")
    return items


_OTHER_FLOATS = {onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.FLOAT16: "float16",
                 onnx.TensorProto.BFLOAT16: "bfloat16"}
def _other_float(value) -> str | None:
    """The name of a float type other than float32 an initializer (or a stashed array) holds, else None."""
    if isinstance(value, onnx.TensorProto):
        return _OTHER_FLOATS.get(value.data_type)
    return value.dtype.name if value.dtype.kind == "f" and value.dtype != np.float32 else None


NO_GRADIENT = ("no gradient reaches it (it is read only as a shape, ratio, exponent or the like, which "
               "onnxruntime-training does not differentiate)")
NON_FINITE = ("it holds inf or NaN (an additive attention mask of 0 and -inf, say), which a training step would "
              "spread as NaN through every weight")
OTHER_FLOAT = ("it holds {dtype} values, and ortrain trains float32 weights only; export the model in float32 to "
               "train it (in PyTorch, model.float() before torch.onnx.export)")
QUANTIZED = ("its gradient would cross {node}, whose integer output onnxruntime-training does not "
             "differentiate (it has no straight-through gradient for quantization-aware training)")
CONSTANT_TENSOR = ("PyTorch's dynamo exporter records it as a constant tensor (one made in forward, such as "
                   "torch.tensor([...]), or a plain tensor attribute of a module), neither a parameter nor a "
                   "buffer, so PyTorch does not train it")
SHARED_SCALAR = ("read {reads} times, and the dynamo exporter's optimizer merges a scalar parameter with the "
                 "constants of equal value, which training it would change too (to train it, export with "
                 "torch.onnx.export(..., optimize=False) and name it exactly in trainable=)")
SCALAR_IN_SUBGRAPH = "read inside a control-flow subgraph (If, Loop, Scan), which onnxruntime-training does not differentiate"
SCALAR_NO_GRADIENT = "no gradient reaches it (it is read only as an exponent, a shape, a ratio or the like)"
FOLDED = ("PyTorch's dynamo exporter folded it from shapes and constants, none of them a parameter (a ones or zeros "
          "scale such as InstanceNorm(affine=False)'s), so PyTorch does not train it")

# What torch's dynamo exporter records of a value (``metadata_props`` of its value_info): the values a
# constant was folded from (onnxscript's optimizer, all of them, transitively) and a graph input's kind.
_FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
_INPUT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
_TEMPORARY = re.compile(r"val_\d+")  # the names onnxscript gives the values it creates
_LIFTED = re.compile(r"lifted_tensor_\d+")  # the names torch.export gives tensors made in forward
# torch ops that make or reshape a tensor, as torch.export names their results (``arange``, ``div_1``,
# ``scalar_tensor_default``): a value folded from these and temporaries alone holds no parameter
_TORCH_OPS = frozenset("""
    _to_copy abs add alias arange bmm cat clamp clone cos cumsum detach div empty eq exp expand eye fill
    flatten flip full full_like ge gt index index_select le lift_fresh_copy linspace log lt masked_fill
    matmul maximum mean minimum mm mul ne neg new_full new_ones new_zeros ones ones_like permute pow
    reciprocal repeat reshape rsqrt scalar_tensor select sin slice sqrt squeeze stack sub sum t transpose
    tril triu unsqueeze view where zeros zeros_like""".split())
_TORCH_OP_RESULT = re.compile(r"(?P<op>[a-z_][a-z0-9_]*?)(?:_(?:default|Tensor|Scalar|int|dim|self))?(?:_\d+)?")


def torch_constants(model: onnx.ModelProto) -> dict[str, str]:
    """Initializers that are constants in PyTorch, each with the reason: those the dynamo exporter
    records as constant tensors (``CONSTANT_TENSOR``: ``torch.tensor([...])`` made in ``forward``,
    which it names ``lifted_tensor_<n>``, or a plain tensor attribute such as normalisation
    constants) and those it folded from no parameter (:func:`folded_constants`). The TorchScript
    exporter writes both as ``Constant`` nodes. As weights they would train."""
    recorded = _recorded_as(model, ("CONSTANT_TENSOR",))
    out = dict.fromkeys(folded_constants(model, recorded), FOLDED)
    return out | dict.fromkeys(recorded, CONSTANT_TENSOR)


def folded_constants(model: onnx.ModelProto, constants: set[str] = frozenset()) -> set[str]:
    """Float initializers that torch's dynamo exporter folded from no parameter: it writes
    ``InstanceNorm(affine=False)``'s scale and bias, and the per-group ones and zeros of
    ``GroupNorm``, as initializers (``val_3``) computed from a shape, where the TorchScript exporter
    writes ``Constant`` nodes, and the copy its optimizer folds from a tensor made in ``forward``
    (``clone`` from ``lifted_tensor_0``) or from one of ``constants`` (those it records as constant
    tensors). They are constants in PyTorch; as weights they would train.

    A folded initializer counts when every value its ``folded_from`` record names is one the graph
    computes, a user input, a temporary of the exporter's (``val_<n>``) or a torch op's result
    (``arange``, ``zeros``: a ramp built from a shape, a recurrent layer's zero initial state), never a
    parameter (a parameter folded away, ``2.weight`` into its ``(C, 1, 1)`` form ``val_29``, is no
    longer in the graph and keeps the initializer a weight). The exporter merges equal initializers
    and keeps the first one's record, so ones read by a norm and also by a parameter's folded copy
    (``g[:, None]`` of a ``g`` made of ones) would freeze the parameter: one that several nodes read
    counts only where no parameter's folded copy can equal it, that is, where its values are not one
    value repeated (a rotary embedding's ``cos`` and ``sin`` tables), or it is a single value other
    than 0 and 1 (an attention's softmax scale ``head_dim ** -0.25``, read for the queries and the
    keys); a parameter fresh from ``ones``, ``zeros`` or a constant fill can equal the others.
    Files without these records give nothing."""
    g = model.graph
    meta = {vi.name: {p.key: p.value for p in vi.metadata_props} for vi in [*g.input, *g.value_info]}
    if not any(_FOLDED_FROM in m for m in meta.values()):
        return set()
    computed = {o for n in g.node for o in n.output if o} | \
        {vi.name for vi in g.input if meta[vi.name].get(_INPUT_KIND) == "USER_INPUT"}
    readers = collections.Counter(i for n in g.node for i in node_inputs(n))
    out = set()
    for t in g.initializer:
        record = meta.get(t.name, {}).get(_FOLDED_FROM)
        if record is None or t.data_type != onnx.TensorProto.FLOAT or not readers[t.name]:
            continue
        if readers[t.name] > 1 and _may_equal_a_fresh_parameter(t):
            continue
        try:
            sources = ast.literal_eval(record)
        except (ValueError, SyntaxError):
            continue
        if isinstance(sources, list) and \
                all(isinstance(n, str) and (n in computed or n in constants or _TEMPORARY.fullmatch(n) or
                                            _LIFTED.fullmatch(n) or _torch_op_result(n)) for n in sources):
            out.add(t.name)
    return out


def _may_equal_a_fresh_parameter(t: onnx.TensorProto) -> bool:
    """Whether a folded initializer could be a merge of a constant with a parameter's folded copy:
    one value repeated (a parameter made by ``ones``, ``zeros`` or a fill), or a single 0 or 1."""
    try:
        values = numpy_helper.to_array(t)
    except Exception:  # noqa: BLE001 - data it cannot read here (external): left a weight, as before
        return True
    if values.size == 0 or not np.all(values == values.flat[0]):
        return False
    return values.size > 1 or float(values.flat[0]) in (0.0, 1.0)


def _torch_op_result(name: str) -> bool:
    """Whether ``name`` is how torch.export names a tensor op's result (``zeros``, ``div_2``), which
    no parameter is named by (a parameter folded in keeps its state_dict name in the record)."""
    match = _TORCH_OP_RESULT.fullmatch(name)
    return match is not None and match.group("op") in _TORCH_OPS


def torch_buffers(model: onnx.ModelProto) -> set[str]:
    """Initializers the dynamo exporter records as PyTorch buffers (``register_buffer``: a
    positional-encoding table, a BatchNorm's running statistics), which PyTorch does not train.
    The TorchScript exporter keeps no such record: there, nothing is known."""
    return _recorded_as(model, ("BUFFER",))


def torch_parameters(model: onnx.ModelProto) -> set[str]:
    """Initializers the dynamo exporter records as PyTorch parameters (``nn.Parameter``), which
    PyTorch trains, rank 0 included. The TorchScript exporter keeps no such record."""
    return _recorded_as(model, ("PARAMETER",))


def torch_tensors(model: onnx.ModelProto) -> set[str]:
    """Initializers the dynamo exporter records as a PyTorch parameter, buffer or constant tensor: an ``Identity``
    of one (``p.clone()``, a full-length slice ``pos[:, :T]`` named ``alias``) reads that very
    tensor, as PyTorch's gradient does. The TorchScript exporter keeps no such record."""
    return _recorded_as(model, ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"))


def _recorded_as(model: onnx.ModelProto, kinds) -> set[str]:
    g = model.graph
    inits = {t.name for t in g.initializer}
    return {vi.name for vi in [*g.input, *g.value_info] if vi.name in inits
            and any(p.key == _INPUT_KIND and p.value in kinds for p in vi.metadata_props)}


def reassign_roles(fg: ForwardGraph, trainable=None, frozen=None, unreached=None) -> ForwardGraph:
    """Apply ``trainable=``/``frozen=`` name patterns to a forward graph's weights.

    ``trainable`` given: only matching weights train (others are frozen). ``frozen``: matching
    weights do not train. Buffers (running statistics) keep their role. ``unreached``: float
    initializers kept as constants, ``{name: why}``, named with the reason when a pattern
    picks one.
    """
    t, f = _patterns(trainable, "trainable"), _patterns(frozen, "frozen")
    both = sorted(set(t or ()) & set(f or ()))
    if both:  # (a glob in one and names in the other, trainable=["*"], frozen=["conv1.*"], is the usual form)
        raise OrtrainError(f"trainable= and frozen= both list {', '.join(map(repr, both))}; list "
                           f"{'it' if len(both) == 1 else 'them'} in one of the two")
    names = [p.name for p in fg.params]
    unreached = unreached or {}
    for pats, arg in ((t, "trainable"), (f, "frozen")):
        for pat in pats or ():
            constant = next(iter(picked(unreached, pat)), None)
            if arg == "trainable" and constant is not None and not picked(names, pat):
                raise OrtrainError(f"trainable: {constant!r} is a constant, not a weight: {unreached[constant]}; "
                                   "remove it from trainable=")
            if arg == "frozen" and constant is not None:
                continue  # a constant is frozen already
            if not picked(names, pat):
                shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
                shown = f"weights are {shown}" if names else "the model has no weights"
                constants = [o for n in fg.proto.graph.node if n.op_type == "Constant" for o in n.output]
                if picked(constants, pat):
                    raise OrtrainError(
                        f"{arg}: {picked(constants, pat)[0]!r} is the output of a Constant node, which stays a constant "
                        f"({shown}); to train it, write its value as an initializer of the model "
                        "(graph.initializer) and remove the Constant node")
                raise OrtrainError(f"{arg}: {pat!r} matches no weight; {shown}")
            buffers = {p.name for p in fg.params if p.role == "buffer"}
            if arg == "trainable" and set(picked(names, pat)) <= buffers:
                raise OrtrainError(f"trainable: {pat!r} names only running statistics ({', '.join(picked(names, pat))}), "
                                   "which training steps move and no optimizer trains; name the weights to train "
                                   "(a batch norm's statistics stay fixed with frozen=)")
    params = []
    in_t = _picked_by(t, names) if t is not None else None
    in_f = _picked_by(f, names) if f is not None else set()
    for p in fg.params:
        role = p.role
        if role != "buffer":
            # a PyTorch buffer (frozen on import) trains only where trainable= names it
            role = "frozen" if role == "frozen" and not (in_t is not None and p.name in in_t) else "trainable"
            if (in_t is not None and p.name not in in_t) or p.name in in_f:
                role = "frozen"
        params.append(ParamSpec(p.name, p.shape, p.dtype, role))
    return ForwardGraph(fg.proto, tuple(params), fg.weights)


# -- classification ---------------------------------------------------------------------------

def _to_array(t: onnx.TensorProto) -> np.ndarray:
    try:
        return numpy_helper.to_array(t)
    except Exception as exc:
        raise OrtrainError(f"from_onnx: initializer {t.name!r} cannot be read ({exc}); the file is damaged") from exc


def _untie_identities(model: onnx.ModelProto, stash: dict[str, np.ndarray],
                      tensors_of_torch: set[str] = frozenset()) -> dict[str, str]:
    """Give every ``Identity(initializer)`` output an initializer of its own (in place); returns the new
    names, each with the tensor it copies. An ``Identity`` the dynamo exporter records as ``clone``
    or ``alias`` (a full-length slice) of a PyTorch parameter or buffer (``tensors_of_torch``) is
    that tensor: its readers read the tensor itself, which keeps its PyTorch name.

    torch's TorchScript exporter writes ``Identity(kept)`` for a *distinct* parameter or buffer
    whose tensor it merged into ``kept`` (``DeduplicateInitializers``: equal values in an eval
    export, e.g. a fresh batch norm's running variance and its gamma, both ones; in any mode,
    distinct ``Parameter`` objects over one storage, a rare construction). A parameter
    genuinely tied in PyTorch (one ``Parameter`` used twice) is written once and read
    directly, never through ``Identity``. So each ``Identity`` output is a tensor of its own:
    it gets a copy of the value under its name and is classified like any initializer.
    Chains resolve in graph order; an ``Identity`` that writes a graph output stays.

    One case reads the same but is a tie: with constant folding, a weight PyTorch uses twice in
    a transposed form (one ``Linear`` applied to two 3-D inputs) is folded once per use, and the
    equal folded tensors are merged through ``Identity``. Matrices split this way that a
    ``MatMul`` reads are named in a warning (vectors are the batch-norm and bias merges above,
    and a weight ``Gemm`` or ``Conv`` reads is a layer's own: neither is a tie).
    """
    g = model.graph
    tensors = {t.name: t for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    kept, matrices = [], []
    copies: dict[str, str] = {}
    # folded transposed weights are read by MatMul; a layer's own weight (Gemm, Conv) is never a tie
    matmul_reads = {i for n in g.node if n.op_type == "MatMul" for i in n.input}
    readers: dict[str, int] = {}
    for n in g.node:
        for name in set(node_inputs(n)):
            readers[name] = readers.get(name, 0) + 1
    aliases: dict[str, str] = {}
    for node in g.node:
        src = node.input[0] if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.input else ""
        src = aliases.get(src, src)
        out = node.output[0] if node.output else ""
        if not out or out in graph_outputs or (src not in tensors and src not in stash):
            kept.append(node)
            continue
        if src in tensors_of_torch and (_same_tensor_in_torch(node) or _statistics_after_a_batch_norm(node)):
            aliases[out] = src
            continue
        if src in tensors and readers.get(src) == 1 and src not in graph_outputs and src not in tensors_of_torch:
            # read through this Identity alone (TensorFlow's ``W/read``): no other tensor shares it, and
            # the weight keeps its own name
            aliases[out] = src
            continue
        if src in tensors:
            tensors[out] = copy.deepcopy(tensors[src])
            tensors[out].name = out
            g.initializer.append(tensors[out])
            rank = len(tensors[src].dims)
        else:
            stash[out] = stash[src].copy()
            rank = stash[src].ndim
        copies[out] = src
        if rank >= 2 and out in matmul_reads:
            matrices.append((src, out))
    if matrices:
        pairs = ", ".join(f"{a!r} and {b!r}" for a, b in matrices[:4]) + (", ..." if len(matrices) > 4 else "")
        warn(f"from_onnx: the file merges equal weights through Identity ({pairs}); each trains as a weight of "
             "its own, as the layers PyTorch clones do. If they are one weight shared in the model, export "
             "with do_constant_folding=False so the file keeps the sharing", UserWarning)
    if copies or aliases:
        del g.node[:]
        g.node.extend(kept)
        info = [vi for vi in g.value_info if vi.name not in set(copies) | set(aliases)]
        del g.value_info[:]
        g.value_info.extend(info)
    if aliases:
        for node in all_nodes(g):
            for i, name in enumerate(node.input):
                if name in aliases:
                    node.input[i] = aliases[name]
    return copies


# The dynamo exporter's record of the PyTorch op a node comes from (``namespace``: "...: aten.clone.default").
_TORCH_OP = "namespace"
_SAME_TENSOR_OPS = ("aten.clone.default", "aten.alias.default")  # the gradient flows to the tensor itself


def _same_tensor_in_torch(node: onnx.NodeProto) -> bool:
    """Whether the dynamo exporter records ``node`` (an ``Identity``) as ``clone`` or ``alias``, which
    PyTorch differentiates into the tensor itself; ``detach`` (the same ``Identity``) stops the
    gradient, which the runtime cannot, so it keeps a copy of its own as before."""
    op = next((p.value for p in node.metadata_props if p.key == _TORCH_OP), "")
    return op.endswith(_SAME_TENSOR_OPS)


_FX_NODE = "pkg.torch.onnx.fx_node"  # the dynamo exporter's record of the FX node a node comes from


def _statistics_after_a_batch_norm(node: onnx.NodeProto) -> bool:
    """Whether ``node`` (an ``Identity`` of a running statistic) is what the dynamo exporter writes for
    the statistics a training-mode batch norm leaves (``_native_batch_norm_legit_functional``'s
    new running mean and variance): a second call of the same batch norm (one backbone over two
    inputs) reads them, which are the buffer itself once the first call has updated it."""
    fx = next((p.value for p in node.metadata_props if p.key == _FX_NODE), "")
    return "native_batch_norm" in fx


def _uses(model: onnx.ModelProto) -> tuple[set[str], set[str], set[str]]:
    """(names read at all, subgraphs included; names a gradient from the outputs reaches;
    batch-norm running statistics)."""
    used = {o.name for o in model.graph.output}
    buffers = set()
    for node in model.graph.node:
        used.update(node_inputs(node))
        if node.op_type == "BatchNormalization" and len(node.input) >= 5:
            buffers.update(node.input[3:5])
    return used, gradient_reach(model), buffers


_QUANTIZE = ("QuantizeLinear", "DynamicQuantizeLinear")  # ops whose output is integers


def _reached_through_quantize(model: onnx.ModelProto, differentiable: set[str]) -> dict[str, tuple[str, str]]:
    """The values a gradient from the outputs would reach only through a quantizing op's integer
    output, each to the first such node it crosses: its name, and its op type."""
    nodes = model.graph.node
    if not any(n.op_type in _QUANTIZE for n in nodes):
        return {}
    crossed = {}
    through = gradient_reach(model, straight_through=_QUANTIZE, crossed=crossed) - differentiable
    return {name: (f"{nodes[i].name or f'{nodes[i].op_type}#{i}'!r} ({nodes[i].op_type})", nodes[i].op_type)
            for name, i in crossed.items() if name in through}


def _finite(a: np.ndarray) -> bool:
    """Whether every value is finite. An inf or NaN makes the sum inf or NaN, and summing is cheaper
    than a mask of the whole array; only a sum that overflowed needs the exact look."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(a.sum()) or np.isfinite(a).all())


def _trainable_scalars(model: onnx.ModelProto, values: dict, differentiable: set[str], parameters: set[str],
                       trainable=None, frozen=None) -> tuple[set[str], dict[str, str]]:
    """Rank-0 float32 initializers that train: those named exactly in ``trainable=`` (globs never
    pick formula constants), and the PyTorch parameters the dynamo exporter records as such
    (``parameters``: ``nn.Parameter(torch.tensor(1.5))``, a learnt temperature) unless
    ``trainable=`` leaves them out. Such a parameter stays a constant, with a warning, where it is
    read inside a control-flow subgraph (onnxruntime-training differentiates no ``If``, ``Loop`` or
    ``Scan``), where no gradient reaches it (a ``Pow``'s exponent), or where it is read more than
    once: the exporter's optimizer merges a scalar parameter with the constants of equal value (the
    0.5 of ``* 0.5`` beside a parameter of 0.5 reads the parameter, ``Where(c, p, 0.5)`` becomes
    ``Where(c, p, p)``). Returns those that train, and the parameters kept constant with the reason."""
    pats = _patterns(trainable, "trainable")
    reads = collections.Counter(i for n in model.graph.node for i in n.input if i)  # every input slot
    nested = {i for n in model.graph.node for i in subgraph_reads(n)}
    out, kept = set(), {}
    for name, value in values.items():
        tensor = isinstance(value, onnx.TensorProto)
        if len(value.dims) if tensor else value.ndim:
            continue
        named = pats is not None and name in pats
        if not named and (name not in parameters or (pats is not None and not _picked_by(pats, [name])) or
                          not (reads[name] or name in nested)):  # (read by none: a detach() reads its own copy)
            continue
        if not (value.data_type == onnx.TensorProto.FLOAT if tensor else value.dtype == np.float32):
            if named:
                raise OrtrainError(f"trainable: {name!r} is a scalar constant that cannot train: it is not float32; "
                                   "remove it from trainable=")
            continue
        finite = _finite(_to_array(value) if tensor else value)
        if named and name not in differentiable:
            raise OrtrainError(f"trainable: {name!r} is a scalar constant that cannot train: {SCALAR_NO_GRADIENT}; "
                               "remove it from trainable=")
        if named and not finite:
            raise OrtrainError(f"trainable: {name!r} is a constant, not a weight: {NON_FINITE}; remove it from "
                               "trainable=")
        if named or (finite and name in differentiable and name not in nested and reads[name] == 1):
            out.add(name)
        elif finite:
            kept[name] = (SCALAR_IN_SUBGRAPH if name in nested else SCALAR_NO_GRADIENT if name not in differentiable
                          else SHARED_SCALAR.format(reads=reads[name]))
    told = [n for n in kept if not _picked_by(_patterns(frozen, "frozen") or (), [n])]
    if told:
        listed = "; ".join(f"{n!r}: {kept[n]}" for n in told[:5]) + ("; ..." if len(told) > 5 else "")
        warn(f"from_onnx: PyTorch's 0-d parameter{'s' if len(told) > 1 else ''} stay{'' if len(told) > 1 else 's'} "
             f"constant ({listed}), where PyTorch trains {'them' if len(told) > 1 else 'it'}; frozen= naming "
             f"{'them' if len(told) > 1 else 'it'} silences this", UserWarning)
    return out, kept


def canonical_forward(model: onnx.ModelProto, trainable=None, frozen=None,
                      stash: dict[str, np.ndarray] | None = None, order: list[str] | None = None,
                      folded: dict[str, str] | None = None, buffers: set[str] = frozenset(),
                      tensors_of_torch: set[str] = frozenset(), parameters: set[str] = frozenset()) -> ForwardGraph:
    """Classify initializers and move the weights to graph inputs.

    First every ``Identity(initializer)`` output becomes an initializer of its own, a copy
    of the value under the ``Identity`` output's name (see ``_untie_identities``): torch's
    eval-mode export writes a fresh batch norm's running variance as ``Identity(gamma)`` and
    two zero biases as one, though PyTorch trains them apart. Then float32 initializers of
    rank >= 1 are weights (trainable unless frozen) when a gradient from the outputs reaches
    them (:func:`~ortrain.graph.gradient_ops.gradient_reach`: not through integer or boolean
    values, such as a causal mask read through ``Equal``) and every value is finite (an additive
    mask of 0 and -inf is a constant: a step would spread NaN from it); the running statistics
    of BatchNormalization nodes (inputs 3 and 4, found by position) are buffers; everything
    else (scalars, integers, shapes, exponents, ratios) stays a constant. A float32 scalar becomes a trainable weight only when
    ``trainable=`` names it exactly and a gradient reaches it: exporters write arithmetic
    constants (GELU's 0.5 and 1/sqrt(2)) as scalar initializers, and training those
    would change the formula, so neither the default nor a glob such as ``"*"`` picks them; the
    exception is a PyTorch parameter (``parameters``, :func:`torch_parameters`), see :func:`_trainable_scalars`.
    Such a weight has shape (1,), read through a ``Reshape`` to rank 0 (``repairs.read_as_scalars``).
    Initializers nothing reads (subgraphs of ``Loop`` or ``If`` included) are dropped. ``stash`` holds initializers already taken out
    of the graph (see ``_stash_weights``); they are classified the same way. Weights come in
    PyTorch's ``state_dict`` order where the names tell it: ``order`` (names, by default the
    graph's initializer order) with the copies put back in place (:func:`_with_copies_in_place`)
    and each module's weights together (:func:`_by_module`). ``folded``: initializers that stay
    constants whatever reaches them, each with the reason (:func:`torch_constants`). ``buffers``: PyTorch buffers
    (:func:`torch_buffers`), frozen unless ``trainable=`` names them (running statistics stay
    buffers). ``tensors_of_torch``: PyTorch's parameters and buffers (:func:`torch_tensors`), which an
    ``Identity`` reads as they are.
    """
    model = copy.deepcopy(model)
    folded = folded or {}
    stash = dict(stash or {})
    first = list(order) if order else [t.name for t in model.graph.initializer] + list(stash)
    copies = _untie_identities(model, stash, tensors_of_torch)
    # a copy of a constant (the Identity of a detach) is that constant
    folded = dict(folded)
    for out, src in copies.items():  # (in graph order: a copy of a copy too)
        if src in folded:
            folded[out] = folded[src]
    used, differentiable, bn_stats = _uses(model)
    quantized = _reached_through_quantize(model, differentiable)
    inits = [t.name for t in model.graph.initializer]
    # IR 3 files list initializers among the graph inputs too.
    keep_inputs = [vi for vi in model.graph.input if vi.name not in set(inits) and vi.name not in stash]
    del model.graph.input[:]
    model.graph.input.extend(keep_inputs)
    params, weights, constants, unreached, several, other_floats = [], {}, [], {}, set(), []
    # weights a QuantizeLinear keeps constant are told of from opset 21 (below, training refuses the
    # model), those a DynamicQuantizeLinear keeps at any opset
    told = ("QuantizeLinear", "DynamicQuantizeLinear") if default_opset(model) >= 21 else ("DynamicQuantizeLinear",)
    before_quantized = []
    values = {t.name: t for t in model.graph.initializer} | stash
    scalars, kept = _trainable_scalars(model, values, differentiable, parameters, trainable, frozen)
    unreached.update(kept)
    for name, value in values.items():
        if name not in used:
            continue
        tensor = isinstance(value, onnx.TensorProto)
        is_float = value.data_type == onnx.TensorProto.FLOAT if tensor else value.dtype == np.float32
        rank = len(value.dims) if tensor else value.ndim
        if name in folded and name not in scalars:
            constants.append(value if tensor else numpy_helper.from_array(value, name))
            unreached[name] = folded[name]
            continue
        if name in scalars or (is_float and rank >= 1 and (name in bn_stats or name in differentiable)):
            arr = np.ascontiguousarray(_to_array(value) if tensor else value, dtype=np.float32)  # a scalar: (1,)
            if name in bn_stats or name in scalars or _finite(arr):
                role = "buffer" if name in bn_stats else "frozen" if name in buffers else "trainable"
                params.append(ParamSpec(name, tuple(arr.shape), np.dtype(np.float32), role))
                weights[name] = arr
                continue
            unreached[name] = NON_FINITE  # an additive mask: a step would spread NaN through every weight
            constants.append(value if tensor else numpy_helper.from_array(value, name))
        else:
            constants.append(value if tensor else numpy_helper.from_array(value, name))
            other = None if is_float or rank < 1 or name not in differentiable else _other_float(value)
            if other:
                unreached[name] = OTHER_FLOAT.format(dtype=other)
                other_floats.append((name, other))
            size = int(np.prod(value.dims if tensor else value.shape))
            if is_float and rank >= 1 and name in quantized:
                unreached[name] = QUANTIZED.format(node=quantized[name][0])
                if quantized[name][1] in told and size > 1:  # (one value: a constant's form, not a weight's)
                    before_quantized.append(name)
            elif is_float and rank >= 1:
                unreached[name] = NO_GRADIENT
                if size > 1:
                    several.add(name)
    if other_floats:
        kinds = sorted({kind for _, kind in other_floats})
        shown = ", ".join(repr(n) for n, _ in other_floats[:5]) + (", ..." if len(other_floats) > 5 else "")
        warn(f"from_onnx: {len(other_floats)} {'/'.join(kinds)} initializer{'s' if len(other_floats) > 1 else ''} "
             f"a gradient reaches ({shown}) stay{'s' if len(other_floats) == 1 else ''} constant: ortrain trains "
             "float32 weights only; export the model in float32 to train them (in PyTorch, model.float() before "
             "torch.onnx.export)", UserWarning)
    # (a pattern that names an initializer exactly names that one only, as frozen= reads it)
    named = [n for n in values if n in used]
    frozen_names = {n for pat in _patterns(frozen, "frozen") or () for n in picked(named, pat)}
    held = [name for name in before_quantized if name not in frozen_names]
    if held and trainable is None:
        nodes = sorted({quantized[name][0] for name in held})
        warn(f"from_onnx: {len(held)} float32 initializer{'s' if len(held) > 1 else ''} before quantized activations "
             f"({', '.join(map(repr, held[:5]))}{', ...' if len(held) > 5 else ''}) stay{'s' if len(held) == 1 else ''} "
             f"constant: a gradient would cross {', '.join(nodes[:3])}{', ...' if len(nodes) > 3 else ''}, whose "
             "integers onnxruntime-training does not differentiate, so only the weights after the last one train; "
             "train the float model, then quantize it (name the weights after it in trainable= or these in frozen= "
             "to silence this)", UserWarning)
    # an exponent of several values is a parameter's form (exporters write constant exponents as one value)
    exponents = sorted(several & _exponent_sources(model))
    if exponents:
        warn(f"from_onnx: {', '.join(map(repr, exponents))} {'is' if len(exponents) == 1 else 'are'} read only "
             "as (or into) Pow's exponent, which onnxruntime-training does not differentiate, so "
             f"{'it stays a constant' if len(exponents) == 1 else 'they stay constants'} (PyTorch would "
             "train a parameter there)", UserWarning)
    placed = _by_module(model, _with_copies_in_place(model, first, copies), buffers)
    rank = {name: i for i, name in enumerate(placed)}
    params.sort(key=lambda p: rank.get(p.name, len(rank)))
    del model.graph.initializer[:]
    model.graph.initializer.extend(constants)
    read_as_scalars(model, sorted(scalars))
    model.graph.input.extend(onnx.helper.make_tensor_value_info(p.name, onnx.TensorProto.FLOAT, list(p.shape))
                             for p in params)
    fg = ForwardGraph(model, tuple(params), weights)
    return reassign_roles(fg, trainable, frozen, unreached) if (trainable is not None or frozen is not None) else fg


def _with_copies_in_place(model: onnx.ModelProto, first: list[str], copies: dict[str, str]) -> list[str]:
    """``first`` (the file's initializer order: PyTorch's ``state_dict`` order for the TorchScript
    exporter; :func:`_by_module` then regroups the dynamo exporter's) with each Identity
    copy put back in its place, so ``set_weights`` takes a ``state_dict``'s values in order.

    A copy named like other weights of its module (``b.bias`` beside ``b.weight``) goes among them,
    by the input slot the graph reads each through (scale, bias, running mean, running variance):
    a fresh BatchNorm's running variance, written as ``Identity(gamma)``, follows its running mean.
    The copies of a module with no other weight go together before the first weight the graph
    reads after them, but never before the module of a tensor they copy: the exporter keeps the
    first of equal tensors in ``state_dict`` order and writes the later ones as its copies.
    """
    if not copies:
        return first
    read = _first_reads(model)

    def root(name: str) -> str:
        while name in copies:
            name = copies[name]
        return name

    out, alone = list(first), {}
    for name in sorted(copies, key=read):
        kin = [i for i, n in enumerate(out) if _module(n) is not None and _module(n) == _module(name)]
        if kin:
            before = [i for i in kin if read(out[i]) < read(name)]
            out.insert(before[-1] + 1 if before else kin[0], name)
        else:
            alone.setdefault(_module(name) or name, []).append(name)
    for group in sorted(alone.values(), key=lambda g: read(g[0])):
        at = next((i for i, n in enumerate(out) if read(n) > read(group[0])), len(out))
        for name in group:
            source = root(name)
            if source in out:  # after the whole module of the tensor it copies
                same = [i for i, n in enumerate(out) if n == source or
                        (_module(n) is not None and _module(n) == _module(source))]
                at = max(at, same[-1] + 1)
        out[at:at] = group
    return out


def _module(name: str) -> str | None:
    """The module path of a PyTorch weight name (``layer1.0.bn1`` of ``layer1.0.bn1.weight``)."""
    return name.rsplit(".", 1)[0] if "." in name else None


def _first_reads(model: onnx.ModelProto):
    """``read(name)``: where the graph first reads ``name``, (node index, input slot); after every
    node for a name it does not read."""
    reads: dict[str, tuple[int, int]] = {}
    for i, node in enumerate(model.graph.node):
        for slot, name in enumerate(node.input):
            reads.setdefault(name, (i, slot))
    end = (len(model.graph.node), 0)
    return lambda name: reads.get(name, end)


def _by_module(model: onnx.ModelProto, order: list[str], buffers: set[str] = frozenset()) -> list[str]:
    """``order`` with each module's weights together, in PyTorch's ``state_dict`` order. The
    dynamo exporter lists every parameter, then every buffer (``buffers``: a BatchNorm's running
    statistics, a positional-encoding table), so a module's group sits where it first appears,
    and a module of buffers alone where the graph first reads it among the others. Names without
    a module path are the top module's, which ``state_dict`` lists first; an exporter's anonymous
    ``onnx::`` names stay where they are."""
    groups: dict[str, list[str]] = {}
    for name in order:
        key = "\0" + name if name.startswith("onnx::") else _module(name) or ""
        groups.setdefault(key, []).append(name)
    if "" in groups:  # the top module's own weights first
        groups = {"": groups.pop(""), **groups}
    alone = [k for k, names in groups.items() if k and all(n in buffers for n in names)]
    if alone:
        read = _first_reads(model)

        def first_read(key: str) -> tuple[int, int]:
            return min(read(n) for n in groups[key])
        keys = [k for k in groups if k not in alone]
        for key in sorted(alone, key=first_read):
            at = next((i for i, k in enumerate(keys) if k and first_read(k) > first_read(key)), len(keys))
            keys.insert(at, key)
        groups = {k: groups[k] for k in keys}
    return [name for names in groups.values() for name in names]


# Float inputs whose gradient onnxruntime-training leaves out, where PyTorch (a tensor bound of
# ``clamp``, an exponent) would compute one: Clip's bounds, Pad's value, Pow's exponent.
_UNDIFFERENTIATED_VALUES = {"Clip": (1, 2), "Pad": (2,), "Pow": (1,)}


_NORMS = ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization")


def _normal_epsilons(proto: onnx.ModelProto) -> None:
    """A normalization's ``epsilon`` between 0 and the smallest normal float32 (``eps=1e-40``) is
    flushed to 0 in ortrain's sessions, where a constant feature then divides 0 by 0 (NaN) and
    PyTorch's subnormal arithmetic stays finite: it is raised to the smallest normal float32,
    1.18e-38, which changes no output that is not NaN, with a warning."""
    raised = []
    for node in proto.graph.node:
        if node.op_type in _NORMS and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "epsilon" and 0 < a.f < FLOAT32_TINY:
                    raised.append(f"{node.name or node.output[0]!r} ({a.f:.3g})")
                    a.f = FLOAT32_TINY
    if raised:
        warn(f"the epsilon of {', '.join(raised)} lies below the smallest normal float32, which ortrain's "
             "sessions flush to 0 (a constant feature would give NaN): it is raised to 1.18e-38")


def _warn_still_statistics(proto: onnx.ModelProto, frozen) -> None:
    """A ``BatchNormalization`` of ``momentum`` 1 keeps its running statistics as they are in
    training. That is what PyTorch writes for ``BatchNorm(momentum=None)`` (a cumulative average,
    which ONNX cannot state) in an eval-mode export, where the user expects them to move; not said
    of statistics ``frozen`` names (kept by choice)."""
    kept = _picked_by(_patterns(frozen, "frozen") or [], [i for n in proto.graph.node for i in n.input[3:5]])
    still = [repr(n.name or n.output[0]) for n in proto.graph.node
             if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")
             and any(a.name == "momentum" and a.f == 1.0 for a in n.attribute)
             and not kept.intersection(n.input[3:5])]  # freezing either keeps both
    if still:
        warn(f"from_onnx: batch norm {', '.join(still)} {'has' if len(still) == 1 else 'have'} momentum 1: "
             "running statistics that stay as they are in training (PyTorch's BatchNorm(momentum=None), a "
             "cumulative average ONNX cannot state, is exported so). For statistics that move, export the "
             "model with a momentum (PyTorch's momentum=0.1 is ONNX's 0.9)")


def _warn_computed_statistics(proto: onnx.ModelProto) -> None:
    """A ``BatchNormalization`` (of inference form) whose running mean or variance the graph computes
    from its buffers, instead of reading them: PyTorch's ``InstanceNorm(track_running_stats=True)``,
    which the dynamo exporter writes as a batch norm over statistics tiled once per sample. Training
    computes the batch's statistics as PyTorch does, but nothing can write the computed values back
    into the buffers, so they stay as they are where PyTorch's move."""
    g = proto.graph
    held = {t.name for t in g.initializer} | {i.name for i in g.input}
    producers = {o: n for n in g.node for o in n.output}

    def computed(name: str) -> bool:
        node = producers.get(name)
        while node is not None and node.op_type == "Identity":  # a fresh batch norm's Identity(gamma)
            node = producers.get(node.input[0])
        return node is not None and node.op_type != "Constant" and name not in held

    found = [repr(n.name or n.output[0]) for n in g.node if n.op_type == "BatchNormalization"
             and n.domain in ("", "ai.onnx") and len(n.output) == 1 and any(computed(i) for i in n.input[3:5] if i)]
    if found:
        warn(f"from_onnx: batch norm {', '.join(found)} {'reads its' if len(found) == 1 else 'read their'} running "
             "statistics computed in the graph from the buffers (as the dynamo exporter writes PyTorch's "
             "InstanceNorm(track_running_stats=True)): training uses the batch's statistics as PyTorch does, but the "
             "buffers stay as they are, where PyTorch's move, so predictions after training differ. Export "
             "InstanceNorm with track_running_stats=False (each sample's own statistics, in training and prediction "
             "alike) for predictions that follow training")


def _warn_partial_gradients(fg: ForwardGraph) -> None:
    """Warn of trainable weights also read into an input whose gradient the runtime leaves out
    (a learned clipping bound that also scales, PACT's): their gradient counts their other uses
    only. Read only there, a weight is no weight at all (a constant, see canonical_forward)."""
    targets = {n.input[i] for n in fg.proto.graph.node for i in _UNDIFFERENTIATED_VALUES.get(n.op_type, ())
               if i < len(n.input) and n.input[i]}
    if not targets:
        return
    partial = sorted(set(fg.names("trainable")) & gradient_reach(fg.proto, targets))
    if partial:
        warn(f"from_onnx: {', '.join(map(repr, partial))} {'is' if len(partial) == 1 else 'are'} also read into "
             "Clip's bounds, Pad's value or Pow's exponent, where onnxruntime-training computes no gradient: "
             "the gradient counts the other uses only (PyTorch's would count these too). Freeze "
             f"{'it' if len(partial) == 1 else 'them'} (frozen=[...]) or make the bound a constant", UserWarning)


def _exponent_sources(model: onnx.ModelProto) -> set[str]:
    """The values a ``Pow`` exponent is computed from, itself included: ``base ** (x @ W)`` reads
    ``W`` into the exponent."""
    exponents = {n.input[1] for n in model.graph.node if n.op_type == "Pow" and len(n.input) > 1}
    return gradient_reach(model, exponents) if exponents else set()


STASH_MIN_ELEMENTS = 1024


def _stash_weights(model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], list[str]]:
    """Take large float initializers out of ``model`` (in place) as typed graph inputs.

    Converting, repairing, checking and shape inference then handle a graph of kilobytes
    instead of copying and serializing every weight several times (AlexNet: 240 MB).
    Small tensors stay: converters may need the values of scales and the like.
    Returns the stashed arrays and the original initializer order.
    """
    g = model.graph
    order = [t.name for t in g.initializer]
    big = [t for t in g.initializer
           if t.data_type == onnx.TensorProto.FLOAT and t.dims and np.prod(t.dims) >= STASH_MIN_ELEMENTS]
    if not big:
        return {}, order
    stash = {t.name: _to_array(t) for t in big}
    keep = [t for t in g.initializer if t.name not in stash]
    del g.initializer[:]
    g.initializer.extend(keep)
    listed = {vi.name for vi in g.input}
    g.input.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(a.shape))
                   for n, a in stash.items() if n not in listed)
    return stash, order


# -- inputs -----------------------------------------------------------------------------------

def _select_inputs(model: onnx.ModelProto, input_names, stash: dict) -> tuple[onnx.ModelProto, list[str]]:
    """Graph inputs reduced to the data inputs (in order) and the stashed weights; returns the model
    and the data input names. A stashed weight the caller feeds leaves the stash."""
    inits = {t.name for t in model.graph.initializer} | set(stash)
    graph_inputs = [vi.name for vi in model.graph.input]
    if input_names is None:
        data = [n for n in graph_inputs if n not in inits]
    else:
        try:  # a list, a tuple, dict keys, an array of names; not a set, which has no order
            data = [input_names] if isinstance(input_names, str) else \
                None if isinstance(input_names, (set, frozenset)) else list(input_names)
        except TypeError:
            data = None
        if data is None:
            raise OrtrainError(f"input_names: expected a list of graph input names in the order to feed them, "
                               f"received {input_names!r}")
        if not data or not all(isinstance(n, str) for n in data) or len(set(data)) != len(data):
            raise OrtrainError(f"input_names: expected distinct graph input names, received {input_names!r}")
        unknown = [n for n in data if n not in graph_inputs]
        if unknown:
            raise OrtrainError(f"input_names: {unknown} are not inputs of the graph; its inputs are "
                               f"{[n for n in graph_inputs if n not in inits] or graph_inputs}")
        unfed = [n for n in graph_inputs if n not in inits and n not in data]
        if unfed:
            raise OrtrainError(f"input_names: graph inputs {unfed} have no initializer and are not listed, so "
                               f"nothing would feed them; add them to input_names={data + unfed}")
    if not data:
        raise OrtrainError("from_onnx: the model has no data inputs (every graph input has an initializer); "
                           "name the inputs to feed with input_names=[...]")
    out = copy.deepcopy(model)
    by_name = {vi.name: vi for vi in out.graph.input}
    drop = set(data) & inits  # an input with a default value that the caller feeds
    kept = [t for t in out.graph.initializer if t.name not in drop]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    for n in drop:
        stash.pop(n, None)
    del out.graph.input[:]
    out.graph.input.extend(by_name[n] for n in data)
    out.graph.input.extend(by_name[n] for n in stash)
    return out, data


def _check_data_inputs(model: onnx.ModelProto, data: list[str]) -> None:
    from ortrain.graph import spec_of
    for vi in model.graph.input:
        if vi.name in data:
            if not vi.type.HasField("tensor_type"):
                raise OrtrainError(f"from_onnx: input {vi.name!r} is not a tensor; ortrain feeds tensors only")
            try:
                spec_of(vi)
            except OrtrainError as exc:  # an element type ortrain cannot feed (strings, complex, float8)
                taken = "float32, float64, float16, 8- to 64-bit integers and bool"
                raise OrtrainError(f"from_onnx: input {vi.name!r}: {exc}; the inputs ortrain feeds are {taken}: "
                                   "give the model an input of one of those (cast inside it if needed)") from None
            shape = vi.type.tensor_type
            if shape.HasField("shape") and not shape.shape.dim:
                raise ShapeError(
                    f"from_onnx: input {vi.name!r} is a scalar (rank 0); ortrain feeds inputs batch first, one row "
                    f"per sample, so every input needs a batch axis. Make it a constant: an initializer of the model "
                    f"holding its value (onnx.numpy_helper.from_array(value, {vi.name!r}) in graph.initializer, "
                    f"the input removed)")


# names of a batch axis: "batch", "batch_size", and the letters of shape notations ((L, N, E),
# (T, B, C)); a later axis so named beside a first one that is not is warned about (a false alarm
# on an "N" that counts something else costs a warning, a miss a time axis shuffled)
_BATCH_NAME = re.compile(r"(?i)batch|^(n|bs|b)$")


def _warn_batch_not_first(model: onnx.ModelProto, data: list[str]) -> None:
    """Warn when an input is not batch first as far as the file tells: it names another axis than
    its first as the batch (PyTorch's sequence-first ``nn.MultiheadAttention`` exports ``[seq, batch,
    ...]``), or its first axis is fixed where another input's is free (a mixing matrix fed beside
    the batch). ortrain takes samples along the first axis of every input, so ``fit`` would shuffle
    and split it, and ``predict(batch_size=...)`` cut it."""
    firsts = {vi.name: vi.type.tensor_type.shape.dim[0] for vi in model.graph.input
              if vi.name in data and vi.type.tensor_type.shape.dim}
    free = [name for name, d in firsts.items() if not d.HasField("dim_value")]
    for name, d in firsts.items():
        if free and d.HasField("dim_value"):
            warn(f"from_onnx: input {name!r} has a fixed first axis of {d.dim_value} where {free[0]!r} has a free "
                 f"batch axis: ortrain reads every input batch first (rows are samples), so fit shuffles and "
                 f"splits the rows of {name!r} with those of {free[0]!r}. If it is no batch (a mixing matrix, a "
                 f"mask), make it a constant of the model (an initializer); if it is, export it with a dynamic "
                 f"batch axis too")
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim if vi.name in data else ()
        named = [k for k, d in enumerate(dims) if k and d.dim_param and _BATCH_NAME.search(d.dim_param)]
        if named and not (dims[0].dim_param and _BATCH_NAME.search(dims[0].dim_param)):
            first = dims[0].dim_param or dims[0].dim_value or "?"
            warn(f"from_onnx: input {vi.name!r} names axis {named[0]} {dims[named[0]].dim_param!r} and its first "
                 f"axis {first!r}: ortrain takes samples along the first axis (rows are samples), so fit, evaluate "
                 f"and predict(batch_size=...) split that axis, which cuts sequences if it is time. Export the model "
                 f"batch first (batch_first=True, or transpose the input inside the model)")


# -- the whole import -------------------------------------------------------------------------

def _check_runtime_kernels(proto: onnx.ModelProto) -> None:
    """Refuse forms whose onnxruntime 1.19.2 kernel computes garbage, which ``predict`` and the
    exported model would serve: a ``ConvTranspose`` whose ``output_padding`` reaches its stride
    (PyTorch allows it where the dilation is larger) leaves output cells unset. Recurrent layers
    laid out batch first (``layout=1``), which no onnxruntime kernel runs, are refused here too
    rather than when a session opens."""
    for i, node in enumerate(proto.graph.node):
        if node.op_type in ("LSTM", "GRU", "RNN") and attribute(node, "layout", 0) == 1:
            raise UnsupportedOpError(
                f"from_onnx: {node.op_type} node {node.name or i!r} is laid out batch first (layout=1), which "
                f"onnxruntime 1.19.2 runs neither in predictions nor in training; write it sequence first "
                f"(layout=0) with a Transpose of its input and outputs, as PyTorch exports batch_first=True")
        if node.op_type != "ConvTranspose":
            continue
        strides = list(attribute(node, "strides", []))
        padding = list(attribute(node, "output_padding", []))
        if any(op >= s for op, s in zip(padding, strides or [1] * len(padding))):
            raise UnsupportedOpError(
                f"from_onnx: ConvTranspose node {node.name or i!r} has output_padding {padding} that reaches its "
                f"strides {strides or [1] * len(padding)}; onnxruntime 1.19.2 leaves output cells of such a layer "
                f"unset, so its predictions (and those of the exported model) would be arbitrary. Give the layer "
                f"output_padding below the stride (crop or pad its output instead)")


def _check_gradients(fg: ForwardGraph) -> None:
    missing = nodes_without_gradient(fg.proto, fg.names("trainable"))
    if not missing:
        return
    listing = "; ".join(f"{op} (nodes: {', '.join(nodes)})" for op, nodes in sorted(missing.items()))
    recurrent = any(op.startswith(("LSTM ", "GRU ")) and "peepholes" not in op for op in missing)
    raise UnsupportedOpError(
        f"from_onnx: onnxruntime-training 1.19.2 cannot differentiate these nodes, which lie between trainable "
        f"weights and the output: {listing}. Freeze the weights before them "
        f"(frozen=[...] or trainable=[...] with names or glob patterns) or replace the ops in the model"
        + ("; an LSTM or GRU in such a form cannot be in a training graph even frozen (onnxruntime's training "
           "kernels run every one): export it forward-only, without sequence_lens, clip or input_forget and "
           "with the default activations, or compute its outputs with onnxruntime and train the rest on them" if recurrent else ""))


# Ops that draw random numbers, and the type of their ``seed`` attribute.
_RANDOM_OPS = {"Dropout": int, "RandomNormal": float, "RandomNormalLike": float, "RandomUniform": float,
               "RandomUniformLike": float, "Bernoulli": float, "Multinomial": float}


def _seed_random_ops(proto: onnx.ModelProto) -> None:
    """After ``ot.set_seed``, a ``Dropout`` (or another op drawing random numbers: a VAE's
    ``RandomNormalLike``, ``Bernoulli``) without a seed of its own gets one drawn from ortrain's
    generator, as ortrain's own ``Dropout`` layer does: the same seed, the same draws, run after
    run. Unseeded, it keeps none, so models that differ only in weights share cached artifacts."""
    if not _random.is_seeded():
        return
    for node in all_nodes(proto.graph):
        kind = _RANDOM_OPS.get(node.op_type)
        if kind is not None and node.domain in ("", "ai.onnx") and not any(a.name == "seed" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("seed", kind(_random.draw_seed())))


def _refuse_outputs_that_are_no_tensors(proto: onnx.ModelProto) -> None:
    """A model's outputs are tensors here; skl2onnx's classifiers end in a ``ZipMap`` (a sequence of
    maps from class to probability), which failed later as "not valid ONNX"."""
    for out in proto.graph.output:
        kind = out.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            node = next((n for n in proto.graph.node if out.name in n.output), None)
            made = f" (made by {node.op_type} node {node.name or '?'!r})" if node is not None else ""
            fix = ("export the classifier without it (skl2onnx: options={id(model): {'zipmap': False}}, or "
                   "options={'zipmap': False})" if node is not None and node.op_type == "ZipMap" else
                   "remove that output from the graph")
            raise OrtrainError(f"from_onnx: output {out.name!r}{made} is a {kind.replace('_type', '')}, not a "
                               f"tensor; ortrain trains and predicts tensors: {fix}")


def _warn_random_outside_training(proto: onnx.ModelProto) -> None:
    """Ops other than ``Dropout`` that draw random numbers draw them in every run: ortrain switches
    ``Dropout`` off in predictions, evaluation and exports, not these (a VAE's sampling means it;
    a dropout an exporter wrote as random ops, the dynamo exporter's ``Dropout2d``, does not).
    A node the outputs read draws with every random op of its subgraphs (an ``If`` branch)."""
    needed = {o.name for o in proto.graph.output}  # what the outputs read, walking back from them
    for node in reversed(proto.graph.node):
        if any(o in needed for o in node.output):
            needed.update(node_inputs(node))
    used = [n for n in proto.graph.node if any(o in needed for o in n.output)]
    used += [inner for n in used for g in subgraphs(n) for inner in all_nodes(g)]
    drawn = sorted({n.op_type for n in used
                    if n.op_type in _RANDOM_OPS and n.op_type != "Dropout" and n.domain in ("", "ai.onnx")})
    if drawn:
        warn(f"from_onnx: the model draws random numbers ({', '.join(drawn)}), and does so in predict, evaluate and "
             "the exported model too: only Dropout nodes are switched off outside training. A dropout the exporter "
             "wrote as random ops (the dynamo exporter's Dropout2d) stays on; export it as nn.Dropout, or export the "
             "model for inference from PyTorch's eval mode", UserWarning)


def _check_shapes(fg, declared: dict | None = None) -> None:
    """Shapes and types that cannot fit together (a ``MatMul`` of 4 columns into 5 rows, an int64
    tensor into a float op) are refused here, naming the node, instead of failing later in the
    runtime's gradient builder without saying where.

    Output dimensions after the batch that the file leaves free but the weights fix (a classifier
    declared ``(N, C)`` whose last layer has 3 columns) are written into the graph's outputs, so
    the loss knows the number of classes: a class label of 3 or more is then refused, where the
    fused loss would read past the row. Annotations the inputs and weights contradict are
    corrected as onnxruntime reads past them: an output declared with a fixed size where the
    inputs give it another or a free one (a batch of 1 in the file, of the input's batch when
    run), and ``value_info`` of intermediate tensors whose shapes disagree (which onnxruntime's
    training build refuses to load)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(fg.proto)
    del probe.graph.value_info[:]  # annotations of intermediate tensors may be stale; the runtime ignores them
    for out in probe.graph.output:  # so may the outputs' sizes: inferred from the inputs and weights alone
        out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:  # (ValueError: "Invalid tensor data type 33")
        reason = " ".join(str(exc).split())
        raise ShapeError(f"the model's shapes or types do not fit together: {reason}; fix the model or its "
                         "export") from None
    computed = {o.name: o.type.tensor_type for o in inferred.graph.output}
    found = {o.name: o.type.tensor_type.shape.dim for o in inferred.graph.output}
    free = {d.dim_param for vi in fg.proto.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    for out in fg.proto.graph.output:
        dims, known = out.type.tensor_type.shape.dim, found.get(out.name)
        if known is not None and len(known) != len(dims) and out.type.tensor_type.HasField("shape") and \
                computed[out.name].HasField("shape"):
            # declared (N, 1, 3), computing (N, 3): labels of the declared shape broadcast against the
            # predictions (every sample's label against every prediction); onnxruntime returns the computed
            shown = (declared or {}).get(out.name) or _dims_text(dims)  # the file's, before the batch was freed
            warn(f"from_onnx: output {out.name!r} is declared with shape {shown} but computes "
                 f"{_dims_text(known)} from the inputs and weights; the computed shape is taken, as onnxruntime "
                 "takes it")
            out.type.tensor_type.shape.CopyFrom(computed[out.name].shape)
            continue
        if known is None or len(known) != len(dims):
            continue
        for i, (d, k) in enumerate(zip(dims, known)):
            if d.HasField("dim_value") and _differs(d, k, free):  # a fixed size the inputs contradict
                d.CopyFrom(k)
            elif i > 0 and not d.HasField("dim_value") and k.HasField("dim_value"):
                d.dim_value = k.dim_value
    found = {vi.name: vi.type.tensor_type for vi in inferred.graph.value_info}
    kept = [vi for vi in fg.proto.graph.value_info if not _stale(vi.type.tensor_type, found.get(vi.name), free)]
    if len(kept) != len(fg.proto.graph.value_info):
        del fg.proto.graph.value_info[:]
        fg.proto.graph.value_info.extend(kept)


def _unique_node_names(proto: onnx.ModelProto) -> None:
    """A node named as an earlier one gets a numbered name (``name_1``): onnxruntime refuses a graph
    holding two nodes of one name, which the file's checker lets through; unnamed nodes stay so."""
    nodes = list(all_nodes(proto.graph))
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    for node in nodes:
        if not node.name:
            continue
        if node.name in seen:
            k = 1
            while f"{node.name}_{k}" in taken:
                k += 1
            node.name = f"{node.name}_{k}"
            taken.add(node.name)
        seen.add(node.name)


def _dims_text(dims) -> str:
    return "(" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) + ")"


def _differs(declared, inferred, free: set[str]) -> bool:
    """Whether a declared dimension of fixed size and an inferred one disagree: another size, or a
    size an input leaves free (its batch; not a size inference could not tell)."""
    return (inferred.HasField("dim_value") and inferred.dim_value != declared.dim_value) or \
        inferred.dim_param in free


def _stale(declared, inferred, free: set[str]) -> bool:
    """Whether a ``value_info`` annotation disagrees with what the inputs and weights give."""
    if inferred is None:
        return False
    if declared.elem_type and inferred.elem_type and declared.elem_type != inferred.elem_type:
        return True
    if not declared.HasField("shape") or not inferred.HasField("shape"):
        return False
    dims, known = declared.shape.dim, inferred.shape.dim
    return len(dims) != len(known) or any(d.HasField("dim_value") and _differs(d, k, free) for d, k in zip(dims, known))


def _rename_reserved(fg: ForwardGraph) -> None:
    """Values named as onnxruntime-training names the gradients and their buffers (``W_grad``,
    ``W_grad.accumulation.buffer``) or as ortrain names its loss inputs (``ortrain.label``) clash
    in the training graph. Intermediate ones get other names (in place: nobody reads them from
    outside); a weight or an output named as the gradient of any value is refused."""
    g = fg.proto.graph
    weights = [p.name for p in fg.params]
    values = {n for node in g.node for n in [*node.input, *node.output]} | set(weights) | {vi.name for vi in g.input}

    def clash(name: str) -> bool:
        """Whether ``name`` is the runtime's name for the gradient of a value (or its buffers)."""
        if name.startswith("ortrain.") or name == "lazy_reset_grad":
            return True
        # 'v_grad' and 'v_grad.<buffer>' for a value v; any '_grad' may end v ('a_grad_grad' is a_grad's)
        return any(name[:m.start()] in values for m in re.finditer(r"_grad(?=$|\.)", name))

    for kind, names in (("a weight", weights), ("an output", [o.name for o in g.output])):
        bad = next((n for n in names if clash(n)), None)
        if bad is not None:
            raise OrtrainError(
                f"from_onnx: {kind} of the model is named {bad!r}, a name onnxruntime-training gives a weight's "
                f"gradient (or ortrain its loss inputs); rename it in the model (with onnx, or in PyTorch before "
                f"the export)")
    outputs = {o.name for o in g.output}
    taken = values | {t.name for t in g.initializer}
    renamed = {}
    for node in g.node:
        for name in node.output:
            if name and name not in outputs and reserved_input_name(name):
                new = name.replace("_grad", "_gradient").replace("ortrain.", "ortrain_")
                while new in taken:
                    new += "_"
                taken.add(new)
                renamed[name] = new
    if renamed:
        _rename_reads(g, renamed)
        for vi in g.value_info:
            vi.name = renamed.get(vi.name, vi.name)


def _rename_reads(g: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Rename values written and read in ``g`` and read in its nodes' subgraphs."""
    for node in g.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
        for sub in subgraphs(node):
            _rename_reads(sub, renamed)


@names_unknown_arguments_of
def from_onnx(model, trainable=None, frozen=None, input_names=None, name: str | None = None):
    """Turn an ONNX model (a path, its bytes or an ``onnx.ModelProto``) into a trainable model.

    ``trainable``/``frozen``: weight names or glob patterns (``"fc.*"``); ``trainable`` given
    means only those train. ``input_names``: the graph inputs to feed, in the order
    ``predict``/``fit`` take them (default: every graph input without an initializer); the
    model's graph and ``export_onnx``'s file list its inputs in that order (onnxruntime feeds by
    name, so a session fed by name is not affected). An input with a default value (an
    initializer) that ``input_names`` lists becomes a plain input, and the exported file needs it.

    Which initializers train: float32 tensors of rank >= 1 that a gradient from the outputs
    reaches (not through integer or boolean values, such as a mask read through ``Equal``) and
    whose values are all finite (an additive mask of 0 and -inf stays a constant); batch-norm
    running statistics are buffers, which ``frozen=`` may name to keep them fixed (the batch norm
    then normalises by them in training, as a frozen Keras batch norm, not by the batch as PyTorch's
    ``requires_grad=False``; a pattern that picks them warns); other tensors the file marks as PyTorch buffers are frozen
    unless ``trainable=`` names them; scalars, integers and shapes are constants, though ``trainable=`` may name a
    float32 scalar exactly to train it (a glob such as ``"*"`` never picks one of these: exporters write
    formula constants, such as GELU's 0.5, as scalars), and a 0-d ``nn.Parameter`` that the dynamo
    exporter records as a parameter trains as in PyTorch, globs included, where one input reads it
    (read more than once, it may have been merged with equal constants; inside an ``If``, or as an
    exponent, no gradient reaches it: it stays a constant, with a warning). Initializers nothing reads are dropped.
    Weights come in PyTorch's ``state_dict`` order where the names tell it (each module's
    together), else in the file's initializer order. ``Identity(initializer)`` is a tensor of its own, not a tie: torch's
    eval-mode export writes a fresh batch norm's running variance as ``Identity(gamma)``
    (both ones) and merges equal zero biases, while a parameter PyTorch really shares is
    read directly. So each ``Identity`` output gets a copy of the value and trains, or
    tracks running statistics, apart, as the original model did.
    Raises :class:`~ortrain.OrtrainError` for files that are damaged or unsafe and
    :class:`~ortrain.UnsupportedOpError` naming every op and node without a gradient.
    """
    from ortrain.nn.base_model import checked_model_name
    from ortrain.nn.graph_model import GraphModel
    checked_model_name(name, "from_onnx")
    proto = load_untrusted(model)
    declared = {o.name: _dims_text(o.type.tensor_type.shape.dim) for o in proto.graph.output
                if o.type.tensor_type.HasField("shape")}
    _unique_node_names(proto)
    _refuse_outputs_that_are_no_tensors(proto)
    folded = torch_constants(proto)
    buffers, tensors_of_torch, parameters = torch_buffers(proto), torch_tensors(proto), torch_parameters(proto)
    stash, order = _stash_weights(proto)
    proto, _ = batchnorm_inference_form(proto)  # first: onnx's opset converter cannot take its training form
    proto = upgrade_opset(proto)
    proto, data = _select_inputs(proto, input_names, stash)
    _check_data_inputs(proto, data)
    _warn_batch_not_first(proto, data)
    proto, _ = repair(proto)
    refuse_pads_past_their_rows(proto)
    _seed_random_ops(proto)
    _warn_random_outside_training(proto)
    _normal_epsilons(proto)
    _warn_still_statistics(proto, frozen)
    _warn_computed_statistics(proto)
    proto, _ = free_batch_dimension(proto, data)
    proto, _ = free_output_dimensions(proto)
    from ortrain.engine.inference import run_model  # (the engine is only needed where inference cannot tell)
    proto, _ = free_output_batch(proto, data, run=run_model)
    check_model(proto, "imported model")
    _check_runtime_kernels(proto)
    fg = canonical_forward(proto, trainable, frozen, stash, order, folded, buffers, tensors_of_torch, parameters)
    _rename_reserved(fg)
    _check_shapes(fg, declared)
    _check_gradients(fg)
    _warn_partial_gradients(fg)
    if name is None:
        stem = os.path.splitext(os.path.basename(os.fspath(model)))[0] if isinstance(model, (str, os.PathLike)) \
            else ""
        name = stem or proto.graph.name or "onnx_model"
    return freeze_named_statistics(GraphModel(fg, name=name), frozen)


def freeze_named_statistics(model, frozen, copy: bool = False):
    """``model`` with the batch-norm running statistics that ``frozen`` names (by name or pattern)
    kept as they are, as ``model.freeze`` keeps them (a copy with ``copy``, when any is named).
    ``trainable=`` speaks of weights only: statistics it leaves out still track, as in PyTorch's
    train mode."""
    patterns = _patterns(frozen, "frozen")
    named = _picked_by(patterns or (), model.weight_names())
    stats = [p.name for p in model._base_params() if p.role == "buffer" and p.name in named]
    by_glob = [s for s in stats if s not in (patterns or ())]
    if by_glob:  # a PyTorch user freezing "layer1.*" means requires_grad=False, which keeps batch statistics
        shown = ", ".join(by_glob[:4]) + (f" and {len(by_glob) - 4} more" if len(by_glob) > 4 else "")
        warn(f"from_onnx(frozen=...): the patterns pick the running statistics {shown}: they stay as they are, "
             "and their batch norms normalise by them in training too, as a frozen Keras BatchNormalization "
             "(PyTorch's requires_grad=False keeps normalising by the batch); to freeze the weights alone, "
             "name them, e.g. 'layer1.*.weight' and 'layer1.*.bias'")
    if stats:
        model = model.copy() if copy else model
        model._freeze(stats, "from_onnx(frozen=...)")
    return model
