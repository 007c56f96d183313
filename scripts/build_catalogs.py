"""Build kplan's shipped catalog (``kplan/catalogs/data/``) from the shared reference data.

Run from the repository root::

    .venv/bin/python -m scripts.build_catalogs            # rewrites kplan/catalogs/data/
    .venv/bin/python -m scripts.build_catalogs --check    # exit 1 if kplan/catalogs/data/ is stale
    .venv/bin/python -m scripts.build_catalogs --out DIR  # writes the files to DIR instead

Inputs: the shared data folder ($KPLAN_SHARED_DATA, else ../shared/data beside the repository):
``catalogs/skypilot-v9`` (AWS and GCP GPU VM rows, one per zone), ``spot/gcp-prices`` (GCP VM
list prices 2022-2026, one row per change), ``spot/bamboo-nsdi23-traces`` (spot preemption
traces) and ``gpu/neusight-asplos25/device_configs`` (GPU specs); AWS's own describe-instance-types
data as shipped inside the ``moto`` package (``--moto-ec2-resources`` to point at it); and the
published facts of ``scripts/catalog_facts.py``, each with its source (``scripts/catalog_offers.py``
turns them into instance types and offers). The output is deterministic: running
it twice gives the same bytes. Every decision that departs from a source row is listed in
``BUILD_REPORT.md`` beside the data. See docs/catalogs.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import importlib.util
import io
import itertools
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kplan.catalogs.rows import (
    BILLING_COLUMNS,
    GPU_COLUMNS,
    INSTANCE_COLUMNS,
    PRICE_COLUMNS,
    SPOT_RATE_COLUMNS,
)
from kplan.catalogs.zones import ZONE_COLUMNS, zone_source, zone_type_from_id
from scripts.catalog_facts import BILLING, GPUS, TENSOR_SPECS
from scripts.catalog_offers import AWS_LIST_REGIONS, Build, build_aws, build_gcp

VERSION = "shipped-2026.11"
REPO = Path(__file__).resolve().parents[1]
SHIPPED_DIR = REPO / "kplan" / "catalogs" / "data"
BAMBOO = Path("spot") / "bamboo-nsdi23-traces"
NEUSIGHT = Path("gpu") / "neusight-asplos25"
LICENSES = {  # shipped name -> source license file (data derived from it ships here)
    "LICENSE-gcp-prices.txt": Path("spot") / "gcp-prices" / "LICENSE.txt",
    "LICENSE-neusight.txt": NEUSIGHT / "LICENSE.txt",
    "LICENSE-bamboo.txt": BAMBOO / "LICENSE.txt",
}


def build_gpus(b: Build, data: Path) -> None:
    for g in GPUS:
        fp32, bw, src = g.fp32_tflops, g.mem_bw_gbs, g.source
        if g.neusight:
            path = data / NEUSIGHT / "device_configs" / f"{g.neusight}.json"
            cfg = json.loads(path.read_text(encoding="utf-8"))
            parts = []
            if not fp32:
                fp32, _ = (
                    round(cfg["SingleFLOPs"] / 1000, 3),
                    parts.append("FP32 = SingleFLOPs/1000"),
                )
            if not bw:
                bw, _ = float(cfg["Mem_Bw"]), parts.append("bandwidth = Mem_Bw")
            src = f"NeuSight device_configs/{path.name} ({', '.join(parts)}); {src}"
        tf32, bf16, sms, tensor_src = TENSOR_SPECS[g.name]
        b.gpus.append(
            [
                g.name,
                g.memory_gb,
                fp32,
                g.fp16_tflops,
                bw,
                tf32 or "",
                bf16 or "",
                sms,
                f"{src}; {tensor_src}",
            ]
        )


# ---- spot preemption rates ---------------------------------------------------------------------


def node_trace_rate(path: Path) -> tuple[float, int, float]:
    """(removals per node-hour, removals, node-hours) of a ``time_ms,add|remove,node`` trace."""
    with path.open(newline="", encoding="utf-8") as f:
        events = sorted((int(t), kind) for t, kind, _node in csv.reader(f))
    alive, removals, node_ms, last = 0, 0, 0, events[0][0]
    for t, kind in events:
        node_ms += alive * (t - last)
        last = t
        if kind == "add":
            alive += 1
        else:
            alive, removals = alive - 1, removals + 1
    hours = node_ms / 3.6e6
    return removals / hours, removals, hours


def count_trace_rate(path: Path) -> tuple[float, int, float]:
    """(count decreases per VM-hour, decreases, VM-hours) of a ``date, time, count`` trace."""
    points = []
    for line in path.read_text(encoding="utf-8").splitlines():
        day, clock, count = (p.strip() for p in line.split(","))
        points.append((dt.datetime.fromisoformat(f"{day} {clock}"), int(count)))
    drops = sum(max(0, a[1] - b[1]) for a, b in itertools.pairwise(points))
    hours = sum(a[1] * (b[0] - a[0]).total_seconds() / 3600 for a, b in itertools.pairwise(points))
    return drops / hours, drops, hours


def build_spot_rates(b: Build, data: Path) -> None:
    traces = data / BAMBOO / "traces"
    measured: dict[tuple[str, str], float] = {}
    for family in ("g4dn", "p3"):
        rate, n, hours = node_trace_rate(traces / f"{family}-trace.csv")
        measured[("aws", family)] = rate
        b.spot_rates.append(
            [
                "aws",
                family,
                round(rate, 4),
                f"measured: {n} removals in {hours:.1f} node-hours of an EC2 "
                f"{family} spot autoscaling group (bamboo NSDI'23 traces/"
                f"{family}-trace.csv)",
            ]
        )
    for family, trace in (("a2", "a100x1-east1b.txt"), ("n1", "v100x1-east1c.txt")):
        rate, n, hours = count_trace_rate(traces / "gcloud" / trace)
        measured[("gcp", family)] = rate
        b.spot_rates.append(
            [
                "gcp",
                family,
                round(rate, 4),
                f"measured, a lower bound: {n} decreases of the running-VM count in "
                f"{hours:.0f} VM-hours of GCP spot VMs (bamboo NSDI'23 traces/"
                f"gcloud/{trace}); applied to the whole family",
            ]
        )
    aws = [v for (c, _f), v in measured.items() if c == "aws"]
    gcp = [v for (c, _f), v in measured.items() if c == "gcp"]
    b.spot_rates.append(
        [
            "aws",
            "*",
            round(sum(aws) / len(aws), 4),
            "assumed: no measurement for this family; mean of the measured g4dn "
            "and p3 rates (2020-21 traces, likely pessimistic today)",
        ]
    )
    b.spot_rates.append(
        [
            "gcp",
            "*",
            round(max(gcp), 4),
            "assumed: no measurement for this family; the larger measured GCP rate "
            "(n1+V100), since those are lower bounds",
        ]
    )


# ---- output ------------------------------------------------------------------------------------

HEADERS = {
    # the loader's columns (kplan/catalogs/rows.py), and the GPU rows' optional ones before source
    "gpus.csv": [*GPU_COLUMNS[:-1], "tf32_tflops", "bf16_tflops", "sm_count", "source"],
    "instances.csv": list(INSTANCE_COLUMNS),
    "prices.csv": list(PRICE_COLUMNS),
    "spot_rates.csv": list(SPOT_RATE_COLUMNS),
    "billing.csv": list(BILLING_COLUMNS),
    "zones.csv": list(ZONE_COLUMNS),
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        text = repr(round(value, 6))
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def _csv(header: list[str], rows: Iterable[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_fmt(v) for v in row] for row in rows)
    return out.getvalue()


def render(b: Build) -> dict[str, str]:
    """The text of every generated file, by name."""
    prices = sorted(b.prices, key=lambda p: (p[0], p[1], p[2], p[3], p[4]))
    report = [
        f"# Catalog build report ({VERSION})",
        "",
        "Written by `scripts/build_catalogs.py`; every departure from a source row.",
        "",
        f"- {len(b.gpus)} GPUs, {len(b.instances)} instance types, {len(prices)} offers, "
        f"{len(b.spot_rates)} spot rates",
        "",
    ]
    report += [f"- {line}" for line in sorted(b.report)]
    return {
        "gpus.csv": _csv(HEADERS["gpus.csv"], b.gpus),
        "instances.csv": _csv(
            HEADERS["instances.csv"], [b.instances[k] for k in sorted(b.instances)]
        ),
        "prices.csv": _csv(HEADERS["prices.csv"], prices),
        "spot_rates.csv": _csv(HEADERS["spot_rates.csv"], b.spot_rates),
        "billing.csv": _csv(HEADERS["billing.csv"], [list(r) for r in BILLING]),
        "zones.csv": _csv(HEADERS["zones.csv"], zone_rows(prices)),
        "VERSION.txt": VERSION + "\n",
        "BUILD_REPORT.md": "\n".join(report) + "\n",
    }


def zone_rows(prices: list[list[Any]]) -> list[list[Any]]:
    """One zones.csv row per zone with an offer: its type from the zone id's documented form."""
    zones = sorted({(p[0], p[2], p[3]) for p in prices})
    return [[c, r, z, zone_type_from_id(c, z), zone_source(c)] for c, r, z in zones]


