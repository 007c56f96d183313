"""Where kplan keeps its own files: ``$KPLAN_HOME``, default ``~/.kplan``.

The state database (``kplan.db``), the journal, local jobs, cached node wheels and user
catalogs (``catalogs/``) all live under it. Every layer that needs the folder asks
:func:`kplan_home`, which checks it once: a ``KPLAN_HOME`` that names a file (or lies under one)
is refused with one line and a hint (exit code 2) before anything tries to create folders in it,
as is one that holds a control character or a byte that is not UTF-8 (SQLite's file URI, the
nodes' scripts and the terminal all need it as text) or a ``~user`` of no such user.
"""

from __future__ import annotations

import os
from pathlib import Path

from kplan.core.errors import InputError

HOME_ENV = "KPLAN_HOME"


def kplan_home() -> Path:
    """``$KPLAN_HOME`` (``~`` expanded; blank means unset) or ``~/.kplan``.

    The folder need not exist yet; raises :class:`InputError` when the path, or the nearest of
    its parents that exists, is not a folder."""
    raw = os.environ.get(HOME_ENV, "").strip()
    home = _from_env(raw) if raw else Path.home() / ".kplan"
    _check_home(home, from_env=bool(raw))
    return home


def _from_env(raw: str) -> Path:
    """``$KPLAN_HOME`` as a path: printable UTF-8 text, its ``~`` expanded."""
    fix = f"point {HOME_ENV} at a folder (or unset it for ~/.kplan)"
    if not raw.isprintable():  # a control character, or a byte that is not UTF-8 (a surrogate)
        shown = ascii(raw[:80])
        raise InputError(f"{HOME_ENV}={shown} holds a control character or non-UTF-8 byte", fix)
    try:
        return Path(raw).expanduser()
    except RuntimeError:  # "~nosuchuser/...": no home folder to expand it to
        user = raw.partition("/")[0]
        raise InputError(f"{HOME_ENV}={raw[:80]!r}: {user[:40]} names no home", fix) from None


def _check_home(home: Path, *, from_env: bool) -> None:
    named = f"{HOME_ENV}={home}" if from_env else f"kplan's home {home}"
    fix = (
        f"point {HOME_ENV} at a folder (or unset it for ~/.kplan)"
        if from_env
        else f"move {home} away, or set {HOME_ENV} to a folder"
    )
    probe = home
    while True:
        try:
            is_dir = probe.is_dir()
            exists = is_dir or probe.exists()
        except OSError as err:  # a name too long, a loop of links
            raise InputError(f"{named} cannot be used: {err.strerror}", hint=fix) from None
        if is_dir:
            return
        if exists:
            what = "is a file, not a folder" if probe == home else f"lies under the file {probe}"
            raise InputError(f"{named} {what}", hint=fix)
        if probe.parent == probe:
            return
        probe = probe.parent
