"""The ``gcp`` provider through the real google-cloud-compute clients (REST) and a local server.

Request bodies are built by the real client and checked as the server received them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kplan.core.errors import CloudError, InputError
from kplan.launcher.provider import TAG_JOB, TAG_MANAGED, TAG_NODE, ClusterSpec, InstanceSpec
from kplan.launcher.providers import gcp_errors
from kplan.launcher.providers.gcp import GcpProvider
from kplan.launcher.providers.gcp_config import NODE_SCOPES, GcpConfig, network_tag
from tests.gcp_server import FakeCompute

PROJECT = "kplan-test-1"
JOB = "kp-261122-050000-ab12"
ZONE = "us-central1-a"


def make_provider(url: str, **overrides: Any) -> GcpProvider:
    from google.auth.credentials import AnonymousCredentials

    settings: dict[str, Any] = {
        "project": PROJECT,
        "api_endpoint": url,
        "poll_interval_s": 0.01,
        "backoff_s": 0.001,
        "retries": 2,
        **overrides,
    }
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return GcpProvider(GcpConfig(**settings), credentials=credentials)


@pytest.fixture
def fake() -> FakeCompute:
    return FakeCompute()


@pytest.fixture
def url(fake: FakeCompute) -> Iterator[str]:
    with fake.serve() as endpoint:
        yield endpoint


@pytest.fixture
def gcp(url: str) -> GcpProvider:
    return make_provider(url)


def cluster(ssh_cidr: str | None = None, job: str = JOB) -> ClusterSpec:
    return ClusterSpec(job_id=job, cloud="gcp", region="us-central1", ssh_cidr=ssh_cidr)


def spec(
    rank: int,
    *,
    market: str = "spot",
    instance_type: str = "n1-standard-8+1xT4",
    replacement: int = 0,
    job: str = JOB,
) -> InstanceSpec:
    return InstanceSpec(
        job_id=job,
        name=f"{job}-n{rank}-r{replacement}",
        cloud="gcp",
        region="us-central1",
        zone=ZONE,
        instance_type=instance_type,
        market=market,  # type: ignore[arg-type]
        node_rank=rank,
        user_data=f"#!/bin/bash\necho node {rank}\n",
        env={"KPLAN_JOB_ID": job},
        tags={"Team": "ML"},
    )


def metadata(body: dict[str, Any]) -> dict[str, str]:
    return {item["key"]: item["value"] for item in body["metadata"]["items"]}


def test_spot_insert_sends_spot_scheduling_labels_metadata_and_gpus(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    made = gcp.run_instances(cluster(), [spec(0), spec(1)])

    inserts = [s for s in fake.requests if s.method == "POST" and s.path.endswith("/instances")]
    assert [s.path for s in inserts] == [
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"
    ] * 2
    assert all(s.query.get("requestId") for s in inserts)  # retried inserts are de-duplicated
    body = inserts[0].body
    assert body is not None
    assert body["name"] == f"{JOB}-n0-r0"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["labels"] == {TAG_JOB: JOB, TAG_NODE: "0", TAG_MANAGED: "true", "team": "ml"}
    assert body["tags"] == {"items": [network_tag(JOB)]}
    meta = metadata(body)
    assert meta["startup-script"] == "#!/bin/bash\necho node 0\n"
    assert not any("key" in k or "secret" in k or "token" in k for k in meta)
    assert body["serviceAccounts"] == [{"email": "default", "scopes": list(NODE_SCOPES)}]
    assert body["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}
    ]
    assert body["disks"][0]["initializeParams"]["labels"][TAG_JOB] == JOB
    assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"

    assert [i.id for i in made] == [f"{ZONE}/{JOB}-n0-r0", f"{ZONE}/{JOB}-n1-r0"]
    first = made[0]
    assert (first.cloud, first.region, first.zone, first.market) == (
        "gcp",
        "us-central1",
        ZONE,
        "spot",
    )
    assert first.instance_type == "n1-standard-8+1xT4"
    assert first.state in ("pending", "running") and first.node_rank == 0
    assert first.private_ip and first.public_ip and first.launched_at
    assert first.job_id == JOB


def test_on_demand_bundled_gpu_type_attaches_nothing(gcp: GcpProvider, fake: FakeCompute) -> None:
    (inst,) = gcp.run_instances(
        cluster(), [spec(0, market="on-demand", instance_type="a2-highgpu-1g")]
    )
    (body,) = fake.bodies("POST", "/instances")
    assert "guestAccelerators" not in body
    assert body["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
    }
    assert inst.market == "on-demand" and inst.instance_type == "a2-highgpu-1g"


def test_bad_instance_types_are_rejected_before_any_request(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    for bad, message in (
        ("a2-highgpu-1g+1xA100", "has its own"),
        ("n1-standard-8+1xK80", "names GPU 'K80'"),
        ("n1_standard", "not a machine type"),
    ):
        with pytest.raises(InputError, match=message):
            gcp.run_instances(cluster(), [spec(0), spec(1, instance_type=bad)])
    assert fake.requests == []


def test_preemption_is_detected_and_the_node_replaced(gcp: GcpProvider, fake: FakeCompute) -> None:
    gcp.run_instances(cluster(), [spec(0), spec(1)])
    assert {i.state for i in gcp.query_instances(JOB)} == {"running"}

    fake.preempt(f"{JOB}-n1-r0")
    states = {i.name: (i.state, i.reason) for i in gcp.query_instances(JOB)}
    assert states == {
        f"{JOB}-n0-r0": ("running", None),
        f"{JOB}-n1-r0": ("preempted", "spot preemption"),
    }
    lists = [s for s in fake.requests if s.path.endswith(f"/zones/{ZONE}/operations")]
    assert lists[-1].query["filter"] == 'operationType = "compute.instances.preempted"'

    gcp.terminate_instances([f"{ZONE}/{JOB}-n1-r0"])
    (new,) = gcp.run_instances(cluster(), [spec(1, replacement=1)])
    assert new.name == f"{JOB}-n1-r1" and new.node_rank == 1
    assert {i.name: i.state for i in gcp.query_instances(JOB)} == {
        f"{JOB}-n0-r0": "running",
        f"{JOB}-n1-r1": "running",
    }


def test_a_fresh_process_sees_the_preemption_too(url: str, fake: FakeCompute) -> None:
    make_provider(url).run_instances(cluster(), [spec(0)])
    fake.preempt(f"{JOB}-n0-r0")
    (inst,) = make_provider(url).query_instances(JOB)  # no memory of the launch
    assert inst.state == "preempted"


def test_preemption_with_delete_action_is_reported_once_gone(url: str, fake: FakeCompute) -> None:
    gcp = make_provider(url, termination_action="DELETE")
    gcp.run_instances(cluster(), [spec(0), spec(1)])
    assert (
        fake.bodies("POST", "/instances")[0]["scheduling"]["instanceTerminationAction"] == "DELETE"
    )
    gcp.query_instances(JOB)
    fake.preempt(f"{JOB}-n0-r0")
    assert fake.find(f"{JOB}-n0-r0") is None
    states = {i.name: (i.state, i.reason) for i in gcp.query_instances(JOB)}
    assert states[f"{JOB}-n0-r0"] == ("preempted", "spot preemption")
    gcp.terminate_instances([f"{ZONE}/{JOB}-n0-r0"])  # gone already: not an error
    assert [i.name for i in gcp.query_instances(JOB)] == [f"{JOB}-n1-r0"]


def test_a_node_that_powered_off_is_terminated_not_preempted(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    gcp.run_instances(cluster(), [spec(0)])
    resource = fake.find(f"{JOB}-n0-r0")
    assert resource is not None
    resource["status"] = "TERMINATED"  # the bootstrap's power-off after torchrun exited
    (inst,) = gcp.query_instances(JOB)
    assert inst.state == "terminated" and not inst.alive


def test_query_finds_only_the_job_across_zones_and_pages(url: str, fake: FakeCompute) -> None:
    gcp = make_provider(url)
    other = "kp-261122-050000-ffff"
    gcp.run_instances(cluster(), [spec(0), spec(1)])
    gcp.run_instances(cluster(job=other), [spec(0, job=other)])
    zone_b = InstanceSpec(**{**spec(2).__dict__, "zone": "us-central1-b"})
    gcp.run_instances(cluster(), [zone_b])
    fake.page_size = 1
    found = make_provider(url).query_instances(JOB)
    assert sorted(i.id for i in found) == [
        f"{ZONE}/{JOB}-n0-r0",
        f"{ZONE}/{JOB}-n1-r0",
        f"us-central1-b/{JOB}-n2-r0",
    ]
    pages = [s for s in fake.requests if s.path.endswith("/aggregated/instances")]
    assert pages[-1].query["filter"] == f'labels.{TAG_JOB} = "{JOB}"'
    assert len(pages) >= 3 and pages[-1].query.get("pageToken")


def test_wait_instances_until_running(url: str) -> None:
    slow = FakeCompute(boot_delay_s=0.3, op_delay_s=0.1)
    with slow.serve() as endpoint:
        gcp = make_provider(endpoint)
        (inst,) = gcp.run_instances(cluster(), [spec(0)])
        assert inst.state == "pending"
        (ready,) = gcp.wait_instances([inst.id], timeout_s=10)
        assert ready.state == "running"
        with pytest.raises(CloudError, match="not found"):
            gcp.wait_instances([f"{ZONE}/nothing-here"], timeout_s=1)


def test_firewall_opens_job_ports_to_the_job_only(gcp: GcpProvider, fake: FakeCompute) -> None:
    gcp.prepare(cluster())
    gcp.prepare(cluster())  # idempotent: the rule exists (409) and is kept
    tag = network_tag(JOB)
    assert list(fake.firewalls) == [(PROJECT, f"{tag}-nodes")]
    rule = fake.firewalls[(PROJECT, f"{tag}-nodes")]
    assert rule["sourceTags"] == [tag] and rule["targetTags"] == [tag]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["29400-29600"]}]
    assert "sourceRanges" not in rule  # no 0.0.0.0/0 default: the source is the tag
    assert rule["network"].endswith(f"/projects/{PROJECT}/global/networks/default")
    assert JOB in rule["description"]


def test_ssh_only_when_asked_and_only_from_that_cidr(gcp: GcpProvider, fake: FakeCompute) -> None:
    gcp.prepare(cluster(ssh_cidr="203.0.113.7/32"))
    tag = network_tag(JOB)
    ssh = fake.firewalls[(PROJECT, f"{tag}-ssh")]
    assert ssh["sourceRanges"] == ["203.0.113.7/32"]
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["targetTags"] == [tag]
    for rule in fake.firewalls.values():
        assert "0.0.0.0/0" not in rule.get("sourceRanges", [])
    with pytest.raises(InputError, match="not a CIDR"):
        gcp.prepare(cluster(ssh_cidr="my laptop"))


def test_teardown_leaves_nothing_labelled_with_the_job(gcp: GcpProvider, fake: FakeCompute) -> None:
    gcp.prepare(cluster(ssh_cidr="198.51.100.0/24"))
    made = gcp.run_instances(cluster(), [spec(0), spec(1)])
    fake.preempt(f"{JOB}-n1-r0")  # a stopped leftover: cleanup deletes it too
    gcp.terminate_instances([made[0].id])
    gcp.terminate_instances([made[0].id])  # already gone: 404 is fine
    gcp.cleanup(cluster())
    assert gcp.query_instances(JOB) == []
    assert not [i for i in fake.instances.values() if i["labels"].get(TAG_JOB) == JOB]
    assert fake.firewalls == {}
    gcp.cleanup(cluster())  # idempotent


def test_stockout_deletes_what_the_launch_created(gcp: GcpProvider, fake: FakeCompute) -> None:
    fake.fail_insert(
        f"{JOB}-n1-r0",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources available "
        "to fulfill the request. Try a different zone, or try again later.",
    )
    with pytest.raises(CloudError, match="ZONE_RESOURCE_POOL_EXHAUSTED") as info:
        gcp.run_instances(cluster(), [spec(0), spec(1)])
    assert info.value.hint == gcp_errors.HINT_CAPACITY
    assert "deleted the 2 instance(s)" in info.value.message
    assert fake.instances == {}


def test_quota_and_permission_errors_carry_hints(gcp: GcpProvider, fake: FakeCompute) -> None:
    quota = "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1."
    fake.fail("POST", r"/instances$", 403, "quotaExceeded", quota)
    with pytest.raises(CloudError, match="NVIDIA_T4_GPUS") as info:
        gcp.run_instances(cluster(), [spec(0)])
    assert info.value.hint == gcp_errors.HINT_QUOTA
    assert fake.instances == {}

    denied = "Required 'compute.instances.list' permission for 'projects/kplan-test-1'"
    fake.fail("GET", r"/aggregated/instances$", 403, "forbidden", denied)
    with pytest.raises(CloudError, match=r"compute\.instances\.list") as info:
        gcp.query_instances(JOB)
    assert info.value.hint == gcp_errors.HINT_PERMISSION
    assert info.value.__cause__ is not None  # the SDK error is kept as the cause, never raised


def test_transient_errors_are_retried_with_backoff(gcp: GcpProvider, fake: FakeCompute) -> None:
    fake.fail("GET", r"/aggregated/instances$", 503, "backendError", "Backend Error", times=2)
    assert gcp.query_instances(JOB) == []
    assert len([s for s in fake.requests if s.path.endswith("/aggregated/instances")]) == 3

    fake.fail("GET", r"/aggregated/instances$", 503, "backendError", "Backend Error", times=5)
    with pytest.raises(CloudError, match="503") as info:
        gcp.query_instances(JOB)
    assert info.value.hint == gcp_errors.HINT_TRANSIENT


def test_a_retried_insert_is_not_applied_twice(gcp: GcpProvider, fake: FakeCompute) -> None:
    # the server creates the instance but its reply is lost: the retry carries the same
    # requestId, which Compute Engine answers with the first request's operation
    fake.fail("POST", r"/instances$", 503, "backendError", "Backend Error", after=True)
    (inst,) = gcp.run_instances(cluster(), [spec(0)])
    inserts = [s for s in fake.requests if s.method == "POST" and s.path.endswith("/instances")]
    assert len(inserts) == 2 and inserts[0].query["requestId"] == inserts[1].query["requestId"]
    assert inst.state == "running" and len(fake.instances) == 1
    fake.fail("POST", r"/operations/.*/wait$", 502, "badGateway", "Bad Gateway")
    assert len(gcp.run_instances(cluster(), [spec(1)])) == 1  # a lost wait reply: waited again


def test_an_existing_instance_of_the_job_is_adopted_another_jobs_is_not(
    url: str, fake: FakeCompute
) -> None:
    make_provider(url).run_instances(cluster(), [spec(0)])
    (again,) = make_provider(url).run_instances(cluster(), [spec(0)])  # 409: the same job's
    assert again.id == f"{ZONE}/{JOB}-n0-r0" and len(fake.instances) == 1
    resource = fake.find(f"{JOB}-n0-r0")
    assert resource is not None
    resource["labels"][TAG_JOB] = "kp-someone-else"
    with pytest.raises(CloudError, match="taken by an instance of another job"):
        make_provider(url).run_instances(cluster(), [spec(0)])
    assert fake.find(f"{JOB}-n0-r0") is not None  # not ours: never deleted by the rollback


def test_failed_teardown_names_the_instances_and_kplan_down(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    made = gcp.run_instances(cluster(), [spec(0), spec(1)])
    fake.fail("DELETE", rf"/instances/{JOB}-n1-r0$", 500, "backendError", "Internal error", times=9)
    with pytest.raises(CloudError, match=f"{ZONE}/{JOB}-n1-r0") as info:
        gcp.terminate_instances([i.id for i in made])
    assert f"kplan down {JOB}" in info.value.hint
    assert fake.find(f"{JOB}-n0-r0") is None  # the others were deleted all the same


def test_failed_launch_and_failed_cleanup_name_the_leak(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    fake.fail_insert(f"{JOB}-n1-r0", "ZONE_RESOURCE_POOL_EXHAUSTED", "no capacity")
    fake.fail("DELETE", rf"/instances/{JOB}-n0-r0$", 403, "forbidden", "no delete", times=9)
    with pytest.raises(CloudError, match=f"failed too: {ZONE}/{JOB}-n0-r0") as info:
        gcp.run_instances(cluster(), [spec(0), spec(1)])
    assert f"kplan down {JOB}" in info.value.hint


def test_no_credentials_is_a_cloud_error_with_a_login_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    gcp = GcpProvider(GcpConfig(project=PROJECT, api_endpoint="http://127.0.0.1:9"))
    with pytest.raises(CloudError, match="credentials") as info:
        gcp.query_instances(JOB)
    assert "gcloud auth application-default login" in info.value.hint


# --- least privilege: scopes, service account, network, external IP --------------------------

STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
LOGGING_SCOPE = "https://www.googleapis.com/auth/logging.write"
ACCOUNT = "kplan-nodes@kplan-test-1.iam.gserviceaccount.com"


def _inserted(fake: FakeCompute, kind: str) -> list[dict[str, Any]]:
    bodies = [s.body for s in fake.requests if s.method == "POST" and s.path.endswith(f"/{kind}")]
    return [b for b in bodies if b is not None]


def test_nodes_get_only_the_storage_and_logging_scopes_by_default(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    gcp.prepare(cluster())
    gcp.run_instances(cluster(), [spec(0)])
    (body,) = _inserted(fake, "instances")
    (account,) = body["serviceAccounts"]
    assert account["email"] == "default"
    assert sorted(account["scopes"]) == [STORAGE_SCOPE, LOGGING_SCOPE]
    assert not any("cloud-platform" in scope for scope in account["scopes"])
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == f"projects/{PROJECT}/global/networks/default"
    assert "subnetwork" not in nic
    assert nic["accessConfigs"] == [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]


def test_the_jobs_service_account_network_subnet_and_no_external_ip_reach_the_api(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    placed = ClusterSpec(
        job_id=JOB,
        cloud="gcp",
        region="us-central1",
        network="kplan-vpc",
        subnet="kplan-us-central1",
        service_account=ACCOUNT,
        external_ip=False,
    )
    gcp.prepare(placed)
    made = gcp.run_instances(placed, [spec(0), spec(1)])
    bodies = _inserted(fake, "instances")
    assert len(bodies) == 2
    for body in bodies:
        assert body["serviceAccounts"] == [
            {"email": ACCOUNT, "scopes": [STORAGE_SCOPE, LOGGING_SCOPE]}
        ]
        (nic,) = body["networkInterfaces"]
        assert nic["network"] == f"projects/{PROJECT}/global/networks/kplan-vpc"
        assert nic["subnetwork"] == (
            f"projects/{PROJECT}/regions/us-central1/subnetworks/kplan-us-central1"
        )
        assert "accessConfigs" not in nic  # no public IP at all
    (rule,) = _inserted(fake, "firewalls")
    assert rule["network"] == f"projects/{PROJECT}/global/networks/kplan-vpc"
    assert all(i.public_ip is None for i in made)


def test_a_bad_service_account_or_network_fails_before_any_request(
    gcp: GcpProvider, fake: FakeCompute
) -> None:
    for bad, message in (
        ({"service_account": "robot"}, "'robot' is not an email"),
        ({"network": "My VPC"}, "'My VPC' is not a network"),
        ({"subnet": "sub/../x"}, "is not a subnetwork"),
    ):
        placed = ClusterSpec(job_id=JOB, cloud="gcp", region="us-central1", **bad)  # type: ignore[arg-type]
        with pytest.raises(InputError, match=message):
            gcp.run_instances(placed, [spec(0)])
        with pytest.raises(InputError, match=message):
            gcp.prepare(placed)
    assert fake.requests == []
