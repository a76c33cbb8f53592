"""Trainer: the seed example against PyTorch, loss masks, targets, batch norm, resume, lifetimes, errors."""

import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import (
    NumpyAdam,
    dense_model,
    forks_that_hang,
    interrupted_first,
    linear_mse_grads,
    softmax,
    then_interrupted,
)

import ortrain as ot

L = ot.layers


def seed_data():
    """The reference page's example: 64 rows of 4 features, a 2-class one-hot target."""
    rng = np.random.default_rng(42)
    x = rng.random((64, 4))
    y = np.zeros((64, 2))
    y[np.arange(64), np.where(x.sum(1) > 2, 0, 1)] = 1
    return x, y


def seed_model():
    model = ot.Sequential([L.Dense(8, activation="relu"), L.Dense(2, activation="softmax")], input_shape=(4,),
                          seed=5)
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    return model


def test_seed_example_matches_pytorch_adam():
    torch = torch_or_skip()
    x, y = seed_data()
    model = seed_model()
    w = [torch.tensor(a, requires_grad=True) for a in model.get_weights()]
    with ot.Trainer(model, batch_size=16) as tr:
        ours = [tr.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(4)]
        final = tr.model().get_weights()
    opt = torch.optim.Adam(w, lr=1e-3)
    ref = []
    for i in range(4):
        xb = torch.tensor(x[i * 16:(i + 1) * 16], dtype=torch.float32)
        yb = torch.tensor(y[i * 16:(i + 1) * 16], dtype=torch.float32)
        p = torch.softmax(torch.relu(xb @ w[0] + w[1]) @ w[2] + w[3], dim=-1)
        loss = -(yb * torch.log(p)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    for got, want in zip(final, w):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mask", [1, 3])
def test_loss_masks_match_weighted_numpy_reference(rng, mask):
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)
    model = dense_model(5, 3, optimizer=ot.optim.Adam(lr=0.05))
    w0 = model.get_weights()
    shape = (8,) if mask == 1 else (8, 3)
    ws = [(rng.random(shape) > 0.3) * rng.uniform(0.5, 2, shape) for _ in range(3)]
    ref = NumpyAdam(w0, lr=0.05)
    with ot.Trainer(model, batch_size=8, loss_mask=mask) as tr:
        for w in ws:
            loss = tr.step(x, y, sample_weight=w)
            wb = w.reshape(8, 1) if mask == 1 else w
            d = x @ ref.p[0] + ref.p[1] - y
            np.testing.assert_allclose(loss, np.sum(wb * d ** 2) / 24, rtol=1e-5)
            ref.step(linear_mse_grads(x, y, ref.p[0], ref.p[1], weight=wb))
        for got, want in zip(tr.model().get_weights(), ref.p):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # Omitted weights mean all ones; eval takes them too.
        assert tr.eval(x, y) == pytest.approx(tr.eval(x, y, sample_weight=np.ones(shape)))


def test_a_prediction_of_shape_batch_takes_sample_weights_of_batch_or_batch_1(rng):
    # API.md: with loss_mask=1, sample_weight is [batch] or [batch, 1], whatever the output's rank
    from _onnx_helpers import model as onnx_model
    from _onnx_helpers import vi
    from onnx import helper, numpy_helper
    w0 = rng.standard_normal((3, 1)).astype(np.float32)
    proto = onnx_model([helper.make_node("MatMul", ["x", "W"], ["z"]),
                        helper.make_node("Squeeze", ["z", "axis"], ["y"])],
                       [vi("x", ["batch", 3])], [vi("y", ["batch"])],
                       [numpy_helper.from_array(w0, "W"), numpy_helper.from_array(np.array([1], np.int64), "axis")])
    model = ot.from_onnx(proto)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w = np.array([1.0, 0.0, 2.0, 0.5], np.float32)
    with ot.Trainer(model, batch_size=4, loss_mask=1) as tr:
        d = (x @ w0)[:, 0] - y
        for weights in (w, w[:, None]):
            assert tr.eval(x, y, weights) == pytest.approx(np.sum(w * d ** 2) / 4, rel=1e-6)
        with pytest.raises(ot.ShapeError, match=r"sample_weight: expected shape \(4,\) or \(4, 1\) \(one weight per "
                                                r"sample\), received \(4, 2\)"):
            tr.step(x, y, np.ones((4, 2)))
        tr.step(x, y, w[:, None])
        np.testing.assert_allclose(tr.model().get_weights()[0], w0 - 0.1 * (2 / 4) * x.T @ (w * d)[:, None],
                                   rtol=1e-5, atol=1e-6)


def test_zero_weight_removes_the_gradient_exactly(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    model = dense_model(5, 3, optimizer=ot.optim.SGD(lr=0.5))
    mask = np.zeros((4, 3), np.float32)
    mask[:, 1] = 1.0  # only output 1 is known
    w0 = model.get_weights()
    with ot.Trainer(model, batch_size=4, loss_mask=3) as tr:
        tr.step(x, rng.standard_normal((4, 3)) * 100, sample_weight=mask)
        k, b = tr.model().get_weights()
    np.testing.assert_array_equal(k[:, [0, 2]], w0[0][:, [0, 2]])
    np.testing.assert_array_equal(b[[0, 2]], w0[1][[0, 2]])
    assert not np.array_equal(k[:, 1], w0[0][:, 1])


def test_loss_mask_errors():
    model = dense_model(5, 3, loss="mae")
    with pytest.raises(ot.OrtrainError, match="loss_mask=1 weights a mean squared error.*'mae'"):
        ot.Trainer(model, batch_size=4, loss_mask=1)
    mse = dense_model(5, 3)
    with pytest.raises(ot.OrtrainError, match="loss_mask: expected None, 1 .* or 3 .*received 2"):
        ot.Trainer(mse, batch_size=4, loss_mask=2)
    with ot.Trainer(mse, batch_size=4) as tr:
        with pytest.raises(ot.OrtrainError, match="sample_weight: this trainer has no loss weights"):
            tr.step(np.zeros((4, 5)), np.zeros((4, 3)), sample_weight=np.ones(4))
    with ot.Trainer(mse, batch_size=4, loss_mask=3) as tr:
        with pytest.raises(ot.ShapeError, match="sample_weight: expected shape \\(4, 3\\).*received \\(4,\\)"):
            tr.step(np.zeros((4, 5)), np.zeros((4, 3)), sample_weight=np.ones(4))


def test_set_lr_takes_effect_on_the_next_update(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = rng.standard_normal((4, 3)).astype(np.float32)
    model = dense_model(5, 3, optimizer=ot.optim.SGD(lr=0.1))
    w, b = (a.astype(np.float64) for a in model.get_weights())
    with ot.Trainer(model, batch_size=4) as tr:
        for lr in (0.1, 0.01, 0.3):
            tr.set_lr(lr)
            assert tr.lr == lr
            tr.step(x, y)
            gw, gb = linear_mse_grads(x, y, w, b)
            w, b = w - lr * gw, b - lr * gb
        np.testing.assert_allclose(tr.model().get_weights()[0], w, rtol=1e-5, atol=1e-6)
        for bad in (-0.1, float("nan"), float("inf"), "0.1"):
            with pytest.raises(ot.OrtrainError, match="set_lr: expected a finite number >= 0"):
                tr.set_lr(bad)
        assert tr.lr == 0.3


def test_snapshot_and_polyak_update(rng):
    model = seed_model()
    x, y = seed_data()
    with ot.Trainer(model, batch_size=16) as tr:
        target = tr.snapshot()
        frozen = target.get_weights()
        for _ in range(3):
            tr.step(x[:16], y[:16])
        for a, b in zip(target.get_weights(), frozen):  # later steps do not move it
            np.testing.assert_array_equal(a, b)
        current = tr.model().get_weights()
        tr.update_target(target, tau=0.25)
        for got, cur, old in zip(target.get_weights(), current, frozen):
            np.testing.assert_allclose(got, 0.25 * cur + 0.75 * old, rtol=1e-6, atol=1e-7)
        tr.update_target(target, tau=1.0)
        for got, cur in zip(target.get_weights(), current):
            np.testing.assert_array_equal(got, cur)
        np.testing.assert_array_equal(target.predict(x), tr.predict(x))
        expected = tr.predict(x[:3])
    np.testing.assert_array_equal(target.predict(x[:3]), expected)  # outlives the trainer's free()
    target.free()
    target.free()
    with pytest.raises(ot.FreedError):
        target.predict(x)


def test_update_target_copies_batchnorm_statistics_and_refuses_other_architectures(rng):
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(1)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x = rng.standard_normal((8, 3)).astype(np.float32)
    with ot.Trainer(model, batch_size=8) as tr:
        target = tr.snapshot()
        old = target.get_weights()
        tr.step(x, rng.standard_normal((8, 1)))
        cur = tr.model().get_weights()
        tr.update_target(target, tau=0.5)
        got = target.get_weights()
        np.testing.assert_allclose(got[0], 0.5 * cur[0] + 0.5 * old[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got[4], cur[4])  # running mean copied whole
        np.testing.assert_array_equal(got[5], cur[5])
        other = dense_model(3, 1)
        with ot.Trainer(other, batch_size=8) as tr2:
            with pytest.raises(ot.OrtrainError, match="target: its weights differ .* by name or shape"):
                tr.update_target(tr2.snapshot())
        # each side named: a list of both sides' shapes mixed left the user to guess which was whose
        wider = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(2)], input_shape=(3,), seed=0)
        wider.compile(optimizer="adam", loss="mse")
        with ot.Trainer(wider, batch_size=8) as tr3:
            with pytest.raises(ot.OrtrainError, match=re.escape(
                    "target: its weights differ from this trainer's by name or shape (dense_1.bias: trainer (1,), "
                    "target (2,); dense_1.kernel: trainer (4, 1), target (4, 2)); take the target from a trainer "
                    "of the same architecture")):
                tr.update_target(tr3.snapshot())
        with ot.Trainer(dense_model(3, 1), batch_size=8) as tr4:
            with pytest.raises(ot.OrtrainError, match=re.escape(
                    "(dense_0.bias: trainer (4,), target (1,); dense_0.kernel: trainer (3, 4), target (3, 1); "
                    "batch_norm_0.beta (4,): the trainer's only; batch_norm_0.gamma (4,): the trainer's only; "
                    "4 more)")):
                tr.update_target(tr4.snapshot())
        with pytest.raises(ot.OrtrainError, match="tau: expected a number in \\[0, 1\\]"):
            tr.update_target(target, tau=1.5)
        target.free()
        with pytest.raises(ot.FreedError):
            tr.update_target(target)


def test_calibrate_bn_sets_exact_statistics_layer_by_layer(rng):
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(3), L.BatchNorm()], input_shape=(2,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x = rng.standard_normal((1500, 2)).astype(np.float32) * 3 + 1
    with ot.Trainer(model, batch_size=8) as tr:
        tr.calibrate_bn(x)
        w = tr.model().get_weights()
    xs = x[:1024].astype(np.float64)
    h1 = xs @ w[0] + w[1]
    np.testing.assert_allclose(w[4], h1.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w[5], h1.var(0), rtol=1e-5, atol=1e-6)
    n1 = (h1 - w[4]) / np.sqrt(w[5] + 1e-3) * w[2] + w[3]  # the first layer, already calibrated
    h2 = n1 @ w[6] + w[7]
    np.testing.assert_allclose(w[10], h2.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w[11], h2.var(0), rtol=1e-4, atol=1e-5)


def test_calibrate_bn_takes_one_image_and_refuses_one_value_a_channel(rng):
    # one image gives a convolution's batch norm 36 values a channel (training takes it); a
    # Dense's batch norm sees one value a channel in one row, and a variance needs two
    conv = ot.Sequential([L.Conv2D(2, 3, padding="same", use_bias=False), L.BatchNorm()], input_shape=(1, 6, 6), seed=0)
    conv.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((1, 1, 6, 6)).astype(np.float32)
    with ot.Trainer(conv, batch_size=1) as tr:
        tr.calibrate_bn(x)
        k, _, _, mean, var = tr.model().get_weights()
    h = np.stack([sum(np.pad(x[0, 0], 1)[i:i + 6, j:j + 6] * k[c, 0, i, j] for i in range(3) for j in range(3))
                  for c in range(2)]).astype(np.float64)
    np.testing.assert_allclose(mean, h.mean((1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, h.var((1, 2)), rtol=1e-5, atol=1e-6)
    dense = ot.Sequential([L.Dense(3), L.BatchNorm()], input_shape=(2,), seed=0)
    dense.compile(optimizer="sgd", loss="mse")
    with ot.Trainer(dense, batch_size=1) as tr:
        before = tr.get_weights()
        with pytest.raises(ot.ShapeError, match="sees 1 value a channel in 1 row"):
            tr.calibrate_bn(np.ones((1, 2), np.float32))
        for a, b in zip(tr.get_weights(), before, strict=True):
            np.testing.assert_array_equal(a, b)


def test_checkpoint_resume_is_bit_exact(tmp_path, rng):
    model = seed_model()
    x, y = seed_data()
    with ot.Trainer(model, batch_size=16) as tr:
        tr.set_lr(0.02)
        for i in range(3):
            tr.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16])
        tr.save_checkpoint(tmp_path / "ck")
        tail = [tr.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(4)]
        final = tr.model().get_weights()
    with ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=16) as tr2:
        assert tr2.n_steps == 3 and tr2.lr == 0.02 and tr2.n_updates == 3
        again = [tr2.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(4)]
        assert again == tail
        for a, b in zip(tr2.model().get_weights(), final):
            np.testing.assert_array_equal(a, b)
    other = dense_model(4, 2)
    cached = sorted(p.name for p in ot.artifacts.cache_dir().iterdir())
    with pytest.raises(ot.OrtrainError, match="does not fit this model: this model differs from the one that wrote "
                                              r"it in its layers' training graphs \(the layers, or how this version "
                                              r"of ortrain writes them.*\), its weights.*go on from a model.save file "
                                              r"of that run: ot.load_model\(path\)"):
        ot.Trainer.from_checkpoint(other, tmp_path / "ck", batch_size=16)
    assert sorted(p.name for p in ot.artifacts.cache_dir().iterdir()) == cached  # refused before writing
    with pytest.raises(ot.OrtrainError, match="directory .* does not exist"):
        ot.Trainer(model, batch_size=16).save_checkpoint(tmp_path / "no" / "ck")


