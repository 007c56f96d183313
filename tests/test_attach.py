"""``kplan attach JOB --storage URI``: a second machine (an empty KPLAN_HOME of its own) follows a
job from the controller's state snapshot alone, through LocalStorage and through S3 (moto): attach,
status, report, down (which ends the job's EC2 instances); attaching again, or a job already here,
merges and never duplicates; a damaged, foreign or missing snapshot is exit 2 and writes nothing;
``kplan down`` merges the latest snapshot first, best-effort."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.launcher.jobspec import JobSpec, NodeSpec, new_job_id
from kplan.launcher.snapshot import merged_seq, publish, snapshot_key
from kplan.launcher.state import InstanceRecord, JobRecord, LedgerRow, StateDB
from kplan.launcher.storage import LocalStorage, Storage


def _row(spec: JobSpec, now: float) -> JobRecord:
    return JobRecord(
        id=spec.job_id,
        status="running",
        reason=None,
        cloud=spec.cloud,
        region=spec.region,
        spec=spec.to_dict(),
        plan=None,
        budget_usd=spec.budget_usd,
        deadline_h=None,
        predicted_hours=1.0,
        predicted_cost_usd=0.5,
        predicted_cost_p90_usd=0.6,
        launcher_pid=4242,  # the controller's pid, on its own machine
        stop_requested=None,
        created_at=now - 600,
        updated_at=now - 60,
    )


def _node(spec: JobSpec, iid: str, rank: int, now: float) -> InstanceRecord:
    node = spec.nodes[rank]
    return InstanceRecord(
        iid, spec.job_id, f"{spec.job_id}-n{rank}-r0", rank, spec.cloud, spec.region, node.zone,
        node.instance_type, node.market, node.usd_per_hour, "running", now - 500,
    )  # fmt: skip


def _controller_db(path: Path, spec: JobSpec, ids: list[str], now: float) -> StateDB:
    """The controller's own database (another machine's): the job, its nodes, ledger, events."""
    db = StateDB.open(path)
    db.create_job(_row(spec, now))
    for rank, iid in enumerate(ids):
        db.add_instance(_node(spec, iid, rank, now))
        db.put_ledger(LedgerRow(spec.job_id, iid, now - 500, now - 60, 440.0, 0.05, False))
    db.add_event(spec.job_id, now - 400, "head", "node 0 is up")
    return db


def _rows(home: Path, job_id: str) -> tuple[Any, ...]:
    with StateDB.open(home / "kplan.db") as db:
        return (db.jobs(), db.instances(job_id), db.ledger(job_id), db.events(job_id))


def _local_job(tmp_path: Path, bucket: LocalStorage) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec.local(str(script), nodes=2, job_id=new_job_id(), rdzv_port=29500)
    return replace(spec, storage_uri=bucket.uri)


def test_local_storage_round_trip_to_an_empty_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    bucket = LocalStorage(tmp_path / "bucket")
    spec = _local_job(tmp_path, bucket)
    job = spec.job_id
    remote = _controller_db(tmp_path / "controller" / "kplan.db", spec, ["n-0", "n-1"], now)
    publish(remote, bucket, job, 7, now - 30)
    second = tmp_path / "second"
    monkeypatch.setenv("KPLAN_HOME", str(second))
    runner = CliRunner()

    status = runner.invoke(app, ["status", job])  # before: this machine knows no such job
    assert status.exit_code == 2 and "kplan attach" in status.output
    done = runner.invoke(app, ["attach", job, "--storage", str(tmp_path / "bucket")])
    assert done.exit_code == 0, done.output
    assert f"{job}: attached (running on local local; 2 instance(s) alive" in done.output
    assert "controller state as of" in done.output and f"kplan down {job}" in done.output
    with StateDB.open(second / "kplan.db") as db:
        rec = db.job(job)
        assert rec is not None and rec.launcher_pid is None  # no launcher on this machine
        assert JobSpec.from_dict(rec.spec).storage_uri == bucket.uri
        assert merged_seq(db, job) == (7, now - 30)

    shown = runner.invoke(app, ["status", job, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert {i["id"] for i in doc["instances"]} == {"n-0", "n-1"}
    assert doc["spend_usd"] == pytest.approx(0.10)
    report = runner.invoke(app, ["report", job, "--json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.output)["id"] == job
    assert json.loads(report.output)["total_usd"] == pytest.approx(0.10)

    before = _rows(second, job)
    again = runner.invoke(app, ["attach", job, "--storage", bucket.uri, "--json"])
    assert again.exit_code == 0, again.output
    assert (json.loads(again.output)["created"], json.loads(again.output)["merged"]) == (
        False,
        False,
    )
    assert _rows(second, job) == before  # idempotent: nothing added twice

    remote.update_instance(job, "n-1", "preempted", ended_at=now - 10, reason="reclaimed")
    publish(remote, bucket, job, 8, now - 5)
    newer = runner.invoke(app, ["attach", job, "--storage", str(tmp_path / "bucket")])
    assert newer.exit_code == 0 and "already here; merged" in newer.output
    jobs, instances, _, _ = _rows(second, job)
    assert len(jobs) == 1 and len(instances) == 2
    assert {i.id: i.state for i in instances}["n-1"] == "preempted"


def test_attach_merges_into_a_job_already_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launching machine: its row and the controller instance's row are kept, the
    controller's nodes and ledger added, the job row not duplicated."""
    now = time.time()
    bucket = LocalStorage(tmp_path / "bucket")
    spec = _local_job(tmp_path, bucket)
    job = spec.job_id
    home = tmp_path / "laptop"
    monkeypatch.setenv("KPLAN_HOME", str(home))
    with StateDB.open(home / "kplan.db") as laptop:
        laptop.create_job(replace(_row(spec, now), status="pending", launcher_pid=None))
        ctl = replace(_node(spec, "ctl", 0, now), node_rank=-1, name=f"{job}-ctl-r0")
        laptop.add_instance(ctl)
        laptop.put_ledger(LedgerRow(job, "ctl", now - 550, now - 500, 60.0, 0.0003, False))
    remote = _controller_db(tmp_path / "controller.db", spec, ["n-0", "n-1"], now)
    publish(remote, bucket, job, 3, now)
    done = CliRunner().invoke(app, ["attach", job, "--storage", bucket.uri])
    assert done.exit_code == 0, done.output
    assert "already here; merged" in done.output
    jobs, instances, ledger, _ = _rows(home, job)
    assert [j.id for j in jobs] == [job] and jobs[0].status == "running"
    assert {i.id for i in instances} == {"ctl", "n-0", "n-1"}
    assert {r.instance for r in ledger} == {"ctl", "n-0", "n-1"}


