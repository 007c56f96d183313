"""The example jobs train for real on kplan.runtime: loss goes down on 1 and 2 gloo workers."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kplan.profiler.examples import EXAMPLES
from kplan.profiler.job import free_port

# Small but real runs: a few epochs over a few hundred samples.
FLAGS = {
    "resnet-cifar": ["--epochs", "4", "--samples", "512", "--batch-size", "64", "--width", "8"],
    "char-transformer": ["--epochs", "1", "--batch-size", "32", "--context", "16", "--dim", "32"],
    "mlp-regression": ["--epochs", "6", "--samples", "2048", "--batch-size", "64",
                       "--lr", "3e-3"],
}  # fmt: skip


def _train(tmp_path: Path, name: str, workers: int) -> list[dict[str, object]]:
    script = str(EXAMPLES[name].path)
    metrics = tmp_path / "metrics.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPLAN_")}
    env.update(
        KPLAN_METRICS_PATH=str(metrics), GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",  # as torchrun sets it: no thread thrashing on a shared machine
    )  # fmt: skip
    if workers == 1:
        argv = [sys.executable, script]
    else:
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            f"--nproc-per-node={workers}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--local-addr=127.0.0.1",
            "--max-restarts=0", script,
        ]  # fmt: skip
    proc = subprocess.run(
        [*argv, *FLAGS[name]], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=240, start_new_session=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 0" in proc.stdout  # rank 0 reports each epoch
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def _losses_fall(records: list[dict[str, object]], workers: int) -> None:
    steps = [r for r in records if "step_time" in r and r.get("rank") == 0]
    assert steps, records[:5]
    assert {r["world_size"] for r in steps} == {workers}
    losses = [float(r["loss"]) for r in steps if r.get("loss") is not None]  # type: ignore[arg-type]
    k = max(2, len(losses) // 5)
    first, last = statistics.fmean(losses[:k]), statistics.fmean(losses[-k:])
    assert last < 0.8 * first, (first, last, len(losses))
    assert any(r.get("event") == "done" for r in records)
    model = [r for r in records if r.get("event") == "model"]
    assert model and int(model[0]["gradient_bytes"]) > 0  # type: ignore[call-overload]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_in_one_process(tmp_path: Path, name: str) -> None:
    _losses_fall(_train(tmp_path, name, workers=1), workers=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_on_two_gloo_workers(tmp_path: Path, name: str) -> None:
    _losses_fall(_train(tmp_path, name, workers=2), workers=2)
