"""Training-only graph rewrites compute the same values (onnx's reference evaluator as the judge)."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ortrain as ot
from ortrain.graph.gradient_forms import for_training, gradient_forms
from ortrain.graph.passes import (
    BATCH_DIM,
    average_pool_as_conv,
    bias_grad_as_matmul,
    name_batch_dimension,
    relu_grad_as_mask,
)


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


def _relu_grad_model():
    node = helper.make_node("ReluGrad", ["dy", "v"], ["dx"], domain="com.microsoft")
    inputs = [helper.make_tensor_value_info(n, 1, [None, 9]) for n in ("dy", "v")]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("dx", 1, [None, 9])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply")
def test_relu_grad_as_mask(rng):
    """The rewrite gives dy where v > 0 and zero elsewhere, as onnxruntime's ReluGrad does, down to
    subnormals and infinities; judged by numpy and by the runtime's own kernel."""
    import onnxruntime as ort

    from ortrain.engine._runtime import C  # noqa: F401  (the training build, which has ReluGrad)
    model = _relu_grad_model()
    assert relu_grad_as_mask(model, {"dy"}) is model  # v is not known to be float32
    rewritten = relu_grad_as_mask(model, {"v"})
    assert [n.op_type for n in rewritten.graph.node] == ["Mul", "Mul", "Clip", "Mul"]
    onnx.checker.check_model(rewritten, full_check=True)
    dy = rng.standard_normal((4, 9)).astype(np.float32)
    v = rng.standard_normal((4, 9)).astype(np.float32)
    tiny = np.float32(2.0 ** -149)
    v[0] = [0.0, -0.0, tiny, -tiny, np.inf, -np.inf, np.finfo(np.float32).max, 1e-38, -1e-38]
    want = np.where(v > 0, dy, np.float32(0))
    got = ReferenceEvaluator(rewritten).run(None, {"dy": dy, "v": v})[0]
    np.testing.assert_array_equal(np.abs(got), np.abs(want))  # zeros may carry a sign
    kernel = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(np.abs(kernel.run(None, {"dy": dy, "v": v})[0]), np.abs(got))


def test_training_graphs_have_no_relu_grad_kernel():
    model = ot.Sequential([ot.layers.Conv2D(2, 3), ot.layers.BatchNorm(), ot.layers.Activation("relu"),
                           ot.layers.Flatten(), ot.layers.Dense(3, activation="relu"), ot.layers.Dense(2)],
                          input_shape=(1, 6, 6), seed=0)
    model.compile(optimizer="adam", loss="mse")
    ops = [n.op_type for n in onnx.load(ot.artifacts.build(model).training).graph.node]
    assert ops.count("Relu") == 2 and "ReluGrad" not in ops and ops.count("Clip") == 2, ops


POOLS = [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0]},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [3, 3], "strides": [1, 1], "auto_pad": "VALID"},
]


@pytest.mark.parametrize("attrs", POOLS)
def test_average_pool_as_depthwise_conv(rng, attrs):
    """Judged by onnxruntime itself: the rewrite must match the AveragePool the runtime runs."""
    import onnxruntime as ort
    model = one_node_model("AveragePool", attrs, [None, 3, 9, 8])
    rewritten = average_pool_as_conv(model)
    assert "AveragePool" not in [n.op_type for n in rewritten.graph.node]
    onnx.checker.check_model(rewritten)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for m in (model, rewritten)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-6)


def _numpy_average_pool(x, k, s, p, cip):
    """Square windows; a window with no cell of the input is 0. Divisor: the real cells, or the
    whole kernel with count_include_pad."""
    def windows(size):
        out = -(-(size + 2 * p - k) // s) + 1  # ceil_mode, no window dropped (as onnxruntime 1.19.2)
        return [(max(o * s - p, 0), min(o * s - p + k, size)) for o in range(out)]
    rows, cols = windows(x.shape[2]), windows(x.shape[3])
    y = np.zeros(x.shape[:2] + (len(rows), len(cols)))
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            if r1 > r0 and c1 > c0:
                div = k * k if cip else (r1 - r0) * (c1 - c0)
                y[:, :, i, j] = x[:, :, r0:r1, c0:c1].sum(axis=(2, 3)) / div
    return y


@pytest.mark.parametrize("k, s, p, cip", [(2, 2, 1, 0), (2, 2, 1, 1), (3, 3, 1, 0)])
def test_ceil_mode_average_pool_keeps_the_runtimes_last_windows(rng, k, s, p, cip):
    """Last windows that start past the input: onnxruntime keeps them (PyTorch drops them), so the
    training graph must too, or its shapes differ from the model's; their value is 0."""
    import onnxruntime as ort
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "ceil_mode": 1, "count_include_pad": cip}
    model = one_node_model("AveragePool", attrs, [None, 3, 9, 8])
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    rewritten = average_pool_as_conv(model)
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == runtime.shape
    np.testing.assert_allclose(got, _numpy_average_pool(x.astype(np.float64), k, s, p, cip), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [2]}, {"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
                                   {"kernel_shape": [3], "strides": [2], "pads": [1, 0], "count_include_pad": 1,
                                    "ceil_mode": 1}])
