"""Transformer encoders and decoders as published: BERT-base (Devlin et al. 2019) with the
SQuAD span head, and GPT-2 small (Radford et al. 2019), for tracing (no weights, no data)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """Multi-head self-attention and a 4x MLP with GELU; post-norm (BERT) or pre-norm (GPT-2)."""

    def __init__(
        self, d: int, heads: int, causal: bool, pre_norm: bool, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.heads, self.causal, self.pre_norm, self.dropout = heads, causal, pre_norm, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        drop = self.dropout if self.training else 0.0
        # Attention dropout runs inside the fused kernel a GPU trains with; the CPU and meta
        # backends have no fused kernel with dropout (they would trace the unfused math), so
        # the traced call is the fused kernel without it.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(b, length, d)), drop, self.training)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.fc2(F.gelu(self.fc1(x))), self.dropout, self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attend(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attend(x))
        y: torch.Tensor = self.norm2(x + self.mlp(x))
        return y


class Bert(nn.Module):
    """BERT-base (12 layers, 768 wide, 12 heads, 30522 word pieces) with the SQuAD head: a
    start and an end logit per token."""

    def __init__(self, vocab: int = 30522, d: int = 768, layers: int = 12, heads: int = 12,
                 positions: int = 512) -> None:  # fmt: skip
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.types = nn.Embedding(2, d)
        self.norm = nn.LayerNorm(d)
        self.blocks = nn.Sequential(*[Block(d, heads, False, False) for _ in range(layers)])
        self.pooler = nn.Linear(d, d)  # part of BERT-base's 110M; unused by the span head
        self.span = nn.Linear(d, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.words(tokens) + self.positions(where) + self.types(torch.zeros_like(tokens))
        x = F.dropout(self.norm(x), 0.1, self.training)
        logits: torch.Tensor = self.span(self.blocks(x))
        return logits


class Gpt2(nn.Module):
    """GPT-2 small: 12 layers, 768 wide, 12 heads, 50257 tokens, 1024 positions, the output
    layer tied to the token embedding."""

    def __init__(self, vocab: int = 50257, d: int = 768, layers: int = 12, heads: int = 12,
                 positions: int = 1024) -> None:  # fmt: skip
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.blocks = nn.Sequential(*[Block(d, heads, True, True) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device)
        x = F.dropout(self.words(tokens) + self.positions(where), 0.1, self.training)
        return F.linear(self.norm(self.blocks(x)), self.words.weight)
