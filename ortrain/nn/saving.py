"""Saving and loading models: one zip file, JSON and ``.npz`` inside, no pickle.

``model.json`` holds the architecture (layer configs and connections, or the ONNX
forward graph as ``graph.onnx`` for imported models), freezing, compile settings
and the optimizer's counters; ``weights.npz`` the weights; ``optimizer.npz`` the
Adam moments when the model was trained.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx

from ortrain import losses, optim
from ortrain import metrics as metrics_mod
from ortrain._files import atomic_path
from ortrain._keywords import names_unknown_arguments_of
from ortrain._version import __version__
from ortrain._warnings import warn
from ortrain.errors import OrtrainError
from ortrain.graph.forward import ForwardGraph, ParamSpec

FORMAT = 1


@dataclass
class TrainState:
    """What a model carries between ``fit`` calls so training continues where it stopped."""

    step: int  # optimizer updates taken (Adam's bias-correction step)
    lr: float
    moments: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)
    n_steps: int = 0  # forward/backward steps taken
    draws: int | None = None  # training-graph runs, which seeded dropout goes on from (None: n_steps)

    def __repr__(self) -> str:
        """The counters and the moments' weights and shapes, not their values."""
        try:
            moments = ", ".join(f"{name}: {' '.join(str(tuple(np.shape(m))) for m in ms)}"
                                for name, ms in self.moments.items())
        except Exception:  # noqa: BLE001 - a repr never raises
            moments = "?"
        return (f"TrainState(step={self.step!r}, lr={self.lr!r}, n_steps={self.n_steps!r}, "
                f"moments={{{moments}}})")


class PendingTrainState(TrainState):
    """A :class:`TrainState` whose moments are still in the session of the trainer that
    ``train_on_batch`` keeps open between its calls: copied out (``read()``, a checkpoint written
    and parsed, a few milliseconds) the first time they are read, not at every step. Copies and
    pickles are plain ``TrainState``\\ s with the moments read."""

    def __init__(self, step, lr, moments=None, n_steps=0, draws=None, *, read=None):
        self.step, self.lr, self.n_steps, self.draws = step, lr, n_steps, draws
        self._moments, self._read = ({} if moments is None else moments), read

    @property
    def moments(self) -> dict:
        if self._read is not None:
            self._moments, self._read = self._read(), None  # (the read raises where it cannot be done)
        return self._moments

    @moments.setter
    def moments(self, value) -> None:
        self._moments, self._read = value, None

    @property
    def pending(self) -> bool:
        """Whether the moments are still in the trainer's session."""
        return self._read is not None

    def __reduce__(self):
        return TrainState, (self.step, self.lr, self.moments, self.n_steps, self.draws)


def _tensor_refs(model) -> dict[int, list]:
    """Where each tensor of ``model``'s graph comes from, by the tensor's id: ``["input", i]`` or
    ``["node", j]`` (the first of each, as the graph lists them)."""
    refs: dict[int, list] = {}
    for j, node in reversed(list(enumerate(model._nodes))):
        refs[id(node.output)] = ["node", j]
    for i, inp in reversed(list(enumerate(model._inputs))):
        refs[id(inp)] = ["input", i]
    return refs


