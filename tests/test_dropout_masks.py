"""Dropout masks: independent from step to step, each a fixed function of seed, dropout and step.

onnxruntime's CPU Dropout seeds minstd_rand0 with seed + k at its k-th run: the first element
of every input was dropped (or kept) at every step, and the others cycled through fixed
patterns. The reference below is written out here: a Philox generator keyed by (seed, index of
the dropout) at counter (0, step, 0, 0), one float32 draw per element, kept when >= rate.
"""

import warnings

import numpy as np
import onnx
import pytest
from conftest import torch_or_skip
from onnx import TensorProto, helper, numpy_helper

import ortrain as ot
from ortrain import ag

L = ot.layers


def reference_mask(seed: int, index: int, step: int, shape, rate: float) -> np.ndarray:
    gen = np.random.Generator(np.random.Philox(counter=np.array([0, step, 0, 0], np.uint64),
                                               key=np.array([seed % 2**64, index], np.uint64)))
    keep = gen.random(shape, dtype=np.float32) >= np.float32(rate)
    return keep * (np.float32(1) / (np.float32(1) - np.float32(rate)))


def _mask_model(n: int, rate: float, seed):
    """Output = dropout(ones): with SGD at lr 0 and one weight 2**i per output element, each
    step's loss spells out its mask bit by bit."""
    model = ot.Sequential([L.Dense(n), L.Dropout(rate, seed=seed), L.Dense(n)], input_shape=(n,), seed=0)
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    model.set_weights([np.eye(n, dtype=np.float32), np.zeros(n, np.float32)] * 2)
    return model


def _masks(model, n: int, rate: float, steps: int) -> np.ndarray:
    weights = (2.0 ** np.arange(n)).astype(np.float32)[None]
    scale = 1 / (1 - rate) ** 2
    out = []
    with ot.Trainer(model, batch_size=1, loss_mask=n) as tr:
        for _ in range(steps):
            code = int(round(tr.step(np.ones((1, n)), np.zeros((1, n)), sample_weight=weights) * n / scale))
            out.append([(code >> i) & 1 for i in range(n)])
    return np.array(out)


def test_a_seeded_sequential_seeds_its_dropout_too():
    # Sequential(seed=...) makes a run reproducible without ot.set_seed, dropout masks included;
    # another seed draws other masks, and a Dropout's own seed still wins.
    ot.set_seed(None)
    n, rate, steps = 8, 0.5, 40

    def model(seed, own=None):
        stack = ot.Sequential([L.Dense(n), L.Dropout(rate, seed=own), L.Dense(n)], input_shape=(n,), seed=seed)
        stack.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
        stack.set_weights([np.eye(n, dtype=np.float32), np.zeros(n, np.float32)] * 2)
        return stack

    first, again, other = model(5), model(5), model(6)
    assert first.layers[1].graph_seed == again.layers[1].graph_seed != other.layers[1].graph_seed
    masks = _masks(first, n, rate, steps)
    np.testing.assert_array_equal(masks, _masks(again, n, rate, steps))
    assert np.mean(masks != _masks(other, n, rate, steps)) > 0.3
    seed = first.layers[1].graph_seed
    np.testing.assert_array_equal(masks, [reference_mask(seed, 0, k, (1, n), rate)[0] > 0 for k in range(steps)])
    np.testing.assert_array_equal(_masks(model(5, own=3), n, rate, steps),
                                  [reference_mask(3, 0, k, (1, n), rate)[0] > 0 for k in range(steps)])
    assert model(None).layers[1].graph_seed is None  # unseeded: no seed in the graph, as before


def test_masks_are_independent_from_step_to_step():
    n, rate, steps = 16, 0.5, 400
    masks = _masks(_mask_model(n, rate, seed=3), n, rate, steps)
    expected = np.array([reference_mask(3, 0, k, (1, n), rate)[0] > 0 for k in range(steps)])
    np.testing.assert_array_equal(masks, expected)
    # independent draws: each element kept about half the time (3 sigma: 0.075), and a step's
    # mask agrees with the one before it on about half the elements
    assert np.all(np.abs(masks.mean(axis=0) - 0.5) < 0.1), masks.mean(axis=0)
    assert abs(np.mean(masks[1:] == masks[:-1]) - 0.5) < 0.03
    assert abs(np.mean(masks[2:] == masks[:-2]) - 0.5) < 0.03


