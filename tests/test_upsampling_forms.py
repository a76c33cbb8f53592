"""``ConvTranspose`` and ``Resize`` in imported models train on the CPU, where onnxruntime-training
has no gradient kernel for either: the training graphs hold a convolution over the zero-inserted
input and per-axis gathers instead (``ortrain.graph.upsampling_forms``). References: PyTorch
(losses and weights after SGD steps, both exporters), onnx's reference evaluator and onnxruntime
(the exported model keeps the original op)."""

from __future__ import annotations

import io
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _onnx_helpers import f32, vi
from _onnx_helpers import model as _model
from conftest import torch_or_skip
from helpers import torch_steps
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ortrain as ot

pytestmark = pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript", "ignore:The feature will be removed",
                                        "ignore:Converting a tensor to a Python boolean")

# name -> (layer, input shape); each follows a 1x1 convolution, so a gradient reaches its input
LAYERS = {
    "transpose k4 s2 p1": (lambda t: t.nn.ConvTranspose2d(3, 4, 4, stride=2, padding=1), (2, 3, 5, 6)),
    "transpose output_padding": (lambda t: t.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
                                 (2, 3, 5, 5)),
    "transpose k2 s2 (tiles)": (lambda t: t.nn.ConvTranspose2d(3, 4, 2, stride=2), (2, 3, 5, 6)),
    "transpose k3 s3 no bias": (lambda t: t.nn.ConvTranspose2d(3, 4, 3, stride=3, bias=False), (2, 3, 4, 2)),
    "transpose k4 s3 groups op2": (lambda t: t.nn.ConvTranspose2d(4, 6, 4, stride=3, padding=1, output_padding=2,
                                                                 groups=2), (2, 4, 3, 4)),
    "transpose k5 s2 p3 (phases, end cropped)": (lambda t: t.nn.ConvTranspose2d(3, 2, 5, stride=2, padding=3),
                                                 (2, 3, 4, 5)),
    "transpose 3-D": (lambda t: t.nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1), (2, 2, 3, 4, 3)),
    "transpose stride 1": (lambda t: t.nn.ConvTranspose2d(3, 4, 3), (2, 3, 5, 5)),
    "transpose groups dilation": (lambda t: t.nn.ConvTranspose2d(4, 6, 2, stride=3, groups=2, dilation=2), (2, 4, 4, 3)),
    "transpose padding past the kernel": (lambda t: t.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=3), (2, 3, 6, 6)),
    "transpose 1-D": (lambda t: t.nn.ConvTranspose1d(3, 4, 5, stride=2, padding=2, output_padding=1), (2, 3, 7)),
    "nearest x2": (lambda t: t.nn.Upsample(scale_factor=2, mode="nearest"), (2, 3, 4, 5)),
    "nearest x1.5": (lambda t: t.nn.Upsample(scale_factor=1.5, mode="nearest"), (2, 3, 4, 6)),
    "nearest to a size": (lambda t: t.nn.Upsample(size=(7, 11), mode="nearest"), (2, 3, 4, 5)),
    "bilinear": (lambda t: t.nn.Upsample(scale_factor=2, mode="bilinear"), (2, 3, 4, 5)),
    "bilinear align_corners": (lambda t: t.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
                               (2, 3, 4, 5)),
    "bilinear down": (lambda t: t.nn.Upsample(size=(3, 4), mode="bilinear"), (2, 3, 7, 9)),
    "bicubic": (lambda t: t.nn.Upsample(size=(7, 9), mode="bicubic"), (2, 3, 4, 5)),
    "linear 1-D": (lambda t: t.nn.Upsample(scale_factor=3, mode="linear"), (2, 3, 5)),
}


def _net(torch, name):
    layer, shape = LAYERS[name]
    conv = {3: torch.nn.Conv1d, 4: torch.nn.Conv2d, 5: torch.nn.Conv3d}[len(shape)](shape[1], shape[1], 1)
    return torch.nn.Sequential(conv, layer(torch)), shape


def _export(torch, net, shape, dynamo: bool, **kwargs) -> onnx.ModelProto:
    f = io.BytesIO()
    if dynamo:
        torch.onnx.export(net, (torch.zeros(*shape),), f, dynamo=True, input_names=["x"], output_names=["y"])
    else:
        torch.onnx.export(net, (torch.zeros(*shape),), f, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, **kwargs)
    return onnx.load_from_string(f.getvalue())


