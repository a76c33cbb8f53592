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

This module holds the ``Artifacts`` record, ``build`` and ``load``; the graphs a
build writes are made in ``ortrain._artifact_graphs``, the manifest's format and
checks are in ``ortrain._manifest``, and the cache folder, the build lock and
scratch directories in ``ortrain._artifact_store``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ortrain import engine, losses, optim
from ortrain._arrays import checked_flag
from ortrain._artifact_graphs import (
    LABEL,
    LOSS_SCALE,
    SAMPLE_WEIGHT,
    _check_trainable,
    _check_weighting,
    _forward_graph,
    _freeze_untrainable,
    _refuse_quantized,
    _weights_digest,
    _write,
)
from ortrain._artifact_graphs import LOSS as LOSS
from ortrain._artifact_graphs import SCALED_LOSS as SCALED_LOSS
from ortrain._artifact_graphs import WEIGHTINGS as WEIGHTINGS
from ortrain._artifact_graphs import loss_model as loss_model
from ortrain._artifact_store import (
    _publish_lock,
    _refuse_working_directory,
    cache_dir,
    helper_stem,
    set_cache_dir,
)
from ortrain._files import atomic_path, atomic_temporaries, fresh_dir, unexpanded_home
from ortrain._files import scratch_dir as scratch_dir
from ortrain._keywords import names_unknown_arguments_of, names_unknown_arguments_of_methods
from ortrain._manifest import FILES, GRAPHS_FORMAT, finish, is_ours, sha256, text_of, versions
from ortrain._manifest import read as read_manifest
from ortrain.engine.session import write_failure
from ortrain.errors import OrtrainError
from ortrain.graph import TensorSpec
from ortrain.graph.forward import ForwardGraph, ParamSpec

__all__ = ["Artifacts", "build", "load", "cache_dir", "set_cache_dir", "LABEL", "SAMPLE_WEIGHT", "LOSS_SCALE"]

# Bumped whenever the code that writes the graphs (ortrain._artifact_graphs) changes what it writes,
# so caches made by an earlier revision of this version of ortrain miss instead of serving stale graphs.
BUILDER_REVISION = 49


