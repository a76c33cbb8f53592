"""Callbacks: hooks and epoch numbers, schedules, early stopping, plateaus, CSV, checkpoints,
NaN termination and the progress display."""

from __future__ import annotations

import copy
import csv
import io
import math
import re
import sys

import numpy as np
import pytest
from test_fit import batches, mlp, mse_grads, sgd

import ortrain as ot
from ortrain.callbacks.base import CallbackList


def sgd_model(lr=0.1, seed=0):
    model = mlp(seed=seed)
    model.compile(optimizer=ot.optim.SGD(lr=lr), loss="mse")
    return model


class Recorder(ot.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.events = [("train_begin",)]
        self.lrs = []
        self.weights = {}

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch))
        self.lrs.append(self.trainer.lr)

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, sorted(logs)))
        self.weights[epoch] = self.loop.get_weights()

    def on_batch_begin(self, step, logs=None):
        self.events.append(("batch_begin", step))

    def on_batch_end(self, step, logs=None):
        self.events.append(("batch_end", step, logs["size"]))


class Inject(ot.callbacks.Callback):
    """Logs a made-up value per epoch, so monitors can be driven exactly."""

    def __init__(self, name, values):
        self.name, self.values = name, values

    def on_epoch_end(self, epoch, logs=None):
        logs[self.name] = self.values[epoch]


def test_hooks_fire_with_epoch_numbers_under_initial_epoch():
    rec = Recorder()
    model = sgd_model()
    hist = ot.fit_generator(model, batches(2, 4), epochs=5, initial_epoch=2, callbacks=[rec], verbose=0)

    def per_epoch(e):
        return [("epoch_begin", e), ("batch_begin", 0), ("batch_end", 0, 4), ("batch_begin", 1), ("batch_end", 1, 4),
                ("epoch_end", e, ["loss", "lr"])]
    assert rec.events == [("train_begin",), *per_epoch(2), *per_epoch(3), *per_epoch(4), ("train_end",)]
    assert hist.epoch == [2, 3, 4]
    assert rec.params["initial_epoch"] == 2 and rec.params["epochs"] == 5


def test_callback_reused_across_fits_resets_its_state():
    rec = Recorder()
    model = sgd_model()
    ot.fit_generator(model, batches(1, 4), epochs=2, callbacks=[rec], verbose=0)
    ot.fit_generator(model, batches(1, 4), epochs=1, callbacks=[rec], verbose=0)
    assert rec.events[0] == ("train_begin",) and len(rec.weights) == 1


