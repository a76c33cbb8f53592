"""Deployment: serve an ortrain-exported model with nothing but onnxruntime and numpy.

    python examples/deploy_onnxruntime.py                 # trains a digits model, exports, serves it
    python examples/deploy_onnxruntime.py --model m.onnx  # serves an existing export (ortrain not needed)

The serving half below imports only ``onnxruntime`` and ``numpy``: it runs unchanged with
the stock ``onnxruntime`` package (``pip install onnxruntime``) on a machine without ortrain.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def serve(model_path: str, images: np.ndarray) -> np.ndarray:
    """Class predictions from an exported model, as a deployment would compute them."""
    import onnxruntime as ort

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    logits = session.run(None, {name: images.astype(np.float32)})[0]
    return logits.argmax(axis=1)


def train_and_export(directory: Path) -> tuple[str, np.ndarray, np.ndarray]:
    import ortrain as ot
    from ortrain.datasets import load_digits

    ot.set_seed(0)
    x, y = load_digits()
    model = ot.Sequential([ot.layers.Dense(64, activation="relu"), ot.layers.Dense(10)], input_shape=(64,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=3e-3), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:1500], y[:1500], batch_size=32, epochs=10, verbose=0)
    path = model.export_onnx(directory / "digits.onnx")
    expected = model.predict(x[1500:]).argmax(axis=1)
    return path, x[1500:], np.stack([y[1500:], expected])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an exported .onnx file taking (batch, 64) digit images")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            from numpy.random import default_rng
            path, images, reference = args.model, default_rng(0).random((8, 64)), None
        else:
            path, images, reference = train_and_export(Path(tmp))
        start = time.perf_counter()
        predicted = serve(path, images)
        ms = (time.perf_counter() - start) * 1e3
        print(f"served {len(images)} images in {ms:.1f} ms (session creation included)")
        if reference is not None:
            labels, ortrain_classes = reference
            assert np.array_equal(predicted, ortrain_classes), "onnxruntime disagrees with ortrain"
            print(f"onnxruntime matches ortrain on every image; accuracy {np.mean(predicted == labels):.4f}")
        else:
            print("predicted classes:", predicted.tolist())


if __name__ == "__main__":
    main()
