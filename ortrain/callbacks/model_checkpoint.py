"""``ModelCheckpoint``: save a resumable training checkpoint, or the model, after epochs."""

from __future__ import annotations

import os

from ortrain.callbacks._monitor import Monitor
from ortrain.callbacks.base import Callback
from ortrain.errors import OrtrainError

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(Callback):
    """Write ``trainer.save_checkpoint(filepath)`` at the end of every epoch, or only when
    ``monitor`` improves with ``save_best_only=True``.

    The file holds weights, optimizer moments, step counters and learning rate;
    ``ot.Trainer.from_checkpoint(model, filepath, batch_size=...)`` continues from it bit-exactly
    (with the ``nbatch_logical`` and ``loss_mask`` of the fit that wrote it; ``loss_mask=1`` for a
    fit with per-sample weights, whatever its loss). ``filepath`` may hold
    ``str.format`` fields: ``{epoch}`` (counted from 1, as Keras names files) and any logged
    value, e.g. ``"ckpt-{epoch:02d}-{val_loss:.3f}"``. Every file is written to a temporary name
    and renamed, so a checkpoint on disk is always complete, also after a failed fit.

    ``save_model=True`` writes the model instead, as Keras' ``ModelCheckpoint`` does:
    ``model.save(filepath)`` with the weights of that epoch and the optimizer state, which
    ``ot.load_model`` reads back and ``fit`` continues from (a fit of a model, not of a bare trainer).
    """

    def __init__(self, filepath, monitor: str = "val_loss", save_best_only: bool = False, mode: str = "auto",
                 verbose: int = 0, save_model: bool = False):
        if not isinstance(filepath, (str, os.PathLike)) or not os.fspath(filepath):
            raise OrtrainError(f"ModelCheckpoint(filepath=...): expected a file path such as 'ckpt-{{epoch}}', "
                               f"received {filepath!r}")
        self.filepath = os.fspath(filepath)
        self.save_best_only = bool(save_best_only)
        self.save_model = bool(save_model)
        self.monitor = Monitor(monitor, mode, 0.0, "ModelCheckpoint")
        self.verbose = verbose
        self.saved: list[str] = []

    def on_train_begin(self, logs=None):
        directory = os.path.dirname(os.path.abspath(self.filepath))
        if not os.path.isdir(directory):
            raise OrtrainError(f"ModelCheckpoint: directory {directory!r} does not exist; create it or choose "
                               "another filepath")
        if self.save_model and self.loop.model is None:
            raise OrtrainError("ModelCheckpoint(save_model=True): this fit trains a bare trainer, not a model; "
                               "save trainer checkpoints (save_model=False) instead")
        # The path of the first epoch, with every value the fit logs: a bad format, a validation value
        # without validation data or a folder is refused now, before anything trains (a name another
        # callback may add to the logs is looked up at the epoch's end).
        logged = dict.fromkeys(self.params.get("metrics") or (), 0.0)
        try:
            path = self.filepath.format(epoch=1, **logged)
        except KeyError as exc:
            name, path = str(exc.args[0]), None
            if name.startswith("val_") and not any(k.startswith("val_") for k in logged):
                raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} names {name!r}, and this fit has "
                                   "no validation data; pass validation_data or validation_split, or drop it from "
                                   "the path") from None
        except (IndexError, ValueError):
            path = self._path(0, logged)  # raises, naming the format
        if path is not None and os.path.isdir(path):
            raise OrtrainError(f"ModelCheckpoint: filepath {self.filepath!r} gives {path!r}, a directory; give a file "
                               "path such as 'ckpt-{epoch}'")
        self.monitor.reset()
        self.saved = []

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
            current = self.monitor.value(logs)
            if current is None or not self.monitor.improved(current):
                return
            self.monitor.best = current
        path = self._path(epoch, logs)
        if self.save_model:
            model = self.model  # holds this epoch's weights
            model.train_state = self.trainer.export_state()
            model.save(path)
        else:
            self.trainer.save_checkpoint(path)
        self.saved.append(path)
        if self.verbose:
            print(f"Epoch {epoch + 1}: checkpoint saved to {path}")