def test_a_checkpoint_keeps_the_moments_of_weights_frozen_in_the_trainer(tmp_path, rng):
    # the moments a trainer carries for weights frozen in it (they trained before) were not part of its
    # checkpoint: a resumed trainer handed back fresh moments for them, and Adam restarted on them
    x, y = rng.standard_normal((4, 4)).astype(np.float32), np.ones((4, 3), np.float32)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    model.train_on_batch(x, y)
    carried = model.train_state.moments["dense_0.bias"]
    model.freeze("dense_0.bias")
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, y)
        tr.save_checkpoint(tmp_path / "ck")
        straight = tr.export_state()
    with ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=4) as tr2:
        resumed = tr2.export_state()
    assert sorted(resumed.moments) == sorted(straight.moments) == ["dense_0.bias", "dense_0.kernel"]
    for name in straight.moments:
        for a, b in zip(resumed.moments[name], straight.moments[name]):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed.moments["dense_0.bias"], carried):
        np.testing.assert_array_equal(a, b)
    # the file still opens in onnxruntime-training itself, and a tampered carried moment is refused
    from onnxruntime.training.api import CheckpointState
    CheckpointState.load_checkpoint(str(tmp_path / "ck"))
    data = bytearray((tmp_path / "ck").read_bytes())
    at = bytes(data).rfind(carried[1].tobytes())
    assert at > 0
    data[at] ^= 1
    (tmp_path / "bad").write_bytes(bytes(data))
    with pytest.raises(ot.OrtrainError, match="is damaged: its contents do not match the checksum"):
        ot.Trainer.from_checkpoint(model, tmp_path / "bad", batch_size=4)


@pytest.mark.parametrize("written", [False, True])
def test_a_state_handed_back_to_the_model_brings_its_rate(written):
    # a rate written to model.optimizer.lr at any time before (even the same value) won over the rate
    # of the state handed back: the next fit trained at 0.003, not at the trainer's 0.5
    x, y = np.ones((2, 4), np.float32), np.zeros((2, 3), np.float32)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.003), loss="mse")
    if written:
        model.optimizer.lr = 0.003
    with ot.Trainer(model, batch_size=2) as tr:
        tr.set_lr(0.5)
        tr.step(x, y)
        model.set_weights(tr.get_weights())
        model.train_state = tr.export_state()
    assert model.optimizer.lr == 0.5
    w, b = (a.copy() for a in model.get_weights())
    model.fit(x, y, batch_size=2, verbose=0)
    grad = 2 * (x @ w + b - y) / y.size
    np.testing.assert_allclose(model.get_weights()[0], w - 0.5 * x.T @ grad, rtol=1e-6, atol=1e-7)
    # a rate written after the hand-back is the next fit's, as ever
    model.optimizer.lr = 0.1
    w, b = (a.copy() for a in model.get_weights())
    model.fit(x, y, batch_size=2, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], w - 0.1 * x.T @ (2 * (x @ w + b - y) / y.size), rtol=1e-6,
                               atol=1e-7)


def test_a_checkpoint_keeps_the_weight_decay_and_model_carries_no_stale_state(tmp_path):
    model = seed_model()
    model.compile(optimizer="adamw", loss="mse")
    x, y = seed_data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)    # the model now carries an optimizer state
    with ot.Trainer(model, batch_size=16, weight_decay=0.5) as tr:
        tr.step(x[:16], y[:16])
        assert tr.model().train_state is None           # not the constructor's model's, now out of date
        tr.save_checkpoint(tmp_path / "ck")
        tail = [tr.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(1, 4)]
    with ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=16) as tr2:   # weight_decay=None
        assert tr2.weight_decay == 0.5
        assert [tr2.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(1, 4)] == tail
    with ot.Trainer(model, batch_size=16, nbatch_logical=32) as tr:
        tr.step(x[:16], y[:16])
        with pytest.warns(UserWarning, match="starts a new accumulation period"):
            tr.save_checkpoint(tmp_path / "mid")


def test_a_checkpoint_keeps_the_accumulation_period(tmp_path):
    # from_checkpoint(model, path, batch_size) resumed an accumulating trainer's checkpoint updating
    # at every batch, without a word (weights 0.2 away from the uninterrupted run after 9 batches)
    model = seed_model()
    model.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
    x, y = seed_data()
    batch = [(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]) for i in range(8)]
    with ot.Trainer(model, batch_size=8, nbatch_logical=24) as tr:
        for b in batch[:3]:
            tr.step(*b)
        tr.save_checkpoint(tmp_path / "ck")        # on a period boundary
        tail = [tr.step(*b) for b in batch[3:]]
        want = tr.get_weights()
    for resume in (lambda: ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=8),
                   lambda: ot.Trainer.from_artifacts(ot.artifacts.build(model, loss="mse", optimizer=model.optimizer),
                                                     batch_size=8, checkpoint=tmp_path / "ck")):
        with resume() as tr2:
            assert (tr2.nbatch_logical, tr2.n_steps) == (24, 3)
            assert [tr2.step(*b) for b in batch[3:]] == tail
            for a, b in zip(tr2.get_weights(), want):
                np.testing.assert_array_equal(a, b)
    with ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=4) as tr2:   # 6 batches of 4 a period
        assert tr2.nbatch_logical == 24
    with ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=8, nbatch_logical=8) as tr2:
        assert tr2.nbatch_logical == 8                  # another period, given explicitly
    with pytest.raises(ot.OrtrainError, match=r"written by a trainer accumulating gradients, nbatch_logical=24 "
                                              r"\(batch_size=8\), which batch_size=16 does not divide"):
        ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=16)
    with ot.Trainer(model, batch_size=8) as tr:          # no accumulation: none on resume at any batch size
        tr.save_checkpoint(tmp_path / "plain")
    with ot.Trainer.from_checkpoint(model, tmp_path / "plain", batch_size=16) as tr2:
        assert tr2.nbatch_logical == 16


def test_predict_eval_snapshot_do_not_disturb_training():
    x, y = seed_data()
    model = ot.Sequential([L.Dense(8, activation="relu"), L.Dropout(0.3, seed=1), L.BatchNorm(),
                           L.Dense(2, activation="softmax")], input_shape=(4,), seed=5)
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    plain, mixed = [], []
    with ot.Trainer(model, batch_size=16) as tr:
        for i in range(8):
            plain.append(tr.step(x[i % 4 * 16:(i % 4 + 1) * 16], y[i % 4 * 16:(i % 4 + 1) * 16]))
    with ot.Trainer(model, batch_size=16) as tr:
        for i in range(8):
            tr.predict(x)
            tr.eval(x[:16], y[:16])
            tr.snapshot().free()
            tr.model()
            mixed.append(tr.step(x[i % 4 * 16:(i % 4 + 1) * 16], y[i % 4 * 16:(i % 4 + 1) * 16]))
    assert plain == mixed


