"""``kplan profile`` end to end on a built-in example: real workers, a small sweep."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.planner.profile import profile_from_dict
from kplan.profiler.procs import ProcessTree, is_running
from kplan.profiler.run import resolve, run_profile

SMALL = ["--max-local-batch", "8", "--warmup-steps", "1", "--steps", "3", "--gns-steps", "8"]


@pytest.mark.slow
def test_profile_example_on_two_workers_writes_a_profile_and_csv(tmp_path: Path) -> None:
    out, rows = tmp_path / "p.json", tmp_path / "m.csv"
    result = CliRunner().invoke(
        app,
        ["profile", "--example", "mlp-regression", "--workers", "2", *SMALL,
         "--out", str(out), "--measurements", str(rows), "--json"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    profile = profile_from_dict(json.loads(out.read_text()), source=str(out))

    sizes = [1, 2, 3, 4, 6, 8]
    assert [m.local_batch for m in profile.measurements] == sizes
    assert all(m.workers == 2 and m.nodes == 1 for m in profile.measurements)
    assert all(m.sync_time is not None and 0 <= m.sync_time <= m.step_time
               for m in profile.measurements)  # fmt: skip
    assert profile.gpu == "cpu" and profile.gpus_per_node == 2
    assert profile.max_local_batch == 8
    assert profile.base_global_batch == 256 and profile.dataset_size == 200_000
    assert profile.measured_fp32_tflops is not None and profile.measured_fp32_tflops > 0.001
    assert profile.measured_mem_bw_gbs is not None and profile.measured_mem_bw_gbs > 0.1
    # gradient bytes of the MLP (32 -> 256 -> 256 -> 1), fp32
    params = 32 * 256 + 256 + 256 * 256 + 256 + 256 + 1
    assert profile.gradient_bytes == 4 * params
    assert summary["model"]["parameters"] == params
    assert len(profile.gns) == 1 and profile.gns[0].noise_scale > 0
    assert summary["allreduce"]["nbytes"] == 4 * params
    assert summary["allreduce"]["workers"] == 2 and summary["allreduce"]["seconds"] > 0
    assert summary["compute_fit"]["b_c"] >= 0
    # each size's backward passes timed apart: part of its compute, the rest is forward's share
    assert all(0 < r["backward_time"] < r["compute_time"] for r in summary["sweep"])
    assert summary["model"]["forward_share"] == profile.forward_share
    # Memory on a CPU: the tensors autograd saved, per sample at least the input and the two
    # hidden activations' one kept storage (fp32); the sweep, not memory, set the max batch.
    assert profile.max_local_limit == "sweep" and summary["max_local_limit"] == "sweep"
    assert profile.per_sample_memory_gb is not None
    assert profile.per_sample_memory_gb * 1e9 >= 4 * (32 + 256)
    assert profile.static_memory_gb is not None and profile.static_memory_gb * 1e9 >= 8 * params
    assert any("autograd saves" in w for w in summary["warnings"])
    assert "estimated from the tensors autograd saves" in profile.provenance

    with rows.open() as f:
        table = list(csv.DictReader(f))
    assert [int(r["local_batch"]) for r in table] == sizes
    assert list(table[0])[:4] == ["nodes", "workers", "local_batch", "step_time"]
    for row, m in zip(table, profile.measurements, strict=True):
        assert float(row["step_time"]) == pytest.approx(m.step_time, rel=1e-5)

    # `kplan estimate --profile` plans from what was measured on this CPU.
    est = CliRunner().invoke(app, ["estimate", "--profile", str(out), "--json", "--top", "3"])
    assert est.exit_code == 0, est.output
    plan = json.loads(est.stdout)
    assert plan["profile"] == profile.name and plan["plans"]
    chosen = plan["chosen"]
    assert chosen["global_batch"] >= 256 and 0 < chosen["statistical_efficiency"] <= 1
    assert "device model (cpu ->" in plan["uncertainty"]


def test_profile_in_one_process_leaves_nothing_running(tmp_path: Path) -> None:
    trees: list[ProcessTree] = []
    req = resolve(
        None, "char-transformer", ["--context", "16", "--dim", "32"], workers=1,
        max_local_batch=4, warmup_steps=1, steps_per_batch=2, gns_steps=3,
        measure_device=False,
    )  # fmt: skip
    result = run_profile(req, on_start=trees.append)
    assert [m.local_batch for m in result.profile.measurements] == [1, 2, 3, 4]
    assert result.profile.measured_fp32_tflops is None
    assert result.workdir is None  # logs removed after a success
    assert not [p for p, t in trees[0].seen.items() if is_running(p, t)]
