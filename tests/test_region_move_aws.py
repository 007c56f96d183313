"""The move rule (kplan/planner/spotmove.py) in the launcher (kplan/launcher/region_move.py), on
AWS: the real boto3 client against a moto server in two regions, on the launcher's fake clock.

moto has no notion of capacity: the test wraps moto's EC2 ``run_instances`` to answer
``InsufficientInstanceCapacity`` for the zones and markets that are out (a real EC2 error,
translated by the provider into a ``CapacityError``), and plays the nodes' bootstrap at the end
(status files to S3, power-off)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kplan.app.stopping import DownRequest, take_down
from kplan.launcher.bootstrap import status_key
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer, new_job_id
from kplan.launcher.journal import Journal
from kplan.launcher.lifecycle import JobOutcome, run_job
from kplan.launcher.move_spec import MoveRegion
from kplan.launcher.providers import Backend
from kplan.launcher.state import EventRecord, StateDB
from kplan.planner.plan import Plan
from kplan.planner.spotmove import MoveTerms, break_even_s, copy_cost
from tests.aws_server import BUCKET, REGION, MotoAws, fake_credentials, moto_config
from tests.test_provider_aws_recovery import Capacity, capacity

__all__ = ["capacity"]  # the fixture: moto refuses the zones and markets that are out
WEST = "us-west-2"
HOME_A, HOME_B, WEST_A = "us-east-1a", "us-east-1b", "us-west-2a"
SPOT, ON_DEMAND, WEST_SPOT = 0.45, 1.01, 0.40
CKPT_GB, EGRESS_GB = 10.0, 0.02
TICK = 30.0


@pytest.fixture
def backends(moto: MotoAws, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Backend]]:
    """The aws provider in each region, sharing the job's storage (in the home region)."""
    from kplan.launcher.providers.aws import AwsProvider
    from kplan.launcher.providers.aws_storage import S3Storage

    fake_credentials(monkeypatch)
    config = moto_config(moto)
    storage = S3Storage(f"s3://{BUCKET}/jobs", config)
    yield {r: Backend(AwsProvider(replace(config, region=r)), storage) for r in (REGION, WEST)}


def _spec(tmp_path: Path, **kw: Any) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('training')\n")
    home = (
        ZoneOffer("g5.xlarge", HOME_A, "spot", SPOT),
        ZoneOffer("g5.xlarge", HOME_B, "spot", SPOT),
        ZoneOffer("g5.xlarge", HOME_A, "on-demand", ON_DEMAND),
    )
    west = (
        ZoneOffer("g5.xlarge", WEST_A, "spot", WEST_SPOT),
        ZoneOffer("g5.xlarge", WEST_A, "on-demand", ON_DEMAND),
    )
    options: dict[str, Any] = {
        "job_id": new_job_id(),
        "cloud": "aws",
        "region": REGION,
        "script": str(script),
        "nodes": tuple(NodeSpec(r, "g5.xlarge", "spot", HOME_A, 1, SPOT) for r in (0, 1)),
        "budget_usd": 20.0,
        "check_interval_s": TICK,
        "grace_s": 0.0,
        "teardown_s": 60.0,
        "finish_grace_s": 60.0,
        "provision_timeout_s": 600.0,
        "capacity_wait_s": 1500.0,
        "offers": home,
        "move_regions": (
            MoveRegion(REGION, home, EGRESS_GB),
            MoveRegion(WEST, west, EGRESS_GB),
        ),
        "checkpoint_gb": CKPT_GB,
    }
    options.update(kw)
    return JobSpec.build(**options)


def _finish(backend: Backend, moto: MotoAws, job_id: str, region: str) -> None:
    """The bootstrap's last steps on every live node: status file to S3, then poweroff."""
    for inst in backend.provider.query_instances(job_id):
        if inst.alive:
            doc = {"exit_code": 0, "time": 0.0, "node_rank": inst.node_rank, "instance": inst.name}
            backend.storage.put_bytes(status_key(job_id, inst.node_rank), json.dumps(doc).encode())
            moto.power_off(inst.id, region)


def _outage(moto: MotoAws, capacity: Capacity, spec: JobSpec) -> Callable[[EventRecord], None]:
    """Node 1's first instance is interrupted; then the home region has no spot capacity."""

    def script(event: EventRecord) -> None:
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{spec.job_id}-n1-r0":
            moto.interrupt_spot(str(data["instance"]))
        if event.kind == "preempted":
            capacity.set((HOME_A, "spot"), (HOME_B, "spot"))

    return script


