"""Runtime overhead: steps/s of the same training with plain DDP and with kplan.runtime.

Two gloo CPU workers train the same MLP on the same data four ways, inside ONE torchrun job so
that the load of a shared machine hits all of them alike: blocks of ``--block`` steps
alternate between (a) plain DDP + DistributedSampler + DataLoader, (a') the same with
``gradient_as_bucket_view=True`` (the runtime's DDP default), (b) ``kr.Job`` with GNS on
(local norms in the comm hook, global norm, statistics appended to the last bucket; PID on;
metrics written to a file), (c) ``kr.Job`` with GNS off. Each variant has its own copy of the
model, optimizer and data stream. A round is one block of each (order rotated per round);
the ratio of a round is plain's block time over kplan's. Both wall-clock time and the process's
CPU time (``time.process_time``, all threads, summed over both workers; insensitive to other
jobs on a shared machine) are recorded. Reported: median steps/s per variant and the median
and quartiles of the per-round ratios, for each clock.

    .venv/bin/python bench/runtime_overhead.py [--rounds 30] [--block 20] [--hidden 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    import kplan.runtime as kr
    from bench.runtime_worker import make_data, make_model

    ctx = kr.init()
    steps = args.rounds * args.block + args.block
    data = make_data(args.batch * steps + args.batch, args.features, 0, 1.0)

    def plain(views: bool) -> Iterator[None]:
        torch.manual_seed(0)
        model = DDP(make_model("mlp", args.features, args.hidden), gradient_as_bucket_view=views)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(data, batch_size=args.batch // ctx.world_size, sampler=sampler)
        while True:
            for x, y in loader:
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
                yield

    def kplan(gns: str) -> Iterator[None]:
        torch.manual_seed(0)
        model = make_model("mlp", args.features, args.hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        metrics = Path(args.workdir) / f"m-{gns}"
        cfg = kr.RuntimeConfig(gns=gns, metrics_path=metrics)  # type: ignore[arg-type]
        job = kr.Job(model, opt, data, batch_size=args.batch, config=cfg)
        splits[gns] = job
        for _ in job.epochs(10**6):
            for x, y in job.batches():
                with job.step():
                    job.backward(F.mse_loss(job.model(x), y))
                yield

    splits: dict[str, kr.Job] = {}
    variants: dict[str, Iterator[None]] = {
        "plain": plain(False),
        "plain-views": plain(True),
        "kplan": kplan("sgd"),
        "kplan-no-gns": kplan("off"),
    }
    for it in variants.values():  # warm up: DDP set-up, first allocations
        for _ in range(args.block):
            next(it)
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu_times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            step: Callable[[], None] = variants[name].__next__
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.block):
                step()
            times[name].append(time.perf_counter() - start)
            used = torch.tensor([time.process_time() - cpu], dtype=torch.float64)
            dist.all_reduce(used)  # CPU seconds of both workers: a split moves work, not cost
            cpu_times[name].append(float(used))
    if ctx.rank == 0:
        sizes = {k: list(job._state.step_sizes) for k, job in splits.items()}
        Path(args.out).write_text(json.dumps({"wall": times, "cpu": cpu_times, "split": sizes}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    from bench.runtime_common import clean_env, torchrun

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        cmd = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("worker", "out", "workdir")]
        cmd += ["--worker", f"--out={out}", f"--workdir={tmp}"]
        proc = torchrun(cmd, clean_env(), timeout=900, script=Path(__file__))
        if proc.returncode:
            raise SystemExit(proc.stdout[-3000:])
        both = json.loads(out.read_text())
    summary: dict[str, object] = {}
    summary["final split (kplan, kplan-no-gns)"] = both.pop("split")
    for clock, times in both.items():
        rate = {k: args.block / statistics.median(v) for k, v in times.items()}
        summary[f"{clock}: median steps/s"] = rate
        for base in ("plain", "plain-views"):
            for name in ("kplan", "kplan-no-gns"):
                ratios = sorted(p / k for p, k in zip(times[base], times[name], strict=True))
                q1, med, q3 = statistics.quantiles(ratios, n=4)
                quartiles = {"median": med, "q1": q1, "q3": q3}
                summary[f"{clock}: ratio {name} / {base} (steps/s)"] = quartiles
    summary["config"] = {k: v for k, v in vars(args).items() if k not in ("out", "workdir")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
