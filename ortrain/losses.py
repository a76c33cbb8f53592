"""Losses, as small builders that append a loss to a forward graph.

Each loss first builds an *elementwise* tensor ``E`` of shape ``[batch, k]`` (``k``
outputs for the regression losses and binary cross-entropy, ``k = 1`` for the
categorical ones), then reduces it:

* no weights: ``mean(E)`` — PyTorch's default reduction, Keras' ``sum_over_batch_size``;
* one weight per sample ``w[batch, 1]``: ``sum(w * E) / (batch * k)``; for a prediction with
  positions (``[batch, time, k]``) ``E`` has them too, and the weights may hold one per
  position, ``w[batch, time, 1]``: ``sum(w * E) / (batch * time * k)``;
* one weight per output element ``w[batch, k]`` (mean squared error only):
  ``sum(w * E) / (batch * k)``, with no renormalisation, so a zero weight removes
  that element's gradient exactly.

>>> get("mse").config()
{'name': 'mse'}
>>> get(SparseCategoricalCrossentropy(from_logits=True)).config()
{'name': 'sparse_categorical_crossentropy', 'from_logits': True}
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ortrain import engine
from ortrain._arrays import (
    FLOAT32_TINY,
    as_array,
    as_float32,
    checked_flag,
    is_real,
    label_positions,
    prepare_labels,
    prepare_sample_weight,
    sample_weight_shape,
)
from ortrain._keywords import name_unknown_arguments, names_unknown_arguments_of
from ortrain.errors import OrtrainError, ShapeError
from ortrain.graph import GraphBuilder, TensorSpec

__all__ = [
    "BinaryCrossentropy",
    "CategoricalCrossentropy",
    "Huber",
    "Loss",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "SparseCategoricalCrossentropy",
    "get",
]

EPSILON = 1e-7  # probabilities are clipped to [EPSILON, 1 - EPSILON] before log, as Keras does


class Loss:
    """Base class: subclasses implement :meth:`elementwise`."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name_unknown_arguments(cls)  # Keras' arguments ported as written get an OrtrainError with the fix

    def __init__(self):
        """A loss without settings (``MeanSquaredError()``, ``MeanAbsoluteError()``): the signature
        help() shows for them, where ``object.__init__`` would show ``(*args, **kwargs)``."""

    name = "loss"
    label_dtype = np.dtype(np.float32)
    element_weights = False  # one weight per output element is allowed

    def config(self) -> dict:
        return {"name": self.name}

    def label_shape(self, pred_shape: tuple) -> tuple:
        return tuple(pred_shape)

    @property
    def class_labels(self) -> bool:
        """Whether the labels are class indices (integers), checked against the number of classes."""
        return self.label_dtype.kind in "iu"

    def n_classes(self, pred_shape: tuple) -> int | None:
        """How many classes an integer label indexes (labels are checked against it); None when labels
        are not class indices or the output's last dimension is free."""
        return None

    def elementwise(self, gb: GraphBuilder, pred: str, label: str) -> str:
        raise NotImplementedError

    def _elementwise(self, gb: GraphBuilder, pred: str, label: str, sigmoid_of: str | None) -> str:
        return self.elementwise(gb, pred, label)

    # Whether build() takes sigmoid_of, the logits of a prediction that is a sigmoid's.
    reads_sigmoid_logits = False

    # Whether elementwise() sums the last axis away (to a size of 1): the classes of a cross-entropy.
    sums_last_axis = False

    def build(self, gb: GraphBuilder, pred: str, label: str, weight: str | None = None,
              pred_shape: tuple | None = None, sigmoid_of: str | None = None) -> str:
        """Append the loss; returns the name of the scalar loss value. ``pred_shape`` (the
        prediction's static shape, the batch free) picks the fused forms and lets a large sample's
        elements be averaged before the float64 mean over the batch. ``sigmoid_of``: the logits
        the prediction is ortrain's sigmoid of, where the forward graph shows it (a binary
        cross-entropy takes its gradient from them)."""
        e = self._elementwise(gb, pred, label, sigmoid_of)
        if weight is not None:
            e = gb.op("Mul", [e, weight])
        per_sample = None
        if pred_shape is not None and len(pred_shape) >= 2:
            dims = pred_shape[1:-1] if self.sums_last_axis else pred_shape[1:]
            if all(isinstance(d, (int, np.integer)) for d in dims):
                per_sample = (int(np.prod(dims)), len(pred_shape))
        return _mean(gb, e, per_sample)

    def __call__(self, y_true, y_pred, sample_weight=None) -> float:
        """The loss of ``y_pred`` against ``y_true``, as a number: the graph ``compile`` appends,
        run by onnxruntime, with the reduction training reports (see the module's docstring).

        Keras' argument order, not PyTorch's (``loss(input, target)``). ``y_pred`` is batch
        first (a vector is one output for each sample); labels and weights take what ``fit``
        takes: ``(batch,)`` or ``(batch, 1)`` weights, one per output element for mean
        squared error. Computed from scratch at each call: a check, not a training path.
        Categorical cross-entropy takes probabilities as they are, as training does, where Keras
        first divides each row by its sum (the same for a softmax output, whose rows sum to 1).
        """
        pred = as_array(y_pred, np.float32, "y_pred")
        if pred.ndim == 0 or not pred.shape[0]:
            raise ShapeError(f"y_pred: expected predictions batch first, of at least one sample, received shape "
                             f"{pred.shape}")
        if pred.ndim == 1:
            if self.label_dtype.kind in "iu" or self.name == "categorical_crossentropy":
                raise ShapeError(f"y_pred: {self.name} expected predictions of shape (batch, classes), received "
                                 f"shape {pred.shape}")
            pred = pred.reshape(-1, 1)
        rows = pred.shape[0]
        spec = TensorSpec("label", self.label_dtype, self.label_shape(pred.shape))
        try:
            labels = prepare_labels(spec, y_true, "y_true", rows, self.n_classes(pred.shape), rows_of="y_pred",
                                    one_hot=self.name == "categorical_crossentropy",
                                    probabilities=self.name == "binary_crossentropy")
            weight = None
            if sample_weight is not None:
                w = as_array(sample_weight, np.float32, "sample_weight")
                elements = self.element_weights and w.shape == pred.shape and pred.shape[-1] > 1
                shape = pred.shape if elements else sample_weight_shape(pred.shape)
                weight = prepare_sample_weight(w, shape, "sample_weight", rows, label_positions(labels, shape))
        except ShapeError as exc:  # fit's checks, whose fixes speak of a model: here y_pred sets the shapes
            message = str(exc).split("; for one weight per output unit")[0].replace("the model's output", "y_pred")
            raise ShapeError(message.replace(", or build the model for this shape", " (y_pred's shape sets it)")
                             + ("; for mean squared error, weights shaped as y_pred weigh each element"
                                if self.element_weights and "sample_weight" in message else "")) from None
        gb = GraphBuilder(name="loss")
        feeds = {"pred": pred, "label": labels}
        gb.add_input("pred", np.float32, pred.shape)
        gb.add_input("label", labels.dtype, labels.shape)
        if weight is not None:
            feeds["weight"] = weight
            gb.add_input("weight", np.float32, weight.shape)
        value = self.build(gb, "pred", "label", "weight" if "weight" in feeds else None, pred_shape=pred.shape)
        gb.op("Identity", [value], outputs=["loss"])
        gb.add_output("loss", np.float32, ())
        return float(engine.run_model(gb.to_model(), feeds)[0])

    def __eq__(self, other) -> bool:
        return isinstance(other, Loss) and other.config() == self.config()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.config().items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")
        return f"{type(self).__name__}({args})"


