"""The local provider with real process groups: start, query, terminate, chaos, restarts.

Every test checks that no process of its instances is left (the ``home`` fixture kills any
leftover and fails the test if there was one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kplan.core.errors import CloudError, InputError
from kplan.launcher.provider import ClusterSpec, Instance, InstanceSpec
from kplan.launcher.providers import ProviderSettings, get_backend
from kplan.launcher.providers import local_procs as procs
from kplan.launcher.providers.local import LocalProvider, create, job_of
from kplan.launcher.providers.local_chaos import ChaosConfig
from kplan.launcher.storage import LocalStorage

JOB = "kp-test-0001"
# Stand-in for torchrun's workers: a child in a session of its own, out of the leader's group.
WORKERS = "setsid sleep 300 & sleep 300 & "


def instance_pids(home: Path) -> dict[int, int]:
    """Every live process of every local instance under ``home`` (supervisors included)."""
    found: dict[int, int] = {}
    for state_file in (home / "local").glob("*/state.json"):
        for entry in json.loads(state_file.read_text())["instances"]:
            found.update(procs.marked(f"{entry['id']}:{entry['token']}"))
            if procs.alive(entry["agent_pid"], entry["agent_ticks"]):
                found[entry["agent_pid"]] = entry["agent_ticks"]
    return found


def kill_leftovers(home: Path) -> dict[int, int]:
    """SIGKILL whatever of ``home``'s instances still runs; returns what was found alive."""
    left = instance_pids(home)
    if left:
        procs.kill_all(lambda: instance_pids(home))
    assert not instance_pids(home), "processes survived SIGKILL"
    return left


def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    left = kill_leftovers(tmp_path)
    assert not left, f"the test left processes behind: {sorted(left)}"


def cluster(job: str = JOB) -> ClusterSpec:
    return ClusterSpec(job_id=job, cloud="local", region="local")


def spec(user_data: str, rank: int = 0, job: str = JOB, **env: str) -> InstanceSpec:
    return InstanceSpec(
        job_id=job,
        name=f"{job}-n{rank}-r0",
        cloud="local",
        region="local",
        zone="local",
        instance_type="local",
        market="spot",
        node_rank=rank,
        user_data=user_data,
        env=env,
    )


def state_of(provider: LocalProvider, instance_id: str) -> Instance:
    (found,) = [
        i for i in provider.query_instances(job_of(instance_id) or "") if i.id == instance_id
    ]
    return found


def wait_state(
    provider: LocalProvider, instance_id: str, states: set[str], timeout_s: float = 10
) -> Instance:
    until(lambda: state_of(provider, instance_id).state in states, timeout_s, f"{states}")
    return state_of(provider, instance_id)


def test_runs_groups_to_their_exit(home: Path) -> None:
    provider = LocalProvider(home)
    provider.prepare(cluster())
    out = home / "out.txt"
    started = provider.run_instances(
        cluster(),
        [
            spec(f'echo "$FOO $KPLAN_LOCAL_INSTANCE" > {out}; echo hello', 0, FOO="bar"),
            spec("exit 3", 1),
        ],
    )
    assert [i.state for i in started] == ["pending", "pending"]
    assert [i.id for i in started] == [f"local-{JOB}-0", f"local-{JOB}-1"]
    assert all(i.private_ip == "127.0.0.1" and i.launched_at for i in started)
    provider.wait_instances([i.id for i in started], timeout_s=10)
    done = wait_state(provider, started[0].id, {"terminated"})
    failed = wait_state(provider, started[1].id, {"terminated"})
    assert (done.reason, failed.reason) == ("completed", "exited 3")
    foo, marker = out.read_text().split()
    assert foo == "bar" and marker.startswith(f"{started[0].id}:")
    assert provider.log_path(started[0].id).read_text() == "hello\n"
    assert [i.node_rank for i in provider.query_instances(JOB)] == [0, 1]
    assert provider.query_instances("kp-no-such-job") == []


