"""``ot.layers.Conv2DTranspose`` and ``ot.layers.UpSampling2D``: forward values and SGD steps
against PyTorch (``conv_transpose2d``, cropped as Keras' ``padding="same"`` crops; ``nn.Upsample``),
saving and export."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import torch_or_skip

import ortrain as ot

CASES = [  # kernel, strides, padding, output_padding, input height x width
    (3, 2, "valid", None, (5, 4)),
    (4, 2, "same", None, (5, 4)),
    (3, 2, "same", None, (5, 4)),
    (2, 3, "same", None, (3, 4)),  # a kernel shorter than the stride
    (2, 3, "valid", None, (3, 4)),  # ... extended with zeros
    ((3, 2), (2, 1), "valid", (1, 0), (4, 5)),
    (5, 2, "same", 1, (3, 3)),
    (4, 2, "same", 1, (3, 3)),
    (1, 3, "same", 2, (3, 3)),  # output padding past the crop
]


def _keras_length(n, k, s, padding, output_padding):
    """Keras' ``conv_utils.deconv_output_length``."""
    if output_padding is None:
        return n * s + max(k - s, 0) if padding == "valid" else n * s
    pad = 0 if padding == "valid" else k // 2
    return (n - 1) * s + k - 2 * pad + output_padding


def _torch_reference(torch, x, kernel, bias, strides, padding, output_padding):
    """Keras' (TensorFlow's) transposed convolution in PyTorch: the full (unpadded) output, cropped
    where the forward convolution of that padding would have padded (SAME: half the total at the
    start, the odd one at the end), or extended with zeros."""
    full = torch.nn.functional.conv_transpose2d(x, kernel, None, stride=strides)
    out = full
    for a in range(2):
        n, k, s = x.shape[2 + a], kernel.shape[2 + a], strides[a]
        size = _keras_length(n, k, s, padding, None if output_padding is None else output_padding[a])
        start = 0 if padding == "valid" else max((n - 1) * s + k - size, 0) // 2
        have = out.shape[2 + a] - start
        if have < size:
            pad = [0, 0, 0, 0]
            pad[2 * (1 - a) + 1] = size - have
            out = torch.nn.functional.pad(out, pad)
        out = out.narrow(2 + a, start, size)
    return out + bias.reshape(1, -1, 1, 1)


@pytest.mark.torch
@pytest.mark.parametrize("kernel, strides, padding, output_padding, hw", CASES)
def test_conv2d_transpose_matches_pytorch(rng, kernel, strides, padding, output_padding, hw):
    torch = torch_or_skip()
    layer = ot.layers.Conv2DTranspose(3, kernel, strides=strides, padding=padding, output_padding=output_padding,
                                      seed=1)
    model = ot.Sequential([layer], input_shape=(2, *hw))
    k0, b0 = model.get_weights()
    b0 = rng.standard_normal(b0.shape).astype(np.float32)
    model.set_weights([k0, b0])
    x = rng.standard_normal((4, 2, *hw)).astype(np.float32)
    strides2 = layer.strides
    kt, bt = torch.tensor(k0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    want = _torch_reference(torch, torch.tensor(x), kt, bt, strides2, padding, layer.output_padding)
    assert model.predict(x).shape == tuple(want.shape)
    np.testing.assert_allclose(model.predict(x), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    y = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    loss = torch.nn.functional.mse_loss(want, torch.tensor(y))
    loss.backward()
    np.testing.assert_allclose(history.history["loss"][0], loss.item(), rtol=1e-5)
    k1, b1 = model.get_weights()
    np.testing.assert_allclose(k1, k0 - 0.1 * kt.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b1, b0 - 0.1 * bt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("interpolation, mode", [("nearest", "nearest"), ("bilinear", "bilinear")])
def test_upsampling2d_matches_pytorch_and_trains_the_layer_before_it(rng, tmp_path, interpolation, mode):
    torch = torch_or_skip()
    model = ot.Sequential([ot.layers.Conv2D(2, 1, seed=0), ot.layers.UpSampling2D((2, 3), interpolation=interpolation)],
                          input_shape=(2, 4, 5))
    x = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    conv = torch.nn.Conv2d(2, 2, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(model.get_weights()[0]))
        conv.bias.copy_(torch.tensor(model.get_weights()[1]))
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    net = torch.nn.Sequential(conv, torch.nn.Upsample(scale_factor=(2, 3), mode=mode, **kwargs))
    want = net(torch.tensor(x))
    np.testing.assert_allclose(model.predict(x), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    y = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=3, epochs=1, shuffle=False, verbose=0)
    torch.nn.functional.mse_loss(want, torch.tensor(y)).backward()
    np.testing.assert_allclose(model.get_weights()[0], (conv.weight - 0.1 * conv.weight.grad).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    model.save(tmp_path / "m.ortrain")
    again = ot.load_model(tmp_path / "m.ortrain")
    np.testing.assert_array_equal(again.predict(x), model.predict(x))
    model.export_onnx(tmp_path / "m.onnx")
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {served.get_inputs()[0].name: x})[0], model.predict(x), rtol=1e-6)


def test_a_decoder_saves_loads_and_exports(rng, tmp_path):
    model = ot.Sequential([ot.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu", seed=0),
                           ot.layers.Conv2DTranspose(2, 3, strides=2, padding="same", output_padding=1, seed=1),
                           ot.layers.UpSampling2D(2)], input_shape=(2, 6, 6))
    model.compile(optimizer="adam", loss="mse")
    x = rng.standard_normal((8, 2, 6, 6)).astype(np.float32)
    assert model.predict(x).shape == (8, 2, 12, 12)  # 6 -> 3 -> (3 - 1) * 2 + 3 - 2 + 1 = 6 -> 12
    model.fit(x, rng.standard_normal((8, 2, 12, 12)).astype(np.float32), batch_size=4, epochs=2, verbose=0)
    model.save(tmp_path / "m.ortrain")
    again = ot.load_model(tmp_path / "m.ortrain")
    np.testing.assert_array_equal(again.predict(x), model.predict(x))
    model.export_onnx(tmp_path / "m.onnx")
    served = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served.run(None, {served.get_inputs()[0].name: x})[0], model.predict(x), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"filters": 0, "kernel_size": 3}, r"Conv2DTranspose\(filters=...\): expected a positive int, received 0"),
    ({"filters": 2, "kernel_size": 3, "strides": 2, "output_padding": 2},
     r"output_padding=...\): expected None or ints from 0 to the stride less one \(strides \(2, 2\)\), received 2"),
    ({"filters": 2, "kernel_size": 3, "padding": "full"}, r"expected 'valid' or 'same', received 'full'"),
])
def test_conv2d_transpose_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ot.OrtrainError, match=message):
        ot.layers.Conv2DTranspose(**kwargs)


def test_upsampling2d_refuses_an_unknown_interpolation():
    with pytest.raises(ot.OrtrainError, match=r"expected 'nearest' or 'bilinear', received 'bicubic'"):
        ot.layers.UpSampling2D(2, interpolation="bicubic")


def test_a_conv2d_transpose_with_an_empty_output_is_refused_when_built():
    with pytest.raises(ot.ShapeError, match=r"Conv2DTranspose: kernel \(4, 4\), strides \(2, 2\), padding 'same' "
                                            r"and output_padding \(0, 0\) give input .* an output of \[0, 2\] pixels"):
        ot.Sequential([ot.layers.Conv2DTranspose(2, 4, strides=2, padding="same", output_padding=0)],
                      input_shape=(3, 1, 2))