# From this many elements a sample, its loss elements are averaged in float32 before the float64
# mean over the batch (casting them all would cost more than the loss: 50% of a step whose output
# is 20,000 wide); up to it they are cast whole.
SAMPLE_MEAN_FROM = 64


def _mean(gb: GraphBuilder, e: str, per_sample: tuple[int, int] | None = None) -> str:
    """The mean of every element of ``e``, over the batch in float64: onnxruntime's float32
    reductions add the elements in turn, about 1e-3 off over a million alike values (a whole data
    set evaluated in one run), where PyTorch's and numpy's pairwise sums stay near 1e-8.
    ``per_sample``: ``(elements a sample, rank of e)`` where known; a sample of many elements is
    averaged first, in float32 (its vectorised sum of thousands stays near 1e-6)."""
    if per_sample is not None and per_sample[0] > SAMPLE_MEAN_FROM:
        count, rank = per_sample
        sums = gb.op("ReduceSum", [e, gb.const(list(range(1, rank)), np.int64, hint="axes")], keepdims=0)
        e = gb.op("Div", [sums, gb.const(float(count), hint="sample_elements")])
    wide = gb.op("Cast", [e], to=TensorProto.DOUBLE)
    return gb.op("Cast", [gb.op("ReduceMean", [wide], keepdims=0)], to=TensorProto.FLOAT)


