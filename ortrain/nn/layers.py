"""Keras-style layers that emit ONNX nodes.

Shapes follow the batch-first convention of the rest of ortrain; images are
**channels first**, ``(batch, channels, height, width)``, which is ONNX's and
PyTorch's layout (Conv kernels are ``(out, in, kh, kw)``). Weights are created
when a layer is first built and belong to the layer; a model lists them in layer
order (Dense: kernel ``(in, out)``, bias; BatchNorm: gamma, beta, running_mean,
running_var).
"""

from __future__ import annotations

import math

import numpy as np

from ortrain import _random
from ortrain._arrays import as_array, checked_int, is_integer, is_real, read_array
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.graph import GraphBuilder

__all__ = [
    "ACTIVATIONS", "Activation", "Add", "AvgPool2D", "BatchNorm", "Concatenate", "Conv2D", "Dense",
    "Dropout", "Embedding", "Flatten", "GlobalAvgPool2D", "Layer", "LayerNorm", "MaxPool2D", "Reshape",
    "layer_from_config",
]

ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh", "softmax", "gelu", "leaky_relu")
LEAKY_RELU_ALPHA = 0.2  # Keras 3's default negative slope


def check_activation(name) -> str:
    if name is None:
        return "linear"
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise OrtrainError(f"activation: expected one of {', '.join(ACTIVATIONS)}, received {name!r}")
    return name.lower()


def emit_activation(gb: GraphBuilder, x: str, name: str) -> str:
    """Append the nodes of an activation; ``linear`` appends nothing."""
    if name == "linear":
        return x
    if name == "relu":
        return gb.op("Relu", [x])
    if name == "sigmoid":
        return gb.op("Sigmoid", [x])
    if name == "tanh":
        return gb.op("Tanh", [x])
    if name == "softmax":
        return gb.op("Softmax", [x], axis=-1)
    if name == "leaky_relu":
        return gb.op("LeakyRelu", [x], alpha=LEAKY_RELU_ALPHA)
    if name == "gelu":
        # Exact GELU in standard ops, x * (1 + erf(x / sqrt 2)) / 2, so any ONNX runtime can run the export.
        e = gb.op("Erf", [gb.op("Div", [x, gb.const(math.sqrt(2.0), hint="sqrt2")])])
        return gb.op("Mul", [gb.op("Mul", [x, gb.op("Add", [e, gb.const(1.0, hint="one")])]),
                             gb.const(0.5, hint="half")])
    raise OrtrainError(f"unknown activation {name!r}")


def read_only(a: np.ndarray) -> np.ndarray:
    """``a``, made read-only in place (a layer's weights change through ``set_weights`` only)."""
    a.flags.writeable = False
    return a


def glorot_uniform(rng: np.random.Generator, shape: tuple, fan_in: int, fan_out: int) -> np.ndarray:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


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


def _epsilon(value, owner: str) -> float:
    if not is_real(value) or not math.isfinite(value) or not value > 0:
        raise OrtrainError(f"{owner}(epsilon=...): expected a positive finite number, received {value!r}")
    return float(value)


class EmitContext:
    """What a layer needs while emitting: the builder, its weights' graph names and the shape of
    the output it emits (batch first, ``None`` where free)."""

    def __init__(self, gb: GraphBuilder):
        self.gb = gb
        self.output_shape: tuple = ()

    @staticmethod
    def weight(layer: Layer, suffix: str) -> str:
        return f"{layer.name}.{suffix}"


EDITS = [0]  # weights set on any layer so far: a running fit looks at its layers only when it moved


