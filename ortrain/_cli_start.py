"""The command line's first import of ortrain: an environment it cannot run in (an inference-only
onnxruntime, onnx too new) is one line on stderr and exit status 1, as every other failure of the
``ortrain`` command is, not a traceback of the package import."""

from __future__ import annotations

import contextlib
import os
import sys


def _is_the_command() -> bool:
    """Whether this process is the ``ortrain`` command (its script, or ``python -m ortrain``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if os.path.splitext(os.path.basename(sys.argv[0] if sys.argv else ""))[0] == "ortrain":
        return True
    return "-m" in argv[:-1] and argv[argv.index("-m") + 1] in ("ortrain", "ortrain.cli")


@contextlib.contextmanager
def one_line_for_the_command_line():
    from ortrain.errors import OrtrainError
    try:
        yield
    except OrtrainError as exc:
        if not _is_the_command():
            raise
        print(f"ortrain: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(1) from None
