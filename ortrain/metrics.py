"""Metrics computed from predictions the training or eval graph already returns.

A metric accumulates ``(total, count)`` over batches; its value is ``total / count``
(0 when every weight was 0, as Keras divides). ``"accuracy"`` resolves as in tf.keras 2:
sparse labels compare the arg-max with the label, binary cross-entropy thresholds at
0.5 on every output unit (Keras 3 takes categorical accuracy for several units, a multi-label
output), any other loss on a one-unit output thresholds at 0.5, and one-hot (or probability)
labels compare arg-maxes. Binary accuracy counts a label above 0.5 as 1 (Keras 3 compares labels
as they are, so a soft label never matches there). Where the model outputs logits (``BinaryCrossentropy(from_logits=True)``)
``"accuracy"`` and ``"binary_accuracy"`` threshold them at 0, the logit of 0.5 (Keras thresholds
the raw logit at 0.5, a probability of 0.62).
"""

from __future__ import annotations

import numpy as np

from ortrain.errors import OrtrainError

__all__ = ["Metric", "logged_names", "resolve"]


class Metric:
    """A compiled metric, as ``compile(metrics=[...])`` resolves a name: it accumulates a mean over
    the batches it is given. ``update(pred, y, weight)`` adds a batch, ``result()`` is the mean so
    far (0 before any batch), ``reset()`` starts again; ``name`` is how it is logged (the name
    ``compile`` was given), ``kind`` what it computes (``"accuracy"`` for ``"acc"``), ``weighted``
    whether sample and class weights count (``weighted_metrics``)."""

    def __init__(self, name: str, fn):
        self.name = name  # how it is logged: the name compile was given
        self.kind = name  # what it computes ("accuracy" for "acc")
        self.weighted = False  # compile's weighted_metrics: sample and class weights count, as in Keras
        self._fn = fn
        self.reset()

    def reset(self) -> None:
        """Forget the batches added so far."""
        self.total = 0.0
        self.count = 0.0

    def update(self, pred: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> None:
        """Add a batch, as Keras' mean metrics do: a value per sample, or per position for a
        prediction with positions (time steps), each weighted by its sample's or position's weight
        (weights over output elements are averaged per sample first). Only a weighted metric
        (compile's ``weighted_metrics``) reads ``weight``; the others count every sample alike."""
        values = np.asarray(self._fn(pred, y), np.float64)
        if weight is None or not self.weighted:
            self.total += float(values.sum())
            self.count += values.size
            return
        w = np.asarray(weight, np.float64)
        if w.ndim > values.ndim:
            w = w.reshape(w.shape[:values.ndim] + (-1,)).mean(axis=-1)
        w = np.broadcast_to(w.reshape(w.shape + (1,) * (values.ndim - w.ndim)), values.shape)
        self.total += float(np.sum(values * w))
        self.count += float(w.sum())

    def result(self) -> float:
        """The weighted mean over the batches added since the last :meth:`reset`; 0 when none was
        (or every weight was 0)."""
        return self.total / self.count if self.count else 0.0


# Each returns one value per sample, or per position for predictions with positions: the last
# axis (classes, output units) is reduced, as in Keras.
def _sparse_acc(pred, y):
    return np.argmax(pred, axis=-1) == y.astype(np.int64)


def _categorical_acc(pred, y):
    return np.argmax(pred, axis=-1) == np.argmax(y, axis=-1)


def _accuracy_by_shape(pred, y):
    """Keras's ``"accuracy"`` for losses that do not fix it: binary on one output unit."""
    if pred.ndim == 1 or pred.shape[-1] == 1:
        return _binary_acc(0.5)(pred, y)
    return _categorical_acc(pred, y)


def _binary_acc(threshold):
    def fn(pred, y):
        return _last_axis_mean((pred > threshold) == (y > 0.5))
    return fn


def _mae(pred, y):
    return _last_axis_mean(np.abs(pred - y))


def _mse(pred, y):
    return _last_axis_mean(np.square(pred - y))


def _last_axis_mean(values: np.ndarray) -> np.ndarray:
    return values if values.ndim < 2 else values.mean(axis=-1)


# The labels each metric reads: class indices, or an array shaped like the output ("accuracy"
# follows the loss).
_LABELS = {"sparse_categorical_accuracy": "class", "categorical_accuracy": "dense", "binary_accuracy": "dense",
           "mae": "dense", "mse": "dense"}


def _check_labels(metric: str, loss, given: str | None = None, argument: str = "metrics") -> None:
    """Refuse a metric whose labels are not the loss's: it would compare class indices with rows
    of scores (a wrong value, or a broadcasting error after the first step had trained).
    ``metric`` is the canonical name, ``given`` the one the caller used (for the message)."""
    takes = _LABELS.get(metric)
    if takes is None or loss is None:
        return
    classes = loss.class_labels
    name = getattr(loss, "name", type(loss).__name__)
    metric = given or metric
    if takes == "dense" and classes:
        raise OrtrainError(f"{argument}: {metric!r} compares the output with labels of its own shape, and loss "
                           f"{name!r} takes class indices; use 'accuracy' (or 'sparse_categorical_accuracy') "
                           "with it, or a loss on one-hot labels")
    if takes == "class" and not classes:
        raise OrtrainError(f"{argument}: {metric!r} takes class-index labels, and loss {name!r} takes labels shaped "
                           "like the output; use 'accuracy' (or 'categorical_accuracy' for one-hot labels)")


def fitting(names, loss) -> tuple[list[str], list[str], list[str]]:
    """``names`` split into those that fit ``loss``, those whose labels are not ``loss``'s (a model
    saved before compile refused such metrics loads without them) and those this version does
    not know (saved by another)."""
    kept, misfit, unknown = [], [], []
    for name in names or ():
        try:
            metric = resolve([name], None)[0]
        except OrtrainError:
            unknown.append(name)
            continue
        try:
            _check_labels(metric.kind, loss, metric.name)
        except OrtrainError:
            misfit.append(name)
            continue
        if name not in kept:  # a file from before duplicates were refused
            kept.append(name)
    return kept, misfit, unknown



def resolve(names, loss, weighted=()) -> list[Metric]:
    """Metric objects for the names given to ``compile`` as ``metrics`` (which count every sample
    alike) and as ``weighted_metrics`` (which weigh them by their sample and class weights), checked
    against the labels ``loss`` takes. As in Keras, a weighted metric also given unweighted is logged
    as ``weighted_<name>``."""
    plain = _resolve(names, loss, "metrics")
    both = _resolve(weighted, loss, "weighted_metrics")
    for m, name in zip(both, logged_names(names, weighted)[len(plain):]):
        m.weighted, m.name = True, name
    return plain + both


def logged_names(names, weighted=()) -> list[str]:
    """The names :func:`resolve` gives its metrics, without checking them."""
    plain = list(names or ())
    return plain + [f"weighted_{n}" if n in plain else n for n in weighted or ()]


def _resolve(names, loss, argument: str) -> list[Metric]:
    out = []
    for name in names or ():
        if not isinstance(name, str):
            raise OrtrainError(f"{argument}: expected names such as 'accuracy' or 'mae', received {name!r}")
        if any(m.name == name for m in out):
            raise OrtrainError(f"{argument}: {name!r} is given twice; give each metric once (it is logged by its "
                               "name)")
        key = name.lower()
        lname = getattr(loss, "name", "")
        logits = lname == "binary_crossentropy" and getattr(loss, "from_logits", False)
        if key in ("accuracy", "acc"):
            if lname == "sparse_categorical_crossentropy":
                fn = _sparse_acc
            elif lname == "binary_crossentropy":
                fn = _binary_acc(0.0 if logits else 0.5)
            else:
                fn = _accuracy_by_shape
            out.append(Metric("accuracy", fn))
        elif key == "sparse_categorical_accuracy":
            out.append(Metric(key, _sparse_acc))
        elif key == "categorical_accuracy":
            out.append(Metric(key, _categorical_acc))
        elif key == "binary_accuracy":
            out.append(Metric(key, _binary_acc(0.0 if logits else 0.5)))
        elif key in ("mae", "mean_absolute_error"):
            out.append(Metric("mae", _mae))
        elif key in ("mse", "mean_squared_error"):
            out.append(Metric("mse", _mse))
        else:
            raise OrtrainError(f"{argument}: unknown metric {name!r}; known: accuracy, sparse_categorical_accuracy, "
                               "categorical_accuracy, binary_accuracy, mae, mse")
        _check_labels(out[-1].kind, loss, name, argument)
        out[-1].name = name  # as Keras: logged and monitored by the name given ("acc", "val_acc")
    return out
