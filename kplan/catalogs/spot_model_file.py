"""The spot model file: the shipped ``kplan/catalogs/data/spot_model.json`` or a user's.

``kplan.planner.spot`` is the model (pure: ``SpotModel.from_dict`` validates a parsed document);
this module reads the file. The shipped model is fitted by ``scripts/fit_spot_model.py``.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path

from kplan.core.errors import DataFileError
from kplan.planner.spot import MODEL_FILE, SpotModel


def load_spot_model(path: Path | None = None) -> SpotModel:
    """The shipped model (or the file at ``path``)."""
    if path is None:
        text = resources.files("kplan.catalogs").joinpath("data", MODEL_FILE).read_text("utf-8")
        label = MODEL_FILE
    else:
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            raise DataFileError(
                f"cannot read spot model {path}: {exc.strerror}", hint="check the path"
            ) from None
        label = str(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(
            f"{label} is not JSON ({exc.msg}, line {exc.lineno})",
            hint="refit with: python -m scripts.fit_spot_model",
        ) from None
    if not isinstance(doc, dict):
        raise DataFileError(f"{label} is not a JSON object", hint="refit it")
    return SpotModel.from_dict(doc, label)


@functools.cache
def shipped_spot_model() -> SpotModel:
    """The shipped model, read once per process (a ``SpotModel`` is immutable)."""
    return load_spot_model(None)
