"""``kplan profile`` through the CLI: bad input (exit 2), a crashing script (exit 1)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.profiler.examples import EXAMPLES


def _invoke(*args: str) -> tuple[int, str, str]:
    runner = CliRunner()
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_missing_script_is_bad_input(tmp_path: Path) -> None:
    code, _, err = _invoke("profile", str(tmp_path / "nope.py"))
    assert code == 2
    assert "error: script" in err and "nope.py" in err and "not found" in err
    assert "Traceback" not in err


def test_not_a_python_script_is_bad_input(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")
    code, _, err = _invoke("profile", str(script), "--dataset-size", "10", "--base-batch", "2")
    assert code == 2
    assert "is not a Python script (.py)" in err
    code, _, err = _invoke("profile", str(tmp_path), "--dataset-size", "10", "--base-batch", "2")
    assert code == 2
    assert "is not a Python script" in err


def test_unknown_example_lists_the_known_ones() -> None:
    code, _, err = _invoke("profile", "--example", "gpt-17")
    assert code == 2
    assert "unknown example 'gpt-17'" in err
    for name in EXAMPLES:
        assert name in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give either a SCRIPT or --example NAME"),
        (("--example", "mlp-regression", "--workers", "0"), "--workers=0 must be >= 1"),
        (("--example", "mlp-regression", "--device", "tpu"), "--device 'tpu' is not one of"),
        (("--example", "mlp-regression", "--max-local-batch", "4", "--min-local-batch", "8"),
         "batch range 8..4 is empty"),
        (("--example", "mlp-regression", "--epochs", "0"), "--epochs=0 must be > 0"),
    ],
)  # fmt: skip
def test_bad_flags_are_bad_input(args: tuple[str, ...], message: str) -> None:
    code, _, err = _invoke("profile", *args)
    assert code == 2
    assert message in err


def test_a_script_needs_its_work_size(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, _, err = _invoke("profile", str(script))
    assert code == 2
    assert "--dataset-size and --base-batch required when profiling a script" in err


def test_crashing_script_exits_1_with_its_last_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the kept logs go
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nprint('loading data', file=sys.stderr)\n"
        "raise KeyError('no column named label')\n"
    )
    out = tmp_path / "p.json"
    code, _, err = _invoke(
        "profile", str(script), "--workers", "1", "--dataset-size", "10", "--base-batch", "2",
        "--out", str(out), "--json",
    )  # fmt: skip
    assert code == 1
    assert "error: the job failed: KeyError: 'no column named label'" in err
    assert "hint: the job's full output is in" in err
    assert not out.exists()
