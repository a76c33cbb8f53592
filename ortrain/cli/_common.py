"""What every subcommand shares: exit codes, user errors, data files, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ortrain._files import atomic_path
from ortrain.errors import OrtrainError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad arguments: reported on one line, exit code 2."""


def load_data(paths: list[str], argument: str = "--data") -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(x, y, sample_weight)`` from one ``.npz`` (arrays ``x``, ``y``, optional ``sample_weight``)
    or from ``.npy`` files: ``x`` alone (for predict), or ``x`` and ``y``."""
    if not paths or len(paths) > 2:
        raise UsageError(f"{argument}: expected FILE.npz or X.npy [Y.npy], received {len(paths or [])} files")
    for p in paths:
        if not os.path.isfile(p):
            raise UsageError(f"{argument}: no such file {p!r}")
    try:
        if len(paths) == 1 and paths[0].endswith(".npz"):
            with np.load(paths[0], allow_pickle=False) as f:
                if "x" not in f:
                    raise UsageError(f"{argument}: {paths[0]!r} has arrays {sorted(f.files)}; expected 'x', 'y' "
                                     "and optionally 'sample_weight'")
                return f["x"], (f["y"] if "y" in f else None), \
                    (f["sample_weight"] if "sample_weight" in f else None)
        arrays = []
        for p in paths:
            if not p.endswith(".npy"):
                raise UsageError(f"{argument}: expected .npz or .npy files, received {p!r}")
            arrays.append(np.load(p, allow_pickle=False))
        return arrays[0], (arrays[1] if len(arrays) > 1 else None), None
    except ValueError as exc:  # pickled object arrays, damaged files
        raise UsageError(f"{argument}: cannot read {', '.join(paths)}: {exc}") from exc


def write_json(path: Path, value) -> None:
    """Write JSON to a temporary file and rename it, so a reader never sees half a file."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(value, indent=2, sort_keys=True, default=_jsonable))


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise OrtrainError(f"{what} {str(path)!r} does not exist") from None
    except ValueError as exc:
        raise OrtrainError(f"{what} {str(path)!r} is damaged: {exc}") from exc
