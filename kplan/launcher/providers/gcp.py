"""The ``gcp`` provider: worker groups on Compute Engine instances (google-cloud-compute, REST).

Per job it creates firewall rules that open the rendezvous/NCCL port range only between the
job's instances (matched by a network tag derived from the job id), plus SSH from
``ClusterSpec.ssh_cidr`` only when one is given; and one instance per node, Spot
(``provisioningModel=SPOT`` with the configured termination action) or standard. Instances and
their boot disks carry the labels ``kplan-job``, ``kplan-node`` and ``kplan-managed``; firewall
rules have no labels in Compute Engine, so their names derive from the job id (see
``gcp_config.firewall_names``) and their descriptions name it. ``query_instances`` and
``cleanup`` work from labels and names alone, with no state database.

An instance's ``id`` is ``<zone>/<name>``: Compute Engine addresses instances by zone and name.
A preemption is reported only on GCP's own record of one, a ``compute.instances.preempted``
operation (or a status message saying so); an instance that powered itself off (the bootstrap
does when torchrun exits) is ``terminated``.

Settings come from the environment, read by :func:`create` (see ``GcpConfig.from_env``):
``KPLAN_GCP_PROJECT`` and the optional ``KPLAN_GCP_*`` values, ``KPLAN_GCP_STORAGE_URI``
(``gs://bucket/prefix``), and ``KPLAN_GCP_ANONYMOUS=1`` for a local test server only.
``KPLAN_GCS_ENDPOINT`` points Cloud Storage at a local test server too. Credentials come from
Application Default Credentials, never from kplan, checked by :func:`create` before anything
else (``gcp_auth``: a missing credential fails in a second, with no job made); the instances
get theirs from their service account, with the storage and logging scopes only. The calls
themselves (retries, operation waits) are in ``gcp_api``.

Not done: ``ClusterSpec.placement_group`` (a compact placement resource policy) is ignored, so
nodes share a zone but not necessarily a rack.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from kplan.core.errors import CloudError, InputError
from kplan.launcher.clock import Clock, SystemClock
from kplan.launcher.provider import TAG_JOB, ClusterSpec, Instance, InstanceSpec
from kplan.launcher.providers import gcp_errors
from kplan.launcher.providers.envvars import setting
from kplan.launcher.providers.gcp_api import PREEMPTION, ComputeApi, down_hint, split_id
from kplan.launcher.providers.gcp_auth import find_credentials, sdk_installed
from kplan.launcher.providers.gcp_build import (
    STATES,
    STOPPED_STATES,
    build_firewalls,
    build_instance,
    to_instance,
)
from kplan.launcher.providers.gcp_config import (
    PROJECT_ENV,
    GcpConfig,
    firewall_names,
    label_value,
)

if TYPE_CHECKING:
    from kplan.launcher.providers import Backend, ProviderSettings


def config_for(base: GcpConfig, cluster: ClusterSpec | None) -> GcpConfig:
    """``base`` with the job's own network, subnet, service account and external IP choice
    (``kplan launch --network/--subnet/--service-account/--no-external-ip``)."""
    if cluster is None:
        return base
    return dataclasses.replace(
        base,
        network=cluster.network or base.network,
        subnetwork=cluster.subnet or base.subnetwork,
        service_account=cluster.service_account or base.service_account,
        external_ip=base.external_ip and cluster.external_ip,
    )


class GcpProvider:
    """The provider verbs over Compute Engine, in one project (``config.project``)."""

    name = "gcp"

    def __init__(
        self, config: GcpConfig, *, credentials: Any = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        self._clock = clock or SystemClock()
        self.api = ComputeApi(config, credentials, self._clock)
        self._seen: dict[str, Instance] = {}  # id -> last report: tells a DELETE preemption
        self._jobs: dict[str, str] = {}  # label value -> job id

    # --- what GCP reports, as kplan Instances ----------------------------------------------

    def _job_of(self, resource: Any) -> str:
        value = str(resource.labels.get(TAG_JOB, ""))
        return self._jobs.get(value, value)

    def _classify(self, resources: Sequence[Any]) -> list[Instance]:
        """kplan Instances, looking up preemptions for stopped spot instances only."""
        suspects = [
            r
            for r in resources
            if STATES.get(r.status) in STOPPED_STATES and r.scheduling.provisioning_model == "SPOT"
        ]
        evidence = self.api.preemptions(r.zone.rsplit("/", 1)[-1] for r in suspects)
        out = []
        for r in resources:
            reason = evidence.get((r.zone.rsplit("/", 1)[-1], r.name))
            if reason is None and "preempt" in (r.status_message or "").lower():
                reason = PREEMPTION
            inst = to_instance(r, self._job_of(r), preempted=reason)
            self._seen[inst.id] = inst
            out.append(inst)
        return out

    def _vanished(self, ids: Iterable[str]) -> list[Instance]:
        """Instances seen before and now gone: deleted by GCP after a preemption (termination
        action DELETE) or by someone else."""
        gone = [self._seen[i] for i in ids if i in self._seen]
        evidence = self.api.preemptions(i.zone for i in gone if i.market == "spot")
        out = []
        for last in gone:
            reason = evidence.get((last.zone, last.name))
            if last.state == "preempted" or reason:
                now = dataclasses.replace(last, state="preempted", reason=last.reason or reason)
            else:
                now = dataclasses.replace(
                    last, state="terminated", reason="instance deleted outside kplan"
                )
            self._seen[now.id] = now
            out.append(now)
        return out

    def _delete(self, ids: Sequence[str], *, wait: bool) -> list[tuple[str, CloudError]]:
        accepted, failed = self.api.delete_instances(ids, wait=wait)
        for instance_id in accepted:
            self._seen.pop(instance_id, None)
        return failed

    def config_for(self, cluster: ClusterSpec) -> GcpConfig:
        return config_for(self.config, cluster)

    # --- the verbs -------------------------------------------------------------------------

    def prepare(self, cluster: ClusterSpec) -> None:
        """Create the job's firewall rules (an existing rule of the same name is kept)."""
        made: list[str] = []
        try:
            for rule in build_firewalls(cluster, self.config_for(cluster)):
                if self.api.insert_firewall(rule):
                    made.append(rule.name)
        except CloudError as exc:
            failed = self.api.delete_firewalls(made)
            if failed:
                leaked = [name for name, _ in failed]
                raise CloudError(
                    f"{exc.message}; deleting the firewall rules it made failed too: "
                    f"{', '.join(leaked)} ({failed[0][1].message})",
                    f"run `kplan down {cluster.job_id}`, or `gcloud compute firewall-rules "
                    f"delete {' '.join(leaked)}`.",
                ) from exc
            raise

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        """Insert every instance, then wait for the inserts; on any failure delete them all."""
        self._jobs[label_value(cluster.job_id)] = cluster.job_id
        config = self.config_for(cluster)
        bodies = [(spec, build_instance(spec, config)) for spec in specs]  # may raise
        started: list[tuple[str, str]] = []  # (zone, name) of each accepted insert
        try:
            ops: list[tuple[str, Any, str]] = []
            for spec, body in bodies:
                what = (
                    f"creating instance {body.name} ({spec.instance_type}, {spec.market}) "
                    f"in {spec.zone}"
                )
                op = self.api.insert_instance(spec.zone, body, what)
                if op is None:
                    self._adopt(spec, body.name)
                else:
                    ops.append((spec.zone, op, what))
                started.append((spec.zone, body.name))
            for zone, op, what in ops:
                self.api.wait(op, what, zone)
            found = []
            for zone, name in started:
                resource = self.api.get_instance(zone, name)
                if resource is None:
                    raise CloudError(
                        f"GCP instance {zone}/{name} vanished right after it was created",
                        "It may have been preempted at once: try again, or on-demand.",
                    )
                found.append(resource)
            return self._classify(found)
        except CloudError as exc:
            raise self._undo(started, cluster.job_id, exc) from exc

    def _adopt(self, spec: InstanceSpec, name: str) -> None:
        """An insert found the name taken: fine if it is this job's instance (a retry)."""
        existing = self.api.get_instance(spec.zone, name)
        if existing is None or existing.labels.get(TAG_JOB) != label_value(spec.job_id):
            raise CloudError(
                f"GCP instance name {spec.zone}/{name} is taken by an instance of another job",
                "Delete that instance, or launch the job under a new id.",
            )

    def _undo(self, started: list[tuple[str, str]], job_id: str, exc: CloudError) -> CloudError:
        """Delete what a failed launch created; the error to raise says what became of it."""
        ids = [f"{zone}/{name}" for zone, name in started]
        failed = self._delete(ids, wait=True)
        if failed:
            leaked = [i for i, _ in failed]
            return CloudError(
                f"{exc.message}; deleting the instances this launch created failed too: "
                f"{', '.join(leaked)} ({failed[0][1].message})",
                down_hint([job_id], leaked),
            )
        if ids:
            return CloudError(
                f"{exc.message} (deleted the {len(ids)} instance(s) it had started)", exc.hint
            )
        return exc

    def wait_instances(self, ids: Sequence[str], timeout_s: float) -> list[Instance]:
        """Poll until no instance is pending; CloudError naming the slow ones on timeout."""
        deadline = self._clock.now() + timeout_s
        while True:
            found, missing = [], []
            for instance_id in ids:
                resource = self.api.get_instance(*split_id(instance_id))
                if resource is None:
                    missing.append(instance_id)
                else:
                    found.append(resource)
            unknown = [i for i in missing if i not in self._seen]
            if unknown:
                raise CloudError(
                    f"GCP instance(s) {', '.join(unknown)} not found",
                    gcp_errors.HINT_NOT_FOUND,
                )
            report = {i.id: i for i in self._classify(found) + self._vanished(missing)}
            slow = [i for i in ids if report[i].state == "pending"]
            if not slow:
                return [report[i] for i in ids]
            if self._clock.now() >= deadline:
                raise CloudError(
                    f"GCP instance(s) {', '.join(slow)} not running after {timeout_s:.0f} s",
                    down_hint((report[i].job_id for i in slow), slow),
                )
            self._clock.sleep(self.config.poll_interval_s)

    def query_instances(self, job_id: str) -> list[Instance]:
        """Every instance labelled with the job (aggregated over zones), with preemptions."""
        value = label_value(job_id)
        self._jobs[value] = job_id
        resources = self.api.list_instances(
            TAG_JOB, value, f"listing the instances of job {job_id}"
        )
        current = self._classify(resources)
        present = {i.id for i in current}
        gone = [i for i, inst in self._seen.items() if inst.job_id == job_id and i not in present]
        return current + self._vanished(gone)

    def terminate_instances(self, ids: Sequence[str]) -> None:
        """Delete the instances (GCP shuts each down first: SIGTERM reaches the workers).
        Returns once GCP accepted every deletion; ``query_instances`` shows them go."""
        jobs = [self._seen[i].job_id for i in ids if i in self._seen]
        failed = self._delete(ids, wait=False)
        if failed:
            leaked = [i for i, _ in failed]
            raise CloudError(
                f"GCP could not delete instance(s) {', '.join(leaked)}: {failed[0][1].message}",
                down_hint(jobs or ["JOB"], leaked),
            )

    def cleanup(self, cluster: ClusterSpec) -> None:
        """Delete the job's stopped leftovers (a preempted instance kept by termination action
        STOP, one that powered off: the launcher leaves instances it saw gone), then its
        firewall rules."""
        stopped = ("terminated", "preempted")
        leftovers = [i.id for i in self.query_instances(cluster.job_id) if i.state in stopped]
        failed = self._delete(leftovers, wait=True)
        if failed:
            leaked = [i for i, _ in failed]
            raise CloudError(
                f"GCP could not delete stopped instance(s) {', '.join(leaked)} of job "
                f"{cluster.job_id}: {failed[0][1].message}",
                down_hint([cluster.job_id], leaked),
            )
        rules = self.api.delete_firewalls(firewall_names(cluster.job_id))
        if rules:
            names = [name for name, _ in rules]
            raise CloudError(
                f"GCP could not delete the firewall rule(s) {', '.join(names)} of job "
                f"{cluster.job_id}: {rules[0][1].message}",
                f"run `kplan down {cluster.job_id}` again, or `gcloud compute firewall-rules "
                f"delete {' '.join(names)}`.",
            )


