"""A controller killed anywhere, restarted from its durable state (``resume_job``).

A simulated three-node spot job on the fake clock (node 1 preempted 15 minutes in, then the
head: a restart of every group on a new rendezvous generation) is run once cleanly, then once
for each of many points at which its controller dies like ``kill -9``: just before, or just
after, a write to the state database, a line of the launch journal, a write to the job's
storage (the lease, the controller's heartbeat, status cleanup) or a request to the cloud
(``run_instances``: the cloud made the instances, no line recorded them; ``terminate``).
Nothing the dead controller would do afterwards happens (every call raises). Two minutes later
``resume_job`` takes the job over (from the same database; in a second sweep from the storage
document alone, on a "machine" with a fresh database). Each run must end ``succeeded`` with
every node's status exit 0, nothing alive, one ledger row per instance the cloud made (none
twice, every one closed) and a spend within the clean run's plus the cost of the gap.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kplan.launcher.clock import FakeClock
from kplan.launcher.controller import read_controller
from kplan.launcher.controller_resume import resume_job
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.journal import Journal
from kplan.launcher.lifecycle import run_job
from kplan.launcher.provider import ClusterSpec, Instance, InstanceSpec
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir

AWS = Billing("aws", 60.0, 1.0, "test")
JOB = "kp-ctrl-1"
GAP_S = 120.0  # how long the job runs without a controller
PRICE = 0.2
RESULTS: dict[str, object] = {}


class Killed(BaseException):
    """The controller died (kill -9): no handler, no teardown."""


@dataclass
class Death:
    """Counts the controller's effects on the world; dies before or after the ``at``-th."""

    at: int | None = None
    after: bool = False
    ops: int = 0
    dead: bool = False
    kinds: tuple[str, ...] = ()

    def check(self) -> None:
        if self.dead:
            raise Killed

    @contextmanager
    def op(self, kind: str) -> Iterator[None]:
        self.check()
        self.ops += 1
        self.kinds = (*self.kinds, kind)
        hit = self.at is not None and self.ops == self.at
        if hit and not self.after:
            self.dead = True
            raise Killed
        yield
        if hit and self.after:
            self.dead = True
            raise Killed


class KillClock(FakeClock):
    def __init__(self, death: Death) -> None:
        super().__init__()
        self.death = death

    def sleep(self, seconds: float) -> None:
        self.death.check()
        super().sleep(seconds)


class KillDB(StateDB):
    death = Death()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            with super().transaction():
                yield
            return
        with self.death.op("db"), super().transaction():
            yield


class KillJournal(Journal):
    def __init__(self, path: Path, death: Death) -> None:
        super().__init__(path)
        self.death = death

    def write(self, kind: str, time: float, **data: Any) -> None:
        with self.death.op(f"journal {kind}"):
            super().write(kind, time, **data)


class KillStorage(LocalStorage):
    def __init__(self, root: Path, death: Death) -> None:
        super().__init__(root)
        self.uri = "s3://bucket/kplan"
        self.death = death

    def put_bytes(self, key: str, data: bytes) -> None:
        if "/status/" in key:  # the nodes write these (SimProvider), not the controller
            super().put_bytes(key, data)
            return
        with self.death.op(f"put {key.split('/', 1)[-1]}"):
            super().put_bytes(key, data)

    def delete_prefix(self, prefix: str) -> None:
        with self.death.op("delete"):
            super().delete_prefix(prefix)


@dataclass
class KillSim(SimProvider):
    death: Death = field(default_factory=Death)

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        with self.death.op("run_instances"):
            return super().run_instances(cluster, specs)

    def terminate_instances(self, ids: Sequence[str]) -> None:
        with self.death.op("terminate"):
            super().terminate_instances(ids)

    def query_instances(self, job_id: str) -> list[Instance]:
        self.death.check()
        return super().query_instances(job_id)


