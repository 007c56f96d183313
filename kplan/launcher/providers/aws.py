"""The ``aws`` provider: worker groups on EC2 instances (boto3), code and status in S3.

Per job it creates a security group that opens the rendezvous/NCCL port range only to members of
the same group (and SSH only when ``ClusterSpec.ssh_cidr`` asks, only from that CIDR), an optional
cluster placement group, and one instance per node (spot or on-demand) whose power-off
terminates it. Everything carries the job's tag, so ``query_instances`` and ``cleanup`` work from
tags alone, with no state database.

Settings beyond :class:`~kplan.launcher.providers.ProviderSettings` come from the environment
(read by :func:`create`): ``KPLAN_AWS_ENDPOINT_URL``, ``KPLAN_AWS_INSTANCE_PROFILE``,
``KPLAN_AWS_IMAGE``, ``KPLAN_AWS_VPC``, ``KPLAN_AWS_SUBNET``, ``KPLAN_AWS_KEY_NAME``,
``KPLAN_AWS_PLACEMENT_GROUPS`` (``0`` turns placement groups off) and ``KPLAN_AWS_STORAGE_URI``;
credentials and the default region come from boto3's own chain (``AWS_PROFILE``,
``AWS_DEFAULT_REGION``, instance roles), never from kplan.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict

from kplan.core.errors import CloudError, InputError, KplanError
from kplan.launcher.clock import Clock, SystemClock
from kplan.launcher.provider import TAG_JOB, ClusterSpec, Instance, InstanceSpec
from kplan.launcher.providers.aws_common import (
    AwsConfig,
    Client,
    ClientFactory,
    Retry,
    Tolerated,
    call,
    check_credentials,
    make_client_factory,
    sdk_installed,
)
from kplan.launcher.providers.aws_secrets import CredentialGuard
from kplan.launcher.providers.aws_shapes import (
    CreateGroupRequest,
    DescribeRequest,
    Filter,
    group_name,
    ingress_rules,
    instance_tags,
    job_tag_spec,
    run_request,
    ssh_network,
    tags_of,
    to_instance,
)
from kplan.launcher.providers.envvars import setting

if TYPE_CHECKING:
    from kplan.launcher.providers import Backend, ProviderSettings


def down_hint(job_id: str) -> str:
    return f"run `kplan down {job_id}` to finish the teardown (it finds resources by tag)"


class AwsProvider:
    """The provider verbs over EC2, bound to one region (``config.region``)."""

    name = "aws"

    def __init__(
        self,
        config: AwsConfig,
        *,
        client_factory: ClientFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self._factory = client_factory or make_client_factory(config)
        self._clock = clock or SystemClock()
        self._retry = Retry(config.max_attempts, config.backoff_s, sleep=self._clock.sleep)
        self._ec2: Client | None = None
        self._guard = CredentialGuard(config.profile)

    @property
    def ec2(self) -> Client:
        if self._ec2 is None:
            self._ec2 = self._factory("ec2")
        return self._ec2

    def _call(self, action: str, method: str, **kwargs: Any) -> Any:
        return call(self._retry, action, getattr(self.ec2, method), **kwargs)

    # -- prepare / cleanup ------------------------------------------------------------------

    def prepare(self, cluster: ClusterSpec) -> None:
        self._check_cluster(cluster)
        ssh_network(cluster.ssh_cidr)  # a bad CIDR fails before anything is created
        existing = self._find_security_group(cluster.job_id)
        group_id = existing or self._create_security_group(cluster.job_id)
        try:
            self._authorize(cluster, group_id)
            if self._wants_placement_group(cluster):
                call(
                    self._retry,
                    "create the placement group",
                    self.ec2.create_placement_group,
                    tolerate=("InvalidPlacementGroup.Duplicate",),
                    GroupName=group_name(cluster.job_id),
                    Strategy="cluster",
                    TagSpecifications=[job_tag_spec("placement-group", cluster.job_id)],
                )
        except KplanError as err:
            if existing is None:
                self._undo_prepare(cluster, group_id, err)
            raise

    def _undo_prepare(self, cluster: ClusterSpec, group_id: str, cause: KplanError) -> None:
        try:
            self._delete_security_group(group_id)
        except KplanError as err:
            raise CloudError(
                f"{cause.message}; and the security group {group_id} could not be deleted: "
                f"{err.message}",
                hint=down_hint(cluster.job_id),
            ) from err

    def _create_security_group(self, job_id: str) -> str:
        kwargs: CreateGroupRequest = {
            "GroupName": group_name(job_id),
            "Description": f"kplan job {job_id}: rendezvous and collectives between its nodes",
            "TagSpecifications": [job_tag_spec("security-group", job_id)],
        }
        if self.config.vpc_id is not None:
            kwargs["VpcId"] = self.config.vpc_id
        response = self._call("create the security group", "create_security_group", **kwargs)
        return str(response["GroupId"])

    def _authorize(self, cluster: ClusterSpec, group_id: str) -> None:
        rules = ingress_rules(cluster, group_id)
        for rule in rules:
            call(
                self._retry,
                "open the security group's ports",
                self.ec2.authorize_security_group_ingress,
                tolerate=("InvalidPermission.Duplicate",),
                GroupId=group_id,
                IpPermissions=[rule],
                TagSpecifications=[job_tag_spec("security-group-rule", cluster.job_id)],
            )

    def cleanup(self, cluster: ClusterSpec) -> None:
        self._check_cluster(cluster)
        job_id = cluster.job_id
        self._wait_gone(job_id)
        failures: list[str] = []
        for group_id in self._job_security_groups(job_id):
            try:
                self._delete_security_group(group_id)
            except KplanError as err:
                failures.append(f"security group {group_id} ({err.message})")
        if self._wants_placement_group(cluster):
            try:
                self._delete_placement_group(job_id)
            except KplanError as err:
                failures.append(f"placement group {group_name(job_id)} ({err.message})")
        if failures:
            raise CloudError(
                f"could not delete {'; '.join(failures)} of job {job_id}",
                hint=down_hint(job_id),
            )

    def _wait_gone(self, job_id: str) -> None:
        """Wait (bounded) until no instance of the job holds its security group."""
        deadline = self._clock.now() + self.config.cleanup_timeout_s
        while True:
            raw = self._describe([{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}])
            live = [i for i in raw if i["State"]["Name"] != "terminated"]
            settling = [i for i in live if i["State"]["Name"] in ("shutting-down", "stopping")]
            if not live:
                return
            if len(settling) < len(live) or self._clock.now() >= deadline:
                ids = [str(i["InstanceId"]) for i in live]
                raise CloudError(
                    f"job {job_id} still has instances {', '.join(ids)}: its security group "
                    "and placement group are kept",
                    hint=down_hint(job_id),
                )
            self._clock.sleep(self._poll_s)

    @property
    def _poll_s(self) -> float:
        return max(self.config.poll_s, 0.05)

    def _delete_when_free(
        self, what: str, method: str, gone: str, busy: str, **kwargs: Any
    ) -> None:
        """Delete, tolerating ``gone``; retry ``busy`` (still in use) until cleanup's deadline.

        Terminated instances let go of their network interfaces a little after they are gone.
        """
        deadline = self._clock.now() + self.config.cleanup_timeout_s
        while True:
            result = call(
                self._retry,
                f"delete the {what}",
                getattr(self.ec2, method),
                tolerate=(gone, busy),
                **kwargs,
            )
            if not (isinstance(result, Tolerated) and result.code == busy):
                return
            if self._clock.now() >= deadline:
                raise CloudError(
                    f"the {what} is still in use ({busy}) after "
                    f"{self.config.cleanup_timeout_s:g} s",
                    hint="an instance may still be shutting down: run `kplan down JOB` again in a "
                    "minute (cleanup is idempotent)",
                )
            self._clock.sleep(self._poll_s)

    def _delete_security_group(self, group_id: str) -> None:
        self._delete_when_free(
            f"security group {group_id}",
            "delete_security_group",
            "InvalidGroup.NotFound",
            "DependencyViolation",
            GroupId=group_id,
        )

    def _delete_placement_group(self, job_id: str) -> None:
        self._delete_when_free(
            f"placement group {group_name(job_id)}",
            "delete_placement_group",
            "InvalidPlacementGroup.Unknown",
            "InvalidPlacementGroup.InUse",
            GroupName=group_name(job_id),
        )

    def _find_security_group(self, job_id: str) -> str | None:
        groups = self._job_security_groups(job_id, name=group_name(job_id))
        return groups[0] if groups else None

    def _job_security_groups(self, job_id: str, name: str | None = None) -> list[str]:
        filters = [{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}]
        if name is not None:
            filters.append({"Name": "group-name", "Values": [name]})
        if self.config.vpc_id is not None:
            filters.append({"Name": "vpc-id", "Values": [self.config.vpc_id]})
        response = self._call(
            "list the job's security groups", "describe_security_groups", Filters=filters
        )
        return sorted(str(g["GroupId"]) for g in response.get("SecurityGroups", []))

    def _wants_placement_group(self, cluster: ClusterSpec) -> bool:
        return cluster.placement_group and self.config.placement_groups

    # -- instances --------------------------------------------------------------------------

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        self._check_cluster(cluster)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise InputError(
                f"instance names repeat in one request: {names}",
                hint="give each instance of a request its own name (job id and node rank)",
            )
        pg = group_name(cluster.job_id) if self._wants_placement_group(cluster) else None
        requests = [run_request(self.config, cluster, spec, pg) for spec in specs]
        for spec in specs:  # instances get credentials from their profile, never from kplan
            tags = " ".join(f"{k}={v}" for k, v in instance_tags(spec).items())
            self._guard.check(f"user data of {spec.name!r}", spec.user_data)
            self._guard.check(f"tags of {spec.name!r}", tags)
        group_id = self._find_security_group(cluster.job_id)
        if group_id is None:
            raise CloudError(
                f"job {cluster.job_id} has no security group in {self.config.region}",
                hint="prepare(cluster) creates it; call it before run_instances",
            )
        created: list[Instance] = []
        for spec, request in zip(specs, requests, strict=True):
            request["SecurityGroupIds"] = [group_id]
            try:
                response = self._call(
                    f"launch {spec.instance_type} ({spec.market}) for {spec.name}",
                    "run_instances",
                    **request,
                )
            except KplanError as err:
                self._roll_back(cluster.job_id, created, err)
                raise
            created.extend(self._to_instance(raw) for raw in response["Instances"])
        return created

    def _roll_back(self, job_id: str, created: list[Instance], cause: KplanError) -> None:
        """A launch failed part-way: terminate what this call created, or name it."""
        if not created:
            return
        ids = [i.id for i in created]
        try:
            self.terminate_instances(ids)
        except KplanError as err:
            raise CloudError(
                f"{cause.message}; and the instances it had started ({', '.join(ids)}) could "
                f"not be terminated: {err.message}",
                hint=down_hint(job_id),
            ) from err

    def wait_instances(self, ids: Sequence[str], timeout_s: float) -> list[Instance]:
        from botocore.exceptions import WaiterError

        if not ids:
            return []
        delay = self._poll_s
        attempts = max(1, int(timeout_s / delay) + 1)
        waiter = self.ec2.get_waiter("instance_running")
        # WaiterError: a terminal state (e.g. terminated) or the time limit, judged below.
        with contextlib.suppress(WaiterError):
            waiter.wait(
                InstanceIds=list(ids), WaiterConfig={"Delay": delay, "MaxAttempts": attempts}
            )
        found = {i.id: i for i in map(self._to_instance, self._describe_ids(ids))}
        waiting = [i for i in ids if i in found and found[i].state == "pending"]
        missing = [i for i in ids if i not in found]
        if waiting or missing:
            raise CloudError(
                f"instances {', '.join(waiting + missing)} were not running after {timeout_s:g} s"
                + (f" ({', '.join(missing)} not found)" if missing else ""),
                hint="EC2 may be slow to start these types now: query again later, or "
                "terminate them and try another zone",
            )
        return [found[i] for i in ids]

    def query_instances(self, job_id: str) -> list[Instance]:
        # Lifecycle (spot/on-demand) is read from each instance, not filtered server-side.
        return self._instances([{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}])

    def terminate_instances(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        raw = self._describe_ids(ids)
        live = [i for i in raw if i["State"]["Name"] not in ("terminated", "shutting-down")]
        targets = [str(i["InstanceId"]) for i in live]
        jobs = sorted({tags_of(i).get(TAG_JOB, "?") for i in live})
        for start in range(0, len(targets), 500):
            batch = targets[start : start + 500]
            try:
                call(
                    self._retry,
                    f"terminate {', '.join(batch)}",
                    self.ec2.terminate_instances,
                    # Gone between describe and terminate: as good as terminated.
                    tolerate=("InvalidInstanceID.NotFound",),
                    InstanceIds=batch,
                )
            except KplanError as err:
                left = targets[start:]
                job = jobs[0] if len(jobs) == 1 else "JOB"
                raise CloudError(
                    f"could not terminate instances {', '.join(left)} (job "
                    f"{', '.join(jobs)}): {err.message}",
                    hint=f"{down_hint(job)}; {err.hint}" if err.hint else down_hint(job),
                ) from err

    # -- reading instances ------------------------------------------------------------------

    def _describe(self, filters: list[Filter]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: DescribeRequest = {"Filters": filters, "MaxResults": 1000}
            if token:
                kwargs["NextToken"] = token
            page = self._call("describe instances", "describe_instances", **kwargs)
            for reservation in page.get("Reservations", []):
                found.extend(reservation.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                return found

    def _describe_ids(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The instances among ``ids`` that exist (a filter, unlike InstanceIds, never fails
        on an unknown id)."""
        found: list[dict[str, Any]] = []
        for start in range(0, len(ids), 200):  # at most 200 values per filter
            chunk = list(ids[start : start + 200])
            found.extend(self._describe([{"Name": "instance-id", "Values": chunk}]))
        return found

    def _to_instance(self, raw: Mapping[str, Any]) -> Instance:
        return to_instance(raw, self.config.region)

    def _instances(self, filters: list[Filter]) -> list[Instance]:
        instances = [self._to_instance(raw) for raw in self._describe(filters)]
        return sorted(instances, key=lambda i: (i.node_rank, i.launched_at or 0.0, i.id))

    # -- helpers ----------------------------------------------------------------------------

    def _check_cluster(self, cluster: ClusterSpec) -> None:
        if cluster.cloud != "aws":
            raise InputError(
                f"cluster of job {cluster.job_id!r} is for {cluster.cloud!r}",
                hint="use that cloud's provider (kplan.launcher.providers.get_backend)",
            )
        if cluster.region != self.config.region:
            raise InputError(
                f"job {cluster.job_id!r} is in region {cluster.region!r}; this AWS provider "
                f"runs in {self.config.region!r}",
                hint="create the provider with the plan's region",
            )


