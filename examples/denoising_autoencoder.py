"""A convolutional denoising autoencoder: noisy 8x8 digits in, clean digits out.

    python examples/denoising_autoencoder.py            # 30 epochs on the bundled digits set
    python examples/denoising_autoencoder.py --quick    # 5 epochs

The encoder halves the image with a strided ``Conv2D``; the decoder brings it back with
``Conv2DTranspose`` and refines it after an ``UpSampling2D`` path joined by ``Add``. The script
prints the held-out reconstruction error against the error of the noisy input itself, exports
the trained model and checks that a plain onnxruntime ``InferenceSession`` gives the same
reconstructions.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import ortrain as ot
from ortrain.datasets import load_digits


def build(seed: int = 0) -> ot.Model:
    inp = ot.Input((1, 8, 8))
    h = ot.layers.Conv2D(16, 3, padding="same", activation="relu", seed=seed)(inp)
    code = ot.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", seed=seed + 1)(h)   # 4x4
    up = ot.layers.Conv2DTranspose(16, 4, strides=2, padding="same", activation="relu", seed=seed + 2)(code)
    skip = ot.layers.Conv2D(16, 1, seed=seed + 3)(ot.layers.UpSampling2D(2, interpolation="bilinear")(code))
    out = ot.layers.Conv2D(1, 3, padding="same", activation="sigmoid", seed=seed + 4)(ot.layers.Add()([up, skip]))
    return ot.Model(inp, out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="5 epochs")
    args = parser.parse_args(argv)
    epochs = 5 if args.quick else args.epochs

    images, _ = load_digits(flatten=False)
    clean = images  # (1797, 1, 8, 8), pixels in [0, 1]
    rng = np.random.default_rng(0)
    noisy = np.clip(clean + rng.normal(0.0, 0.3, clean.shape), 0.0, 1.0).astype(np.float32)
    n_test = len(clean) // 5
    x_train, y_train, x_test, y_test = noisy[n_test:], clean[n_test:], noisy[:n_test], clean[:n_test]

    model = build()
    model.compile(optimizer=ot.optim.Adam(lr=3e-3), loss="mse")
    model.fit(x_train, y_train, batch_size=64, epochs=epochs, validation_split=0.1, verbose=2)
    error = model.evaluate(x_test, y_test)["loss"]
    noise = float(np.mean((x_test - y_test) ** 2))
    print(f"held-out reconstruction error {error:.4f}, the noisy input's {noise:.4f}: {noise / error:.1f} times lower")

    import onnxruntime as ort
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "denoiser.onnx"
        model.export_onnx(path)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        served = session.run(None, {session.get_inputs()[0].name: x_test})[0]
    gap = float(np.abs(served - model.predict(x_test)).max())
    print(f"the exported model in a plain InferenceSession matches (max |diff| {gap:.1e})")


if __name__ == "__main__":
    main()
