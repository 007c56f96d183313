"""The versioned Profile: what the profiler measured about one training job.

``profile_from_dict`` validates a parsed JSON document and returns a frozen ``Profile``;
``profile_to_dict`` writes it back. Readers reject unknown major schema versions.

Document shape (``schema`` = ``kplan.profile/1.x``)::

    {
      "schema": "kplan.profile/1.1",
      "name": "imagenet-resnet50",
      "precision": "fp32",      # optional (1.1): fp32, tf32, bf16 or fp16 (kplan.core.precision)
      "provenance": "how it was measured, by what",
      "device": {"gpu": "T4", "gpus_per_node": 4, "cloud": "aws", "instance_type": "g4dn.12xlarge",
                 "fp32_tflops": 7.9, "mem_bw_gbs": 290.0},   # the last two: measured, optional
      "model": {"gradient_bytes": 102228128,
                "gradient_shapes": [[[2048, 512, 1, 1], 3], [[1000], 1], ...],   # optional (1.2)
                "forward_share": 0.31},                                          # optional (1.3)
      "batch": {"base_global_batch": 200, "max_local_batch": 200,
                "max_local_limit": "oom"},   # optional: oom, memory or sweep (what set the max)
      "memory": {"device_memory_gb": 16.0, "static_gb": 1.5, "per_sample_gb": 0.06},   # optional
      "work": {"dataset_size": 1281167, "epochs": 90},
      "gns": {"trajectory": [{"progress": 0.0, "noise_scale": 150.0}, ...]},           # optional
      "measurements": [{"nodes": 1, "workers": 1, "local_batch": 20, "step_time": 0.147,
                        "sync_time": 0.001, "accum_steps": 1}, ...],
      "fit": { ...a fitted performance model, see kplan.planner.perfmodel... },        # optional
      "codec_seconds": {"options": {"fp16": 0.0011, "powersgd:4": 0.0093,
                                    "topk:0.01:ar": 0.032, "topk:0.01:ag": 0.041},
                        "device": "cpu", "how": "median of 3 after 1 warm-up"}   # optional (1.2)
    }

``device.gpu`` is a catalog GPU name (e.g. "T4") or "cpu". ``device.fp32_tflops`` and
``device.mem_bw_gbs``, when present, are what the profiler measured on the device (a matmul and
a copy benchmark); the planner uses them to predict other devices from an uncatalogued one.

``progress`` in the GNS trajectory is the fraction of training done (0 to 1, in samples at the
base batch); ``noise_scale`` is the gradient noise scale B_noise at that point.

``model.gradient_shapes`` (1.2) are the trainable parameters' shapes as ``[shape, count]`` pairs
of distinct shapes (at most ``MAX_DISTINCT_SHAPES``; their elements must match
``gradient_bytes`` at 1-8 bytes each). ``codec_seconds`` (1.2) are the gradient-compression
options' compress + decompress seconds per step measured on the profiling device
(kplan/profiler/codec.py), keyed by the option's canonical spec. The planner prices compression with
both (kplan/planner/compression.py); without them it assumes square matrices and per-element priors.
``model.forward_share`` (1.3) is forward's (and fetching the input's) share of the compute time,
measured in the profile's sweep by timing the backward passes apart: the part of a step no
gradient exchange overlaps. Without it the planner assumes a third (backward costs about twice
forward).
``device.startup_s`` (optional, no schema bump: older readers ignore it) is the seconds from the
profiled job's start (torchrun, the workers' imports, the rendezvous) to its first step's record,
measured by ``kplan profile``; a local launch's prediction starts from it (kplan/app/local_plan.py).
``device.shutdown_s`` (optional, no schema bump) is the seconds from the profiled job's last record
to its exit (the workers' and torchrun's shutdown); a local launch's prediction ends with it.
``device.cpu_threads`` (optional, no schema bump) is the CPU threads each profiled worker ran with
(``OMP_NUM_THREADS``, kplan/core/threads.py); a local launch compares it with its own workers'.
``opgraph`` (1.4) is the operator graph of one training step at a local batch (forward, backward,
optimizer: each operator's kind, shape, dtype, FLOPs and bytes, identical calls folded), traced at
the dispatcher by kplan/profiler/opgraph_trace.py; the shape is kplan/planner/opgraph.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kplan.core.compression_spec import parse_compression
from kplan.core.errors import DataFileError, InputError, SchemaVersionError
from kplan.core.precision import DEFAULT_PRECISION, Precision, check_precision
from kplan.planner.profile_checks import check_consistent

if TYPE_CHECKING:  # loaded with a profile that has a graph (``_opgraph``)
    from kplan.planner.opgraph import OpGraph

# 1.1: optional top-level "precision"; 1.2: optional "model.gradient_shapes", "codec_seconds";
# 1.3: optional "model.forward_share"; 1.4: optional "opgraph"
PROFILE_SCHEMA = "kplan.profile/1.4"
_PROFILE_KIND = "kplan.profile"
_SUPPORTED_MAJOR = 1


@dataclass(frozen=True)
class Measurement:
    """One measured configuration: the mean of several steps (DESIGN.md measurements CSV)."""

    nodes: int
    workers: int
    local_batch: int
    step_time: float  # seconds per optimizer step, sync included
    sync_time: float | None = None  # exposed (not overlapped) all-reduce wait, seconds
    accum_steps: int = 1
    instance_type: str | None = None
    gpu: str | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.workers < self.nodes:
            raise ValueError(
                f"nodes={self.nodes}, workers={self.workers}: need 1 <= nodes <= workers"
            )
        if self.local_batch < 1:
            raise ValueError(f"local_batch={self.local_batch} must be >= 1")
        if self.accum_steps < 1:
            raise ValueError(f"accum_steps={self.accum_steps} must be >= 1")
        if not (self.step_time > 0 and math.isfinite(self.step_time)):
            raise ValueError(f"step_time={self.step_time} must be a positive number")
        if self.sync_time is not None and not (
            0 <= self.sync_time <= self.step_time and math.isfinite(self.sync_time)
        ):
            raise ValueError(f"sync_time={self.sync_time} must be in [0, step_time]")


@dataclass(frozen=True)
class GnsPoint:
    progress: float  # fraction of training done, in [0, 1]
    noise_scale: float  # B_noise, samples


@dataclass(frozen=True)
class CodecTimes:
    """Measured compress + decompress seconds per step of compression options (profile 1.2)."""

    seconds: tuple[tuple[str, float], ...]  # (canonical spec, seconds) on ``device``
    device: str  # what measured them: "cpu", "cuda" (the profile's device.gpu names the model)
    how: str  # the method: repetitions, warm-up, statistic, workers

    def as_dict(self) -> dict[str, float]:
        return dict(self.seconds)


Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    name: str
    provenance: str
    gpu: str
    gpus_per_node: int
    gradient_bytes: float
    base_global_batch: int
    max_local_batch: int  # largest per-GPU batch that fits on the profiled GPU
    dataset_size: int
    epochs: float
    measurements: tuple[Measurement, ...]
    gns: tuple[GnsPoint, ...] = ()
    cloud: str | None = None
    instance_type: str | None = None
    device_memory_gb: float | None = None
    static_memory_gb: float | None = None
    per_sample_memory_gb: float | None = None
    measured_fp32_tflops: float | None = None
    measured_mem_bw_gbs: float | None = None
    fit: dict[str, Any] | None = field(default=None, compare=False)
    precision: Precision = DEFAULT_PRECISION  # what the measurements ran in (profile 1.1)
    # What set max_local_batch: "oom" (ran out of memory above it), "memory" (the measured memory
    # line reaches the device's memory) or "sweep" (the largest size profiled; memory not
    # measured). None: not recorded (older profiles, the built-in examples).
    max_local_limit: str | None = None
    # The trainable parameters' shapes, (shape, count) per distinct shape, and the measured codec
    # times of compression options (profile 1.2). None: not recorded.
    gradient_shapes: tuple[tuple[Shape, int], ...] | None = None
    codec: CodecTimes | None = None
    # Forward's (and the input's) share of the compute time, measured (profile 1.3). None: not.
    forward_share: float | None = None
    # Seconds from the job's start (torchrun, imports, rendezvous) to its first step's record,
    # measured by kplan profile on its machine (optional "device.startup_s"). None: not.
    startup_s: float | None = None
    # Seconds from the profiled job's last record to its exit (the workers' and torchrun's
    # shutdown), measured by kplan profile (optional "device.shutdown_s"). None: not.
    shutdown_s: float | None = None
    # CPU threads each profiled worker ran with (optional "device.cpu_threads": OMP_NUM_THREADS
    # as kplan/core/threads.py sets it). None: not recorded (older profiles: torchrun's 1 when
    # it started several workers).
    cpu_threads: int | None = None
    # The operator graph of one step (profile 1.4). None: not traced.
    opgraph: OpGraph | None = field(default=None, compare=False)

    def shapes(self) -> tuple[Shape, ...] | None:
        """Every trainable parameter's shape (the pairs expanded), or None when not recorded."""
        if self.gradient_shapes is None:
            return None
        return tuple(s for s, n in self.gradient_shapes for _ in range(n))


