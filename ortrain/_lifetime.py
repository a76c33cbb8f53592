"""The lifetime rules shared by everything that holds a runtime session."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
import time
import weakref

from ortrain.errors import OrtrainError

_locked = weakref.WeakSet()  # objects whose lock exclusive() takes
_kept = weakref.WeakSet()  # holders of runtime sessions that a forked child must never destroy


def kept_in_forked_children(owner) -> None:
    """Have a forked child run ``owner._after_fork_in_child()``: a session whose threads were busy
    at the fork (a call in flight, or its threads still spinning after one) crashes the child that
    destroys it, so the child keeps it (the system takes the memory back when the child ends)."""
    _kept.add(owner)


def new_lock(owner) -> threading.RLock:
    """The lock :func:`exclusive` takes for ``owner``; a forked child gets a fresh one (a thread
    of the parent that held it at the fork does not exist in the child, which would wait forever),
    and then runs the owner's ``_after_fork_in_child()`` if it has one."""
    _locked.add(owner)
    return threading.RLock()


def _fresh_locks_in_child() -> None:
    # every owner, each on its own: one that fails here (half made by a thread of the parent that
    # the child does not have) must not leave the next ones with the parent's locks and objects
    for owner in list(_locked):
        try:
            held = owner.__dict__.get("_lock")
            # held by another thread of the parent: a call of onnxruntime's was in flight
            busy = held is not None and not held.acquire(blocking=False)
            owner._lock = threading.RLock()
            after = getattr(owner, "_after_fork_in_child", None)
            if after is not None:
                after()
            if busy:
                owner._busy_at_fork()
        except Exception:  # noqa: BLE001,S112 - nothing may stop the others' repair in the child
            continue
    for owner in list(_kept):
        try:
            owner._after_fork_in_child()
        except Exception:  # noqa: BLE001,S112 - as above
            continue


def busy_at_fork(what: str) -> str:
    """Why an object whose runtime call was in flight in another thread at a fork is unusable in the child."""
    return (f"this process was forked while another thread of its parent was running this {what} (a call in "
            "flight); onnxruntime's threads for that call do not exist in the child, which would wait for them "
            "forever, so the child cannot use it: fork while no call runs, use multiprocessing's 'spawn' start "
            "method, or open a new one in the child")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)

QUIET_AT_EXIT_S = 5.0  # the longest the interpreter's exit waits for calls in flight in daemon threads
# The idents of the daemon threads left running when the interpreter's exit began: from then on, a
# call of theirs into a session waits for good (see _quiet_at_exit). Threads that atexit handlers
# start later are not among them, and run as before.
LEFT_AT_EXIT: set[int] = set()
_waits_at_exit: list = []  # functions(deadline) that wait for calls in flight no lock covers


def wait_at_exit(wait) -> None:
    """Have the interpreter's exit call ``wait(deadline)`` (a ``time.monotonic()`` time) once the
    daemon threads left running are known (see :func:`_quiet_at_exit`)."""
    _waits_at_exit.append(wait)


def park_if_left_at_exit() -> None:
    """Wait for good if this thread is a daemon thread the interpreter's exit left running: it would
    call onnxruntime while the runtime's objects are torn down (which aborts the process)."""
    if threading.get_ident() in LEFT_AT_EXIT:
        threading.Event().wait()


def _quiet_at_exit() -> None:
    """At the interpreter's exit (only daemon threads are left): have their next calls into a session
    wait for good, and wait (QUIET_AT_EXIT_S at most) for their calls in flight."""
    me = threading.current_thread()
    LEFT_AT_EXIT.update(t.ident for t in threading.enumerate() if t.daemon and t is not me)
    if not LEFT_AT_EXIT:
        return
    deadline = time.monotonic() + QUIET_AT_EXIT_S
    for owner in list(_locked):
        lock = owner.__dict__.get("_lock")
        if lock is not None and lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            lock.release()  # a call after this one sees LEFT_AT_EXIT (exclusive looks under the lock)
    for wait in _waits_at_exit:
        wait(deadline)


atexit.register(_quiet_at_exit)


def exclusive(method):
    """Run ``method`` holding ``self._lock`` (an ``RLock``): with ``free`` exclusive too, another
    thread's ``free`` waits for a call in flight, and the call after it raises ``FreedError``."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            if not LEFT_AT_EXIT:
                return method(self, *args, **kwargs)
        park_if_left_at_exit()  # (not holding the lock, which a later atexit handler may want)
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
