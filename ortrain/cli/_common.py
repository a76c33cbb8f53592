"""What every subcommand shares: exit codes, user errors, data files (one array ``x``), atomic
writes."""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from ortrain._files import atomic_path, not_a_folder, unexpanded_home
from ortrain.errors import OrtrainError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad arguments: reported on one line, exit code 2."""


LOGIT_LOSSES = ("categorical_crossentropy", "sparse_categorical_crossentropy", "binary_crossentropy")


def loss_of(name: str, from_logits) -> dict | str:
    """The loss spec for ``--loss NAME [--from-logits]``; only the cross-entropies take logits."""
    if not from_logits:
        return name
    if name not in LOGIT_LOSSES:
        raise UsageError(f"--from-logits: only the cross-entropy losses ({', '.join(LOGIT_LOSSES)}) read logits, "
                         f"and --loss {name} does not; drop --from-logits")
    return {"name": name, "from_logits": True}


def momentum_of(optimizer: str, momentum) -> dict | str:
    """The optimizer spec for ``--optimizer NAME [--momentum M]``; only SGD keeps a velocity."""
    if momentum is None:
        return optimizer
    if optimizer != "sgd":
        raise UsageError(f"--momentum: only SGD keeps a velocity, and --optimizer {optimizer} does not (Adam's "
                         "betas are its own); give --optimizer sgd, or drop --momentum")
    return {"name": "sgd", "momentum": momentum}


def load_data(paths: list[str], argument: str = "--data",
              inputs_only: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(x, y, sample_weight)`` from one ``.npz`` (arrays ``x``, ``y``, optional ``sample_weight``)
    or from ``.npy`` files: ``x`` alone, or ``x`` and ``y``. ``inputs_only`` (predict): one file,
    as a second ``.npy`` could only be more inputs."""
    if inputs_only and paths and len(paths) > 1:
        given = " ".join(repr(p) for p in paths)
        raise UsageError(f"{argument}: predict reads one file of inputs (FILE.npz, whose x it predicts, or X.npy); "
                         f"received {len(paths)} files ({given}); predict each file in its own run, or join "
                         "them into one with np.concatenate")
    if not paths or len(paths) > 2:
        raise UsageError(f"{argument}: expected FILE.npz or X.npy [Y.npy], received {len(paths or [])} files")
    for p in paths:
        if os.path.isdir(p):
            raise UsageError(f"{argument}: {p!r} is a directory; give the data file (FILE.npz, or X.npy [Y.npy])")
        if not os.path.isfile(p):
            raise UsageError(f"{argument}: no such file {p!r}")
    if len(paths) == 1 and paths[0].endswith(".npz"):
        f = _load(paths[0], argument)
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise UsageError(f"{argument}: {paths[0]!r} holds a single array, not an .npz archive; save x and y "
                             "with np.savez(path, x=x, y=y), or name the file .npy")
        with f:
            unknown = sorted(set(f.files) - set(NPZ_KEYS))
            if "x" not in f or unknown:
                raise UsageError(f"{argument}: {paths[0]!r} has arrays {sorted(f.files)}; expected 'x', 'y' "
                                 "and optionally 'sample_weight', nothing else")
            return tuple(_read(f, key, paths[0], argument) if key in f else None for key in NPZ_KEYS)
    arrays = []
    for p in paths:
        if not p.endswith(".npy"):
            given = " ".join(repr(q) for q in paths)
            raise UsageError(f"{argument}: expected one FILE.npz, or X.npy [Y.npy]; received {given}"
                             + (f" ({p!r} is not an .npy file)" if len(paths) > 1 else ""))
        a = _load(p, argument)
        if not isinstance(a, np.ndarray):
            raise UsageError(f"{argument}: {p!r} is an .npz archive; give it alone, or name it .npz")
        arrays.append(a)
    return arrays[0], (arrays[1] if len(arrays) > 1 else None), None


NPZ_KEYS = ("x", "y", "sample_weight")


