"""The README's local launch: its printed prediction against what it measured.

Runs the README's two commands (README.md, "Measuring and training on this machine") in a new
temporary ``KPLAN_HOME`` each time, from that folder, as a new user would:

    kplan profile kplan/examples/mlp_regression.py --dataset-size 20000 --base-batch 256 \\
        --out p.json --measurements m.csv
    kplan launch kplan/examples/mlp_regression.py --nodes 2 --profile p.json -- --epochs 1

``OMP_NUM_THREADS`` is removed from the environment (the README sets none; ``--threads N`` sets
it instead). The predicted median and p90 time are the job's own (``kplan report last --json``:
``predicted_hours``, ``predicted_hours_p90``, what the launch printed before it ran); the measured
time is the report's wall clock (job created to its end), with the measured start, step time
(rank 0's median) and steps. The load average is read before each profile and after each launch:
on a shared machine the profile and the launch may see different loads, and the prediction
carries the profile's.

    python -m bench.local_launch_prediction [--repeat 3] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = Path(sys.executable).with_name("kplan")
PROFILE = ["profile", str(SCRIPT), "--dataset-size", "20000", "--base-batch", "256"]
PROFILE += ["--out", "p.json", "--measurements", "m.csv"]
LAUNCH = ["launch", str(SCRIPT), "--nodes", "2", "--profile", "p.json", "--", "--epochs", "1"]
_PRINTED = re.compile(r"^predicted on this machine: .*$", re.MULTILINE)


def _kplan(argv: list[str], home: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [str(KPLAN), *argv], cwd=home, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"kplan {argv[0]} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def one_run(threads: int | None) -> dict[str, Any]:
    """Profile and launch in a fresh KPLAN_HOME; the job's predicted and measured figures."""
    home = Path(tempfile.mkdtemp(prefix="kplan-bench-local-"))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["KPLAN_HOME"] = str(home)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    try:
        load_before = os.getloadavg()[0]
        _kplan(PROFILE, home, env)
        profile = json.loads((home / "p.json").read_text())
        printed = _PRINTED.search(_kplan(LAUNCH, home, env))
        load_after = os.getloadavg()[0]
        rep = json.loads(_kplan(["report", "last", "--json"], home, env))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    measured = rep["actual_hours"] * 3600
    p90 = rep["predicted_hours_p90"] * 3600
    metrics = rep["metrics"]
    return {
        "load1_before": round(load_before, 2),
        "load1_after": round(load_after, 2),
        "printed": printed.group(0) if printed else None,
        "predicted_s": rep["predicted_hours"] * 3600,
        "predicted_p90_s": p90,
        "measured_s": measured,
        "within_p90": measured <= p90,
        "predicted_step_ms": rep["predicted_step_s"] * 1e3,
        "predicted_step_p90_ms": rep["predicted_step_p90_s"] * 1e3,
        "measured_step_ms": metrics["step_time"]["median_s"] * 1e3,
        "predicted_steps": rep["predicted_steps"],
        "measured_steps": metrics["steps"],
        "predicted_start_s": rep["predicted_start_s"],
        "measured_start_s": rep["actual_start_s"],
        "profile_startup_s": profile["device"].get("startup_s"),
        "profile_shutdown_s": profile["device"].get("shutdown_s"),
        "profile_threads": profile["device"].get("cpu_threads"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="profile + launch pairs, in turn")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS (default: unset)")
    ap.add_argument("--json", action="store_true", help="one JSON object per run")
    args = ap.parse_args(argv)
    runs = []
    print(f"cores {os.cpu_count()}; OMP_NUM_THREADS {args.threads or 'unset'}")
    for i in range(args.repeat):
        r = one_run(args.threads)
        runs.append(r)
        if args.json:
            print(json.dumps(r))
            continue
        print(
            f"run {i + 1}: load {r['load1_before']:.2f}->{r['load1_after']:.2f}  "
            f"predicted {r['predicted_s']:.1f} s (p90 {r['predicted_p90_s']:.1f} s)  "
            f"measured {r['measured_s']:.1f} s  "
            f"{'within' if r['within_p90'] else 'OUTSIDE'} p90  | "
            f"step {r['predicted_step_ms']:.1f} ms (p90 {r['predicted_step_p90_ms']:.1f}) vs "
            f"{r['measured_step_ms']:.1f} ms; start {r['predicted_start_s']:.1f} vs "
            f"{r['measured_start_s']:.1f} s; steps {r['predicted_steps']} vs "
            f"{r['measured_steps']}"
        )
    inside = sum(r["within_p90"] for r in runs)
    print(f"measured <= p90 in {inside} of {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
