"""``kplan report`` on real local jobs: a priced two-node training run that succeeds, a job the
guard stops at its budget and a job whose script fails. Each runs through the launcher's
lifecycle on the local provider (real worker processes, real ledger), then is reported through
the ``kplan`` CLI: the JSON and the page's ``data-total-usd`` must equal the ledger's sum
exactly, the terminal and the page print the same rounded figure of it."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.app.launching import free_port
from kplan.cli.main import app
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import ProviderSettings, get_backend
from kplan.launcher.report_html import money
from kplan.launcher.state import StateDB
from tests.test_provider_local import kill_leftovers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
FAST = {"check_interval_s": 0.5, "grace_s": 2.0, "teardown_s": 10.0, "finish_grace_s": 10.0}


def _run(home: Path, spec: JobSpec) -> str:
    backend = get_backend("local", ProviderSettings(home, None, None))
    with StateDB.open(home / "kplan.db") as db:
        run_job(spec, backend, db)
    return spec.job_id


def _spec(
    script: Path, job_id: str, args: tuple[str, ...], prices: list[float], **kw: float
) -> JobSpec:
    spec = JobSpec.local(
        str(script), args, nodes=len(prices), job_id=job_id, python=sys.executable,
        rdzv_port=free_port(), **{**FAST, **kw},
    )  # fmt: skip
    markets = ["spot", "on-demand"]
    nodes = tuple(
        replace(n, usd_per_hour=p, market=markets[n.node_rank % 2], zone=f"local-{n.node_rank}")
        for n, p in zip(spec.nodes, prices, strict=True)
    )
    return replace(spec, nodes=nodes, budget_usd=5.0)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("kplan-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("KPLAN_HOME", str(home))
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.setenv("KPLAN_CHECKPOINT_INTERVAL", "1")
    sleeper, failer = home / "sleep.py", home / "fail.py"
    sleeper.write_text("import time\ntime.sleep(120)\n")
    failer.write_text("raise SystemExit(3)\n")
    try:
        mlp = ROOT / "kplan" / "examples" / "mlp_regression.py"
        _run(home, _spec(mlp, "kp-rep-ok", ("--epochs", "2", "--samples", "6000"), [1.8, 0.9]))
        _run(
            home,
            replace(_spec(sleeper, "kp-rep-guard", (), [360.0], teardown_s=2.0), budget_usd=1.0),
        )
        _run(home, _spec(failer, "kp-rep-fail", (), [7.2]))
        yield home
    finally:
        mp.undo()
        kill_leftovers(home)


def _cli(home: Path, *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"KPLAN_HOME": str(home), "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(
    ("job", "status"),
    [("kp-rep-ok", "succeeded"), ("kp-rep-guard", "stopped"), ("kp-rep-fail", "failed")],
)
def test_report_totals_equal_the_ledger(home: Path, job: str, status: str) -> None:
    with StateDB.open(home / "kplan.db") as db:
        rec = db.job(job)
        assert rec is not None and rec.status == status, rec
        ledger = db.spend(job)
        rows = db.ledger(job)
    assert ledger > 0 and all(r.closed for r in rows)
    expected = money(ledger)  # the same figure in the terminal and the page

    doc = json.loads(_cli(home, "report", job, "--json"))
    assert doc["total_usd"] == ledger  # exactly: the same float
    assert doc["status"] == status
    assert sum(doc["by_instance"].values()) == pytest.approx(ledger, rel=1e-12)
    assert doc["cost_curve"][-1][1] == pytest.approx(ledger, rel=1e-12)

    page = home / f"{job}.html"
    text = _cli(home, "report", job, "--html", str(page))
    assert f"total spend (ledger): {expected}" in text
    html = page.read_text()
    assert f"<b>{expected}</b>" in html
    assert f'data-total-usd="{ledger!r}"' in html
    assert not re.search(r"(?:src|href)=\"(?:https?:)?//", html)  # self-contained
    assert "http://" not in html and "https://" not in html
    assert html.count('src="data:image/png;base64,') >= 1  # the ledger's cost curve at least


def test_report_of_a_training_run_has_metrics_and_plots(home: Path) -> None:
    doc = json.loads(_cli(home, "report", "kp-rep-ok", "--json"))
    m = doc["metrics"]
    assert m["steps"] == 2 * (6000 // 256)
    assert sorted(m["local_batch"]) == ["0", "1"]
    assert m["step_time"]["median_s"] > 0
    assert sum(b for _, b in m["global_batch"]) == 256 * len(m["global_batch"])
    assert set(doc["by_market"]) == {"spot", "on-demand"}
    assert doc["naive"]["usd"] is None and "local" in doc["naive"]["note"]
    page = home / "ok.html"
    _cli(home, "report", "kp-rep-ok", "--html", str(page))
    # spend, step time, throughput, loss, per-worker batches (GNS too, when the run was long
    # enough to have it)
    assert page.read_text().count('src="data:image/png;base64,') == 5 + bool(m["gns"])
    assert m["loss"] and m["throughput"] and doc["plan"] is None


def test_report_all_and_bad_job(home: Path) -> None:
    docs = json.loads(_cli(home, "report", "--all", "--json"))
    assert [d["id"] for d in docs] == ["kp-rep-ok", "kp-rep-guard", "kp-rep-fail"]
    result = CliRunner().invoke(app, ["report", "kp-nope"], env={"KPLAN_HOME": str(home)})
    assert result.exit_code == 2
    assert "no job 'kp-nope'" in result.output and "hint:" in result.output
