"""NCF / NeuMF (He et al. 2017) on MovieLens-20M sizes: a matrix-factorisation branch and an MLP
branch over user and item embeddings, one logit per (user, item) pair. For tracing only."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class NeuMF(nn.Module):
    def __init__(self, users: int = 138_493, items: int = 26_744, factors: int = 64,
                 mlp: tuple[int, ...] = (256, 256, 128, 64)) -> None:  # fmt: skip
        super().__init__()
        self.mf_user, self.mf_item = nn.Embedding(users, factors), nn.Embedding(items, factors)
        self.mlp_user = nn.Embedding(users, mlp[0] // 2)
        self.mlp_item = nn.Embedding(items, mlp[0] // 2)
        self.mlp = nn.Sequential(
            *[m for a, b in itertools.pairwise(mlp) for m in (nn.Linear(a, b), nn.ReLU())]
        )
        self.out = nn.Linear(factors + mlp[-1], 1)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        user, item = pairs[:, 0], pairs[:, 1]
        mf = self.mf_user(user) * self.mf_item(item)
        deep = self.mlp(torch.cat([self.mlp_user(user), self.mlp_item(item)], 1))
        logits: torch.Tensor = self.out(torch.cat([mf, deep], 1))
        return logits.squeeze(1)
