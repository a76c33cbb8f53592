"""Ops onnxruntime-training 1.19.2 has no gradient for, trained through ``ot.from_onnx`` as PyTorch
trains them: ``InstanceNormalization`` and ``GroupNormalization`` (written out in the training graphs
only, :mod:`ortrain.graph.norm_forms`), and the activations ``Selu``, ``Celu``, ``Softsign`` and
``ThresholdedRelu`` (written in arithmetic at import, ``repairs.activations_as_arithmetic``).

References: the same steps in PyTorch float32 (losses and every weight), and the exported model
run in a plain ``onnxruntime.InferenceSession``.

Tolerances: the forms compute what PyTorch's kernels compute in another order (``(x - mean) /
sqrt(var + eps)`` against PyTorch's ``x * rstd + (-mean * rstd)``), a few float32 roundings
(about 1e-7 relative) apart per value. After three steps the losses differ by 1e-7 to 1.3e-6
(on losses of order 1) and the weights by at most 0.13 of ``atol + rtol * |w|`` with
``rtol=1e-5, atol=1e-6`` (Adam's steps, which divide each gradient by its size, the largest;
SGD's below 0.04 of it).
"""

from __future__ import annotations

import collections
import copy
import io

import numpy as np
import onnx
import pytest
from _onnx_helpers import model as _model
from _onnx_helpers import vi
from conftest import torch_or_skip
from helpers import torch_steps
from onnx import helper, numpy_helper

import ortrain as ot
from ortrain.graph.gradient_forms import gradient_forms

pytestmark = [pytest.mark.torch,
              pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript", "ignore:The feature will be removed",
                                         "ignore:Converting a tensor to a Python boolean",
                                         "ignore:Exporting a model while it is in training mode",
                                         "ignore:ONNX export mode is set to TrainingMode.EVAL",
                                         "ignore::DeprecationWarning", "ignore::FutureWarning")]

RTOL, ATOL = 1e-5, 1e-6
EXPORTERS = ["torchscript", "dynamo"]


def _export(torch, net, x, exporter, opset=None) -> onnx.ModelProto:
    """``net`` exported with a free batch dimension (``x`` has 2 rows; the steps take 4)."""
    kwargs = {"opset_version": opset} if opset else {}
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch")},)
    else:
        kwargs["dynamic_axes"] = {"x": {0: "batch"}}
    f = io.BytesIO()
    torch.onnx.export(net, (torch.from_numpy(x),), f, dynamo=exporter == "dynamo", input_names=["x"], **kwargs)
    return onnx.load_from_string(f.getvalue())


