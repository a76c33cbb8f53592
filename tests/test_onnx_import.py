"""``ot.from_onnx``: classification of initializers, input selection, repairs, opsets, gradient
checks and the batch dimension. References: onnx's ReferenceEvaluator and numpy."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from _onnx_helpers import DATA, load_data_module, make_models
from _onnx_helpers import f32 as _f32
from _onnx_helpers import model as _model
from _onnx_helpers import vi as _vi
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ortrain as ot
from ortrain.graph import batch_dimension, gradient_ops, opsets, repairs

# -- classification, trainable/frozen, input_names ------------------------------------------

def _classification_model(rng, ir3=False):
    inits = [numpy_helper.from_array(_f32(rng, 3, 4), "w"),
             numpy_helper.from_array(_f32(rng, 4), "b"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array([-1, 4, 1, 1], np.int64), "shape"),
             numpy_helper.from_array(np.abs(_f32(rng, 4)) + 0.5, "gamma"),
             numpy_helper.from_array(_f32(rng, 4), "beta"),
             numpy_helper.from_array(_f32(rng, 4), "stat_a"),  # running mean, whatever its name
             numpy_helper.from_array(np.abs(_f32(rng, 4)) + 0.5, "stat_b"),  # running variance
             numpy_helper.from_array(np.array([2.0], np.float32), "exponent"),
             numpy_helper.from_array(_f32(rng, 7), "unused")]
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
             helper.make_node("Mul", ["h", "half"], ["h2"]),
             helper.make_node("Reshape", ["h2", "shape"], ["h4"]),
             helper.make_node("BatchNormalization", ["h4", "gamma", "beta", "stat_a", "stat_b"], ["bn"]),
             helper.make_node("Pow", ["bn", "exponent"], ["sq"]),
             helper.make_node("Flatten", ["sq"], ["y"])]
    inputs = [_vi("x", [None, 3])]
    if ir3:
        inputs += [_vi(t.name, list(t.dims), t.data_type) for t in inits]
    return _model(nodes, inputs, [_vi("y", [None, 4])], inits, opset=9 if ir3 else 17, ir=3 if ir3 else 8)


@pytest.mark.parametrize("ir3", [False, True], ids=["ir8", "ir3-opset9"])
def test_initializers_are_classified(rng, ir3):
    proto = _classification_model(rng, ir3)
    model = ot.from_onnx(proto)
    roles = {p.name: p.role for p in model.params()}
    assert roles == {"w": "trainable", "b": "trainable", "gamma": "trainable", "beta": "trainable",
                     "stat_a": "buffer", "stat_b": "buffer"}
    assert [s.name for s in model.input_specs] == ["x"]
    fg = model.forward_graph()
    assert {t.name for t in fg.proto.graph.initializer} == {"half", "shape", "exponent"}
    assert fg.proto.ir_version >= 8 and opsets.default_opset(fg.proto) == 17
    x = _f32(rng, 5, 3)
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in proto.graph.initializer}
    h = (x @ w["w"] + w["b"]) * 0.5  # numpy: onnx's reference BatchNormalization-9 differs from the spec
    bn = (h - w["stat_a"]) / np.sqrt(w["stat_b"] + 1e-5) * w["gamma"] + w["beta"]
    np.testing.assert_allclose(model.predict(x), bn ** 2, rtol=1e-5, atol=1e-5)


def test_trainable_and_frozen_take_names_and_globs(rng):
    proto = _classification_model(rng)
    roles = {p.name: p.role for p in ot.from_onnx(proto, frozen=["w", "g*"]).params()}
    assert roles["w"] == roles["gamma"] == "frozen" and roles["b"] == "trainable"
    roles = {p.name: p.role for p in ot.from_onnx(proto, trainable="b*").params()}
    assert roles == {"w": "frozen", "b": "trainable", "gamma": "frozen", "beta": "trainable",
                     "stat_a": "buffer", "stat_b": "buffer"}
    with pytest.raises(ot.OrtrainError, match=r"frozen: 'conv\*' matches no weight; weights are w, b, gamma"):
        ot.from_onnx(proto, frozen="conv*")
    with pytest.raises(ot.OrtrainError, match="trainable: expected weight names or glob patterns"):
        ot.from_onnx(proto, trainable=[3])


def _two_input_model(rng):
    nodes = [helper.make_node("MatMul", ["a", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["y"])]
    inits = [numpy_helper.from_array(_f32(rng, 3, 2), "w"), numpy_helper.from_array(_f32(rng, 2), "bias")]
    inputs = [_vi("a", [None, 3]), _vi("bias", [2])]  # bias: an input with a default value (IR 3 style)
    return _model(nodes, inputs, [_vi("y", [None, 2])], inits)


def test_input_names_select_and_order_inputs(rng):
    proto = _two_input_model(rng)
    assert [s.name for s in ot.from_onnx(proto).input_specs] == ["a"]
    with pytest.warns(UserWarning, match="input 'bias' has a fixed first axis of 2 where 'a' has a free batch"):
        model = ot.from_onnx(proto, input_names=["bias", "a"])  # fed, bias would be read batch first
    assert [s.name for s in model.input_specs] == ["bias", "a"]
    assert [p.name for p in model.params()] == ["w"]
    with pytest.raises(ot.OrtrainError, match=r"input_names: \['nope'\] are not inputs of the graph"):
        ot.from_onnx(proto, input_names=["nope"])
    with pytest.raises(ot.OrtrainError, match="expected distinct graph input names"):
        ot.from_onnx(proto, input_names=["a", "a"])
    two = _model([helper.make_node("Add", ["p", "q"], ["y"])], [_vi("p", [None, 2]), _vi("q", [None, 2])],
                 [_vi("y", [None, 2])])
    with pytest.raises(ot.OrtrainError, match=r"graph inputs \['q'\] have no initializer and are not listed"):
        ot.from_onnx(two, input_names=["p"])


# -- repairs ----------------------------------------------------------------------------------

def test_sum_becomes_a_chain_of_adds(rng):
    inits = [numpy_helper.from_array(_f32(rng, 3, 3), n) for n in ("w1", "w2", "w3")]
    nodes = [helper.make_node("MatMul", ["x", n], [f"m{n}"]) for n in ("w1", "w2", "w3")]
    nodes += [helper.make_node("Sum", ["mw1", "mw2", "mw3"], ["s"], name="the_sum"),
              helper.make_node("Sum", ["s"], ["y"], name="single")]
    proto = _model(nodes, [_vi("x", [None, 3])], [_vi("y", [None, 3])], inits)
    fixed, n = repairs.sum_to_add(proto)
    assert n == 2 and [x.op_type for x in fixed.graph.node][-3:] == ["Add", "Add", "Identity"]
    x = _f32(rng, 4, 3)
    want = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    np.testing.assert_allclose(ReferenceEvaluator(fixed).run(None, {"x": x})[0], want, rtol=1e-6)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-6)
    with ot.Trainer(model, batch_size=4) as tr:  # the gradient builder accepts the result
        np.testing.assert_allclose(tr.step(x, np.zeros((4, 3))), np.mean(want ** 2), rtol=1e-5)


def test_tanh_gelu_trains_with_the_tanh_formulas_gradient(rng):
    """onnxruntime differentiates every Gelu as the erf one; the repaired graph must give the
    derivative of the tanh formula (numpy, written out below)."""
    w = _f32(rng, 3, 4)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["u"]),
             helper.make_node("Gelu", ["u"], ["y"], approximate="tanh", name="act")]
    proto = _model(nodes, [_vi("x", [None, 3])], [_vi("y", [None, 4])], [numpy_helper.from_array(w, "w")],
                   opset=20, ir=9)
    fixed, n = repairs.gelu_tanh_as_arithmetic(proto)
    assert n == 1 and "Gelu" not in [x.op_type for x in fixed.graph.node]
    x, target = 2 * _f32(rng, 16, 3), _f32(rng, 16, 4)
    u = x.astype(np.float64) @ w
    k, c = np.sqrt(2 / np.pi), 0.044715
    t = np.tanh(k * (u + c * u ** 3))
    y = 0.5 * u * (1 + t)
    dy_du = 0.5 * (1 + t) + 0.5 * u * (1 - t ** 2) * k * (1 + 3 * c * u ** 2)
    grad_w = x.T @ (2 * (y - target) / y.size * dy_du)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=1.0), loss="mse")
    np.testing.assert_allclose(model.predict(x), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ReferenceEvaluator(fixed).run(None, {"x": x})[0], y, rtol=1e-5, atol=1e-6)
    with ot.Trainer(model, batch_size=16) as tr:
        np.testing.assert_allclose(tr.step(x, target), np.mean((y - target) ** 2), rtol=1e-5)
        np.testing.assert_allclose(w - tr.model().get_weights()[0], grad_w, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("act", ["PReLU", "ELU", "Softplus", "Hardsigmoid", "Hardswish"])
def test_activations_without_a_gradient_builder_train_like_pytorch(tmp_path, act):
    """Written out in ops the runtime differentiates, with PyTorch's derivative at the kinks too:
    the inputs hit 0 and +-3 exactly (a zero bias in front), and the far tails."""
    from conftest import torch_or_skip
    torch = torch_or_skip()
    nn = torch.nn
    make = {"PReLU": lambda: nn.PReLU(6, init=0.25), "ELU": lambda: nn.ELU(alpha=0.7), "Softplus": nn.Softplus,
            "Hardsigmoid": nn.Hardsigmoid, "Hardswish": nn.Hardswish}[act]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.b, self.act, self.out = nn.Parameter(torch.zeros(6)), make(), nn.Linear(6, 2)

        def forward(self, x):
            return self.out(self.act(x + self.b))

    torch.manual_seed(0)
    net = Net()
    x = np.array([[0, 3, -3, 1, -1, 0.5], [30, -30, 2.5, -2.5, 0, 3], [-0.5, 0, -3, 3, 25, -25]], np.float32)
    near = np.nextafter(np.float32(3), np.float32(0))   # just inside the kinks, where a rounded z is 0 or 1
    x = np.concatenate([x, [[near, -near, near, -near, 1e-8, -1e-8]],
                        np.random.default_rng(0).standard_normal((4, 6)) * 4]).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((8, 2)).astype(np.float32)
    path = tmp_path / "net.onnx"
    torch.onnx.export(net, (torch.from_numpy(x),), str(path), input_names=["x"], output_names=["y"], opset_version=17,
                      dynamic_axes={"x": {0: "batch"}}, do_constant_folding=False, dynamo=False)
    model = ot.from_onnx(path).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    assert act.upper() not in {n.op_type.upper() for n in model.forward_graph().proto.graph.node}
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with ot.Trainer(model, batch_size=8) as tr:
        loss = tr.step(x, y)
        ref = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad()
        ref.backward()
        opt.step()
        np.testing.assert_allclose(loss, ref.item(), rtol=1e-6)
        trained = tr.model()
    got = dict(zip(trained.weight_names(), trained.get_weights(), strict=True))
    want = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    np.testing.assert_allclose(got["b"], want["b"], rtol=1e-6, atol=1e-7)   # the activation's derivative
    if act == "PReLU":
        np.testing.assert_allclose(got["act.weight"], want["act.weight"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(trained.predict(x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_castlike_becomes_cast(rng):
    w = _f32(rng, 3, 2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("CastLike", ["h", "like"], ["h64"]),
             helper.make_node("Mul", ["h64", "h64"], ["sq"]), helper.make_node("Cast", ["sq"], ["y"], to=1)]
    proto = _model(nodes, [_vi("x", [None, 3])], [_vi("y", [None, 2])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1.0), "like")], opset=17)
    fixed, n = repairs.activations_as_arithmetic(proto)
    cast = fixed.graph.node[1]
    assert n == 1 and cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.DOUBLE
    x = _f32(rng, 4, 3)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=4) as tr:
        np.testing.assert_allclose(tr.step(x, np.zeros((4, 2))), np.mean((x @ w) ** 4), rtol=1e-5)


def test_single_output_layernorm_gets_its_statistics(rng):
    inits = [numpy_helper.from_array(_f32(rng, 4, 6), "w"), numpy_helper.from_array(_f32(rng, 6), "g"),
             numpy_helper.from_array(_f32(rng, 6), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    proto = _model(nodes, [_vi("x", [None, 4])], [_vi("y", [None, 6])], inits)
    fixed, n = repairs.layernorm_with_statistics(proto)
    assert n == 1 and len(fixed.graph.node[1].output) == 3
    x, y = _f32(rng, 8, 4), _f32(rng, 8, 6)
    want = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-5)
    with ot.Trainer(model, batch_size=8) as tr:
        np.testing.assert_allclose(tr.step(x, y), np.mean((want - y) ** 2), rtol=1e-5)
        assert tr.step(x, y) < np.mean((want - y) ** 2)


@pytest.mark.parametrize("form", ["cross_entropy", "nll_of_log_softmax", "weighted", "weighted by a buffer",
                                  "nll weighted by a buffer"])
def test_a_loss_exported_inside_the_model_trains_as_in_torch(form):
    # PyTorch writes F.cross_entropy as a one-output SoftmaxCrossEntropyLoss, whose gradient reads the
    # log_prob output: training asserted in the gradient builder ("i < node_->OutputDefs().size()").
    # Class weights held in a buffer (an initializer) were taken for a trainable weight, which the
    # loss gives no gradient: the builder failed ("failed to find NodeArg by name: w_grad")
    import io
    import warnings

    from conftest import torch_or_skip
    torch = torch_or_skip()
    F = torch.nn.functional
    torch.manual_seed(0)
    class_weight = torch.tensor([0.5, 2.0, 1.0])

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = torch.nn.Linear(4, 3)
            self.register_buffer("class_weight", class_weight * 1.5)

        def forward(self, x, y):
            z = self.dense(x)
            if form == "nll_of_log_softmax":
                return F.nll_loss(F.log_softmax(z, 1), y, reduction="none")
            if form == "nll weighted by a buffer":
                return F.nll_loss(F.log_softmax(z, 1), y, weight=self.class_weight, reduction="none")
            weight = {"weighted": class_weight, "weighted by a buffer": self.class_weight}.get(form)
            return F.cross_entropy(z, y, reduction="none", weight=weight)
    net = Net()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(x), torch.from_numpy(y)), buf, dynamo=False, input_names=["x", "y"],
                          output_names=["loss"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}, "loss": {0: "b"}})
    model = ot.from_onnx(buf.getvalue())
    assert model.weight_names() == ["dense.weight", "dense.bias"]
    np.testing.assert_allclose(model.predict([x, y]), net(torch.from_numpy(x), torch.from_numpy(y)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mae")  # against 0: the mean of the per-row losses
    model.fit([x, y], np.zeros(8, np.float32), batch_size=8, epochs=2, shuffle=False, verbose=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        net(torch.from_numpy(x), torch.from_numpy(y)).abs().mean().backward()
        opt.step()
    for got, want in zip(model.get_weights(), (net.dense.weight, net.dense.bias)):
        np.testing.assert_allclose(got.reshape(want.shape), want.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,outputs", [("SoftmaxCrossEntropyLoss", ["loss", ""]), ("LayerNormalization", ["y", ""]),
                                        ("LayerNormalization", ["y", "", ""])])
def test_optional_outputs_left_out_by_an_empty_name_get_one(rng, op, outputs):
    # outputs ["loss", ""] (valid ONNX) were not counted as left out: the gradient builder failed
    # ("INVALID_ARGUMENT", "input 3 is marked single but has an empty string in the graph")
    w = _f32(rng, 4, 3)
    x, labels = _f32(rng, 8, 4), rng.integers(0, 3, 8)
    trained = []
    for outs in (outputs[:1], outputs):
        if op == "LayerNormalization":
            proto = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                            helper.make_node(op, ["h", "s", "b"], outs, axis=-1)], [_vi("x", ["N", 4])],
                           [_vi("y", ["N", 3])], [numpy_helper.from_array(w, "w"),
                                                  numpy_helper.from_array(np.ones(3, np.float32), "s"),
                                                  numpy_helper.from_array(np.zeros(3, np.float32), "b")])
            feeds, target, loss = x, np.ones((8, 3), np.float32), "mse"
        else:
            proto = _model([helper.make_node("MatMul", ["x", "w"], ["z"]),
                            helper.make_node(op, ["z", "y"], outs, reduction="none")],
                           [_vi("x", ["N", 4]), _vi("y", ["N"], onnx.TensorProto.INT64)], [_vi("loss", ["N"])],
                           [numpy_helper.from_array(w, "w")], opset=13)
            feeds, target, loss = [x, labels], np.zeros(8, np.float32), "mae"
        model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.5), loss=loss)
        model.fit(feeds, target, batch_size=8, verbose=0)
        trained.append(model.get_weights()[0])
    np.testing.assert_array_equal(trained[1], trained[0])  # as the node that leaves them out at the end
    assert not np.array_equal(trained[0], w)


def _bn_train_first_loss(path, x, y):
    """Loss of the first training step from the original file: the reference evaluator runs its
    three-output BatchNormalization in training mode (batch statistics)."""
    logits = ReferenceEvaluator(str(path)).run(None, {"x": x})[0].astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    return -logp[np.arange(len(y)), y].mean()


def test_training_mode_batchnorm_is_written_in_inference_form(rng):
    path = DATA / "cnn_bn_train.onnx"
    original = onnx.load(str(path))
    assert len(next(n for n in original.graph.node if n.op_type == "BatchNormalization").output) == 3
    model = ot.from_onnx(path)
    bn = next(n for n in model.forward_graph().proto.graph.node if n.op_type == "BatchNormalization")
    assert len(bn.output) == 1 and not any(a.name == "training_mode" for a in bn.attribute)
    roles = {p.name: p.role for p in model.params()}
    assert roles["1.running_mean"] == roles["1.running_var"] == "buffer"
    x, y = _f32(rng, 4, 3, 6, 6), np.array([0, 2, 1, 2])
    inference, _ = repairs.batchnorm_inference_form(original)
    np.testing.assert_allclose(model.predict(x), ReferenceEvaluator(inference).run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    with ot.Trainer(model, batch_size=4) as tr:
        ev = tr.eval(x, y)  # the eval graph is valid: no 3-output batch norm left in it
        np.testing.assert_allclose(tr.step(x, y), _bn_train_first_loss(path, x, y), rtol=1e-5)
    logits = model.predict(x).astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(ev, -logp[np.arange(4), y].mean(), rtol=1e-5)


def test_dropout_gets_a_training_input(rng):
    inits = [numpy_helper.from_array(_f32(rng, 5, 64), "w"), numpy_helper.from_array(np.array(0.5, np.float32), "r")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Dropout", ["h", "r"], ["y"])]
    proto = _model(nodes, [_vi("x", [None, 5])], [_vi("y", [None, 64])], inits)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = _f32(rng, 4, 5)
    want = x @ numpy_helper.to_array(inits[0])
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-6)  # a no-op in inference
    with ot.Trainer(model, batch_size=4) as tr:
        losses = {round(tr.step(x, np.zeros((4, 64))), 6) for _ in range(4)}
        np.testing.assert_allclose(tr.predict(x), want, rtol=1e-5, atol=1e-6)
    assert len(losses) > 1  # a fresh mask at every training step


# -- opsets -----------------------------------------------------------------------------------

def test_newer_than_supported_opsets_are_converted_down(rng):
    w = numpy_helper.from_array(_f32(rng, 3, 2), "w")
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [None, 3])],
                   [_vi("y", [None, 2])], [w], opset=22, ir=10)
    fg = ot.from_onnx(proto).forward_graph()
    assert opsets.default_opset(fg.proto) == opsets.MAX_OPSET and fg.proto.ir_version <= 10


def _opset18_model(rng, head):
    """x -> MatMul -> ReduceMean over a middle axis with axes as an input (the opset 18 form) -> head."""
    inits = [numpy_helper.from_array(_f32(rng, 4, 3), "w"), numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h", "ax"], ["m"], keepdims=0)]
    nodes.append(helper.make_node(head, ["m"], ["y"]) if head != "Identity" else
                 helper.make_node("Identity", ["m"], ["y"]))
    return _model(nodes, [_vi("x", [None, 2, 4])], [_vi("y", [None, 3])], inits, opset=18)


def _numpy_loss(name, p, y):
    p = p.astype(np.float64)
    eps = 1e-7
    if name == "mse":
        return np.mean((p - y) ** 2)
    if name == "mae":
        return np.mean(np.abs(p - y))
    if name == "huber":
        d = np.abs(p - y)
        return np.mean(np.where(d <= 1.0, 0.5 * d ** 2, d - 0.5))
    if name == "bce":
        q = np.clip(p, eps, 1 - eps)
        return -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))
    if name == "bce_logits":
        return np.mean(np.maximum(p, 0) - p * y + np.log1p(np.exp(-np.abs(p))))
    logp = np.log(np.clip(p, eps, 1 - eps)) if name in ("cce", "scce") else \
        p - p.max(1, keepdims=True) - np.log(np.exp(p - p.max(1, keepdims=True)).sum(1, keepdims=True))
    if name.startswith("scce"):
        return -logp[np.arange(len(y)), y].mean()
    return -(y * logp).sum(1).mean()


LOSSES_AT_18 = {
    "mse": ("Identity", "mse"), "mae": ("Identity", "mae"), "huber": ("Identity", "huber"),
    "cce": ("Softmax", "categorical_crossentropy"),
    "cce_logits": ("Identity", ot.losses.CategoricalCrossentropy(from_logits=True)),
    "scce": ("Softmax", "sparse_categorical_crossentropy"),
    "scce_logits": ("Identity", ot.losses.SparseCategoricalCrossentropy(from_logits=True)),
    "bce": ("Sigmoid", "binary_crossentropy"),
    "bce_logits": ("Identity", ot.losses.BinaryCrossentropy(from_logits=True)),
}


@pytest.mark.parametrize("name", sorted(LOSSES_AT_18))
def test_every_loss_trains_an_opset18_model(rng, name):
    head, loss = LOSSES_AT_18[name]
    proto = _opset18_model(rng, head)
    model = ot.from_onnx(proto)
    assert opsets.default_opset(model.forward_graph().proto) == 18
    model.compile(optimizer=ot.optim.SGD(lr=0.05), loss=loss)
    x = _f32(rng, 6, 2, 4)
    if name.startswith("scce"):
        y = rng.integers(0, 3, 6)
    elif name.startswith(("cce", "bce")):
        y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 6)]
    else:
        y = _f32(rng, 6, 3)
    p = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    with ot.Trainer(model, batch_size=6) as tr:
        first = tr.step(x, y)
        second = tr.step(x, y)
    np.testing.assert_allclose(first, _numpy_loss(name, p, y), rtol=1e-5, atol=1e-6)
    assert second < first


# -- gradient support -------------------------------------------------------------------------

def test_gradient_table_matches_the_engine():
    probe = load_data_module("probe_gradient_ops")
    found = probe.probe()
    assert len(found) > 100
    wrong = {op: v for op, v in found.items()
             if v in ("yes", "no") and (v == "yes") != (op in gradient_ops.GRADIENT_OPS)}
    assert wrong == {}
    assert found["LRN"] == found["Sum"] == "no" and found["Conv"] == "yes"


def test_alexnet_lrn_is_refused_with_its_nodes():
    with pytest.raises(ot.UnsupportedOpError, match=r"cannot differentiate these nodes.*: LRN \(nodes: n2, n6\)"):
        ot.from_onnx(make_models.light_model("bvlc_alexnet"))


def _conv_net(rng, middle):
    inits = [numpy_helper.from_array(_f32(rng, 4, 3, 3, 3) * 0.3, "conv1.w"),
             numpy_helper.from_array(_f32(rng, 2, 4, 3, 3) * 0.3, "conv2.w")]
    nodes = [helper.make_node("Conv", ["x", "conv1.w"], ["c1"], pads=[1, 1, 1, 1], name="conv1")]
    prev = "c1"
    for i, (op, attrs) in enumerate(middle):
        nodes.append(helper.make_node(op, [prev], [f"m{i}"], name=f"{op.lower()}_{i}", **attrs))
        prev = f"m{i}"
    nodes += [helper.make_node("Conv", [prev, "conv2.w"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
              helper.make_node("GlobalAveragePool", ["c2"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    return _model(nodes, [_vi("x", [None, 3, 5, 5])], [_vi("y", [None, 2])], inits)


def test_every_unsupported_op_is_named_in_one_error(rng):
    proto = _conv_net(rng, [("LRN", {"size": 3}), ("Shrink", {}), ("Hardmax", {}), ("Shrink", {})])
    with pytest.raises(ot.UnsupportedOpError) as info:
        ot.from_onnx(proto)
    msg = str(info.value)
    for part in ("Hardmax (nodes: hardmax_2)", "LRN (nodes: lrn_0)", "Shrink (nodes: shrink_1, shrink_3)",
                 "Freeze the weights before them"):
        assert part in msg


def test_freezing_the_weights_before_an_unsupported_op_makes_it_trainable(rng):
    proto = _conv_net(rng, [("LRN", {"size": 3})])
    model = ot.from_onnx(proto, frozen="conv1.*").compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = _f32(rng, 4, 3, 5, 5), _f32(rng, 4, 2)
    want = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    with ot.Trainer(model, batch_size=4) as tr:
        np.testing.assert_allclose(tr.step(x, y), np.mean((want - y) ** 2), rtol=1e-4)
        after = dict(zip(tr.model().weight_names(), tr.model().get_weights(), strict=True))
    w = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    np.testing.assert_array_equal(after["conv1.w"], w["conv1.w"])
    assert not np.allclose(after["conv2.w"], w["conv2.w"])


# -- the batch dimension ------------------------------------------------------------------------

def _reshape_model(rng, target):
    inits = [numpy_helper.from_array(_f32(rng, 2, 3, 4), "w"),
             numpy_helper.from_array(np.array(target, np.int64), "shape")]
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])]
    return _model(nodes, [_vi("x", [2, 2, 3, 4])], [_vi("y", [2, 24])], inits)


def test_a_fixed_batch_is_freed_where_the_graph_allows_it(rng):
    proto = _reshape_model(rng, [-1, 24])
    model = ot.from_onnx(proto)
    assert model.input_specs[0].shape == (None, 2, 3, 4) and model.output_specs[0].shape == (None, 24)
    x = _f32(rng, 5, 2, 3, 4)
    np.testing.assert_allclose(model.predict(x), (x * numpy_helper.to_array(proto.graph.initializer[0]))
                               .reshape(5, 24), rtol=1e-6)


def test_a_hard_coded_reshape_keeps_the_batch_fixed(rng):
    model = ot.from_onnx(_reshape_model(rng, [2, 24]))
    assert model.input_specs[0].shape == (2, 2, 3, 4)
    _, blockers = batch_dimension.free_batch_dimension(_reshape_model(rng, [2, 24]), ["x"])
    assert blockers == ["Reshape 'y' to the constant shape [2, 24]", "output 'y' keeps a first dimension of 2"]
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.ShapeError, match=r"batch_size=3: the model's input 'x' has a fixed batch of 2 rows "
                                            r"\(2, 2, 3, 4\); use batch_size=2 or re-export the model with a dynamic batch axis"):
        ot.Trainer(model, batch_size=3)


def test_dynamo_export_keeps_its_pinned_batch():
    model = ot.from_onnx(DATA / "convnet_dynamo" / "model.onnx").compile(optimizer="sgd", loss="mse")
    assert model.input_specs[0].shape == (4, 3, 6, 6)
    with pytest.raises(ot.ShapeError, match="has a fixed batch of 4 rows"):
        ot.Trainer(model, batch_size=8)


def test_imported_dropout_is_seeded_by_set_seed(rng):
    w = _f32(rng, 4, 16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Dropout", ["h"], ["y"], name="drop")]
    proto = _model(nodes, [_vi("x", [None, 4])], [_vi("y", [None, 16])], [numpy_helper.from_array(w, "w")])
    x, y = _f32(rng, 8, 4), np.zeros((8, 16), np.float32)

    def losses():
        model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        with ot.Trainer(model, batch_size=8) as tr:
            return [tr.step(x, y) for _ in range(3)]

    ot.set_seed(11)
    first = losses()
    ot.set_seed(11)
    assert losses() == first                       # the same masks, step after step
    ot.set_seed(None)
    graph = ot.from_onnx(proto).forward_graph().proto.graph
    assert not any(a.name == "seed" for n in graph.node if n.op_type == "Dropout" for a in n.attribute)


def test_an_output_declared_with_the_example_length_trains_at_any_length(rng):
    """PyTorch's dynamo exporter declares a recurrent layer's output with the example's length,
    (batch, 7, classes) for an input of free length: predictions ran at any length, but fit took
    the declared 7 for the labels and refused those of a longer batch."""
    w = rng.standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Reshape", ["h", "s"], ["out"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", "t", 4])],
                          [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", 7, 5])],
                          [numpy_helper.from_array(w, "w")])
    m = ot.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert m.output_specs[0].shape == (None, None, 5)
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x = rng.standard_normal((2, 9, 4)).astype(np.float32)
    y = rng.standard_normal((2, 9, 5)).astype(np.float32)
    m.fit(x, y, batch_size=2, shuffle=False, verbose=0)
    d = x.astype(np.float64) @ w - y
    want = w - 0.1 * np.einsum("btf,btk->fk", x.astype(np.float64), 2 * d / d.size)
    np.testing.assert_allclose(m.get_weights()[0], want, rtol=1e-5, atol=1e-6)


def _reshaped_model(nodes, inits, declared):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", "t", 4])],
                          [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, declared)], inits)
    return ot.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def test_an_output_onnx_cannot_size_takes_labels_of_the_length_the_runtime_predicts(rng):
    """Where onnx's shape inference cannot tell an output's length (a shape computed through ops it
    does not follow, as in a recurrent layer's export), the output is declared free and the labels
    of each batch are checked against the prediction the runtime makes: after freeing it, labels
    of any length trained (cross-entropy reads a subset without a word)."""
    w = rng.standard_normal((4, 5)).astype(np.float32)
    m = _reshaped_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
                         helper.make_node("Max", ["s", "s"], ["s2"]), helper.make_node("Reshape", ["h", "s2"], ["out"])],
                        [numpy_helper.from_array(w, "w")], ["N", 7, 5])
    assert m.output_specs[0].shape == (None, None, 5)
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x = rng.standard_normal((2, 9, 4)).astype(np.float32)
    before = m.get_weights()
    for wrong in [(2, 3, 5), (2, 1, 5), (2, 7, 5)]:
        with pytest.raises(ot.ShapeError, match=r"y: expected shape \(2, 9, 5\), received \(2, " + str(wrong[1])):
            m.fit(x, np.zeros(wrong, np.float32), batch_size=2, verbose=0)
    np.testing.assert_array_equal(before[0], m.get_weights()[0])
    m.fit(x, np.zeros((2, 9, 5), np.float32), batch_size=2, verbose=0)


def test_an_output_whose_positions_stay_fixed_keeps_its_declared_size(rng):
    """``h.reshape(b, -1, 3)`` after pooling the sequence away is (batch, 4, 3) at any length: onnx
    could not tell with the length free, and the 4 was freed, so labels of any length trained."""
    w = rng.standard_normal((4, 12)).astype(np.float32)
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    m = _reshaped_model([helper.make_node("ReduceMean", ["x", "ax1"], ["p"], keepdims=0),
                         helper.make_node("MatMul", ["p", "w"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
                         helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                         helper.make_node("Concat", ["n", "rest"], ["shape"], axis=0),
                         helper.make_node("Reshape", ["h", "shape"], ["out"])],
                        [numpy_helper.from_array(w, "w"), c("ax1", [1]), c("zero", [0]), c("rest", [-1, 3])],
                        ["N", 4, 3])
    assert m.output_specs[0].shape == (None, 4, 3)
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(ot.ShapeError, match=r"y: expected shape \(4, 4\), received \(4, 1\)"):
        m.evaluate(rng.standard_normal((4, 9, 4)).astype(np.float32), np.zeros((4, 1), np.int64))


def test_an_output_sized_by_the_batch_takes_its_labels(rng):
    """``x @ w @ x.T`` is (batch, batch): the runtime's prediction for one row of zeros said
    (1, 1), and labels of a batch of 3 were refused; one row and two disagree, so it stays
    unknown and onnxruntime has the last word."""
    w = rng.standard_normal((4, 4)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                           helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
                           helper.make_node("MatMul", ["h", "xt"], ["out"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", "M"])],
                          [numpy_helper.from_array(w, "w")])
    m = ot.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    m.compile(optimizer=ot.optim.SGD(lr=0.01), loss="mse")
    x = rng.standard_normal((3, 4)).astype(np.float32)
    m.fit(x, np.zeros((3, 3), np.float32), batch_size=3, verbose=0)
    np.testing.assert_allclose(m.predict(x), x @ m.get_weights()[0] @ x.T, rtol=1e-5, atol=1e-5)


def test_predict_in_chunks_refuses_outputs_without_a_batch_axis(tmp_path, rng):
    # Predictions in chunks are joined on the first axis: an output whose first axis is not the
    # batch (a transpose, a reduction, a flattening of the batch) cannot be joined, and is refused
    # with the fix; all rows at once still gives every output. Reference: numpy.
    w = _f32(rng, 3, 2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Transpose", ["y"], ["yt"]),
             helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0),
             helper.make_node("Reshape", ["y", "flat"], ["f"]),
             helper.make_node("MatMul", ["y", "yt"], ["g"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    # (a (N, N) similarity matrix: its chunks were its diagonal blocks, stacked into (10, 4) without a word)
    for outputs, name, seen in (([_vi("y", [None, 2]), _vi("yt", [2, "N"])], "yt", "declares its shape \\(2, 'N'\\)"),
                                ([_vi("y", [None, 2]), _vi("g", ["N", "N"])], "g", "declares its shape \\('N', 'N'\\)"),
                                ([_vi("y", [None, 2]), _vi("s", [])], "s", "declares its shape \\(\\)"),
                                ([_vi("f", [None]), _vi("y", [None, 2])], "f", "gave shape \\(8,\\) for a chunk of 4 rows")):
        path = tmp_path / f"{name}.onnx"
        onnx.save(_model(nodes, [_vi("x", ["N", 3])], outputs, inits), path)
        model = ot.from_onnx(str(path))
        x = rng.standard_normal((10, 3)).astype(np.float32)
        with pytest.raises(ot.OrtrainError, match=f"batch_size: expected every output to have the batch as its "
                                                  f"first axis.*output '{name}' has not \\(.*{seen}.*batch_size=None"):
            model.predict(x, batch_size=4)
        y = x @ w
        want = {"y": y, "yt": y.T, "s": y.sum(), "f": y.reshape(-1), "g": y @ y.T}
        for out, got in zip(outputs, model.predict(x)):
            np.testing.assert_allclose(got, want[out.name], rtol=1e-5, atol=1e-6)
        for out, got in zip(outputs, model.predict(x, batch_size=10)):  # one chunk: nothing to join
            np.testing.assert_allclose(got, want[out.name], rtol=1e-5, atol=1e-6)
    # a fixed first size equal to the chunks' rows: one run on a row fewer tells it from the batch
    path = tmp_path / "two.onnx"
    two = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "rows2"], ["r"])]
    onnx.save(_model(two, [_vi("x", ["N", 3])], [_vi("r", [2, None])],
                     inits[:1] + [numpy_helper.from_array(np.array([2, -1], np.int64), "rows2")]), path)
    x8 = rng.standard_normal((8, 3)).astype(np.float32)
    with pytest.raises(ot.OrtrainError, match="output 'r' has not \\(it gave shape \\(2, 1\\) for 1 rows\\)"):
        ot.from_onnx(str(path)).predict(x8, batch_size=2)
    np.testing.assert_allclose(ot.from_onnx(str(path)).predict(x8), (x8 @ w).reshape(2, -1), rtol=1e-5, atol=1e-6)
    # a fixed first size left in an export's declaration is no proof: the sizes the runs give decide
    path = tmp_path / "stale.onnx"
    onnx.save(_model(nodes[:1], [_vi("x", ["N", 3])], [_vi("y", [1, 2])], inits[:1]), path)
    x = rng.standard_normal((10, 3)).astype(np.float32)
    np.testing.assert_allclose(ot.from_onnx(str(path)).predict(x, batch_size=4), x @ w, rtol=1e-5, atol=1e-6)


def test_predict_in_chunks_refuses_an_output_whose_later_axis_follows_the_rows(rng):
    # a (batch, batch) matrix whose second axis an export left free without the batch's name (PyTorch's
    # legacy exporter): its chunks were its diagonal blocks, stacked into (10, 4) without a word. The
    # sizes of the runs tell, for chunks of equal rows (a run on a row fewer) and unequal ones alike.
    from ortrain._arrays import run_chunks
    from ortrain.graph import TensorSpec

    class GramRunner:  # what run_chunks asks of a session, for a graph declaring ("N", free) only
        output_names = ["g", "y"]

        def inputs_without_batch(self, data):
            return {}

        def declared_without_batch(self, data):
            return {}

        def batch_unnamed(self, data):
            return []

        def later_axes_free(self):
            return ["g", "y"]

        def run(self, feeds):
            x = feeds["x"]
            return [x @ x.T, x * 2]

    x = rng.standard_normal((10, 3)).astype(np.float32)
    specs = [TensorSpec("x", np.float32, (None, 3))]
    for batch_size, seen in ((5, r"\(4, 4\) for 4 rows and \(5, 5\) for 5"), (4, r"\(4, 4\) for 4 rows and \(2, 2\) for 2"),
                             (1, r"\(2, 2\) for 2 rows and \(1, 1\) for 1")):
        with pytest.raises(ot.OrtrainError, match=f"output 'g' has not \\(it gave shape {seen}: an axis after the "
                                                  "first follows the rows\\)"):
            run_chunks(GramRunner(), specs, [x], None, batch_size)
    GramRunner.output_names, GramRunner.later_axes_free = ["y"], lambda self: ["y"]
    GramRunner.run = lambda self, feeds: [feeds["x"] * 2]
    np.testing.assert_array_equal(run_chunks(GramRunner(), specs, [x], None, 4)[0], x * 2)  # a free later axis that keeps

    def even_rows_only(self, feeds):  # a graph for certain row counts: the run that tells fails, and
        if len(feeds["x"]) % 2:  # the later axes stay untold (an IndexError came out of the refusal)
            raise ot.OrtrainError("onnxruntime could not run the forward graph: odd rows")
        return [feeds["x"] * 2]
    GramRunner.run = even_rows_only
    np.testing.assert_array_equal(run_chunks(GramRunner(), specs, [x[:8]], None, 4)[0], x[:8] * 2)


def test_running_statistics_named_in_frozen_stay_fixed_as_model_freeze_keeps_them(tmp_path, rng):
    # from_onnx(frozen=...) names a batch norm's statistics as model.freeze does: those named (by a
    # pattern or exactly) keep their values and training normalises with them, so both ways train
    # alike; trainable= speaks of weights only, and statistics it leaves out still track.
    src = ot.Sequential([ot.layers.Dense(4, seed=1), ot.layers.BatchNorm(), ot.layers.Dense(2, seed=2)],
                        input_shape=(3,))
    path = str(tmp_path / "bn.onnx")
    src.export_onnx(path)
    x, y = rng.random((16, 3)).astype(np.float32), rng.random((16, 2)).astype(np.float32)

    def trained(model):
        model.compile(optimizer="adam", loss="mse")
        before = dict(zip(model.weight_names(), model.get_weights()))
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        after = dict(zip(model.weight_names(), model.get_weights()))
        return before, after

    stats = ["batch_norm_0.running_mean", "batch_norm_0.running_var"]
    # a pattern that picks statistics says what it does, where PyTorch's requires_grad=False differs
    with pytest.warns(UserWarning, match=r"from_onnx\(frozen=...\): the patterns pick the running statistics "
                                         r"batch_norm_0.running_mean, batch_norm_0.running_var: .*PyTorch's "
                                         r"requires_grad=False keeps normalising by the batch"):
        picked_by_pattern = ot.from_onnx(path, frozen=["batch_norm_0.*"])
    before, imported = trained(picked_by_pattern)
    frozen_later = ot.from_onnx(path)
    frozen_later.freeze(["batch_norm_0.*"])
    for name, value in trained(frozen_later)[1].items():
        np.testing.assert_array_equal(imported[name], value)
    for name in stats + ["batch_norm_0.gamma", "batch_norm_0.beta"]:
        np.testing.assert_array_equal(imported[name], before[name])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        named = ot.from_onnx(path, frozen=stats[:1])  # named exactly: chosen, no warning of patterns
    assert not any("the patterns pick" in str(w.message) for w in caught)
    before, exact = trained(named)
    for name in stats:
        np.testing.assert_array_equal(exact[name], before[name])
    assert not np.array_equal(exact["batch_norm_0.gamma"], before["batch_norm_0.gamma"])
    before, tracked = trained(ot.from_onnx(path, trainable=["dense_*"]))
    assert not np.array_equal(tracked[stats[0]], before[stats[0]])
    np.testing.assert_array_equal(tracked["batch_norm_0.gamma"], before["batch_norm_0.gamma"])
    # artifacts built from the file or from a model with frozen= are the same artifacts
    from_file = ot.artifacts.build(path, loss="mse", frozen=["batch_norm_0.*"], out_dir=tmp_path / "file")
    from_model = ot.artifacts.build(ot.from_onnx(path), loss="mse", frozen=["batch_norm_0.*"],
                                    out_dir=tmp_path / "model")
    assert from_file.key == from_model.key
    with ot.Trainer.from_artifacts(from_model.directory, batch_size=8) as tr:
        start = dict(zip(tr.model().weight_names(), tr.model().get_weights()))
        tr.step(x[:8], y[:8])
        for name, value in zip(tr.model().weight_names(), tr.model().get_weights()):
            if name in stats:
                np.testing.assert_array_equal(value, start[name])


def test_trainable_naming_only_running_statistics_is_refused():
    # trainable=["1.running_mean"] (a name the "matches no weight" refusal lists) left nothing to train,
    # every weight frozen, without a word
    path = DATA / "cnn_bn_train.onnx"
    for names in (["1.running_mean"], ["0.weight", "1.running_*"]):
        with pytest.raises(ot.OrtrainError, match=r"trainable: '1.running_(mean|\*)' names only running statistics "
                                                  r"\(1.running_mean(, 1.running_var)?\), which training steps move"):
            ot.from_onnx(path, trainable=names)
    model = ot.from_onnx(path, trainable=["1.*"])  # a glob reaching weights and statistics: the weights train
    roles = {p.name: p.role for p in model.params()}
    assert roles["1.weight"] == "trainable" and roles["1.running_mean"] == "buffer" and roles["0.weight"] == "frozen"


@pytest.mark.parametrize("op, dtype", [("Equal", onnx.TensorProto.UINT8), ("Less", onnx.TensorProto.INT16),
                                       ("GreaterOrEqual", onnx.TensorProto.UINT32),
                                       ("Greater", onnx.TensorProto.BFLOAT16)])
def test_a_comparison_of_a_type_the_runtime_cannot_compare_predicts_trains_and_exports(rng, tmp_path, op, dtype):
    # the dynamo exporter writes torch.eye(3) as an Equal of uint8 ranges: onnxruntime 1.19.2 has no kernel
    # for it, and neither predict nor training opened ("Could not find an implementation for Equal(19)")
    import onnxruntime as ort
    i64 = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
           {"zero": 0, "three": 3, "one": 1, "axis": [1]}.items()}
    w = _f32(rng, 3, 3)
    nodes = [helper.make_node("Range", ["zero", "three", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rows"], to=dtype),
             helper.make_node("Unsqueeze", ["rows", "axis"], ["column"]),
             helper.make_node(op, ["column", "rows"], ["mask"]),
             helper.make_node("Cast", ["mask"], ["maskf"], to=onnx.TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Unsqueeze", ["h", "axis"], ["h3"]),
             helper.make_node("Add", ["h3", "maskf"], ["y"])]
    proto = _model(nodes, [_vi("x", ["N", 3])], [_vi("y", ["N", 3, 3])],
                   [numpy_helper.from_array(w, "w"), *i64.values()], opset=19)
    x = _f32(rng, 4, 3)
    cmp = {"Equal": np.equal, "Less": np.less, "GreaterOrEqual": np.greater_equal, "Greater": np.greater}[op]
    mask = cmp(np.arange(3)[:, None], np.arange(3)).astype(np.float32)
    model = ot.from_onnx(proto)
    np.testing.assert_allclose(model.predict(x), (x @ w)[:, None, :] + mask, rtol=1e-6)
    target = _f32(rng, 4, 3, 3)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit(x, target, batch_size=4, verbose=0)
    grad = 2 * x.T @ (((x @ w)[:, None, :] + mask - target).sum(axis=1)) / target.size
    np.testing.assert_allclose(model.get_weights()[0], w - 0.1 * grad, rtol=1e-5, atol=1e-6)
    model.export_onnx(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], model.predict(x), rtol=1e-6)


@pytest.mark.parametrize("form, width", [("declared", 3), ("unflatten", 3), ("unflatten", 300)])
def test_an_output_declared_with_the_examples_batch_trains_at_any_batch(rng, form, width):
    # TorchScript declares an output it was not told is dynamic with the example's batch ([2, 3] for inputs
    # [batch, 8]): predict ran at 4 rows, but fit refused them with the runtime's message ("ortrain.label
    # ... Got: 4 Expected: 2"); unflatten's sizes come through a Mod of constants and a Slice of the input's
    # shape, which onnx's inference cannot follow: a run on zeros tells (also with a weight large enough
    # to be kept out of the graph while importing, 4 x 300)
    w = _f32(rng, 4, width)
    i64 = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    if form == "declared":
        nodes, inits = [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")]
    else:  # x (N, 8) -> (N, 2, 4) through a shape computed as TorchScript writes unflatten's -> sum -> @ w
        nodes = [helper.make_node("Mod", ["one", "two"], ["axis"]), helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("Slice", ["s", "zero", "axis"], ["lead"]),
                 helper.make_node("Add", ["axis", "one"], ["after"]),
                 helper.make_node("Slice", ["s", "after", "big"], ["rest"]),
                 helper.make_node("Concat", ["lead", "parts", "rest"], ["shape"], axis=0),
                 helper.make_node("Reshape", ["x", "shape"], ["r"]),
                 helper.make_node("ReduceSum", ["r", "one"], ["h"], keepdims=0),
                 helper.make_node("MatMul", ["h", "w"], ["y"])]
        inits = [numpy_helper.from_array(w, "w"), i64("one", [1]), i64("two", [2]), i64("zero", [0]),
                 i64("big", [2 ** 62]), i64("parts", [2, 4])]
    proto = _model(nodes, [_vi("x", ["batch", 4 if form == "declared" else 8])], [_vi("y", [2, width])], inits)
    model = ot.from_onnx(proto)
    x = _f32(rng, 4, 4 if form == "declared" else 8)
    h = x if form == "declared" else x.reshape(4, 2, 4).sum(1)
    y = np.zeros((4, width), np.float32)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=4, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], w - 0.1 * 2 * h.T @ (h @ w - y) / y.size, rtol=1e-5, atol=1e-6)


def test_an_output_whose_batch_the_graph_fixes_keeps_it(rng):
    # a Reshape to [2, -1] fixes the rows whatever the input's; a mean over the rows expanded to a shape
    # onnx's inference cannot follow keeps one row (declaring it free let fit broadcast it over the targets)
    from ortrain.engine.inference import run_model
    from ortrain.graph.batch_dimension import free_output_batch
    w = numpy_helper.from_array(_f32(rng, 4, 3), "w")
    two_rows = numpy_helper.from_array(np.array([2, -1], np.int64), "two_rows")
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "two_rows"], ["y"])],
                   [_vi("x", ["batch", 4])], [_vi("y", [2, 6])], [w, two_rows])
    assert free_output_batch(proto, ["x"], run=run_model) == (proto, [])
    i64 = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
           {"zero": [0], "one": [1], "three": [3]}.items()}
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                    helper.make_node("ReduceMean", ["h"], ["m"], axes=[0], keepdims=1),
                    helper.make_node("Shape", ["x"], ["s"], end=1), helper.make_node("Mul", ["s", "zero"], ["none"]),
                    helper.make_node("Max", ["none", "one"], ["rows"]),  # 1, by a Max inference cannot follow
                    helper.make_node("Concat", ["rows", "three"], ["shape"], axis=0),
                    helper.make_node("Expand", ["m", "shape"], ["y"])],
                   [_vi("x", ["batch", 4])], [_vi("y", [1, 3])], [w, *i64.values()], opset=15)
    from ortrain.graph.batch_dimension import _outputs_at
    assert not isinstance(_outputs_at(proto, 5, 4)[0][0], int)  # (the case: inference cannot tell)
    assert free_output_batch(proto, ["x"], run=run_model) == (proto, [])


def test_a_graph_whose_run_on_zeros_may_not_end_is_not_run_to_find_its_outputs_rows():
    # a Loop that ends once a sum of |x| reaches 1 never ends on zeros: from_onnx hung in the probe
    from ortrain.graph.batch_dimension import _rows_at_run_time
    body = helper.make_graph([helper.make_node("Add", ["s_in", "inc"], ["s_out"]),
                              helper.make_node("Less", ["s_out", "one"], ["c_out"]),
                              helper.make_node("Identity", ["s_out"], ["scan"])], "body",
                             [_vi("i", [], onnx.TensorProto.INT64), _vi("c", [], onnx.TensorProto.BOOL), _vi("s_in", [])],
                             [_vi("c_out", [], onnx.TensorProto.BOOL), _vi("s_out", []), _vi("scan", [])],
                             [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    proto = _model([helper.make_node("Abs", ["x"], ["ax"]), helper.make_node("ReduceSum", ["ax"], ["inc"], keepdims=0),
                    helper.make_node("Loop", ["", "t", "z"], ["fin", "sc"], body=body),
                    helper.make_node("Unsqueeze", ["sc", "ax1"], ["sc2"]), helper.make_node("Mul", ["sc2", "w"], ["y"])],
                   [_vi("x", ["N", 3])], [_vi("y", [2, 3])],
                   [numpy_helper.from_array(np.array(True), "t"), numpy_helper.from_array(np.array(0.0, np.float32), "z"),
                    numpy_helper.from_array(np.array([1], np.int64), "ax1"),
                    numpy_helper.from_array(np.ones((1, 3), np.float32), "w")])

    runs = []

    def run(model, feeds):
        runs.append(feeds)
        raise RuntimeError("not run here")
    assert _rows_at_run_time(proto, {"x"}, (4, 6), run) is None and runs == []
    model = ot.from_onnx(proto)
    assert model.predict(np.full((2, 3), 0.3, np.float32)).shape == (1, 3)  # (4 steps of 1.8 reach 1 at the first)


@pytest.mark.parametrize("elem", [onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                                  onnx.TensorProto.UINT64])
def test_16_bit_and_unsigned_integer_inputs_predict_and_train(elem):
    # 16-bit PCM audio cast inside the model: from_onnx refused the file ("ONNX element type INT16
    # is not supported"), which stock onnxruntime runs
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["pcm"], ["xf"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", ["xf", "s"], ["xs"]), helper.make_node("MatMul", ["xs", "w"], ["out"])]
    proto = _model(nodes, [_vi("pcm", ["b", 4], elem)], [_vi("out", ["b", 2])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1 / 32768, np.float32), "s")])
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    x = np.array([[1000, 2000, 32767, 3], [5, 6, 7, 8], [0, 40, 9, 300]]).astype(dtype)
    model = ot.from_onnx(proto)
    assert model.input_specs[0].dtype == dtype
    np.testing.assert_allclose(model.predict(x), ReferenceEvaluator(proto).run(None, {"pcm": x})[0], rtol=1e-6)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    y = rng.standard_normal((3, 2)).astype(np.float32)
    model.fit(x.astype(np.int64), y, batch_size=3, epochs=1, shuffle=False, verbose=0)  # int64 data is cast
    xs = x.astype(np.float64) / 32768
    np.testing.assert_allclose(model.get_weights()[0], w - 0.1 * 2 * xs.T @ (xs @ w - y) / y.size, rtol=1e-6,
                               atol=1e-7)
    with pytest.raises(ot.ShapeError, match=rf"x: holds (-1|70000), beyond the range of {dtype.name}"):
        model.predict(np.array([[-1, 0, 0, 0]]) if dtype.kind == "u" else np.array([[70000, 0, 0, 0]]))


@pytest.mark.parametrize("elem", [onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16])
def test_a_float64_or_float16_model_says_why_it_cannot_train(elem, tmp_path):
    # every refusal named another cause: "the model has no weights" for trainable=, a freeze message
    # cut off at "weights are ", "every weight is frozen ... unfreeze some weights" from the builder,
    # "make a float output the first one" of a float output; predictions were right
    rng = np.random.default_rng(0)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    w, b = rng.standard_normal((4, 3)).astype(dtype), rng.standard_normal(3).astype(dtype)
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["out"])],
                   [_vi("x", ["n", 4], elem)], [_vi("out", ["n", 3], elem)],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    name = {onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.FLOAT16: "float16"}[elem]
    with pytest.warns(UserWarning, match=rf"from_onnx: 2 {name} initializers a gradient reaches \('w', 'b'\) stay "
                                         r"constant: ortrain trains float32 weights only; export the model in "
                                         r"float32 .*model\.float\(\) before torch\.onnx\.export"):
        model = ot.from_onnx(proto)
    x = rng.standard_normal((5, 4)).astype(dtype)
    np.testing.assert_allclose(model.predict(x), ReferenceEvaluator(proto).run(None, {"x": x})[0],
                               rtol=1e-3 if name == "float16" else 1e-12)
    with pytest.raises(ot.OrtrainError, match=rf"trainable: 'w' is a constant, not a weight: it holds {name} "
                                              r"values, and ortrain trains float32 weights only"), \
            pytest.warns(UserWarning, match="stay constant"):
        ot.from_onnx(proto, trainable=["w"])
    with pytest.raises(ot.OrtrainError, match=r"freeze: 'w' matches no layer or weight; the model has no weights$"):
        model.freeze(["w"])
    with pytest.raises(ot.OrtrainError, match=r"nothing to train: the model has no weights; add a layer that has "
                                              r"some\. .* float16 and float64 initializers stay constants"), \
            pytest.warns(UserWarning, match="stay constant"):
        ot.artifacts.build(proto, loss="mse", optimizer="sgd", out_dir=tmp_path / "art")
    assert not (tmp_path / "art").exists()
    with pytest.raises(ot.OrtrainError, match=rf"the outputs are 'out' \({name}\)\. Export the model in float32"):
        model.compile(optimizer="sgd", loss="mse")
    assert model.optimizer is None


def test_files_from_the_wild_declared_rank_duplicate_names_and_quantized_models(rng, tmp_path):
    # An output declared (N, 1, 3) that computes (N, 3) took labels of the declared shape, which the
    # loss broadcast against the predictions (every sample's label against every prediction: 1.2362
    # where the rows paired give 1.2187); two nodes of one name imported and then failed in
    # onnxruntime; a quantized model failed training inside onnxruntime's QDQ pass.
    import onnxruntime as ort
    w = (rng.standard_normal((4, 3)) * 0.5).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)
    declared = _model([helper.make_node("MatMul", ["x", "w"], ["o"])], [_vi("x", ["N", 4])], [_vi("o", ["N", 1, 3])],
                      [numpy_helper.from_array(w, "w")])
    with pytest.warns(UserWarning, match=r"output 'o' is declared with shape \(N, 1, 3\) but computes \(N, 3\)"):
        model = ot.from_onnx(declared)
    assert model.output_specs[0].shape == (None, 3)
    fixed = _model([helper.make_node("MatMul", ["x", "w"], ["o"])], [_vi("x", [5, 4])], [_vi("o", [5, 1, 3])],
                   [numpy_helper.from_array(w, "w")])
    with pytest.warns(UserWarning, match=r"output 'o' is declared with shape \(5, 1, 3\) but computes"):
        ot.from_onnx(fixed)  # the file's declaration, not the freed batch's name
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=5) as tr:
        assert tr.step(x, y) == pytest.approx(np.mean((x @ w - y) ** 2), rel=1e-6)
        np.testing.assert_allclose(tr.get_weights()[0], w - 0.1 * 2 * x.T @ (x @ w - y) / y.size, atol=1e-6)
    twice = _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="n"),
                    helper.make_node("Relu", ["h"], ["r"], name="n"),
                    helper.make_node("MatMul", ["r", "v"], ["o"], name="n_1")],
                   [_vi("x", ["N", 4])], [_vi("o", ["N", 3])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w[:3].copy(), "v")])
    model = ot.from_onnx(twice)
    np.testing.assert_allclose(model.predict(x), np.maximum(x @ w, 0) @ w[:3], rtol=1e-6)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=5, verbose=0)
    saved = onnx.load(model.export_onnx(tmp_path / "twice.onnx"))
    assert [n.name for n in saved.graph.node] == ["n", "n_2", "n_1"]
    session = ort.InferenceSession(str(tmp_path / "twice.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], model.predict(x), rtol=1e-6)
    quantized = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                        helper.make_node("QuantizeLinear", ["h", "s", "z"], ["q"]),
                        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["o"])],
                       [_vi("x", ["N", 4])], [_vi("o", ["N", 3])],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                        numpy_helper.from_array(np.array(0, np.uint8), "z")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # below opset 21 the refusal at training says it all
        model = ot.from_onnx(quantized)
    assert model.predict(x).shape == (5, 3)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.OrtrainError, match=r"the model quantizes activations \(QuantizeLinear nodes: "
                                              r"QuantizeLinear#1\): onnxruntime-training 1.19.2 cannot train it below "
                                              r"opset 21 .*train the float model, then quantize it, or export it at "
                                              r"opset 21"):
        model.fit(x, y, verbose=0)


def _quantized_twins(rng, opset, quantize_input, per_channel=False):
    """A model whose first weight is stored int8 (DequantizeLinear of a constant; with
    ``per_channel``, a scale and zero point per output column) and, with ``quantize_input``, whose
    input passes a QuantizeLinear -> DequantizeLinear pair; and its float twin, the int8 weight
    dequantized by numpy (the input is fake-quantized by the caller)."""
    wq = rng.integers(-100, 100, (4, 8)).astype(np.int8)
    v = (rng.standard_normal((8, 3)) * 0.3).astype(np.float32)
    scale = np.linspace(0.01, 0.03, 8, dtype=np.float32) if per_channel else np.array(0.02, np.float32)
    zero = np.zeros(8, np.int8) if per_channel else np.array(0, np.int8)
    inits = [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(scale, "ws"),
             numpy_helper.from_array(zero, "wz"), numpy_helper.from_array(v, "v"),
             numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             numpy_helper.from_array(np.array(3, np.int8), "xz")]
    first = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])] if quantize_input else []
    nodes = [*first, helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1),
             helper.make_node("MatMul", ["xd" if quantize_input else "x", "w"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "v"], ["o"])]
    quantized = _model(nodes, [_vi("x", ["N", 4])], [_vi("o", ["N", 3])], inits, opset=opset)
    twin = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                   helper.make_node("MatMul", ["r", "v"], ["o"])], [_vi("x", ["N", 4])], [_vi("o", ["N", 3])],
                  [numpy_helper.from_array(wq.astype(np.float32) * scale, "w"), numpy_helper.from_array(v, "v")])
    return quantized, twin


@pytest.mark.parametrize("opset, quantize_input, per_channel",
                         [(17, False, False), (17, False, True), (21, False, False), (21, True, True)])
def test_weight_only_quantized_and_opset_21_qdq_models_train_as_their_float_twins(rng, opset, quantize_input,
                                                                                   per_channel):
    # A DequantizeLinear of a constant int8 weight (a weight-only quantized model) was refused as a
    # quantized model, where it trains: its float weights move as in the float model whose constant
    # weight numpy dequantized. From opset 21 onnxruntime's quantization-aware-training pass leaves a
    # QuantizeLinear alone, and a quantized input trains as the input quantized by numpy. A scale per
    # channel (a float vector) was taken for a weight, and the model refused: DequantizeLinear has no
    # gradient.
    quantized, twin = _quantized_twins(rng, opset, quantize_input, per_channel)
    assert ot.from_onnx(quantized).weight_names() == ["v"]  # the scales and zero points stay constants
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.standard_normal((16, 3)).astype(np.float32)
    fed = np.clip(np.round(x / np.float32(0.05)) + 3, -128, 127).astype(np.float32) * np.float32(0.05) - \
        np.float32(3 * 0.05) if quantize_input else x
    losses = []
    for proto, data in ((quantized, x), (twin, fed)):
        model = ot.from_onnx(proto, trainable=["v"])
        model.compile(optimizer="adam", loss="mse")
        losses.append(model.fit(data, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history["loss"])
        trained = model.get_weights()[-1]
        if proto is quantized:
            got = trained
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    np.testing.assert_allclose(got, trained, atol=1e-6)


def test_weights_before_a_quantized_activation_are_named_as_constants_with_the_node_that_stops_them(rng):
    # At opset 21 a float weight before a QuantizeLinear silently stayed a constant (no gradient
    # crosses its integers), and naming it in trainable= said it was read "as a shape, ratio, exponent"
    w1 = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((4, 2)) * 0.5).astype(np.float32)
    scale, zero = np.float32(0.05), np.uint8(128)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"], name="q_mid"),
             helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["hd"]),
             helper.make_node("MatMul", ["hd", "W2"], ["y"])]
    proto = _model(nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 2])],
                   [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(np.array(scale), "s"),
                    numpy_helper.from_array(np.array(zero), "z"), numpy_helper.from_array(w2, "W2")], opset=21)
    with pytest.warns(UserWarning, match=r"\('W1'\) stays constant: a gradient would cross 'q_mid' "
                                         r"\(QuantizeLinear\).*only the weights after the last one train"):
        model = ot.from_onnx(proto)
    assert model.weight_names() == ["W2"]
    with pytest.raises(ot.OrtrainError, match=r"trainable: 'W1' is a constant, not a weight: its gradient would "
                                              r"cross 'q_mid' \(QuantizeLinear\)"):
        ot.from_onnx(proto, trainable=["W1", "W2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what frozen= names is meant to stay
        assert ot.from_onnx(proto, frozen=["W1"]).weight_names() == ["W2"]
    for opset in (13, 19):  # (training refuses the model below opset 21, but trainable= gives the reason)
        with pytest.raises(ot.OrtrainError, match=r"'W1' is a constant, not a weight: its gradient would cross "
                                                  r"'q_mid' \(QuantizeLinear\)"):
            ot.from_onnx(_model(nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 2])], list(proto.graph.initializer),
                                opset=opset), trainable=["W1", "W2"])
    # the node named is one the gradient crosses: not one reached through the shape of h
    by_shape = [nodes[0], helper.make_node("Shape", ["h"], ["sh"]), helper.make_node("Cast", ["sh"], ["shf"], to=1),
                helper.make_node("QuantizeLinear", ["shf", "s", "z"], ["shq"], name="q_shape"),
                helper.make_node("DequantizeLinear", ["shq", "s", "z"], ["shd"]),
                helper.make_node("ReduceSum", ["shd"], ["r"], keepdims=0), *nodes[1:3],
                helper.make_node("MatMul", ["hd", "W2"], ["y0"]), helper.make_node("Mul", ["y0", "r"], ["y"])]
    with pytest.warns(UserWarning, match=r"\('W1'\) stays constant: a gradient would cross 'q_mid' "):
        ot.from_onnx(_model(by_shape, [_vi("x", ["N", 4])], [_vi("y", ["N", 2])], list(proto.graph.initializer),
                            opset=21))
    dynamic = _model([helper.make_node("MatMul", ["x", "W1"], ["h"]),
                      helper.make_node("Mul", ["h", "half"], ["hh"]),  # a one-value constant, not listed
                      helper.make_node("DynamicQuantizeLinear", ["hh"], ["hq", "hs", "hz"], name="dq_mid"),
                      helper.make_node("DequantizeLinear", ["hq", "hs", "hz"], ["hd"]),
                      helper.make_node("MatMul", ["hd", "W2"], ["y"])],
                     [_vi("x", ["N", 4])], [_vi("y", ["N", 2])],
                     [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(np.full(1, 0.5, np.float32), "half"),
                      numpy_helper.from_array(w2, "W2")], opset=21)
    for opset in (13, 21):  # (onnxruntime-training refuses no DynamicQuantizeLinear, at any opset)
        dynamic.opset_import[0].version = opset
        with pytest.warns(UserWarning, match=r"1 float32 initializer before quantized activations \('W1'\) stays "
                                             r"constant: a gradient would cross 'dq_mid' \(DynamicQuantizeLinear\)"):
            assert ot.from_onnx(dynamic).weight_names() == ["W2"]
    # a frozen= name that names a one-value constant exactly names it only: as a glob, "W[1]" would
    # pick W1 and silence its warning
    bracketed = _model([helper.make_node("Mul", ["x", "W[1]"], ["x1"]), *dynamic.graph.node[:]],
                       [_vi("x", ["N", 4])], [_vi("y", ["N", 2])],
                       [numpy_helper.from_array(np.full(1, 2.0, np.float32), "W[1]"), *dynamic.graph.initializer],
                       opset=21)
    bracketed.graph.node[1].input[0] = "x1"
    with pytest.warns(UserWarning, match=r"1 float32 initializer before quantized activations \('W1'\)"):
        ot.from_onnx(bracketed, frozen=["W[1]"])
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.standard_normal((8, 2)).astype(np.float32)
    hd = (np.clip(np.round(x @ w1 / scale) + 128, 0, 255) - 128).astype(np.float32) * scale  # numpy's Q then DQ
    np.testing.assert_allclose(model.predict(x), hd @ w2, rtol=1e-5, atol=1e-6)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], w2 - 0.1 * 2 * hd.T @ (hd @ w2 - y) / y.size, atol=1e-6)


def test_models_with_many_quantized_activations_import_in_time_linear_in_their_size(monkeypatch):
    # Finding the weights before a QuantizeLinear walked the graph once for each QuantizeLinear:
    # 14 s for a model of 1,000 (0.2 s before)
    import ortrain.nn.onnx_import as onnx_import
    blocks, nodes, inits = 50, [], [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                                    numpy_helper.from_array(np.array(128, np.uint8), "z")]
    h = "x"
    for i in range(blocks):
        inits.append(numpy_helper.from_array(np.eye(4, dtype=np.float32), f"W{i}"))
        nodes += [helper.make_node("MatMul", [h, f"W{i}"], [f"m{i}"]),
                  helper.make_node("QuantizeLinear", [f"m{i}", "s", "z"], [f"q{i}"], name=f"q{i}"),
                  helper.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"d{i}"])]
        h = f"d{i}"
    proto = _model(nodes, [_vi("x", ["N", 4])], [_vi(h, ["N", 4])], inits, opset=21)
    walks = []
    reach = onnx_import.gradient_reach
    monkeypatch.setattr(onnx_import, "gradient_reach", lambda *a, **k: walks.append(1) or reach(*a, **k))
    with pytest.warns(UserWarning, match=rf"{blocks} float32 initializers before quantized activations \('W0', "
                                         r"'W1', .* cross 'q0' \(QuantizeLinear\), 'q1' \(QuantizeLinear\)"):
        model = ot.from_onnx(proto)
    assert model.weight_names() == [] and len(walks) <= 3
