"""Load the cross-device compute-speed model (``data/device_model.json``).

The shipped file is written by ``scripts/fit_device_model.py``; the planner's
``kplan.planner.devices`` uses it to scale a profiled compute time to other GPU types.
"""

from __future__ import annotations

from pathlib import Path

from kplan.catalogs.model_file import load_model_file
from kplan.planner.devices import DeviceModel

SHIPPED = "data/device_model.json"


def load_device_model(path: Path | None = None) -> DeviceModel:
    """Read and validate a device model: ``path``, or the one shipped with kplan.

    A file that cannot be read, is not JSON or fails validation raises ``CatalogError`` naming
    it; an unknown major schema version raises ``SchemaVersionError``.
    """
    return load_model_file(
        path,
        SHIPPED,
        "device model",
        "scripts/fit_device_model.py",
        DeviceModel.from_dict,
    )
