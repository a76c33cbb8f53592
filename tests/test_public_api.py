"""The public surface of API.md: names exist, signatures and defaults are the contract's."""

import inspect
import io
import re

import numpy as np
import pytest

import ortrain as ot
from ortrain import ag


def params(fn) -> dict:
    """Public parameters and their defaults (private ``_keywords`` are not part of the contract)."""
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if not n.startswith("_")}


def test_everything_in_all_is_importable():
    for name in ot.__all__:
        assert hasattr(ot, name), name


@pytest.mark.parametrize("name", ["Dense", "Activation", "Dropout", "BatchNorm", "LayerNorm", "Embedding", "Conv2D",
                                  "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D", "Flatten", "Reshape", "Add",
                                  "Concatenate"])
def test_layers(name):
    assert isinstance(getattr(ot.layers, name), type)


def test_losses_optimizers_callbacks_errors():
    for name in ("MeanSquaredError", "MeanAbsoluteError", "Huber", "CategoricalCrossentropy",
                 "SparseCategoricalCrossentropy", "BinaryCrossentropy"):
        assert hasattr(ot.losses, name)
    assert params(ot.losses.Huber) == {"delta": 1.0}
    assert params(ot.losses.CategoricalCrossentropy) == {"from_logits": False}
    for name in ("Adam", "AdamW", "SGD"):
        assert hasattr(ot.optim, name)
    for name in ("step", "cosine", "warmup_cosine"):
        assert callable(getattr(ot.optim.schedules, name))
    for name in ("Callback", "EarlyStopping", "LearningRateScheduler", "StepDecay", "CosineDecay",
                 "ReduceLROnPlateau", "CSVLogger", "ModelCheckpoint", "TerminateOnNaN"):
        assert hasattr(ot.callbacks, name)
    assert issubclass(ot.ShapeError, ValueError) and issubclass(ot.ShapeError, ot.OrtrainError)
    assert issubclass(ot.FreedError, RuntimeError) and issubclass(ot.NonFiniteError, FloatingPointError)
    assert issubclass(ot.UnsupportedOpError, NotImplementedError)


def test_trainer_signatures():
    assert params(ot.Trainer) == {"model": inspect.Parameter.empty, "batch_size": 32, "nbatch_logical": None,
                                  "loss_mask": None, "weight_decay": None, "device": "cpu", "threads": None}
    assert list(params(ot.Trainer.step)) == ["self", "x", "y", "sample_weight"]
    assert list(params(ot.Trainer.eval)) == ["self", "x", "y", "sample_weight"]
    assert params(ot.Trainer.predict)["batch_size"] is None
    assert list(params(ot.Trainer.from_checkpoint))[:3] == ["model", "path", "batch_size"]
    assert list(params(ot.Trainer.from_artifacts))[:2] == ["directory", "batch_size"]
    for method in ("snapshot", "update_target", "model", "calibrate_bn", "set_lr", "save_checkpoint", "free"):
        assert callable(getattr(ot.Trainer, method))
    for method in ("predict", "get_weights", "free"):
        assert callable(getattr(ot.Snapshot, method))


def test_model_and_fit_signatures():
    fit = params(ot.Model.fit)
    for name, default in {"batch_size": None, "epochs": 1, "validation_split": 0.0, "validation_data": None,
                          "shuffle": True, "sample_weight": None, "callbacks": None, "verbose": 1,
                          "initial_epoch": 0}.items():
        assert fit[name] == default, name
    # fit: the contract's parameters in its order, then Keras' class_weight and validation_freq (added
    # at the end, so positional calls written against the contract keep working); fit_generator: the
    # contract's, exactly.
    assert params(ot.fit_generator) == {
        "model": inspect.Parameter.empty, "generator": inspect.Parameter.empty, "steps_per_epoch": None,
        "epochs": 1, "initial_epoch": 0, "validation_generator": None, "validation_steps": None, "loss": None,
        "optimizer": None, "nbatch_logical": None, "callbacks": (), "verbose": 1, "loss_mask": None,
        "weight_decay": 0.0}
    assert list(fit)[-2:] == ["class_weight", "validation_freq"] and fit["class_weight"] is None
    assert fit["validation_freq"] == 1
    assert list(params(ot.from_onnx))[:4] == ["model", "trainable", "frozen", "input_names"]
    for method in ("compile", "evaluate", "predict", "save", "export_onnx", "get_weights", "set_weights",
                   "weight_names", "freeze", "unfreeze", "freeze_bn_stats", "unfreeze_bn_stats"):
        assert callable(getattr(ot.Model, method))
    assert params(ot.Model.predict)["batch_size"] is None


