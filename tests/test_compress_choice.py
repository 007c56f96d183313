"""topk:auto's AR/AG choice: the runtime and the planner decide with one cost function
(``compress.topk_collective``) on the link read the same way (``compress.link_from_probe``),
and the runtime takes the faster exchange it measured at start where it has one."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kplan.core.compression_spec import (
    exchange_buckets,
    link_from_probe,
    parse_compression,
    topk_collective,
)
from kplan.planner import compression as cp
from kplan.runtime.compression.compressor import Compressor
from kplan.runtime.compression.probe import TopkExchange
from kplan.runtime.distributed import Context

REPO = Path(__file__).resolve().parents[1]
SHAPES = ((2560, 1024), (2560,), (2560, 2560), (2560,))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_link_from_probe_inverts_the_ring_model(n: int) -> None:
    bw, lat, nbytes = 1.25e8, 2e-4, 4 << 20
    small = 2 * (n - 1) * lat  # one element: the latencies only
    big = small + 2 * (n - 1) / n * nbytes / bw
    got_bw, got_lat = link_from_probe(small, big, nbytes, n)
    assert got_bw == pytest.approx(bw) and got_lat == pytest.approx(lat)
    assert link_from_probe(0.1, 0.2, nbytes, 1) == (float("inf"), 0.0)


def _runtime_choice(n: int, ratio: float, network: tuple[float, float]) -> str:
    params = [torch.zeros(s) for s in SHAPES]
    ctx = Context(rank=0, world_size=n, local_rank=0, device=torch.device("cpu"), backend="gloo")
    comp = Compressor(parse_compression(f"topk:{ratio:g}:auto"), params, ctx, network=network)
    return comp.collective(ratio)


def test_runtime_and_planner_choose_alike() -> None:
    """Over a grid of links, workers and ratios the runtime's choice is the planner's, and the
    grid has both answers (AR where AG's (n-1) x 8k bytes dominate, AG on latency)."""
    numel = sum(torch.Size(s).numel() for s in SHAPES)
    seen = set()
    for n, gbps, lat, ratio in itertools.product(
        [2, 4, 8], [0.1, 1.0, 10.0, 100.0], [1e-5, 1e-4, 5e-3], [0.001, 0.01, 0.1]
    ):
        bw = gbps * 1e9 / 8
        rt = _runtime_choice(n, ratio, (bw, lat))
        planner = cp.traffic(cp.parse(f"topk:{ratio:g}:auto"), SHAPES, n, bw, lat).collective
        assert rt == planner == topk_collective(numel, ratio, n, bw, lat).choice
        seen.add((n, rt))
    assert {(8, "ar"), (8, "ag"), (2, "ag")} <= seen


def test_two_workers_choose_on_latency() -> None:
    """At two workers AR and AG move the same bytes (8k per worker each way); AR's broadcast
    and all-reduce cost 3 messages against AG's 1, so any latency picks AG and bandwidth does
    not matter. Only a latency of 0 (a tie) gives AR."""
    for gbps in (0.1, 1.0, 10.0):
        bw = gbps * 1e9 / 8
        assert _runtime_choice(2, 0.01, (bw, 1e-6)) == "ag"
        assert _runtime_choice(2, 0.01, (bw, 0.0)) == "ar"
    fixed = parse_compression("topk:0.01:ar")
    ctx = Context(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    params = [torch.zeros(s) for s in SHAPES]
    assert Compressor(fixed, params, ctx, network=(1.0, 1.0)).collective(0.01) == "ar"


def test_measured_exchange_decides_auto_at_its_ratio() -> None:
    """With the exchange measured at start, ``auto`` takes the faster measured collective at
    that ratio where a sign test over the pairs says so at 5%, against the cost model (which
    says AG at two workers); too close to tell, the lower median; at any other ratio (a
    warm-up's first steps, adaptive's moves), or with nothing timed, the cost model decides.
    The measurement survives a checkpoint."""
    params = [torch.zeros(s) for s in SHAPES]
    ctx = Context(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    spec = parse_compression("topk:0.01:auto")
    net = (1.25e8, 1e-4)
    ar_faster = TopkExchange(0.01, 0.050, 0.060, ar_wins=12, pairs=15)
    comp = Compressor(spec, params, ctx, network=net, exchange=ar_faster)
    assert comp.collective(0.01) == "ar"
    assert comp.collective(0.02) == _runtime_choice(2, 0.02, net) == "ag"
    ag_faster = TopkExchange(0.01, 0.07, 0.06, ar_wins=0, pairs=6)
    assert Compressor(spec, params, ctx, network=net, exchange=ag_faster).collective(0.01) == "ag"
    close = TopkExchange(0.01, 0.050, 0.060, ar_wins=11, pairs=15)  # p = 0.12: too close
    assert close.decided is None
    assert TopkExchange(0.01, 0.05, 0.06, ar_wins=5, pairs=5).decided is None  # p = 0.0625
    assert TopkExchange(0.01, 0.06, 0.05, ar_wins=3, pairs=16).decided == "ag"  # p = 0.02
    assert close.choice == "ar"  # the lower median, where the cost model says AG
    assert Compressor(spec, params, ctx, network=net, exchange=close).collective(0.01) == "ar"
    slower = TopkExchange(0.01, 0.061, 0.060, ar_wins=8, pairs=16)  # more wins, higher median
    assert slower.decided is None and slower.choice == "ag"
    nothing = TopkExchange(0.01, 0.0, 0.0, 0, 0)  # one worker: nothing timed
    assert nothing.choice is None
    assert Compressor(spec, params, ctx, network=net, exchange=nothing).collective(0.01) == "ag"
    fresh = Compressor(spec, params, ctx, network=(1.0, 1.0), exchange=ag_faster)
    assert fresh.load_state_dict(comp.state_dict())
    assert fresh.exchange == ar_faster and fresh.collective(0.01) == "ar"
    fixed = Compressor(parse_compression("topk:0.01:ag"), params, ctx, exchange=ar_faster)
    assert fixed.collective(0.01) == "ag"  # a fixed collective is never overridden


def test_exchange_buckets_follow_ddp_fill_order() -> None:
    cap = 1000 * 4  # 1000 FP32 elements
    # DDP fills buckets from the last parameter backwards; an oversized one is alone
    assert exchange_buckets([10, 600, 600, 5000, 20], cap) == [20, 5000, 600, 610]
    assert exchange_buckets([100], cap) == [100]
    assert sum(exchange_buckets([7, 999, 1, 1001, 3], cap)) == 7 + 999 + 1 + 1001 + 3


_PROBE = """
import json, sys, torch, torch.distributed as dist
from kplan.runtime.compression.probe import probe_topk_exchange
from kplan.runtime.distributed import Context
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
ctx = Context(rank=rank, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
got = probe_topk_exchange(ctx, [200_000, 50_000], 0.01, pairs=3, max_pairs=7, budget_s=60.0)
print(json.dumps([got.ar_s, got.ag_s, got.ar_wins, got.pairs]))
dist.destroy_process_group()
"""


def test_probe_times_both_collectives_and_every_rank_agrees(tmp_path: Path) -> None:
    """Two real gloo processes: positive AR and AG times, the same on both ranks (MAX), so
    both ranks make the same choice."""
    url = f"file://{tmp_path / 'store'}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(r), url], stdout=subprocess.PIPE, text=True, env=env
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    got = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert got[0] == got[1]
    ar_s, ag_s, wins, pairs = got[0]
    assert ar_s > 0 and ag_s > 0 and 0 <= wins <= pairs
    # it stops at the first pair from the 3rd on where the sign test decides, else at 7
    decided = TopkExchange(0.01, ar_s, ag_s, wins, pairs).decided
    assert 3 <= pairs <= 7 and (pairs == 7 or decided is not None)
