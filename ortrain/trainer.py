"""``Trainer``: a training context you step yourself.

It holds one onnxruntime-training session (weights, gradients, optimizer moments)
for a compiled model and keeps ortrain's own counters beside it: ``n_steps``
(``step()`` calls), the number of optimizer updates, the batches accumulated
towards the next update, and the learning rate, which is set on the session
before every update.

How the session is set up (for a model, from a checkpoint or from artifacts) and
saved to checkpoints is in ``ortrain._trainer_setup``; ``Snapshot`` is in
``ortrain._snapshot``.
"""

from __future__ import annotations

import numpy as np
import onnx

from ortrain import _trainer_setup, engine
from ortrain._arrays import (
    is_real,
    label_positions,
    of_the_output,
    positive_int,
    prepare_inputs,
    prepare_labels,
    prepare_sample_weight,
    refuse_non_finite,
    rows_free,
    run_chunks,
    staged_weights,
)
from ortrain._keywords import name_unknown_arguments, names_unknown_arguments_of_methods
from ortrain._lifetime import Releasable, locked
from ortrain._snapshot import Snapshot
from ortrain._trainer_setup import TrainerSetup, left_out
from ortrain._warnings import warn
from ortrain.data import refuse_non_finite_weights
from ortrain.engine import denormals
from ortrain.engine.session import despite_interrupts
from ortrain.errors import FreedError, NonFiniteError, OrtrainError, ShapeError
from ortrain.graph.forward import to_inference
from ortrain.graph.passes import batchnorm_nodes, with_extra_outputs
from ortrain.nn.base_layer import FREEZES, what_trains
from ortrain.nn.model import Model
from ortrain.nn.saving import PendingTrainState, TrainState
from ortrain.optim import check_lr

__all__ = ["Snapshot", "Trainer"]

CALIBRATION_ROWS = 1024


