"""Communication-efficient training on emulated hosts (issue 14): measured against the planner.

On 2 emulated hosts (scripts/netbed.py: network namespaces, tbf-shaped veths) one torchrun worker
per host (the PID batch controller off: equal local batches, as predicted) trains a
communication-bound MLP (~15.7M parameters, 63 MB of FP32 gradient, a global
batch of 32) through ``kplan.runtime`` for a fixed number of steps with each option:
dense, fp16, powersgd:R, topk:X:ar, topk:X:ag and selective sync, then prints per option

- the measured per-step time (median of the steps after the first 3) and its ratio to dense;
- the planner's prediction (kplan/planner/compression.py over perfmodel): the compute time (no
  communication) and its backward part (the rest, with the optimizer and the fitted overhead, is
  the forward share no round overlaps, as ``kplan profile`` measures it), the mean of every probe
  of the run (the same for every option: a single probe reads one of two levels, 33-40 or 48-56
  ms, while a run's steps average over them), and the option's codec seconds, the mean of the
  probes right before each of its two timing windows (the codec by kplan/profiler/codec.py on the
  model's shapes; each probe runs on both hosts at once), the link's alpha and bytes/s from a gloo
  all-reduce probe on the bed at two sizes, the per-message latency from a 1-element all-reduce,
  the wait at a barrier inside backward (``probe_barrier``: a 1-element all-reduce right after a
  compute step on both hosts, less the same all-reduce alone: where the emulated hosts share the
  cores, a worker waits there for the other; PowerSGD's P round is such a barrier, once per DDP
  bucket; probed again, 20 times, right before each of PowerSGD's windows; the mean of every
  probe's wait, which is the bed's, not an option's) and the overlap exponent gamma and a fixed
  per-step overhead fitted on the dense run (so dense is a fit, every other option a prediction;
  the compressed options' step, a pipeline of DDP's buckets, uses the overhead, not gamma);
- the final held-out loss against dense, and the steps to dense's final training loss (the
  workers' mean, smoothed by an EMA of span 5);
- the statistical cost on a held-out curve (EVAL_SAMPLES samples every --eval-every steps,
  left out of the step times): each option's held-out loss at --steps against dense's, and
  the step at which it reaches dense's --steps loss; --topk-steps trains the top-k rows longer
  so that step can be found, --topk-warmup adds top-k with DGC's sparsity warm-up;
- SelSync's synchronised steps and its wall time to dense's final loss;

and, at 0.1, 1 and 10 Gbit/s, the collective ``topk:X:auto`` picked against the faster of
``:ar`` and ``:ag`` as measured.

    .venv/bin/python bench/comm_bed.py            # 5-8 minutes on 2 shared cores; needs root
    .venv/bin/python bench/comm_bed.py --quick    # 1 Gbit/s only, no AR/AG sweep: ~5 minutes
    .venv/bin/python bench/comm_bed.py --steps 12 --quick   # a smoke run
    .venv/bin/python bench/comm_bed.py --topk-steps 45 --topk-warmup 30  # top-k to dense's loss

The emulated hosts share this machine's cores (and any other load on it, printed as the load
average): their compute, codec and step times carry that contention, so the profile for the
prediction is taken on both hosts at once, and each option's step time is the mean of two
windows (in order, then in reverse order) to spread a drift of the load over every option.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FEATURES, HIDDEN, LAYERS = 1024, 2560, 3
GLOBAL_BATCH = 32
WARMUP = 3  # steps left out of the step-time median (connections, first buckets, allocator)
TIMING_STEPS = 15  # steps per short timing run (WARMUP of them untimed)
# (7 before 2026-11-27: a 4-step window's median is noisy where steps have a heavy tail, as
# PowerSGD's do on the bed, 10-20% of them 1.5-3x the median, and it weighed half the estimate)
SEED = 0
EVAL_SAMPLES = 256  # held-out samples of the loss curve (every --eval-every steps)


# --- the worker (run by torchrun inside each namespace) ----------------------------------------


def make_model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    layers: list[nn.Module] = [nn.Linear(FEATURES, HIDDEN), nn.Tanh()]
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.Tanh()]
    layers.append(nn.Linear(HIDDEN, 1))
    return nn.Sequential(*layers)


def make_data(samples: int, seed: int) -> Any:
    """y = x . w / sqrt(F) + 0.05 noise: plain SGD at lr 0.03 takes the MLP's loss from ~0.86
    to ~0.5 in 30 steps of 32 (a curve that falls, so "steps to dense's loss" means something)."""
    import torch
    from torch.utils.data import TensorDataset

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234))
    y = x @ w / math.sqrt(FEATURES) + 0.05 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


def worker(steps: int, out: Path, lr: float, data_steps: int, eval_every: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset

    import kplan.runtime as kr

    torch.set_num_threads(1)
    ctx = kr.init()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    # the first ``steps`` batches of one stream of ``data_steps``: runs of any length see the
    # same samples in the same order
    x, y = make_data(max(steps, data_steps) * GLOBAL_BATCH, seed=1).tensors
    data = TensorDataset(x[: steps * GLOBAL_BATCH], y[: steps * GLOBAL_BATCH])
    held_x, held_y = make_data(1024, seed=2).tensors
    job = kr.Job(
        model,
        opt,
        data,
        batch_size=GLOBAL_BATCH,
        shuffle=False,  # i.i.d. samples: in stream order, so runs of any length share a prefix
        config=kr.RuntimeConfig(gns="off"),
    )
    times: list[float] = []
    losses: list[float] = []
    walls: list[float] = []
    curve: list[tuple[int, float]] = []  # (step, held-out loss on EVAL_SAMPLES)
    start = last = time.perf_counter()
    for _epoch in job.epochs(1):
        for x, y in job.batches():
            with job.step():
                loss = F.mse_loss(job.model(x), y)
                job.backward(loss)
            now = time.perf_counter()
            times.append(now - last)
            walls.append(now - start)
            losses.append(float(loss.detach()))
            last = now
            if eval_every and len(times) % eval_every == 0:
                with torch.no_grad():
                    ev = F.mse_loss(job.module(held_x[:EVAL_SAMPLES]), held_y[:EVAL_SAMPLES])
                curve.append((len(times), float(ev)))
                # the hosts' evaluations end apart: realign them, or the next step's first
                # blocking round would carry that skew (a step up to 1.8x the median, before)
                dist.barrier()
                last = time.perf_counter()  # the evaluation is left out of times and walls
                start += last - now
    with torch.no_grad():
        held = float(F.mse_loss(job.module(held_x), held_y))
    doc = {"times": times, "losses": losses, "walls": walls, "held_loss": held, "curve": curve}
    Path(f"{out}.rank{ctx.rank}").write_text(json.dumps(doc))


# --- the driver ---------------------------------------------------------------------------------


@dataclass
class Run:
    option: str
    gbps: float
    step_s: float  # median after warm-up
    step_spread: float  # (p75 - p25) / median of the timed steps
    losses: list[float]
    walls: list[float]
    held_loss: float
    collectives: list[str]
    synced: int | None
    steps: int
    significance: list[float]
    timed: list[float]
    network: tuple[float, float] | None = None  # the runtime's start-up probe (bytes/s, s)
    exchange: dict[str, Any] | None = None  # topk:auto's measured exchange (TopkExchange)
    curve: list[tuple[int, float]] | None = None  # (step, held-out loss) every --eval-every
    blocked_s: float | None = None  # rank 0's median wait in the hook's blocking rounds


def _median_spread(ts: list[float]) -> tuple[float, float]:
    med = statistics.median(ts)
    q = statistics.quantiles(ts, n=4) if len(ts) >= 4 else [med, med, med]
    return med, (q[2] - q[0]) / med


def _records(path: Path) -> list[dict[str, Any]]:
    """Rank 0's step records of the runtime's metrics stream (kplan/runtime/metrics.py)."""
    from kplan.runtime.metrics import read_records

    if not path.exists():
        return []
    return [r for r in read_records(path) if r.get("rank") == 0 and "step" in r]


def _network(path: Path) -> tuple[tuple[float, float] | None, dict[str, Any] | None]:
    """What rank 0's runtime probed at start (its compression event): the link's (bandwidth,
    latency) and, for ``topk:auto``, the measured exchange (``TopkExchange`` as a dict)."""
    from kplan.runtime.metrics import read_records

    if not path.exists():
        return None, None
    for r in read_records(path):
        if r.get("event") == "compression" and r.get("bandwidth_Bps") is not None:
            link = float(r["bandwidth_Bps"]), float(r["latency_s"])
            return link, r.get("topk_exchange")
    return None, None


def run_option(
    bed: Any,
    option: str,
    steps: int,
    lr: float,
    tmp: Path,
    gbps: float,
    port: int,
    data_steps: int = 0,
    eval_every: int = 0,
) -> Run:
    from bench.runtime_common import clean_env
    from scripts import netbed

    out = tmp / f"{option.replace(':', '_')}-{gbps:g}.json"
    metrics = tmp / f"{option.replace(':', '_')}-{gbps:g}.jsonl"
    # PID off: every option trains on the same equal per-worker batches (the prediction's
    # local batch, and the same trajectory for SelSync's local steps); with it on, the split
    # moved with the workers' timing noise from run to run
    extra = {"KPLAN_METRICS_PATH": str(metrics), "KPLAN_PID": "0"}
    if option.startswith("selective"):
        extra["KPLAN_SYNC_POLICY"] = option
    else:
        extra["KPLAN_COMPRESSION"] = option
    procs = []
    for i in range(len(bed.hosts)):
        cmd = bed.torchrun(
            i,
            port,
            [
                str(Path(__file__).resolve()),
                "--worker",
                "--steps",
                str(steps),
                "--lr",
                str(lr),
                "--out",
                str(out),
                "--data-steps",
                str(max(steps, data_steps)),
                "--eval-every",
                str(eval_every),
            ],
        )
        procs.append(bed.popen(i, cmd, env=bed.env(i, clean_env(**extra)), cwd=str(REPO)))
    results = [netbed.wait(p, 600) for p in procs]
    for i, r in enumerate(results):
        if r.returncode != 0:
            raise RuntimeError(f"{option} on host {i} failed:\n{r.stdout[-3000:]}")
    docs = [json.loads(Path(f"{out}.rank{i}").read_text()) for i in range(len(bed.hosts))]
    doc = docs[0]
    # the step's loss: the mean of the workers' (equal local batches)
    losses = [statistics.fmean(x) for x in zip(*(d["losses"] for d in docs), strict=True)]
    timed = doc["times"][WARMUP:]
    med, spread = _median_spread(timed)
    recs = _records(metrics)
    colls = sorted({c for r in recs for c in (r.get("collective") or [])})
    synced = [r["synced_steps"] for r in recs if "synced_steps" in r]
    sig = [float(r["significance"]) for r in recs if r.get("significance") is not None]
    blocked = [float(r["blocked_s"]) for r in recs[WARMUP:] if r.get("blocked_s") is not None]
    return Run(
        option,
        gbps,
        med,
        spread,
        losses,
        doc["walls"],
        doc["held_loss"],
        colls,
        synced[-1] if synced else None,
        len(doc["times"]),
        sig,
        timed,
        *_network(metrics),
        [(int(a), float(b)) for a, b in doc.get("curve", [])],
        statistics.median(blocked) if blocked else None,
    )


def compute_parts(steps: int, skip: int = 2) -> tuple[float, float]:
    """Forward + backward + SGD at the local batch, no communication, and its backward alone
    (each the median after ``skip``): the rest is what no round overlaps (the planner's
    forward share, which ``kplan profile`` measures the same way)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.03)
    x, y = make_data(GLOBAL_BATCH // 2, seed=3).tensors
    times, backward = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        t1 = time.perf_counter()
        loss.backward()  # type: ignore[no-untyped-call]
        backward.append(time.perf_counter() - t1)
        opt.step()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times[skip:])), float(statistics.median(backward[skip:]))


