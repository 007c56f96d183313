"""Where a compressed round is decoded on CPU: by the caller's thread against gloo's (issue 14).

On a CPU device the runtime decodes each compressed round (PowerSGD's decompression and its
error-feedback updates, top-k's scatter or sum of the gathered parts) on the thread that calls
``Compressor.reduce``: the next bucket's hook, or the step's last one, which waits for the
rounds still in flight (``Compressor.decodes_on_caller``). Before 2026-11-27 the decode was a
callback of the round's collective, which gloo runs on its own thread, competing for the
worker's cores with the main thread that compresses the next bucket.

This runs bench/comm_bed.py's model and worker on its 2-host bed at 1 Gbit/s (one worker per
emulated host, one thread each, PID off), each option with the decode on the caller and as a
callback (forced by patching that property in the worker), alternating run by run, and prints
per option and mode the median and mean step (after comm_bed's 3 warm-up steps) and the
caller/callback ratios of each pair of runs side by side.

    .venv/bin/python bench/cpu_decode.py              # as root, ~3 minutes
    .venv/bin/python bench/cpu_decode.py --reps 1 --steps 10   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODES = ("caller", "callback")


def worker(mode: str, steps: int, out: Path) -> None:
    """comm_bed's worker with the decode forced to ``mode``."""
    from bench import comm_bed
    from kplan.runtime.compression import compressor

    on = mode == "caller"
    compressor.Compressor.decodes_on_caller = property(  # type: ignore[method-assign]
        lambda self: on
    )
    comm_bed.worker(steps, out, 0.03, steps, 0)


def run(bed: Any, option: str, mode: str, steps: int, port: int, tmp: Path) -> list[float]:
    """Rank 0's step times of one run of ``option`` with the decode in ``mode``."""
    from bench.runtime_common import clean_env
    from scripts import netbed

    out = tmp / f"{option.replace(':', '_')}-{mode}.json"
    env = {"KPLAN_COMPRESSION": option, "KPLAN_PID": "0"}
    procs = []
    for i in range(2):
        script = [str(Path(__file__).resolve()), "--worker", mode, "--steps", str(steps)]
        cmd = bed.torchrun(i, port, [*script, "--out", str(out)])
        procs.append(bed.popen(i, cmd, env=bed.env(i, clean_env(**env)), cwd=str(REPO)))
    for i, p in enumerate(procs):
        r = netbed.wait(p, 600)
        if r.returncode != 0:
            raise RuntimeError(f"{option} ({mode}) on host {i} failed:\n{r.stdout[-3000:]}")
    times = json.loads(Path(f"{out}.rank0").read_text())["times"]
    return [float(t) for t in times]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=20, help="steps per run (3 of them warm-up)")
    ap.add_argument("--reps", type=int, default=3, help="pairs of runs per option")
    ap.add_argument(
        "--options", default="powersgd:4,topk:0.01:ar,topk:0.01:ag,fp16", help="comma-separated"
    )
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.out)
        return 0
    from bench.comm_bed import WARMUP
    from scripts import netbed

    why = netbed.unavailable()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    options = args.options.split(",")
    got: dict[tuple[str, str], list[list[float]]] = {(o, m): [] for o in options for m in MODES}
    port = 29650
    with (
        tempfile.TemporaryDirectory(prefix="kplan-cpu-decode-") as tmpdir,
        netbed.netbed(2, gbps=1.0) as bed,
    ):
        for rep in range(args.reps):
            for o in options:
                # alternate which mode goes first, so a drift of the load hits both alike
                for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                    got[(o, mode)].append(
                        run(bed, o, mode, args.steps, port, Path(tmpdir))[WARMUP:]
                    )
                    port += 1
    print(
        f"2 emulated hosts at 1 Gbit/s, comm_bed's MLP, {args.steps} steps a run "
        f"({WARMUP} warm-up), {args.reps} runs per option and mode, alternating"
    )
    print(f"{'option':<16}{'mode':<10}{'median s':>10}{'mean s':>9}   per run (median / mean)")
    for o in options:
        for mode in MODES:
            runs = got[(o, mode)]
            flat = [t for r in runs for t in r]
            each = ", ".join(f"{statistics.median(r):.3f}/{statistics.fmean(r):.3f}" for r in runs)
            print(
                f"{o:<16}{mode:<10}{statistics.median(flat):>10.3f}"
                f"{statistics.fmean(flat):>9.3f}   {each}"
            )
        pairs = zip(got[(o, "caller")], got[(o, "callback")], strict=True)
        ratios = [
            (statistics.median(a) / statistics.median(b), statistics.fmean(a) / statistics.fmean(b))
            for a, b in pairs
        ]
        print(
            f"{'':<16}caller/callback per pair (median, mean): "
            + ", ".join(f"{m:.2f}/{x:.2f}" for m, x in ratios)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
