"""Where the epoch loop's batches come from: arrays, callables and iterables.

Every source answers two calls: ``start_epoch(epoch)`` when an epoch begins and
``pull()`` for the next batch, ``None`` at the end of the epoch. :class:`EpochIterator`
counts steps on top of a source; it never takes more than ``steps_per_epoch`` batches
from it (a callable's ``None`` left from an earlier epoch is passed over).

The generator contract (``ot.fit_generator``):

* a **callable** of no arguments returns one batch per call and ``None`` at the end of
  an epoch; a finite one resets itself before returning ``None``, so the next call
  starts the next epoch. An infinite one never returns ``None`` and needs
  ``steps_per_epoch``.
* a **re-iterable** (a list, or any object whose ``iter()`` returns a fresh iterator)
  is iterated afresh at the start of every epoch. An object with ``__len__`` and
  ``__getitem__`` but no ``__iter__`` (a Keras ``Sequence``) gives items ``0 .. len-1``, and
  its ``on_epoch_end()``, if any, is called when an epoch's batches are done.
* a **one-shot iterator** (a Python generator, ``iter(list)``) is consumed across
  epochs: ``steps_per_epoch`` says how many batches make an epoch. When it runs dry,
  training stops.

A ``None`` item from an iterable ends the epoch like a callable's ``None``.
A batch is ``(x, y)``, ``(x, y, sample_weight)`` or
``{"inputs": [...], "labels": [...], "sample_weight": ...}``.

The helpers at the end turn what ``fit`` receives into sources: arrays checked against the
model, the validation split, validation data as arrays or a generator.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
import weakref

import numpy as np

from ortrain import _random
from ortrain._arrays import (
    check_fixed_rows,
    is_real,
    label_positions,
    of_the_output,
    prepare_inputs,
    prepare_labels,
    prepare_sample_weight,
    refuse_non_finite,
    rows_free,
    rows_of,
    sample_weight_shape,
)
from ortrain.errors import OrtrainError, ShapeError

__all__ = ["ArraySource", "CallableSource", "EpochIterator", "IterableSource", "as_source", "parse_batch",
           "generator_source", "prepare_arrays", "validation_iterator", "split_arrays"]

_BATCH_FORMS = "(x, y), (x, y, sample_weight) or {'inputs': [...], 'labels': [...], 'sample_weight': ...}"
_DICT_KEYS = {"inputs", "labels", "sample_weight"}


def describe_value(value) -> str:
    """What a message says it received: an array's shape, a container's size or keys, a number's
    value and type."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    if isinstance(value, (int, float, str)):
        return f"{value!r:.60} ({type(value).__name__})"
    return f"a {type(value).__name__}"


def _single(value, key: str):
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            return value[0]
        if key == "labels":
            raise OrtrainError(f"batch['labels']: expected one label array (the loss is on the model's first "
                               f"output), received {len(value)}")
        return list(value)
    return value


def parse_batch(batch) -> tuple:
    """``(x, y, sample_weight)`` from any of the accepted batch forms; ``sample_weight`` may be None."""
    if isinstance(batch, dict):
        unknown = set(batch) - _DICT_KEYS
        if unknown or "inputs" not in batch or "labels" not in batch:
            raise OrtrainError(f"batch: expected {_BATCH_FORMS}; received {describe_value(batch)}"
                               + (f" (unknown keys {sorted(map(str, unknown))})" if unknown else ""))
        return _single(batch["inputs"], "inputs"), _single(batch["labels"], "labels"), batch.get("sample_weight")
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        return batch[0], batch[1], (batch[2] if len(batch) == 3 else None)
    raise OrtrainError(f"batch: expected {_BATCH_FORMS}; received {describe_value(batch)}")


# -- batches handed back -------------------------------------------------------------------------
# A fit refused before its first step (a callback's setting, nbatch_logical against the batch's
# rows, a bad first batch) has read a batch from the caller's generator to learn the batch size.
# It hands that batch back: the next read of the same callable or iterator (by a fit, an
# evaluation) returns it first, so a refused fit leaves the generator's sequence as it was.
# id(object) -> [a weak reference to it (or, where none can follow it, as for iter(a_list), the
# object itself, held until nothing else refers to it), {key: [batches]}]; the key tells a bound
# method (made anew at each attribute access) from its object's others.
_HANDED: dict[int, list] = {}
_HAND_BACK_LOCK = threading.Lock()
_NOTHING = object()  # no batch pulled ahead (None is a pulled end of epoch)


