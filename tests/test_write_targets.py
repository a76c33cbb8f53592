"""Where files are written: a symbolic link keeps pointing at the file it names, which gets the new
content; a device, pipe or socket is refused, never replaced by a regular file."""

import os
import stat
import time

import numpy as np
import pytest

import ortrain as ot
from ortrain._artifact_store import helper_stem


def _model():
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    return model.compile(optimizer="adam", loss="mse")


def _writers(model, trainer):
    return {"save": model.save, "export_onnx": model.export_onnx, "save_weights": model.save_weights,
            "save_checkpoint": trainer.save_checkpoint}


@pytest.mark.parametrize("writer", ["save", "export_onnx", "save_weights", "save_checkpoint"])
def test_a_link_is_followed_and_kept(tmp_path, writer):
    model = _model()
    with ot.Trainer(model, batch_size=2) as tr:
        target = tmp_path / "real.file"
        target.write_bytes(b"old")
        link = tmp_path / ("link.npz" if writer == "save_weights" else "link.file")
        link.symlink_to(target)
        _writers(model, tr)[writer](link)
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert target.read_bytes() != b"old" and target.stat().st_size > 100


@pytest.mark.parametrize("writer", ["save", "export_onnx", "save_weights", "save_checkpoint"])
def test_a_named_pipe_is_refused_and_stays_a_pipe(tmp_path, writer):
    model = _model()
    pipe = tmp_path / ("pipe.npz" if writer == "save_weights" else "pipe")
    os.mkfifo(pipe)
    with ot.Trainer(model, batch_size=2) as tr:
        with pytest.raises(ot.OrtrainError, match=r"it is a named pipe, not a regular file .* give the path of a file"):
            _writers(model, tr)[writer](pipe)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == [pipe.name]
    np.testing.assert_array_equal(model.get_weights()[1], np.zeros(2, np.float32))


def test_a_checkpoint_that_cannot_be_written_says_why_and_keeps_the_old_file(tmp_path):
    import resource
    import signal

    model = _model()
    path = tmp_path / "c"
    with ot.Trainer(model, batch_size=2) as tr:
        tr.save_checkpoint(path)
        before = path.read_bytes()
        tr.step(np.ones((2, 3)), np.zeros((2, 2)))
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, hard))
        try:
            with pytest.raises(ot.OrtrainError, match=r"save_checkpoint: cannot write '.*c': File too large \(errno "
                                                      r"27\); a file already there is left as it was"):
                tr.save_checkpoint(path)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, handler)
        assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["c"]
        tr.save_checkpoint(path)
    assert path.read_bytes() != before


@pytest.mark.parametrize("writer", ["save", "export_onnx", "save_weights"])
def test_a_file_that_cannot_be_written_says_why_and_keeps_the_old_one(tmp_path, writer):
    # a full disk or a size limit: the error names the argument and the file, and leaves no part-file
    import resource
    import signal

    model = _model()
    path = tmp_path / "f"
    with ot.Trainer(model, batch_size=2) as tr:
        write = _writers(model, tr)[writer]
        write(path)
        before = path.read_bytes()
        model.set_weights([w + 1 for w in model.get_weights()])
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
        try:
            with pytest.raises(ot.OrtrainError, match=rf"{writer}\(path\): cannot write '.*f': File too large; a "
                                                      r"file already there is left as it was. The file is larger "
                                                      r"than this process may write \(ulimit -f\)"):
                write(path)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, handler)
        assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_artifacts_that_cannot_be_written_say_why_and_publish_nothing(tmp_path):
    import resource
    import signal

    model = ot.Sequential([ot.layers.Dense(64)], input_shape=(64,), seed=0)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        for limit in (500, 12000):   # a graph's file, then onnxruntime's checkpoint, past the limit
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
            with pytest.raises(ot.OrtrainError, match=r"artifacts: cannot write '.*art': File too large.*; nothing "
                                                      r"was published .* \(ulimit -f\)"):
                ot.artifacts.build(model, loss="mse", optimizer="adam", out_dir=tmp_path / "art")
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            assert os.listdir(tmp_path) == []
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_loop_of_links_is_refused_and_kept(tmp_path):
    (tmp_path / "x").symlink_to("y")
    (tmp_path / "y").symlink_to("x")
    with pytest.raises(ot.OrtrainError, match=r"save\(path\): cannot write '.*x': Too many levels of symbolic links"):
        _model().save(tmp_path / "x")
    assert (tmp_path / "x").is_symlink() and (tmp_path / "y").is_symlink()


