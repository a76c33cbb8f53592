"""The base of every layer: :class:`Layer`, the :class:`Weights` record it keeps its arrays in,
the :class:`EmitContext` it emits through, and the helpers layers share (activations, Glorot init).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ortrain import _random
from ortrain._arrays import as_array, checked_flag, checked_seed, read_array
from ortrain._keywords import name_unknown_arguments, names_unknown_arguments_of_methods
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.graph import GraphBuilder
from ortrain.graph.activations import sigmoid
from ortrain.graph.forward import ROLES
from ortrain.nn.symbolic import SymbolicTensor, ordered_state, unordered_state

__all__ = ["ACTIVATIONS", "EDITS", "EmitContext", "Layer", "Weights"]

ACTIVATIONS = ("linear", "relu", "sigmoid", "tanh", "softmax", "gelu", "leaky_relu", "elu", "selu", "softplus",
               "softsign", "silu", "hard_sigmoid", "hard_silu", "relu6", "exponential", "mish", "log_softmax")
_ALIASES = {"swish": "silu", "hard_swish": "hard_silu"}  # Keras' other names
LEAKY_RELU_ALPHA = 0.2  # Keras 3's default negative slope


def check_activation(name) -> str:
    if name is None:
        return "linear"
    key = name.lower() if isinstance(name, str) else None
    key = _ALIASES.get(key, key)
    if key not in ACTIVATIONS:
        raise OrtrainError(f"activation: expected one of {', '.join(ACTIVATIONS + tuple(_ALIASES))}, received "
                           f"{name!r}")
    return key


def emit_activation(gb: GraphBuilder, x: str, name: str, axis: int = -1) -> str:
    """Append the nodes of an activation; ``linear`` appends nothing. ``axis``: the one ``softmax``
    and ``log_softmax`` normalise over."""
    if name == "linear":
        return x
    if name == "relu":
        return gb.op("Relu", [x])
    if name == "sigmoid":
        return sigmoid(gb, x)
    if name == "tanh":
        return gb.op("Tanh", [x])
    if name == "softmax":
        return gb.op("Softmax", [x], axis=axis)
    if name == "leaky_relu":
        return gb.op("LeakyRelu", [x], alpha=LEAKY_RELU_ALPHA)
    # Keras 3's definitions. The ops without a gradient in onnxruntime-training (Elu, Selu,
    # Softplus, Softsign, HardSigmoid, HardSwish) stay in the model and its export; the training
    # graphs write them in arithmetic (Model.forward_graph), with PyTorch's derivative at the kinks.
    if name in ("elu", "selu", "softplus", "softsign", "exponential", "log_softmax"):
        op = {"elu": "Elu", "selu": "Selu", "softplus": "Softplus", "softsign": "Softsign", "exponential": "Exp",
              "log_softmax": "LogSoftmax"}[name]
        return gb.op(op, [x], axis=axis if name == "log_softmax" else None)
    if name == "silu":
        # onnxruntime's Sigmoid kernel: the exact form would cost what it costs sigmoid (6-15% of an
        # MLP step for a 512-wide layer), and times x the kernel's error in the tails stays within
        # 2e-7 of max(1, |x|), value and derivative (docs/known-limits.md)
        return gb.op("Mul", [x, gb.op("Sigmoid", [x])])
    if name == "hard_sigmoid":  # relu6(x + 3) / 6
        return gb.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
    if name == "hard_silu":  # x * hard_sigmoid(x)
        return gb.op("HardSwish", [x])
    if name == "relu6":  # not Clip, whose runtime derivative is 1 at 0 and 6, where Keras' and PyTorch's is 0
        six = gb.const(6.0, hint="six")
        return gb.op("Where", [gb.op("GreaterOrEqual", [x, six]), six, gb.op("Relu", [x])])
    if name == "mish":  # x * tanh(softplus(x))
        return gb.op("Mul", [x, gb.op("Tanh", [gb.op("Softplus", [x])])])
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
    return uniform_weight(rng, -limit, limit, shape)


class _TooLarge(OrtrainError):
    """A weight the machine cannot allocate; :meth:`Layer.build` names the layer."""


def uniform_weight(rng: np.random.Generator, low: float, high: float, shape: tuple) -> np.ndarray:
    """A float32 weight drawn uniformly; one too large to hold is refused with its size, not numpy's
    raw MemoryError."""
    try:
        return rng.uniform(low, high, size=shape).astype(np.float32, copy=False)  # (a copy's zeros: as they are)
    except (MemoryError, ValueError) as exc:
        size = math.prod(int(d) for d in shape)
        raise _TooLarge(f"a weight of shape {tuple(int(d) for d in shape)} holds {size:,} numbers "
                           f"({size * 4 / 2**30:,.1f} GiB in float32), which this machine cannot allocate "
                           f"({type(exc).__name__}); give the layer fewer units, filters or rows") from None


class EmitContext:
    """What a layer needs while emitting: the builder, its weights' graph names and the shape of
    the output it emits (batch first, ``None`` where free)."""

    def __init__(self, gb: GraphBuilder):
        self.gb = gb
        self.output_shape: tuple = ()

    @staticmethod
    def weight(layer: Layer, suffix: str) -> str:
        return f"{layer.name}.{suffix}"


# Held around a write of several weights (set_weights) and around reads of several (a model's
# weight table, get_weights): a reader in another thread sees all of them old or all new.
WEIGHTS_LOCK = threading.RLock()
EDITS = [0]  # weights set on any layer so far: a running fit looks at its layers only when it moved
# Changes of which weights train, on any layer or model so far (layer.trainable, a model's freeze,
# unfreeze, trainable and batch-norm statistics switches): a Trainer reads what trains again only
# when it moved.
FREEZES = [0]


def what_trains(model) -> tuple[set[str], set[str]]:
    """The weights that train and the batch-norm statistics kept fixed: what a trainer's graphs fix.

    Remembered on the model (a ``train_on_batch`` call looks five times) until it may have changed:
    ``FREEZES`` moved, a layer's weights' roles changed (built, or set by the layer's own code), or the
    model's frozen sets or layers were replaced (compared by identity)."""
    count = FREEZES[0]  # read before the answer: a freeze from another thread meanwhile moves it past the memo's
    layers = tuple(getattr(model, "layers", ()))
    key = (count, tuple(tuple(lyr.__dict__.get("roles", {}).items()) for lyr in layers))
    stats = getattr(model, "_frozen_stats", None)
    held = (getattr(model, "_frozen", None), stats, *layers)
    memo = model.__dict__.get("_trains_memo")
    if memo is None or memo[0] != key or len(memo[1]) != len(held) or any(a is not b for a, b in zip(memo[1], held)):
        memo = model.__dict__["_trains_memo"] = (key, held, frozenset(model.trainable_weight_names),
                                                 frozenset(stats or ()))
    return set(memo[2]), set(memo[3])


# The models a fit is training, and their layers, by id -> the fit's sync: reading their weights
# (get_weights, predict, evaluate, save...) on the fit's thread first brings the trained values
# over, as the model a Keras user holds is the one being trained.
LIVE_SYNC: dict = {}


def sync_live(obj) -> None:
    """Bring ``obj`` (a model or a layer) up to date with the fit training it, if one is."""
    sync = LIVE_SYNC.get(id(obj))
    if sync is not None:
        sync()


class Weights(dict):
    """A layer's weights by suffix: read-only arrays. Setting one (``layer.weights["kernel"] = a``,
    as ``set_weights`` does) stores a read-only copy and counts as a change every model using the
    layer sees: a model caches its graph, prediction session and artifacts' digest until its
    weights change (an in-place edit went unseen by predict and by the artifact cache). Weights
    are not removed, and a built layer takes no new ones."""

    def __init__(self, layer: Layer):
        super().__init__()
        self._layer = layer
        # when each key was last set (EDITS' count then): each model holding the layer takes the
        # keys set since it last looked (a running fit takes them over), whatever another model took
        self.set_at: dict[str, int] = {}

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
        EDITS[0] += 1
        self.set_at[key] = EDITS[0]

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
        sync_live(self._layer)  # taken during a fit of a model holding the layer: the trained values
        return _weights_of, (self._layer, dict(self))


def _weights_of(layer: Layer, items: dict) -> Weights:
    weights = Weights(layer)
    for key, value in items.items():
        dict.__setitem__(weights, key, read_only(np.array(value, copy=True)))
    return weights


class Layer:
    """Base class of the layers. A layer of your own subclasses it and implements:

    - ``__init__(self, ..., name=None)``, calling ``super().__init__(name)`` (or ``(name, seed)``);
    - ``_build(self, input_shapes, rng)``: make the weights for inputs of these shapes (batch
      first, the batch ``None``), drawing from the numpy Generator ``rng``: for each,
      ``self.weights["gain"] = array`` (float32) and ``self.roles["gain"] = "trainable"``
      (``"frozen"`` for a constant the optimizer leaves alone, ``"buffer"`` for a statistic);
    - ``output_shape(self, input_shapes)``: the output's shape (by default the first input's);
    - ``emit(self, ctx, inputs)``: write the layer's ONNX nodes and return its output's name.
      ``inputs`` are the names of the input tensors, ``ctx.gb.op("Mul", [a, b], **attributes)``
      appends a node and returns its output's name, and ``ctx.weight(self, "gain")`` names a weight;
    - ``get_config(self)``: the constructor's arguments, ``{**super().get_config(), "factor": ...}``,
      from which a trainer, ``copy()`` and ``load_model`` make the layer again.

    ::

        class Scale(ot.layers.Layer):
            def __init__(self, factor=1.0, name=None):
                super().__init__(name)
                self.factor = factor

            def _build(self, input_shapes, rng):
                self.weights["gain"] = np.full(input_shapes[0][-1], self.factor, np.float32)
                self.roles["gain"] = "trainable"

            def emit(self, ctx, inputs):
                return ctx.gb.op("Mul", [inputs[0], ctx.weight(self, "gain")])

            def get_config(self):
                return {**super().get_config(), "factor": self.factor}
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name_unknown_arguments(cls)  # Keras' arguments ported as written get an OrtrainError with the fix

    n_inputs: int | None = 1  # None: any number >= 2
    input_dtype = np.dtype(np.float32)
    _trainable = True

    @property
    def trainable(self) -> bool:
        """Keras' switch: ``layer.trainable = False`` freezes this layer's weights in every model
        it belongs to, from the next fit or ``Trainer`` on (a batch norm also keeps its running
        statistics fixed, as in Keras). ``model.freeze`` freezes within one model."""
        return self._trainable

    @trainable.setter
    def trainable(self, value) -> None:
        self._trainable = checked_flag(value, f"layer {self.name!r}: trainable")
        FREEZES[0] += 1

    @property
    def name(self) -> str | None:
        """The layer's name, the first part of its weights' names (``dense_0.kernel``). Fixed once a
        model holds the layer: weights, optimizer moments, frozen sets and saved files are keyed by it."""
        return self.__dict__.get("_name")

    @name.setter
    def name(self, value) -> None:
        current = self.__dict__.get("_name")
        if value is not None and value == current:
            return
        if value is not None and (not isinstance(value, str) or not value or "." in value or "/" in value):
            raise OrtrainError(f"name: expected a non-empty string without '.' or '/', received {value!r}")
        if self.__dict__.get("_in_model"):
            raise OrtrainError(f"layer {current!r}: a layer's name cannot change once a model holds it (its weights, "
                               f"optimizer moments and saved files are keyed by it), received {value!r}; give the "
                               f"name when creating the layer: {type(self).__name__}(..., name={value!r})")
        self._name = value

    def __init__(self, name: str | None = None, seed: int | None = None):
        self.name = name
        self.seed = checked_seed(seed, f"{type(self).__name__}(seed=...)")
        self._weights = Weights(self)
        self.roles: dict[str, str] = {}
        self.built_for: tuple | None = None

    # -- building --------------------------------------------------------------------
    def build(self, input_shapes: list[tuple], rng: np.random.Generator | None = None,
              stack_seed: int | None = None) -> None:
        """Create the weights for these input shapes (once; a later call must agree). ``stack_seed``
        (a seeded Sequential's, for this layer) seeds what the layer draws at run time (dropout masks)
        when the layer has no seed of its own."""
        key = tuple(tuple(s[1:]) for s in input_shapes)
        if self.built_for is not None:
            if key != self.built_for:
                raise ShapeError(f"layer {self.name or type(self).__name__!r} was built for inputs {self.built_for} and is now called on "
                                 f"{key}; a layer used twice must see the same shapes")
            return
        self._stack_seed = stack_seed
        try:
            self._build(input_shapes, rng if rng is not None else _random.generator(self.seed))
            self._check_roles()
            self.output_shape(input_shapes)  # shapes it cannot take are refused before it counts as built
        except BaseException as exc:
            self.unbuild()
            which = f"layer {self.name!r} ({type(self).__name__})" if self.name else f"a {type(self).__name__} layer"
            if isinstance(exc, _TooLarge):
                raise OrtrainError(f"{which}: {exc}") from None
            if isinstance(exc, MemoryError):  # a batch norm's statistics of a huge channel count
                raise OrtrainError(f"{which}: its weights for inputs {', '.join(describe_shape(s) for s in input_shapes)} are "
                                   "more than this machine can allocate (MemoryError); give it smaller inputs") from None
            raise
        finally:
            del self._stack_seed
        self.built_for = key

    def _check_roles(self) -> None:
        """Every weight a layer's ``_build`` made has a role (a layer of the user's may leave one out)."""
        for suffix in self._weights:
            role = self.roles.get(suffix)
            if role not in ROLES:
                raise OrtrainError(f"{type(self).__name__}._build: weight {suffix!r} has role {role!r}; expected one of "
                                   f"{', '.join(map(repr, ROLES))}: set self.roles[{suffix!r}] = 'trainable' beside "
                                   f"self.weights[{suffix!r}] = array")

    def unbuild(self) -> None:
        """Back to a layer never built (a build, or a model it was added to, failed)."""
        self._weights, self.roles, self.built_for = Weights(self), {}, None
        self.__dict__.pop("_first_call", None)

    # -- weights ---------------------------------------------------------------------
    @property
    def weights(self) -> Weights:
        """The weights by suffix (``kernel``, ``bias``...): read-only arrays, see :class:`Weights`;
        during a fit of a model holding the layer, the trained values (read on the fit's thread)."""
        sync_live(self)
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
        """Copies of this layer's weights, in ``weights`` order, as Keras' ``layer.get_weights()``
        (during a fit of its model, the trained values)."""
        with WEIGHTS_LOCK:
            arrays = list(self.weights.values())
        return [a.copy() for a in arrays]

    @property
    def trainable_weights(self) -> list[np.ndarray]:
        """Copies of the weights that train with the layer (none when ``trainable`` is False), as
        Keras lists them; a model's ``freeze`` is the model's business (``model.trainable_weights``)."""
        return self._weights_that_train(True)

    @property
    def non_trainable_weights(self) -> list[np.ndarray]:
        """Copies of the others: a batch norm's running statistics, or all when ``trainable`` is False."""
        return self._weights_that_train(False)

    def _weights_that_train(self, train: bool) -> list[np.ndarray]:
        return [a.copy() for k, a in self.weights.items()
                if (self.trainable and self.roles.get(k) == "trainable") == train]

    def __getattr__(self, name: str):
        # Keras' layer.kernel, layer.bias, layer.gamma...: a weight by its suffix (read-only array)
        weights = self.__dict__.get("_weights")
        if weights is not None and not name.startswith("_") and name in weights:
            sync_live(self)  # during a fit of a model holding it, the trained value
            return weights[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        with WEIGHTS_LOCK:
            for name, a in staged:  # checked and copied: stored as they are; the models using the layer see it
                self.weights.put(name, a)

    def _build(self, input_shapes, rng) -> None:
        """Make the weights for inputs of ``input_shapes``: ``self.weights[suffix] = array`` and
        ``self.roles[suffix] = "trainable"`` (or ``"frozen"``, ``"buffer"``) for each; none by default."""

    def output_shape(self, input_shapes: list[tuple]) -> tuple:
        """The output's shape for inputs of ``input_shapes`` (batch first, ``None`` where free)."""
        return input_shapes[0]

    def emit(self, ctx: EmitContext, inputs: list[str]) -> str:
        """Append the layer's ONNX nodes with ``ctx.gb.op(...)`` to the input tensors named ``inputs``
        (weights named by ``ctx.weight(self, suffix)``); return the output tensor's name."""
        raise NotImplementedError(f"{type(self).__name__}.emit: a layer writes its ONNX nodes there; see "
                                  "help(ot.layers.Layer)")

    def get_config(self) -> dict:
        """The constructor's arguments by name, from which the layer is made again (Keras' ``get_config``)."""
        return {"name": self.name}

    # -- functional API --------------------------------------------------------------
    def __call__(self, x):
        tensors = list(x) if isinstance(x, (list, tuple)) else [x]
        if not all(isinstance(t, SymbolicTensor) for t in tensors):
            raise OrtrainError(f"{type(self).__name__} layers are called on ot.Input(...) tensors or on the "
                               f"outputs of other layers; received {type(x).__name__}. "
                               "To run a model on arrays use model.predict(x)")
        if self.n_inputs == 1 and len(tensors) != 1:
            raise OrtrainError(f"{type(self).__name__} takes one input, received {len(tensors)}")
        if self.n_inputs is None and len(tensors) < 2:
            raise OrtrainError(f"{type(self).__name__} merges two or more inputs, received {len(tensors)}")
        out = SymbolicTensor.from_layer(self, tensors)
        self.__dict__.setdefault("_first_call", (tensors[0] if self.n_inputs == 1 else tensors, out))
        return out

    @property
    def input(self):
        """Keras' ``layer.input``: the tensor of the layer's first call (a list for a merge)."""
        return self._called()[0]

    @property
    def output(self):
        """Keras' ``layer.output``: the tensor of the layer's first call, e.g. for a feature
        extractor ``ot.Model(model.input, model.layers[-2].output)`` sharing the layers."""
        return self._called()[1]

    def _called(self):
        called = self.__dict__.get("_first_call")
        if called is None:
            raise OrtrainError(f"layer {self.name or type(self).__name__!r} has not been called on a tensor yet: it has "
                               "no input or output; call it, layer(ot.Input(shape)), or use it in a model")
        return called

    def __getstate__(self) -> dict:
        return ordered_state(self.__dict__, (), [self])  # see ordered_state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(unordered_state(state))

    def __repr__(self) -> str:
        try:
            cfg = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        except Exception:  # noqa: BLE001 - a repr never raises (a layer whose __init__ failed half-way)
            cfg = "..."
        return f"{type(self).__name__}({cfg}{', ' if cfg else ''}name={self.__dict__.get('_name')!r})"


names_unknown_arguments_of_methods(Layer, "get_weights", "set_weights")