def _owner(gen):
    """The object handed-back batches are kept for, and their key there."""
    owner = getattr(gen, "__self__", None)  # a bound method, it.__next__, a builtin object's method
    if owner is None or isinstance(owner, types.ModuleType):
        return gen, None
    name = getattr(gen, "__name__", None)
    if name == "__next__":  # it.__next__ reads what iterating it reads
        return owner, None
    return owner, getattr(gen, "__func__", None) or name


def _referent(ref):
    return ref() if isinstance(ref, weakref.ref) else ref


def _forget(ref, *, key: int) -> None:
    if _HANDED.get(key, (None,))[0] is ref:  # (a weak reference's callback: no lock, a dict pop is atomic)
        _HANDED.pop(key, None)


def _entry(owner, make: bool):
    entry = _HANDED.get(id(owner))
    if entry is not None and _referent(entry[0]) is not owner:  # the id of an object since gone
        del _HANDED[id(owner)]
        entry = None
    if entry is None and make:
        try:
            ref = weakref.ref(owner, functools.partial(_forget, key=id(owner)))
        except TypeError:
            ref = owner
        entry = _HANDED[id(owner)] = [ref, {}]
    return entry


# Objects held (not weakly referenced) for their batches, at most: the oldest goes first (an
# object in a reference cycle is never seen as dropped by its count).
MAX_HELD = 8


def drop_unreferenced() -> None:
    """Let go of objects held for their batches that nothing else refers to any more, and of the
    oldest held ones past :data:`MAX_HELD`."""
    with _HAND_BACK_LOCK:
        held = []
        for key, entry in list(_HANDED.items()):
            if isinstance(entry[0], weakref.ref):
                continue
            if sys.getrefcount(entry[0]) <= 2:  # the entry's and the argument's: the caller dropped it
                del _HANDED[key]
            else:
                held.append(key)
        for key in held[:max(0, len(held) - MAX_HELD)]:  # (a dict keeps the order of insertion)
            del _HANDED[key]


def hand_back(gen, batches: list) -> None:
    """Keep ``batches`` (read from ``gen``, in that order, by a fit that did not train on them)
    for the next reads of ``gen``, ahead of any kept before."""
    if not batches:
        return
    owner, key = _owner(gen)
    with _HAND_BACK_LOCK:
        table = _entry(owner, make=True)[1]
        table[key] = [*batches, *table.get(key, [])]
    drop_unreferenced()


def take_handed_back(gen):
    """The next batch handed back for ``gen`` (now the caller's), or ``_NOTHING``."""
    if not _HANDED:
        return _NOTHING
    owner, key = _owner(gen)
    with _HAND_BACK_LOCK:
        entry = _entry(owner, make=False)
        batches = entry[1].get(key) if entry is not None else None
        if not batches:
            return _NOTHING
        batch = batches.pop(0)
        if not batches:
            del entry[1][key]
            if not entry[1]:
                del _HANDED[id(owner)]
        return batch


class CallableSource:
    """A callable of no arguments: one batch per call, ``None`` (or ``StopIteration``) at the end of
    an epoch."""

    one_shot = False

    def __init__(self, fn):
        self._fn = fn
        self.exhausted = False
        if _HANDED:
            drop_unreferenced()  # (once a fit)

    def pull(self):
        batch = take_handed_back(self._fn)  # what a refused fit read from it comes first
        if batch is not _NOTHING:
            return batch
        try:
            return self._fn()
        except StopIteration:  # ``lambda: next(it)``: the iterator's end ends the epoch, as None does
            return None

    def hand_back(self, batches: list) -> None:
        hand_back(self._fn, batches)

    def start_epoch(self, epoch: int) -> None:
        pass