def test_capture_signatures_and_ag_ops():
    assert list(params(ot.capture_step)) == ["fn", "optimizer", "params", "max_grad_norm"]   # API.md's order
    assert params(ot.capture_step)["max_grad_norm"] is None
    assert list(params(ot.capture)) == ["fn", "params"]
    for name in ("param", "buffer", "matmul", "add", "sub", "mul", "div", "scale", "relu", "sigmoid", "tanh",
                 "gelu", "softmax", "log_softmax", "exp", "log", "sum", "mean", "reshape", "transpose", "concat",
                 "get_rows", "linear", "dropout", "pow", "sqrt", "square", "abs", "neg", "mse_loss",
                 "cross_entropy_loss", "softmax_cross_entropy_loss", "huber_loss", "bce_with_logits_loss"):
        assert callable(getattr(ag, name)), name


def test_artifacts_api():
    sig = inspect.signature(ot.artifacts.build).parameters
    assert [(n, p.default) for n, p in list(sig.items())[:4]] == \
        [("model_or_onnx", inspect.Parameter.empty), ("loss", "mse"), ("optimizer", "adamw"), ("out_dir", None)]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(sig.values())[4:])
    assert callable(ot.artifacts.load)


def test_misplaced_optimizer_and_bad_configs_get_clear_errors():
    import numpy as np
    W = ag.param(np.zeros((2, 2)), name="W")
    opt = ot.optim.Adam([W])
    # API.md's order, fn, optimizer, params, max_grad_norm: the optimizer may come second by position
    assert list(inspect.signature(ot.capture_step).parameters) == ["fn", "optimizer", "params", "max_grad_norm"]
    assert ot.capture_step(lambda x: ag.mean(W @ x), opt)(x=np.ones((2, 3))) == 0.0
    for call in (lambda: ot.capture_step(lambda x: ag.mean(W @ x), [W], opt),
                 lambda: ot.capture_step(lambda x: ag.mean(W @ x), optimizer=[W])):
        with pytest.raises(ot.OrtrainError, match=r"optimizer: expected an ot.optim.Adam or AdamW, received params "
                                                  r".*pass them by name: ot.capture_step\(fn, optimizer=opt, params="):
            call()
    for call in (lambda: ot.capture_step(lambda x: ag.mean(W @ x), opt, 1.0),
                 lambda: ot.capture(lambda x: ag.mean(W @ x), params=1.0)):
        with pytest.raises(ot.OrtrainError, match=r"params expected None or a list of ag.param / ag.buffer objects"):
            call()
    with pytest.raises(ot.OrtrainError, match="huber: cannot build it from"):
        ot.losses.get({"name": "huber", "delt": 2})
    with pytest.raises(ot.OrtrainError, match="adam: cannot build it from"):
        ot.optim.get({"name": "adam", "learn_rate": 2})
    for betas in (5, (0.9,), ("0.9", "0.99"), (0.9, 1.0), (0.9, float("nan"))):
        with pytest.raises(ot.OrtrainError, match=re.escape(f"betas: expected two numbers in [0, 1), received "
                                                            f"{betas!r}")):
            ot.optim.get({"name": "adam", "betas": betas})
    assert ot.optim.get({"name": "adamw", "betas": [0.8, 0.9]}).betas == (0.8, 0.9)  # a JSON list
    with pytest.raises(ot.OrtrainError, match="Reshape\\(target_shape=...\\): expected a tuple of ints"):
        ot.layers.Reshape(("a", 2))