def test_pending_until_booted(home: Path) -> None:
    provider = LocalProvider(home, boot_delay_s=1.0)
    (inst,) = provider.run_instances(cluster(), [spec("sleep 300")])
    with pytest.raises(CloudError, match=r"still pending after 0\.2 s"):
        provider.wait_instances([inst.id], timeout_s=0.2)
    (running,) = provider.wait_instances([inst.id], timeout_s=10)
    assert running.state == "running"
    with pytest.raises(CloudError, match="unknown local instances: local-kp-x-3"):
        provider.wait_instances(["local-kp-x-3"], timeout_s=1)
    provider.terminate_instances([inst.id])
    assert wait_state(provider, inst.id, {"terminated"}).reason == "terminated"


def test_terminate_ends_the_whole_tree_and_is_idempotent(home: Path) -> None:
    provider = LocalProvider(home, grace_s=5)
    (inst,) = provider.run_instances(cluster(), [spec(WORKERS + "wait")])
    provider.wait_instances([inst.id], timeout_s=10)
    until(lambda: len(instance_pids(home)) >= 4, 5, "supervisor, shell and two sleeps")
    tree = instance_pids(home)
    provider.terminate_instances([inst.id])  # asks, does not wait (bench/failfast.py times it)
    ended = wait_state(provider, inst.id, {"terminated"})
    assert ended.reason == "terminated"
    assert not procs.living(tree)
    provider.terminate_instances([inst.id, "local-kp-unknown-7", "i-0123456789", "garbage"])
    assert state_of(provider, inst.id).state == "terminated"


def test_terminate_sigterms_the_leader_then_kills_after_grace(home: Path) -> None:
    provider = LocalProvider(home, grace_s=1.0)
    mark = home / "got-term"
    stubborn = f"trap 'touch {mark}' TERM; {WORKERS} while true; do wait; done"
    (inst,) = provider.run_instances(cluster(), [spec(stubborn)])
    provider.wait_instances([inst.id], timeout_s=10)
    until(lambda: len(instance_pids(home)) >= 4, 5, "the tree")
    t0 = time.monotonic()
    provider.terminate_instances([inst.id])
    assert wait_state(provider, inst.id, {"stopping"}, 2).reason == "terminated"
    wait_state(provider, inst.id, {"terminated"})
    assert time.monotonic() - t0 > 0.9  # not killed before the grace (how soon after: bench)
    assert mark.exists()


def test_a_new_process_finds_and_ends_instances_of_a_killed_launcher(home: Path) -> None:
    launcher = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from kplan.launcher.provider import ClusterSpec, InstanceSpec\n"
        "from kplan.launcher.providers.local import LocalProvider\n"
        f"p = LocalProvider(Path({str(home)!r}))\n"
        f"c = ClusterSpec({JOB!r}, 'local', 'local')\n"
        f"s = InstanceSpec({JOB!r}, 'n0', 'local', 'local', 'local', 'local', 'spot', 0,"
        f" {WORKERS + 'wait'!r})\n"
        "print(p.run_instances(c, [s])[0].id, flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        instance_id = proc.stdout.readline().strip()
        fresh = LocalProvider(home)
        wait_state(fresh, instance_id, {"running"})
        until(lambda: len(instance_pids(home)) >= 4, 5, "the tree")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the launcher
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    tree = instance_pids(home)
    again = LocalProvider(home)
    assert state_of(again, instance_id).state == "running"
    again.terminate_instances([instance_id])
    assert wait_state(again, instance_id, {"terminated"}).reason == "terminated"
    assert not procs.living(tree)


