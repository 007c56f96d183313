"""The hard stop (kplan/launcher/hardstop.py): caps from the budget, the lease, the watchdog.

- the cap of each instance, from the budget, the cluster's rate, the spend so far and the deadline;
- the watchdog run as real code (``sh`` and ``bash`` subprocesses against a lease file, with a
  lease of seconds): it ends the node when the lease is not renewed, and not while it is;
- the AWS timer fragment run with a ``shutdown`` stand-in: the right minutes;
- a simulated spot job on the fake clock whose launcher is killed (no teardown can run) at every
  monitor check in turn: every instance ends within one lease (plus the watchdog's polls) of
  the death, and what the cloud bills, and what the ledger says after ``kplan down``, stay within
  the budget plus one lease of the cluster;
- a launcher whose guard never stops: the caps alone end every instance at the budget.
"""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from kplan.launcher.clock import FakeClock
from kplan.launcher.down import down_job
from kplan.launcher.dryrun import RunInstances, dry_run
from kplan.launcher.guard import Decision, Guard, Running
from kplan.launcher.hardstop import (
    LEASE_KEY,
    MAX_CAP_S,
    MIN_CAP_S,
    POLL_S,
    cap_minutes,
    cap_seconds,
    outlives_s,
    timer_sh,
    watchdog_sh,
    worst_case_usd,
)
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.lifecycle import run_job
from kplan.launcher.provider import Instance, InstanceState
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.bootstrap_shims import node_tools
from tests.launcher_fakes import SimProvider, _Sim, fast_dir

AWS = Billing("aws", 60.0, 1.0, "test")
JOB = "kp-lease-1"
LEASE_S = 600.0
# The numbers of the last sweep, for the report (printed with -s).
RESULTS: dict[str, object] = {}


def _spec(script: str, **options: Any) -> JobSpec:
    nodes = (
        NodeSpec(0, "g4dn.xlarge", "on-demand", "us-east-1a", 1, 0.5),
        NodeSpec(1, "g4dn.xlarge", "spot", "us-east-1a", 1, 0.2),
    )
    settings: dict[str, Any] = {
        "budget_usd": 1.0,  # 0.7 $/h: about 85 minutes of the cluster
        "check_interval_s": 60.0,
        "grace_s": 60.0,
        "teardown_s": 60.0,
        "lease_s": LEASE_S,
        **options,
    }
    budget = settings.pop("budget_usd")
    return JobSpec.build(
        job_id=JOB,
        cloud="aws",
        region="us-east-1",
        script=script,
        nodes=nodes,
        budget_usd=budget,
        offers=(
            ZoneOffer("g4dn.xlarge", "us-east-1a", "spot", 0.2),
            ZoneOffer("g4dn.xlarge", "us-east-1b", "spot", 0.25),
        ),
        **settings,
    )


# --- the cap -----------------------------------------------------------------------------------


def test_the_cap_spends_what_is_left_of_the_budget_at_the_cluster_rate(tmp_path: Path) -> None:
    spec = _spec(str(tmp_path / "t.py"))  # $1, 0.7 $/h
    assert cap_seconds(spec, 0.0, [], [0.5, 0.2], 0.0, None) == int(1.0 / 0.7 * 3600)
    # 30 min later, both nodes billed since 0 and 0.1 closed: the rest of the budget
    live = [Running(0.0, 0.5), Running(0.0, 0.2)]
    left = 1.0 - 0.1 - 0.7 * 0.5
    assert cap_seconds(spec, 0.1, live, [], 1800.0, None) == int(left / 0.7 * 3600)
    # the spot node lost at 20 min and replaced at 30: the replacement ends with the survivor,
    # later by what the missing node did not spend in those 10 minutes (at the cluster's rate)
    first_end = cap_seconds(spec, 0.0, [], [0.5, 0.2], 0.0, None)
    closed = 0.2 * 1200 / 3600
    again = cap_seconds(spec, closed, [Running(0.0, 0.5)], [0.2], 1800.0, None)
    assert again is not None and first_end is not None
    unspent_s = 0.2 * 600 / 0.7
    assert abs((1800.0 + again) - (first_end + unspent_s)) <= 1.0
    # the deadline comes first; a faster live rate (on-demand fallback) shortens it
    assert cap_seconds(spec, 0.0, [], [0.5, 0.2], 0.0, 600.0) == 600
    costly = cap_seconds(spec, 0.0, [Running(0.0, 0.5)], [1.5], 0.0, None)
    assert costly == int(1.0 / 2.0 * 3600)
    # never below the minimum, never above GCP's 120 days; free and no deadline: none
    assert cap_seconds(spec, 0.999, [], [0.5, 0.2], 0.0, None) == MIN_CAP_S
    rich = replace(spec, budget_usd=1e6)
    assert cap_seconds(rich, 0.0, [], [0.5, 0.2], 0.0, None) == MAX_CAP_S
    free = JobSpec.local(str(tmp_path / "t.py"), nodes=2)
    assert cap_seconds(free, 0.0, [], [0.0, 0.0], 0.0, None) is None
    assert cap_minutes(59) == 1 and cap_minutes(3600) == 60 and cap_minutes(3659) == 60