def model_record(model, with_weights: bool = True) -> tuple[dict, dict | None, dict]:
    """(record, weights, optimizer arrays) describing ``model`` completely; the weights are copies
    (``None`` without ``with_weights``)."""
    from ortrain.nn.graph_model import GraphModel
    from ortrain.nn.layers import saved_extras
    record = {"format": FORMAT, "ortrain": __version__, "name": model.name,
              "frozen": sorted(model._frozen), "frozen_stats": sorted(model._frozen_stats),
              "layer_frozen_stats": sorted(model._layer_frozen_stats)}
    extra = {}
    if isinstance(model, GraphModel):
        record["kind"] = "graph"
        record["params"] = [p.to_json() for p in model._base_params()]
        extra["graph.onnx"] = model._proto.SerializeToString()
    else:
        layer_index = {id(lyr): i for i, lyr in enumerate(model.layers)}
        record["kind"] = "layers"
        record["layers"] = [{"class": type(lyr).__name__, "config": lyr.get_config(), **saved_extras(lyr),
                             **({} if lyr.trainable else {"trainable": False})} for lyr in model.layers]
        record["inputs"] = [{"name": model._given_input_name(i), "shape": list(t.shape[1:]), "dtype": t.dtype.name}
                            for i, t in enumerate(model._inputs)]
        refs = _tensor_refs(model)
        record["nodes"] = [{"layer": layer_index[id(n.layer)], "inputs": [refs[id(t)] for t in n.inputs]}
                           for n in model._nodes]
        record["outputs"] = [refs[id(t)] for t in model._outputs]
    record["compile"] = None if not model.compiled else {
        "loss": model.loss.config(), "optimizer": model.optimizer.config(), "metrics": list(model.metrics),
        "weighted_metrics": list(model.weighted_metrics)}
    opt_arrays = {}
    ts = model.train_state
    if ts is not None:
        lr = model.optimizer._lr if model._lr_written() else ts.lr  # a rate written since is the one to go on at
        record["train_state"] = {"step": ts.step, "lr": lr, "n_steps": ts.n_steps, "draws": ts.draws,
                                 "moments": {k: len(v) for k, v in ts.moments.items()}}
        for k, ms in ts.moments.items():
            for i, m in enumerate(ms):
                opt_arrays[f"{k}\x00{i}"] = m
    else:
        record["train_state"] = None
    weights = dict(zip(model.weight_names(), model.get_weights())) if with_weights else None
    record["_extra"] = sorted(extra)
    from ortrain.nn.model import Sequential
    record["sequential"] = isinstance(model, Sequential)
    if record["sequential"] and model.__dict__.get("_seed") is not None and "_pending" in model.__dict__:
        # a seeded stack: layers added after a load or copy draw what they would have drawn here
        index = {id(lyr): i for i, lyr in enumerate(model.layers)}
        record["stack"] = {"seed": model._seed, "rng": model._rng.bit_generator.state,
                           "drawn_before": sorted([index[k], s] for k, s in model.__dict__.get("_drawn_before", {}).items()
                                                  if k in index)}
    return record, weights, {"opt": opt_arrays, "extra": extra}


class _NoDraws:
    """What a layer's build draws its initial weights from when the record's replace them: zeros,
    as ``np.random.Generator.uniform`` gives them (the only draw layers make)."""

    @staticmethod
    def uniform(low=0.0, high=1.0, size=None):
        return np.zeros(size if size is not None else (), np.float32)


def _saved_name(record: dict) -> str | None:
    """The name a model was saved with; one a constructor would refuse (an empty string set on the
    model after it was built) gives the default name instead."""
    name = record.get("name")
    return name if isinstance(name, str) and name else None


