"""The lifetime rules shared by everything that holds a runtime session."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import sys
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
    LEFT_AT_EXIT.clear()  # (a fork during the exit: the child's threads are its own)
    _held.clear()
    _held_until.clear()


def busy_at_fork(what: str) -> str:
    """Why an object whose runtime call was in flight in another thread at a fork is unusable in the child."""
    return (f"this process was forked while another thread of its parent was running this {what} (a call in "
            "flight); onnxruntime's threads for that call do not exist in the child, which would wait for them "
            "forever, so the child cannot use it: fork while no call runs, use multiprocessing's 'spawn' start "
            "method, or open a new one in the child")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)

QUIET_AT_EXIT_S = 5.0  # the longest the interpreter's exit waits for calls in flight in other threads
HELD_AT_EXIT_S = 30.0  # the longest a thread left running at the exit is held before its next call, unjoined
# The threads (objects: the system reuses the idents of ended ones) left running when the
# interpreter's exit began (daemon threads, and threads earlier atexit handlers started and left):
# their next call into a session waits (see _quiet_at_exit). Threads that atexit handlers start
# later are not among them, and run as usual.
LEFT_AT_EXIT: set[threading.Thread] = set()
_held: set[int] = set()  # the idents of the threads held now
_held_until: dict = {}  # thread -> when it is no longer held
_waits_at_exit: list = []  # functions(deadline) that wait for calls in flight no lock covers


def wait_at_exit(wait) -> None:
    """Have the interpreter's exit call ``wait(deadline)`` (a ``time.monotonic()`` time) once the
    threads left running are known (see :func:`_quiet_at_exit`)."""
    _waits_at_exit.append(wait)


def hold_if_left_at_exit() -> None:
    """Wait if this thread was left running when the interpreter's exit began: a call into
    onnxruntime still running when the interpreter is torn down aborts the process as it returns,
    and the interpreter ends a waiting thread with the process. While another thread joins this one
    (a later atexit handler that stops a worker and waits for it) the call goes on; after
    HELD_AT_EXIT_S held in all (it may wait for the thread in another way), every call does."""
    me = threading.current_thread()
    if me not in LEFT_AT_EXIT:
        return
    end = _held_until.setdefault(me, time.monotonic() + HELD_AT_EXIT_S)
    _held.add(me.ident)
    try:
        while not _joined(me):
            if time.monotonic() >= end:
                LEFT_AT_EXIT.discard(me)
                return
            time.sleep(0.02)
    finally:
        _held.discard(me.ident)


def _joined(thread: threading.Thread) -> bool:
    """Whether another thread waits in ``thread.join()`` (its frames say so)."""
    for frame in sys._current_frames().values():
        for _ in range(3):  # join, and the helper it waits in
            if frame is None:
                break
            if frame.f_code.co_name in ("join", "_wait_for_tstate_lock") and \
                    frame.f_code.co_filename == threading.__file__ and frame.f_locals.get("self") is thread:
                return True
            frame = frame.f_back
    return False


def _owner(lock) -> int | None:
    """The ident of the thread holding an ``RLock`` (from its repr; None where that does not say)."""
    found = re.search(r"owner=(\d+)", repr(lock))
    return int(found.group(1)) if found else None


def _quiet_at_exit() -> None:
    """At the interpreter's exit: have the next calls into a session of the threads still running
    wait (see hold_if_left_at_exit), and wait (QUIET_AT_EXIT_S at most) for their calls in flight,
    those of held threads excepted."""
    me = threading.current_thread()
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
            if _owner(lock) in _held:  # (a held thread's call of a snapshot, between its runs)
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
