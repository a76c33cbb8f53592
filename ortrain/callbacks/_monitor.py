"""The "watch one logged value" logic that EarlyStopping, ReduceLROnPlateau and
ModelCheckpoint share: which direction is better, what counts as an improvement, and
which epochs have no value to watch."""

from __future__ import annotations

import math

import numpy as np

from ortrain._arrays import checked_int, is_integer, is_real
from ortrain._warnings import warn
from ortrain.errors import OrtrainError

MODES = ("auto", "min", "max")


class Monitor:
    def __init__(self, monitor: str, mode: str, min_delta: float, owner: str, signed_delta: bool = False,
                 compares: bool = True):
        """``signed_delta``: a negative ``min_delta`` is kept as given (Keras' ReduceLROnPlateau: a
        value a little worse than the best still counts as an improvement); otherwise its size is
        taken, as Keras' EarlyStopping takes it. Without ``compares`` (a callback that does not compare
        the values) a name that does not tell its direction is taken, and read as one that shrinks."""
        if not isinstance(monitor, str) or not monitor:
            raise OrtrainError(f"{owner}(monitor=...): expected the name of a logged value such as 'val_loss', "
                               f"received {monitor!r}")
        if mode not in MODES:
            raise OrtrainError(f"{owner}(mode=...): expected 'auto', 'min' or 'max', received {mode!r}")
        if not is_real(min_delta) or not math.isfinite(min_delta):
            raise OrtrainError(f"{owner}(min_delta=...): expected a finite number, received {min_delta!r}")
        self.name = monitor
        self.owner = owner
        if mode == "auto":
            mode = auto_mode(monitor) or (None if compares else "min")
            if mode is None:  # Keras 3 refuses these too; tf.keras 2 minimised them, a grown F1 as a worse one
                raise OrtrainError(f"{owner}(monitor={monitor!r}, mode='auto'): cannot tell whether {monitor!r} "
                                   "improves by growing or by shrinking (mode='auto' knows losses, accuracies, mae "
                                   "and mse); pass mode='max' for a score such as F1 or AUC, mode='min' for an error")
        self.mode = mode
        self.min_delta = float(min_delta) if signed_delta else abs(float(min_delta))
        self.reset()

    def reset(self) -> None:
        self.best = math.inf if self.mode == "min" else -math.inf

    def value(self, logs, loop=None, epoch: int | None = None) -> float | None:
        """The watched value in ``logs``, or None (the epoch is then skipped, as Keras skips it).

        A missing value warns, as in Keras, except a ``val_`` value after an epoch that the fit's
        ``validation_freq`` leaves without validation: its absence is expected there, and Keras'
        warning on every such epoch only fills the log (keras-team/keras#13241).
        """
        value = (logs or {}).get(self.name)
        if value is None and not (self.name.startswith("val_") and skips_validation(loop, epoch)):
            warn(f"{self.owner} monitors {self.name!r}, which is not logged; logged values are "
                 f"{', '.join(sorted(logs or {})) or 'none'}")
        return value

    def better(self, current: float, reference: float) -> bool:
        if self.mode == "min":
            return current < reference - self.min_delta
        return current > reference + self.min_delta

    def improved(self, current: float) -> bool:
        return self.better(current, self.best)


def auto_mode(monitor: str) -> str | None:
    """The direction in which a logged value improves, by its name: losses and the error metrics
    (``mae``, ``mse``) shrink, accuracies grow (metrics keep the names compile was given: ``"Acc"``,
    ``"weighted_accuracy"`` too); None for a name that does not tell."""
    name = monitor.lower().removeprefix("val_")
    if name.endswith("loss"):
        return "min"
    if "acc" in name:
        return "max"
    if name.removeprefix("weighted_") in ("mae", "mse", "mean_absolute_error", "mean_squared_error"):
        return "min"
    return None


def skips_validation(loop, epoch: int | None) -> bool:
    """Whether the fit run by ``loop`` has validation data but does not validate after ``epoch``
    (``validation_freq``)."""
    return loop is not None and epoch is not None and loop.validation is not None and not loop.validates(epoch)


def check_threshold(value, argument: str, owner: str, what: str) -> float | None:
    """``value`` as a float (None stays None); a non-number or NaN, which no logged value could beat
    or which fails only at the first epoch's end, is an OrtrainError."""
    if value is None:
        return None
    if not is_real(value) or math.isnan(value):
        raise OrtrainError(f"{owner}({argument}=...): expected a number ({what}) or None, received {value!r}")
    return float(value)


def check_non_negative_int(value, argument: str, owner: str) -> int:
    return checked_int(value, f"{owner}({argument}=...)", minimum=0)


def check_callback_verbose(value, owner: str) -> int:
    """A callback's ``verbose``, as Keras takes it: 0 (quiet) or 1 (a line when it acts), True and
    False too; anything else (a string is truthy) is refused."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if is_integer(value) and int(value) in (0, 1, 2):  # (a 0-d integer array too, as fit takes it)
        return int(value)
    raise OrtrainError(f"{owner}(verbose=...): expected 0 (quiet) or 1 (a line when it acts; 2 as well), "
                       f"received {value!r}")
