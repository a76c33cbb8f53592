"""The epoch loop: Model.fit, fit_generator, train(), History.

References are numpy implementations written here (MLP forward/backward, Adam, SGD,
weighted cross-entropy) and PyTorch where installed.
"""

from __future__ import annotations

import ast
import os
import pickle
import sys
import threading
import warnings

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import NumpyAdam, dense_model, forks_that_hang, linear_mse_grads, softmax

import ortrain as ot
from ortrain.fit import train

# -- numpy references -----------------------------------------------------------------------------


def _dense_4_2():
    """One Dense layer from 4 inputs to 2 outputs, seeded: the optimizer-state tests' model."""
    return ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)


def mlp(seed=0, n_in=4, hidden=8, n_out=3, out_act=None):
    return ot.Sequential([ot.layers.Dense(hidden, activation="relu"), ot.layers.Dense(n_out, activation=out_act)],
                         input_shape=(n_in,), seed=seed)


def mse_grads(ws, x, y):
    """Loss and gradients of mean((relu(x W1 + b1) W2 + b2 - y)^2), in float64."""
    w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in ws)
    x = np.asarray(x, np.float64)
    z = x @ w1 + b1
    h = np.maximum(z, 0)
    p = h @ w2 + b2
    d = p - y
    loss = np.mean(d ** 2)
    dp = 2 * d / d.size
    dh = dp @ w2.T * (z > 0)
    return loss, [x.T @ dh, dh.sum(0), h.T @ dp, dp.sum(0)]


def sgd(ws, grads, lr):
    return [w - lr * g for w, g in zip(ws, grads)]


def batches(n_batches, rows, seed=0, n_in=4, n_out=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, n_in)).astype(np.float32),
             rng.standard_normal((rows, n_out)).astype(np.float32)) for _ in range(n_batches)]


