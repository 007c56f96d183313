"""PID batch sizing with a slow worker: 2 CPU workers, rank 1 twice as slow per sample.

The slowdown is deterministic (a sleep proportional to the local batch: ``--sleep-per-sample``
seconds per sample on rank 0 and twice that on rank 1), so the ideal split is 2:1 and the ideal
speed-up over an equal split is 1.5x (minus the fixed per-step cost). Two runs of the same
worker, side by side: PID off (equal split) and PID on. Reported: samples/s of each (median
over steps >= 20 for PID), its fraction of the ideal 1.5x, the first step from which the PID
split stays within 90% of the ideal split's throughput (by the known 1:2 per-sample costs), and
how much the per-worker batches move over steps >= 20.

    .venv/bin/python bench/runtime_hetero.py [--steps 40] [--sleep 0.001] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runtime_common import clean_env, torchrun
from kplan.runtime import env
from kplan.runtime.metrics import read_records


def run(pid: bool, steps: int, batch: int, sleep: float, workdir: Path) -> list[dict[str, float]]:
    """Per step: both ranks' local batches and the step time (the slower rank's)."""
    metrics = workdir / ("pid" if pid else "equal")
    args = ["--samples", str(batch * steps), "--batch", str(batch), "--slow-rank", "1"]
    args += ["--sleep-per-sample", str(sleep), "--model", "mlp"]
    extra = {env.METRICS_PATH: str(metrics), env.PID: "1" if pid else "0"}
    proc = torchrun(args, clean_env(**extra), timeout=300)
    if proc.returncode:
        raise SystemExit(proc.stdout[-3000:])
    records = [r for r in read_records(metrics) if "event" not in r]
    out = []
    for step in range(steps):
        mine = {r["rank"]: r for r in records if r["step"] == step}
        out.append(
            {
                "b0": mine[0]["local_batch"],
                "b1": mine[1]["local_batch"],
                "step_time": max(mine[0]["step_time"], mine[1]["step_time"]),
            }
        )
    return out


def split_efficiency(b0: float, b1: float) -> float:
    """Ideal step time over this split's, with per-sample costs 1 (rank 0) and 2 (rank 1)."""
    return (2.0 * (b0 + b1) / 3.0) / max(b0, 2.0 * b1)


def summarise(equal: list[dict[str, float]], pid: list[dict[str, float]], batch: int) -> dict:
    skip = 3  # start-up steps
    equal_rate = batch / statistics.median(s["step_time"] for s in equal[skip:])
    eff = [split_efficiency(s["b0"], s["b1"]) for s in pid]
    reached = next((i for i in range(len(eff)) if min(eff[i:]) >= 0.9), None)
    late = pid[20:]
    late_rate = batch / statistics.median(s["step_time"] for s in late)
    spread = max(
        (max(s[k] for s in late) - min(s[k] for s in late)) / max(s[k] for s in late)
        for k in ("b0", "b1")
    )
    return {
        "equal_samples_per_s": equal_rate,
        "pid_samples_per_s_steps_20+": late_rate,
        "speedup": late_rate / equal_rate,
        "fraction_of_ideal_1.5x": late_rate / (1.5 * equal_rate),
        "first_step_split_within_90pct_of_ideal": reached,
        "batch_spread_steps_20+": spread,
        "final_split": [pid[-1]["b0"], pid[-1]["b1"]],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--sleep", type=float, default=0.001)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):  # interleaved: equal, pid, equal, pid
            work = Path(tmp) / str(rep)
            equal = run(False, args.steps, args.batch, args.sleep, work)
            pid = run(True, args.steps, args.batch, args.sleep, work)
            summary = summarise(equal, pid, args.batch)
            results.append(summary)
            print(f"repeat {rep}: " + json.dumps(summary))
            print("  PID split per step (rank0/rank1): " + " ".join(
                f"{int(s['b0'])}/{int(s['b1'])}" for s in pid[:24]
            ))  # fmt: skip
    print(json.dumps({"repeats": results}, indent=1))


if __name__ == "__main__":
    main()
