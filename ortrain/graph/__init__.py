"""Pure ONNX graph building: descriptions in, ``onnx.ModelProto`` out.

Nothing in this package holds runtime state or imports onnxruntime. Every model
ortrain writes goes through :func:`finish_model`, which pins the opset and the
IR version onnxruntime-training 1.19.2 can read, and runs ``onnx.checker``.
"""

from ortrain.graph.builder import (
    IR_VERSION,
    MS_DOMAIN,
    OPSET,
    GraphBuilder,
    TensorSpec,
    check_model,
    finish_model,
    np_dtype,
    onnx_dtype,
    spec_of,
)

__all__ = [
    "IR_VERSION",
    "MS_DOMAIN",
    "OPSET",
    "GraphBuilder",
    "TensorSpec",
    "check_model",
    "finish_model",
    "np_dtype",
    "onnx_dtype",
    "spec_of",
]