def assert_weights(model, ref, rtol=2e-5, atol=2e-6):
    for got, want in zip(model.get_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def quiet(**kw):
    return dict(verbose=0, **kw)


# -- fit_generator against references -------------------------------------------------------------


def test_fit_generator_two_epochs_match_numpy_adam():
    model = mlp()
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    data = batches(4, 8)
    ref = NumpyAdam(model.get_weights(), lr=1e-2)
    means = []
    for _ in range(2):
        losses = []
        for x, y in data:
            loss, g = mse_grads(ref.p, x, y)
            losses.append(loss)
            ref.step(g)
        means.append(np.mean(losses))
    hist = ot.fit_generator(model, data, epochs=2, verbose=0)
    assert hist.epoch == [0, 1]
    np.testing.assert_allclose(hist.history["loss"], means, rtol=1e-5)
    assert hist.history["lr"] == [1e-2, 1e-2]
    assert_weights(model, ref.p)
    assert model.train_state.step == 8 and model.train_state.n_steps == 8


def test_fit_generator_matches_torch_crossentropy():
    torch = torch_or_skip()
    model = mlp(seed=3, out_act="softmax")
    model.compile(optimizer=ot.optim.Adam(lr=5e-3), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(5)
    data = [(rng.standard_normal((16, 4)).astype(np.float32), rng.integers(0, 3, 16)) for _ in range(3)]
    w1, b1, w2, b2 = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in model.get_weights())
    opt = torch.optim.Adam([w1, b1, w2, b2], lr=5e-3)
    means = []
    for _ in range(2):
        losses = []
        for x, y in data:
            logits = torch.relu(torch.tensor(x, dtype=torch.float64) @ w1 + b1) @ w2 + b2
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        means.append(np.mean(losses))
    hist = ot.fit_generator(model, data, epochs=2, verbose=0)
    np.testing.assert_allclose(hist.history["loss"], means, rtol=1e-5)
    assert_weights(model, [t.detach().numpy() for t in (w1, b1, w2, b2)])


def test_nbatch_logical_equals_double_batch():
    small = batches(6, 4, seed=1)
    doubled = [(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])) for a, b in zip(small[::2], small[1::2])]
    m1, m2 = mlp(seed=2), mlp(seed=2)
    for m in (m1, m2):
        m.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    h1 = ot.fit_generator(m1, small, epochs=2, nbatch_logical=8, verbose=0)
    h2 = ot.fit_generator(m2, doubled, epochs=2, verbose=0)
    for a, b in zip(m1.get_weights(), m2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(h1.history["loss"], h2.history["loss"], rtol=1e-5)
    assert m1.train_state.step == m2.train_state.step == 6
    assert m1.train_state.n_steps == 12


def test_nbatch_logical_leftover_warns():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    with pytest.warns(RuntimeWarning, match="accumulation period of nbatch_logical=8"):
        ot.fit_generator(model, batches(3, 4), nbatch_logical=8, verbose=0)


def test_a_save_part_way_through_an_nbatch_logical_period_warns(tmp_path):
    # a callback's save between two updates left the accumulated gradients out without a word
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    saved = {}

    class Save(ot.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.model.save(tmp_path / f"b{batch}.ortrain")
                pickle.dumps(self.model)  # reads the state twice (the model's, its optimizer's): warned once
            saved[batch] = [str(w.message) for w in caught]

    ot.fit_generator(model, batches(4, 4), nbatch_logical=8, callbacks=[Save()], verbose=0)
    assert saved[1] == saved[3] == []   # at the end of a period
    for batch in (0, 2):
        assert len(saved[batch]) == 1 and saved[batch][0].startswith(
            "model.train_state (read by a save or copy) is read 1 batch(es) into an accumulation period of "
            "nbatch_logical=8"), saved[batch]
    # what the save holds is the state of the last update, as the warning says
    assert ot.load_model(tmp_path / "b2.ortrain").train_state.step == 1


def test_fit_generator_sample_weights_any_loss_matches_numpy():
    model = ot.Sequential([ot.layers.Dense(3, activation="softmax")], input_shape=(4,), seed=1)
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    w = np.array([1.0, 0.0, 2.0, 0.5, 1.0, 3.0], np.float32)
    k, b = (a.astype(np.float64) for a in model.get_weights())
    p = softmax(x @ k + b)
    loss = np.mean(w * -np.log(p[np.arange(6), y]))
    dz = (p - np.eye(3)[y]) * w[:, None] / 6
    hist = ot.fit_generator(model, [(x, y, w)], verbose=0)
    np.testing.assert_allclose(hist.history["loss"][0], loss, rtol=1e-5)
    assert_weights(model, [k - 0.5 * x.T @ dz, b - 0.5 * dz.sum(0)])


def test_dict_batches_and_missing_weights_mean_ones():
    data = batches(2, 4)
    m1, m2 = mlp(), mlp()
    for m in (m1, m2):
        m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    ot.fit_generator(m1, [{"inputs": [data[0][0]], "labels": [data[0][1]], "sample_weight": np.ones(4)},
                          {"inputs": data[1][0], "labels": data[1][1]}], verbose=0)
    ot.fit_generator(m2, data, verbose=0)
    for a, b in zip(m1.get_weights(), m2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_loss_and_optimizer_override_compile():
    model = mlp()
    data = batches(3, 5)
    ws = model.get_weights()
    for x, y in data:
        ws = sgd(ws, mse_grads(ws, x, y)[1], 0.05)
    ot.fit_generator(model, data, loss="mse", optimizer=ot.optim.SGD(lr=0.05), verbose=0)
    assert model.loss.name == "mse" and model.optimizer.name == "sgd"
    assert_weights(model, ws)


def test_a_loss_override_continues_at_the_rate_the_last_fit_left():
    # the moments go on, so the rate must too: not a rate written before that fit
    data = batches(2, 4)
    for write_after in (False, True):
        model = mlp()
        model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        model.optimizer.lr = 0.2   # taken by the next fit, then halved by the decay
        model.fit(data[0][0], data[0][1], batch_size=4, epochs=2, verbose=0,
                  callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
        assert model.optimizer.lr == 0.1
        if write_after:
            model.optimizer.lr = 0.3   # written since: the next fit starts at it
        want = 0.3 if write_after else 0.1
        ws = model.get_weights()
        for x, y in data:
            ws = sgd(ws, mse_grads(ws, x, y)[1], want)
        hist = ot.fit_generator(model, data, loss="mse", weight_decay=None, verbose=0)
        assert hist.history["lr"] == [want] and model.train_state.lr == want
        assert_weights(model, ws)


def test_loss_mask_and_weight_decay_reach_the_trainer():
    data = batches(2, 4)
    mask = np.ones((4, 3), np.float32)
    mask[:, 2] = 0
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    ot.fit_generator(model, [(x, y, mask) for x, y in data], loss_mask=3, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[2][:, 2], mlp().get_weights()[2][:, 2])
    ce = mlp(out_act="softmax")
    ce.compile(optimizer="adam", loss="categorical_crossentropy")
    with pytest.raises(ot.OrtrainError, match="loss_mask=3 weights a mean squared error"):
        ot.fit_generator(ce, [(x, np.eye(3)[:4], mask) for x, _ in data], loss_mask=3, verbose=0)
    for wd, default in ((0.1, False), (0.0, True)):
        model = mlp()
        model.compile(optimizer=ot.optim.AdamW(lr=1e-2), loss="mse")  # compiled decay 0.01
        ref = NumpyAdam(model.get_weights(), lr=1e-2, weight_decay=wd)
        for x, y in data:
            ref.step(mse_grads(ref.p, x, y)[1])
        kwargs = {} if default else {"weight_decay": wd}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ot.fit_generator(model, data, verbose=0, **kwargs)  # the API default turns decay off
        assert_weights(model, ref.p)
        said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert said == (["weight_decay=0.0 (fit_generator's default) turns off the weight decay 0.01 of the compiled "
                         "AdamW; pass weight_decay=None to keep it (model.fit keeps it)"] if default else [])
    # None keeps the compiled decay, and equals model.fit on the same generator
    kept, through_fit = mlp(), mlp()
    ref = NumpyAdam(kept.get_weights(), lr=1e-2, weight_decay=0.01)
    for x, y in data:
        ref.step(mse_grads(ref.p, x, y)[1])
    for m in (kept, through_fit):
        m.compile(optimizer=ot.optim.AdamW(lr=1e-2), loss="mse")
    ot.fit_generator(kept, data, verbose=0, weight_decay=None)
    through_fit.fit(data, verbose=0)
    assert_weights(kept, ref.p)
    assert_weights(through_fit, ref.p)


def test_two_input_model_with_a_short_last_batch():
    a, b = ot.Input((2,)), ot.Input((3,))
    split = ot.Model([a, b], ot.layers.Dense(3)(ot.layers.Concatenate()([a, b])))
    joined = ot.Sequential([ot.layers.Dense(3)], input_shape=(5,))
    joined.set_weights(split.get_weights())
    for m in (split, joined):
        m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    y = rng.standard_normal((7, 3)).astype(np.float32)
    h1 = split.fit([x[:, :2], x[:, 2:]], y, batch_size=3, shuffle=False, verbose=0)
    h2 = joined.fit(x, y, batch_size=3, shuffle=False, verbose=0)
    for p, q in zip(split.get_weights(), joined.get_weights()):
        np.testing.assert_allclose(p, q, rtol=1e-6, atol=1e-7)
    assert h1.history["loss"] == pytest.approx(h2.history["loss"], rel=1e-6)
    assert split.train_state.n_steps == 3


def test_uncompiled_without_loss_is_refused():
    model = mlp()
    with pytest.raises(ot.OrtrainError, match=r"not compiled; call model.compile\(optimizer=..., loss=...\) or pass"):
        ot.fit_generator(model, batches(1, 4), verbose=0)


# -- the generator contract ----------------------------------------------------------------------


class Counting:
    """An infinite callable that counts its calls."""

    def __init__(self, data):
        self.data, self.calls = data, 0

    def __call__(self):
        self.calls += 1
        return self.data[(self.calls - 1) % len(self.data)]


def test_steps_per_epoch_calls_an_infinite_callable_exactly():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    gen, val = Counting(batches(3, 4)), Counting(batches(2, 4, seed=9))
    hist = ot.fit_generator(model, gen, steps_per_epoch=5, epochs=3, validation_generator=val,
                            validation_steps=2, verbose=0)
    assert gen.calls == 15
    assert val.calls == 6
    assert len(hist.history["val_loss"]) == 3
    assert model.train_state.n_steps == 15


def test_a_validation_source_shorter_than_validation_steps_warns_once():
    """As ``evaluate(generator, steps=)`` and the training side warn: the val_ values are over the
    batches the source gave, and the user hears that it ran out."""
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    val_batches = batches(2, 4, seed=9)
    gen, state = resetting_callable(val_batches)
    with pytest.warns(RuntimeWarning, match=r"validation after epoch 0: the validation data ran out after 2 of "
                                            r"validation_steps=3 batches") as caught:
        hist = ot.fit_generator(model, batches(3, 4), epochs=2, validation_generator=gen, validation_steps=3,
                                verbose=0)
    assert sum("validation after" in str(w.message) for w in caught) == 1
    assert len(hist.history["val_loss"]) == 2
    x = np.concatenate([b[0] for b in val_batches])
    y = np.concatenate([b[1] for b in val_batches])
    np.testing.assert_allclose(hist.history["val_loss"][-1], np.mean((model.predict(x) - y) ** 2), rtol=1e-5)


def resetting_callable(data):
    """The generator contract's finite callable over ``data``: a batch a call, then None once it
    has reset itself; ``state["calls"]`` counts the calls."""
    state = {"i": 0, "calls": 0}

    def gen():
        state["calls"] += 1
        if state["i"] == len(data):
            state["i"] = 0
            return None
        state["i"] += 1
        return data[state["i"] - 1]
    return gen, state


def test_finite_callable_resets_itself_and_sets_the_epoch_length():
    gen, state = resetting_callable(batches(3, 4))
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    ot.fit_generator(model, gen, epochs=2, verbose=0)
    assert state["calls"] == 8  # 3 batches + the None, twice
    assert model.train_state.n_steps == 6


def test_a_callable_raising_stop_iteration_ends_its_epoch_as_none_does():
    # `lambda: next(it)` ended in Python's "generator raised StopIteration" (a RuntimeError) after
    # its batches had trained, with no History
    data = batches(2, 4)
    model, ref = mlp(), mlp()
    for m in (model, ref):
        m.compile(optimizer="sgd", loss="mse")
    it = iter(data)
    hist = ot.fit_generator(model, lambda: next(it), epochs=1, verbose=0)
    ot.fit_generator(ref, data, epochs=1, verbose=0)
    assert hist.epoch == [0] and model.train_state.n_steps == 2
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_array_equal(a, b)
    it = iter(data)
    assert model.evaluate(lambda: next(it)) == pytest.approx(ref.evaluate(data), rel=1e-6)


def test_none_for_the_data_or_labels_of_a_batch_is_said_to_be_none():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    x, y = batches(1, 4)[0]
    with pytest.raises(ot.OrtrainError, match=r"train_on_batch\(x, y\): y, the batch's labels, is required; "
                                              r"received None"):
        model.train_on_batch(x, None)
    with pytest.raises(ot.OrtrainError, match=r"test_on_batch\(x, y\): y, the batch's labels, is required"):
        model.test_on_batch(x, None)
    with pytest.raises(ot.ShapeError, match=r"expected an array, received None"):
        model.predict(None)
    with ot.Trainer(model, batch_size=4) as tr:
        for call in (lambda: tr.step(None, y), lambda: tr.step(x, None), lambda: tr.eval(x, None),
                     lambda: tr.predict(None)):
            with pytest.raises(ot.ShapeError, match=r"expected an array, received None"):
                call()
        assert tr.n_steps == 0
    assert model.train_state is None  # nothing trained


def test_a_finite_callable_as_long_as_steps_per_epoch_trains_every_epoch():
    # The None that ends the callable's pass comes at the start of the next epoch: it is that
    # pass's end, not an empty epoch. Same weights as a list of the batches.
    data = batches(3, 4)
    gen, state = resetting_callable(data)

    model, ref = mlp(), mlp()
    for m in (model, ref):
        m.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hist = ot.fit_generator(model, gen, steps_per_epoch=3, epochs=4, verbose=0)
    ot.fit_generator(ref, data, epochs=4, verbose=0)
    assert hist.epoch == [0, 1, 2, 3] and model.train_state.n_steps == 12
    assert state["calls"] == 15  # 3 a epoch, and the None at the start of epochs 1-3
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_array_equal(a, b)
    # a later fit (a resume, model.fit again) starts past the None the last one left
    hist = model.fit(gen, steps_per_epoch=3, epochs=6, initial_epoch=4, verbose=0)
    ot.fit_generator(ref, data, epochs=2, verbose=0)
    assert hist.epoch == [4, 5] and model.train_state.n_steps == 18
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_array_equal(a, b)
    it = iter(data)  # a callable that does not reset still stops, after one more call
    with pytest.warns(RuntimeWarning, match="epoch 1 .* yielded no batch .*must reset itself"):
        hist = ot.fit_generator(model, lambda: next(it, None), steps_per_epoch=3, epochs=4, verbose=0)
    assert hist.epoch == [0]


def test_a_keras_style_sequence_gives_len_batches_an_epoch():
    class Seq:  # keras.utils.Sequence without the base class: __len__ and __getitem__ only
        def __init__(self):
            self.data, self.indices = batches(3, 4), []

        def __len__(self):
            return 3

        def __getitem__(self, i):  # past len(): iter() alone would go on to the IndexError
            if i >= 6:
                raise IndexError(i)
            self.indices.append(i)
            return self.data[i % 3]

        def on_epoch_end(self):  # as Keras calls it, once an epoch's batches are done
            self.indices.append("end")

    seq, model, ref = Seq(), mlp(), mlp()
    for m in (model, ref):
        m.compile(optimizer="sgd", loss="mse")
    hist = ot.fit_generator(model, seq, epochs=2, verbose=0)
    ot.fit_generator(ref, seq.data, epochs=2, verbose=0)
    assert hist.epoch == [0, 1] and seq.indices == [0, 1, 2, "end", 0, 1, 2, "end"]
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_batch_of_no_rows_is_named_and_changes_nothing():
    data = batches(2, 4)
    empty = (data[0][0][:0], data[0][1][:0])
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    before = model.get_weights()
    with pytest.raises(ot.ShapeError, match="epoch 0, step 0 .*x: the first batch holds no rows"):
        ot.fit_generator(model, [empty, data[0]], verbose=0)
    with pytest.raises(ot.ShapeError, match="epoch 0, step 1 .*x: a batch of 0 rows"):
        ot.fit_generator(model, [data[0], empty], verbose=0)
    assert model.train_state.n_steps == 1  # the step before the empty batch
    ref = mlp()
    ref.compile(optimizer="sgd", loss="mse")
    ot.fit_generator(ref, [data[0]], verbose=0)
    for a, b, c in zip(model.get_weights(), ref.get_weights(), before):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_reiterable_is_iterated_afresh_each_epoch():
    class Shards:
        def __init__(self):
            self.iterations = 0

        def __iter__(self):
            self.iterations += 1
            return iter(batches(2, 4))

    shards = Shards()
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    ot.fit_generator(model, shards, epochs=3, verbose=0)
    assert shards.iterations == 3 and model.train_state.n_steps == 6


def test_one_shot_iterator_needs_steps_per_epoch():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ot.OrtrainError, match="one-shot iterator .* is used up by its first epoch and 2 epochs"):
        ot.fit_generator(model, iter(batches(2, 4)), epochs=2, verbose=0)
    assert model.train_state is None
    ot.fit_generator(model, iter(batches(2, 4)), epochs=1, verbose=0)  # one epoch is fine
    assert model.train_state.n_steps == 2


def test_one_shot_validation_iterator_needs_validation_steps():
    # used up by the first validation, it left val_loss NaN (and EarlyStopping blind) after that
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    x, y = batches(1, 8)[0]
    for call in (lambda v, **kw: ot.fit_generator(model, batches(2, 4), epochs=3, validation_generator=v,
                                                  verbose=0, **kw),
                 lambda v, **kw: model.fit(x, y, batch_size=4, epochs=3, validation_data=v, verbose=0, **kw)):
        with pytest.raises(ot.OrtrainError, match="a one-shot iterator .* is used up by the first validation and "
                                                  "the fit validates after 3 epochs; pass validation_steps"):
            call(iter(batches(2, 4)))
        assert model.train_state is None
    hist = ot.fit_generator(model, batches(2, 4), epochs=3, validation_generator=iter(batches(3, 4)),
                            validation_steps=1, verbose=0)
    assert np.isfinite(hist.history["val_loss"]).all()
    hist = model.fit(x, y, batch_size=4, epochs=3, validation_data=iter(batches(2, 4)), validation_freq=[3],
                     verbose=0)  # validates once
    assert np.isfinite(hist.history["val_loss"][2])


def test_validation_arrays_holding_nan_or_inf_are_refused_before_anything_trains():
    """As the training rows, and as the command line's --val-data and --val-split: a NaN there made
    every epoch's val_loss NaN (which EarlyStopping then monitored) while the fit trained."""
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    x, y = batches(1, 12)[0]
    before = model.get_weights()
    bad_x, bad_y = x.copy(), y.copy()
    bad_x[2, 1], bad_y[10, 0] = np.nan, np.inf
    cases = [({"validation_data": (bad_x[:4], y[:4])}, r"validation_data\[0\]: holds nan in row 2"),
             ({"validation_data": (x[:4], bad_y[8:])}, r"validation_data\[1\]: holds inf in row 2"),
             ({"validation_split": 0.25}, r"y \(the rows validation_split holds out\): holds inf in row 10")]
    for kwargs, says in cases:
        with pytest.raises(ot.NonFiniteError, match=says + "; validation needs finite values, so nothing was trained"):
            model.fit(x, y if "validation_data" in kwargs else bad_y, batch_size=4, epochs=2, verbose=0, **kwargs)
        assert model.train_state is None
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)
    # arrays beside a generator's training batches too, named as given
    with pytest.raises(ot.NonFiniteError, match=r"validation_data\[0\]: holds nan in row 2"):
        model.fit([(x[:4], y[:4])], validation_data=(bad_x[:4], y[:4]), verbose=0)
    with pytest.raises(ot.NonFiniteError, match=r"validation_generator\[0\]: holds nan in row 2"):
        ot.fit_generator(model, [(x[:4], y[:4])], validation_generator=(bad_x[:4], y[:4]), verbose=0)
    assert model.train_state is None
    # arrays a fit never validates on (validation_freq past its epochs) are not read, nor refused
    hist = model.fit(x, y, batch_size=4, epochs=2, verbose=0, validation_data=(bad_x[:4], y[:4]), validation_freq=[5])
    assert "val_loss" not in hist.history or all(np.isnan(hist.history["val_loss"]))
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    # a generator's validation batches are computed as evaluate computes them
    hist = model.fit(x, y, batch_size=4, epochs=1, verbose=0, validation_data=[(bad_x[:4], y[:4])])
    assert np.isnan(hist.history["val_loss"][0]) and np.isfinite(hist.history["loss"][0])


def test_validation_weights_are_checked_before_anything_trains():
    # a list of batches whose weights have the wrong shape, and weights a trainer cannot take, were
    # refused only after a whole epoch had trained
    from ortrain import fit as fit_mod
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    x, y = batches(1, 8)[0]
    with pytest.raises(ot.ShapeError, match=r"validation_data\[0\] sample_weight: expected shape \(4,\) or "
                                            r"\(4, 1\) \(one weight per sample\), received \(4, 5\)"):
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, validation_data=[(x[:4], y[:4], np.ones((4, 5)))])
    assert model.train_state is None
    with pytest.raises(ot.OrtrainError, match=r"validation_data\[0\] sample_weight: holds nan in row 1; weights must be finite"):
        model.fit(x, y, batch_size=4, verbose=0, validation_data=[(x[:4], y[:4], [1.0, np.nan, 1.0, 1.0])])
    assert model.train_state is None
    with ot.Trainer(model, batch_size=4) as tr:
        before = tr.model().get_weights()
        with pytest.raises(ot.OrtrainError, match="validation_data \\(its sample weights\\): this trainer has no "
                                                  "loss weights; create it with loss_mask=1"):
            fit_mod.train(tr, x, y, validation_data=(x, y, np.ones(8)), epochs=2, verbose=0)
        assert tr.n_steps == 0
        for got, want in zip(tr.model().get_weights(), before):
            np.testing.assert_array_equal(got, want)
    # per-element validation weights under loss_mask=<outputs> are taken as the training ones are
    mask = np.ones((4, 3), np.float32)
    mask[:, 2] = 0
    hist = ot.fit_generator(model, [(x[:4], y[:4], mask)], loss_mask=3, verbose=0,
                            validation_generator=[(x[4:], y[4:], mask)])
    d = model.predict(x[4:]) - y[4:]
    assert hist.history["val_loss"][0] == pytest.approx(np.sum(mask * d ** 2) / 12, rel=1e-5)
    # and on an output with positions, (batch, time, outputs), as training takes them
    seq = ot.Sequential([ot.layers.Dense(2)], input_shape=(3, 4), seed=0)
    seq.compile(optimizer="sgd", loss="mse")
    xs, ys = np.ones((4, 3, 4), np.float32), np.zeros((4, 3, 2), np.float32)
    ws = np.ones((4, 3, 2), np.float32)
    ws[:, :, 1] = 0
    for val in ([(xs, ys, ws)], (xs, ys, ws)):
        hist = ot.fit_generator(seq, [(xs, ys, ws)], loss_mask=2, validation_generator=val, verbose=0)
        d = seq.predict(xs) - ys
        assert hist.history["val_loss"][0] == pytest.approx(np.sum(ws * d ** 2) / d.size, rel=1e-5)


def test_weights_on_a_later_batch_of_a_list_count_as_on_the_first(rng):
    # the trainer's weight input was decided by the first batch alone: a weighted second batch failed
    # after training had started (and model.fit offers no loss_mask=1 to pass)
    data = batches(2, 4)
    w = np.array([1.0, 0.0, 2.0, 0.5], np.float32)
    mixed = [data[0], (*data[1], w)]
    ones = [(*data[0], np.ones(4, np.float32)), (*data[1], w)]
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    want = ot.fit_generator(model, ones, validation_generator=ones, verbose=0)
    model2 = mlp()
    model2.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    hist = ot.fit_generator(model2, mixed, validation_generator=mixed, verbose=0)   # missing weights are ones
    assert hist.history["loss"] == want.history["loss"] and hist.history["val_loss"] == want.history["val_loss"]
    for a, b in zip(model2.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    model3 = mlp()
    model3.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    assert model3.fit(mixed, validation_data=mixed, verbose=0).history["val_loss"] == want.history["val_loss"]


def test_one_shot_iterator_running_dry_later_warns_and_stops():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    with pytest.warns(RuntimeWarning, match="yielded no batch"):
        hist = ot.fit_generator(model, iter(batches(4, 4)), steps_per_epoch=2, epochs=5, verbose=0)
    assert hist.epoch == [0, 1]
    assert model.train_state.n_steps == 4
    with pytest.warns(RuntimeWarning, match="ran dry in epoch 1"):
        hist = ot.fit_generator(model, iter(batches(3, 4)), steps_per_epoch=2, epochs=5, verbose=0)
    assert hist.epoch == [0, 1]  # the partial epoch is logged, then training stops


def test_empty_generator_warns_and_stops():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    before = model.get_weights()
    with pytest.warns(RuntimeWarning, match="epoch 0 .* yielded no batch"):
        hist = ot.fit_generator(model, lambda: None, epochs=3, verbose=0)
    assert hist.epoch == [] and hist.history == {}
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.warns(RuntimeWarning, match="yielded no batch"):
        hist = ot.fit_generator(model, [], epochs=3, verbose=0)
    assert hist.epoch == []


def test_generator_that_does_not_reset_stops_after_its_first_epoch():
    it = iter(batches(2, 4))
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    with pytest.warns(RuntimeWarning, match="epoch 1 .* yielded no batch .*must reset itself"):
        hist = ot.fit_generator(model, lambda: next(it, None), epochs=4, verbose=0)
    assert hist.epoch == [0]


def test_short_epoch_under_steps_per_epoch_warns_once():
    data = batches(2, 4)
    pos = {"i": 0}

    def gen():
        if pos["i"] == 2:
            pos["i"] = 0
            return None
        pos["i"] += 1
        return data[pos["i"] - 1]

    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    with pytest.warns(RuntimeWarning, match="ended the epoch after 2 of steps_per_epoch=3"):
        ot.fit_generator(model, gen, steps_per_epoch=3, epochs=2, verbose=0)
    assert model.train_state.n_steps == 4


def test_wrong_size_batch_names_epoch_and_step_and_keeps_completed_steps():
    data = batches(3, 4)
    bad = (np.zeros((5, 4), np.float32), np.zeros((5, 3), np.float32))
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with pytest.raises(ot.ShapeError, match=r"epoch 1, step 2 \(counted from 0\): x: a batch of 5 rows, more than "
                                            r"the 4 of the first batch, which set the batch size; give batches of "
                                            r"at most 4 rows"):
        ot.fit_generator(model, _Epochs([data, data[:2] + [bad]]), epochs=2, verbose=0)
    ws = mlp().get_weights()
    for x, y in data + data[:2]:
        ws = sgd(ws, mse_grads(ws, x, y)[1], 0.1)
    assert_weights(model, ws)
    assert model.train_state.n_steps == 5



def test_a_generators_short_last_batch_is_a_step_on_its_own_rows():
    # A torch DataLoader without drop_last ends each epoch with a short batch: as an array fit's
    # last batch, it trains on its own rows (it was refused after the epoch's other steps trained).
    data = batches(3, 4)
    x, y = data[2]
    short = data[:2] + [(x[:3], y[:3])]
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    hist = ot.fit_generator(model, short, epochs=2, verbose=0)
    ws = mlp().get_weights()
    losses = []
    for _ in range(2):
        total = 0.0
        for bx, by in short:
            loss, grads = mse_grads(ws, bx, by)
            total += loss * len(bx)
            ws = sgd(ws, grads, 0.1)
        losses.append(total / 11)
    assert_weights(model, ws)
    np.testing.assert_allclose(hist.history["loss"], losses, rtol=1e-5)

class _Epochs:
    """A re-iterable whose epochs hold different batches."""

    def __init__(self, epochs):
        self.epochs, self.i = epochs, 0

    def __iter__(self):
        self.i += 1
        return iter(self.epochs[self.i - 1])


def test_malformed_batch_is_an_error_naming_the_step():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    x, y = batches(1, 4)[0]
    with pytest.raises(ot.OrtrainError, match=r"epoch 0, step 1 .*batch: expected \(x, y\), \(x, y, sample_weight\)"):
        ot.fit_generator(model, [(x, y), [x]], verbose=0)
    with pytest.raises(ot.OrtrainError, match=r"unknown keys \['weights'\]"):
        ot.fit_generator(model, [{"inputs": x, "labels": y, "weights": 1}], verbose=0)


def test_weights_in_a_later_batch_only_are_refused():
    (x, y), = batches(1, 4)
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    def one_at_a_time():   # read a batch at a time: the first one decides (a list is read whole first)
        yield x, y
        yield x, y, np.ones(4)

    with pytest.raises(ot.OrtrainError, match=r"epoch 0, step 1 .*sample_weight: this batch carries loss weights but "
                                              r"the first batch did not, .*pass loss_mask=1 to fit_generator"):
        ot.fit_generator(model, one_at_a_time(), verbose=0)
    ot.fit_generator(model, one_at_a_time(), loss_mask=1, verbose=0)  # the fix it names works
    assert model.train_state.n_steps == 3


def test_exception_in_generator_propagates_after_on_train_end(tmp_path):
    data = batches(3, 4)
    calls = {"n": 0}

    def gen():
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyError("shard missing")
        return data[(calls["n"] - 1) % 3]

    class Ends(ot.callbacks.Callback):
        ended = False

        def on_train_end(self, logs=None):
            Ends.ended = True

    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with pytest.raises(KeyError, match="shard missing"):
        ot.fit_generator(model, gen, steps_per_epoch=3, epochs=4, callbacks=[Ends()], verbose=0)
    assert Ends.ended
    ws = mlp().get_weights()
    for i in range(7):
        ws = sgd(ws, mse_grads(ws, *data[i % 3])[1], 0.1)
    assert_weights(model, ws)  # the 7 completed steps stand
    assert model.train_state.n_steps == 7


def test_bad_arguments_are_refused_before_anything_runs():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    gen = Counting(batches(1, 4))
    cases = [
        (dict(steps_per_epoch=0), r"steps_per_epoch: expected a positive int or None, received 0"),
        (dict(epochs=-1), r"epochs: expected an int >= 0, received -1"),
        (dict(initial_epoch=1.5), r"initial_epoch: expected an int >= 0, received 1.5"),
        (dict(callbacks=[print]), r"callbacks: expected ot.callbacks.Callback objects, received"),
        (dict(verbose=3), r"verbose: expected 0 \(silent\), 1 .* received 3"),
        (dict(verbose="Auto"), r"verbose: expected 0 \(silent\), 1 or 'auto' .* received 'Auto'"),
        (dict(weight_decay=2.0), r"weight_decay: expected a number in \[0, 1\]"),
        (dict(nbatch_logical=0), r"nbatch_logical: expected a positive int or None, received 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ot.OrtrainError, match=message):
            ot.fit_generator(model, gen, **kwargs)
    with pytest.raises(ot.OrtrainError, match=r"generator: expected a callable .* received an array of shape "
                                              r"\(4, 4\); for arrays call model.fit"):
        ot.fit_generator(model, np.zeros((4, 4)))
    assert gen.calls == 0 and model.train_state is None


def test_verbose_auto_is_keras_default_one(capsys):
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    ot.fit_generator(model, batches(2, 4), epochs=1, verbose="auto")
    assert "loss:" in capsys.readouterr().out   # one line per epoch off a terminal, as verbose=1


def test_epochs_at_or_below_initial_epoch_run_nothing():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    gen = Counting(batches(1, 4))
    hist = ot.fit_generator(model, gen, steps_per_epoch=2, epochs=3, initial_epoch=3, verbose=0)
    assert hist.epoch == [] and gen.calls == 0


# -- Model.fit with arrays ------------------------------------------------------------------------


def regression(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4))
    return x, (x @ rng.standard_normal((4, 3))).astype(np.float32)


def test_short_last_batch_counts_once():
    x, y = regression(10)
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    ws = model.get_weights()
    losses = []
    for sl in (slice(0, 4), slice(4, 8), slice(8, 10)):
        loss, g = mse_grads(ws, x[sl], y[sl])
        losses.append(loss)
        ws = sgd(ws, g, 0.1)
    hist = model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    assert_weights(model, ws)
    assert model.train_state.n_steps == 3
    np.testing.assert_allclose(hist.history["loss"][0], np.average(losses, weights=[4, 4, 2]), rtol=1e-5)
    assert hist.params["steps"] == 3 and hist.params["samples"] == 10


def test_shuffled_epochs_visit_every_sample_once_reproducibly():
    x, y = regression(10)
    seen = []

    class Rows(ot.callbacks.Callback):
        pass

    from ortrain.data import ArraySource
    src = ArraySource([np.arange(10, dtype=np.float32)[:, None]], y, None, 4, shuffle=True)
    for epoch in range(3):
        src.start_epoch(epoch)
        rows = []
        while (b := src.pull()) is not None:
            rows.extend(b[0][:, 0].astype(int))
        seen.append(rows)
        assert sorted(rows) == list(range(10))
    assert seen[0] != seen[1]
    results = []
    for _ in range(2):
        ot.set_seed(7)
        model = mlp()
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Rows()])
        results.append(model.get_weights())
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    ot.set_seed(8)
    model = mlp(seed=0)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert not np.array_equal(model.get_weights()[0], results[0][0])


def test_fit_twice_equals_one_fit_of_two_epochs():
    x, y = regression(36)
    one, two = mlp(seed=4), mlp(seed=4)
    for m in (one, two):
        m.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    h1 = one.fit(x, y, batch_size=8, epochs=2, verbose=0)
    two.fit(x, y, batch_size=8, epochs=1, verbose=0)
    h2 = two.fit(x, y, batch_size=8, epochs=2, initial_epoch=1, verbose=0)
    for a, b in zip(one.get_weights(), two.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert h2.epoch == [1]
    assert h2.history["loss"][0] == pytest.approx(h1.history["loss"][1], rel=1e-6)
    assert two.train_state.step == one.train_state.step == 10
    for k in one.train_state.moments:
        for a, b in zip(one.train_state.moments[k], two.train_state.moments[k]):
            np.testing.assert_array_equal(a, b)


def test_second_fit_continues_adam_moments_against_numpy():
    x, y = regression(16)
    model = mlp()
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    ref = NumpyAdam(model.get_weights(), lr=1e-2)
    for _ in range(2):
        for sl in (slice(0, 8), slice(8, 16)):
            ref.step(mse_grads(ref.p, x[sl], y[sl])[1])
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    assert_weights(model, ref.p)


def test_validation_loss_equals_evaluate():
    x, y = regression(50)
    xv, yv = regression(13, seed=1)
    model = mlp()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    hist = model.fit(x, y, batch_size=8, epochs=2, validation_data=(xv, yv), verbose=0)
    ev = model.evaluate(xv, yv)
    assert hist.history["val_loss"][-1] == pytest.approx(ev["loss"], rel=1e-5)
    assert hist.history["val_mae"][-1] == pytest.approx(ev["mae"], rel=1e-5)
    assert set(hist.history) == {"loss", "mae", "val_loss", "val_mae", "lr"}


def test_validation_split_takes_the_last_rows_and_no_backward_pass():
    x, y = regression(50)
    m1, m2 = mlp(), mlp()
    for m in (m1, m2):
        m.compile(optimizer="adam", loss="mse")
    hist = m1.fit(x, y, batch_size=8, validation_split=0.2, shuffle=False, verbose=0)
    m2.fit(x[:40], y[:40], batch_size=8, shuffle=False, verbose=0)
    for a, b in zip(m1.get_weights(), m2.get_weights()):
        np.testing.assert_array_equal(a, b)  # validation moved nothing
    assert hist.history["val_loss"][0] == pytest.approx(m1.evaluate(x[40:], y[40:])["loss"], rel=1e-5)
    assert hist.params["samples"] == 40


def test_weighted_validation_equals_weighted_evaluate():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 4)).astype(np.float32)
    y = rng.integers(0, 3, 24)
    w = rng.random(24).astype(np.float32)
    model = mlp(out_act="softmax")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x[:16], y[:16], batch_size=8, sample_weight=w[:16], validation_data=(x[16:], y[16:], w[16:]),
                     verbose=0)
    ev = model.evaluate(x[16:], y[16:], sample_weight=w[16:])
    assert hist.history["val_loss"][0] == pytest.approx(ev["loss"], rel=1e-5)
    assert hist.history["val_accuracy"][0] == pytest.approx(ev["accuracy"], rel=1e-6)


