"""Keras-style layers that emit ONNX nodes.

Shapes follow the batch-first convention of the rest of ortrain; images are
**channels first**, ``(batch, channels, height, width)``, which is ONNX's and
PyTorch's layout (Conv kernels are ``(out, in, kh, kw)``). Weights are created
when a layer is first built and belong to the layer; a model lists them in layer
order (Dense: kernel ``(in, out)``, bias; BatchNorm: gamma, beta, running_mean,
running_var).

The base (:class:`Layer`, :class:`Weights`, :class:`EmitContext`) is in ``base_layer``, the
layers in ``core_layers``, ``conv_layers`` and ``shape_layers``; this module gathers them and
rebuilds saved layers by type (:func:`layer_from_config`).
"""

from __future__ import annotations

from ortrain._warnings import warn
from ortrain.errors import OrtrainError
from ortrain.nn.base_layer import ACTIVATIONS, Layer
from ortrain.nn.conv_layers import (
    SOFTMAX_ACTIVATIONS,
    AvgPool2D,
    Conv2D,
    Conv2DTranspose,
    GlobalAvgPool2D,
    MaxPool2D,
    UpSampling2D,
)
from ortrain.nn.core_layers import Activation, BatchNorm, Dense, Dropout, Embedding, LayerNorm
from ortrain.nn.shape_layers import Add, Concatenate, Flatten, Permute, Reshape

__all__ = [
    "ACTIVATIONS", "Activation", "Add", "AvgPool2D", "BatchNorm", "Concatenate", "Conv2D", "Conv2DTranspose",
    "Dense", "Dropout", "Embedding", "Flatten", "GlobalAvgPool2D", "Layer", "LayerNorm", "MaxPool2D", "Permute",
    "Reshape", "UpSampling2D", "layer_from_config", "saved_extras",
]

_REGISTRY = {cls.__name__: cls for cls in (Dense, Activation, Dropout, BatchNorm, LayerNorm, Embedding, Conv2D,
                                           Conv2DTranspose, UpSampling2D, MaxPool2D, AvgPool2D, GlobalAvgPool2D,
                                           Flatten, Reshape, Permute, Add, Concatenate)}


def layer_from_config(kind: str, config: dict, softmax_axis: int | None = None) -> Layer:
    """The layer a saved model recorded. ``softmax_axis``: the axis a convolution's softmax
    normalised, as the model recorded it (see :func:`saved_extras`); None in a file from before."""
    cls = _REGISTRY.get(kind) or _layer_class_of_yours(kind)
    if cls is None:
        raise OrtrainError(f"unknown layer type {kind!r} in a saved model: define (or import) its class, a subclass "
                           "of ot.layers.Layer, before loading it")
    try:
        layer = cls(**config)
    except TypeError as exc:
        if kind in _REGISTRY:
            raise
        raise OrtrainError(f"layer type {kind!r} (a class of yours) cannot be made again from its get_config() "
                           f"{config!r}: {exc}. A trainer, copy() and load_model rebuild layers from their configs: "
                           "give it a get_config() returning its constructor's arguments (as Keras asks of custom "
                           "layers), e.g. {**super().get_config(), 'factor': self.factor}") from None
    if isinstance(layer, (Conv2D, Conv2DTranspose)) and layer.activation in SOFTMAX_ACTIVATIONS:
        if softmax_axis is None:  # saved when a convolution's softmax normalised the last axis
            warn(f"{kind} {layer.name or ''!s}: this model was saved by an ortrain whose convolutions normalised "
                 f"their {layer.activation} over the image width; it loads as saved, so its predictions stay "
                 "as they were. A layer made anew normalises over the filters (each pixel's classes)")
            softmax_axis = -1
        layer.softmax_axis = int(softmax_axis)
    return layer


def _layer_class_of_yours(kind: str) -> type | None:
    """The subclass of :class:`Layer` named ``kind`` defined outside ortrain (a custom layer), if exactly
    one is: a model holding one is rebuilt from its record like any other (a trainer's copy, ``copy()``,
    ``load_model`` once the class is defined)."""
    found, todo = [], list(Layer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__name__ == kind and not cls.__module__.startswith("ortrain.") and cls not in found:
            found.append(cls)
    return found[0] if len(found) == 1 else None


def saved_extras(layer: Layer) -> dict:
    """What a saved model records of ``layer`` beside its config: a convolution's softmax axis."""
    if isinstance(layer, (Conv2D, Conv2DTranspose)) and layer.activation in SOFTMAX_ACTIVATIONS:
        return {"softmax_axis": layer.softmax_axis}
    return {}
