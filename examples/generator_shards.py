"""Generator training over data larger than one batch: ``.npy`` shards streamed from disk,
augmented differently every epoch, with a validation generator and callbacks.

    python examples/generator_shards.py              # writes shards of the digits set, trains
    python examples/generator_shards.py --quick      # two epochs

Only one shard is in memory at a time; the generator is a plain Python callable that
returns one batch per call and ``None`` at the end of an epoch (after resetting itself).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import ortrain as ot
from ortrain.datasets import load_digits


def write_shards(directory: Path, x: np.ndarray, y: np.ndarray, rows_per_shard: int) -> list[Path]:
    paths = []
    for i, start in enumerate(range(0, len(y), rows_per_shard)):
        xp, yp = directory / f"x-{i:03d}.npy", directory / f"y-{i:03d}.npy"
        np.save(xp, x[start:start + rows_per_shard])
        np.save(yp, y[start:start + rows_per_shard])
        paths.append((xp, yp))
    return paths


def shard_batches(shards, batch_size: int, augment: bool, seed: int = 0):
    """A callable generator: one batch per call, ``None`` (after a reset) at the end of an epoch."""
    rng = np.random.default_rng(seed)
    state = {"shard": 0, "x": None, "y": None, "pos": 0}

    def next_batch():
        while True:
            if state["x"] is None:
                if state["shard"] == len(shards):
                    state["shard"] = 0  # reset for the next epoch, then end this one
                    return None
                xp, yp = shards[state["shard"]]
                order = rng.permutation(len(np.load(yp)))
                state.update(x=np.load(xp)[order], y=np.load(yp)[order], pos=0)
            start = state["pos"]
            if start + batch_size <= len(state["y"]):
                state["pos"] = start + batch_size
                xb, yb = state["x"][start:start + batch_size], state["y"][start:start + batch_size]
                if augment:  # new noise for every sample, and a random shift of -1, 0 or 1 pixel for each batch
                    images = xb.reshape(-1, 8, 8)
                    images = np.roll(images, rng.integers(-1, 2), axis=int(rng.integers(1, 3)))
                    xb = np.clip(images.reshape(-1, 64) + rng.normal(0, 0.05, xb.shape), 0, 1)
                return xb.astype(np.float32), yb
            state["x"] = None  # the shard's tail that does not fill a batch waits for next epoch's shuffle
            state["shard"] += 1

    return next_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="two epochs, for a smoke test")
    args = parser.parse_args()
    epochs = 2 if args.quick else args.epochs
    ot.set_seed(0)
    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    x_train, y_train, x_val, y_val = x[:1500], y[:1500], x[1500:], y[1500:]
    with tempfile.TemporaryDirectory() as tmp:
        shards = write_shards(Path(tmp), x_train, y_train, rows_per_shard=250)
        model = ot.Sequential([ot.layers.Dense(64, activation="relu"), ot.layers.Dense(10)], input_shape=(64,),
                              seed=0)
        model.compile(optimizer=ot.optim.Adam(lr=3e-3),
                      loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        val_batches = [(x_val[i:i + 32], y_val[i:i + 32]) for i in range(0, len(y_val) - 31, 32)]
        history = ot.fit_generator(
            model, shard_batches(shards, 32, augment=True), epochs=epochs, validation_generator=val_batches,
            callbacks=[ot.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2),
                       ot.callbacks.EarlyStopping(monitor="val_loss", patience=4, restore_best_weights=True)],
            verbose=2)
    print(f"epochs run: {len(history.epoch)}  final val_accuracy: {history.history['val_accuracy'][-1]:.4f}  "
          f"held-out accuracy: {model.evaluate(x_val, y_val)['accuracy']:.4f}")


if __name__ == "__main__":
    main()
