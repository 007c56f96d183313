"""kplan.runtime: the library inside every training worker (contract: kplan/runtime/API.md).

Names are imported lazily, so ``kplan.runtime.env`` (used by the launcher) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kplan.runtime.builtin_policies import GoodputBatch as GoodputBatch
    from kplan.runtime.builtin_policies import StragglerReplace as StragglerReplace
    from kplan.runtime.config import RuntimeConfig as RuntimeConfig
    from kplan.runtime.distributed import Context as Context
    from kplan.runtime.distributed import init as init
    from kplan.runtime.gns import GnsEstimator as GnsEstimator
    from kplan.runtime.job import Job as Job
    from kplan.runtime.lr_scaling import LrScaler as LrScaler
    from kplan.runtime.pid import BatchController as BatchController
    from kplan.runtime.pid import PidConfig as PidConfig
    from kplan.runtime.policy import Actions as Actions
    from kplan.runtime.policy import Monitor as Monitor
    from kplan.runtime.policy import Policy as Policy
    from kplan.runtime.sampler import GlobalBatchSampler as GlobalBatchSampler
    from kplan.runtime.step_end import Preempted as Preempted

_EXPORTS = {
    "Actions": "kplan.runtime.policy",
    "BatchController": "kplan.runtime.pid",
    "Context": "kplan.runtime.distributed",
    "GlobalBatchSampler": "kplan.runtime.sampler",
    "GnsEstimator": "kplan.runtime.gns",
    "GoodputBatch": "kplan.runtime.builtin_policies",
    "Job": "kplan.runtime.job",
    "LrScaler": "kplan.runtime.lr_scaling",
    "Monitor": "kplan.runtime.policy",
    "PidConfig": "kplan.runtime.pid",
    "Policy": "kplan.runtime.policy",
    "Preempted": "kplan.runtime.step_end",
    "RuntimeConfig": "kplan.runtime.config",
    "StragglerReplace": "kplan.runtime.builtin_policies",
    "init": "kplan.runtime.distributed",
}

__all__ = [
    "Actions",
    "BatchController",
    "Context",
    "GlobalBatchSampler",
    "GnsEstimator",
    "GoodputBatch",
    "Job",
    "LrScaler",
    "Monitor",
    "PidConfig",
    "Policy",
    "Preempted",
    "RuntimeConfig",
    "StragglerReplace",
    "init",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kplan.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
