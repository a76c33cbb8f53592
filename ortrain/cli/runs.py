"""Training runs on disk: ``ortrain train`` and what reads its run directory.

A run directory holds::

    run.json            the run's settings (written once, when it starts)
    state.json          the commit point: epochs done, the checkpoint to resume from, the history
    artifacts/          training artifacts, when the run started from --model
    checkpoints/        epoch-NNNN.ckpt (the two newest are kept)
    log.csv, history.json, model.onnx (at the end), loss.png (with matplotlib)

After every epoch the checkpoint is written first and ``state.json`` last, each by
rename, so a run stopped at any moment once ``run.json`` exists (Ctrl-C, SIGTERM, a kill)
leaves a directory that ``--resume`` continues from the last completed epoch, bit for bit
except for dropout masks.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path

import numpy as np

import ortrain as ot
from ortrain import fit as fit_mod
from ortrain._files import CAN_LOCK, checked_target, lock_file
from ortrain.callbacks.base import Callback
from ortrain.cli._common import (
    UsageError,
    check_out_dir,
    load_data,
    loss_of,
    read_json,
    write_json,
    write_text,
)
from ortrain.data import split_arrays
from ortrain.errors import OrtrainError

KEEP_CHECKPOINTS = 2


class RunRecorder(Callback):
    """Writes checkpoint, log and history after every epoch, then commits ``state.json``."""

    def __init__(self, out: Path, history: dict[str, list], epochs_done: list[int], stale: tuple[str, ...] = ()):
        self.out = out
        self.history = {k: list(v) for k, v in history.items()}
        self.epochs = list(epochs_done)
        self.stale = stale  # files of an earlier end, out of date once an epoch commits

    def on_epoch_end(self, epoch, logs=None):
        ckdir = self.out / "checkpoints"
        ckdir.mkdir(exist_ok=True)
        ck = ckdir / f"epoch-{epoch + 1:04d}.ckpt"
        self.trainer.save_checkpoint(ck)
        self.epochs.append(epoch)
        logs = logs or {}
        for key in set(self.history) | set(logs):
            column = self.history.setdefault(key, [None] * (len(self.epochs) - 1))
            column.append(logs.get(key))
        write_text(self.out / "log.csv", self._csv())
        write_json(self.out / "history.json", {"epoch": self.epochs, "history": self.history})
        for name in self.stale:  # a run stopped before its new end must not look final
            (self.out / name).unlink(missing_ok=True)
        self.stale = ()
        write_json(self.out / "state.json", {"epoch": epoch + 1, "checkpoint": f"checkpoints/{ck.name}",
                                             "epochs": self.epochs, "history": self.history})
        ours = [p for p in ckdir.glob("epoch-*.ckpt") if _CHECKPOINT.fullmatch(p.name)]
        for old in sorted(ours, key=_epoch_of)[:-KEEP_CHECKPOINTS]:
            old.unlink()

    def _csv(self) -> str:
        keys = sorted(self.history)
        buf = io.StringIO()
        buf.write(",".join(["epoch", *keys]) + "\n")
        for i, e in enumerate(self.epochs):
            cells = [str(e)] + ["" if self.history[k][i] is None else repr(float(self.history[k][i])) for k in keys]
            buf.write(",".join(cells) + "\n")
        return buf.getvalue()


_CHECKPOINT = re.compile(r"epoch-(\d{4,})\.ckpt")


def _epoch_of(checkpoint: Path) -> int:
    """The epoch in a checkpoint's name (``epoch-0012.ckpt``: names sort wrongly past 9999)."""
    return int(_CHECKPOINT.fullmatch(checkpoint.name).group(1))


def _split(x, y, w, fraction: float):
    """``--val-split``: the rows ``Model.fit(validation_split=...)`` would hold out (the same function)."""
    try:
        ([x], y, w), ([vx], vy, vw) = split_arrays(([x], y, w), fraction)
    except OrtrainError as exc:
        raise UsageError(f"--val-split: {exc}") from None
    return x, y, w, ((vx, vy) if vw is None else (vx, vy, vw))