def test_dropout_redraws_masks_and_eval_predict_have_none(rng):
    model = ot.Sequential([L.Dense(16), L.Dropout(0.5), L.Dense(1)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)
    with ot.Trainer(model, batch_size=8) as tr:
        losses = {tr.step(x, y) for _ in range(5)}
        assert len(losses) == 5  # a new mask every step
        assert tr.eval(x, y) == tr.eval(x, y) == pytest.approx(model.evaluate(x, y)["loss"], rel=1e-5)
        np.testing.assert_allclose(tr.predict(x), model.predict(x), rtol=1e-6)


def test_a_resumed_trainer_draws_the_dropout_masks_it_would_have_drawn(rng, tmp_path):
    # onnxruntime's seeded Dropout draws its k-th mask in a session from seed + k, and a new
    # session started again at the seed: resumed, continued and reloaded runs repeated the masks
    # of the first steps, and their weights differed from those of one uninterrupted run.
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)

    def model():
        ot.set_seed(0)  # seeds the weights and the dropout
        m = ot.Sequential([L.Dense(16), L.Dropout(0.5), L.Dense(1)], input_shape=(4,))
        return m.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")

    with ot.Trainer(model(), batch_size=8) as tr:
        straight = [tr.step(x, y) for _ in range(6)]
        want = tr.model().get_weights()
    with ot.Trainer(model(), batch_size=8) as tr:
        resumed = [tr.step(x, y) for _ in range(3)]
        tr.save_checkpoint(tmp_path / "c")
    with ot.Trainer.from_checkpoint(model(), tmp_path / "c", batch_size=8) as tr:
        resumed += [tr.step(x, y) for _ in range(3)]
        got = tr.model().get_weights()
    assert resumed == straight
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    one = model()
    one.fit(x, y, batch_size=4, epochs=4, shuffle=False, verbose=0)
    two = model()
    two.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    two.save(tmp_path / "m.ortrain")
    three = ot.load_model(tmp_path / "m.ortrain")
    for m in (two, three):
        m.fit(x, y, batch_size=4, epochs=4, initial_epoch=2, shuffle=False, verbose=0)
        for a, b in zip(one.get_weights(), m.get_weights()):
            np.testing.assert_array_equal(a, b)


def test_a_dropout_seed_near_the_int64_limit_goes_on_wrapping(rng):
    # The advanced seed overflowed the int64 attribute: a continued fit raised ValueError.
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)
    model = ot.Sequential([L.Dense(16), L.Dropout(0.5, seed=2**63 - 3), L.Dense(1)], input_shape=(4,))
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    model.fit(x, y, batch_size=4, epochs=4, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=4, epochs=6, initial_epoch=4, shuffle=False, verbose=0)
    assert model.train_state.draws == 12 and all(np.all(np.isfinite(w)) for w in model.get_weights())


def test_bad_input_is_refused_and_changes_nothing(rng):
    model = seed_model()
    x, y = seed_data()
    with ot.Trainer(model, batch_size=16) as tr:
        tr.step(x[:16], y[:16])
        before = (tr.model().get_weights(), tr.n_steps, tr.export_state())
        bad = [
            ((x[:15], y[:15]), ot.ShapeError, "x: expected shape \\(16, 4\\), received \\(15, 4\\); every batch"),
            ((x[:16, :3], y[:16]), ot.ShapeError, "expected shape \\(16, 4\\), received \\(16, 3\\)"),
            ((x[:16].astype(str), y[:16]), ot.ShapeError, "strings, objects, complex"),
            ((x[:16] + 1j, y[:16]), ot.ShapeError, "castable to float32"),
            ((x[:16], y[:16, :1]), ot.ShapeError, "y: expected shape \\(16, 2\\), received \\(16, 1\\)"),
        ]
        for args, err, match in bad:
            with pytest.raises(err, match=match):
                tr.step(*args)
            with pytest.raises(err, match=match):
                tr.eval(*args)
        after = (tr.model().get_weights(), tr.n_steps, tr.export_state())
        for a, b in zip(before[0], after[0]):
            np.testing.assert_array_equal(a, b)
        assert before[1] == after[1] and before[2].step == after[2].step
        for k, (m, v) in before[2].moments.items():
            np.testing.assert_array_equal(after[2].moments[k][0], m)
            np.testing.assert_array_equal(after[2].moments[k][1], v)


def test_sparse_labels_out_of_range_are_refused(rng):
    model = dense_model(4, 3, loss="sparse_categorical_crossentropy", activation="softmax")
    with ot.Trainer(model, batch_size=4) as tr:
        with pytest.raises(ot.ShapeError, match="class labels must lie in \\[0, 2\\]"):
            tr.step(np.zeros((4, 4)), np.array([0, 1, 2, 3]))
        tr.step(np.zeros((4, 4)), np.array([[0], [1], [2], [1]]))  # (batch, 1) integer labels are accepted


def test_every_method_raises_after_free():
    model = seed_model()
    tr = ot.Trainer(model, batch_size=16)
    tr.free()
    tr.free()  # harmless
    x, y = seed_data()
    calls = [lambda: tr.step(x[:16], y[:16]), lambda: tr.eval(x[:16], y[:16]), lambda: tr.predict(x),
             tr.snapshot, tr.model, lambda: tr.calibrate_bn(x), lambda: tr.set_lr(0.1), lambda: tr.lr,
             lambda: tr.n_steps, lambda: tr.save_checkpoint("x"), lambda: tr.update_target(None),
             lambda: tr.__enter__()]
    for call in calls:
        with pytest.raises(ot.FreedError, match="this trainer was freed"):
            call()


def test_model_returned_is_independent_and_constructor_model_unchanged():
    model = seed_model()
    original = model.get_weights()
    x, y = seed_data()
    with ot.Trainer(model, batch_size=16) as tr:
        tr.step(x[:16], y[:16])
        m1 = tr.model()
        tr.step(x[16:32], y[16:32])
        m2 = tr.model()
    for a, b in zip(model.get_weights(), original):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(m1.get_weights()[0], m2.get_weights()[0])
    np.testing.assert_array_equal(m2.predict(x), m2.predict(x))  # usable after free


def test_from_artifacts_trains_without_the_model(tmp_path):
    model = seed_model()
    x, y = seed_data()
    ot.artifacts.build(model, loss=model.loss, optimizer=model.optimizer, out_dir=tmp_path / "art")
    with ot.Trainer(model, batch_size=16) as a, ot.Trainer.from_artifacts(tmp_path / "art", batch_size=16) as b:
        for i in range(3):
            assert a.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) == \
                b.step(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16])
        np.testing.assert_array_equal(a.predict(x), b.predict(x))
        assert b.model().weight_names() == model.weight_names()


def test_argument_errors():
    model = seed_model()
    with pytest.raises(ot.OrtrainError, match="batch_size: expected a positive int, received 0"):
        ot.Trainer(model, batch_size=0)
    with pytest.raises(ot.OrtrainError, match="nbatch_logical: expected a multiple of batch_size=16, received 24"):
        ot.Trainer(model, batch_size=16, nbatch_logical=24)
    with pytest.raises(ot.OrtrainError, match="weight_decay: expected a number in \\[0, 1\\]"):
        ot.Trainer(model, weight_decay=1.5)
    with pytest.raises(ot.OrtrainError, match="weight_decay: expected a number in \\[0, 1\\]"):
        ot.Trainer(dense_model(4, 2), weight_decay=-0.1)   # SGD takes decay too


def two_output_model():
    inp = ot.Input((4,))
    h = L.Dense(5, activation="tanh")(inp)
    model = ot.Model(inp, [L.Dense(3, activation="softmax")(h), L.Dense(1)(h)])
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="categorical_crossentropy")  # on the first output
    return model


def test_predict_and_snapshot_return_every_output(rng):
    model = two_output_model()
    x = rng.standard_normal((7, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 4)]
    with pytest.warns(UserWarning, match="dense_2.kernel, dense_2.bias do not affect the loss"):
        tr = ot.Trainer(model, batch_size=4)
    with tr:
        tr.step(x[:4], y)
        w1, b1, w2, b2, w3, b3 = tr.model().get_weights()
        h = np.tanh(x.astype(np.float64) @ w1 + b1)
        want = [softmax(h @ w2 + b2), h @ w3 + b3]
        target = tr.snapshot()
        for got in (tr.predict(x), tr.predict(x, batch_size=3), target.predict(x), target.predict(x, batch_size=2),
                    tr.model().predict(x)):
            assert isinstance(got, list) and [g.shape for g in got] == [(7, 3), (7, 1)]
            for g, ref in zip(got, want):
                np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6)
        for call in (tr.predict, target.predict):
            with pytest.raises(ot.OrtrainError, match="batch_size: expected a positive int or None, received -1"):
                call(x, batch_size=-1)
        assert isinstance(tr.predict(x[:0]), list) and tr.predict(x[:0])[1].shape == (0, 1)
    target.free()


def test_step_and_eval_check_labels_once_with_the_shared_rules(rng):
    model = dense_model(4, 3, loss="sparse_categorical_crossentropy", activation="softmax")
    x = rng.standard_normal((4, 4)).astype(np.float32)
    with ot.Trainer(model, batch_size=4) as tr:
        before = (tr.model().get_weights(), tr.n_steps)
        for labels, low, high in (([0, 1, -1, 2], -1, 2), ([0, 1, 3, 2], 0, 3)):
            for call in (tr.step, tr.eval):
                with pytest.raises(ot.ShapeError, match=rf"y: class labels must lie in \[0, 2\] \(the output has 3 "
                                                        rf"classes\), received values from {low} to {high}"):
                    call(x, np.array(labels))
        for a, b in zip(tr.model().get_weights(), before[0]):
            np.testing.assert_array_equal(a, b)
        assert tr.n_steps == before[1]
        assert tr.eval(x, np.array([0, 1, 2, 1])) == tr.eval(x, np.array([[0], [1], [2], [1]], np.float64))


