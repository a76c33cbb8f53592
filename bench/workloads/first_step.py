"""(f) Time to the first training step, cold (artifacts generated) and warm (artifact cache hit),
for the MLP of (c) and for ResNet-50 from the ONNX model zoo's light files (random weights).

Each measurement is a fresh Python process: "cold" starts with an empty artifact cache,
"warm" with the cache the cold run filled. The clock runs from the model description
(the Sequential, or the ``.onnx`` file) to the end of the first ``Trainer.step``; importing
ortrain is reported separately, and so are the parts of a start (describing the model, creating
the Trainer, the first step) and the time of the step after it.

Beside them runs the runtime alone: a fresh process in which onnxruntime-training's own API
opens the cached artifacts and takes the same first step. Its time over ortrain's cold start
is the least a warm start can reach while it opens these sessions and takes a step.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import ortrain as ot
t1 = time.perf_counter()
kind, cache, path = sys.argv[1], sys.argv[2], sys.argv[3]
ot.artifacts.set_cache_dir(cache)
if kind == "mlp":
    from bench.workloads.mlp import build_model, data
    start = time.perf_counter()
    model = build_model()
    x, y = data()
    batch = len(y)
else:
    start = time.perf_counter()
    model = ot.from_onnx(path)
    model.compile(optimizer="adam", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y, batch = rng.random((1, 3, 224, 224), dtype=np.float32), np.array([3]), 1
described = time.perf_counter()
tr = ot.Trainer(model, batch_size=batch)
ready = time.perf_counter()
tr.step(x, y)
end = time.perf_counter()
tr.step(x, y)
again = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_step_s": end - start, "model_s": described - start,
                  "trainer_s": ready - described, "step_s": end - ready, "next_step_s": again - end}))
"""

# The runtime alone: onnxruntime-training's public API opening the artifacts a warm start finds
# in the cache (checkpoint, training and eval graphs, optimizer) and taking the same first step,
# with nothing of ortrain's between. Its time over ortrain's cold start is the least any warm
# start over these sessions can reach.
RAW_CHILD = r"""
import json, sys, time
from types import SimpleNamespace
t0 = time.perf_counter()
import numpy as np
import ortrain  # registers onnxruntime.training without running its __init__ (see bench.common.ort_loop)
import onnxruntime.training.api  # what ort_loop opens the artifacts with, imported before the clock
from bench.common import ort_loop
t1 = time.perf_counter()
kind, d = sys.argv[1], sys.argv[2]
if kind == "mlp":
    from bench.workloads.mlp import data
start = time.perf_counter()
if kind == "mlp":
    x, y = data()
else:
    rng = np.random.default_rng(0)
    x, y = rng.random((1, 3, 224, 224), dtype=np.float32), np.array([3])
files = SimpleNamespace(checkpoint=d + "/checkpoint", training=d + "/training.onnx", eval=d + "/eval.onnx",
                        optimizer_graph=d + "/optimizer.onnx")
step = ort_loop(files, [x, y, np.array(1.0, np.float32)], lr=1e-3)
ready = time.perf_counter()
step()
end = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_step_s": end - start, "open_s": ready - start, "step_s": end - ready}))
"""


def _child(kind: str, cache: Path, path: str, code: str = CHILD) -> dict:
    out = subprocess.run([sys.executable, "-c", code, kind, str(cache), path], capture_output=True, text=True,
                         cwd=ROOT, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"first-step child failed ({kind}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _resnet_file(directory: Path) -> str:
    import importlib.util

    import onnx
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "tests" / "data" / "make_models.py")
    make_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_models)
    path = directory / "resnet50.onnx"
    onnx.save(make_models.light_model("resnet50"), str(path))
    return str(path)


def measure(kind: str, path: str, colds: int, warms: int) -> dict:
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(colds):
            cold.append(_child(kind, Path(tmp) / f"cache-{i}", path))
        for _ in range(warms):
            warm.append(_child(kind, Path(tmp) / "cache-0", path))
        entry = _the_entry(Path(tmp) / "cache-0")
        raw = [_child(kind, entry, "-", RAW_CHILD) for _ in range(warms)]

    def median(runs, key):
        return statistics.median(r[key] for r in runs)
    c, w = median(cold, "first_step_s"), median(warm, "first_step_s")
    # Where a start goes: describing the model, creating the Trainer (artifacts and sessions), the
    # first step; and an ordinary step after it, the part of any start no cache can remove.
    parts = ("model_s", "trainer_s", "step_s", "next_step_s")
    return {"cold_s": c, "warm_s": w, "warm_over_cold": w / c,
            "cold_parts": {k: median(cold, k) for k in parts}, "warm_parts": {k: median(warm, k) for k in parts},
            "cold_runs": [r["first_step_s"] for r in cold], "warm_runs": [r["first_step_s"] for r in warm],
            "import_ortrain_s": median(cold + warm, "import_s"),
            "runtime_alone": {"warm_s": median(raw, "first_step_s"), "warm_over_cold": median(raw, "first_step_s") / c,
                              "open_s": median(raw, "open_s"), "step_s": median(raw, "step_s"),
                              "runs": [r["first_step_s"] for r in raw]}}


def _the_entry(cache: Path) -> Path:
    """The one artifact directory a cold run left in ``cache``."""
    found = [f.parent for f in cache.rglob("training.onnx")]
    if len(found) != 1:
        raise RuntimeError(f"expected one artifact entry under {cache}, found {len(found)}")
    return found[0]


def run(quick: bool = False) -> dict:
    # Warm starts of ResNet-50 on these shared machines fall into two groups (about 1.0 s and
    # 1.4-2.0 s, in no fixed order, with or without the cold runs' writes synced first); nine
    # runs make the median steadier than five. Every run is kept in the results.
    colds, warms = (1, 2) if quick else (3, 9)
    out = {"workload": "first_step", "title": "time to first step, cold vs warm artifact cache",
           "mlp": measure("mlp", "-", colds, warms)}
    with tempfile.TemporaryDirectory() as tmp:
        out["resnet50"] = measure("resnet50", _resnet_file(Path(tmp)), max(1, colds - 1), warms)
    return out


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
