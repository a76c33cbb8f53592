"""Training artifacts: the offline step between a model and a training session.

``build`` turns a model into the files onnxruntime-training runs — a training
graph (forward, loss, backward, gradient accumulation), an eval graph (forward
and loss), an optimizer graph, a checkpoint with the weights — plus the forward
graph for predictions and a ``manifest.json`` describing all of them.

Artifacts are cached by a content hash of everything that shapes the graphs (the
architecture, parameter roles, loss, weighting, optimizer, and the versions of
ortrain, onnx and onnxruntime), under ``~/.cache/ortrain/artifacts`` by default.
Weights are not part of the hash: the same architecture with other weights
reuses the cached graphs in a directory of its own. Published directories are
never modified. ``load`` refuses directories written by other versions
and files whose hash no longer matches the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ortrain import engine, losses, optim
from ortrain._files import CAN_LOCK, atomic_path, fresh_dir, lock_file, not_a_folder
from ortrain._version import __version__
from ortrain._warnings import warn
from ortrain.errors import OrtrainError
from ortrain.graph import OPSET, GraphBuilder, TensorSpec, check_model
from ortrain.graph.forward import ForwardGraph, ParamSpec, extend
from ortrain.graph.gradient_forms import for_training
from ortrain.graph.gradient_ops import ancestors, gradient_reach, may_stop_gradients

__all__ = ["Artifacts", "build", "load", "cache_dir", "set_cache_dir", "LABEL", "SAMPLE_WEIGHT", "LOSS_SCALE"]

FORMAT = 1
# Bumped whenever the code that writes the graphs changes what it writes, so caches made by an
# earlier revision of this version of ortrain miss instead of serving stale graphs.
BUILDER_REVISION = 11
LABEL = "ortrain.label"
SAMPLE_WEIGHT = "ortrain.sample_weight"
LOSS_SCALE = "ortrain.loss_scale"
LOSS = "ortrain.loss"
SCALED_LOSS = "ortrain.scaled_loss"
FILES = ("training.onnx", "eval.onnx", "optimizer.onnx", "forward.onnx", "checkpoint")
WEIGHTINGS = (None, "sample", "element")

_cache_root: Path | None = None


def cache_dir() -> Path:
    """Where artifacts are cached: ``set_cache_dir`` > ``$XDG_CACHE_HOME/ortrain/artifacts`` > ``~/.cache/...``."""
    if _cache_root is not None:
        return _cache_root
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG spec says to ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ortrain" / "artifacts"


def set_cache_dir(path) -> None:
    """Use ``path`` as the artifact cache from now on (``None`` restores the default). A relative
    path is taken from the working directory now (a later ``os.chdir`` does not move the cache)."""
    global _cache_root
    if path is not None and (not isinstance(path, (str, os.PathLike)) or not os.fspath(path)):
        raise OrtrainError(f"set_cache_dir(path=...): expected a folder path or None, received {path!r}")
    _cache_root = Path(os.path.abspath(path)) if path is not None else None


def versions() -> dict:
    return {"ortrain": __version__, "onnx": onnx.__version__, "onnxruntime": engine.ORT_VERSION}


@dataclass(frozen=True)
class Artifacts:
    """A validated artifact directory: paths plus the parsed manifest."""

    directory: Path
    manifest: dict

    @property
    def training(self) -> Path:
        return self.directory / "training.onnx"

    @property
    def eval(self) -> Path:
        return self.directory / "eval.onnx"

    @property
    def optimizer_graph(self) -> Path:
        return self.directory / "optimizer.onnx"

    @property
    def forward(self) -> Path:
        return self.directory / "forward.onnx"

    @property
    def checkpoint(self) -> Path:
        return self.directory / "checkpoint"

    @property
    def key(self) -> str:
        return self.manifest["key"]

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_json(d) for d in self.manifest["inputs"]]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_json(d) for d in self.manifest["outputs"]]

    @property
    def label(self) -> TensorSpec:
        return TensorSpec.from_json(self.manifest["label"])

    @property
    def sample_weight(self) -> TensorSpec | None:
        d = self.manifest["sample_weight"]
        return TensorSpec.from_json(d) if d else None

    @property
    def weighting(self) -> str | None:
        return self.manifest["weighting"]

    @property
    def params(self) -> list[ParamSpec]:
        return [ParamSpec.from_json(d) for d in self.manifest["parameters"]]

    @property
    def loss(self) -> losses.Loss:
        return losses.get(self.manifest["loss"])

    @property
    def optimizer(self) -> optim.Optimizer:
        return optim.get(self.manifest["optimizer"])

    @property
    def prediction(self) -> str:
        return self.manifest["prediction"]

    def model(self, checkpoint=None, metrics=None):
        """A compiled model over these artifacts' forward graph, with the weights of ``checkpoint``
        (a path or parsed checkpoint data; default the artifacts' own checkpoint)."""
        from ortrain.nn.graph_model import GraphModel
        data = checkpoint if isinstance(checkpoint, engine.CheckpointData) else \
            engine.read_checkpoint(self.checkpoint if checkpoint is None else checkpoint)
        where = f" {os.fspath(checkpoint)!r}" if isinstance(checkpoint, (str, os.PathLike)) else ""
        trained_with = data.properties.get(CHECKPOINT_LOSS)
        if trained_with is not None and trained_with != loss_text(self.loss):
            raise OrtrainError(f"the checkpoint{where} was trained with the loss {trained_with}, the artifacts in "
                               f"{str(self.directory)!r} compute {loss_text(self.loss)} (rebuilt since?); use the "
                               "artifacts it was trained with")
        architecture = data.properties.get(CHECKPOINT_FORWARD)
        if architecture is not None and architecture != self.manifest["files"]["forward.onnx"]:
            raise OrtrainError(f"the checkpoint{where} was trained with another architecture than the artifacts in "
                               f"{str(self.directory)!r} hold (rebuilt since?); use the artifacts it was trained with")
        weights = {**data.trainable, **data.frozen}
        misfits = [f"{p.name} {tuple(weights[p.name].shape)} for {tuple(p.shape)}" for p in self.params
                   if p.name in weights and tuple(weights[p.name].shape) != tuple(p.shape)]
        if misfits:
            raise OrtrainError(f"the checkpoint{where} holds weights of other shapes than the artifacts in "
                               f"{str(self.directory)!r}: {', '.join(misfits[:4])}; use the artifacts it was "
                               "trained with")
        missing = sorted({p.name for p in self.params} - set(weights))
        if missing:
            raise OrtrainError(f"the checkpoint lacks weights {missing[:5]} of these artifacts")
        try:
            forward = onnx.load(self.forward)
        except FileNotFoundError:
            raise OrtrainError(f"the artifacts in {str(self.directory)!r} changed while being read (rebuilt by another "
                               "process?); load them again") from None
        model = GraphModel(ForwardGraph(forward, tuple(self.params), weights), name=self.directory.name or "artifacts")
        model.compile(optimizer=self.optimizer, loss=self.loss, metrics=metrics)
        return model


# Properties Trainer.save_checkpoint records: the loss, and the architecture (forward.onnx's sha256,
# the same whatever the optimizer or loss weighting).
CHECKPOINT_LOSS = "ortrain.loss"
CHECKPOINT_FORWARD = "ortrain.forward"


def loss_text(loss: losses.Loss) -> str:
    return json.dumps(loss.config(), sort_keys=True)


_verified: dict[tuple, str] = {}


def _sha256(path: Path, remember: bool = False) -> str:
    """sha256 of a file. With ``remember``, a file this process already hashed and that has not
    changed since (same inode, size and modification time) is not read again."""
    stat = os.stat(path)
    memo = (os.path.abspath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if remember and memo in _verified:
        return _verified[memo]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if remember:
        _verified[memo] = digest
    return digest


def _key(fg: ForwardGraph, loss: losses.Loss, opt: optim.Optimizer, weighting: str | None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT, "builder": BUILDER_REVISION, "versions": versions(), "loss": loss.config(),
                         "optimizer": _opt_config(opt), "weighting": weighting},
                        sort_keys=True).encode())
    h.update(fg.digest().encode())
    return h.hexdigest()


