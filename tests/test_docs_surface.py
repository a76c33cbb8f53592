"""What help(), IDEs and type tools see: docstrings, reprs, signatures, type hints, the CLI's help."""

import inspect
import typing

import numpy as np
import pytest

import ortrain as ot
from ortrain import ag
from ortrain.cli import main

MODULES = (ot, ot.layers, ot.losses, ot.optim, ot.optim.schedules, ot.callbacks, ot.ag, ot.artifacts, ot.metrics,
           ot.engine, ot.datasets)


def public_callables():
    seen = set()
    for module in MODULES:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{module.__name__}.{name}", obj
            if isinstance(obj, type):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and callable(member):
                        yield f"{module.__name__}.{name}.{attr}", member


def test_type_hints_resolve_on_every_public_callable():
    failures = []
    for where, obj in public_callables():
        target = obj.__init__ if isinstance(obj, type) else obj
        try:
            typing.get_type_hints(target)
        except Exception as exc:  # noqa: BLE001 - collected, reported together
            failures.append(f"{where}: {type(exc).__name__}: {exc}")
    assert not failures, failures
    assert typing.get_type_hints(ot.Model.compile)["return"] is ot.Model
    assert typing.get_type_hints(ot.Trainer.from_checkpoint)["return"] is ot.Trainer
    assert typing.get_type_hints(ot.Trainer.from_artifacts)["return"] is ot.Trainer


def test_no_private_parameter_in_a_public_signature():
    leaks = [f"{where}: {n}" for where, obj in public_callables()
             for n in _parameters(obj) if n.startswith("_")]
    assert not leaks, leaks
    assert "one_line_for_the_command_line" not in dir(ot)


def _parameters(obj):
    try:
        return inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return {}


def test_signatures_show_the_real_defaults():
    assert str(inspect.signature(ot.losses.MeanSquaredError)) == "()"
    assert str(inspect.signature(ot.losses.MeanAbsoluteError)) == "()"
    with pytest.raises(ot.OrtrainError, match="MeanSquaredError takes no argument 'reduction'"):
        ot.losses.MeanSquaredError(reduction="sum")
    for fn, default in ((ag.softmax, "-1"), (ag.log_softmax, "-1"), (ag.concat, "0")):
        assert repr(inspect.signature(fn).parameters["axis"].default) == default


def test_axis_left_out_still_tells_a_conflicting_dim_apart():
    x = ag.param(np.ones((2, 3), np.float32), name="x")
    assert ag.softmax(x, dim=0).shape == (2, 3) and ag.concat([x, x]).shape == (4, 3)
    assert ag.concat([x, x], dim=1).shape == (2, 6)
    with pytest.raises(ot.OrtrainError, match="axis=-1 and dim=0 name one setting"):
        ag.softmax(x, axis=-1, dim=0)


@pytest.mark.parametrize("member", [
    ot.Model.get_weights, ot.Model.weight_names, ot.Snapshot.weight_names, ot.Trainer.lr, ot.Trainer.n_updates,
    ot.Trainer.eval_with_outputs, ot.get_num_threads, ot.metrics.Metric, ot.artifacts.Artifacts.training,
    ot.artifacts.Artifacts.params, ot.artifacts.Artifacts.loss, ot.artifacts.Artifacts.optimizer,
    *(getattr(ot.callbacks.Callback, hook) for hook in ("on_train_begin", "on_train_end", "on_epoch_begin",
                                                        "on_epoch_end", "on_batch_begin", "on_batch_end")),
])
def test_members_have_docstrings(member):
    assert (member.__doc__ or "").strip()


def test_docstrings_state_what_they_return():
    assert "fit" in ot.Trainer.n_steps.__doc__
    assert "kernel ``(in, out)`` then bias" in ot.Model.get_weights.__doc__
    assert "running_var" in ot.Model.get_weights.__doc__
    assert "1e-7" in ot.losses.CategoricalCrossentropy.__doc__
    assert "1e-7" in ot.losses.SparseCategoricalCrossentropy.__doc__
    assert "ACTIVATIONS" not in ot.layers.Dense.__doc__ and "leaky_relu" in ot.layers.Dense.__doc__
    assert "canonical_forward" not in ot.from_onnx.__doc__
    from ortrain.capture import CaptureStep
    assert "max_grad_norm" in CaptureStep.set.__doc__


def test_n_steps_counts_the_fit_before_the_trainer():
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile("adam", "mse")
    model.fit(np.ones((8, 4)), np.ones((8, 2)), batch_size=4, verbose=0)
    with ot.Trainer(model, batch_size=4) as tr:
        assert tr.n_steps == 2
        tr.step(np.ones((4, 4)), np.ones((4, 2)))
        assert tr.n_steps == 3 and tr.n_updates == 3