def moto_ec2_resources(given: Path | None) -> Path:
    """moto's ``ec2/resources`` folder (AWS's describe-instance-types data)."""
    if given is not None:
        return given
    spec = importlib.util.find_spec("moto")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "moto is not installed for this Python: pip install moto, or pass "
            "--moto-ec2-resources <site-packages>/moto/ec2/resources"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "ec2" / "resources"


def read_moto(resources: Path) -> tuple[dict[str, Any], dict[str, set[str]]]:
    """Instance types by name, and the zone ids (AWS_LIST_REGIONS) where each is offered."""
    with gzip.open(resources / "instance_types.json.gz", "rt", encoding="utf-8") as f:
        types: dict[str, Any] = json.load(f)
    zones: dict[str, set[str]] = defaultdict(set)
    for region in AWS_LIST_REGIONS:
        path = resources / "instance_type_offerings" / "availability-zone-id" / f"{region}.json.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for item in json.load(f):
                zones[item["InstanceType"]].add(item["Location"])
    return types, zones


def build(data: Path, moto_resources: Path) -> dict[str, str]:
    """Build every file from the inputs; returns their text by name."""
    b = Build()
    build_gpus(b, data)
    types, zones = read_moto(moto_resources)
    build_aws(b, data, types, zones)
    build_gcp(b, data)
    build_spot_rates(b, data)
    return render(b)


def data_root() -> Path:
    """The shared data folder: $KPLAN_SHARED_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("KPLAN_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="shared data folder")
    parser.add_argument(
        "--moto-ec2-resources",
        type=Path,
        default=None,
        help="moto's ec2/resources folder (default: found via the moto package)",
    )
    parser.add_argument("--out", type=Path, default=SHIPPED_DIR, help="output folder")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the output folder instead of writing; exit 1 if stale",
    )
    args = parser.parse_args(argv)
    data = args.data or data_root()
    files = build(data, moto_ec2_resources(args.moto_ec2_resources))
    licenses = {name: (data / src).read_text(encoding="utf-8") for name, src in LICENSES.items()}
    files_all = {**files, **licenses}
    if args.check:
        stale = [
            n
            for n, text in files_all.items()
            if not (args.out / n).is_file() or (args.out / n).read_text("utf-8") != text
        ]
        for name in stale:
            print(f"stale: {args.out / name}", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files_all.items():
        path = args.out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    counts = ", ".join(
        f"{n}: {t.count(chr(10)) - 1} rows" for n, t in files.items() if n.endswith(".csv")
    )
    print(f"wrote {args.out} ({VERSION}): {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
