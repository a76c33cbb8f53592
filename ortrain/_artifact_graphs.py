"""The graphs a build writes: the forward graph of what was passed (with the weights that cannot
affect the loss frozen), the loss appended to it, and the training, eval, optimizer and forward
files made from them. A change to what they write bumps ``artifacts.BUILDER_REVISION``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from ortrain import engine, losses, optim
from ortrain._arrays import sample_weight_shape
from ortrain._manifest import FORMAT, finish, versions
from ortrain._warnings import warn
from ortrain.errors import OrtrainError
from ortrain.graph import OPSET, GraphBuilder, TensorSpec, check_model, opsets
from ortrain.graph.activations import sigmoid_logits
from ortrain.graph.forward import ForwardGraph, ParamSpec, extend, reserved_input_name
from ortrain.graph.gradient_forms import for_training
from ortrain.graph.gradient_ops import (
    ancestors,
    gradient_reach,
    may_stop_gradients,
    refuse_empty_pool_windows,
    refuse_recurrent_forms,
)
from ortrain.graph.passes import all_nodes

LABEL = "ortrain.label"
SAMPLE_WEIGHT = "ortrain.sample_weight"
LOSS_SCALE = "ortrain.loss_scale"
LOSS = "ortrain.loss"
SCALED_LOSS = "ortrain.scaled_loss"
WEIGHTINGS = (None, "sample", "element")


def _check_weighting(weighting) -> None:
    if weighting not in WEIGHTINGS:
        raise OrtrainError(f"weighting: expected None, 'sample' or 'element', received {weighting!r}")


def _refuse_quantized(fg: ForwardGraph) -> None:
    """Below opset 21 onnxruntime-training's QDQ pass turns each ``QuantizeLinear`` into fake
    quantization for quantization-aware training, and fails with an internal message on every
    form ortrain hands it (a pair on an activation, a ``QuantizeLinear`` feeding a QLinear op).
    Weight-only quantized models (a ``DequantizeLinear`` of a constant weight) train. At opset 21
    the weights after the last ``QuantizeLinear`` train; those before stay constants (no gradient
    crosses its integers), which ``from_onnx`` warns of, naming the nodes."""
    opset = opsets.default_opset(fg.proto)
    if opset >= 21:  # the pass matches QuantizeLinear of versions 10, 13 and 19 only
        return
    quantize = [n.name or f"QuantizeLinear#{i}" for i, n in enumerate(all_nodes(fg.proto.graph))
                if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx")]
    if quantize:
        shown = ", ".join(quantize[:5]) + (f" and {len(quantize) - 5} more" if len(quantize) > 5 else "")
        raise OrtrainError(f"the model quantizes activations (QuantizeLinear nodes: {shown}): onnxruntime-training "
                           "1.19.2 cannot train it below opset 21 (its quantization-aware-training pass fails on "
                           "it; the model predicts); train the float model, then quantize it, or export it at opset "
                           "21, where the weights after the last QuantizeLinear train. Weight-only quantized models "
                           "(DequantizeLinear of constant weights) train")


def _check_trainable(fg: ForwardGraph) -> None:
    if not fg.params:
        raise OrtrainError("nothing to train: the model has no weights; add a layer that has some. Of an imported "
                           "model ortrain trains the float32 initializers of rank 1 or more that a gradient reaches "
                           "(a float32 scalar where from_onnx's trainable= names it); float16 and float64 "
                           "initializers stay constants (export such a model in float32), and so do weights "
                           "written as Constant nodes (store them as initializers)")
    if not fg.names("trainable"):
        raise OrtrainError("nothing to train: every weight is frozen or a buffer; unfreeze some weights "
                           "(model.unfreeze(...), or layer.trainable = True for layers set trainable=False)")
    for spec in fg.inputs:
        why = reserved_input_name(spec.name)
        if why:
            raise OrtrainError(f"input {spec.name!r}: {why}, so a training graph cannot feed it (predictions can); "
                               "give the input another name (ot.Input(..., name=...), or input_names=[...] in "
                               "torch.onnx.export)")
    refuse_recurrent_forms(fg.proto)  # before a cache lookup: no cached graph holds one
    refuse_empty_pool_windows(fg.proto)


def loss_model(fg: ForwardGraph, loss: losses.Loss, weighting: str | None) -> tuple[onnx.ModelProto, dict]:
    """The forward graph with the loss appended; returns the model and the manifest's I/O entries.

    Outputs: ``[scaled_loss, loss, prediction]``. ``scaled_loss = loss * loss_scale`` is where
    backpropagation starts, so gradient accumulation over k batches can feed ``1/k``.
    """
    _check_weighting(weighting)
    outputs = fg.outputs
    if not outputs:
        raise OrtrainError("the model has no outputs to put a loss on")
    pred = outputs[0]
    if pred.dtype != np.float32:
        raise OrtrainError(f"the model's first output {pred.name!r} is {np.dtype(pred.dtype).name}; "
                           "the loss needs float32 predictions")
    if weighting == "element" and not loss.element_weights:
        raise OrtrainError(f"one weight per output element is defined for mean squared error only, "
                           f"not {loss.name!r}; use loss='mse' or one weight per sample")
    if weighting is not None and len(pred.shape) < 2 and weighting == "element":
        raise OrtrainError("one weight per output element needs a prediction of shape [batch, outputs]")
    gb = GraphBuilder(prefix="ortrain.loss/")
    label = TensorSpec(LABEL, loss.label_dtype, loss.label_shape(pred.shape))
    gb.add_input(label.name, label.dtype, label.shape)
    weight = None
    if weighting == "sample":
        weight = TensorSpec(SAMPLE_WEIGHT, np.dtype(np.float32), sample_weight_shape(pred.shape))
    elif weighting == "element":
        weight = TensorSpec(SAMPLE_WEIGHT, np.dtype(np.float32), tuple(pred.shape))
    if weight is not None:
        gb.add_input(weight.name, weight.dtype, weight.shape)
    gb.add_input(LOSS_SCALE, np.float32, ())
    value = loss.build(gb, pred.name, LABEL, weight.name if weight else None, pred_shape=tuple(pred.shape),
                       sigmoid_of=sigmoid_logits(fg.proto.graph, pred.name, gb) if loss.reads_sigmoid_logits else None)
    gb.op("Identity", [value], outputs=[LOSS])
    gb.op("Mul", [LOSS, LOSS_SCALE], outputs=[SCALED_LOSS])
    outs = [TensorSpec(SCALED_LOSS, np.dtype(np.float32), ()).to_value_info(),
            TensorSpec(LOSS, np.dtype(np.float32), ()).to_value_info(),
            pred.to_value_info()]
    model = extend(fg.proto, gb, outs)
    io = {"inputs": [s.to_json() for s in fg.inputs], "outputs": [s.to_json() for s in outputs],
          "label": label.to_json(), "sample_weight": weight.to_json() if weight else None,
          "weighting": weighting, "loss_scale": LOSS_SCALE, "prediction": pred.name,
          "train_outputs": [SCALED_LOSS, LOSS, pred.name]}
    return model, io


def _weights_digest(model, fg: ForwardGraph) -> str:
    """The model's remembered digest when it keeps one (ortrain models do), else a fresh one."""
    return model.weights_digest() if hasattr(model, "weights_digest") else fg.weights_digest()


