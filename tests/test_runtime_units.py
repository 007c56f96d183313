"""Unit tests of the runtime's pure parts: env, GNS math, PID, sampler, LR scaling, profile."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kplan.core.errors import InputError
from kplan.core.records import STEP_KEYS, StepRecord
from kplan.runtime import env
from kplan.runtime.config import RuntimeConfig
from kplan.runtime.gns import GnsEstimator, GnsSample, adascale_gain, estimate
from kplan.runtime.lr_scaling import LrScaler, rule_factor
from kplan.runtime.metrics import MetricsWriter, read_records
from kplan.runtime.pid import BatchController, PidConfig, split
from kplan.runtime.profile_mode import ProfileRun, is_oom
from kplan.runtime.sampler import GlobalBatchSampler, Position

# --- env --------------------------------------------------------------------------------------


def test_env_round_trip_through_kplan_environ() -> None:
    schedule = env.ProfileSchedule((4, 8), 1, 3, 4, 10)
    out = env.kplan_environ(
        job_id="j1",
        metrics_path="/tmp/m",
        checkpoint_dir="/tmp/c",
        checkpoint_interval=30.0,
        global_batch=512,
        accum_steps=2,
        max_local_batch=64,
        lr_scaling="sqrt",
        pid_enabled=False,
        gns_mode="adam",
        profile_schedule=schedule,
    )
    assert env.job_id(out) == "j1"
    assert env.metrics_path(out) == Path("/tmp/m")
    assert env.checkpoint_interval(out) == 30.0
    assert env.global_batch(out) == 512
    assert env.accum_steps(out) == 2
    assert env.lr_scaling(out) == "sqrt"
    assert env.pid_enabled(out) is False
    assert env.gns_mode(out) == "adam"
    assert env.profile_schedule(out) == schedule
    assert env.max_steps(out) is None
    assert env.world_size({}) == 1 and env.rank({}) == 0 and not env.under_torchrun({})


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        (env.GLOBAL_BATCH, "abc", "KPLAN_GLOBAL_BATCH='abc' is not an integer"),
        (env.ACCUM_STEPS, "0", "KPLAN_ACCUM_STEPS=0 is below 1"),
        (env.LR_SCALING, "cubic", "KPLAN_LR_SCALING='cubic' is not one of"),
        (env.PID, "maybe", "KPLAN_PID='maybe' is not a boolean"),
        (env.CHECKPOINT_INTERVAL, "-5", "KPLAN_CHECKPOINT_INTERVAL=-5 is not a number"),
        (env.PROFILE_SCHEDULE, "{", "is not JSON"),
        (env.PROFILE_SCHEDULE, '{"local_batches": [8, 4]}', "has keys"),
    ],
)
def test_env_rejects_bad_values(name: str, value: str, match: str) -> None:
    readers = {r.__name__: r for r in env.READERS}
    reader = {
        env.GLOBAL_BATCH: readers["global_batch"],
        env.ACCUM_STEPS: readers["accum_steps"],
        env.LR_SCALING: readers["lr_scaling"],
        env.PID: readers["pid_enabled"],
        env.CHECKPOINT_INTERVAL: readers["checkpoint_interval"],
        env.PROFILE_SCHEDULE: readers["profile_schedule"],
    }[name]
    with pytest.raises(InputError, match=match):
        reader({name: value})


def test_profile_schedule_must_ascend() -> None:
    raw = {"local_batches": [8, 4], "warmup_steps": 1, "steps_per_batch": 2}
    raw |= {"gns_batch": 4, "gns_steps": 3}
    with pytest.raises(InputError, match="not strictly ascending"):
        env.profile_schedule({env.PROFILE_SCHEDULE: json.dumps(raw)})


def test_config_environment_overrides_script() -> None:
    base = RuntimeConfig(global_batch=64, lr_scaling="linear", checkpoint_steps=7)
    got = RuntimeConfig.from_env(base, {env.GLOBAL_BATCH: "256", env.PID: "0", env.JOB_ID: "x"})
    assert got.global_batch == 256 and got.pid is None and got.job_id == "x"
    assert got.lr_scaling == "linear" and got.checkpoint_steps == 7  # unset: script's value
    with pytest.raises(InputError, match="accum_steps=0"):
        RuntimeConfig(accum_steps=0)


# --- GNS math ---------------------------------------------------------------------------------


def test_gns_estimate_is_unbiased_for_unequal_batches() -> None:
    """Monte Carlo: Gaussian per-sample gradients with known G and Σ, batches 5, 17, 42."""
    rng = np.random.default_rng(0)
    dim, sizes = 8, [5, 17, 42]
    g_true = rng.normal(size=dim) * 0.3
    scales = rng.uniform(0.5, 2.0, size=dim)  # Σ = diag(scales²)
    sqr_true, var_true = float(g_true @ g_true), float((scales**2).sum())
    total = sum(sizes)
    sqr_est, var_est = [], []
    for _ in range(20000):
        means = [g_true + scales * rng.normal(size=dim) / math.sqrt(b) for b in sizes]
        big = sum(b * m for b, m in zip(sizes, means, strict=True)) / total
        sample = estimate([float(m @ m) for m in means], sizes, float(big @ big))
        sqr_est.append(sample.grad_sqr)
        var_est.append(sample.grad_var)
    assert np.mean(sqr_est) == pytest.approx(sqr_true, rel=0.05)
    assert np.mean(var_est) == pytest.approx(var_true, rel=0.03)


def test_gns_estimate_is_unbiased_on_a_finite_data_set() -> None:
    """Batches drawn without replacement from N = 256 fixed per-sample gradients (as the
    sampler does within an epoch): with population=N the estimates are unbiased for the data
    set's own |G|² and tr(Σ) (population covariance); without it |G|² reads low by
    tr(Σ)/(N - 1), the 1.2-1.3x high noise scale seen on small data sets."""
    rng = np.random.default_rng(1)
    n, dim, sizes = 256, 6, [16, 16, 32]  # B = 64, a quarter of the set
    grads = rng.normal(size=(n, dim)) * rng.uniform(0.5, 2.0, size=dim) + 0.15
    g_true = grads.mean(axis=0)
    sqr_true = float(g_true @ g_true)
    var_true = float(((grads - g_true) ** 2).sum(axis=1).mean())
    assert var_true / sqr_true > n / 5  # a noise scale of a fifth of the set or more
    corrected, plain = [], []
    for _ in range(40000):
        order = rng.permutation(n)
        parts, start = [], 0
        for b in sizes:
            parts.append(grads[order[start : start + b]].mean(axis=0))
            start += b
        big = grads[order[:start]].mean(axis=0)
        args = ([float(m @ m) for m in parts], sizes, float(big @ big))
        corrected.append(estimate(*args, population=n))
        plain.append(estimate(*args))
    sqr = np.mean([c.grad_sqr for c in corrected])
    var = np.mean([c.grad_var for c in corrected])
    # Monte-Carlo error: about 2% of sqr_true for |G|² (its samples are noisy), 0.3% for tr(Σ).
    assert sqr == pytest.approx(sqr_true, rel=0.06)
    assert var == pytest.approx(var_true, rel=0.01)
    bias = np.mean([c.grad_sqr for c in plain]) - sqr_true
    assert bias == pytest.approx(-var_true / (n - 1), rel=0.25)  # what the correction removes
    # The whole set in one step: |G|² is the big batch's norm, exactly.
    quarters = [q.mean(axis=0) for q in np.split(grads, 4)]
    whole = estimate([float(q @ q) for q in quarters], [64] * 4, sqr_true, population=n)
    assert whole.grad_sqr == pytest.approx(sqr_true)
    # A batch larger than the declared set (draws that repeat samples): no correction.
    assert estimate([3.0, 3.0], [32, 32], 2.0, population=50) == estimate([3.0, 3.0], [32, 32], 2.0)


def test_gns_estimate_matches_mccandlish_for_equal_batches() -> None:
    b, big_b, small, big = 32, 64, 3.0, 2.0
    sample = estimate([small, small], [b, b], big)
    assert sample.grad_sqr == pytest.approx((big_b * big - b * small) / (big_b - b))
    assert sample.grad_var == pytest.approx((small - big) / (1 / b - 1 / big_b))
    with pytest.raises(InputError, match="at least 2 gradients"):
        estimate([1.0], [4], 1.0)


def test_gns_estimator_smooths_numerator_and_denominator_separately() -> None:
    est = GnsEstimator(smoothing=0.5)
    assert est.gns is None
    est.update(GnsSample(grad_sqr=1.0, grad_var=10.0))
    est.update(GnsSample(grad_sqr=-0.5, grad_var=30.0))  # a negative |G|² sample is normal
    est.update(GnsSample(grad_sqr=float("nan"), grad_var=1.0))  # skipped
    # bias-corrected EMAs: sqr = (0.25*1 + 0.5*-0.5)/0.75 = 0, var = (2.5 + 15)/0.75
    assert est.grad_sqr == pytest.approx(0.0)
    assert est.gns is None
    est.update(GnsSample(grad_sqr=2.0, grad_var=10.0))
    assert est.gns == pytest.approx(est.grad_var / est.grad_sqr)  # type: ignore[operator]
    clone = GnsEstimator(0.5)
    clone.load_state_dict(est.state_dict())
    assert clone.gns == est.gns


@given(
    sqr=st.floats(1e-6, 1e3), var=st.floats(0.0, 1e6), b0=st.integers(1, 512), s=st.integers(1, 64)
)
def test_adascale_gain_is_between_one_and_scale(sqr: float, var: float, b0: int, s: int) -> None:
    gain = adascale_gain(sqr, var, b0, b0 * s)
    assert 1.0 - 1e-9 <= gain <= s + 1e-9
    bn = var / sqr
    assert gain == pytest.approx(s * (b0 + bn) / (b0 * s + bn), rel=1e-9)


# --- LR scaling -------------------------------------------------------------------------------


def test_lr_rules_and_ramp() -> None:
    assert rule_factor("linear", 64, 256) == 4.0
    assert rule_factor("sqrt", 64, 256) == 2.0
    assert rule_factor("none", 64, 256) == 1.0
    assert rule_factor("adascale", 64, 256) == 1.0  # no statistics yet: conservative
    lr = LrScaler("linear", 64, 256, ramp_steps=4)
    factors = [lr.factor(step, None, None) for step in range(6)]
    assert factors == pytest.approx([1.75, 2.5, 3.25, 4.0, 4.0, 4.0])  # no jump from 1 to 4
    lr.set_batch(6, 128)
    assert [lr.factor(step, None, None) for step in (6, 7, 8, 9, 10)] == pytest.approx(
        [3.5, 3.0, 2.5, 2.0, 2.0]
    )
    assert lr.progress == pytest.approx(4 * 6 + 2 * 5)


def test_lr_adascale_follows_gns() -> None:
    lr = LrScaler("adascale", 64, 256, ramp_steps=0)
    # B_noise = 64: gain = S (B0 + Bn)/(B + Bn) = 4 * 128 / 320 = 1.6
    assert lr.factor(0, 1.0, 64.0) == pytest.approx(1.6)


# --- PID --------------------------------------------------------------------------------------


def test_split_respects_bounds_and_sum() -> None:
    assert split(100, [0.9, 0.1], [1, 1], [60, 100]) == (60, 40)
    assert split(10, [1 / 3] * 3, [1] * 3, [10] * 3) in {(4, 3, 3), (3, 4, 3), (3, 3, 4)}
    with pytest.raises(InputError, match="cannot be split over 2 workers"):
        split(100, [0.5, 0.5], [1, 1], [40, 40])


@settings(max_examples=60, deadline=None)
@given(
    speed=st.lists(st.floats(0.2, 5.0), min_size=2, max_size=6),
    alpha=st.floats(0.0, 0.3),
    seed=st.integers(0, 1000),
)
def test_pid_converges_without_oscillation(speed: list[float], alpha: float, seed: int) -> None:
    """t_i = α + b_i/speed_i (1% noise): the split settles near equal times, then holds."""
    rnd = random.Random(seed)
    k, total = len(speed), 64 * len(speed)
    ctl = BatchController(k, total)
    sizes, history = ctl.sizes, []
    for step in range(60):
        times = [
            (alpha * 0.01 + b / (v * 1000)) * (1 + rnd.gauss(0, 0.01))
            for b, v in zip(sizes, speed, strict=True)
        ]
        new = ctl.observe(step, sizes, times)
        sizes = new or sizes
        history.append(sizes)
    assert sum(sizes) == total
    ideal = [(alpha * 0.01 + b / (v * 1000)) for b, v in zip(sizes, speed, strict=True)]
    # Balanced to within the dead band, up to one sample: batches are integers, so a very slow
    # worker cannot get closer than one sample's time (1 / speed ms) to the others.
    one_sample = max(1 / (v * 1000) for v in speed)
    assert max(ideal) <= 1.1 * (sum(ideal) / k) + one_sample
    late = history[30:]
    for i in range(k):  # no oscillation: the split stays put within 5% after settling
        values = [h[i] for h in late]
        assert max(values) - min(values) <= max(2, 0.05 * max(values))


def test_pid_does_not_chase_timing_noise() -> None:
    """Equal workers, 30% timing noise: the split stays near equal instead of wandering."""
    rnd = random.Random(1)
    ctl = BatchController(2, 64)
    sizes = ctl.sizes
    for step in range(200):
        times = [0.001 * b * max(0.05, 1 + rnd.gauss(0, 0.3)) for b in sizes]
        sizes = ctl.observe(step, sizes, times) or sizes
    assert ctl.decisions <= 3 and abs(sizes[0] - 32) <= 3


def test_pid_memory_bound_and_stale_measurements() -> None:
    ctl = BatchController(2, 100, max_local=[55, None], config=PidConfig(warmup_steps=0))
    sizes = ctl.sizes
    assert sizes == (50, 50)
    for step in range(6):  # rank 0 is 10x faster but may hold at most 55
        new = ctl.observe(step, sizes, [0.001 * sizes[0], 0.01 * sizes[1]])
        sizes = new or sizes
    assert sizes == (55, 45)
    assert ctl.observe(7, (50, 50), [1.0, 2.0]) is None  # measured with an old split: ignored
    with pytest.raises(InputError, match=r"ki=0\.0 is not in"):
        PidConfig(ki=0.0)


# --- sampler ----------------------------------------------------------------------------------


def _epoch(samplers: list[GlobalBatchSampler]) -> list[list[list[int]]]:
    return [list(s) for s in samplers]


def test_sampler_splits_each_global_batch_and_is_deterministic() -> None:
    n, sizes = 103, (3, 7)
    samplers = [GlobalBatchSampler(n, r, 2, sizes, seed=5) for r in range(2)]
    parts = _epoch(samplers)
    assert [len(b) for b in parts[0]] == [3] * 10 and [len(b) for b in parts[1]] == [7] * 10
    union = [a + b for a, b in zip(parts[0], parts[1], strict=True)]
    flat = [i for batch in union for i in batch]
    assert len(flat) == len(set(flat)) == 100  # disjoint, tail of 3 skipped
    order = np.random.Generator(np.random.PCG64([5, 0])).permutation(n)
    assert union[0] == order[:10].tolist()
    again = GlobalBatchSampler(n, 0, 2, (5, 5), seed=5)  # another split, same global batches
    other = GlobalBatchSampler(n, 1, 2, (5, 5), seed=5)
    assert [sorted(a + b) for a, b in zip(list(again), list(other), strict=True)] == [
        sorted(u) for u in union
    ]
    assert next(iter(samplers[0])) != parts[0][0]  # next epoch: a new permutation


def test_sampler_resumes_exactly_and_applies_scheduled_splits() -> None:
    full = GlobalBatchSampler(64, 0, 2, (4, 4), seed=1)
    it = iter(full)
    first = [next(it) for _ in range(3)]
    info = full.info(2)
    assert info.after == Position(0, 24, 3)
    full.set_sizes(4, (6, 2))  # from micro-step 4 on
    rest = list(it)
    assert [len(b) for b in rest] == [4, 6, 6, 6, 6]
    resumed = GlobalBatchSampler(64, 0, 2, (4, 4), seed=1)
    resumed.rewind(info.after)
    resumed.set_sizes(4, (6, 2))
    assert list(resumed) == rest
    assert first[0] != rest[0]
    with pytest.raises(InputError, match="already issued"):
        full.set_sizes(1, (4, 4))


def test_sampler_ends_epoch_on_whole_accumulation_steps() -> None:
    s = GlobalBatchSampler(50, 0, 1, (8,), accum_steps=2)
    assert len(list(s)) == 6  # 3 steps of 16; the next 16 would pass 50


# --- metrics and profile bookkeeping ----------------------------------------------------------


def test_metrics_writer_file_and_directory(tmp_path: Path) -> None:
    shared = tmp_path / "all.jsonl"
    for rank in (0, 1):
        w = MetricsWriter(shared, rank, "job")
        w.step(StepRecord.from_dict(dict.fromkeys(STEP_KEYS, 1.0) | {"loss": float("nan")}))
        w.event("done", step=3)
        w.close()
    records = read_records(shared)
    assert [r["rank"] for r in records] == [0, 0, 1, 1]
    assert records[0]["loss"] is None and records[1] == records[1] | {"event": "done", "step": 3}
    per_rank = MetricsWriter(tmp_path / "dir", 1)
    per_rank.event("start")
    per_rank.close()
    assert (tmp_path / "dir" / "rank-1.jsonl").is_file()


def test_profile_run_phases_and_oom() -> None:
    run = ProfileRun(env.ProfileSchedule((4, 8, 16), 1, 2, 16, 5))
    names = [(p.name, p.local_batch) for p in run.phases]
    assert names == [("sweep", 4), ("sweep", 8), ("sweep", 16)]
    done = [run.step_done() for _ in range(3)]
    assert done == [False, False, True] and run.phase.local_batch == 8 and run.warmup
    run.step_done()
    assert not run.warmup
    run.out_of_memory()  # at 8: skip 8 and 16, GNS at the largest size that fitted (4)
    assert run.oom_batch == 8 and (run.phase.name, run.phase.local_batch, run.phase.steps) == (
        "gns",
        4,
        5,
    )
    assert is_oom(MemoryError()) and is_oom(RuntimeError("CUDA out of memory. Tried"))
    assert not is_oom(ValueError("out of memory"))
