"""One loss weight per position (a padding mask over time steps) for predictions with positions
between the batch and the last axis: the loss, its gradient, training steps and metrics, each
against numpy written here, and the refusals."""

import numpy as np
import pytest
from helpers import loss_and_grad, softmax

import ortrain as ot
from ortrain.metrics import resolve

L = ot.layers
B, T, K = 4, 5, 3


def _mask(rng, shape=(B, T)):
    w = (rng.random(shape) > 0.35).astype(np.float32) * rng.uniform(0.5, 2.0, shape).astype(np.float32)
    w[0, -1] = 0.0  # at least one padded position
    return w


def test_cross_entropy_per_position_value_and_gradient(rng):
    z = rng.standard_normal((B, T, K)).astype(np.float32)
    labels = rng.integers(0, K, (B, T)).astype(np.int64)
    w = _mask(rng)
    s = softmax(z.astype(np.float64))
    per = -np.log(np.take_along_axis(s, labels[..., None], axis=-1))[..., 0]
    value, grad = loss_and_grad(ot.losses.SparseCategoricalCrossentropy(from_logits=True), z, labels,
                                weight=w[..., None], weighting="sample")
    np.testing.assert_allclose(value, np.sum(w * per) / (B * T), rtol=2e-6)  # Keras: no renormalisation
    np.testing.assert_allclose(grad, w[..., None] * (s - np.eye(K)[labels]) / (B * T), rtol=2e-5, atol=1e-8)
    assert np.all(grad[w == 0] == 0.0)  # a padded position gives no gradient at all


def test_the_same_artifacts_take_one_weight_per_sample(rng):
    z = rng.standard_normal((B, T, K)).astype(np.float32)
    y = rng.standard_normal((B, T, K)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, (B, 1, 1)).astype(np.float32)
    d = z.astype(np.float64) - y
    value, grad = loss_and_grad("mse", z, y, weight=w, weighting="sample")
    np.testing.assert_allclose(value, np.sum(w * d ** 2) / d.size, rtol=2e-6)
    np.testing.assert_allclose(grad, 2 * w * d / d.size, rtol=2e-5, atol=1e-8)


def _sequence_regressor(lr=0.1):
    model = ot.Sequential([L.Dense(K)], input_shape=(T, 2), seed=3)
    model.compile(optimizer=ot.optim.SGD(lr=lr), loss="mse")
    return model


def _numpy_sgd_step(kernel, bias, x, y, w, lr):
    """One SGD step of ``x @ kernel + bias`` on ``sum(w * (pred - y)^2) / (B * T * K)``."""
    x, kernel, bias = x.astype(np.float64), kernel.astype(np.float64), bias.astype(np.float64)
    dpred = 2 * w[..., None] * (x @ kernel + bias - y) / (B * T * K)
    return kernel - lr * np.einsum("btf,btk->fk", x, dpred), bias - lr * dpred.sum(axis=(0, 1))


@pytest.mark.parametrize("form", ["(B, T)", "(B, T, 1)"])
def test_trainer_step_with_one_weight_per_position_matches_numpy(rng, form):
    model = _sequence_regressor()
    kernel, bias = model.get_weights()
    x = rng.standard_normal((B, T, 2)).astype(np.float32)
    y = rng.standard_normal((B, T, K)).astype(np.float32)
    w = _mask(rng)
    given = w if form == "(B, T)" else w[..., None]
    with ot.Trainer(model, batch_size=B, loss_mask=1) as tr:
        loss = tr.step(x, y, sample_weight=given)
        got_kernel, got_bias = tr.model().get_weights()
    pred = x.astype(np.float64) @ kernel + bias
    np.testing.assert_allclose(loss, np.sum(w[..., None] * (pred - y) ** 2) / (B * T * K), rtol=2e-6)
    want_kernel, want_bias = _numpy_sgd_step(kernel, bias, x, y, w, 0.1)
    np.testing.assert_allclose(got_kernel, want_kernel, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_bias, want_bias, rtol=1e-5, atol=1e-7)


def test_labels_at_padded_positions_change_nothing(rng):
    x = rng.standard_normal((B, T, 2)).astype(np.float32)
    y = rng.standard_normal((B, T, K)).astype(np.float32)
    w = _mask(rng)
    other = y.copy()
    other[w == 0] = 1e3  # whatever the padding holds
    after = []
    for labels in (y, other):
        with ot.Trainer(_sequence_regressor(), batch_size=B, loss_mask=1) as tr:
            tr.step(x, labels, sample_weight=w)
            after.append(tr.model().get_weights())
    for a, b in zip(*after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [(B, T + 1), (B, T, 2), (B, 1, T), (B + 1, T)])
