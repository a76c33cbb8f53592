"""ortrain: train models on ONNX Runtime.

Describe a model once (Keras-style layers, traced functions, or any ``.onnx``
file), turn it offline into training artifacts, and train it with onnxruntime-training
through a ``Trainer`` you step yourself, ``fit``/``fit_generator`` epoch loops, or a
captured training step.
"""

# Importing the engine (which every module below does) checks the environment: onnx pinned
# below 1.18, the training build of onnxruntime; a problem is an OrtrainError naming the fix.
from ortrain._cli_start import one_line_for_the_command_line as _one_line_for_the_command_line

with _one_line_for_the_command_line():
    from ortrain import ag, artifacts, callbacks, datasets, engine, layers, losses, metrics, optim
from ortrain._random import set_seed
from ortrain._version import __version__
from ortrain.capture import capture, capture_step
from ortrain.engine import get_num_threads, set_num_threads
from ortrain.errors import FreedError, NonFiniteError, OrtrainError, ShapeError, UnsupportedOpError
from ortrain.fit import fit_generator
from ortrain.history import History
from ortrain.nn import GraphModel, Input, Model, Sequential, from_onnx, load_model
from ortrain.trainer import Snapshot, Trainer

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
    "datasets",
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
