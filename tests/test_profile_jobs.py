"""The profiler's job handling with real processes: a crashing script, a silent one, Ctrl-C.

Each test checks that every process the job ran (torchrun and its workers, which torchrun puts
in sessions of their own) is gone afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kplan.core.errors import JobError
from kplan.profiler.procs import ProcessTree, descendants, is_running
from kplan.profiler.run import resolve, run_profile

CRASH = """
import os
import torch.distributed as dist

if "RANK" in os.environ:
    dist.init_process_group("gloo")
if int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1:
    raise ValueError("boom: shapes 3 and 4 differ")
import time
time.sleep(60)
"""

SILENT = """
import time
time.sleep(600)
"""


@pytest.fixture(autouse=True)
def _logs_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed profile keeps its logs folder: keep it inside the test's folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def _script(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(script: Path, workers: int, **kw: float) -> tuple[list[ProcessTree], JobError]:
    trees: list[ProcessTree] = []
    req = resolve(
        str(script), None, [], workers=workers, dataset_size=100, base_batch=4,
        max_local_batch=4, measure_device=False, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(JobError) as info:
        run_profile(req, on_start=trees.append)
    return trees, info.value


def _assert_all_gone(tree: ProcessTree, at_least: int) -> None:
    assert len(tree.seen) >= at_least, tree.seen  # the workers were seen, not just the leader
    alive = [pid for pid, ticks in tree.seen.items() if is_running(pid, ticks)]
    assert alive == []


@pytest.mark.slow
def test_crashing_script_under_torchrun_gives_its_error_line(tmp_path: Path) -> None:
    trees, err = _run(_script(tmp_path, CRASH), workers=2)
    assert "ValueError: boom: shapes 3 and 4 differ" in err.message
    assert "stderr.log" in err.hint
    log = Path(err.hint.rsplit(" ", 1)[-1])
    assert log.is_relative_to(tmp_path) and "boom" in log.read_text()
    _assert_all_gone(trees[0], at_least=3)


def test_crashing_script_alone(tmp_path: Path) -> None:
    trees, err = _run(_script(tmp_path, CRASH), workers=1)
    assert err.message == "the job failed: ValueError: boom: shapes 3 and 4 differ"
    _assert_all_gone(trees[0], at_least=1)


@pytest.mark.slow
def test_silent_job_times_out_and_every_worker_is_killed(tmp_path: Path) -> None:
    # 15 s: torchrun must have spawned both workers (each imports torch) before the timeout
    # fires, or the test cannot see them; 6 s was too short at load 10.
    trees, err = _run(_script(tmp_path, SILENT), workers=2, startup_timeout_s=15.0)
    assert "reported nothing in its first 15s" in err.message
    assert "--startup-timeout" in err.hint
    _assert_all_gone(trees[0], at_least=3)


def test_script_that_ignores_the_schedule_is_a_job_error(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('trained without kplan.runtime')\n")
    trees, err = _run(script, workers=1)
    assert "exited before finishing the profile schedule" in err.message
    assert "kplan.runtime" in err.hint
    _assert_all_gone(trees[0], at_least=1)


def _is_worker(pid: int) -> bool:
    try:
        return b"kplan.profiler.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_kills_the_whole_job(tmp_path: Path) -> None:
    script = _script(tmp_path, SILENT)
    code = (
        "import sys\n"
        "from kplan.profiler.run import resolve, run_profile\n"
        f"req = resolve({str(script)!r}, None, [], workers=2, dataset_size=10, base_batch=2,\n"
        "              max_local_batch=2, measure_device=False)\n"
        "run_profile(req)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path)
    try:
        seen: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen.update(descendants(proc.pid))
            if sum(_is_worker(p) for p in seen) >= 2:
                break
            time.sleep(0.1)
        assert len(seen) >= 3, seen  # torchrun and two workers
        time.sleep(0.5)  # let the profiler record them too
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(is_running(p, t) for p, t in seen.items()):
        time.sleep(0.1)
    assert [p for p, t in seen.items() if is_running(p, t)] == []