def _opt_config(opt: optim.Optimizer) -> dict:
    # The learning rate is set on the session before every update; it does not shape the graph.
    return {k: v for k, v in opt.config().items() if k != "lr"}


def _check_weighting(weighting) -> None:
    if weighting not in WEIGHTINGS:
        raise OrtrainError(f"weighting: expected None, 'sample' or 'element', received {weighting!r}")


def _check_trainable(fg: ForwardGraph) -> None:
    if not fg.names("trainable"):
        raise OrtrainError("nothing to train: every weight is frozen or a buffer; unfreeze some weights")


def loss_model(fg: ForwardGraph, loss: losses.Loss, weighting: str | None) -> tuple[onnx.ModelProto, dict]:
    """The forward graph with the loss appended; returns the model and the manifest's I/O entries.

    Outputs: ``[scaled_loss, loss, prediction]``. ``scaled_loss = loss * loss_scale`` is where
    backpropagation starts, so gradient accumulation over k batches can feed ``1/k``.
    """
    _check_weighting(weighting)
    outputs = fg.outputs
    if not outputs:
        raise OrtrainError("the model has no outputs to put a loss on")
    pred = outputs[0]
    if pred.dtype != np.float32:
        raise OrtrainError(f"the model's first output {pred.name!r} is {np.dtype(pred.dtype).name}; "
                           "the loss needs float32 predictions")
    if weighting == "element" and not loss.element_weights:
        raise OrtrainError(f"one weight per output element is defined for mean squared error only, "
                           f"not {loss.name!r}; use loss='mse' or one weight per sample")
    if weighting is not None and len(pred.shape) < 2 and weighting == "element":
        raise OrtrainError("one weight per output element needs a prediction of shape [batch, outputs]")
    batch = pred.shape[0] if pred.shape else None
    gb = GraphBuilder(prefix="ortrain.loss/")
    label = TensorSpec(LABEL, loss.label_dtype, loss.label_shape(pred.shape))
    gb.add_input(label.name, label.dtype, label.shape)
    weight = None
    if weighting == "sample":
        weight = TensorSpec(SAMPLE_WEIGHT, np.dtype(np.float32), (batch,) + (1,) * (len(pred.shape) - 1))
    elif weighting == "element":
        weight = TensorSpec(SAMPLE_WEIGHT, np.dtype(np.float32), tuple(pred.shape))
    if weight is not None:
        gb.add_input(weight.name, weight.dtype, weight.shape)
    gb.add_input(LOSS_SCALE, np.float32, ())
    value = loss.build(gb, pred.name, LABEL, weight.name if weight else None, pred_rank=len(pred.shape))
    gb.op("Identity", [value], outputs=[LOSS])
    gb.op("Mul", [LOSS, LOSS_SCALE], outputs=[SCALED_LOSS])
    outs = [TensorSpec(SCALED_LOSS, np.dtype(np.float32), ()).to_value_info(),
            TensorSpec(LOSS, np.dtype(np.float32), ()).to_value_info(),
            pred.to_value_info()]
    model = extend(fg.proto, gb, outs)
    io = {"inputs": [s.to_json() for s in fg.inputs], "outputs": [s.to_json() for s in outputs],
          "label": label.to_json(), "sample_weight": weight.to_json() if weight else None,
          "weighting": weighting, "loss_scale": LOSS_SCALE, "prediction": pred.name,
          "train_outputs": [SCALED_LOSS, LOSS, pred.name]}
    return model, io


