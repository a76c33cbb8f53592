"""A training run's directory, and the bookkeeping that makes it resumable.

A run directory holds::

    run.json            the run's settings (written when it starts; a resume that changes what
                        it trains on rewrites them as it starts training)
    state.json          the commit point: epochs done, the checkpoint to resume from, the history
    artifacts/          training artifacts, when the run started from --model
    checkpoints/        epoch-NNNN.ckpt (the two newest are kept)
    log.csv, history.json, model.onnx (at the end), loss.png (with matplotlib)

After every epoch the checkpoint is written first and ``state.json`` last, each by
rename (:class:`RunRecorder`), so a run stopped at any moment once ``run.json`` exists
(Ctrl-C, SIGTERM, a kill) leaves a directory that ``--resume`` continues from the last
completed epoch, bit for bit (seeded dropout included). This module also holds the settings a
resume keeps, the sweep of half-written files, the run's lock and the discard of a failed start.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from ortrain._artifact_store import cache_dir, publish_leftovers
from ortrain._files import CAN_LOCK, atomic_temporaries, lock_file
from ortrain._manifest import FILES as ARTIFACT_FILES
from ortrain.callbacks.base import Callback
from ortrain.cli import TRAIN_KEYS
from ortrain.cli._common import UsageError, read_json, write_json, write_text
from ortrain.errors import OrtrainError

KEEP_CHECKPOINTS = 2


class RunRecorder(Callback):
    """Writes checkpoint, log and history after every epoch, then commits ``state.json``."""

    def __init__(self, out: Path, history: dict[str, list], epochs_done: list[int], stale: tuple[str, ...] = (),
                 run: dict | None = None):
        self.out = out
        self.history = {k: list(v) for k, v in history.items()}
        self.epochs = list(epochs_done)
        self.stale = stale  # files of an earlier end, out of date once an epoch commits
        self.run = run  # run.json as a resume changes it, written once the fit has checked the data

    def on_train_begin(self, logs=None):
        if self.run is not None:
            write_json(self.out / "run.json", self.run)

    def on_epoch_end(self, epoch, logs=None):
        ckdir = self.out / "checkpoints"
        ckdir.mkdir(exist_ok=True)
        ck = ckdir / f"epoch-{epoch + 1:04d}.ckpt"
        self.trainer.save_checkpoint(ck)
        self.epochs.append(epoch)
        logs = logs or {}
        for key in sorted(set(self.history) | set(logs)):  # one order, whatever the hash seed
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


# -- reading the run's records ---------------------------------------------------------------------
# Both files are read back as train writes them; a valid JSON file of another shape ({}, null, a
# number where the settings go) is damaged too, as a syntax error is: it gave KeyError tracebacks,
# and an empty state.json restarted the run from its first epoch, dropping the epochs it had done.
_RUN_FIX = "restore it from a copy, or start a new run in another --out directory"
_STATE_FIX = ("restore it from a copy, or start the run again in another --out directory (eval, predict and export "
              "still read its checkpoints/ with --checkpoint)")


def read_run(out: Path) -> dict:
    """``run.json``: the checkpoint-independent settings of the run in ``out``."""
    path = out / "run.json"
    run = read_json(path, "run settings", _RUN_FIX)
    problem = _run_problem(run)
    if problem:
        raise OrtrainError(f"run settings {str(path)!r} is damaged: {problem}; {_RUN_FIX}")
    return run


def read_state(out: Path) -> dict | None:
    """``state.json``: the epochs done, their history and the checkpoint to go on from; None before
    the first epoch has completed."""
    path = out / "state.json"
    if not path.exists():
        return None
    state = read_json(path, "run state", _STATE_FIX)
    problem = _state_problem(state)
    if problem:
        raise OrtrainError(f"run state {str(path)!r} is damaged: {problem}; {_STATE_FIX}")
    return state


def run_checkpoint(out: Path, state: dict, fix: str) -> Path:
    """The checkpoint ``state.json`` names, which must exist: the run's weights are in it."""
    path = out / state["checkpoint"]
    if not path.is_file():
        raise OrtrainError(f"run state {str(out / 'state.json')!r} names the checkpoint {str(path)!r}, which does "
                           f"not exist; the run is damaged: restore the file, or {fix}")
    return path


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _run_problem(run) -> str | None:
    if not isinstance(run, dict):
        return f"expected a JSON object of the run's settings, received {_shown(run)}"
    for key, fits, expected in (("artifacts", lambda v: isinstance(v, str) and v != "", "a path"),
                                ("seed", lambda v: _is_int(v, 0), "an integer >= 0"),
                                ("batch_size", lambda v: _is_int(v, 1), "a positive integer"),
                                ("settings", lambda v: isinstance(v, dict), "an object")):
        if key not in run:
            return f"it lacks {key!r}"
        if not fits(run[key]):
            return f"{key!r} expected {expected}, received {_shown(run[key])}"
    for key, kind in (*TRAIN_KEYS.items(), ("shuffle", bool)):
        value = run["settings"].get(key)
        if value is not None and not _of_kind(value, kind):
            return f"setting {key!r} expected {kind.__name__}, received {_shown(value)}"
        if key in _PATHS and value is not None and ("" in value if isinstance(value, list) else value == ""):
            return f"setting {key!r} expected paths, received an empty one in {_shown(value)}"
    return None


