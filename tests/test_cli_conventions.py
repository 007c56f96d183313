"""CLI conventions (issue 12): every help page has examples that parse, names its values
(metavars, never ``<float>``), shows defaults one way; shell completion; one flag name per
concept; ``--budget`` only where money is spent; a closed pipe ends kplan quietly."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from kplan.cli.help_text import EXAMPLES, _move_default
from kplan.cli.main import EXIT_BROKEN_PIPE, app

runner = CliRunner()
KPLAN = Path(sys.executable).with_name("kplan")  # the console script, as a user runs it
REPO = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    """Every command path: "" (kplan itself), "estimate", "catalog", "catalog list", ..."""
    paths: list[str] = []

    def walk(path: str, command: Any) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(f"{path} {name}".strip(), sub)

    walk("", typer.main.get_command(app))
    return paths


COMMANDS = _commands()


def _help(path: str) -> str:
    result = runner.invoke(app, [*path.split(), "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def _parse(args: list[str]) -> Any:
    """Parse a command line as kplan would (options, types, required values), running nothing;
    the innermost command's context. A bad option or value raises click's UsageError."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("kplan", list(args))
    while hasattr(command, "commands"):
        rest = [*ctx._protected_args, *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def test_every_command_is_covered() -> None:
    assert {"", "estimate", "launch", "status", "catalog list", "model fit"} <= set(COMMANDS)
    assert set(COMMANDS) == set(EXAMPLES), "a command without examples, or an example too many"


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p or "kplan")
def test_help_has_examples_that_parse(path: str) -> None:
    text = _help(path)
    shown = text.split("Examples:\n", 1)[1].splitlines()
    assert [line.strip() for line in shown if line.strip()] == list(EXAMPLES[path])
    for line in EXAMPLES[path]:
        assert len(line) <= 76, f"wraps at 80 columns: {line}"
        words = shlex.split(line)
        assert words[0] == "kplan"
        if path:  # the example is of this command (or, for a group, of one of its commands)
            assert " ".join(words[1:]).startswith(path)
        _parse(words[1:])


def test_the_parse_check_refuses_what_kplan_refuses() -> None:
    import typer._click.exceptions as click_errors

    _parse(["estimate", "--example", "yolov3", "--budget", "50"])
    for bad in (
        ["estimate", "--no-such-flag"],
        ["estimate", "--budget", "fifty"],
        ["model", "fit", "--out", "m.json"],  # --measurements is required
        ["catalog", "lists"],
    ):
        with pytest.raises(click_errors.UsageError):
            _parse(bad)