def _spec(script: str, budget_usd: float = 5.0) -> JobSpec:
    nodes = tuple(NodeSpec(r, "g4dn.xlarge", "spot", "us-east-1a", 1, PRICE) for r in range(3))
    return JobSpec.build(
        job_id=JOB,
        cloud="aws",
        region="us-east-1",
        script=script,
        nodes=nodes,
        budget_usd=budget_usd,
        offers=(ZoneOffer("g4dn.xlarge", "us-east-1a", "spot", PRICE),),
        check_interval_s=60.0,
        grace_s=60.0,
        teardown_s=60.0,
        lease_s=1800.0,
    )


@dataclass
class Run:
    status: str
    codes: dict[int, int]
    instances: list[str]  # what the cloud made
    ledger: list[tuple[str, bool]]  # (instance, closed) per row
    spend: float
    alive: int
    ops: int
    kind: str | None = None  # the effect the controller died at
    kinds: tuple[str, ...] = ()  # every effect, in order (of the clean run)


PREEMPT = {"-n1-r0": 900.0, "-n0-r0": 1500.0}  # node 1, then the head: a new generation


def _job(
    root: Path,
    script: str,
    at: int | None,
    after: bool,
    fresh_db: bool = False,
    budget_usd: float = 5.0,
) -> Run:
    work = root / f"k{at}{'a' if after else 'b'}{'f' if fresh_db else ''}{budget_usd:g}"
    work.mkdir()
    death = Death(at, after)
    clock = KillClock(death)
    store = KillStorage(work / "store", death)
    sim = KillSim(
        clock,
        store,
        boot_s=60.0,
        term_latency_s=30.0,
        finish_at=clock.now() + 2700.0,
        preempt_after=lambda s: next((t for k, t in PREEMPT.items() if s.name.endswith(k)), None),
        death=death,
    )
    backend = Backend(sim, store)
    journal = KillJournal(work / "journal.jsonl", death)
    spec = _spec(script, budget_usd)
    db = KillDB.open(work / "kplan.db", clock=clock)
    db.death = death
    try:
        outcome = run_job(spec, backend, db, clock=clock, billing=AWS, journal=journal)
    except Killed:
        outcome = None
    finally:
        db.close()
    kind = death.kinds[-1] if death.dead else None
    if outcome is None:  # the controller is dead: the cloud goes on alone, then a new one
        clock.t += GAP_S
        death.at, death.dead = None, False
        db_path = work / ("fresh.db" if fresh_db else "kplan.db")
        journal_path = work / ("fresh.jsonl" if fresh_db else "journal.jsonl")
        if fresh_db:
            assert read_controller(store, JOB) is not None
        with KillDB.open(work / "kplan.db") as first:
            row = first.job(JOB)
            if row is None:  # died before the job was recorded: nothing exists
                assert not sim.instances
                return Run("unrecorded", {}, [], [], 0.0, 0, death.ops, None)
        if row.terminal and not fresh_db:  # died after recording the end: nothing to resume
            status = row.status
        else:
            with KillDB.open(db_path, clock=clock) as again:
                again.death = death
                status = resume_job(
                    JOB, backend, again, clock=clock, billing=AWS,
                    journal=KillJournal(journal_path, death),
                ).status  # fmt: skip
    else:
        status = outcome.status
    with StateDB.open(work / ("fresh.db" if fresh_db and kind else "kplan.db")) as done:
        rows = done.ledger(JOB)
        spend = done.spend(JOB)
    codes = {}
    for rank in range(3):
        data = store.get_bytes(f"{JOB}/status/node-{rank}.json")
        codes[rank] = -1 if data is None else int(json.loads(data)["exit_code"])
    return Run(
        status,
        codes,
        list(sim.instances),
        [(r.instance, r.closed) for r in rows],
        spend,
        len(sim.alive()),
        death.ops,
        kind,
        death.kinds,
    )


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    path = fast_dir(tmp_path, "ctrl")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _check(run: Run, clean: Run, label: str) -> None:
    assert run.status == "succeeded", (label, run)
    assert run.codes == {0: 0, 1: 0, 2: 0}, (label, run)
    assert run.alive == 0, (label, run)
    ids = [i for i, _ in run.ledger]
    assert len(ids) == len(set(ids)), f"{label}: an instance billed twice: {ids}"
    assert sorted(ids) == sorted(run.instances), (label, run)  # every instance, adopted too
    assert all(closed for _, closed in run.ledger), (label, run)
    # the gap: every instance alive through it, at most, plus one billing minimum per instance
    extra = (GAP_S + 120.0) * PRICE * len(run.instances) / 3600 + 60 * PRICE * 3 / 3600
    assert run.spend <= clean.spend + extra + 1e-9, (label, run.spend, clean.spend)


