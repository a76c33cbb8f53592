"""ortrain: train models on ONNX Runtime.

Describe a model once (Keras-style layers, traced functions, or any ``.onnx``
file), turn it offline into training artifacts, and train it with onnxruntime-training
through a ``Trainer`` you step yourself, ``fit``/``fit_generator`` epoch loops, or a
captured training step.
"""

# The engine checks the environment on import (onnx pin, training build of onnxruntime).
from ortrain import (  # noqa: E402
    ag,  # noqa: E402
    artifacts,
    callbacks,  # noqa: E402
    engine,  # noqa: E402,I001
    layers,
    losses,
    metrics,
    optim,
)
from ortrain._random import set_seed  # noqa: E402
from ortrain._version import __version__
from ortrain.capture import capture, capture_step  # noqa: E402
from ortrain.engine import get_num_threads, set_num_threads  # noqa: E402
from ortrain.errors import FreedError, NonFiniteError, OrtrainError, ShapeError, UnsupportedOpError
from ortrain.fit import fit_generator  # noqa: E402
from ortrain.history import History  # noqa: E402
from ortrain.nn import GraphModel, Input, Model, Sequential, from_onnx, load_model  # noqa: E402
from ortrain.trainer import Snapshot, Trainer  # noqa: E402

__all__ = [
    "FreedError",
    "GraphModel",
    "History",
    "Input",
    "Model",
    "NonFiniteError",
    "OrtrainError",
    "Sequential",
    "ShapeError",
    "Snapshot",
    "Trainer",
    "UnsupportedOpError",
    "__version__",
    "ag",
    "artifacts",
    "capture",
    "capture_step",
    "callbacks",
    "engine",
    "fit_generator",
    "from_onnx",
    "get_num_threads",
    "layers",
    "load_model",
    "losses",
    "metrics",
    "optim",
    "set_num_threads",
    "set_seed",
]
