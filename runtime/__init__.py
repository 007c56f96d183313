"""kplan.runtime: the library inside every training worker (contract: runtime/API.md).

Names are imported lazily, so ``kplan.runtime.env`` (used by the launcher) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kplan.runtime.config import RuntimeConfig as RuntimeConfig
    from kplan.runtime.distributed import Context as Context
    from kplan.runtime.distributed import init as init
    from kplan.runtime.gns import GnsEstimator as GnsEstimator
    from kplan.runtime.job import Job as Job
    from kplan.runtime.lr_scaling import LrScaler as LrScaler
    from kplan.runtime.pid import BatchController as BatchController
    from kplan.runtime.pid import PidConfig as PidConfig
    from kplan.runtime.sampler import GlobalBatchSampler as GlobalBatchSampler
    from kplan.runtime.step_end import Preempted as Preempted

_EXPORTS = {
    "BatchController": "kplan.runtime.pid",
    "Context": "kplan.runtime.distributed",
    "GlobalBatchSampler": "kplan.runtime.sampler",
    "GnsEstimator": "kplan.runtime.gns",
    "Job": "kplan.runtime.job",
    "LrScaler": "kplan.runtime.lr_scaling",
    "PidConfig": "kplan.runtime.pid",
    "Preempted": "kplan.runtime.step_end",
    "RuntimeConfig": "kplan.runtime.config",
    "init": "kplan.runtime.distributed",
}

__all__ = [
    "BatchController",
    "Context",
    "GlobalBatchSampler",
    "GnsEstimator",
    "Job",
    "LrScaler",
    "PidConfig",
    "Preempted",
    "RuntimeConfig",
    "init",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kplan.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
