"""The progress display of ``fit``: a live bar on a terminal, else one line per epoch.

``verbose=1`` on a terminal draws a live bar with the running loss and the throughput
(tqdm when installed, the ``progress`` extra; a plain in-house bar otherwise).
``verbose=2``, or ``verbose=1`` when the output is not a terminal (a log file, a CI
job), prints one line per epoch. ``verbose=0`` prints nothing.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time

from ortrain.callbacks.base import Callback
from ortrain.errors import OrtrainError

__all__ = ["ProgressBar", "ProgressLines", "check_verbose", "progress"]

REFRESH_S = 0.1  # the bar is redrawn at most this often; a redraw per step would cost more than a step


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if (value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4)) or math.isnan(value) \
            else f"{value:.4f}"
    return str(value)


def format_logs(logs: dict) -> str:
    return " - ".join(f"{k}: {_number(v)}" for k, v in logs.items())


def progress(verbose, file=None):
    """The display for ``verbose`` (0, 1 or 2; Keras' default ``"auto"`` is 1), or None for silence."""
    if verbose in (0, False):
        return None
    if isinstance(verbose, str) and verbose == "auto":
        verbose = 1
    if verbose not in (1, 2, True):
        raise OrtrainError(f"verbose: expected 0 (silent), 1 or 'auto' (live bar on a terminal) or 2 (one line "
                           f"per epoch), received {verbose!r}")
    out = file if file is not None else sys.stdout
    isatty = getattr(out, "isatty", None)
    live = verbose in (1, True) and callable(isatty) and isatty()
    return ProgressBar(out) if live else ProgressLines(out)


def check_verbose(verbose) -> None:
    """Refuse a bad ``verbose`` before training starts, without touching any output."""
    progress(verbose, file=_NoTerminal)


class _NoTerminal:
    @staticmethod
    def isatty() -> bool:
        return False

    @staticmethod
    def write(text: str) -> int:  # never called: check_verbose only builds the callback
        return len(text)


class ProgressLines(Callback):
    """One line per epoch: steps, time, samples per second and the epoch's logs."""

    def __init__(self, file=None):
        binary = isinstance(file, (io.RawIOBase, io.BufferedIOBase)) or "b" in str(getattr(file, "mode", ""))
        if file is not None and (binary or not callable(getattr(file, "write", None))):
            hint = f": open it first, file=open({file!r}, 'w')" if isinstance(file, (str, os.PathLike)) else ""
            raise OrtrainError(f"{type(self).__name__}(file=...): expected a text stream with write() such as "
                               f"sys.stdout (or None for sys.stdout), received {file!r}{hint}")
        self.file = file if file is not None else sys.stdout

    def on_epoch_begin(self, epoch, logs=None):
        self._t0 = time.perf_counter()

    def _summary(self, epoch: int, logs) -> str:
        seconds = time.perf_counter() - self._t0
        loop = self.loop
        rate = loop.epoch_samples / seconds if seconds > 0 else float("inf")
        head = f"Epoch {epoch + 1}/{self.params.get('epochs')} - {loop.epoch_steps} steps - {seconds:.2f}s - " \
               f"{rate:,.0f} samples/s"
        return f"{head} - {format_logs(logs)}" if logs else head

    def on_epoch_end(self, epoch, logs=None):
        print(self._summary(epoch, logs or {}), file=self.file, flush=True)


class ProgressBar(ProgressLines):
    """A live bar redrawn at most every ``REFRESH_S`` seconds."""

    _bar = None

    def on_train_begin(self, logs=None):
        self._bar = None

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._seen = 0
        self._shown = 0
        self._next_draw = self._t0 + REFRESH_S
        desc = f"Epoch {epoch + 1}/{self.params.get('epochs')}"
        self._bar = self.loop.live_bar = _open_bar(desc, self.loop.steps_hint, self.file)

    def on_batch_end(self, step, logs=None):
        self._seen += logs["size"]
        now = time.perf_counter()
        if now >= self._next_draw:
            self._next_draw = now + REFRESH_S
            rate = self._seen / (now - self._t0)
            self._bar.draw(step + 1, f"loss: {_number(logs['loss'])} - {rate:,.0f} samples/s")  # the epoch's so far

    def on_epoch_end(self, epoch, logs=None):
        if self._bar is not None:
            self._bar.finish(self.loop.epoch_steps, self._summary(epoch, logs or {}))
            self._bar = self.loop.live_bar = None

    def on_train_end(self, logs=None):
        if self._bar is not None:  # training failed or stopped inside an epoch
            self._bar.abandon()
            self._bar = self.loop.live_bar = None


def _open_bar(desc: str, total, file):
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return _PlainBar(desc, total, file)
    return _TqdmBar(desc, total, file)


class _TqdmBar:
    def __init__(self, desc, total, file):
        from tqdm import tqdm
        self._bar = tqdm(total=total, desc=desc, unit="step", file=file, leave=False, dynamic_ncols=True,
                         mininterval=REFRESH_S)
        self.file = file

    def draw(self, steps: int, text: str) -> None:
        self._bar.set_postfix_str(text, refresh=False)  # first: update() may redraw
        self._bar.update(steps - self._bar.n)

    def finish(self, steps: int, line: str) -> None:
        self._bar.update(steps - self._bar.n)
        self._bar.close()
        print(line, file=self.file, flush=True)

    def message(self, text: str, out) -> None:
        self._bar.clear()  # the bar's line emptied, the line written, the bar drawn again below it
        print(text, file=out, flush=True)
        self._bar.refresh()

    def abandon(self) -> None:
        self._bar.close()


class _PlainBar:
    WIDTH = 30

    def __init__(self, desc, total, file):
        self._desc, self._total, self.file = desc, total, file
        self._len = 0
        self._drawn = ""  # the bar's last text, drawn again below a message

    def _write(self, text: str, end: str = "") -> None:
        pad = " " * max(self._len - len(text), 0)
        self.file.write("\r" + text + pad + end)
        self.file.flush()
        self._len = 0 if end else len(text)

    def message(self, text: str, out) -> None:
        if out is self.file:
            self._write(text, end="\n")  # over the bar
        else:
            self._write("")  # the bar's line emptied (a bar on standard error shares the screen)
            self.file.write("\r")
            self.file.flush()
            print(text, file=out, flush=True)
        if self._drawn:  # the bar again, below the line
            self._write(self._drawn)

    def draw(self, steps: int, text: str) -> None:
        if self._total:
            done = min(self.WIDTH, self.WIDTH * steps // self._total)
            bar = "=" * done + (">" if done < self.WIDTH else "") + " " * (self.WIDTH - done - 1)
            self._drawn = f"{self._desc} [{bar}] {steps}/{self._total} - {text}"
        else:
            self._drawn = f"{self._desc} {steps} steps - {text}"
        self._write(self._drawn)

    def finish(self, steps: int, line: str) -> None:
        self._write(line, end="\n")

    def abandon(self) -> None:
        if self._len:
            self._write("", end="\n")
