"""The recovery rules with real processes: the local provider's chaos refuses capacity.

``ChaosConfig.outages`` makes ``run_instances`` refuse launches in a zone / market for a while
(a ``CapacityError``, as a cloud with no capacity), on the same chaos clock as the injected
preemptions. The launcher (``run_job`` in this process, the real clock) runs two torchrun worker
groups whose script sleeps until a fixed time: the worker is preempted while the whole region is
out, the job waits, and the replacement fails over to the zone whose capacity returns first. A
second run never gets capacity back: it fails after ``capacity_wait_s`` with every process gone.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kplan.core.errors import CapacityError, InputError
from kplan.launcher.bootstrap import cluster_spec, instance_spec, rendezvous
from kplan.launcher.clock import SystemClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.lifecycle import JobOutcome, run_job
from kplan.launcher.providers import Backend
from kplan.launcher.providers.local import LocalProvider
from kplan.launcher.providers.local_chaos import ChaosConfig, Outage
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from tests.test_provider_local import kill_leftovers, wait_state

SLEEPER = """\
import sys, time
time.sleep(max(float(sys.argv[1]) - time.time(), 0.0))
"""


def test_outages_parse_round_trip_and_name_bad_values() -> None:
    config = ChaosConfig.from_json(
        '{"outages": [{"from_s": 5, "until_s": 9, "zone": "a", "market": "spot"}, {"from_s": 20}]}'
    )
    assert config.outages == (Outage(5, 9, "a", "spot"), Outage(20))
    assert ChaosConfig.from_dict(config.to_dict()) == config
    assert config.out_of_capacity("a", "spot", 5.0) == Outage(5, 9, "a", "spot")
    assert config.out_of_capacity("a", "spot", 9.0) is None  # [from, until)
    assert config.out_of_capacity("b", "spot", 6.0) is None
    assert config.out_of_capacity("a", "on-demand", 6.0) is None
    assert config.out_of_capacity("b", "on-demand", 1e6) == Outage(20)  # any zone, to the end
    assert not ChaosConfig(outages=(Outage(0),)).enabled  # refusals alone preempt nothing
    for text, message in [
        ('{"outages": {"from_s": 1}}', "outages=.* must be a list"),
        ('{"outages": [3]}', "an outage must be an object"),
        ('{"outages": [{"from": 1}]}', r"unknown outage keys \['from'\]"),
        ('{"outages": [{"from_s": 5, "until_s": 2}]}', "until_s 2 is before its from_s 5"),
        ('{"outages": [{"from_s": -1}]}', "must be seconds >= 0"),
        ('{"outages": [{"zone": ""}]}', "zone='' must be a name or null"),
    ]:
        with pytest.raises(InputError, match=message):
            ChaosConfig.from_json(text)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    left = kill_leftovers(tmp_path)
    assert not left, f"the test left processes behind: {sorted(left)}"


def test_a_refused_launch_is_a_capacity_error_and_reports_its_zone(home: Path) -> None:
    chaos = ChaosConfig(outages=(Outage(0.0, None, "local-a", "spot"),))
    provider = LocalProvider(home, chaos=chaos, grace_s=2.0)
    spec = _spec(home, capacity_wait_s=1.0)
    uri = LocalStorage(home / "jobs").uri
    cluster = cluster_spec(spec, uri)
    provider.prepare(cluster)
    node = spec.nodes[0]
    make = instance_spec(spec, node, f"{spec.job_id}-n0-r0", rendezvous(spec, 0, None), uri)
    with pytest.raises(CapacityError, match="no spot capacity in zone local-a"):
        provider.run_instances(cluster, [make])
    assert provider.query_instances(spec.job_id) == []
    other = NodeSpec(0, "local", "spot", "local-b", 1, 0.0)
    make_b = instance_spec(spec, other, f"{spec.job_id}-n0-r1", rendezvous(spec, 0, None), uri)
    (inst,) = provider.run_instances(cluster, [make_b])
    assert (inst.zone, inst.market) == ("local-b", "spot")
    provider.terminate_instances([inst.id])
    wait_state(provider, inst.id, {"terminated"}, timeout_s=20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(home: Path, **kw: Any) -> JobSpec:
    script = home / "sleeper.py"
    script.write_text(SLEEPER)
    options: dict[str, Any] = {
        "job_id": "kp-local-rec",
        "cloud": "local",
        "region": "local",
        "script": str(script),
        "args": (str(time.time() + 30.0),),
        "nodes": tuple(NodeSpec(r, "local", "spot", "local-a", 1, 0.0) for r in (0, 1)),
        "budget_usd": 0.0,
        "offers": (
            ZoneOffer("local", "local-a", "spot", 0.0),
            ZoneOffer("local", "local-b", "spot", 0.0),
        ),
        "check_interval_s": 0.5,
        "grace_s": 5.0,
        "teardown_s": 30.0,
        "finish_grace_s": 20.0,
        "rdzv_last_call_s": 1.0,
        "rdzv_port": _free_port(),
        "python": sys.executable,
    }
    options.update(kw)
    return JobSpec.build(**options)


def _run(home: Path, spec: JobSpec, chaos: ChaosConfig) -> tuple[JobOutcome, StateDB]:
    provider = LocalProvider(home, chaos=chaos, grace_s=5.0)
    db = StateDB.open(home / "kplan.db")
    out = run_job(spec, Backend(provider, LocalStorage(home / "jobs")), db, clock=SystemClock())
    return out, db


@pytest.mark.slow
def test_real_workers_wait_out_a_region_outage_then_fail_over(home: Path) -> None:
    # The worker is preempted 8 s in; zone a has no spot capacity from then on, zone b none
    # until 14 s: the job waits ~6 s, then the replacement starts in zone b.
    chaos = ChaosConfig(
        at_s=(8.0,),
        targets=(1,),
        notice_s=1.0,
        outages=(Outage(7.5, None, "local-a", "spot"), Outage(7.5, 14.0, "local-b", "spot")),
    )
    out, db = _run(home, _spec(home, capacity_wait_s=60.0), chaos)
    assert out.status == "succeeded", out.reason
    kinds = [e.kind for e in db.events(out.job_id)]
    assert _lost(kinds) == [1]
    assert kinds.index("waiting") < kinds.index("capacity") < kinds.index("recovered")
    (back,) = [e for e in db.events(out.job_id) if e.kind == "capacity"]
    assert back.data is not None and 2.0 <= back.data["waited_s"] <= 14.0
    records = sorted(db.instances(out.job_id), key=lambda r: r.launched_at)
    assert [(r.node_rank, r.zone) for r in records] == [
        (0, "local-a"),
        (1, "local-a"),
        (1, "local-b"),
    ]
    exits = {(d or {}).get("instance"): (d or {}).get("exit_code") for d in _exits(db, out)}
    assert exits[records[0].name] == 0 and exits[records[2].name] == 0  # both final groups
    db.close()


@pytest.mark.slow
def test_real_workers_fail_when_capacity_does_not_return_in_time(home: Path) -> None:
    chaos = ChaosConfig(at_s=(6.0,), targets=(1,), notice_s=1.0, outages=(Outage(5.5),))
    out, db = _run(home, _spec(home, capacity_wait_s=2.0), chaos)
    assert out.status == "failed"  # by the capacity wait, not the script's own end:
    assert (out.reason or "").startswith("no capacity for node(s) [1] in any zone of local")
    assert not any(i.alive for i in db.instances(out.job_id))
    assert all(row.closed for row in db.ledger(out.job_id))
    db.close()


@pytest.mark.slow
def test_real_workers_fall_back_to_on_demand_and_return_to_spot(home: Path) -> None:
    # The worker is preempted 8 s in while the region has no spot capacity until 16 s: it is
    # replaced on demand at once, then goes back to spot (the on-demand group gets SIGTERM).
    chaos = ChaosConfig(
        at_s=(8.0,),
        targets=(1,),
        notice_s=1.0,
        outages=(Outage(7.5, 16.0, None, "spot"),),
    )
    offers = (
        ZoneOffer("local", "local-a", "spot", 0.0),
        ZoneOffer("local", "local-a", "on-demand", 0.0),
    )
    spec = _spec(home, allow_on_demand=True, offers=offers, max_replacements=1)
    out, db = _run(home, spec, chaos)
    assert out.status == "succeeded", out.reason
    assert _lost([e.kind for e in db.events(out.job_id)]) == [1]
    records = sorted(db.instances(out.job_id), key=lambda r: r.launched_at)
    assert [(r.node_rank, r.market) for r in records] == [
        (0, "spot"),
        (1, "spot"),
        (1, "on-demand"),
        (1, "spot"),
    ]
    assert records[2].reason == "terminated"  # by kplan, for its spot successor
    assert records[3].launched_at >= records[0].launched_at + 16.0 - 1.0  # after the outage
    kinds = [e.kind for e in db.events(out.job_id)]
    assert "waiting" not in kinds and kinds.count("spot-return") == 1
    exits = {(d or {}).get("instance"): (d or {}).get("exit_code") for d in _exits(db, out)}
    assert exits[records[0].name] == 0 and exits[records[3].name] == 0
    db.close()


def _lost(kinds: list[str]) -> list[int]:
    """One loss per entry. The launcher sees a preempted group either as ``preempted`` (the
    provider's state) or, when the bootstrap's status file (143: the notice's SIGTERM) is read
    first, as ``lost`` ("exited with signal code 143"): both are replaced the same way."""
    return [1 for k in kinds if k in ("preempted", "lost")]


def _exits(db: StateDB, out: JobOutcome) -> list[dict[str, Any] | None]:
    return [e.data for e in db.events(out.job_id) if e.kind == "node-exit"]
