"""ot.capture_step / ot.capture against PyTorch and numpy references."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import NumpyAdam, forks_that_hang, interrupted_first, then_interrupted

import ortrain as ot
from ortrain import ag

X = np.ones((3, 4), np.float32)
Y = np.zeros((2, 4), np.float32)


def _w0(seed=0, shape=(2, 3)):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(np.float32)


def _torch_run(torch, inits, loss_fn, batches, opt="adam", lrs=None, max_norm=None, skip=(), **hyper):
    """PyTorch reference: returns (losses, grad_norms, final weights); ``skip`` lists refused calls."""
    ps = [torch.tensor(a.copy(), requires_grad=True) for a in inits]
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[opt]
    o = cls(ps, lr=lrs[0] if lrs else hyper.pop("lr"), **hyper)
    losses, norms = [], []
    for i, batch in enumerate(batches):
        if i in skip:
            continue
        if lrs:
            o.param_groups[0]["lr"] = lrs[i]
        o.zero_grad()
        loss = loss_fn(ps, *[torch.from_numpy(np.asarray(b)) for b in batch])
        loss.backward()
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(ps, max_norm)))
        o.step()
        losses.append(float(loss.detach()))
    return losses, norms, [p.detach().numpy() for p in ps]


def _mse(torch):
    return lambda ps, x, y: torch.mean((ps[0] @ x - y) ** 2)


# -- parity with PyTorch ----------------------------------------------------------------------------
def test_seed_example_matches_pytorch():
    torch = torch_or_skip()
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=1e-2)
    train = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
    losses = [train(x=X, y=Y) for _ in range(5)]
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in losses)
    ref, _, (w_ref,) = _torch_run(torch, [_w0()], _mse(torch), [(X, Y)] * 5, lr=1e-2)
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(W.numpy(), w_ref, rtol=1e-5, atol=1e-7)
    assert opt.step == 5 and W.grad is None
    train.free()


def test_lr_changed_every_call_follows_schedule(rng):
    torch = torch_or_skip()
    sched = ot.optim.schedules.warmup_cosine(0.05, warmup_steps=3, total_steps=8)
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32))
               for _ in range(8)]
    W = ag.param(_w0(1), name="W")
    opt = ot.optim.Adam([W], lr=sched(0))
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    losses = []
    for x, y in batches:
        opt.lr = sched(opt.step)
        losses.append(float(train(x=x, y=y)))
    ref, _, (w_ref,) = _torch_run(torch, [_w0(1)], _mse(torch), batches, lrs=[sched(i) for i in range(8)])
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(W.numpy(), w_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_clipping_equals_clip_grad_norm_then_adam(rng, max_norm):
    torch = torch_or_skip()
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32))
               for _ in range(6)]
    b0 = np.full((2, 1), 0.3, np.float32)
    W, b = ag.param(_w0(2), name="W"), ag.param(b0, name="b")
    opt = ot.optim.Adam([W, b], lr=1e-2)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x + b, y), optimizer=opt, max_grad_norm=max_norm)
    outs = [train(x=x, y=y) for x, y in batches]
    assert set(outs[0]) == {"loss", "grad_norm"}
    ref, norms, (w_ref, b_ref) = _torch_run(torch, [_w0(2), b0], lambda ps, x, y: torch.mean((ps[0] @ x + ps[1] - y) ** 2),
                                            batches, lr=1e-2, max_norm=max_norm)
    np.testing.assert_allclose([float(o["loss"]) for o in outs], ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose([float(o["grad_norm"]) for o in outs], norms, rtol=1e-5)
    np.testing.assert_allclose(W.numpy(), w_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-5, atol=1e-6)
    if max_norm < 1:
        assert min(norms) > max_norm  # the small limit really clipped


def test_sgd_is_refused_clearly_and_changes_nothing():
    W = ag.param(_w0(), name="W")
    with pytest.raises(ot.OrtrainError, match="optimizer expected an ot.optim.Adam or AdamW holding the params to "
                                              "train, received SGD; a captured step updates with Adam only"):
        ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=ot.optim.SGD([W], lr=0.1))
    np.testing.assert_array_equal(W.numpy(), _w0())


def test_reading_or_writing_a_param_inside_fn_is_refused_and_changes_nothing():
    # W.numpy() inside fn was recorded as a constant of the first call: a "detached" target kept
    # the first weights (losses 2.25, 1.44, 0.82 where the live target gives 2.25, 3.24, 4.40)
    Xn = np.full((3, 4), 2.0, np.float32)
    W = ag.param(np.full((2, 3), 0.5, np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    buf = ag.buffer(np.ones((4, 3), np.float32), name="table")
    for fn, call in ((lambda x, x_next: ag.mse_loss(W @ x, ag.matmul(W.numpy(), x_next)), r"W\.numpy\(\)"),
                     (lambda x, x_next: ag.mse_loss(W @ x, W @ x_next * float(buf.numpy().sum())),
                      r"table\.numpy\(\)"),
                     (lambda x, x_next: (W.assign(np.zeros((2, 3))), ag.mse_loss(W @ x, W @ x_next))[1],
                      r"W\.assign\(value\)"),
                     (lambda x, x_next: (buf.write(0, np.zeros(3)), ag.mse_loss(W @ x, W @ x_next))[1],
                      r"table\.write\(rows, values\)")):
        with pytest.raises(ot.OrtrainError, match=rf"capture_step: {call} inside fn .*as fn is recorded.*frozen "
                                                  r"ag\.param\(\.\.\., trainable=False\) and assign\(\) it"):
            ot.capture_step(fn, optimizer=opt)(x=X, x_next=Xn)
        np.testing.assert_array_equal(W.numpy(), np.full((2, 3), 0.5, np.float32))
        np.testing.assert_array_equal(buf.numpy(), np.ones((4, 3), np.float32))
        assert opt.step == 0 and opt.state()["moments"] == {}
    with pytest.raises(ot.OrtrainError, match=r"capture: table\.numpy\(\) inside fn"):
        ot.capture(lambda x: ag.sum(x) * float(buf.numpy().sum()))(x=X)
    # a copy of a param, and another captured call, inside fn also ran once (a copied target kept
    # its first value; a step run inside a capture's fn updated once for four calls)
    for copying in (copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))):
        with pytest.raises(ot.OrtrainError, match=r"capture: a copy of W \(copy, deepcopy or pickle\) inside fn reads "
                                                  r"the value once"):
            ot.capture(lambda x, c=copying: ag.sum(c(W) @ x))(x=X)
    inner = ot.capture(lambda x: ag.sum(W @ x))
    for fn in (lambda x, x_next: ag.mse_loss(W @ x, W @ x_next * float(inner(x=X))),
               lambda x, x_next: (ot.capture_step(lambda x: ag.mse_loss(W @ x, Xn[:2]), optimizer=opt)(x=X),
                                  ag.mse_loss(W @ x, W @ x_next))[1]):
        with pytest.raises(ot.OrtrainError, match=r"(capture|capture_step) called while this thread records another "
                                                  r"capture's fn: called inside that fn, it would run once"):
            ot.capture_step(fn, optimizer=opt)(x=X, x_next=Xn)
        np.testing.assert_array_equal(W.numpy(), np.full((2, 3), 0.5, np.float32))
        assert opt.step == 0 and opt.state()["moments"] == {}
    assert float(inner(x=X)) == pytest.approx(float((W.numpy() @ X).sum()))  # outside fn it runs as before
    # the form the message advises: a frozen target assigned between calls, read at each call
    target = ag.param(W.numpy(), name="target", trainable=False)
    train = ot.capture_step(lambda x, x_next: ag.mse_loss(W @ x, target @ x_next), optimizer=opt)
    for _ in range(3):
        w = W.numpy()
        np.testing.assert_allclose(float(train(x=X, x_next=Xn)), np.mean((w @ X - w @ Xn) ** 2), rtol=1e-6)
        target.assign(W.numpy())
    assert opt.step == 3
    # outside fn both work as before
    W.assign(np.zeros((2, 3)))
    buf.write(0, np.zeros(3))
    assert not W.numpy().any() and not buf.numpy()[0].any()


def test_a_held_param_listed_in_params_is_frozen_and_keeps_its_moments():
    W, b = ag.param(_w0(), name="W"), ag.param(np.zeros((2, 1), np.float32), name="b")
    opt = ot.optim.Adam([W, b], lr=0.1)
    fn = lambda x, y: ag.mse_loss(W @ x + b, y)  # noqa: E731

    def grads(w, bias):
        d = 2 * (w @ X + bias - Y) / Y.size
        return d @ X.T, d.sum(axis=1, keepdims=True)

    first = ot.capture_step(fn, optimizer=opt)   # both train once: b gets moments
    first(x=X, y=Y)
    first.free()
    ref = NumpyAdam([_w0(), np.zeros((2, 1))], lr=0.1)
    ref.step(grads(*ref.p))
    b_then, moments_then = b.numpy().copy(), opt.state()["moments"]["b"]
    np.testing.assert_allclose(b_then, ref.p[1], rtol=1e-5, atol=1e-7)
    train = ot.capture_step(fn, optimizer=opt, params=[b])   # held by opt, listed: frozen
    for _ in range(3):
        train(x=X, y=Y)
        g_w, _ = grads(ref.p[0], b_then)
        ref.step([g_w, np.zeros_like(b_then)])   # only W's update is compared
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-5, atol=1e-6)  # float32 against float64
    np.testing.assert_array_equal(b.numpy(), b_then)
    state = opt.state()
    for k in ("m", "v"):
        np.testing.assert_array_equal(state["moments"]["b"][k], moments_then[k])
    assert state["step"] == 4


def test_adamw_weight_decay_matches_pytorch(rng):
    torch = torch_or_skip()
    W = ag.param(_w0(4), name="W")
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=ot.optim.AdamW([W], lr=0.05,
                                                                                         weight_decay=0.1))
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), Y) for _ in range(4)]
    losses = [float(train(x=x, y=y)) for x, y in batches]
    ref, _, (w_ref,) = _torch_run(torch, [_w0(4)], _mse(torch), batches, opt="adamw", lr=0.05, weight_decay=0.1)
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(W.numpy(), w_ref, rtol=1e-5, atol=1e-6)


# -- non-finite refusal ------------------------------------------------------------------------------
def _snapshot(opt, *params):
    st = opt.state()
    return [p.numpy().tobytes() for p in params], st["step"], {
        k: (v["m"].tobytes(), v["v"].tobytes()) for k, v in st["moments"].items()}


@pytest.mark.parametrize("max_norm", [1.0, None])
def test_inf_input_refused_before_update_then_training_continues_like_pytorch(rng, max_norm):
    torch = torch_or_skip()
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32))
               for _ in range(5)]
    bad = batches[2][0].copy()
    bad[1, 2] = np.inf
    W = ag.param(_w0(5), name="W")
    opt = ot.optim.Adam([W], lr=1e-2)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt, max_grad_norm=max_norm)
    for x, y in batches[:2]:
        train(x=x, y=y)
    before = _snapshot(opt, W)
    with pytest.raises(ot.NonFiniteError, match="the loss is (inf|nan); the update was refused"):
        train(x=bad, y=batches[2][1])
    assert _snapshot(opt, W) == before  # weights, moments and step bit for bit
    assert opt.step == 2
    for x, y in batches[2:]:
        train(x=x, y=y)
    _, _, (w_ref,) = _torch_run(torch, [_w0(5)], _mse(torch), batches, lr=1e-2, max_norm=max_norm)
    np.testing.assert_allclose(W.numpy(), w_ref, rtol=1e-5, atol=1e-6)
    assert opt.step == 5


def test_a_refused_first_call_leaves_the_optimizer_state_as_it_was(rng):
    # The first call opens the session, with zero moments; a refused update then showed those in
    # opt.state() (an empty dict before), though no update made them.
    W = ag.param(_w0(5), name="W")
    opt = ot.optim.Adam([W], lr=1e-2)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    before = _snapshot(opt, W)
    assert before[2] == {}
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    with pytest.raises(ot.NonFiniteError):
        train(x=np.full_like(x, np.inf), y=y)
    assert _snapshot(opt, W) == before
    train(x=x, y=y)
    assert opt.step == 1 and set(opt.state()["moments"]) == {"W"}
    g = 2 * ((_w0(5) @ x - y) / y.size) @ x.T  # Adam's first step: m = 0.1 g, v = 0.001 g^2
    np.testing.assert_allclose(opt.state()["moments"]["W"]["m"], 0.1 * g, rtol=1e-5, atol=1e-8)
    train.free()
    assert set(opt.state()["moments"]) == {"W"}


# -- tables, frozen weights, outputs -----------------------------------------------------------------
def test_embedding_rows_and_frozen_weight_match_pytorch(rng):
    torch = torch_or_skip()
    e0 = rng.standard_normal((10, 4)).astype(np.float32)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    E, W = ag.param(e0, name="E"), ag.param(w0, name="W", trainable=False)
    opt = ot.optim.Adam([E, W], lr=0.05)
    train = ot.capture_step(lambda idx, y: ag.softmax_cross_entropy_loss(ag.linear(ag.get_rows(E, idx), W), y),
                            optimizer=opt)
    batches = [(rng.integers(0, 10, 6), rng.integers(0, 3, 6)) for _ in range(4)]
    losses = [float(train(idx=i, y=y)) for i, y in batches]
    et = torch.tensor(e0, requires_grad=True)
    wt = torch.tensor(w0)
    o = torch.optim.Adam([et], lr=0.05)
    ref = []
    for i, y in batches:
        o.zero_grad()
        loss = torch.nn.functional.cross_entropy(et[torch.from_numpy(i)] @ wt.T, torch.from_numpy(y))
        loss.backward()
        o.step()
        ref.append(float(loss.detach()))
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(E.numpy(), et.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert W.numpy().tobytes() == w0.tobytes()
    assert set(opt.state()["moments"]) == {"E"}


def test_buffer_rows_written_between_calls_without_retracing(rng):
    table = np.zeros((8, 2), np.float32)
    buf = ag.buffer(table, name="replay")
    W = ag.param(np.eye(2, dtype=np.float32), name="W")
    calls = []

    def fn(idx):
        calls.append(1)
        rows = ag.get_rows(buf, idx)
        return {"loss": ag.mean(rows @ W), "rows": rows}

    train = ot.capture_step(fn, optimizer=ot.optim.Adam([W], lr=0.0))
    idx = np.array([1, 5, 7])
    np.testing.assert_array_equal(train(idx=idx)["rows"], np.zeros((3, 2)))
    buf.write(5, np.array([[1.0, 2.0], [3.0, 4.0]]))        # rows 5 and 6
    buf.write([1, 7], np.array([[9.0, 9.0], [-1.0, 0.5]]))
    out = train(idx=idx)
    np.testing.assert_array_equal(out["rows"], [[9, 9], [1, 2], [-1, 0.5]])
    np.testing.assert_allclose(out["loss"], np.mean([[9, 9], [1, 2], [-1, 0.5]]), rtol=1e-6)
    assert len(calls) == 1
    np.testing.assert_array_equal(buf.numpy()[5:7], [[1, 2], [3, 4]])
    before = buf.numpy().tobytes()
    with pytest.raises(ot.ShapeError, match=r"replay.write: row indices must lie in \[0, 7\], received values "
                                            r"from 2 to 8"):
        buf.write([2, 8], np.ones((2, 2)))
    with pytest.raises(ot.ShapeError, match=r"replay.write: values expected shape \(2, 2\)"):
        buf.write([2, 3], np.ones((2, 3)))
    with pytest.raises(ot.ShapeError, match=r"rows 7..8 do not fit a buffer of 8 rows"):
        buf.write(7, np.ones((2, 2)))
    assert buf.numpy().tobytes() == before
    np.testing.assert_array_equal(train(idx=idx)["rows"], [[9, 9], [1, 2], [-1, 0.5]])
    with pytest.raises(ot.ShapeError, match=r"input 'idx' holds indices for get_rows into 8 entries; its values "
                                            r"must lie in \[0, 7\], received values from 0 to 8"):
        train(idx=np.array([0, 8, 1]))
    assert train.optimizer.step == 3


def test_a_held_param_the_loss_does_not_use_is_left_alone():
    W, V = ag.param(_w0(1), name="W"), ag.param(_w0(2), name="V")
    opt = ot.optim.Adam([W, V], lr=0.1)
    train = ot.capture_step(lambda x, y: {"loss": ag.mse_loss(V @ x, y), "w": W * 2.0}, optimizer=opt,
                            max_grad_norm=1.0)
    out = train(x=X, y=Y)
    np.testing.assert_array_equal(out["w"], _w0(1) * 2)
    assert W.numpy().tobytes() == _w0(1).tobytes() and not np.array_equal(V.numpy(), _w0(2))
    assert set(opt.state()["moments"]) == {"V"}


def test_dict_outputs_are_pre_update_values():
    W = ag.param(_w0(6), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    train = ot.capture_step(lambda x, y: {"loss": ag.mse_loss(W @ x, y), "w": W, "pred": W @ x}, optimizer=opt)
    for _ in range(3):
        w_before = W.numpy()
        out = train(x=X, y=Y)
        assert list(out) == ["loss", "w", "pred"]
        np.testing.assert_array_equal(out["w"], w_before)
        np.testing.assert_allclose(out["pred"], w_before @ X, rtol=1e-6)
        np.testing.assert_allclose(out["loss"], np.mean((w_before @ X) ** 2), rtol=1e-5)
        assert not np.array_equal(W.numpy(), w_before)


# -- optimizer state ----------------------------------------------------------------------------------
def test_state_round_trip_into_a_new_capture_continues_exactly(rng):
    torch = torch_or_skip()
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32))
               for _ in range(6)]
    W = ag.param(_w0(7), name="W")
    opt = ot.optim.Adam([W], lr=0.02)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    for x, y in batches[:3]:
        train(x=x, y=y)
    state, weights = opt.state(), W.numpy()
    assert state["step"] == 3 and state["lr"] == 0.02 and set(state["moments"]["W"]) == {"m", "v"}
    train.free()
    np.testing.assert_array_equal(W.numpy(), weights)
    assert opt.state()["moments"]["W"]["m"].tobytes() == state["moments"]["W"]["m"].tobytes()

    W2 = ag.param(weights, name="W")
    opt2 = ot.optim.Adam([W2], lr=0.5)
    opt2.load_state(state)
    assert opt2.lr == 0.02 and opt2.step == 3
    train2 = ot.capture_step(lambda x, y: ag.mse_loss(W2 @ x, y), optimizer=opt2)
    for x, y in batches[3:]:
        train2(x=x, y=y)
    _, _, (w_ref,) = _torch_run(torch, [_w0(7)], _mse(torch), batches, lr=0.02)
    np.testing.assert_allclose(W2.numpy(), w_ref, rtol=1e-5, atol=1e-6)
    assert opt2.step == 6


def test_load_state_into_a_live_capture_rewinds_the_optimizer(rng):
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), Y) for _ in range(3)]
    W = ag.param(_w0(8), name="W")
    opt = ot.optim.Adam([W], lr=0.05)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    train(*batches[0])
    state, w1 = opt.state(), W.numpy()
    train(*batches[1])
    train(*batches[2])
    w3 = W.numpy()
    opt.load_state(state)   # moments and step of after call 1; the weights stay where they are
    W.assign(w1)
    train(*batches[1])
    train(*batches[2])
    np.testing.assert_array_equal(W.numpy(), w3)
    assert opt.step == 3


def test_load_state_refuses_mismatched_moments_and_changes_nothing():
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=0.05)
    bad = {"name": "adam", "step": 1, "lr": 0.1, "moments": {"W": {"m": np.zeros((3, 2)), "v": np.zeros((3, 2))}}}
    with pytest.raises(ot.OrtrainError, match=r"moment 'm' of 'W' has shape \(3, 2\), the param \(2, 3\)"):
        opt.load_state(bad)
    with pytest.raises(ot.OrtrainError, match=r"moments of 'W' expected a dict with keys \['m', 'v'\]"):
        opt.load_state({"step": 1, "moments": {"W": {"m": np.zeros((2, 3))}}})
    z = np.zeros((2, 3))
    for moments, message in (({"W": {"m": z, "v": -np.ones((2, 3))}}, r"moment 'v' of 'W' holds -1.0; it needs "
                                                                      r"finite values >= 0"),
                             ({"W": {"m": np.full((2, 3), np.nan), "v": z}}, "moment 'm' of 'W' holds nan"),
                             ({"Q": {"m": z, "v": z}}, "moments of 'Q', which this optimizer does not hold "
                                                       r"\(its params: 'W'\)"),
                             ([z, z], r"'moments' expected a dict \{param name: "),
                             ({"W": {"m": "m", "v": "v"}}, "moment 'm' of 'W': expected a numeric array castable to float32, received dtype <U")):
        with pytest.raises(ot.OrtrainError, match=message):
            opt.load_state({"step": 1, "moments": moments})
    assert opt.step == 0 and opt.lr == 0.05 and opt.state()["moments"] == {}


def test_changed_step_counter_is_read_on_the_next_call():
    torch = torch_or_skip()
    W = ag.param(_w0(9), name="W")
    opt = ot.optim.Adam([W], lr=0.05)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    train(x=X, y=Y)
    opt.step = 10   # bias correction now uses step 11
    train(x=X, y=Y)
    wt = torch.tensor(_w0(9), requires_grad=True)
    o = torch.optim.Adam([wt], lr=0.05)
    for i in range(2):
        o.zero_grad()
        torch.mean((wt @ torch.from_numpy(X)) ** 2).backward()
        if i == 1:
            o.state[wt]["step"].fill_(10)
        o.step()
    np.testing.assert_allclose(W.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-7)
    assert opt.step == 11


# -- errors ------------------------------------------------------------------------------------------
def test_shape_and_dtype_errors_name_the_input_and_change_nothing():
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    train(x=X, y=Y)
    before = _snapshot(opt, W)
    with pytest.raises(ot.ShapeError, match=r"input 'x' expected shape \(3, 4\) \(fixed by the first call\), "
                                            r"received \(3, 5\); pad or reshape it"):
        train(x=np.ones((3, 5), np.float32), y=Y)
    with pytest.raises(ot.ShapeError, match=r"input 'y' expected shape \(2, 4\) .*received \(1, 4\); pad the "
                                            r"batch to 2 rows"):
        train(x=X, y=np.zeros((1, 4), np.float32))
    with pytest.raises(ot.ShapeError, match=r"fixed the inputs \(x, y\); missing 'y'; unexpected 'z'"):
        train(x=X, z=Y)
    with pytest.raises(ot.ShapeError, match=r"input 'x': expected a numeric array castable to float32, received "
                                            r"dtype <U1"):
        train(x=np.full((3, 4), "a"), y=Y)
    for bad in (X.astype(np.int64), X.astype(np.int32)):  # another input than the one traced
        with pytest.raises(ot.ShapeError, match=r"input 'x' expected float32 values, as the first call fixed it, "
                                                f"received {bad.dtype}; pass float32 arrays"):
            train(x=bad, y=Y)
    assert _snapshot(opt, W) == before
    out = train(x=X.astype(np.float64), y=Y.tolist())   # castable inputs are cast
    assert out.dtype == np.float32 and opt.step == 2
    E = ag.param(_w0(), name="E")
    rows = ot.capture_step(lambda i: ag.sum(ag.get_rows(E, i)), optimizer=ot.optim.Adam([E]))
    rows(i=np.array([0, 1]))
    rows(i=np.array([1, 0], np.int32))   # int32 indices are cast to int64
    with pytest.raises(ot.ShapeError, match=r"input 'i' expected integer indices or labels \(int64\), as the "
                                            r"first call fixed it, received float64"):
        rows(i=np.array([0.0, 1.0]))


def test_freed_capture_raises_and_keeps_trained_values():
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    with ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt) as train:
        train(x=X, y=Y)
        trained, moments = W.numpy(), opt.state()["moments"]["W"]["v"]
    assert train.freed
    with pytest.raises(ot.FreedError, match="this capture_step was freed; capture the function again"):
        train(x=X, y=Y)
    with pytest.raises(ot.FreedError):
        train.set(max_grad_norm=1.0)
    train.free()
    np.testing.assert_array_equal(W.numpy(), trained)
    np.testing.assert_array_equal(opt.state()["moments"]["W"]["v"], moments)
    fwd = ot.capture(lambda x: W @ x)
    np.testing.assert_allclose(fwd(x=X), trained @ X, rtol=1e-6)
    fwd.free()
    with pytest.raises(ot.FreedError, match="this capture was freed"):
        fwd(x=X)


def _mse_of(W):
    return lambda x, y: ag.mse_loss(W @ x, y)


def _adam_step_and_reference():
    """A param, its Adam optimizer (lr 0.1), a captured mean-squared-error step and a float64 numpy
    Adam from the same weights."""
    w0 = _w0()
    W = ag.param(w0, name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    return W, opt, ot.capture_step(_mse_of(W), optimizer=opt), NumpyAdam([w0], lr=0.1)


def test_optimizer_state_read_while_another_thread_frees_the_capture():
    # opt.state() from one thread while another frees the captured step reads the moments either
    # live or as handed over by free(), never a half-freed session (it raised AttributeError).
    import threading
    failures = []
    for _ in range(25):
        W = ag.param(_w0(), name="W")
        opt = ot.optim.Adam([W], lr=0.1)
        train = ot.capture_step(_mse_of(W), optimizer=opt)
        train(x=X, y=Y)
        want = opt.state()["moments"]["W"]["v"]
        stop = threading.Event()

        def read(opt=opt, want=want, stop=stop):
            while not stop.is_set():
                try:
                    np.testing.assert_array_equal(opt.state()["moments"]["W"]["v"], want)
                except Exception as exc:  # noqa: BLE001 - any failure is the finding
                    failures.append(repr(exc))
                    return

        reader = threading.Thread(target=read)
        reader.start()
        train.free()
        stop.set()
        reader.join()
        np.testing.assert_array_equal(opt.state()["moments"]["W"]["v"], want)
    assert failures == []


def test_optimizer_state_read_while_another_thread_steps_is_one_steps_count_and_moments():
    # a captured step takes no lock of its session: opt.state() from another thread reads its
    # count and moments between two calls, never the moments of one update with another's count
    import threading
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    train = ot.capture_step(_mse_of(W), optimizer=opt)
    ref = NumpyAdam([_w0()], lr=0.1)

    def grad(w):
        return 2 * (w @ X - Y) @ X.T / Y.size

    want = {0: (np.zeros_like(_w0()), np.zeros_like(_w0()))}
    for k in range(1, 201):
        ref.step([grad(ref.p[0])])
        want[k] = (ref.m[0].copy(), ref.v[0].copy())
    seen, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            state = opt.state()
            if "W" in state["moments"]:
                seen.append((state["step"], state["moments"]["W"]["m"], state["moments"]["W"]["v"]))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(200):
            train(x=X, y=Y)
            time.sleep(0.0002)  # a turn for the reader between calls
    finally:
        stop.set()
        reader.join()
    assert len({k for k, _, _ in seen}) > 3  # the reads fell between many calls
    for k, m, v in seen:
        np.testing.assert_allclose(m, want[k][0], rtol=1e-4, atol=1e-7, err_msg=f"step {k}")
        np.testing.assert_allclose(v, want[k][1], rtol=1e-4, atol=1e-10, err_msg=f"step {k}")
    train.free()


def test_a_gradient_reset_failing_after_the_update_counts_the_update():
    # the reset after the update raised a raw RuntimeError, and the update went uncounted: the
    # weights and moments of 4 updates with opt.step == 3 (every later bias correction off)
    W, opt, step, ref = _adam_step_and_reference()

    def grad(w):
        return 2 * (w @ X - Y) @ X.T / Y.size

    class FailingReset:  # the runtime's module, whose gradient reset fails once
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def lazy_reset_grad(self):
            step._session._module = self.real
            raise RuntimeError("injected")

    for i in range(4):
        if i == 1:
            step._session._module = FailingReset(step._session._module)
            with pytest.raises(ot.OrtrainError, match=r"gradient reset after the update \(the update ran and is "
                                                      r"counted\): injected"):
                step(x=X, y=Y)
        else:
            step(x=X, y=Y)
        ref.step([grad(ref.p[0])])
    state = opt.state()
    assert state["step"] == 4
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["moments"]["W"]["v"], ref.v[0], rtol=1e-4, atol=1e-9)
    step.free()


def _constant_gradient_step(beta1=0.999):
    """A captured step whose gradient is a constant ``c``: Adam's first moment after k updates is
    ``c * (1 - beta1**k)`` whatever the weights. Returns the step, its input, its optimizer and
    the number of updates a state's moments hold."""
    c = np.tile(np.float32([[0.5, -1.0, 2.0, 0.25]]), (1, 1 << 12))
    W = ag.param(np.zeros(c.shape, np.float32), name="W")
    opt = ot.optim.Adam([W], betas=(beta1, 0.999))
    step = ot.capture_step(lambda c: ag.sum(ag.mul(W, c)), optimizer=opt)

    def updates_in(state):
        m = state["moments"]["W"]["m"][0, :4].astype(np.float64)
        return np.log(1 - m / c[0, :4]) / np.log(beta1)
    return step, c, opt, updates_in