def check_schema(doc: Any, kind: str, source: str) -> str:
    """Check a document's ``schema`` field: ``<kind>/<major>.<minor>`` with a known major."""
    if not isinstance(doc, dict):
        raise DataFileError(
            f"{source}: expected a JSON object, got {type(doc).__name__}",
            hint=f"the file must be a {kind} document with a 'schema' field",
        )
    schema = doc.get("schema")
    if not isinstance(schema, str) or "/" not in schema:
        raise DataFileError(
            f"{source}: missing or malformed 'schema' field ({schema!r})",
            hint=f"expected something like '{kind}/1.0'",
        )
    got_kind, _, version = schema.partition("/")
    if got_kind != kind:
        raise DataFileError(
            f"{source}: this is a {got_kind!r} document, not a {kind!r}",
            hint="check that you passed the right file",
        )
    major_text = version.split(".")[0]
    if not major_text.isdigit():
        raise DataFileError(f"{source}: malformed schema version {version!r}", hint="expected 1.0")
    major = int(major_text)
    if major != _SUPPORTED_MAJOR:
        raise SchemaVersionError(
            f"{source}: {kind} schema version {version} is not supported",
            hint=f"this kplan reads major version {_SUPPORTED_MAJOR}; upgrade kplan or re-create "
            "the file",
        )
    return version


