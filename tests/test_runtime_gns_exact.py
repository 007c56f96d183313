"""The in-loop GNS against the exact noise scale on a small data set (issue 13, acceptance).

A linear regression on 2,048 seeded samples, held at fixed parameters near the least-squares fit
(learning rate 0: the estimate then refers to exactly the parameters the exact value is computed
at; while training the noise scale drifts and an average lags it, which is a different question
than the estimator's accuracy). The offset from the fit puts the exact noise scale at ~500, over
N/5 = 410, where batches drawn without replacement bias the uncorrected estimate by about
1/(1 - B_noise/N) = 1.3x. The exact value is tr(Σ)/|G|² from ``torch.func`` per-sample gradients
over the whole set (``bench/runtime_worker.py:exact_noise_scale``).

The global batch is 256 (8 steps an epoch) and the smoothing 0.998 over 1,024 steps: at B = 64
one step's |G|² sample has a relative sd of ~4 (runtime/gns.py, "Precision"), and no average of
a test's length is within 10% reliably; at 256 it is ~1 and the average's standard error ~3%.
The worker also keeps an estimator fed without the finite-set correction (the estimator before
issue 13), which the same bound must reject.

Each test runs real worker processes (this file's ``__main__``), bounded by a timeout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.runtime_common import clean_env, run, torchrun
from kplan.runtime import env

pytestmark = pytest.mark.slow

SAMPLES, FEATURES, NOISE = 2048, 16, 1.0
OFFSET = 0.18  # distance of the parameters from the least-squares fit: B_noise ~ 500
BATCH, EPOCHS, SMOOTHING = 256, 256, 0.999


def _check(result: dict[str, dict[str, float]]) -> None:
    exact = result["exact"]["gns"]
    assert exact >= SAMPLES / 5, result  # the regime the acceptance names
    assert result["estimate"]["steps"] == EPOCHS * SAMPLES // BATCH, result
    ratio = result["estimate"]["gns"] / exact
    # The estimator's own standard error (from its samples) is small enough that the 10% bound
    # is not luck: ~3% here, so 10% is over 3 standard errors.
    rel_error = result["estimate"]["rel_error"]
    assert 0.01 < rel_error < 0.04, result
    assert abs(ratio - 1.0) <= 0.10, result
    assert abs(ratio - 1.0) <= 3.5 * rel_error, result
    # The same bound rejects the estimator without the finite-set correction (it reads high
    # by about 1/(1 - B_noise/N)).
    plain = result["uncorrected"]["gns"] / exact
    assert plain > 1.10, result
    assert plain == pytest.approx(1.0 / (1.0 - exact / SAMPLES), rel=0.08), result


def test_two_workers_in_loop_gns_within_10_percent_of_exact(tmp_path: Path) -> None:
    out = tmp_path / "gns.json"
    environ = clean_env(**{env.PID: "0", env.LR_SCALING: "none"})
    proc = torchrun(["scenario", str(out), "1"], environ, script=Path(__file__), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    _check(json.loads(out.read_text()))


def test_one_worker_micro_batches_in_loop_gns_within_10_percent_of_exact(tmp_path: Path) -> None:
    out = tmp_path / "gns.json"
    environ = clean_env(**{env.LR_SCALING: "none"})
    proc = run([sys.executable, __file__, "scenario", str(out), "4"], environ, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    _check(json.loads(out.read_text()))


def _scenario(out: Path, accum: int) -> None:
    """Train at learning rate 0 with the runtime; rank 0 writes the estimates and the exact."""
    import torch
    import torch.nn.functional as F

    import kplan.runtime as kr
    from bench.runtime_worker import exact_noise_scale, make_data
    from kplan.runtime import step_end
    from kplan.runtime.gns import GnsEstimator, GnsSample, estimate

    ctx = kr.init()
    data = make_data(SAMPLES, FEATURES, 0, NOISE)
    x, y = data.tensors
    design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    fit = torch.linalg.lstsq(design, y.double()).solution.reshape(-1)
    direction = torch.randn(FEATURES + 1, generator=torch.Generator().manual_seed(1)).double()
    start = (fit + OFFSET * direction / direction.norm()).float()
    model = torch.nn.Linear(FEATURES, 1)
    with torch.no_grad():
        model.weight.copy_(start[:FEATURES].reshape(1, FEATURES))
        model.bias.copy_(start[FEATURES:])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    config = kr.RuntimeConfig(gns_smoothing=SMOOTHING, accum_steps=accum)
    job = kr.Job(model.to(ctx.device), opt, data, batch_size=BATCH, config=config)

    # The estimator before issue 13: the same samples without the finite-set correction.
    plain = GnsEstimator(SMOOTHING)

    def both(
        local: list[float], batches: list[int], big: float, population: int | None = None
    ) -> GnsSample:
        plain.update(estimate(local, batches, big))
        return estimate(local, batches, big, population=population)

    patched: Any = step_end  # the runtime calls step_end.estimate for every sample
    patched.estimate = both
    for _ in job.epochs(EPOCHS):
        for xb, yb in job.batches():
            with job.step():
                job.backward(F.mse_loss(job.model(xb), yb))
    if ctx.rank == 0:
        gns = job._gns
        found = {"gns": gns.gns, "rel_error": gns.rel_error, "steps": gns.count}
        result: dict[str, Any] = {"estimate": found, "uncorrected": {"gns": plain.gns}}
        result["exact"] = exact_noise_scale(job.module, data)
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1] == "scenario":
        _scenario(Path(sys.argv[2]), int(sys.argv[3]))
