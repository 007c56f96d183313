"""The spot interruption notice: the node's watch (against a local metadata server speaking
both clouds' endpoints), the bootstrap that starts it, and the models that count on it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kplan.app import planning
from kplan.launcher.bootstrap import (
    CODE_KEY,
    cloud_user_data,
    notice_stop_s,
    rendezvous,
    ship_wheel,
)
from kplan.launcher.dryrun import dry_run
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.ledger import LocalBilling
from kplan.launcher.packing import pack_code
from kplan.launcher.spot_notice import watch
from kplan.launcher.storage import LocalStorage
from kplan.launcher.wheel import build_wheel
from kplan.planner.plan import Plan
from kplan.planner.search import SearchOptions
from kplan.planner.spot import Outage, RecoveryPolicy
from kplan.planner.spotnotice import NOTICE_S, POLL_S, lead_s, stop_before_s
from kplan.planner.spottrace import synthetic_trace
from tests.bootstrap_shims import node_tools, write_tool
from tests.metadata_server import metadata_server
from tests.spot_fixtures import BOTH, POL, play, replays
from tests.test_launcher_bootstrap import _cloud_spec
from tests.test_spotsim import _compare, model, risk


def _sleeper(seconds: float = 60.0) -> subprocess.Popen[bytes]:
    """A process to watch (once it ends, unreaped, the watch sees a zombie: gone)."""
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


# --- when the workers stop ------------------------------------------------------------------


def test_the_stop_fits_the_lead_in_the_notice_or_is_not_counted_on() -> None:
    # a 0.5 s step and a 5 s checkpoint: poll 5 + 2 steps + 2 checkpoints + 10 = 26 s
    assert lead_s(0.5, 5.0) == pytest.approx(26.0)
    assert stop_before_s("aws", 0.5, 5.0) == pytest.approx(26.0)  # as late as the lead allows
    assert stop_before_s("gcp", 0.5, 5.0) is None  # 30 s less a poll is 25 s: too short
    # at once: progress counted to the notice itself (the watch sees it within a poll)
    assert stop_before_s("gcp", 0.2, 2.0) == NOTICE_S["gcp"]
    assert stop_before_s("aws", 40.0, 10.0) == 115.0  # 5 + 80 + 20 + 10: just fits
    assert stop_before_s("aws", 41.0, 10.0) is None  # two 41 s steps do not
    assert stop_before_s("local", 0.1, 1.0) is None


def test_a_replayed_loss_keeps_the_progress_until_the_notices_stop() -> None:
    # the loss of tests/test_spotsim.py: b goes at 2500, 2260 s into training; without the
    # notice the cycle's 1800 s are kept and 450 s lost (done at 4610); stopping 60 s before
    # the loss keeps 1800 + 390 s, so 1410 s remain from 2800: done at 4210
    rows = [*BOTH, (2500.0, "remove", "b"), (2530.0, "add", "c")]
    assert play(rows).hours == pytest.approx(4610 / 3600)
    out = play(rows, policy=replace(POL, notice_stop_s=60.0))
    assert out.hours == pytest.approx(4210 / 3600)
    # a stop before the cycle's checkpoint keeps only the checkpoint (never less)
    late = play(rows, policy=replace(POL, notice_stop_s=1000.0))
    assert late.hours == pytest.approx(4610 / 3600)


def test_the_monte_carlo_with_the_notice_reproduces_replays_of_its_traces() -> None:
    """The two engines follow the same notice rule: replays of traces drawn from the model
    give the Monte-Carlo's mean and p90 (as without the notice, tests/test_spotsim.py), and
    the notice makes the job shorter and cheaper."""
    r = risk(0.7, 3.0, 0.3, Outage(0.4, (0.3, 0.6, 1.0), 1.0))
    base = RecoveryPolicy(
        checkpoint_interval_s=1800.0,
        checkpoint_s=10.0,
        max_replacements=60,
        allow_on_demand=True,
        zone_failover=False,
    )
    pol = replace(base, notice_stop_s=40.0)
    sim, sim0 = model(r, pol), model(r, base)
    outs = [
        replays(synthetic_trace(r, pool=4, hours=120.0, seed=s), [0.0], pol)[0] for s in range(2500)
    ]
    _compare(outs, sim)
    assert sim.hours_mean[0] < 0.97 * sim0.hours_mean[0]
    assert sim.cost_mean[0] < 0.97 * sim0.cost_mean[0]
    assert np.all(np.isfinite([sim.hours_p90[0], sim.cost_p90[0]]))


# --- the node's watch -----------------------------------------------------------------------


def test_aws_the_watch_stops_the_workers_at_the_lead_before_the_named_time() -> None:
    with metadata_server() as (url, md):
        proc = _sleeper()
        try:
            t0 = time.time()
            md.notice_at = t0 + 3.0  # AWS names the time (whole seconds)
            out = io.StringIO()
            assert watch("aws", proc.pid, 1.5, url, poll_s=0.2, out=out) == "stopped"
            took = time.time() - t0
            assert proc.wait(10) == -15  # SIGTERM
        finally:
            proc.kill()
    # the named time is cut to whole seconds: the stop comes 0.5-1.5 s after the start
    assert 0.3 < took < 2.5, took
    assert "spot interruption notice" in out.getvalue()
    # IMDSv2: a token first, then the notice read with it (the server refuses it without)
    assert md.reads[0] == "PUT /latest/api/token"
    assert "GET /latest/meta-data/spot/instance-action" in md.reads


def test_gcp_the_watch_stops_the_workers_within_the_30_seconds() -> None:
    with metadata_server() as (url, md):
        proc = _sleeper()
        try:
            md.notice_at = time.time()
            t0 = time.time()
            stop = NOTICE_S["gcp"]  # at once (the planner's stop_before_s for GCP)
            assert watch("gcp", proc.pid, stop, url, poll_s=0.2, out=io.StringIO()) == "stopped"
            took = time.time() - t0
            assert proc.wait(10) == -15
        finally:
            proc.kill()
    assert took < 1.5, took  # the first read that sees the flag
    assert set(md.reads) == {"GET /computeMetadata/v1/instance/preempted"}


def test_without_a_notice_the_watch_ends_with_its_process_and_survives_no_server() -> None:
    with metadata_server() as (url, md):
        proc = _sleeper(1.0)
        assert watch("aws", proc.pid, 10.0, url, poll_s=0.2, out=io.StringIO()) == "gone"
        assert proc.wait(10) == 0
        assert md.reads.count("PUT /latest/api/token") >= 2
    # nothing listens there any more: one line says so, the watch goes on until its process ends
    proc = _sleeper(1.0)
    out = io.StringIO()
    assert watch("gcp", proc.pid, 10.0, url, poll_s=0.2, out=out) == "gone"
    assert proc.wait(10) == 0
    assert out.getvalue().count("polling on") == 1


# --- the bootstrap --------------------------------------------------------------------------


def _spec(tmp_path: Path, cloud: str, markets: tuple[str, ...] = ("spot", "on-demand")) -> JobSpec:
    """tests/test_launcher_bootstrap.py's job, one node of each of ``markets``."""
    spec = _cloud_spec(tmp_path, cloud, nodes=len(markets))
    nodes = tuple(replace(n, market=m) for n, m in zip(spec.nodes, markets, strict=True))
    return replace(spec, nodes=nodes)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_spot_node_watches_for_its_notice_and_an_on_demand_node_does_not(
    tmp_path: Path, cloud: str
) -> None:
    spec = _spec(tmp_path, cloud)
    uri = "s3://b/p" if cloud == "aws" else "gs://b/p"
    spot = cloud_user_data(spec, spec.nodes[0], "h", rendezvous(spec, 0, None), uri)
    od = cloud_user_data(spec, spec.nodes[1], "w", rendezvous(spec, 0, "10.0.0.2"), uri)
    subprocess.run(["bash", "-n"], input=spot, text=True, check=True)
    # no plan: no step time to fit a lead to, so the workers stop at once on the notice
    stop = NOTICE_S[cloud] - POLL_S
    assert notice_stop_s(spec) == stop
    line = f"-m kplan.launcher.spot_notice --cloud {cloud} --pid $$ --stop-before {stop:g} &"
    assert line in spot and "spot_notice" not in od
    # the watch starts after torchrun, whose pid the SIGTERM trap forwards to
    assert spot.index("child=$!") < spot.index("spot_notice") < spot.index("trap ")


