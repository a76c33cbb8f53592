"""ag.pow (``**``), sqrt, square and abs: values and gradients against PyTorch float64 at edge values
(0, negative bases, integer and fractional exponents), training parity, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import torch_or_skip
from helpers import gradient_probe, probed_grads

import ortrain as ot
from ortrain import ag

# 0, negative bases, |x| < 1 and > 1. (-0.0 is left out: the runtime's Pow and Sqrt give +0 for it where
# PyTorch keeps the sign, so the inf gradient of a root there differs in sign.)
E = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.7, -3.7, 1e-3, -1e-3], np.float32)


def _parity(ag_fn, torch_fn, x=E):
    """(value, gradient) of ``ag_fn(W)`` from a captured step and of ``torch_fn`` in float64 PyTorch.

    The loss sums the finite values only (times a probe), so it stays finite and the step runs; every
    entry still shows its gradient: NaN where the value is NaN, ``inf`` where PyTorch has one."""
    torch = torch_or_skip()
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    ref = torch_fn(t)
    keep = np.flatnonzero(np.isfinite(ref.detach().numpy()))
    probe = np.random.default_rng(3).standard_normal(keep.size).astype(np.float32)
    (ref[keep] * torch.from_numpy(probe.astype(np.float64))).sum().backward()
    W = ag.param(x, name="W")
    opt = gradient_probe([W])

    def fn(pr):
        y = ag_fn(W)
        return {"loss": ag.sum(ag.get_rows(y, keep) * pr), "y": y}
    step = ot.capture_step(fn, optimizer=opt)
    out = step(pr=probe)
    grad = probed_grads(opt)[0]
    step.free()
    return out["y"], grad, ref.detach().numpy(), t.grad.numpy()


def _assert_close(got, want, rtol=2e-6):
    """float32 against float64 within a few roundings; NaN and signed inf at the same places."""
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0)


@pytest.mark.parametrize("p", [0, 1, -1, 2, 3, 4, -2, 0.5, 1.5, 2.5, -0.5, 1 / 3, np.float32(0.5), np.int64(3),
                               np.array(2.0)], ids=repr)
def test_pow_matches_pytorch_at_zero_negative_bases_and_fractional_exponents(p):
    y, g, ry, rg = _parity(lambda w: w ** p, lambda t: t ** float(p))
    _assert_close(y, ry)
    _assert_close(g, rg)
    if float(p) == int(p):   # integer powers of negative bases are defined, as in PyTorch
        assert np.isfinite(y[E != 0]).all()
    else:                    # fractional powers of negative bases are NaN, value and gradient
        assert np.isnan(y[E < 0]).all() and np.isnan(g[E < 0]).all()


def test_integer_powers_of_negative_bases_are_exact():
    W = ag.param(np.array([-2.0, 0.0, 3.0], np.float32), name="W")
    opt = gradient_probe([W])
    step = ot.capture_step(lambda: {"loss": ag.sum(W ** 2), "sq": W ** 2, "cube": ag.pow(W, 3)}, optimizer=opt)
    out = step()
    np.testing.assert_array_equal(out["sq"], [4.0, 0.0, 9.0])       # (-2) ** 2 == 4
    np.testing.assert_array_equal(out["cube"], [-8.0, 0.0, 27.0])
    np.testing.assert_array_equal(probed_grads(opt)[0], [-4.0, 0.0, 6.0])   # d/dx x**2 at -2 is -4
    step.free()


# name: (ag, PyTorch, rtol); rtol 0 where the result is exact. number ** x is exp(x * log(number)), with the
# log rounded once to float32: measured within 2.2e-7 relatively of PyTorch's pow on these values.
OPS = {
    "sqrt": (ag.sqrt, lambda t: t.sqrt(), 1e-6),
    "square": (ag.square, lambda t: t.square(), 1e-6),
    "abs": (ag.abs, lambda t: t.abs(), 0),
    "builtin_abs": (lambda w: abs(w), lambda t: abs(t), 0),
    "pow_function": (lambda w: ag.pow(w, np.float64(2.5)), lambda t: t.pow(2.5), 1e-6),
    "rpow_2": (lambda w: 2.0 ** w, lambda t: 2.0 ** t, 1e-6),
    "rpow_e_numpy_scalar": (lambda w: np.e ** w, lambda t: np.e ** t, 1e-6),
    "rpow_below_one": (lambda w: 0.3 ** w, lambda t: 0.3 ** t, 1e-6),
    "rpow_one_int": (lambda w: 1 ** w, lambda t: 1 ** t, 0),
    "rpow_array_base": (lambda w: np.arange(1, 12, dtype=np.float64) ** w,
                        lambda t: t.new_tensor(np.arange(1, 12, dtype=np.float64)) ** t, 1e-6),
    "pow_number_base": (lambda w: ag.pow(3, w), lambda t: 3 ** t, 1e-6),
    "regulariser_mix": (lambda w: ag.sqrt(w * w + 1e-3) + abs(w) ** 1.5 - ag.square(w - 1.0) / 2 ** w,
                        lambda t: (t * t + 1e-3).sqrt() + t.abs() ** 1.5 - (t - 1.0).square() / 2 ** t, 1e-6),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_roots_squares_abs_and_number_powers_match_pytorch(name):
    ag_fn, torch_fn, rtol = OPS[name]
    y, g, ry, rg = _parity(ag_fn, torch_fn)
    _assert_close(y, ry, rtol)
    _assert_close(g, rg, rtol)


def test_abs_gradient_is_zero_at_zero_and_root_gradient_is_inf_there_as_in_pytorch():
    x = np.array([0.0, 2.0, -2.0], np.float32)
    _, g, _, rg = _parity(ag.abs, lambda t: t.abs(), x=x)
    np.testing.assert_array_equal(g, rg)
    np.testing.assert_array_equal(g[0], 0.0)
    _, g, _, rg = _parity(ag.sqrt, lambda t: t.sqrt(), x=x)
    assert g[0] == rg[0] == np.inf and np.isnan(g[2]) and np.isnan(rg[2])


def test_x_to_the_zero_is_one_with_a_zero_gradient_and_weight_decay_still_applies():
    torch = torch_or_skip()
    x0 = np.array([[0.0, -2.0, 3.5], [1e-3, -0.5, 1.0]], np.float32)
    W = ag.param(x0, name="W")   # read only through W ** 0: still in the step, with gradient 0
    opt = ot.optim.AdamW([W], lr=0.1, weight_decay=0.5)
    train = ot.capture_step(lambda x: {"loss": ag.sum(W ** 0 * x), "y": W ** 0}, optimizer=opt)
    outs = [train(x=np.full((2, 3), 2.0, np.float32)) for _ in range(3)]
    np.testing.assert_array_equal(outs[0]["y"], np.ones((2, 3)))
    assert [float(o["loss"]) for o in outs] == [12.0] * 3
    np.testing.assert_array_equal(opt.state()["moments"]["W"]["m"], np.zeros((2, 3)))
    t = torch.tensor(x0, requires_grad=True)
    topt = torch.optim.AdamW([t], lr=0.1, weight_decay=0.5)
    for _ in range(3):
        topt.zero_grad()
        (t ** 0 * 2.0).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), np.zeros((2, 3)))
        topt.step()
    np.testing.assert_allclose(W.numpy(), t.detach().numpy(), rtol=1e-6)   # decayed, as in PyTorch
    train.free()


def test_a_custom_regularised_loss_trains_as_in_pytorch():
    torch = torch_or_skip()
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    batches = [(rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32))
               for _ in range(6)]
    W = ag.param(w0, name="W")

    def loss_fn(x, y):   # a robust (L1.5) fit, an L1 and a smoothed L2-norm penalty, a softplus-like term
        d = W @ x - y
        return ag.mean(abs(d) ** 1.5) + 0.01 * ag.sum(abs(W)) + 0.1 * ag.sqrt(ag.sum(ag.square(W)) + 1e-6) \
            + ag.mean(ag.log(1.0 + 2.0 ** d))
    train = ot.capture_step(loss_fn, optimizer=ot.optim.Adam([W], lr=0.05))
    losses = [float(train(x=x, y=y)) for x, y in batches]
    t = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Adam([t], lr=0.05)
    ref = []
    for x, y in batches:
        topt.zero_grad()
        d = t @ torch.from_numpy(x) - torch.from_numpy(y)
        loss = (d.abs() ** 1.5).mean() + 0.01 * t.abs().sum() + 0.1 * ((t.square()).sum() + 1e-6).sqrt() \
            + torch.log(1.0 + 2.0 ** d).mean()
        loss.backward()
        topt.step()
        ref.append(float(loss.detach()))
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(W.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
    train.free()


def test_forward_capture_computes_powers_roots_and_abs_as_numpy():
    f = ot.capture(lambda x: {"p": x ** 1.5, "i": x ** -3, "z": x ** 0, "one": x ** 1, "r": 2.0 ** x,
                              "s": ag.sqrt(x), "q": ag.square(x), "a": abs(x)})
    out = f(x=E)
    e = E.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = {"p": e ** 1.5, "i": e ** -3, "z": e ** 0, "one": e, "r": 2.0 ** e, "s": np.sqrt(e),
                "q": e ** 2, "a": np.abs(e)}
    for key, w in want.items():
        assert out[key].dtype == np.float32, key
        np.testing.assert_allclose(out[key], w, rtol=1e-6, atol=0, err_msg=key)   # NaN and inf where numpy's are
    assert out["i"][0] == np.inf and np.isnan(out["p"][E < 0]).all()


# -- refusals ----------------------------------------------------------------------------------------
V = ag.param(np.ones((2, 3), np.float32), name="V", trainable=False)
INTS = ag.buffer(np.arange(6).reshape(2, 3), name="INTS")
REAL = r"p expected a real number \(a Python or numpy int or float\), received "
BASE = (r"base expected positive finite numbers for a tensor exponent \(base \*\* x is computed as "
        r"exp\(x \* log\(base\)\)\), received ")


@pytest.mark.parametrize("bad, message", [
    (lambda w: w ** "2", REAL + r"'2' \(str\); pass an int or a float, e.g. x \*\* 2"),
    (lambda w: w ** None, REAL + r"None \(NoneType\)"),
    (lambda w: w ** True, REAL + r"True \(bool\)"),
    (lambda w: ag.pow(w, [1, 2]), REAL + r"\[1, 2\] \(list\); one exponent per call; for one per element of a "
                                         r"positive base write ag.exp\(ag.log\(x\) \* p\)"),
    (lambda w: w ** np.array([2.0]), REAL + r"array\(\[2.\]\) \(ndarray\); one exponent per call"),
    (lambda w: w ** 1j, REAL + r"1j \(complex\)"),
    (lambda w: w ** float("nan"), r"pow: p expected a finite number within float32's range, received nan"),
    (lambda w: ag.pow(w, -np.inf), r"pow: p expected a finite number within float32's range, received -inf"),
    (lambda w: w ** 1e39, r"pow: p expected a finite number within float32's range, received 1e\+39"),
    (lambda w: w ** 10 ** 400, r"pow: p expected a finite number within float32's range, received 1000+; give a "
                               r"smaller exponent$"),   # the first 40 digits, not 401
    (lambda w: pow(w, 2, 3), r"pow: a modulo is not supported on ag tensors, received pow\(x, p, 3\)"),
    (lambda w: w ** V, REAL + r"Param\('V', .*\); onnxruntime-training has no gradient for a tensor exponent. "
                              r"For a positive base write ag.exp\(p \* ag.log\(x\)\)"),
    (lambda w: ag.pow(w, w * 2.0), r"pow: .*no gradient for a tensor exponent"),
    (lambda w: (-2.0) ** w, BASE + r"-2.0; a zero or negative base has no real logarithm: give a base > 0"),
    (lambda w: 0 ** w, BASE + "0;"),
    (lambda w: np.array([1.0, -1.0, 2.0]) ** w, BASE + r"array\(\[ 1., -1.,  2.\]\)"),
    (lambda w: ag.pow(float("inf"), w), BASE + "inf;"),
    (lambda w: ag.pow("2", w), BASE + "'2';"),
    (lambda w: w + (INTS ** 2), r"pow: expected float32 tensors, received int64"),
    (lambda w: w + ag.sqrt(INTS), r"sqrt: expected float32 tensors, received int64"),
    (lambda w: w + ag.square(INTS), r"square: expected float32 tensors, received int64"),
])
def test_bad_exponents_and_bases_are_refused_with_a_message_and_change_nothing(bad, message):
    W = ag.param(np.full((2, 3), 0.5, np.float32), name="W")
    opt = ot.optim.Adam([W], lr=0.1)
    before = opt.state()
    with pytest.raises(ot.OrtrainError, match=message):
        ot.capture_step(lambda x: ag.sum(bad(W) * x), optimizer=opt)(x=np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(W.numpy(), np.full((2, 3), 0.5))
    after = opt.state()
    assert after["step"] == before["step"] == 0 and after["moments"] == before["moments"] == {}
    step = ot.capture_step(lambda x: ag.sum(W ** 2 * x), optimizer=opt)   # the optimizer still trains
    step(x=np.ones((2, 3), np.float32))
    assert opt.step == 1 and (W.numpy() < 0.5).all()
    step.free()
