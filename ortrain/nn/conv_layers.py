"""Convolution and pooling over channels-first images: Conv2D, MaxPool2D, AvgPool2D and
GlobalAvgPool2D."""

from __future__ import annotations

import numpy as np

from ortrain._arrays import is_integer
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.nn.base_layer import Layer, check_activation, emit_activation, glorot_uniform

__all__ = ["AvgPool2D", "Conv2D", "GlobalAvgPool2D", "MaxPool2D"]


def _int_tuple(value, n: int, what: str) -> tuple:
    received = value
    if is_integer(value):
        value = (int(value),) * n
    try:
        value = tuple(value)
    except TypeError:  # a float, None, a bool
        value = None
    if value is None or len(value) != n or not all(is_integer(v) and v > 0 for v in value):
        raise OrtrainError(f"{what}: expected a positive int or {n} positive ints, received {received!r}")
    return tuple(int(v) for v in value)


def _conv_out(n, k, s, pad_total):
    return None if n is None else (n + pad_total - k) // s + 1


def _same_pads(n, k, s):
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return total // 2, total - total // 2


class Conv2D(Layer):
    """2-D convolution over ``(batch, channels, height, width)``; kernel ``(filters, in, kh, kw)``."""

    def __init__(self, filters: int, kernel_size, strides=1, padding: str = "valid", activation=None,
                 use_bias: bool = True, name=None, seed=None):
        super().__init__(name, seed)
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or filters < 1:
            raise OrtrainError(f"Conv2D(filters=...): expected a positive int, received {filters!r}")
        self.filters = int(filters)
        self.kernel_size = _int_tuple(kernel_size, 2, "Conv2D(kernel_size=...)")
        self.strides = _int_tuple(strides, 2, "Conv2D(strides=...)")
        if padding not in ("valid", "same"):
            raise OrtrainError(f"Conv2D(padding=...): expected 'valid' or 'same', received {padding!r}")
        self.padding = padding
        self.activation = check_activation(activation)
        self.use_bias = bool(use_bias)

    def _pads(self, shape):
        if self.padding == "valid":
            return (0, 0, 0, 0)
        (t, b), (lft, r) = (_same_pads(shape[2 + i], self.kernel_size[i], self.strides[i]) for i in range(2))
        return (t, lft, b, r)

    def _build(self, input_shapes, rng):
        shape = input_shapes[0]
        if len(shape) != 4 or any(d is None for d in shape[1:]):
            raise ShapeError(f"Conv2D expects (batch, channels, height, width) inputs with known sizes, "
                             f"received {describe_shape(shape)}")
        cin = shape[1]
        kh, kw = self.kernel_size
        self.weights["kernel"] = glorot_uniform(rng, (self.filters, cin, kh, kw), cin * kh * kw,
                                                self.filters * kh * kw)
        self.roles["kernel"] = "trainable"
        if self.use_bias:
            self.weights["bias"] = np.zeros(self.filters, np.float32)
            self.roles["bias"] = "trainable"

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        t, lft, b, r = self._pads(shape)
        h = _conv_out(shape[2], self.kernel_size[0], self.strides[0], t + b)
        w = _conv_out(shape[3], self.kernel_size[1], self.strides[1], lft + r)
        if h is not None and h < 1 or w is not None and w < 1:
            raise ShapeError(f"Conv2D kernel {self.kernel_size} does not fit input {describe_shape(shape)}")
        return (shape[0], self.filters, h, w)

    def emit(self, ctx, inputs):
        shape = (None,) + self.built_for[0]
        args = [inputs[0], ctx.weight(self, "kernel")] + ([ctx.weight(self, "bias")] if self.use_bias else [])
        y = ctx.gb.op("Conv", args, kernel_shape=list(self.kernel_size), strides=list(self.strides),
                      pads=list(self._pads(shape)))
        return emit_activation(ctx.gb, y, self.activation)

    def get_config(self):
        return {"name": self.name, "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, "activation": self.activation,
                "use_bias": self.use_bias}


class _Pool2D(Layer):
    op_type = ""

    def __init__(self, pool_size=2, strides=None, padding: str = "valid", name=None):
        super().__init__(name)
        self.pool_size = _int_tuple(pool_size, 2, f"{type(self).__name__}(pool_size=...)")
        self.strides = _int_tuple(strides if strides is not None else self.pool_size, 2,
                                  f"{type(self).__name__}(strides=...)")
        if padding not in ("valid", "same"):
            raise OrtrainError(f"{type(self).__name__}(padding=...): expected 'valid' or 'same', received {padding!r}")
        self.padding = padding

    def _pads(self, shape):
        if self.padding == "valid":
            return (0, 0, 0, 0)
        (t, b), (lft, r) = (_same_pads(shape[2 + i], self.pool_size[i], self.strides[i]) for i in range(2))
        return (t, lft, b, r)

    def _build(self, input_shapes, rng):
        if len(input_shapes[0]) != 4:
            raise ShapeError(f"{type(self).__name__} expects (batch, channels, height, width) inputs, "
                             f"received {describe_shape(input_shapes[0])}")
        if self.padding == "same" and None in input_shapes[0][2:]:
            raise ShapeError(f"{type(self).__name__}(padding='same') needs a known height and width, received "
                             f"{describe_shape(input_shapes[0])}; give the input its size or use padding='valid'")

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        t, lft, b, r = self._pads(shape)
        h = _conv_out(shape[2], self.pool_size[0], self.strides[0], t + b)
        w = _conv_out(shape[3], self.pool_size[1], self.strides[1], lft + r)
        if h is not None and h < 1 or w is not None and w < 1:
            raise ShapeError(f"{type(self).__name__} pool_size {self.pool_size} does not fit input "
                             f"{describe_shape(shape)}; use a smaller pool or padding='same'")
        return (shape[0], shape[1], h, w)

    def emit(self, ctx, inputs):
        shape = (None,) + self.built_for[0]
        extra = {"count_include_pad": 0} if self.op_type == "AveragePool" else {}
        return ctx.gb.op(self.op_type, [inputs[0]], kernel_shape=list(self.pool_size),
                         strides=list(self.strides), pads=list(self._pads(shape)), **extra)

    def get_config(self):
        return {"name": self.name, "pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding}


class MaxPool2D(_Pool2D):
    """Maximum over each ``pool_size`` window of ``(batch, channels, h, w)`` inputs; ``strides``
    default to the pool size, ``padding`` is ``"valid"`` or ``"same"``."""

    op_type = "MaxPool"


class AvgPool2D(_Pool2D):
    """Mean over each window. With ``padding="same"`` the padded cells are left out of the mean
    (Keras' convention; PyTorch's ``AvgPool2d`` counts them unless ``count_include_pad=False``)."""

    op_type = "AveragePool"


class GlobalAvgPool2D(Layer):
    """Mean over height and width: ``(batch, channels, h, w) -> (batch, channels)``."""

    def _build(self, input_shapes, rng):
        if len(input_shapes[0]) != 4:
            raise ShapeError(f"GlobalAvgPool2D expects (batch, channels, height, width) inputs, "
                             f"received {describe_shape(input_shapes[0])}")

    def output_shape(self, input_shapes):
        return tuple(input_shapes[0][:2])

    def emit(self, ctx, inputs):
        return ctx.gb.op("Flatten", [ctx.gb.op("GlobalAveragePool", [inputs[0]])], axis=1)
