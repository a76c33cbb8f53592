"""``ortrain demo``: the main job, end to end on the bundled handwritten-digits set.

Trains a small network with a progress bar, reports test accuracy, exports
``model.onnx``, reloads it in an onnxruntime ``InferenceSession`` (inference only, as a
deployment runs it) and in onnx's reference evaluator (an implementation of the ONNX
operators independent of onnxruntime), and checks that both reproduce ortrain's predictions.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx

import ortrain as ot
from ortrain import _optional
from ortrain._files import CAN_LOCK, lock_file
from ortrain._warnings import warn
from ortrain.cli._common import UsageError, check_out_dir, write_json
from ortrain.datasets import load_digits

L = ot.layers


FILES = ("model.onnx", "model.ortrain", "history.csv", "loss.png", "summary.json")
MARK = ".ortrain-demo"  # a directory the demo writes into: its files there are the demo's to replace


def _refuse_others(out_dir: Path) -> None:
    """The demo writes into a new directory, one it wrote before, or one whose files it would not
    overwrite: a training run's model.onnx is not replaced by the digits model."""
    run = (out_dir / "run.json").exists()  # a training run's, whatever the demo wrote there before
    if not run and ((out_dir / MARK).exists() or _demo_summary(out_dir / "summary.json")):
        return
    clash = [n for n in FILES if (out_dir / n).exists()]
    if clash or run:
        held = "a training run" if run else ", ".join(clash)
        raise UsageError(f"--out: {str(out_dir)!r} holds {held}, which the demo did not write and would replace; "
                         "choose a new or empty directory (by default the demo writes to 'ortrain-demo')")


def _demo_summary(path: Path) -> bool:
    """Whether ``path`` is the summary of an earlier demo (one from before the mark was written)."""
    try:
        return "test_accuracy" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


def build_model(seed: int) -> ot.Model:
    model = ot.Sequential([L.Dense(128, activation="relu"), L.BatchNorm(), L.Dropout(0.2),
                           L.Dense(64, activation="relu"), L.Dense(10)], input_shape=(64,), seed=seed,
                          name="digits_mlp")
    model.compile(optimizer=ot.optim.Adam(lr=2e-3),
                  loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def split(x, y, test_fraction: float, seed: int):
    """A stratified split: the same fraction of every class goes to the test set."""
    rng = np.random.default_rng(seed)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:int(round(test_fraction * np.sum(y == c)))]
                           for c in np.unique(y)])
    mask = np.zeros(len(y), bool)
    mask[test] = True
    train_idx = rng.permutation(np.flatnonzero(~mask))
    return x[train_idx], y[train_idx], x[mask], y[mask]


