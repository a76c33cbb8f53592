"""The core layers: Dense, Activation, Dropout, the normalisations (BatchNorm, LayerNorm) and
Embedding."""

from __future__ import annotations

import math

import numpy as np

from ortrain import _random
from ortrain._arrays import FLOAT32_TINY, as_float32, checked_flag, is_real, positive_int
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.nn.base_layer import Layer, check_activation, emit_activation, glorot_uniform, uniform_weight

__all__ = ["Activation", "BatchNorm", "Dense", "Dropout", "Embedding", "LayerNorm"]

def _epsilon(value, owner: str) -> float:
    # below the smallest normal float32 the sessions flush it to 0: a constant feature divides by 0
    if not is_real(value) or not math.isfinite(value) or not value > 0 or \
            not FLOAT32_TINY <= as_float32(value) < math.inf:
        raise OrtrainError(f"{owner}(epsilon=...): expected a positive finite number that float32 (the runtime's "
                           f"precision) holds as a normal number, about 1.2e-38 to 3.4e38 (smaller values are "
                           f"flushed to 0 and a constant feature would divide by 0), received {value!r}")
    return float(value)


class Dense(Layer):
    """``activation(x @ kernel + bias)``; kernel ``(in, out)``, Glorot-uniform; bias zeros.

    ``activation`` is None (``"linear"``) or one of ``"relu"``, ``"sigmoid"``, ``"tanh"``,
    ``"softmax"``, ``"gelu"``, ``"leaky_relu"``, ``"elu"``, ``"selu"``, ``"softplus"``,
    ``"softsign"``, ``"silu"`` (``"swish"``), ``"hard_sigmoid"``, ``"hard_silu"``
    (``"hard_swish"``), ``"relu6"``, ``"exponential"``, ``"mish"``, ``"log_softmax"`` (see
    ``Activation`` for their exact definitions).
    On an input of more axes it acts on the last (for an image the width; ``Permute`` moves the
    channels there).
    """

    def __init__(self, units: int, activation=None, use_bias: bool = True, name=None, seed=None):
        super().__init__(name, seed)
        self.units = positive_int(units, "Dense(units=...)")
        self.activation = check_activation(activation)
        self.use_bias = checked_flag(use_bias, f"{type(self).__name__}(use_bias=...)")

    def _build(self, input_shapes, rng):
        shape = input_shapes[0]
        if len(shape) < 2 or shape[-1] is None:
            raise ShapeError(f"Dense expects inputs (batch, ..., features) with known features, "
                             f"received {describe_shape(shape)}")
        n_in = shape[-1]
        self.weights["kernel"] = glorot_uniform(rng, (n_in, self.units), n_in, self.units)
        self.roles["kernel"] = "trainable"
        if self.use_bias:
            self.weights["bias"] = np.zeros(self.units, np.float32)
            self.roles["bias"] = "trainable"

    def output_shape(self, input_shapes):
        return tuple(input_shapes[0][:-1]) + (self.units,)

    def emit(self, ctx, inputs):
        gb, x = ctx.gb, inputs[0]
        k = ctx.weight(self, "kernel")
        rank = len(self.built_for[0]) + 1
        if rank == 2 and self.use_bias:
            y = gb.op("Gemm", [x, k, ctx.weight(self, "bias")])  # one fused GEMM with bias
        else:
            y = gb.op("MatMul", [x, k])
            if self.use_bias:
                y = gb.op("Add", [y, ctx.weight(self, "bias")])
        return emit_activation(gb, y, self.activation)

    def get_config(self):
        return {"name": self.name, "units": self.units, "activation": self.activation, "use_bias": self.use_bias}


