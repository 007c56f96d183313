"""The ``local`` provider: each instance is a worker group running as local processes.

``kplan launch --cloud local`` trains for real on this machine. An instance is a supervisor
process (``local_agent``, one per instance, in a session of its own) that runs the instance's
bootstrap, ``/bin/sh -c <user_data>``, with the runtime's environment; the bootstrap starts
torchrun and its workers. Instance ids read ``local-<job>-<n>``; every instance has
``private_ip`` 127.0.0.1, the zone it was asked for (``local`` by default) and costs nothing.
Chaos may refuse launches for a while (``outages``: no capacity in a zone or market).

What a cloud keeps, this provider keeps in files, so that any process (``kplan down`` after the
launcher was killed) finds and ends the instances of a job::

    $KPLAN_HOME/local/<job>/state.json          the job's instances (atomic writes, flock)
    $KPLAN_HOME/local/<job>/chaos/              claims of injected preemptions
    $KPLAN_HOME/local/<job>/<instance id>/      agent.json, run.json, notice.json,
                                                terminate.json, preempt.json, exit.json,
                                                output.log

The job's storage (code, checkpoints, metrics, ``status/node-<rank>.json``, the bootstrap's
logs) is ``LocalStorage($KPLAN_HOME/jobs)``.

States: ``pending`` (booting) → ``running`` (bootstrap started) → ``terminated`` with reason
``completed`` (exit 0), ``exited N`` (plus ``: <the last line the bootstrap wrote>`` if it wrote
one) or ``terminated`` (asked), or ``preempted`` with reason ``spot interruption`` (chaos:
``local_chaos`` or :meth:`LocalProvider.preempt`). While a notice or a termination runs its
course the state is ``stopping``. An instance whose supervisor
died is ``running`` while processes of it live, then ``terminated`` with reason ``lost``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast
from urllib.parse import unquote, urlparse

from kplan.core.errors import CapacityError, CloudError, InputError
from kplan.launcher.provider import (
    CONTROLLER_RANK,
    ClusterSpec,
    Instance,
    InstanceSpec,
    InstanceState,
)
from kplan.launcher.providers import Backend, ProviderSettings
from kplan.launcher.providers import local_procs as procs
from kplan.launcher.providers.local_agent import (
    AGENT_FILE,
    AGENT_LOG,
    EXIT_FILE,
    NOTICE_FILE,
    OUTPUT_LOG,
    PREEMPT_FILE,
    RUN_FILE,
    TERMINATE_FILE,
    AgentConfig,
    ExitRecord,
    LocalInstanceEntry,
    LocalJobState,
    create_json,
    read_json,
    write_json,
)
from kplan.launcher.providers.local_chaos import REASON, SPOT_NOTICE_S, ChaosConfig
from kplan.launcher.storage import LocalStorage
from kplan.runtime.private import UMASK, make_dirs, open_private

NAME = "local"
REGION = "local"
ZONE = "local"
PRIVATE_IP = "127.0.0.1"
STATE_FILE = "state.json"
STATE_SCHEMA = 1
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_POLL_S = 0.1
_AGENT_EXIT_S = 5.0  # a supervisor that wrote exit.json ends within this (else it is killed)
_AGENTS: dict[int, subprocess.Popen[bytes]] = {}
"""Supervisors started by this process, kept (module-wide) until reaped: they outlive the
provider object that started them, and a dropped ``Popen`` of a live child would warn."""


def _check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id) or ".." in job_id:
        raise InputError(
            f"job id {job_id!r} is not usable as a folder name",
            "use letters, digits, '.', '_' and '-' (at most 80), e.g. kp-260101-120000-ab12",
        )
    return job_id


def job_of(instance_id: str) -> str | None:
    """The job id inside a local instance id ``local-<job>-<n>``; None if it is not one."""
    if not instance_id.startswith(f"{NAME}-"):
        return None
    job, sep, index = instance_id[len(NAME) + 1 :].rpartition("-")
    return job if sep and index.isdigit() and _JOB_ID.fullmatch(job) else None


class LocalProvider:
    """Worker groups as local process trees (the ``Provider`` protocol)."""

    name = NAME

    def __init__(
        self,
        home: Path,
        *,
        chaos: ChaosConfig | None = None,
        grace_s: float = 30.0,
        boot_delay_s: float = 0.0,
        python: str | None = None,
    ) -> None:
        """``home``: ``$KPLAN_HOME``; ``grace_s``: SIGTERM to SIGKILL on termination;
        ``boot_delay_s``: simulated provisioning time (the instance is ``pending`` meanwhile);
        ``python``: the interpreter that runs the supervisors (this one by default)."""
        for name, value in (("grace_s", grace_s), ("boot_delay_s", boot_delay_s)):
            if not isinstance(value, int | float) or not value >= 0:
                raise InputError(f"local provider: {name}={value!r}", f"set {name} >= 0")
        self.root = Path(home) / NAME
        self.chaos = chaos
        self.grace_s = float(grace_s)
        self.boot_delay_s = float(boot_delay_s)
        self.python = python or sys.executable

    # --- files ------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        return self.root / _check_job_id(job_id)

    def instance_dir(self, instance_id: str) -> Path:
        job = job_of(instance_id)
        if job is None:
            raise InputError(
                f"{instance_id!r} is not a local instance id", "ids read local-<job>-<n>"
            )
        return self.job_dir(job) / instance_id

    def log_path(self, instance_id: str) -> Path:
        """The bootstrap's stdout and stderr for ``instance_id``."""
        return self.instance_dir(instance_id) / OUTPUT_LOG

    @contextlib.contextmanager
    def _locked(self, job_id: str) -> Iterator[LocalJobState]:
        """The job's state under an exclusive lock; written back if the caller changed it."""
        folder = self.job_dir(job_id)
        make_dirs(folder)
        with os.fdopen(open_private(folder / ".lock", os.O_RDWR | os.O_APPEND), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = read_json(folder / STATE_FILE)
            if doc is not None and doc.get("schema") != STATE_SCHEMA:
                raise CloudError(
                    f"{folder / STATE_FILE} has schema {doc.get('schema')!r}, "
                    f"this kplan reads {STATE_SCHEMA}",
                    "end its processes with the kplan that started them",
                )
            # this kplan's own file, of its schema
            state = cast(LocalJobState, doc) if doc is not None else _new_state(job_id)
            before = repr(state)
            yield state
            if repr(state) != before or not (folder / STATE_FILE).exists():
                write_json(folder / STATE_FILE, state)

    def _entries(self, job_id: str) -> list[LocalInstanceEntry]:
        """The job's instance records (none if the job has no folder; creates nothing)."""
        state = read_json(self.job_dir(job_id) / STATE_FILE)
        return [] if state is None else list(cast(LocalJobState, state).get("instances", []))

    # --- verbs ------------------------------------------------------------------------------

    def prepare(self, cluster: ClusterSpec) -> None:
        self._check_cluster(cluster)
        with self._locked(cluster.job_id):
            pass

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        self._check_cluster(cluster)
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise InputError(f"instance names repeat: {names}", "give each instance its own name")
        for spec in specs:
            self._check_spec(cluster, spec)
        started: list[Instance] = []
        failure: tuple[str, OSError] | None = None
        with self._locked(cluster.job_id) as state:
            epoch = state["chaos_epoch"]
            if epoch is None:
                epoch = state["chaos_epoch"] = time.time()
            refused = self._refusal(specs, time.time() - float(epoch))
            for spec in specs if refused is None else ():
                try:
                    entry = self._start(cluster, spec, state)
                except OSError as err:
                    failure = (spec.name, err)
                    break
                state["instances"].append(entry)
                started.append(self._instance(entry, "pending", None))
        if refused is not None:  # after the state (the chaos clock's start) is written
            raise refused
        if failure is not None:
            self.terminate_instances([i.id for i in started])
            raise CloudError(
                f"local provider could not start instance {failure[0]!r}: {failure[1]}",
                f"check {self.job_dir(cluster.job_id)} and the interpreter {self.python}",
            )
        return started

    def wait_instances(self, ids: Sequence[str], timeout_s: float) -> list[Instance]:
        if not timeout_s >= 0:
            raise InputError(f"timeout_s={timeout_s!r}", "use a number of seconds >= 0")
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._find(ids)
            missing = [i for i in ids if i not in found]
            if missing:
                raise CloudError(f"unknown local instances: {', '.join(missing)}", "check the ids")
            pending = [i for i in ids if found[i].state == "pending"]
            if not pending:
                return [found[i] for i in ids]
            if time.monotonic() >= deadline:
                raise CloudError(
                    f"local instances still pending after {timeout_s:g} s: {', '.join(pending)}",
                    "the machine may be overloaded; try a longer timeout",
                )
            time.sleep(_POLL_S)

    def query_instances(self, job_id: str) -> list[Instance]:
        out = []
        for entry in self._entries(job_id):
            state, reason = self._observe(entry)
            out.append(self._instance(entry, state, reason))
        return out

    def terminate_instances(self, ids: Sequence[str]) -> None:
        """SIGTERM each instance's bootstrap through its supervisor, which SIGKILLs what is
        left ``grace_s`` later. Returns at once unless a supervisor is gone (then this call
        does its work, waiting up to ``grace_s``). Unknown or ended instances are skipped."""
        orphans: list[LocalInstanceEntry] = []
        for entry in self._known(ids):
            folder = self.instance_dir(entry["id"])
            if (folder / EXIT_FILE).exists():
                continue
            create_json(folder / TERMINATE_FILE, {"time": time.time()})
            if procs.alive(entry["agent_pid"], entry["agent_ticks"]):
                procs.signal_all(_agent(entry), signal.SIGTERM)
            else:
                orphans.append(entry)
        if orphans:
            self._end_orphans(orphans)
        self._reap()

    def preempt(self, instance_id: str, notice_s: float | None = None) -> bool:
        """Interrupt ``instance_id`` now, like the chaos schedule does (chaos on demand).

        ``notice_s``: seconds from the notice (SIGTERM to the bootstrap) to SIGKILL; default
        the chaos configuration's notice (120 s without one), 0 kills at once. Returns False
        when the instance is unknown or already gone. Works from any process.
        """
        if notice_s is None:
            notice_s = self.chaos.notice if self.chaos is not None else SPOT_NOTICE_S
        if not notice_s >= 0:
            raise InputError(f"notice_s={notice_s!r}", "use seconds >= 0")
        entries = self._known([instance_id])
        if not entries:
            return False
        entry = entries[0]
        folder = self.instance_dir(instance_id)
        if self._observe(entry)[0] in ("terminated", "preempted"):
            return False
        create_json(folder / PREEMPT_FILE, {"time": time.time(), "notice_s": float(notice_s)})
        if not procs.alive(entry["agent_pid"], entry["agent_ticks"]):  # nobody to play it
            marker = f"{entry['id']}:{entry['token']}"
            now = time.time()
            procs.kill_all(lambda: procs.marked(marker))
            preempted: ExitRecord = {"state": "preempted", "reason": REASON, "exit_code": None}
            preempted.update({"time": now, "stop_at": now, "killed_at": now})
            create_json(folder / EXIT_FILE, preempted)
        return True

    def cleanup(self, cluster: ClusterSpec) -> None:
        """Remove the job's claims and supervisor files; keep ``state.json``, each instance's
        ``exit.json`` and ``output.log`` (the history). Refuses while an instance lives."""
        self._check_cluster(cluster)
        instances = self.query_instances(cluster.job_id)
        living = [i.id for i in instances if i.state in ("pending", "running", "stopping")]
        if living:
            raise CloudError(
                f"local instances of job {cluster.job_id} still run: {', '.join(living)}",
                f"end them first: kplan down {cluster.job_id}",
            )
        folder = self.job_dir(cluster.job_id)
        shutil.rmtree(folder / "chaos", ignore_errors=True)
        transient = (AGENT_FILE, RUN_FILE, NOTICE_FILE, TERMINATE_FILE, PREEMPT_FILE, AGENT_LOG)
        for entry in self._entries(cluster.job_id):
            for name in transient:
                (folder / entry["id"] / name).unlink(missing_ok=True)

    # --- helpers ----------------------------------------------------------------------------

    def _refusal(self, specs: Sequence[InstanceSpec], t_s: float) -> CapacityError | None:
        """Chaos outages: the whole request is refused, as a cloud does, if one launch is out."""
        if self.chaos is None:
            return None
        for spec in specs:
            outage = self.chaos.out_of_capacity(spec.zone or ZONE, spec.market, t_s)
            if outage is not None:
                until = "the end" if outage.until_s is None else f"{outage.until_s:g} s"
                return CapacityError(
                    f"local chaos: no {spec.market} capacity in zone {spec.zone or ZONE} "
                    f"(outage {outage.from_s:g} s to {until} of the job's chaos clock)",
                    hint="another zone or market may have capacity; or wait",
                )
        return None

    def _check_cluster(self, cluster: ClusterSpec) -> None:
        _check_job_id(cluster.job_id)
        if cluster.cloud != NAME:
            raise InputError(
                f"cluster cloud {cluster.cloud!r} given to the local provider",
                "create the provider of that cloud (kplan.launcher.providers.get_backend)",
            )

    def _check_spec(self, cluster: ClusterSpec, spec: InstanceSpec) -> None:
        if spec.job_id != cluster.job_id:
            raise InputError(
                f"instance {spec.name!r} is for job {spec.job_id!r}, not {cluster.job_id!r}",
                "launch each job's instances with its own cluster spec",
            )
        if spec.cloud != NAME:
            raise InputError(
                f"instance {spec.name!r} is for cloud {spec.cloud!r}, not local",
                "set InstanceSpec.cloud to 'local'",
            )
        if not spec.user_data.strip():
            raise InputError(f"instance {spec.name!r} has an empty user_data", "give it a command")
        if spec.node_rank < 0 and spec.node_rank != CONTROLLER_RANK:
            raise InputError(f"instance {spec.name!r} has node_rank {spec.node_rank}", "use >= 0")
        bad = [k for k in spec.env if not k or "=" in k or "\0" in k + spec.env[k]]
        if bad:
            raise InputError(
                f"instance {spec.name!r} has unusable env names {bad}",
                "names must be non-empty, without '=' or NUL",
            )

    def _start(
        self, cluster: ClusterSpec, spec: InstanceSpec, state: LocalJobState
    ) -> LocalInstanceEntry:
        index = state["next_index"]
        state["next_index"] = index + 1
        instance_id = f"{NAME}-{cluster.job_id}-{index}"
        folder = self.job_dir(cluster.job_id) / instance_id
        make_dirs(folder)
        cfg = AgentConfig(
            instance_id=instance_id,
            token=secrets.token_hex(8),
            node_rank=spec.node_rank,
            user_data=spec.user_data,
            env=dict(spec.env),
            cwd=os.getcwd(),
            boot_delay_s=self.boot_delay_s,
            grace_s=self.grace_s,
            chaos=self.chaos,
            chaos_epoch=float(state["chaos_epoch"] or 0.0),
            chaos_dir=str(self.job_dir(cluster.job_id) / "chaos"),
        )
        write_json(folder / AGENT_FILE, cfg.to_dict())
        with os.fdopen(open_private(folder / AGENT_LOG, os.O_WRONLY | os.O_APPEND), "ab") as log:
            agent = subprocess.Popen(
                [self.python, "-m", "kplan.launcher.providers.local_agent", str(folder)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                umask=UMASK,  # the agent's files and its bootstrap's: 0600
            )
        _AGENTS[agent.pid] = agent
        return {
            "id": instance_id,
            "name": spec.name,
            "node_rank": spec.node_rank,
            "instance_type": spec.instance_type,
            "market": spec.market,
            "zone": spec.zone or ZONE,
            "token": cfg.token,
            "agent_pid": agent.pid,
            "agent_ticks": procs.start_ticks(agent.pid),
            "launched_at": time.time(),
            "tags": {**spec.tags},
        }

    def _instance(
        self, entry: LocalInstanceEntry, state: InstanceState, reason: str | None
    ) -> Instance:
        job = job_of(entry["id"]) or ""
        return Instance(
            id=entry["id"],
            job_id=job,
            name=entry["name"],
            cloud=NAME,
            region=REGION,
            zone=str(entry.get("zone") or ZONE),  # state files of older versions: local
            instance_type=entry["instance_type"],
            market=entry["market"],
            state=state,
            node_rank=entry["node_rank"],
            private_ip=PRIVATE_IP,
            public_ip=None,
            launched_at=entry["launched_at"],
            reason=reason,
        )

    def _observe(self, entry: LocalInstanceEntry) -> tuple[InstanceState, str | None]:
        folder = self.instance_dir(entry["id"])
        self._reap()
        agent = _agent(entry)
        for attempt in range(2):  # the supervisor may write exit.json and end in between
            record = read_json(folder / EXIT_FILE)
            if record is not None:
                if procs.living(agent) and time.time() - record["time"] < _AGENT_EXIT_S:
                    return "stopping", record["reason"]  # gone only when every process is
                procs.signal_all(agent, signal.SIGKILL)  # has nothing left to do
                return record["state"], record["reason"]
            if attempt == 0 and procs.living(agent):
                if (folder / NOTICE_FILE).exists():
                    return "stopping", REASON
                if (folder / TERMINATE_FILE).exists():
                    return "stopping", "terminated"
                return ("running" if (folder / RUN_FILE).exists() else "pending"), None
        # The supervisor died without a record (killed): judge by the processes left.
        asked = (folder / TERMINATE_FILE).exists()
        if procs.marked(f"{entry['id']}:{entry['token']}"):
            return ("stopping", "terminated") if asked else ("running", None)
        lost: ExitRecord = {
            "state": "terminated",
            "reason": "terminated" if asked else "lost",
            "exit_code": None,
            "time": time.time(),
        }
        create_json(folder / EXIT_FILE, lost)
        final = read_json(folder / EXIT_FILE) or lost
        return final["state"], final["reason"]

    def _known(self, ids: Sequence[str]) -> list[LocalInstanceEntry]:
        by_job: dict[str, list[str]] = {}
        for instance_id in ids:
            job = job_of(instance_id)
            if job is not None:
                by_job.setdefault(job, []).append(instance_id)
        out = []
        for job, wanted in by_job.items():
            out += [e for e in self._entries(job) if e["id"] in wanted]
        return out

    def _find(self, ids: Sequence[str]) -> dict[str, Instance]:
        found = {}
        for entry in self._known(ids):
            state, reason = self._observe(entry)
            found[entry["id"]] = self._instance(entry, state, reason)
        return found

    def _end_orphans(self, entries: list[LocalInstanceEntry]) -> None:
        """End instances whose supervisor is gone: SIGTERM the bootstrap, SIGKILL after grace."""
        stop_at = time.time()
        groups = {e["id"]: procs.marked(f"{e['id']}:{e['token']}") for e in entries}
        for entry in entries:
            run = read_json(self.instance_dir(entry["id"]) / RUN_FILE)
            if run is not None and run.get("ticks") is not None:
                procs.signal_all({int(run["pid"]): int(run["ticks"])}, signal.SIGTERM)
        pids = {pid: t for group in groups.values() for pid, t in group.items()}
        procs.wait_gone(pids, self.grace_s)

        def find() -> dict[int, int]:
            out: dict[int, int] = {}
            for e in entries:
                out.update(procs.marked(f"{e['id']}:{e['token']}"))
            return out

        killed_at = time.time()
        left = procs.kill_all(find)
        if left:
            raise CloudError(
                f"processes {sorted(left)} of local instances "
                f"{', '.join(e['id'] for e in entries)} survived SIGKILL",
                "end them by pid (kill -9) and check for stuck I/O",
            )
        for entry in entries:
            ended: ExitRecord = {"state": "terminated", "reason": "terminated", "exit_code": None}
            ended.update({"stop_at": stop_at, "killed_at": killed_at, "time": time.time()})
            create_json(self.instance_dir(entry["id"]) / EXIT_FILE, ended)

    def _reap(self) -> None:
        """Collect the exit status of supervisors this process started (no zombies)."""
        for pid, agent in list(_AGENTS.items()):
            if agent.poll() is not None:
                del _AGENTS[pid]


def _agent(entry: LocalInstanceEntry) -> dict[int, int]:
    """The supervisor's pid and start ticks (None, read at its start: any start, as before)."""
    return cast("dict[int, int]", {entry["agent_pid"]: entry["agent_ticks"]})


def _new_state(job_id: str) -> LocalJobState:
    return {
        "schema": STATE_SCHEMA,
        "job_id": job_id,
        "created_at": time.time(),
        "next_index": 0,
        "chaos_epoch": None,
        "instances": [],
    }


def create(settings: ProviderSettings) -> Backend:
    """The local provider and its storage, ``LocalStorage($KPLAN_HOME/jobs)``; chaos from
    ``KPLAN_LOCAL_CHAOS`` (see ``local_chaos``)."""
    if settings.region not in (None, REGION):
        raise InputError(f"the local cloud has no region {settings.region!r}", f"use {REGION!r}")
    root = settings.home / "jobs"
    if settings.storage_uri is not None:
        if not settings.storage_uri.startswith("file://"):
            raise InputError(
                f"the local cloud cannot use storage {settings.storage_uri!r}",
                "leave the storage unset or give a file:// URI",
            )
        root = Path(unquote(urlparse(settings.storage_uri).path))
    provider = LocalProvider(settings.home, chaos=ChaosConfig.from_env())
    return Backend(provider=provider, storage=LocalStorage(root))
