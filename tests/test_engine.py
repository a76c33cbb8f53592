"""The engine: environment checks, torch-free loading, devices, sessions, checkpoints, bad feeds."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import dense_model, open_session

import ortrain as ot
from ortrain import engine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = extra_path + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def test_import_and_training_never_load_torch(tmp_path):
    result = run_python(f"""
        import sys
        class BlockTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
        sys.meta_path.insert(0, BlockTorch())
        import numpy as np, ortrain as ot
        ot.artifacts.set_cache_dir({str(tmp_path)!r})
        model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,))
        model.compile(optimizer="adam", loss="mse")
        with ot.Trainer(model, batch_size=4) as tr:
            loss = tr.step(np.ones((4, 3)), np.zeros((4, 2)))
        print("torch loaded:", "torch" in sys.modules, "loss finite:", np.isfinite(loss))
    """)
    assert result.returncode == 0, result.stderr
    assert "torch loaded: False loss finite: True" in result.stdout


def test_installed_torch_is_not_imported(tmp_path):
    """``import onnxruntime`` alone imports torch when it is installed; ortrain avoids that."""
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed, so nothing could import it")
    result = run_python(f"""
        import sys, numpy as np, ortrain as ot
        ot.artifacts.set_cache_dir({str(tmp_path)!r})
        model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,))
        model.compile(optimizer="adam", loss="mse")
        with ot.Trainer(model, batch_size=4) as tr:
            tr.step(np.ones((4, 3)), np.zeros((4, 2)))
        print("torch loaded:", "torch" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert "torch loaded: False" in result.stdout


def test_plain_onnxruntime_shadowing_the_training_build_is_explained(tmp_path):
    fake = tmp_path / "onnxruntime"
    (fake / "capi").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '1.31.1'\n")
    (fake / "capi" / "__init__.py").write_text("")
    (fake / "capi" / "_pybind_state.py").write_text("class InferenceSession: pass\n")
    result = run_python("""
        try:
            import ortrain
        except Exception as exc:
            print(type(exc).__name__, exc)
    """, extra_path=str(tmp_path))
    assert "OrtrainError" in result.stdout
    assert "inference-only build without the training API" in result.stdout
    assert "onnxruntime-training-cpu==1.19.2" in result.stdout


def test_environment_problem_messages():
    ok = engine.environment_problems("1.17.0", "1.19.2", True, {})
    assert ok == []
    too_new = engine.environment_problems("1.18.0", "1.19.2", True, {})
    assert "writes ONNX IR version 11" in too_new[0] and "onnx>=1.16,<1.18" in too_new[0]
    missing = engine.environment_problems("1.17.0", None, False, {})
    assert "onnxruntime-training is not installed" in missing[0]
    shadow = engine.environment_problems("1.17.0", "1.31.1", False, {"onnxruntime": "1.31.1"})
    assert "pip uninstall -y onnxruntime" in shadow[0]
    beside = engine.environment_problems("1.17.0", "1.19.2", True, {"onnxruntime-gpu": "1.20.0"})
    assert "shares its module name" in beside[0]
    # a plain --force-reinstall also upgraded onnx past the pin (the training wheel does not pin it)
    for said in (shadow[0], beside[0]):
        assert said.endswith("&& pip install --force-reinstall --no-deps 'onnxruntime-training-cpu==1.19.2'")


def test_devices():
    assert str(engine.parse_device("cpu")) == "cpu"
    assert engine.parse_device("cuda:1", providers=["CUDAExecutionProvider"]).index == 1
    # the uninstall removes the module the two builds share (ortrain[cuda] installs both): a plain install
    # was "already satisfied" and left none
    with pytest.raises(ot.OrtrainError, match="no CUDA execution provider.*pip uninstall -y onnxruntime-training-cpu "
                                              "&& pip install --force-reinstall --no-deps onnxruntime-training==1.19.2"):
        engine.parse_device("cuda", providers=["CPUExecutionProvider"])
    with pytest.raises(ot.OrtrainError, match="expected 'cpu', 'cuda' or 'cuda:N'.*received 'gpu0'"):
        engine.parse_device("gpu0")
    with pytest.raises(ot.OrtrainError, match="device: expected"):
        engine.parse_device(0)
    with pytest.raises(ot.OrtrainError, match="received 'cuda:\u0661'"):   # a digit, but not an ASCII one
        engine.parse_device("cuda:\u0661", providers=["CUDAExecutionProvider"])
    if "CUDAExecutionProvider" not in engine.available_providers():
        model = dense_model(3, 2)
        with pytest.raises(ot.OrtrainError, match="CUDA"):
            ot.Trainer(model, batch_size=4, device="cuda")


def test_thread_setting():
    assert ot.get_num_threads() == engine.default_threads()
    ot.set_num_threads(1)
    try:
        assert ot.get_num_threads() == 1
    finally:
        ot.set_num_threads(None)
    with pytest.raises(ot.OrtrainError, match="set_num_threads: expected a positive int"):
        ot.set_num_threads(0)
    for bad in (0, -2, 2.5, "x"):   # a trainer's own count is checked the same way
        with pytest.raises(ot.OrtrainError, match="threads: expected a positive int or None, received"):
            ot.Trainer(dense_model(3, 2), batch_size=4, threads=bad)


def test_a_trainers_thread_count_reaches_every_session_it_opens(monkeypatch):
    import copy

    from ortrain.engine import inference
    asked = []
    made = inference.session_options
    monkeypatch.setattr(inference, "session_options", lambda threads=None: asked.append(threads) or made(threads))
    model = ot.Sequential([ot.layers.Dense(2), ot.layers.BatchNorm()], input_shape=(3,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((4, 3), np.float32)
    with ot.Trainer(model, batch_size=4, threads=1) as tr:
        tr.predict(x)
        tr.calibrate_bn(x)
        snap = tr.snapshot()
        snap.predict(x)
        copy.deepcopy(snap).predict(x)
        snap.free()
    assert asked == [1, 1, 1, 1]   # predict, calibrate_bn, a snapshot and its copy


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc")
def test_the_update_session_starts_no_pool_threads():
    # The update kernels run on the calling thread; a pool beside them only spun (a fit's first
    # epoch 10-20% slower on two cores). threads=3 gives the training and eval graphs 2 workers each.
    def threads_now():
        return len(os.listdir("/proc/self/task"))
    for optimizer in ("adam", ot.optim.SGD(momentum=0.9), ot.optim.SGD(weight_decay=0.1)):
        model = dense_model(3, 2, optimizer=optimizer)
        before = threads_now()
        with ot.Trainer(model, batch_size=4, threads=3, weight_decay=None) as tr:
            tr.step(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
            assert threads_now() - before == 4, optimizer
        assert threads_now() == before


def test_bad_feeds_name_the_input_and_change_nothing(rng):
    art = ot.artifacts.build(dense_model(3, 2), optimizer="adam")
    sess = open_session(art)
    before = sess.get("dense_0.kernel")
    x, y, s = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32), np.array(1.0, np.float32)
    with pytest.raises(ot.ShapeError, match="input 'input' expected shape \\(N, 3\\), received \\(4, 5\\)"):
        sess.train_step([np.ones((4, 5), np.float32), y, s])
    with pytest.raises(ot.ShapeError, match="input 'ortrain.label' expected dtype float32, received float64"):
        sess.train_step([x, y.astype(np.float64), s])
    with pytest.raises(ot.ShapeError, match="expected 3 inputs \\(input, ortrain.label, ortrain.loss_scale\\)"):
        sess.train_step([x, y])
    with pytest.raises(ot.ShapeError, match="disagree on the number of rows \\(input: 4, ortrain.label: 3\\)"):
        sess.eval_step([x, y[:3], s])
    sess.optimizer_step()
    np.testing.assert_array_equal(sess.get("dense_0.kernel"), before)  # no gradient ever accumulated
    sess.free()
    with pytest.raises(ot.FreedError):
        sess.train_step([x, y, s])


def test_session_checkpoint_resume_is_bit_exact(tmp_path, rng):
    art = ot.artifacts.build(dense_model(3, 2, optimizer="adam"), optimizer="adam")
    batches = [[rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32),
                np.array(1.0, np.float32)] for _ in range(6)]

    def steps(sess, bs):
        out = []
        for b in bs:
            out.append(float(sess.train_step(b)[1].numpy()))
            sess.optimizer_step()
            sess.zero_grad()
        return out

    a = open_session(art)
    a.lr = 0.01
    steps(a, batches[:3])
    a.save_checkpoint(tmp_path / "ckpt", {"ortrain.note": "three steps"})
    tail = steps(a, batches[3:])
    b = engine.TrainingSession(art.training, art.eval, tmp_path / "ckpt", art.optimizer_graph)
    b.lr = 0.01
    assert b.properties()["ortrain.note"] == "three steps"
    assert steps(b, batches[3:]) == tail
    for name in a.param_names:
        np.testing.assert_array_equal(a.get(name), b.get(name))


def test_checkpoint_codec_round_trip(tmp_path, rng):
    art = ot.artifacts.build(dense_model(3, 2, optimizer="adam"), optimizer="adam")
    sess = open_session(art)
    sess.lr = 0.01
    for _ in range(2):
        sess.train_step([rng.standard_normal((4, 3)).astype(np.float32), np.zeros((4, 2), np.float32),
                         np.array(1.0, np.float32)])
        sess.optimizer_step()
        sess.zero_grad()
    sess.save_checkpoint(tmp_path / "c")
    data = engine.read_checkpoint(tmp_path / "c")
    assert data.optimizer.step == 2 and set(data.optimizer.moments) == {"dense_0.kernel", "dense_0.bias"}
    data.properties = {"i": 3, "f": 0.5, "s": "text"}
    engine.write_checkpoint(tmp_path / "d", data)
    again = engine.read_checkpoint(tmp_path / "d")
    assert again.properties == {"i": 3, "f": 0.5, "s": "text"} and again.optimizer.step == 2
    for k, (m, v) in data.optimizer.moments.items():
        np.testing.assert_array_equal(again.optimizer.moments[k][0], m)
        np.testing.assert_array_equal(again.optimizer.moments[k][1], v)
    # onnxruntime-training opens what ortrain wrote.
    reopened = engine.TrainingSession(art.training, art.eval, tmp_path / "d", art.optimizer_graph)
    np.testing.assert_array_equal(reopened.get("dense_0.kernel"), sess.get("dense_0.kernel"))
    swapped = engine.CheckpointData({"s": np.ones(2, np.float32)}, {"big": np.arange(3, dtype=">f4")}, None, {})
    engine.write_checkpoint(tmp_path / "s", swapped)
    back = engine.read_checkpoint(tmp_path / "s")
    assert back.frozen["big"].dtype == np.float32 and back.frozen["big"].tolist() == [0.0, 1.0, 2.0]
    # the optimizer state alone (a fit's end reads it back so), every array its own aligned copy
    alone = engine.read_checkpoint(tmp_path / "d", weights=False)
    assert alone.trainable == {} and alone.frozen == {} and alone.optimizer.step == 2
    for k, moments in again.optimizer.moments.items():
        for a, b in zip(alone.optimizer.moments[k], moments):
            np.testing.assert_array_equal(a, b)
            assert a.flags.owndata and a.flags.aligned and a.flags.writeable and a.dtype.isnative


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"\x10\x00\x00\x00ODTC" + b"\xff" * 40])
def test_damaged_checkpoints_are_refused(tmp_path, content):
    (tmp_path / "bad").write_bytes(content)
    with pytest.raises(ot.OrtrainError):
        engine.read_checkpoint(tmp_path / "bad")