def test_offline_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples that need no file, job or cloud account run as written."""
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    runnable = [
        *EXAMPLES[""][:1],
        *EXAMPLES["estimate"][:1],
        *EXAMPLES["catalog list"],
        EXAMPLES["status"][0],
        EXAMPLES["report"][1],
    ]
    for line in runnable:
        result = runner.invoke(app, shlex.split(line)[1:])
        assert result.exit_code == 0, f"{line}: {result.output}"
    assert (tmp_path / "plan.json").is_file()  # the first example wrote it for `launch --plan`


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p or "kplan")
def test_help_names_values_and_shows_defaults_one_way(path: str) -> None:
    text = _help(path)
    options = text.split("Options:", 1)[1].split("Examples:", 1)[0]
    assert not re.search(r"<(bool|int|float|str|path|list\[[^]]*\])>", text), text
    # A default is shown only as "[default: X]": no "(default ...)" or "Default: X".
    assert not re.search(r"\(default\b|\bDefault:", options), options
    for line in options.splitlines():
        flag = re.match(r"\s+(?:-\w, )?(--[\w-]+)(?: / --[\w-]+)?(\s+|$)", line)
        if flag and flag.group(1) in ("--json", "--help", "--dry-run", "--all"):
            assert line.split()[-1] != "BOOL"
            assert re.match(rf"\s+(?:-\w, )?{flag.group(1)}\s{{2,}}\S", line), line  # no metavar


def test_defaults_read_the_same_on_every_command() -> None:
    estimate, profile, launch = _help("estimate"), _help("profile"), _help("launch")
    assert "[default: 10]" in estimate  # a fixed default, written by typer
    assert "[default: the profile's]" in " ".join(estimate.split())  # a computed one, moved
    assert "[default: auto]" in profile
    assert "[default: 6]" in " ".join(launch.split())
    assert "--budget USD" in launch and "--deadline HOURS" in launch and "--out FILE" in estimate
    assert _move_default("Workers (default: 2 on CPU, min(2, GPUs)).") == (
        "Workers.  [default: 2 on CPU, min(2, GPUs)]"
    )
    assert _move_default("An image. Default: the cloud's image.") == (
        "An image.  [default: the cloud's image]"
    )
    assert _move_default("No default here.") == "No default here."


def test_one_flag_name_per_concept() -> None:
    """--example, --out (-o), --json, repeatable --cloud/--region: the same on every command
    that takes them; launch's old --example-profile still parses but is not shown."""
    for path in ("estimate", "profile", "launch"):
        assert re.search(r"-e, --example NAME", _help(path)), path
    for path in ("estimate", "profile", "model fit", "model predict"):
        assert re.search(r"-o, --out FILE", _help(path)), path
    assert "--example-profile" not in _help("launch")
    ctx = _parse(["launch", "t.py", "--example-profile", "x", "--cloud", "aws", "--cloud", "gcp"])
    assert ctx.params["example_profile"] == "x" and ctx.params["cloud"] == ["aws", "gcp"]
    ctx = _parse(["estimate", "--cloud", "aws", "--cloud", "gcp", "--region", "a", "--region", "b"])
    assert ctx.params["cloud"] == ["aws", "gcp"] and ctx.params["region"] == ["a", "b"]
    for path in COMMANDS:
        if "--json" in _help(path):
            assert re.search(r"\n  --json\s", _help(path)), path


# --- shell completion ----------------------------------------------------------------------