def test_weights_of_another_shape_are_refused_and_change_nothing(rng, bad):
    model = _sequence_regressor()
    x = rng.standard_normal((B, T, 2)).astype(np.float32)
    y = rng.standard_normal((B, T, K)).astype(np.float32)
    with ot.Trainer(model, batch_size=B, loss_mask=1) as tr:
        before = tr.model().get_weights()
        with pytest.raises(ot.ShapeError, match=r"sample_weight: expected shape \(4,\) or \(4, 1\) \(one weight "
                                                r"per sample\), or \(4, 5\) or \(4, 5, 1\) \(one weight per "
                                                r"position.*received \(" + ", ".join(map(str, bad))):
            tr.step(x, y, sample_weight=np.ones(bad, np.float32))
        assert tr.n_steps == 0
        for a, b in zip(before, tr.model().get_weights()):
            np.testing.assert_array_equal(a, b)


def _token_model(vocab=7, dim=3):
    ids = ot.Input((T,), dtype="int64")
    model = ot.Model(ids, L.Dense(vocab)(L.Embedding(vocab, dim)(ids)))
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], weighted_metrics=["accuracy"])
    return model


def test_evaluate_weighs_loss_and_accuracy_per_token(rng):
    model = _token_model()
    x = rng.integers(0, 7, (B, T))
    y = rng.integers(0, 7, (B, T))
    w = _mask(rng)
    logits = model.predict(x).astype(np.float64)
    s = softmax(logits)
    per = -np.log(np.take_along_axis(s, y[..., None], axis=-1))[..., 0]
    correct = np.argmax(logits, axis=-1) == y
    got = model.evaluate(x, y, sample_weight=w)
    np.testing.assert_allclose(got["loss"], np.sum(w * per) / (B * T), rtol=2e-6)
    w64 = w.astype(np.float64)
    np.testing.assert_allclose(got["weighted_accuracy"], np.sum(w64 * correct) / np.sum(w64), rtol=1e-12)
    np.testing.assert_allclose(got["accuracy"], np.mean(correct), rtol=1e-12)  # metrics count every position


def test_fit_and_fit_generator_train_alike_with_token_weights(rng):
    x = rng.integers(0, 7, (2 * B, T))
    y = rng.integers(0, 7, (2 * B, T))
    w = _mask(rng, (2 * B, T))
    a, b = _token_model(), _token_model()
    b.set_weights(a.get_weights())
    ha = a.fit(x, y, sample_weight=w, batch_size=B, epochs=2, shuffle=False, verbose=0)
    batches = [(x[i:i + B], y[i:i + B], w[i:i + B]) for i in (0, B)]
    hb = ot.fit_generator(b, batches, epochs=2, verbose=0)
    for p, q in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(p, q, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ha.history["loss"], hb.history["loss"], rtol=1e-6)


def test_weighted_metrics_weigh_positions_as_keras_does(rng):
    pred = rng.standard_normal((B, T, K))
    y = rng.integers(0, K, (B, T))
    correct = np.argmax(pred, axis=-1) == y
    plain = resolve(["sparse_categorical_accuracy"], None)[0]
    plain.update(pred, y, _mask(rng)[..., None])  # compile's metrics: every position counts alike
    assert plain.result() == pytest.approx(np.mean(correct), rel=1e-12)
    acc = resolve([], None, ["sparse_categorical_accuracy"])[0]
    w = _mask(rng)
    acc.update(pred, y, w[..., None])
    assert acc.result() == pytest.approx(np.sum(w * correct) / np.sum(w), rel=1e-12)
    per_sample = rng.uniform(0.5, 2.0, (B, 1, 1))
    acc.reset()
    acc.update(pred, y, per_sample)
    want = np.sum(per_sample[:, 0, 0] * correct.mean(axis=1)) / per_sample.sum()
    assert acc.result() == pytest.approx(want, rel=1e-12)
    mae = resolve([], None, ["mae"])[0]  # a dense metric on a [batch, outputs] prediction, one weight per element
    p2, y2, w2 = rng.standard_normal((B, K)), rng.standard_normal((B, K)), rng.uniform(0, 2, (B, K))
    mae.update(p2, y2, w2)  # Keras averages such weights per sample
    want = np.sum(w2.mean(axis=1) * np.abs(p2 - y2).mean(axis=1)) / w2.mean(axis=1).sum()
    assert mae.result() == pytest.approx(want, rel=1e-12)


