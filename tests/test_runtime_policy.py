"""The policy API: built-in policies, policy loading, the control file, progress epochs,
actions applied on every rank at the same step, and resuming on another world size.

The multi-worker tests start real torchrun/gloo workers running this file's ``__main__``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kplan.runtime as kr
from bench.runtime_common import clean_env, run, torchrun
from bench.runtime_worker import make_data, make_model
from kplan.core.errors import InputError
from kplan.runtime import env
from kplan.runtime.builtin_policies import GoodputBatch, StragglerReplace
from kplan.runtime.metrics import read_records
from kplan.runtime.policy import Actions, Monitor, Policy, PolicyRunner, Requests
from kplan.runtime.policy_registry import load_policy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("KPLAN_", "TORCHELASTIC_")) or name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


# --- environment and loading -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        (env.POLICIES, "goodput,fast", "KPLAN_POLICIES='goodput,fast': 'fast' is not a policy"),
        (env.POLICIES, "x.py:1Bad", "KPLAN_POLICIES='x.py:1Bad'"),
        (env.EPOCHS_BY, "tokens", "KPLAN_EPOCHS_BY='tokens' is not one of data, progress"),
    ],
)
def test_env_rejects_bad_values(name: str, value: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        kr.RuntimeConfig.from_env(environ={name: value})


def test_env_round_trip_and_config() -> None:
    out = env.kplan_environ(
        policies=["goodput", "a/b.py:C"], epochs_by="progress", control_path="/tmp/c.json"
    )
    assert env.policies(out) == ("goodput", "a/b.py:C")
    assert env.epochs_by(out) == "progress" and env.control_path(out) == Path("/tmp/c.json")
    cfg = kr.RuntimeConfig.from_env(kr.RuntimeConfig(policies=("straggler",)), out)
    assert cfg.policies == ("straggler", "goodput", "a/b.py:C")  # added to the script's
    assert cfg.epochs_by == "progress" and cfg.control_path == Path("/tmp/c.json")


def test_control_file_parsing() -> None:
    doc = {"schema": "kplan.control/1", "seq": 3, "time": 100.0, "spend_usd": 1.5}
    doc |= {"budget_usd": None, "usd_per_hour": 3.6, "deadline_time": None}
    doc |= {"global_batch": 64, "stop": None}
    control = env.parse_control(json.dumps(doc))
    assert control == env.Control(3, 100.0, 1.5, None, 3.6, None, 64, None)
    assert env.parse_control(control.to_json()) == control
    for bad, match in [
        ({**doc, "schema": "x"}, "schema 'x'"),
        ({**doc, "global_batch": 0}, "global_batch=0"),
        ({**doc, "spend_usd": "a"}, "spend_usd='a' is not a number"),
        ({**doc, "seq": 1.5}, "seq=1.5"),
    ]:
        with pytest.raises(InputError, match=match):
            env.parse_control(json.dumps(bad))
    with pytest.raises(InputError, match="not JSON"):
        env.parse_control('{"schema": "kplan.control/1", "se')


def test_load_policies_from_names_files_and_modules(tmp_path: Path) -> None:
    assert isinstance(load_policy("goodput"), GoodputBatch)
    assert isinstance(load_policy("straggler"), StragglerReplace)
    example = load_policy("kplan.examples.policies.plateau:BatchOnPlateau")
    assert type(example).__name__ == "BatchOnPlateau"
    path = REPO / "kplan" / "examples" / "policies" / "budget.py"
    assert type(load_policy(f"{path}:BudgetGuard")).__name__ == "BudgetGuard"
    (tmp_path / "mine.py").write_text(
        "from kplan.runtime import Policy\nclass Mine(Policy):\n    pass\nclass NotOne:\n    pass\n"
    )
    (tmp_path / "broken.py").write_text("def broken(:\n")
    assert type(load_policy(f"{tmp_path}/mine.py:Mine")).__name__ == "Mine"
    for spec, match in [
        (f"{tmp_path}/missing.py:Mine", "no file"),
        (f"{tmp_path}/mine.py:Other", "'Other' is not a kplan.runtime.Policy subclass"),
        (f"{tmp_path}/mine.py:NotOne", "'NotOne' is not a kplan.runtime.Policy subclass"),
        (f"{tmp_path}/broken.py:Mine", "importing .*broken.py failed: SyntaxError"),
        ("no_such_module_xyz:Mine", "cannot import 'no_such_module_xyz'"),
    ]:
        with pytest.raises(InputError, match=f"KPLAN_POLICIES: .*{match}"):
            load_policy(spec)


# --- built-in policies on synthetic measurements ------------------------------------------------


def _monitor(**fields: Any) -> Monitor:
    values: dict[str, Any] = {
        "step": 0, "epoch": 0, "progress": 0.0, "progress_target": None, "global_batch": 32,
        "base_batch": 32, "accum_steps": 1, "world_size": 2, "local_world_size": 1,
        "dataset_size": 100_000, "max_local_batches": (None, None), "pid": True,
        "timed_step": None, "local_batches": (16, 16), "compute_times": None, "step_time": None,
        "throughput": None, "sync_time": 0.0, "gns": None, "grad_sqr": None, "grad_var": None,
        "loss": None, "lr": None, "elapsed_s": 0.0, "spend_usd": None, "budget_usd": None,
        "usd_per_hour": None, "deadline_s_left": None,
    }  # fmt: skip
    values.update(fields)
    return Monitor(**values)


class _Sink:
    """A rank-0 request sink that records launcher events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.requests = Requests(True, lambda **f: self.events.append(f))