def _clip_probs(gb: GraphBuilder, p: str) -> str:
    return gb.op("Clip", [p, gb.const(EPSILON, hint="eps"), gb.const(1.0 - EPSILON, hint="one_minus_eps")])


def _last_axis(gb: GraphBuilder) -> str:
    return gb.const([-1], np.int64, hint="axes")


class MeanSquaredError(Loss):
    """``mean((pred - y)^2)`` over the batch and the output elements, as PyTorch's default."""

    name = "mse"
    element_weights = True

    def elementwise(self, gb, pred, label):
        d = gb.op("Sub", [pred, label])
        return gb.op("Mul", [d, d])


class MeanAbsoluteError(Loss):
    """``mean(|pred - y|)`` over the batch and the output elements (gradient 0 where equal)."""

    name = "mae"

    def elementwise(self, gb, pred, label):
        return gb.op("Abs", [gb.op("Sub", [pred, label])])


class Huber(Loss):
    """``0.5 d^2`` for ``|d| <= delta``, ``delta (|d| - delta/2)`` beyond (PyTorch's ``HuberLoss``)."""

    name = "huber"

    def __init__(self, delta: float = 1.0):
        # smaller values are 0 in the sessions: no gradient at all
        if not (is_real(delta) and delta > 0 and np.isfinite(delta) and FLOAT32_TINY <= as_float32(delta) < np.inf):
            raise OrtrainError(f"Huber(delta=...): expected a positive finite number that float32 (the runtime's "
                               f"precision) holds as a normal number, about 1.2e-38 to 3.4e38, received {delta!r}")
        self.delta = float(delta)

    def config(self):
        return {"name": self.name, "delta": self.delta}

    def elementwise(self, gb, pred, label):
        # Branch-free: with a = min(|d|, delta), huber = a * (|d| - a/2). Its gradient, a' (|d| - a/2)
        # + a (|d|' - a'/2), never adds and takes away delta: the form a^2/2 + delta (|d| - a) did,
        # and lost residuals below delta * 6e-8 in float32 (a gradient of 0, or twice too large).
        ad = gb.op("Abs", [gb.op("Sub", [pred, label])])
        a = gb.op("Min", [ad, gb.const(self.delta, hint="delta")])
        return gb.op("Mul", [a, gb.op("Sub", [ad, gb.op("Mul", [a, gb.const(0.5, hint="half")])])])


class CategoricalCrossentropy(Loss):
    """``-sum(y * log p)`` over the last axis; ``y`` one-hot or probabilities.

    ``p`` is clipped to ``[1e-7, 1 - 1e-7]`` before the log, as Keras does, so a wrong class
    predicted with certainty costs ``-log(1e-7)`` (about 16.1), not infinity. With
    ``from_logits=True`` the model's output is logits: ``log p`` is a stable log-softmax, unclipped.
    """

    name = "categorical_crossentropy"
    sums_last_axis = True

    def __init__(self, from_logits: bool = False):
        self.from_logits = checked_flag(from_logits, "CategoricalCrossentropy(from_logits=...)")

    def config(self):
        return {"name": self.name, "from_logits": self.from_logits}

    def elementwise(self, gb, pred, label):
        if self.from_logits:
            logp = gb.op("LogSoftmax", [pred], axis=-1)
        else:
            logp = gb.op("Log", [_clip_probs(gb, pred)])
        s = gb.op("ReduceSum", [gb.op("Mul", [label, logp]), _last_axis(gb)], keepdims=1)
        return gb.op("Neg", [s])


