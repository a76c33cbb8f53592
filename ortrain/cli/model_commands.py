"""The commands besides ``train``: ``artifacts`` builds training artifacts from an .onnx file;
``eval``, ``predict`` and ``export`` use the model that a run, an artifacts directory (with an
optional checkpoint) or an .onnx file holds.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

import numpy as np

import ortrain as ot
from ortrain._arrays import refuse_non_finite
from ortrain._files import atomic_path, checked_target
from ortrain._manifest import is_ours
from ortrain.cli._common import (
    NPZ_KEYS,
    UsageError,
    _one_input,
    array_names,
    artifacts_dir,
    check_out_dir,
    load_data,
    loss_of,
    model_file,
    momentum_of,
    read_json,
)
from ortrain.cli.run_dir import RUN_RECORDS, _artifacts_of, read_run, read_state, run_checkpoint
from ortrain.errors import OrtrainError


def model_from(run: str | None, artifacts: str | None, checkpoint: str | None, onnx_model: str | None = None,
               metrics=None, takes_model: bool = False):
    """The model a run, an artifacts directory (with an optional checkpoint) or an .onnx file holds."""
    given = [a for a in (run, artifacts, onnx_model) if a]
    if len(given) != 1:
        raise UsageError("give exactly one of --run, --artifacts" + (" or --model" if takes_model else ""))
    if onnx_model:
        if checkpoint is not None:
            raise UsageError("--checkpoint goes with --run or --artifacts: a --model file holds its own weights (a "
                             "checkpoint of a run that trained it is read with that run's --run or --artifacts)")
        model_file(onnx_model, "--model")
        return ot.from_onnx(onnx_model)
    if run:
        if not Path(run, "run.json").is_file():
            raise UsageError(f"--run: {run!r} is not a run directory (no run.json)")
        art = ot.artifacts.load(_artifacts_of(Path(run), read_run(Path(run))))
        if checkpoint is None:
            checkpoint = str(_last_checkpoint(Path(run)))
    else:
        artifacts_dir(artifacts)
        art = ot.artifacts.load(artifacts)
    if checkpoint is not None and not os.path.isfile(checkpoint):
        if os.path.isdir(checkpoint):
            raise UsageError(f"--checkpoint: {checkpoint!r} is a directory; give a checkpoint file in it (a run's "
                             "are checkpoints/epoch-NNNN.ckpt)")
        raise UsageError(f"--checkpoint: no such file {checkpoint!r}")
    return art.model(checkpoint, metrics=metrics)


def _last_checkpoint(run: Path) -> Path:
    """The checkpoint of the run's last completed epoch; before one has completed the run holds
    only the untrained weights it started from, which are refused, not used."""
    state = read_state(run)
    if state is None:
        raise OrtrainError(f"--run: no epoch of the run in {str(run)!r} has completed yet (it has no state.json), so "
                           "it holds no trained weights; train it first with `ortrain train --out "
                           f"{shlex.quote(str(run))} --resume`, or give weights with --checkpoint")
    return run_checkpoint(run, state, "give another checkpoint of the run (checkpoints/) with --checkpoint")


def evaluate(opts) -> dict:
    model = model_from(opts.run, opts.artifacts, opts.checkpoint, metrics=opts.metrics)
    _one_input(model.input_specs)
    x, y, w = load_data(opts.data)
    if y is None:
        raise UsageError("--data: the file holds no labels 'y' to evaluate against")
    with _named_by_file(opts.data):
        # (the Python API evaluates what it is given; the command's exit status says data with NaN is
        # wrong, as train's does, rather than print a NaN loss and exit 0)
        refuse_non_finite([x, y], ["x", "y"], "nothing was evaluated", "ortrain eval takes finite values only")
        return model.evaluate(x, y, batch_size=opts.batch_size, sample_weight=w)


@contextlib.contextmanager
def _named_by_file(paths: list[str]):
    """An error about an array names it by option and file, as ``train``'s errors do."""
    try:
        yield
    except OrtrainError as exc:
        message = str(exc)
        for key, named in zip(NPZ_KEYS, array_names(paths), strict=True):
            if message.startswith(key) and message[len(key):len(key) + 1] in (":", "["):
                raise type(exc)(named + message[len(key):]) from exc
        raise


