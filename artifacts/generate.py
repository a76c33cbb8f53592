"""Regenerate the examples' training artifacts with the ``ortrain artifacts`` command line.

    python artifacts/generate.py              # rewrites artifacts/<name>/, records versions.json
    python artifacts/generate.py --out DIR    # writes them under DIR instead

Each model is exported to ONNX and handed to ``ortrain artifacts``; ``MODELS`` lists the
command lines. ``digits-cnn`` needs torch and onnxscript and is left as it is without them.
The output is the same byte for byte on every run with the versions in ``versions.json``
(``tests/test_example_artifacts.py`` regenerates it and compares).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
DIGITS_LOSS = ["--loss", "sparse_categorical_crossentropy", "--from-logits", "--optimizer", "adam", "--lr", "0.003"]


def export_digits_mlp(path: Path) -> None:
    """The network of generator_shards.py and deploy_onnxruntime.py, initialised with seed 0."""
    import ortrain as ot

    model = ot.Sequential([ot.layers.Dense(64, activation="relu"), ot.layers.Dense(10)], input_shape=(64,),
                          seed=0, name="digits_mlp")
    model.export_onnx(path)


def export_digits_cnn(path: Path) -> None:
    """export_then_train.py's PyTorch network, exported as that example does."""
    import onnx

    spec = importlib.util.spec_from_file_location("export_then_train", EXAMPLES / "export_then_train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.export_torch_model(path, seed=0)
    # The exporter records a stack trace per node, with absolute source paths: dropped so the
    # files do not depend on where the repository is checked out.
    model = onnx.load(path)
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(model, path)


# name -> (export function, the modules it needs, arguments of `ortrain artifacts` after MODEL.onnx -o DIR)
MODELS = {
    "digits-mlp": (export_digits_mlp, (), DIGITS_LOSS),
    "digits-cnn": (export_digits_cnn, ("torch", "onnxscript"), DIGITS_LOSS),
}


def versions(name: str) -> dict:
    """The versions of everything that shapes the bytes of ``name``'s files (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    import ortrain as ot
    found = {"ortrain": ot.__version__, "onnxruntime-training": ot.engine.ORT_VERSION}
    for package in ("onnx", "numpy", *MODELS[name][1]):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def missing_modules(name: str) -> list[str]:
    return [m for m in MODELS[name][1] if importlib.util.find_spec(m) is None]


def command(name: str, model_path, out_dir) -> list[str]:
    """The ``ortrain`` arguments that build ``name``."""
    return ["artifacts", str(model_path), "-o", str(out_dir), *MODELS[name][2]]


def generate(out_root: Path, names=None, echo=print) -> dict[str, Path]:
    """Write ``out_root/<name>/`` for ``names`` (default: every model whose modules are installed)."""
    from ortrain.cli import main as ortrain_main

    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in names or [n for n in MODELS if not missing_modules(n)]:
        target = out_root / name
        # An existing directory would be a cache hit that keeps its old graphs: start afresh.
        if target.exists():
            shutil.rmtree(target)
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = Path(tmp) / f"{name}.onnx"
            MODELS[name][0](onnx_path)
            argv = command(name, onnx_path, target)
            echo(f"$ ortrain {' '.join(command(name, f'{name}.onnx', target))}")
            if ortrain_main(argv) != 0:
                raise SystemExit(f"`ortrain {' '.join(argv)}` failed")
        written[name] = target
    record = out_root / "versions.json"
    recorded = json.loads(record.read_text()) if record.exists() else {}
    recorded.update({name: versions(name) for name in written})
    record.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: beside this script)")
    args = parser.parse_args()
    for name in MODELS:
        if missing_modules(name):
            print(f"skipping {name}: needs {', '.join(missing_modules(name))}", file=sys.stderr)
    written = generate(args.out)
    print("wrote " + ", ".join(str(p) for p in written.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
