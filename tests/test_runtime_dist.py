"""The runtime under real torchrun with 2 gloo workers.

Each test starts real worker processes (``bench/runtime_worker.py``, or this file's own
``__main__`` scenario), bounded by a timeout, and checks what they wrote.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.runtime_common import clean_env, torchrun
from kplan.runtime import env
from kplan.runtime.metrics import read_records

pytestmark = pytest.mark.slow


def _steps(records: list[dict[str, object]], rank: int) -> list[dict[str, object]]:
    return [r for r in records if "event" not in r and r["rank"] == rank]


def test_weighted_average_equals_full_batch_gradient(tmp_path: Path) -> None:
    out = tmp_path / "weighted.json"
    proc = torchrun(["weighted", str(out)], clean_env(), script=Path(__file__))
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(out.read_text())
    for case in ("overlap", "manual", "overlap-accum2"):
        assert result[case]["sizes"] == [5, 11], result
        assert result[case]["max_abs_diff"] < 1e-6, result
        assert result[case]["max_abs_grad"] > 1e-2  # the comparison is not vacuous


def test_gns_two_workers_unequal_split_matches_exact(tmp_path: Path) -> None:
    out = tmp_path / "gns.json"
    args = ["--samples", "4096", "--batch", "64", "--lr", "0", "--init-shift", "0.3"]
    args += ["--noise", "4", "--epochs", "4", "--max-local-rank0", "16", "--gns-out", str(out)]
    proc = torchrun(args, clean_env(**{env.PID: "0"}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(out.read_text())
    ratio = result["estimate"]["gns"] / result["exact"]["gns"]
    assert 0.85 <= ratio <= 1.15, result


def test_pid_gives_the_slow_worker_less(tmp_path: Path) -> None:
    metrics = tmp_path / "m"
    args = ["--samples", str(128 * 24), "--batch", "128", "--slow-rank", "1"]
    args += ["--sleep-per-sample", "0.0004"]
    proc = torchrun(args, clean_env(**{env.METRICS_PATH: str(metrics)}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = read_records(metrics)
    last0, last1 = _steps(records, 0)[-1], _steps(records, 1)[-1]
    assert last0["step"] == last1["step"] == 23
    share = float(last0["local_batch"]) / 128  # type: ignore[arg-type]
    assert 0.6 <= share <= 0.72  # ideal 2/3: rank 1 takes twice as long per sample
    assert any(r.get("event") == "batch_sizes" for r in records)


def test_killed_worker_resumes_from_checkpoint_exactly(tmp_path: Path) -> None:
    base = ["--model", "mlp", "--samples", "2048", "--batch", "64", "--epochs", "1"]
    ref = tmp_path / "ref.pt"
    proc = torchrun([*base, "--dump", str(ref)], clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:]

    got, metrics = tmp_path / "got.pt", tmp_path / "m"
    extra = {
        env.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        env.CHECKPOINT_STEPS: "4",
        env.METRICS_PATH: str(metrics),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # pytorch#135712: gloo restarts
    }
    args = [*base, "--dump", str(got), "--kill-rank", "1", "--kill-step", "10"]
    proc = torchrun(args, clean_env(**extra), max_restarts=1, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:]

    import torch

    a, b = torch.load(ref), torch.load(got)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key
    records = read_records(metrics)
    resumes = [r for r in records if r.get("event") == "resume"]
    assert {r["step"] for r in resumes} == {8} and len(resumes) == 2
    starts = [r["restart_count"] for r in records if r.get("event") == "start"]
    assert sorted(starts) == [0, 0, 1, 1]


def test_profile_mode_sweeps_agrees_on_oom_and_exits_zero(tmp_path: Path) -> None:
    metrics = tmp_path / "m"
    schedule = env.ProfileSchedule((4, 8, 16, 32), 1, 2, 16, 3)
    extra = {
        env.PROFILE_SCHEDULE: schedule.to_json(),
        env.METRICS_PATH: str(metrics),
        env.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
    }
    args = ["--samples", "512", "--oom-above", "8", "--oom-rank", "1"]  # only rank 1 fails
    proc = torchrun(args, clean_env(**extra))
    assert proc.returncode == 0, proc.stdout[-3000:]
    records = read_records(metrics)
    for rank in (0, 1):
        mine = [r for r in records if r["rank"] == rank]
        phases = [(r["phase"], r["local_batch"]) for r in mine if "phase" in r]
        expected = [("sweep", 4)] * 3 + [("sweep", 8)] * 3 + [("gns", 8)] * 3
        assert phases == expected
        events = [r for r in mine if "event" in r]
        # on a CPU each size that fitted reports its memory estimate (model state plus what
        # autograd saved), growing with the batch; then the size that ran out
        kinds = ["start", "model", "memory", "memory", "oom", "done"]
        assert [e["event"] for e in events] == kinds
        memory = events[2:4]
        assert [e["local_batch"] for e in memory] == [4, 8]
        assert memory[0]["estimated"] and memory[1]["peak_bytes"] > memory[0]["peak_bytes"]
        assert events[4]["local_batch"] == 16
        sweep = [r for r in mine if r.get("phase") == "sweep"]
        assert all(r["global_batch"] == 2 * r["local_batch"] for r in sweep)
    assert not (tmp_path / "ckpt").exists()


# --- scenario run by torchrun (not by pytest) ---------------------------------------------------


def _weighted_scenario(out: Path) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import kplan.runtime as kr
    from bench.runtime_worker import make_data, make_model

    ctx = kr.init()
    data = make_data(256, 8, 0, 1.0)
    result = {}
    for name, sync, accum in [
        ("overlap", "overlap", 1),
        ("manual", "manual", 1),
        ("overlap-accum2", "overlap", 2),
    ]:
        torch.manual_seed(0)
        model = make_model("mlp", 8, 16)
        cfg = kr.RuntimeConfig(
            max_local_batch=5 if ctx.rank == 0 else None,  # split 16 as (5, 11)
            sync=sync,  # type: ignore[arg-type]
            accum_steps=accum,
            pid=None,
            lr_scaling="none",
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        job = kr.Job(model, opt, data, batch_size=16 * accum, config=cfg)
        grads: list[torch.Tensor] = []
        for _ in job.epochs(1):
            for x, y in job.batches():
                with job.step():
                    job.backward(F.mse_loss(job.model(x), y))
                    if job.is_last_micro_step:
                        grads = [p.grad.detach().clone() for p in job.module.parameters()]
                        sizes = list(job._state.step_sizes)
                if job.step_count == 1:
                    break
            break
        job.finish()
        # The full global batch: the first 16*accum indices of epoch 0's permutation.
        order = np.random.Generator(np.random.PCG64([0, 0])).permutation(256)[: 16 * accum]
        torch.manual_seed(0)
        ref = make_model("mlp", 8, 16)
        x_all, y_all = data.tensors
        F.mse_loss(ref(x_all[order]), y_all[order]).backward()
        diffs = [
            float((g - p.grad).abs().max())
            for g, p in zip(grads, ref.parameters(), strict=True)
            if p.grad is not None
        ]
        result[name] = {
            "sizes": sizes,
            "max_abs_diff": max(diffs),
            "max_abs_grad": max(float(p.grad.abs().max()) for p in ref.parameters()),
        }
    if ctx.rank == 0:
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1] == "weighted":
        _weighted_scenario(Path(sys.argv[2]))
