"""``LearningRateScheduler``: the learning rate of each epoch from a function."""

from __future__ import annotations

import inspect

from ortrain.callbacks._monitor import check_callback_verbose
from ortrain.callbacks.base import Callback
from ortrain.errors import OrtrainError
from ortrain.optim import check_lr

__all__ = ["LearningRateScheduler"]


def _n_args(fn) -> int:
    """How many positional arguments ``fn`` takes, those with defaults included (Keras passes
    ``(epoch, lr)`` to any function that accepts two)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


class LearningRateScheduler(Callback):
    """At the start of every epoch set the learning rate to ``schedule(epoch, lr)``.

    ``epoch`` counts from 0 and includes ``initial_epoch``; ``lr`` is the current rate.
    A ``schedule(epoch)`` that takes only one argument is called so. The rate is set before the
    epoch's first step and recorded in the history as ``lr``.
    """

    def __init__(self, schedule, verbose: int = 0):
        if not callable(schedule):
            raise OrtrainError(f"LearningRateScheduler(schedule=...): expected a function (epoch, lr) -> lr, "
                               f"received {schedule!r}")
        self.schedule = schedule
        self.verbose = check_callback_verbose(verbose, type(self).__name__)
        self._two_args = _n_args(schedule) >= 2

    def _rate(self, epoch: int, lr: float) -> float:
        return self.schedule(epoch, lr) if self._two_args else self.schedule(epoch)

    def on_epoch_begin(self, epoch, logs=None):
        value = self._rate(epoch, self.trainer.lr)
        lr = check_lr(value, f"{type(self).__name__}: the schedule's value for epoch {epoch}")
        self.trainer.set_lr(lr)
        if self.verbose:
            self._say(f"Epoch {epoch + 1}: learning rate {lr:.6g}")


class CurveScheduler(LearningRateScheduler):
    """A schedule that is a curve of the epoch alone, starting at ``initial_lr`` (``None``: the
    rate the model was compiled with, so a resumed fit continues the same curve). Subclasses
    say how the curve follows from its starting rate in :meth:`_curve_from`."""

    def __init__(self, initial_lr: float | None, verbose: int):
        self.initial_lr = None if initial_lr is None else check_lr(initial_lr, f"{type(self).__name__}(initial_lr=...)")
        super().__init__(self._rate_of_epoch, verbose)

    def _curve_from(self, base: float):
        raise NotImplementedError

    def on_train_begin(self, logs=None):
        self._curve = self._curve_from(self.loop.base_lr if self.initial_lr is None else self.initial_lr)

    def _rate_of_epoch(self, epoch, lr):
        return self._curve(epoch)
