"""Resident memory stays flat over long runs and many trainers (slow: `make test-all`)."""

import gc

import numpy as np
import pytest

import ortrain as ot

pytestmark = pytest.mark.slow
L = ot.layers


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status on this platform")


def small_model():
    model = ot.Sequential([L.Dense(32, activation="relu"), L.BatchNorm(), L.Dropout(0.2), L.Dense(4)],
                          input_shape=(16,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    return model


def test_long_run_with_periodic_predict_does_not_grow(rng, record_property):
    model = small_model()
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 4)).astype(np.float32)
    with ot.Trainer(model, batch_size=32) as tr:
        for i in range(300):  # warm up allocators and caches
            tr.step(x, y)
            if i % 10 == 0:
                tr.predict(x)
        gc.collect()
        start = rss_mb()
        for i in range(3000):
            tr.step(x, y)
            if i % 10 == 0:
                tr.predict(x)
        gc.collect()
        grown = rss_mb() - start
    record_property("rss_growth_mb_3000_steps", round(grown, 2))
    print(f"3000 steps with predict every 10: RSS grew {grown:.2f} MB")
    assert grown < 20


def test_many_trainers_created_and_freed_do_not_grow(rng, record_property):
    model = small_model()
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 4)).astype(np.float32)

    def cycle():
        tr = ot.Trainer(model, batch_size=32)
        for _ in range(5):
            tr.step(x, y)
        snap = tr.snapshot()
        snap.predict(x)
        tr.predict(x)
        tr.free()
        snap.free()

    for _ in range(5):
        cycle()
    gc.collect()
    start = rss_mb()
    for _ in range(40):
        cycle()
    gc.collect()
    grown = rss_mb() - start
    record_property("rss_growth_mb_40_trainers", round(grown, 2))
    print(f"40 trainers created, stepped, snapshotted and freed: RSS grew {grown:.2f} MB")
    assert grown < 60
