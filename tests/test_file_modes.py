"""What the runtime and the local provider write is private (issue 10, item 7): checkpoints,
metrics, logs and the job's local storage are ``0600`` in folders ``0700``, even under a
permissive umask (022, the usual default, which used to give ``0644``/``0755``)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kplan.core.records import StepRecord
from kplan.launcher.provider import ClusterSpec, InstanceSpec
from kplan.launcher.providers.local import LocalProvider
from kplan.launcher.providers.local_chaos import claim
from kplan.launcher.storage import LocalStorage
from kplan.runtime.metrics import MetricsWriter, rank_path
from kplan.runtime.private import make_dirs, open_private
from tests.test_provider_local import kill_leftovers, until, wait_state


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_private(root: Path) -> int:
    """Every file under ``root`` is 0600 and every folder 0700; returns how many were seen."""
    seen = 0
    for path in [root, *root.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        assert mode(path) == want, f"{path}: {oct(mode(path))}, want {oct(want)}"
        seen += 1
    return seen


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The usual umask 022: files would be 0644 and folders 0755 unless kplan says otherwise."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_make_dirs_makes_every_missing_folder_0700_and_leaves_existing_ones(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o755)
    make_dirs(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert mode(tmp_path) == 0o755  # not ours to change
    make_dirs(tmp_path / "a" / "b")  # exists: fine
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        make_dirs(tmp_path / "file")


def test_open_private_creates_0600_and_tightens_an_old_0644_file(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    os.close(open_private(fresh, os.O_WRONLY))
    assert mode(fresh) == 0o600
    old = tmp_path / "old"
    old.write_text("x")
    assert mode(old) == 0o644
    os.close(open_private(old, os.O_WRONLY | os.O_APPEND))
    assert mode(old) == 0o600 and old.read_text() == "x"


def test_checkpoints_are_0600_in_0700_folders(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from kplan.runtime.checkpoint import CheckpointStore

    root = tmp_path / "ckpt" / "job"
    for rank in (1, 0):  # rank 0 commits last, as after a barrier
        store = CheckpointStore(root, rank)
        shared = {"model": torch.zeros(3)} if rank == 0 else None
        store.save(5, shared, {"rng": torch.ones(1)}, barrier=lambda: None)
    latest = CheckpointStore(root, 0).latest()
    assert latest is not None and latest.name == "step-000000005"
    assert assert_private(tmp_path / "ckpt") >= 5  # ckpt, job, step, state, 2 ranks, latest


def test_metrics_files_are_0600_in_0700_folders(tmp_path: Path) -> None:
    target = tmp_path / "metrics" / "run" / "m.jsonl"
    writer = MetricsWriter(target, rank=0)
    writer.write(StepRecord(step=1, step_time=0.1), flush=True)
    writer.close()
    path = rank_path(target, 0)
    assert json.loads(path.read_text().splitlines()[0])["step"] == 1
    assert assert_private(tmp_path / "metrics") >= 3


def test_local_storage_writes_0600_files_in_0700_folders(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "jobs")
    storage.put_bytes("kp-x/code/code.tar.gz", b"secret")
    storage.put_bytes("kp-x/logs/node-0.log", b"loss 0.1\n")
    storage.put_bytes("kp-x/logs/node-0.log", b"loss 0.2\n")  # replaced, still 0600
    assert storage.get_bytes("kp-x/logs/node-0.log") == b"loss 0.2\n"
    assert assert_private(tmp_path / "jobs") == 6  # jobs, kp-x, code, logs and 2 files


def test_chaos_claims_are_0600(tmp_path: Path) -> None:
    assert claim(tmp_path / "chaos", "preempt-0", "me")
    assert not claim(tmp_path / "chaos", "preempt-0", "other")
    assert assert_private(tmp_path / "chaos") == 2


def test_a_local_instance_writes_only_private_files(tmp_path: Path) -> None:
    """The provider's state, the agent's files, the bootstrap's log, and whatever the job itself
    writes (its checkpoints and logs) under the agent's umask 077."""
    home = tmp_path / "home"
    provider = LocalProvider(home)
    cluster = ClusterSpec(job_id="kp-modes-1", cloud="local", region="local")
    provider.prepare(cluster)
    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    script = f"mkdir -p {work}/ckpt/step-1 && echo w > {work}/ckpt/step-1/rank-0.pt; echo hello"
    spec = InstanceSpec(
        job_id="kp-modes-1", name="kp-modes-1-n0-r0", cloud="local", region="local",
        zone="local", instance_type="local", market="on-demand", node_rank=0, user_data=script,
    )  # fmt: skip
    try:
        (inst,) = provider.run_instances(cluster, [spec])
        done = wait_state(provider, inst.id, {"terminated"})
        assert done.reason == "completed"
        log = provider.instance_dir(inst.id) / "output.log"
        until(lambda: log.exists() and b"hello" in log.read_bytes(), 10, "the bootstrap's log")
        seen = assert_private(home / "local")
        assert seen >= 6  # job dir, state, lock, instance dir, agent.json, logs, run/exit files
        assert {"output.log", "agent.log", "agent.json"} <= {
            p.name for p in provider.instance_dir(inst.id).iterdir()
        }
        assert assert_private(work / "ckpt") == 3
    finally:
        provider.terminate_instances([i.id for i in provider.query_instances("kp-modes-1")])
        kill_leftovers(home)