def _randomized(torch, net, seed=0):
    """``net`` with every parameter drawn anew (distinct values: the weights are paired by value)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():  # a norm's scale about 1
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if p.ndim == 1 and name.endswith("weight") else 0.0))
    return net


def _paired(net, model) -> dict[str, str]:
    """ortrain's weight name -> PyTorch's parameter name, by initial value: exporters rename the
    weights they fold (GroupNorm's, reshaped to (C, 1, 1), become ``onnx::Mul_16`` or ``val_21``).
    Every trainable weight is a parameter of ``net`` and every parameter is one weight."""
    params = {n: p.detach().numpy().ravel() for n, p in net.named_parameters()}
    pairs = {}
    for name, w in zip(model.weight_names(), model.get_weights(), strict=True):
        same = [n for n, v in params.items() if v.shape == w.ravel().shape and np.array_equal(v, w.ravel())]
        assert len(same) == 1, f"weight {name!r} {w.shape} is no parameter of the PyTorch model (or several)"
        pairs[name] = same[0]
    assert sorted(pairs.values()) == sorted(params)
    return pairs


def _trains_as_pytorch(torch, net, proto, x, y, tmp_path, adam=False, lr=0.1, steps=3, keeps=None):
    """Losses and weights after ``steps`` steps of SGD (or Adam) on mean squared error, in ortrain
    and in PyTorch; then predictions against PyTorch's and the exported model's in onnxruntime.
    ``keeps``: the op the exported model still holds. Returns the largest differences."""
    import onnxruntime as ort
    model = ot.from_onnx(proto)
    pairs = _paired(net, model)
    want = torch_steps(torch, net, (torch.optim.Adam if adam else torch.optim.SGD)(net.parameters(), lr=lr),
                       torch.nn.functional.mse_loss, [(x, y)] * steps)
    model.compile(optimizer=(ot.optim.Adam if adam else ot.optim.SGD)(lr=lr), loss="mse")
    with ot.Trainer(model, batch_size=len(x)) as tr:
        got = [tr.step(x, y) for _ in range(steps)]
        trained = tr.model()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    state = {n: p.detach().numpy() for n, p in net.named_parameters()}
    diffs = {"loss": float(np.max(np.abs(np.subtract(got, want))))}
    for name, w in zip(trained.weight_names(), trained.get_weights(), strict=True):
        ref = state[pairs[name]]
        np.testing.assert_allclose(w.reshape(ref.shape), ref, rtol=RTOL, atol=ATOL, err_msg=name)
        diffs[pairs[name]] = float(np.max(np.abs(w.reshape(ref.shape) - ref)))
    predicted = trained.predict(x)
    with torch.no_grad():
        np.testing.assert_allclose(predicted, net(torch.from_numpy(x)).numpy(), rtol=RTOL, atol=ATOL)
    path = trained.export_onnx(tmp_path / "trained.onnx")
    if keeps:
        assert keeps in [n.op_type for n in onnx.load(path).graph.node]
    served = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(predicted, served, rtol=1e-6, atol=1e-7)
    return diffs


def _data(rng, shape, net, torch):
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        out = net(torch.from_numpy(x)).shape
    return x, rng.standard_normal(tuple(out)).astype(np.float32)


def _conv(torch, dims, cin, cout, bias=True):
    return (torch.nn.Conv1d if dims == 1 else torch.nn.Conv2d)(cin, cout, 3, padding=1, bias=bias)


def _before_import_predicts_as_onnxruntime(proto, x):
    """The file as exported, in onnxruntime, against ortrain's predictions before any step."""
    import onnxruntime as ort
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ot.from_onnx(proto).predict(x), want, rtol=1e-6, atol=1e-7)


# -- InstanceNormalization --------------------------------------------------------------------

@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("dims", [1, 2])
def test_instance_norm_trains_as_in_pytorch(rng, tmp_path, dims, affine, exporter):
    """A convolution into ``nn.InstanceNorm1d/2d``, exported as ``InstanceNormalization``, which the
    runtime cannot differentiate: it was refused at import."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    norm = (torch.nn.InstanceNorm1d if dims == 1 else torch.nn.InstanceNorm2d)(4, affine=affine)
    # no bias before it: the normalization removes it, and Adam would scale its gradient's rounding noise to
    # full steps (ortrain's and PyTorch's noise differ)
    net = _randomized(torch, torch.nn.Sequential(_conv(torch, dims, 3, 4, bias=False), norm, torch.nn.Tanh()))
    spatial = (7,) if dims == 1 else (5, 6)
    proto = _export(torch, net, np.zeros((2, 3, *spatial), np.float32), exporter)
    assert "InstanceNormalization" in [n.op_type for n in proto.graph.node]
    x, y = _data(rng, (4, 3, *spatial), net, torch)
    _before_import_predicts_as_onnxruntime(proto, x)
    _trains_as_pytorch(torch, net, proto, x, y, tmp_path, adam=exporter == "dynamo", lr=0.05 if exporter == "dynamo"
                       else 0.5, keeps="InstanceNormalization")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_layer_norm_of_one_element_trains_as_in_pytorch(rng, tmp_path, exporter):
    """``nn.LayerNorm(1)``: the runtime's ``LayerNormalizationGrad`` failed on rows of one element
    (its output is the bias, its input's gradient 0)."""
    torch = torch_or_skip()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.norm = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1), torch.nn.LayerNorm(1)

        def forward(self, x):
            return self.norm(self.a(x)) + self.b(x)

    net = _randomized(torch, Net())
    proto = _export(torch, net, np.zeros((2, 3), np.float32), exporter)
    assert "LayerNormalization" in [n.op_type for n in proto.graph.node]
    x, y = _data(rng, (4, 3), net, torch)
    _before_import_predicts_as_onnxruntime(proto, x)
    # SGD: the first layer's gradient is 0 in exact arithmetic, and Adam makes full steps of
    # PyTorch's rounding noise there
    _trains_as_pytorch(torch, net, proto, x, y, tmp_path, lr=0.1)


