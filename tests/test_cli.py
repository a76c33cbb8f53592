"""The command line: subcommands, run directories, resume after an interruption, exit codes."""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import ortrain as ot
from ortrain.cli import main
from ortrain.datasets import load_digits

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBCOMMANDS = ("demo", "info", "artifacts", "train", "eval", "predict", "export")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = load_digits()
    np.savez(tmp_path / "train.npz", x=x[:600], y=y[:600])
    np.savez(tmp_path / "test.npz", x=x[1500:], y=y[1500:])
    np.save(tmp_path / "x.npy", x[:600])
    np.save(tmp_path / "y.npy", y[:600])
    model = ot.Sequential([ot.layers.Dense(32, activation="relu"), ot.layers.Dense(10)], input_shape=(64,), seed=0)
    model.export_onnx(tmp_path / "mlp.onnx")
    return tmp_path


def cli(*args) -> int:
    return main([str(a) for a in args])


def make_artifacts(capsys):
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--optimizer", "adam", "--lr", "0.003") == 0
    return capsys.readouterr().out


def weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def test_help_lists_every_subcommand(capsys):
    assert cli("--help") == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out
    for name in SUBCOMMANDS:
        assert cli(name, "--help") == 0
        assert "usage: ortrain " + name in capsys.readouterr().out


def test_console_script_runs():
    result = subprocess.run([sys.executable, "-m", "ortrain", "info", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0 and "usage: ortrain info" in result.stdout


def test_info(capsys):
    assert cli("info", "--json") == 0   # after the subcommand as well as before it
    assert json.loads(capsys.readouterr().out)["onnxruntime-training"] == "1.19.2"
    assert cli("--json", "info") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["onnxruntime-training"] == "1.19.2" and "CPUExecutionProvider" in info["execution_providers"]
    assert info["cache"] == str(ot.artifacts.cache_dir()) and info["threads"] >= 1


def test_artifacts_prints_roles_and_hash(workdir, capsys):
    out = make_artifacts(capsys)
    assert "trainable: dense_0.kernel, dense_0.bias, dense_1.kernel, dense_1.bias" in out
    art = ot.artifacts.load("art")
    assert f"hash: {art.key}" in out
    assert art.optimizer.lr == 0.003 and art.loss == ot.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_train_writes_a_complete_run_and_the_tools_read_it(workdir, capsys):
    make_artifacts(capsys)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "2", "--batch-size", "32",
               "--out", "run", "--seed", "3", "--val-split", "0.1", "--metrics", "accuracy", "--verbose", "0") == 0
    run = workdir / "run"
    for name in ("run.json", "state.json", "log.csv", "history.json", "model.onnx"):
        assert (run / name).is_file(), name
    assert (run / "loss.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)
    state = json.loads((run / "state.json").read_text())
    assert state["epoch"] == 2 and (run / state["checkpoint"]).is_file()
    assert (run / "log.csv").read_text().splitlines()[0] == "epoch,accuracy,loss,lr,val_accuracy,val_loss"
    final = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("final:"))
    # in the files' order, not in an order the hash seed picks anew in every process
    assert [cell.split("=")[0] for cell in final[len("final: "):].split(", ")] == \
        ["accuracy", "loss", "lr", "val_accuracy", "val_loss"]
    assert cli("--json", "eval", "--run", "run", "--data", "test.npz", "--metrics", "accuracy") == 0
    result = json.loads(capsys.readouterr().out)
    x, y = load_digits()
    model = ot.from_onnx(run / "model.onnx")
    logits = model.predict(x[1500:])
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y[1500:]))
    assert cli("predict", "--run", "run", "--data", "x.npy", "-o", "p.npy") == 0
    np.testing.assert_allclose(np.load("p.npy"), model.predict(x[:600]), rtol=1e-6, atol=1e-6)
    assert cli("export", "--run", "run", "-o", "again.onnx") == 0
    for name, w in weights(run / "model.onnx").items():
        np.testing.assert_array_equal(weights("again.onnx")[name], w)


def _stopped_and_resumed_match_straight(common: list[str]) -> None:
    """Three epochs straight, and one epoch then --resume to three: the same weights, bit for bit."""
    assert cli("train", *common, "--epochs", "3", "--out", "straight") == 0
    assert cli("train", *common, "--epochs", "1", "--out", "stopped") == 0
    assert cli("train", "--out", "stopped", "--resume", "--epochs", "3", "--verbose", "0") == 0
    a, b = weights("straight/model.onnx"), weights("stopped/model.onnx")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_resume_after_stopping_is_bit_exact(workdir, capsys):
    make_artifacts(capsys)
    _stopped_and_resumed_match_straight(["--artifacts", "art", "--data", "train.npz", "--batch-size", "32", "--seed",
                                         "5", "--verbose", "0"])
    assert json.loads((workdir / "stopped" / "history.json").read_text())["epoch"] == [0, 1, 2]


def test_resume_of_a_model_with_dropout_is_bit_exact(workdir, capsys):
    # The masks a resumed run draws are those the run would have drawn next (they started over
    # before: the resumed weights differed).
    model = ot.Sequential([ot.layers.Dense(32, activation="relu"), ot.layers.Dropout(0.3), ot.layers.Dense(10)],
                          input_shape=(64,), seed=0)
    model.export_onnx(workdir / "drop.onnx")
    _stopped_and_resumed_match_straight(["--model", "drop.onnx", "--loss", "sparse_categorical_crossentropy",
                                         "--from-logits", "--data", "train.npz", "--batch-size", "32", "--seed", "5",
                                         "--verbose", "0"])


