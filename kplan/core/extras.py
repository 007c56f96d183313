"""Optional extras a command needs (``pip install 'kplan[EXTRA]'``), checked before it starts.

The planner installs with no torch, no cloud SDK, no scikit-learn and no matplotlib
(``scripts/setup.sh``). A command that needs one of them checks for it here first, so that a
user without it gets one line naming the extra and the command that installs it (exit code 2),
not ``internal error: ModuleNotFoundError`` or a job whose workers crash on ``import torch``.
The check finds the module without importing it (``importlib.util.find_spec``: no torch
import on the launcher's side).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from kplan.core.errors import InputError

# The torch build the tests and the CPU set-up use; an unpinned install pulls a CUDA build
# (several GB).
TORCH_PIN = "torch==2.13.0"


@dataclass(frozen=True)
class Extra:
    """One optional extra: the module that shows it is installed and how to install it."""

    module: str
    what: str
    install: str


# The hints install from kplan's own folder (``-e '.[extra]'``), never ``kplan[extra]`` by
# name: kplan is on no package index, and a package of that name on one is someone else's.
EXTRAS: dict[str, Extra] = {
    "torch": Extra(
        "torch",
        "PyTorch",
        f"scripts/setup.sh torch  (or, in kplan's folder, pip install -e '.[torch]' {TORCH_PIN})",
    ),
    "fit": Extra(
        "sklearn",
        "scikit-learn",
        "scripts/setup.sh fit  (or, in kplan's folder, pip install -e '.[fit]')",
    ),
    "report": Extra(
        "matplotlib",
        "matplotlib",
        "scripts/setup.sh report  (or, in kplan's folder, pip install -e '.[report]')",
    ),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be found; imports nothing but its parent packages."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        return False


def require_extra(command: str, extra: str) -> None:
    """:class:`InputError` (exit code 2) unless ``extra`` (a key of :data:`EXTRAS`) is
    installed: ``kplan COMMAND needs PyTorch (the torch extra)`` and how to install it."""
    spec = EXTRAS[extra]
    if not installed(spec.module):
        raise InputError(f"kplan {command} needs {spec.what} (the {extra} extra)", spec.install)


def require_torch(command: str) -> None:
    """:func:`require_extra` for torch: ``profile``, a local ``launch``."""
    require_extra(command, "torch")