def _side_by_side(torch, net, proto, shape, steps=3, lr=0.1):
    """SGD steps in PyTorch and in ortrain on the same batches; returns the trained ortrain model."""
    rng = np.random.default_rng(1)
    with torch.no_grad():
        out_shape = net(torch.zeros(*shape)).shape
    batches = [(f32(rng, *shape), f32(rng, *out_shape)) for _ in range(steps)]
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=lr), loss="mse")
    with ot.Trainer(model, batch_size=shape[0]) as tr:
        got = [tr.step(x, y) for x, y in batches]
        trained = tr.model()
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=lr), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    weights = dict(zip(trained.weight_names(), trained.get_weights(), strict=True))
    reference = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    assert set(reference) <= set(weights)
    for name, value in reference.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=2e-7, err_msg=name)
    return trained, batches


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_upsampling_layers_train_as_in_pytorch(tmp_path, name):
    torch = torch_or_skip()
    torch.manual_seed(0)
    net, shape = _net(torch, name)
    trained, batches = _side_by_side(torch, net, _export(torch, net, shape, dynamo=False), shape)
    # predict runs the eval graph (which holds the training form); the exported model keeps the op
    x = batches[0][0]
    with torch.no_grad():
        np.testing.assert_allclose(trained.predict(x), net(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=2e-6)
    trained.export_onnx(tmp_path / "m.onnx")
    exported = onnx.load(str(tmp_path / "m.onnx"))
    op = "ConvTranspose" if name.startswith("transpose") else "Resize"
    assert op in {n.op_type for n in exported.graph.node}
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {served.get_inputs()[0].name: x})[0], trained.predict(x),
                               rtol=1e-5, atol=2e-6)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["transpose k4 s2 p1", "transpose groups dilation", "nearest x2", "bilinear", "bicubic"])
def test_upsampling_layers_of_the_dynamo_exporter_train_as_in_pytorch(name):
    torch = torch_or_skip()
    torch.manual_seed(0)
    net, shape = _net(torch, name)
    _side_by_side(torch, net, _export(torch, net, shape, dynamo=True), shape)


def _interpolating(torch, channels: int, **kwargs):
    """A 1x1 convolution, then ``torch.nn.functional.interpolate(..., **kwargs)``."""

    class Interpolating(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(channels, channels, 1)

        def forward(self, x):
            return torch.nn.functional.interpolate(self.c(x), **kwargs)

    return Interpolating()


@pytest.mark.torch
def test_an_antialiased_downsampling_trains_as_in_pytorch():
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = _interpolating(torch, 3, size=(3, 4), mode="bilinear", antialias=True)
    _side_by_side(torch, net, _export(torch, net, (2, 3, 7, 9), dynamo=True), (2, 3, 7, 9))


def _resize_model(rng, spatial, mode="nearest", **attrs):
    w = numpy_helper.from_array(f32(rng, 2, 2, 1, 1), "w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"]),
             helper.make_node("Resize", ["h", "", "scales"], ["y"], name="up", mode=mode, **attrs)]
    out = [None, 2] + [None if d is None or isinstance(d, str) else 2 * d for d in spatial]
    return _model(nodes, [vi("x", [None, 2, *spatial])], [vi("y", out)], [w, scales])


def test_a_resize_of_static_sizes_trains_against_a_numpy_gradient(rng):
    """Without PyTorch: nearest x2 of a 1x1 convolution; one SGD step of mean squared error,
    the gradient written here in numpy (each input cell feeds a 2x2 block of the output)."""
    proto = _resize_model(rng, [3, 4])
    w0 = numpy_helper.to_array(proto.graph.initializer[0]).copy()
    x, y = f32(rng, 2, 2, 3, 4), f32(rng, 2, 2, 6, 8)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:
        loss = tr.step(x, y)
        w1 = tr.model().get_weights()[0]
    h = np.einsum("oi,nihw->nohw", w0[:, :, 0, 0], x)
    pred = h.repeat(2, axis=2).repeat(2, axis=3)
    np.testing.assert_allclose(loss, np.mean((pred - y) ** 2), rtol=1e-6)
    dpred = 2 * (pred - y) / pred.size
    dh = dpred.reshape(2, 2, 3, 2, 4, 2).sum(axis=(3, 5))
    dw = np.einsum("nohw,nihw->oi", dh, x)
    np.testing.assert_allclose(w1[:, :, 0, 0], w0[:, :, 0, 0] - 0.5 * dw, rtol=1e-5, atol=1e-7)
    assert np.allclose(model.predict(x), ReferenceEvaluator(proto).run(None, {"x": x})[0], atol=1e-6)


