"""The ``ortrain`` command line.

Exit codes: 0 success, 1 a run that failed (one line on stderr, no traceback for
errors in the input), 2 bad arguments, 130 interrupted by Ctrl-C or SIGTERM (the run
directory stays consistent; ``--resume`` continues it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import warnings

from ortrain._version import __version__

__all__ = ["main"]

LOSSES = ("mse", "mae", "huber", "categorical_crossentropy", "sparse_categorical_crossentropy",
          "binary_crossentropy")
OPTIMIZERS = ("adam", "adamw", "sgd")
TRAIN_KEYS = {"model": str, "artifacts": str, "data": list, "val_data": list, "val_split": float, "epochs": int,
              "batch_size": int, "lr": float, "loss": str, "from_logits": bool, "optimizer": str, "momentum": float,
              "metrics": list,
              "out": str, "seed": int, "resume": bool, "shuffle": bool, "verbose": int, "trainable": list,
              "frozen": list}


def _number(convert, accepts, expected: str):
    """An argparse type: ``convert`` the text, keep it when ``accepts`` it, else say what was expected."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, received {text!r}")
        return value
    parse.__name__ = expected  # argparse names the type in some messages
    return parse


def _choice(options: tuple):
    """A TOML value check for a name the options take from ``choices``."""
    return _number(str, lambda v: v in options, f"one of {', '.join(options)}")


_positive_int = _number(int, lambda v: v >= 1, "a positive integer")
_seed = _number(int, lambda v: v >= 0, "an integer >= 0")
_learning_rate = _number(float, lambda v: 0 <= v < float("inf"), "a finite number >= 0")
_verbosity = _number(int, lambda v: v in (0, 1, 2), "0, 1 or 2")
_fraction = _number(float, lambda v: 0 < v < 1, "a number in (0, 1)")
_momentum = _number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def _model_source(p: argparse.ArgumentParser, onnx_model: bool = False) -> None:
    p.add_argument("--run", help="a run directory written by `ortrain train`")
    p.add_argument("--artifacts", help="an artifacts directory (ot.artifacts.build / `ortrain artifacts`)")
    p.add_argument("--checkpoint", help="weights from this checkpoint instead of the run's last or the artifacts' own")
    if onnx_model:
        p.add_argument("--model", help="an .onnx model file")


