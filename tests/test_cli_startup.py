"""A run of one command registers only that command (kplan/cli/main.py ``build_app``): its help
and its errors are the whole CLI's, and the other commands' modules are not imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kplan.cli import main as cli

RUNNER = CliRunner()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["estimate", "--example", "x"], "estimate"),
        (["--debug", "status"], "status"),
        (["catalog", "list"], "catalog"),
        (["--help"], None),
        ([], None),
        (["estimat"], None),  # not a command: the whole CLI says so, with its suggestions
        (["--", "estimate"], None),
    ],
)
def test_the_invoked_command_is_found(args: list[str], expected: str | None) -> None:
    assert cli._invoked(args) == expected


def test_completion_needs_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_KPLAN_COMPLETE", "complete_bash")
    assert cli._invoked(["estimate"]) is None


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "--help"],
        ["launch", "--help"],
        ["down", "--help"],
        ["model", "fit", "--help"],
        ["catalog", "--help"],
        ["estimate", "--bogus"],
        ["simulate"],
    ],
)
def test_one_command_helps_and_fails_as_the_whole_cli(args: list[str]) -> None:
    whole = RUNNER.invoke(cli.app, args)
    alone = RUNNER.invoke(cli.build_app(cli._invoked(args)), args)
    assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)
    assert whole.output.strip()


def test_the_whole_cli_lists_every_command_in_order() -> None:
    names = [info.name for info in cli.app.registered_commands]
    groups = [info.name for info in cli.app.registered_groups]
    assert [*names, *groups] == list(cli._COMMANDS)


def test_a_run_of_estimate_imports_no_other_command() -> None:
    code = (
        "import sys\n"
        "from kplan.cli.main import main\n"
        "sys.argv = ['kplan', 'estimate', '--list-examples']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('kplan.cli.commands.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "['kplan.cli.commands.estimate']"
