"""How well kplan's GNS forecast predicts the steps to train at each batch (issue 13).

    python -m bench.gns_forecast               # all six Pollux models
    python -m bench.gns_forecast --quick       # cifar10 only, fewer samples (for the test)
    python -m bench.gns_forecast --fit-prior   # print the prior fitted on all six (PRIOR)

Truth: the shared Pollux validation curves (../shared/data/traces/pollux/t4/<model>/
validation-<B>.csv), one training run per global batch B, each trained to the same base-batch
progress ``P`` (the last progress of the B0 run) with AdaScale, so they end at the same accuracy
within noise. **Measured**: the base-batch steps (optimizer steps x B / B0) the B run took to
reach ``P``, read from its ``iteration`` column at progress ``P``. **Metric target**: the first
row of the B run whose metric is at least as good as the B0 run's final metric (higher is better,
lower for WER and loss); ``-`` where it never gets there (most large batches end a little short).

Prediction, from the first 10% of progress only (the rows with ``progress <= 0.1 P``; bert's
first row is at 50%, ncf's at 10%: then the first row alone), with a prior fitted on the other
five models (leave one model out; ``planner.gnsforecast.fit_prior``):

- ``own``: a job running at batch B forecasts its own GNS (validation-<B>.csv's first 10%) and
  predicts its base-batch steps to ``P`` (what the online re-planner knows).
- ``from B0``: a job at B0 forecasts (validation-<B0>.csv's first 10%) and predicts the steps at
  each larger B (what a profile at B0 knows). The runs at larger batches measure a larger noise
  scale at the same progress on some models (cifar10, imagenet, bert: x1.4 to x24) and not on
  others (yolov3, deepspeech2 after 10%; ncf less): ``+batch`` adds the exponent g of
  ``Bn(B) = Bn(B0) (B/B0)^g`` fitted on the other models, as a check of how much that explains.
- baseline ``const``: Pollux's planning, the points measured up to 10% as they are, then the
  last one held to the end.

Errors are predicted / measured - 1; ``p90 ok`` counts curves whose measured steps are at most
the forecast's p90.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kplan.planner import gnsforecast
from kplan.planner.gnsforecast import GnsPrior
from kplan.planner.profile import GnsPoint
from scripts.traces import MODELS, data_root

LOWER_IS_BETTER = {"deepspeech2", "yolov3"}
CUT = 0.1


@dataclass(frozen=True)
class Curve:
    model: str
    batch: int
    base_batch: int
    progress: np.ndarray  # base-batch steps
    iteration: np.ndarray
    metric: np.ndarray
    gns: tuple[GnsPoint, ...]  # progress as a fraction of the B0 run's last progress


def load_model(model: str, root: Path | None = None) -> list[Curve]:
    folder = (root or data_root()) / "traces" / "pollux" / "t4" / model
    files = sorted(folder.glob("validation-*.csv"), key=lambda f: int(f.stem.split("-")[1]))
    b0 = int(files[0].stem.split("-")[1])
    out: list[Curve] = []
    total = 0.0
    for f in files:
        with f.open() as fh:
            rows = list(csv.DictReader(fh))
        col = {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}
        if not out:
            total = float(col["progress"][-1])
        gns = tuple(
            GnsPoint(min(p / total, 1.0), b0 * v / s)
            for p, s, v in zip(col["progress"], col["grad_sqr"], col["grad_var"], strict=True)
            if s > 0 and v > 0
        )
        out.append(
            Curve(
                model,
                int(f.stem.split("-")[1]),
                b0,
                col["progress"],
                col["iteration"],
                col["metric"],
                gns,
            )
        )
    return out


def all_curves(root: Path | None = None) -> dict[str, list[Curve]]:
    return {m: load_model(m, root) for m in MODELS}


def prior_without(curves: dict[str, list[Curve]], model: str | None) -> GnsPrior:
    kept = [c for m, cs in curves.items() if m != model for c in cs]
    return gnsforecast.fit_prior([c.gns for c in kept], [c.model for c in kept], cut=CUT)


def batch_exponent(curves: dict[str, list[Curve]], model: str | None) -> float:
    """g in Bn(B) = Bn(B0) (B/B0)^g: least squares through 0 of the median log ratio of each
    larger-batch curve to its B0 curve (progress 0.1 to 1) against log(B/B0), other models."""
    grid = np.linspace(CUT, 1.0, 37)
    num = den = 0.0
    for m, cs in curves.items():
        if m == model:
            continue
        b0 = cs[0]
        l0 = np.interp(grid, [g.progress for g in b0.gns], np.log([g.noise_scale for g in b0.gns]))
        for c in cs[1:]:
            lb = np.interp(
                grid, [g.progress for g in c.gns], np.log([g.noise_scale for g in c.gns])
            )
            s = math.log(c.batch / c.base_batch)
            num += float(np.median(lb - l0)) * s
            den += s * s
    return num / den if den else 0.0


def head(gns: Sequence[GnsPoint]) -> tuple[GnsPoint, ...]:
    """The points of the first ``CUT`` of progress (the first point if there is none)."""
    early = tuple(g for g in gns if g.progress <= CUT + 1e-9)
    return early or (gns[0],)


def measured_steps(c: Curve, total: float) -> float:
    """Base-batch steps the run at ``c.batch`` took to reach progress ``total``."""
    return float(np.interp(total, c.progress, c.iteration)) * c.batch / c.base_batch


def metric_steps(b0: Curve, c: Curve) -> tuple[float, float] | None:
    """(B0 progress where B0 first reached its final metric, c's base-batch steps to reach it)."""
    sign = -1.0 if b0.model in LOWER_IS_BETTER else 1.0
    target = sign * b0.metric[-1]
    hit0 = np.flatnonzero(sign * b0.metric >= target)
    hit = np.flatnonzero(sign * c.metric >= target)
    if not len(hit):
        return None
    return float(b0.progress[hit0[0]]), float(c.iteration[hit[0]]) * c.batch / c.base_batch


@dataclass(frozen=True)
class Row:
    model: str
    batch: int
    measured: float
    own: float
    own_p90: float
    own_const: float
    b0: float
    b0_p90: float
    b0_batch: float  # with the batch exponent
    b0_const: float
    metric_measured: float | None
    metric_own: float | None


def predict(
    points: Sequence[GnsPoint],
    b0: int,
    batch: int,
    total: float,
    prior: GnsPrior,
    target: float = 1.0,
    n: int = 256,
    scale: float = 1.0,
) -> tuple[float, float]:
    """(median, p90) base-batch steps at ``batch`` to reach ``target`` (fraction of ``total``)."""
    pts = [GnsPoint(g.progress, g.noise_scale * scale) for g in points]
    mean, p90 = gnsforecast.steps_to_target(
        pts, b0, [batch], base_steps=total, target=target, prior=prior, n=n
    )
    return float(mean[0]) * batch / b0, float(p90[0]) * batch / b0


def constant(points: Sequence[GnsPoint], b0: int, batch: int, total: float) -> float:
    """Pollux-style: the points as measured up to 10%, then the last one held to the end."""
    grid = np.linspace(0.0, 1.0, 401)
    bn = np.interp(grid, [g.progress for g in points], [g.noise_scale for g in points])
    return total * float(np.trapezoid((bn + batch) / (bn + b0), grid))


def evaluate(curves: dict[str, list[Curve]], models: Sequence[str], n: int = 256) -> list[Row]:
    rows: list[Row] = []
    for m in models:
        cs = curves[m]
        prior = prior_without(curves, m)
        g = batch_exponent(curves, m)
        base = cs[0]
        total = float(base.progress[-1])
        h0 = head(base.gns)
        for c in cs[1:]:
            hc = head(c.gns)
            own, own_p90 = predict(hc, c.base_batch, c.batch, total, prior, n=n)
            b0, b0_p90 = predict(h0, c.base_batch, c.batch, total, prior, n=n)
            b0g, _ = predict(h0, c.base_batch, c.batch, total, prior, n=n,
                             scale=(c.batch / c.base_batch) ** g)  # fmt: skip
            met = metric_steps(base, c)
            met_own = None
            if met is not None and met[0] / total > max(g.progress for g in hc):
                met_own = predict(hc, c.base_batch, c.batch, total, prior, target=met[0] / total,
                                  n=n)[0]  # fmt: skip
            rows.append(
                Row(
                    m,
                    c.batch,
                    measured_steps(c, total),
                    own,
                    own_p90,
                    constant(hc, c.base_batch, c.batch, total),
                    b0,
                    b0_p90,
                    b0g,
                    constant(h0, c.base_batch, c.batch, total),
                    None if met is None else met[1],
                    met_own,
                )
            )
    return rows


def _e(pred: float, meas: float) -> str:
    return f"{pred / meas - 1:+7.1%}"


def print_table(rows: Sequence[Row]) -> None:
    print(
        f"{'model':11s} {'B':>6s} {'measured':>9s} | {'own':>7s} {'p90 ok':>6s} {'const':>7s} | "
        f"{'from B0':>7s} {'p90 ok':>6s} {'+batch':>7s} {'const':>7s} | {'metric':>9s} {'own':>7s}"
    )
    for r in rows:
        met = "-" if r.metric_measured is None else f"{r.metric_measured:9.0f}"
        met_e = (
            "-"
            if r.metric_measured is None or r.metric_own is None
            else _e(r.metric_own, r.metric_measured)
        )
        print(
            f"{r.model:11s} {r.batch:6d} {r.measured:9.0f} | {_e(r.own, r.measured)} "
            f"{'yes' if r.measured <= r.own_p90 else 'no':>6s} {_e(r.own_const, r.measured)} | "
            f"{_e(r.b0, r.measured)} {'yes' if r.measured <= r.b0_p90 else 'no':>6s} "
            f"{_e(r.b0_batch, r.measured)} {_e(r.b0_const, r.measured)} | {met:>9s} {met_e:>7s}"
        )

    def summary(name: str, preds: list[float]) -> str:
        errs = np.array([abs(p / r.measured - 1) for p, r in zip(preds, rows, strict=True)])
        within = int(np.sum(errs <= 0.2))
        return (
            f"{name}: {within}/{len(rows)} within 20%, mean |err| {errs.mean():.1%}, "
            f"max {errs.max():.1%}"
        )

    print(summary("own forecast  ", [r.own for r in rows]))
    print(summary("own constant  ", [r.own_const for r in rows]))
    print(summary("B0 forecast   ", [r.b0 for r in rows]))
    print(summary("B0 +batch exp.", [r.b0_batch for r in rows]))
    print(summary("B0 constant   ", [r.b0_const for r in rows]))
    own90 = sum(r.measured <= r.own_p90 for r in rows)
    b090 = sum(r.measured <= r.b0_p90 for r in rows)
    print(f"measured <= p90: own {own90}/{len(rows)}, from B0 {b090}/{len(rows)}")
    mets = [r for r in rows if r.metric_measured is not None and r.metric_own is not None]
    if mets:
        e = np.array([abs(r.metric_own / r.metric_measured - 1) for r in mets])  # type: ignore[operator]
        print(
            f"metric target (reached on {len(mets)} curves): own forecast "
            f"{int(np.sum(e <= 0.2))}/{len(mets)} within 20%, mean |err| {e.mean():.1%}"
        )


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--quick", action="store_true", help="cifar10 only, 64 samples")
    parser.add_argument("--fit-prior", action="store_true", help="print the prior of all six")
    args = parser.parse_args(argv)
    curves = all_curves()
    if args.fit_prior:
        print(prior_without(curves, None))
        print(f"batch exponent (all six): {batch_exponent(curves, None):.3f}")
        return []
    models = ["cifar10"] if args.quick else list(args.models)
    rows = evaluate(curves, models, n=64 if args.quick else 256)
    print_table(rows)
    return rows


if __name__ == "__main__":
    main()
