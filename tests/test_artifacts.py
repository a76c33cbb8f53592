"""Artifact generation, the content-hash cache and validation of what is loaded."""

import json
import multiprocessing
import os
import re

import numpy as np
import onnx
import pytest
from helpers import dense_model, open_session

import ortrain as ot
from ortrain import engine
from ortrain._manifest import text_of


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


def test_second_build_is_a_cache_hit(monkeypatch, record_property):
    import time
    model = dense_model(4, 2)
    t0 = time.perf_counter()
    first = ot.artifacts.build(model, loss="mse", optimizer="adam")
    t1 = time.perf_counter()
    calls = []
    real = engine.build_training_graphs
    monkeypatch.setattr(engine, "build_training_graphs", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = ot.artifacts.build(model, loss="mse", optimizer="adam")
    t2 = time.perf_counter()
    record_property("cache_hit_seconds_over_first_build", round((t2 - t1) / (t1 - t0), 4))  # timed, not asserted
    assert again.directory == first.directory and not calls
    # Same architecture, other weights: no new graphs; a directory of its own for the weights,
    # so the first record still holds the first weights.
    other = dense_model(4, 2, seed=99)
    hit = ot.artifacts.build(other, loss="mse", optimizer="adam")
    assert hit.directory != first.directory and hit.key == first.key and not calls
    assert os.path.samefile(hit.training, first.training)  # graph files shared by hard link
    np.testing.assert_array_equal(engine.read_checkpoint(hit.checkpoint).trainable["dense_0.kernel"],
                                  other.get_weights()[0])
    np.testing.assert_array_equal(engine.read_checkpoint(first.checkpoint).trainable["dense_0.kernel"],
                                  model.get_weights()[0])
    assert ot.artifacts.build(other, loss="mse", optimizer="adam").directory == hit.directory
    # The Trainer's use: any weights are fine, the cached directory is used as it is.
    assert ot.artifacts.build(other, loss="mse", optimizer="adam", refresh_checkpoint=False).directory \
        == first.directory
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


def test_hand_edited_manifest_fields_are_refused_by_name(tmp_path):
    ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path / "a")
    mpath = tmp_path / "a" / "manifest.json"
    good = mpath.read_text()
    fields = ["key", "versions", "files", "inputs", "outputs", "label", "sample_weight", "parameters", "loss",
              "optimizer", "prediction", "train_outputs", "weighting"]
    for field in fields:
        for bad in (5, [5]) + (() if field in ("versions", "loss", "optimizer") else ({"name": 5},)):
            man = json.loads(good)
            man[field] = bad
            mpath.write_text(json.dumps(man))
            with pytest.raises(ot.OrtrainError, match=rf"manifest.json': {field} expected .*, received "
                                                      rf"{re.escape(repr(bad))}; the directory is damaged"):
                ot.artifacts.load(tmp_path / "a")
    man = json.loads(good)
    man["parameters"][0]["shape"] = [None, 2]   # weights have fixed shapes
    man["prediction"] = "output"
    mpath.write_text(json.dumps(man))
    with pytest.raises(ot.OrtrainError, match="parameters expected a list of parameter specs"):
        ot.artifacts.load(tmp_path / "a")
    man = json.loads(good)
    man["prediction"] = "logits"
    mpath.write_text(json.dumps(man))
    with pytest.raises(ot.OrtrainError, match="prediction expected one of the outputs' names, received 'logits'"):
        ot.artifacts.load(tmp_path / "a")
    man = json.loads(good)   # values of the right types: what the manifest's own sha256 catches
    for edit in (lambda m: m["inputs"][0]["shape"].__setitem__(1, 5), lambda m: m["parameters"].reverse(),
                 lambda m: m["parameters"][0].__setitem__("name", "dense_9.kernel"),
                 lambda m: m["optimizer"].__setitem__("lr", 0.5), lambda m: m.pop("manifest_sha256")):
        man = json.loads(good)
        edit(man)
        mpath.write_text(json.dumps(man))
        with pytest.raises(ot.OrtrainError, match=r"manifest.json' does not match its own sha256 \(manifest_sha256\): "
                                                  "it was changed or damaged after it was written; rebuild"):
            ot.artifacts.load(tmp_path / "a")
    mpath.write_text(good)
    assert ot.artifacts.load(tmp_path / "a").manifest == json.loads(good)


def test_a_manifest_of_format_1_without_its_own_sha256_is_still_read(tmp_path):
    """Artifacts (and command-line runs) written before the manifest held its own sha256 load and resume."""
    art = ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path / "a")
    mpath = tmp_path / "a" / "manifest.json"
    man = json.loads(mpath.read_text())
    man.pop("manifest_sha256")
    man["format"] = 1
    mpath.write_text(json.dumps(man, indent=2, sort_keys=True))
    loaded = ot.artifacts.load(tmp_path / "a")
    assert loaded.manifest["format"] == 1 and loaded.manifest["parameters"] == art.manifest["parameters"]
    with ot.Trainer.from_artifacts(tmp_path / "a", batch_size=2) as tr:
        assert np.isfinite(tr.step(np.ones((2, 4), np.float32), np.zeros((2, 2), np.float32)))


