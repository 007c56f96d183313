"""Top-k compression with momentum SGD (issue 14): DGC's momentum correction and masking
(runtime/compression/, ``MomentumCorrection``). Real 2-worker gloo runs; the torchrun scenario
is bench/compress_momentum_scenario.py (the benchmark runs it too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.compress_momentum_scenario import run_scenario as _run
from kplan.core.errors import InputError

# --- the fold's algebra (no process group) ------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"momentum": 0.9},
        {"momentum": 0.9, "nesterov": True},
        {"momentum": 0.9, "weight_decay": 0.01, "dampening": 0.3},
        {"momentum": 0.5, "nesterov": True, "weight_decay": 0.01},
    ],
)
def test_fold_makes_torch_sgd_apply_exactly_the_exchanged_update(kwargs: dict[str, Any]) -> None:
    """G = c (D - z) through torch's own SGD step moves the weights by lr x D, every step."""
    import torch

    from kplan.runtime.momentum_fold import MomentumFold

    gen = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(40, generator=gen, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=0.05, **kwargs)
    fold = MomentumFold(opt, [p])
    for _ in range(12):
        d = torch.randn(40, generator=gen, dtype=torch.float64)
        moved = _folded_step(fold, p, d, opt.step)
        assert torch.allclose(moved, 0.05 * d, atol=1e-12, rtol=0)


def _folded_step(fold: Any, p: Any, d: Any, step: Any) -> Any:
    """Set ``p.grad`` to the G that makes the optimizer apply the exchanged update ``d``
    (``fold.inverse``), run ``step()``; what the weights moved by."""
    inv = fold.inverse(0)
    assert inv is not None
    c, z = inv
    p.grad = (c * (d - (0 if z is None else z))).view_as(p)
    before = p.detach().clone()
    step()
    return before - p.detach()


@pytest.mark.parametrize("nesterov", [False, True])
def test_fold_under_momentum_compensation_applies_the_exchanged_update(nesterov: bool) -> None:
    """After a batch change (k = 4), the compensator runs the optimizer step at m^k and
    lr (1 - m^k)/(1 - m) (kplan/runtime/momentum.py): the fold inverts with m^k, so the step still
    applies exactly lr' D, and a gradient enters the residual at 1/(1 - m^k), so that each
    gradient moves the weights by lr'/(1 - m^k) = lr/(1 - m) in all, as compensated dense SGD."""
    import torch

    from kplan.runtime.momentum import MomentumCompensator, compensated, lr_correction
    from kplan.runtime.momentum_fold import MomentumFold

    k, m, lr = 4.0, 0.9, 0.05
    gen = torch.Generator().manual_seed(5)
    p = torch.nn.Parameter(torch.randn(30, generator=gen, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr, momentum=m, nesterov=nesterov)
    comp = MomentumCompensator("horizon", ref_batch=64, ramp_steps=0)
    comp.set_batch(0, 256)
    assert comp.ratio(0) == k
    fold = MomentumFold(opt, [p])
    fold.ratio = comp.ratio(0)
    applied_lr = lr * lr_correction(m, k)

    def compensated_step() -> None:  # as step_end.optimizer_step, which also gives the LR back
        kept = comp.apply(opt.param_groups, k)
        opt.step()
        comp.restore(opt.param_groups, kept)
        opt.param_groups[0]["lr"] = lr

    for _ in range(8):
        d = torch.randn(30, generator=gen, dtype=torch.float64)
        moved = _folded_step(fold, p, d, compensated_step)
        assert opt.param_groups[0]["momentum"] == m  # the script's value is back
        assert torch.allclose(moved, applied_lr * d, atol=1e-12, rtol=0)
    g = torch.ones(30, dtype=torch.float64)
    got = fold.increment(0, g)
    assert got is not None
    assert torch.allclose(got, g / (1.0 - compensated(m, k)))
    assert applied_lr / (1.0 - compensated(m, k)) == pytest.approx(lr / (1.0 - m))
    fold.ratio = 1.0  # no batch change: the script's momentum
    again = fold.increment(0, g)
    assert again is not None and torch.allclose(again, g / (1.0 - m))


def test_fold_feeds_error_feedback_the_sgd_equivalent_step() -> None:
    """Each gradient enters the residual at (1-d)/(1-m) times (nesterov: 1/(1-m)), weight decay
    included at the worker's share; groups without momentum are not folded."""
    import torch

    from kplan.runtime.momentum_fold import MomentumFold

    a, b, c = (torch.nn.Parameter(torch.full((3,), 2.0)) for _ in range(3))
    opt = torch.optim.SGD(
        [
            {"params": [a], "momentum": 0.9, "dampening": 0.5, "weight_decay": 0.1},
            {"params": [b], "momentum": 0.8, "nesterov": True},
            {"params": [c], "momentum": 0.0},
        ],
        lr=0.1,
    )
    fold = MomentumFold(opt, [a, b, c])
    fold.weight = 0.25
    g = torch.ones(3)
    got_a = fold.increment(0, 0.25 * g)
    assert got_a is not None
    assert torch.allclose(got_a, 0.5 / 0.1 * 0.25 * (g + 0.1 * 2.0))
    got_b = fold.increment(1, g)
    assert got_b is not None and torch.allclose(got_b, g / 0.2)
    assert fold.increment(2, g) is None and fold.inverse(2) is None
    assert MomentumFold.needed(opt)
    assert not MomentumFold.needed(torch.optim.SGD([c], lr=0.1))
    assert not MomentumFold.needed(torch.optim.Adam([c], lr=0.1))


def _compressor(spec: str, optimizer: Any, precision: str = "fp32") -> Any:
    import torch

    from kplan.core.compression_spec import parse_compression
    from kplan.runtime.compression.compressor import Compressor
    from kplan.runtime.distributed import Context

    ctx = Context(1, 2, 0, torch.device("cpu"), "gloo")  # rank 1: prints nothing
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return Compressor(parse_compression(spec), params, ctx, 0, None, optimizer, precision)


def test_settings_the_fold_cannot_cancel_are_refused_with_a_hint() -> None:
    import torch

    p = torch.nn.Parameter(torch.zeros(4))
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"momentum": 0.9, "maximize": True}, "fp32", "maximize=True"),
        ({"momentum": 0.9, "dampening": 1.0}, "fp32", "dampening < 1"),
        ({"momentum": 0.9}, "fp16", "fp16 loss scaling"),
    ]
    for kwargs, precision, match in cases:
        opt = torch.optim.SGD([p], lr=0.1, **kwargs)
        with pytest.raises(InputError, match=match) as err:
            _compressor("topk:0.01", opt, precision)
        assert err.value.hint and "\n" not in str(err.value)
    # fine: powersgd (no fold), plain SGD, and fp16 without momentum
    assert _compressor("powersgd:1", torch.optim.SGD([p], lr=0.1, momentum=0.9), "fp16")
    assert _compressor("topk:0.01", torch.optim.SGD([p], lr=0.1), "fp16").momentum is None
    assert _compressor("adaptive", torch.optim.SGD([p], lr=0.1, momentum=0.9)).momentum


