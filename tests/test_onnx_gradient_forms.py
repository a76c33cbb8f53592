"""ONNX forms whose gradient onnxruntime-training 1.19.2 builds wrong, silently or with an error,
trained through ``ot.from_onnx`` after ortrain's rewrites (``ortrain.graph.gradient_forms``).
Reference: one SGD step of the same function in PyTorch float64 autograd, and its forward pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _onnx_helpers import model, vi
from conftest import torch_or_skip
from onnx import helper, numpy_helper

import ortrain as ot

pytestmark = pytest.mark.torch

N, M = 3, 5


def _node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs if isinstance(outputs, list) else [outputs], **attrs)


def _i64(*values):
    return np.array(values, np.int64)


def _one_sgd_step_matches_torch(nodes, x, out_shape, weights, forward, consts=None, opset=17, lr=0.1,
                                in_shape=None, training_forward=None):
    """Forward and weights after one SGD step on mean squared error, against PyTorch float64.
    ``in_shape``: the input's declared dimensions after the batch (names for free ones), by
    default ``x``'s. ``training_forward``: the forward of a training step where it differs
    (a batch norm's batch statistics)."""
    torch = torch_or_skip()
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in {**weights, **(consts or {})}.items()]
    in_shape = list(x.shape[1:]) if in_shape is None else in_shape
    proto = model(nodes, [vi("x", ["N", *in_shape])], [vi("out", ["N", *out_shape])], inits, opset=opset)
    tw = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in weights.items()}
    predicted = forward(torch.tensor(x.astype(np.float64)), tw)
    want = predicted if training_forward is None else training_forward(torch.tensor(x.astype(np.float64)), tw)
    y = np.random.default_rng(7).standard_normal(tuple(want.shape)).astype(np.float32)
    grads = torch.autograd.grad(((want - torch.tensor(y.astype(np.float64))) ** 2).mean(), list(tw.values()))
    m = ot.from_onnx(proto, trainable=list(weights))
    m.compile(optimizer=ot.optim.SGD(lr=lr), loss="mse")
    np.testing.assert_allclose(m.predict(x), predicted.detach().numpy(), rtol=1e-5, atol=1e-6)
    m.fit(x, y, batch_size=len(x), shuffle=False, verbose=0)
    got = dict(zip(m.weight_names(), m.get_weights(), strict=True))
    for (name, w0), g in zip(weights.items(), grads, strict=True):
        np.testing.assert_allclose(got[name].reshape(w0.shape), w0 - lr * g.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def _x(*shape, positive=False):
    a = np.random.default_rng(0).standard_normal((N, *shape)).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def test_pow_with_a_broadcast_base_sums_its_gradient(rng):
    # the runtime's Pow gradient left a (M,) base with an (N, M) gradient
    w = (np.abs(rng.standard_normal(M)) + 0.5).astype(np.float32)
    _one_sgd_step_matches_torch([_node("Pow", ["w", "x"], "out")], _x(M), [M], {"w": w},
                                lambda x, t: t["w"] ** x)
    b = (np.abs(rng.standard_normal((2, 1))) + 0.5).astype(np.float32)
    _one_sgd_step_matches_torch([_node("Pow", ["b", "x"], "out")], _x(2, M), [2, M], {"b": b},
                                lambda x, t: t["b"] ** x)


def test_pow_with_an_int64_or_float64_exponent_trains(rng):
    w = rng.standard_normal(M).astype(np.float32)
    for exponent in (np.array(3, np.int64), np.array(2.0, np.float64)):
        _one_sgd_step_matches_torch([_node("Mul", ["x", "w"], "h"), _node("Pow", ["h", "p"], "out")], _x(M), [M],
                                    {"w": w}, lambda x, t, p=float(exponent): (x * t["w"]) ** p, {"p": exponent})


def test_where_with_a_broadcast_value_sums_its_gradient(rng):
    w = rng.standard_normal(M).astype(np.float32)
    _one_sgd_step_matches_torch([_node("Greater", ["x", "zero"], "c"), _node("Where", ["c", "w", "x"], "out")],
                                _x(M), [M], {"w": w}, lambda x, t: (x > 0) * t["w"] + (x <= 0) * x,
                                {"zero": np.array(0, np.float32)})
    # masked_fill style: a constant mask of shape (1, M) picks a weight of shape (M,) or the input
    mask = np.array([[True, False, True, False, True]])
    _one_sgd_step_matches_torch([_node("Where", ["mask", "w", "x"], "out")], _x(M), [M], {"w": w},
                                lambda x, t: torch_where(mask, t["w"], x), {"mask": mask})


def torch_where(mask, a, b):
    torch = torch_or_skip()
    return torch.where(torch.tensor(mask), a, b)


def test_split_with_an_unread_output_trains(rng):
    # the Split gradient concatenated only the gradients that exist, one piece short
    w = rng.standard_normal(M).astype(np.float32)
    _one_sgd_step_matches_torch([_node("Mul", ["x", "w"], "h"), _node("Split", ["h", "sizes"], ["a", "b"], axis=1),
                                 _node("Mul", ["a", "a"], "out")], _x(M), [1], {"w": w},
                                lambda x, t: (x * t["w"])[:, :1] ** 2, {"sizes": _i64(1, 4)})
    v = rng.standard_normal((M, 6)).astype(np.float32)
    _one_sgd_step_matches_torch([_node("Split", ["v"], ["a", "b", "c"], axis=1), _node("MatMul", ["x", "b"], "out")],
                                _x(M), [2], {"v": v}, lambda x, t: x @ t["v"][:, 2:4])



def test_a_split_output_without_a_name_predicts_trains_and_exports(rng, tmp_path):
    """onnxruntime's Split kernel kills the process (SIGSEGV) on an output named "" (the checker
    takes it): from_onnx names it, so predict, the training step and the exported model run."""
    import onnxruntime as ort
    w = rng.standard_normal(M).astype(np.float32)
    nodes = [_node("Mul", ["x", "w"], "h"), _node("Split", ["h", "sizes"], ["a", ""], axis=1),
             _node("Mul", ["a", "a"], "out")]
    _one_sgd_step_matches_torch(nodes, _x(M), [2], {"w": w}, lambda x, t: (x * t["w"])[:, :2] ** 2,
                                {"sizes": _i64(2, 3)})
    proto = model(nodes, [vi("x", ["N", M])], [vi("out", ["N", 2])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_i64(2, 3), "sizes")])
    path = ot.from_onnx(proto).export_onnx(tmp_path / "m.onnx")
    x = _x(M)
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, (x * w)[:, :2] ** 2, rtol=1e-6)

