"""The trainer ``Model.train_on_batch`` keeps open between its calls.

A fit builds a trainer (the artifacts looked up, three onnxruntime sessions opened, the model's
weights and optimizer moments written into them) and frees it when it ends, handing the weights
and moments back to the model: some 10-20 ms for a small model, where its step takes 0.1 ms.
``train_on_batch`` is called once a step (a GAN's loop, Keras-style custom loops), so its trainer
is kept on the model instead, and the next call steps it again when nothing it was built from
has changed since: the batch size and sample weighting, the optimizer and loss (the objects and
their settings), the metrics, the layers (and their settings) and which weights train, the model's optimizer state
(``load_state``, a fit, a Trainer's ``export_state`` handed over) and the thread count. Anything
else frees it and the call builds a trainer as a fit does. Weights set since the last call
(``set_weights``, another model's call training a layer this one shares) are written into the
kept trainer's session, as a fit takes the weights a callback sets.

The weights go back to the model after every call, as a fit's do. The moments stay in the
session until something reads them (``opt.state()``, ``model.save``, a copy, a Trainer or a fit
of the model): the model's ``train_state`` is then a :class:`PendingTrainState`, which copies
them out on first use. A fit of the model, or a ``train_on_batch`` that cannot reuse the
trainer, frees it (reading the moments first).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from ortrain.artifacts import _loss_key, _opt_config
from ortrain.engine import get_num_threads
from ortrain.nn.base_layer import what_trains
from ortrain.nn.saving import PendingTrainState

__all__ = ["keep", "release", "settings_of", "take", "turn"]


@dataclass
class _Kept:
    trainer: object
    settings: tuple
    state: object  # the model's train_state when it was kept: identity tells it was not replaced
    layers: tuple  # the model's layers then, by identity
    trains: tuple  # what_trains(model) then


def settings_of(model, rows: int, weighted: bool) -> tuple:
    """What a fit's trainer is built from, besides the weights and optimizer state."""
    opt, loss = model.optimizer, model.loss
    return (rows, bool(weighted), id(opt), repr(sorted(_opt_config(opt).items())), id(loss),
            repr(sorted(_loss_key(loss).items())), tuple(model.metrics), tuple(model.weighted_metrics),
            get_num_threads(), _architecture(model))


def _architecture(model) -> str:
    """What the model's graph is built from: its layers' configs (all that ``model.save`` keeps of
    them, so a setting changed on a layer, a dropout rate or an activation, changes it), or where a
    layer is not ortrain's, whose config may leave something out, the digest of the graph itself.
    An imported model's graph is its file's."""
    configs = []
    for lyr in getattr(model, "layers", ()):
        if not type(lyr).__module__.startswith("ortrain."):
            return hashlib.sha256(model._base_proto().SerializeToString(deterministic=True)).hexdigest()
        configs.append((type(lyr).__qualname__, lyr.get_config()))
    return repr(configs)


def turn(model) -> threading.RLock:
    """The lock a ``train_on_batch`` call holds from its first look at the kept trainer to keeping it
    again, and a save, copy or read of the optimizer state from another thread takes, so that it
    reads the weights and moments of one step (``Model._paired``, ``Model.train_state``)."""
    held = model.__dict__.get("_kept_turn")
    if held is None:  # (one fit of a model at a time: no other call makes it meanwhile)
        held = model.__dict__["_kept_turn"] = threading.RLock()
    return held


def take(model, settings: tuple):
    """The trainer kept on ``model`` if it still stands for the model with ``settings``, else None
    (a kept trainer that does not is released)."""
    kept = model.__dict__.get("_kept")
    if kept is None:
        return None
    tr = kept.trainer
    if (not getattr(tr, "_freed", True) and kept.settings == settings
            and model.__dict__.get("_train_state") is kept.state and _layers(model) == kept.layers
            and what_trains(model) == kept.trains):
        # Weights set since the last call (set_weights, or another model's call training a layer this
        # one shares: a GAN's two models) go into the session, as a fit takes a callback's.
        edits = model._take_edits()
        if edits <= {p.name for p in tr._params}:
            table = model._weight_table()
            for name in sorted(edits):
                tr._session.set(name, table[name])
            model.__dict__["_kept"] = None  # the call owns it now; keep() puts it back
            return tr
        model._keep_edits(edits)
    release(model)
    return None


def keep(model, trainer, settings: tuple) -> None:
    """After a call that trained: keep ``trainer`` for the next one."""
    model.__dict__["_kept"] = _Kept(trainer, settings, model.__dict__.get("_train_state"), _layers(model),
                                    what_trains(model))


def _layers(model) -> tuple:
    return tuple(id(lyr) for lyr in getattr(model, "layers", ()))


def release(model, trainer=None) -> None:
    """Free the trainer kept on ``model`` (or ``trainer``, a call's that will not be kept), first
    copying the moments of the state it left the model, which still points into its session.
    Where they cannot be read (a full temporary folder), the trainer is left to the state, which
    keeps it until then, and nothing is lost."""
    if trainer is None:
        kept = model.__dict__.get("_kept")
        if kept is None:
            return
        model.__dict__["_kept"] = None
        trainer = kept.trainer
    state = model.__dict__.get("_train_state")
    if isinstance(state, PendingTrainState) and state.pending:
        try:
            _ = state.moments
        except Exception:  # noqa: BLE001 - the state keeps the trainer, and says why when read
            return
    trainer.free()
