"""Input values a step cannot use: indices outside an embedding table, NaN and infinity. Each is
refused with the argument, what it allows and what it received, and nothing changes."""

import re
import warnings

import numpy as np
import pytest
from conftest import torch_or_skip
from onnx import TensorProto, helper, numpy_helper

import ortrain as ot

L = ot.layers


def embedding_model():
    ids = ot.Input((3,), dtype="int64")
    model = ot.Model(ids, L.Dense(2)(L.Flatten()(L.Embedding(10, 4)(ids))))
    model.compile(optimizer="adam", loss="mse")
    return model


def _state(tr):
    return [w.copy() for w in tr.model().get_weights()], tr.n_steps


def _assert_unchanged(tr, before):
    weights, steps = before
    assert tr.n_steps == steps
    for a, b in zip(weights, tr.model().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ids, received", [([[1, 2, 10]], "from 1 to 10"), ([[1, -1, 2]], "from -1 to 2")])
def test_embedding_indices_outside_the_table_are_refused_everywhere(ids, received):
    model = embedding_model()
    x, y = np.repeat(np.array(ids), 4, axis=0), np.zeros((4, 2), np.float32)
    said = f"x: indices into Embedding 'embedding_0' must lie in \\[0, 9\\], received values {received}"
    with ot.Trainer(model, batch_size=4) as tr:
        before = _state(tr)
        for call in (lambda: tr.step(x, y), lambda: tr.predict(x), lambda: tr.snapshot().predict(x)):
            with pytest.raises(ot.ShapeError, match=said):
                call()
        _assert_unchanged(tr, before)
    weights = model.get_weights()
    for call in (lambda: model.predict(x), lambda: model.fit(x, y, verbose=0), lambda: model.evaluate(x, y)):
        with pytest.raises(ot.ShapeError, match=said):
            call()
    with pytest.raises(ot.ShapeError, match=said):
        ot.fit_generator(model, [(x, y)], verbose=0)
    for a, b in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert model.train_state is None
    # the whole table is reachable
    table = model.get_weights()[0]
    edge = np.array([[0, 9, 9]] * 4)
    out = model.predict(edge)
    kernel, bias = model.get_weights()[1:]
    np.testing.assert_allclose(out, table[edge].reshape(4, -1) @ kernel + bias, rtol=1e-6, atol=1e-7)


def test_imported_gather_takes_onnx_range_negative_rows_count_from_the_end():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0, name="lookup"),
         helper.make_node("ReduceSum", ["rows", "axes"], ["y"], keepdims=0)],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    ids = np.array([[0, -1], [5, -6]])
    with pytest.warns(UserWarning, match=r"x: negative indices into Gather node 'lookup' count from the end of its 6 "
                                         r"rows, as ONNX's Gather and onnxruntime read them .*padding id of -1"):
        np.testing.assert_allclose(model.predict(ids), table[ids].sum(axis=1))
    with pytest.raises(ot.ShapeError, match="x: indices into Gather node 'lookup' must lie in \\[-6, 5\\], received "
                                            "values from -7 to 0; the table has 6 rows"):
        model.predict(np.array([[0, -7]]))


def test_a_boolean_input_takes_0_and_1_and_refuses_other_numbers():
    graph = helper.make_graph(
        [helper.make_node("Cast", ["mask"], ["on"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "on"], ["kept"]), helper.make_node("MatMul", ["kept", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([[1.0], [2.0], [4.0]], np.float32), "w")])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    x, mask = np.ones((2, 3), np.float32), np.array([[True, False, True], [False, True, False]])
    np.testing.assert_array_equal(model.predict([x, mask]), [[5.0], [2.0]])
    np.testing.assert_array_equal(model.predict([x, mask.astype(np.int64)]), [[5.0], [2.0]])
    np.testing.assert_array_equal(model.predict([x, mask.astype(np.float64)]), [[5.0], [2.0]])
    for soft, shown in [(mask * 0.5, "float64 holding 0.5"), (mask * 2, "int64 holding 2")]:
        with pytest.raises(ot.ShapeError, match=f"x\\['mask'\\]: expected booleans \\(or 0 and 1\\), received dtype "
                                                f"{shown}; pass a boolean array"):
            model.predict([x, soft])


@pytest.mark.parametrize("where, bad", [("x", np.nan), ("y", np.inf), ("sample_weight", -np.inf)])
def test_a_non_finite_value_refuses_the_step_and_changes_nothing(where, bad):
    model = ot.Sequential([L.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32), "y": np.zeros((4, 2), np.float32),
             "sample_weight": np.ones(4, np.float32)}
    feeds[where][(2,) if where == "sample_weight" else (2, 1)] = bad
    with ot.Trainer(model, batch_size=4, loss_mask=1) as tr:
        tr.step(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))   # moments exist
        before = _state(tr)
        with pytest.raises(ot.NonFiniteError, match=re.escape(f"{where}: holds {bad} in row 2; training needs finite "
                                                              "values, so this step was not taken")):
            tr.step(feeds["x"], feeds["y"], feeds["sample_weight"])
        _assert_unchanged(tr, before)
        ok = {k: np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0) for k, v in feeds.items()}
        tr.step(ok["x"], ok["y"], ok["sample_weight"])  # the trainer goes on
        assert tr.n_steps == before[1] + 1


