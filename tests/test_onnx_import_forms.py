"""``ot.from_onnx`` on model forms found in torch exports: values no gradient reaches, subgraphs,
ops the runtime knows but cannot train through in some form, recurrent layers exported with a
fixed batch, and batch norm exported in training mode at an old opset. References: PyTorch
(where installed) and numpy."""

from __future__ import annotations

import fnmatch
import io
import warnings

import numpy as np
import onnx
import pytest
from _onnx_helpers import f32, vi
from _onnx_helpers import model as _model
from conftest import torch_or_skip
from helpers import torch_steps
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ortrain as ot

# torch's TorchScript exporter, which the README advises for training, announces its deprecation
pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript", "ignore:The feature will be removed",
                                        "ignore:Converting a tensor to a Python boolean")


def _export(torch, module, shape, **kwargs) -> onnx.ModelProto:
    f = io.BytesIO()
    torch.onnx.export(module, (torch.zeros(*shape),), f, dynamo=False, input_names=["x"], **kwargs)
    return onnx.load_from_string(f.getvalue())


def _train_side_by_side(torch, net, model, batches, lr=0.5):
    """Losses and weights after SGD steps in PyTorch and in ortrain."""
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=lr), torch.nn.functional.mse_loss, batches)
    model.compile(optimizer=ot.optim.SGD(lr=lr), loss="mse")
    with ot.Trainer(model, batch_size=len(batches[0][0])) as tr:
        got = [tr.step(x, y) for x, y in batches]
        weights = dict(zip(model.weight_names(), tr.model().get_weights(), strict=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    for name, value in net.state_dict().items():
        if name in weights:
            np.testing.assert_allclose(weights[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    return weights


@pytest.mark.torch
def test_a_float_buffer_read_only_through_a_comparison_is_a_constant(rng):
    """nanoGPT's causal mask: ``masked_fill(self.mask == 0, ...)``. No gradient crosses ``Equal``,
    so the buffer is a constant (it was made a weight, and the gradient builder then failed)."""
    torch = torch_or_skip()

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("mask", torch.tril(torch.ones(4, 4)))

        def forward(self, x):
            return torch.softmax(self.fc(x).masked_fill(self.mask == 0, -1e4), dim=-1)

    torch.manual_seed(0)
    net = Masked()
    proto = _export(torch, net, (2, 4, 4), do_constant_folding=False, dynamic_axes={"x": {0: "batch"}})
    assert any(n.op_type == "Equal" for n in proto.graph.node)
    model = ot.from_onnx(proto)
    assert "mask" not in model.weight_names() and len(model.weight_names()) == 2
    _train_side_by_side(torch, net, model, [(f32(rng, 2, 4, 4), f32(rng, 2, 4, 4)) for _ in range(3)])


def _if_model(rng):
    """``y = x @ W`` or ``2 * (x @ W)``, chosen by a constant condition; ``W`` is read only
    inside the branches."""
    def branch(name, scale):
        nodes = [helper.make_node("MatMul", ["x", "W"], [f"{name}_h"])]
        out = f"{name}_h"
        if scale != 1:
            nodes.append(helper.make_node("Mul", [out, "two"], [f"{name}_y"]))
            out = f"{name}_y"
        return helper.make_graph(nodes, name, [], [vi(out, [None, 2])])

    w = f32(rng, 3, 2)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(True), "cond")]
    node = helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=branch("then", 1),
                            else_branch=branch("else", 2))
    return _model([node], [vi("x", [None, 3])], [vi("y", [None, 2])], inits), w


def test_weights_read_inside_a_subgraph_are_kept_and_the_node_is_named(rng):
    proto, w = _if_model(rng)
    with pytest.raises(ot.UnsupportedOpError, match=r"cannot differentiate these nodes.*If \(nodes: choose\)"):
        ot.from_onnx(proto)
    model = ot.from_onnx(proto, frozen=["W"])
    assert model.weight_names() == ["W"]
    x = f32(rng, 5, 3)
    np.testing.assert_allclose(model.predict(x), x @ w, rtol=1e-6)


def _one_op_model(op_nodes, out_shape, inits=()):
    """``x * w`` (w a trainable weight of 3) into ``op_nodes``, which read ``h`` and write ``y``."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), *op_nodes]
    weights = [numpy_helper.from_array(np.full(3, 0.5, np.float32), "w"), *inits]
    return _model(nodes, [vi("x", [None, 3])], [vi("y", out_shape)], weights)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


FORMS = {
    # amounts from the input's own size (3 - 2: a pad of 1 each side); constant amounts train
    "Pad in 'reflect' mode with pads computed in the graph": _one_op_model(
        [helper.make_node("Shape", ["x"], ["size"], start=1),
         helper.make_node("Sub", ["size", "two"], ["one"]),
         helper.make_node("Concat", ["zero", "one", "zero", "one"], ["pads"], axis=0),
         helper.make_node("Pad", ["h", "pads"], ["y"], name="pad", mode="reflect")], [None, 5],
        [_i64("two", [2]), _i64("zero", [0])]),
    "Slice with a negative step": _one_op_model(
        [helper.make_node("Slice", ["h", "starts", "ends", "axes", "steps"], ["y"], name="flip")], [None, 3],
        [_i64("starts", [-1]), _i64("ends", [-(2 ** 62)]), _i64("axes", [1]), _i64("steps", [-1])]),
    # as the dynamo exporter writes torch.flip: the steps in a Constant's value_ints
    "Slice with a negative step, from Constant nodes": _one_op_model(
        [helper.make_node("Constant", [], [name], **{f"value_{kind}": value}) for name, kind, value in
         (("starts", "ints", [-1]), ("ends", "ints", [-(2 ** 62)]), ("axes", "ints", [1]), ("steps", "ints", [-1]))]
        + [helper.make_node("Slice", ["h", "starts", "ends", "axes", "steps"], ["y"], name="node_flip")], [None, 3]),
    "Slice with a negative step, of int32": _one_op_model(
        [helper.make_node("Slice", ["h", "starts", "ends", "axes", "steps"], ["y"], name="flip32")], [None, 3],
        [numpy_helper.from_array(np.array(v, np.int32), n) for n, v in
         (("starts", [-1]), ("ends", [-(2 ** 31)]), ("axes", [1]), ("steps", [-1]))]),
    "ReduceL2 over every axis without keepdims": _one_op_model(
        [helper.make_node("ReduceL2", ["h"], ["norm"], name="norm", keepdims=0),
         helper.make_node("Mul", ["h", "norm"], ["y"])], [None, 3]),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_forms_the_runtime_cannot_train_through_are_refused_at_import(rng, form):
    """The gradient builder knows these ops, but not these forms of them: the builder or the
    gradient kernel fails later, without naming the node."""
    proto = FORMS[form]
    node = next(n.name for n in proto.graph.node if n.name)
    said = form.split(",")[0]
    with pytest.raises(ot.UnsupportedOpError, match=rf"cannot differentiate .*{said} \(nodes: {node}\)"):
        ot.from_onnx(proto)
    model = ot.from_onnx(proto, frozen=["w"])  # nothing to differentiate: it imports and runs
    x = f32(rng, 4, 3)
    ref = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    np.testing.assert_allclose(model.predict(x), ref, rtol=1e-6)


def test_an_op_without_a_gradient_kernel_on_the_device_is_named():
    """The runtime's refusal to open a training graph holding a gradient op it has no kernel for
    (as ConvTranspose and Resize had on the CPU before ortrain wrote them in other ops) becomes an
    error naming the op and the node."""
    from ortrain.engine.device import parse_device
    from ortrain.engine.session import _open_failure
    exc = RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
                       "ConvTransposeGrad(1) node with name 'up_Grad/ConvTransposeGrad_0'")
    err = _open_failure(exc, parse_device("cpu"))
    assert isinstance(err, ot.UnsupportedOpError)
    assert "no CPU kernel for the gradient of ConvTranspose (node 'up')" in str(err)


@pytest.mark.torch
def test_a_recurrent_layer_exported_with_a_fixed_batch_keeps_it(rng):
    """torch writes the initial state for the export's batch: freeing the batch would fail in the
    runtime at any other number of rows."""
    torch = torch_or_skip()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.r, self.h = torch.nn.LSTM(3, 6, batch_first=True), torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.h(self.r(x)[0])

    torch.manual_seed(0)
    net = Net()
    model = ot.from_onnx(_export(torch, net, (4, 5, 3)))
    assert model.input_specs[0].shape == (4, 5, 3)
    with pytest.raises(ot.ShapeError, match="fixed batch of 4 rows"):
        ot.Trainer(model.compile(optimizer="sgd", loss="mse"), batch_size=6)
    x10 = f32(rng, 10, 5, 3)  # arrays of any rows run 4 at a time, the last run padded
    with torch.no_grad():
        want = net(torch.from_numpy(x10)).numpy()
    np.testing.assert_allclose(model.predict(x10), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ot.ShapeError, match="x: holds 10 rows, not a multiple of the 4 rows the model's graph fixes"):
        model.compile(optimizer="sgd", loss="mse").fit(x10, f32(rng, 10, 5, 2), verbose=0)
    _train_side_by_side(torch, net, model, [(f32(rng, 4, 5, 3), f32(rng, 4, 5, 2)) for _ in range(3)], lr=0.1)


@pytest.mark.torch
def test_a_bidirectional_recurrent_layer_is_refused_at_import():
    torch = torch_or_skip()
    net = torch.nn.GRU(3, 4, bidirectional=True)
    with pytest.raises(ot.UnsupportedOpError, match=r"GRU in direction 'bidirectional' \(nodes: "):
        ot.from_onnx(_export(torch, net, (5, 2, 3), dynamic_axes={"x": {1: "batch"}}))


@pytest.mark.torch
@pytest.mark.parametrize("opset", [13, 17])
def test_a_training_mode_batch_norm_export_imports_at_old_opsets(rng, opset):
    """onnx's opset converter cannot take a training-mode BatchNormalization: it is repaired first."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    proto = _export(torch, net, (2, 4), opset_version=opset, training=torch.onnx.TrainingMode.TRAINING,
                    do_constant_folding=False, dynamic_axes={"x": {0: "batch"}})
    # the export ran one training forward pass: its running statistics moved a step from PyTorch's
    model = ot.from_onnx(proto)
    assert [o.type.tensor_type.elem_type for o in proto.graph.output] == [TensorProto.FLOAT]
    net.load_state_dict({k: torch.from_numpy(v) for k, v in zip(model.weight_names(), model.get_weights())},
                        strict=False)
    batches = [(f32(rng, 8, 4), f32(rng, 8, 2)) for _ in range(3)]
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.functional.mse_loss, batches)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=8) as tr:
        got = [tr.step(x, y) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_export_of_an_imported_training_mode_dropout_keeps_no_dead_constant(tmp_path, rng):
    w = numpy_helper.from_array(f32(rng, 3, 2), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
             helper.make_node("Constant", [], ["training"], value=numpy_helper.from_array(np.array(True))),
             helper.make_node("Dropout", ["h", "ratio", "training"], ["y"])]
    model = ot.from_onnx(_model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2])], [w]))
    model.export_onnx(tmp_path / "m.onnx")
    exported = onnx.load(tmp_path / "m.onnx")
    read = {i for n in exported.graph.node for i in n.input}
    assert all(o in read for n in exported.graph.node if n.op_type == "Constant" for o in n.output)
    x = f32(rng, 4, 3)
    np.testing.assert_allclose(model.predict(x), x @ numpy_helper.to_array(w), rtol=1e-6)