@dataclass(frozen=True)
class Artifacts:
    """A validated artifact directory: paths plus the parsed manifest.

    ``directory`` holds the files; ``manifest`` is ``manifest.json`` parsed. The properties
    below read one of them; ``build`` and ``load`` return a record whose files were checked.
    """

    directory: Path
    manifest: dict

    @property
    def training(self) -> Path:
        """The training graph: forward, loss, backward and gradient accumulation."""
        return self.directory / "training.onnx"

    @property
    def eval(self) -> Path:
        """The eval graph: forward and loss, no backward."""
        return self.directory / "eval.onnx"

    @property
    def optimizer_graph(self) -> Path:
        """The optimizer graph: the update of the trainable weights from their gradients."""
        return self.directory / "optimizer.onnx"

    @property
    def forward(self) -> Path:
        """The forward graph alone (predictions; the inference graph is made from it)."""
        return self.directory / "forward.onnx"

    @property
    def checkpoint(self) -> Path:
        """The onnxruntime-training checkpoint holding the weights the artifacts were built with."""
        return self.directory / "checkpoint"

    @property
    def key(self) -> str:
        """The content hash the cache is keyed by (architecture, weight roles, loss, weighting,
        optimizer settings but the learning rate, versions); weights are not part of it."""
        return self.manifest["key"]

    @property
    def inputs(self) -> list[TensorSpec]:
        """The model's inputs: name, dtype and shape (``None`` for the free batch dimension)."""
        return [TensorSpec.from_json(d) for d in self.manifest["inputs"]]

    @property
    def outputs(self) -> list[TensorSpec]:
        """The model's outputs: name, dtype and shape (``None`` for the free batch dimension)."""
        return [TensorSpec.from_json(d) for d in self.manifest["outputs"]]

    @property
    def label(self) -> TensorSpec:
        """The labels input of the training and eval graphs (``y``)."""
        return TensorSpec.from_json(self.manifest["label"])

    @property
    def sample_weight(self) -> TensorSpec | None:
        """The loss-weights input, or None when the artifacts were built without ``weighting``."""
        d = self.manifest["sample_weight"]
        return TensorSpec.from_json(d) if d else None

    @property
    def weighting(self) -> str | None:
        """``"sample"`` (one weight per sample), ``"element"`` (one per output element) or None."""
        return self.manifest["weighting"]

    @property
    def params(self) -> list[ParamSpec]:
        """Every weight in the model's order: name, shape, dtype and role (``"trainable"``,
        ``"frozen"``, or ``"buffer"`` for batch-norm running statistics)."""
        return [ParamSpec.from_json(d) for d in self.manifest["parameters"]]

    @property
    def loss(self) -> losses.Loss:
        """The loss the training and eval graphs compute, as an ``ot.losses`` object."""
        return losses.get(self.manifest["loss"])

    @property
    def optimizer(self) -> optim.Optimizer:
        """The optimizer the optimizer graph runs, as an ``ot.optim`` object (with the learning rate
        of the build that wrote the manifest)."""
        return optim.get(self.manifest["optimizer"])

    def key_parts(self, architecture: str | None = None) -> dict:
        """:func:`key_parts` of the settings these artifacts were built for (``architecture``: their
        :attr:`architecture`, when the caller has it)."""
        return json.loads(json.dumps({
            "architecture": architecture or self.architecture, "loss": loss_text(self.loss),
            "optimizer": {k: v for k, v in self.manifest["optimizer"].items() if k != "lr"},
            "weighting": self.weighting, "versions": self.manifest["versions"],
            "builder": [GRAPHS_FORMAT, BUILDER_REVISION],  # this code's (the one that built them, but for from_artifacts)
            "weights": [[p.name, list(p.shape), np.dtype(p.dtype).name, p.role] for p in self.params]}))

    @property
    def prediction(self) -> str:
        """The name of the output the loss is computed on (the model's first)."""
        return self.manifest["prediction"]

    @property
    def architecture(self) -> str:
        """A digest of the forward graph without the seeds of its random ops: checkpoints of runs
        that differ only in seed (dropout masks) fit the same artifacts."""
        return architecture_digest(onnx.load(self.forward))

    def model(self, checkpoint=None, metrics=None, weighted_metrics=None):
        """A compiled model over these artifacts' forward graph, with the weights of ``checkpoint``
        (a path or parsed checkpoint data; default the artifacts' own checkpoint), ``metrics`` and
        ``weighted_metrics`` (as ``compile`` takes them)."""
        from ortrain.nn.graph_model import GraphModel
        own = checkpoint is None
        if own:
            self._refuse_if_rebuilt()
        data = checkpoint if isinstance(checkpoint, engine.CheckpointData) else \
            engine.read_checkpoint(self.checkpoint if own else checkpoint, verify=True)
        if own:  # rebuilt while the checkpoint was read
            self._refuse_if_rebuilt()
        where = f" {os.fspath(checkpoint)!r}" if isinstance(checkpoint, (str, os.PathLike)) else ""
        trained_with = data.properties.get(CHECKPOINT_LOSS)
        if trained_with is not None and trained_with != loss_text(self.loss):
            raise OrtrainError(f"the checkpoint{where} was trained with the loss {trained_with}, the artifacts in "
                               f"{str(self.directory)!r} compute {loss_text(self.loss)} (rebuilt since?); use the "
                               "artifacts it was trained with")
        architecture = data.properties.get(CHECKPOINT_ARCHITECTURE)
        if architecture is not None:
            same = architecture == self.architecture
        else:  # written before the seed-free digest: the forward graph's file, seeds and all
            same = data.properties.get(CHECKPOINT_FORWARD, self.manifest["files"]["forward.onnx"]) == \
                self.manifest["files"]["forward.onnx"]
        if not same:
            raise OrtrainError(f"the checkpoint{where} was trained with another architecture than the artifacts in "
                               f"{str(self.directory)!r} hold (rebuilt since?); use the artifacts it was trained with")
        weights = {**data.trainable, **data.frozen}
        misfits = [f"{p.name} {tuple(weights[p.name].shape)} for {tuple(p.shape)}" for p in self.params
                   if p.name in weights and tuple(weights[p.name].shape) != tuple(p.shape)]
        if misfits:
            raise OrtrainError(f"the checkpoint{where} holds weights of other shapes than the artifacts in "
                               f"{str(self.directory)!r}: {', '.join(misfits[:4])}; use the artifacts it was "
                               "trained with")
        retyped = [f"{p.name} ({weights[p.name].dtype.name})" for p in self.params
                   if p.name in weights and weights[p.name].dtype != np.dtype(p.dtype)]
        if retyped:  # every weight of ortrain's graphs is float32: a changed type byte (no checksum caught it)
            named = where or ("" if checkpoint is not None else f" {os.fspath(self.checkpoint)!r}")
            raise OrtrainError(f"the checkpoint{named} holds weights of other types than the artifacts' float32: "
                               f"{', '.join(retyped[:4])}; it is damaged: use another checkpoint or a copy of this one")
        missing = sorted({p.name for p in self.params} - set(weights))
        if missing:
            raise OrtrainError(f"the checkpoint lacks weights {missing[:5]} of these artifacts")
        try:
            forward = onnx.load(self.forward)
        except FileNotFoundError:
            raise OrtrainError(f"the artifacts in {str(self.directory)!r} changed while being read (rebuilt by another "
                               "process?); load them again") from None
        model = GraphModel(ForwardGraph(forward, tuple(self.params), weights), name=self.directory.name or "artifacts")
        model.compile(optimizer=self.optimizer, loss=self.loss, metrics=metrics, weighted_metrics=weighted_metrics)
        return model

    def _refuse_if_rebuilt(self) -> None:
        if republished(self):
            raise OrtrainError(f"the artifacts in {str(self.directory)!r} were rebuilt (for another model, loss or "
                               "optimizer, or with other weights) after this record was made; build them again, or "
                               "load the directory (ot.artifacts.load(directory).model()) to take what it holds now")

    def __repr__(self) -> str:
        """A short summary (the whole manifest is ``self.manifest``); never raises."""
        try:
            m = self.manifest

            def specs(key):
                return ", ".join(f"{d['name']} {tuple(d['shape'])}" for d in m[key])

            def config(key):
                settings = ", ".join(f"{k}={v!r}" for k, v in m[key].items() if k != "name")
                return f"{m[key]['name']}({settings})"
            params = m["parameters"]
            trainable = sum(1 for d in params if d["role"] == "trainable")
            body = (f" inputs=[{specs('inputs')}] outputs=[{specs('outputs')}] weights={len(params)} "
                    f"(trainable {trainable}) loss={config('loss')} optimizer={config('optimizer')}"
                    + (f" weighting={m['weighting']!r}" if m.get("weighting") else ""))
        except Exception:  # noqa: BLE001 - a damaged manifest still has a repr
            body = ""
        return f"<Artifacts {os.fspath(self.directory)!r}{body}>"