def test_every_per_sample_form_weighs_alike(rng):
    y = rng.standard_normal((B, T, K)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, B).astype(np.float32)
    model = _sequence_regressor()
    x = rng.standard_normal((B, T, 2)).astype(np.float32)
    with ot.Trainer(model, batch_size=B, loss_mask=1) as tr:
        losses = {tr.eval(x, y, sample_weight=w.reshape(shape)) for shape in [(B,), (B, 1), (B, 1, 1)]}
    assert len(losses) == 1


def test_a_free_length_prediction_takes_labels_and_weights_of_its_length(rng):
    # onnxruntime's GatherElements read 4 labels for 6 predicted steps without a word: the loss
    # covered the first 4 steps and training ran on them.
    ids = ot.Input((None,), dtype="int64")
    model = ot.Model(ids, L.Dense(7)(L.Embedding(7, 3)(ids)))
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x = rng.integers(0, 7, (B, 6))
    short = rng.integers(0, 7, (B, 4))
    before = model.get_weights()
    message = r"y: expected shape \(4, 6\), received \(4, 4\)"
    with pytest.raises(ot.ShapeError, match=message):
        model.fit(x, short, verbose=0)
    with pytest.raises(ot.ShapeError, match=message):
        model.evaluate(x, short, sample_weight=np.ones((B, 4)))
    with ot.Trainer(model, batch_size=B) as tr:
        with pytest.raises(ot.ShapeError, match=message):
            tr.step(x, short)
        assert tr.n_steps == 0
        tr.step(x[:, :3], rng.integers(0, 7, (B, 3)))  # each batch its own length
        tr.step(x, rng.integers(0, 7, (B, 6)))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    y = rng.integers(0, 7, (B, 6))
    w = _mask(rng, (B, 6))
    with pytest.raises(ot.ShapeError, match=r"sample_weight: expected shape .*\(4, 6\) or \(4, 6, 1\)"):
        model.fit(x, y, sample_weight=w[:, :4], verbose=0)
    logits = model.predict(x).astype(np.float64)
    per = -np.log(np.take_along_axis(softmax(logits), y[..., None], axis=-1))[..., 0]
    np.testing.assert_allclose(model.evaluate(x, y, sample_weight=w)["loss"], np.sum(w * per) / w.size, rtol=2e-6)


def test_fit_generator_with_loss_mask_1_weights_cross_entropy_from_an_unweighted_first_batch(rng):
    # The error for a weighted batch after an unweighted first one advised loss_mask=1, which a
    # cross-entropy model then refused as weighting a mean squared error only.
    x = rng.integers(0, 7, (B, T))
    y = rng.integers(0, 7, (B, T))
    w = _mask(rng)
    a, b = _token_model(), _token_model()
    b.set_weights(a.get_weights())
    ot.fit_generator(a, [(x, y), (x, y, w)], loss_mask=np.int64(1), verbose=0)
    ot.fit_generator(b, [(x, y, np.ones((B, T))), (x, y, w)], verbose=0)
    for p, q in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(p, q)


def test_weight_refusals_say_how_to_weigh(rng):
    # A Trainer weighs a mean squared error only: for cross-entropy its message sent the user to
    # loss_mask=1, which then refused the loss; and a (batch, time) mask for a (batch, time)
    # output was refused without the way to give one.
    model = _token_model()
    x, y = rng.integers(0, 7, (B, T)), rng.integers(0, 7, (B, T))
    with ot.Trainer(model, batch_size=B) as tr:
        with pytest.raises(ot.OrtrainError, match=r"a Trainer weighs a mean squared error only \(loss_mask=1\), and "
                                                  r"this model's loss is 'sparse_categorical_crossentropy': pass the "
                                                  r"weights to model.fit or ot.fit_generator"):
            tr.step(x, y, sample_weight=np.ones((B, T)))
        assert tr.n_steps == 0
    tagger = ot.Sequential([L.Dense(T)], input_shape=(3,), seed=0)
    tagger.compile(optimizer="sgd", loss=ot.losses.BinaryCrossentropy(from_logits=True))
    with pytest.raises(ot.ShapeError, match=r"expected shape \(4,\) or \(4, 1\) \(one weight per sample\), received "
                                            r"\(4, 5\); for one weight per output unit .* give the model an output of "
                                            r"shape \(batch, time, 1\)"):
        tagger.fit(np.ones((B, 3)), np.ones((B, T)), sample_weight=np.ones((B, T)), verbose=0)
