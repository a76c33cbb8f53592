"""The epoch loop: one run of epochs over a trainer, with its callbacks, validation and history
(see :mod:`ortrain.fit` for who owns which argument). Callbacks see it as ``callback.loop``."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

import numpy as np

from ortrain import metrics as metrics_mod
from ortrain._class_weight import ClassWeights
from ortrain._lifetime import new_lock
from ortrain._warnings import warn
from ortrain.callbacks.base import CallbackList
from ortrain.callbacks.progress import ProgressLines, progress
from ortrain.data import ArraySource, EpochIterator, parse_batch
from ortrain.errors import OrtrainError, ShapeError
from ortrain.history import History
from ortrain.nn.base_layer import LIVE_SYNC, what_trains
from ortrain.nn.model import Model
from ortrain.nn.training import ShownRate
from ortrain.trainer import Trainer

__all__ = ["Loop", "located"]


def located(exc: Exception, where: str) -> Exception:
    """The same error type, its message prefixed with the epoch and step it happened at."""
    try:
        return type(exc)(f"{where}: {exc}")
    except Exception:  # noqa: BLE001 - an exotic constructor: keep the original
        return exc


# -- the loop -------------------------------------------------------------------------------------
def validates_after(epoch: int, validation_freq: int | frozenset[int]) -> bool:
    """Whether ``validation_freq`` (Keras': every n-th epoch, or epoch numbers counted from 1)
    takes epoch ``epoch`` (counted from 0)."""
    freq = validation_freq
    return (epoch + 1) % freq == 0 if isinstance(freq, int) else epoch + 1 in freq


def validations_within(initial_epoch: int, epochs: int, validation_freq: int | frozenset[int]) -> int:
    """How many of the epochs from ``initial_epoch`` to ``epochs`` (counted from 0, the end
    excluded) ``validation_freq`` takes; counted, not scanned (``epochs`` may be any size)."""
    freq = validation_freq
    if isinstance(freq, int):
        return max(epochs // freq - initial_epoch // freq, 0)
    return sum(initial_epoch < k <= epochs for k in freq)


class Loop:
    """One run of the epoch loop; callbacks see it as ``callback.loop``."""

    def __init__(self, trainer: Trainer, iterator: EpochIterator, *, epochs: int, initial_epoch: int,
                 validation: EpochIterator | None, callbacks, verbose, model: Model | None,
                 samples: int | None = None, validation_freq: int | frozenset[int] = 1,
                 class_weight: ClassWeights | None = None):
        self.trainer = trainer
        self.iterator = iterator
        self.validation = validation
        self.validation_freq = validation_freq
        self.class_weight = class_weight  # for generator batches; arrays carry theirs in their weights
        self.epochs, self.initial_epoch = epochs, initial_epoch
        self._model = model
        self._synced_at = None
        # the loop's own reads of the model, which bring nothing over: per thread, as another thread's
        # save brings the weights over under the loop's turn (paired) while the fit's thread reads
        self._own = threading.local()
        # Held while a step runs, the model takes the trained weights, or the fit hands them over at
        # its end: another thread that saves or copies the model waits for it (:meth:`paired`). A
        # forked child gets a fresh one (the fit's thread that held it does not exist there, and a
        # save would wait forever): it reaches the trainer, whose session says it was busy at the fork.
        self._lock = new_lock(self)
        self._thread = None  # the thread the fit runs on (run sets it)
        self._accum_told = None  # the step at which a read part-way through an nbatch_logical period warned
        self._steps_at_start = trainer.n_steps
        # train_on_batch keeps its trainer for the next call: the moments stay in its session until read
        self.keeps_trainer = False
        base = trainer._model
        self.base_lr = base.optimizer._lr  # the compiled (or last written) rate, not a fit's last
        self.metrics = metrics_mod.resolve(base.metrics, base.loss, base.weighted_metrics)
        self.val_metrics = metrics_mod.resolve(base.metrics, base.loss, base.weighted_metrics)
        source = iterator.source
        steps = iterator.steps
        size = source.batches_per_epoch if isinstance(source, ArraySource) else getattr(source, "size", None)
        if size is not None:
            steps = min(steps or size, size)
        self.steps_hint = steps
        self.params = {"epochs": epochs, "initial_epoch": initial_epoch, "steps": steps,
                       "batch_size": trainer.batch_size, "samples": samples, "verbose": verbose,
                       "metrics": self._log_names()}
        self.stop_training = False
        self.epoch = initial_epoch
        self.epoch_steps = 0
        self.epoch_samples = 0
        self.history = History()
        # one display: a progress callback of the caller's on standard output stands for the one verbose
        # makes, as in Keras (one writing to a log file leaves it)
        display = None if any(isinstance(cb, ProgressLines) and cb.file is sys.stdout for cb in callbacks) \
            else progress(verbose)
        self.live_bar = None  # the progress bar being drawn, which callbacks' messages go above
        self.callbacks = CallbackList([*callbacks, self.history, *([display] if display else [])])
        self.callbacks.set_loop(self)
        self.callbacks._after = self._take_model_edits
        self._warned_short = False
        self._warned_short_validation = False
        self._trains = None  # the weights this fit trains, until a change of them is said
        # What a callback changes through ``model`` reaches the training, as in Keras: weights it
        # sets, a learning rate it writes to ``model.optimizer.lr``, ``model.stop_training``.
        # fit and fit_generator build their trainer from the model's weights, so what was set on
        # it before is in the trainer already (fit.train with a trainer built earlier keeps the
        # trainer's weights).
        if model is not None:
            model._take_edits()  # what was set before the fit is in the trainer already
            opt = model.optimizer
            # A model no fit has seen (new, loaded, copied) counts its optimizer as not written yet.
            if model._lr_written():
                trainer.set_lr(opt._lr)  # model.optimizer.lr was written since
            self._lr_seen = (id(opt), _lr_writes(opt))

    def _log_names(self) -> list[str]:
        names = ["loss", *(m.name for m in self.metrics)]
        if self.validation is not None and validations_within(self.initial_epoch, self.epochs, self.validation_freq):
            names += [f"val_{n}" for n in names]
        return names + ["lr"]

    @property
    def stepped(self) -> bool:
        """Whether this run took a training step (else the model's optimizer state stands)."""
        return self.trainer.n_steps != self._steps_at_start

    # -- what callbacks use --------------------------------------------------------------------
    def validates(self, epoch: int) -> bool:
        """Whether validation runs at the end of ``epoch`` (counted from 0): the fit has validation
        data and ``validation_freq`` takes this epoch (counted from 1, as Keras counts it)."""
        return self.validation is not None and validates_after(epoch, self.validation_freq)

    def first_without_validation(self) -> int | None:
        """The first of the fit's epochs after which validation data is not read (``validation_freq``),
        None for none; found without scanning every epoch (``epochs`` may be any size)."""
        if self.validation is None or self.validation_freq == 1:
            return None
        epoch = self.initial_epoch
        while epoch < self.epochs and self.validates(epoch):
            epoch += 1  # (at most once for a frequency above 1, len(freq) times for a set of epochs)
        return epoch if epoch < self.epochs else None

    def _names(self) -> list[str]:
        return [p.name for p in self.trainer._params]

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the trained weights, in ``model.get_weights()`` order."""
        session = self.trainer._session
        return [session.get(n) for n in self._names()]

    def set_weights(self, weights) -> None:
        """Write weights (``get_weights()`` order) into the trainer; checked before anything changes."""
        names = self._names()
        weights = list(weights)
        if len(weights) != len(names):
            raise OrtrainError(f"set_weights: expected {len(names)} arrays ({', '.join(names)}), "
                               f"received {len(weights)}")
        staged = []
        for p, w in zip(self.trainer._params, weights):
            a = np.asarray(w, dtype=p.dtype)
            if a.shape != tuple(p.shape):
                raise ShapeError(f"set_weights: {p.name!r} expected shape {tuple(p.shape)}, received {a.shape}")
            staged.append((p.name, a))
        session = self.trainer._session
        for name, a in staged:
            session.set(name, a)

    @property
    def model(self) -> Model | None:
        """The caller's model, brought up to date with the trainer's weights when read."""
        writes = self.trainer._session.writes
        m = self._model
        if m is not None and self._synced_at != writes:
            with self._lock, self._reading():
                # Edits a hook made and the loop has not taken over yet stay the model's, to be taken
                # when the hook returns; every other weight comes from the trainer.
                pending = m._take_edits()
                m._take_trained({n: w for n, w in zip(self._names(), self.get_weights()) if n not in pending})
                m._take_edits()  # the trainer's own weights, no edit
                m._keep_edits(pending)
                self._synced_at = writes
        return m

    @contextmanager
    def _reading(self):
        """The loop's own reads and writes of the model: they bring nothing over from the trainer."""
        outer, self._own.reads = getattr(self._own, "reads", False), True
        try:
            yield
        finally:
            self._own.reads = outer

    @contextmanager
    def paired(self):
        """For a save or copy of the model from another thread than the fit's: between two steps, with
        the trained weights brought over, so the weights and the optimizer state it reads are of one
        step (a callback handing the model to a process pool pickles it on the pool's thread)."""
        with self._lock:
            _ = self.model
            yield

    def _sync(self) -> None:
        """While this fit runs, the model (or one of its layers) is read on the fit's thread (by a
        callback holding it, a generator predicting with it): it gets the trained weights first,
        as ``callback.model`` does. Another thread reads what the model held last."""
        if not getattr(self._own, "reads", False) and threading.get_ident() == self._thread:
            _ = self.model

    def _link(self) -> None:
        """Register the model and its layers (a layer another model shares too: that model's reads
        of it see this fit's weights), keeping what a fit running around this one registered."""
        m = self._model
        self._linked = {id(obj): LIVE_SYNC.get(id(obj)) for obj in (m, *getattr(m, "layers", ()))}
        for key in self._linked:
            LIVE_SYNC[key] = self._sync

    def _unlink(self) -> None:
        """Undo :meth:`_link` for what it registered (layers added or removed since included): an
        entry this fit replaced comes back if its fit still runs (fits in two threads sharing a
        layer need not end in the reverse order they began)."""
        self._ended = True
        for key, before in getattr(self, "_linked", {}).items():
            if LIVE_SYNC.get(key) == self._sync:  # bound methods compare by their object
                if before is None or getattr(before.__self__, "_ended", False):
                    del LIVE_SYNC[key]
                else:
                    LIVE_SYNC[key] = before
        self._linked = {}

    def _take_model_edits(self) -> None:
        """After each callback's hook: the weights it set on ``model`` (those names only: the
        others may be out of date), a learning rate it wrote to ``model.optimizer.lr`` (or a new
        optimizer it compiled) and ``model.stop_training`` take effect in the training."""
        m = self._model
        if m is None:
            return
        with self._reading():
            self._take_edits_of(m)

    def _model_edited(self, m: Model) -> bool:
        """Whether weights, ``optimizer.lr`` or ``stop_training`` may have been written on the model
        since the loop last took its edits (by a generator, another thread or a signal handler, which
        no callback hook follows): cheap, no scan of the layers."""
        opt = m.optimizer
        return m._edits_pending() or m.stop_training or (id(opt), _lr_writes(opt)) != self._lr_seen

    def _take_edits_of(self, m: Model) -> None:
        edits = m._take_edits()
        if edits:
            table, session = m._weight_table(), self.trainer._session
            in_sync = self._synced_at == session.writes
            for name in edits:
                session.set(name, table[name])
            if in_sync:  # the model held the trainer's weights and now both hold its edits
                self._synced_at = session.writes
        opt = m.optimizer
        if opt is not None and (id(opt), _lr_writes(opt)) != self._lr_seen:  # written (or recompiled)
            self._lr_seen = (id(opt), _lr_writes(opt))
            self.trainer.set_lr(opt._lr)
            self._arm(opt)  # reads show the live rate again
        if getattr(m, "stop_training", False):
            self.stop_training = True

    # -- running -------------------------------------------------------------------------------
    def run(self) -> History:
        cbs = self.callbacks
        logs: dict = {}
        if self._model is not None:
            self._model.stop_training = False
        cbs.check()  # before any callback starts: a refusal changes nothing
        if self._model is not None:
            self._model._live_state = self._live_state
            self._model._live_updates = self._live_updates
            self._model._live_seen = self._seen_now
            self._model._live_pair = self.paired
            self._arm(self._model.optimizer)
            self._thread = threading.get_ident()
            self._link()
            with self._reading():
                self._trains = what_trains(self._model)  # what this fit's graphs fix
        try:
            cbs.on_train_begin({})
            for epoch in range(self.initial_epoch, self.epochs):
                self.epoch = epoch
                cbs.on_epoch_begin(epoch, {})
                logs = self._train_epoch(epoch)
                if logs is None:
                    break
                if self.validates(epoch):
                    logs.update(self._validate(epoch))
                logs["lr"] = self.epoch_lr
                cbs.on_epoch_end(epoch, logs)
                if self._model is not None:
                    # as Keras sets it, once an epoch has ended: a fit refused or stopped before that
                    # leaves the last fit's history
                    self._model.history = self.history
                self._check_what_trains()
                if self.stop_training:
                    if self._model is not None:
                        self._model.stop_training = True  # as Keras leaves it
                    break
                if self.iterator.source.exhausted and epoch + 1 < self.epochs:
                    self._warn_dry(epoch)
                    break
        finally:
            try:
                cbs.on_train_end(logs)
            finally:
                self._finish()
        return self.history

    def _check_what_trains(self) -> None:
        """A change of the weights that train during the fit (``layer.trainable``, ``freeze`` or
        ``unfreeze`` from a callback or another thread) counts from the next fit: said once."""
        model = self._model
        if model is None or self._trains is None:
            return
        with self._reading():  # names only: the model need not take the trained weights for that
            if what_trains(model) == self._trains:
                return
        self._trains = None
        warn("the weights that train changed during this fit (layer.trainable, freeze, unfreeze, freeze_bn_stats or "
             "unfreeze_bn_stats): the running "
             "fit's graphs fix which weights train, so the change takes effect from the next fit, as a Keras model "
             "needs compile again. To fine-tune after some epochs, fit again with initial_epoch=", UserWarning)

    def _warn_dry(self, epoch: int) -> None:
        warn(f"the generator ran dry in epoch {epoch} (counted from 0); training stops. A one-shot "
             "iterator must hold steps_per_epoch * epochs batches; pass a re-iterable or a callable "
             "to train longer", RuntimeWarning)

    def _warn_empty(self, epoch: int) -> None:
        if self.iterator.source.exhausted:
            what = "the generator ran dry"
        else:
            what = "the generator returned no batch"
        warn(f"epoch {epoch} (counted from 0) yielded no batch ({what}); training stops. A finite "
             "callable must reset itself before returning None so the next call starts the next "
             "epoch", RuntimeWarning)

    def _train_epoch(self, epoch: int) -> dict | None:
        tr = self.trainer
        bs = tr.batch_size
        cbs = self.callbacks
        hooks = cbs.has_batch_hooks
        metrics = self.metrics
        for m in metrics:
            m.reset()
        # Batches hold at most batch_size rows (the first batch's, for a generator): a shorter one
        # (an array fit's last, a DataLoader's without drop_last) is a step on its own rows.
        checked = isinstance(self.iterator.source, ArraySource)  # whole arrays were checked up front
        model = self._model
        total = 0.0
        seen = 0
        step = -1
        for step, batch in self.iterator.epoch(epoch):
            if hooks:
                cbs.on_batch_begin(step, {"batch": step})
            try:
                if type(batch) is tuple and len(batch) == 2:
                    x, y = batch
                    w = None
                else:
                    x, y, w = parse_batch(batch)
                    if w is not None and tr._weight_spec is None:
                        raise OrtrainError("sample_weight: this batch carries loss weights but the first batch did "
                                           "not, so training started without them; pass loss_mask=1 to "
                                           "fit_generator, or give every batch weights (ones where none apply)")
                if model is not None and self._model_edited(model):  # a generator's edits: this step's
                    self._take_model_edits()
                with self._lock:
                    fetches, labels, weights = tr._step(x, y, w, None, checked, self.class_weight, most=bs)
                lr = tr.lr  # the rate this step took, before a batch hook writes the next one
                loss = float(fetches[1].numpy())
                rows = labels.shape[0]
                if metrics:
                    _update(metrics, fetches[2].numpy(), labels, weights)
            except (OrtrainError, ValueError, TypeError) as exc:
                raise located(exc, f"epoch {epoch}, step {step} (counted from 0)") from exc
            total += loss * rows
            seen += rows
            if hooks:  # as Keras 3: the epoch's running means so far, loss and metrics
                logs = {"batch": step, "size": rows, "loss": total / seen}
                logs.update((m.name, m.result()) for m in metrics)
                cbs.on_batch_end(step, logs)
            if model is not None and model.stop_training:  # set by another thread or a signal handler
                self.stop_training = True
            if self.stop_training:
                break
        self.epoch_steps, self.epoch_samples = step + 1, seen
        if seen == 0:
            self._warn_empty(epoch)
            return None
        if self.iterator.steps is None and self.steps_hint is None:
            self.steps_hint = step + 1
        self._check_short(epoch, step + 1)
        logs = {"loss": total / seen}
        logs.update((m.name, m.result()) for m in metrics)
        self.epoch_lr = lr
        return logs

    def _check_short(self, epoch: int, taken: int) -> None:
        it = self.iterator
        if not it.ended_early or self._warned_short:
            return
        self._warned_short = True
        if getattr(it.source, "continues", False):  # arrays read in passes across epochs (Keras 3)
            warn(f"epoch {epoch}: the pass over the arrays ended after {taken} of steps_per_epoch={it.steps} "
                 f"batches ({it.source.rows} rows make {it.source.batches_per_epoch} batches of "
                 f"{it.source.batch_size}); the next epoch starts a new pass (warned once)", RuntimeWarning)
        elif it.source.exhausted:  # a one-shot iterator used up, as Keras' "Your input ran out of data"
            if epoch + 1 >= self.epochs:  # with epochs to go, the loop says it as it stops (_warn_dry)
                warn(f"epoch {epoch}: the generator ran out of data after {taken} of steps_per_epoch="
                     f"{it.steps} batches. A one-shot iterator gives its batches once: pass a list or another "
                     "re-iterable, a callable, or steps_per_epoch * epochs batches", RuntimeWarning)
        else:
            warn(f"epoch {epoch}: the generator ended the epoch after {taken} of steps_per_epoch="
                 f"{it.steps} batches; epochs stay this short (warned once)", RuntimeWarning)

    def _validate(self, epoch: int) -> dict:
        tr = self.trainer
        metrics = self.val_metrics
        for m in metrics:
            m.reset()
        total = 0.0
        seen = 0
        for step, batch in self.validation.epoch(epoch):
            try:
                x, y, w = parse_batch(batch)
                fetches, labels, weights = tr._eval(x, y, w, None)
                loss = float(fetches[1].numpy())
                if metrics:
                    _update(metrics, fetches[2].numpy(), labels, weights)
            except (OrtrainError, ValueError, TypeError) as exc:
                raise located(exc, f"validation after epoch {epoch}, step {step} (counted from 0)") from exc
            rows = labels.shape[0]
            total += loss * rows
            seen += rows
        if seen == 0:
            warn(f"validation after epoch {epoch} yielded no batch; no val_ values are logged",
                 RuntimeWarning)
            return {}
        it = self.validation
        if it.ended_early and not self._warned_short_validation:  # as evaluate(steps=) warns
            self._warned_short_validation = True
            warn(f"validation after epoch {epoch}: the validation data ran out after {it.taken} of validation_steps="
                 f"{it.steps} batches; the val_ values are over those (warned once)", RuntimeWarning)
        return {"val_loss": total / seen, **{f"val_{m.name}": m.result() for m in metrics}}

    def _seen_now(self):
        """The model's ``_lr_seen`` while this fit runs and has stepped: the rate it took over last
        (so a save or copy mid-fit pairs the live state with the live rate)."""
        return self._lr_seen if self.stepped else None

    def _live_state(self):
        """The model's ``train_state`` while this fit runs: the trainer's once it has stepped. Read
        part-way through an ``nbatch_logical`` period (a callback's save or copy), it leaves out the
        gradients accumulated since the last update, as ``save_checkpoint`` does, and warns so."""
        tr = self.trainer
        if self.stepped and tr._accum and tr.nbatch_logical > tr.batch_size and \
                self._accum_told != tr.n_steps:  # once a step (a pickle reads it twice)
            self._accum_told = tr.n_steps
            warn(f"model.train_state (read by a save or copy) is read {tr._accum} batch(es) into an accumulation "
                 f"period of nbatch_logical={tr.nbatch_logical}: their gradients are not part of it, and a fit "
                 "continued from it starts a new period; save at the end of a period (after every "
                 f"{tr.nbatch_logical // tr.batch_size} batches) for an exact continuation", RuntimeWarning)
        return tr._state() if self.stepped else None

    def _live_updates(self):
        """The model's optimizer step count while this fit runs: the trainer's once it has stepped."""
        return self.trainer.n_updates if self.stepped else None

    def _live_lr(self) -> float:
        return self.trainer.lr

    def _arm(self, opt) -> None:
        """While this fit runs, ``model.optimizer.lr`` reads the rate it trains at (a schedule's
        included), as a Keras callback reads its optimizer's; outside a fit it reads the rate the
        optimizer holds (compiled or written), which the next fit takes only when written."""
        armed = getattr(self, "_armed", None)
        if armed is not None and armed is not opt:  # recompiled with another optimizer meanwhile
            armed._lr_now = None
        self._armed = opt
        if opt is not None:
            opt._lr_now = self._live_lr
            if self._model is not None and not opt.params:  # opt.step and state() follow this fit's model
                opt._link(self._model)

    def _disarm(self) -> None:
        """After the fit ``model.optimizer.lr`` reads the rate the model's next fit starts at."""
        opt = getattr(self, "_armed", None)
        if opt is not None:
            opt._lr_now = ShownRate(self._model, opt) if self._model is not None else None
            self._armed = None

    def _finish(self) -> None:
        tr = self.trainer
        interrupt = None
        try:
            while self._model is not None:
                # Weights and optimizer state go back together: a Ctrl-C in between would leave the
                # model trained with the state of before, so it waits until both are written (a second
                # one not).
                try:
                    # The state is read first: where it cannot be (a full temporary folder), the model
                    # keeps its weights too. A fit that took no step leaves the optimizer state as it
                    # was, and a rate written on model.optimizer still to be taken up by the next fit.
                    with self._lock:
                        state = None if not self.stepped else tr._pending_state() if self.keeps_trainer else \
                            tr._state()
                        _ = self.model  # brings the weights over (a callback may have set some)
                        if self.stepped:
                            self._model._train_state = state  # not the setter, which refuses it mid-fit
                            self._model._lr_seen = self._lr_seen  # a rate written from now on is for the next fit
                    break
                except KeyboardInterrupt as exc:
                    if interrupt is not None:
                        raise
                    interrupt = exc
        finally:
            # only now: another thread reading the model meanwhile still read this fit's live state
            if self._model is not None:
                self._unlink()
                self._model._live_state = None
                self._model._live_seen = None
                self._model._live_updates = None
                self._model._live_pair = None
                self._disarm()
        if interrupt is not None:
            raise interrupt
        if tr._accum and tr.nbatch_logical > tr.batch_size:  # last: an "error" filter cannot lose the state
            warn(f"training ended {tr._accum} batch(es) into an accumulation period of nbatch_logical="
                 f"{tr.nbatch_logical}; their gradients are dropped (make steps per fit a multiple "
                 f"of {tr.nbatch_logical // tr.batch_size})", RuntimeWarning)


def _lr_writes(opt) -> int:
    return opt.lr_writes if opt is not None else 0


def _update(metrics, pred: np.ndarray, labels: np.ndarray, weights: np.ndarray | None) -> None:
    """Metrics from a step's predictions and the labels and weights the trainer checked and fed."""
    for m in metrics:
        m.update(pred, labels, weights)
