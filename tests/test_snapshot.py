"""The controller's state snapshot: written whole to the job's storage, merged idempotently into
another machine's database (newer wins, closed ledger rows immutable, local rows kept), a damaged
or foreign snapshot refused before anything is merged, and a round trip through S3 (moto)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kplan.core.errors import InputError
from kplan.launcher.snapshot import (
    FORMAT,
    age_line,
    build_snapshot,
    merge_snapshot,
    merged_seq,
    parse_snapshot,
    publish,
    pull,
    snapshot_key,
    sync,
)
from kplan.launcher.state import InstanceRecord, JobRecord, LedgerRow, StateDB
from kplan.launcher.storage import LocalStorage, Storage

JOB = "j-snap"


def _job(t: float = 100.0) -> JobRecord:
    return JobRecord(
        id=JOB,
        status="running",
        reason=None,
        cloud="aws",
        region="us-east-1",
        spec={"nodes": [{"gpus": 1}]},
        plan=None,
        budget_usd=5.0,
        deadline_h=2.0,
        predicted_hours=1.0,
        predicted_cost_usd=3.0,
        predicted_cost_p90_usd=4.0,
        launcher_pid=None,
        stop_requested=None,
        created_at=t,
        updated_at=t,
    )


def _node(rank: int, state: str = "running") -> InstanceRecord:
    return InstanceRecord(
        f"i-{rank}", JOB, f"n{rank}", rank, "aws", "us-east-1", "us-east-1a", "g5.xlarge",
        "spot", 0.5, state, 100.0,
    )  # fmt: skip


def _controller_db(path: Path) -> StateDB:
    """The controller's own database: the job, two nodes, their ledger rows and an event."""
    db = StateDB.open(path)
    db.create_job(_job())
    for rank in (0, 1):
        db.add_instance(_node(rank))
        db.put_ledger(LedgerRow(JOB, f"i-{rank}", 100.0, 460.0, 360.0, 0.05, False))
    db.put_ledger(LedgerRow(JOB, "storage", 100.0, 460.0, 360.0, 0.001, False, "storage"))
    db.add_event(JOB, 120.0, "nodes", "2 nodes running")
    return db


def _laptop_db(path: Path) -> StateDB:
    """The laptop's database: the job row and the controller instance's row and ledger row."""
    db = StateDB.open(path)
    db.create_job(replace(_job(), status="pending"))
    db.add_instance(replace(_node(9), id="i-ctl", name="controller", node_rank=-1))
    db.put_ledger(LedgerRow(JOB, "i-ctl", 100.0, 130.0, 30.0, 0.0001, False))
    return db


def _laptop_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, now: float) -> Storage:
    """A KPLAN_HOME (``laptop``) holding only the job's row, a local job made a minute before
    ``now``; the job's storage, where a controller elsewhere publishes."""
    from kplan.cli.commands.jobs import _storage_or_none
    from kplan.launcher.jobspec import JobSpec

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "laptop"))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec.local(str(script), job_id=JOB, rdzv_port=29500)
    with StateDB.open() as laptop:
        laptop.create_job(
            replace(_job(now - 60), cloud="local", region="local", spec=spec.to_dict())
        )
        rec = laptop.job(JOB)
    assert rec is not None
    storage: Storage = _storage_or_none(rec)
    return storage


def test_merge_brings_nodes_and_spend_and_keeps_local_rows(tmp_path: Path) -> None:
    remote = _controller_db(tmp_path / "controller.db")
    laptop = _laptop_db(tmp_path / "laptop.db")
    assert merge_snapshot(laptop, build_snapshot(remote, JOB, 1, 470.0))
    job = laptop.job(JOB)
    assert job is not None and job.status == "running"
    assert {i.id for i in laptop.instances(JOB)} == {"i-0", "i-1", "i-ctl"}
    assert laptop.spend(JOB) == pytest.approx(0.05 * 2 + 0.001 + 0.0001)
    assert {r.kind for r in laptop.ledger(JOB)} == {"instance", "storage"}
    assert merged_seq(laptop, JOB) == (1, 470.0)
    line = age_line(merged_seq(laptop, JOB), 510.0)
    assert line is not None and line.startswith("controller state as of 40 s ago")


