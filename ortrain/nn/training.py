"""What a model does and carries for training: ``compile``, ``fit``, ``predict`` and
``evaluate``, the optimizer state and rate between fits (:class:`ShownRate`), the edit log a
running fit reads, and copies detached from any fit (a mixin of :class:`~ortrain.nn.base_model.Model`).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from typing import TYPE_CHECKING

import numpy as np

from ortrain import engine, losses, optim
from ortrain import metrics as metrics_mod
from ortrain._arrays import (
    check_fixed_rows,
    checked_flag,
    positive_int,
    prepare_inputs,
    row_slices,
    rows_free,
    run_chunks,
)
from ortrain._artifact_graphs import LABEL, LOSS, LOSS_SCALE, SAMPLE_WEIGHT, loss_model
from ortrain._keywords import names_unknown_arguments_of
from ortrain._warnings import warn
from ortrain.callbacks.progress import check_verbose
from ortrain.data import prepare_arrays, refuse_non_finite_arrays, refuse_non_finite_weights
from ortrain.errors import FreedError, OrtrainError, ShapeError, describe_shape
from ortrain.graph import TensorSpec
from ortrain.graph.forward import to_inference, with_weights
from ortrain.graph.shapes import output_shape_at
from ortrain.history import History
from ortrain.nn.base_layer import EDITS, sync_live
from ortrain.nn.symbolic import ordered_state, unordered_state

if TYPE_CHECKING:
    from ortrain.nn.base_model import Model

__all__ = ["ShownRate", "TrainingMixin"]


class ShownRate:
    """What ``model.optimizer.lr`` reads outside a fit: the rate the model's next fit starts at,
    which is the rate its optimizer state carries (a schedule's last, as Keras' optimizer keeps
    it) unless a rate was written since, as :class:`ortrain.Trainer` decides. Weak references:
    the optimizer keeps neither the model nor itself alive."""

    def __init__(self, model, opt):
        self._model, self._opt = weakref.ref(model), weakref.ref(opt)

    def __call__(self) -> float:
        model, opt = self._model(), self._opt()
        if model is None or opt is None or model.optimizer is not opt:
            return opt._lr if opt is not None else float("nan")
        state = model._train_state  # the state the next fit starts from, not a running fit's
        return state.lr if state is not None and not model._lr_written() else opt._lr


def _live_or_none(read):
    """What a running fit's ``read`` gives, or None when there is no fit or it ended meanwhile (in
    another thread: its trainer freed after it handed its state to the model, which then holds it)."""
    if read is None:
        return None
    try:
        return read()
    except FreedError:
        return None


class TrainingMixin:
    """Training, prediction and evaluation for :class:`~ortrain.nn.base_model.Model`, with the
    state they keep on the model."""

    def _init_training_state(self) -> None:
        self.loss: losses.Loss | None = None
        self.optimizer: optim.Optimizer | None = None
        self.metrics: list[str] = []
        self.weighted_metrics: list[str] = []  # compile's: weighed by sample and class weights
        self.history = None  # the History of the last fit, as Keras keeps it
        self.stop_training = False  # a callback sets it to end the fit, as in Keras
        self._live_state = None  # set by a running fit: returns its optimizer state once it has stepped
        self._live_updates = None  # set by a running fit: returns its update count once it has stepped
        self._live_seen = None  # set by a running fit: what it last took of optimizer.lr
        self._live_pair = None  # set by a running fit: a save or copy from another thread waits on it
        self._train_state = None  # optimizer state carried between fit() calls
        self._kept = None  # the trainer train_on_batch keeps for its next call (ortrain._kept_trainer)
        self._kept_turn = None  # held through each train_on_batch call once one kept its trainer
        self._runners: dict = {}  # prediction and evaluation sessions, by kind and weights
        self._edits_seen = None  # base_layer.EDITS when the edits were last taken
        self._lr_seen = None  # (optimizer id, its lr_writes) when the last fit ended

    # -- copies and pickles: detached from any fit ----------------------------------------------
    def __getstate__(self) -> dict:
        # A deep copy or a pickle holds the model, not its prediction sessions (a cache, rebuilt on
        # use) nor links to a running or finished fit: the optimizer state as it is now, the
        # history's values, and whether the optimizer's rate was written since the last fit.
        with self._paired():
            return self._state_now()

    def _state_now(self) -> dict:
        sync_live(self)  # a copy taken during a fit holds its trained weights
        state = ordered_state(self.__dict__, [*self.__dict__.get("_inputs", ()), *self.__dict__.get("_outputs", ())],
                              self.__dict__.get("layers", ()), nearest=None)  # see ordered_state
        drawn = state.get("_drawn_before")
        if drawn:  # a seeded Sequential's stack, by layer: the copy's pop() rewinds at its own layers
            state["_drawn_before"] = [(lyr, drawn[id(lyr)]) for lyr in self.layers if id(lyr) in drawn]
        state["_runners"] = {}
        state["_kept"] = state["_kept_turn"] = None  # (the copy's train_state below holds the moments, read out)
        state.pop("_sizes_for", None)  # (made again from the copy's layers)
        state.pop("_trains_memo", None)  # (keyed by this process's FREEZES count)
        state["_live_state"] = state["_live_seen"] = state["_live_updates"] = state["_live_pair"] = None
        state.pop("_fit_thread", None)  # a copy is not fitting
        state["_edits_seen"] = None  # EDITS counts this process's sets: a copy starts over
        from ortrain.nn.saving import PendingTrainState, TrainState
        ts = self.train_state
        if isinstance(ts, PendingTrainState):  # (its moments read out by train_state): the copy's own record
            ts = TrainState(ts.step, ts.lr, ts.moments, ts.n_steps, ts.draws)
        state["_train_state"] = ts
        if self.history is not None:
            detached = History()
            detached.history = {k: list(v) for k, v in self.history.history.items()}
            detached.epoch, detached.params = list(self.history.epoch), dict(self.history.params)
            detached._missing = set(self.history.__dict__.get("_missing", ()))
            state["history"] = detached
        seen, opt = self._seen(), self.optimizer
        state["_lr_seen"] = ("this optimizer", seen[1]) if seen is not None and opt is not None and \
            seen[0] == id(opt) else seen
        # whether the optimizer shows this model: of models pickled together sharing one, the copy of
        # the one it showed shows it again
        state["_opt_shows"] = opt is not None and opt._compiled_model() is self
        return state

    def __copy__(self):
        # copy.copy: a model of its own, sharing the layers, whose optimizer is a copy of the
        # original's values; sharing the optimizer object, the two would take it from each other
        # (a load_state reaching the other one, or none once that is collected)
        new = type(self).__new__(type(self))
        state = self.__getstate__()
        if state.get("optimizer") is not None:
            state["optimizer"] = copy.copy(state["optimizer"])
        if "_rng" in state:  # a seeded Sequential's stack: the copy's add() draws its own
            state["_rng"] = copy.deepcopy(state["_rng"])
        if isinstance(state.get("_drawn_before"), list):
            state["_drawn_before"] = [(lyr, copy.deepcopy(drawn)) for lyr, drawn in state["_drawn_before"]]
        new.__setstate__(state)
        return new

    def __setstate__(self, state: dict) -> None:
        state = unordered_state(state)
        if isinstance(state.get("_drawn_before"), list):
            state["_drawn_before"] = {id(lyr): drawn for lyr, drawn in state["_drawn_before"]}
        self.__dict__.update(state)
        if "_layer_frozen_stats" not in state:  # pickled before frozen layers' statistics were kept apart
            self._layer_frozen_stats = self._frozen_layer_stats()
        seen = self._lr_seen
        if seen is not None and seen[0] == "this optimizer":
            self._lr_seen = (id(self.optimizer), seen[1])
        self.__dict__.setdefault("_live_updates", None)  # pickled before fits counted updates live
        self.__dict__.setdefault("weighted_metrics", [])  # pickled before compile took them
        opt = self.optimizer
        # A pickle or deep copy brings its own optimizer, which shows this model, or of several
        # models pickled together sharing one, the one it showed (the first, where none did).
        shows = self.__dict__.pop("_opt_shows", True)
        if opt is not None and (shows or opt._compiled_model() is None):
            opt._lr_now = ShownRate(self, opt)
            if not opt.params:  # as compile links it: a captured step's optimizer keeps its own state
                opt._link(self)

    def __del__(self) -> None:
        # An optimizer kept after its model (``opt = ot.load_model(path).optimizer``) keeps the state
        # it showed, instead of falling back to a fresh one.
        opt = self.__dict__.get("optimizer")
        if opt is not None:
            try:
                opt._outlive(self)
            except Exception:  # noqa: BLE001 (a finalizer must not raise: at shutdown modules are gone)
                pass
        kept = self.__dict__.get("_kept")  # train_on_batch's trainer: its sessions go with the model
        if kept is not None:
            with contextlib.suppress(Exception):
                kept.trainer.free()

    # -- the compiled optimizer's view: opt.step, opt.state(), opt.load_state() ---------------------
    def _optimizer_step(self) -> int:
        """Updates taken: a running fit's once it has stepped, else those the next fit starts from."""
        live = _live_or_none(self._live_updates)
        if live is not None:
            return live
        state = self._train_state
        return state.step if state is not None else 0

    def _optimizer_weights(self) -> list[str]:
        """The weights that can carry optimizer moments: those that train when not frozen."""
        return [p.name for p in self._base_params() if p.role == "trainable"]

    def _load_optimizer_state(self, step: int, lr: float, moments: dict, n_steps: int, draws: int | None) -> None:
        """``optimizer.load_state`` on this model's optimizer: the next fit (or Trainer) starts from
        it. Refused during a fit (its trainer holds the state) and for moments of other shapes."""
        self._refuse_while_fitting("load_state", "load")
        shapes = self._weight_shapes()
        misfit = self._misfit_moment(moments)  # the names were checked by load_state: a shape differs
        if misfit is not None:
            name, shape = misfit
            raise OrtrainError(f"load_state: moments of {name!r} expected shape {shapes[name]} (the weight's), "
                               f"received {shape}; nothing was changed")
        width = len(next(iter(moments.values()))) if moments else 0  # SGD keeps none
        # a weight without moments starts from zero, as one that starts training does
        moments = {n: moments.get(n) or tuple(np.zeros(shapes[n], np.float32) for _ in range(width))
                   for n in self._optimizer_weights()} if width else {}
        from ortrain.nn.saving import TrainState
        self._train_state = TrainState(step, lr, moments, n_steps=n_steps, draws=draws)
        if self.optimizer is not None:  # (not while compile hands an optimizer's loaded state over)
            self._lr_seen = (id(self.optimizer), self.optimizer.lr_writes)  # the state's rate is the next fit's
            self.optimizer._lr_now = ShownRate(self, self.optimizer)

    def _weight_shapes(self) -> dict[str, tuple]:
        return {p.name: tuple(p.shape) for p in self._base_params()}

    def _misfit_moment(self, moments: dict) -> tuple[str, tuple] | None:
        """(name, shape) of the first moment that is not shaped as a weight of this model (of that
        name, or of any), or None."""
        shapes = self._weight_shapes()
        for name, ms in moments.items():
            for m in ms:
                if tuple(np.shape(m)) != shapes.get(name):
                    return name, tuple(np.shape(m))
        return None

    def _paired(self):
        """Around a save or copy of the model: from another thread than the one fitting it, between two
        of the fit's steps with the trained weights brought over (the weights the model held last and
        the fit's live optimizer state would be of different steps); else nothing to wait for."""
        turn = self.__dict__.get("_kept_turn")
        if turn is not None:  # train_on_batch's calls each hold it whole: between two of them
            return self._turn_then_paired(turn)
        owner, pair = self.__dict__.get("_fit_thread"), self.__dict__.get("_live_pair")
        if owner is not None and pair is not None and owner[0] != threading.get_ident():
            return pair()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _turn_then_paired(self, turn):
        """:meth:`_paired` for a model ``train_on_batch`` keeps a trainer for: its turn first (a call
        holds it, then the fit's lock), so the two locks are always taken in that order."""
        with turn:
            owner, pair = self.__dict__.get("_fit_thread"), self.__dict__.get("_live_pair")
            if owner is not None and pair is not None and owner[0] != threading.get_ident():
                with pair():
                    yield
            else:
                yield

    def _refuse_while_fitting(self, argument: str, verb: str, holds: str = "the optimizer state",
                              instead: str = "") -> None:
        if self.__dict__.get("_live_state") is not None:  # (a Sequential being emptied has none)
            raise OrtrainError(f"{argument}: this model is fitting, and its trainer holds {holds}; "
                               f"{verb} it before fit or after it returns (nothing was changed){instead}")

    # -- the optimizer's rate and state between fits ---------------------------------------------
    def _lr_written(self) -> bool:
        """Whether ``optimizer.lr`` was written (or the optimizer replaced) since the last fit saw
        it: the next fit then starts at that rate instead of its state's."""
        opt = self.optimizer
        return opt is not None and (id(opt), opt.lr_writes) != (self._seen() or (id(opt), 0))

    def _seen(self):
        """(optimizer id, its lr_writes) when a fit last took the rate: a running fit's, else the last."""
        live = self._live_seen() if self._live_seen is not None else None
        return live if live is not None else self._lr_seen

    @property
    def train_state(self):
        """The optimizer state (moments, step, rate) a next ``fit`` continues from, None for fresh
        moments. While a fit runs it is that fit's live state once it has taken a step, so a callback
        that saves or copies ``self.model`` saves the state that goes with its weights, as in Keras
        (each read then copies the moments out of the runtime: read it once per save)."""
        live = _live_or_none(self._live_state)
        if live is not None:
            return live
        state = self._train_state
        if getattr(state, "pending", False):  # moments train_on_batch left in its trainer, copied out now (once)
            with self.__dict__.get("_kept_turn") or contextlib.nullcontext():  # between two of its calls
                state = self._train_state
                _ = state.moments if state is not None else None
        return state

    @train_state.setter
    def train_state(self, value) -> None:
        """A state to continue from (``trainer.export_state()``, or None for fresh moments): checked
        against the model's weights, and refused while a fit runs (its trainer holds the state). The
        next fit trains at the state's rate: a write of ``optimizer.lr`` before it counts no more."""
        from ortrain.nn.saving import TrainState
        self._refuse_while_fitting("train_state", "set")
        if value is not None and not isinstance(value, TrainState):
            raise OrtrainError(f"train_state: expected a trainer's export_state() (or None for fresh moments), "
                               f"received {type(value).__name__}")
        misfit = self._misfit_moment(value.moments) if value is not None else None
        if misfit is not None:
            known = misfit[0] in self._weight_shapes()
            raise OrtrainError(f"train_state: it holds moments of {misfit[0]!r}, which model {self.name!r} has not "
                               f"{'with that shape' if known else 'at all'}: it is the state of another model; "
                               "nothing was changed")
        if value is not None and getattr(self.optimizer, "name", None) == "sgd":
            adams = next((n for n, ms in value.moments.items() if len(ms) > 1 and np.any(ms[1])), None)
            if adams is not None:  # SGD's update divides by sqrt(v) + (1 - momentum)
                raise OrtrainError(f"train_state: it holds a second moment ('v') of {adams!r} that is not 0, as an "
                                   f"Adam's state does, and model {self.name!r} is compiled with SGD, which holds it "
                                   "at 0: hand over a state of an SGD trainer, compile the model with the optimizer "
                                   "that made the state, or set None for fresh moments; nothing was changed")
        self._train_state = value
        if value is not None and self.optimizer is not None:  # its rate is the one the next fit takes
            self._lr_seen = (id(self.optimizer), self.optimizer.lr_writes)
            self.optimizer._lr_now = ShownRate(self, self.optimizer)  # (a write showed its own)

    # -- the edit log: weights set since a running fit last took them ------------------------------
    def _take_edits(self) -> set[str]:
        """The names of the weights set since this model last took them (``set_weights``, a layer's
        own, or through another model sharing the layer, a fit of it included; :class:`~ortrain.nn.
        base_layer.Weights` stamps them). No scan of the layers when no weight was set anywhere since."""
        since = self._edits_seen
        if EDITS[0] == since:
            return set()
        self._edits_seen = EDITS[0]
        since = -1 if since is None else since
        return {f"{lyr.name}.{k}" for lyr in self.layers for k, at in lyr.weights.set_at.items() if at > since}

    def _edits_pending(self) -> bool:
        """Whether a weight may have been set since the edits were last taken (cheap: no scan)."""
        return EDITS[0] != self._edits_seen

    def _keep_edits(self, names: set[str]) -> None:
        """Put back edits taken but not yet acted on: stamped anew, so the next take has them."""
        layers = {lyr.name: lyr for lyr in self.layers}
        if names:
            EDITS[0] += 1
        for name in names:
            layer_name, key = name.rsplit(".", 1)
            layers[layer_name].weights.set_at[key] = EDITS[0]

    # -- compile / fit --------------------------------------------------------------------
    @names_unknown_arguments_of
    def compile(self, optimizer="adam", loss="mse", metrics=None, weighted_metrics=None) -> Model:
        """Choose the optimizer, loss and metrics. Compiling again with the optimizer object the
        model holds (``optimizer=model.optimizer``, say to add a metric) keeps its state (moments and
        step), as Keras does; another optimizer, or a name such as ``"adam"``, starts afresh. The
        optimizer compiled away keeps the state it showed, which compiling this model back on it
        continues, as does a compile after ``optimizer.load_state(state)``.

        As in Keras, ``metrics`` count every sample alike and ``weighted_metrics`` weigh each by its
        ``sample_weight`` and ``class_weight`` (as the loss does). All are checked before any is set:
        a refused compile leaves the model as it was, and so does one during a fit of the model
        (a callback's: its trainer keeps the loss and optimizer it started with).
        """
        self._refuse_while_fitting("compile", "compile", "the loss and optimizer it started with",
                                   "; to change the rate during the fit, set model.optimizer.lr")
        new_optimizer = optim.get(optimizer)
        new_loss = losses.get(loss)
        given = []
        for argument, names in (("metrics", metrics), ("weighted_metrics", weighted_metrics)):
            if isinstance(names, dict) or (isinstance(names, (list, tuple)) and
                                           any(isinstance(n, (list, tuple, dict)) for n in names)):
                raise OrtrainError(f"{argument}: received {names!r}, metrics by output (Keras' form for named or "
                                   "several outputs); ortrain computes the loss and metrics on the model's first output "
                                   "only: pass one list of names, e.g. ['mae']")
            if names is not None and not isinstance(names, (str, list, tuple)):
                raise OrtrainError(f"{argument}: expected a list of names such as ['accuracy'], received {names!r}")
            given.append([names] if isinstance(names, str) else list(names or []))
        new_metrics, new_weighted = given
        metrics_mod.resolve(new_metrics, new_loss, new_weighted)  # validate names now
        first = self.output_specs[0]
        if np.dtype(first.dtype) != np.float32:
            names = ", ".join(f"{s.name!r} ({np.dtype(s.dtype).name})" for s in self.output_specs)
            fix = ("Export the model in float32 (in PyTorch, model.float() before torch.onnx.export): ortrain "
                   "computes losses and trains weights in float32" if np.dtype(first.dtype).kind == "f" else
                   "Make a float output the first one (e.g. return the logits before the arg-max)")
            raise OrtrainError(f"compile: the loss is computed on the model's first output, which must be float32; "
                               f"the outputs are {names}. {fix}")
        if not first.shape:
            raise OrtrainError(f"compile: the loss is computed on the model's first output, which has no batch "
                               f"dimension ({first.name!r} has shape ()); ortrain trains outputs with one row per "
                               "input row. Keep the batch axis in the model (e.g. keepdims=1, or reduce over the "
                               "other axes only)")
        kept = new_optimizer._kept_state(self) if new_optimizer is not self.optimizer else None
        if kept is not None and (set(kept["moments"]) - set(self._optimizer_weights())
                                 or self._misfit_moment(kept["moments"]) is not None):
            warn(f"compile: the optimizer keeps the state of other weights (step {kept['step']}, moments of "
                 f"{', '.join(map(repr, sorted(kept['moments'])[:4]))}), which model {self.name!r} does not "
                 "train: it starts afresh", UserWarning)
            kept = None
        if new_optimizer is not self.optimizer:  # (a compile inside a fit is refused above)
            if self.optimizer is not None:  # it keeps what it showed, as a Keras optimizer its variables
                self.optimizer._detach(self)
            self._train_state = None
            if kept is not None:  # as a Keras optimizer continues with its variables
                self._load_optimizer_state(kept["step"], kept["lr"], kept["moments"], kept["n_steps"],
                                           kept["draws"])
                self._lr_seen = (id(new_optimizer), new_optimizer.lr_writes)  # its rate is the state's
        self.optimizer, self.loss, self.metrics = new_optimizer, new_loss, new_metrics
        self.weighted_metrics = new_weighted
        new_optimizer._lr_now = ShownRate(self, new_optimizer)
        if not new_optimizer.params:  # a captured step's optimizer keeps its own state
            new_optimizer._link(self)
        self._runners.clear()  # evaluate's graph holds the loss
        return self

    @property
    def compiled(self) -> bool:
        return self.loss is not None and self.optimizer is not None

    @names_unknown_arguments_of
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose=1, callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, sample_weight=None, initial_epoch=0, steps_per_epoch=None,
            validation_steps=None, class_weight=None, validation_freq=1):
        """Train on arrays (``x`` and ``y``) or on a generator (``x`` alone, see
        :func:`ortrain.fit_generator`), as Keras' ``fit``: ``batch_size`` (32 by default) rows a
        step, a shorter last batch included; ``validation_split`` holds out the last rows, before
        shuffling; ``validation_data`` arrays or a generator; ``sample_weight`` weights each
        sample's loss and the ``weighted_metrics`` (``metrics`` count every sample alike, as in Keras);
        ``shuffle`` redraws the order every epoch (reproducibly after
        ``ot.set_seed``); ``initial_epoch``/``epochs`` run epochs ``initial_epoch .. epochs-1``;
        ``class_weight`` (``{class index: weight}``, for cross-entropy losses) multiplies each
        training sample's weight by its class's, validation left unweighted; ``validation_freq``
        validates after every ``n``-th epoch (an int) or after the listed epochs (counted from 1),
        and epochs without validation log no ``val_`` values (NaN in the History). Details in
        :func:`ortrain.fit.fit_model`. Returns the :class:`History`; a later ``fit`` continues
        with the same optimizer state."""
        from ortrain.fit import fit_model  # fit's loop builds Trainers, which import the model
        if isinstance(sample_weight, dict) and sample_weight and class_weight is None and \
                all(isinstance(k, (int, np.integer)) and isinstance(v, (int, float, np.number))
                    for k, v in sample_weight.items()):  # Keras' tenth argument (class_weight), in its place
            raise OrtrainError("fit: sample_weight expected one weight per sample, received a dict of numbers: class "
                               "weights ({class index: weight}) go in class_weight=, by keyword (fit's arguments after "
                               "shuffle are sample_weight, initial_epoch, ...; Keras' are class_weight, then "
                               "sample_weight)")
        return fit_model(self, x, y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                         validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
                         sample_weight=sample_weight, initial_epoch=initial_epoch,
                         steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                         class_weight=class_weight, validation_freq=validation_freq)

    @names_unknown_arguments_of
    def train_on_batch(self, x, y, sample_weight=None, class_weight=None, return_dict: bool = False):
        """One training step on one batch, as Keras' ``train_on_batch``: returns the batch's loss
        (from before the update), or ``[loss, *metrics]`` when the model has metrics (a dict with
        ``return_dict=True``). The optimizer state carries on as between fits, and
        ``model.history`` is left as it was.

        The first call builds a trainer (the training sessions, some 10-50 ms for a small model and
        seconds for tens of millions of weights), which the model keeps for the next call: while the
        batch size, the sample weighting, the compiled optimizer, loss and metrics, the layers and their
        settings, which weights train and the thread count stay the same, and no optimizer state was set since, the
        next call is a step and a copy of the weights back to the model (weights set meanwhile, by
        ``set_weights`` or another model's call training a shared layer, are written into it first;
        the optimizer's moments stay in the session until read: ``optimizer.state()``, ``save``, a
        copy, a ``Trainer`` or a ``fit`` of the model copy them out). Anything else, and any ``fit``
        of the model, frees it."""
        from ortrain.fit import fit_model
        checked_flag(return_dict, "train_on_batch(return_dict=...)")
        _needs_labels(y, "train_on_batch")
        history = self.history
        try:
            rows = prepare_inputs(self.input_specs, x, "x")[0].shape[0]   # the whole batch makes one step
            hist = fit_model(self, x, y, batch_size=max(rows, 1), epochs=1, verbose=0, shuffle=False,
                             sample_weight=sample_weight, class_weight=class_weight, keep_trainer=True)
        finally:
            self.history = history
        return _results({k: v[0] for k, v in hist.history.items() if k != "lr"}, return_dict)

    @names_unknown_arguments_of
    def test_on_batch(self, x, y, sample_weight=None, return_dict: bool = False):
        """Keras' ``test_on_batch``: :meth:`evaluate` on one batch, the loss or ``[loss, *metrics]``
        (a dict with ``return_dict=True``)."""
        _needs_labels(y, "test_on_batch")
        return self.evaluate(x, y, sample_weight=sample_weight, return_dict=return_dict)

    # -- inference --------------------------------------------------------------------------
    def _runner(self, kind: str = "predict", weighting=None):
        key = (kind, weighting, self._weights_stamp())
        runner = self._runners.get(key)
        if runner is None or runner._sess is None:  # (freed: in a child forked while another thread ran it)
            fg = self.forward_graph()
            if kind == "predict":
                proto = to_inference(fg.proto)
            else:
                if self.loss is None:
                    raise OrtrainError("evaluate needs a loss: call model.compile(...) first")
                proto = to_inference(loss_model(fg, self.loss, weighting)[0])
            proto = with_weights(proto, fg.weights)
            runner = engine.InferenceRunner(proto)
            self._runners = {key: runner, **{k: v for k, v in self._runners.items() if k[2] == key[2]}}
        return runner

    @names_unknown_arguments_of
    def predict(self, x, batch_size=None, verbose=0) -> np.ndarray | list[np.ndarray]:
        """Outputs for any number of rows, in inference mode (no dropout, running batch-norm statistics).

        One array for a single-output model, a list in output order otherwise. ``batch_size``
        (a positive int) bounds the rows per run; ``None`` runs all rows at once. An imported graph
        whose batch is fixed runs that many rows at a time whatever ``batch_size`` says, its last
        run padded with copies of the last row (their outputs dropped). ``verbose`` is accepted for
        Keras code and shows nothing.
        """
        positive_int(batch_size, "batch_size", allow_none=True)
        check_verbose(verbose)
        xs = prepare_inputs(rows_free(self.input_specs), x, "x", bounds=self.index_bounds(), defer=True)
        outs = run_chunks(self._runner("predict"), self.input_specs, xs, None, batch_size)
        return outs[0] if len(outs) == 1 else outs

    @names_unknown_arguments_of
    def evaluate(self, x, y=None, batch_size=None, sample_weight=None, verbose=0, return_dict: bool = True,
                 steps=None):
        """Mean loss and metrics over all rows (``{"loss": ..., "accuracy": ...}``), in inference mode;
        ``sample_weight`` weighs the loss and the weighted metrics.

        ``x`` and ``y`` are arrays, or, as in Keras, ``x`` alone is a generator of batches in any
        form :func:`ortrain.fit_generator` takes (a callable, an iterable; ``(x, y)`` or ``(x, y,
        sample_weight)``), read for one pass or ``steps`` batches. Arrays are checked whole before
        the first run: shapes, class labels against the number of classes for sparse
        cross-entropy, and values (a NaN or an infinity raises :class:`NonFiniteError`; a generator's
        batch is checked as it comes). ``verbose`` is accepted for Keras code and shows nothing.
        ``return_dict=False`` gives what Keras' default gives: the loss alone without metrics, else
        the list ``[loss, *metrics]``.
        """
        checked_flag(return_dict, "evaluate(return_dict=...)")
        if isinstance(sample_weight, (int, float, str)):  # one number weighs no samples: Keras' verbose, in place
            raise OrtrainError(f"evaluate: sample_weight expected one weight per sample, received {sample_weight!r}; "
                               "the arguments after batch_size are sample_weight, then verbose (Keras' are verbose, "
                               "then sample_weight): pass them by keyword (verbose=0)")
        positive_int(batch_size, "batch_size", allow_none=True)
        check_verbose(verbose)
        positive_int(steps, "steps", allow_none=True)
        ms = metrics_mod.resolve(self.metrics, self.loss, self.weighted_metrics)
        total, n = 0.0, 0
        if y is None and not _arrays_like(x):
            from ortrain.data import EpochIterator, as_source, parse_batch
            if sample_weight is not None:
                raise OrtrainError("evaluate(sample_weight=...): a generator's weights go inside its batches, as "
                                   "(x, y, sample_weight)")
            batches = EpochIterator(as_source(x, "x"), steps)
            for step, batch in batches.epoch(0):
                try:
                    bx, by, bw = parse_batch(batch)
                    loss, rows = self._evaluate_arrays(bx, by, bw, None, ms)
                except OrtrainError as exc:
                    raise type(exc)(f"evaluate, batch {step} (counted from 0): {exc}") from None
                total += loss
                n += rows
            if n == 0:
                raise OrtrainError("evaluate: the generator gave no batch; give it batches of (x, y) or "
                                   "(x, y, sample_weight)")
            if batches.ended_early:
                warn(f"evaluate: the generator ran out after {batches.taken} of steps={steps} batches; the "
                     "results are over those", RuntimeWarning)
        else:
            if y is None:
                raise OrtrainError("evaluate: y is required with array inputs (the labels); a generator of "
                                   "(x, y) batches goes alone in x")
            if steps is not None:
                raise OrtrainError("evaluate(steps=...): counts the batches of a generator given as x; with "
                                   "arrays, give batch_size")
            total, n = self._evaluate_arrays(x, y, sample_weight, batch_size, ms)
        return _results({"loss": total / n, **{m.name: m.result() for m in ms}}, return_dict)

    def _evaluate_arrays(self, x, y, sample_weight, batch_size, ms) -> tuple[float, int]:
        """The summed loss (a batch's mean times its rows) and the rows of arrays ``x``, ``y``,
        updating the metrics ``ms``; everything is checked before the first run."""
        xs, yl, w = prepare_arrays(self, x, y, sample_weight, "x", "y", "sample_weight")
        # (a NaN loss beside metrics that look right reads as a result)
        refuse_non_finite_arrays(self, xs, yl, None, outcome="nothing was evaluated",
                                 needs="evaluation needs finite values")
        refuse_non_finite_weights(w, "sample_weight", "nothing was evaluated")
        n = xs[0].shape[0]
        self._check_rows_per_batch(batch_size, n)
        batch_size = check_fixed_rows(self.input_specs, n, "x", batch_size) or batch_size
        runner = self._runner("evaluate", None if w is None else "sample")
        specs = self.input_specs
        total = 0.0
        for sl in row_slices(n, batch_size):
            feeds = {s.name: a[sl] for s, a in zip(specs, xs)}
            feeds[LABEL] = yl[sl]
            feeds[LOSS_SCALE] = np.array(1.0, np.float32)
            if w is not None:
                feeds[SAMPLE_WEIGHT] = w[sl]
            loss, pred = runner.run(feeds, [LOSS, self.output_specs[0].name])
            total += float(loss) * yl[sl].shape[0]  # (a 1-row prediction may have lost its batch axis)
            for m in ms:
                m.update(pred, yl[sl], None if w is None else w[sl])
        return total, n

    def _n_classes(self, input_shapes=None) -> int | None:
        """How many classes an integer label of the loss indexes (None: labels are no class indices,
        or their number is not known). From the first output's declared width, else, where that is
        free and ``input_shapes`` are given, from its width at those input sizes
        (:meth:`_output_shape_for`)."""
        loss = self.loss
        n = loss.n_classes(self.output_specs[0].shape)
        if n is None and input_shapes is not None and loss.class_labels:
            shape = self._output_shape_for(input_shapes)
            n = None if shape is None else loss.n_classes(shape)
        return n

    def _output_shape_for(self, input_shapes) -> tuple | None:
        """The first output's shape for inputs of ``input_shapes`` (free dimensions None): the declared
        one, or where it has free dimensions after the batch (a sequence of any length), onnx's
        shape inference at those sizes, found once for each."""
        declared = tuple(self.output_specs[0].shape)
        if all(d is not None for d in declared[1:]):
            return declared
        key = tuple(tuple(int(d) for d in s[1:]) for s in input_shapes)
        found = self.__dict__.setdefault("_shapes_at", {})
        if key not in found:
            found[key] = output_shape_at(self._base_proto(), {p.name for p in self.params()}, key)
        return found[key] or declared

    def _check_rows_per_batch(self, batch_size, rows: int | None = None) -> None:
        """Where the first output's first axis is fixed at k while the inputs' batch is free, fit and
        evaluate need ``batch_size=k``, given, or (``rows``, without a batch size) one batch of
        exactly k rows: an output the export declared at its example batch trains so, and nothing
        in the shapes tells it from a transposed one, whose rows are not samples (the one a file
        names as such is refused by :meth:`_label_spec_for`)."""
        fixed = self._fixed_output_rows()
        if fixed is None or batch_size == fixed or (batch_size is None and rows == fixed) or self._batch_not_first():
            return
        self._refuse_rows(fixed, f"batch_size={batch_size}" if batch_size is not None else f"{rows} rows in one batch")

    def _refuse_rows(self, fixed: int, received: str):
        out = self.output_specs[0]
        raise ShapeError(f"batch_size: output {out.name!r} has shape {describe_shape(out.shape)}: its first axis is "
                         f"fixed at {fixed} while the inputs' batch is free, so every batch must hold exactly {fixed} "
                         f"rows; received {received}. Give batches of {fixed} rows (batch_size={fixed}) if that "
                         "axis is the batch (an output the export declared at its example batch), or put the batch "
                         "first in the model's output (a transposed output's rows are not samples)")

    def _fixed_output_rows(self) -> int | None:
        """k where the first output's first axis is fixed at k while a later one and every input's
        batch are free (a later check tells the batch kept at an example's size from a transpose)."""
        out, specs = self.output_specs[0].shape, self.input_specs
        if out and out[0] is not None and None in out[1:] and specs and all(s.shape and s.shape[0] is None
                                                                              for s in specs):
            return out[0]
        return None

    def _batch_not_first(self) -> bool:
        """Whether the file names one of the first output's later axes as the inputs name their batch
        (a transposed or sequence-first output, (3, N) for inputs (N, 4)): its rows are not samples."""
        proto = self.__dict__.get("_proto")
        if proto is None:
            return False

        def named(vi, axis: int) -> str:
            dims = vi.type.tensor_type.shape.dim
            return dims[axis].dim_param if axis < len(dims) else ""

        params = {p.name for p in self.params()}
        batch = {named(vi, 0) for vi in proto.graph.input if vi.name not in params} - {""}
        out = proto.graph.output[0]
        return bool(batch & {named(out, i) for i in range(1, len(out.type.tensor_type.shape.dim))})

    def _label_spec(self) -> TensorSpec:
        """The loss's label input for this model's first output."""
        if self.loss is None:
            raise OrtrainError("the model is not compiled: call model.compile(optimizer=..., loss=...) first")
        pred = self.output_specs[0]
        return TensorSpec("y", self.loss.label_dtype, self.loss.label_shape(pred.shape))

    def _label_spec_for(self, input_shapes, whole: bool = True) -> TensorSpec:
        """The label input for inputs of ``input_shapes``: where the output has free dimensions after
        the batch (a sequence of any length), the labels must hold those of the prediction for
        these inputs (onnxruntime would read other labels without a word, or fail in the step).
        ``whole``: the shapes are whole arrays, which calls cut into batches (else one batch's)."""
        spec = self._label_spec()
        out = self.output_specs[0]
        fixed = self._fixed_output_rows()
        if fixed is not None and input_shapes and input_shapes[0]:
            rows = input_shapes[0][0]
            if self._batch_not_first():  # (3, N): no label rows can be cut from y batch by batch
                raise ShapeError(f"output {out.name!r} has shape {describe_shape(out.shape)}, the inputs' batch on a "
                                 "later axis, so its rows are not the samples. fit, evaluate and Trainer take one "
                                 "label row per input row; put the batch first in the model's output (e.g. transpose "
                                 "it back in the model before exporting)")
            if (rows % fixed if whole else rows != fixed):  # (whole arrays are cut into batches of it)
                self._refuse_rows(fixed, f"{rows} rows" + ("" if whole else " in a batch"))
        if all(d is not None for d in spec.shape[1:]):
            return spec
        out = self._output_shape_for(input_shapes)
        known = None if out is None else self.loss.label_shape(out)
        if known is None or len(known) != len(spec.shape):
            return spec
        return TensorSpec(spec.name, spec.dtype,
                          spec.shape[:1] + tuple(s if s is not None else k for s, k in zip(spec.shape[1:], known[1:])))


def _results(logs: dict, as_dict: bool):
    """Keras' return forms of evaluate and the on-batch calls: the dict, or without
    ``return_dict`` the loss alone (no metrics) or ``[loss, *metrics]``."""
    if as_dict:
        return logs
    return logs["loss"] if len(logs) == 1 else list(logs.values())


def _arrays_like(x) -> bool:
    """Whether ``x``, given without labels, is input arrays (numpy's, torch's, pandas'; several as a
    list of them or a dict by input name; nested lists of numbers) rather than a generator of
    batches (a callable, an iterator, a list of ``(x, y)`` tuples)."""
    if isinstance(x, np.ndarray) or hasattr(x, "shape"):
        return True
    if isinstance(x, dict):
        return "labels" not in x
    if isinstance(x, list):  # input arrays, or rows of numbers; a list of [x, y] lists is batches
        return bool(x) and all(hasattr(v, "shape") or isinstance(v, (int, float, np.number)) or
                               (isinstance(v, list) and not any(hasattr(e, "shape") for e in v)) for v in x)
    return False


def _needs_labels(y, method: str) -> None:
    if y is None:
        raise OrtrainError(f"{method}(x, y): y, the batch's labels, is required; received None")