TOML_VALUES = {"epochs": _positive_int, "batch_size": _positive_int, "seed": _seed, "lr": _learning_rate,
               "val_split": _fraction, "verbose": _verbosity,
               "loss": _choice(LOSSES), "optimizer": _choice(OPTIMIZERS), "momentum": _momentum}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortrain", description="Train ONNX models with onnxruntime-training.")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--version", action="version", version=f"ortrain {__version__}",
                        help="print ortrain's version and exit (`ortrain info` adds onnxruntime's and onnx's)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="train on the bundled digits data, export and verify model.onnx")
    p.add_argument("--out", default="ortrain-demo", help="output directory (default: ortrain-demo)")
    p.add_argument("--epochs", type=_positive_int, default=30, help="epochs to train (default: 30)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the weights and shuffling (default: 0)")
    p.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                   help="0 silent, 1 a progress bar on a terminal, 2 one line per epoch (default: 1)")

    sub.add_parser("info", help="versions, execution providers, threads, the artifact cache")

    p = sub.add_parser("artifacts", help="generate training artifacts for an .onnx model, offline")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="artifacts directory to write")
    p.add_argument("--loss", required=True, choices=LOSSES, help="the loss the training graph computes")
    p.add_argument("--from-logits", action="store_true", help="cross-entropy losses take logits")
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS, help="the update graph's (default: adam)")
    p.add_argument("--momentum", type=_momentum, help="with --optimizer sgd: its momentum, as torch.optim.SGD's "
                   "(default: 0)")
    p.add_argument("--lr", type=_learning_rate, help="learning rate stored as the default")
    p.add_argument("--trainable", action="append", metavar="PATTERN",
                   help="only these weights train (a name or glob; repeat the option for several)")
    p.add_argument("--frozen", action="append", metavar="PATTERN",
                   help="these weights do not train (a name or glob; repeat the option for several)")
    p.add_argument("--sample-weights", action="store_true",
                   help="add a loss-weight input: one weight per sample, or per position for a sequence output")
    p.add_argument("--seed", type=_seed, help="seed the model's dropout (an exported model's has none), so runs "
                   "from the artifacts draw reproducible masks and resume bit for bit")

    p = sub.add_parser("train", help="train from artifacts or an .onnx model on .npz/.npy data")
    p.add_argument("config", nargs="?", metavar="CONFIG.toml", help="a TOML file with the same keys as the options")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--artifacts", metavar="DIR", help="train from these artifacts (`ortrain artifacts`)")
    src.add_argument("--model", metavar="MODEL.onnx", help="train this ONNX model (its artifacts are built in the run)")
    p.add_argument("--data", nargs="+", metavar="FILE", help="FILE.npz (x, y[, sample_weight]) or X.npy Y.npy")
    p.add_argument("--epochs", type=_positive_int,
                   help="train until this many epochs are done (no default: required for a new run)")
    p.add_argument("--batch-size", type=_positive_int, dest="batch_size",
                   help="rows per step (no default: required for a new run; fixed by the run on --resume)")
    p.add_argument("--lr", type=_learning_rate, help="learning rate (default: the optimizer's with --model, the "
                   "artifacts' with --artifacts); on --resume it replaces the checkpoint's")
    p.add_argument("--loss", choices=LOSSES, help="with --model (default mse)")
    p.add_argument("--from-logits", action="store_true", default=None, dest="from_logits",
                   help="with --model: the cross-entropy loss takes logits, not probabilities")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="with --model (default adam)")
    p.add_argument("--momentum", type=_momentum, help="with --model and --optimizer sgd: its momentum, as "
                   "torch.optim.SGD's (default: 0)")
    p.add_argument("--metrics", nargs="+", metavar="METRIC",
                   help="metrics logged every epoch, e.g. accuracy mae (default: none)")
    val = p.add_mutually_exclusive_group()
    val.add_argument("--val-data", nargs="+", metavar="FILE", dest="val_data",
                     help="validation data, as --data (default: none)")
    val.add_argument("--val-split", type=_fraction, dest="val_split",
                     help="fraction of the --data rows held out for validation, the last ones, as Keras' "
                          "validation_split (default: 0)")
    p.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/run)")
    p.add_argument("--resume", action="store_true", default=None, help="continue the run in --out")
    p.add_argument("--seed", type=_seed, help="seed of the shuffling and the dropout masks (default: one drawn at "
                   "random and kept in the run's run.json); fixed by the run on --resume")
    p.add_argument("--no-shuffle", action="store_false", dest="shuffle", default=None,
                   help="train on the rows in file order (default: shuffled every epoch)")
    p.add_argument("--verbose", type=int, choices=(0, 1, 2),
                   help="0 silent, 1 a progress bar on a terminal, 2 one line per epoch (default: 1)")
    p.add_argument("--trainable", action="append", metavar="PATTERN",
                   help="with --model: only these weights train (a name or glob; repeat the option for several)")
    p.add_argument("--frozen", action="append", metavar="PATTERN",
                   help="with --model: these weights do not train (a name or glob; repeat the option for several)")

    p = sub.add_parser("eval", help="loss and metrics of a trained model on labelled data")
    _model_source(p)
    p.add_argument("--data", nargs="+", required=True, metavar="FILE",
                   help="FILE.npz (x, y[, sample_weight]) or X.npy Y.npy")
    p.add_argument("--batch-size", type=_positive_int, dest="batch_size",
                   help="rows per run (default: all rows at once)")
    p.add_argument("--metrics", nargs="+", metavar="METRIC", help="metrics to report besides the loss, e.g. accuracy")

    p = sub.add_parser("predict", help="write predictions to .npy")
    _model_source(p, onnx_model=True)
    p.add_argument("--data", nargs="+", required=True, metavar="FILE",
                   help="one file: FILE.npz (its x) or X.npy")
    p.add_argument("-o", "--output", default="predictions.npy", metavar="OUT.npy",
                   help="where predictions go (default: predictions.npy, replaced if it exists); a model with several "
                        "outputs writes OUT_0.npy, OUT_1.npy, ...")
    p.add_argument("--batch-size", type=_positive_int, dest="batch_size",
                   help="rows per run (default: all rows at once)")

    p = sub.add_parser("export", help="write an inference ONNX model from a run or a checkpoint")
    _model_source(p)
    p.add_argument("-o", "--output", required=True, metavar="MODEL.onnx",
                   help="the .onnx file to write (replaces a file of that name; refused inside an artifacts "
                        "directory or over a file the run reads)")
    for p in sub.choices.values():  # --json before or after the subcommand
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print results as JSON")
    return parser


