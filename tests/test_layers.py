"""Layers: forward values against numpy, training steps against PyTorch."""

import re
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from conftest import flushed, torch_or_skip
from helpers import sigmoid, softmax

import ortrain as ot

L = ot.layers


def predict_one(layer, x, input_dtype="float32"):
    model = ot.Sequential([layer], input_shape=x.shape[1:], input_dtype=input_dtype, seed=0)
    return model, model.predict(x)


@pytest.mark.parametrize("activation,ref", [
    ("linear", lambda z: z), ("relu", lambda z: np.maximum(z, 0)), ("sigmoid", sigmoid), ("tanh", np.tanh),
    ("softmax", softmax), ("leaky_relu", lambda z: np.where(z > 0, z, 0.2 * z)),
    ("gelu", lambda z: 0.5 * z * (1 + np.vectorize(__import__("math").erf)(z / np.sqrt(2)))),
])
def test_dense_with_each_activation(rng, activation, ref):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    model, out = predict_one(L.Dense(4, activation=activation), x)
    k, b = model.get_weights()
    np.testing.assert_allclose(out, ref(x.astype(np.float64) @ k + b), rtol=1e-5, atol=1e-6)


def test_glorot_uniform_and_seeds():
    k = ot.Sequential([L.Dense(300)], input_shape=(200,), seed=3).get_weights()[0]
    limit = np.sqrt(6 / 500)
    assert np.abs(k).max() <= limit and np.abs(k).max() > 0.95 * limit
    assert abs(k.mean()) < 0.01 and abs(k.std() - limit / np.sqrt(3)) < 0.005
    same = ot.Sequential([L.Dense(300)], input_shape=(200,), seed=3).get_weights()[0]
    np.testing.assert_array_equal(k, same)
    ot.set_seed(7)
    a = ot.Sequential([L.Dense(4)], input_shape=(2,)).get_weights()[0]
    ot.set_seed(7)
    b = ot.Sequential([L.Dense(4)], input_shape=(2,)).get_weights()[0]
    np.testing.assert_array_equal(a, b)


def test_dense_on_sequences_uses_matmul(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    model, out = predict_one(L.Dense(5), x)
    k, b = model.get_weights()
    np.testing.assert_allclose(out, x @ k + b, rtol=1e-5, atol=1e-6)


def test_batchnorm_inference_uses_running_statistics(rng):
    x = rng.standard_normal((6, 3)).astype(np.float32)
    model, _ = predict_one(L.BatchNorm(epsilon=1e-3), x)
    g, b, m, v = rng.random(3), rng.random(3), rng.standard_normal(3), rng.random(3) + 0.5
    model.set_weights([g, b, m, v])
    np.testing.assert_allclose(model.predict(x), (x - m) / np.sqrt(v + 1e-3) * g + b, rtol=1e-5, atol=1e-6)


def test_layernorm(rng):
    x = rng.standard_normal((4, 6)).astype(np.float64)
    model, _ = predict_one(L.LayerNorm(epsilon=1e-3), x.astype(np.float32))
    g, b = rng.random(6), rng.random(6)
    model.set_weights([g, b])
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-3) * g + b
    np.testing.assert_allclose(model.predict(x), ref, rtol=1e-5, atol=1e-5)


def test_layernorm_of_rows_with_a_large_offset_is_exact(rng):
    # onnxruntime's kernel takes mean(x^2) - mean(x)^2: 14% off at an offset of 1000 spreads, NaN at 10^4
    for offset in (1e2, 1e3, 1e4):
        x = (offset + rng.standard_normal((4, 8))).astype(np.float32).astype(np.float64)   # what float32 holds
        ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-3)
        model = ot.Sequential([L.Dense(8, use_bias=False), L.LayerNorm()], input_shape=(8,), seed=0)
        model.set_weights({"dense_0.kernel": np.eye(8)})
        np.testing.assert_allclose(model.predict(x), ref, atol=1e-5)
        model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        y = rng.standard_normal((4, 8))
        with ot.Trainer(model, batch_size=4) as tr:
            assert tr.step(x, y) == pytest.approx(np.mean((ref - y) ** 2), rel=1e-4)
            w = tr.model().get_weights()[0]
        # d loss / d W through the layer norm, in float64: the centred form
        d = x - x.mean(1, keepdims=True)
        s = np.sqrt((d ** 2).mean(1, keepdims=True) + 1e-3)
        dy = 2 * ((d / s) - y) / y.size
        dx = (dy - dy.mean(1, keepdims=True) - (d / s) * (dy * d / s).mean(1, keepdims=True)) / s
        np.testing.assert_allclose(w, np.eye(8) - 0.1 * x.T @ dx, atol=2e-4)


def test_layernorm_of_one_feature_trains(rng):
    # onnxruntime's LayerNormalizationGrad failed on rows of one element; PyTorch's LayerNorm(1)
    # gives the bias, a gradient to it alone
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal((4, 1)).astype(np.float32)
    model = ot.Sequential([L.Dense(1), L.LayerNorm()], input_shape=(3,), seed=0)
    model.set_weights({"layer_norm_0.beta": [0.25]})
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    before = model.get_weights()
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    beta = 0.25
    for _ in range(2):
        beta -= 0.1 * np.mean(2 * (beta - y.astype(np.float64)))
    kernel, bias, gamma, got = model.get_weights()
    for a, b in zip((kernel, bias, gamma), before[:3]):
        np.testing.assert_array_equal(a, b)
    assert got[0] == pytest.approx(beta, rel=1e-6)


def test_embedding(rng):
    idx = rng.integers(0, 10, (3, 4))
    model, out = predict_one(L.Embedding(10, 5), idx, input_dtype="int64")
    np.testing.assert_array_equal(out, model.get_weights()[0][idx])
    with pytest.raises(ot.ShapeError, match="expected integer values"):
        model.predict(idx + 0.5)


