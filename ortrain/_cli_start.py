"""The command line's first import of ortrain: an environment it cannot run in (an inference-only
onnxruntime, onnx too new) is one line on stderr and exit status 1, as every other failure of the
``ortrain`` command is, not a traceback of the package import."""

from __future__ import annotations

import contextlib
import os
import sys


def _is_the_command() -> bool:
    """Whether this process is the ``ortrain`` command: the interpreter ran the ``ortrain`` script or
    ``-m ortrain``, read from its own options (``pytest -m ortrain`` or ``python train.py -m ortrain``
    are other programs, with an option of their own)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))[1:]
    while argv:
        arg = argv.pop(0)
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            module = arg[2:] or (argv[0] if argv else "")
            return module in ("ortrain", "ortrain.cli")
        if arg in ("-c", "-"):
            return False
        if arg in ("-W", "-X", "--check-hash-based-pycs"):  # options that take a value
            argv = argv[1:]
        elif not arg.startswith("-"):  # the script
            return os.path.splitext(os.path.basename(arg))[0] == "ortrain"
    return False


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
