"""The scalar arithmetic of training graphs folded (ortrain.graph.scalar_folds): each rewrite on small
graphs written as the gradient builder writes them, run by onnxruntime before and after (equal
values, and the shapes that decide a broadcast kept where a fold would change them), and the
captured step's whole graph against a numpy gradient."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortrain as ot
from ortrain import ag
from ortrain.engine._runtime import C  # noqa: F401  (the training build: its Scale kernel runs the originals)
from ortrain.graph.scalar_folds import scalars_folded

F, D, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _ops(model):
    return [n.op_type for n in model.graph.node]


def _folded_alike(model, feeds, exact=True):
    """The folded model, after checking that onnxruntime computes the same from both (bit for bit
    where ``exact``), shapes included."""
    folded = scalars_folded(model)
    for before, after in zip(_run(model, feeds), _run(folded, feeds), strict=True):
        assert before.shape == after.shape and before.dtype == after.dtype
        if exact:
            np.testing.assert_array_equal(after, before)
        else:
            np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6 * np.abs(before).max())
    return folded


def _mean_gradient(shape, n_scale):
    """The builder's gradient of ``mean(x)`` in double, cast back and times ``t``: ``Size``, ``Scale``,
    ``Expand`` to ``Shape(x)``, ``Cast``, ``Mul``."""
    nodes = [helper.make_node("Cast", ["x"], ["xd"], to=D),
             helper.make_node("Size", ["xd"], ["n"]),
             helper.make_node("Scale", ["g", "n"], ["scaled"], domain="com.microsoft", scale_down=1),
             helper.make_node("Shape", ["xd"], ["shape"], start=0),
             helper.make_node("Expand", ["scaled", "shape"], ["dx_d"]),
             helper.make_node("Cast", ["dx_d"], ["dx"], to=F),
             helper.make_node("Mul", ["dx", "t"], ["out"])]
    return _model(nodes, [("x", F, shape), ("t", F, shape)], [("out", F)], [("g", np.array(n_scale, np.float64))])


@pytest.mark.parametrize("shape", [[3, 7], [16, 64]])
def test_a_static_mean_gradient_folds_to_one_product_by_a_constant(rng, shape):
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "t": rng.standard_normal(shape).astype(np.float32)}
    folded = _folded_alike(_mean_gradient(shape, 1.0), feeds)
    assert _ops(folded) == ["Mul"]
    # onnxruntime's Scale divides by the size in single precision: 1/21 as float32, not float64
    (factor,) = [numpy_helper.to_array(t) for t in folded.graph.initializer]
    assert factor == np.float32(np.float32(1) / np.float32(np.prod(shape)))


def test_a_free_batch_keeps_its_size_but_loses_the_expand(rng):
    folded = _folded_alike(_mean_gradient(["batch", 5], 2.0), {"x": np.ones((4, 5), np.float32),
                                                               "t": rng.standard_normal((4, 5)).astype(np.float32)})
    assert _ops(folded) == ["Cast", "Size", "Scale", "Cast", "Mul"]  # the scalar's arithmetic, no Expand or Shape


@pytest.mark.parametrize("down", [0, 1])
@pytest.mark.parametrize("x_type,scale", [(D, np.int64(3)), (D, np.int64(7)), (F, np.int64(12)), (D, np.float64(3.0)),
                                          (F, np.float32(0.1))])
def test_scale_folds_as_the_runtime_computes_it(x_type, scale, down):
    x = np.array(1.7, helper.tensor_dtype_to_np_dtype(x_type))
    model = _model([helper.make_node("Scale", ["x", "s"], ["y0"], domain="com.microsoft", scale_down=down),
                    helper.make_node("Neg", ["y0"], ["y1"]),
                    helper.make_node("Neg", ["y1"], ["y2"]),
                    helper.make_node("Add", ["v", "y2"], ["y"])],
                   [("v", x_type, [])], [("y", x_type)], [("x", x), ("s", scale)])
    folded = _folded_alike(model, {"v": np.array(0, x.dtype)})
    assert _ops(folded) == ["Add"]


def _expand_into(target, other_shape, op="Mul", between=()):
    """``op(chain(Expand(s, target)), other)`` with ``s`` one element, ``chain`` the unary ``between``."""
    nodes = [helper.make_node("Expand", ["s", "target"], ["e0"])]
    for k, unary in enumerate(between):
        nodes.append(helper.make_node(unary, [f"e{k}"], [f"e{k + 1}"], **({"to": F} if unary == "Cast" else {})))
    nodes.append(helper.make_node(op, ["other", f"e{len(between)}"], ["out"]))
    return _model(nodes, [("s", D if "Cast" in between else F, [1, 1]), ("other", F, other_shape)], [("out", F)],
                  [("target", np.array(target, np.int64))])


@pytest.mark.parametrize("op", ["Mul", "Div", "Add", "Sub"])
@pytest.mark.parametrize("between", [(), ("Cast",), ("Cast", "Neg", "Identity")])
def test_an_expand_the_broadcast_does_goes(rng, op, between):
    model = _expand_into([3, 4], [3, 4], op, between)
    feeds = {"s": np.full((1, 1), 0.75, np.float64 if "Cast" in between else np.float32),
             "other": rng.standard_normal((3, 4)).astype(np.float32)}
    assert "Expand" not in _ops(_folded_alike(model, feeds))


@pytest.mark.parametrize("target,other", [([3, 4], [4]),        # the Expand makes the rows
                                          ([2, 3, 4], [3, 4]),  # and here a leading axis
                                          ([3, 4], [1, 4])])    # the other operand is narrower
def test_an_expand_that_shapes_the_result_stays(rng, target, other):
    model = _expand_into(target, other)
    feeds = {"s": np.full((1, 1), 0.5, np.float32), "other": rng.standard_normal(other).astype(np.float32)}
    assert "Expand" in _ops(_folded_alike(model, feeds))


def test_an_expand_into_a_wider_expand_goes_then_the_wider_one_too(rng):
    nodes = [helper.make_node("Expand", ["s", "narrow"], ["e0"]),
             helper.make_node("Neg", ["e0"], ["e1"]),
             helper.make_node("Expand", ["e1", "wide"], ["e2"]),
             helper.make_node("Mul", ["e2", "t"], ["out"])]
    model = _model(nodes, [("s", F, []), ("t", F, [5, 3])], [("out", F)],
                   [("narrow", np.array([5, 1], np.int64)), ("wide", np.array([5, 3], np.int64))])
    folded = _folded_alike(model, {"s": np.array(2.5, np.float32), "t": rng.standard_normal((5, 3)).astype(np.float32)})
    assert _ops(folded) == ["Neg", "Mul"]


def test_a_value_the_graph_returns_or_two_nodes_read_keeps_its_expand(rng):
    nodes = [helper.make_node("Expand", ["s", "target"], ["e"]),
             helper.make_node("Mul", ["e", "t"], ["out"]),
             helper.make_node("Add", ["e", "t"], ["out2"])]
    model = _model(nodes, [("s", F, []), ("t", F, [2, 3])], [("out", F), ("out2", F), ("e", F)],
                   [("target", np.array([2, 3], np.int64))])
    folded = _folded_alike(model, {"s": np.array(2.0, np.float32), "t": rng.standard_normal((2, 3)).astype(np.float32)})
    assert _ops(folded).count("Expand") == 1


def test_a_doubled_product_and_its_constant_go_into_the_gemm_that_reads_it(rng):
    nodes = [helper.make_node("Mul", ["c", "t"], ["a"]),
             helper.make_node("Mul", ["t", "c"], ["a2"]),  # the builder writes the product once per operand
             helper.make_node("Sum", ["a", "a2"], ["s"]),
             helper.make_node("Gemm", ["s", "x"], ["out"], transB=1)]
    model = _model(nodes, [("t", F, [16, 64]), ("x", F, [32, 64])], [("out", F)], [("c", np.float32(0.3))])
    feeds = {"t": rng.standard_normal((16, 64)).astype(np.float32), "x": rng.standard_normal((32, 64)).astype(np.float32)}
    folded = _folded_alike(model, feeds, exact=False)
    assert _ops(folded) == ["Gemm"] and list(folded.graph.node[0].input) == ["t", "x"]
    assert helper.get_attribute_value(folded.graph.node[0].attribute[-1]) == pytest.approx(0.6)


def test_a_doubled_product_no_gemm_reads_stays_bit_for_bit(rng):
    # (2c) t rounds once where c t, doubled, rounded before: they differ where c t is subnormal
    nodes = [helper.make_node("Mul", ["c", "t"], ["a"]), helper.make_node("Sum", ["a", "a"], ["out"])]
    model = _model(nodes, [("t", F, [3])], [("out", F)], [("c", np.float32(2.0 ** -149))])
    folded = _folded_alike(model, {"t": np.array([1.5, 3.0, 1e30], np.float32)})
    assert _ops(folded) == ["Mul", "Sum"]


@pytest.mark.parametrize("operands", [["p", "p"], ["p", "w", "p"]])
def test_a_gemm_that_reads_a_scaled_operand_twice_keeps_it(rng, operands):
    nodes = [helper.make_node("Mul", ["t", "c"], ["p"]), helper.make_node("Gemm", operands, ["out"], transB=1)]
    model = _model(nodes, [("t", F, [4, 4]), ("w", F, [4, 4])], [("out", F)], [("c", np.float32(0.5))])
    feeds = {"t": rng.standard_normal((4, 4)).astype(np.float32), "w": rng.standard_normal((4, 4)).astype(np.float32)}
    assert _ops(_folded_alike(model, feeds)) == ["Mul", "Gemm"]


def test_an_initializer_the_caller_may_override_is_not_a_constant(rng):
    nodes = [helper.make_node("Mul", ["w", "two"], ["m"]), helper.make_node("Add", ["x", "m"], ["y"]),
             helper.make_node("Size", ["w"], ["n"])]
    model = _model(nodes, [("x", F, [2]), ("w", F, [None])], [("y", F), ("n", I64)],
                   [("w", np.ones(2, np.float32)), ("two", np.float32(2))])
    folded = scalars_folded(model)
    feeds = {"x": np.zeros(2, np.float32), "w": np.array([5, 7], np.float32)}
    y, n = _run(folded, feeds)
    np.testing.assert_array_equal(y, [10, 14])
    assert n == 2


@pytest.mark.parametrize("declared", ["input -1", "output"])
def test_sizes_declared_minus_one_and_declared_output_shapes_are_not_taken(declared):
    # onnxruntime reads a -1 as a free size, and only warns where an output's declared shape is wrong
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Size", ["r"], ["n"]),
             helper.make_node("Add", ["n", "v"], ["y"])]
    x_shape, r_shape = ([-1, 2], None) if declared == "input -1" else (["N", 2], [5, 2])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape),
                                           helper.make_tensor_value_info("v", I64, [])],
                              [helper.make_tensor_value_info("r", F, r_shape), helper.make_tensor_value_info("y", I64, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert scalars_folded(model) is model


@pytest.mark.parametrize("k", [0, 1])
def test_a_gemm_operand_scaled_by_a_constant_takes_it_in_alpha(rng, k):
    operands = ["scaled", "b"] if k == 0 else ["b", "scaled"]
    nodes = [helper.make_node("Mul", ["t", "c"], ["scaled"]),
             helper.make_node("Gemm", operands, ["out"], alpha=0.5, transB=1)]
    model = _model(nodes, [("t", F, [6, 5]), ("b", F, [6, 5])], [("out", F)], [("c", np.array([0.7], np.float32))])
    feeds = {"t": rng.standard_normal((6, 5)).astype(np.float32), "b": rng.standard_normal((6, 5)).astype(np.float32)}
    folded = _folded_alike(model, feeds, exact=False)
    assert _ops(folded) == ["Gemm"]
    assert helper.get_attribute_value(folded.graph.node[0].attribute[0]) == pytest.approx(0.35)


def test_identities_and_products_by_one_go_unless_the_one_widens(rng):
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Mul", ["one", "a"], ["b"]),
             helper.make_node("Div", ["b", "one"], ["c"]),
             helper.make_node("Mul", ["c", "one_2d"], ["out"])]  # (4,) times (1, 1) is (1, 4): kept
    model = _model(nodes, [("x", F, [4])], [("out", F)],
                   [("one", np.float32(1)), ("one_2d", np.ones((1, 1), np.float32))])
    folded = _folded_alike(model, {"x": rng.standard_normal(4).astype(np.float32)})
    assert _ops(folded) == ["Mul"] and folded.graph.node[0].input[1] == "one_2d"


def test_shapes_of_the_same_named_sizes_are_one(rng):
    nodes = [helper.make_node("Shape", ["x"], ["sx"], start=0, end=1),
             helper.make_node("Shape", ["y"], ["sy"], start=0, end=1),
             helper.make_node("Concat", ["sx", "sy"], ["both"], axis=0),
             helper.make_node("Cast", ["both"], ["out"], to=F)]
    model = _model(nodes, [("x", F, ["batch", 3]), ("y", F, ["batch", 5])], [("out", F)])
    folded = _folded_alike(model, {"x": np.ones((2, 3), np.float32), "y": np.ones((2, 5), np.float32)})
    assert _ops(folded).count("Shape") == 1


def test_a_value_a_subgraph_reads_and_other_domains_stay_as_they_are():
    then = helper.make_graph([helper.make_node("Identity", ["e"], ["r"])], "then", [],
                             [helper.make_tensor_value_info("r", F, None)])
    nodes = [helper.make_node("Expand", ["s", "target"], ["e"]),
             helper.make_node("Mul", ["e", "t"], ["m"]),
             helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=then),
             helper.make_node("InPlaceAccumulatorV2", ["buf", "m"], ["done"], domain="com.microsoft")]
    model = _model(nodes, [("s", F, []), ("t", F, [2, 3]), ("cond", TensorProto.BOOL, []), ("buf", F, [2, 3])],
                   [("out", F), ("done", TensorProto.BOOL)], [("target", np.array([2, 3], np.int64))])
    assert scalars_folded(model) is model


def test_a_graph_with_nothing_to_fold_is_returned_as_it_is_and_folding_twice_changes_nothing(rng):
    plain = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F)])
    assert scalars_folded(plain) is plain
    once = scalars_folded(_mean_gradient([4, 4], 1.0))
    assert scalars_folded(once) is once


def test_the_captured_step_s_gradient_is_one_gemm_and_matches_numpy(rng):
    """The tiny captured step of the benchmark (one 16 x 32 weight, a 32 x 64 batch, MSE): its
    training graph computes the loss and one scaled Gemm, nothing else, and the gradient numpy does."""
    w0 = (rng.standard_normal((16, 32)) * 0.1).astype(np.float32)
    x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((16, 64)).astype(np.float32)
    W = ag.param(w0, name="W")
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=ot.optim.Adam([W], lr=1e-3))
    try:
        step(x=x, y=y)
        training = onnx.load_from_string(step._models[0])
    finally:
        step.free()
    ops = [n.op_type for n in training.graph.node if n.op_type != "Identity"]
    assert ops == ["MatMul", "Sub", "Mul", "Cast", "Gemm", "ReduceMean", "Cast", "InPlaceAccumulatorV2"]
    grad = np.zeros_like(w0)
    loss = _run(training, {"x": x, "y": y, "W": w0, "W_grad.accumulation.buffer": grad,
                           "lazy_reset_grad": np.array([True])})[0]
    d = w0.astype(np.float64) @ x - y
    np.testing.assert_allclose(loss, np.mean(d ** 2), rtol=1e-6)
    np.testing.assert_allclose(grad, 2 * d @ x.T.astype(np.float64) / d.size, rtol=1e-5, atol=1e-7)


def test_half_floats_and_a_scale_of_zero_are_left_to_the_runtime():
    half = _model([helper.make_node("Mul", ["a", "b"], ["c"]), helper.make_node("Add", ["v", "c"], ["y"])],
                  [("v", TensorProto.FLOAT16, [])], [("y", TensorProto.FLOAT16)],
                  [("a", np.float16(0.1)), ("b", np.float16(3))])
    assert scalars_folded(half) is half
    zero = _model([helper.make_node("Scale", ["x", "s"], ["y0"], domain="com.microsoft", scale_down=1),
                   helper.make_node("Add", ["v", "y0"], ["y"])],
                  [("v", F, [])], [("y", F)], [("x", np.float32(1)), ("s", np.int64(0))])
    assert scalars_folded(zero) is zero


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_quotients_fold_as_the_runtime_truncates_them(dtype):
    low = np.iinfo(dtype).min
    a, b = np.array([low, low, -7, 7, -8, 0, 5], dtype), np.array([2, 3, 2, -2, 2, -3, 7], dtype)
    model = _model([helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Add", ["v", "q"], ["y"])],
                   [("v", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [7])],
                   [("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))], [("a", a), ("b", b)])
    folded = _folded_alike(model, {"v": np.zeros(7, dtype)})
    assert _ops(folded) == ["Add"]
