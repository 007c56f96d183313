"""Issue 27 item 4: the ledger records each node's disk, the job's storage and the data's egress
as rows of their own kind (state schema 2, migrated from 1), the guard counts them (a job whose
egress would cross the budget is stopped before it spends it, on the fake clock) and the report
shows spend by kind."""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from kplan.launcher import state as state_mod
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.ledger import Costs
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import LedgerRow, StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir
from tests.test_launcher_state import _job

_ids = itertools.count()
BILLING = Billing("aws", 60.0, 1.0, "test")
INTERVAL = 30.0
PRICE = 3.6  # USD per hour per node: $0.001 a second
COSTS = Costs(disk_usd_node_h=0.36, storage_usd_h=0.72, egress_usd=1.5)


@pytest.fixture
def db_dir(tmp_path: Path) -> Iterator[Path]:
    path = fast_dir(tmp_path, "costs")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(tmp_path: Path, db: StateDB, budget: float, costs: Costs) -> tuple[str, str, JobSpec]:
    """A two-node job on the fake clock that finishes after 10 checks."""
    clock = FakeClock()
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    storage = LocalStorage(tmp_path / "store")
    storage.uri = "s3://bucket/kplan"
    provider = SimProvider(clock, storage, finish_at=clock.now() + 10 * INTERVAL)
    nodes = tuple(NodeSpec(r, "g4dn.xlarge", "on-demand", "zone-a", 1, PRICE) for r in (0, 1))
    spec = JobSpec.build(
        job_id=f"kp-costs-{next(_ids)}",
        cloud="aws",
        region="r",
        script=str(script),
        nodes=nodes,
        budget_usd=budget,
        offers=(ZoneOffer("g4dn.xlarge", "zone-a", "on-demand", PRICE),),
        check_interval_s=INTERVAL,
        grace_s=0.0,
        teardown_s=INTERVAL,
        provision_timeout_s=400.0,
        finish_grace_s=INTERVAL,
        disk_usd_node_h=costs.disk_usd_node_h,
        storage_usd_h=costs.storage_usd_h,
        egress_usd=costs.egress_usd,
    )
    outcome = run_job(spec, Backend(provider, storage), db, clock=clock, billing=BILLING)
    job = db.job(spec.job_id)
    assert job is not None and provider.alive() == []
    return outcome.status, job.reason or "", spec


def test_disks_storage_and_egress_are_lines_of_their_own(tmp_path: Path, db_dir: Path) -> None:
    with StateDB.open(db_dir / "kplan.db") as db:
        status, _, spec = _run(tmp_path, db, budget=10.0, costs=COSTS)
        assert status == "succeeded"
        rows = db.ledger(spec.job_id)
        kinds = {
            k: [r for r in rows if r.kind == k] for k in ("instance", "disk", "storage", "egress")
        }
        assert len(kinds["instance"]) == len(kinds["disk"]) == 2
        assert [r.usd for r in kinds["egress"]] == [COSTS.egress_usd]
        assert all(r.closed for r in rows)
        for inst in kinds["instance"]:  # the disk is billed with its instance
            disk = next(r for r in kinds["disk"] if r.instance == f"{inst.instance}/disk")
            assert (disk.start, disk.end, disk.billed_seconds) == (
                inst.start,
                inst.end,
                inst.billed_seconds,
            )
            assert disk.usd == pytest.approx(inst.billed_seconds * COSTS.disk_usd_node_h / 3600)
        (store,) = kinds["storage"]
        assert store.usd == pytest.approx(
            (store.end - store.start) * COSTS.storage_usd_h / 3600
        ) and store.end >= max(r.end for r in kinds["instance"])
        assert db.spend(spec.job_id) == pytest.approx(sum(r.usd for r in rows))
        assert db.spend(spec.job_id) <= spec.budget_usd


def test_the_guard_stops_a_job_whose_egress_would_cross_the_budget(
    tmp_path: Path, db_dir: Path
) -> None:
    """The same job runs to the end without the egress; with it, the guard stops it before
    launching anything (the egress is committed by the launch), and nothing is spent."""
    budget = 1.0  # the cluster and its disks for the run: about $0.8; the egress $1.5 more
    with StateDB.open(db_dir / "kplan.db") as db:
        status, _, spec = _run(tmp_path, db, budget, Costs(0.36, 0.72, 0.0))
        assert status == "succeeded" and db.spend(spec.job_id) <= budget
        status, reason, spec = _run(tmp_path, db, budget, COSTS)
        assert (status, reason) == ("stopped", "budget")
        rows = db.ledger(spec.job_id)
        assert not [r for r in rows if r.kind in ("instance", "disk", "egress")], rows
        assert db.spend(spec.job_id) == 0.0
        guard = [e for e in db.events(spec.job_id) if e.kind == "guard"]
        assert guard and "would exceed the budget" in guard[0].message