def _steps_until(step, c, stop):
    while not stop.is_set():
        step(c=c)
        time.sleep(0.0001)  # turns for the other thread too (the lock is not fair)


def test_an_optimizer_copied_while_another_thread_steps_holds_one_steps_count_and_moments():
    # __getstate__ copied the count, then waited for the moments while more steps ran: a copy read
    # "step 37, moments of step 43"
    import copy
    import pickle
    import threading
    step, c, opt, updates_in = _constant_gradient_step()
    step(c=c)
    stop = threading.Event()
    stepper = threading.Thread(target=_steps_until, args=(step, c, stop))
    stepper.start()
    try:
        for copies in range(100):
            twin = pickle.loads(pickle.dumps(opt)) if copies % 2 else copy.deepcopy(opt)
            state = twin.state()
            np.testing.assert_allclose(updates_in(state), state["step"], atol=0.05)
    finally:
        stop.set()
        stepper.join()
    assert opt.step > 1
    step.free()


def test_load_state_while_another_thread_steps_keeps_the_loaded_count_with_the_loaded_moments():
    # load_state set the count and moments without waiting for the step in flight, which then wrote
    # its own count over the loaded one: "step 3, moments of step 1", trained on from there
    import threading
    step, c, opt, updates_in = _constant_gradient_step()
    step(c=c)
    saved = opt.state()
    stop = threading.Event()
    stepper = threading.Thread(target=_steps_until, args=(step, c, stop))
    stepper.start()
    try:
        for _ in range(800):
            opt.load_state(saved)
            state = opt.state()
            np.testing.assert_allclose(updates_in(state), state["step"], atol=0.05)
    finally:
        stop.set()
        stepper.join()
    state = opt.state()
    np.testing.assert_allclose(updates_in(state), state["step"], atol=0.1)
    step.free()


