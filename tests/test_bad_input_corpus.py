"""The bad-input corpus (tests/bad_input_corpus.py) through the real CLI.

Every case must end with its exit code (2 for bad input, 0 where the input is valid), print one
``error:`` line and at most one ``hint:`` line (or click's own usage error), and never a
traceback or an ``internal error``. Cases that could hang (a FIFO, a device, a read-only mount)
run in a subprocess with a timeout; the others in-process through typer's CliRunner, each with
its own ``KPLAN_HOME``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from tests.bad_input_corpus import CASES, DEEP, DELETE, DIR, FIFO, HUGE, JOB, JOB2, Case, Mut

TIMEOUT_S = 30.0
_EXAMPLE = (
    Path(__file__).resolve().parents[1] / "kplan" / "planner" / "examples" / "cifar10-resnet18.json"
)
_COMMANDS = {"estimate", "profile", "model", "launch", "status", "logs", "down", "report",
             "catalog", "simulate", "check", "attach"}  # fmt: skip


@pytest.fixture(scope="session")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Valid documents the cases mutate: a profile, a model and a plan (from kplan itself)."""
    from kplan.app import planning
    from kplan.planner.profile import profile_from_dict
    from kplan.planner.search import SearchOptions

    profile = json.loads(_EXAMPLE.read_text())
    model = dict(profile["fit"])
    prof = profile_from_dict(profile, "example")
    result = planning.estimate(prof, SearchOptions(clouds=("aws",), mixed=False, top=1))
    plan = result.plan.to_dict()
    plan["profile"], plan["catalog"] = prof.name, result.catalog.version
    fixtures = Path(__file__).parent / "fixtures"
    return {
        "profile": profile,
        "model": model,
        "plan": plan,
        "plan_v1": json.loads((fixtures / "plan_v1_yolov3_spot.json").read_text()),
        "local_plan_v1": json.loads((fixtures / "plan_v1_local.json").read_text()),
    }