_TRAIN_UNTIL_TERM = """
import os, signal, sys, time
from pathlib import Path
ckpt = Path(os.environ["KPLAN_CHECKPOINT_DIR"])
rank = os.environ["RANK"]
def on_term(*_):
    (ckpt / "notice").mkdir(parents=True, exist_ok=True)
    (ckpt / "notice" / f"rank-{rank}.pt").write_text("saved on the notice")
    print("checkpointed on SIGTERM, rank", rank, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(ckpt.parent / f"training-{rank}").write_text("up")
for _ in range(600):
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_an_aws_spot_node_checkpoints_on_its_notice_and_uploads_it(tmp_path: Path) -> None:
    """The head's user-data, run with stub aws/hostname/poweroff/pip and a metadata server on
    127.0.0.1: torchrun trains until the notice, the watch sends SIGTERM, the workers
    checkpoint, the checkpoint and the status (143: replace the node) reach the bucket."""
    spec = _spec(tmp_path, "aws", ("spot",))
    Path(spec.script).write_text(_TRAIN_UNTIL_TERM)
    wheel = build_wheel(tmp_path / "home")
    spec = JobSpec.from_dict(
        {
            **spec.to_dict(),
            "kplan_wheel": str(wheel.path),
            "kplan_wheel_sha256": wheel.sha256,
            "rdzv_port": 29473,
        }
    )
    bucket = tmp_path / "s3"
    store = bucket / "b" / "p" / spec.job_id
    (store / CODE_KEY).parent.mkdir(parents=True)
    (store / CODE_KEY).write_bytes(pack_code(Path(spec.script)).data)
    assert ship_wheel(spec, LocalStorage(bucket / "b" / "p")) is not None
    stubs = node_tools(tmp_path / "bin", tmp_path / "powered-off")
    real = shutil.which("python3", path=str(Path(sys.executable).parent)) or sys.executable
    write_tool(
        stubs,
        "python3",
        f'#!/bin/bash\nif [ "$1 $2" = "-m pip" ]; then exit 0; fi\nexec {real} "$@"\n',
    )
    node_root = tmp_path / "node"
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "s3://b/p", str(node_root)
    )
    with metadata_server() as (url, md):
        md.ready = node_root / "training-0"  # the notice comes once the worker trains
        md.notice_in = NOTICE_S["aws"]  # with no plan the workers stop 115 s before: at once
        env = {
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "FAKE_S3": str(bucket),
            "HOME": str(tmp_path),
            "KPLAN_METADATA_URL": url,
        }
        subprocess.run(["bash", "-c", text], env=env, timeout=240, check=False)
    log = (node_root / "logs" / "node-0.log").read_text()
    assert "spot interruption notice" in log, log
    assert "checkpointed on SIGTERM, rank 0" in log, log
    assert (store / "ckpt" / "notice" / "rank-0.pt").read_text() == "saved on the notice"
    status = json.loads((store / "status" / "node-0.json").read_text())
    assert status["exit_code"] == 143, log  # a signal: the launcher replaces the node
    assert (tmp_path / "powered-off").exists()


def test_a_spot_plan_carries_its_stop_and_an_older_plan_reads_none() -> None:
    opts = SearchOptions(clouds=("aws",), markets=("spot",), spot_runs=200, top=3)
    plan = planning.estimate(planning.load_example("cifar10-resnet18"), opts).plan
    for row in plan.plans:
        rec = row.spot.recovery
        assert rec is not None and rec.notice_stop_s is not None
        # the lead of the row's own step and checkpoint, as the launcher's node computes it
        assert rec.notice_stop_s == pytest.approx(lead_s(row.step_time_s, rec.checkpoint_s))
    doc = plan.to_dict()
    assert (
        doc["chosen"]["spot"]["recovery"]["notice_stop_s"]
        == plan.chosen.spot.recovery.notice_stop_s
    )  # type: ignore[union-attr]
    del doc["chosen"]["spot"]["recovery"]["notice_stop_s"]  # a plan of the previous release
    old = Plan.from_dict(doc, "old")
    assert old.chosen.spot.recovery is not None and old.chosen.spot.recovery.notice_stop_s is None


def test_the_dry_run_says_when_the_spot_workers_stop(tmp_path: Path) -> None:
    spot = dry_run(_spec(tmp_path, "aws"), "s3://b/p", LocalBilling())
    assert spot.notice_stop_s == NOTICE_S["aws"] - POLL_S  # no plan: at once
    assert spot.to_dict()["notice_stop_s"] == spot.notice_stop_s
    on_demand = dry_run(_spec(tmp_path, "gcp", ("on-demand",)), "gs://b/p", LocalBilling())
    assert on_demand.notice_stop_s is None and on_demand.to_dict()["notice_stop_s"] is None