def _get(d: Any, key: str, source: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise DataFileError(
            f"{source}: missing field '{where}{key}'",
            hint="see `kplan profile --help` for the format",
        )
    return d[key]


# Upper bounds of the fields a user file may set: far beyond any real job, small enough that
# no search or sum over them runs away (a profile claiming 10**7 nodes is a typo, not a plan).
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_WORKERS = MAX_NODES * MAX_GPUS_PER_NODE
MAX_BATCH = 2**24  # samples in one (local or global) batch
MAX_SAMPLES = 2**53 - 1  # dataset size
MAX_EPOCHS = 1e6
MAX_SECONDS = 1e7  # one step
MAX_BYTES = 1e14  # gradient bytes
MAX_GB = 1e6  # memory figures
MAX_TFLOPS = 1e6  # measured device throughput (also GB/s of bandwidth)
MAX_NOISE_SCALE = 1e15
MAX_DISTINCT_SHAPES = 4096  # distinct parameter shapes recorded in model.gradient_shapes
MAX_PARAMETER_TENSORS = 1_000_000  # parameter tensors in all (the sum of the counts)
MAX_DIMS = 8
MAX_CODEC_OPTIONS = 32


def _num(
    value: Any, source: str, name: str, *, positive: bool = True, upper: float = 1e15
) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, int) and abs(value) >= 2**53)
        or not math.isfinite(value)
    ):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise DataFileError(
            f"{source}: '{name}' must be a number (finite), got {shown}", hint="fix the file"
        )
    if positive and value <= 0:
        raise DataFileError(f"{source}: '{name}' must be > 0, got {value!r}", hint="fix the file")
    if not positive and value < 0:
        raise DataFileError(f"{source}: '{name}' must be >= 0, got {value!r}", hint="fix the file")
    if value > upper:
        raise DataFileError(
            f"{source}: '{name}' = {value!r} is more than {upper:g}", hint="fix the file"
        )
    return float(value)


