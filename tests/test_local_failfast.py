"""A local launch that cannot run fails fast and says why (issue 12).

End to end with real processes (torchrun, gloo workers, the ``kplan`` command): a script that
fails on import ends ``failed`` within 30 s with the error's line in ``kplan status``; a script
that exits 3 is reported as exiting 3; a node whose bootstrap fails the same way three times in a
row fails the job instead of being relaunched until ``max_replacements``. Then the parts on
their own: the restart policy of ``noderun`` on real metrics files, and the error line of a log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kplan.launcher.failure import error_line, log_tail
from kplan.launcher.noderun import RestartPolicy, exit_code
from kplan.launcher.storage import LocalStorage
from tests.test_provider_local import kill_leftovers

KPLAN = Path(sys.executable).with_name("kplan")


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """Run ``kplan launch SCRIPT --nodes 2`` to its end (killed after ``timeout_s``); returns
    (exit code, output, seconds). Every instance process is gone afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def run(script: str, job: str, timeout_s: float = 120.0) -> tuple[int, str, float]:
        path = tmp_path / f"{job}.py"
        path.write_text(script)
        argv = [str(KPLAN), "launch", str(path), "--nodes", "2", "--budget", "1"]
        argv += ["--check-interval", "0.5", "--job-id", job, "--quiet"]
        env = {**os.environ, "KPLAN_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
            pytest.fail(f"kplan launch still running after {timeout_s} s:\n{out.decode()[-3000:]}")
        return proc.returncode, out.decode(errors="replace"), time.monotonic() - start

    try:
        yield run
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        kill_leftovers(tmp_path)


def status(home: Path, job: str) -> tuple[dict[str, Any], str]:
    """``kplan status JOB --json`` and the text of ``kplan status JOB``."""
    env = {**os.environ, "KPLAN_HOME": str(home), "COLUMNS": "200"}
    doc = subprocess.run(
        [str(KPLAN), "status", job, "--json"], env=env, capture_output=True, timeout=60, check=True
    )
    text = subprocess.run(
        [str(KPLAN), "status", job], env=env, capture_output=True, timeout=60, check=True
    )
    return json.loads(doc.stdout), text.stdout.decode()


def test_a_script_failing_on_import_fails_without_restarts(launch: Any, tmp_path: Path) -> None:
    # How long it takes is measured by bench/failfast.py; `launch` times out only on a hang.
    code, out, _ = launch("import nonexistent_module\n", "kp-ff-import")
    error = "ModuleNotFoundError: No module named 'nonexistent_module'"
    assert code == 1, out
    assert f"exited with code 1: {error}" in out  # launch prints it
    doc, text = status(tmp_path, "kp-ff-import")
    assert doc["status"] == "failed"
    assert doc["reason"].endswith(error)
    assert error in text and "provisioning" not in text
    # torchrun restarted the workers once (a peer may have been lost), not --max-restarts times
    log = (tmp_path / "jobs" / "kp-ff-import" / "logs" / "node-0.log").read_text()
    assert 1 <= log.count(error) <= 2, log
    assert "not restarting the workers: they failed before the job's first step" in log


def test_a_script_exiting_3_is_reported_as_exiting_3(launch: Any, tmp_path: Path) -> None:
    code, out, _ = launch("import sys\nprint('giving up')\nsys.exit(3)\n", "kp-ff-exit3")
    assert code == 1, out
    doc, _ = status(tmp_path, "kp-ff-exit3")
    assert doc["status"] == "failed"
    assert "exited with code 3: giving up" in doc["reason"], doc["reason"]
    exits = [e for e in doc["events"] if e["kind"] == "node-exit"]
    assert exits and all("exited with code 3" in e["message"] for e in exits), exits
    assert all("giving up" in e["data"]["log_tail"] for e in exits)  # the log's last lines


def test_a_node_failing_the_same_way_three_times_fails_the_job(launch: Any, tmp_path: Path) -> None:
    # The bootstrap cannot make the log folder (a file is in its way): it exits 1 before
    # torchrun starts and writes no status, so each instance is "lost" with reason "exited 1".
    job = "kp-ff-loop"
    (tmp_path / "jobs" / job).mkdir(parents=True)
    (tmp_path / "jobs" / job / "logs").write_text("not a folder\n")
    code, out, _ = launch("print('never runs')\n", job)
    assert code == 1, out
    doc, _ = status(tmp_path, job)
    assert doc["status"] == "failed"
    # the reason names the bootstrap's own last line (mkdir's complaint)
    assert doc["reason"].startswith("node 0 failed 3 times in a row: exited 1: mkdir: "), doc
    assert str(tmp_path / "jobs" / job / "logs") in doc["reason"]
    heads = [i for i in doc["instances"] if i["node_rank"] == 0]
    assert len(heads) == 3  # three tries of the head, not max_replacements + 1


def test_restart_policy_before_the_first_step(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "rank-0.jsonl").write_text(json.dumps({"event": "start", "time": 1.0}) + "\n")
    policy = RestartPolicy(metrics)
    assert policy.retry((1,))  # once: a peer may have gone while the group started
    assert not policy.retry((1,))  # then a script that cannot start is not restarted
    assert not policy.stepped


def test_restart_policy_after_steps_stops_at_the_same_failure(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    step = {"step": 1, "step_time": 0.1, "time": 1.0}
    (metrics / "rank-0.jsonl").write_text(json.dumps(step) + "\n")
    policy = RestartPolicy(metrics, same_limit=3)
    assert policy.retry((1,)) and policy.retry((1,))  # 1st and 2nd in a row
    assert policy.retry((7,))  # another error: counts from 1 again
    assert policy.retry((7,))
    with (metrics / "rank-1.jsonl").open("a") as f:  # progress between failures resets it
        f.write(json.dumps({**step, "step": 2}) + "\n")
    assert policy.retry((7,)) and policy.retry((7,))
    assert not policy.retry((7,))  # 3rd in a row with no step between


def test_restart_policy_without_metrics_only_counts_repeats() -> None:
    policy = RestartPolicy(None, same_limit=2)
    assert policy.retry((1,))
    assert not policy.retry((1,))


def test_exit_code_of_the_worker(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(3, 0) == 3
    assert exit_code(1, 0) == 1
    assert exit_code(300, 0) == 255
    assert exit_code(-9, 2) == 1  # codes >= 128 mean "the node got a signal" to the launcher
    assert "worker rank 2 was killed by signal 9" in capsys.readouterr().err


TORCHRUN_LOG = """\
Traceback (most recent call last):
  File "/tmp/hb/bad.py", line 1, in <module>
    import nonexistent_module
ModuleNotFoundError: No module named 'nonexistent_module'
E1123 18:18:10.456000 5162 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 1) local_rank: 0 (pid: 5278) of binary: /usr/bin/python
kplan: not restarting the workers: they failed before the job's first step
============================================================
"""


def test_error_line_of_a_log(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put_bytes("kp-x/logs/node-1.log", TORCHRUN_LOG.encode())
    tail = log_tail(storage, "kp-x", 1, lines=3)
    assert tail[0].startswith("E1123") and tail[-1].startswith("====")
    lines = log_tail(storage, "kp-x", 1, lines=50)
    assert error_line(lines) == "ModuleNotFoundError: No module named 'nonexistent_module'"
    assert error_line(["epoch 1", "giving up", "W1123 18:00:00.1 12 x] closing"]) == "giving up"
    assert error_line(["[rank1]: RuntimeError: boom", "done"]) == "[rank1]: RuntimeError: boom"
    assert error_line(["===="]) is None
    assert log_tail(storage, "kp-x", 0) == []  # no log
    # a failed node's event keeps the script's lines, however many torchrun adds after them
    noisy = "giving up\n" + "W1123 18:00:00.1 12 x] closing\n" * 8 + "=====\n"
    storage.put_bytes("kp-x/logs/node-2.log", noisy.encode())
    assert log_tail(storage, "kp-x", 2, lines=5)[0].startswith("W1123")
    assert log_tail(storage, "kp-x", 2, lines=5, script_only=True) == ["giving up"]
    assert len(error_line(["x" * 1000]) or "") == 300
