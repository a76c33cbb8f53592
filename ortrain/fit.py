"""The fit entry points, on top of :class:`ortrain.Trainer` and the epoch loop written once
(``ortrain._loop.Loop``).

``Model.fit`` (arrays or a generator), :func:`fit_generator` and the command line all
end in :func:`train`, which runs the loop's epochs of training steps on a trainer. Who owns
which argument:

=====================  =====================================================================
object                 owns
=====================  =====================================================================
data source            the batches: ``batch_size`` and ``shuffle`` for arrays (the short last
(``ortrain.data``)     batch included), re-iterating an iterable each epoch, the sample weights
                       of each batch
epoch iterator         the steps: ``steps_per_epoch`` / ``validation_steps`` (one batch pulled
(``EpochIterator``)    each; a callable's leftover ``None`` is passed over), where an epoch ends
                       (``None``, exhaustion)
loop (``Loop``)        ``epochs``, ``initial_epoch``, validation and ``validation_freq``, callbacks
                       and their stop flag, the history, locating errors by epoch and step
trainer                one step: the batch's shape, gradient accumulation (``nbatch_logical``),
                       loss weights (a generator batch's class weights), weight decay, the
                       learning rate
``fit_model`` /        checking ``class_weight`` against the model (arrays: folded into the sample
``fit_generator``      weights of the training rows up front), building the trainer, handing the
                       trained weights and optimizer state back to the caller's model
                       (``model.train_state``) when the loop ends
=====================  =====================================================================

Epochs follow Keras: ``epochs`` is the index the loop stops before, so ``initial_epoch=2,
epochs=5`` runs epochs 2, 3 and 4; the number only matters to callbacks and schedules.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading

import numpy as np

from ortrain import _kept_trainer as kept_trainer
from ortrain import losses as losses_mod
from ortrain import optim
from ortrain._arrays import (
    check_fixed_rows,
    checked_flag,
    checked_int,
    is_integer,
    is_real,
    prepare_inputs,
    refuse_non_finite,
)
from ortrain._class_weight import class_weights
from ortrain._keywords import names_unknown_arguments_of
from ortrain._loop import Loop, located, validations_within
from ortrain._trainer_setup import _weighting
from ortrain._warnings import warn
from ortrain.callbacks.base import CallbackList
from ortrain.callbacks.progress import check_verbose
from ortrain.data import (
    ArraySource,
    EpochIterator,
    check_split,
    generator_source,
    looks_like_arrays,
    parse_batch,
    prepare_arrays,
    refuse_non_finite_arrays,
    refuse_non_finite_weights,
    split_arrays,
    validation_iterator,
)
from ortrain.errors import OrtrainError, ShapeError
from ortrain.history import History
from ortrain.nn.base_layer import what_trains
from ortrain.nn.model import Model
from ortrain.trainer import Trainer, weighing_any_loss

__all__ = ["fit_generator", "fit_model", "train"]

DEFAULT_BATCH_SIZE = 32


# -- argument checks ------------------------------------------------------------------------------
def _count(value, argument: str) -> int | None:
    """A step or batch count: a positive int, or None for "not given"."""
    return checked_int(value, argument, minimum=1, allow_none=True)


def _epochs(epochs, initial_epoch) -> tuple[int, int]:
    return (checked_int(epochs, "epochs", minimum=0), checked_int(initial_epoch, "initial_epoch", minimum=0))


def _validation_freq(value) -> int | frozenset[int]:
    """Keras' ``validation_freq``: validate after every ``n``-th epoch (an int >= 1), or after the
    epochs listed (numbers counted from 1, as Keras counts them)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, (list, tuple, set, frozenset, range)):
        for e in value:
            if not is_integer(e) or e < 1:
                raise OrtrainError(f"validation_freq: expected epoch numbers counted from 1 (ints >= 1), received "
                                   f"{e!r} in {value!r}; e.g. validation_freq=[1, 5, 10] validates after the "
                                   "first, fifth and tenth epochs")
        return frozenset(int(e) for e in value)
    if not is_integer(value) or value < 1:
        raise OrtrainError(f"validation_freq: expected an int >= 1 (validate after every that many epochs) or a "
                           f"list of epoch numbers counted from 1, received {value!r}; validation_freq=1 "
                           "validates after every epoch")
    return int(value)


def _element_weights(model: Model, loss_mask) -> tuple | None:
    """The weight input's shape for ``loss_mask=<outputs>`` (one weight per output element: the
    prediction's shape, as the artifacts build it); None for one per sample, the default of
    :func:`prepare_arrays`. A ``loss_mask`` the trainer refuses is refused here first."""
    return tuple(model.output_specs[0].shape) if _weighting(loss_mask, model) == "element" else None


