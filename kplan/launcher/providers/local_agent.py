"""The supervisor of one local instance: ``python -m kplan.launcher.providers.local_agent DIR``.

The local provider starts one supervisor per instance, in a session of its own, so that it
outlives the launcher (``kill -9`` of the launcher leaves the instances running, as on a cloud).
The supervisor is the instance's "machine": it

1. waits the simulated boot time, then runs the bootstrap, ``/bin/sh -c <user_data>`` with the
   instance's environment plus the marker ``KPLAN_LOCAL_INSTANCE`` (``local_procs``), its output
   appended to ``DIR/output.log``; writes ``run.json`` (the instance is then ``running``);
2. on SIGTERM (``terminate_instances``) forwards SIGTERM to the bootstrap shell only (the shell
   forwards it to torchrun, torchrun to its workers, which checkpoint), and SIGKILLs every
   process of the instance ``grace_s`` later if any is left;
3. plays the chaos schedule (``local_chaos``), or a preemption asked for through
   ``preempt.json``: a notice (``notice.json``, SIGTERM to the shell), then SIGKILL of every
   process of the instance;
4. when the bootstrap has exited, kills whatever it left behind (a powered-off machine keeps no
   process) and writes ``exit.json``: ``{"state", "reason", "exit_code", "time", "stop_at",
   "killed_at"}`` (``stop_at``: when the notice or the termination began, else null).

Every file is written atomically; ``exit.json`` is created at most once (the first writer wins),
so the provider may also write it for a supervisor that died.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NotRequired, TypedDict

from kplan.launcher.provider import InstanceState, Market
from kplan.launcher.providers import local_procs as procs
from kplan.launcher.providers.local_chaos import (
    REASON,
    ChaosConfig,
    ChaosDoc,
    claim,
    claim_preemption,
)
from kplan.runtime.private import UMASK, open_private, write_private

AGENT_FILE = "agent.json"  # the supervisor's configuration (written by the provider)
RUN_FILE = "run.json"  # the bootstrap runs: {"pid", "ticks", "time"}
NOTICE_FILE = "notice.json"  # a chaos notice was given: {"time", "kill_at"}
TERMINATE_FILE = "terminate.json"  # terminate_instances asked: {"time"}
PREEMPT_FILE = "preempt.json"  # LocalProvider.preempt asked: {"time", "notice_s"}
EXIT_FILE = "exit.json"  # the instance is gone: {"state", "reason", "exit_code", "time", ...}
OUTPUT_LOG = "output.log"  # the bootstrap's stdout and stderr
AGENT_LOG = "agent.log"  # the supervisor's own stderr
POLL_S = 0.1


class LocalInstanceEntry(TypedDict):
    """One instance in a local job's ``state.json``."""

    id: str
    name: str
    node_rank: int
    instance_type: str
    market: Market
    zone: NotRequired[str]  # absent in state files of older versions (then "local")
    token: str
    agent_pid: int
    agent_ticks: int | None
    launched_at: float
    tags: dict[str, str]


class LocalJobState(TypedDict):
    """A local job's ``state.json``: its instances, and the next instance's index."""

    schema: int
    job_id: str
    created_at: float
    next_index: int
    chaos_epoch: float | None
    instances: list[LocalInstanceEntry]


class ExitRecord(TypedDict, total=False):
    """``exit.json``: how an instance ended."""

    state: InstanceState
    reason: str
    exit_code: int | None
    time: float
    stop_at: float | None  # the notice (preempted) or the SIGTERM (terminated)
    killed_at: float | None  # what was left got SIGKILL here
    survivors: list[int]


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Replace ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_private(tmp, json.dumps(data, sort_keys=True).encode())
    os.replace(tmp, path)


