"""The runtime's batch schedule and momentum compensation (issue 13, item 3).

In one process (no torchrun) for the formulas, the schedule's steps and an exact resume; one
real 2-worker torchrun run for the scheduled change at the planned step.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kplan.runtime as kr
from bench.runtime_common import clean_env, torchrun
from bench.runtime_worker import make_data, make_model
from kplan.core.errors import InputError
from kplan.runtime import batch_schedule, env
from kplan.runtime.metrics import read_records
from kplan.runtime.momentum import MomentumCompensator, compensated, lr_correction


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("KPLAN_", "TORCHELASTIC_")) or name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


# --- momentum compensation --------------------------------------------------------------------


@pytest.mark.parametrize("m", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("k", [0.5, 2.0, 4.0, 32.0])
def test_momentum_keeps_its_memory_in_samples_and_the_sgd_equivalent_step(
    m: float, k: float
) -> None:
    mk = compensated(m, k)
    # A gradient's weight after n samples: m per B samples before, m' per kB samples after.
    samples = 1024.0
    assert mk ** (samples / k) == pytest.approx(m**samples, rel=1e-9)
    # The SGD-equivalent step lr/(1-m) is scaled by the rule's factor f only.
    lr, f = 0.1, k
    assert lr * f * lr_correction(m, k) / (1 - mk) == pytest.approx(f * lr / (1 - m), rel=1e-12)
    assert lr_correction(0.0, k) == 1.0 and compensated(m, 1.0) == m


def test_ratio_ramps_over_t_steps_to_the_target() -> None:
    comp = MomentumCompensator("horizon", ref_batch=64, ramp_steps=4)
    assert [comp.ratio(s) for s in range(3)] == [1.0, 1.0, 1.0]
    comp.set_batch(6, 256)  # k: 1 -> 4 over steps 6..9
    assert [comp.ratio(s) for s in range(5, 11)] == [1.0, 1.75, 2.5, 3.25, 4.0, 4.0]
    comp.set_batch(20, 128)  # from 4 down to 2, ramped from the ratio in use
    assert [comp.ratio(s) for s in (19, 20, 23, 50)] == [4.0, 3.5, 2.0, 2.0]
    off = MomentumCompensator("off", ref_batch=64, ramp_steps=4)
    off.set_batch(0, 256)
    assert off.ratio(100) == 1.0


def test_ratio_resumes_mid_ramp() -> None:
    comp = MomentumCompensator("horizon", ref_batch=32, ramp_steps=10)
    comp.set_batch(5, 128)
    again = MomentumCompensator("horizon", ref_batch=99, ramp_steps=10)
    again.load_state_dict(json.loads(json.dumps(comp.state_dict())), step=8, batch=128)
    assert [again.ratio(s) for s in range(5, 16)] == [comp.ratio(s) for s in range(5, 16)]


def test_adam_betas_and_sgd_momentum_applied_and_restored() -> None:
    w = torch.nn.Parameter(torch.zeros(3))
    adam = torch.optim.Adam([w], lr=1e-3, betas=(0.9, 0.999))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    plain = torch.optim.SGD([w], lr=0.1)
    comp = MomentumCompensator("horizon", ref_batch=32, ramp_steps=0)
    kept = comp.apply(adam.param_groups, 2.0)
    assert adam.param_groups[0]["betas"] == pytest.approx((0.81, 0.998001))
    assert adam.param_groups[0]["lr"] == 1e-3  # Adam's step is normalised: no LR correction
    comp.restore(adam.param_groups, kept)
    assert adam.param_groups[0]["betas"] == (0.9, 0.999)
    kept = comp.apply(sgd.param_groups, 2.0)
    assert sgd.param_groups[0]["momentum"] == pytest.approx(0.81)
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.1 * 1.9)
    comp.restore(sgd.param_groups, kept)
    assert sgd.param_groups[0]["momentum"] == 0.9
    assert comp.apply(plain.param_groups, 2.0) == [{}]
    assert plain.param_groups[0]["lr"] == 0.1


# --- parsing ----------------------------------------------------------------------------------


def test_schedule_env_round_trip_and_bad_values() -> None:
    sched = batch_schedule.from_list(
        [{"progress": 0, "global_batch": 32}, {"progress": 0.5, "global_batch": 64}]
    )
    out = env.kplan_environ(batch_schedule=sched, momentum_compensation="off")
    assert env.batch_schedule(out) == sched and env.momentum_compensation(out) == "off"
    assert sched.start_batch() == 32 and sched.due(0, 0, 0.49) == 0 and sched.due(0, 0, 0.5) == 1
    bad = {
        "[": "is not JSON",
        "[]": "non-empty",
        '[{"progress": 0.5}]': "no global_batch",
        '[{"step": 1, "progress": 0.5, "global_batch": 8}]': "exactly one",
        '[{"step": 1, "global_batch": 8}, {"progress": 0.5, "global_batch": 8}]': "mixes",
        '[{"progress": 0.5, "global_batch": 8}, {"progress": 0.2, "global_batch": 8}]': "decrease",
        '[{"progress": 1.5, "global_batch": 8}]': "above 1",
        '[{"step": 2.5, "global_batch": 8}]': "not an integer",
        '[{"step": 2, "global_batch": 0}]': "< 1",
        '[{"step": 2, "global_batch": 8.5}]': "no integer",
    }
    for text, message in bad.items():
        with pytest.raises(InputError, match=message):
            env.batch_schedule({env.BATCH_SCHEDULE: text})
    with pytest.raises(InputError, match="KPLAN_MOMENTUM"):
        env.momentum_compensation({env.MOMENTUM: "sometimes"})


# --- the schedule in a job --------------------------------------------------------------------


def _job(config: kr.RuntimeConfig, *, momentum: float = 0.9, adam: bool = False) -> kr.Job:
    ctx = kr.init()
    torch.manual_seed(0)
    model = make_model("linear", 8, 0).to(ctx.device)
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=0.01)
        if adam
        else torch.optim.SGD(model.parameters(), lr=0.02, momentum=momentum)
    )
    data = make_data(1024, 8, 0, 1.0)
    return kr.Job(model, opt, data, batch_size=32, config=config)


def _train(job: kr.Job, epochs: int) -> None:
    for _ in job.epochs(epochs):
        for x, y in job.batches():
            with job.step():
                job.backward(F.mse_loss(job.model(x), y))


def _params(job: kr.Job) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in job.module.parameters()])


STEP_SCHEDULE: list[dict[str, Any]] = [
    {"step": 0, "global_batch": 32},
    {"step": 5, "global_batch": 64},
    {"step": 12, "global_batch": 128},
]


def test_step_schedule_changes_at_the_planned_steps(tmp_path: Path) -> None:
    cfg = kr.RuntimeConfig(
        batch_schedule=STEP_SCHEDULE,
        lr_scaling="linear",
        lr_ramp_steps=2,
        max_steps=16,
        metrics_path=tmp_path / "m.jsonl",
    )
    job = _job(cfg)
    _train(job, 3)
    assert job.optimizer.param_groups[0]["momentum"] == 0.9  # restored after every step
    records = read_records(tmp_path / "m.jsonl")
    steps = [r for r in records if "event" not in r]
    assert [r["global_batch"] for r in steps] == [32] * 5 + [64] * 7 + [128] * 4
    events = [r for r in records if r.get("event") == "batch_schedule"]
    assert [(e["step"], e["previous"], e["global_batch"]) for e in events] == [
        (5, 32, 64),
        (12, 64, 128),
    ]
    # k = 2 then 4 (ref 32): momentum 0.9^k, LR factor x (1 - 0.9^k)/(1 - 0.9).
    assert events[0]["momentum"] == pytest.approx(0.81)
    assert events[0]["lr_factor"] == pytest.approx(2 * 1.9)
    assert events[1]["momentum"] == pytest.approx(0.9**4)
    assert events[1]["lr_factor"] == pytest.approx(4 * (1 - 0.9**4) / 0.1)
    lrs = [r["lr"] for r in steps]
    assert lrs[:5] == pytest.approx([0.02] * 5)
    k_mid = 1.5  # half-way through the 2-step ramp: the LR factor and k both at 1.5
    assert lrs[5] == pytest.approx(0.02 * 1.5 * lr_correction(0.9, k_mid))
    assert lrs[6:12] == pytest.approx([0.02 * 2 * 1.9] * 6)
    assert lrs[13:] == pytest.approx([0.02 * 4 * (1 - 0.9**4) / 0.1] * 3)


def test_progress_schedule_follows_job_progress(tmp_path: Path) -> None:
    # linear rule: progress grows by B/B0 per step; target = 2 epochs x 1024/32 = 64 base steps.
    sched = [{"progress": 0.0, "global_batch": 32}, {"progress": 0.25, "global_batch": 64}]
    sched.append({"progress": 0.5, "global_batch": 128})
    cfg = kr.RuntimeConfig(
        batch_schedule=sched, lr_scaling="linear", metrics_path=tmp_path / "m.jsonl"
    )
    _train(_job(cfg, adam=True), 2)
    records = read_records(tmp_path / "m.jsonl")
    steps = [r for r in records if "event" not in r]
    batches = [r["global_batch"] for r in steps]
    # 16 steps at 32 reach progress 16 = 25%; 8 steps at 64 reach 32 = 50%; then 128.
    assert batches[:16] == [32] * 16 and batches[16:24] == [64] * 8 and set(batches[24:]) == {128}
    events = [r for r in records if r.get("event") == "batch_schedule"]
    assert [(e["step"], e["trigger"], e["at"]) for e in events] == [
        (16, "progress", 0.25),
        (24, "progress", 0.5),
    ]
    assert events[0]["momentum"] == pytest.approx([0.81, 0.999**2])  # Adam's betas ^ k


@pytest.mark.parametrize("stop_at", [5, 9])
def test_resume_mid_schedule_is_exact(tmp_path: Path, stop_at: int) -> None:
    base: dict[str, Any] = {"batch_schedule": STEP_SCHEDULE, "lr_scaling": "linear"}
    base["lr_ramp_steps"] = 4
    ref = _job(kr.RuntimeConfig(**base, max_steps=20))
    _train(ref, 3)
    assert ref.global_batch == 128
    ckpt = {"checkpoint_dir": tmp_path / "c", "checkpoint_steps": 100}
    first = _job(kr.RuntimeConfig(**base, **ckpt, max_steps=stop_at))
    _train(first, 3)  # the final checkpoint at stop_at (5: the step the first change starts)
    second = _job(kr.RuntimeConfig(**base, **ckpt, max_steps=20))
    assert second.step_count == stop_at and second.global_batch == 64
    _train(second, 3)
    assert second.step_count == 20 and second.global_batch == 128
    assert float((_params(ref) - _params(second)).abs().max()) < 1e-6
    untrained = _params(_job(kr.RuntimeConfig()))
    assert float((_params(ref) - untrained).abs().max()) > 1e-3  # the check is not vacuous


def test_schedule_is_clamped_to_what_fits(tmp_path: Path) -> None:
    sched = [{"step": 0, "global_batch": 30}, {"step": 2, "global_batch": 4096}]
    cfg = kr.RuntimeConfig(
        batch_schedule=sched, accum_steps=2, max_steps=4, metrics_path=tmp_path / "m.jsonl"
    )
    _train(_job(cfg), 1)
    records = read_records(tmp_path / "m.jsonl")
    event = next(r for r in records if r.get("event") == "batch_schedule")
    assert (event["asked"], event["global_batch"]) == (4096, 1024)  # the data set holds 1024


# --- end to end: two workers under torchrun ---------------------------------------------------


@pytest.mark.slow
def test_two_workers_change_batch_at_the_planned_step(tmp_path: Path) -> None:
    metrics = tmp_path / "m"
    sched = json.dumps([{"step": 0, "global_batch": 64}, {"step": 6, "global_batch": 128}])
    extra = {env.METRICS_PATH: str(metrics), env.BATCH_SCHEDULE: sched, env.MAX_STEPS: "10"}
    proc = torchrun(["--samples", "2048", "--batch", "64", "--epochs", "2"], clean_env(**extra))
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = read_records(metrics)
    for rank in (0, 1):
        steps = [r for r in records if "event" not in r and r["rank"] == rank]
        assert [r["global_batch"] for r in steps] == [64] * 6 + [128] * 4
    events = [r for r in records if r.get("event") == "batch_schedule"]
    assert len(events) == 1 and events[0]["rank"] == 0
    assert (events[0]["step"], events[0]["previous"], events[0]["global_batch"]) == (6, 64, 128)
    assert math.isfinite(events[0]["lr_factor"])