def build(model_or_onnx, loss="mse", optimizer="adamw", out_dir=None, *, trainable=None, frozen=None,
          weighting: str | None = None, refresh_checkpoint: bool = True, _accept_key=None) -> Artifacts:
    """Generate (or find in the cache) the training artifacts for ``model_or_onnx``.

    ``model_or_onnx`` is an :class:`ortrain.Model`, a :class:`ForwardGraph`, an
    ``onnx.ModelProto`` or a path to an ``.onnx`` file. ``loss`` and ``optimizer`` take what
    ``Model.compile`` takes (the default ``"adamw"`` is ``ot.optim.AdamW()``, weight decay
    0.01); they are the artifacts' own, not a compiled model's: pass ``loss=model.loss,
    optimizer=model.optimizer`` to build what the model was compiled with. ``out_dir`` writes to
    that directory instead of the cache. ``trainable``/``frozen`` (names or glob patterns)
    refine which weights train. ``weighting`` adds a ``sample_weight``
    input: ``"sample"`` (one weight per sample) or ``"element"``.

    A published directory is never changed in place: the same architecture with other weights
    gets a directory of its own beside the cached one (sharing its graph files by hard link), so
    an :class:`Artifacts` record keeps pointing at the weights it was built with, and processes
    building the same thing at once take turns on a lock instead of replacing each other's files.
    An ``out_dir`` that holds artifacts of another model, loss or optimizer is replaced whole.
    The learning rate shapes no graph and is not in the key: a hit asked for another rate
    returns a record that carries it, and an ``out_dir``'s manifest is rewritten to it (a
    ``Trainer`` of a model takes the model's rate in any case).
    ``refresh_checkpoint=False`` accepts a cache hit with other weights (the Trainer copies the
    model's weights into its session anyway). ``_accept_key`` (internal) is called with the key
    before anything is written, and may refuse it by raising.
    """
    _check_weighting(weighting)
    fg = _freeze_unreachable(_forward_graph(model_or_onnx, trainable, frozen))
    _check_trainable(fg)
    loss = losses.get(loss)
    opt = optim.get(optimizer)
    key = _key(fg, loss, opt, weighting)
    if _accept_key is not None:
        _accept_key(key)
    # through symbolic links: publishing renames a new folder into place, which would replace a link
    target = Path(os.path.realpath(out_dir)) if out_dir is not None else cache_dir() / key[:24]

    def digest() -> str:
        return _weights_digest(model_or_onnx, fg)

    owned = out_dir is None  # a cache entry is ortrain's: whatever else it holds is replaced
    if owned:  # an exact hit needs no lock, so a read-only cache serves it
        try:
            hit = _existing(target, key, owned)
        except OSError:  # another builder is replacing a damaged entry: take the lock
            hit = None
        if hit is not None and (not refresh_checkpoint or hit.manifest["weights_sha256"] == digest()):
            return _with_lr(hit, opt, rewrite=False)
    with _publish_lock(target):
        existing = _existing(target, key, owned)
        if existing is None:
            return _publish(target, lambda tmp: _write(tmp, key, fg, loss, opt, weighting, digest()))
        if not refresh_checkpoint or existing.manifest["weights_sha256"] == digest():
            return _with_lr(existing, opt, rewrite=out_dir is not None)
        if out_dir is not None:
            return _publish(target, lambda tmp: _with_weights(existing, fg, tmp, digest(), opt))
    variant = target.with_name(f"{target.name}-{digest()[:12]}")
    with _publish_lock(variant):
        found = _existing(variant, key, owned=True)
        return _with_lr(found, opt, rewrite=False) if found is not None else \
            _publish(variant, lambda tmp: _with_weights(existing, fg, tmp, digest(), opt))


