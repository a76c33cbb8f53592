"""The lifetime rules shared by everything that holds a runtime session."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref

from ortrain.errors import OrtrainError

_locked = weakref.WeakSet()  # objects whose lock exclusive() takes


def new_lock(owner) -> threading.RLock:
    """The lock :func:`exclusive` takes for ``owner``; a forked child gets a fresh one (a thread
    of the parent that held it at the fork does not exist in the child, which would wait forever),
    and then runs the owner's ``_after_fork_in_child()`` if it has one."""
    _locked.add(owner)
    return threading.RLock()


def _fresh_locks_in_child() -> None:
    for owner in list(_locked):
        owner._lock = threading.RLock()
        after = getattr(owner, "_after_fork_in_child", None)
        if after is not None:
            after()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


def exclusive(method):
    """Run ``method`` holding ``self._lock`` (an ``RLock``): with ``free`` exclusive too, another
    thread's ``free`` waits for a call in flight, and the call after it raises ``FreedError``."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return call


class Releasable:
    """``with obj: ...`` frees on exit, and garbage collection frees as a backstop.

    Subclasses implement ``free()`` (idempotent) and ``_live()`` (raises ``FreedError`` once
    freed). Free explicitly: when the collector runs is not predictable.
    """

    def _live(self) -> None:
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    # What to do instead of copying: a session cannot be copied or pickled, and a shallow copy
    # sharing one would count steps of its own.
    _instead = "free it and make a new one"

    def __reduce_ex__(self, protocol):
        raise OrtrainError(f"a {type(self).__name__} holds an onnxruntime session and cannot be copied or pickled; "
                           f"{self._instead}")

    def __del__(self):
        with contextlib.suppress(Exception):
            self.free()