def _loop_model(trip_count: str):
    """``v`` runs through a Loop whose body adds ``W``; the trip count input may be left out."""
    body = helper.make_graph(
        [helper.make_node("Less", ["i", "two"], ["c_out"]), helper.make_node("Add", ["v", "W"], ["v_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL), vi("v", [None, 3])],
        [vi("c_out", [], TensorProto.BOOL), vi("v_out", [None, 3])],
        [numpy_helper.from_array(np.array(2, np.int64), "two")])
    inits = [numpy_helper.from_array(np.ones(3, np.float32), "W"), numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.array(5, np.int64), "M")]
    node = helper.make_node("Loop", [trip_count, "cond", "x"], ["y"], name="loop", body=body)
    return _model([node], [vi("x", [None, 3])], [vi("y", [None, 3])], inits)


@pytest.mark.parametrize("trip_count", ["M", ""])
def test_a_weight_read_only_in_a_loop_body_is_refused_by_name(trip_count):
    with pytest.raises(ot.UnsupportedOpError, match=r"Loop \(nodes: loop\)"):
        ot.from_onnx(_loop_model(trip_count))


def test_a_recurrent_initial_state_stored_as_an_initializer_keeps_a_fixed_batch(rng):
    h, n_in, batch, seq = 6, 3, 4, 5
    inits = [numpy_helper.from_array(f32(rng, 1, 4 * h, n_in) * 0.3, "W"),
             numpy_helper.from_array(f32(rng, 1, 4 * h, h) * 0.3, "R"),
             numpy_helper.from_array(np.zeros((1, batch, h), np.float32), "h0"),
             numpy_helper.from_array(np.zeros((1, batch, h), np.float32), "c0")]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("LSTM", ["xt", "W", "R", "", "", "h0", "c0"], ["Y"], hidden_size=h, name="lstm"),
             helper.make_node("ReduceMean", ["Y"], ["y"], axes=[0, 1], keepdims=0)]
    proto = _model(nodes, [vi("x", [batch, seq, n_in])], [vi("y", [batch, h])], inits)
    model = ot.from_onnx(proto)
    assert model.input_specs[0].shape == (batch, seq, n_in)
    x = f32(rng, batch, seq, n_in)
    np.testing.assert_allclose(model.predict(x), ReferenceEvaluator(proto).run(None, {"x": x})[0], rtol=1e-5,
                               atol=1e-6)


def test_a_weight_reaching_the_loss_only_through_an_arg_max_is_not_trained(rng):
    """An integer value stops the gradient: ``W`` feeds the loss only through ArgMax, so it is frozen
    with a warning (the gradient builder refused it)."""
    w, v = f32(rng, 3, 4), f32(rng, 3, 1)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["cls"], axis=1, keepdims=1),
             helper.make_node("Cast", ["cls"], ["clsf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "V"], ["v"]), helper.make_node("Add", ["v", "clsf"], ["y"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 1]), vi("logits", [None, 4])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(v, "V")])
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = f32(rng, 8, 3), f32(rng, 8, 1)
    with pytest.warns(UserWarning, match="weights W do not affect the loss"), ot.Trainer(model, batch_size=8) as tr:
        tr.step(x, y)
        after = dict(zip(model.weight_names(), tr.model().get_weights()))
    np.testing.assert_array_equal(after["W"], w)
    cls = (x @ w).argmax(1)[:, None].astype(np.float64)
    grad_v = x.T.astype(np.float64) @ (2 * (x @ v + cls - y) / len(x))
    np.testing.assert_allclose(after["V"], v - 0.1 * grad_v, rtol=1e-5, atol=1e-6)


def test_type_inference_is_needed_only_where_a_value_may_stop_a_gradient(rng):
    """The warm start of a model whose gradients surely reach every weight skips it (milliseconds)."""
    from ortrain.graph.gradient_ops import may_stop_gradients
    mlp = ot.Sequential([ot.layers.Dense(4, activation="relu"), ot.layers.BatchNorm(), ot.layers.Dense(2)],
                        input_shape=(3,), seed=0).forward_graph()
    assert not may_stop_gradients(mlp.proto, mlp.names("trainable"))
    exponent = _one_op_model([helper.make_node("Pow", ["h", "e"], ["y"])], [None, 3],
                             [numpy_helper.from_array(np.ones(3, np.float32), "e")])
    assert may_stop_gradients(exponent, ["w", "e"]) and not may_stop_gradients(exponent, ["w"])
    assert may_stop_gradients(_loop_model("M"), ["W"])


def _noise_model(rng):
    """``y = x @ W + RandomNormalLike(x @ W)``: the noise reads only its input's shape (a VAE's
    ``torch.randn_like``)."""
    w = f32(rng, 3, 2)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("RandomNormalLike", ["h"], ["eps"], name="noise"),
             helper.make_node("Add", ["h", "eps"], ["y"])]
    return _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2])], [numpy_helper.from_array(w, "W")]), w


