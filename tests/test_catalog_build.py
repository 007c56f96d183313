"""scripts/build_catalogs.py: its pieces on small inputs, and a rebuild that must reproduce the
shipped catalog byte for byte (when the shared data and moto's AWS data are on this machine)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from kplan.catalogs import load_catalog
from scripts import build_catalogs as bc
from scripts.catalog_offers import _aws_network

SHIPPED = Path(bc.__file__).resolve().parents[1] / "kplan" / "catalogs" / "data"


def test_node_trace_rate_counts_removals_per_node_hour(tmp_path: Path) -> None:
    hour = 3_600_000
    trace = tmp_path / "t.csv"
    # two nodes for an hour, then one for an hour: 3 node-hours, 2 removals
    trace.write_text(f"0,add,node1\n0,add,node2\n{hour},remove,node2\n{2 * hour},remove,node1\n")
    rate, removals, hours = bc.node_trace_rate(trace)
    assert (removals, hours) == (2, 3.0)
    assert rate == pytest.approx(2 / 3)


def test_count_trace_rate_counts_decreases_per_vm_hour(tmp_path: Path) -> None:
    trace = tmp_path / "g.txt"
    trace.write_text(
        "2021-12-10, 10:00:00, 4\n2021-12-10, 11:00:00, 2\n"
        "2021-12-10, 12:00:00, 3\n2021-12-10, 13:00:00, 3\n"
    )
    rate, drops, hours = bc.count_trace_rate(trace)
    assert (drops, hours) == (2, 9.0)  # 4 + 2 + 3 VM-hours
    assert rate == pytest.approx(2 / 9)


@pytest.mark.parametrize(
    ("perf", "baseline", "gbps"),
    [
        ("4x 100 Gigabit", None, 400),
        ("3200 Gigabit", None, 3200),
        ("50 Gigabit", 50.0, 50),
        ("Up to 25 Gigabit", 5.0, 5),
        ("Up to 10 Gigabit", None, 2.5),
    ],
)
def test_aws_network_performance(perf: str, baseline: float | None, gbps: float) -> None:
    assert _aws_network(perf, baseline)[0] == gbps


def test_aws_network_performance_rejects_unknown_text() -> None:
    with pytest.raises(SystemExit, match="unknown NetworkPerformance 'High'"):
        _aws_network("High", None)


def _moto_resources() -> Path | None:
    """moto's ec2/resources, from this interpreter or the system python3."""
    spec = importlib.util.find_spec("moto")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "ec2" / "resources"
    try:
        out = subprocess.run(
            ["python3", "-c", "import json, moto; print(json.dumps(moto.__path__[0]))"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(json.loads(out)) / "ec2" / "resources"


def test_rebuild_reproduces_the_shipped_catalog(tmp_path: Path) -> None:
    data, moto = bc.data_root(), _moto_resources()
    if not (data / "catalogs" / "skypilot-v9").is_dir() or moto is None:
        pytest.skip("needs the shared data folder and moto's AWS instance data")
    assert (
        bc.main(["--data", str(data), "--moto-ec2-resources", str(moto), "--out", str(tmp_path)])
        == 0
    )
    for path in sorted(tmp_path.iterdir()):
        assert path.read_text() == (SHIPPED / path.name).read_text(), f"{path.name} is stale"
    assert (
        bc.main(
            [
                "--data",
                str(data),
                "--moto-ec2-resources",
                str(moto),
                "--out",
                str(SHIPPED),
                "--check",
            ]
        )
        == 0
    )
    cat = load_catalog(tmp_path)
    assert cat.version == "shipped-2026.11" and len(cat.offers) > 1000