def test_a_cache_entry_whose_manifest_was_damaged_is_rebuilt(tmp_path):
    """A bit flipped in a cached manifest.json (a weight's name, an input's size) broke that model's
    training for good: the manifest is checked against its own sha256, and the entry rebuilt."""
    model = dense_model(4, 2)
    entry = ot.artifacts.build(model, loss="mse").directory
    mpath = entry / "manifest.json"
    good = mpath.read_bytes()
    for damaged in (good.replace(b'"dense_0.kernel"', b'"dense_1.kernel"', 1), good.replace(b"4\n", b"5\n", 1)):
        assert damaged != good
        mpath.write_bytes(damaged)
        x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
        with ot.Trainer(model, batch_size=8) as tr:
            tr.step(x, y)
            assert tr.weight_names() == model.weight_names()
            np.testing.assert_allclose(tr.predict(x), x @ tr.get_weights()[0] + tr.get_weights()[1], rtol=1e-6)
        assert ot.artifacts.build(model, loss="mse").directory == entry
        assert json.loads(mpath.read_bytes()) == json.loads(good)


def test_other_versions_are_refused(tmp_path):
    ot.artifacts.build(dense_model(4, 2), out_dir=tmp_path / "a")
    mpath = tmp_path / "a" / "manifest.json"
    man = json.loads(mpath.read_text())
    man["versions"]["onnxruntime"] = "1.18.0"
    mpath.write_text(text_of(man))   # as an ortrain beside that onnxruntime wrote it
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