def test_topk_with_adam_carries_a_warning() -> None:
    import torch

    p = torch.nn.Parameter(torch.zeros(4))
    warned = _compressor("topk:0.01:ag", torch.optim.Adam([p])).warning
    assert warned is not None and "Adam" in warned and "\n" not in warned
    assert _compressor("powersgd:2", torch.optim.Adam([p])).warning is None
    assert _compressor("topk:0.01", torch.optim.SGD([p], lr=0.1)).warning is None
    # momentum that is not torch's SGD: not folded, warned
    rms = _compressor("adaptive", torch.optim.RMSprop([p], momentum=0.9))
    assert rms.momentum is None and "momentum is applied after" in (rms.warning or "")


# --- real 2-worker gloo runs ----------------------------------------------------------------------

# (option, its dense baseline); lr 0.01, momentum 0.9, 144 steps of batch 64 split (16, 48).
# Before the fold every top-k row diverged or stalled (eval loss 6.7-85 against dense 0.61).
TRAIN = [
    ("topk:0.01:ag/sgdm", "none/sgdm"),
    ("topk:0.05:ar/sgdm", "none/sgdm"),
    ("topk:0.01:ar/sgdm", "none/sgdm"),
    ("topk:0.02:auto/sgdm", "none/sgdm"),
    ("topk:0.02:ag/nesterov", "none/nesterov"),
    ("topk:0.02:ar/sgdm_wd", "none/sgdm_wd"),
]


@pytest.mark.slow
def test_topk_with_momentum_sgd_trains_like_dense(tmp_path: Path) -> None:
    import torch

    extra = ["adaptive:0.01:0.2/sgdm", "topk:0.01:ag/adam", "topk:0.05:ar/sgdm/manual"]
    options = [*sorted({n for pair in TRAIN for n in pair}), *extra]
    res, out = _run(tmp_path, options, ["train|144|-"])
    r0, r1 = res["train"]
    for name, dense in TRAIN:
        assert torch.equal(r0[name]["params"], r1[name]["params"]), name  # replicas identical
        got, want = r0[name]["eval_loss"], r0[dense]["eval_loss"]
        assert got <= 1.15 * want, (name, got, want)
    # adaptive: within 25% (measured 1.19x; it starts at 0.2 and halves per window)
    assert r0["adaptive:0.01:0.2/sgdm"]["eval_loss"] <= 1.25 * r0["none/sgdm"]["eval_loss"]
    assert r0["none/sgdm"]["eval_loss"] < 0.1 * r0["none/sgdm"]["curve"][0]  # dense trained
    # sync=manual folds the same way, and its GNS (dense steps) is of the reduced gradient, not
    # of the G handed to the optimizer (same trajectory as overlap: same value)
    manual, overlap = r0["topk:0.05:ar/sgdm/manual"], r0["topk:0.05:ar/sgdm"]
    assert torch.allclose(manual["params"], overlap["params"], atol=1e-6, rtol=0)
    assert manual["gns"] is not None and overlap["gns"] is not None
    assert manual["gns"] == pytest.approx(overlap["gns"], rel=1e-4)
    assert out.count("kplan: warning: compression topk:0.01:ag with Adam") == 1  # rank 0 only


@pytest.mark.slow
def test_exact_resume_with_the_fold(tmp_path: Path) -> None:
    """The residual (per rank) and the optimizer's buffer (shared) make a restart exact."""
    # adaptive with a fixed collective: auto measures AR against AG at each run's start, so an
    # uninterrupted run may choose otherwise than the one resumed (test_runtime_compress.py)
    options = ["topk:0.02:ar/sgdm_wd", "topk:0.01:ag/nesterov", "adaptive:0.01:0.2:ag/sgdm"]
    first, _ = _run(tmp_path, options, [f"ref|34|{tmp_path / 'r'}", f"a|17|{tmp_path / 'c'}"])
    got, _ = _run(tmp_path, options, [f"part2|34|{tmp_path / 'c'}"])
    for name in options:
        for rank in (0, 1):
            assert got["part2"][rank][name]["resumed_at"] == 17, name
            diff = (got["part2"][rank][name]["params"] - first["ref"][rank][name]["params"]).abs()
            assert float(diff.max()) <= 1e-6, (name, rank, float(diff.max()))
            residual = got["part2"][rank][name]["state"]["residual"]
            assert sum(float(t.norm()) for t in residual.values()) > 0, name  # not vacuous