class Weights(dict):
    """A layer's weights by suffix: read-only arrays. Setting one (``layer.weights["kernel"] = a``,
    as ``set_weights`` does) stores a read-only copy and counts as a change every model using the
    layer sees: a model caches its graph, prediction session and artifacts' digest until its
    weights change (an in-place edit went unseen by predict and by the artifact cache). Weights
    are not removed, and a built layer takes no new ones."""

    def __init__(self, layer: Layer):
        super().__init__()
        self._layer = layer
        self.changed: set[str] = set()  # keys set since a running fit last looked (it takes them over)

    def __setitem__(self, key: str, value) -> None:
        where = f"{self._layer.name or type(self._layer).__name__}.{key}"
        old = self.get(key)
        if old is None and self._layer.built_for is not None:
            raise OrtrainError(f"{where}: the built layer has no weight {key!r} (it has "
                               f"{', '.join(self) or 'none'}); set one of those")
        given = read_array(value, where)
        dtype = old.dtype if old is not None else (np.float32 if given.dtype.kind == "f" else given.dtype)
        value = as_array(given, dtype, where)
        if old is not None and value.shape != old.shape:
            raise ShapeError(f"{where}: expected shape {describe_shape(old.shape)}, received "
                             f"{describe_shape(value.shape)}; give an array of the weight's shape")
        self.put(key, value.copy() if value is given else value)  # never the caller's own array

    def put(self, key: str, value: np.ndarray) -> None:
        """Store ``value``, checked and owned by ortrain already (no copy), as a change."""
        super().__setitem__(key, read_only(value))
        self._layer._stored = getattr(self._layer, "_stored", 0) + 1
        self.changed.add(key)
        EDITS[0] += 1

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other):
        self.update(other)
        return self

    def setdefault(self, key: str, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def _removal(self, *args, **kwargs):
        raise OrtrainError(f"weights of layer {self._layer.name!r} cannot be removed; set new values with "
                           "layer.set_weights([...])")

    __delitem__ = pop = popitem = clear = _removal

    def __reduce__(self):  # a copy (deepcopy, pickle) belongs to the copied layer, its arrays read-only
        return _weights_of, (self._layer, dict(self))


def _weights_of(layer: Layer, items: dict) -> Weights:
    weights = Weights(layer)
    for key, value in items.items():
        dict.__setitem__(weights, key, read_only(np.array(value, copy=True)))
    return weights


class Layer:
    """Base class. Subclasses set ``weight_roles`` and implement ``_build``, ``output_shape``, ``emit``."""

    n_inputs: int | None = 1  # None: any number >= 2
    input_dtype = np.dtype(np.float32)

    def __init__(self, name: str | None = None, seed: int | None = None):
        if name is not None and (not isinstance(name, str) or not name or "." in name or "/" in name):
            raise OrtrainError(f"name: expected a non-empty string without '.' or '/', received {name!r}")
        self.name = name
        self.seed = checked_int(seed, f"{type(self).__name__}(seed=...)", minimum=0, allow_none=True)
        self._weights = Weights(self)
        self.roles: dict[str, str] = {}
        self.built_for: tuple | None = None

    # -- building --------------------------------------------------------------------
    def build(self, input_shapes: list[tuple], rng: np.random.Generator | None = None) -> None:
        """Create the weights for these input shapes (once; a later call must agree)."""
        key = tuple(tuple(s[1:]) for s in input_shapes)
        if self.built_for is not None:
            if key != self.built_for:
                raise ShapeError(f"layer {self.name or type(self).__name__!r} was built for inputs {self.built_for} and is now called on "
                                 f"{key}; a layer used twice must see the same shapes")
            return
        try:
            self._build(input_shapes, rng if rng is not None else _random.generator(self.seed))
            self.output_shape(input_shapes)  # shapes it cannot take are refused before it counts as built
        except BaseException:
            self._weights, self.roles = Weights(self), {}
            raise
        self.built_for = key

    # -- weights ---------------------------------------------------------------------
    @property
    def weights(self) -> Weights:
        """The weights by suffix (``kernel``, ``bias``...): read-only arrays, see :class:`Weights`."""
        return self._weights

    @weights.setter
    def weights(self, value) -> None:
        if value is self._weights:  # ``layer.weights |= {...}`` updates in place, then assigns it back
            return
        raise OrtrainError(f"layer {self.name!r}: weights cannot be replaced as a whole; set their values with "
                           "layer.set_weights([...]) or layer.weights[name] = array")

    # ``weights`` holds read-only arrays: a model caches its graph, its prediction session and the
    # artifacts' digest until its weights change, which it learns only through set_weights (an
    # in-place edit went unseen by predict and by the artifact cache).
    def get_weights(self) -> list[np.ndarray]:
        """Copies of this layer's weights, in ``weights`` order, as Keras' ``layer.get_weights()``."""
        return [a.copy() for a in self.weights.values()]

    def set_weights(self, weights) -> None:
        """Replace this layer's weights (a list in ``weights`` order), checked before anything
        changes; every model the layer belongs to sees them."""
        names = list(self.weights)
        given = list(weights) if isinstance(weights, (list, tuple)) else None
        if given is None or len(given) != len(names):
            received = f"{len(given)} array{'s' if len(given) != 1 else ''}" if given is not None else \
                f"a {type(weights).__name__}"
            raise OrtrainError(f"set_weights: layer {self.name!r} expected a list of {len(names)} arrays "
                               f"({', '.join(names) or 'it has none; build it first'}), received {received}")
        staged = []
        for name, w in zip(names, given):
            a = read_only(as_array(w, self.weights[name].dtype, f"set_weights: {self.name}.{name}").copy())
            if a.shape != self.weights[name].shape:
                raise ShapeError(f"set_weights: {self.name}.{name} expected shape "
                                 f"{describe_shape(self.weights[name].shape)}, received {describe_shape(a.shape)}")
            staged.append((name, a))
        for name, a in staged:  # checked and copied: stored as they are; the models using the layer see it
            self.weights.put(name, a)

    def _build(self, input_shapes, rng) -> None:
        pass

    def output_shape(self, input_shapes: list[tuple]) -> tuple:
        return input_shapes[0]

    def emit(self, ctx: EmitContext, inputs: list[str]) -> str:
        raise NotImplementedError

    def get_config(self) -> dict:
        return {"name": self.name}

    # -- functional API --------------------------------------------------------------
    def __call__(self, x):
        from ortrain.nn.model import SymbolicTensor
        tensors = list(x) if isinstance(x, (list, tuple)) else [x]
        if not all(isinstance(t, SymbolicTensor) for t in tensors):
            raise OrtrainError(f"{type(self).__name__} layers are called on ot.Input(...) tensors or on the "
                               f"outputs of other layers; received {type(x).__name__}. "
                               "To run a model on arrays use model.predict(x)")
        if self.n_inputs == 1 and len(tensors) != 1:
            raise OrtrainError(f"{type(self).__name__} takes one input, received {len(tensors)}")
        if self.n_inputs is None and len(tensors) < 2:
            raise OrtrainError(f"{type(self).__name__} merges two or more inputs, received {len(tensors)}")
        return SymbolicTensor.from_layer(self, tensors)

    def __repr__(self) -> str:
        cfg = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        return f"{type(self).__name__}({cfg}{', ' if cfg else ''}name={self.name!r})"


class Dense(Layer):
    """``activation(x @ kernel + bias)``; kernel ``(in, out)``, Glorot-uniform; bias zeros.

    ``activation`` is one of ``ACTIVATIONS`` (see ``Activation`` for their exact definitions).
    """

    def __init__(self, units: int, activation=None, use_bias: bool = True, name=None, seed=None):
        super().__init__(name, seed)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise OrtrainError(f"Dense(units=...): expected a positive int, received {units!r}")
        self.units = int(units)
        self.activation = check_activation(activation)
        self.use_bias = bool(use_bias)

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
      to 0.01); a model with another slope can come in through ``ot.from_onnx``.
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
        if not is_real(rate) or not 0.0 <= rate < 1.0:
            raise OrtrainError(f"Dropout(rate=...): expected a number in [0, 1), received {rate!r}")
        self.rate = float(rate)

    def _build(self, input_shapes, rng):
        # A seeded run (ot.set_seed or seed=) gets reproducible masks; otherwise the graph carries no
        # seed, so models that differ only in weights share cached artifacts.
        self.graph_seed = self.seed if self.seed is not None else \
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
        if not is_real(momentum) or not 0.0 <= momentum < 1.0:
            raise OrtrainError(f"BatchNorm(momentum=...): expected a number in [0, 1), received {momentum!r}")
        self.momentum = float(momentum)
        self.epsilon = _epsilon(epsilon, type(self).__name__)

    def _build(self, input_shapes, rng):
        shape = input_shapes[0]
        if len(shape) not in (2, 3, 4) or shape[1] is None:
            raise ShapeError(f"BatchNorm expects (batch, features) or (batch, channels, ...) inputs, "
                             f"received {describe_shape(shape)}")
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
    """Layer normalisation over the last axis, with learned ``gamma``/``beta``.

    ``epsilon`` defaults to Keras' 1e-3; PyTorch's ``nn.LayerNorm`` uses 1e-5.

    Emitted as ONNX ``LayerNormalization`` with its mean and inverse-std outputs,
    the form whose gradient onnxruntime-training has.
    """

    def __init__(self, epsilon: float = 1e-3, name=None):
        super().__init__(name)
        self.epsilon = _epsilon(epsilon, type(self).__name__)

    def _build(self, input_shapes, rng):
        c = input_shapes[0][-1]
        if c is None:
            raise ShapeError("LayerNorm needs a known last dimension")
        self.weights.update(gamma=np.ones(c, np.float32), beta=np.zeros(c, np.float32))
        self.roles.update(gamma="trainable", beta="trainable")

    def emit(self, ctx, inputs):
        y, _mean, _inv_std = ctx.gb.op("LayerNormalization",
                                       [inputs[0], ctx.weight(self, "gamma"), ctx.weight(self, "beta")],
                                       outputs=3, axis=-1, epsilon=self.epsilon)
        return y

    def get_config(self):
        return {"name": self.name, "epsilon": self.epsilon}


