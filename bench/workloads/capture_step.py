"""What a captured training step costs per call, against its two natural peers.

One 16x32 weight ``W`` on a 32x64 batch (``mean((W @ x - y) ** 2)``, Adam, lr 1e-3):

* ``ortrain``: ``ot.capture_step`` called with the batch;
* ``ort_loop``: a hand-written loop over the very same graphs and initial checkpoint with
  onnxruntime-training's public Python API (``Module(x, y)``, ``Optimizer.step()``,
  ``Module.lazy_reset_grad()``), with the same session options (threads);
* ``torch``: a plain PyTorch eager loop (zero_grad, forward, backward, step), skipped with a
  note when torch is not installed.

All three run on one intra-op thread: at this size a second thread only adds
synchronisation, and the spinning thread pools of two runtimes in one process slow each
other down by an order of magnitude, which would measure the interference, not the loops.

Each round times a block of calls of every implementation, in an order that alternates
between rounds (so drift on a shared machine hits all alike), after warm-up rounds. Per
implementation: the median microseconds per call and the 10th-90th percentile over rounds.
The ratios are medians of the per-round ratios. Goals: ortrain within 15% of ``ort_loop``,
and at least 8x faster than ``torch``.
"""

from __future__ import annotations

import json

import numpy as np

import ortrain as ot
from bench.common import have_torch, interleave, paired_ratio, spread
from ortrain import ag, artifacts, engine
from ortrain.engine.device import session_options

OUT, IN, BATCH = 16, 32, 64
LR = 1e-3
THREADS = 1


def _data(seed=0):
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal((OUT, IN)) * 0.1).astype(np.float32)
    x = rng.standard_normal((IN, BATCH)).astype(np.float32)
    y = rng.standard_normal((OUT, BATCH)).astype(np.float32)
    return w0, x, y


def _ortrain(w0, x, y):
    W = ag.param(w0, name="W")
    train = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=ot.optim.Adam([W], lr=LR))
    train(x=x, y=y)  # traces and builds the graphs
    return train, (lambda: train(x=x, y=y))


def _ort_loop(train, w0, x, y, directory):
    """The same graphs through onnxruntime-training's own API (loaded as ortrain.engine loads it,
    without the package __init__ that imports torch)."""
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    names = ("training.onnx", "eval.onnx", "optimizer.onnx")
    for name, data in zip(names, train._models, strict=True):  # the exact bytes the capture runs
        (directory / name).write_bytes(data)
    engine.write_initial_checkpoint(directory / "checkpoint", {"W": w0}, {})
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(str(directory / names[0]), state, str(directory / names[1]),
                    session_options=session_options())
    optimizer = Optimizer(str(directory / names[2]), module)
    optimizer.set_learning_rate(LR)

    def step():
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        return loss
    return step


def _torch(w0, x, y):
    import torch
    torch.set_num_threads(THREADS)
    W = torch.tensor(w0, requires_grad=True)
    opt = torch.optim.Adam([W], lr=LR)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        loss = torch.mean((W @ xt - yt) ** 2)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def run(quick: bool = False) -> dict:
    """Per-call microseconds of the three loops and their ratios; ``quick`` takes fewer rounds."""
    rounds, warmup, calls = (8, 2, 300) if quick else (40, 4, 1000)
    previous = ot.get_num_threads()
    ot.set_num_threads(THREADS)
    try:
        return _measure(quick, rounds, warmup, calls)
    finally:
        ot.set_num_threads(previous)


def _measure(quick: bool, rounds: int, warmup: int, calls: int) -> dict:
    w0, x, y = _data()
    train, ours = _ortrain(w0, x, y)
    notes = []
    with artifacts.scratch_dir() as d:
        steps = {"ortrain": ours, "ort_loop": _ort_loop(train, w0, x, y, d)}
        if have_torch():
            steps["torch"] = _torch(w0, x, y)
        else:
            notes.append("torch is not installed: the PyTorch eager loop was skipped (pip install torch)")
        times = {n: [1e6 * t for t in v] for n, v in interleave(steps, rounds, warmup, calls).items()}
    train.free()
    ratios = {"ortrain_over_ort_loop": paired_ratio(times["ortrain"], times["ort_loop"])}
    if "torch" in times:
        ratios["torch_over_ortrain"] = paired_ratio(times["torch"], times["ortrain"])
    overhead = ratios["ortrain_over_ort_loop"]["median"] - 1.0
    speedup = ratios.get("torch_over_ortrain", {}).get("median")
    return {
        "workload": "capture_step", "quick": quick, "shape": {"W": [OUT, IN], "x": [IN, BATCH]},
        "threads": THREADS, "rounds": rounds, "calls_per_round": calls,
        "ratios": ratios,
        "targets": {"max_overhead_vs_ort_loop": 0.15, "min_speedup_vs_torch": 8.0},
        "overhead_vs_ort_loop": overhead, "speedup_vs_torch": speedup,
        "meets_targets": overhead <= 0.15 and (speedup is None or speedup >= 8.0),
        "us_per_call": {n: spread(v) for n, v in times.items()},
        "notes": notes,
    }


def _print(report: dict) -> None:
    r = report["ratios"]
    o = r["ortrain_over_ort_loop"]
    print(f"captured step vs hand-written onnxruntime-training loop: x{o['median']:.3f} "
          f"(p10..p90 x{o['p10']:.3f}..x{o['p90']:.3f}); goal <= x1.15")
    if "torch_over_ortrain" in r:
        t = r["torch_over_ortrain"]
        print(f"PyTorch eager / captured step: x{t['median']:.1f} (p10..p90 x{t['p10']:.1f}..x{t['p90']:.1f}); "
              "goal >= x8")
    for n, s in report["us_per_call"].items():
        print(f"  {n:9s} {s['median']:8.1f} us/call (p10..p90 {s['p10']:.1f}..{s['p90']:.1f})")
    for note in report["notes"]:
        print(f"  note: {note}")


if __name__ == "__main__":
    import sys
    out = run(quick="--quick" in sys.argv)
    _print(out)
    print(json.dumps(out, indent=1))
