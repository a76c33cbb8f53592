"""Subnormal floats flushed to zero while the runtime computes.

A weight whose gradient stops (a dead ReLU unit's) decays its Adam moments step by step into the
subnormal range (below 1.2e-38), where x86 and ARM cores compute many times slower: a
784-512-512-10 MLP at batch 32 went from 1.7 ms to 14 ms a step after about 1,000 steps, and a
fit on the bundled digits took 2.2 times as long. TensorFlow flushes subnormals to zero for the
same reason; onnxruntime does when asked (``session.set_denormal_as_zero``), on its own threads,
and on the thread that creates the first session of the process, for good.

That thread is the caller's, whose numpy and PyTorch should keep IEEE arithmetic. So the flag
is asked for (the runtime's threads take it), and the calling thread's floating-point
environment is put back after every session ortrain creates; it flushes only while one of
ortrain's runtime calls runs (:func:`on` / :func:`off`, below). Where the environment cannot be
reached (not Linux on x86-64 or ARM64), subnormals are computed as they are.

On x86-64 the switch is two machine-code functions of a few instructions each (below), called
through ctypes: an on and off pair costs 0.3 us against 0.8 us for libm's ``fegetenv`` and
``fesetenv``, which also store and load the x87 environment; within a small captured step (16 us)
the difference measured 0.9 us. They are written once into a page of their own, which is then made
read-only and executable. Where the system refuses executable memory, libm's functions are used.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
import platform
import sys
import threading

CONFIG = ("session.set_denormal_as_zero", "1")

# Where the flush bits sit in glibc's fenv_t: MXCSR's flush-to-zero and denormals-are-zero
# (x86-64, the last 4 of its 32 bytes), FPCR's FZ (ARM64, the first 4 of 8).
_LAYOUTS = {"x86_64": (32, 28, 0x8040), "amd64": (32, 28, 0x8040),
            "aarch64": (8, 0, 1 << 24), "arm64": (8, 0, 1 << 24)}


def _libm():
    if not sys.platform.startswith("linux"):
        return None
    layout = _LAYOUTS.get(platform.machine().lower())
    if layout is None:
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        get, set_ = lib.fegetenv, lib.fesetenv
    except (OSError, AttributeError):
        return None
    get.restype = set_.restype = None  # called with byref() of ctypes buffers only (the quickest call)
    return get, set_, layout


_found = _libm()
if _found is not None:
    _get, _set, (_SIZE, _OFFSET, _BITS) = _found
    _SIZE = max(_SIZE, 64)  # room to spare: a libc with a larger fenv_t still writes into it
else:
    _get = _set = None


# on(uint32_t state[2]) and off(uint32_t state[2]), state = {open on() calls, the caller's MXCSR};
# only the outermost pair switches, as in the libm version below (GNU as, Intel syntax):
#   on:     mov eax, [rdi]        ; the open calls before this one
#           add dword ptr [rdi], 1
#           test eax, eax
#           jne 1f
#           stmxcsr [rdi+4]       ; the caller's MXCSR, kept in state[1]
#           mov eax, [rdi+4]
#           or eax, 0x8040        ; flush-to-zero and denormals-are-zero
#           mov [rsp-4], eax      ; (the red zone: a leaf function may use it)
#           ldmxcsr [rsp-4]
#     1:    ret
#   off:    mov eax, [rdi]
#           test eax, eax         ; no on() open: nothing
#           je 2f
#           sub eax, 1
#           mov [rdi], eax
#           jne 2f
#           ldmxcsr [rdi+4]       ; the outermost: the caller's MXCSR back, its flags as they were
#     2:    ret
_X86_64_SWITCH = bytes.fromhex("8b07830701 85c0 7515 0fae5f04 8b4704 0d40800000 894424fc 0fae5424fc c3"
                               "8b07 85c0 740b 83e801 8907 7504 0fae5704 c3".replace(" ", ""))
_X86_64_OFF_AT = 0x1F


def _native_switch():
    """The two functions above, or None where they cannot run here."""
    if not sys.platform.startswith("linux") or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        protect = libc.mprotect
        protect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        protect.restype = ctypes.c_int
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        page.write(_X86_64_SWITCH)
        start = ctypes.addressof(ctypes.c_char.from_buffer(page))
        if protect(start, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:  # executable memory refused
            return None
    except (OSError, AttributeError, ValueError, TypeError):
        return None
    # no argtypes: the state goes as a byref() (the quickest call), the result is not read
    function = ctypes.CFUNCTYPE(None)
    return page, function(start), function(start + _X86_64_OFF_AT)


@contextlib.contextmanager
def kept():
    """Put the calling thread's floating-point environment back after the block: around the
    creation of sessions asking for the flush, which the runtime sets on the creating thread."""
    if _get is None:
        yield
        return
    env = ctypes.create_string_buffer(_SIZE)
    _get(env)
    try:
        yield
    finally:
        _set(env)


_local = threading.local()


def _thread_state() -> list:
    """The thread's own: how many :func:`on` calls are open, the environment to put back and the
    flushing one (as ``byref``s: the rest of the environment as at the thread's first call, only
    its flush word is written after), views of the two flush words, and the buffers themselves."""
    saved, flushed = ctypes.create_string_buffer(_SIZE), ctypes.create_string_buffer(_SIZE)
    _get(saved)
    ctypes.memmove(flushed, saved, _SIZE)
    state = _local.state = [0, ctypes.byref(saved), ctypes.byref(flushed),
                            ctypes.c_uint32.from_buffer(saved, _OFFSET), ctypes.c_uint32.from_buffer(flushed, _OFFSET),
                            saved, flushed]
    return state


def _native_here():
    """The calling thread's state for the native switch: a ``byref`` of its two counters."""
    try:
        return _local.switch
    except AttributeError:
        counts = _local.counts = (ctypes.c_uint32 * 2)()
        state = _local.switch = ctypes.byref(counts)
        return state