def test_a_refused_resume_says_what_differs_from_the_model_that_wrote_the_checkpoint(tmp_path, monkeypatch):
    # A checkpoint records what its artifacts' key is made of: a model rebuilt with other dropout
    # seeds, other frozen weights or another loss is told which, with the fix.
    def model(seed=7, freeze=False, loss="mse"):
        m = ot.Sequential([ot.layers.Dense(4, seed=1), ot.layers.Dropout(0.3, seed=seed), ot.layers.Dense(2, seed=2)],
                          input_shape=(6,))
        if freeze:
            m.freeze(["dense_0.*"])
        m.compile(optimizer="adam", loss=loss)
        return m

    with ot.Trainer(model(), batch_size=4) as tr:
        tr.step(np.ones((4, 6)), np.zeros((4, 2)))
        tr.save_checkpoint(tmp_path / "ck")
        weights = tr.model().get_weights()
    for kwargs, says in (({"seed": 8}, "only in the seeds of its dropout .* ot.set_seed"),
                         ({"freeze": True}, "in its weights or which of them train \\(freezing\\);"),
                         ({"loss": "mae"}, "in the loss;"),
                         ({"loss_mask": 2}, "in the sample weighting .* written with loss_mask=None: to train on with another, "
                                          "resume with that one and hand the state over"),
                         ({"seed": 8, "loss": "mae", "freeze": True}, "in its weights or which of them train "
                                                                      "\\(freezing\\), the loss;")):
        mask = {"loss_mask": kwargs.pop("loss_mask")} if "loss_mask" in kwargs else {}
        with pytest.raises(ot.OrtrainError, match="'.*ck' does not fit this model: this model differs from the "
                                                  f"one that wrote it {says}"):
            ot.Trainer.from_checkpoint(model(**kwargs), tmp_path / "ck", batch_size=4, **mask)
    with ot.Trainer.from_checkpoint(model(), tmp_path / "ck", batch_size=4) as tr:
        for got, want in zip(tr.model().get_weights(), weights):
            np.testing.assert_array_equal(got, want)
    # written by an ortrain whose graph builder made other training graphs: said so, not the seeds
    monkeypatch.setattr(ot.artifacts, "BUILDER_REVISION", ot.artifacts.BUILDER_REVISION - 1)
    with ot.Trainer(model(), batch_size=4) as tr:
        tr.save_checkpoint(tmp_path / "old")
    monkeypatch.undo()
    with pytest.raises(ot.OrtrainError, match="differs from the one that wrote it in the revision of ortrain's graph "
                                              "builder"):
        ot.Trainer.from_checkpoint(model(), tmp_path / "old", batch_size=4)


def test_from_checkpoint_checks_loss_mask_before_building_anything(tmp_path):
    model = seed_model()
    x, y = seed_data()
    with ot.Trainer(model, batch_size=16) as tr:
        tr.step(x[:16], y[:16])
        tr.save_checkpoint(tmp_path / "ck")
    cache = ot.artifacts.cache_dir()
    before = sorted(p.name for p in cache.iterdir())
    for bad in (7, True, 2.5):
        with pytest.raises(ot.OrtrainError, match=rf"loss_mask: expected None, 1 .* or 2 .*received {bad!r}"):
            ot.Trainer.from_checkpoint(model, tmp_path / "ck", batch_size=16, loss_mask=bad)
    assert sorted(p.name for p in cache.iterdir()) == before


def test_a_failed_update_counts_no_step_and_drops_its_gradients(monkeypatch):
    x, y = seed_data()
    ref, model = seed_model(), seed_model()
    with ot.Trainer(ref, batch_size=16) as good, ot.Trainer(model, batch_size=16) as tr:
        good.step(x[:16], y[:16])
        tr.step(x[:16], y[:16])
        session = tr._session
        real = session._optimizer_step   # the step calls it holding the session's lock

        def fail():
            raise ot.OrtrainError("injected")
        monkeypatch.setattr(session, "_optimizer_step", fail)
        with pytest.raises(ot.OrtrainError, match="injected"):
            tr.step(x[16:32], y[16:32])
        monkeypatch.setattr(session, "_optimizer_step", real)
        assert (tr.n_steps, tr.n_updates) == (1, 1)
        # the next update holds only its own batch's gradients, as in a trainer that never failed
        assert tr.step(x[32:48], y[32:48]) == good.step(x[32:48], y[32:48])
        for a, b in zip(tr.model().get_weights(), good.model().get_weights()):
            np.testing.assert_array_equal(a, b)


