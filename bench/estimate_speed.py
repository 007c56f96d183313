"""Speed of `kplan estimate` against SkyPilot's optimizer, each timed as a whole process.

    python -m bench.estimate_speed --sky-python /work/venv-sky/bin/python [--repeat 5]
    python -m bench.estimate_speed --before TREE      # kplan alone: this tree against TREE

In one run, alternating the tools so that both see the same machine load:

- kplan, wide: ``kplan estimate --example imagenet-resnet50 --json`` (every cloud, region, instance
  type, market, 1 to 64 nodes, every global batch and accumulation, two-type mixes, compression
  options, the spot Monte-Carlo and the GNS forecast).
- SkyPilot, wide: one task of 4 nodes whose resources are any of the (GPU, count) pairs of the
  SkyPilot catalog rows, on demand or spot, both clouds (``bench/sky_optimize.py wide``),
  minimising cost. SkyPilot models no throughput, batch, time or preemption, and searches one node
  count: this is the closest question it answers, and a far smaller one.
- kplan, fixed: ``--instance-type p4d.24xlarge --nodes 4 --on-demand``; SkyPilot, fixed: the same
  instance type, 4 nodes, on demand (``bench/sky_optimize.py fixed``).
- kplan, refused: ``--deadline 0.1``, a deadline no configuration meets (exit code 2, one line
  and a hint); SkyPilot has no counterpart.

``--before TREE`` times the kplan commands of another checkout too (``PYTHONPATH=TREE``), in the
same alternation: a change's before and after under one load.

Each command runs once untimed first, with Python's bytecode cache on (in a temporary
``PYTHONPYCACHEPREFIX``; ``PYTHONDONTWRITEBYTECODE`` is dropped from the children's environment):
an installed kplan, like the SkyPilot wheel, runs from compiled bytecode, and a run that compiles
every kplan module from source first would time the compiler (0.1-0.15 s CPU a run here). The
kplan runs share a temporary ``KPLAN_HOME``: the warm-up leaves the validated catalog in its
cache (``kplan/catalogs/catalog_cache.py``), as any kplan's first estimate does.

SkyPilot runs offline: its catalog is placed from /work/shared/data/catalogs/skypilot-v9 (the AWS
and GCP GPU rows of the US regions; SkyPilot 0.14.1 reads schema v8 paths,
``~/.sky/catalogs/v8/<cloud>/vms.csv``) under a temporary HOME, sockets are refused in its
process, and its credential check is replaced by "AWS and GCP are enabled". Prints each
command's median wall time and CPU time (user + system, which a loaded machine inflates less)
and the ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKY_ROWS = Path("/work/shared/data/catalogs/skypilot-v9")
SKY_SCHEMA = "v8"  # SkyPilot 0.14.1's constants.CATALOG_SCHEMA_VERSION
KPLAN_WIDE = ["estimate", "--example", "imagenet-resnet50", "--json"]
KPLAN_FIXED = [*KPLAN_WIDE, "--instance-type", "p4d.24xlarge", "--nodes", "4", "--on-demand"]
KPLAN_REFUSED = [*KPLAN_WIDE, "--deadline", "0.1"]


def place_sky_catalog(home: Path, rows: Path) -> None:
    """SkyPilot's catalog files under ``home`` (each file it reads, so it never fetches one)."""
    root = home / ".sky" / "catalogs" / SKY_SCHEMA
    for cloud in ("aws", "gcp", "common"):
        (root / cloud).mkdir(parents=True, exist_ok=True)
    shutil.copy(rows / "aws" / "vms_gpu_us_subset.csv", root / "aws" / "vms.csv")
    shutil.copy(rows / "gcp" / "vms_gpu_us_subset.csv", root / "gcp" / "vms.csv")
    for name in ("images.csv", "accelerator_quota_mapping.csv"):
        shutil.copy(rows / "gcp" / name, root / "gcp" / name)
    shutil.copy(rows / "common" / "accelerators.csv", root / "common" / "accelerators.csv")
    (root / "aws" / "images.csv").write_text("Tag,Region,OS,OSVersion,ImageId,CreationDate\n")
    (root / "aws" / "instance_quota_mapping.csv").write_text("InstanceType,QuotaCode\n")