def test_artifacts_seed_makes_runs_from_them_reproducible(workdir, capsys):
    # An exported model's Dropout carries no seed, and `ortrain artifacts` left it so: two runs of
    # the same command drew other masks, and a resumed run differed from an uninterrupted one.
    ot.set_seed(None)
    model = ot.Sequential([ot.layers.Dense(32, activation="relu"), ot.layers.Dropout(0.3), ot.layers.Dense(10)],
                          input_shape=(64,), seed=0)
    model.export_onnx(workdir / "drop.onnx")
    assert cli("artifacts", "drop.onnx", "-o", "art", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--seed", "3") == 0
    _stopped_and_resumed_match_straight(["--artifacts", "art", "--data", "train.npz", "--batch-size", "32", "--seed",
                                         "5", "--verbose", "0"])
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--batch-size", "32", "--seed", "5",
               "--verbose", "0", "--epochs", "3", "--out", "again") == 0
    a, b = weights("straight/model.onnx"), weights("again/model.onnx")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_resume_after_ctrl_c_is_bit_exact(workdir, capsys, stop):
    make_artifacts(capsys)
    x, y = load_digits()
    np.savez("big.npz", x=np.tile(x, (8, 1)), y=np.tile(y, 8))  # epochs long enough to interrupt
    args = ["train", "--artifacts", "art", "--data", "big.npz", "--batch-size", "16", "--seed", "7", "--epochs", "6",
            "--verbose", "0"]
    assert cli(*args, "--out", "straight") == 0
    # the signals at their defaults in the child: a test run started in the background of a shell
    # inherits SIGINT ignored, as shells set it for background jobs, and so would the run
    proc = subprocess.Popen([sys.executable, "-m", "ortrain", *args, "--out", "killed"], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not (workdir / "killed" / "state.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    # one process at a time trains a run: a second is refused before it touches anything
    assert cli("train", "--out", "killed", "--resume", "--verbose", "0") == 2
    assert "another ortrain process is training the run in 'killed'" in capsys.readouterr().err
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err  # interrupted, not finished
    assert "interrupted; the run in 'killed' keeps its completed epochs, continue it with --resume" in err
    assert "Traceback" not in err
    assert json.loads((workdir / "killed" / "state.json").read_text())["epoch"] < 6
    assert cli("train", "--out", "killed", "--resume", "--verbose", "0") == 0
    a, b = weights("straight/model.onnx"), weights("killed/model.onnx")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_ctrl_c_in_the_first_epoch_keeps_a_run_that_resumes(workdir, capsys, monkeypatch):
    make_artifacts(capsys)
    from ortrain import fit as fit_mod
    real = fit_mod.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(fit_mod, "train", interrupted)
    args = ["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32", "--seed", "3",
            "--lr", "0.01", "--out", "run", "--verbose", "0"]
    assert cli(*args) == 130
    assert (workdir / "run" / "run.json").is_file() and not (workdir / "run" / "state.json").exists()
    monkeypatch.setattr(fit_mod, "train", real)
    assert cli("train", "run") == 2   # the run given where the config file goes
    assert "CONFIG: 'run' is a run directory; the positional argument is a TOML config file: give it as " \
           "--resume --out run" in capsys.readouterr().err
    assert cli("train", "--out", "run", "--resume", "--verbose", "0") == 0
    state = json.loads((workdir / "run" / "state.json").read_text())
    assert state["epoch"] == 1 and state["history"]["lr"] == [0.01]   # the run's --lr, not the artifacts' 3e-3


def test_a_run_resumes_from_anywhere_and_finishes_what_a_kill_left(workdir, capsys, monkeypatch):
    make_artifacts(capsys)
    (workdir / "sub").mkdir()
    monkeypatch.chdir(workdir / "sub")
    assert cli("train", "--artifacts", "../art", "--data", "../train.npz", "--epochs", "1", "--batch-size", "32",
               "--seed", "3", "--out", "../run", "--verbose", "0") == 0
    monkeypatch.chdir(workdir)   # run.json holds absolute paths: another working directory reads the same files
    run = workdir / "run"
    reference = weights(run / "model.onnx")
    # what a kill leaves: half-written files of atomic writes, no model.onnx after the last epoch
    (run / "model.onnx").unlink()
    leftovers = [run / ".state.json.0123456789ab.tmp.json", run / "checkpoints" / ".epoch-0002.ckpt.0123456789ab.tmp.ckpt",
                 run / ".model.onnx.0123456789ab.tmp.onnx"]
    users = [run / ".notes.0123456789ab.tmpl", run / ".state.json.tmp", run / "checkpoints" / ".mine.ckpt"]
    for p in leftovers + users:
        p.write_text("half")
    (run / ".artifacts.tmp-0123456789ab").mkdir()
    assert cli("train", "--out", "run", "--resume", "--epochs", "1", "--verbose", "0") == 0
    assert "note: the run already completed 1 epochs" in capsys.readouterr().out
    for name, value in weights(run / "model.onnx").items():
        np.testing.assert_array_equal(value, reference[name])
    assert not any(p.exists() for p in leftovers) and not (run / ".artifacts.tmp-0123456789ab").exists()
    assert all(p.exists() for p in users)   # names ortrain does not write are left alone
    # a resume that trains further removes the export it replaces once its first epoch commits: a kill
    # before the new end cannot leave it looking final, while one before that epoch keeps the run as it was
    from ortrain import fit as fit_mod
    from ortrain.cli import runs

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    final = (run / "model.onnx").read_bytes()
    monkeypatch.setattr(fit_mod, "train", stop)
    assert cli("train", "--out", "run", "--resume", "--epochs", "2", "--verbose", "0") == 130
    assert (run / "model.onnx").read_bytes() == final
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(runs, "_finish", stop)  # killed after the last epoch committed, before the export
    assert cli("train", "--out", "run", "--resume", "--epochs", "2", "--verbose", "0") == 130
    assert not (run / "model.onnx").exists()
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert cli("eval", "--run", "run", "--data", "test.npz") == 0


def test_a_resume_removes_the_temporary_of_every_file_a_run_writes(workdir, capsys, monkeypatch):
    # every temporary a run renames into place (its atomic writes and its artifacts' folder) is
    # what a kill during that write leaves: recorded as the run writes them, then left as if killed
    renamed = []
    real_replace, real_rename = os.replace, os.rename

    def replace(src, dst, *args, **kwargs):
        renamed.append(Path(os.path.abspath(src)))
        return real_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        renamed.append(Path(os.path.abspath(src)))
        return real_rename(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "train.npz", "--epochs", "1", "--batch-size", "32", "--seed", "2", "--out", "run",
               "--verbose", "0") == 0
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    run = workdir / "run"
    temporaries = sorted({p for p in renamed if p.parent in (run, run / "checkpoints")})
    written = {p.name.split(".")[1] for p in temporaries}
    assert {"run", "state", "history", "log", "model", "loss", "epoch-0001", "artifacts"} <= written
    for p in [*temporaries, run / ".artifacts.old-a_b1c2d3"]:
        if p.name.startswith(".artifacts."):
            (p / "stale").mkdir(parents=True)
        else:
            p.write_bytes(b"half")
    assert cli("train", "--out", "run", "--resume", "--epochs", "1", "--verbose", "0") == 0
    left = [p.name for p in temporaries if p.exists()]
    assert left == [] and not (run / ".artifacts.old-a_b1c2d3").exists()


def test_a_moved_run_keeps_its_own_artifacts(workdir, capsys):
    import shutil
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "train.npz", "--epochs", "1", "--batch-size", "32", "--seed", "2", "--out", "run",
               "--verbose", "0") == 0
    shutil.move(workdir / "run", workdir / "moved")
    assert cli("eval", "--run", "moved", "--data", "test.npz") == 0
    assert cli("train", "--out", "moved", "--resume", "--epochs", "2", "--verbose", "0") == 0
    assert json.loads((workdir / "moved" / "state.json").read_text())["epoch"] == 2


def test_json_output_is_the_only_thing_on_stdout(workdir, capsys):
    make_artifacts(capsys)
    assert cli("--json", "train", "--artifacts", "art", "--data", "train.npz", "--epochs", "2", "--batch-size", "32",
               "--out", "run", "--verbose", "2") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["epochs"] == 2 and "Epoch 1/2" in captured.err


def test_train_from_model_and_toml_config(workdir, capsys):
    (workdir / "run.toml").write_text(
        'model = "mlp.onnx"\ndata = ["x.npy", "y.npy"]\nepochs = 2\nbatch_size = 50\nloss = '
        '"sparse_categorical_crossentropy"\nfrom_logits = true\noptimizer = "adamw"\nlr = 0.01\nout = "cfgrun"\n'
        'seed = 1\nverbose = 0\n')
    assert cli("train", "run.toml") == 0
    run = workdir / "cfgrun"
    assert (run / "artifacts" / "manifest.json").is_file() and (run / "model.onnx").is_file()
    hist = json.loads((run / "history.json").read_text())["history"]
    assert len(hist["loss"]) == 2 and hist["loss"][1] < hist["loss"][0]


def test_a_config_saved_by_windows_notepad_reads_as_the_same_config(workdir, capsys):
    # UTF-8 with a byte-order mark and CRLF line ends: "not valid TOML (at line 1, column 1)", naming neither
    text = ('model = "mlp.onnx"\ndata = ["x.npy", "y.npy"]\nepochs = 1\nbatch_size = 50\nloss = '
            '"sparse_categorical_crossentropy"\nfrom_logits = true\nseed = 3\nverbose = 0\nout = "{}"\n')
    (workdir / "plain.toml").write_text(text.format("plain"), encoding="utf-8")
    (workdir / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.format("bom").replace("\n", "\r\n").encode())
    assert cli("train", "plain.toml") == 0 and cli("train", "bom.toml") == 0, capsys.readouterr().err
    runs = [json.loads((workdir / name / "history.json").read_text())["history"] for name in ("plain", "bom")]
    assert runs[0] == runs[1] and len(runs[0]["loss"]) == 1
    (workdir / "twice.toml").write_bytes(b"\xef\xbb\xbf" + b"\xef\xbb\xbf" + b"epochs = 1\n")  # only one mark is one
    assert cli("train", "twice.toml") == 2
    assert "CONFIG: 'twice.toml' is not valid TOML" in capsys.readouterr().err


def test_artifacts_removes_what_a_build_killed_midway_left_beside_its_directory(workdir, capsys, monkeypatch):
    import threading

    from ortrain import _artifact_store
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse") == 0
    # killed between its two renames: the old copy moved aside, the new one complete but not in place
    (workdir / ".art.old-a1b2c3_d").mkdir()
    (workdir / "art").rename(workdir / ".art.old-a1b2c3_d" / "stale")
    (workdir / ".art.tmp-0123456789ab").mkdir()
    (workdir / ".art.tmp-0123456789ab" / "training.onnx").write_bytes(b"half")
    lookalikes = [workdir / ".art.tmp-mine", workdir / ".art.old-notes", workdir / ".art2.tmp-0123456789ab"]
    for p in lookalikes:
        p.mkdir()
    capsys.readouterr()
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mae") == 0
    captured = capsys.readouterr()
    assert "note:" not in captured.out and captured.err == ""   # nothing was wrong: art is written anew
    assert ot.artifacts.load("art").manifest["loss"]["name"] == "mae"
    assert sorted(p.name for p in workdir.iterdir() if p.name.startswith(".art")) == \
        sorted(p.name for p in lookalikes)
    # a build of art running in another process holds its lock: its folder is not taken for a leftover
    target = Path(os.path.realpath("art"))
    building, waiting, seen = threading.Event(), threading.Event(), []

    def other_build():
        with _artifact_store._publish_lock(target):
            in_flight = workdir / ".art.tmp-fedcba987654"
            in_flight.mkdir()
            building.set()
            waiting.wait(60)
            time.sleep(0.5)   # the command waits on the lock meanwhile
            seen.append(in_flight.exists())
            in_flight.rmdir()
    thread = threading.Thread(target=other_build)
    thread.start()
    assert building.wait(60)
    real_lock = _artifact_store.lock_file

    def lock_file(*args, **kwargs):
        waiting.set()
        return real_lock(*args, **kwargs)
    monkeypatch.setattr(_artifact_store, "lock_file", lock_file)
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse") == 0
    thread.join(60)
    assert seen == [True]
    # killed while a build rewrote the manifest (another learning rate): the directory was refused as
    # "not an ortrain artifacts directory" ever after
    (workdir / "art" / ".manifest.json.0123456789ab.tmp.json").write_text("{")
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse", "--lr", "0.02") == 0
    assert ot.artifacts.load("art").manifest["optimizer"]["lr"] == 0.02


@pytest.mark.parametrize("args,code,message", [
    (["train", "--artifacts", "art", "--data", "missing.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "--data: no such file 'missing.npz'"),
    (["train", "--data", "train.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "give --artifacts DIR or --model MODEL.onnx"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "0", "--batch-size", "8"], 2,
     "expected a positive integer"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--loss", "mae"], 2,
     "fixed by the artifacts"),
    (["train", "--artifacts", "art", "--data", "wrong.npz", "--epochs", "1", "--batch-size", "8", "--verbose", "0"],
     1, "ortrain train: x of --data 'wrong.npz': expected shape (N, 64), received (20, 5)"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--val-data", "wrong.npz", "--epochs", "1",
      "--batch-size", "8", "--verbose", "0"], 1, "x of --val-data 'wrong.npz': expected shape (N, 64), received (20, 5)"),
    (["train", "--artifacts", "art", "--data", "x.npy", "short_y.npy", "--epochs", "1", "--batch-size", "8",
      "--verbose", "0"], 1, "y of --data 'short_y.npy': "),
    (["eval", "--artifacts", "nowhere", "--data", "test.npz"], 2, "--artifacts: no such directory 'nowhere'"),
    (["eval", "--artifacts", "art", "--data", "wrong.npz"], 1,
     "ortrain eval: x of --data 'wrong.npz': expected shape (N, 64), received (20, 5)"),
    (["eval", "--artifacts", "art", "--data", "x.npy", "short_y.npy"], 1, "ortrain eval: y of --data 'short_y.npy': "),
    (["predict", "--artifacts", "art", "--data", "wrong.npz", "-o", "p.npy"], 1,
     "ortrain predict: x of --data 'wrong.npz': expected shape (N, 64), received (20, 5)"),
    (["train", "--resume", "--out", "norun", "--data", "train.npz", "--epochs", "1"], 2,
     "'norun' holds no run to resume; drop --resume"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--seed", "-5"],
     2, "argument --seed: expected an integer >= 0, received '-5'"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--lr", "nan"],
     2, "argument --lr: expected a finite number >= 0, received 'nan'"),
    (["train", "bad.toml"], 2, "CONFIG: key 'epochs' expected a positive integer, received 0"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--out",
      "train.npz"], 2, "--out: 'train.npz' is a file"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--out",
      "train.npz/run"], 2, "--out: 'train.npz/run' lies under the file 'train.npz'"),
    (["train", "--artifacts", "art", "--data", "weighted.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "holds sample_weight, which the artifacts in 'art' do not take; build them with `ortrain artifacts ... "
     "--sample-weights`"),
    (["artifacts", "nothing.onnx", "-o", "a2", "--loss", "mse"], 2, "MODEL: no such file 'nothing.onnx'"),
    (["artifacts", "mlp.onnx", "-o", "train.npz", "--loss", "mse"], 2, "-o: 'train.npz' is a file"),
    (["--bogus"], 2, "unrecognized arguments"),
    (["export", "-o", "x.onnx"], 2, "give exactly one of --run, --artifacts\n"),
    (["predict", "--data", "x.npy"], 2, "give exactly one of --run, --artifacts or --model"),
    (["predict", "--model", "nothing.onnx", "--data", "x.npy"], 2, "--model: no such file 'nothing.onnx'"),
    (["predict", "--model", ".", "--data", "x.npy"], 2, "--model: '.' is a directory; give the model file"),
    (["train", "--model", ".", "--data", "x.npy", "--epochs", "1", "--batch-size", "4"], 2,
     "--model: '.' is a directory; give the model file"),
    (["train", "--data", "train.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "ortrain train: error: give --artifacts DIR or --model MODEL.onnx (exactly one)\n"),
    (["train", "--artifacts", "nowhere", "--data", "train.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "--artifacts: no such directory 'nowhere'"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--frozen", "d*"],
     2, "--frozen: the loss, the optimizer and which weights train are fixed by the artifacts"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--from-logits"],
     2, "--from-logits: the loss"),
    (["train", "loss.toml"], 2, "CONFIG: key 'loss' expected one of mse, mae"),
    (["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8", "--val-data",
      "test.npz", "--val-split", "0.5"], 2, "argument --val-split: not allowed with argument --val-data"),
    (["train", "--artifacts", "art", "--data", "truncated.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "--data: cannot read 'truncated.npz' as numpy arrays"),
    (["train", "--artifacts", "art", "--data", "single.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "--data: 'single.npz' holds a single array, not an .npz archive"),
    (["train", "--artifacts", "art", "--data", "text.npy", "--epochs", "1", "--batch-size", "8"], 2,
     "--data: cannot read 'text.npy' as numpy arrays (not numeric arrays"),
    (["train", "--artifacts", "art", "--data", "typo.npz", "--epochs", "1", "--batch-size", "8"], 2,
     "has arrays ['sample_weights', 'x', 'y']; expected 'x', 'y' and optionally 'sample_weight', nothing else"),
    (["demo", "--out", "train.npz"], 2, "--out: 'train.npz' is a file"),
    (["artifacts", "mlp.onnx", "-o", "train.npz/sub", "--loss", "mse"], 2,
     "-o: 'train.npz/sub' lies under the file 'train.npz'; writing artifacts needs a directory"),
    # config files that cannot be read, paths of the wrong kind, an option the loss does not take
    (["train", "latin1.toml"], 2, "CONFIG: 'latin1.toml' is not UTF-8 text, as TOML files are"),
    (["train", "paths.toml"], 2, "CONFIG: key 'data' expects a string or a list of strings, received ['train.npz', 5]"),
    (["train", "art"], 2, "CONFIG: 'art' is an artifacts directory; the positional argument is a TOML config "
     "file: give it as --artifacts art"),
    (["train", "."], 2, "CONFIG: '.' is a directory; give the path of a .toml file"),
    (["train", "mlp.onnx"], 2, "CONFIG: 'mlp.onnx' is an ONNX model; the positional argument is a TOML config file: "
     "give it as --model mlp.onnx"),
    (["train", "train.npz", "--artifacts", "art"], 2, "CONFIG: 'train.npz' is a data file; the positional argument "
     "is a TOML config file: give it as --data train.npz"),
    (["train", "--artifacts", "art", "--data", "art", "--epochs", "1", "--batch-size", "8"], 2,
     "--data: 'art' is a directory; give the data file"),
    (["artifacts", "mlp.onnx", "-o", "a2", "--loss", "mse", "--from-logits"], 2,
     "--from-logits: only the cross-entropy losses (categorical_crossentropy, sparse_categorical_crossentropy, "
     "binary_crossentropy) read logits, and --loss mse does not; drop --from-logits"),
    (["train", "--model", "mlp.onnx", "--loss", "huber", "--from-logits", "--data", "train.npz", "--epochs", "1",
      "--batch-size", "8"], 2, "--from-logits: only the cross-entropy losses"),
    (["export", "--artifacts", "art", "-o", "missing/m.onnx"], 2,
     "-o: cannot write 'missing/m.onnx': the directory 'missing' does not exist; create it first"),
    (["export", "--artifacts", "art", "-o", "art/forward2.onnx"], 2,
     "-o: 'art/forward2.onnx' lies inside the artifacts 'art' this command reads; write it elsewhere"),
    (["predict", "--artifacts", "art", "--data", "x.npy", "-o", "art/p.npy"], 2, "lies inside the artifacts 'art'"),
    # -o over a file the command reads; a checkpoint with a model file (was ignored: the file's weights predicted)
    (["export", "--artifacts", "art", "--checkpoint", "best.ckpt", "-o", "best.ckpt"], 2,
     "-o: 'best.ckpt' names a file this command reads (a checkpoint, the data or the model)"),
    (["predict", "--artifacts", "art", "--data", "x.npy", "-o", "x"], 2,
     "-o: 'x' would write 'x.npy', a file this command reads"),
    (["predict", "--model", "mlp.onnx", "--checkpoint", "best.ckpt", "--data", "x.npy"], 2,
     "--checkpoint goes with --run or --artifacts: a --model file holds its own weights"),
    # a path of the wrong kind was said not to exist; a config's bare string is a list too
    (["eval", "--artifacts", "train.npz", "--data", "test.npz"], 2,
     "--artifacts: 'train.npz' is a file; give the artifacts directory (the one holding manifest.json)"),
    (["export", "--artifacts", "art", "--checkpoint", "art", "-o", "e.onnx"], 2,
     "--checkpoint: 'art' is a directory; give a checkpoint file in it (a run's are checkpoints/epoch-NNNN.ckpt)"),
    (["train", "number.toml"], 2, "CONFIG: key 'data' expects a string or a list of strings, received 5"),
    # two files were named as one
    (["eval", "--artifacts", "art", "--data", "test.npz", "test.npz"], 2,
     "--data: expected one FILE.npz, or X.npy [Y.npy]; received 'test.npz' 'test.npz' ('test.npz' is not an .npy "
     "file)"),
    (["artifacts", "mlp.onnx", "-o", "/proc/art", "--loss", "mse"], 1, "-o: '/proc/art' cannot be written"),
    # a momentum is SGD's alone, and in [0, 1)
    (["artifacts", "mlp.onnx", "-o", "a2", "--loss", "mse", "--momentum", "0.9"], 2,
     "--momentum: only SGD keeps a velocity, and --optimizer adam does not (Adam's betas are its own); give "
     "--optimizer sgd, or drop --momentum"),
    (["train", "--model", "mlp.onnx", "--optimizer", "adamw", "--momentum", "0.5", "--data", "train.npz",
      "--epochs", "1", "--batch-size", "8"], 2, "--momentum: only SGD keeps a velocity, and --optimizer adamw"),
    (["artifacts", "mlp.onnx", "-o", "a2", "--loss", "mse", "--optimizer", "sgd", "--momentum", "1"], 2,
     "argument --momentum: expected a number in [0, 1), received '1'"),
    (["train", "momentum.toml"], 2, "--momentum: only SGD keeps a velocity, and --optimizer adam does not"),
])
def test_exit_codes_and_one_line_reasons(workdir, capsys, args, code, message):
    make_artifacts(capsys)
    np.savez("wrong.npz", x=np.zeros((20, 5)), y=np.zeros(20, np.int64))
    x, y = np.load("train.npz")["x"], np.load("train.npz")["y"]
    np.save("short_y.npy", y[:10])
    np.savez("weighted.npz", x=x, y=y, sample_weight=np.ones(len(y), np.float32))
    np.savez("typo.npz", x=x, y=y, sample_weights=np.ones(len(y), np.float32))
    (workdir / "truncated.npz").write_bytes((workdir / "train.npz").read_bytes()[:200])
    np.save("single.npy", x)
    (workdir / "single.npy").rename(workdir / "single.npz")
    (workdir / "text.npy").write_text("1,2,3\n")
    (workdir / "bad.toml").write_text("artifacts = 'art'\ndata = ['train.npz']\nbatch_size = 8\nepochs = 0\n")
    (workdir / "loss.toml").write_text("model = 'mlp.onnx'\ndata = ['train.npz']\nbatch_size = 8\nepochs = 1\n"
                                       "loss = 'nope'\n")
    (workdir / "val.toml").write_text("artifacts = 'art'\ndata = ['train.npz']\nbatch_size = 8\nepochs = 1\n"
                                      "val_data = ['test.npz']\n")
    (workdir / "latin1.toml").write_bytes("artifacts = 'art'\n# caf\u00e9\n".encode("latin-1"))
    (workdir / "paths.toml").write_text("artifacts = 'art'\ndata = ['train.npz', 5]\nbatch_size = 8\nepochs = 1\n")
    (workdir / "number.toml").write_text("artifacts = 'art'\ndata = 5\nbatch_size = 8\nepochs = 1\n")
    (workdir / "momentum.toml").write_text("model = 'mlp.onnx'\ndata = ['train.npz']\nbatch_size = 8\nepochs = 1\n"
                                           "momentum = 0.9\n")
    before = sorted(p.name for p in workdir.iterdir())
    art_before = sorted(p.name for p in (workdir / "art").iterdir())
    assert cli(*args) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == before  # nothing written, not even a run.json
    assert sorted(p.name for p in (workdir / "art").iterdir()) == art_before


def test_a_run_s_checkpoints_are_kept_when_its_checkpoints_folder_is_a_symlink(workdir, capsys):
    make_artifacts(capsys)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "2", "--batch-size", "32",
               "--out", "run", "--verbose", "0") == 0
    shutil.move("run/checkpoints", "store")  # kept elsewhere, linked from the run
    os.symlink(workdir / "store", "run/checkpoints")
    assert cli("eval", "--run", "run", "--data", "test.npz") == 0
    kept = (workdir / "store" / "epoch-0002.ckpt").read_bytes()
    assert cli("export", "--run", "run", "-o", "run/checkpoints/epoch-0002.ckpt") == 2  # resolved: store/, no run
    assert "lies in the checkpoints/ folder of the run 'run', a link to" in capsys.readouterr().err
    assert cli("export", "--run", "run", "-o", "store/epoch-0002.ckpt") == 2  # the folder the link names
    assert "lies in the checkpoints/ folder of the run 'run', a link to" in capsys.readouterr().err
    assert cli("export", "--run", "run", "-o", "store.onnx") == 0
    assert (workdir / "store" / "epoch-0002.ckpt").read_bytes() == kept


def test_artifacts_onto_a_folder_of_the_user_s_files_is_a_usage_error_as_train_s(workdir, capsys):
    os.makedirs("mine")
    Path("mine/notes.txt").write_text("notes")
    Path("mine/model.onnx").write_bytes(Path("mlp.onnx").read_bytes())
    # another tool's manifest.json beside files named as artifacts' are the user's too (they were replaced)
    os.makedirs("webapp")
    Path("webapp/manifest.json").write_text('{"name": "my app", "icons": []}')
    Path("webapp/checkpoint").write_text('model_checkpoint_path: "ckpt-1"')
    assert cli("artifacts", "mlp.onnx", "-o", "webapp", "--loss", "mse") == 2
    assert "exists and is not an ortrain artifacts directory (it holds manifest.json)" in \
        capsys.readouterr().err
    assert Path("webapp/manifest.json").read_text() == '{"name": "my app", "icons": []}'
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse") == 0  # ortrain's own are rebuilt
    capsys.readouterr()
    # exited 1, a failed run, where train --out refuses such a folder as a usage error (2)
    assert cli("artifacts", "mlp.onnx", "-o", "mine", "--loss", "mse") == 2
    err = capsys.readouterr().err
    assert "ortrain artifacts: error: -o: 'mine' exists and is not an ortrain artifacts directory (it holds " \
        "model.onnx, notes.txt); choose an empty or new directory" in err and "out_dir" not in err
    assert cli("train", "--model", "mlp.onnx", "--loss", "mse", "--data", "train.npz", "--epochs", "1",
               "--batch-size", "8", "--out", "mine") == 2
    assert sorted(os.listdir("mine")) == ["model.onnx", "notes.txt"]


def test_export_and_predict_write_into_no_artifacts_and_over_no_data_a_run_trains_on(workdir, capsys):
    """A run trains from artifacts another command may not read (``export --run other``) and from data
    its run.json records: written over, the run's eval and resume failed ("does not match the sha256
    recorded in manifest.json", "cannot read train.npz")."""
    make_artifacts(capsys)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
               "--out", "run_a", "--verbose", "0") == 0
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "train.npz", "--epochs", "1", "--batch-size", "32", "--out", "run_b", "--verbose", "0") == 0
    files = {p: p.read_bytes() for p in [*Path("art").rglob("*"), *Path("run_b").rglob("*"), Path("train.npz")]
             if p.is_file()}
    capsys.readouterr()
    for command, why in [
            (["export", "--run", "run_b", "-o", "art/training.onnx"], "lies inside the artifacts directory"),
            (["export", "--run", "run_b", "-o", "art/new.onnx"], "lies inside the artifacts directory"),
            (["predict", "--run", "run_b", "--data", "x.npy", "-o", "art/p.npy"], "lies inside the artifacts directory"),
            (["export", "--run", "run_a", "-o", "run_b/artifacts/x.onnx"], "lies inside the artifacts directory"),
            (["export", "--run", "run_b", "-o", "train.npz"], "names data the run 'run_b' trains on"),
            (["export", "--run", "run_b", "-o", "run_a/state.json"], "names 'state.json' of the run")]:
        assert cli(*command) == 2, command
        assert why in capsys.readouterr().err, command
    # a name -o does not spell (predict writes OUT.npy) through a link into the artifacts
    os.symlink(workdir / "art" / "eval.onnx", "pp.npy")
    assert cli("predict", "--run", "run_b", "--data", "x.npy", "-o", "pp") == 2
    assert "would write" in capsys.readouterr().err
    os.unlink("pp.npy")
    assert {p: p.read_bytes() for p in files} == files
    assert cli("eval", "--run", "run_a", "--data", "test.npz") == 0
    assert cli("export", "--run", "run_b", "-o", "b.onnx") == 0  # elsewhere, as before
    # another tool's manifest.json (a format and a table of files, no key) above the output is no artifacts
    os.makedirs("project/reports")
    Path("project/manifest.json").write_text('{"format": "v2", "files": {"data.csv": "..."}}')
    assert cli("export", "--run", "run_b", "-o", "project/reports/model.onnx") == 0
    assert cli("predict", "--run", "run_b", "--data", "x.npy", "-o", "project/reports/p.npy") == 0
    capsys.readouterr()


def test_predict_writes_through_a_link_to_a_file_without_the_npy_suffix(workdir, capsys):
    """np.save added ".npy" to the temporary file's name there: the link's target was left empty and
    the predictions in a stray file beside it, with exit 0."""
    make_artifacts(capsys)
    os.makedirs("store")
    os.symlink(workdir / "store" / "latest", "preds.npy")
    assert cli("predict", "--artifacts", "art", "--data", "x.npy", "-o", "preds.npy") == 0
    assert os.listdir("store") == ["latest"]
    assert np.load("store/latest").shape[0] == np.load("x.npy").shape[0]


def test_export_and_predict_write_over_none_of_a_run_s_own_files(workdir, capsys):
    make_artifacts(capsys)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "2", "--batch-size", "32",
               "--out", "run", "--verbose", "0") == 0
    before = {p: p.read_bytes() for p in Path("run").rglob("*") if p.is_file()}
    os.makedirs("other/deep")
    os.symlink(workdir / "other" / "deep", "lnk")  # lnk/.. is other/, not the working directory
    shutil.copy("x.npy", "other/x.npy")
    assert cli("predict", "--run", "run", "--data", "other/x.npy", "-o", "lnk/../x.npy") == 2
    assert "-o: 'lnk/../x.npy' names a file this command reads" in capsys.readouterr().err
    for output, why in [("run/checkpoints/epoch-0002.ckpt", "lies in the checkpoints/ folder of the run 'run', which"),
                        ("run/checkpoints/other.onnx", "lies in the checkpoints/ folder"),
                        ("run/state.json", "names 'state.json' of the run"),
                        ("run/run.json", "names 'run.json' of the run")]:
        capsys.readouterr()
        assert cli("export", "--run", "run", "-o", output) == 2  # was written over: the run no longer resumed
        assert why in capsys.readouterr().err
    assert cli("predict", "--run", "run", "--data", "x.npy", "-o", "run/checkpoints/p.npy") == 2
    assert cli("export", "--run", "run", "-o", "run/checkpoints/../checkpoints/x.onnx") == 2
    os.makedirs("run/checkpoints/sub")
    assert cli("export", "--run", "run", "-o", "run/checkpoints/sub/x.onnx") == 2
    os.rmdir("run/checkpoints/sub")
    # a run's files are its own whichever source the command reads
    assert cli("export", "--artifacts", "art", "--checkpoint", "run/checkpoints/epoch-0002.ckpt", "-o",
               "run/checkpoints/new.onnx") == 2
    assert cli("export", "--artifacts", "art", "-o", "run/state.json") == 2
    assert {p: p.read_bytes() for p in Path("run").rglob("*") if p.is_file()} == before
    assert cli("export", "--run", "run", "-o", "run/model.onnx") == 0  # the run's exported model, written again
    assert cli("train", "--out", "run", "--resume", "--epochs", "3", "--verbose", "0") == 0


def test_a_refused_resume_keeps_the_finished_run_and_what_it_trains(workdir, capsys):
    # A resume refused before its first epoch deleted the finished run's model.onnx and loss.png;
    # --loss, --optimizer, --artifacts and --frozen on --resume were silently ignored.
    make_artifacts(capsys)
    common = ["--data", "train.npz", "--verbose", "0", "--batch-size", "32"]
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits", *common,
               "--epochs", "1", "--out", "run") == 0
    files = {p.name: p.read_bytes() for p in (workdir / "run").iterdir() if p.is_file()}
    assert "model.onnx" in files
    for extra, message in ((["--metrics", "acc2"], "unknown metric 'acc2'"),
                           (["--loss", "mse"], "--loss 'mse' differs from the run's 'sparse_categorical_crossentropy'; "
                                               "what a run trains"),
                           (["--optimizer", "sgd"], "--optimizer 'sgd' differs from the run's 'adam'"),
                           (["--optimizer", "sgd", "--momentum", "0.9"], "differs from the run's 'adam'"),
                           (["--artifacts", "art"], "--artifacts 'art' differs from the run, which started without it"),
                           (["--frozen", "dense_0.*"], "--frozen ['dense_0.*'] differs from the run")):
        assert cli("train", "--out", "run", "--resume", "--epochs", "2", *extra) != 0
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert {p.name: p.read_bytes() for p in (workdir / "run").iterdir() if p.is_file()} == files
    # the same values pass, and the resumed run ends with a new model.onnx
    assert cli("train", "--out", "run", "--resume", "--epochs", "2", "--loss", "sparse_categorical_crossentropy",
               "--model", "mlp.onnx") == 0
    assert (workdir / "run" / "model.onnx").read_bytes() != files["model.onnx"]


def test_existing_run_is_not_overwritten(workdir, capsys):
    make_artifacts(capsys)
    base = ["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
            "--out", "run", "--verbose", "0"]
    assert cli(*base) == 0
    before = (workdir / "run" / "state.json").read_text()
    assert cli(*base) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (workdir / "run" / "state.json").read_text() == before


def test_a_new_run_refuses_a_directory_whose_files_it_would_overwrite(workdir, capsys):
    make_artifacts(capsys)
    (workdir / "results").mkdir()
    (workdir / "results" / "notes.txt").write_text("mine")
    (workdir / "results" / "model.onnx").write_bytes(b"someone else's model")
    base = ["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
            "--out", "results", "--verbose", "0"]
    assert cli(*base) == 2
    assert "--out: 'results' holds model.onnx, which a run writes, and no run; choose a new or empty directory" \
        in capsys.readouterr().err
    assert sorted(p.name for p in (workdir / "results").iterdir()) == ["model.onnx", "notes.txt"]
    assert (workdir / "results" / "model.onnx").read_bytes() == b"someone else's model"
    (workdir / "results" / "model.onnx").unlink()
    assert cli(*base) == 0   # files a run does not write stay beside it
    assert (workdir / "results" / "notes.txt").read_text() == "mine"


def test_a_resume_after_its_artifacts_were_rebuilt_says_so(workdir, capsys):
    make_artifacts(capsys)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
               "--out", "run", "--verbose", "0") == 0
    state = (workdir / "run" / "state.json").read_text()
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse") == 0
    capsys.readouterr()
    # a failed run, 1, as eval of the same run says (it was 2, the code of bad arguments)
    assert cli("eval", "--run", "run", "--data", "train.npz") == 1
    capsys.readouterr()
    assert cli("train", "--out", "run", "--resume", "--epochs", "2", "--verbose", "0") == 1
    err = capsys.readouterr().err
    assert "--resume: the artifacts in " in err and "were rebuilt after the run 'run' started and differ from " \
        "those its checkpoint was written for in the loss; rebuild them as the run had them" in err
    assert "checkpoint=" not in err
    assert (workdir / "run" / "state.json").read_text() == state


def test_a_run_that_fails_before_its_first_epoch_leaves_nothing_and_can_be_rerun(workdir, capsys):
    make_artifacts(capsys)
    np.savez("wrong.npz", x=np.zeros((20, 5)), y=np.zeros(20, np.int64))
    (workdir / "kept").mkdir()
    (workdir / "kept" / "artifacts").mkdir()   # not the run's: left alone
    for out, data in (("fresh", "wrong.npz"), ("kept", "wrong.npz")):
        assert cli("train", "--artifacts", "art", "--data", data, "--epochs", "1", "--batch-size", "8", "--out", out,
                   "--verbose", "0") == 1
        assert "x of --data 'wrong.npz': expected shape (N, 64), received (20, 5)" in capsys.readouterr().err
    assert not (workdir / "fresh").exists()
    assert sorted(p.name for p in (workdir / "kept").iterdir()) == ["artifacts"]
    assert cli("train", "--model", "nothing.onnx", "--data", "train.npz", "--epochs", "1", "--batch-size", "8",
               "--out", "built/deep/run") == 2
    (workdir / "bad.onnx").write_bytes(b"not a model")   # fails while the run builds its artifacts
    assert cli("train", "--model", "bad.onnx", "--data", "train.npz", "--epochs", "1", "--batch-size", "8",
               "--out", "built/deep/run") == 1
    assert not (workdir / "built").exists()
    # the same command, with good data, starts the run afresh; an artifacts run records no optimizer of its own
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8",
               "--out", "fresh", "--verbose", "0") == 0
    settings = json.loads((workdir / "fresh" / "run.json").read_text())["settings"]
    assert "optimizer" not in settings and "loss" not in settings


def test_a_run_killed_before_it_wrote_run_json_starts_again_with_the_same_command(workdir, capsys):
    # killed (SIGKILL) once its artifacts are published, as it writes run.json
    (workdir / "kill.py").write_text(
        "import os, signal, sys\n"
        "real = os.open\n"
        "def killing(path, *args, **kwargs):\n"
        "    if '.run.json.' in os.fspath(path):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(path, *args, **kwargs)\n"
        "os.open = killing\n"
        "from ortrain.cli import main\n"
        "sys.exit(main())\n")
    def command(out):
        return ["train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
                "--data", "train.npz", "--epochs", "1", "--batch-size", "16", "--out", out, "--verbose", "0"]
    args = command("R")
    killed = subprocess.run([sys.executable, "kill.py", *args], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (workdir / "R" / "artifacts" / "manifest.json").is_file() and not (workdir / "R" / "run.json").exists()
    assert cli("train", "--out", "R", "--resume", "--epochs", "1", "--verbose", "0") == 2
    assert "train --resume: 'R' holds no run to resume: the run started there was stopped before it wrote run.json " \
        "(its artifacts are left); run the command that started it again, without --resume" in capsys.readouterr().err
    assert cli(*args) == 0
    assert json.loads((workdir / "R" / "state.json").read_text())["epoch"] == 1
    # the same state written by hand, with the temporary of run.json and artifacts of another loss: replaced
    assert cli("artifacts", "mlp.onnx", "-o", "S/artifacts", "--loss", "mse") == 0
    other = ot.artifacts.load("S/artifacts").key
    for name in (".lock", ".run.json.0123456789ab.tmp.json"):
        (workdir / "S" / name).write_text("")
    assert cli(*command("S")) == 0
    assert ot.artifacts.load("S/artifacts").key != other and (workdir / "S" / "run.json").is_file()
    assert sorted(p.name for p in (workdir / "S").iterdir()) == \
        ["artifacts", "checkpoints", "history.json", "log.csv", "loss.png", "model.onnx", "run.json", "state.json"]
    # artifacts beside anything else, holding anything else, or alone without the run's lock (built
    # with ortrain artifacts -o) may be the user's: refused, untouched
    for folder, extra in (("T", "notes.txt"), ("U", "artifacts/notes.txt"), ("V", None)):
        assert cli("artifacts", "mlp.onnx", "-o", f"{folder}/artifacts", "--loss", "mse") == 0
        if extra is not None:
            (workdir / folder / ".lock").write_text("")
            (workdir / folder / extra).write_text("mine")
        before = _files_under(workdir / folder)
        assert cli(*command(folder)) == 2
        assert f"--out: '{folder}' holds artifacts, which a run writes, and no run; choose a new or empty " \
            "directory" in capsys.readouterr().err
        assert _files_under(workdir / folder) == before
        assert cli("train", "--out", folder, "--resume", "--epochs", "1") == 2
        assert "holds no run to resume; drop --resume to start one there" in capsys.readouterr().err


def test_artifacts_says_when_it_replaces_other_artifacts(workdir, capsys):
    make_artifacts(capsys)
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "sparse_categorical_crossentropy",
               "--from-logits", "--optimizer", "adam", "--lr", "0.003") == 0
    assert "note:" not in capsys.readouterr().out  # the same artifacts: nothing replaced
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse") == 0
    assert "note: replaced the artifacts 'art' held, which differed in the loss; runs " \
        "trained from them cannot --resume" in capsys.readouterr().out
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse", "--sample-weights") == 0
    assert "which differed in the sample weighting (loss_mask, sample weights);" in capsys.readouterr().out


def test_an_output_the_system_refuses_is_named_by_its_option(workdir, capsys, monkeypatch):
    # a read-only or full file system: one line naming the option and the file, no bare errno
    import errno
    make_artifacts(capsys)

    def refuse(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    save = np.save

    def cut_short(file, array, *args, **kwargs):  # numpy's own message for a full disk, without an errno
        file.write(b"\x93NUMPY")  # (predict saves to an open file)
        raise OSError("6000 requested and 992 written")

    monkeypatch.setattr(np, "save", cut_short)
    assert cli("predict", "--artifacts", "art", "--data", "x.npy", "-o", "p.npy") == 1
    assert capsys.readouterr().err.strip() == ("ortrain predict: -o: cannot write 'p.npy': 6000 requested and 992 "
                                               "written; a file already there is left as it was. Free space or "
                                               "choose another folder")
    assert not [p for p in os.listdir(".") if "p.npy" in p]   # no file cut short left behind
    monkeypatch.setattr(np, "save", save)
    monkeypatch.setattr(Path, "mkdir", refuse)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
               "--out", "ro/run", "--verbose", "0") == 1
    assert capsys.readouterr().err.strip() == ("ortrain train: --out: cannot write 'ro/run': Read-only file system; "
                                               "choose a path you can write to")


def test_demo_does_not_replace_files_it_did_not_write(workdir, capsys):
    make_artifacts(capsys)
    assert cli("train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
               "--out", "run", "--verbose", "0") == 0
    before = {p.name: p.read_bytes() for p in (workdir / "run").iterdir() if p.is_file()}
    capsys.readouterr()
    assert cli("demo", "--out", "run", "--epochs", "1", "--verbose", "0") == 2
    err = capsys.readouterr().err
    assert "--out: 'run' holds a training run, which the demo did not write" in err
    (workdir / "run" / ".ortrain-demo").touch()   # a run started where a demo once wrote
    before[".ortrain-demo"] = b""
    assert cli("demo", "--out", "run", "--epochs", "1", "--verbose", "0") == 2
    assert {p.name: p.read_bytes() for p in (workdir / "run").iterdir() if p.is_file()} == before
    (workdir / "mine").mkdir()
    (workdir / "mine" / "summary.json").write_text("{}")
    assert cli("demo", "--out", "mine", "--epochs", "1", "--verbose", "0") == 2
    assert (workdir / "mine" / "summary.json").read_text() == "{}"
    for _ in range(2):   # its own directory it writes again
        assert cli("demo", "--out", "again", "--epochs", "1", "--verbose", "0") == 0


def test_demo_reaches_the_accuracy_and_verifies_the_export(tmp_path, capsys):
    assert cli("demo", "--out", tmp_path / "demo", "--verbose", "0") == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.95 and summary["max_abs_diff"] < 1e-4
    assert "InferenceSession reproduces the predictions" in out and str(tmp_path / "demo" / "model.onnx") in out


def test_resume_honours_lr_and_refuses_a_different_batch_size_or_seed(workdir, capsys):
    make_artifacts(capsys)
    common = ["--data", "train.npz", "--verbose", "0"]
    assert cli("train", "--artifacts", "art", *common, "--batch-size", "32", "--seed", "5", "--epochs", "1",
               "--out", "run") == 0
    after_one = weights("run/model.onnx")
    state = (workdir / "run" / "state.json").read_text()
    for flag, value, fixed in (("--batch-size", "16", 32), ("--seed", "6", 5)):
        assert cli("train", "--out", "run", "--resume", *common, "--epochs", "2", flag, value) == 2
        err = capsys.readouterr().err
        assert f"{flag} {value} differs from the run's {fixed}; the batch size and seed are fixed by the run" in err
        assert "Traceback" not in err and (workdir / "run" / "state.json").read_text() == state
    # The order of the rows too: --no-shuffle on a run that shuffles was taken without a word.
    assert cli("train", "--out", "run", "--resume", *common, "--epochs", "2", "--no-shuffle") == 2
    err = capsys.readouterr().err
    assert "shuffle False differs from the run's True; the order of the rows is fixed by the run" in err
    assert (workdir / "run" / "state.json").read_text() == state
    assert json.loads((workdir / "run" / "run.json").read_text())["settings"]["shuffle"] is True
    # The same values are accepted; --lr 0 replaces the checkpoint's rate, so Adam moves nothing.
    assert cli("train", "--out", "run", "--resume", *common, "--epochs", "2", "--batch-size", "32", "--seed", "5",
               "--lr", "0") == 0
    for name, w in after_one.items():
        np.testing.assert_array_equal(weights("run/model.onnx")[name], w)
    assert json.loads((workdir / "run" / "history.json").read_text())["history"]["lr"] == [0.003, 0.0]


def test_predict_writes_every_output_of_a_multi_output_model(workdir, capsys):
    inp = ot.Input((64,))
    h = ot.layers.Dense(8, activation="relu")(inp)
    model = ot.Model(inp, [ot.layers.Dense(10)(h), ot.layers.Dense(1, activation="sigmoid")(h)])
    model.export_onnx(workdir / "two.onnx")
    want = model.predict(np.load("x.npy"))
    assert cli("--json", "predict", "--model", "two.onnx", "--data", "x.npy", "-o", "p.npy") == 0
    result = json.loads(capsys.readouterr().out)
    assert result == {"predictions": ["p_0.npy", "p_1.npy"], "shapes": [[600, 10], [600, 1]]}
    for i, w in enumerate(want):
        np.testing.assert_allclose(np.load(f"p_{i}.npy"), w, rtol=1e-6, atol=1e-6)
    assert not os.path.exists("p.npy")
    assert cli("--json", "predict", "--model", "mlp.onnx", "--data", "x.npy", "-o", "single") == 0
    assert json.loads(capsys.readouterr().out) == {"predictions": "single.npy", "shape": [600, 10]}
    # an output's file over the data it reads is refused (p_0.npy was written over)
    shutil.copy("x.npy", "p_0.npy")
    data = (workdir / "p_0.npy").read_bytes()
    assert cli("predict", "--model", "two.onnx", "--data", "p_0.npy", "-o", "p.npy") == 2
    assert "-o: 'p.npy' would write 'p_0.npy', a file this command reads" in capsys.readouterr().err
    assert (workdir / "p_0.npy").read_bytes() == data and not os.path.exists("p_1.npy.tmp")
    shutil.copy("x.npy", "p.npy")  # read, and not written: this model writes p_0.npy and p_1.npy
    assert cli("predict", "--model", "two.onnx", "--data", "p.npy", "-o", "p.npy") == 0
    assert np.load("p.npy").shape == (600, 64)


def test_val_split_holds_out_the_rows_model_fit_would(workdir, capsys):
    make_artifacts(capsys)
    x, y = load_digits()
    np.savez("ten.npz", x=x[:10], y=y[:10])
    # 10 rows at 0.25: Keras' rule (and Model.fit's) trains on int(10 * 0.75) = 7 rows and holds out 3.
    assert cli("train", "--artifacts", "art", "--data", "ten.npz", "--epochs", "1", "--batch-size", "7",
               "--val-split", "0.25", "--seed", "1", "--out", "run", "--verbose", "0") == 0
    trained = ot.from_onnx(workdir / "run" / "model.onnx")
    trained.compile(loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = json.loads((workdir / "run" / "history.json").read_text())["history"]
    assert history["val_loss"][0] == pytest.approx(trained.evaluate(x[7:10], y[7:10])["loss"], rel=1e-5)
    assert cli("train", "--artifacts", "art", "--data", "ten.npz", "--epochs", "1", "--batch-size", "7",
               "--val-split", "0.95", "--out", "run2", "--verbose", "0") == 2
    assert "--val-split: validation_split=0.95 leaves 0 training and 10 validation rows" in capsys.readouterr().err
    assert not (workdir / "run2").exists()


def test_a_run_past_epoch_9999_keeps_its_newest_checkpoints(tmp_path):
    from ortrain.cli.run_dir import RunRecorder

    class Writes:
        def save_checkpoint(self, path):
            open(path, "wb").write(b"ckpt")

    recorder = RunRecorder(tmp_path, {}, [])
    recorder.trainer = Writes()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "epoch-best.ckpt").write_bytes(b"a user's copy")  # not the run's: kept
    for epoch in (9997, 9998, 9999):  # the last writes epoch-10000.ckpt
        recorder.on_epoch_end(epoch, {"loss": 1.0})
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["checkpoint"] == "checkpoints/epoch-10000.ckpt"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == \
        ["epoch-10000.ckpt", "epoch-9999.ckpt", "epoch-best.ckpt"]


def test_a_failed_run_leaves_a_run_started_beside_it_in_a_shared_new_folder(tmp_path):
    from ortrain.cli.run_dir import _discarder

    discard = _discarder(tmp_path / "results" / "jobB")  # results/ does not exist yet
    (tmp_path / "results" / "jobB").mkdir(parents=True)
    (tmp_path / "results" / "jobA").mkdir()  # another job's run, started meanwhile
    (tmp_path / "results" / "jobA" / "run.json").write_text("{}")
    discard()
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["jobA"]
    discard = _discarder(tmp_path / "new" / "deeper" / "run")
    (tmp_path / "new" / "deeper" / "run").mkdir(parents=True)
    discard()
    assert not (tmp_path / "new").exists()  # alone, it removes every folder it made


def test_json_results_are_standard_json_and_eval_refuses_replaced_artifacts(workdir, capsys):
    make_artifacts(capsys)
    assert cli("--json", "train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32",
               "--out", "run", "--lr", "1e30", "--verbose", "0") == 0

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert strict(capsys.readouterr().out)["final"]["loss"] is None  # NaN: diverged
    assert strict((workdir / "run" / "history.json").read_text())["history"]["loss"] == [None]
    assert cli("--json", "eval", "--run", "run", "--data", "test.npz") == 0
    assert strict(capsys.readouterr().out)["loss"] is None
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse") == 0  # replaces the run's artifacts
    capsys.readouterr()
    assert cli("eval", "--run", "run", "--data", "test.npz") == 1
    assert "was trained with the loss" in capsys.readouterr().err


def test_no_subcommand_prints_the_help_as_a_usage_error(capsys):
    assert cli() == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "COMMAND" in captured.err


def test_a_model_with_several_inputs_is_refused_with_the_way_to_train_it(workdir, capsys):
    a, b = ot.Input((3,), name="a"), ot.Input((2,), name="b")
    two = ot.Model([a, b], ot.layers.Dense(1)(ot.layers.Concatenate()([a, b])))
    two.export_onnx(workdir / "two.onnx")
    np.savez("two.npz", x=np.zeros((8, 3)), y=np.zeros((8, 1)))
    assert cli("train", "--model", "two.onnx", "--data", "two.npz", "--epochs", "1", "--batch-size", "4",
               "--out", "tworun", "--verbose", "0") == 2
    err = capsys.readouterr().err
    assert "the model has 2 inputs (a, b) and the command line feeds one array x" in err
    assert not (workdir / "tworun").exists()
    assert cli("predict", "--model", "two.onnx", "--data", "two.npz") == 2
    assert "feeds one array x" in capsys.readouterr().err


def test_warnings_are_one_line_each(workdir, capsys):
    a = ot.Input((3,), name="a")
    h = ot.layers.Dense(2)(a)
    ot.Model(a, [h, ot.layers.Dense(1)(a)]).export_onnx(workdir / "two_out.onnx")  # the second output's weights idle
    np.savez("d.npz", x=np.zeros((8, 3)), y=np.zeros((8, 2)))
    assert cli("train", "--model", "two_out.onnx", "--data", "d.npz", "--epochs", "1", "--batch-size", "4",
               "--out", "r", "--verbose", "0") == 0
    err = capsys.readouterr().err
    assert "ortrain train: warning: weights dense_1.kernel, dense_1.bias do not affect the loss" in err
    assert "runs.py" not in err and len(err.strip().splitlines()) == 1


def test_predict_refuses_a_directory_or_a_missing_folder_as_output(workdir, capsys):
    make_artifacts(capsys)
    (workdir / "outdir").mkdir()
    assert cli("predict", "--artifacts", "art", "--data", "x.npy", "-o", "outdir") == 2
    assert "-o: 'outdir' is a directory" in capsys.readouterr().err
    assert not (workdir / "outdir.npy").exists()
    # into a folder that does not exist: named as export names it (it was a bare OS error after predicting)
    assert cli("predict", "--artifacts", "art", "--data", "x.npy", "-o", "missing/p.npy") != 0
    err = capsys.readouterr().err
    assert "-o: cannot write 'missing/p.npy': the directory 'missing' does not exist; create it first" in err
    assert "Errno" not in err and not (workdir / "missing").exists()



def test_predict_refuses_a_second_data_file_instead_of_dropping_its_rows(workdir, capsys):
    # `--data part1.npy part2.npy` predicted part1's rows and exited 0, ignoring part2 (X.npy Y.npy is
    # evaluate's form; for predict a second file can only be more inputs)
    make_artifacts(capsys)
    np.save("more.npy", np.load("x.npy")[:5])
    assert cli("predict", "--artifacts", "art", "--data", "x.npy", "more.npy", "-o", "p.npy") == 2
    err = capsys.readouterr().err
    assert ("--data: predict reads one file of inputs (FILE.npz, whose x it predicts, or X.npy); received 2 files "
            "('x.npy' 'more.npy'); predict each file in its own run, or join them into one with np.concatenate") in err
    assert not (workdir / "p.npy").exists()
    assert cli("predict", "--artifacts", "art", "--data", "x.npy", "-o", "p.npy") == 0
    assert np.load("p.npy").shape[0] == np.load("x.npy").shape[0]

TRAIN_ART = ["train", "--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "8",
             "--verbose", "0"]


@pytest.mark.parametrize("args,flag", [
    # `--out ""` trained into the current folder; the other paths were refused or taken in ways that named no
    # empty path
    (TRAIN_ART + ["--out", ""], "--out"),
    (["train", "--artifacts", "", "--data", "train.npz", "--epochs", "1", "--batch-size", "8"], "--artifacts"),
    (["train", "--model", "", "--data", "train.npz", "--epochs", "1", "--batch-size", "8"], "--model"),
    (["train", "--artifacts", "art", "--data", "", "--epochs", "1", "--batch-size", "8"], "--data"),
    (TRAIN_ART + ["--val-data", "test.npz", ""], "--val-data"),
    (["train", ""], "CONFIG"),
    (["train", "empty_out.toml"], "CONFIG: key 'out'"),
    (["demo", "--out", "", "--epochs", "1", "--verbose", "0"], "--out"),
    (["artifacts", "", "-o", "a2", "--loss", "mse"], "MODEL"),
    (["artifacts", "mlp.onnx", "-o", "", "--loss", "mse"], "-o"),
    (["eval", "--run", "", "--data", "test.npz"], "--run"),
    (["eval", "--artifacts", "art", "--checkpoint", "", "--data", "test.npz"], "--checkpoint"),
    (["predict", "--model", "", "--data", "x.npy"], "--model"),
    (["predict", "--artifacts", "art", "--data", "x.npy", "-o", ""], "-o"),
    (["export", "--artifacts", "art", "-o", ""], "-o"),
])
def test_an_empty_path_is_refused_as_a_usage_error(workdir, capsys, args, flag):
    make_artifacts(capsys)
    (workdir / "empty_out.toml").write_text("artifacts = 'art'\ndata = ['train.npz']\nbatch_size = 8\nepochs = 1\n"
                                            "out = ''\n")
    before = sorted(p.name for p in workdir.iterdir())
    assert cli(*args) == 2
    err = capsys.readouterr().err
    assert f": error: {flag}" in err and "a path, received an empty string; give a" in err
    # the hint names what the flag takes: '.' was offered to -o of predict and export, which then refused it
    folder = flag in ("--out", "--artifacts", "--run", "CONFIG: key 'out'") or args[0] == "artifacts" and flag == "-o"
    assert ("folder name ('.' for the" in err) == folder and ("give a file name" in err) == (not folder)
    if flag == "-o" and args[0] in ("predict", "export"):
        assert f"(e.g. '{'predictions.npy' if args[0] == 'predict' else 'model.onnx'}')" in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in workdir.iterdir()) == before


def _files_under(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_record_of_the_wrong_structure_is_damaged_not_a_traceback(workdir, capsys):
    # Valid JSON of another shape gave KeyError/TypeError tracebacks, and an empty state.json made
    # --resume start over from epoch 0, dropping the epochs done.
    make_artifacts(capsys)
    assert cli(*TRAIN_ART, "--epochs", "2", "--out", "run") == 0
    run_json, state_json = json.loads(Path("run/run.json").read_text()), json.loads(Path("run/state.json").read_text())
    no_history = {k: v for k, v in state_json.items() if k != "history"}
    cases = [("run.json", value, said) for value, said in (
        ({}, "it lacks 'artifacts'"), (None, "expected a JSON object of the run's settings, received None"),
        ("x", "received 'x'"), ({"settings": 5}, "it lacks 'artifacts'"), ({"artifacts": 3}, "'artifacts' expected a "
                                                                           "path, received 3"),
        ({**run_json, "settings": 5}, "'settings' expected an object, received 5"),
        ({**run_json, "batch_size": "32"}, "'batch_size' expected a positive integer, received '32'"),
        ({**run_json, "settings": {**run_json["settings"], "data": 5}}, "setting 'data' expected list, received 5"),
        ({**run_json, "settings": {**run_json["settings"], "data": [""]}},
         "setting 'data' expected paths, received an empty one"))]
    cases += [("state.json", value, said) for value, said in (
        ({}, "it lacks 'epoch'"), (None, "expected a JSON object of the epochs done, received None"),
        ("x", "received 'x'"), ({"checkpoint": 5}, "it lacks 'epoch'"),
        ({**state_json, "checkpoint": 5}, "'checkpoint' expected a path, received 5"),
        (no_history, "it lacks 'history'"),
        ({**state_json, "history": {"loss": [1.0]}}, "history 'loss' expected 2 numbers (one per epoch)"))]
    commands = (["eval", "--run", "run", "--data", "test.npz"], ["predict", "--run", "run", "--data", "x.npy"],
                ["export", "--run", "run", "-o", "m.onnx"],
                ["train", "--out", "run", "--resume", "--epochs", "3", "--verbose", "0"], ["train", "--out", "run",
                                                                                          "--resume"])
    good = {"run.json": Path("run/run.json").read_text(), "state.json": Path("run/state.json").read_text()}
    for name, value, said in cases:
        Path("run", name).write_text(json.dumps(value))
        before, listing = _files_under(workdir / "run"), sorted(os.listdir(workdir))
        for command in commands:
            assert cli(*command) == 1, (name, value, command)
            err = capsys.readouterr().err
            what = "run settings" if name == "run.json" else "run state"
            assert f"{what} 'run/{name}' is damaged: " in err and said in err, (err, command)
            assert "restore it from a copy" in err and len(err.strip().splitlines()) == 1
            assert _files_under(workdir / "run") == before and sorted(os.listdir(workdir)) == listing
        Path("run", name).write_text(good[name])
    # a JSON syntax error reads the same, with the same fix
    Path("run/state.json").write_text('{"epoch": 2,')
    assert cli("train", "--out", "run", "--resume", "--epochs", "3", "--verbose", "0") == 1
    err = capsys.readouterr().err
    assert "run state 'run/state.json' is damaged: " in err and "restore it from a copy, or start the run again" in err


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_eval_refuses_data_with_nan_or_inf_as_train_does(workdir, capsys, bad):
    # The README's exit codes: 1 for data whose values do not fit the model, NaN included; eval
    # printed a NaN loss and exited 0.
    make_artifacts(capsys)
    x, y = load_digits()
    x = x[1500:].copy()
    x[4, 7] = bad
    np.savez("bad.npz", x=x, y=y[1500:])
    assert cli("eval", "--artifacts", "art", "--data", "bad.npz") == 1
    assert f"ortrain eval: x of --data 'bad.npz': holds {bad} in row 4; ortrain eval takes finite values only, so " \
           "nothing was evaluated" in capsys.readouterr().err
    assert cli("eval", "--artifacts", "art", "--data", "test.npz") == 0


def test_eval_predict_export_refuse_a_run_without_trained_weights(workdir, capsys, monkeypatch):
    # A run stopped in its first epoch holds no state.json: its untrained initial weights were used
    # without a word. A checkpoint missing from a run was reported as "--checkpoint: no such file".
    make_artifacts(capsys)
    from ortrain import fit as fit_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(fit_mod, "train", interrupted)
    assert cli(*TRAIN_ART, "--out", "run") == 130
    capsys.readouterr()
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert (workdir / "run" / "run.json").is_file() and not (workdir / "run" / "state.json").exists()
    commands = (["eval", "--run", "run", "--data", "test.npz"], ["predict", "--run", "run", "--data", "x.npy"],
                ["export", "--run", "run", "-o", "m.onnx"])
    listing = sorted(os.listdir(workdir))
    for command in commands:
        assert cli(*command) == 1
        err = capsys.readouterr().err
        assert "--run: no epoch of the run in 'run' has completed yet (it has no state.json), so it holds no trained " \
               "weights; train it first with `ortrain train --out run --resume`" in err
        assert len(err.strip().splitlines()) == 1 and sorted(os.listdir(workdir)) == listing
    assert cli("eval", "--run", "run", "--checkpoint", "art/checkpoint", "--data", "test.npz") == 0  # weights given


def test_a_checkpoint_missing_from_a_run_is_named_as_the_runs_file(workdir, capsys):
    # It was reported as "--checkpoint: no such file", an option the command was not given.
    make_artifacts(capsys)
    assert cli(*TRAIN_ART, "--epochs", "2", "--out", "run") == 0
    capsys.readouterr()
    commands = (["eval", "--run", "run", "--data", "test.npz"], ["predict", "--run", "run", "--data", "x.npy"],
                ["export", "--run", "run", "-o", "m.onnx"])
    (workdir / "run" / "checkpoints" / "epoch-0002.ckpt").unlink()
    before = _files_under(workdir / "run")
    for command in (*commands, ["train", "--out", "run", "--resume", "--epochs", "3", "--verbose", "0"]):
        assert cli(*command) == 1
        err = capsys.readouterr().err
        assert "run state 'run/state.json' names the checkpoint 'run/checkpoints/epoch-0002.ckpt', which does not " \
               "exist; the run is damaged: restore the file, or " in err and "--checkpoint: no such file" not in err
        assert len(err.strip().splitlines()) == 1 and _files_under(workdir / "run") == before
    assert cli("eval", "--run", "run", "--checkpoint", "run/checkpoints/epoch-0001.ckpt", "--data", "test.npz") == 0


def test_a_resume_on_other_data_is_continued_on_that_data(workdir, capsys, monkeypatch):
    # A resume that changed the data, the validation data or the metrics and was then interrupted
    # went back, on the plain --resume its message advises, to those the run started with.
    from ortrain.cli.run_dir import RunRecorder
    make_artifacts(capsys)
    x, y = load_digits()
    np.savez("b.npz", x=x[600:1200], y=y[600:1200])
    np.savez("vb.npz", x=x[1200:1500], y=y[1200:1500])
    for out in ("straight", "stopped", "killed"):
        assert cli("train", "--artifacts", "art", "--data", "train.npz", "--val-data", "test.npz", "--batch-size",
                   "32", "--seed", "4", "--epochs", "1", "--out", out, "--verbose", "0") == 0
    changed = ["--data", "b.npz", "--val-data", "vb.npz", "--metrics", "accuracy", "--verbose", "0"]
    # a refused resume records nothing
    np.savez("wrong.npz", x=np.zeros((20, 5)), y=np.zeros(20, np.int64))
    record = (workdir / "killed" / "run.json").read_bytes()
    assert cli("train", "--out", "killed", "--resume", *changed[2:], "--data", "wrong.npz", "--epochs", "4") == 1
    assert (workdir / "killed" / "run.json").read_bytes() == record
    capsys.readouterr()
    assert cli("train", "--out", "straight", "--resume", *changed, "--epochs", "4") == 0
    assert cli("train", "--out", "stopped", "--resume", *changed, "--epochs", "2") == 0
    assert cli("train", "--out", "stopped", "--resume", "--epochs", "4", "--verbose", "0") == 0
    real = RunRecorder.on_epoch_end

    def stop_after_the_third(self, epoch, logs=None):
        real(self, epoch, logs)
        if epoch == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(RunRecorder, "on_epoch_end", stop_after_the_third)
    assert cli("train", "--out", "killed", "--resume", *changed, "--epochs", "4") == 130
    assert "continue it with --resume" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert cli("train", "--out", "killed", "--resume", "--verbose", "0") == 0   # as the message advises
    straight = weights("straight/model.onnx")
    history = json.loads((workdir / "straight" / "history.json").read_text())
    assert history["epoch"] == [0, 1, 2, 3] and history["history"]["accuracy"][0] is None
    for out in ("stopped", "killed"):
        assert {n: w.tobytes() for n, w in weights(f"{out}/model.onnx").items()} == \
            {n: w.tobytes() for n, w in straight.items()}, out
        assert json.loads((workdir / out / "history.json").read_text()) == history, out
    settings = json.loads((workdir / "killed" / "run.json").read_text())["settings"]
    assert settings["data"] == [str(workdir / "b.npz")] and settings["val_data"] == [str(workdir / "vb.npz")]
    assert settings["metrics"] == ["accuracy"] and settings["epochs"] == 4
    # a resume's --val-split replaces the run's --val-data (it was ignored beside it)
    assert cli("train", "--out", "killed", "--resume", "--val-split", "0.5", "--epochs", "5", "--verbose", "0") == 0
    settings = json.loads((workdir / "killed" / "run.json").read_text())["settings"]
    assert settings["val_split"] == 0.5 and "val_data" not in settings
    val_loss = json.loads((workdir / "killed" / "history.json").read_text())["history"]["val_loss"]
    trained = ot.from_onnx(workdir / "killed" / "model.onnx")
    trained.compile(loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert val_loss[-1] == pytest.approx(trained.evaluate(x[900:1200], y[900:1200])["loss"], rel=1e-5)


def test_a_resume_of_a_completed_run_writes_its_missing_plot(workdir, capsys, monkeypatch):
    # Stopped after model.onnx and before loss.png, the run answered "already completed" and never
    # wrote the plot.
    pytest.importorskip("matplotlib")
    from ortrain.cli import runs
    make_artifacts(capsys)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(runs, "_plot", stop)
    assert cli(*TRAIN_ART, "--epochs", "2", "--out", "run") == 130
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    run = workdir / "run"
    assert (run / "model.onnx").is_file() and not (run / "loss.png").exists()
    model = (run / "model.onnx").read_bytes()
    capsys.readouterr()
    assert cli("--json", "train", "--out", "run", "--resume", "--verbose", "0") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["note"] == "the run already completed 2 epochs; pass --epochs above 2 to train further; wrote its " \
                             "missing loss.png"
    assert result["plot"] == str(Path("run") / "loss.png") and (run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "model.onnx").read_bytes() == model
    assert cli("--json", "train", "--out", "run", "--resume", "--verbose", "0") == 0   # nothing missing now
    assert json.loads(capsys.readouterr().out)["note"].endswith("to train further")
    (run / "model.onnx").unlink()
    (run / "loss.png").unlink()
    assert cli("--json", "train", "--out", "run", "--resume", "--verbose", "0") == 0
    assert json.loads(capsys.readouterr().out)["note"].endswith("; wrote its missing model.onnx and loss.png")
    assert (run / "model.onnx").read_bytes() == model and (run / "loss.png").is_file()


def test_train_refuses_rows_a_fixed_batch_cannot_take_before_the_run_starts(tmp_path, monkeypatch, capsys):
    # the run trained four steps, then failed on the short last batch
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("MatMul", ["r", "W"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
                          [numpy_helper.from_array(np.array([4, 6], np.int64), "s"),
                           numpy_helper.from_array(np.ones((6, 2), np.float32), "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "pin.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((18, 2, 3), np.float32), y=rng.random((18, 2), np.float32))
    monkeypatch.chdir(tmp_path)
    assert cli("train", "--model", "pin.onnx", "--loss", "mse", "--data", "d.npz", "--epochs", "1",
               "--batch-size", "4", "--out", "run") == 1
    err = capsys.readouterr().err
    assert "holds 18 rows, not a multiple of the 4 rows the model's graph fixes" in err
    assert "drop the last 2 rows" in err and not (tmp_path / "run").exists()
    assert cli("train", "--model", "pin.onnx", "--loss", "mse", "--data", "d.npz", "--epochs", "1",
               "--batch-size", "8", "--out", "run") == 1
    err = capsys.readouterr().err
    assert "ortrain train: --batch-size 8: " in err and "use --batch-size 4" in err and "batch_size=" not in err



def test_an_option_on_the_command_line_replaces_the_choice_a_config_made_the_other_way(workdir, capsys):
    # val_data in the file and --val-split on the command line were refused as "both"; the command
    # line replaces the file's values everywhere else
    make_artifacts(capsys)
    (workdir / "val.toml").write_text("artifacts = 'art'\ndata = ['train.npz']\nbatch_size = 8\nepochs = 1\n"
                                      "val_data = ['test.npz']\n")
    assert cli("train", "val.toml", "--val-split", "0.5", "--out", "r", "--json") == 0
    run = json.loads((workdir / "r" / "run.json").read_text())
    assert run["settings"].get("val_split") == 0.5 and not run["settings"].get("val_data"), run
    # --artifacts replaces the file's model and what goes with it: its loss was refused as "--loss,
    # --from-logits: drop them", options the command line never gave
    (workdir / "model.toml").write_text("model = 'mlp.onnx'\nloss = 'sparse_categorical_crossentropy'\n"
                                        "from_logits = true\ndata = ['train.npz']\nbatch_size = 8\nepochs = 1\n")
    assert cli("train", "model.toml", "--artifacts", "art", "--out", "r2", "--json") == 0
    run = json.loads((workdir / "r2" / "run.json").read_text())
    assert not run["settings"].get("model") and not run["settings"].get("loss"), run
    assert cli("train", "model.toml", "--artifacts", "art", "--loss", "mse", "--out", "r3") == 2  # given: refused
    assert "--loss: the loss, the optimizer and which weights train are fixed by the artifacts" in \
        capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["artifacts", "mlp.onnx", "-o", "A", "--loss", "mse", "--trainable", "zz*"], "ortrain artifacts: --trainable: 'zz*' "
                                                                                  "matches no weight"),
    (["artifacts", "mlp.onnx", "-o", "A", "--loss", "mse", "--frozen", "*"], "unfreeze some weights (--trainable, "
                                                                             "--frozen)"),
    (["artifacts", "mlp.onnx", "-o", "A", "--loss", "mse", "--trainable", "dense_0.*", "--frozen", "dense_0.*"],
     "ortrain artifacts: --trainable and --frozen both list 'dense_0.*'"),
    (["predict", "--model", "junk.onnx", "--data", "x.npy"], "ortrain predict: --model: 'junk.onnx' is not an ONNX "
                                                             "model"),
])
def test_messages_name_the_command_lines_options_not_the_python_api(workdir, capsys, args, says):
    (workdir / "junk.onnx").write_text("junk")
    (workdir / "other").mkdir()
    (workdir / "other" / "notes.txt").write_text("mine")
    assert cli(*args) == 1
    err = capsys.readouterr().err
    assert says in err
    for python in ("from_onnx", "out_dir", "model.unfreeze", "ot.artifacts.build", "export_onnx"):
        assert python not in err


def test_an_environment_ortrain_cannot_run_in_is_one_line_from_the_command(tmp_path):
    # every command ended in a traceback of the package import (an inference-only onnxruntime
    # installed over the training build), where the README promises a one-line reason
    fake = tmp_path / "onnxruntime"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "1.19.2"\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ortrain"  # as pip writes the console script
    script.write_text("import sys\nfrom ortrain.cli import main\nsys.exit(main())\n")
    for command in ([sys.executable, "-m", "ortrain", "info"], [sys.executable, "-mortrain", "info"],
                    [sys.executable, str(script), "info"]):
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ortrain: ortrain cannot start: - onnxruntime-training")
    user = tmp_path / "train.py"
    user.write_text("import ortrain\n")
    # other programs importing ortrain get the exception, whatever their own options say
    for command in ([sys.executable, "-c", "import ortrain"], [sys.executable, str(user), "-m", "ortrain"]):
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
        assert out.returncode == 1 and "OrtrainError: ortrain cannot start" in out.stderr  # raised


def test_a_model_file_that_is_no_onnx_is_named_as_the_commands_argument(tmp_path, capsys):
    # `ortrain artifacts` named "--model", an option it has not, and an empty file went unnamed
    bad, empty = tmp_path / "g.onnx", tmp_path / "e.onnx"
    bad.write_bytes(b"not onnx")
    empty.write_bytes(b"")
    for path, reason in ((bad, "is not an ONNX model: the protobuf does not parse"),
                         (empty, r"is not an ONNX model \(no graph, nodes or outputs\)")):
        assert main(["artifacts", str(path), "-o", str(tmp_path / "a"), "--loss", "mse"]) == 1
        err = capsys.readouterr().err
        assert re.search(rf"^ortrain artifacts: MODEL: '{re.escape(str(path))}' {reason}", err), err
    assert not (tmp_path / "a").exists()


def test_a_reader_that_closes_the_pipe_early(workdir):
    # `ortrain info | head -1` printed a BrokenPipeError traceback and exited 1 after the command had
    # done its work; a training run writing progress into a closed pipe said "[Errno 32] Broken pipe"
    def piped(*args):
        proc = subprocess.Popen([sys.executable, "-m", "ortrain", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=workdir, env={**os.environ, "PYTHONPATH": REPO})
        proc.stdout.close()  # the reader is gone before anything is written
        err = proc.stderr.read().decode()
        return proc.wait(timeout=120), err

    for args in (("info",), ("--json", "info")):
        code, err = piped(*args)
        assert (code, err) == (0, "")
    code, err = piped("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
                      "--data", "train.npz", "--epochs", "3", "--batch-size", "64", "--out", "runs/a")
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "ortrain train: stopped: the reader of its output closed the pipe (send the output to a file, or pass --json "
        "for the result alone); the run in 'runs/a' keeps its completed epochs, continue it with --resume"]
    assert cli("train", "--out", "runs/a", "--resume", "--epochs", "3") == 0


def test_several_patterns_after_one_flag_are_told_to_repeat_the_flag(workdir, capsys):
    # --frozen takes one pattern per flag: a second pattern was "CONFIG: no such file" (train) or an
    # unrecognised argument (artifacts)
    for args in (("artifacts", "mlp.onnx", "-o", "art", "--loss", "mse", "--frozen", "dense_0.*", "dense_1.bias"),
                 ("train", "--model", "mlp.onnx", "--loss", "mse", "--data", "train.npz", "--trainable", "dense_1.*",
                  "dense_0.bias", "--out", "runs/a")):
        assert cli(*args) == 2
        flag = args[args.index("dense_0.*") - 1] if "dense_0.*" in args else "--trainable"
        first, second = (("dense_0.*", "dense_1.bias") if flag == "--frozen" else ("dense_1.*", "dense_0.bias"))
        assert capsys.readouterr().err.strip() == (f"ortrain {args[0]}: error: {flag} takes one pattern; repeat the "
                                                   f"option for each: {flag} '{first}' {flag} '{second}'")
    assert sorted(os.listdir(workdir)) == ["mlp.onnx", "test.npz", "train.npz", "x.npy", "y.npy"]
    assert cli("artifacts", "-o", "art", "--loss", "mse", "--frozen", "dense_0.*", "mlp.onnx") == 0  # the model after


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, where folders cannot be made")
def test_a_failed_demo_leaves_no_folder_it_made(tmp_path, monkeypatch, capsys):
    # a demo that failed (here its artifact cache cannot be written) left its --out folder behind,
    # holding only its mark
    monkeypatch.chdir(tmp_path)
    previous = ot.artifacts.cache_dir()
    ot.artifacts.set_cache_dir("/proc/ortrain-cache")
    try:
        assert cli("demo", "--out", "new", "--epochs", "1", "--verbose", "0") == 1
        (tmp_path / "mine").mkdir()
        assert cli("demo", "--out", "mine", "--epochs", "1", "--verbose", "0") == 1
    finally:
        ot.artifacts.set_cache_dir(previous)
    assert "the artifact cache '/proc/ortrain-cache' cannot be written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # a folder it did not make stays


def test_an_interrupted_demo_leaves_the_earlier_demos_files_as_they_were(tmp_path, monkeypatch, capsys, ctrl_c):
    # Ctrl-C after the export left model.onnx of the interrupted demo beside model.ortrain,
    # summary.json, history.csv and loss.png of the earlier one
    import onnx.reference

    from ortrain._files import lock_file
    monkeypatch.chdir(tmp_path)
    assert cli("demo", "--out", "d", "--epochs", "1", "--verbose", "0") == 0
    files = lambda: {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()}  # noqa: E731
    before = files()
    assert {"model.onnx", "model.ortrain", "summary.json", "history.csv", ".ortrain-demo"} <= set(before)

    def interrupt(*args, **kwargs):  # after model.onnx is written and checked by onnxruntime
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(onnx.reference, "ReferenceEvaluator", interrupt)
        assert cli("demo", "--out", "d", "--epochs", "2", "--verbose", "0") == 130
    assert files() == before
    (tmp_path / "d" / ".ortrain-demo.new-k1ll3d_x").mkdir()  # what a demo killed (SIGKILL) left
    (tmp_path / "d" / ".ortrain-demo.new-k1ll3d_x" / "model.onnx").write_bytes(b"half")
    (tmp_path / "d" / "notes.txt").write_text("mine")
    assert cli("demo", "--out", "d", "--epochs", "2", "--verbose", "0") == 0
    after = files()
    assert sorted(after) == sorted([*before, "notes.txt"])
    assert json.loads(after["summary.json"])["epochs"] == 2 and after["model.onnx"] != before["model.onnx"]
    model = ot.load_model(tmp_path / "d" / "model.ortrain")  # the files are one demo's
    onnx_weights = [numpy_helper.to_array(t) for t in onnx.load(tmp_path / "d" / "model.onnx").graph.initializer]
    assert all(any(w.shape == a.shape and np.array_equal(w, a) for a in onnx_weights) for w in model.get_weights())
    assert len((tmp_path / "d" / "history.csv").read_text().splitlines()) == 3  # a header and two epochs
    from ortrain.cli import demo
    commit = demo._commit
    for sig in (signal.SIGINT, signal.SIGTERM):  # sent while the files go in: they go in, then it stops
        def interrupted_commit(stage, out_dir, sig=sig):
            os.kill(os.getpid(), sig)
            time.sleep(0.05)  # (the signal's handler has run)
            commit(stage, out_dir)

        with monkeypatch.context() as m:
            m.setattr(demo, "_commit", interrupted_commit)
            assert cli("demo", "--out", f"new{sig}", "--epochs", "1", "--verbose", "0") == 130
        made = {p.name for p in (tmp_path / f"new{sig}").iterdir()}  # a folder the demo made is kept
        assert {"model.onnx", "model.ortrain", "summary.json", "history.csv"} <= made and \
            not any(n.startswith(".ortrain-demo.new-") for n in made)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    holder = lock_file(tmp_path / "d" / ".ortrain-demo", wait=False)  # a demo writing there now
    try:
        capsys.readouterr()
        assert cli("demo", "--out", "d", "--epochs", "1", "--verbose", "0") == 2
        assert "--out: another ortrain demo is writing to 'd'" in capsys.readouterr().err
    finally:
        holder.close()
    assert files() == after


def test_the_demos_renames_hold_signals_back_and_deliver_them_after(ctrl_c):
    # a signal held during the renames was dropped when the renames failed, a second one was
    # dropped, and a Ctrl-C as the handlers went back could leave the holding handler installed
    from ortrain.cli import demo
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(KeyboardInterrupt):
            with demo._signals_held():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGTERM)
                assert seen == []  # held while the block runs
        assert seen == [signal.SIGTERM]  # then both: SIGTERM first, then Ctrl-C's KeyboardInterrupt
        with pytest.raises(OSError, match="disk full"):
            with demo._signals_held():
                signal.raise_signal(signal.SIGTERM)
                raise OSError("disk full")
        assert seen == [signal.SIGTERM] * 2  # delivered although the block failed
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_output_path_that_is_not_utf8_is_refused_before_anything_runs(workdir, capsys):
    # the demo trained, then ended in onnxruntime's TypeError (its InferenceSession takes UTF-8 paths
    # only); train and artifacts failed at their first checkpoint, naming an internal path
    latin1 = os.fsdecode(b"r\xe9sultats")  # a Latin-1 name, as older systems and archives write them
    before = sorted(os.listdir("."))
    for args, flag in ((["demo", "--out", latin1, "--epochs", "1", "--verbose", "0"], "--out"),
                       (["train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy",
                         "--from-logits", "--data", "train.npz", "--epochs", "1", "--batch-size", "32", "--out",
                         latin1, "--verbose", "0"], "--out"),
                       (["artifacts", "mlp.onnx", "-o", latin1, "--loss", "mse"], "-o")):
        capsys.readouterr()
        assert cli(*args) == 2
        err = capsys.readouterr().err
        assert f"{flag}: {latin1!r}: its name is not valid UTF-8" in err and "nothing was written" in err
        assert sorted(os.listdir(".")) == before
    os.mkdir(latin1)  # a UTF-8 name inside a folder whose name is not
    os.chdir(latin1)
    assert cli("demo", "--out", "d", "--epochs", "1", "--verbose", "0") == 2
    assert "--out: 'd': the path of the folder it lies in is not valid UTF-8" in capsys.readouterr().err
    assert os.listdir(".") == []


def test_non_finite_validation_rows_are_refused_as_training_rows_are(workdir, capsys):
    # a NaN in --val-data (or in the rows --val-split holds out) trained on, every val_loss NaN, exit 0
    x, y = load_digits()
    bad = x[600:700].copy()
    bad[5, 3] = np.nan
    np.savez("nan.npz", x=bad, y=y[600:700])
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "train.npz", "--val-data", "nan.npz", "--epochs", "1", "--batch-size", "32", "--out", "runs/a") == 1
    assert capsys.readouterr().err.strip() == (
        "ortrain train: x of --val-data 'nan.npz': holds nan in row 5; validation needs finite values, so nothing "
        "was trained (drop or repair that sample)")
    held = x[:600].copy()
    held[590, 0] = np.inf  # in the last tenth, which --val-split holds out
    np.savez("inf.npz", x=held, y=y[:600])
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "inf.npz", "--val-split", "0.1", "--epochs", "1", "--batch-size", "32", "--out", "runs/b") == 1
    assert "x of --data 'inf.npz' (the rows --val-split holds out): holds inf in row 590" in capsys.readouterr().err
    for key in ("y", "sample_weight"):  # the file of the other arrays too
        np.savez("bad.npz", **{"x": x[600:700], "y": y[600:700].astype(np.float32),
                               "sample_weight": np.ones(100, np.float32), key: np.full(100, np.inf, np.float32)})
        assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
                   "--data", "train.npz", "--val-data", "bad.npz", "--epochs", "1", "--batch-size", "32",
                   "--out", "runs/c") == 1
        assert f"{key} of --val-data 'bad.npz'" in capsys.readouterr().err
    assert not os.path.exists("runs")


