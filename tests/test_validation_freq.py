"""``validation_freq`` in Model.fit (arrays and generators) (Keras' semantics): which epochs validate,
what their logs and the History hold, and the callbacks that watch a ``val_`` value."""

from __future__ import annotations

import csv
import math
import warnings

import numpy as np
import pytest

import ortrain as ot
from ortrain._loop import validates_after, validations_within


def classifier(seed=0):
    model = ot.Sequential([ot.layers.Dense(6, activation="relu"), ot.layers.Dense(3, activation="softmax")],
                          input_shape=(4,), seed=seed)
    model.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 3, n)


class Evaluating(ot.callbacks.Callback):
    """Records each epoch's logs and what ``evaluate`` gives on the validation rows then."""

    def __init__(self, xv, yv):
        self.xv, self.yv = xv, yv
        self.logs, self.evaluated = {}, {}

    def on_epoch_end(self, epoch, logs=None):
        self.logs[epoch] = dict(logs)
        self.evaluated[epoch] = self.model.evaluate(self.xv, self.yv)


def validated(hist) -> list[int]:
    return [e for e, v in zip(hist.epoch, hist.history["val_loss"]) if not math.isnan(v)]


@pytest.mark.parametrize("freq, initial_epoch, want", [
    (2, 0, [1, 3, 5]),           # epochs counted from 1 in Keras: after the 2nd, 4th and 6th
    (3, 0, [2, 5]),
    (1, 0, [0, 1, 2, 3, 4, 5]),
    (2, 3, [3, 5]),              # the epoch number counts, not the epochs this fit ran
    ([1, 4, 6, 9], 0, [0, 3, 5]),
    ((2,), 1, [1]),
    (range(5, 7), 0, [4, 5]),
    ({3, 6}, 0, [2, 5]),
    (np.array([1, 2]), 0, [0, 1]),
])
def test_validation_runs_after_the_epochs_keras_names_and_equals_evaluate(freq, initial_epoch, want):
    x, y = data()
    xv, yv = data(9, seed=1)
    rec = Evaluating(xv, yv)
    model = classifier()
    hist = model.fit(x, y, batch_size=8, epochs=6, initial_epoch=initial_epoch, validation_data=(xv, yv),
                     validation_freq=freq, callbacks=[rec], verbose=0)
    assert hist.epoch == list(range(initial_epoch, 6))
    assert validated(hist) == want
    for i, epoch in enumerate(hist.epoch):
        logs = rec.logs[epoch]
        if epoch in want:
            assert logs["val_loss"] == pytest.approx(rec.evaluated[epoch]["loss"], rel=1e-5)
            assert logs["val_accuracy"] == pytest.approx(rec.evaluated[epoch]["accuracy"], rel=1e-6)
            assert hist.history["val_loss"][i] == logs["val_loss"]
        else:
            assert set(logs) == {"loss", "accuracy", "lr"}  # no val_ entries, as in Keras
            assert math.isnan(hist.history["val_loss"][i]) and math.isnan(hist.history["val_accuracy"][i])
    assert all(len(column) == len(hist.epoch) for column in hist.history.values())


def test_epochs_without_validation_do_not_read_the_validation_generator():
    x, y = data()
    xv, yv = data(8, seed=1)
    pulls = []

    def val():
        pulls.append(1)
        return (xv[:4], yv[:4]) if len(pulls) % 3 else None  # two batches, then the end of the epoch

    model = classifier()
    train_batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]
    hist = model.fit(train_batches, epochs=5, validation_data=val, validation_freq=[2, 5], verbose=0)
    assert validated(hist) == [1, 4]
    assert len(pulls) == 6  # two validations of two batches and an end each: no other epoch pulled one
    assert hist.history["val_loss"][-1] == pytest.approx(model.evaluate(xv[:4], yv[:4])["loss"], rel=1e-5)
    other = classifier()
    hist2 = other.fit(train_batches, epochs=5, validation_data=(xv, yv), validation_freq=3, verbose=0)
    assert validated(hist2) == [2]


def test_training_is_the_same_whatever_the_validation_freq():
    x, y = data()
    a, b = classifier(), classifier()
    ha = a.fit(x, y, batch_size=8, epochs=4, validation_split=0.25, validation_freq=3, verbose=0)
    hb = b.fit(x, y, batch_size=8, epochs=4, validation_split=0.25, verbose=0)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    assert ha.history["loss"] == hb.history["loss"]
    assert ha.history["val_loss"][2] == hb.history["val_loss"][2]


def test_without_validation_data_validation_freq_changes_nothing():
    x, y = data()
    hist = classifier().fit(x, y, batch_size=8, epochs=3, validation_freq=2, verbose=0)
    assert set(hist.history) == {"loss", "accuracy", "lr"}
    hist = classifier().fit(x, y, batch_size=8, epochs=2, validation_split=0.25, validation_freq=5, verbose=0)
    assert set(hist.history) == {"loss", "accuracy", "lr"}  # never validated: nothing logged


