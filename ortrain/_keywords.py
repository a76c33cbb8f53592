"""Constructors that name the argument they do not take, and what to do instead, where Python
would raise its own ``TypeError`` (Keras code ported as written passes Keras' arguments)."""

from __future__ import annotations

import functools
import inspect

from ortrain.errors import ArgumentError

# What a Keras argument that has no counterpart here turns into.
_INSTEAD = {
    "data_format": "ortrain's images are channels first, (batch, channels, height, width): transpose "
                   "channels-last data with x.transpose(0, 3, 1, 2)",
    "kernel_initializer": "kernels start Glorot-uniform and biases at zero; set other values with set_weights",
    "bias_initializer": "biases start at zero; set other values with set_weights",
    "kernel_regularizer": "there are no regularizers; AdamW's weight_decay decays the weights",
    "bias_regularizer": "there are no regularizers; AdamW's weight_decay decays the weights",
    "dilation_rate": "convolutions here are not dilated; a model with dilated ones trains through ot.from_onnx",
    "label_smoothing": "smooth the labels before the loss: y * (1 - a) + a / classes",
    "amsgrad": "Adam here is plain Adam (as torch.optim.Adam's default)",
    "momentum": "onnxruntime-training's SGD keeps no velocity: use Adam",
    "nesterov": "onnxruntime-training's SGD keeps no velocity: use Adam",
}


def name_unknown_arguments(cls) -> None:
    """Wrap ``cls.__init__`` (its own, when it takes no ``**kwargs``) so a call it cannot bind
    raises :class:`~ortrain.errors.ArgumentError` (an ``OrtrainError`` and a ``TypeError``) naming the
    argument, what the class takes and the fix."""
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "_names_unknown", False):
        return
    signature = inspect.signature(init)
    params = list(signature.parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as exc:
            raise ArgumentError(_message(type(self).__name__, params, args, kwargs, exc)) from None
        init(self, *args, **kwargs)

    __init__._names_unknown = True
    cls.__init__ = __init__


def _message(name: str, params, args, kwargs, exc: TypeError) -> str:
    taken = ", ".join(p.name for p in params if p.kind is not p.VAR_POSITIONAL)
    unknown = [k for k in kwargs if k not in {p.name for p in params}]
    if unknown:
        key = unknown[0]
        instead = _INSTEAD.get(key)
        return (f"{name}({key}=...): {name} takes no argument {key!r} (it takes {taken})"
                + (f"; {instead}" if instead else ""))
    return f"{name}: {exc} (it takes {taken})"
