"""``Einsum``, which onnxruntime-training 1.19.2 cannot differentiate, trains: the training graphs
hold it as transposes, sums and matrix products (``ortrain.graph.tensor_forms``); the exported
model keeps it. References: numpy (the gradient by ``np.einsum``) and PyTorch's autograd."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _onnx_helpers import f32, vi
from _onnx_helpers import model as _model
from conftest import torch_or_skip
from onnx import helper, numpy_helper

import ortrain as ot

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript", "ignore:The feature will be removed")


def _einsum_model(equation: str, x_shape, weights: dict, y_shape):
    node = helper.make_node("Einsum", ["x", *weights], ["y"], name="contract", equation=equation)
    inits = [numpy_helper.from_array(w, name) for name, w in weights.items()]
    return _model([node], [vi("x", [None, *x_shape[1:]])], [vi("y", [None, *y_shape[1:]])], inits)


def test_a_batched_product_trains_against_a_numpy_gradient(rng, tmp_path):
    x, w = f32(rng, 3, 4, 5), f32(rng, 5, 6)
    y = f32(rng, 3, 4, 6)
    proto = _einsum_model("bij,jk->bik", x.shape, {"w": w}, y.shape)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=3) as tr:
        loss = tr.step(x, y)
        trained = tr.model()
    pred = np.einsum("bij,jk->bik", x, w)
    np.testing.assert_allclose(loss, np.mean((pred - y) ** 2), rtol=1e-6)
    grad = np.einsum("bij,bik->jk", x, 2 * (pred - y) / pred.size)
    np.testing.assert_allclose(trained.get_weights()[0], w - 0.1 * grad, rtol=1e-5, atol=1e-7)
    trained.export_onnx(tmp_path / "m.onnx")
    assert "Einsum" in {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {"x": x})[0], trained.predict(x), rtol=1e-5, atol=1e-6)


EQUATIONS = [  # equation, x's shape, the weights' shapes
    ("bhqd,bhkd->bhqk", (2, 3, 4, 5), [(2, 3, 6, 5)]),
    ("bnd,de->bne", (2, 4, 5), [(5, 3)]),
    ("bi,i->b", (3, 4), [(4,)]),
    ("bi,j->bij", (3, 4), [(5,)]),
    ("bij,ij->b", (3, 4, 5), [(4, 5)]),
    ("b...d,de->b...e", (2, 3, 4, 5), [(5, 6)]),
    ("bij,jk", (3, 4, 5), [(5, 6)]),
    ("bcd,dce->be", (2, 3, 4), [(4, 3, 5)]),
    ("bxy,zy->bzx", (2, 3, 4), [(5, 4)]),
    ("abcd,cde->abe", (2, 3, 4, 5), [(4, 5, 6)]),
    ("bi,ki,k->bk", (3, 4), [(5, 4), (5,)]),
]


@pytest.mark.torch
@pytest.mark.parametrize("equation, x_shape, w_shapes", EQUATIONS, ids=[e[0] for e in EQUATIONS])
def test_einsum_trains_as_pytorch_autograd(rng, equation, x_shape, w_shapes):
    torch = torch_or_skip()
    x = f32(rng, *x_shape)
    weights = {f"w{k}": f32(rng, *s) for k, s in enumerate(w_shapes)}
    params = [torch.tensor(w, requires_grad=True) for w in weights.values()]
    pred = torch.einsum(equation, torch.tensor(x), *params)
    y = f32(rng, *pred.shape)
    torch.nn.functional.mse_loss(pred, torch.tensor(y)).backward()
    model = ot.from_onnx(_einsum_model(equation, x_shape, weights, pred.shape)).compile(
        optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=x_shape[0]) as tr:
        loss = tr.step(x, y)
        got = dict(zip(model.weight_names(), tr.model().get_weights(), strict=True))
    np.testing.assert_allclose(loss, torch.nn.functional.mse_loss(pred, torch.tensor(y)).item(), rtol=1e-5)
    for (name, w), p in zip(weights.items(), params):
        np.testing.assert_allclose(got[name], w - 0.1 * p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True])
def test_an_attention_written_with_einsum_trains_as_in_pytorch(dynamo):
    torch = torch_or_skip()
    torch.manual_seed(0)

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

        def forward(self, x):
            q, k, v = self.qkv(x).reshape(x.shape[0], 5, 3, 2, 4).unbind(2)
            weights = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / 2.0, dim=-1)
            return self.out(torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(x.shape[0], 5, 8))

    net = Attention()
    f = io.BytesIO()
    kwargs = {} if dynamo else {"dynamic_axes": {"x": {0: "n"}}}
    torch.onnx.export(net, (torch.zeros(3, 5, 8),), f, dynamo=dynamo, input_names=["x"], **kwargs)
    rng = np.random.default_rng(4)
    batches = [(f32(rng, 3, 5, 8), f32(rng, 3, 5, 8)) for _ in range(3)]
    model = ot.from_onnx(onnx.load_from_string(f.getvalue())).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=3) as tr:
        got = [tr.step(x, y) for x, y in batches]
        weights = dict(zip(model.weight_names(), tr.model().get_weights(), strict=True))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    want = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name, value in net.state_dict().items():
        if name in weights:
            np.testing.assert_allclose(weights[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_diagonal_is_refused_by_name(rng):
    proto = _einsum_model("bii->bi", (2, 3, 3), {}, (2, 3))
    proto.graph.node.insert(0, helper.make_node("Mul", ["x0", "s"], ["x"]))
    proto.graph.input[0].name = "x0"
    proto.graph.initializer.append(numpy_helper.from_array(f32(rng, 3), "s"))
    model = ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"Einsum node 'contract' \(equation 'bii->bi'\): a label repeats"):
        ot.Trainer(model, batch_size=2)


def test_a_summed_label_broadcast_from_size_one_trains_against_numpy(rng):
    """``"bj,jk->bk"`` with ``x`` of shape ``(b, 1)``: ``x`` is broadcast along ``j`` (numpy, torch and
    onnxruntime take it), so ``y = x * w.sum(0)`` and every row of ``w`` gets the same gradient."""
    x, w, y = f32(rng, 3, 1), f32(rng, 4, 6), f32(rng, 3, 6)
    model = ot.from_onnx(_einsum_model("bj,jk->bk", x.shape, {"w": w}, y.shape)).compile(
        optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=3) as tr:
        loss = tr.step(x, y)
        w1 = tr.model().get_weights()[0]
    pred = np.einsum("bj,jk->bk", np.broadcast_to(x, (3, 4)), w)
    np.testing.assert_allclose(loss, np.mean((pred - y) ** 2), rtol=1e-6)
    grad = np.broadcast_to(x.T @ (2 * (pred - y) / pred.size), w.shape)
    np.testing.assert_allclose(w1, w - 0.1 * grad, rtol=1e-5, atol=1e-7)