def test_merge_is_idempotent_and_older_never_overwrites_newer(tmp_path: Path) -> None:
    remote = _controller_db(tmp_path / "controller.db")
    laptop = _laptop_db(tmp_path / "laptop.db")
    old = build_snapshot(remote, JOB, 1, 470.0)
    remote.update_instance(JOB, "i-1", "preempted", ended_at=500.0, reason="spot reclaimed")
    remote.put_ledger(LedgerRow(JOB, "i-1", 100.0, 500.0, 400.0, 0.06, True))
    remote.set_status(JOB, "recovering", 500.0)
    new = build_snapshot(remote, JOB, 2, 510.0)
    assert merge_snapshot(laptop, new)
    before = (laptop.instances(JOB), laptop.ledger(JOB), laptop.events(JOB), laptop.job(JOB))
    assert not merge_snapshot(laptop, new)  # the same one again: nothing changes
    assert not merge_snapshot(laptop, old)  # an older one: nothing changes
    after = (laptop.instances(JOB), laptop.ledger(JOB), laptop.events(JOB), laptop.job(JOB))
    assert before == after
    states = {i.id: i.state for i in after[0]}
    assert states["i-1"] == "preempted" and after[3] is not None
    assert after[3].status == "recovering"
    assert len([e for e in after[2] if e.message == "2 nodes running"]) == 1


def test_a_stale_snapshot_of_the_same_database_does_not_go_back(tmp_path: Path) -> None:
    """The local provider: the controller shares this database; its last snapshot predates
    the end of its own instance and the last accrual, which stay."""
    db = _controller_db(tmp_path / "kplan.db")
    snap = build_snapshot(db, JOB, 1, 470.0)
    db.update_instance(JOB, "i-0", "terminated", ended_at=480.0)
    db.put_ledger(LedgerRow(JOB, "i-1", 100.0, 490.0, 390.0, 0.055, False))
    assert not merge_snapshot(db, snap)  # written from this very database
    other = StateDB.open(tmp_path / "other.db")
    other.create_job(_job())
    other.add_instance(replace(_node(0), state="terminated", ended_at=480.0))
    other.put_ledger(LedgerRow(JOB, "i-1", 100.0, 490.0, 390.0, 0.055, False))
    assert merge_snapshot(other, snap)
    db = other
    assert {i.id: i.state for i in db.instances(JOB)}["i-0"] == "terminated"
    assert {r.instance: r.usd for r in db.ledger(JOB)}["i-1"] == 0.055


def test_closed_ledger_row_never_changes(tmp_path: Path) -> None:
    remote = _controller_db(tmp_path / "controller.db")
    laptop = _laptop_db(tmp_path / "laptop.db")
    remote.put_ledger(LedgerRow(JOB, "i-0", 100.0, 400.0, 300.0, 0.04, True))
    merge_snapshot(laptop, build_snapshot(remote, JOB, 1, 470.0))
    snap = build_snapshot(remote, JOB, 2, 480.0)
    grown = replace(snap.ledger[0], end=900.0, billed_seconds=800.0, usd=9.0, closed=False)
    assert grown.instance == "i-0"
    assert merge_snapshot(laptop, replace(snap, ledger=(grown, *snap.ledger[1:])))
    (row,) = [r for r in laptop.ledger(JOB) if r.instance == "i-0"]
    assert (row.usd, row.closed, row.end) == (0.04, True, 400.0)


def test_local_storage_round_trip_to_a_second_home(tmp_path: Path) -> None:
    """Another machine: an empty database of its own and only the bucket and the job id."""
    bucket = LocalStorage(tmp_path / "bucket")
    remote = _controller_db(tmp_path / "controller.db")
    size = publish(remote, bucket, JOB, 3, 470.0)
    assert 0 < size < 64_000
    second = StateDB.open(tmp_path / "second" / "kplan.db")
    assert sync(second, bucket, JOB) == (3, 470.0)
    assert len(second.instances(JOB)) == 2
    assert second.spend(JOB) == pytest.approx(0.101)
    assert pull(bucket, "j-none") is None