def test_set_max_grad_norm_without_retracing():
    W = ag.param(_w0() * 50, name="W")
    traced = []

    def fn(x, y):
        traced.append(1)
        return ag.mse_loss(W @ x, y)

    train = ot.capture_step(fn, optimizer=ot.optim.Adam([W], lr=0.01))
    assert isinstance(train(x=X, y=Y), np.ndarray)
    train.set(max_grad_norm=0.5)
    out = train(x=X, y=Y)
    assert float(out["grad_norm"]) > 0.5 and train.max_grad_norm == 0.5
    train.set(max_grad_norm=None)
    assert isinstance(train(x=X, y=Y), np.ndarray)
    assert len(traced) == 1
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ot.OrtrainError, match="max_grad_norm: expected None or a positive finite number"):
            train.set(max_grad_norm=bad)
    with pytest.raises(ot.OrtrainError, match="set: unknown setting 'lr'; settable: max_grad_norm"):
        train.set(lr=0.1)


def test_refusals_are_clear():
    W = ag.param(_w0(), name="W")
    F = ag.param(_w0(), name="F", trainable=False)
    fn = lambda x, y: ag.mse_loss(W @ x, y)  # noqa: E731
    with pytest.raises(ot.OrtrainError, match="optimizer expected an ot.optim.Adam or AdamW"):
        ot.capture_step(fn)
    with pytest.raises(ot.OrtrainError, match="the optimizer holds no params"):
        ot.capture_step(fn, optimizer=ot.optim.Adam(lr=0.1))
    with pytest.raises(ot.OrtrainError, match="nothing to train"):
        ot.capture_step(lambda x, y: ag.mse_loss(F @ x, y), optimizer=ot.optim.Adam([F]))(x=X, y=Y)
    with pytest.raises(ot.OrtrainError, match="a trainable param must hold floating-point values"):
        ag.param(np.arange(3), name="i")
    with pytest.raises(ot.OrtrainError, match="the dict fn returned has no 'loss' entry"):
        ot.capture_step(lambda x: {"out": W @ x}, optimizer=ot.optim.Adam([W]))(x=X)
    with pytest.raises(ot.ShapeError, match=r"the loss must be a float32 tensor holding one number, received "
                                            r"shape \(2, 4\)"):
        ot.capture_step(lambda x: W @ x, optimizer=ot.optim.Adam([W]))(x=X)
    with pytest.raises(ot.OrtrainError, match="has no value: ag ops record a graph.*Inside fn, return the tensor"):
        ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y) if W @ x else None,
                        optimizer=ot.optim.Adam([W]))(x=X, y=Y)
    with pytest.raises(ot.OrtrainError, match="capture: fn expected a callable, received int"):
        ot.capture(3)
    with pytest.raises(ot.OrtrainError, match="capture: params expected ag.param / ag.buffer objects"):
        ot.capture(fn, params=[np.zeros(2)])
    step = ot.capture_step(fn, optimizer=ot.optim.Adam([W]))
    with pytest.raises(ot.OrtrainError, match="3 positional inputs given, fn names 2; pass the inputs by name"):
        step(X, Y, Y)
    with pytest.raises(ot.OrtrainError, match="input 'x' given twice"):
        step(X, x=X, y=Y)
    assert W.numpy().tobytes() == _w0().tobytes()