def _model():
    model = ot.Sequential([ot.layers.Dense(3), ot.layers.BatchNorm(), ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile("adam", "mse")
    return model


def test_reprs_hold_key_facts_and_survive_free():
    model = _model()
    model.fit(np.ones((8, 4)), np.ones((8, 2)), batch_size=4, verbose=0)
    state = repr(model.train_state)
    assert "step=2" in state and "(4, 3)" in state and "array" not in state
    tr = ot.Trainer(model, batch_size=4)
    snap = tr.snapshot()
    assert repr(snap) == "<Snapshot weights=8 device='cpu'>"
    assert repr(tr) == "<Trainer batch_size=4 n_steps=2 lr=0.001>"
    snap.free()
    tr.free()
    assert repr(snap) == "<Snapshot weights=8 freed>" and repr(tr) == "<Trainer batch_size=4 freed>"
    assert repr(ot.History()) == "<History 0 epochs>"
    assert repr(ot.Snapshot.__new__(ot.Snapshot))  # half-built: still a repr


def test_artifacts_repr_is_short():
    model = ot.Sequential([ot.layers.Dense(2) for _ in range(40)], input_shape=(4,), seed=0)
    art = ot.artifacts.build(model, loss="mse", optimizer="adam")
    text = repr(art)
    assert len(text) < 400, text
    for fact in ("inputs=[input (None, 4)]", "outputs=[output (None, 2)]", "weights=80", "loss=mse()", "optimizer=adam("):
        assert fact in text, text
    assert repr(ot.artifacts.Artifacts("somewhere", {"inputs": 1})) == "<Artifacts 'somewhere'>"


def test_capture_reprs():
    W = ag.param(np.zeros((2, 3), np.float32), name="W")

    def loss_fn(x, y):
        return ag.mse_loss(ag.matmul(W, x), y)
    step = ot.capture_step(loss_fn, optimizer=ot.optim.Adam([W]))
    assert repr(step) == "<CaptureStep loss_fn params=[W] not yet traced>"
    step(x=np.ones((3, 4), np.float32), y=np.zeros((2, 4), np.float32))
    assert repr(step) == "<CaptureStep loss_fn params=[W] step=1>"
    step.free()
    assert repr(step) == "<CaptureStep loss_fn params=[W] freed>"
    fwd = ot.capture(lambda x: ag.matmul(W, x))
    fwd(x=np.ones((3, 4), np.float32))
    assert repr(fwd) == "<Capture <lambda> params=[W] traced>"
    fwd.free()
    assert repr(fwd) == "<Capture <lambda> params=[W] freed>"


@pytest.mark.parametrize("make, shown", [
    (lambda: ot.callbacks.EarlyStopping(patience=3), "EarlyStopping(monitor='val_loss', patience=3, mode='min')"),
    # the direction watched is always shown: without it mode="max" read as the opposite
    (lambda: ot.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1),
     "EarlyStopping(monitor='loss', patience=1, mode='max')"),
    (lambda: ot.callbacks.ReduceLROnPlateau(monitor="val_accuracy"), "ReduceLROnPlateau(monitor='val_accuracy', mode='max')"),
    (lambda: ot.callbacks.EarlyStopping(monitor="val_accuracy", min_delta=0.1, restore_best_weights=True),
     "EarlyStopping(monitor='val_accuracy', min_delta=0.1, mode='max', restore_best_weights=True)"),
    (lambda: ot.callbacks.ModelCheckpoint("ck-{epoch}", save_best_only=True),
     "ModelCheckpoint(filepath='ck-{epoch}', monitor='val_loss', save_best_only=True, mode='min')"),
    (lambda: ot.callbacks.CosineDecay(10, warmup_epochs=2), "CosineDecay(total_epochs=10, warmup_epochs=2)"),
    (lambda: ot.callbacks.LambdaCallback(on_epoch_end=print), "LambdaCallback(on_epoch_end=print)"),
    (lambda: ot.callbacks.TerminateOnNaN(), "TerminateOnNaN()"),
])
def test_callback_reprs(make, shown):
    assert repr(make()) == shown


def test_a_user_callback_repr_never_raises():
    class Odd(ot.callbacks.Callback):
        def __init__(self, a, b=2):
            self.a = a

    assert repr(Odd(1)) == "Odd(a=1)"
    assert repr(Odd.__new__(Odd)) == "Odd()"


def test_cli_pattern_options_before_the_model(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ot.Sequential([ot.layers.Dense(3), ot.layers.Dense(2)], input_shape=(4,), seed=0).export_onnx("model.onnx")
    assert main(["artifacts", "-o", "a", "--loss", "mse", "--frozen", "dense_0.*", "model.onnx"]) == 0
    assert "frozen: dense_0.kernel, dense_0.bias" in capsys.readouterr().out
    assert main(["artifacts", "-o", "b", "--loss", "mse", "--trainable", "dense_1.kernel", "--trainable",
                 "dense_1.bias", "model.onnx"]) == 0
    assert "trainable: dense_1.kernel, dense_1.bias" in capsys.readouterr().out


def test_cli_options_have_help():
    from ortrain.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.choices and "train" in a.choices).choices
    missing = [f"{cmd} {a.option_strings[-1]}" for cmd in ("artifacts", "train", "eval", "predict")
               for a in sub[cmd]._actions if a.option_strings and a.help is None]
    assert not missing, missing
    for cmd, option in (("train", "--epochs"), ("train", "--batch-size"), ("train", "--lr"), ("eval", "--batch-size"),
                        ("predict", "--batch-size")):
        action = next(a for a in sub[cmd]._actions if option in a.option_strings)
        assert "default" in action.help, (cmd, option)


def test_half_built_models_and_layers_have_a_repr():
    # a model or layer whose __init__ failed half-way (as a debugger or a traceback shows it) raised
    for cls in (ot.Sequential, ot.Model, ot.GraphModel, ot.layers.Dense, ot.layers.BatchNorm, ot.layers.Conv2D):
        assert cls.__name__ in repr(cls.__new__(cls))