def config_from_env(region: str | None, environ: Mapping[str, str] | None = None) -> AwsConfig:
    """An :class:`AwsConfig` from ``KPLAN_AWS_*`` variables (see the module's docstring)."""
    env = os.environ if environ is None else environ
    chosen = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not chosen:
        raise InputError("no AWS region given", hint="pass --region or set AWS_DEFAULT_REGION")
    flag = env.get("KPLAN_AWS_PLACEMENT_GROUPS", "1").strip().lower()
    if flag not in ("0", "1", "true", "false", "yes", "no"):
        raise InputError(
            f"KPLAN_AWS_PLACEMENT_GROUPS={flag!r} is not 0 or 1",
            hint="set KPLAN_AWS_PLACEMENT_GROUPS=0 to launch without a placement group, or "
            "unset it",
        )
    config = AwsConfig(
        region=chosen,
        endpoint_url=setting("KPLAN_AWS_ENDPOINT_URL", env),
        instance_profile=setting("KPLAN_AWS_INSTANCE_PROFILE", env),
        vpc_id=setting("KPLAN_AWS_VPC", env),
        subnet_id=setting("KPLAN_AWS_SUBNET", env),
        key_name=setting("KPLAN_AWS_KEY_NAME", env),
        placement_groups=flag in ("1", "true", "yes"),
    )
    image = setting("KPLAN_AWS_IMAGE", env)
    return config if image is None else replace(config, image_id=image)


