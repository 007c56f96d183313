"""``kplan estimate`` as a library call: load the inputs, build the workload, search."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from kplan.catalogs.current import load_current, staleness_note
from kplan.catalogs.device_model import load_device_model
from kplan.core.errors import InputError
from kplan.core.files import read_json
from kplan.planner.catalog import Catalog, nic_fabric
from kplan.planner.devices import DeviceModel
from kplan.planner.plan import Plan
from kplan.planner.profile import Profile, profile_from_dict
from kplan.planner.search import SearchOptions, search
from kplan.planner.workload import (
    DEVICE_MODEL,
    Workload,
    compute_speed,
    epochs_at_batch,
    gpu_key,
    workload_from_profile,
)


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
    basis: EpochsBasis | None = None  # what the epochs mean (None: not worked out)
    compute_basis: str = DEVICE_MODEL  # how the chosen plan's compute left the profiled device


@dataclass(frozen=True)
class EpochsBasis:
    """What ``epochs`` means in a plan. ``at_batch``: the global batch the epochs are passes at
    (the pinned one, with --epochs and --global-batch), or the base batch B0 whose epochs other
    batches scale by statistical efficiency (``scaled``). ``efficiency_epochs``: the epochs at a
    pinned batch that statistical efficiency would suggest for the progress of the epochs at B0
    (None: no pinned batch, or no gradient noise scale to say)."""

    meaning: str  # "passes_at_batch" | "scaled_from_base_batch" | "passes_at_every_batch"
    at_batch: int
    text: str  # one line for the output
    efficiency_epochs: float | None = None


def epochs_basis(
    workload: Workload, epochs: float, pinned: int | None, user_epochs: bool
) -> EpochsBasis:
    """What ``epochs`` will mean for the search: E passes at a pinned --global-batch when the
    user gave both; else E epochs at B0, scaled to other batches by statistical efficiency (the
    GNS model's samples for the same progress); without a gradient noise scale, passes at B0."""
    import math

    from kplan.planner.efficiency import sample_factor

    b0 = workload.base_batch
    suggest = None
    if pinned is not None and workload.gns:
        factor = float(sample_factor(workload.gns, b0, [pinned])[0])
        suggest = epochs * factor if math.isfinite(factor) else None
    if pinned is not None and user_epochs:
        text = f"{epochs:g} passes over the data at the pinned global batch {pinned:,}"
        if suggest is not None:
            text += (
                f"; statistical efficiency (the gradient noise scale) would suggest "
                f"{suggest:.3g} epochs at {pinned:,} for the progress of {epochs:g} epochs at "
                f"the base batch {b0:,} (--epochs {suggest:.3g} plans that)"
            )
        return EpochsBasis("passes_at_batch", pinned, text, suggest)
    if not workload.gns:
        at = pinned if pinned is not None else b0
        text = f"{epochs:g} passes over the data at batch {at:,} (no gradient noise scale)"
        return EpochsBasis("passes_at_every_batch", at, text, None)
    text = (
        f"{epochs:g} epochs at the base batch {b0:,}; another global batch trains the samples "
        "statistical efficiency says reach the same progress"
    )
    if pinned is not None:
        text += (
            f" ({suggest:.3g} epochs at the pinned {pinned:,}; give --epochs to plan that many "
            "passes at it instead)"
            if suggest is not None
            else ""
        )
    return EpochsBasis("scaled_from_base_batch", b0, text, suggest)


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
    options = check_question(profile, catalog, options, dataset_size)
    if profile.cloud and profile.instance_type:
        inst = catalog.instances.get((profile.cloud, profile.instance_type))
        if inst is not None:
            ref_links = (inst.interconnect_gbps, inst.network_gbps)
            ref_fabric = nic_fabric(inst)
    op_model = None
    if profile.gpu.lower() == "cpu" and profile.opgraph is not None:
        from kplan.catalogs.op_model import load_op_model

        op_model = load_op_model()
    workload = workload_from_profile(
        profile,
        catalog.gpus,
        params=params,
        epochs=epochs,
        dataset_size=dataset_size,
        ref_link_gbps=ref_links,
        other=other,
        ref_fabric=ref_fabric,
        op_model=op_model,
    )
    n_epochs = epochs if epochs is not None else profile.epochs
    n_samples = dataset_size if dataset_size is not None else profile.dataset_size
    basis = epochs_basis(workload, n_epochs, options.global_batch, epochs is not None)
    if basis.meaning == "passes_at_batch" and workload.gns:
        workload = epochs_at_batch(workload, basis.at_batch, float(n_samples) * n_epochs)
    plan = search(workload, catalog, dm, options)
    notes = [f"epochs: {basis.text}"] if basis.meaning == "passes_at_batch" else []
    if (stale := staleness_note(catalog.version)) is not None:
        notes.append(stale)
    if notes:
        plan = replace(plan, notes=(*plan.notes, *notes))
    compute = chosen_compute_basis(plan, workload, catalog, dm)
    return Estimate(plan, workload, catalog, profile, n_epochs, n_samples, basis, compute)


def check_question(
    profile: Profile, catalog: Catalog, options: SearchOptions, dataset_size: int | None
) -> SearchOptions:
    """The question against the profile: one line and a hint for an epoch (``--dataset-size``)
    smaller than the profile's batch or a pinned ``--global-batch``, and for a profile whose
    instance type has another GPU than it names; the searched batches capped at an epoch."""
    n = dataset_size if dataset_size is not None else profile.dataset_size
    where = "--dataset-size" if dataset_size is not None else "the profile's work.dataset_size"
    if dataset_size is not None and n < profile.base_global_batch:
        raise InputError(
            f"--dataset-size {n:,} is less than the profile's global batch "
            f"{profile.base_global_batch:,}: one step would take more samples than an epoch has",
            hint="give the samples per epoch of the training data",
        )
    if options.global_batch is not None and options.global_batch > n:
        raise InputError(
            f"--global-batch {options.global_batch:,} is more than the {n:,} samples of an "
            f"epoch ({where})",
            hint=f"pin a batch of at most {n:,} samples",
        )
    inst = catalog.instances.get((profile.cloud or "", profile.instance_type or ""))
    named = gpu_key(profile.gpu, catalog.gpus) or profile.gpu
    if inst is not None and profile.gpu.lower() != "cpu" and inst.gpu != named:
        raise InputError(
            f"profile {profile.name!r} names GPU {profile.gpu!r} but its instance type "
            f"{inst.name} has {inst.gpu}",
            hint="fix the profile's device.gpu or device.instance_type",
        )
    top = options.max_global_batch or options.max_batch_multiple * profile.base_global_batch
    if options.global_batch is None and top > n:
        options = replace(options, max_global_batch=n)  # no step larger than an epoch
    return options


def chosen_compute_basis(plan: Plan, workload: Workload, catalog: Catalog, dm: DeviceModel) -> str:
    """How the chosen plan's compute was moved from the profiled device to its GPU(s): the
    device model, or (a CPU profile with an operator graph) the op model; one basis per GPU of
    a two-type mix where they differ."""
    bases: list[str] = []
    for itype in plan.chosen.instance_type.split("+"):
        inst = catalog.instances.get((plan.chosen.cloud, itype))
        if inst is None or inst.gpu not in catalog.gpus:
            continue
        got = compute_speed(workload, catalog.gpus[inst.gpu], dm, plan.precision).basis
        if got not in bases:
            bases.append(got)
    return "; ".join(bases) or DEVICE_MODEL


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
    epochs_basis: EpochsBasis | None  # what the epochs mean (passes at a pinned batch, or scaled)
    base_batch: int  # the profile's B0 (a pinned batch's passes do not move it)
    measured_on: str
    measured_nodes: int
    measured_gpus: int
    profile_precision: str
    precision: str
    precision_basis: str
    compute_basis: str  # Estimate.compute_basis: "device model", or "op-graph: ..."
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
        epochs_basis=est.basis,
        base_batch=p.base_global_batch,
        measured_on=measured_on(p),
        measured_nodes=nodes,
        measured_gpus=gpus,
        profile_precision=w.precision,
        precision=est.plan.precision,
        precision_basis=est.plan.precision_basis,
        compute_basis=est.compute_basis,
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
    if not cost_p90_usd > 0.01:
        return 0.01
    unit = 10.0 ** (math.floor(math.log10(cost_p90_usd)) - 1)
    return round(math.ceil(cost_p90_usd / unit - 1e-9) * unit, 10)


def launch_command(
    plan: Plan, script: str | None, plan_file: Path, budget: float | None, deadline: float | None
) -> str:
    """The `kplan launch` line that runs ``plan`` once it is saved in ``plan_file``."""
    import shlex

    p90 = plan.chosen.cost_p90_usd
    b = budget if budget is not None or not math.isfinite(p90) else launch_budget(p90)
    cap = "--budget BUDGET" if b is None else f"--budget {b:g}"  # BUDGET: the p90 has no bound
    parts = ["kplan", "launch", script or "train.py", "--plan", str(plan_file), cap]
    if deadline is not None:
        parts.append(f"--deadline {deadline:g}")
    return " ".join(shlex.quote(x) if i < 5 else x for i, x in enumerate(parts))