class Embedding(Layer):
    """Rows of a ``(input_dim, output_dim)`` table, looked up by int64 indices."""

    input_dtype = np.dtype(np.int64)

    def __init__(self, input_dim: int, output_dim: int, name=None, seed=None):
        super().__init__(name, seed)
        for what, v in (("input_dim", input_dim), ("output_dim", output_dim)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise OrtrainError(f"Embedding({what}=...): expected a positive int, received {v!r}")
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)

    def _build(self, input_shapes, rng):
        self.weights["embeddings"] = rng.uniform(-0.05, 0.05, (self.input_dim, self.output_dim)).astype(np.float32)
        self.roles["embeddings"] = "trainable"

    def output_shape(self, input_shapes):
        return tuple(input_shapes[0]) + (self.output_dim,)

    def emit(self, ctx, inputs):
        return ctx.gb.op("Gather", [ctx.weight(self, "embeddings"), inputs[0]], axis=0)

    def get_config(self):
        return {"name": self.name, "input_dim": self.input_dim, "output_dim": self.output_dim}


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


class Flatten(Layer):
    """Every non-batch dimension into one: ``(batch, d1, d2, ...) -> (batch, d1 * d2 * ...)``."""

    def output_shape(self, input_shapes):
        rest = input_shapes[0][1:]
        return (input_shapes[0][0], None if any(d is None for d in rest) else int(np.prod(rest, dtype=np.int64)))

    def emit(self, ctx, inputs):
        return ctx.gb.op("Flatten", [inputs[0]], axis=1)


