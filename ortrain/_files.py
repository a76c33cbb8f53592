"""Writing files so that a reader (or a crash) never sees half of one."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
import tempfile
import time
from pathlib import Path

from ortrain.errors import OrtrainError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None

CAN_LOCK = fcntl is not None  # lock_file works here


def checked_target(path, what: str = "path") -> Path:
    """``path`` as a ``Path`` for a file about to be written, or a clear error: it must be a
    non-empty path whose folder exists and which is not itself a folder or a device, pipe or
    socket. A symbolic link gives the path of the file it names."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise OrtrainError(f"{what}: expected a file path (str or os.PathLike), received {path!r}")
    given = os.fsdecode(os.fspath(path))
    last = os.path.basename(given)
    if last in ("", ".", "..") and last != given:  # a Path would drop it and write the file it names
        ending = given[len(given) - len(last) - 1:]
        raise OrtrainError(f"{what}: cannot write {given!r}: a path ending in {ending!r} names a directory, not a "
                           "file; give the path of a file (one in that directory, or the path without it)")
    try:
        return _checked_target(Path(path), what)
    except PermissionError as exc:  # a folder on the way that may not be looked into
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: {exc.strerror} ({exc.filename}); choose a folder "
                           "you can write to") from None


def _checked_target(path: Path, what: str) -> Path:
    size, limit = len(os.fsencode(path.name)), name_max(path.parent)
    if size > limit:
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: its name is {size} bytes, and the file system takes "
                           f"names of at most {limit}; choose a shorter name")
    if path.is_symlink():  # the file the link names is written; the link stays
        try:
            path = Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:  # a link to a file not written yet
            path = Path(os.path.realpath(path))
        except OSError as exc:  # a loop of links
            raise OrtrainError(f"{what}: cannot write {str(path)!r}: {exc.strerror or exc}; give the path of a "
                               "file") from None
    kind = _special_kind(path)
    if kind:
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: it is {kind}, not a regular file (a file is written "
                           "beside it and renamed onto it, which would replace it); give the path of a file")
    if path.is_dir():
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: it is a directory; give the path of a file, "
                           f"e.g. {str(path / 'model')!r}")
    if path.is_file() and not os.access(path, os.W_OK):  # the rename would replace it all the same
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: the file is read-only (as onnx.save and "
                           "torch.save refuse it); make it writable (chmod u+w) or give another path")
    if not path.parent.is_dir():
        if path.parent.exists():
            raise OrtrainError(f"{what}: cannot write {str(path)!r}: {str(path.parent)!r} is a file, not a "
                               "directory")
        tilde = " (a leading ~ is no home folder here: os.path.expanduser(path) makes it one)" \
            if str(path).startswith("~") else ""
        raise OrtrainError(f"{what}: cannot write {str(path)!r}: the directory {str(path.parent)!r} does not "
                           f"exist; create it first{tilde}")
    return path


