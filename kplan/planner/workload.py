"""What the search needs to know about one job: its fitted model, work and memory.

A ``Workload`` is derived from a ``Profile`` (and, where the profile carries no fit, a fresh
fit of its measurements). ``for_instance`` predicts the job on another instance type: compute
through the device-speed model, all-reduce through the catalog's link bandwidths, and the
largest local batch through a memory model. A second profile of the same job on the same GPU in
the other precision family (fp32/tf32 against fp16/bf16) gives ``precision_ratio``: how much the
job gains from tensor cores tells the device model its own compute share across GPUs.

A CPU profile that carries its step's operator graph (profile 1.4) is moved to a GPU by the
op model instead (``compute_speed``: the ``op-graph`` basis): the graph's predicted time on the
GPU over the profile's own fitted compute time at the graph's local batch, with the op model's
held-out sigma in place of the device model's plus ``CPU_TO_GPU_EXTRA_LOG_SIGMA``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from kplan.core.errors import InputError
from kplan.core.precision import DEFAULT_PRECISION, Precision, check_precision
from kplan.planner import fit, perfmodel
from kplan.planner.catalog import GpuSpec, InstanceType, nic_fabric
from kplan.planner.devices import DeviceModel, compute_scale, precision_family
from kplan.planner.perfmodel import PerfParams
from kplan.planner.profile import CodecTimes, GnsPoint, Profile

if TYPE_CHECKING:  # the op model is loaded where a CPU profile's graph is timed (``compute_speed``)
    from kplan.planner.opgraph import OpGraph
    from kplan.planner.opmodel import OpModel

# Weights, gradients and two Adam moments in FP32: the static memory of data-parallel
# training when the profile did not measure it (an upper-end assumption for SGD jobs).
STATIC_BYTES_PER_GRADIENT_BYTE = 4.0
USABLE_MEMORY_FRACTION = 0.9  # leave room for the CUDA context, allocator fragmentation
# Predicting a GPU from a CPU profile crosses architectures: the GPU-fitted device model is
# far less certain there. Added (in quadrature) to the device model's own log error.
CPU_TO_GPU_EXTRA_LOG_SIGMA = 0.7
DEVICE_MODEL = "device model"  # the compute basis of a GPU profile
OP_GRAPH = "op-graph"  # a CPU profile's graph timed by the op model (``compute_speed``)


@dataclass(frozen=True)
class GraphTiming:
    """A CPU profile's operator graph and the op model that times it on a GPU."""

    graph: OpGraph
    model: OpModel


@dataclass(frozen=True)
class ComputeSpeed:
    """How the profile's compute moves to a GPU: ``factor`` on its time, the sigma of that
    factor's log, and the basis in words (starting ``device model`` or ``op-graph``)."""

    factor: float
    log_sigma: float
    basis: str
    # The factor on the intercept (the per-step part) where it is known apart from the
    # per-sample one (the op-graph path); None: the caller's rule (factor, or factor**exponent).
    fixed_factor: float | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    params: PerfParams  # fitted on the reference device
    ref_gpu: GpuSpec
    base_batch: int  # B0, global
    samples_at_base: float  # dataset_size * epochs at B0
    gns: tuple[GnsPoint, ...]
    gradient_bytes: float
    max_local_batch_ref: int
    static_memory_gb: float | None
    per_sample_memory_gb: float | None
    ref_is_cpu: bool
    precision: Precision = DEFAULT_PRECISION  # what the profile measured in
    # (other precision, per-sample time in it / in ``precision``) on ``ref_gpu``, from a second
    # profile (``precision_ratio``); None: one precision measured.
    precision_ratio: tuple[str, float] | None = None
    # From the profile (1.2), for pricing compression: every trainable parameter's shape and
    # the codec times measured on the reference device. None: not profiled (priors used).
    gradient_shapes: tuple[tuple[int, ...], ...] | None = None
    codec: CodecTimes | None = None
    # Forward's (and the input's) share of the compute, measured by the profile (1.3); None:
    # compression.FORWARD_SHARE is assumed.
    forward_share: float | None = None
    # The NIC fabric of the profiled instance (catalog.nic_fabric), when known: measured
    # inter-node terms transfer only to instances of the same fabric.
    ref_fabric: Literal["rdma", "tcp"] | None = None
    # A CPU profile's operator graph with the op model (``compute_speed``); None: a GPU
    # profile, no graph, or no op model given (the device model moves the compute).
    graph_timing: GraphTiming | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.base_batch < 1:
            raise ValueError(f"base_batch={self.base_batch} must be >= 1")
        if not self.samples_at_base > 0:
            raise ValueError(f"samples_at_base={self.samples_at_base} must be > 0")


