"""The job's training precision: TF32 switches, autocast, and fp16's loss scaler.

- ``fp32``: TF32 off (``allow_tf32`` False for matmuls and cuDNN, matmul precision ``highest``).
- ``tf32``: TF32 on (matmul precision ``high``): FP32 storage, TF32 tensor-core math on Ampere
  and later (no effect elsewhere).
- ``bf16``: ``torch.autocast(dtype=torch.bfloat16)`` around the step's forward and loss; FP32
  parameters and gradients; no loss scaling. Ops outside autocast run with TF32 off.
- ``fp16``: autocast float16 plus a :class:`torch.amp.GradScaler`: the loss is multiplied by the
  scale S before backward, the gradients are unscaled once per optimizer step (after their
  all-reduce, before the optimizer), and a step whose gradients hold inf/NaN is skipped and S
  halved. Squared gradient norms measured on scaled gradients are divided by S² (GNS).

The TF32 switches are process-wide (PyTorch has no per-model setting): a Job sets them when it
starts. CPU autocast supports bfloat16 and float16 (torch >= 2.3), so every precision runs on
CPU too; only bf16 and fp32 are representative of anything there.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.core.precision import Precision

_AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def set_tf32(precision: Precision) -> None:
    """PyTorch's TF32 switches for ``precision``: on for ``tf32``, off for every other one."""
    on = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


class Amp:
    """One job's precision: the autocast context, and the loss scaler for ``fp16``."""

    def __init__(self, precision: Precision, device: torch.device) -> None:
        self.precision: Precision = precision
        self.device_type = device.type
        self.dtype = _AUTOCAST_DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        set_tf32(precision)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to the job's dtype (bf16/fp16); a no-op context for fp32 and tf32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def outside_autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast off (backward runs outside it, as PyTorch recommends)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, enabled=False)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: multiplied by the loss scale under fp16."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def scale_sq(self) -> float:
        """S², the factor between squared norms of the scaled and of the true gradients."""
        if self.scaler is None:
            return 1.0
        s = float(self.scaler.get_scale())
        return s * s

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the (all-reduced) gradients by S in place; a no-op without a scaler."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The optimizer step (skipped on inf/NaN gradients under fp16); True if it was taken."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = float(self.scaler.get_scale())
        self.scaler.step(optimizer)
        self.scaler.update()
        # update() halves the scale exactly when the gradients held inf/NaN (backoff 0.5 < 1).
        return float(self.scaler.get_scale()) >= before

    def loss_scale(self) -> float | None:
        return None if self.scaler is None else float(self.scaler.get_scale())

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the scaler's state (a checkpoint from another precision leaves it fresh)."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
