"""Text a user or a job wrote reaches the terminal escaped (rich markup) and without control
characters (issue 10, item 6): a stop reason holding ``[/bold]`` used to crash ``kplan status``
and ``kplan report`` with a ``MarkupError``; ANSI escapes in a profile name were printed raw."""

from __future__ import annotations

import html
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.app import planning
from kplan.cli.main import app
from kplan.cli.render.text import safe
from kplan.core.text import clean
from kplan.launcher import providers
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from tests import launcher_fakes
from tests.launcher_fakes import SimProvider, fast_dir

NASTY = "[/bold] \x1b[31mred [link=x]"
SHOWN = "[/bold] red [link=x]"  # what must be visible
JOB = "kp-esc-1"
EXAMPLES = Path(planning.__file__).parents[1] / "planner" / "examples"


def test_clean_strips_controls_and_escape_sequences_but_keeps_text() -> None:
    text = "a\tb\nc\x1b[2J\x1b[1;31mred\x1b[0m\x1b]8;;http://x\x07link\x1b]8;;\x1b\\\rd\x00\x7f\x9b\x85é"
    assert clean(text) == "a\tb\ncredlinkdé"
    assert clean(NASTY) == SHOWN
    assert clean(42) == "42" and clean("\x1b") == "" and clean("\x1b[") == ""


def test_safe_prints_literally_through_rich() -> None:
    from rich.console import Console

    console = Console(record=True, width=200, color_system=None)
    texts = [SHOWN, "[red]x[/red]", "a\\b", "x\\[y]", "[bold", "\\[/]", "]["]
    for text in texts:
        console.print(safe(text), highlight=False)
    console.print(f"[bold]{safe('a' + chr(92))}[/bold]", highlight=False)  # a closing tag stays
    assert console.export_text().splitlines()[:-1] == texts


# --- a job with nasty text everywhere, through kplan status and kplan report ---------------------


@pytest.fixture
def nasty_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = fast_dir(tmp_path, "esc")
    monkeypatch.setenv("KPLAN_HOME", str(home))
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    clock = FakeClock(time.time() - 7200)
    storage = LocalStorage(home / "store")
    storage.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, storage, finish_at=clock.now() + 1800)
    backend = Backend(sim, storage)
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:current_backend")
    monkeypatch.setitem(launcher_fakes.CURRENT, "backend", backend)
    nodes = (NodeSpec(0, "g4dn.xlarge[/i]", "spot", "zone-\x1b[1m[/b]", 1, 0.4),)
    spec = JobSpec.build(JOB, "aws", "r[/x]", str(script), nodes, 5.0, check_interval_s=60)
    with StateDB.open() as db:
        run_job(spec, backend, db, clock=clock)
        db.set_status(JOB, "stopped", clock.now(), NASTY)
        db.add_event(JOB, clock.now(), "policy", f"policy stop: {NASTY}", None)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _ok(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "MarkupError" not in res.output
    return str(res.output)


def test_status_of_the_job_shows_the_reason_literally(nasty_job: Path) -> None:
    out = _ok("status", JOB)
    assert f"({SHOWN})" in out
    assert f"policy stop: {SHOWN}" in out
    assert "zone-[/b]" in out and "g4dn.xlarge[/i]" in out and "r[/x]" in out


def test_status_of_every_job_and_json_keep_the_text(nasty_job: Path) -> None:
    out = _ok("status")
    assert JOB in out and "r[/x]" in out
    doc = json.loads(_ok("status", JOB, "--json"))
    assert doc["reason"] == NASTY  # JSON carries the data as it is (json escapes ESC)


def test_report_shows_the_reason_literally(nasty_job: Path, tmp_path: Path) -> None:
    out = _ok("report", JOB)
    assert f"({SHOWN})" in out and "zone-[/b]" in out
    page = tmp_path / "report.html"
    _ok("report", JOB, "--html", str(page))
    text = page.read_text()
    assert "\x1b" not in text
    assert html.escape(SHOWN) in text and "[link=x]" in text
    assert "<b>[/b]" not in text


# --- a profile whose name holds ANSI escapes and markup ----------------------------------------


def test_estimate_prints_a_nasty_profile_name_without_escape_bytes(tmp_path: Path) -> None:
    example = json.loads((EXAMPLES / "cifar10-resnet18.json").read_text())
    example["name"] = "\x1b[31m[red]evil\x1b[0m\x1b]0;title\x07"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(example))
    out = _ok("estimate", "--profile", str(path), "--cloud", "aws")
    assert "[red]evil: the best plan" in out and "title" not in out


def test_errors_are_printed_without_control_characters(tmp_path: Path) -> None:
    bad = tmp_path / "\x1b[31mnope[/].json"
    res = CliRunner().invoke(app, ["estimate", "--profile", str(bad)])
    assert res.exit_code == 2, res.output
    assert "\x1b" not in res.output and "nope[/].json" in res.output
