"""Run real torchrun jobs for the runtime tests and benchmarks: bounded in time, none left."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "bench" / "runtime_worker.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without torchrun's or kplan's variables, plus ``extra``."""
    drop = ("KPLAN_", "TORCHELASTIC_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "GROUP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(REPO)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run(
    args: list[str], env: dict[str, str], timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a command in its own process group; kill the whole group on timeout or error."""
    proc = subprocess.Popen(
        args,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):  # stragglers the agent did not reap
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(args, proc.returncode, out, None)


def torchrun(
    worker_args: list[str],
    env: dict[str, str],
    nproc: int = 2,
    max_restarts: int = 0,
    timeout: float = 120.0,
    script: Path = WORKER,
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node=nproc`` on 127.0.0.1 with a free port."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={max_restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--monitor-interval=0.2",
        str(script),
        *worker_args,
    ]
    return run(cmd, env, timeout)


def python(
    worker_args: list[str], env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """The worker as a plain single process (no torchrun)."""
    return run([sys.executable, str(WORKER), *worker_args], env, timeout)