def test_random_draws_shaped_like_a_trained_value_train_and_follow_set_seed(rng):
    proto, w = _noise_model(rng)
    x = f32(rng, 256, 3)
    draws = []
    for _ in range(2):
        ot.set_seed(3)
        # it was refused: RandomNormalLike has no gradient, none is needed; it draws in predict too (a
        # dropout exported as random ops, the dynamo exporter's Dropout2d, stayed on without a word)
        with pytest.warns(UserWarning, match=r"the model draws random numbers \(RandomNormalLike\), and does so in "
                                             r"predict, evaluate and the exported model too"):
            model = ot.from_onnx(proto)
        draws.append(model.predict(x) - x @ w)
    np.testing.assert_array_equal(draws[0], draws[1])
    assert 0.8 < draws[0].std() < 1.2 and abs(draws[0].mean()) < 0.2  # standard normal noise
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=256) as tr:
        tr.step(x, np.zeros((256, 2), np.float32))
        assert not np.array_equal(tr.model().get_weights()[0], w)


def test_random_draws_no_output_reads_are_not_said(rng, recwarn):
    w = f32(rng, 3, 2)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]),
             helper.make_node("RandomNormalLike", ["y"], ["unused"], name="noise")]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2])], [numpy_helper.from_array(w, "W")])
    model = ot.from_onnx(proto)
    assert not [w for w in recwarn if "draws random numbers" in str(w.message)]
    x = f32(rng, 4, 3)
    np.testing.assert_array_equal(model.predict(x), model.predict(x))


def test_compile_refuses_a_model_whose_first_output_is_not_float(rng):
    w = f32(rng, 3, 4)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["pred"], axis=1, keepdims=0)]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("pred", [None], TensorProto.INT64), vi("logits", [None, 4])],
                   [numpy_helper.from_array(w, "W")])
    model = ot.from_onnx(proto)
    with pytest.raises(ot.OrtrainError, match=r"first output, which must be float32; the outputs are 'pred' "
                                              r"\(int64\), 'logits' \(float32\)"):
        model.compile(optimizer="sgd", loss="mse")
    assert not model.compiled
    np.testing.assert_array_equal(model.predict(f32(rng, 2, 3))[0].shape, (2,))  # it still predicts


def test_a_trainable_scalar_takes_a_0d_value(rng):
    nodes = [helper.make_node("Mul", ["x", "temp"], ["y"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 3])],
                   [numpy_helper.from_array(np.array(2.0, np.float32), "temp")])
    model = ot.from_onnx(proto, trainable=["temp"])
    model.set_weights({"temp": np.float32(0.5)})
    assert model.get_weights()[0].shape == (1,)
    np.testing.assert_array_equal(model.predict(np.ones((1, 3), np.float32)), [[0.5, 0.5, 0.5]])


