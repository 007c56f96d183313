"""``kplan estimate`` as a library call: load the inputs, build the workload, search."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from kplan.catalogs.current import load_current, staleness_note
from kplan.catalogs.device_model import load_device_model
from kplan.errors import InputError
from kplan.io import read_json
from kplan.planner.catalog import Catalog
from kplan.planner.plan import Plan
from kplan.planner.profile import Profile, profile_from_dict
from kplan.planner.search import SearchOptions, search
from kplan.planner.workload import Workload, workload_from_profile


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
    from kplan import flags

    flags.number("--epochs", epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 90")
    flags.integer("--dataset-size", dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch")
    if catalog is None:
        from kplan.catalogs.current import current_catalog_dir
        from kplan.io import check_folder_files

        check_folder_files(current_catalog_dir(), "catalog")  # a FIFO there would hang
        catalog = load_current()
    dm = load_device_model()
    params = None
    if profile.fit is not None:
        from kplan.modelio import model_from_dict

        params = model_from_dict(profile.fit, f"profile {profile.name} (fit)")
    ref_links: tuple[float | None, float | None] = (None, None)
    if profile.cloud and profile.instance_type:
        inst = catalog.instances.get((profile.cloud, profile.instance_type))
        if inst is not None:
            ref_links = (inst.interconnect_gbps, inst.network_gbps)
    workload = workload_from_profile(
        profile,
        catalog.gpus,
        params=params,
        epochs=epochs,
        dataset_size=dataset_size,
        ref_link_gbps=ref_links,
        other=other,
    )
    plan = search(workload, catalog, dm, options)
    if (stale := staleness_note(catalog.version)) is not None:
        plan = replace(plan, notes=(*plan.notes, stale))
    return Estimate(plan, workload, catalog, profile)
