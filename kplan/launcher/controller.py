"""The job's controller: its durable state and its heartbeat, ``<job>/controller.json``.

The controller is the loop ``kplan launch`` runs (``kplan/launcher/lifecycle.py``): recovery,
the guard, the ledger, re-planning, teardown and the renewal of the nodes' lease. It writes
``<job>/controller.json`` into the job's storage at every monitor check and before every
request for instances (:class:`ControllerDoc`): who runs it (host, pid, how it was started) and
when it last checked (the heartbeat), plus what a restarted controller cannot read from the
state database or the launch journal: the rendezvous generation, how many instances each node
rank was given, the counts of lost nodes the recovery rules bound, and the job's spec and
instances (so a controller restarted on a machine without the job's database can rebuild it:
``kplan/launcher/controller_resume.py``).

:func:`liveness` tells ``kplan status`` whether the controller is alive: on the machine that runs
it, by its pid; elsewhere, by the age of its heartbeat.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

from kplan.core.procs import read_stat
from kplan.launcher.state import InstanceRecord
from kplan.launcher.storage import Storage

CONTROLLER_KEY = "controller.json"
STALE_CHECKS = 3  # a heartbeat older than this many checks (plus the slack) is a dead controller
STALE_SLACK_S = 30.0
MODES = ("foreground", "detached", "restarted")


def controller_key(job_id: str) -> str:
    return f"{job_id}/{CONTROLLER_KEY}"


def this_host() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class ControllerDoc:
    """``<job>/controller.json``. Times are the controller's clock (epoch seconds)."""

    job: str
    host: str
    pid: int
    mode: str  # foreground (kplan launch), detached (--detach), restarted (kplan controller)
    started_at: float  # when this controller process took the job
    heartbeat_at: float  # its last monitor check (or request for instances)
    check_interval_s: float
    job_started_at: float  # when the job's first controller started it (the deadline's origin)
    generation: int  # the rendezvous generation of the newest instances
    launches: dict[int, int] = field(default_factory=dict)  # node rank -> instances asked for it
    lost_nodes: int = 0  # lost nodes counted against max_replacements
    counted: tuple[tuple[int, float], ...] = ()  # the (rank, lost at) already counted
    replacements: int = 0
    preemptions: int = 0
    returns: int = 0
    waiting_since: float | None = None  # waiting for capacity since then
    spec: dict[str, Any] = field(default_factory=dict)  # the job's JobSpec.to_dict()
    instances: tuple[InstanceRecord, ...] = ()  # every instance of the job, as it knows them

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["launches"] = {str(k): v for k, v in self.launches.items()}
        doc["counted"] = [list(c) for c in self.counted]
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ControllerDoc:
        """Raises ``ValueError``/``KeyError``/``TypeError`` for a document that is not one."""
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return cls(
            job=str(doc["job"]),
            host=str(doc["host"]),
            pid=int(doc["pid"]),
            mode=str(doc["mode"]),
            started_at=float(doc["started_at"]),
            heartbeat_at=float(doc["heartbeat_at"]),
            check_interval_s=float(doc["check_interval_s"]),
            job_started_at=float(doc["job_started_at"]),
            generation=int(doc["generation"]),
            launches={int(k): int(v) for k, v in dict(doc.get("launches", {})).items()},
            lost_nodes=int(doc.get("lost_nodes", 0)),
            counted=tuple((int(r), float(t)) for r, t in doc.get("counted", [])),
            replacements=int(doc.get("replacements", 0)),
            preemptions=int(doc.get("preemptions", 0)),
            returns=int(doc.get("returns", 0)),
            waiting_since=None if doc.get("waiting_since") is None else float(doc["waiting_since"]),
            spec=dict(doc.get("spec", {})),
            instances=tuple(InstanceRecord(**i) for i in doc.get("instances", [])),
        )


def write_controller(storage: Storage, doc: ControllerDoc) -> None:
    """Write the document (raises what the storage raises: the caller reports it)."""
    storage.put_bytes(controller_key(doc.job), doc.to_json())


def read_controller(storage: Storage, job_id: str) -> ControllerDoc | None:
    """The job's controller document; None when there is none or it cannot be read."""
    try:
        data = storage.get_bytes(controller_key(job_id))
        return None if not data else ControllerDoc.from_json(data)
    except (ValueError, KeyError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie, killed but not yet reaped by
    its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = read_stat(pid)
    return stat is None or stat.state not in ("Z", "X")


@dataclass(frozen=True)
class Liveness:
    """What ``kplan status`` says about a job's controller."""

    alive: bool
    host: str
    pid: int
    mode: str
    heartbeat_age_s: float
    how: str  # "pid" (checked on this machine) or "heartbeat" (its age, from elsewhere)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def liveness(doc: ControllerDoc, now: float, host: str | None = None) -> Liveness:
    """Alive: on this machine, its pid runs (a teardown writes no heartbeat while it waits for
    the cloud); on another machine, its heartbeat is younger than :data:`STALE_CHECKS` checks
    plus :data:`STALE_SLACK_S`."""
    age = max(now - doc.heartbeat_at, 0.0)
    fresh = age <= STALE_CHECKS * doc.check_interval_s + STALE_SLACK_S
    if doc.host == (host or this_host()):
        return Liveness(pid_alive(doc.pid), doc.host, doc.pid, doc.mode, age, "pid")
    return Liveness(fresh, doc.host, doc.pid, doc.mode, age, "heartbeat")