def _finish_after_move(
    moto: MotoAws, backends: dict[str, Backend], db: StateDB, spec: JobSpec
) -> Callable[[EventRecord], None]:
    """Once the job has moved, its nodes in the other region finish when node 1 launches."""

    def script(event: EventRecord) -> None:
        moved = "move" in _kinds(db, spec.job_id)
        if moved and event.kind == "launch" and (event.data or {}).get("node_rank") == 1:
            _finish(backends[WEST], moto, spec.job_id, WEST)

    return script


def _run(spec: JobSpec, backends: dict[str, Backend], db: StateDB, script: Any) -> JobOutcome:
    return run_job(
        spec,
        backends[REGION],
        db,
        clock=FakeClock(),
        on_event=script,
        backend_for=lambda region: backends[region],
    )


def _alive(moto: MotoAws, job_id: str, region: str) -> list[str]:
    ec2 = moto.client("ec2") if region == REGION else _client(moto, region)
    tag = [{"Name": "tag:kplan-job", "Values": [job_id]}]
    found = ec2.describe_instances(Filters=tag)["Reservations"]
    return [
        i["InstanceId"] for r in found for i in r["Instances"] if i["State"]["Name"] != "terminated"
    ]


def _client(moto: MotoAws, region: str) -> Any:
    import boto3

    return boto3.client("ec2", endpoint_url=moto.url, region_name=region)


def _kinds(db: StateDB, job_id: str) -> list[str]:
    return [e.kind for e in db.events(job_id)]