def create_json(path: Path, data: Mapping[str, object]) -> bool:
    """Create ``path`` atomically unless it exists; True if this call created it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_private(tmp, json.dumps(data, sort_keys=True).encode())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def exit_reason(code: int, output: Path | None = None) -> str:
    """``completed``, or ``exited N`` and the last line the bootstrap wrote to ``output`` (its
    stdout and stderr: why a bootstrap failed before the job's log existed)."""
    if code == 0:
        return "completed"
    last = _last_line(output) if output is not None else None
    return f"exited {code}" + (f": {last}" if last else "")


def _last_line(path: Path, limit: int = 200) -> str | None:
    """The last non-empty line of ``path`` (read from its last 4 KiB), at most ``limit`` long."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    return lines[-1] if len(lines[-1]) <= limit else lines[-1][: limit - 3] + "..."


class AgentDoc(TypedDict):
    """``agent.json``: the supervisor's configuration as the provider writes it."""

    instance_id: str
    token: str
    node_rank: int
    user_data: str
    env: dict[str, str]
    cwd: str
    boot_delay_s: float
    grace_s: float
    chaos: ChaosDoc | None
    chaos_epoch: float
    chaos_dir: str


@dataclass(frozen=True)
class AgentConfig:
    """What the provider tells one supervisor (``agent.json``)."""

    instance_id: str
    token: str  # random: the marker value is "<instance_id>:<token>"
    node_rank: int
    user_data: str
    env: dict[str, str]
    cwd: str
    boot_delay_s: float
    grace_s: float
    chaos: ChaosConfig | None
    chaos_epoch: float  # the job's chaos clock starts here (epoch seconds)
    chaos_dir: str  # claims shared by the job's supervisors

    @property
    def marker(self) -> str:
        return f"{self.instance_id}:{self.token}"

    def to_dict(self) -> AgentDoc:
        return {
            "instance_id": self.instance_id,
            "token": self.token,
            "node_rank": self.node_rank,
            "user_data": self.user_data,
            "env": self.env,
            "cwd": self.cwd,
            "boot_delay_s": self.boot_delay_s,
            "grace_s": self.grace_s,
            "chaos": None if self.chaos is None else self.chaos.to_dict(),
            "chaos_epoch": self.chaos_epoch,
            "chaos_dir": self.chaos_dir,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentConfig:
        chaos = data["chaos"]
        return cls(
            instance_id=data["instance_id"],
            token=data["token"],
            node_rank=int(data["node_rank"]),
            user_data=data["user_data"],
            env={str(k): str(v) for k, v in data["env"].items()},
            cwd=data["cwd"],
            boot_delay_s=float(data["boot_delay_s"]),
            grace_s=float(data["grace_s"]),
            chaos=None if chaos is None else ChaosConfig.from_dict(chaos),
            chaos_epoch=float(data["chaos_epoch"]),
            chaos_dir=data["chaos_dir"],
        )


class _Chaos:
    """This instance's share of the job's chaos schedule."""

    def __init__(self, config: ChaosConfig, cfg: AgentConfig, started: float) -> None:
        self.config = config
        self.cfg = cfg
        self.started = started
        self.folder = Path(cfg.chaos_dir)
        rank = cfg.node_rank
        self.pending = [e for e in range(len(config.at_s)) if config.event_hits(e, rank)]
        life = config.lifetime(cfg.instance_id) if config.hits(cfg.node_rank) else None
        self.random_at = None if life is None else started + life

    def due(self, now: float) -> bool:
        """True when this instance is to be preempted now (the claim is taken)."""
        owner = self.cfg.instance_id
        for event in list(self.pending):
            start = max(self.cfg.chaos_epoch + self.config.at_s[event], self.started)
            if now < start + self.config.stagger(event, self.cfg.node_rank):
                continue
            self.pending.remove(event)
            if claim(self.folder, f"event-{event}", owner):
                return claim_preemption(self.config, self.folder, owner)
        if self.random_at is not None and now >= self.random_at:
            self.random_at = None
            return claim_preemption(self.config, self.folder, owner)
        return False


class Supervisor:
    def __init__(self, folder: Path) -> None:
        data = read_json(folder / AGENT_FILE)
        if data is None:
            raise SystemExit(f"local_agent: no readable {folder / AGENT_FILE}")
        self.folder = folder
        self.cfg = AgentConfig.from_dict(data)
        self.terminate_asked = False
        self.mode: str | None = None  # "terminate" or "preempt" once stopping
        self.stop_at: float | None = None  # when the notice / the termination began
        self.kill_at = 0.0
        self.child: subprocess.Popen[bytes] | None = None
        self.code: int | None = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.terminate_asked = True

    def _asked(self) -> bool:
        """Whether SIGTERM arrived (a method: the handler changes the flag behind mypy's back)."""
        return self.terminate_asked

    def _members(self) -> dict[int, int]:
        """Every process of the instance except this supervisor."""
        found = procs.marked(self.cfg.marker)
        found.update(procs.descendants(os.getpid()))
        found.pop(os.getpid(), None)
        return found

    def _reap(self) -> None:
        """Collect exited children, the bootstrap's status and adopted orphans' alike."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.child is not None and pid == self.child.pid:
                code = os.waitstatus_to_exitcode(status)
                self.code = 128 - code if code < 0 else code  # killed by signal N: 128 + N
                self.child.returncode = code

    def _stop(self, mode: str, delay: float) -> None:
        self.mode = mode
        self.stop_at = time.time()
        self.kill_at = self.stop_at + delay
        if delay > 0 and self.child is not None and self.code is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signal.SIGTERM)  # the shell only: it forwards

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        for sig in (signal.SIGINT, signal.SIGHUP):  # a handler, not SIG_IGN: exec resets it
            signal.signal(sig, lambda signum, frame: None)
        procs.become_subreaper()
        boot_end = time.time() + self.cfg.boot_delay_s
        while time.time() < boot_end and not self._asked():
            if self._requested_notice() is not None:
                self.mode = "preempt"
                return self._finish()
            time.sleep(min(POLL_S, max(0.0, boot_end - time.time())))
        if self._asked():
            return self._finish()
        env = {**os.environ, **self.cfg.env, procs.MARKER: self.cfg.marker}
        log_fd = open_private(self.folder / OUTPUT_LOG, os.O_WRONLY | os.O_APPEND)
        with os.fdopen(log_fd, "ab") as log:
            self.child = subprocess.Popen(
                ["/bin/sh", "-c", self.cfg.user_data],
                env=env,
                cwd=self.cfg.cwd,
                umask=UMASK,  # what the bootstrap and the workers write: 0600
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started = time.time()
        ticks = procs.start_ticks(self.child.pid)
        write_json(self.folder / RUN_FILE, {"pid": self.child.pid, "ticks": ticks, "time": started})
        chaos = None
        if self.cfg.chaos is not None and self.cfg.chaos.enabled:
            chaos = _Chaos(self.cfg.chaos, self.cfg, started)
        while True:
            self._reap()
            now = time.time()
            if self.code is not None or (self.mode is not None and now >= self.kill_at):
                return self._finish()
            if self.mode is None and self._asked():
                self._stop("terminate", self.cfg.grace_s)
            elif self.mode is None:
                notice = self._requested_notice()
                if notice is None and chaos is not None and chaos.due(now):
                    notice = chaos.config.notice
                if notice is not None:
                    write_json(self.folder / NOTICE_FILE, {"time": now, "kill_at": now + notice})
                    self._stop("preempt", notice)
            time.sleep(POLL_S)

    def _requested_notice(self) -> float | None:
        """The notice of a preemption asked for through ``preempt.json``; None if none."""
        request = read_json(self.folder / PREEMPT_FILE)
        if request is None:
            return None
        try:
            return max(0.0, float(request["notice_s"]))
        except (KeyError, TypeError, ValueError):
            return 0.0

    def _finish(self) -> int:
        """Kill what is left of the instance and write ``exit.json``."""
        members = self._members()
        killed_at = time.time()  # the moment the instance's processes stop (SIGKILL)
        procs.signal_all(members, signal.SIGKILL)
        left = procs.kill_all(self._members)
        self._reap()
        if self.child is not None and self.code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(timeout=5.0)
                code = self.child.returncode
                self.code = 128 - code if code < 0 else code
        state: InstanceState
        if self.mode == "preempt":
            state, reason = "preempted", REASON
        elif self.mode == "terminate" or self.code is None:
            state, reason = "terminated", "terminated"
        else:
            state, reason = "terminated", exit_reason(self.code, self.folder / OUTPUT_LOG)
        record: ExitRecord = {
            "state": state,
            "reason": reason,
            "exit_code": self.code,
            "time": time.time(),
            "stop_at": self.stop_at,
            "killed_at": killed_at,
        }
        if left:
            record["survivors"] = sorted(left)
        create_json(self.folder / EXIT_FILE, record)
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m kplan.launcher.providers.local_agent INSTANCE_DIR", file=sys.stderr)
        return 2
    return Supervisor(Path(argv[1])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
