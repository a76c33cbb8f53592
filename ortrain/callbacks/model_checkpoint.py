"""``ModelCheckpoint``: save a resumable training checkpoint, or the model, after epochs."""

from __future__ import annotations

import os
import re
import string

from ortrain._arrays import checked_flag
from ortrain._files import checked_target
from ortrain.callbacks._monitor import Monitor, check_callback_verbose, check_threshold
from ortrain.callbacks.base import Callback
from ortrain.callbacks.lambda_callback import LambdaCallback
from ortrain.errors import OrtrainError

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(Callback):
    """Save at the end of every epoch, or only when ``monitor`` improves with ``save_best_only=True``.

    What is written, by ``save_model``:

    * ``None`` (the default): the model, as Keras' ``ModelCheckpoint`` writes it, when the fit
      trains a model; a trainer checkpoint when it trains a bare trainer.
    * ``True``: the model, ``model.save(filepath)``: architecture, the weights of that epoch and
      the optimizer state, which ``ot.load_model`` reads back and ``fit`` (or a ``Trainer``)
      continues from.
    * ``False``: ``trainer.save_checkpoint(filepath)``: weights, optimizer moments, step counters
      and learning rate, which ``ot.Trainer.from_checkpoint(model, filepath, batch_size=...)``
      continues from bit-exactly (with the ``loss_mask`` of the fit that wrote it, ``loss_mask=1``
      for a fit with per-sample or class weights, whatever its loss; its ``nbatch_logical`` is
      taken from the checkpoint).

    ``filepath`` may hold
    ``str.format`` fields: ``{epoch}`` (counted from 1, as Keras names files) and any logged
    value, e.g. ``"ckpt-{epoch:02d}-{val_loss:.3f}"``. Every file is written to a temporary name
    and renamed, so a file on disk is always complete, also after a failed fit.

    As in Keras, the best value monitored is kept across fits with the same callback (a continued
    fit saves over the best file only when it does better), and ``initial_value_threshold`` sets
    the value to beat before the first save.

    ``save_weights_only=True`` writes the weights alone, ``model.save_weights(filepath)`` (an
    ``.npz`` of the weights by name, which ``model.load_weights`` reads, whatever the file's
    extension). ``save_freq`` takes ``"epoch"`` only.

    ``save_best_only`` saves nothing after an epoch whose logs lack the monitored value, and warns
    that it is not logged. With it, ``mode="auto"`` reads the direction from the name: losses,
    ``mae`` and ``mse`` shrink, accuracies grow; another name (a score a callback logs) needs ``mode``.

    With ``validation_freq`` an epoch without validation logs no ``val_`` values: ``save_best_only``
    monitoring one skips that epoch, and a ``filepath`` naming one is refused when training begins
    unless only validated epochs save (``save_best_only=True`` monitoring a ``val_`` value).
    """

    def __init__(self, filepath, monitor: str = "val_loss", save_best_only: bool = False, mode: str = "auto",
                 verbose: int = 0, save_model: bool | None = None, initial_value_threshold: float | None = None,
                 save_weights_only: bool = False, save_freq="epoch"):
        if not isinstance(filepath, (str, os.PathLike)) or not os.fspath(filepath):
            raise OrtrainError(f"ModelCheckpoint(filepath=...): expected a file path such as 'ckpt-{{epoch}}', "
                               f"received {filepath!r}")
        if save_freq != "epoch":
            raise OrtrainError(f"ModelCheckpoint(save_freq=...): only 'epoch' (save at the end of every epoch) is "
                               f"supported, received {save_freq!r}; save every n batches from a callback's "
                               "on_batch_end with self.model.save(path)")
        self.save_weights_only = checked_flag(save_weights_only, "ModelCheckpoint(save_weights_only=...)")
        if self.save_weights_only and save_model is not None:
            raise OrtrainError("ModelCheckpoint: give save_weights_only=True (the weights, model.save_weights) or "
                               f"save_model={save_model!r}, not both")
        self.filepath = os.fspath(filepath)
        self.save_best_only = checked_flag(save_best_only, "ModelCheckpoint(save_best_only=...)")
        self.save_model = None if save_model is None else checked_flag(save_model, "ModelCheckpoint(save_model=...)")
        # the direction matters only to save_best_only (every epoch saves without it, whatever the name)
        self.monitor = Monitor(monitor, mode, 0.0, "ModelCheckpoint", compares=self.save_best_only)
        self._mode = mode
        threshold = check_threshold(initial_value_threshold, "initial_value_threshold", "ModelCheckpoint",
                                    "the value the first save must beat")
        if threshold is not None:
            self.monitor.best = threshold
        self.verbose = check_callback_verbose(verbose, "ModelCheckpoint")
        self.saved: list[str] = []

    def _check_fit(self):
        directory = os.path.dirname(os.path.abspath(self.filepath))
        if not os.path.isdir(directory):
            what = "is a file, not a directory" if os.path.exists(directory) else "does not exist"
            raise OrtrainError(f"ModelCheckpoint: directory {directory!r} of filepath {what}; create it or choose "
                               "another filepath")
        if (self.save_model is True or self.save_weights_only) and self.loop.model is None:
            given = "save_weights_only=True" if self.save_weights_only else "save_model=True"
            raise OrtrainError(f"ModelCheckpoint({given}): this fit trains a bare trainer, not a model; "
                               "save trainer checkpoints (save_model=False) instead")
        # The path of the first epoch, with every value the fit logs: a bad format, a validation value
        # without validation data or a folder is refused now, before anything trains (a name another
        # callback may add to the logs is looked up at the epoch's end).
        logged = dict.fromkeys(self.params.get("metrics") or (), 0.0)
        if self.save_best_only and self.__dict__.get("_mode") == "auto":  # set after construction
            Monitor(self.monitor.name, "auto", 0.0, "ModelCheckpoint", compares=True)  # refuses a name it cannot read
        self._check_validation_freq()
        try:
            path = self.filepath.format(epoch=1, **logged)
        except KeyError as exc:
            name, path = str(exc.args[0]), None
            # a validation value of what the fit logs; another name (val_f1) a callback may log
            if name.startswith("val_") and name[4:] in logged and not any(k.startswith("val_") for k in logged):
                raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} names {name!r}, and this fit has "
                                   "no validation data; pass validation_data or validation_split, or drop it from "
                                   "the path") from None
            if not self._logs_may_grow():  # nothing else can log it: refused before anything trains
                raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} names {name!r}, which this fit does "
                                   f"not log; the values logged are epoch, {', '.join(logged)}; name one of those "
                                   "(or log it from a callback's on_epoch_end, ahead of this one)") from None
        except (IndexError, ValueError):
            path = self._path(0, logged)  # raises, naming the format
        if path is not None and os.path.isdir(path):
            raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} gives {path!r}, a directory; give a file "
                               "path such as 'ckpt-{epoch}'")
        if path is not None:  # a name ending in '/', a read-only file: refused before anything trains
            checked_target(path, "ModelCheckpoint(filepath=...)")

    def _logs_may_grow(self) -> bool:
        """Whether a callback ahead of this one runs code of the caller's at an epoch's end, which
        may add a value to the logs this one reads (ortrain's own callbacks add none)."""
        callbacks = getattr(getattr(self.loop, "callbacks", None), "callbacks", None)
        if callbacks is None:
            return True  # a loop that does not say: the name is looked up at the epoch's end
        ahead = callbacks[:next((i for i, cb in enumerate(callbacks) if cb is self), len(callbacks))]
        return any(cb._overrides("on_epoch_end") and (isinstance(cb, LambdaCallback) or
                                                      not type(cb).__module__.startswith("ortrain."))
                   for cb in ahead)

    def on_train_begin(self, logs=None):
        self.saved = []  # the best value stays, as Keras keeps it

    def _check_validation_freq(self) -> None:
        """A filepath naming a ``val_`` value cannot be written after an epoch without validation."""
        skipped = None if self.loop is None else self.loop.first_without_validation()
        if skipped is None or (self.save_best_only and self.monitor.name.startswith("val_")):
            return
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.filepath) if f]
        except ValueError:
            return  # a bad format, which _path names
        named = [m.group(0) for m in (re.match(r"val_\w*", f) for f in fields) if m]
        if named:
            name = named[0]
            raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} names {name!r}, and this fit's "
                               f"validation_freq leaves epoch {skipped + 1} (counted from 1) without validation; "
                               "drop it from the path, save only validated epochs with save_best_only=True and a "
                               "val_ monitor, or validate every epoch (validation_freq=1)")

    def _path(self, epoch: int, logs: dict) -> str:
        try:
            return self.filepath.format(epoch=epoch + 1, **logs)
        except (KeyError, IndexError, ValueError) as exc:
            raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} names a value that is not logged "
                               f"or has a bad format ({exc!r}); logged values are {', '.join(sorted(logs))}") \
                from exc

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self.save_best_only:
            current = self.monitor.value(logs, self.loop, epoch)
            if current is None or not self.monitor.improved(current):
                return
            self.monitor.best = current
        path = self._path(epoch, logs)
        if self.save_weights_only:
            self.model.save_weights(path)  # an .npz of the weights by name, whatever the extension
        elif self.save_model or (self.save_model is None and self.loop.model is not None):
            self.model.save(path)  # this epoch's weights, and (train_state) the optimizer state
        else:
            self.trainer.save_checkpoint(path)
        self.saved.append(path)
        if self.verbose:
            self._say(f"Epoch {epoch + 1}: checkpoint saved to {path}")