def compute_seconds(steps: int, skip: int = 2) -> float:
    return compute_parts(steps, skip)[0]


def profile_host(options: list[str], out: Path, ready: Path, hosts: int) -> None:
    """What one host measures for the planner: compute and each option's codec seconds. It
    starts when all ``hosts`` are ready (a file each in ``ready``): the hosts' processes start
    seconds apart (imports), and a host that computed while the other still imported measured
    its compute without the contention of a step (31-41 ms against 47-55 ms, before this)."""
    import torch

    from kplan.profiler.codec import codec_seconds, model_shapes

    torch.set_num_threads(1)
    shapes = model_shapes(make_model())
    (ready / out.name).touch()
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < hosts and time.monotonic() < deadline:
        time.sleep(0.005)
    compute, backward = compute_parts(14)
    doc = {
        "compute": compute,
        "backward": backward,
        "codec": {o: codec_seconds(o, shapes, repeats=5) for o in options if o},
    }
    out.write_text(json.dumps(doc))


def profile_on_bed(
    bed: Any, options: list[str], tmp: Path
) -> tuple[float, dict[str, float], float]:
    """Profile on every host at once (the emulated hosts share this machine's cores, so a host
    computes while the others do, as in a step); the slowest host's values: (compute, codec,
    backward). AR-Topk selects on
    one worker per step (the others wait for its indices), so its codec is profiled on one
    host while the other idles, as it runs."""
    from scripts import netbed

    def on(hosts: list[int], opts: list[str], tag: str) -> list[dict[str, Any]]:
        outs = [tmp / f"profile-{tag}-{i}.json" for i in hosts]
        ready = Path(tempfile.mkdtemp(prefix=f"ready-{tag}-", dir=tmp))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--profile-host", "--options"]
        cmd += [",".join(opts), "--ready", str(ready), "--hosts", str(len(hosts))]
        procs = [
            bed.popen(i, [*cmd, "--out", str(out)], cwd=str(REPO))
            for i, out in zip(hosts, outs, strict=True)
        ]
        for i, proc in zip(hosts, procs, strict=True):
            r = netbed.wait(proc, 600)
            if r.returncode != 0:
                raise RuntimeError(f"profiling on host {i} failed:\n{r.stdout[-3000:]}")
        return [json.loads(o.read_text()) for o in outs]

    together = [o for o in options if not o.endswith(":ar")]
    docs = on(list(range(len(bed.hosts))), together, "all")
    codec = {o: max(d["codec"][o] for d in docs) for o in together}
    alone = [o for o in options if o.endswith(":ar")]
    if alone:
        codec.update(on([0], alone, "one")[0]["codec"])
    slowest = max(docs, key=lambda d: d["compute"])
    return slowest["compute"], {o: codec[o] for o in options}, slowest["backward"]


