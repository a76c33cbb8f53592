"""Batch-norm statistics: calibration also reaches layers whose statistics are frozen."""

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import torch_or_skip
from helpers import torch_steps

import ortrain as ot

L = ot.layers


def test_calibrate_bn_sets_frozen_statistics_too(rng):
    model = ot.Sequential([L.Dense(4), L.BatchNorm(), L.Dense(1)], input_shape=(3,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    model.freeze_bn_stats()
    x = rng.standard_normal((200, 3)).astype(np.float32) * 2 + 3
    with ot.Trainer(model, batch_size=8) as tr:
        tr.calibrate_bn(x)
        w = tr.model().get_weights()
        h = x.astype(np.float64) @ w[0] + w[1]
        np.testing.assert_allclose(w[4], h.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w[5], h.var(0), rtol=1e-5, atol=1e-6)
        # Frozen statistics are what training normalises with, so the step now uses these.
        y = rng.standard_normal((8, 1)).astype(np.float32)
        tr.set_lr(0.0)
        loss = tr.step(x[:8], y)
        np.testing.assert_allclose(loss, np.mean((tr.predict(x[:8]) - y) ** 2), rtol=1e-5)


def test_freezing_one_running_statistic_fixes_both_and_says_so():
    # naming running_mean alone fixed running_var too, and the layer normalised by them in training,
    # without a word
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32) * 3 + 2
    m = ot.Sequential([ot.layers.Dense(3, name="a"), ot.layers.BatchNorm(name="bn"), ot.layers.Dense(2)],
                      input_shape=(4,), seed=0)
    with pytest.warns(UserWarning, match=r"freeze: 'bn.running_mean' is one of a batch norm's two running "
                                         r"statistics, which are fixed together or not at all: 'bn.running_var' "
                                         r"is fixed too"):
        m.freeze("bn.running_mean")
    m.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    before = m.get_weights()
    m.fit(x, np.zeros((8, 2), np.float32), batch_size=8, verbose=0)
    for got, want in zip(m.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    with pytest.warns(UserWarning, match=r"unfreeze: 'bn.running_var' is one of .* 'bn.running_mean' is tracked "
                                         r"again too"):
        m.unfreeze("bn.running_var")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.freeze(["bn.running_mean", "bn.running_var"])
        m.freeze("bn")


def test_naming_one_statistic_warns_only_where_the_other_changes():
    m = ot.Sequential([ot.layers.Dense(3), ot.layers.BatchNorm(name="bn"), ot.layers.Dense(2)], input_shape=(4,),
                      seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.unfreeze(["bn.running_var"])  # neither was fixed: nothing to say
    with pytest.warns(UserWarning, match="freeze: 'bn.running_var' is one of"):
        m.freeze(["bn.running_var"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.freeze(["bn.running_mean"])  # both fixed already


@pytest.mark.parametrize("after", [None, "relu"])
def test_a_batch_norm_called_on_several_inputs_updates_in_call_order(after):
    # the runtime updated the shared statistics in the order it ran the nodes: with a ReLU after each
    # call, the second call's update came first (0.09 b + 0.1 a for Keras' 0.09 a + 0.1 b)
    L = ot.layers
    inputs = [ot.Input((4,)) for _ in range(3)]
    bn = L.BatchNorm(momentum=0.9)
    outs = [bn(i) for i in inputs]
    if after:
        outs = [L.Activation(after)(h) for h in outs]
    model = ot.Model(inputs, L.Add()(outs)).compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal((8, 4)) + 10 * k).astype(np.float32) for k in range(3)]
    with ot.Trainer(model, batch_size=8) as tr:
        for _ in range(2):
            tr.step(xs, np.zeros((8, 4), np.float32))
        w = dict(zip(tr.weight_names(), tr.get_weights()))
    mean, var = np.zeros(4), np.ones(4)
    for _ in range(2):
        for x in xs:  # Keras: each call moves the statistics, in the order of the calls
            mean, var = 0.9 * mean + 0.1 * x.mean(0), 0.9 * var + 0.1 * x.var(0)
    np.testing.assert_allclose(w["batch_norm_0.running_mean"], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w["batch_norm_0.running_var"], var, rtol=1e-5)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True])
def test_a_backbone_over_two_inputs_keeps_pytorchs_running_statistics(dynamo):
    # TorchScript: the two updates of the shared statistics ran in the runtime's order; dynamo: the
    # second call read the exporter's Identity of the statistics, which trained as a buffer of its own
    # ('getitem_3'), each call keeping statistics of its own
    import copy
    import io
    torch = torch_or_skip()
    torch.manual_seed(0)

    class Siamese(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bb = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                          torch.nn.ReLU())

        def forward(self, x):
            return self.bb(x[:, :3]) + self.bb(x[:, 3:])

    net = Siamese()
    f = io.BytesIO()
    if dynamo:
        torch.onnx.export(copy.deepcopy(net), (torch.zeros(4, 6, 5, 5),), f, dynamo=True, optimize=False,
                          dynamic_shapes=({0: torch.export.Dim("b")},))
    else:
        torch.onnx.export(copy.deepcopy(net), (torch.zeros(4, 6, 5, 5),), f, dynamo=False, input_names=["x"],
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          dynamic_axes={"x": {0: "n"}})
    model = ot.from_onnx(onnx.load_from_string(f.getvalue()))
    assert sorted(model.weight_names()) == sorted(net.state_dict().keys() - {"bb.1.num_batches_tracked"})
    # a training-mode export runs the copy forward once, which moves the statistics it writes
    model.set_weights({k: v.numpy() for k, v in net.state_dict().items() if k in model.weight_names()})
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(2):
        x = rng.standard_normal((4, 6, 5, 5)).astype(np.float32)
        x[:, 3:] += 20  # the two halves' statistics differ
        batches.append((x, rng.standard_normal((4, 4, 5, 5)).astype(np.float32)))
    with ot.Trainer(model, batch_size=4) as tr:
        for x, y in batches:
            tr.step(x, y)
        got = dict(zip(tr.weight_names(), tr.get_weights()))
    net.train()
    torch_steps(torch, net, torch.optim.SGD(net.parameters(), lr=0.1), torch.nn.functional.mse_loss, batches)
    # (the running variance is the batch's biased one, as the README says; PyTorch keeps the unbiased)
    for name in ("bb.1.running_mean", "bb.0.weight", "bb.1.weight"):
        np.testing.assert_allclose(got[name], net.state_dict()[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_batch_norm_called_twice_on_one_tensor_moves_twice():
    # the runtime merged the two equal calls into one node, which moved the statistics once a step
    L = ot.layers
    a = ot.Input((3,))
    bn = L.BatchNorm(momentum=0.9)
    model = ot.Model(a, L.Add()([bn(a), L.Dense(3)(bn(a))])).compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    x = (np.random.default_rng(0).standard_normal((8, 3)) + 5).astype(np.float32)
    with ot.Trainer(model, batch_size=8) as tr:
        for _ in range(2):
            tr.step(x, np.zeros((8, 3), np.float32))
        w = dict(zip(tr.weight_names(), tr.get_weights()))
    mean, var = np.zeros(3), np.ones(3)
    for _ in range(4):  # two steps of two calls
        mean, var = 0.9 * mean + 0.1 * x.mean(0), 0.9 * var + 0.1 * x.var(0)
    np.testing.assert_allclose(w["batch_norm_0.running_mean"], mean, rtol=1e-5)
    np.testing.assert_allclose(w["batch_norm_0.running_var"], var, rtol=1e-5)


def test_calibrating_a_shared_batch_norm_takes_the_mean_of_its_calls():
    # each call was calibrated in turn into the same statistics: the last call's alone were kept
    L = ot.layers
    rng = np.random.default_rng(0)
    a, b = ot.Input((3,)), ot.Input((3,))
    bn = L.BatchNorm()
    model = ot.Model([a, b], L.Add()([bn(a), bn(b)])).compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    xa = (rng.standard_normal((64, 3)) * 2 + 5).astype(np.float32)
    xb = (rng.standard_normal((64, 3)) - 5).astype(np.float32)
    with ot.Trainer(model, batch_size=64) as tr:
        tr.calibrate_bn([xa, xb])
        w = dict(zip(tr.weight_names(), tr.get_weights()))
    np.testing.assert_allclose(w["batch_norm_0.running_mean"], (xa.mean(0) + xb.mean(0)) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w["batch_norm_0.running_var"], (xa.var(0) + xb.var(0)) / 2, rtol=1e-5)


def test_a_batch_norm_called_on_two_equal_computations_moves_twice():
    # bn(relu(a)) + bn(relu(a)): the runtime merged the equal relus, then the batch norms
    L = ot.layers
    a = ot.Input((3,))
    bn = L.BatchNorm(momentum=0.9)
    h = L.Add()([bn(L.Activation("relu")(a)), bn(L.Activation("relu")(a))])
    model = ot.Model(a, L.Dense(1)(h)).compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = (np.random.default_rng(0).normal(size=(8, 3)) + 2).astype(np.float32)
    model.fit(x, np.zeros((8, 1), np.float32), batch_size=8, epochs=1, verbose=0)
    w = dict(zip(model.weight_names(), model.get_weights()))
    np.testing.assert_allclose(w["batch_norm_0.running_mean"], 0.19 * np.maximum(x, 0).mean(0), rtol=1e-5)


def test_equal_nodes_with_other_outputs_read_are_not_merged():
    # merging equal nodes renamed a read output of the later one to the first's unused (empty) one:
    # the training graph was invalid
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
             helper.make_node("MaxPool", ["h"], ["a", ""], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["h"], ["b", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Cast", ["idx"], ["idx_f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["idx_f", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1, 4, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 1, 2, 2])], [w])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = np.random.default_rng(0).standard_normal((2, 1, 4, 4)).astype(np.float32)
    with ot.Trainer(model, batch_size=2) as tr:
        np.testing.assert_allclose(tr.step(x, np.zeros((2, 1, 2, 2), np.float32)), np.mean(model.predict(x) ** 2),
                                   rtol=1e-6)


def test_calibrating_a_shared_backbone_takes_each_layer_from_every_call():
    # the calls were calibrated in graph order (bn1 on a, bn2 on a, bn1 on b, bn2 on b): bn2's first call
    # was measured while bn1 held a's statistics alone, not the mean of both calls
    L = ot.layers
    rng = np.random.default_rng(0)
    a, b = ot.Input((3,)), ot.Input((3,))
    bn1, dense, bn2 = L.BatchNorm(), L.Dense(3, activation="relu"), L.BatchNorm()
    model = ot.Model([a, b], L.Add()([bn2(dense(bn1(a))), bn2(dense(bn1(b)))]))
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    xa = (rng.standard_normal((64, 3)) * 2 + 5).astype(np.float32)
    xb = (rng.standard_normal((64, 3)) - 5).astype(np.float32)
    with ot.Trainer(model, batch_size=64) as tr:
        tr.calibrate_bn([xa, xb])
        w = dict(zip(tr.weight_names(), tr.get_weights()))
    mean1 = (xa.mean(0) + xb.mean(0)) / 2
    var1 = (xa.var(0) + xb.var(0)) / 2
    np.testing.assert_allclose(w["batch_norm_0.running_mean"], mean1, rtol=1e-5, atol=1e-6)
    kernel, bias = w["dense_0.kernel"], w["dense_0.bias"]
    gamma, beta, eps = w["batch_norm_0.gamma"], w["batch_norm_0.beta"], 1e-3

    def hidden(x):  # bn1 in eval mode with its calibrated statistics, then the dense layer
        return np.maximum(((x - mean1) / np.sqrt(var1 + eps) * gamma + beta) @ kernel + bias, 0)
    ha, hb = hidden(xa), hidden(xb)
    np.testing.assert_allclose(w["batch_norm_1.running_mean"], (ha.mean(0) + hb.mean(0)) / 2, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w["batch_norm_1.running_var"], (ha.var(0) + hb.var(0)) / 2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 2, 2, 2), (2, 3, 2, 1, 2)])