def _output_file(opts, example: str) -> None:
    """``-o`` names a file to write in a folder that exists, outside the artifacts it reads (a file
    written there fails their sha256 check from then on): checked before anything loads or runs,
    as a usage error. (Over which files it must not write, :func:`_refuse_writing_over_reads`.)"""
    source = opts.artifacts
    if opts.run and Path(opts.run, "run.json").is_file():
        with contextlib.suppress(OrtrainError):  # model_from names a damaged run
            source = str(_artifacts_of(Path(opts.run), read_run(Path(opts.run))))
    written = Path(os.path.realpath(opts.output))
    if source and os.path.isdir(source) and Path(os.path.realpath(source)) in (written, *written.parents):
        raise UsageError(f"-o: {opts.output!r} lies inside the artifacts {source!r} this command reads; write it "
                         "elsewhere")
    if os.path.isdir(opts.output):
        raise UsageError(f"-o: {opts.output!r} is a directory; give the file to write, e.g. "
                         f"{os.path.join(opts.output, example)!r}")
    try:
        checked_target(opts.output, "-o")
    except OrtrainError as exc:
        raise UsageError(str(exc)) from None


def _artifacts_holding(path: Path) -> Path | None:
    """The folder above ``path`` that is an ortrain artifacts directory (its ``manifest.json`` is one
    an ortrain wrote, not another tool's), if any."""
    for folder in path.parents:
        manifest = folder / "manifest.json"
        if manifest.is_file() and is_ours(manifest):
            return folder
    return None


def _run_data(run: str | None) -> list[str]:
    """The data files the run records (``data``, ``val_data``), which its resume reads again."""
    if not run or not Path(run, "run.json").is_file():
        return []
    try:
        settings = read_run(Path(run))["settings"]
    except (OrtrainError, KeyError, TypeError):
        return []
    files = []
    for key in ("data", "val_data"):
        value = settings.get(key)
        files += value if isinstance(value, list) else [value] if value else []
    return [f for f in files if isinstance(f, str)]


def _refuse_writing_over_reads(opts, paths: list[Path]) -> None:
    """``paths`` (what ``-o`` writes) must not replace a file the command reads (the checkpoint, the
    data, the model) nor a run's records, nor lie in a run's checkpoints/ (which a resume reads):
    each taken as spelled and as the system resolves it (a symlinked folder)."""
    read = {Path(os.path.realpath(f)) for f in
            (opts.checkpoint, getattr(opts, "model", None), *(getattr(opts, "data", None) or ())) if f}
    recorded = {Path(os.path.realpath(f)) for f in _run_data(opts.run)}  # the run's data, which a resume reads
    # the checkpoints of the run read, wherever they are (its checkpoints/ may be a link to another folder)
    kept = Path(os.path.realpath(Path(opts.run, "checkpoints"))) if opts.run else None
    for path in paths:
        spellings = (Path(os.path.abspath(path)), Path(os.path.realpath(path)))
        what = "names" if path == Path(opts.output) else f"would write {path.name!r},"
        # any artifacts, not only those this command reads: as spelled, and as resolved (OUT.npy may be a link)
        held = next((h for f in spellings for h in [_artifacts_holding(f)] if h is not None), None)
        if held is not None:
            raise UsageError(f"-o: {opts.output!r} {what} a file that lies inside the artifacts directory "
                             f"{str(held)!r} (it holds ortrain's manifest.json), which runs may train from: a file "
                             "written over one of its graphs fails its sha256 check from then on, and a rebuild "
                             "replaces the folder with whatever else is in it; write it elsewhere")
        run, linked = next(((str(a.parent), "") for f in spellings for a in f.parents
                            if a.name == "checkpoints" and (a.parent / "run.json").is_file()), (None, ""))
        if kept is not None and kept in spellings[1].parents:
            run = opts.run
            linked = "" if kept == Path(os.path.abspath(Path(opts.run, "checkpoints"))) else f", a link to {str(kept)!r}"
        if run is not None:
            raise UsageError(f"-o: {opts.output!r} lies in the checkpoints/ folder of the run {run!r}{linked}, which "
                             "the run keeps for its checkpoints; write it elsewhere")
        record = next((f for f in spellings if f.name in RUN_RECORDS and (f.parent / "run.json").is_file()), None)
        if record is not None:
            raise UsageError(f"-o: {opts.output!r} {what} {record.name!r} of the run {str(record.parent)!r}, which "
                             "its resume reads: written over, the run could not go on; write elsewhere")
        if any(f in recorded for f in spellings):
            raise UsageError(f"-o: {opts.output!r} {what} data the run {opts.run!r} trains on (its run.json records "
                             "it, and a resume reads it again): written over, it would be gone; write elsewhere")
        if any(f in read for f in spellings):
            raise UsageError(f"-o: {opts.output!r} {what} a file this command reads (a checkpoint, the data or the "
                             "model): written over, it would be gone; write elsewhere")