def test_fit_sample_weight_crossentropy_matches_torch():
    torch = torch_or_skip()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((12, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 12)]
    w = rng.random(12).astype(np.float32)
    model = mlp(seed=5, out_act="softmax")
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="categorical_crossentropy")
    params = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in model.get_weights()]
    opt = torch.optim.Adam(params, lr=1e-2)
    for sl in (slice(0, 5), slice(5, 10), slice(10, 12)):
        w1, b1, w2, b2 = params
        logp = torch.log_softmax(torch.relu(torch.tensor(x[sl], dtype=torch.float64) @ w1 + b1) @ w2 + b2, dim=1)
        loss = (torch.tensor(w[sl], dtype=torch.float64) * -(torch.tensor(y[sl]) * logp).sum(1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.fit(x, y, batch_size=5, sample_weight=w, shuffle=False, verbose=0)
    assert_weights(model, [p.detach().numpy() for p in params], rtol=1e-4, atol=1e-6)


def test_training_metrics_come_from_the_step_predictions():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    model = mlp(out_act="softmax")
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=8, verbose=0)
    want = np.mean(np.argmax(model.predict(x), 1) == y)  # lr 0: the weights never move
    assert hist.history["accuracy"][0] == pytest.approx(want)


def test_fit_with_a_generator_through_model_fit():
    data = batches(3, 4)
    m1, m2 = mlp(), mlp()
    for m in (m1, m2):
        m.compile(optimizer="adam", loss="mse")
    xv, yv = regression(8, seed=2)
    h = m1.fit(data, epochs=2, validation_data=(xv, yv), verbose=0)
    ot.fit_generator(m2, data, epochs=2, validation_generator=(xv, yv), verbose=0)
    for a, b in zip(m1.get_weights(), m2.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert h.history["val_loss"][-1] == pytest.approx(m1.evaluate(xv, yv)["loss"], rel=1e-5)


def test_model_fit_refuses_bad_input_and_changes_nothing():
    x, y = regression(10)
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    before = model.get_weights()
    cases = [
        (dict(x=x, y=y[:9]), ot.ShapeError, r"y: expected shape \(10, 3\), received \(9, 3\)"),
        (dict(x=x, y=y, batch_size=0), ot.OrtrainError, r"batch_size: expected a positive int or None, received 0"),
        (dict(x=x, y=y, validation_split=1.0), ot.OrtrainError, r"validation_split: expected a fraction in \[0, 1\)"),
        (dict(x=x, y=y, validation_split=0.95), ot.OrtrainError, r"validation_split=0.95 leaves 0 training and 10 "),
        (dict(x=x, y=y, sample_weight=np.ones(3)), ot.ShapeError, r"sample_weight: expected shape \(10,\) or \(10, 1\)"),
        (dict(x=x, y=y, shuffle="yes"), ot.OrtrainError, r"shuffle: expected True or False, received 'yes'"),
        (dict(x=x, y=y, validation_data=(x, y[:, :2])), ot.ShapeError, r"validation_data\[1\]: expected shape"),
        (dict(x=x), ot.OrtrainError, r"y: fit with arrays needs labels"),
        (dict(x=batches(1, 4), batch_size=4), ot.OrtrainError, r"batch_size: not used with a generator"),
        (dict(x=np.array(["a"] * 10)[:, None].repeat(4, 1), y=y), ot.ShapeError, r"x: expected a numeric array"),
    ]
    for kwargs, exc, message in cases:
        with pytest.raises(exc, match=message):
            model.fit(verbose=0, **kwargs)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert model.train_state is None
    fresh = mlp()
    with pytest.raises(ot.OrtrainError, match=r"model: not compiled; call model.compile"):
        fresh.fit(x, y)


def sparse_mlp():
    model = mlp(out_act="softmax")
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_model_fit_checks_every_class_label_before_the_first_step():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    y = rng.integers(0, 3, 10)
    late = y.copy()
    late[9] = 3  # in the last batch (and in the held-out rows of a 0.2 split)
    model = sparse_mlp()
    before = model.get_weights()
    cases = [
        (dict(x=x, y=late), r"^y: class labels must lie in \[0, 2\] \(the output has 3 classes\), received values "
                            r"from 0 to 3"),
        (dict(x=x, y=late, validation_split=0.2), r"^y: class labels must lie in \[0, 2\]"),
        (dict(x=x, y=y, validation_data=(x[:4], np.array([0, 1, -1, 2]))),
         r"^validation_data\[1\]: class labels must lie in \[0, 2\] .* received values from -1 to 2"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ot.ShapeError, match=message):
            model.fit(batch_size=4, shuffle=False, verbose=0, **kwargs)
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert model.train_state is None
    hist = model.fit(x, y[:, None], batch_size=4, verbose=0, validation_data=(x, y))  # (n, 1) labels train too
    assert hist.history["val_loss"][0] == pytest.approx(model.evaluate(x, y)["loss"], rel=1e-5)


def test_loop_checks_each_batch_once_and_still_names_the_step(monkeypatch):
    import ortrain.trainer as trainer_mod
    checked = []
    real = trainer_mod.prepare_labels
    monkeypatch.setattr(trainer_mod, "prepare_labels", lambda *a, **k: checked.append(1) or real(*a, **k))
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse", metrics=["mae"])
    data, val = batches(3, 4), batches(2, 4, seed=5)
    ot.fit_generator(model, data, validation_generator=val, epochs=2, verbose=0)
    # One check per training and validation batch, and one for the first batch before the model's
    # settings change (fit_generator), not a second one for the metrics.
    assert len(checked) == 1 + 2 * (3 + 2)
    bad = (data[1][0], data[1][1][:, :2])
    with pytest.raises(ot.ShapeError, match=r"epoch 0, step 1 \(counted from 0\): y: expected shape \(4, 3\), "
                                            r"received \(4, 2\)"):
        ot.fit_generator(model, [data[0], bad], verbose=0)
    # A list of validation batches is checked before training; a generator only as it runs.
    before = model.get_weights()
    with pytest.raises(ot.ShapeError, match=r"^validation_generator\[1\] y: expected shape \(4, 3\), "
                                            r"received \(4, 2\)"):
        ot.fit_generator(model, data, validation_generator=[val[0], bad], verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    pending = iter([val[0], bad, None])
    with pytest.raises(ot.ShapeError, match=r"validation after epoch 0, step 1 \(counted from 0\): y: expected "
                                            r"shape \(4, 3\), received \(4, 2\)"):
        ot.fit_generator(model, data, validation_generator=lambda: next(pending), verbose=0)


def test_class_labels_are_checked_under_a_loss_override_before_anything_changes():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    data = batches(2, 4)
    ot.fit_generator(model, data, verbose=0)
    opt, state, weights = model.optimizer, model.train_state, model.get_weights()
    x, _ = data[0]
    with pytest.raises(ot.ShapeError, match=r"epoch 0, step 0 \(counted from 0\): y: class labels must lie in "
                                            r"\[0, 2\]"):
        ot.fit_generator(model, [(x, np.array([0, 1, 2, 5]))], loss="sparse_categorical_crossentropy", verbose=0)
    assert model.optimizer is opt and model.loss.name == "mse" and model.train_state is state
    for a, b in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(a, b)

def test_fit_generator_overrides_change_the_model_only_when_training_starts():
    model = mlp()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    data = batches(2, 4)
    ot.fit_generator(model, data, verbose=0)
    opt, loss, state, weights = model.optimizer, model.loss, model.train_state, model.get_weights()
    x, y = data[0]
    cases = [
        (dict(generator=[(x, y[:, :2])], loss="mae", optimizer="sgd"), ot.ShapeError,
         r"epoch 0, step 0 \(counted from 0\): y: expected shape \(4, 3\), received \(4, 2\)"),
        (dict(generator=[(x, np.array([0, 1, 2, 5]))], loss="sparse_categorical_crossentropy"), ot.OrtrainError,
         "metrics: 'mae' compares the output with labels of its own shape, and loss 'sparse_categorical_crossentropy'"),
        (dict(generator=[(x, y, np.ones((4, 3)))], loss="categorical_crossentropy", loss_mask=3), ot.OrtrainError,
         "loss_mask=3 weights a mean squared error"),
        (dict(generator=data, optimizer="sgd", validation_generator=(x, y[:, :1])), ot.ShapeError,
         r"validation_generator\[1\]: expected shape \(4, 3\)"),
    ]
    for kwargs, exc, message in cases:
        with pytest.raises(exc, match=message):
            ot.fit_generator(model, verbose=0, **kwargs)
        assert model.optimizer is opt and model.loss is loss and model.metrics == ["mae"]
        assert model.train_state is state
        for a, b in zip(model.get_weights(), weights):
            np.testing.assert_array_equal(a, b)
    # A fit that fails after training began, but before its first step (a callback, Ctrl-C), also
    # leaves the compile settings; one that fails after a step keeps the overrides it trained with.
    class Stop(ot.callbacks.Callback):
        def __init__(self, hook):
            self.hook = hook

        def on_train_begin(self, logs=None):
            if self.hook == "on_train_begin":
                raise RuntimeError("a callback failed")

        def on_batch_begin(self, batch, logs=None):
            if self.hook == "on_batch_begin" and batch == 0:
                raise KeyboardInterrupt

        def on_batch_end(self, batch, logs=None):
            if self.hook == "on_batch_end":
                raise RuntimeError("a callback failed")

    for hook, exc in (("on_train_begin", RuntimeError), ("on_batch_begin", KeyboardInterrupt)):
        with pytest.raises(exc):
            ot.fit_generator(model, data, loss="mae", optimizer="sgd", callbacks=[Stop(hook)], verbose=0)
        assert model.optimizer is opt and model.loss is loss and model.train_state is state
        assert model.evaluate(x, y)["loss"] == pytest.approx(np.mean((model.predict(x) - y) ** 2), rel=1e-5)
    with pytest.raises(RuntimeError):
        ot.fit_generator(model, data, loss="mae", optimizer="sgd", callbacks=[Stop("on_batch_end")], verbose=0)
    assert model.loss.name == "mae" and model.optimizer.name == "sgd" and model.train_state.n_steps == 1
    # An uncompiled model takes its loss from the overrides, validation arrays included.
    fresh = mlp()
    xv, yv = regression(8, seed=2)
    hist = ot.fit_generator(fresh, data, loss="mse", optimizer=ot.optim.SGD(lr=0.05), validation_generator=(xv, yv),
                            verbose=0)
    assert fresh.loss.name == "mse" and fresh.train_state.n_steps == 2
    assert hist.history["val_loss"][0] == pytest.approx(fresh.evaluate(xv, yv)["loss"], rel=1e-5)


def test_counts_follow_one_rule_everywhere():
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    two = np.int64(2)  # numpy integers are counts too
    ot.optim.schedules.cosine(0.1, total_steps=two)
    ot.optim.schedules.step(0.1, every=two)
    ot.optim.schedules.warmup_cosine(0.1, warmup_steps=np.int64(1), total_steps=two)
    assert ot.callbacks.EarlyStopping(patience=two).patience == 2
    ot.callbacks.ReduceLROnPlateau(patience=two, cooldown=np.int64(0))
    ot.fit_generator(model, batches(2, 4), steps_per_epoch=two, epochs=two, verbose=0)
    with ot.Trainer(model, batch_size=np.int64(4)) as tr:
        assert tr.batch_size == 4
    for bad in (0, True, 2.5):
        with pytest.raises(ot.OrtrainError, match=rf"total_steps: expected a positive int, received {bad!r}"):
            ot.optim.schedules.cosine(0.1, total_steps=bad)
        with pytest.raises(ot.OrtrainError, match=rf"batch_size: expected a positive int, received {bad!r}"):
            ot.Trainer(model, batch_size=bad)
        with pytest.raises(ot.OrtrainError, match=rf"steps_per_epoch: expected a positive int or None, received "
                                                  rf"{bad!r}"):
            ot.fit_generator(model, batches(1, 4), steps_per_epoch=bad, verbose=0)
    with pytest.raises(ot.OrtrainError, match=r"ReduceLROnPlateau\(cooldown=...\): expected an int >= 0, received -1"):
        ot.callbacks.ReduceLROnPlateau(cooldown=-1)


def test_validation_data_takes_precedence_over_split():
    x, y = regression(20)
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    hist = model.fit(x, y, batch_size=5, validation_split=0.5, validation_data=(x[:4], y[:4]), verbose=0)
    assert hist.params["samples"] == 20


# -- train(): the entry for a bare trainer (command line) -----------------------------------------


def test_train_on_a_trainer_leaves_it_alive():
    x, y = regression(12)
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    ws = model.get_weights()
    for sl in (slice(0, 5), slice(5, 10), slice(10, 12)):
        ws = sgd(ws, mse_grads(ws, x[sl], y[sl])[1], 0.1)
    with ot.Trainer(model, batch_size=5) as tr:
        hist = train(tr, x, y, shuffle=False, verbose=0)
        assert tr.n_steps == 3
        assert_weights(tr.model(), ws)
        hist2 = train(tr, batches(2, 5), epochs=2, initial_epoch=1, verbose=0)
        assert tr.n_steps == 5
    assert model.train_state is None  # no model given: the caller keeps the trainer
    assert hist.epoch == [0] and hist2.epoch == [1]
    with pytest.raises(ot.OrtrainError, match="sample_weight: this trainer has no loss weights"):
        with ot.Trainer(model, batch_size=5) as tr:
            train(tr, x, y, sample_weight=np.ones(12), verbose=0)


def test_train_with_element_loss_mask():
    x, y = regression(8)
    mask = np.ones((8, 3), np.float32)
    mask[:, 1] = 0
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=4, loss_mask=3) as tr:
        train(tr, x, y, sample_weight=mask, shuffle=False, verbose=0)
        w2 = tr.model().get_weights()[2]
    np.testing.assert_array_equal(w2[:, 1], model.get_weights()[2][:, 1])  # masked output never moved
    assert not np.array_equal(w2[:, 0], model.get_weights()[2][:, 0])


# -- History --------------------------------------------------------------------------------------


def fitted_history():
    x, y = regression(16)
    model = mlp()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model.fit(x, y, batch_size=8, epochs=3, validation_split=0.25, verbose=0)


def test_history_exports(tmp_path):
    hist = fitted_history()
    assert hist.params["epochs"] == 3 and hist.params["batch_size"] == 8
    assert hist.params["metrics"] == ["loss", "mae", "val_loss", "val_mae", "lr"]
    path = hist.to_csv(tmp_path / "h.csv")
    lines = open(path).read().splitlines()
    assert lines[0] == "epoch,loss,lr,mae,val_loss,val_mae"  # sorted, as CSVLogger writes them
    assert len(lines) == 4
    assert float(lines[2].split(",")[1]) == hist.history["loss"][1]


def test_history_to_pandas_and_plot(tmp_path):
    pytest.importorskip("pandas", reason="the plot extra is not installed")
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    hist = fitted_history()
    df = hist.to_pandas()
    assert list(df.index) == [0, 1, 2] and df["val_loss"].tolist() == hist.history["val_loss"]
    png = hist.plot(tmp_path / "h.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the file is the path given (matplotlib alone writes 'noext.png' for 'noext'); the format is its extension
    assert hist.plot(tmp_path / "noext") == str(tmp_path / "noext")
    assert open(tmp_path / "noext", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert open(hist.plot(tmp_path / "h.svg"), "rb").read(5) in (b"<?xml", b"<svg ")
    import matplotlib.pyplot as plt
    figures = plt.get_fignums()
    (tmp_path / "folder").mkdir()
    for path, said in ((tmp_path / "folder", "it is a directory"), (tmp_path / "no" / "h.png", "does not exist"),
                       (None, "expected a file path"), (tmp_path / "h.bogus", "matplotlib writes no 'bogus' files")):
        with pytest.raises(ot.OrtrainError, match=f"History.plot\\(path\\): .*{said}"):
            hist.plot(path)
    assert plt.get_fignums() == figures   # a refused plot leaves no figure open
    assert sorted(os.listdir(tmp_path)) == ["folder", "h.png", "h.svg", "noext"]


def test_history_missing_extras_name_the_extra(monkeypatch, tmp_path):
    hist = fitted_history()
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ot.OrtrainError, match=r"to_pandas needs pandas.*pip install 'ortrain\[plot\]'"):
        hist.to_pandas()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ot.OrtrainError, match=r"plot needs matplotlib.*pip install 'ortrain\[plot\]'"):
        hist.plot(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_history_aligns_values_that_appear_late():
    h = ot.History()
    h.on_epoch_end(0, {"loss": 1.0})
    h.on_epoch_end(1, {"loss": 0.5, "extra": 2.0})
    h.on_epoch_end(2, {"extra": 3.0})
    assert h.epoch == [0, 1, 2]
    np.testing.assert_equal(h.history["loss"], [1.0, 0.5, np.nan])
    np.testing.assert_equal(h.history["extra"], [np.nan, 2.0, 3.0])
    with pytest.raises(ot.OrtrainError, match="holds no epoch"):
        ot.History().plot("never.png")


def test_no_warning_on_a_clean_fit():
    x, y = regression(16)
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)


def test_unfreezing_keeps_the_moments_of_weights_that_trained_as_keras_does():
    x, y = batches(1, 4)[0]
    model = mlp()
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    ws = [w.astype(np.float64) for w in model.get_weights()]
    model.freeze("dense_0")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)   # two updates of dense_1
    model.unfreeze("dense_0")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)   # dense_0 joins at update 3
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    m, v = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for t, trained in ((1, (2, 3)), (2, (2, 3)), (3, (0, 1, 2, 3))):
        _, grads = mse_grads(ws, x, y)
        for i in trained:   # one update count, shared; a weight's moments start when it starts training
            m[i] = b1 * m[i] + (1 - b1) * grads[i]
            v[i] = b2 * v[i] + (1 - b2) * grads[i] ** 2
            ws[i] = ws[i] - lr * (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps)
    for got, want in zip(model.get_weights(), ws):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert model.train_state.step == 3


def test_history_to_csv_writes_text_a_callback_logged(tmp_path):
    class Phase(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["phase"] = "warmup" if epoch == 0 else "main"
            logs["seen"] = np.int64(2**60 + epoch)  # integers stay integers, exactly

    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    hist = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                     callbacks=[Phase(), ot.callbacks.CSVLogger(tmp_path / "log.csv")])
    lines = open(hist.to_csv(tmp_path / "h.csv")).read().splitlines()
    assert lines[0] == "epoch,loss,lr,phase,seen"
    assert [line.split(",")[3:] for line in lines[1:]] == [["warmup", "1152921504606846976"],
                                                           ["main", "1152921504606846977"]]
    logged = open(tmp_path / "log.csv").read().splitlines()
    assert logged[0] == "epoch,loss,lr,phase,seen" and logged[1:] == lines[1:]  # as CSVLogger writes them


def test_history_to_csv_writes_the_columns_in_csv_loggers_order(tmp_path):
    # to_csv wrote them in the order they were logged (lr before the metrics), CSVLogger sorted
    x, y = batches(1, 16)[0]
    model = mlp()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    hist = model.fit(x, y, batch_size=8, epochs=3, validation_data=(x, y), validation_freq=2, verbose=0,
                     callbacks=[ot.callbacks.CSVLogger(tmp_path / "log.csv")])
    written = open(hist.to_csv(tmp_path / "h.csv")).read()
    assert written.splitlines()[0] == "epoch,loss,lr,mae,val_loss,val_mae"
    assert written == open(tmp_path / "log.csv").read()


def test_the_model_fit_returns_holds_what_a_callback_changed_without_a_step(rng):
    x = rng.normal(3.0, 2.0, (256, 4)).astype(np.float32)
    y = np.zeros((256, 1), np.float32)

    class Calibrate(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            _ = self.model  # brought up to date here, then the trainer's weights change again
            self.trainer.calibrate_bn(x)

    model = ot.Sequential([ot.layers.BatchNorm(), ot.layers.Dense(1)], input_shape=(4,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False, callbacks=[Calibrate()])
    weights = dict(zip(model.weight_names(), model.get_weights()))
    np.testing.assert_allclose(weights["batch_norm_0.running_mean"], x.astype(np.float64).mean(0), rtol=1e-5)
    np.testing.assert_allclose(weights["batch_norm_0.running_var"], x.astype(np.float64).var(0), rtol=1e-5)


@pytest.mark.parametrize("how", ["fit_generator", "fit generator", "fit arrays"])
def test_weighted_validation_batches_weight_val_loss_whatever_the_training_batches(how, rng):
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.standard_normal((16, 3)).astype(np.float32)
    w = rng.random(16).astype(np.float32)
    train = [(x[:8], y[:8]), (x[8:], y[8:])]
    calls = []

    def val():  # a callable: its first batch is read before training to learn it carries weights
        calls.append(len(calls))
        if len(calls) % 3 == 0:
            return None
        i = len(calls) % 3 - 1
        return x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8], w[i * 8:(i + 1) * 8]

    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    if how == "fit_generator":
        hist = ot.fit_generator(model, train, epochs=2, validation_generator=val, verbose=0)
    elif how == "fit generator":
        hist = model.fit(train, epochs=2, validation_data=val, verbose=0)
    else:
        hist = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, validation_data=val, verbose=0)
    assert calls == list(range(6))  # two validations of two batches and an end, nothing pulled twice
    k, b = model.get_weights()
    err = ((x.astype(np.float64) @ k + b - y) ** 2).mean(axis=1)
    np.testing.assert_allclose(hist.history["val_loss"][-1], (w * err).sum() / 16, rtol=1e-5)
    # the training itself is the unweighted one
    ref = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    ref.compile(optimizer="sgd", loss="mse")
    ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, r in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, r, rtol=1e-6, atol=1e-7)