def _build_artifacts(cfg: dict, out: Path) -> Path:
    model = ot.from_onnx(cfg["model"], trainable=cfg.get("trainable"), frozen=cfg.get("frozen"))
    loss = ot.losses.get(loss_of(cfg["loss"], cfg.get("from_logits")))
    opt = ot.optim.get(cfg["optimizer"])
    if cfg.get("lr") is not None:
        opt.lr = cfg["lr"]
    weighting = "sample" if cfg.get("has_sample_weight") else None
    target = out / "artifacts"
    ot.artifacts.build(model, loss=loss, optimizer=opt, out_dir=target, weighting=weighting)
    return target


# What decides which rows make each batch and in which order: a resumed run must keep them to
# continue bit for bit, so they cannot be changed on --resume.
FIXED_BY_RUN = {"batch_size": "--batch-size", "seed": "--seed"}


# What the run trains: its model or artifacts, loss, optimizer and trained weights. A resume
# continues that training, so another value is refused (it was silently ignored).
TRAINED_BY_RUN = ("model", "artifacts", "loss", "optimizer", "from_logits", "trainable", "frozen")


def resume_settings(cfg: dict) -> dict:
    """A resumed run keeps the settings it started with; options given now override the data, the
    epochs, the learning rate, the metrics and the output, while the batch size and the seed, and
    what the run trains (``TRAINED_BY_RUN``), are fixed by the run: another value is refused."""
    out = Path(cfg["out"])
    if not (out / "run.json").is_file():
        raise UsageError(f"train --resume: {str(out)!r} holds no run to resume; drop --resume to start one there")
    run = read_json(out / "run.json", "run settings")
    for key, flag in FIXED_BY_RUN.items():
        if cfg.get(key) is not None and cfg[key] != run[key]:
            raise UsageError(f"train --resume: {flag} {cfg[key]} differs from the run's {run[key]}; the batch size "
                             f"and seed are fixed by the run (they decide every batch of a bit-exact resume). Drop "
                             f"{flag}, or start a new run in another --out directory")
    started = run["settings"]
    for key in TRAINED_BY_RUN:
        given = cfg.get(key)
        if given is None or given is False or given == []:
            continue
        if key in PATH_KEYS:
            given = os.path.abspath(given)
        if given != started.get(key):
            flag = f"--{key.replace('_', '-')}"
            had = f"the run's {started[key]!r}" if key in started else "the run, which started without it"
            raise UsageError(f"train --resume: {flag} {cfg[key]!r} differs from {had}; what a run trains (its model "
                             f"or artifacts, loss, optimizer and trained weights) is fixed when it starts. Drop "
                             f"{flag}, or start a new run in another --out directory")
    merged = {**started, **cfg}
    for key in ("data", "epochs"):
        if merged.get(key) is None:
            raise UsageError(f"train --resume: --{key} is required")
    return merged


PATH_KEYS = ("model", "artifacts", "data", "val_data")


def _absolute(cfg: dict) -> dict:
    """The settings with every file path absolute, as ``run.json`` keeps them: a resume, an eval
    or an export reads the same files from any working directory."""
    out = dict(cfg)
    for key in PATH_KEYS:
        if out.get(key):
            out[key] = [os.path.abspath(p) for p in out[key]] if isinstance(out[key], list) else \
                os.path.abspath(out[key])
    return out


def sweep_temporaries(out: Path) -> list[str]:
    """Remove what a killed process left half-written in a run directory: the temporary files of
    its atomic writes (``.state.json.<12 hex>.tmp.json`` and the like) and the temporary folders
    of its artifacts build. Nothing else matches these names."""
    removed = []
    for folder, pattern in ((out, _TEMP_IN_RUN), (out / "checkpoints", _TEMP_IN_CHECKPOINTS)):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if not pattern.match(p.name) or p.is_symlink():
                continue
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


