"""Export-then-train: a PyTorch model exported with ``torch.onnx.export``, trained by ortrain,
exported again and served by a plain onnxruntime ``InferenceSession``.

    python examples/export_then_train.py            # 20 epochs on the bundled digits set
    python examples/export_then_train.py --quick    # 3 epochs

Needs ``torch`` and ``onnxscript`` (torch's ONNX exporter) only for the first step: the
exported file is all ortrain needs, so training runs where PyTorch is not installed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np


def torch_model(seed: int = 0):
    """A small convolutional network for 8x8 digit images given as rows of 64 pixels."""
    import torch
    from torch import nn

    class DigitsCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, kernel_size=3, padding=1)
            self.fc = nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            x = x.reshape(-1, 1, 8, 8)
            x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
            return self.fc(x.flatten(1))

    torch.manual_seed(seed)
    return DigitsCNN().eval()


def export_torch_model(path, seed: int = 0):
    """Export :func:`torch_model` to ``path`` with a free batch axis; returns the module."""
    import torch

    # The exporter logs a warning per torchvision op it cannot register; this model uses none.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    module = torch_model(seed)
    with warnings.catch_warnings():
        # torch.export's internals emit FutureWarnings that say nothing about this model.
        warnings.simplefilter("ignore", FutureWarning)
        # dynamo's default optimize=True is safe here: nothing in this network can be merged or
        # folded (no batch norm, no equal tensors). For networks with them, see the README.
        program = torch.onnx.export(module, (torch.zeros(4, 64),), dynamo=True, input_names=["pixels"],
                                    output_names=["logits"], dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                                    verbose=False)
    program.save(str(path))
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 epochs, for a smoke test")
    args = parser.parse_args()
    try:
        import onnxscript  # noqa: F401 - torch.onnx.export(dynamo=True) needs it
        import torch
    except ImportError as exc:
        print(f"skipped: this example exports a PyTorch model and needs {exc.name} (pip install torch onnxscript)",
              file=sys.stderr)
        return 0
    import onnxruntime

    import ortrain as ot
    from ortrain.datasets import load_digits

    ot.set_seed(0)
    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(y))
    x_train, y_train, x_test, y_test = x[order[:1500]], y[order[:1500]], x[order[1500:]], y[order[1500:]]
    with tempfile.TemporaryDirectory() as tmp:
        module = export_torch_model(Path(tmp) / "torch_cnn.onnx")
        model = ot.from_onnx(Path(tmp) / "torch_cnn.onnx")
        with torch.no_grad():
            reference = module(torch.from_numpy(x_test)).numpy()
        diff = float(np.max(np.abs(model.predict(x_test) - reference)))
        print(f"imported {len(model.weight_names())} weights ({', '.join(model.weight_names())}); "
              f"max |ortrain - torch| before training: {diff:.1e}")

        model.compile(optimizer=ot.optim.Adam(lr=3e-3),
                      loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        model.fit(x_train, y_train, batch_size=32, epochs=3 if args.quick else args.epochs, verbose=2)
        accuracy = model.evaluate(x_test, y_test)["accuracy"]

        path = model.export_onnx(Path(tmp) / "digits_cnn.onnx")
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        served = session.run(None, {session.get_inputs()[0].name: x_test})[0]
        diff = float(np.max(np.abs(served - model.predict(x_test))))
        if diff > 1e-4:
            print(f"the exported model disagrees with ortrain: max |diff| {diff:.1e}", file=sys.stderr)
            return 1
        print(f"test accuracy {accuracy:.4f}; the exported model in a plain InferenceSession matches "
              f"(max |diff| {diff:.1e}, accuracy {np.mean(served.argmax(1) == y_test):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
