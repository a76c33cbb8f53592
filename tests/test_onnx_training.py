"""Training imported models: PyTorch parity on exported files, the ONNX model zoo, and the Model surface.

The committed files under ``tests/data`` carry the PyTorch figures (``<name>.npz``), so the
parity checks run without torch; with torch (and onnxscript for the dynamo exporter) the
same checks also run on files exported afresh.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from _onnx_helpers import DATA, make_models
from conftest import torch_or_skip

import ortrain as ot

STEPS = make_models.STEPS


def _path(directory: Path, name: str) -> Path:
    return directory / "convnet_dynamo" / "model.onnx" if name == "convnet_dynamo" else directory / f"{name}.onnx"


def _loss(name: str):
    kind = make_models.SPECS[name][0]
    return "mse" if kind == "mse" else ot.losses.SparseCategoricalCrossentropy(from_logits=True)


def _check_parity(path: Path, ref: dict, name: str) -> list[float]:
    """Three SGD steps through a Trainer; losses and weights against PyTorch's."""
    model = ot.from_onnx(path).compile(optimizer=ot.optim.SGD(lr=make_models.LR), loss=_loss(name))
    b = int(ref["batch"])
    with ot.Trainer(model, batch_size=b) as tr:
        losses = [tr.step(ref["x"][i * b:(i + 1) * b], ref["y"][i * b:(i + 1) * b]) for i in range(STEPS)]
        trained = tr.model()
    np.testing.assert_allclose(losses, ref["losses"], rtol=1e-4, atol=1e-5)
    weights = dict(zip(trained.weight_names(), trained.get_weights(), strict=True))
    roles = {p.name: p.role for p in trained.params()}
    compared = 0
    for key, want in ref.items():
        name_ = key[2:]
        if not key.startswith("w/") or name_.endswith("running_var"):
            continue  # PyTorch tracks the unbiased batch variance, onnxruntime-training the biased one
        assert roles[name_] in ("trainable", "buffer"), name_
        np.testing.assert_allclose(weights[name_], want, rtol=1e-4, atol=1e-5, err_msg=name_)
        compared += 1
    assert compared == sum(1 for p in trained.params() if not p.name.endswith("running_var"))
    return losses


@pytest.mark.parametrize("name", sorted(make_models.SPECS))
def test_committed_exports_match_pytorch(name):
    ref = dict(np.load(DATA / f"{name}.npz"))
    _check_parity(_path(DATA, name), ref, name)


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(make_models.SPECS))
def test_fresh_exports_match_pytorch(name, tmp_path):
    torch_or_skip()
    if name == "convnet_dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    path, ref = make_models.make(name, tmp_path)
    proto = onnx.load(str(path), load_external_data=False)
    ops = [n for n in proto.graph.node if n.op_type in ("BatchNormalization", "LayerNormalization")]
    if name == "cnn_bn_train":
        assert len(ops[0].output) == 3  # what makes the repair necessary
    if name == "convnet_dynamo":
        assert [o.version for o in proto.opset_import if o.domain == ""] == [18]
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
        assert any(not t.dims and t.data_type == onnx.TensorProto.FLOAT for t in proto.graph.initializer)
    if name == "encoder_opset17":
        assert ops and all(len(n.output) == 1 for n in ops)
    _check_parity(path, ref, name)


# -- the ONNX model zoo (light files inside the onnx wheel, random weights) -----------------

def _zoo_steps(name: str, lr: float = 0.01):
    model = ot.from_onnx(make_models.light_model(name))
    model.compile(optimizer=ot.optim.SGD(lr=lr), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 1000, 1)
    times, losses = [], []
    with ot.Trainer(model, batch_size=1) as tr:
        for _ in range(STEPS):  # one sample, three times: the loss on it must fall
            start = time.perf_counter()
            losses.append(tr.step(x, y))
            times.append(time.perf_counter() - start)
        trained = tr.model()
    return model, trained, losses, times


def _moved(before, after):
    trainable = [p.name for p in before.params() if p.role == "trainable"]
    b = dict(zip(before.weight_names(), before.get_weights(), strict=True))
    a = dict(zip(after.weight_names(), after.get_weights(), strict=True))
    return [n for n in trainable if not np.array_equal(a[n], b[n])], trainable


def test_resnet50_from_the_zoo_trains(capsys):
    model, trained, losses, times = _zoo_steps("resnet50")
    proto = model.forward_graph().proto
    assert not any(n.op_type == "Sum" for n in proto.graph.node)
    assert model.input_specs[0].shape == (1, 3, 224, 224)  # the final Reshape pins the batch
    assert len(model.params()) == 267 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    moved, trainable = _moved(model, trained)
    assert len(moved) == len(trainable) == 161
    with capsys.disabled():
        print(f"\nResNet-50 (light zoo, random weights), batch 1 at 224x224: step times "
              f"{', '.join(f'{t * 1e3:.0f} ms' for t in times)}; losses {', '.join(f'{v:.4f}' for v in losses)}")