def epochs_at_batch(w: Workload, global_batch: int, samples: float) -> Workload:
    """``w`` with its epochs stated at ``global_batch`` (``--epochs`` with a pinned
    ``--global-batch``): ``samples`` (dataset x epochs) are the passes to train at that batch.
    B0 moves to it, so the statistical-efficiency factor ``(Bn + B) / (Bn + B0)`` is exactly 1
    there (and its forecast spread 0): the planner trains the samples the user asked for."""
    return replace(w, base_batch=global_batch, samples_at_base=samples)


@dataclass(frozen=True)
class InstancePrediction:
    params: PerfParams
    max_local_batch: int
    compute_factor: float
    compute_log_sigma: float
    # Memory-bound device work (gradient compression's codec: casts, top-k selection, PowerSGD's
    # rank-r products stream the gradient) scales by the memory bandwidths, reference GPU's
    # over the target's; None (a CPU profile, a bandwidth unknown): compute_factor.
    memory_factor: float | None = None
    compute_basis: str = DEVICE_MODEL  # ComputeSpeed.basis

    @property
    def codec_factor(self) -> float:
        """The factor a codec time measured on the reference device takes to this one."""
        return self.compute_factor if self.memory_factor is None else self.memory_factor


def workload_from_profile(
    profile: Profile,
    gpus: dict[str, GpuSpec],
    *,
    params: PerfParams | None = None,
    epochs: float | None = None,
    dataset_size: int | None = None,
    ref_link_gbps: tuple[float | None, float | None] = (None, None),
    other: Profile | None = None,
    ref_fabric: Literal["rdma", "tcp"] | None = None,
    op_model: OpModel | None = None,
) -> Workload:
    """Build a Workload; fits the profile's measurements when no model is given. ``other``: the
    same job profiled on the same GPU in another precision family (see ``precision_ratio``).
    ``op_model``: times a CPU profile's operator graph on each GPU (``compute_speed``)."""
    is_cpu = profile.gpu.lower() == "cpu"
    if is_cpu:
        if not (profile.measured_fp32_tflops and profile.measured_mem_bw_gbs):
            raise InputError(
                f"profile {profile.name!r} was measured on a CPU without device benchmarks",
                hint="re-run `kplan profile`; it records the device's FLOP/s and bandwidth",
            )
        ref = GpuSpec(
            "cpu",
            profile.device_memory_gb or 0.0,
            profile.measured_fp32_tflops,
            profile.measured_fp32_tflops,
            profile.measured_mem_bw_gbs,
            "measured by kplan profile",
        )
    else:
        key = _lookup(profile.gpu, gpus)
        ref = gpus[key]
    if params is None:
        intra, inter = ref_link_gbps
        params = fit.fit_perf_params(
            profile.measurements,
            gradient_bytes=profile.gradient_bytes,
            intra_gbps=intra,
            inter_gbps=inter,
            gpu=ref.name,
            gpus_per_node=profile.gpus_per_node,
        )
    return Workload(
        name=profile.name,
        params=params,
        ref_gpu=ref,
        base_batch=profile.base_global_batch,
        samples_at_base=float(dataset_size or profile.dataset_size)
        * float(epochs or profile.epochs),
        gns=profile.gns,
        gradient_bytes=profile.gradient_bytes,
        max_local_batch_ref=profile.max_local_batch,
        static_memory_gb=profile.static_memory_gb,
        per_sample_memory_gb=profile.per_sample_memory_gb,
        ref_is_cpu=is_cpu,
        precision=profile.precision,
        precision_ratio=precision_ratio(profile, other) if other is not None else None,
        gradient_shapes=profile.shapes(),
        codec=profile.codec,
        forward_share=profile.forward_share,
        ref_fabric=ref_fabric,
        graph_timing=(
            GraphTiming(profile.opgraph, op_model)
            if is_cpu and profile.opgraph is not None and op_model is not None
            else None
        ),
    )