# -- entry points ---------------------------------------------------------------------------------
def train(trainer: Trainer, data, y=None, *, sample_weight=None, epochs: int = 1, initial_epoch: int = 0,
          steps_per_epoch: int | None = None, validation_data=None, validation_steps: int | None = None,
          shuffle: bool = True, callbacks=(), verbose=1, model: Model | None = None,
          names: dict | None = None) -> History:
    """Run the epoch loop on ``trainer`` (which stays alive; the caller frees it).

    ``data`` is arrays (``x`` with ``y``, batched by ``trainer.batch_size``, the short last
    batch trained as one step) or a generator (``y`` None). ``validation_data``: arrays
    ``(x, y)`` / ``(x, y, sample_weight)`` or a generator. With ``model`` the trained weights
    and optimizer state are written back into it when the loop ends, also when it fails.
    This is what ``Model.fit``, :func:`fit_generator` and the command line call. ``names``
    renames the arrays in error messages: keys ``"x"``, ``"y"``, ``"sample_weight"`` and
    ``"validation_data"`` (a tuple of three), as the command line names its files.
    """
    if not isinstance(trainer, Trainer):
        raise OrtrainError(f"trainer: expected an ot.Trainer, received {type(trainer).__name__}")
    trainer._live()
    epochs, initial_epoch = _epochs(epochs, initial_epoch)
    steps_per_epoch = _count(steps_per_epoch, "steps_per_epoch")
    validation_steps = _count(validation_steps, "validation_steps")
    base = trainer._model
    check_verbose(verbose)
    names = names or {}
    weight_shape = None if trainer._weight_spec is None else trainer._weight_spec.shape
    if y is None:
        source, samples = generator_source(data, steps_per_epoch, epochs - initial_epoch), None
    else:
        xa, ya, wa = (names.get(k, k) for k in ("x", "y", "sample_weight"))
        if sample_weight is not None and trainer._weight_spec is None:
            raise OrtrainError(f"{wa}: this trainer has no loss weights; {trainer._how_to_weigh()}")
        xs, ys, ws = prepare_arrays(base, data, y, sample_weight, xa, ya, wa, weight_shape)
        check_fixed_rows(base.input_specs, len(ys), xa, trainer.batch_size)
        refuse_non_finite_arrays(base, xs, ys, ws, (xa, ya, wa))
        source, samples = ArraySource(xs, ys, ws, trainer.batch_size, shuffle=checked_flag(shuffle, "shuffle")), len(ys)
    vit = validation_iterator(base, validation_data, validation_steps, trainer.batch_size,
                              names=names.get("validation_data"), validations=epochs - initial_epoch,
                              weight_shape=weight_shape)
    val_weighted = epochs > initial_epoch and _validation_weighted(vit, initial_epoch, base)
    if trainer._weight_spec is None and val_weighted:
        wa = (names.get("validation_data") or ("", "", "validation_data (its sample weights)"))[2]
        raise OrtrainError(f"{wa}: this trainer has no loss weights; {trainer._how_to_weigh()}")
    loop = Loop(trainer, EpochIterator(source, steps_per_epoch), epochs=epochs, initial_epoch=initial_epoch,
                 validation=vit, callbacks=callbacks or (), verbose=verbose, model=model, samples=samples)
    return loop.run()


def _with_compile_overrides(model: Model, loss, optimizer) -> Model:
    """The model to train: ``model`` itself, or for ``loss``/``optimizer`` overrides a copy compiled
    with them, so the caller's model changes only once training can start (see :func:`_commit`).
    Another optimizer starts from fresh moments; the model's own optimizer, or a new loss alone, keeps
    them (as ``model.compile`` does)."""
    if loss is None and optimizer is None:
        if not model.compiled:
            raise OrtrainError("model: not compiled; call model.compile(optimizer=..., loss=...) or pass loss=... "
                               "(and optimizer=...) to fit_generator")
        return model
    new_loss = losses_mod.get(loss) if loss is not None else model.loss
    if new_loss is None:
        raise OrtrainError("loss: the model is not compiled and no loss was given; pass loss='mse' (or another "
                           "loss) or call model.compile first")
    new_opt = optim.get(optimizer) if optimizer is not None else (model.optimizer or optim.get("adam"))
    staged = model.copy()
    shown = model.optimizer._lr_now if model.optimizer is not None else None
    staged.compile(optimizer=new_opt, loss=new_loss, metrics=model.metrics, weighted_metrics=model.weighted_metrics)
    if new_opt is model.optimizer:  # the caller's optimizer keeps reading the caller's model
        new_opt._lr_now = shown
        if not new_opt.params:  # (its step and state too)
            new_opt._link(model)
        staged._lr_seen = model._seen()  # and its rate is taken over only if written since the last fit
    # as model.compile: the optimizer the model holds keeps its state, another starts afresh
    staged.train_state = model.train_state if optimizer is None or new_opt is model.optimizer else None
    return staged