def test_callback_model_holds_the_current_weights():
    seen = []

    class Peek(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(self.model.get_weights()[0].copy())

    model = sgd_model()
    data = batches(2, 4)
    ot.fit_generator(model, data, epochs=2, callbacks=[Peek()], verbose=0)
    ws = mlp().get_weights()
    for x, y in data:
        ws = sgd(ws, mse_grads(ws, x, y)[1], 0.1)
    np.testing.assert_allclose(seen[0], ws[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(seen[1], model.get_weights()[0])


def test_batch_hooks_reach_only_callbacks_that_define_them():
    class EpochOnly(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    assert not CallbackList([EpochOnly(), ot.History()]).has_batch_hooks
    assert CallbackList([ot.callbacks.TerminateOnNaN()]).has_batch_hooks
    with pytest.raises(ot.OrtrainError, match="callbacks: expected ot.callbacks.Callback objects, received dict"):
        CallbackList([{}])



def test_keras_3_batch_hook_names_are_called_and_uncalled_hooks_are_named(recwarn):
    class Keras3(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.seen = []

        def on_train_batch_begin(self, batch, logs=None):
            self.seen.append(("begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(("end", batch, logs["size"]))

        def on_test_batch_end(self, batch, logs=None):  # Keras calls it in validation; ortrain does not
            raise AssertionError("not called")

    model = sgd_model()
    cb = Keras3()
    with pytest.warns(UserWarning, match="callback Keras3 defines on_test_batch_end, which ortrain does not call"):
        history = ot.fit_generator(model, batches(2, 4), epochs=1, callbacks=[cb], verbose=0)
    assert cb.seen == [("begin", 0), ("end", 0, 4), ("begin", 1), ("end", 1, 4)]
    assert model.history is history  # as Keras sets model.history
    with pytest.raises(ot.OrtrainError, match="ModelCheckpoint: directory"):  # a refused fit keeps it
        ot.fit_generator(model, batches(2, 4), callbacks=[ot.callbacks.ModelCheckpoint("/nonexistent/dir/x")],
                         verbose=0)
    assert model.history is history
    recwarn.clear()
    ot.fit_generator(model, batches(2, 4), epochs=1, callbacks=[cb], verbose=0)  # told once
    assert not [w for w in recwarn if "does not call" in str(w.message)]


def test_model_history_is_the_last_fit_that_ended_an_epoch():
    # A fit refused once callbacks had started (a scheduler's bad rate), or stopped by an error or an
    # interrupt in its first epoch, replaced model.history with an empty History; Keras 3 sets it at
    # each epoch's end, so the last fit's stays until an epoch of the new one ends
    x, y = np.ones((16, 3), np.float32), np.zeros((16, 2), np.float32)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    first = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert model.history is first and len(first) == 2
    with pytest.raises(ot.OrtrainError, match="the learning rate is left unchanged"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[ot.callbacks.LearningRateScheduler(lambda e, lr: -1.0)])
    assert model.history is first

    class Stop(ot.callbacks.Callback):
        def __init__(self, epoch, error):
            self.at, self.error = epoch, error

        def on_epoch_begin(self, epoch, logs=None):
            self.seen = model.history
            if epoch == self.at:
                raise self.error

    for error in (RuntimeError("a callback failed"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[Stop(0, error)])
        assert model.history is first
    stop = Stop(2, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[stop])
    assert model.history is stop.seen and model.history is not first and len(model.history) == 2

def test_stop_flag_is_honoured_at_the_end_of_the_step():
    class StopAt(ot.callbacks.Callback):
        def on_batch_end(self, step, logs=None):
            if step == 2:
                self.loop.stop_training = True

    calls = {"n": 0}
    data = batches(5, 4)

    def gen():
        calls["n"] += 1
        return data[(calls["n"] - 1) % 5]

    model = sgd_model()
    hist = ot.fit_generator(model, gen, steps_per_epoch=5, epochs=3, callbacks=[StopAt()], verbose=0)
    assert calls["n"] == 3 and model.train_state.n_steps == 3
    assert hist.epoch == [0]  # the interrupted epoch is logged, as in Keras
    ws = mlp().get_weights()
    losses = []
    for x, y in data[:3]:
        loss, g = mse_grads(ws, x, y)
        losses.append(loss)
        ws = sgd(ws, g, 0.1)
    assert hist.history["loss"][0] == pytest.approx(np.mean(losses), rel=1e-5)


# -- learning-rate schedules -----------------------------------------------------------------------


def test_learning_rate_scheduler_sets_each_epoch_rate():
    data = batches(2, 4)
    model = sgd_model(lr=0.1)
    sched = ot.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (epoch + 1))
    hist = ot.fit_generator(model, data, epochs=3, initial_epoch=1, callbacks=[sched], verbose=0)
    assert hist.history["lr"] == pytest.approx([0.05, 0.1 / 3])
    ws = mlp().get_weights()
    for lr in (0.05, 0.1 / 3):
        for x, y in data:
            ws = sgd(ws, mse_grads(ws, x, y)[1], lr)
    for got, want in zip(model.get_weights(), ws):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert model.train_state.lr == pytest.approx(0.1 / 3)


def test_one_argument_schedule_and_bad_values():
    model = sgd_model()
    hist = ot.fit_generator(model, batches(1, 4), epochs=2,
                            callbacks=[ot.callbacks.LearningRateScheduler(lambda e: 0.01 * (e + 1))], verbose=0)
    assert hist.history["lr"] == pytest.approx([0.01, 0.02])
    before = model.get_weights()
    bad = ot.callbacks.LearningRateScheduler(lambda e, lr: float("nan") if e == 1 else lr)
    with pytest.raises(ot.OrtrainError, match=r"LearningRateScheduler: the schedule's value for epoch 1: expected a "
                                              r"finite number >= 0, received nan"):
        ot.fit_generator(model, batches(1, 4), epochs=3, initial_epoch=1, callbacks=[bad], verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ot.OrtrainError, match=r"LearningRateScheduler\(schedule=...\): expected a function"):
        ot.callbacks.LearningRateScheduler(0.1)


def test_step_decay_follows_the_formula_and_resumes_on_the_same_curve():
    model = sgd_model(lr=0.2)
    decay = ot.callbacks.StepDecay(drop=0.5, every=2)
    h1 = ot.fit_generator(model, batches(1, 4), epochs=3, callbacks=[decay], verbose=0)
    h2 = ot.fit_generator(model, batches(1, 4), epochs=6, initial_epoch=3, callbacks=[decay], verbose=0)
    want = [0.2 * 0.5 ** (e // 2) for e in range(6)]
    assert h1.history["lr"] + h2.history["lr"] == pytest.approx(want)
    with pytest.raises(ot.OrtrainError, match=r"drop: expected a number in \(0, 1\]"):
        ot.callbacks.StepDecay(drop=2.0)


def test_a_state_loaded_into_another_model_continues_the_schedule_from_its_base_rate(tmp_path):
    # the curve's base is the compiled or last written rate (0.4 here); a model that takes the state
    # through opt.load_state goes on along the same curve, as one saved and loaded does
    def first_half():
        model = sgd_model(lr=0.1)
        model.optimizer.lr = 0.4
        model.fit(*batches(1, 8)[0], batch_size=8, epochs=2, verbose=0,
                  callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
        return model

    whole = first_half()
    h_whole = whole.fit(*batches(1, 8)[0], batch_size=8, epochs=4, initial_epoch=2, verbose=0,
                        callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
    resumed = sgd_model(lr=0.1)
    source = first_half()
    resumed.set_weights(source.get_weights())
    resumed.optimizer.load_state(source.optimizer.state())
    assert resumed.optimizer.lr == pytest.approx(0.2)  # the state's rate, until a fit's schedule sets its own
    h = resumed.fit(*batches(1, 8)[0], batch_size=8, epochs=4, initial_epoch=2, verbose=0,
                    callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
    assert h.history["lr"] == pytest.approx([0.1, 0.05]) == h_whole.history["lr"]
    for a, b in zip(resumed.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(a, b)
    # the state of an optimizer kept apart from its model (copied, or after the model is gone) carries it
    # too, and so does one loaded into an optimizer before it is compiled
    source = first_half()
    source.save(tmp_path / "m.ortrain")
    states = [copy.deepcopy(source.optimizer).state(), ot.load_model(tmp_path / "m.ortrain").optimizer.state()]
    for state in states:
        for compile_after in (False, True):
            other = sgd_model(lr=0.1) if not compile_after else mlp()
            other.set_weights(source.get_weights())
            if compile_after:
                opt = ot.optim.SGD(lr=0.1)
                opt.load_state(state)
                assert opt.lr == state["lr"]  # shown, and the base kept for the schedule
                other.compile(optimizer=opt, loss="mse")
            else:
                other.optimizer.load_state(state)
            h = other.fit(*batches(1, 8)[0], batch_size=8, epochs=4, initial_epoch=2, verbose=0,
                          callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
            assert h.history["lr"] == pytest.approx([0.1, 0.05])
            for a, b in zip(other.get_weights(), whole.get_weights()):
                np.testing.assert_array_equal(a, b)
    before = resumed.optimizer.state()
    with pytest.raises(ot.OrtrainError, match="load_state: 'base_lr'"):
        resumed.optimizer.load_state({**source.optimizer.state(), "base_lr": -1.0})
    after = resumed.optimizer.state()
    assert (after["step"], after["lr"], after["base_lr"]) == (before["step"], before["lr"], before["base_lr"])


def test_cosine_decay_with_and_without_warmup():
    model = sgd_model(lr=0.1)
    hist = ot.fit_generator(model, batches(1, 4), epochs=6,
                            callbacks=[ot.callbacks.CosineDecay(total_epochs=4, final_lr=0.01)], verbose=0)
    want = [0.01 + 0.09 * (1 + math.cos(math.pi * min(e, 4) / 4)) / 2 for e in range(6)]
    assert hist.history["lr"] == pytest.approx(want)
    model = sgd_model(lr=0.1)
    hist = ot.fit_generator(model, batches(1, 4), epochs=4, verbose=0,
                            callbacks=[ot.callbacks.CosineDecay(total_epochs=4, warmup_epochs=2, initial_lr=0.2)])
    # warm-up reaches the initial rate in its last epoch; the decay then starts from it
    assert hist.history["lr"] == pytest.approx([0.1, 0.2, 0.2, 0.1], abs=1e-12)
    # the messages name the callback's own arguments (they named the schedule's total_steps/warmup_steps)
    with pytest.raises(ot.OrtrainError, match=r"CosineDecay: warmup_epochs \(4\) must be below total_epochs \(4\), "
                                              "which counts the warm-up too; shorten"):
        ot.callbacks.CosineDecay(total_epochs=4, warmup_epochs=4)
    with pytest.raises(ot.OrtrainError, match=r"CosineDecay\(total_epochs=...\): expected a positive int, received 0"):
        ot.callbacks.CosineDecay(total_epochs=0)
    for bad in (-1, 1.5, True):
        with pytest.raises(ot.OrtrainError, match=rf"CosineDecay\(warmup_epochs=...\): expected an int >= 0, "
                                                  rf"received {bad!r}"):
            ot.callbacks.CosineDecay(total_epochs=4, warmup_epochs=bad)


def keras_plateau(values, lr, factor, patience, cooldown, min_delta, min_lr):
    """ReduceLROnPlateau's rule (mode min) written out, for comparison."""
    best, wait, cool, lrs = math.inf, 0, 0, []
    for v in values:
        lrs.append(lr)
        if cool > 0:
            cool -= 1
            wait = 0
        if v < best - min_delta:
            best, wait = v, 0
        elif cool == 0:
            wait += 1
            if wait >= patience and lr > min_lr:
                lr, cool, wait = max(lr * factor, min_lr), cooldown, 0
    return lrs


def test_reduce_lr_on_plateau_matches_the_rule():
    values = [5, 4, 4, 4, 4, 3.99995, 4, 4, 4, 4, 2, 2, 2]
    model = sgd_model(lr=0.1)
    cb = ot.callbacks.ReduceLROnPlateau(monitor="score", mode="min", factor=0.5, patience=2, cooldown=1, min_lr=0.02)
    hist = ot.fit_generator(model, batches(1, 4), epochs=len(values), callbacks=[Inject("score", values), cb],
                            verbose=0)
    want = keras_plateau(values, 0.1, 0.5, 2, 1, 1e-4, 0.02)
    assert hist.history["lr"] == pytest.approx(want)
    assert min(want) == 0.02 and len(set(want)) > 2
    with pytest.raises(ot.OrtrainError, match=r"ReduceLROnPlateau\(factor=...\): expected a number in \(0, 1\)"):
        ot.callbacks.ReduceLROnPlateau(factor=1.0)


def test_reduce_lr_on_plateau_keeps_a_negative_min_delta_as_keras_does():
    # Keras' ReduceLROnPlateau compares with best - min_delta as given: at -0.5 a value up to 0.5
    # worse than the best still counts as an improvement (the size was taken: an improvement of 0.5)
    values = [4, 4.3, 4.6, 4.9, 5.2, 5.5, 6.5, 7.5, 8.5]
    model = sgd_model(lr=0.1)
    cb = ot.callbacks.ReduceLROnPlateau(monitor="score", mode="min", factor=0.5, patience=2, min_delta=-0.5)
    hist = ot.fit_generator(model, batches(1, 4), epochs=len(values), callbacks=[Inject("score", values), cb],
                            verbose=0)
    want = keras_plateau(values, 0.1, 0.5, 2, 0, -0.5, 0.0)
    assert hist.history["lr"] == pytest.approx(want)
    assert want[:7] == [0.1] * 7 and want[-1] == 0.05


# -- early stopping --------------------------------------------------------------------------------


def test_early_stopping_restores_the_best_weights():
    rec = Recorder()
    stop = ot.callbacks.EarlyStopping(monitor="score", mode="min", patience=2, restore_best_weights=True)
    model = sgd_model()
    hist = ot.fit_generator(model, batches(2, 4), epochs=10, verbose=0,
                            callbacks=[Inject("score", [3, 1, 2, 1.5, 0.1, 0.1]), stop, rec])
    assert hist.epoch == [0, 1, 2, 3]
    assert stop.stopped_epoch == 3 and stop.best_epoch == 1 and stop.best == 1
    for got, want in zip(model.get_weights(), rec.weights[1]):
        np.testing.assert_array_equal(got, want)
    assert model.train_state.n_steps == 8  # the optimizer state is the last step's, as in Keras


def test_early_stopping_without_restore_keeps_the_last_weights_and_reads_val_loss():
    rec = Recorder()
    model = sgd_model(lr=0.0)
    xv, yv = batches(1, 6, seed=3)[0]
    stop = ot.callbacks.EarlyStopping(patience=1)  # val_loss is constant at lr 0
    hist = ot.fit_generator(model, batches(1, 4), epochs=10, validation_generator=(xv, yv),
                            callbacks=[stop, rec], verbose=0)
    assert hist.epoch == [0, 1]
    np.testing.assert_array_equal(model.get_weights()[0], rec.weights[1][0])


@pytest.mark.parametrize("bad", ["0.5", [1.0], np.array([1.0, 2.0]), float("nan"), True])
def test_early_stopping_refuses_a_baseline_that_is_no_number(bad):
    # a string or a list was taken and failed after the first epoch had trained ("unsupported
    # operand type(s) for -"); NaN, which no value beats, was taken silently
    with pytest.raises(ot.OrtrainError, match=r"EarlyStopping\(baseline=...\): expected a number \(the value to "
                                              r"beat\) or None, received"):
        ot.callbacks.EarlyStopping(monitor="loss", baseline=bad)
    assert ot.callbacks.EarlyStopping(baseline=np.float32(0.5)).baseline == 0.5


def test_early_stopping_baseline_and_warmup():
    values = [0.5, 0.6, 0.6, 0.6, 0.6]
    model = sgd_model()
    for baseline, epochs in ((0.9, [0, 1]), (None, [0, 1, 2, 3])):  # 0.9: two epochs short of the baseline
        stop = ot.callbacks.EarlyStopping(monitor="acc", patience=2, baseline=baseline)
        hist = ot.fit_generator(model, batches(1, 4), epochs=10, verbose=0, callbacks=[Inject("acc", values), stop])
        assert stop.monitor.mode == "max" and hist.epoch == epochs
    stop = ot.callbacks.EarlyStopping(monitor="score", mode="min", patience=0, start_from_epoch=3)
    hist = ot.fit_generator(model, batches(1, 4), epochs=10, verbose=0,
                            callbacks=[Inject("score", [1, 2, 3, 4, 5, 6]), stop])
    assert hist.epoch == [0, 1, 2, 3, 4]


def keras_stop_epoch(values, patience, baseline, mode="min"):
    """Where Keras' EarlyStopping stops (None: never), written out from its documented rule: ``wait``
    grows every epoch and starts over only when the value beats both the best so far and the
    baseline; training stops once ``wait`` reaches ``patience``, never in epoch 0."""
    better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
    best, wait = (math.inf if mode == "min" else -math.inf), 0
    for epoch, v in enumerate(values):
        wait += 1
        if better(v, best):
            best = v
            if baseline is None or better(v, baseline):
                wait = 0
                continue
        if wait >= patience and epoch > 0:
            return epoch
    return None


@pytest.mark.parametrize("values, patience, baseline, mode", [
    ([0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35], 2, 0.1, "min"),   # improves every epoch, never beats 0.1
    ([0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35], 0, 0.1, "min"),
    ([0.9, 0.8, 0.05, 0.06, 0.07, 0.08, 0.04, 0.09], 2, 0.1, "min"),  # beats it at epoch 2, then stalls
    ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75], 3, 0.9, "max"),
    ([0.1, 0.2, 0.95, 0.96, 0.97, 0.98, 0.99, 0.999], 3, 0.9, "max"),  # beats both from epoch 2 on: never stops
    ([0.9, 0.8, 0.7, 0.75, 0.6, 0.65, 0.7, 0.8], 1, None, "min"),
])
def test_early_stopping_baseline_follows_the_keras_rule(values, patience, baseline, mode):
    stop = ot.callbacks.EarlyStopping(monitor="score", patience=patience, baseline=baseline, mode=mode)
    hist = ot.fit_generator(sgd_model(), batches(1, 4), epochs=len(values), verbose=0,
                            callbacks=[Inject("score", values), stop])
    want = keras_stop_epoch(values, patience, baseline, mode)
    assert stop.stopped_epoch == (0 if want is None else want)  # Keras' 0 when it did not stop (it was None)
    assert hist.epoch == list(range(len(values) if want is None else want + 1))


def test_monitor_errors_and_missing_values():
    with pytest.raises(ot.OrtrainError, match=r"EarlyStopping\(mode=...\): expected 'auto', 'min' or 'max', "
                                              r"received 'down'"):
        ot.callbacks.EarlyStopping(mode="down")
    with pytest.raises(ot.OrtrainError, match=r"EarlyStopping\(patience=...\): expected an int >= 0, received -1"):
        ot.callbacks.EarlyStopping(patience=-1)
    with pytest.raises(ot.OrtrainError, match=r"ModelCheckpoint\(monitor=...\): expected the name"):
        ot.callbacks.ModelCheckpoint("x", monitor="")
    model = sgd_model()
    with pytest.warns(UserWarning, match=r"EarlyStopping monitors 'val_loss', which is not logged; logged values "
                                         r"are loss, lr"):
        ot.fit_generator(model, batches(1, 4), callbacks=[ot.callbacks.EarlyStopping()], verbose=0)


# -- files: CSV and checkpoints ---------------------------------------------------------------------


def failing_generator(data, fail_at):
    calls = {"n": 0}

    def gen():
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError("disk went away")
        return data[(calls["n"] - 1) % len(data)]
    return gen


def test_csv_and_checkpoint_files_are_complete_after_an_exception(tmp_path):
    data = batches(3, 4)
    rec = Recorder()
    log = ot.callbacks.CSVLogger(tmp_path / "log.csv")
    ckpt = ot.callbacks.ModelCheckpoint(tmp_path / "ckpt-{epoch}", save_model=False)
    model = sgd_model()
    with pytest.raises(OSError, match="disk went away"):
        ot.fit_generator(model, failing_generator(data, 8), steps_per_epoch=3, epochs=5,
                         callbacks=[rec, log, ckpt], verbose=0)
    rows = list(csv.reader(open(tmp_path / "log.csv")))
    assert rows[0] == ["epoch", "loss", "lr"] and [r[0] for r in rows[1:]] == ["0", "1"]
    assert log._file is None  # closed by on_train_end
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-1", "ckpt-2"]
    assert not list(tmp_path.glob("*.tmp-*"))
    fresh = sgd_model()
    with ot.Trainer.from_checkpoint(fresh, tmp_path / "ckpt-2", batch_size=4) as tr:
        assert tr.n_steps == 6
        for got, want in zip(tr.model().get_weights(), rec.weights[1]):
            np.testing.assert_array_equal(got, want)


def test_model_checkpoint_resume_is_bit_exact(tmp_path):
    data = batches(2, 4)
    whole = mlp(seed=1)
    whole.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    ot.fit_generator(whole, data, epochs=3, verbose=0)
    part = mlp(seed=1)
    part.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    ckpt = ot.callbacks.ModelCheckpoint(tmp_path / "last", save_model=False)
    ot.fit_generator(part, data, epochs=2, callbacks=[ckpt], verbose=0)
    resumed = mlp(seed=1)
    resumed.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    with ot.Trainer.from_checkpoint(resumed, tmp_path / "last", batch_size=4) as tr:
        for x, y in data:
            tr.step(x, y)
        for got, want in zip(tr.model().get_weights(), whole.get_weights()):
            np.testing.assert_array_equal(got, want)


def test_model_checkpoint_of_a_weighted_cross_entropy_fit_resumes_with_loss_mask_1(tmp_path):
    rng = np.random.default_rng(4)
    data = [(rng.standard_normal((4, 4)).astype(np.float32), rng.integers(0, 3, 4), rng.random(4).astype(np.float32))
            for _ in range(2)]

    def model():
        m = mlp(seed=2)
        m.compile(optimizer=ot.optim.Adam(lr=1e-2), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m
    whole = model()
    ot.fit_generator(whole, data, epochs=3, verbose=0)
    part = model()
    ot.fit_generator(part, data, epochs=2, callbacks=[ot.callbacks.ModelCheckpoint(tmp_path / "last", save_model=False)],
                     verbose=0)
    with ot.Trainer.from_checkpoint(model(), tmp_path / "last", batch_size=4, loss_mask=1) as tr:
        for x, y, w in data:
            tr.step(x, y, w)
        for got, want in zip(tr.model().get_weights(), whole.get_weights()):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ot.OrtrainError, match="loss_mask=1 weights a mean squared error"):
        ot.Trainer(model(), batch_size=4, loss_mask=1)   # a new trainer still refuses it


def test_model_checkpoint_best_only_with_formatted_names(tmp_path):
    model = sgd_model()
    ckpt = ot.callbacks.ModelCheckpoint(tmp_path / "best-{epoch:02d}-{score:.1f}", monitor="score", mode="min",
                                        save_best_only=True)
    ot.fit_generator(model, batches(1, 4), epochs=5, verbose=0,
                     callbacks=[Inject("score", [3.0, 2.0, 2.5, 1.0, 1.0]), ckpt])
    assert [p.rsplit("/", 1)[-1] for p in ckpt.saved] == ["best-01-3.0", "best-02-2.0", "best-04-1.0"]
    # a name nothing logs is refused before anything trains (it was refused at the first epoch's end,
    # after that epoch had trained), unless a callback of the caller's ahead of it may log it
    bad = ot.callbacks.ModelCheckpoint(tmp_path / "x-{nothing}")
    before, step = model.get_weights(), model.optimizer.step
    for others in ([], [ot.callbacks.EarlyStopping(monitor="loss")]):
        with pytest.raises(ot.OrtrainError, match=r"^ModelCheckpoint: filepath '.*x-\{nothing\}' names 'nothing', "
                                                  r"which this fit does not log; the values logged are epoch, loss, "
                                                  r"lr; name one of those"):
            ot.fit_generator(model, batches(1, 4), callbacks=[*others, bad], verbose=0)
        assert model.optimizer.step == step
        assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    with pytest.raises(ot.OrtrainError, match=r"filepath .* names a value that is not logged .*logged values are "
                                              r"loss, lr"):  # it may: looked up at the epoch's end
        ot.fit_generator(model, batches(1, 4), callbacks=[Inject("score", [1.0]), bad], verbose=0)
    assert model.optimizer.step == step + 1



def test_model_checkpoint_keeps_its_best_across_fits_and_takes_a_threshold(tmp_path):
    """As Keras' ModelCheckpoint: a continued fit with the same callback saves only when it beats
    the best of the fits before (it saved its worse first epoch over the best file), and
    initial_value_threshold is the value the first save must beat."""
    model = sgd_model()
    ckpt = ot.callbacks.ModelCheckpoint(tmp_path / "best-{epoch}", monitor="score", mode="min", save_best_only=True)
    ot.fit_generator(model, batches(1, 4), epochs=2, verbose=0, callbacks=[Inject("score", [3.0, 2.0]), ckpt])
    ot.fit_generator(model, batches(1, 4), epochs=5, initial_epoch=2, verbose=0,
                     callbacks=[Inject("score", [None, None, 9.0, 2.0, 1.5]), ckpt])
    assert [p.rsplit("/", 1)[-1] for p in ckpt.saved] == ["best-5"]
    assert ckpt.monitor.best == 1.5
    high = ot.callbacks.ModelCheckpoint(tmp_path / "acc-{epoch}", monitor="score", mode="max", save_best_only=True,
                                        initial_value_threshold=0.8)
    ot.fit_generator(model, batches(1, 4), epochs=3, verbose=0, callbacks=[Inject("score", [0.5, 0.9, 0.7]), high])
    assert [p.rsplit("/", 1)[-1] for p in high.saved] == ["acc-2"]
    for bad in ("0.8", float("nan"), True):
        with pytest.raises(ot.OrtrainError, match=r"initial_value_threshold=...\): expected a number"):
            ot.callbacks.ModelCheckpoint(tmp_path / "x", initial_value_threshold=bad)

def test_file_callbacks_refuse_missing_directories(tmp_path):
    model = sgd_model()
    before = model.get_weights()
    for cb, name in ((ot.callbacks.CSVLogger(tmp_path / "no" / "log.csv"), "CSVLogger"),
                     (ot.callbacks.ModelCheckpoint(tmp_path / "no" / "ckpt"), "ModelCheckpoint")):
        with pytest.raises(ot.OrtrainError, match=f"{name}: directory .* does not exist"):
            ot.fit_generator(model, batches(1, 4), callbacks=[cb], verbose=0)
    np.testing.assert_array_equal(before[0], model.get_weights()[0])
    with pytest.raises(ot.OrtrainError, match=r"CSVLogger\(separator=...\): expected one character"):
        ot.callbacks.CSVLogger(tmp_path / "a.csv", separator=";;")


def test_csv_logger_appends_and_uses_the_separator(tmp_path):
    path = tmp_path / "log.tsv"
    model = sgd_model()
    ot.fit_generator(model, batches(1, 4), epochs=2, callbacks=[ot.callbacks.CSVLogger(path, separator="\t")],
                     verbose=0)
    hist = ot.fit_generator(model, batches(1, 4), epochs=4, initial_epoch=2, verbose=0,
                            callbacks=[ot.callbacks.CSVLogger(path, separator="\t", append=True)])
    rows = list(csv.reader(open(path), delimiter="\t"))
    assert rows[0] == ["epoch", "loss", "lr"]
    assert [r[0] for r in rows[1:]] == ["0", "1", "2", "3"]
    assert float(rows[3][1]) == hist.history["loss"][0]


def test_csv_logger_appends_on_a_line_of_its_own_to_a_file_without_a_last_line_break(tmp_path):
    # the first row appended ran on into the file's last one: 'lr' read 0.51 and the new row was lost
    path = tmp_path / "log.csv"
    path.write_text("epoch,loss,lr\n0,1.0,0.5")
    model = sgd_model()
    hist = model.fit(*batches(1, 8)[0], batch_size=8, epochs=3, initial_epoch=1, verbose=0,
                     callbacks=[ot.callbacks.CSVLogger(path, append=True)])
    rows = list(csv.reader(open(path, newline="")))
    assert rows[:2] == [["epoch", "loss", "lr"], ["0", "1.0", "0.5"]]
    assert [(r[0], float(r[1])) for r in rows[2:]] == [(str(e), v) for e, v in zip((1, 2), hist.history["loss"])]
    path.write_text("epoch,loss,lr")  # a header alone, without its line break
    model.fit(*batches(1, 8)[0], batch_size=8, epochs=1, verbose=0,
              callbacks=[ot.callbacks.CSVLogger(path, append=True)])
    assert [r[0] for r in csv.reader(open(path, newline=""))] == ["epoch", "0"]


@pytest.mark.parametrize("separator", ["\n", "\r", '"'])
def test_csv_logger_refuses_a_separator_no_reader_can_split_on(separator):
    with pytest.raises(ot.OrtrainError, match=r"CSVLogger\(separator=...\): expected one character other than a "
                                              r"line break or the quote"):
        ot.callbacks.CSVLogger("log.csv", separator=separator)


def test_csv_logger_refuses_to_append_to_a_file_of_another_layout(tmp_path):
    # a file written with another separator (or not by CSVLogger) got a second header and rows of
    # another layout in its middle, without a word
    model = sgd_model()
    before = model.get_weights()
    for text in ("epoch;loss;lr\n0;1.0;0.1\n", "step,loss\n0,1.0\n"):
        path = tmp_path / "log.csv"
        path.write_text(text)
        with pytest.raises(ot.OrtrainError, match=r"CSVLogger\(append=True\): the first line of .* is not a header"
                                                  r".*received '" + re.escape(text.splitlines()[0])):
            ot.fit_generator(model, batches(1, 4), callbacks=[ot.callbacks.CSVLogger(path, append=True)], verbose=0)
        assert path.read_text() == text
        np.testing.assert_array_equal(before[0], model.get_weights()[0])
    assert model.optimizer.state()["step"] == 0
    path.write_text("epoch;loss;lr\n0;1.0;0.1\n")  # the same file, read with its own separator
    ot.fit_generator(model, batches(1, 4), callbacks=[ot.callbacks.CSVLogger(path, separator=";", append=True)],
                     verbose=0)
    assert [r[0] for r in csv.reader(open(path), delimiter=";")] == ["epoch", "0", "0"]
    path.write_text("\ufeffepoch,loss,lr\n0,1.0,0.1\n", encoding="utf-8")  # saved by a spreadsheet
    ot.fit_generator(model, batches(1, 4), callbacks=[ot.callbacks.CSVLogger(path, append=True)], verbose=0)
    assert [r[0] for r in csv.reader(open(path, encoding="utf-8-sig"))] == ["epoch", "0", "0"]
    for blank in ("\n \n", "\ufeff", "\ufeff\n\n"):       # blank lines (behind a BOM): as an empty file
        path.write_text(blank, encoding="utf-8")
        ot.fit_generator(model, batches(1, 4), callbacks=[ot.callbacks.CSVLogger(path, append=True)], verbose=0)
        assert [r[0] for r in csv.reader(open(path, encoding="utf-8"))] == ["epoch", "0"]


def test_csv_logger_adds_a_column_for_a_value_its_header_lacks(tmp_path):
    # appending a fit that validates to a file of one that did not dropped val_loss from every row,
    # without a word (History had it); a value a callback logs from a later epoch on was dropped too
    path = tmp_path / "log.csv"
    model = sgd_model()
    ot.fit_generator(model, batches(1, 4), epochs=1, callbacks=[ot.callbacks.CSVLogger(path)], verbose=0)
    first = list(csv.reader(open(path)))
    hist = ot.fit_generator(model, batches(1, 4), epochs=3, initial_epoch=1, verbose=0,
                            validation_generator=batches(1, 4),
                            callbacks=[ot.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: logs.update(
                                score=0.25) if e == 2 else None), ot.callbacks.CSVLogger(path, append=True)])
    rows = list(csv.reader(open(path)))
    assert rows[0] == ["epoch", "loss", "lr", "val_loss", "score"]
    assert rows[1] == [*first[1], "NA", "NA"]  # the first fit's row, as it was, NA in the new columns
    assert [float(r[3]) for r in rows[2:]] == hist.history["val_loss"]
    assert [r[4] for r in rows[2:]] == ["NA", "0.25"]
    assert [float(r[1]) for r in rows[2:]] == hist.history["loss"] and len(rows) == 4


# -- NaN termination -------------------------------------------------------------------------------


def test_terminate_on_nan_stops_after_the_bad_step(capsys):
    data = batches(5, 4)
    data[2] = (np.full((4, 4), 1e30, np.float32), data[2][1])   # finite input, a loss that overflows
    cb = ot.callbacks.TerminateOnNaN()
    model = sgd_model()
    hist = ot.fit_generator(model, data, epochs=3, callbacks=[cb], verbose=0)
    assert cb.stopped_at == (0, 2)
    assert model.train_state.n_steps == 3 and hist.epoch == [0] and not math.isfinite(hist.history["loss"][0])
    # counted from 1, as the epoch is (it said "step 2" of the third step)
    assert "Epoch 1, step 3: the loss is inf; terminating training" in capsys.readouterr().out
    # NaN in the data itself never reaches a step: it is refused before it can touch the weights
    data[2] = (np.full((4, 4), np.nan, np.float32), data[2][1])
    model = sgd_model()
    with pytest.raises(ot.NonFiniteError, match="epoch 0, step 2 \\(counted from 0\\): x: holds nan in row 0"):
        ot.fit_generator(model, data, epochs=3, callbacks=[ot.callbacks.TerminateOnNaN()], verbose=0)
    assert model.train_state.n_steps == 2


# -- progress display ------------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_verbose_zero_prints_nothing_and_two_prints_a_line_per_epoch(capsys):
    model = sgd_model()
    ot.fit_generator(model, batches(2, 4), epochs=2, verbose=0)
    assert capsys.readouterr().out == ""
    xv, yv = batches(1, 4, seed=5)[0]
    ot.fit_generator(model, batches(2, 4), epochs=2, verbose=2, validation_generator=(xv, yv))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("Epoch 1/2 - 2 steps - ") and "samples/s - loss: " in lines[0]
    assert " - val_loss: " in lines[1] and lines[1].endswith("lr: 0.1000")


def test_verbose_one_off_a_terminal_prints_lines(capsys):
    model = sgd_model()
    ot.fit_generator(model, batches(2, 4), epochs=3, verbose=1)
    out = capsys.readouterr().out
    assert "\r" not in out and len(out.splitlines()) == 3


def test_live_bar_without_tqdm(monkeypatch):
    from ortrain.callbacks import progress as progress_mod
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(progress_mod, "REFRESH_S", 0.0)
    term = FakeTerminal()
    bar = progress_mod.progress(1, file=term)
    assert isinstance(bar, progress_mod.ProgressBar)
    model = sgd_model()
    ot.fit_generator(model, batches(3, 4), epochs=2, callbacks=[bar], verbose=0)
    out = term.getvalue()
    assert "\rEpoch 1/2 [" in out and "] 3/3 - loss: " in out and " samples/s" in out
    finals = [part for part in out.split("\r") if part.endswith("\n")]
    assert len(finals) == 2 and finals[1].startswith("Epoch 2/2 - 3 steps - ")


def test_live_bar_with_tqdm(monkeypatch):
    pytest.importorskip("tqdm")
    from ortrain.callbacks import progress as progress_mod
    monkeypatch.setattr(progress_mod, "REFRESH_S", 0.0)
    term = FakeTerminal()
    model = sgd_model()
    ot.fit_generator(model, batches(3, 4), epochs=2, callbacks=[progress_mod.progress(1, file=term)], verbose=0)
    out = term.getvalue()
    assert "Epoch 1/2" in out and "loss: " in out
    assert len(re.findall(r"Epoch [12]/2 - 3 steps - ", out)) == 2


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: a carriage return goes back to the line's start."""
    lines, line, col = [], [], 0
    for ch in text:
        if ch == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            line[col:col + 1] = [ch]
            col += 1
    return lines + (["".join(line).rstrip()] if line else [])


class ScreenStream:
    """One of the two streams (standard output, standard error) of a terminal showing both."""

    def __init__(self, shown: list):
        self.shown = shown

    def write(self, text):
        self.shown.append(text)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return True


@pytest.mark.parametrize("with_tqdm", [False, True])
@pytest.mark.parametrize("bar_on", ["stdout", "stderr"])
def test_a_callbacks_message_goes_on_a_line_of_its_own_above_a_live_bar(tmp_path, monkeypatch, with_tqdm, bar_on):
    # ModelCheckpoint(verbose=1)'s line ran on from the half-drawn bar: "...samples/sEpoch 1: checkpoint saved",
    # also where the bar is drawn on standard error, which shares the screen
    from ortrain.callbacks import progress as progress_mod
    if with_tqdm:
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(progress_mod, "REFRESH_S", 0.0)
    shown = []
    monkeypatch.setattr(sys, "stdout", ScreenStream(shown))
    model = sgd_model()
    path = tmp_path / "m.ortrain"
    saving = ot.callbacks.ModelCheckpoint(path, verbose=1)
    if bar_on == "stdout":  # verbose's own bar, after the callbacks
        model.fit(*batches(1, 12)[0], batch_size=4, epochs=2, verbose=1, callbacks=[saving])
    else:
        model.fit(*batches(1, 12)[0], batch_size=4, epochs=2, verbose=0,
                  callbacks=[saving, ot.callbacks.ProgressBar(file=ScreenStream(shown))])
    lines = screen("".join(shown))
    assert [line for line in lines if "checkpoint saved" in line] == \
        [f"Epoch {e}: checkpoint saved to {path}" for e in (1, 2)]
    assert len([line for line in lines if re.fullmatch(r"Epoch [12]/2 - 3 steps - .* - loss: .*", line)]) == 2


def test_a_progress_callback_given_stands_for_the_display_verbose_makes(capsys):
    # fit(verbose=2, callbacks=[ProgressLines()]) printed every epoch's line twice; Keras adds its own
    # progress display only where the callbacks hold none. One writing to a log file leaves it.
    model = sgd_model()
    model.fit(*batches(1, 8)[0], batch_size=4, epochs=2, verbose=2, callbacks=[ot.callbacks.ProgressLines()])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/2", "Epoch 2/2"]
    log = io.StringIO()
    model.fit(*batches(1, 8)[0], batch_size=4, epochs=2, verbose=2, callbacks=[ot.callbacks.ProgressLines(log)])
    assert len(capsys.readouterr().out.splitlines()) == len(log.getvalue().splitlines()) == 2


def test_live_bar_is_closed_when_training_fails(monkeypatch):
    from ortrain.callbacks import progress as progress_mod
    monkeypatch.setitem(sys.modules, "tqdm", None)
    term = FakeTerminal()
    model = sgd_model()
    with pytest.raises(OSError):
        ot.fit_generator(model, failing_generator(batches(2, 4), 3), steps_per_epoch=2, epochs=2,
                         callbacks=[progress_mod.progress(1, file=term)], verbose=0)
    assert term.getvalue().endswith("\n")


def test_what_a_callback_changes_on_self_model_reaches_the_training():
    """Keras idioms: model.set_weights, model.optimizer.lr and model.stop_training in a hook."""
    data = batches(1, 4)

    class KerasStyle(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.model.set_weights([np.zeros_like(w) + 0.1 for w in self.model.get_weights()])
                self.model.optimizer.lr = 0.5
            if epoch == 1:
                self.model.stop_training = True

    model = sgd_model()
    hist = ot.fit_generator(model, data, epochs=5, verbose=0, callbacks=[KerasStyle()])
    assert hist.epoch == [0, 1] and hist.history["lr"] == [0.1, 0.5]
    start = [np.zeros_like(w) + 0.1 for w in model.get_weights()]
    _, grads = mse_grads(start, *data[0])
    for got, want in zip(model.get_weights(), sgd(start, grads, 0.5)):   # epoch 1: one step from the set weights
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert model.train_state.lr == 0.5
    hist = ot.fit_generator(model, data, epochs=2, verbose=0)   # the flag does not outlive its fit
    assert hist.epoch == [0, 1]


@pytest.mark.parametrize("hooks", ["none", "epoch", "batch_end"])
def test_a_rate_and_a_stop_a_generator_writes_on_the_model_take_effect_at_the_next_step(hooks):
    # with no batch hook they waited for the epoch's end (a stop never came in a one-epoch fit), and
    # with only on_batch_end the rate came one step late
    data = batches(6, 4)
    model = sgd_model(lr=0.0)
    start = model.get_weights()

    def gen():
        for i, batch in enumerate(data):
            if i == 2:
                model.optimizer.lr = 0.3
            if i == 4:
                model.stop_training = True
            yield batch

    cbs = {"none": [], "epoch": [ot.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: None)],
           "batch_end": [ot.callbacks.LambdaCallback(on_batch_end=lambda b, logs: None)]}[hooks]
    model.fit(gen(), steps_per_epoch=6, epochs=1, verbose=0, callbacks=cbs)
    assert model.optimizer.step == 5  # as Keras: the batch in hand when told to stop trains
    want = start
    for x, y in data[2:5]:
        want = sgd(want, mse_grads(want, x, y)[1], 0.3)
    for got, w in zip(model.get_weights(), want):
        np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-6)


def test_on_train_end_runs_only_for_callbacks_that_began():
    class Fails(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            raise RuntimeError("cannot start")

    model = sgd_model()
    stop = ot.callbacks.EarlyStopping(monitor="loss", restore_best_weights=True)
    ot.fit_generator(model, batches(1, 4), epochs=2, verbose=0, callbacks=[stop])   # stop now holds best weights
    ot.fit_generator(model, batches(1, 4), epochs=2, verbose=0)                      # which are old now
    trained = model.get_weights()
    with pytest.raises(RuntimeError, match="cannot start"):
        ot.fit_generator(model, batches(1, 4), epochs=2, verbose=0, callbacks=[Fails(), stop])
    for a, b in zip(trained, model.get_weights()):   # the stale best weights were not put back
        np.testing.assert_array_equal(a, b)


def test_hooks_get_a_dict_and_schedules_with_a_default_lr_get_it():
    seen = []

    class Logs(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append(logs)

        def on_epoch_begin(self, epoch, logs=None):
            logs["mine"] = epoch   # a Keras callback may write into them
            seen.append(logs)

    sched = ot.callbacks.LearningRateScheduler(lambda epoch, lr=None: 0.02 if lr is None else lr / 2)
    hist = ot.fit_generator(sgd_model(), batches(1, 4), epochs=3, verbose=0, callbacks=[Logs(), sched])
    assert seen == [{}, {"mine": 0}, {"mine": 1}, {"mine": 2}]
    assert hist.history["lr"] == [0.05, 0.025, 0.0125]   # called as schedule(epoch, lr), as Keras does


def test_model_checkpoint_can_save_the_model_as_keras_does(tmp_path):
    data = batches(2, 4)
    model = sgd_model()
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    saver = ot.callbacks.ModelCheckpoint(tmp_path / "m-{epoch}.ortrain", monitor="loss")   # the default
    ot.fit_generator(model, data, epochs=2, verbose=0, callbacks=[saver])
    assert [p.rsplit("/", 1)[-1] for p in saver.saved] == ["m-1.ortrain", "m-2.ortrain"]
    last = ot.load_model(tmp_path / "m-2.ortrain")
    x = data[0][0]
    np.testing.assert_array_equal(last.predict(x), model.predict(x))
    ot.fit_generator(model, data, epochs=1, verbose=0)   # the file carries the Adam moments too:
    ot.fit_generator(last, data, epochs=1, verbose=0)    # both continue the same way
    for a, b in zip(model.get_weights(), last.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ot.OrtrainError, match="save_model=True\\): this fit trains a bare trainer"):
        with ot.Trainer(sgd_model(), batch_size=4) as tr:
            ot.fit.train(tr, data[0][0], data[0][1], epochs=1, verbose=0,
                         callbacks=[ot.callbacks.ModelCheckpoint(tmp_path / "x", save_model=True)])
    with ot.Trainer(sgd_model(), batch_size=4) as tr:   # by default a bare trainer's fit writes checkpoints
        ot.fit.train(tr, data[0][0], data[0][1], epochs=1, verbose=0,
                     callbacks=[ot.callbacks.ModelCheckpoint(tmp_path / "t")])
        with ot.Trainer.from_checkpoint(sgd_model(), tmp_path / "t", batch_size=4) as again:
            assert again.n_steps == tr.n_steps == 1



def test_model_checkpoint_takes_keras_save_weights_only_and_save_freq(tmp_path):
    data = batches(2, 4)
    model = sgd_model()
    model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mse")
    saver = ot.callbacks.ModelCheckpoint(tmp_path / "w{epoch:02d}.weights.h5", monitor="loss", save_weights_only=True,
                                         save_freq="epoch")
    ot.fit_generator(model, data, epochs=2, verbose=0, callbacks=[saver])
    assert [p.rsplit("/", 1)[-1] for p in saver.saved] == ["w01.weights.h5", "w02.weights.h5"]
    other = sgd_model()
    other.load_weights(tmp_path / "w02.weights.h5")
    for a, b in zip(other.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for kwargs, message in [({"save_freq": 10}, r"save_freq=...\): only 'epoch' .* received 10"),
                            ({"save_weights_only": 1}, r"save_weights_only=...\): expected True or False"),
                            ({"save_weights_only": True, "save_model": True}, "not both")]:
        with pytest.raises(ot.OrtrainError, match=message):
            ot.callbacks.ModelCheckpoint(tmp_path / "x", **kwargs)
    with pytest.raises(ot.OrtrainError, match=r"save_weights_only=True\): this fit trains a bare trainer"):
        with ot.Trainer(sgd_model(), batch_size=4) as tr:
            ot.fit.train(tr, data[0][0], data[0][1], epochs=1, verbose=0,
                         callbacks=[ot.callbacks.ModelCheckpoint(tmp_path / "x", save_weights_only=True)])
    assert not (tmp_path / "x").exists()


def test_a_callback_that_saves_or_copies_self_model_keeps_the_live_optimizer_state(tmp_path):
    """Keras' way to checkpoint from a callback: self.model.save(path). The file holds the moments
    of the epoch's weights (it held the state of before the fit, and a resumed fit drifted)."""
    data = batches(2, 4)

    class SaveFirstEpoch(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.model.save(tmp_path / "epoch1.ortrain")
                self.copy = self.model.copy()

    whole = mlp(seed=1)
    whole.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    saver = SaveFirstEpoch()
    ot.fit_generator(whole, data, epochs=3, verbose=0, callbacks=[saver])
    for resumed in (ot.load_model(tmp_path / "epoch1.ortrain"), saver.copy):
        assert (resumed.train_state.step, resumed.train_state.n_steps) == (2, 2)
        ot.fit_generator(resumed, data, epochs=3, initial_epoch=1, verbose=0)
        for got, want in zip(resumed.get_weights(), whole.get_weights()):
            np.testing.assert_array_equal(got, want)
    assert whole.train_state.n_steps == 6 and whole._live_state is None


def test_history_lr_is_the_rate_the_epoch_trained_with_when_a_batch_hook_changes_it():
    # a per-step decay written in on_batch_end: the epoch's rate, not the next epoch's first
    data = batches(1, 4)
    used = []

    class PerStepDecay(ot.callbacks.Callback):
        def on_batch_begin(self, step, logs=None):
            used.append(self.model.optimizer.lr)

        def on_batch_end(self, step, logs=None):
            self.model.optimizer.lr = self.model.optimizer.lr * 0.5

    model = sgd_model(lr=0.1)
    hist = ot.fit_generator(model, data, epochs=3, verbose=0, callbacks=[PerStepDecay()])
    assert used == hist.history["lr"] == [0.1, 0.05, 0.025]
    ws = mlp().get_weights()
    for lr in used:
        ws = sgd(ws, mse_grads(ws, *data[0])[1], lr)
    for got, want in zip(model.get_weights(), ws):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_model_optimizer_lr_reads_the_rate_the_fit_trains_at_as_in_keras(tmp_path):
    # A Keras callback logs self.model.optimizer.lr: it read the compiled rate while a schedule ran
    import copy
    import pickle
    data = batches(1, 4)
    logged, copies = [], []

    class Log(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logged.append(self.model.optimizer.lr)
            copies.append(pickle.loads(pickle.dumps(self.model.optimizer)))  # no link to the running fit
            copies.append(copy.copy(self.model.optimizer))

    model = sgd_model(lr=0.1)
    hist = ot.fit_generator(model, data, epochs=3, verbose=0,
                            callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1), Log()])
    assert logged == hist.history["lr"] == [0.1, 0.05, 0.025]
    assert all(c.lr == 0.1 for c in copies)  # detached copies: the rate the optimizer was made with
    # outside a fit: the rate the next fit starts at, the last one, as Keras leaves its optimizer
    assert model.optimizer.lr == model.train_state.lr == 0.025
    model.save(tmp_path / "m.ortrain")
    assert ot.load_model(tmp_path / "m.ortrain").optimizer.lr == 0.025
    assert model.copy().optimizer.lr == 0.025
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # with the moments, the rate
        assert other.optimizer.lr == 0.025
        assert ot.fit_generator(other, data, verbose=0).history["lr"] == [0.025]
    model.optimizer.lr = model.optimizer.lr * 0.5     # the Keras idiom halves the rate it trains at
    assert model.copy().optimizer.lr == 0.0125        # a written rate goes with a copy
    assert ot.fit_generator(model, data, verbose=0).history["lr"] == [0.0125]
    # a schedule starts from the compiled or last written rate (loop.base_lr), not the last one shown
    hist = ot.fit_generator(model, data, epochs=6, initial_epoch=4, verbose=0,
                            callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
    assert hist.history["lr"] == [0.0125 * 0.5 ** 4, 0.0125 * 0.5 ** 5]
    assert model.optimizer.lr == 0.0125 * 0.5 ** 5
    with ot.Trainer(model, batch_size=4) as tr:  # a trainer's model carries no state: it starts afresh
        tr.set_lr(0.7)
        fresh = tr.model()
    assert fresh.optimizer.lr == 0.0125 and ot.fit_generator(fresh, data, verbose=0).history["lr"] == [0.0125]
    # a rate written in a callback of a fit that then fails before its first step is kept, shown and taken
    class Write(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.optimizer.lr = 0.5

    class Fail(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            raise RuntimeError("a callback failed")

    with pytest.raises(RuntimeError, match="a callback failed"):
        ot.fit_generator(model, data, verbose=0, callbacks=[Write(), Fail()])
    assert model.optimizer.lr == 0.5
    assert ot.fit_generator(model, data, verbose=0).history["lr"] == [0.5]
    # a compile in a hook is refused (it was half applied: the fit kept its loss and optimizer);
    # the rate is set on model.optimizer
    class Recompile(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                with pytest.raises(ot.OrtrainError, match="compile: this model is fitting.*set model.optimizer.lr"):
                    self.model.compile(optimizer=ot.optim.SGD(lr=0.3), loss="mse")
                self.model.optimizer.lr = 0.3

    fresh = sgd_model(lr=0.1)
    assert ot.fit_generator(fresh, data, epochs=2, verbose=0, callbacks=[Recompile()]).history["lr"] == [0.1, 0.3]
    assert fresh.optimizer.lr == 0.3 and ot.fit_generator(fresh, data, verbose=0).history["lr"] == [0.3]
    # a model saved mid-fit after a written rate carries the rate it trained at, and resumes on the curve
    tuned = sgd_model(lr=0.1)
    tuned.optimizer.lr = 0.08

    def halve(epoch, lr):
        return lr * 0.5 if epoch else lr

    saver = ot.callbacks.ModelCheckpoint(tmp_path / "ck_{epoch}.ortrain", monitor="loss", save_model=True)
    hist = ot.fit_generator(tuned, data, epochs=3, verbose=0, callbacks=[ot.callbacks.LearningRateScheduler(halve),
                                                                         saver])
    assert hist.history["lr"] == [0.08, 0.04, 0.02]
    resumed = ot.load_model(tmp_path / "ck_2.ortrain")
    assert resumed.optimizer.lr == resumed.train_state.lr == 0.04
    assert ot.fit_generator(resumed, data, epochs=3, initial_epoch=2, verbose=0,
                            callbacks=[ot.callbacks.LearningRateScheduler(halve)]).history["lr"] == [0.02]



def test_a_layers_own_set_weights_in_a_callback_reaches_the_training():
    # Keras' self.model.layers[0].set_weights(...) in a hook: the trainer kept its weights and the end
    # of the fit wrote them back over the edit
    data = batches(1, 4)
    model = sgd_model(lr=0.0)
    kernel = np.full_like(model.get_weights()[0], 0.5)

    class Edit(ot.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                self.model.layers[0].set_weights([kernel, np.zeros_like(self.model.get_weights()[1])])
                self.model.weight_names()  # reading self.model again in the hook keeps the edit

    hist = ot.fit_generator(model, data, epochs=2, verbose=0, callbacks=[Edit()])
    np.testing.assert_array_equal(model.get_weights()[0], kernel)  # lr 0: the edit is what trained
    ws = model.get_weights()
    loss, _ = mse_grads(ws, *data[0])
    np.testing.assert_allclose(hist.history["loss"][1], loss, rtol=1e-5)

def test_model_edits_in_hooks_follow_keras_semantics_exactly(tmp_path):
    data = batches(1, 4)
    # a rate written to model.optimizer.lr is taken over, even one equal to the compiled rate;
    # the live rate, a schedule's included, is trainer.lr
    seen = []

    class Halve(ot.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append(self.trainer.lr)
            self.model.optimizer.lr = self.trainer.lr * 0.5

    model = sgd_model(lr=0.1)
    sched = ot.callbacks.LearningRateScheduler(lambda epoch: 0.1 / (epoch + 1))
    hist = ot.fit_generator(model, data, epochs=3, verbose=0, callbacks=[sched, Halve()])
    np.testing.assert_allclose(hist.history["lr"], [0.05, 0.025, 0.1 / 6])
    np.testing.assert_allclose(seen, [0.1, 0.05, 0.1 / 3])
    assert model.train_state.lr == pytest.approx(0.1 / 6)
    model.optimizer.lr = 0.1                          # written between fits (equal to what it held): taken
    assert ot.fit_generator(model, data, epochs=1, verbose=0).history["lr"] == [0.1]
    # a model saved mid-fit keeps its compiled rate, so a schedule resumed from it continues its curve
    model = sgd_model(lr=0.1)
    saver = ot.callbacks.ModelCheckpoint(tmp_path / "m.ortrain", monitor="loss", save_model=True)
    ot.fit_generator(model, data, epochs=2, verbose=0, callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1), saver])
    resumed = ot.load_model(tmp_path / "m.ortrain")
    hist = ot.fit_generator(resumed, data, epochs=4, initial_epoch=2, verbose=0,
                            callbacks=[ot.callbacks.StepDecay(drop=0.5, every=1)])
    assert hist.history["lr"] == [0.025, 0.0125]
    # freezing through a held reference is no weight edit; a partial set_weights edits those names only
    model, trained = sgd_model(), []

    class Edits(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.held = model

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.held.freeze("dense_0")   # bumps the model's version, changes no weight
                self.held.unfreeze("dense_0")
                trained.append(self.loop.get_weights())
                self.held.set_weights({"dense_1.bias": np.zeros(3, np.float32)})

    ot.fit_generator(model, data, epochs=3, verbose=0, callbacks=[Edits()])
    reference = sgd_model()
    ot.fit_generator(reference, data, epochs=2, verbose=0)
    for got, want in zip(trained[0], reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    start = dict(zip(model.weight_names(), trained[0]))
    start["dense_1.bias"] = np.zeros(3, np.float32)
    _, grads = mse_grads(list(start.values()), *data[0])
    for got, want in zip(model.get_weights(), sgd(list(start.values()), grads, 0.1)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # a stop by a callback leaves model.stop_training set, as Keras does
    stop = ot.callbacks.EarlyStopping(monitor="loss", patience=0, mode="max")
    ot.fit_generator(model, data, epochs=5, verbose=0, callbacks=[stop])
    assert model.stop_training is True


def test_model_checkpoint_paths_are_checked_before_anything_trains(tmp_path):
    for path, message in ((tmp_path / "ck-{val_loss:.3f}", "names 'val_loss', and this fit has no validation data"),
                          (tmp_path / "ck-{epoch:s}", "has a bad format"), (tmp_path, "a directory")):
        model = sgd_model()
        before = model.get_weights()
        with pytest.raises(ot.OrtrainError, match=message):
            ot.fit_generator(model, batches(1, 4), callbacks=[ot.callbacks.ModelCheckpoint(path)], verbose=0)
        for a, b in zip(model.get_weights(), before):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ot.OrtrainError, match=r"ModelCheckpoint\(filepath=...\): expected a file path"):
        ot.callbacks.ModelCheckpoint(None)


def test_model_checkpoint_names_a_validation_value_a_callback_logs_without_validation_data(tmp_path):
    # {val_f1} that a callback adds to the logs was refused before training ("this fit has no
    # validation data"); Keras formats the path from each epoch's logs and writes m-1-0.5, m-2-0.6
    class LogF1(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_f1"] = [0.5, 0.6][epoch]

    model = sgd_model()
    ot.fit_generator(model, batches(1, 4), epochs=2, verbose=0,
                     callbacks=[LogF1(), ot.callbacks.ModelCheckpoint(tmp_path / "m-{epoch}-{val_f1:.1f}")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-1-0.5", "m-2-0.6"]


def test_model_checkpoint_reads_the_direction_when_save_best_only_is_set_after_construction(tmp_path):
    # ModelCheckpoint(monitor="val_f1") then save_best_only = True minimised the F1 score (a worse
    # one saved) without a word; set in the constructor it is refused
    model = sgd_model()
    before = model.get_weights()
    late = ot.callbacks.ModelCheckpoint(tmp_path / "best", monitor="val_f1")
    late.save_best_only = True
    with pytest.raises(ot.OrtrainError, match=r"ModelCheckpoint\(monitor='val_f1', mode='auto'\): cannot tell "
                                              r"whether 'val_f1' improves"):
        ot.fit_generator(model, batches(1, 4), epochs=1, verbose=0, callbacks=[late])
    assert not list(tmp_path.iterdir())
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    late = ot.callbacks.ModelCheckpoint(tmp_path / "best", monitor="loss")
    late.save_best_only = True
    ot.fit_generator(model, batches(1, 4), epochs=2, verbose=0, callbacks=[late])
    assert late.saved and set(late.saved) == {str(tmp_path / "best")}


def test_a_callback_refusing_the_fit_leaves_what_earlier_callbacks_would_have_changed(tmp_path):
    # Every callback's checks run before any on_train_begin: CSVLogger has not truncated its file,
    # and the model has no optimizer state, when a ModelCheckpoint listed after it is refused.
    x = np.random.default_rng(0).random((16, 4)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 3, 16)
    model = ot.Sequential([ot.layers.Dense(3, activation="softmax")], input_shape=(4,), seed=0)
    model.compile(loss="sparse_categorical_crossentropy")
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,1.5\n")
    weights = model.get_weights()
    cases = [(dict(validation_split=0.25, validation_freq=2), str(tmp_path / "ck-{val_loss:.3f}"),
              "leaves epoch 1 .* without validation"),
             ({}, str(tmp_path / "missing" / "ck"), "directory .* does not exist")]
    for kwargs, path, message in cases:
        with pytest.raises(ot.OrtrainError, match=message):
            model.fit(x, y, epochs=4, verbose=0, callbacks=[ot.callbacks.CSVLogger(log, append=False),
                                                            ot.callbacks.ModelCheckpoint(path)], **kwargs)
        assert log.read_text() == "epoch,loss\n0,1.5\n"
        assert model.train_state is None
        for a, b in zip(weights, model.get_weights()):
            np.testing.assert_array_equal(a, b)


def test_a_fit_refused_or_failed_before_its_first_step_keeps_logs_and_a_written_rate(tmp_path):
    x = np.random.default_rng(0).random((16, 4)).astype(np.float32)
    y = np.random.default_rng(1).random((16, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.01), loss="mse")
    model.fit(x, y, batch_size=8, verbose=0)
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,1.5\n")
    for second, message in ((tmp_path / "nodir" / "b.csv", "CSVLogger: directory .* does not exist"),
                            (tmp_path, "CSVLogger: filename .* is a directory")):
        with pytest.raises(ot.OrtrainError, match=message):
            model.fit(x, y, verbose=0, callbacks=[ot.callbacks.CSVLogger(log), ot.callbacks.CSVLogger(second)])
        assert log.read_text() == "epoch,loss\n0,1.5\n"

    class Boom(ot.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            raise RuntimeError("before the first step")

    model.optimizer.lr = 0.5
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[Boom()])
    assert model.fit(x, y, batch_size=8, verbose=0).history["lr"] == [0.5]   # the written rate still applies


def test_a_csv_logger_that_cannot_write_names_the_file_and_changes_nothing(tmp_path, monkeypatch):
    # A read-only folder raised the system's PermissionError from inside the loop; a full disk its OSError.
    import errno

    from ortrain.callbacks import csv_logger
    x = np.random.default_rng(0).random((8, 4)).astype(np.float32)
    y = np.random.default_rng(1).random((8, 2)).astype(np.float32)
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.01), loss="mse")
    before = model.get_weights()
    monkeypatch.setattr(csv_logger.os, "access", lambda path, mode: False)  # as a user without write access
    with pytest.raises(ot.OrtrainError, match=r"CSVLogger: cannot write .*log.csv'.*read-only.*Choose a folder you "
                                              r"can write to"):
        model.fit(x, y, verbose=0, callbacks=[ot.callbacks.CSVLogger(tmp_path / "log.csv")])
    monkeypatch.undo()
    assert model.train_state is None and not (tmp_path / "log.csv").exists()
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)

    class FullDisk(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv_logger, "open", lambda *a, **k: FullDisk(), raising=False)
    with pytest.raises(ot.OrtrainError, match=r"CSVLogger: cannot write .*: No space left on device; Free space"):
        model.fit(x, y, verbose=0, callbacks=[ot.callbacks.CSVLogger(tmp_path / "log.csv")])


def test_lambda_callback_calls_the_functions_given_as_keras_does():
    calls = []
    cb = ot.callbacks.LambdaCallback(
        on_train_begin=lambda logs: calls.append("train_begin"),
        on_epoch_begin=lambda epoch, logs: calls.append(("epoch_begin", epoch)),
        on_batch_end=lambda batch, logs: calls.append(("batch_end", batch, round(logs["loss"], 6))),
        on_epoch_end=lambda epoch, logs: calls.append(("epoch_end", epoch, sorted(logs))),
        on_train_end=lambda logs: calls.append("train_end"))
    data = batches(2, 4)
    model = sgd_model()
    hist = ot.fit_generator(model, data, epochs=2, verbose=0, callbacks=[cb])
    steps = [c for c in calls if c[0] == "batch_end"]
    assert calls[0] == "train_begin" and calls[-1] == "train_end"
    assert [c for c in calls if c[0] == "epoch_begin"] == [("epoch_begin", 0), ("epoch_begin", 1)]
    assert [c[1] for c in steps] == [0, 1, 0, 1]
    assert [c for c in calls if c[0] == "epoch_end"] == [("epoch_end", e, ["loss", "lr"]) for e in (0, 1)]
    assert hist.history["loss"][0] == pytest.approx(steps[1][2], rel=1e-5)   # the running mean, as Keras 3's
    quiet = ot.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None)
    assert not ot.callbacks.CallbackList([quiet]).has_batch_hooks   # no per-step call without a batch function
    with pytest.raises(ot.OrtrainError, match="LambdaCallback\\(on_epoch_end=...\\): expected a function"):
        ot.callbacks.LambdaCallback(on_epoch_end=3)
    keras3 = []   # Keras 3's names for the batch hooks
    ot.fit_generator(sgd_model(), data, epochs=1, verbose=0, callbacks=[ot.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: keras3.append(("begin", batch)),
        on_train_batch_end=lambda batch, logs: keras3.append(("end", batch)))])
    assert keras3 == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)]
    with pytest.raises(ot.OrtrainError, match="on_batch_end and on_train_batch_end .* are one hook"):
        ot.callbacks.LambdaCallback(on_batch_end=print, on_train_batch_end=print)



def _numpy_sgd_run(data, epochs, lr, after_step=None):
    """Weights after each step of plain SGD on ``data`` (one pass per epoch), in float64."""
    ws, seen = [np.asarray(a, np.float64) for a in mlp().get_weights()], []
    for _ in range(epochs):
        for x, y in data:
            ws = sgd(ws, mse_grads(ws, x, y)[1], lr)
            if after_step is not None:
                ws = after_step(ws)
            seen.append(ws)
    return seen


def test_the_model_a_closure_holds_is_the_one_being_trained_as_in_keras(tmp_path):
    """A LambdaCallback has no self.model: Keras code reaches the model through the variable it
    holds. Reads of it (get_weights, evaluate, predict, a layer's weights, save, a deep copy) gave
    the weights of before the fit, and a file saved so paired them with the live optimizer state."""
    import copy

    data = batches(2, 4)
    model = sgd_model(lr=0.1)
    got = []

    def epoch_end(epoch, logs):
        x, y = data[0]
        got.append((model.get_weights(), model.evaluate(x, y)["loss"], model.predict(x),
                    model.layers[0].get_weights(), copy.deepcopy(model).get_weights()))
        model.save(tmp_path / f"e{epoch}.ortrain")

    ot.fit_generator(model, data, epochs=3, verbose=0, callbacks=[ot.callbacks.LambdaCallback(on_epoch_end=epoch_end)])
    want = _numpy_sgd_run(data, 3, 0.1)[1::2]  # after each epoch's last step
    for epoch, ((weights, loss, pred, layer0, copied), ref) in enumerate(zip(got, want)):
        for g, w in zip(weights, ref):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
        x, y = data[0]
        np.testing.assert_allclose(loss, mse_grads(ref, x, y)[0], rtol=2e-5)
        np.testing.assert_allclose(pred, np.maximum(x @ ref[0] + ref[1], 0) @ ref[2] + ref[3], rtol=2e-5, atol=2e-6)
        for g, w in zip(layer0 + copied, ref[:2] + weights):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
        saved = ot.load_model(tmp_path / f"e{epoch}.ortrain")
        for g, w in zip(saved.get_weights(), weights):
            np.testing.assert_array_equal(g, w)
        assert saved.train_state.n_steps == 2 * (epoch + 1)
    from ortrain.nn.base_layer import LIVE_SYNC
    assert not LIVE_SYNC  # the fit let go of the model


def test_a_closure_clipping_the_held_models_weights_each_batch_clips_the_trained_ones():
    # It wrote the clipped weights of before the fit back at every batch: training was undone.
    data = batches(2, 4)
    model = sgd_model(lr=0.5)

    def clip(step, logs):
        model.set_weights([np.clip(w, -0.3, 0.3) for w in model.get_weights()])

    ot.fit_generator(model, data, epochs=2, verbose=0, callbacks=[ot.callbacks.LambdaCallback(on_batch_end=clip)])
    want = _numpy_sgd_run(data, 2, 0.5, after_step=lambda ws: [np.clip(w, -0.3, 0.3) for w in ws])[-1]
    for g, w in zip(model.get_weights(), want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_a_generator_predicting_with_the_model_it_trains_sees_each_steps_weights():
    # The rollout case: a callable source that acts with the model being trained (it predicted with
    # the weights of before the fit at every batch).
    data = batches(3, 4)
    model = sgd_model(lr=0.1)
    probe = data[0][0][:2]
    seen, source = [], iter(data)

    def rollout():
        seen.append(model.predict(probe))
        return next(source)

    ot.fit_generator(model, rollout, steps_per_epoch=3, epochs=1, verbose=0)
    refs = [[np.asarray(a, np.float64) for a in mlp().get_weights()], *_numpy_sgd_run(data, 1, 0.1)[:2]]
    for got, ref in zip(seen, refs):
        np.testing.assert_allclose(got, np.maximum(probe @ ref[0] + ref[1], 0) @ ref[2] + ref[3], rtol=2e-5, atol=2e-6)


def test_a_model_sharing_layers_with_the_one_being_trained_reads_its_trained_weights():
    # Keras' encoder of an autoencoder: a second model over the first's layers. It read the weights of
    # before the fit (until something else happened to bring the shared layers over).
    from ortrain.nn.base_layer import LIVE_SYNC
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    inp = ot.Input((4,))
    hidden = ot.layers.Dense(3)
    full = ot.Model(inp, ot.layers.Dense(1)(hidden(inp)))
    encoder = ot.Model(inp, hidden(inp))
    full.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    w = [a.astype(np.float64) for a in full.get_weights()]
    seen = []

    def epoch_end(epoch, logs):
        import copy
        # Keras' layer.kernel, and a copy of the layer, read the trained values too, first thing
        copied = (copy.deepcopy(hidden).weights["kernel"], hidden.kernel.copy())
        seen.append((encoder.predict(x[:2]), hidden.weights["kernel"].copy()))
        for kernel in copied:
            np.testing.assert_array_equal(kernel, seen[-1][1])

    full.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
             callbacks=[ot.callbacks.LambdaCallback(on_epoch_end=epoch_end)])
    for enc, kernel in seen:  # numpy SGD on mean((x W1 + b1) W2 + b2 - y)^2
        h = x @ w[0] + w[1]
        d = 2 * (h @ w[2] + w[3] - y) / y.size
        dh = d @ w[2].T
        w = [w[0] - 0.1 * x.T @ dh, w[1] - 0.1 * dh.sum(0), w[2] - 0.1 * h.T @ d, w[3] - 0.1 * d.sum(0)]
        np.testing.assert_allclose(enc, x[:2] @ w[0] + w[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(kernel, w[0], rtol=1e-5, atol=1e-6)
    # a fit of the encoder from a callback of the full model's: the shared layer stays linked to the
    # outer fit once the inner one ends (it was dropped, and read stale after)
    encoder.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    after = []

    def nested(epoch, logs):
        if epoch == 0:
            encoder.fit(x, np.zeros((8, 3), np.float32), batch_size=8, verbose=0)
        else:
            after.append(hidden.get_weights()[0])

    full.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[ot.callbacks.LambdaCallback(on_epoch_end=nested)])
    np.testing.assert_array_equal(after[-1], hidden.get_weights()[0])
    assert not LIVE_SYNC


def test_weights_a_generator_sets_take_effect_at_the_next_step():
    # They were taken at the next callback hook only (the epoch's end without batch hooks): steps
    # in between trained without them, and the edit then overwrote what they had trained.
    data = batches(4, 4)
    model = sgd_model(lr=0.1)
    calls, source = [0], iter(data)
    bias = np.full(3, 0.5, np.float32)

    def gen():
        calls[0] += 1
        if calls[0] == 2:
            model.layers[1].weights["bias"] = bias
        return next(source)

    ot.fit_generator(model, gen, steps_per_epoch=4, epochs=1, verbose=0)
    ws = [np.asarray(a, np.float64) for a in mlp().get_weights()]
    for i, (x, y) in enumerate(data):
        if i == 1:
            ws[3] = bias.astype(np.float64)
        ws = sgd(ws, mse_grads(ws, x, y)[1], 0.1)
    for got, want in zip(model.get_weights(), ws):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_nested_fit_of_a_model_sharing_layers_hands_its_training_to_the_outer_fit():
    # The outer fit's next step started from its own copy of the shared layer: what the inner fit
    # trained into it was lost (its edit marks were taken by the inner fit's model).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    inp = ot.Input((4,))
    enc = ot.layers.Dense(5)
    outer = ot.Model(inp, ot.layers.Dense(2)(enc(inp)))
    inner = ot.Model(inp, ot.layers.Dense(3)(enc(inp)))
    outer.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")  # the outer fit moves nothing itself
    inner.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    seen = []

    def hook(step, logs):
        if step == 0:
            inner.fit(x[:4], np.ones((4, 3), np.float32), batch_size=4, verbose=0)
            seen.append(enc.get_weights()[0])

    before = enc.get_weights()[0]
    outer.fit(x, np.zeros((8, 2), np.float32), batch_size=4, shuffle=False, verbose=0,
              callbacks=[ot.callbacks.LambdaCallback(on_batch_end=hook)])
    assert not np.array_equal(seen[0], before)
    np.testing.assert_array_equal(enc.get_weights()[0], seen[0])


def test_compile_add_and_pop_during_a_fit_are_refused_and_change_nothing():
    # compile was half applied (the fit kept its loss and optimizer, took the new rate, and the
    # next fit failed on a "damaged checkpoint"); add and pop failed with unrelated errors
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)
    model = ot.Sequential([ot.layers.Dense(2, name="a")], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    calls = {"compile": lambda: model.compile(optimizer=ot.optim.Adam(lr=0.01), loss="mae"),
             "add": lambda: model.add(ot.layers.Dense(2, name="c")), "pop": model.pop}
    for name, call in calls.items():
        errors = []

        def hook(step, logs, call=call, errors=errors):
            try:
                call()
            except ot.OrtrainError as exc:
                errors.append(str(exc))

        optimizer, loss = model.optimizer, model.loss
        model.fit(x, y, batch_size=4, verbose=0, callbacks=[ot.callbacks.LambdaCallback(on_batch_end=hook)])
        assert errors and all("this model is fitting" in e and "nothing was changed" in e for e in errors), name
        assert model.optimizer is optimizer and model.loss is loss and len(model.layers) == 1
    model.fit(x, y, batch_size=4, verbose=0)  # and the next fit runs


def test_fits_in_two_threads_sharing_a_layer_let_go_of_it_in_any_order():
    # the fit that began second restored the first one's link when it ended after it: the first
    # fit's loop (its data, callbacks) stayed registered for the life of the process
    import threading

    from ortrain.nn.base_layer import LIVE_SYNC
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    inp = ot.Input((4,))
    enc = ot.layers.Dense(5)
    first, second = ot.Model(inp, ot.layers.Dense(2)(enc(inp))), ot.Model(inp, ot.layers.Dense(3)(enc(inp)))
    for m in (first, second):
        m.compile(optimizer=ot.optim.SGD(lr=0.01), loss="mse")
    started, first_done = threading.Event(), threading.Event()

    class Wait(ot.callbacks.Callback):
        def on_batch_begin(self, step, logs=None):
            started.set()
            first_done.wait(60)

    thread = threading.Thread(target=lambda: second.fit(x, np.zeros((8, 3), np.float32), batch_size=8, verbose=0,
                                                         callbacks=[Wait()]))

    class Begin(ot.callbacks.Callback):
        def on_train_begin(self, logs=None):
            thread.start()
            started.wait(60)  # the second fit has linked the shared layer

    first.fit(x, np.zeros((8, 2), np.float32), batch_size=8, verbose=0, callbacks=[Begin()])
    first_done.set()
    thread.join(60)
    assert not LIVE_SYNC


def test_an_optional_package_missing_or_broken_is_told_apart(tmp_path, monkeypatch):
    # a matplotlib or pandas installed but failing to import (built for another numpy) was "not
    # installed", to_pandas raised the raw ValueError, and the command line skipped loss.png silently
    import sys
    history = ot.History()
    history.on_epoch_end(0, {"loss": 1.0})
    for name in ("pandas", "matplotlib"):
        monkeypatch.setitem(sys.modules, name, None)  # not installed
    # an ImportError too, which `except ImportError:` around the feature falls back from
    with pytest.raises(ImportError, match=r"History.to_pandas needs pandas, which is not installed; install the "
                                          r"plot extra: pip install 'ortrain\[plot\]'") as info:
        history.to_pandas()
    assert isinstance(info.value, ot.OrtrainError)
    with pytest.raises(ImportError, match=r"History.plot needs matplotlib, which is not installed"):
        history.plot(tmp_path / "h.png")
    for name in ("pandas", "matplotlib"):  # installed, broken
        package = tmp_path / "site" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("raise ValueError('numpy.dtype size changed, may indicate binary "
                                             "incompatibility')\n")
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ot.OrtrainError, match=r"History.to_pandas needs pandas, which is installed but fails to "
                                              r"import \(ValueError: numpy.dtype size changed.*pip install --upgrade "
                                              r"pandas"):
        history.to_pandas()
    with pytest.raises(ot.OrtrainError, match=r"History.plot needs matplotlib, which is installed but fails"):
        history.plot(tmp_path / "h.png")
    from ortrain.cli.runs import _plot
    with pytest.warns(RuntimeWarning, match=r"loss.png needs matplotlib, which is installed but fails to import"):
        assert _plot(None, tmp_path) is None
    assert not list(tmp_path.glob("*.png"))


def test_batch_logs_hold_the_epochs_running_means_as_keras_3s_do(rng):
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = ot.Sequential([ot.layers.Dense(2, activation="softmax")], input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="sparse_categorical_crossentropy", metrics=["acc"])
    k, b = (w.astype(np.float64) for w in model.get_weights())
    z = x @ k + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    losses = -np.log(np.clip(p[np.arange(40), y], 1e-7, 1 - 1e-7))
    hits = (p.argmax(1) == y).astype(np.float64)
    logs = []
    cb = ot.callbacks.LambdaCallback(on_train_batch_end=lambda batch, got: logs.append(dict(got)))
    hist = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert [(got["batch"], got["size"]) for got in logs] == [(0, 16), (1, 16), (2, 8)]
    for got, seen in zip(logs, (16, 32, 40), strict=True):
        assert got["loss"] == pytest.approx(losses[:seen].mean(), rel=1e-6)
        assert got["acc"] == pytest.approx(hits[:seen].mean(), rel=1e-6)
    assert hist.history["loss"][0] == pytest.approx(logs[-1]["loss"], rel=1e-6)
    assert hist.history["acc"][0] == pytest.approx(logs[-1]["acc"], rel=1e-6)


def test_a_callbacks_verbose_is_checked_where_it_is_given(tmp_path):
    # verbose="x", {} or NaN were taken as given and printed (or not) by truthiness
    makers = {"LearningRateScheduler": lambda v: ot.callbacks.LearningRateScheduler(lambda e, lr: lr, verbose=v),
              "StepDecay": lambda v: ot.callbacks.StepDecay(0.1, verbose=v),
              "CosineDecay": lambda v: ot.callbacks.CosineDecay(4, verbose=v),
              "EarlyStopping": lambda v: ot.callbacks.EarlyStopping(verbose=v),
              "ReduceLROnPlateau": lambda v: ot.callbacks.ReduceLROnPlateau(verbose=v),
              "ModelCheckpoint": lambda v: ot.callbacks.ModelCheckpoint(str(tmp_path / "m_{epoch}"), verbose=v)}
    for owner, make in makers.items():
        for good in (0, 1, 2, True, np.int64(1), np.array(1)):
            assert make(good).verbose == int(good)
        for bad in ("x", {}, float("nan"), 5, None):
            with pytest.raises(ot.OrtrainError, match=rf"{owner}\(verbose=...\): expected 0 \(quiet\) or 1"):
                make(bad)
