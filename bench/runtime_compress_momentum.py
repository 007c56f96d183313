"""Top-k compression with momentum SGD (the momentum fold, runtime/momentum_fold.py): eval loss
after a fixed number of steps of each option against dense, on 2 local gloo workers.

The tests' regression MLP (16 -> H -> H -> 1, y = x·w + 0.5 noise, 3,072 samples, batch 64
split 16/48); one deterministic CPU run per row (one seed: the spread over seeds is not
measured). Prints eval loss and the ratio to the dense run of the same optimizer, LR and width.

    .venv/bin/python bench/runtime_compress_momentum.py [--steps 144] [--lr 0.01 0.05]
        [--hidden 32 128]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS = [
    ("topk:0.01:ag", "sgdm"),
    ("topk:0.05:ag", "sgdm"),
    ("topk:0.05:ar", "sgdm"),
    ("topk:0.01:ar", "sgdm"),
    ("topk:0.02:auto", "sgdm"),
    ("adaptive:0.01:0.2", "sgdm"),
    ("powersgd:1", "sgdm"),
    ("topk:0.02:ag", "nesterov"),
    ("topk:0.02:ar", "sgdm_wd"),
    ("topk:0.01:ag", "adam"),
    ("powersgd:1", "adam"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=144)
    ap.add_argument("--lr", type=float, nargs="+", default=[0.01, 0.05])
    ap.add_argument("--hidden", type=int, nargs="+", default=[32, 128])
    args = ap.parse_args()
    from bench.compress_momentum_scenario import run_scenario as _run

    print(f"eval loss after {args.steps} steps; ratio = option / dense (same optimizer, LR, H)")
    head = ["H", "lr", "optimizer", "option", "eval", "dense", "ratio"]
    print("{:>4} {:>6} {:10} {:20} {:>10} {:>8} {:>9}".format(*head))
    for hidden in args.hidden:
        for n, lr in enumerate(args.lr):
            rows = [(c, o) for c, o in ROWS if o != "adam" or n == 0]  # Adam: its own LR, once
            opts: list[str] = []
            for comp, opt in rows:
                flags = f"h={hidden}" + ("" if opt == "adam" else f"/lr={lr}")
                opts += [f"none/{opt}/{flags}", f"{comp}/{opt}/{flags}"]
            opts = list(dict.fromkeys(opts))
            with tempfile.TemporaryDirectory() as tmp:
                res, _ = _run(Path(tmp), opts, [f"b|{args.steps}|-"], timeout=900)
            r0 = res["b"][0]
            for comp, opt in rows:
                flags = f"h={hidden}" + ("" if opt == "adam" else f"/lr={lr}")
                got = r0[f"{comp}/{opt}/{flags}"]["eval_loss"]
                dense = r0[f"none/{opt}/{flags}"]["eval_loss"]
                shown = "0.003" if opt == "adam" else lr
                print(
                    f"{hidden:>4} {shown:>6} {opt:10} {comp:20} {got:>10.4g} {dense:>8.4g} "
                    f"{got / dense:>9.3g}"
                )


if __name__ == "__main__":
    main()