def test_a_linear_resize_of_free_image_sizes_is_refused_by_name(rng):
    model = ot.from_onnx(_resize_model(rng, ["h", "w"], mode="linear")).compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"Resize node 'up': axis 2 of its input has no static size .*"
                                                    r"export the model with static image sizes"):
        ot.Trainer(model, batch_size=2)


@pytest.mark.parametrize("attrs", [{}, {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}])
def test_a_nearest_upsampling_of_free_image_sizes_trains_at_each_size(rng, attrs):
    """Repeating each pixel (a whole factor in nearest mode, with onnx's default rules or torch's)
    takes any image size: one SGD step at two sizes against the numpy gradient."""
    proto = _resize_model(rng, ["h", "w"], **attrs)
    w0 = numpy_helper.to_array(proto.graph.initializer[0]).copy()
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:
        w = w0
        for h, wd in ((3, 4), (5, 2)):
            x, y = f32(rng, 2, 2, h, wd), f32(rng, 2, 2, 2 * h, 2 * wd)
            pred = np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x).repeat(2, axis=2).repeat(2, axis=3)
            np.testing.assert_allclose(tr.step(x, y), np.mean((pred - y) ** 2), rtol=1e-6)
            dh = (2 * (pred - y) / pred.size).reshape(2, 2, h, 2, wd, 2).sum(axis=(3, 5))
            w = w - 0.5 * np.einsum("nohw,nihw->oi", dh, x)[:, :, None, None]
            np.testing.assert_allclose(tr.model().get_weights()[0], w, rtol=1e-5, atol=1e-7)


def test_a_transposed_convolution_sized_by_output_shape_is_refused_by_name(rng):
    w = numpy_helper.from_array(f32(rng, 1, 1, 2, 2), "W")
    node = helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="up", strides=[2, 2], output_shape=[7, 7])
    proto = _model([node], [vi("x", [None, 1, 3, 3])], [vi("y", [None, 1, 7, 7])], [w])
    model = ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"ConvTranspose node 'up': it is sized by auto_pad or "
                                                    r"output_shape.*explicit pads"):
        ot.Trainer(model, batch_size=2)


@pytest.mark.parametrize("strides, pads, output_padding", [
    ([2, 2], [1, 1, 1, 1], [1, 1]),  # one convolution per output phase
    ([2, 3], [0, 1, 2, 0], [1, 0]),  # phases, padding unequal at the two ends
    ([3, 2], [2, 0, 0, 5], [0, 1]),  # an end padding past kernel + output_padding: the zero-inserted input
])
def test_a_transposed_convolution_with_a_bias_trains_against_the_reference_evaluator(rng, strides, pads, output_padding):
    """Without PyTorch: a strided ConvTranspose gives onnx's reference evaluation before and after a
    step, its loss is the reference's, and the bias moves by exactly lr times the mean gradient."""
    w = numpy_helper.from_array(f32(rng, 2, 3, 3, 4), "W")
    b = numpy_helper.from_array(f32(rng, 3), "B")
    node = helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], name="up", strides=strides, pads=pads,
                            output_padding=output_padding)
    out = [(4 - 1) * s + k + op - p0 - p1 for s, k, op, p0, p1 in zip(strides, [3, 4], output_padding, pads[:2], pads[2:])]
    proto = _model([node], [vi("x", [None, 2, 4, 4])], [vi("y", [None, 3, *out])], [w, b])
    x = f32(rng, 2, 2, 4, 4)
    ref = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    y = np.zeros_like(ref)
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:
        np.testing.assert_allclose(tr.predict(x), ref, rtol=1e-5, atol=1e-6)
        loss = tr.step(x, y)
        trained = tr.model()
    weights = dict(zip(trained.weight_names(), trained.get_weights(), strict=True))
    np.testing.assert_allclose(loss, np.mean(ref ** 2), rtol=1e-5)
    db = (2 * ref / ref.size).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(weights["B"], numpy_helper.to_array(b) - 0.5 * db, rtol=1e-5, atol=1e-7)
    moved = helper.make_graph([node], "moved", [vi("x", [None, 2, 4, 4])], [vi("y", None)],
                              [numpy_helper.from_array(weights["W"], "W"), numpy_helper.from_array(weights["B"], "B")])
    after = ReferenceEvaluator(helper.make_model(moved, opset_imports=[helper.make_opsetid("", 17)])).run(None, {"x": x})[0]
    np.testing.assert_allclose(trained.predict(x), after, rtol=1e-5, atol=1e-6)


