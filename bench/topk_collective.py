"""AR-Topk against AG-Topk on emulated hosts, and ``topk:auto``'s choice (issue 14).

On a bed of 2 or 4 emulated hosts (scripts/netbed.py) at 0.1, 1 and 10 Gbit/s, one process per
host exchanges a top-k gradient of bench/comm_bed.py's MLP (15.7M parameters, in DDP's 25 MB
buckets) with the collectives the runtime issues per bucket (runtime/compression/compressor.py):

- AR: the designated worker's int32 indices broadcast (waited for), then an all-reduce of the
  FP32 values at those indices (asynchronous);
- AG: an all-gather of each worker's FP32 values and one of its int32 indices (asynchronous);

and waits for all of them and decodes each bucket (AR: the scatter of the reduced values; AG:
the sum of the gathered parts), as the step does: ``runtime.compression.probe.probe_topk_exchange``,
the runtime's own start-up probe, run for ``--reps`` pairs. Its indices are random, so the
selection is left out: it is the same on either collective's critical path on real hosts,
while on this bed the hosts share 2 cores and AG's concurrent selections would compete for
them (AR runs one). AR and AG alternate, each timed
from a barrier to the last worker's end (the MAX over the workers). The faster one is the one
slower in fewer pairs, by a two-sided sign test at 5% over the pairs; otherwise the two tie.

``topk:auto``'s choice is the runtime's own, made on the same bed before the pairs: the same
probe with its own stopping rule (6 to 16 pairs, stopped where the sign test decides; the
faster so decided, else, "?", the one of the lower median, ``TopkExchange.choice``).
Beside it, the cost model's choice (``compress.topk_collective`` on the link probed by
``runtime.compression.probe.probe_network``, timed 1-element and 4 MB all-reduces read by
``compress.link_from_probe``), which the runtime falls back on at other ratios. Each row uses
a new bed.

    python bench/topk_collective.py           # as root; ~2 minutes
    python bench/topk_collective.py --hosts 2 --ratios 0.01 --gbps 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def buckets() -> list[int]:
    """Elements per DDP bucket of the MLP's FP32 gradient (DDP's default 25 MiB buckets)."""
    from bench.comm_bed import make_model
    from kplan.core.compression_spec import exchange_buckets

    return exchange_buckets([p.numel() for p in make_model().parameters()])


def worker(rank: int, world: int, addr: str, port: int, ratio: float, reps: int) -> None:
    """One host's process: the runtime's start-up probes (``auto``'s inputs), then AR and AG
    timed in pairs."""
    import torch
    import torch.distributed as dist

    from kplan.core.compression_spec import topk_collective
    from kplan.runtime.compression.probe import probe_network, probe_topk_exchange
    from kplan.runtime.distributed import Context

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    cpu = torch.device("cpu")
    ctx = Context(rank=rank, world_size=world, local_rank=0, device=cpu, backend="gloo")
    sizes = buckets()
    bw, lat = probe_network(ctx)
    cost = topk_collective(sum(sizes), ratio, world, bw, lat)
    probe = probe_topk_exchange(ctx, sizes, ratio)  # the runtime's: 6-16 pairs
    measured = probe_topk_exchange(ctx, sizes, ratio, pairs=reps, max_pairs=reps)  # reps
    if rank == 0:
        print(
            json.dumps(
                {
                    "ar": measured.ar_s,
                    "ag": measured.ag_s,
                    "ar_wins": measured.ar_wins,
                    "pairs": measured.pairs,
                    "bandwidth": bw,
                    "latency": lat,
                    "auto": probe.choice or cost.choice,  # Compressor.collective's rule
                    "probe": f"{probe.ar_wins}/{probe.pairs}" + ("" if probe.decided else "?"),
                    "model": cost.choice,
                    "ar_s": cost.ar_s,
                    "ag_s": cost.ag_s,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def measure(hosts: int, gbps: float, ratio: float, reps: int, port: int) -> dict[str, Any]:
    from scripts import netbed

    with netbed.netbed(hosts, gbps=gbps) as bed:
        args = [str(hosts), bed.hosts[0].ip, str(port), str(ratio), str(reps)]
        procs = [
            bed.popen(
                i,
                [sys.executable, str(Path(__file__).resolve()), "--worker", str(i), *args],
                env=bed.env(i),
                cwd=str(REPO),
            )
            for i in range(hosts)
        ]
        outs = [netbed.wait(p, 900) for p in procs]
    for i, out in enumerate(outs):
        if out.returncode != 0:
            raise RuntimeError(f"host {i} failed:\n{out.stdout[-3000:]}")
    doc: dict[str, Any] = json.loads(outs[0].stdout.strip().splitlines()[-1])
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--gbps", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.001])
    ap.add_argument("--reps", type=int, default=15, help="AR/AG pairs per setting")
    args = ap.parse_args(argv)
    if args.worker:
        r, w, addr, port, ratio, reps = args.worker
        worker(int(r), int(w), addr, int(port), float(ratio), int(reps))
        return 0
    from scripts import netbed

    why = netbed.unavailable()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    from kplan.runtime.compression.probe import TopkExchange, sign_test

    sizes = buckets()
    print(
        f"top-k exchange of {sum(sizes) / 1e6:.1f}M FP32 entries in {len(sizes)} DDP "
        f"buckets; {args.reps} AR/AG pairs per row, medians of the slowest worker; faster: sign "
        "test at 5% over the pairs"
    )
    print(
        f"{'hosts':>5}{'ratio':>7}{'Gbit/s':>7}{'AR s':>9}{'AG s':>9}{'AR/AG':>7}{'AR wins':>9}"
        f"{'p':>7}{'faster':>7}{'probe Gbit/s':>13}{'lat ms':>8}{'model AR/AG':>12}{'model':>6}"
        f"{'AR wins at start':>17}{'auto':>6}"
    )
    port, matched, decided, t0 = 29700, 0, 0, time.perf_counter()
    for hosts in args.hosts:
        for ratio in args.ratios:
            for gbps in args.gbps:
                doc = measure(hosts, gbps, ratio, args.reps, port)
                port += 1
                ar, ag, wins, n = doc["ar"], doc["ag"], doc["ar_wins"], doc["pairs"]
                p = sign_test(wins, n)  # the runtime's (compression/probe.py)
                faster = TopkExchange(ratio, ar, ag, wins, n).decided or "tie"  # the same rule
                verdict = "-"
                if faster != "tie":
                    decided += 1
                    matched += doc["auto"] == faster
                    verdict = "match" if doc["auto"] == faster else "MISS"
                print(
                    f"{hosts:>5}{ratio:>7g}{gbps:>7g}{ar:>9.4f}{ag:>9.4f}{ar / ag:>7.2f}"
                    f"{wins:>6}/{n:<2}"
                    f"{p:>7.3f}{faster:>7}{doc['bandwidth'] * 8 / 1e9:>13.3g}"
                    f"{doc['latency'] * 1e3:>8.3f}{doc['ar_s'] / doc['ag_s']:>12.2f}"
                    f"{doc['model']:>6}{doc['probe']:>17}{doc['auto']:>6} {verdict}",
                    flush=True,
                )
    print(
        f"auto matched the faster collective in {matched} of {decided} settings where one was "
        f"faster; {time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
