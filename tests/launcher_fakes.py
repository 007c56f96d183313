"""Simulated providers for the launcher's tests (in memory, on the launcher's FakeClock).

``SimProvider`` plays a cloud: instances boot after ``boot_s``, spot instances are preempted
after the delays the test gives, terminations take ``term_latency_s``, zones may lack capacity,
and the training job finishes at ``finish_at`` (every live node then writes its status file and
powers off, as the cloud bootstrap does). States are computed lazily from the clock, so the
launcher sees exactly what a real cloud would show at that moment.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kplan.core.errors import CapacityError, CloudError
from kplan.launcher.clock import Clock
from kplan.launcher.provider import ClusterSpec, Instance, InstanceSpec, InstanceState
from kplan.launcher.providers import Backend, ProviderSettings


@dataclass
class _Sim:
    spec: InstanceSpec
    id: str
    created: float
    preempt_at: float | None
    stop_at: float | None = None  # termination requested: gone at this time
    done_at: float | None = None  # the node finished and powered off
    status_written: bool = False
    final: tuple[float, InstanceState, str] | None = None  # once ended, it stays ended


@dataclass
class SimProvider:
    clock: Clock
    storage: object  # a Storage: status files go there
    name: str = "sim"
    boot_s: float = 0.0
    term_latency_s: float = 0.0
    finish_at: float | None = None  # absolute time at which training ends (None: never)
    exit_code: int = 0  # the status each node writes at finish_at
    boot_by_name: dict[str, float] = field(default_factory=dict)  # overrides boot_s
    # by instance name: (seconds after its launch, exit code): that node alone ends early
    node_exit: dict[str, tuple[float, int]] = field(default_factory=dict)
    preempt_after: Callable[[InstanceSpec], float | None] = lambda spec: None
    no_capacity: set[tuple[str, str]] = field(default_factory=set)  # (zone, market)
    # (zone, market, from, until): no capacity there in [from, until) (absolute clock times)
    outages: list[tuple[str, str, float, float]] = field(default_factory=list)
    fail_terminate: bool = False
    instances: dict[str, _Sim] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    launched: list[InstanceSpec] = field(default_factory=list)
    terminate_requests: list[str] = field(default_factory=list)

    def prepare(self, cluster: ClusterSpec) -> None:
        self.calls.append("prepare")

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        self.calls.append("run_instances")
        now = self.clock.now()
        for spec in specs:
            out_now = any(
                (z, m) == (spec.zone, spec.market) and t0 <= now < t1
                for z, m, t0, t1 in self.outages
            )
            if (spec.zone, spec.market) in self.no_capacity or out_now:
                raise CapacityError(f"InsufficientInstanceCapacity in {spec.zone} ({spec.market})")
        out = []
        for spec in specs:
            iid = f"i-{len(self.instances):04d}"
            delay = self.preempt_after(spec) if spec.market == "spot" else None
            sim = _Sim(spec, iid, now, None if delay is None else now + delay)
            self.launched.append(spec)
            self.instances[iid] = sim
            out.append(self._view(sim, now))
        return out

    def wait_instances(self, ids: Sequence[str], timeout_s: float) -> list[Instance]:
        raise AssertionError("the launcher polls query_instances instead")

    def query_instances(self, job_id: str) -> list[Instance]:
        now = self.clock.now()
        return [self._view(s, now) for s in self.instances.values() if s.spec.job_id == job_id]

    def terminate_instances(self, ids: Sequence[str]) -> None:
        self.calls.append("terminate_instances")
        if self.fail_terminate:
            raise CloudError("terminate refused (simulated)")
        now = self.clock.now()
        self.terminate_requests.extend(ids)
        for iid in ids:
            sim = self.instances.get(iid)
            if sim is not None and sim.stop_at is None:
                sim.stop_at = now + self.term_latency_s

    def cleanup(self, cluster: ClusterSpec) -> None:
        self.calls.append("cleanup")

    # --- simulation -------------------------------------------------------------------------

    def _ended_at(self, s: _Sim) -> tuple[float, InstanceState, str] | None:
        if s.final is not None:
            return s.final
        ends: list[tuple[float, InstanceState, str]] = []
        if s.stop_at is not None:
            ends.append((s.stop_at, "terminated", "terminated by request"))
        if s.preempt_at is not None:
            ends.append((s.preempt_at, "preempted", "spot interruption"))
        exit_at = self._exit(s)
        if exit_at is not None:
            ends.append((exit_at[0], "terminated", "powered off"))
        return min(ends) if ends else None

    def _boot(self, s: _Sim) -> float:
        return self.boot_by_name.get(s.spec.name, self.boot_s)

    def _exit(self, s: _Sim) -> tuple[float, int] | None:
        """When and how the node's training process exits (then it powers off)."""
        early = self.node_exit.get(s.spec.name)
        if early is not None:
            return s.created + early[0], early[1]
        if self.finish_at is not None and self.finish_at >= s.created + self._boot(s):
            return self.finish_at, self.exit_code
        return None

    def _view(self, s: _Sim, now: float) -> Instance:
        state: InstanceState = "running" if now >= s.created + self._boot(s) else "pending"
        reason = None
        end = self._ended_at(s)
        if end is not None and now >= end[0]:
            s.final = end
            _, state, reason = end
            if reason == "powered off" and not s.status_written:
                s.status_written = True
                code = self._exit(s)[1]  # type: ignore[index]
                doc = {"exit_code": code, "time": end[0], "instance": s.spec.name}
                key = f"{s.spec.job_id}/status/node-{s.spec.node_rank}.json"
                self.storage.put_bytes(key, json.dumps(doc).encode())  # type: ignore[attr-defined]
        elif s.stop_at is not None:
            state = "stopping"
        return Instance(
            id=s.id,
            job_id=s.spec.job_id,
            name=s.spec.name,
            cloud=s.spec.cloud,
            region=s.spec.region,
            zone=s.spec.zone,
            instance_type=s.spec.instance_type,
            market=s.spec.market,
            state=state,
            node_rank=s.spec.node_rank,
            private_ip=f"10.0.{int(s.id[2:]) // 250}.{int(s.id[2:]) % 250 + 2}"
            if state == "running"
            else None,
            launched_at=s.created,
            reason=reason,
        )

    def alive(self) -> list[str]:
        now = self.clock.now()
        return [
            s.id
            for s in self.instances.values()
            if self._view(s, now).state not in ("terminated", "preempted")
        ]


