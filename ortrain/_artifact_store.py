"""Where artifact directories live and what guards their writing: the cache folder and its
setting, the lock by which concurrent builders of one directory take turns, the refusal of folders
that cannot be written or that hold the working directory, and private scratch directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from pathlib import Path

from ortrain._files import CAN_LOCK, lock_file, name_max, not_a_folder, unexpanded_home
from ortrain._keywords import names_unknown_arguments_of
from ortrain.errors import OrtrainError

_cache_root: Path | None = None


@names_unknown_arguments_of(label="artifacts.cache_dir")
def cache_dir() -> Path:
    """Where artifacts are cached: ``set_cache_dir`` > ``$XDG_CACHE_HOME/ortrain/artifacts`` > ``~/.cache/...``."""
    if _cache_root is not None:
        return _cache_root
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG spec says to ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ortrain" / "artifacts"


@names_unknown_arguments_of(label="artifacts.set_cache_dir")
def set_cache_dir(path) -> None:
    """Use ``path`` as the artifact cache from now on (``None`` restores the default). A relative
    path is taken from the working directory now (a later ``os.chdir`` does not move the cache)."""
    global _cache_root
    if path is not None and (not isinstance(path, (str, os.PathLike)) or not os.fspath(path)):
        raise OrtrainError(f"set_cache_dir(path=...): expected a folder path or None, received {path!r}")
    home = unexpanded_home(path) if path is not None else None
    if home is not None:
        raise OrtrainError(f"set_cache_dir(path=...): {os.fspath(path)!r} {home} (the cache is unchanged)")
    if path is not None:
        above = Path(os.path.abspath(path))
        try:
            while not above.exists() and above.parent != above:  # the folder is made when first used
                above = above.parent
            is_file = above.exists() and not above.is_dir()
        except OSError as exc:  # a folder above it that may not be searched
            raise OrtrainError(f"set_cache_dir(path=...): {os.fspath(path)!r} cannot be reached ({exc.strerror or exc} "
                               f"at {str(above)!r}); give a folder this process may search and write in (the "
                               "cache is unchanged)") from None
        if is_file:
            raise OrtrainError(f"set_cache_dir(path=...): {os.fspath(path)!r} "
                               f"{'is' if above == Path(os.path.abspath(path)) else 'lies under'} the file "
                               f"{str(above)!r}, not a folder; give a folder path (the cache is unchanged)")
    _cache_root = Path(os.path.abspath(path)) if path is not None else None


_HELPER_BYTES = 18  # what the longest of them adds to the name: ".<name>.tmp-<12 hex>"


def helper_stem(target: Path) -> str:
    """The name of ``target`` as the folders and the lock file a build makes beside it repeat it
    (``publish_leftovers``): the name itself, or, where it leaves no room under the file system's
    limit on names for what they add to it, ``ortrain-<16 hex>`` of its digest, one per name."""
    name = os.fsencode(target.name)
    if len(name) + _HELPER_BYTES <= name_max(next((p for p in target.parents if p.is_dir()), ".")):
        return target.name
    return f"ortrain-{hashlib.sha256(name).hexdigest()[:16]}"


def publish_leftovers(name: str) -> str:
    """A regular expression of the folders ``artifacts._publish`` makes beside a directory whose
    ``helper_stem`` matches ``name`` (itself a regular expression): the new directory it fills,
    ``.<name>.tmp-<12 hex>`` (``fresh_dir``), and the one it moves the directory it replaces into,
    ``.<name>.old-<8 chars>`` (``tempfile.mkdtemp``). A build killed midway leaves them."""
    return rf"\.{name}\.(tmp-[0-9a-f]{{12}}|old-[a-z0-9_]{{8}})"


def _remove_leftovers(target: Path) -> None:
    """Remove what builds of ``target`` killed midway left beside it (``publish_leftovers``): with
    the lock held, no build of it runs. A kill between ``_publish``'s two renames left the previous
    directory only in ``.<name>.old-*``: it is replaced by the build in any case."""
    ours = re.compile(publish_leftovers(re.escape(helper_stem(target))))
    try:
        beside = list(target.parent.iterdir())
    except OSError:  # a folder that can be written but not listed: they stay
        return
    for path in beside:
        if ours.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


_MKDIR_ATTEMPTS = 100  # a folder that a failing builder removes under us is made again, this often at most


@contextlib.contextmanager
def _publish_lock(target: Path):
    """An exclusive lock per artifact directory, so concurrent builders of one key take turns.

    The lock file is removed by its holder before it lets go, so builds leave none behind (and a
    build that fails before anything is published also removes the folders it made). A builder
    that was waiting on a removed file sees that it is gone (another inode, or none, at the
    path) and takes the lock afresh, so two builders never work on one directory at once. Once
    it holds the lock, it removes the folders builds killed midway left (without the lock, on
    systems other than POSIX, they stay: a build running elsewhere could not be told from them).
    """
    why = not_a_folder(target)
    if why is not None and _in_cache(target):
        fix = "make it searchable" if why.startswith("cannot be reached") else "remove that file"
        raise OrtrainError(f"the artifact cache {str(cache_dir())!r} cannot hold an entry at {str(target)!r}, which "
                           f"{why}; {fix}, or choose another cache with ot.artifacts.set_cache_dir(path) "
                           "or XDG_CACHE_HOME")
    if why is not None:
        raise OrtrainError(f"out_dir: {str(target)!r} {why}; artifacts need a directory, choose another path")
    if not CAN_LOCK:  # not on POSIX: publishing stays atomic, concurrent builders may both build
        target.parent.mkdir(parents=True, exist_ok=True)
        yield
        return
    lock, made = target.parent / f".{helper_stem(target)}.lock", []
    for attempt in range(_MKDIR_ATTEMPTS):
        made += [p for p in (target.parent, *target.parent.parents) if not p.exists() and p not in made]
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle = lock_file(lock)
            break
        except FileNotFoundError as exc:  # a failing builder removed a folder just made: try again
            if attempt == _MKDIR_ATTEMPTS - 1:  # a place where folders cannot be made (under /proc)
                raise _unwritable(target, exc) from None
        except OSError as exc:  # not writable: a read-only file system, another user's folder
            raise _unwritable(target, exc) from None
    failed = False
    try:
        _remove_leftovers(target)
        yield
    except BaseException:
        failed = True
        raise
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        if failed and not target.exists():
            for folder in made:  # innermost first
                with contextlib.suppress(OSError):
                    folder.rmdir()
        handle.close()  # releases the lock


def _in_cache(target: Path) -> bool:
    return cache_dir() in target.parents


def _unwritable(target: Path, exc: OSError) -> OrtrainError:
    where = exc.filename or target.parent
    if _in_cache(target):
        return OrtrainError(f"the artifact cache {str(cache_dir())!r} cannot be written ({exc.strerror}: {str(where)!r}); "
                            "make it writable, or choose another cache with ot.artifacts.set_cache_dir(path) or "
                            "XDG_CACHE_HOME")
    return OrtrainError(f"out_dir: {str(target)!r} cannot be written ({exc.strerror}: {str(where)!r}); choose a "
                        "writable folder")


def _refuse_working_directory(target: Path) -> None:
    """Artifacts are written to a new folder renamed into place, which would leave a process
    working in ``target`` (or below it) in a deleted folder."""
    cwd = Path(os.path.realpath(os.getcwd()))
    if target == cwd or target in cwd.parents:
        raise OrtrainError(f"out_dir: {str(target)!r} is the current working directory or holds it, and artifacts "
                           "are written to a new folder renamed into its place; give a folder to create, e.g. "
                           "'artifacts'")