def test_accuracy_on_one_output_unit_thresholds_whatever_the_loss():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = (rng.random((200, 1)) > 0.5).astype(np.float32)
    for loss in ("mse", "mae", ot.losses.Huber()):
        model = ot.Sequential([ot.layers.Dense(1, activation="sigmoid")], input_shape=(4,), seed=0)
        model.compile(optimizer="sgd", loss=loss, metrics=["accuracy"], weighted_metrics=["accuracy"])
        p = model.predict(x)
        assert model.evaluate(x, y)["accuracy"] == pytest.approx(np.mean((p > 0.5) == (y > 0.5)))
        # every weight 0: Keras divides with divide_no_nan and reports 0 for the weighted metric
        zero = model.evaluate(x, y, sample_weight=np.zeros(200))
        assert zero["weighted_accuracy"] == 0.0
        assert zero["accuracy"] == pytest.approx(np.mean((p > 0.5) == (y > 0.5)))  # metrics count every sample


def test_negative_sample_weights_are_taken_as_keras_takes_them():
    # an advantage weighing a policy-gradient loss: the loss is sum(w * l) / n, the weighted metric
    # sum(w * c) / sum(w), and a step moves the weights against the weighted gradient
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    w = np.array([1.0, -0.5, 2.0, -1.0, 0.25, 1.0], np.float32)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    kernel, bias = model.get_weights()
    z = x.astype(np.float64) @ kernel + bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    losses = -np.log(p[np.arange(6), y])
    got = model.evaluate(x, y, sample_weight=w, verbose=0)
    assert got["loss"] == pytest.approx(np.sum(w * losses) / 6, rel=1e-5)
    assert got["accuracy"] == pytest.approx(np.sum(w * (p.argmax(1) == y)) / w.sum(), rel=1e-6)
    g = (p - np.eye(3)[y]) * w[:, None] / 6
    model.fit(x, y, sample_weight=w, batch_size=6, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], kernel - 0.1 * x.T.astype(np.float64) @ g, rtol=1e-5, atol=1e-6)