@pytest.mark.parametrize("rows, steps, threads", [(16, 5, 1), (4096, 8, 2)])
def test_an_embedding_trains_as_a_scatter_add_of_its_rows_gradients(rng, rows, steps, threads):
    # onnxruntime's GatherGrad took 460 ns a row (15 ms of a 17 ms step); the gradient is a scatter that
    # adds now: rows taken several times get the sum of their gradients, as numpy's add.at gives them.
    # The runtime's ScatterND lost additions on two threads past 200,000 values (the second case, 524,288)
    import onnx
    idx = rng.integers(0, 3, (rows, steps))
    idx[:, 0] = 2  # every sample reads row 2, some twice
    y = rng.standard_normal((rows, 3)).astype(np.float32)
    model = ot.Sequential([L.Embedding(3, 16), L.Flatten(), L.Dense(3)], input_shape=(steps,),
                          input_dtype="int64", seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    table, kernel, bias = (w.astype(np.float64) for w in model.get_weights())
    for _ in range(3):
        h = table[idx].reshape(rows, steps * 16)
        dp = 2 * (h @ kernel + bias - y) / y.size
        dh = (dp @ kernel.T).reshape(rows, steps, 16)
        dtable = np.zeros_like(table)
        np.add.at(dtable, idx, dh)
        table, kernel, bias = table - 0.1 * dtable, kernel - 0.1 * h.T @ dp, bias - 0.1 * dp.sum(0)
    with ot.Trainer(model, batch_size=rows, threads=threads) as tr:
        ops = {n.op_type for n in onnx.load(str(tr._art.training)).graph.node}
        assert "ScatterElements" in ops and not ops & {"GatherGrad", "ScatterND"}
        for _ in range(3):
            tr.step(idx, y)
        for got, want in zip(tr.model().get_weights(), (table, kernel, bias)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_a_gather_of_an_imported_model_trains_with_negative_and_int32_indices(rng):
    # the gradient counts negative indices from the end as Gather does, and takes int32 ones
    from _onnx_helpers import model as onnx_model
    from _onnx_helpers import vi
    from onnx import TensorProto, helper, numpy_helper
    table = rng.standard_normal((5, 3)).astype(np.float32)
    proto = onnx_model([helper.make_node("Gather", ["W", "ids"], ["out"], axis=0)],
                       [vi("ids", ["N", 2], TensorProto.INT32)], [vi("out", ["N", 2, 3])],
                       [numpy_helper.from_array(table, "W")])
    model = ot.from_onnx(proto)
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    ids = np.array([[0, -1], [4, -5], [2, 2]], np.int32)  # -1 is row 4, -5 row 0
    y = rng.standard_normal((3, 2, 3)).astype(np.float32)
    model.fit(ids, y, batch_size=3, verbose=0)
    grad = np.zeros((5, 3))
    np.add.at(grad, ids % 5, 2 * (table[ids].astype(np.float64) - y) / y.size)
    np.testing.assert_allclose(model.get_weights()[0], table - 0.5 * grad, rtol=1e-6, atol=1e-7)


def test_dropout_is_identity_in_predict(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    _, out = predict_one(L.Dropout(0.5), x)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ot.OrtrainError, match="Dropout\\(rate=...\\): expected a number in \\[0, 1\\)"):
        L.Dropout(1.0)


def test_flatten_reshape_add_concatenate(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(predict_one(L.Flatten(), x)[1], x.reshape(2, 12))
    np.testing.assert_array_equal(predict_one(L.Reshape((4, -1)), x)[1], x.reshape(2, 4, 3))
    a, b = ot.Input((3,)), ot.Input((3,))
    model = ot.Model([a, b], [L.Add()([a, b]), L.Concatenate()([a, b])])
    u, v = rng.standard_normal((2, 2, 3)).astype(np.float32)
    s, c = model.predict([u, v])
    np.testing.assert_array_equal(s, u + v)
    np.testing.assert_array_equal(c, np.concatenate([u, v], axis=1))


def test_keras_channel_axis_acts_on_the_channels_of_images(tmp_path, rng):
    # Keras' channels-last last axis is its channels: a conv's softmax normalised the image width,
    # and Concatenate() joined widths, so a ported U-Net built another network without an error
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    for act, ref in (("softmax", lambda z: softmax(z, axis=1)), ("log_softmax", lambda z: np.log(softmax(z, axis=1)))):
        model, out = predict_one(L.Conv2D(3, 1, activation=act), x)
        k, b = model.get_weights()
        z = np.einsum("oi,nihw->nohw", k[:, :, 0, 0], x) + b[None, :, None, None]
        np.testing.assert_allclose(out, ref(z), rtol=1e-5, atol=1e-6)
    up, skip = ot.Input((4, 5, 6)), ot.Input((3, 5, 6))
    joined = L.Concatenate()([up, skip])
    assert joined.shape == (None, 7, 5, 6)
    head = L.Conv2D(2, 1)
    unet = ot.Model([up, skip], head(joined))
    assert head.get_weights()[0].shape == (2, 7, 1, 1)
    u, v = x, rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    k, b = head.get_weights()
    np.testing.assert_allclose(unet.predict([u, v]), np.einsum("oi,nihw->nohw", k[:, :, 0, 0],
                                                               np.concatenate([u, v], 1)) + b[None, :, None, None],
                               rtol=1e-5, atol=1e-6)
    unet.save(tmp_path / "u.ortrain")
    np.testing.assert_array_equal(ot.load_model(tmp_path / "u.ortrain").predict([u, v]), unet.predict([u, v]))
    with pytest.raises(ot.ShapeError, match=r"Concatenate\(\) \(axis 1: the channels of images\) needs equal sizes "
                                            r"off the axis, .*; give the axis to join, e.g. Concatenate\(axis=-1\)"):
        L.Concatenate()([up, ot.Input((4, 5, 7))])   # a channels-last port: the message names the axis joined
    with pytest.raises(ot.ShapeError, match=r"Concatenate\(axis=-4\): axis -4 of inputs of rank 4 is the batch; "
                                            r"choose a feature axis"):
        L.Concatenate(axis=-4)([up, up])
    a, c = ot.Input((2, 3)), ot.Input((2, 3))
    assert L.Concatenate()([a, c]).shape == (None, 2, 6)              # other tensors: the last axis
    assert L.Concatenate(axis=-1)([up, up]).shape == (None, 4, 5, 12)  # an axis given is the axis


def test_a_conv_softmax_saved_before_it_took_the_channels_loads_as_saved(tmp_path, rng):
    import json
    import warnings
    import zipfile
    x = rng.standard_normal((2, 1, 4, 5)).astype(np.float32)
    model = ot.Sequential([L.Conv2D(3, 1, activation="softmax")], input_shape=(1, 4, 5), seed=0)
    model.save(tmp_path / "new.ortrain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(ot.load_model(tmp_path / "new.ortrain").predict(x), model.predict(x))
    with zipfile.ZipFile(tmp_path / "new.ortrain") as z:   # a file from before: no softmax_axis
        parts = {n: z.read(n) for n in z.namelist()}
    record = json.loads(parts["model.json"])
    del record["layers"][0]["softmax_axis"]
    with zipfile.ZipFile(tmp_path / "old.ortrain", "w") as z:
        for name, data in {**parts, "model.json": json.dumps(record)}.items():
            z.writestr(name, data)
    with pytest.warns(UserWarning, match="normalised their softmax over the image width; it loads as saved"):
        old = ot.load_model(tmp_path / "old.ortrain")
    k, b = model.get_weights()
    z = np.einsum("oi,nihw->nohw", k[:, :, 0, 0], x) + b[None, :, None, None]
    np.testing.assert_allclose(old.predict(x), softmax(z, axis=-1), rtol=1e-5, atol=1e-6)
    conv = model.layers[0]
    assert type(conv)(**conv.get_config()).get_config() == conv.get_config()   # Keras' cls(**get_config())
    old.save(tmp_path / "again.ortrain")   # saved again, it keeps that axis, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(ot.load_model(tmp_path / "again.ortrain").predict(x), old.predict(x))


def test_permute_and_a_per_pixel_classifier_against_torch(rng):
    torch = torch_or_skip()
    F = torch.nn.functional
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    np.testing.assert_array_equal(predict_one(L.Permute((2, 3, 1)), x)[1], x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(predict_one(L.Permute((3, 1, 2)), x)[1], x.transpose(0, 3, 1, 2))
    for dims in ((2, 3), (0, 1, 2), (1, 1, 2), (), "21"):
        with pytest.raises(ot.OrtrainError, match="Permute\\(dims=...\\): expected a permutation of 1 .. n"):
            L.Permute(dims)
    with pytest.raises(ot.ShapeError, match="Permute\\(dims=\\(2, 1\\)\\) reorders 2 non-batch axes; its input "):
        predict_one(L.Permute((2, 1)), x)
    seg = ot.Sequential([L.Conv2D(3, 1, activation="softmax")], input_shape=(4, 5, 6), seed=0)
    seg.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(ot.ShapeError, match=r"For a class per pixel of a \(batch, channels, height, width\) "
                                            r"prediction, put the classes last with ot.layers.Permute\(\(2, 3, 1\)\)"):
        seg.fit(x, rng.integers(0, 3, (2, 5, 6)), verbose=0)
    # classes on the last axis, labels (batch, height, width): PyTorch's cross-entropy over dim 1
    model = ot.Sequential([L.Conv2D(3, 3, padding="same"), L.Permute((2, 3, 1))], input_shape=(4, 5, 6), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    y = rng.integers(0, 3, (2, 5, 6))
    k, b = (torch.tensor(w, requires_grad=True) for w in model.get_weights())
    with ot.Trainer(model, batch_size=2) as tr:
        ours = [tr.step(x, y) for _ in range(2)]
        trained = tr.model().get_weights()
    opt = torch.optim.SGD([k, b], lr=0.5)
    ref = []
    for _ in range(2):
        loss = F.cross_entropy(F.conv2d(torch.tensor(x), k, b, padding=1), torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    for got, want in zip(trained, (k, b)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_conv_and_pools_against_torch(rng):
    torch = torch_or_skip()
    F = torch.nn.functional
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    for padding, tpad in (("valid", 0), ("same", 1)):
        model, out = predict_one(L.Conv2D(4, 3, padding=padding, strides=1), x)
        k, b = (torch.tensor(w) for w in model.get_weights())
        np.testing.assert_allclose(out, F.conv2d(torch.tensor(x), k, b, padding=tpad).numpy(), rtol=1e-4,
                                   atol=1e-5)
    model, out = predict_one(L.Conv2D(2, (3, 2), strides=2, padding="same"), x)
    k, b = (torch.tensor(w) for w in model.get_weights())
    ref = F.conv2d(F.pad(torch.tensor(x), (0, 1, 1, 1)), k, b, stride=2)  # TF-style SAME: extra pad at the end
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(predict_one(L.MaxPool2D(2), x)[1], F.max_pool2d(torch.tensor(x), 2).numpy())
    np.testing.assert_allclose(predict_one(L.AvgPool2D(3, strides=2, padding="same"), x)[1],
                               F.avg_pool2d(torch.tensor(x), 3, 2, padding=1, count_include_pad=False).numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict_one(L.GlobalAvgPool2D(), x)[1], x.mean((2, 3)), rtol=1e-5, atol=1e-6)


def test_cnn_training_matches_torch(rng):
    """Conv + batch norm (batch statistics) + pools + dense: three SGD steps give PyTorch's losses."""
    torch = torch_or_skip()
    F = torch.nn.functional
    model = ot.Sequential([L.Conv2D(4, 3, padding="same", activation="relu"), L.BatchNorm(), L.MaxPool2D(2),
                           L.Conv2D(6, 3), L.AvgPool2D(3, strides=1, padding="same"), L.GlobalAvgPool2D(),
                           L.Dense(3)], input_shape=(2, 10, 10), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.standard_normal((8, 2, 10, 10)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    w = [torch.tensor(a, requires_grad=True) for a in model.get_weights()]
    k1, b1, g, bt, rm, rv, k2, b2, dk, db = w
    with ot.Trainer(model, batch_size=8) as tr:
        ours = [tr.step(x, y) for _ in range(3)]
        trained = tr.model().get_weights()
    opt = torch.optim.SGD([k1, b1, g, bt, k2, b2, dk, db], lr=0.1)
    ref = []
    for _ in range(3):
        h = F.relu(F.conv2d(torch.tensor(x), k1, b1, padding=1))
        h = F.batch_norm(h, None, None, g, bt, training=True, eps=1e-3)
        h = F.avg_pool2d(F.conv2d(F.max_pool2d(h, 2), k2, b2), 3, 1, padding=1, count_include_pad=False)
        loss = F.cross_entropy(h.mean((2, 3)) @ dk + db, torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    for got, want in zip([trained[i] for i in (0, 1, 2, 3, 6, 7, 8, 9)], [k1, b1, g, bt, k2, b2, dk, db]):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_layer_argument_errors():
    with pytest.raises(ot.OrtrainError, match="Dense\\(units=...\\): expected a positive int, received 0"):
        L.Dense(0)
    with pytest.raises(ot.OrtrainError, match="activation: expected one of"):
        L.Dense(2, activation="swishy")
    with pytest.raises(ot.OrtrainError, match="Conv2D\\(padding=...\\): expected 'valid' or 'same'"):
        L.Conv2D(2, 3, padding="full")
    with pytest.raises(ot.ShapeError, match="Conv2D expects \\(batch, channels, height, width\\)"):
        ot.Sequential([L.Conv2D(2, 3)], input_shape=(5,))
    with pytest.raises(ot.ShapeError, match="Add needs inputs whose sizes agree or are 1"):
        a, b = ot.Input((3,)), ot.Input((4,))
        L.Add()([a, b])
    with pytest.raises(ot.OrtrainError, match="takes int64 inputs.*dtype='int64'"):
        L.Embedding(3, 2)(ot.Input((2,)))
    with pytest.raises(ot.OrtrainError, match=r"^Reshape\(target_shape=\(5,\)\) cannot hold its input "
                       r"\(N, 4\): 4 values a sample, the target holds 5; give a target_shape whose sizes multiply "
                       r"to 4 \(one of them may be -1\)"):
        ot.Sequential([L.Reshape((5,))], input_shape=(4,))
    with pytest.raises(ot.OrtrainError, match=r"4 values a sample, not a multiple of 3"):
        ot.Sequential([L.Reshape((-1, 3))], input_shape=(4,))
    with pytest.raises(ot.ShapeError, match="Conv2D kernel \\(3, 3\\) does not fit input \\(N, 1, 2, 2\\)"):
        ot.Sequential([L.Conv2D(2, 3)], input_shape=(1, 2, 2))
    for pool in (L.MaxPool2D, L.AvgPool2D):
        with pytest.raises(ot.ShapeError, match=f"{pool.__name__} pool_size \\(4, 4\\) does not fit input "
                                                "\\(N, 1, 2, 2\\): expected .*; use a smaller pool_size or padding='same'"):
            ot.Sequential([pool(4)], input_shape=(1, 2, 2))
        assert ot.Sequential([pool(4, padding="same")], input_shape=(1, 2, 2)).output_specs[0].shape == (None, 1, 1, 1)



@pytest.mark.parametrize("layer", [lambda: L.Conv2D(4, 3), lambda: L.MaxPool2D(2), lambda: L.AvgPool2D(3)])
def test_channels_last_images_are_named_with_the_fix(layer, rng):
    """Keras' default layout, (height, width, channels), reaches a window over a width of 1: the error
    says the images look channels last and gives the shape and transpose that work, and they do."""
    with pytest.raises(ot.ShapeError, match=r"does not fit input \(N, 8, 8, 1\): expected \(batch, channels, height, "
                       r"width\).*its last axis \(1\) looks like the channels.*input_shape=\(1, 8, 8\) and the "
                       r"images as x\.transpose\(0, 3, 1, 2\)"):
        ot.Sequential([layer()], input_shape=(8, 8, 1))
    x_last = rng.random((2, 8, 8, 1), dtype=np.float32)
    model = ot.Sequential([layer()], input_shape=(1, 8, 8), seed=0)
    assert model.predict(x_last.transpose(0, 3, 1, 2)).shape[:2] == (2, model.output_specs[0].shape[1])
    with pytest.raises(ot.ShapeError, match="use a smaller") as info:  # a channels-first image too small
        ot.Sequential([layer()], input_shape=(3, 1, 8))
    assert "channels last" not in str(info.value)

def test_reshape_with_a_free_size_runs_on_zero_rows(tmp_path, rng):
    import onnxruntime as ort
    model = ot.Sequential([L.Reshape((2, -1)), L.Flatten(), L.Dense(2)], input_shape=(8,), seed=0)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w, b = model.get_weights()
    np.testing.assert_allclose(model.predict(x), x @ w + b, rtol=1e-5, atol=1e-6)
    assert model.predict(x[:0]).shape == (0, 2)
    model.export_onnx(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"input": x[:0]})[0].shape == (0, 2)


def test_a_refused_layer_call_leaves_the_layer_as_it_was():
    add = L.Add()
    a, b = ot.Input((3,)), ot.Input((4,))
    with pytest.raises(ot.ShapeError, match="Add needs inputs whose sizes agree or are 1"):
        add([a, b])
    assert add([a, ot.Input((3,))]).shape == (None, 3)  # it was left built for the refused shapes
    conv = L.Conv2D(2, 6)
    with pytest.raises(ot.ShapeError, match="does not fit"):
        conv(ot.Input((3, 5, 5)))
    assert conv.weights == {} and conv(ot.Input((3, 8, 8))).shape == (None, 2, 3, 3)


def test_same_padding_needs_known_sizes_where_its_pads_depend_on_them():
    free = ot.Input((3, None, None))
    with pytest.raises(ot.ShapeError, match=r"^MaxPool2D\(padding='same', strides=\(2, 2\)\) needs a known height "
                                            r"\(its pads depend on the size at a stride above 1\)"):
        L.MaxPool2D(2, padding="same")(free)
    with pytest.raises(ot.ShapeError, match=r"^Conv2D\(padding='same', strides=\(1, 2\)\) needs a known width"):
        L.Conv2D(2, 3, strides=(1, 2), padding="same")(ot.Input((3, 5, None)))
    with pytest.raises(ot.ShapeError, match=r"^AvgPool2D\(padding='same'\) needs a known height and width \(the "
                                            r"padded cells are left out"):
        L.AvgPool2D(2, strides=1, padding="same")(free)
    assert L.MaxPool2D(3, strides=1, padding="same")(free).shape == (None, 3, None, None)


@pytest.mark.parametrize("padding", ["valid", "same", "SAME"])
def test_conv2d_takes_free_image_sizes_as_pytorch(padding, tmp_path):
    # Conv2D refused any free height or width ("inputs with known sizes"), where Conv2DTranspose, the
    # valid pools and Keras' Conv2D take them; "SAME" was refused where Keras lowercases it
    torch = torch_or_skip()
    rng = np.random.default_rng(0)
    image = ot.Input((2, None, None))
    conv = L.Conv2D(3, (2, 3), padding=padding)
    model = ot.Model(image, L.GlobalAvgPool2D()(conv(image)))
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    w0, b0 = model.get_weights()
    assert conv.padding == padding.lower()
    for size in ((6, 5), (3, 4)):
        x = rng.standard_normal((2, 2, *size)).astype(np.float32)
        y = rng.standard_normal((2, 3)).astype(np.float32)
        model.set_weights([w0, b0])
        predicted = model.predict(x)
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
        w = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
        b = torch.tensor(b0, dtype=torch.float64, requires_grad=True)
        xt = torch.tensor(x, dtype=torch.float64)
        if padding != "valid":  # TensorFlow's same at stride 1: the odd pad at the end (1 row, 0 + 2 columns)
            xt = torch.nn.functional.pad(xt, (1, 1, 0, 1))
        out = torch.nn.functional.conv2d(xt, w, b).mean(dim=(2, 3))
        ((out - torch.tensor(y, dtype=torch.float64)) ** 2).mean().backward()
        np.testing.assert_allclose(predicted, out.detach().numpy(), atol=1e-6)
        np.testing.assert_allclose(model.get_weights()[0], (w - 0.1 * w.grad).detach().numpy(), atol=1e-6)
    session = ort.InferenceSession(model.export_onnx(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, 2, 9, 7)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], model.predict(x), atol=1e-6)


def test_numbers_are_numpy_or_python_and_nothing_else():
    assert L.Dropout(np.float32(0.5)).rate == 0.5
    assert ot.losses.Huber(np.float32(2.0)).delta == 2.0
    assert ot.optim.Adam(eps=np.float32(1e-7)).eps == pytest.approx(1e-7)
    for bad in (lambda: L.BatchNorm(momentum="0.9"), lambda: ot.Input(3.0), lambda: ot.Input((True,)),
                lambda: L.Concatenate(axis=1.7), lambda: L.Concatenate(axis=True), lambda: L.Dropout(True)):
        with pytest.raises(ot.OrtrainError, match="expected"):
            bad()


def test_a_0d_array_is_a_number():
    assert L.BatchNorm(momentum=np.array(0.9)).momentum == pytest.approx(0.9)


@pytest.mark.parametrize("make, message", [
    (lambda: L.Conv2D(4, kernel_size=3.0), r"Conv2D\(kernel_size=...\): expected a positive int or 2 positive ints, "
                                           r"received 3.0"),
    (lambda: L.Conv2D(4, kernel_size=None), r"Conv2D\(kernel_size=...\): expected .* received None"),
    (lambda: L.Conv2D(4, 3, strides=True), r"Conv2D\(strides=...\): expected .* received True"),
    (lambda: L.MaxPool2D(pool_size=2.0), r"MaxPool2D\(pool_size=...\): expected .* received 2.0"),
    (lambda: L.AvgPool2D(2, strides=1.0), r"AvgPool2D\(strides=...\): expected .* received 1.0"),
    (lambda: L.LayerNorm(epsilon="1e-5"), r"LayerNorm\(epsilon=...\): expected a positive finite number"),
    (lambda: L.LayerNorm(epsilon=float("inf")), r"LayerNorm\(epsilon=...\): expected a positive finite number"),
    (lambda: L.BatchNorm(epsilon=float("inf")), r"BatchNorm\(epsilon=...\): expected a positive finite number"),
    (lambda: L.Dense(3, seed=-1), r"Dense\(seed=...\): expected an int >= 0 or None, received -1"),
    (lambda: L.Dense(3, seed="a"), r"Dense\(seed=...\): expected an int >= 0 or None, received 'a'"),
    # a graph's seed is an int64: the fit failed in onnx with "Value out of range"
    (lambda: L.Dropout(0.5, seed=2**63), r"Dropout\(seed=...\): expected an int from 0 to 2\*\*63 - 1 or None, "
                                         r"received 9223372036854775808; pass a smaller seed"),
    (lambda: ot.Sequential([L.Dense(2)], input_shape=(3,), seed=1.5), r"Sequential\(seed=...\): expected an int"),
    (lambda: ot.Sequential(L.Dense(2), input_shape=(3,)), r"Sequential\(layers=...\): expected a list of layers, "
                                                          r"received Dense; wrap a single layer in a list"),
    (lambda: ot.Input((4,), dtype="floatt"), r"Input\(dtype=...\): expected 'float32' or 'int64', received 'floatt'"),
    (lambda: ot.Input((4,), dtype="int32"), r"expected 'float32' or 'int64', received 'int32'; declare integer inputs "
     r"\(token ids for an Embedding\) as 'int64': data of other integer types is cast"),
    (lambda: ot.Input((4,), dtype=np.float64), r"received <class 'numpy.float64'>; declare float inputs as 'float32'"),
    (lambda: ot.Input((4,), name=3), r"Input\(name=...\): expected a non-empty string, received 3"),
    (lambda: L.Reshape((1.9, 8)), r"Reshape\(target_shape=...\): expected a tuple of ints, received \(1.9, 8\)"),
    (lambda: L.Reshape("28"), r"Reshape\(target_shape=...\): expected a tuple of ints, received '28'"),
    (lambda: L.Reshape((True, 6)), r"Reshape\(target_shape=...\): expected a tuple of ints"),
])
def test_bad_layer_and_model_arguments_get_clear_errors(make, message):
    # each raised a raw TypeError/ValueError, or was taken as another value (Reshape((1.9, 8)) -> (1, 8))
    with pytest.raises(ot.OrtrainError, match=message):
        make()


def test_numpy_int_shapes_build_save_and_export(tmp_path, rng):
    # a shape of numpy ints was taken, then predict, export and save failed on it in onnx and json
    inp = ot.Input((np.prod((2, 2)),))
    model = ot.Model(inp, L.Dense(np.int32(3), seed=0)(inp))
    assert all(type(d) is int for d in model.input_specs[0].shape[1:])
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w, b = model.get_weights()
    np.testing.assert_allclose(model.predict(x), x @ w + b, rtol=1e-6)
    model.save(tmp_path / "m.ortrain")
    np.testing.assert_array_equal(ot.load_model(tmp_path / "m.ortrain").predict(x), model.predict(x))
    model.export_onnx(tmp_path / "m.onnx")


def test_the_same_input_listed_twice_is_refused():
    # Keras refuses it; here the first array was silently ignored
    a = ot.Input((3,))
    out = L.Dense(2)(a)
    with pytest.raises(ot.OrtrainError, match=r"Model\(inputs=...\): inputs 0 and 1 are the same ot.Input"):
        ot.Model([a, a], out)


def test_summary_lists_a_shared_layer_once():
    a, b = ot.Input((4,)), ot.Input((4,))
    shared = L.Dense(5, name="shared")
    model = ot.Model([a, b], L.Dense(1)(L.Add()([shared(a), shared(b)])))
    lines = []
    model.summary(print_fn=lines.append)
    assert [line.split()[0] for line in lines[1:-1]] == ["shared", "add_0", "dense_0"]
    assert lines[-1].startswith("Total params: 31 ")
    assert sum(int(line.split()[-1]) for line in lines[1:-1]) == 31
    with pytest.raises(ot.OrtrainError, match=r"summary\(print_fn=...\): expected a function"):
        model.summary(print_fn=None)


def test_layer_weights_are_read_only_and_set_weights_reaches_predict_and_the_cache(tmp_path, rng):
    # an in-place edit of layer.weights showed in get_weights, while predict and artifacts.build
    # (a cache hit) kept the old values
    model = ot.Sequential([L.Dense(2, seed=0)], input_shape=(3,))
    model.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((4, 3)).astype(np.float32)
    before = model.predict(x)
    layer = model.layers[0]
    with pytest.raises(ValueError, match="read-only"):
        layer.weights["kernel"][:] = 7
    np.testing.assert_array_equal(model.predict(x), before)
    first = ot.artifacts.build(model, loss="mse", optimizer="sgd")
    kernel = np.full((3, 2), 7, np.float32)
    layer.set_weights([kernel, np.zeros(2, np.float32)])  # as Keras' layer.set_weights
    np.testing.assert_allclose(model.predict(x), x @ kernel, rtol=1e-6)
    np.testing.assert_array_equal(layer.get_weights()[0], kernel)
    second = ot.artifacts.build(model, loss="mse", optimizer="sgd")
    assert second.directory != first.directory  # other weights: another cache entry
    with pytest.raises(ot.ShapeError, match=r"set_weights: dense_0.kernel expected shape \(3, 2\), received \(2, 3\)"):
        layer.set_weights([kernel.T, np.zeros(2, np.float32)])
    with pytest.raises(ot.OrtrainError, match=r"set_weights: layer 'dense_0' expected a list of 2 arrays "
                                              r"\(kernel, bias\), received 1 array"):
        layer.set_weights([kernel])
    with pytest.raises(ot.OrtrainError, match=r"expected a list of 2 arrays \(kernel, bias\), received a ndarray"):
        layer.set_weights(kernel)
    with pytest.raises(ot.ShapeError, match=r"set_weights: dense_0.kernel: expected a numeric array"):
        layer.set_weights([np.full((3, 2), "a"), np.zeros(2)])
    np.testing.assert_array_equal(layer.get_weights()[0], kernel)
    # assigning into the dict is a set too: predict sees it, a wrong shape is refused, the caller's array stays its own
    mine = np.ones((3, 2), np.float32)
    layer.weights["kernel"] = mine
    np.testing.assert_allclose(model.predict(x), x @ mine, rtol=1e-6)
    assert mine.flags.writeable
    with pytest.raises(ot.ShapeError, match=r"dense_0.kernel: expected shape \(3, 2\), received \(2, 3\)"):
        layer.weights["kernel"] = mine.T
    np.testing.assert_array_equal(layer.get_weights()[0], mine)


def test_an_input_named_like_a_generated_node_runs(rng):
    # "dense_0/gemm_0" is the name ortrain gives the first Dense's product: it was generated again,
    # and every predict failed with onnxruntime's "Duplicate definition of name"
    inp = ot.Input((3,), name="dense_0/gemm_0")
    model = ot.Model(inp, L.Dense(2, seed=0)(inp))
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w, b = model.get_weights()
    np.testing.assert_allclose(model.predict(x), x @ w + b, rtol=1e-6)


def test_sequential_takes_any_iterable_of_layers_and_reshape_an_int_array():
    model = ot.Sequential((lyr for lyr in [L.Dense(6), L.Reshape(np.array([2, 3]))]), input_shape=(3,))
    assert model.output_specs[0].shape == (None, 2, 3)


def test_layer_weights_keep_their_rules_through_dict_methods_and_copies(rng):
    import copy
    import pickle
    model = ot.Sequential([L.Dense(3, seed=0), L.Dense(2, seed=1)], input_shape=(4,))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    layer = model.layers[0]
    layer.weights |= {"bias": np.ones(3)}  # float64 in, a read-only float32 copy stored, predict sees it
    assert layer.weights["bias"].dtype == np.float32 and not layer.weights["bias"].flags.writeable
    w, b = layer.get_weights()
    w2, b2 = model.layers[1].get_weights()
    np.testing.assert_allclose(model.predict(x), (x @ w + b) @ w2 + b2, rtol=1e-5)
    for remove in (lambda: layer.weights.pop("bias"), lambda: layer.weights.clear(),
                   lambda: layer.weights.__delitem__("bias")):
        with pytest.raises(ot.OrtrainError, match="weights of layer 'dense_0' cannot be removed"):
            remove()
    with pytest.raises(ot.OrtrainError, match=r"dense_0.extra: the built layer has no weight 'extra' \(it has kernel, "
                                              r"bias\)"):
        layer.weights.setdefault("extra", np.ones(2))
    # a deep copy or a pickle of the model keeps the rules: its layer's set_weights reaches its predict
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        copied = other.layers[0]
        assert not copied.weights["kernel"].flags.writeable
        copied.set_weights([np.zeros((4, 3)), np.zeros(3)])
        np.testing.assert_allclose(other.predict(x), np.broadcast_to(b2, (2, 2)), rtol=1e-6)
        np.testing.assert_allclose(model.predict(x), (x @ w + b) @ w2 + b2, rtol=1e-5)  # the original untouched
    with pytest.raises(ot.OrtrainError, match=r"layer 'dense_0': weights cannot be replaced as a whole"):
        layer.weights = [np.zeros((4, 3)), np.zeros(3)]


@pytest.mark.torch
@pytest.mark.parametrize("name, torch_name", [
    ("elu", "elu"), ("selu", "selu"), ("softplus", "softplus"), ("softsign", "softsign"), ("silu", "silu"),
    ("swish", "silu"), ("hard_sigmoid", "hardsigmoid"), ("hard_swish", "hardswish"), ("relu6", "relu6"),
    ("exponential", "exp"), ("mish", "mish"), ("log_softmax", "log_softmax")])
def test_more_keras_activations_train_and_export_as_pytorch_computes_them(rng, tmp_path, name, torch_name):
    torch = torch_or_skip()
    F = torch.nn.functional
    fn = (lambda z: F.log_softmax(z, -1)) if torch_name == "log_softmax" else \
        torch.exp if torch_name == "exp" else getattr(F, torch_name)
    x = (rng.standard_normal((8, 4)) * 3).astype(np.float32)
    x[0] = 0.0   # the biases start at 0: row 0 sits on every kink at 0
    y = rng.standard_normal((8, 3)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(3, activation=name)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    w, b = (torch.tensor(a, requires_grad=True) for a in model.get_weights())
    out = fn(torch.from_numpy(x) @ w + b)
    loss = F.mse_loss(out, torch.from_numpy(y))
    loss.backward()
    np.testing.assert_allclose(model.predict(x), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    with ot.Trainer(model, batch_size=8) as tr:
        np.testing.assert_allclose(tr.step(x, y), loss.item(), rtol=1e-5)
        got = tr.model().get_weights()
    np.testing.assert_allclose(got[0], (w - 0.1 * w.grad).detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], (b - 0.1 * b.grad).detach().numpy(), rtol=1e-5, atol=1e-6)
    session = ort.InferenceSession(model.export_onnx(tmp_path / "m.onnx"))   # stock onnxruntime runs the export
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], model.predict(x),
                               rtol=1e-5, atol=1e-6)


# 0 and both tails: onnxruntime's Sigmoid kernel was 47% off at -16 and 0 from -18 (2e-9 at -20)
SIGMOID_GRID = np.concatenate([np.linspace(-100, 100, 401), [-1e30, 1e30]]).astype(np.float32)


def _one_step_on_the_grid(torch, name, fn, tmp_path):
    """Predictions of ``name`` on SIGMOID_GRID and its bias after one SGD step (lr 1) on
    ``mean |act(x) - 2|``, in ortrain and in PyTorch float64. A Dense holding the identity feeds the
    grid through unrounded; the step moves its zero bias to ``act'(x) / n``, each element's own."""
    x, n = SIGMOID_GRID[None], SIGMOID_GRID.size
    model = ot.Sequential([L.Dense(n, activation=name)], input_shape=(n,))
    model.set_weights([np.eye(n), np.zeros(n)])
    model.compile(optimizer=ot.optim.SGD(lr=1.0), loss="mae")
    predicted = model.predict(x)
    session = ort.InferenceSession(model.export_onnx(tmp_path / "m.onnx"))  # stock onnxruntime runs the export
    # stock onnxruntime computes subnormals, which ortrain flushes to 0
    np.testing.assert_array_equal(flushed(session.run(None, {session.get_inputs()[0].name: x})[0]), predicted)
    model.fit(x, np.full_like(x, 2.0), batch_size=1, epochs=1, verbose=0)
    bias = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    out = fn(torch.from_numpy(x).double() + bias)
    torch.nn.functional.l1_loss(out, torch.full_like(out, 2.0)).backward()
    torch.optim.SGD([bias], lr=1.0).step()
    return predicted, model.get_weights()[1], out.detach().numpy(), bias.detach().numpy()


@pytest.mark.torch
def test_sigmoid_is_exact_in_both_tails_as_pytorch_in_float64(tmp_path):
    torch = torch_or_skip()
    predicted, bias, want, want_bias = _one_step_on_the_grid(torch, "sigmoid", torch.sigmoid, tmp_path)
    np.testing.assert_allclose(predicted, flushed(want), rtol=1e-6, atol=1e-40)  # subnormals below -87: 0
    # PyTorch's float64 s (1 - s) is off by up to 1.1e-16 where s rounds to 1: from 0 up, the
    # derivative is checked as the even function it is (the grid's line is symmetric)
    below, line = SIGMOID_GRID <= 0, bias[:-2]
    np.testing.assert_allclose(bias[below], flushed(want_bias[below]), rtol=1e-6, atol=1e-44)
    np.testing.assert_allclose(line, line[::-1], rtol=1e-6, atol=1e-44)
    extremes = np.array([[-np.inf, -1e30, -1e-30, 0.0, 1e-30, 1e30, np.inf]], np.float32)
    model = ot.Sequential([L.Activation("sigmoid")], input_shape=(7,))
    np.testing.assert_array_equal(model.predict(extremes), [[0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0]])


@pytest.mark.torch
def test_silu_keeps_the_sigmoid_kernel_within_its_bound(tmp_path):
    # docs/known-limits.md: times x, the kernel's error stays within 2e-7 of max(1, |x|), value and derivative.
    torch = torch_or_skip()
    predicted, bias, want, want_bias = _one_step_on_the_grid(torch, "silu", torch.nn.functional.silu, tmp_path)
    scale = np.maximum(1.0, np.abs(SIGMOID_GRID))
    assert np.all(np.abs(predicted - want) <= 2e-7 * scale)
    assert np.all(np.abs(bias - want_bias) <= 2e-7 * scale / SIGMOID_GRID.size)


def test_add_broadcasts_sizes_of_one_as_keras_merge_layers_do(rng):
    # A dueling network's value (batch, 1) plus its advantages (batch, 3); training matches PyTorch.
    torch = torch_or_skip()
    i = ot.Input((4,))
    h = ot.layers.Dense(8, activation="relu", seed=1)(i)
    model = ot.Model(i, ot.layers.Add()([ot.layers.Dense(1, seed=2)(h), ot.layers.Dense(3, seed=3)(h)]))
    assert model.output_shape == (None, 3)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 3)).astype(np.float32)
    w = [torch.tensor(a, requires_grad=True) for a in model.get_weights()]

    def net(t):
        hidden = torch.relu(t @ w[0] + w[1])
        return (hidden @ w[2] + w[3]) + (hidden @ w[4] + w[5])

    np.testing.assert_allclose(model.predict(x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(w, lr=0.1)
    with ot.Trainer(model, batch_size=16) as tr:
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            opt.step()
            assert tr.step(x, y) == pytest.approx(float(loss.detach()), rel=1e-5)
        for got, want in zip(tr.model().get_weights(), w):
            np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ot.ShapeError, match="Add needs inputs whose sizes agree or are 1"):
        ot.layers.Add()([ot.layers.Dense(2)(h), ot.layers.Dense(3)(h)])
    with pytest.raises(ot.ShapeError, match="Add needs inputs of one rank"):
        ot.layers.Add()([h, ot.layers.Reshape((2, 4))(h)])


def test_concatenate_on_the_last_axis_of_images_says_it_joins_their_width():
    # Keras' Concatenate(axis=-1) joins channels-last images' channels; here it is the width.
    a, b = ot.Input((3, 4, 4)), ot.Input((3, 4, 4))
    with pytest.warns(UserWarning, match="Concatenate\\(axis=-1\\) joins the width of images.*Concatenate\\(\\)"):
        joined = ot.layers.Concatenate(axis=-1)([a, b])
    assert joined.shape[1:] == (3, 4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ot.Model([a, b], joined).copy()  # said once, not again when a copy or a loaded model rebuilds it
        assert ot.layers.Concatenate(axis=3)([a, b]).shape[1:] == (3, 4, 8)  # the width, named as such
        assert ot.layers.Concatenate()([a, b]).shape[1:] == (6, 4, 4)
        assert ot.layers.Concatenate(axis=-1)([ot.Input((3,)), ot.Input((2,))]).shape[1:] == (5,)


@pytest.mark.parametrize("layer", ["BatchNorm", "LayerNorm"])
def test_the_smallest_normalisation_epsilon_taken_keeps_a_constant_feature_finite(layer):
    # an epsilon below 1.2e-38 was taken, flushed to 0 in the sessions, and a constant feature gave NaN
    x = np.ones((8, 3), np.float32)
    x[:, 1] = np.arange(8)
    m = ot.Sequential([getattr(ot.layers, layer)(epsilon=float(np.finfo(np.float32).tiny)), ot.layers.Dense(1)],
                      input_shape=(3,), seed=0)
    m.compile(optimizer="adam", loss="mse")
    with ot.Trainer(m, batch_size=8) as tr:
        assert np.isfinite(tr.step(x, np.zeros((8, 1), np.float32)))
        assert np.all(np.isfinite(tr.predict(x)))


def test_use_bias_takes_true_or_false_only():
    # Dense(use_bias="False") kept the bias: any truthy value was read as True
    for make in (lambda b: ot.layers.Dense(3, use_bias=b), lambda b: ot.layers.Conv2D(2, 3, use_bias=b),
                 lambda b: ot.layers.Conv2DTranspose(2, 3, use_bias=b)):
        with pytest.raises(ot.OrtrainError, match=r"\(use_bias=...\): expected True or False, received 'False'"):
            make("False")
    assert ot.Sequential([ot.layers.Dense(3, use_bias=np.False_)], input_shape=(2,)).weight_names() == \
        ["dense_0.kernel"]


def test_a_weight_too_large_to_hold_is_refused_with_its_size():
    # numpy's raw MemoryError ("Unable to allocate 29.1 TiB ... float64") or ValueError ("array is too big")
    for layer, shape in ((lambda: ot.layers.Dense(10**12, name="wide"), (4, 10**12)),
                         (lambda: ot.layers.Embedding(10**12, 4, name="wide"), (10**12, 4))):
        kind = "Dense" if shape[1] != 4 else "Embedding"
        with pytest.raises(ot.OrtrainError, match=rf"^layer 'wide' \({kind}\): a weight of shape {re.escape(str(shape))} holds "
                                                  r"4,000,000,000,000 numbers \(14,901\.2 GiB in float32\), which this "
                                                  r"machine cannot allocate"):
            ot.Sequential([layer()], input_shape=(4,), input_dtype="int64" if shape[1] == 4 else None)
    with pytest.raises(ot.OrtrainError, match=r"^a Dense layer: a weight of shape \(3, 1000000000000\)"):
        ot.Sequential([ot.layers.Dense(3), ot.layers.Dense(10**12)], input_shape=(4,))
    for norm in (ot.layers.BatchNorm, ot.layers.LayerNorm):  # numpy's raw MemoryError
        with pytest.raises(ot.OrtrainError, match=rf"^a {norm.__name__} layer: its weights for inputs "
                                                  r"\(N, 1000000000000\) are more than this machine can allocate"):
            ot.Sequential([norm()], input_shape=(10**12,))


def test_an_embedding_table_starts_uniform_as_keras_s_default():
    """Keras' RandomUniform(-0.05, 0.05) (what the docstring and README state), not PyTorch's N(0, 1)."""
    s = ot.Input((3,), dtype="int64")
    table = ot.Model(s, ot.layers.Embedding(2000, 64, seed=0)(s)).get_weights()[0]
    assert table.shape == (2000, 64) and table.dtype == np.float32
    assert -0.05 <= table.min() < -0.0499 and 0.0499 < table.max() <= 0.05
    assert abs(table.std() - 0.1 / np.sqrt(12)) < 2e-4 and abs(table.mean()) < 5e-4
    counts, _ = np.histogram(table, bins=10, range=(-0.05, 0.05))
    assert counts.min() > 0.95 * table.size / 10


def test_a_layer_of_the_user_s_that_gives_a_weight_no_role_is_refused_naming_the_fix():
    class Gain(ot.layers.Layer):
        def _build(self, input_shapes, rng):
            self.weights["gain"] = np.ones(input_shapes[0][-1], np.float32)  # no self.roles["gain"]

        def emit(self, ctx, inputs):
            return ctx.gb.op("Mul", [inputs[0], ctx.weight(self, "gain")])

    layer = Gain()
    with pytest.raises(ot.OrtrainError, match=re.escape("Gain._build: weight 'gain' has role None; expected one of "
                                                        "'trainable', 'frozen', 'buffer': set self.roles['gain'] = "
                                                        "'trainable'")):
        ot.Sequential([ot.layers.Dense(3), layer], input_shape=(4,), seed=0)
    assert layer.built_for is None and not layer.weights