@pytest.mark.parametrize("make, says", [
    (lambda: ot.layers.Conv2D(4, 3, data_format="channels_last"),
     "Conv2D\\(data_format=...\\): Conv2D takes no argument 'data_format' \\(it takes filters, kernel_size.*"
     "channels first.*x.transpose\\(0, 3, 1, 2\\)"),
    (lambda: ot.layers.Dense(4, kernel_initializer="he_normal"),
     "Dense\\(kernel_initializer=...\\): .*Glorot-uniform.*set_weights"),
    (lambda: ot.losses.CategoricalCrossentropy(label_smoothing=0.1), "label_smoothing.*y \\* \\(1 - a\\) \\+ a / classes"),
    (lambda: ot.optim.Adam(amsgrad=True), "Adam\\(amsgrad=...\\): Adam takes no argument 'amsgrad'"),
    # an Adam given an SGD's momentum is not told to use Adam
    (lambda: ot.optim.Adam(momentum=0.9), "Adam\\(momentum=...\\): Adam takes no argument 'momentum' \\(it takes "
                                          "params, lr, betas, eps, weight_decay, learning_rate, beta_1, beta_2, "
                                          "epsilon\\)$"),
    (lambda: ot.layers.BatchNorm(axis=1), "BatchNorm\\(axis=...\\): BatchNorm takes no argument 'axis' \\(it takes "
                                          "momentum, epsilon, name\\)"),
    (lambda: ot.layers.Dense(), "Dense: missing a required argument: 'units'"),
])
def test_keras_arguments_without_a_counterpart_are_named_with_the_fix(make, says):
    # Python's own TypeError named neither what the class takes nor what to do instead.
    with pytest.raises(ot.OrtrainError, match=says):
        make()


def test_an_argument_a_class_does_not_take_is_a_type_error_too_named_by_the_class_built():
    # code that catches Python's TypeError around construction keeps working
    with pytest.raises(TypeError, match="Dense\\(kernel_initializer=...\\)"):
        ot.layers.Dense(3, kernel_initializer="he")

    class MyDense(ot.layers.Dense):
        pass

    with pytest.raises(ot.OrtrainError, match="MyDense\\(foo=...\\): MyDense takes no argument 'foo'"):
        MyDense(3, foo=1)


@pytest.mark.parametrize("call, says", [
    (lambda m: m.compile(optimizer="adam", loss="mse", run_eagerly=True),
     "compile\\(run_eagerly=...\\): compile takes no argument 'run_eagerly' \\(it takes optimizer, loss, metrics, "
     "weighted_metrics\\); .*no eager mode"),
    (lambda m: m.fit(np.ones((4, 3)), np.ones((4, 2)), workers=2, verbose=0), "fit\\(workers=...\\): .*generator"),
    (lambda m: m.save("unused.ortrain", overwrite=True), "save\\(overwrite=...\\)"),
    (lambda m: ot.Trainer(m, batchsize=3), "Trainer\\(batchsize=...\\): Trainer takes no argument 'batchsize' \\(it "
                                            "takes model, batch_size, nbatch_logical, loss_mask, weight_decay, "
                                            "device, threads\\)$"),
    (lambda m: ot.fit_generator(m, [], epoch=3), "fit_generator\\(epoch=...\\)"),
    (lambda m: ot.Input((4,), batch_size=8), "Input\\(batch_size=...\\): .*Trainer\\(model, batch_size=...\\)"),
    (lambda m: ot.load_model("unused.ortrain", custom_objects={}), "load_model\\(custom_objects=...\\)"),
    (lambda m: ot.layers.Flatten(data_format="channels_last"), "Flatten\\(data_format=...\\): Flatten takes no "
                                                                "argument 'data_format' \\(it takes name, seed\\)"),
    (lambda m: ot.losses.MeanSquaredError(reduction="sum"), "MeanSquaredError takes no argument 'reduction' \\(it "
                                                            "takes no arguments\\)"),
])
def test_public_calls_name_an_argument_they_do_not_take(call, says):
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ot.OrtrainError, match=says) as refused:
        call(model)
    assert isinstance(refused.value, TypeError)
    assert model.optimizer.step == 0 and not model.history  # nothing ran


