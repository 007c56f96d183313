"""The profiler's pure parts: sweep sizes, records, analysis, error lines, outputs, GPU names."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kplan.core.errors import DataFileError, InputError, JobError
from kplan.planner.profile import profile_from_dict
from kplan.profiler.analyze import analyze, fit_line, measurements
from kplan.profiler.device import gpu_catalog_name
from kplan.profiler.errlines import last_error_line
from kplan.profiler.examples import EXAMPLES, get_example
from kplan.profiler.job import JobSpec, job_env
from kplan.profiler.output import MEASUREMENT_COLUMNS, measurements_csv, profile_json
from kplan.profiler.records import (
    DoneEvent,
    MetricsTail,
    ModelEvent,
    OomEvent,
    Record,
    StepRecord,
    parse_record,
)
from kplan.profiler.schedule import ProfileSchedule, sweep_sizes, sweep_steps


def test_sweep_sizes_are_powers_of_two_and_midpoints() -> None:
    assert sweep_sizes(1, 32) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    assert sweep_sizes(4, 20) == (4, 6, 8, 12, 16, 20)
    assert sweep_sizes(5, 5) == (5,)
    with pytest.raises(InputError, match=r"batch range 9\.\.8"):
        sweep_sizes(9, 8)


def test_job_env_carries_the_agreed_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPLAN_MAX_STEPS", "3")  # would end the profile early: dropped
    monkeypatch.setenv("KPLAN_SEED", "7")  # kept
    schedule = ProfileSchedule((2, 4), warmup_steps=1, steps_per_batch=3, gns_batch=4, gns_steps=5)
    assert sweep_steps(schedule) == 8
    spec = JobSpec(
        script=Path("train.py"), args=(), workers=2, schedule=schedule, cpu_only=True,
        allreduce_bench=True, startup_timeout_s=1, step_timeout_s=1, timeout_s=1,
    )  # fmt: skip
    env = job_env(spec, Path("/tmp/m.jsonl"))
    assert json.loads(env["KPLAN_PROFILE_SCHEDULE"]) == {
        "local_batches": [2, 4], "warmup_steps": 1, "steps_per_batch": 3,
        "gns_batch": 4, "gns_steps": 5,
    }  # fmt: skip
    assert env["KPLAN_METRICS_PATH"] == "/tmp/m.jsonl"
    assert "KPLAN_MAX_STEPS" not in env
    assert env["KPLAN_SEED"] == "7"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert int(env["KPLAN_PROFILE_BENCH_PORT"]) > 0


@pytest.mark.parametrize(
    ("cuda_name", "catalog"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("Tesla T4", "T4"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ],
)
def test_gpu_catalog_name(cuda_name: str, catalog: str) -> None:
    assert gpu_catalog_name(cuda_name) == catalog


TORCHRUN_STDERR = """\
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default
*****************************************
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/train.py", line 8, in <module>
[rank1]:     raise ValueError("boom at step 3")
[rank1]: ValueError: boom at step 3
W1122 04:35:24.707000 6412 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
"""


TWO_RANKS_FAIL = """\
[rank1]: Traceback (most recent call last):
[rank1]: ValueError: the real cause
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer
E1122 05:01:48.133000 20062 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_04:35:24
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 6418)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""

