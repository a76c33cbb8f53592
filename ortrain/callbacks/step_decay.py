"""``StepDecay``: multiply the learning rate by ``drop`` every ``every`` epochs."""

from __future__ import annotations

from ortrain.callbacks.learning_rate_scheduler import LearningRateScheduler
from ortrain.optim import check_lr, schedules

__all__ = ["StepDecay"]


class StepDecay(LearningRateScheduler):
    """``lr(epoch) = initial_lr * drop ** (epoch // every)``.

    ``initial_lr=None`` takes the rate the model was compiled with, so a resumed fit
    (``initial_epoch > 0``) continues the same curve instead of decaying twice.
    """

    def __init__(self, drop: float = 0.5, every: int = 10, initial_lr: float | None = None, verbose: int = 0):
        schedules.step(1.0, drop=drop, every=every)  # validates drop and every now
        self.drop, self.every = drop, every
        self.initial_lr = None if initial_lr is None else check_lr(initial_lr, "StepDecay(initial_lr=...)")
        super().__init__(self._rate_of_epoch, verbose)

    def on_train_begin(self, logs=None):
        base = self.loop.base_lr if self.initial_lr is None else self.initial_lr
        self._curve = schedules.step(base, drop=self.drop, every=self.every)

    def _rate_of_epoch(self, epoch, lr):
        return self._curve(epoch)