def _put(bucket: LocalStorage, job: str, data: bytes) -> None:
    bucket.put_bytes(snapshot_key(job), data)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing", "no controller state snapshot"),
        ("damaged", "not JSON"),
        ("foreign", "not 'JOB''s"),
        ("spec", "its job spec"),
        ("cloud", "runs on aws"),
    ],
)
def test_bad_snapshot_is_exit_2_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, match: str
) -> None:
    now = time.time()
    bucket = LocalStorage(tmp_path / "bucket")
    spec = _local_job(tmp_path, bucket)
    job = spec.job_id
    remote = _controller_db(tmp_path / "controller.db", spec, ["n-0"], now)
    if case == "damaged":
        _put(bucket, job, b"{half a snapsh")
    elif case == "foreign":  # another job's snapshot under this job's key
        (tmp_path / "o").mkdir()
        other = _local_job(tmp_path / "o", bucket)
        publish(
            _controller_db(tmp_path / "other.db", other, ["x"], now), bucket, other.job_id, 1, 0
        )
        _put(bucket, job, bucket.get_bytes(snapshot_key(other.job_id)) or b"")
    elif case in ("spec", "cloud"):
        publish(remote, bucket, job, 1, now)
        doc = json.loads(bucket.get_bytes(snapshot_key(job)) or b"")
        if case == "spec":
            doc["job"]["spec"] = {"nodes": "many"}
        else:
            doc["job"]["cloud"] = "aws"
        _put(bucket, job, json.dumps(doc).encode())
    home = tmp_path / "second"
    monkeypatch.setenv("KPLAN_HOME", str(home))
    result = CliRunner().invoke(app, ["attach", job, "--storage", str(tmp_path / "bucket")])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: ") and len(lines) == 2
    assert match.replace("JOB", job) in lines[0]
    assert not home.exists()  # nothing written: not even the home folder


