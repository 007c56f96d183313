"""`kplan launch`, `status`, `logs` and `down` through CliRunner: success and bad input."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.launcher import providers
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from tests import launcher_fakes
from tests.launcher_fakes import SimProvider, fast_dir

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = fast_dir(tmp_path, "cli")
    monkeypatch.setenv("KPLAN_HOME", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "code" / "train.py"
    path.parent.mkdir()
    path.write_text("import os\nprint('rank', os.environ.get('RANK'), flush=True)\n")
    return path


def _invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _fail(result: Any, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    for needle in needles:
        assert needle in result.output, result.output


# --- launch --dry-run: every request rendered, none sent --------------------------------------


def test_dry_run_sends_nothing(
    home: Path, script: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:refusing_backend")
    plan = tmp_path / "plan.json"
    res = _invoke(
        "estimate", "--example", "cifar10-resnet18", "--cloud", "aws", "--budget", "50",
        "--spot", "--max-nodes", "4", "--out", str(plan), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    chosen = json.loads(plan.read_text())["chosen"]
    res = _invoke(
        "launch", str(script), "--budget", "50", "--plan", str(plan), "--dry-run", "--json",
        "--", "--epochs", "3",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    calls = [r["call"] for r in doc["requests"]]
    # the code, then the wheel of this kplan that the nodes install (kplan/launcher/wheel.py)
    expected = ["storage.put_bytes"] * 2 + ["provider.prepare", "provider.run_instances"]
    assert calls[:4] == expected
    assert doc["requests"][1]["key"].endswith("/code/kplan-0.1.0-py3-none-any.whl")
    # a cloud job detaches by default: its controller instance first (controller_node.py)
    (ctl,) = doc["requests"][3]["instances"]
    assert (ctl["node_rank"], ctl["market"]) == (-1, "on-demand") and doc["controller"]
    launched = [i for r in doc["requests"][4:] for i in r["instances"]]
    assert len(launched) == chosen["nodes"]
    assert {i["instance_type"] for i in launched} == {chosen["instance_type"]}
    assert all(i["market"] == "spot" for i in launched)
    assert launched[0]["user_data"].startswith("#!/bin/bash")
    assert "--epochs 3" in launched[0]["user_data"]
    assert doc["startable"] and doc["usd_per_hour"] == pytest.approx(chosen["usd_per_hour"])
    # Planning now from a profile goes the same way; the table rendering too.
    res = _invoke(
        "launch", str(script), "--budget", "50", "--cloud", "aws",
        "--example-profile", "cifar10-resnet18", "--dry-run",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "none sent" in res.output and "provider.run_instances" in res.output
    assert not (home / "kplan.db").exists()  # a dry run records nothing


def test_local_dry_run_shows_the_torchrun_command(home: Path, script: Path) -> None:
    res = _invoke("launch", str(script), "--budget", "0", "--nodes", "2", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [r["call"] for r in doc["requests"]] == [
        "provider.prepare",
        "provider.run_instances",
        "provider.run_instances",
    ]
    head = doc["requests"][1]["instances"][0]
    assert "kplan.launcher.noderun" in head["user_data"] and "--nnodes=1:2" in head["user_data"]
    assert head["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


# --- launch: bad input exits 2 with a hint ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--budget", "1"], ["give the training script"]),
        (["missing.py", "--budget", "1"], ["training script not found: missing.py"]),
        (["{script}", "--budget", "-1"], ["--budget -1.0 must be >= 0"]),
        (["{script}", "--budget", "1", "--cloud", "azure"], ["unknown cloud 'azure'"]),
        (["{script}", "--budget", "1", "--cloud", "aws"], ["needs a plan", "hint:"]),
        (["{script}", "--budget", "1", "--nodes", "0"], ["--nodes 0"]),
        (["{script}", "--budget", "1", "--deadline", "0"], ["--deadline 0.0 must be > 0"]),
        (["{script}", "--budget", "1", "--plan", "{script}"], ["not valid JSON"]),
        (["{script}", "--budget", "1", "--plan", "{bad_plan}"], ["not a kplan plan"]),
        (
            ["{script}", "--budget", "1", "--plan", "{bad_plan}", "--profile", "p.json"],
            ["at most one of --plan, --profile"],
        ),
        (["{script}", "--budget", "1", "--job-id", "Bad_Id"], ["job id 'Bad_Id' is not valid"]),
        (["{script}", "--budget", "1", "--example-profile", "x"], ["unknown example 'x'"]),
        (
            ["{script}", "--budget", "1", "--nodes", "2", "--max-nodes", "1"],
            ["--max-nodes 1 is below the job's 2 node(s)", "hint:"],
        ),
        (["{script}", "--budget", "1", "--explore-trials", "0"], ["--explore-trials 0", "hint:"]),
        (["{script}", "--budget", "1", "--replan-interval", "0"], ["replan interval 0", "hint:"]),
        (
            ["{script}", "--budget", "1", "--policy", "nowhere.py:P"],
            ["--policy nowhere.py:P: no file nowhere.py", "hint:"],
        ),
    ],
)
def test_launch_bad_input(
    home: Path, script: Path, tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    bad_plan = tmp_path / "bad.json"
    bad_plan.write_text(json.dumps({"schema": "kplan.profile/1.0"}))
    args = [a.format(script=script, bad_plan=bad_plan) for a in args]
    res = _invoke("launch", *args)
    _fail(res, 2, *needles)
    assert "Traceback" not in res.output


def test_a_cloud_launch_without_budget_is_a_usage_error(home: Path, script: Path) -> None:
    # A free local run needs none (tests/test_cli_conventions.py); a cloud launch does.
    args = ("launch", str(script), "--cloud", "aws", "--example", "cifar10-resnet18", "--dry-run")
    _fail(_invoke(*args), 2, "needs --budget", "hint:")


# --- status, logs, down over a recorded job ---------------------------------------------------


@pytest.fixture
def recorded(home: Path, script: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A finished job and a job left running (its launcher gone), on the simulated cloud."""
    clock = FakeClock(time.time() - 7200)  # in the past: `kplan down` runs on real time
    storage = LocalStorage(home / "store")
    storage.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, storage, finish_at=clock.now() + 1800)
    backend = Backend(sim, storage)
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:current_backend")
    monkeypatch.setitem(launcher_fakes.CURRENT, "backend", backend)
    nodes = (NodeSpec(0, "g4dn.xlarge", "spot", "a", 1, 0.4),)
    done = JobSpec.build("kp-cli-done", "aws", "r", str(script), nodes, 5.0, check_interval_s=60)
    with StateDB.open() as db:
        run_job(done, backend, db, clock=clock)
    storage.put_bytes("kp-cli-done/logs/node-0.log", b"epoch 1 loss 0.5\n")
    # A job whose launcher died: its instance still runs and its row says "running".
    from kplan.launcher.bootstrap import instance_spec, rendezvous
    from kplan.launcher.state import InstanceRecord, JobRecord

    orphan = JobSpec.build("kp-cli-orphan", "aws", "r", str(script), nodes, 5.0)
    sim.finish_at = None
    (inst,) = sim.run_instances(
        None,  # type: ignore[arg-type]
        [
            instance_spec(
                orphan, nodes[0], "kp-cli-orphan-n0-r0", rendezvous(orphan, 0, None), "s3://b"
            )
        ],
    )
    with StateDB.open() as db:
        db.create_job(
            JobRecord(
                "kp-cli-orphan", "running", None, "aws", "r", orphan.to_dict(), None, 5.0, None,
                None, None, None, 2**22 + 12345, None, clock.now(), clock.now(),
            )
        )  # fmt: skip
        db.add_instance(
            InstanceRecord(
                inst.id, "kp-cli-orphan", inst.name, 0, "aws", "r", "a", "g4dn.xlarge", "spot",
                0.4, "running", clock.now() - 600,
            )
        )  # fmt: skip
    return {"sim": sim, "orphan_instance": inst.id}


