"""GNS accuracy: the runtime's in-loop estimate against the exact noise scale.

Part 1 (the original cases). Linear regression on 4096 seeded samples (noise 4, weights
shifted by 0.3 from the seeded init), global batch 64, learning rate 0 so the parameters, and
hence the true noise scale, stay fixed; 4 epochs = 256 steps, GNS smoothing 0.99. The exact
B_noise = tr(Σ)/|G|² comes from per-sample gradients over the whole dataset
(``torch.func.vmap(grad(...))``), in the Adam metric for the Adam variant (with Adam's final
second moments). Cases: 2 gloo workers with equal and unequal (16 + 48) batches, SGD and Adam;
one worker with 4 accumulation micro-batches; one worker with consecutive steps; and repeats
with other data-order seeds to show the estimator's spread. Here B_noise ~ 50 << N.

Part 2 (issue 13: a small set with a large noise scale). 2,048 samples (noise 1), a linear
model held 0.18 from the least-squares fit: exact B_noise ~ 560 > N/5, where batches drawn
without replacement matter. This file's own ``worker`` mode runs it, also feeding an estimator
without the finite-set correction (the one before issue 13) with the same samples. Fixed
parameters (learning rate 0), global batch 64 or 256, smoothing 0.99 or 0.999, data-order seeds
0 to ``--seeds``-1: the corrected and uncorrected ratios to exact and the estimator's reported
relative standard error (``GnsEstimator.rel_error``). Then two training runs (learning rate
2e-4 from 0.4 off the fit: the noise scale grows ~5x over 2,048 steps) with the exact value at
every step, to separate the average's lag from the estimator's error: "window exact" is the
ratio of the same EMA weights applied to the exact tr(Σ)_t and |G|²_t (what the in-loop value
estimates), "end exact" the value at the last step.

    .venv/bin/python bench/runtime_gns.py            # ~5 min on the 2-core host
    .venv/bin/python bench/runtime_gns.py --seeds 2 --skip-part1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runtime_common import clean_env, python, run, torchrun
from kplan.runtime import env

BASE = ["--samples", "4096", "--batch", "64", "--init-shift", "0.3"]
BASE += ["--noise", "4", "--epochs", "4"]

CASES: list[tuple[str, int, list[str], dict[str, str]]] = [
    ("2 workers, SGD, equal 32+32", 2, [], {}),
    ("2 workers, SGD, unequal 16+48", 2, ["--max-local-rank0", "16"], {}),
    ("2 workers, Adam, equal 32+32", 2, ["--opt", "adam"], {}),
    ("2 workers, Adam, unequal 16+48", 2, ["--opt", "adam", "--max-local-rank0", "16"], {}),
    ("1 worker, SGD, 4 micro-batches of 16", 1, [], {env.ACCUM_STEPS: "4"}),
    ("1 worker, SGD, consecutive steps", 1, [], {}),
    ("1 worker, Adam, 4 micro-batches of 16", 1, ["--opt", "adam"], {env.ACCUM_STEPS: "4"}),
    *[(f"2 workers, SGD, equal, data seed {k}", 2, [], {env.SEED: str(k)}) for k in (1, 2, 3)],
    *[
        (f"2 workers, Adam, equal, data seed {k}", 2, ["--opt", "adam"], {env.SEED: str(k)})
        for k in (1, 2, 3)
    ],
]

# Part 2: (name, workers, accumulation micro-batches, global batch, epochs, smoothing).
SMALL_SET: list[tuple[str, int, int, int, int, float]] = [
    ("2 workers, B=64 (32+32), 0.99, 1,024 steps", 2, 1, 64, 32, 0.99),
    ("2 workers, B=64 (32+32), 0.999, 4,096 steps", 2, 1, 64, 128, 0.999),
    ("2 workers, B=256 (128+128), 0.99, 1,024 steps", 2, 1, 256, 128, 0.99),
    ("2 workers, B=256 (128+128), 0.999, 2,048 steps", 2, 1, 256, 256, 0.999),
    ("1 worker, B=256 (4 x 64), 0.999, 2,048 steps", 1, 4, 256, 256, 0.999),
]
TRAINING: list[tuple[str, float]] = [
    ("2 workers, B=256, lr 2e-4, 0.999, 2,048 steps", 0.999),
    ("2 workers, B=256, lr 2e-4, 0.99, 2,048 steps", 0.99),
]


def part1() -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, workers, extra_args, extra_env) in enumerate(CASES):
            out = Path(tmp) / f"{i}.json"
            args = [*BASE, "--lr", "0", *extra_args, "--gns-out", str(out)]
            environ = clean_env(**{env.PID: "0", env.LR_SCALING: "none", **extra_env})
            proc = torchrun(args, environ) if workers == 2 else python(args, environ)
            if proc.returncode:
                raise SystemExit(proc.stdout[-3000:])
            result = json.loads(out.read_text())
            est, exact = result["estimate"]["gns"], result["exact"]["gns"]
            rows.append({"case": name, "estimate": est, "exact": exact, "ratio": est / exact})
            print(f"{name:42s} estimate {est:8.2f}  exact {exact:8.2f}  ratio {est / exact:.3f}")
    return rows


def run_worker(workers: int, args: list[str], seed: int = 0) -> dict[str, Any]:
    """Run this file's worker mode (torchrun for 2 workers) and return what rank 0 wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gns.json"
        environ = clean_env(**{env.PID: "0", env.LR_SCALING: "none", env.SEED: str(seed)})
        full = ["worker", "--out", str(out), *args]
        script = Path(__file__).resolve()
        if workers == 2:
            proc = torchrun(full, environ, script=script, timeout=300)
        else:
            proc = run([sys.executable, str(script), *full], environ, timeout=300)
        if proc.returncode:
            raise SystemExit(proc.stdout[-3000:])
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def part2(seeds: int) -> list[dict[str, Any]]:
    rows = []
    for name, workers, accum, batch, epochs, smoothing in SMALL_SET:
        args = ["--batch", str(batch), "--epochs", str(epochs), "--smoothing", str(smoothing)]
        args += ["--accum", str(accum)]
        results = [run_worker(workers, args, seed) for seed in range(seeds)]
        exact = results[0]["exact"]["gns"]
        ratios = [r["estimate"]["gns"] / exact for r in results]
        plain = [r["uncorrected"]["gns"] / exact for r in results]
        errors = [r["estimate"]["rel_error"] for r in results]
        row = {
            "case": name,
            "exact": exact,
            "ratios": ratios,
            "uncorrected": plain,
            "rel_error": statistics.mean(errors),
            "sd_of_ratios": statistics.stdev(ratios) if len(ratios) > 1 else None,
        }
        rows.append(row)
        print(
            f"{name:48s} exact {exact:6.1f}  ratio {min(ratios):.3f}-{max(ratios):.3f}"
            f" (sd {row['sd_of_ratios'] or 0.0:.3f}, reported rel. error {row['rel_error']:.3f})"
            f"  uncorrected {min(plain):.3f}-{max(plain):.3f}"
        )
    for name, smoothing in TRAINING:
        args = ["--batch", "256", "--epochs", "256", "--smoothing", str(smoothing)]
        args += ["--offset", "0.4", "--lr", "2e-4", "--trace"]
        r = run_worker(2, args)
        est, window, end = r["estimate"]["gns"], r["window_exact"], r["exact"]["gns"]
        start = r["start_exact"]
        rows.append(
            {
                "case": name,
                "estimate": est,
                "rel_error": r["estimate"]["rel_error"],
                "window_exact": window,
                "end_exact": end,
                "start_exact": start,
                "uncorrected": r["uncorrected"]["gns"],
            }
        )
        print(
            f"{name:48s} exact {start:6.1f} -> {end:6.1f}; estimate {est:6.1f}"
            f" (rel. error {r['estimate']['rel_error']:.3f}): / window exact {window:6.1f} ="
            f" {est / window:.3f}, / end exact = {est / end:.3f};"
            f" uncorrected / window {r['uncorrected']['gns'] / window:.3f}"
        )
    return rows