def _str(value: Any, source: str, name: str) -> str | None:
    if value is None or (isinstance(value, str) and len(value) <= 256):
        return value
    raise DataFileError(
        f"{source}: '{name}' must be a short string, got {type(value).__name__}",
        hint="fix the file",
    )


def _int(value: Any, source: str, name: str, upper: float = MAX_SAMPLES) -> int:
    number = _num(value, source, name, upper=upper)
    if number != int(number):
        raise DataFileError(
            f"{source}: '{name}' must be an integer, got {value!r}", hint="fix the file"
        )
    return int(number)


def measurement_from_dict(row: Any, source: str, index: int) -> Measurement:
    where = f"measurements[{index}]."
    try:
        sync = row.get("sync_time") if isinstance(row, dict) else None
        return Measurement(
            nodes=_int(_get(row, "nodes", source, where), source, where + "nodes", MAX_NODES),
            workers=_int(
                _get(row, "workers", source, where), source, where + "workers", MAX_WORKERS
            ),
            local_batch=_int(
                _get(row, "local_batch", source, where), source, where + "local_batch", MAX_BATCH
            ),
            step_time=_num(
                _get(row, "step_time", source, where),
                source,
                where + "step_time",
                upper=MAX_SECONDS,
            ),
            sync_time=None
            if sync is None
            else _num(sync, source, where + "sync_time", positive=False, upper=MAX_SECONDS),
            accum_steps=_int(row.get("accum_steps", 1), source, where + "accum_steps", MAX_BATCH),
            instance_type=_str(row.get("instance_type"), source, where + "instance_type"),
            gpu=_str(row.get("gpu"), source, where + "gpu"),
        )
    except ValueError as err:
        raise DataFileError(f"{source}: {where[:-1]}: {err}", hint="fix the measurement") from None