def test_every_public_call_names_an_argument_it_does_not_take(tmp_path):
    # about half the API raised Python's own TypeError, some naming an internal class
    # ("TrainerSetup.from_artifacts() got an unexpected keyword argument")
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    tr = ot.Trainer(model, batch_size=4)
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    snap = tr.snapshot()
    W = ag.param(np.ones((2, 3), np.float32), name="W")
    before = tr.get_weights()
    calls = [
        (lambda: tr.step(x, y, sw=1), "Trainer.step", "x, y, sample_weight"),
        (lambda: tr.step(x), "Trainer.step", "x, y, sample_weight"),   # missing y
        (lambda: tr.eval(x, y, weights=1), "Trainer.eval", "x, y, sample_weight"),
        (lambda: tr.predict(x, verbose=0), "Trainer.predict", "x, batch_size"),
        (lambda: tr.set_weights(before, strict=True), "Trainer.set_weights", "weights"),
        (lambda: tr.update_target(snap, taux=1.0), "Trainer.update_target", "target, tau"),
        (lambda: tr.calibrate_bn(x, steps=2), "Trainer.calibrate_bn", "x"),
        (lambda: tr.save_checkpoint(tmp_path / "c", overwrite=True), "Trainer.save_checkpoint", "path"),
        (lambda: ot.Trainer.from_checkpoint(model, tmp_path / "c", bogus=2), "Trainer.from_checkpoint", "model, path"),
        (lambda: ot.Trainer.from_artifacts(tmp_path, loss_mask=1), "Trainer.from_artifacts", "directory, batch_size"),
        (lambda: snap.predict(x, verbose=0), "Snapshot.predict", "x, batch_size"),
        (lambda: model.set_weights(model.get_weights(), strict=True), "Model.set_weights", "weights"),
        (lambda: model.get_weights(1), "Model.get_weights", "no arguments"),
        (lambda: model.summary(line_length=80), "Model.summary", "print_fn"),
        (lambda: ot.Sequential([], bogus=1), "Sequential", "layers, input_shape, name, seed"),
        (lambda: ot.capture_step(lambda: W, opt=1), "capture_step", "fn, optimizer, params, max_grad_norm"),
        (lambda: ot.artifacts.build(model, losss="mse"), "artifacts.build", "model_or_onnx, loss, optimizer"),
        (lambda: ot.artifacts.load(tmp_path, x=1), "artifacts.load", "directory"),
        (lambda: ot.callbacks.ReduceLROnPlateau(bogus=1), "ReduceLROnPlateau", "monitor, factor"),
        (lambda: ot.callbacks.TerminateOnNaN(3), "TerminateOnNaN", "no arguments"),
        (lambda: ot.callbacks.EarlyStopping(patiense=3), "EarlyStopping", "monitor, min_delta, patience"),
        (lambda: ag.mean(W, axes=0), "ag.mean", "x, axis, keepdims, dim, keepdim"),
        (lambda: ag.param(np.ones(2), nmae="b"), "ag.param", "array, name"),
        (lambda: W.assign(np.ones((2, 3)), copy=False), "Param.assign", "value"),
        (lambda: model.optimizer.load_state({}, strict=False), "Optimizer.load_state", "state"),
        (lambda: ot.set_seed(0, deterministic=True), "set_seed", "seed"),
        (lambda: ot.datasets.load_digits(as_frame=True), "datasets.load_digits", "flatten"),
    ]
    for call, name, takes in calls:
        with pytest.raises(ot.OrtrainError, match=rf"^{re.escape(name)}\b.*\(it takes {re.escape(takes)}") as refused:
            call()
        assert isinstance(refused.value, TypeError), name
    assert tr.n_steps == 0 and all((a == b).all() for a, b in zip(tr.get_weights(), before))
    assert not list(tmp_path.iterdir())  # nothing was written


def test_a_type_error_from_inside_a_named_call_goes_on_as_it_was():
    from ortrain._keywords import names_unknown_arguments_of

    def inner(a, b=1):
        return a + "text"   # a TypeError that is not the call's

    wrapped = names_unknown_arguments_of(inner)
    with pytest.raises(TypeError, match="unsupported operand") as raised:
        wrapped(1, b=2)
    assert not isinstance(raised.value, ot.OrtrainError)
    with pytest.raises(ot.OrtrainError, match=r"inner\(c=...\): inner takes no argument 'c' \(it takes a, b\)"):
        wrapped(1, c=2)


def test_refusals_say_what_to_do(tmp_path):
    # these named the problem without the fix (or, for a parent that is a file, the wrong problem)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    (tmp_path / "afile").write_text("")
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    for make, who, arg in ((ot.callbacks.ModelCheckpoint, "ModelCheckpoint", "filepath"),
                           (ot.callbacks.CSVLogger, "CSVLogger", "filename")):
        with pytest.raises(ot.OrtrainError, match=rf"{who}: directory '.*afile' of {arg} is a file, not a directory; "
                                                  rf"create it or choose another {arg}"):
            model.fit(x, y, verbose=0, callbacks=[make(str(tmp_path / "afile" / "x.csv"))])
    with pytest.raises(ot.OrtrainError, match=r"cannot read checkpoint '.*nope': No such file or directory; give the "
                                              r"path of a file that save_checkpoint"):
        ot.Trainer.from_checkpoint(model, tmp_path / "nope")
    sgd = ot.optim.SGD(lr=0.1)
    with pytest.raises(ot.OrtrainError, match=r"state of a 'adam' optimizer cannot be loaded into 'sgd': .*load it into "
                                              r"an optimizer of its kind \(ot.optim.get\('adam'\)"):
        sgd.load_state(model.optimizer.state())
    assert model.optimizer.step == 0 and not model.history


