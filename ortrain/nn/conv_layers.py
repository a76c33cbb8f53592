"""Convolution, transposed convolution, upsampling and pooling over channels-first images: Conv2D,
Conv2DTranspose, UpSampling2D, MaxPool2D, AvgPool2D and GlobalAvgPool2D."""

from __future__ import annotations

import numpy as np

from ortrain._arrays import checked_flag, is_integer, positive_int
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.nn.base_layer import Layer, check_activation, emit_activation, glorot_uniform

__all__ = ["AvgPool2D", "Conv2D", "Conv2DTranspose", "GlobalAvgPool2D", "MaxPool2D", "UpSampling2D"]


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


def _conv_arguments(layer: str, filters, kernel_size, strides, padding) -> tuple:
    """``(filters, kernel_size, strides, padding)`` of a convolution layer, checked."""
    filters = positive_int(filters, f"{layer}(filters=...)")
    return (int(filters), _int_tuple(kernel_size, 2, f"{layer}(kernel_size=...)"),
            _int_tuple(strides, 2, f"{layer}(strides=...)"), _padding(padding, layer))


def _padding(padding, layer: str) -> str:
    """``'valid'`` or ``'same'``, in any case (Keras lowercases it)."""
    if not isinstance(padding, str) or padding.lower() not in ("valid", "same"):
        raise OrtrainError(f"{layer}(padding=...): expected 'valid' or 'same', received {padding!r}")
    return padding.lower()


def _refuse_free_same(layer, shape: tuple) -> None:
    """``padding='same'`` over a free height or width is taken at stride 1 only, where its pads do not
    depend on the size."""
    free = [i for i in range(2) if shape[2 + i] is None and layer.strides[i] > 1]
    if layer.padding == "same" and free:
        axis = "height" if free[0] == 0 else "width"
        raise ShapeError(f"{type(layer).__name__}(padding='same', strides={layer.strides}) needs a known {axis} "
                         f"(its pads depend on the size at a stride above 1), received {describe_shape(shape)}; "
                         f"give the input its size, or use strides=1 or padding='valid'")
    if layer.padding == "same" and None in shape[2:] and getattr(layer, "op_type", "") == "AveragePool":
        # the windows at the edges average fewer cells; the runtime's gradient needs the sizes for that
        raise ShapeError(f"AvgPool2D(padding='same') needs a known height and width (the padded cells are left "
                         f"out of the edge windows' means), received {describe_shape(shape)}; give the input its "
                         f"size or use padding='valid'")


def _does_not_fit(what: str, shape: tuple, fix: str) -> ShapeError:
    """A window larger than its (padded) image. An input that looks channels last (Keras' default:
    a last axis of 1 to 4 after a larger one) is most often why, so the error says how to turn it."""
    message = (f"{what} does not fit input {describe_shape(shape)}: expected (batch, channels, height, width) "
               f"images no smaller than the window")
    channels, height, width = shape[1:]
    if width is not None and width <= 4 and channels is not None and channels > width:
        return ShapeError(f"{message}; its last axis ({width}) looks like the channels, last as in Keras' "
                          f"default layout, while ortrain's images are channels first, as ONNX's: give "
                          f"input_shape=({width}, {channels}, {height}) and the images as x.transpose(0, 3, 1, 2)")
    return ShapeError(f"{message}; {fix}")


def _conv_weights(layer, rng, shape: tuple, fan_in: int, fan_out: int) -> None:
    """A convolution layer's Glorot-uniform ``kernel`` of ``shape`` and, with ``use_bias``, zero ``bias``."""
    layer.weights["kernel"] = glorot_uniform(rng, shape, fan_in, fan_out)
    layer.roles["kernel"] = "trainable"
    if layer.use_bias:
        layer.weights["bias"] = np.zeros(layer.filters, np.float32)
        layer.roles["bias"] = "trainable"


def _conv_out(n, k, s, pad_total):
    return None if n is None else (n + pad_total - k) // s + 1