def test_an_instance_whose_supervisor_died_is_still_found_and_ended(home: Path) -> None:
    provider = LocalProvider(home, grace_s=0.5)
    (inst,) = provider.run_instances(cluster(), [spec("trap '' TERM; " + WORKERS + "wait")])
    provider.wait_instances([inst.id], timeout_s=10)
    until(lambda: len(instance_pids(home)) >= 4, 5, "the tree")
    entry = json.loads((home / "local" / JOB / "state.json").read_text())["instances"][0]
    os.kill(entry["agent_pid"], signal.SIGKILL)
    until(lambda: not procs.alive(entry["agent_pid"], entry["agent_ticks"]), 5, "the supervisor")
    assert state_of(provider, inst.id).state == "running"  # the workload still runs
    tree = instance_pids(home)
    provider.terminate_instances([inst.id])  # nobody else will: this call ends them
    assert not procs.living(tree)
    assert state_of(LocalProvider(home), inst.id).reason == "terminated"

    (lone,) = provider.run_instances(cluster(), [spec("sleep 300")])
    provider.wait_instances([lone.id], timeout_s=10)
    for pid, ticks in instance_pids(home).items():  # everything dies at once: a lost machine
        procs.signal_all({pid: ticks}, signal.SIGKILL)
    assert wait_state(provider, lone.id, {"terminated"}).reason == "lost"


def test_chaos_gives_a_notice_then_kills_the_group(home: Path) -> None:
    chaos = ChaosConfig(at_s=(0.3,), notice_s=20.0, notice_factor=0.05)  # 1 s notice
    provider = LocalProvider(home, chaos=chaos)
    mark = home / "checkpointed"
    ignores_term = f"trap 'touch {mark}' TERM; {WORKERS} while true; do wait; done"
    (inst,) = provider.run_instances(cluster(), [spec(ignores_term)])
    until(lambda: len(instance_pids(home)) >= 4, 5, "the tree")
    tree = instance_pids(home)
    noticed = wait_state(provider, inst.id, {"stopping", "preempted"})
    assert (noticed.state, noticed.reason) == ("stopping", "spot interruption")
    t0 = time.monotonic()
    gone = wait_state(provider, inst.id, {"preempted"})
    assert gone.reason == "spot interruption"
    assert time.monotonic() - t0 > 0.5  # the group had its notice before the kill
    assert mark.exists()  # the notice reached the bootstrap
    assert not procs.living(tree)


def test_chaos_without_notice_kills_at_once(home: Path) -> None:
    provider = LocalProvider(home, chaos=ChaosConfig(at_s=(0.2,), notice_factor=0))
    mark = home / "checkpointed"
    (inst,) = provider.run_instances(cluster(), [spec(f"trap 'touch {mark}' TERM; sleep 300")])
    assert wait_state(provider, inst.id, {"preempted"}).reason == "spot interruption"
    assert not mark.exists()


def test_chaos_targets_a_node_and_respects_the_cap(home: Path) -> None:
    targeted = ChaosConfig(at_s=(0.2,), targets=(1,), notice_factor=0)
    provider = LocalProvider(home, chaos=targeted)
    first = provider.run_instances(cluster(), [spec("sleep 300", 0), spec("sleep 300", 1)])
    wait_state(provider, first[1].id, {"preempted"})
    time.sleep(0.7)  # past any stagger: the event is spent, node 0 keeps running
    assert state_of(provider, first[0].id).state == "running"
    provider.terminate_instances([first[0].id])
    wait_state(provider, first[0].id, {"terminated"})

    storm = ChaosConfig(rate_per_hour=36000.0, max_preemptions=1, notice_factor=0, seed=3)
    job = "kp-test-storm"
    stormy = LocalProvider(home, chaos=storm)
    pair = stormy.run_instances(cluster(job), [spec("sleep 300", r, job) for r in (0, 1)])
    until(lambda: any(i.state == "preempted" for i in stormy.query_instances(job)), 10, "one")
    time.sleep(1.0)  # mean lifetime 0.1 s: the other would be hit by now without the cap
    states = sorted(i.state for i in stormy.query_instances(job))
    assert states == ["preempted", "running"]
    stormy.terminate_instances([i.id for i in pair])
    gone = ("terminated", "preempted")
    until(lambda: all(i.state in gone for i in stormy.query_instances(job)), 10, "the end")


