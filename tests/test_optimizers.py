"""Optimizers: weights after 5 updates against numpy (and PyTorch), accumulation, schedules."""

import copy
import pickle
import re
import threading
import time

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import NumpyAdam, dense_model, linear_mse_grads

import ortrain as ot
from ortrain import ag

B, NIN, NOUT = 8, 5, 3


@pytest.fixture
def batches(rng):
    return [(rng.standard_normal((B, NIN)).astype(np.float32), rng.standard_normal((B, NOUT)).astype(np.float32))
            for _ in range(5)]


def run_ortrain(optimizer, batches, weight_decay=None, freeze=None):
    model = dense_model(NIN, NOUT, optimizer=optimizer)
    model.set_weights([np.linspace(-1, 1, NIN * NOUT).reshape(NIN, NOUT), np.linspace(0, 0.5, NOUT)])
    if freeze:
        model.freeze(freeze)
    w0 = model.get_weights()
    with ot.Trainer(model, batch_size=B, weight_decay=weight_decay) as tr:
        losses = [tr.step(x, y) for x, y in batches]
        return w0, tr.model().get_weights(), losses


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_family_matches_numpy(kind, batches):
    opt = ot.optim.Adam(lr=0.05, betas=(0.8, 0.95), eps=1e-6) if kind == "adam" else \
        ot.optim.AdamW(lr=0.05, weight_decay=0.1)
    w0, w5, _ = run_ortrain(opt, batches)
    ref = NumpyAdam(w0, lr=0.05, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
    for x, y in batches:
        ref.step(linear_mse_grads(x, y, ref.p[0], ref.p[1]))
    for got, want in zip(w5, ref.p):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sgd_matches_numpy(batches):
    w0, w5, _ = run_ortrain(ot.optim.SGD(lr=0.1), batches)
    w, b = (a.astype(np.float64) for a in w0)
    for x, y in batches:
        gw, gb = linear_mse_grads(x, y, w, b)
        w, b = w - 0.1 * gw, b - 0.1 * gb
    np.testing.assert_allclose(w5[0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w5[1], b, rtol=1e-5, atol=1e-6)


def test_trainer_weight_decay_overrides_compile_and_spares_frozen(batches):
    w0, w5, _ = run_ortrain(ot.optim.Adam(lr=0.05), batches, weight_decay=0.2, freeze="dense_0.bias")
    ref = NumpyAdam([w0[0]], lr=0.05, weight_decay=0.2)
    b = w0[1].astype(np.float64)
    for x, y in batches:
        ref.step([linear_mse_grads(x, y, ref.p[0], b)[0]])
    np.testing.assert_allclose(w5[0], ref.p[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w5[1], w0[1])  # frozen: neither trained nor decayed


def test_sgd_weight_decay_matches_numpy_and_spares_frozen(batches):
    # w -= lr * (g + wd * w): Keras' decoupled decay and PyTorch's coupled one agree without momentum
    for opt, wd in ((ot.optim.SGD(lr=0.1, weight_decay=0.3), None), (ot.optim.SGD(lr=0.1), 0.3)):
        w0, w5, _ = run_ortrain(opt, batches, weight_decay=wd, freeze="dense_0.bias")
        w, b = (a.astype(np.float64) for a in w0)
        for x, y in batches:
            w = w * (1 - 0.1 * 0.3) - 0.1 * linear_mse_grads(x, y, w, b)[0]
        np.testing.assert_allclose(w5[0], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(w5[1], w0[1])  # frozen: neither trained nor decayed


def test_trainer_weight_decay_on_sgd_with_momentum_takes_sgds_form(batches):
    # the docstrings called the Trainer's decay decoupled whatever the optimizer: SGD's enters the
    # velocity, as torch.optim.SGD's does (the same as decoupled without momentum)
    w0, w5, _ = run_ortrain(ot.optim.SGD(lr=0.1, momentum=0.9), batches, weight_decay=0.3)
    assert "SGD adds" in ot.Trainer.__doc__ and "enters the velocity" in ot.Trainer.__doc__
    w, b = (a.astype(np.float64) for a in w0)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for x, y in batches:
        gw, gb = linear_mse_grads(x, y, w, b)
        vw, vb = 0.9 * vw + gw + 0.3 * w, 0.9 * vb + gb + 0.3 * b
        w, b = w - 0.1 * vw, b - 0.1 * vb
    np.testing.assert_allclose(w5[0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w5[1], b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["adam", "adamw", "sgd", "sgd-decay", "sgd-momentum", "sgd-momentum-decay"])
def test_matches_pytorch(kind, batches):
    torch = torch_or_skip()
    opt = {"adam": ot.optim.Adam(lr=0.05), "adamw": ot.optim.AdamW(lr=0.05, weight_decay=0.1),
           "sgd": ot.optim.SGD(lr=0.1), "sgd-decay": ot.optim.SGD(lr=0.1, weight_decay=0.2),
           "sgd-momentum": ot.optim.SGD(lr=0.1, momentum=0.9),
           "sgd-momentum-decay": ot.optim.SGD(lr=0.1, momentum=0.5, weight_decay=0.2)}[kind]
    w0, w5, losses = run_ortrain(opt, batches)
    w = torch.tensor(w0[0], requires_grad=True)
    b = torch.tensor(w0[1], requires_grad=True)
    topt = {"adam": lambda: torch.optim.Adam([w, b], lr=0.05),
            "adamw": lambda: torch.optim.AdamW([w, b], lr=0.05, weight_decay=0.1),
            "sgd": lambda: torch.optim.SGD([w, b], lr=0.1),
            "sgd-decay": lambda: torch.optim.SGD([w, b], lr=0.1, weight_decay=0.2),
            "sgd-momentum": lambda: torch.optim.SGD([w, b], lr=0.1, momentum=0.9),
            "sgd-momentum-decay": lambda: torch.optim.SGD([w, b], lr=0.1, momentum=0.5, weight_decay=0.2)}[kind]()
    tl = []
    for x, y in batches:
        loss = ((torch.tensor(x) @ w + b - torch.tensor(y)) ** 2).mean()
        topt.zero_grad()
        loss.backward()
        topt.step()
        tl.append(loss.item())
    np.testing.assert_allclose(losses, tl, rtol=1e-5)
    np.testing.assert_allclose(w5[0], w.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w5[1], b.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_accumulated_batches_equal_one_larger_batch(rng):
    x = rng.standard_normal((4 * B, NIN)).astype(np.float32)
    y = rng.standard_normal((4 * B, NOUT)).astype(np.float32)
    big = dense_model(NIN, NOUT, optimizer=ot.optim.Adam(lr=0.05))
    acc = big.copy()
    with ot.Trainer(big, batch_size=4 * B) as t1, ot.Trainer(acc, batch_size=B, nbatch_logical=4 * B) as t2:
        for _ in range(3):
            t1.step(x, y)
            for i in range(4):
                before = t2.model().get_weights()
                t2.step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
                moved = not all(np.array_equal(a, b) for a, b in zip(before, t2.model().get_weights()))
                assert moved == (i == 3)  # only on the period boundary
        for a, b in zip(t1.model().get_weights(), t2.model().get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert t2.n_steps == 12 and t2.n_updates == 3


def test_optimizer_argument_errors():
    with pytest.raises(ot.OrtrainError, match="lr: expected a finite number >= 0, received -1"):
        ot.optim.Adam(lr=-1)
    with pytest.raises(ot.OrtrainError, match="weight_decay: expected a number in \\[0, 1\\]"):
        ot.optim.AdamW(weight_decay=2)
    with pytest.raises(ot.OrtrainError, match="betas"):
        ot.optim.Adam(betas=(1.0, 0.9))
    with pytest.raises(ot.OrtrainError, match="optimizer: expected 'adam', 'adamw', 'sgd'"):
        ot.optim.get("rmsprop")
    with pytest.raises(ot.OrtrainError, match="weight_decay: expected a number in \\[0, 1\\]"):
        ot.optim.SGD(weight_decay=-0.1)
    with pytest.raises(ot.OrtrainError, match=r"SGD: nesterov=True: Nesterov momentum is not offered \(onnxruntime-"
                                              r"training's update kernels have no Nesterov form\); use momentum without "
                                              r"it \(ot.optim.SGD\(momentum=0.9\)\), or ot.optim.Adam"):
        ot.optim.SGD(lr=0.1, momentum=0.9, nesterov=True)   # Keras' and PyTorch's name
    for bad in (1.0, -0.1, 0.99999999, "0.9", None, float("nan")):   # 0.99999999 is 1.0 in float32
        with pytest.raises(ot.OrtrainError, match=re.escape(f"momentum: expected a number in [0, 1) (below 1 in float32, "
                                                            f"the runtime's precision), received {bad!r}")):
            ot.optim.SGD(momentum=bad)
    assert ot.optim.SGD(momentum=0.0).lr == 0.01
    assert repr(ot.optim.SGD(momentum=0.9)) == "SGD(lr=0.01, momentum=0.9)"
    assert ot.optim.get({"name": "sgd", "lr": 0.1, "momentum": 0.5}).momentum == 0.5
    W = ag.param(np.zeros((2, 2), np.float32), name="W")
    expected = "params: expected None or a list of ag.param objects (for capture_step), received "
    for call, said in [
            (lambda: ot.optim.AdamW(0.05), "the number 0.05; pass settings by name, e.g. ot.optim.AdamW(lr=0.05) or "
                                           "ot.optim.AdamW(weight_decay=0.05)"),
            (lambda: ot.optim.Adam(np.array(0.1)), "the number 0.1; pass settings by name, e.g. ot.optim.Adam(lr=0.1)"),
            (lambda: ot.optim.Adam(W), "the single param 'W'; wrap it in a list: ot.optim.Adam([W], ...)"),
            (lambda: ot.optim.Adam({"W": W}), "dict; pass a list, e.g. ot.optim.Adam([W, b], lr=1e-3)"),
            (lambda: ot.optim.SGD([W, 3]), "a list holding int 3; create params with ag.param(array, name=...)")]:
        with pytest.raises(ot.OrtrainError, match=re.escape(expected + said)):
            call()
    assert ot.optim.Adam(iter([W])).params == [W] and ot.optim.Adam((W,)).params == [W]  # any iterable
    assert ot.optim.Adam([W, W]).params == [W]  # one param listed twice is held once, as torch does
    with pytest.raises(ot.OrtrainError, match="params: two different params are named 'W'"):
        ot.optim.Adam([W, ag.param(np.ones((3,), np.float32), name="W")])   # state() keys moments by name


def test_learning_rate_is_keras_name_for_lr(batches):
    # a Keras callback writes model.optimizer.learning_rate; the step must take it
    assert ot.optim.Adam(learning_rate=0.1).lr == 0.1 and ot.optim.SGD(learning_rate=0.3).lr == 0.3
    with pytest.raises(ot.OrtrainError, match="lr=0.1 and learning_rate=0.2 name one setting"):
        ot.optim.AdamW(lr=0.1, learning_rate=0.2)
    with pytest.raises(ot.OrtrainError, match="learning_rate: expected a finite number >= 0, received -1"):
        ot.optim.SGD(learning_rate=-1)

    class Halve(ot.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.model.optimizer.learning_rate = self.model.optimizer.learning_rate / 2

    model = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.2))
    w, b = (a.astype(np.float64) for a in model.get_weights())
    hist = ot.fit_generator(model, batches[:1], epochs=2, callbacks=[Halve()], verbose=0)
    for lr in (0.1, 0.05):
        gw, gb = linear_mse_grads(*batches[0], w, b)
        w, b = w - lr * gw, b - lr * gb
    assert hist.history["lr"] == [0.1, 0.05]
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-5, atol=1e-6)


def test_optimizer_defaults_follow_pytorch():
    assert ot.optim.Adam().config() == {"name": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                        "weight_decay": 0.0}
    assert ot.optim.AdamW().weight_decay == 0.01
    assert ot.optim.SGD().lr == 1e-2


def test_schedules():
    s = ot.optim.schedules
    assert [s.step(1.0, drop=0.5, every=2)(t) for t in range(5)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    cos = s.cosine(1.0, total_steps=4, final_lr=0.2)
    np.testing.assert_allclose([cos(t) for t in range(6)],
                               [0.2 + 0.4 * (1 + np.cos(np.pi * min(t, 4) / 4)) for t in range(6)])
    wc = s.warmup_cosine(1.0, warmup_steps=2, total_steps=6)
    np.testing.assert_allclose([wc(t) for t in range(3)], [0.5, 1.0, 1.0])
    with pytest.raises(ot.OrtrainError, match="warmup_steps \\(6\\) must be below total_steps \\(6\\)"):
        s.warmup_cosine(1.0, 6, 6)
    # no warm-up is the plain cosine (as transformers' get_cosine_schedule_with_warmup takes 0)
    np.testing.assert_allclose([s.warmup_cosine(1.0, 0, 4, 0.2)(t) for t in range(6)],
                               [cos(t) for t in range(6)])
    assert wc(0) == 0.5
    with pytest.raises(ot.OrtrainError, match="warmup_steps: expected an int >= 0, received -1"):
        s.warmup_cosine(1.0, -1, 4)
    for sched in (s.step(1.0), cos, wc):
        with pytest.raises(ot.OrtrainError, match="schedule: expected the step .*received nan"):
            sched(float("nan"))
    for make, name, bad in [(lambda: s.step(-0.1), "initial_lr", -0.1), (lambda: s.cosine(0.1, 10, -1), "final_lr", -1),
                            (lambda: s.warmup_cosine(float("nan"), 2, 6), "initial_lr", float("nan")),
                            (lambda: s.step(0.1, drop="half"), "drop", "half")]:
        with pytest.raises(ot.OrtrainError, match=f"^{name}: expected .*received {bad!r}"):
            make()


def _adamw_run(w0, x, y, steps, **hyper):
    W = ag.param(w0, name="W")
    opt = ot.optim.AdamW([W], **hyper)
    step = ot.capture_step(lambda x, y: ag.mse_loss(x @ W, y), optimizer=opt)
    for _ in range(steps):
        step(x=x, y=y)
    return W, opt, step


def test_load_state_restores_the_hyperparameters_as_torch_does(rng):
    w0, x = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    y = np.zeros((4, 2), np.float32)
    hyper = dict(lr=0.05, betas=(0.7, 0.95), eps=1e-4, weight_decay=0.2)
    W, opt, step = _adamw_run(w0, x, y, 1, **hyper)
    saved, w1 = opt.state(), W.numpy()
    step(x=x, y=y)
    want = W.numpy()
    step.free()
    expect = NumpyAdam([w0], lr=0.05, betas=(0.7, 0.95), eps=1e-4, weight_decay=0.2)
    for _ in range(2):
        expect.step([2 * x.T @ (x @ expect.p[0] - y) / y.size])
    np.testing.assert_allclose(want, expect.p[0], rtol=1e-5, atol=1e-6)

    fresh = ot.optim.AdamW([ag.param(w1, name="W")])  # built with the defaults
    fresh.load_state(saved)
    assert fresh.state()["hyperparameters"] == {"betas": [0.7, 0.95], "eps": 1e-4, "weight_decay": 0.2}
    again = ot.capture_step(lambda x, y: ag.mse_loss(x @ fresh.params[0], y), optimizer=fresh)
    again(x=x, y=y)
    np.testing.assert_array_equal(fresh.params[0].numpy(), want)
    again.free()

    # into a live captured step, whose update graph was built with the defaults
    W2, live, step2 = _adamw_run(w0, x, y, 1)
    W2.assign(w1)
    live.load_state(saved)
    step2(x=x, y=y)
    np.testing.assert_array_equal(W2.numpy(), want)
    step2.free()


def test_load_state_refuses_bad_hyperparameters_and_changes_nothing(rng):
    w0, x = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    _, opt, step = _adamw_run(w0, x, np.zeros((4, 2), np.float32), 2, lr=0.01)
    before = opt.state()
    for hyper, message in [({"betas": [1.5, 0.9]}, r"'hyperparameters': betas: expected two numbers in \[0, 1\)"),
                           ({"momentum": 0.9}, r"'hyperparameters' expected a dict with keys among \['betas', "
                                               r"'eps', 'weight_decay'\]"),
                           ({"weight_decay": -1}, r"'hyperparameters': weight_decay")]:
        bad = {**before, "step": 7, "lr": 0.5, "hyperparameters": hyper}
        with pytest.raises(ot.OrtrainError, match=message):
            opt.load_state(bad)
        after = opt.state()
        assert (after["step"], after["lr"], after["hyperparameters"]) == \
               (before["step"], before["lr"], before["hyperparameters"])
        np.testing.assert_array_equal(after["moments"]["W"]["m"], before["moments"]["W"]["m"])
    step.free()

    partial = ot.optim.Adam(betas=(0.5, 0.6))
    partial.load_state({**ot.optim.Adam().state(), "hyperparameters": {"eps": 1e-3}})   # the rest stays
    assert (partial.betas, partial.eps) == ((0.5, 0.6), 1e-3)
    # an SGD's state leaves a decay of 0 out: loading it takes the decay away
    sgd = ot.optim.SGD(weight_decay=0.1)
    sgd.load_state(ot.optim.SGD().state())
    assert sgd.weight_decay == 0.0
    sgd = ot.optim.SGD(momentum=0.9)   # and so does the momentum
    sgd.load_state(ot.optim.SGD().state())
    assert sgd.momentum == 0.0
    with pytest.raises(ot.OrtrainError, match=r"keys among \['weight_decay', 'momentum'\], as SGD.state\(\)"):
        sgd.load_state({**sgd.state(), "hyperparameters": {"betas": [0.9, 0.99]}})


def test_settings_written_between_captured_calls_take_effect_at_the_next_call(rng):
    # As a write to a torch param group's betas, eps or weight_decay: the captured step's next call
    # updates with the new value (it kept the values it was recorded with), and state() says so.
    w0, x = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    y = np.zeros((4, 2), np.float32)
    W, opt, step = _adamw_run(w0, x, y, 2, lr=0.05)
    expect = NumpyAdam([w0], lr=0.05, weight_decay=0.01)
    for _ in range(2):
        expect.step([2 * x.T @ (x @ expect.p[0] - y) / y.size])
    for name, value in [("weight_decay", 0.5), ("betas", (0.5, 0.9)), ("eps", 0.1)]:
        setattr(opt, name, value)
        expect.wd, (expect.b1, expect.b2), expect.eps = opt.weight_decay, opt.betas, opt.eps
        for _ in range(2):
            step(x=x, y=y)
            expect.step([2 * x.T @ (x @ expect.p[0] - y) / y.size])
        np.testing.assert_allclose(W.numpy(), expect.p[0], rtol=1e-5, atol=1e-6)
        assert opt.state()["hyperparameters"][name] == (list(value) if name == "betas" else value)
    assert opt.step == 8
    step.free()


def test_a_bad_write_of_a_setting_is_refused_and_changes_nothing():
    opt = ot.optim.AdamW(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    for name, value, message in [
            ("betas", (1.5, "x"), r"opt.betas: expected two numbers in \[0, 1\), received \(1.5, 'x'\); nothing "
                                  r"changed \(they stay \(0.8, 0.99\)\)"),
            ("betas", (0.999999999, 0.9), r"opt.betas: expected two numbers below 1 in float32"),
            ("eps", -1.0, r"opt.eps: expected a positive number, received -1.0; nothing changed \(it stays 1e-06\)"),
            ("eps", 1e40, r"opt.eps: expected a positive number float32 holds"),
            ("weight_decay", 2.0, r"weight_decay: expected a number in \[0, 1\]")]:
        with pytest.raises(ot.OrtrainError, match=message):
            setattr(opt, name, value)
        assert (opt.betas, opt.eps, opt.weight_decay) == ((0.8, 0.99), 1e-6, 0.1)
    opt.betas = [0.5, 0.6]   # a list, as JSON gives it, is kept as floats
    assert opt.betas == (0.5, 0.6) and opt.state()["hyperparameters"]["betas"] == [0.5, 0.6]
    opt.load_state(opt.state())   # its own state loads


def test_betas_and_eps_written_from_two_threads_stay_a_pair_the_constructor_takes():
    # Each write is checked against the other setting under the lock it is made under: two threads
    # (held back while a captured call runs) could both pass against the old values and leave a
    # pair with eps * (1 - beta_1) below float32's smallest normal.
    from ortrain.ag import tensor
    opt = ot.optim.Adam()
    refused = []

    def write(name, value):
        try:
            setattr(opt, name, value)
        except ot.OrtrainError as exc:
            refused.append(str(exc))

    with tensor.TURNS:
        threads = [threading.Thread(target=write, args=a) for a in (("betas", (0.99999, 0.999)), ("eps", 2e-37))]
        for t in threads:
            t.start()
        time.sleep(0.3)
    for t in threads:
        t.join()
    assert len(refused) == 1
    ot.optim.Adam(betas=opt.betas, eps=opt.eps)


class _Clipped(ot.optim.SGD):
    """A user's optimizer with an ``eps`` of its own (module level: pickled)."""

    def __init__(self, params=None, lr=1e-2, eps=1e-3, weight_decay=0.0, momentum=0.0):
        super().__init__(params, lr, weight_decay, momentum=momentum)
        self.eps = eps


def test_an_optimizer_subclass_keeps_an_eps_of_its_own_through_copies():
    opt = _Clipped(eps=0.05)
    for copied in (copy.copy(opt), copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert copied.eps == 0.05
    adam = pickle.loads(pickle.dumps(ot.optim.Adam(betas=(0.5, 0.6), eps=1e-3)))
    assert (adam.betas, adam.eps) == ((0.5, 0.6), 1e-3)
    opt.load_state({**opt.state(), "hyperparameters": {"eps": 0.2}})   # a setting of its own loads as it is
    assert opt.eps == 0.2 and "_eps" not in vars(opt)


def test_keras_names_of_adams_settings_are_taken():
    opt = ot.optim.Adam(learning_rate=0.01, beta_1=0.8, epsilon=1e-7)
    assert (opt.lr, opt.betas, opt.eps) == (0.01, (0.8, 0.999), 1e-7)
    assert ot.optim.AdamW(beta_2=0.99).betas == (0.9, 0.99)
    with pytest.raises(ot.OrtrainError, match="Adam: betas=\\(0.5, 0.9\\) and beta_1/beta_2=\\(0.8, 0.9\\) name one "
                                              "setting"):
        ot.optim.Adam(betas=(0.5, 0.9), beta_1=0.8)
    with pytest.raises(ot.OrtrainError, match="Adam: eps=1e-06 and epsilon=1e-07 name one setting"):
        ot.optim.Adam(eps=1e-6, epsilon=1e-7)


@pytest.mark.parametrize("eps, b1", [(1e-40, 0.9), (1e-37, 0.9), (5e-46, 0.9), (1e-38, 0.0), (1e-36, 0.99)])
def test_an_eps_the_first_update_flushes_to_zero_is_refused(eps, b1):
    # 1e-40 was accepted and turned a zero gradient's weight into NaN: the runtime divides by
    # (1 - beta_1) * (sqrt(v) + eps), below 1.2e-38 flushed to 0
    for make in (ot.optim.Adam, ot.optim.AdamW):
        with pytest.raises(ot.OrtrainError, match=r"eps: expected at least .* with beta_1=.*NaN"):
            make(eps=eps, betas=(b1, 0.999))
    with pytest.raises(ot.OrtrainError, match=r"'hyperparameters': eps: expected at least"):
        ot.optim.Adam().load_state({"step": 0, "lr": 1e-3, "moments": {}, "hyperparameters": {"eps": 1e-40}})


def _least_eps(b1):
    first = np.float32(1) - np.float32(b1)
    return float(np.nextafter(np.float32(np.finfo(np.float32).tiny / first), np.float32(np.inf)))


@pytest.mark.parametrize("b1", [0.0, 0.9, 0.99])
def test_an_adam_with_the_smallest_eps_it_takes_keeps_a_dead_units_weights(b1):
    eps = _least_eps(b1)
    m = ot.Sequential([ot.layers.Dense(4, activation="relu"), ot.layers.Dense(1)], input_shape=(2,), seed=0)
    w = m.get_weights()
    w[1][0] = -100.0  # a dead unit: its gradients are exactly 0
    m.set_weights(w)
    m.compile(optimizer=ot.optim.Adam(eps=eps, betas=(b1, 0.999)), loss="mse")
    with ot.Trainer(m, batch_size=8) as tr:
        losses = [tr.step(np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)) for _ in range(3)]
        after = tr.model().get_weights()
    assert np.all(np.isfinite(losses))
    np.testing.assert_array_equal(after[0][:, 0], w[0][:, 0])  # the dead unit's weights did not move


@pytest.mark.parametrize("bad", [2.5, None, True, -1, 2 ** 62, "3", np.float32(2)])
def test_setting_a_capture_optimizers_step_to_a_non_count_is_refused_at_once(bad):
    W = ag.param(np.ones((3, 2), np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.01)
    train = ot.capture_step(lambda x: ag.mean(ag.matmul(x, W)), optimizer=opt)
    train(x=np.ones((4, 3), np.float32))
    before = (W.numpy(), opt.state())
    with pytest.raises(ot.OrtrainError, match=r"opt\.step: expected .* an int from 0 to 2\*\*62 - 1.*nothing changed"):
        opt.step = bad
    assert opt.step == 1 and opt.state()["step"] == 1
    opt.step = np.int64(1)  # a numpy int is a count
    assert type(opt.step) is int
    train(x=np.ones((4, 3), np.float32))
    assert opt.state()["step"] == 2 and not np.array_equal(W.numpy(), before[0])


@pytest.mark.parametrize("make", [lambda: ot.optim.schedules.step(0.1, drop=0.5, every=2),
                                  lambda: ot.optim.schedules.cosine(0.1, total_steps=10),
                                  lambda: ot.optim.schedules.warmup_cosine(0.1, 2, 10)])
def test_schedules_take_step_numbers_from_zero_only(make):
    s = make()
    for bad in (-1, 2.5, float("nan"), "3", True):
        with pytest.raises(ot.OrtrainError, match=r"schedule: expected the step .* an int >= 0"):
            s(bad)
    assert s(3.0) == s(3) == s(np.int64(3))


def test_eps_refusals_use_the_name_given():
    with pytest.raises(ot.OrtrainError, match=r"^epsilon: expected at least"):
        ot.optim.Adam(epsilon=1e-40)  # Keras' name
    with pytest.raises(ot.OrtrainError, match=r"^eps: expected a positive number"):
        ot.optim.AdamW(eps=-1.0)


def _momentum_reference(w0, batches, lrs, momentum, weight_decay=0.0):
    """torch.optim.SGD's rule in float64: buf = momentum * buf + (g + wd * w); w -= lr * buf."""
    w, b = (a.astype(np.float64) for a in w0)
    bw, bb = np.zeros_like(w), np.zeros_like(b)
    for (x, y), lr in zip(batches, lrs, strict=True):
        gw, gb = linear_mse_grads(x, y, w, b)
        bw, bb = momentum * bw + gw + weight_decay * w, momentum * bb + gb + weight_decay * b
        w, b = w - lr * bw, b - lr * bb
    return (w, b), (bw, bb)


def test_sgd_momentum_matches_numpy_over_changing_rates_and_reports_its_velocity(batches):
    # PyTorch's rule applies each step's rate to the whole velocity (Keras' folds it in as it goes)
    steps = batches * 8
    lrs = [0.05] * 15 + [0.2] * 10 + [0.01] * 15
    model = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01))
    w0 = model.get_weights()
    with ot.Trainer(model, batch_size=B) as tr:
        for (x, y), lr in zip(steps, lrs):
            tr.set_lr(lr)
            tr.step(x, y)
        got = tr.model().get_weights()
        state = tr.export_state()
    (w, b), (bw, bb) = _momentum_reference(w0, steps, lrs, 0.9, 0.01)
    np.testing.assert_allclose(got[0], w, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], b, rtol=2e-5, atol=1e-6)
    assert state.step == 40
    (m, v), (mb, _) = state.moments["dense_0.kernel"], state.moments["dense_0.bias"]
    np.testing.assert_allclose(m / (1 - np.float32(0.9)), bw, rtol=1e-4, atol=1e-6)  # PyTorch's buffer
    np.testing.assert_allclose(mb / (1 - np.float32(0.9)), bb, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(v, 0)
    model.fit(steps[0][0], steps[0][1], batch_size=B, epochs=1, verbose=0)
    shown = model.optimizer.state()
    assert shown["step"] == 1 and shown["hyperparameters"] == {"weight_decay": 0.01, "momentum": 0.9}
    assert set(shown["moments"]["dense_0.kernel"]) == {"m", "v"}


def test_sgd_momentum_frozen_weight_neither_moves_nor_keeps_a_velocity(batches):
    w0, w5, _ = run_ortrain(ot.optim.SGD(lr=0.1, momentum=0.9), batches, freeze="dense_0.bias")
    np.testing.assert_array_equal(w5[1], w0[1])
    w, b = w0[0].astype(np.float64), w0[1].astype(np.float64)
    buf = np.zeros_like(w)
    for x, y in batches:
        buf = 0.9 * buf + linear_mse_grads(x, y, w, b)[0]
        w = w - 0.1 * buf
    np.testing.assert_allclose(w5[0], w, rtol=1e-5, atol=1e-6)


def test_sgd_momentum_resumes_exactly_through_save_and_state(tmp_path, rng):
    x = rng.standard_normal((64, NIN)).astype(np.float32)
    y = rng.standard_normal((64, NOUT)).astype(np.float32)
    opt = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
    whole = dense_model(NIN, NOUT, optimizer=ot.optim.get(opt))
    whole.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)

    half = dense_model(NIN, NOUT, optimizer=ot.optim.get(opt))
    half.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    half.save(tmp_path / "half.ortrain")
    state = half.optimizer.state()
    loaded = ot.load_model(tmp_path / "half.ortrain")
    assert loaded.optimizer.momentum == 0.9
    loaded.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(loaded.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(a, b)

    # the velocity by state(): into a plain SGD, which takes the momentum with it (as torch's load_state_dict)
    again = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05))
    again.set_weights(half.get_weights())
    again.optimizer.load_state(state)
    assert again.optimizer.momentum == 0.9
    again.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(again.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_sgd_momentum_set_between_fits_starts_a_velocity_and_zero_drops_it(rng):
    x = rng.standard_normal((32, NIN)).astype(np.float32)
    y = rng.standard_normal((32, NOUT)).astype(np.float32)
    model = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05))
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    w0 = model.get_weights()
    model.optimizer.momentum = 0.5
    model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    (w, b), _ = _momentum_reference(w0, [(x, y)] * 3, [0.05] * 3, 0.5)
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-5, atol=1e-6)
    model.optimizer.momentum = 0.0
    w1 = model.get_weights()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    (w, b), _ = _momentum_reference(w1, [(x, y)], [0.05], 0.0)
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-5, atol=1e-6)


def test_sgd_momentum_load_state_refuses_a_second_moment_and_changes_nothing(rng):
    x = rng.standard_normal((16, NIN)).astype(np.float32)
    y = rng.standard_normal((16, NOUT)).astype(np.float32)
    model = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05, momentum=0.9))
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    before = model.optimizer.state()
    bad = {**before, "step": 9, "moments": {n: {"m": ms["m"], "v": np.ones_like(ms["v"])}
                                            for n, ms in before["moments"].items()}}
    with pytest.raises(ot.OrtrainError, match=r"load_state: moment 'v' of 'dense_0.bias' holds 1.0; it needs 0 "
                                              r"\(SGD keeps only a velocity, 'm'\), so the state was not loaded"):
        model.optimizer.load_state(bad)
    after = model.optimizer.state()
    assert after["step"] == before["step"] == 2
    for n in before["moments"]:
        np.testing.assert_array_equal(after["moments"][n]["m"], before["moments"][n]["m"])


