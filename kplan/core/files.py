"""Reading and writing user files with clear errors (the CLI's file boundary).

Every user file is read through ``read_user_text``: a regular file only (a FIFO, a device or a
folder is refused before it is opened for reading), at most ``MAX_FILE_BYTES`` (64 MiB), UTF-8.
JSON documents are also capped at ``MAX_JSON_DEPTH`` levels of nesting (checked by a scan
before parsing, so no recursion limit is ever hit), reject ``NaN``/``Infinity`` and integers of
``2**53`` or more, and floats beyond ``MAX_JSON_NUMBER``. Each refusal is one line plus a hint
(exit code 2).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kplan.core.errors import DataFileError, InputError

MAX_FILE_BYTES = 64 * 1024 * 1024  # CSV and JSON inputs
MAX_JSON_DEPTH = 64  # nesting levels of objects and arrays
MAX_JSON_INT = 2**53  # integers must be below this (exact in a float)
MAX_JSON_NUMBER = 1e15  # |float| bound: no field kplan reads is near it
MAX_CSV_ROWS = 100_000


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_regular(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> int:
    """Stat ``path`` (following links): a regular file of at most ``limit`` bytes; its size."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}", hint="check the path") from None
    except (OSError, ValueError) as err:
        raise DataFileError(f"{path}: cannot read ({err})", hint="check the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataFileError(
            f"{path}: the {what} is {_kind(st.st_mode)}, not a regular file",
            hint=f"give the path of a {what} file",
        )
    if st.st_size > limit:
        raise DataFileError(
            f"{path}: the {what} is {st.st_size:,} bytes, more than the {limit:,} allowed",
            hint=f"is this the right file? a {what} is far smaller",
        )
    return st.st_size


def check_folder_files(folder: Path | None, what: str) -> None:
    """Every entry of ``folder`` (a catalog) is a regular file within the size cap: a FIFO, a
    device or a giant file planted there would otherwise hang or swamp every reader."""
    if folder is None or not folder.is_dir():
        return
    for entry in sorted(folder.iterdir()):
        if not entry.name.startswith("."):
            try:
                check_regular(entry, what)
            except DataFileError as err:
                raise DataFileError(
                    err.message, hint=f"remove it from {folder} (or the folder itself)"
                ) from None


def read_user_text(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The text of a user file: regular, at most ``limit`` bytes, UTF-8; a byte-order mark
    that opens it (a spreadsheet's "CSV UTF-8") is dropped: it made a CSV's first column
    ``\ufeffnodes`` ("missing column(s) nodes") and a JSON file "not JSON"."""
    check_regular(path, what, limit)
    try:
        # O_NONBLOCK: should the path turn into a FIFO between the stat and the open, the open
        # does not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise DataFileError(
            f"{path}: cannot read ({err.strerror})", hint="check the file"
        ) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataFileError(f"{path}: not a regular file", hint=f"give a {what} file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise DataFileError(
            f"{path}: the {what} is more than the {limit:,} bytes allowed",
            hint=f"is this the right file? a {what} is far smaller",
        )
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise DataFileError(
            f"{path}: not UTF-8 text (byte {err.start})", hint=f"the {what} must be a text file"
        ) from None


def json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


class _BadNumber(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 16 or abs(int(text)) >= MAX_JSON_INT:
        raise _BadNumber(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is too large")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_JSON_NUMBER:
        raise _BadNumber(f"number {text[:24]} is out of range")
    return value


def _parse_constant(text: str) -> float:
    raise _BadNumber(f"{text} is not a number kplan accepts")


def parse_json(text: str, source: str, what: str) -> Any:
    """Parse a JSON document with the depth and number limits above."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise DataFileError(
            f"{source}: JSON nested more than {MAX_JSON_DEPTH} levels deep",
            hint=f"the {what} is a shallow document; is this the right file?",
        )
    try:
        return json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as err:
        raise DataFileError(
            f"{source}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
            hint=f"the {what} must be a JSON document",
        ) from None
    except _BadNumber as err:
        raise DataFileError(
            f"{source}: {err} (numbers must be finite, |x| <= {MAX_JSON_NUMBER:g}, "
            f"integers < 2**53)",
            hint=f"fix the {what}",
        ) from None
    except (ValueError, RecursionError) as err:
        raise DataFileError(f"{source}: not valid JSON ({err})", hint="check the file") from None


def read_json(path: Path, what: str) -> Any:
    return parse_json(read_user_text(path, what), str(path), what)


def _stat_or_none(path: Path, flag: str) -> os.stat_result | None:
    """``os.stat(path)``; None when nothing is there; one line for a path no stat can take."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(
            f"cannot write {flag} {str(path)[:200]}: {reason}", hint="check the path"
        ) from None


def _same_path(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same inode where both exist (a link, a symlink),
    else the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        try:
            return os.path.realpath(a) == os.path.realpath(b)
        except (OSError, ValueError):
            return False


def check_writable(path: Path, flag: str, inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Refuse an output path that is a folder, whose name is too long (over ``NAME_MAX`` bytes
    a component, 255 on Linux), or whose folder cannot take a new file; and one that names a
    file of ``inputs`` (``(flag, path)`` each: what the command reads, or another of its
    outputs), which writing would overwrite."""
    for what, other in inputs:
        if _same_path(path, other):
            raise InputError(
                f"{flag} {str(path)[:200]} is also {what}: writing it would overwrite that file",
                hint=f"give {flag} another file name",
            )
    try:
        limit = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):  # no such folder (yet), or no limit to ask for
        limit = 255
    for part in path.parts:
        if len(os.fsencode(part)) > limit:
            raise InputError(
                f"{flag}: the name {part[:40]!r}... is {len(os.fsencode(part))} bytes, more "
                f"than the {limit} a file or folder name may have here",
                hint="give a shorter file name",
            )
    st = _stat_or_none(path, flag)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(f"{flag} {path} is a folder", hint="give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InputError(f"{flag} {path} is not a regular file", hint="give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    pst = _stat_or_none(parent, flag)
    if pst is not None and not stat.S_ISDIR(pst.st_mode):
        raise InputError(f"{flag} {path}: {parent} is not a folder", hint="check the path")
    if pst is not None:  # probe: can a file be made there (permissions, a read-only mount)?
        try:
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name[:40]}.probe.")
        except OSError as err:
            raise InputError(
                f"cannot write {flag} {path}: {err.strerror or err}",
                hint="choose a writable folder",
            ) from None
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)


