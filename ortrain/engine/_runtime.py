"""Finding and loading onnxruntime-training, and checking the environment.

This module and the rest of :mod:`ortrain.engine` are the only code in ortrain
that touches onnxruntime-training. ``import onnxruntime.training`` runs a package
``__init__`` that imports torch (through ``training/optim``); the pieces ortrain
needs (``training.api`` and ``training.onnxblock``) do not, so the package is
registered with its ``__path__`` and the submodules are imported without it.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import sys
import types

from ortrain.errors import OrtrainError

REQUIRED_ORT = "1.19.2"
ONNX_MAX_EXCLUSIVE = (1, 18)
_INSTALL = "pip install 'onnxruntime-training-cpu==1.19.2' (or onnxruntime-training==1.19.2 for CUDA 11.8)"
# Puts the training build's files back where another build's uninstall removed the module they share;
# --no-deps leaves onnx and numpy as they are (the training wheel does not pin onnx).
_REINSTALL = "pip install --force-reinstall --no-deps 'onnxruntime-training-cpu==1.19.2'"
_SHADOWS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino")


def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Give the memory of freed sessions back to the system. The runtime's threads allocate from
    glibc's arenas, which keep what is freed: each fit of a model with millions of weights left
    some hundreds of MB more resident than the one before (2.5x PyTorch's peak after three), where
    a trim brings it back to what the next fit needs."""
    if _TRIM is not None:
        _TRIM(0)


def runtime_path(path, what: str = "path") -> str:
    """``path`` as onnxruntime's functions take it: a str they pass on as UTF-8. A name in another
    encoding (whose bytes Python keeps as surrogates) is refused with the fix: the runtime's bindings
    raised a raw ``TypeError`` ("incompatible function arguments") on it."""
    text = os.fsdecode(os.fspath(path))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise OrtrainError(f"{what}: {text!r} holds a folder or file name that is not valid UTF-8, which onnxruntime "
                           "cannot open or write; rename it (or the folder) with a UTF-8 name, or choose another "
                           "path") from None
    return text


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _distribution_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def environment_problems(onnx_version: str | None, ort_version: str | None, has_training: bool,
                         installed: dict[str, str | None]) -> list[str]:
    """What is wrong with this environment, as sentences that say what to do.

    Pure: takes what was found, so tests can feed it any combination.
    """
    problems = []
    if onnx_version is None:
        problems.append("the onnx package is not installed: pip install 'onnx>=1.16,<1.18'")
    elif _version_tuple(onnx_version)[:2] >= ONNX_MAX_EXCLUSIVE:
        problems.append(
            f"onnx {onnx_version} writes ONNX IR version 11 or newer, which onnxruntime-training "
            f"{REQUIRED_ORT} cannot load: pip install 'onnx>=1.16,<1.18'")
    elif _version_tuple(onnx_version)[:2] < (1, 16):
        problems.append(f"onnx {onnx_version} is too old: pip install 'onnx>=1.16,<1.18'")
    shadows = [f"{n} {v}" for n, v in installed.items() if n in _SHADOWS and v]
    if ort_version is None:
        problems.append(f"onnxruntime-training is not installed: {_INSTALL}")
    elif not has_training:
        culprit = ", ".join(shadows) or f"onnxruntime {ort_version}"
        problems.append(
            f"the importable onnxruntime ({culprit}) is an inference-only build without the training API; "
            f"both install the same 'onnxruntime' module, so remove it and put the training build's files "
            f"back (--no-deps leaves onnx and numpy as they are): "
            f"pip uninstall -y {' '.join(n for n in _SHADOWS if installed.get(n)) or 'onnxruntime'} "
            f"&& {_REINSTALL}")
    elif _version_tuple(ort_version)[:2] != _version_tuple(REQUIRED_ORT)[:2]:
        problems.append(f"onnxruntime-training {ort_version} is installed; ortrain is built against "
                        f"{REQUIRED_ORT}: {_INSTALL}")
    elif shadows:
        problems.append(
            f"{', '.join(shadows)} is installed beside onnxruntime-training and shares its module name; "
            f"whichever was installed last wins. pip uninstall -y {' '.join(s.split()[0] for s in shadows)} "
            f"&& {_REINSTALL}")
    return problems


