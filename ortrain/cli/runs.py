"""``ortrain train``: start a run (building its artifacts from --model) or resume one, fit it,
and finish it with ``model.onnx`` and the loss plot. The run directory's layout and
bookkeeping are in :mod:`ortrain.cli.run_dir`.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np

import ortrain as ot
from ortrain import _optional
from ortrain import fit as fit_mod
from ortrain._arrays import refuse_non_finite
from ortrain._files import atomic_path
from ortrain._trainer_setup import unfit
from ortrain._warnings import warn
from ortrain.cli._common import (
    UsageError,
    _one_input,
    array_names,
    artifacts_dir,
    check_out_dir,
    load_data,
    loss_of,
    model_file,
    momentum_of,
    write_json,
)
from ortrain.cli.run_dir import (
    RunRecorder,
    _absolute,
    _artifacts_of,
    _discarder,
    _rebuild_command,
    _run_lock,
    left_by_a_start,
    read_run,
    read_state,
    resume_settings,
    resumed_run,
    run_checkpoint,
    sweep_temporaries,
)
from ortrain.data import split_arrays
from ortrain.errors import OrtrainError


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
    opt = ot.optim.get(momentum_of(cfg["optimizer"], cfg.get("momentum")))
    if cfg.get("lr") is not None:
        opt.lr = cfg["lr"]
    weighting = "sample" if cfg.get("has_sample_weight") else None
    target = out / "artifacts"
    ot.artifacts.build(model, loss=loss, optimizer=opt, out_dir=target, weighting=weighting)
    return target


def train(cfg: dict) -> dict:
    """Run (or resume) a training run; returns a summary for the caller to print."""
    lr_now = cfg.get("lr")  # on --resume only a learning rate given now replaces the checkpoint's
    if cfg.get("resume"):
        cfg = resume_settings(cfg)
    if not cfg.get("resume") and cfg.get("model"):
        model_file(cfg["model"], "--model")
    if not cfg.get("resume") and cfg.get("artifacts"):
        artifacts_dir(cfg["artifacts"])
    check_out_dir(cfg["out"], "a run")
    out = Path(cfg["out"])
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
    if val is not None:  # the training rows are refused by the fit; validation rows are the run's data too
        # the rows --val-split holds out are the last of --data: a row is named by its place in the file
        refuse_non_finite([np.asarray(a) for a in val], list(_names(cfg)["validation_data"]),
                          "nothing was trained", needs="validation needs finite values",
                          first_row=0 if cfg.get("val_data") else len(y))
    weighted = [f for f, v in (("--data", w), ("--val-data", val[2] if val and len(val) == 3 else None))
                if v is not None]
    cfg["has_sample_weight"] = bool(weighted)
    given = _artifacts_of(out, read_run(out)) if cfg.get("resume") else \
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
    cut_short = _refuse_clashes(out, building=not cfg.get("artifacts"))
    discard = _discarder(out, artifacts_ours=cut_short)
    out.mkdir(parents=True, exist_ok=True)
    with _run_lock(out):
        if (out / "run.json").exists():  # another process started a run here meanwhile
            raise UsageError(f"--out: {str(out)!r} already holds a run; continue it with --resume or choose "
                             "another directory")
        sweep_temporaries(out)  # what a start cut short by a kill left half-written
        if cut_short:  # its artifacts: this run builds its own
            shutil.rmtree(out / "artifacts", ignore_errors=True)
        try:
            return _start(cfg, out, data, discard)
        except BaseException as exc:
            # An error before the first epoch ends: the same command can simply be run again. An
            # interrupt (Ctrl-C) keeps a run that has its settings, which --resume starts over.
            if not (out / "state.json").exists() and \
                    (not isinstance(exc, KeyboardInterrupt) or not (out / "run.json").exists()):
                discard()
            raise


# What a run writes in its directory (besides run.json), and its artifacts when it builds them.
_RUN_FILES = ("state.json", "log.csv", "history.json", "model.onnx", "loss.png", "checkpoints")


def _refuse_clashes(out: Path, building: bool) -> bool:
    """A new run goes into a new or empty directory, or one whose files it would not overwrite, or
    one that holds nothing but what a run started there left before it wrote run.json (killed;
    ``left_by_a_start``): True then, as the run replaces those artifacts."""
    names = _RUN_FILES + (("artifacts",) if building else ())
    clash = [n for n in names if (out / n).exists()]
    if clash == ["artifacts"] and left_by_a_start(out):
        return True
    if clash:
        raise UsageError(f"--out: {str(out)!r} holds {', '.join(clash)}, which a run writes, and no run; choose a "
                         "new or empty directory")
    return False


def _start(cfg: dict, out: Path, data, discard) -> dict:
    seed = cfg["seed"] if cfg.get("seed") is not None else int(np.random.default_rng().integers(2**31))
    ot.set_seed(seed)  # the seed of an imported model's dropout masks
    art_dir = Path(cfg["artifacts"] if cfg.get("artifacts") else _build_artifacts(cfg, out)).resolve()
    own = out.resolve() in art_dir.parents
    write_json(out / "run.json", {"artifacts": str(art_dir.relative_to(out.resolve()) if own else art_dir),
                                  "seed": seed, "batch_size": cfg["batch_size"],
                                  "settings": {**{k: v for k, v in _absolute(cfg).items()
                                                  if k != "resume" and not k.startswith("_")},
                                               "shuffle": cfg.get("shuffle", True)}})
    return _fit(cfg, out, data, art_dir, seed, cfg["batch_size"], None, 0, RunRecorder(out, {}, []), cfg.get("lr"))


def _resume(cfg: dict, out: Path, data, lr_now) -> dict:
    run, state = read_run(out), read_state(out)  # both checked before anything in the run changes
    checkpoint = run_checkpoint(out, state, "start the run again in another --out directory") if state else None
    sweep_temporaries(out)
    art_dir = _artifacts_of(out, run)
    differ = unfit(checkpoint, ot.artifacts.load(art_dir)) if checkpoint is not None else None
    if differ is not None:
        # the run's own files disagree (no argument is at fault): a failed run, as eval says of them
        rebuild = _rebuild_command(out, art_dir, run)
        raise OrtrainError(f"--resume: the artifacts in {str(art_dir)!r} were rebuilt after the run {str(out)!r} "
                           f"started and differ from those its checkpoint was written for in {differ}; "
                           + (f"build them again as the run did: {rebuild}" if rebuild else
                              "rebuild them as the run had them") + ", or start a new run with another --out")
    initial_epoch = state["epoch"] if state else 0
    recorder = RunRecorder(out, *((state["history"], state["epochs"]) if state else ({}, [])),
                           stale=("model.onnx", "loss.png"), run=resumed_run(run, cfg))
    if cfg["epochs"] <= initial_epoch:
        return _completed(out, art_dir, run["batch_size"], checkpoint, recorder, initial_epoch)
    # Without a checkpoint yet, the run's own --lr still applies; after one, the checkpoint's.
    lr = lr_now if lr_now is not None or checkpoint is not None else cfg.get("lr")
    return _fit(cfg, out, data, art_dir, run["seed"], run["batch_size"], checkpoint, initial_epoch, recorder, lr)


def _completed(out: Path, art_dir: Path, batch_size: int, checkpoint: Path, recorder: RunRecorder, done: int) -> dict:
    """A resume of a run that has done its epochs: it writes the final outputs that a stop after
    the last epoch left unwritten (model.onnx, loss.png) and says so."""
    summary = {"out": str(out), "epochs": done,
               "note": f"the run already completed {done} epochs; pass --epochs above {done} to train further"}
    missing = [name for name in ("model.onnx", "loss.png") if not (out / name).exists()]
    if "loss.png" in missing and importlib.util.find_spec("matplotlib") is None:
        missing.remove("loss.png")  # never written without matplotlib
    if "model.onnx" in missing:
        with ot.Trainer.from_artifacts(art_dir, batch_size=batch_size, checkpoint=checkpoint) as tr:
            summary.update(_finish(out, tr.model(), recorder))
    elif missing:
        summary["plot"] = _plot(recorder, out)
    if missing:
        summary["note"] += f"; wrote its missing {' and '.join(missing)}"
    return summary


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
                      verbose=cfg.get("verbose", 1), names=_names(cfg))
        model = trainer.model()
    return {"out": str(out), "epochs": len(recorder.epochs), **_finish(out, model, recorder)}


def _names(cfg: dict) -> dict:
    """The arrays of --data and --val-data as error messages name them."""
    xa, ya, wa = array_names(cfg["data"])
    if cfg.get("val_data"):
        held = array_names(cfg["val_data"], "--val-data")
    else:
        held = tuple(f"{name} (the rows --val-split holds out)" for name in (xa, ya, wa))
        if cfg.get("val_split"):  # the shapes a message gives are those of the rows left for training
            xa, ya, wa = (f"{name} (the rows --val-split leaves for training)" for name in (xa, ya, wa))
    return {"x": xa, "y": ya, "sample_weight": wa, "validation_data": held}


def _finish(out: Path, model, recorder: RunRecorder) -> dict:
    """The end of a run: ``model.onnx`` and the loss plot."""
    model.export_onnx(out / "model.onnx")
    summary = {"model": str(out / "model.onnx"), "final": {k: v[-1] for k, v in sorted(recorder.history.items()) if v}}
    plot = _plot(recorder, out)
    if plot:
        summary["plot"] = plot
    return summary


def _plot(recorder: RunRecorder, out: Path) -> str | None:
    try:
        matplotlib = _optional.load("matplotlib", "loss.png")
        matplotlib.use("Agg")
        plt = _optional.load("matplotlib.pyplot", "loss.png")
    except _optional.Unusable as exc:
        if not exc.missing:  # installed but broken: said, not silently skipped (a missing one is optional)
            warn(f"{exc} (the run is complete without it)", RuntimeWarning)
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        for key in ("loss", "val_loss"):
            if key in recorder.history:  # None: a value JSON could not hold (NaN), or an epoch without one
                values = [np.nan if v is None else v for v in recorder.history[key]]
                ax.plot([e + 1 for e in recorder.epochs], values, marker="o", label=key)
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.legend()
        fig.tight_layout()
        with atomic_path(out / "loss.png", "loss.png") as tmp:  # a full disk leaves the last plot whole
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
    return str(out / "loss.png")