def test_a_batch_norm_over_five_or_more_dimensions_trains_as_pytorch(shape, tmp_path):
    # (N, 3, 2, 2, 2) was refused as not "(batch, channels, ...)"; ONNX and Keras take any rank
    torch = torch_or_skip()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, *shape)) * 2 + 1).astype(np.float32)
    y = rng.standard_normal((4, *shape)).astype(np.float32)
    model = ot.Sequential([ot.layers.BatchNorm(momentum=0.9)], input_shape=shape)
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    c = shape[0]
    gamma = torch.ones(c, dtype=torch.float64, requires_grad=True)
    beta = torch.zeros(c, dtype=torch.float64, requires_grad=True)
    mean, var = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    for _ in range(2):
        out = torch.nn.functional.batch_norm(xt, mean, var, gamma, beta, training=True, momentum=0.1, eps=1e-3)
        ((out - yt) ** 2).mean().backward()
        with torch.no_grad():
            for p in (gamma, beta):
                p -= 0.1 * p.grad
                p.grad = None
    g, b, m, v = model.get_weights()
    np.testing.assert_allclose(g, gamma.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(b, beta.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(m, mean.numpy(), atol=1e-6)  # the mean's update; the variance's is Keras' (biased)
    biased = x.astype(np.float64).var(axis=tuple(i for i in range(x.ndim) if i != 1))
    np.testing.assert_allclose(v, 0.81 + 0.19 * biased, rtol=1e-6)  # two updates of Keras' (biased) rule
    expected = ((x - m.reshape(c, *[1] * (len(shape) - 1))) / np.sqrt(v.reshape(c, *[1] * (len(shape) - 1)) + 1e-3)
                * g.reshape(c, *[1] * (len(shape) - 1)) + b.reshape(c, *[1] * (len(shape) - 1)))
    np.testing.assert_allclose(model.predict(x), expected, atol=1e-5)
    session = ort.InferenceSession(model.export_onnx(tmp_path / "bn.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {session.get_inputs()[0].name: x})[0], model.predict(x))