def test_preempt_on_demand_from_another_provider_object(home: Path) -> None:
    provider = LocalProvider(home)
    (inst,) = provider.run_instances(cluster(), [spec(WORKERS + "wait")])
    provider.wait_instances([inst.id], timeout_s=10)
    until(lambda: len(instance_pids(home)) >= 4, 5, "the tree")
    tree = instance_pids(home)
    other = LocalProvider(home)
    assert other.preempt(inst.id, notice_s=0)
    assert wait_state(other, inst.id, {"preempted"}).reason == "spot interruption"
    assert not procs.living(tree)
    assert not other.preempt(inst.id, notice_s=0)
    assert not other.preempt(f"local-{JOB}-99")
    with pytest.raises(InputError, match="notice_s"):
        other.preempt(inst.id, notice_s=-1)


def test_factory_reads_chaos_from_the_environment(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KPLAN_LOCAL_CHAOS", '{"at_s": [30, 60], "notice_factor": 0.1}')
    backend = get_backend("local", ProviderSettings(home))
    assert isinstance(backend.provider, LocalProvider)
    assert backend.provider.chaos == ChaosConfig(at_s=(30, 60), notice_factor=0.1)
    assert isinstance(backend.storage, LocalStorage)
    assert backend.storage.root == home / "jobs"
    monkeypatch.setenv("KPLAN_LOCAL_CHAOS", "{not json")
    with pytest.raises(InputError, match=r"chaos: not JSON"):
        create(ProviderSettings(home))
    monkeypatch.delenv("KPLAN_LOCAL_CHAOS")
    assert create(ProviderSettings(home)).provider.chaos is None  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="no region 'us-east-1'"):
        create(ProviderSettings(home, region="us-east-1"))
    with pytest.raises(InputError, match="cannot use storage 's3://b/p'"):
        create(ProviderSettings(home, storage_uri="s3://b/p"))


def test_bad_requests_are_refused(home: Path) -> None:
    provider = LocalProvider(home)
    with pytest.raises(InputError, match="'aws' given to the local provider"):
        provider.prepare(ClusterSpec(JOB, "aws", "us-east-1"))
    with pytest.raises(InputError, match="not usable as a folder name"):
        provider.prepare(cluster("../escape"))
    with pytest.raises(InputError, match="empty user_data"):
        provider.run_instances(cluster(), [spec("  ")])
    with pytest.raises(InputError, match="names repeat"):
        provider.run_instances(cluster(), [spec("true"), spec("true")])
    with pytest.raises(InputError, match="is for job 'other'"):
        provider.run_instances(cluster(), [spec("true", job="other")])
    with pytest.raises(InputError, match="grace_s=-1"):
        LocalProvider(home, grace_s=-1)
    assert provider.query_instances(JOB) == []  # nothing was started


def test_cleanup_refuses_while_running_then_keeps_the_history(home: Path) -> None:
    provider = LocalProvider(home, chaos=ChaosConfig(at_s=(300,)))
    provider.prepare(cluster())
    (inst,) = provider.run_instances(cluster(), [spec("sleep 300")])
    provider.wait_instances([inst.id], timeout_s=10)
    with pytest.raises(CloudError, match=f"job {JOB} still run: {inst.id}") as err:
        provider.cleanup(cluster())
    assert err.value.hint == f"end them first: kplan down {JOB}"
    provider.terminate_instances([inst.id])
    wait_state(provider, inst.id, {"terminated"})
    provider.cleanup(cluster())
    folder = home / "local" / JOB / inst.id
    assert sorted(p.name for p in folder.iterdir()) == ["exit.json", "output.log"]
    assert state_of(provider, inst.id).reason == "terminated"
    provider.cleanup(cluster())  # again: nothing to do
