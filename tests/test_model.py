"""Models: functional graphs, weights, freezing, save/load, export."""

import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import torch_or_skip
from helpers import softmax

import ortrain as ot

L = ot.layers


def skip_model():
    inp = ot.Input((6,))
    h = L.Dense(8, activation="relu")(inp)
    a = L.Dense(8, activation="tanh")(h)
    b = L.Dense(8)(h)
    s = L.Add()([a, b, h])          # skip connection
    out = L.Dense(3, activation="softmax")(L.Concatenate()([s, inp]))
    model = ot.Model(inp, out, name="skip")
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="categorical_crossentropy", metrics=["accuracy"])
    return model


def numpy_forward(model, x):
    w = dict(zip(model.weight_names(), model.get_weights()))
    h = np.maximum(x @ w["dense_0.kernel"] + w["dense_0.bias"], 0)
    a = np.tanh(h @ w["dense_1.kernel"] + w["dense_1.bias"])
    b = h @ w["dense_2.kernel"] + w["dense_2.bias"]
    return softmax(np.concatenate([a + b + h, x], axis=1) @ w["dense_3.kernel"] + w["dense_3.bias"])


def test_functional_branches_and_skips(rng):
    model = skip_model()
    x = rng.standard_normal((7, 6)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), numpy_forward(model, x), rtol=1e-5, atol=1e-6)
    assert [lyr.name for lyr in model.layers] == ["dense_0", "dense_1", "dense_2", "add_0", "concatenate_0",
                                                  "dense_3"]
    assert model.weight_names() == [f"dense_{i}.{s}" for i in range(4) for s in ("kernel", "bias")]


def test_predict_any_rows_and_batches(rng):
    model = skip_model()
    x = rng.standard_normal((37, 6))  # float64 is cast
    full = model.predict(x)
    np.testing.assert_allclose(model.predict(x, batch_size=5), full, rtol=1e-6)
    assert model.predict(x[:0]).shape == (0, 3)
    with pytest.raises(ot.ShapeError, match="x: expected shape \\(N, 6\\), received \\(37, 5\\)"):
        model.predict(x[:, :5])
    with pytest.raises(ot.ShapeError, match="x: expected a numeric array castable to float32"):
        model.predict(np.array([["a"] * 6]))


def test_set_weights_list_dict_and_errors(rng):
    model = skip_model()
    names = model.weight_names()
    new = [rng.standard_normal(w.shape) for w in model.get_weights()]  # float64 is cast
    model.set_weights(new)
    for got, want in zip(model.get_weights(), new):
        np.testing.assert_array_equal(got, want.astype(np.float32))
    model.set_weights({"dense_3.bias": np.ones(3)})
    np.testing.assert_array_equal(model.get_weights()[-1], np.ones(3, np.float32))
    before = model.get_weights()
    with pytest.raises(ot.ShapeError, match="set_weights: 'dense_0.kernel' expected shape \\(6, 8\\)"):
        model.set_weights({"dense_0.bias": np.zeros(8), "dense_0.kernel": np.zeros((8, 6))})
    with pytest.raises(ot.OrtrainError, match=f"set_weights: expected {len(names)} arrays"):
        model.set_weights(new[:2])
    with pytest.raises(ot.OrtrainError, match="unknown weight names \\['nope'\\]"):
        model.set_weights({"nope": np.zeros(1)})
    for got, want in zip(model.get_weights(), before):  # nothing changed on error
        np.testing.assert_array_equal(got, want)


def test_export_onnx_runs_in_plain_inference_session(tmp_path, rng):
    model = ot.Sequential([L.Conv2D(3, 3, padding="same"), L.BatchNorm(), L.Dropout(0.5), L.Flatten(),
                           L.Dense(2, activation="softmax")], input_shape=(1, 5, 5), seed=0)
    model.set_weights({"batch_norm_0.running_mean": rng.standard_normal(3),
                       "batch_norm_0.running_var": rng.random(3) + 0.5})
    path = model.export_onnx(tmp_path / "m.onnx")
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version <= 10
    assert not any(n.op_type == "Dropout" and len(n.input) > 2 for n in proto.graph.node)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert not dims[0].HasField("dim_value")  # dynamic batch
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for rows in (1, 9):
        x = rng.standard_normal((rows, 1, 5, 5)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"input": x})[0], model.predict(x), rtol=1e-6, atol=1e-7)


def test_an_export_names_its_free_sizes_and_keeps_no_training_outputs(tmp_path, rng):
    # tract could not load an input size with neither a value nor a name; onnx2torch computed wrong
    # values from LayerNormalization's Mean and InvStdDev outputs, which only a gradient reads
    from onnx.reference import ReferenceEvaluator
    inp = ot.Input((None, 3))
    model = ot.Model(inp, L.Dense(2)(L.LayerNorm()(L.Dense(4)(inp))))
    proto = onnx.load(model.export_onnx(tmp_path / "m.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*proto.graph.input, *proto.graph.output]}
    assert dims == {"input": ["batch", "input_dim1", 3], "output": ["batch", 0, 2]}
    assert [len(n.output) for n in proto.graph.node if n.op_type == "LayerNormalization"] == [1]
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(ReferenceEvaluator(proto).run(None, {"input": x})[0], model.predict(x),
                               rtol=1e-5, atol=1e-6)
    again = ot.from_onnx(proto)   # re-imported, it trains (the gradient gets its outputs back)
    again.compile(optimizer="sgd", loss="mse")
    with ot.Trainer(again, batch_size=2) as tr:
        assert np.isfinite(tr.step(x, np.zeros((2, 5, 2))))


def test_input_names_a_training_graph_reserves_are_refused_with_the_fix(rng):
    # onnxruntime-training takes an input named x_grad for a gradient: the first step failed inside it
    from onnx import helper, numpy_helper
    for name in ("x_grad", "lazy_reset_grad", "w_grad.accumulation.buffer", "ortrain.label"):
        with pytest.raises(ot.OrtrainError, match=rf"Model: input name '{re.escape(name)}': .*; give "
                                                  r"ot.Input\(..., name=...\) another name"):
            inp = ot.Input((3,), name=name)
            ot.Model(inp, L.Dense(2)(inp))
    graph = helper.make_graph([helper.make_node("MatMul", ["x_grad", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x_grad", onnx.TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 2])],
                              [numpy_helper.from_array(np.ones((3, 2), np.float32), "W")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = ot.from_onnx(proto)   # imported and predicting, as before
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), x @ np.ones((3, 2)), rtol=1e-6)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.OrtrainError, match=r"input 'x_grad': onnxruntime-training reserves names ending in "
                                              r"'_grad' .*; give the input another name .*input_names="):
        ot.Trainer(model, batch_size=4)


def test_save_and_load_round_trip(tmp_path, rng):
    model = skip_model()
    model.freeze("dense_1")
    x = rng.standard_normal((16, 6)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
    with ot.Trainer(model, batch_size=16) as tr:
        for _ in range(3):
            tr.step(x, y)
        trained = tr.model()
        trained.train_state = tr.export_state()
    trained.save(tmp_path / "m.ortrain")
    loaded = ot.load_model(tmp_path / "m.ortrain")
    assert loaded.weight_names() == trained.weight_names()
    np.testing.assert_array_equal(loaded.predict(x), trained.predict(x))
    assert loaded.trainable_weight_names == trained.trainable_weight_names
    assert loaded.loss == trained.loss and loaded.optimizer.config() == trained.optimizer.config()
    assert loaded.metrics == ["accuracy"]
    assert loaded.train_state.step == 3
    for k, (m, v) in trained.train_state.moments.items():
        np.testing.assert_array_equal(loaded.train_state.moments[k][0], m)
        np.testing.assert_array_equal(loaded.train_state.moments[k][1], v)
    # Training resumes with the saved moments: same next loss as the trainer that never stopped.
    with ot.Trainer(trained, batch_size=16) as a, ot.Trainer(loaded, batch_size=16) as b:
        assert a.step(x, y) == b.step(x, y)
    (tmp_path / "junk").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ot.OrtrainError, match="is not a model saved by ortrain"):
        ot.load_model(tmp_path / "junk")
    with ot.Trainer(trained, batch_size=16) as tr:
        tr.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ot.OrtrainError, match="is a trainer checkpoint .* resume it with ot.Trainer.from_checkpoint"):
        ot.load_model(tmp_path / "ckpt")
    with pytest.raises(ot.OrtrainError, match="looks like a model file .*: open it with ot.load_model"):
        ot.Trainer.from_checkpoint(trained, tmp_path / "m.ortrain", batch_size=16)
    np.savez(tmp_path / "data.npz", x=x, y=y)  # a data file was called "a model file (model.save ...)"
    with pytest.raises(ot.OrtrainError, match=r"'.*data\.npz' is not an onnxruntime-training checkpoint \(missing the "
                       r"'ODTC' file identifier\); it is an \.npz of arrays \(data, or the weights of save_weights"):
        ot.Trainer.from_checkpoint(trained, tmp_path / "data.npz", batch_size=16)
    trained.export_onnx(tmp_path / "m.onnx")
    with pytest.raises(ot.OrtrainError, match="an ONNX model is opened with ot.from_onnx"):
        ot.load_model(tmp_path / "m.onnx")
    missing = tmp_path / "no-such-dir" / "m.ortrain"
    with pytest.raises(ot.OrtrainError, match="cannot write '.*m.ortrain': the directory '.*no-such-dir' does not "
                                              "exist; create it first"):
        model.save(missing)
    assert not missing.parent.exists()


def test_writing_files_checks_the_path_and_keeps_the_usual_permissions(tmp_path, monkeypatch):
    import json
    import stat
    import zipfile
    monkeypatch.chdir(tmp_path)
    model = skip_model()
    model.compile(optimizer="adam", loss="mse")
    old_umask = os.umask(0o022)
    try:
        model.save("m.ortrain")
        model.export_onnx("m.onnx")
        with ot.Trainer(model, batch_size=4) as tr:
            tr.save_checkpoint("m.ckpt")
    finally:
        os.umask(old_umask)
    for name in ("m.ortrain", "m.onnx", "m.ckpt"):   # readable by others, as open() would make them
        assert stat.S_IMODE(os.stat(name).st_mode) == 0o644
    (tmp_path / "file").write_text("")
    for write in (model.save, model.export_onnx):
        for path, message in ((None, "expected a file path"), ("", "expected a file path"),
                              (".", "it is a directory"), ("file/m", "'file' is a file, not a directory")):
            with pytest.raises(ot.OrtrainError, match=message):
                write(path)
    assert sorted(os.listdir(".")) == ["file", "m.ckpt", "m.onnx", "m.ortrain"]
    # a damaged model.json is the same clear error as a damaged zip
    with zipfile.ZipFile("m.ortrain") as z:
        parts = {n: z.read(n) for n in z.namelist()}
    record = json.loads(parts["model.json"])
    for damaged in ({k: v for k, v in record.items() if k != "kind"}, [1, 2]):
        with zipfile.ZipFile("bad.ortrain", "w") as z:
            for name, data in {**parts, "model.json": json.dumps(damaged)}.items():
                z.writestr(name, data)
        with pytest.raises(ot.OrtrainError, match="'bad.ortrain' (is damaged|is not a model saved by ortrain)"):
            ot.load_model("bad.ortrain")


def _saved_skip_model(path, rng):
    """The skip model, trained two Adam steps on ``(x, y)`` and saved to ``path``: ``model, x, y``."""
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)]
    model = skip_model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=4, verbose=0)
    model.save(path)
    return model, x, y