def _build_in_process(cache: str, queue) -> None:
    import ortrain as ot
    ot.artifacts.set_cache_dir(cache)
    try:
        art = ot.artifacts.build(dense_model(16, 8), loss="mse", optimizer="adam")
        with ot.Trainer.from_artifacts(art.directory, batch_size=4) as tr:
            tr.step(np.ones((4, 16)), np.zeros((4, 8)))
        queue.put(("ok", str(art.directory)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", repr(exc)))


def test_concurrent_builders_of_one_key_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(str(tmp_path / "cache"), queue)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(status == "ok" for status, _ in results), results
    assert len({directory for _, directory in results}) == 1


def test_weights_that_only_feed_other_outputs_are_frozen_with_a_warning(rng):
    import ortrain as ot
    inp = ot.Input((4,))
    h = ot.layers.Dense(8, activation="relu")(inp)
    model = ot.Model(inp, [ot.layers.Dense(2)(h), ot.layers.Dense(5)(h)])  # the loss sees the first head
    model.compile(optimizer="adam", loss="mse")
    with pytest.warns(UserWarning, match="dense_2.kernel, dense_2.bias do not affect the loss"):
        tr = ot.Trainer(model, batch_size=4)
    before = model.get_weights()
    tr.step(rng.standard_normal((4, 4)), rng.standard_normal((4, 2)))
    after = tr.model().get_weights()
    np.testing.assert_array_equal(after[4], before[4])  # the second head is untouched
    assert not np.array_equal(after[2], before[2])
    tr.free()


def _sum_model(shapes: dict[str, tuple]) -> onnx.ModelProto:
    """y = x * (sum of every weight): one (N, 1) input, one output; each weight is all ones."""
    from onnx import TensorProto, helper, numpy_helper
    names = list(shapes)
    nodes = [helper.make_node("ReduceSum", [n], [f"{n}_sum"], keepdims=0) for n in names]
    total = f"{names[0]}_sum"
    for i, n in enumerate(names[1:]):
        nodes.append(helper.make_node("Add", [total, f"{n}_sum"], [f"total{i}"]))
        total = f"total{i}"
    nodes.append(helper.make_node("Mul", ["x", total], ["y"]))
    weights = [numpy_helper.from_array(np.ones(s, np.float32), n) for n, s in shapes.items()]
    graph = helper.make_graph(nodes, "sums", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_empty_weight_is_frozen_and_the_others_train_as_sgd_moves_them():
    # the runtime's gradient of a weight with no values crashed the process: it is frozen instead
    model = ot.from_onnx(_sum_model({"empty": (0,), "w": (3,)}))
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:
        assert tr._session.trainable_names == ["w"]
        x, y = np.ones((2, 1), np.float32), np.zeros((2, 1), np.float32)
        loss = tr.step(x, y)
        weights = dict(zip(tr.model().weight_names(), tr.model().get_weights()))
    # y = 3 for both rows: loss 9; d loss / d w_i = mean over rows of 2 (y - 0) x = 6
    assert loss == pytest.approx(9.0)
    np.testing.assert_allclose(weights["w"], 1.0 - 0.1 * 6.0, rtol=1e-6)
    assert weights["empty"].shape == (0,)


def test_a_model_whose_only_trainable_weights_are_empty_is_refused():
    model = ot.from_onnx(_sum_model({"nothing": (0,), "none": (2, 0)}))
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ot.OrtrainError, match=r"nothing to train: every trainable weight is empty \(none, nothing: "):
        ot.Trainer(model, batch_size=2)


def test_build_follows_the_documented_signature(tmp_path):
    """``build(model_or_onnx, loss="mse", optimizer="adamw", out_dir=None)``: positional in that
    order, the model by keyword too, and AdamW (weight decay 0.01) by default."""
    model = dense_model(4, 2)
    positional = ot.artifacts.build(model, "mae", "sgd", tmp_path / "p")
    assert (positional.manifest["loss"]["name"], positional.manifest["optimizer"]["name"]) == ("mae", "sgd")
    default = ot.artifacts.build(model_or_onnx=model, out_dir=tmp_path / "d")
    opt = default.manifest["optimizer"]
    assert (opt["name"], opt["weight_decay"], opt["lr"]) == ("adamw", 0.01, 1e-3)
    assert default.directory == tmp_path / "d"


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    ot.artifacts.set_cache_dir(tmp_path / "cache")   # not there yet
    model = dense_model(3, 2)
    for kwargs, message in ((dict(weighting="bogus", out_dir=tmp_path / "a"), "weighting: expected None, 'sample'"),
                            (dict(frozen=["*"], out_dir=tmp_path / "x" / "y" / "z"), "nothing to train"),
                            (dict(frozen=["*"]), "nothing to train"),
                            (dict(out_dir=5), r"out_dir: expected a directory path \(str or os.PathLike\) or None for "
                                              "the cache, received 5"),
                            (dict(out_dir=""), "out_dir: expected a directory path")):
        with pytest.raises(ot.OrtrainError, match=message):
            ot.artifacts.build(model, loss="mse", **kwargs)
    # A build that fails once it holds the lock (here: the gradient builder) removes the lock file
    # and the folders it made.
    from ortrain import engine

    def refuse(*args, **kwargs):
        raise ot.OrtrainError("the gradient builder failed")

    monkeypatch.setattr(engine, "build_training_graphs", refuse)
    for out_dir in (tmp_path / "x" / "y" / "z", None):
        with pytest.raises(ot.OrtrainError, match="the gradient builder failed"):
            ot.artifacts.build(model, loss="mse", out_dir=out_dir)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []   # no lock files, no folders made for the build
    (tmp_path / "file").write_text("")
    for out_dir in (tmp_path / "file", tmp_path / "file" / "art"):
        with pytest.raises(ot.OrtrainError, match="out_dir: '.*file.*' (is a file|lies under the file)"):
            ot.artifacts.build(model, loss="mse", out_dir=out_dir)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ot.OrtrainError, match=r"out_dir: '.*loop.*' cannot be reached \(Too many levels of symbolic "
                                              r"links\); artifacts need a directory"):
        ot.artifacts.build(model, loss="mse", out_dir=tmp_path / "loop" / "art")
    (tmp_path / "loop").unlink()
    old_umask = os.umask(0o022)
    try:
        art = ot.artifacts.build(model, loss="mse", out_dir=tmp_path / "art")
    finally:
        os.umask(old_umask)
    assert os.stat(art.directory).st_mode & 0o777 == 0o755   # readable by others, as mkdir would make it


def test_a_builder_waiting_on_a_failed_builders_lock_still_works_alone(tmp_path):
    import threading
    import time

    from ortrain._artifact_store import _publish_lock
    target = tmp_path / "new" / "art"
    inside, overlaps, errors = [], [], []

    def builder(start: float, hold: float, fail: bool) -> None:
        time.sleep(start)
        try:
            with _publish_lock(target):
                overlaps.append(list(inside))
                inside.append(start)
                time.sleep(hold)
                inside.remove(start)
                if fail:
                    raise RuntimeError("this build fails")
                target.mkdir(exist_ok=True)   # what publishing leaves
        except RuntimeError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # A fails while B waits on its lock (and its lock file and folder go); C comes while B works.
    threads = [threading.Thread(target=builder, args=args) for args in ((0.0, 0.3, True), (0.1, 0.4, False),
                                                                         (0.5, 0.0, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and overlaps == [[], [], []] and target.is_dir()


def test_a_hit_with_another_learning_rate_carries_it(tmp_path, monkeypatch):
    model = dense_model(3, 2)
    a = ot.artifacts.build(model, optimizer=ot.optim.Adam(lr=1e-3))
    b = ot.artifacts.build(model, optimizer=ot.optim.Adam(lr=0.5))
    assert a.directory == b.directory and (a.optimizer.lr, b.optimizer.lr) == (1e-3, 0.5)
    # the cached directory trains at its latest build's rate; a record at its own build's
    with ot.Trainer.from_artifacts(b.directory, batch_size=4) as tr:
        assert tr.lr == 0.5
    for record, lr in ((a, 1e-3), (b, 0.5)):
        with ot.Trainer.from_artifacts(record, batch_size=4) as tr:
            assert tr.lr == lr
    first = ot.artifacts.build(model, optimizer=ot.optim.Adam(lr=0.1), out_dir=tmp_path / "w")
    model.set_weights([w + 1 for w in model.get_weights()])
    ot.artifacts.build(model, optimizer=ot.optim.Adam(lr=0.1), out_dir=tmp_path / "w")   # other weights, in place
    with pytest.raises(ot.OrtrainError, match=r"directory: the artifacts in '.*w' were rebuilt .* with other weights"):
        ot.Trainer.from_artifacts(first, batch_size=4)
    # the record's model() gave the weights of the later build without a word
    with pytest.raises(ot.OrtrainError, match=r"the artifacts in '.*w' were rebuilt .* after this record was made; "
                                              r"build them again, or load the directory"):
        first.model()
    for got, want in zip(ot.artifacts.load(tmp_path / "w").model().get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)  # what the directory holds now
    assert b.model().predict(np.ones((1, 3), np.float32)).shape == (1, 2)  # a rate rewritten is no rebuild
    out = tmp_path / "art"
    ot.artifacts.build(model, optimizer=ot.optim.Adam(lr=1e-3), out_dir=out)
    ot.artifacts.build(model, optimizer=ot.optim.Adam(lr=0.5), out_dir=out)
    assert ot.artifacts.load(out).optimizer.lr == 0.5
    with ot.Trainer.from_artifacts(out, batch_size=4) as tr:
        assert tr.lr == 0.5
    # a relative $XDG_CACHE_HOME is ignored, as the XDG spec says
    ot.artifacts.set_cache_dir(None)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ot.artifacts.cache_dir() == tmp_path / ".cache" / "ortrain" / "artifacts"


def test_a_weights_variant_carries_the_requested_learning_rate(tmp_path):
    first, second = dense_model(3, 2, seed=0), dense_model(3, 2, seed=1)
    ot.artifacts.build(first, optimizer=ot.optim.Adam(lr=0.1), out_dir=tmp_path / "art")
    art = ot.artifacts.build(second, optimizer=ot.optim.Adam(lr=0.5), out_dir=tmp_path / "art")
    assert art.optimizer.lr == 0.5 and ot.artifacts.load(tmp_path / "art").optimizer.lr == 0.5
    ot.artifacts.build(first, optimizer=ot.optim.Adam(lr=1e-3))
    assert ot.artifacts.build(second, optimizer=ot.optim.Adam(lr=0.3)).optimizer.lr == 0.3   # the cache's variant


def test_artifacts_model_reads_a_checkpoint_of_the_same_model_and_loss_whatever_the_optimizer(tmp_path):
    model = dense_model(3, 2, optimizer="adam")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    with ot.Trainer(model, batch_size=4, loss_mask=1) as tr:  # artifacts with a weight input, Adam
        tr.step(x, y)
        tr.save_checkpoint(tmp_path / "ck")
        want = tr.model().get_weights()
    plain = ot.artifacts.build(model, loss="mse", optimizer="sgd", out_dir=tmp_path / "sgd")
    for a, b in zip(plain.model(tmp_path / "ck").get_weights(), want):
        np.testing.assert_array_equal(a, b)
    other = ot.artifacts.build(model, loss="mae", optimizer="adam", out_dir=tmp_path / "mae")
    with pytest.raises(ot.OrtrainError, match=r"was trained with the loss \{\"name\": \"mse\"\}.* compute "
                                              r"\{\"name\": \"mae\"\}"):
        other.model(tmp_path / "ck")


def test_an_interrupted_rebuild_of_an_out_dir_leaves_old_or_new_artifacts(tmp_path, monkeypatch):
    import shutil
    out = tmp_path / "art"
    ot.artifacts.build(dense_model(3, 2, seed=0), loss="mse", out_dir=out)
    real = shutil.rmtree

    def interrupted(path, *args, **kwargs):  # Ctrl-C while the replaced artifacts are removed
        if ".old-" in str(path):
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ot.artifacts.build(dense_model(3, 2, seed=1), loss="mse", out_dir=out)
    monkeypatch.undo()
    model = ot.artifacts.load(out).model()
    np.testing.assert_array_equal(model.get_weights()[0], dense_model(3, 2, seed=1).get_weights()[0])


def test_artifacts_model_refuses_a_checkpoint_of_another_architecture(tmp_path):
    small = ot.Sequential([ot.layers.Dense(8), ot.layers.Dense(1)], input_shape=(4,), seed=0, name="m")
    small.compile(optimizer="sgd", loss="mse")
    with ot.Trainer(small, batch_size=4) as tr:
        tr.step(np.ones((4, 4)), np.zeros((4, 1)))
        tr.save_checkpoint(tmp_path / "ck")
    wide = ot.Sequential([ot.layers.Dense(16), ot.layers.Dense(1)], input_shape=(4,), seed=0, name="m")
    art = ot.artifacts.build(wide, loss="mse", optimizer="sgd", out_dir=tmp_path / "art")  # same names, loss
    with pytest.raises(ot.OrtrainError, match="was trained with another architecture"):
        art.model(tmp_path / "ck")
    data = engine.read_checkpoint(tmp_path / "ck")
    del data.properties["ortrain.forward"], data.properties["ortrain.architecture"]  # an earlier version's: the
    # shapes still tell
    with pytest.raises(ot.OrtrainError, match=r"weights of other shapes .*dense_0.kernel \(4, 8\) for \(4, 16\)"):
        art.model(data)


def test_an_out_dir_holding_other_files_is_never_replaced(tmp_path):
    out = tmp_path / "web"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my-web-app"}')
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ot.OrtrainError, match=r"not an ortrain artifacts directory \(it holds manifest.json, "
                                              r"notes.txt\)"):  # another tool's manifest is the user's file
        ot.artifacts.build(dense_model(3, 2), loss="mse", out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_out_dir_through_a_link_keeps_the_link_and_the_working_directory_is_refused(tmp_path, monkeypatch):
    # A link to a folder (a mounted volume) was renamed away and replaced by a new folder, the linked
    # folder left empty; the working directory itself was replaced, leaving the shell in a deleted folder.
    model = dense_model(3, 2)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for _ in range(2):  # a build, then a hit through the link
        art = ot.artifacts.build(model, loss="mse", out_dir=tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "manifest.json").is_file()
    assert ot.artifacts.load(tmp_path / "link").key == art.key
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ot.OrtrainError, match=r"out_dir: '.*here' is the current working directory or holds it, "
                                              "and artifacts are written to a new folder renamed into its place"):
        ot.artifacts.build(model, loss="mse", out_dir=".")
    with pytest.raises(ot.OrtrainError, match="exists and is not an ortrain artifacts directory"):
        ot.artifacts.build(model, loss="mse", out_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "link", "real"]
    assert list((tmp_path / "here").iterdir()) == []
    monkeypatch.chdir(tmp_path / "real")  # inside artifacts of that very key: a hit replaces nothing
    assert ot.artifacts.build(model, loss="mse", out_dir=".").key == art.key


def test_the_cache_serves_hits_without_writing_and_names_what_it_cannot_write(tmp_path, monkeypatch):
    from ortrain import _artifact_store as store_mod
    model = dense_model(3, 2)
    first = ot.artifacts.build(model, loss="mse")
    other = dense_model(3, 2, seed=7)  # the same graphs, other weights: an entry of their own beside it
    second = ot.artifacts.build(other, loss="mse")
    assert second.directory.name.startswith(first.directory.name + "-")

    def unwritable(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(store_mod, "lock_file", unwritable)
    # an exact hit takes no lock: a read-only cache (baked into an image) serves it, and the entry of
    # other weights too (it was refused, the main entry's lock taken before that entry was looked at)
    assert ot.artifacts.build(model, loss="mse").directory == first.directory
    assert ot.artifacts.build(other, loss="mse").directory == second.directory
    # a miss names the cache and how to choose another (a raw PermissionError came from the lock file)
    with pytest.raises(ot.OrtrainError, match=r"the artifact cache '.*' cannot be written \(Permission denied: .*\); "
                                              r"make it writable, or choose another cache with "
                                              r"ot.artifacts.set_cache_dir\(path\) or XDG_CACHE_HOME"):
        ot.artifacts.build(model, loss="mae")
    with pytest.raises(ot.OrtrainError, match=r"out_dir: '.*art' cannot be written \(Permission denied"):
        ot.artifacts.build(model, loss="mse", out_dir=tmp_path / "art")
    monkeypatch.undo()
    # a stray file in a cache entry (a .DS_Store) made it "not an artifacts directory" for good: it is rebuilt
    (first.directory / ".DS_Store").write_text("")
    again = ot.artifacts.build(dense_model(3, 2, seed=5), loss="mse")
    assert again.directory.name.startswith(first.directory.name)


def test_a_file_where_a_cache_entry_goes_names_the_cache(tmp_path):
    # it said "out_dir: ... is a file", an argument the user never passed
    import shutil
    model = dense_model(3, 2)
    entry = ot.artifacts.build(model, loss="mse", optimizer="sgd").directory
    shutil.rmtree(entry)
    entry.write_text("")
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.OrtrainError, match=r"the artifact cache '.*' cannot hold an entry at '.*', which is a "
                                              r"file; remove that file, or choose another cache with "
                                              r"ot.artifacts.set_cache_dir\(path\) or XDG_CACHE_HOME"):
        model.fit(np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32), verbose=0)
    assert entry.is_file() and model.train_state is None


def test_a_cache_that_cannot_be_searched_is_said_so(monkeypatch):
    # the advice was "remove that file", where the cache is a folder this process may not search (played
    # by not_a_folder itself: tests may run with the right to search any folder)
    from ortrain import _artifact_store as store_mod
    monkeypatch.setattr(store_mod, "not_a_folder", lambda target: "cannot be reached (Permission denied)")
    with pytest.raises(ot.OrtrainError, match=r"the artifact cache '.*' cannot hold an entry at '.*', which cannot be "
                                              r"reached \(Permission denied\); make it searchable, or choose another "
                                              r"cache"):
        ot.artifacts.build(dense_model(3, 2), loss="mse", optimizer="adam")


def test_a_loaded_record_and_a_build_record_outlive_a_change_of_directory(tmp_path, monkeypatch):
    # a record of artifacts.load("relative") failed after os.chdir with "does not exist (moved or deleted?)"
    monkeypatch.chdir(tmp_path)
    model = dense_model(3, 2)
    ot.artifacts.build(model, loss="mse", optimizer="sgd", out_dir="art")
    loaded = ot.artifacts.load("art")
    assert loaded.directory == tmp_path / "art"
    monkeypatch.chdir("/")
    x = np.ones((4, 3), np.float32)
    with ot.Trainer.from_artifacts(loaded, batch_size=4) as tr:
        w, b = model.get_weights()
        np.testing.assert_allclose(tr.predict(x), x @ w + b, rtol=1e-6)


def test_a_record_with_a_checkpoint_of_other_artifacts_is_refused_naming_the_directory(tmp_path):
    # the refusal's message raised TypeError (os.fspath of the record)
    model = dense_model(4, 3)
    a = ot.artifacts.build(model, loss="mse", optimizer="adam", out_dir=tmp_path / "a")
    b = ot.artifacts.build(model, loss="huber", optimizer="adam", out_dir=tmp_path / "b")
    with ot.Trainer.from_artifacts(a, batch_size=8) as tr:
        tr.step(np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32))
        tr.save_checkpoint(tmp_path / "ck.ckpt")
    for given in (b, b.directory):
        with pytest.raises(ot.OrtrainError, match=r"checkpoint '.*ck.ckpt' was not written for the artifacts in "
                                                  r"'.*b' \(they differ from those it was written for in the "
                                                  r"loss\); resume with the artifacts that wrote it"):
            ot.Trainer.from_artifacts(given, batch_size=8, checkpoint=tmp_path / "ck.ckpt")


def test_a_relative_cache_dir_stays_where_it_was_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ot.artifacts.set_cache_dir("cache")
    assert ot.artifacts.cache_dir() == tmp_path / "cache"
    monkeypatch.chdir("/")
    assert ot.artifacts.cache_dir() == tmp_path / "cache"
    with pytest.raises(ot.OrtrainError, match=r"set_cache_dir\(path=...\): expected a folder path or None"):
        ot.artifacts.set_cache_dir("")


def test_a_cache_dir_under_a_folder_that_may_not_be_searched_is_refused(tmp_path, monkeypatch):
    # a raw PermissionError came from Path.exists (tests may run with the right to search any folder,
    # so the refusal to search is played by Path.exists itself)
    from pathlib import Path
    locked = tmp_path / "locked"
    real_exists = Path.exists

    def exists(self, *args, **kwargs):
        if str(self).startswith(str(locked) + os.sep):
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *args, **kwargs)
    monkeypatch.setattr(Path, "exists", exists)
    before = ot.artifacts.cache_dir()
    with pytest.raises(ot.OrtrainError, match=r"set_cache_dir\(path=...\): '.*locked/cache' cannot be reached "
                                              r"\(Permission denied at '.*locked/cache'\); give a folder this process "
                                              r"may search .*\(the cache is unchanged\)"):
        ot.artifacts.set_cache_dir(locked / "cache")
    assert ot.artifacts.cache_dir() == before


