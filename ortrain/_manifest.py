"""An artifacts directory's ``manifest.json``: its format, the files it lists with their sha256,
its reading (:func:`read`, which checks every field before anything uses one), and the writing
of the checkpoint and manifest that completes a directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx

from ortrain import engine
from ortrain._version import __version__
from ortrain.errors import OrtrainError
from ortrain.graph.forward import ForwardGraph

FORMAT = 2  # 2: the manifest holds its own sha256 (manifest_sha256); format 1, without it, is still read
# The format of the files the key stands for: the graphs and checkpoint, unchanged by format 2 of the
# manifest (in the key and the builder a checkpoint records: checkpoints written before still resume).
GRAPHS_FORMAT = 1
FILES = ("training.onnx", "eval.onnx", "optimizer.onnx", "forward.onnx", "checkpoint")


def versions() -> dict:
    return {"ortrain": __version__, "onnx": onnx.__version__, "onnxruntime": engine.ORT_VERSION}


_verified: dict[tuple, str] = {}


def sha256(path: Path, remember: bool = False) -> str:
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


def finish(directory: Path, manifest: dict, fg: ForwardGraph, weights_sha256: str) -> None:
    """Write the checkpoint of ``fg``'s weights and the manifest with every file's hash."""
    roles = {p.name: p.role for p in fg.params}
    engine.write_initial_checkpoint(directory / "checkpoint",
                                    {n: a for n, a in fg.weights.items() if roles[n] == "trainable"},
                                    {n: a for n, a in fg.weights.items() if roles[n] != "trainable"})
    manifest = dict(manifest, weights_sha256=weights_sha256,
                    files={name: sha256(directory / name) for name in FILES})
    (directory / "manifest.json").write_text(text_of(manifest))


def _own_sha256(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def text_of(manifest: dict) -> str:
    """``manifest.json``'s text: the fields, and the sha256 of them all as ``manifest_sha256``. The
    files' hashes say a graph or the checkpoint changed; this says the manifest did (a bit flipped
    in a weight's name or an input's size, which its fields' checks let through)."""
    return json.dumps(dict(manifest, manifest_sha256=_own_sha256(manifest)), indent=2, sort_keys=True)


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


def is_ours(mpath: Path) -> bool:
    """Whether ``mpath`` is a manifest.json an ortrain wrote (of any format version): a dict with an
    integer format, a key, a table of files and versions. Another tool's manifest.json (a web app's,
    a data catalogue's) is not, and the folder holding it is not an artifacts directory."""
    try:
        with open(mpath, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and type(content.get("format")) is int and \
        isinstance(content.get("key"), str) and isinstance(content.get("files"), dict) and \
        isinstance(content.get("versions"), dict)


# What each manifest field must be, checked before anything reads it.
FIELDS = {
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


def read(mpath: Path) -> dict:
    """The manifest at ``mpath``, refused unless it is this ortrain's format with every field as
    :data:`FIELDS` says, and written by these versions of ortrain, onnx and onnxruntime."""
    try:
        manifest = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise OrtrainError(f"{str(mpath)!r} is not valid JSON ({exc}); the directory is damaged, rebuild it") \
            from exc
    if not isinstance(manifest, dict) or manifest.get("format") not in (1, FORMAT):
        raise OrtrainError(f"{str(mpath)!r} has manifest format {manifest.get('format') if isinstance(manifest, dict) else '?'}"
                           f", this ortrain reads format {FORMAT}; rebuild the artifacts")
    missing = [k for k in FIELDS if k not in manifest]
    if missing:
        raise OrtrainError(f"{str(mpath)!r} lacks {', '.join(missing)}; the directory is damaged, rebuild it")
    for field, (expected, fits) in FIELDS.items():
        if not fits(manifest[field]):
            raise OrtrainError(f"{str(mpath)!r}: {field} expected {expected}, received {manifest[field]!r:.80}; the "
                               "directory is damaged, rebuild it")
    if manifest["prediction"] not in [o["name"] for o in manifest["outputs"]]:
        raise OrtrainError(f"{str(mpath)!r}: prediction expected one of the outputs' names, received "
                           f"{manifest['prediction']!r:.80}; the directory is damaged, rebuild it")
    if manifest["format"] != 1 and manifest.get("manifest_sha256") != _own_sha256(manifest):  # (1: written before it)
        raise OrtrainError(f"{str(mpath)!r} does not match its own sha256 (manifest_sha256): it was changed or damaged "
                           "after it was written; rebuild the artifacts (another learning rate is set by building them again with "
                           "it, or by Trainer.set_lr or `ortrain train --lr`, not by editing the manifest)")
    if manifest["versions"] != versions():
        got = ", ".join(f"{k} {v}" for k, v in sorted(manifest["versions"].items()))
        now = ", ".join(f"{k} {v}" for k, v in sorted(versions().items()))
        raise OrtrainError(f"artifacts in {str(mpath.parent)!r} were written by {got}; this is {now}. "
                           "Rebuild them (ot.artifacts.build or `ortrain artifacts`)")
    return manifest