def _freeze_untrainable(fg: ForwardGraph) -> ForwardGraph:
    """Weights that cannot train are frozen here. A weight of no values has nothing to learn
    (onnxruntime-training crashes the process on its gradient); frozen without a word. Weights the
    loss does not depend on (they feed only other outputs) get no gradient: the gradient builder
    refuses them, so they are frozen with a warning naming them."""
    outputs = fg.outputs
    if not outputs:
        return fg
    empty = {p.name for p in fg.params if p.role == "trainable" and 0 in tuple(p.shape)}
    trainable = [p.name for p in fg.params if p.role == "trainable" and p.name not in empty]
    if empty and not trainable:
        shown = ", ".join(sorted(empty)[:6]) + (f" and {len(empty) - 6} more" if len(empty) > 6 else "")
        raise OrtrainError(f"nothing to train: every trainable weight is empty ({shown}: no values); train a model "
                           "with weights that hold values")
    reach = gradient_reach(fg.proto, [outputs[0].name]) if may_stop_gradients(fg.proto, trainable) else \
        ancestors(fg.proto, outputs[0].name)
    idle = [name for name in trainable if name not in reach]
    if idle:
        shown = ", ".join(idle[:6]) + (f" and {len(idle) - 6} more" if len(idle) > 6 else "")
        if len(idle) == len(trainable):  # not "every weight is frozen": none is
            raise OrtrainError(f"nothing to train: the loss is computed on the first output {outputs[0].name!r}, "
                               f"which no trainable weight affects ({shown} feed only other outputs); make an output "
                               "that depends on weights the first one")
        warn(f"weights {shown} do not affect the loss, which is computed on the first output "
             f"{outputs[0].name!r}; they are not trained")
    frozen = empty.union(idle)
    if not frozen:
        return fg
    params = tuple(ParamSpec(p.name, p.shape, p.dtype, "frozen" if p.name in frozen else p.role) for p in fg.params)
    return ForwardGraph(fg.proto, params, fg.weights)