def test_an_unseeded_dropout_draws_independent_masks_too():
    n, rate = 16, 0.5
    masks = _masks(_mask_model(n, rate, seed=None), n, rate, 200)
    assert 0.35 < masks[:, 0].mean() < 0.65  # onnxruntime's kept element 0 at every step
    assert abs(np.mean(masks[1:] == masks[:-1]) - 0.5) < 0.05


def test_training_through_dropout_matches_pytorch_with_the_same_masks(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)
    model = ot.Sequential([L.Dense(6, activation="tanh"), L.Dropout(0.3, seed=11), L.Dense(3)],
                          input_shape=(5,), seed=1)
    model.compile(optimizer=ot.optim.Adam(lr=0.05), loss="mse")
    w = model.get_weights()
    l1, l2 = torch.nn.Linear(5, 6), torch.nn.Linear(6, 3)
    with torch.no_grad():
        for layer, (kernel, bias) in ((l1, w[:2]), (l2, w[2:])):
            layer.weight.copy_(torch.tensor(kernel.T))
            layer.bias.copy_(torch.tensor(bias))
    opt = torch.optim.Adam([*l1.parameters(), *l2.parameters()], lr=0.05)
    with ot.Trainer(model, batch_size=8) as tr:
        for k in range(4):
            mask = torch.tensor(reference_mask(11, 0, k, (8, 6), 0.3))
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(l2(torch.tanh(l1(torch.tensor(x))) * mask), torch.tensor(y))
            loss.backward()
            opt.step()
            assert tr.step(x, y) == pytest.approx(loss.item(), rel=1e-5)
        got = tr.model().get_weights()
    want = [l1.weight.detach().numpy().T, l1.bias.detach().numpy(), l2.weight.detach().numpy().T,
            l2.bias.detach().numpy()]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_captured_dropout_draws_the_reference_masks():
    ot.set_seed(5)
    W = ag.param(np.ones((4, 4), np.float32), name="W")

    def fn(x):
        h = ag.dropout(x @ W, 0.25)
        return {"loss": ag.mean(h), "h": h}

    step = ot.capture_step(fn, optimizer=ot.optim.Adam([W], lr=0.0))
    x = np.ones((3, 4), np.float32)
    outs = [step(x=x) for _ in range(3)]  # the first call traces fn, whose dropout draws a seed
    ot.set_seed(5)
    seed = ot._random.draw_seed()
    for k, out in enumerate(outs):
        want = 4 * reference_mask(seed, 0, k, (3, 4), 0.25)
        np.testing.assert_array_equal(out["h"], want)
        assert out["loss"] == pytest.approx(want.mean(), rel=1e-6)
    step.free()


def test_masks_of_an_odd_size_follow_the_reference_at_every_step():
    # 7 float32 draws a step leave half of a 64-bit block unused: the next step starts afresh.
    n, rate, steps = 7, 0.5, 40
    masks = _masks(_mask_model(n, rate, seed=3), n, rate, steps)
    expected = np.array([reference_mask(3, 0, k, (1, n), rate)[0] > 0 for k in range(steps)])
    np.testing.assert_array_equal(masks, expected)


def test_masks_over_a_transposed_and_reshaped_batch(rng):
    # PyTorch exports put dropout after x.reshape(-1, k) or x.transpose(0, 1): the batch has no name
    # there, or is not the first dimension; the runtime's kernel was left to draw, keeping element 0.
    rate, steps = 0.5, 200
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "rows"], ["r"]),           # (batch, 6) -> (2 * batch, 3)
         helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),    # (3, 2 * batch)
         helper.make_node("Dropout", ["t", "ratio", "on"], ["d", "m"], seed=4),
         helper.make_node("Transpose", ["d"], ["back"], perm=[1, 0]),
         helper.make_node("Reshape", ["back", "cols"], ["y"]),
         helper.make_node("Add", ["y", "b"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 6])],
        [numpy_helper.from_array(np.array([-1, 3], np.int64), "rows"),
         numpy_helper.from_array(np.array([-1, 6], np.int64), "cols"),
         numpy_helper.from_array(np.array(rate, np.float32), "ratio"), numpy_helper.from_array(np.array(True), "on"),
         numpy_helper.from_array(np.zeros(6, np.float32), "b")])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    weights = (2.0 ** np.arange(6)).astype(np.float32)[None]
    codes = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no Dropout is left to the kernel
        with ot.Trainer(model, batch_size=1, loss_mask=6) as tr:
            for _ in range(steps):
                loss = tr.step(np.ones((1, 6)), np.zeros((1, 6)), sample_weight=weights)
                codes.append(int(round(loss * 6 / 4)))   # each kept element is 2 after scaling
    masks = np.array([[(c >> i) & 1 for i in range(6)] for c in codes])
    # drawn in the layout of the dropout's input, (3, 2), and transposed back to the output's (2, 3)
    expected = np.array([(reference_mask(4, 0, k, (3, 2), rate) > 0).T.reshape(6) for k in range(steps)])
    np.testing.assert_array_equal(masks, expected)
    assert np.all(np.abs(masks.mean(axis=0) - 0.5) < 0.13)


