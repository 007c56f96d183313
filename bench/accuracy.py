"""Step-time accuracy on the Pollux T4 traces: kplan's model against Pollux's, side by side.

Protocol (issue 2): fit on placements 1, 2, 4, 44 and 4444 at every batch size; predict every
other row of placements.csv and all of scalability.csv (6 to 16 nodes, up to 64 GPUs).

    python -m bench.accuracy
"""

from __future__ import annotations

import time

import numpy as np

from bench.pollux import fit_pollux, predict_pollux
from kplan.planner import perfmodel
from kplan.planner.fit import FitInputs, fit_perf_params
from kplan.planner.perfmodel import PerfParams
from scripts.traces import MODELS, Rows, mape, split


def fit_kplan(rows: Rows) -> PerfParams:
    return fit_perf_params(
        FitInputs(
            rows.nodes.astype(float),
            rows.workers.astype(float),
            rows.local_batch.astype(float),
            rows.step_time,
            np.minimum(rows.sync_time, rows.step_time),
            np.ones(len(rows)),
        )
    )


def main() -> None:
    print(
        f"{'model':12s} {'fit':>4s} {'test':>5s} | {'kplan':>6s} {'pollux':>6s} | "
        f"{'kplan plc':>9s} {'kplan scal':>10s} | {'pollux plc':>10s} {'pollux scal':>11s} | "
        "kplan fit ms"
    )
    means: dict[str, list[float]] = {"kplan": [], "pollux": []}
    for model in MODELS:
        fit_rows, test = split(model)
        t0 = time.perf_counter()
        params = fit_kplan(fit_rows)
        fit_ms = (time.perf_counter() - t0) * 1e3
        ours = perfmodel.step_time(params, test.nodes, test.workers, test.local_batch)
        theirs = predict_pollux(fit_pollux(fit_rows), test.nodes, test.workers, test.local_batch)
        scal = np.array([p.startswith("S") for p in test.placement])
        e_ours, e_theirs = mape(ours, test.step_time), mape(theirs, test.step_time)
        if model != "ncf":
            means["kplan"].append(e_ours)
            means["pollux"].append(e_theirs)
        print(
            f"{model:12s} {len(fit_rows):4d} {len(test):5d} | {e_ours:5.1f}% {e_theirs:5.1f}% | "
            f"{mape(ours[~scal], test.step_time[~scal]):8.1f}% "
            f"{mape(ours[scal], test.step_time[scal]):9.1f}% | "
            f"{mape(theirs[~scal], test.step_time[~scal]):9.1f}% "
            f"{mape(theirs[scal], test.step_time[scal]):10.1f}% | {fit_ms:6.0f}"
            + ("   (noise-dominated, reported only)" if model == "ncf" else "")
        )
    k, p = np.mean(means["kplan"]), np.mean(means["pollux"])
    print(
        f"mean MAPE over the five (ncf excluded): kplan {k:.1f}%  pollux {p:.1f}%  "
        f"ratio pollux/kplan {p / k:.2f}"
    )


if __name__ == "__main__":
    main()