def mean_codec(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Each option's mean codec seconds over two probes."""
    return {k: (a[k] + b[k]) / 2 for k in a}


def barrier_host(host: int, addr: str, port: int, reps: int, out: Path) -> None:
    """One host's part of ``probe_barrier``: after one compute step, the wait in a 1-element
    all-reduce (the others may still compute); after a barrier, the same all-reduce alone."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=host, world_size=2)
    one = torch.zeros(1)
    alone = [_timed(lambda: dist.all_reduce(one), before=dist.barrier) for _ in range(reps)]
    waits = [_timed(lambda: dist.all_reduce(one), before=lambda: compute_seconds(1, 0)) for _
             in range(reps + 2)][2:]  # fmt: skip
    out.write_text(json.dumps({"alone": statistics.median(alone), "wait": statistics.fmean(waits)}))
    dist.barrier()  # neither host tears the group down while the other still uses it
    dist.destroy_process_group()


def _timed(fn: Any, before: Any) -> float:
    before()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def probe_barrier(bed: Any, port: int, tmp: Path, reps: int = 10) -> tuple[float, float]:
    """(1-element all-reduce seconds alone, mean extra wait in it right after a compute step):
    the cost of a barrier inside backward on this bed, where the hosts share the cores, beyond
    the link's latency (both hosts' means, averaged: each worker pays its own wait)."""
    from scripts import netbed

    outs = [tmp / f"barrier-{i}.json" for i in range(2)]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port), "--barrier-host"]
    procs = [
        bed.popen(i, [*cmd, str(i), bed.hosts[0].ip, str(reps), str(o)], env=bed.env(i))
        for i, o in enumerate(outs)
    ]
    for i, proc in enumerate(procs):
        r = netbed.wait(proc, 300)
        if r.returncode != 0 and not outs[i].exists():  # (a crash in gloo's teardown is not)
            raise RuntimeError(f"barrier probe on host {i} failed:\n{r.stdout[-3000:]}")
    docs = [json.loads(o.read_text()) for o in outs]
    alone = max(d["alone"] for d in docs)
    return alone, max(statistics.fmean(d["wait"] for d in docs) - alone, 0.0)


def probe_link(bed: Any, port: int) -> tuple[float, float, float]:
    """(alpha s, seconds per byte sent, latency s per message) of a 2-host gloo all-reduce:
    the byte term from 4 MB and 40 MB, the latency from 1 element as the runtime reads its
    own probe (``compress.link_from_probe``: t / 2(k-1))."""
    from kplan.core.compression_spec import link_from_probe
    from scripts import netbed

    small, big = 4_000_000, 40_000_000
    ts = netbed.allreduce_seconds(bed, small, reps=3, port=port)
    tb = netbed.allreduce_seconds(bed, big, reps=3, port=port + 1)
    t1 = netbed.allreduce_seconds(bed, 4, reps=5, port=port + 2)
    ring = 1.0  # 2(k-1)/k at k = 2: each host sends S bytes
    per_byte = max((tb - ts) / ((big - small) * ring), 1e-12)
    latency = link_from_probe(t1, tb, big, 2)[1]
    return max(ts - per_byte * small * ring, 0.0), per_byte, latency


def _priced(option: str) -> bool:
    """Whether the planner predicts the option's step (not SelSync, not a top-k warm-up)."""
    if option.startswith("selective"):
        return False
    from kplan.core.compression_spec import parse_compression

    return parse_compression(option).warmup == 0