def _same_pads(n, k, s):
    """TensorFlow's ``same`` pads (the odd one at the end); of a free size ``n`` only at stride 1,
    where they do not depend on it."""
    if n is None:
        return (k - 1) // 2, k - 1 - (k - 1) // 2
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return total // 2, total - total // 2


SOFTMAX_ACTIVATIONS = ("softmax", "log_softmax")


class Conv2D(Layer):
    """2-D convolution over ``(batch, channels, height, width)``; kernel ``(filters, in, kh, kw)``.
    The height and width may be free (``ot.Input((c, None, None))``) except with ``padding="same"``
    at a stride above 1, whose pads depend on them. ``padding`` is read in any case, as Keras'.

    ``activation="softmax"`` (and ``log_softmax``) normalises over the filters, axis 1: each
    pixel's classes, as Keras' does over its channels-last filters."""

    softmax_axis = 1  # -1 (the width) in a model saved before it was 1: see ortrain.nn.layers.layer_from_config

    def __init__(self, filters: int, kernel_size, strides=1, padding: str = "valid", activation=None,
                 use_bias: bool = True, name=None, seed=None):
        super().__init__(name, seed)
        self.filters, self.kernel_size, self.strides, self.padding = _conv_arguments(
            "Conv2D", filters, kernel_size, strides, padding)
        self.activation = check_activation(activation)
        self.use_bias = checked_flag(use_bias, f"{type(self).__name__}(use_bias=...)")

    def _pads(self, shape):
        if self.padding == "valid":
            return (0, 0, 0, 0)
        (t, b), (lft, r) = (_same_pads(shape[2 + i], self.kernel_size[i], self.strides[i]) for i in range(2))
        return (t, lft, b, r)

    def _build(self, input_shapes, rng):
        shape = input_shapes[0]
        if len(shape) != 4 or shape[1] is None:
            raise ShapeError(f"Conv2D expects (batch, channels, height, width) inputs with known channels, "
                             f"received {describe_shape(shape)}")
        _refuse_free_same(self, shape)
        cin = shape[1]
        kh, kw = self.kernel_size
        _conv_weights(self, rng, (self.filters, cin, kh, kw), cin * kh * kw, self.filters * kh * kw)

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        t, lft, b, r = self._pads(shape)
        h = _conv_out(shape[2], self.kernel_size[0], self.strides[0], t + b)
        w = _conv_out(shape[3], self.kernel_size[1], self.strides[1], lft + r)
        if h is not None and h < 1 or w is not None and w < 1:
            raise _does_not_fit(f"Conv2D kernel {self.kernel_size}", shape, "use a smaller kernel or padding='same'")
        return (shape[0], self.filters, h, w)

    def emit(self, ctx, inputs):
        shape = (None,) + self.built_for[0]
        args = [inputs[0], ctx.weight(self, "kernel")] + ([ctx.weight(self, "bias")] if self.use_bias else [])
        y = ctx.gb.op("Conv", args, kernel_shape=list(self.kernel_size), strides=list(self.strides),
                      pads=list(self._pads(shape)))
        return emit_activation(ctx.gb, y, self.activation, axis=self.softmax_axis)

    def get_config(self):
        return {"name": self.name, "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, "activation": self.activation,
                "use_bias": self.use_bias}


