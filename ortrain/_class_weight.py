"""``class_weight``: Keras' weights per class, turned into one loss weight per training sample.

As in Keras, a sample's class comes from its label: the integer label for sparse
cross-entropy, the arg-max of the one-hot (or probability) row for categorical
cross-entropy, and for binary cross-entropy on one output unit 1 above 0.5 and 0 otherwise
(Keras rounds the label). A class the dict leaves out weighs 1.0 (Keras 3's
``class_weight.get(c, 1.0)``). The weight multiplies the sample's ``sample_weight`` when both
are given, so a class weight is a sample weight in every respect: the loss is
``sum(w * loss) / batch`` (not renormalised by the weights, as Keras' default reduction) and
the training's ``weighted_metrics`` are weighted too (``metrics`` count every sample alike, as in
Keras). Validation never is.

>>> import numpy as np, ortrain as ot
>>> model = ot.Sequential([ot.layers.Dense(3, activation="softmax")], input_shape=(2,), seed=0)
>>> _ = model.compile(loss="sparse_categorical_crossentropy")
>>> class_weights({2: 4.0}, model).of(np.array([0, 2, 2]))
array([1., 4., 4.], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ortrain import losses
from ortrain._arrays import is_integer, is_real
from ortrain.data import describe_value
from ortrain.errors import OrtrainError, describe_shape

__all__ = ["ClassWeights", "class_weights"]

_FIX = "pass sample_weight (one weight per sample) instead"
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class ClassWeights:
    """One weight per class, and how a label array names its rows' classes."""

    def __init__(self, table: dict[int, float], kind: str, rank: int):
        self.table = table  # weight by class; classes left out weigh 1.0
        self.kind = kind  # "index", "one_hot" or "binary"
        self.rank = rank  # of the model's first output, so of the sample weights

    def classes(self, labels: np.ndarray) -> np.ndarray:
        """The class of every row of ``labels`` (checked labels, as the loss takes them)."""
        if self.kind == "index":
            return labels.reshape(-1)
        if self.kind == "one_hot":
            return np.argmax(labels, axis=-1)
        return (labels.reshape(-1) > 0.5).astype(np.int64)

    def of(self, labels: np.ndarray) -> np.ndarray:
        """float32 weights, one per row of ``labels``."""
        present, where = np.unique(self.classes(labels), return_inverse=True)  # look up each class once
        return np.array([self.table.get(int(c), 1.0) for c in present], np.float32)[where.reshape(-1)]

    def weigh(self, labels: np.ndarray, sample_weight: np.ndarray | None) -> np.ndarray:
        """The loss weights of these rows: their class weights times ``sample_weight`` (checked, one
        per sample, in the weight input's shape) when given."""
        w = self.of(labels).reshape((-1,) + (1,) * (self.rank - 1))
        return w if sample_weight is None else sample_weight * w


def class_weights(class_weight, model) -> ClassWeights | None:
    """``class_weight`` checked against ``model`` (compiled): None for None or an empty dict."""
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping):
        raise OrtrainError(f"class_weight: expected a dict mapping class indices to weights, such as {{0: 1.0, "
                           f"1: 5.0}}, received {describe_value(class_weight)}")
    kind, n_classes, rank = _classes_of(model)
    table = {}
    for key, value in class_weight.items():
        if not is_integer(key):
            raise OrtrainError(f"class_weight: expected int class indices as keys, received the key {key!r} "
                               f"({type(key).__name__}); number the classes from 0, e.g. {{0: 1.0, 1: 5.0}}")
        if key < 0 or (n_classes is not None and key >= n_classes):
            span = "an int >= 0" if n_classes is None else f"0 to {n_classes - 1} ({_classes_text(kind, n_classes)})"
            fix = "drop it" if kind == "binary" else "drop it or give the model's output one unit per class"
            raise OrtrainError(f"class_weight: expected class indices {span}, received the key {key}; {fix}")
        if not is_real(value) or not (math.isfinite(value) and 0.0 <= value <= _FLOAT32_MAX):
            raise OrtrainError(f"class_weight: expected weights that are finite numbers >= 0 (float32), received "
                               f"{value!r} for class {key}; give that class a weight such as 1.0, or 0.0 to "
                               "leave it out of training")
        table[int(key)] = float(value)
    return ClassWeights(table, kind, rank) if table else None


def _classes_of(model) -> tuple[str, int | None, int]:
    """``(kind, classes, output rank)``: how the model's labels name classes, or a refusal."""
    outputs = model.output_specs
    if len(outputs) > 1:
        raise OrtrainError(f"class_weight: expected a model with one output (as in Keras), received a model with "
                           f"{len(outputs)}; {_FIX}")
    loss = model.loss
    shape = tuple(outputs[0].shape)
    if isinstance(loss, losses.BinaryCrossentropy):
        if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
            return "binary", 2, len(shape)
        raise OrtrainError(f"class_weight: binary_crossentropy names classes 0 and 1 on one output unit; the model's "
                           f"output has shape {describe_shape(shape)} (several labels per sample); {_FIX}")
    if isinstance(loss, (losses.SparseCategoricalCrossentropy, losses.CategoricalCrossentropy)):
        if len(shape) != 2:
            raise OrtrainError(f"class_weight: expected an output of shape (batch, classes) for {loss.name}, "
                               f"received {describe_shape(shape)} (several labels per sample, which Keras' "
                               f"class_weight does not take either); pass sample_weight instead, which takes one "
                               f"weight per position too (the class weights of the labels: table[y])")
        last = shape[1]
        n = int(last) if isinstance(last, (int, np.integer)) else None
        return ("index" if isinstance(loss, losses.SparseCategoricalCrossentropy) else "one_hot"), n, 2
    name = loss.name if loss is not None else None
    raise OrtrainError(f"class_weight: expected a model compiled with a loss on class labels "
                       f"(sparse_categorical_crossentropy, categorical_crossentropy, or binary_crossentropy on one "
                       f"output unit), received loss {name!r}, which takes no classes; {_FIX}")


def _classes_text(kind: str, n: int) -> str:
    return "binary_crossentropy's two classes" if kind == "binary" else f"the output has {n} classes"
