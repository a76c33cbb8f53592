"""Models built over free input sizes (``ot.Input((c, None, None))``) check each call's sizes against
their layers: a window larger than the image, lengths a ``Concatenate`` or ``Reshape`` cannot take.
Refused calls change nothing; sizes that fit run as before (values against numpy)."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

import ortrain as ot

L = ot.layers


def _pool_model(layer):
    inp = ot.Input((2, None, None))
    return ot.Model(inp, layer(inp))


def _max_pool(x, k):
    """numpy 'valid' max pooling of (n, c, h, w) with a k x k window and stride k."""
    n, c, h, w = x.shape
    oh, ow = h // k, w // k
    return x[:, :, :oh * k, :ow * k].reshape(n, c, oh, k, ow, k).max(axis=(3, 5))


@pytest.mark.parametrize("layer", [L.MaxPool2D, L.AvgPool2D])
def test_a_pool_refuses_an_image_smaller_than_its_window_instead_of_returning_an_empty_one(layer):
    m = _pool_model(layer(2))
    with pytest.raises(ot.ShapeError) as err:
        m.predict(np.ones((4, 2, 1, 1), np.float32))  # onnxruntime returned shape (4, 2, 0, 0)
    text = str(err.value)
    assert text.startswith("x of shape (4, 2, 1, 1): the model takes (N, 2, N, N)")
    assert f"({layer.__name__})" in text and "pool_size (2, 2) does not fit input (N, 2, 1, 1)" in text
    assert "a height (axis 2) of at least 2 and a width (axis 3) of at least 2" in text


def test_sizes_that_fit_run_and_match_numpy(rng):
    m = _pool_model(L.MaxPool2D(2))
    for h, w in [(2, 2), (5, 7), (3, 2)]:
        x = rng.standard_normal((3, 2, h, w)).astype(np.float32)
        np.testing.assert_array_equal(m.predict(x), _max_pool(x, 2))


def test_only_the_axis_too_small_is_named_with_the_size_the_whole_model_needs():
    inp = ot.Input((2, None, None))
    out = L.Dense(1)(L.GlobalAvgPool2D()(L.Conv2D(3, 3)(L.MaxPool2D(2)(inp))))
    m = ot.Model(inp, out)
    with pytest.raises(ot.ShapeError, match=r"layer 'max_pool2d_0' \(MaxPool2D\).*Give a height \(axis 2\) of at "
                                            r"least 6 \(pad or resize the inputs\)$"):
        m.predict(np.ones((1, 2, 1, 9), np.float32))
    # the pool takes 5 x 5, the convolution after it not: the model needs 6 x 6
    with pytest.raises(ot.ShapeError, match=r"layer 'conv2d_0' \(Conv2D\) refuses them: Conv2D kernel \(3, 3\) does "
                                            r"not fit input \(N, 2, 2, 2\): expected \(batch, channels, height, width\) images no "
                                            r"smaller than the window\. Give a height \(axis 2\) of at least 6 "
                                            r"and a width \(axis 3\) of at least 6"):
        m.predict(np.ones((1, 2, 5, 5), np.float32))
    assert m.predict(np.ones((1, 2, 6, 6), np.float32)).shape == (1, 1)


def _conv_classifier():
    inp = ot.Input((2, None, None))
    m = ot.Model(inp, L.Dense(3, activation="softmax")(L.GlobalAvgPool2D()(L.Conv2D(4, 3, seed=0)(inp))))
    m.compile(optimizer=ot.optim.Adam(lr=1e-2), loss="sparse_categorical_crossentropy")
    return m


def test_fit_and_evaluate_refuse_images_too_small_and_change_nothing(rng):
    m = _conv_classifier()
    y = np.array([0, 1, 2, 0])
    m.fit(rng.standard_normal((4, 2, 5, 5)).astype(np.float32), y, batch_size=4, epochs=1, verbose=0)
    weights, state = m.get_weights(), m.optimizer.state()
    small = rng.standard_normal((4, 2, 2, 2)).astype(np.float32)
    for call in (lambda: m.fit(small, y, batch_size=4, epochs=1, verbose=0), lambda: m.evaluate(small, y, verbose=0),
                 lambda: m.train_on_batch(small, y)):
        with pytest.raises(ot.ShapeError, match=r"x of shape \(4, 2, 2, 2\).*Conv2D kernel \(3, 3\) does not fit"):
            call()
    for a, b in zip(weights, m.get_weights()):
        np.testing.assert_array_equal(a, b)
    after = m.optimizer.state()
    assert after["step"] == state["step"] == 1
    for name, moments in state["moments"].items():
        for k, v in moments.items():
            np.testing.assert_array_equal(v, after["moments"][name][k])


def test_trainer_fit_generator_and_snapshots_refuse_them_too(rng):
    m = _conv_classifier()
    tr = ot.Trainer(m, batch_size=2)
    good = rng.standard_normal((2, 2, 4, 3)).astype(np.float32)
    tr.step(good, np.array([0, 2]))
    before, steps = tr.get_weights(), tr.n_steps
    small = np.zeros((2, 2, 4, 2), np.float32)
    with pytest.raises(ot.ShapeError, match=r"Give a width \(axis 3\) of at least 3"):
        tr.step(small, np.array([0, 2]))
    assert tr.n_steps == steps
    for a, b in zip(before, tr.get_weights()):
        np.testing.assert_array_equal(a, b)
    snap = pickle.loads(pickle.dumps(tr.snapshot()))  # a copy keeps the check, holding no layer weights
    with pytest.raises(ot.ShapeError, match="Conv2D kernel"):
        snap.predict(small)
    np.testing.assert_array_equal(snap.predict(good), tr.predict(good))
    tr.free()

    batches = [(good, np.array([0, 1])), (small, np.array([1, 2]))]
    with pytest.raises(ot.ShapeError, match="Conv2D kernel"):
        ot.fit_generator(_conv_classifier(), iter(batches), epochs=1, steps_per_epoch=2,
                         verbose=0)


def test_lengths_that_must_agree_are_refused_with_sizes_that_fit():
    a, b = ot.Input((None, 4), name="a"), ot.Input((None, 4), name="b")
    m = ot.Model([a, b], L.Concatenate(axis=-1)([a, b]))
    x = {"a": np.ones((2, 3, 4), np.float32), "b": np.ones((2, 5, 4), np.float32)}
    with pytest.raises(ot.ShapeError) as err:  # was onnxruntime's error on the Concat node
        m.predict(x)
    text = str(err.value)
    assert text.startswith("x['a'] of shape (2, 3, 4), x['b'] of shape (2, 5, 4): the model takes (N, N, 4), (N, N, 4)")
    assert "layer 'concatenate_0' (Concatenate) refuses them: Concatenate(axis=-1) needs equal sizes" in text
    assert text.endswith("such as x['a'] of shape (2, 5, 4) (pad or crop the inputs)")
    x["a"] = np.arange(40, dtype=np.float32).reshape(2, 5, 4)
    np.testing.assert_array_equal(m.predict(x), np.concatenate([x["a"], x["b"]], axis=-1))


def test_a_reshape_of_a_free_length_names_a_length_it_takes():
    s = ot.Input((None,), dtype="int64")
    m = ot.Model(s, L.Reshape((-1, 4))(L.Embedding(10, 2, seed=0)(s)))
    with pytest.raises(ot.ShapeError, match=r"6 values a sample, not a multiple of 4.*such as x of shape \(2, 4\)"):
        m.predict(np.ones((2, 3), np.int64))
    idx = np.array([[1, 2, 3, 4]])
    table = m.get_weights()[0]
    np.testing.assert_array_equal(m.predict(idx), table[idx].reshape(1, -1, 4))


def test_the_message_gives_the_layer_s_reason_without_its_advice_to_the_model_and_sizes_below_too():
    inp = ot.Input((2, None, None))
    with pytest.raises(ot.ShapeError) as err:
        ot.Model(inp, L.MaxPool2D(2)(inp)).predict(np.ones((1, 2, 1, 1), np.float32))
    assert "use a smaller pool" not in str(err.value)  # (advice for building a model, not for its data)
    s = ot.Input((None,), dtype="int64")
    m = ot.Model(s, L.Reshape((8,))(L.Embedding(10, 2, seed=0)(s)))  # only a length of 4 fits
    with pytest.raises(ot.ShapeError) as err:
        m.predict(np.ones((1, 5), np.int64))
    text = str(err.value)
    assert "its layer 'reshape_0' (Reshape) refuses them: Reshape(target_shape=(8,)) cannot hold" in text
    assert "reshape_0: Reshape" not in text and "give a target_shape" not in text
    assert text.endswith("such as x of shape (1, 4) (pad or crop the inputs)")
    assert m.predict(np.ones((1, 4), np.int64)).shape == (1, 8)


class _Repeat(L.Layer):
    """A layer of the caller's, whose setting is a list: the layers after it are still checked."""

    def __init__(self, times, name=None):
        super().__init__(name)
        self.times = [int(times)]

    def output_shape(self, input_shapes):
        s = input_shapes[0]
        return (s[0], s[1] * self.times[0], *s[2:])

    def emit(self, ctx, inputs):
        reps = ctx.gb.const([1, self.times[0], 1, 1], np.int64, hint="reps")
        return ctx.gb.op("Tile", [inputs[0], reps])