def test_status_lists_and_details(recorded: dict[str, Any]) -> None:
    res = _invoke("status", "--json")
    assert res.exit_code == 0, res.output
    jobs = {j["id"]: j for j in json.loads(res.output)}
    assert jobs["kp-cli-done"]["status"] == "succeeded"
    assert jobs["kp-cli-orphan"]["launcher"] == "gone"
    res = _invoke("status", "kp-cli-done", "--json")
    doc = json.loads(res.output)
    assert doc["spend_usd"] == pytest.approx(0.4 * 1800 / 3600)
    assert doc["ledger"][0]["closed"] and doc["events"][-1]["kind"] == "succeeded"
    res = _invoke("status")
    assert res.exit_code == 0 and "kp-cli-done" in res.output
    res = _invoke("status", "kp-cli-orphan", "--watch", "--interval", "0.01")
    assert res.exit_code == 0 and "launcher gone" in res.output
    # every job: one ended, one whose launcher is gone with no controller's heartbeat: the
    # watch ends too (it refreshed forever without a terminal)
    res = _invoke("status", "--watch", "--interval", "0.01")
    assert res.exit_code == 0 and "kp-cli-orphan" in res.output and "kp-cli-done" in res.output


def test_status_and_logs_bad_input(recorded: dict[str, Any]) -> None:
    _fail(_invoke("status", "kp-nope"), 2, "no job 'kp-nope'", "kplan status")
    _fail(_invoke("status", "--interval", "0"), 2, "--interval 0.0 must be > 0")
    _fail(_invoke("logs", "kp-nope"), 2, "no job 'kp-nope'")