def test_a_run_whose_artifacts_moved_says_to_put_them_back(workdir, capsys):
    # "does not exist (moved or deleted?): give the path of an artifacts directory", and --artifacts
    # with the new path was then refused as differing from the run's
    make_artifacts(capsys)
    os.rename("art", "art2")
    assert cli("train", "--artifacts", "art2", "--data", "train.npz", "--epochs", "1", "--batch-size", "64",
               "--out", "r", "--verbose", "0") == 0
    os.rename("art2", "art3")
    capsys.readouterr()
    for args in (("train", "--out", "r", "--resume", "--epochs", "2"), ("export", "--run", "r", "-o", "m.onnx"),
                 ("eval", "--run", "r", "--data", "test.npz")):
        assert cli(*args) == 1
        err = capsys.readouterr().err
        assert f"the run's artifacts {str(workdir / 'art2')!r} do not exist (moved or deleted?)" in err
        assert "put them back there" in err and not os.path.exists("m.onnx")
    os.rename("art3", "art2")
    assert cli("train", "--out", "r", "--resume", "--epochs", "2", "--verbose", "0") == 0



def test_a_run_on_a_deleted_cache_entry_says_to_build_it_again(workdir, capsys, tmp_path):
    # the README calls deleting the cache safe; a run started on an entry said only "put them back there"
    ot.artifacts.set_cache_dir(tmp_path / "cache")
    built = ot.artifacts.build("mlp.onnx", loss="mse", optimizer="adam")
    x, _ = load_digits()
    np.savez("reg.npz", x=x[:64], y=np.zeros((64, 10), np.float32))
    assert cli("train", "--artifacts", built.directory, "--data", "reg.npz", "--epochs", "1", "--batch-size",
               "16", "--out", "r", "--verbose", "0") == 0
    shutil.rmtree(tmp_path / "cache")
    capsys.readouterr()
    assert cli("export", "--run", "r", "-o", "m.onnx") == 1
    err = capsys.readouterr().err
    assert (f"they were an entry of ortrain's artifact cache ({str(tmp_path / 'cache')!r}), deleted since; "
            "build them again as before (ot.artifacts.build with the same model") in err
    assert not os.path.exists("m.onnx")
    assert ot.artifacts.build("mlp.onnx", loss="mse", optimizer="adam").directory == built.directory
    assert cli("export", "--run", "r", "-o", "m.onnx") == 0


