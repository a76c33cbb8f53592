"""``ReduceLROnPlateau``: lower the learning rate when a logged value stalls."""

from __future__ import annotations

from ortrain._arrays import is_real
from ortrain.callbacks._monitor import Monitor, check_callback_verbose, check_non_negative_int
from ortrain.callbacks.base import Callback
from ortrain.errors import OrtrainError
from ortrain.optim import check_lr

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(Callback):
    """After ``patience`` epochs without an improvement of ``monitor`` by more than ``min_delta``,
    multiply the learning rate by ``factor`` (not below ``min_lr``), then wait ``cooldown``
    epochs before counting again. The new rate applies from the next epoch. An epoch without the
    value (with ``validation_freq``, one that is not validated) is skipped: ``patience`` and
    ``cooldown`` count the epochs that log it, as in Keras. ``mode="auto"`` reads the direction
    from the name (losses, ``mae`` and ``mse`` shrink, accuracies grow); another name needs ``mode``."""

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10, mode: str = "auto",
                 min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0.0, verbose: int = 0):
        if not is_real(factor) or not 0.0 < factor < 1.0:
            raise OrtrainError(f"ReduceLROnPlateau(factor=...): expected a number in (0, 1), received {factor!r}")
        self.monitor = Monitor(monitor, mode, min_delta, "ReduceLROnPlateau", signed_delta=True)
        self.factor = float(factor)
        self.patience = check_non_negative_int(patience, "patience", "ReduceLROnPlateau")
        self.cooldown = check_non_negative_int(cooldown, "cooldown", "ReduceLROnPlateau")
        self.min_lr = check_lr(min_lr, "ReduceLROnPlateau(min_lr=...)")
        self.verbose = check_callback_verbose(verbose, "ReduceLROnPlateau")
        self.on_train_begin()

    def on_train_begin(self, logs=None):
        self.monitor.reset()
        self.wait = 0
        self.cooldown_left = 0

    def on_epoch_end(self, epoch, logs=None):
        current = self.monitor.value(logs, self.loop, epoch)
        if current is None:
            return
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.wait = 0
        if self.monitor.improved(current):
            self.monitor.best = current
            self.wait = 0
            return
        if self.cooldown_left > 0:
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        old = self.trainer.lr
        if old > self.min_lr:
            new = max(old * self.factor, self.min_lr)
            self.trainer.set_lr(new)
            if self.verbose:
                self._say(f"Epoch {epoch + 1}: ReduceLROnPlateau lowers the learning rate to {new:.6g}")
            self.cooldown_left = self.cooldown
            self.wait = 0