# -- GroupNormalization -----------------------------------------------------------------------

@pytest.mark.parametrize("exporter, opset", [("torchscript", None), ("dynamo", None), ("dynamo", 21)])
@pytest.mark.parametrize("dims", [1, 2])
def test_group_norm_trains_as_in_pytorch(rng, tmp_path, dims, exporter, opset):
    """``nn.GroupNorm(2, 8)``: the TorchScript exporter writes it as ``Reshape`` to (N, 2, -1),
    ``InstanceNormalization`` with constant ones and zeros, ``Reshape`` back, ``Mul`` and ``Add``
    (the dynamo exporter too up to opset 20); the dynamo exporter at opset 21 as
    ``GroupNormalization`` with a scale and bias per channel."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    net = _randomized(torch, torch.nn.Sequential(_conv(torch, dims, 3, 8), torch.nn.GroupNorm(2, 8),
                                                 torch.nn.Tanh()))
    spatial = (7,) if dims == 1 else (5, 6)
    proto = _export(torch, net, np.zeros((2, 3, *spatial), np.float32), exporter, opset)
    op = "GroupNormalization" if opset == 21 else "InstanceNormalization"
    assert op in [n.op_type for n in proto.graph.node]
    x, y = _data(rng, (4, 3, *spatial), net, torch)
    _before_import_predicts_as_onnxruntime(proto, x)
    _trains_as_pytorch(torch, net, proto, x, y, tmp_path, lr=0.5, keeps=op)


def test_the_ones_and_zeros_the_dynamo_exporter_folds_from_a_shape_stay_constants(rng):
    """The dynamo exporter writes ``InstanceNorm(affine=False)``'s scale and bias and ``GroupNorm``'s
    per-group ones and zeros as initializers folded from the input's shape (``val_3``), where the
    TorchScript exporter writes ``Constant`` nodes; PyTorch has no parameter there. GroupNorm's own
    weights, folded to (C, 1, 1), stay weights."""
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3, bias=False), torch.nn.InstanceNorm1d(4), torch.nn.GroupNorm(2, 4))
    proto = _export(torch, net, np.zeros((2, 3, 7), np.float32), "dynamo")
    norms = [n for n in proto.graph.node if n.op_type == "InstanceNormalization"]
    folded = {v for n in norms for v in n.input[1:]}
    assert len(norms) == 2 and folded <= {t.name for t in proto.graph.initializer}
    model = ot.from_onnx(proto)
    assert not folded & set(model.weight_names())
    assert sorted(_paired(net, model).values()) == ["0.weight", "2.bias", "2.weight"]
    with pytest.raises(ot.OrtrainError, match=r"is a constant, not a weight: PyTorch's dynamo exporter folded it"):
        ot.from_onnx(proto, trainable=[sorted(folded)[0]])


@pytest.mark.torch
def test_a_folded_constant_the_exporter_merged_with_a_parameter_stays_a_weight():
    """The dynamo exporter merges equal initializers and keeps the first one's record: GroupNorm's
    folded ones, equal to a parameter ``g`` of ones read as ``g[:, None]``, become one initializer
    read by two nodes. It stays a weight, so ``g`` trains (shared with the norm's ones, as the
    README says of merged tensors), rather than freezing without a word."""
    torch = torch_or_skip()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.n = torch.nn.Conv1d(3, 4, 3, padding=1), torch.nn.GroupNorm(2, 4, affine=False)
            self.g, self.b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.zeros(4))

        def forward(self, x):
            return self.n(self.c(x)) * self.g[:, None] + self.b[:, None]

    proto = _export(torch, Net(), np.zeros((2, 3, 7), np.float32), "dynamo")
    readers = collections.Counter(i for n in proto.graph.node for i in n.input)
    shared = {t.name for t in proto.graph.initializer if readers[t.name] > 1 and list(t.dims) == [4, 1]}
    assert len(shared) == 2, "the exporter no longer merges these: the test needs another model"
    model = ot.from_onnx(proto)
    assert shared <= set(model.weight_names())



@pytest.mark.torch
@pytest.mark.parametrize("form", ["ramp", "gru"])
def test_tensors_the_dynamo_exporter_folds_from_torch_ops_alone_stay_constants(rng, tmp_path, form):
    """A ramp built from a shape (``torch.arange(T)[:, None] / 10``) and a GRU's zero initial state
    are initializers whose ``folded_from`` record names torch ops (``arange``, ``div``, ``zeros``):
    they trained as weights, where PyTorch has no parameter. A weight folded with them (the GRU's,
    reshaped) names its parameter and stays a weight."""
    torch = torch_or_skip()
    torch.manual_seed(0)

    class Ramp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x @ (torch.ones(4, 4) + torch.arange(x.shape[1]).float()[:, None] / 10))

    class Gru(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.r, self.h = torch.nn.GRU(6, 4, batch_first=True), torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.h(self.r(x)[0][:, -1])

    net, shape = (Ramp(), (4,)) if form == "ramp" else (Gru(), (5, 6))
    if form == "ramp":
        proto = _export(torch, net, np.zeros((2, *shape), np.float32), "dynamo")
    else:  # exported for batches of 4: the initial state is folded for that batch
        f = io.BytesIO()
        torch.onnx.export(net, (torch.zeros(4, *shape),), f, dynamo=True, input_names=["x"])
        proto = onnx.load_from_string(f.getvalue())
    model = ot.from_onnx(proto)
    # the GRU's two biases are folded into one weight (its other weights reshaped), the state not
    assert len(model.weight_names()) == (2 if form == "ramp" else 5)
    x, y = _data(rng, (4, *shape), net, torch)
    if form == "ramp":
        _trains_as_pytorch(torch, net, proto, x, y, tmp_path, lr=0.5)
        return
    # the GRU's folded weights hold its parameters reordered: compared by losses and predictions
    with ot.Trainer(model.compile(optimizer=ot.optim.SGD(lr=0.5), loss="mse"), batch_size=4) as tr:
        got = [tr.step(x, y) for _ in range(3)]
        pred = tr.predict(x)
    opt, want = torch.optim.SGD(net.parameters(), lr=0.5), []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        np.testing.assert_allclose(pred, net(torch.from_numpy(x)).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.torch
@pytest.mark.parametrize("form", ["attention", "rotary"])
def test_a_constant_the_dynamo_exporter_folds_for_several_nodes_stays_a_constant(rng, form):
    """The dynamo exporter's optimizer (on by default) folds an attention's softmax scale
    ``head_dim ** -0.25`` into one ``(1,)`` initializer that the queries' and the keys' ``Mul`` read,
    and a rotary embedding's ``cos`` and ``sin`` tables, made in ``forward`` from ``torch.arange``, into
    initializers four nodes read. Their records name no parameter: they trained as weights (the
    scale drifted from 0.7071 to 0.7006 in five steps), where PyTorch has none."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    functional = torch.nn.functional

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.o = torch.nn.Linear(8, 24), torch.nn.Linear(8, 3)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, 2, 4).transpose(1, 2) for z in self.qkv(x).split(8, -1))
            return self.o(functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 8).mean(1))

    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qk, self.o = torch.nn.Linear(8, 16), torch.nn.Linear(5, 3)

        def forward(self, x):
            angle = torch.arange(x.shape[1], dtype=torch.float32)[:, None] / \
                (100.0 ** (torch.arange(0, 4, dtype=torch.float32) / 4))[None]
            cos, sin = torch.cos(angle), torch.sin(angle)
            q, k = self.qk(x).chunk(2, -1)

            def rotated(z):
                return torch.cat([z[..., :4] * cos - z[..., 4:] * sin, z[..., :4] * sin + z[..., 4:] * cos], -1)
            return self.o((rotated(q) @ rotated(k).transpose(1, 2)).mean(1))

    net = Attention() if form == "attention" else Rotary()
    x = rng.standard_normal((6, 5, 8)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    proto = _export(torch, net, x[:2], "dynamo")
    readers = collections.Counter(i for n in proto.graph.node for i in n.input)
    folded = {t.name for t in proto.graph.initializer if readers[t.name] > 1 and t.data_type == onnx.TensorProto.FLOAT}
    assert len(folded) == (1 if form == "attention" else 2), "the exporter no longer folds these: update the test"
    model = ot.from_onnx(proto)
    assert not folded & set(model.weight_names())
    assert len(model.weight_names()) == 4  # the two layers' weights (a matrix transposed and renamed) and biases
    reference = copy.deepcopy(net).double()
    opt, want = torch.optim.SGD(reference.parameters(), lr=0.5), []
    for _ in range(5):
        loss = functional.cross_entropy(reference(torch.from_numpy(x).double()), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    model.compile(optimizer=ot.optim.SGD(lr=0.5), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    with ot.Trainer(model, batch_size=6) as tr:
        got = [tr.step(x, y) for _ in range(5)]
        pred = tr.predict(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(pred, reference(torch.from_numpy(x).double()).numpy(), rtol=RTOL, atol=ATOL)


def _steps_as_in_torch(model, x, y, want: list[float], tw: dict):
    """``len(want)`` Trainer steps on one batch: the losses ``want`` and the weights of ``tw`` (torch
    tensors by weight name) after them, as PyTorch's steps gave; returns the trained model."""
    with ot.Trainer(model, batch_size=len(x)) as tr:
        got = [tr.step(x, y) for _ in want]
        trained = tr.model()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    for name, value in zip(trained.weight_names(), trained.get_weights(), strict=True):
        np.testing.assert_allclose(value, tw[name].detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=name)
    return trained


def _group_norm_model(rng, opset, n_affine):
    """``x * w`` (``w`` one weight per channel of 4) into ``GroupNormalization(num_groups=2)`` with
    weights ``scale`` and ``bias`` of ``n_affine`` values, over inputs (N, 4, 3)."""
    w, scale, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 1), n_affine, n_affine))
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
             helper.make_node("GroupNormalization", ["h", "scale", "bias"], ["y"], name="gn", num_groups=2,
                              epsilon=1e-3)]
    inits = [numpy_helper.from_array(v, k) for k, v in (("w", w), ("scale", scale), ("bias", bias))]
    return _model(nodes, [vi("x", ["N", 4, 3])], [vi("y", ["N", 4, 3])], inits, opset=opset, ir=9), \
        {"w": w, "scale": scale, "bias": bias}