# _files.atomic_path names a temporary ".<name>.<12 hex>.tmp<suffix>"; artifacts._publish uses
# ".artifacts.tmp-<12 hex>" and ".artifacts.old-<8 chars>" folders.
_TEMP_IN_RUN = re.compile(r"^\.((state|run|history)\.json\.[0-9a-f]{12}\.tmp\.json|log\.csv\.[0-9a-f]{12}\.tmp\.csv"
                          r"|model\.onnx\.[0-9a-f]{12}\.tmp\.onnx|artifacts\.tmp-[0-9a-f]{12}|artifacts\.old-\w{8})$")
_TEMP_IN_CHECKPOINTS = re.compile(r"^\.epoch-\d{4,}\.ckpt\.[0-9a-f]{12}\.tmp\.ckpt$")


@contextlib.contextmanager
def _run_lock(out: Path):
    """One process at a time trains a run: a second one is refused at once, before it touches
    anything (it would remove the first one's files in flight)."""
    if not CAN_LOCK:  # not on POSIX: no guard
        yield
        return
    lock = out / ".lock"
    handle = lock_file(lock, wait=False)
    if handle is None:
        raise UsageError(f"--out: another ortrain process is training the run in {str(out)!r}; wait for it "
                         "to end")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # while still holding it
        handle.close()


def _artifacts_of(out: Path, run: dict) -> Path:
    """The run's artifacts: its own folder (kept relative to the run, which may move) or the
    absolute path it was given (runs of earlier versions kept a path relative to the working
    directory)."""
    path = Path(run["artifacts"])
    return out / path if not path.is_absolute() and (out / path).is_dir() else path


def train(cfg: dict) -> dict:
    """Run (or resume) a training run; returns a summary for the caller to print."""
    lr_now = cfg.get("lr")  # on --resume only a learning rate given now replaces the checkpoint's
    if cfg.get("resume"):
        cfg = resume_settings(cfg)
    if not cfg.get("resume") and cfg.get("model") and not os.path.isfile(cfg["model"]):
        raise UsageError(f"--model: no such file {cfg['model']!r}")
    if not cfg.get("resume") and cfg.get("artifacts") and not os.path.isdir(cfg["artifacts"]):
        raise UsageError(f"--artifacts: no such directory {cfg['artifacts']!r}")
    out = Path(cfg["out"])
    check_out_dir(out, "a run")
    x, y, w = load_data(cfg["data"])
    if y is None:
        raise UsageError(f"--data: {', '.join(cfg['data'])} holds no labels 'y'")
    val = None
    if cfg.get("val_data"):
        vx, vy, vw = load_data(cfg["val_data"], "--val-data")
        if vy is None:
            raise UsageError("--val-data: the file holds no labels 'y'")
        val = (vx, vy) if vw is None else (vx, vy, vw)
    elif cfg.get("val_split"):
        x, y, w, val = _split(x, y, w, cfg["val_split"])
    weighted = [f for f, v in (("--data", w), ("--val-data", val[2] if val and len(val) == 3 else None))
                if v is not None]
    cfg["has_sample_weight"] = bool(weighted)
    given = _artifacts_of(out, read_json(out / "run.json", "run settings")) if cfg.get("resume") else \
        cfg.get("artifacts")
    if weighted and given and ot.artifacts.load(given).sample_weight is None:
        raise UsageError(f"{weighted[0]}: the data holds sample_weight, which the artifacts in {str(given)!r} do "
                         "not take; build them with `ortrain artifacts ... --sample-weights`, or leave "
                         "sample_weight out of the data")
    data = (x, y, w, val)
    if cfg.get("resume"):
        with _run_lock(out):
            return _resume(cfg, out, data, lr_now)
    if (out / "state.json").exists() or (out / "run.json").exists():
        raise UsageError(f"--out: {str(out)!r} already holds a run; continue it with --resume or choose "
                         "another directory")
    discard = _discarder(out)
    out.mkdir(parents=True, exist_ok=True)
    with _run_lock(out):
        if (out / "run.json").exists():  # another process started a run here meanwhile
            raise UsageError(f"--out: {str(out)!r} already holds a run; continue it with --resume or choose "
                             "another directory")
        try:
            return _start(cfg, out, data, discard)
        except BaseException as exc:
            # An error before the first epoch ends: the same command can simply be run again. An
            # interrupt (Ctrl-C) keeps a run that has its settings, which --resume starts over.
            if not (out / "state.json").exists() and \
                    (not isinstance(exc, KeyboardInterrupt) or not (out / "run.json").exists()):
                discard()
            raise