class Conv2DTranspose(Layer):
    """Transposed 2-D convolution (a decoder's learned upsampling) over ``(batch, channels, height,
    width)``; kernel ``(in, filters, kh, kw)``, PyTorch's ``ConvTranspose2d`` layout.

    Sizes and placement are Keras': without ``output_padding`` the output is ``n * stride`` for
    ``padding="same"`` and ``n * stride + max(kernel - stride, 0)`` for ``"valid"``; with it (each
    below the stride), ``(n - 1) * stride + kernel + output_padding``, less ``2 * (kernel // 2)`` for
    ``"same"``. ``"same"`` crops the full transposed convolution as TensorFlow does, the odd cell at
    the end; cells past the full output are zeros (plus the bias). Trained on the CPU through the
    forms described in the README. A ``softmax`` activation normalises over the filters, axis 1."""

    softmax_axis = 1  # as Conv2D's

    def __init__(self, filters: int, kernel_size, strides=1, padding: str = "valid", output_padding=None,
                 activation=None, use_bias: bool = True, name=None, seed=None):
        super().__init__(name, seed)
        self.filters, self.kernel_size, self.strides, self.padding = _conv_arguments(
            "Conv2DTranspose", filters, kernel_size, strides, padding)
        if output_padding is None:
            self.output_padding = None
        else:
            received = output_padding
            output_padding = (output_padding,) * 2 if is_integer(output_padding) else output_padding
            try:
                ok = len(output_padding) == 2 and all(is_integer(v) and 0 <= v < s
                                                      for v, s in zip(output_padding, self.strides))
            except TypeError:
                ok = False
            if not ok:
                raise OrtrainError(f"Conv2DTranspose(output_padding=...): expected None or ints from 0 to the stride "
                                   f"less one (strides {self.strides}), received {received!r}")
            self.output_padding = tuple(int(v) for v in output_padding)
        self.activation = check_activation(activation)
        self.use_bias = checked_flag(use_bias, f"{type(self).__name__}(use_bias=...)")

    def _geometry(self):
        """``(pads, output_padding)`` as ConvTranspose takes them, ``[top, left, bottom, right]``: the
        full output ``(n - 1) * stride + kernel`` cropped by the padding, extended by the output
        padding (which do not depend on ``n``)."""
        begin, end, extra = [], [], []
        for a in range(2):
            k, s = self.kernel_size[a], self.strides[a]
            op = self.output_padding[a] if self.output_padding is not None else None
            # what the full output has beyond Keras' length (its crop) and where the crop starts
            if self.padding == "valid":
                over, start = (k - s - max(k - s, 0)) if op is None else -op, 0
            else:
                over = (k - s) if op is None else 2 * (k // 2) - op
                start = max(over, 0) // 2
            begin.append(start)
            end.append(max(over, 0) - start)
            extra.append(max(-over, 0))
        return begin + end, extra

    def _build(self, input_shapes, rng):
        shape = input_shapes[0]
        if len(shape) != 4 or shape[1] is None:
            raise ShapeError(f"Conv2DTranspose expects (batch, channels, height, width) inputs with known channels, "
                             f"received {describe_shape(shape)}")
        cin = shape[1]
        kh, kw = self.kernel_size
        # Keras counts a transposed kernel's fan-in over the output channels (Glorot's limit sums the fans)
        _conv_weights(self, rng, (cin, self.filters, kh, kw), self.filters * kh * kw, cin * kh * kw)

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        pads, extra = self._geometry()
        sizes = [None if n is None else (n - 1) * s + k + e - pads[a] - pads[2 + a]
                 for a, (n, k, s, e) in enumerate(zip(shape[2:], self.kernel_size, self.strides, extra))]
        if any(d is not None and d < 1 for d in sizes):
            raise ShapeError(f"Conv2DTranspose: kernel {self.kernel_size}, strides {self.strides}, padding "
                             f"{self.padding!r} and output_padding {self.output_padding} give input "
                             f"{describe_shape(shape)} an output of {sizes} pixels; use padding='valid' or a larger "
                             f"output_padding")
        return (shape[0], self.filters, *sizes)

    def emit(self, ctx, inputs):
        pads, extra = self._geometry()
        args = [inputs[0], ctx.weight(self, "kernel")] + ([ctx.weight(self, "bias")] if self.use_bias else [])
        y = ctx.gb.op("ConvTranspose", args, kernel_shape=list(self.kernel_size), strides=list(self.strides),
                      pads=pads, output_padding=extra if any(extra) else None)
        return emit_activation(ctx.gb, y, self.activation, axis=self.softmax_axis)

    def get_config(self):
        return {"name": self.name, "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding,
                "output_padding": None if self.output_padding is None else list(self.output_padding),
                "activation": self.activation, "use_bias": self.use_bias}


class UpSampling2D(Layer):
    """Repeat (``interpolation="nearest"``) or interpolate (``"bilinear"``, pixel centres aligned as in
    Keras and PyTorch's ``align_corners=False``) each image ``size`` times along height and width.
    Training through ``"bilinear"`` needs the image size known (``ot.Input((c, h, w))``: it
    interpolates by fixed matrices; see the README); ``"nearest"`` takes any size."""

    def __init__(self, size=2, interpolation: str = "nearest", name=None):
        super().__init__(name)
        self.size = _int_tuple(size, 2, "UpSampling2D(size=...)")
        if interpolation not in ("nearest", "bilinear"):
            raise OrtrainError(f"UpSampling2D(interpolation=...): expected 'nearest' or 'bilinear', "
                               f"received {interpolation!r}")
        self.interpolation = interpolation

    def _build(self, input_shapes, rng):
        if len(input_shapes[0]) != 4:
            raise ShapeError(f"UpSampling2D expects (batch, channels, height, width) inputs, "
                             f"received {describe_shape(input_shapes[0])}")

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        return (shape[0], shape[1], *(None if n is None else n * s for n, s in zip(shape[2:], self.size)))

    def emit(self, ctx, inputs):
        scales = ctx.gb.const([1.0, 1.0, *map(float, self.size)], hint="scales")
        if self.interpolation == "nearest":
            attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        else:
            attrs = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
        return ctx.gb.op("Resize", [inputs[0], "", scales], **attrs)

    def get_config(self):
        return {"name": self.name, "size": list(self.size), "interpolation": self.interpolation}


class _Pool2D(Layer):
    op_type = ""

    def __init__(self, pool_size=2, strides=None, padding: str = "valid", name=None):
        super().__init__(name)
        self.pool_size = _int_tuple(pool_size, 2, f"{type(self).__name__}(pool_size=...)")
        self.strides = _int_tuple(strides if strides is not None else self.pool_size, 2,
                                  f"{type(self).__name__}(strides=...)")
        self.padding = _padding(padding, type(self).__name__)

    def _pads(self, shape):
        if self.padding == "valid":
            return (0, 0, 0, 0)
        (t, b), (lft, r) = (_same_pads(shape[2 + i], self.pool_size[i], self.strides[i]) for i in range(2))
        return (t, lft, b, r)

    def _build(self, input_shapes, rng):
        if len(input_shapes[0]) != 4:
            raise ShapeError(f"{type(self).__name__} expects (batch, channels, height, width) inputs, "
                             f"received {describe_shape(input_shapes[0])}")
        _refuse_free_same(self, input_shapes[0])

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        t, lft, b, r = self._pads(shape)
        h = _conv_out(shape[2], self.pool_size[0], self.strides[0], t + b)
        w = _conv_out(shape[3], self.pool_size[1], self.strides[1], lft + r)
        if h is not None and h < 1 or w is not None and w < 1:
            raise _does_not_fit(f"{type(self).__name__} pool_size {self.pool_size}", shape,
                                "use a smaller pool_size or padding='same'")
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
    default to the pool size, ``padding`` is ``"valid"`` or ``"same"``. Over a free height or width
    (``ot.Input((c, None, None))``), ``"same"`` is taken at stride 1 only, as ``Conv2D``'s: its
    pads depend on the size at a larger stride."""

    op_type = "MaxPool"


class AvgPool2D(_Pool2D):
    """Mean over each window. With ``padding="same"`` the padded cells are left out of the mean
    (Keras' convention; PyTorch's ``AvgPool2d`` counts them unless ``count_include_pad=False``),
    which needs the height and width known: over free sizes it takes ``"valid"`` only."""

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
