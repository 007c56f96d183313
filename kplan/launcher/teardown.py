"""The stop path of a job: teardown that always runs, and its best-effort records.

Teardown terminates every instance of the job (known in memory, and found by tag) and waits
until the cloud shows them gone; the database may be what failed, so every record it makes is
best-effort (noted in the journal instead of raised). ``kplan/launcher/lifecycle.py`` drives it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from kplan.core.errors import CloudError, KplanError
from kplan.launcher.observe import RunState
from kplan.launcher.provider import Instance
from kplan.launcher.state import GONE_STATES

# What a best-effort record in the stop path may raise: the database or the disk failing.
RECORD_ERRORS = (KplanError, sqlite3.Error, OSError)


@dataclass
class _Stopping:
    """One teardown's progress: what was asked to end, whether the stop is recorded."""

    status: str
    reason: str
    asked: set[str] = field(default_factory=set)
    recorded: bool = False
    last_error: BaseException | None = None


class TeardownRun(RunState):
    """A running job's stop path (subclassed by the lifecycle)."""

    def _safe(self, what: str, write: Callable[[], object]) -> bool:
        """Run a database write; on failure note it in the journal and skip further writes
        until the end of teardown (each may wait for a lock), instead of raising."""
        if self.db_broken:
            return False
        try:
            write()
            return True
        except RECORD_ERRORS as err:
            self.db_broken = True
            self._journal_safe("note", what=f"not recorded: {what}", error=str(err))
            return False

    def _journal_safe(self, kind: str, **data: object) -> None:
        # The journal is a second record; the instances are ended regardless.
        with contextlib.suppress(*RECORD_ERRORS):
            self.journal.write(kind, self.clock.now(), **data)

    def _spend(self) -> float:
        try:
            return self.ledger.spend()
        except RECORD_ERRORS:
            return 0.0

    def _settle_records(self) -> None:
        """Record the end of every instance that teardown saw gone (rows a failed write left)."""
        for rec in list(self.records.values()):
            if not rec.alive and rec.ended_at is not None:
                self._safe(f"end of {rec.id}", partial(self._record_end, rec, rec.ended_at))

    def _teardown_always(self, status: str, reason: str) -> CloudError | None:
        """Teardown, retried if a Ctrl-C lands in it; returns its failure instead of raising."""
        self._journal_safe("note", what=f"stopping: {status} ({reason})")
        for _ in range(3):
            try:
                self._teardown(status, reason)
                return None
            except KeyboardInterrupt:
                continue  # the first signal only: the handler ignores later ones
            except CloudError as err:
                return err
        return CloudError(
            f"job {self.spec.job_id}: teardown was interrupted",
            hint=f"run `kplan down {self.spec.job_id}`",
        )

    def _teardown(self, status: str, reason: str) -> None:
        """Terminate everything of the job (known in memory, and by tag) and see it gone.

        Terminate calls come first and never wait on the database: what teardown records
        (instance ends, ledger rows, events) is best-effort, and the end of each instance is
        kept in memory and in the journal for :meth:`_settle_records` and ``kplan down``."""
        job_id = self.spec.job_id
        poll = min(self.spec.timing.check_interval_s, 5.0)
        limit = self.clock.now() + self.spec.timing.grace_s + self.spec.timing.teardown_s
        stop = _Stopping(status, reason)
        known = sorted(r.id for r in self.records.values() if r.alive and not self._own(r))
        if known:  # before any query: an instance the cloud does not list yet is still ended
            try:
                self._terminate(known, stop)
            except Exception as err:  # retried below, with what the query finds
                stop.last_error = err
        while True:
            found = None
            try:
                found = self.provider.query_instances(job_id)
            except Exception as err:  # terminate from memory regardless
                stop.last_error = err
            if found is not None:
                found = [i for i in found if not self._own(i)]
                for inst in found:
                    if inst.state not in GONE_STATES and inst.id not in self.records:
                        self._adopt_safe(inst)
                self._see_gone({i.id: i for i in found})
            ids = sorted(r.id for r in self.records.values() if r.alive and not self._own(r))
            todo = [i for i in ids if i not in stop.asked]
            if found is not None:  # a stopped VM still exists (GCP TERMINATED: its disk bills)
                todo += [i.id for i in found if i.state in GONE_STATES and i.id not in stop.asked]
            if todo:
                try:
                    self._terminate(todo, stop)
                    if found is None or any(i in ids for i in todo):
                        continue
                except Exception as err:  # retried next poll
                    stop.last_error = err
            if found is not None and not ids:
                break
            if found is None and not self.requested:
                # Nothing was ever asked of the cloud (e.g. credentials or the bucket failed in
                # prepare): no instance of this job can exist, so there is nothing to wait for.
                self._journal_safe("note", what="teardown: no instance was ever requested")
                break
            if self.clock.now() >= limit:
                last = stop.last_error
                why = f" (last error: {_message(last)})" if last else ""
                raise CloudError(
                    f"job {job_id}: instances {', '.join(ids) or '(unknown)'} may still be "
                    f"running{why}",
                    hint=f"run `kplan down {job_id}` to terminate them",
                )
            self.clock.sleep(min(poll, max(limit - self.clock.now(), 0.0)))
        if not stop.recorded:
            self._record_stop(status, reason)
        self._cleanup()

    def _terminate(self, ids: list[str], stop: _Stopping) -> None:
        """Ask the cloud to end ``ids``; the first time, record that the job is stopping."""
        self.terminating.update(ids)
        self.provider.terminate_instances(ids)
        stop.asked.update(ids)
        self._journal_safe("note", what=f"terminating {', '.join(ids)}")
        if not stop.recorded:
            self._record_stop(stop.status, stop.reason)
            stop.recorded = True
        what = f"terminating {', '.join(ids)}"
        self._safe("event terminate", partial(self._event, "terminate", what))

    def _cleanup(self) -> None:
        """The job-wide resources (rules, groups) once the instances are gone."""
        job_id = self.spec.job_id
        try:
            self.provider.cleanup(self.cluster)
        except CloudError as err:
            # job-wide rules/groups only, free; `kplan down` retries. A controller on its own
            # instance (controller_node.py) still uses them: they go after it, with `kplan down`.
            if not self.requested or self.own_name is not None:
                self._journal_safe("note", what=f"cleanup failed: {err.message}")
                what = f"cleanup of job-wide resources failed: {err.message}"
                self._safe("event cleanup", partial(self._event, "cleanup", what))
                return
            raise CloudError(
                f"job {job_id}: instances are gone but cleanup failed: {err.message}",
                hint=f"run `kplan down {job_id}` to retry",
            ) from None

    def _record_stop(self, status: str, reason: str) -> None:
        self._safe("status stopping", lambda: self._status("stopping", reason))
        self._safe(
            "event stop",
            lambda: self._event("stop", f"stopping: {status} ({reason})", {"status": status}),
        )

    def _see_gone(self, found: dict[str, Instance]) -> None:
        """Mark (in memory, then best-effort in the journal and the database) every live record
        the provider shows gone or no longer reports."""
        now = self.clock.now()
        self.listed.update(found)
        for rec in list(self.records.values()):
            if not rec.alive or self._own(rec):
                continue
            inst = found.get(rec.id)
            if inst is not None and inst.state not in GONE_STATES:
                continue
            if inst is None and rec.id not in self.terminating and self._not_listed_yet(rec, now):
                continue  # not listed yet and not asked to end: it is terminated next
            state = inst.state if inst is not None else "terminated"
            reason = (inst.reason if inst is not None else None) or (
                "terminated by kplan" if rec.id in self.terminating else "no longer reported"
            )
            ended = replace(rec, state=state, ended_at=now, reason=reason)
            self.records[rec.id] = ended
            self._journal_safe("gone", id=rec.id, state=state)
            self._safe(f"end of {rec.id}", partial(self._record_end, ended, now))

    def _adopt_safe(self, inst: Instance) -> None:
        """Teardown's :meth:`_adopt`: in memory always, recorded if the database lets it."""
        try:
            self._adopt(inst)
        except RECORD_ERRORS as err:
            self.db_broken = True
            self._journal_safe("note", what=f"not recorded: adopted {inst.id}", error=str(err))


def _message(err: BaseException) -> str:
    return err.message if isinstance(err, KplanError) else f"{type(err).__name__}: {err}"