@pytest.mark.parametrize("where, bad", [("x", np.nan), ("y", -np.inf)])
def test_evaluate_and_eval_refuse_a_non_finite_value_where_predict_computes_on_it(where, bad):
    """A NaN loss beside an accuracy that looks right reads as a result: evaluate and a Trainer's
    eval refuse the data, as fit's validation arrays and the command line's eval do; predict
    computes on it as Keras, PyTorch and onnxruntime do."""
    model = ot.Sequential([L.Dense(2, activation="softmax")], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3)).astype(np.float32), np.eye(2, dtype=np.float32)[[0, 1, 1, 0]]
    (x if where == "x" else y)[2, 1] = bad
    says = f"{where}: holds {bad} in row {{}}; evaluation needs finite values, so nothing was evaluated"
    said = re.escape(says.format(2))
    weights = model.get_weights()
    with pytest.raises(ot.NonFiniteError, match=said):
        model.evaluate(x, y, batch_size=2, verbose=0)
    with pytest.raises(ot.NonFiniteError, match=re.escape("evaluate, batch 1 (counted from 0): " + says.format(0))):
        model.evaluate(iter([(x[:2], y[:2]), (x[2:], y[2:])]), verbose=0)
    for got, was in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, was)
    if where == "x":
        p = model.predict(x, verbose=0)
        assert np.isnan(p[2]).all() and np.isfinite(np.delete(p, 2, axis=0)).all()
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(np.nan_to_num(x, nan=0.0), np.nan_to_num(y, neginf=0.0))
        before = _state(tr)
        with pytest.raises(ot.NonFiniteError, match=said):
            tr.eval(x, y)
        with pytest.raises(ot.NonFiniteError, match=said):
            tr.eval_with_outputs(x, y)
        _assert_unchanged(tr, before)
        clean = tr.eval(np.nan_to_num(x, nan=0.0), np.nan_to_num(y, neginf=0.0))
        assert np.isfinite(clean)