# -- several captures over the same params -----------------------------------------------------------
def test_forward_capture_reads_weights_trained_by_a_step():
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    train = ot.capture_step(lambda x, y: ag.mse_loss(ag.dropout(W @ x, 0.5), y), optimizer=opt)
    act = ot.capture(lambda x: {"q": W @ x, "a": ag.relu(ag.dropout(W @ x, 0.5))})
    for _ in range(3):
        train(x=X, y=Y)
        out = act(x=X)
        np.testing.assert_allclose(out["q"], W.numpy() @ X, rtol=1e-6)
        np.testing.assert_allclose(out["a"], np.maximum(W.numpy() @ X, 0), rtol=1e-6)  # no dropout
    assert ot.capture(lambda x: W @ x)(x=X).shape == (2, 4)


def test_two_steps_sharing_weights_run_in_call_order(rng):
    torch = torch_or_skip()
    c0, a0 = _w0(10, (1, 3)), _w0(11, (3, 3))
    C, A = ag.param(c0, name="critic"), ag.param(a0, name="actor")
    critic = ot.capture_step(lambda s, r: ag.mse_loss(C @ s, r), optimizer=ot.optim.Adam([C], lr=0.05))
    actor = ot.capture_step(lambda s: -ag.mean(C @ ag.tanh(A @ s)), optimizer=ot.optim.Adam([A], lr=0.05))
    data = [(rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((1, 5)).astype(np.float32))
            for _ in range(3)]
    ct, at = torch.tensor(c0, requires_grad=True), torch.tensor(a0, requires_grad=True)
    oc, oa = torch.optim.Adam([ct], lr=0.05), torch.optim.Adam([at], lr=0.05)
    for s, r in data:
        critic(s=s, r=r)
        actor(s=s)
        st, rt = torch.from_numpy(s), torch.from_numpy(r)
        oc.zero_grad()
        torch.mean((ct @ st - rt) ** 2).backward()
        oc.step()
        oa.zero_grad()
        (-torch.mean(ct.detach() @ torch.tanh(at @ st))).backward()
        oa.step()
    np.testing.assert_allclose(C.numpy(), ct.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(A.numpy(), at.detach().numpy(), rtol=1e-5, atol=1e-6)
    critic.free()
    actor.free()


def test_state_moments_equal_pytorch_adam_state(rng):
    torch = torch_or_skip()
    batches = [(rng.standard_normal((3, 4)).astype(np.float32), Y) for _ in range(3)]
    W = ag.param(_w0(12), name="W")
    opt = ot.optim.Adam([W], lr=0.01, betas=(0.8, 0.99))
    train = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    for x, y in batches:
        train(x=x, y=y)
    wt = torch.tensor(_w0(12), requires_grad=True)
    o = torch.optim.Adam([wt], lr=0.01, betas=(0.8, 0.99))
    for x, y in batches:
        o.zero_grad()
        torch.mean((wt @ torch.from_numpy(x) - torch.from_numpy(y)) ** 2).backward()
        o.step()
    st = opt.state()
    assert st["step"] == 3 and st["hyperparameters"]["betas"] == [0.8, 0.99]
    np.testing.assert_allclose(st["moments"]["W"]["m"], o.state[wt]["exp_avg"].numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(st["moments"]["W"]["v"], o.state[wt]["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-10)


def test_two_steps_sharing_one_optimizer_continue_its_state(rng):
    torch = torch_or_skip()
    W = ag.param(_w0(13), name="W")
    opt = ot.optim.Adam([W], lr=0.05)
    first = ot.capture_step(lambda x: ag.mean(ag.tanh(W @ x)), optimizer=opt)
    second = ot.capture_step(lambda x, y: ag.mse_loss(W @ x, y), optimizer=opt)
    data = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(4)]
    wt = torch.tensor(_w0(13), requires_grad=True)
    o = torch.optim.Adam([wt], lr=0.05)
    for i, x in enumerate(data):
        xt = torch.from_numpy(x)
        o.zero_grad()
        if i % 2 == 0:
            first(x=x)
            torch.mean(torch.tanh(wt @ xt)).backward()
        else:
            second(x=x, y=Y)
            torch.mean((wt @ xt) ** 2).backward()
        o.step()
    np.testing.assert_allclose(W.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-6)
    # v holds squared gradients: float32 rounding of the two tanh kernels shows at about 1e-5
    np.testing.assert_allclose(opt.state()["moments"]["W"]["v"], o.state[wt]["exp_avg_sq"].numpy(), rtol=1e-4,
                               atol=1e-10)
    assert opt.step == 4


def test_target_network_buffer_and_labels_dqn_style(rng):
    torch = torch_or_skip()
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    states = rng.standard_normal((16, 3)).astype(np.float32)
    W = ag.param(w0, name="online")
    T = ag.param(w0, name="target", trainable=False)
    replay = ag.buffer(np.zeros((16, 3)), name="replay")
    replay.write(0, states)

    def td(idx, a, r):
        s = ag.get_rows(replay, idx)
        q = ag.linear(s, W)
        target = r + 0.9 * ag.linear(s, T)
        return ag.mse_loss(q, target) + 0.0 * ag.softmax_cross_entropy_loss(q, a)

    train = ot.capture_step(td, optimizer=ot.optim.Adam([W], lr=0.05))
    act = ot.capture(lambda idx: ag.linear(ag.get_rows(replay, idx), W))
    wt, tt = torch.tensor(w0, requires_grad=True), torch.tensor(w0)
    o = torch.optim.Adam([wt], lr=0.05)
    for i in range(6):
        idx, a = rng.integers(0, 16, 4), rng.integers(0, 2, 4)
        r = rng.standard_normal((4, 2)).astype(np.float32)
        train(idx=idx, a=a, r=r)
        s = torch.from_numpy(states[idx])
        o.zero_grad()
        torch.mean((s @ wt.T - (torch.from_numpy(r) + 0.9 * s @ tt.T)) ** 2).backward()
        o.step()
        if i == 2:
            T.assign(W.numpy())
            tt = wt.detach().clone()
    np.testing.assert_allclose(W.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(act(idx=np.arange(16)), states @ W.numpy().T, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(replay.numpy(), states)
    with pytest.raises(ot.ShapeError, match=r"input 'a' holds indices for softmax_cross_entropy_loss into 2 "
                                            r"entries; its values must lie in \[0, 1\], received values from 0 to 2"):
        train(idx=np.arange(4), a=np.array([0, 1, 2, 0]), r=np.zeros((4, 2)))
    assert train.optimizer.step == 6


def test_bound_outputs_are_written_in_place_or_copied_when_the_runtime_does_not():
    W = ag.param(_w0(), name="W")
    train = ot.capture_step(lambda x, y: {"loss": ag.mse_loss(W @ x, y), "w": W}, optimizer=ot.optim.Adam([W], lr=0.0))
    train(x=X, y=Y)
    session = train._session
    want = np.mean((_w0() @ X) ** 2)
    mine = [np.zeros((), np.float32), np.zeros((2, 3), np.float32)]
    session.bind_train_outputs(mine)
    session.train_step_into([X, Y])
    np.testing.assert_allclose(mine[0], want, rtol=1e-6)
    assert session._bound[2] is False   # the runtime wrote into the caller's arrays
    other = [np.zeros((), np.float32), np.zeros((2, 3), np.float32)]
    session._bound[1], session._bound[2] = other, True   # arrays the runtime does not write into
    session.train_step_into([X, Y])
    np.testing.assert_allclose(other[0], want, rtol=1e-6)
    np.testing.assert_array_equal(other[1], _w0())
    with pytest.raises(ot.OrtrainError, match="bind_train_outputs: expected 2 contiguous arrays, one per output"):
        session.bind_train_outputs(mine[:1])


def test_clipping_takes_a_finite_norm_beyond_float32_squares():
    # |g| = 1e20: its square overflows float32, the norm does not; the step is clipped, not refused
    W = ag.param(np.ones((1,), np.float32), name="W")
    opt = ot.optim.Adam([W], lr=1e-3)
    step = ot.capture_step(lambda x: ag.sum(ag.mul(W, x)), optimizer=opt, max_grad_norm=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the float32 overflow numpy reported is retried in float64: no warning
        out = step(x=np.array([1e20], np.float32))
    assert out["grad_norm"] == np.float32(1e20)
    g = np.float32(1e20) * np.float32(1.0 / (1e20 + 1e-6))  # the clipped gradient, as in the update
    ref = NumpyAdam([np.ones((1,), np.float32)], lr=1e-3)
    ref.step([np.array([g], np.float32)])
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-6)
    assert opt.state()["step"] == 1
    with pytest.raises(ot.ShapeError, match="missing 'x'; pass the same inputs by name at every call"):
        step()
    step.free()


@pytest.mark.parametrize("where", ["train_step_into", "update"])
def test_an_interrupt_leaves_the_step_counter_matching_the_weights(monkeypatch, where):
    def run(interrupt):
        W = ag.param(_w0(), name="W")
        opt = ot.optim.Adam([W], lr=1e-2)
        step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
        step(x=X, y=Y)
        if interrupt:
            real = getattr(step._session, "_" + where)   # the step calls it under tensor.TURNS

            def interrupted(*args):
                real(*args)
                raise KeyboardInterrupt
            monkeypatch.setattr(step._session, "_" + where, interrupted)
            with pytest.raises(KeyboardInterrupt):
                step(x=X * 2, y=Y)
            monkeypatch.undo()
        elif where == "update":  # the interrupted update ran and counts
            step(x=X * 2, y=Y)
        state = (opt.state()["step"], W.numpy().copy())
        after = step(x=X * 3, y=Y)  # no gradient of the interrupted call left over
        return state, after, W.numpy().copy()

    (step_a, w_a), loss_a, end_a = run(True)
    (step_b, w_b), loss_b, end_b = run(False)
    assert step_a == step_b
    np.testing.assert_array_equal(w_a, w_b)
    np.testing.assert_array_equal(loss_a, loss_b)
    np.testing.assert_array_equal(end_a, end_b)


def test_a_bad_opt_step_is_refused_before_anything_runs():
    W = ag.param(_w0(), name="W")
    opt = ot.optim.Adam([W], lr=1e-2)
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
    step(x=X, y=Y)
    before = W.numpy().copy()
    for bad in (-1, "abc", 2.5):
        with pytest.raises(ot.OrtrainError, match="opt.step: expected the number of updates taken"):
            opt.step = bad
        assert opt.step == 1
        np.testing.assert_array_equal(W.numpy(), before)
    opt._step = 2.5  # a count damaged past the setter (an old pickle) is still refused before a step runs
    with pytest.raises(ot.OrtrainError, match="opt.step: expected the number of updates taken"):
        step(x=X, y=Y)
    np.testing.assert_array_equal(W.numpy(), before)
    opt._step = 1
    with pytest.raises(ot.OrtrainError, match="'step' must be an int from 0 to 2\\*\\*62 - 1"):
        opt.load_state({**opt.state(), "step": 2 ** 70})
    step.free()


def test_a_0d_param_keeps_its_shape_and_its_optimizer_state_round_trips(rng):
    # y = s * (x @ w): a learnt scalar gain. Its value, its moments in opt.state() and assign()
    # keep shape (), and a state read mid-training loads back into the live step.
    s = ag.param(np.float32(1.5))
    w = ag.param(rng.standard_normal(3).astype(np.float32))
    opt = ot.optim.Adam([s, w], lr=0.05)

    def fn(x, y):
        d = ag.matmul(x, w) * s - y
        return ag.mean(d * d)

    step = ot.capture_step(fn, optimizer=opt)
    ref = NumpyAdam([s.numpy(), w.numpy()], lr=0.05)
    for _ in range(4):
        x = rng.standard_normal((5, 3)).astype(np.float32)
        y = rng.standard_normal(5).astype(np.float32)
        step(x=x, y=y)
        sv, wv = ref.p
        d = x.astype(np.float64) @ wv * sv - y
        ref.step([np.mean(2 * d * (x @ wv)), x.T @ (2 * d * sv) / 5])
        assert s.numpy().shape == ()
        np.testing.assert_allclose(s.numpy(), ref.p[0], rtol=1e-5)
        np.testing.assert_allclose(w.numpy(), ref.p[1], rtol=1e-5, atol=1e-6)
        state = opt.state()
        assert state["moments"][s.name]["m"].shape == ()
        np.testing.assert_allclose(state["moments"][s.name]["v"], ref.v[0], rtol=1e-4)
        opt.load_state(state)  # the live step reopens from it and continues exactly
    s.assign(np.float32(2.0))
    assert s.numpy() == np.float32(2.0) and s.numpy().shape == ()
    step.free()
    assert s.numpy() == np.float32(2.0) and s.numpy().shape == ()


def test_a_0d_param_read_alone_trains_and_is_returned():
    # A SAC-style temperature: the loss and an extra output computed from the 0-d param alone
    # (the session holds it as shape (1,), and these outputs failed the runtime's shape check).
    log_alpha = ag.param(np.float32(0.5), name="log_alpha")
    opt = ot.optim.Adam([log_alpha], lr=0.1)
    step = ot.capture_step(lambda target: {"loss": ag.square(log_alpha - 1.0) + ag.mean(target) * 0.0,
                                           "alpha": ag.exp(log_alpha)}, optimizer=opt)
    ref = NumpyAdam([np.float64(0.5)], lr=0.1)
    for _ in range(3):
        a = float(ref.p[0])
        out = step(target=np.ones(4, np.float32))
        assert out["loss"].shape == () and out["alpha"].shape == ()
        np.testing.assert_allclose(out["loss"], (a - 1.0) ** 2, rtol=1e-5)
        np.testing.assert_allclose(out["alpha"], np.exp(a), rtol=1e-5)
        ref.step([2 * (a - 1.0)])
        np.testing.assert_allclose(log_alpha.numpy(), ref.p[0], rtol=1e-5)
    assert log_alpha.numpy().shape == ()


def test_boolean_inputs_are_refused_at_every_call():
    # The first call refused them; later calls cast a boolean mask to row indices 0/1 and gathered.
    E = ag.param(np.arange(10, dtype=np.float32).reshape(5, 2), name="E")
    rows = ot.capture(lambda i: ag.get_rows(E, i))
    with pytest.raises(ot.ShapeError, match=r"capture: input 'i' is boolean; pass 0/1 as float32 or int64"):
        rows(i=np.array([True, False]))
    np.testing.assert_array_equal(rows(i=np.array([3, 4])), [[6, 7], [8, 9]])
    for mask in (np.array([True, False]), [True, False]):
        with pytest.raises(ot.ShapeError, match=r"capture: input 'i' is boolean"):
            rows(i=mask)
    W = ag.param(_w0(3), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x: ag.mean(W @ x), optimizer=opt)
    step(x=np.ones((3, 2), np.float32))
    before = W.numpy().copy()
    with pytest.raises(ot.ShapeError, match=r"capture_step: input 'x' is boolean"):
        step(x=np.ones((3, 2), bool))
    np.testing.assert_array_equal(W.numpy(), before)
    assert opt.step == 1


def test_dropout_draws_on_across_a_reopened_session(rng):
    # A captured step reopens its session when the optimizer's state changed hands (another step
    # sharing it, load_state); it started the dropout masks over, so a step alternating with
    # another drew the same mask at every call. Masks are drawn at the optimizer's step count.
    w0 = rng.standard_normal((8, 4)).astype(np.float32)
    x, y = np.ones((4, 3), np.float32), np.zeros((8, 3), np.float32)

    def losses(alternate: bool, calls: int):
        ot.set_seed(5)
        W = ag.param(w0.copy(), name="W")
        opt = ot.optim.Adam([W], lr=0.0)  # the loss changes with the mask alone
        drop = ot.capture_step(lambda x, y: ag.mse_loss(ag.dropout(ag.matmul(W, x), 0.5), y), optimizer=opt)
        other = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
        out = []
        for _ in range(calls):
            out.append(float(drop(x=x, y=y)))
            if alternate:
                other(x=x, y=y)
        return out

    alone, alternating = losses(False, 9), losses(True, 5)
    assert len(set(alone)) == 9
    assert alternating == alone[::2]  # the masks of the steps counted, not the first one again


def test_a_captured_steps_optimizer_keeps_no_counts_of_a_loaded_model_state():
    # after load_state of a state carrying n_steps and draws, state() went on reporting them
    from ortrain import ag
    w = ag.param(np.ones((2, 3), np.float32), name="W")
    opt = ot.optim.Adam([w], lr=1e-2)
    train = ot.capture_step(lambda x: ag.mean(ag.matmul(w, x)), optimizer=opt)
    train(x=np.ones((3, 4), np.float32))
    opt.load_state({**opt.state(), "n_steps": 3, "draws": 3})
    train(x=np.ones((3, 4), np.float32))
    state = opt.state()
    assert state["step"] == 2 and "n_steps" not in state and "draws" not in state
    train.free()


def test_a_norm_past_float32_is_refused_as_the_reported_inf():
    # norm 4.2e38 (finite in float64) was reported as grad_norm inf, its clip factor flushed to 0 and
    # the step counted: API.md refuses a non-finite norm before the update
    W = ag.param(np.array([[1.0, -1.0]], np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x: ag.sum(ag.mul(W, x)), optimizer=opt, max_grad_norm=1.0)
    with pytest.raises(ot.NonFiniteError, match=r"the gradient norm is 4\.24\d*e\+38; the update was refused"):
        step(x=np.array([[3e38, 3e38]], np.float32))
    np.testing.assert_array_equal(W.numpy(), [[1.0, -1.0]])
    assert opt.step == 0 and opt.state()["moments"] == {}
    out = step(x=np.array([[3.0, 4.0]], np.float32))  # the next step is the first
    assert out["grad_norm"] == np.float32(5.0) and opt.step == 1
    step.free()


def test_a_non_finite_loss_is_refused_with_clipping_too():
    # with max_grad_norm only the norm was checked: an mse overflowing to inf with a finite
    # gradient norm was taken, leaving NaN weights
    W = ag.param(np.ones((1, 2), np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt, max_grad_norm=1e30)
    x, y = np.ones((2, 3), np.float32), np.full((1, 3), 3e38, np.float32)
    with pytest.raises(ot.NonFiniteError, match="the loss is inf; the update was refused"):
        step(x=x, y=y)
    np.testing.assert_array_equal(W.numpy(), np.ones((1, 2), np.float32))
    assert opt.step == 0
    step.free()


def test_steps_sharing_params_called_from_two_threads_lose_no_update():
    # each step copied the other's weights in outside any shared lock and could then swallow the
    # other's change: 102 steps counted, the weights of about 52
    import threading

    def run(threaded):
        W = ag.param(np.ones((2, 3), np.float32), name="W")
        opt = ot.optim.Adam([W], lr=1e-2)
        steps = [ot.capture_step(lambda x: ag.mean(ag.square(ag.matmul(W, x))), optimizer=opt) for _ in range(2)]
        x = np.ones((3, 4), np.float32)
        for s in steps:
            s(x=x)

        def loop(s):
            for _ in range(60):
                s(x=x)
        if threaded:
            threads = [threading.Thread(target=loop, args=(s,)) for s in steps]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for s in steps:
                loop(s)
        out = opt.step, W.numpy()
        for s in steps:
            s.free()
        return out

    (n, alone), (n_threaded, threaded) = run(False), run(True)
    assert n == n_threaded == 122
    np.testing.assert_array_equal(threaded, alone)  # one data, one step: any order gives these weights


def test_a_step_recorded_again_with_a_dropout_seed_resumes_bit_for_bit():
    # ag.dropout drew its seed from ortrain's generator when fn was recorded: a step recorded again
    # after opt.load_state drew other masks (0.7365 for 0.9037 on the first resumed step)
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 2), np.float32)

    def make(w, state=None, seed=7):
        W = ag.param(w, name="W")
        opt = ot.optim.Adam([W], lr=0.05)
        if state is not None:
            opt.load_state(state)
        f = ot.capture_step(lambda x, y: ag.mse_loss(ag.dropout(ag.matmul(x, W), rate=0.5, seed=seed), y),
                            optimizer=opt)
        return W, opt, f

    w0 = np.full((4, 2), 0.3, np.float32)
    W, opt, f = make(w0.copy())
    full = [float(f(x=x, y=y)) for _ in range(6)]
    f.free()
    W, opt, f = make(w0.copy())
    part = [float(f(x=x, y=y)) for _ in range(3)]
    state, w = opt.state(), W.numpy().copy()
    f.free()
    ot.set_seed(123)  # ortrain's generator elsewhere: the masks follow the seed given
    W, opt, f = make(w, state)
    part += [float(f(x=x, y=y)) for _ in range(3)]
    assert part == full and len(set(full)) == 6
    f.free()
    for bad in (-1, 2**63):
        with pytest.raises(ot.OrtrainError, match=r"dropout\(seed=...\)"):
            make(w0.copy(), seed=bad)[2](x=x, y=y)


def test_a_fork_while_another_thread_steps_leaves_the_child_its_own_captured_steps(tmp_path):
    # captured steps take turns through one lock; a child forked while a thread of the parent held it
    # waited forever in its first call of any captured step
    setup = """
        import numpy as np, ortrain as ot
        from ortrain import ag
        W = ag.param(np.ones((256, 256), np.float32), name="W")
        busy = ot.capture_step(lambda x: ag.mean(ag.square(ag.matmul(W, x))), optimizer=ot.optim.Adam([W], lr=1e-6))
        V = ag.param(np.ones((2, 3), np.float32), name="V")
        own = ot.capture_step(lambda x: ag.mean(ag.matmul(V, x)), optimizer=ot.optim.Adam([V], lr=1e-2))
        x, small = np.ones((256, 256), np.float32), np.ones((3, 4), np.float32)
        own(x=small)
        """
    assert forks_that_hang(tmp_path, setup, busy="busy(x=x)", in_child="own(x=small)", forks=10) == "hung 0"

def test_a_clip_factor_below_float32s_smallest_normal_still_clips():
    # norm 1.4e38 with max_grad_norm 1: the factor 7e-39 was flushed to 0, the step taken on zero
    # gradients (the weights did not move, the step was counted)
    W = ag.param(np.array([[1.0, -1.0]], np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x: ag.sum(ag.mul(W, x)), optimizer=opt, max_grad_norm=1.0)
    x = np.array([[1e38, -1e38]], np.float32)
    out = step(x=x)
    norm = float(np.hypot(1e38, 1e38))
    assert out["grad_norm"] == np.float32(norm)
    ref = NumpyAdam([np.array([[1.0, -1.0]], np.float32)], lr=0.1)
    ref.step([(x.astype(np.float64) / norm).astype(np.float32)])  # clipped to norm 1
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-6)
    assert opt.step == 1 and not np.array_equal(W.numpy(), [[1.0, -1.0]])
    step.free()


def test_free_from_another_thread_during_the_first_call_releases_the_session():
    # free() while another thread recorded fn let that call open its session afterwards, kept for good
    import threading
    import time
    W = ag.param(np.ones((2, 3), np.float32), name="W")
    recording = threading.Event()

    def fn(x):
        recording.set()
        time.sleep(0.2)
        return ag.mean(ag.matmul(W, x))

    step = ot.capture_step(fn, optimizer=ot.optim.Adam([W], lr=1e-2))
    first = threading.Thread(target=lambda: step(x=np.ones((3, 4), np.float32)))
    first.start()
    recording.wait()
    step.free()  # waits for the call
    first.join()
    assert step.freed and step._session is None and W._holder is None
    with pytest.raises(ot.FreedError):
        step(x=np.ones((3, 4), np.float32))


def test_a_capture_called_from_several_threads_gives_each_call_its_own_result():
    # the inputs went into buffers shared by all callers before the lock was taken: 12 to 339 of
    # 6,000 calls returned the other thread's result
    import threading
    I3 = ag.param(np.eye(3, dtype=np.float32), name="I3")
    fwd = ot.capture(lambda x: ag.matmul(x, I3))
    fwd(x=np.zeros((2, 3), np.float32))
    wrong = []

    def work(v):
        a = np.full((2, 3), v, np.float32)
        wrong.extend(v for _ in range(1500) if not np.array_equal(fwd(x=a), a))

    threads = [threading.Thread(target=work, args=(v,)) for v in (1.0, 2.0, 3.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    fwd.free()


def test_a_capture_freed_from_another_thread_gives_its_callers_freed_error_only():
    # callers got AttributeError: 'NoneType' object has no attribute 'run'
    import threading
    errors = []
    for _ in range(10):
        I3 = ag.param(np.eye(3, dtype=np.float32), name="I3")
        fwd = ot.capture(lambda x, I3=I3: ag.matmul(x, I3))
        x = np.ones((2, 3), np.float32)
        fwd(x=x)

        def call(fwd=fwd, x=x):
            try:
                while True:
                    fwd(x=x)
            except ot.FreedError:
                return
            except Exception as exc:  # noqa: BLE001 - any other failure is the finding
                errors.append(repr(exc))

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.005)
        fwd.free()
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_a_refused_step_does_not_read_the_optimizer_state_back(monkeypatch):
    # the count is read back (through a checkpoint written to disk) only where the update may have run
    W = ag.param(_w0(), name="W")
    step = ot.capture_step(_mse_of(W), optimizer=ot.optim.Adam([W], lr=0.1))
    step(x=X, y=Y)
    reads = []
    real = step._session.optimizer_state
    monkeypatch.setattr(step._session, "optimizer_state", lambda: reads.append(1) or real())
    with pytest.raises(ot.NonFiniteError):
        step(x=X, y=np.full_like(Y, 3e38))
    assert reads == []
    step.free()


def test_a_second_interrupt_during_the_recovery_of_an_interrupted_captured_update_still_counts_it(monkeypatch):
    W, opt, step, ref = _adam_step_and_reference()
    step(x=X, y=Y)
    ref.step([2 * (ref.p[0] @ X - Y) @ X.T / Y.size])
    session, reads = step._session, []
    monkeypatch.setattr(session, "_update", then_interrupted(session._update))
    monkeypatch.setattr(session, "optimizer_state", interrupted_first(session.optimizer_state, reads))
    with pytest.raises(KeyboardInterrupt):
        step(x=X, y=Y)
    monkeypatch.undo()
    ref.step([2 * (ref.p[0] @ X - Y) @ X.T / Y.size])
    assert len(reads) == 2 and opt.step == 2
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-5, atol=1e-6)
    step.free()


def test_a_capture_collected_while_another_thread_holds_the_turn_does_not_wait_for_it():
    # free() waits for the turn; the collector, which may run in a thread holding a lock the
    # turn's holder waits on, frees without it (a collected capture has no call running)
    import gc
    import threading
    I3 = ag.param(np.eye(3, dtype=np.float32), name="I3")
    fwd = ot.capture(lambda x: ag.matmul(x, I3))
    fwd(x=np.ones((2, 3), np.float32))
    fwd.cycle = fwd  # collected only by the cycle collector
    runner = fwd._runner
    del fwd
    held, release = threading.Event(), threading.Event()

    def hold_the_turn():
        with ag.tensor.TURNS:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    held.wait(10)
    collector = threading.Thread(target=gc.collect)
    collector.start()
    collector.join(5)
    stuck = collector.is_alive()
    release.set()
    holder.join()
    collector.join()
    assert not stuck
    assert runner._sess is None  # its session was released


def test_a_second_interrupt_at_the_start_of_the_recovery_still_counts_the_update(monkeypatch):
    # a second Ctrl-C landing as the recovery began (its lock's wrapper) lost the count
    W, opt, step, ref = _adam_step_and_reference()
    for _ in range(2):
        ref.step([2 * (ref.p[0] @ X - Y) @ X.T / Y.size])
    step(x=X, y=Y)
    session, starts = step._session, []
    monkeypatch.setattr(session, "_update", then_interrupted(session._update))
    monkeypatch.setattr(session, "abandon_step", interrupted_first(session.abandon_step, starts))
    with pytest.raises(KeyboardInterrupt):
        step(x=X, y=Y)
    monkeypatch.undo()
    assert len(starts) == 2 and opt.step == 2
    np.testing.assert_allclose(W.numpy(), ref.p[0], rtol=1e-5, atol=1e-6)
    step.free()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_inside_fn_can_call_captures_after_the_recording(tmp_path):
    # the child's count of recordings went below 0 (reset at the fork, then lowered as fn returned),
    # and every capture or captured step in it was refused as "inside a recording"
    script = tmp_path / "fork_in_fn.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np
        import ortrain as ot
        from ortrain import ag
        from ortrain.ag import tensor
        W = ag.param(np.full((2, 3), 0.5, np.float32), name="W")
        X = np.ones((3, 4), np.float32)
        child = []
        def fn(x):
            if os.fork() == 0:
                child.append(True)
            return ag.sum(W @ x)
        try:
            first = float(ot.capture(fn)(x=X))
            second = float(ot.capture(lambda x: ag.sum(W @ x) * 2.0)(x=X))
            ok = tensor.RECORDING_DEPTH[0] == 0 and first == 12.0 and second == 24.0
        except Exception as exc:
            print(type(exc).__name__, exc, flush=True)
            ok = False
        if child:
            os._exit(0 if ok else 3)
        _, status = os.wait()
        print("parent", ok, "child", os.waitstatus_to_exitcode(status), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout.strip().splitlines()[-1] == "parent True child 0", out.stdout + out.stderr