# Properties Trainer.save_checkpoint records: the loss, and the architecture (forward.onnx's sha256,
# the same whatever the optimizer or loss weighting).
CHECKPOINT_LOSS = "ortrain.loss"
CHECKPOINT_FORWARD = "ortrain.forward"
CHECKPOINT_ARCHITECTURE = "ortrain.architecture"


def architecture_digest(forward: onnx.ModelProto) -> str:
    """sha256 of ``forward`` with the ``seed`` attribute of every node dropped (dropout and the
    random ops draw from it; the arithmetic does not depend on it)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(forward.graph)
    graph.name = ""  # the model's: a renamed model trains the same graphs
    for node in graph.node:
        for attr in [a for a in node.attribute if a.name == "seed"]:
            node.attribute.remove(attr)
    return hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def loss_text(loss: losses.Loss) -> str:
    return json.dumps(loss.config(), sort_keys=True)


def _loss_key(loss: losses.Loss) -> dict:
    """The loss's config, with its class where it is not ortrain's own (a subclass writing another
    graph under the same config, whose artifacts another class's cached ones must not stand for)."""
    cls = type(loss)
    return loss.config() if cls.__module__ == losses.__name__ else \
        {**loss.config(), "class": f"{cls.__module__}.{cls.__qualname__}"}


def _key(fg: ForwardGraph, loss: losses.Loss, opt: optim.Optimizer, weighting: str | None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": GRAPHS_FORMAT, "builder": BUILDER_REVISION, "versions": versions(), "loss": _loss_key(loss),
                         "optimizer": _opt_config(opt), "weighting": weighting},
                        sort_keys=True).encode())
    h.update(fg.digest().encode())
    return h.hexdigest()


