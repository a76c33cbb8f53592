"""train_on_batch keeps its trainer open between calls (ortrain._kept_trainer): every call must
train exactly as a call that builds its trainer afresh does (the reference below, which is what
train_on_batch did before it kept one), whatever happens to the model between the calls."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import numpy as np
import pytest
from helpers import NumpyAdam

import ortrain as ot
from ortrain.fit import fit_model
from ortrain.nn.saving import TrainState


def _model(seed=0, optimizer=None):
    model = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dropout(0.3, seed=3),
                           ot.layers.BatchNorm(), ot.layers.Dense(3)], input_shape=(4,), seed=seed)
    model.compile(optimizer=optimizer or ot.optim.Adam(lr=0.01),
                  loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def _batches(n, rows=16, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, 4)).astype(np.float32), rng.integers(0, 3, rows)) for _ in range(n)]


def _fresh_step(model, x, y, sample_weight=None):
    """One train_on_batch as a fit that builds its trainer and frees it (no trainer kept)."""
    hist = fit_model(model, x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False,
                     sample_weight=sample_weight, keep_trainer=False)
    return [hist.history["loss"][0], hist.history["accuracy"][0]]


def _same_state(kept, fresh):
    for a, b in zip(kept.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
    s, t = kept.optimizer.state(), fresh.optimizer.state()
    assert (s["step"], s["lr"]) == (t["step"], t["lr"])
    assert sorted(s["moments"]) == sorted(t["moments"])
    for name, ms in s["moments"].items():
        assert sorted(ms) == sorted(t["moments"][name])
        for key, a in ms.items():
            np.testing.assert_array_equal(a, t["moments"][name][key])
    ks, fs = kept.train_state, fresh.train_state
    assert (ks.n_steps, ks.draws) == (fs.n_steps, fs.draws)


def test_kept_trainer_steps_as_a_fresh_one_and_adam_in_numpy():
    kept, fresh = _model(), _model()
    batches = _batches(5)
    trainers = set()
    for x, y in batches:
        assert kept.train_on_batch(x, y) == _fresh_step(fresh, x, y)
        trainers.add(id(kept._kept.trainer))
    assert len(trainers) == 1  # one trainer, kept across the calls
    assert kept.__dict__["_train_state"].pending  # the moments are still in its session...
    _same_state(kept, fresh)  # ...until read, equal to a fresh trainer's
    # and to Adam written out in numpy, on a model without dropout and batch norm
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
    w, b = model.get_weights()
    ref = NumpyAdam([w, b], lr=0.05)
    rng = np.random.default_rng(1)
    for _ in range(4):
        x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
        loss = model.train_on_batch(x, y)
        d = x.astype(np.float64) @ ref.p[0] + ref.p[1] - y
        assert loss == pytest.approx(np.mean(d * d), rel=1e-5)
        ref.step([2 * x.T.astype(np.float64) @ d / d.size, 2 * d.sum(0) / d.size])
    np.testing.assert_allclose(model.get_weights()[0], ref.p[0], rtol=1e-5, atol=1e-6)
    moments = model.optimizer.state()["moments"][model.weight_names()[0]]
    m, v = moments["m"], moments["v"]
    np.testing.assert_allclose(m, ref.m[0], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(v, ref.v[0], rtol=1e-4, atol=1e-9)


def _set_weights(m, x, y):
    ws = m.get_weights()
    m.set_weights([w * 0.5 for w in ws])


def _set_layer_weights(m, x, y):
    layer = m.layers[0]
    layer.set_weights([w + 0.1 for w in layer.get_weights()])


def _write_lr(m, x, y):
    m.optimizer.lr = 0.003


def _load_state(m, x, y):
    state = m.optimizer.state()
    state["moments"] = {n: {k: a * 0.5 for k, a in ms.items()} for n, ms in state["moments"].items()}
    m.optimizer.load_state(state)


def _recompile_same_optimizer(m, x, y):
    m.compile(optimizer=m.optimizer, loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


def _recompile_new_optimizer(m, x, y):
    m.compile(optimizer=ot.optim.SGD(lr=0.05), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


def _freeze(m, x, y):
    m.freeze([m.layers[0]])


def _layer_untrainable(m, x, y):
    m.layers[3].trainable = False


def _fit(m, x, y):
    m.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)


def _weighted(m, x, y):
    return {"sample_weight": np.linspace(0.5, 1.5, len(x))}


def _smaller_batch(m, x, y):
    return {"rows": 8}


def _threads(m, x, y):
    before = ot.get_num_threads()
    ot.set_num_threads(1)
    return {"restore_threads": before}


def _save_and_load(m, x, y):
    return {"reload": True}


def _reset_state(m, x, y):
    m.train_state = None


def _freeze_bn_stats(m, x, y):
    m.freeze_bn_stats()


def _pop_and_add(m, x, y):
    opt = m.optimizer
    m.pop()
    m.add(ot.layers.Dense(3))
    m.compile(optimizer=opt, loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


def _dropout_rate(m, x, y):
    m.layers[1].rate = 0.8


def _activation(m, x, y):
    m.layers[0].activation = "tanh"


def _batch_norm_momentum(m, x, y):
    m.layers[2].momentum = 0.5


def _read_state(m, x, y):
    m.optimizer.state()  # reading the moments keeps the trainer


def _predict_and_evaluate(m, x, y):
    m.predict(x)
    m.evaluate(x, y)


@pytest.mark.parametrize("between", [_set_weights, _set_layer_weights, _write_lr, _load_state,
                                     _recompile_same_optimizer, _recompile_new_optimizer, _freeze, _layer_untrainable, _fit, _weighted,
                                     _smaller_batch, _threads, _save_and_load, _reset_state, _freeze_bn_stats,
                                     _pop_and_add, _dropout_rate, _activation, _batch_norm_momentum, _read_state,
                                     _predict_and_evaluate],
                         ids=lambda f: f.__name__.strip("_"))
def test_what_happens_between_calls_reaches_the_next_as_with_a_fresh_trainer(between, tmp_path):
    kept, fresh = _model(), _model()
    batches = _batches(4)
    for x, y in batches[:2]:
        assert kept.train_on_batch(x, y) == _fresh_step(fresh, x, y)
    trainer = kept._kept.trainer
    x, y = batches[2]
    told = {}
    try:
        for m in (kept, fresh):
            told = between(m, x, y) or {}
        if told.get("reload"):
            kept.save(tmp_path / "kept.ortrain")
            fresh.save(tmp_path / "fresh.ortrain")
            kept, fresh = ot.load_model(tmp_path / "kept.ortrain"), ot.load_model(tmp_path / "fresh.ortrain")
        rows = told.get("rows", len(x))
        w = told.get("sample_weight")
        for x, y in batches[2:]:
            x, y = x[:rows], y[:rows]
            got = kept.train_on_batch(x, y, sample_weight=w)
            assert got == _fresh_step(fresh, x, y, sample_weight=w)
    finally:
        if "restore_threads" in told:
            ot.set_num_threads(told["restore_threads"])
    _same_state(kept, fresh)
    reused = kept._kept is not None and kept._kept.trainer is trainer
    assert reused == (between in (_set_weights, _set_layer_weights, _write_lr, _read_state, _predict_and_evaluate))


def test_two_models_sharing_layers_keep_their_trainers_and_train_as_fresh_ones():
    """A GAN's loop: two models over one shared layer, stepped in turns. Each call writes the shared
    layer's weights into the other model's kept trainer instead of building a new one."""
    def pair():
        shared = ot.layers.Dense(8, activation="tanh", name="shared")
        inp_a, inp_b = ot.Input((4,)), ot.Input((4,))
        a = ot.Model(inp_a, ot.layers.Dense(3, name="head_a")(shared(inp_a)))
        b = ot.Model(inp_b, ot.layers.Dense(1, name="head_b")(shared(inp_b)))
        a.compile(optimizer=ot.optim.Adam(lr=0.02), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
        b.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
        return a, b

    ot.set_seed(7)
    a, b = pair()
    ot.set_seed(7)
    ra, rb = pair()
    for a_w, r_w in zip(a.get_weights() + b.get_weights(), ra.get_weights() + rb.get_weights()):
        np.testing.assert_array_equal(a_w, r_w)
    rng = np.random.default_rng(2)
    trainers = set()
    for _ in range(4):
        x, y = rng.standard_normal((16, 4)).astype(np.float32), rng.integers(0, 3, 16)
        assert a.train_on_batch(x, y) == fit_model(ra, x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
                                                   keep_trainer=False).history["loss"][0]
        z = rng.standard_normal((16, 1)).astype(np.float32)
        assert b.train_on_batch(x, z) == fit_model(rb, x, z, batch_size=16, epochs=1, verbose=0, shuffle=False,
                                                   keep_trainer=False).history["loss"][0]
        trainers |= {id(a._kept.trainer), id(b._kept.trainer)}
    assert len(trainers) == 2  # each model's trainer was kept through the other's calls
    for a_w, r_w in zip(a.get_weights() + b.get_weights(), ra.get_weights() + rb.get_weights()):
        np.testing.assert_array_equal(a_w, r_w)
    _same_state(a, ra)
    _same_state(b, rb)


def test_copies_pickles_trainers_and_fits_take_the_moments_left_in_the_session():
    kept, fresh = _model(), _model()
    (x, y), (x2, y2) = _batches(2)
    kept.train_on_batch(x, y)
    _fresh_step(fresh, x, y)
    for copied in (copy.deepcopy(kept), pickle.loads(pickle.dumps(kept)), copy.copy(kept)):
        assert copied._kept is None and type(copied.train_state) is TrainState
        _same_state(copied, fresh)
    tr, ref = ot.Trainer(kept, batch_size=16), ot.Trainer(fresh, batch_size=16)
    with tr, ref:
        assert tr.step(x2, y2) == ref.step(x2, y2)
        np.testing.assert_array_equal(tr.get_weights()[0], ref.get_weights()[0])
    kept.fit(x2, y2, batch_size=16, epochs=1, verbose=0, shuffle=False)
    fresh.fit(x2, y2, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert kept._kept is None  # a fit frees the kept trainer
    _same_state(kept, fresh)


def test_the_kept_trainer_is_freed_with_its_model_and_by_a_refused_call():
    model = _model()
    x, y = _batches(1)[0]
    model.train_on_batch(x, y)
    trainer = weakref.ref(model._kept.trainer)
    # bad input is refused before the kept trainer is touched: it stays, and so does the state
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ot.ShapeError):
        model.train_on_batch(x[:, :3], y)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ot.OrtrainError, match="holds nan"):
        model.train_on_batch(bad, y)
    assert model._kept is not None and model._kept.trainer is trainer()
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert model.train_state.n_steps == 1
    gc.disable()  # freed with the model, not when the collector comes round (the loop of the call is a cycle)
    try:
        del model
        assert trainer() is None or trainer()._freed
    finally:
        gc.enable()


def test_a_state_read_after_its_trainer_stepped_on_is_refused():
    model = _model()
    (x, y), (x2, y2) = _batches(2)
    model.train_on_batch(x, y)
    stale = model.__dict__["_train_state"]
    model.train_on_batch(x2, y2)
    with pytest.raises(ot.OrtrainError, match="stepped on from it"):
        _ = stale.moments


class _Scale(ot.layers.Layer):
    """A layer class of the user's: multiplies by ``factor``."""

    def __init__(self, factor=1.0, name=None):
        super().__init__(name)
        self.factor = factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}

    def emit(self, ctx, inputs):
        return ctx.gb.op("Mul", [inputs[0], ctx.gb.const(np.float32(self.factor), hint="factor")])


