"""From a traced function to an ONNX forward graph.

:func:`trace` calls ``fn`` on :class:`Input` tensors, sorts the recorded nodes
topologically (iteratively: deep graphs cannot overflow the Python stack) and
emits them through :class:`GraphBuilder`. Generated names carry the ``ag/``
prefix, so they never meet the names of arguments or params; graph outputs are
``output/<key>``. Params become graph inputs, as in every :class:`ForwardGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ortrain._arrays import as_array, read_array
from ortrain._dag import post_order
from ortrain.ag.losses import check_loss
from ortrain.ag.ops import reshape
from ortrain.ag.tensor import FLOAT, INT, RECORDING, RECORDING_DEPTH, Buffer, Const, Input, Param, Tensor
from ortrain.errors import OrtrainError, ShapeError
from ortrain.graph import GraphBuilder, TensorSpec
from ortrain.graph.forward import reserved_input_name

__all__ = ["Traced", "example_inputs", "topological_order", "trace"]

LOSS = "loss"
_LABEL_OPS = ("softmax_cross_entropy_loss", "cross_entropy_loss")
_INDEXING = ("get_rows", *_LABEL_OPS)  # ops whose second input, when int64, indexes the first


@dataclass(frozen=True)
class Traced:
    """A traced function as ONNX: params are graph inputs named like the params."""

    proto: onnx.ModelProto
    inputs: tuple[TensorSpec, ...]        # every argument, in call order (fixes names, shapes, dtypes)
    used: tuple[str, ...]                 # the arguments the graph reads
    keys: tuple[str, ...]                 # output keys; "loss" first when there is a loss
    output_names: tuple[str, ...]
    params: tuple[Param, ...]             # in order of first use
    loss_params: tuple[Param, ...]        # those the loss depends on (the ones that can get a gradient)
    index_checks: tuple[tuple[str, int, str], ...]  # (argument, rows, op): indices to check per call
    returns_dict: bool
    # (rows, op, sources) of indices computed inside fn (read from a buffer, int arithmetic): the graph
    # returns their [min, max] as the last outputs (``output_names`` after the keys' ones)
    range_checks: tuple[tuple[int, str, str], ...] = ()


def example_inputs(arrays: dict, where: str) -> dict[str, np.ndarray]:
    """The first call's arguments as arrays: floats become float32, integers int64."""
    out = {}
    for name, value in arrays.items():
        a = read_array(value, f"{where}: input {name!r}")
        if a.dtype.kind == "b":
            raise ShapeError(f"{where}: input {name!r} is boolean; pass 0/1 as float32 or int64")
        dtype = INT if a.dtype.kind in "iu" else FLOAT
        out[name] = as_array(a, dtype, f"{where}: input {name!r}")
    return out


def topological_order(roots: list[Tensor]) -> list[Tensor]:
    """Every tensor the roots depend on, each after its inputs, in a deterministic order."""
    return post_order(roots, lambda t: t.inputs)


def _scalar(loss: Tensor) -> Tensor:
    # A loss of shape (1,) or (1, 1) is returned 0-d, like every loss of ag.
    return loss if loss.shape == () else reshape(loss, ())