def test_a_weight_reaching_a_no_gradient_position_through_other_values_needs_type_inference(rng):
    from ortrain.graph.gradient_ops import gradient_reach, may_stop_gradients
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("ReduceMean", ["a"], ["top"]),
             helper.make_node("Clip", ["h", "", "top"], ["y"]), helper.make_node("Mul", ["x", "a"], ["z"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 3]), vi("z", [None, 3])],
                   [numpy_helper.from_array(f32(rng, 3, 3), "W"), numpy_helper.from_array(f32(rng, 3), "a")])
    assert "a" not in gradient_reach(proto, ["y"])  # Clip's bound takes no gradient
    assert may_stop_gradients(proto, ["W", "a"])
    model = ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match="weights a do not affect the loss"), ot.Trainer(model, batch_size=2) as tr:
        tr.step(f32(rng, 2, 3), f32(rng, 2, 3))


def test_constant_probabilities_of_a_bernoulli_are_no_weight(rng):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Bernoulli", ["p"], ["m"]),
             helper.make_node("Mul", ["h", "m"], ["y"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2])],
                   [numpy_helper.from_array(f32(rng, 3, 2), "W"), numpy_helper.from_array(np.full(2, 0.5, np.float32), "p")])
    model = ot.from_onnx(proto)
    assert model.weight_names() == ["W"]
    proto.graph.node[1].input[0] = "h"  # probabilities computed from a weight: the runtime has no gradient
    with pytest.raises(ot.UnsupportedOpError, match=r"Bernoulli \(nodes: "):
        ot.from_onnx(proto)


