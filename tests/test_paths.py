"""``$KPLAN_HOME``: one function finds it and refuses a file where a folder must be."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core.errors import InputError
from kplan.core.paths import kplan_home


def test_home_follows_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPLAN_HOME", f" {tmp_path / 'new' / 'home'}\n")  # need not exist yet
    assert kplan_home() == tmp_path / "new" / "home"
    monkeypatch.setenv("KPLAN_HOME", "  ")  # blank: unset
    assert kplan_home() == Path.home() / ".kplan"


@pytest.mark.parametrize("below", ["", "sub/folder"])
def test_a_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, below: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("KPLAN_HOME", str(afile / below) if below else str(afile))
    with pytest.raises(InputError) as caught:
        kplan_home()
    assert str(afile) in caught.value.message
    assert "KPLAN_HOME" in caught.value.hint


@pytest.mark.parametrize("argv", [["status"], ["catalog", "list", "--json"]])
def test_the_cli_says_one_line_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("KPLAN_HOME", str(afile))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"error: KPLAN_HOME={afile} is a file, not a folder"
    assert lines[1].startswith("hint: point KPLAN_HOME at a folder")
