"""A character-level transformer language model on a short public-domain text, on kplan.runtime.

The text is ``examples/data/lighthouse.txt`` (an original story dedicated to the public domain,
CC0; see kplan/examples/data/README.md). Each sample is a window of ``--context`` characters and the
same window shifted by one: the model learns to predict the next character.

    python kplan/examples/char_transformer.py --epochs 2
    torchrun --nproc_per_node=2 kplan/examples/char_transformer.py --epochs 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import kplan.runtime as kr

TEXT = Path(__file__).resolve().parent / "data" / "lighthouse.txt"


class CharWindows(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, text: str, context: int) -> None:
        self.vocab = sorted(set(text))
        self.ids = torch.tensor([self.vocab.index(c) for c in text], dtype=torch.long)
        self.context = context

    def __len__(self) -> int:
        return len(self.ids) - self.context - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[i : i + self.context], self.ids[i + 1 : i + self.context + 1]


class CharTransformer(nn.Module):
    causal: torch.Tensor  # additive mask: -inf above the diagonal

    def __init__(self, vocab: int, context: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.zeros(context, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.tokens(ids) + self.positions[:n]
        x = self.blocks(x, mask=self.causal[:n, :n], is_causal=True)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all workers)")
    p.add_argument("--context", type=int, default=64, help="characters per sample")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    ctx = kr.init()
    data = CharWindows(TEXT.read_text(encoding="utf-8"), args.context)
    model = CharTransformer(len(data.vocab), args.context, args.dim, args.layers, args.heads)
    optimizer = torch.optim.AdamW(model.to(ctx.device).parameters(), lr=args.lr)
    job = kr.Job(model, optimizer, data, batch_size=args.batch_size)
    for epoch in job.epochs(args.epochs):
        total, count = 0.0, 0
        for x, y in job.batches():
            with job.step():
                logits = job.model(x)
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
                job.backward(loss)
            total, count = total + loss.item(), count + 1
        if ctx.rank == 0 and count:
            print(f"epoch {epoch} loss {total / count:.4f} ({len(data)} windows)")


if __name__ == "__main__":
    main()
