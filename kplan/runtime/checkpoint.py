"""Atomic checkpoints shared by all workers, RNG state, and the SIGTERM (spot notice) flag.

Layout under the checkpoint directory::

    latest                 text: the name of the newest complete checkpoint
    step-000000120/        one complete checkpoint
        state.pt           model, optimizer, extras, runtime state (written by rank 0)
        rank-00000.pt      per-worker state: RNG generators (one file per rank)

Commit protocol: every rank writes its files into ``.step-N.tmp-<attempt>/`` (each file as
temp + fsync + rename), all ranks meet at a barrier, then rank 0 renames the directory to
``step-N`` (atomic), fsyncs, and replaces ``latest`` the same way. A crash at any point leaves
the previous checkpoint intact; leftovers are removed at the next commit. The directory must be
shared by all ranks (shared storage across nodes); a rank whose file is missing on resume
re-seeds its generators deterministically instead.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NotRequired, TypedDict

import numpy as np
import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.core.errors import JobError
from kplan.runtime.private import make_dirs, open_private

LATEST = "latest"
STATE_FILE = "state.pt"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Any], None]) -> int:
    """Write ``path`` via a temp file in the same directory: write, flush, fsync, rename.

    Returns the number of bytes written.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        size = tmp.stat().st_size
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return size


def torch_save_atomic(obj: object, path: Path) -> int:
    return atomic_write(path, lambda handle: torch.save(obj, handle))


def load(path: Path, map_location: torch.device | str = "cpu") -> Any:
    """Load a checkpoint file with ``weights_only=True`` (no arbitrary code on unpickling)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for corrupt or unsafe files
        raise JobError(
            f"cannot load checkpoint {path}: {type(err).__name__}: {str(err).splitlines()[0]}",
            "extras must hold only tensors, numbers, strings, lists and dicts; "
            "delete the checkpoint directory to start over",
        ) from err


# --- RNG --------------------------------------------------------------------------------------


class RngState(TypedDict):
    """The global generators' states in a rank's checkpoint file (tensors and plain values:
    what ``torch.load(weights_only=True)`` reads back)."""

    python: tuple[Any, ...]  # random.getstate()
    numpy: list[Any]  # [bit generator name, keys (a tensor), position]
    numpy_gauss: list[Any]  # [has a cached gaussian (0/1), the cached value]
    torch: torch.Tensor
    cuda: NotRequired[list[torch.Tensor]]


def capture_rng() -> RngState:
    """The states of python's, numpy's and torch's (CPU and CUDA) global generators."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: RngState = {
        "python": random.getstate(),
        "numpy": [str(name), torch.from_numpy(np.asarray(keys).copy()), int(pos)],
        "numpy_gauss": [int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: RngState) -> None:
    """Restore what :func:`capture_rng` captured."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    name, keys, pos = state["numpy"]
    has_gauss, cached = state["numpy_gauss"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- the store --------------------------------------------------------------------------------


class CheckpointStore:
    """Saves and finds checkpoints in ``root`` for one rank."""

    def __init__(self, root: Path, rank: int, attempt: int = 0, keep: int = 2) -> None:
        self.root = root
        self.rank = rank
        self.attempt = attempt
        self.keep = max(1, keep)

    def _tmp(self, step: int) -> Path:
        return self.root / f".{step_dir_name(step)}.tmp-{self.attempt}"

    def save(
        self,
        step: int,
        shared: object | None,
        local: object,
        barrier: Callable[[], None],
    ) -> tuple[Path, int]:
        """Write this rank's part (``shared`` only on rank 0), then commit on rank 0. Both are
        what ``torch.save`` writes (resume.py builds them).

        Every rank must call this at the same step. Returns the final path and bytes written.
        """
        tmp = self._tmp(step)
        make_dirs(tmp)  # 0700, files 0600: a checkpoint holds the model
        size = 0
        if shared is not None:
            size += torch_save_atomic(shared, tmp / STATE_FILE)
        size += torch_save_atomic(local, tmp / rank_file(self.rank))
        barrier()
        final = self.root / step_dir_name(step)
        if self.rank == 0:
            self._commit(tmp, final)
        return final, size

    def _commit(self, tmp: Path, final: Path) -> None:
        if final.exists():  # the same step saved again after a restart: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(self.root)
        atomic_write(self.root / LATEST, lambda h: h.write(final.name.encode()))
        done = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".step-*.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)

    def latest(self) -> Path | None:
        """The newest committed checkpoint, or None."""
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text().strip()
        if not (path / STATE_FILE).is_file():
            raise JobError(
                f"checkpoint pointer {pointer} names {path}, which has no {STATE_FILE}",
                "the checkpoint directory was damaged; remove it to start over",
            )
        return path


# --- SIGTERM ----------------------------------------------------------------------------------


class SigtermFlag:
    """Turns SIGTERM (a spot-interruption notice) into a flag read at the end of each step.

    A second SIGTERM while the first is pending restores the previous handler and delivers
    the signal again, so a worker stuck outside the loop still dies.
    """

    def __init__(self) -> None:
        self.requested = False
        self.received_at: float | None = None
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            previous = signal.SIG_DFL if self._previous is None else self._previous
            signal.signal(signal.SIGTERM, previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            self.uninstall()
            os.kill(os.getpid(), signum)
            return
        self.requested = True
        self.received_at = time.time()