def precision_ratio(profile: Profile, other: Profile) -> tuple[str, float]:
    """``(other.precision, r)``: r = the job's per-sample time in ``other`` over ``profile``, each
    the geometric mean of step time / per-GPU batch over its one-GPU measurements (what
    ``scripts/fit_device_model.py`` reads from the shared data). Both must be one GPU model, in
    the two precision families (fp32/tf32 and fp16/bf16), of one job (the same name, gradient
    bytes and shapes, dataset size and base batch); InputError otherwise."""
    if _fold(profile.gpu) != _fold(other.gpu) or _fold(profile.gpu) == "cpu":
        raise InputError(
            f"profiles {profile.name!r} ({profile.gpu}) and {other.name!r} ({other.gpu}) "
            "were not measured on the same GPU",
            hint="give two profiles of one job on one GPU model, e.g. `kplan profile "
            "--precision fp32 --precision bf16` on a GPU machine",
        )
    differ = [
        f"{what} {x!r} != {y!r}"
        for what, x, y in (
            ("name", profile.name, other.name),
            ("gradient_bytes", profile.gradient_bytes, other.gradient_bytes),
            ("dataset_size", profile.dataset_size, other.dataset_size),
            ("base_global_batch", profile.base_global_batch, other.base_global_batch),
        )
        if x != y
    ]
    shapes = (profile.gradient_shapes, other.gradient_shapes)
    if all(shapes) and shapes[0] != shapes[1]:
        differ.append("gradient_shapes differ")
    if differ:
        raise InputError(
            f"profiles {profile.name!r} and {other.name!r} are not of one job ({differ[0]})",
            hint="give two profiles of one job, e.g. from one `kplan profile train.py "
            "--precision fp32 --precision bf16`; plan different jobs one at a time",
        )
    if precision_family(profile.precision) == precision_family(other.precision):
        raise InputError(
            f"profiles {profile.name!r} and {other.name!r} are both "
            f"{profile.precision}/{other.precision}: nothing to learn from the pair",
            hint="give one fp32 or tf32 profile and one fp16 or bf16 profile",
        )
    logs = []
    for prof in (profile, other):
        one = [m for m in prof.measurements if m.nodes == 1 and m.workers == 1]
        if not one:
            raise InputError(
                f"profile {prof.name!r} has no one-GPU measurement",
                hint="re-run `kplan profile`; it measures one GPU at several batch sizes",
            )
        per_sample = [math.log(m.step_time / (m.local_batch * m.accum_steps)) for m in one]
        logs.append(sum(per_sample) / len(per_sample))
    return other.precision, math.exp(logs[1] - logs[0])


def pick_source(
    profiles: Sequence[Profile], precision: str | None
) -> tuple[Profile, Profile | None]:
    """(the profile to predict from, the other one or None) for one or two profiles of a job:
    the one measured in ``precision`` if any, else one in its family (fp32/tf32, fp16/bf16),
    else the first."""
    if not 1 <= len(profiles) <= 2:
        raise InputError(
            f"got {len(profiles)} profiles",
            hint="give one profile, or two of one job on one "
            "GPU in two precisions (one fp32/tf32, one fp16/bf16)",
        )
    order = list(range(len(profiles)))
    if precision is not None:
        exact = [i for i in order if profiles[i].precision == precision]
        family = [
            i
            for i in order
            if precision_family(profiles[i].precision) == precision_family(precision)
        ]
        order = [*(exact or family)[:1], *order]
    first = order[0]
    rest = [profiles[i] for i in range(len(profiles)) if i != first]
    return profiles[first], (rest[0] if rest else None)


def _fold(name: str) -> str:
    return name.lower().replace("_", "-")


def gpu_key(name: str, gpus: dict[str, GpuSpec]) -> str | None:
    """The catalog's name of GPU ``name`` (case and ``_``/``-`` folded), or None."""
    return {_fold(k): k for k in gpus}.get(_fold(name))


