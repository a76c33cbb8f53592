"""``ot.from_onnx`` on exports that merged equal initializers, and trainable scalars.

torch's TorchScript exporter in eval mode writes a distinct tensor whose value equals an
earlier one as ``Identity(earlier)``: a fresh batch norm's running variance becomes
``Identity(gamma)``. Each such output must train (or track statistics) apart, as in PyTorch.
References: numpy batch norm and Adam, the same graph without the merge, and PyTorch.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _onnx_helpers import f32 as _f32
from _onnx_helpers import model as _model
from _onnx_helpers import vi as _vi
from conftest import torch_or_skip
from helpers import NumpyAdam, torch_steps
from onnx import helper, numpy_helper

import ortrain as ot

EPS, MOMENTUM = 1e-5, 0.9  # ONNX momentum: running <- MOMENTUM * running + (1 - MOMENTUM) * batch


def _weights(model) -> dict[str, np.ndarray]:
    return dict(zip(model.weight_names(), model.get_weights(), strict=True))


# -- batch-norm statistics merged into gamma and beta ---------------------------------------------

def _merged_bn_model(rng):
    """x -> MatMul W1 -> BatchNormalization whose running statistics are Identity(gamma), Identity(beta)."""
    inits = [numpy_helper.from_array(_f32(rng, 4, 6), "W1"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 6).astype(np.float32), "g"),
             numpy_helper.from_array(_f32(rng, 6), "be")]
    nodes = [helper.make_node("Identity", ["g"], ["rv"]), helper.make_node("Identity", ["be"], ["rm"]),
             helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "g", "be", "rm", "rv"], ["y"],
                              epsilon=EPS, momentum=MOMENTUM)]
    return _model(nodes, [_vi("x", [None, 4])], [_vi("y", [None, 6])], inits)


def test_running_statistics_read_through_identity_are_buffers_of_their_own(rng):
    proto = _merged_bn_model(rng)
    w0 = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in proto.graph.initializer}
    model = ot.from_onnx(proto)
    assert {p.name: p.role for p in model.params()} == {
        "W1": "trainable", "g": "trainable", "be": "trainable", "rm": "buffer", "rv": "buffer"}
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    rm, rv = w0["be"].copy(), w0["g"].copy()
    batches = [(_f32(rng, 8, 4), _f32(rng, 8, 6)) for _ in range(2)]
    with ot.Trainer(model, batch_size=8) as tr:
        for x, y in batches:
            h = x @ w0["W1"]
            want = (h - h.mean(0)) / np.sqrt(h.var(0) + EPS) * w0["g"] + w0["be"]  # batch statistics
            np.testing.assert_allclose(tr.step(x, y), np.mean((want - y) ** 2), rtol=1e-5)
            rm = MOMENTUM * rm + (1 - MOMENTUM) * h.mean(0)
            rv = MOMENTUM * rv + (1 - MOMENTUM) * h.var(0)  # biased, as ortrain documents
        x = batches[0][0]
        inference = (x @ w0["W1"] - rm) / np.sqrt(rv + EPS) * w0["g"] + w0["be"]
        np.testing.assert_allclose(tr.predict(x), inference, rtol=1e-4, atol=1e-5)
        after = _weights(tr.model())
    for name in ("W1", "g", "be"):  # lr=0: the running-statistics update writes none of them
        np.testing.assert_array_equal(after[name], w0[name].astype(np.float32), err_msg=name)
    np.testing.assert_allclose(after["rm"], rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after["rv"], rv, rtol=1e-5, atol=1e-6)


def _two_layers(rng, merged: bool):
    """x -> MatMul W1 (32x32, large enough to be stashed) + b1 -> Relu -> MatMul W2 + b2, where W2
    and b2 equal W1 and b1 and are either Identity(W1), Identity(b1) or initializers of their own."""
    w, b = _f32(rng, 32, 32) * 0.2, np.zeros(32, np.float32)
    inits = [numpy_helper.from_array(w, "W1"), numpy_helper.from_array(b, "b1")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r"]), helper.make_node("MatMul", ["r", "W2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    if merged:
        nodes[:0] = [helper.make_node("Identity", ["W1"], ["W2"]), helper.make_node("Identity", ["b1"], ["b2"])]
    else:
        inits += [numpy_helper.from_array(w, "W2"), numpy_helper.from_array(b, "b2")]
    return _model(nodes, [_vi("x", [None, 32])], [_vi("y", [None, 32])], inits)


def test_weights_merged_by_value_train_apart_like_the_unmerged_file(rng):
    x, y = _f32(rng, 8, 32), _f32(rng, 8, 32)
    trained = []
    for merged in (True, False):
        if merged:  # a merge of matrices may also be a weight shared in PyTorch that folding split: said
            with pytest.warns(UserWarning, match=r"merges equal weights through Identity \('W1' and 'W2'\); each "
                                                 r"trains as a weight of its own, .* do_constant_folding=False"):
                model = ot.from_onnx(_two_layers(np.random.default_rng(1), merged))
        else:
            model = ot.from_onnx(_two_layers(np.random.default_rng(1), merged))
        assert {p.name: p.role for p in model.params()} == dict.fromkeys(["W1", "b1", "W2", "b2"], "trainable")
        model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
        with ot.Trainer(model, batch_size=8) as tr:
            losses = [tr.step(x, y) for _ in range(3)]
            trained.append((losses, _weights(tr.model())))
    (losses, got), (want_losses, want) = trained
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.allclose(got["W1"], got["W2"]) and not np.allclose(got["b1"], got["b2"])


# -- PyTorch parity on fresh eval-mode exports ----------------------------------------------------

def _torch_net(torch, kind: str):
    nn = torch.nn
    torch.manual_seed(0)
    if kind == "batchnorm":
        # No bias before the batch norm: its gradient is zero up to rounding, and Adam turns
        # rounding noise into lr-sized steps that differ between any two implementations.
        return nn.Sequential(nn.Linear(4, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 8), nn.LayerNorm(8),
                         nn.Linear(8, 3))


def _eval_export(torch, module) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        # No constant folding: it would store a bias-free Linear's weight transposed, under a new name.
        torch.onnx.export(module, (torch.zeros(2, 4),), f, training=torch.onnx.TrainingMode.EVAL, dynamo=False,
                          do_constant_folding=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    return onnx.load_from_string(f.getvalue())


def _torch_steps(torch, module, kind, optimizer, batches):
    """Training-mode steps in PyTorch; also the biased running variance ortrain keeps (numpy)."""
    bn_inputs = []
    if kind == "batchnorm":
        module[1].register_forward_hook(lambda mod, args, out: bn_inputs.append(args[0].detach().double().numpy()))
    params = list(module.parameters())
    opt = torch.optim.SGD(params, lr=0.1) if optimizer == "sgd" else torch.optim.Adam(params, lr=0.01)
    module.train()
    losses = torch_steps(torch, module, opt, torch.nn.functional.mse_loss, batches)
    state = {k: v.detach().numpy().copy() for k, v in module.state_dict().items() if v.is_floating_point()}
    if kind == "batchnorm":  # PyTorch tracks the unbiased batch variance, ortrain the biased one
        rv = np.ones(8)
        for h in bn_inputs:
            rv = MOMENTUM * rv + (1 - MOMENTUM) * h.var(0)
        state["1.running_var"] = rv
    return losses, state


@pytest.mark.torch
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("kind", ["batchnorm", "layernorm"])
def test_fresh_eval_export_trains_like_pytorch(rng, kind, optimizer):
    torch = torch_or_skip()
    module = _torch_net(torch, kind)
    proto = _eval_export(torch, module)
    inits = {t.name for t in proto.graph.initializer}
    merged = {n.output[0] for n in proto.graph.node if n.op_type == "Identity" and n.input[0] in inits}
    assert merged == ({"1.running_mean", "1.running_var"} if kind == "batchnorm" else {"4.weight", "4.bias"})
    batches = [(_f32(rng, 8, 4), _f32(rng, 8, 3)) for _ in range(3)]
    want_losses, want = _torch_steps(torch, module, kind, optimizer, batches)
    model = ot.from_onnx(proto).compile(
        optimizer=ot.optim.SGD(lr=0.1) if optimizer == "sgd" else ot.optim.Adam(lr=0.01), loss="mse")
    assert {p.name: p.role for p in model.params()} == {
        k: "buffer" if "running" in k else "trainable" for k in want}
    assert model.weight_names() == list(want)  # state_dict order: set_weights(list) puts each in place
    with ot.Trainer(model, batch_size=8) as tr:
        losses = [tr.step(x, y) for x, y in batches]
        got = _weights(tr.model())
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.torch
def test_merged_weights_keep_the_state_dict_order_whatever_the_module_order():
    torch = torch_or_skip()
    nn = torch.nn

    class Reordered(nn.Module):  # registered a, head, b; applied a, b, head; b.bias merged into a.bias
        def __init__(self):
            super().__init__()
            self.a, self.head, self.b = nn.Linear(4, 8), nn.Linear(8, 3), nn.Linear(8, 8)
            nn.init.zeros_(self.a.bias)
            nn.init.zeros_(self.b.bias)

        def forward(self, x):
            return self.head(torch.relu(self.b(torch.relu(self.a(x)))))

    class LateNorm(nn.Module):  # the batch norm registered after the head it feeds
        def __init__(self):
            super().__init__()
            self.inp, self.head, self.bn = nn.Linear(4, 8), nn.Linear(8, 3), nn.BatchNorm1d(8)

        def forward(self, x):
            return self.head(self.bn(self.inp(x)))

    class Swapped(nn.Module):  # b1 registered first, applied second: all of b2 merged into b1
        def __init__(self):
            super().__init__()
            self.inp, self.b1, self.b2, self.head = nn.Linear(4, 8), nn.BatchNorm1d(8), nn.BatchNorm1d(8), \
                nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.b1(self.b2(self.inp(x))))

    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    for module in (Reordered(), LateNorm(), Swapped(), _torch_net(torch, "batchnorm"), _torch_net(torch, "layernorm")):
        module.eval()
        proto = _eval_export(torch, module)
        assert any(n.op_type == "Identity" for n in proto.graph.node)
        state = {k: v.numpy() for k, v in module.state_dict().items() if v.is_floating_point()}
        model = ot.from_onnx(proto)
        assert model.weight_names() == list(state), type(module).__name__
        with torch.no_grad():   # other values, in state_dict order, reach the right weights
            for v in module.state_dict().values():
                if v.is_floating_point():
                    v.add_(torch.rand_like(v) * 0.5)
            want = module(torch.from_numpy(x)).numpy()
        model.set_weights([v.numpy() for v in module.state_dict().values() if v.is_floating_point()])
        np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)


def _dynamo_export(torch, module, example, batch_free: bool = False, optimize: bool = False) -> onnx.ModelProto:
    """``module`` through torch's dynamo exporter, unoptimized (as the README advises) unless
    ``optimize``, its warnings silenced; ``batch_free`` frees axis 0 of the example."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), f, dynamo=True, optimize=optimize,
                          **({"dynamic_shapes": ({0: torch.export.Dim("b")},)} if batch_free else {}))
    return onnx.load_from_string(f.getvalue())


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_dynamo_export_lists_the_weights_in_state_dict_order(mode):
    # The dynamo exporter lists every parameter, then every buffer: a BatchNorm's running
    # statistics came last, and set_weights(list) in state_dict order put them elsewhere.
    torch = torch_or_skip()
    nn = torch.nn
    torch.manual_seed(0)
    module = getattr(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 3),
                                   nn.BatchNorm1d(3)), mode)()
    proto = _dynamo_export(torch, module, torch.zeros(2, 4), batch_free=True)
    state = [k for k, v in module.state_dict().items() if v.is_floating_point()]
    assert [t.name for t in proto.graph.initializer][-1] == "4.running_var"   # the file's own order
    model = ot.from_onnx(proto)
    assert model.weight_names() == state
    with torch.no_grad():
        for k in state:
            module.state_dict()[k].add_(torch.rand_like(module.state_dict()[k]))
        x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        want = module.eval()(torch.from_numpy(x)).numpy()
    model.set_weights([module.state_dict()[k].numpy() for k in state])
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.torch
def test_a_dynamo_exports_buffers_stay_frozen_and_in_state_dict_order(rng):
    # register_buffer: PyTorch never trains it (a positional-encoding table, a shift); the dynamo
    # exporter records it as a BUFFER and lists it after every parameter.
    torch = torch_or_skip()
    nn = torch.nn

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", torch.randn(5, 4))

        def forward(self, x):
            return x + self.pe

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))
            self.register_buffer("shift", torch.randn(3))
            self.inp, self.pos, self.out = nn.Linear(3, 4), Positions(), nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.pos(self.inp(x * self.scale + self.shift)))

    torch.manual_seed(0)
    net = Net()
    proto = _dynamo_export(torch, net, torch.zeros(4, 5, 3))
    model = ot.from_onnx(proto)
    assert model.weight_names() == list(net.state_dict())
    assert {p.name for p in model.params() if p.role != "trainable"} == {"shift", "pos.pe"}
    model.compile(optimizer=ot.optim.Adam(lr=0.1), loss="mse")
    batches = [(_f32(rng, 4, 5, 3), _f32(rng, 4, 5, 2)) for _ in range(3)]
    with ot.Trainer(model, batch_size=4) as tr:
        losses = [tr.step(x, y) for x, y in batches]
        got = _weights(tr.model())
    want = torch_steps(torch, net, torch.optim.Adam(net.parameters(), lr=0.1), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(got[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    with pytest.warns(UserWarning, match=r"unfreeze: 'pos.pe' stay frozen: they were frozen when the model was "
                                         r"imported \(.*a PyTorch buffer\); import it again with trainable= naming"):
        model.unfreeze("pos.pe")
    named = ot.from_onnx(proto, trainable=["pos.pe", "out.*"])   # trains where named
    assert {p.name for p in named.params() if p.role == "trainable"} == {"pos.pe", "out.weight", "out.bias"}


@pytest.mark.torch
@pytest.mark.parametrize("optimize", [False, True])
def test_a_dynamo_exports_constant_tensors_stay_constants(rng, optimize):
    # A tensor made in forward (torch.tensor([...])) or kept as a plain attribute (normalisation
    # constants) is a constant in PyTorch; the dynamo exporter writes it as an initializer recorded
    # as CONSTANT_TENSOR (optimized: folded into 'clone' from 'lifted_tensor_0'; its detach() is an
    # Identity, which gets a copy of its own). They trained.
    torch = torch_or_skip()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = torch.tensor([0.5, 0.25, 0.125, 1.0])
            self.inp, self.out = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.out((self.inp(x) - self.mu) * torch.tensor([1.0, 2.0, 3.0, 4.0]) + self.mu.detach())

    torch.manual_seed(0)
    net = Net()
    proto = _dynamo_export(torch, net, torch.zeros(4, 3), optimize=optimize)
    kinds = {p.value for vi in [*proto.graph.input, *proto.graph.value_info] for p in vi.metadata_props
             if p.key.endswith("InputSpec.kind")}
    assert "CONSTANT_TENSOR" in kinds, "the exporter no longer records constant tensors: the test needs another model"
    model = ot.from_onnx(proto)
    assert model.weight_names() == list(net.state_dict()) == ["inp.weight", "inp.bias", "out.weight", "out.bias"]
    model.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
    batches = [(_f32(rng, 4, 3), _f32(rng, 4, 2)) for _ in range(3)]
    with ot.Trainer(model, batch_size=4) as tr:
        losses = [tr.step(x, y) for x, y in batches]
        got = _weights(tr.model())
        pred = tr.predict(batches[0][0])
    want = torch_steps(torch, net, torch.optim.Adam(net.parameters(), lr=0.05), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(got[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    with torch.no_grad():
        np.testing.assert_allclose(pred, net(torch.from_numpy(batches[0][0])).numpy(), rtol=1e-5, atol=1e-6)
    named = "mu" if any(t.name == "mu" for t in proto.graph.initializer) else None
    if named:
        with pytest.raises(ot.OrtrainError, match=r"trainable: 'mu' is a constant, not a weight: PyTorch's dynamo "
                                                  r"exporter records it as a constant tensor .*remove it from trainable="):
            ot.from_onnx(proto, trainable=["mu", "out.*"])


# -- scalars ---------------------------------------------------------------------------------------

def _scaled_model(rng):
    """y = MatMul(x, W) * s with a learnable scale s (a rank-0 initializer) and a constant exponent."""
    inits = [numpy_helper.from_array(_f32(rng, 3, 2), "W"), numpy_helper.from_array(np.array(2.0, np.float32), "s"),
             numpy_helper.from_array(np.array(1.0, np.float32), "p")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Mul", ["h", "s"], ["hs"]),
             helper.make_node("Pow", ["hs", "p"], ["y"])]
    return _model(nodes, [_vi("x", [None, 3])], [_vi("y", [None, 2])], inits)


def test_scalars_stay_constant_unless_named(rng):
    proto = _scaled_model(rng)
    assert [p.name for p in ot.from_onnx(proto).params()] == ["W"]
    assert [p.name for p in ot.from_onnx(proto, trainable="*").params()] == ["W"]  # globs never pick scalars
    with pytest.raises(ot.OrtrainError, match=r"trainable: 'p' is a scalar constant that cannot train: "
                                              r"no gradient reaches it"):
        ot.from_onnx(proto, trainable=["W", "p"])


def test_a_named_scalar_trains_saves_and_exports(rng, tmp_path):
    proto = _scaled_model(rng)
    model = ot.from_onnx(proto, trainable=["W", "s"])
    assert [(p.name, p.role, p.shape) for p in model.params()] == [("W", "trainable", (3, 2)),
                                                                   ("s", "trainable", (1,))]
    model.compile(optimizer=ot.optim.Adam(lr=0.1), loss="mse")
    ref = NumpyAdam([numpy_helper.to_array(proto.graph.initializer[0]), 2.0], lr=0.1)
    batches = [(_f32(rng, 8, 3), _f32(rng, 8, 2)) for _ in range(3)]
    with ot.Trainer(model, batch_size=8) as tr:
        for x, y in batches:
            w, s = ref.p
            h = x.astype(np.float64) @ w
            np.testing.assert_allclose(tr.step(x, y), np.mean((h * s - y) ** 2), rtol=1e-5)
            d = 2 * (h * s - y) / y.size
            ref.step([x.T @ (d * s), np.sum(d * h)])
        trained = tr.model()
    got = _weights(trained)
    np.testing.assert_allclose(got["W"], ref.p[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["s"], [ref.p[1]], rtol=1e-5)
    x = batches[0][0]
    want = x @ ref.p[0] * ref.p[1]
    loaded = ot.load_model(trained.save(tmp_path / "scaled"))
    np.testing.assert_array_equal(_weights(loaded)["s"], got["s"])
    np.testing.assert_allclose(loaded.predict(x), want, rtol=1e-5, atol=1e-6)
    path = trained.export_onnx(tmp_path / "scaled.onnx")
    onnx.checker.check_model(onnx.load(path), full_check=True)
    out = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def _recorded_scalar(rng, nodes, extra=()):
    """y = nodes(x @ W, s): a 0-d 's' (0.5) that the file records as a PyTorch parameter, as the
    dynamo exporter does in value_info metadata."""
    inits = [numpy_helper.from_array(_f32(rng, 3, 2), "W"), numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             *extra]
    proto = _model([helper.make_node("MatMul", ["x", "W"], ["h"]), *nodes], [_vi("x", [None, 3])],
                   [_vi("y", [None, 2])], inits)
    for name in ("W", "s"):
        vi = proto.graph.value_info.add()
        vi.CopyFrom(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        vi.metadata_props.add(key="pkg.torch.export.graph_signature.InputSpec.kind", value="PARAMETER")
    return proto


def test_a_recorded_0d_parameter_trains_where_one_node_reads_it_once(rng):
    proto = _recorded_scalar(rng, [helper.make_node("Mul", ["h", "s"], ["y"])])
    assert [(p.name, p.role, p.shape) for p in ot.from_onnx(proto).params()] == [("W", "trainable", (3, 2)),
                                                                                 ("s", "trainable", (1,))]
    assert [p.name for p in ot.from_onnx(proto, trainable=["W"]).params()] == ["W"]   # left out: a constant
    assert [p.name for p in ot.from_onnx(proto, trainable=["*"]).params()] == ["W", "s"]  # a glob picks a parameter


@pytest.mark.parametrize("form", ["two nodes", "one node twice", "in a subgraph", "exponent"])
def test_a_recorded_0d_parameter_that_cannot_train_as_pytorch_does_stays_constant_and_says_so(rng, form):
    # The exporter's optimizer merges a scalar parameter with equal constants ('* 0.5' reads it;
    # Where(c, p, 0.5) becomes Where(c, p, p)): trained, the constant would move too. Inside an If
    # the runtime builds no gradient; as a Pow's exponent none reaches it.
    if form == "two nodes":
        nodes, why = [helper.make_node("Mul", ["h", "s"], ["hs"]), helper.make_node("Mul", ["hs", "s"], ["y"])], \
            r"read 2 times, and the dynamo exporter's optimizer merges"
    elif form == "one node twice":
        nodes, why = [helper.make_node("Greater", ["h", "zero"], ["c"]),
                      helper.make_node("Where", ["c", "s", "s"], ["w"]), helper.make_node("Mul", ["h", "w"], ["y"])], \
            r"read 2 times"
    elif form == "in a subgraph":
        # y = h + (sum(x) > 0 ? rowsum(x) * s : rowsum(x)): W's gradient does not cross the If
        branch = helper.make_graph([helper.make_node("Mul", ["r", "s"], ["out"])], "then", [], [_vi("out", None)])
        other = helper.make_graph([helper.make_node("Identity", ["r"], ["out2"])], "else", [], [_vi("out2", None)])
        nodes, why = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                      helper.make_node("ReduceSum", ["x", "one"], ["r"], keepdims=1),
                      helper.make_node("Greater", ["total", "zero"], ["c"]),
                      helper.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=other),
                      helper.make_node("Add", ["h", "b"], ["y"])], \
            r"read inside a control-flow subgraph"
    else:
        nodes, why = [helper.make_node("Sigmoid", ["h"], ["p"]), helper.make_node("Pow", ["p", "s"], ["y"])], \
            r"no gradient reaches it"
    proto = _recorded_scalar(rng, nodes, [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                                          numpy_helper.from_array(np.array([1], np.int64), "one")])
    with pytest.warns(UserWarning, match=rf"PyTorch's 0-d parameter stays constant \('s': {why}.*where PyTorch trains it"):
        assert [p.name for p in ot.from_onnx(proto).params()] == ["W"]
    if form != "two nodes":   # a glob picking it is told to leave it out
        with pytest.warns(UserWarning), pytest.raises(ot.OrtrainError, match=rf"'s' is a constant, not a weight: {why}"
                                                                             r".*; remove it from trainable=$"):
            ot.from_onnx(proto, trainable=["W", "s*"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [p.name for p in ot.from_onnx(proto, frozen=["s"]).params()] == ["W"]
    if form == "two nodes":
        with pytest.warns(UserWarning), pytest.raises(
                ot.OrtrainError, match=r"trainable: 's' is a constant, not a weight: read 2 times.*\(to train it, "
                                       r"export with torch.onnx.export\(..., optimize=False\) and name it exactly in "
                                       r"trainable=\); remove it from trainable="):
            ot.from_onnx(proto, trainable=["W", "s*"])
        assert [p.name for p in ot.from_onnx(proto, trainable=["W", "s"]).params()] == ["W", "s"]


@pytest.mark.torch
def test_a_dynamo_exports_0d_parameter_trains_as_in_pytorch(rng):
    # nn.Parameter(torch.tensor(1.5)), a learnt scale, is recorded as a PARAMETER by the dynamo
    # exporter, and PyTorch trains it; it stayed a constant, as the scalars a file does not mark.
    torch = torch_or_skip()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.scale = nn.Linear(4, 2), nn.Parameter(torch.tensor(1.5))

        def forward(self, x):
            return self.fc(x) * self.scale

    torch.manual_seed(0)
    net = Net()
    proto = _dynamo_export(torch, net, torch.zeros(8, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = ot.from_onnx(proto)
    assert model.weight_names() == list(net.state_dict()) == ["scale", "fc.weight", "fc.bias"]
    assert model.trainable_weight_names == model.weight_names()
    model.compile(optimizer=ot.optim.SGD(lr=0.05), loss="mse")
    batches = [(_f32(rng, 8, 4), 3 * _f32(rng, 8, 2)) for _ in range(4)]
    with ot.Trainer(model, batch_size=8) as tr:
        losses = [tr.step(x, y) for x, y in batches]
        got = _weights(tr.model())
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=0.05), torch.nn.functional.mse_loss, batches)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for name, value in net.state_dict().items():
        np.testing.assert_allclose(got[name], value.numpy().reshape(got[name].shape), rtol=1e-5, atol=1e-6)
    assert ot.from_onnx(proto, trainable=["fc.*"]).trainable_weight_names == ["fc.weight", "fc.bias"]

    class Detached(Net):   # PyTorch does not train a parameter read through detach(): nothing to say
        def forward(self, x):
            return self.fc(x) * self.scale.detach()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ot.from_onnx(_dynamo_export(torch, Detached(), torch.zeros(8, 4))).trainable_weight_names == \
            ["fc.weight", "fc.bias"]


@pytest.mark.torch
def test_a_0d_parameter_the_exporter_merged_with_a_constant_stays_constant_and_says_so():
    # The exporter's optimizer merges a scalar parameter with constants of equal value: here the
    # 0.5 of '* 0.5' reads the parameter 'scale' (0.5), which training would then change too.
    torch = torch_or_skip()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.scale = nn.Linear(4, 2), nn.Parameter(torch.tensor(0.5))

        def forward(self, x):
            return torch.tanh(self.fc(x)) * 0.5 * self.scale

    proto = _dynamo_export(torch, Net(), torch.zeros(8, 4), optimize=True)
    assert sum(n.input[:].count("scale") for n in proto.graph.node) == 2, "the exporter no longer merges them"
    with pytest.warns(UserWarning, match=r"PyTorch's 0-d parameter stays constant \('scale': read 2 times, .* "
                                         r"optimize=False\) and name it exactly in trainable=\)\), where PyTorch"):
        assert ot.from_onnx(proto).trainable_weight_names == ["fc.weight", "fc.bias"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ot.from_onnx(proto, frozen=["scale"]).trainable_weight_names == ["fc.weight", "fc.bias"]
    assert ot.from_onnx(proto, trainable=["scale", "fc.*"]).trainable_weight_names == ["scale", "fc.weight", "fc.bias"]


@pytest.mark.torch
@pytest.mark.parametrize("form", ["clone", "slice", "detach"])
def test_a_dynamo_exports_identity_of_a_parameter_is_that_parameter(form):
    # p.clone() and a full-length slice (pos[:, :T], named alias) are written as Identity(param) by
    # the dynamo exporter: the same parameter, which trains once and keeps its PyTorch name (each
    # Identity output trained as a weight of its own, named 'clone' or 'alias'). p.detach() is the
    # same Identity but stops the gradient, which the runtime cannot: it stays a copy of its own.
    torch = torch_or_skip()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.randn(1, 4, 3))
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            read = {"clone": self.pos.clone, "detach": self.pos.detach}.get(form, lambda: self.pos[:, :x.shape[1]])()
            return self.fc(x + read) + (x * self.pos).sum(-1, keepdim=True)

    torch.manual_seed(0)
    net = Net()
    proto = _dynamo_export(torch, net, torch.zeros(2, 4, 3), batch_free=True)
    assert any(n.op_type == "Identity" and n.input[0] == "pos" for n in proto.graph.node)
    model = ot.from_onnx(proto)
    if form == "detach":
        assert model.weight_names() == ["pos", "detach", "fc.weight", "fc.bias"]
        return
    assert model.weight_names() == ["pos", "fc.weight", "fc.bias"]
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 4, 3)).astype(np.float32), rng.standard_normal((8, 4, 2)).astype(np.float32))
               for _ in range(3)]
    with ot.Trainer(model, batch_size=8) as tr:
        got = [tr.step(x, y) for x, y in batches]
        trained = tr.model().get_weights()
    want = torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=0.1), nn.functional.mse_loss, batches)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for w, p in zip(trained, net.parameters()):
        np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6)