def write_atomic(path: Path, text: str, flag: str = "--out") -> None:
    """Write a file atomically (temp file in the same folder, fsync, rename)."""
    check_writable(path, flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.")
    except OSError as err:
        raise InputError(
            f"cannot write {flag} {path}: {err.strerror or err}",
            hint="choose a writable folder",
        ) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(
            f"cannot write {flag} {path}: {err.strerror or err}",
            hint="choose a writable folder with free space",
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, doc: Any, flag: str = "--out") -> None:
    write_atomic(path, json.dumps(doc, indent=1) + "\n", flag)


def read_csv_rows(
    path: Path, required: Sequence[str], optional: Sequence[str], what: str
) -> list[dict[str, str]]:
    """Rows of a CSV with the required columns; unknown columns are an error (typos)."""
    text = read_user_text(path, what)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise DataFileError(
                f"{path}: missing column(s) {', '.join(missing)}",
                hint=f"required columns: {', '.join(required)}; optional: {', '.join(optional)}",
            )
        unknown = [c for c in header if c not in required and c not in optional]
        if unknown:
            shown = ", ".join(repr(c[:40]) for c in unknown[:5])
            raise DataFileError(
                f"{path}: unknown column(s) {shown}",
                hint=f"allowed columns: {', '.join([*required, *optional])}",
            )
        if len(set(header)) != len(header):
            raise DataFileError(f"{path}: a column appears twice", hint="fix the header")
        rows = []
        for r in reader:
            rows.append({k.strip(): (v or "").strip() for k, v in r.items() if k})
            if len(rows) > MAX_CSV_ROWS:
                raise DataFileError(
                    f"{path}: more than {MAX_CSV_ROWS:,} rows", hint=f"is this the {what}?"
                )
    except csv.Error as err:
        raise DataFileError(f"{path}: cannot read CSV ({err})", hint="check the file") from None
    if not rows:
        raise DataFileError(f"{path}: no data rows", hint=f"the {what} needs at least one row")
    return rows


def cell_number(
    row: dict[str, str],
    col: str,
    path: Path,
    line: int,
    *,
    integer: bool = False,
    positive: bool = True,
    upper: float = MAX_JSON_NUMBER,
    lower: float = 0.0,
    lower_hint: str = "fix the row",
) -> float:
    """A numeric cell: finite, > 0 (or >= 0), in [``lower``, ``upper``], an integer if asked."""
    text = row.get(col, "")
    try:
        value = float(text) if len(text) <= 64 else math.nan
    except ValueError:
        raise DataFileError(
            f"{path}, line {line}: {col}={text[:40]!r} is not a number", hint="fix the row"
        ) from None
    if not math.isfinite(value) or (positive and value <= 0) or (not positive and value < 0):
        raise DataFileError(
            f"{path}, line {line}: {col}={text[:40]!r} must be "
            f"{'> 0' if positive else '>= 0'} (a finite number)",
            hint="fix the row",
        )
    if value > upper:
        raise DataFileError(
            f"{path}, line {line}: {col}={text[:40]!r} is more than {upper:g}", hint="fix the row"
        )
    if value < lower:
        raise DataFileError(
            f"{path}, line {line}: {col}={text[:40]!r} is less than {lower:g}", hint=lower_hint
        )
    if integer and value != int(value):
        raise DataFileError(
            f"{path}, line {line}: {col}={text!r} must be an integer", hint="fix the row"
        )
    return value
