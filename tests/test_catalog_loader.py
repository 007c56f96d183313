"""The catalog loader's rules, each shown on a small catalog written to tmp_path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kplan.catalogs import load_catalog, resolve_gpu
from kplan.core.errors import CatalogError, InputError

FILES = {
    "gpus.csv": (
        "name,memory_gb,fp32_tflops,fp16_tflops,mem_bw_gbs,source\n"
        "T4,16,8.141,65,320,datasheet\n"
        "A100,40,19.492,312,1555,datasheet\n"
    ),
    "instances.csv": (
        "cloud,name,gpu,gpu_count,vcpus,memory_gb,network_gbps,interconnect,interconnect_gbps,"
        "source\n"
        "aws,g4dn.12xlarge,T4,4,48,192,50,pcie,100,aws docs\n"
        "aws,g4dn.xlarge,T4,1,4,16,5,none,0,aws docs\n"
        "gcp,a2-highgpu-8g,A100,8,96,680,100,nvlink,2400,gcp docs\n"
    ),
    "prices.csv": (
        "cloud,instance_type,region,zone,market,usd_per_hour,source\n"
        "aws,g4dn.12xlarge,us-east-1,use1-az1,on-demand,3.912,list\n"
        "aws,g4dn.12xlarge,us-east-1,use1-az1,spot,1.6,sky\n"
        "aws,g4dn.xlarge,us-east-1,use1-az1,on-demand,0.526,sky\n"
        "gcp,a2-highgpu-8g,us-central1,us-central1-a,on-demand,29.387,gcp\n"
        "gcp,a2-highgpu-8g,us-central1,us-central1-a,spot,15.4,gcp\n"
    ),
    "spot_rates.csv": (
        "cloud,family,per_hour,source\naws,g4dn,0.55,bamboo\naws,*,0.5,assumed\ngcp,*,0.3,assumed\n"
    ),
    "billing.csv": (
        "cloud,minimum_s,increment_s,source\naws,60,1,aws pricing\ngcp,60,1,gcp pricing\n"
    ),
    "VERSION.txt": "user-test\n",
}


def write_catalog(root: Path, **changes: str | None) -> Path:
    """A valid small catalog in ``root``; ``changes`` replace (or, with None, remove) files
    named with ``_`` for ``.``, e.g. ``prices_csv=...``."""
    root.mkdir(parents=True, exist_ok=True)
    files = dict(FILES)
    for key, text in changes.items():
        name = key.replace("_csv", ".csv").replace("_txt", ".txt")
        assert name in files, name
        if text is None:
            del files[name]
        else:
            files[name] = text
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def with_row(name: str, row: str) -> str:
    return FILES[name] + row + "\n"


def test_valid_catalog_loads_with_no_notes(tmp_path: Path) -> None:
    cat = load_catalog(write_catalog(tmp_path))
    assert cat.notes == ()
    assert cat.version == "user-test"
    assert set(cat.gpus) == {"T4", "A100"}
    inst = cat.instances[("aws", "g4dn.12xlarge")]
    assert (inst.gpu, inst.gpu_count, inst.network_gbps, inst.interconnect) == ("T4", 4, 50, "pcie")
    assert len(cat.offers) == 5
    assert cat.billing["gcp"].billed_seconds(30) == 60
    assert cat.spot_rate("aws", "g4dn.12xlarge").per_hour == 0.55
    assert cat.spot_rate("aws", "p3.2xlarge").family == "*"


@pytest.mark.parametrize("missing", ["gpus.csv", "instances.csv", "prices.csv", "billing.csv"])
def test_missing_file_is_an_error(tmp_path: Path, missing: str) -> None:
    write_catalog(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(CatalogError, match=rf"{re.escape(missing)} is missing") as err:
        load_catalog(tmp_path)
    assert "gpus.csv, instances.csv" in err.value.hint


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog(tmp_path / "nowhere")


def test_missing_column_is_an_error(tmp_path: Path) -> None:
    text = FILES["prices.csv"].replace(",usd_per_hour", ",price")
    write_catalog(tmp_path, prices_csv=text)
    with pytest.raises(CatalogError, match=r"prices.csv lacks column\(s\) usd_per_hour"):
        load_catalog(tmp_path)


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    write_catalog(tmp_path, gpus_csv="")
    with pytest.raises(CatalogError, match=r"gpus\.csv is empty"):
        load_catalog(tmp_path)


def test_malformed_csv_is_an_error(tmp_path: Path) -> None:
    write_catalog(tmp_path, prices_csv=with_row("prices.csv", 'aws,"g4dn"x,us-east-1,z,spot,1,s'))
    with pytest.raises(CatalogError, match=r"prices.csv:7: malformed CSV"):
        load_catalog(tmp_path)


def test_non_utf8_file_is_an_error(tmp_path: Path) -> None:
    write_catalog(tmp_path)
    (tmp_path / "gpus.csv").write_bytes(FILES["gpus.csv"].encode() + b"\xff\xfe,1\n")
    with pytest.raises(CatalogError, match="not UTF-8"):
        load_catalog(tmp_path)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (
            "aws,g4dn.xlarge,us-east-1,use1-az2,on-demand,abc,s",
            "usd_per_hour='abc' is not a number",
        ),
        ("aws,g4dn.xlarge,us-east-1,use1-az2,on-demand,-1,s", "usd_per_hour='-1' must be > 0"),
        ("aws,g4dn.xlarge,us-east-1,use1-az2,on-demand,0,s", "usd_per_hour='0' must be > 0"),
        ("aws,g4dn.xlarge,us-east-1,use1-az2,on-demand,inf,s", "is not a finite number"),
        ("aws,g4dn.xlarge,us-east-1,use1-az2,on-demand,0.5,", "source is empty"),
        ("aws,g4dn.xlarge,,use1-az2,on-demand,0.5,s", "region is empty"),
        ("azure,g4dn.xlarge,us-east-1,use1-az2,on-demand,0.5,s", "cloud='azure' is not one of"),
        ("aws,g4dn.xlarge,us-east-1,use1-az2,reserved,0.5,s", "market='reserved' is not one of"),
        ("aws,g4dn.xlarge,us-east-1,use1-az2,on-demand,0.5", "row has 6 fields, the header has 7"),
        ("gcp,a2-highgpu-8g,us-central1,us-east1-b,spot,9,s", "zone 'us-east1-b' is not in region"),
        ("aws,p9.xlarge,us-east-1,use1-az2,on-demand,0.5,s", "unknown instance type aws:p9.xlarge"),
        ("aws,g4dn.xlarge,us-east-1,use1-az1,on-demand,0.6,s", "duplicate of line 4"),
    ],
)
def test_bad_offer_row_is_dropped_and_noted(tmp_path: Path, row: str, reason: str) -> None:
    cat = load_catalog(write_catalog(tmp_path, prices_csv=with_row("prices.csv", row)))
    assert len(cat.notes) == 1, cat.notes
    assert cat.notes[0].startswith("prices.csv:7: ")
    assert reason in cat.notes[0]
    assert cat.notes[0].endswith("row dropped")
    assert len(cat.offers) == 5  # the five good rows, nothing from the bad one
    assert ("aws", "g4dn.xlarge", "use1-az1", "on-demand", 0.526) in {
        (o.cloud, o.instance_type, o.zone, o.market, o.usd_per_hour) for o in cat.offers
    }


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("aws,p3.8xlarge,V100,4,32,244,10,nvlink,1200,s", "unknown GPU 'V100'"),
        ("aws,g4dn.2xlarge,T4,1.5,8,32,10,none,0,s", "gpu_count='1.5' must be a whole number"),
        ("aws,g4dn.2xlarge,T4,2,8,32,10,none,0,s", "interconnect='none' with gpu_count=2"),
        ("aws,g4dn.2xlarge,T4,1,8,32,10,none,5,s", "interconnect='none' needs interconnect_gbps=0"),
        ("aws,g4dn.2xlarge,T4,2,8,32,10,pcie,0,s", "interconnect='pcie' needs interconnect_gbps"),
        ("aws,g4dn.2xlarge,T4,2,8,32,10,infiniband,100,s", "interconnect='infiniband' is not one"),
        ("aws,g4dn.2xlarge,T4,1,8,32,0,none,0,s", "network_gbps='0' must be > 0"),
        ("aws,g4dn.xlarge,T4,1,4,16,5,none,0,again", "duplicate of line 3 (aws:g4dn.xlarge)"),
    ],
)
def test_bad_instance_row_is_dropped_and_noted(tmp_path: Path, row: str, reason: str) -> None:
    cat = load_catalog(write_catalog(tmp_path, instances_csv=with_row("instances.csv", row)))
    assert len(cat.notes) == 1, cat.notes
    assert cat.notes[0].startswith("instances.csv:5: ")
    assert reason in cat.notes[0]
    assert len(cat.instances) == 3
    assert cat.instances[("aws", "g4dn.xlarge")].source == "aws docs"


def test_bad_gpu_row_drops_its_instances_and_their_offers(tmp_path: Path) -> None:
    gpus = FILES["gpus.csv"].replace("A100,40,19.492", "A100,40,fast")
    cat = load_catalog(write_catalog(tmp_path, gpus_csv=gpus))
    assert cat.notes[0] == "gpus.csv:3: fp32_tflops='fast' is not a number; row dropped"
    assert "instances.csv:4: unknown GPU 'A100'" in cat.notes[1]
    assert all("unknown instance type gcp:a2-highgpu-8g" in n for n in cat.notes[2:4])
    assert len(cat.notes) == 4
    assert {o.cloud for o in cat.offers} == {"aws"}


def test_spot_above_on_demand_is_dropped(tmp_path: Path) -> None:
    prices = FILES["prices.csv"].replace("spot,1.6,sky", "spot,4.5,sky")
    cat = load_catalog(write_catalog(tmp_path, prices_csv=prices))
    assert cat.notes == (
        "prices.csv:3: spot price 4.5 is above the on-demand price 3.912 for aws g4dn.12xlarge "
        "in use1-az1; spot offer dropped",
    )
    assert not any(o.instance_type == "g4dn.12xlarge" and o.market == "spot" for o in cat.offers)
    assert any(o.instance_type == "g4dn.12xlarge" and o.market == "on-demand" for o in cat.offers)


def test_spot_equal_to_on_demand_is_kept_and_noted(tmp_path: Path) -> None:
    prices = FILES["prices.csv"].replace("spot,1.6,sky", "spot,3.912,sky")
    cat = load_catalog(write_catalog(tmp_path, prices_csv=prices))
    assert len(cat.notes) == 1
    assert "spot price equals the on-demand price 3.912" in cat.notes[0]
    assert cat.notes[0].endswith("; kept")
    assert any(o.market == "spot" and o.usd_per_hour == 3.912 for o in cat.offers)


def test_missing_on_demand_price_like_p5e(tmp_path: Path) -> None:
    # the source's empty on-demand price: that row is dropped, the spot row kept but flagged
    prices = FILES["prices.csv"].replace("on-demand,3.912,list", "on-demand,,list")
    cat = load_catalog(write_catalog(tmp_path, prices_csv=prices))
    assert cat.notes == (
        "prices.csv:2: usd_per_hour is empty; row dropped",
        "prices.csv:3: no on-demand price for aws g4dn.12xlarge in use1-az1; spot offer kept, "
        "not checked against on-demand",
    )
    spot = [o for o in cat.offers if o.instance_type == "g4dn.12xlarge"]
    assert [(o.market, o.usd_per_hour) for o in spot] == [("spot", 1.6)]


def test_bad_spot_rate_and_billing_rows_are_noted(tmp_path: Path) -> None:
    rates = with_row("spot_rates.csv", "aws,p3,-0.1,bamboo")
    billing = FILES["billing.csv"] + "aws,60,0,again\n"
    cat = load_catalog(write_catalog(tmp_path, spot_rates_csv=rates, billing_csv=billing))
    assert cat.notes == (
        "spot_rates.csv:5: per_hour='-0.1' must be >= 0; row dropped",
        "billing.csv:4: increment_s='0' must be > 0; row dropped",
    )


def test_cloud_without_billing_rule_is_an_error(tmp_path: Path) -> None:
    write_catalog(tmp_path, billing_csv="cloud,minimum_s,increment_s,source\naws,60,1,aws\n")
    with pytest.raises(CatalogError, match="no billing rule for gcp") as err:
        load_catalog(tmp_path)
    assert "gcp,60,1" in err.value.hint


def test_spot_offers_need_a_default_spot_rate(tmp_path: Path) -> None:
    write_catalog(tmp_path, spot_rates_csv="cloud,family,per_hour,source\naws,*,0.5,a\n")
    with pytest.raises(CatalogError, match="gcp has spot offers but no default spot rate"):
        load_catalog(tmp_path)


def test_catalog_without_usable_offers_is_an_error(tmp_path: Path) -> None:
    prices = "cloud,instance_type,region,zone,market,usd_per_hour,source\naws,x,r,z,spot,1,s\n"
    write_catalog(tmp_path, prices_csv=prices)
    with pytest.raises(CatalogError, match="no usable offers") as err:
        load_catalog(tmp_path)
    assert "unknown instance type aws:x" in err.value.hint


def test_version_defaults_to_newest_file_date(tmp_path: Path) -> None:
    cat = load_catalog(write_catalog(tmp_path, VERSION_txt=None))
    assert re.fullmatch(r"user-\d{4}-\d{2}-\d{2}", cat.version)


def test_version_file_must_hold_one_word(tmp_path: Path) -> None:
    write_catalog(tmp_path, VERSION_txt="my catalog\n")
    with pytest.raises(CatalogError, match="must hold one word, got 'my catalog'"):
        load_catalog(tmp_path)


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("a100-80gb", "A100-80GB"),
        ("A100_80GB", "A100-80GB"),
        ("NVIDIA A100 80GB", "A100-80GB"),
        ("nvidia-a100-80gb", "A100-80GB"),
        ("nvidia-tesla-a100", "A100"),
        ("nvidia-tesla-t4", "T4"),
        ("Tesla T4", "T4"),
        ("h100", "H100"),
        ("nvidia-h100-mega-80gb", "H100"),
        ("nvidia-h200-141gb", "H200"),
        ("v100-32gb", "V100-32GB"),
        ("a10g", "A10G"),
    ],
)
def test_resolve_gpu_accepts_aliases(name: str, canonical: str) -> None:
    assert resolve_gpu(name).name == canonical


@pytest.mark.parametrize("name", ["A1000", "", "nvidia", "H100-96GB"])
def test_resolve_gpu_rejects_unknown_names_with_the_known_ones(name: str) -> None:
    with pytest.raises(InputError, match=f"unknown GPU {re.escape(repr(name))}") as err:
        resolve_gpu(name)
    assert "A100-80GB" in err.value.hint and "T4" in err.value.hint


def test_resolve_gpu_only_aliases_to_gpus_in_the_catalog(tmp_path: Path) -> None:
    cat = load_catalog(write_catalog(tmp_path))
    assert resolve_gpu("nvidia-tesla-a100", cat).name == "A100"
    with pytest.raises(InputError, match="unknown GPU 'H100'") as err:
        resolve_gpu("H100", cat)
    assert err.value.hint.startswith("known GPUs: A100, T4")