def _lookup(name: str, gpus: dict[str, GpuSpec]) -> str:
    key = gpu_key(name, gpus)
    if key is None:
        raise InputError(
            f"unknown GPU {name!r} in the profile",
            hint=f"known GPUs: {', '.join(sorted(gpus))}, or 'cpu'",
        )
    return key


def max_local_batch(w: Workload, gpu: GpuSpec) -> int:
    """Largest per-GPU batch that fits on ``gpu`` (0 if none does)."""
    if w.static_memory_gb is not None and w.per_sample_memory_gb:
        static, per_sample = w.static_memory_gb, w.per_sample_memory_gb
    elif w.ref_is_cpu or not w.ref_gpu.memory_gb:
        # No memory measurement to scale: never plan a batch the profile did not run.
        return w.max_local_batch_ref
    else:
        static = STATIC_BYTES_PER_GRADIENT_BYTE * w.gradient_bytes / 1e9
        usable_ref = USABLE_MEMORY_FRACTION * w.ref_gpu.memory_gb
        per_sample = max(usable_ref - static, 1e-6) / w.max_local_batch_ref
    if gpu.name == w.ref_gpu.name:
        return w.max_local_batch_ref
    return max(0, math.floor((USABLE_MEMORY_FRACTION * gpu.memory_gb - static) / per_sample))


def for_instance(
    w: Workload,
    inst: InstanceType,
    gpu: GpuSpec,
    dm: DeviceModel,
    precision: Precision | str | None = None,
) -> InstancePrediction:
    """The job's model on ``inst``: device-scaled compute, catalog link speeds, memory cap.

    ``precision`` is the precision to predict (``None``: the profile's own, ``w.precision``);
    projecting to another precision than the profile's carries that projection's uncertainty.
    """
    dst_precision = w.precision if precision is None else check_precision(precision)
    speed = compute_speed(w, gpu, dm, dst_precision)
    extra = speed.log_sigma
    fixed = speed.fixed_factor  # known apart on the op-graph path
    if fixed is None:
        fixed = speed.factor if w.ref_is_cpu else speed.factor**dm.fixed_exponent
    params = perfmodel.transfer(
        w.params,
        compute_factor=speed.factor,
        intra_gbps=inst.interconnect_gbps or None,
        inter_gbps=inst.network_gbps or None,
        extra_log_sigma=extra,
        # The fixed per-step part (the intercept of step time against batch: host, launches,
        # data loading, small kernels) moves less than the device part: factor**fixed_exponent,
        # fitted held out with the device model (the same arithmetic as compute_scale's
        # fixed_fraction, so the planner predicts what bench/device_model.py measures). On a
        # CPU profile the host is the device: its intercept is device work and scales fully.
        fixed_factor=fixed,
    )
    # Gradient bytes in the gradient dtype of the precision predicted (DDP reduces FP32
    # gradients under autocast: the same bytes today; measured betas scale with the bytes).
    bytes_ = perfmodel.projected_gradient_bytes(w.gradient_bytes, w.precision, dst_precision)
    ratio = bytes_ / w.gradient_bytes if w.gradient_bytes else 1.0
    params = perfmodel.replace_fields(
        params,
        gradient_bytes=bytes_ or None,
        intra_beta=params.intra_beta * ratio,
        inter_beta=params.inter_beta * ratio,
    )
    one_gpu = w.params.max_workers_measured <= 1
    if (w.params.intra_gbps is None or one_gpu) and inst.interconnect_gbps and inst.gpu_count > 1:
        # The profile measured no all-reduce between a node's GPUs (one GPU), or over a link
        # that says nothing about this instance's GPUs (CPU workers over gloo): the prior of
        # this instance's GPU link (NVLink or PCIe: fit.prior_intra; its held-out sigma joins
        # the p90, fit.prior_log_sigma), with its overlap where the profile could not fit one.
        eta_intra, gamma_intra = fit.prior_intra(inst.interconnect)
        params = perfmodel.replace_fields(
            params,
            intra_alpha=fit.PRIOR_ALPHA,
            intra_lat=fit.PRIOR_LAT_INTRA,
            intra_beta=bytes_ / (eta_intra * inst.interconnect_gbps * 1e9 / 8),
            **({"gamma": gamma_intra} if one_gpu else {}),
        )
    fabric = nic_fabric(inst)
    other_fabric = w.ref_fabric is not None and w.ref_fabric != fabric
    if (not w.params.inter_measured or other_fabric) and inst.network_gbps:
        # Inter-node terms were never measured, or were measured over another fabric (an
        # all-reduce over TCP sockets says little about NCCL over EFA, and the reverse): rebuild
        # them from the prior for this NIC's fabric (plain TCP or RDMA: efficiency and overlap,
        # fit.PRIOR_*_BY_FABRIC), and say they are a prior (its held-out sigma joins the p90).
        eta_inter, gamma_inter = fit.prior_inter(fabric)
        params = perfmodel.replace_fields(
            params,
            inter_measured=False,
            inter_alpha=fit.PRIOR_ALPHA,
            inter_lat=fit.PRIOR_LAT_INTER,
            two_node=0.0,
            inter_beta=bytes_ / (eta_inter * inst.network_gbps * 1e9 / 8),
            inter_gamma=gamma_inter,
        )
    memory = None
    if not w.ref_is_cpu and w.ref_gpu.mem_bw_gbs > 0 and gpu.mem_bw_gbs > 0:
        memory = w.ref_gpu.mem_bw_gbs / gpu.mem_bw_gbs
    return InstancePrediction(
        params, max_local_batch(w, gpu), speed.factor, extra, memory, speed.basis
    )


