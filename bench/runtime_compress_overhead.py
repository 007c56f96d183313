"""Step time, bytes and loss of each gradient-compression option on 2 local gloo workers.

On loopback the network is fast, so this measures what compression *costs* (the codec's
compute and the extra collectives), not what it saves on a slow link (the emulated-host bed
does that). Prints one row per option with ratios to dense.

    .venv/bin/python bench/runtime_compress_overhead.py [--hidden 1024] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OPTIONS = ["none", "fp16", "bf16", "powersgd:4", "topk:0.01:ag", "topk:0.01:ar", "adaptive"]


def worker(out: Path, hidden: int, steps: int, options: list[str]) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import kplan.runtime as kr
    from bench.runtime_worker import make_data

    kr.init()
    data = make_data(64 * (steps + 2), 64, 0, 0.5)
    for name in options:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, 1),
        )  # fmt: skip
        metrics = out / f"{name.replace(':', '_')}.jsonl"
        cfg = kr.RuntimeConfig(
            compression=name, pid=None, lr_scaling="none", max_steps=steps, metrics_path=metrics
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        job = kr.Job(model, opt, data, batch_size=64, config=cfg)
        for _ in job.epochs(1):
            for x, y in job.batches():
                with job.step():
                    job.backward(F.mse_loss(job.model(x), y))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--worker", type=Path, default=None)
    p.add_argument("--options", default=",".join(OPTIONS))
    args = p.parse_args()
    options = args.options.split(",")
    if args.worker is not None:
        worker(args.worker, args.hidden, args.steps, options)
        return
    from bench.runtime_common import clean_env, torchrun
    from kplan.runtime.metrics import read_records

    with tempfile.TemporaryDirectory() as tmp:
        wargs = ["--worker", tmp, "--hidden", str(args.hidden), "--steps", str(args.steps)]
        wargs += ["--options", args.options]
        proc = torchrun(wargs, clean_env(), script=Path(__file__), timeout=600)
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:])
        rows = {}
        for name in options:
            recs = read_records(Path(tmp) / f"{name.replace(':', '_')}.jsonl")
            steps = [r for r in recs if "event" not in r and r["rank"] == 0][5:]  # warm-up
            times = [r["step_time"] for r in steps]
            rows[name] = {
                "step_s": statistics.median(times),
                "iqr_s": statistics.quantiles(times, n=4)[2] - statistics.quantiles(times, n=4)[0],
                "bytes": statistics.mean(r["bytes_sent"] for r in steps),
                "loss": statistics.mean(r["loss"] for r in steps[-5:]),
            }
    base = rows["none"]
    params = (64 + 1) * args.hidden + (args.hidden + 1) * args.hidden + args.hidden + 1
    print(f"2 gloo workers on loopback, MLP 64-{args.hidden}-{args.hidden}-1 ({params:,} params)")
    print(f"median step time over steps 5-{args.steps - 1} of rank 0 (IQR); bytes counted")
    print(f"{'option':14s} {'step s':>8s} {'IQR s':>7s} {'x dense':>8s} {'bytes/step':>11s}"
          f" {'dense/bytes':>11s} {'loss':>8s}")  # fmt: skip
    for name, r in rows.items():
        print(
            f"{name:14s} {r['step_s']:8.4f} {r['iqr_s']:7.4f} {r['step_s'] / base['step_s']:8.2f}"
            f" {r['bytes']:11.0f} {base['bytes'] / r['bytes']:11.2f} {r['loss']:8.3f}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
