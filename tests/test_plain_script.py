"""A script without the kplan runtime (issue 26, item 4): found by reading its source, run as
plain torchrun/DDP with a note before it starts, and reported with what kplan could not
measure instead of "0 steps". The end-to-end test launches a real two-worker gloo DDP script
on the local provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.launcher.plainscript import PLAIN_NOTE, source_uses_runtime, uses_runtime
from tests.test_provider_local import kill_leftovers

KPLAN = Path(sys.executable).with_name("kplan")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "kplan" / "examples" / "mlp_regression.py"

PLAIN_DDP = """\
import json, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)  # different data per rank: DDP's all-reduce keeps the weights equal
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
weights = [float(v) for p in model.parameters() for v in p.detach().flatten()]
with open(f"{sys.argv[1]}/rank-{rank}.json", "w") as out:
    json.dump({"rank": rank, "world": world, "weights": weights}, out)
dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    ("source", "uses"),
    [
        ("import torch\nimport torch.distributed as dist\n", False),
        ("from kplan.runtime import Job\n", True),
        ("import kplan.runtime.job as j\n", True),
        ("from kplan import runtime\n", True),
        ("import kplan\n", True),
        ("from kplan.examples import mlp_regression\n", True),
        ("import importlib\nimportlib.import_module('kplan.runtime')\n", True),
        ("import kplanner  # another package\n", False),
        ("from .kplan import x\n", False),  # a local module named kplan: not the package
        ("print('launched by kplan'\n", True),  # does not parse: named as text, taken as using it
    ],
)
def test_the_source_says_whether_the_runtime_is_used(source: str, uses: bool) -> None:
    assert source_uses_runtime(source) is uses


def test_a_helper_module_beside_the_script_counts(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import helpers\n")
    assert uses_runtime(script) is False
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helpers.py").write_text("from kplan.runtime import Job\n")
    assert uses_runtime(script) is True
    assert uses_runtime(tmp_path / "missing.py") is None
    assert uses_runtime(EXAMPLE) is True


def test_runtime_flags_with_a_plain_script_are_refused(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_DDP)
    result = CliRunner().invoke(
        app, ["launch", str(script), "--budget", "1", "--adapt", "--dry-run"]
    )
    assert result.exit_code == 2
    assert "--adapt act through the kplan runtime; plain.py does not use it" in result.output


def test_the_dry_run_says_plain_before_anything(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_DDP)
    result = CliRunner().invoke(app, ["launch", str(script), "--budget", "1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"note: {PLAIN_NOTE}"
    runtime = CliRunner().invoke(app, ["launch", str(EXAMPLE), "--budget", "1", "--dry-run"])
    assert "plain script" not in runtime.output


@pytest.mark.slow
def test_a_plain_ddp_script_launches_trains_and_is_reported_as_such(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "code" / "train_plain.py"
    script.parent.mkdir()
    script.write_text(PLAIN_DDP)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "KPLAN_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    job = "kp-plain-ddp"
    argv = [str(KPLAN), "launch", "--cloud", "local", str(script), "--budget", "1"]
    argv += ["--nodes", "2", "--check-interval", "0.5", "--job-id", job, "--", str(out)]
    try:
        run = subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert run.stdout.splitlines()[0] == f"note: {PLAIN_NOTE}"  # said before it started
        ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
        assert [d["world"] for d in ranks] == [2, 2]  # one DDP job of two gloo workers
        assert ranks[0]["weights"] == ranks[1]["weights"]  # kept equal by DDP's all-reduce
        report = subprocess.run(
            [str(KPLAN), "report", job, "--json"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        doc = json.loads(report.stdout)
        assert doc["status"] == "succeeded" and doc["measured"] is False
        note = doc["metrics"]["note"]
        assert note.startswith("not measured: train_plain.py does not use the kplan runtime")
        assert doc["actual_hours"] > 0  # the wall clock still measures it
        text = subprocess.run(
            [str(KPLAN), "report", job],
            env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120,
            check=False,
        ).stdout  # fmt: skip
        assert "metrics: not measured: train_plain.py" in text
        assert "no metrics under" not in text and "0 steps" not in text
        assert "not measured" in next(x for x in text.splitlines() if "steps" in x.split("│")[0])
    finally:
        kill_leftovers(tmp_path)
