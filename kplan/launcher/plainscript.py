"""Whether a training script uses the kplan runtime, read from its source before a launch.

A script that never imports ``kplan.runtime`` (nor a built-in example, which does) writes no
step records: kplan runs it as plain torchrun/DDP and can measure only what it sees from
outside (the wall clock, the instances, the ledger). The check reads the script and the other
``.py`` files of its folder (the code a cloud launch packs), so a helper module that imports the
runtime counts; a file that does not parse is searched as text.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from kplan.core.errors import InputError

RUNTIME_PACKAGES = ("kplan.runtime", "kplan.examples")
MAX_FILES = 300  # .py files read beside the script (a huge folder: the rest are not read)
_SKIP_DIRS = {"__pycache__", "site-packages", "node_modules", "venv", "env"}
PLAIN_NOTE = (
    "plain script: no per-worker batch sizes, no GNS; time and spend from the wall clock and "
    "the ledger"
)
NOT_MEASURED = (
    "not measured: {script} does not use the kplan runtime (a plain torchrun script writes no "
    "step records), so no steps, step times, per-worker batch sizes or GNS; time and spend "
    "come from the wall clock and the ledger"
)


def _runtime_name(name: str) -> bool:
    return name == "kplan" or any(name == p or name.startswith(p + ".") for p in RUNTIME_PACKAGES)


def source_uses_runtime(source: str) -> bool:
    """Whether ``source`` imports the kplan runtime (``import kplan``, ``kplan.runtime...``,
    ``kplan.examples...``) or names it as text (an ``importlib`` call)."""
    if any(p in source for p in RUNTIME_PACKAGES):
        return True
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return "kplan" in source
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(_runtime_name(alias.name) for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(_runtime_name(n) for n in names):
                return True
    return False


def _folder_files(script: Path) -> list[Path]:
    files: list[Path] = []
    for root, dirs, names in os.walk(script.parent):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        files += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
        if len(files) >= MAX_FILES:
            break
    return files[:MAX_FILES]


def uses_runtime(script: str | Path) -> bool | None:
    """Whether the script (or a ``.py`` file beside it) uses the kplan runtime; None when the
    script cannot be read (the static check cannot tell)."""
    path = Path(script)
    try:
        if source_uses_runtime(path.read_text(encoding="utf-8", errors="replace")):
            return True
    except OSError:
        return None
    for other in _folder_files(path):
        if other == path:
            continue
        try:
            if source_uses_runtime(other.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def not_measured_note(script: str | None, storage_note: str) -> str:
    """What a report says of a job with no step records: a plain script's metrics were never
    going to exist; a runtime script's are missing (``storage_note`` says where kplan looked)."""
    if script is not None and uses_runtime(script) is False:
        return NOT_MEASURED.format(script=Path(script).name)
    return (
        f"not measured: no step records ({storage_note}); a script on the kplan runtime writes "
        "them from its first step: see `kplan logs`"
    )


def refuse_runtime_flags(script: str | Path, given: list[str]) -> None:
    """InputError when flags that act through the runtime (``given``: the ones set, e.g.
    ``--adapt``) come with a script that does not use it: nothing would read them."""
    if given and uses_runtime(script) is False:
        raise InputError(
            f"{', '.join(given)} act through the kplan runtime; {Path(script).name} does not "
            "use it (a plain torchrun script)",
            hint="drop them to run the script as it is, or train with kplan.runtime.Job "
            "(kplan/runtime/API.md)",
        )
