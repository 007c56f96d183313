"""The catalog shipped with kplan: it loads fast, with only the expected notes, and covers the
instance families the planner and the reference traces need."""

from __future__ import annotations

import re
from collections import defaultdict
from importlib import resources

import pytest

from kplan.catalogs import load_catalog, shipped_catalog
from kplan.planner.catalog import Catalog

# The only notes the shipped data may raise: known gaps of the skypilot subset.
EXPECTED_NOTES = (
    r"prices.csv:\d+: spot price equals the on-demand price [\d.]+ for aws p5\.(4|48)xlarge in "
    r"use1-az\d; kept",
    r"prices.csv:\d+: no on-demand price for aws p5e\.48xlarge in \w+-az\d; spot offer kept, "
    r"not checked against on-demand",
    r"prices.csv:\d+: no on-demand price for gcp a3-ultragpu-8g in us-south1-b; spot offer kept, "
    r"not checked against on-demand",
)


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def test_shipped_catalog_has_only_expected_notes(cat: Catalog) -> None:
    unexpected = [n for n in cat.notes if not any(re.fullmatch(p, n) for p in EXPECTED_NOTES)]
    assert unexpected == []
    assert len(cat.notes) == 8
    assert cat.version == "shipped-2026.11"


def test_shipped_catalog_loads_the_same_each_time(cat: Catalog) -> None:
    # How long a load takes is measured by bench/failfast.py (a timed test fails under load).
    again = load_catalog()
    assert again == cat and again is not cat


def test_shipped_catalog_is_cached() -> None:
    assert shipped_catalog() is shipped_catalog()


def test_required_gpus_are_present(cat: Catalog) -> None:
    required = {"T4", "V100", "A10G", "L4", "L40S", "A100", "A100-80GB", "H100", "H200", "B200"}
    assert required <= set(cat.gpus)
    # neusight features (SingleFLOPs/1000, Mem_Bw) where NeuSight has the same part
    assert (cat.gpus["T4"].fp32_tflops, cat.gpus["T4"].mem_bw_gbs) == (8.141, 320)
    assert (cat.gpus["H100"].fp32_tflops, cat.gpus["H100"].mem_bw_gbs) == (66.908, 3430)
    assert cat.gpus["A100-80GB"].memory_gb == 80 and cat.gpus["A100"].memory_gb == 40
    for gpu in cat.gpus.values():
        assert gpu.fp16_tflops > gpu.fp32_tflops > 0, gpu


@pytest.mark.parametrize(
    ("cloud", "names"),
    [
        (
            "aws",
            [
                "g4dn.xlarge",
                "g4dn.12xlarge",
                "g5.xlarge",
                "g5.12xlarge",
                "g6.xlarge",
                "g6e.12xlarge",
                "p3.2xlarge",
                "p3.8xlarge",
                "p3.16xlarge",
                "p3dn.24xlarge",
                "p4d.24xlarge",
                "p4de.24xlarge",
                "p5.48xlarge",
                "p5en.48xlarge",
            ],
        ),
        (
            "gcp",
            [
                "a2-highgpu-1g",
                "a2-highgpu-8g",
                "a2-ultragpu-8g",
                "a3-highgpu-8g",
                "a3-megagpu-8g",
                "g2-standard-4",
                "g2-standard-48",
                "n1-standard-8+1xT4",
                "n1-standard-16+4xT4",
                "n1-standard-8+1xV100",
                "n1-standard-32+4xV100",
            ],
        ),
    ],
)
def test_required_instance_types_have_on_demand_and_spot_offers(
    cat: Catalog, cloud: str, names: list[str]
) -> None:
    markets: dict[str, set[str]] = defaultdict(set)
    for o in cat.offers:
        markets[o.instance_type].add(o.market)
    for name in names:
        assert (cloud, name) in cat.instances, name
        assert markets[name] == {"on-demand", "spot"}, name