def key_parts(fg: ForwardGraph, loss: losses.Loss, opt: optim.Optimizer, weighting: str | None) -> dict:
    """What the key of artifacts for these settings is made of, as JSON values, with the graph's
    digest left without its seeds: a checkpoint records them, so a resume refused for another key
    can say what differs (:func:`key_difference`)."""
    return json.loads(json.dumps({
        "architecture": architecture_digest(fg.proto), "loss": loss_text(loss), "optimizer": _opt_config(opt),
        "weighting": weighting, "versions": versions(), "builder": [GRAPHS_FORMAT, BUILDER_REVISION],
        "weights": [[p.name, list(p.shape), np.dtype(p.dtype).name, p.role] for p in fg.params]}))


_KEY_PARTS = {"architecture": "its layers' training graphs (the layers, or how this version of ortrain writes them)",
              "weights": "its weights or which of them train (freezing)",
              "loss": "the loss", "optimizer": "the optimizer's settings",
              "weighting": "the sample weighting (loss_mask, sample weights)",
              "versions": "the versions of ortrain, onnx and onnxruntime-training",
              "builder": "the revision of ortrain's graph builder that made its training graphs"}


def differing_parts(saved: dict, now: dict) -> list[str]:
    """The parts of two :func:`key_parts` that differ, in words; none where only the seeds of the
    dropout (or other random ops) differ, which the parts leave out."""
    return [words for part, words in _KEY_PARTS.items() if saved.get(part) != now.get(part)]


def what_differs(saved: dict | None, now: dict) -> str:
    """What differs between two :func:`key_parts`, in words that follow "differ in" (``saved``
    None: artifacts or a checkpoint that recorded none)."""
    if saved is None:
        return "the model, loss, weighting, optimizer or ortrain version"
    return ", ".join(differing_parts(saved, now)) or \
        "the seeds of the dropout (or other random ops) alone (ortrain artifacts --seed)"


def key_difference(saved: dict, now: dict) -> str:
    """What differs between the :func:`key_parts` a checkpoint recorded and a model's, in words."""
    differ = differing_parts(saved, now)
    if not differ:
        return ("this model differs from the one that wrote it only in the seeds of its dropout (or other "
                "random ops): build the model with that run's seeds (the same ot.set_seed(...) before building it, "
                "or seed= on the Sequential or the Dropout), or load the model saved then with ot.load_model")
    written = {None: "None", "sample": "1 (one weight per sample)", "element": "n (one weight per output)"}
    hint = (f"; it was written with loss_mask={written.get(saved.get('weighting'), '?')}: to train on with "
            "another, resume with that one and hand the state over, tr = ot.Trainer.from_checkpoint(model, "
            "path, batch_size, loss_mask=<as written>); m = tr.model(); m.train_state = tr.export_state(); "
            "ot.Trainer(m, loss_mask=...)") if differ == [_KEY_PARTS["weighting"]] else ""
    return (f"this model differs from the one that wrote it in {', '.join(differ)}; resume with the model and "
            f"settings that wrote it, or go on from a model.save file of that run: ot.load_model(path) holds its "
            f"weights and optimizer state, and fit continues from them{hint}")


