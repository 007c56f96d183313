"""A small, configurable training worker for the runtime's tests and benchmarks.

Run it as a plain script (one process) or under torchrun. It trains a linear or MLP regression
model on seeded synthetic data with ``kplan.runtime`` (or, with ``--plain-ddp``, with plain DDP
and no kplan, the baseline of the overhead benchmark), and can inject what the tests need: a
per-sample sleep on one rank (a slow worker), a kill of one rank at a step (a crash), and an
artificial out-of-memory error above a local batch (the profile sweep on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


def make_data(samples: int, features: int, seed: int, noise: float) -> TensorDataset:
    """y = x·w + noise, with x ~ N(0, 1): a regression whose gradient noise is well defined."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    y = x @ w + noise * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


def make_model(kind: str, features: int, hidden: int) -> nn.Module:
    if kind == "linear":
        return nn.Linear(features, 1)
    return nn.Sequential(
        nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
        nn.Linear(hidden, 1),
    )  # fmt: skip


def exact_noise_scale(
    model: nn.Module,
    data: TensorDataset,
    denom: list[torch.Tensor] | None = None,
    chunk: int = 1024,
) -> dict[str, float]:
    """Exact |G|², tr(Σ) and B_noise = tr(Σ)/|G|² of the MSE loss over the whole dataset.

    Per-sample gradients come from ``torch.func.vmap(grad(...))``; Σ is their population
    covariance. With ``denom`` (Adam's sqrt(v̂)+eps per parameter) the norms are taken in the
    preconditioned metric Σ g²/denom, as the runtime's Adam variant does.
    """
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (x.unsqueeze(0),))
        return F.mse_loss(out, y.unsqueeze(0))

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
    x_all, y_all = data.tensors
    rows = []
    for start in range(0, len(x_all), chunk):
        g = per_sample(params, x_all[start : start + chunk], y_all[start : start + chunk])
        rows.append(torch.cat([g[k].reshape(g[k].shape[0], -1) for k in params], dim=1))
    flat = torch.cat(rows).double()
    weight = torch.ones(flat.shape[1], dtype=torch.float64)
    if denom is not None:
        weight = 1.0 / torch.cat([d.reshape(-1) for d in denom]).double()
    mean = flat.mean(dim=0)
    grad_sqr = float((mean * mean * weight).sum())
    grad_var = float((((flat - mean) ** 2) * weight).sum(dim=1).mean())
    return {"grad_sqr": grad_sqr, "grad_var": grad_var, "gns": grad_var / grad_sqr}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["linear", "mlp"], default="linear")
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--noise", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--opt", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--init-shift", type=float, default=0.0, help="add to initial weights")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--sleep-per-sample", type=float, default=0.0, help="seconds, every rank")
    p.add_argument("--slow-factor", type=float, default=2.0, help="sleep multiplier on slow rank")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--oom-above", type=int, default=0, help="fake OOM when local batch > this")
    p.add_argument("--oom-rank", type=int, default=-1, help="only this rank fakes OOM (-1: all)")
    p.add_argument("--dump", type=Path, default=None, help="rank 0 saves final params here")
    p.add_argument("--plain-ddp", action="store_true", help="baseline: DDP without kplan")
    p.add_argument("--steps", type=int, default=0, help="--plain-ddp: stop after N steps")
    p.add_argument("--timing-out", type=Path, default=None, help="write loop seconds (JSON)")
    p.add_argument("--max-local-rank0", type=int, default=0, help="memory cap of rank 0")
    p.add_argument("--sync", choices=["overlap", "manual"], default="overlap")
    p.add_argument("--gns-out", type=Path, default=None, help="rank 0 writes GNS + exact (JSON)")
    return p.parse_args()


def sleep_for(args: argparse.Namespace, rank: int, batch: int) -> None:
    if args.sleep_per_sample > 0:
        factor = args.slow_factor if rank == args.slow_rank else 1.0
        time.sleep(args.sleep_per_sample * factor * batch)


def run_plain(args: argparse.Namespace) -> None:
    """The same training with torch alone: DDP, DistributedSampler, DataLoader."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(make_model(args.model, args.features, args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = make_data(args.samples, args.features, 0, args.noise)
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch // world, sampler=sampler, drop_last=True)
    steps, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if steps == 1:
                start = time.perf_counter()  # exclude the first step (DDP set-up)
            opt.zero_grad()
            sleep_for(args, rank, len(x))
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if args.steps and steps >= args.steps:
                break
        if args.steps and steps >= args.steps:
            break
    elapsed = time.perf_counter() - start
    if rank == 0 and args.timing_out is not None:
        args.timing_out.write_text(json.dumps({"steps": steps - 1, "seconds": elapsed}))
    dist.destroy_process_group()


def run_kplan(args: argparse.Namespace) -> None:
    import kplan.runtime as kr

    ctx = kr.init()
    model = make_model(args.model, args.features, args.hidden).to(ctx.device)
    if args.init_shift:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(args.init_shift)
    opt: torch.optim.Optimizer
    if args.opt == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = make_data(args.samples, args.features, 0, args.noise)
    cap = args.max_local_rank0 if ctx.rank == 0 and args.max_local_rank0 else None
    config = kr.RuntimeConfig(max_local_batch=cap, sync=args.sync)
    job = kr.Job(model, opt, data, batch_size=args.batch, config=config)
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    start, timed_steps = time.perf_counter(), 0
    for _epoch in job.epochs(args.epochs):
        for x, y in job.batches():
            if job.step_count == 1 and job.is_last_micro_step:
                start, timed_steps = time.perf_counter(), 0  # exclude DDP set-up
            if first_attempt and ctx.rank == args.kill_rank and job.step_count == args.kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            with job.step():
                sleep_for(args, ctx.rank, len(x))
                fake_oom = args.oom_above and len(x) > args.oom_above
                if fake_oom and args.oom_rank in (-1, ctx.rank):
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
                loss = F.mse_loss(job.model(x), y)
                job.backward(loss)
            timed_steps += 1
    elapsed = time.perf_counter() - start
    if ctx.rank == 0 and args.timing_out is not None:
        args.timing_out.write_text(json.dumps({"steps": timed_steps, "seconds": elapsed}))
    if ctx.rank == 0 and args.gns_out is not None:
        denom = None
        if args.opt == "adam":
            from kplan.runtime.sync import Preconditioner

            pre = Preconditioner(opt)
            denom = [d for p in model.parameters() if (d := pre.denom(p)) is not None]
        exact = exact_noise_scale(job.module, data, denom)
        found = {
            "gns": job.gns,
            "grad_sqr": job._state.gns.grad_sqr,
            "grad_var": job._state.gns.grad_var,
        }
        args.gns_out.write_text(json.dumps({"estimate": found, "exact": exact}))
    if ctx.rank == 0 and args.dump is not None and not job.profiling:
        state = {k: v.detach().cpu() for k, v in job.module.state_dict().items()}
        torch.save(state, args.dump)


def main() -> None:
    args = parse()
    if args.plain_ddp:
        run_plain(args)
    else:
        run_kplan(args)


if __name__ == "__main__":
    main()