@pytest.fixture(scope="session")
def job_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state database holding one finished local job (and enough events to span pages)."""
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.state import JobRecord, StateDB

    folder = tmp_path_factory.mktemp("job-db")
    script = folder / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec.local(str(script), job_id=JOB, rdzv_port=29500)
    now = time.time()
    with StateDB.open(folder / "kplan.db") as db:
        db.create_job(
            JobRecord(
                JOB, "succeeded", "done", "local", "local", spec.to_dict(), None, 0.0, None,
                None, None, None, None, None, now - 60, now,
            )
        )  # fmt: skip
        for i in range(200):
            db.add_event(JOB, now - 60 + i * 0.1, "tick", f"event {i} " + "x" * 100)
    return folder / "kplan.db"


def _doc(m: Mut, bases: dict[str, Any]) -> str:
    doc = copy.deepcopy(bases[m.base])
    marker = "__RAW_VALUE__"
    if m.path:
        parent = doc
        for key in m.path[:-1]:
            parent = parent[key]
        last = m.path[-1]
        if m.value is DELETE:
            del parent[last]
        else:
            parent[last] = marker if m.raw is not None else m.value
    for path, value in m.more:
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    text = json.dumps(doc)
    return text.replace(f'"{marker}"', m.raw) if m.raw is not None else text


def _make_files(case: Case, d: Path, bases: dict[str, Any]) -> None:
    for name, content in case.files.items():
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == FIFO:
            os.mkfifo(path)
        elif content == DIR:
            path.mkdir()
        elif content == HUGE:
            with path.open("wb") as f:
                f.truncate(65 * 1024 * 1024)
        elif content == DEEP:
            path.write_text("[" * 200_000 + "]" * 200_000)
        elif isinstance(content, Mut):
            path.write_text(_doc(content, bases))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _make_home(kind: str | None, home: Path, job_db: Path) -> None:
    home.mkdir()
    db = home / "kplan.db"
    if kind in ("job", "corrupt", "readonly", "two-jobs", "batch0"):
        shutil.copy(job_db, db)
    if kind == "batch0":  # step records of a batch of 0 (report --against divided by it)
        metrics = home / "jobs" / JOB / "metrics"
        metrics.mkdir(parents=True)
        steps = [{"step": s, "rank": 0, "loss": 1.0 / (s + 1), "global_batch": 0,
                  "step_time": 0.1, "time": 1.0 + s} for s in range(10)]  # fmt: skip
        (metrics / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    if kind == "two-jobs":  # JOB and JOB2: a prefix of both names neither
        from kplan.launcher.state import StateDB

        with StateDB.open(db) as state:
            first = state.job(JOB)
            assert first is not None
            state.create_job(replace(first, id=JOB2, created_at=first.created_at + 1))
    if kind == "corrupt":
        size = db.stat().st_size
        with db.open("r+b") as f:  # garbage over a page in the middle, the header intact
            f.seek(size // 2 - size // 2 % 4096)
            f.write(os.urandom(4096))
    elif kind == "foreign":
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE people (name TEXT)")
        conn.execute("INSERT INTO people VALUES ('ada')")
        conn.commit()
        conn.close()
    elif kind == "text":
        db.write_text("not a database\n")
    elif kind == "magic":  # SQLite's magic, then garbage
        db.write_bytes(b"SQLite format 3\x00" + os.urandom(5000))
    elif kind == "dir":
        db.mkdir()
    elif kind == "catalog-fifo":  # a user catalog (kplan catalog update) with a FIFO in it
        (home / "catalogs" / "2026-11-20").mkdir(parents=True)
        os.mkfifo(home / "catalogs" / "2026-11-20" / "prices.csv")
    elif kind == "fifo":
        os.mkfifo(db)
    elif kind == "catalog-1e300":  # the shipped catalog as a user's, p3.2xlarge at 1e300 USD/h
        folder = home / "catalogs" / "2026-11-20"
        shutil.copytree(Path(__file__).resolve().parents[1] / "kplan" / "catalogs" / "data", folder)
        prices = folder / "prices.csv"
        lines = prices.read_text().splitlines(keepends=True)
        for i, line in enumerate(lines):
            cells = line.split(",")
            if cells[:2] == ["aws", "p3.2xlarge"]:
                cells[5] = "1e300"
                lines[i] = ",".join(cells)
        prices.write_text("".join(lines))


class _Hang(BaseException):
    """Raised by SIGALRM; a BaseException so that no ``except Exception`` in kplan hides it."""


def _hang(signum: int, frame: object) -> None:
    raise _Hang


def _run(case: Case, argv: list[str], home: Path) -> tuple[int | None, str, str]:
    """(exit code or None on a timeout, stdout, stderr)."""
    if not case.sub:
        # A hang in-process (a loop over 10**7 nodes) is cut by SIGALRM and fails the case.
        previous = signal.signal(signal.SIGALRM, _hang)
        signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
        try:
            result = CliRunner().invoke(app, argv, env={"KPLAN_HOME": str(home), **case.env})
        except _Hang:
            return None, "", ""
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            return 99, result.stdout, f"{type(result.exception).__name__}: {result.exception}"
        return result.exit_code, result.stdout, result.stderr
    cmd = [sys.executable, "-c", "from kplan.cli.main import main; main()", *argv]
    if case.home == "readonly":
        mount = 'mount --bind "$H" "$H" && mount -o remount,ro,bind "$H" && exec "$@"'
        cmd = ["unshare", "-m", "sh", "-c", mount, "sh", *cmd]
    env = {**os.environ, "KPLAN_HOME": str(home), "H": str(home), **case.env}
    try:
        proc = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, "", ""
    return proc.returncode, proc.stdout, proc.stderr


def _check(case: Case, code: int | None, out: str, err: str) -> None:
    both = out + err
    assert code is not None, f"{case.id}: no answer in {TIMEOUT_S:.0f} s (a hang)"
    assert "Traceback" not in both, both
    assert "internal error" not in both, both
    assert code == case.code, f"{case.id}: exit {code}, want {case.code}\n{both}"
    if "move" in both and case.home == "readonly":
        pytest.fail(f"{case.id}: a healthy database is not to be moved away\n{both}")
    if code != 0:
        assert case.match in both, f"{case.id}: {case.match!r} not in\n{both}"
        if "Usage:" in err or "Invalid value" in err:
            return  # click's own usage error: its standard form
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) in (1, 2), f"{case.id}: want one error line (+ hint):\n{err}"
        assert lines[0].startswith("error: "), err
        assert len(lines) == 1 or lines[1].startswith("hint: "), err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_case(case: Case, tmp_path: Path, bases: dict[str, Any], job_db: Path) -> None:
    d = tmp_path / "case"
    d.mkdir()
    home = tmp_path / "home"
    _make_files(case, d, bases)
    _make_home(case.home, home, job_db)
    before = (home / "kplan.db").read_bytes() if case.home == "foreign" else b""
    argv = [a.replace("{d}", str(d)) for a in case.argv]
    code, out, err = _run(case, argv, home)
    _check(case, code, out, err)
    if case.home == "foreign":  # refused exactly as found: not switched to WAL, not written
        assert (home / "kplan.db").read_bytes() == before
        assert not (home / "kplan.db-wal").exists()


def test_corpus_covers_every_command_and_size() -> None:
    by_command = Counter(c.argv[0] for c in CASES)
    assert len(CASES) >= 300
    assert set(by_command) == _COMMANDS, by_command
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
    kinds = {c.id.split("-")[1] for c in CASES if c.id.startswith("file-")}
    assert {"estimate", "launch", "model", "report", "profile", "catalog"} <= kinds


def test_baseline_names_only_cases_of_the_corpus() -> None:
    """tests/data/bad_input_baseline.json: what 7159eeb (before issue 10) did with each case it
    got wrong, for docs/benchmarks.md; every id must still be a case here."""
    doc = json.loads((Path(__file__).parent / "data" / "bad_input_baseline.json").read_text())
    ids = {c.id for c in CASES}
    assert set(doc["results"]) <= ids
    mishandled = [k for k, v in doc["results"].items() if v in doc["mishandled_categories"]]
    assert len(mishandled) >= 77  # the fuzzing found 77; this corpus finds more