class Activation(Layer):
    """An activation on its own. The names, as Keras defines them:

    - ``relu``, ``sigmoid``, ``tanh``, ``linear`` (the identity);
    - ``softmax`` over the last axis;
    - ``gelu``: the exact form ``x * (1 + erf(x / sqrt 2)) / 2`` (PyTorch's ``GELU()``, not
      its ``approximate="tanh"``);
    - ``leaky_relu``: negative slope 0.2, Keras 3's default (PyTorch's ``LeakyReLU`` defaults
      to 0.01); a model with another slope can come in through ``ot.from_onnx``;
    - ``elu`` (alpha 1), ``selu``, ``softplus``, ``softsign``, ``silu`` (``swish``),
      ``hard_sigmoid`` (``relu6(x + 3) / 6``), ``hard_silu`` (``hard_swish``), ``relu6``,
      ``exponential``, ``mish``, ``log_softmax`` (last axis), with PyTorch's derivative at the
      kinks.
    """

    def __init__(self, activation, name=None):
        super().__init__(name)
        self.activation = check_activation(activation)

    def emit(self, ctx, inputs):
        out = emit_activation(ctx.gb, inputs[0], self.activation)
        return out if out != inputs[0] else ctx.gb.op("Identity", [out])

    def get_config(self):
        return {"name": self.name, "activation": self.activation}


class Dropout(Layer):
    """Zeroes a fraction ``rate`` of the inputs during training steps (scaled by ``1/(1-rate)``).

    A new mask is drawn at every step; evaluation, prediction and export run without it.
    """

    def __init__(self, rate: float, name=None, seed=None):
        super().__init__(name, seed)
        if not is_real(rate) or not 0.0 <= rate < 1.0 or as_float32(rate) >= 1.0:
            raise OrtrainError(f"Dropout(rate=...): expected a number in [0, 1) that stays below 1 in float32 (the "
                               f"runtime's precision; at most 0.9999999), received {rate!r}")
        self.rate = float(rate)

    def _build(self, input_shapes, rng):
        # A seeded run (the layer's seed=, a seeded Sequential's, ot.set_seed) gets reproducible masks;
        # otherwise the graph carries no seed, so models that differ only in weights share cached artifacts.
        self.graph_seed = self.seed if self.seed is not None else \
            self._stack_seed if self._stack_seed is not None else \
            (_random.draw_seed() if _random.is_seeded() else None)

    def emit(self, ctx, inputs):
        gb = ctx.gb
        ratio = gb.const(self.rate, hint="ratio")
        training = gb.const(True, np.bool_, hint="training_mode")
        y, _mask = gb.op("Dropout", [inputs[0], ratio, training], outputs=2, seed=self.graph_seed)
        return y

    def get_config(self):
        # The seed the graph carries, so a copy or a reloaded model builds the same graph (and so
        # the same artifacts, and resumes from the same checkpoints).
        seed = self.seed if self.seed is not None else getattr(self, "graph_seed", None)
        return {"name": self.name, "rate": self.rate, "seed": seed}


class BatchNorm(Layer):
    """Batch normalisation over axis 1 (features of ``(batch, features)``, channels of images).

    Training steps normalise by the batch statistics and move the running ones by
    ``running = momentum * running + (1 - momentum) * batch`` (Keras' convention, biased
    variance); evaluation and export use the running statistics. With the statistics
    frozen (``model.freeze_bn_stats()`` or a frozen layer) training uses them too.
    """

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-3, name=None):
        super().__init__(name)
        if not is_real(momentum) or not 0.0 <= momentum < 1.0 or as_float32(momentum) >= 1.0:
            raise OrtrainError(f"BatchNorm(momentum=...): expected a number in [0, 1) that stays below 1 in float32 "
                               f"(the runtime's precision; at most 0.9999999: at 1 the statistics never move), "
                               f"received {momentum!r}")
        self.momentum = float(momentum)
        self.epsilon = _epsilon(epsilon, type(self).__name__)

    def _build(self, input_shapes, rng):
        shape = input_shapes[0]
        if len(shape) < 2 or shape[1] is None:
            fix = "; it normalises axis 1, which must have a known size: give that axis its size, or put a known " \
                  "one there (Permute((2, 1)) before it normalises a sequence's features)" if len(shape) >= 2 else ""
            raise ShapeError(f"BatchNorm expects (batch, features) or (batch, channels, ...) inputs, "
                             f"received {describe_shape(shape)}{fix}")
        c = shape[1]
        self.weights.update(gamma=np.ones(c, np.float32), beta=np.zeros(c, np.float32),
                            running_mean=np.zeros(c, np.float32), running_var=np.ones(c, np.float32))
        self.roles.update(gamma="trainable", beta="trainable", running_mean="buffer", running_var="buffer")

    def emit(self, ctx, inputs):
        names = [ctx.weight(self, s) for s in ("gamma", "beta", "running_mean", "running_var")]
        return ctx.gb.op("BatchNormalization", [inputs[0], *names], epsilon=self.epsilon, momentum=self.momentum)

    def get_config(self):
        return {"name": self.name, "momentum": self.momentum, "epsilon": self.epsilon}


