"""``CSVLogger``: one CSV row per epoch, flushed as it is written."""

from __future__ import annotations

import csv
import errno
import numbers
import os

import numpy as np

from ortrain._arrays import checked_flag
from ortrain._files import atomic_path, checked_target, write_advice
from ortrain.callbacks.base import Callback
from ortrain.errors import OrtrainError

__all__ = ["CSVLogger"]

# The byte-order mark a spreadsheet writes at the start of a UTF-8 CSV file: read past, and kept.
_BOM = b"\xef\xbb\xbf"


def csv_cell(value) -> str:
    """A logged value as CSV text, as Keras' ``CSVLogger`` writes it: numbers at full precision (a
    NaN or infinite loss as ``nan``, ``inf``), a missing one (None) ``NA``, anything else a
    callback logged as its text. ``History.to_csv`` writes the same."""
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    return "NA" if value is None else str(value)


class CSVLogger(Callback):
    """Write ``epoch`` and every logged value (sorted by name) to ``filename``, one row per epoch.

    Each row is flushed when its epoch ends, and the file is closed in ``on_train_end``,
    which runs even when training fails: the file then holds every completed epoch.
    The file is UTF-8 (a byte-order mark a spreadsheet wrote is read past, and kept).
    ``append=True`` adds to an existing file (the header is written only when it is empty); a
    non-empty file whose first line is not such a header in ``separator`` (one led by ``epoch``) is
    refused before training starts, rather than given rows of another layout.
    The header names what the first epoch logs and every value the fit logs (``params["metrics"]``),
    so the ``val_`` columns are there also when ``validation_freq`` skips validation after the first
    epoch. A value the header lacks (an appending fit that validates where the file's did not, a
    value a callback logs from a later epoch on) gets a column of its own at the end: the file is
    rewritten with it, its earlier rows ``NA`` there. A missing value is ``NA`` (a logged NaN, a
    diverged loss, is ``nan``).
    """

    def __init__(self, filename, separator: str = ",", append: bool = False):
        if not isinstance(separator, str) or len(separator) != 1 or separator in '\r\n"':
            raise OrtrainError(f"CSVLogger(separator=...): expected one character other than a line break or the "
                               f"quote '\"', such as ',' or ';', received {separator!r}")
        if not isinstance(filename, (str, os.PathLike)) or not os.fspath(filename):
            raise OrtrainError(f"CSVLogger(filename=...): expected a file path such as 'log.csv', received "
                               f"{filename!r}")
        self.filename = os.fspath(filename)
        self.separator = separator
        self.append = checked_flag(append, "CSVLogger(append=...)")
        self._file = None
        self._writer = None
        self._unterminated = False
        self.keys = None

    def _check_fit(self):
        directory = os.path.dirname(os.path.abspath(self.filename))
        if not os.path.isdir(directory):
            what = "is a file, not a directory" if os.path.exists(directory) else "does not exist"
            raise OrtrainError(f"CSVLogger: directory {directory!r} of filename {what}; create it or choose "
                               "another filename")
        if os.path.isdir(self.filename):
            raise OrtrainError(f"CSVLogger: filename {self.filename!r} is a directory; give a file path such as "
                               "'log.csv'")
        target = self.filename if os.path.exists(self.filename) else directory
        if not os.access(target, os.W_OK):
            raise OrtrainError(f"CSVLogger: cannot write {self.filename!r}: {target!r} is read-only (permission "
                               f"denied); {write_advice(errno.EACCES)}")
        checked_target(self.filename, "CSVLogger(filename=...)")  # a name ending in '/', a device
        if self._has_rows() and self._header() is None:
            raise OrtrainError(self._foreign_header_message())

    def _has_rows(self) -> bool:
        """Whether ``append`` adds to a file that holds something (blank lines alone are replaced)."""
        if not (self.append and os.path.isfile(self.filename) and os.path.getsize(self.filename) > 0):
            return False
        try:
            with open(self.filename, "rb") as f:
                return any(line.removeprefix(_BOM).strip() if i == 0 else line.strip() for i, line in enumerate(f))
        except OSError:  # refused with its reason when it is opened
            return True

    def _header(self) -> list[str] | None:
        """The value columns of the file's header read with ``separator``, or None where its first row
        is not a header this logger writes (one led by ``epoch``)."""
        try:
            with open(self.filename, newline="", encoding="utf-8-sig") as f:
                first = next(csv.reader(f, delimiter=self.separator), None)
        except (OSError, UnicodeDecodeError, csv.Error):
            return None
        return first[1:] if first and first[0] == "epoch" else None

    def _foreign_header_message(self) -> str:
        try:
            with open(self.filename, encoding="utf-8-sig", errors="replace") as f:
                line = f.readline().rstrip("\r\n")
        except OSError as exc:
            line = f"<unreadable: {exc.strerror or exc}>"
        shown = line if len(line) <= 80 else line[:77] + "..."
        return (f"CSVLogger(append=True): the first line of {self.filename!r} is not a header this logger "
                f"writes: expected one led by 'epoch' and separated by {self.separator!r}, received {shown!r}. "
                "Appending would write rows (and a header) of another layout in the middle of it; give the "
                "separator the file was written with, another filename, or append=False to replace it")

    def on_train_begin(self, logs=None):
        has_rows = self._has_rows()
        self.keys = self._header() if has_rows else None
        if has_rows and self.keys is None:  # replaced since _check_fit read it
            raise OrtrainError(self._foreign_header_message())
        try:
            self._file = open(self.filename, "a" if has_rows else "w", newline="", encoding="utf-8")
        except OSError as exc:
            raise self._write_error(exc) from exc
        self._writer = csv.writer(self._file, delimiter=self.separator)
        self._header_written = has_rows and self.keys is not None
        # a file whose last row has no line break (written by hand or by another tool) gets one before
        # the first row is added, which would otherwise run on into that row
        self._unterminated = has_rows and not self._ends_with_line_break()

    def _ends_with_line_break(self) -> bool:
        with open(self.filename, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) in (b"\n", b"\r")

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.keys is None:
            self.keys = sorted(set(logs) | set(self.params.get("metrics") or ()))
        elif self._header_written:
            new = sorted((set(logs) | set(self.params.get("metrics") or ())) - set(self.keys) - {"epoch"})
            if new:
                self._widen(new)
        try:
            if self._unterminated:
                self._file.write(self._writer.dialect.lineterminator)
                self._unterminated = False
            if not self._header_written:
                self._writer.writerow(["epoch", *self.keys])
                self._header_written = True
            self._writer.writerow([epoch, *(csv_cell(logs.get(k)) for k in self.keys)])
            self._file.flush()
        except OSError as exc:  # a full disk, a size limit
            raise self._write_error(exc) from exc

    def _widen(self, new: list[str]) -> None:
        """Rewrite the file with columns ``new`` added at the end of its header (``NA`` in the rows
        written before), by a temporary file renamed over it, and go on appending to it."""
        self._file.close()
        try:
            with open(self.filename, "rb") as f:
                encoding = "utf-8-sig" if f.read(len(_BOM)) == _BOM else "utf-8"  # a BOM stays
            with open(self.filename, newline="", encoding=encoding) as f:
                rows = list(csv.reader(f, delimiter=self.separator))
            with atomic_path(self.filename, "CSVLogger(filename=...)") as tmp, \
                    open(tmp, "w", newline="", encoding=encoding) as f:
                writer = csv.writer(f, delimiter=self.separator)
                writer.writerow([*rows[0], *new])
                writer.writerows([*row, *(["NA"] * len(new))] for row in rows[1:])
            self._file = open(self.filename, "a", newline="", encoding="utf-8")
        except OSError as exc:
            raise self._write_error(exc) from exc
        self._writer = csv.writer(self._file, delimiter=self.separator)
        self.keys = [*self.keys, *new]
        self._unterminated = False  # the rewritten file ends with its last row's line break

    def _write_error(self, exc: OSError) -> OrtrainError:
        return OrtrainError(f"CSVLogger: cannot write {self.filename!r}: {exc.strerror or exc}; "
                            f"{write_advice(exc.errno)}")

    def on_train_end(self, logs=None):
        if self._file is not None:
            self._file.close()
        self._file = self._writer = None
