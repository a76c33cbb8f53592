"""Subnormal floats: flushed to zero while ortrain's sessions compute (a step slowed several
times once Adam's moments of dead units decayed into them), never in the caller's own arithmetic."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import NumpyAdam

import ortrain as ot
from ortrain.engine import denormals

SUBNORMAL = np.float32(1e-39)
needs_flush = pytest.mark.skipif(not denormals.available(), reason="the floating-point environment is not "
                                                                   "reachable on this platform")


def _keeps_subnormals() -> bool:
    return float((np.array([SUBNORMAL]) * np.float32(1.0))[0]) != 0.0


def _mlp(moment=None, lr=1e-3):
    model = ot.Sequential([ot.layers.Dense(256, activation="relu"), ot.layers.Dense(256, activation="relu"),
                           ot.layers.Dense(10)], input_shape=(128,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=lr), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    if moment is not None:  # as Adam's moments of a unit whose gradient stopped long ago
        state = model.optimizer.state()
        state["step"] = 10
        state["moments"] = {n: {"m": np.full(w.shape, moment, np.float32), "v": np.full(w.shape, moment, np.float32)}
                            for n, w in zip(model.weight_names(), model.get_weights())}
        model.optimizer.load_state(state)
    return model


@needs_flush
def test_the_callers_arithmetic_keeps_subnormals_and_ortrains_flushes_them():
    # the runtime, asked to flush, sets the flag for good on the thread that creates the first session
    x = np.full((4, 1), 1e-20, np.float32)
    model = ot.Sequential([ot.layers.Dense(1, use_bias=False)], input_shape=(1,))
    model.set_weights([np.full((1, 1), 1e-20, np.float32)])
    assert model.predict(x).tolist() == [[0.0]] * 4  # 1e-40 is subnormal: flushed in the runtime
    assert _keeps_subnormals()
    model.compile(optimizer="adam", loss="mse")
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, np.zeros((4, 1)))
        tr.eval(x, np.zeros((4, 1)))
    from ortrain import ag
    W = ag.param(np.ones((1, 1), np.float32), name="W")
    ot.capture_step(lambda a: ag.mse_loss(W @ a, a), optimizer=ot.optim.Adam([W]))(a=np.ones((1, 2), np.float32))
    assert _keeps_subnormals()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_keeps_subnormals()))
    thread.start()
    thread.join()
    assert seen == [True]


@needs_flush
def test_a_flush_the_caller_set_stays_set():
    torch = torch_or_skip()
    if not torch.set_flush_denormal(True):
        pytest.skip("torch cannot set the flush on this machine")
    try:
        assert not _keeps_subnormals()
        _mlp().predict(np.ones((2, 128), np.float32))
        assert not _keeps_subnormals()
    finally:
        torch.set_flush_denormal(False)
    assert _keeps_subnormals()


@needs_flush
def test_subnormal_adam_moments_do_not_slow_a_step():
    # A 784-512-512-10 MLP at batch 32 went from 1.7 ms to 14 ms a step after about 1,000 steps;
    # here the moments start subnormal. Steps of the two trainers alternate; medians compared.
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 128)).astype(np.float32), rng.integers(0, 10, 32)
    normal, subnormal = (ot.Trainer(_mlp(m, lr=0.0), batch_size=32) for m in (1e-3, 1e-39))
    with normal, subnormal:
        times = {id(normal): [], id(subnormal): []}
        for _ in range(40):
            for tr in (normal, subnormal):
                start = time.perf_counter()
                tr.step(x, y)
                times[id(tr)].append(time.perf_counter() - start)
    ratio = np.median(times[id(subnormal)]) / np.median(times[id(normal)])
    assert ratio < 1.6, f"a step with subnormal moments took {ratio:.2f} times as long"


def test_a_gradient_norm_of_underflowing_squares_is_summed_in_float64():
    # gradients near 1e-20: their float32 squares (1e-40) flush to 0, and grad_norm read 0
    from ortrain import ag
    W = ag.param(np.zeros((1, 4), np.float32), name="W")
    x = np.full((4, 1), 1e-20, np.float32)
    step = ot.capture_step(lambda x: ag.sum(W @ x), optimizer=ot.optim.Adam([W]), max_grad_norm=1.0)
    norm = float(step(x=x)["grad_norm"])
    assert norm == pytest.approx(2e-20, rel=1e-6, abs=0)  # the gradient is x: sqrt(4 * 1e-40)


def _libm_switch(monkeypatch):
    monkeypatch.setattr(denormals, "here", denormals._libm_here)
    monkeypatch.setattr(denormals, "on", denormals._libm_on)
    monkeypatch.setattr(denormals, "off", denormals._libm_off)


needs_native = pytest.mark.skipif(denormals._switch is None, reason="the flush is switched by libm here")
SWITCHES = [pytest.param("native", marks=needs_native), "libm"]


@needs_flush
@pytest.mark.parametrize("switch", SWITCHES)
def test_an_interrupt_right_after_the_flush_is_set_still_puts_the_callers_environment_back(monkeypatch, switch):
    # the switch ran outside the try: a Ctrl-C landing just after it set the flush left the caller's
    # thread flushing for good (and every later call "restored" that)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    x = np.ones((2, 3), np.float32)
    want = model.predict(x)
    if switch == "libm":
        _libm_switch(monkeypatch)
    real = denormals.on
    calls = []

    def interrupted(state):
        real(state)
        calls.append(1)
        if len(calls) == 1:  # the flush is set: Python's signal check raises here
            raise KeyboardInterrupt

    monkeypatch.setattr(denormals, "on", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.predict(x)
    assert calls and _keeps_subnormals() and denormals.open_calls() == 0
    monkeypatch.setattr(denormals, "on", real)
    np.testing.assert_array_equal(model.predict(x), want)
    assert _keeps_subnormals() and denormals.open_calls() == 0


@needs_native
def test_an_interrupt_pending_as_a_captured_step_ends_is_raised_after_the_environment_is_back(monkeypatch):
    # Python raises a pending interrupt at its next check; the switch back was a Python function,
    # whose first instruction is one: a Ctrl-C arriving just before it left the thread flushing for
    # good. The signal here arrives during straight-line code (one long string repeat) just before
    # the step's last lines, so the next check is the first after the step's try block.
    import signal

    from ortrain import ag
    w0 = np.array([[0.5, -1.0, 2.0]], np.float32)
    x = np.array([[1.0], [2.0], [-1.0]], np.float32)
    W = ag.param(w0, name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x: ag.sum(ag.matmul(W, x)), optimizer=opt)
    step(x=x)
    real = step._session._update

    def update_then_signal():
        real()
        signal.setitimer(signal.ITIMER_REAL, 0.002)
        filler = "a" * 200_000_000  # no check inside: the signal stays pending
        del filler

    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)  # a SIGALRM raises as Ctrl-C does
    try:
        monkeypatch.setattr(step._session, "_update", update_then_signal)
        with pytest.raises(KeyboardInterrupt):
            step(x=x)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    monkeypatch.undo()
    assert _keeps_subnormals() and denormals.open_calls() == 0
    ref = NumpyAdam([w0], lr=0.1)
    for _ in range(2):  # the interrupted update ran and counts
        ref.step([x.T])
    assert opt.step == 2
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-6, atol=1e-7)
    step(x=x)
    assert _keeps_subnormals() and denormals.open_calls() == 0
    step.free()


def _libm():
    import ctypes
    import ctypes.util
    return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")


@needs_flush
@pytest.mark.parametrize("switch", SWITCHES)
def test_the_switch_nests_and_puts_back_the_callers_rounding_and_flags(monkeypatch, switch):
    if switch == "libm":
        _libm_switch(monkeypatch)
    libm = _libm()
    upward = {"x86_64": 0x800, "amd64": 0x800, "aarch64": 0x400000, "arm64": 0x400000}.get(
        __import__("platform").machine().lower())
    if upward is None:
        pytest.skip("rounding modes unknown on this machine")
    inexact = {0x800: 0x20, 0x400000: 0x10}[upward]
    third = np.float32(1) / np.float32(3)
    down = np.nextafter(third, np.float32(0))
    libm.feclearexcept(inexact)
    assert libm.fesetround(upward) == 0
    try:
        third_up = np.float32(1) / np.float32(3)  # the caller's own rounding: upward
        assert third_up > down
        raised_before = libm.fetestexcept(inexact)
        flush = denormals.here()
        denormals.off(flush)  # an off() with no on() open changes nothing
        assert libm.fegetround() == upward and _keeps_subnormals()
        denormals.on(flush)
        assert not _keeps_subnormals() and denormals.open_calls() == 1
        denormals.on(flush)  # nested: the inner pair switches nothing
        denormals.off(flush)
        assert not _keeps_subnormals() and denormals.open_calls() == 1
        libm.feclearexcept(inexact)
        denormals.off(flush)
        assert _keeps_subnormals() and denormals.open_calls() == 0
        assert libm.fegetround() == upward
        assert libm.fetestexcept(inexact) == raised_before  # the caller's flags as they were at on()
    finally:
        libm.fesetround(0)
    seen, go = [], threading.Event()

    def other_thread():  # each thread keeps its own count and its own environment
        go.wait()
        mine = denormals.here()
        denormals.on(mine)
        seen.append((denormals.open_calls(), _keeps_subnormals()))
        denormals.off(mine)
        seen.append((denormals.open_calls(), _keeps_subnormals()))

    thread = threading.Thread(target=other_thread)  # started before the flush: Linux copies it to new threads
    thread.start()
    flush = denormals.here()
    denormals.on(flush)
    try:
        go.set()
        thread.join()
        assert not _keeps_subnormals() and denormals.open_calls() == 1
    finally:
        denormals.off(flush)
    assert seen == [(1, False), (0, True)] and _keeps_subnormals()


@needs_native
def test_the_native_switch_is_the_one_in_use_where_it_loads():
    # the switch back is a C call: no Python frame whose start could raise an interrupt before it
    assert denormals.here is denormals._native_here
    assert denormals.on is denormals._switch[1] and denormals.off is denormals._switch[2]
