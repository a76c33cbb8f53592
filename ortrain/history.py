"""``History``: what ``fit`` and ``fit_generator`` return, one entry per epoch."""

from __future__ import annotations

import csv
import math
import os

from ortrain import _optional
from ortrain._files import atomic_path, checked_target
from ortrain._keywords import name_unknown_arguments, names_unknown_arguments_of_methods
from ortrain.callbacks.base import Callback
from ortrain.callbacks.csv_logger import csv_cell
from ortrain.errors import OrtrainError

__all__ = ["History"]


class History(Callback):
    """Per-epoch logs of one fit.

    ``history``: a dict of lists, one value per epoch: ``loss`` (the mean loss of the epoch's
    training steps, each batch weighted by its rows), compiled metrics, ``val_loss`` and
    ``val_<metric>`` when there is validation data, ``lr`` (the learning rate of the epoch's
    last step, the last one used when a callback changes it within the epoch) and anything a
    callback adds to the logs. ``epoch``: the epoch numbers (from 0, ``initial_epoch`` included).
    ``params``: the fit's settings. A value missing in some epoch is NaN there, so every list has
    one entry per epoch: with ``validation_freq`` the ``val_`` lists hold NaN after the epochs that
    were not validated (Keras' lists leave those epochs out; ``np.isnan`` or
    ``to_pandas().dropna()`` finds the validated ones).
    """

    def __init__(self):
        self.history: dict[str, list] = {}
        self.epoch: list[int] = []
        self.params = {}

    def set_loop(self, loop) -> None:
        super().set_loop(loop)
        self.params = dict(loop.params)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        n = len(self.epoch)
        self.epoch.append(epoch)
        missing = self.__dict__.setdefault("_missing", set())  # (key, index) an epoch did not log
        for key, value in logs.items():
            if key not in self.history:
                self.history[key] = [math.nan] * n
                missing.update((key, i) for i in range(n))
            self.history[key].append(value)
        for key, column in self.history.items():
            if len(column) == n:
                column.append(math.nan)
                missing.add((key, n))

    def __len__(self) -> int:
        return len(self.epoch)

    def __repr__(self) -> str:
        logged = f": {', '.join(self.history)}" if self.history else ""
        n = len(self.epoch)
        return f"<History {n} epoch{'' if n == 1 else 's'}{logged}>"

    # -- export ---------------------------------------------------------------------------
    def to_csv(self, path) -> str:
        """Write ``epoch`` and every logged value, one row per epoch (numbers at full precision,
        ``NA`` where an epoch has none, ``nan`` where it logged a NaN, anything else a callback
        logged as its text), as ``CSVLogger`` writes them: the values' columns sorted by name."""
        keys = sorted(self.history)
        missing = self.__dict__.get("_missing", ())
        with atomic_path(path, "to_csv(path)") as tmp, open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["epoch", *keys])
            for i, e in enumerate(self.epoch):
                w.writerow([e, *("NA" if (k, i) in missing else csv_cell(self.history[k][i]) for k in keys)])
        return os.fspath(path)

    def to_pandas(self):
        """A ``pandas.DataFrame`` indexed by epoch (needs pandas: ``pip install 'ortrain[plot]'``)."""
        pd = _optional.load("pandas", "History.to_pandas")
        return pd.DataFrame(self.history, index=pd.Index(self.epoch, name="epoch"))

    def plot(self, path) -> str:
        """Save a figure with one panel per quantity (``loss`` beside ``val_loss``, each metric beside its
        ``val_`` twin, ``lr`` alone) to ``path`` (needs matplotlib: ``pip install 'ortrain[plot]'``)."""
        if not self.epoch:
            raise OrtrainError("History.plot: the history holds no epoch; nothing to plot")
        matplotlib = _optional.load("matplotlib", "History.plot")
        matplotlib.use("Agg", force=False)
        plt = _optional.load("matplotlib.pyplot", "History.plot")
        FigureCanvasBase = _optional.load("matplotlib.backend_bases", "History.plot").FigureCanvasBase
        target = checked_target(path, "History.plot(path)")
        fmt = target.suffix[1:].lower() or "png"  # as matplotlib takes it, but written to path itself
        formats = FigureCanvasBase.get_supported_filetypes()
        if fmt not in formats:
            raise OrtrainError(f"History.plot(path): matplotlib writes no {fmt!r} files (from the extension of "
                               f"{os.fspath(path)!r}); use one of {', '.join(sorted(formats))}, e.g. 'history.png'")
        panels = [k for k in self.history if not k.startswith("val_")]
        panels += [k[4:] for k in self.history if k.startswith("val_") and k[4:] not in self.history]
        fig, axes = plt.subplots(len(panels), 1, figsize=(6, 2.6 * len(panels)), sharex=True, squeeze=False)
        try:
            for ax, key in zip(axes[:, 0], panels):
                for name in (key, f"val_{key}"):
                    if name in self.history:
                        ax.plot(self.epoch, self.history[name], marker="o", label=name)
                ax.set_ylabel(key)
                if key == "lr" and all(v > 0 for v in self.history["lr"]):
                    ax.set_yscale("log")
                ax.legend()
            axes[-1, 0].set_xlabel("epoch")
            fig.tight_layout()
            with atomic_path(path, "History.plot(path)") as tmp:
                fig.savefig(tmp, format=fmt)
        finally:
            plt.close(fig)
        return os.fspath(path)


name_unknown_arguments(History)
names_unknown_arguments_of_methods(History, "to_csv", "to_pandas", "plot")