def _with_lr(art: Artifacts, opt: optim.Optimizer, rewrite: bool) -> Artifacts:
    """A hit whose learning rate differs (it shapes no graph, so it is not in the key): the
    record carries the requested one, and an ``out_dir``'s manifest is rewritten to it (the
    manifest is the one file a published directory may change; the cache's are shared)."""
    wanted = json.loads(json.dumps(opt.config()))
    if art.manifest["optimizer"] == wanted:
        return art
    manifest = dict(art.manifest, optimizer=wanted)
    if rewrite:
        with atomic_path(art.directory / "manifest.json") as tmp:
            Path(tmp).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return Artifacts(art.directory, manifest)


@contextlib.contextmanager
def _publish_lock(target: Path):
    """An exclusive lock per artifact directory, so concurrent builders of one key take turns.

    The lock file is removed by its holder before it lets go, so builds leave none behind (and a
    build that fails before anything is published also removes the folders it made). A builder
    that was waiting on a removed file sees that it is gone (another inode, or none, at the
    path) and takes the lock afresh, so two builders never work on one directory at once.
    """
    why = not_a_folder(target)
    if why is not None:
        raise OrtrainError(f"out_dir: {str(target)!r} {why}; artifacts need a directory, choose another path")
    if not CAN_LOCK:  # not on POSIX: publishing stays atomic, concurrent builders may both build
        target.parent.mkdir(parents=True, exist_ok=True)
        yield
        return
    lock, made = target.parent / f".{target.name}.lock", []
    while True:
        made += [p for p in (target.parent, *target.parent.parents) if not p.exists() and p not in made]
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle = lock_file(lock)
            break
        except FileNotFoundError:  # a failing builder removed a folder just made: try again
            continue
        except OSError as exc:  # not writable: a read-only file system, another user's folder
            raise _unwritable(target, exc) from None
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        if failed and not target.exists():
            for folder in made:  # innermost first
                with contextlib.suppress(OSError):
                    folder.rmdir()
        handle.close()  # releases the lock


