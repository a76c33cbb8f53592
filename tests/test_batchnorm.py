"""Batch-norm statistics: calibration also reaches layers whose statistics are frozen."""

import warnings

import numpy as np
import pytest

import ortrain as ot

L = ot.layers


def test_calibrate_bn_sets_frozen_statistics_too(rng):
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(1)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    model.freeze_bn_stats()
    x = rng.standard_normal((200, 3)).astype(np.float32) * 2 + 3
    with ot.Trainer(model, batch_size=8) as tr:
        tr.calibrate_bn(x)
        w = tr.model().get_weights()
        h = x.astype(np.float64) @ w[0] + w[1]
        np.testing.assert_allclose(w[4], h.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w[5], h.var(0), rtol=1e-5, atol=1e-6)
        # Frozen statistics are what training normalises with, so the step now uses these.
        y = rng.standard_normal((8, 1)).astype(np.float32)
        tr.set_lr(0.0)
        loss = tr.step(x[:8], y)
        np.testing.assert_allclose(loss, np.mean((tr.predict(x[:8]) - y) ** 2), rtol=1e-5)


def test_freezing_one_running_statistic_fixes_both_and_says_so():
    # naming running_mean alone fixed running_var too, and the layer normalised by them in training,
    # without a word
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32) * 3 + 2
    m = ot.Sequential([ot.layers.Dense(3, name="a"), ot.layers.BatchNorm(name="bn"), ot.layers.Dense(2)],
                      input_shape=(4,), seed=0)
    with pytest.warns(UserWarning, match=r"freeze: 'bn.running_mean' is one of a batch norm's two running "
                                         r"statistics, which are fixed together or not at all: 'bn.running_var' "
                                         r"is fixed too"):
        m.freeze("bn.running_mean")
    m.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    before = m.get_weights()
    m.fit(x, np.zeros((8, 2), np.float32), batch_size=8, verbose=0)
    for got, want in zip(m.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    with pytest.warns(UserWarning, match=r"unfreeze: 'bn.running_var' is one of .* 'bn.running_mean' is tracked "
                                         r"again too"):
        m.unfreeze("bn.running_var")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.freeze(["bn.running_mean", "bn.running_var"])
        m.freeze("bn")


def test_naming_one_statistic_warns_only_where_the_other_changes():
    m = ot.Sequential([ot.layers.Dense(3), ot.layers.BatchNorm(name="bn"), ot.layers.Dense(2)], input_shape=(4,),
                      seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.unfreeze(["bn.running_var"])  # neither was fixed: nothing to say
    with pytest.warns(UserWarning, match="freeze: 'bn.running_var' is one of"):
        m.freeze(["bn.running_var"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.freeze(["bn.running_mean"])  # both fixed already