def _run(argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> Any:
    """A real process (kplan's console script, or bash running it); output as text."""
    assert KPLAN.is_file(), f"{KPLAN}: the console script (pip install -e .)"
    kw.setdefault("capture_output", "stdout" not in kw)
    return subprocess.run(
        argv, check=False, text=True, timeout=60, env={**os.environ, **(env or {})}, **kw
    )


def _kplan(*args: str, **env: str) -> Any:
    return _run([str(KPLAN), *args], env)


def test_completion_is_on_and_completes_commands_and_flags(tmp_path: Path) -> None:
    assert "--install-completion" in _help("") and "--show-completion" in _help("")
    # The shell is detected from the parent process: run it from bash (`; true`: no exec).
    shown = _run(["bash", "-c", f"{shlex.quote(str(KPLAN))} --show-completion; true"])
    assert "_KPLAN_COMPLETE=complete_bash" in shown.stdout, shown.stderr
    # What bash asks while the user types `kplan est<TAB>` and `kplan launch x.py --exa<TAB>`.
    words = _kplan(COMP_WORDS="kplan est", COMP_CWORD="1", _KPLAN_COMPLETE="complete_bash")
    assert words.stdout.split() == ["estimate"]
    flags = _kplan(
        COMP_WORDS="kplan launch x.py --exa", COMP_CWORD="3", _KPLAN_COMPLETE="complete_bash"
    )
    assert flags.stdout.split() == ["--example"]  # the hidden old name is not offered
    home = tmp_path / "home"
    home.mkdir()
    installed = _run(
        ["bash", "-c", f"{shlex.quote(str(KPLAN))} --install-completion; true"],
        {"HOME": str(home)},
    )
    assert installed.stdout.startswith("bash completion installed in"), installed.stderr
    assert "kplan" in (home / ".bashrc").read_text()


# --- --budget: only where money is spent ---------------------------------------------------


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def test_a_free_local_run_needs_no_budget(script: Path) -> None:
    result = runner.invoke(app, ["launch", str(script), "--nodes", "2", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert '"budget_usd": 0.0' in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cloud", "aws", "--example", "cifar10-resnet18"], "a launch on aws needs --budget"),
        (["--cloud", "gcp", "--cloud", "aws", "-e", "cifar10-resnet18"], "on gcp needs --budget"),
        (["--price", "0.5"], "give --budget too"),
    ],
)
def test_a_launch_that_costs_money_needs_a_budget(
    script: Path, args: list[str], needle: str
) -> None:
    result = runner.invoke(app, ["launch", str(script), *args, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.output


def test_a_cloud_plan_file_needs_a_budget(script: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    made = runner.invoke(
        app, ["estimate", "-e", "cifar10-resnet18", "--cloud", "aws", "-o", str(plan)]
    )
    assert made.exit_code == 0, made.output
    result = runner.invoke(app, ["launch", str(script), "--plan", str(plan), "--dry-run"])
    assert result.exit_code == 2 and "a launch on aws needs --budget" in result.stderr


# --- launch: --example and several --cloud / --region --------------------------------------


def test_launch_example_and_its_old_name(script: Path) -> None:
    import json

    base = ["launch", str(script), "--cloud", "aws", "--budget", "20", "--dry-run", "--json"]
    base += ["--job-id", "kp-261123-101500-ab12"]
    new = runner.invoke(app, [*base, "--example", "cifar10-resnet18"])
    old = runner.invoke(app, [*base, "--example-profile", "cifar10-resnet18"])
    assert new.exit_code == 0 and old.exit_code == 0, (new.output, old.output)
    assert json.loads(new.stdout)["requests"] == json.loads(old.stdout)["requests"]
    both = runner.invoke(app, [*base, "--example", "a", "--example-profile", "b"])
    assert both.exit_code == 2 and "give --example once" in both.stderr


def test_launch_plans_across_several_clouds_and_regions(script: Path) -> None:
    import json

    base = ["launch", str(script), "-e", "cifar10-resnet18", "--budget", "50", "--dry-run"]
    both = runner.invoke(app, [*base, "--cloud", "aws", "--cloud", "gcp", "--json"])
    assert both.exit_code == 0, both.output
    chosen = json.loads(both.stdout)
    estimate = runner.invoke(
        app, ["estimate", "-e", "cifar10-resnet18", "--budget", "50", "--cloud", "aws",
              "--cloud", "gcp", "--no-mixed", "--json"],
    )  # fmt: skip
    best = json.loads(estimate.stdout)["chosen"]
    assert chosen["cloud"] == best["cloud"]  # the search chose across both
    regions = ("us-east-1", "us-west-2")
    two = runner.invoke(
        app, [*base, "--cloud", "aws", "--region", regions[0], "--region", regions[1], "--json"]
    )
    assert two.exit_code == 0, two.output
    assert json.loads(two.stdout)["region"] in regions
    for bad, needle in (
        (["--cloud", "aws", "--cloud", "local"], "--cloud local is this machine"),
        (["--region", "us-east-1", "--region", "us-west-2"], "for aws or gcp"),
    ):
        result = runner.invoke(app, [*base, *bad])
        assert result.exit_code == 2 and needle in result.stderr, result.output


# --- a closed pipe: quiet, exit 141 --------------------------------------------------------

PIPED = [
    ["--help"],  # printed while parsing
    ["launch", "--help"],  # printed inside the group's invoke
    ["estimate", "--list-examples"],  # typer.echo
    ["catalog", "list"],  # a rich table
]


@pytest.mark.parametrize("args", PIPED, ids=" ".join)
def test_a_closed_pipe_ends_quietly(args: list[str], tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before kplan writes: every write fails with EPIPE
    try:
        done = _run(
            [str(KPLAN), *args], {"KPLAN_HOME": str(tmp_path)}, stdout=write, stderr=subprocess.PIPE
        )
    finally:
        os.close(write)
    assert done.returncode == EXIT_BROKEN_PIPE
    assert done.stderr == ""


def test_piping_into_head_prints_the_first_line_only(tmp_path: Path) -> None:
    for args in PIPED[1:]:
        cmd = f"{shlex.quote(str(KPLAN))} {' '.join(args)} | head -1"
        done = _run(["bash", "-o", "pipefail", "-c", cmd], {"KPLAN_HOME": str(tmp_path)}, cwd=REPO)
        assert done.returncode in (0, EXIT_BROKEN_PIPE), done.stderr
        assert done.stderr == "" and len(done.stdout.splitlines()) == 1