@pytest.mark.parametrize("opset, n_affine", [(18, 2), (21, 4)])
def test_group_normalization_trains_with_a_scale_per_group_at_opset_18_and_per_channel_at_21(rng, tmp_path,
                                                                                             opset, n_affine):
    """Opset 18 defines ``GroupNormalization``'s scale and bias per group, opset 21 per channel (as
    onnx's reference evaluator and onnxruntime compute them); two SGD steps against PyTorch's
    autograd of that definition."""
    import onnxruntime as ort
    torch = torch_or_skip()
    proto, weights = _group_norm_model(rng, opset, n_affine)
    tw = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}

    def forward(x):
        h = torch.from_numpy(x) * tw["w"]
        normed = torch.nn.functional.group_norm(h, 2, eps=1e-3)
        if n_affine == 2:
            return (normed.reshape(len(x), 2, -1) * tw["scale"][:, None] + tw["bias"][:, None]).reshape(h.shape)
        return normed * tw["scale"][:, None] + tw["bias"][:, None]

    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    y = rng.standard_normal((5, 4, 3)).astype(np.float32)
    want = []
    opt = torch.optim.SGD(list(tw.values()), lr=0.3)
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), torch.from_numpy(y))
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    model = ot.from_onnx(proto).compile(optimizer=ot.optim.SGD(lr=0.3), loss="mse")
    np.testing.assert_allclose(model.predict(x), ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0],
                               rtol=1e-6, atol=1e-6)
    trained = _steps_as_in_torch(model, x, y, want, tw)
    with torch.no_grad():
        np.testing.assert_allclose(trained.predict(x), forward(x).numpy(), rtol=RTOL, atol=ATOL)
    path = trained.export_onnx(tmp_path / "gn.onnx")
    assert "GroupNormalization" in [n.op_type for n in onnx.load(path).graph.node]


