"""How a ``Trainer`` gets its session: for a model (``Trainer(...)``), resumed from a checkpoint
(``Trainer.from_checkpoint``) or opened on artifacts (``Trainer.from_artifacts``), and the
checkpoints it saves to be resumed from. ``Trainer`` inherits these methods from ``TrainerSetup``;
they set and read its attributes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ortrain import artifacts as artifacts_mod
from ortrain import engine
from ortrain._arrays import positive_int
from ortrain._files import checked_target
from ortrain._lifetime import locked
from ortrain._warnings import warn
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.nn.base_layer import FREEZES, what_trains
from ortrain.nn.model import Model
from ortrain.optim import check_weight_decay

if TYPE_CHECKING:
    from ortrain.trainer import Trainer

_PROP = "ortrain."


class TrainerSetup:
    """The construction and checkpoint methods of :class:`ortrain.Trainer`."""

    # -- construction --------------------------------------------------------------------------
    def _setup(self, model, batch_size, nbatch_logical, loss_mask, weight_decay, device, threads,
               checkpoint=None, art=None, draws=None):
        """``draws``: training steps run before (a checkpoint's); by default the model's train state's."""
        _check_model(model)
        weighting = self._take_settings(model, batch_size, nbatch_logical, loss_mask, weight_decay, device)
        if art is None:
            art = artifacts_mod.build(model, loss=model.loss, optimizer=model.optimizer, weighting=weighting,
                                      refresh_checkpoint=False)
        self._art = art
        # The architecture, for model() and calibrate_bn(): its weights are never read (model() takes
        # the session's), so it is handed read-only views of the caller's. An imported model keeps
        # them as they are (no copy of, say, ResNet-50's 100 MB); a layer model copies them into
        # its layers.
        self._model = model._copy_with({n: _read_only(a) for n, a in model._weight_table().items()})
        self._params = list(art.params)  # the roles the graphs were built with
        self._trainable = [p.name for p in self._params if p.role == "trainable"]
        self._threads = threads
        self._open(model, art, checkpoint, threads, _draws_of(model.train_state) if draws is None else draws)
        self._counters_from(model)
        self._feeds_for(model, art)
        # which weights train is fixed here: a change on the caller's model after it is said at the next step
        self._given, self._trained = weakref.ref(model), what_trains(model)
        self._freezes_seen = FREEZES[0]

    def _take_settings(self, model, batch_size, nbatch_logical, loss_mask, weight_decay, device) -> str | None:
        """Check and keep the settings; nothing is built yet. Returns the loss weighting."""
        self.batch_size = positive_int(batch_size, "batch_size")
        if nbatch_logical is None:
            self._k = 1
        else:
            nbl = positive_int(nbatch_logical, "nbatch_logical")
            if nbl % self.batch_size:
                raise OrtrainError(f"nbatch_logical: expected a multiple of batch_size={self.batch_size}, "
                                   f"received {nbl}")
            self._k = nbl // self.batch_size
        self.nbatch_logical = self._k * self.batch_size
        weighting = _weighting(loss_mask, model)
        if weighting is not None and model.loss.name != "mse" and \
                not (weighting == "sample" and getattr(self, "_any_loss", False)):
            raise OrtrainError(f"loss_mask={loss_mask} weights a mean squared error; the model is compiled with "
                               f"loss {model.loss.name!r}. Compile with loss='mse' or drop loss_mask")
        self.loss_mask = loss_mask
        opt = model.optimizer
        if weight_decay is None:
            weight_decay = getattr(opt, "weight_decay", 0.0)
        weight_decay = check_weight_decay(weight_decay)
        self.weight_decay = weight_decay
        self.device = str(engine.parse_device(device))
        for spec in model.input_specs:
            if spec.shape and spec.shape[0] is not None and spec.shape[0] != self.batch_size:
                raise ShapeError(f"batch_size={self.batch_size}: the model's input {spec.name!r} has a fixed "
                                 f"batch of {spec.shape[0]} rows {describe_shape(spec.shape)}; use "
                                 f"batch_size={spec.shape[0]} or re-export the model with a dynamic batch axis "
                                 "(every input is batch first: one without a batch axis, such as an attention "
                                 "mask, must be a constant of the model or get one)")
        return weighting

    def _open(self, model, art, checkpoint, threads, draws: int) -> None:
        """Open the session on the artifacts, with the model's weights and optimizer state; seeded
        dropout goes on after ``draws`` earlier steps."""
        state = model.train_state
        # Without optimizer state to carry, the session opens on the artifacts' own checkpoint and
        # the model's weights are copied in afterwards: much cheaper than writing a checkpoint
        # (half a second for ResNet-50), and the artifacts were built for exactly these weights' names.
        copy_weights = checkpoint is None and (state is None or not (state.moments or state.step))
        # Moments of weights that do not train here (frozen for now) travel on to the next fit; a
        # checkpoint given to resume from holds the whole state.
        self._carried = {n: m for n, m in state.moments.items() if n not in self._trainable} \
            if state and checkpoint is None else {}
        own = artifacts_mod.own_optimizer_graph(model.optimizer, self.weight_decay, art)
        # a folder only for files to write (creating and removing one costs milliseconds on some disks)
        written = own is None or not (copy_weights or checkpoint is not None)
        with artifacts_mod.scratch_dir() if written else contextlib.nullcontext() as tmp:
            opt_path = own or artifacts_mod.optimizer_graph_file(model.optimizer, self.weight_decay, tmp)
            if copy_weights:
                checkpoint = art.checkpoint
            elif checkpoint is None:
                checkpoint = tmp / "checkpoint"
                self._write_checkpoint(checkpoint, model, state)
            self._session = engine.TrainingSession(art.training, art.eval, checkpoint, opt_path,
                                                   device=self.device, threads=threads, draws=draws)
        if copy_weights:
            for name, value in model._weight_table().items():
                self._session.set(name, value)
        self._freed = False
        self._session.zero_grad()

    def _counters_from(self, model) -> None:
        state = model.train_state
        self._n_steps = state.n_steps if state else 0
        self._updates = state.step if state else 0
        # The state's rate, unless model.optimizer.lr was written since a fit last saw it (as fit does).
        self._lr = state.lr if state and not model._lr_written() else model.optimizer._lr
        self._accum = 0

    def _feeds_for(self, model, art) -> None:
        """What each step feeds and checks, fixed once."""
        self._runner = None
        self._calib = None
        self._inference = None
        self._inputs = art.inputs
        self._bounds = model.index_bounds()
        n = len(self._inputs)
        self._feed_names = ["x" if n == 1 else f"x[{s.name!r}]" for s in self._inputs] + ["y", "sample_weight"]
        self._label = art.label
        self._outputs = [s.name for s in model.output_specs]
        # Labels of an output with free dimensions after the batch are checked against the prediction
        # at each batch's sizes; other outputs pay nothing per step.
        self._rows_fixed_by_output = model._fixed_output_rows() is not None  # each batch's rows checked
        self._free_labels = any(d is None for d in art.label.shape[1:]) or self._rows_fixed_by_output
        self._labels_at = {}
        loss = model.loss
        self._probabilities_unseen = hasattr(loss, "from_logits") and not loss.from_logits
        self._one_hot_labels = getattr(loss, "name", "") == "categorical_crossentropy"  # for a label error's fix
        self._probability_labels = getattr(loss, "name", "") == "binary_crossentropy"  # checked in [0, 1]
        self._weight_spec = art.sample_weight
        self._scale = np.array(1.0 / self._k, np.float32)
        self._one = np.array(1.0, np.float32)
        self._ones_weight = None
        self._n_classes = model._n_classes()
        # Class labels of an output whose width is free are checked against its width at each
        # batch's sizes; other losses pay nothing per step.
        self._classes_of = self._model._n_classes if self._n_classes is None and model.loss.class_labels else None

    def _write_checkpoint(self, path, model, state) -> None:
        weights = dict(zip(model.weight_names(), model.get_weights()))
        trainable = {n: weights[n] for n in self._trainable}
        others = {p.name: weights[p.name] for p in self._params if p.role != "trainable"}
        optimizer = None
        if state is not None and (state.moments or state.step):
            # As Keras keeps an optimizer's per-weight state: a weight that trained before keeps its
            # moments, one that starts training now (unfrozen) starts from zero, and the update count
            # (which bias correction reads) is the optimizer's, shared by all. (An SGD state loaded with
            # optimizer.load_state holds no moments, only the count.) The update graph takes as many as
            # the optimizer keeps now: an SGD's momentum set since keeps a velocity from zero, and one
            # set to 0 drops it.
            width = model.optimizer.runtime_moments
            moments = {n: (tuple(state.moments.get(n, ())) + tuple(np.zeros_like(w) for _ in range(width)))[:width]
                       for n, w in trainable.items()}
            optimizer = engine.OptimizerState(state.step, float(state.lr), moments)
        engine.write_checkpoint(path, engine.CheckpointData(trainable, others, optimizer))

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, path) -> str:
        """Weights, optimizer moments (those of weights frozen here too) and step, learning rate,
        weight decay and counters (the steps run, which seeded dropout goes on from), for a
        bit-exact resume, with two exceptions: the dropout masks of a model without a seed (each
        session draws them from a key of its own, so a resumed trainer draws others; seed the model
        or ``ot.set_seed`` for the same masks), and batches accumulated towards an update that has
        not happened (``nbatch_logical``; a resumed trainer starts a new period), for which it
        warns: their gradients and their count are left out, while what their forward passes
        changed stays (batch-norm running statistics, the dropout draw they used)."""
        self._live()
        path = checked_target(path, "save_checkpoint(path)")
        with locked(self._session):  # the counters and the state of one step, whichever thread steps
            if self._accum:
                warn(f"save_checkpoint: {left_out(self._accum, 'the checkpoint')}, and a trainer resumed from it "
                     "starts a new accumulation period (its updates fall on other steps); save on an accumulation "
                     "boundary for an exact resume")
            props = {
                _PROP + "key": self._art.key, _PROP + "n_steps": self._n_steps - self._accum, _PROP + "updates": self._updates,
                _PROP + "draws": self._session.draws,
                _PROP + "lr": repr(self._lr), _PROP + "weight_decay": repr(self.weight_decay), _PROP + "format": 1,
                _PROP + "nbatch_logical": self.nbatch_logical, _PROP + "batch_size": self.batch_size,
                artifacts_mod.CHECKPOINT_LOSS: artifacts_mod.loss_text(self._art.loss),
                artifacts_mod.CHECKPOINT_FORWARD: self._art.manifest["files"]["forward.onnx"]}
            if self._architecture():
                props[artifacts_mod.CHECKPOINT_ARCHITECTURE] = self._architecture()
                # what the artifacts' key is made of, so a refused resume can say what differs
                props[_PROP + "key_parts"] = json.dumps(self._art.key_parts(self._architecture()), sort_keys=True)
            self._session.save_checkpoint(path, props, carried=self._carried)
            return str(path)

    def _architecture(self) -> str:
        """The artifacts' seed-free architecture digest, read once; empty when their forward graph
        was removed meanwhile (a cleared cache), and the file's digest then still tells."""
        if getattr(self, "_arch", None) is None:
            try:
                self._arch = self._art.architecture
            except OSError:
                self._arch = ""
        return self._arch

    @classmethod
    def from_checkpoint(cls, model: Model, path, batch_size: int = 32, nbatch_logical=None, loss_mask=None,
                        weight_decay=None, device: str = "cpu", threads=None) -> Trainer:
        """A trainer for ``model`` that continues bit-exactly from ``save_checkpoint(path)`` (with the
        exceptions listed there). ``weight_decay=None`` and ``nbatch_logical=None`` take the ones the
        checkpoint was written with (an accumulation period of another size is given explicitly)."""
        data = engine.read_checkpoint(path, verify=True)
        props = data.properties
        if _PROP + "key" not in props:
            raise OrtrainError(f"{os.fspath(path)!r} was not written by Trainer.save_checkpoint")
        _check_counters(props, path)
        weight_decay, nbatch_logical = _saved_settings(props, weight_decay, nbatch_logical, batch_size, path)
        _check_model(model)
        weighting = _weighting(loss_mask, model)
        engine.parse_device(device)  # before the artifacts are built: a refusal leaves no cache entry
        positive_int(batch_size, "batch_size")
        tr = cls.__new__(cls)
        tr._freed = True

        def accept(key: str, parts) -> None:  # before the artifacts are written: a refusal leaves no cache entry
            if props[_PROP + "key"] == key:
                return
            saved = _saved_key_parts(props)
            if saved is not None:
                raise OrtrainError(f"{os.fspath(path)!r} does not fit this model: "
                                   f"{artifacts_mod.key_difference(saved, parts())}")
            raise OrtrainError(f"{os.fspath(path)!r} belongs to another architecture, loss, weighting or "
                               "optimizer than this model (or to training graphs another ortrain version "
                               "built, or to the same ONNX file imported by an earlier ortrain, which listed "
                               "a dynamo export's weights in another order, or to a model whose dropout had "
                               "other seeds); resume with the model, settings and version that wrote it, or go on "
                               "from a model.save file of that run: ot.load_model(path) holds its weights and "
                               "optimizer state, and fit continues from them")

        art = artifacts_mod._build(model, loss=model.loss, optimizer=model.optimizer, weighting=weighting,
                                   refresh_checkpoint=False, accept_key=accept)
        # The key matched artifacts with one weight per sample: a fit with sample weights wrote it,
        # which weights any loss, so loss_mask=1 resumes it whatever the loss.
        tr._any_loss = tr._any_loss or weighting == "sample"
        tr._setup(model, batch_size, nbatch_logical, loss_mask, weight_decay, device, threads,
                  checkpoint=os.fspath(path), art=art, draws=_draws_in(props))
        tr._restore_counters(props, data)
        return tr

    def _restore_counters(self, props: dict, data) -> None:
        """The counters, rate and moments of weights frozen here that ``data`` (a trainer's checkpoint)
        holds beside the session's own state."""
        self._carried = {n: m for n, m in data.carried.items() if n not in self._trainable}
        self._n_steps = int(props[_PROP + "n_steps"])
        self._updates = int(props[_PROP + "updates"])
        self._lr = float(props[_PROP + "lr"])
        engine_step = data.optimizer.step if data.optimizer is not None else 0
        if engine_step != self._updates:
            raise OrtrainError(f"checkpoint is inconsistent: {self._updates} updates recorded, the optimizer "
                               f"state holds {engine_step}")

    @classmethod
    def from_artifacts(cls, directory, batch_size: int = 32, nbatch_logical=None, weight_decay=None,
                       device: str = "cpu", threads=None, checkpoint=None, metrics=None,
                       weighted_metrics=None) -> Trainer:
        """Train from pre-built artifacts alone (``ot.artifacts.build`` or ``ortrain artifacts``).

        ``directory``: an artifacts directory, or the record ``ot.artifacts.build`` returned (whose
        learning rate is the one that build was asked for). ``checkpoint`` (written by
        ``save_checkpoint`` for these artifacts) resumes from it instead of starting from the
        artifacts' own weights. ``metrics`` and ``weighted_metrics`` (as ``compile`` takes them) go
        to the model a fit of the trainer reports on.
        """
        art = _artifacts(directory)
        ckpt = art.checkpoint if checkpoint is None else Path(checkpoint)
        data = engine.read_checkpoint(ckpt, verify=True)
        own = checkpoint is not None and Path(checkpoint).resolve() == Path(art.checkpoint).resolve()
        if checkpoint is not None and not own and not any(k.startswith(_PROP) for k in data.properties):
            raise OrtrainError(f"checkpoint {os.fspath(checkpoint)!r} holds none of the records ortrain writes (the "
                               "artifacts' key, the step and update counts): it was not written by "
                               "Trainer.save_checkpoint (onnxruntime's CheckpointState.save_checkpoint writes "
                               "weights and moments only); start from the artifacts and give it the weights, "
                               "tr.set_weights({name: array}), read from onnxruntime's CheckpointState")
        if checkpoint is not None and not own and data.properties.get(_PROP + "key") != art.key:
            differ = artifacts_mod.what_differs(_saved_key_parts(data.properties), art.key_parts())
            raise OrtrainError(f"checkpoint {os.fspath(checkpoint)!r} was not written for the artifacts in "
                               f"{os.fspath(art.directory)!r} (they differ from those it was written for in {differ}); "
                               "resume with the artifacts that wrote it, or start from the artifacts' own weights "
                               "without checkpoint=")
        model = art.model(data, metrics=metrics, weighted_metrics=weighted_metrics)
        loss_mask = None
        if art.weighting == "sample":
            loss_mask = 1
        elif art.weighting == "element":
            loss_mask = art.outputs[0].shape[-1]
        weight_decay, nbatch_logical = _saved_settings(data.properties, weight_decay, nbatch_logical, batch_size, ckpt)
        tr = cls.__new__(cls)
        tr._freed = True
        tr._any_loss = True  # the artifacts fixed the weighting; whatever loss they hold takes it
        tr._from_artifacts = True
        tr._setup(model, batch_size, nbatch_logical, loss_mask, weight_decay, device, threads,
                  checkpoint=ckpt, art=art, draws=_draws_in(data.properties))
        if _PROP + "key" in data.properties:
            _check_counters(data.properties, ckpt)
            tr._restore_counters(data.properties, data)
        if artifacts_mod.republished(art):
            tr.free()
            raise OrtrainError(f"the artifacts in {str(art.directory)!r} were replaced while the trainer was opening "
                               "them (rebuilt by another process); open them again, or give each build its own "
                               "out_dir")
        return tr