def model_from_record(record: dict, weights: dict, aux: dict):
    from ortrain.nn.graph_model import GraphModel
    from ortrain.nn.layers import layer_from_config
    from ortrain.nn.model import Input, Model, Sequential
    if record.get("format") != FORMAT:
        raise OrtrainError(f"saved model format {record.get('format')!r} is not the format {FORMAT} this "
                           "ortrain reads")
    if record["kind"] == "graph":
        proto = onnx.load_from_string(aux["extra"]["graph.onnx"])
        params = tuple(ParamSpec.from_json(p) for p in record["params"])
        model = GraphModel(ForwardGraph(proto, params, {p.name: weights[p.name] for p in params}),
                           name=_saved_name(record) or "onnx_model")
    else:
        layers = [layer_from_config(d["class"], d["config"], d.get("softmax_axis")) for d in record["layers"]]
        for lyr, d in zip(layers, record["layers"]):
            lyr.trainable = bool(d.get("trainable", True))
            lyr.rebuilt = True  # what a layer says when first built was said when the user built it
        inputs = [Input(tuple(d["shape"]), dtype=d["dtype"], name=d["name"]) for d in record["inputs"]]
        tensors = []

        def ref(r):
            return inputs[r[1]] if r[0] == "input" else tensors[r[1]]
        # The weights are set from the record below: build without drawing any (so copying or
        # loading a model neither consumes nor depends on ortrain's global seed, nor spends the
        # time of drawing millions of numbers it throws away).
        scratch = _NoDraws()
        for node in record["nodes"]:
            args = [ref(r) for r in node["inputs"]]
            lyr = layers[node["layer"]]
            lyr.build([t.shape for t in args], scratch)
            tensors.append(lyr(args if lyr.n_inputs is None else args[0]))
        model = Model(inputs, [ref(r) for r in record["outputs"]], name=_saved_name(record))
        if record.get("sequential"):
            model.__class__ = Sequential
            stack = record.get("stack")
            if stack is not None:  # as Sequential._adopt, keeping the saved stack's seed and draws
                model._pending, model._seed = (model._inputs[0], None, None, model.name), stack["seed"]
                model._rng = np.random.default_rng(stack["seed"])
                model._rng.bit_generator.state = stack["rng"]
                model._drawn_before = {id(layers[i]): s for i, s in stack["drawn_before"]}
        missing = sorted(set(model.weight_names()) - set(weights))
        if missing:
            raise OrtrainError(f"saved model lacks weights {missing}")
        model.set_weights({n: weights[n] for n in model.weight_names()})
    model._frozen = set(record.get("frozen", []))
    model._frozen_stats = set(record.get("frozen_stats", []))
    layer_frozen = record.get("layer_frozen_stats")
    model._layer_frozen_stats = model._frozen_layer_stats() if layer_frozen is None else set(layer_frozen)
    comp = record.get("compile")
    if comp:
        loss = losses.get(comp["loss"])
        kept = []
        for key in ("metrics", "weighted_metrics"):
            names, misfit, unknown = metrics_mod.fitting(comp.get(key, []), loss)
            if misfit:
                warn(f"load_model: {key} {misfit} do not read the labels of loss {loss.name!r} (their values were "
                     "wrong); the model is compiled without them")
            if unknown:
                warn(f"load_model: {key} {unknown} are not known to this ortrain {__version__}; the model is "
                     "compiled without them")
            kept.append(names)
        model.compile(optimizer=optim.get(comp["optimizer"]), loss=loss, metrics=kept[0], weighted_metrics=kept[1])
    ts = record.get("train_state")
    if ts:
        moments = {k: tuple(aux["opt"][f"{k}\x00{i}"] for i in range(n)) for k, n in ts["moments"].items()}
        # as recorded: a count that is not an int is refused by load_model (_train_state_problem), not cut
        model._train_state = TrainState(ts["step"], float(ts["lr"]), moments, ts.get("n_steps", 0), ts.get("draws"))
    model._changed()
    return model


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def save_model(model, path) -> str:
    with model._paired():  # from another thread than a running fit's: between its steps
        record, weights, aux = model_record(model)
    # npz keys must be valid file names inside the archive; index them and keep the names in JSON.
    wnames = list(weights)
    record["weight_order"] = wnames
    onames = list(aux["opt"])
    record["optimizer_order"] = onames
    # Arrays and graphs are stored as they are: float32 weights deflate by about 15% at ten times the
    # time of writing them (a second a save for 8M weights with their moments), and loads inflate them.
    with atomic_path(path, "save(path)") as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("model.json", json.dumps(record, indent=1, sort_keys=True), compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("weights.npz", _npz_bytes({f"w{i}": weights[n] for i, n in enumerate(wnames)}))
        if onames:
            z.writestr("optimizer.npz", _npz_bytes({f"m{i}": aux["opt"][n] for i, n in enumerate(onames)}))
        for name, data in aux["extra"].items():
            z.writestr(name, data)
    return os.fspath(path)


@names_unknown_arguments_of
def load_model(path, compile: bool = True):
    """Load a model written by ``Model.save``: architecture, weights, and with ``compile`` (as in
    Keras) its loss, optimizer, metrics and optimizer state; ``compile=False`` gives the model
    uncompiled, for inference or another ``compile``."""
    if not isinstance(path, (str, os.PathLike)):
        raise OrtrainError(f"load_model(path): expected a file path (str or os.PathLike), received {path!r}")
    if not isinstance(compile, (bool, np.bool_)):
        raise OrtrainError(f"load_model(compile=...): expected True or False, received {compile!r}")
    path = os.fspath(path)
    ours = False  # a zip listing model.json: an error reading it means the file is damaged
    try:
        with zipfile.ZipFile(path) as z:
            ours = "model.json" in z.namelist()
            record = json.loads(z.read("model.json"))
            if not isinstance(record, dict):
                raise ValueError(f"model.json holds a {type(record).__name__}, not an object")
            with np.load(io.BytesIO(z.read("weights.npz")), allow_pickle=False) as f:
                weights = {n: f[f"w{i}"] for i, n in enumerate(record["weight_order"])}
            opt = {}
            if record.get("optimizer_order"):
                with np.load(io.BytesIO(z.read("optimizer.npz")), allow_pickle=False) as f:
                    opt = {n: f[f"m{i}"] for i, n in enumerate(record["optimizer_order"])}
            extra = {name: z.read(name) for name in record.get("_extra", [])}
    except FileNotFoundError:
        raise OrtrainError(f"load_model: no such file {path!r}") from None
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError, OSError, EOFError, NotImplementedError,
            zlib.error) as exc:
        if ours:  # a flipped bit: zlib's error, a bad CRC, an unknown compression method
            raise OrtrainError(f"load_model: {path!r} is damaged: it cannot be read ({type(exc).__name__}: {exc}); "
                               "use another copy, or save the model again") from exc
        if isinstance(exc, zipfile.BadZipFile) and _is_trainer_checkpoint(path):
            raise OrtrainError(f"load_model: {path!r} is a trainer checkpoint (Trainer.save_checkpoint, or "
                               "ModelCheckpoint(save_model=False)), which holds weights and optimizer state but not "
                               "the architecture; resume it with ot.Trainer.from_checkpoint(model, path, "
                               "batch_size=...) for the model that wrote it") from exc
        hint = ""
        if isinstance(exc, zipfile.BadZipFile) and str(path).lower().endswith(".onnx"):
            hint = "; an ONNX model is opened with ot.from_onnx(path)"
        raise OrtrainError(f"load_model: {path!r} is not a model saved by ortrain ({exc}){hint}") from exc
    try:
        model = model_from_record(record, weights, {"opt": opt, "extra": extra})
    except OrtrainError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise OrtrainError(f"load_model: {path!r} is damaged: its model.json does not describe a model "
                           f"({type(exc).__name__}: {exc}); save the model again") from exc
    problem = _train_state_problem(model)
    if problem:
        raise OrtrainError(f"load_model: {path!r} is damaged: {problem}; save the model again")
    _warn_non_finite_moments(model, path)
    if not compile:
        model.optimizer, model.loss, model.metrics, model.weighted_metrics = None, None, [], []
        model.train_state = None
    return model