def test_binary_accuracy_thresholds_logits_at_zero_as_accuracy_does():
    # binary_accuracy thresholded logits at 0.5 while accuracy took 0, in the same run
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = (rng.random((200, 1)) > 0.5).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(1)], input_shape=(4,), seed=0)
    model.compile(optimizer="sgd", loss=ot.losses.BinaryCrossentropy(from_logits=True),
                  metrics=["accuracy", "binary_accuracy"])
    z = model.predict(x)
    got = model.evaluate(x, y)
    want = np.mean((z > 0) == (y > 0.5))
    assert want != np.mean((z > 0.5) == (y > 0.5))
    assert got["accuracy"] == got["binary_accuracy"] == pytest.approx(want)


def test_a_batch_callable_that_requires_arguments_is_refused_before_anything(rng):
    x, y = rng.random((8, 4)).astype(np.float32), rng.random((8, 2)).astype(np.float32)
    model = dense_model(4, 2, optimizer="adam")
    before = model.get_weights()
    with pytest.raises(ot.OrtrainError, match="generator: expected a callable of no arguments returning a batch .*"
                                              "requires 'i'; wrap it"):
        ot.fit_generator(model, lambda i: (x, y), steps_per_epoch=1, verbose=0)
    with pytest.raises(ot.OrtrainError, match="validation_data: expected a callable of no arguments .*requires 'k'"):
        model.fit(x, y, validation_data=lambda k: (x, y), verbose=0)
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    assert model.optimizer.step == 0
    for batches in (lambda i=0: (x, y), lambda *args: (x, y)):  # callable with no arguments all the same
        ot.fit_generator(model, batches, steps_per_epoch=1, verbose=0)
    assert model.optimizer.step == 2


def test_a_compiled_models_optimizer_shows_and_restores_the_models_state(rng):
    # As Keras' model.optimizer.iterations counts a fit's updates: opt.step and opt.state() read the
    # model's optimizer state (live in callbacks), and opt.load_state restores it for the next fit.
    # Reference: Adam written out in numpy.
    x, y = rng.standard_normal((32, 4)).astype(np.float32), rng.standard_normal((32, 2)).astype(np.float32)
    opt = ot.optim.Adam(lr=0.01)
    model = dense_model(4, 2, optimizer=opt)
    assert (opt.step, opt.state()["step"], opt.state()["moments"]) == (0, 0, {})
    ref = NumpyAdam(model.get_weights(), lr=0.01)
    counts = []

    class Count(ot.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            counts.append(self.model.optimizer.step)

    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[Count()])
    for _ in range(2):
        for i in range(0, 32, 8):
            ref.step(linear_mse_grads(x[i:i + 8], y[i:i + 8], *ref.p))
    assert counts == list(range(1, 9)) and opt.step == 8
    state = opt.state()
    assert state["step"] == 8 and sorted(state["moments"]) == ["dense_0.bias", "dense_0.kernel"]
    for name, i in (("dense_0.kernel", 0), ("dense_0.bias", 1)):
        np.testing.assert_allclose(state["moments"][name]["m"], ref.m[i], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(state["moments"][name]["v"], ref.v[i], rtol=1e-4, atol=1e-9)
    after = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    continued = model.get_weights()
    assert opt.step == 12
    # refused, changing nothing: a count written alone, moments of other weights or shapes
    with pytest.raises(ot.OrtrainError, match="opt.step: this optimizer is compiled into model"):
        opt.step = 3
    with pytest.raises(ot.OrtrainError, match="moments of 'nope', which this optimizer does not hold"):
        opt.load_state({**state, "moments": {"nope": {"m": np.zeros(2), "v": np.zeros(2)}}})
    with pytest.raises(ot.OrtrainError, match="moments of 'dense_0.kernel' expected shape \\(4, 2\\)"):
        opt.load_state({**state, "moments": {"dense_0.kernel": {"m": np.zeros(3), "v": np.zeros(3)}}})
    assert opt.step == 12
    # restored: the next fit continues exactly as the uninterrupted one did
    model.set_weights(after)
    opt.load_state(state)
    assert opt.step == 8
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), continued):
        np.testing.assert_array_equal(got, want)
    # a fit's trainer holds the state while it runs: loading then is refused
    refused = []

    class Load(ot.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            with pytest.raises(ot.OrtrainError, match="load_state: this model is fitting"):
                self.model.optimizer.load_state(state)
            refused.append(batch)

    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[Load()])
    assert refused == [0, 1, 2, 3] and opt.step == 16


def test_a_compiled_optimizers_state_round_trip_is_exact_and_follows_the_model_that_fits(rng):
    # state() carries the model's rate (a schedule's), its steps and dropout draws: load_state(state())
    # changes nothing, with gradient accumulation and seeded dropout too; an optimizer shared by two
    # models follows the one that fits; a pickled model holds its moments once.
    import pickle
    x, y = rng.random((64, 8)).astype(np.float32), rng.random((64, 2)).astype(np.float32)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]

    def model(seed=0):
        m = ot.Sequential([ot.layers.Dense(16), ot.layers.Dropout(0.5, seed=3), ot.layers.Dense(2)],
                          input_shape=(8,), seed=seed)
        m.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
        return m

    runs = []
    for round_trip in (False, True):
        m = model()
        ot.fit_generator(m, batches, epochs=1, verbose=0, nbatch_logical=32,
                         callbacks=[ot.callbacks.LearningRateScheduler(lambda epoch, lr: 1e-3)])
        state = m.optimizer.state()
        assert (state["step"], state["n_steps"], state["draws"], state["lr"]) == (2, 8, 8, 1e-3)
        if round_trip:
            m.optimizer.load_state(state)
        ot.fit_generator(m, batches, epochs=1, verbose=0, nbatch_logical=32)
        runs.append(m.get_weights())
    for got, want in zip(*runs):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ot.OrtrainError, match="load_state: 'draws' expected an int >= 0"):
        m.optimizer.load_state({**state, "draws": -1})

    shared = ot.optim.Adam(lr=1e-2)
    first, second = model(0), model(1)
    first.compile(optimizer=shared, loss="mse")
    second.compile(optimizer=shared, loss="mse")
    first.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert shared.step == first.train_state.step == 8 and shared.state()["step"] == 8

    copied = pickle.loads(pickle.dumps(first))
    assert copied.optimizer.step == 8 and copied.optimizer.state()["n_steps"] == 8
    big = ot.Sequential([ot.layers.Dense(256)], input_shape=(256,), seed=0)
    big.compile(optimizer="adam", loss="mse")
    big.fit(np.ones((4, 256), np.float32), np.ones((4, 256), np.float32), verbose=0)
    weights = sum(w.nbytes for w in big.get_weights())
    assert len(pickle.dumps(big)) < 3.2 * weights  # the weights, then m and v once each


@pytest.mark.parametrize("collected", ["at once", "by the cycle collector"])
def test_an_optimizer_kept_after_its_model_keeps_the_models_state(tmp_path, collected):
    """``ot.load_model(path).optimizer`` (the model dropped at once) or a model collected as part of a
    reference cycle: its optimizer keeps the step, moments, counts and rate it showed, as a Keras
    optimizer keeps its variables, and loading that state into a fresh model resumes exactly."""
    import gc

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 4)).astype(np.float32), rng.random((64, 2)).astype(np.float32)

    def model():
        m = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(2)], input_shape=(4,), seed=0)
        m.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
        return m

    trained = model()
    trained.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
                callbacks=[ot.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 / (epoch + 1))])
    trained.save(tmp_path / "m.ortrain")
    want = trained.optimizer.state()

    def orphan():
        loaded = ot.load_model(tmp_path / "m.ortrain")
        if collected != "at once":
            loaded.me = loaded  # freed only by the cycle collector, which clears weak references first
        return loaded.optimizer

    opt = orphan()
    gc.collect()
    got = opt.state()
    assert (opt.step, got["step"], got["n_steps"], got["draws"], got["lr"]) == (8, 8, 8, want["draws"], 0.005)
    assert sorted(got["moments"]) == sorted(want["moments"])
    for name, moments in want["moments"].items():
        for key in ("m", "v"):
            np.testing.assert_array_equal(got["moments"][name][key], moments[key])

    resumed = model()
    resumed.set_weights(trained.get_weights())
    resumed.optimizer.load_state(got)
    for m in (trained, resumed):
        m.fit(x, y, batch_size=16, epochs=3, initial_epoch=2, verbose=0, shuffle=False)
    assert resumed.optimizer.state()["n_steps"] == 12
    for a, b in zip(resumed.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_compiling_again_with_the_same_optimizer_keeps_its_state_as_keras_does():
    # a recompile to add a metric reset the Adam moments and step
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 4)).astype(np.float32), rng.random((32, 2)).astype(np.float32)

    def model():
        m = _dense_4_2()
        m.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
        return m

    straight, recompiled = model(), model()
    straight.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    recompiled.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    opt = recompiled.optimizer
    recompiled.compile(optimizer=opt, loss="mse", metrics=["mae"])
    assert opt.step == 8 and recompiled.optimizer.state()["step"] == 8
    hist = recompiled.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0, shuffle=False)
    assert "mae" in hist.history and opt.step == 12
    for a, b in zip(recompiled.get_weights(), straight.get_weights()):
        np.testing.assert_array_equal(a, b)
    recompiled.compile(optimizer="adam", loss="mse")  # another optimizer starts afresh
    assert recompiled.optimizer.step == 0 and recompiled.train_state is None


def test_a_rate_restored_by_load_state_between_fits_is_the_next_fits():
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model = mlp()
    model.compile(optimizer=ot.optim.Adam(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    state = model.optimizer.state()
    state["lr"] = 0.01
    model.optimizer.load_state(state)
    assert model.fit(x, y, batch_size=8, epochs=1, verbose=0).history["lr"] == [0.01]


@pytest.mark.parametrize("schedule", ["StepDecay", "CosineDecay"])
def test_a_schedule_resumed_after_load_state_continues_the_same_curve(schedule):
    # load_state counted the state's rate (the schedule's last) as one written, and the schedule took it
    # for its base: the resumed fit trained at 0.0125 and 0.00625 where the uninterrupted one trains at
    # 0.025 and 0.0125
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)

    def model():
        m = mlp()
        m.compile(optimizer=ot.optim.Adam(lr=0.1), loss="mse")
        return m

    def curve():
        return [ot.callbacks.StepDecay(drop=0.5, every=1) if schedule == "StepDecay"
                else ot.callbacks.CosineDecay(total_epochs=4)]
    straight, resumed = model(), model()
    straight.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=curve())
    resumed.set_weights(straight.get_weights())
    resumed.optimizer.load_state(straight.optimizer.state())
    assert resumed.optimizer.lr == straight.optimizer.lr  # the state's rate, as after the fit itself
    want = straight.fit(x, y, batch_size=4, epochs=4, initial_epoch=2, verbose=0, shuffle=False, callbacks=curve())
    got = resumed.fit(x, y, batch_size=4, epochs=4, initial_epoch=2, verbose=0, shuffle=False, callbacks=curve())
    assert got.history["lr"] == want.history["lr"]
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_trainer_checkpoint_after_an_sgd_state_loaded_with_load_state_resumes(tmp_path):
    # SGD's loaded state holds no moments, only the update count, which the trainer's session did not
    # get: its checkpoint was refused ("2 updates recorded, the optimizer state holds 1")
    x, y = np.ones((4, 4), np.float32), np.zeros((4, 3), np.float32)
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.01), loss="mse")
    model.fit(x, y, batch_size=4, verbose=0)
    model.optimizer.load_state(model.optimizer.state())
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, y)
        tr.save_checkpoint(tmp_path / "s.ckpt")
        tr.step(x, y)
        want = tr.get_weights()
    with ot.Trainer.from_checkpoint(model, tmp_path / "s.ckpt", batch_size=4) as resumed:
        assert (resumed.n_steps, resumed.n_updates) == (2, 2)
        resumed.step(x, y)
        for a, b in zip(resumed.get_weights(), want, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("weighted_training", [False, True])
def test_the_first_validation_batch_is_read_before_training_whatever_the_batches(weighted_training):
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    events = []

    def val():
        events.append("validation batch")
        return None if events.count("validation batch") % 2 == 0 else (x, y)

    class Record(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            events.append("train begin")

    batch = (x, y, np.ones(8, np.float32)) if weighted_training else (x, y)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    ot.fit_generator(model, [batch], epochs=1, validation_generator=val, callbacks=[Record()], verbose=0)
    assert events == ["validation batch", "train begin", "validation batch"]
    events.clear()
    model.fit(x, y, batch_size=8, epochs=1, validation_data=val, callbacks=[Record()], verbose=0,
              sample_weight=np.ones(8) if weighted_training else None)
    assert events == ["validation batch", "train begin", "validation batch"]


def test_a_weight_frozen_for_a_fit_keeps_its_moments_for_when_it_trains_again(tmp_path):
    x, y = batches(1, 4)[0]
    model = mlp()
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    ws = [w.astype(np.float64) for w in model.get_weights()]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)   # update 1: every weight
    model.freeze("dense_0")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)   # update 2: dense_1 alone
    model.save(tmp_path / "m")  # the frozen weights' moments are part of the saved state too
    model = ot.load_model(tmp_path / "m")
    model.unfreeze("dense_0")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)   # update 3: dense_0 goes on from update 1
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    m, v = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for t, trained in ((1, (0, 1, 2, 3)), (2, (2, 3)), (3, (0, 1, 2, 3))):
        _, grads = mse_grads(ws, x, y)
        for i in trained:
            m[i] = b1 * m[i] + (1 - b1) * grads[i]
            v[i] = b2 * v[i] + (1 - b2) * grads[i] ** 2
            ws[i] = ws[i] - lr * (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps)
    for got, want in zip(model.get_weights(), ws):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("how", ["load_model", "copy"])
