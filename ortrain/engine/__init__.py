"""The only part of ortrain that imports onnxruntime-training.

Importing it checks the environment (onnx pinned below 1.18, the training build of
onnxruntime rather than the plain one) and raises :class:`ortrain.OrtrainError`
with the command that fixes the problem.
"""

from ortrain.engine._runtime import ORT_VERSION, environment_problems
from ortrain.engine.checkpoint import CheckpointData, OptimizerState, read_checkpoint, write_checkpoint
from ortrain.engine.device import (
    Device,
    available_providers,
    default_threads,
    get_num_threads,
    parse_device,
    set_num_threads,
)
from ortrain.engine.gradients import build_training_graphs, write_initial_checkpoint
from ortrain.engine.inference import InferenceRunner, run_model
from ortrain.engine.session import TrainingSession, check_feeds

__all__ = [
    "ORT_VERSION",
    "CheckpointData",
    "Device",
    "InferenceRunner",
    "OptimizerState",
    "TrainingSession",
    "available_providers",
    "build_training_graphs",
    "check_feeds",
    "default_threads",
    "environment_problems",
    "get_num_threads",
    "parse_device",
    "read_checkpoint",
    "run_model",
    "set_num_threads",
    "write_checkpoint",
    "write_initial_checkpoint",
]
