"""The layer contract (``.importlinter``, docs/architecture.md) holds, and can fail.

``lint-imports`` runs in a subprocess with ``PYTHONPATH`` at the tree it checks, so that it reads
that tree's ``kplan`` and not the one this interpreter imported. A copy of the package with one
upward import and one circle between two files of a folder must be reported on both counts; the
real tree must keep both contracts.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter: the dev extra


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(tree / ".importlinter")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_violation_in_a_copy_is_reported(tmp_path: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__")
    for package in ("kplan", "bench", "scripts"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "harness.py").write_text("import kplan\n\nK = kplan\n")
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    core = tmp_path / "kplan" / "core"
    (core / "upward.py").write_text("from kplan.cli import main\n\nMAIN = main\n")
    (core / "ring_a.py").write_text("from kplan.core import ring_b\n\nB = ring_b\n")
    (core / "ring_b.py").write_text("from kplan.core import ring_a\n\nA = ring_a\n")
    (tmp_path / "scripts" / "uses_bench.py").write_text("from bench import pollux\n\nP = pollux\n")
    (tmp_path / "bench" / "uses_tests.py").write_text("from tests import harness\n\nH = harness\n")

    result = _lint(tmp_path)

    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "kplan.core is not allowed to import kplan.cli" in out
    assert "kplan.core.upward -> kplan.cli.main" in out
    assert "No cycles are allowed in kplan.core." in out
    assert ".ring_a -> .ring_b" in out or ".ring_b -> .ring_a" in out
    assert "scripts is not allowed to import bench" in out
    assert "bench is not allowed to import tests" in out


def test_the_tree_keeps_the_contract() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def _imported_roots(path: Path) -> set[str]:
    """The module names a file imports (relative imports are resolved to ``kplan.core``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("kplan.core" if node.level else (node.module or ""))
    return names


def test_core_imports_only_itself_the_standard_library_and_numpy() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    for path in sorted((ROOT / "kplan" / "core").glob("*.py")):
        for name in _imported_roots(path):
            inside = name == "kplan.core" or name.startswith("kplan.core.")
            assert inside or name.split(".")[0] in allowed, f"{path.name} imports {name}"


def _tracked() -> list[str]:
    """``git ls-files -s`` of the checkout: mode, object, stage and path of each tracked file."""
    out = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return out.stdout.splitlines()


def test_no_symbolic_link_and_no_virtual_environment_is_tracked() -> None:
    rows = _tracked()
    assert len(rows) > 100  # the listing is the repository's, not an empty one
    links = [r.split("\t", 1)[1] for r in rows if r.startswith("120000 ")]
    venvs = [
        r.split("\t", 1)[1] for r in rows if r.endswith("/pyvenv.cfg") or r.endswith("\tpyvenv.cfg")
    ]
    assert links == [], f"symbolic links in the repository: {links}"
    assert venvs == [], f"a virtual environment is tracked: {venvs}"
