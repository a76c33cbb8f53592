"""The lifetime rules shared by everything that holds a runtime session."""

from __future__ import annotations

import _thread
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
    """A lock for ``owner`` to keep as ``owner._lock`` (the one :func:`exclusive` takes); a forked
    child gets a fresh one (a thread of the parent that held it at the fork does not exist in the
    child, which would wait forever), and then runs the owner's ``_after_fork_in_child()`` if it
    has one, and its ``_busy_at_fork()``, if it has one, where the lock was held at the fork."""
    _locked.add(owner)
    return threading.RLock()


def _fresh_locks_in_child() -> None:
    global _state, _looking, _needed, _needed_seen
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
            told = getattr(owner, "_busy_at_fork", None)
            if busy and told is not None:
                told()
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
    _joining.clear()
    _seen.clear()
    _held.clear()
    _seen_objects.clear()
    _scanner.clear()
    _seen_at[:] = [-1e9, 0.0]
    _needed, _needed_seen = frozenset(), {}
    _state, _looking = threading.RLock(), threading.Lock()  # (a thread of the parent may have held them)


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
LOOK_S = 0.05  # how often the stacks of all threads are looked at while a thread is held (at least)
# The idents of the threads left running when the interpreter's exit began (daemon threads, and
# threads earlier atexit handlers started and left): the exit waits for their calls in flight, and
# holds threads only if there are any. From then on, the next call into a session of any thread
# the exit does not spare waits (see hold_if_left_at_exit): the spared ones are the thread that
# runs the exit, and the threads it (or, in turn, a thread it started) starts during the exit, as
# later atexit handlers do.
LEFT_AT_EXIT: set[int] = set()  # (their idents)
_SPARED: weakref.WeakSet = weakref.WeakSet()
_exiting: list = []  # [the thread that runs the exit] once it has begun
_held_until: dict = {}  # thread -> when it is no longer held
_waits_at_exit: list = []  # functions(deadline) that wait for calls in flight no lock covers
# Who waits for whom during the exit: a held thread goes on while a spared thread waits for it,
# or a thread that a spared one waits for (and so on). Guarded by _state, re-entrant: a signal
# handler may join a thread while its own thread is inside a join.
_state = threading.RLock()
_joining: dict = {}  # thread -> the threads it joins now, through Thread.join as patched at the exit
# thread -> [(a thread the last look at the stacks (_look) found it waiting for, why)]: why is None for
# a join, and for a lock, the id of the object whose lock it is (which that thread owned then)
_seen: dict = {}
_seen_objects: dict = {}  # the id of an object whose lock the last look saw waited for -> a weak reference to it
_seen_at = [-1e9, 0.0]  # when the stacks were last looked at, and how long that took
_held: dict = {}  # thread waiting in hold_if_left_at_exit -> its wake-up Event
_scanner: list = []  # [the held thread that looks at the stacks every _look_every() seconds]
_needed = frozenset()  # threads the spared ones wait for, through the joins seen by the patch alone
_needed_seen: dict = {}  # thread -> whys, through the waits the stacks showed too (as fresh as that look)
_looking = threading.Lock()


def wait_at_exit(wait) -> None:
    """Have the interpreter's exit call ``wait(deadline)`` (a ``time.monotonic()`` time) once the
    threads left running are known (see :func:`_quiet_at_exit`)."""
    _waits_at_exit.append(wait)


def _listed(weak: weakref.WeakSet) -> list:
    """The members of ``weak``, which other threads may add to meanwhile."""
    while True:
        try:
            return list(weak)
        except RuntimeError:  # (changed size during iteration)
            continue


def _spared(thread: threading.Thread) -> bool:
    return bool(_exiting) and (thread is _exiting[0] or thread in _SPARED)


def _look_every() -> float:
    return max(LOOK_S, 10 * _seen_at[1])


def _update_needed() -> None:
    """Recompute the threads the spared ones wait for, and wake those of them that are held. Call
    holding ``_state``. Only spared threads that wait for something are roots: the exit's thread and
    the threads the stacks or the patched join show waiting (not every thread spared)."""
    global _needed, _needed_seen
    roots = {t for t in (*_exiting[:1], *_joining, *_seen) if _spared(t)}
    found, todo = set(), list(roots)
    while todo:
        for other in tuple(_joining.get(todo.pop(), ())):
            if other not in found:
                found.add(other)
                todo.append(other)
    reached: dict = {}
    todo = list(roots)
    while todo:
        thread = todo.pop()
        for other, why in [*((u, None) for u in tuple(_joining.get(thread, ()))), *_seen.get(thread, ())]:
            whys = reached.setdefault(other, set())
            if why not in whys:
                if not whys:
                    todo.append(other)
                whys.add(why)
    _needed, _needed_seen = frozenset(found), {t: frozenset(whys) for t, whys in reached.items()}
    for thread in reached:
        woken = _held.get(thread)
        if woken is not None:
            woken.set()


