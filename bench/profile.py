"""Where a training step's time goes: ortrain's Python, the two runtime calls, and the graph nodes.

    python -m bench.profile            # the MLP of (c) and the seed-size model of (b)

For each model: the per-step time of ``Trainer.step`` split into the training-graph run, the
optimizer-graph run and everything else (ortrain's input checks and bookkeeping, measured as
the remainder); then onnxruntime's own per-node profile of the training and optimizer graphs
(``SessionOptions.enable_profiling``), median over steps after warm-up, top nodes first.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time

import numpy as np

import ortrain as ot
from ortrain.engine import _runtime
from ortrain.engine.device import parse_device, session_options

MODELS = {
    "mlp": ("bench.workloads.mlp", "MLP 784-512-512-10, batch 128"),
    "seed": ("bench.workloads.trainer_step", "4-8-2 classifier, batch 16"),
    "cnn": ("bench.workloads.cnn", "CNN 28x28, batch 64"),
}


def _split(tr, x, y, steps: int) -> dict:
    """Median per-step seconds of the whole step and of its two runtime calls."""
    session = tr._session
    module, optimizer = session._module, session._optimizer
    inner = {"train_step": [], "optimizer_step": []}
    real_train, real_opt = module.train_step, optimizer.optimizer_step

    class Timed:
        def train_step(self, feeds, fetches):
            t0 = time.perf_counter()
            real_train(feeds, fetches)
            inner["train_step"].append(time.perf_counter() - t0)

        def optimizer_step(self):
            t0 = time.perf_counter()
            real_opt()
            inner["optimizer_step"].append(time.perf_counter() - t0)

        def __getattr__(self, name):
            return getattr(module, name) if hasattr(module, name) else getattr(optimizer, name)

    timed = Timed()
    session._module = session._optimizer = timed
    whole = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            tr.step(x, y)
            whole.append(time.perf_counter() - t0)
    finally:
        session._module, session._optimizer = module, optimizer
    med = {k: statistics.median(v) for k, v in inner.items()}
    total = statistics.median(whole)
    return {"step": total, **med, "python": total - med["train_step"] - med["optimizer_step"]}


def _node_profile(art, feeds, steps: int) -> list[tuple[str, float]]:
    """onnxruntime's per-node kernel times (median seconds per step), largest first."""
    with tempfile.TemporaryDirectory() as tmp:
        so = session_options()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        state = _runtime.C.load_checkpoint(str(art.checkpoint))
        dev = parse_device("cpu").ort_device()
        module = _runtime.C.Module(str(art.training), state, str(art.eval), dev, so)
        optimizer = _runtime.C.Optimizer(str(art.optimizer_graph), state, dev, so)
        optimizer.set_learning_rate(1e-3)
        for _ in range(steps):
            module.train_step(feeds, _runtime.C.OrtValueVector())
            optimizer.optimizer_step()
            module.lazy_reset_grad()
        del module, optimizer, state  # the profile is written when the sessions close
        times: dict[str, list[float]] = {}
        decoder = json.JSONDecoder()
        for path in glob.glob(os.path.join(tmp, "profile*.json")):
            with open(path) as f:
                text = f.read()
            # Several sessions append their event arrays to one file; read every event object.
            start = text.find('{"cat"')
            while start != -1:
                event, end = decoder.raw_decode(text, start)
                if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                    key = f"{event['args'].get('op_name')} {event['name'][:-len('_kernel_time')]}"
                    times.setdefault(key, []).append(event["dur"] * 1e-6)
                start = text.find('{"cat"', end)
    warm = steps // 4
    return sorted(((k, statistics.median(v[warm:])) for k, v in times.items()), key=lambda kv: -kv[1])


def profile(name: str, steps: int = 60, top: int = 12) -> str:
    import importlib
    module = importlib.import_module(MODELS[name][0])
    model = module.build_model()
    x, y = module.data()
    lines = [f"## {MODELS[name][1]}"]
    with ot.Trainer(model, batch_size=len(y)) as tr:
        for _ in range(10):
            tr.step(x, y)
        s = _split(tr, x, y, steps)
        art = tr._art
    lines.append(f"Trainer.step {1e6 * s['step']:.1f} us = training graph {1e6 * s['train_step']:.1f} us "
                 f"({100 * s['train_step'] / s['step']:.0f}%) + optimizer graph {1e6 * s['optimizer_step']:.1f} us "
                 f"({100 * s['optimizer_step'] / s['step']:.0f}%) + ortrain Python {1e6 * s['python']:.1f} us "
                 f"({100 * s['python'] / s['step']:.0f}%)")
    nodes = _node_profile(art, [x, y, np.array(1.0, np.float32)], steps)
    total = sum(t for _, t in nodes)
    lines.append(f"graph nodes, {1e6 * total:.0f} us per step in kernels:")
    for key, t in nodes[:top]:
        lines.append(f"  {1e6 * t:9.1f} us  {100 * t / total:5.1f}%  {key}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["mlp", "seed"], choices=sorted(MODELS))
    args = parser.parse_args(argv)
    for name in args.models:
        print(profile(name))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