def test_a_saved_model_stores_its_arrays_uncompressed_and_files_deflated_before_still_load(tmp_path, rng):
    # deflating float32 weights saved about 15% of the file for ten times the time of a save
    import zipfile
    model, x, y = _saved_skip_model(tmp_path / "m.ortrain", rng)
    with zipfile.ZipFile(tmp_path / "m.ortrain") as z:
        kinds = {info.filename: info.compress_type for info in z.infolist()}
        parts = {n: z.read(n) for n in z.namelist()}
    assert kinds["weights.npz"] == kinds["optimizer.npz"] == zipfile.ZIP_STORED
    with zipfile.ZipFile(tmp_path / "old.ortrain", "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in parts.items():
            z.writestr(name, data)
    for path in ("m.ortrain", "old.ortrain"):
        loaded = ot.load_model(tmp_path / path)
        for got, want in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(got, want)
        got, want = loaded.optimizer.state(), model.optimizer.state()
        assert got["step"] == want["step"] == 2
        for name, moments in want["moments"].items():
            np.testing.assert_array_equal(got["moments"][name]["v"], moments["v"])


def test_load_model_refuses_a_damaged_optimizer_state_as_load_state_does(tmp_path, rng):
    # it was loaded, and the first fit then turned the weights to NaN or failed inside onnxruntime
    import io
    import json
    import zipfile
    model, x, y = _saved_skip_model(tmp_path / "m.ortrain", rng)
    with zipfile.ZipFile(tmp_path / "m.ortrain") as z:
        parts = {n: z.read(n) for n in z.namelist()}
    record = json.loads(parts["model.json"])
    moments = dict(np.load(io.BytesIO(parts["optimizer.npz"])))
    first = record["optimizer_order"][0].split("\x00")[0]

    def damaged(change_record=None, change_moments=None):
        rec, ms = json.loads(json.dumps(record)), dict(moments)
        (change_record or (lambda r: None))(rec)
        (change_moments or (lambda m: None))(ms)
        buf = io.BytesIO()
        np.savez(buf, **ms)
        path = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.ortrain"
        with zipfile.ZipFile(path, "w") as z:
            for name, data in {**parts, "model.json": json.dumps(rec), "optimizer.npz": buf.getvalue()}.items():
                z.writestr(name, data)
        return path

    def set_moment(i, value):
        return lambda ms: ms.__setitem__(f"m{i}", value)

    shape = moments["m0"].shape
    for path, said in [
            (damaged(change_moments=set_moment(1, -np.ones(shape, np.float32))),
             f"moment 'v' of '{first}' holds -1.0, where it needs values >= 0"),
            (damaged(change_moments=set_moment(0, np.zeros((3, 3, 3), np.float32))),
             f"moment 'm' of '{first}' is float32 of shape \\(3, 3, 3\\), where the weight is float32 of shape"),
            (damaged(change_moments=set_moment(0, np.zeros(shape))), f"moment 'm' of '{first}' is float64"),
            (damaged(lambda r: r["train_state"].__setitem__("step", -5)), "its training state's 'step' is -5"),
            (damaged(lambda r: r["train_state"].__setitem__("step", 2.5)), "its training state's 'step' is 2.5"),
            (damaged(lambda r: r["train_state"].__setitem__("n_steps", "7")), "its training state's 'n_steps' is '7'"),
            (damaged(lambda r: r["train_state"].__setitem__("lr", float("nan"))), "its learning rate is nan")]:
        with pytest.raises(ot.OrtrainError, match=f"load_model: '.*bad\\d.ortrain' is damaged: {said}"):
            ot.load_model(path)
    # NaN moments a diverged training leaves (beside EarlyStopping's restored weights, say) load as
    # saved, with a warning
    with pytest.warns(UserWarning, match=f"holds optimizer moments that are not finite \\('{first}'\\; training "
                                         "diverged before it was saved\\?\\): a fit from them gives NaN weights"):
        nan = ot.load_model(damaged(change_moments=set_moment(0, np.full(shape, np.nan, np.float32))))
    assert np.isnan(nan.train_state.moments[first][0]).all()
    again = ot.load_model(tmp_path / "m.ortrain")   # the file as written loads, and trains on as the original
    model.fit(x, y, batch_size=4, verbose=0)
    again.fit(x, y, batch_size=4, verbose=0)
    for a, b in zip(again.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_freeze_and_unfreeze(rng):
    model = skip_model()
    model.freeze(["dense_0", "dense_3.*"])
    assert model.trainable_weight_names == [f"dense_{i}.{s}" for i in (1, 2) for s in ("kernel", "bias")]
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)]
    before = dict(zip(model.weight_names(), model.get_weights()))
    with ot.Trainer(model, batch_size=8) as tr:
        tr.step(x, y)
        after = dict(zip(model.weight_names(), tr.model().get_weights()))
    for name in before:
        assert np.array_equal(before[name], after[name]) == (name.startswith(("dense_0", "dense_3")))
    model.unfreeze(model.layers[0])
    assert "dense_0.kernel" in model.trainable_weight_names
    with pytest.raises(ot.OrtrainError, match="freeze: 'conv\\*' matches no layer or weight"):
        model.freeze("conv*")