def create(settings: ProviderSettings) -> Backend:
    """The registered factory: a :class:`GcpProvider` and the job storage in Cloud Storage."""
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.gcp_storage import GCSStorage

    credentials: Any
    project: str | None = None
    if os.environ.get("KPLAN_GCP_ANONYMOUS") == "1":  # a local test server takes no credentials
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    else:  # before any client, bucket or job: no credentials fails now, in a second at most
        credentials, project = find_credentials()
    config = GcpConfig.from_env(default_project=project)
    uri = settings.storage_uri or setting("KPLAN_GCP_STORAGE_URI")
    if not uri:
        raise InputError(
            "no Cloud Storage location for the job's code and status",
            "Set KPLAN_GCP_STORAGE_URI=gs://BUCKET/PREFIX (a bucket the instances' service "
            "account can write), or pass a gs:// storage URI.",
        )
    storage = GCSStorage(
        uri,
        credentials=credentials,
        endpoint=setting("KPLAN_GCS_ENDPOINT"),
        retries=config.retries,
        backoff_s=config.backoff_s,
    )
    return Backend(GcpProvider(config, credentials=credentials), storage)


class GcpTarget(TypedDict):
    """Where a GCP job would go, as ``--dry-run`` shows it."""

    project: str
    storage_uri: str
    placeholders: list[str]
    service_account: str | None
    scopes: list[str]
    network: str | None
    subnet: str | None
    external_ip: bool
    needs: str