def test_a_read_only_file_is_not_replaced(tmp_path, monkeypatch):
    # the atomic rename replaced a read-only file (0444) as if it were writable; onnx.save and
    # torch.save refuse it. (os.access is stubbed: the tests may run as root, who writes anyway.)
    import ortrain._files as files
    model = ot.Sequential([ot.layers.Dense(2)], input_shape=(3,), seed=0)
    model.compile(optimizer="sgd", loss="mse")
    targets = {"export_onnx": lambda p: model.export_onnx(p), "save": lambda p: model.save(p),
               "save_weights": lambda p: model.save_weights(p)}
    real = os.access
    monkeypatch.setattr(files.os, "access", lambda p, mode: False if str(p).endswith(".ro") else real(p, mode))
    for name, write in targets.items():
        target = tmp_path / f"{name}.ro"
        target.write_text("old")
        with pytest.raises(ot.OrtrainError, match=r"cannot write .*: the file is read-only .*chmod u\+w"):
            write(target)
        assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.ro" for n in targets)


def test_a_fit_whose_optimizer_state_cannot_be_read_back_leaves_the_model_as_it_was(tmp_path):
    # the runtime gives the moments only as a checkpoint, written to the temporary folder: with no
    # room there, fit ended in the runtime's RuntimeError after the trained weights had gone back
    # to the model and the optimizer state had not (the next fit restarted Adam on them)
    import resource
    import signal

    model = ot.Sequential([ot.layers.Dense(256, activation="relu"), ot.layers.Dense(3)], input_shape=(64,), seed=0)
    model.compile(optimizer="adam", loss="mse")
    x, y = np.random.default_rng(0).random((16, 64)), np.random.default_rng(1).random((16, 3))
    ot.artifacts.build(model, loss="mse", optimizer="adam")
    before = model.get_weights()
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # the moments need 200 kB
    try:
        with pytest.raises(ot.OrtrainError, match=r"the optimizer state cannot be read back: onnxruntime gives it only "
                                                  r"as a checkpoint, written to the temporary folder .* File too large "
                                                  r"\(errno 27\)\. The file is larger than this process may write"):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    assert model.optimizer.step == 0
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert model.optimizer.step == 2


