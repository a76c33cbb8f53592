"""Every script in examples/ runs to completion on tiny settings, in its own process."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))
TIMEOUT_S = 120

# script -> (arguments for a run of a few seconds, modules it needs, a pattern its output must
# match, and for the pattern's group "value" the least acceptable number)
TINY = {
    "capture_custom_loss.py": (
        ["--quick"], (),
        r"update\s+20\s+loss\s+-?\d+\.\d+\s+grad_norm\s+\d+\.\d+.*\nupdates: 20  steps: 10240  episodes finished: \d+  "
        r"mean return of the last 20: (?P<value>\d+\.\d)", 25.0),
    "denoising_autoencoder.py": (
        ["--quick"], (), r"held-out reconstruction error 0\.\d+, the noisy input's 0\.\d+: (?P<value>\d+\.\d) times lower\n"
        r"the exported model in a plain InferenceSession matches", 1.5),
    "deploy_onnxruntime.py": (
        [], (), r"onnxruntime matches ortrain on every image; accuracy (?P<value>0\.\d+)", 0.85),
    "dqn_cartpole.py": (
        # 100 episodes fill the replay buffer past its 1,000-transition warm-up, so the trainer steps.
        ["--episodes", "100"], (), r"episode  100 .* steps (?P<value>\d+)\nepisodes: 100  best return: \d+", 1),
    "export_then_train.py": (
        ["--quick"], ("torch", "onnxscript"),
        r"max \|ortrain - torch\| before training: (0\.0e\+00|\d\.\de-0[6-9])\n(.*\n)*"
        r"test accuracy (?P<value>0\.\d+); the exported model in a plain InferenceSession matches", 0.8),
    "generator_shards.py": (
        ["--quick"], (), r"epochs run: 2  final val_accuracy: 0\.\d+  held-out accuracy: (?P<value>0\.\d+)", 0.6),
}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # A private artifact cache, so the examples never write to the user's.
    env = dict(os.environ, XDG_CACHE_HOME=str(cwd / "cache"), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def test_every_example_has_tiny_settings():
    names = {p.name for p in EXAMPLES}
    assert names, f"no examples found in {EXAMPLES_DIR}"
    assert names == set(TINY), (f"examples without tiny settings in tests/test_examples.py: "
                                f"{sorted(names - set(TINY))}; entries for missing scripts: {sorted(set(TINY) - names)}")


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_on_tiny_settings(script, tmp_path):
    if script.name not in TINY:
        pytest.fail(f"{script.name} has no tiny settings in TINY")
    args, needs, pattern, floor = TINY[script.name]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{script.name} needs {', '.join(missing)}")
    done = _run([str(script), *args], tmp_path)
    assert done.returncode == 0, f"{script.name} exited with {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    found = re.search(pattern, done.stdout)
    assert found, f"{script.name}: no line matching {pattern!r} in its output:\n{done.stdout[-3000:]}"
    assert float(found["value"]) >= floor, f"{script.name}: {found.group(0)!r} is below {floor}"


def test_export_then_train_without_torch_explains_and_exits_cleanly(tmp_path):
    script = EXAMPLES_DIR / "export_then_train.py"
    # None in sys.modules makes `import torch` fail as it does where torch is not installed.
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = [sys.argv[1], '--quick']; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = _run(["-c", code, str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "needs torch (pip install torch onnxscript)" in done.stderr
    assert "Epoch" not in done.stdout
