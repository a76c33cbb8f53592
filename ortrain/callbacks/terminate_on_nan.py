"""``TerminateOnNaN``: stop as soon as a step's loss is not finite."""

from __future__ import annotations

import math

from ortrain.callbacks.base import Callback

__all__ = ["TerminateOnNaN"]


class TerminateOnNaN(Callback):
    """Stop training at the end of the first step whose loss is NaN or infinite.

    The epoch it happens in is still logged (its mean loss is then not finite), as in Keras.
    ``stopped_at`` is ``(epoch, step)``, both counted from 0 (None when it did not stop); the
    message counts both from 1, as the progress lines count epochs.
    """

    def on_train_begin(self, logs=None):
        self.stopped_at = None

    def on_batch_end(self, step, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            self.stopped_at = (self.loop.epoch, step)
            self._say(f"Epoch {self.loop.epoch + 1}, step {step + 1}: the loss is {loss}; terminating training")
            self.loop.stop_training = True