def _unwritable(target: Path, exc: OSError) -> OrtrainError:
    where = exc.filename or target.parent
    if target.parent == cache_dir() or cache_dir() in target.parents:
        return OrtrainError(f"the artifact cache {str(cache_dir())!r} cannot be written ({exc.strerror}: {str(where)!r}); "
                            "make it writable, or choose another cache with ot.artifacts.set_cache_dir(path) or "
                            "XDG_CACHE_HOME")
    return OrtrainError(f"out_dir: {str(target)!r} cannot be written ({exc.strerror}: {str(where)!r}); choose a "
                        "writable folder")


def _publish(target: Path, fill) -> Artifacts:
    """Write a complete directory beside ``target`` with ``fill(tmp)``, then rename it into place
    (moving a stale ``target`` aside just before, and removing it after), so a reader sees the
    old directory, the new one, or for the moment between two renames none; an error or an
    interrupt at any point leaves the old one or the new one in place."""
    _refuse_working_directory(target)
    tmp = fresh_dir(target.parent, f".{target.name}.tmp-")
    old = None
    try:
        fill(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, old / "stale")
        os.rename(tmp, target)
    except BaseException:
        if old is not None and (old / "stale").exists() and not target.exists():
            os.rename(old / "stale", target)  # put the old directory back
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return load(target)


def _weights_digest(model, fg: ForwardGraph) -> str:
    """The model's remembered digest when it keeps one (ortrain models do), else a fresh one."""
    return model.weights_digest() if hasattr(model, "weights_digest") else fg.weights_digest()


def _freeze_unreachable(fg: ForwardGraph) -> ForwardGraph:
    """Weights the loss does not depend on (they feed only other outputs) get no gradient: the
    gradient builder refuses them, so they are frozen here, with a warning naming them."""
    outputs = fg.outputs
    if not outputs:
        return fg
    trainable = [p.name for p in fg.params if p.role == "trainable"]
    reach = gradient_reach(fg.proto, [outputs[0].name]) if may_stop_gradients(fg.proto, trainable) else \
        ancestors(fg.proto, outputs[0].name)
    idle = [name for name in trainable if name not in reach]
    if not idle:
        return fg
    shown = ", ".join(idle[:6]) + (f" and {len(idle) - 6} more" if len(idle) > 6 else "")
    warn(f"weights {shown} do not affect the loss, which is computed on the first output "
         f"{outputs[0].name!r}; they are not trained")
    params = tuple(ParamSpec(p.name, p.shape, p.dtype, "frozen" if p.name in idle else p.role) for p in fg.params)
    return ForwardGraph(fg.proto, params, fg.weights)


def _forward_graph(model, trainable, frozen) -> ForwardGraph:
    if isinstance(model, ForwardGraph):
        if trainable is not None or frozen is not None:
            from ortrain.nn.onnx_import import reassign_roles
            return reassign_roles(model, trainable, frozen)
        return model
    if hasattr(model, "forward_graph"):
        fg = model.forward_graph()
        if trainable is not None or frozen is not None:
            from ortrain.nn.onnx_import import reassign_roles
            fg = reassign_roles(fg, trainable, frozen)
        return fg
    if isinstance(model, (onnx.ModelProto, str, os.PathLike)):
        from ortrain.nn.onnx_import import from_onnx
        return from_onnx(model, trainable=trainable, frozen=frozen).forward_graph()
    raise OrtrainError(f"model: expected an ortrain Model, an onnx.ModelProto or a path to an .onnx file, "
                       f"received {type(model).__name__}")


def _refuse_working_directory(target: Path) -> None:
    """Artifacts are written to a new folder renamed into place, which would leave a process
    working in ``target`` (or below it) in a deleted folder."""
    cwd = Path(os.path.realpath(os.getcwd()))
    if target == cwd or target in cwd.parents:
        raise OrtrainError(f"out_dir: {str(target)!r} is the current working directory or holds it, and artifacts "
                           "are written to a new folder renamed into its place; give a folder to create, e.g. "
                           "'artifacts'")


