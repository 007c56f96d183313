"""Read a fitted model file (the device model, the op model): ``path``, or the one shipped with
kplan, checked by the model's own ``from_dict``.

A file that cannot be read, is not JSON or fails validation raises ``CatalogError`` naming it
(the model's ``from_dict`` raises ``SchemaVersionError`` for an unknown schema version).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TypeVar

from kplan.core.errors import CatalogError, DataFileError

T = TypeVar("T")


def load_model_file(
    path: Path | None,
    shipped: str,
    what: str,
    fit_script: str,
    from_dict: Callable[..., T],
) -> T:
    """``what`` (e.g. "device model") from ``path`` or ``kplan.catalogs/<shipped>``;
    ``fit_script`` is what re-creates a user's file; ``from_dict(doc, source=...)`` validates."""
    if path is None:
        name = f"kplan.catalogs/{shipped}"
        hint = f"the shipped {what} is damaged: reinstall kplan"
        try:
            text = resources.files("kplan.catalogs").joinpath(shipped).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CatalogError(f"cannot read {name}: {err}", hint=hint) from None
    else:
        name = str(path)
        hint = f"re-create it with {fit_script}, or omit it to use the shipped one"
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CatalogError(f"cannot read {what} {name}: {err}", hint=hint) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CatalogError(
            f"{name}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})", hint=hint
        ) from None
    try:
        return from_dict(doc, source=name)
    except DataFileError as err:
        raise CatalogError(err.message, hint=hint) from None
