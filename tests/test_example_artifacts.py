"""The committed artifacts/ (``make artifacts``: artifacts/generate.py running ``ortrain artifacts``).

They must equal a fresh generation byte for byte, train through ``ot.Trainer.from_artifacts``
exactly as PyTorch trains the same network, and train through ``ortrain train --artifacts``
without being modified.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import torch_steps

import ortrain as ot
from ortrain.datasets import load_digits

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_script(ARTIFACTS / "generate.py")


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """Every model whose modules are installed, generated afresh."""
    return gen.generate(tmp_path_factory.mktemp("regenerated"), echo=lambda *a: None)


def _usable(name: str, regenerated) -> Path:
    """The committed directory when this environment can load it (same library versions), else a fresh one."""
    try:
        return ot.artifacts.load(ARTIFACTS / name).directory
    except ot.OrtrainError:
        if name not in regenerated:
            pytest.skip(f"artifacts/{name} was written by other library versions and {name} needs "
                        f"{', '.join(gen.missing_modules(name))} to regenerate")
        return regenerated[name]


def test_every_model_is_committed_small_and_recorded():
    recorded = json.loads((ARTIFACTS / "versions.json").read_text())
    assert set(recorded) == set(gen.MODELS)
    total = 0
    for name in gen.MODELS:
        files = sorted(p.name for p in (ARTIFACTS / name).iterdir())
        assert files == sorted([*ot.artifacts.FILES, "manifest.json"]), name
        total += sum(p.stat().st_size for p in (ARTIFACTS / name).iterdir())
        manifest = json.loads((ARTIFACTS / name / "manifest.json").read_text())
        assert manifest["versions"]["ortrain"] == recorded[name]["ortrain"] == ot.__version__, \
            f"artifacts/{name} predates ortrain {ot.__version__}: run `make artifacts`"
    assert total < 256 * 1024


@pytest.mark.parametrize("name", list(gen.MODELS))
def test_committed_artifacts_equal_a_fresh_generation(name, regenerated):
    recorded = json.loads((ARTIFACTS / "versions.json").read_text())[name]
    now = gen.versions(name)
    if recorded["ortrain"] != now["ortrain"]:
        pytest.fail(f"artifacts/{name} was made by ortrain {recorded['ortrain']}, this is {now['ortrain']}: "
                    "run `make artifacts`")
    if name not in regenerated:
        pytest.skip(f"regenerating {name} needs {', '.join(gen.missing_modules(name))}")
    differ = {k: (recorded[k], now[k]) for k in recorded if recorded[k] != now[k]}
    if differ:
        pytest.skip(f"artifacts/{name} was made with other library versions {differ} (recorded, installed); "
                    "its bytes are only reproducible with the recorded ones")
    committed, fresh = _digests(ARTIFACTS / name), _digests(regenerated[name])
    stale = sorted(f for f in committed.keys() | fresh.keys() if committed.get(f) != fresh.get(f))
    assert not stale, f"artifacts/{name} is stale ({', '.join(stale)} differ from a fresh generation): " \
                      "run `make artifacts` and commit the result"


def _torch_twin(torch, name: str, weights: dict):
    """The same network in PyTorch, holding ``weights`` (ortrain's Dense kernels are (in, out))."""
    if name == "digits-mlp":
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        state = {"0.weight": weights["dense_0.kernel"].T, "0.bias": weights["dense_0.bias"],
                 "2.weight": weights["dense_1.kernel"].T, "2.bias": weights["dense_1.bias"]}
    else:
        net = _load_script(ROOT / "examples" / "export_then_train.py").torch_model()
        state = dict(weights)
    net.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
    return net


@pytest.mark.parametrize("name", list(gen.MODELS))
def test_trainer_from_artifacts_trains_like_pytorch(name, regenerated):
    torch = torch_or_skip()
    directory = _usable(name, regenerated)
    before = _digests(directory)
    x, y = load_digits()
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 4 * 32, 32)]
    with ot.Trainer.from_artifacts(directory, batch_size=32) as tr:
        assert tr.lr == pytest.approx(0.003)  # stored by `ortrain artifacts --lr 0.003`
        start = dict(zip(tr.model().weight_names(), tr.model().get_weights(), strict=True))
        losses = [tr.step(xb, yb) for xb, yb in batches]
        model = tr.model()
        trained = dict(zip(model.weight_names(), model.get_weights(), strict=True))
        predicted = tr.predict(x[:100])
        assert tr.n_steps == 4

    net = _torch_twin(torch, name, start)
    opt = torch.optim.Adam(net.parameters(), lr=0.003)
    ref_losses = torch_steps(torch, net, opt, torch.nn.functional.cross_entropy, batches)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    reference = _torch_twin(torch, name, trained)
    ref_state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    for key, value in reference.state_dict().items():
        np.testing.assert_allclose(value.numpy(), ref_state[key], rtol=1e-4, atol=1e-6, err_msg=key)
    with torch.no_grad():
        np.testing.assert_allclose(predicted, net(torch.from_numpy(x[:100])).numpy(), rtol=1e-4, atol=1e-5)
    assert _digests(directory) == before  # training never writes into the artifacts


def test_ortrain_train_on_committed_artifacts(tmp_path, regenerated):
    import onnxruntime

    directory = _usable("digits-mlp", regenerated)
    before = _digests(directory)
    x, y = load_digits()
    np.savez(tmp_path / "digits.npz", x=x[:1500], y=y[:1500])
    run = tmp_path / "run"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "ortrain", "train", "--artifacts", str(directory),
                           "--data", str(tmp_path / "digits.npz"), "--epochs", "3", "--batch-size", "32",
                           "--out", str(run), "--seed", "0", "--verbose", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    history = json.loads((run / "history.json").read_text())
    assert history["epoch"] == [0, 1, 2]
    loss = history["history"]["loss"]
    assert loss[2] < loss[1] < loss[0] < np.log(10) + 0.2  # starts near chance, then falls
    assert _digests(directory) == before

    session = onnxruntime.InferenceSession(str(run / "model.onnx"), providers=["CPUExecutionProvider"])
    served = session.run(None, {session.get_inputs()[0].name: x[1500:]})[0]
    last = run / json.loads((run / "state.json").read_text())["checkpoint"]
    ours = ot.artifacts.load(directory).model(last).predict(x[1500:])
    np.testing.assert_allclose(served, ours, rtol=1e-5, atol=1e-5)
    assert np.mean(served.argmax(1) == y[1500:]) > 0.8


def test_readme_python_block_runs(monkeypatch, capsys):
    try:
        ot.artifacts.load(ARTIFACTS / "digits-mlp")
    except ot.OrtrainError as exc:
        pytest.skip(f"the committed artifacts do not load with these library versions: {exc}")
    blocks = re.findall(r"```python\n(.*?)```", (ARTIFACTS / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(ROOT)  # the block names the directory as a user in a clone would
    exec(compile(blocks[0], "artifacts/README.md", "exec"), {"__name__": "__readme__"})
    loss, _ = capsys.readouterr().out.split(" ", 1)
    assert float(loss) < np.log(10)  # one epoch moved the loss below chance level
