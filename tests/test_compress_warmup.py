"""Top-k's sparsity warm-up (Deep Gradient Compression): parsing, the schedule, and the
compressor sending ``warmup_ratio``'s share of each parameter at each step."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from kplan.core.compression_spec import (
    WARMUP_START_RATIO,
    Compression,
    parse_compression,
    topk_count,
    warmup_ratio,
)
from kplan.core.errors import InputError
from kplan.planner import compression as cp
from kplan.runtime.compression.compressor import Compressor
from kplan.runtime.distributed import Context


def test_parse_and_spec_round_trip() -> None:
    got = parse_compression("topk:0.01:ag:w100")
    assert got == Compression("topk", ratio=0.01, collective="ag", warmup=100)
    assert got.spec() == "topk:0.01:ag:w100"
    assert parse_compression("topk:0.01:w5") == Compression("topk", ratio=0.01, warmup=5)
    assert parse_compression("topk:0.01").warmup == 0
    assert parse_compression(got.spec()) == got
    for bad in ("topk:0.01:ag:w0", "topk:0.01:wx", "topk:w10", "adaptive:0.01:0.1:w10"):
        with pytest.raises(InputError, match="compression="):
            parse_compression(bad, "compression")


def test_schedule_decays_geometrically_to_the_ratio() -> None:
    ratio, w = 0.01, 10
    seq = [warmup_ratio(ratio, w, s) for s in range(w + 3)]
    assert seq[0] == pytest.approx(WARMUP_START_RATIO)
    assert seq[w] == seq[w + 2] == ratio
    factors = [b / a for a, b in itertools.pairwise(seq[: w + 1])]
    assert factors == pytest.approx([(ratio / WARMUP_START_RATIO) ** (1 / w)] * w)
    assert warmup_ratio(ratio, 0, 0) == ratio  # no warm-up
    assert warmup_ratio(0.5, 10, 0) == 0.5  # already denser than the start


def test_planner_prices_the_steady_ratio() -> None:
    shapes = ((1000, 1000),)
    warm, steady = cp.parse("topk:0.01:ag:w50"), cp.parse("topk:0.01:ag")
    assert cp.traffic(warm, shapes, 4, 1e9, 1e-4) == cp.traffic(steady, shapes, 4, 1e9, 1e-4)
    assert cp.codec_for(warm, shapes, {"topk:0.01:ag": 0.2})[0] == 0.2


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    url = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=url, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_group")
def test_compressor_sends_the_warmup_share_each_step() -> None:
    """The entries sent at step s are topk_count(numel, warmup_ratio(ratio, W, s)), and the
    error feedback keeps the rest: sent + residual = the compensated gradient."""
    params = [torch.zeros(300, 200)]
    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    comp = Compressor(parse_compression("topk:0.01:ar:w6"), params, ctx, seed=3)
    gen = torch.Generator().manual_seed(0)
    numel = params[0].numel()
    for step in range(8):
        comp.begin_step(step, dense=False)
        flat = torch.randn(numel, generator=gen)
        before = flat.clone() + comp.residual.get(0, torch.zeros(numel))
        out = comp.reduce(flat, [0]).wait()
        want = topk_count(numel, warmup_ratio(0.01, 6, step))
        assert int((out != 0).sum()) == want == topk_count(numel, comp.ratio)
        torch.testing.assert_close(out + comp.residual[0], before)
    assert math.isclose(comp.ratio, 0.01)