class LayerNorm(Layer):
    """Layer normalisation over the last axis, with learned ``gamma``/``beta`` (for an image,
    ``(batch, channels, height, width)``, the width: ``Permute((2, 3, 1))`` first puts the
    channels last, where Keras' channels-last images have them).

    ``epsilon`` defaults to Keras' 1e-3; PyTorch's ``nn.LayerNorm`` uses 1e-5.

    Emitted as ONNX ``LayerNormalization`` (with its mean and inverse-std outputs, the form
    whose gradient onnxruntime-training has) of the rows minus their mean. The result is the
    same, and the centring keeps it as exact as Keras' and PyTorch's: onnxruntime's kernel takes
    the variance as ``mean(x * x) - mean(x) ** 2``, which float32 loses to cancellation when the
    rows share a large offset (14% off at an offset of 1000 times their spread, NaN at 10000).
    """

    def __init__(self, epsilon: float = 1e-3, name=None):
        super().__init__(name)
        self.epsilon = _epsilon(epsilon, type(self).__name__)

    def _build(self, input_shapes, rng):
        c = input_shapes[0][-1]
        if c is None:
            raise ShapeError(f"LayerNorm needs a known last dimension (its gamma and beta have one value each), "
                             f"received {describe_shape(input_shapes[0])}; give the last axis its size, or put a "
                             "known one last (Permute)")
        self.weights.update(gamma=np.ones(c, np.float32), beta=np.zeros(c, np.float32))
        self.roles.update(gamma="trainable", beta="trainable")

    def emit(self, ctx, inputs):
        gb = ctx.gb
        centred = gb.op("Sub", [inputs[0], gb.op("ReduceMean", [inputs[0]], axes=[-1], keepdims=1)])
        y, _mean, _inv_std = gb.op("LayerNormalization", [centred, ctx.weight(self, "gamma"),
                                                          ctx.weight(self, "beta")],
                                   outputs=3, axis=-1, epsilon=self.epsilon)
        return y

    def get_config(self):
        return {"name": self.name, "epsilon": self.epsilon}


class Embedding(Layer):
    """Rows of a ``(input_dim, output_dim)`` table, looked up by int64 indices. The table starts
    uniform in ``[-0.05, 0.05]``, Keras' default (PyTorch's ``nn.Embedding`` draws from N(0, 1))."""

    input_dtype = np.dtype(np.int64)

    def __init__(self, input_dim: int, output_dim: int, name=None, seed=None):
        super().__init__(name, seed)
        self.input_dim = positive_int(input_dim, "Embedding(input_dim=...)")
        self.output_dim = positive_int(output_dim, "Embedding(output_dim=...)")

    def _build(self, input_shapes, rng):
        self.weights["embeddings"] = uniform_weight(rng, -0.05, 0.05, (self.input_dim, self.output_dim))
        self.roles["embeddings"] = "trainable"

    def output_shape(self, input_shapes):
        return tuple(input_shapes[0]) + (self.output_dim,)

    def emit(self, ctx, inputs):
        return ctx.gb.op("Gather", [ctx.weight(self, "embeddings"), inputs[0]], axis=0)

    def get_config(self):
        return {"name": self.name, "input_dim": self.input_dim, "output_dim": self.output_dim}