def test_freeze_bn_stats(rng):
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(1)], input_shape=(3,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    model.set_weights({"batch_norm_0.running_mean": np.full(4, 0.5), "batch_norm_0.running_var": np.full(4, 2.0)})
    x = rng.standard_normal((16, 3)).astype(np.float32)
    y = rng.standard_normal((16, 1)).astype(np.float32)
    model.freeze_bn_stats()
    with ot.Trainer(model, batch_size=16) as tr:
        loss = tr.step(x, y)
        stats = tr.model().get_weights()[4:6]
    np.testing.assert_array_equal(stats[0], np.full(4, 0.5, np.float32))  # not updated
    np.testing.assert_allclose(loss, model.evaluate(x, y)["loss"], rtol=1e-5)  # normalised by running stats
    model.unfreeze_bn_stats()
    with ot.Trainer(model, batch_size=16) as tr:
        tr.step(x, y)
        moved = tr.model().get_weights()[4]
    h = x @ model.get_weights()[0] + model.get_weights()[1]
    np.testing.assert_allclose(moved, 0.99 * 0.5 + 0.01 * h.mean(0), rtol=1e-5)  # momentum update


def test_unfreeze_bn_stats_keeps_a_frozen_layer_frozen(rng, tmp_path):
    # freeze(bn) fixes that layer's statistics, as Keras' trainable=False does; undoing the
    # model-wide freeze_bn_stats() must not train them again, before or after a save (also of a
    # file written before the two were told apart); unfreeze(bn) lets them train again.
    import json
    import zipfile
    bn = L.BatchNorm()
    model = ot.Sequential([L.Dense(4), bn, L.BatchNorm(), L.Dense(1)], input_shape=(3,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = (rng.standard_normal((16, 3)) * 3 + 2).astype(np.float32)
    y = rng.standard_normal((16, 1)).astype(np.float32)

    def moved(m):
        """Whether one step moves the running means of the two batch norms."""
        before = m.get_weights()
        with ot.Trainer(m, batch_size=16) as tr:
            tr.step(x, y)
            after = tr.model().get_weights()
        return [not np.array_equal(after[i], before[i]) for i in (4, 8)]

    model.freeze(bn)
    model.freeze_bn_stats()
    assert moved(model) == [False, False]
    model.unfreeze_bn_stats()
    model.save(tmp_path / "m.ortrain")
    with zipfile.ZipFile(tmp_path / "m.ortrain") as z:   # the same file as an older version wrote it
        files = {n: z.read(n) for n in z.namelist()}
    record = json.loads(files["model.json"])
    del record["layer_frozen_stats"]
    files["model.json"] = json.dumps(record).encode()
    with zipfile.ZipFile(tmp_path / "old.ortrain", "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    for m in (model, ot.load_model(tmp_path / "m.ortrain"), ot.load_model(tmp_path / "old.ortrain")):
        assert moved(m) == [False, True]
        m.freeze_bn_stats()
        m.unfreeze_bn_stats()
        assert moved(m) == [False, True]
    model.freeze_bn_stats()
    model.unfreeze(bn)   # unfreezing a layer trains its statistics again, whatever froze them
    assert moved(model) == [True, False]
    h = x @ model.get_weights()[0] + model.get_weights()[1]
    with ot.Trainer(model, batch_size=16) as tr:
        tr.step(x, y)
        np.testing.assert_allclose(tr.model().get_weights()[4], 0.99 * model.get_weights()[4] + 0.01 * h.mean(0),
                                   rtol=1e-5)


def test_sequential_may_start_with_an_input_as_in_keras(rng, tmp_path):
    a = ot.Sequential([ot.Input((4,), name="features"), L.Dense(3, activation="relu"), L.Dense(2)], seed=0)
    b = ot.Sequential([L.Dense(3, activation="relu"), L.Dense(2)], input_shape=(4,), seed=0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    assert [s.name for s in a.input_specs] == ["features"]
    a.save(tmp_path / "a.ortrain")
    np.testing.assert_array_equal(ot.load_model(tmp_path / "a.ortrain").predict(x), a.predict(x))
    ids = ot.Sequential([ot.Input((5,), dtype="int64"), L.Embedding(10, 3), L.Flatten()], seed=0)
    assert ids.input_specs[0].dtype == np.int64 and ids.output_specs[0].shape == (None, 15)
    with pytest.raises(ot.OrtrainError, match=r"input_shape=\(3,\) and the ot.Input's shape \(4,\) disagree"):
        ot.Sequential([ot.Input((4,)), L.Dense(2)], input_shape=(3,))
    assert ot.Sequential([ot.Input((4,)), L.Dense(2)], input_shape=4).input_specs[0].shape == (None, 4)
    with pytest.raises(ot.OrtrainError, match=r"input_dtype='int64' and the ot.Input's dtype 'float32' disagree"):
        ot.Sequential([ot.Input((4,)), L.Dense(2)], input_dtype="int64")
    with pytest.raises(ot.OrtrainError, match=r"expected ot.layers objects \(after an optional ot.Input\)"):
        ot.Sequential([L.Dense(2), ot.Input((3,))], input_shape=(3,))


def test_layer_trainable_false_freezes_it_as_in_keras(rng, tmp_path):
    dense, bn = L.Dense(4), L.BatchNorm()
    model = ot.Sequential([dense, bn, L.Dense(1)], input_shape=(3,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=0.1), loss="mse")
    assert model.get_layer("dense_0") is dense and model.get_layer(index=-1) is model.layers[-1]
    assert model.count_params() == 3 * 4 + 4 + 4 * 4 + 4 + 1   # Keras counts the running statistics too
    x = (rng.standard_normal((16, 3)) * 3 + 2).astype(np.float32)
    y = rng.standard_normal((16, 1)).astype(np.float32)
    dense.trainable = False
    bn.trainable = False   # a batch norm also normalises by, and keeps, its running statistics
    assert model.trainable_weight_names == ["dense_1.kernel", "dense_1.bias"]
    model.save(tmp_path / "m.ortrain")
    for m in (model, ot.load_model(tmp_path / "m.ortrain")):
        before = m.get_weights()
        m.fit(x, y, batch_size=16, epochs=2, verbose=0)
        after = m.get_weights()
        for i in range(6):
            np.testing.assert_array_equal(after[i], before[i])
        assert not np.array_equal(after[6], before[6])
    dense.trainable = True
    assert "dense_0.kernel" in model.trainable_weight_names
    model.trainable = False   # every layer, as Keras' model.trainable
    assert model.trainable_weight_names == [] and not model.trainable and not dense.trainable
    with pytest.warns(UserWarning, match="unfreeze: 'dense_0.kernel', 'dense_0.bias' stay frozen: layer 'dense_0' is "
                                         "set trainable=False; set layer.trainable = True"):
        model.unfreeze(dense)
    model.freeze("dense_1.*")
    model.trainable = True    # every weight trains, model.freeze's too
    assert model.trainable and len(model.trainable_weight_names) == 6
    imported = ot.from_onnx(model.export_onnx(tmp_path / "m.onnx"))   # no layers: all its weights
    imported.trainable = False
    assert imported.trainable_weight_names == [] and not imported.trainable
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    got = model.evaluate(x, y)
    assert model.evaluate(x, y, return_dict=False) == [got["loss"], got["mae"]]   # Keras' default form
    with pytest.raises(ot.OrtrainError, match="trainable: expected True or False, received 0"):
        dense.trainable = 0
    with pytest.raises(ot.OrtrainError, match="get_layer: no layer named 'nope'; the layers are 'dense_0'"):
        model.get_layer("nope")


def test_keras_names_calls_and_weight_files(rng, tmp_path):
    L2 = ot.layers
    assert (L2.MaxPooling2D, L2.AveragePooling2D, L2.GlobalAveragePooling2D, L2.BatchNormalization,
            L2.LayerNormalization, L2.Input) == (L.MaxPool2D, L.AvgPool2D, L.GlobalAvgPool2D, L.BatchNorm, L.LayerNorm,
                                                  ot.Input)

    def build(seed):
        return ot.Sequential([L2.Input((4,)), L2.Dense(3, activation="relu"), L2.BatchNormalization(), L2.Dense(2)],
                             seed=seed)
    model = build(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(model(x), model.predict(x))   # Keras' model(x): inference mode
    np.testing.assert_array_equal(model.predict_on_batch(x), model.predict(x))
    with pytest.raises(ot.OrtrainError, match="model\\(x, training=True\\): a forward pass in training mode"):
        model(x, training=True)
    with pytest.raises(ot.OrtrainError, match="a model used as a layer inside another model\\) is not supported"):
        model(ot.Input((4,)))
    path = model.save_weights(tmp_path / "w.weights")
    assert path.endswith("w.weights")   # the name as given
    other = build(1)
    assert not np.allclose(other.predict(x), model.predict(x))
    other.load_weights(path)
    np.testing.assert_array_equal(other.predict(x), model.predict(x))
    with np.load(path) as f:
        assert f.files == model.weight_names()
    wrong = ot.Sequential([L.Dense(3)], input_shape=(7,))
    before = wrong.get_weights()
    with pytest.raises(ot.OrtrainError, match="load_weights: '.*w.weights' does not fit this model: set_weights: "
                                              "unknown weight names"):
        wrong.load_weights(path)
    np.testing.assert_array_equal(wrong.get_weights()[0], before[0])
    with pytest.raises(ot.OrtrainError, match="load_weights: no such file"):
        model.load_weights(tmp_path / "none.npz")
    # a folder, or a file this process may not read: said so, not "not a weights file" (a raw numpy lead)
    with pytest.raises(ot.OrtrainError, match=r"load_weights: '.*' cannot be read \(Is a directory\); give a "
                                              r"weights file of save_weights this process may read"):
        model.load_weights(tmp_path)
    np.save(tmp_path / "one.npy", np.zeros(3))
    model.save(tmp_path / "m.ortrain")
    for path in (tmp_path / "one.npy", tmp_path / "m.ortrain"):   # named, nothing changes
        with pytest.raises(ot.OrtrainError, match="is not a weights file of save_weights .* read with ot.load_model"):
            model.load_weights(path)
    data = (tmp_path / "w.weights").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:100])
    flip = data.index(b"NUMPY") + 130   # a byte of the first array's values (after its 128-byte header)
    (tmp_path / "flip.npz").write_bytes(data[:flip] + bytes([data[flip] ^ 0xFF]) + data[flip + 1:])
    # a zip entry's flags, compression method or version changed: zipfile's NotImplementedError or
    # RuntimeError ("is encrypted, password required") had come through raw
    entry = data.rindex(b"PK\x01\x02")   # the last array's central-directory record
    for offset, bit, name in ((10, 1, "method"), (8, 0, "encrypted"), (6, 7, "version")):
        at = entry + offset
        (tmp_path / f"{name}.npz").write_bytes(data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:])
    before = model.get_weights()
    for path in (tmp_path / "cut.npz", tmp_path / "flip.npz", tmp_path / "method.npz", tmp_path / "encrypted.npz",
                 tmp_path / "version.npz"):
        with pytest.raises(ot.OrtrainError, match="cannot be read as a weights file of save_weights: it is damaged"):
            model.load_weights(path)
    for got, was in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, was)
    assert model.get_layer(index=np.int64(1)) is model.layers[1]
    with pytest.raises(ot.OrtrainError, match=r"get_layer\(index=...\): expected an int in \[-3, 3\) .*received True"):
        model.get_layer(index=True)


def test_evaluate_matches_numpy(rng):
    model = skip_model()
    x = rng.standard_normal((20, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 20)
    y = np.eye(3, dtype=np.float32)[labels]
    p = numpy_forward(model, x.astype(np.float64))
    res = model.evaluate(x, y, batch_size=6)
    np.testing.assert_allclose(res["loss"], np.mean(-(y * np.log(np.clip(p, 1e-7, 1))).sum(1)), rtol=1e-5)
    assert res["accuracy"] == pytest.approx(np.mean(p.argmax(1) == labels))
    with pytest.raises(ot.ShapeError, match="y: expected shape \\(20, 3\\), received \\(19, 3\\)"):
        model.evaluate(x, y[:19])


def test_model_errors():
    with pytest.raises(ot.OrtrainError, match="Sequential\\(..., input_shape=...\\) is required"):
        ot.Sequential([L.Dense(2)])
    with pytest.raises(ot.OrtrainError, match="use the functional API"):
        ot.Sequential([L.Add()], input_shape=(2,))
    a, b = ot.Input((2,)), ot.Input((2,))
    with pytest.raises(ot.OrtrainError, match="depend on an input not listed"):
        ot.Model(a, L.Add()([a, b]))
    with pytest.raises(ot.OrtrainError, match="layer names must be unique"):
        ot.Sequential([L.Dense(2, name="d"), L.Dense(2, name="d")], input_shape=(2,))
    model = ot.Sequential([L.Dense(2)], input_shape=(2,))
    with pytest.raises(ot.OrtrainError, match="not compiled"):
        ot.Trainer(model)
    with pytest.raises(ot.OrtrainError, match="metrics: unknown metric 'f1'"):
        model.compile(metrics=["f1"])


# -- batch sizes, labels and compile checked before anything runs or changes -----------------------


def sparse_model(seed=0):
    model = ot.Sequential([L.Dense(3, activation="softmax")], input_shape=(4,), seed=seed)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_predict_and_evaluate_validate_batch_size(rng):
    model = sparse_model()
    x = rng.standard_normal((10, 4)).astype(np.float32)
    y = rng.integers(0, 3, 10)
    w, b = model.get_weights()
    np.testing.assert_allclose(model.predict(x, batch_size=np.int64(3)), softmax(x @ w + b), rtol=1e-5, atol=1e-6)
    full = model.evaluate(x, y)
    assert model.evaluate(x, y, batch_size=3)["loss"] == pytest.approx(full["loss"], rel=1e-6)
    for bad in (-1, 0, 2.5, True, "4"):
        with pytest.raises(ot.OrtrainError, match=f"batch_size: expected a positive int or None, received "
                                                  f"{re.escape(repr(bad))}"):
            model.predict(x, batch_size=bad)
        with pytest.raises(ot.OrtrainError, match="batch_size: expected a positive int or None"):
            model.evaluate(x, y, batch_size=bad)
    for call in (model.evaluate, lambda x, y: model.fit(x, y, verbose=0)):
        with pytest.raises(ot.ShapeError, match=re.escape("y: expected shape (10,), received (9,); give one row per "
                                                          "row of x")):
            call(x, y[:9])


def test_evaluate_refuses_class_labels_out_of_range_and_matches_numpy(rng):
    model = sparse_model()
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = np.array([0, 2, 1, 1, 0, 2])
    w, b = model.get_weights()
    p = softmax(x.astype(np.float64) @ w + b)
    want = -np.mean(np.log(p[np.arange(6), y]))
    for labels in (y, y[:, None], y.astype(np.float64)):  # (n,), (n, 1) and whole floats are class labels
        assert model.evaluate(x, labels)["loss"] == pytest.approx(want, rel=1e-5)
    for bad, low, high in ((-1, -1, 2), (3, 0, 3), (5, 0, 5)):
        labels = y.copy()
        labels[4] = bad
        with pytest.raises(ot.ShapeError, match=rf"y: class labels must lie in \[0, 2\] \(the output has 3 "
                                                rf"classes\), received values from {low} to {high}; number the "
                                                "classes from 0"):
            model.evaluate(x, labels, batch_size=2)


def test_evaluate_weights_samples_as_numpy_and_refuses_non_finite_weights(rng):
    model = sparse_model()
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = np.array([0, 2, 1, 1, 0, 2])
    sw = np.array([1.0, 0.5, 2.0, 0.0, 1.0, 3.0], np.float32)
    w, b = model.get_weights()
    nll = -np.log(softmax(x.astype(np.float64) @ w + b)[np.arange(6), y])
    assert model.evaluate(x, y, sample_weight=sw, batch_size=4)["loss"] == pytest.approx(
        np.sum(sw * nll) / len(y), rel=1e-5)  # Keras' "sum over batch size", batch by batch
    for bad in (np.nan, np.inf):
        weights = sw.copy()
        weights[3] = bad
        with pytest.raises(ot.NonFiniteError, match=f"sample_weight: holds {bad} in row 3; weights must be finite, "
                                                    "so nothing was evaluated"):
            model.evaluate(x, y, sample_weight=weights)
        regression = ot.Sequential([L.Dense(2)], input_shape=(4,), seed=0).compile(optimizer="sgd", loss="mse")
        with ot.Trainer(regression, batch_size=6, loss_mask=1) as tr, \
                pytest.raises(ot.NonFiniteError, match="sample_weight: holds .* weights must be finite"):
            tr.eval(x, np.zeros((6, 2), np.float32), sample_weight=weights)
        # validation weights too, before anything trains
        for kwargs, argument in ((dict(validation_data=(x, y, weights)), r"validation_data\[2\]"),
                                 (dict(validation_data=[(x, y, np.ones(6)), (x, y, weights)]),
                                  r"validation_data\[1\] sample_weight"),
                                 (dict(sample_weight=np.r_[np.ones(6), weights], validation_split=0.5),
                                  r"sample_weight \(rows held out by validation_split\)")):
            rows = 6 if "validation_data" in kwargs else 12
            row = 3 if "validation_data" in kwargs else 9  # a held-out row counted in the whole, as x's are
            with pytest.raises(ot.NonFiniteError, match=f"{argument}: holds {bad} in row {row}; weights must be "
                                                        "finite, so nothing was trained"):
                model.fit(np.r_[x, x][:rows], np.r_[y, y][:rows], verbose=0, **kwargs)
            assert model.train_state is None


def test_targets_of_shape_n_fit_an_output_of_shape_n_1(rng):
    x = rng.standard_normal((12, 4)).astype(np.float32)
    y = rng.standard_normal(12).astype(np.float32)
    flat, column = (ot.Sequential([L.Dense(1)], input_shape=(4,), seed=3) for _ in range(2))
    for m in (flat, column):
        m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse", metrics=["mae"])
    w, b = flat.get_weights()
    res = flat.evaluate(x, y)
    assert res["loss"] == pytest.approx(np.mean((x @ w + b - y[:, None]) ** 2), rel=1e-5)
    assert res["mae"] == pytest.approx(np.mean(np.abs(x @ w + b - y[:, None])), rel=1e-5)
    h1 = flat.fit(x, y, batch_size=4, shuffle=False, verbose=0, validation_data=(x, y))
    h2 = column.fit(x, y[:, None], batch_size=4, shuffle=False, verbose=0, validation_data=(x, y[:, None]))
    for a, c in zip(flat.get_weights(), column.get_weights()):
        np.testing.assert_array_equal(a, c)
    assert h1.history == h2.history
    with ot.Trainer(flat, batch_size=4) as tr:
        assert tr.eval(x[:4], y[:4]) == tr.eval(x[:4], y[:4, None])


def test_a_refused_compile_changes_nothing(rng):
    model = sparse_model()
    model.fit(rng.standard_normal((8, 4)), rng.integers(0, 3, 8), batch_size=4, verbose=0)
    before = (model.optimizer, model.loss, list(model.metrics), model.train_state)
    with pytest.raises(ot.OrtrainError, match="loss: expected one of .* received 'bogus'"):
        model.compile(optimizer="adamw", loss="bogus")
    with pytest.raises(ot.OrtrainError, match="metrics: unknown metric 'f1'"):
        model.compile(optimizer="adam", loss="mse", metrics=["mae", "f1"])
    with pytest.raises(ot.OrtrainError, match="optimizer"):
        model.compile(optimizer="bogus", loss="mse")
    # a metric on other labels than the loss's: categorical_accuracy read a wrong value off class
    # indices (argmax of the label vector), mae failed on broadcasting after the first step trained
    for metric in ("categorical_accuracy", "binary_accuracy", "mae", "mse"):
        with pytest.raises(ot.OrtrainError, match=rf"metrics: '{metric}' compares the output with labels of its own "
                                                  "shape, and loss 'sparse_categorical_crossentropy' takes class "
                                                  "indices; use 'accuracy'"):
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy", metric])
    with pytest.raises(ot.OrtrainError, match="metrics: 'sparse_categorical_accuracy' takes class-index labels, and "
                                              "loss 'categorical_crossentropy' takes labels shaped like the output"):
        model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["sparse_categorical_accuracy"])
    after = (model.optimizer, model.loss, list(model.metrics), model.train_state)
    assert all(a is b for a, b in zip(before[:2], after[:2])) and before[2] == after[2] == ["accuracy"]
    assert after[3] is before[3] and after[0].name == "sgd"


def test_model_caches_follow_compile_shared_layers_and_names():
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse", metrics="mae")       # a single metric name is a list of one
    assert model.metrics == ["mae"]
    pred = model.predict(x)
    np.testing.assert_allclose(model.evaluate(x, y)["loss"], np.mean((pred - y) ** 2), rtol=1e-5)
    model.compile(optimizer="adam", loss="mae")                       # evaluate follows a new compile
    np.testing.assert_allclose(model.evaluate(x, y)["loss"], np.mean(np.abs(pred - y)), rtol=1e-5)
    # a layer shared by two models: training one shows in the other's predictions
    inp = ot.Input((4,))
    encode = ot.layers.Dense(2)
    encoder = ot.Model(inp, encode(inp))
    auto = ot.Model(inp, ot.layers.Dense(4)(encode(inp))).compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    before = encoder.predict(x)
    auto.fit(x, x, batch_size=6, epochs=2, verbose=0)
    kernel, bias = encoder.get_weights()
    np.testing.assert_allclose(encoder.predict(x), x @ kernel + bias, rtol=1e-5, atol=1e-6)
    assert not np.allclose(encoder.predict(x), before)
    for names, message in (([("q", 4), ("q", 4)], "input name 'q' is another input's name"),
                           ([("output", 4)], "input name 'output' is an output's or a weight's name")):
        ins = [ot.Input((d,), name=n) for n, d in names]
        h = ins[0] if len(ins) == 1 else ot.layers.Add()(ins)
        with pytest.raises(ot.OrtrainError, match=message):
            ot.Model(ins, ot.layers.Dense(2)(h))
    with pytest.raises(ot.ShapeError, match=r"Concatenate\(axis=3\): inputs of rank 2 have axes -2 to 1"):
        ot.layers.Concatenate(axis=3)([ot.Input((2,)), ot.Input((2,))])


def test_an_export_with_frozen_batchnorm_statistics_keeps_them_statistics(tmp_path):
    model = ot.Sequential([ot.layers.Dense(4), ot.layers.BatchNorm(), ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    model.fit(x, np.zeros((8, 2), np.float32), batch_size=8, verbose=0)
    model.freeze_bn_stats()
    model.export_onnx(tmp_path / "m.onnx")
    again = ot.from_onnx(tmp_path / "m.onnx")
    roles = {p.name: p.role for p in again.forward_graph().params}
    assert [roles[n] for n in sorted(roles) if "running" in n] == ["buffer", "buffer"]
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-5, atol=1e-6)


def test_models_saved_before_the_metric_and_input_checks_still_load(rng, tmp_path):
    # Files an earlier ortrain wrote: a sparse cross-entropy model compiled with categorical_accuracy
    # (a metric compile now refuses: it read wrong values) loads without that metric, with a warning;
    # an input named 'obs/state' loads as it was.
    from _onnx_helpers import DATA
    with pytest.warns(UserWarning, match=r"load_model: metrics \['categorical_accuracy'\] do not read the labels of "
                                         "loss 'sparse_categorical_crossentropy'"):
        model = ot.load_model(DATA / "saved_sparse_ce_with_categorical_accuracy.zip")
    assert model.metrics == [] and model.loss.name == "sparse_categorical_crossentropy"
    assert model.train_state is not None  # the optimizer state came along
    x = rng.standard_normal((4, 4)).astype(np.float32)
    w, b = model.get_weights()
    z = x @ w + b
    np.testing.assert_allclose(model.predict(x), np.exp(z) / np.exp(z).sum(1, keepdims=True), rtol=1e-5)
    # a metric this version does not know (a file of a later one) is named as such
    import json
    import zipfile
    with zipfile.ZipFile(DATA / "saved_input_named_obs_state.zip") as z:
        files = {n: z.read(n) for n in z.namelist()}
    record = json.loads(files["model.json"])
    record["compile"]["metrics"] = ["f1_score"]
    files["model.json"] = json.dumps(record).encode()
    with zipfile.ZipFile(tmp_path / "later.zip", "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    with pytest.warns(UserWarning, match=r"load_model: metrics \['f1_score'\] are not known to this ortrain"):
        assert ot.load_model(tmp_path / "later.zip").metrics == []
    named = ot.load_model(DATA / "saved_input_named_obs_state.zip")
    assert named.input_specs[0].name == "obs/state"
    named.predict(rng.standard_normal((2, *named.input_specs[0].shape[1:])).astype(np.float32))


def test_sequential_add_and_pop_as_in_keras(rng, tmp_path):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    model = ot.Sequential(name="stack")
    assert model.layers == []
    for call, said in [(lambda: model.predict(x), "has no input shape yet; add an ot.Input"),
                       (lambda: model.add(L.Dense(3)), r"Sequential.add: the model has no input shape yet")]:
        with pytest.raises(ot.OrtrainError, match=said):
            call()
    model.add(ot.Input((4,)))
    with pytest.raises(ot.OrtrainError, match="has no layer yet; add layers first"):
        model.compile(optimizer="sgd", loss="mse")
    hidden = L.Dense(6, activation="relu")
    model.add(hidden)
    kept = hidden.get_weights()
    model.add(L.Dense(2))
    for a, b in zip(hidden.get_weights(), kept, strict=True):   # a rebuild keeps the weights there
        np.testing.assert_array_equal(a, b)
    w1, b1, w2, b2 = model.get_weights()
    np.testing.assert_allclose(model.predict(x), np.maximum(x @ w1 + b1, 0) @ w2 + b2, rtol=1e-5, atol=1e-6)
    assert model.name == "stack" and [lyr.name for lyr in model.layers] == ["dense_0", "dense_1"]
    before = model.get_weights()
    for bad, said in [(L.Add(), "Add merges several inputs"), (hidden, "is in this model already"),
                      (ot.Input((4,)), "has its input already")]:
        with pytest.raises(ot.OrtrainError, match=said):
            model.add(bad)
    assert len(model.layers) == 2 and all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))

    assert model.pop().name == "dense_1"
    np.testing.assert_allclose(model.predict(x), np.maximum(x @ w1 + b1, 0), rtol=1e-5, atol=1e-6)
    model.add(L.Dense(1))
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, np.zeros((5, 1)), epochs=1, verbose=0)
    model.save(tmp_path / "m.ortrain")
    loaded = ot.load_model(tmp_path / "m.ortrain")
    loaded.add(L.Dense(3))
    assert isinstance(loaded, ot.Sequential) and loaded.predict(x).shape == (5, 3)
    assert model.pop() is not None and model.pop() is hidden and model.layers == []
    with pytest.raises(ot.OrtrainError, match="has no layer to remove"):
        model.pop()

    seeded = ot.Sequential(input_shape=(4,), seed=7)   # add() draws what the list form draws
    seeded.add(L.Dense(3))
    seeded.add(L.Dense(2))
    listed = ot.Sequential([L.Dense(3), L.Dense(2)], input_shape=(4,), seed=7)
    for a, b in zip(seeded.get_weights(), listed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_keras_weight_and_shape_attributes(rng):
    model = ot.Sequential([L.Dense(3), L.BatchNorm(), L.Dense(2)], input_shape=(4,), seed=0)
    names, weights = model.weight_names(), model.get_weights()
    assert (model.input_shape, model.output_shape, model.metrics_names) == ((None, 4), (None, 2), [])
    assert [w.shape for w in model.weights] == [w.shape for w in weights]
    stats = {"batch_norm_0.running_mean", "batch_norm_0.running_var"}
    train = [w for n, w in zip(names, weights) if n not in stats]
    for got, want in ((model.trainable_weights, train), (model.non_trainable_weights, [weights[4], weights[5]])):
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    model.freeze("dense_0.*")
    assert len(model.trainable_weights) == 4 and len(model.non_trainable_weights) == 4
    dense, bn = model.layers[0], model.layers[1]
    np.testing.assert_array_equal(dense.kernel, weights[0])
    np.testing.assert_array_equal(bn.gamma, weights[2])
    assert [w.shape for w in bn.trainable_weights] == [(3,), (3,)] and len(bn.non_trainable_weights) == 2
    bn.trainable = False
    assert bn.trainable_weights == [] and len(bn.non_trainable_weights) == 4
    with pytest.raises(AttributeError, match="'Dense' object has no attribute 'gamma'"):
        getattr(dense, "gamma")  # noqa: B009 - the attribute lookup is what is tested
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    assert model.metrics_names == ["loss", "mae"]
    x = rng.standard_normal((6, 4)).astype(np.float32)
    assert len(model.evaluate(x, np.zeros((6, 2)), return_dict=False)) == len(model.metrics_names)
    two = ot.Model([a := ot.Input((3,)), b := ot.Input((5,))], L.Dense(2)(L.Concatenate()([a, b])))
    assert two.input_shape == [(None, 3), (None, 5)]


def test_a_feature_extractor_from_model_input_and_a_layer_output(rng):
    # Keras' transfer-learning idiom: Model(model.input, model.layers[-2].output) shares the layers.
    model = ot.Sequential([L.Dense(8, activation="relu"), L.Dense(3)], input_shape=(4,), seed=0)
    features = ot.Model(model.input, model.layers[-2].output)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w1, b1, w2, b2 = model.get_weights()
    np.testing.assert_allclose(features.predict(x), np.maximum(x @ w1 + b1, 0), rtol=1e-5, atol=1e-6)
    assert features.weight_names() == ["dense_0.kernel", "dense_0.bias"]
    assert model.inputs == [model.input] and model.outputs == [model.output] and model.layers[1].input is \
        model.layers[0].output
    elsewhere = model.layers[0](ot.Input((4,)))   # a later call elsewhere: output stays the first call's, as Keras'
    assert model.layers[0].output is not elsewhere
    np.testing.assert_allclose(ot.Model(model.input, model.layers[-2].output).predict(x), features.predict(x))
    head = L.Dense(2)
    classifier = ot.Model(features.input, head(features.output))
    assert [lyr.name for lyr in classifier.layers] == ["dense_0", head.name]
    with pytest.raises(ot.OrtrainError, match="has not been called on a tensor yet"):
        _ = L.Dense(2).output
    graph = ot.from_onnx(onnx.load_from_string(_tiny_onnx()))
    with pytest.raises(ot.OrtrainError, match=r"model.inputs: this model has no layer tensors .* model.input_specs"):
        _ = graph.inputs


def _tiny_onnx() -> bytes:
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
                          [numpy_helper.from_array(np.ones((2, 1), np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def test_sequential_add_keeps_freezing_and_a_refused_add_changes_nothing(tmp_path):
    import copy
    import pickle

    empty = ot.Sequential(name="empty")
    assert "not built" in repr(empty)
    for make in (copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        assert "not built" in repr(make(empty))
    model = ot.Sequential([L.Dense(4, name="a"), L.BatchNorm(name="bn")], input_shape=(3,), seed=2)
    model.freeze("a.*")
    model.freeze_bn_stats()
    model.add(L.Dense(2, name="b"))
    assert model.trainable_weight_names == ["bn.gamma", "bn.beta", "b.kernel", "b.bias"]
    embedding = L.Embedding(10, 3)
    with pytest.raises(ot.OrtrainError, match="Embedding takes int64 inputs"):
        model.add(embedding)
    assert embedding.built_for is None and embedding.weights == {}   # left as it was, usable elsewhere
    ids = ot.Input((5,), dtype="int64")
    assert ot.Model(ids, L.Flatten()(embedding(ids))).output_shape == (None, 15)
    seeded = ot.Sequential(input_shape=(3,), seed=2)
    seeded.add(L.Dense(4))
    with pytest.raises(ot.OrtrainError, match="Embedding takes int64 inputs"):
        seeded.add(L.Embedding(10, 3))   # draws nothing from the seeded stack
    seeded.add(L.Dense(2))
    seeded.pop()
    seeded.pop()
    seeded.add(L.Dense(4))   # draws what the popped first layer drew
    seeded.add(L.Dense(2))
    listed = ot.Sequential([L.Dense(4), L.Dense(2)], input_shape=(3,), seed=2)
    for a, b in zip(seeded.get_weights(), listed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_composing_models_names_and_repeats(rng):
    # A layer listed twice in a Sequential is refused, as add() refuses it (pop/add lost the repeat).
    d = L.Dense(4, activation="tanh")
    with pytest.raises(ot.OrtrainError, match="is listed twice; a layer appears once in a Sequential"):
        ot.Sequential([d, d, L.Dense(1)], input_shape=(4,))
    # Two models' automatic names collide in a third: the error says to name the layers.
    g = ot.Sequential([L.Dense(8), L.Dense(4)], input_shape=(2,))
    disc = ot.Sequential([L.Dense(8), L.Dense(1, activation="sigmoid")], input_shape=(4,))
    z = ot.Input((2,))
    h = z
    for layer in g.layers + disc.layers:
        h = layer(h)
    with pytest.raises(ot.OrtrainError, match="repeated: dense_0, dense_1 .*name the layers when creating them"):
        ot.Model(z, h)
    # A layer's name is fixed once a model holds it: renaming lost the Adam moments of its weights.
    x = rng.standard_normal((8, 2)).astype(np.float32)
    g.compile(optimizer="adam", loss="mse")
    g.fit(x, np.ones((8, 4), np.float32), verbose=0)
    before = g.optimizer.state()
    with pytest.raises(ot.OrtrainError, match="a layer's name cannot change once a model holds it"):
        g.layers[0].name = "first"
    with pytest.raises(ot.OrtrainError, match="a layer's name cannot change once a model holds it"):
        g.layers[0].name = "dense_1"
    g.layers[0].name = "dense_0"   # the same name: nothing changes
    assert g.weight_names() == ["dense_0.kernel", "dense_0.bias", "dense_1.kernel", "dense_1.bias"]
    assert sorted(g.optimizer.state()["moments"]) == sorted(before["moments"])
    free = L.Dense(3)
    free.name = "named_later"   # before any model holds it
    with pytest.raises(ot.OrtrainError, match="name: expected a non-empty string without '.'"):
        free.name = "x.y"
    assert ot.Sequential([free], input_shape=(2,)).weight_names() == ["named_later.kernel", "named_later.bias"]
    a, b = L.Dense(2, name="a"), L.Dense(2, name="b")
    clash = ot.Input((2,), name="a.kernel")
    with pytest.raises(ot.OrtrainError, match="input name 'a.kernel'"):
        ot.Model(clash, a(clash))   # a model refused before it held its layers
    a.name = "a2"
    inp = ot.Input((2,))
    assert ot.Model(inp, b(a(inp))).weight_names()[0] == "a2.kernel"
    m = ot.Sequential([L.Dense(2)], input_shape=(3,))
    with pytest.raises(ot.OrtrainError, match="losses per output \\(Keras' list\\) are not taken"):
        m.compile(optimizer="adam", loss=["mse", "mse"])


def test_metric_names_as_given_keep_their_checks(tmp_path):
    model = ot.Sequential([L.Dense(3, activation="softmax")], input_shape=(4,), seed=0)
    with pytest.raises(ot.OrtrainError, match="metrics: 'acc' is given twice"):
        model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=["acc", "acc"])
    model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=["MAE"])
    model.save(tmp_path / "m.ortrain")
    # the file names 'MAE', which sparse labels cannot take: loaded without it, with a warning
    record_path = tmp_path / "m.ortrain"
    import json
    import zipfile
    with zipfile.ZipFile(record_path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    record = json.loads(files["model.json"])
    record["compile"]["loss"] = {"name": "sparse_categorical_crossentropy", "from_logits": False}
    files["model.json"] = json.dumps(record).encode()
    with zipfile.ZipFile(tmp_path / "sparse.ortrain", "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    with pytest.warns(UserWarning, match=r"metrics \['MAE'\] do not read the labels"):
        loaded = ot.load_model(tmp_path / "sparse.ortrain")
    assert loaded.metrics == []
    for monitor in ("val_Acc", "val_ACCURACY", "val_acc"):   # accuracy improves upwards, whatever its case
        assert ot.callbacks.EarlyStopping(monitor=monitor).monitor.mode == "max"

    for monitor in ("loss", "val_loss", "output_1_loss", "val_mae", "mse", "weighted_mean_squared_error"):
        assert ot.callbacks.EarlyStopping(monitor=monitor).monitor.mode == "min"


@pytest.mark.parametrize("make", [ot.callbacks.EarlyStopping, ot.callbacks.ReduceLROnPlateau,
                                  lambda **kw: ot.callbacks.ModelCheckpoint("best", save_best_only=True, **kw)])
def test_mode_auto_refuses_a_value_whose_name_does_not_tell_its_direction(make):
    # A score a callback logs ("val_f1") was minimised: EarlyStopping stopped while it grew, ReduceLROnPlateau
    # cut the rate at every improvement and ModelCheckpoint kept the worst epoch. Keras 3 refuses it too.
    with pytest.raises(ot.OrtrainError, match=r"\(monitor='val_f1', mode='auto'\): cannot tell whether 'val_f1' "
                                              r"improves by growing or by shrinking .* pass mode='max' for a score"):
        make(monitor="val_f1")
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)

    class LogF1(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_f1"] = 0.5 + 0.1 * epoch   # better every epoch

    model = ot.Sequential([L.Dense(3, activation="softmax")], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="sparse_categorical_crossentropy")
    stop = ot.callbacks.EarlyStopping(monitor="val_f1", mode="max", patience=1)
    history = model.fit(x, np.arange(32) % 3, batch_size=16, epochs=4, verbose=0, callbacks=[LogF1(), stop])
    assert len(history.epoch) == 4 and stop.best == pytest.approx(0.8)


def test_model_checkpoint_takes_any_monitored_name_where_it_does_not_compare_values(tmp_path):
    # every epoch saves without save_best_only, whatever the monitored name (val_auc, lr), as in Keras
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    model = ot.Sequential([L.Dense(1)], input_shape=(4,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    for monitor in ("val_auc", "lr"):
        (tmp_path / monitor).mkdir()
        ckpt = ot.callbacks.ModelCheckpoint(tmp_path / monitor / "m-{epoch}", monitor=monitor)
        model.fit(x, x[:, :1], epochs=2, verbose=0, callbacks=[ckpt])
        assert sorted(p.name for p in (tmp_path / monitor).iterdir()) == ["m-1", "m-2"]


def test_evaluate_takes_a_generator_of_batches_as_keras_does(rng):
    x, y = rng.random((20, 4)).astype(np.float32), rng.random((20, 2)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, 20).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"], weighted_metrics=["mae"])
    batches = [(x[i:i + 8], y[i:i + 8], w[i:i + 8]) for i in range(0, 20, 8)]
    want = model.evaluate(x, y, sample_weight=w)
    for got in (model.evaluate(batches), model.evaluate(iter(batches)), model.evaluate(lambda: batches[0], steps=1)):
        assert got.keys() == want.keys()
    got = model.evaluate(batches)
    as_lists = model.evaluate([list(b) for b in batches])  # batches written as lists, as fit takes them
    assert as_lists == got
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-6)
    pred = x @ model.get_weights()[0] + model.get_weights()[1]
    assert got["loss"] == pytest.approx(np.sum(w * ((pred - y) ** 2).mean(axis=1)) / 20, rel=1e-5)
    two = model.evaluate(iter(batches), steps=2)
    assert two["mae"] == pytest.approx(np.abs(pred[:16] - y[:16]).mean(), rel=1e-5)
    for labels_forgotten in (x, [x], x.tolist()):
        with pytest.raises(ot.OrtrainError, match="evaluate: y is required with array inputs"):
            model.evaluate(labels_forgotten)
    with pytest.raises(ot.OrtrainError, match="evaluate\\(sample_weight=...\\): a generator's weights go inside its "
                                              "batches"):
        model.evaluate(batches, sample_weight=w)
    with pytest.warns(RuntimeWarning, match="evaluate: the generator ran out after 3 of steps=5 batches"):
        model.evaluate(iter(batches), steps=5)
    with pytest.raises(ot.ShapeError, match="evaluate, batch 1 \\(counted from 0\\): y: expected shape"):
        model.evaluate([batches[0], (x[:4], y[:3])])


def test_load_model_without_compiling_and_a_python_loss_function_is_told_the_way(tmp_path):
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    model.save(tmp_path / "m.ortrain")
    bare = ot.load_model(tmp_path / "m.ortrain", compile=False)  # Keras' load_model(path, compile=False)
    assert not bare.compiled and bare.metrics_names == [] and bare.train_state is None
    np.testing.assert_array_equal(bare.predict(np.ones((2, 3))), model.predict(np.ones((2, 3))))
    with pytest.raises(ot.OrtrainError, match="load_model\\(compile=...\\): expected True or False"):
        ot.load_model(tmp_path / "m.ortrain", compile="no")

    def my_loss(y_true, y_pred):
        return ((y_true - y_pred) ** 2).mean()

    with pytest.raises(ot.OrtrainError, match="received the function 'my_loss'.*ot.capture_step"):
        bare.compile(optimizer="adam", loss=my_loss)
    assert not bare.compiled


def test_a_changed_byte_in_a_saved_model_or_trainer_checkpoint_is_refused_or_harmless(tmp_path):
    """One bit flipped in turn across the files: a load either refuses with OrtrainError or gives
    exactly the saved state. A model file raised zlib.error or NotImplementedError; a trainer
    checkpoint raised KeyError or IndexError, or loaded other weights silently (it holds no
    checksum of its own, so ortrain adds one)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(6, activation="relu"), ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=8, verbose=0)
    model.save(tmp_path / "m.ortrain")
    with ot.Trainer(model, batch_size=8) as tr:
        tr.step(x, y)
        tr.save_checkpoint(tmp_path / "m.ckpt")
    with ot.Trainer.from_checkpoint(model, tmp_path / "m.ckpt", batch_size=8) as tr:
        want = ([w.copy() for w in tr.model().get_weights()], tr.n_steps, tr.lr, tr.step(x, y))

    def load_model(path):
        got = ot.load_model(path)
        return [w.copy() for w in got.get_weights()], got.train_state.step, got.optimizer.lr

    def from_checkpoint(path):
        with ot.Trainer.from_checkpoint(model, path, batch_size=8) as tr:
            return [w.copy() for w in tr.model().get_weights()], tr.n_steps, tr.lr, tr.step(x, y)

    for name, load, every in (("m.ortrain", load_model, 5), ("m.ckpt", from_checkpoint, 11)):
        data = (tmp_path / name).read_bytes()
        saved = load(tmp_path / name)
        refused = 0
        for i in range(0, len(data), every):
            bad = bytearray(data)
            bad[i] ^= 0x10
            (tmp_path / "bad").write_bytes(bytes(bad))
            try:
                got = load(tmp_path / "bad")
            except ot.OrtrainError:
                refused += 1
                continue
            for a, b in zip(got[0], saved[0]):
                np.testing.assert_array_equal(a, b, err_msg=f"{name}: byte {i} changed, loaded silently")
            assert got[1:] == saved[1:], f"{name}: byte {i} changed, loaded silently"
        assert refused > len(data) // every // 2
    assert from_checkpoint(tmp_path / "m.ckpt")[1:] == want[1:]


@pytest.mark.torch
@pytest.mark.parametrize("order", ["i h dense(h)", "shared"])
def test_a_dense_block_concatenating_three_ways_trains_as_in_pytorch(order):
    # concatenate([i, h, Dense(h)]) failed to open its training session: onnxruntime's
    # GemmSumFusion asserted on the Dense gradient fed by the concatenation's third split output
    torch = torch_or_skip()
    L = ot.layers
    i = ot.Input((4,))
    first = L.Dense(4)
    h = first(i)
    last = first if order == "shared" else L.Dense(4)
    model = ot.Model(i, L.Concatenate()([i, h, last(h)]))
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    w = model.get_weights()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 12)).astype(np.float32)
    tw = [torch.tensor(a, requires_grad=True) for a in w]

    def forward(x):
        h = x @ tw[0] + tw[1]
        g = h @ tw[0] + tw[1] if order == "shared" else h @ tw[2] + tw[3]
        return torch.cat([x, h, g], dim=1)

    opt = torch.optim.SGD(tw, lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(forward(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), tw):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_an_int64_input_passed_through_as_an_output_stays_int64(tmp_path):
    # it was declared float32: predict failed inside onnxruntime and export_onnx wrote a file
    # onnxruntime refuses ("Type Error")
    import onnxruntime as ort
    t, f = ot.Input((2,), dtype="int64", name="t"), ot.Input((2,), name="f")
    model = ot.Model([t, f], [ot.layers.Dense(1)(f), t])
    assert [np.dtype(s.dtype) for s in model.output_specs] == [np.float32, np.int64]
    ids, xs = np.arange(6).reshape(3, 2), np.ones((3, 2), np.float32)
    dense, passed = model.predict([ids, xs])
    assert passed.dtype == np.int64 and np.array_equal(passed, ids)
    model.export_onnx(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"t": ids, "f": xs})
    assert got[1].dtype == np.int64 and np.array_equal(got[1], ids)
    np.testing.assert_array_equal(got[0], dense)
    with pytest.raises(ot.OrtrainError, match=r"compile: the loss is computed on the model's first output, which "
                                              r"must be float32; the outputs are 'output_0' \(int64\)"):
        ot.Model([t, f], [t, ot.layers.Dense(1)(f)]).compile(optimizer="adam", loss="mse")


def test_exported_files_name_ortrain_as_their_producer(tmp_path):
    import onnx
    model = ot.Sequential([L.Dense(2)], input_shape=(3,), seed=0)
    saved = onnx.load(model.export_onnx(tmp_path / "own.onnx"))
    assert (saved.producer_name, saved.producer_version) == ("ortrain", ot.__version__)
    assert saved.doc_string == f"Exported by ortrain {ot.__version__} from model 'sequential'"
    saved.producer_name, saved.producer_version = "pytorch", "2.13.0"   # as a torch export names itself
    saved.doc_string = "Classifier.\nLabels: cat, dog"                  # the user's own text
    imported = ot.from_onnx(saved, name="tuned")
    again = onnx.load(imported.export_onnx(tmp_path / "again.onnx"))
    assert (again.producer_name, again.producer_version) == ("ortrain", ot.__version__)
    # the user's text was replaced, and a re-import's export forgot where the model came from
    line = f"Exported by ortrain {ot.__version__} from model 'tuned' (imported from a file by pytorch 2.13.0)"
    assert again.doc_string == f"{line}\n\nClassifier.\nLabels: cat, dog"
    third = onnx.load(ot.from_onnx(again, name="tuned").export_onnx(tmp_path / "third.onnx"))
    assert third.doc_string == again.doc_string
    third.doc_string = f"{line} - checked by QA"   # the user's text on ortrain's line is the user's too
    fourth = onnx.load(ot.from_onnx(third, name="tuned").export_onnx(tmp_path / "fourth.onnx"))
    assert fourth.doc_string == f"Exported by ortrain {ot.__version__} from model 'tuned'\n\n{line} - checked by QA"


def test_keras_per_output_and_nested_forms_are_refused_saying_what_ortrain_takes(tmp_path):
    # Each got a message about something else: "expected tensors from ot.Input(...)" for a dict of
    # inputs, "expected ot.layers objects" for a model in a Sequential, "received ['mae']" for metrics
    # per output, and a (2, 8) array with a hint about loss_mask for sample weights per output; a
    # model whose first output no weight affects was told to unfreeze weights, none being frozen.
    a, b = ot.Input((3,), name="a"), ot.Input((2,), name="b")
    h = L.Dense(2)(L.Concatenate()([a, b]))
    with pytest.raises(ot.OrtrainError, match=r"Model\(inputs=...\): received a dict \(keys \['a', 'b'\]\); pass a "
                                              r"list of tensors in input order"):
        ot.Model({"a": a, "b": b}, h)
    with pytest.raises(ot.OrtrainError, match=r"Model\(outputs=...\): received a dict \(keys \['cls'\]\)"):
        ot.Model([a, b], {"cls": h})
    with pytest.raises(ot.OrtrainError, match=r"Model\(outputs=...\): received a nested structure"):
        ot.Model([a, b], [h, [h]])
    inner = ot.Sequential([L.Dense(3)], input_shape=(4,))
    with pytest.raises(ot.OrtrainError, match=r"Sequential: received a model .* list its layers instead, "
                                              r"ot.Sequential\(model.layers \+ \[...\]\)"):
        ot.Sequential([inner, L.Dense(1)], input_shape=(4,))
    imported = ot.from_onnx(onnx.load(inner.export_onnx(tmp_path / "inner.onnx")))
    with pytest.raises(ot.OrtrainError, match=r"an imported model \(from_onnx\) has no layers to list"):
        ot.Sequential([imported, L.Dense(1)], input_shape=(4,))
    x = ot.Input((3,), name="x")
    h = L.Dense(2)(x)
    model = ot.Model(x, [h, L.Dense(1)(h)])
    for metrics in ([["mae"], ["mse"]], {"output_0": "mae"}):
        with pytest.raises(ot.OrtrainError, match=r"^metrics: received .*, metrics by output \(Keras' form for "
                                                  r"named or several outputs\); .* pass one list of names"):
            model.compile(optimizer="sgd", loss="mse", metrics=metrics)
    model.compile(optimizer="sgd", loss="mse")
    xs, ys, before = np.ones((8, 3), np.float32), np.ones((8, 2), np.float32), model.get_weights()
    per_output = r"^sample_weight: received a list of 2 arrays, Keras' form for several outputs; .* first output"
    for call in (lambda: model.fit(xs, ys, sample_weight=[np.ones(8), np.ones(8)], verbose=0),
                 lambda: model.evaluate(xs, ys, sample_weight=[np.ones(8), np.ones(8)]),
                 lambda: model.train_on_batch(xs, ys, sample_weight=(np.ones(8), np.ones(8)))):
        with pytest.raises(ot.OrtrainError, match=per_output):
            call()
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    with pytest.warns(UserWarning, match="do not affect the loss"):
        model.fit(xs, ys, sample_weight=[1.0] * 8, verbose=0)  # a list of numbers is one weight per sample
    with pytest.raises(ot.OrtrainError, match=per_output):  # lists of numbers, one per output
        model.fit(xs, ys, sample_weight=[[1.0] * 8, [1.0] * 8], verbose=0)
    # a batch of as many rows as outputs: the list is read as rows, and its refusal names both forms
    with pytest.raises(ot.ShapeError, match=r"received \(2, 2\); .* one array per output \(Keras' form for "
                                            r"several outputs\), give the first output's alone"):
        model.fit(xs[:2], ys[:2], sample_weight=[np.ones(2), np.ones(2)], verbose=0)
    # a list of per-sample weights one row short is no list of per-output arrays: no such hint
    with pytest.raises(ot.ShapeError, match=r"received \(7, 1\)$"):
        model.fit(xs, ys, sample_weight=[np.ones(1)] * 7, verbose=0)
    # a list of as many weight rows as the batch has rows stays rows (per position), as many as outputs
    seq = ot.Input((5, 3))
    positions = ot.Model(seq, [L.Dense(1)(seq), L.Dense(2)(seq)])
    positions.compile(optimizer="sgd", loss="mse")
    rows = [np.array([1, 1, 1, 0, 0], np.float32), np.ones(5, np.float32)]
    seqs, targets = np.ones((2, 5, 3), np.float32), np.ones((2, 5, 1), np.float32)
    assert positions.evaluate(seqs, targets, sample_weight=rows) == \
        positions.evaluate(seqs, targets, sample_weight=np.stack(rows))
    passed = ot.Model(x, [x, L.Dense(1, name="q")(x)])
    passed.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.OrtrainError, match=r"^nothing to train: the loss is computed on the first output "
                                              r"'output_0', which no trainable weight affects \(q.kernel, q.bias"):
        passed.fit(xs, np.ones((8, 3), np.float32), verbose=0)


def test_input_and_output_names_are_the_keys_of_dicts():
    # a tensor of an unnamed ot.Input reports .name None, and nothing said which keys a dict of inputs
    # takes ('input', 'input_0', ...) but a refused call
    a, b = ot.Input((3,)), ot.Input((2,), name="right")
    h = ot.layers.Add()([ot.layers.Dense(2)(a), ot.layers.Dense(2)(b)])
    model = ot.Model([a, b], [ot.layers.Dense(1)(h), ot.layers.Dense(2)(h)])
    assert (model.input_names, model.output_names) == (["input_0", "right"], ["output_0", "output_1"])
    x = [np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)]
    np.testing.assert_array_equal(model.predict(dict(zip(model.input_names, x)))[1], model.predict(x)[1])
    single = ot.Sequential([ot.layers.Dense(1)], input_shape=(3,))
    assert (single.input_names, single.output_names) == (["input"], ["output"])
    with pytest.raises(ot.ShapeError, match=r"input name \['input'\] \(model.input_names\); missing \['input'\]"):
        single.predict({None: x[0]})