# Options of which a run takes one: given on the command line, one replaces the other from a config.
_ONE_OF = (("val_data", "val_split"), ("model", "artifacts"))
# What a run from --model sets and artifacts fix (a config's, dropped with its model by --artifacts).
_WITH_THE_MODEL = ("loss", "optimizer", "momentum", "from_logits", "trainable", "frozen")


def _train_config(opts) -> dict:
    from ortrain.cli._common import UsageError, loss_of, momentum_of
    cfg: dict = {}
    if opts.config:
        cfg.update(_read_toml(opts.config))
    given = {key: getattr(opts, key) for key in TRAIN_KEYS if getattr(opts, key, None) is not None}
    for key, value in given.items():  # the command line's options replace the file's
        cfg[key] = value
        for pair in _ONE_OF:  # and a choice the file made the other way
            if key in pair:
                other = pair[1 - pair.index(key)]
                if other not in given:
                    cfg.pop(other, None)
    if "artifacts" in given and "model" not in given:  # the file's model goes, and what goes with it
        for key in _WITH_THE_MODEL:
            if key not in given:
                cfg.pop(key, None)
    cfg["_from_config"] = sorted(set(cfg) - set(given))  # for messages: what the file, not an option, set
    cfg.setdefault("out", "runs/run")
    if not cfg.get("resume"):
        if bool(cfg.get("model")) == bool(cfg.get("artifacts")):
            raise UsageError("give --artifacts DIR or --model MODEL.onnx (exactly one)")
        for key in ("data", "epochs", "batch_size"):
            if cfg.get(key) is None:
                raise UsageError(f"--{key.replace('_', '-')} is required")
        fixed = [f"--{k.replace('_', '-')}" for k in _WITH_THE_MODEL if cfg.get(k)]
        if cfg.get("artifacts") and fixed:
            raise UsageError(f"{', '.join(fixed)}: the loss, the optimizer and which weights train are fixed "
                             "by the artifacts; drop them, or train from --model")
        if cfg.get("model"):  # artifacts carry their own loss and optimizer
            cfg.setdefault("loss", "mse")
            cfg.setdefault("optimizer", "adam")
            loss_of(cfg["loss"], cfg.get("from_logits"))  # refused now, before the run starts
            momentum_of(cfg["optimizer"], cfg.get("momentum"))
    if cfg.get("val_data") and cfg.get("val_split"):
        raise UsageError("CONFIG: give val_data or val_split, not both")
    return cfg


# What the one positional argument of ``train`` (a TOML config) is most often mistaken for.
_MISPLACED = {".onnx": ("an ONNX model", "--model"), ".npz": ("a data file", "--data"),
              ".npy": ("a data file", "--data")}


def _refuse_misplaced(path: str) -> None:
    """A model, a data file, an artifacts or a run directory given where the config file goes."""
    from pathlib import Path

    from ortrain.cli._common import UsageError
    what, option = _MISPLACED.get(Path(path).suffix.lower(), (None, None))
    if what is None and (Path(path) / "manifest.json").is_file():
        what, option = "an artifacts directory", "--artifacts"
    if what is None and (Path(path) / "run.json").is_file():
        what, option = "a run directory", "--resume --out"
    if what is not None:
        raise UsageError(f"CONFIG: {path!r} is {what}; the positional argument is a TOML config file: give it "
                         f"as {option} {path}")


_PATH_KEYS = ("model", "artifacts", "out", "data", "val_data")


