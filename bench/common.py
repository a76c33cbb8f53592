"""Shared pieces of the benchmarks: interleaved timing, spreads, the numpy sgemm ceiling,
and the hand-written onnxruntime-training loop that is the floor of what ortrain adds."""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable

import numpy as np

def have_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def spread(values: list[float]) -> dict:
    """Median and the 10th-90th percentile band."""
    q = statistics.quantiles(values, n=10) if len(values) >= 2 else [values[0]] * 9
    return {"median": statistics.median(values), "p10": q[0], "p90": q[-1], "n": len(values)}


def time_calls(step: Callable[[], object], calls: int) -> float:
    """Seconds per call over ``calls`` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - t0) / calls


def interleave(steps: dict[str, Callable[[], object]], rounds: int, warmup: int, calls: int) -> dict[str, list]:
    """Per-call seconds of each step, measured in alternating order round after round.

    Every round times ``calls`` calls of every implementation; the order reverses each
    round, so a slow moment on a shared machine lands on all of them alike. Warm-up
    rounds are discarded.
    """
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        got = {n: time_calls(steps[n], calls) for n in order}
        if r >= warmup:
            for n in names:
                times[n].append(got[n])
    return times


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict:
    """Spread of the per-round ratios (rounds are paired: measured back to back)."""
    return spread([a / b for a, b in zip(numerator, denominator)])


def sgemm_rate(shapes: list[tuple[int, int, int]] | None = None, seconds: float = 1.0) -> float:
    """numpy's float32 GEMM rate in FLOP/s: square 1024 products, or the given (m, k, n) products."""
    rng = np.random.default_rng(0)
    shapes = shapes or [(1024, 1024, 1024)]
    mats = [(rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)) for m, k, n in shapes]
    flops = sum(2.0 * m * k * n for m, k, n in shapes)

    def run():
        for a, b in mats:
            a @ b
    for _ in range(3):
        run()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return flops / best


def dense_training_gemms(sizes: list[int], batch: int) -> list[tuple[int, int, int]]:
    """The GEMMs of one training step of an MLP: forward, weight gradients, and input gradients
    of every layer but the first (nothing needs the gradient of the data)."""
    shapes = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        shapes.append((batch, a, b))          # y = x W
        shapes.append((a, batch, b))          # dW = x^T dy
        if i > 0:
            shapes.append((batch, b, a))      # dx = dy W^T
    return shapes


def ort_loop(art, feeds: list[np.ndarray], lr: float, threads: int | None = None):
    """A hand-written loop over ortrain's artifacts with onnxruntime-training's public Python API
    (``Module``, ``Optimizer``, ``CheckpointState``), loaded the way ortrain's engine loads it
    (without the package ``__init__`` that imports torch)."""
    import ortrain  # noqa: F401 - registers onnxruntime.training without running its __init__
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    from ortrain.engine.device import session_options
    state = CheckpointState.load_checkpoint(str(art.checkpoint))
    module = Module(str(art.training), state, str(art.eval), session_options=session_options(threads))
    optimizer = Optimizer(str(art.optimizer_graph), module)
    optimizer.set_learning_rate(lr)

    def step():
        outputs = module(*feeds)
        optimizer.step()
        module.lazy_reset_grad()
        return float(outputs[1])
    return step


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