def test_calibrate_bn_restores_every_statistic_when_a_later_layer_fails(monkeypatch, rng):
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(3), L.BatchNorm()], input_shape=(2,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x = rng.standard_normal((64, 2)).astype(np.float32) * 3 + 1
    with ot.Trainer(model, batch_size=8) as tr:
        tr.calibrate_bn(x[:8])  # creates the calibration runner
        before = tr.model().get_weights()
        calls = []
        real = tr._calib.run

        def run(feeds, names):
            calls.append(names)
            if len(calls) == 2:
                raise ot.OrtrainError("injected")
            return real(feeds, names)
        monkeypatch.setattr(tr._calib, "run", run)
        with pytest.raises(ot.OrtrainError, match="injected"):
            tr.calibrate_bn(x)
        assert len(calls) == 2  # the first layer's statistics had been written
        for a, b in zip(tr.model().get_weights(), before):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("where", ["train_step", "optimizer_step"])
def test_an_interrupt_leaves_the_counters_matching_the_weights(monkeypatch, where):
    """Python raises a KeyboardInterrupt once the runtime call it arrived during has returned: after
    the train step added its gradients, or after the update moved the weights."""
    x, y = seed_data()
    batches = [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(3)]
    with ot.Trainer(seed_model(), batch_size=16) as good, ot.Trainer(seed_model(), batch_size=16) as tr:
        good.step(*batches[0])
        tr.step(*batches[0])
        real = getattr(tr._session, "_" + where)   # the step calls it holding the session's lock

        def interrupted(*args, **kwargs):
            real(*args, **kwargs)
            raise KeyboardInterrupt
        monkeypatch.setattr(tr._session, "_" + where, interrupted)
        with pytest.raises(KeyboardInterrupt):
            tr.step(*batches[1])
        monkeypatch.undo()
        if where == "optimizer_step":  # the update ran: it counts
            good.step(*batches[1])
        assert (tr.n_steps, tr.n_updates) == (good.n_steps, good.n_updates)
        for a, b in zip(tr.model().get_weights(), good.model().get_weights()):
            np.testing.assert_array_equal(a, b)
        assert tr.step(*batches[2]) == good.step(*batches[2])  # no gradient of the interrupted batch left over
        for a, b in zip(tr.model().get_weights(), good.model().get_weights()):
            np.testing.assert_array_equal(a, b)


def test_free_from_another_thread_waits_for_the_call_in_flight(tmp_path):
    # onnxruntime's module, optimizer and state point into one another: a free() while another
    # thread was saving a checkpoint pulled the optimizer from under it and killed the process.
    script = tmp_path / "race.py"
    script.write_text(textwrap.dedent(f"""
        import threading, time, numpy as np, ortrain as ot
        m = ot.Sequential([ot.layers.Dense(64), ot.layers.Dense(4)], input_shape=(8,))
        m.compile(optimizer="adam", loss="mse")
        for trial in range(8):
            tr = ot.Trainer(m, batch_size=4)
            tr.step(np.ones((4, 8)), np.zeros((4, 4)))
            ended = []
            def save():
                try:
                    for _ in range(200):
                        tr.save_checkpoint({str(tmp_path / "c")!r})
                    ended.append("done")
                except ot.FreedError:
                    ended.append("freed")
            t = threading.Thread(target=save)
            t.start()
            time.sleep(0.005)
            tr.free()
            t.join()
            assert ended in (["done"], ["freed"]), ended
        print("ok")
        """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])


def test_copies_and_pickles_of_sessions_refused_of_values_independent(rng):
    import copy
    import pickle

    from ortrain import ag
    model = dense_model(3, 2)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    with ot.Trainer(model, batch_size=2) as tr:
        for make in (copy.copy, copy.deepcopy, pickle.dumps):   # a shallow copy shared the session
            with pytest.raises(ot.OrtrainError, match=r"a Trainer holds an onnxruntime session and cannot be copied "
                                                      r"or pickled; tr.save_checkpoint\(path\)"):
                make(tr)
        snap = tr.snapshot()
        want = snap.predict(x)   # its session is open: a copy opens its own
        shallow = copy.copy(snap)   # its own weights too: an update of the copy leaves the original
        tr.step(x, np.ones((2, 2), np.float32))
        tr.update_target(shallow, tau=1.0)
        np.testing.assert_array_equal(snap.predict(x), want)
        assert not np.array_equal(shallow.predict(x), want)
        for other in (copy.deepcopy(snap), pickle.loads(pickle.dumps(snap))):
            np.testing.assert_array_equal(other.predict(x), want)
            other.free()
        np.testing.assert_array_equal(snap.predict(x), want)
    history = model.fit(x, np.zeros((2, 2), np.float32), epochs=2, verbose=0,
                        callbacks=[ot.callbacks.EarlyStopping(monitor="loss")])
    for make in (copy.deepcopy, lambda h: pickle.loads(pickle.dumps(h))):   # sklearn's clone, a saved history
        assert make(history).history == history.history
    W = ag.param(np.ones((3, 2), np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x: ag.mean(x @ W), optimizer=opt)
    step(x=x)
    with pytest.raises(ot.OrtrainError, match="a CaptureStep holds an onnxruntime session .* capture the function"):
        copy.deepcopy(step)
    W2, opt2 = copy.deepcopy(W), copy.deepcopy(opt)
    step(x=x)   # the copies do not move with the live param
    assert W2.name == "W" and not np.array_equal(W2.numpy(), W.numpy())
    assert opt2.state()["step"] == 1 and opt.state()["step"] == 2
    np.testing.assert_array_equal(opt2.params[0].numpy(), W2.numpy())
    step.free()


def test_a_forked_child_can_step_free_and_exit_with_the_parents_trainer(tmp_path):
    # onnxruntime-training's module crashed a forked child that destroyed it (free, gc or exit).
    script = tmp_path / "fork.py"
    script.write_text(textwrap.dedent("""
        import os, sys, numpy as np, ortrain as ot
        x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
        m = ot.Sequential([ot.layers.Dense(16, activation="relu"), ot.layers.Dense(2)], input_shape=(3,), seed=0)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=4)
        tr.step(x, y)
        statuses = []
        for how in ("free", "exit"):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, repr(tr.step(x, y)).encode())
                if how == "free":
                    tr.free()
                sys.exit(0)
            os.close(w)
            child_loss = float(os.read(r, 100))
            statuses.append((os.waitpid(pid, 0)[1], child_loss))
        want = tr.step(x, y)  # the children's steps moved only their own copies
        assert statuses == [(0, want), (0, want)], (statuses, want)
        print("ok")
        """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stdout, run.stderr[-2000:])


def test_a_fork_while_other_threads_open_or_run_sessions_leaves_the_child_a_clear_answer(tmp_path):
    # A session another thread was opening at the fork (no runtime objects yet) broke the child's
    # after-fork repair, so the objects after it kept the parent's locks and runtime objects: the
    # child crashed freeing a trainer (21 of 30 forks). A session another thread was running at the
    # fork hung the child that stepped it (onnxruntime waits for the thread of that call); it is
    # refused there now, saying why, and free() still works.
    script = tmp_path / "fork_busy.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, threading, time, numpy as np, ortrain as ot
        from ortrain._lifetime import new_lock
        from ortrain.engine.session import TrainingSession
        x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
        m = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(2)], input_shape=(3,), seed=0)
        m.compile(optimizer="adam", loss="mse")
        tr, other = ot.Trainer(m, batch_size=4), ot.Trainer(m, batch_size=4)
        snap = other.snapshot()
        opening = []
        for _ in range(6):  # as TrainingSession.__init__ leaves one before its runtime objects exist
            half = TrainingSession.__new__(TrainingSession)
            half._lock = new_lock(half)
            opening.append(half)
        held, release = threading.Event(), threading.Event()
        def running():  # holds the locks a step and a prediction hold while onnxruntime runs them
            with other._session._lock, snap._lock:
                held.set()
                release.wait()
        t = threading.Thread(target=running)
        t.start()
        held.wait()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            got = [tr.step(x, y)]
            for call in (lambda: other.step(x, y), lambda: snap.predict(x)):
                try:
                    call()
                    got.append("ran")
                except ot.FreedError as exc:
                    got.append("forked while another thread of its parent was running this" in str(exc))
            tr.free(); other.free(); snap.free()
            os.write(w, repr(got).encode())
            sys.exit(0)
        os.close(w)
        for _ in range(600):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            status = "hung"
        release.set()
        t.join()
        got = os.read(r, 1000).decode()
        want = [tr.step(x, y), True, True]  # the child's step moved its own copy only
        assert status == 0 and got == repr(want), (status, got, want)
        print("ok")
        """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stdout, run.stderr[-2000:])

def exits_cleanly(script, source: str, printed: list, times: int = 1, timeout: int = 120) -> None:
    """Run ``source`` (dedented) as ``script`` in a new interpreter ``times`` times: each run exits 0
    having printed the words ``printed``."""
    script.write_text(textwrap.dedent(source))
    for _ in range(times):
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout)
        assert run.returncode == 0 and run.stdout.split() == printed, (run.returncode, run.stdout,
                                                                       run.stderr[-2000:])


def test_the_interpreter_exits_cleanly_while_daemon_threads_predict_or_step(tmp_path):
    # A daemon thread predicting (model, snapshot or trainer) when the main thread ended aborted the
    # process in onnxruntime's teardown ("terminate called without an active exception", rc 134), as
    # did a thread an atexit handler started and left running. Threads that atexit handlers start
    # later run as before (they waited for good, even where a finished thread's ident was reused),
    # and a daemon thread waiting for its input's data inside a snapshot's predict does not hold up
    # the exit.
    exits_cleanly(tmp_path / "exit_daemon.py", """
        import atexit, queue, threading, time
        import numpy as np
        def late():  # runs after ortrain's exit handlers
            time.sleep(0.3)  # the short thread has ended: a new one may be given its ident
            same = [float(m.predict(x).sum()) == want]
            for daemon in (False, True):
                t = threading.Thread(target=lambda: same.extend(float(f(x).sum()) == want for f in
                                                                (m.predict, snap.predict, tr.predict)), daemon=daemon)
                t.start()
                t.join()
            print("late", same == [True] * 7, time.monotonic() - ended < 2.0)
        atexit.register(late)
        import ortrain as ot
        x, y = np.ones((64, 256), np.float32), np.zeros((64, 4), np.float32)
        m = ot.Sequential([ot.layers.Dense(256, activation="relu"), ot.layers.Dense(4)], input_shape=(256,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=64)
        snap = tr.snapshot()
        want = float(m.predict(x).sum())
        def loop(f):
            while True:
                f()
        def early():  # runs before ortrain's exit handlers
            threading.Thread(target=loop, args=(lambda: tr.predict(x),)).start()  # left running
            print("early", float(snap.predict(x).sum()) == want)
        atexit.register(early)
        for f in (lambda: m.predict(x), lambda: snap.predict(x), lambda: tr.predict(x), lambda: m.evaluate(x, y)):
            threading.Thread(target=loop, args=(f,), daemon=True).start()
        threading.Thread(target=time.sleep, args=(0.2,), daemon=True).start()
        class Lazy:  # an array whose data never comes
            def __array__(self, dtype=None, copy=None):
                return queue.Queue().get()
        threading.Thread(target=snap.predict, args=(Lazy(),), daemon=True).start()
        time.sleep(0.5)
        ended = time.monotonic()
        """, ["early", "True", "late", "True", "True"])
    # A worker left running at the exit that a later atexit handler stops and joins goes on while
    # joined (HELD_AT_EXIT_S, 30 s, is the longest it is held otherwise): the exit hung. One joined
    # with a timeout that keeps predicting was let go for good, and aborted the process.
    script = tmp_path / "exit_join.py"
    script.write_text(textwrap.dedent("""
        import atexit, threading, time
        import numpy as np
        def stop_worker():  # runs after ortrain's exit handlers
            busy.join(timeout=0.3)  # a worker that goes on: held again once nobody waits for it
            time.sleep(0.2)  # (the handler's other work)
            stop.set()
            worker.join()
            print("joined", calls[0] > 0)
        atexit.register(stop_worker)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(4)], input_shape=(16,), seed=1)
        x = np.ones((8, 16), np.float32)
        stop, calls = threading.Event(), [0]
        def work():
            while not stop.is_set():
                m.predict(x)
                calls[0] += 1
        def loop():
            while True:
                m.predict(x)
        worker = threading.Thread(target=work, daemon=True)
        busy = threading.Thread(target=loop, daemon=True)
        for t in (worker, busy):
            t.start()
        time.sleep(0.3)
        """))
    began = time.monotonic()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.split() == ["joined", "True"], (run.returncode, run.stdout,
                                                                           run.stderr[-2000:])
    assert time.monotonic() - began < 8  # a joined worker goes on at once (unjoined, it is held 30 s)


def test_the_exit_holds_threads_started_late_and_joins_only_a_spared_threads_join(tmp_path):
    # Threads a daemon thread started after the exit began were not held, and a join by another
    # daemon thread (a supervisor) let the worker it joined through: both predicted through the
    # teardown and aborted the process. A worker held with a snapshot's lock taken (a chunked
    # prediction) stalled the handler that joined the worker waiting for that lock, 30 s; and every
    # held thread scanned every thread's frames each 20 ms, so 300 joins took 10 s.
    exits_cleanly(tmp_path / "exit_late.py", """
        import atexit, threading, time
        import numpy as np
        def stop_all():  # runs after ortrain's exit handlers
            time.sleep(0.3)  # (the handler's other work: the spawned and supervised threads run on meanwhile)
            began = time.monotonic()
            stop.set()
            for w in workers:
                w.join()
            print("joined", len(workers), time.monotonic() - began < 5)
        atexit.register(stop_all)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(64, activation="relu"), ot.layers.Dense(4)], input_shape=(32,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        x = np.ones((128, 32), np.float32)
        tr = ot.Trainer(m, batch_size=128)
        snap = tr.snapshot()
        stop = threading.Event()
        def predict_for_a_while():
            for _ in range(50):
                m.predict(x)
        def server():  # a thread per request, as socketserver's ThreadingMixIn starts them
            while True:
                threading.Thread(target=predict_for_a_while, daemon=True).start()
                time.sleep(0.002)
        def supervisor():  # runs a job in a thread of its own and waits for it
            while True:
                job = threading.Thread(target=predict_for_a_while, daemon=True)
                job.start()
                job.join()
        def snapshot_worker():
            while not stop.is_set():
                snap.predict(x, batch_size=8)  # 16 runs a call, the snapshot's lock taken
        def light_worker():
            while not stop.is_set():
                time.sleep(0.01)
                m.predict(x[:2])
        workers = [threading.Thread(target=snapshot_worker, daemon=True) for _ in range(3)]
        workers += [threading.Thread(target=light_worker, daemon=True) for _ in range(150)]
        for t in workers + [threading.Thread(target=server, daemon=True),
                            threading.Thread(target=supervisor, daemon=True)]:
            t.start()
        time.sleep(0.5)
        """, ["joined", "153", "True"], times=2)


def test_the_exit_holds_a_thread_inside_a_long_chunked_prediction_at_its_next_chunk(tmp_path):
    # A thread inside a chunked prediction (a snapshot's lock taken) was never held: the exit
    # waited QUIET_AT_EXIT_S (5 s) for that lock, then tore the interpreter down under the running
    # prediction and aborted (rc 134). It is held at its next chunk, and the exit goes on then.
    exits_cleanly(tmp_path / "exit_chunks.py", """
        import atexit, threading, time
        import numpy as np
        def late():  # runs after ortrain's exit handlers
            print("late", time.monotonic() - ended < 3.0)
        atexit.register(late)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(256, activation="relu"), ot.layers.Dense(256, activation="relu"),
                           ot.layers.Dense(4)], input_shape=(256,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        snap = ot.Trainer(m, batch_size=64).snapshot()
        x = np.broadcast_to(np.ones(256, np.float32), (2_000_000, 256))  # (a 2 GB array's rows, in no memory)
        def work():
            while True:
                snap.predict(x, batch_size=64)
        threading.Thread(target=work, daemon=True).start()
        time.sleep(0.5)
        ended = time.monotonic()
        """, ["late", "True"], times=2)


def test_a_handler_waiting_for_a_lock_that_a_held_thread_holds_lets_that_thread_go_on(tmp_path):
    # Threads held inside a call that holds a snapshot's lock (update_target moving its weights) kept
    # a later handler that predicts with that snapshot, or moves it, waiting 30 s for each of them.
    exits_cleanly(tmp_path / "exit_lock.py", """
        import atexit, threading, time
        import numpy as np
        def handler():  # runs after ortrain's exit handlers
            began = time.monotonic()
            same = float(snap.predict(x).sum()) == float(snap.predict(x).sum())
            tr.update_target(snap, tau=0.5)
            print("handler", same, time.monotonic() - began < 5)
        atexit.register(handler)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(1024, activation="relu"), ot.layers.Dense(1024, activation="relu"),
                           ot.layers.Dense(4)], input_shape=(256,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=64)
        snap = tr.snapshot()
        x = np.ones((8, 256), np.float32)
        def move():
            while True:
                tr.update_target(snap, tau=0.01)
        for _ in range(2):
            threading.Thread(target=move, daemon=True).start()
        time.sleep(0.5)
        """, ["handler", "True", "True"], timeout=200)


def test_the_exit_sees_joins_begun_before_it_and_joins_taken_before_it(tmp_path):
    # A handler joining a supervisor already blocked in its job's join (begun before the exit), a
    # worker that joins a thread per job, and a join bound before the exit patched Thread.join
    # (atexit.register(worker.join)): the joined threads stayed held, and each exit took 30 s.
    exits_cleanly(tmp_path / "exit_joins.py", """
        import atexit, threading, time
        import numpy as np
        stop = threading.Event()
        def work():
            while not stop.is_set():
                m.predict(x)
        bound = threading.Thread(target=work, daemon=True)
        atexit.register(lambda: print("bound", time.monotonic() - began < 5))  # runs last
        atexit.register(bound.join)  # the join as it was before the exit
        def handler():  # runs after ortrain's exit handlers
            global began
            began = time.monotonic()
            supervisor.join()
            print("supervisor", time.monotonic() - began < 5)
            began = time.monotonic()
            stop.set()
            chain.join()
            print("chain", time.monotonic() - began < 5)
            began = time.monotonic()
        atexit.register(handler)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(4)], input_shape=(16,), seed=1)
        x = np.ones((8, 16), np.float32)
        def job(n):
            for _ in range(n):
                m.predict(x)
        def supervise():  # blocked in a join begun before the exit, of a job that predicts through it
            j = threading.Thread(target=job, args=(100_000,), daemon=True)
            j.start()
            j.join()
        def run_jobs():  # a worker running each job in a thread of its own, joined
            while not stop.is_set():
                j = threading.Thread(target=job, args=(20,), daemon=True)
                j.start()
                j.join()
        supervisor = threading.Thread(target=supervise, daemon=True)
        chain = threading.Thread(target=run_jobs, daemon=True)
        for t in (supervisor, chain, bound):
            t.start()
        time.sleep(0.3)
        """, ["supervisor", "True", "chain", "True", "bound", "True"], timeout=200)


def test_a_signal_handler_may_join_a_thread_while_the_exit_joins_one(tmp_path):
    # The exit's bookkeeping of joins took a lock that a signal handler's join, run in the same
    # thread in the middle of that bookkeeping, waited for forever; and a join that began and
    # ended in the handler then failed the outer one's bookkeeping with a KeyError.
    script = tmp_path / "exit_signal.py"
    script.write_text(textwrap.dedent("""
        import atexit, signal, threading, time
        done = threading.Thread(target=lambda: None)
        def on_alarm(*_):
            done.join()
        def handler():  # runs after ortrain's exit handlers
            done.start()
            done.join()
            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
            began, n = time.monotonic(), 0
            try:
                while time.monotonic() - began < 1.5:
                    t = threading.Thread(target=lambda: None)
                    t.start()
                    t.join()
                    n += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            print("joins", n > 100)
        atexit.register(handler)
        import ortrain
        """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.split() == ["joins", "True"] and not run.stderr, \
        (run.returncode, run.stdout, run.stderr[-2000:])


def test_a_thread_started_by_start_new_thread_is_held_at_the_exit(tmp_path):
    # Threads unknown to threading (started with _thread.start_new_thread) were not seen at the
    # exit: one predicting then aborted the process. One a handler starts is spared, as a Thread is.
    exits_cleanly(tmp_path / "exit_raw.py", """
        import _thread, atexit, threading, time
        import numpy as np
        def late():  # runs after ortrain's exit handlers
            began, done = time.monotonic(), threading.Event()
            def job():
                m.predict(x)
                done.set()
            _thread.start_new_thread(job, ())
            print("late", done.wait(10) and time.monotonic() - began < 5)
        atexit.register(late)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(4)], input_shape=(16,), seed=1)
        x = np.ones((8, 16), np.float32)
        def loop():
            while True:
                m.predict(x)
        _thread.start_new_thread(loop, ())
        time.sleep(0.3)
        """, ["late", "True"], times=3, timeout=60)


def test_the_exits_look_at_locks_survives_sessions_made_meanwhile():
    # The exit lists the objects with a lock while other threads make more: the listing raised
    # "Set changed size during iteration" in the thread being held.
    import threading

    from ortrain import _lifetime

    class Owner:
        pass

    made, stop = [], threading.Event()

    def make():
        while not stop.is_set():
            owner = Owner()
            owner._lock = _lifetime.new_lock(owner)
            made.append(owner)
            if len(made) > 2000:
                made.clear()

    maker = threading.Thread(target=make)
    maker.start()
    try:
        for _ in range(500):
            _lifetime._look()
            assert _lifetime._seen == {}  # (no thread waits for another: nothing is exiting)
    finally:
        stop.set()
        maker.join()


def test_a_snapshot_freed_from_another_thread_raises_freed_error_only(rng):
    import threading
    import time

    x = rng.standard_normal((16, 8)).astype(np.float32)
    model = ot.Sequential([L.Dense(32, activation="relu"), L.Dense(2)], input_shape=(8,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    other = set()
    with ot.Trainer(model, batch_size=16) as tr:
        for trial in range(20):
            snap = tr.snapshot()

            def use(snap=snap):
                try:
                    while True:
                        snap.predict(x)
                        snap.get_weights()
                        tr.update_target(snap, tau=0.5)
                except ot.FreedError:
                    pass
                except Exception as exc:  # noqa: BLE001 - what the race raised is the test
                    other.add(repr(exc)[:120])

            threads = [threading.Thread(target=use) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.001 * (trial % 5))
            snap.free()
            for t in threads:
                t.join()
    assert other == set()


@pytest.mark.parametrize("read", ["get_weights", "snapshot", "model", "update_target"])
def test_weights_read_while_another_thread_steps_are_all_of_one_step(read):
    """An actor reading a learner's weights while the learner steps gets the weights after one step,
    never some after step k and the rest after k + 1 (a state the trainer never held)."""
    import hashlib
    import threading

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 10)).astype(np.float32), rng.integers(0, 3, 32)
    model = ot.Sequential([L.Dense(32, activation="relu"), L.Dense(32, activation="relu"), L.Dense(3)],
                          input_shape=(10,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    digest = lambda a: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()  # noqa: E731
    with ot.Trainer(model, batch_size=32, threads=1) as tr:
        target = tr.snapshot()
        states, reads, stop = [tr.get_weights()], [], threading.Event()

        def reader():
            while not stop.is_set():
                if read == "get_weights":
                    reads.append(tr.get_weights())
                elif read == "snapshot":
                    snap = tr.snapshot()
                    reads.append(snap.get_weights())
                    snap.free()
                elif read == "model":
                    reads.append(tr.model().get_weights())
                else:
                    tr.update_target(target, tau=1.0)
                    reads.append(target.get_weights())

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for _ in range(150):
                tr.step(x, y)
                states.append(tr.get_weights())
        finally:
            stop.set()
            thread.join()
        target.free()
    step_of = [{digest(s[j]): k for k, s in enumerate(states)} for j in range(len(states[0]))]
    seen = [tuple(step_of[j].get(digest(a)) for j, a in enumerate(w)) for w in reads]
    assert reads and all(None not in k and len(set(k)) == 1 for k in seen), \
        [k for k in seen if None in k or len(set(k)) > 1][:3]


def test_a_fork_while_another_thread_steps_leaves_the_child_a_usable_trainer(tmp_path):
    # The child inherited the session's lock held by the stepping thread, which does not exist
    # there: its free() waited forever.
    setup = """
        import numpy as np, ortrain as ot
        m = ot.Sequential([ot.layers.Dense(64), ot.layers.Dropout(0.5), ot.layers.Dense(2)], input_shape=(32,),
                          seed=0)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=256)  # drawing the masks, the step lets other threads run
        x, y = np.ones((256, 32), np.float32), np.zeros((256, 2), np.float32)
        """
    assert forks_that_hang(tmp_path, setup, busy="tr.step(x, y)", in_child="tr.free()") == "hung 0"


@pytest.mark.parametrize("where, runs", [("train_step", True), ("optimizer_step", False), ("optimizer_step", True)])
def test_an_interrupted_step_not_counted_draws_its_dropout_masks_again(monkeypatch, where, runs):
    # the step was dropped but its masks were drawn: every later step took the next step's masks
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 6), np.float32), rng.random((32, 2), np.float32)

    def model():
        m = ot.Sequential([ot.layers.Dense(16, activation="tanh"), ot.layers.Dropout(0.5), ot.layers.Dense(2)],
                          input_shape=(6,), seed=0)
        m.compile(optimizer="adam", loss="mse")
        return m

    with ot.Trainer(model(), batch_size=32) as good, ot.Trainer(model(), batch_size=32) as tr:
        good.step(x, y)
        tr.step(x, y)
        real = getattr(tr._session, "_" + where)

        def interrupted(*args, **kwargs):
            if runs:
                real(*args, **kwargs)
            raise KeyboardInterrupt
        monkeypatch.setattr(tr._session, "_" + where, interrupted)
        with pytest.raises(KeyboardInterrupt):
            tr.step(x, y)
        monkeypatch.undo()
        if where == "optimizer_step" and runs:  # the update ran: it counts, masks and all
            good.step(x, y)
        for _ in range(2):
            assert tr.step(x, y) == good.step(x, y)
        assert (tr.n_steps, tr.n_updates) == (good.n_steps, good.n_updates)
        for a, b in zip(tr.model().get_weights(), good.model().get_weights()):
            np.testing.assert_array_equal(a, b)


def test_a_truncated_checkpoint_says_it_ends_early(tmp_path):
    # the message gave struct's "unpack_from requires a buffer of at least ... bytes"
    model = seed_model()
    with ot.Trainer(model, batch_size=16) as tr:
        x, y = seed_data()
        tr.step(x[:16], y[:16])
        tr.save_checkpoint(tmp_path / "ck")
    (tmp_path / "cut").write_bytes((tmp_path / "ck").read_bytes()[:100])
    with pytest.raises(ot.OrtrainError, match=r"cannot be read: the file ends early \(100 bytes; a copy or a write "
                                              r"cut short\?\).*use another checkpoint") as exc:
        ot.Trainer.from_checkpoint(model, tmp_path / "cut", batch_size=16)
    assert "unpack_from" not in str(exc.value)


def test_a_trainer_that_writes_no_file_makes_no_scratch_folder(monkeypatch):
    # an empty temporary folder made and removed cost 0.3-8 ms on a disk, a fifth of a small
    # model's warm start
    from ortrain import artifacts
    made = []
    real = artifacts.scratch_dir

    def counting():
        made.append(1)
        return real()

    monkeypatch.setattr(artifacts, "scratch_dir", counting)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    ot.Trainer(model, batch_size=4).free()  # builds the artifacts
    made.clear()
    with ot.Trainer(model, batch_size=4) as tr:  # the artifacts' checkpoint and update graph
        tr.step(x, y)
        model.train_state = tr.export_state()
    assert made == []
    with ot.Trainer(model, batch_size=4) as tr:  # Adam's moments go into a checkpoint written first
        w_before = [w.copy() for w in tr.model().get_weights()]
        tr.step(x, y)
    assert made == [1]
    with ot.Trainer(model, batch_size=4, weight_decay=0.5) as tr:  # another update graph is written too
        pass
    assert len(made) == 2 and len(w_before) == 2


def test_many_fits_keep_no_record_of_each_scratch_folder():
    # every fit with Adam's moments writes a checkpoint into a new scratch folder, and the process kept
    # each folder's name in its set of folders looked through for leftovers: about 100 bytes a fit, for good
    from ortrain import _files
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    model.fit(x, y, batch_size=4, verbose=0)
    swept = len(_files._SWEPT)
    for _ in range(5):
        model.fit(x, y, batch_size=4, verbose=0)
    assert model.optimizer.step == 6 and len(_files._SWEPT) == swept


def test_two_trainers_over_shared_layers_stay_in_step_through_set_weights():
    # a GAN's discriminator and the combined model holding it frozen: each trainer trains its own copy,
    # so the generator trained against the first discriminator for good; set_weights hands it over
    rng = np.random.default_rng(0)
    layers = ot.layers
    gen = ot.Sequential([layers.Dense(3, name="g0")], input_shape=(2,), seed=1)
    disc = ot.Sequential([layers.Dense(1, activation="sigmoid", name="d0")], input_shape=(3,), seed=2)
    disc.compile(optimizer=ot.optim.SGD(lr=0.5), loss="binary_crossentropy")
    z = ot.Input((2,))
    combined = ot.Model(z, disc.layers[0](gen.layers[0](z)))
    combined.freeze(disc.layers)
    combined.compile(optimizer=ot.optim.SGD(lr=0.5), loss="binary_crossentropy")
    wg, bg = (w.astype(np.float64) for w in gen.get_weights())
    wd, bd = (w.astype(np.float64) for w in disc.get_weights())
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    with ot.Trainer(disc, batch_size=8) as tr_d, ot.Trainer(combined, batch_size=4) as tr_c:
        assert tr_c.weight_names() == ["g0.kernel", "g0.bias", "d0.kernel", "d0.bias"]
        for _ in range(3):
            x, y = rng.normal(size=(8, 3)), (np.arange(8) < 4)[:, None] * 1.0
            tr_d.step(x, y)
            grad = (sig(x @ wd + bd) - y) / 8  # mean binary cross-entropy through the sigmoid
            wd, bd = wd - 0.5 * x.T @ grad, bd - 0.5 * grad.sum(0)
            tr_c.set_weights(dict(zip(tr_d.weight_names(), tr_d.get_weights())))
            noise = rng.normal(size=(4, 2))
            tr_c.step(noise, np.ones((4, 1)))
            h = noise @ wg + bg
            dh = ((sig(h @ wd + bd) - 1) / 4) @ wd.T
            wg, bg = wg - 0.5 * noise.T @ dh, bg - 0.5 * dh.sum(0)
        for got, want in zip(tr_c.get_weights(), (wg, bg, wd, bd)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        before = tr_c.get_weights()
        for bad, error, message in ((["one"], ot.OrtrainError, r"expected 4 arrays"),
                                    ({"d0.kernel": np.ones((2, 1))}, ot.ShapeError, r"expected shape \(3, 1\)"),
                                    ({"d0.bias": [np.nan]}, ot.NonFiniteError, r"holds nan"),
                                    ({"d1.bias": [0.0]}, ot.OrtrainError, r"unknown weight names \['d1.bias'\]")):
            with pytest.raises(error, match=message):
                tr_c.set_weights({"g0.bias": np.zeros(3), **bad} if isinstance(bad, dict) else bad)
        for got, want in zip(tr_c.get_weights(), before):
            np.testing.assert_array_equal(got, want)


def test_a_renamed_model_resumes_its_checkpoint(rng, tmp_path):
    # the graph's name (the model's) was in the artifacts' key: the resume was refused, blaming the layers
    model = ot.Sequential([ot.layers.Dense(2, activation="sigmoid")], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, y)
        tr.save_checkpoint(tmp_path / "c.ckpt")
        tr.step(x, y)
        want = tr.get_weights()
    model.name = "renamed"
    with ot.Trainer.from_checkpoint(model, tmp_path / "c.ckpt", batch_size=4) as resumed:
        resumed.step(x, y)
        for a, b in zip(resumed.get_weights(), want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_export_state_hands_over_copies_of_the_moments_of_weights_frozen_here():
    # the moments of a weight frozen in the trainer were the model's own arrays: an edit of the exported
    # state changed the constructor's model (which a Trainer never changes) and the trainer's checkpoints
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    model = ot.Sequential([ot.layers.Dense(4, activation="tanh"), ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=4, verbose=0)
    model.freeze("dense_1.*")
    before = {n: [m.copy() for m in ms] for n, ms in model.train_state.moments.items()}
    with ot.Trainer(model, batch_size=4) as tr:
        state = tr.export_state()
        state.moments["dense_1.bias"][0][:] = 7.0
        assert not np.any(tr.export_state().moments["dense_1.bias"][0] == 7.0)
    for name, ms in model.train_state.moments.items():
        for a, b in zip(ms, before[name], strict=True):
            np.testing.assert_array_equal(a, b)


def test_export_state_part_way_through_an_accumulation_period_warns_and_counts_only_whole_periods():
    # it left the accumulated batches out without a word and still counted them (3 where a checkpoint
    # at the same point records 2), so a fit continued from it updated a batch late
    rng = np.random.default_rng(0)
    model = dense_model(3, 2)
    with ot.Trainer(model, batch_size=4, nbatch_logical=8) as tr:
        for _ in range(3):
            tr.step(rng.standard_normal((4, 3)).astype(np.float32), np.zeros((4, 2), np.float32))
        with pytest.warns(UserWarning, match=r"export_state: 1 batch\(es\) accumulated towards the next update are "
                                             r"left out of the state: their gradients, and their count in n_steps "
                                             r"\(what their forward passes changed stays"):
            state = tr.export_state()
        assert (state.n_steps, state.step) == (2, 1)
        tr.step(rng.standard_normal((4, 3)).astype(np.float32), np.zeros((4, 2), np.float32))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # on a boundary: no warning
            assert tr.export_state().n_steps == 4


def _constant_gradient_trainer():
    """A Trainer whose gradient stays constant: mean |x W - 1000| with small weights and rate has
    the gradient -mean(x) for every weight, so Adam's first moment after k updates is
    g * (1 - 0.9**k), whatever the weights. Returns the trainer, a batch, and the updates that a
    state's moments hold."""
    model = ot.Sequential([L.Dense(1, use_bias=False)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=1e-6), loss="mae")
    x = np.tile(np.float32([[0.5, 1.0, 2.0, 0.25]]), (16, 1))
    y = np.full((16, 1), 1000.0, np.float32)
    g = -x.mean(0)

    def updates_in(moments):
        m = next(iter(moments.values()))[0].reshape(-1).astype(np.float64)
        return np.log(1 - m / g) / np.log(0.9)
    return ot.Trainer(model, batch_size=16), x, y, updates_in