_FIT_CLAIMS = threading.Lock()
_LAYER_FITS: dict = {}  # id of a layer a running fit trains -> (that fit's claim, its model's name)


def _one_fit_at_a_time(call: str):
    """``fn`` (``fit_generator`` or ``fit_model``, the model first) run while it holds its model.

    A fit of a model already fitting, from one of its callbacks or from another thread, would
    train beside the running fit, whose end then writes its own weights and state over it (two
    threads also interleave their steps and counts): refused, before anything changes. The model
    is held from the call's first line (a fit's set-up, building artifacts, takes a while before
    its first step) to its return."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            model = args[0] if args else kwargs.get("model")
            claim = (threading.get_ident(), object())  # this call's own: an interrupt anywhere leaves none
            try:
                if isinstance(model, Model):
                    _hold(model, call, claim)
                return fn(*args, **kwargs)
            finally:
                if isinstance(model, Model) and model.__dict__.get("_fit_thread") is claim:
                    del model.__dict__["_fit_thread"]
                with _FIT_CLAIMS:
                    for key in [k for k, (c, _) in _LAYER_FITS.items() if c is claim]:
                        del _LAYER_FITS[key]
        return run
    return wrap


def _trained_layers(model: Model) -> list:
    layers = model.__dict__.get("layers") or ()
    if not layers:
        return []
    trained = what_trains(model)[0]
    return [lyr for lyr in layers if any(f"{lyr.name}.{s}" in trained for s in lyr.weights)]


def _hold(model: Model, call: str, claim: tuple) -> None:
    trained = _trained_layers(model)
    with _FIT_CLAIMS:
        owner = model.__dict__.get("_fit_thread")
        if owner is None and model.__dict__.get("_live_state") is None:
            # a layer it trains that another thread's fit trains too (a model sharing it): each fit
            # trains its own copy, and the one ending last would write its weights over the other's
            other = next(((lyr, _LAYER_FITS[id(lyr)]) for lyr in trained if id(lyr) in _LAYER_FITS
                          and _LAYER_FITS[id(lyr)][0][0] != claim[0]), None)
            if other is not None:
                lyr, (_, name) = other
                raise OrtrainError(f"{call}: layer {lyr.name!r} trains in a fit of model {name!r} running in another "
                                   "thread, which shares it; each fit trains its own copy of it, and the one ending "
                                   "last would write its weights over the other's. Fit the models one after the "
                                   "other, freeze the shared layer in one of them, or fit a copy: model.copy()")
            model.__dict__["_fit_thread"] = claim
            for lyr in trained:
                _LAYER_FITS.setdefault(id(lyr), (claim, model.name))  # a fit around this one keeps its own
            return
    if owner is not None and owner[0] not in {t.ident for t in threading.enumerate()}:
        # the fit's thread is gone with its claim held: this is a child forked while it ran
        raise OrtrainError(f"{call}: this process was forked while another thread of its parent was fitting this "
                           "model; that fit does not run in this child, and its trainer cannot be used here. Go on "
                           "from the weights the model held last in a model of the child's own (build it, then "
                           "set_weights(model.get_weights())), or fork while no fit runs")
    where = "called from a callback?" if owner is None or owner[0] == claim[0] else "in another thread"
    raise OrtrainError(f"{call}: this model is fitting already ({where}); its running fit would write its own "
                       "weights and optimizer state over this one when it ends. Train after that fit returns, "
                       "or on a copy: model.copy()")


def _commit(model: Model, staged: Model):
    """Give the caller's model the compile settings (and optimizer state) training runs with;
    returns the function that puts back what it had, for a fit that fails before its first step."""
    if staged is model:
        return lambda: None
    before = (model.optimizer, model.loss, model.metrics, model.weighted_metrics, model.train_state, model._lr_seen)
    model.compile(optimizer=staged.optimizer, loss=staged.loss, metrics=staged.metrics,
                  weighted_metrics=staged.weighted_metrics)
    seen = model._lr_seen
    model.train_state = staged.train_state
    model._lr_seen = seen  # a rate written before this fit is still this fit's to take

    def undo() -> None:
        model.optimizer, model.loss, model.metrics, model.weighted_metrics, model.train_state, model._lr_seen = before
        model._runners.clear()  # evaluate's graph holds the loss
    return undo


@names_unknown_arguments_of
@_one_fit_at_a_time("fit_generator")
def fit_generator(model: Model, generator, steps_per_epoch=None, epochs=1, initial_epoch=0,
                  validation_generator=None, validation_steps=None, loss=None, optimizer=None,
                  nbatch_logical=None, callbacks=(), verbose=1, loss_mask=None, weight_decay=0.0) -> History:
    """Train ``model`` from a generator, one batch at a time; returns a :class:`History`.

    ``generator``: a callable of no arguments returning a batch, or ``None`` at the end of an epoch
    (a finite one resets itself first); or an iterable of batches (a re-iterable is iterated afresh
    every epoch; a one-shot iterator is consumed across epochs and needs ``steps_per_epoch`` for
    more than one; an object with ``__len__`` and ``__getitem__`` only, as a Keras ``Sequence``,
    gives items ``0 .. len-1`` every epoch). Batches are ``(x, y)``, ``(x, y, sample_weight)`` or
    ``{"inputs": [...], "labels": [...], "sample_weight": ...}``, of at least one row and at most
    the first batch's. With ``steps_per_epoch`` the generator is called exactly that many times
    per epoch; a callable whose first call of an epoch returns ``None`` is called once more (that
    ``None`` ends a pass an earlier epoch, of this fit or of one before, finished at
    ``steps_per_epoch`` batches: a finite callable exactly that long). An epoch without a batch
    stops training with a warning.

    ``loss``/``optimizer`` recompile the model before training (a new optimizer starts fresh
    moments). ``nbatch_logical``: gradients of several batches make one update. ``loss_mask``
    as for :class:`ortrain.Trainer`, except that ``loss_mask=1`` weights any loss, as batches
    carrying ``sample_weight`` without it do (each sample's or position's loss, in training and in
    validation alike): it lets batches without weights come first. ``weight_decay`` (in [0, 1],
    in the optimizer's form, as for :class:`ortrain.Trainer`) overrides the optimizer's: the
    default 0.0 turns decay off, with a warning when the compiled optimizer has some; ``None`` keeps the compiled optimizer's, as ``model.fit`` does.
    The trained weights and optimizer state are written back into ``model``, so a later fit
    continues; when the generator raises, the error propagates after every callback's
    ``on_train_end`` ran and the model holds the last completed step.

    ``initial_epoch``/``epochs`` follow Keras: epochs ``initial_epoch .. epochs-1`` run.

    Keras' ``class_weight`` and ``validation_freq`` are ``model.fit``'s (which takes the same
    generators): see :func:`fit_model`. A batch's class weights multiply its ``sample_weight``
    when it carries one.

    When the generator is called: its first batch is read before anything else (its rows fix
    the batch size the trainer is built for, so before ``on_train_begin``; a later batch may be
    shorter, as a DataLoader's last without ``drop_last``, and is a step on its own rows, while a
    longer one is refused); every later batch
    is read before its own ``on_batch_begin`` and after the previous step's ``on_batch_end``
    (and after ``on_epoch_begin`` for an epoch's first batch). A callback that prepares data
    (fills a replay buffer, raises a curriculum level) therefore does it in ``on_batch_end``
    or ``on_epoch_begin`` for the batches that follow. The validation generator's first batch
    is read right after the training generator's, to learn whether validation carries
    weights; the first validation uses it. A fit that is refused or stopped before its first
    step (a callback's setting, ``nbatch_logical`` against the batch's rows, a bad first batch,
    Ctrl-C) hands those first batches back: the next read of the same callable or iterator (by a
    fit or an evaluation) takes them first, so none is skipped. (An object that cannot be weakly
    referenced, such as ``iter(a_list)``, is held for them until nothing else refers to it, at
    most ``ortrain.data.MAX_HELD`` of them.) Batches read after the first are the fit's.

    >>> import numpy as np, ortrain as ot
    >>> model = ot.Sequential([ot.layers.Dense(1)], input_shape=(2,), seed=0)
    >>> _ = model.compile(optimizer="sgd", loss="mse")
    >>> batches = [(np.ones((4, 2)), np.zeros((4, 1)))] * 3
    >>> hist = ot.fit_generator(model, batches, epochs=3, initial_epoch=1, verbose=0)
    >>> hist.epoch, model.train_state.n_steps
    ([1, 2], 6)
    """
    return _fit_generator(model, generator, steps_per_epoch=steps_per_epoch, epochs=epochs,
                          initial_epoch=initial_epoch, validation_generator=validation_generator,
                          validation_steps=validation_steps, loss=loss, optimizer=optimizer,
                          nbatch_logical=nbatch_logical, callbacks=callbacks, verbose=verbose, loss_mask=loss_mask,
                          weight_decay=weight_decay)


def _fit_generator(model: Model, generator, *, steps_per_epoch=None, epochs=1, initial_epoch=0,
                   validation_generator=None, validation_steps=None, loss=None, optimizer=None, nbatch_logical=None,
                   callbacks=(), verbose=1, loss_mask=None, weight_decay=0.0, class_weight=None,
                   validation_freq=1, validation_name="validation_generator") -> History:
    """:func:`fit_generator` with ``model.fit``'s ``class_weight`` and ``validation_freq``
    (``validation_name``: what the caller calls the validation data)."""
    if not isinstance(model, Model):
        raise OrtrainError(f"model: expected an ortrain Model, received {type(model).__name__}")
    kept_trainer.release(model)  # the trainer train_on_batch keeps: its state goes to the model first
    steps_per_epoch = _count(steps_per_epoch, "steps_per_epoch")
    _count(validation_steps, "validation_steps")
    _count(nbatch_logical, "nbatch_logical")
    epochs, initial_epoch = _epochs(epochs, initial_epoch)
    source = generator_source(generator, steps_per_epoch, epochs - initial_epoch)
    CallbackList(callbacks or ())  # checks the objects before anything runs
    check_verbose(verbose)
    validation_freq = _validation_freq(validation_freq)
    if weight_decay is not None:
        optim.check_weight_decay(weight_decay)
    staged = _with_compile_overrides(model, loss, optimizer)
    cw = class_weights(class_weight, staged)  # against the loss training runs with
    compiled_decay = getattr(staged.optimizer, "weight_decay", 0.0)
    if weight_decay == 0.0 and compiled_decay:
        warn(f"weight_decay=0.0 (fit_generator's default) turns off the weight decay {compiled_decay} of the "
             f"compiled {type(staged.optimizer).__name__}; pass weight_decay=None to keep it (model.fit keeps "
             "it)", UserWarning)
    vit = validation_iterator(staged, validation_generator, validation_steps, 1, "validation_generator",
                              validations=validations_within(initial_epoch, epochs, validation_freq),
                              weight_shape=_element_weights(staged, loss_mask))
    _refuse_non_finite_validation(staged, vit, validations_within(initial_epoch, epochs, validation_freq),
                                  argument=validation_name)
    if epochs <= initial_epoch:
        return History()
    batches = EpochIterator(source, steps_per_epoch)
    with _FirstReads(batches, vit) as reads:
        first = batches.peek(initial_epoch)
        if first is None:
            warn(f"epoch {initial_epoch} (counted from 0) yielded no batch (the generator returned None or was empty); "
                 "nothing was trained", RuntimeWarning)
            return History()
        where = f"epoch {initial_epoch}, step 0 (counted from 0)"
        try:
            x, y, w = parse_batch(first)
            # the first batch sets the size
            rows = prepare_inputs(staged.input_specs, x, "x", bounds=staged.index_bounds())[0].shape[0]
            if rows == 0:
                raise ShapeError("x: the first batch holds no rows, and its rows set the batch size; give batches "
                                 "of at least one sample (a generator ends its epoch by returning None or stopping)")
        except (OrtrainError, ValueError, TypeError) as exc:
            raise located(exc, where) from exc
        val_weighted = _validation_weighted(vit, initial_epoch, staged)
        # batches in a list: a later one's weights count as the first's do
        weights_given = w is not None or bool(_any_weighted(source)) or val_weighted or cw is not None
        one = isinstance(loss_mask, (int, np.integer)) and not isinstance(loss_mask, bool) and loss_mask == 1
        any_loss = (loss_mask is None and weights_given) or one
        trainer = weighing_any_loss(staged, any_loss, batch_size=rows, nbatch_logical=nbatch_logical,
                                    loss_mask=1 if any_loss else loss_mask, weight_decay=weight_decay)
        with trainer:
            try:
                # labels and weights too, before the caller's model changes
                trainer._refuse_non_finite(trainer._feeds(x, y, w, "step", rows, class_weight=cw))
            except (OrtrainError, ValueError, TypeError) as exc:
                raise located(exc, where) from exc
            undo = _commit(model, staged)
            if vit is not None and isinstance(vit.source, ArraySource):
                vit.source.batch_size = rows
            loop = Loop(trainer, batches, epochs=epochs,
                         initial_epoch=initial_epoch, validation=vit, callbacks=callbacks or (), verbose=verbose,
                         model=model, validation_freq=validation_freq, class_weight=cw)
            try:
                return reads.run(loop)
            except BaseException:
                if not reads.trained:  # nothing trained: loss= and optimizer= leave the model as it was
                    undo()
                raise


class _FirstReads:
    """The batches a fit reads from its generators before it trains (the first, to learn the batch
    size; the validation's first, to learn whether it carries weights): handed back to them when
    the fit ends before it trained, the last read first, so the next reader takes them in order."""

    def __init__(self, *iterators: EpochIterator | None):
        self._iterators = [it for it in iterators if it is not None]
        self.trained = False

    def run(self, loop: Loop) -> History:
        """``loop.run()``, noting whether the fit trained (read while its trainer lives)."""
        try:
            history = loop.run()
        except BaseException:
            self.trained = loop.stepped
            raise
        self.trained = True  # a fit that ran keeps what it read, whatever ends its trainer
        return history

    def __enter__(self) -> _FirstReads:
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None and not self.trained:
            for it in reversed(self._iterators):
                it.hand_back()
        return False


@_one_fit_at_a_time("fit")
def fit_model(model: Model, x=None, y=None, *, batch_size=None, epochs=1, verbose=1, callbacks=None,
              validation_split=0.0, validation_data=None, shuffle=True, sample_weight=None, initial_epoch=0,
              steps_per_epoch=None, validation_steps=None, class_weight=None, validation_freq=1,
              keep_trainer=False) -> History:
    """``Model.fit``: arrays (``x`` and ``y``) or a generator (``x`` alone, see :func:`fit_generator`).

    With arrays every sample counts once per epoch: rows are cut into batches of ``batch_size``
    (32 by default) and a shorter last batch is one more training step on its own rows. With
    ``shuffle`` the order is redrawn every epoch, reproducibly from ``ot.set_seed``.
    ``validation_split`` holds out the last fraction of rows (before shuffling);
    ``validation_data`` (arrays or a generator) takes precedence over it, as in Keras.
    ``sample_weight`` weights each sample's loss (and ``weighted_metrics``; ``metrics`` count every
    sample alike, as in Keras), for every loss; for an output
    with positions between the batch and the last axis (``(batch, time, classes)``), it may hold
    one weight per position instead, shaped as the labels' positions (``(batch, time)``: a
    padding mask).
    ``steps_per_epoch`` with arrays, as in Keras 3: an epoch trains the next ``steps_per_epoch``
    batches of the pass the epoch before stopped in (the first epoch of a fit starts a pass), and
    ends where the pass ends; the next epoch starts a new pass (reshuffled). A validation generator's first batch is read before training,
    to learn whether validation carries weights; the first validation uses it.

    ``class_weight``, as in Keras: a dict ``{class index: weight}`` (weights finite and >= 0) for a
    model whose loss takes class labels: sparse or categorical cross-entropy on a
    ``(batch, classes)`` output (the class is the label, or the arg-max of its one-hot row), or
    binary cross-entropy on one output unit (class 1 for a label above 0.5, as Keras rounds).
    Each training sample's loss weight is its class's weight (1.0 for a class the dict leaves
    out, as in Keras 3), times its ``sample_weight`` when given: a class weight is a sample
    weight in every respect (the loss is ``sum(w * loss) / batch``, the training's
    ``weighted_metrics`` are weighted alike). Validation is not weighted by class (held-out rows of ``validation_split``
    keep only their sample weights). A model with several outputs, another loss, a key that is
    not one of the output's classes or a bad weight is refused before anything changes.

    ``validation_freq``, as in Keras: an int ``n`` validates after epoch ``e`` (counted from 0,
    ``initial_epoch`` included) when ``(e + 1) % n == 0``; a list (or tuple, set, range) of epoch
    numbers counted from 1 validates after those. An epoch without validation logs no ``val_``
    values: ``History`` holds NaN there (every list keeps one entry per epoch), ``CSVLogger``
    writes ``NA``, and ``EarlyStopping``, ``ReduceLROnPlateau`` and ``ModelCheckpoint``
    monitoring a ``val_`` value skip that epoch without the warning a missing value gets (their
    patience counts validated epochs, as in Keras). Without validation data it is checked and
    has no effect.

    ``keep_trainer`` (``train_on_batch``'s): the trainer stays open on the model for the next such
    call (:mod:`ortrain._kept_trainer`); any other fit frees the one kept.
    """
    if not model.compiled:
        raise OrtrainError("model: not compiled; call model.compile(optimizer=..., loss=...) before fit")
    if not keep_trainer:
        kept_trainer.release(model)
    if y is None:
        return _fit_generator_through_fit(model, x, batch_size, sample_weight, validation_split,
                                          epochs=epochs, verbose=verbose, callbacks=callbacks,
                                          validation_data=validation_data, initial_epoch=initial_epoch,
                                          steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                                          class_weight=class_weight, validation_freq=validation_freq)
    bs = given = _count(batch_size, "batch_size")
    if given is not None:
        model._check_rows_per_batch(given)
    fixed = check_fixed_rows(model.input_specs, 0, "x", bs)  # a graph's fixed batch is the batch size
    bs = fixed or bs or DEFAULT_BATCH_SIZE
    epochs, initial_epoch = _epochs(epochs, initial_epoch)
    steps_per_epoch = _count(steps_per_epoch, "steps_per_epoch")
    validation_steps = _count(validation_steps, "validation_steps")
    shuffle = checked_flag(shuffle, "shuffle")
    check_verbose(verbose)
    validation_freq = _validation_freq(validation_freq)
    CallbackList(callbacks or ())  # checks the objects before anything runs
    cw = class_weights(class_weight, model)
    arrays = prepare_arrays(model, x, y, sample_weight, "x", "y", "sample_weight")
    if given is None:
        model._check_rows_per_batch(None, len(arrays[1]))
    held = None
    if validation_data is not None:
        check_split(validation_split)  # then ignored, as in Keras
        vit = validation_iterator(model, validation_data, validation_steps, bs,
                                  validations=validations_within(initial_epoch, epochs, validation_freq))
        xs, ys, ws = arrays
    else:
        (xs, ys, ws), held = split_arrays(arrays, validation_split)
        if fixed and held is not None:
            check_fixed_rows(model.input_specs, len(held[1]), "x (the rows validation_split holds out)", bs,
                             split=True)
        if held is not None:
            refuse_non_finite_weights(held[2], "sample_weight (rows held out by validation_split)",
                                      "nothing was trained", first_row=len(ys))  # rows counted in the whole
        vit = None if held is None else EpochIterator(ArraySource(*held, bs), validation_steps)
    if fixed:
        check_fixed_rows(model.input_specs, len(ys), "x" if held is None else
                         "x (the rows validation_split leaves for training)", bs, split=held is not None)
    if cw is not None:
        ws = cw.weigh(ys, ws)  # the training rows only: validation is not weighted by class
    refuse_non_finite_arrays(model, xs, ys, ws)  # the rows it trains on
    _refuse_non_finite_validation(model, vit, validations_within(initial_epoch, epochs, validation_freq),
                                  split=held is not None, trained_rows=len(ys))  # the arrays it validates on too
    with _FirstReads(vit) as reads:
        val_weighted = epochs > initial_epoch and _validation_weighted(vit, initial_epoch, model)
        weighted = ws is not None or val_weighted
        with kept_trainer.turn(model) if keep_trainer else contextlib.nullcontext():
            return _train_arrays(model, reads, xs, ys, ws, vit, weighted, keep_trainer, bs=bs, shuffle=shuffle,
                                 steps_per_epoch=steps_per_epoch, epochs=epochs, initial_epoch=initial_epoch,
                                 callbacks=callbacks, verbose=verbose, validation_freq=validation_freq)


def _train_arrays(model, reads, xs, ys, ws, vit, weighted, keep_trainer, *, bs, shuffle, steps_per_epoch, epochs,
                  initial_epoch, callbacks, verbose, validation_freq) -> History:
    """:func:`fit_model`'s training on arrays checked, with the trainer it builds, or the one
    ``train_on_batch`` kept (``keep_trainer``: kept again for its next call)."""
    settings = kept_trainer.settings_of(model, bs, weighted) if keep_trainer else None
    tr = kept_trainer.take(model, settings) if keep_trainer else None
    if tr is None:
        tr = weighing_any_loss(model, weighted, batch_size=bs, loss_mask=1 if weighted else None)
    kept = False
    try:
        source = ArraySource(xs, ys, ws, bs, shuffle=shuffle, continues=steps_per_epoch is not None)
        loop = Loop(tr, EpochIterator(source, steps_per_epoch), epochs=epochs, initial_epoch=initial_epoch,
                     validation=vit, callbacks=callbacks or (), verbose=verbose, model=model, samples=len(ys),
                     validation_freq=validation_freq)
        loop.keeps_trainer = keep_trainer
        history = reads.run(loop)
        if keep_trainer:
            kept_trainer.keep(model, tr, settings)
            kept = True
            # The loop is a cycle (its callbacks and history point back at it) that only the collector
            # frees: let it hold neither the model nor the trainer, whose sessions the model owns now.
            loop._model = loop.trainer = None
        return history
    finally:
        if not kept:
            kept_trainer.release(model, tr)


def _refuse_non_finite_validation(model: Model, vit: EpochIterator | None, validations: int, split: bool = False,
                                  trained_rows: int = 0, argument: str = "validation_data") -> None:
    """Validation arrays holding NaN or an infinity are refused before anything trains, as the
    training rows are (a NaN there made every epoch's ``val_loss`` NaN, which monitors then read),
    where the fit validates on them (``validations``: how many times). A generator's batches are
    left to the validation, as ``evaluate`` takes them. The rows ``validation_split`` holds out are
    named by their place in ``x`` (``trained_rows`` before them)."""
    if vit is None or not isinstance(vit.source, ArraySource) or not validations:
        return
    source = vit.source
    if split:
        names = [f"{a} (the rows validation_split holds out)" for a in ("x", "y", "sample_weight")]
        if len(model.input_specs) > 1:
            names = [f"x[{s.name!r}] (the rows validation_split holds out)" for s in model.input_specs] + names[1:]
    else:
        names = [f"{argument}[0]" if len(model.input_specs) == 1 else f"{argument}[0][{s.name!r}]"
                 for s in model.input_specs] + [f"{argument}[1]", f"{argument}[2]"]
    arrays = [*source._xs, source._y] + ([source._w] if source._w is not None else [])
    refuse_non_finite(arrays, names[:len(arrays)], "nothing was trained", needs="validation needs finite values",
                      first_row=trained_rows if split else 0)


def _any_weighted(source) -> bool | None:
    """For batches given as a list or tuple (all at hand), whether any carries loss weights; None
    for a source read one batch at a time."""
    held = getattr(source, "_iterable", None)
    if not isinstance(held, (list, tuple)):
        return None
    return any(_weighted_batch(b) for b in itertools.takewhile(lambda b: b is not None, held))


def _weighted_batch(batch) -> bool:
    try:
        return parse_batch(batch)[2] is not None
    except (OrtrainError, ValueError, TypeError):
        return False  # a malformed batch is refused at its step, which the error then names


def _validation_weighted(vit: EpochIterator | None, epoch: int, model: Model | None = None) -> bool:
    """Whether the validation batches carry loss weights, which the trainer needs an input for.
    Arrays say so; from another source the first batch is read now and checked against ``model``
    (its form, inputs and labels), so a source that cannot validate stops the fit before it trains."""
    if vit is None:
        return False
    if isinstance(vit.source, ArraySource):
        return vit.source._w is not None
    listed = _any_weighted(vit.source)
    if listed is not None:
        return listed
    first = vit.peek(epoch)
    try:
        if first is None:
            return False
        x, y, w = parse_batch(first)
        if model is not None:
            prepare_arrays(model, x, y, None)
        return w is not None
    except (OrtrainError, ValueError, TypeError) as exc:
        raise located(exc, f"validation after epoch {epoch}, step 0 (counted from 0)") from exc


def _fit_generator_through_fit(model, x, batch_size, sample_weight, validation_split, **kwargs) -> History:
    if x is None:
        raise OrtrainError("fit: expected x and y arrays, or a generator as x; received neither")
    if isinstance(x, np.ndarray) or looks_like_arrays(x) and isinstance(x[0], np.ndarray):
        raise OrtrainError("y: fit with arrays needs labels (fit(x, y, ...)); to train from a generator pass a "
                           "callable or an iterable of (x, y) batches as x")
    for name, value, unset in (("batch_size", batch_size, None), ("sample_weight", sample_weight, None),
                               ("validation_split", validation_split, 0.0)):
        if (value is not None) if unset is None else not (is_real(value) and value == unset):
            raise OrtrainError(f"{name}: not used with a generator (its batches set the batch size and carry "
                               f"their own sample weights, validation comes from validation_data); "
                               f"received {name}={value!r}")
    return _fit_generator(model, x, steps_per_epoch=kwargs["steps_per_epoch"], epochs=kwargs["epochs"],
                          initial_epoch=kwargs["initial_epoch"], validation_generator=kwargs["validation_data"],
                          validation_steps=kwargs["validation_steps"], callbacks=kwargs["callbacks"],
                          verbose=kwargs["verbose"], weight_decay=None, class_weight=kwargs["class_weight"],
                          validation_freq=kwargs["validation_freq"], validation_name="validation_data")