def test_a_layer_class_of_the_user_s_trains_as_numpy_copies_saves_and_rebuilds_when_changed(tmp_path):
    """A model with a custom layer predicted but could not train, copy or load ("unknown layer type
    'Scale' in a saved model"): a trainer rebuilds the model from its layers' records."""
    def model():
        m = ot.Sequential([ot.layers.Dense(3), _Scale(0.5), ot.layers.Dense(2)], input_shape=(4,), seed=0)
        return m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")

    kept, fresh = model(), model()
    w1, b1, w2, b2 = (a.astype(np.float64) for a in kept.get_weights())
    rng = np.random.default_rng(3)
    for step in range(4):
        if step == 2:  # a setting of the user's layer changed: the kept trainer's graph is rebuilt
            kept.layers[1].factor = fresh.layers[1].factor = 2.0
        factor = kept.layers[1].factor
        x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
        loss = kept.train_on_batch(x, y)
        assert loss == _fresh_step_mse(fresh, x, y)
        h = x @ w1 + b1
        d = factor * h @ w2 + b2 - y
        assert loss == pytest.approx(np.mean(d * d), rel=1e-5)
        g = 2 * d / d.size
        gh = factor * g @ w2.T
        w2, b2, w1, b1 = w2 - 0.1 * factor * h.T @ g, b2 - 0.1 * g.sum(0), w1 - 0.1 * x.T @ gh, b1 - 0.1 * gh.sum(0)
    for got, want in zip(kept.get_weights(), (w1, b1, w2, b2)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    kept.save(tmp_path / "m.ortrain")
    for other in (kept.copy(), ot.load_model(tmp_path / "m.ortrain")):
        assert other.layers[1].factor == 2.0
        np.testing.assert_array_equal(other.predict(x), kept.predict(x))

    class _NoConfig(ot.layers.Layer):
        def __init__(self, factor, name=None):
            super().__init__(name)
            self.factor = factor

        def emit(self, ctx, inputs):
            return ctx.gb.op("Mul", [inputs[0], ctx.gb.const(np.float32(self.factor), hint="factor")])

    bad = ot.Sequential([ot.layers.Dense(3), _NoConfig(2.0)], input_shape=(4,), seed=0)
    bad.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.OrtrainError, match=r"layer type '_NoConfig' \(a class of yours\) cannot be made again "
                                              r"from its get_config\(\).*give it a get_config\(\)"):
        bad.train_on_batch(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32))