_PATHS = ("model", "artifacts", "data", "val_data", "out")  # settings that name files or folders


def _of_kind(value, kind: type) -> bool:
    """Whether a value of ``run.json`` has the type ``TRAIN_KEYS`` gives its option."""
    if kind is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _state_problem(state) -> str | None:
    if not isinstance(state, dict):
        return f"expected a JSON object of the epochs done, received {_shown(state)}"
    for key in ("epoch", "checkpoint", "epochs", "history"):
        if key not in state:
            return f"it lacks {key!r}"
    if not _is_int(state["epoch"], 1):
        return f"'epoch' expected a positive integer, received {_shown(state['epoch'])}"
    if not isinstance(state["checkpoint"], str) or not state["checkpoint"]:
        return f"'checkpoint' expected a path, received {_shown(state['checkpoint'])}"
    epochs = state["epochs"]
    if not isinstance(epochs, list) or not all(_is_int(e, 0) for e in epochs):
        return f"'epochs' expected a list of epoch numbers, received {_shown(epochs)}"
    history = state["history"]
    if not isinstance(history, dict):
        return f"'history' expected an object of lists, received {_shown(history)}"
    for key, column in history.items():
        if not isinstance(column, list) or len(column) != len(epochs) or \
                not all(v is None or _of_kind(v, float) for v in column):
            return f"history {key!r} expected {len(epochs)} numbers (one per epoch), received {_shown(column)}"
    return None


# What decides which rows make each batch and in which order: a resumed run must keep them to
# continue bit for bit, so they cannot be changed on --resume.
FIXED_BY_RUN = {"batch_size": "--batch-size", "seed": "--seed"}


# What the run trains: its model or artifacts, loss, optimizer and trained weights. A resume
# continues that training, so another value is refused (it was silently ignored).
TRAINED_BY_RUN = ("model", "artifacts", "loss", "optimizer", "momentum", "from_logits", "trainable", "frozen")


