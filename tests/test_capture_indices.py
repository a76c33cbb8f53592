"""Indices and class labels computed inside a captured function (read from an ``ag.buffer``, or int
arithmetic on an argument) are range-checked on every call, before anything moves.

onnxruntime checks none of them the way PyTorch does: its SoftmaxCrossEntropyLoss reads past the
classes and its Gather reads a negative index from the end, both without a word.
"""

import numpy as np
import pytest

import ortrain as ot
from ortrain import ag


def _softmax_ce(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


def _state(opt, *params):
    s = opt.state()
    return [p.numpy() for p in params], s["step"], {k: {n: m.copy() for n, m in v.items()} for k, v in s["moments"].items()}


def _same(a, b):
    (wa, sa, ma), (wb, sb, mb) = a, b
    assert sa == sb and ma.keys() == mb.keys()
    for x, y in zip(wa, wb, strict=True):
        np.testing.assert_array_equal(x, y)
    for k in ma:
        assert ma[k].keys() == mb[k].keys()
        for n in ma[k]:
            np.testing.assert_array_equal(ma[k][n], mb[k][n])


@pytest.mark.parametrize("bad", [4, 9, -1])
def test_labels_from_a_buffer_out_of_range_are_refused_and_change_nothing(rng, bad):
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    rows = np.arange(5)
    W = ag.param(w0, name="W")
    labels = ag.buffer(np.array([0, 1, 2, 3, 0], np.int64), name="labels")
    opt = ot.optim.Adam([W], lr=0.1)
    step = ot.capture_step(lambda x, i: ag.softmax_cross_entropy_loss(x @ W, ag.get_rows(labels, i)), optimizer=opt)
    first = float(step(x=x, i=rows))
    assert first == pytest.approx(_softmax_ce(x @ w0, np.array([0, 1, 2, 3, 0])), rel=1e-6)
    before = _state(opt, W)

    labels.write(2, np.array([bad]))
    with pytest.raises(ot.ShapeError, match=r"class labels for softmax_cross_entropy_loss \(computed in fn from "
                                            r"buffer 'labels', input 'i'\) must lie in \[0, 3\]"):
        step(x=x, i=rows)
    _same(_state(opt, W), before)

    # Rows the call does not read may hold anything; mended, the step goes on as if never refused.
    w1 = W.numpy()
    assert float(step(x=x, i=np.array([0, 1, 3, 4, 0]))) == pytest.approx(
        _softmax_ce(x @ w1, np.array([0, 1, 3, 0, 0])), rel=1e-6)
    labels.write(2, np.array([2]))
    step(x=x, i=rows)
    assert opt.step == 3
    step.free()


def test_a_buffer_of_actions_indexing_a_table_refuses_a_negative_row(rng):
    table = rng.standard_normal((5, 2)).astype(np.float32)
    E = ag.param(table, name="E")
    actions = ag.buffer(np.array([0, 1, 4, 3], np.int64), name="actions")
    lookup = ot.capture(lambda i: ag.get_rows(E, ag.get_rows(actions, i)))
    np.testing.assert_array_equal(lookup(i=np.array([2, 0])), table[[4, 0]])

    opt = ot.optim.Adam([E], lr=0.1)
    step = ot.capture_step(lambda i: ag.sum(ag.get_rows(E, ag.get_rows(actions, i))), optimizer=opt)
    step(i=np.array([2, 0]))
    before = _state(opt, E)
    actions.write(2, np.array([-1]))  # onnxruntime's Gather would read the last row
    for call in (lookup, step):
        with pytest.raises(ot.ShapeError, match=r"row indices for get_rows \(computed in fn from buffer 'actions', "
                                                r"input 'i'\) must lie in \[0, 4\], received values from -1 to 0"):
            call(i=np.array([2, 0]))
    _same(_state(opt, E), before)

    actions.write(2, np.array([7]))  # past the table: onnxruntime's Gather would refuse it in its own words
    for call in (lookup, step):
        with pytest.raises(ot.ShapeError, match=r"row indices for get_rows \(computed in fn from buffer 'actions', "
                                                r"input 'i'\) must lie in \[0, 4\], received values from 0 to 7; "
                                                r"nothing was updated\. Write values in range into the buffer"):
            call(i=np.array([2, 0]))
    _same(_state(opt, E), before)
    step.free()
    lookup.free()


def test_indices_from_int_arithmetic_are_checked_and_outputs_keep_their_keys(rng):
    table = rng.standard_normal((4, 3)).astype(np.float32)
    E = ag.param(table, name="E")

    def fn(i):
        rows = ag.get_rows(E, i + 1)
        return {"loss": ag.mean(rows * rows), "rows": rows}

    opt = ot.optim.Adam([E], lr=0.01)
    step = ot.capture_step(fn, optimizer=opt)
    out = step(i=np.array([0, 2]))
    assert sorted(out) == ["loss", "rows"]
    np.testing.assert_array_equal(out["rows"], table[[1, 3]])
    forward = ot.capture(fn)
    assert sorted(forward(i=np.array([1, 1]))) == ["loss", "rows"]

    before = _state(opt, E)
    with pytest.raises(ot.ShapeError, match=r"get_rows \(computed in fn from input 'i'\) must lie in \[0, 3\], "
                                            r"received values from -1 to 1; nothing was updated\. Pass inputs"):
        step(i=np.array([0, -2]))  # onnxruntime's Gather would read the last row
    _same(_state(opt, E), before)
    for call in (step, forward):  # past the table: Gather would refuse it before the range is known
        with pytest.raises(ot.ShapeError, match=r"get_rows \(computed in fn from input 'i'\) must lie in \[0, 3\], "
                                                r"received values from 1 to 4; nothing was updated"):
            call(i=np.array([0, 3]))
    _same(_state(opt, E), before)
    np.testing.assert_array_equal(step(i=np.array([0, 2]))["rows"], before[0][0][[1, 3]])  # goes on as if never refused
    step.free()
    forward.free()
