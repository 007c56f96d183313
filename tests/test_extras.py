"""A command that needs an optional extra says so in one line, with the install command, and
exits 2 before it starts anything (issue 12: ``kplan profile`` without torch printed
``internal error: ModuleNotFoundError``; a local launch crash-looped its workers).

Each case runs the real CLI in a subprocess in which the extra's module cannot be imported
(``sys.modules[name] = None``, what Python does for a blocked import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kplan.core.errors import InputError
from kplan.core.extras import EXTRAS, TORCH_PIN, installed, require_extra

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "kplan" / "examples" / "mlp_regression.py"
# Runs `kplan ARGS` with the named modules made unimportable.
_CLI = (
    "import sys\n"
    "blocked, args = filter(None, sys.argv[1].split(',')), sys.argv[2:]\n"
    "for name in blocked:\n"
    "    sys.modules[name] = None\n"
    "from kplan.cli.main import main\n"
    "sys.argv = ['kplan', *args]\n"
    "main()\n"
)


def _kplan(
    tmp_path: Path, blocked: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KPLAN_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", _CLI, blocked, *args],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _jobs(tmp_path: Path) -> list[object]:
    out = _kplan(tmp_path, "", "status", "--json")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert isinstance(jobs, list)
    return jobs


TORCH_HINT = (
    f"hint: scripts/setup.sh torch  (or, in kplan's folder, pip install -e '.[torch]' {TORCH_PIN})"
)


def test_profile_without_torch_is_one_line_and_the_install_command(tmp_path: Path) -> None:
    out = _kplan(tmp_path, "torch", "profile", "--example", "mlp-regression", "--out", "p.json")
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "error: kplan profile needs PyTorch (the torch extra)",
        TORCH_HINT,
    ]
    assert "internal error" not in out.stderr and not (tmp_path / "p.json").exists()


def test_a_local_launch_without_torch_refuses_before_any_worker(tmp_path: Path) -> None:
    out = _kplan(tmp_path, "torch", "launch", str(SCRIPT), "--nodes", "2", "--budget", "1")
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "error: kplan launch needs PyTorch (the torch extra)",
        TORCH_HINT,
    ]
    assert _jobs(tmp_path) == []  # no job recorded, so no worker group was started


def test_a_dry_run_needs_no_torch(tmp_path: Path) -> None:
    out = _kplan(tmp_path, "torch", "launch", str(SCRIPT), "--budget", "1", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "needs PyTorch" not in out.stderr


def test_explore_without_scikit_learn_names_the_fit_extra(tmp_path: Path) -> None:
    out = _kplan(tmp_path, "sklearn", "launch", str(SCRIPT), "--budget", "0", "--explore")
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "error: kplan launch --explore needs scikit-learn (the fit extra)",
        "hint: scripts/setup.sh fit  (or, in kplan's folder, pip install -e '.[fit]')",
    ]
    assert _jobs(tmp_path) == []


def test_report_html_without_matplotlib_names_the_report_extra(tmp_path: Path) -> None:
    out = _kplan(tmp_path, "matplotlib", "report", "--all", "--html", str(tmp_path / "r.html"))
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "error: kplan report --html needs matplotlib (the report extra)",
        "hint: scripts/setup.sh report  (or, in kplan's folder, pip install -e '.[report]')",
    ]
    assert not (tmp_path / "r.html").exists()


def test_require_extra_passes_when_installed_and_names_the_module_when_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_extra("profile", "torch")  # the test venv has torch: no error
    assert installed("json") and not installed("kplan_no_such_module")
    assert not installed("kplan_no_such_package.sub")  # a missing parent is not an error
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(InputError, match=r"^kplan report --html needs matplotlib") as err:
        require_extra("report --html", "report")
    assert err.value.hint.startswith("scripts/setup.sh report")
    assert set(EXTRAS) == {"torch", "fit", "report"}


def test_every_extra_named_is_an_extra_of_pyproject() -> None:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(EXTRAS) <= set(extras)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    for name in EXTRAS:
        assert f"scripts/setup.sh {name}" in EXTRAS[name].install
        assert name in setup
