"""``Sequential``: a model built from a stack of single-input layers."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ortrain import _random
from ortrain._arrays import checked_int, is_integer
from ortrain.errors import OrtrainError
from ortrain.nn.base_layer import Layer
from ortrain.nn.base_model import Model
from ortrain.nn.symbolic import Input, SymbolicTensor

__all__ = ["Sequential"]


class Sequential(Model):
    """A stack of single-input layers: ``ot.Sequential([Dense(8, activation="relu"), Dense(2)], input_shape=(4,))``,
    or, as in Keras, ``ot.Sequential([ot.Input((4,)), Dense(8, activation="relu"), Dense(2)])``."""

    def __init__(self, layers=None, input_shape=None, name: str | None = None, seed: int | None = None,
                 input_dtype=None):
        if isinstance(layers, (Layer, str, bytes, Mapping)) or (layers is not None and not hasattr(layers, "__iter__")):
            fix = "; wrap a single layer in a list" if isinstance(layers, Layer) else ""
            raise OrtrainError(f"Sequential(layers=...): expected a list of layers, received "
                               f"{type(layers).__name__}{fix}")
        layers = list(layers or [])
        first = None
        if layers and isinstance(layers[0], SymbolicTensor):  # Keras' Sequential([Input((4,)), Dense(2)])
            first = layers.pop(0)
            if first.node is not None:
                raise OrtrainError("Sequential: the first item may be an ot.Input(...), received a layer's output; "
                                   "use the functional API (ot.Model(inputs, outputs)) for that")
            given = (input_shape,) if is_integer(input_shape) else input_shape
            if given is not None and tuple(given) != first.shape[1:]:
                raise OrtrainError(f"Sequential: input_shape={input_shape!r} and the ot.Input's shape "
                                   f"{first.shape[1:]!r} disagree; give one of them")
            if input_dtype is not None and _dtype(input_dtype) not in (np.dtype(np.float32), np.dtype(np.int64)):
                raise OrtrainError(f"Sequential(input_dtype=...): expected 'float32' or 'int64', received "
                                   f"{input_dtype!r}")
            if input_dtype is not None and _dtype(input_dtype) != first.dtype:
                raise OrtrainError(f"Sequential: input_dtype={input_dtype!r} and the ot.Input's dtype "
                                   f"{first.dtype.name!r} disagree; give one of them")
            input_shape, input_dtype = first.shape[1:], first.dtype
        for lyr in layers:
            if not isinstance(lyr, Layer):
                raise OrtrainError(f"Sequential: expected ot.layers objects (after an optional ot.Input), received "
                                   f"{lyr!r}; e.g. ot.Sequential([ot.Input((4,)), ot.layers.Dense(2)])")
            if lyr.n_inputs != 1:
                raise OrtrainError(f"Sequential: {type(lyr).__name__} merges several inputs; use the functional "
                                   "API (ot.Input / ot.Model) for branches")
        if not layers:
            raise OrtrainError("Sequential needs at least one layer")
        if input_shape is None:
            raise OrtrainError("Sequential(..., input_shape=...) is required: give the shape of one sample, "
                               "e.g. input_shape=(4,) for 4 features, or start the list with ot.Input((4,))")
        dtype = input_dtype or layers[0].input_dtype
        seed = checked_int(seed, "Sequential(seed=...)", minimum=0, allow_none=True)
        rng = _random.generator(seed)
        x = inp = first if first is not None else Input(input_shape, dtype=dtype)
        for lyr in layers:
            if not lyr.built_for and lyr.seed is None:
                lyr.build([x.shape], rng)
            x = lyr(x)
        super().__init__(inp, x, name=name or "sequential")
        self._seed = seed


def _dtype(value) -> np.dtype | None:
    try:
        return np.dtype(value)
    except TypeError:
        return None