def test_a_save_removes_what_killed_saves_in_its_folder_left(tmp_path):
    # a kill during a save left a hidden full-size temporary that no later save removed
    import fcntl

    model = _model()
    path = tmp_path / "m.onnx"
    old = int(time.time()) - 3600
    left = tmp_path / ".m.onnx.0123456789ab.tmp.onnx"        # a killed save's: unlocked, an hour old
    fresh = tmp_path / ".m.onnx.00000000000a.tmp.onnx"       # a save just begun elsewhere: young
    held = tmp_path / ".m.onnx.00000000000b.tmp.onnx"        # a save still writing: locked
    other = tmp_path / ".n.npz.0123456789ab.tmp.npz"         # another file's, killed too
    for p in (left, fresh, held, other):
        p.write_bytes(b"x" * 100)
    for p in (left, held, other):
        os.utime(p, (old, old))
    with open(held, "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        model.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (path, fresh, held))
    assert ot.load_model(path).get_weights()[0].shape == (3, 2)


def test_a_save_where_files_cannot_be_locked_still_saves(tmp_path, monkeypatch):
    # Lustre without flock, some FUSE and CIFS mounts: flock fails with ENOSYS, and every save failed
    import errno
    import fcntl

    def refuse(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", refuse)
    model = _model()
    model.save_weights(tmp_path / "w.npz")
    np.testing.assert_array_equal(np.load(tmp_path / "w.npz")[model.weight_names()[0]], model.get_weights()[0])


def test_a_users_hidden_file_shaped_like_a_temporary_is_left(tmp_path):
    # the sweep removed any ".<name>.<12 hex>.tmp<suffix>": a user's hidden file, an hour old, went too
    notes = tmp_path / ".notes.0123456789ab.tmp.txt"
    notes.write_text("mine")
    old = int(time.time()) - 3600
    os.utime(notes, (old, old))
    _model().save(tmp_path / "model.ortrain")
    assert notes.read_text() == "mine"


def test_a_file_replaced_keeps_its_permissions(tmp_path):
    # the rename onto it gave the file 0666 less the umask: a private 0600 model became readable to all
    model = _model()
    for name, save in (("m.ortrain", model.save), ("m.onnx", model.export_onnx), ("w.npz", model.save_weights)):
        path = tmp_path / name
        save(path)
        os.chmod(path, 0o600)
        save(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, name


def test_names_near_and_over_the_file_systems_limit(tmp_path):
    # a name of 238-255 bytes was refused ("File name too long; choose a folder you can write to": its
    # temporary's was too long), one over 255 gave a raw OSError
    model = _model()
    near = tmp_path / ("y" * 250)
    model.save(near)
    assert ot.load_model(near).get_weights()[0].shape == (3, 2)
    assert sorted(os.listdir(tmp_path)) == [near.name]
    with pytest.raises(ot.OrtrainError, match=r"save\(path\): cannot write .*: its name is 256 bytes, and the file "
                                              r"system takes names of at most 255; choose a shorter name"):
        model.save(tmp_path / ("y" * 256))


def test_an_empty_weights_file_is_refused_clearly(tmp_path):
    (tmp_path / "w.npz").write_bytes(b"")
    model = _model()
    before = model.get_weights()
    with pytest.raises(ot.OrtrainError, match=r"load_weights: .*w.npz.*\(it is empty\)"):
        model.load_weights(tmp_path / "w.npz")
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_a_folder_name_that_is_not_utf8_is_refused_where_onnxruntime_writes(tmp_path):
    # onnxruntime's bindings raised "TypeError: save_checkpoint(): incompatible function arguments"
    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    os.makedirs(folder)
    model = _model()
    model.save(folder + "/m.ortrain")  # Python's own writes take it
    with ot.Trainer(model, batch_size=4) as tr:
        with pytest.raises(ot.OrtrainError, match=r"save_checkpoint\(path\): .* holds a folder or file name that is "
                                                  r"not valid UTF-8, which onnxruntime cannot open or write"):
            tr.save_checkpoint(folder + "/ck")
    with pytest.raises(ot.OrtrainError, match="not valid UTF-8"):
        ot.artifacts.build(model, out_dir=folder + "/art")
    assert os.listdir(os.fsencode(folder)) == [b"m.ortrain"]


def test_unreadable_artifacts_and_unsearchable_folders_are_said(tmp_path, monkeypatch):
    # artifacts.load, Trainer.from_artifacts and a save into a folder that may not be looked into gave
    # Python's raw PermissionError (monkeypatched here: the tests may run as root, whom chmod stops not)
    import pathlib

    import ortrain.artifacts as artifacts_mod
    model = _model()
    art = ot.artifacts.build(model, out_dir=tmp_path / "art")

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(artifacts_mod, "read_manifest", denied)
    for call in (lambda: ot.artifacts.load(art.directory),
                 lambda: ot.Trainer.from_artifacts(art.directory, batch_size=4)):
        with pytest.raises(ot.OrtrainError, match=r"artifacts in .*art' cannot be read: Permission denied "
                                                  r"\(.*manifest.json\); make them readable"):
            call()
    monkeypatch.setattr(pathlib.Path, "is_symlink", denied)
    with pytest.raises(ot.OrtrainError, match=r"save\(path\): cannot write .*m.ortrain': Permission denied .*; choose "
                                              r"a folder you can write to"):
        model.save(tmp_path / "locked" / "m.ortrain")


def test_readers_say_what_is_wrong_with_the_path(tmp_path, monkeypatch):
    # from_onnx and artifacts.load gave a raw OSError for a name over 255 bytes, from_onnx a raw
    # PermissionError under a folder it may not search; a manifest or a model.save file given where
    # an artifacts folder or an ONNX file is expected said only "no manifest.json" / "not an ONNX model"
    import pathlib
    model = _model()
    long = tmp_path / ("q" * 256)
    with pytest.raises(ot.OrtrainError, match=r"from_onnx: cannot read .*q' \(File name too long\); check the path"):
        ot.from_onnx(long)
    with pytest.raises(ot.OrtrainError, match=r"artifacts in .*q' cannot be read: File name too long; give the path"):
        ot.artifacts.load(long)
    art = ot.artifacts.build(model, out_dir=tmp_path / "art")
    with pytest.raises(ot.OrtrainError, match=r"manifest.json' is the manifest of an artifacts directory; give the "
                                              r"directory that holds it: '.*art'"):
        ot.artifacts.load(art.directory / "manifest.json")
    model.save(tmp_path / "m.ortrain")
    with pytest.raises(ot.OrtrainError, match=r"m.ortrain' is a zip file, not an ONNX model; a file written by "
                                              r"model.save is read by ot.load_model\(path\)"):
        ot.from_onnx(tmp_path / "m.ortrain")
    model.export_onnx(tmp_path / "m.onnx")

    def denied(path, *args, **kwargs):  # the tests may run as root, whom chmod stops not
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(pathlib.Path, "stat", denied)
    with pytest.raises(ot.OrtrainError, match=r"from_onnx: cannot read .*m.onnx' \(Permission denied\); check the "
                                              r"path and the permissions of the folders on it"):
        ot.from_onnx(tmp_path / "m.onnx")


def test_artifacts_onto_a_mount_point_say_so(tmp_path, monkeypatch):
    # renaming a mount point away fails with EBUSY, whose advice was "Free space or choose another folder"
    import errno
    model = _model()
    ot.artifacts.build(model, out_dir=tmp_path / "mnt")
    rename = os.rename

    def busy(src, dst, *args, **kwargs):
        if os.fspath(src) == os.fspath(tmp_path / "mnt"):
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(src))
        return rename(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "rename", busy)
    with pytest.raises(ot.OrtrainError, match=r"cannot write .*mnt': Device or resource busy; nothing was published .* "
                                              r"The path is a mount point or held by the system, which cannot be "
                                              r"replaced: choose a folder inside it"):
        ot.artifacts.build(model, out_dir=tmp_path / "mnt", loss="mae")
    assert ot.artifacts.load(tmp_path / "mnt").manifest["loss"] == {"name": "mse"}   # the old ones, as they were


def test_a_leading_tilde_is_said_to_be_no_home_folder(tmp_path, monkeypatch):
    # "create it first" led users to make a folder named "~"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ot.OrtrainError, match=r"create it first \(a leading ~ is no home folder here: "
                                              r"os.path.expanduser\(path\) makes it one\)"):
        _model().save("~/m.ortrain")
    assert os.listdir(tmp_path) == []


def test_a_long_suffix_near_the_limit_and_set_id_bits(tmp_path):
    # the short temporary kept a 249-byte "suffix" and was too long itself; a replaced 04755 file kept
    # its set-user-id bit, which a write clears
    model = _model()
    path = tmp_path / ("x." + "y" * 248)
    model.export_onnx(path)
    assert sorted(os.listdir(tmp_path)) == [path.name]
    os.chmod(path, 0o4755)
    model.export_onnx(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755


def test_short_and_suffixless_temporaries_a_kill_left_are_swept_and_a_users_file_is_not(tmp_path):
    old = int(time.time()) - 3600
    for name in (".ortrain-temporary.0123456789ab.tmp.onnx",  # a killed save of a name near the limit
                 ".x." + "y" * 20 + ".0123456789ab.tmp",       # of a name whose long suffix is left out
                 ".cafebabe0123.tmp.csv"):                     # a user's
        (tmp_path / name).write_bytes(b"x" * 10)
        os.utime(tmp_path / name, (old, old))
    _model().export_onnx(tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == [".cafebabe0123.tmp.csv", "m.onnx"]


@pytest.mark.parametrize("name", ["a" * 207 + ".abcdefghijklmno", "b" * 200 + ".éééééééééééé", "c" * 253 + ".d"])
def test_every_name_the_file_system_takes_saves(tmp_path, name):
    # the temporary needs 18 bytes and the suffix beyond the name: 222-byte names with a 15-character
    # suffix, or a suffix of 2-byte characters, were refused as too long
    assert len(os.fsencode(name)) <= 255
    _model().export_onnx(tmp_path / name)
    assert os.listdir(tmp_path) == [name]


def test_a_file_path_ending_in_a_separator_is_refused(tmp_path):
    # a Path drops the '/': save("m/") wrote a file "m" (or replaced a file "m" that was there), which
    # load_model("m/") then refused, and a ModelCheckpoint("m/") trained an epoch before failing
    model = _model()
    (tmp_path / "kept").write_bytes(b"user data")
    h = model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    with ot.Trainer(model, batch_size=2) as tr:
        writers = {**_writers(model, tr), "to_csv": h.to_csv}
        for write in writers.values():
            for given in (f"{tmp_path}/new/", f"{tmp_path}/kept/", f"{tmp_path}/kept/.", f"{tmp_path}/new/.."):
                with pytest.raises(ot.OrtrainError, match=r"cannot write .*': a path ending in '/\.{0,2}' names a "
                                                          r"directory, not a file; give the path of a file"):
                    write(given)
    step = model.optimizer.state()["step"]
    for callback in (ot.callbacks.ModelCheckpoint(f"{tmp_path}/ckpt/"), ot.callbacks.CSVLogger(f"{tmp_path}/log/."),
                     ot.callbacks.ModelCheckpoint(f"{tmp_path}/ckpt/.", save_model=False)):
        with pytest.raises(ot.OrtrainError, match=r"\(file\w*=...\): cannot write .*: a path ending in '/\.{0,2}'"):
            model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0, callbacks=[callback])
    assert model.optimizer.state()["step"] == step  # refused before anything trained
    assert sorted(os.listdir(tmp_path)) == ["kept"] and (tmp_path / "kept").read_bytes() == b"user data"


@pytest.mark.parametrize("size", [238, 255])
def test_artifacts_in_a_folder_of_any_name_the_file_system_takes(tmp_path, size):
    # the build's folders and lock beside it repeat its name with up to 18 bytes more: names of 238-255
    # bytes gave a raw OSError (File name too long) or were refused
    target = tmp_path / ("a" * size)
    stem = helper_stem(target)
    left = tmp_path / f".{stem}.tmp-0123456789ab"  # a killed build's
    left.mkdir()
    art = ot.artifacts.build(_model(), loss="mse", optimizer="adam", out_dir=target)
    assert art.directory == target and sorted(os.listdir(tmp_path)) == [target.name]
    tr = ot.Trainer.from_artifacts(target, batch_size=2)
    tr.free()
