"""``StepDecay``: multiply the learning rate by ``drop`` every ``every`` epochs."""

from __future__ import annotations

from ortrain.callbacks.learning_rate_scheduler import CurveScheduler
from ortrain.optim import schedules

__all__ = ["StepDecay"]


class StepDecay(CurveScheduler):
    """``lr(epoch) = initial_lr * drop ** (epoch // every)``.

    ``initial_lr=None`` takes the rate the model was compiled with, so a resumed fit
    (``initial_epoch > 0``) continues the same curve instead of decaying twice.
    """

    def __init__(self, drop: float = 0.5, every: int = 10, initial_lr: float | None = None, verbose: int = 0):
        schedules.step(1.0, drop=drop, every=every)  # validates drop and every now
        self.drop, self.every = drop, every
        super().__init__(initial_lr, verbose)

    def _curve_from(self, base):
        return schedules.step(base, drop=self.drop, every=self.every)
