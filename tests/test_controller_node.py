"""Where a detached job's controller runs (kplan/launcher/controller_node.py): the rule, the
catalog's controller types with their price sources, the controller node's bootstrap, and the
dry run that prices it; each bad input is one line and exit 2."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.catalogs.controllers import controller_offer, controller_offers
from kplan.cli.main import app
from kplan.core.errors import InputError
from kplan.launcher.controller_node import (
    FORWARDED,
    choose_site,
    controller_spec,
    controller_user_data,
    forwarded_env,
)
from kplan.launcher.jobspec import JobSpec, NodeSpec, new_job_id

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"


def _spec(cloud: str, region: str, market: str = "spot") -> JobSpec:
    zone = {"aws": "us-east-1a", "gcp": f"{region}-a"}[cloud]
    node = NodeSpec(0, "g5.xlarge", market, zone, 1, 1.0)  # type: ignore[arg-type]
    return JobSpec.build(
        job_id=new_job_id(),
        cloud=cloud,
        region=region,
        script=str(SCRIPT),
        nodes=(node,),
        budget_usd=10.0,
        storage_uri=f"{'s3' if cloud == 'aws' else 'gs'}://bucket/jobs",
    )


def test_every_controller_row_has_a_source_and_a_small_type() -> None:
    offers = controller_offers()
    assert {o.cloud for o in offers} == {"aws", "gcp"}
    for o in offers:
        assert o.source and 0 < o.usd_per_hour < 0.1 and o.vcpus <= 2, o
    assert controller_offer("aws", "us-east-1").instance_type == "t3.small"
    assert controller_offer("gcp", "us-central1").instance_type == "e2-small"


def test_the_rule_spot_on_demand_local_and_asked() -> None:
    spot = choose_site(_spec("aws", "us-east-1"), None)
    assert (spot.where, spot.usd_per_hour) == ("instance", 0.0208)
    assert "spot" in spot.reason and "t3.small" in spot.summary()
    assert "aws.amazon.com/ec2/pricing" in spot.summary()  # the price says its source
    on_demand = choose_site(_spec("gcp", "us-central1", "on-demand"), None)
    assert on_demand.where == "instance" and "replaced" in on_demand.reason
    here = choose_site(_spec("aws", "us-east-1"), "here")
    assert here.offer is None and here.usd_per_hour == 0.0
    local = JobSpec.local(str(SCRIPT), (), nodes=1)
    assert choose_site(local, None).where == "here"
    assert choose_site(local, "instance").usd_per_hour == 0.0


def test_a_region_without_a_controller_row_or_a_bad_site_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"no controller instance type for gcp in us-west4"):
        choose_site(_spec("gcp", "us-west4"), "instance")
    fallback = choose_site(_spec("gcp", "us-west4"), None)  # the default says why
    assert fallback.where == "here" and "no controller type for gcp us-west4" in fallback.reason
    with pytest.raises(InputError, match=r"--controller 'head' is not one of"):
        choose_site(_spec("aws", "us-east-1"), "head")


def test_the_bootstrap_forwards_only_named_settings_and_runs_the_controller() -> None:
    spec = _spec("aws", "us-east-1")
    env = {
        "KPLAN_AWS_SUBNET": "subnet-1",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "KPLAN_GCP_API_KEY": "k",
    }
    assert forwarded_env(env) == {"KPLAN_AWS_SUBNET": "subnet-1"}
    assert "KPLAN_GCP_API_KEY" not in FORWARDED
    data = controller_user_data(spec, "x-ctl-r0", "s3://bucket/jobs", env, 3600)
    assert "s3cr3t" not in data and "KPLAN_GCP_API_KEY" not in data
    assert f"\"$PY\" -c 'from kplan.cli.main import main; main()' controller {spec.job_id}" in data
    assert "shutdown -h +60" in data and data.rstrip().endswith("poweroff")
    assert '"$PY" -m pip install --quiet boto3' in data  # the provider's SDK
    install = replace(
        spec.install,
        wheel="/w/kplan-0.1.0-py3-none-any.whl",
        wheel_sha256="0" * 64,
        requirements=("numpy==2.4.6", "torch==2.13.0"),
    )
    data = controller_user_data(replace(spec, install=install), "x", "s3://b/j", {}, None)
    assert "numpy==2.4.6" in data and "torch" not in data  # the controller trains nothing
    assert "code/kplan-0.1.0-py3-none-any.whl" in data and "shutdown -h" not in data
    req = controller_spec(spec, choose_site(spec, None), "s3://bucket/jobs", env, 3600)
    assert (req.node_rank, req.market, req.instance_type) == (-1, "on-demand", "t3.small")
    assert req.max_run_s == 3600 and req.zone == "us-east-1a"


def test_launch_dry_run_prices_the_controller_instance(tmp_path: Path) -> None:
    args = ["launch", str(SCRIPT), "--cloud", "aws", "--region", "us-east-1", "--budget", "50"]
    args += ["--example", "cifar10-resnet18", "--spot", "--dry-run", "--detach", "--json"]
    out = runner.invoke(app, args, env={"KPLAN_HOME": str(tmp_path)})
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    ctl = doc["controller"]
    assert (ctl["where"], ctl["instance_type"], ctl["usd_per_hour"]) == (
        "instance",
        "t3.small",
        0.0208,
    )
    assert ctl["predicted_usd"] == pytest.approx(ctl["predicted_hours"] * 0.0208)
    ranks = [i["node_rank"] for r in doc["requests"] for i in r.get("instances", [])]
    assert ranks[0] == -1 and sorted(ranks[1:]) == list(range(len(ranks) - 1))

    def controller(*more: str) -> object:
        out = runner.invoke(app, [*args[:-2], *more, "--json"], env={"KPLAN_HOME": str(tmp_path)})
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)["controller"]

    assert controller() == ctl  # a cloud job detaches by default
    assert controller("--foreground") is None
    assert controller("--no-detach") is None


def test_local_jobs_stay_in_the_foreground_and_contradictions_are_exit_2(tmp_path: Path) -> None:
    base = ["launch", str(SCRIPT), "--nodes", "1", "--dry-run", "--json"]
    out = runner.invoke(app, base, env={"KPLAN_HOME": str(tmp_path)})
    assert out.exit_code == 0 and json.loads(out.stdout)["controller"] is None
    both = runner.invoke(
        app, [*base, "--detach", "--foreground"], env={"KPLAN_HOME": str(tmp_path)}
    )
    assert both.exit_code == 2 and "contradict" in both.stderr


def test_controller_without_detach_is_one_line_and_exit_2(tmp_path: Path) -> None:
    args = ["launch", str(SCRIPT), "--nodes", "1", "--controller", "instance", "--dry-run"]
    out = runner.invoke(app, args, env={"KPLAN_HOME": str(tmp_path)})
    assert out.exit_code == 2 and "add --detach" in out.stderr


def test_the_first_check_counts_the_controller_instance() -> None:
    """A budget that pays for the nodes until the first check but not for the controller
    instance beside them stops the launch: the guard counts the controller."""
    from kplan.launcher.dryrun import first_check
    from kplan.launcher.ledger import billing_for

    spec = _spec("aws", "us-east-1")
    site = choose_site(spec, None)
    nodes_only = first_check(spec, billing_for("aws"))
    with_ctl = first_check(spec, billing_for("aws"), [site.usd_per_hour])
    assert with_ctl.projected_usd > nodes_only.projected_usd
    tight = replace(spec, budget_usd=(nodes_only.projected_usd + with_ctl.projected_usd) / 2)
    assert not first_check(tight, billing_for("aws")).stop
    assert first_check(tight, billing_for("aws"), [site.usd_per_hour]).stop