def _drive_goodput(
    policy: GoodputBatch, *, fixed: float, per_sample: float, sync: float, noise: float,
    steps: int, start: int = 32, world: int = 2,
) -> list[int]:  # fmt: skip
    """Run ``policy`` against a simulated job: compute = fixed + per_sample * b per rank.

    The simulated job applies a requested batch one step later (as the runtime does); the
    splits alternate a little around equal shares, as the PID controller's do.
    """
    sink = _Sink()
    act = Actions(sink.requests, "GoodputBatch")
    batch, batches = start, [start]
    for step in range(1, steps):
        wiggle = (step % 3 - 1) * max(batch // (8 * world), 1)
        local = [batch // world + wiggle] + [batch // world] * (world - 2)
        local.append(batch - sum(local))
        times = tuple(fixed + per_sample * b for b in local)
        wall = max(times) + sync
        m = _monitor(
            step=step, global_batch=batch, world_size=world, max_local_batches=(None,) * world,
            timed_step=step - 2, local_batches=tuple(local), compute_times=times,
            step_time=wall, sync_time=sync, gns=noise, grad_sqr=1.0, grad_var=noise,
        )  # fmt: skip
        sink.requests.monitor = m
        policy.after_step(m, act)
        if sink.requests.batch is not None:
            batch = sink.requests.batch.batch
            sink.requests.batch = None
            batches.append(batch)
    return batches


def _best_batch(fixed: float, per_sample: float, sync: float, noise: float, world: int) -> int:
    def goodput(b: int) -> float:
        return b / (fixed + per_sample * b / world + sync) * (noise + 32) / (noise + b)

    return max(range(32, 32 * 16 + 1), key=goodput)


@pytest.mark.parametrize(
    ("fixed", "per_sample", "sync", "noise"),
    [(2e-3, 1e-5, 1e-3, 400.0), (1e-3, 1e-4, 5e-4, 3000.0), (5e-3, 2e-5, 2e-3, 100.0)],
)
def test_goodput_batch_moves_to_the_goodput_optimum(
    fixed: float, per_sample: float, sync: float, noise: float
) -> None:
    policy = GoodputBatch(every=5)
    batches = _drive_goodput(
        policy, fixed=fixed, per_sample=per_sample, sync=sync, noise=noise, steps=400
    )
    best = _best_batch(fixed, per_sample, sync, noise, 2)
    final = batches[-1]

    def goodput(b: int) -> float:
        return b / (fixed + per_sample * b / 2 + sync) * (noise + 32) / (noise + b)

    assert final > 32, batches
    assert goodput(final) >= 0.95 * goodput(best), (batches, best)
    assert len(batches) <= 8, batches  # hysteresis: a few moves, no oscillation


def test_goodput_batch_keeps_the_batch_when_noise_is_small() -> None:
    policy = GoodputBatch(every=5)
    # B_noise 4 << B0: a bigger batch only wastes samples; going below B0 is not allowed.
    batches = _drive_goodput(policy, fixed=1e-3, per_sample=1e-5, sync=0, noise=4, steps=200)
    assert batches == [32]


def test_goodput_batch_respects_memory_and_max_batch() -> None:
    policy = GoodputBatch(every=5, max_batch=96)
    batches = _drive_goodput(policy, fixed=5e-3, per_sample=1e-6, sync=0, noise=1e5, steps=300)
    assert max(batches) <= 96 and batches[-1] == 96
    m = _monitor(max_local_batches=(20, 30))
    assert policy.bounds(m) == (32, 50)
    with pytest.raises(InputError, match="global batch 64 is not a multiple of 1 in"):
        sink = _Sink()
        sink.requests.monitor = m
        Actions(sink.requests, "P").set_global_batch(64)


def test_straggler_replace_asks_once_per_node() -> None:
    policy = StragglerReplace(sustain=5, cooldown_s=100)
    sink = _Sink()
    act = Actions(sink.requests, "StragglerReplace")
    for step in range(30):
        times = (0.1, 0.1, 0.1, 0.1 if step < 3 else 0.3)  # rank 3 at 1/3 the speed
        m = _monitor(
            step=step, world_size=4, local_world_size=2, local_batches=(8, 8, 8, 8),
            compute_times=times, timed_step=step, elapsed_s=float(step),
        )  # fmt: skip
        sink.requests.monitor = m
        policy.after_step(m, act)
    assert len(sink.events) == 1, sink.events
    event = sink.events[0]
    assert event["action"] == "replace" and event["node_rank"] == 1 and event["step"] == 7
    assert "rank 3" in event["reason"]
    two = StragglerReplace(sustain=1)  # too few workers to tell who is slow
    m = _monitor(local_batches=(8, 8), compute_times=(0.1, 0.9), timed_step=0)
    two.after_step(m, act)
    assert len(sink.events) == 1


def test_actions_count_only_on_rank_zero() -> None:
    events: list[dict[str, Any]] = []
    other = Requests(False, lambda **f: events.append(f))
    act = Actions(other, "P")
    act.set_global_batch(64)
    act.stop("x")
    act.resize(nodes=2)
    act.replace_node(0)
    assert other.batch is None and other.stop is None and not events
    with pytest.raises(InputError, match="resize\\(\\) without a change"):
        act.resize()
    runner = PolicyRunner([], rank0=True, write_event=lambda **f: events.append(f))
    runner.launcher.resize(nodes=3, reason="a")
    runner.launcher.resize(nodes=3, reason="a")  # the same request again: written once
    assert len(events) == 1 and events[0]["nodes"] == 3


# --- real jobs in one process --------------------------------------------------------------------


def _job(
    tmp_path: Path, batch: int = 8, samples: int = 32768, lr: float = 0.002, **cfg: Any
) -> kr.Job:
    ctx = kr.init()
    torch.manual_seed(0)
    model = make_model("linear", 16, 0).to(ctx.device)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    policies = cfg.pop("policies", ())
    config = kr.RuntimeConfig(metrics_path=tmp_path / "m.jsonl", **cfg)
    return kr.Job(
        model, opt, make_data(samples, 16, 0, 4.0), batch_size=batch, config=config,
        policies=policies,
    )  # fmt: skip


def _train(job: kr.Job, epochs: int, each: Any = None) -> list[int]:
    seen = []
    for epoch in job.epochs(epochs):
        seen.append(epoch)
        for x, y in job.batches():
            with job.step():
                job.backward(F.mse_loss(job.model(x), y))
            if each is not None:
                each(job)
    return seen


def _steps(path: Path, rank: int = 0) -> list[dict[str, Any]]:
    return [r for r in read_records(path) if "event" not in r and r["rank"] == rank]


def _events(path: Path, action: str | None = None) -> list[dict[str, Any]]:
    out = [r for r in read_records(path) if r.get("event") == "policy"]
    return [r for r in out if action is None or r["action"] == action]


def test_goodput_batch_raises_a_too_small_batch_on_a_real_job(tmp_path: Path) -> None:
    """B0 = 8 on a tiny model: per-step overhead dominates, the noise scale is far above 8."""
    job = _job(tmp_path, max_steps=500, policies=[GoodputBatch()], lr_scaling="adascale")
    _train(job, 10)
    steps = _steps(tmp_path / "m.jsonl")
    moves = _events(tmp_path / "m.jsonl", "set_batch")
    assert moves and all(e["policy"] == "GoodputBatch" for e in moves)
    assert job.global_batch >= 32, moves

    def rate(batch: int) -> float:
        runs = [r for r in steps if r["global_batch"] == batch][3:]
        return batch * len(runs) / sum(r["step_time"] for r in runs)

    assert rate(job.global_batch) > 2.0 * rate(8), (rate(8), rate(job.global_batch))
    # Every change is in force from the step its event names, with the LR following.
    for e in moves:
        at = next(r for r in steps if r["step"] == e["step"])
        before = next(r for r in steps if r["step"] == e["step"] - 1)
        assert (before["global_batch"], at["global_batch"]) == (e["previous"], e["global_batch"])


class _Recorder(Policy):
    """Records every hook call; asks for batch 64 after ``grow_at`` steps."""

    def __init__(self, grow_at: int | None = None) -> None:
        self.seen: list[tuple[str, Monitor]] = []
        self.grow_at = grow_at

    def before_epoch(self, m: Monitor, act: Actions) -> None:
        self.seen.append(("before_epoch", m))

    def after_epoch(self, m: Monitor, act: Actions) -> None:
        self.seen.append(("after_epoch", m))

    def before_step(self, m: Monitor, act: Actions) -> None:
        self.seen.append(("before_step", m))

    def after_step(self, m: Monitor, act: Actions) -> None:
        self.seen.append(("after_step", m))
        if m.step == self.grow_at:
            act.set_global_batch(64, "test")


def test_the_progress_target_is_the_planners_samples_at_the_base_batch(tmp_path: Path) -> None:
    """E x N/B0 base-batch steps (N x E samples, as the planner counts them), not
    E x ceil(N/B0): 1,000 samples at 32 are 31.25 steps of progress an epoch, and a pass at B0
    (the tail skipped) makes 31."""
    job = _job(tmp_path, batch=32, samples=1000, lr_scaling="sqrt", epochs_by="progress")
    _train(job, 2)
    records = read_records(tmp_path / "m.jsonl")
    (start,) = [r for r in records if r.get("event") == "epochs"]
    assert start["target_progress"] == pytest.approx(2 * 1000 / 32)  # 62.5, was 64
    steps = _steps(tmp_path / "m.jsonl")
    assert len(steps) == 63  # 31 + 31 in two passes, then one step into a third
    assert steps[-2]["progress"] < 62.5 <= steps[-1]["progress"]


def test_progress_epochs_run_until_the_statistical_target(tmp_path: Path) -> None:
    recorder = _Recorder(grow_at=8)
    cfg = {"lr_scaling": "sqrt", "epochs_by": "progress", "policies": [recorder]}
    job = _job(tmp_path, batch=32, samples=1024, **cfg)
    epochs = _train(job, 2)
    # The request after 8 steps rides step 8 and holds from step 9: progress 1 per step at 32
    # for 9 steps, then sqrt(2) per step at 64 until 2 x ceil(1024/32) = 64: 39 more steps.
    steps = _steps(tmp_path / "m.jsonl")
    assert [r["global_batch"] for r in steps] == [32] * 9 + [64] * 39
    assert steps[-1]["progress"] == pytest.approx(9 + 39 * math.sqrt(2))
    assert steps[-2]["progress"] < 64 <= steps[-1]["progress"]
    assert epochs == [0, 1, 2]  # more data passes than E: a bigger batch makes less progress
    hooks = [name for name, _ in recorder.seen]
    assert hooks[:3] == ["before_epoch", "before_step", "after_step"]
    assert hooks.count("before_step") == hooks.count("after_step") == 48
    assert hooks.count("before_epoch") == hooks.count("after_epoch") == 3
    boundary = hooks.index("after_epoch")
    assert hooks[boundary - 1 : boundary + 3] == [
        "after_step", "after_epoch", "before_epoch", "before_step"
    ]  # fmt: skip
    assert recorder.seen[boundary + 1][1].epoch == 1
    last = recorder.seen[-2][1]  # the last after_step
    assert last.progress_target == 64 and last.step == 48 and last.global_batch == 64
    assert last.timed_step == 46 and last.local_batches == (64,)
    assert last.step_time is not None and last.throughput is not None
    assert last.throughput == pytest.approx(64 / last.step_time)
    assert read_records(tmp_path / "m.jsonl")[-1]["event"] == "done"


def _write_control(path: Path, **fields: Any) -> None:
    doc = {"schema": "kplan.control/1", "seq": 1, "time": time.time(), "spend_usd": 2.0}
    doc |= {"budget_usd": 10.0, "usd_per_hour": 3600.0, "deadline_time": None}
    doc |= {"global_batch": None, "stop": None} | fields
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def test_control_file_sets_batch_stops_and_feeds_the_monitor(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    start = time.time()
    _write_control(control, time=start)
    recorder = _Recorder()
    job = _job(
        tmp_path, batch=16, samples=4096, control_path=control, policies=[recorder],
        checkpoint_dir=tmp_path / "ckpt",
    )  # fmt: skip

    def each(job: kr.Job) -> None:
        if job.step_count == 3:
            _write_control(control, seq=2, global_batch=48, time=start)
            time.sleep(1.05)  # the file is read at most once a second
        if job.step_count == 10:
            control.write_text('{"schema": "kplan.control/1", "seq": 9, "glo')  # partial: kept
            time.sleep(1.05)
        if job.step_count == 14:
            _write_control(control, seq=2, global_batch=32, time=start)  # same seq: ignored
            time.sleep(1.05)
        if job.step_count == 20:
            _write_control(control, seq=3, stop="budget nearly spent", time=start)
            time.sleep(1.05)

    _train(job, 5, each)
    assert job.stopped == "budget nearly spent"
    steps = _steps(tmp_path / "m.jsonl")
    batches = [r["global_batch"] for r in steps]
    assert batches == [16] * 5 + [48] * (len(batches) - 5) and len(batches) == 22
    moves = _events(tmp_path / "m.jsonl")
    assert [(e["action"], e["policy"], e["step"]) for e in moves] == [
        ("set_batch", "launcher", 5),
        ("stop", "launcher", 22),
    ]
    records = read_records(tmp_path / "m.jsonl")
    done = records[-1]
    assert done["event"] == "done" and done["stopped"] == "budget nearly spent"
    assert [r["reason"] for r in records if r.get("event") == "checkpoint"] == ["final"]
    money = [m for name, m in recorder.seen if name == "after_step" and m.spend_usd is not None]
    assert money and all(m.budget_usd == 10.0 and m.usd_per_hour == 3600.0 for m in money)
    assert money[0].deadline_s_left is None
    # $3600/h = $1/s: spend = 2 + seconds since the file's time
    assert all(2.0 + m.elapsed_s <= m.spend_usd <= 2.0 + time.time() - start for m in money)
    resumed = _job(
        tmp_path, batch=16, samples=4096, control_path=control, checkpoint_dir=tmp_path / "ckpt"
    )
    assert resumed._state.runner.control_seq == 3 and resumed.global_batch == 48


# --- real torchrun jobs -------------------------------------------------------------------------

SCRIPTED = '''
import json, os
from pathlib import Path
from kplan.runtime import Policy

class Scripted(Policy):
    """Batch 64 after step 4, a resize request after step 6, stop after step 12."""

    def __init__(self):
        self.out = Path(os.environ["TEST_MONITORS"]) / f"rank-{os.environ.get('RANK', '0')}.jsonl"

    def after_step(self, m, act):
        with open(self.out, "a") as handle:
            handle.write(json.dumps(m.__dict__) + "\\n")
        if m.step == 4:
            act.set_global_batch(64, "scripted")
        if m.step == 6:
            act.resize(nodes=2, workers_per_node=1, reason="scripted resize")
        if m.step == 12:
            act.stop("enough")
'''


@pytest.mark.slow
def test_policy_actions_apply_on_every_rank_at_the_same_step(tmp_path: Path) -> None:
    (tmp_path / "scripted.py").write_text(SCRIPTED)
    monitors = tmp_path / "monitors"
    monitors.mkdir()
    extra = {
        env.POLICIES: f"{tmp_path / 'scripted.py'}:Scripted",
        env.METRICS_PATH: str(tmp_path / "m"),
        env.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        "TEST_MONITORS": str(monitors),
    }
    args = ["train", "--batch", "32", "--samples", "2048", "--epochs", "3"]
    proc = torchrun(args, clean_env(**extra), script=Path(__file__))
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in (0, 1):
        steps = _steps(tmp_path / "m", rank)
        assert [r["global_batch"] for r in steps] == [32] * 5 + [64] * 8, rank
    policy = _events(tmp_path / "m")
    assert {e["rank"] for e in policy} == {0}
    assert [(e["action"], e["step"]) for e in policy] == [
        ("set_batch", 5), ("resize", 6), ("stop", 13)
    ]  # fmt: skip
    resize = policy[1]
    assert (resize["nodes"], resize["workers_per_node"], resize["instance_type"]) == (2, 1, None)
    done = [r for r in read_records(tmp_path / "m") if r.get("event") == "done"]
    assert len(done) == 2 and done[0]["stopped"] == "enough"
    assert (tmp_path / "ckpt" / "latest").read_text() == "step-000000013"
    zero = (monitors / "rank-0.jsonl").read_text().splitlines()
    one = (monitors / "rank-1.jsonl").read_text().splitlines()
    assert len(zero) == 13 and zero == one  # every value identical on both ranks
    last = json.loads(zero[-1])
    assert last["world_size"] == 2 and len(last["compute_times"]) == 2


@pytest.mark.slow
def test_resume_on_another_world_size_two_one_two(tmp_path: Path) -> None:
    base = ["train", "--batch", "32", "--samples", "1024", "--epochs", "1"]
    ref = tmp_path / "ref.pt"
    ref_env = clean_env(**{env.MAX_STEPS: "24"})  # one process: the same full-batch gradients
    proc = run([sys.executable, str(Path(__file__)), *base, "--dump", str(ref)], ref_env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    extra = {env.CHECKPOINT_DIR: str(tmp_path / "ckpt"), env.METRICS_PATH: str(tmp_path / "m")}
    got = tmp_path / "got.pt"
    for max_steps, workers in [(8, 2), (16, 1), (24, 2)]:
        run_env = clean_env(**extra, **{env.MAX_STEPS: str(max_steps)})
        args = [*base, "--dump", str(got)]
        if workers == 1:
            proc = run([sys.executable, str(Path(__file__)), *args], run_env)
        else:
            proc = torchrun(args, run_env, script=Path(__file__))
        assert proc.returncode == 0, proc.stdout[-3000:]
    a, b = torch.load(ref), torch.load(got)
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key
    steps = _steps(tmp_path / "m")
    assert [r["step"] for r in steps] == list(range(24))
    assert [r["world_size"] for r in steps] == [2] * 8 + [1] * 8 + [2] * 8
    resumes = [r["step"] for r in read_records(tmp_path / "m") if r.get("event") == "resume"]
    assert resumes == [8, 16, 16]  # one per rank


# --- scenario run by torchrun or python (not by pytest) ------------------------------------------


def _train_scenario(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int)
    p.add_argument("--samples", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--dump", type=Path, default=None)
    args = p.parse_args(argv)
    ctx = kr.init()
    torch.manual_seed(0)
    model = make_model("mlp", 8, 16).to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    job = kr.Job(model, opt, make_data(args.samples, 8, 0, 1.0), batch_size=args.batch)
    _train(job, args.epochs)
    if ctx.rank == 0 and args.dump is not None:
        torch.save({k: v.detach().clone() for k, v in job.module.state_dict().items()}, args.dump)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        _train_scenario(sys.argv[2:])