def test_the_named_calls_pickle_as_before():
    # wrapping them for their argument errors left pickle finding the unwrapped function under their
    # name (ot.ag.relu, ot.Trainer.save_checkpoint: PicklingError)
    import pickle
    for f in [*(getattr(ag, n) for n in ag.__all__), ot.capture_step, ot.artifacts.build, ot.set_seed,
              ot.Trainer.save_checkpoint, ot.Trainer.step, ot.Model.set_weights, ot.Sequential.add]:
        assert pickle.loads(pickle.dumps(f)) is f, f
    assert pickle.loads(pickle.dumps(ot.Trainer.from_checkpoint)) == ot.Trainer.from_checkpoint


def test_keepdims_takes_booleans_only_and_matches_numpy():
    # keepdims=2 was recorded as kept, (3, 1), and computed as dropped, (3,): x - sum(x, 1, keepdims)
    # broadcast along the other axis without a word ([-3, -11, -19] where numpy gives [-3, -2, -1])
    a = np.arange(9, dtype=np.float32).reshape(3, 3)
    for keep in (True, 1, np.bool_(True)):
        np.testing.assert_allclose(ot.capture(lambda x, k=keep: ag.sub(x, ag.sum(x, axis=1, keepdims=k)))(x=a),
                                   a - a.sum(axis=1, keepdims=True))
        np.testing.assert_allclose(ot.capture(lambda x, k=keep: ag.sub(x, ag.mean(x, dim=1, keepdim=k)))(x=a),
                                   a - a.mean(axis=1, keepdims=True), rtol=1e-6)
    for keep in (2, -1, "yes", None, 1.0):
        for op in (ag.sum, ag.mean):
            with pytest.raises(ot.OrtrainError, match=rf"{op.__name__}: keepdims: expected True or False, "
                                                      rf"received {re.escape(repr(keep))}"):
                ot.capture(lambda x, k=keep, op=op: op(x, axis=1, keepdims=k))(x=a)