def test_shufflenet_from_the_zoo_trains():
    model, trained, losses, _ = _zoo_steps("shufflenet")
    proto = model.forward_graph().proto
    assert repairs_opset(proto) == 17 and proto.ir_version >= 8
    assert not any(n.op_type == "Sum" for n in proto.graph.node)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    moved, trainable = _moved(model, trained)
    assert len(moved) >= len(trainable) - 2  # a bias whose every gradient a ReLU zeroes may stay put
    # Same forward as the untouched opset-9 file, run by onnxruntime's own inference session.
    from ortrain.engine import _runtime
    original = make_models.light_model("shufflenet")
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = _runtime.ort.InferenceSession(original.SerializeToString()).run(None, {"gpu_0/data_0": x})[0]
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-6)


def repairs_opset(proto) -> int:
    from ortrain.graph.opsets import default_opset
    return default_opset(proto)


# -- the Model surface -------------------------------------------------------------------------

def _trained_encoder():
    ref = dict(np.load(DATA / "encoder_opset17.npz"))
    model = ot.from_onnx(DATA / "encoder_opset17.onnx")
    model.compile(optimizer="adam", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    with ot.Trainer(model, batch_size=4) as tr:
        for i in range(STEPS):
            tr.step(ref["x"][i * 4:(i + 1) * 4], ref["y"][i * 4:(i + 1) * 4])
        trained = tr.model()
    return model, trained, ref


def test_imported_model_behaves_like_any_model(tmp_path):
    model, trained, ref = _trained_encoder()
    x, y = ref["x"], ref["y"]
    names = trained.weight_names()
    assert names[0] == "layer.self_attn.in_proj_weight" and len(trained.get_weights()) == len(names)
    # export_onnx: a plain inference graph with the trained weights; onnxruntime runs it.
    out = trained.export_onnx(tmp_path / "encoder.onnx")
    exported = onnx.load(out)
    onnx.checker.check_model(exported)
    assert {t.name for t in exported.graph.initializer} >= set(names)
    from ortrain.engine import _runtime
    got = _runtime.ort.InferenceSession(exported.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, trained.predict(x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(trained.predict(x), model.predict(x))  # the weights moved
    # save / load_model keep architecture, weights, roles and compile settings.
    trained.save(tmp_path / "encoder.ortrain")
    loaded = ot.load_model(tmp_path / "encoder.ortrain")
    np.testing.assert_array_equal(loaded.predict(x), trained.predict(x))
    assert [p.role for p in loaded.params()] == [p.role for p in trained.params()]
    ev = loaded.evaluate(x, y)
    logits = trained.predict(x).astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(ev["loss"], -logp[np.arange(len(y)), y].mean(), rtol=1e-5)
    np.testing.assert_allclose(ev["accuracy"], np.mean(logits.argmax(1) == y))


def test_freezing_an_imported_model_by_pattern():
    model = ot.from_onnx(DATA / "cnn_bn_eval.onnx")
    model.freeze("0.*")
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    ref = dict(np.load(DATA / "cnn_bn_eval.npz"))
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(ref["x"][:4], ref["y"][:4])
        after = dict(zip(tr.model().weight_names(), tr.model().get_weights(), strict=True))
    before = dict(zip(model.weight_names(), model.get_weights(), strict=True))
    np.testing.assert_array_equal(after["0.weight"], before["0.weight"])
    assert not np.array_equal(after["5.weight"], before["5.weight"])


def test_fit_trains_an_imported_model():
    pytest.importorskip("ortrain.fit", reason="the fit loop is not part of this tree yet")
    ref = dict(np.load(DATA / "cnn_bn_train.npz"))
    model = ot.from_onnx(DATA / "cnn_bn_train.onnx")
    model.compile(optimizer=ot.optim.SGD(lr=make_models.LR),
                  loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(ref["x"], ref["y"], batch_size=4, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(hist.history["loss"][0], np.mean(ref["losses"]), rtol=1e-4)


def test_artifacts_from_an_onnx_file_train_through_from_artifacts(tmp_path):
    ref = dict(np.load(DATA / "cnn_bn_train.npz"))
    art = ot.artifacts.build(DATA / "cnn_bn_train.onnx", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
                             optimizer=ot.optim.SGD(lr=make_models.LR), out_dir=tmp_path / "art")
    assert {p.name: p.role for p in art.params}["1.running_mean"] == "buffer"
    with ot.Trainer.from_artifacts(art.directory, batch_size=4) as tr:
        losses = [tr.step(ref["x"][4 * i:4 * i + 4], ref["y"][4 * i:4 * i + 4]) for i in range(STEPS)]
    np.testing.assert_allclose(losses, ref["losses"], rtol=1e-4, atol=1e-5)


def test_an_output_with_the_batch_on_its_second_axis_is_refused_for_training_and_changes_nothing(tmp_path):
    # (3, N) from a transpose: fit stated an impossible expected label shape "(7, N)" for labels of
    # the output's own shape, and ran labels of the input's rows into the runtime's error
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["z"]), h.make_node("Transpose", ["z"], ["y"], perm=[1, 0])],
                     "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [3, "N"])], [nh.from_array(w, "W")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "t.onnx")
    model = ot.from_onnx(tmp_path / "t.onnx")
    model.compile(optimizer="adam", loss="mse")
    x = np.ones((7, 4), np.float32)
    np.testing.assert_allclose(model.predict(x), (x @ w).T, rtol=1e-6)  # predict is unaffected
    want = "output 'y' has shape \\(3, N\\), the inputs' batch on a later axis, so its rows are not the samples"
    for y in (np.zeros((3, 7), np.float32), np.zeros((7, 3), np.float32)):
        for batch_size in (None, 3, 7):
            with pytest.raises(ot.ShapeError, match=want):
                model.fit(x, y, epochs=1, batch_size=batch_size, verbose=0)
            with pytest.raises(ot.ShapeError, match=want):
                model.evaluate(x, y, batch_size=batch_size, verbose=0)
    with ot.Trainer(model, batch_size=7) as tr, pytest.raises(ot.ShapeError, match=want):
        tr.step(x, np.zeros((3, 7), np.float32))
    np.testing.assert_array_equal(model.get_weights()[0], w)


def test_an_output_with_a_fixed_first_size_trains_in_batches_of_exactly_that_size(tmp_path):
    # an output the file declares with a fixed first axis, without naming the batch on another (an
    # output kept at its export's example batch): fit, evaluate and Trainer take batches of exactly
    # that size, given (nothing in the shapes tells it from a transposed output), and refuse others
    # before anything runs (they reached the runtime's dimension error); trained against numpy
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh
    w = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["z"]), h.make_node("Transpose", ["z"], ["y"], perm=[1, 0])],
                     "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [3, "K"])], [nh.from_array(w, "W")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "t.onnx")
    model = ot.from_onnx(tmp_path / "t.onnx")
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x9 = np.random.default_rng(2).standard_normal((9, 4)).astype(np.float32)
    y9 = np.random.default_rng(3).standard_normal((9, 3)).astype(np.float32)
    with ot.Trainer(model, batch_size=3) as tr:
        loss = tr.step(x9[:3], y9[:3])
        with pytest.raises(ot.ShapeError, match="every batch must hold exactly 3 rows; received 6 rows in a batch"):
            ot.Trainer(model, batch_size=6).step(x9[:6], y9[:6])
        trained = tr.model().get_weights()[0]
    d = (x9[:3] @ w).T - y9[:3]
    np.testing.assert_allclose(loss, np.mean(d ** 2), rtol=1e-5)
    np.testing.assert_allclose(trained, w - 0.1 * 2 * x9[:3].T @ d.T / d.size, rtol=1e-5, atol=1e-6)
    for call in (model.fit, model.evaluate):
        for batch_size, received in ((None, "9 rows in one batch"), (9, "batch_size=9")):
            with pytest.raises(ot.ShapeError, match=f"every batch must hold exactly 3 rows; received {received}. "
                                                    r"Give batches of 3 rows \(batch_size=3\)"):
                call(x9, y9, batch_size=batch_size, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[0], w)
    with pytest.raises(ot.ShapeError, match="every batch must hold exactly 3 rows; received 8 rows"):
        model.fit(x9[:8], y9[:8], batch_size=3, verbose=0)
    model.fit(x9, y9, batch_size=3, epochs=1, shuffle=False, verbose=0)
    ref = w.astype(np.float64)
    for i in range(0, 9, 3):
        xb, yb = x9[i:i + 3], y9[i:i + 3]
        ref = ref - 0.1 * 2 * xb.T @ ((xb @ ref).T - yb).T / yb.size
    np.testing.assert_allclose(model.get_weights()[0], ref, rtol=1e-5, atol=1e-6)
    trained = model.get_weights()[0]
    want_loss = np.mean([np.mean(((x9[i:i + 3] @ trained).T - y9[i:i + 3]) ** 2) for i in range(0, 9, 3)])
    np.testing.assert_allclose(model.evaluate(x9, y9, batch_size=3, verbose=0)["loss"], want_loss, rtol=1e-5)
    # one batch of exactly 3 rows needs no batch size: test_on_batch, a generator's batches
    np.testing.assert_allclose(model.test_on_batch(x9[:3], y9[:3]),
                               np.mean(((x9[:3] @ trained).T - y9[:3]) ** 2), rtol=1e-5)
    batches = [(x9[i:i + 3], y9[i:i + 3]) for i in range(0, 9, 3)]
    np.testing.assert_allclose(model.evaluate(iter(batches), steps=3, verbose=0)["loss"], want_loss, rtol=1e-5)
    # labels without a free axis (class indices): a Trainer batch of another size is refused too
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    with ot.Trainer(model, batch_size=6) as tr, pytest.raises(ot.ShapeError, match="exactly 3 rows; received 6 rows"):
        tr.step(x9[:6], np.zeros(6, np.int64))