def profile_from_dict(doc: Any, source: str = "profile") -> Profile:
    """Validate a parsed Profile document; raise DataFileError naming the bad field."""
    check_schema(doc, _PROFILE_KIND, source)
    device = _get(doc, "device", source, "")
    model = _get(doc, "model", source, "")
    batch = _get(doc, "batch", source, "")
    work = _get(doc, "work", source, "")
    rows = _get(doc, "measurements", source, "")
    if not isinstance(rows, list) or not rows:
        raise DataFileError(
            f"{source}: 'measurements' must be a non-empty list",
            hint="a profile needs at least one measured step time",
        )
    measurements = tuple(measurement_from_dict(r, source, i) for i, r in enumerate(rows))
    gns = doc.get("gns")
    gns_points = [] if gns is None else _gns_trajectory(gns, source)
    memory = doc.get("memory") or {}
    for section, value in (("device", device), ("memory", memory), ("gns", gns)):
        if value is not None and not isinstance(value, dict):
            raise DataFileError(f"{source}: '{section}' must be an object", hint="fix the file")
    if len(rows) > 100_000:
        raise DataFileError(f"{source}: more than 100,000 measurements", hint="fix the file")
    fit = doc.get("fit")
    if fit is not None and not isinstance(fit, dict):
        raise DataFileError(f"{source}: 'fit' must be an object", hint="remove it to refit")
    gpn = _int(
        _get(device, "gpus_per_node", source, "device."),
        source,
        "device.gpus_per_node",
        MAX_GPUS_PER_NODE,
    )
    base = _int(
        _get(batch, "base_global_batch", source, "batch."),
        source,
        "batch.base_global_batch",
        MAX_BATCH,
    )
    max_local = _int(
        _get(batch, "max_local_batch", source, "batch."), source, "batch.max_local_batch", MAX_BATCH
    )
    gpu = _get(device, "gpu", source, "device.")
    if not isinstance(gpu, str) or not gpu or len(gpu) > 64:
        raise DataFileError(f"{source}: 'device.gpu' must be a GPU name", hint='e.g. "T4"')
    prof = Profile(
        name=_str(doc.get("name", "profile"), source, "name") or "profile",
        provenance=str(doc.get("provenance", ""))[:4096],
        gpu=gpu,
        gpus_per_node=gpn,
        gradient_bytes=_num(
            _get(model, "gradient_bytes", source, "model."),
            source,
            "model.gradient_bytes",
            upper=MAX_BYTES,
        ),
        base_global_batch=base,
        max_local_batch=max_local,
        dataset_size=_int(_get(work, "dataset_size", source, "work."), source, "work.dataset_size"),
        epochs=_num(_get(work, "epochs", source, "work."), source, "work.epochs", upper=MAX_EPOCHS),
        measurements=measurements,
        gns=tuple(gns_points),
        cloud=_str(device.get("cloud"), source, "device.cloud"),
        instance_type=_str(device.get("instance_type"), source, "device.instance_type"),
        device_memory_gb=_opt(memory, "device_memory_gb", source, upper=MAX_GB),
        static_memory_gb=_opt(memory, "static_gb", source, upper=MAX_GB),
        per_sample_memory_gb=_opt(memory, "per_sample_gb", source, upper=MAX_GB),
        measured_fp32_tflops=_opt(device, "fp32_tflops", source, "device", MAX_TFLOPS),
        measured_mem_bw_gbs=_opt(device, "mem_bw_gbs", source, "device", MAX_TFLOPS),
        fit=fit,
        precision=_precision(doc.get("precision", DEFAULT_PRECISION), source),
        max_local_limit=_limit(batch.get("max_local_limit"), source),
        gradient_shapes=_shapes(model, source),
        codec=_codec(doc.get("codec_seconds"), source),
        forward_share=_share(model.get("forward_share"), source, "model.forward_share"),
        startup_s=_opt(device, "startup_s", source, "device", MAX_SECONDS),
        shutdown_s=_opt(device, "shutdown_s", source, "device", MAX_SECONDS),
        cpu_threads=_threads(device.get("cpu_threads"), source),
        opgraph=_opgraph(doc, source),
    )
    check_consistent(prof, source)
    return prof


def _opgraph(doc: dict[str, Any], source: str) -> OpGraph | None:
    """The profile's operator graph (1.4), or None; its reader is loaded only for one."""
    if doc.get("opgraph") is None:
        return None
    from kplan.planner.opgraph import opgraph_from_dict

    return opgraph_from_dict(doc["opgraph"], source)


def _gns_trajectory(gns: Any, source: str) -> list[GnsPoint]:
    """A profile's ``gns.trajectory``, checked point by point, in order of progress."""
    traj = _get(gns, "trajectory", source, "gns.")
    if not isinstance(traj, list):
        raise DataFileError(f"{source}: 'gns.trajectory' must be a list", hint="fix the file")
    points: list[GnsPoint] = []
    for i, point in enumerate(traj):
        progress = _num(
            _get(point, "progress", source, f"gns.trajectory[{i}]."),
            source,
            f"gns.trajectory[{i}].progress",
            positive=False,
        )
        if not 0.0 <= progress <= 1.0:
            raise DataFileError(
                f"{source}: gns.trajectory[{i}].progress={progress} is outside [0, 1]",
                hint="progress is the fraction of training done",
            )
        scale = _num(
            _get(point, "noise_scale", source, f"gns.trajectory[{i}]."),
            source,
            f"gns.trajectory[{i}].noise_scale",
            upper=MAX_NOISE_SCALE,
        )
        points.append(GnsPoint(progress, scale))
    points.sort(key=lambda p: p.progress)
    return points