def array_names(paths: list[str], argument: str = "--data") -> tuple[str, str, str]:
    """How messages name the arrays ``load_data`` read from ``paths``: ``x of --data 'train.npz'``."""
    files = list(paths) if len(paths) == 2 else [paths[0]] * 3
    return tuple(f"{key} of {argument} {files[min(i, len(files) - 1)]!r}" for i, key in enumerate(NPZ_KEYS))


def _load(path: str, argument: str):
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # not numpy's format, damaged, pickled
        raise UsageError(f"{argument}: cannot read {path!r} as numpy arrays ({_why(exc)}); write the data with "
                         "np.savez or np.save") from None


def _read(f, key: str, path: str, argument: str) -> np.ndarray:
    try:
        return f[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{argument}: cannot read array {key!r} of {path!r} ({_why(exc)}); write the data with "
                         "np.savez") from None


def _why(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "pickle" in text:
        return "not numeric arrays: pickled Python objects or another format"
    return text.split(". ")[0]


def _one_input(specs) -> None:
    """The command line feeds one array ``x``: a model with several inputs trains from Python."""
    if len(specs) > 1:
        raise UsageError(f"the model has {len(specs)} inputs ({', '.join(s.name for s in specs)}) and the command "
                         "line feeds one array x; train or run it from Python (ot.Trainer.from_artifacts, "
                         "Model.fit/predict with a list or dict of arrays)")


def dumps(value) -> str:
    """Standard JSON: numpy values as Python ones, NaN and infinities as null (JSON has no such
    numbers, and strict parsers refuse them)."""
    return json.dumps(_finite(value), indent=2, sort_keys=True, default=_jsonable, allow_nan=False)


def _finite(value):
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, np.ndarray):
        return _finite(value.tolist())
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def write_json(path: Path, value) -> None:
    """Write JSON to a temporary file and rename it, so a reader never sees half a file."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(dumps(value))


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def _jsonable(value):
    if isinstance(value, (np.integer, np.bool_)):  # floats and arrays were made Python by _finite
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def check_out_dir(out: str, what: str, option: str = "--out") -> None:
    """``option`` (``--out``, as given) must be a directory or a path where one can be made: not a
    file, not under one, not a leading ``~`` nothing expanded."""
    why = unexpanded_home(out) or not_a_folder(Path(out))
    if why is not None:
        raise UsageError(f"{option}: {str(out)!r} {why}; {what} needs a directory, choose another path")
    if not _is_utf8(os.path.abspath(out)):  # onnxruntime opens and writes files there by UTF-8 paths alone
        where = "its name" if not _is_utf8(str(out)) else "the path of the folder it lies in"
        raise UsageError(f"{option}: {str(out)!r}: {where} is not valid UTF-8, and onnxruntime opens and writes files "
                         f"by UTF-8 paths only; choose a directory whose path is UTF-8 (or rename it), nothing was "
                         "written")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def read_json(path: Path, what: str, fix: str = ""):
    """The JSON value in ``path``; ``what`` names the file in errors, ``fix`` says what to do about a damaged one."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise OrtrainError(f"{what} {str(path)!r} does not exist") from None
    except ValueError as exc:
        raise OrtrainError(f"{what} {str(path)!r} is damaged: {exc}" + (f"; {fix}" if fix else "")) from exc


def artifacts_dir(path: str, argument: str = "--artifacts") -> None:
    """Refuse an artifacts path that is a file or does not exist, naming ``argument``."""
    if os.path.isfile(path):
        raise UsageError(f"{argument}: {path!r} is a file; give the artifacts directory (the one holding "
                         "manifest.json)")
    if not os.path.isdir(path):
        raise UsageError(f"{argument}: no such directory {path!r}")


def model_file(path: str, argument: str) -> None:
    """Refuse a model path that is a directory or does not exist, naming ``argument``."""
    if os.path.isdir(path):
        raise UsageError(f"{argument}: {path!r} is a directory; give the model file (MODEL.onnx)")
    if not os.path.isfile(path):
        raise UsageError(f"{argument}: no such file {path!r}")