def name_max(folder) -> int:
    """The longest file name, in bytes, the file system of ``folder`` takes (255 where it cannot tell)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):  # (no pathconf on Windows)
        return 255


def _special_kind(path: Path) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def unexpanded_home(path, base: str | os.PathLike = "") -> str | None:
    """Why a folder path given as starting with ``~`` (``"~/runs"`` quoted in a shell or written in
    a config) would not be what was meant: nothing expanded it, and the folder made would be one
    named ``~`` in the current one (or in ``base``, which the path is taken from). None where it does
    not start so (``./~/runs`` names that folder on purpose), or a folder of that name exists."""
    given = os.fspath(path)
    first = given.split(os.sep)[0]
    if not given.startswith("~") or os.path.lexists(os.path.join(base, first)):
        return None
    return (f"starts with {first!r}, which is no home folder here (nothing expanded it) and would be made as a "
            "folder of that name in the current one; give os.path.expanduser(path), or leave ~ unquoted in a shell "
            f"(the string './{given}' names such a folder; a Path drops its './')")


def not_a_folder(target: Path) -> str | None:
    """Why ``target`` cannot be a folder ("is a file", "lies under the file ...", "is a symbolic link
    to ..., which does not exist"), or None when it and its parents are folders or do not exist
    yet. One look at each path: a publisher may be renaming the target right now."""
    for path in (target, *target.parents):
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(path):  # a link to nothing: mkdir says only "File exists"
                return f"{'is' if path == target else f'lies under {str(path)!r},'} a symbolic link to " \
                       f"{os.readlink(path)!r}, which does not exist"
            continue
        except OSError as exc:  # a loop of symbolic links, a path too long, no permission to look
            return f"cannot be reached ({exc.strerror})"
        if stat.S_ISDIR(mode):
            return None
        return "is a file" if path == target else f"lies under the file {str(path)!r}"
    return None


def fresh_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory in ``parent`` with the usual permissions (0777 less the
    umask), unlike ``tempfile.mkdtemp``'s private 0700: what is published from it stays readable
    to whoever may read its parent."""
    while True:
        path = Path(parent) / f"{prefix}{secrets.token_hex(6)}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def atomic_temporaries(name: str, suffix: str) -> str:
    """A regular expression of the temporary names ``atomic_path`` gives a file whose name matches
    ``name`` (itself a regular expression) and ends in ``suffix``: ``.<name>.<12 hex>.tmp<suffix>``,
    what a kill during the write leaves beside it."""
    return rf"\.{name}\.[0-9a-f]{{12}}\.tmp{re.escape(suffix)}"


@contextlib.contextmanager
def atomic_path(path, what: str | None = None):
    """Yield a fresh temporary path beside ``path``; on success it is renamed onto ``path``, on
    failure removed. Unique per call, so threads and processes writing one file do not collide.
    A new file gets the usual permissions (0666 less the umask), and a file it replaces keeps its
    own, as ``open`` gives them. A write the system refuses (a full disk, a file-size limit) is an
    :class:`OrtrainError` naming ``what`` (the argument) and ``path``."""
    path = checked_target(path, what or "path")
    handled = sys.exc_info()[1]  # a save inside `except KeyboardInterrupt:` reports its own failure
    suffix = path.suffix if len(os.fsencode(path.suffix)) <= _SUFFIX_MAX else ""
    # ".<name>.<12 hex>.tmp<suffix>": 18 bytes and the suffix beyond the name, which a name near the file
    # system's limit has no room for
    short = len(os.fsencode(path.name)) + 18 + len(os.fsencode(suffix)) > name_max(path.parent)
    while True:
        # the same suffix: writers such as onnx.save choose the format by it (atomic_temporaries reads
        # this name, which a name near the file system's limit leaves out)
        stem = _SHORT_STEM if short else path.name
        tmp = path.parent / f".{stem}.{secrets.token_hex(6)}.tmp{suffix}"
        try:
            held = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:  # a folder that cannot be written
            raise OrtrainError(f"{what or 'path'}: cannot write {str(path)!r}: {exc.strerror or exc}; choose a "
                               "folder you can write to") from None
        except BaseException:  # an interrupt as os.open returned: the file made, its descriptor not kept
            _drop_made(tmp)
            raise
    try:
        locked = _locked(held)  # while the write lasts: a temporary nobody holds was left by a kill
        if locked:
            _remove_left_behind(path, tmp)
        yield str(tmp)
        if not locked:  # no POSIX locks (Windows): an open file would stop the rename
            os.close(held)
            held = None
        with contextlib.suppress(OSError):  # a file replaced keeps its permissions (0600 stays 0600), as a
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) & 0o777)  # write clears set-id bits
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        interrupt = _interrupt_behind(exc, handled)
        if interrupt is not None:  # the writer's cleanup failed on the interrupted write (zipfile's "Can't close")
            raise interrupt from None
        if isinstance(exc, OSError):  # numpy's short write ("6000 requested and 992 written") has no errno
            raise OrtrainError(f"{what + ': ' if what else ''}cannot write {str(path)!r}: {exc.strerror or exc}; a "
                               f"file already there is left as it was. {write_advice(exc.errno)}") from exc
        raise
    finally:
        if held is not None:
            os.close(held)


