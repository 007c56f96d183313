"""Compute Engine calls with kplan's policy, under the GCP provider's verbs.

- Clients (``google.cloud.compute_v1``, REST) are made once, all with the same client options
  and credentials.
- The SDK's own retries are off (``retry=None``): a call is retried only here, only for named
  transient errors, with doubling backoff (``gcp_errors.call``); every other failure becomes a
  ``CloudError`` with a hint, its SDK exception kept as ``__cause__``.
- Operations are waited for with ``ZoneOperationsClient.wait`` / ``GlobalOperationsClient.wait``
  built with the same options: ``ExtendedOperation.result()`` polls through a client of its own
  that ignores ``client_options`` and would reach Google's endpoint whatever the config says.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from kplan.core.errors import CloudError, InputError
from kplan.launcher.clock import Clock
from kplan.launcher.providers import gcp_errors
from kplan.launcher.providers.gcp_config import GcpConfig

T = TypeVar("T")
PREEMPTED_OP = "compute.instances.preempted"
PREEMPTION = "spot preemption"
WAIT_CALL_S = 130.0  # an operations.wait call returns within 2 minutes, DONE or not


def split_id(instance_id: str) -> tuple[str, str]:
    """An instance id is ``<zone>/<name>``: Compute Engine addresses instances by both."""
    zone, sep, name = instance_id.partition("/")
    if not sep or not zone or not name or "/" in name:
        raise InputError(
            f"GCP instance id {instance_id!r} is not '<zone>/<name>'",
            "Use the ids that query_instances / kplan status report.",
        )
    return zone, name


def down_hint(job_ids: Iterable[str], ids: Sequence[str]) -> str:
    """How to finish a teardown that failed: ``kplan down JOB``, or gcloud by hand."""
    jobs = sorted(set(job_ids))
    first = (
        f"run `kplan down {jobs[0]}` to finish the teardown (it finds instances by label)"
        if len(jobs) == 1
        else "run `kplan down JOB` for the job of these instances"
    )
    zone, name = split_id(ids[0]) if ids else ("ZONE", "NAME")
    return f"{first}, or `gcloud compute instances delete {name} --zone {zone}` for each."


def _collect(pages: Callable[[], Any]) -> list[Any]:
    """Every item of a list call (the pager fetches the further pages as it is iterated)."""
    return list(pages())


class ComputeApi:
    """The few Compute Engine calls kplan makes, in one project."""

    def __init__(self, config: GcpConfig, credentials: Any, clock: Clock) -> None:
        self.config = config
        self.project = config.project
        self._credentials = credentials  # None: Application Default Credentials
        self._clock = clock
        self._clients: dict[str, Any] = {}

    def client(self, kind: str) -> Any:
        """A compute_v1 client (``InstancesClient`` ...), made once."""
        if kind not in self._clients:
            from google.api_core.client_options import ClientOptions
            from google.cloud import compute_v1

            endpoint = self.config.api_endpoint
            options = ClientOptions(api_endpoint=endpoint) if endpoint else None
            try:
                self._clients[kind] = getattr(compute_v1, kind)(
                    credentials=self._credentials, client_options=options, transport="rest"
                )
            except Exception as exc:
                if gcp_errors.is_cloud_failure(exc):
                    raise gcp_errors.translate(exc, "client setup") from exc
                raise
        return self._clients[kind]

    def call(self, fn: Callable[[], T], what: str) -> T:
        return gcp_errors.call(
            fn,
            what,
            retries=self.config.retries,
            backoff_s=self.config.backoff_s,
            sleep=self._clock.sleep,
        )

    def call_or_none(
        self, fn: Callable[[], T], what: str, tolerate: Callable[[BaseException], bool]
    ) -> T | None:
        return gcp_errors.call_tolerating(
            fn,
            what,
            tolerate,
            retries=self.config.retries,
            backoff_s=self.config.backoff_s,
            sleep=self._clock.sleep,
        )

    def _method(self, kind: str, method: str, **kwargs: Any) -> Callable[[], Any]:
        """``client.method(**kwargs)`` as a thunk, with the SDK's retries off."""
        bound = getattr(self.client(kind), method)
        return functools.partial(bound, retry=None, timeout=self.config.request_timeout_s, **kwargs)

    def wait(self, op: Any, what: str, zone: str | None) -> None:
        """Wait for a zone (or, with ``zone`` None, global) operation; CloudError if it fails."""
        from google.cloud import compute_v1

        done = compute_v1.Operation.Status.DONE
        if zone is None:
            ops, where = self.client("GlobalOperationsClient"), {}
        else:
            ops, where = self.client("ZoneOperationsClient"), {"zone": zone}
        deadline = self._clock.now() + self.config.operation_timeout_s
        while op.status != done:
            if self._clock.now() >= deadline:
                raise CloudError(
                    f"GCP {what}: operation {op.name} not done after "
                    f"{self.config.operation_timeout_s:.0f} s",
                    gcp_errors.HINT_TRANSIENT,
                )
            poll = functools.partial(
                ops.wait,
                project=self.project,
                operation=op.name,
                retry=None,
                timeout=WAIT_CALL_S,
                **where,
            )
            op = self.call(poll, f"waiting for {what}")
            if op.status != done:
                self._clock.sleep(min(1.0, self.config.poll_interval_s))
        failure = gcp_errors.operation_error(op, what)
        if failure is not None:
            raise failure

    # --- instances -----------------------------------------------------------------------------

    def get_instance(self, zone: str, name: str) -> Any | None:
        """The compute_v1.Instance, or None when it does not exist."""
        return self.call_or_none(
            self._method("InstancesClient", "get", project=self.project, zone=zone, instance=name),
            f"reading instance {zone}/{name}",
            gcp_errors.is_not_found,
        )

    def insert_instance(self, zone: str, body: Any, what: str) -> Any | None:
        """Start an insert; its operation, or None when the name is taken (409)."""
        from google.cloud import compute_v1

        request = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=zone,
            instance_resource=body,
            request_id=str(uuid.uuid4()),  # a retried insert is not applied twice
        )
        return self.call_or_none(
            self._method("InstancesClient", "insert_unary", request=request),
            what,
            gcp_errors.is_conflict,
        )

    def list_instances(self, label: str, value: str, what: str) -> list[Any]:
        """Every instance with label ``label=value``, in every zone (all pages)."""
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListInstancesRequest(
            project=self.project, filter=f'labels.{label} = "{value}"'
        )
        pages = self._method("InstancesClient", "aggregated_list", request=request)
        return self.call(
            lambda: [resource for _, scoped in pages() for resource in scoped.instances], what
        )

    def preemptions(self, zones: Iterable[str]) -> dict[tuple[str, str], str]:
        """``(zone, name) -> reason`` for every preemption GCP recorded in ``zones``."""
        from google.cloud import compute_v1

        found: dict[tuple[str, str], str] = {}
        for zone in sorted(set(zones)):
            request = compute_v1.ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=f'operationType = "{PREEMPTED_OP}"'
            )
            pages = self._method("ZoneOperationsClient", "list", request=request)
            records = self.call(
                functools.partial(_collect, pages), f"listing preemptions in {zone}"
            )
            for record in records:
                if record.operation_type == PREEMPTED_OP:
                    found[(zone, record.target_link.rsplit("/", 1)[-1])] = PREEMPTION
        return found

    def delete_instances(
        self, ids: Sequence[str], *, wait: bool
    ) -> tuple[list[str], list[tuple[str, CloudError]]]:
        """Delete instances (a missing one is fine): the ids whose deletion GCP accepted, and
        the failures (with ``wait``: also deletions whose operation failed)."""
        accepted: list[str] = []
        failed: list[tuple[str, CloudError]] = []
        started: list[tuple[str, Any, str]] = []
        for instance_id in ids:
            zone, name = split_id(instance_id)
            thunk = self._method(
                "InstancesClient", "delete", project=self.project, zone=zone, instance=name
            )
            try:
                op = self.call_or_none(
                    thunk, f"deleting instance {instance_id}", gcp_errors.is_not_found
                )
            except CloudError as exc:
                failed.append((instance_id, exc))
                continue
            accepted.append(instance_id)
            if op is not None:
                started.append((instance_id, op, zone))
        for instance_id, op, zone in started if wait else ():
            try:
                self.wait(op, f"deleting instance {instance_id}", zone)
            except CloudError as exc:
                failed.append((instance_id, exc))
        return accepted, failed

    # --- firewall rules ------------------------------------------------------------------------

    def insert_firewall(self, rule: Any) -> bool:
        """Create a firewall rule and wait for it; False when it exists already (409)."""
        from google.cloud import compute_v1

        request = compute_v1.InsertFirewallRequest(
            project=self.project, firewall_resource=rule, request_id=str(uuid.uuid4())
        )
        what = f"creating firewall rule {rule.name}"
        op = self.call_or_none(
            self._method("FirewallsClient", "insert_unary", request=request),
            what,
            gcp_errors.is_conflict,
        )
        if op is None:
            return False
        self.wait(op, what, None)
        return True

    def delete_firewalls(self, names: Iterable[str]) -> list[tuple[str, CloudError]]:
        """Delete firewall rules (a missing one is fine); the failures, by name."""
        failed = []
        for name in names:
            what = f"deleting firewall rule {name}"
            thunk = self._method(
                "FirewallsClient", "delete_unary", project=self.project, firewall=name
            )
            try:
                op = self.call_or_none(thunk, what, gcp_errors.is_not_found)
                if op is not None:
                    self.wait(op, what, None)
            except CloudError as exc:
                failed.append((name, exc))
        return failed