@pytest.mark.parametrize("weights", ["per sample", "per position"])
def test_masks_of_a_sequence_model_trained_with_sample_weights(weights):
    # Sample weights for outputs of more than two axes come in through an input with a free axis
    # after the batch; that input feeds only the loss, so the dropout's masks are still ortrain's
    # (onnxruntime's kernel dropped element 0 at every step). Output t = mask_t * 2 * sqrt(2**t):
    # at lr 0 each step's loss spells out its mask bit by bit.
    n, rate, steps = 10, 0.5, 30
    model = ot.Sequential([L.Dense(1, use_bias=False), L.Dropout(rate, seed=3)], input_shape=(n, 1), seed=0)
    model.set_weights([np.ones((1, 1), np.float32)])
    model.compile(optimizer=ot.optim.SGD(lr=0.0), loss="mse")
    x = np.sqrt(2.0 ** np.arange(n)).reshape(1, n, 1)
    sample_weight = np.ones(1) if weights == "per sample" else np.ones((1, n))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no word of the runtime's kernel
        history = model.fit(x, np.zeros((1, n, 1)), batch_size=1, epochs=steps, shuffle=False, verbose=0,
                            sample_weight=sample_weight)
    codes = np.rint(np.array(history.history["loss"]) * n / 4).astype(int)
    masks = [[(c >> i) & 1 for i in range(n)] for c in codes]
    np.testing.assert_array_equal(masks, [reference_mask(3, 0, k, (1, n), rate)[0] > 0 for k in range(steps)])


def test_a_dropout_over_a_weight_reshaped_by_a_computed_shape_gets_masks():
    # DropConnect: no data input is among the dropout's ancestors, so its size cannot grow with
    # the rows; onnx's inference loses it (ReduceProd), and running the graph measures it.
    def i64(name, v):
        return numpy_helper.from_array(np.array(v, np.int64), name)

    nodes = [helper.make_node("Shape", ["w"], ["shape"]),
             helper.make_node("Slice", ["shape", "s0", "s1", "axis"], ["rows"]),
             helper.make_node("Slice", ["shape", "s1", "s3", "axis"], ["rest"]),
             helper.make_node("ReduceProd", ["rest"], ["cols"], keepdims=1),
             helper.make_node("Concat", ["rows", "cols"], ["flat_shape"], axis=0),
             helper.make_node("Reshape", ["w", "flat_shape"], ["flat"]),
             helper.make_node("Dropout", ["flat", "ratio", "on"], ["d", "m"], seed=1),
             helper.make_node("MatMul", ["x", "d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
                               numpy_helper.from_array(np.array(True), "on"),
                               numpy_helper.from_array(np.ones((4, 3, 2), np.float32), "w"),
                               i64("s0", [0]), i64("s1", [1]), i64("s3", [3]), i64("axis", [0])])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        art = ot.artifacts.build(model, loss="mse", optimizer="sgd")
    training = onnx.load(art.directory / "training.onnx")
    assert "Dropout" not in [n.op_type for n in training.graph.node]
    assert [i.name for i in training.graph.input if i.name.startswith("ortrain.dropout_mask/")] == \
        ["ortrain.dropout_mask/0"]


def test_a_dropout_over_a_free_sequence_length_keeps_the_runtime_kernel_and_says_so(rng):
    # The mask's size is known only when the graph runs: onnxruntime's Dropout draws it.
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x", "ratio", "on"], ["d", "m"], seed=2),
         helper.make_node("MatMul", ["d", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "length", 2])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"), numpy_helper.from_array(np.array(True), "on"),
         numpy_helper.from_array(np.ones((3, 2), np.float32), "w")])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    model.compile(optimizer=ot.optim.SGD(lr=0.1), loss="mse")
    art = ot.artifacts.build(model, loss="mse", optimizer="sgd")
    training = onnx.load(art.directory / "training.onnx")
    assert [n.op_type for n in training.graph.node].count("Dropout") == 1
    assert not [i.name for i in training.graph.input if i.name.startswith("ortrain.dropout_mask/")]
    said = r"Dropout node keeps onnxruntime's kernel \('d': the size of its input is not known before a step runs"
    for _ in range(2):   # said whenever a trainer opens the graph, the artifacts cached or not
        with pytest.warns(UserWarning, match=said), ot.Trainer(model, batch_size=2) as tr:
            losses = [tr.step(rng.standard_normal((2, 5, 3)), np.zeros((2, 5, 2))) for _ in range(3)]
        assert all(np.isfinite(losses))


