"""``LambdaCallback``: a callback made of functions, as Keras' ``LambdaCallback``."""

from __future__ import annotations

from ortrain.callbacks.base import Callback
from ortrain.errors import OrtrainError

__all__ = ["LambdaCallback"]

class LambdaCallback(Callback):
    """Call the functions given for the hooks, with Keras' arguments: ``on_epoch_begin(epoch,
    logs)``, ``on_epoch_end(epoch, logs)``, ``on_batch_begin(batch, logs)`` (or Keras 3's
    ``on_train_batch_begin``), ``on_batch_end(batch, logs)`` (``on_train_batch_end``),
    ``on_train_begin(logs)``, ``on_train_end(logs)``. Hooks not given cost nothing (no per-step
    call without a batch function).

    >>> import ortrain as ot
    >>> seen = []
    >>> cb = ot.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
    """

    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_batch_begin=None, on_batch_end=None,
                 on_train_begin=None, on_train_end=None, on_train_batch_begin=None, on_train_batch_end=None):
        batch_hooks = {"on_batch_begin": (on_batch_begin, on_train_batch_begin),
                       "on_batch_end": (on_batch_end, on_train_batch_end)}
        for ours, (fn, keras3) in batch_hooks.items():
            if fn is not None and keras3 is not None:
                raise OrtrainError(f"LambdaCallback: {ours} and on_train_{ours[3:]} (Keras 3's name) are one hook; "
                                   "pass one of them")
        given = dict(on_epoch_begin=on_epoch_begin, on_epoch_end=on_epoch_end, on_train_begin=on_train_begin,
                     on_train_end=on_train_end,
                     **{ours: fn if fn is not None else keras3 for ours, (fn, keras3) in batch_hooks.items()})
        for hook, fn in given.items():
            if fn is not None and not callable(fn):
                raise OrtrainError(f"LambdaCallback({hook}=...): expected a function, received {type(fn).__name__}; "
                                   f"pass a function or a lambda, e.g. {hook}=lambda *args: ...")
        self._fns = {hook: fn for hook, fn in given.items() if fn is not None}

    def _overrides(self, hook: str) -> bool:
        return hook in self._fns

    def _settings(self):
        return self.__dict__.get("_fns", {}).items()

    def on_train_begin(self, logs=None):
        self._call("on_train_begin", logs)

    def on_train_end(self, logs=None):
        self._call("on_train_end", logs)

    def on_epoch_begin(self, epoch, logs=None):
        self._call("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._call("on_epoch_end", epoch, logs)

    def on_batch_begin(self, step, logs=None):
        self._call("on_batch_begin", step, logs)

    def on_batch_end(self, step, logs=None):
        self._call("on_batch_end", step, logs)

    def _call(self, hook: str, *args) -> None:
        fn = self._fns.get(hook)
        if fn is not None:
            fn(*args)
