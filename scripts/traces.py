"""Load the Pollux T4 traces (../shared/data/traces/pollux/t4) and split them by the protocol.

Protocol (issue 2): fit on placements ``1``, ``2``, ``4``, ``44`` and ``4444`` at every batch size
(what a profiler can afford); predict every other row of placements.csv and all of
scalability.csv (6 to 16 nodes). g4dn.12xlarge: 4 T4 per node, 50 Gbit/s NIC.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

MODELS = ("cifar10", "imagenet", "bert", "deepspeech2", "yolov3", "ncf")
FIT_PLACEMENTS = ("1", "2", "4", "44", "4444")


def data_root() -> Path:
    """The shared data folder: $KPLAN_SHARED_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("KPLAN_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass(frozen=True)
class Rows:
    """Measured configurations as parallel arrays (one entry per row)."""

    nodes: NDArray[np.int64]
    workers: NDArray[np.int64]
    max_per_node: NDArray[np.int64]  # most GPUs on one node of the placement
    local_batch: NDArray[np.int64]
    step_time: NDArray[np.float64]
    sync_time: NDArray[np.float64]
    placement: tuple[str, ...]  # digit string, or "S<nodes>x<workers>" for scalability rows

    def __len__(self) -> int:
        return len(self.step_time)

    def select(self, mask: NDArray[np.bool_]) -> Rows:
        idx = np.flatnonzero(mask)
        return Rows(
            self.nodes[idx],
            self.workers[idx],
            self.max_per_node[idx],
            self.local_batch[idx],
            self.step_time[idx],
            self.sync_time[idx],
            tuple(self.placement[i] for i in idx),
        )

    def concat(self, other: Rows) -> Rows:
        """These rows followed by ``other``'s."""
        return Rows(
            np.concatenate([self.nodes, other.nodes]),
            np.concatenate([self.workers, other.workers]),
            np.concatenate([self.max_per_node, other.max_per_node]),
            np.concatenate([self.local_batch, other.local_batch]),
            np.concatenate([self.step_time, other.step_time]),
            np.concatenate([self.sync_time, other.sync_time]),
            self.placement + other.placement,
        )


def _rows(records: list[tuple[int, int, int, int, float, float, str]]) -> Rows:
    n, k, g, b, t, s, p = zip(*records, strict=True)
    return Rows(
        np.array(n, dtype=np.int64),
        np.array(k, dtype=np.int64),
        np.array(g, dtype=np.int64),
        np.array(b, dtype=np.int64),
        np.array(t, dtype=float),
        np.array(s, dtype=float),
        tuple(p),
    )


def load_placements(model: str, root: Path | None = None) -> Rows:
    path = (root or data_root()) / "traces" / "pollux" / "t4" / model / "placements.csv"
    records = []
    with path.open() as f:
        for r in csv.DictReader(f):
            digits = [int(c) for c in r["placement"]]
            records.append(
                (
                    len(digits),
                    sum(digits),
                    max(digits),
                    int(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                    r["placement"],
                )
            )
    return _rows(records)


def load_scalability(model: str, root: Path | None = None) -> Rows:
    path = (root or data_root()) / "traces" / "pollux" / "t4" / model / "scalability.csv"
    records = []
    with path.open() as f:
        for r in csv.DictReader(f):
            n, k = int(r["num_nodes"]), int(r["num_replicas"])
            records.append(
                (
                    n,
                    k,
                    -(-k // n),
                    int(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                    f"S{n}x{k}",
                )
            )
    return _rows(records)


def split(model: str, root: Path | None = None) -> tuple[Rows, Rows]:
    """(fit rows, test rows) for one model by the protocol above."""
    placements = load_placements(model, root)
    fit_mask = np.array([p in FIT_PLACEMENTS for p in placements.placement])
    test = placements.select(~fit_mask)
    return placements.select(fit_mask), test.concat(load_scalability(model, root))


def mape(pred: NDArray[np.float64], true: NDArray[np.float64]) -> float:
    """Mean absolute percentage error, in percent."""
    return float(np.mean(np.abs(pred - true) / true) * 100.0)