def test_a_1d_average_pool_is_the_2d_rewrite_over_a_height_of_one(rng, attrs):
    import onnxruntime as ort
    model = one_node_model("AveragePool", attrs, [None, 3, 9])
    x = rng.standard_normal((2, 3, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    rewritten = average_pool_as_conv(model)
    assert "AveragePool" not in {n.op_type for n in rewritten.graph.node}
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_average_pools_the_rewrite_cannot_express_are_refused():
    model = one_node_model("AveragePool", {"kernel_shape": [2, 2, 2]}, [None, 3, 4, 4, 4])
    with pytest.raises(ot.UnsupportedOpError, match="AveragePool node .*1-D and 2-D average pools, this one is 3-D"):
        average_pool_as_conv(model)


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
    assert "AveragePool" not in rewritten


def test_rewrites_leave_other_graphs_alone():
    model = one_node_model("Sigmoid", {}, [None, 3])
    assert average_pool_as_conv(model) is model
    assert bias_grad_as_matmul(model) is model and relu_grad_as_mask(model, {"x", "y"}) is model
    fixed = one_node_model("Sigmoid", {}, [4, 3])
    assert name_batch_dimension(fixed) is fixed


def _dims(vi):
    return [d.dim_param or d.dim_value or None for d in vi.type.tensor_type.shape.dim]


def test_name_batch_dimension():
    x = helper.make_tensor_value_info("x", 1, [None, 3])
    named = helper.make_tensor_value_info("n", 1, ["rows", 3])
    fixed = helper.make_tensor_value_info("f", 1, [2, 3])
    scalar = helper.make_tensor_value_info("s", 1, [])
    graph = helper.make_graph([helper.make_node("Sum", ["x", "n", "f", "s"], ["y"])], "g", [x, named, fixed, scalar],
                              [helper.make_tensor_value_info("y", 1, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = name_batch_dimension(model)
    assert [_dims(vi) for vi in out.graph.input] == [[BATCH_DIM, 3], ["rows", 3], [2, 3], []]
    assert _dims(out.graph.output[0]) == [None, 3]  # outputs are the model's own business
    assert _dims(model.graph.input[0]) == [None, 3]  # the input model is left alone


def test_named_batch_gives_plain_elementwise_gradients():
    """With the batch named, the gradient builder sees that an elementwise product's operands have
    one shape and emits no run-time broadcast reduction (a full copy of the gradient)."""
    model = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(2)], input_shape=(4,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    ops = [n.op_type for n in onnx.load(ot.artifacts.build(model).training).graph.node]
    assert "BroadcastGradientArgs" not in ops and "ReduceSum" not in ops, ops
    assert ops.count("MatMul") == 2  # the two bias gradients, as one-row products


def test_bias_grad_as_matmul_leaves_other_types_alone():
    from onnx import numpy_helper
    w = numpy_helper.from_array(np.ones((5, 3)), "w")  # float64: the Gemm and its operands are double
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"]), helper.make_node("ReduceSum", ["x", "axes"], ["cols"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, ["batch", 5])],
                              [helper.make_tensor_value_info("cols", onnx.TensorProto.DOUBLE, [1, 5])], [w, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert bias_grad_as_matmul(model) is model


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axis", [0, -2])
def test_bias_grad_as_matmul(rng, keepdims, axis):
    from onnx import numpy_helper
    w = numpy_helper.from_array(rng.standard_normal((5, 3)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([axis], np.int64), "axes")
    other = numpy_helper.from_array(np.array([1], np.int64), "axes1")
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["cols"], keepdims=keepdims),
             helper.make_node("ReduceSum", ["x", "axes1"], ["rows"], keepdims=keepdims),  # not a column sum
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["free"], keepdims=keepdims)]  # no Gemm reads r
    cols, rows = ([1, 5], ["batch", 1]) if keepdims else ([5], ["batch"])
    outs = [helper.make_tensor_value_info(n, 1, shape)
            for n, shape in (("g", ["batch", 3]), ("cols", cols), ("rows", rows), ("free", cols))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["batch", 5])], outs, [w, axes, other])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = bias_grad_as_matmul(model)
    assert [n.op_type for n in out.graph.node].count("ReduceSum") == 2
    assert "MatMul" in [n.op_type for n in out.graph.node]
    onnx.checker.check_model(out, full_check=True)
    for rows in (7, 1):
        x = rng.standard_normal((rows, 5)).astype(np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x})
        got = ReferenceEvaluator(out).run(None, {"x": x})
        np.testing.assert_allclose(got[1], x.sum(axis=0, keepdims=bool(keepdims)), rtol=1e-6, atol=1e-6)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_imported_ceil_mode_average_pool_trains(rng, tmp_path):
    """A torch AvgPool2d(ceil_mode=True) export used to kill the process in the first step."""
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32) * 0.3
    k = rng.standard_normal((4 * 3 * 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("MatMul", ["f", "k"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", 2, 5, 5])],
                              [helper.make_tensor_value_info("y", 1, ["N", 3])],
                              [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(k, "k")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = ot.from_onnx(proto)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = rng.standard_normal((4, 2, 5, 5)).astype(np.float32)
    y = rng.standard_normal((4, 3)).astype(np.float32)
    with ot.Trainer(model, batch_size=4) as tr:
        loss = tr.step(x, y)
    np.testing.assert_allclose(loss, np.mean((model.predict(x) - y) ** 2), rtol=1e-5)


def test_where_operands_are_widened_only_where_a_gradient_may_be_broadcast():
    """masked_fill on scores (a constant mask and fill value, scores of the result's shape) needs
    no Expand; a weight of shape (m,) picked by the mask does (its gradient sums over the batch)."""
    def where_model(value):
        nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
                 helper.make_node("Where", ["mask", value, "fill"], ["y"])]
        inits = [numpy_helper.from_array(np.ones((1, 4), bool), "mask"),
                 numpy_helper.from_array(np.array(-1e4, np.float32), "fill")]
        inputs = [helper.make_tensor_value_info("x", 1, ["N", 4]), helper.make_tensor_value_info("w", 1, [4])]
        graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", 1, ["N", 4])], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    masked = where_model("h")
    assert gradient_forms(masked) is masked
    widened = gradient_forms(where_model("w"))
    assert [n.op_type for n in widened.graph.node].count("Expand") == 2   # over the mask's shape, then the fill's


@pytest.mark.parametrize("op, attrs, dtype", [
    (op, attrs, dtype) for op, attrs in [("Add", {}), ("Sub", {}), ("Mul", {}), ("Div", {}), ("Mod", {}),
                                         ("Mod", {"fmod": 1}), ("Neg", {})]
    for dtype in (np.int64, np.int32, np.float32) if not (op == "Mod" and not attrs and dtype is np.float32)])
def test_small_constants_are_folded_as_onnxruntime_computes_them(op, attrs, dtype):
    # the folder feeds onnx's shape inference (a TorchScript unflatten's sizes come through a Mod): an integer
    # Div truncates and Mod takes the divisor's sign, as onnxruntime's kernels do (ONNX takes fmod=0 for
    # integers only)
    import onnxruntime as ort

    from ortrain.graph.passes import _fold
    a = np.array([7, -7, 6, -6, 0, 5], dtype)
    b = np.array([2, 2, -4, -4, 3, -3], dtype)
    inputs = ["a"] if op == "Neg" else ["a", "b"]
    node = helper.make_node(op, inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(
        np.dtype(dtype)), None)], [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    want = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {})[0]
    got = _fold(node, [a] if op == "Neg" else [a, b])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert _fold(helper.make_node("Div", ["a", "b"], ["y"]), [a, np.zeros_like(b)]) is None  # left to the runtime


def test_a_pads_amount_from_one_output_of_a_split_is_not_folded_into_another():
    # the Pad's amounts were folded into a Constant named after the producer's first output, which then
    # held the wrong part, and nothing wrote the Pad's own any more
    from ortrain.graph.passes import _small_constants_folded
    parts = numpy_helper.from_array(np.array([-1, 6, 0, 1, 0, 1], np.int64), "all")
    sizes = numpy_helper.from_array(np.array([2, 4], np.int64), "sizes")
    g = helper.make_graph([helper.make_node("Split", ["all", "sizes"], ["p0", "p1"], axis=0),
                           helper.make_node("Pad", ["x", "p1"], ["y"], mode="reflect")], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [parts, sizes])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    folded = _small_constants_folded(proto)
    producers = {o: n for n in folded.graph.node for o in n.output}
    assert {"p0", "p1", "y"} <= set(producers)
    for name, want in (("p0", [-1, 6]), ("p1", [0, 1, 0, 1])):
        if producers[name].op_type == "Constant":
            assert numpy_helper.to_array(producers[name].attribute[0].t).tolist() == want