def _opt_config(opt: optim.Optimizer) -> dict:
    # The learning rate is set on the session before every update; it does not shape the graph.
    return {k: v for k, v in opt.config().items() if k != "lr"}


@names_unknown_arguments_of(label="artifacts.build")
def build(model_or_onnx, loss="mse", optimizer="adamw", out_dir=None, *, trainable=None, frozen=None,
          weighting: str | None = None, refresh_checkpoint: bool = True) -> Artifacts:
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
    returns a record that carries it, and the directory's manifest is rewritten to it, so
    ``Trainer.from_artifacts`` of the record or of its directory trains at the rate of this
    build (a ``Trainer`` of a model takes the model's rate in any case).
    ``refresh_checkpoint=False`` accepts a cache hit with other weights (the Trainer copies the
    model's weights into its session anyway).

    Raises :class:`OrtrainError` for a model it cannot train (an unsupported op, no trainable
    weight), an unknown loss or optimizer, or an ``out_dir`` that is no directory path.
    """
    return _build(model_or_onnx, loss, optimizer, out_dir, trainable=trainable, frozen=frozen, weighting=weighting,
                  refresh_checkpoint=refresh_checkpoint)


def _build(model_or_onnx, loss="mse", optimizer="adamw", out_dir=None, *, trainable=None, frozen=None,
           weighting: str | None = None, refresh_checkpoint: bool = True, accept_key=None) -> Artifacts:
    """:func:`build`, calling ``accept_key`` (when given) with the key and a function returning its
    :func:`key_parts` before anything is written; it may refuse the key by raising."""
    _check_weighting(weighting)
    checked_flag(refresh_checkpoint, "refresh_checkpoint")
    if out_dir is not None and (not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir)):
        raise OrtrainError(f"out_dir: expected a directory path (str or os.PathLike) or None for the cache, "
                           f"received {out_dir!r}")
    fg = _forward_graph(model_or_onnx, trainable, frozen)
    _refuse_quantized(fg)
    fg = _freeze_untrainable(fg)
    _check_trainable(fg)
    loss = losses.get(loss)
    opt = optim.get(optimizer)
    key = _key(fg, loss, opt, weighting)
    if accept_key is not None:
        accept_key(key, lambda: key_parts(fg, loss, opt, weighting))
    home = unexpanded_home(out_dir) if out_dir is not None else None
    if home is not None:
        raise OrtrainError(f"out_dir: {str(out_dir)!r} {home}")
    # through symbolic links: publishing renames a new folder into place, which would replace a link
    target = Path(os.path.realpath(out_dir)) if out_dir is not None else cache_dir() / key[:24]

    def digest() -> str:
        return _weights_digest(model_or_onnx, fg)

    owned = out_dir is None  # a cache entry is ortrain's: whatever else it holds is replaced
    variant = target.with_name(f"{target.name}-{digest()[:12]}") if refresh_checkpoint else None
    if owned:  # an exact hit needs no lock, so a read-only cache serves it: the entry, or its weights' own
        for entry in (target, variant):
            try:
                hit = _existing(entry, key, owned) if entry is not None else None
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
    with _publish_lock(variant):
        found = _existing(variant, key, owned=True)
        return _with_lr(found, opt, rewrite=False) if found is not None else \
            _publish(variant, lambda tmp: _with_weights(existing, fg, tmp, digest(), opt))


def _with_lr(art: Artifacts, opt: optim.Optimizer, rewrite: bool) -> Artifacts:
    """A hit whose learning rate differs (it shapes no graph, so it is not in the key): the
    record carries the requested one, and the manifest is rewritten to it (the manifest is the
    one file a published directory may change), so ``Trainer.from_artifacts`` of the directory
    trains at the rate of its latest build. ``rewrite=False`` (a cache hit served without the
    lock): a cache that cannot be written to keeps its rate, and the record still carries it."""
    wanted = json.loads(json.dumps(opt.config()))
    if art.manifest["optimizer"] == wanted:
        return art
    manifest = dict(art.manifest, optimizer=wanted)
    try:
        with atomic_path(art.directory / "manifest.json") as tmp:
            Path(tmp).write_text(text_of(manifest))
    except (OSError, OrtrainError):
        if rewrite:
            raise
    return Artifacts(art.directory, manifest)


def _publish(target: Path, fill) -> Artifacts:
    """Write a complete directory beside ``target`` with ``fill(tmp)``, then rename it into place
    (moving a stale ``target`` aside just before, and removing it after), so a reader sees the
    old directory, the new one, or for the moment between two renames none; an error or an
    interrupt at any point leaves the old one or the new one in place; a kill leaves its folders,
    named as ``_artifact_store.publish_leftovers`` says, which the next build removes."""
    _refuse_working_directory(target)
    stem = helper_stem(target)
    tmp = fresh_dir(target.parent, f".{stem}.tmp-")
    old = None
    try:
        fill(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{stem}.old-", dir=target.parent))
            os.rename(target, old / "stale")
        os.rename(tmp, target)
    except BaseException as exc:
        if old is not None and (old / "stale").exists() and not target.exists():
            os.rename(old / "stale", target)  # put the old directory back
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        failed = write_failure(exc)
        if failed is not None:
            why, advice = failed
            raise OrtrainError(f"artifacts: cannot write {str(target)!r}: {why}; nothing was published (what was "
                               f"there is left as it was). {advice} (out_dir, or ot.artifacts.set_cache_dir for the "
                               "cache)") from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return load(target)


# what a kill while a build rewrote the manifest (a new learning rate) leaves in the directory
_MANIFEST_TEMPORARY = re.compile(atomic_temporaries(re.escape("manifest.json"), ".json"))


def not_artifacts(target: Path) -> str | None:
    """Why the folder ``target`` cannot be written as artifacts (it exists and holds files other than
    artifacts', which are the user's), or None (new, empty, or artifacts)."""
    if not target.is_dir():
        return None
    manifest = target / "manifest.json"
    ours = manifest.is_file() and is_ours(manifest)  # (another tool's manifest.json is the user's file)
    others = sorted(p.name for p in target.iterdir() if (p.name not in (*FILES, "manifest.json") or
                                                         (p.name == "manifest.json" and not ours)) and
                    not _MANIFEST_TEMPORARY.fullmatch(p.name))
    if others or (not ours and any(target.iterdir())):
        return "exists and is not an ortrain artifacts directory" + \
            (f" (it holds {', '.join(others[:4])})" if others else "")
    return None


def _existing(target: Path, key: str, owned: bool = False) -> Artifacts | None:
    """The valid artifacts of ``key`` in ``target``, or None where they must be (re)built. A folder
    holding anything else is the user's and refused, unless ``owned`` (a cache entry)."""
    manifest = target / "manifest.json"
    if not owned:  # only artifacts are replaced: anything else in the folder is the user's
        problem = not_artifacts(target)
        if problem:
            raise OrtrainError(f"out_dir {str(target)!r} {problem}; choose an empty or new directory")
    if not manifest.exists():
        return None
    try:
        art = load(target)
    except OrtrainError:
        return None  # stale or damaged: rebuilt below
    return art if art.key == key else None


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
    manifest = {k: v for k, v in existing.manifest.items() if k not in ("files", "weights_sha256", "manifest_sha256")}
    manifest["optimizer"] = json.loads(json.dumps(opt.config()))
    finish(directory, manifest, fg, weights_sha256)


def republished(art: Artifacts) -> bool:
    """Whether ``art``'s directory holds other files now than its record says: the files are read
    one after another, and a build publishing into the same directory since (or meanwhile) would
    give another model's weights, or mix two builds, without a word."""
    try:
        now = read_manifest(art.directory / "manifest.json")
    except (OrtrainError, OSError):
        return True
    return any(now.get(k) != art.manifest.get(k) for k in ("key", "weights_sha256", "files"))


@names_unknown_arguments_of(label="artifacts.load")
def load(directory) -> Artifacts:
    """Open an artifact directory. Raises :class:`OrtrainError` for a path that is no artifacts
    directory (missing, or without ``manifest.json``), a damaged manifest, artifacts written by
    other versions of ortrain, onnx or onnxruntime, and a missing file or one whose sha256 no longer
    matches the manifest."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):  # '' is no folder, not '.'
        raise OrtrainError(f"directory: expected the path of an artifacts directory, received {directory!r}")
    d = Path(directory)
    try:
        return _load(d)
    except PermissionError as exc:
        raise OrtrainError(f"artifacts in {str(d)!r} cannot be read: {exc.strerror} ({exc.filename}); make them "
                           "readable (chmod -R u+rX) or rebuild them where you can read them") from None
    except OSError as exc:  # a name too long for the file system, a folder that vanished meanwhile
        raise OrtrainError(f"artifacts in {str(d)!r} cannot be read: {exc.strerror or exc}; give the path of an "
                           "artifacts directory") from None


def _load(d: Path) -> Artifacts:
    mpath = d / "manifest.json"
    if not d.exists():
        raise OrtrainError(f"{str(d)!r} does not exist (moved or deleted?): give the path of an artifacts "
                           "directory, or build one with ot.artifacts.build or `ortrain artifacts`")
    if d.name == "manifest.json" and d.is_file():
        raise OrtrainError(f"{str(d)!r} is the manifest of an artifacts directory; give the directory that holds "
                           f"it: {str(d.parent)!r}")
    if not mpath.is_file():
        raise OrtrainError(f"{str(d)!r} is not an ortrain artifacts directory (no manifest.json); "
                           "create one with ot.artifacts.build or `ortrain artifacts`")
    manifest = read_manifest(mpath)
    for name in FILES:
        path = d / name
        if not path.is_file():
            raise OrtrainError(f"artifacts in {str(d)!r} lack {name}; rebuild them")
        expected = manifest["files"].get(name)
        if sha256(path, remember=True) != expected:
            raise OrtrainError(f"{str(path)!r} does not match the sha256 recorded in manifest.json: "
                               "the file was changed or damaged after it was written; rebuild the artifacts")
    return Artifacts(d.absolute(), manifest)  # (a record outlives a change of the working directory)


def own_optimizer_graph(opt: optim.Optimizer, weight_decay: float | None, art: Artifacts) -> Path | None:
    """``art``'s update graph when it is the one ``opt`` with this weight decay needs, else None."""
    if weight_decay == getattr(opt, "weight_decay", 0.0):
        built_for = {k: v for k, v in art.manifest["optimizer"].items() if k != "lr"}
        if built_for == json.loads(json.dumps(_opt_config(opt))):
            return art.optimizer_graph
    return None


def optimizer_graph_file(opt: optim.Optimizer, weight_decay: float | None, directory: Path,
                         art: Artifacts | None = None) -> Path:
    """The update graph for ``opt`` with a weight-decay override: ``art``'s own when that is the same
    graph, else one written into ``directory``."""
    own = own_optimizer_graph(opt, weight_decay, art) if art is not None else None
    if own is not None:
        return own
    path = directory / "optimizer.onnx"
    onnx.save(opt.graph(weight_decay), path)
    return path


names_unknown_arguments_of_methods(Artifacts, "model")