def _train_state_problem(model) -> str | None:
    """What is wrong with a loaded model's optimizer state (a step, a rate, a moment no training
    leaves), so a damaged file is refused when it is loaded, not inside onnxruntime at the first
    step. Moments that are not finite a diverged training leaves: see
    :func:`_warn_non_finite_moments`."""
    import math

    from ortrain.optim.optimizers import is_step
    ts = model.train_state
    if ts is None:
        return None
    for name, value in (("step", ts.step), ("n_steps", ts.n_steps), ("draws", ts.draws)):
        if value is not None and not is_step(value):
            return f"its training state's {name!r} is {value!r}, not an int >= 0"
    if not (math.isfinite(ts.lr) and ts.lr >= 0):
        return f"its learning rate is {ts.lr!r}, not a finite number >= 0"
    shapes = {n: tuple(a.shape) for n, a in model._weight_table().items()}
    # Adam keeps two moments a weight; onnxruntime-training's SGD one (always 0: it keeps no velocity), two
    # with momentum (the velocity, and a second one held at 0); its momentum may have been set since
    counts = (2,) if model.optimizer is not None and model.optimizer.name != "sgd" else (0, 1, 2)
    for name, ms in ts.moments.items():
        if name not in shapes:
            return f"it holds optimizer moments of {name!r}, which is not a weight of the model"
        if len(ms) not in counts:
            return f"it holds {len(ms)} optimizer moments of {name!r}, where its optimizer keeps {counts[-1]}"
        for k, a in zip(("m", "v"), ms):
            if a.dtype != np.float32 or a.shape != shapes[name]:
                return (f"moment {k!r} of {name!r} is {a.dtype} of shape {a.shape}, where the weight is float32 of "
                        f"shape {shapes[name]}")
            if k == "v" and (a < 0).any():  # a mean of squares; NaN is not below 0
                return f"moment 'v' of {name!r} holds {a[a < 0].flat[0]}, where it needs values >= 0"
            if k == "v" and counts != (2,) and (a != 0).any():  # SGD's update divides by sqrt(v) + eps
                return f"moment 'v' of {name!r} holds {a[a != 0].flat[0]}, where SGD holds it at 0"
    return None


def _warn_non_finite_moments(model, path) -> None:
    """A model whose training diverged before it was saved keeps its NaN moments, as it had them
    (EarlyStopping's restored weights beside them, say): loaded as saved, with a warning."""
    ts = model.train_state
    bad = sorted(n for n, ms in (ts.moments.items() if ts else ()) if not all(np.isfinite(a).all() for a in ms))
    if bad:
        warn(f"load_model: {path!r} holds optimizer moments that are not finite ({', '.join(map(repr, bad[:3]))}"
             f"{', ...' if len(bad) > 3 else ''}; training diverged before it was saved?): a fit from them gives NaN "
             "weights; compile the model again to train on from fresh moments")


def _is_trainer_checkpoint(path) -> bool:
    """Whether ``path`` is an onnxruntime-training checkpoint that a ``Trainer`` wrote."""
    from ortrain import engine
    try:
        return any(k.startswith("ortrain.") for k in engine.read_checkpoint(path).properties)
    except Exception:  # noqa: BLE001 - any unreadable file is simply not one
        return False