def test_a_live_trainer_predicts_after_its_cache_entry_is_removed(rng):
    import shutil
    model = dense_model(3, 2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, np.zeros((4, 2), np.float32))
        shutil.rmtree(ot.artifacts.cache_dir())  # the user clears ~/.cache
        w, b = tr.model().get_weights()
        np.testing.assert_allclose(tr.predict(x), x @ w + b, rtol=1e-5, atol=1e-6)
        tr.snapshot()


def test_thread_counts_are_bounded():
    for call in (lambda: ot.set_num_threads(10**9), lambda: ot.Trainer(dense_model(3, 2), threads=10**9)):
        with pytest.raises(ot.OrtrainError, match=r"threads: expected at most 1024 threads, received 1000000000"):
            call()
    assert ot.get_num_threads() >= 1


def test_from_artifacts_takes_its_own_checkpoint_and_from_checkpoint_checks_the_device_first(tmp_path):
    model = dense_model(3, 2)
    art = ot.artifacts.build(model, loss="mse", out_dir=tmp_path / "art")
    with ot.Trainer.from_artifacts(art.directory, batch_size=2, checkpoint=art.directory / "checkpoint") as tr:
        np.testing.assert_array_equal(tr.model().get_weights()[0], model.get_weights()[0])
    with ot.Trainer(model, batch_size=2) as tr:
        tr.save_checkpoint(tmp_path / "ck")
    ot.artifacts.set_cache_dir(tmp_path / "fresh")
    with pytest.raises(ot.OrtrainError, match=r"device='cuda:0': this onnxruntime build has no CUDA"):
        ot.Trainer.from_checkpoint(dense_model(3, 2), tmp_path / "ck", batch_size=2, device="cuda")
    assert not (tmp_path / "fresh").exists()  # refused before artifacts were built for it


