"""Learning-rate schedules: plain callables of the step (or epoch) number.

>>> s = cosine(0.1, total_steps=10)
>>> round(s(0), 6), round(s(5), 6), round(s(10), 6)
(0.1, 0.05, 0.0)
>>> step(0.1, drop=0.5, every=2)(3)
0.05
"""

from __future__ import annotations

import math

from ortrain._arrays import checked_int, is_real, positive_int
from ortrain.errors import OrtrainError

__all__ = ["cosine", "step", "warmup_cosine"]


def _rate(value, name: str) -> float:
    # checked here, not at the first step that reads the schedule
    if not is_real(value) or not math.isfinite(value) or value < 0:
        raise OrtrainError(f"{name}: expected a learning rate, a finite number >= 0, received {value!r}")
    return float(value)


def _step_number(t) -> int:
    # a schedule is read with a step or epoch count, from 0 (3.0 is read as 3)
    if not is_real(t) or not math.isfinite(t) or t < 0 or t != int(t):
        raise OrtrainError(f"schedule: expected the step (or epoch) number, an int >= 0 (the first is 0), "
                           f"received {t!r}")
    return int(t)


def step(initial_lr: float, drop: float = 0.5, every: int = 10):
    """``initial_lr * drop ** (t // every)``."""
    initial_lr = _rate(initial_lr, "initial_lr")
    every = positive_int(every, "every")
    if not is_real(drop) or not 0 < drop <= 1:
        raise OrtrainError(f"drop: expected a number in (0, 1], received {drop!r}")
    return lambda t: initial_lr * drop ** (_step_number(t) // every)


def cosine(initial_lr: float, total_steps: int, final_lr: float = 0.0):
    """Cosine decay from ``initial_lr`` at 0 to ``final_lr`` at ``total_steps`` (then constant)."""
    initial_lr, final_lr = _rate(initial_lr, "initial_lr"), _rate(final_lr, "final_lr")
    total_steps = positive_int(total_steps, "total_steps")

    def schedule(t):
        frac = min(_step_number(t), total_steps) / total_steps
        return final_lr + 0.5 * (initial_lr - final_lr) * (1.0 + math.cos(math.pi * frac))
    return schedule


def check_warmup_below_total(warmup: int, total: int, names=("warmup_steps", "total_steps"),
                             where: str | None = None) -> None:
    """Refuse a warm-up that is not shorter than the whole curve, naming the caller (``where``) and
    its own arguments."""
    if warmup >= total:
        warm_name, total_name = names
        raise OrtrainError(f"{where + ': ' if where else ''}{warm_name} ({warmup}) must be below {total_name} "
                           f"({total}), which counts the warm-up too; shorten the warm-up or raise {total_name}")


def warmup_cosine(initial_lr: float, warmup_steps: int, total_steps: int, final_lr: float = 0.0):
    """Linear warm-up over ``warmup_steps``: step ``t`` (from 0) gets ``initial_lr * (t + 1) /
    warmup_steps``, so the first step already moves and the last warm-up step reaches
    ``initial_lr``; then cosine decay from ``initial_lr`` (at step ``warmup_steps``, so the peak
    lasts two steps) to ``final_lr`` at ``total_steps``. ``warmup_steps=0`` is :func:`cosine`."""
    initial_lr = _rate(initial_lr, "initial_lr")
    warmup_steps = checked_int(warmup_steps, "warmup_steps", minimum=0)
    total_steps = positive_int(total_steps, "total_steps")
    check_warmup_below_total(warmup_steps, total_steps)
    decay = cosine(initial_lr, total_steps - warmup_steps, final_lr)

    def schedule(t):
        t = _step_number(t)
        if t < warmup_steps:
            return initial_lr * (t + 1) / warmup_steps
        return decay(t - warmup_steps)
    return schedule