def resume_settings(cfg: dict) -> dict:
    """A resumed run keeps the settings it started with; options given now override the data, the
    epochs, the learning rate, the metrics and the output (``--val-data`` or ``--val-split`` given
    now replaces the run's validation of either kind), while the batch size, the seed and the
    shuffling, and what the run trains (``TRAINED_BY_RUN``), are fixed by the run: another value
    is refused."""
    out = Path(cfg["out"])
    if not (out / "run.json").is_file():
        if left_by_a_start(out):
            raise UsageError(f"train --resume: {str(out)!r} holds no run to resume: the run started there was stopped "
                             "before it wrote run.json (its artifacts are left); run the command that started it "
                             "again, without --resume")
        raise UsageError(f"train --resume: {str(out)!r} holds no run to resume; drop --resume to start one there")
    run = read_run(out)
    for key, flag in FIXED_BY_RUN.items():
        if cfg.get(key) is not None and cfg[key] != run[key]:
            raise UsageError(f"train --resume: {flag} {cfg[key]} differs from the run's {run[key]}; the batch size "
                             f"and seed are fixed by the run (they decide every batch of a bit-exact resume). Drop "
                             f"{flag}, or start a new run in another --out directory")
    started = run["settings"]
    shuffles = started.get("shuffle", True)  # runs started before it was recorded shuffled unless told
    if cfg.get("shuffle") is not None and cfg["shuffle"] != shuffles:
        raise UsageError(f"train --resume: shuffle {cfg['shuffle']} differs from the run's {shuffles}; the order of "
                         f"the rows is fixed by the run (it decides every batch of a bit-exact resume). Drop "
                         f"{'--no-shuffle' if shuffles else 'shuffle from the config'}, or start a new run in "
                         "another --out directory")
    for key in TRAINED_BY_RUN:
        given = cfg.get(key)
        if given is None or given is False or given == []:
            continue
        if key in PATH_KEYS:
            given = os.path.abspath(given)
        if given != started.get(key):
            flag = f"--{key.replace('_', '-')}"
            if key in cfg.get("_from_config", ()):  # a config file's, not an option given now
                flag = f"{key} (from the config file)"
            had = f"the run's {started[key]!r}" if key in started else "the run, which started without it"
            shown = os.path.normpath(cfg[key]) if key in PATH_KEYS else cfg[key]
            raise UsageError(f"train --resume: {flag} {shown!r} differs from {had}; what a run trains (its model "
                             f"or artifacts, loss, optimizer and trained weights) is fixed when it starts. Drop "
                             f"{flag}, or start a new run in another --out directory")
    if cfg.get("val_data") or cfg.get("val_split"):  # a resume's validation replaces the run's, either kind
        started = {k: v for k, v in started.items() if k not in ("val_data", "val_split")}
    merged = {**started, **cfg}
    for key in ("data", "epochs"):
        if merged.get(key) is None:
            raise UsageError(f"train --resume: --{key} is required")
    for key in ("data", "val_data"):  # the run's own data files, where none are given now
        recorded = started.get(key) if not cfg.get(key) else None
        missing = [p for p in ([recorded] if isinstance(recorded, str) else recorded or []) if not os.path.exists(p)]
        if missing:
            flag = f"--{key.replace('_', '-')}"
            raise UsageError(f"train --resume: the run's {flag} file {missing[0]!r} (recorded in "
                             f"{str(out / 'run.json')!r}) no longer exists (moved or deleted?); resume with "
                             f"{flag} and the data's new path")
    return merged


# What a resume may change and a later plain --resume goes on with: the run's record keeps the
# latest (the learning rate goes on in the checkpoint).
CHANGED_BY_RESUME = ("data", "val_data", "val_split", "metrics", "epochs")


def resumed_run(run: dict, cfg: dict) -> dict | None:
    """``run.json`` as the resume with settings ``cfg`` (``resume_settings``) leaves it, so that a
    later plain ``--resume`` trains on the same data, validation and metrics, to the same epoch;
    None when the resume changes none of them."""
    settings = {k: v for k, v in run["settings"].items() if k not in CHANGED_BY_RESUME}
    settings.update({k: v for k, v in _absolute(cfg).items() if k in CHANGED_BY_RESUME and v is not None})
    return None if settings == run["settings"] else {**run, "settings": settings}


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
            if not pattern.fullmatch(p.name) or p.is_symlink():
                continue
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


# What a run writes by atomic_path (_files.atomic_temporaries names their temporaries), in its
# directory and in checkpoints/, and the folders of its artifacts' build (publish_leftovers).
_WRITTEN_IN_RUN = ("run.json", "state.json", "history.json", "log.csv", "model.onnx", "loss.png")
_TEMP_IN_RUN = re.compile("|".join([*(atomic_temporaries(re.escape(name), Path(name).suffix) for name in _WRITTEN_IN_RUN),
                                    publish_leftovers("artifacts")]))
_TEMP_IN_CHECKPOINTS = re.compile(atomic_temporaries(_CHECKPOINT.pattern, ".ckpt"))
# _run_lock's file, and _artifact_store._publish_lock's for the run's artifacts/
_LOCKS = (".lock", ".artifacts.lock")
# what a resume reads or holds: another command's -o must not write over them (model.onnx and loss.png
# it writes again)
RUN_RECORDS = (*(n for n in _WRITTEN_IN_RUN if n not in ("model.onnx", "loss.png")), *_LOCKS)


