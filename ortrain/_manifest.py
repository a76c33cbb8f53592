"""An artifacts directory's ``manifest.json``: its format, the files it lists with their sha256,
the check ``load`` makes of each field before anything reads it, and the writing of the
checkpoint and manifest that completes a directory.
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
from ortrain.graph.forward import ForwardGraph

FORMAT = 1
FILES = ("training.onnx", "eval.onnx", "optimizer.onnx", "forward.onnx", "checkpoint")


def versions() -> dict:
    return {"ortrain": __version__, "onnx": onnx.__version__, "onnxruntime": engine.ORT_VERSION}


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
