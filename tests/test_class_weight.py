"""``class_weight`` in Model.fit (arrays and generators) (Keras' semantics).

References: a fit whose ``sample_weight`` holds the class weights gathered by hand (Keras turns
class weights into sample weights, so the two must train identically), a numpy SGD step of a
weighted softmax cross-entropy, and PyTorch's ``CrossEntropyLoss(weight=...)`` with the batch
mean Keras takes (``reduction="sum"`` over the batch size: PyTorch's ``"mean"`` divides by the
sum of the weights instead).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import softmax

import ortrain as ot

CW = {0: 2.0, 2: 0.25}  # class 1 is left out: it weighs 1.0


def gathered(classes, class_weight=CW) -> np.ndarray:
    """The sample weights Keras makes of ``class_weight``, by hand."""
    return np.array([class_weight.get(int(c), 1.0) for c in classes], np.float32)


def classifier(loss="sparse_categorical_crossentropy", units=3, activation="softmax", optimizer=None, seed=0):
    model = ot.Sequential([ot.layers.Dense(6, activation="relu"), ot.layers.Dense(units, activation=activation)],
                          input_shape=(4,), seed=seed)
    model.compile(optimizer=optimizer or ot.optim.Adam(lr=1e-2), loss=loss, metrics=["accuracy"])
    return model


def data(n=21, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 3, n)


def assert_same_training(a, b, ha, hb):
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(wa, wb, rtol=0, atol=1e-6)
    assert ha.history.keys() == hb.history.keys()
    for key in ha.history:
        np.testing.assert_allclose(ha.history[key], hb.history[key], rtol=1e-6, equal_nan=True)


# -- the same training as sample weights -----------------------------------------------------------


def _labels(kind, classes):
    if kind == "sparse":
        return classes
    if kind == "sparse (n, 1)":
        return classes[:, None]
    if kind == "one-hot":
        return np.eye(3, dtype=np.float32)[classes]
    return (classes > 0).astype(np.float32)[:, None]  # binary: classes 0 and 1


@pytest.mark.parametrize("kind", ["sparse", "sparse (n, 1)", "one-hot", "binary"])
def test_class_weight_trains_as_the_sample_weights_keras_makes_of_it(kind):
    x, classes = data()
    y = _labels(kind, classes)
    loss, units, act = {"sparse": ("sparse_categorical_crossentropy", 3, "softmax"),
                        "sparse (n, 1)": ("sparse_categorical_crossentropy", 3, "softmax"),
                        "one-hot": ("categorical_crossentropy", 3, "softmax"),
                        "binary": ("binary_crossentropy", 1, "sigmoid")}[kind]
    cw = CW if kind != "binary" else {0: 2.0}
    a, b = classifier(loss, units, act), classifier(loss, units, act)
    w = gathered(classes if kind != "binary" else classes > 0, cw)
    ha = a.fit(x, y, batch_size=8, epochs=2, class_weight=cw, verbose=0)  # shuffled: weights follow their rows
    hb = b.fit(x, y, batch_size=8, epochs=2, sample_weight=w, verbose=0)
    assert_same_training(a, b, ha, hb)
    assert a.train_state.n_steps == 6


def test_class_weight_multiplies_sample_weight():
    x, y = data()
    sw = np.random.default_rng(1).random(len(y)).astype(np.float32)
    a, b = classifier(), classifier()
    ha = a.fit(x, y, batch_size=8, class_weight=CW, sample_weight=sw, shuffle=False, verbose=0)
    hb = b.fit(x, y, batch_size=8, sample_weight=sw * gathered(y), shuffle=False, verbose=0)
    assert_same_training(a, b, ha, hb)


def test_class_of_a_one_hot_row_is_its_arg_max_and_of_a_binary_label_above_one_half():
    x, _ = data(6)
    probs = np.array([[0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2], [0, 0, 1], [1, 0, 0]],
                     np.float32)
    a, b = classifier("categorical_crossentropy"), classifier("categorical_crossentropy")
    ha = a.fit(x, probs, batch_size=6, class_weight=CW, verbose=0)
    hb = b.fit(x, probs, batch_size=6, sample_weight=gathered([1, 0, 2, 0, 2, 0]), verbose=0)  # ties: the first
    assert_same_training(a, b, ha, hb)
    soft = np.array([0.0, 0.5, 0.51, 1.0, 0.2, 0.9], np.float32)  # 0.5 rounds to 0, as in Keras
    a, b = classifier("binary_crossentropy", 1, "sigmoid"), classifier("binary_crossentropy", 1, "sigmoid")
    ha = a.fit(x, soft, batch_size=6, class_weight={0: 3.0, 1: 0.5}, verbose=0)
    hb = b.fit(x, soft, batch_size=6, sample_weight=np.array([3, 3, 0.5, 0.5, 3, 0.5], np.float32), verbose=0)
    assert_same_training(a, b, ha, hb)


def test_an_empty_dict_weighs_every_class_one():
    x, y = data()
    a, b = classifier(), classifier()
    ha = a.fit(x, y, batch_size=8, class_weight={}, shuffle=False, verbose=0)
    hb = b.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    assert_same_training(a, b, ha, hb)


# -- outside references ----------------------------------------------------------------------------


def test_one_sgd_step_matches_numpy_weighted_softmax_cross_entropy():
    x, y = data(6, seed=3)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=2)
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    w, b = (a.astype(np.float64) for a in model.get_weights())
    c = gathered(y).astype(np.float64)
    p = softmax(x.astype(np.float64) @ w + b)
    loss = np.sum(c * -np.log(p[np.arange(6), y])) / 6  # Keras' sum_over_batch_size: not over sum(c)
    dz = c[:, None] * (p - np.eye(3)[y]) / 6
    hist = model.fit(x, y, batch_size=6, class_weight=CW, verbose=0)
    got_w, got_b = model.get_weights()
    np.testing.assert_allclose(got_w, w - 0.5 * x.T @ dz, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_b, b - 0.5 * dz.sum(0), rtol=0, atol=1e-6)
    assert hist.history["loss"][0] == pytest.approx(loss, rel=1e-6)


def test_fit_matches_torch_cross_entropy_with_class_weights():
    torch = torch_or_skip()
    x, y = data(12, seed=4)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=5)
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    net = torch.nn.Linear(4, 3).double()
    w, b = model.get_weights()
    with torch.no_grad():
        net.weight.copy_(torch.tensor(w.T, dtype=torch.float64))
        net.bias.copy_(torch.tensor(b, dtype=torch.float64))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    weight = torch.tensor([CW.get(k, 1.0) for k in range(3)], dtype=torch.float64)
    ce = torch.nn.CrossEntropyLoss(weight=weight, reduction="sum")
    for sl in (slice(0, 5), slice(5, 10), slice(10, 12)):
        rows = sl.stop - sl.start
        opt.zero_grad()
        loss = ce(net(torch.tensor(x[sl], dtype=torch.float64)), torch.tensor(y[sl])) / rows
        loss.backward()
        opt.step()
    model.fit(x, y, batch_size=5, class_weight=CW, shuffle=False, verbose=0)
    got_w, got_b = model.get_weights()
    np.testing.assert_allclose(got_w, net.weight.detach().numpy().T, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_b, net.bias.detach().numpy(), rtol=1e-4, atol=1e-6)


# -- generators and validation ---------------------------------------------------------------------


def test_generator_batches_are_weighted_by_class_and_by_their_own_weights():
    x, y = data(20)
    sw = np.random.default_rng(2).random(20).astype(np.float32)
    plain = [(x[i:i + 5], y[i:i + 5]) for i in range(0, 20, 5)]
    weighted = [(x[i:i + 5], y[i:i + 5], sw[i:i + 5]) for i in range(0, 20, 5)]
    by_hand = [(x[i:i + 5], y[i:i + 5], (sw * gathered(y))[i:i + 5]) for i in range(0, 20, 5)]
    a, b, c = classifier(), classifier(), classifier()
    ha = a.fit(weighted, epochs=2, class_weight=CW, verbose=0)
    hb = ot.fit_generator(b, by_hand, epochs=2, verbose=0)
    assert_same_training(a, b, ha, hb)
    hc = c.fit(plain, epochs=2, class_weight=CW, verbose=0)  # through Model.fit, batches without weights
    d = classifier()
    hd = ot.fit_generator(d, [(bx, by, gathered(by)) for bx, by in plain], epochs=2, verbose=0)
    assert_same_training(c, d, hc, hd)


def test_validation_is_not_weighted_by_class():
    x, y = data(30)
    sw = np.random.default_rng(5).random(30).astype(np.float32)
    model = classifier()
    hist = model.fit(x, y, batch_size=8, class_weight=CW, validation_data=(x[:9], y[:9]), verbose=0)
    ev = model.evaluate(x[:9], y[:9])
    assert hist.history["val_loss"][0] == pytest.approx(ev["loss"], rel=1e-5)
    assert hist.history["val_accuracy"][0] == pytest.approx(ev["accuracy"], rel=1e-6)
    # validation_split: the held-out rows keep their own sample weights, and only those
    hist = model.fit(x, y, batch_size=8, class_weight=CW, sample_weight=sw, validation_split=0.3, verbose=0)
    ev = model.evaluate(x[21:], y[21:], sample_weight=sw[21:])
    assert hist.history["val_loss"][0] == pytest.approx(ev["loss"], rel=1e-5)
    model = classifier()
    hist = model.fit([(x[:10], y[:10])], class_weight=CW, validation_data=[(x[10:], y[10:])], verbose=0)
    assert hist.history["val_loss"][0] == pytest.approx(model.evaluate(x[10:], y[10:])["loss"], rel=1e-5)


# -- refusals --------------------------------------------------------------------------------------


def _state(model):
    s = model.train_state
    return (model.get_weights(), s.step, s.n_steps, s.lr,
            {k: [m.copy() for m in v] for k, v in s.moments.items()})


def _assert_unchanged(model, before):
    weights, step, n_steps, lr, moments = before
    for a, b in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    s = model.train_state
    assert (s.step, s.n_steps, s.lr) == (step, n_steps, lr)
    assert s.moments.keys() == moments.keys()
    for k, v in moments.items():
        for a, b in zip(v, s.moments[k]):
            np.testing.assert_array_equal(a, b)


BAD = [
    ([0.5, 2.0], r"^class_weight: expected a dict mapping class indices to weights, such as \{0: 1.0, 1: 5.0\}, "
                 r"received a list"),
    ({"1": 2.0}, r"^class_weight: expected int class indices as keys, received the key '1' \(str\); number the "
                 r"classes from 0"),
    ({1.0: 2.0}, r"^class_weight: expected int class indices as keys, received the key 1.0 \(float\)"),
    ({True: 2.0}, r"^class_weight: expected int class indices as keys, received the key True \(bool\)"),
    ({1: -0.5}, r"^class_weight: expected weights that are finite numbers >= 0 \(float32\), received -0.5 for "
                r"class 1; give that class a weight such as 1.0, or 0.0 to leave it out of training"),
    ({1: float("nan")}, r"^class_weight: expected weights that are finite .* received nan for class 1"),
    ({1: float("inf")}, r"^class_weight: expected weights that are finite .* received inf for class 1"),
    ({1: 1e39}, r"^class_weight: expected weights that are finite numbers >= 0 \(float32\), received 1e\+39"),
    ({1: "2"}, r"^class_weight: expected weights that are finite .* received '2' for class 1"),
    ({3: 1.0}, r"^class_weight: expected class indices 0 to 2 \(the output has 3 classes\), received the key 3; "
               r"drop it or give the model's output one unit per class"),
    ({-1: 1.0}, r"^class_weight: expected class indices 0 to 2 .* received the key -1"),
]


@pytest.mark.parametrize("how", ["fit arrays", "fit generator"])
def test_bad_class_weights_are_refused_before_anything_changes(how, tmp_path):
    x, y = data(16)
    model = classifier()
    model.fit(x, y, batch_size=8, verbose=0)  # optimizer state to keep
    before = _state(model)
    log = tmp_path / "log.csv"
    calls = []

    def gen():
        calls.append(1)
        return (x[:8], y[:8]) if len(calls) % 3 else None

    for class_weight, message in BAD:
        kwargs = dict(class_weight=class_weight, verbose=0, callbacks=[ot.callbacks.CSVLogger(log)],
                      validation_freq=2)
        with pytest.raises(ot.OrtrainError, match=message):
            if how == "fit arrays":
                model.fit(x, y, batch_size=8, **kwargs)
            else:
                model.fit(gen, **kwargs)
        _assert_unchanged(model, before)
    assert not log.exists() and calls == []


def test_class_weight_on_a_model_without_classes_is_refused():
    x, y = data(8)
    inp = ot.Input((4,))
    two = ot.Model(inp, [ot.layers.Dense(3, activation="softmax")(inp), ot.layers.Dense(2)(inp)])
    seq = ot.Sequential([ot.layers.Dense(3, activation="softmax")], input_shape=(5, 4), seed=0)
    one_hot, zero = np.eye(3)[y], {0: 2.0}
    cases = [
        (classifier("mse"), one_hot, zero, r"^class_weight: expected a model compiled with a loss on class labels "
         r"\(sparse_categorical_crossentropy, categorical_crossentropy, or binary_crossentropy on one output unit\), "
         r"received loss 'mse', which takes no classes; pass sample_weight \(one weight per sample\) instead"),
        (classifier(ot.losses.Huber()), one_hot, zero, r"received loss 'huber', which takes no classes"),
        (classifier("binary_crossentropy", activation="sigmoid"), one_hot, zero,
         r"^class_weight: binary_crossentropy names classes 0 and 1 on one output unit; the model's output has "
         r"shape \(N, 3\)"),
        (classifier("binary_crossentropy", 1, "sigmoid"), (y > 0).astype(np.float32), {0: 2.0, 2: 1.0},
         r"^class_weight: expected class indices 0 to 1 \(binary_crossentropy's two classes\), received the key 2; "
         r"drop it$"),
        (two.compile(loss="sparse_categorical_crossentropy"), y, zero,
         r"^class_weight: expected a model with one output \(as in Keras\), received a model with 2; pass "
         r"sample_weight"),
        (seq.compile(loss="sparse_categorical_crossentropy"), np.zeros((8, 5), int), zero,
         r"^class_weight: expected an output of shape \(batch, classes\) for sparse_categorical_crossentropy, "
         r"received \(N, 5, 3\) .*; pass sample_weight instead, which takes one weight per position too \(the "
         r"class weights of the labels: table\[y\]\)$"),
    ]
    for model, labels, class_weight, message in cases:
        before = model.get_weights()
        inputs = x if model is not seq else np.zeros((8, 5, 4), np.float32)
        with pytest.raises(ot.OrtrainError, match=message):
            model.fit(inputs, labels, class_weight=class_weight, verbose=0)
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert model.train_state is None
    # fit_generator keeps the contract's signature; class weights are Model.fit's, also for generators
    with pytest.raises(TypeError, match="class_weight"):
        ot.fit_generator(classifier(), [(x, y)], class_weight={0: 2.0}, verbose=0)


def test_a_model_whose_number_of_classes_is_free_takes_any_class_index():
    # from_onnx with an output of shape (N, C), C the input's own free width: the classes are not
    # known before the data come, so the weights are looked up by class (a table sized by the
    # largest key ran out of memory), and labels are checked against the data's width (negative
    # ones, which GatherElements would read from the end, included).
    from onnx import TensorProto, helper, numpy_helper
    w = np.array([1.5, -0.5], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w0"], ["h"]), helper.make_node("Add", ["h", "w1"], ["y"])], "free",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C"])],
        [numpy_helper.from_array(w[:1], "w0"), numpy_helper.from_array(w[1:], "w1")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x, y = data()
    x = x[:, :3]  # three classes, as data() labels them
    big = {0: 2.0, 10**13: 5.0}
    a, b = ot.from_onnx(proto), ot.from_onnx(proto)
    for m in (a, b):
        m.compile(optimizer=ot.optim.SGD(lr=0.1), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    ha = a.fit(x, y, batch_size=7, class_weight=big, shuffle=False, verbose=0)
    hb = b.fit(x, y, batch_size=7, sample_weight=gathered(y, big), shuffle=False, verbose=0)
    assert_same_training(a, b, ha, hb)
    for labels in (np.where(y == 2, -1, y),):
        with pytest.raises(ot.ShapeError, match=r"^y: class labels must lie in \[0, 2\] \(the output has 3 classes\), "
                                                "received values from -1 to 1; "):
            a.fit(x, labels, batch_size=7, class_weight=big, verbose=0)
        with pytest.raises(ot.ShapeError, match=r"class labels must lie in \[0, 2\]"):
            a.evaluate(x, labels)


def test_metrics_count_every_sample_and_weighted_metrics_weigh_them_as_keras(tmp_path):
    # Keras 3: compile's metrics ignore sample and class weights; weighted_metrics apply them (and a
    # metric in both lists is logged as weighted_<name>). The lr is 0, so predictions never move.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    model = ot.Sequential([ot.layers.Dense(2, activation="softmax")], input_shape=(3,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  weighted_metrics=["accuracy", "sparse_categorical_accuracy"])
    assert model.metrics_names == ["loss", "accuracy", "weighted_accuracy", "sparse_categorical_accuracy"]
    correct = model.predict(x).argmax(axis=1) == y
    w = np.where(y == 1, 5.0, 1.0)
    plain, weighted = correct.mean(), np.sum(correct * w) / w.sum()
    assert not np.isclose(plain, weighted)
    h = model.fit(x, y, class_weight={0: 1.0, 1: 5.0}, batch_size=16, epochs=1, verbose=0, shuffle=False,
                  validation_data=(x, y, w))
    for prefix in ("", "val_"):
        assert h.history[f"{prefix}accuracy"][0] == pytest.approx(plain, rel=1e-12)
        assert h.history[f"{prefix}weighted_accuracy"][0] == pytest.approx(weighted, rel=1e-12)
        assert h.history[f"{prefix}sparse_categorical_accuracy"][0] == pytest.approx(weighted, rel=1e-12)
    got = model.evaluate(x, y, sample_weight=w)
    assert (got["accuracy"], got["weighted_accuracy"]) == (pytest.approx(plain), pytest.approx(weighted))
    model.save(tmp_path / "m.ortrain")
    loaded = ot.load_model(tmp_path / "m.ortrain")
    assert (loaded.metrics, loaded.weighted_metrics) == (["accuracy"], ["accuracy", "sparse_categorical_accuracy"])
    with pytest.raises(ot.OrtrainError, match="weighted_metrics: unknown metric 'f1'"):
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", weighted_metrics=["f1"])
    assert model.weighted_metrics == ["accuracy", "sparse_categorical_accuracy"]  # a refused compile changes nothing


def test_a_trainer_from_artifacts_reports_weighted_metrics_too(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    w = np.where(y == 1, 4.0, 1.0).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(2, activation="softmax")], input_shape=(3,), seed=0)
    art = ot.artifacts.build(model, loss="sparse_categorical_crossentropy", optimizer=ot.optim.SGD(lr=0.0),
                             weighting="sample", out_dir=tmp_path / "art")
    with ot.Trainer.from_artifacts(art.directory, batch_size=32, metrics=["accuracy"],
                                   weighted_metrics=["accuracy"]) as tr:
        trained = tr.model()
        correct = trained.predict(x).argmax(axis=1) == y
        got = trained.evaluate(x, y, sample_weight=w)
    assert got["accuracy"] == pytest.approx(correct.mean())
    assert got["weighted_accuracy"] == pytest.approx(np.sum(correct * w) / w.sum())