def test_export_state_and_save_checkpoint_from_another_thread_hold_one_steps_counters_and_moments(tmp_path):
    # the counters were read before the session's lock, the moments after it: a checkpoint saved
    # without error was refused at load ("197 updates recorded, the optimizer state holds 300"),
    # and export_state paired one step's count with another's moments
    import threading
    import time
    tr, x, y, updates_in = _constant_gradient_trainer()
    tr.step(x, y)
    stop = threading.Event()

    def steps():
        # at most 80 updates: past about 90, float32 moments (1 - 0.9**k) no longer tell k from k + 1
        while not stop.is_set() and tr.n_steps < 80:
            tr.step(x, y)
            time.sleep(0.0001)  # turns for the other thread too (the lock is not fair)

    stepper = threading.Thread(target=steps)
    stepper.start()
    paths = []
    try:
        for i in range(40):
            state = tr.export_state()
            assert state.step == state.n_steps
            np.testing.assert_allclose(updates_in(state.moments), state.step, atol=0.3)  # steps are 1 apart
            if i % 4 == 0:
                paths.append(tr.save_checkpoint(tmp_path / f"c{i}"))
    finally:
        stop.set()
        stepper.join()
    for path in paths:
        resumed = ot.Trainer.from_checkpoint(tr.model(), path, batch_size=16)
        state = resumed.export_state()
        np.testing.assert_allclose(updates_in(state.moments), state.step, atol=0.3)
        resumed.free()
    tr.free()