def test_reference_hardware_g4dn_12xlarge(cat: Catalog) -> None:
    inst = cat.instances[("aws", "g4dn.12xlarge")]
    assert (inst.gpu, inst.gpu_count, inst.vcpus, inst.memory_gb) == ("T4", 4, 48, 192)
    assert (inst.network_gbps, inst.interconnect, inst.interconnect_gbps) == (50, "pcie", 100)
    od = {
        o.usd_per_hour
        for o in cat.offers
        if o.instance_type == "g4dn.12xlarge" and o.market == "on-demand"
    }
    assert od == {3.912}
    assert all(
        "estimated" in o.source
        for o in cat.offers
        if o.instance_type == "g4dn.12xlarge" and o.market == "spot"
    )


def test_network_and_links_are_published_values(cat: Catalog) -> None:
    net = {name: i.network_gbps for (_c, name), i in cat.instances.items()}
    assert net["p4d.24xlarge"] == 400 and net["p5.48xlarge"] == 3200
    assert net["g5.xlarge"] == 2.5  # "Up to 10 Gigabit": its baseline
    assert net["a2-highgpu-8g"] == 100 and net["n1-standard-8+1xT4"] == 16
    links = {name: (i.interconnect, i.interconnect_gbps) for (_c, name), i in cat.instances.items()}
    assert links["p3.8xlarge"] == ("nvlink", 1200)
    assert links["p4d.24xlarge"] == ("nvlink", 2400)
    assert links["a3-highgpu-8g"] == ("nvlink", 3600)
    assert links["g4dn.xlarge"] == ("none", 0)


def test_every_row_is_sourced_and_prices_are_sane(cat: Catalog) -> None:
    assert 300 <= len(cat.offers) <= 2000
    rows = [
        *cat.gpus.values(),
        *cat.instances.values(),
        *cat.offers,
        *cat.spot_rates,
        *cat.billing.values(),
    ]
    assert all(r.source.strip() for r in rows)
    on_demand = {
        (o.cloud, o.instance_type, o.zone): o.usd_per_hour
        for o in cat.offers
        if o.market == "on-demand"
    }
    for o in cat.offers:
        if o.market == "spot" and (o.cloud, o.instance_type, o.zone) in on_demand:
            assert o.usd_per_hour <= on_demand[(o.cloud, o.instance_type, o.zone)], o
        # between $0.05 and $40 per GPU-hour
        assert 0.05 <= o.usd_per_hour / cat.instances[(o.cloud, o.instance_type)].gpu_count <= 40


def test_gcp_prices_replace_skypilot_sums_that_disagree(cat: Catalog) -> None:
    # the subset's H100 accelerator row in us-central1 is about half the list price
    a3 = [
        o
        for o in cat.offers
        if o.instance_type == "a3-highgpu-8g"
        and o.zone == "us-central1-a"
        and o.market == "on-demand"
    ]
    assert [round(o.usd_per_hour, 2) for o in a3] == [88.49]
    assert "gcp-prices" in a3[0].source


def test_spot_rates_come_from_the_bamboo_traces(cat: Catalog) -> None:
    rates = {(r.cloud, r.family): r.per_hour for r in cat.spot_rates}
    assert rates[("aws", "g4dn")] == pytest.approx(0.55, abs=0.01)  # 74 removals, 135.7 node-h
    assert rates[("aws", "p3")] == pytest.approx(0.61, abs=0.01)
    assert cat.spot_rate("aws", "g4dn.12xlarge").family == "g4dn"
    assert cat.spot_rate("aws", "p3dn.24xlarge").family == "p3"
    assert cat.spot_rate("gcp", "n1-standard-8+1xT4").family == "n1"
    assert cat.spot_rate("gcp", "g2-standard-8").family == "*"
    assert cat.spot_rate("aws", "p5.48xlarge").source.startswith("assumed")


def test_billing_is_per_second_with_a_minute_minimum(cat: Catalog) -> None:
    for cloud in ("aws", "gcp"):
        rule = cat.billing[cloud]
        assert rule.billed_seconds(1) == 60
        assert rule.billed_seconds(90.2) == 91


def test_license_files_ship_beside_the_data() -> None:
    data = resources.files("kplan.catalogs").joinpath("data")
    for name, words in (
        ("LICENSE-gcp-prices.txt", "Apache License"),
        ("LICENSE-neusight.txt", "MIT License"),
        ("LICENSE-bamboo.txt", "MIT License"),
    ):
        assert words in data.joinpath(name).read_text(encoding="utf-8")
