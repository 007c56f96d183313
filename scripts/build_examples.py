"""Build the built-in example profiles (kplan/planner/examples/*.json) from the Pollux T4 traces.

Re-runnable: ``python scripts/build_examples.py [--data ../shared/data]``.

Each profile holds what a profiler could afford to measure (issue 2's protocol): the rows of
placements ``1``, ``2``, ``4``, ``44`` and ``4444`` at every batch size, measured on AWS
g4dn.12xlarge (4x T4, 50 Gbit/s), plus the model fitted to them, and the gradient noise scale
trajectory of the smallest-batch validation run (``B0 * grad_var / grad_sqr`` per epoch, rolling
median over 5 epochs, about 12 points). The work is one epoch (``progress`` of the first
validation row times B0) times the number of validation rows (epochs). Gradient bytes are the
models' published FP32 parameter counts times 4.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kplan.catalogs import load_catalog  # noqa: E402
from kplan.planner.fit import fit_perf_params  # noqa: E402
from kplan.planner.perfmodel import params_to_dict  # noqa: E402
from kplan.planner.profile import (  # noqa: E402
    GnsPoint,
    Measurement,
    Profile,
    profile_from_dict,
    profile_to_dict,
)
from scripts.traces import FIT_PLACEMENTS, data_root, load_placements  # noqa: E402

# name -> (trace folder, parameters, source of the parameter count)
EXAMPLES = {
    "cifar10-resnet18": ("cifar10", 11.17e6, "ResNet-18 (He et al. 2016), CIFAR-10 variant"),
    "imagenet-resnet50": ("imagenet", 25.56e6, "ResNet-50 (He et al. 2016), torchvision"),
    "bert-squad": ("bert", 110e6, "BERT-base (Devlin et al. 2019) fine-tuned on SQuAD"),
    "deepspeech2": ("deepspeech2", 38e6, "DeepSpeech2 (Amodei et al. 2016), AdaptDL config"),
    "yolov3": ("yolov3", 61.9e6, "YOLOv3 (Redmon & Farhadi 2018), Darknet-53 backbone"),
}
INSTANCE = ("aws", "g4dn.12xlarge")


def gns_trajectory(path: Path, b0: int) -> tuple[list[GnsPoint], int, int]:
    """(trajectory, samples per epoch, epochs) from one validation CSV."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    progress = [float(r["progress"]) for r in rows]
    raw: list[tuple[float, float]] = []
    for r, p in zip(rows, progress, strict=True):
        sqr, var = float(r["grad_sqr"]), float(r["grad_var"])
        if sqr > 0 and var > 0:
            raw.append((p / progress[-1], b0 * var / sqr))
    scales = [s for _, s in raw]
    smooth = [statistics.median(scales[max(0, i - 2) : i + 3]) for i in range(len(scales))]
    stride = max(1, len(raw) // 12)
    picked = list(range(0, len(raw), stride))
    if picked[-1] != len(raw) - 1:
        picked.append(len(raw) - 1)
    points = [GnsPoint(raw[i][0], smooth[i]) for i in picked]
    return points, round(progress[0] * b0), len(rows)


def build(name: str, data: Path) -> Profile:
    folder, params, source = EXAMPLES[name]
    trace = data / "traces" / "pollux" / "t4" / folder
    files = sorted(trace.glob("validation-*.csv"), key=lambda f: int(f.stem.split("-")[1]))
    b0 = int(files[0].stem.split("-")[1])
    gns, epoch_samples, epochs = gns_trajectory(files[0], b0)
    rows = load_placements(folder, data)
    measurements = tuple(
        Measurement(
            int(rows.nodes[i]),
            int(rows.workers[i]),
            int(rows.local_batch[i]),
            float(rows.step_time[i]),
            min(float(rows.sync_time[i]), float(rows.step_time[i])),
            1,
            INSTANCE[1],
            "T4",
        )
        for i in range(len(rows))
        if rows.placement[i] in FIT_PLACEMENTS
    )
    catalog = load_catalog()
    inst = catalog.instances[INSTANCE]
    gradient_bytes = 4.0 * params
    fitted = fit_perf_params(
        measurements,
        gradient_bytes=gradient_bytes,
        intra_gbps=inst.interconnect_gbps,
        inter_gbps=inst.network_gbps,
        gpu="T4",
        gpus_per_node=inst.gpu_count,
    )
    return Profile(
        name=name,
        provenance=(
            f"Pollux OSDI'21 artifact traces ({folder}) measured on {INSTANCE[1]} (4x T4); "
            f"placements {', '.join(FIT_PLACEMENTS)}; GNS from validation-{b0}.csv; "
            f"gradient size from {source}; built by scripts/build_examples.py"
        ),
        gpu="T4",
        gpus_per_node=inst.gpu_count,
        gradient_bytes=gradient_bytes,
        base_global_batch=b0,
        max_local_batch=int(rows.local_batch.max()),
        dataset_size=epoch_samples,
        epochs=float(epochs),
        measurements=measurements,
        gns=tuple(gns),
        cloud=INSTANCE[0],
        instance_type=INSTANCE[1],
        device_memory_gb=16.0,
        fit=params_to_dict(fitted),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=data_root())
    parser.add_argument("--out", type=Path, default=ROOT / "kplan" / "planner" / "examples")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in EXAMPLES:
        profile = build(name, args.data)
        doc = profile_to_dict(profile)
        profile_from_dict(doc, name)  # validate what we write
        (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        p = profile.fit or {}
        print(
            f"{name}: {len(profile.measurements)} rows, B0={profile.base_global_batch}, "
            f"{profile.dataset_size} samples x {profile.epochs:g} epochs, "
            f"fit log_sigma={p.get('log_sigma', 0):.3f}"
        )


if __name__ == "__main__":
    main()