def test_a_rate_written_on_a_loaded_or_copied_model_is_the_next_fits(tmp_path, how):
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model = mlp()
    model.compile(optimizer=ot.optim.Adam(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    if how == "load_model":
        model.save(tmp_path / "m")
        other = ot.load_model(tmp_path / "m")
    else:
        other = model.copy()
    again = other.copy()
    assert again.fit(x, y, batch_size=8, epochs=1, verbose=0).history["lr"] == [0.1]  # the state's rate
    other.optimizer.lr = 0.001  # before any fit of this object
    assert other.fit(x, y, batch_size=8, epochs=1, verbose=0).history["lr"] == [0.001]


def test_several_inputs_as_a_list_a_tuple_or_a_dict_by_name_as_in_keras():
    rng = np.random.default_rng(0)
    xa, xb, y = rng.random((16, 4)), rng.random((16, 3)), rng.random((16, 1))
    a, b = ot.Input((4,), name="a"), ot.Input((3,), name="b")

    def model():
        m = ot.Model([a, b], ot.layers.Dense(1)(ot.layers.Concatenate()([a, b])))
        m.set_weights([np.arange(7, dtype=np.float32).reshape(7, 1) / 10, np.zeros(1, np.float32)])
        return m.compile(optimizer="sgd", loss="mse")

    forms = {"list": [xa, xb], "tuple": (xa, xb), "dict": {"b": xb, "a": xa}}
    results = {}
    for name, x in forms.items():
        m = model()
        hist = m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=(x, y))
        results[name] = (hist.history["loss"], hist.history["val_loss"], m.predict(x), m.evaluate(x, y)["loss"])
    for name in ("tuple", "dict"):
        for got, want in zip(results[name], results["list"]):
            np.testing.assert_array_equal(got, want)
    k, bias = m.get_weights()  # the dict form's model, trained
    pred = np.concatenate([xa, xb], 1) @ k + bias
    np.testing.assert_allclose(results["dict"][2], pred, rtol=1e-5)
    np.testing.assert_allclose(results["dict"][3], np.mean((pred - y) ** 2), rtol=1e-5)
    with pytest.raises(ot.ShapeError, match=r"x: a dict of inputs needs one array per input name \['a', 'b'\] \(model.input_names\); "
                                            r"missing \['b'\]; unexpected \['c'\]"):
        m.predict({"a": xa, "c": xb})
    with pytest.raises(ot.ShapeError, match="y: expected one label array, for the model's first output"):
        m.fit(forms["list"], [y, y], verbose=0)


def test_a_ctrl_c_while_fit_writes_back_still_writes_weights_and_state_together(monkeypatch):
    x, y = np.ones((16, 4), np.float32), np.zeros((16, 3), np.float32)
    ref, model = mlp(), mlp()
    for m in (ref, model):
        m.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    real, calls = ot.Trainer._state, []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 1:  # Ctrl-C lands in the write-back
            raise KeyboardInterrupt
        return real(self)
    monkeypatch.setattr(ot.Trainer, "_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert model.train_state.n_steps == ref.train_state.n_steps == 4
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_array_equal(a, b)
    for name, moments in ref.train_state.moments.items():
        for a, b in zip(model.train_state.moments[name], moments):
            np.testing.assert_array_equal(a, b)


def test_a_trainer_takes_a_rate_written_on_a_model_that_carries_state(tmp_path):
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.save(tmp_path / "m")
    for m in (model, ot.load_model(tmp_path / "m"), model.copy()):
        with ot.Trainer(m, batch_size=8) as tr:
            assert tr.lr == 0.1  # the state's
        m.optimizer.lr = 0.5
        with ot.Trainer(m, batch_size=8) as tr:
            assert tr.lr == 0.5


def test_fit_with_a_generator_refuses_arrays_of_sample_weights_by_name(tmp_path):
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    batch = (np.ones((4, 4), np.float32), np.zeros((4, 3), np.float32))
    with pytest.raises(ot.OrtrainError, match="sample_weight: not used with a generator"):
        model.fit([batch], sample_weight=np.ones(4), verbose=0)
    model.fit([batch], validation_split=0, verbose=0)  # the default, as an int
    with pytest.raises(ot.OrtrainError, match=r"save\(path\): cannot write .*choose a folder you can write to"):
        model.save("/proc/m.ortrain")


def test_arguments_of_the_wrong_kind_are_named():
    model = mlp()
    with pytest.raises(ot.OrtrainError, match=r"metrics: expected a list of names"):
        model.compile(optimizer="sgd", loss="mse", metrics=5)
    assert not model.compiled
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    before = model.get_weights()
    for callbacks in (5, ot.callbacks.TerminateOnNaN()):
        with pytest.raises(ot.OrtrainError, match="callbacks: expected a list of ot.callbacks.Callback objects"):
            model.fit(x, y, callbacks=callbacks, verbose=0)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ot.OrtrainError, match="directory: expected the path of an artifacts directory"):
        ot.artifacts.load(None)


def test_paths_of_the_wrong_kind_are_named():
    with pytest.raises(ot.OrtrainError, match=r"CSVLogger\(filename=...\): expected a file path"):
        ot.callbacks.CSVLogger(None)
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.OrtrainError, match="checkpoint: expected a file path, received None"):
        ot.Trainer.from_checkpoint(model, None, batch_size=4)


def test_warnings_of_a_generator_fit_point_at_the_callers_line():
    model = mlp()
    model.compile(optimizer="adamw", loss="mse")   # weight decay, which fit_generator turns off by default
    with pytest.warns(RuntimeWarning, match="yielded no batch") as caught:
        model.fit([], verbose=0)
    assert caught[0].filename == __file__
    with pytest.warns(UserWarning, match="turns off the weight decay") as caught:
        ot.fit_generator(model, batches(1, 4), verbose=0)
    assert caught[0].filename == __file__
    with pytest.warns(RuntimeWarning, match="yielded no batch") as caught:
        ot.fit_generator(model, [], verbose=0)
    assert caught[0].filename == __file__
    # raised from the epoch loop, deeper down: a short epoch, a part accumulation period, a dry generator
    data = batches(5, 4)
    with pytest.warns(RuntimeWarning, match="ended the epoch after 5 of steps_per_epoch=7") as caught:
        ot.fit_generator(model, data, steps_per_epoch=7, epochs=1, verbose=0, weight_decay=None)
    assert caught[0].filename == __file__
    with pytest.warns(RuntimeWarning, match="into an accumulation period") as caught:
        ot.fit_generator(model, data, nbatch_logical=8, verbose=0, weight_decay=None)
    assert caught[0].filename == __file__
    with pytest.warns(RuntimeWarning, match="the generator ran dry") as caught:
        model.fit(iter(data), steps_per_epoch=3, epochs=3, verbose=0)
    assert caught[0].filename == __file__


def test_a_probability_loss_on_logits_warns_at_the_first_step(rng):
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = np.arange(8) % 3
    logits = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    logits.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.warns(UserWarning, match=r"loss 'sparse_categorical_crossentropy' takes probabilities "
                                         r"\(from_logits=False\), and the model's first output held values from "
                                         r"-?[0-9.]+ to [0-9.]+ at the first step.*SparseCategoricalCrossentropy"
                                         r"\(from_logits=True\)") as caught:
        logits.fit(x, y, epochs=2, batch_size=4, verbose=0)
    assert sum("takes probabilities" in str(w.message) for w in caught) == 1  # once, not every step
    probs = ot.Sequential([ot.layers.Dense(3, activation="softmax")], input_shape=(4,), seed=0)
    probs.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs.fit(x, y, epochs=2, batch_size=4, verbose=0)


@pytest.mark.torch
def test_train_on_batch_steps_once_on_the_whole_batch_as_keras_does(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((40, 4)).astype(np.float32)   # more rows than fit's default batch of 32
    y = rng.integers(0, 3, 40)
    model = ot.Sequential([ot.layers.Dense(3, activation="softmax")], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    w, b = (torch.tensor(a, requires_grad=True) for a in model.get_weights())
    opt = torch.optim.Adam([w, b], lr=0.1)
    for _ in range(3):
        loss, acc = model.train_on_batch(x, y)
        p = torch.softmax(torch.from_numpy(x) @ w + b, 1)
        want = torch.nn.functional.nll_loss(torch.log(p), torch.from_numpy(y))
        opt.zero_grad()
        want.backward()
        opt.step()
        np.testing.assert_allclose(loss, want.item(), rtol=1e-5)   # the loss before the update
        assert acc == pytest.approx(np.mean(p.detach().numpy().argmax(1) == y))
    np.testing.assert_allclose(model.get_weights()[0], w.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert model.train_state.n_steps == 3 and model.history is None
    got = model.test_on_batch(x, y)
    assert got == list(model.evaluate(x, y).values())
    assert model.test_on_batch(x, y, return_dict=True) == model.evaluate(x, y)
    assert sorted(model.train_on_batch(x, y, return_dict=True)) == ["accuracy", "loss"]



def test_metrics_are_logged_and_monitored_by_the_names_given(rng):
    # Keras keeps a metric's name: "acc" logs acc and val_acc, which callbacks monitor by that name.
    x = rng.standard_normal((40, 4)).astype(np.float32)
    labels = (x[:, :1] > 0).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(1, activation="sigmoid")], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="binary_crossentropy", metrics=["acc", "mean_absolute_error"])
    stop = ot.callbacks.EarlyStopping(monitor="val_acc", patience=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a monitor that is never logged warns
        hist = model.fit(x, labels, batch_size=8, epochs=5, validation_split=0.25, callbacks=[stop], verbose=0)
    assert sorted(hist.history) == ["acc", "loss", "lr", "mean_absolute_error", "val_acc", "val_loss",
                                    "val_mean_absolute_error"]
    assert len(hist.epoch) == 2  # lr 0: val_acc never improves after the first epoch
    p = model.predict(x)
    got = model.evaluate(x, labels, verbose=0)
    assert sorted(got) == ["acc", "loss", "mean_absolute_error"]
    assert got["acc"] == pytest.approx(np.mean((p > 0.5) == (labels > 0.5)))
    assert got["mean_absolute_error"] == pytest.approx(np.mean(np.abs(p - labels)), rel=1e-6)
    assert hist.history["val_acc"][0] == pytest.approx(np.mean((p[30:] > 0.5) == (labels[30:] > 0.5)))
    with pytest.raises(ot.OrtrainError, match="metrics: 'mean_absolute_error' compares the output with labels of "
                                              "its own shape, and loss 'sparse_categorical_crossentropy'"):
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["mean_absolute_error"])


def test_a_model_read_while_its_fit_ends_in_another_thread_gives_the_state_it_holds(rng):
    # Another thread's fit may end between the check that it runs and the read of its live state:
    # its trainer is freed by then, after handing its state to the model, which is what a read gives.
    x, y = rng.random((8, 4)).astype(np.float32), rng.random((8, 2)).astype(np.float32)
    model = dense_model(4, 2, optimizer="adam")
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    held = model.train_state

    def ended():
        raise ot.FreedError("this training session was freed")

    model._live_state, model._live_updates = ended, ended  # as a fit that ended meanwhile leaves them
    assert model.train_state is held and model.optimizer.step == 2 and model.optimizer.state()["step"] == 2


def test_the_models_state_is_handed_over_before_a_fit_stops_showing_its_live_state(rng, monkeypatch):
    # A read from another thread while a fit ends (here: while it brings the weights over) gives
    # the fit's state, never the state from before the fit.
    from ortrain._loop import Loop
    x, y = rng.random((8, 4)).astype(np.float32), rng.random((8, 2)).astype(np.float32)
    model = dense_model(4, 2, optimizer="adam")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    seen = []
    bring = Loop.model.fget

    def reading(loop):
        if loop.trainer is not None and loop.stepped:
            seen.append((model.optimizer.step, model.train_state.step))
        return bring(loop)

    monkeypatch.setattr(Loop, "model", property(reading))
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert seen and set(seen) <= {(s, s) for s in (3, 4, 5, 6)} and seen[-1] == (6, 6)


def test_a_save_or_copy_from_another_thread_mid_fit_pairs_weights_and_state_of_one_step(rng, tmp_path):
    # the other thread paired the weights the model held last (from before the fit, or a callback's read)
    # with the fit's live step and moments: a file that resumed with stale weights, or fresh moments
    import copy
    import pickle
    x = rng.standard_normal((80, 4)).astype(np.float32)
    y = x @ np.ones((4, 1), np.float32)

    def batches(pause=None):
        for i in range(10):
            if pause is not None and i == 5:
                pause()
            yield x[8 * i:8 * i + 8], y[8 * i:8 * i + 8]

    straight = dense_model(4, 1, optimizer=ot.optim.Adam(lr=0.1))
    straight.fit(batches(), steps_per_epoch=5, epochs=1, verbose=0)  # the five steps before the pause
    model = dense_model(4, 1, optimizer=ot.optim.Adam(lr=0.1))
    go, done = threading.Event(), threading.Event()
    got = {}

    def pause():
        go.set()
        assert done.wait(30)

    def other():
        go.wait(30)
        model.save(tmp_path / "mid.ortrain")
        got["copies"] = [copy.deepcopy(model), model.copy(), pickle.loads(pickle.dumps(model))]
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    model.fit(batches(pause), steps_per_epoch=10, epochs=1, verbose=0)
    worker.join()
    for m in [ot.load_model(tmp_path / "mid.ortrain"), *got["copies"]]:
        assert m.optimizer.step == m.train_state.step == 5
        for a, b in zip(m.get_weights(), straight.get_weights()):
            np.testing.assert_array_equal(a, b)
        for name, (m1, v1) in straight.train_state.moments.items():
            np.testing.assert_array_equal(m.train_state.moments[name][0], m1)
            np.testing.assert_array_equal(m.train_state.moments[name][1], v1)
    assert model.optimizer.step == 10


def test_a_one_shot_generator_shorter_than_steps_per_epoch_is_said(rng):
    # As Keras' "Your input ran out of data": 4 batches for steps_per_epoch=10 train 4 steps, with a
    # warning that says so (the fit took them silently before).
    def four():
        for _ in range(4):
            yield np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)

    model = dense_model(3, 1, optimizer="sgd")
    with pytest.warns(RuntimeWarning, match="epoch 0: the generator ran out of data after 4 of steps_per_epoch=10"):
        model.fit(four(), steps_per_epoch=10, epochs=1, verbose=0)
    assert model.optimizer.step == 4


def test_refusals_around_a_models_fit_change_nothing(rng, tmp_path):
    x, y = rng.random((32, 4)).astype(np.float32), np.zeros((32, 2), np.float32)

    def fitted():
        m = dense_model(4, 2, optimizer="adam")
        m.fit(x, y, batch_size=16, verbose=0, shuffle=False)
        return m

    # a fit_generator(loss=...) refused at its first batch leaves the optimizer the model's
    model = fitted()
    with pytest.raises(ot.ShapeError):
        ot.fit_generator(model, [(np.ones((16, 5), np.float32), y[:16])], loss="mae", verbose=0)
    assert model.optimizer.step == 2 and sorted(model.optimizer.state()["moments"]) == ["dense_0.bias",
                                                                                          "dense_0.kernel"]
    # train_state takes a trainer's state for this model, or None
    held = model.train_state
    other = dense_model(4, 3, optimizer="adam")
    other.fit(x, np.zeros((32, 3), np.float32), verbose=0)
    for value, says in ((42, "expected a trainer's export_state\\(\\)"),
                        (other.train_state, "it holds moments of 'dense_0.bias', which model .* has not with that shape")):
        with pytest.raises(ot.OrtrainError, match=f"train_state: {says}"):
            model.train_state = value
    assert model.train_state is held
    # a fit from a callback of a running fit, and train_state set then, are refused
    refused = []

    class Nested(ot.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            for act in (lambda: self.model.fit(x, y, batch_size=16, verbose=0),
                        lambda: setattr(self.model, "train_state", None)):
                with pytest.raises(ot.OrtrainError, match="fitting") as exc:
                    act()
                refused.append(str(exc.value)[:20])

    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[Nested()])
    assert len(refused) == 4 and model.optimizer.step == 6
    twin = fitted()
    twin.fit(x, y, batch_size=16, epochs=2, verbose=0)
    for a, b in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)
    # load_state takes real numbers only
    state = model.optimizer.state()
    state["moments"]["dense_0.bias"] = {"m": np.zeros(2, np.complex64), "v": np.zeros(2)}
    with pytest.raises(ot.OrtrainError, match="load_state: moment 'm' of 'dense_0.bias': expected a numeric array"):
        model.optimizer.load_state(state)
    assert model.optimizer.step == 6
    # a cache folder that is a file is refused when it is set
    (tmp_path / "afile").write_text("x")
    before = ot.artifacts.cache_dir()
    with pytest.raises(ot.OrtrainError, match="set_cache_dir\\(path=...\\): .* lies under the file"):
        ot.artifacts.set_cache_dir(tmp_path / "afile" / "sub")
    assert ot.artifacts.cache_dir() == before