def test_a_resume_whose_recorded_data_moved_says_to_give_its_new_path(workdir, capsys):
    # "--data: no such file", naming an option the resume was not given, and no fix
    x, y = load_digits()
    np.savez("val.npz", x=x[600:700], y=y[600:700])
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "x.npy", "y.npy", "--val-data", "val.npz", "--epochs", "1", "--batch-size", "64",
               "--out", "r", "--verbose", "0") == 0
    os.rename("y.npy", "labels.npy")
    os.rename("val.npz", "held.npz")
    capsys.readouterr()
    before = {p: p.read_bytes() for p in (workdir / "r").rglob("*") if p.is_file()}
    assert cli("train", "--out", "r", "--resume", "--epochs", "2") == 2
    assert capsys.readouterr().err.strip() == (
        f"ortrain train: error: train --resume: the run's --data file {str(workdir / 'y.npy')!r} (recorded in "
        f"'r/run.json') no longer exists (moved or deleted?); resume with --data and the data's new path")
    assert cli("train", "--out", "r", "--resume", "--epochs", "2", "--data", "x.npy", "labels.npy") == 2
    assert f"the run's --val-data file {str(workdir / 'val.npz')!r}" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (workdir / "r").rglob("*") if p.is_file()} == before
    assert cli("train", "--out", "r", "--resume", "--epochs", "2", "--data", "x.npy", "labels.npy", "--val-split",
               "0.1", "--verbose", "0") == 0  # other validation given now: the run's file is not needed
    assert json.loads((workdir / "r" / "state.json").read_text())["epoch"] == 2


