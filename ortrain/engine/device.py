"""Devices (``"cpu"``, ``"cuda"``, ``"cuda:N"``) and thread settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ortrain._arrays import positive_int
from ortrain._keywords import names_unknown_arguments_of
from ortrain.engine import denormals
from ortrain.engine._runtime import C, get_ort_device_type
from ortrain.errors import OrtrainError

_CUDA_HELP = ("the CUDA build of onnxruntime-training is needed: pip uninstall -y onnxruntime-training-cpu "
              "&& pip install --force-reinstall --no-deps onnxruntime-training==1.19.2 (the two share one module, "
              "which the uninstall removes: the reinstall puts the CUDA build's files back, also where "
              "ortrain[cuda] installed both; it needs CUDA 11.8 and cuDNN 8 on the machine)")


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @property
    def provider(self) -> str:
        return "CPUExecutionProvider" if self.kind == "cpu" else "CUDAExecutionProvider"

    def ort_device(self):
        return C.OrtDevice(get_ort_device_type(self.kind, self.index), C.OrtDevice.default_memory(), self.index)


def available_providers() -> list[str]:
    return list(C.get_available_providers())


def parse_device(device, providers: list[str] | None = None) -> Device:
    """Validate ``device`` and check that this onnxruntime build can run it.

    >>> parse_device("cpu")
    Device(kind='cpu', index=0)
    """
    if isinstance(device, Device):
        parsed = device
    elif not isinstance(device, str):
        raise OrtrainError(f"device: expected 'cpu', 'cuda' or 'cuda:N', received {device!r} "
                           f"({type(device).__name__})")
    else:
        text = device.strip().lower()
        if text == "cpu":
            parsed = Device("cpu")
        elif text == "cuda":
            parsed = Device("cuda", 0)
        elif text.startswith("cuda:") and text[5:].isascii() and text[5:].isdigit():
            parsed = Device("cuda", int(text[5:]))
        else:
            raise OrtrainError(f"device: expected 'cpu', 'cuda' or 'cuda:N' (N a GPU index), received {device!r}")
    providers = available_providers() if providers is None else providers
    if parsed.kind == "cuda" and "CUDAExecutionProvider" not in providers:
        raise OrtrainError(f"device={str(parsed)!r}: this onnxruntime build has no CUDA execution provider "
                           f"(available: {', '.join(providers)}); {_CUDA_HELP}")
    return parsed


def default_threads() -> int:
    """The number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_threads: int | None = None


MAX_THREADS = 1024  # onnxruntime allocates per thread: 10**9 threads failed with std::bad_alloc


def thread_count(n, argument: str) -> int | None:
    """``n`` intra-op threads (``None``: the default), an int in [1, MAX_THREADS]."""
    n = positive_int(n, argument, allow_none=True)
    if n is not None and n > MAX_THREADS:
        raise OrtrainError(f"{argument}: expected at most {MAX_THREADS} threads, received {n}; this machine has "
                           f"{default_threads()} cores (None uses them all)")
    return n


@names_unknown_arguments_of
def set_num_threads(n: int | None) -> None:
    """Intra-op threads for sessions created from now on; ``None`` means all cores."""
    global _threads
    _threads = thread_count(n, "set_num_threads")


@names_unknown_arguments_of
def get_num_threads() -> int:
    """The intra-op threads sessions created from now on use: :func:`set_num_threads`' setting, or
    the cores this process may run on when it is ``None`` (the default)."""
    return _threads or default_threads()


def session_options(threads: int | None = None):
    """SessionOptions shared by every session ortrain creates (quiet logs, chosen thread count).
    Only fatal messages are logged: a run the runtime fails is raised as an exception that carries
    the runtime's reason, which its error log would only repeat."""
    so = C.SessionOptions()
    if denormals.available():  # create sessions in denormals.kept(): the runtime sets it on the creating thread
        so.add_session_config_entry(*denormals.CONFIG)
    so.log_severity_level = 4
    so.intra_op_num_threads = thread_count(threads, "threads") or get_num_threads()
    so.inter_op_num_threads = 1
    return so