@pytest.mark.parametrize("auto_pad, stride", [("SAME_UPPER", 1), ("SAME_UPPER", 2), ("SAME_LOWER", 2)])
def test_conv_with_auto_pad_same_trains(rng, auto_pad, stride):
    torch = torch_or_skip()
    w = (rng.standard_normal((3, 2, 3, 3)) * 0.3).astype(np.float32)
    x = _x(2, 6, 6)

    def forward(x, t):
        # SAME: total padding (out - 1) * stride + k - size, the odd cell at the end (UPPER) or start
        total = max((-(-6 // stride) - 1) * stride + 3 - 6, 0)
        small, large = total // 2, total - total // 2
        pad = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        return torch.nn.functional.conv2d(torch.nn.functional.pad(x, pad + pad), t["w"], stride=stride)

    side = -(-6 // stride)
    _one_sgd_step_matches_torch([_node("Conv", ["x", "w"], "out", auto_pad=auto_pad, strides=[stride, stride])], x,
                                [3, side, side], {"w": w}, forward)


def test_layer_norm_without_bias_and_transpose_without_perm_train(rng):
    torch = torch_or_skip()
    g = (1 + 0.1 * rng.standard_normal(M)).astype(np.float32)
    _one_sgd_step_matches_torch([_node("LayerNormalization", ["x", "g"], "out", axis=-1)], _x(M), [M], {"g": g},
                                lambda x, t: torch.nn.functional.layer_norm(x, (M,), t["g"], None, 1e-5))
    w = rng.standard_normal((M, 4)).astype(np.float32)
    _one_sgd_step_matches_torch([_node("Transpose", ["w"], "wt"), _node("MatMul", ["x", "wt"], "out")],
                                _x(4), [M], {"w": w}, lambda x, t: x @ t["w"].T)


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceLogSumExp"])
def test_reductions_without_keepdims_and_axes_as_an_attribute_train(rng, op):
    torch = torch_or_skip()
    w = rng.standard_normal((2, M)).astype(np.float32)
    reduce = {"ReduceL2": lambda h: torch.sqrt((h * h).sum(-1)), "ReduceLogSumExp": lambda h: h.logsumexp(-1)}[op]
    _one_sgd_step_matches_torch([_node("Mul", ["x", "w"], "h"), _node(op, ["h"], "out", axes=[-1], keepdims=0)],
                                _x(2, M), [2], {"w": w}, lambda x, t: reduce(x * t["w"]))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_layers_without_initial_state_and_a_free_batch_train(rng, op):
    """No initial state and only Y named: the gradient graph did not type ("Type 'tensor(float)' of
    input parameter (Y) of operator (LSTMGrad) is invalid"). PyTorch's nn.LSTM/nn.GRU with zero
    initial state and ONNX's gate order (i, o, f, c / z, r, h) rearranged to PyTorch's."""
    torch = torch_or_skip()
    seq, n_in, hidden = 4, 2, 3
    gates = 4 if op == "LSTM" else 3
    W = (rng.standard_normal((1, gates * hidden, n_in)) * 0.5).astype(np.float32)
    R = (rng.standard_normal((1, gates * hidden, hidden)) * 0.5).astype(np.float32)
    B = (rng.standard_normal((1, 2 * gates * hidden)) * 0.5).astype(np.float32)
    order = [0, 2, 3, 1] if op == "LSTM" else [1, 0, 2]   # ONNX gate blocks in PyTorch's order

    def torch_weights(a):
        blocks = a.reshape(gates, hidden, *a.shape[1:])
        return blocks[order].reshape(gates * hidden, *a.shape[1:])

    def forward(x, t):
        layer = (torch.nn.LSTM if op == "LSTM" else torch.nn.GRU)(n_in, hidden, batch_first=True).double()
        params = {"weight_ih_l0": torch_weights(t["W"][0]), "weight_hh_l0": torch_weights(t["R"][0]),
                  "bias_ih_l0": torch_weights(t["B"][0, :gates * hidden]),
                  "bias_hh_l0": torch_weights(t["B"][0, gates * hidden:])}
        return torch.func.functional_call(layer, params, (x,))[0]

    attrs = {"linear_before_reset": 1} if op == "GRU" else {}  # PyTorch's GRU applies the reset after R
    nodes = [_node("Transpose", ["x"], "xt", perm=[1, 0, 2]),
             _node(op, ["xt", "W", "R", "B"], ["Y"], hidden_size=hidden, **attrs),
             _node("Squeeze", ["Y", "one"], "ys"), _node("Transpose", ["ys"], "out", perm=[1, 0, 2])]
    _one_sgd_step_matches_torch(nodes, _x(seq, n_in), [seq, hidden], {"W": W, "R": R, "B": B}, forward,
                                {"one": _i64(1)})


def test_a_1d_matmul_operand_beside_one_of_unknown_rank_trains_and_predicts(rng, tmp_path):
    """Squeeze without axes leaves onnx no rank for the other operand: only the vector's rank is
    needed (the added axis is squeezed out), so the step matches PyTorch (it was refused) and
    predictions after a Transpose are right (onnxruntime's fused form was 1.05 off)."""
    import onnxruntime as ort
    w = rng.standard_normal(4).astype(np.float32)
    nodes = [_node("Squeeze", ["x"], "xs"), _node("MatMul", ["xs", "w"], "h"),
             _node("Unsqueeze", ["h", "one"], "out")]
    _one_sgd_step_matches_torch(nodes, _x(1, 4), [1], {"w": w}, lambda x, t: (x.squeeze(1) @ t["w"])[:, None],
                                {"one": _i64(1)})
    v = rng.standard_normal(3).astype(np.float32)
    proto = model([_node("Squeeze", ["x"], "xs"), _node("Transpose", ["xs"], "t", perm=[0, 2, 1]),
                   _node("MatMul", ["t", "v"], "out")], [vi("x", ["N", 1, 3, 4])], [vi("out", ["N", 4])],
                  [numpy_helper.from_array(v, "v")])
    x = _x(1, 3, 4)
    want = x[:, 0].transpose(0, 2, 1).astype(np.float64) @ v
    m = ot.from_onnx(proto)
    np.testing.assert_allclose(m.predict(x), want, rtol=1e-5, atol=1e-6)
    got = ort.InferenceSession(m.export_onnx(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_scalar_first_output_and_a_constant_named_trainable_are_refused_by_name(rng):
    # ReduceSum over every axis without keepdims: no batch dimension to train against
    proto = model([_node("ReduceSum", ["x"], "out", keepdims=0)], [vi("x", ["N", 3])], [vi("out", [])])
    with pytest.raises(ot.OrtrainError, match=r"compile: .* first output, which has no batch dimension \('out' has "
                                              r"shape \(\)\)"):
        ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    # a weight read only as Pow's exponent, which the runtime does not differentiate, stays a constant
    p = np.full(3, 2.0, np.float32)
    proto = model([_node("Pow", ["x", "p"], "out")], [vi("x", ["N", 3])], [vi("out", ["N", 3])],
                  [numpy_helper.from_array(p, "p")])
    with pytest.raises(ot.OrtrainError, match=r"trainable: 'p' is a constant, not a weight: no gradient reaches it "
                                              r"\(it is read only as a shape, ratio, exponent or the like"):
        ot.from_onnx(proto, trainable=["p"])


def test_pad_with_an_axes_input_trains(rng):
    # opset 18's axes input: the artifacts failed to load ("Pads has incorrect number of values")
    torch = torch_or_skip()
    w = rng.standard_normal(M).astype(np.float32)
    nodes = [_node("Mul", ["x", "w"], "h"), _node("Pad", ["h", "pads", "", "axes"], "out")]
    _one_sgd_step_matches_torch(nodes, _x(M), [M + 3], {"w": w}, lambda x, t: torch.nn.functional.pad(x * t["w"], (1, 2)),
                                consts={"pads": _i64(1, 2), "axes": _i64(-1)}, opset=18)


@pytest.mark.parametrize("mode, torch_mode, opset", [("reflect", "reflect", 17), ("edge", "replicate", 17),
                                                     ("wrap", "circular", 19)])
@pytest.mark.parametrize("sizes", ["fixed", "free"])
def test_pad_in_reflect_edge_and_wrap_modes_trains(rng, mode, torch_mode, opset, sizes):
    # the builder takes constant pads only; the rows a pad repeats must add their gradients back
    torch = torch_or_skip()
    w = rng.standard_normal((2, 4, 5)).astype(np.float32)
    nodes = [_node("Mul", ["x", "w"], "h"), _node("Pad", ["h", "pads"], "out", mode=mode)]
    free = sizes == "free"
    _one_sgd_step_matches_torch(
        nodes, _x(2, 4, 5), [2, "H2", "W2"] if free else [2, 7, 9], {"w": w},
        lambda x, t: torch.nn.functional.pad(x * t["w"], (1, 3, 2, 1), mode=torch_mode),
        consts={"pads": _i64(0, 0, 2, 1, 0, 0, 1, 3)}, opset=opset, in_shape=[2, "H", "W"] if free else None)


@pytest.mark.parametrize("mode, pads", [("wrap", (5, 0)), ("reflect", (0, 4)), ("reflect", (1, 0))])
def test_a_pad_past_what_its_mode_repeats_is_refused_at_import_by_name(rng, mode, pads):
    # onnxruntime 1.19.2's Pad read past its input (predict gave values from memory), and the training
    # graph's Gathers failed at the first step naming an internal node ("idx=-5 must be within [-4,3]");
    # reflect repeats size - 1 rows, wrap size (the third: reflect of an axis of size 1)
    size = 1 if pads == (1, 0) else 4
    w = rng.standard_normal((3, size)).astype(np.float32)
    nodes = [_node("Mul", ["x", "w"], "h"), _node("Pad", ["h", "pads"], "out", name="pad", mode=mode)]
    proto = model(nodes, [vi("x", ["N", 3, size])], [vi("out", ["N", 3, size + sum(pads)])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_i64(0, 0, pads[0], 0, 0, pads[1]), "pads")],
                  opset=19)
    with pytest.raises(ot.UnsupportedOpError, match=rf"Pad node 'pad' pads axis 2 \(size {size}\) by {max(pads)} in "
                                                    rf"'{mode}' mode, which repeats at most {size - (mode == 'reflect')} "
                                                    "rows there; onnxruntime 1.19.2 reads past the input"):
        ot.from_onnx(proto, frozen=["w"])  # predicting alone, too


def test_a_reflect_pad_of_float64_values_is_refused_where_a_gradient_crosses_it(rng):
    # its training form, a Concat, has no float64 gradient kernel: fit failed at its first step
    w = rng.standard_normal(4).astype(np.float32)
    nodes = [_node("Mul", ["x", "w"], "h"), _node("Cast", ["h"], "hd", to=onnx.TensorProto.DOUBLE),
             _node("Pad", ["hd", "pads"], "pd", name="pad", mode="reflect"),
             _node("Cast", ["pd"], "out", to=onnx.TensorProto.FLOAT)]
    proto = model(nodes, [vi("x", ["N", 4])], [vi("out", ["N", 6])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_i64(0, 1, 0, 1), "pads")])
    with pytest.raises(ot.UnsupportedOpError, match=r"Pad in 'reflect' mode over float64 values .* \(nodes: pad\)"):
        ot.from_onnx(proto)
    m = ot.from_onnx(proto, frozen=["w"])  # no gradient crosses it: it imports and predicts
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(m.predict(x), np.pad(x * w, ((0, 0), (1, 1)), mode="reflect"), rtol=1e-6)


def test_an_old_reflect_pad_with_a_value_attribute_imports_and_trains(rng):
    # opset 10's Pad takes a value in any mode; onnx's converter moves it to an input in constant mode only,
    # and from_onnx called the model it built invalid
    torch = torch_or_skip()
    w = rng.standard_normal(M).astype(np.float32)
    nodes = [_node("Mul", ["x", "w"], "h"), _node("Pad", ["h"], "out", mode="reflect", pads=[0, 1, 0, 2], value=0.0)]
    _one_sgd_step_matches_torch(nodes, _x(M), [M + 3], {"w": w},
                                lambda x, t: torch.nn.functional.pad((x * t["w"])[:, None], (1, 2), mode="reflect")[:, 0],
                                opset=10)


def test_a_reflection_pad_exported_by_torch_trains_and_exports(rng, tmp_path):
    # the TorchScript exporter computes the pads from constants (a reversed Slice, a Cast)
    torch = torch_or_skip()
    import onnxruntime as ort

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReflectionPad2d((1, 2, 2, 1)),
                              torch.nn.ReplicationPad2d(1), torch.nn.Conv2d(3, 2, 3), torch.nn.Flatten())
    x = torch.randn(4, 2, 7, 8)
    torch.onnx.export(net, (x,), str(tmp_path / "pad.onnx"), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}})
    m = ot.from_onnx(tmp_path / "pad.onnx")
    np.testing.assert_allclose(m.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    y = np.random.default_rng(1).standard_normal(tuple(net(x).shape)).astype(np.float32)
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    m.fit(x.numpy(), y, batch_size=4, shuffle=False, verbose=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(net(x), torch.tensor(y)).backward()
    opt.step()
    for got, p in zip(m.get_weights(), net.parameters(), strict=True):
        np.testing.assert_allclose(got, p.detach().numpy(), rtol=1e-5, atol=1e-6)
    m.export_onnx(tmp_path / "trained.onnx")
    sess = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x.numpy()})[0], net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form, message", [
    ("computed pads", r"Pad in 'reflect' mode with pads computed in the graph \(nodes: pad\)"),
    ("negative pads", r"Pad in 'reflect' mode with negative pads \(nodes: pad\)"),
    ("computed axes", r"Pad with an axes input \(opset 18\) computed in the graph")])
def test_pads_the_training_graph_cannot_write_are_refused_at_import(rng, form, message):
    w = rng.standard_normal(M).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_i64(0, 2, 0, -1), "pads"),
             numpy_helper.from_array(_i64(0), "zero")]
    nodes = [_node("Mul", ["x", "w"], "h")]
    if form == "computed pads":  # from the input's own size
        nodes += [_node("Shape", ["x"], "s"), _node("Concat", ["zero", "s", "zero", "zero"], "p", axis=0),
                  _node("Div", ["p", "p"], "pads_c"), _node("Pad", ["h", "pads_c"], "out", name="pad", mode="reflect")]
    elif form == "negative pads":
        nodes += [_node("Pad", ["h", "pads"], "out", name="pad", mode="reflect")]
    else:
        nodes += [_node("Shape", ["x"], "s"), _node("Sub", ["s", "s"], "axes_c"),
                  _node("Slice", ["axes_c", "zero", "one"], "axis"),
                  _node("Pad", ["h", "two", "", "axis"], "out", name="pad", mode="reflect")]
        inits += [numpy_helper.from_array(_i64(1), "one"), numpy_helper.from_array(_i64(1, 1), "two")]
    proto = model(nodes, [vi("x", ["N", M])], [vi("out", ["N", None])], inits, opset=18)
    before = proto.SerializeToString()
    with pytest.raises(ot.UnsupportedOpError, match=message):
        ot.from_onnx(proto)
    assert proto.SerializeToString() == before


@pytest.mark.parametrize("affine", ["no bias", "constant weights", "shared frozen weights", "expanded from a shape"])
def test_two_layer_norms_without_weights_of_their_own_train(rng, affine):
    """Two LayerNormalization nodes without a bias, with constant weights (torch's LayerNorm(bias=
    False) and LayerNorm(elementwise_affine=False) at opset 17: one Constant read by both; the
    dynamo exporter's Expand(1, Shape(h))), or sharing frozen weights: the gradient builder failed
    ("Duplicate definition of name (..._grad)")."""
    torch = torch_or_skip()
    weights = {"w": (rng.standard_normal((M, M)) * 0.5).astype(np.float32)}
    gains = [(1 + 0.1 * rng.standard_normal(M)).astype(np.float32) for _ in range(2)]
    shift = (0.1 * rng.standard_normal(M)).astype(np.float32)
    nodes, consts, fixed, second = [_node("MatMul", ["x", "w"], "h")], {}, {}, []
    if affine == "no bias":
        weights |= {"g1": gains[0], "g2": gains[1]}
        norms = [["h", "g1"], ["n1", "g2"]]
    elif affine == "constant weights":
        nodes += [_node("Constant", [], "one", value=numpy_helper.from_array(np.ones(M, np.float32))),
                  _node("Constant", [], "zero", value=numpy_helper.from_array(np.zeros(M, np.float32)))]
        norms = [["h", "one", "zero"], ["n1", "one", "zero"]]
    elif affine == "expanded from a shape":  # no bias; each scale is ones the size of its input's last axis
        nodes += [_node("Constant", [], "one", value=numpy_helper.from_array(np.ones((), np.float32))),
                  _node("Shape", ["h"], "width", start=-1), _node("Expand", ["one", "width"], "ones")]
        norms = [["h", "ones"], ["n1", "ones_2"]]
        second = [_node("Shape", ["n1"], "width_2", start=-1), _node("Expand", ["one", "width_2"], "ones_2")]
    else:  # initializers left out of trainable=: frozen weights, read by both nodes
        consts = {"g": gains[0], "b": shift}
        fixed = {"g": torch.tensor(gains[0], dtype=torch.float64), "b": torch.tensor(shift, dtype=torch.float64)}
        norms = [["h", "g", "b"], ["n1", "g", "b"]]
    nodes += [_node("LayerNormalization", norms[0], "n1", axis=-1), *second,
              _node("LayerNormalization", norms[1], "out", axis=-1)]

    def forward(x, t):
        def norm(h, k):
            return torch.nn.functional.layer_norm(h, (M,), t.get(f"g{k}", fixed.get("g")), fixed.get("b"), 1e-5)
        return norm(norm(x @ t["w"], 1), 2)

    _one_sgd_step_matches_torch(nodes, _x(M), [M], weights, forward, consts)


