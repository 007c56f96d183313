"""What ``kplan check`` reports: one line per check, ok, a problem (with a hint) or a note.

The clouds' checks live beside their providers (``providers/aws_check.py``,
``providers/gcp_check.py``); this module holds the record they return and the checks that need
no cloud (which SDKs are installed).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "problem", "note"]


@dataclass(frozen=True)
class CheckLine:
    """One check: ``problem`` stops a launch on ``scope``; ``note`` is worth knowing but does
    not (a quota the API does not report, an SDK only ``kplan profile`` needs)."""

    scope: str  # "aws", "gcp" or "kplan" (this machine)
    name: str  # e.g. "credentials", "quota G/VT spot"
    level: Level
    detail: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        return {
            "scope": self.scope,
            "check": self.name,
            "level": self.level,
            "detail": self.detail,
            "hint": self.hint,
        }


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (loads only its parent packages)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        return False


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def sdk_line(scope: str, module: str, dist: str, hint: str, *, needed: bool = True) -> CheckLine:
    """Whether the SDK ``module`` (distribution ``dist``) is installed: a problem when the
    checks of ``scope`` need it, else a note."""
    if installed(module):
        return CheckLine(scope, f"sdk {dist}", "ok", f"{dist} {_version(dist)}")
    return CheckLine(scope, f"sdk {dist}", "problem" if needed else "note", "not installed", hint)


def torch_line() -> CheckLine:
    """torch on this machine: the nodes install their own, so only ``kplan profile`` and local
    launches need it here."""
    return sdk_line(
        "kplan",
        "torch",
        "torch",
        "pip install torch (kplan profile and local launches need it; cloud nodes install "
        "their own)",
        needed=False,
    )


def ready(lines: list[CheckLine], scope: str) -> bool:
    """No problem among the lines of ``scope``."""
    return not any(line.level == "problem" for line in lines if line.scope == scope)


def image_line(scope: str, image: str, described: str = "") -> CheckLine:
    """The nodes' image and its Python (kplan/catalogs/images.py): ok when it fits, a note when
    the bootstrap must bring Python 3.11 (or cannot tell offline)."""
    from kplan.catalogs.images import image_python

    info = image_python(scope, image, described)
    level: Level = "ok" if info.fits else "note"
    hint = "" if info.fits else "an --image with python3 >= 3.11 saves the nodes that install"
    return CheckLine(scope, "image", level, info.summary(), hint)