def _start(cfg: dict, out: Path, data, discard) -> dict:
    seed = cfg["seed"] if cfg.get("seed") is not None else int(np.random.default_rng().integers(2**31))
    ot.set_seed(seed)  # the seed of an imported model's dropout masks
    art_dir = Path(cfg["artifacts"] if cfg.get("artifacts") else _build_artifacts(cfg, out)).resolve()
    own = out.resolve() in art_dir.parents
    write_json(out / "run.json", {"artifacts": str(art_dir.relative_to(out.resolve()) if own else art_dir),
                                  "seed": seed, "batch_size": cfg["batch_size"],
                                  "settings": {k: v for k, v in _absolute(cfg).items() if k != "resume"}})
    return _fit(cfg, out, data, art_dir, seed, cfg["batch_size"], None, 0, RunRecorder(out, {}, []), cfg.get("lr"))


def _resume(cfg: dict, out: Path, data, lr_now) -> dict:
    run = read_json(out / "run.json", "run settings")
    sweep_temporaries(out)
    state = read_json(out / "state.json", "run state") if (out / "state.json").exists() else None
    art_dir = _artifacts_of(out, run)
    checkpoint = out / state["checkpoint"] if state else None
    initial_epoch = state["epoch"] if state else 0
    recorder = RunRecorder(out, *((state["history"], state["epochs"]) if state else ({}, [])),
                           stale=("model.onnx", "loss.png"))
    if cfg["epochs"] <= initial_epoch:
        summary = {"out": str(out), "epochs": initial_epoch, "note": f"the run already completed {initial_epoch} "
                   f"epochs; pass --epochs above {initial_epoch} to train further"}
        if not (out / "model.onnx").exists():  # stopped after its last epoch, before the export
            with ot.Trainer.from_artifacts(art_dir, batch_size=run["batch_size"], checkpoint=checkpoint) as tr:
                summary.update(_finish(out, tr.model(), recorder))
        return summary
    # Without a checkpoint yet, the run's own --lr still applies; after one, the checkpoint's.
    lr = lr_now if lr_now is not None or checkpoint is not None else cfg.get("lr")
    return _fit(cfg, out, data, art_dir, run["seed"], run["batch_size"], checkpoint, initial_epoch, recorder, lr)


def _one_input(specs) -> None:
    """The command line feeds one array ``x``: a model with several inputs trains from Python."""
    if len(specs) > 1:
        raise UsageError(f"the model has {len(specs)} inputs ({', '.join(s.name for s in specs)}) and the command "
                         "line feeds one array x; train or run it from Python (ot.Trainer.from_artifacts, "
                         "Model.fit/predict with a list or dict of arrays)")


def _fit(cfg: dict, out: Path, data, art_dir: Path, seed: int, batch_size: int, checkpoint, initial_epoch: int,
         recorder: RunRecorder, lr) -> dict:
    x, y, w, val = data
    ot.set_seed(seed)
    _one_input(ot.artifacts.load(art_dir).inputs)
    with ot.Trainer.from_artifacts(art_dir, batch_size=batch_size, checkpoint=checkpoint,
                                   metrics=cfg.get("metrics")) as trainer:
        if lr is not None:
            trainer.set_lr(lr)
        fit_mod.train(trainer, x, y, sample_weight=w, epochs=cfg["epochs"], initial_epoch=initial_epoch,
                      validation_data=val, shuffle=cfg.get("shuffle", True), callbacks=[recorder],
                      verbose=cfg.get("verbose", 1))
        model = trainer.model()
    return {"out": str(out), "epochs": len(recorder.epochs), **_finish(out, model, recorder)}