ARGPARSE_FAIL = """\
usage: mlp_regression.py [-h] [--epochs EPOCHS]
mlp_regression.py: error: unrecognized arguments: --bogus
W1122 05:01:48.117000 20062 torch/distributed/elastic/multiprocessing/api.py:1028] Sending
E1122 05:01:48.133000 20062 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""


def test_last_error_line_prefers_the_rank_that_failed_first() -> None:
    assert last_error_line(TWO_RANKS_FAIL) == "ValueError: the real cause"
    assert last_error_line(ARGPARSE_FAIL) == (
        "mlp_regression.py: error: unrecognized arguments: --bogus"
    )


def test_last_error_line_skips_torchrun_noise() -> None:
    assert last_error_line(TORCHRUN_STDERR) == "ValueError: boom at step 3"
    assert last_error_line("Traceback (most recent call last):\nKeyboardInterrupt\n") == (
        "KeyboardInterrupt"
    )
    assert last_error_line("loading...\nsegfault in worker\n") == "segfault in worker"
    assert last_error_line("") == ""


def test_metrics_tail_keeps_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() == []
    with path.open("w") as f:
        f.write('{"event": "model", "gradient_bytes": 40, "parameters": 10}\n{"event": "oo')
    assert tail.poll() == [ModelEvent(40, 10)]
    with path.open("a") as f:
        f.write('m", "local_batch": 64}\n{"event": "something-new"}\n')
    assert tail.poll() == [OomEvent(64)]
    with path.open("a") as f:
        f.write("not json\n")
    with pytest.raises(JobError, match=r"m\.jsonl:4: bad metrics record"):
        tail.poll()


def test_parse_record_rejects_a_step_without_times() -> None:
    with pytest.raises(ValueError, match="compute_time"):
        parse_record({"step": 1, "local_batch": 2, "step_time": 0.1})


def _steps(
    b: int,
    rank: int,
    first_step: int,
    n: int,
    t: float,
    phase: str = "sweep",
    warmup: bool | None = None,
) -> list[Record]:
    return [
        StepRecord(
            step=first_step + i, rank=rank, world_size=2, local_batch=b,
            compute_time=t, sync_time=0.01, step_time=t + 0.01, loss=1.0, phase=phase,
            warmup=warmup,
            grad_sqr=2.0 if phase == "gns" else None, grad_var=30.0 if phase == "gns" else None,
        )
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("flagged", [True, False])
def test_analyze_fits_compute_time_drops_warmup_and_stops_at_oom(flagged: bool) -> None:
    records: list[Record] = [ModelEvent(4_000, 1_000)]
    step = 0
    for b in (2, 4, 8):
        for rank in (0, 1):
            # the first step of each size is a slow warm-up; the rest follow 5 ms + 1 ms * b
            records += _steps(b, rank, step, 1, 9.0, warmup=True if flagged else None)
            records += _steps(b, rank, step + 1, 3, 0.005 + 0.001 * b,
                              warmup=False if flagged else None)  # fmt: skip
        step += 4
    records.append(OomEvent(16))
    records += _steps(4, 0, step, 5, 0.01, phase="gns")
    records.append(DoneEvent(0))
    a = analyze(records, warmup=1, steps_per_batch=3)
    assert [s.local_batch for s in a.sizes] == [2, 4, 8]
    assert all(s.steps == 3 for s in a.sizes)
    assert a.compute_fit.intercept == pytest.approx(0.005)
    assert a.compute_fit.slope == pytest.approx(0.001)
    assert a.oom_batch == 16
    assert a.max_local_batch == 8
    assert a.gradient_bytes == 4_000
    assert a.gns == pytest.approx(15.0)  # grad_var / grad_sqr
    rows = measurements(a, "cpu")
    assert [(m.workers, m.local_batch) for m in rows] == [(2, 2), (2, 4), (2, 8)]
    assert rows[0].step_time == pytest.approx(0.017)
    assert rows[0].sync_time == pytest.approx(0.01)


def test_forward_share_is_what_the_backward_passes_left_of_the_compute() -> None:
    """1 - sum(backward) / sum(compute) over the sizes' means: the larger sizes weigh more; a
    size with a step that did not time its backward leaves the share to the others, none
    leaves it unmeasured; an artefact outside (0.02, 0.98) is clipped."""

    def sweep(b: int, compute: float, backward: list[float | None]) -> list[Record]:
        return [
            replace(r, backward_time=bw)  # type: ignore[type-var]
            for r, bw in zip(_steps(b, 0, 10 * b, len(backward), compute), backward, strict=True)
        ]

    model: list[Record] = [ModelEvent(4_000, 1_000)]
    a = analyze(model + sweep(2, 0.1, [0.05] * 3) + sweep(8, 0.3, [0.2] * 3), 0, 3)
    assert [s.backward_time for s in a.sizes] == pytest.approx([0.05, 0.2])
    assert a.forward_share == pytest.approx(1 - 0.25 / 0.4)
    a = analyze(model + sweep(2, 0.1, [0.05, None, 0.05]) + sweep(8, 0.3, [0.2] * 3), 0, 3)
    assert a.sizes[0].backward_time is None and a.forward_share == pytest.approx(1 / 3)
    assert analyze(model + _steps(2, 0, 0, 3, 0.1), 0, 3).forward_share is None
    assert analyze(model + sweep(2, 0.1, [0.1] * 3), 0, 3).forward_share == 0.02
    # the runtime's record carries it; a non-number is a bad record (kplan/core/records.py)
    raw = {"step": 1, "local_batch": 2, "step_time": 0.2, "compute_time": 0.1}
    assert parse_record({**raw, "backward_time": 0.06}).backward_time == 0.06  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="'backward_time' is 'x'"):
        parse_record({**raw, "backward_time": "x"})


def test_analyze_without_steps_or_model_is_a_job_error() -> None:
    with pytest.raises(JobError, match="without timing a single training step"):
        analyze([ModelEvent(4, 1), DoneEvent(0)], warmup=1, steps_per_batch=3)
    with pytest.raises(JobError, match="gradient size"):
        analyze(_steps(2, 0, 0, 4, 0.1), warmup=1, steps_per_batch=3)


def test_fit_line_nonneg() -> None:
    fit = fit_line([1, 2, 3], [3.0, 2.0, 1.0], nonneg=True)
    assert (fit.intercept, fit.slope) == (2.0, 0.0)
    fit = fit_line([1, 2], [1.0, 3.0], nonneg=True)
    assert fit.intercept == 0.0 and fit.slope == pytest.approx(7 / 5)


def test_outputs_round_trip_and_csv_columns() -> None:
    records: list[Record] = [ModelEvent(4_000, 1_000)]
    records += _steps(2, 0, 0, 4, 0.01) + _steps(4, 0, 4, 4, 0.02)
    a = analyze(records, warmup=1, steps_per_batch=3)
    from kplan.planner.profile import Profile

    profile = Profile(
        name="t", provenance="test", gpu="cpu", gpus_per_node=2, gradient_bytes=4000.0,
        base_global_batch=8, max_local_batch=4, dataset_size=100, epochs=2.0,
        measurements=measurements(a, "cpu"), measured_fp32_tflops=0.1, measured_mem_bw_gbs=20.0,
    )  # fmt: skip
    doc = json.loads(profile_json(profile))
    again = profile_from_dict(doc)
    assert again == profile
    assert doc["device"] == {"gpu": "cpu", "gpus_per_node": 2, "fp32_tflops": 0.1,
                             "mem_bw_gbs": 20.0}  # fmt: skip
    lines = measurements_csv(profile.measurements).splitlines()
    assert lines[0].split(",") == list(MEASUREMENT_COLUMNS)
    assert lines[1].startswith("1,2,2,0.02,0.01,1,,cpu")
    with pytest.raises(DataFileError):
        profile_from_dict({**doc, "measurements": []})


def test_unknown_example_lists_the_known_ones() -> None:
    with pytest.raises(InputError) as info:
        get_example("resnet-9000")
    assert all(name in info.value.hint for name in EXAMPLES)
    assert all(e.path.is_file() for e in EXAMPLES.values())
