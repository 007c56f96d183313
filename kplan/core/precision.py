"""Training precision: what a profile measured in, and what a plan runs in.

- ``fp32``: IEEE single precision everywhere (TF32 math off).
- ``tf32``: FP32 storage, matrix multiplies and convolutions on TF32 tensor cores (Ampere and
  later; PyTorch's ``allow_tf32`` switches). On older GPUs it runs as ``fp32``.
- ``bf16``: autocast to bfloat16 for matmuls/convolutions, FP32 master weights; no loss scaling.
- ``fp16``: autocast to float16 with dynamic loss scaling (``GradScaler``), FP32 master weights.

Gradients of the mixed precisions are reduced in the dtype of the parameters (FP32 under
autocast), unless a communication hook compresses them: ``GRADIENT_BYTES`` gives the bytes per
gradient element that DDP sends for each precision.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from kplan.core.errors import InputError

Precision = Literal["fp32", "tf32", "bf16", "fp16"]
PRECISIONS: Final[tuple[Precision, ...]] = get_args(Precision)
DEFAULT_PRECISION: Final[Precision] = "fp32"
# Mixed precision keeps FP32 parameters, so DDP all-reduces FP32 gradients (4 bytes).
GRADIENT_BYTES: Final[dict[Precision, int]] = {"fp32": 4, "tf32": 4, "bf16": 4, "fp16": 4}


def check_precision(value: object, where: str = "--precision") -> Precision:
    """``value`` as a Precision, or a one-line InputError naming the allowed values."""
    if isinstance(value, str):
        folded = value.strip().lower()
        aliases = {"amp": "fp16", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
        folded = aliases.get(folded, folded)
        for p in PRECISIONS:
            if folded == p:
                return p
    raise InputError(
        f"{where} {value!r} is not a precision",
        hint=f"one of: {', '.join(PRECISIONS)} (amp = fp16 with loss scaling)",
    )
