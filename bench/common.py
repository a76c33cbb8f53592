"""Shared pieces of the benchmarks: interleaved timing in isolated worker processes, spreads,
numpy's sgemm rate (the machine's ceiling) and the hand-written onnxruntime-training loop
(the floor of what ortrain adds).

Two runtimes in one process slow each other down: onnxruntime's intra-op threads spin
between operators while PyTorch's OpenMP threads want the same cores (measured here:
PyTorch eager 40% slower beside a live onnxruntime session). So each implementation runs
in a worker process of its own, set up once; the runner times rounds of calls in every
worker in turn, reversing the order each round, so a slow moment on a shared machine lands
on all of them alike. Warm-up rounds are discarded.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
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


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict:
    """Spread of the per-round ratios (the two were timed back to back in each round)."""
    return spread([a / b for a, b in zip(numerator, denominator)])


def time_calls(step: Callable[[], object], calls: int) -> float:
    """Seconds per call over ``calls`` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - t0) / calls


def rounds_of(measure: Callable[[str], float], names: list[str], rounds: int, warmup: int,
              settle: float = 0.0) -> dict[str, list]:
    """``measure(name)`` for every name, round after round, in alternating order.

    ``settle`` seconds pass before each measurement: the previous implementation's worker
    threads keep spinning for a while after its last call (OpenMP's default block time is
    200 ms) and would otherwise take a core from the next one.
    """
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        got = {}
        for n in order:
            if settle:
                time.sleep(settle)
            got[n] = measure(n)
        if r >= warmup:
            for n in names:
                times[n].append(got[n])
    return times


def interleave(steps: dict[str, Callable[[], object]], rounds: int, warmup: int, calls: int) -> dict[str, list]:
    """Per-call seconds of in-process steps (same library only; see the module docstring)."""
    return rounds_of(lambda n: time_calls(steps[n], calls), list(steps), rounds, warmup)


def interleave_workers(workers: dict[str, Worker], rounds: int, warmup: int, calls: int,
                       settle: float = 0.3) -> dict[str, list]:
    """Per-call seconds of steps held by worker processes."""
    return rounds_of(lambda n: workers[n].time(calls), list(workers), rounds, warmup, settle)


def sgemm_rate(shapes: list[tuple[int, int, int]] | None = None, seconds: float = 1.0) -> float:
    """numpy's float32 GEMM rate in FLOP/s, best of repeated runs: square 1024 products, or the
    given (m, k, n) products."""
    rng = np.random.default_rng(0)
    shapes = shapes or [(1024, 1024, 1024)]
    mats = [(rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)) for m, k, n in shapes]
    flops = sum(2.0 * m * k * n for m, k, n in shapes)

    def run():
        for a, b in mats:
            a @ b
    return flops / best_time(run, seconds)


def best_time(run: Callable[[], object], seconds: float) -> float:
    """The least seconds ``run()`` took over ``seconds`` of repeats, after three warm-up calls."""
    for _ in range(3):
        run()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def memory_bandwidth(floats: int, threads: int = 1, seconds: float = 0.5) -> float:
    """Bytes per second that numpy streams through arrays of ``floats`` float32 elements (two
    read, one written: ``c = a + b``), split over ``threads`` threads, best of repeated runs.

    It stands for the rate an elementwise update such as Adam's could reach, which does next to
    no arithmetic per byte. It is numpy's rate, not the machine's: onnxruntime's own Adam kernel
    streams faster on one core (see bench/README.md).
    """
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(0)
    a, b = rng.random(floats, dtype=np.float32), rng.random(floats, dtype=np.float32)
    c = np.empty_like(a)
    bounds = np.linspace(0, floats, threads + 1).astype(int)
    parts = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    with ThreadPoolExecutor(threads) as pool:
        def run():
            list(pool.map(lambda s: np.add(a[s], b[s], out=c[s]), parts))
        return 3 * 4 * floats / best_time(run, seconds)


def dense_training_gemms(sizes: list[int], batch: int) -> list[tuple[int, int, int]]:
    """The GEMMs of one MLP training step: forward, weight gradients, and input gradients of every
    layer but the first (nothing needs the gradient of the data)."""
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
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    import ortrain  # noqa: F401 - registers onnxruntime.training without running its __init__
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
    """This process's peak resident memory. ``VmHWM`` rather than ``ru_maxrss``: a spawned worker
    inherits its parent's ``ru_maxrss`` across fork and exec, ``VmHWM`` starts afresh with the new
    program."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _serve(conn, factory: str, kwargs: dict) -> None:
    try:
        module, name = factory.split(":")
        step = getattr(importlib.import_module(module), name)(**kwargs)
        conn.send(("ready", peak_rss_mb()))
        while True:
            command, arg = conn.recv()
            if command == "time":
                conn.send(("ok", time_calls(step, arg)))
            elif command == "rss":
                conn.send(("ok", peak_rss_mb()))
            else:
                break
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which raises it
        import traceback
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Worker:
    """A process that builds one implementation's step with ``factory(**kwargs)`` and times it
    on request. ``factory`` is ``"module:function"``."""

    def __init__(self, factory: str, **kwargs):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, factory, kwargs), daemon=True)
        self._proc.start()
        child.close()  # the child's end lives in the child alone: a worker that dies ends the pipe
        self.setup_rss_mb = self._reply()

    def _reply(self):
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._proc.join(timeout=10)
            raise RuntimeError(f"benchmark worker died (exit code {self._proc.exitcode})") from None
        if status == "error":
            raise RuntimeError(f"benchmark worker failed:\n{value}")
        return value

    def time(self, calls: int) -> float:
        self._conn.send(("time", calls))
        return self._reply()

    def peak_rss_mb(self) -> float:
        self._conn.send(("rss", None))
        return self._reply()

    def close(self) -> None:
        try:
            self._conn.send(("stop", None))
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def time_together(workers: list[Worker], calls: int) -> list[float]:
    """Per-call seconds of the workers' steps run at the same time, each in its own process."""
    for w in workers:
        w._conn.send(("time", calls))
    return [w._reply() for w in workers]


def compare_workers(module: str, names: list[str], rounds: int, warmup: int, calls: int,
                    **kwargs) -> tuple[dict[str, list], dict[str, float]]:
    """Time ``module``'s ``make_<name>(**kwargs)`` steps in worker processes, interleaved; returns
    the per-call seconds of every round and each worker's peak resident memory (MB)."""
    workers = {n: Worker(f"{module}:make_{n}", **kwargs) for n in names}
    try:
        times = interleave_workers(workers, rounds, warmup, calls)
        rss = {n: w.peak_rss_mb() for n, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    return times, rss


def implementations() -> list[str]:
    """ortrain, the raw loop, and PyTorch when it is installed."""
    return ["ortrain", "ort_loop"] + (["torch"] if have_torch() else [])


def loop_ratios(times: dict[str, list]) -> dict:
    """ortrain's time over the raw loop's, and PyTorch's time over ortrain's, per round."""
    ratios = {"ortrain_time_over_ort_loop": paired_ratio(times["ortrain"], times["ort_loop"])}
    if "torch" in times:
        ratios["speedup_vs_torch"] = paired_ratio(times["torch"], times["ortrain"])
    return ratios
