"""An MLP regression on generated data, on kplan.runtime.

Inputs are Gaussian vectors; the target is a fixed smooth nonlinear function of them plus
noise, generated deterministically from ``--seed`` (no download).

    python kplan/examples/mlp_regression.py --epochs 3
    torchrun --nproc_per_node=2 kplan/examples/mlp_regression.py --epochs 3
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import kplan.runtime as kr


def regression_data(samples: int, features: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w1, w2 = torch.randn(2, features, generator=g) / features**0.5
    y = torch.sin(2 * x @ w1) + 0.5 * (x @ w2) ** 2 + 0.1 * torch.randn(samples, generator=g)
    return torch.utils.data.TensorDataset(x, y.unsqueeze(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256, help="global batch (all workers)")
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    args = p.parse_args()

    ctx = kr.init()
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden), nn.GELU(),
        nn.Linear(args.hidden, args.hidden), nn.GELU(),
        nn.Linear(args.hidden, 1),
    ).to(ctx.device)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = regression_data(args.samples, args.features, args.seed)
    job = kr.Job(model, optimizer, data, batch_size=args.batch_size)
    for epoch in job.epochs(args.epochs):
        total, count = 0.0, 0
        for x, y in job.batches():
            with job.step():
                loss = F.mse_loss(job.model(x), y)
                job.backward(loss)
            total, count = total + loss.item(), count + 1
        if ctx.rank == 0 and count:
            print(f"epoch {epoch} mse {total / count:.4f}")


if __name__ == "__main__":
    main()