def _share(value: Any, source: str, name: str) -> float | None:
    """An optional fraction strictly between 0 and 1."""
    if value is None:
        return None
    share = _num(value, source, name, upper=1.0)
    if share >= 1.0:
        raise DataFileError(
            f"{source}: '{name}' must be below 1, got {value!r}",
            hint="a share of the compute time, e.g. 0.33",
        )
    return share


def _shapes(model: dict[str, Any], source: str) -> tuple[tuple[Shape, int], ...] | None:
    """``model.gradient_shapes``: [[shape, count], ...], consistent with gradient_bytes."""
    value = model.get("gradient_shapes")
    if value is None:
        return None
    name = "model.gradient_shapes"
    hint = "a list of [[dim, ...], count] pairs (re-run `kplan profile`), or remove the field"
    if not isinstance(value, list) or not value or len(value) > MAX_DISTINCT_SHAPES:
        raise DataFileError(
            f"{source}: '{name}' must be a list of 1 to {MAX_DISTINCT_SHAPES} [shape, count] "
            f"pairs, got {_short(value)}",
            hint=hint,
        )
    out: list[tuple[Shape, int]] = []
    tensors, elements = 0, 0
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], list)):
            raise DataFileError(
                f"{source}: '{name}[{i}]' must be a [shape, count] pair, got {_short(pair)}",
                hint=hint,
            )
        if len(pair[0]) > MAX_DIMS:
            raise DataFileError(
                f"{source}: '{name}[{i}]' has {len(pair[0])} dimensions (at most {MAX_DIMS})",
                hint=hint,
            )
        shape = tuple(_int(d, source, f"{name}[{i}][0]", 2**31) for d in pair[0])
        count = _int(pair[1], source, f"{name}[{i}][1]", MAX_PARAMETER_TENSORS)
        tensors += count
        elements += math.prod(shape) * count
        out.append((shape, count))
    if tensors > MAX_PARAMETER_TENSORS:
        raise DataFileError(
            f"{source}: '{name}' counts {tensors} tensors (at most {MAX_PARAMETER_TENSORS})",
            hint=hint,
        )
    nbytes = _num(_get(model, "gradient_bytes", source, "model."), source, "model.gradient_bytes")
    if not elements <= nbytes <= 8 * elements:
        raise DataFileError(
            f"{source}: '{name}' hold {elements} elements, which does not match "
            f"model.gradient_bytes={nbytes:g} (1 to 8 bytes per element)",
            hint=hint,
        )
    return tuple(out)


def _codec(value: Any, source: str) -> CodecTimes | None:
    """``codec_seconds``: {"options": {spec: seconds}, "device": ..., "how": ...}."""
    if value is None:
        return None
    hint = 'e.g. {"options": {"fp16": 0.001}, "device": "cpu", "how": "..."}, or remove it'
    options = value.get("options") if isinstance(value, dict) else None
    if not isinstance(options, dict) or not options or len(options) > MAX_CODEC_OPTIONS:
        raise DataFileError(
            f"{source}: 'codec_seconds.options' must be an object of 1 to {MAX_CODEC_OPTIONS} "
            f"option: seconds, got {_short(options if isinstance(value, dict) else value)}",
            hint=hint,
        )
    seconds: dict[str, float] = {}
    for key, secs in options.items():
        try:
            spec = parse_compression(str(key)[:40], "codec_seconds.options").spec()
        except InputError as err:
            raise DataFileError(f"{source}: {err.message}", hint=err.hint) from None
        seconds[spec] = _num(
            secs, source, f"codec_seconds.options.{str(key)[:40]}", positive=False,
            upper=MAX_SECONDS,
        )  # fmt: skip
    device = _str(value.get("device", ""), source, "codec_seconds.device") or ""
    how = value.get("how", "")
    if not isinstance(how, str):
        raise DataFileError(f"{source}: 'codec_seconds.how' must be a string", hint=hint)
    return CodecTimes(tuple(seconds.items()), device, how[:4096])


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


MAX_LOCAL_LIMITS = ("oom", "memory", "sweep")