def test_attach_refuses_a_uri_that_is_no_storage(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["attach", "kp-x1", "--storage", "ftp://host/x"],
        env={"KPLAN_HOME": str(tmp_path / "h")},
    )
    assert result.exit_code == 2 and "not a job storage URI" in result.stderr
    assert not (tmp_path / "h").exists()


class _Unreachable:
    """A job storage whose every call fails as a cloud's does when the network is down."""

    uri = "s3://kplan-unreachable/jobs"

    def _fail(self, *args: object) -> Any:
        from kplan.core.errors import CloudError

        raise CloudError("read s3://kplan-unreachable/jobs: could not connect", hint="network")

    put_bytes = get_bytes = list_keys = delete_prefix = _fail


def test_down_merges_the_latest_snapshot_first_and_goes_on_without_storage(
    tmp_path: Path,
) -> None:
    """`kplan down` merges the controller's newest rows (its third node, which this database
    never saw, is recorded as ended) and, when the storage cannot be reached, says so in one
    line and ends the job all the same."""
    from kplan.app.stopping import DownRequest, take_down
    from kplan.launcher.down import DownResult
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.local import LocalProvider

    now = time.time()
    bucket = LocalStorage(tmp_path / "bucket")
    spec = _local_job(tmp_path, bucket)
    spec = replace(spec, nodes=(*spec.nodes, replace(spec.nodes[0], node_rank=2)))
    job = spec.job_id
    home = tmp_path / "home"
    with StateDB.open(home / "kplan.db") as db:
        db.create_job(replace(_row(spec, now), launcher_pid=None))
    remote = _controller_db(tmp_path / "controller.db", spec, ["n-0", "n-1", "n-2"], now)
    publish(remote, bucket, job, 5, now - 3)

    def run(storage: Storage) -> DownResult:
        def backend_for(cloud: str, region: str | None, uri: str | None) -> Backend:
            return Backend(LocalProvider(home), storage)

        results = take_down(
            DownRequest(job, wait_s=0.0), lambda: StateDB.open(home / "kplan.db"), backend_for
        )
        assert isinstance(results, list)
        return results[0]

    unreachable = run(_Unreachable())  # type: ignore[arg-type]
    assert unreachable.snapshot is not None
    assert unreachable.snapshot.startswith("controller state snapshot not merged (read s3://")
    assert unreachable.status is not None and unreachable.recorded
    with StateDB.open(home / "kplan.db") as db:
        db.set_status(job, "running", now)  # as it was, to take it down again with the bucket
    merged = run(bucket)
    assert merged.snapshot is not None and "controller state as of" in merged.snapshot
    with StateDB.open(home / "kplan.db") as db:
        rows = db.instances(job)
        assert {i.id for i in rows} == {"n-0", "n-1", "n-2"}
        assert not any(i.alive for i in rows) and all(r.closed for r in db.ledger(job))