class Reshape(Layer):
    """Reshape the non-batch dimensions to ``target_shape`` (one entry may be -1)."""

    def __init__(self, target_shape, name=None):
        super().__init__(name)
        if is_integer(target_shape):
            target_shape = (target_shape,)
        if isinstance(target_shape, np.ndarray) and target_shape.ndim == 1:
            target_shape = list(target_shape)
        if not isinstance(target_shape, (tuple, list)) or not all(is_integer(d) for d in target_shape):
            raise OrtrainError(f"Reshape(target_shape=...): expected a tuple of ints, received {target_shape!r}")
        target = tuple(int(d) for d in target_shape)
        if not target or sum(d == -1 for d in target) > 1 or any(d == 0 or d < -1 for d in target):
            raise OrtrainError(f"Reshape(target_shape=...): expected positive sizes and at most one -1, "
                               f"received {target_shape!r}")
        self.target_shape = target

    def output_shape(self, input_shapes):
        rest = input_shapes[0][1:]
        target = list(self.target_shape)
        if any(d is None for d in rest):
            return (input_shapes[0][0],) + tuple(None if d == -1 else d for d in target)
        total = int(np.prod(rest, dtype=np.int64))
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if -1 in target:
            if total % known:
                raise ShapeError(f"Reshape cannot fit {describe_shape(input_shapes[0])} into {self.target_shape}")
            target[target.index(-1)] = total // known
        elif known != total:
            raise ShapeError(f"Reshape cannot fit {describe_shape(input_shapes[0])} into {self.target_shape}")
        return (input_shapes[0][0],) + tuple(target)

    def emit(self, ctx, inputs):
        # 0 copies the batch dimension, so the batch stays free. The -1 is written resolved where the
        # sizes are known: with 0 rows the runtime cannot infer it.
        rest = ctx.output_shape[1:]
        target = rest if rest and None not in rest else self.target_shape
        shape = ctx.gb.const([0, *target], np.int64, hint="shape")
        return ctx.gb.op("Reshape", [inputs[0], shape])

    def get_config(self):
        return {"name": self.name, "target_shape": list(self.target_shape)}