def _limit(value: Any, source: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value in MAX_LOCAL_LIMITS:
        return value
    raise DataFileError(
        f"{source}: 'batch.max_local_limit' {str(value)[:40]!r} is not one of "
        + ", ".join(MAX_LOCAL_LIMITS),
        hint="omit it, or re-run `kplan profile`",
    )


def _precision(value: Any, source: str) -> Precision:
    try:
        return check_precision(value, "precision")
    except InputError as err:
        raise DataFileError(f"{source}: {err.message}", hint=err.hint) from None


def _opt(
    d: dict[str, Any], key: str, source: str, section: str = "memory", upper: float = 1e15
) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    return _num(value, source, f"{section}.{key}", positive=False, upper=upper)


def _threads(value: Any, source: str) -> int | None:
    """``device.cpu_threads``: a positive integer, or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise DataFileError(
            f"{source}: device.cpu_threads must be an integer from 1 to 4096, got {value!r}",
            hint="the threads each profiled worker ran with (kplan profile writes it)",
        )
    return value


def profile_to_dict(p: Profile) -> dict[str, Any]:
    """The JSON document for a Profile (inverse of ``profile_from_dict``)."""
    doc: dict[str, Any] = {
        "schema": PROFILE_SCHEMA,
        "name": p.name,
        "provenance": p.provenance,
        "device": {"gpu": p.gpu, "gpus_per_node": p.gpus_per_node},
        "model": {"gradient_bytes": p.gradient_bytes},
        "batch": {"base_global_batch": p.base_global_batch, "max_local_batch": p.max_local_batch},
        "work": {"dataset_size": p.dataset_size, "epochs": p.epochs},
        "measurements": [
            {
                k: v
                for k, v in {
                    "nodes": m.nodes,
                    "workers": m.workers,
                    "local_batch": m.local_batch,
                    "step_time": m.step_time,
                    "sync_time": m.sync_time,
                    "accum_steps": m.accum_steps,
                    "instance_type": m.instance_type,
                    "gpu": m.gpu,
                }.items()
                if v is not None
            }
            for m in p.measurements
        ],
    }
    if p.precision != DEFAULT_PRECISION:
        doc["precision"] = p.precision
    if p.max_local_limit is not None:
        doc["batch"]["max_local_limit"] = p.max_local_limit
    if p.cloud:
        doc["device"]["cloud"] = p.cloud
    if p.instance_type:
        doc["device"]["instance_type"] = p.instance_type
    if p.measured_fp32_tflops is not None:
        doc["device"]["fp32_tflops"] = p.measured_fp32_tflops
    if p.measured_mem_bw_gbs is not None:
        doc["device"]["mem_bw_gbs"] = p.measured_mem_bw_gbs
    if p.startup_s is not None:
        doc["device"]["startup_s"] = p.startup_s
    if p.shutdown_s is not None:
        doc["device"]["shutdown_s"] = p.shutdown_s
    if p.cpu_threads is not None:
        doc["device"]["cpu_threads"] = p.cpu_threads
    memory = {
        k: v
        for k, v in {
            "device_memory_gb": p.device_memory_gb,
            "static_gb": p.static_memory_gb,
            "per_sample_gb": p.per_sample_memory_gb,
        }.items()
        if v is not None
    }
    if memory:
        doc["memory"] = memory
    if p.gns:
        doc["gns"] = {
            "trajectory": [{"progress": g.progress, "noise_scale": g.noise_scale} for g in p.gns]
        }
    if p.fit is not None:
        doc["fit"] = p.fit
    if p.gradient_shapes is not None:
        doc["model"]["gradient_shapes"] = [[list(s), n] for s, n in p.gradient_shapes]
    if p.forward_share is not None:
        doc["model"]["forward_share"] = p.forward_share
    if p.codec is not None:
        doc["codec_seconds"] = {
            "options": p.codec.as_dict(),
            "device": p.codec.device,
            "how": p.codec.how,
        }
    if p.opgraph is not None:
        doc["opgraph"] = p.opgraph.to_dict()
    return doc