class _SkipORTModule:
    """Import hook active while onnxruntime is first imported.

    ``import onnxruntime`` validates the build by trying ``onnxruntime.training.ortmodule``,
    which imports torch (about a second, and hundreds of MB) whenever torch is installed.
    Refusing that one import makes the check conclude "no ORTModule", which is true for
    ortrain's purposes; nothing else changes.
    """

    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime.training.ortmodule":
            raise ImportError("ortrain does not use ORTModule")
        return None


def _import_onnxruntime():
    if "onnxruntime" in sys.modules:
        return sys.modules["onnxruntime"]
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("onnxruntime is not installed")
    root = list(spec.submodule_search_locations)[0]
    _register_package("onnxruntime.training", os.path.join(root, "training"))
    hook = _SkipORTModule()
    sys.meta_path.insert(0, hook)
    try:
        import onnxruntime
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("onnxruntime.training.ortmodule", None)
    return onnxruntime


def _load():
    try:
        import onnx
        onnx_version = onnx.__version__
    except ImportError:
        onnx_version = None
    try:
        onnxruntime = _import_onnxruntime()
        from onnxruntime.capi import _pybind_state as capi
        ort_version = onnxruntime.__version__
        has_training = hasattr(capi, "Module") and hasattr(capi, "Optimizer")
    except ImportError:
        onnxruntime = capi = None
        ort_version, has_training = None, False
    installed = {n: _distribution_version(n) for n in _SHADOWS}
    problems = environment_problems(onnx_version, ort_version, has_training, installed)
    if problems:
        raise OrtrainError("ortrain cannot start:\n  - " + "\n  - ".join(problems))

    _register_package("onnxruntime.training", os.path.join(os.path.dirname(onnxruntime.__file__), "training"))
    # Only warnings and errors from the C++ side; INFO lines from graph transformers
    # would otherwise flood the terminal while artifacts are generated.
    capi.set_default_logger_severity(3)
    return onnxruntime, capi


def _register_package(name: str, path: str) -> None:
    """Make ``name`` importable as a namespace over ``path`` without running its ``__init__``."""
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [path]
        package.__package__ = name
        sys.modules[name] = package


def _load_checkpoint_schema() -> types.SimpleNamespace:
    """The flatbuffer classes of onnxruntime's checkpoint format.

    They ship in ``onnxruntime/tools/ort_format_model/ort_flatbuffers_py``, but the
    ``onnxruntime.tools`` package imports torch when it is installed, and the generated
    classes import each other as the top-level package ``ort_flatbuffers_py``; register
    that package directly instead of running either ``__init__``.
    """
    root = os.path.join(os.path.dirname(ort.__file__), "tools", "ort_format_model", "ort_flatbuffers_py")
    _register_package("ort_flatbuffers_py", root)
    _register_package("ort_flatbuffers_py.fbs", os.path.join(root, "fbs"))
    names = ("Checkpoint", "FloatProperty", "IntProperty", "ModuleState", "OptimizerGroup",
             "ParameterOptimizerState", "PropertyBag", "StringProperty", "Tensor")
    return types.SimpleNamespace(**{n: importlib.import_module(f"ort_flatbuffers_py.fbs.{n}") for n in names})


ort, C = _load()
ORT_VERSION: str = ort.__version__
training_graph_utils = importlib.import_module("onnxruntime.training.onnxblock._training_graph_utils")
checkpoint_schema = _load_checkpoint_schema()

from onnxruntime.capi.onnxruntime_inference_collection import OrtValue, get_ort_device_type  # noqa: E402

__all__ = ["C", "ORT_VERSION", "checkpoint_schema", "OrtValue", "environment_problems", "get_ort_device_type", "ort",
           "training_graph_utils"]
