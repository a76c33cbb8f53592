"""Batch-norm statistics: calibration also reaches layers whose statistics are frozen."""

import numpy as np

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