def timed(cmd: list[str], env: dict[str, str], rc: int = 0) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, its last output line); fails loudly unless the command exits
    with ``rc``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    out = done.stdout if rc == 0 else done.stderr
    lines = [x for x in out.splitlines() if x.strip() and "sky-payload" not in x]
    return wall, cpu, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--sky-python", help="SkyPilot 0.14.1's interpreter (without it: kplan's runs alone)"
    )
    parser.add_argument("--sky-rows", type=Path, default=SKY_ROWS)
    parser.add_argument("--before", type=Path, help="another checkout whose kplan is timed too")
    args = parser.parse_args()
    kplan = str(Path(sys.executable).with_name("kplan"))
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="kplan-sky-") as home,
        tempfile.TemporaryDirectory(prefix="kplan-pyc-") as pyc,
        tempfile.TemporaryDirectory(prefix="kplan-home-") as kplan_home,
    ):
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base["PYTHONPYCACHEPREFIX"] = pyc  # compiled once (the warm-up), read after
        base["KPLAN_HOME"] = kplan_home  # the warm-up's cached catalog, never the user's
        env = {**base, "PYTHONPATH": str(ROOT)}
        place_sky_catalog(Path(home), args.sky_rows)
        sky_env = {**base, "SKY_HOME": home}
        sky = [args.sky_python or "", str(ROOT / "bench" / "sky_optimize.py")]
        cases = {
            "kplan wide": ([kplan, *KPLAN_WIDE], env, 0),
            "sky wide": ([*sky, "wide"], sky_env, 0),
            "kplan fixed": ([kplan, *KPLAN_FIXED], env, 0),
            "sky fixed": ([*sky, "fixed"], sky_env, 0),
            "kplan refused": ([kplan, *KPLAN_REFUSED], env, 2),
        }
        if args.sky_python is None:
            del cases["sky wide"], cases["sky fixed"]
        if args.before is not None:
            old = {**base, "PYTHONPATH": str(args.before.resolve())}
            for name, cmd in (("wide", KPLAN_WIDE), ("fixed", KPLAN_FIXED)):
                cases[f"before {name}"] = ([kplan, *cmd], old, 0)
            cases["before refused"] = ([kplan, *KPLAN_REFUSED], old, 2)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        said: dict[str, str] = {}
        for cmd, cmd_env, rc in cases.values():  # untimed: bytecode compiled and cached
            timed(cmd, cmd_env, rc)
        for _ in range(args.repeat):
            for name, (cmd, cmd_env, rc) in cases.items():
                wall, cpu, last = timed(cmd, cmd_env, rc)
                runs[name].append((wall, cpu))
                said[name] = last
    med = {
        name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
        for name, r in runs.items()
    }
    load = os.getloadavg()[0]
    print(
        f"median of {args.repeat} runs each, alternating; load average {load_before:.1f} at the "
        f"start, {load:.1f} at the end"
    )
    for name, (wall, cpu) in med.items():
        print(f"  {name:14s} wall {wall:6.2f} s   CPU {cpu:6.2f} s")
    print(f"  kplan refused says: {said['kplan refused']}")
    if args.sky_python is None:
        return
    print(f"  sky says: {said['sky wide']}")
    print(f"  sky says: {said['sky fixed']}")
    for kind in ("wide", "fixed"):
        (kw, kc), (sw, sc) = med[f"kplan {kind}"], med[f"sky {kind}"]
        print(f"{kind}: kplan is {sw / kw:.1f}x faster (wall), {sc / kc:.1f}x (CPU) than SkyPilot")


if __name__ == "__main__":
    main()
