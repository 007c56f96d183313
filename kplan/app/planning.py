"""``kplan estimate`` as a library call: load the inputs, build the workload, search."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from kplan.catalogs.current import load_current, staleness_note
from kplan.catalogs.device_model import load_device_model
from kplan.core.errors import InputError
from kplan.core.files import read_json
from kplan.planner.catalog import Catalog, nic_fabric
from kplan.planner.plan import Plan
from kplan.planner.profile import Profile, profile_from_dict
from kplan.planner.search import SearchOptions, search
from kplan.planner.workload import Workload, workload_from_profile


@dataclass(frozen=True)
class ExampleInfo:
    """What a built-in example profile stands for (its measurements are in its JSON)."""

    model: str  # model / dataset
    description: str  # one line


# The built-in profiles: Pollux (OSDI'21) workloads measured on 4x T4 (scripts/build_examples.py)
EXAMPLE_INFO: dict[str, ExampleInfo] = {
    "bert-squad": ExampleInfo("BERT-base / SQuAD", "question answering"),
    "cifar10-resnet18": ExampleInfo("ResNet-18 / CIFAR-10", "small images, 10 classes"),
    "deepspeech2": ExampleInfo("DeepSpeech2 / CMU-ARCTIC", "speech recognition"),
    "imagenet-resnet50": ExampleInfo("ResNet-50 / ImageNet", "image classification"),
    "yolov3": ExampleInfo("YOLOv3 / PASCAL VOC", "object detection"),
}


def example_names() -> list[str]:
    folder = resources.files("kplan.planner") / "examples"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_example(name: str) -> Profile:
    names = example_names()
    if name not in names:
        raise InputError(f"unknown example {name!r}", hint=f"examples: {', '.join(names)}")
    text = (resources.files("kplan.planner") / "examples" / f"{name}.json").read_text()
    return profile_from_dict(json.loads(text), f"example {name}")


def load_profile(path: Path) -> Profile:
    return profile_from_dict(read_json(path, "profile"), str(path))


@dataclass(frozen=True)
class Estimate:
    plan: Plan
    workload: Workload
    catalog: Catalog
    profile: Profile
    epochs: float = 0.0  # what was planned (the profile's unless --epochs)
    dataset_size: int = 0


def estimate(
    profile: Profile,
    options: SearchOptions,
    *,
    epochs: float | None = None,
    dataset_size: int | None = None,
    catalog: Catalog | None = None,
    other: Profile | None = None,
) -> Estimate:
    """Plan ``profile``; ``other``: the same job on the same GPU in the other precision family
    (its measured speed-up refines the cross-GPU prediction, see ``workload.precision_ratio``)."""
    from kplan.core import flags

    flags.number("--epochs", epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 90")
    flags.integer("--dataset-size", dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch")
    if catalog is None:
        from kplan.catalogs.current import current_catalog_dir
        from kplan.core.files import check_folder_files

        check_folder_files(current_catalog_dir(), "catalog")  # a FIFO there would hang
        catalog = load_current()
    dm = load_device_model()
    params = None
    if profile.fit is not None:
        from kplan.planner.perfmodel import params_from_dict

        params = params_from_dict(profile.fit, f"profile {profile.name} (fit)")
    ref_links: tuple[float | None, float | None] = (None, None)
    ref_fabric = None
    if profile.cloud and profile.instance_type:
        inst = catalog.instances.get((profile.cloud, profile.instance_type))
        if inst is not None:
            ref_links = (inst.interconnect_gbps, inst.network_gbps)
            ref_fabric = nic_fabric(inst)
    workload = workload_from_profile(
        profile,
        catalog.gpus,
        params=params,
        epochs=epochs,
        dataset_size=dataset_size,
        ref_link_gbps=ref_links,
        other=other,
        ref_fabric=ref_fabric,
    )
    plan = search(workload, catalog, dm, options)
    if (stale := staleness_note(catalog.version)) is not None:
        plan = replace(plan, notes=(*plan.notes, stale))
    return Estimate(
        plan,
        workload,
        catalog,
        profile,
        epochs if epochs is not None else profile.epochs,
        dataset_size if dataset_size is not None else profile.dataset_size,
    )


@dataclass(frozen=True)
class ExampleRow:
    """One built-in example as ``--list-examples`` shows it (``--json``: these fields)."""

    name: str
    model: str
    dataset_size: int
    epochs: float
    base_batch: int
    measured_on: str
    description: str


def example_rows() -> list[ExampleRow]:
    """One row per built-in example: name, model/dataset, epochs, B0, measured on, description."""
    rows = []
    for name in example_names():
        p = load_example(name)
        info = EXAMPLE_INFO.get(name, ExampleInfo("", p.provenance.split(";")[0]))
        rows.append(
            ExampleRow(
                name=name,
                model=info.model,
                dataset_size=p.dataset_size,
                epochs=p.epochs,
                base_batch=p.base_global_batch,
                measured_on=measured_on(p),
                description=info.description,
            )
        )
    return rows


def measured_on(p: Profile) -> str:
    """``g4dn.12xlarge (4 x T4)``: the profiled node's type and its GPUs."""
    gpus = f"{p.gpus_per_node} x {p.gpu}"
    return f"{p.instance_type} ({gpus})" if p.instance_type else gpus


