"""Copies and reloads of a model build the same graph, without touching the global seed."""

import copy
import pickle

import numpy as np
import pytest

import ortrain as ot

L = ot.layers


def dropout_model():
    model = ot.Sequential([L.Dense(8, activation="relu"), L.Dropout(0.3), L.Dense(2)], input_shape=(4,))
    model.compile(optimizer="adam", loss="mse")
    return model


def test_copy_and_reload_keep_the_artifact_key(tmp_path):
    model = dropout_model()  # seeded by conftest, so its dropout carries a graph seed
    key = ot.artifacts.build(model).key
    assert ot.artifacts.build(model.copy()).key == key
    model.save(tmp_path / "m.ortrain")
    assert ot.artifacts.build(ot.load_model(tmp_path / "m.ortrain")).key == key


def test_copies_do_not_consume_the_global_generator():
    ot.set_seed(3)
    dropout_model()
    expected = ot.Sequential([L.Dense(3)], input_shape=(2,)).get_weights()[0]
    ot.set_seed(3)
    model = dropout_model()
    model.copy()
    with ot.Trainer(model, batch_size=4) as tr:  # copies the model too
        tr.model()
    got = ot.Sequential([L.Dense(3)], input_shape=(2,)).get_weights()[0]
    np.testing.assert_array_equal(got, expected)


def test_copies_and_reloads_draw_no_initial_weights(tmp_path, monkeypatch):
    # every copy (Trainer, fit, tr.model(), load_model) drew a full set of Glorot weights and threw it
    # away: 17-25 ms for 2.8M weights, a third of a Trainer's start
    from ortrain.nn import core_layers
    drawn = []
    real = core_layers.glorot_uniform

    def counting(rng, shape, fan_in, fan_out):
        drawn.append(isinstance(rng, np.random.Generator))
        return real(rng, shape, fan_in, fan_out)

    monkeypatch.setattr(core_layers, "glorot_uniform", counting)
    inp = ot.Input((6,))
    ids = ot.Input((3,), dtype="int64")
    h = L.Concatenate()([L.Dense(4)(inp), L.Flatten()(L.Embedding(10, 2)(ids))])
    model = ot.Model([inp, ids], L.Dense(2)(h))
    model.compile(optimizer="adam", loss="mse")
    assert drawn == [True, True]  # the model's own two dense layers (the embedding draws apart)
    model.save(tmp_path / "m.ortrain")
    for rebuilt in (model.copy(), ot.load_model(tmp_path / "m.ortrain")):
        for got, want in zip(rebuilt.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(got, want)
    assert drawn == [True, True] + [False] * 4


def test_copy_of_a_sequential_is_a_sequential():
    assert isinstance(dropout_model().copy(), ot.Sequential)


def test_resume_from_a_checkpoint_with_a_reloaded_dropout_model(tmp_path, rng):
    model = dropout_model()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, y)
        tr.save_checkpoint(tmp_path / "ck")
        trained = tr.model()
    trained.save(tmp_path / "m.ortrain")
    with ot.Trainer.from_checkpoint(ot.load_model(tmp_path / "m.ortrain"), tmp_path / "ck", batch_size=4) as tr2:
        assert tr2.n_steps == 1


def _graph_model(rng):
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])], [w])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.compile(optimizer="adam", loss="mse")
    return model


def test_trainer_models_own_their_weights(rng):
    """A Trainer keeps only the architecture of the model it was given; the models it hands out
    are independent of that model, of the trainer and of each other."""
    x = rng.standard_normal((4, 4)).astype(np.float32)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    for model in (dropout_model(), _graph_model(rng)):
        before = [w.copy() for w in model.get_weights()]
        with ot.Trainer(model, batch_size=4) as tr:
            tr.step(x, y)
            first = tr.model()
            trained = [w.copy() for w in first.get_weights()]
            assert any(not np.array_equal(a, b) for a, b in zip(trained, before))
            first.set_weights([w + 1 for w in trained])
            for w in first._weight_table().values():
                if w.flags.writeable:
                    w *= 2  # in place, through the model's own arrays
                else:  # a layer's weights change through set_weights only
                    with pytest.raises(ValueError, match="read-only"):
                        w *= 2
            second = tr.model()
            for got, want in zip(second.get_weights(), trained):
                np.testing.assert_array_equal(got, want)
            tr.step(x, y)
        for got, want in zip(model.get_weights(), before):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(second.get_weights(), trained):
            np.testing.assert_array_equal(got, want)