def test_steps_per_epoch_with_arrays_goes_on_through_the_pass_as_keras_3_does():
    # Every epoch started a new pass: with shuffle=False the rows past steps_per_epoch * batch_size
    # were never trained.
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 4)).astype(np.float32), rng.standard_normal((40, 3)).astype(np.float32)
    model = mlp()
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    samples = []

    class Count(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            samples.append(self.loop.epoch_samples)

    with pytest.warns(RuntimeWarning, match="epoch 2: the pass over the arrays ended after 1 of steps_per_epoch=2 "
                                            r"batches \(40 rows make 5 batches of 8\); the next epoch starts a new pass"):
        hist = model.fit(x, y, batch_size=8, epochs=4, steps_per_epoch=2, shuffle=False, verbose=0,
                         callbacks=[Count()])
    assert samples == [16, 16, 8, 16]
    ws = [np.asarray(a, np.float64) for a in mlp().get_weights()]
    losses = []
    for epoch_batches in ([0, 1], [2, 3], [4], [0, 1]):
        total = 0.0
        for b in epoch_batches:
            xb, yb = x[8 * b:8 * b + 8], y[8 * b:8 * b + 8]
            loss, grads = mse_grads(ws, xb, yb)
            total += loss * len(xb)
            ws = sgd(ws, grads, 0.1)
        losses.append(total / (8 * len(epoch_batches)))
    assert_weights(model, ws)
    np.testing.assert_allclose(hist.history["loss"], losses, rtol=1e-5)
    # shuffled: the first pass still takes every row once, over three epochs
    samples.clear()
    with pytest.warns(RuntimeWarning, match="the pass over the arrays ended"):
        model.fit(x, y, batch_size=8, epochs=3, steps_per_epoch=2, verbose=0, callbacks=[Count()])
    assert samples == [16, 16, 8]


def test_a_generator_function_passed_uncalled_is_refused_with_the_fix():
    # each call returned a generator, refused at the first step as "received a generator" with no fix
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    before = model.get_weights()

    def batches():
        yield x, y

    says = r"'batches' is a generator function .*pass batches\(\) for one pass"
    for call in (lambda: ot.fit_generator(model, batches, verbose=0), lambda: model.fit(batches, verbose=0),
                 lambda: model.evaluate(batches)):
        with pytest.raises(ot.OrtrainError, match=says):
            call()
    assert_weights(model, before, rtol=0, atol=0)
    assert ot.fit_generator(model, batches(), verbose=0).epoch == [0]


def test_binary_accuracy_scores_soft_labels_and_multi_label_outputs_per_unit():
    # as documented: a label above 0.5 counts as 1 (Keras 3 would never match 0.7), and
    # accuracy with a binary cross-entropy over several units is per unit (tf.keras 2's choice)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((60, 3)).astype(np.float32)
    y = rng.random((60, 3)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(3, activation="sigmoid")], input_shape=(3,), seed=0)
    model.compile(optimizer="sgd", loss="binary_crossentropy",
                  metrics=["accuracy", "binary_accuracy", "categorical_accuracy"])
    p = model.predict(x)
    got = model.evaluate(x, y)
    want = np.mean((p > 0.5) == (y > 0.5))
    assert got["accuracy"] == got["binary_accuracy"] == pytest.approx(want)
    assert got["categorical_accuracy"] == pytest.approx(np.mean(p.argmax(-1) == y.argmax(-1)))


@pytest.mark.parametrize("second", ["fit", "fit_generator", "train_on_batch"])
def test_a_fit_from_another_thread_while_one_sets_up_is_refused_and_changes_nothing(second):
    # the running fit was marked only at its first step: a second thread's fit started during the
    # first's set-up passed the check, and the two interleaved their steps and counts
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 4), np.float32), rng.random((64, 2), np.float32)

    def fresh():
        m = ot.Sequential([ot.layers.Dense(8, activation="tanh"), ot.layers.Dense(2)], input_shape=(4,), seed=0)
        m.compile(optimizer="adam", loss="mse")
        return m

    model, started, go_on, errors = fresh(), threading.Event(), threading.Event(), []

    def slow_batches():  # the first fit holds the model while its generator is read for the first time
        started.set()
        go_on.wait(30)
        for i in range(0, 64, 8):
            yield x[i:i + 8], y[i:i + 8]

    first = threading.Thread(target=lambda: model.fit(slow_batches(), epochs=1, verbose=0))
    first.start()
    assert started.wait(30)
    calls = {"fit": lambda: model.fit(x, y, batch_size=8, verbose=0),
             "fit_generator": lambda: ot.fit_generator(model, [(x[:8], y[:8])], verbose=0),
             "train_on_batch": lambda: model.train_on_batch(x[:8], y[:8])}

    def other():
        try:
            calls[second]()
        except ot.OrtrainError as exc:
            errors.append(str(exc))
    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    t = threading.Thread(target=other)  # a refused call leaves the running fit's hold in place
    t.start()
    t.join(30)
    go_on.set()
    first.join(60)
    assert len(errors) == 2 and all("fitting already (in another thread)" in e for e in errors)
    twin = fresh()
    twin.fit((b for b in [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]), epochs=1, verbose=0)
    assert model.optimizer.step == twin.optimizer.step == 8
    for a, b in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.fit(x, y, batch_size=8, verbose=0)  # the model is free again
    assert model.optimizer.step == 16


def test_a_validation_source_that_cannot_validate_stops_the_fit_before_it_trains():
    # a dataset of single samples, or a generator of x alone, as validation_data was refused only
    # after a whole epoch had trained
    class Samples:  # indexed one sample at a time, as a torch Dataset is
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    rng = np.random.default_rng(0)
    x, y = rng.random((16, 4), np.float32), rng.random((16, 3), np.float32)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    before = model.get_weights()
    for source, says in ((Samples(x, y), r"validation after epoch 0, step 0 .*received \(4,\); it is one sample "
                                         r"without the batch axis: .*DataLoader"),
                         ((b for b in [x[:4]]), r"validation after epoch 0, step 0 .*expected \(x, y\)")):
        with pytest.raises(ot.OrtrainError, match=says):
            model.fit(x, y, validation_data=source, epochs=1, verbose=0)
    with pytest.raises(ot.OrtrainError, match=r"epoch 0, step 0 .*it is one sample without the batch axis"):
        model.fit(Samples(x, y), verbose=0)
    assert model.optimizer.step == 0
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_fit_generator_given_arrays_as_a_tuple_names_the_fix():
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((16, 4), np.float32), np.zeros((16, 3), np.float32)
    with pytest.raises(ot.OrtrainError, match=r"received a tuple of arrays of 16 rows \(x, y\); for arrays call "
                                              r"model.fit\(x, y, batch_size=...\), or pass \[\(x, y\)\]"):
        ot.fit_generator(model, (x, y), verbose=0)
    assert model.optimizer.step == 0


def test_labels_and_weights_in_keras_per_output_forms_are_taken_for_the_one_output():
    # fit(x, [y]) was refused as a (1, 8, 2) array, fit(x, {"output": y}) as "dtype object"
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 4)).astype(np.float32), rng.random((8, 2)).astype(np.float32)
    w = rng.random(8).astype(np.float32)

    def trained(labels, weights):
        m = _dense_4_2()
        m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        m.fit(x, labels, sample_weight=weights, batch_size=8, verbose=0)
        return m

    name = trained(y, w).output_specs[0].name
    want = trained(y, w).get_weights()
    for labels, weights in (([y], [w]), ({name: y}, {name: w}), ((y,), w)):
        for got, expected in zip(trained(labels, weights).get_weights(), want):
            np.testing.assert_array_equal(got, expected)
    m = trained(y, w)
    before = m.get_weights()
    with pytest.raises(ot.OrtrainError, match=rf"y: received a dict with keys \['out'\]; ortrain trains the model's "
                                              rf"first output \('{name}'\) and takes its y alone: give y=array"):
        m.fit(x, {"out": y}, verbose=0)
    for got, expected in zip(m.get_weights(), before):
        np.testing.assert_array_equal(got, expected)


def test_freezing_from_a_callback_says_it_counts_from_the_next_fit():
    # accepted and ignored for the rest of the fit, without a word
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(3, name="base"), ot.layers.Dense(2, name="head")], input_shape=(4,),
                          seed=0)
    model.freeze("base")
    model.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
    frozen = model.get_weights()[:2]

    class Unfreeze(ot.callbacks.Callback):
        def __init__(self, how):
            super().__init__()
            self.how = how

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and self.how == "unfreeze":
                self.model.unfreeze("base")
            elif epoch == 0:
                self.model.get_layer("base").trainable = True  # (the model's freeze holds it still)
                self.model.get_layer("head").trainable = False

    for how in ("unfreeze", "layer.trainable"):
        with pytest.warns(UserWarning, match=r"the weights that train changed during this fit \(layer.trainable, "
                                             r"freeze, unfreeze, freeze_bn_stats or unfreeze_bn_stats\): the running "
                                             r"fit's graphs fix which weights train, so the change takes effect from "
                                             r"the next fit") as caught:
            model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[Unfreeze(how)])
        assert sum("weights that train changed" in str(w.message) for w in caught) == 1
        if how == "unfreeze":
            for got, want in zip(model.get_weights()[:2], frozen):
                np.testing.assert_array_equal(got, want)
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
            assert not np.array_equal(model.get_weights()[0], frozen[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)  # nothing changed: nothing said


def test_batch_norm_statistics_frozen_during_a_fit_are_said_to_count_from_the_next():
    # freeze_bn_stats() in a callback took effect from the next fit, as freeze does, but without the word
    # freeze gives
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(3), ot.layers.BatchNorm(), ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
    freeze = ot.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: e == 0 and model.freeze_bn_stats())
    with pytest.warns(UserWarning, match=r"freeze_bn_stats or unfreeze_bn_stats\): the running fit's graphs") as caught:
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[freeze])
    assert sum("weights that train changed" in str(w.message) for w in caught) == 1
    stats = [w for n, w in zip(model.weight_names(), model.get_weights()) if "running" in n]
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = [w for n, w in zip(model.weight_names(), model.get_weights()) if "running" in n]
    assert len(stats) == 2 and all(np.array_equal(a, b) for a, b in zip(stats, after))


def test_what_a_new_model_trains_at_does_not_depend_on_when_the_collector_runs():
    # the optimizer took the rate a collected model's schedule ended at, so a model compiled with it
    # next trained at 0.005 or 0.01 depending on whether gc had run
    import copy
    import gc
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    rates = []
    for collect in (False, True):
        opt = ot.optim.Adam(lr=0.01)
        a = _dense_4_2()
        a.compile(optimizer=opt, loss="mse")
        a.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[ot.callbacks.StepDecay(0.5, 1)])
        assert opt.lr == 0.005
        a.me = a  # freed only by the cycle collector
        del a
        if collect:
            gc.collect()
            assert opt.lr == 0.005 and opt.state()["lr"] == 0.005  # what the model showed, shown on
        b = _dense_4_2()
        b.compile(optimizer=opt, loss="mse")
        rates.append(b.fit(x, y, batch_size=8, epochs=1, verbose=0).history["lr"])
    assert rates == [[0.01], [0.01]]
    # a shallow copy gets a copy of the optimizer: sharing the object, the two models took it from each
    # other, and a load_state reached the wrong one (or none, once that one was collected)
    for dropped in ("copy", "original"):
        m = _dense_4_2()
        m.compile(optimizer="adam", loss="mse")
        m.fit(x, y, batch_size=8, verbose=0)
        shallow = copy.copy(m)
        assert shallow.optimizer is not m.optimizer and shallow.optimizer.step == m.optimizer.step == 2
        kept = m if dropped == "copy" else shallow
        del shallow, m
        gc.collect()
        kept.optimizer.load_state({**kept.optimizer.state(), "step": 100})
        kept.fit(x, y, batch_size=8, verbose=0)
        assert kept.optimizer.step == 102
    # of models pickled together sharing one optimizer, the copy of the one it showed shows it
    import pickle
    shared = ot.optim.Adam(lr=0.01)
    first, last = (_dense_4_2() for _ in range(2))
    for m, epochs in ((first, 1), (last, 2)):
        m.compile(optimizer=shared, loss="mse")
        m.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
    for order in ((first, last), (last, first)):
        copies = pickle.loads(pickle.dumps(list(order)))
        shown = copies[order.index(last)]
        assert copies[0].optimizer is copies[1].optimizer
        assert shown.optimizer._compiled_model() is shown and shown.optimizer.step == 4


def test_an_optimizer_compiled_away_keeps_its_state_and_a_compile_back_continues_it(rng):
    # compile(optimizer=SGD) wiped the Adam object's step and moments, so compiling back on it (as a
    # Keras user does) restarted Adam from zero; its shown rate fell back from the schedule's too
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    decay = [ot.callbacks.StepDecay(0.5, 1)]

    def fitted():
        m, adam = _dense_4_2(), ot.optim.Adam(lr=0.01)
        m.compile(optimizer=adam, loss="mse")
        m.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=decay)
        return m, adam

    straight, _ = fitted()
    m, adam = fitted()
    shown = adam.state()
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    assert m.optimizer.step == 0
    kept = adam.state()
    assert (kept["step"], kept["lr"], adam.lr) == (4, 0.005, 0.005)
    for name, ms in shown["moments"].items():
        for k in ("m", "v"):
            np.testing.assert_array_equal(kept["moments"][name][k], ms[k])
    m.compile(optimizer=adam, loss="mse")
    assert m.optimizer.step == 4 and m.optimizer.lr == 0.005
    m.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    straight.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert m.optimizer.step == straight.optimizer.step == 6
    for a, b in zip(m.get_weights(), straight.get_weights()):
        np.testing.assert_array_equal(a, b)
    # another model compiled with it starts afresh, as the documented rule says
    other = _dense_4_2()
    m.compile(optimizer="adam", loss="mse")
    other.compile(optimizer=adam, loss="mse")
    assert other.optimizer.step == 0 and other.train_state is None


def test_a_state_loaded_into_an_optimizer_before_its_compile_is_the_models(rng):
    # opt.load_state(state) then model.compile(optimizer=opt): the model started from zero
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    a = _dense_4_2()
    a.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    a.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    b = _dense_4_2()
    b.set_weights(a.get_weights())
    opt = ot.optim.Adam()
    opt.load_state(a.optimizer.state())
    b.compile(optimizer=opt, loss="mse")
    assert b.optimizer.step == 2
    a.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    b.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for p, q in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(p, q)
    wider = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    opt = ot.optim.Adam()
    opt.load_state(a.optimizer.state())
    with pytest.warns(UserWarning, match=r"compile: the optimizer keeps the state of other weights \(step 4, "
                                         r"moments of 'dense_0.bias', 'dense_0.kernel'\).*it starts afresh"):
        wider.compile(optimizer=opt, loss="mse")
    assert wider.optimizer.step == 0


