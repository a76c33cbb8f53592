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
    global _joins_changed
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
    LEFT_AT_EXIT.clear()  # (a fork during the exit: the child's threads are its own)
    _exiting.clear()
    _held_until.clear()
    _joins.clear()
    _joins_changed = threading.Condition(threading.Lock())  # (a thread of the parent may have held it)


def busy_at_fork(what: str) -> str:
    """Why an object whose runtime call was in flight in another thread at a fork is unusable in the child."""
    return (f"this process was forked while another thread of its parent was running this {what} (a call in "
            "flight); onnxruntime's threads for that call do not exist in the child, which would wait for them "
            "forever, so the child cannot use it: fork while no call runs, use multiprocessing's 'spawn' start "
            "method, or open a new one in the child")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)

QUIET_AT_EXIT_S = 5.0  # the longest the interpreter's exit waits for calls in flight in other threads
HELD_AT_EXIT_S = 30.0  # how long after its first hold a thread not spared at the exit is held, unjoined
# The threads (objects: the system reuses the idents of ended ones) left running when the
# interpreter's exit began (daemon threads, and threads earlier atexit handlers started and left).
# From then on, the next call into a session of any thread the exit does not spare waits (see
# hold_if_left_at_exit): the spared ones are the thread that runs the exit, and the threads it
# (or, in turn, a thread it started) starts during the exit, as later atexit handlers do.
LEFT_AT_EXIT: set[threading.Thread] = set()
_SPARED: weakref.WeakSet = weakref.WeakSet()
_exiting: list = []  # [the thread that runs the exit] once it has begun
_held_until: dict = {}  # thread -> when it is no longer held
_waits_at_exit: list = []  # functions(deadline) that wait for calls in flight no lock covers
_joins: dict = {}  # thread -> joins of it in progress by spared threads (or threads such joins wait for)
_joins_changed = threading.Condition(threading.Lock())


def wait_at_exit(wait) -> None:
    """Have the interpreter's exit call ``wait(deadline)`` (a ``time.monotonic()`` time) once the
    threads left running are known (see :func:`_quiet_at_exit`)."""
    _waits_at_exit.append(wait)


def _spared(thread: threading.Thread) -> bool:
    return bool(_exiting) and (thread is _exiting[0] or thread in _SPARED)


def _owns_a_lock() -> bool:
    """Whether this thread is inside a call that holds an object's lock (a chunked prediction, a
    step): that call ends before the thread is held, or the threads waiting for the lock would wait
    out the hold (the exit waits QUIET_AT_EXIT_S for such calls)."""
    for owner in list(_locked):
        lock = owner.__dict__.get("_lock")
        if lock is not None and lock._is_owned():
            return True
    return False


def hold_if_left_at_exit() -> None:
    """Wait if the interpreter's exit has begun and does not spare this thread: a call into
    onnxruntime still running when the interpreter is torn down aborts the process as it returns,
    and the interpreter ends a waiting thread with the process. While a spared thread joins this one
    (a later atexit handler that stops a worker and waits for it), or a thread that such a join waits
    for joins it in turn, the call goes on; so does one made inside a call that holds a lock, which
    ends first. HELD_AT_EXIT_S after its first hold (it may be waited for in another way), every call
    goes on."""
    me = threading.current_thread()
    if not _exiting or _spared(me) or _joins.get(me) or _owns_a_lock():
        return
    end = _held_until.setdefault(me, time.monotonic() + HELD_AT_EXIT_S)
    with _joins_changed:
        while not _joins.get(me):
            left = end - time.monotonic()
            if left <= 0:
                _SPARED.add(me)  # for good: whatever waits for it is not a join
                return
            _joins_changed.wait(left)


def _at_exit(start, join):
    """``Thread.start`` and ``Thread.join`` during the exit: a thread that a spared thread starts is
    spared too, and a thread that a spared thread joins (or one such a join waits for) goes on."""
    @functools.wraps(start)
    def started(self, *args, **kwargs):
        if _spared(threading.current_thread()):
            _SPARED.add(self)
        return start(self, *args, **kwargs)

    @functools.wraps(join)
    def joined(self, *args, **kwargs):
        me = threading.current_thread()
        if not (_spared(me) or _joins.get(me)):
            return join(self, *args, **kwargs)
        with _joins_changed:
            _joins[self] = _joins.get(self, 0) + 1
            _joins_changed.notify_all()
        try:
            return join(self, *args, **kwargs)
        finally:
            with _joins_changed:
                if _joins[self] > 1:
                    _joins[self] -= 1
                else:
                    del _joins[self]

    started._ortrain_exit = joined._ortrain_exit = True
    return started, joined


def _quiet_at_exit() -> None:
    """At the interpreter's exit: have the next calls into a session of the threads the exit does not
    spare wait (see hold_if_left_at_exit), and wait (QUIET_AT_EXIT_S at most) for their calls in
    flight (a thread is never held inside a call that holds a lock)."""
    me = threading.current_thread()
    _exiting[:] = [me]
    if not getattr(threading.Thread.start, "_ortrain_exit", False):
        threading.Thread.start, threading.Thread.join = _at_exit(threading.Thread.start, threading.Thread.join)
    LEFT_AT_EXIT.update(t for t in threading.enumerate() if t is not me)
    if not LEFT_AT_EXIT:
        return
    deadline = time.monotonic() + QUIET_AT_EXIT_S
    for owner in list(_locked):
        lock = owner.__dict__.get("_lock")
        while lock is not None and time.monotonic() < deadline:
            if lock.acquire(timeout=0.01):
                lock.release()  # a call after this one sees LEFT_AT_EXIT (exclusive looks under the lock)
                break
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
        hold_if_left_at_exit()  # (not holding this lock, which a later atexit handler may want)
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