def _artifacts(directory) -> artifacts_mod.Artifacts:
    """The artifacts in a directory, or those of a build's record (checked on disk again, with the
    record's learning rate)."""
    if not isinstance(directory, artifacts_mod.Artifacts):
        return artifacts_mod.load(directory)
    art = artifacts_mod.load(directory.directory)
    if art.key != directory.key or art.manifest.get("weights_sha256") != directory.manifest.get("weights_sha256"):
        raise OrtrainError(f"directory: the artifacts in {str(directory.directory)!r} were rebuilt (for another "
                           "model, loss or optimizer, or with other weights) after this record was made; build "
                           "them again, or pass the directory to train from what it holds now")
    return artifacts_mod.Artifacts(art.directory, dict(art.manifest, optimizer=directory.manifest["optimizer"]))


def _draws_of(state) -> int:
    """Training steps run before, by a model's train state (its step count, for a state saved
    before the count was kept)."""
    if state is None:
        return 0
    return state.n_steps if state.draws is None else state.draws


def _check_counters(props: dict, path) -> None:
    """The counters a trainer's checkpoint holds are there and readable, before anything is built:
    a changed byte in a property's name or value is a damaged file, not a raw KeyError later."""
    try:
        for key in ("n_steps", "updates"):
            int(props[_PROP + key])
        if not math.isfinite(float(props[_PROP + "lr"])):
            raise ValueError("the learning rate is not finite")
        _draws_in(props)
        if _PROP + "weight_decay" in props:
            float(props[_PROP + "weight_decay"])
    except (KeyError, TypeError, ValueError) as exc:
        raise OrtrainError(f"checkpoint {os.fspath(path)!r} is damaged: its trainer counters cannot be read "
                           f"({type(exc).__name__}: {exc}); use another checkpoint or a copy of this one") from None


