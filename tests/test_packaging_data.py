"""kplan's wheel builds without setuptools warnings and ships every data file (issue 12: the
data folders, importable as namespace packages but absent from ``packages``, made setuptools
print a screen of "Package 'kplan.catalogs.data' is absent from the `packages` configuration"
on every install)."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

from kplan.launcher.wheel import _copy_tree, build_command

REPO = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = {".csv", ".json", ".txt"}


def test_the_wheel_builds_without_warnings_and_ships_every_data_file(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    _copy_tree(REPO, src)
    cmd = [c for c in build_command(src, out) if c != "--quiet"]  # the backend's own output
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    proc = subprocess.run(
        cmd, check=False, cwd=src, env=env, capture_output=True, text=True, timeout=300
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "Successfully built kplan" in log or "Saved" in log, log
    assert "Warning" not in log and "absent from the `packages`" not in log, log
    (wheel,) = out.glob("kplan-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    data = {
        str(path.relative_to(src))
        for path in (src / "kplan").rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (path.suffix in DATA_SUFFIXES or path.name == "py.typed")
    }
    # what the planner, the catalog loader and the examples read at run time
    assert {
        "kplan/catalogs/data/prices.csv",
        "kplan/catalogs/data/spot_model.json",
        "kplan/planner/examples/imagenet-resnet50.json",
        "kplan/planner/traces/p3.csv",
        "kplan/examples/data/lighthouse.txt",
        "kplan/py.typed",
    } <= data
    assert data - names == set()
    assert "kplan/examples/data/README.md" in names
