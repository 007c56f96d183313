"""Issue 25, item 5: the README's local launch, measured. Its profile swept up to 64 per worker
while the launch ran 128 per worker, and each of its two worker groups (one torchrun each, which
sets no OMP_NUM_THREADS for a single worker) ran as many threads as the machine has cores: 4
threads on 2 cores, 2.5x the step time the profile measured at 1 thread per worker
(docs/benchmarks.md). Now the profile sweeps the whole base batch, profile and launch give each
worker the same share of the cores, and the local plan scales and widens what it cannot
measure: more threads than cores, a batch past the sweep."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from kplan.app import local_plan as lp
from kplan.app.planning import load_profile
from kplan.core.threads import oversubscription, threads_per_worker
from kplan.planner.profile import Profile, profile_from_dict, profile_to_dict
from kplan.profiler import run as profile_run
from kplan.profiler.job import JobSpec as ProfileJobSpec
from kplan.profiler.job import job_env
from kplan.profiler.schedule import ProfileSchedule

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "data" / "mlp-regression.cpu.profile.json"
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"


def _facts(cores: int) -> lp.MachineFacts:
    return {"cpu": "test CPU", "cores": cores, "gpus": []}


def _plan(prof: Profile, nodes: int, cores: int = 2) -> dict[str, object]:
    return lp.local_plan(
        prof, nodes=nodes, workers_per_node=1, dataset_size=20000, facts=_facts(cores),
        script_args=("--epochs", "1"),
    ).to_dict()  # fmt: skip


def test_the_thread_rule_shares_the_cores_unless_the_user_says() -> None:
    assert threads_per_worker(2, cores=2, environ={}) == 1
    assert threads_per_worker(1, cores=8, environ={}) == 8
    assert threads_per_worker(16, cores=8, environ={}) == 1  # at least one
    assert threads_per_worker(2, cores=2, environ={"OMP_NUM_THREADS": "2"}) == 2
    assert threads_per_worker(2, cores=2, environ={"OMP_NUM_THREADS": "zero"}) == 1
    assert oversubscription(2, 2, 2) == 2.0 and oversubscription(2, 1, 4) == 1.0


def test_an_even_share_predicts_the_profiles_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    prof = replace(load_profile(PROFILE), cpu_threads=1)
    doc = _plan(prof, nodes=2)
    assert not any("thread" in str(n) for n in doc["notes"])  # type: ignore[union-attr]
    assert "more threads than cores" not in str(doc["uncertainty"])


def test_more_threads_than_cores_scale_the_step_and_widen_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prof = replace(load_profile(PROFILE), cpu_threads=1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    even = _plan(prof, nodes=2)["chosen"]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's: 2 workers x 2 threads, 2 cores
    doc = _plan(prof, nodes=2)
    row = doc["chosen"]
    assert row["step_time_s"] == pytest.approx(2 * even["step_time_s"])  # type: ignore[index]
    widened = row["step_time_p90_s"] / row["step_time_s"]  # type: ignore[index]
    assert widened > even["step_time_p90_s"] / even["step_time_s"]  # type: ignore[index]
    assert any("each core runs 2 threads" in str(n) for n in doc["notes"])  # type: ignore[union-attr]
    assert "more threads than cores" in str(doc["uncertainty"])


def test_more_workers_than_cores_time_share_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    prof = replace(load_profile(PROFILE), cpu_threads=1)
    four = _plan(prof, nodes=4)  # 4 workers at 1 thread on 2 cores; the profile ran 2 x 1
    assert any("each core runs 2 threads" in str(n) for n in four["notes"])  # type: ignore[union-attr]


def test_a_batch_past_the_sweep_is_extrapolated_with_a_wider_sigma() -> None:
    prof = load_profile(PROFILE)
    narrow = replace(prof, max_local_batch=64, measurements=tuple(
        m for m in prof.measurements if m.local_batch <= 64
    ))  # fmt: skip
    wide = replace(narrow, max_local_batch=128)
    past, inside = _plan(narrow, nodes=2), _plan(wide, nodes=2)
    assert any(
        "past the profile's largest swept batch (64)" in str(n)
        for n in past["notes"]  # type: ignore[union-attr]
    )
    assert not any("swept batch" in str(n) for n in inside["notes"])  # type: ignore[union-attr]
    spread = {
        k: d["chosen"]["step_time_p90_s"] / d["chosen"]["step_time_s"]  # type: ignore[index]
        for k, d in (("past", past), ("inside", inside))
    }
    assert math.log(spread["past"]) > math.log(spread["inside"])
    assert "a larger batch per worker than the profile swept" in str(past["uncertainty"])


def test_a_scripts_sweep_reaches_its_base_batch() -> None:
    req = profile_run.resolve(str(SCRIPT), None, dataset_size=20000, base_batch=256)
    assert req.max_local_batch == 256  # what one worker runs at the base batch
    small = profile_run.resolve(str(SCRIPT), None, dataset_size=20000, base_batch=32)
    assert small.max_local_batch == profile_run.MIN_SWEEP_CEILING
    given = profile_run.resolve(
        str(SCRIPT), None, dataset_size=20000, base_batch=256, max_local_batch=16
    )
    assert given.max_local_batch == 16


def test_the_profiles_workers_get_the_launchs_thread_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ProfileJobSpec(
        script=SCRIPT, args=(), workers=2, schedule=ProfileSchedule((1, 2), 0, 1, 2, 0),
        cpu_only=True, allreduce_bench=False, startup_timeout_s=9, step_timeout_s=9, timeout_s=9,
    )  # fmt: skip
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert job_env(spec, tmp_path / "m.jsonl")["OMP_NUM_THREADS"] == str(threads_per_worker(2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert job_env(spec, tmp_path / "m.jsonl")["OMP_NUM_THREADS"] == "3"


def test_the_profiles_threads_and_exit_round_trip_and_are_checked() -> None:
    prof = replace(load_profile(PROFILE), cpu_threads=2, shutdown_s=1.25)
    doc = profile_to_dict(prof)
    assert doc["device"]["cpu_threads"] == 2 and doc["device"]["shutdown_s"] == 1.25
    assert profile_from_dict(doc, "x") == prof
    doc["device"]["cpu_threads"] = 0
    with pytest.raises(Exception, match="cpu_threads"):
        profile_from_dict(doc, "x")


def test_the_launch_says_what_its_prediction_extrapolates_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from kplan.cli.main import app

    monkeypatch.setattr(lp, "machine_facts", lambda: _facts(2))
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    argv = ["launch", str(SCRIPT), "--nodes", "4", "--profile", str(PROFILE), "--dry-run",
            "--", "--epochs", "1"]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("predicted on this machine: ")
    assert any(x.startswith("note: 4 worker(s) x 1 thread(s) on 2 core(s)") for x in lines[1:3])
    assert any("at most 2 worker(s) avoid it" in x for x in lines)