_OWNER = re.compile(r"owner=(\d+)")


def _owner_of(lock):
    """The ident of the thread that owns ``lock`` (an ``RLock``) now, or None: any thread's, which
    its ``_is_owned()`` does not tell (it answers for the calling thread only)."""
    found = _OWNER.search(repr(lock))
    return (int(found.group(1)) or None) if found else None  # (owner=0: unlocked)


def _lock_holders(frame, holders: dict) -> list:
    """The threads (and why: the id of the object) that ``frame``, a thread's innermost, may wait
    for: a frame of ortrain's that refers to an object whose lock another thread owns, or to one that
    holds such an object in ``_session`` (a trainer), is at a ``with obj._lock`` or on its way to one."""
    code = frame.f_code
    if not holders or not code.co_filename.startswith(_HERE) or (code.co_filename == __file__ and
                                                                 code not in _WAIT_CODES):
        return []  # (not ortrain's, or this module's own look at the locks: the exit's, a held thread's)
    found = []
    try:
        for value in list(frame.f_locals.values()):
            for candidate in (value, getattr(value, "__dict__", {}).get("_session")):
                if id(candidate) in holders:
                    found.append((holders[id(candidate)], id(candidate)))
    except Exception:  # noqa: BLE001,S110 - (an object whose __dict__ misbehaves: none of ortrain's)
        pass
    return found


def _look() -> None:
    """Find in the stacks the waits the patched ``Thread.join`` does not see: joins begun before the
    exit, or through a ``join`` taken before it (``atexit.register(worker.join)``), and waits for an
    object's lock that another thread owns: a held thread (a chunked prediction), or one that waits in
    turn (for a lock a held thread owns, say)."""
    began = time.monotonic()
    threads = {t.ident: t for t in threading.enumerate() if t.ident is not None}  # (None: not started yet)
    holders, objects = {}, {}
    for owner in _listed(_locked):
        lock = owner.__dict__.get("_lock")
        if lock is not None and (ident := _owner_of(lock)) is not None and (thread := threads.get(ident)) is not None:
            holders[id(owner)] = thread
            objects[id(owner)] = weakref.ref(owner)
    seen: dict = {}
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        if thread is None:
            continue
        waits = [(holder, why) for holder, why in _lock_holders(frame, holders) if holder is not thread]
        while frame is not None:
            if frame.f_code is _JOIN_CODE and isinstance(other := frame.f_locals.get("self"), threading.Thread):
                waits.append((other, None))
            frame = frame.f_back
        if waits:
            seen[thread] = waits
    with _state:
        _seen.clear()
        _seen.update(seen)
        _seen_objects.clear()
        _seen_objects.update(objects)
        _seen_at[:] = [time.monotonic(), time.monotonic() - began]
        _update_needed()


def _goes_on(me: threading.Thread) -> bool:
    """Whether a spared thread waits for ``me`` (the calling thread): through a join, or for a lock
    ``me`` owns still (not one it owned when the stacks were looked at, and has let go since)."""
    if me in _needed:
        return True
    whys = _needed_seen.get(me)
    if not whys or time.monotonic() - _seen_at[0] >= _look_every():
        return False
    return None in whys or any(_mine(why) for why in whys)


def _mine(why: int) -> bool:
    """Whether the calling thread owns the lock of the object whose id is ``why`` (see _seen)."""
    ref = _seen_objects.get(why)
    owner = ref() if ref is not None else None
    lock = owner.__dict__.get("_lock") if owner is not None else None
    return lock is not None and lock._is_owned()


def _behind_held(thread: threading.Thread) -> bool:
    """Whether ``thread`` is held, or waits (as the last look saw) for a held thread, or for one
    that does. Call holding ``_state``."""
    found, todo = {thread}, [thread]
    while todo:
        now = todo.pop()
        if now in _held:
            return True
        for other, _ in _seen.get(now, ()):
            if other not in found:
                found.add(other)
                todo.append(other)
    return False


def _look_if_stale() -> None:
    if time.monotonic() - _seen_at[0] >= _look_every() and _looking.acquire(blocking=False):
        try:
            _look()
        finally:
            _looking.release()


