"""The Job in one process (no torchrun): GNS variants, accumulation, resume, SIGTERM, profile."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kplan.runtime as kr
from bench.runtime_worker import exact_noise_scale, make_data, make_model
from kplan.core.errors import InputError
from kplan.core.records import STEP_KEYS
from kplan.runtime import env
from kplan.runtime.metrics import read_records


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("KPLAN_", "TORCHELASTIC_")) or name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _job(
    config: kr.RuntimeConfig,
    *,
    lr: float = 0.05,
    batch: int = 32,
    samples: int = 1024,
    shift: float = 0.0,
    noise: float = 1.0,
    adam: bool = False,
) -> kr.Job:
    ctx = kr.init()
    torch.manual_seed(0)
    model = make_model("linear", 8, 0).to(ctx.device)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=lr)
        if adam
        else torch.optim.SGD(model.parameters(), lr=lr)
    )
    data = make_data(samples, 8, 0, noise)
    return kr.Job(model, opt, data, batch_size=batch, config=config)


def _train(job: kr.Job, epochs: int) -> None:
    for _ in job.epochs(epochs):
        for x, y in job.batches():
            with job.step():
                job.backward(F.mse_loss(job.model(x), y))


def _params(job: kr.Job) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in job.module.parameters()])


@pytest.mark.parametrize(("accum", "adam"), [(4, False), (1, False), (4, True)])
def test_single_worker_gns_matches_exact(accum: int, adam: bool) -> None:
    """One worker: micro-batches (accumulation) or consecutive steps as the small batches."""
    cfg = kr.RuntimeConfig(accum_steps=accum, lr_scaling="none", gns_smoothing=0.99)
    job = _job(cfg, lr=0.0, batch=64, samples=4096, shift=0.3, noise=4.0, adam=adam)
    _train(job, 5)
    denom = None
    if adam:
        from kplan.runtime.sync import Preconditioner

        pre = Preconditioner(job.optimizer)
        denom = [d for p in job.module.parameters() if (d := pre.denom(p)) is not None]
    exact = exact_noise_scale(job.module, make_data(4096, 8, 0, 4.0), denom)["gns"]
    assert job.gns is not None
    assert job.gns == pytest.approx(exact, rel=0.15)


def test_accumulation_equals_one_big_batch() -> None:
    a = _job(kr.RuntimeConfig(accum_steps=4, max_steps=10))
    _train(a, 1)
    b = _job(kr.RuntimeConfig(accum_steps=1, max_steps=10))
    _train(b, 1)
    assert torch.allclose(_params(a), _params(b), atol=1e-6, rtol=0)


def test_resume_is_exact_and_writes_metrics(tmp_path: Path) -> None:
    ref = _job(kr.RuntimeConfig(max_steps=20))
    _train(ref, 3)
    cfg = kr.RuntimeConfig(
        checkpoint_dir=tmp_path / "ckpt", checkpoint_steps=7, metrics_path=tmp_path / "m.jsonl"
    )
    first = _job(kr.RuntimeConfig(**{**cfg.__dict__, "max_steps": 9}))
    _train(first, 3)  # stops at step 9: checkpoints at 7 and the final one at 9
    assert (tmp_path / "ckpt" / "latest").read_text() == "step-000000009"
    second = _job(kr.RuntimeConfig(**{**cfg.__dict__, "max_steps": 20}))
    assert second.step_count == 9 and second.epoch == 0
    _train(second, 3)
    assert second.step_count == 20
    assert torch.allclose(_params(ref), _params(second), atol=1e-6, rtol=0)
    records = read_records(tmp_path / "m.jsonl")
    steps = [r for r in records if "event" not in r]
    assert set(STEP_KEYS) <= set(steps[0])
    assert [r["step"] for r in steps] == list(range(20))
    events = [r["event"] for r in records if "event" in r]
    assert events.count("checkpoint") == 4 and events.count("resume") == 1  # 7, 9, 14, 20
    assert events[-1] == "done"


def test_sigterm_checkpoints_and_exits_143(tmp_path: Path) -> None:
    cfg = kr.RuntimeConfig(checkpoint_dir=tmp_path / "c", metrics_path=tmp_path / "m")
    job = _job(cfg)
    with pytest.raises(SystemExit) as info:
        for _ in job.epochs(2):
            for x, y in job.batches():
                if job.step_count == 5:
                    os.kill(os.getpid(), signal.SIGTERM)  # the spot notice
                with job.step():
                    job.backward(F.mse_loss(job.model(x), y))
    assert info.value.code == 143
    assert (tmp_path / "c" / "latest").read_text() == "step-000000006"
    resumed = _job(cfg)
    assert resumed.step_count == 6
    reasons = [r.get("reason") for r in read_records(tmp_path / "m") if r.get("event")]
    assert "sigterm" in reasons


def test_loop_misuse_is_reported() -> None:
    job = _job(kr.RuntimeConfig(accum_steps=2, gns="off"))  # (with GNS on, grads are stashed)
    with pytest.raises(InputError, match=r"outside `for epoch in job\.epochs"):
        next(iter(job.batches()))
    for _ in job.epochs(1):
        batches = job.batches()
        x, y = next(batches)
        with pytest.raises(InputError, match=r"outside `with job\.step"):
            job.backward(F.mse_loss(job.model(x), y))
        with job.step():
            with pytest.raises(InputError, match="expected a scalar"):
                job.backward(F.mse_loss(job.model(x), y, reduction="none"))
            job.backward(F.mse_loss(job.model(x), y))
        x, y = next(batches)
        job.optimizer.zero_grad()
        with pytest.raises(InputError, match="cleared inside an accumulation step"), job.step():
            job.backward(F.mse_loss(job.model(x), y))
        break


def test_profile_mode_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = env.ProfileSchedule((4, 8, 16, 32), 1, 2, 64, 4)
    monkeypatch.setenv(env.PROFILE_SCHEDULE, schedule.to_json())
    monkeypatch.setenv(env.METRICS_PATH, str(tmp_path / "m"))
    monkeypatch.setenv(env.CHECKPOINT_DIR, str(tmp_path / "c"))
    job = _job(kr.RuntimeConfig())
    assert job.profiling
    for _ in job.epochs(1):
        for x, y in job.batches():
            with job.step():
                if len(x) > 8:
                    raise MemoryError("fake: does not fit")
                job.backward(F.mse_loss(job.model(x), y))
    records = read_records(tmp_path / "m")
    steps = [(r["phase"], r["local_batch"], r["warmup"]) for r in records if "phase" in r]
    sweep = [("sweep", 4, True)] + [("sweep", 4, False)] * 2
    sweep += [("sweep", 8, True)] + [("sweep", 8, False)] * 2
    assert steps == sweep + [("gns", 8, False)] * 4
    events = [r for r in records if "event" in r]
    assert [e["event"] for e in events][-2:] == ["oom", "done"]
    assert events[-2]["local_batch"] == 16
    assert not (tmp_path / "c").exists()


def test_lr_ramps_to_the_scaled_batch_and_follows_set_global_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env.GLOBAL_BATCH, "64")  # the launcher runs 2x the script's batch of 32
    cfg = kr.RuntimeConfig(lr_scaling="linear", lr_ramp_steps=4, metrics_path=tmp_path / "m")
    job = _job(cfg, lr=0.1, batch=32, samples=2048)
    assert (job.base_batch, job.global_batch) == (32, 64)
    for _ in job.epochs(1):
        for x, y in job.batches():
            with job.step():
                job.backward(F.mse_loss(job.model(x), y))
            if job.step_count == 6:
                job.set_global_batch(128)  # from the next step on, ramped from 2x to 4x
            if job.step_count == 12:
                break
        break
    job.finish()
    records = [r for r in read_records(tmp_path / "m") if "event" not in r]
    lrs = [round(r["lr"], 6) for r in records]
    assert lrs == [0.125, 0.15, 0.175, 0.2, 0.2, 0.2, 0.25, 0.3, 0.35, 0.4, 0.4, 0.4]
    assert [r["global_batch"] for r in records] == [64] * 6 + [128] * 6
    assert job.progress == pytest.approx(2 * 6 + 4 * 6)