class Trainer(TrainerSetup, Releasable):
    """A training context for a compiled model; step it yourself.

    ``batch_size``: the rows of every ``step``/``eval`` batch. ``nbatch_logical``: a multiple of
    it; gradients of ``nbatch_logical / batch_size`` batches make one update, equal to one batch
    that large. ``loss_mask``: ``None`` (the compiled loss), ``1`` (a weighted mean squared error,
    one ``sample_weight`` per sample) or the number of output units (one weight per output
    element; a 0 removes that element's gradient exactly). ``weight_decay``: in [0, 1],
    the compiled optimizer's decay in its own form (frozen weights never decayed); ``None`` takes
    the compiled optimizer's. Adam and AdamW decay decoupled (AdamW style); SGD adds
    ``weight_decay * w`` to the gradient as ``torch.optim.SGD`` does, which is the same thing
    without momentum and with momentum enters the velocity. ``device``:
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``threads``: onnxruntime's intra-op threads, for every
    session the trainer opens (training, ``predict``, ``calibrate_bn``, its snapshots); None takes
    :func:`ortrain.set_num_threads`' setting (all cores by default). The optimizer's update runs on
    the calling thread whatever the setting, as its kernels do.

    >>> import numpy as np, ortrain as ot
    >>> model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    >>> _ = model.compile(optimizer="sgd", loss="mse")
    >>> with ot.Trainer(model, batch_size=4) as tr:
    ...     loss = tr.step(np.ones((4, 3)), np.zeros((4, 2)))
    ...     tr.n_steps
    1
    """

    _instead = ("tr.save_checkpoint(path) and ot.Trainer.from_checkpoint(model, path) carry its state, "
                "tr.model() its weights, tr.snapshot() an independent copy for predictions")

    # Private: the fit loop's trainers (weighing_any_loss) take per-sample weights (loss_mask=1) for
    # every loss, as the artifacts allow; the public rule keeps loss_mask to mean squared error.
    _any_loss = False
    _from_artifacts = False  # made by from_artifacts: its artifacts fix the weighting

    def __init__(self, model: Model, batch_size: int = 32, nbatch_logical: int | None = None, loss_mask=None,
                 weight_decay: float | None = None, device: str = "cpu", threads: int | None = None):
        self._freed = True  # until the session exists
        self._setup(model, batch_size, nbatch_logical, loss_mask, weight_decay, device, threads)

    # -- lifetime -------------------------------------------------------------------------------
    def _live(self):
        if self._freed:
            raise FreedError("this trainer was freed; create a new ot.Trainer (or take a model with tr.model() "
                             "before freeing)")

    def free(self) -> None:
        """Release the session; calling it again is harmless. Every other method then raises FreedError."""
        if getattr(self, "_freed", True):
            return
        self._freed = True
        self._session.free()
        for r in (self._runner, self._calib):
            if r is not None:
                r.free()
        self._runner = self._calib = None

    # -- inputs ---------------------------------------------------------------------------------
    def _feeds(self, x, y, sample_weight, where: str, rows: int | None, checked: bool = False,
               class_weight=None, most: int | None = None) -> list[np.ndarray]:
        """Inputs, labels and (with a weighted loss) weights, cast and checked; nothing runs yet.
        ``rows`` pins the batch's rows, ``most`` bounds them. ``checked``: the rows come from arrays
        whose index and label ranges were checked whole. ``class_weight`` (the fit loop's, for a
        generator's batches) multiplies the weights by the class weights of the labels."""
        xs = prepare_inputs(self._inputs, x, "x", rows, None if checked else self._bounds)
        rows = xs[0].shape[0]
        if most is not None and rows == 0:
            raise ShapeError("x: a batch of 0 rows; give batches of at least one sample (a generator ends its "
                             "epoch by returning None or stopping)")
        if most is not None and rows > most:
            raise ShapeError(f"x: a batch of {rows} rows, more than the {most} of the first batch, which set the "
                             f"batch size; give batches of at most {most} rows (a shorter one, such as a "
                             "DataLoader's last, is a step on its own rows)")
        n_classes = self._n_classes
        if self._classes_of is not None and not checked:
            n_classes = self._classes_of([a.shape for a in xs])
        spec = self._label if not self._free_labels else self._label_at(xs)
        if isinstance(y, (list, tuple, dict)):  # Keras' per-output forms, [y] or {name: y}
            y = of_the_output(self._outputs, y, "y", (len(spec.shape),))
        if isinstance(sample_weight, (list, tuple, dict)) and self._weight_spec is not None:
            sample_weight = of_the_output(self._outputs, sample_weight, "sample_weight",
                                          range(1, len(self._weight_spec.shape) + 1), rows=rows)
        labels = prepare_labels(spec, y, "y", rows, n_classes, check_classes=not checked,  # rows: x's
                                one_hot=self._one_hot_labels, probabilities=self._probability_labels, rows_of="x")
        feeds = xs + [labels]
        if self._weight_spec is not None:
            w = self._sample_weight(sample_weight, rows, labels)
            feeds.append(w if class_weight is None else class_weight.weigh(labels, w))
        elif sample_weight is not None:
            raise OrtrainError(f"sample_weight: this trainer has no loss weights ({where}); {self._how_to_weigh()}")
        return feeds

    def _how_to_weigh(self) -> str:
        """How to train with loss weights, for this trainer's loss."""
        if self._from_artifacts:  # the artifacts fix the weighting: no argument of the trainer changes it
            return ("its artifacts were built without them: build them again with weighting='sample' (one weight "
                    "per sample: ot.artifacts.build(..., weighting='sample'), or `ortrain artifacts ... "
                    "--sample-weights`) and train from those")
        if self._model.loss.name == "mse":
            return "create it with loss_mask=1 (one weight per sample) or loss_mask=<outputs> to pass them"
        return (f"a Trainer weighs a mean squared error only (loss_mask=1), and this model's loss is "
                f"{self._model.loss.name!r}: pass the weights to model.fit or ot.fit_generator, which weigh any "
                "loss, or train from artifacts built with weighting='sample' (Trainer.from_artifacts)")

    def _label_at(self, xs: list[np.ndarray]):
        """The label input for a batch of these inputs, for an output with free positions: found once
        for each set of sizes."""
        key = tuple(a.shape[1:] for a in xs)
        if self._rows_fixed_by_output:
            key += (xs[0].shape[0],)
        spec = self._labels_at.get(key)
        if spec is None:
            spec = self._labels_at[key] = self._model._label_spec_for([a.shape for a in xs], whole=False)
        return spec

    def _sample_weight(self, w, rows: int, labels: np.ndarray) -> np.ndarray:
        shape = self._weight_spec.shape
        if w is not None:
            return prepare_sample_weight(w, shape, "sample_weight", rows, label_positions(labels, shape))
        shape = (rows,) + tuple(1 if d is None else d for d in shape[1:])
        if self._ones_weight is None or self._ones_weight.shape != shape:
            self._ones_weight = np.ones(shape, np.float32)
        return self._ones_weight

    # -- steps ----------------------------------------------------------------------------------
    def _train(self, feeds: list[np.ndarray]):
        """One step. A runtime that refuses the batch changes nothing; a failed update drops its
        period's gradients and counts none of its batches. An interrupt (Ctrl-C), which Python
        raises only once a runtime call has returned, drops the period's gradients (the runtime may
        have added this batch's) and uncounts its batches, or counts the update if it ran, so the
        counters always match the weights."""
        feeds.append(self._scale)
        session = self._session
        with session._lock:  # once for the step's calls
            flush = denormals.here()
            try:
                denormals.on(flush)  # subnormals flushed, once for the step's calls
                fetches = self._run_step(session, feeds)
            finally:
                denormals.off(flush)
        return fetches

    def _run_step(self, session, feeds):
        drawn = session.draws  # a step not counted draws its dropout masks again at the next call
        try:
            fetches = session._train_step(feeds, check=False)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._drop_period()
                session.undraw(drawn)
            raise
        if self._accum + 1 < self._k:
            self._accum += 1
            self._n_steps += 1
            return fetches
        try:
            if session.lr != self._lr:
                session._set_lr(self._lr)
            session._optimizer_step()
            session._zero_grad()
            self._accum = 0
        except BaseException as exc:
            if despite_interrupts(lambda exc=exc: session.abandon_step(exc, self._updates)):  # it dropped the gradients
                self._updates += 1  # the update ran before the interrupt arrived
                self._n_steps += 1
                self._accum = 0
            else:
                self._uncount_period()
                session.undraw(drawn)
            raise
        self._updates += 1
        self._n_steps += 1
        return fetches

    def _drop_period(self) -> None:
        """Drop the accumulation period's gradients, and uncount its batches."""
        self._session.zero_grad()
        self._uncount_period()

    def _uncount_period(self) -> None:
        """The period's batches go uncounted with their gradients (``n_steps`` stays a multiple of
        ``nbatch_logical / batch_size`` past the updates)."""
        self._n_steps -= self._accum
        self._accum = 0

    def step(self, x, y, sample_weight=None) -> float:
        """One forward and backward pass on exactly ``batch_size`` rows; the weights move on the
        accumulation boundary. Returns the batch's loss.

        A NaN or infinity in ``x``, ``y`` or ``sample_weight`` is refused (:class:`NonFiniteError`)
        and changes nothing. A step whose inputs are finite but whose loss overflows (training
        diverging, inputs far beyond the usual range) is taken, as in Keras and PyTorch: check the
        returned loss, or stop a fit with ``callbacks.TerminateOnNaN``.

        Raises :class:`ShapeError` for a batch of another row count or shape than the model's
        inputs (or a ``sample_weight`` of the wrong shape), :class:`NonFiniteError` for a NaN or
        infinity in the inputs, :class:`FreedError` after :meth:`free`; a refused step changes nothing."""
        self._live()
        if FREEZES[0] != self._freezes_seen:
            self._check_what_trains()
        fetches, _, _ = self._step(x, y, sample_weight, self.batch_size)
        return float(fetches[1].numpy())

    def _check_what_trains(self) -> None:
        """The caller's model changed which weights train after this trainer was made: said once,
        as the trainer's graphs fix them (as Keras warns when ``trainable`` changes after compile)."""
        self._freezes_seen = FREEZES[0]
        model = self._given()
        if model is None or what_trains(model) == self._trained:
            return
        self._given = _gone
        warn(f"model {model.name!r}: the weights that train changed after this Trainer was made (layer.trainable, "
             "freeze, unfreeze, freeze_bn_stats or unfreeze_bn_stats); a trainer trains its own copy, whose graphs fix "
             "which weights train, so it goes on training the weights it started with. To train with the change, hand "
             "the state over: m = tr.model(); m.train_state = tr.export_state(); then freeze or unfreeze on m and "
             "make a new ot.Trainer(m, ...)", UserWarning)

    def _step(self, x, y, sample_weight, rows: int | None, checked: bool = False, class_weight=None,
              most: int | None = None):
        """A training step: ``(fetches, labels, weights)``. The labels and weights are the checked
        arrays that were fed (weights None when neither sample nor class weights were given), so the
        fit loop's metrics reuse them instead of checking every batch twice. ``checked``: the values
        were already found finite and in range (the fit loop checks whole arrays before it starts).
        ``rows``/``most``: the batch's rows, exactly or at most."""
        feeds = self._feeds(x, y, sample_weight, "step", rows, checked, class_weight, most)
        if not checked:
            self._refuse_non_finite(feeds)
        weighted = sample_weight is not None or class_weight is not None
        labels, weights = self._fed_labels_and_weights(feeds, weighted)
        fetches = self._train(feeds)
        if self._probabilities_unseen:
            self._probabilities_unseen = False
            self._check_probabilities(fetches[2].numpy())
        return fetches, labels, weights

    def _check_probabilities(self, pred: np.ndarray) -> None:
        """Once, at the first step: a loss on probabilities whose predictions are not (logits given
        without from_logits=True are clipped to [1e-7, 1 - 1e-7] and train badly, silently)."""
        if pred.size and np.isfinite(pred).all() and (pred.min() < -1e-6 or pred.max() > 1 + 1e-6):
            loss = self._model.loss
            warn(f"loss {loss.name!r} takes probabilities (from_logits=False), and the model's first output "
                 f"held values from {pred.min():.4g} to {pred.max():.4g} at the first step, which it clips to "
                 f"[1e-7, 1 - 1e-7]; if the output is logits, compile with {type(loss).__name__}(from_logits=True) "
                 "(--from-logits on the command line)")

    def _refuse_non_finite(self, feeds: list[np.ndarray]) -> None:
        """A NaN or an infinity in a float input, label or weight would reach every weight through
        the update; refuse the step before it runs."""
        names = self._feed_names
        if self._weight_spec is not None and feeds[-1] is self._ones_weight:
            feeds, names = feeds[:-1], names[:-1]
        refuse_non_finite(feeds, names, "this step was not taken")

    def eval(self, x, y, sample_weight=None) -> float:
        """The loss on one batch of ``batch_size`` rows, without backward pass or dropout.

        Raises :class:`ShapeError` for a batch of another row count or shape, :class:`NonFiniteError`
        for a NaN or an infinity in it (nothing is computed), :class:`FreedError` after :meth:`free`."""
        self._live()
        return self.eval_with_outputs(x, y, sample_weight, rows=self.batch_size)[0]

    def eval_with_outputs(self, x, y, sample_weight=None, rows: int | None = None) -> tuple[float, np.ndarray]:
        """``(loss, predictions)`` for one batch, without backward pass or dropout: the loss as
        :meth:`eval` returns it and the model's first output for the batch's rows. ``rows=None``
        (the default) takes a batch of any number of rows; :meth:`eval` pins it to ``batch_size``.
        Raises :class:`ShapeError` for a batch whose shape does not fit."""
        self._live()
        rows = positive_int(rows, "eval_with_outputs(rows=...)", allow_none=True)
        fetches, _, _ = self._eval(x, y, sample_weight, rows, finite=True)
        return float(fetches[1].numpy()), fetches[2].numpy()

    def _eval(self, x, y, sample_weight, rows: int | None, finite: bool = False):
        """An eval step: ``(fetches, labels, weights)`` as for :meth:`_step`. ``finite``: a NaN or an
        infinity in the inputs or labels is refused too (a fit's validation batches from a generator
        are evaluated as they are: their loss is NaN)."""
        feeds = self._feeds(x, y, sample_weight, "eval", rows)
        labels, weights = self._fed_labels_and_weights(feeds, sample_weight is not None)
        if finite:
            n = len(self._inputs) + 1
            refuse_non_finite(feeds[:n], self._feed_names[:n], "nothing was evaluated",
                              needs="evaluation needs finite values")
        refuse_non_finite_weights(weights, "sample_weight", "nothing was evaluated")
        feeds.append(self._one)
        return self._session.eval_step(feeds, check=False), labels, weights

    def _fed_labels_and_weights(self, feeds: list[np.ndarray], weighted: bool):
        n = len(self._inputs)
        return feeds[n], (feeds[n + 1] if weighted else None)

    # -- predictions and copies -----------------------------------------------------------------
    def _weights_now(self) -> dict[str, np.ndarray]:
        if self._session.device.kind == "cpu":
            return {p.name: self._session.view(p.name) for p in self._params}
        return {p.name: self._session.get(p.name) for p in self._params}

    def predict(self, x, batch_size=None) -> np.ndarray | list[np.ndarray]:
        """Predictions from the current weights for any number of rows (eval mode; training untouched):
        one array, or a list in output order for a model with several outputs."""
        self._live()
        positive_int(batch_size, "batch_size", allow_none=True)
        xs = prepare_inputs(rows_free(self._inputs), x, "x", bounds=self._bounds, defer=True)
        runner = self._runner  # once: a free() from another thread clears it (predict takes no lock)
        if runner is None:
            runner = self._runner = engine.InferenceRunner(self._inference_bytes(), device=self.device,
                                                           threads=self._threads)
        try:
            outs = run_chunks(runner, self._inputs, xs, self._weights_now(), batch_size)
        except FreedError:
            self._live()  # freed meanwhile: the trainer's own error
            raise
        return outs[0] if len(outs) == 1 else outs

    def snapshot(self) -> Snapshot:
        """An independent eval-mode copy of the current weights (a target network)."""
        self._live()
        weights = self._weights_of_one_step()
        return Snapshot(self._inference_bytes(), self._params, weights, self._inputs, self.device, self._bounds,
                        self._threads)

    def _inference_bytes(self) -> bytes:
        if self._inference is None:
            try:
                forward = onnx.load(self._art.forward)
            except OSError:  # the artifacts were removed meanwhile (a cleared cache): the model holds the graph
                forward = self._model.forward_graph().proto
            self._inference = to_inference(forward).SerializeToString()
        return self._inference

    def update_target(self, target: Snapshot, tau: float = 1.0) -> None:
        """``target <- tau * current + (1 - tau) * target`` for trainable weights; batch-norm running
        statistics and frozen weights are copied whole. ``tau=1`` is a hard copy.

        Raises :class:`OrtrainError` for a ``target`` that is not a :class:`Snapshot`, whose weights
        differ from this trainer's by name or shape, or for ``tau`` outside [0, 1]; :class:`FreedError`
        when the trainer or the target was freed."""
        self._live()
        if not isinstance(target, Snapshot):
            raise OrtrainError(f"target: expected a Snapshot from trainer.snapshot(), received "
                               f"{type(target).__name__}")
        if not is_real(tau) or not 0.0 <= tau <= 1.0:
            raise OrtrainError(f"tau: expected a number in [0, 1], received {tau!r}")
        with locked(target):  # a free() of the target from another thread waits, or comes first
            target._live()
            mine = {p.name: tuple(p.shape) for p in self._params}
            theirs = target._shapes()
            if mine != theirs:
                raise OrtrainError(f"target: its weights differ from this trainer's by name or shape "
                                   f"({_weights_apart(mine, theirs)}); take the target from a trainer of the same "
                                   "architecture")
            weights = self._weights_of_one_step()  # (copies: the blend runs without the session's lock)
            target._move_towards(weights.__getitem__, set(self._trainable), tau)

    def model(self) -> Model:
        """A new Model carrying the current weights (the constructor's model is never changed).

        It carries no optimizer state (``train_state`` is None, so its ``fit`` starts fresh
        moments); ``m.train_state = trainer.export_state()`` hands the trainer's over."""
        self._live()
        model = self._model._copy_with(self._weights_of_one_step())
        model.train_state = None  # the constructor's model's state is not this trainer's
        return model

    def weight_names(self) -> list[str]:
        """The weights' names, in the model's order (``model.weight_names()``)."""
        self._live()
        return [p.name for p in self._params]

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the current weights, in :meth:`weight_names` order."""
        self._live()
        return list(self._weights_of_one_step().values())

    def _weights_of_one_step(self) -> dict[str, np.ndarray]:
        """Copies of the weights by name, all after the same step: a step from another thread (an
        actor reading while a learner steps) waits for the read, or the read for the step."""
        with locked(self._session):
            return {p.name: self._session.get(p.name) for p in self._params}

    def set_weights(self, weights) -> None:
        """Write weights into the trainer: a list in :meth:`weight_names` order, or a dict keyed by
        weight name holding any of them. Two trainers over models that share layers (a GAN's
        discriminator and the combined model that holds it frozen) each train their own copy; after one
        steps, hand its weights to the other: ``tr_c.set_weights(dict(zip(tr_d.weight_names(),
        tr_d.get_weights())))`` keeps the names the two share. Optimizer moments, counters and an
        accumulation period stay as they are. Everything is checked before anything changes."""
        self._live()
        names = [p.name for p in self._params]
        like = {p.name: (tuple(p.shape), np.dtype(np.float32)) for p in self._params}
        staged = staged_weights(weights, like, f"the trainer's weights are {names}. Keep only the names the two "
                                "models share")
        for name, a in staged:
            if not np.isfinite(a).all():
                raise NonFiniteError(f"set_weights[{name!r}]: holds {a[~np.isfinite(a)][0]}; a trainer's weights "
                                     "must be finite, so nothing was changed")
        with locked(self._session):  # a step from another thread sees all of them old or all new
            for name, a in staged:
                self._session.set(name, a)

    def export_state(self) -> TrainState:
        """The optimizer state, for a model to carry into its next ``fit``: the moments of the
        weights trained here, and those of weights frozen here as the model brought them (copies).
        Batches accumulated towards an update that has not happened (``nbatch_logical``) are not
        part of it, as of :meth:`save_checkpoint`, which warns."""
        self._live()
        if self._accum:  # (read again under the session's lock by _state)
            warn(f"export_state: {left_out(self._accum, 'the state')}, and a fit continued from it starts a new "
                 "accumulation period; export on an accumulation boundary (after every "
                 f"{self.nbatch_logical // self.batch_size} batches) for an exact continuation")
        return self._state()

    def _state(self) -> TrainState:
        """:meth:`export_state` without its warning (a fit's hand-over says its own)."""
        carried = {n: tuple(np.array(m) for m in ms) for n, ms in self._carried.items()}  # the model's, not shared
        with locked(self._session):  # the counters and the moments of one step, whichever thread steps
            return TrainState(self._updates, self._lr, {**carried, **self._session.optimizer_moments()},
                              self._n_steps - self._accum, self._session.draws)

    def _pending_state(self) -> PendingTrainState:
        """:meth:`_state` with the moments left in the session until first read: for the trainer
        ``train_on_batch`` keeps, which does not step again while the model holds this state unread
        (:mod:`ortrain._kept_trainer`); a read after a later step is refused, not answered with that
        step's moments."""
        taken = (self._n_steps, self._updates)

        def read() -> dict:
            with locked(self._session):  # (a step holds it: the counters and moments read are of one step)
                if (self._n_steps, self._updates) != taken:  # (read on a thread while another trained on)
                    raise OrtrainError("the model's optimizer state was read while train_on_batch stepped on from it "
                                       "(on another thread): its moments are the next step's now; read it between "
                                       "the calls (or save the model, which waits for the step)")
                return self._state().moments

        return PendingTrainState(self._updates, self._lr, None, self._n_steps - self._accum, self._session.draws,
                                 read=read)

    # -- batch norm ----------------------------------------------------------------------------
    def calibrate_bn(self, x) -> None:
        """Set every batch norm's running mean and (biased) variance to the exact statistics of at most
        1024 rows of ``x``, layer by layer (each layer sees the layers before it already calibrated). A
        batch norm applied more than once (a shared layer) gets the mean of its calls' statistics, as
        its running statistics settle to in training."""
        self._live()
        xs = prepare_inputs(self._inputs, x, "x", None, self._bounds)
        xs = [a[:CALIBRATION_ROWS] for a in xs]
        if xs[0].shape[0] < 1:
            raise ShapeError("calibrate_bn: x expected at least 1 row, received 0")
        refuse_non_finite(xs, [f"calibrate_bn: {n}" for n in self._feed_names[:len(xs)]],
                          "the statistics were not changed")
        # The graph before freezing: a batch norm whose statistics are frozen is written out as plain
        # ops in the training graph, but calibrating it is still what the caller asks for.
        forward = to_inference(self._model._base_proto())
        nodes = batchnorm_nodes(forward)
        if not nodes:
            return
        if self._calib is None:
            probe = with_extra_outputs(forward, [n.input[0] for n in nodes])
            self._calib = engine.InferenceRunner(probe, device=self.device, threads=self._threads)
        feeds = {s.name: a for s, a in zip(self._inputs, xs)}
        before = {name: self._session.get(name).copy() for node in nodes for name in node.input[3:5]}
        # Layer by layer: a shared batch norm's calls together, before the layers after its first call,
        # so that a later layer's calls all see the earlier layers calibrated from every call.
        layers: dict[tuple[str, str], list] = {}
        for node in nodes:
            layers.setdefault((node.input[3], node.input[4]), []).append(node)
        try:
            for (mean_name, var_name), calls in layers.items():
                means, variances = [], []  # of the layer's calls so far
                for node in calls:
                    feeds.update(self._weights_now())
                    value = self._calib.run(feeds, [node.input[0]])[0].astype(np.float64)
                    axes = tuple(i for i in range(value.ndim) if i != 1)
                    per_channel = value.size // max(value.shape[1], 1) if value.ndim > 1 else value.size
                    if per_channel < 2:  # one image of a convolution holds many values a channel
                        raise ShapeError(f"calibrate_bn: batch norm {node.name!r} sees {per_channel} value a "
                                         f"channel in {xs[0].shape[0]} row(s) of x, and a variance needs at "
                                         "least 2; give more rows (the statistics were not changed)")
                    with np.errstate(over="ignore", invalid="ignore"):
                        means.append(value.mean(axis=axes).astype(np.float32))
                        variances.append(value.var(axis=axes).astype(np.float32))
                    if not (np.isfinite(means[-1]).all() and np.isfinite(variances[-1]).all()):
                        raise NonFiniteError(f"calibrate_bn: the input of batch norm {node.name!r} has statistics "
                                             "beyond float32 (finite x whose values overflow on the way); the "
                                             "statistics were not changed. Scale x to a usual range first")
                    self._session.set(mean_name, np.mean(means, axis=0, dtype=np.float64).astype(np.float32))
                    self._session.set(var_name, np.mean(variances, axis=0, dtype=np.float64).astype(np.float32))
        except BaseException:
            for name, old in before.items():  # all or nothing
                self._session.set(name, old)
            raise

    # -- learning rate and counters ------------------------------------------------------------
    def set_lr(self, lr: float) -> None:
        """Learning rate for the following updates (a finite number >= 0)."""
        self._live()
        self._lr = check_lr(lr, "set_lr")

    @property
    def lr(self) -> float:
        """The learning rate of the next update (:meth:`set_lr` changes it; a fit's schedules set it)."""
        self._live()
        return self._lr

    @property
    def n_steps(self) -> int:
        """The training steps (forward and backward passes) of the model's training so far: this
        trainer's ``step()`` calls, plus those taken before it, by the fits that trained the model
        it was given (its ``train_state``) or by the trainer that wrote a resumed checkpoint."""
        self._live()
        return self._n_steps

    @property
    def n_updates(self) -> int:
        """The optimizer updates so far (Adam's step count), counted as :attr:`n_steps` is: with
        ``nbatch_logical`` one update per ``nbatch_logical / batch_size`` steps, else one per step."""
        self._live()
        return self._updates

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"n_steps={self._n_steps} lr={self._lr:g}"
        return f"<Trainer batch_size={getattr(self, 'batch_size', '?')} {state}>"


name_unknown_arguments(Trainer)  # Trainer(model, batchsize=32) names the argument and what it takes
names_unknown_arguments_of_methods(Trainer, "free", "step", "eval", "eval_with_outputs", "predict", "snapshot",
                                   "update_target", "model", "weight_names", "get_weights", "set_weights",
                                   "export_state", "calibrate_bn", "set_lr", "save_checkpoint", "from_checkpoint",
                                   "from_artifacts")
names_unknown_arguments_of_methods(Snapshot, "weight_names", "get_weights", "predict", "free")


def weighing_any_loss(model: Model, any_loss: bool, **settings) -> Trainer:
    """``Trainer(model, **settings)`` whose ``loss_mask=1`` weighs any loss when ``any_loss`` (the fit
    loop's trainers: the artifacts allow it, the public rule keeps ``loss_mask`` to mean squared error)."""
    tr = Trainer.__new__(Trainer)
    tr._any_loss = bool(any_loss)
    tr.__init__(model, **settings)
    return tr


# TrainerSetup's annotations name Trainer (from_checkpoint and from_artifacts return one): imported
# there only for type checkers (the import would be circular), the name is set here so
# typing.get_type_hints resolves them.
_trainer_setup.Trainer = Trainer


def _weights_apart(mine: dict, theirs: dict, most: int = 4) -> str:
    """Where two weight tables (name: shape) differ, each side named: a weight of another shape, one
    only the trainer has, one only the target has."""
    parts = [f"{n}: trainer {mine[n]}, target {theirs[n]}" for n in sorted(mine) if n in theirs and mine[n] != theirs[n]]
    parts += [f"{n} {mine[n]}: the trainer's only" for n in sorted(set(mine) - set(theirs))]
    parts += [f"{n} {theirs[n]}: the target's only" for n in sorted(set(theirs) - set(mine))]
    more = f"; {len(parts) - most} more" if len(parts) > most else ""
    return "; ".join(parts[:most]) + more


def _gone():
    """A weak reference's answer for a model no longer followed."""
    return None