def test_a_normalization_of_unknown_rank_is_refused_naming_the_node():
    """The written-out form reduces over the axes after the channels, so it needs the input's rank."""
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="inorm")]
    inits = [numpy_helper.from_array(np.ones(3, np.float32), "s"), numpy_helper.from_array(np.zeros(3, np.float32), "b")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
                   [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    with pytest.raises(ot.UnsupportedOpError, match=r"InstanceNormalization node 'inorm'.*rank of input 'x' is not "
                                                    r"known"):
        gradient_forms(proto)


# -- activations ------------------------------------------------------------------------------

@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("activation", ["SELU", "CELU"])
def test_selu_and_celu_exported_by_pytorch_train_as_in_pytorch(rng, tmp_path, activation, exporter):
    torch = torch_or_skip()
    torch.manual_seed(0)
    act = torch.nn.SELU() if activation == "SELU" else torch.nn.CELU(0.7)
    net = _randomized(torch, torch.nn.Sequential(torch.nn.Linear(5, 6), act, torch.nn.Linear(6, 3)))
    proto = _export(torch, net, np.zeros((2, 5), np.float32), exporter)
    assert activation.capitalize() in [n.op_type for n in proto.graph.node]
    x, y = _data(rng, (8, 5), net, torch)
    _before_import_predicts_as_onnxruntime(proto, x)
    _trains_as_pytorch(torch, net, proto, x, y, tmp_path, adam=True, lr=0.05)


# op, its attributes, PyTorch's function, and inputs that land exactly on the kinks
ACTIVATIONS = {
    "Selu": ({}, lambda torch, h: torch.selu(h), [0.0]),
    "Selu_attributes": ({"alpha": 1.5, "gamma": 2.0}, lambda torch, h: 2.0 * torch.nn.functional.elu(h, 1.5), [0.0]),
    "Celu": ({"alpha": 0.5}, lambda torch, h: torch.celu(h, 0.5), [0.0]),
    "Softsign": ({}, lambda torch, h: torch.nn.functional.softsign(h), [0.0]),
    "Mish": ({}, lambda torch, h: torch.nn.functional.mish(h), [0.0]),   # torch's dynamo exporter writes it
    "ThresholdedRelu": ({"alpha": 0.5}, lambda torch, h: torch.nn.functional.threshold(h, 0.5, 0.0), [0.5, 0.0]),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_without_a_gradient_train_as_in_pytorch_at_their_kinks_too(rng, tmp_path, name):
    """``(x + b) -> op -> * w``: ``b`` starts at zero and ``x`` holds the op's kinks, so the first
    step reads the derivative there (PyTorch's: Selu's left one, ``alpha * gamma``; 0 at
    ThresholdedRelu's ``alpha``), and large inputs, where the unused branch of an ``exp`` would
    overflow."""
    import onnxruntime as ort
    torch = torch_or_skip()
    attrs, fn, kinks = ACTIVATIONS[name]
    op = name.split("_")[0]
    x = rng.standard_normal((6, 4)).astype(np.float32) * 2
    x[0, :len(kinks)] = kinks
    x[1, :len(kinks)] = kinks
    x[2, 0], x[2, 1] = 200.0, -200.0
    b, w = np.zeros(4, np.float32), rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "b"], ["h"]), helper.make_node(op, ["h"], ["a"], name="act", **attrs),
             helper.make_node("Mul", ["a", "w"], ["y"])]
    proto = _model(nodes, [vi("x", ["N", 4])], [vi("y", ["N", 4])],
                   [numpy_helper.from_array(b, "b"), numpy_helper.from_array(w, "w")], opset=18 if op == "Mish" else 17)
    y = rng.standard_normal((6, 4)).astype(np.float32)
    tw = {"b": torch.tensor(b, requires_grad=True), "w": torch.tensor(w, requires_grad=True)}
    opt = torch.optim.SGD(list(tw.values()), lr=0.1)
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(fn(torch, torch.from_numpy(x) + tw["b"]) * tw["w"], torch.from_numpy(y))
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    model = ot.from_onnx(proto)
    assert op not in [n.op_type for n in model.forward_graph().proto.graph.node]
    np.testing.assert_allclose(model.predict(x), ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0],
                               rtol=1e-6, atol=1e-6)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    trained = _steps_as_in_torch(model, x, y, want, tw)
    served = ort.InferenceSession(trained.export_onnx(tmp_path / "act.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(trained.predict(x), served.run(None, {"x": x})[0], rtol=1e-6, atol=1e-7)


@pytest.mark.torch
def test_a_norms_subnormal_epsilon_is_raised_to_the_smallest_normal_float_with_a_warning(rng):
    # BatchNorm1d(eps=1e-40) trained to NaN on a constant feature: the sessions flush the epsilon to 0
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, eps=1e-40), torch.nn.Linear(4, 2))
    with torch.no_grad():
        net[0].weight[0], net[0].bias[0] = 0.0, 0.5  # the first feature is constant, its mean exact
    proto = _export(torch, net, np.zeros((2, 3), np.float32), "torchscript")
    with pytest.warns(UserWarning, match=r"epsilon of .*\(1e-40\) lies below the smallest normal float32.*raised to "
                                         r"1\.18e-38"):
        model = ot.from_onnx(proto)
    model.compile(optimizer="sgd", loss="mse")
    x, y = rng.standard_normal((8, 3)).astype(np.float32), np.zeros((8, 2), np.float32)
    with ot.Trainer(model, batch_size=8) as tr:
        got = tr.step(x, y)
    net.train()
    want = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y)).item()
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-5)


def test_a_layer_norm_of_one_element_known_only_at_run_time_trains(rng):
    # the input's last size is free ("F"): the scale's one value says the rows hold one element
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["h"]),
                           helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], axis=-1)], "g",
                          [vi("x", ["N", "F"])], [vi("y", ["N", "F"])],
                          [numpy_helper.from_array(np.array([1.5], np.float32), "w"),
                           numpy_helper.from_array(np.array([2.0], np.float32), "g"),
                           numpy_helper.from_array(np.array([0.25], np.float32), "b")])
    model = ot.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x = rng.standard_normal((4, 1)).astype(np.float32)
    y = rng.standard_normal((4, 1)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(x), np.full((4, 1), 0.25, np.float32))
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    b = 0.25
    for _ in range(2):   # only the bias has a gradient: the output is the bias
        b -= 0.1 * np.mean(2 * (b - y.astype(np.float64)))
    w, gamma, got = model.get_weights()
    assert (w[0], gamma[0]) == (1.5, 2.0)
    assert got[0] == pytest.approx(b, rel=1e-6)