def _read_toml(path: str) -> dict:
    from pathlib import Path

    from ortrain._files import unexpanded_home
    from ortrain.cli._common import UsageError
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    _refuse_misplaced(path)
    try:
        # utf-8-sig: a byte-order mark (what Windows editors save "UTF-8" with) is not part of the text
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise UsageError(f"CONFIG: no such file {path!r}") from None
    except IsADirectoryError:
        raise UsageError(f"CONFIG: {path!r} is a directory; give the path of a .toml file") from None
    except UnicodeDecodeError:
        raise UsageError(f"CONFIG: {path!r} is not UTF-8 text, as TOML files are; save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"CONFIG: cannot read {path!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"CONFIG: {path!r} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - set(TRAIN_KEYS))
    if unknown:
        raise UsageError(f"CONFIG: unknown keys {unknown}; known keys are {sorted(TRAIN_KEYS)}")
    base = Path(path).resolve().parent
    cfg = {}
    for key, value in raw.items():
        kind = TRAIN_KEYS[key]
        if kind is list and isinstance(value, str):
            value = [value]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            expected = "a string or a list of strings" if kind is list else kind.__name__
            raise UsageError(f"CONFIG: key {key!r} expects {expected}, received {value!r}")
        if kind is list and not all(isinstance(v, str) for v in value):
            raise UsageError(f"CONFIG: key {key!r} expects a string or a list of strings, received {value!r}")
        if key in TOML_VALUES:  # the same ranges as the options
            try:
                TOML_VALUES[key](str(value))
            except argparse.ArgumentTypeError as exc:
                expected = str(exc).split(", received")[0]
                raise UsageError(f"CONFIG: key {key!r} {expected}, received {value!r}") from None
        if key in _PATH_KEYS and _empty_path(value):
            hint = ("a folder name ('.' for the config file's folder)" if key in ("artifacts", "out") else
                    "a file name")
            raise UsageError(f"CONFIG: key {key!r} expects a path, received an empty string; give {hint}")
        if key in ("model", "artifacts", "out", "data", "val_data"):
            for v in [value] if isinstance(value, str) else value:
                if unexpanded_home(v, base) is not None:
                    raise UsageError(f"CONFIG: key {key!r} holds {v!r}, whose leading {Path(v).parts[0]!r} is no home "
                                     "folder here (a config's paths are taken from its folder, and nothing expands ~); "
                                     "write the whole path")
        if key in ("model", "artifacts", "out"):
            value = str(base / value)
        elif key in ("data", "val_data"):
            value = [str(base / v) for v in value]
        cfg[key] = value
    return cfg


def _info(opts) -> dict:
    import os
    import platform

    import numpy
    import onnx

    import ortrain as ot
    root = ot.artifacts.cache_dir()
    entries, size = 0, 0
    if root.is_dir():
        for entry in root.iterdir():
            if entry.is_dir() and not entry.name.startswith("."):
                entries += 1
        for dirpath, _, files in os.walk(root):
            size += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return {"ortrain": ot.__version__, "onnxruntime-training": ot.engine.ORT_VERSION, "onnx": onnx.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(),
            "execution_providers": ot.engine.available_providers(), "threads": ot.get_num_threads(),
            "cache": str(root), "cache_entries": entries, "cache_bytes": size}


# The options that name a file or a folder, by argparse dest, as messages name them.
_PATH_FLAGS = {"config": "CONFIG", "model": "--model", "artifacts": "--artifacts", "data": "--data",
               "val_data": "--val-data", "out": "--out", "output": "-o", "run": "--run", "checkpoint": "--checkpoint"}


def _empty_path(value) -> bool:
    """An empty path names the current folder by accident (``--out ""`` trained into it)."""
    return value == "" or (isinstance(value, list) and "" in value)


def _refuse_empty_paths(opts) -> None:
    from ortrain.cli._common import UsageError
    for dest, flag in _PATH_FLAGS.items():
        if _empty_path(getattr(opts, dest, None)):
            flag = "MODEL" if (opts.command, dest) == ("artifacts", "model") else flag
            folder = dest in ("artifacts", "out", "run") or (opts.command, dest) == ("artifacts", "output")
            example = {"predict": "predictions.npy", "export": "model.onnx"}.get(opts.command, "")
            hint = ("give a folder name ('.' for the current folder)" if folder else
                    f"give a file name{f' (e.g. {example!r})' if dest == 'output' and example else ''}")
            raise UsageError(f"{flag}: expected a path, received an empty string; {hint}")


def _dispatch(opts) -> dict:
    from ortrain.cli import model_commands, runs
    _refuse_empty_paths(opts)
    if opts.command == "demo":
        from ortrain.cli import demo
        return demo.run(opts.out, epochs=opts.epochs, seed=opts.seed, verbose=opts.verbose,
                        echo=(lambda *a: None) if opts.json else print)
    if opts.command == "info":
        return _info(opts)
    if opts.command == "artifacts":
        return model_commands.artifacts(opts)
    if opts.command == "train":
        cfg = _train_config(opts)
        opts.run_dir = cfg["out"]  # for the message if the run is interrupted
        return runs.train(cfg)
    if opts.command == "eval":
        return model_commands.evaluate(opts)
    if opts.command == "predict":
        return model_commands.predict(opts)
    return model_commands.export(opts)


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        from ortrain.cli._common import dumps
        print(dumps(result))
        return
    for key, value in result.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        print(f"{key}: {value}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _kept(opts) -> str:
    """What an interrupted command leaves: for a training run with completed epochs, how to go on."""
    if opts.command != "train":
        return ""
    from pathlib import Path
    out = Path(opts.run_dir) if getattr(opts, "run_dir", None) else None
    if out is None or not (out / "run.json").is_file():
        return "; no run was kept"
    return f"; the run in {str(out)!r} keeps its completed epochs, continue it with --resume"


# each command's output option: (argparse dest, the flag messages name)
_OUTPUTS = {"demo": ("out", "--out"), "train": ("run_dir", "--out"), "artifacts": ("output", "-o"),
            "predict": ("output", "-o"), "export": ("output", "-o")}


def _os_error(opts, exc: OSError) -> str:
    """An operating-system error as one line that names the file, and the option when the file is
    the command's output (or lies under it)."""
    import os
    name = exc.filename
    if name is None:
        return str(exc)
    why = exc.strerror or str(exc)
    dest, flag = _OUTPUTS.get(opts.command, (None, None))
    given = getattr(opts, dest, None) if dest else None
    if given is not None:
        given, path = os.path.abspath(given), os.path.abspath(os.fspath(name))
        stem = os.path.splitext(given)[0]  # predict's OUT_0.npy, OUT_1.npy, ...
        if path == given or path.startswith(given + os.sep) or path.startswith(stem + "_"):
            return f"{flag}: cannot write {os.fspath(name)!r}: {why}; choose a path you can write to"
    return f"cannot use {os.fspath(name)!r}: {why}"


# The Python API's names in messages, as the command line's options say them.
_AS_OPTIONS = (
    (re.compile(r"^from_onnx: "), "--model: "),
    (re.compile(r"^out_dir '"), "-o '"),
    (re.compile(r"^out_dir: "), "-o: "),
    (re.compile(r"^(trainable|frozen|metrics): "), r"--\1: "),
    (re.compile(r"^trainable= and frozen= both list "), "--trainable and --frozen both list "),
    (re.compile(r"^export_onnx\(path\): "), "-o: "),
    (re.compile(r"^batch_size: (.*)received batch_size=(\d+); leave batch_size out \(it takes (\d+)\)"),
     r"--batch-size: \1received --batch-size \2; give --batch-size \3"),
    (re.compile(r"^batch_size=(\d+): (.*); use batch_size=(\d+)"), r"--batch-size \1: \2; use --batch-size \3"),
    (re.compile(r"\(model\.unfreeze\(\.\.\.\), or layer\.trainable = True for layers set trainable=False\)"),
     "(--trainable, --frozen)"),
    (re.compile(r"(create|build) one with ot\.artifacts\.build or `ortrain artifacts`"),
     r"\1 one with `ortrain artifacts`"),
)


# The Python API's "choose another folder" for artifacts, which the command line's options choose
_CACHE_ADVICE = re.compile(r" \(out_dir, or ot\.artifacts\.set_cache_dir for the cache\)$")

# A run's own files cannot go elsewhere: what stopped one (its model, a checkpoint, its state or log)
# is made room for, then the same command writes it (with --resume once the run has started).
_IN_A_RUN = (
    (re.compile(r"^(?:[\w.()]+: )?(cannot write (['\"]).*?\2: [^;]*); a file already there is left as it was\. (.*?)"
                r"(?: or choose another folder)?$"),
     r"--out: \1. \3, then run the same command again (with --resume once the run's folder holds run.json)"),
    (re.compile(r"^(?:[\w.()]+: )?(cannot write (['\"]).*?\2: [^;]*); choose a folder you can write to$"),
     r"--out: \1. Make the run's folder writable, then run the same command again (with --resume once the "
     r"run's folder holds run.json)"),
    (re.compile(r"Choose a folder you can write to, then"), "Make the run's folder writable, then"),
    (_CACHE_ADVICE, " (--out)"),
)


def _for_command_line(text: str, command: str | None = None) -> str:
    if command == "artifacts":  # the model is its positional MODEL.onnx, not --model; its folder is -o
        text = _CACHE_ADVICE.sub(" (-o)", re.sub(r"^from_onnx: ", "MODEL: ", text))
    if command == "train":
        for pattern, replacement in _IN_A_RUN:
            text = pattern.sub(replacement, text)
    for pattern, replacement in _AS_OPTIONS:
        text = pattern.sub(replacement, text)
    return text


def _several_patterns_after_one_flag(argv: list[str]) -> str | None:
    """The usage error for ``--frozen A B`` (``--trainable`` too): each flag takes one pattern, and
    argparse would take ``B`` for the positional argument (a config file that does not exist, or an
    unrecognised argument). A word after the pattern that names a file, or ends in ``.onnx`` or
    ``.toml``, is the positional argument."""
    for k, arg in enumerate(argv[:-2]):
        if arg in ("--frozen", "--trainable"):
            following = argv[k + 2]
            if not following.startswith("-") and not following.lower().endswith((".onnx", ".toml")) \
                    and not os.path.exists(following):
                return (f"{arg} takes one pattern; repeat the option for each: {arg} {argv[k + 1]!r} "
                        f"{arg} {following!r}")
    return None


def main(argv=None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args if not a.startswith("-")), None)  # the subcommand (only --json goes before)
    several = _several_patterns_after_one_flag(args) if command in ("artifacts", "train") else None
    if several is not None:
        print(f"ortrain {command}: error: {several}", file=sys.stderr)
        return 2
    try:
        opts = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the reason
        return int(exc.code or 0)
    if opts.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        from ortrain.cli._common import UsageError
        from ortrain.errors import OrtrainError
    except Exception as exc:  # the environment check failed while importing ortrain
        print(f"ortrain: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    # A scheduler's stop (SIGTERM) is an interrupt too, unless the host ignores it or handles it in C.
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    handle_term = previous not in (None, signal.SIG_IGN)
    if handle_term:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        # With --json, stdout carries the result alone: progress goes to stderr. Warnings are one
        # line each, as errors are.
        with contextlib.redirect_stdout(sys.stderr) if opts.json else contextlib.nullcontext(), \
                warnings.catch_warnings():
            warnings.showwarning = lambda message, category, *_: print(
                f"ortrain {opts.command}: warning: {' '.join(str(message).split())}", file=sys.stderr)
            result = _dispatch(opts)
    except UsageError as exc:
        print(f"ortrain {opts.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ortrain {opts.command}: interrupted{_kept(opts)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # progress written to a pipe whose reader has gone (``| head -3``)
        _quiet_stdout()
        print(f"ortrain {opts.command}: stopped: the reader of its output closed the pipe (send the output to "
              f"a file, or pass --json for the result alone){_kept(opts)}", file=sys.stderr)
        return 1
    except (OrtrainError, OSError) as exc:
        said = _os_error(opts, exc) if isinstance(exc, OSError) else _for_command_line(str(exc), opts.command)
        print(f"ortrain {opts.command}: {' '.join(said.split())}", file=sys.stderr)
        return 1
    finally:
        if handle_term:
            signal.signal(signal.SIGTERM, previous)
    if opts.command == "demo" and not opts.json:
        return 0
    try:
        _print(result, opts.json)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader took what it wanted (``| head -1``): the command did its work
        _quiet_stdout()
    return 0


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush at exit does not
    fail again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