def left_by_a_start(out: Path) -> bool:
    """Whether ``out`` holds ``artifacts/`` and nothing but what a run of ours leaves before it
    writes ``run.json``: the artifacts it built, its locks and the temporaries of its writes. A
    kill cut that start short (an error or Ctrl-C would have removed them), so the directory is
    the run's to start again, replacing those artifacts. Where runs lock their directory, its
    lock file must be there too: artifacts alone may be the user's (``ortrain artifacts -o``)."""
    art = out / "artifacts"
    if art.is_symlink() or not art.is_dir() or (CAN_LOCK and not (out / _LOCKS[0]).is_file()):
        return False
    try:
        inside = [p.name for p in art.iterdir()]
        beside = [p for p in out.iterdir() if p.name != "artifacts"]
    except OSError:
        return False
    return all(name in (*ARTIFACT_FILES, "manifest.json") for name in inside) and \
        all((p.name in _LOCKS and p.is_file()) or _TEMP_IN_RUN.fullmatch(p.name) for p in beside)


@contextlib.contextmanager
def _run_lock(out: Path):
    """One process at a time trains a run: a second one is refused at once, before it touches
    anything (it would remove the first one's files in flight)."""
    if not CAN_LOCK:  # not on POSIX: no guard
        yield
        return
    lock = out / _LOCKS[0]
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
    directory, tried when it is not the run's own ``artifacts``)."""
    path = Path(run["artifacts"])
    if not path.is_absolute() and ((out / path).is_dir() or path.parts == ("artifacts",)):
        path = out / path  # the run's own (the working directory's artifacts/ is another's)
    if not path.is_dir():  # --artifacts naming them elsewhere is refused: what the run trains is fixed
        rebuild = _rebuild_command(out, path, run)
        if rebuild:
            fix = f"build them again as the run did: {rebuild}"
        elif path.parent == cache_dir():
            fix = (f"they were an entry of ortrain's artifact cache ({str(cache_dir())!r}), deleted since; build "
                   "them again as before (ot.artifacts.build with the same model, loss, optimizer and weights to "
                   "train writes this entry back, its name being their hash), then run this again")
        else:
            fix = "put them back there (or start a new run from where they are now)"
        raise OrtrainError(f"the run's artifacts {str(path)!r} do not exist (moved or deleted?); the run trains "
                           f"from the artifacts it started with, which {str(out / 'run.json')!r} records by that "
                           f"path: {fix}")
    return path


def _rebuild_command(out: Path, path: Path, run: dict) -> str | None:
    """The ``ortrain artifacts`` command that builds the artifacts at ``path`` as the start of the
    run in ``out`` did (the same model, loss, optimizer, weights to train and seed), or None where
    they are not that run's own (``out/artifacts`` of a ``--model`` run) or its model file is gone."""
    if path != out / "artifacts":
        return None
    settings = run.get("settings", {})
    model = settings.get("model")
    if not isinstance(model, str) or not os.path.isfile(model) or not isinstance(settings.get("loss"), str):
        return None
    words = ["ortrain", "artifacts", model, "-o", str(path), "--loss", settings["loss"]]
    if settings.get("from_logits"):
        words.append("--from-logits")
    for key in ("optimizer", "momentum", "lr"):
        if settings.get(key) is not None:
            words += [f"--{key}", str(settings[key])]
    for key in ("trainable", "frozen"):
        for pattern in settings.get(key) or ():
            words += [f"--{key}", str(pattern)]
    if settings.get("has_sample_weight"):
        words.append("--sample-weights")
    words += ["--seed", str(run["seed"])]
    if os.name == "nt":  # as cmd.exe reads a command line
        return subprocess.list2cmdline(words)
    return shlex.join(words)


def _discarder(out: Path, artifacts_ours: bool = False):
    """What removes a new run that fails before its first epoch ends: its settings, the artifacts
    it built, and the directories the run created (parents that stay empty included: another
    run may have started beside it meanwhile). Nothing that was there before is touched, but
    for artifacts a start cut short left (``artifacts_ours``, see ``left_by_a_start``)."""
    had_artifacts = (out / "artifacts").exists() and not artifacts_ours
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