def _outputs(result, training: bool, where: str) -> tuple[dict[str, Tensor], bool]:
    if isinstance(result, dict):
        if not result:
            raise OrtrainError(f"{where}: fn returned an empty dict")
        bad = [k for k, v in result.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
        if bad:
            raise OrtrainError(f"{where}: fn must return ag tensors keyed by str; entries {bad!r} are not")
        if training:
            if LOSS not in result:
                raise OrtrainError(f"{where}: the dict fn returned has no 'loss' entry (keys: {sorted(result)}); "
                                   "a training step needs one")
            if "grad_norm" in result:
                raise OrtrainError(f"{where}: the key 'grad_norm' is reserved for the gradient norm that "
                                   "max_grad_norm reports; rename that output")
            return {LOSS: _scalar(check_loss(result[LOSS], where)), **{k: v for k, v in result.items() if k != LOSS}}, \
                True
        return dict(result), True
    if training:
        return {LOSS: _scalar(check_loss(result, where))}, False
    if not isinstance(result, Tensor):
        raise OrtrainError(f"{where}: fn must return an ag tensor or a dict of them, received "
                           f"{type(result).__name__}")
    return {"output": result}, False


def trace(fn, arrays: dict[str, np.ndarray], training: bool, where: str) -> Traced:
    """Record ``fn(**inputs)`` with inputs shaped like ``arrays`` and emit its ONNX graph."""
    inputs = {n: Input(n, a.shape, a.dtype) for n, a in arrays.items()}
    outer = getattr(RECORDING, "where", None), getattr(RECORDING, "training", True)
    RECORDING.where, RECORDING.training = where, training
    depth = RECORDING_DEPTH[0]
    RECORDING_DEPTH[0] = depth + 1  # (under TURNS, as every recording)
    try:
        result = fn(**inputs)
    finally:
        RECORDING_DEPTH[0] = depth  # (not a decrement: a child forked inside fn starts again from 0)
        RECORDING.where, RECORDING.training = outer
    outputs, returns_dict = _outputs(result, training, where)
    order = topological_order(list(outputs.values()))

    gb = GraphBuilder(name="ortrain_ag", prefix="ag/")
    names: dict[int, str] = {}
    params: list[Param] = []
    by_name: dict[str, Tensor] = {}
    reached = {id(t) for t in order}
    used = [n for n, t in inputs.items() if id(t) in reached]
    for n in used:
        why = (_GENERATED if n.startswith(_GENERATED_PREFIXES) else None) or \
            (reserved_input_name(n) if training else None)
        if why:
            raise OrtrainError(f"{where}: argument {n!r}: {why}; give fn's argument (and the call's keyword) "
                               "another name")
        names[id(inputs[n])] = gb.add_input(n, inputs[n].dtype, inputs[n].shape)
        by_name[n] = inputs[n]
    checks, computed = [], []
    for t in order:
        if isinstance(t, Input):
            if id(t) not in names:
                raise OrtrainError(f"{where}: {t!r} is an argument of another traced call; fn must use only "
                                   "its own arguments, params and buffers")
        elif isinstance(t, Param):
            other = by_name.get(t.name)
            if other is not None:
                raise OrtrainError(f"{where}: the name {t.name!r} is used twice ({other!r} and {t!r}); give "
                                   "every param and argument of one step its own name")
            names[id(t)] = gb.add_input(t.name, t.dtype, t.shape)
            by_name[t.name] = t
            params.append(t)
        elif isinstance(t, Const):
            names[id(t)] = gb.add_initializer(gb.unique("const"), t.value)
        else:
            args = [names[id(i)] for i in t.inputs]
            # The gradient builder defines one gradient name per input: a tensor that is two inputs
            # of one op (W * W, concat([W, W])) would be defined twice, so its repeats get an Identity.
            args = [gb.op("Identity", [a]) if a in args[:k] else a for k, a in enumerate(args)]
            idx = t.inputs[1] if t.op in _INDEXING and t.inputs[1].dtype == INT else None
            if idx is not None and not isinstance(idx, (Input, Const)):
                # An index computed inside fn is checked after the run (its range is an output), but
                # Gather refuses one past the table before that output exists: it reads the index
                # clipped to the table, and the check refuses the step before any update.
                rows = t.inputs[0].shape[0] if t.op == "get_rows" else t.inputs[0].shape[-1]
                args[1] = gb.op("Clip", [args[1], gb.const(0, np.int64), gb.const(rows - 1, np.int64)])
            names[id(t)] = t._emit(gb, args)
            if idx is not None:
                rows = t.inputs[0].shape[0] if t.op == "get_rows" else t.inputs[0].shape[-1]
                if isinstance(idx, Input):
                    checks.append((idx.name, rows, t.op))
                elif not isinstance(idx, Const) and idx.size:  # constants were checked when the op was
                    # recorded; an empty index reads nothing (and the runtime's ReduceMin fails on it)
                    computed.append((names[id(idx)], rows, t.op, _sources(idx)))
    out_names = []
    for key, t in outputs.items():
        name = f"output/{key}"
        gb.op("Identity", [names[id(t)]], outputs=[name])
        gb.add_output(name, t.dtype, t.shape)
        out_names.append(name)
    for k, (idx, _, _, _) in enumerate(computed):
        # One [min, max] pair per computed index: onnxruntime's Gather reads negative indices from the
        # end and its SoftmaxCrossEntropyLoss reads past the classes, both without a word.
        ends = [gb.op(op, [gb.op("Reshape", [idx, gb.const([-1], np.int64)])], keepdims=1) for op in
                ("ReduceMin", "ReduceMax")]
        gb.op("Concat", ends, outputs=[f"ag/range/{k}"], axis=0)
        out_names.append(gb.add_output(f"ag/range/{k}", INT, (2,)))
    reach = {id(t) for t in topological_order([outputs[LOSS]])} if training else set()
    proto = gb.to_model(doc="traced by ortrain.ag")
    specs = tuple(TensorSpec(n, a.dtype, a.shape) for n, a in arrays.items())
    return Traced(proto, specs, tuple(used), tuple(outputs), tuple(out_names), tuple(params),
                  tuple(p for p in params if id(p) in reach), tuple(checks), returns_dict,
                  tuple(c[1:] for c in computed))


_GENERATED_PREFIXES = ("ag/", "output/")
_GENERATED = "names starting with 'ag/' or 'output/' are reserved for the names ortrain generates"


def refuse_gradient_names(trained: list[str], names: list[str], where: str) -> None:
    """Refuse a name among ``names`` (a step's params and arguments) that onnxruntime-training gives
    to the gradient of one of the ``trained`` params (``W_grad`` beside ``W``), to that gradient's
    buffers (``W_grad.accumulation.buffer``) or to its reset input (``lazy_reset_grad``): the
    training graph would define it twice, which the runtime refuses with an internal message."""
    for name in names:
        if name == "lazy_reset_grad":
            raise OrtrainError(f"{where}: param {name!r}: onnxruntime-training reserves this name for the input "
                               "that resets the gradients; give the param another name")
    for base in trained:
        gradient = base + "_grad"
        clash = next((n for n in names if n == gradient or n.startswith(gradient + ".")), None)
        if clash is not None:
            what = "the gradient" if clash == gradient else "the buffers of the gradient"
            raise OrtrainError(f"{where}: param {clash!r}: onnxruntime-training names {what} of the trained param "
                               f"{base!r} {gradient if clash == gradient else gradient + '.<buffer>'!r}, so the "
                               "two names would clash in the training graph; give one of them another name")


def _sources(idx: Tensor) -> str:
    """Where a computed index's values come from, for the message that refuses them."""
    leaves = [t for t in topological_order([idx]) if isinstance(t, (Input, Param))]
    named = [f"{'buffer' if isinstance(t, Buffer) else 'input' if isinstance(t, Input) else 'param'} {t.name!r}"
             for t in leaves]
    return "computed in fn" + (f" from {', '.join(named)}" if named else "")
