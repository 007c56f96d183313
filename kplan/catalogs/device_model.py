"""Load the cross-device compute-speed model (``data/device_model.json``).

The shipped file is written by ``scripts/fit_device_model.py``; the planner's
``kplan.planner.devices`` uses it to scale a profiled compute time to other GPU types.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from kplan.core.errors import CatalogError, DataFileError
from kplan.planner.devices import DeviceModel

SHIPPED = "data/device_model.json"


def load_device_model(path: Path | None = None) -> DeviceModel:
    """Read and validate a device model: ``path``, or the one shipped with kplan.

    A file that cannot be read, is not JSON or fails validation raises ``CatalogError`` naming
    it; an unknown major schema version raises ``SchemaVersionError``.
    """
    if path is None:
        name = f"kplan.catalogs/{SHIPPED}"
        hint = "the shipped device model is damaged: reinstall kplan"
        try:
            text = resources.files("kplan.catalogs").joinpath(SHIPPED).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CatalogError(f"cannot read {name}: {err}", hint=hint) from None
    else:
        name = str(path)
        hint = "re-create it with scripts/fit_device_model.py, or omit it to use the shipped one"
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CatalogError(f"cannot read device model {name}: {err}", hint=hint) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CatalogError(
            f"{name}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})", hint=hint
        ) from None
    try:
        return DeviceModel.from_dict(doc, source=name)
    except DataFileError as err:
        raise CatalogError(err.message, hint=hint) from None