def _points(kinds: tuple[str, ...]) -> list[int]:
    """The first effects (records, upload, the head's request), each request to the cloud and
    the effects on either side of it (intent and created lines, database rows), and every 23rd
    (the monitor's ledger rows, leases and heartbeats)."""
    cloud = [i + 1 for i, k in enumerate(kinds) if k in ("run_instances", "terminate")]
    near = {c + d for c in cloud for d in (-2, -1, 0, 1, 2)}
    return sorted(p for p in {*range(1, 12), *near, *range(12, len(kinds) + 1, 23)} if p >= 1)


def test_a_controller_killed_anywhere_is_restarted_from_its_state(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    clean = _job(folder, str(script), None, False)
    assert clean.status == "succeeded" and clean.alive == 0
    assert clean.codes == {0: 0, 1: 0, 2: 0}
    kinds: dict[str, int] = {}
    runs = 0
    worst = 0.0
    for at in _points(clean.kinds):
        for after in (False, True):
            run = _job(folder, str(script), at, after)
            if run.kind is None:
                continue
            runs += 1
            kinds[run.kind] = kinds.get(run.kind, 0) + 1
            _check(run, clean, f"killed {'after' if after else 'before'} op {at} ({run.kind})")
            worst = max(worst, run.spend - clean.spend)
    assert runs >= 60
    assert kinds.get("run_instances", 0) >= 4  # head, the rest, node 1's and the new head's
    RESULTS["restart sweep"] = {
        "runs": runs,
        "effects": clean.ops,
        "clean_spend_usd": round(clean.spend, 4),
        "worst_extra_usd": round(worst, 4),
        "by_effect": kinds,
    }
    print(f"controller restart sweep: {RESULTS['restart sweep']}")


def test_a_controller_restarts_on_a_machine_without_the_database(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    clean = _job(folder, str(script), None, False)
    runs = 0
    for at in range(60, clean.ops, 41):  # after the first heartbeat: the document exists
        run = _job(folder, str(script), at, True, fresh_db=True)
        if run.kind is None:
            continue
        runs += 1
        _check(run, clean, f"killed after op {at} ({run.kind}), restarted elsewhere")
    assert runs >= 5
    print(f"controller restart from storage alone: {runs} runs")


def test_a_controller_killed_in_teardown_is_restarted_to_finish_the_teardown(
    folder: Path, tmp_path: Path
) -> None:
    """The guard stops the job (a budget of about 20 minutes of the cluster); the controller
    dies at each effect of its teardown; the restarted one ends it ``stopped``, not running."""
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    clean = _job(folder, str(script), None, False, budget_usd=0.2)
    assert clean.status == "stopped" and clean.alive == 0
    first = clean.kinds.index("terminate")  # teardown's first request
    runs, worst = 0, 0.0
    for at in range(first - 2, len(clean.kinds) + 1):
        for after in (False, True):
            run = _job(folder, str(script), at, after, budget_usd=0.2)
            if run.kind is None:
                continue
            runs += 1
            assert run.status == "stopped" and run.alive == 0, (at, after, run)
            ids = [i for i, _ in run.ledger]
            assert len(ids) == len(set(ids)) and all(c for _, c in run.ledger), (at, run)
            # what the journal saw end is billed to then; the rest to when the restart saw it
            gap = GAP_S * PRICE * len(run.instances) / 3600
            assert run.spend <= clean.spend + gap + 1e-9, (at, run.spend, clean.spend)
            worst = max(worst, run.spend - clean.spend)
    assert runs >= 6
    RESULTS["teardown sweep"] = {"runs": runs, "worst_extra_usd": round(worst, 4)}
    print(f"controller killed in teardown: {RESULTS['teardown sweep']}")
