"""Where the runtime's per-step cost goes: CPU time per phase, plain DDP against kr.Job.

One torchrun job (2 gloo workers) alternates blocks of steps of plain DDP and of ``kr.Job`` on
the same MLP, and accumulates rank 0's CPU time (``time.process_time``) in four phases: data
(fetching the batch), forward, backward (with the all-reduce) and step (optimizer step; for
the Job, the whole end-of-step pipeline). PID off, so both do the same work per rank.

    .venv/bin/python bench/runtime_phases.py [--hidden 512] [--gns sgd|off]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = ("data", "forward", "backward", "step")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    import kplan.runtime as kr
    from bench.runtime_worker import make_data, make_model

    ctx = kr.init()
    data = make_data(args.batch * (args.rounds * args.block * 2 + 100), 64, 0, 1.0)
    cpu = time.process_time
    acc = {"plain": [0.0] * 4, "kplan": [0.0] * 4}

    def plain() -> Iterator[None]:
        torch.manual_seed(0)
        model = DDP(make_model("mlp", 64, args.hidden))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sampler = DistributedSampler(data, seed=0, drop_last=True)
        it = iter(DataLoader(data, batch_size=args.batch // ctx.world_size, sampler=sampler))
        while True:
            a = acc["plain"]
            t0 = cpu()
            x, y = next(it)
            t1 = cpu()
            loss = F.mse_loss(model(x), y)
            t2 = cpu()
            opt.zero_grad()
            loss.backward()
            t3 = cpu()
            opt.step()
            t4 = cpu()
            for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                a[i] += d
            yield

    def kplan() -> Iterator[None]:
        torch.manual_seed(0)
        model = make_model("mlp", 64, args.hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        cfg = kr.RuntimeConfig(gns=args.gns, pid=None, metrics_path=Path(args.workdir) / "m")
        job = kr.Job(model, opt, data, batch_size=args.batch, config=cfg)
        for _ in job.epochs(10**6):
            batches = job.batches()
            while True:
                a = acc["kplan"]
                t0 = cpu()
                try:
                    x, y = next(batches)
                except StopIteration:
                    break
                t1 = cpu()
                step = job.step()
                step.__enter__()
                loss = F.mse_loss(job.model(x), y)
                t2 = cpu()
                job.backward(loss)
                t3 = cpu()
                step.__exit__(None, None, None)
                t4 = cpu()
                for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    a[i] += d
                yield

    gens = {"plain": plain(), "kplan": kplan()}
    for gen in gens.values():  # warm up
        for _ in range(20):
            next(gen)
    acc = {k: [0.0] * 4 for k in acc}
    for _ in range(args.rounds):
        for gen in gens.values():
            dist.barrier()
            for _ in range(args.block):
                next(gen)
    if ctx.rank == 0:
        n = args.rounds * args.block
        out = {k: dict(zip(PHASES, (v / n * 1e3 for v in a), strict=True)) for k, a in acc.items()}
        Path(args.out).write_text(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--gns", choices=["sgd", "off"], default="sgd")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    from bench.runtime_common import clean_env, torchrun

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "phases.json"
        cmd = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("worker", "out", "workdir")]
        proc = torchrun(
            [*cmd, "--worker", f"--out={out}", f"--workdir={tmp}"],
            clean_env(),
            timeout=600,
            script=Path(__file__),
        )
        if proc.returncode:
            raise SystemExit(proc.stdout[-3000:])
        result = json.loads(out.read_text())
    for name, phases in result.items():
        cells = "  ".join(f"{k} {v:6.3f}" for k, v in phases.items())
        print(f"{name:6s} CPU ms/step (rank 0): {cells}  total {sum(phases.values()):6.2f}")


if __name__ == "__main__":
    main()
