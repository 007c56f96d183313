"""Load the operator-level time model (``data/op_model.json``).

The shipped file is written by ``scripts/fit_op_model.py`` (fitted on NeuSight's FP32 kernel
timings of five GPUs); ``kplan.planner.opmodel`` times an operator graph with it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from kplan.core.errors import CatalogError, DataFileError
from kplan.planner.opmodel import OpModel

SHIPPED = "data/op_model.json"


def load_op_model(path: Path | None = None) -> OpModel:
    """Read and validate an op model: ``path``, or the one shipped with kplan.

    A file that cannot be read, is not JSON or fails validation raises ``CatalogError`` naming
    it; an unknown schema raises ``SchemaVersionError``.
    """
    if path is None:
        name = f"kplan.catalogs/{SHIPPED}"
        hint = "the shipped op model is damaged: reinstall kplan"
        try:
            text = resources.files("kplan.catalogs").joinpath(SHIPPED).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CatalogError(f"cannot read {name}: {err}", hint=hint) from None
    else:
        name = str(path)
        hint = "re-create it with scripts/fit_op_model.py, or omit it to use the shipped one"
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CatalogError(f"cannot read op model {name}: {err}", hint=hint) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CatalogError(
            f"{name}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})", hint=hint
        ) from None
    try:
        return OpModel.from_dict(doc, source=name)
    except DataFileError as err:
        raise CatalogError(err.message, hint=hint) from None