def test_snapshot_size_is_bounded_by_its_event_cap(tmp_path: Path) -> None:
    remote = _controller_db(tmp_path / "controller.db")
    for k in range(800):
        remote.add_event(JOB, 200.0 + k, "progress", f"step {k}")
    snap = build_snapshot(remote, JOB, 1, 1000.0)
    assert len(snap.events) == 500 and snap.events[-1].message == "step 799"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"{not json", "not JSON"),
        (json.dumps({"format": "other/1", "job_id": JOB}).encode(), "format 'other/1'"),
        (json.dumps([1, 2]).encode(), "format 'list'"),
        (json.dumps({"format": FORMAT, "job_id": "j-other"}).encode(), "job 'j-other'"),
        (json.dumps({"format": FORMAT, "job_id": JOB, "seq": 1}).encode(), "missing"),
    ],
)
def test_damaged_or_foreign_snapshot_is_refused_and_merges_nothing(
    tmp_path: Path, data: bytes, why: str
) -> None:
    bucket = LocalStorage(tmp_path / "bucket")
    bucket.put_bytes(snapshot_key(JOB), data)
    laptop = _laptop_db(tmp_path / "laptop.db")
    before = (laptop.instances(JOB), laptop.ledger(JOB), laptop.events(JOB), laptop.job(JOB))
    with pytest.raises(InputError) as err:
        sync(laptop, bucket, JOB)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert err.value.hint
    after = (laptop.instances(JOB), laptop.ledger(JOB), laptop.events(JOB), laptop.job(JOB))
    assert before == after


def test_unknown_ledger_kind_is_refused(tmp_path: Path) -> None:
    remote = _controller_db(tmp_path / "controller.db")
    doc = json.loads(build_snapshot(remote, JOB, 1, 470.0).to_json())
    doc["ledger"][0]["kind"] = "gold"
    with pytest.raises(InputError, match="unknown ledger kind"):
        parse_snapshot(json.dumps(doc).encode(), JOB, "here")


def test_a_snapshot_round_trips_through_its_json(tmp_path: Path) -> None:
    """What the controller writes is what a reader parses: every row, typed."""
    remote = _controller_db(tmp_path / "controller.db")
    remote.add_event(JOB, 130.0, "guard", "spend 0.1", {"usd": 0.1})
    snap = build_snapshot(remote, JOB, 4, 470.0)
    assert parse_snapshot(snap.to_json(), JOB, "here") == snap
    doc = json.loads(snap.to_json())
    doc["events"][-1]["data"] = [1]
    with pytest.raises(InputError, match="not a mapping"):
        parse_snapshot(json.dumps(doc).encode(), JOB, "here")