def test_fit_generator_with_the_models_own_optimizer_keeps_its_state_as_compile_does():
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    batches = [(x[:8], y[:8]), (x[8:], y[8:])]
    runs = []
    for override in (False, True):
        m = _dense_4_2()
        m.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
        ot.fit_generator(m, batches, epochs=1, verbose=0)
        ot.fit_generator(m, batches, epochs=1, verbose=0, **({"optimizer": m.optimizer} if override else {}))
        assert m.optimizer.step == 4
        runs.append(m.get_weights())
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_per_output_label_forms_reach_generators_and_trainers_too():
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 4)).astype(np.float32), rng.random((8, 2)).astype(np.float32)

    def model():
        m = _dense_4_2()
        m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        return m

    name = model().output_specs[0].name
    plain, forms = model(), model()
    ot.fit_generator(plain, [(x, y), (x, y)], verbose=0)
    ot.fit_generator(forms, [(x, [y]), (x, {name: y})], verbose=0)
    for a, b in zip(forms.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    with ot.Trainer(model(), batch_size=8) as tr:
        before = tr.eval(x, y)
        np.testing.assert_allclose(tr.step(x, [y]), before, rtol=1e-6)  # the loss before the update
        np.testing.assert_allclose(tr.eval(x, {name: y}), tr.eval(x, y), rtol=0)
        assert tr.eval(x, y) < before
    one = model()  # one sample whose labels are given as a list of its row: that row, as before
    np.testing.assert_allclose(one.evaluate(x[:1], [y[0]])["loss"], one.evaluate(x[:1], y[:1])["loss"], rtol=0)
    seq = ot.Sequential([ot.layers.Reshape((1, 4)), ot.layers.Dense(3)], input_shape=(4,), seed=0)
    seq.compile(optimizer="sgd", loss="mse")  # an output (batch, 1, 3): [label of one sample] is that sample
    with ot.Trainer(seq, batch_size=1) as tr:
        np.testing.assert_allclose(tr.eval(x[:1], [np.zeros((1, 3))]), tr.eval(x[:1], np.zeros((1, 1, 3))), rtol=0)
    with pytest.raises(ot.ShapeError, match="one row per row of x"):  # rows that disagree, named as such
        model().fit(x[:3], [y[:5]], verbose=0)


def test_a_batch_whose_x_and_y_rows_disagree_is_refused_as_such():
    # "y: expected shape (10, 2), received (8, 2); every batch must hold exactly 10 rows (pad the last
    # one or drop it)": the batch's x and y disagree, which padding does not mend
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(10, 4)).astype(np.float32), rng.normal(size=(10, 2)).astype(np.float32)
    for batches, where, (want, got) in (([(x, y[:8])], "epoch 0, step 0", (10, 8)),
                                        ([(x, y), (x[:8], y[:6])], "epoch 0, step 1", (8, 6)),
                                        ([(x, y), (x[:8], y)], "epoch 0, step 1", (8, 10))):
        model = _dense_4_2()
        model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        with pytest.raises(ot.ShapeError) as info:
            ot.fit_generator(model, batches, verbose=0)
        assert str(info.value) == (f"{where} (counted from 0): y: expected shape ({want}, 2), received ({got}, 2); "
                                   "give one row per row of x")
    with ot.Trainer(model, batch_size=10) as tr, pytest.raises(ot.ShapeError, match=r"^y: expected shape \(10, 2\), "
                                                                               r"received \(8, 2\); give one row per "
                                                                               r"row of x$"):
        tr.step(x, y[:8])


def test_keras_positional_order_is_refused_naming_the_argument_it_reached():
    # Keras' evaluate(x, y, batch_size, verbose) and fit's tenth argument (class_weight) land on
    # sample_weight here: the refusals spoke of a sample_weight shape or of a model's outputs
    x, y = np.ones((8, 4), np.float32), np.zeros(8, np.int64)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    for verbose in (0, "auto"):
        with pytest.raises(ot.OrtrainError, match=rf"evaluate: sample_weight expected one weight per sample, received "
                                                  rf"{verbose!r}; the arguments after batch_size are sample_weight, "
                                                  r"then verbose \(Keras' are verbose, then sample_weight\)"):
            model.evaluate(x, y, 4, verbose)
    with pytest.raises(ot.OrtrainError, match=r"fit: sample_weight expected one weight per sample, received a dict "
                                              r"of numbers: class weights \(\{class index: weight\}\) go in "
                                              r"class_weight=, by keyword"):
        model.fit(x, y, 4, 1, 0, None, 0.0, None, True, {0: 1.0})
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert model.optimizer.step == 0
    # by keyword both work, and weigh as numpy says: class 0's weight 2 doubles each row's loss
    logits = x @ before[0] + before[1]
    nll = np.log(np.exp(logits).sum(1)) - logits[:, 0]
    assert model.evaluate(x, y, 4, verbose=0, sample_weight=np.full(8, 2.0))["loss"] == \
        pytest.approx(2 * nll.mean(), rel=1e-6)
    hist = model.fit(x, y, 8, 1, 0, class_weight={0: 2.0}, shuffle=False)
    assert hist.history["loss"][0] == pytest.approx(2 * nll.mean(), rel=1e-6)


def test_set_weights_from_one_thread_reads_all_old_or_all_new_in_another(rng):
    # set_weights stored layer after layer: a predict or get_weights in another thread saw some
    # layers old and some new (a fifth of 40,000 predictions equalled neither weight set)
    import time
    x = rng.random((8, 16)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(16, activation="tanh") for _ in range(12)], input_shape=(16,), seed=1)
    sets = [[(rng.standard_normal(a.shape) * 0.3).astype(np.float32) for a in model.get_weights()] for _ in range(2)]
    wants = []
    for weights in sets:
        model.set_weights(weights)
        wants.append(model.predict(x))
    stop, torn, reads = [], [], [0]

    def setter():
        k = 0
        while not stop:
            model.set_weights(sets[k % 2])
            model.layers[3].set_weights(sets[k % 2][6:8])
            k += 1

    def reader():
        while not stop:
            p, w = model.predict(x), model.get_weights()
            reads[0] += 1
            if not any(np.array_equal(p, want) for want in wants):
                torn.append("predict")
            if not any(all(np.array_equal(a, b) for a, b in zip(w, s)) for s in sets):
                torn.append("get_weights")
    threads = [threading.Thread(target=setter), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.append(True)
    for t in threads:
        t.join()
    assert reads[0] > 50 and not torn, (reads[0], torn[:5])


def test_a_fit_of_a_model_sharing_a_trained_layer_with_a_fit_in_another_thread_is_refused(rng):
    # Both fits ran, each training its own copy of the shared layer; the one ending last wrote its
    # weights over the other's (model A's training of the layer was lost without a word)
    inp = ot.Input((4,))
    shared = ot.layers.Dense(4, activation="tanh", name="shared")
    a = ot.Model(inp, ot.layers.Dense(1, name="head_a")(shared(inp)), name="A")
    b = ot.Model(inp, ot.layers.Dense(1, name="head_b")(shared(inp)), name="B")
    for m in (a, b):
        m.compile(optimizer="adam", loss="mse")
    x = rng.random((16, 4)).astype(np.float32)
    y = x[:, :1].copy()
    started, go = threading.Event(), threading.Event()

    class Hold(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            started.set()
            go.wait(60)

    t = threading.Thread(target=lambda: a.fit(x, y, epochs=1, verbose=0, callbacks=[Hold()]))
    t.start()
    try:
        assert started.wait(60)
        before = b.get_weights()
        with pytest.raises(ot.OrtrainError, match=r"^fit: layer 'shared' trains in a fit of model 'A' running in "
                                                  r"another thread, which shares it; .* model.copy\(\)"):
            b.fit(x, y, epochs=1, verbose=0)
        for got, want in zip(b.get_weights(), before):
            np.testing.assert_array_equal(got, want)
        assert b.optimizer.step == 0
        b.freeze([shared])  # frozen in B, the layer is A's alone to train
        b.fit(x, y, epochs=1, verbose=0)
        b.unfreeze([shared])
    finally:
        go.set()
        t.join()
    b.fit(x, y, epochs=1, verbose=0)  # after A's fit ended


def test_a_fit_refused_before_it_trains_hands_the_batches_it_read_back_to_the_generator(tmp_path):
    # the refused fit read the first batch (its rows set the batch size), and the next fit's first
    # epoch silently began at the second: 3 steps of a 4-batch pass
    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 2)).astype(np.float32))
            for _ in range(4)]

    def model():
        m = _dense_4_2()
        m.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
        return m

    reference = model()
    ref_hist = ot.fit_generator(reference, data, epochs=1, validation_generator=data[:2], verbose=0)

    class Stream:  # a finite callable that starts its next pass after returning None
        def __init__(self):
            self.i = 0

        def next_batch(self):
            if self.i == len(data):
                self.i = 0
                return None
            self.i += 1
            return data[self.i - 1]

    counter = Stream()
    refusals = ({"nbatch_logical": 24},  # checked against the first batch's 16 rows
                {"callbacks": [ot.callbacks.ModelCheckpoint(tmp_path / "ck-{val_loss:.2f}")]},  # no validation
                {"callbacks": [ot.callbacks.CSVLogger(tmp_path / "no" / "log.csv")]})
    for make in (lambda: Stream().next_batch, lambda: counter.next_batch, lambda: iter(list(data)),
                 lambda: (b for b in data)):
        gen = make()  # a bound method (made anew at each access), iter(list) (no weak reference), a generator
        m = model()
        for bad in refusals:
            with pytest.raises(ot.OrtrainError):
                ot.fit_generator(m, gen, epochs=1, verbose=0, **bad)
        assert m.optimizer.step == 0
        hist = ot.fit_generator(m, gen, epochs=1, verbose=0, steps_per_epoch=4)
        assert m.optimizer.step == 4 and hist.history["loss"] == pytest.approx(ref_hist.history["loss"], rel=1e-6)
        for a, b in zip(m.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # the validation generator's first batch, read to learn whether it carries weights, goes back too
    m, val = model(), iter(list(data[:2]))
    with pytest.raises(ot.OrtrainError, match="nbatch_logical"):
        ot.fit_generator(m, data, epochs=1, validation_generator=val, nbatch_logical=24, verbose=0)
    with pytest.raises(ot.OrtrainError, match="CSVLogger"):
        m.fit(data[0][0], data[0][1], validation_data=val, verbose=0,
              callbacks=[ot.callbacks.CSVLogger(tmp_path / "no" / "log.csv")])
    hist = ot.fit_generator(m, data, epochs=1, validation_generator=val, verbose=0)
    assert hist.history["val_loss"] == pytest.approx(ref_hist.history["val_loss"], rel=1e-6)
    # refusals before the generator is read, or a fit of no epochs, leave a batch handed back where it is
    gen = iter(list(data))
    with pytest.raises(ot.OrtrainError, match="nbatch_logical"):
        ot.fit_generator(model(), gen, epochs=1, nbatch_logical=24, verbose=0)
    with pytest.raises(ot.OrtrainError, match="verbose"):
        ot.fit_generator(model(), gen, epochs=1, verbose=7)
    with pytest.raises(ot.OrtrainError, match="callbacks"):
        ot.fit_generator(model(), gen, epochs=1, verbose=0, callbacks=[object()])
    assert not ot.fit_generator(model(), gen, epochs=1, initial_epoch=1, verbose=0).history
    m = model()
    ot.fit_generator(m, gen, epochs=1, verbose=0, steps_per_epoch=4)
    assert all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(m.get_weights(), reference.get_weights()))
    # one iterator for training and validation: its batches come back in the order they were read
    def shared_fit(make, it, **kwargs):
        m = model()
        hist = ot.fit_generator(m, make(it), epochs=1, steps_per_epoch=2, validation_generator=make(it),
                                validation_steps=1, verbose=0, **kwargs)
        return m.get_weights(), hist.history["val_loss"]

    untouched = shared_fit(lambda it: it, iter(list(data)))
    for make in (lambda it: it, lambda it: it.__next__):  # it.__next__: made anew at each access, as a method
        it = iter(list(data))
        with pytest.raises(ot.OrtrainError, match="nbatch_logical"):
            shared_fit(make, it, nbatch_logical=24)
        weights, val_loss = shared_fit(make, it)
        assert val_loss == untouched[1] and all(np.array_equal(a, b) for a, b in zip(weights, untouched[0]))
    # an iterator held for its batch is let go once the caller drops it
    import gc
    import weakref

    from ortrain import data as data_module
    data_module._HANDED.clear()  # what other tests' refused fits handed back
    for _ in range(3):
        held = iter([(np.zeros((16, 4), np.float32), np.zeros((16, 2), np.float32))] * 2)
        with pytest.raises(ot.OrtrainError, match="nbatch_logical"):
            ot.fit_generator(model(), held, epochs=1, nbatch_logical=24, verbose=0)
        del held
    assert len(data_module._HANDED) == 1  # the last one, until the next hand-back looks (the others went so)
    callable_stream = Stream()
    alive = weakref.ref(callable_stream)
    with pytest.raises(ot.OrtrainError, match="nbatch_logical"):
        ot.fit_generator(model(), callable_stream.next_batch, epochs=1, nbatch_logical=24, verbose=0)
    assert len(data_module._HANDED) == 1  # the stream's: the iterator was let go
    del callable_stream
    gc.collect()
    assert alive() is None and len(data_module._HANDED) == 0  # a weakly held object: its batches go with it
    # objects no weak reference can follow, kept alive by a reference cycle once dropped: at most
    # MAX_HELD are held, the oldest let go first
    class Loader:
        __slots__ = ("batches", "owner")

        def __iter__(self):
            return self

        def __next__(self):
            return self.batches.pop(0)

    for _ in range(data_module.MAX_HELD + 4):
        loader = Loader()
        loader.batches, loader.owner = list(data), loader  # a cycle: its count never drops to the registry's
        with pytest.raises(ot.OrtrainError, match="nbatch_logical"):
            ot.fit_generator(model(), loader, epochs=1, nbatch_logical=24, verbose=0)
        del loader
    assert len(data_module._HANDED) == data_module.MAX_HELD
    data_module._HANDED.clear()
    # a fit that ran keeps what it read, whatever ends it after (Ctrl-C as its trainer is freed)
    from ortrain._lifetime import Releasable
    stream, release = Stream(), Releasable.__exit__

    def interrupted_release(self, *exc):
        release(self, *exc)
        raise KeyboardInterrupt

    m = model()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Releasable, "__exit__", interrupted_release)
        with pytest.raises(KeyboardInterrupt):
            ot.fit_generator(m, stream.next_batch, epochs=1, steps_per_epoch=1, verbose=0)
    assert m.optimizer.step == 1 and not data_module._HANDED
    ot.fit_generator(m, stream.next_batch, epochs=1, verbose=0)
    assert m.optimizer.step == 4  # batches 1 to 3
    # a fit that trained keeps what it read: an error after its first step hands nothing back
    stream = Stream()

    def stop_after_one(step, logs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ot.fit_generator(model(), stream.next_batch, verbose=0,
                         callbacks=[ot.callbacks.LambdaCallback(on_batch_end=stop_after_one)])
    m = model()
    ot.fit_generator(m, stream.next_batch, verbose=0)
    assert m.optimizer.step == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_fits_refuses_saves_and_fits_without_hanging(tmp_path):
    # The fit's thread held the loop's turn at the fork, and does not exist in the child: a save or
    # pickle of the model there waited for it forever (13 of 15 children). They are refused now,
    # saying why, as a fit is; predict and get_weights give the weights the model held last.
    told = tmp_path / "told.txt"
    setup = f"""
        import pickle, numpy as np, ortrain as ot
        x, y = np.ones((32, 3), np.float32), np.zeros((32, 2), np.float32)
        m = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(2)], input_shape=(3,), seed=0)
        m.compile(optimizer="adam", loss="mse")
        def child():
            said = []
            for call in (lambda: m.save({str(tmp_path / "m")!r}), lambda: pickle.dumps(m),
                         lambda: m.fit(x, y, batch_size=32, epochs=1, verbose=0)):
                try:
                    call()
                    said.append("ran")
                except ot.OrtrainError as exc:
                    said.append("forked while another thread of its parent was" in str(exc))
            said.append(m.predict(x).shape == (32, 2) and len(m.get_weights()) == 4)
            with open({str(told)!r}, "a") as f:
                f.write(repr(said) + "\\n")
        """
    busy = "m.fit(x, y, batch_size=32, epochs=200, verbose=0)"
    assert forks_that_hang(tmp_path, setup, busy=busy, in_child="child()", forks=8) == "hung 0"
    lines = told.read_text().splitlines()
    assert len(lines) == 8
    # (a fork between two steps finds the session idle: the child saves the model; between two fits,
    # the child fits it as its own)
    said = [ast.literal_eval(line) for line in lines]
    assert all(s == "ran" or s is True for line in said for s in line), lines
    assert any(line[2] is True for line in said), lines   # a fit refused for the fit it was forked in