def test_a_run_whose_own_artifacts_were_deleted_is_told_the_command_that_builds_them_again(workdir, capsys):
    # "put them back there", for artifacts the run had built itself from --model
    import shlex

    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.normal(size=shape) * 0.1).astype(np.float32), name)
             for name, shape in (("w1", (64, 32)), ("b1", (32,)), ("w2", (32, 10)), ("b2", (10,)))]
    inits += [numpy_helper.from_array(np.array(0.3, np.float32), "ratio"), numpy_helper.from_array(np.array(True),
                                                                                                   "training")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Dropout", ["r", "ratio", "training"], ["d"]),  # a training-mode export's, unseeded
             helper.make_node("Gemm", ["d", "w2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "drop.onnx")
    assert cli("train", "--model", "drop.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05", "--frozen", "b*", "--data",
               "train.npz", "--epochs", "1", "--batch-size", "64", "--out", "a", "--seed", "7", "--verbose", "0") == 0
    for name in ("b", "c"):
        shutil.copytree("a", name)
        shutil.rmtree(Path(name) / "artifacts")
    assert cli("train", "--out", "a", "--resume", "--epochs", "2", "--verbose", "0") == 0
    capsys.readouterr()
    assert cli("train", "--out", "b", "--resume", "--epochs", "2") == 1
    err = capsys.readouterr().err
    assert "the run's artifacts 'b/artifacts' do not exist (moved or deleted?)" in err
    command = shlex.split(err.split("build them again as the run did: ")[1])
    assert command[:2] == ["ortrain", "artifacts"] and command[command.index("--seed") + 1] == "7"
    assert cli(*command[1:]) == 0
    assert cli("train", "--out", "b", "--resume", "--epochs", "2", "--verbose", "0") == 0
    reference, rebuilt = weights("a/model.onnx"), weights("b/model.onnx")
    assert all(np.array_equal(reference[k], rebuilt[k]) for k in reference)  # bit for bit, dropout masks included
    other = command[1:-1] + ["8"]  # the seed is part of what was built: another one is not the run's
    other[other.index("b/artifacts")] = "c/artifacts"
    assert cli(*other) == 0
    capsys.readouterr()
    assert cli("train", "--out", "c", "--resume", "--epochs", "2", "--verbose", "0") == 1
    err = capsys.readouterr().err
    assert "the artifacts in 'c/artifacts' were rebuilt after the run 'c' started and differ from those its " \
        "checkpoint was written for in the seeds of the dropout (or other random ops) alone (ortrain artifacts " \
        "--seed)" in err
    assert f"build them again as the run did: {shlex.join(command).replace('b/artifacts', 'c/artifacts')}" in err


def test_a_run_whose_own_artifacts_are_gone_does_not_take_the_working_directorys(workdir, capsys):
    # with r/artifacts deleted, the run fell back to ./artifacts (the old layout's working-directory
    # path) and trained from whatever was there
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--data", "train.npz", "--epochs", "1", "--batch-size", "64", "--out", "r", "--verbose", "0") == 0
    shutil.copytree(workdir / "r" / "artifacts", workdir / "artifacts")
    shutil.rmtree(workdir / "r" / "artifacts")
    capsys.readouterr()
    assert cli("train", "--out", "r", "--resume", "--epochs", "2", "--verbose", "0") == 1
    assert "the run's artifacts 'r/artifacts' do not exist" in capsys.readouterr().err


def test_a_resume_names_a_config_files_value_as_the_files(workdir, capsys):
    # started with the config's model replaced by --artifacts, a resume with the same config was refused
    # for "--model", an option not given, at a path not normalised
    make_artifacts(capsys)
    (workdir / "cfg").mkdir()
    (workdir / "cfg" / "c.toml").write_text("model = '../mlp.onnx'\nloss = 'sparse_categorical_crossentropy'\n"
                                            "data = ['../train.npz']\nbatch_size = 64\nepochs = 1\n")
    assert cli("train", "cfg/c.toml", "--artifacts", "art", "--out", "r", "--verbose", "0") == 0
    capsys.readouterr()
    assert cli("train", "cfg/c.toml", "--resume", "--out", "r", "--epochs", "2") == 2
    err = capsys.readouterr().err
    assert f"train --resume: model (from the config file) {str(workdir / 'mlp.onnx')!r} differs from" in err
    assert cli("train", "cfg/c.toml", "--resume", "--artifacts", "art", "--out", "r", "--epochs", "2",
               "--verbose", "0") == 0


def test_a_run_that_cannot_write_its_model_says_resume_not_another_folder():
    # `train` has no -o, and a run's model.onnx cannot go elsewhere: it was "-o: cannot write
    # 'r/model.onnx' ... choose another folder"
    from ortrain.cli import _for_command_line
    failed = ("export_onnx(path): cannot write 'r/model.onnx': No space left on device; a file already there is left "
              "as it was. Free space or choose another folder")
    assert _for_command_line(failed, "train") == (
        "--out: cannot write 'r/model.onnx': No space left on device. Free space, then run the same command again "
        "(with --resume once the run's folder holds run.json)")
    denied = ("cannot write 'r/state.json': Permission denied; a file already there is left as it was. Choose a folder "
              "you can write to")
    assert _for_command_line(denied, "train") == (
        "--out: cannot write 'r/state.json': Permission denied. Make the run's folder writable, then run the same "
        "command again (with --resume once the run's folder holds run.json)")
    assert _for_command_line(failed, "export").startswith("-o: cannot write 'r/model.onnx'")
    unwritable = "save_checkpoint(path): cannot write 'r/c.ckpt': Operation not permitted; choose a folder you can write to"
    assert _for_command_line(unwritable, "train") == (
        "--out: cannot write 'r/c.ckpt': Operation not permitted. Make the run's folder writable, then run the same "
        "command again (with --resume once the run's folder holds run.json)")
    quoted = failed.replace("'r/model.onnx'", '"r/it\'s/model.onnx"')
    assert _for_command_line(quoted, "train").startswith("--out: cannot write \"r/it's/model.onnx\": No space")
    artifacts = ("artifacts: cannot write 'r/artifacts': File too large; nothing was published. Raise the limit or "
                 "choose another folder (out_dir, or ot.artifacts.set_cache_dir for the cache)")
    assert _for_command_line(artifacts, "train").endswith("choose another folder (--out)")
    assert _for_command_line(artifacts, "artifacts").endswith("choose another folder (-o)")


def test_a_folder_path_with_a_leading_tilde_or_a_link_to_nothing_is_refused(workdir, capsys):
    # "~/r" quoted on the command line or written in a config made a folder named "~"; a link to a
    # folder that does not exist said "cannot write 'dangling': File exists"
    base = ["--artifacts", "art", "--data", "train.npz", "--epochs", "1", "--batch-size", "32", "--verbose", "0"]
    make_artifacts(capsys)
    assert cli("train", *base, "--out", "~/r") == 2
    assert "--out: '~/r' starts with '~', which is no home folder here (nothing expanded it) and would be made as a " \
        "folder of that name in the current one; give os.path.expanduser(path), or leave ~ unquoted in a shell" \
        in capsys.readouterr().err
    assert cli("artifacts", "mlp.onnx", "-o", "~/a", "--loss", "mse") == 2
    assert "-o: '~/a' starts with '~'" in capsys.readouterr().err
    (workdir / "dangling").symlink_to(workdir / "gone" / "r")
    assert cli("train", *base, "--out", "dangling") == 2
    assert f"--out: 'dangling' is a symbolic link to {str(workdir / 'gone' / 'r')!r}, which does not exist" \
        in capsys.readouterr().err
    (workdir / "c.toml").write_text('artifacts = "art"\ndata = ["train.npz"]\nepochs = 1\nbatch_size = 32\n'
                                    'out = "~/runs"\nverbose = 0\n')
    assert cli("train", "c.toml") == 2
    assert "CONFIG: key 'out' holds '~/runs', whose leading '~' is no home folder here" in capsys.readouterr().err
    assert not (workdir / "~").exists() and not (workdir / "gone").exists()
    with pytest.raises(ot.OrtrainError, match=r"out_dir: '~/b' starts with '~', which is no home folder here"):
        ot.artifacts.build(ot.from_onnx("mlp.onnx"), loss="mse", out_dir="~/b")
    cache = ot.artifacts.cache_dir()
    with pytest.raises(ot.OrtrainError, match=r"set_cache_dir\(path=...\): '~/c' starts with '~'.*the cache is unchanged"):
        ot.artifacts.set_cache_dir("~/c")
    assert ot.artifacts.cache_dir() == cache
    assert not (workdir / "~").exists()
    # ./~ names a folder called ~ on purpose, and once there, ~/r is taken as in it
    assert cli("train", *base, "--out", "./~/r") == 0 and (workdir / "~" / "r" / "run.json").is_file()
    assert cli("train", *base, "--out", "~/r2") == 0 and (workdir / "~" / "r2" / "run.json").is_file()


def test_sgd_momentum_from_the_command_line_trains_as_the_api_does(workdir, capsys):
    # `ortrain artifacts --optimizer sgd --momentum M` and `ortrain train --model ... --momentum M`
    # train as Model.fit with ot.optim.SGD(momentum=M); a resume keeps the momentum and refuses another
    assert cli("artifacts", "mlp.onnx", "-o", "art", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05") == 0
    common = ["--data", "train.npz", "--batch-size", "50", "--verbose", "0", "--no-shuffle"]
    assert cli("train", "--artifacts", "art", *common, "--epochs", "2", "--out", "from_art") == 0
    assert cli("train", "--model", "mlp.onnx", "--loss", "sparse_categorical_crossentropy", "--from-logits",
               "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05", *common, "--epochs", "1",
               "--out", "from_model") == 0
    assert cli("train", "--out", "from_model", "--resume", "--epochs", "2", "--momentum", "0.5") != 0
    assert "--momentum 0.5 differs from the run's 0.9" in capsys.readouterr().err
    assert cli("train", "--out", "from_model", "--resume", "--epochs", "2") == 0

    data = np.load(workdir / "train.npz")
    model = ot.from_onnx(workdir / "mlp.onnx")
    model.compile(optimizer=ot.optim.SGD(lr=0.05, momentum=0.9),
                  loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data["x"], data["y"], batch_size=50, epochs=2, shuffle=False, verbose=0)
    want = dict(zip(model.weight_names(), model.get_weights()))
    for run in ("from_art", "from_model"):
        got = weights(workdir / run / "model.onnx")
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{run}: {name}")