def test_an_empty_path_is_refused_not_taken_for_the_current_folder(tmp_path, monkeypatch):
    art = ot.artifacts.build(dense_model(3, 2), loss="mse", out_dir=tmp_path / "art")
    monkeypatch.chdir(art.directory)  # where '' would have been read as '.'
    with pytest.raises(ot.OrtrainError, match=r"directory: expected the path of an artifacts directory, received ''"):
        ot.artifacts.load("")
    with pytest.raises(ot.OrtrainError, match=r"directory: expected the path of an artifacts directory, received ''"):
        ot.Trainer.from_artifacts("", batch_size=2)
    assert ot.artifacts.load(".").directory.resolve() == art.directory.resolve()  # '.' said is taken


def test_a_missing_onnx_file_is_named_by_build_which_imports_it(tmp_path):
    missing = tmp_path / "nowhere.onnx"
    with pytest.raises(ot.OrtrainError, match=re.escape(f"artifacts.build: from_onnx: no such file {str(missing)!r}")):
        ot.artifacts.build(missing, out_dir=tmp_path / "art")
    assert not (tmp_path / "art").exists()


def test_sample_weights_for_artifacts_without_them_name_the_build_that_has_them(tmp_path):
    # the advice was "create it with loss_mask=1", an argument from_artifacts does not take
    art = ot.artifacts.build(dense_model(3, 2), loss="mse", out_dir=tmp_path / "art")
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32)
    with ot.Trainer.from_artifacts(art, batch_size=2) as tr:
        with pytest.raises(ot.OrtrainError, match=r"sample_weight: this trainer has no loss weights .*its artifacts were "
                                                  r"built without them: build them again with weighting='sample'"):
            tr.step(x, y, sample_weight=np.ones(2, np.float32))
        assert tr.n_steps == 0
    weighted = ot.artifacts.build(dense_model(3, 2), loss="mse", out_dir=tmp_path / "w", weighting="sample")
    with ot.Trainer.from_artifacts(weighted, batch_size=2) as tr:  # as the advice says
        tr.step(x, y, sample_weight=np.ones(2, np.float32))
        assert tr.n_steps == 1