@dataclass(frozen=True)
class SearchScope:
    """What an estimate searched and how it chose (the flags, as the search read them)."""

    clouds: tuple[str, ...]
    regions: tuple[str, ...]  # empty: every region
    gpus: tuple[str, ...]
    instance_types: tuple[str, ...]
    markets: tuple[str, ...]
    nodes: tuple[int, int]  # (fewest, most)
    global_batch: tuple[int, int]
    accum_steps: tuple[int, int]
    mixed: bool
    opt_in_zones: bool
    objective: str
    tie_tolerance: float
    budget_usd: float | None
    deadline_hours: float | None
    compression: str | None  # None: dense, and the defaults on multi-node
    compression_steps: tuple[tuple[str, float, float], ...]  # (spec, step multiple, sigma)


@dataclass(frozen=True)
class Assumptions:
    """What an estimate assumed: the workload, where it was measured, what was searched
    (``kplan estimate`` renders it; the plan file holds its fields as ``assumptions``)."""

    profile: str
    source: str
    model: str
    dataset_size: int
    epochs: float
    base_batch: int
    measured_on: str
    measured_nodes: int
    measured_gpus: int
    profile_precision: str
    precision: str
    precision_basis: str
    gns: bool
    search: SearchScope


def assumptions(est: Estimate, options: SearchOptions, source: str) -> Assumptions:
    """What the estimate assumed: the workload, where it was measured, what was searched."""
    from kplan.planner.search import batch_grid

    p, w = est.profile, est.workload
    grid = batch_grid(w, options)
    info = EXAMPLE_INFO.get(p.name) if source.startswith("example") else None
    nodes = max((m.nodes for m in p.measurements), default=1)
    gpus = max((m.workers for m in p.measurements), default=1)
    scope = SearchScope(
        clouds=options.clouds or tuple(sorted({o.cloud for o in est.catalog.offers})),
        regions=options.regions,
        gpus=options.gpus,
        instance_types=options.instance_types,
        markets=options.markets,
        nodes=(options.min_nodes, options.max_nodes),
        global_batch=(int(grid.min()), int(grid.max())),
        accum_steps=(min(options.accum_steps), max(options.accum_steps)),
        mixed=options.mixed,
        opt_in_zones=options.opt_in_zones,
        objective=options.objective,
        tie_tolerance=options.tie_tolerance,
        budget_usd=options.budget_usd,
        deadline_hours=options.deadline_hours,
        compression=options.compression,
        compression_steps=options.compression_stats,
    )
    return Assumptions(
        profile=p.name,
        source=source,
        model=info.model if info else "",
        dataset_size=est.dataset_size,
        epochs=est.epochs,
        base_batch=w.base_batch,
        measured_on=measured_on(p),
        measured_nodes=nodes,
        measured_gpus=gpus,
        profile_precision=w.precision,
        precision=est.plan.precision,
        precision_basis=est.plan.precision_basis,
        gns=bool(w.gns),
        search=scope,
    )


def script_for(p: Profile) -> str | None:
    """The training script a profile was made from, where it says (None: a built-in profile)."""
    import re

    from kplan.profiler.examples import EXAMPLES

    if p.name in EXAMPLES:
        return f"kplan/examples/{EXAMPLES[p.name].filename}"
    m = re.search(r"profile of (\S+\.py) on ", p.provenance)
    if m is None:
        return None
    shipped = {e.filename for e in EXAMPLES.values()}
    return f"kplan/examples/{m.group(1)}" if m.group(1) in shipped else m.group(1)


def launch_budget(cost_p90_usd: float) -> float:
    """A --budget for the plan: its p90 cost rounded up to two significant digits, >= $0.01."""
    import math

    if not cost_p90_usd > 0.01:
        return 0.01
    unit = 10.0 ** (math.floor(math.log10(cost_p90_usd)) - 1)
    return round(math.ceil(cost_p90_usd / unit - 1e-9) * unit, 10)


def launch_command(
    plan: Plan, script: str | None, plan_file: Path, budget: float | None, deadline: float | None
) -> str:
    """The `kplan launch` line that runs ``plan`` once it is saved in ``plan_file``."""
    import shlex

    b = budget if budget is not None else launch_budget(plan.chosen.cost_p90_usd)
    parts = ["kplan", "launch", script or "train.py", "--plan", str(plan_file), f"--budget {b:g}"]
    if deadline is not None:
        parts.append(f"--deadline {deadline:g}")
    return " ".join(shlex.quote(x) if i < 5 else x for i, x in enumerate(parts))
