"""A profile's fields against each other (each field alone is checked by
``profile.profile_from_dict``): a hand-edited profile whose numbers contradict one another would
be priced as if they held."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kplan.core.errors import DataFileError

# the shortest step a measurement may claim: one kernel launch takes a few microseconds, so a
# faster "step" is a unit slip (ms or us written as seconds), which fitted a model to noise
MIN_STEP_S = 1e-6


class _Row(Protocol):
    @property
    def step_time(self) -> float: ...
    @property
    def nodes(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def gpu(self) -> str | None: ...


class _Fields(Protocol):
    """The fields of ``profile.Profile`` these checks read."""

    @property
    def dataset_size(self) -> int: ...
    @property
    def base_global_batch(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def gpu(self) -> str: ...
    @property
    def measurements(self) -> Sequence[_Row]: ...


def check_consistent(p: _Fields, source: str) -> None:
    """One line and a hint for an epoch smaller than one step's batch, or a measured row that
    claims a step faster than a kernel, puts more workers on a node than the node has GPUs
    (``device.gpus_per_node``) or names another GPU than ``device.gpu`` (it would be fitted as
    that GPU's)."""
    if p.dataset_size < p.base_global_batch:
        raise DataFileError(
            f"{source}: work.dataset_size {p.dataset_size:,} is less than "
            f"batch.base_global_batch {p.base_global_batch:,}: one step would take more samples "
            "than an epoch has",
            hint="fix the profile (the samples per epoch and the global batch it was measured at)",
        )
    for i, m in enumerate(p.measurements):
        if m.step_time < MIN_STEP_S:
            raise DataFileError(
                f"{source}: measurements[{i}]: step_time {m.step_time:g} s is less than "
                f"{MIN_STEP_S:g} s, shorter than a kernel",
                hint="step times are in seconds, e.g. 0.25",
            )
        per_node = -(-m.workers // m.nodes)  # ceil: the fullest node
        if per_node > p.gpus_per_node:
            raise DataFileError(
                f"{source}: measurements[{i}]: {m.workers} workers on {m.nodes} node(s) is "
                f"{per_node} on a node, more than device.gpus_per_node {p.gpus_per_node}",
                hint="fix the measurement or device.gpus_per_node (one worker per GPU)",
            )
        if m.gpu and _folded(m.gpu) != _folded(p.gpu):
            raise DataFileError(
                f"{source}: measurements[{i}] was measured on {m.gpu[:40]!r}, and the profile "
                f"on device.gpu {p.gpu[:40]!r}",
                hint="one profile per GPU: keep the rows of device.gpu (`kplan estimate` "
                "predicts the other GPUs from them)",
            )


def _folded(name: str) -> str:
    return name.strip().lower().replace("_", "-")