class Add(Layer):
    """Elementwise sum of two or more tensors of the same shape."""

    n_inputs = None

    def output_shape(self, input_shapes):
        first = tuple(input_shapes[0][1:])
        for s in input_shapes[1:]:
            if tuple(s[1:]) != first:
                raise ShapeError(f"Add needs inputs of one shape, received "
                                 f"{', '.join(describe_shape(s) for s in input_shapes)}")
        return input_shapes[0]

    def emit(self, ctx, inputs):
        out = inputs[0]
        for other in inputs[1:]:
            out = ctx.gb.op("Add", [out, other])
        return out


class Concatenate(Layer):
    """Join tensors along ``axis`` (default the last; 0 is the batch and is refused)."""

    n_inputs = None

    def __init__(self, axis: int = -1, name=None):
        super().__init__(name)
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
            raise OrtrainError(f"Concatenate(axis=...): expected an int, received {axis!r}")
        if axis == 0:
            raise OrtrainError("Concatenate(axis=0) would join along the batch; choose a feature axis")
        self.axis = int(axis)

    def output_shape(self, input_shapes):
        rank = len(input_shapes[0])
        if not -rank <= self.axis < rank:
            raise ShapeError(f"Concatenate(axis={self.axis}): inputs of rank {rank} have axes {-rank} to "
                             f"{rank - 1}")
        axis = self.axis % rank
        if axis == 0 or any(len(s) != rank for s in input_shapes):
            raise ShapeError(f"Concatenate(axis={self.axis}) cannot join "
                             f"{', '.join(describe_shape(s) for s in input_shapes)}")
        for d in range(1, rank):
            if d != axis and len({s[d] for s in input_shapes}) > 1:
                raise ShapeError(f"Concatenate(axis={self.axis}) needs equal sizes off the axis, received "
                                 f"{', '.join(describe_shape(s) for s in input_shapes)}")
        sizes = [s[axis] for s in input_shapes]
        total = None if any(v is None for v in sizes) else sum(sizes)
        out = list(input_shapes[0])
        out[axis] = total
        return tuple(out)

    def emit(self, ctx, inputs):
        return ctx.gb.op("Concat", list(inputs), axis=self.axis)

    def get_config(self):
        return {"name": self.name, "axis": self.axis}


_REGISTRY = {cls.__name__: cls for cls in (Dense, Activation, Dropout, BatchNorm, LayerNorm, Embedding, Conv2D,
                                           MaxPool2D, AvgPool2D, GlobalAvgPool2D, Flatten, Reshape, Add,
                                           Concatenate)}


def layer_from_config(kind: str, config: dict) -> Layer:
    if kind not in _REGISTRY:
        raise OrtrainError(f"unknown layer type {kind!r} in a saved model")
    return _REGISTRY[kind](**config)