def test_a_checkpoint_fits_artifacts_that_differ_only_in_dropout_seeds(tmp_path):
    """Runs with another seed write other dropout seeds into the forward graph; their checkpoints
    were refused by one another's artifacts as 'another architecture' (ortrain eval/predict/export
    --checkpoint). The stamp leaves seeds out; another architecture is still refused."""
    def net(seed, width=8):
        m = ot.Sequential([ot.layers.Dense(width), ot.layers.Dropout(0.5, seed=seed), ot.layers.Dense(1)],
                          input_shape=(4,), seed=0, name="m")
        return m.compile(optimizer="sgd", loss="mse")
    with ot.Trainer(net(1), batch_size=4) as tr:
        tr.step(np.ones((4, 4)), np.zeros((4, 1)))
        tr.save_checkpoint(tmp_path / "ck")
        trained = tr.model().get_weights()
    art = ot.artifacts.build(net(2), loss="mse", optimizer="sgd", out_dir=tmp_path / "art")
    for got, want in zip(art.model(tmp_path / "ck").get_weights(), trained, strict=True):
        np.testing.assert_array_equal(got, want)
    other = ot.artifacts.build(net(2, width=16), loss="mse", optimizer="sgd", out_dir=tmp_path / "other")
    with pytest.raises(ot.OrtrainError, match="was trained with another architecture"):
        other.model(tmp_path / "ck")


