"""kplan: plan, launch and account for distributed PyTorch training, cost-aware."""

from __future__ import annotations

__version__ = "0.1.0"
