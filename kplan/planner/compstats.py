"""Gradient compression options as the planner reads them (``parse``) and their statistical
cost: the samples to the target with an option as a multiple of dense's, a documented prior
updated by measurements (``stat_for``). The time side is ``compression``'s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kplan.core import compression_spec as rc
from kplan.core.compression_spec import Compression
from kplan.core.errors import InputError


@dataclass(frozen=True)
class StatCost:
    """Samples to the target with the option, as a multiple of dense (>= 1 typically)."""

    multiplier: float
    log_sigma: float  # uncertainty of log(multiplier)
    source: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.multiplier) and self.multiplier > 0):
            raise InputError(
                f"statistical multiplier {self.multiplier!r} must be a number > 0",
                hint="samples to the target with compression / without, e.g. 1.05",
            )

    def updated(self, measured: float, log_sigma: float, what: str = "measured") -> StatCost:
        """Combine with a measured multiplier (inverse-variance weights in log space)."""
        if not (math.isfinite(measured) and measured > 0 and log_sigma > 0):
            raise InputError(
                f"measured multiplier {measured!r} (sigma {log_sigma!r}) is not usable",
                hint="a ratio of steps to the same loss > 0, with a log-space sigma > 0",
            )
        wp, wm = 1 / self.log_sigma**2, 1 / log_sigma**2
        mean = (wp * math.log(self.multiplier) + wm * math.log(measured)) / (wp + wm)
        return StatCost(math.exp(mean), (wp + wm) ** -0.5, f"{what} ({measured:.3g}) + prior")


def prior(c: Compression) -> StatCost:
    """The documented prior (with error feedback, as the runtime runs every lossy option).

    - fp16/bf16: 1.00 +- 2%: 16-bit gradient all-reduce (PyTorch's fp16/bf16 hooks) matches
      fp32 training; only the rounding of the summed gradient changes.
    - powersgd:r: 1 + 0.1/r +- 10%: Vogels et al. 2019 (NeurIPS) reach the SGD test accuracy in
      the same epochs at rank 2-4 (ResNet-18/CIFAR-10, LSTM/WikiText-2), rank 1 slightly below.
    - topk:x: 1 + 0.03 log10(1/x) +- 30% (``TOPK_PRIOR_SIGMA``): error-feedback top-k (Stich
      et al. 2018; Lin et al. 2018, DGC, 0.1% density at the baseline accuracy with momentum
      correction and warm-up) converges like SGD with a delay that grows as the ratio shrinks;
      without DGC's extras a few % more steps at 1%.
    """
    if c.kind == "none":
        return StatCost(1.0, 1e-3, "dense")
    if c.kind in ("fp16", "bf16"):
        return StatCost(1.0, 0.02, "prior (16-bit all-reduce)")
    if c.kind == "powersgd":
        return StatCost(1.0 + 0.1 / c.rank, 0.10, "prior (Vogels et al. 2019)")
    ratio = c.min_ratio if c.kind == "adaptive" else c.ratio
    return StatCost(1.0 + 0.03 * math.log10(1.0 / ratio), TOPK_PRIOR_SIGMA, "prior (EF top-k)")


TOPK_PRIOR_SIGMA = 0.30
"""Log-space uncertainty of top-k's prior multiplier. The literature's mean is for long runs; on
short ones the delay of error feedback weighs more. Measured with momentum-free SGD on the
emulated hosts (bench/comm_bed.py, 30-45 steps): x1.17 and x1.17 at ratio 0.05 (prior 1.04),
x1.33 and x1.50 at 0.01 (prior 1.06). At +-15% (until 2026-11-27) all four exceeded the p90
(1.26-1.28); at +-30% (p90 1.53-1.56) none does. Under Adam, where the runtime warns that
top-k ends far from dense, eight pairs read x1.32-2.10 at 0.05 (bench/statcost_pairs.py), 3
of them above this p90: measure such a job (``kplan report JOB --against DENSE``)."""


def stat_for(c: Compression, measured: Sequence[tuple[str, float, float]] = ()) -> StatCost:
    """The option's statistical cost: its prior, updated with a measurement ``(spec,
    multiplier, log_sigma)`` of the same option when one is given (e.g. from a job's curves)."""
    stat = prior(c)
    for spec, multiplier, log_sigma in measured:
        if parse(spec).spec() == c.spec():
            stat = stat.updated(multiplier, log_sigma)
    return stat


MEASURED_SIGMA = 0.2
"""Log-space uncertainty of a measured samples multiplier given without one: one pair of runs
(``kplan report JOB --against DENSE``). Eight pairs of the example MLP on two local workers (data
seeds 0-7; bench/statcost_pairs.py) spread by a log sd of 0.18 for topk:0.05:ag under Adam
(x1.32-2.10) and 0.05 for powersgd:4 (x1.07-1.23); this is the larger, rounded up. Several
pairs: give their geometric mean with sd / sqrt(pairs). docs/benchmarks.md."""
# A measured multiplier outside these measured something else than the compression (another
# model, data or learning rate): the eight pairs above read x1.07-2.10, and a run that needs a
# tenth of dense's samples or 100 x them would price the job at a tenth or 100 x.
MIN_MEASURED_MULT = 0.1
MAX_MEASURED_MULT = 100.0
# A smaller measured log-space sigma claims a precision no run of seeds gives, and squared
# below ~1e-154 it is 0 (a division by zero in the cost's spread).
MIN_MEASURED_SIGMA = 0.01


def parse_measured(text: str, where: str = "--compression-steps") -> tuple[str, float, float]:
    """``SPEC=MULT[/SIGMA]``: an option's measured samples (steps) to the same loss as a
    multiple of dense, and its log-space sigma (default ``MEASURED_SIGMA``)."""
    hint = "e.g. topk:0.01=1.3 (1.3x dense's steps to the same loss) or powersgd:4=1.05/0.05"
    malformed = InputError(f"{where} {text[:60]!r} is not SPEC=MULT[/SIGMA]", hint=hint)
    spec, eq, value = text.partition("=")
    mult, slash, sig = value.partition("/")
    if not eq or not spec:
        raise malformed
    try:
        multiplier = float(mult)
        sigma = float(sig) if slash else MEASURED_SIGMA
    except ValueError:
        raise malformed from None
    if not (math.isfinite(multiplier) and MIN_MEASURED_MULT <= multiplier <= MAX_MEASURED_MULT):
        raise InputError(
            f"{where} {text[:60]!r}: MULT must be in [{MIN_MEASURED_MULT:g}, "
            f"{MAX_MEASURED_MULT:g}] (the option's steps to dense's loss over dense's)",
            hint=hint,
        )
    if not (math.isfinite(sigma) and MIN_MEASURED_SIGMA <= sigma <= 5):
        raise InputError(
            f"{where} {text[:60]!r}: SIGMA must be in [{MIN_MEASURED_SIGMA:g}, 5]", hint=hint
        )
    return parse(spec, where).spec(), multiplier, sigma


def parse(text: str, where: str = "--compression") -> Compression:
    """An option as the runtime parses it (adaptive has no fixed price: refused here)."""
    c = rc.parse_compression(text, where)
    if c.kind == "adaptive":
        raise InputError(
            f"{where}={text!r}: adaptive changes its ratio during training and has no fixed price",
            hint="plan a fixed option (e.g. topk:0.01) and run adaptive with KPLAN_COMPRESSION",
        )
    return c