def test_a_dilated_same_conv_predicts_and_exports(rng, tmp_path):
    """onnxruntime runs no dilated auto_pad SAME convolution (torch's Conv2d(padding='same',
    dilation=2)): from_onnx writes its padding out, so predict and the export run."""
    import onnxruntime as ort
    torch = torch_or_skip()
    w = (rng.standard_normal((3, 2, 3, 3)) * 0.3).astype(np.float32)
    proto = model([_node("Conv", ["x", "w"], "out", auto_pad="SAME_UPPER", dilations=[2, 2])],
                  [vi("x", ["N", 2, 6, 6])], [vi("out", ["N", 3, 6, 6])], [numpy_helper.from_array(w, "w")])
    m = ot.from_onnx(proto)
    x = _x(2, 6, 6)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding="same", dilation=2).numpy()
    np.testing.assert_allclose(m.predict(x), want, rtol=1e-5, atol=1e-6)
    path = m.export_onnx(tmp_path / "m.onnx")
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _one_sgd_step_matches_torch(list(proto.graph.node), x, [3, 6, 6], {"w": w},
                                lambda x, t: torch.nn.functional.conv2d(x, t["w"], padding="same", dilation=2))


def test_a_weight_read_only_as_an_exponent_is_named_in_a_warning(rng):
    p = np.array([1.0, 2.0, 3.0], np.float32)
    proto = model([_node("Pow", ["x", "p"], "out")], [vi("x", ["N", 3])], [vi("out", ["N", 3])],
                  [numpy_helper.from_array(p, "p")])
    with pytest.warns(UserWarning, match=r"from_onnx: 'p' is read only as \(or into\) Pow's exponent, which onnxruntime-training "
                                         r"does not differentiate, so it stays a constant"):
        assert ot.from_onnx(proto).weight_names() == []


