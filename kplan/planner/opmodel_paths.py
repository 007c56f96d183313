"""Measured where measured, modelled where not: which path moves a profiled step to a GPU.

A profile measured a step's time on one device (a GPU, or the CPU); where it also carries the
step's operator graph (``kplan.planner.opgraph``), the op-level model (``opmodel``) can time
that graph on any GPU. ``speed_from_graph`` chooses, and says which it chose:

- ``measured``: the destination is the GPU (and precision) the profile ran on: factor 1,
  sigma 0 (the profile's own sigma is all there is).
- ``op-graph ratio`` or ``device model``: another GPU. Both give a factor on the measured time
  with a held-out sigma: the op model's ratio of the graph's times (sigma: the op model's
  ``ratio`` calibration, fitted on held-out measured steps moved between GPUs; ``OpModel.
  ratio_sigma``) and the device model's roofline over the whole step
  (``devices.compute_scale``). The one with the smaller held-out sigma is used; the note names
  the other. Without a graph, the device model is the only path.
- ``op-graph outright``: a CPU profile (no GPU time measured): the graph's time on the GPU is
  predicted outright, with the op model's ``outright`` calibration (held-out step times
  predicted from their graphs). Without a graph there is nothing here to predict from (the
  caller keeps its own CPU path).

Every note names the path's sigma and what it was calibrated on (``describe``).

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kplan.planner.catalog import GpuSpec
from kplan.planner.devices import DeviceModel, compute_scale, effective_precision
from kplan.planner.opgraph import OpGraph
from kplan.planner.opmodel import OpModel, device_from_gpu

PATHS = ("measured", "op-graph ratio", "device model", "op-graph outright")


@dataclass(frozen=True)
class GraphSpeed:
    """How a profiled step maps to ``dst``: ``factor`` times the measured time, or, on the
    ``op-graph outright`` path, ``seconds`` of device time a step (factor is then 0)."""

    path: str
    factor: float
    seconds: float
    log_sigma: float
    note: str


def speed_from_graph(
    op_model: OpModel,
    device_model: DeviceModel,
    graph: OpGraph | None,
    src: GpuSpec | None,
    dst: GpuSpec,
    *,
    src_precision: str = "fp32",
    dst_precision: str = "fp32",
) -> GraphSpeed:
    """The path, factor (or outright seconds) and held-out sigma of a profile's step on ``dst``.

    ``src`` is the GPU the profile measured on, None for a CPU profile. Raises ValueError for a
    CPU profile without a graph (no GPU time to move and none to predict from)."""
    if src is None:
        if graph is None:
            raise ValueError("a CPU profile without an operator graph has no GPU time to move")
        timed = _as_precision(graph, dst_precision)
        step = op_model.step_time(timed, device_from_gpu(dst))
        note = f"{describe(op_model, 'outright', step.log_sigma)}; {step.note}"
        if timed.precision != graph.precision:
            note = f"graph traced in {graph.precision}, timed in {timed.precision}; {note}"
        return GraphSpeed("op-graph outright", 0.0, step.seconds, step.log_sigma, note.strip("; "))
    ps, pd = effective_precision(src, src_precision), effective_precision(dst, dst_precision)
    if src.name == dst.name and ps == pd:
        return GraphSpeed("measured", 1.0, 0.0, 0.0, "")
    device = compute_scale(
        device_model, src, dst, src_precision=src_precision, dst_precision=dst_precision
    )
    if graph is None or not (src.sm_count and dst.sm_count):
        why = "no operator graph" if graph is None else "a GPU without an SM count"
        return GraphSpeed("device model", device.factor, 0.0, device.log_sigma, why)
    if ps == pd:  # one graph on both GPUs: one numpy batch per class (OpModel.step_times)
        a, b = op_model.step_times(
            _as_precision(graph, ps), [device_from_gpu(src), device_from_gpu(dst)]
        )
    else:
        a = op_model.step_time(_as_precision(graph, ps), device_from_gpu(src))
        b = op_model.step_time(_as_precision(graph, pd), device_from_gpu(dst))
    ratio, sigma = b.seconds / a.seconds, op_model.ratio_sigma(a, b, pd)
    if sigma < device.log_sigma:
        note = (
            f"{describe(op_model, 'ratio', sigma)}; device model's {device.log_sigma:.2f} is larger"
        )
        return GraphSpeed("op-graph ratio", ratio, 0.0, sigma, note)
    note = f"op-graph ratio's sigma {sigma:.2f} is larger"
    return GraphSpeed("device model", device.factor, 0.0, device.log_sigma, note)


def describe(op_model: OpModel, path: str, sigma: float) -> str:
    """What a path's sigma is: its value and the held-out steps it was calibrated on."""
    row = op_model.doc.get("calibration", {}).get(path, {}).get("fp32", {})
    if not isinstance(row, dict) or "steps" not in row:
        return f"sigma {sigma:.2f} (held-out kernel biases, no step calibration)"
    return (
        f"sigma {sigma:.2f} (calibrated on {row['steps']} held-out FP32 steps of "
        f"{row.get('gpus', '?')} GPUs left out of the fit)"
    )


@dataclass(frozen=True)
class BatchLine:
    """A step's device time on a GPU as ``intercept_s + per_sample_s * b`` for a local batch b."""

    intercept_s: float
    per_sample_s: float
    log_sigma: float


def batch_line(op_model: OpModel, graph: OpGraph, dst: GpuSpec, precision: str) -> BatchLine:
    """The graph's time on ``dst`` as a line in the local batch, from two op-model timings: the
    graph as traced (its ``local_batch``) and the graph with every forward and backward call's
    work shrunk to nothing (the batch's share gone: each kernel's launch floor and the optimizer
    remain). A GPU's time is far from proportional to the batch where launches dominate (a small
    model), which a factor on a CPU's near-linear time would miss."""
    timed = _as_precision(graph, precision)
    dev = device_from_gpu(dst)
    full = op_model.step_time(timed, dev)
    shrunk = dataclasses.replace(
        timed,
        ops=tuple(
            o
            if o.phase == "optimizer"
            else dataclasses.replace(o, flops=o.flops * 1e-9, bytes=o.bytes * 1e-9)
            for o in timed.ops
        ),
    )
    # The batch's share is at least the time to move its bytes once at full bandwidth (where
    # launches hide it all, the line must still grow with the batch: a physical floor).
    moved = sum(o.bytes * o.count for o in timed.ops if o.phase != "optimizer")
    least = min(moved / (dst.mem_bw_gbs * 1e9), full.seconds) if dst.mem_bw_gbs > 0 else 0.0
    floor = min(op_model.step_time(shrunk, dev).seconds, full.seconds - least)
    return BatchLine(floor, (full.seconds - floor) / graph.local_batch, full.log_sigma)


def _as_precision(graph: OpGraph, precision: str) -> OpGraph:
    """The graph timed in ``precision`` where only the math mode differs (fp32 <-> tf32: the
    same FP32 tensors); a 16-bit graph keeps its own dtypes."""
    if {graph.precision, precision} <= {"fp32", "tf32"}:
        return dataclasses.replace(graph, precision=precision)
    return graph
