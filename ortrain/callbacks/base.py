"""The callback contract: a fixed set of hooks, no-ops by default.

A callback sees the running fit through four attributes set before ``on_train_begin``:

* ``trainer``: the live :class:`ortrain.Trainer` (``lr``, ``set_lr``, ``save_checkpoint``,
  ``predict``, ``n_steps``);
* ``loop``: the fit loop: ``loop.stop_training = True`` stops training at the end of the
  current step; ``loop.get_weights()`` / ``loop.set_weights(ws)`` read and write the
  trained weights (``model.get_weights()`` order); ``loop.base_lr`` is the compiled (or last
  written) rate; ``loop.validates(epoch)`` says whether validation runs after that epoch
  (``validation_freq``);
* ``model``: the model being trained; reading it brings the current weights into it (and
  its ``train_state`` is the fit's optimizer state, so ``self.model.save(path)`` or
  ``self.model.copy()`` can resume), and as in Keras what a hook changes on it takes effect
  when the hook returns: the weights it sets (``model.set_weights``, those names only, or a
  layer's ``set_weights``), a learning rate written to
  ``model.optimizer.lr``, and ``model.stop_training = True`` (which a stop by any callback
  sets too, as in Keras). Read during the fit, ``model.optimizer.lr`` is the rate it trains
  at (a schedule's included, as ``trainer.lr``), and after it the rate the next fit starts at;
* ``params``: ``epochs``, ``initial_epoch``, ``steps``, ``batch_size``, ``samples``,
  ``verbose``, ``metrics``.

Epochs are counted from 0 as in Keras; ``initial_epoch`` shifts them. A callback resets
its own state in ``on_train_begin`` so one object can serve several fits (``ModelCheckpoint``
keeps its best value, as Keras' does); ``on_train_end``
runs for every callback whose ``on_train_begin`` did. The logs: ``on_batch_begin`` gets
``batch``; ``on_batch_end`` ``batch``, ``size`` (the batch's rows) and, as Keras 3 passes them,
the epoch's running means so far of ``loss`` and the metrics (``Trainer.step`` returns a batch's
own loss); ``on_epoch_end`` the epoch's ``loss`` and metrics, the ``val_`` ones
(after validated epochs only, see ``validation_freq``) and ``lr``; ``on_train_end`` the last
epoch's logs; ``on_train_begin`` and ``on_epoch_begin`` an empty dict.
``on_train_batch_begin``/``on_train_batch_end``, Keras 3's names, call ``on_batch_begin``/
``on_batch_end``: override either. Keras' ``on_test_*`` and ``on_predict_*`` hooks are not called
(a callback defining one is told so once).
"""

from __future__ import annotations

import inspect
import sys

from ortrain._warnings import warn
from ortrain.callbacks._monitor import Monitor

__all__ = ["Callback", "CallbackList"]

class Callback:
    """Base class: override the hooks you need; each is a no-op here.

    A fit calls ``on_train_begin``, then per epoch ``on_epoch_begin``, ``on_batch_begin`` and
    ``on_batch_end`` around every step, ``on_epoch_end``, and at last ``on_train_end``. Epochs
    are counted from 0 (shifted by ``initial_epoch``), batches from 0 in each epoch. During the
    fit ``self.model``, ``self.trainer``, ``self.loop`` and ``self.params`` are set (see the
    module's docstring).
    """

    loop = None
    trainer = None
    params: dict = {}

    @property
    def model(self):
        """The model being trained, holding the current weights (``None`` for a bare trainer)."""
        return self.loop.model if self.loop is not None else None

    def set_loop(self, loop) -> None:
        self.loop = loop
        self.trainer = loop.trainer
        self.params = loop.params

    def _say(self, text: str) -> None:
        """Print ``text`` on a line of its own: above the fit's live progress bar where one is drawn
        (printed plainly, it would run on from the half-drawn bar, on the screen a bar on standard
        error shares with standard output too)."""
        bar = getattr(self.loop, "live_bar", None)
        if bar is not None:
            bar.message(text, sys.stdout)
        else:
            print(text, flush=True)

    def __getstate__(self) -> dict:
        # A copy or a pickle (sklearn's clone, a saved History) holds the callback's own values, not
        # the links to the fit it ran in (its trainer holds a session, which cannot be copied).
        state = dict(self.__dict__)
        state.pop("loop", None)
        state.pop("trainer", None)
        return state

    def _check_fit(self) -> None:
        """Refuse settings this fit cannot honour (``params``, ``loop`` are set). Every callback's
        check runs before any ``on_train_begin``, so a refusal leaves what those would change
        (a log file truncated, a counter reset) as it was."""

    def on_train_begin(self, logs=None) -> None:
        """Called once before the first epoch; ``logs`` is empty. Reset the callback's state here."""

    def on_train_end(self, logs=None) -> None:
        """Called once at the end, for every callback whose ``on_train_begin`` ran: after the last
        epoch, when a callback stopped training, and when training raised; ``logs`` holds the last
        finished epoch's values."""

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        """Called before each epoch, ``epoch`` counted from 0 (from ``initial_epoch`` on); ``logs`` is
        empty."""

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Called after each epoch; ``logs`` holds the epoch's mean ``loss`` and metrics, the ``val_``
        values after an epoch that validated, and ``lr``."""

    def on_batch_begin(self, step: int, logs=None) -> None:
        """Called before each training step, ``step`` counted from 0 in each epoch; ``logs`` holds
        ``batch`` (the same index)."""

    def on_batch_end(self, step: int, logs=None) -> None:
        """Called after each training step; ``logs`` holds ``batch``, ``size`` (the batch's rows) and,
        as in Keras 3, the running means over the epoch's batches so far of ``loss`` (weighted by
        their rows) and of every metric."""

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        """Keras 3's name for :meth:`on_batch_begin`, which it calls; override either."""
        self.on_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Keras 3's name for :meth:`on_batch_end`, which it calls; override either."""
        self.on_batch_end(batch, logs)

    def _overrides(self, hook: str) -> bool:
        return getattr(type(self), hook) is not getattr(Callback, hook)

    def __repr__(self) -> str:
        """The class and its settings: each argument of its constructor stored under the same name,
        when required or not at its default (a watched value's name always)."""
        try:
            shown = ", ".join(f"{name}={_short(value)}" for name, value in self._settings())
        except Exception:  # noqa: BLE001 - a repr never raises (a subclass's half-built state)
            shown = "..."
        return f"{type(self).__name__}({shown})"

    def _settings(self):
        """``(argument, value)`` pairs for :meth:`__repr__`."""
        init = type(self).__init__
        if init is object.__init__:
            return
        monitor = self.__dict__.get("monitor")
        for p in list(inspect.signature(init).parameters.values())[1:]:
            if p.name == "min_delta" and isinstance(monitor, Monitor):  # kept by the monitor
                value = monitor.min_delta
            elif p.name == "mode" and isinstance(monitor, Monitor):  # the direction it watches, always
                yield p.name, monitor.mode
                continue
            elif p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name not in self.__dict__:
                continue
            else:
                value = self.__dict__[p.name]
            if isinstance(value, Monitor):
                yield p.name, value.name
            elif p.default is p.empty or not _same(value, p.default):
                yield p.name, value