def hold_if_left_at_exit() -> None:
    """Wait if the interpreter's exit has begun and does not spare this thread: a call into
    onnxruntime still running when the interpreter is torn down aborts the process as it returns,
    and the interpreter ends a waiting thread with the process. While a spared thread waits for this
    one (a later atexit handler that stops a worker and joins it, or waits for a lock this thread
    holds), or a thread that such a wait waits for waits for it in turn, the call goes on.
    HELD_AT_EXIT_S after its first hold (it may be waited for in another way), every call goes on."""
    me = threading.current_thread()
    if not _exiting or _spared(me) or me in _held or _goes_on(me):
        return  # (in _held: a hold of this thread's runs this one, a collection's free() during its wait)
    end = _held_until.setdefault(me, time.monotonic() + HELD_AT_EXIT_S)
    woken = threading.Event()
    with _state:
        _held[me] = woken
    try:
        while True:
            _look_if_stale()
            with _state:
                if _goes_on(me):
                    return
                if not _scanner or _scanner[0] not in _held:
                    _scanner[:] = [me]
                scanning = _scanner[0] is me
            left = end - time.monotonic()
            if left <= 0:
                with _state:
                    _SPARED.add(me)  # for good: whatever waits for it is not a join
                    _update_needed()
                return
            woken.wait(min(left, _look_every()) if scanning else left)
            woken.clear()
    finally:
        with _state:
            _held.pop(me, None)
            if _scanner and _scanner[0] is me:
                _scanner.clear()
                for other in list(_held.values()):  # another looks on
                    other.set()
                    break


def _at_exit(start, join):
    """``Thread.start`` and ``Thread.join`` during the exit: a thread that a spared thread starts is
    spared too, and a join is known at once to the threads it lets go on (see hold_if_left_at_exit)."""
    @functools.wraps(start)
    def started(self, *args, **kwargs):
        if _spared(threading.current_thread()):
            _SPARED.add(self)
        return start(self, *args, **kwargs)

    @functools.wraps(join)
    def joined(self, *args, **kwargs):
        me = threading.current_thread()
        with _state:
            _joining.setdefault(me, []).append(self)
            _update_needed()
        try:
            return join(self, *args, **kwargs)
        finally:
            with _state:  # (a signal handler's join may have begun and ended meanwhile, in this thread)
                waits = _joining.get(me, [])
                if self in waits:
                    waits.remove(self)
                if not waits:
                    _joining.pop(me, None)
                _update_needed()

    started._ortrain_exit = joined._ortrain_exit = True
    return started, joined


def _raw_at_exit(start_new_thread):
    """``_thread.start_new_thread`` during the exit: a thread that a spared thread starts is spared."""
    @functools.wraps(start_new_thread)
    def started(function, args, kwargs=None):
        if _spared(threading.current_thread()):
            def spared(*args, **kwargs):
                _SPARED.add(threading.current_thread())
                return function(*args, **kwargs)
            return start_new_thread(spared, args, kwargs or {})
        return start_new_thread(function, args, *([] if kwargs is None else [kwargs]))
    return started


def _quiet_at_exit() -> None:
    """At the interpreter's exit: have the next calls into a session of the threads the exit does not
    spare wait (see hold_if_left_at_exit), and wait (QUIET_AT_EXIT_S at most) for their calls in
    flight: a call that holds an object's lock until it ends, or its thread is held inside it (at the
    next run of a chunked prediction) or waits for a held thread (for a lock that one owns)."""
    me = threading.current_thread()
    _exiting[:] = [me]
    if not getattr(threading.Thread.start, "_ortrain_exit", False):
        threading.Thread.start, threading.Thread.join = _at_exit(threading.Thread.start, threading.Thread.join)
        _thread.start_new_thread = _raw_at_exit(_thread.start_new_thread)
    # (threads started with _thread.start_new_thread are known to threading only once they ask for
    # threading.current_thread(); the interpreter knows their stacks)
    LEFT_AT_EXIT.update(ident for ident in (*sys._current_frames(), *(t.ident for t in threading.enumerate()))
                        if ident is not None and ident != me.ident)
    if not LEFT_AT_EXIT:
        return
    deadline = time.monotonic() + QUIET_AT_EXIT_S
    for owner in _listed(_locked):
        lock = owner.__dict__.get("_lock")
        while lock is not None and time.monotonic() < deadline:
            if lock.acquire(timeout=0.01):
                lock.release()  # a call after this one sees LEFT_AT_EXIT (exclusive looks under the lock)
                break
            if (ident := _owner_of(lock)) is None:
                continue  # (released meanwhile)
            _look_if_stale()
            with _state:
                if any(_behind_held(thread) for thread in list(_held) + list(_seen) if thread.ident == ident):
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


def locked(owner) -> threading.RLock:
    """``owner._lock``, to take with ``with locked(owner): ...``, as :func:`exclusive` takes it: during
    the exit, a thread the exit holds waits before it takes the lock, not holding it (a thread that
    took it again and again, held while holding it, kept it from a thread the exit waited for)."""
    with owner._lock:
        left = bool(LEFT_AT_EXIT)  # (read under the lock, as exclusive reads it)
    if left:
        hold_if_left_at_exit()
    return owner._lock


_EXCLUSIVE_CODE = exclusive(lambda self: None).__code__  # (one code object for every method it wraps)
_WAIT_CODES = (_EXCLUSIVE_CODE, locked.__code__)  # this module's frames that wait for an object's lock
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # (ortrain's own code)
_JOIN_CODE = threading.Thread.join.__code__  # (taken before the exit patches Thread.join)


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
