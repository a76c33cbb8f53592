import numpy as np

import ortrain as ot


def test_sequential_trains_and_predicts(rng):
    x = rng.random((32, 4)).astype(np.float32)
    y = x @ rng.random((4, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(2)], input_shape=(4,))
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    with ot.Trainer(model, batch_size=32) as tr:
        first = tr.step(x, y)
        for _ in range(50):
            last = tr.step(x, y)
        np.testing.assert_allclose(tr.predict(x), tr.model().predict(x), rtol=1e-6, atol=1e-6)
    assert last < first