def test_the_training_graph_reads_masks_and_the_eval_graph_none():
    model = _mask_model(4, 0.5, seed=3)
    art = ot.artifacts.build(model, loss="mse", optimizer="sgd")
    training, evaluation = (onnx.load(art.directory / f) for f in ("training.onnx", "eval.onnx"))
    assert "Dropout" not in [n.op_type for n in training.graph.node]
    masks = [i for i in training.graph.input if i.name.startswith("ortrain.dropout_mask/")]
    assert [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in masks] == \
        [("ortrain.dropout_mask/0", ["ortrain_mask_rows_0"])]   # flat, reshaped to the input in the graph
    assert not [i for i in evaluation.graph.input if i.name.startswith("ortrain.dropout_mask/")]


def _dropout_capture(w0, refuse_at=None, resume_at=None):
    """Losses of a captured step with dropout over 5 calls; a call refused at ``refuse_at`` (a label
    out of range), or the step resumed into a new capture through opt.state() at ``resume_at``."""
    W = ag.param(w0, name="W")
    labels = ag.buffer(np.array([0, 1, 2, 0], np.int64), name="labels")
    opt = ot.optim.Adam([W], lr=0.1)

    def fn(x, i):
        return ag.softmax_cross_entropy_loss(ag.dropout(x @ W, 0.5), ag.get_rows(labels, i))

    ot.set_seed(9)
    step = ot.capture_step(fn, optimizer=opt)
    x, i = np.ones((4, 4), np.float32), np.arange(4)
    losses = []
    for k in range(5):
        if k == refuse_at:
            labels.write(1, np.array([7]))
            with pytest.raises(ot.ShapeError):
                step(x=x, i=i)
            labels.write(1, np.array([1]))
        if k == resume_at:
            state, value = opt.state(), W.numpy()
            step.free()
            W = ag.param(value, name="W")
            opt = ot.optim.Adam([W], lr=0.1)
            opt.load_state(state)
            ot.set_seed(9)   # the same dropout seed, as a restarted script draws it
            step = ot.capture_step(fn, optimizer=opt)
        losses.append(float(step(x=x, i=i)))
    step.free()
    return losses


def test_a_refused_or_resumed_capture_draws_the_masks_of_an_uninterrupted_run(rng):
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    straight = _dropout_capture(w0)
    assert _dropout_capture(w0, refuse_at=2) == straight   # the refused call drew no mask of its own
    assert _dropout_capture(w0, resume_at=3) == straight   # a new capture counts from opt.step


def _one_dropout_model(nodes, x_dims, inits, out_dims):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
                               numpy_helper.from_array(np.array(True), "on"), *inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("batch", ["N", "batch_size"])
def test_masks_whatever_the_export_names_the_batch(batch):
    # ortrain names its label's rows "batch": a model naming its own otherwise kept the kernel.
    proto = _one_dropout_model([helper.make_node("Dropout", ["x", "ratio", "on"], ["d", "m"], seed=1),
                                helper.make_node("MatMul", ["d", "w"], ["y"])], [batch, 4],
                               [numpy_helper.from_array(np.ones((4, 2), np.float32), "w")], [batch, 2])
    model = ot.from_onnx(proto)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        art = ot.artifacts.build(model, loss="mse", optimizer="sgd")
    assert "Dropout" not in [n.op_type for n in onnx.load(art.directory / "training.onnx").graph.node]