def test_a_dry_home_region_moves_the_job_once_staying_has_paid_the_move(
    backends: dict[str, Backend], moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    spec = _spec(tmp_path)
    db = StateDB.open(tmp_path / "kplan.db")
    outage = _outage(moto, capacity, spec)
    finish = _finish_after_move(moto, backends, db, spec)

    def script(event: EventRecord) -> None:
        outage(event)
        finish(event)

    out = _run(spec, backends, db, script)
    assert out.status == "succeeded", out.reason
    events = {e.kind: e for e in db.events(spec.job_id)}
    lost, move = events["preempted"], events["move"]
    # the rule's own numbers: a stalled cluster moves after T* = copy_s + egress / (n u)
    cost = copy_cost(MoveTerms("aws", CKPT_GB), EGRESS_GB)
    t_star = break_even_s(cost, 2, ON_DEMAND, WEST_SPOT)
    assert t_star == pytest.approx(CKPT_GB * 8 + CKPT_GB * EGRESS_GB * 3600 / (2 * 0.61))
    assert t_star - 1e-6 <= move.time - lost.time <= t_star + TICK + 1e-6
    assert move.message.startswith(f"moving {REGION} -> {WEST}: 10 GB checkpoint (the job")
    assert "$0.20 egress, 80 s copy" in move.message
    # the job finished in the destination; its spec and row say so
    job = db.job(spec.job_id)
    assert job is not None and job.region == WEST and job.spec["region"] == WEST
    line = Journal.for_job(tmp_path, spec.job_id).read().job  # kplan down without the database
    assert line is not None and line.region == WEST
    after = [i for i in db.instances(spec.job_id) if i.launched_at >= move.time]
    assert {(i.region, i.zone, i.price) for i in after} == {(WEST, WEST_A, WEST_SPOT)}
    egress = [r for r in db.ledger(spec.job_id) if r.kind == "egress"]
    assert [(r.instance, r.usd) for r in egress] == [
        (f"egress/move-1: {REGION} -> {WEST}", pytest.approx(CKPT_GB * EGRESS_GB))
    ]
    assert all(r.closed for r in db.ledger(spec.job_id))
    # kplan down finds nothing alive in either region
    results = take_down(
        DownRequest(spec.job_id, wait_s=0.0),
        lambda: StateDB.open(tmp_path / "kplan.db"),
        lambda cloud, region, storage: backends[region or REGION],
    )
    assert isinstance(results, list) and not any(r.terminated for r in results)
    assert _alive(moto, spec.job_id, REGION) == _alive(moto, spec.job_id, WEST) == []


def test_kplan_down_ends_instances_in_every_region_the_job_may_use(
    backends: dict[str, Backend], moto: MotoAws, tmp_path: Path
) -> None:
    """A launcher killed after its move left instances in both regions: one kplan down ends
    them all."""
    from kplan.launcher.lifecycle import record_job
    from kplan.launcher.provider import ClusterSpec, InstanceSpec

    spec = _spec(tmp_path)
    db = StateDB.open(tmp_path / "kplan.db")
    record_job(spec, backends[REGION], db, clock=FakeClock())
    for region, zone in ((REGION, HOME_A), (WEST, WEST_A)):
        provider = backends[region].provider
        cluster = ClusterSpec(job_id=spec.job_id, cloud="aws", region=region)
        provider.prepare(cluster)
        node = InstanceSpec(
            job_id=spec.job_id, name=f"{spec.job_id}-n0-r0", cloud="aws", region=region,
            zone=zone, instance_type="g5.xlarge", market="spot", node_rank=0,
            user_data="#!/bin/bash\n",
        )  # fmt: skip
        provider.run_instances(cluster, [node])
    assert _alive(moto, spec.job_id, WEST)
    take_down(
        DownRequest(spec.job_id, wait_s=0.0),
        lambda: StateDB.open(tmp_path / "kplan.db"),
        lambda cloud, region, storage: backends[region or REGION],
    )
    assert _alive(moto, spec.job_id, REGION) == _alive(moto, spec.job_id, WEST) == []


@cache
def _plan() -> Plan:
    from kplan.app import planning
    from kplan.planner.search import SearchOptions

    opts = SearchOptions(
        markets=("spot",),
        instance_types=("g4dn.xlarge",),
        clouds=("aws",),
        min_nodes=2,
        max_nodes=2,
        mixed=False,
        spot_runs=50,
    )
    plan = planning.estimate(planning.load_example("cifar10-resnet18"), opts).plan
    return replace(plan, chosen=replace(plan.chosen, steps=1, step_time_s=6600.0))


def test_a_move_the_deadline_cannot_afford_is_not_made(
    backends: dict[str, Backend], moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    """6600 s of work left, 2.5 h to the deadline: after T* the slack with the cluster up a
    copy and a restart later is under the reserve; the job stays (and fails, no capacity)."""
    spec = _spec(tmp_path, deadline_h=2.5, plan=_plan(), budget_usd=40.0)
    db = StateDB.open(tmp_path / "kplan.db")
    out = _run(spec, backends, db, _outage(moto, capacity, spec))
    assert out.status == "failed" and "no capacity" in (out.reason or ""), out.reason
    kinds = _kinds(db, spec.job_id)
    assert "move" not in kinds and kinds.count("stay") == 1
    (stay,) = [e for e in db.events(spec.job_id) if e.kind == "stay"]
    assert stay.message.startswith(f"not moving to {WEST}: the deadline's slack")
    assert not [r for r in db.ledger(spec.job_id) if r.kind == "egress"]
    assert _alive(moto, spec.job_id, REGION) == _alive(moto, spec.job_id, WEST) == []


def test_a_move_the_budget_cannot_pay_is_not_made(
    backends: dict[str, Backend], moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    """$2/GB egress of 10 GB is over the $15 budget: the job stays, and says why."""
    spec = _spec(tmp_path, budget_usd=15.0)
    regions = tuple(replace(r, egress_usd_gb=2.0) for r in spec.moves.regions)
    spec = replace(spec, moves=replace(spec.moves, regions=regions))
    db = StateDB.open(tmp_path / "kplan.db")
    # the rent reaches M = $20 + n u copy_s (u at a dear on demand) within the wait
    cheap = tuple(
        replace(o, usd_per_hour=40.0) if o.market == "on-demand" else o for o in spec.offers
    )
    regions = (replace(regions[0], offers=cheap), regions[1])
    spec = replace(spec, offers=cheap, moves=replace(spec.moves, regions=regions))
    out = _run(spec, backends, db, _outage(moto, capacity, spec))
    assert out.status == "failed" and "no capacity" in (out.reason or ""), out.reason
    kinds = _kinds(db, spec.job_id)
    assert "move" not in kinds and kinds.count("move-refused") == 1
    (refused,) = [e for e in db.events(spec.job_id) if e.kind == "move-refused"]
    assert refused.message.startswith(f"not moving to {WEST} ($20.00 egress): projected spend")
    assert "would exceed the budget $15.00" in refused.message
    assert not [r for r in db.ledger(spec.job_id) if r.kind == "egress"]


def test_a_spot_replacement_in_another_zone_is_no_move(
    backends: dict[str, Backend], moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    """Zone a out, zone b in: the zone failover replaces the node at once, no region move
    (a free move, nothing copied); with a 0 GB checkpoint neither."""
    spec = _spec(tmp_path, checkpoint_gb=0.0)
    db = StateDB.open(tmp_path / "kplan.db")

    def script(event: EventRecord) -> None:
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{spec.job_id}-n1-r0":
            moto.interrupt_spot(str(data["instance"]))
        if event.kind == "preempted":
            capacity.set((HOME_A, "spot"))
        if event.kind == "recovered":
            _finish(backends[REGION], moto, spec.job_id, REGION)

    out = _run(spec, backends, db, script)
    assert out.status == "succeeded", out.reason
    assert "move" not in _kinds(db, spec.job_id)
    assert {i.region for i in db.instances(spec.job_id)} == {REGION}
    assert not [r for r in db.ledger(spec.job_id) if r.kind == "egress"]


def test_lost_nodes_on_the_on_demand_fallback_pay_the_rent_until_the_job_moves(
    backends: dict[str, Backend], moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    """Node 1 runs on demand at home (no spot capacity there): its premium over spot in the
    other region is the rent (``k u`` for k = 1 node); the job moves once it reaches M."""
    spec = _spec(tmp_path, allow_on_demand=True)
    db = StateDB.open(tmp_path / "kplan.db")
    outage = _outage(moto, capacity, spec)
    finish = _finish_after_move(moto, backends, db, spec)

    def script(event: EventRecord) -> None:
        outage(event)
        finish(event)

    out = _run(spec, backends, db, script)
    assert out.status == "succeeded", out.reason
    events = {e.kind: e for e in db.events(spec.job_id)}
    lost, move = events["preempted"], events["move"]
    fallback = [i for i in db.instances(spec.job_id) if i.market == "on-demand"]
    assert [(i.node_rank, i.region) for i in fallback] == [(1, REGION)]
    # move_at: the stall ends at the loss, then one node pays u a second until M is paid
    u = (ON_DEMAND - WEST_SPOT) / 3600
    cost = copy_cost(MoveTerms("aws", CKPT_GB), EGRESS_GB)
    due = (cost.egress_usd + 2 * u * cost.copy_s) / u
    assert due - 1e-6 <= move.time - lost.time <= due + TICK + 1e-6
    job = db.job(spec.job_id)
    assert job is not None and job.region == WEST
    assert _alive(moto, spec.job_id, REGION) == _alive(moto, spec.job_id, WEST) == []


def test_the_checkpoint_the_metrics_record_is_the_size_a_move_copies(
    backends: dict[str, Backend], moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    """The workers' newest ``checkpoint`` event in the job's storage says 20 GB (the spec says
    10): the move is priced, made and recorded at 20 GB, later by the larger egress."""
    spec = _spec(tmp_path)
    db = StateDB.open(tmp_path / "kplan.db")
    outage = _outage(moto, capacity, spec)
    finish = _finish_after_move(moto, backends, db, spec)
    storage = backends[REGION].storage

    def script(event: EventRecord) -> None:
        if event.kind == "head":  # the runtime's metrics: two checkpoints, the newest 20 GB
            lines = [
                {"event": "checkpoint", "time": event.time - 5, "step": 1, "bytes": 10**9},
                {"event": "checkpoint", "time": event.time, "step": 2, "bytes": 20 * 10**9},
            ]
            text = "".join(json.dumps(x) + "\n" for x in lines)
            storage.put_bytes(f"{spec.job_id}/metrics/rank-0.jsonl", text.encode())
        outage(event)
        finish(event)

    out = _run(spec, backends, db, script)
    assert out.status == "succeeded", out.reason
    events = {e.kind: e for e in db.events(spec.job_id)}
    move = events["move"]
    assert "20 GB checkpoint (measured), $0.40 egress, 160 s copy" in move.message
    t_star = break_even_s(copy_cost(MoveTerms("aws", 20.0), EGRESS_GB), 2, ON_DEMAND, WEST_SPOT)
    assert t_star <= move.time - events["preempted"].time <= t_star + TICK + 1e-6
    egress = [r.usd for r in db.ledger(spec.job_id) if r.kind == "egress"]
    assert egress == [pytest.approx(20 * EGRESS_GB)]


def test_the_launchers_move_is_the_several_pool_replays_move() -> None:
    """The same dry spell replayed by ``spotmove.replay_pools`` (kplan simulate --trace
    POOL=FILE): 2 nodes, the worker lost at 1 h with no spot capacity at home after it and none
    on demand, the other region holding both nodes. The replay moves ``T*`` after the loss, the
    break-even the launcher's test above moves at (within a tick)."""
    import numpy as np

    from kplan.planner.catalog import StoragePrice
    from kplan.planner.spot import RecoveryPolicy
    from kplan.planner.spotmove import Pool, replay_pools
    from kplan.planner.spottrace import ADD, REMOVE, SpotTrace

    def trace(name: str, events: list[tuple[float, int, str]]) -> SpotTrace:
        ev = sorted(events)
        return SpotTrace(
            name, "synthetic", np.array([e[0] for e in ev], dtype=float),
            np.array([e[1] for e in ev], dtype=np.int8), tuple(e[2] for e in ev), 40 * 3600.0,
        )  # fmt: skip

    home = trace("home", [(0.0, ADD, "a"), (10.0, ADD, "b"), (3600.0, REMOVE, "b")])
    west = trace("west", [(0.0, ADD, "c"), (10.0, ADD, "d")])
    pools = [Pool(REGION, REGION, home, SPOT, ON_DEMAND), Pool(WEST, WEST, west, WEST_SPOT, 2.0)]
    price = StoragePrice("aws", REGION, 0.023, 0.08, EGRESS_GB, 0.09, 0.09, "test", "2026-11-01")
    terms = MoveTerms("aws", CKPT_GB, storage={("aws", REGION): price})
    policy = RecoveryPolicy(allow_on_demand=False, capacity_wait_s=1500.0)
    (out,) = replay_pools(pools, [20.0], nodes=2, work_s=6 * 3600.0, policy=policy, terms=terms)
    (mv,) = out.moves
    t_star = break_even_s(copy_cost(MoveTerms("aws", CKPT_GB), EGRESS_GB), 2, ON_DEMAND, WEST_SPOT)
    lost = 3600.0 - 20.0  # the replay's clock starts at the job's start
    assert mv.time_s - lost == pytest.approx(t_star)
    assert mv.egress_usd == pytest.approx(CKPT_GB * EGRESS_GB)


def test_the_dry_run_prices_each_move_the_job_may_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kplan launch --dry-run --move-region``: each region's move at the rule's price, the
    checkpoint's egress at the home region's list price and its copy time, and the break-even
    the launcher moves at (``spotmove.break_even_s`` of the nodes' prices in the spec)."""
    from typer.testing import CliRunner

    from kplan.cli.main import app

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    args = ["launch", str(script), "--cloud", "aws", "--region", "us-east-1", "--example",
            "cifar10-resnet18", "--budget", "5", "--move-region", WEST, "--checkpoint-gb",
            str(CKPT_GB), "--dry-run"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    (move,) = doc["moves"]
    assert move["region"] == WEST
    assert move["egress_usd"] == pytest.approx(CKPT_GB * EGRESS_GB)
    assert move["copy_s"] == pytest.approx(CKPT_GB * 8.0)  # 1 Gbit/s by default
    assert 0 < move["break_even_s"] < 3600
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert f"move to {WEST}: $0.2000 egress, 80 s copy" in " ".join(text.output.split())
    # without --move-region: no move lines
    bare = CliRunner().invoke(app, [*args[:-5], "--dry-run", "--json"])
    assert bare.exit_code == 0, bare.output
    assert json.loads(bare.output)["moves"] == []


def test_a_moved_job_is_taken_over_in_its_new_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kplan controller JOB --cloud aws --region <where it started> --storage URI`` on a
    machine without the job's database: the controller document says the job moved, so the
    controller runs with the provider of the region it is in now."""
    from typer.testing import CliRunner

    from kplan.app import controlling
    from kplan.cli.commands import launch as launch_cmd
    from kplan.cli.main import app
    from kplan.launcher.controller import ControllerDoc, write_controller
    from kplan.launcher.storage import LocalStorage

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "fresh"))
    storage = LocalStorage(tmp_path / "bucket")
    spec = replace(_spec(tmp_path), region=WEST)
    doc = ControllerDoc(
        spec.job_id, "gone", 1, "detached", 0.0, 0.0, TICK, 0.0, 0, spec=spec.to_dict()
    )
    write_controller(storage, doc)
    asked: list[str | None] = []

    def backend(cloud: str, region: str | None, uri: str | None) -> Backend:
        asked.append(region)
        return Backend(provider=None, storage=storage)  # type: ignore[arg-type]

    ran: list[JobSpec] = []
    monkeypatch.setattr(launch_cmd, "_backend", backend)
    monkeypatch.setattr(launch_cmd, "_run", lambda s, *a, **k: ran.append(s))
    monkeypatch.setattr(controlling, "check_not_running", lambda *a: None)
    args = ["controller", spec.job_id, "--cloud", "aws", "--region", REGION, "--storage", "x"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert asked == [REGION, WEST] and ran[0].region == WEST
