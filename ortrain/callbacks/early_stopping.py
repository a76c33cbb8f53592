"""``EarlyStopping``: stop when a logged value stops improving."""

from __future__ import annotations

from ortrain._arrays import checked_flag
from ortrain.callbacks._monitor import (
    Monitor,
    check_callback_verbose,
    check_non_negative_int,
    check_threshold,
)
from ortrain.callbacks.base import Callback

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stop training once ``monitor`` has not improved by more than ``min_delta`` for ``patience``
    epochs. ``mode="auto"`` reads the direction from the name: losses, ``mae`` and ``mse`` shrink,
    accuracies grow; another name (a score a callback logs, such as ``val_f1``) needs ``mode``.

    ``baseline``: the value must beat it too before patience starts over, so training stops once
    ``patience`` epochs went by without beating it, improving or not: the rule Keras documents
    ("training will stop if the model doesn't show improvement over the baseline") and tf.keras 2
    runs. Keras 3's code differs: there an epoch that improves on the best never stops training.
    ``restore_best_weights``: at the end of training the weights of the best epoch are put back
    (also when training ran to the end), as Keras does. ``start_from_epoch``: epochs before it
    are not monitored (warm-up). An epoch without the value (with ``validation_freq``, one that
    is not validated) is skipped and counts nothing: ``patience`` counts the epochs that log it.
    ``stopped_epoch`` is the epoch it stopped training after (counted from 0), 0 when it did not
    stop, as in Keras (it never stops in epoch 0).
    """

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0,
                 mode: str = "auto", baseline: float | None = None, restore_best_weights: bool = False,
                 start_from_epoch: int = 0, verbose: int = 0):
        self.monitor = Monitor(monitor, mode, min_delta, "EarlyStopping")
        self.patience = check_non_negative_int(patience, "patience", "EarlyStopping")
        self.start_from_epoch = check_non_negative_int(start_from_epoch, "start_from_epoch", "EarlyStopping")
        self.baseline = check_threshold(baseline, "baseline", "EarlyStopping", "the value to beat")
        self.restore_best_weights = checked_flag(restore_best_weights, "EarlyStopping(restore_best_weights=...)")
        self.verbose = check_callback_verbose(verbose, "EarlyStopping")
        self.on_train_begin()

    def on_train_begin(self, logs=None):
        self.monitor.reset()
        self.wait = 0
        self.stopped_epoch = 0
        self.best_epoch = None
        self.best_weights = None

    @property
    def best(self) -> float:
        return self.monitor.best

    def on_epoch_end(self, epoch, logs=None):
        current = self.monitor.value(logs, self.loop, epoch)
        if current is None or epoch < self.start_from_epoch:
            return
        self.wait += 1
        if self.monitor.improved(current):
            self.monitor.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.loop.get_weights()
            if self.baseline is None or self.monitor.better(current, self.baseline):
                self.wait = 0
                return
        # An improvement that stays short of the baseline still counts towards patience (Keras'
        # rule); like Keras, epoch 0 never stops training.
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.loop.stop_training = True

    def on_train_end(self, logs=None):
        if self.stopped_epoch > 0 and self.verbose:
            self._say(f"Epoch {self.stopped_epoch + 1}: early stopping")
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose:
                self._say(f"Restoring the weights of the best epoch, {self.best_epoch + 1}")
            self.loop.set_weights(self.best_weights)