def test_deep_models_deep_copy_and_pickle_within_pythons_recursion_limit():
    # RecursionError from some 80 layers (deepcopy) or 100 (pickle): both walked the chain of the
    # model's tensors one layer after another, about 8 frames a layer
    import copy
    import pickle
    x = ot.Input((4,))
    h = x
    for _ in range(150):
        h = ot.layers.Add()([h, ot.layers.Dense(4, activation="tanh")(h)])
    residual = ot.Model(x, ot.layers.Dense(1)(h))
    stacked = ot.Sequential([ot.layers.Dense(4) for _ in range(300)], input_shape=(4,))
    sharing = ot.Sequential(stacked.layers + [ot.layers.Dense(2)], input_shape=(4,))  # first calls in stacked
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for model in (residual, stacked, sharing):
        for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            np.testing.assert_array_equal(copied.predict(a), model.predict(a))
            # the copy's layers know the copy's tensors as the model's know its own
            assert (copied.layers[0].input is copied._inputs[0]) == (model.layers[0].input is model._inputs[0])
            assert (copied.layers[-1].output is copied._outputs[0]) == \
                (model.layers[-1].output is model._outputs[0])
    # a layer or a tensor alone brings the chain before it (each lists its nearest tensors first)
    last = stacked.layers[-1]
    for copied in (copy.deepcopy(last), pickle.loads(pickle.dumps(last))):
        assert copied.output.node.layer is copied and copied.output.shape == last.output.shape
        np.testing.assert_array_equal(copied.kernel, last.kernel)
    layer, model = pickle.loads(pickle.dumps((stacked.layers[-1], stacked)))
    assert layer is model.layers[-1]
    assert len(pickle.loads(pickle.dumps(stacked.layers))) == 300
    assert copy.deepcopy(residual.layers[-1].output).shape == (None, 1)
    copied = copy.deepcopy(residual)
    features = ot.Model(copied.layers[0].input, copied.layers[5].output)
    np.testing.assert_array_equal(features.predict(a), ot.Model(residual.layers[0].input,
                                                                residual.layers[5].output).predict(a))


def test_setting_and_copying_weights_costs_the_same_per_layer_at_any_depth(monkeypatch):
    # set_weights looked up each weight's layer by scanning every layer (quadratic in depth: 233 ms
    # at 1,600 layers where Keras takes some 50); counted here as reads of layers' names
    from ortrain.nn import base_layer
    name = base_layer.Layer.name
    reads = [0]

    def counted(layer):
        reads[0] += 1
        return name.fget(layer)
    monkeypatch.setattr(base_layer.Layer, "name", property(counted, name.fset))
    per_layer = []
    for depth in (50, 200):
        model = ot.Sequential([L.Dense(2) for _ in range(depth)], input_shape=(2,), seed=0)
        weights = model.get_weights()
        reads[0] = 0
        model.set_weights(weights)
        model.copy()
        model.freeze(model.weight_names())
        per_layer.append(reads[0] / depth)
    assert per_layer[1] == per_layer[0] < 60


def test_a_seeded_sequential_keeps_its_stack_through_save_load_copy_and_shallow_copy(tmp_path):
    # After load_model or model.copy() a layer added drew unseeded weights and dropout masks (other
    # ones in every process); copy.copy shared the stack's generator, so an add on the copy changed
    # what a later add on the original drew.
    import copy
    x = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)

    def grown(model):
        model.add(L.Dense(2))
        kernel = model.get_weights()[2]
        model.pop()
        model.add(L.Dropout(0.5))
        model.add(L.Dense(2, seed=1))
        model.compile(optimizer="sgd", loss="mse")
        return kernel, model.fit(x, np.zeros((32, 2), np.float32), batch_size=32, epochs=2, verbose=0,
                                 shuffle=False).history["loss"]

    def base():
        return ot.Sequential([L.Dense(4)], input_shape=(3,), seed=0)
    want_kernel, want_losses = grown(base())
    base().save(tmp_path / "base.ortrain")
    original = base()
    shallow = copy.copy(original)
    shallow.add(L.Dense(2))  # touches the copy only
    for model in (ot.load_model(tmp_path / "base.ortrain"), base().copy(), original):
        kernel, losses = grown(model)
        np.testing.assert_array_equal(kernel, want_kernel)
        assert losses == want_losses


def test_a_seeded_sequential_pops_and_adds_as_the_original_after_a_deep_copy_or_pickle():
    # A deep copy or pickle kept the stack's draws keyed by the original layers' ids, so the copy's
    # pop() did not rewind the generator and its next add drew other weights
    import copy
    import pickle

    def seeded():
        return ot.Sequential([L.Dense(5), L.Dense(4)], input_shape=(3,), seed=7)

    def pop_add(model):
        model.pop()
        model.add(L.Dense(4))
        return model.layers[-1].get_weights()[0]
    want = pop_add(seeded())
    for copied in (copy.deepcopy(seeded()), pickle.loads(pickle.dumps(seeded())), copy.copy(seeded())):
        np.testing.assert_array_equal(pop_add(copied), want)
    original = seeded()
    pop_add(copy.deepcopy(original))
    np.testing.assert_array_equal(pop_add(original), want)


