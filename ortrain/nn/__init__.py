"""Models and layers."""

from ortrain.nn.graph_model import GraphModel
from ortrain.nn.model import Input, Model, Sequential
from ortrain.nn.onnx_import import from_onnx
from ortrain.nn.saving import load_model

__all__ = ["GraphModel", "Input", "Model", "Sequential", "from_onnx", "load_model"]