def _libm_here():
    """The calling thread's state for libm's switch (None where there is none)."""
    try:
        return _local.state
    except AttributeError:
        return None if _get is None else _thread_state()


def _libm_on(state) -> None:
    if state is None:
        return
    state[0] += 1
    if state[0] == 1:
        _get(state[1])
        state[4].value = state[3].value | _BITS
        _set(state[2])


def _libm_off(state) -> None:
    if state is None or state[0] <= 0:  # an on() interrupted before it counted
        return
    state[0] -= 1
    if state[0] == 0:
        _set(state[1])


# The switch, used as
#
#     flush = denormals.here()   # before the try: nothing is switched yet
#     try:
#         denormals.on(flush)    # subnormals flushed on this thread (calls nest: the outermost switches)
#         ...                    # the runtime's calls
#     finally:
#         denormals.off(flush)   # the caller's environment back after the outermost
#
# On the native path on() and off() are the machine-code functions themselves: Python raises an
# interrupt (Ctrl-C) only at its checks, which come at a function's start and after a call, never
# between the finally's start and a call into C. So off() always runs, and an interrupt anywhere in
# the block still puts the environment back. (libm's off() is a Python function: an interrupt landing
# at its very start leaves the thread flushing.)
_switch = _native_switch() if _get is not None else None  # the page stays mapped while the process runs
if _switch is not None:
    here, on, off = _native_here, _switch[1], _switch[2]
else:
    here, on, off = _libm_here, _libm_on, _libm_off


def open_calls() -> int:
    """How many :func:`on` calls are open on the calling thread."""
    if here is _native_here:
        counts = getattr(_local, "counts", None)
        return 0 if counts is None else counts[0]
    state = getattr(_local, "state", None)
    return 0 if state is None else state[0]


def flushing(fn):
    """``fn`` run with subnormals flushed: a call into the runtime."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        flush = here()
        try:
            on(flush)
            return fn(*args, **kwargs)
        finally:
            off(flush)
    return call


def available() -> bool:
    """Whether the calling thread's flush can be switched here."""
    return _get is not None