@pytest.mark.parametrize("given", ["record", "directory"])
def test_from_artifacts_refuses_a_directory_replaced_while_it_opens(tmp_path, monkeypatch, given):
    # Another process building another model into the same out_dir between the check of the
    # manifest and the reads of the files gave a trainer of that other model, without a word.
    def model(width):
        return ot.Sequential([ot.layers.Dense(width), ot.layers.Dense(2)], input_shape=(4,), seed=width)

    out = tmp_path / "art"
    record = ot.artifacts.build(model(3), loss="mse", optimizer="adam", out_dir=out)
    real = ot.artifacts.Artifacts.model

    def read_then_replaced(self, *args, **kwargs):
        monkeypatch.setattr(ot.artifacts.Artifacts, "model", real)
        made = real(self, *args, **kwargs)
        ot.artifacts.build(model(5), loss="mse", optimizer="adam", out_dir=out)
        return made

    monkeypatch.setattr(ot.artifacts.Artifacts, "model", read_then_replaced)
    with pytest.raises(ot.OrtrainError, match="were replaced while the trainer was opening them"):
        ot.Trainer.from_artifacts(record if given == "record" else out, batch_size=2)
    with ot.Trainer.from_artifacts(out, batch_size=2) as tr:   # opened again: what the directory holds now
        assert tr.model().get_weights()[0].shape == (4, 5)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, where folders cannot be made")