def test_a_second_interrupt_during_the_recovery_of_an_interrupted_update_still_counts_it(monkeypatch):
    # the count's read back was stopped by a second Ctrl-C: the weights moved, n_updates did not,
    # and every later checkpoint was refused at load
    x, y = seed_data()
    batches = [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(3)]
    with ot.Trainer(seed_model(), batch_size=16) as good, ot.Trainer(seed_model(), batch_size=16) as tr:
        for b in batches[:2]:
            good.step(*b)
        tr.step(*batches[0])
        session, reads = tr._session, []
        monkeypatch.setattr(session, "_optimizer_step", then_interrupted(session._optimizer_step))
        monkeypatch.setattr(session, "optimizer_state", interrupted_first(session.optimizer_state, reads))
        with pytest.raises(KeyboardInterrupt):
            tr.step(*batches[1])
        monkeypatch.undo()
        assert len(reads) == 2
        assert (tr.n_steps, tr.n_updates) == (good.n_steps, good.n_updates) == (2, 2)
        for a, b in zip(tr.model().get_weights(), good.model().get_weights()):
            np.testing.assert_array_equal(a, b)
        assert tr.step(*batches[2]) == good.step(*batches[2])


def test_freezing_the_model_after_its_trainer_is_made_is_said_once_and_changes_nothing(rng):
    # it trained on without a word, where a fit says so (and Keras warns after compile)
    import warnings
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    model = ot.Sequential([L.Dense(8, activation="relu"), L.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    other = ot.Sequential([L.Dense(2)], input_shape=(4,), seed=0)
    with ot.Trainer(model, batch_size=8) as tr, warnings.catch_warnings():
        warnings.simplefilter("error")
        tr.step(x, y)
        other.freeze("dense_0.kernel")            # another model: nothing to say
        model.freeze("dense_0.kernel")
        model.unfreeze("dense_0.kernel")          # and back: the same weights train
        tr.step(x, y)
        model.layers[0].trainable = False
        before = tr.get_weights()[0].copy()
        with pytest.warns(UserWarning, match=re.escape(
                "model 'sequential': the weights that train changed after this Trainer was made (layer.trainable, "
                "freeze, unfreeze, freeze_bn_stats or unfreeze_bn_stats); a trainer trains its own copy, whose "
                "graphs fix which weights train, so it goes on training the weights it started with. To train with "
                "the change, hand the state over: m = tr.model(); m.train_state = tr.export_state();")):
            tr.step(x, y)
        assert not np.array_equal(tr.get_weights()[0], before)   # it trained on, as it said
        model.layers[1].trainable = False
        tr.step(x, y)                                            # said once
        # the hand-over it names trains the change
        m = tr.model()
        m.train_state = tr.export_state()
        m.freeze("dense_0.kernel")
    with ot.Trainer(m, batch_size=8) as tr2:
        kept = tr2.get_weights()[0].copy()
        tr2.step(x, y)
        np.testing.assert_array_equal(tr2.get_weights()[0], kept)


def test_a_thread_let_go_for_a_lock_it_held_is_held_again_once_it_lets_it_go(tmp_path):
    # A daemon in chunked predictions held at a chunk was let go while a later handler waited for
    # the snapshot's lock; once the handler had predicted, the daemon's next prediction still went
    # on (the look that saw the wait was trusted for 50 ms) and ran through the teardown (rc 134).
    exits_cleanly(tmp_path / "exit_let_go.py", """
        import atexit, threading, time
        import numpy as np
        def handler():  # runs after ortrain's exit handlers
            print("handler", float(snap.predict(x[:8]).sum()) == want)
            time.sleep(0.01)  # (the handler's other work)
        atexit.register(handler)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(1024), ot.layers.Dense(4)], input_shape=(1024,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        snap = ot.Trainer(m, batch_size=8).snapshot()
        x = np.ones((1536, 1024), np.float32)
        want = float(snap.predict(x[:8]).sum())
        def work():
            while True:
                snap.predict(x, batch_size=512)
        threading.Thread(target=work, daemon=True).start()
        time.sleep(0.3)
        """, ["handler", "True"], times=3)


def test_a_handler_waits_through_a_thread_that_waits_for_a_held_thread(tmp_path):
    # A handler predicting with a target that a thread moving it held (update_target), while that
    # thread waited for the trainer's session, which a held thread held (export_state): the exit
    # waited 5 s for the target's lock, then the handler 25 s (only held threads' locks were seen).
    exits_cleanly(tmp_path / "exit_chain.py", """
        import atexit, threading, time, warnings
        import numpy as np
        def handler():  # runs after ortrain's exit handlers
            began = time.monotonic()
            target.predict(x)
            print("handler", time.monotonic() - began < 3, time.monotonic() - ended < 5)
        atexit.register(handler)
        import ortrain as ot
        warnings.simplefilter("ignore")
        m = ot.Sequential([ot.layers.Dense(256), ot.layers.Dense(4)], input_shape=(256,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=8)
        target = tr.snapshot()
        x = np.ones((8, 256), np.float32)
        tr.step(x, np.ones((8, 4), np.float32))
        def export():
            while True:
                tr.export_state()
        def move():
            while True:
                tr.update_target(target, 0.5)
        for f in (export, move):
            threading.Thread(target=f, daemon=True).start()
        time.sleep(0.5)
        ended = time.monotonic()
        """, ["handler", "True", "True"], times=2)


def test_a_collection_inside_a_hold_frees_and_the_hold_goes_on(tmp_path):
    # The garbage collector freeing a snapshot inside a held thread's wait held that thread again
    # in the middle of its hold, and the inner hold's end broke the outer's: a KeyError in the
    # user's thread.
    exits_cleanly(tmp_path / "exit_collect.py", """
        import atexit, gc, threading, time
        import numpy as np
        stop, errors = threading.Event(), []
        def handler():  # runs after ortrain's exit handlers
            gc.set_threshold(3, 1, 1)
            for _ in range(6):
                s = tr.snapshot()
                s.me = s  # (a cycle: freed by the collector, in whichever thread it runs)
                del s
                time.sleep(0.15)
            began = time.monotonic()
            stop.set()
            worker.join()
            print("joined", errors, time.monotonic() - began < 3)
        atexit.register(handler)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(4)], input_shape=(16,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=8)
        snap = tr.snapshot()
        x = np.ones((8, 16), np.float32)
        def work():
            try:
                while not stop.is_set():
                    snap.predict(x)
                    [[] for _ in range(5)]  # (allocations: the collector runs in this thread too)
            except BaseException as exc:
                errors.append(type(exc).__name__)
        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        time.sleep(0.3)
        """, ["joined", "[]", "True"])


def test_joins_during_the_exit_cost_what_they_cost_before_it(tmp_path):
    # Every join during the exit walked every thread a handler had started and kept: 2,000 threads
    # started and joined took 6.9 s (4,000: 29 s), against 0.3 s without ortrain.
    exits_cleanly(tmp_path / "exit_many.py", """
        import atexit, threading, time
        def handler():  # runs after ortrain's exit handlers
            began = time.monotonic()
            threads = [threading.Thread(target=lambda: None) for _ in range(2000)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print("joins", time.monotonic() - began < 3)
        atexit.register(handler)
        import ortrain
        """, ["joins", "True"])


def test_an_interrupt_in_a_trainers_own_take_of_a_lock_leaves_the_lock_free(tmp_path):
    # update_target and export_state took their lock in a Python __enter__: a Ctrl-C arriving just
    # after the take left the lock owned for good (4% of interrupts in update_target), and the
    # next prediction with that snapshot from another thread waited forever.
    exits_cleanly(tmp_path / "interrupts.py", """
        import signal, time, warnings
        import numpy as np
        import ortrain as ot
        warnings.simplefilter("ignore")
        m = ot.Sequential([ot.layers.Dense(4)], input_shape=(4,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=4)
        target = tr.snapshot()
        armed = [False]
        def interrupt(*_):
            if armed[0]:
                armed[0] = False
                raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)
        for call, lock in ((lambda: tr.update_target(target, 1.0), target._lock), (tr.export_state, tr._session._lock)):
            interrupts = left = 0
            end = time.monotonic() + 1.5
            signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
            while time.monotonic() < end:
                try:
                    armed[0] = True
                    while time.monotonic() < end:
                        call()
                    armed[0] = False  # (an interrupt only inside this try)
                except KeyboardInterrupt:
                    interrupts += 1
                    while lock._is_owned():
                        left += 1
                        lock.release()
            signal.setitimer(signal.ITIMER_REAL, 0)
            print(interrupts > 500, left)
        """, ["True", "0", "True", "0"])


def test_a_thread_let_go_at_the_exit_does_not_pay_for_every_session_alive(tmp_path):
    # Each call of a thread let go (joined by a later handler) looked at every object with a lock:
    # with 5,000 snapshots alive, 5,000 predictions took 3-4 s to join instead of 0.1 s.
    exits_cleanly(tmp_path / "exit_many_sessions.py", """
        import atexit, threading, time
        import numpy as np
        def handler():  # runs after ortrain's exit handlers
            began = time.monotonic()
            worker.join()
            print("joined", time.monotonic() - began < 1.0)
        atexit.register(handler)
        import ortrain as ot
        m = ot.Sequential([ot.layers.Dense(4)], input_shape=(8,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=8)
        snaps = [tr.snapshot() for _ in range(5000)]
        x = np.ones((8, 8), np.float32)
        def work():
            for _ in range(5000):
                snaps[0].predict(x)
        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        time.sleep(0.05)
        """, ["joined", "True"])


def test_a_handler_moving_a_target_a_held_thread_predicts_with_lets_that_thread_go_on(tmp_path):
    # update_target's wait for the target's lock, inside ortrain's own take of it, was not seen: the
    # daemon holding the lock in a chunked prediction stayed held 30 s, then ran through the
    # teardown and aborted (5 of 6 runs).
    exits_cleanly(tmp_path / "exit_move.py", """
        import atexit, threading, time, warnings
        import numpy as np
        def handler():  # runs after ortrain's exit handlers
            began = time.monotonic()
            tr.update_target(snap, 0.5)
            snap.predict(x[:8])
            print("handler", time.monotonic() - began < 5)
            time.sleep(0.01)
        atexit.register(handler)
        import ortrain as ot
        warnings.simplefilter("ignore")
        m = ot.Sequential([ot.layers.Dense(1024), ot.layers.Dense(4)], input_shape=(1024,), seed=1)
        m.compile(optimizer="adam", loss="mse")
        tr = ot.Trainer(m, batch_size=8)
        snap = tr.snapshot()
        x = np.ones((1536, 1024), np.float32)
        snap.predict(x[:8])
        def work():
            while True:
                snap.predict(x, batch_size=512)
        threading.Thread(target=work, daemon=True).start()
        time.sleep(0.3)
        """, ["handler", "True"], times=2)