def test_load_model_refuses_an_sgd_second_moment_that_is_not_zero(tmp_path, rng):
    import io
    import zipfile
    x = rng.standard_normal((16, NIN)).astype(np.float32)
    y = rng.standard_normal((16, NOUT)).astype(np.float32)
    model = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05, momentum=0.9))
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    model.save(tmp_path / "m.ortrain")
    with zipfile.ZipFile(tmp_path / "m.ortrain") as z:
        parts = {n: z.read(n) for n in z.namelist()}
    moments = dict(np.load(io.BytesIO(parts["optimizer.npz"])))
    assert sorted(moments)[:2] == ["m0", "m1"] and not moments["m1"].any()   # (m, v) of the first weight
    moments["m1"] = np.full_like(moments["m1"], 0.5)
    buf = io.BytesIO()
    np.savez(buf, **moments)
    with zipfile.ZipFile(tmp_path / "bad.ortrain", "w") as z:
        for name, data in {**parts, "optimizer.npz": buf.getvalue()}.items():
            z.writestr(name, data)
    with pytest.raises(ot.OrtrainError, match=r"load_model: '.*bad.ortrain' is damaged: moment 'v' of '[^']+' holds "
                                              r"0.5, where SGD holds it at 0"):
        ot.load_model(tmp_path / "bad.ortrain")
    again = ot.load_model(tmp_path / "m.ortrain")
    model.fit(x, y, batch_size=16, verbose=0)
    again.fit(x, y, batch_size=16, verbose=0)
    for a, b in zip(again.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_sgd_momentum_changed_between_fits_keeps_the_velocity_as_pytorch_does(rng):
    # the runtime holds (1 - momentum) * buf: 0.9 -> 0.99 made the velocity 10 times larger (weights
    # 9.4 relative off PyTorch's), where torch.optim.SGD keeps its momentum_buffer
    torch = torch_or_skip()
    x = rng.standard_normal((16, NIN)).astype(np.float32)
    y = rng.standard_normal((16, NOUT)).astype(np.float32)
    model = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05, momentum=0.9))
    w0 = model.get_weights()
    w = torch.tensor(w0[0], requires_grad=True)
    b = torch.tensor(w0[1], requires_grad=True)
    topt = torch.optim.SGD([w, b], lr=0.05, momentum=0.9)

    def torch_steps(k):
        for _ in range(k):
            topt.zero_grad()
            ((torch.tensor(x) @ w + b - torch.tensor(y)) ** 2).mean().backward()
            topt.step()

    for momentum, steps in ((0.9, 3), (0.99, 3), (0.5, 2), (0.0, 1), (0.8, 2)):
        model.optimizer.momentum = momentum
        topt.param_groups[0]["momentum"] = momentum
        model.fit(x, y, batch_size=16, epochs=steps, verbose=0)
        torch_steps(steps)
        np.testing.assert_allclose(model.get_weights()[0], w.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"momentum {momentum}")
        if momentum:
            buf = topt.state[w]["momentum_buffer"].numpy()
            m = model.optimizer.state()["moments"]["dense_0.kernel"]["m"]
            np.testing.assert_allclose(m / (1 - np.float32(momentum)), buf, rtol=1e-5, atol=1e-7)
    # checked as the constructor checks it; a numpy number is taken as the float it holds
    for bad in (None, 1.0, "0.9"):
        with pytest.raises(ot.OrtrainError, match="momentum: expected a number in \\[0, 1\\)"):
            model.optimizer.momentum = bad
    model.optimizer.momentum = np.float32(0.5)
    model.optimizer.weight_decay = np.float32(0.25)
    assert (type(model.optimizer.momentum), type(model.optimizer.weight_decay)) == (float, float)
    with pytest.raises(ot.OrtrainError, match="weight_decay: expected a number in \\[0, 1\\]"):
        model.optimizer.weight_decay = None
    model.fit(x, y, batch_size=16, verbose=0)   # (the config is JSON: a float32 was a raw TypeError there)
    said = []

    class Switch(ot.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            with pytest.raises(ot.OrtrainError, match="momentum: this model is fitting, .* a running fit's update "
                                                      "graph fixes the momentum"):
                self.model.optimizer.momentum = 0.9
            said.append(epoch)

    model.fit(x, y, batch_size=16, verbose=0, callbacks=[Switch()])
    assert said == [0] and model.optimizer.momentum == 0.5


def test_a_state_with_adams_second_moment_is_refused_by_an_sgd_model(rng):
    x = rng.standard_normal((16, NIN)).astype(np.float32)
    y = rng.standard_normal((16, NOUT)).astype(np.float32)
    adam = dense_model(NIN, NOUT, optimizer=ot.optim.Adam(lr=0.05))
    with ot.Trainer(adam, batch_size=16) as tr:
        tr.step(x, y)
        state = tr.export_state()
    sgd = dense_model(NIN, NOUT, optimizer=ot.optim.SGD(lr=0.05, momentum=0.9))
    with pytest.raises(ot.OrtrainError, match=r"train_state: it holds a second moment \('v'\) of 'dense_0.bias' that "
                                              r"is not 0, as an Adam's state does, and model '.*' is compiled with "
                                              r"SGD, which holds it at 0"):
        sgd.train_state = state
    assert sgd.train_state is None