def _same(value, default) -> bool:
    try:
        return bool(value == default) and type(value) is type(default)
    except Exception:  # noqa: BLE001 - an array compared with its default
        return False


def _short(value) -> str:
    if callable(value):
        text = getattr(value, "__name__", None)
    elif hasattr(value, "write") and isinstance(getattr(value, "name", None), str):
        text = value.name if value.name.startswith("<") else f"<{value.name}>"  # a file
    else:
        text = None
    text = text or repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Keras hooks of evaluation and prediction, which ortrain's fit does not call: a callback that
# defines one is told so once, instead of never hearing from it.
_UNCALLED = ("on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end", "on_predict_begin",
             "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end")
_told: set[tuple[type, str]] = set()


def _tell_uncalled(cb: Callback) -> None:
    for hook in _UNCALLED:
        if callable(getattr(type(cb), hook, None)) and (type(cb), hook) not in _told:
            warn(f"callback {type(cb).__name__} defines {hook}, which ortrain does not call: a fit calls "
                 "on_train_begin/end, on_epoch_begin/end and on_(train_)batch_begin/end, and validation "
                 "results reach on_epoch_end's logs as val_ values")
            _told.add((type(cb), hook))  # after: a warning filtered into an error is raised again next time


class CallbackList:
    """Calls every callback's hook in order. Batch hooks are called only on callbacks that
    override them, so a fit without per-step callbacks pays nothing per step."""

    def __init__(self, callbacks=()):
        self.callbacks = []
        if isinstance(callbacks, Callback) or not isinstance(callbacks, (list, tuple)):
            from ortrain.errors import OrtrainError
            raise OrtrainError(f"callbacks: expected a list of ot.callbacks.Callback objects, received "
                               f"{type(callbacks).__name__}; wrap a single callback in a list")
        for cb in callbacks:
            if not isinstance(cb, Callback):
                from ortrain.errors import OrtrainError
                raise OrtrainError(f"callbacks: expected ot.callbacks.Callback objects, received "
                                   f"{type(cb).__name__}; subclass ot.callbacks.Callback")
            self.callbacks.append(cb)
            _tell_uncalled(cb)
        self._batch_begin = [cb for cb in self.callbacks
                             if cb._overrides("on_batch_begin") or cb._overrides("on_train_batch_begin")]
        self._batch_end = [cb for cb in self.callbacks
                           if cb._overrides("on_batch_end") or cb._overrides("on_train_batch_end")]
        self.has_batch_hooks = bool(self._batch_begin or self._batch_end)

    def set_loop(self, loop) -> None:
        for cb in self.callbacks:
            cb.set_loop(loop)

    @staticmethod
    def _after() -> None:
        """Run after each callback's hook (the fit loop takes over what it changed on the model)."""

    def check(self) -> None:
        """Every callback's :meth:`Callback._check_fit`, before any ``on_train_begin`` runs."""
        for cb in self.callbacks:
            cb._check_fit()

    def on_train_begin(self, logs=None) -> None:
        self._started = []
        for cb in self.callbacks:
            cb.on_train_begin(logs)
            self._started.append(cb)
            self._after()

    def on_train_end(self, logs=None) -> None:
        """``on_train_end`` of every callback whose ``on_train_begin`` ran, even when one raises;
        the first error is re-raised. (A callback that never started holds another fit's state.)"""
        error = None
        for cb in getattr(self, "_started", self.callbacks):
            try:
                cb.on_train_end(logs)
                self._after()
            except Exception as exc:  # noqa: BLE001 - the others must still close their files
                error = error or exc
        if error is not None:
            raise error

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_begin(epoch, logs)
            self._after()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, logs)
            self._after()

    def on_batch_begin(self, step: int, logs=None) -> None:
        for cb in self._batch_begin:
            cb.on_train_batch_begin(step, logs)
            self._after()

    def on_batch_end(self, step: int, logs=None) -> None:
        for cb in self._batch_end:
            cb.on_train_batch_end(step, logs)
            self._after()
