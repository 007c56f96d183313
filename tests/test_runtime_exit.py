"""Exit status of runtime workers under real torchrun (2 gloo workers).

After training completes the runtime ends the process itself at exit (skipping the gloo
teardown that can abort, pytorch#190489); this must never hide a failure that happens after
training: an exception or a non-zero ``sys.exit`` keeps its exit status.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.runtime_common import clean_env, torchrun

pytestmark = pytest.mark.slow

_SCRIPT = """
import sys
import torch
import torch.nn.functional as F
import kplan.runtime as kr

ctx = kr.init()
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = torch.nn.Linear(4, 1)
job = kr.Job(model, torch.optim.SGD(model.parameters(), lr=0.1), data, batch_size=16)
for _ in job.epochs(1):
    for x, y in job.batches():
        with job.step():
            job.backward(F.mse_loss(job.model(x), y))
print(f"trained rank {ctx.rank}", flush=True)
mode = sys.argv[1]
if mode == "raise" and ctx.rank == 1:
    raise RuntimeError("evaluation failed after training")
if mode == "exit3" and ctx.rank == 1:
    sys.exit(3)
"""


@pytest.mark.parametrize(("mode", "ok"), [("clean", True), ("raise", False), ("exit3", False)])
def test_exit_status_after_training(tmp_path: Path, mode: str, ok: bool) -> None:
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT)
    proc = torchrun([mode], clean_env(), script=script, timeout=90)
    output = (proc.stdout or "") + (proc.stderr or "")
    assert "trained rank 0" in output and "trained rank 1" in output, output[-2000:]
    assert (proc.returncode == 0) is ok, output[-2000:]
    if mode == "raise":
        assert "evaluation failed after training" in output
    assert "terminate called without an active exception" not in output