def test_a_layer_of_the_caller_s_keeps_the_layers_after_it_checked():
    inp = ot.Input((2, None, None))
    m = ot.Model(inp, L.MaxPool2D(2)(_Repeat(2)(inp)))
    with pytest.raises(ot.ShapeError, match=r"layer 'max_pool2d_0' \(MaxPool2D\)"):
        m.predict(np.ones((1, 2, 1, 1), np.float32))
    x = np.arange(2 * 4 * 4, dtype=np.float32).reshape(1, 2, 4, 4)
    np.testing.assert_array_equal(m.predict(x), _max_pool(np.tile(x, (1, 2, 1, 1)), 2))


def test_a_layer_popped_from_a_sequential_is_not_kept_alive_by_the_check():
    import gc
    import weakref
    m = ot.Sequential([L.Conv2D(2, 3), L.MaxPool2D(2)], input_shape=(1, None, None))
    with pytest.raises(ot.ShapeError):
        m.predict(np.ones((1, 1, 2, 2), np.float32))  # (the check is made)
    popped = weakref.ref(m.pop())
    gc.collect()
    assert popped() is None
    assert m.predict(np.ones((1, 1, 3, 3), np.float32)).shape == (1, 2, 1, 1)


def test_at_least_is_said_only_where_larger_sizes_fit_too():
    """Heights h // 2 and ceil(h / 2) added: 2, 3, 4 and every even height fit, 5, 7, 9... not."""
    inp = ot.Input((1, None, None))
    m = ot.Model(inp, L.Add()([L.MaxPool2D((2, 1))(inp), L.Conv2D(1, 1, strides=(2, 1), seed=0)(inp)]))
    with pytest.raises(ot.ShapeError) as err:
        m.predict(np.ones((1, 1, 1, 4), np.float32))
    assert "at least" not in str(err.value) and str(err.value).endswith("such as x of shape (1, 1, 2, 4) (pad or "
                                                                        "crop the inputs)")
    for h in (2, 3, 4, 6):
        assert m.predict(np.ones((1, 1, h, 4), np.float32)).shape == (1, 1, (h + 1) // 2, 4)  # (1 broadcasts)
    with pytest.raises(ot.ShapeError, match=r"received \(N, 1, 2, 4\), \(N, 1, 3, 4\)"):
        m.predict(np.ones((1, 1, 5, 4), np.float32))


@pytest.mark.parametrize("shape, layer, said", [
    ((None, 5), lambda: L.BatchNorm(), "received (N, N, 5); it normalises axis 1, which must have a known size"),
    ((3, None), lambda: L.LayerNorm(), "received (N, 3, N); give the last axis its size"),
    ((1, None, None), lambda: L.MaxPool2D(2, padding="same"), "needs a known height"),
    ((1, None, None), lambda: L.AvgPool2D(3, strides=1, padding="same"), "needs a known height and width"),
])
def test_layers_that_need_a_known_size_say_so_with_the_fix_when_built(shape, layer, said):
    with pytest.raises(ot.ShapeError, match=re.escape(said)):
        layer()(ot.Input(shape))


def test_sizes_that_must_agree_across_axes_get_sizes_that_fit_not_at_least():
    inp = ot.Input((1, None, None))
    p = L.MaxPool2D(2)(inp)
    m = ot.Model(inp, L.Concatenate()([p, L.Permute((1, 3, 2))(p)]))  # a height equal to the width
    with pytest.raises(ot.ShapeError) as err:
        m.predict(np.ones((1, 1, 1, 1), np.float32))
    assert str(err.value).endswith("such as x of shape (1, 1, 2, 2) (pad or crop the inputs)")  # (2 x 4 is refused)
    with pytest.raises(ot.ShapeError, match=r"such as x of shape \(1, 1, 4, 4\)"):
        m.predict(np.ones((1, 1, 2, 4), np.float32))
    assert m.predict(np.ones((1, 1, 4, 4), np.float32)).shape == (1, 2, 2, 2)


def test_sizes_far_above_are_found_and_a_search_in_vain_stays_short():
    import time
    inp = ot.Input((1, None, None))
    x = inp
    for _ in range(10):
        x = L.MaxPool2D(2)(x)
    with pytest.raises(ot.ShapeError, match=r"a height \(axis 2\) of at least 1024 and a width \(axis 3\) of at "
                                            r"least 1024"):
        ot.Model(inp, x).predict(np.ones((1, 1, 8, 8), np.float32))
    x = inp
    for _ in range(300):
        x = L.Conv2D(1, 1, seed=0)(x)
    m = ot.Model(inp, L.Reshape((4999, 4999))(x))  # no image of up to 2 ** 16 rows fits
    start = time.perf_counter()
    with pytest.raises(ot.ShapeError, match=r"the target holds 24990001\. Give inputs of sizes the layers take$"):
        m.predict(np.ones((1, 1, 3, 3), np.float32))
    assert time.perf_counter() - start < 2.0  # (a budget of the layers' rules; about 0.05 s)


def test_at_least_is_checked_at_multiples_too_and_a_quadratic_model_s_search_stays_short():
    import time
    inp = ot.Input((1, None, None))  # heights 128 to 255 fit, 256 not (2 + 4 rows do not broadcast)
    m = ot.Model(inp, L.Add()([L.MaxPool2D((64, 1))(inp), L.MaxPool2D((128, 1))(inp)]))
    with pytest.raises(ot.ShapeError) as err:
        m.predict(np.ones((1, 1, 1, 4), np.float32))
    assert "at least" not in str(err.value) and "such as x of shape (1, 1, 128, 4)" in str(err.value)
    x = ot.layers.Conv2D(2, 1, seed=0)(inp)
    outs = [x]
    for _ in range(120):  # each layer joins every earlier output: a rule's cost grows with the depth
        outs.append(L.Conv2D(1, 1, seed=0)(L.Concatenate()(outs) if len(outs) > 1 else outs[0]))
    dense = ot.Model(inp, L.Reshape((4999, 4999))(outs[-1]))
    start = time.perf_counter()
    with pytest.raises(ot.ShapeError, match=r"Give inputs of sizes the layers take$"):
        dense.predict(np.ones((1, 1, 3, 3), np.float32))
    assert time.perf_counter() - start < 1.0  # (the search stops at 0.2 s)