@pytest.mark.torch
def test_matmul_with_a_1d_operand_trains_as_pytorch(rng):
    """onnxruntime-training's MatMul gradient is wrong for a 1-D operand (``x @ w``, ``w`` of shape
    ``(k,)``, moved 0.1 off PyTorch's weights in one step); the training graph makes it a column
    or a row. Here: a 1-D weight on either side, a 1-D intermediate, and two 1-D weights."""
    torch = torch_or_skip()

    class Vectors(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.u = torch.nn.Parameter(torch.linspace(-0.5, 0.5, 4))
            self.w = torch.nn.Parameter(torch.linspace(0.3, -0.2, 4))
            self.v = torch.nn.Parameter(torch.linspace(0.1, 0.4, 4))

        def forward(self, x):                    # x: (batch, 4, 3)
            b = self.u @ x                       # 1-D @ batched matrices: (batch, 3)
            a = x.sum(-1) @ self.w               # matrix @ 1-D weight: (batch,)
            c = self.w @ self.v                  # two 1-D weights: ()
            return b + a[:, None] * c

    torch.manual_seed(0)
    net = Vectors()
    proto = _export(torch, net, (2, 4, 3), dynamic_axes={"x": {0: "batch"}})
    assert sum(n.op_type == "MatMul" for n in proto.graph.node) == 3
    model = ot.from_onnx(proto)
    x = f32(rng, 2, 4, 3)
    np.testing.assert_allclose(model.predict(x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-7)
    _train_side_by_side(torch, net, model, [(f32(rng, 5, 4, 3), f32(rng, 5, 3)) for _ in range(3)], lr=0.1)


def test_output_sizes_the_weights_fix_are_known_so_class_labels_are_checked(rng):
    """A classifier declared (N, C) whose last layer has 3 columns: C is 3, so a class label of 7
    is refused (the fused loss read past the row and trained on it, silently)."""
    w = f32(rng, 4, 3)
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [None, 4])], [vi("y", ["N", "C"])],
                   [numpy_helper.from_array(w, "w")])
    model = ot.from_onnx(proto)
    assert model.output_specs[0].shape == (None, 3)
    model.compile(optimizer="sgd", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, labels = f32(rng, 6, 4), np.array([0, 7, 1, 1, 2, 0])
    for call in (lambda: model.fit(x, labels, verbose=0), lambda: model.evaluate(x, labels)):
        with pytest.raises(ot.ShapeError, match=r"class labels must lie in \[0, 2\] \(the output has 3 classes\)"):
            call()
    np.testing.assert_array_equal(model.get_weights()[0], w)
    assert model.train_state is None


def test_an_output_as_wide_as_a_free_input_dimension_checks_class_labels_at_each_width(rng):
    """An output whose width only the input fixes ((N, D) -> (N, D)): its number of classes is the
    batch's width, found by shape inference at that width, so label 4 is refused for 4 columns
    (the fused loss read past the row) and taken for 5, with numpy's loss."""
    proto = _model([helper.make_node("Mul", ["x", "w"], ["y"])], [vi("x", ["N", "D"])], [vi("y", ["N", "D"])],
                   [numpy_helper.from_array(np.ones(1, np.float32), "w")])
    model = ot.from_onnx(proto, trainable=["w"])
    model.compile(optimizer="sgd", loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, labels = f32(rng, 6, 4), np.array([0, 4, 1, 1, 2, 0])

    def generator():
        while True:
            yield x, labels

    with ot.Trainer(model, batch_size=6) as tr:
        for call in (lambda: model.fit(x, labels, verbose=0), lambda: model.evaluate(x, labels),
                     lambda: ot.fit_generator(model, generator(), epochs=1, steps_per_epoch=1, verbose=0),
                     lambda: tr.step(x, labels)):
            with pytest.raises(ot.ShapeError, match=r"class labels must lie in \[0, 3\] \(the output has 4 classes\)"):
                call()
        assert tr.n_steps == 0
        wide = f32(rng, 6, 5)
        logp = wide - np.log(np.exp(wide).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(tr.step(wide, labels), -logp[np.arange(6), labels].mean(), rtol=1e-5)
    np.testing.assert_array_equal(model.get_weights()[0], [1.0])
    assert model.train_state is None


def _pinned_reshape_model():
    # x.view(4, -1) @ W: what torch.onnx.export writes for view(x.shape[0], -1) without dynamic axes
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(6, 2)
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("MatMul", ["r", "W"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
                          [numpy_helper.from_array(np.array([4, 6], np.int64), "s"), numpy_helper.from_array(w, "W")])
    model = ot.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    return model.compile(optimizer="sgd", loss="mse"), w.astype(np.float64)


def test_arrays_for_a_graph_with_a_fixed_batch_run_in_batches_of_it():
    # predict, evaluate and fit took arrays whole and refused more rows than the fixed batch
    rng = np.random.default_rng(0)
    x, y = rng.random((18, 2, 3), np.float32), rng.random((18, 2), np.float32)
    model, w = _pinned_reshape_model()
    want = x.reshape(18, 6) @ w
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-6)
    np.testing.assert_allclose(model.predict(x[:3], batch_size=2), want[:3], rtol=1e-6)  # padded to 4 rows
    with ot.Trainer(model, batch_size=4) as tr:
        np.testing.assert_allclose(tr.predict(x), want, rtol=1e-6)
        np.testing.assert_allclose(tr.snapshot().predict(x[:5]), want[:5], rtol=1e-6)
    got = model.evaluate(x[:16], y[:16])["loss"]
    assert got == pytest.approx(np.mean((want[:16] - y[:16]) ** 2), rel=1e-6)
    model.fit(x[:16], y[:16], epochs=2, shuffle=False, verbose=0)  # batch_size is the graph's, 4
    for _ in range(2):
        for i in range(0, 16, 4):
            xb = x[i:i + 4].reshape(4, 6).astype(np.float64)
            w -= 0.01 * xb.T @ (xb @ w - y[i:i + 4]) / 4
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-5, atol=1e-7)
    assert model.optimizer.step == 8


@pytest.mark.parametrize("call, says", [
    (lambda m, x, y: m.fit(x, y, verbose=0), r"x: holds 18 rows, not a multiple of the 4 rows .*drop the last 2 rows "
                                              r"\(x\[:16\]\)"),
    (lambda m, x, y: m.fit(x[:16], y[:16], batch_size=8, verbose=0), r"batch_size: the model's graph fixes its batch "
                                                                      r"at 4 rows .*received batch_size=8"),
    (lambda m, x, y: m.fit(x[:16], y[:16], validation_split=0.3, verbose=0), r"validation_split holds out\): holds 5 "
                                                                              r"rows.*choose a validation_split"),
    (lambda m, x, y: m.fit(x[:16], y[:16], validation_data=(x[:6], y[:6]), verbose=0), r"validation_data\[0\]: holds 6"),
    (lambda m, x, y: m.evaluate(x, y), r"x: holds 18 rows, not a multiple of the 4"),
])
def test_rows_a_fixed_batch_cannot_take_are_refused_before_anything(call, says):
    rng = np.random.default_rng(1)
    x, y = rng.random((18, 2, 3), np.float32), rng.random((18, 2), np.float32)
    model, _ = _pinned_reshape_model()
    before = model.get_weights()
    with pytest.raises(ot.ShapeError, match=says):
        call(model, x, y)
    np.testing.assert_array_equal(model.get_weights()[0], before[0])
    assert model.optimizer.step == 0


@pytest.mark.torch
def test_a_batch_fixed_by_an_expanded_token_is_kept_fixed():
    # torch.cat([tok.expand(x.shape[0], -1), x]) exported without dynamic axes writes the expand's
    # shape as a Where of constants: the batch was freed, predict on 7 rows failed inside the
    # runtime and fit trained two steps before failing on the short last batch
    torch = torch_or_skip()

    class Tok(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.lin = torch.nn.Parameter(torch.randn(1, 4)), torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(torch.cat([self.tok.expand(x.shape[0], -1)[:, None], x[:, None]], dim=1).mean(1))

    torch.manual_seed(0)
    net = Tok()
    f = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(4, 4),), f, dynamo=False, input_names=["x"])
    model = ot.from_onnx(onnx.load_from_string(f.getvalue()))
    assert model.input_specs[0].shape == (4, 4)
    x = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    with torch.no_grad():  # run 4 rows at a time, the last run padded
        np.testing.assert_allclose(model.predict(x), net(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.ShapeError, match="x: holds 10 rows, not a multiple of the 4 rows"):
        model.fit(np.zeros((10, 4), np.float32), np.zeros((10, 3), np.float32), batch_size=4, verbose=0)
    assert model.optimizer.step == 0


@pytest.mark.torch
def test_predicting_no_rows_with_a_recurrent_layer_returns_an_empty_array():
    # onnxruntime's GRU kernel aborts the process on an empty batch
    torch = torch_or_skip()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.r, self.h = torch.nn.GRU(4, 6, batch_first=True), torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.h(self.r(x)[0][:, -1])

    model = ot.from_onnx(_export(torch, Net(), (2, 5, 4), dynamic_axes={"x": {0: "batch"}}))
    assert model.predict(np.zeros((0, 5, 4), np.float32)).shape == (0, 3)
    with ot.Trainer(model.compile(optimizer="sgd", loss="mse"), batch_size=2) as tr:
        assert tr.predict(np.zeros((0, 5, 4), np.float32)).shape == (0, 3)


@pytest.mark.torch
@pytest.mark.parametrize("form", ["softmax over the batch", "batch mean", "arange over the rows"])
def test_a_fixed_batch_graph_that_mixes_or_numbers_rows_predicts_only_its_batch(form):
    # the last run was padded and the rows' outputs came back changed (softmax over dim 0: 0.25
    # where PyTorch gives 1), or numbered from 0 again in every run of 4 (arange)
    torch = torch_or_skip()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            h = self.lin(x.view(x.shape[0], -1))
            if form == "softmax over the batch":
                return torch.softmax(h, dim=0)
            if form == "batch mean":
                return h - h.mean(0)
            return h * torch.arange(x.size(0)).float().unsqueeze(1)

    torch.manual_seed(0)
    net = Net().eval()
    model = ot.from_onnx(_export(torch, net, (4, 3)))
    assert model.input_specs[0].shape == (4, 3)
    x = np.random.default_rng(0).random((6, 3), np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(x[:4]), net(torch.from_numpy(x[:4])).numpy(), rtol=1e-5, atol=1e-6)
    for rows in (1, 6, 8):
        with pytest.raises(ot.OrtrainError, match="fixes its batch at 4 rows and mixes the rows of a batch or reads "
                                                  "their positions"):
            model.predict(np.concatenate([x, x])[:rows])


@pytest.mark.torch
@pytest.mark.parametrize("how", ["expand", "repeat"])
def test_a_batch_fixed_in_a_shape_computed_without_constant_folding_is_kept_fixed(how):
    # torch.onnx.export(do_constant_folding=False) reads the expand's shape through Shape of a
    # constant: the batch was freed, and 5 rows failed inside the runtime
    torch = torch_or_skip()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.tok = torch.nn.Linear(3, 6), torch.nn.Parameter(torch.randn(1, 6))

        def forward(self, x):
            t = self.tok.expand(x.shape[0], -1) if how == "expand" else self.tok.repeat(x.shape[0], 1)
            return self.lin(x) * t

    torch.manual_seed(0)
    net = Net()
    model = ot.from_onnx(_export(torch, net, (4, 3), do_constant_folding=False))
    assert model.input_specs[0].shape == (4, 3)
    x = np.random.default_rng(1).random((5, 3), np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(x), net(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_fewer_rows_than_a_fixed_batch_are_told_how_many_are_needed():
    model, _ = _pinned_reshape_model()
    x, y = np.zeros((3, 2, 3), np.float32), np.zeros((3, 2), np.float32)
    with pytest.raises(ot.ShapeError, match=r"x: holds 3 rows, not a multiple of the 4 rows .*give at least 4 rows"):
        model.evaluate(x, y)


def test_a_reshape_of_opset_4_with_its_shape_attribute_imports():
    # onnx's converter wrote the shape as a Constant without dims holding two values: numpy's
    # "cannot reshape array of size 2 into shape ()" escaped from_onnx
    w = numpy_helper.from_array(np.full((6,), 2.0, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h"], ["y"], shape=[-1, 3])]
    graph = helper.make_graph(nodes, "g", [vi("x", [2, 6]), vi("w", [6])], [vi("y", [4, 3])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 4)])
    proto.ir_version = 3
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(ot.from_onnx(proto).predict(x), (2 * x).reshape(4, 3))


def test_a_zipmap_output_is_refused_naming_the_fix():
    # skl2onnx's classifiers end in a ZipMap (a sequence of maps): "the imported model ortrain built
    # is not valid ONNX: Field 'type' of 'value_info' is required but missing"
    w = numpy_helper.from_array(np.ones((3, 2), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["probabilities"]),
             helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                              classlabels_int64s=[0, 1], name="ZipMap")]
    seq = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64,
                                                                      helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    graph = helper.make_graph(nodes, "skl", [vi("x", [None, 3])],
                              [vi("probabilities", [None, 2]), helper.make_value_info("output_probability", seq)], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    with pytest.raises(ot.OrtrainError, match=r"output 'output_probability' \(made by ZipMap node 'ZipMap'\) is a "
                                              r"sequence, not a tensor; .*'zipmap': False"):
        ot.from_onnx(proto)


def test_a_reshape_of_opset_4_to_one_dimension_imports():
    # shape=[-1] stayed a scalar Constant: "A shape tensor must be a vector tensor" from onnxruntime
    w = numpy_helper.from_array(np.full((6,), 2.0, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h"], ["y"], shape=[-1])]
    graph = helper.make_graph(nodes, "g", [vi("x", [2, 6]), vi("w", [6])], [vi("y", [12])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 4)])
    proto.ir_version = 3
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(ot.from_onnx(proto).predict(x), (2 * x).reshape(12))


@pytest.mark.parametrize("batch", ["N", None])
def test_broadcasts_of_opset_6_import_with_a_free_batch(rng, batch):
    # onnx's converter checks opset 6's broadcast=1 on sizes it can read: a free batch was refused
    # ("Assertion `dim.is_int' failed: N Dimension is a param instead of an int")
    w, b, c = f32(rng, 3, 2), f32(rng, 2), f32(rng, 2)
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], broadcast=1),
             helper.make_node("Add", ["h", "c"], ["y"], broadcast=1)]
    inits = [numpy_helper.from_array(a, n) for a, n in [(w, "W"), (b, "b"), (c, "c")]]
    stored = [vi(t.name, list(t.dims)) for t in inits]  # IR 3: initializers are graph inputs too
    graph = helper.make_graph(nodes, "g", [vi("x", [batch, 3]), *stored], [vi("y", [batch, 2])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    proto.ir_version = 3
    model = ot.from_onnx(proto)
    assert model.input_specs[0].shape == (None, 3)
    for rows in (1, 5):
        x = f32(rng, rows, 3)
        np.testing.assert_allclose(model.predict(x), x @ w + b + c, rtol=1e-5, atol=1e-6)
    x, y = f32(rng, 4, 3), f32(rng, 4, 2)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=4) as tr:
        tr.step(x, y)
        got = dict(zip(model.weight_names(), tr.get_weights()))
    grad = 2 * (x @ w + b + c - y) / y.size  # d mean((out - y)^2) / d out
    np.testing.assert_allclose(got["W"], w - 0.1 * x.T @ grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["c"], c - 0.1 * grad.sum(0), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("is_test", [0, 1])
def test_a_batch_norm_and_dropout_of_opset_6_import_whatever_their_test_flag(rng, is_test):
    # onnx's converter refused is_test=0 (a training-mode export): "Attribute is_test must not have value 0"
    w, gamma, beta = f32(rng, 3, 4), f32(rng, 4), f32(rng, 4)
    mean, var = f32(rng, 4), np.abs(f32(rng, 4)) + 0.5
    inits = [numpy_helper.from_array(a, n) for a, n in [(w, "W"), (gamma, "s"), (beta, "b"), (mean, "m"), (var, "v")]]
    outputs = ["y", "m_out", "v_out", "saved_m", "saved_v"] if is_test == 0 else ["y"]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "s", "b", "m", "v"], ["n"] + outputs[1:], is_test=is_test,
                              epsilon=1e-5, momentum=0.9),
             helper.make_node("Dropout", ["n"], ["y"], ratio=0.5, is_test=is_test)]
    stored = [vi(t.name, list(t.dims)) for t in inits]  # IR 3: initializers are graph inputs too
    graph = helper.make_graph(nodes, "g", [vi("x", [None, 3]), *stored], [vi("y", [None, 4])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    proto.ir_version = 3
    model = ot.from_onnx(proto)
    x = f32(rng, 8, 3)
    h = x @ w
    np.testing.assert_allclose(model.predict(x), gamma * (h - mean) / np.sqrt(var + 1e-5) + beta, rtol=1e-5, atol=1e-6)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    with ot.Trainer(model, batch_size=8) as tr:
        tr.step(x, np.zeros((8, 4), np.float32))
        got = dict(zip(model.weight_names(), tr.get_weights()))
    np.testing.assert_allclose(got["m"], 0.9 * mean + 0.1 * h.mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("momentum", [None, 0.1])
def test_a_batch_norm_of_momentum_none_is_said_to_keep_its_statistics(momentum, recwarn):
    # PyTorch's cumulative average (momentum=None) is exported in eval mode as ONNX momentum 1:
    # statistics that never move in training, which nothing said
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, momentum=momentum)).eval()
    model = ot.from_onnx(_export(torch, net, (2, 4), dynamic_axes={"x": {0: "batch"}}, do_constant_folding=False))
    said = [str(w.message) for w in recwarn if "momentum 1" in str(w.message)]
    assert said == ([] if momentum else [said[0]])
    if momentum is None:
        assert said[0].startswith("from_onnx: batch norm '/1/BatchNormalization' has momentum 1")
        model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
        before = model.get_weights()
        with ot.Trainer(model, batch_size=4) as tr:
            tr.step(np.ones((4, 4), np.float32), np.zeros((4, 8), np.float32))
            after = tr.get_weights()
        assert model.weight_names()[4] == "1.running_mean"
        np.testing.assert_array_equal(after[4], before[4])  # what the warning says: they stay
        recwarn.clear()  # statistics frozen by name stay by choice: nothing to say
        ot.from_onnx(_export(torch, net, (2, 4), dynamic_axes={"x": {0: "batch"}}, do_constant_folding=False),
                     frozen=["1.running_mean"])  # either freezes both
        assert not [w for w in recwarn if "momentum 1" in str(w.message)]


def test_random_draws_inside_a_branch_are_said_and_seeded(rng):
    # an If branch drawing noise was neither named by the warning nor seeded by ot.set_seed
    w = f32(rng, 3, 2)
    branch = lambda name, nodes: helper.make_graph(nodes, name, [], [vi(f"{name}_out", [None, 2])])  # noqa: E731
    noisy = branch("noisy", [helper.make_node("RandomNormal", [], ["noisy_out"], shape=[1, 2], name="noise")])
    plain = branch("plain", [helper.make_node("Constant", [], ["plain_out"], value=numpy_helper.from_array(np.zeros((1, 2), np.float32)))])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("If", ["flag"], ["n"], then_branch=noisy, else_branch=plain),
             helper.make_node("Add", ["h", "n"], ["y"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(True), "flag")])
    x = f32(rng, 64, 3)
    draws = []
    for _ in range(2):
        ot.set_seed(5)
        with pytest.warns(UserWarning, match=r"the model draws random numbers \(RandomNormal\)"):
            model = ot.from_onnx(proto)
        draws.append(model.predict(x[:1]) - x[:1] @ w)
    np.testing.assert_array_equal(draws[0], draws[1])
    assert np.all(draws[0] != 0)


def test_a_branch_reading_a_computed_value_before_the_weights_trains(rng):
    # onnxruntime's gradient builder aborted the process (an out-of-range index in its walk back
    # from the loss): the If's body reads r, which a node computes, not a graph input
    w = f32(rng, 3, 2)
    then = helper.make_graph([helper.make_node("Identity", ["r"], ["kept"])], "then", [], [vi("kept", [None, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["r"], ["negated"])], "else", [], [vi("negated", [None, 3])])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["o"], then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["o", "W"], ["y"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = ot.from_onnx(proto)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    want = w.copy()
    with ot.Trainer(model, batch_size=4) as tr:
        for shift in (1.5, -1.5):  # both branches
            x, y = f32(rng, 4, 3) + shift, f32(rng, 4, 2)
            o = np.maximum(x, 0) * (1 if x.sum() > 0 else -1)
            np.testing.assert_allclose(tr.step(x, y), np.mean((o @ want - y) ** 2), rtol=1e-5)
            want -= 0.1 * o.T @ (2 * (o @ want - y) / y.size)
        np.testing.assert_allclose(tr.get_weights()[0], want, rtol=1e-5, atol=1e-6)


class _Recurrent:
    """A recurrent layer (LSTM or GRU, ``layers`` deep) and a linear head on its last step."""

    def __new__(cls, torch, kind, layers=1, bidirectional=False):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.r = getattr(torch.nn, kind)(3, 4, num_layers=layers, batch_first=True,
                                                 bidirectional=bidirectional)
                self.fc = torch.nn.Linear(8 if bidirectional else 4, 2)

            def forward(self, x):
                return self.fc(self.r(x)[0][:, -1])
        return Net()


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("layers, frozen", [(1, ["r.weight_hh_l0"]), (2, ["r.*_l1"])])
def test_a_recurrent_layer_partly_frozen_trains_as_pytorch(rng, kind, layers, frozen):
    # a segmentation fault: the runtime's LSTMGrad/GRUGrad asked for some of W, R, B's gradients
    # (or for the input's alone, a frozen layer after a trained one)
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = _Recurrent(torch, kind, layers)
    model = ot.from_onnx(_export(torch, net, (2, 6, 3), dynamic_axes={"x": {0: "batch", 1: "t"}},
                                 do_constant_folding=False), frozen=frozen)
    for name, p in net.named_parameters():
        p.requires_grad_(not any(fnmatch.fnmatch(name, f) for f in frozen))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    weights = _train_side_by_side(torch, net, model, [(f32(rng, 4, 6, 3), f32(rng, 4, 2)) for _ in range(2)])
    for name in before:  # the frozen ones stay, the others move
        assert np.array_equal(weights[name], before[name].numpy()) == any(fnmatch.fnmatch(name, f) for f in frozen)


@pytest.mark.torch
def test_a_frozen_bidirectional_recurrent_layer_is_refused_before_training_naming_what_helps(rng):
    # frozen as the import's refusal said, it failed as the session opened with the kernel's text
    # ("direction == ... was false"); predictions were and are fine
    torch = torch_or_skip()
    net = _Recurrent(torch, "LSTM", bidirectional=True)
    proto = _export(torch, net, (2, 5, 3), dynamic_axes={"x": {0: "batch", 1: "t"}}, do_constant_folding=False)
    with pytest.raises(ot.UnsupportedOpError, match=r"LSTM in direction 'bidirectional' .* cannot be in a training "
                                                    r"graph even frozen"):
        ot.from_onnx(proto)
    model = ot.from_onnx(proto, frozen=["r.*"])
    x = f32(rng, 4, 5, 3)
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(x), net(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"cannot train a model holding LSTM in direction 'bidirectional' "
                                                    r"\(nodes: /r/LSTM\): .*whether or not the layer is frozen"):
        ot.Trainer(model, batch_size=4)


@pytest.mark.torch
def test_an_empty_sequence_is_refused_before_the_runtime_sees_it():
    # a GRU ended the process ("terminate called without an active exception"); an LSTM predicted
    # its head's bias
    torch = torch_or_skip()
    model = ot.from_onnx(_export(torch, _Recurrent(torch, "GRU"), (2, 6, 3),
                                 dynamic_axes={"x": {0: "batch", 1: "t"}}))
    model.compile(optimizer="sgd", loss="mse")
    empty = np.zeros((4, 0, 3), np.float32)
    with pytest.raises(ot.ShapeError, match=r"x: axis 1 holds no elements \(\(4, 0, 3\)\); the model's recurrent "
                                            r"layers need at least one step"):
        model.predict(empty)
    with ot.Trainer(model, batch_size=4) as tr:
        for call in (lambda: tr.step(empty, np.zeros((4, 2), np.float32)),
                     lambda: tr.eval(empty, np.zeros((4, 2), np.float32)), lambda: tr.predict(empty)):
            with pytest.raises(ot.ShapeError, match=r"x: axis 1 holds no elements"):
                call()
        assert tr.n_steps == 0
    assert model.predict(np.zeros((0, 6, 3), np.float32)).shape == (0, 2)  # no rows is fine


def test_an_empty_axis_feeding_no_recurrent_layer_runs(rng):
    # a decoder's first step with an empty cache of past steps (Concat over time) is a model's own
    # business: only recurrent layers need a step
    w = f32(rng, 4, 2)
    nodes = [helper.make_node("Concat", ["past", "x"], ["seq"], axis=1), helper.make_node("MatMul", ["seq", "W"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0)]
    proto = _model(nodes, [vi("x", [None, None, 4]), vi("past", [None, None, 4])], [vi("y", [None, 2])],
                   [numpy_helper.from_array(w, "W")], opset=17)
    model = ot.from_onnx(proto, input_names=["x", "past"])
    x, past = f32(rng, 3, 2, 4), np.zeros((3, 0, 4), np.float32)
    np.testing.assert_allclose(model.predict([x, past]), (x @ w).mean(1), rtol=1e-5, atol=1e-6)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit([x, past], np.zeros((3, 2), np.float32), batch_size=3, verbose=0)
    assert model.optimizer.step == 1


def test_a_branch_returning_a_sequence_beside_the_trained_path_trains(rng):
    # the rewrite that keeps control flow out of the gradient builder's walk put the If's sequence
    # output into a sequence of tensors: "INVALID_GRAPH"
    w = f32(rng, 3, 2)
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [None, 3]))
    one = helper.make_graph([helper.make_node("SequenceConstruct", ["r"], ["one"])], "one", [],
                            [helper.make_value_info("one", seq)])
    two = helper.make_graph([helper.make_node("SequenceConstruct", ["r", "r"], ["two"])], "two", [],
                            [helper.make_value_info("two", seq)])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["parts"], then_branch=one, else_branch=two),
             helper.make_node("ConcatFromSequence", ["parts"], ["joined"], axis=0),
             helper.make_node("MatMul", ["x", "W"], ["y"])]
    proto = _model(nodes, [vi("x", [None, 3])], [vi("y", [None, 2]), vi("joined", [None, 3])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = ot.from_onnx(proto)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = f32(rng, 4, 3) + 1.0, f32(rng, 4, 2)
    with ot.Trainer(model, batch_size=4) as tr:
        np.testing.assert_allclose(tr.step(x, y), np.mean((x @ w - y) ** 2), rtol=1e-5)
        np.testing.assert_allclose(tr.get_weights()[0], w - 0.1 * x.T @ (2 * (x @ w - y) / y.size), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_stacked_recurrent_layers_exported_by_dynamo_train_at_any_length(rng, kind):
    # the exporter declares the first layer's output at the export's length ([s77, 5, 6]); the
    # runtime's constant folding took that for the truth, so the training graph ran at 5 steps only
    # ("cannot be reshaped to the requested shape"), where predictions ran at any
    torch = torch_or_skip()

    class Stacked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = getattr(torch.nn, kind)(4, 6, batch_first=True)
            self.l2 = getattr(torch.nn, kind)(6, 6, batch_first=True)
            self.fc = torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(self.l2(self.l1(x)[0])[0][:, -1])

    torch.manual_seed(0)
    net = Stacked()
    dynamic = torch.export.Dim.DYNAMIC
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(net, (torch.zeros(4, 5, 4),), dynamo=True, optimize=False, input_names=["x"],
                                    dynamic_shapes={"x": {0: dynamic, 1: dynamic}}, verbose=False)
    model = ot.from_onnx(program.model_proto)
    _train_side_by_side(torch, net, model, [(f32(rng, 4, steps, 4), f32(rng, 4, 2)) for steps in (3, 7)], lr=0.1)


@pytest.mark.parametrize("statistics", ["tiled", "read", "identity"])
def test_a_batch_norm_over_statistics_the_graph_computes_is_said_to_keep_them(rng, statistics, recwarn):
    # the dynamo exporter writes InstanceNorm(track_running_stats=True) as a batch norm over its buffers
    # tiled once per sample: training matched PyTorch, but the buffers never moved, without a word
    c = 3
    inits = [numpy_helper.from_array(a, n) for n, a in
             {"w": f32(rng, 4, 2 * c), "gamma": np.ones(2 * c, np.float32), "beta": np.zeros(2 * c, np.float32),
              "running_mean": np.zeros(c, np.float32), "running_var": np.ones(c, np.float32),
              "mean_2c": np.zeros(2 * c, np.float32), "var_2c": np.ones(2 * c, np.float32),
              "reps": np.array([2], np.int64)}.items()]
    stats = {"tiled": [helper.make_node("Tile", ["running_mean", "reps"], ["mean"]),
                       helper.make_node("Tile", ["running_var", "reps"], ["var"])],
             "read": [helper.make_node("Identity", ["mean_2c"], ["mean"]), helper.make_node("Identity", ["var_2c"], ["var"])],
             "identity": [helper.make_node("Identity", ["mean_2c"], ["mean"]),
                          helper.make_node("Identity", ["gamma"], ["var"])]}[statistics]
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), *stats,
                    helper.make_node("BatchNormalization", ["h", "gamma", "beta", "mean", "var"], ["y"], name="bn")],
                   [vi("x", ["N", 4])], [vi("y", ["N", 2 * c])], inits)
    ot.from_onnx(proto)
    said = [str(w.message) for w in recwarn if "computed in the graph" in str(w.message)]
    if statistics == "tiled":
        assert said and said[0].startswith("from_onnx: batch norm 'bn' reads its running statistics computed in the "
                                           "graph from the buffers")
    else:
        assert said == []