def _fresh_step_mse(model, x, y):
    return fit_model(model, x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False,
                     keep_trainer=False).history["loss"][0]


def test_a_user_s_layer_whose_config_leaves_a_setting_out_still_rebuilds_the_kept_trainer():
    """Its config cannot tell the change (``factor`` is not in it): the graph's digest does."""
    class Hidden(_Scale):
        def get_config(self):
            return {"name": self.name}

    def model():
        m = ot.Sequential([ot.layers.Dense(3), Hidden(0.5), ot.layers.Dense(2)], input_shape=(4,), seed=0)
        return m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")

    kept, fresh = model(), model()
    rng = np.random.default_rng(4)
    for step in range(3):
        if step == 1:
            kept.layers[1].factor = fresh.layers[1].factor = 3.0
        x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
        assert kept.train_on_batch(x, y) == _fresh_step_mse(fresh, x, y)
    for a, b in zip(kept.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_copy_reads_which_weights_train_afresh():
    """What trains is remembered on the model, keyed by this process's count of freezes: a pickle
    made after a layer was frozen, loaded where the count stands where it was when the model last
    looked, still trains only what the copy's layers say."""
    from ortrain.nn import base_layer
    model = _model()
    x, y = _batches(1)[0]
    model.train_on_batch(x, y)
    looked_at = base_layer.FREEZES[0]
    model.layers[0].trainable = False
    blob = pickle.dumps(model)
    after = base_layer.FREEZES[0]
    base_layer.FREEZES[0] = looked_at  # as in a process whose count stands there
    try:
        twin = pickle.loads(blob)
        assert base_layer.what_trains(twin)[0] == set(twin.trainable_weight_names)
        assert not any(n.startswith(twin.layers[0].name + ".") for n in base_layer.what_trains(twin)[0])
    finally:
        base_layer.FREEZES[0] = after + 1


def test_a_role_a_layer_s_own_code_changes_between_calls_reaches_the_next_call():
    """What trains is remembered on the model; a role set on a built layer (a layer of the user's may
    set its own) is part of what it is remembered for, as in a fresh model built with that role."""
    from ortrain.nn import base_layer
    model = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model.train_on_batch(x, y)
    model.layers[1].roles["bias"] = "frozen"
    assert base_layer.what_trains(model)[0] == set(model.trainable_weight_names)
    assert "dense_1.bias" not in model.trainable_weight_names
    bias = model.layers[1].get_weights()[1].copy()
    model.train_on_batch(x, y)
    np.testing.assert_array_equal(model.layers[1].get_weights()[1], bias)


def test_a_freeze_while_which_weights_train_is_worked_out_is_not_remembered_as_before_it():
    """Another thread freezing a layer between the answer and the memo's key: the key is read first,
    so the next look works it out again (it was keyed to the new count, holding the old answer)."""
    from ortrain.nn import base_layer
    model = ot.Sequential([ot.layers.Dense(8), ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    model.train_on_batch(x, y)
    base_layer.FREEZES[0] += 1  # (another model's freeze: the next look works the answer out)
    params = type(model).params

    def params_then_a_freeze():
        out = params(model)
        del model.params
        model.layers[0].trainable = False  # "another thread", right after the names were read
        return out
    model.params = params_then_a_freeze
    base_layer.what_trains(model)
    assert base_layer.what_trains(model)[0] == set(model.trainable_weight_names)
    kernel = model.layers[0].get_weights()[0].copy()
    model.train_on_batch(x, y)
    np.testing.assert_array_equal(model.layers[0].get_weights()[0], kernel)
