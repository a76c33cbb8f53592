"""Artifact generation, the content-hash cache and validation of what is loaded."""

import json

import numpy as np
import onnx
import pytest
from helpers import dense_model, open_session

import ortrain as ot
from ortrain import engine


def test_build_writes_checked_graphs_and_manifest(tmp_path):
    model = dense_model(4, 2, loss="mse", optimizer="adamw")
    art = ot.artifacts.build(model, loss="mse", optimizer="adamw", out_dir=tmp_path / "a")
    for name in ("training.onnx", "eval.onnx", "optimizer.onnx", "forward.onnx", "checkpoint", "manifest.json"):
        assert (tmp_path / "a" / name).is_file()
    for name in ("training.onnx", "eval.onnx", "forward.onnx"):
        m = onnx.load(tmp_path / "a" / name)
        assert m.ir_version <= 10  # onnxruntime-training 1.19.2 reads IR <= 10
    onnx.checker.check_model(onnx.load(tmp_path / "a" / "forward.onnx"))
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man["inputs"] == [{"name": "input", "dtype": "float32", "shape": [None, 4]}]
    assert man["parameters"] == [
        {"name": "dense_0.kernel", "shape": [4, 2], "dtype": "float32", "role": "trainable"},
        {"name": "dense_0.bias", "shape": [2], "dtype": "float32", "role": "trainable"}]
    assert man["loss"] == {"name": "mse"} and man["optimizer"]["name"] == "adamw"
    assert set(man["versions"]) == {"ortrain", "onnx", "onnxruntime"}
    assert len(man["key"]) == 64
    # The checkpoint holds the model's weights.
    data = engine.read_checkpoint(art.checkpoint)
    for name, w in zip(model.weight_names(), model.get_weights()):
        np.testing.assert_array_equal(data.trainable[name], w)


def test_second_build_is_a_cache_hit(monkeypatch):
    model = dense_model(4, 2)
    first = ot.artifacts.build(model, loss="mse", optimizer="adam")
    calls = []
    real = engine.build_training_graphs
    monkeypatch.setattr(engine, "build_training_graphs", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = ot.artifacts.build(model, loss="mse", optimizer="adam")
    assert again.directory == first.directory and not calls
    # Same architecture, other weights: still a hit, only the checkpoint is rewritten.
    other = dense_model(4, 2, seed=99)
    hit = ot.artifacts.build(other, loss="mse", optimizer="adam")
    assert hit.directory == first.directory and not calls
    np.testing.assert_array_equal(engine.read_checkpoint(hit.checkpoint).trainable["dense_0.kernel"],
                                  other.get_weights()[0])
    # Changed loss or optimizer: a miss.
    assert ot.artifacts.build(model, loss="mae", optimizer="adam").directory != first.directory
    assert ot.artifacts.build(model, loss="mse", optimizer="sgd").directory != first.directory
    assert ot.artifacts.build(model, loss="mse", optimizer=ot.optim.AdamW(weight_decay=0.3)).directory \
        != first.directory
    assert len(calls) == 3
    # The learning rate does not shape the graphs.
    assert ot.artifacts.build(model, loss="mse", optimizer=ot.optim.Adam(lr=0.5)).directory == first.directory


def test_frozen_and_trainable_patterns_shape_the_artifacts():
    model = dense_model(4, 2)
    art = ot.artifacts.build(model, frozen=["*.bias"])
    roles = {p.name: p.role for p in art.params}
    assert roles == {"dense_0.kernel": "trainable", "dense_0.bias": "frozen"}
    art2 = ot.artifacts.build(model, trainable="*.bias")
    assert {p.name: p.role for p in art2.params} == {"dense_0.kernel": "frozen", "dense_0.bias": "trainable"}
    with pytest.raises(ot.OrtrainError, match="frozen: 'nothing\\*' matches no weight"):
        ot.artifacts.build(model, frozen=["nothing*"])
    with pytest.raises(ot.OrtrainError, match="nothing to train"):
        ot.artifacts.build(model, frozen=["*"])


@pytest.mark.parametrize("victim", ["manifest.json", "training.onnx", "checkpoint"])
def test_tampered_files_are_refused(tmp_path, victim):
    ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path / "a")
    path = tmp_path / "a" / victim
    if victim == "manifest.json":
        path.write_text(path.read_text()[:-20])
        match = "not valid JSON"
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        match = "does not match the sha256"
    with pytest.raises(ot.OrtrainError, match=match):
        ot.artifacts.load(tmp_path / "a")


def test_other_versions_are_refused(tmp_path):
    ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path / "a")
    mpath = tmp_path / "a" / "manifest.json"
    man = json.loads(mpath.read_text())
    man["versions"]["onnxruntime"] = "1.18.0"
    mpath.write_text(json.dumps(man))
    with pytest.raises(ot.OrtrainError, match="were written by .*onnxruntime 1.18.0.*Rebuild them"):
        ot.artifacts.load(tmp_path / "a")
    # build() rebuilds over a stale directory instead of failing.
    art = ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path / "a")
    assert art.manifest["versions"]["onnxruntime"] == engine.ORT_VERSION


def test_out_dir_with_foreign_files_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ot.OrtrainError, match="is not an ortrain artifacts directory"):
        ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    with pytest.raises(ot.OrtrainError, match="no manifest.json"):
        ot.artifacts.load(tmp_path)


def test_artifacts_open_in_a_raw_session():
    art = ot.artifacts.build(dense_model(4, 2))
    sess = open_session(art)
    assert [s.name for s in sess.train_inputs] == ["input", "ortrain.label", "ortrain.loss_scale"]
    assert sess.train_outputs[:2] == ["ortrain.scaled_loss", "ortrain.loss"]
    sess.free()
