"""Training-only graph rewrites compute the same values (onnx's reference evaluator as the judge)."""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import ortrain as ot
from ortrain.graph.passes import average_pool_as_conv, for_training, relu_as_mask


def one_node_model(op, attrs, shape):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, [None] * len(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def same_values(model, rewritten, x, **tol):
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ReferenceEvaluator(rewritten).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, **tol)
    onnx.checker.check_model(rewritten)


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")
def test_relu_as_mask(rng):
    model = one_node_model("Relu", {}, [None, 7])
    rewritten = relu_as_mask(model)
    assert [n.op_type for n in rewritten.graph.node] == ["Greater", "Cast", "Mul"]
    x = rng.standard_normal((5, 7)).astype(np.float32)
    x[0, :3] = [0.0, np.inf, 1e-30]
    same_values(model, rewritten, x, rtol=0, atol=0)
    # The one difference, documented: -inf times a zero mask is NaN where Relu gives 0.
    x[0, 0] = -np.inf
    assert np.isnan(ReferenceEvaluator(rewritten).run(None, {"x": x})[0][0, 0])


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0]},
])
def test_average_pool_as_depthwise_conv(rng, attrs):
    model = one_node_model("AveragePool", attrs, [None, 3, 9, 8])
    rewritten = average_pool_as_conv(model)
    assert "AveragePool" not in [n.op_type for n in rewritten.graph.node]
    same_values(model, rewritten, rng.standard_normal((2, 3, 9, 8)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_exported_models_keep_the_original_ops(tmp_path):
    model = ot.Sequential([ot.layers.Conv2D(2, 3, activation="relu"), ot.layers.AvgPool2D(2),
                           ot.layers.Flatten(), ot.layers.Dense(2)], input_shape=(1, 6, 6), seed=0)
    model.compile(optimizer="adam", loss="mse")
    ops = {n.op_type for n in onnx.load(model.export_onnx(tmp_path / "m.onnx")).graph.node}
    assert {"Relu", "AveragePool"} <= ops
    art = ot.artifacts.build(model)
    trained_ops = {n.op_type for n in onnx.load(art.training).graph.node}
    assert "ReluGrad" not in trained_ops and "AveragePoolGrad" not in trained_ops
    rewritten = {n.op_type for n in for_training(onnx.load(art.forward)).graph.node}
    assert "Relu" not in rewritten and "AveragePool" not in rewritten


def test_rewrites_leave_other_graphs_alone():
    model = one_node_model("Sigmoid", {}, [None, 3])
    assert relu_as_mask(model) is model and average_pool_as_conv(model) is model