def test_a_weight_read_into_an_exponent_is_named_in_a_warning(rng):
    """``(|x| + 1) ** (x @ W) @ K``: W reaches the output only through the exponent; it stays a
    constant, as a weight read as the exponent itself does, and the warning names it (it did not)."""
    w, k = rng.standard_normal((2, 2)).astype(np.float32), rng.standard_normal((2, 1)).astype(np.float32)
    proto = model([_node("MatMul", ["x", "w"], "e"), _node("Abs", ["x"], "ax"), _node("Add", ["ax", "one"], "base"),
                   _node("Pow", ["base", "e"], "p"), _node("MatMul", ["p", "k"], "out")],
                  [vi("x", ["N", 2])], [vi("out", ["N", 1])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(k, "k"),
                   numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    with pytest.warns(UserWarning, match=r"from_onnx: 'w' is read only as \(or into\) Pow's exponent"):
        m = ot.from_onnx(proto)
    assert m.weight_names() == ["k"]
    cast = model([_node("MatMul", ["x", "w"], "e0"), _node("Cast", ["e0"], "e", to=onnx.TensorProto.FLOAT),
                  *proto.graph.node[1:]], [vi("x", ["N", 2])], [vi("out", ["N", 1])], list(proto.graph.initializer))
    with pytest.warns(UserWarning, match=r"from_onnx: 'w' is read only as \(or into\) Pow's exponent"):
        assert ot.from_onnx(cast).weight_names() == ["k"]  # through a float-to-float Cast as well
    x = _x(2)
    np.testing.assert_allclose(m.predict(x), (np.abs(x) + 1) ** (x @ w) @ k, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_a_layer_norm_whose_statistics_are_read_trains(rng, bias):
    """The runtime's LayerNormalization gradient ignores what flows into its Mean and InvStdDev
    outputs: W ended 3.7e-2 off PyTorch after one step, silently."""
    torch = torch_or_skip()
    w = (rng.standard_normal((M, M)) * 0.5).astype(np.float32)
    weights = {"w": w, "g": (1 + 0.1 * rng.standard_normal(M)).astype(np.float32)}
    if bias:
        weights["b"] = (0.1 * rng.standard_normal(M)).astype(np.float32)
    nodes = [_node("MatMul", ["x", "w"], "h"),
             _node("LayerNormalization", ["h", "g"] + (["b"] if bias else []), ["n", "mu", "inv"], axis=-1),
             _node("Mul", ["mu", "inv"], "s"), _node("Add", ["n", "s"], "out")]

    def forward(x, t):
        h = x @ t["w"]
        mu = h.mean(-1, keepdim=True)
        inv = 1 / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
        return (h - mu) * inv * t["g"] + (t["b"] if bias else 0) + mu * inv

    _one_sgd_step_matches_torch(nodes, _x(3, M), [3, M], weights, forward)


def test_a_same_conv_of_free_image_sizes_trains_at_stride_one(rng):
    # the padding is k - 1 whatever the size at stride 1 (tf2onnx writes SAME convolutions of free sizes)
    torch = torch_or_skip()
    torch_module = torch.nn.functional
    w = (rng.standard_normal((3, 2, 3, 3)) * 0.3).astype(np.float32)
    proto = model([_node("Conv", ["x", "w"], "out", auto_pad="SAME_UPPER")], [vi("x", ["N", 2, "H", "W"])],
                  [vi("out", ["N", 3, "H", "W"])], [numpy_helper.from_array(w, "w")])
    m = ot.from_onnx(proto, trainable=["w"])
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x = _x(2, 5, 6)
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    y = np.random.default_rng(3).standard_normal((N, 3, 5, 6)).astype(np.float32)
    loss = ((torch_module.conv2d(torch.tensor(x.astype(np.float64)), tw, padding="same") - torch.tensor(
        y.astype(np.float64))) ** 2).mean()
    loss.backward()
    m.fit(x, y, batch_size=N, verbose=0)
    np.testing.assert_allclose(m.get_weights()[0], w - 0.1 * tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_an_average_pool_with_dilations_is_refused_by_name(rng):
    w = rng.standard_normal((2, 2)).astype(np.float32)
    proto = model([_node("MatMul", ["x", "w"], "h"), _node("AveragePool", ["h"], "out", kernel_shape=[2],
                                                          dilations=[2])],
                  [vi("x", ["N", 3, 2])], [vi("out", ["N", 3, None])], [numpy_helper.from_array(w, "w")], opset=19)
    m = ot.from_onnx(proto)
    m.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"AveragePool node .*: it has dilations \[2\], and ortrain trains "
                                                    r"average pools without"):
        ot.Trainer(m, batch_size=2)


@pytest.mark.parametrize("pool", ["3-D", "dilated", "channels unknown"])
def test_an_average_pool_no_gradient_reaches_keeps_its_op_and_the_weights_after_it_train(rng, pool):
    # refused for training as a form ortrain cannot write, even with nothing trainable before it (and
    # the advice, freeze the weights before it, did not help)
    torch = torch_or_skip()
    F = torch.nn.functional
    if pool == "3-D":
        attrs, shape, out = {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, (2, 4, 4, 4), [2, 2, 2, 2]
        ref = lambda x: F.avg_pool3d(x, 2)  # noqa: E731
    elif pool == "dilated":
        attrs, shape, out = {"kernel_shape": [2], "dilations": [2]}, (3, 5), [3, 3]
        ref = lambda x: (x[..., :-2] + x[..., 2:]) / 2  # noqa: E731
    else:
        attrs, shape, out = {"kernel_shape": [2, 2], "strides": [2, 2]}, (2, 4, 4), [2, 2, 2]
        ref = lambda x: F.avg_pool2d(x, 2)  # noqa: E731
    w = rng.standard_normal(out[-1]).astype(np.float32)
    nodes = [_node("AveragePool", ["x"], "p", **attrs), _node("Mul", ["p", "w"], "out")]
    in_shape = ["C", *shape[1:]] if pool == "channels unknown" else None
    _one_sgd_step_matches_torch(nodes, _x(*shape), out, {"w": w}, lambda x, t: ref(x) * t["w"], in_shape=in_shape,
                                opset=19 if pool == "dilated" else 17)


def test_a_recurrent_layer_with_sequence_lengths_is_refused_at_import(rng):
    # its gradient kernel fails at the first step ("onnxruntime could not run the training step")
    h = 3
    inits = [numpy_helper.from_array(rng.standard_normal((1, 4 * h, 2)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 4 * h, h)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([3, 2, 3, 1], np.int32), "lengths"),
             numpy_helper.from_array(_i64(1), "one")]
    nodes = [_node("Transpose", ["x"], "xt", perm=[1, 0, 2]),
             _node("LSTM", ["xt", "W", "R", "", "lengths"], ["Y"], hidden_size=h, name="lstm"),
             _node("Squeeze", ["Y", "one"], "ys"), _node("Transpose", ["ys"], "out", perm=[1, 0, 2])]
    proto = model(nodes, [vi("x", [4, 3, 2])], [vi("out", [4, 3, h])], inits)
    with pytest.raises(ot.UnsupportedOpError, match=r"LSTM with sequence_lens \(nodes: lstm\)"):
        ot.from_onnx(proto)


def test_a_split_output_without_a_name_inside_an_if_body_predicts_and_exports(tmp_path):
    """The same crash inside a subgraph: the unnamed output of a Split in an If branch is named too."""
    import onnxruntime as ort
    then = helper.make_graph([_node("Split", ["x"], ["a", ""], axis=1, num_outputs=2)], "then", [],
                             [vi("a", ["N", 2])])
    other = helper.make_graph([_node("Slice", ["x", "start", "stop", "axis"], ["b"])], "other", [],
                              [vi("b", ["N", 2])])
    inits = [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in
             [("cond", True, np.bool_), ("start", [2], np.int64), ("stop", [4], np.int64), ("axis", [1], np.int64)]]
    proto = model([_node("If", ["cond"], ["out"], then_branch=then, else_branch=other)], [vi("x", ["N", 4])],
                  [vi("out", ["N", 2])], inits, opset=18)
    m = ot.from_onnx(proto)
    x = _x(4)
    np.testing.assert_array_equal(m.predict(x), x[:, :2])
    path = m.export_onnx(tmp_path / "m.onnx")
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x[:, :2])


def test_a_transposed_matmul_with_a_vector_predicts_evaluates_and_exports_right(rng, tmp_path):
    """onnxruntime's inference optimizer fuses Transpose into a MatMul with a 1-D operand wrongly
    (5.7 off numpy here): predictions, evaluate and the exported model take the matrix form too."""
    import onnxruntime as ort
    w, k = rng.standard_normal(4).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    proto = model([_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), _node("MatMul", ["t", "w"], ["v"]),
                   _node("MatMul", ["v", "k"], ["y"])], [vi("x", ["N", 4, 8])], [vi("y", ["N", 1])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(k, "k")])
    m = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = rng.standard_normal((4, 4, 8)).astype(np.float32)
    want = (x.transpose(0, 2, 1).astype(np.float64) @ w) @ k
    np.testing.assert_allclose(m.predict(x), want, rtol=1e-5, atol=1e-5)
    assert m.evaluate(x, np.zeros((4, 1), np.float32))["loss"] == pytest.approx(np.mean(want ** 2), rel=1e-5)
    with ot.Trainer(m, batch_size=4) as tr:
        np.testing.assert_allclose(tr.predict(x), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tr.snapshot().predict(x), want, rtol=1e-5, atol=1e-5)
    path = m.export_onnx(tmp_path / "m.onnx")
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_additive_mask_of_minus_inf_stays_a_constant(rng):
    """A float initializer holding -inf (PyTorch's generate_square_subsequent_mask, or a boolean
    mask after constant folding) trained as a weight: Adam made every weight NaN after one step,
    SGD trained its zeros. It is a constant; naming it in trainable= is refused, saying why."""
    w = rng.standard_normal((M, M)).astype(np.float32)
    mask = np.where(np.arange(M) % 2, -np.inf, 0.0).astype(np.float32)
    nodes = [_node("MatMul", ["x", "w"], "h"), _node("Add", ["h", "mask"], "s"), _node("Softmax", ["s"], "out")]
    _one_sgd_step_matches_torch(nodes, _x(M), [M], {"w": w}, lambda x, t: torch_or_skip().softmax(
        x @ t["w"] + torch_or_skip().tensor(mask.astype(np.float64)), -1), {"mask": mask})
    proto = model(nodes, [vi("x", ["N", M])], [vi("out", ["N", M])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(mask, "mask")])
    m = ot.from_onnx(proto).compile(optimizer="adam", loss="mse")
    assert m.weight_names() == ["w"]
    history = m.fit(_x(M), np.full((N, M), 0.2, np.float32), batch_size=N, epochs=3, verbose=0)
    assert np.all(np.isfinite(history.history["loss"])) and np.all(np.isfinite(m.get_weights()[0]))
    with pytest.raises(ot.OrtrainError, match=r"trainable: 'mask' is a constant, not a weight: it holds inf or NaN "
                                              r"\(an additive attention mask"):
        ot.from_onnx(proto, trainable=["w", "mask"])
    assert ot.from_onnx(proto, frozen=["mask"]).trainable_weight_names == ["w"]  # frozen already: no error
    scalar = model(nodes, [vi("x", ["N", M])], [vi("out", ["N", M])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(-np.inf), "mask")])
    with pytest.raises(ot.OrtrainError, match=r"trainable: 'mask' is a constant, not a weight: it holds inf or NaN"):
        ot.from_onnx(scalar, trainable=["w", "mask"])  # a scalar named in trainable= too


@pytest.mark.parametrize("form", ["scalar split", "split list", "split list, int32", "unbind", "unbind, a part unread",
                                  "rank unknown"])
def test_split_to_sequence_read_at_constant_indices_trains(rng, form):
    """The dynamo exporter's ``q, k, v = qkv.split(d, -1)`` (and ``unbind``): SplitToSequence read by
    SequenceAt has no gradient and was refused; it is a Split (and Squeeze) now, matching PyTorch.
    A part nothing reads stays an unread Split output (a squeezed copy of it made the step put
    column 0's change into row 0), and a split list needs no rank (a raw TypeError before). Sizes
    and positions may be int32 (ONNX allows it; such a model was refused)."""
    torch = torch_or_skip()
    w = (rng.standard_normal((M, 6)) * 0.5).astype(np.float32)
    nodes, consts = [_node("MatMul", ["x", "w"], "h")], {"i0": _i64(0), "last": _i64(-1)}
    if form == "scalar split":  # chunks of 4: (4, 2)
        consts["size"] = np.array(4, np.int64)
        nodes.append(_node("SplitToSequence", ["h", "size"], "seq", axis=-1))
        parts = lambda h: h.split(4, -1)  # noqa: E731
    elif form.startswith("split list"):
        consts["sizes"] = _i64(1, 3, 2)
        nodes.append(_node("SplitToSequence", ["h", "sizes"], "seq", axis=1))
        parts = lambda h: h.split([1, 3, 2], 1)  # noqa: E731
        if form.endswith("int32"):
            consts = {k: v.astype(np.int32) for k, v in consts.items()}
    elif form == "rank unknown":  # a Squeeze whose axes are computed: onnx infers no rank for hs
        consts |= {"sizes": _i64(1, 3, 2), "shape": _i64(0, 1, 6), "one": _i64(1)}
        nodes += [_node("Reshape", ["h", "shape"], "h1"), _node("Shape", ["one"], "axes"),
                  _node("Squeeze", ["h1", "axes"], "hs"), _node("SplitToSequence", ["hs", "sizes"], "seq", axis=-1)]
        parts = lambda h: h.split([1, 3, 2], 1)  # noqa: E731
    else:
        count = 2 if form == "unbind" else 3  # of 3, parts 0 and -1 are read, 1 not
        consts["shape"] = _i64(0, count, 6 // count)
        nodes += [_node("Reshape", ["h", "shape"], "h3"), _node("SplitToSequence", ["h3"], "seq", axis=1, keepdims=0)]
        parts = lambda h: h.reshape(-1, count, 6 // count).unbind(1)  # noqa: E731
    nodes += [_node("SequenceAt", ["seq", "i0"], "a"), _node("SequenceAt", ["seq", "last"], "b"),
              _node("Mul", ["a", "b"] if form != "scalar split" else ["b", "b"], "ab"),
              _node("Concat", ["ab", "a"], "out", axis=-1)]

    def forward(x, t):
        p = parts(x @ t["w"])
        return torch.cat([(p[0] if form != "scalar split" else p[-1]) * p[-1], p[0]], -1)

    width = {"scalar split": 2 + 4, "split list": 2 + 1, "split list, int32": 2 + 1, "rank unknown": 2 + 1,
             "unbind": 3 + 3,
             "unbind, a part unread": 2 + 2}[form]
    _one_sgd_step_matches_torch(nodes, _x(M), [width], {"w": w}, forward, consts)


def test_a_value_declared_without_a_shape_takes_the_inferred_one(rng):
    """A value_info giving h a type but no shape hid the shape onnx infers: SplitToSequence with a
    chunk size, which needs h's width, was left as it was and refused."""
    torch = torch_or_skip()
    w = (rng.standard_normal((M, 5)) * 0.5).astype(np.float32)
    nodes = [_node("MatMul", ["x", "w"], "h"), _node("SplitToSequence", ["h", "size"], "seq", axis=1),
             _node("SequenceAt", ["seq", "i0"], "a"), _node("Mul", ["a", "a"], "out")]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(2, np.int64), "size"),
             numpy_helper.from_array(_i64(0), "i0")]
    proto = model(nodes, [vi("x", ["N", M])], [vi("out", ["N", 2])], inits)
    proto.graph.value_info.append(helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, None))
    m = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x = _x(M)
    m.fit(x, np.zeros((N, 2), np.float32), batch_size=N, shuffle=False, verbose=0)
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    ((torch.tensor(x.astype(np.float64)) @ tw)[:, :2] ** 2).pow(2).mean().backward()
    np.testing.assert_allclose(m.get_weights()[0], w - 0.1 * tw.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rank", [1, 2])
def test_a_max_pool_of_free_sizes_trains(rng, rank):
    """onnxruntime-training's MaxPoolGrad sized its gradient from the graph's stored shapes: with a
    free length (or image size) it wrote an empty one, and the step failed in the next node or,
    after a Conv, the process died. Overlapping windows (the 2-D case) add where they share a maximum."""
    torch = torch_or_skip()
    F = torch.nn.functional
    w = (rng.standard_normal((3, 2) + (3,) * rank) * 0.5).astype(np.float32)
    if rank == 1:
        x, dims, out = rng.standard_normal((N, 2, 8)).astype(np.float32), [2, "L"], [3, "M"]
        pool = _node("MaxPool", ["h"], "out", kernel_shape=[2], strides=[2])
        forward = lambda x, t: F.max_pool1d(F.conv1d(x, t["w"], padding=1), 2, 2)  # noqa: E731
    else:
        x, dims, out = rng.standard_normal((N, 2, 7, 7)).astype(np.float32), [2, "H", "W"], [3, "P", "Q"]
        pool = _node("MaxPool", ["r"], "out", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        forward = lambda x, t: F.max_pool2d(F.relu(F.conv2d(x, t["w"], padding=1)), 3, 2, 1)  # noqa: E731
    nodes = [_node("Conv", ["x", "w"], "h", pads=[1] * 2 * rank)] + ([_node("Relu", ["h"], "r")] if rank == 2 else [])
    _one_sgd_step_matches_torch(nodes + [pool], x, out, {"w": w}, forward, in_shape=dims)


@pytest.mark.parametrize("other", ["Ly", 5])
def test_a_named_free_dimension_that_broadcasts_trains(rng, other):
    """onnxruntime-training's gradient builder took two differently named free dimensions (or a
    named one and a size) as equal, so where one was 1 at run time it did not sum the broadcast
    operand's gradient over it and the step failed: ``x @ w + y @ v`` with ``y`` one step long."""
    torch = torch_or_skip()
    w = rng.standard_normal((4, 5)).astype(np.float32)
    v = rng.standard_normal((4, 5)).astype(np.float32)
    x_dims = ["N", "Lx", 4] if other == "Ly" else ["N", 5, 4]
    proto = model([_node("MatMul", ["x", "w"], "a"), _node("MatMul", ["y", "v"], "b"), _node("Add", ["a", "b"], "out")],
                  [vi("x", x_dims), vi("y", ["N", "Ly", 4])], [vi("out", ["N", x_dims[1], 5])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    y = rng.standard_normal((3, 1, 4)).astype(np.float32)  # broadcasts against x's five steps
    t = rng.standard_normal((3, 5, 5)).astype(np.float32)
    m = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    m.fit([x, y], t, batch_size=3, shuffle=False, verbose=0)
    tw, tv = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (w, v))
    f64 = lambda a: torch.tensor(a.astype(np.float64))  # noqa: E731
    gw, gv = torch.autograd.grad(((f64(x) @ tw + f64(y) @ tv - f64(t)) ** 2).mean(), [tw, tv])
    got = dict(zip(m.weight_names(), m.get_weights(), strict=True))
    np.testing.assert_allclose(got["w"], w - 0.1 * gw.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["v"], v - 0.1 * gv.numpy(), rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("form", ["1-D", "2-D", "2-D padded, counted"])
def test_an_average_pool_of_free_sizes_trains_when_its_windows_are_whole(rng, form):
    """Average pools of free length or image size were refused (the runtime's own gradient writes an
    empty one there); where every window averages over the whole kernel, the depthwise Conv that
    replaces the pool needs only the channels."""
    torch = torch_or_skip()
    F = torch.nn.functional
    rank = 1 if form == "1-D" else 2
    w = (rng.standard_normal((3, 2) + (3,) * rank) * 0.5).astype(np.float32)
    if rank == 1:
        x, dims, out = rng.standard_normal((N, 2, 8)).astype(np.float32), [2, "L"], [3, "M"]
        pool = _node("AveragePool", ["h"], "out", kernel_shape=[2], strides=[2])
        forward = lambda x, t: F.avg_pool1d(F.conv1d(x, t["w"], padding=1), 2, 2)  # noqa: E731
    elif form == "2-D":
        x, dims, out = rng.standard_normal((N, 2, 6, 7)).astype(np.float32), [2, "H", "W"], [3, "P", "Q"]
        pool = _node("AveragePool", ["h"], "out", kernel_shape=[2, 2], strides=[2, 2])
        forward = lambda x, t: F.avg_pool2d(F.conv2d(x, t["w"], padding=1), 2, 2)  # noqa: E731
    else:
        x, dims, out = rng.standard_normal((N, 2, 7, 7)).astype(np.float32), [2, "H", "W"], [3, "P", "Q"]
        pool = _node("AveragePool", ["h"], "out", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                     count_include_pad=1)
        forward = lambda x, t: F.avg_pool2d(F.conv2d(x, t["w"], padding=1), 3, 2, 1, count_include_pad=True)  # noqa: E731
    conv = _node("Conv", ["x", "w"], "h", pads=[1] * 2 * rank)
    _one_sgd_step_matches_torch([conv, pool], x, out, {"w": w}, forward, in_shape=dims)


def test_an_average_pool_of_free_sizes_with_windows_of_several_sizes_is_refused(rng):
    w = (rng.standard_normal((3, 2, 3, 3)) * 0.5).astype(np.float32)
    proto = model([_node("Conv", ["x", "w"], "h", pads=[1, 1, 1, 1]),
                   _node("AveragePool", ["h"], "out", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
                  [vi("x", ["N", 2, "H", "W"])], [vi("out", ["N", 3, "P", "Q"])], [numpy_helper.from_array(w, "w")])
    m = ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"AveragePool node .*: with ceil_mode, auto_pad SAME or padding "
                                                    r"not counted its windows differ in size, and ortrain then needs "
                                                    r"the sizes \(input shape \[None, 3, None, None\]\).*To train, "
                                                    r"give the model static sizes"):
        ot.Trainer(m, batch_size=2)


def test_dimensions_onnx_cannot_size_keep_their_names_for_the_gradient_builder():
    """onnx's inference names what it cannot size unk__N; those are unknown sizes, not names, and
    met a named batch in the loss's Sub: the rewrite took the batch's name off ordinary models."""
    from ortrain.graph.gradient_rewrites import unnamed_broadcast_dims
    nodes = [_node("MatMul", ["x", "w"], "h"), _node("Reshape", ["h", "shape"], "out"), _node("Sub", ["out", "y"], "d")]
    proto = model(nodes, [vi("x", ["batch", 4]), vi("y", ["batch", 3])], [vi("d", ["batch", 3])],
                  [numpy_helper.from_array(np.ones((4, 6), np.float32), "w"), numpy_helper.from_array(_i64(-1, 3), "shape")])
    assert unnamed_broadcast_dims(proto) is proto


def _lstm_model(rng, h=3, **attrs):
    """x (batch, 4 steps, 2) -> Transpose -> LSTM -> last hidden state -> MatMul; ``attrs`` on the LSTM
    (``peepholes=True`` gives it a P input)."""
    peepholes = attrs.pop("peepholes", False)
    inits = [numpy_helper.from_array((0.5 * rng.standard_normal(s)).astype(np.float32), n) for n, s in
             [("W", (1, 4 * h, 2)), ("R", (1, 4 * h, h)), ("B", (1, 8 * h)), ("P", (1, 3 * h)), ("head", (h, 2))]]
    inits.append(numpy_helper.from_array(_i64(0), "zero"))
    lstm_inputs = ["xt", "W", "R", "B"] + (["", "", "", "P"] if peepholes else [])
    nodes = [_node("Transpose", ["x"], "xt", perm=[1, 0, 2]),
             _node("LSTM", lstm_inputs, ["Y", "Yh"], hidden_size=h, name="lstm", **attrs),
             _node("Squeeze", ["Yh", "zero"], "last"), _node("MatMul", ["last", "head"], "out")]
    return model(nodes, [vi("x", ["N", 4, 2])], [vi("out", ["N", 2])], inits, opset=14)


@pytest.mark.parametrize("attrs, form", [({"clip": 3.0}, r"LSTM with clip"), ({"clip": float("inf")}, r"LSTM with clip"),
                                         ({"input_forget": 1}, r"LSTM with input_forget"),
                                         ({"activations": ["Sigmoid", "Relu", "Tanh"]},
                                          r"LSTM with activations \['Sigmoid', 'Relu', 'Tanh'\]")])
def test_recurrent_forms_the_training_kernels_cannot_run_are_refused_trained_or_frozen(rng, attrs, form):
    # they failed as the session opened with the kernel's text ("input_forget == 0 was false")
    proto = _lstm_model(rng, **attrs)
    with pytest.raises(ot.UnsupportedOpError, match=form + r" \(nodes: lstm\)"):
        ot.from_onnx(proto)
    m = ot.from_onnx(proto, trainable=["head"])
    m.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"cannot train a model holding " + form):
        ot.Trainer(m, batch_size=3)


def test_an_lstm_with_peepholes_is_refused_where_a_gradient_crosses_it_and_runs_frozen(rng):
    # its gradient kernel leaves the peepholes out: 2-5% off, measured against finite differences;
    # the forward pass is right, so a frozen one with nothing trained before it trains the rest
    proto = _lstm_model(rng, peepholes=True)
    with pytest.raises(ot.UnsupportedOpError, match=r"LSTM with peepholes \(input P\) \(nodes: lstm\)"):
        ot.from_onnx(proto)
    import onnxruntime as ort
    m = ot.from_onnx(proto, trainable=["head"])
    x, y = rng.standard_normal((3, 4, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    last = onnx.ModelProto()
    last.CopyFrom(proto)
    del last.graph.output[:]
    last.graph.output.append(vi("last", ["N", 3]))
    features = ort.InferenceSession(last.SerializeToString()).run(None, {"x": x})[0]  # the LSTM's last state
    head = m.get_weights()[m.weight_names().index("head")]
    m.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    with ot.Trainer(m, batch_size=3) as tr:
        loss = tr.step(x, y)
        after = tr.get_weights()[m.weight_names().index("head")]
    np.testing.assert_allclose(loss, np.mean((features @ head - y) ** 2), rtol=1e-5)
    np.testing.assert_allclose(after, head - 0.5 * features.T @ (2 * (features @ head - y) / y.size), rtol=1e-4,
                               atol=1e-5)


def test_an_lstm_naming_its_default_activations_trains_as_one_without_them(rng):
    # the training kernels compare lower-case names: the spec's "Sigmoid" failed as the session opened
    x, y = rng.standard_normal((3, 4, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    results = []
    for attrs in ({}, {"activations": ["Sigmoid", "Tanh", "Tanh"]}):
        m = ot.from_onnx(_lstm_model(np.random.default_rng(1), **attrs))
        m.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
        with ot.Trainer(m, batch_size=3) as tr:
            results.append((tr.step(x, y), tr.step(x, y), tr.get_weights()))
    assert results[0][:2] == results[1][:2]
    for a, b in zip(results[0][2], results[1][2]):
        np.testing.assert_array_equal(a, b)


def test_a_recurrent_layer_laid_out_batch_first_is_refused_at_import(rng):
    # onnxruntime runs no layout=1 LSTM: predict failed with the kernel's text as its session opened
    with pytest.raises(ot.UnsupportedOpError, match=r"LSTM node 'lstm' is laid out batch first \(layout=1\), which "
                                                    r"onnxruntime 1.19.2 runs neither in predictions nor in training"):
        ot.from_onnx(_lstm_model(rng, layout=1))


@pytest.mark.parametrize("attrs", [{"activations": ["Sigmoid", "Tanh", "Tanh"], "activation_alpha": [1.0, 1.0, 1.0]},
                                   {"clip": float(np.finfo(np.float32).max)}])
def test_lstm_settings_that_change_nothing_train_as_without_them(rng, attrs):
    # default activations with alphas failed as the session opened; a clip at float32's max (the
    # kernels' own "no clip") was refused
    x, y = rng.standard_normal((3, 4, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    results = []
    for given in ({}, attrs):
        m = ot.from_onnx(_lstm_model(np.random.default_rng(1), **given))
        m.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
        with ot.Trainer(m, batch_size=3) as tr:
            results.append((tr.step(x, y), tr.step(x, y)))
    assert results[0] == results[1]


def test_lstms_sharing_a_frozen_weight_after_a_trained_layer_train(rng):
    # the second LSTM, which no trained value reaches, was asked for W's and B's gradients but not
    # R2's (W is asked for as the first needs it): a segmentation fault
    h = 3
    inits = [numpy_helper.from_array((0.5 * rng.standard_normal(s)).astype(np.float32), n) for n, s in
             [("Wpre", (2, 2)), ("W", (1, 4 * h, 2)), ("R", (1, 4 * h, h)), ("B", (1, 8 * h)), ("R2", (1, 4 * h, h)),
              ("head", (h, 2))]]
    inits.append(numpy_helper.from_array(_i64(0), "zero"))
    nodes = [_node("MatMul", ["x", "Wpre"], "pre"), _node("Transpose", ["pre"], "pt", perm=[1, 0, 2]),
             _node("LSTM", ["pt", "W", "R", "B"], ["Y1", "H1"], hidden_size=h, name="first"),
             _node("Transpose", ["x"], "xt", perm=[1, 0, 2]),
             _node("LSTM", ["xt", "W", "R2", "B"], ["Y2", "H2"], hidden_size=h, name="second"),
             _node("Add", ["H1", "H2"], "hs"), _node("Squeeze", ["hs", "zero"], "last"),
             _node("MatMul", ["last", "head"], "out")]
    proto = model(nodes, [vi("x", ["N", 4, 2])], [vi("out", ["N", 2])], inits, opset=14)
    m = ot.from_onnx(proto, frozen=["W", "R", "B", "R2"])
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = rng.standard_normal((3, 4, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    before = dict(zip(m.weight_names(), m.get_weights()))
    with ot.Trainer(m, batch_size=3) as tr:
        tr.step(x, y)
        after = dict(zip(m.weight_names(), tr.get_weights()))
    for name in ("W", "R", "B", "R2"):
        np.testing.assert_array_equal(after[name], before[name])
    assert not np.array_equal(after["Wpre"], before["Wpre"]) and not np.array_equal(after["head"], before["head"])


def test_an_empty_sequence_for_a_recurrent_layer_inside_a_branch_is_refused(rng):
    # the check looked at the top-level graph only: onnxruntime's GRU ended the process
    h = 3
    body = lambda name: helper.make_graph(  # noqa: E731
        [_node("Transpose", ["x"], f"{name}_xt", perm=[1, 0, 2]),
         _node("GRU", [f"{name}_xt", "W", "R"], [f"{name}_Y", f"{name}_H"], hidden_size=h),
         _node("Squeeze", [f"{name}_H", "zero"], f"{name}_out")], name, [], [vi(f"{name}_out", ["N", h])])
    inits = [numpy_helper.from_array((0.5 * rng.standard_normal(s)).astype(np.float32), n) for n, s in
             [("W", (1, 3 * h, 2)), ("R", (1, 3 * h, h)), ("head", (h, 2))]]
    inits += [numpy_helper.from_array(_i64(0), "zero"), numpy_helper.from_array(np.array(True), "flag")]
    proto = model([_node("If", ["flag"], ["last"], then_branch=body("a"), else_branch=body("b")),
                   _node("MatMul", ["last", "head"], "out")], [vi("x", ["N", "T", 2])], [vi("out", ["N", 2])], inits)
    m = ot.from_onnx(proto, trainable=[])
    with pytest.raises(ot.ShapeError, match=r"x: axis 1 holds no elements"):
        m.predict(np.zeros((2, 0, 2), np.float32))
    assert m.predict(np.zeros((2, 4, 2), np.float32)).shape == (2, 2)


def _scatter_model(rng, op, reduction, updates_trained=False):
    w = rng.standard_normal((3, 4)).astype(np.float32)
    index = np.array([[0, 3], [1, 3], [2, 0]]) if op == "ScatterElements" else np.array([[0], [2], [0]])
    updates = rng.standard_normal((3, 2) if op == "ScatterElements" else (3, 4)).astype(np.float32)
    attrs = {"axis": 1} if op == "ScatterElements" else {}
    proto = model([_node(op, ["W", "i", "U"], "t", name="scatter", reduction=reduction, **attrs),
                   _node("Mul", ["x", "t"], "y")], [vi("x", ["N", 3, 4])], [vi("y", ["N", 3, 4])],
                  [numpy_helper.from_array(w, "W"), numpy_helper.from_array(index, "i"),
                   numpy_helper.from_array(updates, "U")], opset=18)
    return proto, w, index, updates


@pytest.mark.parametrize("op, reduction", [("ScatterElements", "max"), ("ScatterND", "mul")])
def test_a_scatter_with_another_reduction_than_add_is_refused_where_a_gradient_crosses_it(rng, op, reduction):
    # trained as an overwrite: the runtime's gradient of a scatter ignores its reduction
    with pytest.raises(ot.UnsupportedOpError, match=rf"{op} with reduction '{reduction}' \(nodes: scatter\)"):
        ot.from_onnx(_scatter_model(rng, op, reduction)[0])


@pytest.mark.torch
@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_a_scatter_that_adds_trains_as_pytorch(rng, op):
    # trained as an overwrite, the data's gradient was 0 at every target: PyTorch's scatter_add was
    # 0.69 off, index_put(accumulate=True) 1.0
    torch = torch_or_skip()
    proto, w, index, updates = _scatter_model(rng, op, "add")
    m = ot.from_onnx(proto, trainable=["W", "U"])
    m.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    x, y = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32)
    with ot.Trainer(m, batch_size=2) as tr:
        tr.step(x, y)
        got = dict(zip(m.weight_names(), tr.get_weights()))
    tw, tu = torch.tensor(w, requires_grad=True), torch.tensor(updates, requires_grad=True)
    if op == "ScatterElements":
        t = tw.scatter_add(1, torch.tensor(index), tu)
    else:
        t = tw.index_put((torch.tensor(index[:, 0]),), tu, accumulate=True)
    torch.nn.functional.mse_loss(torch.tensor(x) * t, torch.tensor(y)).backward()
    np.testing.assert_allclose(got["W"], w - 0.5 * tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["U"], updates - 0.5 * tu.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.predict(x), x * t.detach().numpy(), rtol=1e-5, atol=1e-6)  # export form untouched


@pytest.mark.torch
def _assert_weights_are_torchs(got: dict, net) -> None:
    """ortrain's weights by name (``got``) equal ``net``'s parameters; a Linear's weight the legacy
    exporter renamed and transposed is found by its shape."""
    named = dict(net.named_parameters())
    renamed = [a for n, a in got.items() if n not in named]
    for name, w in named.items():
        have = got[name] if name in got else next(a.T for a in renamed if a.T.shape == tuple(w.shape))
        np.testing.assert_allclose(have.reshape(w.shape), w.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("form", ["softplus", "hardswish", "view_as_image", "view_as_image_dynamo", "concat_softplus"])
def test_a_max_pool_whose_input_the_gradient_builder_loses_trains(tmp_path, form):
    # the gradient builder lost the shape of the pool's input (after Softplus's or HardSwish's
    # arithmetic forms, a Concat, a view to x.size(0)), and opening the training session killed the
    # process (SIGSEGV, in MaxPoolGrad's kernel), or its gradient had 0 cells: the fit runs in a child
    import json
    import subprocess
    import sys
    torch = torch_or_skip()
    nn = torch.nn
    torch.manual_seed(0)

    class ViewAsImage(nn.Module):  # LeNet's flat input
        def __init__(self):
            super().__init__()
            self.c, self.p, self.l = nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(2), nn.Linear(32, 3)

        def forward(self, x):
            return self.l(self.p(torch.relu(self.c(x.view(x.size(0), 1, 8, 8)))).flatten(1))

    class ConcatSoftplus(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.a, self.p = nn.Linear(6, 6), nn.Softplus(), nn.MaxPool1d(2)

        def forward(self, x):
            h = self.l(x)
            return self.p(self.a(torch.cat([h, h], 1))).flatten(1)
    act = {"softplus": nn.Softplus, "hardswish": nn.Hardswish}.get(form)
    net, x = ((nn.Sequential(nn.Conv2d(2, 2, 1), act(), nn.MaxPool2d(2), nn.Flatten()), torch.randn(4, 2, 6, 6))
              if act is not None else (ViewAsImage(), torch.randn(4, 64)) if form.startswith("view")
              else (ConcatSoftplus(), torch.randn(4, 2, 6)))
    y = torch.randn_like(net(x))
    if form.endswith("dynamo"):
        torch.onnx.export(net, (x,), str(tmp_path / "m.onnx"), dynamo=True, optimize=False, input_names=["x"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    else:
        torch.onnx.export(net, (x,), str(tmp_path / "m.onnx"), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.detach().numpy())
    child = (f"import json, numpy as np, ortrain as ot\n"
             f"m = ot.from_onnx({str(tmp_path / 'm.onnx')!r})\n"
             "m.compile(optimizer=ot.optim.SGD(lr=0.1), loss='mse')\n"
             f"m.fit(np.load({str(tmp_path / 'x.npy')!r}), np.load({str(tmp_path / 'y.npy')!r}), batch_size=4, "
             "epochs=2, shuffle=False, verbose=0)\n"
             "print(json.dumps({n: w.tolist() for n, w in zip(m.weight_names(), m.get_weights())}))\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = {n: np.array(w) for n, w in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    _assert_weights_are_torchs(got, net)


def test_a_max_pool_counting_its_indices_column_major_trains_as_pytorch(rng):
    # storage_order=1 only sets how the indices count, but the runtime's gradient read them row-major:
    # the gradient landed on the wrong cells (relative error 1.0 against PyTorch)
    torch = torch_or_skip()
    w = rng.standard_normal((1, 1, 4, 6)).astype(np.float32)
    proto = model([_node("Mul", ["x", "W"], "h"),
                   _node("MaxPool", ["h"], "y", kernel_shape=[2, 2], strides=[2, 2], storage_order=1)],
                  [vi("x", ["N", 1, 4, 6])], [vi("y", ["N", 1, 2, 3])], [numpy_helper.from_array(w, "W")])
    m = ot.from_onnx(proto)
    m.compile(optimizer=ot.optim.SGD(lr=1.0), loss="mse")
    x, y = rng.standard_normal((2, 1, 4, 6)).astype(np.float32), rng.standard_normal((2, 1, 2, 3)).astype(np.float32)
    with ot.Trainer(m, batch_size=2) as tr:
        tr.step(x, y)
        got = tr.get_weights()[0]
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.mse_loss(torch.nn.functional.max_pool2d(torch.tensor(x) * tw, 2), torch.tensor(y)).backward()
    np.testing.assert_allclose(got, w - tw.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, k, s, pad, cip", [
    ("max", 2, 3, 0, True), ("max", 2, 2, 1, True), ("max", 3, 3, 1, True),
    ("avg", 2, 2, 1, True), ("avg", 2, 2, 1, False), ("avg", 2, 2, 0, True), ("avg", 3, 2, 1, True),
    ("avg", 2, 3, 0, False), ("avg", 3, 3, 1, True)])
def test_ceil_mode_pools_compute_pytorchs_windows_in_predict_training_and_export(tmp_path, kind, k, s, pad, cip):
    # onnxruntime 1.19.2 computed a last window starting past the input (-3.4e38 or cells of other
    # rows; training refused the MaxPool, and trained another AveragePool than predict ran) and divided
    # an overhanging window of an AveragePool counting its padding by the whole kernel, where PyTorch,
    # the specification and current onnxruntime drop the one and divide the other by its cells
    torch = torch_or_skip()
    import onnxruntime as ort
    torch.manual_seed(0)
    pool = (torch.nn.MaxPool2d(k, s, padding=pad, ceil_mode=True) if kind == "max" else
            torch.nn.AvgPool2d(k, s, padding=pad, ceil_mode=True, count_include_pad=cip))
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), pool, torch.nn.Flatten())
    x = torch.randn(3, 1, 5, 6)
    path = str(tmp_path / "pool.onnx")
    torch.onnx.export(net, (x,), path, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    m = ot.from_onnx(path)
    np.testing.assert_allclose(m.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    y = torch.randn(net(x).shape)
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    m.fit(x.numpy(), y.numpy(), batch_size=3, epochs=1, verbose=0, shuffle=False)
    torch.nn.functional.mse_loss(net(x), y).backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= 0.1 * p.grad
    for got, want in zip(m.get_weights(), [p.detach().numpy() for p in net.parameters()]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    m.export_onnx(str(tmp_path / "trained.onnx"))
    served = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {"x": x.numpy()})[0], net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k, s, p, d, size", [(2, 2, 1, 2, 6), (2, 4, 1, 2, 12), (4, 4, 2, 2, 13), (2, 3, 1, 2, (5, 6)),
                                        (2, 2, 1, (1, 2), (5, 6))])
def test_a_dilated_ceil_mode_max_pool_the_specifications_form_cannot_hold_stays(tmp_path, k, s, p, d, size):
    # the form with the padding its windows reach needs a pad as large as the kernel, which onnxruntime
    # refuses ("Pad should be smaller than kernel"): such a pool stays as it is (failed to load), or where
    # a window is dropped on one axis only its end padding there is trimmed (left whole, onnxruntime
    # added the window: a prediction of another shape than PyTorch's)
    torch = torch_or_skip()
    torch.manual_seed(0)
    two_d = isinstance(size, tuple)
    pool = (torch.nn.MaxPool2d if two_d else torch.nn.MaxPool1d)(k, s, padding=p, dilation=d, ceil_mode=True)
    net = torch.nn.Sequential((torch.nn.Conv2d if two_d else torch.nn.Conv1d)(1, 2, 1), pool, torch.nn.Flatten())
    x = torch.randn(3, 1, *(size if two_d else (size,)))
    torch.onnx.export(net, (x,), str(tmp_path / "pool.onnx"), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    m = ot.from_onnx(str(tmp_path / "pool.onnx"))
    np.testing.assert_allclose(m.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_ceil_mode_pool_whose_dropped_window_no_form_can_drop_is_refused_naming_it(tmp_path):
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.MaxPool2d(3, 4, padding=1, dilation=(1, 2),
                                                                          ceil_mode=True))
    torch.onnx.export(net, (torch.randn(3, 1, 7, 5),), str(tmp_path / "pool.onnx"), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    with pytest.raises(ot.UnsupportedOpError, match=r"MaxPool node '.*': with ceil_mode its last window on spatial "
                                                    r"axis 0 starts past the input .* no padding onnxruntime takes"):
        ot.from_onnx(str(tmp_path / "pool.onnx"))


@pytest.mark.parametrize("pool,hazard", [
    ("MaxPool2d(2, 2, padding=1, ceil_mode=True)", "starts in the end padding"),
    ("AvgPool2d(2, 2, ceil_mode=True)", "overhangs the padded input"),
    ("AvgPool2d(3, 2, padding=1, ceil_mode=True)", "overhangs the padded input"),
    ("MaxPool2d(3, 2, ceil_mode=True)", None), ("AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)", None),
    ("MaxPool2d((2, 3), 2, (1, 1), ceil_mode=True)", "height"), ("AvgPool2d((2, 3), (2, 1), (0, 1), ceil_mode=True)",
                                                                "height")])
def test_a_ceil_mode_pool_of_free_image_sizes_where_the_runtimes_could_differ_is_refused(tmp_path, pool, hazard):
    # exported with dynamic image sizes, such a pool imported without a word: predict gave (4, 1, 4, 4) where
    # PyTorch and the exported file in current onnxruntime give (4, 1, 3, 3), and training ran on that
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), eval(f"torch.nn.{pool}"))
    # ("height": the height fixed at 5, where the runtimes differ, and the width free, which the form
    # that agrees needs fixed too: predict gave (2, 1, 4, 5) where PyTorch gives (2, 1, 3, 5))
    torch.onnx.export(net, (torch.zeros(2, 1, 5, 6),), str(tmp_path / "p.onnx"), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "b", 3: "w"} if hazard == "height" else {0: "b", 2: "h", 3: "w"}})
    if hazard == "height":
        with pytest.raises(ot.UnsupportedOpError, match=r"node '.*': with ceil_mode its last window on spatial axis 0 "
                                                        r"\(size 5\) .* spatial axis 1 has a size not known before run time"):
            ot.from_onnx(str(tmp_path / "p.onnx"))
        return
    if hazard is not None:
        with pytest.raises(ot.UnsupportedOpError, match=f"node '.*': with ceil_mode and spatial axis 0 of a size not "
                                                        f"known before run time .* its last window {hazard}.*Export the "
                                                        "model with fixed spatial sizes"):
            ot.from_onnx(str(tmp_path / "p.onnx"))
        return
    m = ot.from_onnx(str(tmp_path / "p.onnx"))  # no size makes the runtimes differ: it imports and matches
    for size in (5, 6, 7):
        x = torch.randn(3, 1, size, size)
        np.testing.assert_allclose(m.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_ceil_mode_pool_whose_input_shape_nothing_tells_is_planned_as_of_free_sizes():
    # a pool whose input's rank onnx's inference could not find was left in onnxruntime 1.19.2's form
    from ortrain.graph.repairs import _spec_pool_plan
    risky = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2], strides=[2], pads=[1, 1], ceil_mode=1)
    with pytest.raises(ot.UnsupportedOpError, match=r"MaxPool node 'y': with ceil_mode and spatial axis 0 of a size "
                                                    r"not known before run time"):
        _spec_pool_plan(risky, None)
    # a size onnx's inference made up for a computation it could not follow is not called the file's
    with pytest.raises(ot.UnsupportedOpError, match=r"spatial axis 0 of a size not known before run time \(one the "
                                                    r"file leaves free, or one computed where onnx's shape inference"):
        _spec_pool_plan(risky, [2, 1, "unk__5"])
    with pytest.raises(ot.UnsupportedOpError, match=r"spatial axis 0 of a size the file leaves free \('h'\)"):
        _spec_pool_plan(risky, [2, 1, "h"])
    safe = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3], strides=[2], ceil_mode=1)
    assert _spec_pool_plan(safe, None) is None


def _one_step_of_an_export_matches_torch(net, x, path, dynamo=False, training=False):
    """predict, then one SGD step on mean squared error, of ``net`` exported to ``path`` (``training``:
    in training mode, unfolded) and imported, against PyTorch."""
    import warnings
    torch = torch_or_skip()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(net, (x,), str(path), dynamo=True, optimize=False, input_names=["x"],
                              dynamic_shapes=({0: torch.export.Dim("batch")},))
        else:
            torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}},
                              **({"training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": False}
                                 if training else {}))
    m = ot.from_onnx(str(path))
    before = {n: w.copy() for n, w in zip(m.weight_names(), m.get_weights(), strict=True)}
    np.testing.assert_allclose(m.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    y = torch.randn_like(net(x))
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    m.fit(x.numpy(), y.detach().numpy(), batch_size=len(x), shuffle=False, verbose=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()
    got = dict(zip(m.weight_names(), m.get_weights(), strict=True))
    assert any(not np.array_equal(got[n], before[n]) for n in got)  # the step moved the weights
    _assert_weights_are_torchs(got, net)


@pytest.mark.parametrize("form", ["upsample_avg_pool", "upsample_adaptive", "upsample_bilinear", "upsample_ceil_pool",
                                  "reshape_avg_pool", "dynamo_mean_ceil_pool", "group_norm_after_dropped_window",
                                  "training_export_resize_after_dropped_window", "dynamo_view_ceil_pool",
                                  "reflect_pad_ceil_pool"])
def test_sizes_the_exporters_computations_hide_from_onnxs_inference(tmp_path, form):
    # After an Upsample (computed Resize sizes), a reshape(x.shape[0], 2, -1) or the dynamo exporter's
    # mean(-1, keepdim=True) (its axes a Reshape of a constant), onnx's inference lost every size:
    # valid fixed-size models were refused ("give the model a static channel count", "export with
    # fixed spatial sizes"), or a ceil_mode pool kept onnxruntime 1.19.2's form (0.364 where PyTorch
    # gives 0.545). An output size an exporter declared with a pool's dropped window kept made fit ask
    # for targets of (4, 5) where the model gives (4, 4).
    torch = torch_or_skip()
    nn = torch.nn
    torch.manual_seed(0)

    class Reshaped(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.p = nn.Conv1d(1, 2, 1), nn.AvgPool1d(2)

        def forward(self, x):
            return self.p(self.c(x).reshape(x.shape[0], 2, -1))

    class MeanAdded(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.p = nn.Conv1d(1, 1, 1), nn.AvgPool1d(3, 2, 1, ceil_mode=True)

        def forward(self, x):
            h = self.c(x)
            return self.p(h + h.mean(-1, keepdim=True)).flatten(1)

    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.p = nn.Linear(3, 8), nn.MaxPool2d(1, 2, ceil_mode=True)
            self.g = nn.GroupNorm(1, 1, affine=False)

        def forward(self, x):
            h = self.p(self.l(x))
            return (self.g(h) + h).flatten(1)
    class Viewed(nn.Module):  # the dynamo exporter declares the view's sizes, which onnx cannot follow: refused
        def __init__(self):
            super().__init__()
            self.p, self.l = nn.MaxPool2d(2, 2, padding=1, ceil_mode=True), nn.Linear(18, 3)

        def forward(self, x):
            return self.l(self.p(x.view(x.size(0), 2, 5, 5)).flatten(1))

    class Resized(nn.Module):  # a training-mode export concatenates the resize's scales: fit asked for (4, 60)
        def __init__(self):
            super().__init__()
            self.ap, self.up = nn.AvgPool2d(2, 3, ceil_mode=True), nn.Upsample(scale_factor=2.0)
            self.c = nn.Conv2d(4, 1, 1, padding=1)

        def forward(self, x):
            h = self.ap(x).transpose(2, 1)
            h = torch.cat([torch.cat([h, h], 1)] * 2, 2)
            return self.c(self.up(h)).flatten(1)
    up = [nn.Conv2d(1, 2, 1), nn.Upsample(scale_factor=2)]
    net, shape = {"upsample_avg_pool": (nn.Sequential(*up, nn.AvgPool2d(2, 2)), (4, 1, 4, 4)),
                  "upsample_adaptive": (nn.Sequential(*up, nn.AdaptiveAvgPool2d(2)), (4, 1, 4, 4)),
                  "upsample_bilinear": (nn.Sequential(*up, nn.Upsample(scale_factor=2, mode="bilinear")), (4, 1, 4, 4)),
                  "upsample_ceil_pool": (nn.Sequential(*up, nn.MaxPool2d(3, 2, 1, ceil_mode=True)), (4, 1, 5, 5)),
                  "reshape_avg_pool": (Reshaped(), (4, 1, 6)), "dynamo_mean_ceil_pool": (MeanAdded(), (4, 1, 6)),
                  "group_norm_after_dropped_window": (Normed(), (4, 1, 1, 3)),
                  "training_export_resize_after_dropped_window": (Resized(), (4, 2, 4, 3)),
                  "dynamo_view_ceil_pool": (Viewed(), (4, 50)),
                  # TorchScript computes the pad's amounts through ConstantOfShape, a reversed Slice, Transpose
                  "reflect_pad_ceil_pool": (nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReflectionPad2d(1),
                                                          nn.MaxPool2d(2, 2, padding=1, ceil_mode=True)), (4, 1, 7, 7))}[form]
    _one_step_of_an_export_matches_torch(net, torch.randn(*shape), tmp_path / "m.onnx", dynamo=form.startswith("dynamo"),
                                         training=form.startswith("training"))


def test_a_ceil_mode_pool_after_one_that_drops_a_window_is_planned_on_the_sizes_it_gets(tmp_path):
    # every pool was planned on one shape inference of the file, which keeps the first pool's dropped
    # window: the second was planned for a longer input (predictions 2.5x PyTorch's, or another shape)
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 1), torch.nn.AvgPool1d(2, 3, ceil_mode=True),
                              torch.nn.AvgPool1d(3, 3, 1, ceil_mode=True), torch.nn.Flatten())
    x = torch.randn(3, 1, 6)
    torch.onnx.export(net, (x,), str(tmp_path / "pools.onnx"), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "N"}})
    m = ot.from_onnx(str(tmp_path / "pools.onnx"))
    np.testing.assert_allclose(m.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [(5, 6), (8, 6)])
def test_two_ceil_mode_pools_of_a_file_saved_with_onnxs_inferred_sizes_match_torch(size):
    # the sizes onnx's inference saved with the file keep the first pool's dropped window; once that pool
    # was rewritten they were trusted for the second one: (1, 1, 2, 2) where PyTorch gives (1, 1, 1, 2)
    torch = torch_or_skip()
    pool = {"kernel_shape": [3, 4], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1}
    proto = model([_node("AveragePool", ["x"], "p", **pool), _node("Relu", ["p"], "r"),
                   _node("AveragePool", ["r"], "out", **pool)], [vi("x", ["N", 1, *size])], [vi("out", None)])
    proto = onnx.shape_inference.infer_shapes(proto)
    x = np.random.default_rng(0).standard_normal((2, 1, *size)).astype(np.float32)
    p = torch.nn.AvgPool2d((3, 4), 3, 1, ceil_mode=True, count_include_pad=True)
    np.testing.assert_allclose(ot.from_onnx(proto).predict(x), p(torch.relu(p(torch.from_numpy(x)))).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_a_max_pool_window_of_padding_alone_is_refused_before_training(tmp_path):
    # onnxruntime-training's gradient of such a window wrote outside its buffer: a segfault, or "double
    # free or corruption" later in the process
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Conv3d(2, 2, 1), torch.nn.MaxPool3d(2, 3, 1, 2), torch.nn.Flatten())
    x = torch.randn(3, 2, 1, 1, 1)  # one window, whose taps (-1 and 1) both lie in the padding
    torch.onnx.export(net, (x,), str(tmp_path / "pool.onnx"), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "N"}})
    m = ot.from_onnx(str(tmp_path / "pool.onnx"))
    m.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    before = m.get_weights()
    with pytest.raises(ot.UnsupportedOpError, match=r"MaxPool node '.*': a window on spatial axis \d holds no cell of "
                                                    r"the input, only padding"):
        m.fit(x.numpy(), np.zeros((3, 2), np.float32), batch_size=3, verbose=0)
    for a, b in zip(m.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_an_unnamed_node_is_numbered_alike_at_import_and_when_training_starts(rng):
    # the import's refusal counted among the nodes a gradient crosses ("LSTM#0"), the training
    # refusal among the graph's nodes ("LSTM#1"): one node, two names
    proto = _lstm_model(rng, clip=2.0)
    proto.graph.node[1].ClearField("name")
    with pytest.raises(ot.UnsupportedOpError, match=r"LSTM with clip \(nodes: LSTM#1\)"):
        ot.from_onnx(proto)
    m = ot.from_onnx(proto, trainable=["head"])
    m.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"LSTM with clip \(nodes: LSTM#1\)"):
        ot.Trainer(m, batch_size=3)


def test_a_value_read_twice_by_one_node_trains(rng):
    # Concat(h, x, x) and MatMul(h, h) failed in the gradient builder: "Duplicate definition of
    # name" (x_grad; the Shape it takes of each MatMul operand), whatever the batch axis's name
    w = rng.standard_normal((M, M)).astype(np.float32) * 0.5
    _one_sgd_step_matches_torch(
        [_node("MatMul", ["x", "w"], "h"), _node("Concat", ["h", "x", "x"], "out", axis=1)],
        _x(M), [3 * M], {"w": w}, lambda x, t: torch_cat([x @ t["w"], x, x]))
    x3 = np.random.default_rng(1).standard_normal((N, M, M)).astype(np.float32)
    _one_sgd_step_matches_torch(
        [_node("MatMul", ["x", "w"], "h"), _node("MatMul", ["h", "h"], "out")],
        x3, [M, M], {"w": w}, lambda x, t: (x @ t["w"]) @ (x @ t["w"]))


def test_a_value_two_concatenations_read_trains(rng):
    # a data input (or any value without a gradient) joined to two hidden layers, DenseNet's skips:
    # each concatenation's gradient named an "x_grad" ("Duplicate definition of name (x_grad)")
    w, v = (rng.standard_normal((M, M)).astype(np.float32) * 0.5 for _ in range(2))
    _one_sgd_step_matches_torch(
        [_node("MatMul", ["x", "w"], "h"), _node("MatMul", ["x", "v"], "g"), _node("Concat", ["x", "h"], "a", axis=1),
         _node("Concat", ["g", "x"], "b", axis=1), _node("Mul", ["a", "b"], "out")],
        _x(M), [2 * M], {"w": w, "v": v},
        lambda x, t: torch_cat([x, x @ t["w"]]) * torch_cat([x @ t["v"], x]))


@pytest.mark.parametrize("form", ["concat", "two_norms", "layers"])
@pytest.mark.parametrize("norm", ["BatchNormalization", "LayerNormalization"])
def test_a_data_input_joined_to_its_own_norm_trains(rng, norm, form):
    # concat([x, bn(x)]) (a DenseNet block at the model's input): the concatenation's gradient and the
    # norm's each wrote an "x_grad" ("Duplicate definition of name (x_grad)"); two norms of x too
    torch = torch_or_skip()
    F = torch.nn.functional
    w = rng.standard_normal((2 * M, 3)).astype(np.float32) * 0.5
    s, b = (rng.standard_normal(M).astype(np.float32) for _ in range(2))
    stats = {"mean": np.zeros(M, np.float32), "var": np.ones(M, np.float32)}
    bn = norm == "BatchNormalization"
    inputs = ["x", "s", "b", "mean", "var"] if bn else ["x", "s", "b"]

    def normed(x, t, training, k=""):
        return F.batch_norm(x, None if training else torch_tensor(stats["mean"]), None if training else
                            torch_tensor(stats["var"]), t["s" + k], t["b" + k], training=training, eps=1e-5) if bn \
            else F.layer_norm(x, (M,), t["s" + k], t["b" + k], eps=1e-5)
    if form == "concat":
        _one_sgd_step_matches_torch(
            [_node(norm, inputs, "n", epsilon=1e-5), _node("Concat", ["x", "n"], "c", axis=1),
             _node("MatMul", ["c", "w"], "out")],
            _x(M), [3], {"w": w, "s": s, "b": b}, lambda x, t: torch_cat([x, normed(x, t, False)]) @ t["w"],
            consts=stats if bn else None, training_forward=lambda x, t: torch_cat([x, normed(x, t, True)]) @ t["w"])
        return
    if form == "two_norms":  # each with its own weights
        s2, b2 = (rng.standard_normal(M).astype(np.float32) for _ in range(2))
        _one_sgd_step_matches_torch(
            [_node(norm, inputs, "n", epsilon=1e-5), _node(norm, [i + "2" if i != "x" else i for i in inputs], "n2",
                                                           epsilon=1e-5),
             _node("Concat", ["n", "n2"], "c", axis=1), _node("MatMul", ["c", "w"], "out")],
            _x(M), [3], {"w": w, "s": s, "b": b, "s2": s2, "b2": b2},
            lambda x, t: torch_cat([normed(x, t, False), normed(x, t, False, "2")]) @ t["w"],
            consts={**stats, "mean2": stats["mean"], "var2": stats["var"]} if bn else None,
            training_forward=lambda x, t: torch_cat([normed(x, t, True), normed(x, t, True, "2")]) @ t["w"])
        return
    inp = ot.Input((M,))
    layer = ot.layers.BatchNorm(epsilon=1e-5) if bn else ot.layers.LayerNorm(epsilon=1e-5)
    native = ot.Model(inp, ot.layers.Dense(3)(ot.layers.Concatenate()([inp, layer(inp)])))
    native.set_weights([s, b, *([stats["mean"], stats["var"]] if bn else []), w, np.zeros(3, np.float32)])
    native.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x, y = _x(M), np.random.default_rng(3).standard_normal((N, 3)).astype(np.float32)
    native.fit(x, y, batch_size=N, verbose=0)
    t = {k: torch_tensor(v).requires_grad_() for k, v in {"w": w, "s": s, "b": b}.items()}
    loss = ((torch_cat([torch_tensor(x), normed(torch_tensor(x), t, True)]) @ t["w"] - torch_tensor(y)) ** 2).mean()
    grads = dict(zip(t, torch.autograd.grad(loss, list(t.values()))))
    got = dict(zip(native.weight_names(), native.get_weights()))
    for name, key in (("dense_0.kernel", "w"), (f"{layer.name}.gamma", "s"), (f"{layer.name}.beta", "b")):
        np.testing.assert_allclose(got[name], t[key].detach().numpy() - 0.1 * grads[key].numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def torch_tensor(a):
    import torch
    return torch.tensor(a.astype(np.float64))


def test_a_captured_step_over_two_concatenations_of_one_input_matches_torch():
    torch = torch_or_skip()
    from ortrain import ag
    start, x = np.arange(4, dtype=np.float32), np.linspace(-1, 1, 4).astype(np.float32)
    w = ag.param(start.copy(), name="w")
    step = ot.capture_step(lambda x: ag.mean(ag.concat([x, w]) * ag.concat([w, x])),
                           optimizer=ot.optim.Adam([w], lr=0.1))
    step(x=x)
    tw = torch.tensor(start, requires_grad=True)
    torch.mean(torch.cat([torch.tensor(x), tw]) * torch.cat([tw, torch.tensor(x)])).backward()
    torch.optim.Adam([tw], lr=0.1).step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6, atol=1e-6)


def torch_cat(parts):
    import torch
    return torch.cat(parts, dim=1)


def test_a_concatenation_gradient_read_by_a_gemm_opens_its_session(rng):
    # GemmSumFusion asserted ("src_arg_index < 2") where a Gemm read the concatenation gradient's third
    # split output through a node the session's optimizer removes; the Sum of its output is an Add
    import io
    import warnings
    torch = torch_or_skip()
    nn = torch.nn
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.a = nn.Embedding(6, 3), nn.Linear(3, 2, bias=False)
            self.p = nn.Parameter(torch.randn(2))
            self.b, self.c, self.q = nn.Linear(2, 5), nn.Linear(2, 4), nn.Parameter(torch.randn(4))

        def forward(self, idx):
            h = self.a(self.e(idx))
            g = h @ self.p
            return torch.cat([self.b(g), (h @ h.transpose(1, 2)).flatten(1), self.c(g) - self.q], 1)
    net = Net()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(3, 2, dtype=torch.long),), buf, dynamo=False, input_names=["idx"],
                          output_names=["y"], do_constant_folding=False,
                          dynamic_axes={"idx": {0: "batch"}, "y": {0: "batch"}})
    model = ot.from_onnx(buf.getvalue())
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    idx = rng.integers(0, 6, (4, 2))
    y = rng.standard_normal((4, 13)).astype(np.float32)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        nn.functional.mse_loss(net(torch.from_numpy(idx)), torch.from_numpy(y)).backward()
        opt.step()
    model.fit(idx, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(idx), net(torch.from_numpy(idx)).numpy(), rtol=1e-5, atol=1e-6)