class IterableSource:
    """A re-iterable (fresh iterator every epoch) or a one-shot iterator (consumed across epochs)."""


    def __init__(self, iterable):
        if not hasattr(type(iterable), "__iter__") and not hasattr(type(iterable), "__getitem__"):
            raise TypeError(f"{type(iterable).__name__} is not iterable")
        self._iterable = iterable
        # An iterator returns itself from iter(): its items are used up once. Testing for
        # __next__ avoids calling iter() on a re-iterable that may open files or shards.
        self.one_shot = hasattr(type(iterable), "__next__")
        self._it = iter(iterable) if self.one_shot else None
        self.exhausted = False
        if _HANDED:
            drop_unreferenced()  # (once a fit)
        self.size = None if self.one_shot or not hasattr(type(iterable), "__len__") else len(iterable)
        # A Keras-style Sequence (__len__ and __getitem__, no __iter__) holds len() batches: Python's
        # own iteration would index on until IndexError, past the end of a Sequence that never raises.
        self._indexed = self.size is not None and not hasattr(type(iterable), "__iter__")

    def start_epoch(self, epoch: int) -> None:
        if self._indexed:
            seq = self._iterable
            self._it = (seq[i] for i in range(len(seq)))
        elif not self.one_shot:
            self._it = iter(self._iterable)

    def end_epoch(self) -> None:
        """A Keras ``Sequence``'s ``on_epoch_end()`` (where it reshuffles), as Keras calls it."""
        hook = getattr(self._iterable, "on_epoch_end", None) if self._indexed else None
        if callable(hook):
            hook()

    def hand_back(self, batches: list) -> None:
        """Batches read and not trained on: a one-shot iterator keeps them for its next reader (a
        re-iterable is read afresh by the next fit anyway)."""
        if self.one_shot:
            hand_back(self._iterable, batches)

    def pull(self):
        if self.one_shot:
            batch = take_handed_back(self._iterable)  # what a refused fit read from it comes first
            if batch is not _NOTHING:
                return batch
        if self.exhausted:
            return None
        try:
            return next(self._it)
        except StopIteration:
            if self.one_shot:
                self.exhausted = True
            return None


class ArraySource:
    """Batches of ``batch_size`` rows over in-memory arrays; the last batch of a pass may be shorter.

    Every epoch is one pass over the rows. With ``shuffle`` the order of epoch ``e`` is a
    permutation drawn from ``(seed, e)``: with ``ot.set_seed`` the seed is ortrain's, so
    epoch ``e`` sees the same order whether it runs in one ``fit`` or in a resumed one.
    ``continues`` (a fit with ``steps_per_epoch``, as Keras 3 reads arrays): an epoch that stopped
    short of the pass leaves the rest to the next epochs, and the pass that ends within an epoch
    ends it; a new pass (its order drawn from the epoch it starts in) begins at the next.
    """

    one_shot = False
    exhausted = False

    def __init__(self, xs: list[np.ndarray], y: np.ndarray, w: np.ndarray | None, batch_size: int,
                 shuffle: bool = False, seed: int | None = None, continues: bool = False):
        self._xs, self._y, self._w = xs, y, w
        self.continues = continues
        self._started = False
        self.rows = y.shape[0]
        self.batch_size = batch_size
        self.shuffle = shuffle
        if shuffle and seed is None:
            seed = _random._seed if _random.is_seeded() else _random.draw_seed()
        self._seed = seed
        self._order = None
        self._pos = 0

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.rows // self.batch_size)

    def start_epoch(self, epoch: int) -> None:
        if self.continues and self._started and self._pos < self.rows:
            return  # the pass an earlier epoch stopped in goes on
        self._started = True
        self._pos = 0
        if self.shuffle:
            self._order = np.random.default_rng([self._seed, epoch]).permutation(self.rows)

    def pull(self):
        start = self._pos
        if start >= self.rows:
            return None
        stop = start + self.batch_size
        self._pos = stop
        if self._order is None:
            sl = slice(start, stop)
        else:
            sl = self._order[start:stop]
        x = [a[sl] for a in self._xs]
        return (x if len(x) > 1 else x[0], self._y[sl], None if self._w is None else self._w[sl])


