"""ortrain.ag: op values and gradients against PyTorch and numpy, trace-time errors, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import flushed, torch_or_skip
from helpers import gradient_probe, probed_grads

import ortrain as ot
from ortrain import ag
from ortrain.ag.tracer import topological_order, trace

R = np.random.default_rng(42)
W0 = R.standard_normal((3, 4)).astype(np.float32)
X0 = R.standard_normal((4, 5)).astype(np.float32)
V0 = R.standard_normal((3, 5)).astype(np.float32)


def _grads(ag_out, torch_out, inits, inputs):
    """Loss value and gradients of ``sum(out * probe)`` in ortrain (read from a captured step) and in PyTorch."""
    torch = torch_or_skip()
    params = [ag.param(a, name=f"p{i}") for i, a in enumerate(inits)]
    probe = {}

    def fn(**xs):
        out = ag_out(*params, **xs)
        if "p" not in probe:
            probe["p"] = np.random.default_rng(7).standard_normal(out.shape).astype(np.float32)
        return ag.sum(out * probe["p"])

    opt = gradient_probe(params)
    train = ot.capture_step(fn, optimizer=opt)
    loss = float(train(**inputs))
    got = probed_grads(opt)
    train.free()
    tp = [torch.tensor(a, requires_grad=True) for a in inits]
    tx = {k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}
    ref = (torch_out(torch, *tp, **tx) * torch.from_numpy(probe["p"])).sum()
    ref.backward()
    return loss, float(ref.detach()), got, [t.grad.numpy() for t in tp]


OPS = {
    "matmul": (lambda w, x: ag.matmul(w, x), lambda t, w, x: w @ x, [W0], {"x": X0}),
    "matmul_1d_and_ndarray_left": (lambda w, x: x @ w + np.ones(5, np.float32) @ w,
                                   lambda t, w, x: x @ w + t.ones(5) @ w, [X0.T.copy()], {"x": V0[0].copy()}),
    "batched_matmul": (lambda w, x: ag.reshape(x, (2, 5, 2)) @ w, lambda t, w, x: x.reshape(2, 5, 2) @ w,
                       [W0[:2, :3].copy()], {"x": X0[:, :5].T.copy()}),
    "add_broadcast": (lambda w, x: ag.add(ag.reshape(ag.sum(w, axis=1), (3, 1)), x),
                      lambda t, w, x: w.sum(1).reshape(3, 1) + x, [W0], {"x": V0}),
    "sub_mul_div": (lambda w, x: ag.div(ag.mul(2.0 - w, w), w * w + 3.0) @ ag.sub(x, 0.5),
                    lambda t, w, x: ((2.0 - w) * w / (w * w + 3.0)) @ (x - 0.5), [W0], {"x": X0}),
    "scale_neg_rdiv": (lambda w, x: ag.scale(-w, 0.5) + 1.0 / (w * w + 1.0),
                       lambda t, w, x: -w * 0.5 + 1.0 / (w * w + 1.0), [W0], {"x": X0}),
    "relu": (lambda w, x: ag.relu(w @ x), lambda t, w, x: t.relu(w @ x), [W0], {"x": X0}),
    "sigmoid": (lambda w, x: ag.sigmoid(w @ x), lambda t, w, x: t.sigmoid(w @ x), [W0], {"x": X0}),
    "tanh": (lambda w, x: ag.tanh(w @ x), lambda t, w, x: t.tanh(w @ x), [W0], {"x": X0}),
    "gelu": (lambda w, x: ag.gelu(w @ x), lambda t, w, x: t.nn.functional.gelu(w @ x), [W0], {"x": X0}),
    "softmax_last": (lambda w, x: ag.softmax(w @ x), lambda t, w, x: t.softmax(w @ x, -1), [W0], {"x": X0}),
    "softmax_axis0": (lambda w, x: ag.softmax(w @ x, axis=0), lambda t, w, x: t.softmax(w @ x, 0), [W0], {"x": X0}),
    "log_softmax": (lambda w, x: ag.log_softmax(w @ x), lambda t, w, x: t.log_softmax(w @ x, -1), [W0], {"x": X0}),
    "exp_log": (lambda w, x: ag.log(ag.exp(w) + w * w), lambda t, w, x: t.log(t.exp(w) + w * w), [W0], {"x": X0}),
    "sum_axis_keepdims": (lambda w, x: ag.sum(w @ x, axis=1, keepdims=True) * w,
                          lambda t, w, x: (w @ x).sum(1, keepdim=True) * w, [W0], {"x": X0}),
    "mean_axes": (lambda w, x: ag.mean(w @ x, axis=(0,)) + ag.mean(w),
                  lambda t, w, x: (w @ x).mean(0) + w.mean(), [W0], {"x": X0}),
    "reshape_transpose_T": (lambda w, x: ag.concat([ag.reshape(ag.transpose(ag.reshape(w, (2, -1))) @
                                                           ag.reshape(w, (2, 6)), (36,)),
                                                ag.reshape(w.T @ w, -1)]),
                            lambda t, w, x: t.cat([(w.reshape(2, -1).T @ w.reshape(2, 6)).reshape(36),
                                                   (w.T @ w).reshape(-1)]), [W0], {"x": X0}),
    "concat": (lambda w, x: ag.concat([w @ x, ag.relu(w), w * 2.0], axis=1),
               lambda t, w, x: t.cat([w @ x, t.relu(w), w * 2.0], 1), [W0], {"x": X0}),
    "get_rows_param": (lambda w, i: ag.get_rows(w, i) * 2.0, lambda t, w, i: w[i] * 2.0, [W0],
                       {"i": np.array([2, 0, 2, 1])}),
    "linear_bias": (lambda w, b, x: ag.linear(x.T, w, b), lambda t, w, b, x: t.nn.functional.linear(x.T, w, b),
                    [W0, R.standard_normal(3).astype(np.float32)], {"x": X0}),
    "two_params": (lambda w, v, x: ag.tanh(w @ x) * v, lambda t, w, v, x: t.tanh(w @ x) * v, [W0, V0], {"x": X0}),
    # 1-d operands on the right: made matrices, since the runtime's MatMul gradient gets them wrong
    "matmul_1d_right_param": (lambda v, x: ag.matmul(ag.transpose(x), v), lambda t, v, x: x.T @ v,
                              [np.random.default_rng(5).standard_normal(4).astype(np.float32)], {"x": X0}),
    "matmul_matrix_vector": (lambda w, x: w @ x, lambda t, w, x: w @ x, [V0], {"x": X0[0].copy()}),
    "matmul_vector_dot": (lambda v, x: v @ x, lambda t, v, x: v @ x,
                          [np.random.default_rng(6).standard_normal(5).astype(np.float32)], {"x": V0[1].copy()}),
    # a param whose only use is both inputs of one op (its gradient name would be defined twice)
    "param_squared": (lambda w, x: w * w, lambda t, w, x: w * w, [W0], {"x": X0}),
    "param_concat_twice": (lambda w, x: ag.concat([w, w], axis=1), lambda t, w, x: t.cat([w, w], 1), [W0],
                           {"x": X0}),
    # PyTorch's argument names, and its transpose(x, d0, d1) and negative permutation axes
    "torch_names": (lambda w, x: ag.concat([ag.softmax(w @ x, dim=0), ag.log_softmax(w @ x, dim=0),
                                            ag.sum(w @ x, dim=1, keepdim=True) * w,
                                            ag.mean(w @ x, dim=(0, 1), keepdim=True) * w], dim=1),
                    lambda t, w, x: t.cat([t.softmax(w @ x, dim=0), t.log_softmax(w @ x, dim=0),
                                           (w @ x).sum(dim=1, keepdim=True) * w,
                                           (w @ x).mean(dim=(0, 1), keepdim=True) * w], dim=1), [W0], {"x": X0}),
    "transpose_torch_and_negative": (
        lambda w, x: ag.transpose(ag.reshape(w, (3, 2, 2)), 0, 2) * ag.transpose(ag.reshape(w, (3, 2, 2)), (-1, 1, 0)),
        lambda t, w, x: t.transpose(w.reshape(3, 2, 2), 0, 2) * w.reshape(3, 2, 2).permute(-1, 1, 0), [W0],
        {"x": X0}),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_value_and_gradient_match_pytorch(name):
    ag_fn, torch_fn, inits, inputs = OPS[name]
    loss, ref, got, want = _grads(ag_fn, torch_fn, inits, inputs)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_sigmoid_is_exact_in_both_tails_with_the_gradient_s_times_one_minus_s():
    # onnxruntime's Sigmoid kernel was 0 from -18 (its gradient too) and 47% off at -16.
    torch = torch_or_skip()
    x = np.concatenate([np.linspace(-100, 100, 401), [-np.inf, -1e30, 1e30, np.inf]]).astype(np.float32)
    W = ag.param(x, name="W")
    opt = gradient_probe([W])
    train = ot.capture_step(lambda: ag.sum(ag.sigmoid(W)), optimizer=opt)
    train()
    grad = probed_grads(opt)[0]
    train.free()
    t = torch.from_numpy(x).double()
    value = ot.capture(lambda: ag.sigmoid(ag.param(x, name="V", trainable=False)))()
    np.testing.assert_allclose(value, flushed(torch.sigmoid(t).numpy()), rtol=1e-6, atol=1e-40)
    # s(x) s(-x), not autograd's float64 s (1 - s), which rounds to 0 above 37
    np.testing.assert_allclose(grad, flushed((torch.sigmoid(t) * torch.sigmoid(-t)).numpy()), rtol=1e-6, atol=1e-40)
    assert grad[200] == 0.25 and x[200] == 0


def _labels():
    return R.integers(0, 4, 5)


LOSSES = {
    "mse": (lambda w, x, y: ag.mse_loss(w @ x, y), lambda t, w, x, y: t.nn.functional.mse_loss(w @ x, y),
            {"y": V0}),
    "huber": (lambda w, x, y: ag.huber_loss(w @ x, y, delta=0.5),
              lambda t, w, x, y: t.nn.functional.huber_loss(w @ x, y, delta=0.5), {"y": V0}),
    "bce_logits": (lambda w, x, y: ag.bce_with_logits_loss(w @ x, y),
                   lambda t, w, x, y: t.nn.functional.binary_cross_entropy_with_logits(w @ x, y),
                   {"y": (V0 > 0).astype(np.float32)}),
    "softmax_ce_labels": (lambda w, x, y: ag.softmax_cross_entropy_loss((w @ x).T, y),
                          lambda t, w, x, y: t.nn.functional.cross_entropy((w @ x).T, y),
                          {"y": R.integers(0, 3, 5)}),
    "softmax_ce_probs": (lambda w, x, y: ag.softmax_cross_entropy_loss((w @ x).T, y),
                         lambda t, w, x, y: t.nn.functional.cross_entropy((w @ x).T, y),
                         {"y": np.eye(3, dtype=np.float32)[[0, 2, 1, 1, 0]] * 0.8 + 0.2 / 3}),
    "ce_probs": (lambda w, x, y: ag.cross_entropy_loss(ag.softmax((w @ x).T), y),
                 lambda t, w, x, y: -(y * t.log(t.softmax((w @ x).T, -1))).sum(-1).mean(),
                 {"y": np.eye(3, dtype=np.float32)[[0, 2, 1, 1, 0]]}),
    "ce_labels": (lambda w, x, y: ag.cross_entropy_loss(ag.softmax((w @ x).T), y),
                  lambda t, w, x, y: t.nn.functional.nll_loss(t.log(t.softmax((w @ x).T, -1)), y),
                  {"y": R.integers(0, 3, 5)}),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_value_and_gradient_match_pytorch(name):
    torch = torch_or_skip()
    ag_fn, torch_fn, extra = LOSSES[name]
    W = ag.param(W0, name="W")
    opt = gradient_probe([W])
    train = ot.capture_step(lambda x, y: ag_fn(W, x, y), optimizer=opt)
    loss = train(x=X0, y=extra["y"])
    assert loss.shape == () and loss.dtype == np.float32
    wt = torch.tensor(W0, requires_grad=True)
    ref = torch_fn(torch, wt, torch.from_numpy(X0), torch.from_numpy(extra["y"]))
    ref.backward()
    np.testing.assert_allclose(float(loss), float(ref.detach()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probed_grads(opt)[0], wt.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_forward_capture_values_match_numpy():
    W = ag.param(W0, name="W", trainable=False)
    f = ot.capture(lambda x: {"h": ag.relu(W @ x), "p": ag.softmax(W @ x, axis=0), "s": ag.sum(W @ x, axis=0),
                              "m": ag.mean(x), "c": ag.concat([W, W], axis=0), "r": ag.get_rows(W, [2, 2, 0])})
    out = f(x=X0)
    h = W0 @ X0
    e = np.exp(h - h.max(0))
    np.testing.assert_allclose(out["h"], np.maximum(h, 0), rtol=1e-6)
    np.testing.assert_allclose(out["p"], e / e.sum(0), rtol=1e-6)
    np.testing.assert_allclose(out["s"], h.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["m"], X0.mean(), rtol=1e-5)
    np.testing.assert_array_equal(out["c"], np.concatenate([W0, W0]))
    np.testing.assert_array_equal(out["r"], W0[[2, 2, 0]])
    np.testing.assert_allclose(ot.capture(lambda x: W @ x)(x=X0), h, rtol=1e-6)


def test_sums_and_means_of_many_elements_are_exact_to_float32():
    # onnxruntime's float32 ReduceSum/ReduceMean add in turn: about 1e-3 off over a million alike values.
    x = 1 + np.random.default_rng(0).random((1000, 1000), dtype=np.float32) * 1e-3
    wide = x.astype(np.float64)
    out = ot.capture(lambda x: {"loss": ag.mean(x), "s": ag.sum(x, dim=1, keepdim=True),
                                "m": ag.mean(ag.reshape(x, (10, 100, 1000)), axis=(1, 2)),
                                "mse": ag.mse_loss(x, ag.scale(x, 0.0))})(x=x)
    assert out["loss"] == pytest.approx(wide.mean(), rel=1e-7)
    np.testing.assert_allclose(out["s"], wide.sum(1, keepdims=True), rtol=3e-7)
    np.testing.assert_allclose(out["m"], wide.reshape(10, -1).mean(1), rtol=1e-7)
    assert out["mse"] == pytest.approx((wide ** 2).mean(), rel=1e-7)
    # and the gradient through the widened mean is the float32 one
    W = ag.param(np.ones((1, 5000), np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.0)
    ot.capture_step(lambda x: ag.mean(W * x), optimizer=opt)(x=np.ones((3, 5000), np.float32))
    np.testing.assert_allclose(opt.state()["moments"]["W"]["m"] / 0.1, np.full((1, 5000), 3 / 15000), rtol=1e-6)


def test_sum_and_mean_over_no_axes_reduce_nothing_as_numpy_does():
    W = ag.param(W0, name="W", trainable=False)
    traced = {}

    def fn(x):
        outs = {"s": ag.sum(W @ x, axis=()), "m": ag.mean(W @ x, axis=(), keepdims=True), "i": ag.sum(x, axis=[])}
        traced.update({k: v.shape for k, v in outs.items()})
        return outs

    out = ot.capture(fn)(x=X0)
    h = W0 @ X0
    for name, want in (("s", np.sum(h, axis=())), ("m", np.mean(h, axis=(), keepdims=True)),
                       ("i", np.sum(X0, axis=()))):
        assert out[name].shape == traced[name] == want.shape
        np.testing.assert_allclose(out[name], want, rtol=1e-6, atol=1e-6)
    # The gradient flows through unchanged: d/dW sum(sum(W @ x, axis=()) * p) = p @ x.T
    V = ag.param(W0, name="V")
    p = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    opt = gradient_probe([V])
    ot.capture_step(lambda x: ag.sum(ag.sum(V @ x, axis=()) * p), optimizer=opt)(x=X0)
    np.testing.assert_allclose(probed_grads(opt)[0], p @ X0.T, rtol=1e-4, atol=1e-5)


def test_dropout_masks_are_redrawn_scaled_and_seeded():
    def run():
        W = ag.param(np.ones((1, 200), np.float32), name="W")
        step = ot.capture_step(lambda x: {"loss": ag.mean(ag.dropout(W * x, 0.25)), "d": ag.dropout(x, 0.25)},
                               optimizer=ot.optim.Adam([W], lr=0.0))
        outs = [step(x=np.ones((1, 200), np.float32))["d"] for _ in range(2)]
        step.free()
        return outs

    ot.set_seed(3)
    a1, a2 = run()
    ot.set_seed(3)
    b1, b2 = run()
    assert set(np.unique(a1)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.1 < (a1 == 0).mean() < 0.4
    assert not np.array_equal(a1, a2)
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)


# -- trace-time checks -------------------------------------------------------------------------------
A = ag.param(np.zeros((2, 3), np.float32), name="A", trainable=False)


@pytest.mark.parametrize("call, message", [
    (lambda: A @ A, r"matmul: shapes \(2, 3\) and \(2, 3\) do not chain: the last dimension of the first \(3\) "
                    r"must equal the second-to-last dimension of the second \(2\)"),
    (lambda: A + np.ones((4,)), r"add: shapes \(2, 3\) and \(4,\) do not broadcast"),
    (lambda: ag.reshape(A, (4, -1)), r"reshape: cannot reshape \(2, 3\) \(6 elements\) into \(4, -1\)"),
    (lambda: ag.reshape(A, (5,)), r"reshape: cannot reshape \(2, 3\) \(6 elements\) into \(5,\)"),
    (lambda: ag.concat([A, ag.transpose(A)], axis=0), r"concat: shapes \(2, 3\) and \(3, 2\)"),
    (lambda: ag.softmax(A, axis=2), r"softmax: axis 2 is out of range for a tensor of 2 dimensions"),
    (lambda: ag.transpose(A, (0, 0)), r"transpose: perm \(0, 0\) is not a permutation"),
    (lambda: ag.mse_loss(A, np.zeros((3, 2))), r"mse_loss: input shape \(2, 3\) and target shape \(3, 2\) differ"),
    (lambda: ag.get_rows(A, [0, 2]), r"get_rows: indices must lie in \[-2, 1\] for a table of 2 rows"),
    (lambda: ag.get_rows(A, np.array([0.5])), r"get_rows: idx expected integer indices"),
    (lambda: ag.softmax_cross_entropy_loss(A, np.array([0, 1, 2])),
     r"integer class labels expected shape \(2,\) for input \(2, 3\), received \(3,\)"),
    (lambda: ag.linear(A, np.zeros((4, 2), np.float32)), r"linear: x of shape \(2, 3\) does not match weight"),
    (lambda: ag.dropout(A, 1.0), r"dropout: rate expected a number in \[0, 1\)"),
])
def test_shape_errors_name_the_op_and_shapes(call, message):
    with pytest.raises((ot.ShapeError, ot.OrtrainError), match=message):
        call()


def test_reading_a_value_while_tracing_is_refused():
    t = A @ np.ones((3, 1), np.float32)
    for read in (float, bool, np.asarray, lambda v: v.numpy()):
        # outside a capture too (it said "while a step is traced" where none was)
        with pytest.raises(ot.OrtrainError, match=r"Tensor\(matmul, shape=\(2, 1\), dtype=float32\) has no value: "
                                                  r"ag ops record a graph.*outside a capture, compute on "
                                                  r"param.numpy\(\) with numpy"):
            read(t)


def test_params_and_buffers_validate_their_input():
    with pytest.raises(ot.OrtrainError, match="name: expected a non-empty str not starting with 'ag/'"):
        ag.param(np.zeros(2), name="ag/x")
    with pytest.raises(ot.ShapeError, match="expected a numeric array castable to float32"):
        ag.param(np.array(["a"]), name="s")
    with pytest.raises(ot.ShapeError, match=r"ag.buffer\(array\): expected at least 1 dimension"):
        ag.buffer(np.float32(1))
    p = ag.param(np.arange(6, dtype=np.float64).reshape(2, 3), name="P")
    assert p.dtype == np.float32 and p.grad is None and p.trainable
    with pytest.raises(ot.ShapeError, match=r"P.assign\(value\): expected shape \(2, 3\), received \(3, 2\)"):
        p.assign(np.zeros((3, 2)))
    np.testing.assert_array_equal(p.numpy(), np.arange(6).reshape(2, 3))
    table = ag.buffer(np.zeros((4, 2)), name="T")
    assert table.capacity == 4 and not table.trainable and table.dtype == np.float32


def test_an_integer_input_to_a_float_op_names_the_input_and_the_cast():
    W = ag.param(np.ones((2, 3), np.float32), name="W")
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=ot.optim.Adam([W]))
    for ints in (np.int32, np.uint8, np.int64):
        with pytest.raises(ot.ShapeError, match=r"matmul: expected float32 tensors, received the input 'x', an integer "
                                                r"array of shape \(3, 4\) .*pass x= as float32, e.g. "
                                                r"x.astype\(np.float32\)"):
            step(x=np.ones((3, 4), ints), y=np.zeros((2, 4), np.float32))
    assert step(x=np.ones((3, 4), np.float32), y=np.zeros((2, 4), np.float32)) == pytest.approx(9.0)


def test_an_argument_named_as_a_gradient_is_refused_for_training():
    W = ag.param(np.ones((2, 3), np.float32), name="W")
    step = ot.capture_step(lambda x_grad: ag.sum(ag.matmul(W, x_grad)), optimizer=ot.optim.Adam([W]))
    with pytest.raises(ot.OrtrainError, match=r"argument 'x_grad': onnxruntime-training reserves names ending in "
                                              r"'_grad' .*; give fn's argument .* another name"):
        step(x_grad=np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(W.numpy(), np.ones((2, 3)))
    fwd = ot.capture(lambda x_grad: ag.sum(ag.matmul(W, x_grad)))   # a forward pass feeds it
    assert fwd(x_grad=np.ones((3, 4), np.float32)) == 24.0


@pytest.mark.parametrize("other", ["W_grad", "W_grad.accumulation.buffer", "lazy_reset_grad"])
def test_a_param_named_as_a_trained_params_gradient_is_refused_and_changes_nothing(other):
    W = ag.param(np.full((2, 3), 0.1, np.float32), name="W")
    B = ag.param(np.full((2, 3), 0.2, np.float32), name=other)
    opt = ot.optim.Adam([W, B], lr=0.01)
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x) + ag.matmul(B, x), y), optimizer=opt)
    reason = ("reserves this name for the input that resets the gradients" if other == "lazy_reset_grad" else
              r"names the (buffers of the )?gradient of the trained param 'W' .* would clash")
    with pytest.raises(ot.OrtrainError, match=rf"capture_step: param '{other}': onnxruntime-training {reason}"):
        step(x=np.ones((3, 4), np.float32), y=np.zeros((2, 4), np.float32))
    assert opt.step == 0 and not opt.state()["moments"]
    np.testing.assert_array_equal(W.numpy(), np.full((2, 3), 0.1, np.float32))
    np.testing.assert_array_equal(B.numpy(), np.full((2, 3), 0.2, np.float32))


def test_a_param_named_as_a_frozen_params_gradient_trains():
    # Only trained params have gradients, so 'W_grad' beside a frozen 'W' names nothing twice.
    x, y = np.ones((3, 4), np.float32), np.zeros((2, 4), np.float32)
    W = ag.param(np.full((2, 3), 0.1, np.float32), name="W", trainable=False)
    B = ag.param(np.full((2, 3), 0.2, np.float32), name="W_grad")
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x) + ag.matmul(B, x), y),
                           optimizer=ot.optim.Adam([B], lr=0.01))
    assert float(step(x=x, y=y)) == pytest.approx(0.9 ** 2, rel=1e-6)   # (0.1 + 0.2) * 3 per element
    np.testing.assert_allclose(B.numpy(), np.full((2, 3), 0.19), rtol=1e-6)  # Adam's first step is lr * sign
    np.testing.assert_array_equal(W.numpy(), np.full((2, 3), 0.1, np.float32))


@pytest.mark.parametrize("name", ["output/loss", "ag/const_0"])
def test_an_argument_named_as_a_generated_name_is_refused(name):
    W = ag.param(np.full((2, 3), 0.1, np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.01)
    feeds = {name: np.ones((3, 4), np.float32), "y": np.zeros((2, 4), np.float32)}
    step = ot.capture_step(lambda **k: ag.mse_loss(ag.matmul(W, k[name]), k["y"]), optimizer=opt)
    with pytest.raises(ot.OrtrainError, match=rf"capture_step: argument '{name}': names starting with 'ag/' or "
                                              r"'output/' are reserved .*give fn's argument .* another name"):
        step(**feeds)
    assert opt.step == 0
    np.testing.assert_array_equal(W.numpy(), np.full((2, 3), 0.1, np.float32))
    with pytest.raises(ot.OrtrainError, match=rf"argument '{name}': names starting with 'ag/' or 'output/'"):
        ot.capture(lambda **k: ag.matmul(W, k[name]))(**{name: feeds[name]})


def test_duplicate_names_in_one_step_are_refused():
    a, b = ag.param(np.ones(2), name="w"), ag.param(np.ones(2), name="w")
    with pytest.raises(ot.OrtrainError, match="params: two different params are named 'w'"):
        ot.optim.Adam([a, b])   # refused when the optimizer is made
    with pytest.raises(ot.OrtrainError, match="the name 'w' is used twice"):
        ot.capture_step(lambda x: ag.mean(a * x + b), optimizer=ot.optim.Adam([a]))(x=np.ones(2))
    c = ag.param(np.ones(2), name="x")
    with pytest.raises(ot.OrtrainError, match="the name 'x' is used twice"):
        ot.capture_step(lambda x: ag.mean(c * x), optimizer=ot.optim.Adam([c]))(x=np.ones(2))


# -- the tracer ---------------------------------------------------------------------------------------
def test_tracing_is_deterministic_and_drops_unused_nodes():
    W = ag.param(W0, name="W")

    def fn(x, unused):
        _ = ag.relu(x)   # never reaches an output
        return {"loss": ag.mean(ag.tanh(W @ x) * 2.0)}

    arrays = {"x": X0, "unused": np.zeros(3, np.float32)}
    t1, t2 = trace(fn, arrays, True, "t"), trace(fn, arrays, True, "t")
    assert t1.proto.SerializeToString() == t2.proto.SerializeToString()
    assert t1.used == ("x",) and [p.name for p in t1.params] == ["W"]
    ops = [n.op_type for n in t1.proto.graph.node]
    assert "Relu" not in ops and ops[-1] == "Identity"
    assert [n.name for n in t1.proto.graph.node][:2] == ["ag/MatMul_0", "ag/Tanh_0"]


def test_topological_order_is_iterative_and_puts_inputs_first():
    W = ag.param(np.ones(3, np.float32), name="W")
    t = W
    for _ in range(5000):   # far deeper than Python's recursion limit
        t = t * 1.0 + 0.0
    order = topological_order([t])
    position = {id(n): i for i, n in enumerate(order)}
    assert all(position[id(i)] < position[id(n)] for n in order for i in n.inputs)
    assert order[0] is W and order[-1] is t
    diamond_a = W * 2.0
    out = diamond_a + ag.relu(diamond_a)
    order = topological_order([out])
    assert sum(n is diamond_a for n in order) == 1
    opt = gradient_probe([W])
    step = ot.capture_step(lambda x: ag.mean(ag.reshape(t, (3,)) * x), optimizer=opt)
    np.testing.assert_allclose(step(x=np.ones(3, np.float32)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probed_grads(opt)[0], np.full(W.shape, 1 / 3), rtol=1e-6)


def test_a_python_number_keeps_the_rank_numpy_gives_it():
    x = ag.buffer(np.arange(6, dtype=np.float32).reshape(2, 3))
    fwd = ot.capture(lambda i: {"total": ag.sum(ag.get_rows(x, i)) + 1.0,
                                "twice": ag.scale(ag.mean(ag.get_rows(x, i)), 2.0),
                                "row": ag.get_rows(x, 1)})
    out = fwd(i=np.array([0, 1], np.int64))
    assert {k: v.shape for k, v in out.items()} == {"total": (), "twice": (), "row": (3,)}
    np.testing.assert_allclose(out["total"], 16.0)
    np.testing.assert_allclose(out["twice"], 5.0)
    np.testing.assert_array_equal(out["row"], [3, 4, 5])
    with pytest.raises(ot.ShapeError, match="holds 9223372036854775808, beyond the range of int64"):
        ot.capture(lambda i: ag.add(i, 2 ** 63))(i=np.array([1], np.int64))


def test_bool_constants_are_integers_as_numpy_makes_them():
    x = ag.buffer(np.arange(6, dtype=np.float32).reshape(2, 3))
    out = ot.capture(lambda i: ag.get_rows(x, ag.add(i, True)))(i=np.array([0], np.int64))
    np.testing.assert_array_equal(out, [[3, 4, 5]])


def test_a_buffer_write_with_a_zero_slice_step_changes_nothing():
    buf = ag.buffer(np.zeros((4, 2), np.float32))
    with pytest.raises(ot.ShapeError, match="a slice step cannot be 0"):
        buf.write(slice(0, 4, 0), np.ones((4, 2), np.float32))
    np.testing.assert_array_equal(buf.numpy(), np.zeros((4, 2)))


def test_constant_labels_and_indices_are_checked_as_inputs_are():
    x = ag.buffer(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    for loss in (ag.softmax_cross_entropy_loss, ag.cross_entropy_loss):
        for labels in ([3, 3, 3, 3], [-1, 0, 0, 0]):
            with pytest.raises(ot.ShapeError, match=r"class labels must lie in \[0, 2\] for 3 classes"):
                ot.capture(lambda i, loss=loss, labels=labels: loss(ag.get_rows(x, i), np.array(labels)))(
                    i=np.arange(4))
    with pytest.raises(ot.ShapeError, match="received booleans"):
        ot.capture(lambda: ag.get_rows(x, [True, False, True, False]))()


# -- int arguments, constants, empty means, negative rows (gaps found against numpy and PyTorch) --------
NOT_INTS = r"give Python or numpy ints \(floats and bools are not read as integers\)"


@pytest.mark.parametrize("call, message", [
    (lambda: ag.reshape(A, 6.0), r"reshape: shape expected an int or a tuple of ints, received 6.0 \(float\); "
                                 + NOT_INTS),
    (lambda: ag.reshape(A, None), r"reshape: shape expected an int or a tuple of ints, received None"),
    (lambda: ag.sum(A, axis=1.0), r"sum: axis expected an int, a sequence of ints or None, received 1.0"),
    (lambda: ag.mean(A, axis=np.array(1.0)), r"mean: axis expected an int, a sequence of ints or None, received "
                                             r"array\(1\.\)"),
    (lambda: ag.sum(A, axis="a"), r"sum: axis expected an int, a sequence of ints or None, received 'a' \(str\)"),
    (lambda: ag.softmax(A, axis=(1,)), r"softmax: axis expected an int, received \(1,\)"),
    (lambda: ag.concat([A, A], axis=1.0), r"concat: axis expected an int, received 1.0"),
    # 1.5 was truncated to 1 and (True, False) read as (1, 0); numpy refuses both
    (lambda: ag.transpose(A, (1.5, 0)), r"transpose: perm expected a tuple of ints, received \(1.5, 0\) \(tuple\)"),
    (lambda: ag.transpose(A, (True, False)), r"transpose: perm expected a tuple of ints, received \(True, False\)"),
    (lambda: ag.transpose(A, "ab"), r"transpose: perm expected a tuple of ints, received 'ab'"),
    (lambda: ag.transpose(A, 0, 1, perm=(1, 0)), r"transpose: the dimensions were given twice"),
    (lambda: ag.softmax(A, 1, dim=0), r"softmax: axis=1 and dim=0 name one setting; pass one of them"),
    # an axis given as its default was taken for no axis, and the dim won silently
    (lambda: ag.concat([A, A], axis=0, dim=1), r"concat: axis=0 and dim=1 name one setting; pass one of them"),
    (lambda: ag.softmax(A, -1, dim=0), r"softmax: axis=-1 and dim=0 name one setting; pass one of them"),
    (lambda: ag.log_softmax(A, axis=-1, dim=0), r"log_softmax: axis=-1 and dim=0 name one setting"),
    # numpy's concatenate(axis=None) flattens: None is no default axis
    (lambda: ag.concat([A, A], axis=None), r"concat: axis expected an int, received None"),
    (lambda: ag.softmax(A, axis=None), r"softmax: axis expected an int, received None"),
    (lambda: ag.mean(A, keepdims=True, keepdim=False), r"mean: keepdims=True and keepdim=False name one setting"),
    (lambda: ag.dropout(A, 0.3, p=0.2), r"dropout: rate=0.3 and p=0.2 name one setting"),
    (lambda: ag.dropout(A, p=1.0), r"dropout: p expected a number in \[0, 1\), received 1.0"),
    (lambda: ag.sum(A, axis=(0, 1), dim=[0, 2]), r"sum: axis=\(0, 1\) and dim=\[0, 2\] name one setting"),
    (lambda: ag.sum(A, axis=np.array([0, 1]), dim=[1, 0]), r"sum: axis=array\(\[0, 1\]\) and dim=\[1, 0\] name one"),
    (lambda: A + [[1, 2], [3]], r"add: expected an array \(nested lists need rows of equal length\), received a list"),
    (lambda: ag.concat([A, [[1, 2], [3]]]), r"concat: expected an array \(nested lists need rows of equal length\)"),
    (lambda: ag.get_rows(A, [[0, 1], [0]]), r"get_rows: expected an array \(nested lists need rows of equal length\)"),
    (lambda: ag.scale(A, "2"), r"scale: s expected a number, received str"),
    (lambda: ag.param([[1.0, 2.0], [3.0]]), r"ag.param\(array\): expected an array \(nested lists need rows"),
    (lambda: ot.capture(lambda x: x)(x=[[1.0, 2.0], [3.0]]),
     r"capture: input 'x': expected an array \(nested lists need rows of equal length\)"),
    (lambda: ag.buffer(np.zeros((3, 2))).write(0, [[1.0, 2.0], [3.0]]),
     r"write\(values\): expected an array \(nested lists need rows of equal length\)"),
    (lambda: ag.buffer(np.zeros((3, 2))).write([[0, 1], [2]], np.zeros((3, 2))),
     r"write\(rows\): expected an array \(nested lists need rows of equal length\)"),
])
def test_odd_arguments_get_messages_instead_of_python_errors(call, message):
    with pytest.raises(ot.OrtrainError, match=message):
        call()


def test_integer_like_axes_shapes_and_rows_are_taken_as_numpy_takes_them():
    T = ag.param(W0, name="T", trainable=False)
    f = ot.capture(lambda x: {"s": ag.sum(x, axis=np.array(1)), "m": ag.mean(x, axis=(np.int64(0), np.array(1))),
                              "p": ag.softmax(x, axis=np.array(0)), "c": ag.concat([x, x], axis=np.array(-1)),
                              "r": ag.reshape(x, (np.array(2), np.int32(-1))), "t": ag.transpose(x, np.array([1, 0])),
                              "g": ag.get_rows(T, np.array(1))})
    out = f(x=X0)
    e = np.exp(X0 - X0.max(0))
    np.testing.assert_allclose(out["s"], np.sum(X0, axis=np.array(1)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["m"], np.mean(X0, axis=(np.int64(0), np.array(1))), rtol=1e-5)
    np.testing.assert_allclose(out["p"], e / e.sum(0), rtol=1e-6)
    np.testing.assert_array_equal(out["c"], np.concatenate([X0, X0], axis=np.array(-1)))
    np.testing.assert_array_equal(out["r"], np.reshape(X0, (np.array(2), np.int32(-1))))
    np.testing.assert_array_equal(out["t"], np.transpose(X0, np.array([1, 0])))
    np.testing.assert_array_equal(out["g"], W0[np.array(1)])
    buf = ag.buffer(np.zeros((3, 2), np.float32))
    buf.write(np.array(1), np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(buf.numpy(), [[0, 0], [1, 1], [1, 1]])


def test_mean_over_an_empty_axis_is_nan_as_in_numpy_and_pytorch():
    torch = torch_or_skip()
    empty = np.zeros((0, 3), np.float32)
    with pytest.warns(RuntimeWarning) as caught:
        out = ot.capture(lambda x: {"a0": ag.mean(x, axis=0), "all": ag.mean(x), "a1": ag.mean(x, axis=1),
                                    "keep": ag.mean(x, axis=0, keepdims=True)})(x=empty)
    assert [str(w.message).split(";")[0] for w in caught] == [
        "mean: axes (0,) of a tensor of shape (0, 3) hold no elements", "mean: axes (0, 1) of a tensor of shape (0, 3) "
        "hold no elements", "mean: axes (0,) of a tensor of shape (0, 3) hold no elements"]   # none for axis 1
    t = torch.from_numpy(empty)
    kwargs = {"a0": {"axis": 0}, "all": {}, "a1": {"axis": 1}, "keep": {"axis": 0, "keepdims": True}}
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        want = {name: np.mean(empty, **kw) for name, kw in kwargs.items()}
    for name, kw in kwargs.items():
        ref = t.mean(kw["axis"], keepdim=kw.get("keepdims", False)) if kw else t.mean()
        np.testing.assert_array_equal(ref.numpy(), want[name])   # PyTorch agrees with numpy
        assert out[name].shape == want[name].shape and out[name].dtype == np.float32
        np.testing.assert_array_equal(out[name], want[name])     # NaN where numpy has NaN (equal_nan)
    assert np.isnan(out["all"]) and np.isnan(out["a0"]).all() and out["a1"].shape == (0,)


def test_a_loss_over_no_elements_is_nan_as_in_pytorch():
    # the runtime's mean over nothing is 0, so these losses read 0 where PyTorch's are NaN
    torch = torch_or_skip()
    import torch.nn.functional as F
    e = ag.param(np.ones((0, 3), np.float32), name="e", trainable=False)
    labels = ag.param(np.zeros((0,), np.int64), name="labels", trainable=False)
    w = ag.param(np.full((2, 2), 0.5, np.float32), name="w")
    losses = {"mse": lambda: ag.mse_loss(e, e), "huber": lambda: ag.huber_loss(e, e),
              "bce": lambda: ag.bce_with_logits_loss(e, e), "sce": lambda: ag.softmax_cross_entropy_loss(e, e),
              "sce_labels": lambda: ag.softmax_cross_entropy_loss(e, labels),
              "ce": lambda: ag.cross_entropy_loss(e, e)}
    with pytest.warns(RuntimeWarning, match="holds no (elements|samples); the loss, their mean, is NaN") as caught:
        out = ot.capture(lambda: {k: f() for k, f in losses.items()} | {"with_w": ag.mse_loss(e, e) + ag.sum(w * w)})()
    assert len(caught) == len(losses) + 1
    t, tl = torch.ones(0, 3), torch.zeros(0, dtype=torch.int64)
    want = {"mse": F.mse_loss(t, t), "huber": F.huber_loss(t, t), "bce": F.binary_cross_entropy_with_logits(t, t),
            "sce": F.cross_entropy(t, t), "sce_labels": F.cross_entropy(t, tl), "ce": F.nll_loss(t, tl)}
    for name, ref in want.items():
        assert np.isnan(ref.item()) and np.isnan(out[name]) and out[name].dtype == np.float32, name
    assert np.isnan(out["with_w"])
    # rows of no classes hold samples but no class to take: refused, as a softmax over nothing
    no_classes = ag.param(np.ones((3, 0), np.float32), name="no_classes", trainable=False)
    for loss in (ag.softmax_cross_entropy_loss, ag.cross_entropy_loss):
        with pytest.raises(ot.ShapeError, match=r"input expected shape \(batch, classes\) with at least one class, "
                           r"received \(3, 0\)"):
            ot.capture(lambda loss=loss: loss(no_classes, no_classes))()


def test_an_empty_param_reshaped_with_a_free_axis_and_an_int_past_int64():
    # reshape((0, 3) -> (3, -1)) traced to a Reshape whose 0 the runtime read as "keep that axis" (a raw
    # run-time error); P * 2**70 said "received int of dtype object"
    e = ag.param(np.ones((0, 3), np.float32), name="e", trainable=False)
    got = ot.capture(lambda: ag.reshape(e, (3, -1)))()
    assert got.shape == np.ones((0, 3)).reshape(3, -1).shape == (3, 0) and got.dtype == np.float32
    p = ag.param(np.ones(3, np.float32), name="p")
    with pytest.raises(ot.ShapeError, match=r"mul: the constant 1180591620717411303424 lies beyond int64; write it "
                                            r"as a float \(1.18059e\+21\)"):
        ot.capture(lambda: p * 2 ** 70)()
    np.testing.assert_array_equal(ot.capture(lambda: p * 2.0 ** 70)(), np.full(3, 2.0 ** 70, np.float32))


def test_numpy_ufuncs_on_a_tensor_keep_its_operators_and_name_the_ag_op_for_the_rest():
    # np.exp(t) raised numpy's bare TypeError ("operand 'Tensor' does not support ufuncs")
    p = ag.param(np.arange(1, 4, dtype=np.float32), name="p")
    a = np.array([1.0, 2.0, 3.0], np.float32)
    out = ot.capture(lambda: {"mul": a * p, "sub": a - p, "div": np.float32(2) / p, "pow": a ** p, "add": 1.5 + p,
                              "matmul": np.eye(3, dtype=np.float32) @ p, "neg": np.negative(p), "abs": np.abs(p)})()
    v = np.arange(1, 4, dtype=np.float32)
    for name, want in {"mul": a * v, "sub": a - v, "div": 2 / v, "pow": a ** v, "add": 1.5 + v, "matmul": v,
                       "neg": -v, "abs": v}.items():
        np.testing.assert_allclose(out[name], want, rtol=1e-6, err_msg=name)
    for call, hint in ((lambda: np.exp(p), r"np.exp on an ag tensor: .* write it with ag.exp\(...\)"),
                       (lambda: np.sqrt(p), r"write it with ag.sqrt"), (lambda: np.add.reduce(p), r"np.add.reduce .*ag.sum"),
                       (lambda: np.maximum(p, a), r"np.maximum on an ag tensor: .*the ag ops \(ot.ag\)"),
                       (lambda: a > p, r"< on an ag tensor: ag records no comparisons"),
                       (lambda: a == p, r"== on an ag tensor: ag records no comparisons"),
                       (lambda: np.float64(0) != p, r"!= on an ag tensor"),
                       (lambda: np.divide(p, 2, out=np.zeros(3)), r"np.divide on an ag tensor: .*ag.div\(...\)")):
        with pytest.raises(ot.OrtrainError, match=hint):
            ot.capture(call)()


def test_concat_casts_int_constants_as_the_binary_ops_do():
    cols = np.array([[1], [2], [3]])   # int64, as ag.add takes it beside a float32 tensor
    W = ag.param(W0, name="W", trainable=False)
    out = ot.capture(lambda x: {"c": ag.concat([x, cols, [[7], [8], [9]]], axis=1), "a": ag.add(x, cols),
                                "first": ag.concat([[[5, 6, 7, 8]], W, 0 * W])})(x=W0)
    np.testing.assert_array_equal(out["c"], np.concatenate([W0, cols, [[7], [8], [9]]], axis=1))
    np.testing.assert_array_equal(out["first"], np.concatenate([[[5, 6, 7, 8]], W0, 0 * W0]))
    assert out["c"].dtype == out["first"].dtype == out["a"].dtype == np.float32
    ints = ag.buffer(np.arange(6).reshape(3, 2))
    with pytest.raises(ot.ShapeError, match="has a fractional part but the other operand is int64"):
        ag.concat([ints, np.full((3, 1), 0.5)], axis=1)
    assert ag.add(ints, np.full((3, 1), 0.5)).dtype == np.float32  # arithmetic promotes, as PyTorch's


def test_get_rows_takes_negative_constant_indices_as_numpy_does():
    T = ag.param(W0, name="T")
    opt = gradient_probe([T])
    p = np.random.default_rng(8).standard_normal((4, 4)).astype(np.float32)
    step = ot.capture_step(lambda x: {"loss": ag.sum(ag.get_rows(T, [-1, 0, -3, -1]) * x),
                                      "last": ag.get_rows(T, -1), "rows": ag.get_rows(T, np.array([[-2], [2]]))},
                           optimizer=opt)
    out = step(x=p)
    np.testing.assert_array_equal(out["last"], W0[-1])
    np.testing.assert_array_equal(out["rows"], W0[np.array([[-2], [2]])])
    np.testing.assert_allclose(out["loss"], np.sum(W0[[-1, 0, -3, -1]] * p), rtol=1e-5)
    want = np.zeros_like(W0)
    np.add.at(want, [-1, 0, -3, -1], p)   # the gradient numpy's indexing implies
    np.testing.assert_allclose(probed_grads(opt)[0], want, rtol=1e-6)
    for bad in (-4, [0, 3], np.array([-5, 0])):
        with pytest.raises(ot.ShapeError, match=r"get_rows: indices must lie in \[-3, 2\] for a table of 3 rows"):
            ag.get_rows(T, bad)
    with pytest.raises(ot.ShapeError, match="received booleans"):
        ag.get_rows(T, np.array([True, False, True]))
    with pytest.raises(ot.ShapeError, match="received booleans"):
        ag.get_rows(T, True)


@pytest.mark.torch
def test_int64_operands_meeting_floats_are_computed_in_float32_as_pytorch_does():
    # int64 beside a float32 tensor, with a fractional constant, or divided were refused; PyTorch
    # promotes them to float32, as it does with any float constant (k * 2.0 stayed int64 here). Two int64
    # operands and int constants stay int64.
    torch = torch_or_skip()
    k = np.array([1, 2, 3])
    w0 = np.array([0.5, -1.0, 2.0], np.float32)
    cases = [lambda W, k: W * k, lambda W, k: W * (k / 2), lambda W, k: W * (k * 0.5),
             lambda W, k: (k + 1) * W - 0.5 * k, lambda W, k: W / k, lambda W, k: 3 / k * W,
             lambda W, k: W - (k - 2.25)]
    for fn in cases:
        W = ag.param(w0.copy(), name="W")
        opt = gradient_probe([W])
        out = ot.capture_step(lambda k, fn=fn, W=W: {"loss": ag.sum(fn(W, k))}, optimizer=opt)(k=k)
        Wt = torch.tensor(w0, requires_grad=True)
        want = fn(Wt, torch.tensor(k)).sum()
        want.backward()
        np.testing.assert_allclose(out["loss"], want.item(), rtol=1e-6)
        np.testing.assert_allclose(opt.state()["moments"]["W"]["m"], Wt.grad.numpy(), rtol=1e-6)
    ints = ag.buffer(np.arange(3))
    assert (ints + 1).dtype == (ints * np.int64(2)).dtype == (ints - ints).dtype == np.int64
    assert (ints / 1).dtype == (ints * 0.5).dtype == (ints + ag.param(w0)).dtype == np.float32
    for whole in (2.0, np.float32(3.0), 1e20):  # as torch.arange(3) * 2.0
        assert (ints * whole).dtype == (whole + ints).dtype == np.float32


def test_comparisons_and_integer_division_on_tensors_are_refused():
    # Python's == compared the objects: W * (k == 0) was W * False, zeros without a word
    W = ag.param(np.ones((2, 2), np.float32), name="W")
    k = np.array([[0, 1], [1, 0]])
    for fn, op in ((lambda k: W * (k == 0), "=="), (lambda k: W * (0 != k), "!="), (lambda k: W * (k < 1), "<"),
                   (lambda k: W * (k >= 1), ">="), (lambda k: W * (k // 2), "//"), (lambda k: W * (k % 2), "%")):
        with pytest.raises(ot.OrtrainError, match=f"{op} on an ag tensor: ag records no comparisons"):
            ot.capture(fn)(k=k)
    mask = (k == 0).astype(np.float32)  # the way: the mask as an input
    np.testing.assert_array_equal(ot.capture(lambda m: W * m)(m=mask), mask)
    assert len({W, ag.param(np.ones(1, np.float32))}) == 2  # tensors stay hashable by identity


def test_negation_and_abs_of_int64_stay_int64_as_in_pytorch():
    # -k and abs(k) of int64 inputs were refused ("pass k= as float32")
    T = ag.param(np.arange(12, dtype=np.float32).reshape(6, 2), name="T")
    k = np.array([-1, 2, -3])
    out = ot.capture(lambda k: {"n": -k, "a": abs(k), "rows": ag.get_rows(T, abs(k))})(k=k)
    assert out["n"].dtype == out["a"].dtype == np.int64
    np.testing.assert_array_equal(out["n"], -k)
    np.testing.assert_array_equal(out["a"], np.abs(k))
    np.testing.assert_array_equal(out["rows"], np.arange(12, dtype=np.float32).reshape(6, 2)[np.abs(k)])


def test_a_0d_tensor_transposes_to_itself_and_is_refused_by_concat():
    # transpose gave onnx.helper's ValueError (an empty perm), concat an IndexError
    s = ag.param(np.float32(0.5), name="s")
    opt = gradient_probe([s])
    step = ot.capture_step(lambda: ag.transpose(s) * 3.0 + s.T, optimizer=opt)
    np.testing.assert_allclose(float(step()), 2.0)
    np.testing.assert_allclose(probed_grads(opt)[0], 4.0)
    with pytest.raises(ot.ShapeError, match=r"concat: expected tensors with at least one dimension, received 0-d "
                                            r"ones .*ag.reshape\(t, \(1,\)\)"):
        ot.capture_step(lambda: ag.sum(ag.concat([s, s])), optimizer=ot.optim.Adam([s]))()
    assert s.numpy() == np.float32(0.5)


def test_indexing_a_tensor_is_refused_with_the_ops_that_do_it():
    # "'Tensor' object is not subscriptable", with no word of get_rows or reshape
    w = ag.param(np.ones((3, 2), np.float32), name="w")
    for index in (lambda: w[0], lambda: w[:, 1]):
        with pytest.raises(ot.OrtrainError, match=r"ag records no indexing or slicing .*ag.get_rows\(t, idx\)"):
            ot.capture_step(lambda index=index: ag.sum(index()), optimizer=ot.optim.Adam([w]))()
    assert np.array_equal(w.numpy(), np.ones((3, 2), np.float32))


def test_integer_constants_in_a_matrix_product_are_float32_as_in_elementwise_ops():
    # W.T @ [1, 2, 3] and np.eye(3, dtype=int) @ W were refused ("matmul: expected float32 tensors,
    # received int64"), where W * [1, 2, 3] takes the constant as float32
    w0 = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    W = ag.param(w0.copy(), name="W")
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(ot.capture(lambda x: ag.sum(x) * (W @ [1, 2, 3]))(x=x), 3 * (w0 @ [1, 2, 3]),
                               rtol=1e-6)
    np.testing.assert_allclose(ot.capture(lambda x: x @ (np.eye(3, dtype=int) @ W.T))(x=x), x @ w0.T, rtol=1e-6)
    np.testing.assert_allclose(ot.capture(lambda x: ag.linear(x, W, [1, 2]))(x=x), x @ w0.T + [1, 2], rtol=1e-6)
    # one SGD-like Adam step: the first update is -lr * sign(gradient), the gradient 2 (W c - y) c^T / 2
    opt = ot.optim.Adam([W], lr=0.1)
    c, y = np.array([1, 0, 2]), np.zeros(2, np.float32)
    step = ot.capture_step(lambda y: ag.mse_loss(W @ c.tolist(), y), optimizer=opt)
    assert float(step(y=y)) == pytest.approx(np.mean((w0 @ c) ** 2), rel=1e-6)
    grad = np.outer(w0 @ c - y, c)
    np.testing.assert_allclose(W.numpy(), w0 - 0.1 * np.sign(grad), atol=1e-6)
    # an integer input (not a constant) stays refused, naming it and its shape as given (the
    # message named matmul and the transposed shape (3, 2))
    with pytest.raises(ot.ShapeError, match=r"^linear: expected float32 tensors, received the input 'k', an integer "
                                            r"array of shape \(2, 3\) .* pass k= as float32"):
        ot.capture(lambda x, k: ag.linear(x, k))(x=x, k=np.ones((2, 3), np.int64))


def test_an_axis_of_a_0d_tensor_is_refused_clearly():
    # softmax(axis=0) of a 0-d tensor reached onnxruntime's shape inference error; transpose(t, 0, 0)
    # raised a bare IndexError
    s = np.array(2.0, np.float32)
    for fn, name, axis in ((lambda x: ag.softmax(x, axis=0), "softmax", 0),
                           (lambda x: ag.log_softmax(x, dim=0), "log_softmax", 0),
                           (lambda x: ag.transpose(x, 0, 0), "transpose", 0)):
        with pytest.raises(ot.ShapeError, match=rf"{name}: a 0-d tensor has no axis {axis}; give it one first: "
                                                r"ag\.reshape\(t, \(1,\)\)"):
            ot.capture(fn)(x=s)
    assert float(ot.capture(lambda x: ag.transpose(x))(x=s)) == 2.0  # no axes to reverse, as numpy