def smoothed(losses: list[float], span: int = 5) -> list[float]:
    out, acc = [], None
    a = 2.0 / (span + 1)
    for v in losses:
        acc = v if acc is None else a * v + (1 - a) * acc
        out.append(acc)
    return out


def steps_to(losses: list[float], target: float) -> int | None:
    for i, v in enumerate(smoothed(losses)):
        if v <= target:
            return i + 1
    return None


def curve_at(curve: list[tuple[int, float]] | None, step: int) -> float | None:
    """The held-out loss of the last evaluation at or before ``step``."""
    pts = [v for s, v in curve or [] if s <= step]
    return pts[-1] if pts else None


def curve_steps_to(curve: list[tuple[int, float]] | None, target: float) -> int | None:
    """The first evaluated step whose held-out loss is at or below ``target``."""
    return next((s for s, v in curve or [] if v <= target), None)


def fit_dense(tc: float, sync: float, last: float, measured: float) -> tuple[float, float]:
    """(gamma, fixed per-step overhead) that make perfmodel's step equal the measured dense
    step: above compute + sync (no overlap) the rest is the runtime's fixed per-step work
    (its statistics all-reduce, Python), at gamma 1; below it, the overlap exponent."""
    from kplan.planner import perfmodel

    if measured >= tc + sync:
        return 1.0, measured - tc - sync
    best, err = 1.0, math.inf
    for i in range(0, 901):
        g = 1.0 + i * 0.01
        pred = float(perfmodel.overlap(tc, sync - last, g)) + last
        if abs(pred - measured) < err:
            best, err = g, abs(pred - measured)
    return best, 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile-host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ready", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--hosts", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--barrier-host", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=30, help="training steps per option")
    ap.add_argument("--data-steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--eval-every",
        type=int,
        default=5,
        help=f"held-out loss on {EVAL_SAMPLES} samples every N steps of the training runs (left "
        "out of the step times): steps to dense's held-out loss",
    )
    ap.add_argument(
        "--topk-steps",
        type=int,
        default=0,
        help="training steps of the top-k runs (default --steps): longer runs measure the "
        "steps top-k needs to reach dense's loss after --steps",
    )
    ap.add_argument(
        "--topk-warmup",
        type=int,
        default=0,
        help="also train top-k (AG) with a sparsity warm-up over this many steps (DGC; "
        "topk:RATIO:ag:wSTEPS), for --topk-steps",
    )
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--rank", type=int, default=4, help="PowerSGD rank")
    ap.add_argument("--ratio", type=float, default=0.01, help="top-k ratio")
    ap.add_argument(
        "--selective",
        default="selective:0.005:8",
        help="SelSync policy (DELTA 0.005: about the median lr|g|/|w| of one worker's first 30 "
        "steps of this model, quartiles 0.0042/0.0053/0.0058, so about half the steps sync)",
    )
    ap.add_argument("--quick", action="store_true", help="1 Gbit/s only, no AR/AG sweep")
    args = ap.parse_args()
    if args.worker:
        worker(args.steps, args.out, args.lr, args.data_steps, args.eval_every)
        return 0
    if args.profile_host:
        profile_host(args.options.split(","), args.out, args.ready, args.hosts)
        return 0
    if args.barrier_host:
        host, addr, reps, out = args.barrier_host
        barrier_host(int(host), addr, args.port, int(reps), Path(out))
        return 0

    from scripts import netbed

    reason = netbed.unavailable()
    if reason:
        print(f"comm_bed: skipped: {reason}")
        return 0
    import torch

    from kplan.core import compression_spec as rc
    from kplan.planner import compression as cp
    from kplan.planner import perfmodel
    from kplan.profiler.codec import model_shapes

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    shapes = model_shapes(make_model())
    numel = sum(math.prod(s) for s in shapes)
    pbytes = 4.0 * numel
    topk = f"topk:{args.ratio:g}"
    options = ["none", "fp16", f"powersgd:{args.rank}", f"{topk}:ar", f"{topk}:ag"]
    print(
        f"model: MLP {FEATURES}-{HIDDEN}x{LAYERS}-1, {numel / 1e6:.1f}M parameters "
        f"({pbytes / 1e6:.0f} MB FP32 gradient), global batch {GLOBAL_BATCH} on 2 hosts "
        f"(1 worker each, 1 thread), plain SGD lr {args.lr:g}"
    )
    tc, codec, skew, backward = 0.0, dict[str, float](), 0.0, 0.0
    port = 29600
    runs: dict[tuple[str, float], Run] = {}
    links: dict[float, tuple[float, float, float]] = {}
    # each option's codec, profiled right before its two windows (its compute joins computes)
    near: dict[str, dict[str, float]] = {}
    skews: list[tuple[float, int]] = []  # every barrier probe's (wait, repetitions)
    computes: list[tuple[float, float]] = []  # every probe's (compute, backward) at 1 Gbit/s

    def probe_before(bed: Any, o: str, when: str) -> tuple[float, dict[str, float], float]:
        """Compute, backward and ``o``'s codec on the bed now (``profile_on_bed``), and before
        PowerSGD the barrier wait; compute and wait also join the run's pools. Printed."""
        nonlocal port
        got = profile_on_bed(bed, [o] if o != "none" and not o.endswith(":auto") else [], tmp)
        computes.append((got[0], got[2]))
        waits = ""
        if o.startswith("powersgd"):  # its P round is a barrier inside backward
            wait = probe_barrier(bed, port, tmp, reps=20)[1]
            skews.append((wait, 20))
            port += 1
            waits = f", barrier wait {wait * 1e3:.1f} ms"
        print(
            f"  profiled before {o}{when}: compute {got[0] * 1e3:.0f} ms (backward "
            f"{got[2] * 1e3:.0f} ms)"
            + "".join(f", codec {v * 1e3:.0f} ms" for v in got[1].values())
            + waits,
            flush=True,
        )
        return got

    with tempfile.TemporaryDirectory(prefix="kplan-comm-bed-") as tmpdir:
        tmp = Path(tmpdir)
        warm = [f"{topk}:ag:w{args.topk_warmup}"] if args.topk_warmup else []
        main_opts = [*options, *warm, f"{topk}:auto", args.selective]
        topk_steps = max(args.topk_steps, args.steps)
        data_steps = topk_steps  # every run trains on a prefix of the same sample stream
        sweep = [f"{topk}:ar", f"{topk}:ag", f"{topk}:auto"]
        # (bandwidth, options timed round-robin, options trained for --steps)
        plan: list[tuple[float, list[str], list[str]]] = [
            (1.0, main_opts, [o for o in main_opts if not o.endswith(":auto")])
        ]
        if not args.quick:
            plan += [(g, sweep, []) for g in (0.1, 10.0)]
        for gbps, timed_opts, trained in plan:
            with netbed.netbed(2, gbps=gbps) as bed:
                if gbps == 1.0:
                    tc, codec, backward = profile_on_bed(bed, options, tmp)
                    computes.append((tc, backward))
                    print(
                        f"profiled on both hosts at once (slowest host): compute "
                        f"{tc * 1e3:.0f} ms/step, of which backward {backward * 1e3:.0f} ms "
                        "(medians of 12); codec (kplan/profiler/codec.py, "
                        "median of 5): "
                        + ", ".join(f"{o} {s * 1e3:.0f} ms" for o, s in codec.items() if s),
                        flush=True,
                    )
                    _alone, skew = probe_barrier(bed, port, tmp)
                    skews.append((skew, 10))
                    port += 1
                    print(
                        f"barrier inside backward (probe_barrier): {skew * 1e3:.1f} ms of wait "
                        f"beyond the 1-element all-reduce's {_alone * 1e3:.2f} ms",
                        flush=True,
                    )
                links[gbps] = probe_link(bed, port)
                port += 3
                # Step times from two windows: the options in order (the training runs, or
                # short runs), then a short run of each in reverse order, so a drift of the
                # machine's load hits every option alike; the mean of the two windows' medians.
                windows: dict[str, list[list[float]]] = {o: [] for o in timed_opts}
                for o in timed_opts:
                    if gbps == 1.0 and _priced(o):
                        # codec (and compute) again right before the option runs: the load of
                        # the shared machine drifts over the minutes the bench takes
                        near[o] = probe_before(bed, o, "")[1]
                    steps = TIMING_STEPS
                    if o in trained:
                        steps = topk_steps if o.startswith("topk") else args.steps
                    ev = args.eval_every if o in trained else 0
                    runs[(o, gbps)] = run_option(
                        bed, o, steps, args.lr, tmp, gbps, port, data_steps, ev
                    )
                    windows[o].append(runs[(o, gbps)].timed)
                    port += 1
                for o in timed_opts[::-1]:
                    if gbps == 1.0 and _priced(o):
                        # and before its second window: the step is the mean of the two
                        # windows' medians, its codec the mean of the two probes
                        again = probe_before(bed, o, "'s second window")[1]
                        near[o] = mean_codec(near[o], again)
                    windows[o].append(
                        run_option(bed, o, TIMING_STEPS, args.lr, tmp, gbps, port, data_steps).timed
                    )
                    port += 1
                for o, ws in windows.items():
                    r = runs[(o, gbps)]
                    ts = [t for w in ws for t in w]
                    r.step_s = statistics.fmean(statistics.median(w) for w in ws)
                    r.step_spread = _median_spread(ts)[1]
                    print(
                        f"  {o} at {gbps:g} Gbit/s: {r.step_s:.3f} s/step ({len(ts)} steps; "
                        f"their mean {statistics.fmean(ts):.3f} s), "
                        f"held loss {r.held_loss:.4f} after {r.steps} steps",
                        flush=True,
                    )
    elapsed = time.perf_counter() - t_start

    # --- the prediction: perfmodel with the bed's link, gamma fitted on dense ---
    alpha, per_byte, lat = links[1.0]
    p = perfmodel.PerfParams(
        compute_a=tc,
        compute_b=0.0,
        gamma=1.0,
        intra_alpha=0.0,
        intra_beta=0.0,
        intra_lat=0.0,
        inter_alpha=alpha,
        inter_beta=per_byte * pbytes,
        inter_lat=lat,
        two_node=0.0,
        log_sigma=0.0,
        gradient_bytes=pbytes,
        bucket_bytes=rc.DDP_BUCKET_BYTES,
    )
    dense = runs[("none", 1.0)]
    sync = float(perfmodel.sync_time(p, 2, 2))
    last = float(perfmodel.last_bucket_sync_time(p, 2, 2))
    # The compute is the same for every option (the model, the batch): the mean of every probe
    # of the run. One probe reads one of two levels (33-40 or 48-56 ms, within a run), and a
    # run's steps average over them, so the option's own probes alone missed by up to 18%.
    tc = statistics.fmean(c for c, _ in computes)
    backward = statistics.fmean(b for _, b in computes)
    # the barrier's wait is the bed's, not an option's: every probe's, weighted by repetitions
    # (one probe of 10-20 read 6-16 ms within a run, PowerSGD's prediction +-15% with it)
    skew = sum(w * n for w, n in skews) / sum(n for _, n in skews)
    gamma, fixed = fit_dense(tc, sync, last, dense.step_s)
    p = perfmodel.replace_fields(p, gamma=gamma, compute_a=tc + fixed)
    print(
        f"\ncompute for every prediction: the mean of {len(computes)} probes, "
        f"{tc * 1e3:.0f} ms (they read {min(c for c, _ in computes) * 1e3:.0f}-"
        f"{max(c for c, _ in computes) * 1e3:.0f} ms), backward {backward * 1e3:.0f} ms; "
        f"barrier wait: the mean of {sum(n for _, n in skews)} in {len(skews)} probes, "
        f"{skew * 1e3:.1f} ms (they read {min(w for w, _ in skews) * 1e3:.1f}-"
        f"{max(w for w, _ in skews) * 1e3:.1f} ms)"
    )
    print(
        f"\nlink at 1 Gbit/s (gloo all-reduce probe, 4 and 40 MB): alpha {alpha * 1e3:.1f} ms, "
        f"{8 / per_byte / 1e9:.3f} Gbit/s, latency {lat * 1e3:.2f} ms/message (1 element); "
        f"barrier skew {skew * 1e3:.1f} ms; fitted on the dense run: gamma {gamma:.2f}, "
        f"runtime overhead {fixed * 1e3:.0f} ms/step (dense's prediction is this fit)"
    )
    target = smoothed(dense.losses)[-1]
    head = (
        f"{'option':<18}{'step s':>8}{'spread':>8}{'vs dense':>9}{'predicted':>10}{'err':>7}"
        f"{'held loss':>10}{'vs dense':>9}{'steps to dense loss':>21}{'syncs':>7}"
    )
    print(
        f"\n1 Gbit/s, 2 hosts; step s: mean of two windows' medians (the runs in order, then "
        f"{TIMING_STEPS - WARMUP} steps of each in reverse order), spread = IQR / median of "
        f"their steps; held-out loss after {args.steps} steps (top-k: after {topk_steps})"
        f"\n{head}"
    )
    shares: dict[str, tuple[float, float, float]] = {}  # (measured share, with a third, step)
    for o in main_opts:
        r = runs[(o, 1.0)]
        if o.startswith("selective") or (o.startswith("topk") and cp.parse(o).warmup > 0):
            pred = None  # SelSync: no model; a warm-up: its first steps send more (not priced)
        else:
            # auto: the faster of AR's and AG's steps, each with its own codec, as the planner
            # prices it (compression.variants)
            po = p
            # what no round overlaps: all but backward (forward, SGD, the runtime's overhead)
            ahead = 1.0 - backward / (tc + fixed)
            sk = skew
            steps_o, thirds = [], []
            for v in cp.variants(cp.parse(o)):
                measured = near.get(v.spec(), codec)
                cs = measured.get(v.spec(), codec.get(v.spec(), 0.0))
                local = [GLOBAL_BATCH // 2]
                step = cp.step_time(po, v, shapes, [2], [2], local, 1, cs, sk, forward_share=ahead)
                steps_o.append(float(step[0]))
                thirds.append(float(cp.step_time(po, v, shapes, [2], [2], local, 1, cs, sk)[0]))
            pred = min(steps_o)
            if o != "none":  # dense is perfmodel's fit, no pipeline
                shares[o] = (ahead, min(thirds), r.step_s)
        to = steps_to(r.losses, target)
        err = "" if pred is None else f"{pred / r.step_s - 1:+.0%}"
        loss = (
            f"{r.held_loss:>10.4f}{r.held_loss / dense.held_loss - 1:>+9.1%}"
            f"{'not reached' if to is None else str(to):>21}"
            if r.steps == args.steps
            else f"{f'(held loss after {r.steps} steps below)':>40}"
            if r.steps > args.steps
            else f"{'(timed only: as ar or ag)':>40}"
        )
        print(
            f"{o:<18}{r.step_s:>8.3f}{r.step_spread:>8.0%}{dense.step_s / r.step_s:>8.2f}x"
            f"{'' if pred is None else f'{pred:.3f}':>10}{err:>7}{loss}"
            f"{'' if r.synced is None else str(r.synced):>7}"
        )
    print(
        "  forward share (what no round overlaps: the probe's compute less its backward, over "
        "compute + overhead), and the prediction with the planner's prior of a third instead: "
        + "; ".join(f"{o} {f:.2f}, {t:.3f} s ({t / m - 1:+.0%})" for o, (f, t, m) in shares.items())
    )
    for o in main_opts:
        r = runs[(o, 1.0)]
        if r.blocked_s and _priced(o) and not o.endswith(":auto"):
            c = cp.parse(o)
            sk = skew  # the blocking term does not depend on the compute
            exposed, hidden = cp.blocking_time(p, c, shapes, [2], [2], sk)
            print(
                f"  {o}: the hook waited {r.blocked_s * 1e3:.0f} ms a step in its blocking rounds "
                f"(runtime's blocked_s, rank 0, median); the model's blocking term "
                f"{float(exposed[0]) * 1e3:.0f} ms"
                + (
                    f" (+ {float(hidden[0]) * 1e3:.0f} ms of the earlier buckets' broadcast, "
                    "priced as overlapped)"
                    if float(hidden[0]) > 0
                    else ""
                )
            )
    n_dense = steps_to(dense.losses, target) or dense.steps
    held_target = curve_at(dense.curve, args.steps)
    n_dense_h = curve_steps_to(dense.curve, held_target) if held_target is not None else None
    print(
        f"\nstatistical cost, on the held-out loss ({EVAL_SAMPLES} samples, every "
        f"{args.eval_every} steps): the steps to dense's loss after {args.steps} steps "
        f"({'-' if held_target is None else f'{held_target:.4f}'}, which dense first reached at "
        f"step {n_dense_h}) / dense's, against the planner's prior; and on the training loss "
        f"(the workers' mean, EMA of span 5, noisy at batch {GLOBAL_BATCH}): steps to dense's "
        f"final {target:.4f}, which dense first reached at step {n_dense}"
    )
    for o in main_opts[1:]:
        if o.startswith("selective") or o.endswith(":auto"):
            continue
        ro = runs[(o, 1.0)]
        pr = cp.prior(cp.parse(o))
        to_o = steps_to(ro.losses, target)
        train = f"train loss: {'not reached' if to_o is None else f'step {to_o}'}"
        at = curve_at(ro.curve, args.steps)
        to_h = None if held_target is None else curve_steps_to(ro.curve, held_target)
        if held_target is None or at is None or n_dense_h is None:
            print(f"  {o}: no held-out curve (--eval-every 0); {train}")
            continue
        at_fixed = f"held-out at step {args.steps} {at / held_target - 1:+.1%} vs dense"
        if to_h is None:
            print(f"  {o}: {at_fixed}; dense's loss not reached in {ro.steps} steps (> "
                  f"{ro.steps / n_dense_h:.2f}x); {train}; prior x{pr.multiplier:.3g}")  # fmt: skip
            continue
        up = pr.updated(to_h / n_dense_h, 0.1, "measured here")
        print(
            f"  {o}: {at_fixed}; dense's loss at step {to_h} (x{to_h / n_dense_h:.2f}); {train}; "
            f"prior x{pr.multiplier:.3g} -> updated x{up.multiplier:.3g} (+-{up.log_sigma:.0%})"
        )
    sel = runs[(args.selective, 1.0)]
    to = steps_to(sel.losses, target)
    wall = sel.walls[to - 1] if to is not None else None
    print(
        f"\nSelSync ({args.selective}): {sel.synced} of {sel.steps} steps synchronised; wall time "
        f"to dense's final smoothed loss {target:.4f}: "
        + (f"{wall:.1f} s" if wall is not None else "not reached")
        + f" vs dense {dense.walls[-1]:.1f} s"
    )
    if sel.significance:
        qs = statistics.quantiles(sel.significance, n=4) if len(sel.significance) > 3 else []
        print(f"  significance per step (the runtime's): quartiles {[f'{v:.2g}' for v in qs]}")
    print("\ntopk:auto's collective against the faster measured (same bed, medians after warm-up)")
    for gbps in sorted(links):
        ar, ag, auto = (runs.get((f"{topk}:{x}", gbps)) for x in ("ar", "ag", "auto"))
        if ar is None or ag is None or auto is None:
            continue
        faster = "ar" if ar.step_s <= ag.step_s else "ag"
        gap = abs(ar.step_s - ag.step_s) / min(ar.step_s, ag.step_s)
        picked = ",".join(auto.collectives) or "?"
        _a, b, la = links[gbps]
        auto_c = cp.parse(f"{topk}:auto")
        pc = cp.traffic(auto_c, shapes, 2, 1 / b, la).collective
        net = auto.network
        rt = "" if net is None else (
            f"; runtime's probe {net[0] * 8 / 1e9:.3g} Gbit/s, {net[1] * 1e3:.2f} ms/message "
            f"-> the shared cost function says "
            f"{cp.traffic(auto_c, shapes, 2, net[0], net[1]).collective}"
        )  # fmt: skip
        ex = auto.exchange
        if ex:
            from kplan.runtime.compression.probe import TopkExchange

            got = TopkExchange(**ex)
            rt += (
                f"; its exchange probe: AR {got.ar_s * 1e3:.1f} ms, AG {got.ag_s * 1e3:.1f} ms "
                f"(medians), AR faster in {got.ar_wins} of {got.pairs} pairs: "
                + (f"decided {got.decided}" if got.decided else f"a tie, lower median {got.choice}")
            )
        spread = max(ar.step_spread, ag.step_spread)
        verdict = "match" if picked == faster else "MISMATCH"
        if gap < spread:
            verdict += ", but the gap is within the step spread: a tie"
        print(
            f"  {gbps:>5g} Gbit/s: ar {ar.step_s:.3f} s, ag {ag.step_s:.3f} s (faster {faster}, "
            f"by {gap:.0%}; step spread up to {spread:.0%}); auto ran {picked} "
            f"({verdict}); the wire cost model: {pc} (bench "
            f"probe {8 / b / 1e9:.3g} Gbit/s, {la * 1e3:.2f} ms/message){rt}"
        )
    print(
        f"\ntotal {elapsed:.0f} s (the bench, beds and probes); machine load average "
        f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end on {os.cpu_count()} CPUs (the "
        "emulated hosts share them: step times carry that contention)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