def as_source(data, argument: str = "generator"):
    """A source for a callable or an iterable of batches; arrays are refused with the fix."""
    if isinstance(data, (CallableSource, IterableSource, ArraySource)):
        return data
    if isinstance(data, np.ndarray):
        raise OrtrainError(f"{argument}: expected a callable returning batches or an iterable of batches, "
                           f"received an array of shape {data.shape}; for arrays call model.fit(x, y, "
                           "batch_size=...)")
    if isinstance(data, tuple) and len(data) in (2, 3) and all(isinstance(a, np.ndarray) for a in data) and \
            data[0].ndim >= 2 and len({len(a) for a in data}) == 1:
        raise OrtrainError(f"{argument}: expected a callable returning batches or an iterable of batches, "
                           f"received a tuple of arrays of {len(data[0])} rows (x, y); for arrays call "
                           "model.fit(x, y, batch_size=...), or pass [(x, y)] for one batch")
    if callable(data):
        if inspect.isgeneratorfunction(data):  # its calls return generators, not batches
            name = getattr(data, "__name__", "it")
            raise OrtrainError(f"{argument}: {name!r} is a generator function (it yields batches, and a call returns "
                               f"a generator, not a batch); pass {name}() for one pass (with steps_per_epoch for "
                               f"several epochs), a list of batches, or a callable returning one batch per call")
        _check_no_arguments(data, argument)
        return CallableSource(data)
    if isinstance(data, (str, bytes, dict)):
        raise OrtrainError(f"{argument}: expected a callable returning batches or an iterable of batches, "
                           f"received {describe_value(data)}")
    try:
        return IterableSource(data)
    except TypeError:
        raise OrtrainError(f"{argument}: expected a callable returning batches or an iterable of batches, "
                           f"received {describe_value(data)}") from None


def _check_no_arguments(fn, argument: str) -> None:
    """A batch callable is called with no arguments: one that requires some is refused up front."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return
    try:
        signature.bind()
    except TypeError:
        required = [p.name for p in signature.parameters.values()
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        raise OrtrainError(f"{argument}: expected a callable of no arguments returning a batch (None at the end "
                           f"of an epoch), received {getattr(fn, '__name__', type(fn).__name__)!r}, which requires "
                           f"{', '.join(map(repr, required))}; wrap it (lambda: make_batch(...)) or pass an "
                           "iterable of batches") from None


class EpochIterator:
    """Steps of one epoch over a source: ``(step, batch)`` pairs.

    With ``steps`` the source is pulled exactly ``steps`` times unless it ends the epoch
    first; without, until it returns ``None``. A callable whose first call of an epoch returns
    ``None`` is called once more: that ``None`` ends a pass an earlier epoch (of this fit or of
    one before) completed at ``steps`` batches, a finite callable exactly ``steps`` long. A
    batch already pulled for the first epoch (the fit loop reads one to learn the batch size,
    or whether validation batches carry weights) is handed back with :meth:`peek`.
    """

    def __init__(self, source, steps: int | None = None):
        self.source = source
        self.steps = steps
        self._pending = _NOTHING
        self._peeked = None  # the batch peek read (the fit has not trained on it yet)
        self.taken = 0  # batches of the last epoch
        self.ended_early = False  # the source ended an epoch before ``steps``

    def peek(self, epoch: int):
        """The first batch of epoch ``epoch`` (None when it has none), pulled now and yielded
        again as that epoch's first step."""
        if self._pending is _NOTHING:
            self.source.start_epoch(epoch)
            self._pending = self._peeked = self._first()
        return self._pending

    def hand_back(self) -> None:
        """Give the batch :meth:`peek` read back to the caller's generator, for a fit that ends
        before it trained on it (it was refused): the next one reading that generator gets it first."""
        peeked, self._peeked, self._pending = self._peeked, None, _NOTHING
        if peeked is not None and hasattr(self.source, "hand_back"):
            self.source.hand_back([peeked])

    def _first(self):
        """An epoch's first pull, past a callable's leftover ``None`` (see the class docstring)."""
        batch = self.source.pull()
        if batch is None and isinstance(self.source, CallableSource):
            batch = self.source.pull()
        return batch

    def epoch(self, epoch: int):
        source, steps = self.source, self.steps
        pending, self._pending = self._pending, _NOTHING
        if pending is _NOTHING:
            source.start_epoch(epoch)
        self.taken = 0
        self.ended_early = False
        pull = source.pull
        while steps is None or self.taken < steps:
            if self.taken:
                self._peeked = None  # a step was taken on it
            if pending is not _NOTHING:
                batch, pending = pending, _NOTHING
            else:
                batch = pull() if self.taken else self._first()
            if batch is None:
                self.ended_early = steps is not None
                break
            self.taken += 1
            yield self.taken - 1, batch
        end = getattr(source, "end_epoch", None)
        if end is not None:
            end()