def _finish(out: Path, model, recorder: RunRecorder) -> dict:
    """The end of a run: ``model.onnx`` and the loss plot."""
    model.export_onnx(out / "model.onnx")
    summary = {"model": str(out / "model.onnx"), "final": {k: v[-1] for k, v in recorder.history.items() if v}}
    plot = _plot(recorder, out)
    if plot:
        summary["plot"] = plot
    return summary


def _discarder(out: Path):
    """What removes a new run that fails before its first epoch ends: its settings, the artifacts
    it built, and the directories the run created (parents that stay empty included: another
    run may have started beside it meanwhile). Nothing that was there before is touched."""
    had_artifacts = (out / "artifacts").exists()
    created = []  # the directories this run creates, innermost first
    for d in (out, *out.parents):
        if d.exists():
            break
        created.append(d)

    def discard() -> None:
        (out / "run.json").unlink(missing_ok=True)
        if not had_artifacts:
            shutil.rmtree(out / "artifacts", ignore_errors=True)
        if created and created[0] == out:
            shutil.rmtree(out, ignore_errors=True)
        for d in created[1:]:
            try:
                d.rmdir()
            except OSError:  # not empty: someone else's now
                break
    return discard


def _plot(recorder: RunRecorder, out: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in ("loss", "val_loss"):
        if key in recorder.history:  # None: a value JSON could not hold (NaN), or an epoch without one
            values = [np.nan if v is None else v for v in recorder.history[key]]
            ax.plot([e + 1 for e in recorder.epochs], values, marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    plt.close(fig)
    return str(out / "loss.png")


def model_from(run: str | None, artifacts: str | None, checkpoint: str | None, onnx_model: str | None = None,
               metrics=None, takes_model: bool = False):
    """The model a run, an artifacts directory (with an optional checkpoint) or an .onnx file holds."""
    given = [a for a in (run, artifacts, onnx_model) if a]
    if len(given) != 1:
        raise UsageError("give exactly one of --run, --artifacts" + (" or --model" if takes_model else ""))
    if onnx_model:
        if not os.path.isfile(onnx_model):
            raise UsageError(f"--model: no such file {onnx_model!r}")
        return ot.from_onnx(onnx_model)
    if run:
        if not Path(run, "run.json").is_file():
            raise UsageError(f"--run: {run!r} is not a run directory (no run.json)")
        settings = read_json(Path(run) / "run.json", "run settings")
        art = ot.artifacts.load(_artifacts_of(Path(run), settings))
        if checkpoint is None and (Path(run) / "state.json").exists():
            checkpoint = str(Path(run) / read_json(Path(run) / "state.json", "run state")["checkpoint"])
    else:
        if not os.path.isdir(artifacts):
            raise UsageError(f"--artifacts: no such directory {artifacts!r}")
        art = ot.artifacts.load(artifacts)
    if checkpoint is not None and not os.path.isfile(checkpoint):
        raise UsageError(f"--checkpoint: no such file {checkpoint!r}")
    return art.model(checkpoint, metrics=metrics)


def evaluate(opts) -> dict:
    model = model_from(opts.run, opts.artifacts, opts.checkpoint, metrics=opts.metrics)
    _one_input(model.input_specs)
    x, y, w = load_data(opts.data)
    if y is None:
        raise UsageError("--data: the file holds no labels 'y' to evaluate against")
    return model.evaluate(x, y, batch_size=opts.batch_size, sample_weight=w)


def _output_file(opts, example: str) -> None:
    """``-o`` names a file to write in a folder that exists, outside the artifacts it reads (a file
    written there fails their sha256 check from then on): checked before anything loads or runs,
    as a usage error."""
    source = opts.artifacts
    if opts.run and Path(opts.run, "run.json").is_file():
        with contextlib.suppress(OrtrainError, KeyError, TypeError):  # model_from names a damaged run
            source = str(_artifacts_of(Path(opts.run), read_json(Path(opts.run) / "run.json", "run settings")))
    written = Path(os.path.abspath(opts.output)).resolve()
    if source and os.path.isdir(source) and Path(source).resolve() in (written, *written.parents):
        raise UsageError(f"-o: {opts.output!r} lies inside the artifacts {source!r} this command reads; write it "
                         "elsewhere")
    if os.path.isdir(opts.output):
        raise UsageError(f"-o: {opts.output!r} is a directory; give the file to write, e.g. "
                         f"{os.path.join(opts.output, example)!r}")
    try:
        checked_target(opts.output, "-o")
    except OrtrainError as exc:
        raise UsageError(str(exc)) from None


def predict(opts) -> dict:
    _output_file(opts, "predictions.npy")
    model = model_from(opts.run, opts.artifacts, opts.checkpoint, opts.model, takes_model=True)
    _one_input(model.input_specs)
    x, _, _ = load_data(opts.data)
    pred = model.predict(x, batch_size=opts.batch_size)
    if isinstance(pred, np.ndarray):
        path = _npy_path(Path(opts.output), None)
        np.save(path, pred)
        return {"predictions": str(path), "shape": list(pred.shape)}
    paths = [_npy_path(Path(opts.output), i) for i in range(len(pred))]
    for path, p in zip(paths, pred):
        np.save(path, p)
    return {"predictions": [str(p) for p in paths], "shapes": [list(p.shape) for p in pred]}


def _npy_path(path: Path, index: int | None) -> Path:
    """``OUT.npy`` for a single output, ``OUT_<index>.npy`` for output ``index`` of several."""
    base = path.with_suffix("") if path.suffix == ".npy" else path
    return base.with_name(base.name + ("" if index is None else f"_{index}") + ".npy")


def export(opts) -> dict:
    _output_file(opts, "model.onnx")
    model = model_from(opts.run, opts.artifacts, opts.checkpoint)
    path = model.export_onnx(opts.output)
    return {"model": path, "inputs": [s.name for s in model.input_specs],
            "outputs": [s.name for s in model.output_specs]}


def artifacts(opts) -> dict:
    if not os.path.isfile(opts.model):
        raise UsageError(f"MODEL: no such file {opts.model!r}")
    if os.path.exists(opts.output) and not os.path.isdir(opts.output):
        raise UsageError(f"-o: {opts.output!r} is a file; artifacts need a directory, choose another path")
    try:  # the manifest alone: artifacts of another version are replaced too
        before = read_json(Path(opts.output) / "manifest.json", "manifest").get("key")
    except (OrtrainError, AttributeError):
        before = None
    loss = ot.losses.get(loss_of(opts.loss, opts.from_logits))
    model = ot.from_onnx(opts.model, trainable=opts.trainable, frozen=opts.frozen)
    opt = ot.optim.get(opts.optimizer)
    if opts.lr is not None:
        opt.lr = opts.lr
    art = ot.artifacts.build(model, loss=loss, optimizer=opt, out_dir=opts.output,
                             weighting="sample" if opts.sample_weights else None)
    roles = {"trainable": [], "frozen": [], "buffer": []}
    for p in art.params:
        roles[p.role].append(p.name)
    result = {"directory": str(art.directory), "hash": art.key, **roles}
    if before is not None and before != art.key:
        result["note"] = (f"replaced the artifacts {opts.output!r} held (another model, loss, optimizer or "
                          "ortrain version); runs trained from them cannot --resume")
    return result