def test_the_lease_period_covers_two_checks_and_the_worst_case_adds_one_lease(
    tmp_path: Path,
) -> None:
    spec = _spec(str(tmp_path / "t.py"))
    assert spec.timing.lease_period_s == LEASE_S
    slow = _spec(str(tmp_path / "t.py"), check_interval_s=400.0)
    assert slow.timing.lease_period_s == 800.0
    assert outlives_s(spec) == LEASE_S + 2 * POLL_S
    assert worst_case_usd(spec) == pytest.approx(1.0 + (LEASE_S + 60) / 3600 * 0.7)
    from kplan.core.errors import InputError

    with pytest.raises(InputError, match="lease 60 s"):
        _spec(str(tmp_path / "t.py"), lease_s=60.0)


def test_lease_minutes_is_a_flag_and_a_short_lease_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from kplan.cli.main import app

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    res = CliRunner().invoke(app, ["launch", str(script), "--lease-minutes", "1", "--dry-run"])
    assert res.exit_code == 2
    assert "lease 60 s is shorter than 120 s" in res.output and "Traceback" not in res.output
    args = ["launch", str(script), "--nodes", "2", "--lease-minutes", "20", "--dry-run", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    import json

    doc = json.loads(res.output)
    assert doc["hard_stop"]["lease_s"] == 1200.0 and doc["hard_stop"]["max_run_s"] is None
    users = [i["user_data"] for r in doc["requests"] if "instances" in r for i in r["instances"]]
    assert len(users) == 2 and all("-ge 1200 ]" in u and "kill -TERM $$" in u for u in users)


def test_the_dry_run_shows_the_lease_the_caps_and_the_worst_case(tmp_path: Path) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    spec = _spec(str(script), deadline_h=1.0)
    run = dry_run(spec, "s3://bucket/kplan", AWS)
    batches = [r for r in run.requests if isinstance(r, RunInstances)]
    specs = [s for b in batches for s in b.instances]
    assert len(specs) == 2 and {s.max_run_s for s in specs} == {3600}
    assert all("shutdown -h +60 " in s.user_data for s in specs)
    doc = run.to_dict()
    assert doc["hard_stop"] == {
        "lease_s": LEASE_S,
        "max_run_s": 3600,
        "worst_case_usd": pytest.approx(worst_case_usd(spec)),
        "outlives_s": LEASE_S + 60,
    }


# --- the watchdog, as real code -------------------------------------------------------------


@dataclass
class Node:
    """A node script (``shell``) running only the watchdog against ``lease`` until ``life_s``."""

    proc: subprocess.Popen[bytes]
    lease: Path
    fired: Path
    started: float


def _node(tmp: Path, shell: str, lease_s: float, life_s: float) -> Node:
    lease = tmp / f"{shell}-lease.json"
    fired = tmp / f"{shell}-fired"
    stop = f"echo fired >> {fired}"
    text = watchdog_sh(f"cat {lease}", lease_s, stop, poll_s=1) + f"sleep {life_s}\n"
    proc = subprocess.Popen([shell, "-c", text], stdout=subprocess.DEVNULL)
    return Node(proc, lease, fired, time.monotonic())


def _fired_after(node: Node, limit_s: float) -> float | None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if node.fired.exists():
            return time.monotonic() - node.started
        time.sleep(0.1)
    return None


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_watchdog_ends_a_node_whose_lease_is_not_renewed(tmp_path: Path, shell: str) -> None:
    """No lease at all: it fires one lease (3 s) after it started, within a poll."""
    node = _node(tmp_path, shell, 3.0, 30.0)
    try:
        after = _fired_after(node, 20.0)
        assert after is not None and 2.0 <= after <= 12.0, after  # 3 s, a poll, a loaded CPU
        assert node.fired.read_text() == "fired\n"  # once: the watchdog leaves after it
    finally:
        node.proc.kill()
        node.proc.wait()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_watchdog_spares_a_renewed_lease_then_fires_when_renewals_stop(
    tmp_path: Path, shell: str
) -> None:
    node = _node(tmp_path, shell, 4.0, 40.0)
    try:
        for i in range(20):  # renewed every half second for 10 s: more than two lease periods
            node.lease.write_text(f'{{"renewed_at": {i}}}')
            time.sleep(0.5)
            assert not node.fired.exists(), f"fired while the lease was renewed ({i / 2} s)"
        stopped = time.monotonic() - node.started
        after = _fired_after(node, 20.0)
        assert after is not None, "the watchdog did not fire after the renewals stopped"
        assert 2.5 <= after - stopped <= 12.0, after - stopped
    finally:
        node.proc.kill()
        node.proc.wait()


def test_the_watchdog_leaves_with_its_node(tmp_path: Path) -> None:
    """The node's script ends (and is reaped): its watchdog leaves within a second or so,
    before its lease of 3 s would have run out, and never fires."""
    text = watchdog_sh(f"cat {tmp_path / 'none'}", 3.0, f"touch {tmp_path / 'fired'}", 1)
    pidfile = tmp_path / "watchdog.pid"
    proc = subprocess.run(
        ["sh", "-c", text + f"echo $! > {pidfile}\n"],
        stdout=subprocess.DEVNULL,
        timeout=10,
        check=True,
    )
    assert proc.returncode == 0
    pid = int(pidfile.read_text())
    time.sleep(4.0)
    assert not Path(f"/proc/{pid}").exists() or _state(pid) == "Z"
    assert not (tmp_path / "fired").exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


def test_the_aws_timer_asks_shutdown_for_the_caps_minutes(tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    tools = node_tools(tmp_path / "bin", marker)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", timer_sh(5430)], env=env, check=True, capture_output=True)
    assert Path(f"{marker}.shutdown").read_text().split() == ["-h", "+90", "kplan", "hard", "stop"]


# --- a simulated cloud whose nodes run the watchdog and the cap, on the fake clock -------------


class Killed(BaseException):
    """The launcher was killed (kill -9): no handler, no teardown, nothing more it does."""


@dataclass
class Death:
    """Kills the launcher at its ``at``-th wait; afterwards every call it makes raises."""

    at: int | None
    waits: int = 0
    dead_at: float | None = None

    def check(self) -> None:
        if self.dead_at is not None:
            raise Killed


class DyingClock(FakeClock):
    def __init__(self, death: Death) -> None:
        super().__init__()
        self.death = death

    def sleep(self, seconds: float) -> None:
        self.death.check()
        self.death.waits += 1
        if self.death.at is not None and self.death.waits > self.death.at:
            self.death.dead_at = self.now()
            raise Killed
        super().sleep(seconds)


class LeaseStorage(LocalStorage):
    """The bucket: remembers when each lease renewal was written (by the fake clock)."""

    def __init__(self, root: Path, clock: FakeClock, death: Death) -> None:
        super().__init__(root)
        self.uri = "s3://bucket/kplan"
        self.clock = clock
        self.death = death
        self.renewals: list[float] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        self.death.check()
        super().put_bytes(key, data)
        if key.endswith(f"/{LEASE_KEY}"):
            self.renewals.append(self.clock.now())


@dataclass
class LeaseSim(SimProvider):
    """SimProvider whose nodes run the hard stop as the AWS bootstrap does: the cap's shutdown
    timer (whole minutes from boot) and the watchdog (a poll every POLL_S from boot; it powers
    off when what it reads did not change for ``lease_s``)."""

    lease_s: float = LEASE_S
    death: Death = field(default_factory=lambda: Death(None))
    renewals: list[float] = field(default_factory=list)

    def run_instances(self, cluster: Any, specs: Any) -> list[Instance]:
        self.death.check()
        return super().run_instances(cluster, specs)

    def query_instances(self, job_id: str) -> list[Instance]:
        self.death.check()
        return super().query_instances(job_id)

    def terminate_instances(self, ids: Any) -> None:
        self.death.check()
        super().terminate_instances(ids)

    def _ended_at(self, s: _Sim) -> tuple[float, InstanceState, str] | None:
        end = super()._ended_at(s)
        if s.final is not None:
            return end
        ends = [] if end is None else [end]
        boot = s.created + self._boot(s)
        if s.spec.max_run_s is not None:
            ends.append((boot + cap_minutes(s.spec.max_run_s) * 60, "terminated", "hard stop"))
        fired = self._watchdog(boot)
        if fired is not None:
            ends.append((fired, "terminated", "lease expired"))
        return min(ends) if ends else None

    def _watchdog(self, boot: float) -> float | None:
        """When the node's watchdog powers it off, as far as the clock has gone (None: not
        by now)."""
        now = self.clock.now()
        last = seen = boot
        t = boot + POLL_S
        while t <= now:
            newest = bisect.bisect_right(self.renewals, t)
            if newest and self.renewals[newest - 1] > seen:
                seen = self.renewals[newest - 1]
                last = t  # a new renewal was read at this poll
            if t - last >= self.lease_s:
                return t
            t += POLL_S
        return None

    def billed_usd(self, billing: Billing) -> float:
        """What the cloud bills for every instance, from creation to its end (or now)."""
        now = self.clock.now()
        total = 0.0
        for s in self.instances.values():
            end = self._ended_at(s)
            until = min(end[0], now) if end is not None and end[0] <= now else now
            price = PRICES[(s.spec.market, s.spec.zone)]
            total += billing.billed_seconds(until - s.created) * price / 3600
        return total


PRICES = {  # the job's offers (_spec)
    ("on-demand", "us-east-1a"): 0.5,
    ("spot", "us-east-1a"): 0.2,
    ("spot", "us-east-1b"): 0.25,
}


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    path = fast_dir(tmp_path, "lease")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Outcome:
    died_at: float | None
    lived_after_s: float  # the longest an instance ran after the launcher died
    billed_usd: float  # what the simulated cloud bills
    ledger_usd: float  # the ledger after `kplan down`, run once the lease ran out
    alive: int
    alive_at_death: int = 0
    ends: tuple[str, ...] = ()  # why each instance ended, as the cloud says


def _run(root: Path, script: str, at: int | None, preempt: bool = True, **options: Any) -> Outcome:
    """One job; the launcher killed at its ``at``-th wait (None: never); ``preempt``: the
    first spot node is preempted 15 minutes in (and replaced)."""
    work = root / f"k{at}"
    work.mkdir()
    death = Death(at)
    clock = DyingClock(death)
    store = LeaseStorage(work / "store", clock, death)
    spec = _spec(script, **options)
    sim = LeaseSim(
        clock,
        store,
        boot_s=60.0,
        finish_at=clock.now() + 3 * 3600.0,  # longer than the budget pays for
        preempt_after=lambda s: 900.0 if preempt and s.name.endswith("-n1-r0") else None,
        lease_s=spec.timing.lease_period_s,
        death=death,
        renewals=store.renewals,
    )
    with StateDB.open(work / "kplan.db", clock=clock) as db:
        try:
            run_job(spec, Backend(sim, store), db, clock=clock, billing=AWS)
        except BaseException as err:  # the kill is what this test is about
            if not isinstance(err, Killed) and death.dead_at is None:
                raise
    if death.dead_at is None:
        ends = tuple(str(i.reason) for i in sim.query_instances(JOB))
        return Outcome(None, 0.0, sim.billed_usd(AWS), 0.0, len(sim.alive()), 0, ends)
    at_death = len(sim.alive())
    # the launcher is dead: time passes on the cloud alone, one lease and the polls
    clock.t = death.dead_at + outlives_s(spec)
    alive = len(sim.alive())
    ends = [sim._ended_at(s) for s in sim.instances.values()]
    lived = max((e[0] - death.dead_at for e in ends if e is not None), default=0.0)
    billed = sim.billed_usd(AWS)
    death.at = death.dead_at = None  # `kplan down` from another process, healthy database
    with StateDB.open(work / "kplan.db", clock=clock) as healthy:
        down_job(JOB, Backend(sim, store), healthy, clock, wait_launcher_s=0.0)
        ledger = healthy.spend(JOB)
    ends = tuple(str(i.reason) for i in sim.query_instances(JOB))
    return Outcome(clock.t, lived, billed, ledger, alive, at_death, ends)


def test_killing_the_launcher_at_every_check_leaves_nothing_alive_after_one_lease(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    clean = _run(folder, str(script), None)
    assert clean.alive == 0 and clean.billed_usd <= 1.0 + 1e-9  # the guard stopped it in budget
    spec = _spec(str(script))
    bound = worst_case_usd(spec)
    worst_billed = worst_ledger = worst_lived = 0.0
    runs = orphans = lapsed = capped = 0
    for at in range(0, 120, 3):  # every third check of a job of about 85 checks, and after
        out = _run(folder, str(script), at)
        if out.died_at is None:
            break
        runs += 1
        orphans += out.alive_at_death
        assert out.alive == 0, f"killed at wait {at}: {out.alive} instance(s) alive"
        lapsed += "lease expired" in out.ends
        capped += "hard stop" in out.ends and "lease expired" not in out.ends
        assert out.lived_after_s <= outlives_s(spec) + 1e-6, (at, out)
        assert out.billed_usd <= bound + 1e-9, (at, out)
        assert out.ledger_usd <= bound + 1e-9, (at, out)
        worst_billed = max(worst_billed, out.billed_usd)
        worst_ledger = max(worst_ledger, out.ledger_usd)
        worst_lived = max(worst_lived, out.lived_after_s)
    assert runs >= 10 and orphans >= runs  # the dead launchers left instances running
    # ... which their watchdogs ended, or their caps when the budget ran out first
    assert lapsed + capped == runs and lapsed > capped
    RESULTS["kill sweep"] = {
        "runs": runs,
        "instances_alive_at_death": orphans,
        "ended_by_lease": lapsed,
        "ended_by_cap": capped,
        "budget_usd": spec.budget_usd,
        "bound_usd": round(bound, 4),
        "worst_billed_usd": round(worst_billed, 4),
        "worst_ledger_usd": round(worst_ledger, 4),
        "worst_lived_after_death_s": worst_lived,
        "lease_s": spec.timing.lease_period_s,
    }
    print(f"hard stop kill sweep: {RESULTS['kill sweep']}")


def test_a_guard_that_never_stops_is_ended_by_the_caps(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher lives and renews its lease, but its guard never stops the job (a bug):
    the caps set at creation end every instance once the budget is spent (no replacement is
    allowed: a launcher that goes on launching is the guard's to stop, before each launch)."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")

    def never(self: Guard, *args: Any, **kwargs: Any) -> Decision:
        return Decision(False, None, 0.0, "never stops")

    monkeypatch.setattr(Guard, "check", never)
    out = _run(folder, str(script), None, preempt=False, max_replacements=0)
    assert out.alive == 0 and out.billed_usd > 0.95 and "hard stop" in out.ends, out
    # the cap is in whole minutes from boot: at most a minute and the boot over the budget
    assert out.billed_usd <= 1.0 + (60 + 60) / 3600 * 0.7 + 1e-9, out
    RESULTS["caps only"] = {"billed_usd": round(out.billed_usd, 4)}
    print(f"hard stop, caps only: {RESULTS['caps only']}")


FAKE_TORCHRUN = """#!/bin/sh
# stands in for `python -m kplan.launcher.noderun ...`: trains until SIGTERM, then checkpoints
# (`python -c ...`, the status writer, is the real python)
if [ "$1" = -c ]; then exec python3 "$@"; fi
trap 'echo checkpointed >> "$MARK"; exit 143' TERM
while :; do sleep 0.2; done
"""


def test_a_local_node_ends_its_worker_group_when_the_lease_lapses(tmp_path: Path) -> None:
    """The local node script itself, its lease shortened to 4 s (and polled every second):
    renewed, it trains on; once renewals stop, its watchdog sends the node SIGTERM, which goes
    to the workers (they checkpoint) and the node writes its status (143: a signal)."""
    from kplan.launcher.bootstrap import local_user_data, rendezvous

    fake = tmp_path / "python"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    spec = JobSpec.local(str(script), nodes=1, job_id="kp-lease-local", python=str(fake))
    text = local_user_data(spec, spec.nodes[0], "n0", rendezvous(spec, 0, None), tmp_path)
    period = f"-ge {int(spec.timing.lease_period_s)} ]"
    assert period in text and f'[ "$n" -ge {POLL_S} ]' in text
    text = text.replace(period, "-ge 4 ]").replace(f'[ "$n" -ge {POLL_S} ]', '[ "$n" -ge 1 ]')
    lease = tmp_path / spec.job_id / LEASE_KEY
    lease.parent.mkdir(parents=True)
    mark = tmp_path / "checkpointed"
    env = {**os.environ, "MARK": str(mark)}
    proc = subprocess.Popen(["sh", "-c", text], env=env)
    try:
        for i in range(16):  # renewed every half second for 8 s: twice the lease
            lease.write_text(f'{{"renewed_at": {i}}}')
            time.sleep(0.5)
            assert proc.poll() is None, "the node ended while its lease was renewed"
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert mark.read_text() == "checkpointed\n"
    status = tmp_path / spec.job_id / "status" / "node-0.json"
    assert '"exit_code": 143' in status.read_text()