def test_s3_round_trip(moto: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.aws_server import fake_credentials, moto_backend

    fake_credentials(monkeypatch)
    storage = moto_backend(moto)  # type: ignore[arg-type]
    remote = _controller_db(tmp_path / "controller.db")
    publish(remote, storage.storage, JOB, 5, 470.0)
    second = StateDB.open(tmp_path / "second.db")
    assert sync(second, storage.storage, JOB) == (5, 470.0)
    assert {i.id for i in second.instances(JOB)} == {"i-0", "i-1"}
    assert second.spend(JOB) == pytest.approx(0.101)


def test_status_and_report_merge_the_snapshot_from_the_jobs_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another machine's KPLAN_HOME holds only the job row; the controller's database is
    another file; `kplan status`/`report` show its nodes and spend after the sync, and a
    damaged snapshot is exit 2 with this database untouched."""
    import time

    from typer.testing import CliRunner

    from kplan.cli.main import app

    now = time.time()
    storage = _laptop_home(tmp_path, monkeypatch, now)
    remote = _controller_db(tmp_path / "controller.db")
    remote.set_status(JOB, "running", now)
    publish(remote, storage, JOB, 1, now - 40)
    runner = CliRunner()
    status = runner.invoke(app, ["status", JOB])
    assert status.exit_code == 0, status.output
    assert "controller state as of" in status.output
    shown = runner.invoke(app, ["status", JOB, "--json"])
    doc = json.loads(shown.output)
    assert {i["id"] for i in doc["instances"]} == {"i-0", "i-1"}
    report = runner.invoke(app, ["report", JOB])
    assert report.exit_code == 0, report.output
    assert "controller state as of" in report.output
    with StateDB.open() as laptop:
        assert laptop.spend(JOB) == pytest.approx(0.101)
        before = (laptop.instances(JOB), laptop.ledger(JOB), laptop.events(JOB))
    storage.put_bytes(snapshot_key(JOB), b"{damaged")
    bad = runner.invoke(app, ["status", JOB])
    assert bad.exit_code == 2
    with StateDB.open() as laptop:
        assert (laptop.instances(JOB), laptop.ledger(JOB), laptop.events(JOB)) == before


def test_read_only_home_shows_the_snapshot_age_and_merges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KPLAN_HOME this process cannot write (a read-only mount; here the writable open fails
    as it does there): `kplan status JOB` still answers, says how old the controller's snapshot
    is and that it was not merged, and the database is unchanged."""
    import time

    from typer.testing import CliRunner

    from kplan.cli.commands import jobs
    from kplan.cli.main import app
    from kplan.launcher.statecheck import StateError

    now = time.time()
    publish(
        _controller_db(tmp_path / "controller.db"),
        _laptop_home(tmp_path, monkeypatch, now),
        JOB,
        3,
        now,
    )
    real_db = jobs._db

    def read_only_db(readonly: bool = False) -> StateDB:
        if not readonly:
            raise StateError("cannot open the state database for writing", hint="read-only")
        return real_db(readonly=True)

    monkeypatch.setattr(jobs, "_db", read_only_db)
    status = CliRunner().invoke(app, ["status", JOB])
    assert status.exit_code == 0, status.output
    assert "snapshot 3" in status.output and "not merged" in status.output
    with StateDB.open() as laptop:
        assert laptop.instances(JOB) == [] and merged_seq(laptop, JOB) is None


def test_status_watch_follows_a_controller_on_its_own_instance_until_the_job_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No launcher runs on this machine (the job's launcher pid is None: "gone"), but a
    controller elsewhere beats fresh: `kplan status JOB --watch` keeps refreshing, merging the
    snapshot each time, and ends when the controller's snapshot says the job succeeded (before,
    it printed one block and stopped at "launcher gone")."""
    import threading
    import time

    from typer.testing import CliRunner

    from kplan.cli.main import app
    from kplan.launcher.controller import ControllerDoc, write_controller

    now = time.time()
    storage = _laptop_home(tmp_path, monkeypatch, now)
    remote = _controller_db(tmp_path / "controller.db")
    remote.set_status(JOB, "running", now)
    publish(remote, storage, JOB, 1, now)

    def beat(at: float) -> None:
        write_controller(storage, ControllerDoc(
            job=JOB, host="controller-vm", pid=4242, mode="instance", started_at=now - 60,
            heartbeat_at=at, check_interval_s=2.0, job_started_at=now - 60, generation=1,
            launches={0: 1, 1: 1}, lost_nodes=0, counted=(),
        ))  # fmt: skip

    beat(now)

    def controller() -> None:  # the job ends a moment later, as a controller would publish it
        time.sleep(0.8)
        with StateDB.open(tmp_path / "controller.db") as own:  # a connection of this thread
            own.set_status(JOB, "succeeded", time.time())
            publish(own, storage, JOB, 2, time.time())
        beat(time.time())

    thread = threading.Thread(target=controller)
    thread.start()
    res = CliRunner().invoke(app, ["status", JOB, "--watch", "--interval", "0.2"])
    thread.join()
    assert res.exit_code == 0, res.output
    assert "controller: alive (instance, pid 4242 on controller-vm" in res.output
    assert res.output.count("controller state as of") >= 3  # refreshed, not one block
    with StateDB.open() as laptop:
        job = laptop.job(JOB)
        assert job is not None and job.status == "succeeded"
        seq = merged_seq(laptop, JOB)
        assert seq is not None and seq[0] == 2


def test_a_controller_restarted_without_the_database_keeps_every_ledger_kind(
    tmp_path: Path,
) -> None:
    """The controller's instance is lost with its database; the one restarted elsewhere
    rebuilds the job from the bucket: the snapshot brings the storage and egress rows (the
    guard counts them; from the controller document alone they were missing, and the egress
    would be recorded a second time), the plan and the events; the document, written later,
    brings the node that ended since. Spend equals the dead controller's."""
    from kplan.launcher.clock import FakeClock
    from kplan.launcher.controller import ControllerDoc
    from kplan.launcher.controller_resume import import_job
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.journal import Journal

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec.local(str(script), job_id=JOB, rdzv_port=29500)
    remote = StateDB.open(tmp_path / "controller.db")
    remote.create_job(replace(_job(), spec=spec.to_dict(), plan={"chosen": {"nodes": 2}}))
    for rank in (0, 1):
        remote.add_instance(_node(rank))
        remote.put_ledger(LedgerRow(JOB, f"i-{rank}", 100.0, 460.0, 360.0, 0.05, False))
    remote.put_ledger(LedgerRow(JOB, "storage", 100.0, 460.0, 360.0, 0.001, False, "storage"))
    remote.put_ledger(LedgerRow(JOB, "egress", 100.0, 100.0, 0.0, 0.9, True, "egress"))
    remote.add_event(JOB, 120.0, "nodes", "2 nodes running")
    bucket = LocalStorage(tmp_path / "bucket")
    publish(remote, bucket, JOB, 7, 460.0)
    ended = replace(_node(1), state="preempted", ended_at=470.0)
    doc = ControllerDoc(
        job=JOB, host="lost-vm", pid=77, mode="instance", started_at=100.0, heartbeat_at=470.0,
        check_interval_s=10.0, job_started_at=100.0, generation=1, launches={0: 1, 1: 1},
        spec=spec.to_dict(), instances=(_node(0), ended),
    )  # fmt: skip
    fresh = StateDB.open(tmp_path / "elsewhere" / "kplan.db")
    journal = Journal.for_job(tmp_path / "elsewhere", JOB)
    snap = pull(bucket, JOB)
    row = import_job(fresh, doc, journal, FakeClock(480.0), snap)
    assert row.plan == {"chosen": {"nodes": 2}}
    kinds = {r.instance: (r.kind, r.usd, r.closed) for r in fresh.ledger(JOB)}
    assert kinds["storage"][0] == "storage" and kinds["egress"] == ("egress", 0.9, True)
    assert kinds["i-1"][2] is True and kinds["i-0"][2] is False  # ended since the snapshot
    assert fresh.spend(JOB) >= remote.spend(JOB) - 1e-12
    states = {i.id: i.state for i in fresh.instances(JOB)}
    assert states == {"i-0": "running", "i-1": "preempted"}
    messages = [e.message for e in fresh.events(JOB)]
    assert "2 nodes running" in messages
    assert any("and its state snapshot 7" in m for m in messages)
    bare = StateDB.open(tmp_path / "bare" / "kplan.db")  # no snapshot: the document alone
    import_job(bare, doc, Journal.for_job(tmp_path / "bare", JOB), FakeClock(480.0))
    assert {r.kind for r in bare.ledger(JOB)} == {"instance"}


def test_a_job_that_moved_region_has_its_new_region_merged(tmp_path: Path) -> None:
    """A controller moved the job to another region (launcher/region_move.py): the merged row
    and spec name it (kplan status, kplan down), with this machine's storage kept."""
    remote = _controller_db(tmp_path / "controller.db")
    laptop = _laptop_db(tmp_path / "laptop.db")
    laptop.update_spec(JOB, {"nodes": [{"gpus": 1}], "storage_uri": "file:///here"})
    moved = {"nodes": [{"gpus": 1}], "region": "us-west-2", "storage_uri": "s3://b/jobs"}
    remote.update_spec(JOB, moved)
    remote.set_status(JOB, "running", 600.0)
    assert merge_snapshot(laptop, build_snapshot(remote, JOB, 1, 610.0))
    job = laptop.job(JOB)
    assert job is not None and job.region == "us-west-2" and job.spec["region"] == "us-west-2"
    assert job.spec["storage_uri"] == "file:///here"