def test_a_size_that_stops_growing_with_the_batch_keeps_the_kernel():
    # x[:3] then dropout: 4 elements a row at 2 and 3 rows, 12 from then on
    proto = _one_dropout_model(
        [helper.make_node("Slice", ["x", "start", "end", "axis"], ["s"]),
         helper.make_node("Dropout", ["s", "ratio", "on"], ["d", "m"], seed=1),
         helper.make_node("ReduceSum", ["d"], ["total"], keepdims=1),
         helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "total"], ["y"])],
        ["batch", 4], [numpy_helper.from_array(np.array([0], np.int64), "start"),
                       numpy_helper.from_array(np.array([3], np.int64), "end"),
                       numpy_helper.from_array(np.array([0], np.int64), "axis"),
                       numpy_helper.from_array(np.ones((4, 2), np.float32), "w")], ["batch", 2])
    model = ot.from_onnx(proto)
    model.compile(optimizer="sgd", loss="mse")
    for rows in (2, 3, 5):
        with pytest.warns(UserWarning, match="keeps onnxruntime's kernel .*the size of its input is not known"):
            with ot.Trainer(model, batch_size=rows) as tr:
                assert np.isfinite(tr.step(np.ones((rows, 4)), np.zeros((rows, 2))))


def test_a_dropout_inside_a_subgraph_says_it_keeps_the_kernel():
    then = helper.make_graph([helper.make_node("Dropout", ["x", "ratio", "on"], ["inner"], name="inside", seed=1)],
                             "then", [], [helper.make_tensor_value_info("inner", TensorProto.FLOAT, ["batch", 4])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["same"])], "else", [],
                              [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["batch", 4])])
    proto = _one_dropout_model([helper.make_node("If", ["cond"], ["b"], then_branch=then, else_branch=other),
                                helper.make_node("MatMul", ["b", "w"], ["y"])], ["batch", 4],
                               [numpy_helper.from_array(np.array(True), "cond"),
                                numpy_helper.from_array(np.ones((4, 2), np.float32), "w")], ["batch", 2])
    model = ot.from_onnx(proto)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match=r"Dropout node keeps onnxruntime's kernel \('inside': it lies inside a "
                                         r"control-flow subgraph"):
        ot.Trainer(model, batch_size=2).free()


def test_a_dynamo_export_flattening_before_dropout_gets_masks():
    # onnx's shape inference loses the size at the exporter's computed reshape: ortrain measures it
    torch = torch_or_skip()
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(12, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(net, (torch.zeros(2, 3, 4),), dynamo=True, optimize=False, input_names=["x"],
                                    training=torch.onnx.TrainingMode.TRAINING, dynamic_axes={"x": {0: "batch"}},
                                    verbose=False)
    model = ot.from_onnx(program.model_proto)
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        art = ot.artifacts.build(model, loss="mse", optimizer="sgd")
        with ot.Trainer(model, batch_size=3) as tr:
            assert np.isfinite(tr.step(np.ones((3, 3, 4)), np.zeros((3, 2))))
    assert "Dropout" not in [n.op_type for n in onnx.load(art.directory / "training.onnx").graph.node]


def test_a_size_that_depends_on_the_values_keeps_the_kernel():
    # positions 0..max(lengths): one element on zeros at any batch size, but not a fixed size
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["len"], ["top"], keepdims=0), helper.make_node("Add", ["top", "one"], ["lim"]),
         helper.make_node("Range", ["zero", "lim", "one"], ["r"]), helper.make_node("Cast", ["r"], ["rf"], to=1),
         helper.make_node("Dropout", ["rf", "ratio", "on"], ["d"], seed=1),
         helper.make_node("ReduceSum", ["d"], ["total"], keepdims=1),
         helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "total"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
              helper.make_tensor_value_info("len", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"), numpy_helper.from_array(np.array(True), "on"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(np.ones((4, 2), np.float32), "w")])
    model = ot.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match="the size of its input is not known before a step runs .*input values"):
        with ot.Trainer(model, batch_size=3) as tr:
            assert np.isfinite(tr.step([np.ones((3, 4)), np.array([5, 2, 3])], np.zeros((3, 2))))