def test_fit_refuses_non_finite_rows_before_the_first_step():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((64, 3)).astype(np.float32), rng.standard_normal((64, 2)).astype(np.float32)
    x[60, 1] = np.nan                       # in the last batch
    model = ot.Sequential([L.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    weights = model.get_weights()
    with pytest.raises(ot.NonFiniteError, match=re.escape("x: holds nan in row 60; training needs finite values, so "
                                                          "nothing was trained")):
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    assert model.train_state is None
    for a, b in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # rows held out for validation are refused too, before anything trains (they made every val_loss NaN)
    with pytest.raises(ot.NonFiniteError, match=re.escape("x (the rows validation_split holds out): holds nan in "
                                                          "row 60; validation needs finite values")):
        model.fit(x, y, batch_size=8, validation_split=0.25, verbose=0)
    assert model.train_state is None
    history = model.fit(x[:48], y[:48], batch_size=8, validation_split=0.25, verbose=0)
    assert model.train_state.n_steps == 5 and np.isfinite(history.history["val_loss"][0])
    # a generator's first batch is checked before the caller's model changes
    model = ot.Sequential([L.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ot.NonFiniteError, match="epoch 0, step 0 \\(counted from 0\\): x: holds nan in row 4"):
        ot.fit_generator(model, [(x[56:], y[56:])], optimizer="sgd", verbose=0)
    assert isinstance(model.optimizer, ot.optim.Adam) and model.train_state is None


def test_a_whole_data_set_is_checked_in_blocks_not_with_a_mask_of_its_size(tmp_path):
    # fit checked every value at once: a mask of a byte a value, +244 MB for a 977 MB float32 memory map
    import tracemalloc

    from ortrain._arrays import BLOCK_VALUES, as_array, refuse_non_finite
    rows, width = 16 * BLOCK_VALUES // 64, 64
    x = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float32, (rows, width))
    x[:] = 1.0
    x[rows - 3, 5] = np.inf                 # in the last block
    tracemalloc.start()
    try:
        with pytest.raises(ot.NonFiniteError, match=re.escape(f"x: holds inf in row {rows - 3}; training needs finite "
                                                              "values")):
            refuse_non_finite([x], ["x"], "nothing was trained")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * BLOCK_VALUES, peak   # at once: a byte a value, 16 * BLOCK_VALUES
    # float64 rows beyond float32 are found in any block, and labels that must be integers too
    big = np.ones((rows, width), np.float64)
    big[rows - 2, 0] = 1e39
    with pytest.raises(ot.ShapeError, match=re.escape("x: holds 1e+39, beyond the range of float32")):
        as_array(big, np.float32, "x")
    if np.finfo(np.longdouble).max > np.finfo(np.float64).max:  # (x86-64's 80-bit long double)
        huge = np.ones((2, 3), np.longdouble)
        huge[1, 2] = np.longdouble("1e4000")  # finite: it was said to hold inf, as float() reads it
        with pytest.raises(ot.ShapeError, match=re.escape("x: holds 1e+4000, beyond the range of float32")):
            as_array(huge, np.float32, "x")
    labels = np.zeros(4 * BLOCK_VALUES, np.float64)
    labels[-1] = 0.5
    with pytest.raises(ot.ShapeError, match="y: expected integer values for dtype int64, received floats with a "
                                            "fractional part"):
        as_array(labels, np.int64, "y")
    model = ot.Sequential([L.Dense(1)], input_shape=(width,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.NonFiniteError, match=f"x: holds inf in row {rows - 3}"):
        model.fit(x, np.zeros((rows, 1), np.float32), batch_size=4096, verbose=0)
    assert model.train_state is None


def test_calibrate_bn_refuses_non_finite_statistics_and_changes_nothing():
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(2), L.BatchNorm()], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(2).random((16, 3))
    with ot.Trainer(model, batch_size=4) as tr:
        tr.calibrate_bn(x)
        before = _state(tr)
        bad = x.copy()
        bad[5, 1] = np.nan
        with pytest.raises(ot.NonFiniteError, match=re.escape("calibrate_bn: x: holds nan in row 5")):
            tr.calibrate_bn(bad)
        bad[5, 1] = 1e30   # finite, but its variance is beyond float32
        with pytest.raises(ot.NonFiniteError, match="the statistics were not changed"):
            tr.calibrate_bn(bad)
        _assert_unchanged(tr, before)   # the first batch norm's statistics too, all or nothing


def _reshaped_lookup():
    """A table looked up through a Reshape: no check before the run can see the indices' range."""
    table = numpy_helper.from_array(np.random.default_rng(0).random((10, 4)).astype(np.float32), "emb")
    shape = numpy_helper.from_array(np.array([-1, 3], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["idx", "shape"], ["flat"]), helper.make_node("Gather", ["emb", "flat"], ["e"]),
         helper.make_node("ReduceMean", ["e"], ["y"], axes=[1], keepdims=0)], "g",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [table, shape])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    model.compile(optimizer="adam", loss="mse")
    return model


def test_a_step_the_runtime_refuses_is_an_ortrain_error_and_changes_nothing():
    model, y = _reshaped_lookup(), np.zeros((2, 4), np.float32)
    with ot.Trainer(model, batch_size=2) as tr, ot.Trainer(model, batch_size=2) as twin:
        for t in (tr, twin):
            t.step(np.array([[0, 1, 2]] * 2), y)
        before = _state(tr)
        with pytest.raises(ot.OrtrainError, match=r"onnxruntime could not run the training step: .*Gather.*"
                                                  r"idx=10 must be within the inclusive range \[-10,9\]"):
            tr.step(np.array([[0, 1, 10]] * 2), y)
        _assert_unchanged(tr, before)
        with pytest.raises(ot.OrtrainError, match="onnxruntime could not run the forward graph: .*idx=10"):
            tr.predict(np.array([[0, 1, 10]]))
        assert tr.step(np.array([[3, 4, 5]] * 2), y) == twin.step(np.array([[3, 4, 5]] * 2), y)
        for a, b in zip(tr.model().get_weights(), twin.model().get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)


def test_inputs_of_different_row_counts_are_named_with_their_rows_and_the_fix():
    # The usual case: a recurrent layer's initial state (layers, batch, hidden) exported as an input.
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "h0"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                                    helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    model.compile(optimizer="adam", loss="mse")
    x, h0, y = np.ones((8, 4), np.float32), np.ones((1, 3), np.float32), np.zeros((8, 3), np.float32)
    says = (r"x: expected the same number of rows \(axis 0, the batch\) in every input, received 'x' 8, 'h0' 1 rows; "
            r"every input is read batch first: .*initial state of shape \(layers, batch, hidden\) .*belongs in the "
            r"model as a constant")
    with pytest.raises(ot.ShapeError, match=says):
        model.predict([x, h0])
    with pytest.raises(ot.ShapeError, match=says):
        model.fit([x, h0], y, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[0], np.ones((4, 3), np.float32))
    assert model.predict([x, np.ones((8, 3), np.float32)]).shape == (8, 3)


def test_from_onnx_refuses_shapes_that_do_not_fit_together():
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="proj")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(np.ones((5, 3), np.float32), "W")])
    with pytest.raises(ot.ShapeError, match="shapes or types do not fit together: .*node name: proj.*Incompatible "
                                            "dimensions for matrix multiplication"):
        ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def test_validation_data_is_checked_before_training():
    rng = np.random.default_rng(3)
    x, y = rng.random((40, 4)).astype(np.float32), np.arange(40) % 3

    def fresh():
        model = ot.Sequential([L.Dense(3, activation="softmax")], input_shape=(4,), seed=1)
        return model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")

    for bad, message in (((x[:8],), r"validation_data: expected \(x, y\) or \(x, y, sample_weight\) arrays, or "
                                    r"batches of those; received a tuple of 1: an array of shape \(8, 4\)"),
                         ([(x[:8], y[:8]), (x[:8], np.full(8, 9))], r"validation_data\[1\] y: class labels must lie "
                                                                    r"in \[0, 2\]")):
        model = fresh()
        weights = model.get_weights()
        with pytest.raises(ot.OrtrainError, match=message):
            model.fit(x, y, batch_size=8, verbose=0, validation_data=bad)
        assert model.train_state is None
        for a, b in zip(weights, model.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
    # a list [x, y] is arrays, as Keras takes it
    as_list = fresh().fit(x, y, batch_size=8, verbose=0, shuffle=False, validation_data=[x[:8], y[:8]])
    as_tuple = fresh().fit(x, y, batch_size=8, verbose=0, shuffle=False, validation_data=(x[:8], y[:8]))
    assert as_list.history["val_loss"] == as_tuple.history["val_loss"]


def test_arguments_numpy_or_python_cannot_read_get_ortrain_errors(tmp_path):
    model = ot.Sequential([L.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    classifier = ot.Sequential([L.Dense(3, activation="softmax")], input_shape=(3,), seed=0)
    classifier.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x = np.ones((4, 3), np.float32)
    cases = [
        (lambda: model.predict([[1, 2, 3], [1, 2]]), r"x: expected an array \(nested lists need rows of equal length\)"),
        (lambda: model.set_weights(None), "set_weights: expected a list of arrays .* received NoneType"),
        (lambda: model.freeze(L.Dense(3)), "freeze: a Dense layer is not part of this model"),
        (lambda: classifier.fit(x, np.array([0, 1, 2, 2**63 + 5], np.uint64), verbose=0),
         r"y: holds 9223372036854775813, beyond the range of int64"),
        (lambda: classifier.fit(x, np.array([0, 1, 2, 1e20]), verbose=0), r"y: holds 1e\+20, beyond the range of int64"),
        (lambda: ot.optim.Adam(betas=("a", "b")), r"betas: expected two numbers in \[0, 1\)"),
        (lambda: ot.optim.Adam(betas=(0.9,)), r"betas: expected two numbers in \[0, 1\)"),
        (lambda: model.fit(x, np.ones((4, 2)), sample_weight=1.0, verbose=0), r"received \(\)$"),
    ]
    weights = model.get_weights()
    for call, message in cases:
        with pytest.raises(ot.OrtrainError, match=message):
            call()
    for a, b in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert classifier.train_state is None
    # numpy's own float types are numbers too
    model.fit(np.ones((10, 3)), np.ones((10, 2)), validation_split=np.float32(0.2), verbose=0)
    assert model.train_state.n_steps == 1
    path = tmp_path / "c.ckpt"
    with ot.Trainer(model, batch_size=4) as tr:
        tr.save_checkpoint(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)   # zeroed second half
    path.write_bytes(bytes(data))
    with pytest.raises(ot.OrtrainError, match="checkpoint '.*c.ckpt' cannot be read: .*it is damaged"):
        ot.Trainer.from_checkpoint(model, path, batch_size=4)
    with ot.Trainer(model, batch_size=4) as tr:
        tr.save_checkpoint(path)
    path.write_bytes(path.read_bytes()[:-5])   # cut short by a few bytes: the checksum ortrain writes tells
    with pytest.raises(ot.OrtrainError, match="checkpoint '.*c.ckpt' is damaged: its contents do not match the "
                                              "checksum .*use another checkpoint or a copy of this one"):
        ot.Trainer.from_checkpoint(model, path, batch_size=4)


def test_float64_values_beyond_float32_are_refused_not_made_infinite():
    model = ot.Sequential([L.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((4, 3))
    x[1, 2] = 1e39
    before = model.get_weights()
    for call in (lambda: model.predict(x), lambda: model.fit(x, np.zeros((4, 2)), verbose=0)):
        with pytest.raises(ot.ShapeError, match=r"x: holds 1e\+39, beyond the range of float32"):
            call()
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    x[1, 2] = np.inf  # an infinity stays an infinity: predict runs it, training refuses it
    assert np.isnan(model.predict(x)).any() or np.isinf(model.predict(x)).any()


@pytest.mark.parametrize("make, says", [
    (lambda: ot.optim.Adam(betas=(0.9, 0.99999999)), "betas: expected two numbers below 1 in float32.*0.99999999 becomes 1.0"),
    (lambda: ot.optim.AdamW(betas=(0.99999999, 0.999)), "betas: .*0.99999999 becomes 1.0"),
    (lambda: ot.optim.Adam(eps=1e-46), "eps: expected at least 1.18e-37 with beta_1=0.9, received 1e-46"),
    (lambda: ot.optim.SGD(lr=1e39), "lr: expected a number float32 holds"),
    (lambda: ot.losses.Huber(delta=1e39), "Huber\\(delta=...\\): expected a positive finite number that float32"),
    (lambda: ot.layers.BatchNorm(epsilon=1e-50), "BatchNorm\\(epsilon=...\\): expected a positive finite number that float32"),
    (lambda: ot.layers.BatchNorm(epsilon=1e39), "BatchNorm\\(epsilon=...\\)"),
    (lambda: ot.layers.LayerNorm(epsilon=1e-50), "LayerNorm\\(epsilon=...\\)"),
    # subnormal: the sessions flush it to 0 (a constant feature gave NaN; a Huber delta no gradient)
    (lambda: ot.layers.BatchNorm(epsilon=1e-40), "BatchNorm\\(epsilon=...\\): .* normal number, about 1.2e-38"),
    (lambda: ot.layers.LayerNorm(epsilon=1e-40), "LayerNorm\\(epsilon=...\\): .* normal number"),
    (lambda: ot.losses.Huber(delta=1e-40), "Huber\\(delta=...\\): .* normal number"),
    (lambda: ot.layers.Dropout(0.99999999), "Dropout\\(rate=...\\): expected a number in \\[0, 1\\) that stays below 1 in float32"),
    (lambda: ot.layers.BatchNorm(momentum=0.99999999), "BatchNorm\\(momentum=...\\): expected a number in \\[0, 1\\) that "
                                                       "stays below 1 in float32"),
])
def test_settings_the_runtime_would_round_to_a_degenerate_float32_are_refused(make, says):
    # Checked in float64 they passed, then became 1.0, 0 or inf in the runtime's float32: a bias
    # correction of 1 - 1.0 = 0, a zero epsilon, an infinite delta or rate gave NaN weights silently.
    with np.errstate(over="ignore"):
        assert np.float32(0.99999999) == 1.0 and np.float32(1e-46) == 0 and np.isinf(np.float32(1e39))
    with pytest.raises(ot.OrtrainError, match=says):
        make()


def test_the_largest_settings_float32_holds_train_finitely(rng):
    x, y = rng.random((16, 4)).astype(np.float32), rng.random((16, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(4), ot.layers.Dropout(0.9999999), ot.layers.Dense(2)],
                          input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(betas=(0.9999999, 0.9999999)), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert all(np.isfinite(w).all() for w in model.get_weights())
    opt = ot.optim.Adam(lr=0.1)
    with pytest.raises(ot.OrtrainError, match="lr: expected a number float32 holds"):
        opt.lr = 1e39
    assert opt.lr == 0.1


def test_torch_tensors_that_require_grad_and_pandas_nullable_columns_are_read_as_values(rng):
    torch = torch_or_skip()
    pd = pytest.importorskip("pandas")
    x = rng.random((8, 4)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    net = torch.nn.Linear(4, 2)
    model.set_weights([net.weight.T, net.bias])  # parameters straight from a module
    want = net(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model.predict(torch.from_numpy(x).requires_grad_()), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict(pd.DataFrame(x).astype("Float64")), want, rtol=1e-5, atol=1e-6)
    model.compile(optimizer="adam", loss="mse")
    frame = pd.DataFrame(x).astype("Float64")
    frame.iloc[3, 1] = pd.NA
    before = model.get_weights()
    with pytest.raises(ot.NonFiniteError, match="x: holds nan in row 3"):
        model.fit(frame, want, verbose=0)
    for got, was in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, was)
    # without a missing value, a nullable column keeps its numpy type: int64 ids stay exact
    from ortrain._arrays import as_array, read_array
    ids = pd.DataFrame({"ids": pd.Series([2**53 + 1, 3], dtype="Int64")})
    assert as_array(read_array(ids, "x"), np.int64, "x").ravel().tolist() == [2**53 + 1, 3]
    assert read_array(pd.Series([True, False], dtype="boolean"), "y").dtype == np.bool_


def test_a_frame_of_numeric_and_boolean_columns_and_a_one_input_list_are_read(rng):
    # pandas joins a float and a bool column as objects: refused as "strings, objects..."; a list
    # holding the one input's array (Keras takes it) was read as a batch of one 3-D sample
    pd = pytest.importorskip("pandas")
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    frame = pd.DataFrame({"a": rng.random(6), "b": [True, False] * 3, "c": np.arange(6, dtype=np.int32)})
    values = np.stack([frame["a"], frame["b"], frame["c"]], axis=1).astype(np.float32)
    w, b = model.get_weights()
    np.testing.assert_allclose(model.predict(frame), values @ w + b, rtol=1e-6)
    np.testing.assert_array_equal(model.predict([values]), model.predict(values))
    assert model.predict([[1.0, 2.0, 3.0]]).shape == (1, 2)  # a list of rows stays rows
    with pytest.raises(ot.ShapeError, match=r"received dtype object \(strings"):
        model.predict(pd.DataFrame({"a": [1.0, 2.0], "b": ["x", "y"], "c": [1, 2]}))


def test_a_captured_step_refuses_an_input_with_no_elements():
    from ortrain import ag
    W = ag.param(np.ones((2, 3), np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
    with pytest.raises(ot.ShapeError, match="capture_step: input 'x' has shape \\(3, 0\\), with no elements"):
        step(x=np.ones((3, 0), np.float32), y=np.zeros((2, 0), np.float32))
    assert float(step(x=np.ones((3, 4), np.float32), y=np.zeros((2, 4), np.float32))) == pytest.approx(9.0)
    assert opt.step == 1
    step.free()


def test_shape_errors_name_the_fix_for_keras_layouts_and_labels():
    L = ot.layers
    images = ot.Sequential([L.Input((3, 8, 8)), L.Conv2D(2, 3)])
    with pytest.raises(ot.ShapeError, match=r"x: expected shape \(N, 3, 8, 8\), received \(4, 8, 8, 3\); x looks "
                                            r"channels last .* pass x.transpose\(0, 3, 1, 2\)"):
        images.predict(np.zeros((4, 8, 8, 3), np.float32))
    clf = ot.Sequential([L.Input((4,)), L.Dense(3, activation="softmax")])
    clf.compile(loss="categorical_crossentropy")
    with pytest.raises(ot.ShapeError, match=r"y holds class indices, which this loss takes one-hot \(rows of 3\): use "
                                            r"loss='sparse_categorical_crossentropy', or one-hot encode them"):
        clf.evaluate(np.zeros((5, 4), np.float32), np.arange(5) % 3)
    with pytest.raises(ot.ShapeError, match=r"y holds class indices"):  # a list of ints too
        clf.evaluate(np.zeros((5, 4), np.float32), [0, 1, 2, 0, 1])
    with pytest.raises(ot.ShapeError, match=r"y: expected shape \(5, 3\), received \(4,\)") as refused:
        clf.evaluate(np.zeros((5, 4), np.float32), np.arange(4) % 3)  # the rows are wrong as well
    assert "class indices" not in str(refused.value)
    clf.compile(loss="mse")  # integers are targets here, not classes: no one-hot advice
    with pytest.raises(ot.ShapeError) as refused:
        clf.evaluate(np.zeros((5, 4), np.float32), np.arange(5) % 3)
    assert "class indices" not in str(refused.value)
    clf.compile(loss="sparse_categorical_crossentropy")
    with pytest.raises(ot.ShapeError, match=r"y looks one-hot \(rows of 3\), and this loss takes class indices: use "
                                            r"loss='categorical_crossentropy', or pass y.argmax\(axis=-1\)"):
        clf.evaluate(np.zeros((5, 4), np.float32), np.eye(3)[np.arange(5) % 3])


@pytest.mark.torch
def test_labels_with_an_axis_more_than_class_indices_are_told_what_fits():
    # Integer labels (6, 7) of 4 classes for an output (N, 4) were said to look one-hot.
    torch = torch_or_skip()
    rng = np.random.default_rng(0)
    sparse = ot.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = ot.Sequential([L.Dense(4)], input_shape=(5,))
    model.compile(optimizer="adam", loss=sparse)
    x, y = np.zeros((6, 5), np.float32), rng.integers(0, 4, (6, 7))
    with pytest.raises(ot.ShapeError, match=re.escape(
            "y: expected shape (6,), received (6, 7): this loss takes class indices of shape (N,) for the model's "
            "output (N, 4), and y's rows of 7 are not one-hot (values from 0 to 3). Labels of shape (N, 7), a class "
            "per position (a time step, say), need the model's output to have that axis, (N, 7, 4)")):
        model.evaluate(x, y)
    # What it says fits: an output with that axis takes them, and computes PyTorch's loss.
    per_step = ot.Sequential([L.Dense(4)], input_shape=(7, 5), seed=0)
    per_step.compile(optimizer="adam", loss=sparse)
    steps = rng.standard_normal((6, 7, 5)).astype(np.float32)
    k, b = per_step.get_weights()
    want = torch.nn.functional.cross_entropy(torch.from_numpy(steps.astype(np.float64) @ k + b).reshape(-1, 4),
                                             torch.from_numpy(y).reshape(-1))
    assert per_step.evaluate(steps, y, verbose=0)["loss"] == pytest.approx(float(want), rel=1e-5)
    # Rows that look like something else are named so, for the model and for the loss called alone.
    for labels, message in [
            (np.eye(7)[rng.integers(0, 7, 6)], r"y looks one-hot over 7 classes, where the model's output has 4: "
                                               r"give the model 7 output units, then pass y.argmax\(axis=-1\)"),
            (np.array([[1, 1, 0, 0], [0, 1, 0, 1]] * 3), r"y's rows of 4 hold 0s and 1s but not one 1 each "
                                                        r"\(several classes a sample\?\).*loss='binary_crossentropy'"),
            (np.full((6, 4), 0.25, np.float32), r"y holds probability rows \(rows of 4 that sum to 1\), and this loss "
                                                r"takes class indices: use loss='categorical_crossentropy'")]:
        with pytest.raises(ot.ShapeError, match=message):
            model.evaluate(x, labels)
    with pytest.raises(ot.ShapeError, match=re.escape("y_true's rows of 7 are not one-hot (values from 0 to 3). "
                                                      "Labels of shape (6, 7), a class per position (a time step, "
                                                      "say), need y_pred to have that axis, (6, 7, 4)")):
        sparse(y, np.zeros((6, 4), np.float32))
    # Fractional values are no class indices of any shape: the plain refusal, without a hint.
    with pytest.raises(ot.ShapeError, match=r"received floats with a fractional part or non-finite values$"):
        model.evaluate(x, rng.standard_normal((6, 4)).astype(np.float32))


def test_a_source_of_batches_where_arrays_go_is_refused_naming_what_it_is():
    # iterators, callables and a list of batches given with y (or to predict) were read as arrays:
    # "dtype object" or "nested lists need rows of equal length", with no word of batches
    m = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    m.compile(optimizer="adam", loss="mse")
    x, y = np.random.rand(8, 4), np.random.rand(8, 3)
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    before = m.get_weights()
    for call, received in ((lambda: m.fit(iter(batches), y, verbose=0), "list_iterator"),
                           (lambda: m.fit(lambda: None, y, verbose=0), "function"),
                           (lambda: m.evaluate((b for b in batches), y), "generator"),
                           (lambda: m.predict(iter([x[:4], x[4:]])), "list_iterator")):
        with pytest.raises(ot.ShapeError, match=f"x: expected an array, received a {received}, which gives batches "
                                                r"one at a time: .*fit\(batches\), without y"):
            call()
    with pytest.raises(ot.ShapeError, match=r"looks like a list of \(x, y\) batches, which goes alone"):
        m.fit(batches, y, verbose=0)
    for a, b in zip(m.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    assert m.predict(list(x)).shape == (8, 3)  # a list of rows is an array


def test_float16_class_labels_are_read_without_a_numpy_warning():
    # comparing a float16 maximum with int64's bounds overflowed in numpy (a RuntimeWarning, an
    # error under -W error)
    m = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    m.compile(optimizer="sgd", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    twin = m.copy()
    x = np.random.default_rng(0).random((8, 4), np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.fit(x, labels.astype(np.float16), verbose=0, shuffle=False)
    twin.fit(x, labels, verbose=0, shuffle=False)
    for a, b in zip(m.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.torch
def test_a_bfloat16_tensor_is_read_as_the_float32_it_holds():
    torch = torch_or_skip()
    m = ot.Sequential([ot.layers.Dense(3)], input_shape=(4,), seed=0)
    xb = torch.from_numpy(np.random.default_rng(0).random((8, 4), np.float32)).bfloat16()
    np.testing.assert_array_equal(m.predict(xb), m.predict(xb.float().numpy()))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xb.float(), xb.float()[:, :3]), batch_size=4)
    with pytest.raises(ot.ShapeError, match="received a DataLoader, which gives batches one at a time"):
        m.predict(loader)


def test_ndarray_subclasses_are_read_as_their_values_and_masked_entries_are_refused():
    # A masked array reached the metrics as such while the graph read its hidden values (accuracy
    # 0.5 beside the loss of the unmasked labels, 0.625 for int32 labels); an np.matrix column of
    # labels was refused as "received (1, 8)" (its reshape(-1) stays two-dimensional).
    rng = np.random.default_rng(0)
    x = rng.random((8, 4)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    model = ot.Sequential([L.Dense(3, activation="softmax")], input_shape=(4,), seed=0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    kernel, bias = model.get_weights()
    z = x.astype(np.float64) @ kernel + bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    reference = {"loss": -np.log(p[np.arange(8), labels]).mean(), "accuracy": np.mean(p.argmax(1) == labels)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # numpy's about np.matrix itself
        matrices = (np.matrix(labels).T, np.matrix(x))
    for xs, ys in ((x, matrices[0]), (matrices[1], labels), (np.ma.array(x), np.ma.array(labels)),
                   (x, np.ma.array(labels.astype(np.int32), mask=np.zeros(8, bool)))):
        got = model.evaluate(xs, ys, verbose=0)
        assert got["loss"] == pytest.approx(reference["loss"], rel=1e-6)
        assert got["accuracy"] == reference["accuracy"]
    hidden = np.ma.array(labels, mask=np.eye(1, 8, dtype=bool)[0])
    with ot.Trainer(model, batch_size=8) as tr:
        before = _state(tr)
        for call in (lambda: tr.step(x, hidden), lambda: tr.eval(x, hidden),
                     lambda: tr.step(np.ma.array(x, mask=x > 0.9), labels)):
            with pytest.raises(ot.ShapeError, match=r"(x|y): expected an array of values, received a masked array "
                                                    r"with \d+ masked entr(y|ies), whose hidden values would be read "
                                                    r"as data; fill them first \(a\.filled\(value\)\)"):
                call()
        _assert_unchanged(tr, before)
    for kwargs in ({"y": hidden}, {"y": labels, "sample_weight": np.ma.array(np.ones(8), mask=hidden.mask)}):
        with pytest.raises(ot.ShapeError, match="received a masked array with 1 masked entry"):
            model.fit(x, kwargs.pop("y"), verbose=0, **kwargs)
    np.testing.assert_array_equal(model.get_weights()[0], kernel)
    assert model.optimizer.step == 0


@pytest.mark.parametrize("form", ["float64", "float16", "int32", "strided", "memmap64"])
def test_data_needing_a_cast_is_cast_batch_by_batch_with_the_results_of_float32(form, tmp_path, monkeypatch):
    # float64 (or non-contiguous) data was cast whole before the first batch: a float64 memory map
    # took half its size in memory for predict(batch_size=4096), and one larger than memory failed
    import ortrain._arrays as arrays
    monkeypatch.setattr(arrays, "DEFERRED_VALUES", 0)  # every such array deferred, however small
    rng = np.random.default_rng(3)
    base = rng.standard_normal((50, 12)) * 3
    if form == "int32":
        base = np.round(base)
    x32 = base.astype(np.float32)
    if form == "float16":
        x32 = x32.astype(np.float16).astype(np.float32)
    given = {"float64": base, "float16": x32.astype(np.float16), "int32": base.astype(np.int32),
             "strided": np.repeat(x32, 2, axis=1)[:, ::2]}.get(form)
    if form == "memmap64":
        given = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float64, base.shape)
        given[:] = base
    assert not (given.dtype == np.float32 and given.flags.c_contiguous)
    y = rng.integers(0, 3, 50)

    def trained(x):
        model = ot.Sequential([L.Dense(8, activation="relu"), L.Dense(3)], input_shape=(12,), seed=0)
        model.compile(optimizer="adam", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        hist = model.fit(x, y, batch_size=8, epochs=2, validation_split=0.2, verbose=0)
        with ot.Trainer(model, batch_size=7) as tr:
            tr.step(x[:7] if not isinstance(x, np.ndarray) else x[:7], y[:7])
            got = [tr.predict(x, batch_size=9), tr.snapshot().predict(x, batch_size=4)]
        return ([model.predict(x, batch_size=16), model.predict(x), *got],
                model.evaluate(x, y, batch_size=6), hist.history)

    want, got = trained(x32), trained(given)
    for a, b in zip(want[0], got[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert want[1:] == got[1:]
    given_before = np.array(given, copy=True)
    np.testing.assert_array_equal(given, given_before)  # the caller's array is read, never written


def test_a_float64_memory_map_is_read_a_batch_at_a_time(tmp_path):
    import tracemalloc
    rows, width = 1 << 17, 64  # 8M values: 64 MB of float64, 32 MB once cast
    x = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float64, (rows, width))
    x[:] = 0.5
    x.flush()
    x = np.load(tmp_path / "x.npy", mmap_mode="r")
    y = np.zeros((rows, 1), np.float32)
    model = ot.Sequential([L.Dense(1)], input_shape=(width,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x[:64], y[:64], verbose=0)
    for call in (lambda: model.predict(x, batch_size=4096), lambda: model.evaluate(x, y, batch_size=4096),
                 lambda: model.fit(x, y, batch_size=4096, verbose=0)):
        tracemalloc.start()
        try:
            call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 * 2**20, peak  # the whole cast alone: 32 MB
    big = np.lib.format.open_memmap(tmp_path / "big.npy", "w+", np.float64, (rows, width))
    big[-1, -1] = 1e39  # beyond float32, in the last block: refused before anything trains
    weights = model.get_weights()
    with pytest.raises(ot.ShapeError, match=re.escape("x: holds 1e+39, beyond the range of float32")):
        model.fit(big, y, batch_size=4096, verbose=0)
    for a, b in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_data_read_by_rows_is_cast_once_whatever_the_batch_size(monkeypatch):
    # predict cast the data again to count each chunk's rows: 2 casts with batch_size=None, 3 with one
    import ortrain._arrays as arrays
    monkeypatch.setattr(arrays, "DEFERRED_VALUES", 0)
    read, get = [0], arrays.RowCast.__getitem__

    def counting(self, key):
        out = get(self, key)
        read[0] += out.size
        return out

    monkeypatch.setattr(arrays.RowCast, "__getitem__", counting)
    x = np.random.default_rng(0).standard_normal((50_000, 16))
    model = ot.Sequential([L.Dense(1)], input_shape=(16,), seed=0)
    for batch_size, most in ((None, 1.0), (1000, 1.02)):   # (+ one run of 999 rows telling the batch axis)
        read[0] = 0
        got = model.predict(x, batch_size=batch_size)
        assert 1.0 <= read[0] / x.size <= most, (batch_size, read[0] / x.size)
        np.testing.assert_array_equal(got, model.predict(x.astype(np.float32), batch_size=batch_size))