def worker(argv: list[str]) -> None:
    """Part 2's job (also tests/test_runtime_gns_exact.py's): rank 0 writes the in-loop GNS,
    its reported error, the uncorrected estimator's value and the exact value (JSON)."""
    import torch
    import torch.nn.functional as F

    import kplan.runtime as kr
    from bench.runtime_worker import exact_noise_scale, make_data
    from kplan.runtime import step_end
    from kplan.runtime.gns import GnsEstimator, GnsSample, estimate

    p = argparse.ArgumentParser(prog="runtime_gns.py worker")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--noise", type=float, default=1.0)
    p.add_argument("--offset", type=float, default=0.18, help="distance from the LS fit")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=256)
    p.add_argument("--smoothing", type=float, default=0.999)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.0)
    p.add_argument("--trace", action="store_true", help="exact value at every step (rank 0)")
    args = p.parse_args(argv)

    ctx = kr.init()
    feats = args.features
    data = make_data(args.samples, feats, 0, args.noise)
    x, y = data.tensors
    design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    fit = torch.linalg.lstsq(design, y.double()).solution.reshape(-1)
    direction = torch.randn(feats + 1, generator=torch.Generator().manual_seed(1)).double()
    start = (fit + args.offset * direction / direction.norm()).float()
    model = torch.nn.Linear(feats, 1)
    with torch.no_grad():
        model.weight.copy_(start[:feats].reshape(1, feats))
        model.bias.copy_(start[feats:])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    config = kr.RuntimeConfig(gns_smoothing=args.smoothing, accum_steps=args.accum)
    job = kr.Job(model.to(ctx.device), opt, data, batch_size=args.batch, config=config)

    # The estimator before issue 13: the same samples without the finite-set correction.
    plain = GnsEstimator(args.smoothing)

    def both(
        local: list[float], batches: list[int], big: float, population: int | None = None
    ) -> GnsSample:
        plain.update(estimate(local, batches, big))
        return estimate(local, batches, big, population=population)

    patched: Any = step_end  # the runtime calls step_end.estimate for every sample
    patched.estimate = both
    trace: list[tuple[float, float]] = []
    first = exact_noise_scale(job.module, data) if ctx.rank == 0 else None
    micro = 0
    for _ in job.epochs(args.epochs):
        for xb, yb in job.batches():
            if args.trace and ctx.rank == 0 and micro % args.accum == 0:  # a step's parameters
                now = exact_noise_scale(job.module, data)
                trace.append((now["grad_sqr"], now["grad_var"]))
            micro += 1
            with job.step():
                job.backward(F.mse_loss(job.model(xb), yb))
    if ctx.rank == 0:
        gns = job._state.gns
        found = {"gns": gns.gns, "rel_error": gns.rel_error, "steps": gns.count}
        result: dict[str, Any] = {"estimate": found, "uncorrected": {"gns": plain.gns}}
        result["exact"] = exact_noise_scale(job.module, data)
        result["start_exact"] = first["gns"] if first else None
        if trace:
            # The EMA's weights over the steps: what the in-loop ratio estimates.
            beta, n = args.smoothing, len(trace)
            weights = [beta ** (n - 1 - t) for t in range(n)]
            sqr = sum(w * s for w, (s, _) in zip(weights, trace, strict=True))
            var = sum(w * v for w, (_, v) in zip(weights, trace, strict=True))
            result["window_exact"] = var / sqr
        args.out.write_text(json.dumps(result))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seeds", type=int, default=4, help="data-order seeds per part-2 case")
    p.add_argument("--skip-part1", action="store_true")
    args = p.parse_args()
    rows = [] if args.skip_part1 else part1()
    rows += part2(args.seeds)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
