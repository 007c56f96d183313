"""SkyPilot's optimizer on a kplan-like request, offline (run by bench/estimate_speed.py with
SkyPilot's own interpreter: ``--sky-python``; not part of kplan, and not imported by it).

    SKY_HOME=/tmp/kplan-sky python bench/sky_optimize.py wide|fixed|nodes

Before SkyPilot is imported, every socket connection is refused (so a catalog fetch, a usage
report or a credential probe fails at once instead of reaching the network) and HOME points at
``SKY_HOME``, where bench/estimate_speed.py placed the catalog rows (``~/.sky/catalogs/v8``). The
credential check is replaced by "AWS and GCP are enabled" (no account here). Prints one line:
the requests, the chosen resources, the import and the optimizer's seconds.
"""

from __future__ import annotations

import os
import socket
import sys
import time


def _no_network(*_args: object, **_kwargs: object) -> None:
    raise OSError("bench/sky_optimize.py: network disabled")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "wide"
    socket.socket.connect = _no_network  # type: ignore[method-assign]
    socket.create_connection = _no_network  # type: ignore[assignment]
    os.environ["HOME"] = os.environ["SKY_HOME"]
    os.environ["SKYPILOT_DISABLE_USAGE_COLLECTION"] = "1"
    t0 = time.perf_counter()
    import sky
    from sky import check, optimizer
    from sky.utils import common, registry

    clouds = [registry.CLOUD_REGISTRY.from_str("aws"), registry.CLOUD_REGISTRY.from_str("gcp")]
    check.get_cached_enabled_clouds_or_refresh = lambda *a, **k: clouds  # type: ignore[assignment]
    optimizer.sky_check.get_cached_enabled_clouds_or_refresh = (  # type: ignore[attr-defined]
        check.get_cached_enabled_clouds_or_refresh
    )
    accels = sorted(set(_catalog_accelerators()))
    if mode == "fixed":
        requests = [sky.Resources(infra="aws", instance_type="p4d.24xlarge", use_spot=False)]
        node_counts = [4]
    else:
        requests = [
            sky.Resources(accelerators={name: count}, use_spot=spot)
            for name, count in accels
            for spot in (False, True)
        ]
        node_counts = list(range(1, 65)) if mode == "nodes" else [4]
    t1 = time.perf_counter()
    chosen = None
    for n in node_counts:
        with sky.Dag() as dag:
            task = sky.Task(run="python train.py", num_nodes=n)
            task.set_resources(set(requests))
        dag = optimizer.Optimizer.optimize(dag, minimize=common.OptimizeTarget.COST, quiet=True)
        best = dag.tasks[0].best_resources
        chosen = f"{n} x {best}"
    t2 = time.perf_counter()
    print(
        f"sky {mode}: {len(requests)} resource requests x {len(node_counts)} node counts; "
        f"chosen {chosen}; import {t1 - t0:.2f} s, optimize {t2 - t1:.2f} s"
    )


def _catalog_accelerators() -> list[tuple[str, int]]:
    """(accelerator, count) of every GPU row of both placed catalogs."""
    import csv

    out = []
    root = os.path.join(os.environ["SKY_HOME"], ".sky", "catalogs", "v8")
    for cloud in ("aws", "gcp"):
        with open(os.path.join(root, cloud, "vms.csv"), encoding="utf-8") as f:
            for row in csv.DictReader(f):
                name, count = row.get("AcceleratorName"), row.get("AcceleratorCount")
                if name and count:
                    out.append((name, int(float(count))))
    return out


if __name__ == "__main__":
    main()