def _forward_graph(model, trainable, frozen) -> ForwardGraph:
    if isinstance(model, ForwardGraph):
        if trainable is not None or frozen is not None:
            from ortrain.nn.onnx_import import reassign_roles
            return reassign_roles(model, trainable, frozen)
        return model
    if hasattr(model, "forward_graph"):
        if trainable is not None or frozen is not None:
            from ortrain.nn.onnx_import import freeze_named_statistics, reassign_roles
            # running statistics named in frozen= stay fixed, as from_onnx(frozen=) and freeze keep them
            return reassign_roles(freeze_named_statistics(model, frozen, copy=True).forward_graph(), trainable,
                                  frozen)
        return model.forward_graph()
    if isinstance(model, (onnx.ModelProto, str, os.PathLike)):
        from ortrain.nn.onnx_import import from_onnx
        try:
            return from_onnx(model, trainable=trainable, frozen=frozen).forward_graph()
        except OrtrainError as exc:  # (said by from_onnx, which the caller did not call)
            raise type(exc)(f"artifacts.build: {exc}") from None
    raise OrtrainError(f"model: expected an ortrain Model, an onnx.ModelProto or a path to an .onnx file, "
                       f"received {type(model).__name__}")


def _write(directory: Path, key: str, fg: ForwardGraph, loss: losses.Loss, opt: optim.Optimizer,
           weighting: str | None, weights_sha256: str) -> None:
    _check_trainable(fg)
    lm, io = loss_model(fg, loss, weighting)
    lm = for_training(lm, run=engine.run_model, trainable=fg.names("trainable"))
    frozen = fg.names("frozen") + fg.names("buffer")
    # onnx.checker validates what ortrain writes itself (the loss model here, the optimizer graph,
    # forward.onnx); the gradient graphs come from onnxruntime-training and hold its own training
    # ops (MaxPoolGrad and others in the default domain) that onnx's checker does not know, so
    # opening them in onnxruntime-training is their check.
    check_model(lm, "forward graph with its loss")
    training, eval_model = engine.build_training_graphs(lm, fg.names("trainable"), frozen, io["train_outputs"])
    onnx.save(training, directory / "training.onnx")
    onnx.save(eval_model, directory / "eval.onnx")
    onnx.save(opt.graph(), directory / "optimizer.onnx")
    # The forward graph in training flavour (dropout active), parameters as inputs: the
    # model can be rebuilt from it; predictions apply to_inference() first.
    check_model(fg.proto, "forward graph")
    onnx.save(fg.proto, directory / "forward.onnx")
    manifest = {"format": FORMAT, "key": key, "versions": versions(), "opset": OPSET, **io,
                "parameters": [p.to_json() for p in fg.params], "loss": loss.config(), "optimizer": opt.config()}
    finish(directory, manifest, fg, weights_sha256)