def test_logs(recorded: dict[str, Any]) -> None:
    res = _invoke("logs", "kp-cli-done")
    assert res.exit_code == 0 and "epoch 1 loss 0.5" in res.output
    res = _invoke("logs", "kp-cli-done", "--node", "0", "-f")
    assert res.exit_code == 0 and "epoch 1 loss 0.5" in res.output


def test_down_is_idempotent_and_settles_the_ledger(recorded: dict[str, Any]) -> None:
    sim: SimProvider = recorded["sim"]
    iid = recorded["orphan_instance"]
    assert iid in sim.alive()
    res = _invoke("down", "kp-cli-orphan", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["terminated"] == [iid]
    assert sim.alive() == []
    with StateDB.open() as db:
        job = db.job("kp-cli-orphan")
        assert job is not None and job.status == "cancelled"
        (row,) = db.ledger("kp-cli-orphan")
        assert row.closed and row.billed_seconds >= 600
    res = _invoke("down", "kp-cli-orphan")
    assert res.exit_code == 0 and "nothing running" in res.output
    res = _invoke("down", "--all")
    assert res.exit_code == 0 and "nothing to take down" in res.output


def test_down_finds_instances_by_tag_without_the_database(
    recorded: dict[str, Any], home: Path
) -> None:
    (home / "kplan.db").unlink()
    for extra in ("kplan.db-wal", "kplan.db-shm"):
        (home / extra).unlink(missing_ok=True)
    _fail(_invoke("down", "kp-cli-orphan"), 2, "not in", "--cloud")
    res = _invoke("down", "kp-cli-orphan", "--cloud", "aws", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["terminated"] == [recorded["orphan_instance"]]
    assert recorded["sim"].alive() == []


def test_down_bad_input(home: Path) -> None:
    _fail(_invoke("down"), 2, "give a job id or --all")
    _fail(_invoke("down", "kp-x-1", "--all"), 2, "give a job id or --all")
    _fail(_invoke("down", "Not_An_Id"), 2, "job id 'Not_An_Id' is not valid")
    _fail(_invoke("down", "kp-x-1", "--wait", "-1"), 2, "--wait -1.0 must be >= 0")


# --- launch for real on the local provider ----------------------------------------------------


@pytest.mark.slow
def test_launch_local_runs_two_worker_groups(home: Path, script: Path) -> None:
    res = _invoke(
        "launch", str(script), "--budget", "0", "--nodes", "2", "--check-interval", "0.5", "--json"
    )
    assert res.exit_code == 0, res.output
    outcome = json.loads(res.output.splitlines()[-1])  # --json: one event per line
    assert outcome["event"] == "finished" and outcome["status"] == "succeeded"
    job = outcome["job_id"]
    res = _invoke("logs", job)
    assert "rank 0" in res.output and "rank 1" in res.output
    res = _invoke("status", job, "--json")
    doc = json.loads(res.output)
    assert doc["alive_instances"] == 0 and len(doc["ledger"]) == 2
    assert all(r["closed"] and r["usd"] == 0 and r["billed_seconds"] > 0 for r in doc["ledger"])


def test_status_imports_no_heavy_module(home: Path) -> None:
    from tests.test_imports import HEAVY, _modules

    loaded = _modules(["status", "--json"])
    assert not [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