def _existing(target: Path, key: str, owned: bool = False) -> Artifacts | None:
    """The valid artifacts of ``key`` in ``target``, or None where they must be (re)built. A folder
    holding anything else is the user's and refused, unless ``owned`` (a cache entry)."""
    manifest = target / "manifest.json"
    if not owned and target.is_dir():  # only artifacts are replaced: anything else in the folder is the user's
        others = sorted(p.name for p in target.iterdir() if p.name not in (*FILES, "manifest.json"))
        if others or (not manifest.exists() and any(target.iterdir())):
            raise OrtrainError(f"out_dir {str(target)!r} exists and is not an ortrain artifacts directory"
                               + (f" (it holds {', '.join(others[:4])})" if others else "")
                               + "; choose an empty or new directory")
    if not manifest.exists():
        return None
    try:
        art = load(target)
    except OrtrainError:
        return None  # stale or damaged: rebuilt below
    return art if art.key == key else None


def _write(directory: Path, key: str, fg: ForwardGraph, loss: losses.Loss, opt: optim.Optimizer,
           weighting: str | None, weights_sha256: str) -> None:
    _check_trainable(fg)
    lm, io = loss_model(fg, loss, weighting)
    lm = for_training(lm)
    frozen = fg.names("frozen") + fg.names("buffer")
    # onnx.checker validates what ortrain writes itself (the loss model here, the optimizer graph,
    # forward.onnx); the gradient graphs come from onnxruntime-training and hold its own training
    # ops (MaxPoolGrad and others in the default domain) that onnx's checker does not know, so
    # opening them in onnxruntime-training is their check.
    check_model(lm, "forward graph with its loss")
    training, eval_model = engine.build_training_graphs(lm, fg.names("trainable"), frozen, io["train_outputs"])
    onnx.save(training, directory / "training.onnx")
    onnx.save(eval_model, directory / "eval.onnx")
    onnx.save(opt.graph(), directory / "optimizer.onnx")
    # The forward graph in training flavour (dropout active), parameters as inputs: the
    # model can be rebuilt from it; predictions apply to_inference() first.
    check_model(fg.proto, "forward graph")
    onnx.save(fg.proto, directory / "forward.onnx")
    manifest = {"format": FORMAT, "key": key, "versions": versions(), "opset": OPSET, **io,
                "parameters": [p.to_json() for p in fg.params], "loss": loss.config(), "optimizer": opt.config()}
    _finish(directory, manifest, fg, weights_sha256)


def _with_weights(existing: Artifacts, fg: ForwardGraph, directory: Path, weights_sha256: str,
                  opt: optim.Optimizer) -> None:
    """The graphs of ``existing`` (hard-linked where the file system allows) with ``fg``'s weights
    and ``opt``'s learning rate."""
    for name in FILES:
        if name == "checkpoint":
            continue
        try:
            os.link(existing.directory / name, directory / name)
        except OSError:
            shutil.copyfile(existing.directory / name, directory / name)
    manifest = {k: v for k, v in existing.manifest.items() if k not in ("files", "weights_sha256")}
    manifest["optimizer"] = json.loads(json.dumps(opt.config()))
    _finish(directory, manifest, fg, weights_sha256)


def _finish(directory: Path, manifest: dict, fg: ForwardGraph, weights_sha256: str) -> None:
    """Write the checkpoint of ``fg``'s weights and the manifest with every file's hash."""
    roles = {p.name: p.role for p in fg.params}
    engine.write_initial_checkpoint(directory / "checkpoint",
                                    {n: a for n, a in fg.weights.items() if roles[n] == "trainable"},
                                    {n: a for n, a in fg.weights.items() if roles[n] != "trainable"})
    manifest = dict(manifest, weights_sha256=weights_sha256,
                    files={name: _sha256(directory / name) for name in FILES})
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def _is_dims(value) -> bool:
    return isinstance(value, list) and all(d is None or (type(d) is int and d >= 0) for d in value)


def _is_dtype(value) -> bool:
    try:
        return isinstance(value, str) and np.dtype(value).kind in "biuf"
    except TypeError:
        return False


def _is_spec(d) -> bool:
    return isinstance(d, dict) and isinstance(d.get("name"), str) and _is_dtype(d.get("dtype")) and \
        _is_dims(d.get("shape"))


def _is_param(d) -> bool:
    return _is_spec(d) and None not in d["shape"] and d.get("role") in ("trainable", "frozen", "buffer")