class SparseCategoricalCrossentropy(Loss):
    """``-log p[label]``: cross-entropy against integer class labels (int64, one fewer dimension
    than the prediction). ``p`` is clipped to ``[1e-7, 1 - 1e-7]`` before the log, as Keras does;
    with ``from_logits=True`` the output is logits and ``log p`` a stable log-softmax, unclipped."""

    name = "sparse_categorical_crossentropy"
    sums_last_axis = True
    label_dtype = np.dtype(np.int64)

    def __init__(self, from_logits: bool = False):
        self.from_logits = checked_flag(from_logits, "SparseCategoricalCrossentropy(from_logits=...)")

    def config(self):
        return {"name": self.name, "from_logits": self.from_logits}

    def label_shape(self, pred_shape):
        return tuple(pred_shape[:-1])

    def n_classes(self, pred_shape):
        last = pred_shape[-1] if pred_shape else None
        return int(last) if isinstance(last, (int, np.integer)) else None

    def elementwise(self, gb, pred, label):
        idx = gb.op("Unsqueeze", [label, _last_axis(gb)])
        logp = gb.op("LogSoftmax", [pred], axis=-1) if self.from_logits else \
            gb.op("Log", [_clip_probs(gb, pred)])
        return gb.op("Neg", [gb.op("GatherElements", [logp, idx], axis=-1)])

    def build(self, gb, pred, label, weight=None, pred_shape=None, sigmoid_of=None):
        if self.from_logits and weight is None and pred_shape is not None and len(pred_shape) == 2:
            # The fused op is faster and exact; it takes classes on axis 1, i.e. 2-D logits.
            per_sample, _ = gb.op("SoftmaxCrossEntropyLoss", [pred, label], outputs=2, reduction="none")
            return _mean(gb, per_sample)  # its own mean adds in turn, as ReduceMean does
        return super().build(gb, pred, label, weight, pred_shape)


class BinaryCrossentropy(Loss):
    """``-mean(y log p + (1 - y) log(1 - p))``: probabilities clipped to ``[1e-7, 1 - 1e-7]``, or
    logits with ``from_logits=True`` (computed without overflow at any logit, as PyTorch's
    ``BCEWithLogitsLoss``, as ``max(z, 0) - z y + log(1 + exp(-|z|))``: with no ``log1p`` in ONNX, a
    confidently right logit beyond about 17 gives a loss of 0 where PyTorch's is below 6e-8; the
    gradients agree).

    On an output that is ortrain's sigmoid of logits ``z`` (a layer's ``activation="sigmoid"`` or
    ``Activation("sigmoid")``, last but for reshapes), training and ``evaluate`` compute the
    probabilities' loss from ``z``, clipped where the probabilities' clip lies: the values of the
    exact sigmoid's probabilities, and the gradient ``sigmoid(z) - y``. The exact sigmoid's
    derivative times the loss's ``1 / (1 - p)`` of the rounded ``p`` was up to 41% off at logits
    of 12 to 17, where PyTorch's ``s (1 - s)`` of the rounded ``s`` cancels it. A call of the
    loss takes probabilities, so it computes from the rounded ones (up to 2% apart there)."""

    name = "binary_crossentropy"

    @property
    def reads_sigmoid_logits(self) -> bool:  # not where a subclass computes a form of its own
        return not self.from_logits and type(self).elementwise is BinaryCrossentropy.elementwise

    def __init__(self, from_logits: bool = False):
        self.from_logits = checked_flag(from_logits, "BinaryCrossentropy(from_logits=...)")

    def config(self):
        return {"name": self.name, "from_logits": self.from_logits}

    def _elementwise(self, gb, pred, label, sigmoid_of):
        if sigmoid_of is None:  # given only where reads_sigmoid_logits
            return self.elementwise(gb, pred, label)
        # probabilities clipped to [1e-7, 1 - 1e-7] are logits clipped to where the sigmoid gives those
        low, high = (float(np.log(p / (1.0 - p))) for p in (np.float32(EPSILON), np.float32(1.0 - EPSILON)))
        z = gb.op("Clip", [sigmoid_of, gb.const(low, hint="low_logit"), gb.const(high, hint="high_logit")])
        return _bce_with_logits(gb, z, label)

    def elementwise(self, gb, pred, label):
        if self.from_logits:
            return _bce_with_logits(gb, pred, label)
        p = _clip_probs(gb, pred)
        one = gb.const(1.0, hint="one")
        pos = gb.op("Mul", [label, gb.op("Log", [p])])
        neg = gb.op("Mul", [gb.op("Sub", [one, label]), gb.op("Log", [gb.op("Sub", [one, p])])])
        return gb.op("Neg", [gb.op("Add", [pos, neg])])