PROJECT_PLACEHOLDER = "<gcp-project>"
BUCKET_PLACEHOLDER = "gs://<your-bucket>/kplan"


def offline_target(
    settings: ProviderSettings,
    cluster: ClusterSpec | None = None,
    environ: Mapping[str, str] | None = None,
) -> GcpTarget:
    """What ``kplan launch --dry-run`` shows for GCP, with no SDK, credentials or network: the
    project and bucket from the environment or as marked placeholders, and the instances'
    identity and network as a launch would set them."""
    from kplan.launcher.providers.gcp_storage import parse_gs_uri

    env = os.environ if environ is None else environ
    placeholders = []
    project = next((env[var] for var in PROJECT_ENV if env.get(var)), None)
    if project is None:
        project = PROJECT_PLACEHOLDER
        placeholders.append(PROJECT_PLACEHOLDER)
    config = config_for(GcpConfig.from_env(env, default_project="kplan-placeholder"), cluster)
    uri = settings.storage_uri or setting("KPLAN_GCP_STORAGE_URI", env)
    if uri is None:
        uri = BUCKET_PLACEHOLDER
        placeholders.append(BUCKET_PLACEHOLDER)
    else:
        parse_gs_uri(uri)
    return {
        "project": project,
        "storage_uri": uri,
        "placeholders": placeholders,
        "service_account": config.service_account,
        "scopes": list(config.scopes),
        "network": config.network,
        "subnet": config.subnetwork,
        "external_ip": config.external_ip,
        "needs": ("" if sdk_installed("google.cloud.compute_v1") else "scripts/setup.sh gcp; ")
        + "Google credentials (gcloud auth application-default login)",
    }