def test_callbacks_watching_val_loss_skip_epochs_without_it_quietly(tmp_path):
    x, y = data()
    xv, yv = data(9, seed=1)
    stop = ot.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0)  # never improves after one
    plateau = ot.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, min_delta=10.0, factor=0.5)
    best = ot.callbacks.ModelCheckpoint(str(tmp_path / "best-{epoch}-{val_loss:.3f}"), save_best_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = classifier()
        hist = model.fit(x, y, batch_size=8, epochs=10, validation_data=(xv, yv), validation_freq=3,
                         callbacks=[stop, plateau, best], verbose=0)
    # patience counts validated epochs (Keras' rule): the first validation (epoch 2) is the best, the
    # second (epoch 5) does not improve by 10, and training stops there
    assert hist.epoch == [0, 1, 2, 3, 4, 5] and stop.stopped_epoch == 5
    assert hist.history["lr"] == [1e-2] * 6 and model.train_state.lr == 5e-3  # lowered after epoch 5
    saved = [path.rsplit("/", 1)[1].split("-")[1] for path in best.saved]
    assert saved[0] == "3" and set(saved) <= {"3", "6"}  # epochs counted from 1: validated ones only
    # a value that is never logged still warns, as before
    with pytest.warns(UserWarning, match=r"EarlyStopping monitors 'val_los', which is not logged"):
        classifier().fit(x, y, batch_size=8, epochs=2, validation_data=(xv, yv), validation_freq=2, verbose=0,
                         callbacks=[ot.callbacks.EarlyStopping(monitor="val_los", mode="min")])


def test_model_checkpoint_naming_a_val_value_is_refused_when_some_epochs_skip_validation(tmp_path):
    x, y = data()
    xv, yv = data(9, seed=1)
    model = classifier()
    model.fit(x, y, batch_size=8, verbose=0)
    weights, state = model.get_weights(), model.train_state
    moments = {k: [m.copy() for m in v] for k, v in state.moments.items()}
    every = ot.callbacks.ModelCheckpoint(str(tmp_path / "ckpt-{epoch}-{val_loss:.3f}"))
    with pytest.raises(ot.OrtrainError, match=r"^ModelCheckpoint: filepath '.*ckpt-\{epoch\}-\{val_loss:.3f\}' names "
                                              r"'val_loss', and this fit's validation_freq leaves epoch 1 \(counted "
                                              r"from 1\) without validation; drop it from the path, save only "
                                              r"validated epochs with save_best_only=True"):
        model.fit(x, y, batch_size=8, epochs=4, validation_data=(xv, yv), validation_freq=2, callbacks=[every],
                  verbose=0)
    assert list(tmp_path.iterdir()) == []
    after = model.train_state  # written back whole when the fit ends, as after any callback's refusal
    assert (after.step, after.n_steps, after.lr) == (state.step, state.n_steps, state.lr)
    for name, pair in moments.items():
        for a, b in zip(pair, after.moments[name]):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # validating every epoch this fit runs, the same path is fine
    model.fit(x, y, batch_size=8, epochs=4, initial_epoch=2, validation_data=(xv, yv), validation_freq=[3, 4],
              callbacks=[every], verbose=0)
    assert len(every.saved) == 2


def test_csv_logger_and_history_exports_stay_well_formed(tmp_path):
    x, y = data()
    xv, yv = data(9, seed=1)
    log = tmp_path / "log.csv"
    hist = classifier().fit(x, y, batch_size=8, epochs=4, validation_data=(xv, yv), validation_freq=2, verbose=0,
                            callbacks=[ot.callbacks.CSVLogger(log)])
    with open(log, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["epoch", "accuracy", "loss", "lr", "val_accuracy", "val_loss"]  # val_ columns from epoch 0
    assert all(len(r) == 6 for r in rows) and [r[0] for r in rows[1:]] == ["0", "1", "2", "3"]
    assert [r[5] for r in rows[1:]][::2] == ["NA", "NA"]
    assert float(rows[2][5]) == hist.history["val_loss"][1] and float(rows[4][5]) == hist.history["val_loss"][3]
    hist.to_csv(tmp_path / "history.csv")
    with open(tmp_path / "history.csv", newline="") as f:
        saved = list(csv.DictReader(f))
    with open(log, newline="") as f:
        logged = list(csv.DictReader(f))
    assert saved == logged  # History.to_csv writes what CSVLogger wrote, NA included


BAD = [
    (0, r"^validation_freq: expected an int >= 1 \(validate after every that many epochs\) or a list of epoch "
        r"numbers counted from 1, received 0; validation_freq=1 validates after every epoch"),
    (-2, r"^validation_freq: expected an int >= 1 .* received -2"),
    (1.0, r"^validation_freq: expected an int >= 1 .* received 1.0"),
    (True, r"^validation_freq: expected an int >= 1 .* received True"),
    ("2", r"^validation_freq: expected an int >= 1 .* received '2'"),
    (None, r"^validation_freq: expected an int >= 1 .* received None"),
    ([1, 0], r"^validation_freq: expected epoch numbers counted from 1 \(ints >= 1\), received 0 in \[1, 0\]; e.g. "
             r"validation_freq=\[1, 5, 10\]"),
    ([2, 3.0], r"^validation_freq: expected epoch numbers counted from 1 \(ints >= 1\), received 3.0 in \[2, 3.0\]"),
    ((True,), r"^validation_freq: expected epoch numbers counted from 1 \(ints >= 1\), received True"),
]


def test_a_validation_freq_that_names_no_epoch_of_the_fit_logs_no_val_values(tmp_path):
    # History and CSVLogger agree: without a validated epoch neither has val_ entries.
    x, y = data()
    xv, yv = data(8, seed=1)
    for freq in ([], [9], 5):
        log = tmp_path / f"log-{freq}.csv"
        hist = classifier().fit(x, y, batch_size=8, epochs=3, validation_data=(xv, yv), validation_freq=freq,
                                verbose=0, callbacks=[ot.callbacks.CSVLogger(log)])
        assert sorted(hist.history) == ["accuracy", "loss", "lr"]
        assert not any(n.startswith("val_") for n in hist.params["metrics"])
        with open(log, newline="") as f:
            assert next(csv.reader(f)) == ["epoch", "accuracy", "loss", "lr"]


@pytest.mark.parametrize("how", ["fit arrays", "fit generator"])
def test_bad_validation_freq_is_refused_before_anything_changes(how, tmp_path):
    x, y = data(16)
    model = classifier()
    model.fit(x, y, batch_size=8, verbose=0)
    weights, state = model.get_weights(), model.train_state
    pulls = []

    def gen():
        pulls.append(1)
        return (x[:8], y[:8]) if len(pulls) % 3 else None

    for freq, message in BAD:
        kwargs = dict(validation_freq=freq, callbacks=[ot.callbacks.CSVLogger(tmp_path / "log.csv")], verbose=0)
        with pytest.raises(ot.OrtrainError, match=message):
            if how == "fit arrays":
                model.fit(x, y, batch_size=8, validation_split=0.25, **kwargs)
            else:
                model.fit(gen, validation_data=gen, **kwargs)
        assert model.train_state is state
        for a, b in zip(weights, model.get_weights()):
            np.testing.assert_array_equal(a, b)
    assert pulls == [] and list(tmp_path.iterdir()) == []


def test_a_diverged_loss_is_written_nan_and_a_missing_value_na(tmp_path):
    # a NaN loss was written NA, the marker of an epoch that did not log the value: a run that
    # diverged read as one without validation
    x, y = data()
    xv, yv = data(9, seed=1)
    model = classifier()

    class Poison(ot.callbacks.Callback):
        def on_batch_end(self, step, logs=None):
            if self.loop.epoch == 1 and step == 0:
                w = self.model.get_weights()
                self.model.set_weights([w[0] + np.nan, *w[1:]])

    log = tmp_path / "log.csv"
    hist = model.fit(x, y, batch_size=8, epochs=3, validation_data=(xv, yv), validation_freq=[1, 3], verbose=0,
                     callbacks=[Poison(), ot.callbacks.CSVLogger(log)])
    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["val_loss"] for r in rows] == [rows[0]["val_loss"], "NA", "nan"] and rows[0]["val_loss"] != "NA"
    assert [r["loss"] for r in rows][1:] == ["nan", "nan"]
    hist.to_csv(tmp_path / "history.csv")
    with open(tmp_path / "history.csv", newline="") as f:
        assert list(csv.DictReader(f)) == rows


@pytest.mark.parametrize("freq", [1, 2, 3, 7, frozenset({1, 4, 9}), frozenset({30})])
def test_the_count_of_validating_epochs_equals_keras_rule_epoch_by_epoch(freq):
    for initial_epoch in range(0, 12):
        for epochs in range(0, 14):
            want = sum(validates_after(e, freq) for e in range(initial_epoch, epochs))
            assert validations_within(initial_epoch, epochs, freq) == want, (initial_epoch, epochs)


def test_a_fit_of_very_many_epochs_starts_at_once(tmp_path):
    """'Train until stopped': the epochs are counted, not scanned, before the first one (a scan of
    10**12 epochs never ended)."""
    x, y = data()
    stop = ot.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(model, "stop_training", epoch >= 1))
    for validation in ({}, {"validation_data": data(8, seed=1)}, {"validation_data": data(8, seed=1),
                                                                  "validation_freq": 2}):
        model = classifier()
        checkpoint = ot.callbacks.ModelCheckpoint(str(tmp_path / "ck-{epoch}.ortrain"))  # (it scanned them too)
        hist = model.fit(x, y, batch_size=8, epochs=10**12, verbose=0, callbacks=[checkpoint, stop], **validation)
        assert hist.epoch == [0, 1] and (tmp_path / "ck-2.ortrain").is_file()
        assert ("val_loss" in hist.history) == bool(validation)
    with pytest.raises(ot.OrtrainError, match="leaves epoch 1 .counted from 1. without validation"):
        model.fit(x, y, batch_size=8, epochs=10**12, verbose=0, validation_data=data(8, seed=1), validation_freq=2,
                  callbacks=[ot.callbacks.ModelCheckpoint(str(tmp_path / "ck-{val_loss:.3f}.ortrain"))])