def compute_speed(w: Workload, gpu: GpuSpec, dm: DeviceModel, precision: str) -> ComputeSpeed:
    """The factor (and its log sigma) that moves the profile's compute to ``gpu`` in
    ``precision``, and the basis it rests on.

    A GPU profile: the device model (``devices.compute_scale``). A CPU profile with an operator
    graph: the op model's time of the graph on ``gpu`` over the profile's own fitted compute time
    at the graph's local batch, with the op model's held-out sigma (``op-graph``). Otherwise
    (no graph, a GPU without an SM count, a 16-bit plan from a full-precision graph): the device
    model, widened by ``CPU_TO_GPU_EXTRA_LOG_SIGMA``."""
    why = "no operator graph"
    if w.ref_is_cpu and w.graph_timing is not None:
        graph = w.graph_timing.graph
        measured = float(perfmodel.compute_time(w.params, graph.local_batch))
        if not gpu.sm_count:
            why = f"{gpu.name} has no SM count for the op model"
        elif precision_family(precision) != precision_family(graph.precision):
            why = f"the graph was traced in {graph.precision}, not timed in {precision}"
        elif not measured > 0:
            why = "the profile's fitted compute time is not positive"
        else:
            from kplan.planner.opmodel_paths import batch_line

            line = batch_line(w.graph_timing.model, graph, gpu, precision)
            basis = (
                f"{OP_GRAPH}: the profile's operator graph (local batch {graph.local_batch}) timed "
                f"on {gpu.name} by the op model, as a launch floor plus a per-sample time, over "
                f"the CPU's fitted compute line (held-out sigma {line.log_sigma:.2f})"
            )
            a, b = w.params.compute_a, w.params.compute_b
            if a > 0 and b > 0:
                return ComputeSpeed(
                    line.per_sample_s / b, line.log_sigma, basis, line.intercept_s / a
                )
            at_batch = line.intercept_s + line.per_sample_s * graph.local_batch
            return ComputeSpeed(at_batch / measured, line.log_sigma, basis)
    speed = compute_scale(
        dm,
        w.ref_gpu,
        gpu,
        src_precision=w.precision,
        dst_precision=precision,
        precision_ratio=w.precision_ratio,
    )
    if not w.ref_is_cpu:
        return ComputeSpeed(speed.factor, math.hypot(speed.log_sigma, 0.0), DEVICE_MODEL)
    sigma = math.hypot(speed.log_sigma, CPU_TO_GPU_EXTRA_LOG_SIGMA)
    basis = (
        f"{DEVICE_MODEL} from a CPU profile ({why}; sigma widened by "
        f"{CPU_TO_GPU_EXTRA_LOG_SIGMA:g} to {sigma:.2f})"
    )
    return ComputeSpeed(speed.factor, sigma, basis)
