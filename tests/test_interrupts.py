"""An interrupt (Ctrl-C, or any handler raising ``KeyboardInterrupt``) at the worst moment of a call.

Python raises it between bytecodes, so it can land right after a runtime call returned and before
its result was kept. Each test puts one there by wrapping the call, then checks that the interrupt
reaches the caller, that the counters match the weights (against numpy's Adam or an uninterrupted
run), and that no file, folder or descriptor is left behind.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import NumpyAdam

import ortrain as ot
from ortrain import _files, ag
from ortrain.engine import denormals


def _then_interrupt(fn, on_call: int = 1):
    """``fn`` that runs, and on its ``on_call``-th call raises KeyboardInterrupt once it has run."""
    calls = [0]

    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        calls[0] += 1
        if calls[0] == on_call:
            raise KeyboardInterrupt
        return out
    return wrapped


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def test_a_captured_step_interrupted_after_its_update_counts_it(rng, monkeypatch):
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((2, 4)).astype(np.float32)
    W = ag.param(w0, name="W")
    opt = ot.optim.Adam([W], lr=0.05)
    train = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
    ref = NumpyAdam([w0], lr=0.05)

    def grad(w):
        return 2 * (w @ x - y) @ x.T / y.size

    # the update ran; the interrupt comes as the step switches the flush back (the count came before)
    monkeypatch.setattr(denormals, "off", _then_interrupt(denormals.off))
    with pytest.raises(KeyboardInterrupt):
        train(x=x, y=y)
    monkeypatch.undo()
    ref.step([grad(ref.p[0])])
    assert opt.step == 1
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-5, atol=1e-6)
    for _ in range(3):  # the bias correction goes on from the right count
        train(x=x, y=y)
        ref.step([grad(ref.p[0])])
    assert opt.step == 4
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-5, atol=1e-6)
    train.free()


def test_an_interrupted_accumulation_period_uncounts_its_batches(rng, monkeypatch):
    def trainer():
        model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
        model.compile(optimizer="adam", loss="mse")
        return ot.Trainer(model, batch_size=4, nbatch_logical=8)

    batches = [(rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32))
               for _ in range(4)]
    tr, plain = trainer(), trainer()
    w0 = tr.get_weights()
    tr.step(*batches[0])
    monkeypatch.setattr(tr._session, "_train_step", _then_interrupt(tr._session._train_step))
    with pytest.raises(KeyboardInterrupt):
        tr.step(*batches[1])   # the runtime added its gradient; the period's gradients are dropped
    monkeypatch.undo()
    assert tr.n_steps == 0   # it was 1, with the first batch's gradient gone
    for a, b in zip(tr.get_weights(), w0, strict=True):
        np.testing.assert_array_equal(a, b)
    for t in (tr, plain):   # a whole period after it: one update, as on a fresh trainer
        t.step(*batches[2])
        t.step(*batches[3])
    assert tr.n_steps == plain.n_steps == 2
    for a, b in zip(tr.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    tr.free()
    plain.free()


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_an_interrupted_update_target_leaves_the_target_as_it_was(rng, monkeypatch, tau):
    model = ot.Sequential([ot.layers.Dense(5), ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    with ot.Trainer(model, batch_size=4) as tr:
        target = tr.snapshot()
        before = target.get_weights()
        tr.step(x, y)
        monkeypatch.setattr(tr._session, "view", _then_interrupt(tr._session.view, on_call=3))
        with pytest.raises(KeyboardInterrupt):
            tr.update_target(target, tau=tau)   # two of four weights read when it comes
        monkeypatch.undo()
        for a, b in zip(target.get_weights(), before, strict=True):
            np.testing.assert_array_equal(a, b)
        tr.update_target(target, tau=tau)
        for a, cur, old in zip(target.get_weights(), tr.get_weights(), before, strict=True):
            np.testing.assert_array_equal(a, cur if tau == 1.0 else
                                          old * np.float32(1 - tau) + np.float32(tau) * cur)
    target.free()


def test_an_interrupt_as_a_save_opens_its_temporary_leaves_nothing(tmp_path, monkeypatch):
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.save(tmp_path / "m.ortrain")   # the first save of the folder sweeps it: not what is checked
    fds = _open_descriptors()
    monkeypatch.setattr(os, "open", _then_interrupt(os.open))
    with pytest.raises(KeyboardInterrupt):
        model.save(tmp_path / "m.ortrain")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ortrain"]
    assert _open_descriptors() == fds
    assert ot.load_model(tmp_path / "m.ortrain").weight_names() == model.weight_names()


def test_a_writer_failing_on_its_interrupted_write_gives_the_interrupt(tmp_path):
    # zipfile's close raises "Can't close the ZIP file while there is an open writing handle" when
    # np.savez is interrupted mid-write: the user asked for the interrupt
    with pytest.raises(KeyboardInterrupt):
        with _files.atomic_path(tmp_path / "w.npz") as tmp:
            try:
                Path(tmp).write_bytes(b"partial")
                raise KeyboardInterrupt
            finally:
                raise ValueError("Can't close the ZIP file while there is an open writing handle on it")
    assert list(tmp_path.iterdir()) == []


def test_scratch_folders_go_when_an_interrupt_comes_as_they_are_made_or_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(os, "mkdir", _then_interrupt(os.mkdir))
    with pytest.raises(KeyboardInterrupt):
        with _files.scratch_dir():
            pass
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    real = os.unlink
    calls = []

    def interrupted_once(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt   # before it removed anything
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "unlink", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        with _files.scratch_dir() as d:
            (d / "state").write_bytes(b"weights and moments")
    assert list(tmp_path.iterdir()) == [] and len(calls) == 2
    # the optimizer state a fit reads back goes through one
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 3), np.float32), np.ones((4, 2), np.float32), verbose=0)
    assert model.optimizer.state()["step"] == 1
    assert list(tmp_path.iterdir()) == []


# -- races between threads: a free() or a write landing inside another thread's call ---------------

def test_a_free_landing_inside_a_trainer_predict_gives_freed_error(rng, monkeypatch):
    from ortrain.engine import inference
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x = rng.standard_normal((5, 3)).astype(np.float32)
    tr = ot.Trainer(model, batch_size=5)
    want = tr.predict(x)
    # free() from another thread, between the runner's check of its session and the run: the
    # predict under way finishes (it raised the runtime's AttributeError), the next is refused
    monkeypatch.setattr(tr._runner, "_stepped", ["x"])
    monkeypatch.setattr(inference, "refuse_empty_steps", lambda pairs: tr.free())
    np.testing.assert_array_equal(tr.predict(x), want)
    with pytest.raises(ot.FreedError, match="trainer"):
        tr.predict(x)


def test_buffer_writes_and_assigns_land_between_captured_runs(rng):
    import threading
    rows, cols = 4096, 64
    buf = ag.buffer(np.zeros((rows, cols), np.float32), name="replay")
    W = ag.param(np.zeros((rows, cols), np.float32), name="W", trainable=False)
    read = ot.capture(lambda idx: {"rows": ag.get_rows(buf, idx), "w": W * 1.0})
    idx = np.arange(rows)
    read(idx=idx)
    stop = threading.Event()

    def writer():
        k = 0
        while not stop.is_set():
            k += 1
            buf.write(slice(0, rows), np.full((rows, cols), k, np.float32))
            W.assign(np.full((rows, cols), k, np.float32))
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        torn = [len(np.unique(out["rows"])) > 1 or len(np.unique(out["w"])) > 1
                for out in (read(idx=idx) for _ in range(60))]
        copies = [W.numpy() for _ in range(20)]
    finally:
        stop.set()
        thread.join()
    assert not any(torn)
    assert all(len(np.unique(c)) == 1 for c in copies)
    read.free()


def test_a_save_failing_while_an_interrupt_is_handled_reports_its_own_failure(tmp_path, monkeypatch):
    # the usual "save on Ctrl-C": the interrupt was handled before the write began
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    monkeypatch.setattr(os, "replace", full_disk)
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        with pytest.raises(ot.OrtrainError, match="No space left on device"):
            model.save(tmp_path / "m.ortrain")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_layers_repr_shows_its_name():
    assert repr(ot.layers.Dense(2, name="head")).endswith("name='head')")


def test_a_copy_of_a_param_waits_for_a_captured_run_in_another_thread():
    import copy
    import threading

    from ortrain.ag import tensor
    turns = tensor.TURNS
    W = ag.param(np.ones((2, 2), np.float32), name="W")
    held, done = threading.Event(), threading.Event()
    release = threading.Event()

    def run_elsewhere():   # stands for a captured step running in another thread
        with turns:
            held.set()
            release.wait(5)
    runner = threading.Thread(target=run_elsewhere)
    runner.start()
    held.wait(5)
    copier = threading.Thread(target=lambda: (copy.copy(W), done.set()))
    copier.start()
    assert not done.wait(0.3)   # it waits for the run: a copy taken during it could mix two updates
    release.set()
    runner.join()
    copier.join()
    assert done.is_set()


def test_a_checkpoint_part_way_through_a_period_counts_none_of_its_batches(rng, tmp_path):
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    with ot.Trainer(model, batch_size=4, nbatch_logical=8) as tr:
        tr.step(x, y)
        tr.step(x, y)
        tr.step(x, y)   # one batch into the second period
        with pytest.warns(UserWarning, match="their gradients, and their count in n_steps"):
            tr.save_checkpoint(tmp_path / "c.ckpt")
    with ot.Trainer.from_checkpoint(model, tmp_path / "c.ckpt", batch_size=4, nbatch_logical=8) as resumed:
        assert resumed.n_steps == 2
        resumed.step(x, y)
        resumed.step(x, y)
        assert resumed.n_steps == 4   # on a period boundary, after its update


def test_an_input_renamed_after_the_model_was_built_leaves_the_model_as_built(rng):
    inp = ot.Input((3,))
    model = ot.Model(inp, ot.layers.Dense(2)(inp))
    model.compile(optimizer="sgd", loss="mse")
    inp.name = "dense_0.kernel"   # failed in fit ("SSA form") and in predict ("GEMM: Dimension mismatch")
    x = rng.standard_normal((4, 3)).astype(np.float32)
    model.fit(x, np.ones((4, 2), np.float32), verbose=0)
    assert model.input_specs[0].name == "input" and model.predict(x).shape == (4, 2)


def test_a_scratch_folder_is_removed_with_its_subfolders_but_not_through_its_links(tmp_path, monkeypatch):
    # removed without shutil.rmtree, which Python 3.11 makes close a descriptor twice on an interrupt
    from ortrain._files import scratch_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept.txt").write_text("x")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with scratch_dir() as d:
        (d / "a" / "b").mkdir(parents=True)
        (d / "a" / "b" / "f.bin").write_bytes(b"1")
        (d / "g.bin").write_bytes(b"2")
        (d / "link").symlink_to(outside, target_is_directory=True)
        (d / "a" / "filelink").symlink_to(outside / "kept.txt")
        made = d
    assert not made.exists()
    assert (outside / "kept.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside"]


@pytest.mark.skipif(not _files.CAN_LOCK, reason="needs POSIX locks")
def test_scratch_folders_a_killed_process_left_are_removed_by_the_next_process(tmp_path, monkeypatch):
    # A process killed during a fit, optimizer.state() or export_state left its scratch folder (a
    # checkpoint's size: 25 MB for a million weights) in TMPDIR, and nothing removed it
    import fcntl
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_files, "_SWEPT", set())
    old = time.time() - 2 * _files.LEFT_BEHIND_AFTER_S

    def made(name, age=old):
        d = tmp_path / name
        d.mkdir()
        (d / ".checkpoint.0123456789ab.tmp").write_bytes(b"x" * 1000)
        os.utime(d, (age, age))
        return d
    left = made("ortrain-scratch-0123456789abcdef")
    young = made("ortrain-scratch-1123456789abcdef", age=time.time())  # being made: not locked yet
    in_use = made("ortrain-scratch-2123456789abcdef")  # a live process holds it
    mine = made("ortrain-scratch-notes")  # not a scratch folder's name
    earlier = made("ortrain-3123456789abcdef")  # an earlier version's, which never locks its folder in use
    held = os.open(in_use, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with _files.scratch_dir() as d:
            assert d.exists()
            probe = os.open(d, os.O_RDONLY)  # in use, it is locked: another process's sweep leaves it
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.close(probe)
    finally:
        os.close(held)
    assert not left.exists()
    assert young.exists() and in_use.exists() and mine.exists() and earlier.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (young, in_use, mine, earlier))