def test_a_sequential_built_by_add_pickles_as_small_as_one_built_from_a_list():
    # each add() assembled the model anew, and every layer kept the tensors of the assembly it was
    # first called in: L add()s held L**2 tensors (800 layers: 17 MB pickles, 14 s deep copies)
    def dense(i):
        return ot.layers.Dense(4, activation="relu", name=f"d{i}")

    listed = ot.Sequential([dense(i) for i in range(60)], input_shape=(4,), seed=0)
    added = ot.Sequential(input_shape=(4,), seed=0)
    for i in range(60):
        added.add(dense(i))
    assert len(pickle.dumps(added)) < 1.2 * len(pickle.dumps(listed))
    outputs = [lyr.output for lyr in added.layers]
    with pytest.raises(ot.OrtrainError):
        added.add(ot.layers.Reshape((3,)))  # 4 values into 3: refused, and the layers stay as they were
    assert all(lyr.output is out for lyr, out in zip(added.layers, outputs, strict=True))
    # a layer's input and output are those of the model as it is (Keras' feature extractor idiom)
    features = ot.Model(added.input, added.layers[-2].output)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(features.predict(x), ot.Sequential(added.layers[:-1], input_shape=(4,)).predict(x))
    for got, want in zip(copy.deepcopy(added).get_weights(), listed.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_failed_pickle_leaves_later_copies_of_deep_models_alone():
    # A pickle refused half-way (an unpicklable attribute) left its tensors marked as listed in the
    # thread for good: later copies of that model, and of new models reusing the ids, recursed past
    # Python's limit. Pickle protocols 0 and 1 failed on the nodes' __slots__.
    import copy
    import gc
    import pickle

    def deep():
        x = ot.Input((4,))
        h = x
        for _ in range(300):
            h = L.Dense(4)(h)
        return ot.Model(x, h)
    model = deep()
    model.layers[10].note = lambda: 0
    with pytest.raises(Exception, match="pickle"):
        pickle.dumps(model)
    del model.layers[10].note
    model.layers[5].__getstate__()  # a state asked for and dropped
    gc.collect()
    a = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(copy.deepcopy(model).predict(a), model.predict(a))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(model, protocol=protocol)).predict(a), model.predict(a))
    del model
    gc.collect()
    for _ in range(3):
        copy.deepcopy(deep())


def test_a_failed_copy_whose_exception_is_kept_leaves_later_copies_of_deep_models_alone():
    # The states of a copy that failed live as long as its exception (Python's REPL keeps the last
    # one, Jupyter all of them), and their marks with them: the next copies recursed past the limit
    import copy
    import pickle
    import threading

    x = ot.Input((2,))
    h = x
    for _ in range(1500):
        h = L.Dense(2)(h)
    model = ot.Model(x, h)
    model.lock = threading.Lock()  # what no copy can take
    kept = []
    for attempt in (copy.deepcopy, pickle.dumps):
        try:
            attempt(model)
        except TypeError as exc:
            kept.append(exc)
    assert len(kept) == 2
    del model.lock
    a = np.random.default_rng(0).standard_normal((2, 2)).astype(np.float32)
    np.testing.assert_array_equal(copy.deepcopy(model).predict(a), model.predict(a))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(model)).predict(a), model.predict(a))


def test_pickles_of_models_from_before_the_nodes_had_a_state_of_their_own_load():
    # The nodes of ortrain 0.1.0's first pickles were saved as Python saves a class with __slots__,
    # (None, {slot: value}); they failed to load once the nodes wrote a state of their own
    import copyreg
    import io
    import pickle

    from ortrain.nn.symbolic import _Node

    class AsBefore(pickle.Pickler):
        def reducer_override(self, obj):
            if type(obj) is _Node:
                return copyreg.__newobj__, (_Node,), (None, {k: getattr(obj, k) for k in _Node.__slots__})
            return NotImplemented

    x = ot.Input((4,))
    functional = ot.Model(x, L.Dense(2)(L.Dense(3, activation="tanh")(x)))
    sequential = ot.Sequential([L.Dense(2)], input_shape=(4,))
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    for protocol in (2, 4, 5):
        buffer = io.BytesIO()
        AsBefore(buffer, protocol=protocol).dump([functional, sequential])
        assert buffer.getvalue() != pickle.dumps([functional, sequential], protocol=protocol)
        loaded = pickle.loads(buffer.getvalue())
        for before, after in zip([functional, sequential], loaded, strict=True):
            np.testing.assert_array_equal(after.predict(a), before.predict(a))
            assert after.weight_names() == before.weight_names()


def test_a_forward_only_capture_with_dropout_leaves_the_seeded_generator_alone():
    # ot.capture applies no dropout, yet drew a mask seed from ot.set_seed's generator, changing
    # every model built after it
    from ortrain import ag
    kernels = []
    for capture_first in (False, True):
        ot.set_seed(5)
        if capture_first:
            out = ot.capture(lambda x: ag.dropout(x, 0.5))(x=np.ones((4, 3), np.float32))
            np.testing.assert_array_equal(out, np.ones((4, 3), np.float32))
        kernels.append(ot.Sequential([L.Dense(2)], input_shape=(3,)).get_weights()[0])
    np.testing.assert_array_equal(kernels[0], kernels[1])
    ot.set_seed(None)
