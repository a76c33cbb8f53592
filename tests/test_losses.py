"""Every loss: value and gradient against numpy, on random data."""

import re

import numpy as np
import pytest
from helpers import loss_and_grad, sigmoid, softmax

import ortrain as ot

B, K = 6, 4
EPS = 1e-7


@pytest.fixture
def data(rng):
    return {
        "z": rng.standard_normal((B, K)).astype(np.float32),
        "y": rng.standard_normal((B, K)).astype(np.float32),
        "probs": softmax(rng.standard_normal((B, K))).astype(np.float32),
        "onehot": np.eye(K, dtype=np.float32)[rng.integers(0, K, B)],
        "labels": rng.integers(0, K, B).astype(np.int64),
        "p01": rng.uniform(0.05, 0.95, (B, K)).astype(np.float32),
        "y01": (rng.random((B, K)) > 0.5).astype(np.float32),
    }


def check(loss, pred, y, ref_value, ref_grad, **kw):
    value, grad = loss_and_grad(loss, pred, y, **kw)
    np.testing.assert_allclose(value, ref_value, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(grad, ref_grad, rtol=2e-5, atol=1e-7)


def test_mse(data):
    p, y = data["z"], data["y"]
    d = p.astype(np.float64) - y
    check("mse", p, y, np.mean(d ** 2), 2 * d / d.size)


def test_mae(data):
    p, y = data["z"], data["y"]
    d = p.astype(np.float64) - y
    check(ot.losses.MeanAbsoluteError(), p, y, np.mean(np.abs(d)), np.sign(d) / d.size)


@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_huber(data, delta):
    p, y = data["z"], data["y"]
    d = p.astype(np.float64) - y
    ad = np.abs(d)
    value = np.mean(np.where(ad <= delta, 0.5 * d ** 2, delta * (ad - 0.5 * delta)))
    check(ot.losses.Huber(delta=delta), p, y, value, np.clip(d, -delta, delta) / d.size)


@pytest.mark.parametrize("delta", [1.0, 1e8])
def test_huber_gradient_of_residuals_far_below_delta(delta):
    # The form a^2/2 + delta (|d| - a) added and took away delta in its gradient: 0 below delta * 6e-8.
    p = np.array([[1e-6, 3e-8, -2e-9, 3.0, -1.0, 0.0]], np.float32)
    y = np.zeros_like(p)
    d = p.astype(np.float64)
    ad = np.abs(d)
    value = np.mean(np.where(ad <= delta, 0.5 * d ** 2, delta * (ad - 0.5 * delta)))
    got, grad = loss_and_grad(ot.losses.Huber(delta=delta), p, y)
    np.testing.assert_allclose(got, value, rtol=1e-6)
    np.testing.assert_allclose(grad, np.clip(d, -delta, delta) / d.size, rtol=1e-6, atol=0)


def test_loss_mean_over_a_million_alike_values_is_exact_to_float32():
    # onnxruntime's float32 ReduceMean adds in turn: 7e-4 off here; PyTorch's mean is 1e-8 off.
    x = 1 + np.random.default_rng(0).random((10 ** 6, 1), dtype=np.float32) * 1e-3
    y = np.zeros_like(x)
    want = np.mean(x.astype(np.float64) ** 2)
    model = ot.Sequential([ot.layers.Activation("linear")], input_shape=(1,))
    model.compile(optimizer="sgd", loss="mse")
    assert model.evaluate(x, y)["loss"] == pytest.approx(want, rel=1e-7)
    assert ot.losses.MeanSquaredError()(y, x) == pytest.approx(want, rel=1e-7)
    w = np.full(len(x), 0.5, np.float32)
    assert ot.losses.MeanSquaredError()(y, x, sample_weight=w) == pytest.approx(want / 2, rel=1e-7)
    # the fused softmax cross-entropy's own mean was 1e-4 off over a million rows
    z = np.random.default_rng(1).standard_normal((10 ** 6, 3)).astype(np.float32) * 0.01
    labels = np.random.default_rng(2).integers(0, 3, len(z))
    wz = z.astype(np.float64)
    want = np.mean(np.log(np.exp(wz).sum(1)) - wz[np.arange(len(z)), labels])
    logits = ot.Sequential([ot.layers.Activation("linear")], input_shape=(3,))
    logits.compile(optimizer="sgd", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert logits.evaluate(z, labels)["loss"] == pytest.approx(want, rel=1e-7)


def test_categorical_on_probabilities(data):
    p, y = data["probs"], data["onehot"]
    pc = np.clip(p.astype(np.float64), EPS, 1 - EPS)
    check("categorical_crossentropy", p, y, np.mean(-(y * np.log(pc)).sum(1)), -y / pc / B)


def test_categorical_on_logits(data):
    z, y = data["z"], data["probs"]  # soft targets
    s = softmax(z.astype(np.float64))
    value = np.mean(-(y * np.log(s)).sum(1))
    grad = (s * y.sum(1, keepdims=True) - y) / B
    check(ot.losses.CategoricalCrossentropy(from_logits=True), z, y, value, grad)


def test_sparse_on_probabilities(data):
    p, lab = data["probs"], data["labels"]
    pc = np.clip(p.astype(np.float64), EPS, 1 - EPS)
    picked = pc[np.arange(B), lab]
    grad = np.zeros((B, K))
    grad[np.arange(B), lab] = -1.0 / picked / B
    check("sparse_categorical_crossentropy", p, lab, np.mean(-np.log(picked)), grad)


def test_sparse_on_logits(data):
    z, lab = data["z"], data["labels"]
    s = softmax(z.astype(np.float64))
    grad = s - np.eye(K)[lab]
    check(ot.losses.SparseCategoricalCrossentropy(from_logits=True), z, lab,
          np.mean(-np.log(s[np.arange(B), lab])), grad / B)


def test_binary_on_probabilities(data):
    p, y = data["p01"], data["y01"]
    pd = p.astype(np.float64)
    value = np.mean(-(y * np.log(pd) + (1 - y) * np.log(1 - pd)))
    check("binary_crossentropy", p, y, value, (pd - y) / (pd * (1 - pd)) / p.size)


def test_binary_on_logits(data):
    z, y = data["z"] * 4, data["y01"]
    zd = z.astype(np.float64)
    value = np.mean(np.maximum(zd, 0) - zd * y + np.log1p(np.exp(-np.abs(zd))))
    check(ot.losses.BinaryCrossentropy(from_logits=True), z, y, value, (sigmoid(zd) - y) / z.size)


@pytest.mark.parametrize("from_logits", [False, True])
@pytest.mark.parametrize("bad", [2.0, -1.0, 1.0 + 1e-6])
def test_binary_labels_beyond_0_and_1_are_refused_everywhere(from_logits, bad):
    # a label of 2 (classes numbered 1 and 2) trained without a word, its loss falling to -15.9 and on
    # (PyTorch's BCELoss refuses it); soft labels inside [0, 1] stay as they are
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    y = np.zeros((8, 1), np.float32)
    y[3] = bad
    model = ot.Sequential([ot.layers.Dense(1, activation=None if from_logits else "sigmoid")], input_shape=(3,),
                          seed=0)
    model.compile(optimizer="adam", loss=ot.losses.BinaryCrossentropy(from_logits=from_logits))
    before = model.get_weights()
    said = r"binary cross-entropy takes labels in \[0, 1\] .*received 1 outside it, from " + re.escape(f"{float(np.float32(bad)):.9g}")
    calls = [lambda: model.fit(x, y, batch_size=4, verbose=0),
             lambda: model.fit(x, np.zeros_like(y), validation_data=(x, y), batch_size=4, verbose=0),
             lambda: ot.fit_generator(model, [(x[:4], y[:4])], verbose=0),
             lambda: model.train_on_batch(x, y),
             lambda: model.evaluate(x, y, verbose=0)]
    for call in calls:
        with pytest.raises(ot.ShapeError, match=said):
            call()
    with ot.Trainer(model, batch_size=8) as tr:
        with pytest.raises(ot.ShapeError, match=said):
            tr.step(x, y)
        assert tr.n_steps == 0
    with pytest.raises(ot.ShapeError, match=r"y_true: binary cross-entropy takes labels in \[0, 1\]"):
        model.loss(y, np.full((8, 1), 0.5, np.float32))
    beside_nan = y.copy()
    beside_nan[5] = np.nan  # a NaN made min and max NaN, and the label beyond passed
    with pytest.raises(ot.ShapeError, match=r"y_true: binary cross-entropy takes labels in \[0, 1\]"):
        model.loss(beside_nan, np.full((8, 1), 0.5, np.float32))
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    assert model.optimizer.step == 0
    soft = np.linspace(0, 1, 8, dtype=np.float32).reshape(8, 1)
    model.fit(x, soft, batch_size=4, verbose=0)
    assert model.optimizer.step == 2


def test_binary_on_logits_at_zero(data):
    # A logit of exactly 0 (a zero row into a zero bias) has the gradient sigmoid(0) - y = 0.5 - y,
    # on both sides of the max(z, 0) and |z| kinks the stable formula has there.
    z, y = data["z"].copy(), data["y01"]
    z[:, :2] = 0.0
    zd = z.astype(np.float64)
    value = np.mean(np.maximum(zd, 0) - zd * y + np.log1p(np.exp(-np.abs(zd))))
    check(ot.losses.BinaryCrossentropy(from_logits=True), z, y, value, (sigmoid(zd) - y) / z.size)


def test_binary_after_a_sigmoid_layer_is_exact_in_the_negative_tail():
    # onnxruntime's Sigmoid kernel gave 12.549 here (47% off at -16), PyTorch 12.500.
    z = np.array([[-8, -12, -14, -16]], np.float32)
    model = ot.Sequential([ot.layers.Activation("sigmoid")], input_shape=(4,))
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    got = model.evaluate(z, np.ones_like(z), verbose=0)["loss"]
    np.testing.assert_allclose(got, np.mean(np.log1p(np.exp(-z.astype(np.float64)))), rtol=1e-6)


@pytest.mark.parametrize("last", ["dense", "activation", "reshaped"])
def test_binary_after_a_sigmoid_layer_has_the_gradient_of_its_logits_near_saturation(last):
    # the exact sigmoid's exact derivative times the loss's 1 / (1 - p) of the rounded p was up to 41%
    # off near 1 (1.408 at a logit of 15.6, 0.855 at 15); PyTorch's s (1 - s) of the rounded s gives 1
    z = np.array([-20, -16.2, -12, -3, 0, 3, 12, 13, 14, 15, 15.3, 15.6, 15.9, 16.0, 20], np.float32)
    n = z.size
    layers = {"dense": [ot.layers.Dense(n, activation="sigmoid", name="d")],
              "activation": [ot.layers.Dense(n, name="d"), ot.layers.Activation("sigmoid")],
              "reshaped": [ot.layers.Dense(n, activation="sigmoid", name="d"), ot.layers.Reshape((n, 1)),
                           ot.layers.Flatten()]}[last]
    model = ot.Sequential(layers, input_shape=(n,))
    model.set_weights([np.eye(n, dtype=np.float32), np.zeros(n, np.float32)])
    model.freeze("d.kernel")
    model.compile(optimizer=ot.optim.SGD(lr=1.0), loss="binary_crossentropy")
    x, y = z[None, :], np.zeros((1, n), np.float32)
    y[0, :3] = 1.0                      # wrong the other way in the negative tail
    z64 = z.astype(np.float64)
    clipped = np.clip(1 / (1 + np.exp(-z64)), np.float32(1e-7), np.float32(1 - 1e-7))
    want = -(y * np.log(clipped) + (1 - y) * np.log1p(-clipped))   # the clipped probabilities' loss
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0)["loss"], want.mean(), rtol=1e-6)
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, shuffle=False)
    grad = -model.get_weights()[1] * n  # d mean / d z, by one SGD step at lr 1
    inside = (z > -16.118095) & (z < 15.942385)
    np.testing.assert_allclose(grad[inside], (1 / (1 + np.exp(-z64)) - y[0])[inside], rtol=1e-5, atol=1e-7)
    assert np.all(grad[~inside] == 0)   # beyond the clip, as the clipped probability's
    torch = pytest.importorskip("torch")
    t = torch.tensor(z[inside], requires_grad=True)
    torch.nn.functional.binary_cross_entropy(torch.sigmoid(t), torch.tensor(y[0, inside]), reduction="sum").backward()
    np.testing.assert_allclose(grad[inside], t.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_a_binary_crossentropy_of_its_own_elementwise_form_keeps_it_on_a_sigmoid_output():
    class Doubled(ot.losses.BinaryCrossentropy):
        def elementwise(self, gb, pred, label):
            return gb.op("Mul", [super().elementwise(gb, pred, label), gb.const(2.0)])

    z = np.array([[-3.0, 0.5, 4.0]], np.float32)
    p = 1 / (1 + np.exp(-z.astype(np.float64)))
    for loss, factor in (("binary_crossentropy", 1), (Doubled(), 2)):   # the plain loss's artifacts cached first
        model = ot.Sequential([ot.layers.Dense(3, activation="sigmoid")], input_shape=(3,), seed=0)
        model.set_weights([np.eye(3, dtype=np.float32), np.zeros(3, np.float32)])
        model.compile(optimizer="sgd", loss=loss)
        want = factor * np.mean(-np.log1p(-p))
        np.testing.assert_allclose(model.evaluate(z, np.zeros_like(z), verbose=0)["loss"], want, rtol=1e-6)
        # training took the plain loss's cached artifacts: their config is the same
        np.testing.assert_allclose(model.fit(z, np.zeros_like(z), verbose=0).history["loss"][0], want, rtol=1e-6)


def test_weighted_mse_per_sample(data, rng):
    p, y = data["z"], data["y"]
    w = rng.uniform(0, 2, (B, 1))
    d = p.astype(np.float64) - y
    check("mse", p, y, np.sum(w * d ** 2) / (B * K), 2 * w * d / (B * K), weight=w, weighting="sample")


def test_weighted_mse_per_element_zero_weight_removes_gradient_exactly(data, rng):
    p, y = data["z"], data["y"]
    w = (rng.random((B, K)) > 0.5).astype(np.float32) * rng.uniform(0.5, 2, (B, K)).astype(np.float32)
    d = p.astype(np.float64) - y
    value, grad = loss_and_grad("mse", p, y, weight=w, weighting="element")
    np.testing.assert_allclose(value, np.sum(w * d ** 2) / (B * K), rtol=2e-6)  # no renormalisation
    np.testing.assert_allclose(grad, 2 * w * d / (B * K), rtol=2e-5, atol=1e-8)
    assert np.all(grad[w == 0] == 0.0)


def test_sample_weights_with_cross_entropy(data, rng):
    z, lab = data["z"], data["labels"]
    w = rng.uniform(0, 2, (B, 1))
    s = softmax(z.astype(np.float64))
    per = -np.log(s[np.arange(B), lab])
    grad = w * (s - np.eye(K)[lab]) / B
    check(ot.losses.SparseCategoricalCrossentropy(from_logits=True), z, lab, np.sum(w[:, 0] * per) / B, grad,
          weight=w, weighting="sample")


def test_loss_lookup_and_errors():
    assert ot.losses.get("mean_squared_error") == ot.losses.MeanSquaredError()
    assert ot.losses.get({"name": "huber", "delta": 2.0}) == ot.losses.Huber(2.0)
    with pytest.raises(ot.OrtrainError, match="loss: expected one of .*received 'hinge'"):
        ot.losses.get("hinge")
    with pytest.raises(ot.OrtrainError, match="Huber\\(delta=...\\): expected a positive"):
        ot.losses.Huber(delta=0)


def test_element_weights_refused_for_other_losses(data):
    with pytest.raises(ot.OrtrainError, match="mean squared error only"):
        loss_and_grad("mae", data["z"], data["y"], weight=np.ones((B, K)), weighting="element")


@pytest.mark.torch
def test_loss_objects_are_callable_as_keras_losses_and_match_pytorch(data):
    from conftest import torch_or_skip
    torch = torch_or_skip()
    F, t = torch.nn.functional, torch.tensor
    z, y, labels, y01 = data["z"], data["y"], data["labels"], data["y01"]
    probs = torch.softmax(t(z), 1).numpy()
    L = ot.losses
    cases = [
        (L.MeanSquaredError()(y, z), F.mse_loss(t(z), t(y))),
        (L.MeanAbsoluteError()(y, z), F.l1_loss(t(z), t(y))),
        (L.Huber(delta=0.5)(y, z), F.huber_loss(t(z), t(y), delta=0.5)),
        (L.CategoricalCrossentropy()(np.eye(K)[labels], probs), F.cross_entropy(t(z), t(labels))),
        (L.CategoricalCrossentropy(from_logits=True)(np.eye(K)[labels], z), F.cross_entropy(t(z), t(labels))),
        (L.SparseCategoricalCrossentropy()(labels, probs), F.cross_entropy(t(z), t(labels))),
        (L.SparseCategoricalCrossentropy(from_logits=True)(labels[:, None], z), F.cross_entropy(t(z), t(labels))),
        (L.BinaryCrossentropy()(y01, torch.sigmoid(t(z)).numpy()), F.binary_cross_entropy_with_logits(t(z), t(y01))),
        (L.BinaryCrossentropy(from_logits=True)(y01, z), F.binary_cross_entropy_with_logits(t(z), t(y01))),
        (ot.losses.get("mse")(y[:, 0], z[:, 0].astype(np.float64)), F.mse_loss(t(z[:, 0]), t(y[:, 0]))),
    ]
    for got, want in cases:
        assert isinstance(got, float)
        np.testing.assert_allclose(got, want.item(), rtol=2e-6)
    # weights as fit takes them: sum(w * loss) / elements, one per sample or (mse) one per element
    w = np.linspace(0, 2, B).astype(np.float32)
    np.testing.assert_allclose(L.MeanSquaredError()(y, z, w), np.sum(w[:, None] * (z - y) ** 2) / (B * K), rtol=2e-6)
    np.testing.assert_allclose(L.MeanSquaredError()(y, z, np.abs(y)), np.mean(np.abs(y) * (z - y) ** 2), rtol=2e-6)
    per_sample = F.cross_entropy(t(z), t(labels), reduction="none").numpy()
    np.testing.assert_allclose(L.SparseCategoricalCrossentropy(from_logits=True)(labels, z, w),
                               np.sum(w * per_sample) / B, rtol=2e-6)
    with pytest.raises(ot.ShapeError, match=r"y_true: expected shape \(6, 4\), received \(5, 4\); give one row per "
                                            r"row of y_pred"):
        L.MeanSquaredError()(y[:5], z)
    with pytest.raises(ot.ShapeError, match=r"class labels must lie in \[0, 3\]"):
        L.SparseCategoricalCrossentropy()(labels + K, probs)
    with pytest.raises(ot.ShapeError, match=r"y_true: expected shape \(6, 4\), received \(6, 2\); reshape y_true to "
                                            r"that \(y_pred's shape sets it\)$"):   # no fix speaking of a model
        L.MeanSquaredError()(y[:, :2], z)
    with pytest.raises(ot.ShapeError, match=r"received \(6, 2\); for mean squared error, weights shaped as y_pred "
                                            r"weigh each element$"):
        L.MeanSquaredError()(y, z, np.ones((B, 2)))
    with pytest.raises(ot.ShapeError, match=r"sparse_categorical_crossentropy expected predictions of shape "
                                            r"\(batch, classes\)"):
        L.SparseCategoricalCrossentropy()(labels, probs[0])


def test_a_dict_of_losses_per_output_is_refused_saying_what_a_dict_means():
    x = ot.Input((4,), name="x")
    model = ot.Model(x, [ot.layers.Dense(3, name="cls")(x), ot.layers.Dense(1, name="reg")(x)])
    with pytest.raises(ot.OrtrainError, match="loss: a dict is read as a loss config with its 'name'.*one loss, "
                                              "on the model's first output"):
        model.compile(optimizer="adam", loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"})
    assert not model.compiled
    assert ot.losses.get({"name": "huber", "delta": 2.0}).delta == 2.0


def test_a_loss_class_and_a_misfit_weighted_metric_are_named_so():
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(2,))
    with pytest.raises(ot.OrtrainError, match="received the class MeanSquaredError; make one: "
                                              "ot.losses.MeanSquaredError\\(\\)"):
        model.compile(loss=ot.losses.MeanSquaredError)
    with pytest.raises(ot.OrtrainError, match="weighted_metrics: 'categorical_accuracy' compares the output"):
        model.compile(loss="sparse_categorical_crossentropy", weighted_metrics=["categorical_accuracy"])
    assert not model.compiled


def test_the_mean_of_wide_samples_is_exact_to_float32():
    # a sample of many elements is averaged in float32 first (casting all of them to float64 cost half
    # a step), then the batch in float64
    x = 1 + np.random.default_rng(3).random((64, 20000), dtype=np.float32) * 1e-3
    model = ot.Sequential([ot.layers.Activation("linear")], input_shape=(20000,))
    model.compile(optimizer="sgd", loss="mse")
    assert model.evaluate(x, np.zeros_like(x))["loss"] == pytest.approx(np.mean(x.astype(np.float64) ** 2), rel=1e-6)
    three = x.reshape(64, 200, 100)
    model = ot.Sequential([ot.layers.Activation("linear")], input_shape=(200, 100))
    model.compile(optimizer="sgd", loss="mae")
    assert model.evaluate(three, np.zeros_like(three))["loss"] == pytest.approx(np.mean(three.astype(np.float64)),
                                                                                rel=1e-6)
