"""topk:auto's AR/AG choice: the runtime and the planner decide with one cost function
(``compress.topk_collective``) on the link read the same way (``compress.link_from_probe``)."""

from __future__ import annotations

import itertools

import pytest
import torch

from kplan.planner import compression as cp
from kplan.runtime.compress import link_from_probe, parse_compression, topk_collective
from kplan.runtime.compressor import Compressor
from kplan.runtime.distributed import Context

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
