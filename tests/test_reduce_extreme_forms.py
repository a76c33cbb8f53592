"""``ReduceMax`` and ``ReduceMin``, which onnxruntime-training 1.19.2 cannot differentiate, train:
the training graphs hold them as a ``TopK`` of one element (``ortrain.graph.tensor_forms``), and the
exported model keeps them. References: numpy gradients written here, and PyTorch (both exporters)."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _onnx_helpers import f32, vi
from _onnx_helpers import model as _model
from conftest import torch_or_skip
from helpers import torch_steps
from onnx import helper, numpy_helper

import ortrain as ot

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript", "ignore:The feature will be removed")


def _extreme_model(rng, op, axes, keepdims, out_shape, opset=18):
    """x (n, 3, 4, 5) -> (x * w) -> op over ``axes``; w (3, 1, 1) a per-channel weight."""
    w = numpy_helper.from_array(f32(rng, 3, 1, 1), "w")
    inits, inputs = [w], ["h"]
    attrs = {"keepdims": keepdims}
    if axes is not None and opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    elif axes is not None:
        attrs["axes"] = axes
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node(op, inputs, ["y"], name="extreme", **attrs)]
    return _model(nodes, [vi("x", [None, 3, 4, 5])], [vi("y", out_shape)], inits, opset=opset)


@pytest.mark.parametrize("op, axes, keepdims, opset", [
    ("ReduceMax", [2, 3], 0, 18), ("ReduceMin", [1], 1, 18), ("ReduceMax", [-1], 1, 17), ("ReduceMin", None, 0, 18),
    ("ReduceMax", [1, 3], 1, 13)])
def test_an_extreme_trains_against_a_numpy_gradient(rng, op, axes, keepdims, opset):
    """One SGD step of mean squared error: the gradient reaches the extreme element only."""
    x = f32(rng, 2, 3, 4, 5)
    reduced = tuple(range(4)) if axes is None else tuple(a % 4 for a in axes)
    h_shape = (2, 3, 4, 5)
    out = np.max if op == "ReduceMax" else np.min
    probe = out(np.zeros(h_shape), axis=reduced, keepdims=bool(keepdims))
    proto = _extreme_model(rng, op, axes, keepdims, list(probe.shape) if probe.ndim else [], opset)
    w0 = numpy_helper.to_array(proto.graph.initializer[0]).copy()
    h = x * w0
    pred = out(h, axis=reduced, keepdims=bool(keepdims))
    y = f32(rng, *pred.shape) if pred.ndim else np.float32(0.5)
    if axes is None:  # a scalar output: no batch to split, so only the loss and the export are checked
        model = ot.from_onnx(proto)
        np.testing.assert_allclose(model.predict(x), pred, rtol=1e-6)
        return
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:
        loss = tr.step(x, y)
        w1 = tr.model().get_weights()[0]
    np.testing.assert_allclose(loss, np.mean((pred - y) ** 2), rtol=1e-6)
    # d loss / d h: the output's gradient at the (first) extreme element of each reduction
    dpred = np.broadcast_to(2 * (pred - y) / pred.size if keepdims else
                            np.expand_dims(2 * (pred - y) / pred.size, reduced), h.shape)
    moved = np.moveaxis(h, reduced, range(4 - len(reduced), 4)).reshape(*[h_shape[a] for a in range(4)
                                                                           if a not in reduced], -1)
    first = (moved.argmax(-1) if op == "ReduceMax" else moved.argmin(-1))
    mask = np.zeros_like(moved)
    np.put_along_axis(mask, first[..., None], 1.0, axis=-1)
    mask = np.moveaxis(mask.reshape(*[h_shape[a] for a in range(4) if a not in reduced],
                                    *[h_shape[a] for a in reduced]), range(4 - len(reduced), 4), reduced)
    dw = (dpred * mask * x).sum(axis=(0, 2, 3)).reshape(3, 1, 1)
    np.testing.assert_allclose(w1, w0 - 0.5 * dw, rtol=1e-5, atol=1e-7)


def test_the_exported_model_keeps_the_reduction(tmp_path, rng):
    proto = _extreme_model(rng, "ReduceMax", [2, 3], 0, [None, 3])
    model = ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    x = f32(rng, 2, 3, 4, 5)
    model.fit(x, f32(rng, 2, 3), batch_size=2, epochs=1, verbose=0)
    model.export_onnx(tmp_path / "m.onnx")
    assert "ReduceMax" in {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {"x": x})[0], model.predict(x), rtol=1e-6)


def test_axes_computed_in_the_graph_are_refused_by_name(rng):
    w = numpy_helper.from_array(f32(rng, 3, 1, 1), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["axes"]),  # [3]
             helper.make_node("ReduceMax", ["h", "axes"], ["y"], name="extreme", keepdims=0)]
    inits = [w, numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    proto = _model(nodes, [vi("x", [None, 3, 4, 5])], [vi("y", [None, 3, 4])], inits, opset=18)  # axes [3]: the size 3
    with pytest.raises(ot.UnsupportedOpError, match=r"ReduceMax node 'extreme': its axes are computed in the graph"):
        ot.Trainer(ot.from_onnx(proto).compile(optimizer="sgd", loss="mse"), batch_size=2)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo, optimize", [(False, None), (True, True), (True, False)])
def test_max_and_min_over_axes_train_as_in_pytorch(dynamo, optimize):
    """``max(dim)``, ``amax`` over two axes, ``min(dim).values``, ``amax(keepdim=True)`` of a 1-D
    convolution's output (max over time, as in text CNNs), then a linear layer: SGD steps."""
    torch = torch_or_skip()
    torch.manual_seed(0)

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.f = torch.nn.Conv1d(3, 4, 3), torch.nn.Linear(9, 2)

        def forward(self, x):
            h = self.c(x)
            return self.f(torch.cat([h.max(dim=2)[0], torch.amax(h, dim=(1, 2))[:, None], h.min(dim=1).values[:, :1],
                                     torch.amax(h, dim=1, keepdim=True)[:, 0, :3]], dim=1))

    net = Pooled()
    f = io.BytesIO()
    # without its optimizer the dynamo exporter writes the axes as Reshape(Constant, Constant)
    kwargs = {"optimize": optimize} if dynamo else {"dynamic_axes": {"x": {0: "n"}}}
    torch.onnx.export(net, (torch.zeros(4, 3, 9),), f, dynamo=dynamo, input_names=["x"], **kwargs)
    rng = np.random.default_rng(3)
    batches = [(f32(rng, 4, 3, 9), f32(rng, 4, 2)) for _ in range(3)]
    model = ot.from_onnx(onnx.load_from_string(f.getvalue())).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=4) as tr:
        got = [tr.step(x, y) for x, y in batches]
        weights = dict(zip(model.weight_names(), tr.model().get_weights(), strict=True))
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(weights[name], value.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("dtype, opset", [(onnx.TensorProto.UINT8, 18), (onnx.TensorProto.INT8, 18),
                                          (onnx.TensorProto.BOOL, 20), (onnx.TensorProto.INT32, 18)])
def test_an_extreme_of_a_mask_off_the_gradient_path_is_left_alone(dtype, opset):
    """``ReduceMax`` of an integer or boolean mask ("any positive in the row") carries no gradient and
    keeps its op: onnxruntime has no ``TopK`` for uint8, int8 or bool."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("Cast", ["positive"], ["mask"], to=dtype),
             helper.make_node("ReduceMax", ["mask", "axes"], ["any"], keepdims=1),
             helper.make_node("Cast", ["any"], ["any_float"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", ["h", "any_float"], ["y"])]
    inits = [numpy_helper.from_array(np.full((4, 3), 0.1, np.float32), "w"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    proto = _model(nodes, [vi("x", [None, 4])], [vi("y", [None, 3])], inits, opset=opset, ir=9)
    x = np.array([[1, -1, 2, 0], [-1, -2, -3, -4]], np.float32)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:
        loss = tr.step(x, np.zeros((2, 3), np.float32))
    np.testing.assert_allclose(loss, np.mean(np.array([0.2, 0.2, 0.2, 0, 0, 0]) ** 2), rtol=1e-6)


@pytest.mark.torch
def test_an_adaptive_max_pool_over_a_free_image_size_trains_as_in_pytorch(tmp_path):
    """``AdaptiveMaxPool2d(1)`` exported with free height and width is a ``GlobalMaxPool``, which
    onnxruntime-training cannot differentiate: it was refused ("replace the ops"); it trains as
    the ``ReduceMax`` it is, and the exported model keeps it."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(4, 2))
    f = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(2, 3, 6, 6),), f, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
    proto = onnx.load_from_string(f.getvalue())
    assert "GlobalMaxPool" in {n.op_type for n in proto.graph.node}
    rng = np.random.default_rng(4)
    batches = [(f32(rng, 4, 3, 7, 9), f32(rng, 4, 2)), (f32(rng, 4, 3, 5, 5), f32(rng, 4, 2))]
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    with ot.Trainer(model, batch_size=4) as tr:
        got = [tr.step(x, y) for x, y in batches]
        trained = tr.model()
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    weights = dict(zip(trained.weight_names(), trained.get_weights(), strict=True))
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(weights[name], value.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    trained.export_onnx(tmp_path / "m.onnx")
    assert "GlobalMaxPool" in {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    x = f32(rng, 3, 3, 8, 6)
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        np.testing.assert_allclose(served.run(None, {"x": x})[0], net(torch.from_numpy(x)).numpy(), rtol=1e-5,
                                   atol=1e-6)