def predict(opts) -> dict:
    _output_file(opts, "predictions.npy")
    model = model_from(opts.run, opts.artifacts, opts.checkpoint, opts.model, takes_model=True)
    _one_input(model.input_specs)
    outputs = len(model.output_specs)
    paths = [_npy_path(Path(opts.output), None if outputs == 1 else i) for i in range(outputs)]
    _refuse_writing_over_reads(opts, paths)
    x, _, _ = load_data(opts.data, inputs_only=True)
    with _named_by_file(opts.data):
        pred = model.predict(x, batch_size=opts.batch_size)
    if isinstance(pred, np.ndarray):
        _save_npy(paths[0], pred)
        return {"predictions": str(paths[0]), "shape": list(pred.shape)}
    for path, p in zip(paths, pred):
        _save_npy(path, p)
    return {"predictions": [str(p) for p in paths], "shapes": [list(p.shape) for p in pred]}


def _save_npy(path: Path, array: np.ndarray) -> None:
    """Write whole or not at all: a full disk leaves no cut-short file behind."""
    with atomic_path(path, "-o") as tmp, open(tmp, "wb") as f:
        np.save(f, array)  # (to a path without ".npy", as a link's target may be, np.save adds one)


def _npy_path(path: Path, index: int | None) -> Path:
    """``OUT.npy`` for a single output, ``OUT_<index>.npy`` for output ``index`` of several."""
    base = path.with_suffix("") if path.suffix == ".npy" else path
    return base.with_name(base.name + ("" if index is None else f"_{index}") + ".npy")


def export(opts) -> dict:
    _output_file(opts, "model.onnx")
    _refuse_writing_over_reads(opts, [Path(opts.output)])
    model = model_from(opts.run, opts.artifacts, opts.checkpoint)
    path = model.export_onnx(opts.output)
    return {"model": path, "inputs": [s.name for s in model.input_specs],
            "outputs": [s.name for s in model.output_specs]}


def artifacts(opts) -> dict:
    model_file(opts.model, "MODEL")
    check_out_dir(opts.output, "writing artifacts", "-o")
    problem = ot.artifacts.not_artifacts(Path(opts.output))  # the user's files: a usage error, as --out's
    if problem:
        raise UsageError(f"-o: {opts.output!r} {problem}; choose an empty or new directory")
    try:  # the manifest alone: artifacts of another version are replaced too
        before = read_json(Path(opts.output) / "manifest.json", "manifest").get("key")
    except (OrtrainError, AttributeError):
        before = None
    try:  # what they were built for, to say what differs
        parts_before = ot.artifacts.load(opts.output).key_parts() if before is not None else None
    except OrtrainError:  # another version's, or damaged
        parts_before = None
    loss = ot.losses.get(loss_of(opts.loss, opts.from_logits))
    if opts.seed is not None:
        ot.set_seed(opts.seed)  # the seeds of the model's dropout and random ops
    spec = momentum_of(opts.optimizer, opts.momentum)  # refused before anything is read
    model = ot.from_onnx(opts.model, trainable=opts.trainable, frozen=opts.frozen)
    opt = ot.optim.get(spec)
    if opts.lr is not None:
        opt.lr = opts.lr
    art = ot.artifacts.build(model, loss=loss, optimizer=opt, out_dir=opts.output,
                             weighting="sample" if opts.sample_weights else None)
    roles = {"trainable": [], "frozen": [], "buffer": []}
    for p in art.params:
        roles[p.role].append(p.name)
    result = {"directory": str(art.directory), "hash": art.key, **roles}
    if before is not None and before != art.key:
        result["note"] = (f"replaced the artifacts {opts.output!r} held, which differed in "
                          f"{ot.artifacts.what_differs(parts_before, art.key_parts())}; runs trained from them "
                          "cannot --resume")
    return result