def _interrupt_behind(exc: BaseException, handled: BaseException | None) -> KeyboardInterrupt | None:
    """The interrupt (Ctrl-C) that ``exc`` was raised while handling, if any: what the user asked for.
    Not one the caller was already handling when the write began (``handled``, where the chain of
    contexts goes on from)."""
    seen = set()
    while exc is not None and exc is not handled and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def _drop_made(path) -> None:
    """Remove ``path`` and close this process's descriptors of it (where ``/proc`` lists them):
    what an interrupt between a call that made the file and the assignment of its result leaves."""
    target = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                if os.readlink(f"/proc/self/fd/{fd}") == target:
                    os.close(int(fd))
    with contextlib.suppress(OSError):
        os.remove(path)


@contextlib.contextmanager
def scratch_dir(prefix: str = "ortrain-scratch-"):
    """A private (0700) temporary directory, removed on exit. Named before it is made, so that an
    interrupt (Ctrl-C) as it is made or removed leaves nothing behind (``tempfile.mkdtemp``'s
    name is lost to an interrupt that comes as it returns). Locked while in use; the prefix is not
    that of earlier versions (``ortrain-``), whose folders are not locked in use and so are never
    taken for ones a killed process left."""
    parent = tempfile.gettempdir()
    _remove_scratch_left_behind(parent, prefix)
    held = None
    while True:
        path = os.path.join(parent, f"{prefix}{secrets.token_hex(8)}")
        try:
            os.mkdir(path, 0o700)
            held = _held_dir(path)  # while it is in use: one nobody holds was left by a kill
            break
        except FileExistsError:
            continue
        except BaseException:
            _remove_tree(path)  # an interrupt after mkdir made it
            if held is not None:
                os.close(held)
            raise
    try:
        yield Path(path)
    finally:
        try:
            _remove_tree(path)
        finally:
            if held is not None:
                os.close(held)
            _forget_swept(path)


def _forget_swept(path: str) -> None:
    """Drop a removed folder (and those in it) from the folders looked through: each fit makes a new
    scratch folder, and a process of many fits kept a name per fit for good."""
    inside = os.path.abspath(path) + os.sep
    for folder in list(_SWEPT):  # (a copy made at once, as other threads may add to it)
        if isinstance(folder, str) and (folder + os.sep).startswith(inside):
            _SWEPT.discard(folder)


def _held_dir(path: str) -> int | None:
    """A descriptor of directory ``path`` locked exclusively, or None where it cannot be locked."""
    if not CAN_LOCK:
        return None
    fd = os.open(path, os.O_RDONLY)
    if not _locked(fd):
        os.close(fd)
        return None
    return fd


def _remove_scratch_left_behind(parent: str, prefix: str) -> None:
    """Remove the scratch directories that processes killed while using them left in ``parent`` (a
    checkpoint's size each): those of this user no process holds locked and none changed for a
    minute (one just made is locked a moment later). Once per folder and process."""
    key = ("scratch", os.path.abspath(parent), prefix)
    if key in _SWEPT or not CAN_LOCK:
        return
    _SWEPT.add(key)
    named = re.compile(re.escape(prefix) + r"[0-9a-f]{16}")
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not named.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or \
                        now - info.st_mtime < LEFT_BEHIND_AFTER_S:
                    continue
                fd = os.open(entry.path, os.O_RDONLY)
                try:
                    if _locked(fd):
                        _remove_files(entry.path)
                finally:
                    os.close(fd)


def _remove_tree(path) -> None:
    try:
        _remove_files(path)
    except BaseException:  # an interrupt midway: finish, then let it through
        _remove_files(path)
        raise