def test_a_pow_whose_base_and_exponent_are_both_trained_is_refused_by_name(rng):
    # the builder failed with "GradientBuilder is not implemented for CUDA Pow's input exponent"
    w = rng.standard_normal((M, M)).astype(np.float32)
    proto = model([_node("MatMul", ["x", "w"], "h"), _node("Mul", ["h", "h"], "hh"), _node("Add", ["hh", "one"], "b"),
                   _node("Pow", ["b", "h"], "out", name="power")],
                  [vi("x", ["N", M])], [vi("out", ["N", M])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    with pytest.warns(UserWarning, match="Pow's exponent"):
        m = ot.from_onnx(proto)
    m.compile(optimizer="sgd", loss="mse")
    x = _x(M)
    with pytest.raises(ot.UnsupportedOpError, match="Pow 'power': its base and its exponent both depend on trained"):
        m.fit(x, np.ones_like(x), verbose=0)
    np.testing.assert_array_equal(m.get_weights()[0], w)


def test_a_scatter_nd_that_adds_over_two_axes_trains_exactly_on_several_threads(rng):
    # training writes an adding ScatterND as one ScatterElements over a 2-D view (the runtime's own
    # kernel adds on several threads without a lock, and loses additions to a row indexed twice):
    # offsets over two axes, negative indices among them, on two threads
    n = 8_000
    w = rng.standard_normal((4, 5, 64)).astype(np.float32)
    index = np.stack([rng.integers(-4, 4, n), rng.integers(0, 5, n)], axis=1).astype(np.int64)  # negatives too
    updates = (0.01 * rng.standard_normal((n, 64))).astype(np.float32)
    proto = model([_node("ScatterND", ["W", "i", "U"], "t", name="scatter", reduction="add"),
                   _node("Mul", ["x", "t"], "y")], [vi("x", ["N", 4, 5, 64])], [vi("y", ["N", 4, 5, 64])],
                  [numpy_helper.from_array(w, "W"), numpy_helper.from_array(index, "i"),
                   numpy_helper.from_array(updates, "U")], opset=18)
    m = ot.from_onnx(proto, trainable=["W", "U"])
    m.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    x, y = rng.standard_normal((2, 4, 5, 64)).astype(np.float32), rng.standard_normal((2, 4, 5, 64)).astype(np.float32)
    t = w.astype(np.float64)
    np.add.at(t, (index[:, 0] % 4, index[:, 1]), updates)
    dt = (2 * (x * t - y) / y.size * x).sum(0)
    with ot.Trainer(m, batch_size=2, threads=2) as tr:
        tr.step(x, y)
        got = dict(zip(m.weight_names(), tr.get_weights()))
    np.testing.assert_allclose(got["W"], w - 0.5 * dt, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["U"], updates - 0.5 * dt[index[:, 0] % 4, index[:, 1]], rtol=1e-5, atol=1e-6)
