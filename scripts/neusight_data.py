"""Read NeuSight's (ASPLOS'25) shared data: kernel timings, device specs, operator graphs, labels.

Data: ``gpu/neusight-asplos25`` in the shared folder ($KPLAN_SHARED_DATA, else ../shared/data
beside the repository). Conventions of NeuSight's files, translated here to kplan's
(``kplan.planner.opgraph``):

- ``bmm``/``linear`` kernels and ``BMM``/``Linear`` graph ops are ``(B, M, N, K)`` /
  ``(M, N, K)`` with ``N`` the INNER dimension (``[M, N] @ [N, K]``); kplan's matmul dims are
  ``(B, M, N, K)`` with ``K`` inner, so NeuSight's ``(B, M, N, K)`` is kplan's ``(B, M, K, N)``.
- ``VEC<op>`` graph ops carry ``(rows, row_length)``; ``MEM`` ops a list of tensor shapes whose
  elements are read or written once (a copy, dropout, an index).
- A graph of a layer stack holds ONE layer (NeuSight traces a single layer); the layer's rows
  repeat ``num_layer`` times (the label's field) in a step. The layer's rows are found by the
  family's first and last node names (``LAYER_SPAN``).
- Everything is FP32 (PyTorch 2.1 defaults, so no TF32 on Ampere or Hopper).
"""

from __future__ import annotations

import ast
import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kplan.planner.opgraph import OpCall, OpGraph, fold
from kplan.planner.opmodel import OpDevice
from kplan.planner.opwork import conv_work, matmul_work, vector_work

TRAIN_GPUS = (
    "Tesla_P4",
    "Tesla_P100-PCIE-16GB",
    "Tesla_T4",
    "Tesla_V100-PCIE-32GB",
    "NVIDIA_A100-PCIE-40GB",
)
TEST_GPUS = ("NVIDIA_H100_80GB_HBM3", "NVIDIA_L4", "NVIDIA_A100_80GB_PCIe")
SHORT = {
    "Tesla_P4": "P4",
    "Tesla_P100-PCIE-16GB": "P100",
    "Tesla_T4": "T4",
    "Tesla_V100-PCIE-32GB": "V100",
    "NVIDIA_A100-PCIE-40GB": "A100-40GB",
    "NVIDIA_A100_80GB_PCIe": "A100-80GB",
    "NVIDIA_H100_80GB_HBM3": "H100",
    "NVIDIA_L4": "L4",
}
# conv was measured on the A100 80GB PCIe, not the 40GB: it stands in for the A100 (same die).
CONV_FILE = {"NVIDIA_A100-PCIE-40GB": "NVIDIA_A100_80GB_PCIe"}
VECTOR_OPS = ("add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu", "gelu", "tanh")
# First and last node of the one traced layer, per model family.
LAYER_SPAN = {
    "bert": ("bert_encoder_layer_0_attention_self_query", "bert_encoder_layer_0_output_layer_norm"),
    "gpt": ("transformer_h_0_ln_1", "add_15"),
    "opt": ("model_decoder_layers_0_self_attn_layer_norm", "view_11"),
}
MODELS = {"bert_large": "BERT", "gpt2_large": "GPT-2", "gpt3_xl": "GPT-3", "gpt3_27": "GPT-3"}
MODELS["opt_13"] = "OPT"