def left_out(batches: int, what: str) -> str:
    """What a checkpoint or a state taken in the middle of an accumulation period leaves out of
    ``what`` (and what it keeps of those batches)."""
    return (f"{batches} batch(es) accumulated towards the next update are left out of {what}: their gradients, and "
            "their count in n_steps (what their forward passes changed stays: batch-norm running statistics, the "
            "dropout draws they used)")


def _saved_settings(props: dict, weight_decay, nbatch_logical, batch_size, path) -> tuple:
    """``weight_decay`` and ``nbatch_logical`` for a trainer resumed from a checkpoint with
    ``props``: each None given takes the checkpoint's (no accumulation where it accumulated none,
    or was written before the period was recorded); a period ``batch_size`` does not divide is
    refused."""
    if weight_decay is None and _PROP + "weight_decay" in props:
        weight_decay = float(props[_PROP + "weight_decay"])
    if nbatch_logical is not None:
        return weight_decay, nbatch_logical
    batch_size = positive_int(batch_size, "batch_size")
    try:
        period, rows = int(props[_PROP + "nbatch_logical"]), int(props[_PROP + "batch_size"])
    except (KeyError, TypeError, ValueError):
        return weight_decay, None
    if period <= rows:
        return weight_decay, None
    if period % batch_size:
        raise OrtrainError(f"checkpoint {os.fspath(path)!r} was written by a trainer accumulating gradients, "
                           f"nbatch_logical={period} (batch_size={rows}), which batch_size={batch_size} does not "
                           "divide; pass the batch_size it was written with, or an nbatch_logical that is a "
                           f"multiple of {batch_size} (an update per another number of samples)")
    return weight_decay, period


