"""Writing files so that a reader (or a crash) never sees half of one."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from ortrain.errors import OrtrainError


def checked_target(path, what: str = "path") -> Path:
    """``path`` as a ``Path`` for a file about to be written, or a clear error: it must be a
    non-empty path whose folder exists and which is not itself a folder."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise OrtrainError(f"{what}: expected a file path (str or os.PathLike), received {path!r}")
    path = Path(path)
    if path.is_dir():
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: it is a directory; give the path of a file, "
                           f"e.g. {str(path / 'model')!r}")
    if not path.parent.is_dir():
        if path.parent.exists():
            raise OrtrainError(f"{what}: cannot write {str(path)!r}: {str(path.parent)!r} is a file, not a "
                               "directory")
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: the directory {str(path.parent)!r} does not "
                           "exist; create it first")
    return path


def fresh_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory in ``parent`` with the usual permissions (0777 less the
    umask), unlike ``tempfile.mkdtemp``'s private 0700: what is published from it stays readable
    to whoever may read its parent."""
    while True:
        path = Path(parent) / f"{prefix}{secrets.token_hex(6)}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_path(path, what: str = "path"):
    """Yield a fresh temporary path beside ``path``; on success it is renamed onto ``path``, on
    failure removed. Unique per call, so threads and processes writing one file do not collide.
    The file gets the usual permissions (0666 less the umask), as ``open`` would give it."""
    path = checked_target(path, what)
    while True:
        # the same suffix: writers such as onnx.save choose the format by it
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}"
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield str(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