def create(settings: ProviderSettings) -> Backend:
    """The registered factory: an :class:`AwsProvider` and its :class:`S3Storage`."""
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.aws_storage import S3Storage, default_storage_uri

    config = config_from_env(settings.region)
    check_credentials(config)  # before any client, bucket or job: no credentials fails now
    factory = make_client_factory(config)
    uri = settings.storage_uri or setting("KPLAN_AWS_STORAGE_URI")
    if uri is None:
        storage = S3Storage(
            default_storage_uri(config, factory), config, client_factory=factory, create_bucket=True
        )
    else:
        storage = S3Storage(uri, config, client_factory=factory)
    return Backend(AwsProvider(config, client_factory=factory), storage)


class AwsTarget(TypedDict):
    """Where an AWS job would go, as ``--dry-run`` shows it."""

    account: str
    storage_uri: str
    placeholders: list[str]
    instance_profile: str | None
    vpc: str
    subnet: str | None
    security_group: str
    needs: str


ACCOUNT_PLACEHOLDER = "<aws-account-id>"


def security_group_text(cluster: ClusterSpec | None) -> str:
    """The job's security group in words (what ``prepare`` makes: see ``ingress_rules``)."""
    ports = (
        "the job's ports" if cluster is None else f"TCP+UDP {cluster.ports[0]}-{cluster.ports[1]}"
    )
    ssh = (
        "no SSH"
        if cluster is None or cluster.ssh_cidr is None
        else f"SSH from {cluster.ssh_cidr} only"
    )
    return f"ingress {ports} only from members of the job's own security group; {ssh}"


def offline_target(
    settings: ProviderSettings,
    cluster: ClusterSpec | None = None,
    environ: Mapping[str, str] | None = None,
) -> AwsTarget:
    """What ``kplan launch --dry-run`` shows for AWS, with no SDK, credentials or network: the
    account is a marked placeholder, the storage the one given or the default bucket's name."""
    from kplan.launcher.providers.aws_storage import parse_s3_uri

    env = os.environ if environ is None else environ
    config = config_from_env(settings.region, env)
    uri = settings.storage_uri or setting("KPLAN_AWS_STORAGE_URI", env)
    placeholders = [ACCOUNT_PLACEHOLDER]
    if uri is None:
        uri = f"s3://kplan-{ACCOUNT_PLACEHOLDER}-{config.region}/jobs"
    else:
        parse_s3_uri(uri)
    return {
        "account": ACCOUNT_PLACEHOLDER,
        "storage_uri": uri,
        "placeholders": placeholders,
        "instance_profile": config.instance_profile,
        "vpc": config.vpc_id or "the region's default VPC",
        "subnet": config.subnet_id,
        "security_group": security_group_text(cluster),
        "needs": ("" if sdk_installed("boto3") else "scripts/setup.sh aws; ")
        + "AWS credentials (aws configure)",
    }