def _draws_in(props: dict) -> int:
    """Training steps run before, by a checkpoint's properties: none for the artifacts' own
    checkpoint, the step count for one written before the count was kept."""
    return int(props.get(_PROP + "draws", props.get(_PROP + "n_steps", 0)))


def unfit(checkpoint, art) -> str | None:
    """None where ``checkpoint`` (a trainer's, with its artifacts key) was written for the
    artifacts ``art`` (one without a key, the artifacts' own, fits any); else what differs, in words."""
    props = engine.read_checkpoint(checkpoint).properties
    key = props.get(_PROP + "key")
    if key is None or key == art.key:
        return None
    return artifacts_mod.what_differs(_saved_key_parts(props), art.key_parts())


def _check_model(model) -> None:
    if not isinstance(model, Model):
        raise OrtrainError(f"model: expected an ortrain Model, received {type(model).__name__}")
    if not model.compiled:
        raise OrtrainError("model: not compiled; call model.compile(optimizer=..., loss=...) first")


def _weighting(loss_mask, model: Model) -> str | None:
    """The artifacts' loss weighting for ``loss_mask``, checked against the model's first output:
    None, ``"sample"`` (``loss_mask=1``) or ``"element"`` (``loss_mask=<outputs>``)."""
    if loss_mask is None:
        return None
    pred = model.output_specs[0]
    n_out = pred.shape[-1] if len(pred.shape) >= 2 else 1
    if isinstance(loss_mask, bool) or not isinstance(loss_mask, (int, np.integer)) or loss_mask not in (1, n_out):
        raise OrtrainError(f"loss_mask: expected None, 1 (one weight per sample) or {n_out} (one weight per "
                           f"output element), received {loss_mask!r}")
    return "sample" if loss_mask == 1 else "element"


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _saved_key_parts(props: dict) -> dict | None:
    """The key parts a checkpoint recorded (None for one written before they were)."""
    try:
        parts = json.loads(props.get(_PROP + "key_parts", "null"))
    except (TypeError, ValueError):
        return None
    return parts if isinstance(parts, dict) else None