def root() -> Path:
    env = os.environ.get("KPLAN_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return base / "gpu" / "neusight-asplos25"


def device(gpu: str, base: Path | None = None) -> OpDevice:
    """A GPU's specs from NeuSight's ``device_configs`` (FP32 only: the data is FP32)."""
    doc = json.loads(((base or root()) / "device_configs" / f"{gpu}.json").read_text())
    return OpDevice(
        name=SHORT.get(gpu, gpu),
        fp32_tflops=float(doc["SingleFLOPs"]) / 1000.0,
        mem_bw_gbs=float(doc["Mem_Bw"]),
        sm_count=int(doc["Num_Sm"]),
        tensor_tflops={},
    )


@dataclass(frozen=True)
class Kernel:
    """One measured kernel call in kplan's terms."""

    gpu: str
    cls: str
    op: str
    dims: tuple[int, ...]
    flops: float
    bytes: float
    seconds: float


def kernels(gpu: str, base: Path | None = None) -> Iterator[Kernel]:
    """Every measured kernel of one GPU (FP32)."""
    folder = (base or root()) / "kernels"
    for op in ("bmm", "linear", "conv", "softmax", "ln", *VECTOR_OPS):
        name = CONV_FILE.get(gpu, gpu) if op == "conv" else gpu
        path = folder / op / f"{name}.csv"
        if not path.exists():
            continue
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                yield _kernel(gpu, op, row)


def _kernel(gpu: str, op: str, row: dict[str, str]) -> Kernel:
    sec = float(row["Latency"]) / 1000.0
    if op in ("bmm", "linear"):
        b, m, n, k = (int(row[c]) for c in ("B", "M", "N", "K"))
        mm: tuple[int, ...] = (b, m, k, n)
        return Kernel(gpu, "matmul", op, mm, *matmul_work(mm), sec)
    if op == "conv":
        cols = ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride")
        cv = (*(int(row[c]) for c in cols), int(row["Padding"]))
        return Kernel(gpu, "conv", op, cv, *conv_work(cv), sec)
    dims = (int(row["B"]), int(row["H"]))  # (rows, row length)
    cls = {"softmax": "softmax", "ln": "norm"}.get(op, "elementwise")
    return Kernel(gpu, cls, op, dims, *vector_work(op, dims), sec)


# ---- operator graphs -------------------------------------------------------------------------


def _prod(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _calls(entries: list[Any], phase: str) -> Iterator[OpCall]:
    for kind, args in entries:
        if kind in ("Linear", "BMM"):
            b, m, n, k = (1, *args) if kind == "Linear" else args
            dims: tuple[int, ...] = (int(b), int(m), int(k), int(n))
            yield OpCall("matmul", kind.lower(), phase, "fp32", dims, *matmul_work(dims))
        elif kind.startswith("VEC"):
            op = kind[3:]
            dims = (int(args[0]), int(args[1]))
            cls = {"softmax": "softmax", "ln": "norm"}.get(op, "elementwise")
            yield OpCall(cls, op, phase, "fp32", dims, *vector_work(op, dims))
        elif kind == "MEM":
            shapes = [s for s in args if _prod(s) > 1]
            if not shapes:  # Python scalars (sizes): no kernel
                continue
            n = sum(_prod(s) for s in shapes)
            yield OpCall("other", "mem", phase, "fp32", (n,), 0.0, 4.0 * n)
        else:
            raise ValueError(f"unknown NeuSight op {kind!r}")


def read_opgraph(path: Path, num_layer: int) -> OpGraph:
    """One NeuSight opgraph CSV as an OpGraph: the traced layer repeated ``num_layer`` times."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    names = [r["Name"] for r in rows]
    family = next((f for f in LAYER_SPAN if path.name.startswith(f)), None)
    start, end = 0, -1
    if family is not None:
        first, last = LAYER_SPAN[family]
        start, end = names.index(first), names.index(last)
    calls: list[OpCall] = []
    for i, row in enumerate(rows):
        repeat = num_layer if start <= i <= end and family is not None else 1
        for column, phase in (("FwOps", "forward"), ("BwOps", "backward"), ("AccOps", "backward")):
            for call in _calls(ast.literal_eval(row[column]), phase):
                calls.append(OpCall(**{**call.__dict__, "count": call.count * repeat}))
    batch = int(path.stem.split("-")[3])
    return OpGraph(fold(calls), local_batch=batch, precision="fp32", how=f"NeuSight {path.name}")


@dataclass(frozen=True)
class Label:
    gpu: str
    workload: str  # the opgraph's stem, e.g. "bert_large-train-512-2"
    model: str  # BERT, GPT-2, GPT-3, OPT
    mode: str  # train or inf
    seconds: float
    num_layer: int


def labels(base: Path | None = None) -> Iterator[Label]:
    """Measured single-GPU iterations of the four model families on NVIDIA GPUs with kernels
    or in NeuSight's test set (distributed, fusion and MoE runs are left out)."""
    folder = (base or root()) / "label"
    for gpu in (*TRAIN_GPUS, *TEST_GPUS):
        for path in sorted((folder / gpu).glob("*.json")):
            parts = path.stem.split("-")
            if len(parts) != 4 or parts[0] not in MODELS:
                continue
            doc = json.loads(path.read_text())
            yield Label(
                gpu,
                path.stem,
                MODELS[parts[0]],
                parts[1],
                float(doc["e2e_latency"]) / 1000.0,
                int(doc["num_layer"]),
            )