def test_an_old_state_file_is_migrated_and_its_rows_survive(tmp_path: Path) -> None:
    path = tmp_path / "kplan.db"
    conn = sqlite3.connect(path)
    conn.executescript(state_mod._SCHEMA_V1)
    conn.execute("PRAGMA user_version=1")
    conn.execute(
        "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        ("kp-old-1", "succeeded", None, "aws", "r", "{}", None, 5.0, None, None, None, None,
         None, None, 1.0, 2.0),
    )  # fmt: skip
    conn.execute(
        'INSERT INTO ledger (job, instance, start, "end", billed_seconds, usd, closed) '
        "VALUES ('kp-old-1', 'i-1', 1.0, 61.0, 60.0, 0.06, 1)"
    )
    conn.commit()
    conn.close()
    with StateDB.open(path, readonly=True) as db:  # read-only: version 1 as it is
        assert db.ledger("kp-old-1") == [
            LedgerRow("kp-old-1", "i-1", 1.0, 61.0, 60.0, 0.06, True, "instance")
        ]
    with StateDB.open(path) as db:
        assert db.ledger("kp-old-1")[0].kind == "instance" and db.spend("kp-old-1") == 0.06
        db.put_ledger(LedgerRow("kp-old-1", "egress", 2.0, 2.0, 0.0, 1.0, True, "egress"))
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == state_mod.SCHEMA_VERSION == 2


def test_a_state_file_of_this_kplan_reopens_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "kplan.db"
    rows = [
        LedgerRow("kp-state-1", "i-1", 100.0, 160.0, 60.0, 0.06, True, "instance"),
        LedgerRow("kp-state-1", "i-1/disk", 100.0, 160.0, 60.0, 0.001, True, "disk"),
        LedgerRow("kp-state-1", "storage", 100.0, 170.0, 70.0, 0.002, False, "storage"),
    ]
    with StateDB.open(path) as db:
        db.create_job(_job())
        for r in rows:
            db.put_ledger(r)
    with StateDB.open(path) as db:
        assert db.ledger("kp-state-1") == rows
    with StateDB.open(path, readonly=True) as db:
        assert db.ledger("kp-state-1") == rows


def test_report_shows_spend_by_kind(
    tmp_path: Path, db_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kplan.cli.render.report import render_report
    from kplan.launcher.report import build_report
    from kplan.launcher.report_html import money, section

    with StateDB.open(db_dir / "kplan.db") as db:
        _, _, spec = _run(tmp_path, db, budget=10.0, costs=COSTS)
        job = db.job(spec.job_id)
        assert job is not None
        report = build_report(db, job, job.updated_at, storage_note="not read in this test")
        total = db.spend(spec.job_id)
    assert list(report.by_kind) == ["instance", "disk", "storage", "egress"]
    assert report.by_kind["egress"] == COSTS.egress_usd
    assert sum(report.by_kind.values()) == pytest.approx(total, rel=1e-12)
    assert sum(report.by_instance.values()) == pytest.approx(report.by_kind["instance"])
    assert report.to_dict()["by_kind"] == report.by_kind
    line = "by kind: " + ", ".join(f"{k} {money(v)}" for k, v in report.by_kind.items())
    assert line in section(report)
    render_report(report)
    assert line in capsys.readouterr().out


def test_a_launch_takes_the_plans_extras_as_the_jobs_costs(tmp_path: Path) -> None:
    """kplan estimate --data-gb ... --out, then kplan launch --plan: the job's disk, storage and
    egress rates give back the plan's extras at its hours; the dry run's first check counts the
    egress."""
    import json

    from typer.testing import CliRunner

    from kplan.app.launching import LaunchRequest, build_spec
    from kplan.cli.main import app
    from kplan.planner.plan import Plan

    plan_file, script = tmp_path / "plan.json", tmp_path / "train.py"
    script.write_text("print('hi')\n")
    runner = CliRunner()
    est = ["estimate", "-e", "yolov3", "--cloud", "aws", "--on-demand", "--top", "2"]
    data = ["--data-gb", "100", "--data-region", "us-central1", "--out", str(plan_file)]
    assert runner.invoke(app, [*est, *data]).exit_code == 0
    row = Plan.from_dict(json.loads(plan_file.read_text())).chosen
    spec = build_spec(LaunchRequest(script, 500.0, plan_file=plan_file))
    x = row.extras
    assert spec.costs.egress_usd == x.egress_usd == pytest.approx(100 * 0.12)
    assert spec.costs.disk_usd_node_h * row.nodes * row.hours == pytest.approx(x.disk_usd)
    assert spec.costs.storage_usd_h * row.hours == pytest.approx(x.storage_usd)
    res = runner.invoke(
        app, ["launch", str(script), "--plan", str(plan_file), "--budget", "500", "--dry-run",
              "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["first_check_usd"] > x.egress_usd
