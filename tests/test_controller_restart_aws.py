"""A controller killed mid-job and restarted, through the aws provider: boto3 against moto.

The job's worker (node 1) is interrupted as a spot instance; the controller dies like
``kill -9`` (every later call it would make raises) at one of three points: when it has seen
the interruption but asked for no replacement, right after ``run_instances`` returned the
replacement (the cloud made it, no journal line or database row records it), and once the
replacement is recorded. ``resume_job`` then takes the job over from the same database, journal
and S3 bucket; the nodes finish (status files, power off, as their bootstrap does). Each run
ends ``succeeded``, with no instance or security group left in EC2 and one closed ledger row
per instance EC2 made for the job (the orphaned replacement adopted, not launched again).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from kplan.launcher.bootstrap import status_key
from kplan.launcher.clock import SystemClock
from kplan.launcher.controller_resume import resume_job
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer, new_job_id
from kplan.launcher.lifecycle import run_job
from kplan.launcher.provider import ClusterSpec, Instance, InstanceSpec
from kplan.launcher.providers import Backend
from kplan.launcher.providers.aws import AwsProvider
from kplan.launcher.providers.aws_common import AwsConfig
from kplan.launcher.providers.aws_storage import S3Storage
from kplan.launcher.state import EventRecord
from tests.aws_server import BUCKET, REGION, MotoAws, fake_credentials, moto_config
from tests.test_controller_restart import Death, KillDB, Killed, KillJournal

ZONE = "us-east-1a"
SPOT = 0.45


class DyingAws(AwsProvider):
    """The aws provider of a controller that may die: after the death every call raises;
    ``die_after_launch``: it dies as the ``n``-th ``run_instances`` returns."""

    def __init__(self, config: AwsConfig, death: Death, die_after_launch: int | None) -> None:
        super().__init__(config)
        self.death = death
        self.die_after_launch = die_after_launch
        self.launches = 0

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        self.death.check()
        made = super().run_instances(cluster, specs)
        self.launches += 1
        if self.launches == self.die_after_launch:
            self.death.dead = True
            raise Killed
        return made

    def query_instances(self, job_id: str) -> list[Instance]:
        self.death.check()
        return super().query_instances(job_id)

    def terminate_instances(self, ids: Sequence[str]) -> None:
        self.death.check()
        super().terminate_instances(ids)

    def cleanup(self, cluster: ClusterSpec) -> None:
        self.death.check()
        super().cleanup(cluster)


class DyingS3(S3Storage):
    def __init__(self, uri: str, config: AwsConfig, death: Death) -> None:
        super().__init__(uri, config)
        self.death = death

    def put_bytes(self, key: str, data: bytes) -> None:
        self.death.check()
        super().put_bytes(key, data)

    def delete_prefix(self, prefix: str) -> None:
        self.death.check()
        super().delete_prefix(prefix)


def _spec(tmp_path: Path) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('training')\n")
    return JobSpec.build(
        job_id=new_job_id(),
        cloud="aws",
        region=REGION,
        script=str(script),
        nodes=tuple(NodeSpec(r, "g5.xlarge", "spot", ZONE, 1, SPOT) for r in (0, 1)),
        budget_usd=20.0,
        check_interval_s=0.1,
        grace_s=1.0,
        teardown_s=10.0,
        finish_grace_s=5.0,
        provision_timeout_s=30.0,
        offers=(ZoneOffer("g5.xlarge", ZONE, "spot", SPOT),),
    )


def _finish(backend: Backend, moto: MotoAws, job_id: str) -> None:
    """The bootstrap's last steps on every live node: status file to S3, then poweroff."""
    for inst in backend.provider.query_instances(job_id):
        if inst.alive:
            doc = {"exit_code": 0, "time": 0.0, "node_rank": inst.node_rank, "instance": inst.name}
            backend.storage.put_bytes(status_key(job_id, inst.node_rank), json.dumps(doc).encode())
            moto.power_off(inst.id)


@pytest.mark.parametrize("stage", ["seen-preempted", "after-run-instances", "recorded"])
def test_a_controller_killed_during_a_replacement_is_restarted(
    moto: MotoAws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stage: str
) -> None:
    fake_credentials(monkeypatch)
    config = moto_config(moto)
    death = Death()
    spec = _spec(tmp_path)
    job = spec.job_id
    provider = DyingAws(config, death, 3 if stage == "after-run-instances" else None)
    backend = Backend(provider, DyingS3(f"s3://{BUCKET}/jobs", config, death))
    db = KillDB.open(tmp_path / "kplan.db")
    db.death = death
    journal = KillJournal(tmp_path / "journal.jsonl", death)

    def first(event: EventRecord) -> None:
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{job}-n1-r0":
            moto.interrupt_spot(str(data["instance"]))
        die = (stage == "seen-preempted" and event.kind == "preempted") or (
            stage == "recorded" and event.kind == "launch" and data.get("name") == f"{job}-n1-r1"
        )
        if die:
            death.dead = True
            raise Killed

    with pytest.raises(Killed):
        run_job(spec, backend, db, clock=SystemClock(), on_event=first, journal=journal)
    db.close()
    assert moto.leftovers(job)["instances"], "the dead controller left its nodes running"
    death.dead = False
    done = threading.Event()

    def second(event: EventRecord) -> None:
        if event.kind == "controller":  # the new controller took over: the nodes finish soon
            threading.Timer(1.5, lambda: done.is_set() or _finish(backend, moto, job)).start()

    with KillDB.open(tmp_path / "kplan.db") as again:
        again.death = death
        out = resume_job(job, backend, again, clock=SystemClock(), on_event=second, journal=journal)
        done.set()
        rows = again.ledger(job)
        events = [e.kind for e in again.events(job)]
    assert out.status == "succeeded", out.reason
    assert moto.leftovers(job) == {"instances": [], "security_groups": [], "volumes": []}
    made = sorted(str(i["InstanceId"]) for i in moto.raw_instances(job))
    billed = sorted(r.instance for r in rows)
    assert billed == made, "one ledger row per instance EC2 made, none twice"
    assert all(r.closed for r in rows)
    assert len(made) == 3  # the head, the worker and one replacement: nothing launched twice
    assert "controller" in events and "stray" not in events