# -- preparing what fit receives ----------------------------------------------------------------
def generator_source(data, steps_per_epoch, n_epochs: int, argument: str = "generator"):
    """A source for a generator; a one-shot iterator asked for several epochs needs ``steps_per_epoch``."""
    source = as_source(data, argument)
    if source.one_shot and steps_per_epoch is None and n_epochs > 1:
        raise OrtrainError(f"{argument}: a one-shot iterator (e.g. a Python generator) is used up by its first "
                           f"epoch and {n_epochs} epochs were asked for; pass steps_per_epoch, or a re-iterable "
                           "(a list, an object with __iter__) or a callable that returns None at each epoch end")
    return source


def prepare_arrays(model, x, y, w, xa: str = "x", ya: str = "y", wa: str = "sample_weight",
                   weight_shape: tuple | None = None):
    """``x``, ``y`` and loss weights cast and checked against ``model``, all rows at once, so bad
    input (a class label out of range in the last batch too) is refused before anything trains.

    ``weight_shape`` is the weight input's shape (batch first); by default one weight per sample
    (or per position, for a prediction with positions: :func:`ortrain._arrays.sample_weight_shape`).
    """
    # whole arrays: their rows are cut into batches after (of the graph's fixed batch, where it has one)
    xs = prepare_inputs(rows_free(model.input_specs), x, xa, bounds=model.index_bounds(), defer=True)
    n = xs[0].shape[0]
    if n == 0:
        raise ShapeError(f"{xa}: holds no rows; give at least one sample")
    pred_shape = model.output_specs[0].shape
    shapes = [a.shape for a in xs]
    spec, outputs = model._label_spec_for(shapes), [s.name for s in model.output_specs]
    if weight_shape is None:
        weight_shape = sample_weight_shape(pred_shape)
    y = of_the_output(outputs, y, ya, (len(spec.shape),))
    w = of_the_output(outputs, w, wa, range(1, len(weight_shape) + 1), rows=n)  # (batch,) too, or per position
    ys = prepare_labels(spec, y, ya, n, model._n_classes(shapes), rows_of=xa,
                        one_hot=getattr(model.loss, "name", "") == "categorical_crossentropy",
                        probabilities=getattr(model.loss, "name", "") == "binary_crossentropy")
    ws = None if w is None else prepare_sample_weight(w, weight_shape, wa, n, label_positions(ys, weight_shape))
    return xs, ys, ws


def refuse_non_finite_arrays(model, xs, ys, ws, arguments=("x", "y", "sample_weight"), outcome: str = "nothing was trained",
                             needs: str = "training needs finite values") -> None:
    """Training arrays from :func:`prepare_arrays` must be finite: checked once, before the first
    step, so a NaN in the last rows stops nothing halfway. ``arguments`` name x, y and the weights;
    ``outcome`` and ``needs`` word the refusal (as :func:`~ortrain._arrays.refuse_non_finite`)."""
    xa, ya, wa = arguments
    names = [xa if len(xs) == 1 else f"{xa}[{s.name!r}]" for s in model.input_specs]
    refuse_non_finite([*xs, ys] + ([ws] if ws is not None else []), [*names, ya, wa], outcome, needs)


def refuse_non_finite_weights(w: np.ndarray | None, argument: str, outcome: str, first_row: int = 0) -> None:
    """Loss weights must be finite wherever they weight a reported loss too (a NaN weight makes the
    whole mean NaN); inputs may hold what they hold there. ``first_row``: where ``w``'s rows start
    in the array the caller gave (the rows validation_split holds out are the last)."""
    if w is not None:
        refuse_non_finite([w], [argument], outcome, "weights must be finite", first_row=first_row)


def _inputs_like(value) -> bool:
    """An input array, or a list/tuple of them or a dict of them by input name (a model with
    several inputs)."""
    arrays = list(value.values()) if isinstance(value, dict) else value
    return isinstance(value, np.ndarray) or (isinstance(arrays, (list, tuple)) and len(arrays) > 0
                                             and all(isinstance(a, np.ndarray) for a in arrays))


def _batch_like(value) -> bool:
    """A batch ``(x, y[, w])``, ``[x, y[, w]]`` or dict, as opposed to labels or weights."""
    return isinstance(value, (tuple, dict)) or (isinstance(value, list) and len(value) > 0
                                                and isinstance(value[0], (np.ndarray, list, tuple, dict)))


