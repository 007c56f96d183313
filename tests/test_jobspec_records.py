"""JobSpec is a few small settings records; a job.json written by the flat JobSpec of earlier
kplan versions (tests/fixtures/jobspec_v0_*.json) still loads, with every value in its record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kplan.core.errors import InputError
from kplan.launcher.jobspec import FLAT, GROUPS, JobSpec, NodeSpec, nest

FIXTURES = Path(__file__).parent / "fixtures"


def _old(name: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((FIXTURES / f"jobspec_v0_{name}.json").read_text())
    return doc


@pytest.mark.parametrize("name", ["cloud", "local"])
def test_a_flat_job_json_loads_into_the_records(name: str) -> None:
    old = _old(name)
    spec = JobSpec.from_dict(old)
    # added after the flat form: absent there, at their default
    newer = {"lease_s", "idle_s", "disk_usd_node_h", "storage_usd_h", "egress_usd"}
    newer |= {"move_regions", "checkpoint_gb", "copy_gbps"}  # issue 27 item 3
    assert newer.isdisjoint(old)
    for flat, (group, key) in FLAT.items():  # every flat value is in its record
        value = getattr(getattr(spec, group), key)
        want = old[flat] if flat not in newer else getattr(GROUPS[group](), key)
        want = list(want) if isinstance(want, tuple) else want
        assert (list(value) if isinstance(value, tuple) else value) == want, flat
    assert spec.job_id == old["job_id"] and spec.storage_uri == old["storage_uri"]
    assert [n.node_rank for n in spec.nodes] == [n["node_rank"] for n in old["nodes"]]  # type: ignore[attr-defined]
    again = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())))  # the nested form
    assert again == spec
    assert set(spec.to_dict()) >= set(GROUPS) and "check_interval_s" not in spec.to_dict()


def test_the_cloud_fixture_sets_every_setting_away_from_its_default() -> None:
    default = JobSpec.build(
        "kp-x-1", "gcp", "r", "t.py", (NodeSpec(0, "t", "spot", "z", 1, 1.0),), 1.0
    )
    spec = JobSpec.from_dict(_old("cloud"))
    for group in set(GROUPS) - {"costs", "moves"}:  # came after the fixture (issue 27)
        assert getattr(spec, group) != getattr(default, group), group


def test_flat_options_are_routed_and_typos_refused() -> None:
    nested = nest({"check_interval_s": 5.0, "kplan_wheel": None, "adapt": True, "deadline_h": 2.0})
    assert nested["deadline_h"] == 2.0
    assert nested["timing"].check_interval_s == 5.0
    assert nested["adaptation"].enabled is True
    with pytest.raises(TypeError, match="check_intervals"):
        nest({"check_intervals": 5.0})
    assert "check_intervals" not in nest({"check_intervals": 5.0}, strict=False)


def test_a_record_validates_its_own_values() -> None:
    doc = _old("local")
    with pytest.raises(InputError, match="check_interval_s"):
        JobSpec.from_dict({**doc, "check_interval_s": 0})
    with pytest.raises(InputError, match="--max-nodes 1"):
        JobSpec.from_dict({**doc, "max_nodes": 1})  # two nodes
    nested = json.loads(json.dumps(JobSpec.from_dict(doc).to_dict()))
    nested["adaptation"]["explore_trials"] = 0
    with pytest.raises(InputError, match="--explore-trials 0"):
        JobSpec.from_dict(nested)


def test_a_job_with_move_regions_keeps_them_through_its_json() -> None:
    """The regions a job may move to (kplan/launcher/move_spec.py) survive job.json, and the
    move's default copy rate is the planner's (spotmove.DEFAULT_COPY_GBPS)."""
    from kplan.launcher.move_spec import DEFAULT_COPY_GBPS, MoveRegion, ZoneOffer
    from kplan.planner import spotmove

    assert DEFAULT_COPY_GBPS == spotmove.DEFAULT_COPY_GBPS
    west = MoveRegion("us-west-2", (ZoneOffer("g5.xlarge", "us-west-2a", "spot", 0.4),), 0.02)
    spec = JobSpec.build(
        "kp-x-1", "aws", "us-east-1", "t.py", (NodeSpec(0, "g5.xlarge", "spot", "z", 1, 1.0),),
        1.0, move_regions=(west,), checkpoint_gb=10.0,
    )  # fmt: skip
    again = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.moves.others("us-east-1") == ()  # home not listed: none
    with pytest.raises(InputError, match="--checkpoint-gb"):
        JobSpec.build(
            "kp-x-1", "aws", "r", "t.py", (NodeSpec(0, "t", "spot", "z", 1, 1.0),), 1.0,
            checkpoint_gb=float("nan"),
        )  # fmt: skip
