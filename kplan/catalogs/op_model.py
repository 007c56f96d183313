"""Load the operator-level time model (``data/op_model.json``).

The shipped file is written by ``scripts/fit_op_model.py`` (fitted on NeuSight's FP32 kernel
timings of five GPUs); ``kplan.planner.opmodel`` times an operator graph with it.
"""

from __future__ import annotations

from pathlib import Path

from kplan.catalogs.model_file import load_model_file
from kplan.planner.opmodel import OpModel

SHIPPED = "data/op_model.json"


def load_op_model(path: Path | None = None) -> OpModel:
    """Read and validate an op model: ``path``, or the one shipped with kplan.

    A file that cannot be read, is not JSON or fails validation raises ``CatalogError`` naming
    it; an unknown schema raises ``SchemaVersionError``.
    """
    return load_model_file(
        path,
        SHIPPED,
        "op model",
        "scripts/fit_op_model.py",
        OpModel.from_dict,
    )