def test_resize_matrices_reproduce_onnxruntime(rng):
    """The matrix of each axis, applied in numpy, gives what onnxruntime gives for the whole node
    (cubic, with the border handling of exclude_outside; a scale that is not whole)."""
    from ortrain.engine import run_model
    from ortrain.graph.upsampling_forms import resize_matrix
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic", exclude_outside=1,
                            coordinate_transformation_mode="half_pixel")
    x = f32(rng, 1, 1, 5, 6)
    scales = np.array([1, 1, 1.6, 0.7], np.float32)
    want = run_model(_model([node], [vi("x", [1, 1, 5, 6]), vi("scales", [4])], [vi("y", None)]),
                     {"x": x, "scales": scales})[0]
    rows = resize_matrix(node, 17, 5, float(scales[2]), None, run_model)
    cols = resize_matrix(node, 17, 6, float(scales[3]), None, run_model)
    assert rows.shape == (8, 5) and cols.shape == (4, 6)
    np.testing.assert_allclose(rows @ x[0, 0].astype(np.float64) @ cols.T, want[0, 0], rtol=1e-5, atol=1e-6)


RUNTIME_CASES = [  # where onnx's reference evaluator and onnxruntime differ: the runtime (and PyTorch) rule
    ("align_corners, a scale times the size not whole", 7, 0.5,
     {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ("nearest, a float32 scale rounded", 9, 1 / 3,
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
]


@pytest.mark.parametrize("what, size, scale, attrs", RUNTIME_CASES, ids=[c[0] for c in RUNTIME_CASES])
def test_resize_matrices_follow_onnxruntime_where_the_reference_differs(rng, what, size, scale, attrs):
    from ortrain.engine import run_model
    from ortrain.graph.upsampling_forms import resize_matrix
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    x = f32(rng, 1, 1, 1, size)
    scales = np.array([1, 1, 1, scale], np.float32)
    proto = _model([node], [vi("x", [1, 1, 1, size]), vi("scales", [4])], [vi("y", None)])
    want = run_model(proto, {"x": x, "scales": scales})[0][0, 0, 0]
    matrix = resize_matrix(node, 17, size, float(scales[3]), None, run_model)
    np.testing.assert_allclose(matrix @ x[0, 0, 0], want, rtol=1e-6, atol=1e-7)
    reference = ReferenceEvaluator(proto).run(None, {"x": x, "scales": scales})[0][0, 0, 0]
    assert reference.shape != want.shape or not np.allclose(reference, want, atol=1e-4), \
        "the reference evaluator agrees with onnxruntime here now; pick a case where it does not"


@pytest.mark.torch
def test_an_align_corners_downsampling_by_a_scale_trains_as_in_pytorch():
    """``interpolate(scale_factor=0.5, align_corners=True)`` of 7 pixels: PyTorch and onnxruntime
    take pixels 0, 3 and 6."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = _interpolating(torch, 2, scale_factor=0.5, mode="bilinear", align_corners=True)
    _side_by_side(torch, net, _export(torch, net, (2, 2, 7, 7), dynamo=False), (2, 2, 7, 7))


def test_a_large_image_opens_in_seconds(rng):
    """The matrices come from onnxruntime in milliseconds (onnx's reference took minutes at 128)."""
    proto = _resize_model(rng, [128, 128], mode="linear")
    model = ot.from_onnx(proto).compile(optimizer="sgd", loss="mse")
    started = time.perf_counter()
    with ot.Trainer(model, batch_size=1):
        pass
    assert time.perf_counter() - started < 30


@pytest.mark.torch
def test_a_small_unet_trains_as_in_pytorch():
    """Encoder (convolution, batch norm, max pool), decoder (transposed convolution, skip
    connection by concatenation, bilinear upsampling): Adam steps against PyTorch."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    nn = torch.nn

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            # no bias before batch norm: its true gradient is 0, and Adam would scale rounding noise
            self.enc = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
            self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
            self.dec = nn.Conv2d(8, 4, 3, padding=1)
            self.head = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear"), nn.Conv2d(4, 1, 1))

        def forward(self, x):
            e = self.enc(x)
            d = torch.relu(self.dec(torch.cat([self.up(self.down(e)), e], dim=1)))
            return self.head(d)

    net, shape = UNet(), (3, 2, 8, 8)
    # exported as the README advises for training: batch norm kept, not folded into the convolution
    proto = _export(torch, net, shape, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                    do_constant_folding=False)
    rng = np.random.default_rng(2)
    batches = [(f32(rng, *shape), f32(rng, 3, 1, 16, 16)) for _ in range(3)]
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.Adam(lr=1e-2), loss="mse")
    with ot.Trainer(model, batch_size=3) as tr:
        got = [tr.step(x, y) for x, y in batches]
        weights = dict(zip(model.weight_names(), tr.model().get_weights(), strict=True))
    net.train()
    want = torch_steps(torch, net, torch.optim.Adam(net.parameters(), lr=1e-2), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name, value in net.state_dict().items():
        # the running variance is updated with the biased batch variance (docs/known-limits.md)
        if name in weights and name != "enc.1.running_var":
            np.testing.assert_allclose(weights[name], value.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    assert {"up.weight", "enc.1.running_mean"} <= set(weights)


def test_a_transposed_convolution_whose_output_padding_reaches_the_stride_is_refused_at_import(rng):
    """onnxruntime 1.19.2 leaves output cells of such a layer unset (PyTorch allows it where the
    dilation is larger): predictions and the exported model would be arbitrary."""
    w = numpy_helper.from_array(f32(rng, 2, 3, 2, 2), "W")
    node = helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="up", strides=[2, 2], dilations=[3, 3],
                            output_padding=[2, 2])
    proto = _model([node], [vi("x", [None, 2, 3, 3])], [vi("y", [None, 3, 10, 10])], [w])
    with pytest.raises(ot.UnsupportedOpError, match=r"ConvTranspose node 'up' has output_padding \[2, 2\] that "
                                                    r"reaches its strides \[2, 2\]"):
        ot.from_onnx(proto)


@pytest.mark.torch
def test_a_resize_after_a_group_norm_trains_as_in_pytorch():
    """torch writes GroupNorm as a Reshape back to ``Shape(x)``, after which onnx's plain shape
    inference loses the image size a matrix needs; inference that propagates values keeps it (a
    diffusion UNet's GroupNorm before its upsampling)."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    # without its affine, whose weights the exporter renames (onnx::Mul_27)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.GroupNorm(2, 4, affine=False),
                              torch.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.Conv2d(4, 1, 1))
    _side_by_side(torch, net, _export(torch, net, (2, 2, 5, 6), dynamo=False), (2, 2, 5, 6))


@pytest.mark.torch
def test_a_size_recomputed_from_the_input_names_the_export_option():
    # F.interpolate(recompute_scale_factor=True) writes its output size from the input's; the
    # refusal advised "a fixed scale factor", which the model had
    torch = torch_or_skip()

    class Up(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 2, 1)

        def forward(self, x):
            return torch.nn.functional.interpolate(self.c(x), scale_factor=1.5, mode="bilinear",
                                                   recompute_scale_factor=True)

    f = io.BytesIO()
    torch.onnx.export(Up(), (torch.zeros(2, 3, 6, 6),), f, dynamo=False, input_names=["x"])
    model = ot.from_onnx(onnx.load_from_string(f.getvalue())).compile(optimizer="sgd", loss="mse")
    with pytest.raises(ot.UnsupportedOpError, match=r"its scales or sizes are computed in the graph.*F.interpolate "
                                                    r"without recompute_scale_factor=True"):
        ot.Trainer(model, batch_size=2)


@pytest.mark.parametrize("op, opset, mode, scale", [
    ("Upsample", 9, "linear", 2.0), ("Upsample", 9, "linear", 1.5), ("Upsample", 7, "linear", 3.0),
    ("Upsample", 9, "nearest", 1.5), ("Resize", 10, "linear", 2.0), ("Resize", 10, "linear", 0.75),
    ("Resize", 10, "nearest", 1.5), ("Resize", 10, "nearest", 0.75), ("Resize", 10, "nearest", 0.6)])
def test_resizes_of_opsets_before_11_keep_their_sampling(tmp_path, op, opset, mode, scale):
    # onnx's converter kept only the mode: opset 11 read it as half_pixel, and a linear resize of a row
    # 0..3 by 2 gave 0 .25 .75 ... where onnxruntime computes 0 .5 1 ... on the file (38% off)
    w = numpy_helper.from_array(np.full((1, 2, 1, 1), 1.5, np.float32), "w")
    scales = [1.0, 1.0, scale, scale]
    if op == "Upsample" and opset < 9:
        node, inits = helper.make_node("Upsample", ["h"], ["y"], mode=mode, scales=scales), [w]
    else:
        node = helper.make_node(op, ["h", "scales"], ["y"], mode=mode)
        inits = [w, numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    proto = _model([helper.make_node("Mul", ["x", "w"], ["h"]), node], [vi("x", [None, 2, 5, 6])],
                   [vi("y", [None, 2, None, None])], inits, opset=opset)
    proto.ir_version = 6
    x = np.arange(2 * 2 * 5 * 6, dtype=np.float32).reshape(2, 2, 5, 6) % 7
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    model = ot.from_onnx(proto)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-6, atol=1e-5)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    with ot.Trainer(model, batch_size=2) as tr:  # the training graph's form of the resize samples alike
        y = np.zeros_like(want)
        np.testing.assert_allclose(tr.step(x, y), np.mean((want - y) ** 2), rtol=1e-5)
    model.export_onnx(tmp_path / "m.onnx")
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 9])
def test_old_resizes_whose_outputs_the_converter_renames_keep_their_sampling(opset):
    # an Upsample read by a later node: onnx's converter renames its output, and the sampling was looked up
    # by the old name, so a linear one sampled half_pixel (0 .25 .75 1.25 where onnxruntime gives 0 .5 1 1.5)
    def up(x, out, mode):
        if opset < 9:
            return [helper.make_node("Upsample", [x], [out], mode=mode, scales=[1.0, 1.0, 2.0, 2.0])]
        return [helper.make_node("Upsample", [x, "scales"], [out], mode=mode)]
    nodes = [*up("x", "u", "linear"), helper.make_node("Mul", ["u", "w"], ["h"]), *up("h", "v", "linear"),
             helper.make_node("Mul", ["v", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1.5], np.float32), "w")]
    if opset >= 9:
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    # then the first also an output: the converter keeps that name alone, and renames the second's
    for outputs in ([vi("y", [None, 1, 16, 16])], [vi("y", [None, 1, 16, 16]), vi("u", [None, 1, 8, 8])]):
        proto = _model(nodes, [vi("x", [None, 1, 4, 4])], outputs, inits, opset=opset)
        proto.ir_version = 6
        x = np.arange(32, dtype=np.float32).reshape(2, 1, 4, 4)
        want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        got = ot.from_onnx(proto).predict(x)
        for a, b in zip(got if isinstance(got, list) else [got], want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("scales, computed", [([1, 1, 3, 3], True), ([1, 1, 4, 2], True), ([1, 1, 4, 0.5], False),
                                              ([1, 1, 2.5, 0.6], False)])
def test_an_old_nearest_resize_whose_rounding_no_mode_states_keeps_the_converters_form(scales, computed):
    # scales computed in the graph, or enlarging one axis and shrinking another: onnxruntime rounds per
    # axis, which no opset-11 nearest_mode says; the asymmetric mapping alone was up to 6.0 off
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"])]
    if computed:
        nodes.append(helper.make_node("Identity", ["scales"], ["computed"]))
    nodes.append(helper.make_node("Resize", ["h", "computed" if computed else "scales"], ["y"], mode="nearest"))
    proto = _model(nodes, [vi("x", [None, 1, 5, 6])], [vi("y", [None, 1, None, None])],
                   [w, numpy_helper.from_array(np.array(scales, np.float32), "scales")], opset=10)
    proto.ir_version = 6
    x = np.arange(60, dtype=np.float32).reshape(2, 1, 5, 6)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ot.from_onnx(proto).predict(x), want)
