"""Where a training step's time goes: ortrain's Python, the two runtime calls, and the graph nodes.

    python -m bench.profile            # the MLP of (c) and the seed-size model of (b)
    python -m bench.profile cnn dense-bn gelu   # the CNN of (d); a batch norm over features; GELU

For each model: the per-step time of ``Trainer.step`` split into the training-graph run, the
optimizer-graph run and everything else (ortrain's input checks and bookkeeping, measured as
the remainder); the same split as pyinstrument samples it, by function (with pyinstrument
installed: ``pip install 'ortrain[bench]'``); then onnxruntime's own per-node profile of the
training and optimizer graphs (``SessionOptions.enable_profiling``), median over steps after
warm-up, top nodes first; and the optimizer's update against the same update written in
standard ops (run with the thread pool) and in numpy; and the runtime's update kernel in a
process alone against two copies of it run at once in two processes (whether it is bound by its
thread or by the memory the cores share).
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
    "dense-bn": ("bench.profile_models:DenseBatchNorm", "784-256 with batch norm over the features, batch 1024"),
    "gelu": ("bench.profile_models:GeluMLP", "784-4096 GELU-10, batch 128"),
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


RUNTIME_CALLS = {"PyCapsule.train_step": "runtime: training graph", "PyCapsule.optimizer_step": "runtime: optimizer graph",
                 "PyCapsule.lazy_reset_grad": "runtime: gradient reset", "PyCapsule.eval_step": "runtime: eval graph"}


def sampled_self_times(root) -> dict[tuple[str, str], float]:
    """Seconds spent in each function itself (its callees excluded), from a pyinstrument frame
    tree, by ``(function, where)``: a runtime call by its kind (:data:`RUNTIME_CALLS`); another
    built-in (numpy's reductions, a lock) under the Python file that called it, since that file's
    code is what chose to call it; Python code under its file. Summed, they are the whole time."""
    out: dict[tuple[str, str], float] = {}

    def walk(frame, caller_file: str) -> None:
        if frame.function == "[self]":  # pyinstrument's own node for its parent's self time, counted there
            return
        here = caller_file if frame.file_path_short == "<built-in>" else (frame.file_path_short or "?")
        key = (frame.function, RUNTIME_CALLS.get(frame.function, here))
        out[key] = out.get(key, 0.0) + frame.total_self_time
        for child in frame.children:
            walk(child, here)

    walk(root, "?")
    return out


def python_profile(tr, x, y, step_s: float, seconds: float = 2.0, top: int = 8) -> list[str]:
    """pyinstrument's sampling profile of ``Trainer.step`` over about ``seconds``: where a step's
    time goes by function, grouped into the runtime's calls, ortrain's Python and the rest. Its
    hooks slow every Python call, so the Python shares read high on steps of microseconds."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return ["(pip install pyinstrument, or ortrain[bench], for a sampling profile of the step's Python)"]
    interval = max(2e-5, step_s / 100)  # (a sample's time goes to the call it ends in: long intervals miss short Python)
    profiler = Profiler(interval=interval)
    steps = 0
    profiler.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        tr.step(x, y)
        steps += 1
    profiler.stop()
    root = profiler.last_session.root_frame()
    times = sampled_self_times(root)
    total = sum(times.values())
    groups: dict[str, float] = {}
    for (_, where), t in times.items():
        group = where if where.startswith("runtime: ") else \
            "ortrain Python" if where.startswith("ortrain") else "the caller's loop and other Python"
        groups[group] = groups.get(group, 0.0) + t
    lines = [f"pyinstrument, a sample every {1e6 * interval:.0f} us over {steps} steps ({1e6 * total / steps:.1f} us a "
             f"step profiled, {1e6 * step_s:.1f} us not):"]
    if total / steps > 1.5 * step_s:
        lines.append("  (the profiler's hooks take most of a step this short: read the timed split above instead)")
    lines.append("  " + "; ".join(f"{g} {100 * t / total:.1f}%" for g, t in sorted(groups.items(), key=lambda kv: -kv[1])))
    for (function, where), t in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {1e6 * t / steps:9.1f} us  {100 * t / total:5.1f}%  {function} ({where})")
    return lines


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


def _standard_op_adam(sizes: list[int], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
    """Adam over weights of ``sizes`` written in standard ONNX elementwise ops (twelve a weight:
    three for the first moment, four for the second, five for the update), which any
    onnxruntime runs with its thread pool; inputs ``w{i} g{i} m{i} v{i}``, outputs the new three.
    The bias corrections are one number a step each, folded into ``lr`` and ``eps`` (step t's
    update is ``lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps * sqrt(1 - b2^t))``), so
    they cost nothing per weight and the constants here time every step alike."""
    from onnx import TensorProto, helper

    consts = {"b1": betas[0], "c1": 1 - betas[0], "b2": betas[1], "c2": 1 - betas[1], "eps": eps, "lr": lr}
    inits = [helper.make_tensor(k, TensorProto.FLOAT, [], [v]) for k, v in consts.items()]
    nodes, inputs, outputs = [], [], []
    for i, n in enumerate(sizes):
        w, g, m, v = (f"{k}{i}" for k in "wgmv")
        inputs += [helper.make_tensor_value_info(k, TensorProto.FLOAT, [n]) for k in (w, g, m, v)]
        chain = [("Mul", [m, "b1"], "ma"), ("Mul", [g, "c1"], "mb"), ("Add", ["ma", "mb"], "m_new"),
                 ("Mul", [g, g], "gg"), ("Mul", [v, "b2"], "va"), ("Mul", ["gg", "c2"], "vb"),
                 ("Add", ["va", "vb"], "v_new"), ("Sqrt", ["v_new"], "s"), ("Add", ["s", "eps"], "d"),
                 ("Div", ["m_new", "d"], "u"), ("Mul", ["u", "lr"], "step"), ("Sub", [w, "step"], "w_new")]
        local = {}
        for op, args, out in chain:
            local[out] = f"{out}{i}"
            nodes.append(helper.make_node(op, [local.get(a, a) for a in args], [local[out]]))
        outputs += [helper.make_tensor_value_info(f"{k}{i}", TensorProto.FLOAT, [n]) for k in ("w_new", "m_new", "v_new")]
    graph = helper.make_graph(nodes, "adam", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def update_forms(sizes: list[int], steps: int = 100) -> dict:
    """Median seconds of one Adam update over weights of ``sizes``, three ways: onnxruntime's
    standard elementwise ops in an InferenceSession on 1 and on all threads (inputs and outputs
    bound once, as a replayed step would), and numpy in place (one thread). The runtime's own
    fused ``AdamWOptimizer`` kernel is in the node profile above; this says whether writing the
    update in standard ops, where the thread pool applies, would beat it."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    model = _standard_op_adam(sizes).SerializeToString()
    out = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        binding = sess.io_binding()
        keep = []
        for i, n in enumerate(sizes):
            for k in "wgmv":
                a = rng.random(n, dtype=np.float32)
                keep.append(a)
                binding.bind_cpu_input(f"{k}{i}", a)
            for k in ("w_new", "m_new", "v_new"):
                a = np.empty(n, np.float32)
                keep.append(a)
                binding.bind_output(f"{k}{i}", "cpu", 0, np.float32, [n], a.ctypes.data)
        times = []
        for _ in range(steps + 10):
            t0 = time.perf_counter()
            sess.run_with_iobinding(binding)
            times.append(time.perf_counter() - t0)
        out[f"standard ops, {threads} thread{'s' if threads > 1 else ''}"] = statistics.median(times[10:])
    n = sum(sizes)
    w, g, m, v = (rng.random(n, dtype=np.float32) for _ in range(4))
    times = []
    for _ in range(steps // 4 + 5):
        t0 = time.perf_counter()
        m *= 0.9
        m += 0.1 * g
        v *= 0.999
        v += 0.001 * g * g
        w -= 1e-3 * m / (np.sqrt(v) + 1e-8)
        times.append(time.perf_counter() - t0)
    out["numpy in place, 1 thread"] = statistics.median(times[5:])
    return out


def _kernel_session(sizes: list[int]):
    """A training session whose weights have ``sizes`` (1-D), opened on one thread, with Adam's
    update graph and one step's gradients in place: its ``optimizer_step`` runs the runtime's
    ``AdamWOptimizer`` kernel over exactly those weights."""
    from onnx import TensorProto, helper, numpy_helper

    from ortrain.engine.session import TrainingSession

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"w{i}") for i, n in enumerate(sizes)]
    nodes = [helper.make_node("ReduceSum", [f"w{i}"], [f"s{i}"], keepdims=1) for i in range(len(sizes))]
    total = "s0"
    for i in range(1, len(sizes)):
        nodes.append(helper.make_node("Add", [total, f"s{i}"], [f"t{i}"]))
        total = f"t{i}"
    nodes.append(helper.make_node("Mul", ["x", total], ["y"]))
    graph = helper.make_graph(nodes, "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    art = ot.artifacts.build(model, loss="mse", optimizer=ot.optim.Adam(lr=1e-3))
    session = TrainingSession(art.training, art.eval, art.checkpoint, art.optimizer_graph, threads=1)
    session.train_step([np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32), np.array(1.0, np.float32)])
    return session


def kernel_step(sizes: list[int]):
    """The runtime's ``AdamWOptimizer`` update over weights of ``sizes``, as a call (a worker's step)."""
    return _kernel_session(sizes).optimizer_step


def kernel_side_by_side(sizes: list[int], calls: int = 300, rounds: int = 3) -> dict:
    """Seconds a call of the runtime's ``AdamWOptimizer`` update over weights of ``sizes`` takes in
    a worker process alone, and in each of two workers that run it at the same time, each on a core
    of its own (the slower of the two), each the best of ``rounds`` interleaved rounds. Equal times
    say that the kernel is bound by its one thread's work, not by the memory the cores share (which
    two updates at once would divide); it runs on one thread in this runtime."""
    from bench.common import Worker, time_together

    if (os.cpu_count() or 1) < 2:
        return {}
    alone, both = [], []
    with Worker("bench.profile:kernel_step", sizes=sizes) as first, \
            Worker("bench.profile:kernel_step", sizes=sizes) as second:
        time_together([first, second], 20)  # warm-up
        for _ in range(rounds):  # interleaved, the best round of each: a busy host slows either at times
            alone.append(first.time(calls))
            both.append(max(time_together([first, second], calls)))
    return {"alone": min(alone), "two at once": min(both)}


def profile(name: str, steps: int = 60, top: int = 12) -> str:
    import importlib
    path, _, attr = MODELS[name][0].partition(":")
    module = importlib.import_module(path)
    module = getattr(module, attr) if attr else module
    model = module.build_model()
    x, y = module.data()
    lines = [f"## {MODELS[name][1]}"]
    with ot.Trainer(model, batch_size=len(y)) as tr:
        for _ in range(10):
            tr.step(x, y)
        s = _split(tr, x, y, steps)
        sampled = python_profile(tr, x, y, s["step"])
        art = tr._art
    lines.append(f"Trainer.step {1e6 * s['step']:.1f} us = training graph {1e6 * s['train_step']:.1f} us "
                 f"({100 * s['train_step'] / s['step']:.0f}%) + optimizer graph {1e6 * s['optimizer_step']:.1f} us "
                 f"({100 * s['optimizer_step'] / s['step']:.0f}%) + ortrain Python {1e6 * s['python']:.1f} us "
                 f"({100 * s['python'] / s['step']:.0f}%)")
    lines += sampled
    nodes = _node_profile(art, [x, y, np.array(1.0, np.float32)], steps)
    total = sum(t for _, t in nodes)
    lines.append(f"graph nodes, {1e6 * total:.0f} us per step in kernels:")
    for key, t in nodes[:top]:
        lines.append(f"  {1e6 * t:9.1f} us  {100 * t / total:5.1f}%  {key}")
    if any(key.startswith("AdamWOptimizer ") for key, _ in nodes):
        sizes = [int(np.prod(p.shape)) for p in art.params if p.role == "trainable"]
        fused = s["optimizer_step"]
        lines.append(f"the Adam update over {sum(sizes):,} weights: the optimizer graph (AdamWOptimizer) "
                     f"{1e6 * fused:.1f} us a step; written in standard ops or numpy instead:")
        for form, t in update_forms(sizes).items():
            lines.append(f"  {1e6 * t:9.1f} us  {t / fused:5.2f}x  {form}")
        side = kernel_side_by_side(sizes)
        if side:
            lines.append(f"the AdamWOptimizer kernel over the same weights in a process alone: {1e6 * side['alone']:.1f} us; "
                         f"in each of two processes at once, on a core each: {1e6 * side['two at once']:.1f} us "
                         f"({side['two at once'] / side['alone']:.2f}x)")
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
