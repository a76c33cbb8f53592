"""Losses on traced tensors, with PyTorch's default reduction (the mean).

They emit the same ONNX as the compiled losses of :mod:`ortrain.losses`, so a
captured step and ``Model.compile`` agree on every formula. Each returns a 0-d
float32 tensor. Targets may be tensors (arguments of ``fn``) or arrays.
"""

from __future__ import annotations

import numpy as np

from ortrain import losses as _losses
from ortrain._warnings import warn
from ortrain.ag._checks import _float, as_tensor
from ortrain.ag.elementwise import div
from ortrain.ag.shape_ops import sum as sum_of
from ortrain.ag.tensor import FLOAT, Const, Tensor
from ortrain.errors import OrtrainError, ShapeError, describe_shape

__all__ = ["bce_with_logits_loss", "cross_entropy_loss", "huber_loss", "mse_loss", "softmax_cross_entropy_loss"]


def _same_shape(where: str, x, target) -> tuple[Tensor, Tensor]:
    x = as_tensor(x, where)
    target = as_tensor(target, where, like=x)
    _float(where, x, target)
    if x.shape != target.shape:
        raise ShapeError(f"{where}: input shape {describe_shape(x.shape)} and target shape "
                         f"{describe_shape(target.shape)} differ; they must be equal")
    return x, target


def _loss(where: str, loss: _losses.Loss, x: Tensor, target: Tensor, terms: int | None = None) -> Tensor:
    """``loss`` of ``x`` against ``target``: a mean over ``terms`` values (every element of ``x``
    unless given). A mean over none is NaN with a warning, as PyTorch's: the runtime's mean of
    nothing is 0 (and its sparse cross-entropy kernel divides by zero), so such a loss is the sum
    of ``x``'s no elements divided by 0, which leaves the gradients of other tensors finite."""
    shape = tuple(x.shape)
    if (x.size if terms is None else terms) == 0:
        warn(f"{where}: input of shape {describe_shape(shape)} holds no {'elements' if terms is None else 'samples'}; "
             "the loss, their mean, is NaN, as PyTorch's", RuntimeWarning)
        return div(sum_of(x), 0.0)
    return Tensor((), FLOAT, where, (x, target), lambda gb, names: loss.build(gb, names[0], names[1], pred_shape=shape))


def mse_loss(input, target) -> Tensor:  # noqa: A002 - PyTorch's argument name
    """``mean((input - target) ** 2)`` over every element (``torch.nn.functional.mse_loss``)."""
    x, t = _same_shape("mse_loss", input, target)
    return _loss("mse_loss", _losses.MeanSquaredError(), x, t)


def huber_loss(input, target, delta: float = 1.0) -> Tensor:  # noqa: A002
    """Mean over every element of ``0.5 d^2`` where ``|d| <= delta``, else ``delta (|d| - delta/2)``,
    with ``d = input - target`` (``torch.nn.functional.huber_loss``)."""
    x, t = _same_shape("huber_loss", input, target)
    return _loss("huber_loss", _losses.Huber(delta), x, t)


def bce_with_logits_loss(input, target) -> Tensor:  # noqa: A002
    """Binary cross-entropy on logits, averaged over every element, computed without overflow as
    ``max(z, 0) - z y + log(1 + exp(-|z|))`` (``torch.nn.functional.binary_cross_entropy_with_logits``;
    with no ``log1p`` in ONNX, a confidently right logit beyond about 17 gives 0 where PyTorch's
    gives less than 6e-8; the gradients agree)."""
    x, t = _same_shape("bce_with_logits_loss", input, target)
    return _loss("bce_with_logits_loss", _losses.BinaryCrossentropy(from_logits=True), x, t)


def _classes(where: str, x, target) -> tuple[Tensor, Tensor, bool]:
    x = as_tensor(x, where)
    _float(where, x)
    if x.ndim < 2 or x.shape[-1] == 0:
        raise ShapeError(f"{where}: input expected shape (batch, classes) with at least one class, received "
                         f"{describe_shape(x.shape)}")
    target = as_tensor(target, where)
    if target.dtype.kind in "iu":
        if target.shape != x.shape[:-1]:
            raise ShapeError(f"{where}: integer class labels expected shape {describe_shape(x.shape[:-1])} for "
                             f"input {describe_shape(x.shape)}, received {describe_shape(target.shape)}")
        n = x.shape[-1]
        if isinstance(target, Const) and target.value.size and n is not None and \
                (target.value.min() < 0 or target.value.max() >= n):
            raise ShapeError(f"{where}: class labels must lie in [0, {n - 1}] for {n} classes, received values "
                             f"from {target.value.min()} to {target.value.max()}")
        return x, target, True
    if target.shape != x.shape:
        raise ShapeError(f"{where}: probability targets expected shape {describe_shape(x.shape)} like the input, "
                         f"received {describe_shape(target.shape)}; integer labels take shape "
                         f"{describe_shape(x.shape[:-1])}")
    _float(where, target)
    return x, target, False


def softmax_cross_entropy_loss(input, target) -> Tensor:  # noqa: A002
    """Cross-entropy of logits, softmax over the last axis (``torch.nn.functional.cross_entropy``
    for 2-d logits): ``target`` holds int64 class labels of shape ``input.shape[:-1]`` or one-hot /
    probability rows of ``input``'s shape. Mean over the samples (every position but the last axis)."""
    where = "softmax_cross_entropy_loss"
    x, t, sparse = _classes(where, input, target)
    loss = _losses.SparseCategoricalCrossentropy(from_logits=True) if sparse \
        else _losses.CategoricalCrossentropy(from_logits=True)
    return _loss(where, loss, x, t, terms=_samples(x))


def cross_entropy_loss(input, target) -> Tensor:  # noqa: A002
    """Cross-entropy of probabilities (e.g. a softmax output): the mean over samples of
    ``-sum(target * log(p))``, or of ``-log(p[label])`` for int64 labels. ``p`` is clipped to
    ``[1e-7, 1 - 1e-7]`` before the log, as ortrain's ``categorical_crossentropy``. For logits use
    :func:`softmax_cross_entropy_loss` (stabler)."""
    where = "cross_entropy_loss"
    x, t, sparse = _classes(where, input, target)
    loss = _losses.SparseCategoricalCrossentropy() if sparse else _losses.CategoricalCrossentropy()
    return _loss(where, loss, x, t, terms=_samples(x))


def _samples(x: Tensor) -> int:
    """The samples a class loss averages over: every position but the last (class) axis."""
    return int(np.prod(x.shape[:-1], dtype=np.int64))


def check_loss(value, where: str) -> Tensor:
    """The tensor ``fn`` returned as its loss, refused unless it is one float32 number."""
    if not isinstance(value, Tensor):
        raise OrtrainError(f"{where}: fn must return the loss as an ag tensor (or a dict with a 'loss' entry), "
                           f"received {type(value).__name__}")
    if value.dtype != FLOAT or value.size != 1:
        raise ShapeError(f"{where}: the loss must be a float32 tensor holding one number, received shape "
                         f"{describe_shape(value.shape)} dtype {value.dtype.name}; reduce it with ag.mean or ag.sum")
    return value