def _remove_files(path) -> None:
    """Remove a scratch directory (private: nobody else can link into it) without
    ``shutil.rmtree``, which in Python 3.11 closes a directory's descriptor twice when an interrupt
    lands as it closes it: the interrupt became ``OSError: Bad file descriptor``, and in a threaded
    program the second close can close a file another thread has just opened."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            entry = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if name in dirs and not os.path.islink(entry):
                    os.rmdir(entry)
                else:
                    os.unlink(entry)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _locked(fd: int) -> bool:
    """Lock ``fd`` exclusively where the file system can (not every one does: Lustre without
    ``flock``, some FUSE and CIFS mounts), saying whether it did."""
    if not CAN_LOCK:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
    except OSError:
        return False
    return True


_SUFFIX_MAX = 16  # bytes of a suffix a temporary's name repeats
_SHORT_STEM = "ortrain-temporary"  # stands for a name too long to repeat

LEFT_BEHIND_AFTER_S = 60.0  # a temporary untouched this long and unlocked is no write in progress


_SWEPT: set = set()  # folders (and scratch folders) this process has looked through already
# atomic_path's, of any file: ".<name>.<12 hex>.tmp<the name's suffix>" (none where that is longer than
# _SUFFIX_MAX bytes), or for a name near the file system's limit ".ortrain-temporary.<12 hex>.tmp<suffix>"
_ANY_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp(?P<suffix>\.[^.]+)?")


def _is_temporary(name: str) -> bool:
    """Whether ``name`` is one ``atomic_path`` gives a temporary: its suffix repeats the suffix of the
    file it stands for (``.m.onnx.<hex>.tmp.onnx``), which a user's ``.notes.<hex>.tmp.txt`` lacks."""
    match = _ANY_TEMPORARY.fullmatch(name)
    if match is None:
        return False
    if match["name"] == _SHORT_STEM:
        return True
    own = Path(match["name"]).suffix
    return (match["suffix"] or "") == (own if len(os.fsencode(own)) <= _SUFFIX_MAX else "")


def _remove_left_behind(path: Path, own: Path) -> None:
    """Remove the temporaries in ``path``'s folder that writes killed midway left (a full-size hidden
    file per kill, which nothing else removes): those no process holds locked and none wrote to for
    a minute (a write that has just created its temporary has not locked it yet). Once per folder and
    process: listing a folder of 100,000 files takes 0.1 s, and a kill's leftovers date from
    before this process (its own writes remove theirs)."""
    folder = os.path.abspath(path.parent)
    if folder in _SWEPT:
        return
    _SWEPT.add(folder)
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            if entry.name == own.name or not _is_temporary(entry.name):
                continue
            with contextlib.suppress(OSError):
                if not entry.is_file(follow_symlinks=False) or \
                        now - entry.stat(follow_symlinks=False).st_mtime < LEFT_BEHIND_AFTER_S:
                    continue  # a link, a pipe or a folder of that name is none of ours
                handle = lock_file(Path(entry.path), wait=False)
                if handle is not None:
                    try:
                        os.remove(entry.path)
                    finally:
                        handle.close()


def write_advice(code: int | None) -> str:
    """What to do about a write the system refused with ``errno`` ``code`` (None: unknown)."""
    if code in (errno.EFBIG,):
        return ("The file is larger than this process may write (ulimit -f) or the file system holds: raise the "
                "limit or choose another folder")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "Choose a folder you can write to"
    if code == errno.EBUSY:  # a mount point, which a rename cannot replace
        return "The path is a mount point or held by the system, which cannot be replaced: choose a folder inside it"
    return "Free space or choose another folder"


def lock_file(path: Path, wait: bool = True):
    """``path`` opened and locked exclusively (POSIX ``flock``): the open handle, which holds the
    lock until closed, or None when ``wait`` is false and another process holds it. A holder may
    remove the file while it holds the lock (so none is left behind); a process that was waiting
    on the removed file then locks a fresh one instead."""
    while True:
        handle = open(path, "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle
        except FileNotFoundError:
            pass
        handle.close()  # that file was removed while this process waited