def test_a_place_where_folders_cannot_be_made_is_refused_not_retried_forever(tmp_path):
    # making a folder under /proc fails with "No such file or directory", which the build took for a
    # folder another builder had just removed, and retried forever
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    with pytest.raises(ot.OrtrainError, match=r"out_dir: '/proc/ortrain-art' cannot be written \(No such file"):
        ot.artifacts.build(model, loss="mse", optimizer="adam", out_dir="/proc/ortrain-art")
    previous = ot.artifacts.cache_dir()
    ot.artifacts.set_cache_dir("/proc/ortrain-cache")
    try:
        with pytest.raises(ot.OrtrainError, match=r"the artifact cache '/proc/ortrain-cache' cannot be written"):
            ot.artifacts.build(model, loss="mse", optimizer="adam")
    finally:
        ot.artifacts.set_cache_dir(previous)


def test_a_checkpoint_weight_whose_type_byte_changed_is_refused_as_damaged(tmp_path):
    # int32 and (since inputs of those types are taken) uint32 parse as weights of that type: the
    # artifacts' own checkpoint has no checksum, and the model reached onnxruntime's Gemm type error
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    art = ot.artifacts.build(model, loss="mse", optimizer="adam", out_dir=tmp_path / "art")
    good = open(art.checkpoint, "rb").read()
    path, refused = tmp_path / "changed.ckpt", set()
    for offset in (i for i, byte in enumerate(good) if byte == onnx.TensorProto.FLOAT):
        for elem in (onnx.TensorProto.INT32, onnx.TensorProto.UINT32):
            changed = bytearray(good)
            changed[offset] = elem
            path.write_bytes(bytes(changed))
            try:
                art.model(path)
            except ot.OrtrainError as exc:
                found = re.search(r"holds weights of other types than the artifacts' float32: (dense_0\.\w+) "
                                  r"\(u?int32\); it is damaged", str(exc))
                if found:
                    assert str(path) in str(exc)
                    refused.add(found.group(1))
                else:
                    assert "Gemm" not in str(exc) and "bound to different types" not in str(exc)
    assert refused == {"dense_0.kernel", "dense_0.bias"}


def test_artifacts_model_checks_a_trainer_checkpoints_checksum(tmp_path):
    # Artifacts.model (and the CLI's eval, predict and export --checkpoint) read a trainer's
    # checkpoint without its checksum: a flipped bit in a weight gave "loss: inf" and exit 0, where
    # Trainer.from_artifacts refused the same file
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    art = ot.artifacts.build(model, loss="mse", optimizer="adam", out_dir=tmp_path / "art")
    tr = ot.Trainer.from_artifacts(art.directory, batch_size=8)
    tr.step(np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32))
    path = tmp_path / "t.ckpt"
    tr.save_checkpoint(path)
    kernel = tr.get_weights()[0]
    np.testing.assert_array_equal(art.model(path).get_weights()[0], kernel)
    good = path.read_bytes()
    at = good.index(kernel.astype("<f4").tobytes())
    for offset in (at + 3, at + 4 * kernel.size - 1):  # the exponent byte of the first and last value
        changed = bytearray(good)
        changed[offset] ^= 0x40
        path.write_bytes(bytes(changed))
        with pytest.raises(ot.OrtrainError, match=rf"checkpoint '{re.escape(str(path))}' is damaged: its contents do "
                                                  r"not match the checksum"):
            art.model(path)


def test_a_checkpoint_onnxruntime_saved_is_refused_saying_it_lacks_ortrains_records(tmp_path):
    # a checkpoint a raw onnxruntime-training loop saved over ortrain's artifacts was refused as
    # "not written for the artifacts (built for another model, loss or optimizer)": it was, but it
    # carries none of ortrain's records; its weights are the raw loop's, which set_weights takes
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    model = dense_model(4, 2)
    art = ot.artifacts.build(model, loss="mse", optimizer=ot.optim.Adam(lr=0.05), out_dir=tmp_path / "art")
    state = CheckpointState.load_checkpoint(str(art.checkpoint))
    module = Module(str(art.directory / "training.onnx"), state, str(art.directory / "eval.onnx"))
    opt = Optimizer(str(art.directory / "optimizer.onnx"), module)
    module.train()
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
    module(x, y, np.ones((), np.float32))
    opt.step()
    CheckpointState.save_checkpoint(state, str(tmp_path / "raw.ckpt"), include_optimizer_state=True)
    with pytest.raises(ot.OrtrainError, match=r"checkpoint '.*raw.ckpt' holds none of the records ortrain writes .* "
                                              r"not written by Trainer.save_checkpoint .* tr.set_weights"):
        ot.Trainer.from_artifacts(art, batch_size=8, checkpoint=tmp_path / "raw.ckpt")
    raw = CheckpointState.load_checkpoint(str(tmp_path / "raw.ckpt"))
    with ot.Trainer.from_artifacts(art, batch_size=8) as tr:
        tr.set_weights({n: raw.parameters[n].data for n in tr.weight_names()})
        for got, name in zip(tr.get_weights(), tr.weight_names()):
            np.testing.assert_array_equal(got, raw.parameters[name].data)
