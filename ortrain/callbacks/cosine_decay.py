"""``CosineDecay``: a half cosine from the initial rate to ``final_lr`` over ``total_epochs``."""

from __future__ import annotations

from ortrain._arrays import checked_int
from ortrain.callbacks.learning_rate_scheduler import CurveScheduler
from ortrain.optim import check_lr, schedules

__all__ = ["CosineDecay"]


class CosineDecay(CurveScheduler):
    """``lr(epoch) = final + (initial - final) * (1 + cos(pi * epoch / total_epochs)) / 2``,
    constant at ``final_lr`` after ``total_epochs``.

    ``warmup_epochs > 0`` first rises linearly to the initial rate (reached in the last
    warm-up epoch), then decays over the remaining epochs. ``initial_lr=None`` takes the
    compiled rate, so a resumed fit continues the same curve.
    """

    def __init__(self, total_epochs: int, final_lr: float = 0.0, initial_lr: float | None = None,
                 warmup_epochs: int = 0, verbose: int = 0):
        final_lr = check_lr(final_lr, "CosineDecay(final_lr=...)")
        total_epochs = checked_int(total_epochs, "CosineDecay(total_epochs=...)")
        warmup_epochs = checked_int(warmup_epochs, "CosineDecay(warmup_epochs=...)", minimum=0)
        schedules.check_warmup_below_total(warmup_epochs, total_epochs, ("warmup_epochs", "total_epochs"),
                                           where="CosineDecay")
        self.total_epochs, self.final_lr, self.warmup_epochs = total_epochs, final_lr, warmup_epochs
        super().__init__(initial_lr, verbose)

    def _curve_from(self, base):
        if self.warmup_epochs:
            return schedules.warmup_cosine(base, self.warmup_epochs, self.total_epochs, self.final_lr)
        return schedules.cosine(base, self.total_epochs, self.final_lr)
