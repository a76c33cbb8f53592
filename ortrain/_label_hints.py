"""What a label array of the wrong shape most likely is, and the fix: :func:`label_hint`."""

from __future__ import annotations

import numpy as np

__all__ = ["label_hint"]


def _dims(*dims) -> str:
    """``describe_shape``'s text for sizes that may be words (``classes``)."""
    return "(" + ", ".join("N" if d is None else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def label_hint(said: str, argument: str, given: np.ndarray, spec, n_classes: int | None,
               one_hot: bool) -> str | None:
    """The message for labels ``given`` (batch first, the rows checked) that do not fit the loss's
    label input ``spec`` (a TensorSpec), starting with ``said`` (what was expected and received);
    None where nothing likelier than a wrong shape is seen. ``one_hot``: the loss takes one-hot
    rows (the spec's last axis is the classes); integer specs take class indices, one per row of
    the output, over ``n_classes`` (None: not known).
    """
    label_shape = tuple(spec.shape)
    if one_hot:
        if given.dtype.kind in "iu" and given.shape[1:] == label_shape[1:-1] and (label_shape[-1] or 0) > 1:
            return (f"{said}: {argument} holds class indices, which this loss takes one-hot (rows of "
                    f"{label_shape[-1]}): use loss='sparse_categorical_crossentropy', or one-hot encode them, "
                    f"np.eye({label_shape[-1]})[{argument}]")
        return None
    if spec.dtype.kind not in "iu" or given.ndim != len(label_shape) + 1 or given.shape[-1] < 2 or \
            given.shape[1:-1] != label_shape[1:]:
        return None
    hint = _axis_more(argument, given, label_shape, n_classes)
    return None if hint is None else f"{said}: {hint}"


def _axis_more(argument: str, given: np.ndarray, label_shape: tuple, n_classes: int | None) -> str | None:
    """``given`` has an axis more than class indices: one-hot or probability rows over the
    output's classes (categorical cross-entropy), rows of several 1s (binary), or integers, a
    class per position along that axis (the output needs it too)."""
    if given.dtype.kind not in "biuf":
        return None
    width, classes = given.shape[-1], "classes" if n_classes is None else n_classes
    fits = n_classes in (None, width)
    zero_one = bool(np.all((given == 0) | (given == 1)))
    sums = given.sum(axis=-1, dtype=np.float64)
    if zero_one and np.all(sums == 1):
        if fits:
            return (f"{argument} looks one-hot (rows of {width}), and this loss takes class indices: use "
                    f"loss='categorical_crossentropy', or pass {argument}.argmax(axis=-1)")
        return (f"{argument} looks one-hot over {width} classes, where the model's output has {n_classes}: give "
                f"the model {width} output units, then pass {argument}.argmax(axis=-1) (or use "
                "loss='categorical_crossentropy')")
    if zero_one and fits:
        return (f"{argument}'s rows of {width} hold 0s and 1s but not one 1 each (several classes a sample?), and "
                "this loss takes one class index a sample: for several, use loss='binary_crossentropy' on one "
                "sigmoid (or logit) a class")
    if given.dtype.kind == "f" and fits and bool(np.all((given >= 0) & (given <= 1))) and \
            np.allclose(sums, 1.0, rtol=0.0, atol=1e-4):
        return (f"{argument} holds probability rows (rows of {width} that sum to 1), and this loss takes class "
                "indices: use loss='categorical_crossentropy', which takes them")
    if not np.all(np.isfinite(given) & (given == np.round(given))):
        return None  # no class indices either: the error's own words say it
    seen = "0s and 1s, but not one 1 in every row" if zero_one else \
        f"values from {given.min()} to {given.max()}" if given.size else "no values"
    return (f"this loss takes class indices of shape {_dims(*label_shape)} for the model's output "
            f"{_dims(*label_shape, classes)}, and {argument}'s rows of {width} are not one-hot ({seen}). Labels of "
            f"shape {_dims(*label_shape, width)}, a class per position (a time step, say), need the model's output "
            f"to have that axis, {_dims(*label_shape, width, classes)}")