def test_session_refuses_to_open_without_eval_graph():
    art = ot.artifacts.build(dense_model(3, 2))
    with pytest.raises(ot.OrtrainError, match="needs an eval graph"):
        engine.TrainingSession(art.training, None, art.checkpoint, art.optimizer_graph)


def test_library_export_matches_forward(tmp_path, rng):
    import onnxruntime as ort
    model = dense_model(3, 2)
    art = ot.artifacts.build(model)
    sess = open_session(art)
    sess.export_inference(tmp_path / "inf.onnx", ["input" if False else art.prediction])
    x = rng.standard_normal((5, 3)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "inf.onnx"), providers=["CPUExecutionProvider"]).run(
        [art.prediction], {"input": x})[0]
    np.testing.assert_allclose(got, model.predict(x), rtol=1e-6, atol=1e-6)


def test_a_changed_byte_in_a_checkpoint_is_reported_as_damage_naming_the_file(tmp_path):
    # a changed element-type field said only "ONNX element type UNDEFINED is not supported by
    # ortrain": no file, no damage, no fix
    path = tmp_path / "c"
    engine.write_checkpoint(path, engine.CheckpointData({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, {},
                                                        None, {}))
    good = path.read_bytes()
    messages = []
    for offset in range(len(good)):
        for bit in (0x01, 0x10):
            damaged = bytearray(good)
            damaged[offset] ^= bit
            path.write_bytes(bytes(damaged))
            try:
                engine.read_checkpoint(path)
            except ot.OrtrainError as exc:
                messages.append(str(exc))
    typed = [m for m in messages if "element type" in m]
    assert typed and all(re.search(r"checkpoint '.*' cannot be read: its contents do not parse \(ValueError: tensor "
                                   r"'w' has ONNX element type \w+\); it is damaged", m) for m in typed)
    assert all(str(path) in m for m in messages)


def test_predict_keeps_no_copy_of_the_weights_beyond_what_onnxruntime_holds(tmp_path):
    # onnxruntime's Python session kept the serialized model, every weight once more: predict held three
    # times the weights (stock onnxruntime two: its tensors and its packed copies for the GEMM)
    script = tmp_path / "held.py"
    script.write_text(
        "import gc, sys, numpy as np, ortrain as ot\n"
        "def rss():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) * 1024\n"
        "m = ot.Sequential([ot.layers.Dense(3000), ot.layers.Dense(3000)], input_shape=(3000,), seed=0)\n"
        "weights = sum(w.nbytes for w in m.get_weights())\n"
        "gc.collect(); before = rss()\n"
        "m.predict(np.ones((1, 3000), np.float32)); gc.collect()\n"
        "print((rss() - before) / weights)\n")
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status on this platform")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    held = float(subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                                env=env).stdout)
    assert 1.5 < held < 2.5, held