def looks_like_arrays(data) -> bool:
    """``(x, y)`` or ``(x, y, sample_weight)`` arrays rather than a collection of batches: a tuple
    whose first item is not a batch, or (as Keras takes them too) a tuple or list whose ``x`` is
    an array, a list or tuple of arrays or a dict of them, and whose other items are not batches."""
    if isinstance(data, tuple) and len(data) in (2, 3) and not isinstance(data[0], (tuple, dict)):
        return True
    return (isinstance(data, (list, tuple)) and len(data) in (2, 3) and _inputs_like(data[0])
            and not any(_batch_like(v) for v in data[1:]))


def validation_iterator(model, data, steps, batch_size: int, argument: str = "validation_data", names=None,
                        validations: int = 1, weight_shape: tuple | None = None):
    """An epoch iterator over validation arrays ``(x, y[, sample_weight])`` or a generator; None for None.
    ``names`` (three) name the arrays in messages instead of ``validation_data[0]`` and so on.
    ``validations`` is how many epochs the fit validates after: a one-shot iterator without ``steps``
    is used up by the first, so more are refused, as :func:`generator_source` refuses them.
    ``weight_shape``: the trainer's weight input (as for :func:`prepare_arrays`).

    What can be checked before training is: arrays, and each batch of a list or tuple of batches
    (inputs and labels against the model), so a mistake there stops nothing halfway."""
    if data is None:
        return None
    if looks_like_arrays(data):
        xa, ya, wa = names or (f"{argument}[0]", f"{argument}[1]", f"{argument}[2]")
        xs, ys, ws = prepare_arrays(model, data[0], data[1], data[2] if len(data) == 3 else None, xa, ya, wa,
                                    weight_shape)
        refuse_non_finite_weights(ws, wa, "nothing was trained")
        batch_size = check_fixed_rows(model.input_specs, xs[0].shape[0], xa, None) or batch_size
        return EpochIterator(ArraySource(xs, ys, ws, batch_size), steps)
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], np.ndarray):
        items = ", ".join(describe_value(v) for v in data)
        raise OrtrainError(f"{argument}: expected (x, y) or (x, y, sample_weight) arrays, or batches of those; "
                           f"received a {type(data).__name__} of {len(data)}: {items}")
    if isinstance(data, (list, tuple)):
        for i, batch in enumerate(data):
            if batch is None:
                break
            try:
                x, y, w = parse_batch(batch)
            except OrtrainError as exc:
                raise OrtrainError(f"{argument}[{i}]: {exc}") from None
            wa = f"{argument}[{i}] sample_weight"
            ws = prepare_arrays(model, x, y, w, f"{argument}[{i}] x", f"{argument}[{i}] y", wa, weight_shape)[2]
            refuse_non_finite_weights(ws, wa, "nothing was trained")
    source = as_source(data, argument)
    if source.one_shot and steps is None and validations > 1:
        raise OrtrainError(f"{argument}: a one-shot iterator (e.g. a Python generator) is used up by the first "
                           f"validation and the fit validates after {validations} epochs; pass validation_steps, "
                           "or a re-iterable (a list, an object with __iter__) or a callable that returns None "
                           "at each validation's end")
    return EpochIterator(source, steps)


def check_split(validation_split) -> None:
    if not is_real(validation_split) or not 0.0 <= validation_split < 1.0:
        raise OrtrainError(f"validation_split: expected a fraction in [0, 1), received {validation_split!r}")


def split_arrays(arrays, validation_split):
    """``(train, held_out)``: the last ``validation_split`` of the rows, taken before any shuffling
    (Keras' rule); ``held_out`` is None for 0."""
    check_split(validation_split)
    xs, ys, ws = arrays
    if not validation_split:
        return arrays, None
    n = len(ys)
    at = int(n * (1.0 - validation_split))
    if at == 0 or at == n:
        raise OrtrainError(f"validation_split={validation_split} leaves {at} training and {n - at} validation rows "
                           f"of {n}; choose a fraction that keeps both non-empty")
    head = ([rows_of(a, slice(None, at)) for a in xs], ys[:at], None if ws is None else ws[:at])
    tail = ([rows_of(a, slice(at, None)) for a in xs], ys[at:], None if ws is None else ws[at:])
    return head, tail