def _bce_with_logits(gb: GraphBuilder, z: str, label: str) -> str:
    """max(z, 0) - z*y + log(1 + exp(-|z|)), stable for any z. max and -|z| are written as Where on
    one z >= 0 test: the runtime's Relu and Abs gradients are 0 at z = 0, which would make the
    gradient there -y instead of sigmoid(0) - y."""
    nonneg = gb.op("GreaterOrEqual", [z, gb.const(0.0, hint="zero")])
    relu = gb.op("Where", [nonneg, z, gb.const(0.0, hint="zero")])
    e = gb.op("Exp", [gb.op("Where", [nonneg, gb.op("Neg", [z]), z])])
    t1 = gb.op("Sub", [relu, gb.op("Mul", [z, label])])
    return gb.op("Add", [t1, gb.op("Log", [gb.op("Add", [e, gb.const(1.0, hint="one")])])])


_BY_NAME = {
    "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError,
    "mae": MeanAbsoluteError, "mean_absolute_error": MeanAbsoluteError,
    "huber": Huber,
    "categorical_crossentropy": CategoricalCrossentropy,
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
}


@names_unknown_arguments_of(label="losses.get")
def get(spec) -> Loss:
    """A :class:`Loss` from a name, a config dict or a Loss object."""
    if isinstance(spec, Loss):
        return spec
    if isinstance(spec, dict):
        cfg = dict(spec)
        if "name" not in cfg:  # Keras' {output name: loss}: one loss per output
            raise OrtrainError(f"loss: a dict is read as a loss config with its 'name' (e.g. {{'name': 'huber', "
                               f"'delta': 2.0}}), received {spec!r}; ortrain computes one loss, on the model's "
                               "first output, so losses per output (Keras' dict) are not taken: pass one loss, and "
                               "put the output it trains first")
        name = cfg.pop("name")
        if name not in _BY_NAME:
            raise OrtrainError(f"loss: unknown name {name!r} in {spec!r}")
        try:
            return _BY_NAME[name](**cfg)
        except (TypeError, OrtrainError) as exc:  # an unknown or misspelt key, a bad value
            raise OrtrainError(f"{name}: cannot build it from {spec!r}: {exc}") from None
    if isinstance(spec, str) and spec.lower() in _BY_NAME:
        return _BY_NAME[spec.lower()]()
    names = ", ".join(sorted(set(_BY_NAME) - {"mean_squared_error", "mean_absolute_error"}))
    if isinstance(spec, type) and issubclass(spec, Loss):
        raise OrtrainError(f"loss: expected a loss object, received the class {spec.__name__}; make one: "
                           f"ot.losses.{spec.__name__}()")
    if callable(spec) and not isinstance(spec, type):
        raise OrtrainError(f"loss: expected one of {names} or an ot.losses object, received the function "
                           f"{getattr(spec, '__name__', spec)!r}; a compiled loss is built into the training graphs "
                           "ahead of time, so a Python loss function cannot be one: write the whole step with "
                           "ot.capture_step and the ortrain.ag losses and ops, or pick a built-in loss")
    if isinstance(spec, (list, tuple)):  # Keras' [loss per output]
        raise OrtrainError(f"loss: expected one of {names} or an ot.losses object, received the {type(spec).__name__} "
                           f"{spec!r}; ortrain computes one loss, on the model's first output, so losses per output "
                           "(Keras' list) are not taken: pass one loss, and put the output it trains first")
    raise OrtrainError(f"loss: expected one of {names} or an ot.losses object, received {spec!r}")