def test_flags_sizes_names_and_streams_are_checked_where_they_are_given(tmp_path):
    # each was taken by truthiness or stored as given, and failed later or meant something else:
    # from_logits="False" trained from logits, name=3 failed in every fit with a raw TypeError,
    # ProgressBar(file="log.txt") died inside tqdm
    flags = [(lambda v: ot.losses.CategoricalCrossentropy(from_logits=v), "CategoricalCrossentropy(from_logits=...)"),
             (lambda v: ot.losses.SparseCategoricalCrossentropy(from_logits=v),
              "SparseCategoricalCrossentropy(from_logits=...)"),
             (lambda v: ot.losses.BinaryCrossentropy(from_logits=v), "BinaryCrossentropy(from_logits=...)"),
             (lambda v: ot.callbacks.EarlyStopping(restore_best_weights=v), "EarlyStopping(restore_best_weights=...)"),
             (lambda v: ot.callbacks.ModelCheckpoint(str(tmp_path / "m"), save_best_only=v),
              "ModelCheckpoint(save_best_only=...)"),
             (lambda v: ot.callbacks.CSVLogger(str(tmp_path / "log.csv"), append=v), "CSVLogger(append=...)")]
    for make, argument in flags:
        for value in ("False", float("nan"), 2, None):
            with pytest.raises(ot.OrtrainError, match=rf"{re.escape(argument)}: expected True or False, received "
                                                      rf"{re.escape(repr(value))}"):
                make(value)
        make(np.bool_(False))
    model = ot.Sequential([ot.layers.Dense(np.array(3))], input_shape=(4,), seed=0)  # a 0-d int array is an int
    with pytest.raises(ot.OrtrainError, match=r"count_params\(trainable_only=...\): expected True or False"):
        model.count_params("yes")
    assert model.count_params() == 15  # 4 x 3 + 3
    with pytest.raises(ot.OrtrainError, match="refresh_checkpoint: expected True or False, received 'no'"):
        ot.artifacts.build(model, loss="mse", refresh_checkpoint="no", out_dir=tmp_path / "art")
    assert not (tmp_path / "art").exists()
    for name in (3, ""):
        with pytest.raises(ot.OrtrainError, match=rf"Sequential\(name=...\): expected a non-empty string .*received "
                                                  rf"{re.escape(repr(name))}"):
            ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), name=name)
        inp = ot.Input((4,))
        with pytest.raises(ot.OrtrainError, match=r"Model\(name=...\): expected a non-empty string"):
            ot.Model(inp, ot.layers.Dense(2)(inp), name=name)
    with pytest.raises(ot.OrtrainError, match=r"ProgressBar\(file=...\): expected a text stream with write\(\) "
                                              r".*received 'log.txt': open it first"):
        ot.callbacks.ProgressBar(file="log.txt")
    with pytest.raises(ot.OrtrainError, match=r"ProgressLines\(file=...\): expected a text stream"):
        ot.callbacks.ProgressLines(file=io.BytesIO())  # a fit wrote its first line and died there
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    for call in (lambda: model.predict(x, verbose=7), lambda: model.evaluate(x, y, verbose="x")):
        with pytest.raises(ot.OrtrainError, match="verbose: expected 0"):
            call()
    hist = model.fit(x, y, epochs=np.array(2), batch_size=np.array(8), verbose=0)
    assert len(hist.history["loss"]) == 2 and model.optimizer.step == 2
    with ot.Trainer(model, batch_size=8) as tr:
        for rows in (-1, "2", 0):
            with pytest.raises(ot.OrtrainError, match=rf"eval_with_outputs\(rows=...\): expected a positive int or "
                                                      rf"None, received {re.escape(repr(rows))}"):
                tr.eval_with_outputs(x, y, rows=rows)
        loss, out = tr.eval_with_outputs(x, y, rows=8)
        assert out.shape == (8, 3) and loss == pytest.approx(float(np.mean(model.predict(x) ** 2)), rel=1e-6)
    path = tmp_path / "m.onnx"
    model.export_onnx(path)
    for names in (3, {"input"}):
        with pytest.raises(ot.OrtrainError, match=rf"input_names: expected a list of graph input names in the order "
                                                  rf"to feed them, received {re.escape(repr(names))}"):
            ot.from_onnx(path, input_names=names)
    for names in (["input"], {"input": 0}.keys(), np.array(["input"]), iter(["input"])):  # any ordered names
        assert [s.name for s in ot.from_onnx(path, input_names=names).input_specs] == ["input"]
    with pytest.raises(ot.OrtrainError, match=r"from_onnx\(name=...\): expected a non-empty string"):
        ot.from_onnx(path, name="")
    # a name set on a model after it was built, which a constructor refuses, is saved and loads as the default
    model.name = ""
    model.save(tmp_path / "unnamed.ortrain")
    assert ot.load_model(tmp_path / "unnamed.ortrain").name == "model"
    with pytest.raises(ot.OrtrainError, match=r"trainable= and frozen= both list 'dense_0\.kernel'"):
        ot.from_onnx(path, trainable=["dense_0.kernel"], frozen=["dense_0.kernel"])
    assert ot.from_onnx(path, trainable=["*"], frozen=["dense_0.bias"]).trainable_weight_names == ["dense_0.kernel"]


def test_load_digits_takes_a_flag_as_true_or_false_only():
    x, y = ot.datasets.load_digits()
    images, labels = ot.datasets.load_digits(flatten=False)
    assert x.shape == (1797, 64) and images.shape == (1797, 1, 8, 8) and x.dtype == images.dtype == np.float32
    np.testing.assert_array_equal(images.reshape(1797, 64), x)
    np.testing.assert_array_equal(y, labels)
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    for bad in ("no", None, 0):  # ("no" gave flattened data, None images)
        with pytest.raises(ot.OrtrainError, match=r"load_digits\(flatten=...\): expected True or False, received"):
            ot.datasets.load_digits(bad)


def test_classes_show_their_own_signature():
    """Constructors wrapped to name unknown arguments still show what they take (help(), inspect):
    a class without an __init__ of its own showed (*args, **kwargs)."""
    import inspect
    assert str(inspect.signature(ot.callbacks.TerminateOnNaN)) == "()"
    assert list(inspect.signature(ot.callbacks.EarlyStopping).parameters)[:3] == ["monitor", "min_delta", "patience"]
    assert list(inspect.signature(ot.layers.Dense).parameters)[:2] == ["units", "activation"]
