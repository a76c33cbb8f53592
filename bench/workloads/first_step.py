"""(f) Time to the first training step, cold (artifacts generated) and warm (artifact cache hit),
for the MLP of (c) and for ResNet-50 from the ONNX model zoo's light files (random weights).

Each measurement is a fresh Python process: "cold" starts with an empty artifact cache,
"warm" with the cache the cold run filled. The clock runs from the model description
(the Sequential, or the ``.onnx`` file) to the end of the first ``Trainer.step``; importing
ortrain is reported separately.
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
tr = ot.Trainer(model, batch_size=batch)
tr.step(x, y)
end = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_step_s": end - start}))
"""


def _child(kind: str, cache: Path, path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(cache), path], capture_output=True, text=True,
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
    cold, warm, imports = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(colds):
            cache = Path(tmp) / f"cache-{i}"
            r = _child(kind, cache, path)
            cold.append(r["first_step_s"])
            imports.append(r["import_s"])
        for _ in range(warms):
            r = _child(kind, Path(tmp) / "cache-0", path)
            warm.append(r["first_step_s"])
            imports.append(r["import_s"])
    c, w = statistics.median(cold), statistics.median(warm)
    return {"cold_s": c, "warm_s": w, "warm_over_cold": w / c, "cold_runs": cold, "warm_runs": warm,
            "import_ortrain_s": statistics.median(imports)}


def run(quick: bool = False) -> dict:
    colds, warms = (1, 2) if quick else (3, 5)
    out = {"workload": "first_step", "title": "time to first step, cold vs warm artifact cache",
           "mlp": measure("mlp", "-", colds, warms)}
    with tempfile.TemporaryDirectory() as tmp:
        out["resnet50"] = measure("resnet50", _resnet_file(Path(tmp)), max(1, colds - 1), warms)
    return out


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