class NoMutationProvider:
    """Raises on every call that would change anything: the dry-run proof."""

    name = "refuses"

    def __init__(self) -> None:
        self.reads: list[str] = []

    def _refuse(self, verb: str) -> None:
        raise AssertionError(f"dry run called the mutating verb {verb}")

    def prepare(self, cluster: ClusterSpec) -> None:
        self._refuse("prepare")

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        self._refuse("run_instances")
        return []

    def wait_instances(self, ids: Sequence[str], timeout_s: float) -> list[Instance]:
        self.reads.append("wait_instances")
        return []

    def query_instances(self, job_id: str) -> list[Instance]:
        self.reads.append("query_instances")
        return []

    def terminate_instances(self, ids: Sequence[str]) -> None:
        self._refuse("terminate_instances")

    def cleanup(self, cluster: ClusterSpec) -> None:
        self._refuse("cleanup")


class NoWriteStorage:
    """A storage that refuses writes (the dry-run proof for the bucket)."""

    uri = "s3://dry-run-bucket/kplan"

    def put_bytes(self, key: str, data: bytes) -> None:
        raise AssertionError(f"dry run wrote {key}")

    def get_bytes(self, key: str) -> bytes | None:
        return None

    def list_keys(self, prefix: str) -> list[str]:
        return []

    def delete_prefix(self, prefix: str) -> None:
        raise AssertionError(f"dry run deleted {prefix}")


def fast_dir(tmp_path: Path, name: str) -> Path:
    """A folder on tmpfs when there is one (SQLite's fsyncs cost nothing there), else tmp_path.

    The database stays a real SQLite file in WAL mode with ``synchronous=FULL``: only the disk
    under it is faster. The caller removes it (``shutil.rmtree``)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=f"kplan-{name}-", dir=shm))
    path = tmp_path / name
    path.mkdir()
    return path


# Factories for the provider registry (``FACTORIES[name] = "tests.launcher_fakes:..."``).
CURRENT: dict[str, Backend] = {}


def current_backend(settings: ProviderSettings) -> Backend:
    """The backend a test put in ``CURRENT["backend"]``."""
    return CURRENT["backend"]


def refusing_backend(settings: ProviderSettings) -> Backend:
    """A provider and a storage that raise on any change: a dry run must never notice."""
    return Backend(NoMutationProvider(), NoWriteStorage())  # type: ignore[arg-type]