def _is_strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# What load() checks each manifest field is, before anything reads it.
_FIELDS = {
    "key": ("a string", lambda v: isinstance(v, str)),
    "versions": ("a dict of version strings", lambda v: isinstance(v, dict)),
    "files": ("a dict of sha256 strings by file name",
              lambda v: isinstance(v, dict) and all(isinstance(h, str) for h in v.values())),
    "inputs": ("a non-empty list of tensor specs", lambda v: isinstance(v, list) and v and all(map(_is_spec, v))),
    "outputs": ("a non-empty list of tensor specs", lambda v: isinstance(v, list) and v and all(map(_is_spec, v))),
    "label": ("a tensor spec", _is_spec),
    "sample_weight": ("null or a tensor spec", lambda v: v is None or _is_spec(v)),
    "parameters": ("a list of parameter specs", lambda v: isinstance(v, list) and all(map(_is_param, v))),
    "loss": ("a loss config dict", lambda v: isinstance(v, dict)),
    "optimizer": ("an optimizer config dict", lambda v: isinstance(v, dict)),
    "prediction": ("an output name", lambda v: isinstance(v, str)),
    "train_outputs": ("a list of output names", _is_strings),
    "weighting": ("null, 'sample' or 'element'", lambda v: v in (None, "sample", "element")),
}


def load(directory) -> Artifacts:
    """Open an artifact directory, refusing other versions and files that do not match the manifest."""
    if not isinstance(directory, (str, os.PathLike)):
        raise OrtrainError(f"directory: expected the path of an artifacts directory, received {directory!r}")
    d = Path(directory)
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise OrtrainError(f"{str(d)!r} is not an ortrain artifacts directory (no manifest.json); "
                           "create one with ot.artifacts.build or `ortrain artifacts`")
    try:
        manifest = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise OrtrainError(f"{str(mpath)!r} is not valid JSON ({exc}); the directory is damaged, rebuild it") \
            from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise OrtrainError(f"{str(mpath)!r} has manifest format {manifest.get('format') if isinstance(manifest, dict) else '?'}"
                           f", this ortrain reads format {FORMAT}; rebuild the artifacts")
    required = ("key", "versions", "inputs", "outputs", "label", "parameters", "loss", "optimizer", "files",
                "prediction", "train_outputs", "weighting", "sample_weight")
    missing = [k for k in required if k not in manifest]
    if missing:
        raise OrtrainError(f"{str(mpath)!r} lacks {', '.join(missing)}; the directory is damaged, rebuild it")
    for field, (expected, fits) in _FIELDS.items():
        if not fits(manifest[field]):
            raise OrtrainError(f"{str(mpath)!r}: {field} expected {expected}, received {manifest[field]!r:.80}; the "
                               "directory is damaged, rebuild it")
    if manifest["prediction"] not in [o["name"] for o in manifest["outputs"]]:
        raise OrtrainError(f"{str(mpath)!r}: prediction expected one of the outputs' names, received "
                           f"{manifest['prediction']!r:.80}; the directory is damaged, rebuild it")
    if manifest["versions"] != versions():
        got = ", ".join(f"{k} {v}" for k, v in sorted(manifest["versions"].items()))
        now = ", ".join(f"{k} {v}" for k, v in sorted(versions().items()))
        raise OrtrainError(f"artifacts in {str(d)!r} were written by {got}; this is {now}. "
                           "Rebuild them (ot.artifacts.build or `ortrain artifacts`)")
    for name in FILES:
        path = d / name
        if not path.is_file():
            raise OrtrainError(f"artifacts in {str(d)!r} lack {name}; rebuild them")
        expected = manifest["files"].get(name)
        if _sha256(path, remember=True) != expected:
            raise OrtrainError(f"{str(path)!r} does not match the sha256 recorded in manifest.json: "
                               "the file was changed or damaged after it was written; rebuild the artifacts")
    return Artifacts(d, manifest)


def optimizer_graph_file(opt: optim.Optimizer, weight_decay: float | None, directory: Path,
                         art: Artifacts | None = None) -> Path:
    """The update graph for ``opt`` with a weight-decay override: ``art``'s own when that is the same
    graph, else one written into ``directory``."""
    if art is not None and weight_decay == getattr(opt, "weight_decay", 0.0):
        built_for = {k: v for k, v in art.manifest["optimizer"].items() if k != "lr"}
        if built_for == json.loads(json.dumps(_opt_config(opt))):
            return art.optimizer_graph
    path = directory / "optimizer.onnx"
    onnx.save(opt.graph(weight_decay), path)
    return path


@contextlib.contextmanager
def scratch_dir():
    """A private temporary directory, removed on exit."""
    d = Path(tempfile.mkdtemp(prefix="ortrain-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
