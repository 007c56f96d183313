"""GNS accuracy: the runtime's in-loop estimate against the exact noise scale.

Linear regression on 4096 seeded samples (noise 4, weights shifted by 0.3 from the seeded init),
global batch 64, learning rate 0 so the parameters, and hence the true noise scale, stay fixed;
4 epochs = 256 steps, GNS smoothing 0.99. The exact B_noise = tr(Σ)/|G|² comes from per-sample
gradients over the whole dataset (``torch.func.vmap(grad(...))``), in the Adam metric for the
Adam variant (with Adam's final second moments). Cases: 2 gloo workers with equal and unequal
(16 + 48) batches, SGD and Adam; one worker with 4 accumulation micro-batches; one worker with
consecutive steps; and repeats with other data-order seeds to show the estimator's spread.
(While training, B_noise grows as the loss falls, so an in-loop average cannot be compared with
the exact value at one point; hence the fixed parameters.)

    .venv/bin/python bench/runtime_gns.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runtime_common import clean_env, python, torchrun
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


def main() -> None:
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
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