def test_s3_round_trip_attach_status_report_and_down_ends_the_instances(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's machine launched two spot nodes in EC2 (moto) and published its rows
    to S3; a second machine with an empty KPLAN_HOME and only credentials attaches the job,
    sees its nodes and spend, reports it, and `kplan down` terminates the nodes in EC2."""
    from kplan.launcher.bootstrap import cluster_spec, instance_spec, rendezvous
    from tests.aws_server import BUCKET, REGION, ZONE, fake_credentials, moto_backend

    fake_credentials(monkeypatch)
    backend = moto_backend(moto)
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('training')\n")
    nodes = tuple(NodeSpec(r, "g5.xlarge", "spot", ZONE, gpus=1, usd_per_hour=0.45) for r in (0, 1))
    uri = f"s3://{BUCKET}/jobs"
    spec = JobSpec.build(
        job_id=new_job_id(), cloud="aws", region=REGION, script=str(script), nodes=nodes,
        budget_usd=20.0, storage_uri=uri,
    )  # fmt: skip
    cluster = cluster_spec(spec, uri)
    backend.provider.prepare(cluster)
    made = backend.provider.run_instances(
        cluster,
        [
            instance_spec(spec, node, f"{spec.job_id}-n{node.node_rank}-r0", rdzv, uri)
            for node, rdzv in zip(
                nodes, (rendezvous(spec, 0, None), rendezvous(spec, 0, "10.0.0.1")), strict=True
            )
        ],
    )
    now = time.time()
    ids = [i.id for i in made]
    remote = _controller_db(tmp_path / "controller" / "kplan.db", spec, ids, now)
    publish(remote, backend.storage, spec.job_id, 11, now - 20)

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "second"))
    monkeypatch.setenv("KPLAN_AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("KPLAN_AWS_PLACEMENT_GROUPS", "0")
    runner = CliRunner()
    job = spec.job_id
    done = runner.invoke(app, ["attach", job, "--storage", uri])
    assert done.exit_code == 0, done.output
    assert "attached (running on aws us-east-1; 2 instance(s) alive" in done.output
    shown = runner.invoke(app, ["status", job, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert {i["id"] for i in doc["instances"]} == set(ids)
    assert doc["spend_usd"] == pytest.approx(0.10)
    report = runner.invoke(app, ["report", job])
    assert report.exit_code == 0, report.output
    assert "controller state as of" in report.output

    down = runner.invoke(app, ["down", job, "--wait", "0"])
    assert down.exit_code == 0, down.output
    assert "controller state as of" in down.output and "terminated" in down.output
    assert moto.leftovers(job) == {"instances": [], "security_groups": [], "volumes": []}
    with StateDB.open(tmp_path / "second" / "kplan.db") as db:
        rec = db.job(job)
        assert rec is not None and rec.status == "cancelled"
        assert {i.state for i in db.instances(job)} == {"terminated"}
        assert all(r.closed for r in db.ledger(job))


def test_gcs_round_trip_attach_status_and_down_ends_the_instances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through Cloud Storage and Compute Engine (the local servers): attach from
    gs://, the nodes and spend in `status --json`, and `kplan down` deletes the job's VMs."""
    from kplan.launcher.provider import TAG_JOB, ClusterSpec, InstanceSpec
    from kplan.launcher.providers import ProviderSettings, get_backend
    from tests.gcp_server import FakeCompute
    from tests.gcs_server import FakeGCS

    bucket, zone, t4 = "kplan-attach-bucket", "us-central1-a", "n1-standard-8+1xT4"
    compute, gcs = FakeCompute(boot_delay_s=0.0), FakeGCS(bucket)
    with compute.serve() as compute_url, gcs.serve() as gcs_url:
        for var, value in (
            ("KPLAN_GCP_PROJECT", "kplan-attach-1"),
            ("KPLAN_GCP_ENDPOINT", compute_url),
            ("KPLAN_GCS_ENDPOINT", gcs_url),
            ("KPLAN_GCP_ANONYMOUS", "1"),
        ):
            monkeypatch.setenv(var, value)
        uri = f"gs://{bucket}/jobs"
        script = tmp_path / "train.py"
        script.write_text("print('training')\n")
        nodes = tuple(NodeSpec(r, t4, "spot", zone, gpus=1, usd_per_hour=0.16) for r in (0, 1))
        spec = JobSpec.build(
            job_id=new_job_id(), cloud="gcp", region="us-central1", script=str(script),
            nodes=nodes, budget_usd=5.0, storage_uri=uri,
        )  # fmt: skip
        job = spec.job_id
        launcher = get_backend("gcp", ProviderSettings(tmp_path / "controller", None, uri))
        cluster = ClusterSpec(job_id=job, cloud="gcp", region="us-central1")
        launcher.provider.prepare(cluster)
        made = launcher.provider.run_instances(
            cluster,
            [
                InstanceSpec(job, f"{job}-n{r}-r0", "gcp", "us-central1", zone, t4, "spot", r, "")
                for r in (0, 1)
            ],
        )
        now = time.time()
        remote = _controller_db(tmp_path / "controller.db", spec, [i.id for i in made], now)
        publish(remote, launcher.storage, job, 2, now)

        monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "second"))
        runner = CliRunner()
        done = runner.invoke(app, ["attach", job, "--storage", uri])
        assert done.exit_code == 0, done.output
        doc = json.loads(runner.invoke(app, ["status", job, "--json"]).output)
        assert {i["id"] for i in doc["instances"]} == {i.id for i in made}
        assert doc["spend_usd"] == pytest.approx(0.10)
        down = runner.invoke(app, ["down", job, "--wait", "0"])
        assert down.exit_code == 0, down.output
        assert not [i for i in compute.instances.values() if i["labels"].get(TAG_JOB) == job]
