"""Files only their owner can read: checkpoints, metrics, logs and the job's storage.

Checkpoints hold the model and the optimizer, metrics and logs the script's output and
arguments: kplan creates them ``0600`` in folders it creates ``0700``, whatever the umask.
Folders and files that already exist keep their modes (they may be the user's own).
Imported by the runtime and by the launcher's local provider and storage; no torch here.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
UMASK = 0o077  # for child processes (the local provider's agents and the bootstraps they run)


def make_dirs(path: Path) -> None:
    """``mkdir -p path`` with every folder it creates ``0700`` (``Path.mkdir(parents=True)``
    gives the parents the default mode)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # another process made it first
        os.chmod(folder, DIR_MODE)  # mkdir's mode is masked by the umask; this is not
    if not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder")


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT, 0600)``. A file it creates is ``0600`` (or less, by the
    umask); an existing one of this user's that grants more is tightened to ``0600``."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes) -> None:
    """Create or truncate ``path`` as ``0600`` and write ``data`` (no fsync, no rename)."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
