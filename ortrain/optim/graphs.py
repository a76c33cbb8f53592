"""Update graphs for onnxruntime-training's ``Optimizer`` (pure builders).

The library's ``Optimizer`` accepts a graph whose inputs are, in this order,
``learning_rate, step, params, gradients, first_order_moments`` (and
``second_order_moments`` for Adam); the tensors arrive as sequences. ortrain
writes these graphs itself so it can pick the update rule: ``adam_mode=0`` is
PyTorch's AdamW (bias correction on both moments, decay before the update),
whereas the library's own builder uses the Hugging Face variant.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortrain.graph import MS_DOMAIN, finish_model


def _common_inputs() -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("step", TensorProto.INT64, [1]),
        helper.make_tensor_sequence_value_info("params", TensorProto.FLOAT, None),
        helper.make_tensor_sequence_value_info("gradients", TensorProto.FLOAT, None),
        helper.make_tensor_sequence_value_info("first_order_moments", TensorProto.FLOAT, None),
    ]


def adamw_graph(betas: tuple[float, float], eps: float, weight_decay: float) -> onnx.ModelProto:
    """Adam with decoupled weight decay, exactly as ``torch.optim.AdamW`` (``Adam`` when decay is 0)."""
    inputs = _common_inputs() + [
        helper.make_tensor_sequence_value_info("second_order_moments", TensorProto.FLOAT, None)]
    node = helper.make_node(
        "AdamWOptimizer",
        ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"],
        ["updated_flag"], name="AdamW", domain=MS_DOMAIN,
        alpha=float(betas[0]), beta=float(betas[1]), epsilon=float(eps),
        weight_decay=float(weight_decay), correct_bias=1, adam_mode=0)
    graph = helper.make_graph([node], "adamw", inputs,
                              [helper.make_tensor_value_info("updated_flag", TensorProto.BOOL, [1])])
    return finish_model(graph, extra_domains=[MS_DOMAIN])


def sgd_graph(weight_decay: float = 0.0, momentum: float = 0.0) -> onnx.ModelProto:
    """SGD as ``torch.optim.SGD`` (no dampening, no Nesterov): ``w -= lr * g`` without momentum.

    With ``weight_decay`` each gradient gets ``weight_decay * w`` added first (``SequenceMap``),
    so ``w -= lr * (g + weight_decay * w)``: without momentum that is both PyTorch's coupled
    decay and Keras' decoupled one, ``w * (1 - lr * weight_decay) - lr * g``. The library's
    ``SGDOptimizerV2`` updates the weights in place.

    With ``momentum`` (PyTorch's ``buf = momentum * buf + g; w -= lr * buf``) the update is the
    library's ``AdamWOptimizer`` turned into SGD, as its ``SGDOptimizerV2`` keeps no velocity: its
    first moment ``m = momentum * m + (1 - momentum) * g`` is ``(1 - momentum) * buf``, its second
    moment stays 0 (``beta = 1``), and without bias correction it moves the weights by
    ``lr * m / (sqrt(0) + epsilon)``, which is ``lr * buf`` with ``epsilon = 1 - momentum``."""
    gradients = "gradients"
    nodes = []
    if weight_decay:
        body = helper.make_graph(
            [helper.make_node("Mul", ["w", "decay"], ["w_decay"]), helper.make_node("Add", ["g", "w_decay"], ["g_decay"])],
            "decayed_gradient",
            [helper.make_tensor_value_info("w", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("g", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("g_decay", TensorProto.FLOAT, None)],
            [helper.make_tensor("decay", TensorProto.FLOAT, [], [float(weight_decay)])])
        gradients = "decayed_gradients"
        nodes.append(helper.make_node("SequenceMap", ["params", "gradients"], [gradients], name="WeightDecay",
                                      body=body))
    inputs = _common_inputs()
    if momentum:
        # (1 - momentum) as the kernel computes it from its float32 attribute, so m / epsilon is buf
        kept = float(np.float32(1.0) - np.float32(momentum))
        inputs.append(helper.make_tensor_sequence_value_info("second_order_moments", TensorProto.FLOAT, None))
        nodes.append(helper.make_node(
            "AdamWOptimizer",
            ["learning_rate", "step", "params", gradients, "first_order_moments", "second_order_moments"],
            ["updated_flag"], name="SGDMomentum", domain=MS_DOMAIN,
            alpha=float(momentum), beta=1.0, epsilon=kept, weight_decay=0.0, correct_bias=0, adam_mode=1))
    else:
        nodes.append(helper.make_node("SGDOptimizerV2", ["learning_rate", "params", gradients], ["updated_flag"],
                                      name="SGD", domain=MS_DOMAIN))
    graph = helper.make_graph(nodes, "sgd", inputs,
                              [helper.make_tensor_value_info("updated_flag", TensorProto.BOOL, [1])])
    return finish_model(graph, extra_domains=[MS_DOMAIN])