def run(out: str = "ortrain-demo", epochs: int = 30, seed: int = 0, verbose: int = 1, echo=print) -> dict:
    start = time.perf_counter()
    check_out_dir(out, "the demo")
    out_dir = Path(out)
    _refuse_others(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        out_dir.mkdir()
        made = True  # by this process: another demo's folder is never taken for its own
    except FileExistsError:
        made = False
    lock = stage = None
    committed = False
    try:
        lock = _lock(out_dir)
        if lock is not None:  # (without a lock another demo's staging folder may be in use)
            _sweep(out_dir)
        # The files are written to a folder of their own and moved into --out together at the end:
        # a demo stopped part-way (Ctrl-C, an error) leaves the earlier demo's set as it was, not
        # some of its files beside some of the new one's.
        stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=out_dir))
        summary = _run(out_dir, stage, epochs, seed, verbose, echo, start)
        with _signals_held():  # Ctrl-C and SIGTERM wait until the set is in place
            _commit(stage, out_dir)
            committed = True
    except BaseException:
        if not committed:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            # a demo that failed (a cache it cannot write, an interrupt) leaves no folder it made, unless
            # another demo holds it now (it was refused by that one's lock)
            if made and (lock is not None or not CAN_LOCK):
                shutil.rmtree(out_dir, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.close()
    echo("wrote " + ", ".join(summary["files"].values()))
    echo(f"done in {summary['seconds']:.1f} s")
    return summary


STAGE_PREFIX = ".ortrain-demo.new-"  # the folder a demo writes its files to before they go into --out
_STAGE = re.compile(re.escape(STAGE_PREFIX) + r"[A-Za-z0-9_]{8}")  # tempfile.mkdtemp's names


def _lock(out_dir: Path):
    """One demo at a time writes into a folder (the mark file is its lock); a second is refused."""
    if not CAN_LOCK:  # not on POSIX: no guard
        (out_dir / MARK).touch()
        return None
    handle = lock_file(out_dir / MARK, wait=False)
    if handle is None:
        raise UsageError(f"--out: another ortrain demo is writing to {str(out_dir)!r}; wait for it to end or "
                         "choose another directory")
    return handle


def _sweep(out_dir: Path) -> None:
    """Remove the staging folders of demos killed before they moved their files into ``out_dir``."""
    for p in out_dir.iterdir():
        if _STAGE.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def _commit(stage: Path, out_dir: Path) -> None:
    """Move the new files from ``stage`` into ``out_dir``, replacing the earlier demo's set: a file
    of that set the new one lacks (``loss.png`` without matplotlib) goes too."""
    for name in FILES:
        if (stage / name).exists():
            os.replace(stage / name, out_dir / name)
        elif (out_dir / name).is_file():
            (out_dir / name).unlink()
    stage.rmdir()


@contextlib.contextmanager
def _signals_held():
    """Hold Ctrl-C (SIGINT) and SIGTERM back for a few renames: those sent meanwhile are recorded
    and raised again, to the handlers they would have reached, once the renames are done or have
    failed (SIGTERM first). Python's handlers, not the thread's signal mask: the runtime's threads
    would take a signal the main thread masks."""
    if threading.current_thread() is not threading.main_thread():  # handlers are the main thread's
        yield
        return
    caught = []
    previous = []
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            if handler is not None:  # (None: set outside Python, which cannot be put back)
                signal.signal(sig, lambda signum, frame: caught.append(signum))
                previous.append((sig, handler))
        yield
    finally:
        _put_back(previous, sorted(set(caught), reverse=True))  # SIGTERM (15) before SIGINT (2)


def _put_back(handlers: list, caught: list) -> None:
    """Restore every handler, then raise the caught signals again: each step runs even when one
    before it raises (a Ctrl-C whose handler is back already)."""
    if handlers:
        sig, handler = handlers[0]
        try:
            signal.signal(sig, handler)
        finally:
            _put_back(handlers[1:], caught)
    elif caught:
        try:
            signal.raise_signal(caught[0])
        finally:
            _put_back([], caught[1:])


def _run(out_dir: Path, stage: Path, epochs: int, seed: int, verbose: int, echo, start: float) -> dict:
    """Train and check the model, writing its files into ``stage``; the summary names them at
    their places in ``out_dir``."""
    import onnxruntime  # a plain inference session, as a deployment would use

    ot.set_seed(seed)
    x, y = load_digits()
    x_train, y_train, x_test, y_test = split(x, y, 0.2, seed)
    echo(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels, 10 classes")
    model = build_model(seed)
    history = model.fit(x_train, y_train, batch_size=32, epochs=epochs, validation_split=0.1, verbose=verbose)
    result = model.evaluate(x_test, y_test)
    echo(f"test loss {result['loss']:.4f}  test accuracy {result['accuracy']:.4f}")

    onnx_path = model.export_onnx(stage / "model.onnx")
    session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    deployed = session.run(None, {session.get_inputs()[0].name: x_test.astype(np.float32)})[0]
    ours = model.predict(x_test)
    max_diff = float(np.max(np.abs(deployed - ours)))
    agree = float(np.mean(deployed.argmax(1) == ours.argmax(1)))
    deployed_accuracy = float(np.mean(deployed.argmax(1) == y_test))
    if max_diff > 1e-4 or agree < 1.0:
        raise ot.OrtrainError(f"the exported model disagrees with ortrain: max |diff| {max_diff:.2e}, "
                              f"{agree:.1%} of the classes agree")
    echo(f"exported {out_dir / 'model.onnx'}: onnxruntime {onnxruntime.__version__} InferenceSession reproduces "
         f"the predictions (max |diff| {max_diff:.1e}, accuracy {deployed_accuracy:.4f})")
    from onnx.reference import ReferenceEvaluator
    reference = ReferenceEvaluator(onnx_path).run(None, {session.get_inputs()[0].name: x_test.astype(np.float32)})[0]
    reference_diff = float(np.max(np.abs(reference - ours)))
    if reference_diff > 1e-4 or np.mean(reference.argmax(1) == ours.argmax(1)) < 1.0:
        raise ot.OrtrainError(f"onnx's reference evaluator disagrees with ortrain on the exported model: max |diff| "
                              f"{reference_diff:.2e}")
    echo(f"onnx {onnx.__version__} reference evaluator (independent of onnxruntime) reproduces them too (max |diff| "
         f"{reference_diff:.1e})")

    model.save(stage / "model.ortrain")
    history.to_csv(stage / "history.csv")
    summary = {"test_loss": result["loss"], "test_accuracy": result["accuracy"],
               "deployed_accuracy": deployed_accuracy, "max_abs_diff": max_diff,
               "reference_max_abs_diff": reference_diff, "epochs": epochs,
               "seconds": round(time.perf_counter() - start, 2),
               "files": {"onnx": str(out_dir / "model.onnx"), "model": str(out_dir / "model.ortrain"),
                         "history": str(out_dir / "history.csv")}}
    try:
        history.plot(stage / "loss.png")
        summary["files"]["plot"] = str(out_dir / "loss.png")
    except _optional.Unusable as exc:  # matplotlib is an optional extra: said only when installed but broken
        if not exc.missing:
            warn(f"{exc} (the demo is complete without loss.png)", RuntimeWarning)
    write_json(stage / "summary.json", summary)
    summary["files"]["summary"] = str(out_dir / "summary.json")
    return summary
