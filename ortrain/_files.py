"""Writing files so that a reader (or a crash) never sees half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ortrain.errors import OrtrainError


@contextlib.contextmanager
def atomic_path(path):
    """Yield a fresh temporary path beside ``path``; on success it is renamed onto ``path``, on
    failure removed. Unique per call, so threads and processes writing one file do not collide."""
    path = Path(path)
    if not path.parent.is_dir():
        raise OrtrainError(f"cannot write {str(path)!r}: the directory {str(path.parent)!r} does not exist; "
                           "create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
