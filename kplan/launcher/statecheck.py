"""Checks on the state database file before kplan writes to it.

``StateDB.open`` calls :func:`check_state_file` first: the file must be a regular file that
SQLite recognises, hold kplan's tables (or none: a new database) and pass ``PRAGMA
quick_check``. The check uses a read-only connection, so a foreign or damaged file is refused
exactly as it was found (no switch to WAL, no schema written, no mode changed).
This module imports nothing from ``state.py``, which imports it: :class:`StateError`, the base
of every state-database failure, is defined here.
:func:`connect_readonly` serves the commands that only read (status, logs, report): they work in
a read-only KPLAN_HOME and never offer to move a healthy database away.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import urllib.parse
from pathlib import Path

from kplan.core.errors import InputError, KplanError

SQLITE_MAGIC = b"SQLite format 3\x00"
# Files (device, inode) whose header this process has read. SQLite's POSIX locks belong to the
# process, and closing ANY descriptor of the file drops them all (sqlite.org/howtocorrupt.html,
# 2.2): once a connection may be open, the header is never read with a descriptor of our own
# again, or a second ``StateDB.open`` in a process would release the first connection's locks
# and let other processes' writers corrupt the file.
_HEADER_READ: set[tuple[int, int]] = set()
KPLAN_TABLES = frozenset({"jobs", "instances", "events", "ledger"})


class StateError(KplanError):
    """The state database cannot be opened or is from a newer kplan."""


class StateFileError(StateError, InputError):
    """The state database file is not kplan's, or is damaged (exit code 2)."""


def _hint(path: Path) -> str:
    return (
        f"move {path} away (or point KPLAN_HOME elsewhere); `kplan down JOB --cloud C "
        "--region R` still finds a job's instances by its tag"
    )


def _uri(path: Path, **params: str) -> str:
    query = urllib.parse.urlencode(params)
    return f"file:{urllib.parse.quote(str(path.absolute()))}?{query}"


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection (``mode=ro``; ``immutable=1`` when a read-only folder keeps
    SQLite from creating the WAL index). Raises ``sqlite3.Error``."""
    try:
        conn = sqlite3.connect(_uri(path, mode="ro"), uri=True, isolation_level=None)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as err:
        if "unable to open" not in str(err) and "readonly" not in str(err):
            raise
    return sqlite3.connect(_uri(path, immutable="1"), uri=True, isolation_level=None)


def check_state_file(path: Path) -> None:
    """Refuse, without modifying it, a ``path`` that is not a usable kplan state database.

    A missing or empty file passes (a new database)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise StateError(
            f"cannot read the state database {path}: {err.strerror}",
            hint="check KPLAN_HOME and the folder's permissions",
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise StateFileError(f"the state database {path} is not a regular file", hint=_hint(path))
    if st.st_size == 0:
        return
    if (st.st_dev, st.st_ino) not in _HEADER_READ:
        _check_header(path)
        _HEADER_READ.add((st.st_dev, st.st_ino))
    _check_content(path)


def connected(path: Path) -> None:
    """Note that this process now holds a connection to ``path``: from here on its header is
    not read with a descriptor of our own (``_HEADER_READ``)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    _HEADER_READ.add((st.st_dev, st.st_ino))


def _check_header(path: Path) -> None:
    """The file starts with SQLite's magic (read before this process connects to it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as err:
        raise StateError(
            f"cannot read the state database {path}: {err.strerror}",
            hint="check the file's permissions",
        ) from None
    if head != SQLITE_MAGIC:
        raise StateFileError(f"{path} is not a kplan state database (not SQLite)", _hint(path))


def _check_content(path: Path) -> None:
    """kplan's tables (or none) and a passing ``quick_check``, through a read-only connection."""
    try:
        conn = connect_readonly(path)
    except sqlite3.OperationalError as err:  # cannot open: permissions, a vanished folder
        raise StateError(
            f"cannot read the state database {path}: {err}",
            hint="check the file's and the folder's permissions",
        ) from None
    except sqlite3.DatabaseError as err:  # "file is not a database": a damaged header page
        raise StateFileError(f"the state database {path} is damaged ({err})", _hint(path)) from None
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if (tables or version) and not tables >= KPLAN_TABLES:
            raise StateFileError(
                f"{path} is not a kplan state database (a different SQLite file)", _hint(path)
            )
        check = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        if check != "ok":
            raise StateFileError(
                f"the state database {path} is damaged ({' '.join(str(check).split())[:120]})",
                _hint(path),
            )
    except sqlite3.DatabaseError as err:
        raise StateFileError(f"the state database {path} is damaged ({err})", _hint(path)) from None
    finally:
        conn.close()


def open_readonly(path: Path, schema: str) -> sqlite3.Connection:
    """A read-only connection to a checked ``path``; an in-memory empty database (``schema``)
    when there is no database yet, so that `kplan status` lists no jobs."""
    conn: sqlite3.Connection | None = None
    try:
        if path.is_file() and path.stat().st_size > 0:
            conn = connect_readonly(path)
            connected(path)
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if not names >= KPLAN_TABLES:
                conn.close()
                conn = None
        if conn is None:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(schema)
    except sqlite3.Error as err:
        raise StateError(
            f"cannot read the state database {path}: {err}",
            hint="check the file's and the folder's permissions",
        ) from None
    conn.row_factory = sqlite3.Row
    return conn
