"""Speed of `kplan estimate`: the search core (configurations per second) and the whole command.

    python -m bench.estimate_speed [--repeat 5]

Prints, for the built-in imagenet-resnet50 profile over the full shipped catalog (both clouds,
every region, 1 to 64 nodes, every batch and accumulation, two-type mixes): the median time of
the search core, the configurations it evaluates per second, and the median wall time of the
`kplan estimate --example imagenet-resnet50 --json` process (Python start-up included).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kplan.app import planning
from kplan.catalogs import load_catalog
from kplan.planner.search import SearchOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    profile = planning.load_example("imagenet-resnet50")
    catalog = load_catalog()
    core, configs = [], 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = planning.estimate(profile, SearchOptions(), catalog=catalog)
        core.append(time.perf_counter() - t0)
        configs = result.plan.considered
    kplan = Path(sys.executable).with_name("kplan")
    wall = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        subprocess.run(
            [str(kplan), "estimate", "--example", "imagenet-resnet50", "--json"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wall.append(time.perf_counter() - t0)
    med = statistics.median(core)
    print(
        f"search core: {configs:,} configurations in {med * 1e3:.0f} ms (median of "
        f"{args.repeat}) = {configs / med:,.0f} configurations/s"
    )
    median_wall = statistics.median(wall)
    print(
        f"kplan estimate --example imagenet-resnet50 --json: median wall {median_wall:.2f} s"
        f" (min {min(wall):.2f}, max {max(wall):.2f}) over {args.repeat} runs"
    )


if __name__ == "__main__":
    main()
