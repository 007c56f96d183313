"""The progress of a running job: the read side (kplan/launcher/progress.py), its views
(cli/render/live.py), ``kplan launch --json``'s event stream, and the live view of a real local
launch and of ``kplan status --watch`` in a terminal (tmux)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.cli.render.live import (
    JsonView,
    PlainView,
    Started,
    progress_line,
    progress_panel,
    training_text,
)
from kplan.launcher.lifecycle import JobOutcome
from kplan.launcher.progress import LastEvent, NodeState, Progress, ProgressTracker
from kplan.launcher.state import EventRecord, InstanceRecord, JobRecord, LedgerRow, StateDB
from kplan.launcher.storage import LocalStorage
from tests.launcher_fakes import fast_dir
from tests.test_provider_local import kill_leftovers

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = Path(sys.executable).with_name("kplan")
JOB = "kp-live-1"
T0 = 1_800_000_000.0


def _snapshot(**changes: object) -> Progress:
    base: dict[str, object] = {
        "job_id": JOB,
        "status": "running",
        "reason": None,
        "time": T0 + 95,
        "elapsed_s": 95.0,
        "nodes": (
            NodeState(0, "i-0aa", "running", "g4dn.xlarge", "spot", 0.1578),
            NodeState(1, "i-0bb", "pending", "g4dn.xlarge", "spot", 0.1578),
        ),
        "step": 412,
        "epoch": 1,
        "epochs": 3,
        "loss": 0.12345,
        "samples_per_s": 5120.4,
        "progress": 62.0,
        "target_progress": 100.0,
        "eta_s": 40.0,
        "spend_usd": 0.42,
        "budget_usd": 5.0,
        "predicted_cost_usd": 1.1,
        "predicted_hours": 0.5,
        "preemptions": 1,
        "last_event": LastEvent(T0 + 90, "recovered", "node 1 back on i-0bb after 41 s"),
    }
    base.update(changes)
    return Progress(**base)  # type: ignore[arg-type]


def _text(renderable: object, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


# --- rendering a fixed snapshot ---------------------------------------------------------------


def test_panel_shows_every_number_of_a_snapshot() -> None:
    text = _text(progress_panel(_snapshot()))
    assert "kp-live-1  running  elapsed 0:01:35 (predicted 0:30:00)  1 preemption(s)" in text
    assert "step 412  epoch 2/3  loss 0.1235  5,120 samples/s  ETA 0:00:40" in text
    assert "[###################-----------] 62% done" in text
    assert "spend $0.42 of $5.00 budget (predicted $1.10)" in text
    rows = [line for line in text.splitlines() if "g4dn.xlarge" in line]
    assert len(rows) == 2 and "i-0aa" in rows[0] and "running" in rows[0]
    assert "pending" in rows[1] and "0.1578" in rows[1]
    assert re.search(r"last event \d\d:\d\d:\d\d recovered: node 1 back on i-0bb after 41 s", text)


def test_panel_before_the_first_step_and_without_a_prediction() -> None:
    snap = _snapshot(
        step=None, epoch=None, loss=None, samples_per_s=None, progress=None, eta_s=None,
        predicted_cost_usd=None, predicted_hours=None, nodes=(), preemptions=0, last_event=None,
        spend_usd=0.0,
    )  # fmt: skip
    text = _text(progress_panel(snap))
    assert "training: no step yet" in text and "nodes: none yet" in text
    assert "spend $0.00 of $5.00 budget" in text and "predicted" not in text
    assert "% done" not in text and "preemption" not in text


def test_panel_keeps_a_hostile_event_message_inert() -> None:
    snap = _snapshot(last_event=LastEvent(T0, "lost", "[/bold] \x1b[2J gone"))
    text = _text(progress_panel(snap))  # rich markup in it would raise MarkupError
    assert "[/bold]  gone" in text and "\x1b" not in text


def test_many_nodes_are_counted_not_listed() -> None:
    nodes = tuple(NodeState(r, f"i-{r:03d}", "running", "p4d", "spot", 9.8) for r in range(20))
    text = _text(progress_panel(_snapshot(nodes=nodes)))
    assert "i-007" in text and "i-008" not in text and "... and 12 more node(s)" in text


def test_plain_line_and_training_text() -> None:
    line = progress_line(_snapshot())
    assert "progress     running; step 412  epoch 2/3" in line
    assert "spent $0.42 of $5.00 budget (predicted $1.10); nodes 2: 1 running, 1 pending" in line
    assert training_text(_snapshot(epochs=None)).startswith("step 412  epoch 2  loss")


def test_plain_view_prints_progress_at_its_interval_and_on_status_changes() -> None:
    out = io.StringIO()
    view = PlainView(out, interval=30.0)
    view.on_progress(_snapshot(step=None))  # nothing to say before the first step
    view.on_progress(_snapshot(time=T0, step=1))
    view.on_progress(_snapshot(time=T0 + 10, step=50))  # within the interval
    view.on_progress(_snapshot(time=T0 + 31, step=150))
    view.on_progress(_snapshot(time=T0 + 32, step=151, status="stopping"))  # status changed
    view.on_event(EventRecord(1, JOB, T0 + 33, "preempted", "node 1: i-0bb preempted", None))
    lines = out.getvalue().splitlines()
    assert [re.search(r"step (\d+)", x).group(1) for x in lines[:3]] == ["1", "150", "151"]  # type: ignore[union-attr]
    assert "stopping" in lines[2] and lines[3].endswith("preempted    node 1: i-0bb preempted")
    assert len(lines) == 4


def test_json_view_emits_node_changes_once_and_progress_when_it_moves() -> None:
    out = io.StringIO()
    view = JsonView(out, interval=5.0)
    view.start(Started(JOB, "aws", "us-east-1", "train.py", [], 2, 2, 0.3156, 5.0, None))
    view.on_progress(_snapshot(time=T0, step=1))
    view.on_progress(_snapshot(time=T0 + 1, step=2))  # same nodes; progress within 5 s
    moved = (NodeState(0, "i-0aa", "running", "g4dn.xlarge", "spot", 0.1578),
             NodeState(1, "i-0bb", "running", "g4dn.xlarge", "spot", 0.1578))  # fmt: skip
    view.on_progress(_snapshot(time=T0 + 6, step=3, nodes=moved))
    data = {"instance": "i-0bb", "node_rank": 1, "reason": "spot interruption"}
    view.on_event(EventRecord(9, JOB, T0 + 7, "preempted", "node 1: i-0bb preempted", data))
    view.on_event(EventRecord(10, JOB, T0 + 8, "launch", "node 1: i-0cc", None))
    view.finished(JobOutcome(JOB, "succeeded", None, 0.5, 60.0, 0))
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    kinds = [d["event"] for d in docs]
    assert kinds == [
        "started", "node", "node", "progress", "node", "progress", "preempted", "launcher",
        "finished",
    ]  # fmt: skip
    assert docs[1]["state"] == "running" and docs[2]["state"] == "pending"
    assert docs[4] == {**docs[4], "node_rank": 1, "state": "running"}
    assert docs[3]["step"] == 1 and docs[5]["step"] == 3 and docs[5]["loss"] == 0.12345
    assert docs[5]["fraction"] == 0.62 and "nodes" not in docs[5]
    assert docs[6]["node_rank"] == 1 and docs[6]["reason"] == "spot interruption"
    assert docs[7] == {**docs[7], "kind": "launch", "message": "node 1: i-0cc"}
    assert docs[8]["status"] == "succeeded"


# --- the read side: a real state database and metrics files -----------------------------------


def _job(cloud: str = "aws") -> JobRecord:
    return JobRecord(
        id=JOB, status="running", reason=None, cloud=cloud, region="us-east-1",
        spec={"nodes": [{"gpus": 1}, {"gpus": 1}]}, plan=None, budget_usd=5.0, deadline_h=None,
        predicted_hours=0.5, predicted_cost_usd=1.1, predicted_cost_p90_usd=1.4,
        launcher_pid=None, stop_requested=None, created_at=T0, updated_at=T0,
    )  # fmt: skip


def _instance(iid: str, rank: int, state: str, launched: float) -> InstanceRecord:
    return InstanceRecord(
        iid, JOB, f"{JOB}-n{rank}", rank, "aws", "us-east-1", "us-east-1a", "g4dn.xlarge",
        "spot", 3.6, state, launched,
    )  # fmt: skip


def _write_metrics(storage: LocalStorage, records: list[dict[str, object]], rank: int = 0) -> None:
    key = f"{JOB}/metrics/rank-{rank}.jsonl"
    old = storage.get_bytes(key) or b""
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    storage.put_bytes(key, old + lines)


def _step(
    step: int, t: float, progress: float, epoch: int = 0, **more: object
) -> dict[str, object]:
    return {"step": step, "rank": 0, "world_size": 2, "global_batch": 256, "loss": 1.0 / (step + 1),
            "time": t, "epoch": epoch, "progress": progress, "step_time": 0.5, **more}  # fmt: skip


def test_tracker_reads_steps_rates_eta_and_spend(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "jobs")
    with StateDB.open(tmp_path / "kplan.db") as db:
        db.create_job(_job())
        db.add_instance(_instance("i-1", 0, "terminated", T0))  # rank 0's first instance
        db.add_instance(_instance("i-2", 0, "running", T0 + 10))
        db.add_instance(_instance("i-3", 1, "running", T0 + 10))
        # i-1 closed at $0.06 (60 s billed); i-2 and i-3 accrued to T0 + 40 (30 s each)
        db.put_ledger(LedgerRow(JOB, "i-1", T0, T0 + 9, 60.0, 0.06, True))
        db.put_ledger(LedgerRow(JOB, "i-2", T0 + 10, T0 + 40, 60.0, 0.06, False))
        db.put_ledger(LedgerRow(JOB, "i-3", T0 + 10, T0 + 40, 60.0, 0.06, False))
        db.add_event(JOB, T0 + 9, "preempted", "node 0: i-1 preempted")
        db.add_event(JOB, T0 + 12, "recovered", "node 0 back on i-2 after 3 s")
        tracker = ProgressTracker(JOB, storage)
        assert tracker.snapshot(db, T0 + 20).step is None  # type: ignore[union-attr]
        _write_metrics(storage, [
            {"event": "epochs", "rank": 0, "total": 3, "target_progress": 300.0},
            *[_step(s, T0 + 20 + s, float(s + 1)) for s in range(10)],
        ])  # fmt: skip
        _write_metrics(
            storage, [{**_step(99, T0 + 1, 99.0), "rank": 1}], rank=1
        )  # other ranks: not read
        snap = tracker.snapshot(db, T0 + 100)
    assert snap is not None
    assert (snap.step, snap.epoch, snap.epochs, snap.loss) == (9, 0, 3, 0.1)
    # 9 steps of 256 samples in the 9 s between the first and the last record of the window
    assert snap.samples_per_s == pytest.approx(256.0)
    # 1 base-batch step per second, 290 left
    assert snap.eta_s == pytest.approx(290.0) and snap.fraction == pytest.approx(10 / 300)
    assert [(n.rank, n.instance, n.state) for n in snap.nodes] == [
        (0, "i-2", "running"), (1, "i-3", "running"),
    ]  # fmt: skip
    # closed row as written; open rows billed to now (90 s each at $3.60/h = $0.09)
    assert snap.spend_usd == pytest.approx(0.06 + 0.09 + 0.09)
    assert snap.preemptions == 1 and snap.last_event is not None
    assert snap.last_event.kind == "recovered"
    assert (snap.predicted_cost_usd, snap.budget_usd) == (1.1, 5.0)


def test_tracker_window_restarts_after_a_resume(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "jobs")
    with StateDB.open(tmp_path / "kplan.db") as db:
        db.create_job(_job())
        tracker = ProgressTracker(JOB, storage)
        _write_metrics(storage, [_step(s, T0 + s, float(s)) for s in range(20)])
        tracker.snapshot(db, T0 + 20)
        # a restart resumed from step 10 after a 100 s outage: the rate ignores the gap
        _write_metrics(
            storage, [_step(s, T0 + 100 + (s - 10) * 2, float(s)) for s in range(10, 15)]
        )
        snap = tracker.snapshot(db, T0 + 110)
    assert snap is not None and snap.step == 14
    assert snap.samples_per_s == pytest.approx(128.0)  # 256 samples per 2 s


def test_tracker_after_the_job_ended_uses_the_ledger_as_written(tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "kplan.db") as db:
        db.create_job(_job())
        db.add_instance(_instance("i-2", 0, "running", T0))
        db.put_ledger(LedgerRow(JOB, "i-2", T0, T0 + 60, 60.0, 0.06, False))
        db.set_status(JOB, "succeeded", T0 + 61, "done")
        snap = ProgressTracker(JOB, None).snapshot(db, T0 + 5000)
        assert ProgressTracker("kp-none-1", None).snapshot(db, T0) is None
    assert snap is not None and snap.spend_usd == pytest.approx(0.06)
    assert snap.elapsed_s == pytest.approx(61.0) and snap.eta_s is None


class _Recorder:
    def __init__(self) -> None:
        self.snaps: list[Progress] = []

    def start(self, info: dict[str, object]) -> None:
        pass

    def on_event(self, event: EventRecord) -> None:
        pass

    def on_progress(self, p: Progress) -> None:
        self.snaps.append(p)

    def close(self) -> None:
        pass


def test_watcher_feeds_snapshots_from_its_own_thread_and_a_last_one_at_the_end(
    tmp_path: Path,
) -> None:
    from kplan.cli.render.live import Watcher

    storage = LocalStorage(tmp_path / "jobs")
    view = _Recorder()
    with StateDB.open(tmp_path / "kplan.db") as db:
        with Watcher(JOB, db.path, storage, view, refresh_s=0.02):
            time.sleep(0.2)  # no job row yet: nothing to show
            assert view.snaps == []
            db.create_job(_job("local"))
            _write_metrics(storage, [_step(0, T0, 1.0), _step(1, T0 + 1, 2.0)])
            deadline = time.monotonic() + 10
            while not any(p.step == 1 for p in view.snaps) and time.monotonic() < deadline:
                time.sleep(0.02)
            db.set_status(JOB, "succeeded", time.time(), "every node finished")
        final = view.snaps[-1]
    assert any(p.step == 1 and p.status == "running" for p in view.snaps)
    assert final.status == "succeeded" and final.step == 1  # the snapshot taken at exit


# --- kplan launch --json: the event stream of a real local launch -----------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = fast_dir(tmp_path, "live")
    monkeypatch.setenv("KPLAN_HOME", str(folder))
    yield folder
    left = kill_leftovers(folder)
    shutil.rmtree(folder, ignore_errors=True)
    assert not left, f"the test left processes behind: {sorted(left)}"


@pytest.mark.slow
def test_launch_json_streams_one_event_per_line(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = ROOT / "kplan" / "examples" / "mlp_regression.py"
    res = CliRunner().invoke(
        app,
        ["launch", str(script), "--budget", "0", "--nodes", "2", "--check-interval", "0.5",
         "--json", "--", "--epochs", "3", "--samples", "20000"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    docs = [json.loads(line) for line in res.output.splitlines()]  # every line is one object
    kinds = [d["event"] for d in docs]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert docs[0]["nodes"] == 2 and docs[0]["workers"] == 2 and docs[0]["cloud"] == "local"
    states = {(d["node_rank"], d["state"]) for d in docs if d["event"] == "node"}
    assert {(0, "running"), (1, "running"), (0, "terminated"), (1, "terminated")} <= states
    launched = [d for d in docs if d["event"] == "launcher" and d["kind"] == "launch"]
    assert len(launched) == 2
    steps = [d for d in docs if d["event"] == "progress"]
    assert steps and all(d["step"] >= 0 and d["epochs"] == 3 for d in steps)
    assert all(d["loss"] is not None for d in steps)
    assert docs[-1]["status"] == "succeeded" and docs[-1]["spend_usd"] == 0.0
    assert docs[-1]["job_id"] == docs[0]["job_id"]


@pytest.mark.slow
def test_launch_quiet_prints_only_the_summary_and_plain_prints_events(
    home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    args = ["launch", str(script), "--budget", "0", "--check-interval", "0.5"]
    quiet = CliRunner().invoke(app, [*args, "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert re.fullmatch(r"job kp-\S+: succeeded \(every node finished\); spent \$0\.00 in .*\n",
                        quiet.output)  # fmt: skip
    plain = CliRunner().invoke(app, args)  # not a terminal: plain lines
    assert plain.exit_code == 0, plain.output
    note, *lines = plain.output.splitlines()
    assert note.startswith("note: plain script:")  # said first: train.py has no kplan runtime
    assert re.match(r"\d\d:\d\d:\d\d created +job kp-", lines[0])
    assert any(re.match(r"\d\d:\d\d:\d\d launch +node 0: ", x) for x in lines)
    assert "\x1b" not in plain.output and "╭" not in plain.output  # no panel, no escapes
    assert lines[-1].startswith("job kp-") and ": succeeded" in lines[-1]


def test_choose_view() -> None:
    from kplan.cli.render.live import LiveView, QuietView, choose_view

    assert isinstance(choose_view(as_json=True, quiet=True, tty=True), JsonView)
    assert isinstance(choose_view(as_json=False, quiet=True, tty=True), QuietView)
    assert isinstance(choose_view(as_json=False, quiet=False, tty=True), LiveView)
    assert isinstance(choose_view(as_json=False, quiet=False, tty=False), PlainView)


# --- in a terminal: kplan launch's live view and kplan status --watch (tmux) ------------------


class Tmux:
    """A private tmux server (its own socket) whose sessions run commands in a pseudo-terminal."""

    def __init__(self) -> None:
        self.socket = f"kplan-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.path: Path | None = None  # the server's socket file, removed by close()

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def start(self, name: str, command: str) -> None:
        self("new-session", "-d", "-s", name, "-x", "100", "-y", "30", command)
        if self.path is None:
            self.path = Path(self("display-message", "-p", "#{socket_path}").strip())

    def screen(self, name: str) -> str:
        return self("capture-pane", "-p", "-t", name)

    def wait_for(self, name: str, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.search(pattern, self.screen(name))
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} after {timeout_s} s:\n{self.screen(name)}")
            time.sleep(0.3)

    def close(self) -> None:
        cmd = ["tmux", "-L", self.socket, "kill-server"]
        subprocess.run(cmd, check=False, capture_output=True, timeout=30)
        if self.path is not None:
            self.path.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_view_and_status_watch_in_a_terminal(home: Path) -> None:
    """A real local launch in a 100x30 pseudo-terminal: the panel shows the step and the spend
    and updates them in place; `kplan status --watch` in another terminal redraws one view in
    place and exits 0 when the job ends."""
    job = "kp-live-tmux"
    env = f"KPLAN_HOME={home} OMP_NUM_THREADS=1"
    helps = subprocess.run([KPLAN, "launch", "--help"], check=True, capture_output=True, text=True)
    price = ["--price", "36"] if "--price" in helps.stdout else []  # $0.01 per second
    launch = [str(KPLAN), "launch", str(SCRIPT), "--budget", "50",
              "--nodes", "2", "--check-interval", "0.5", "--job-id", job, *price,
              "--", "--epochs", "12", "--samples", "40000"]  # fmt: skip
    done = "; echo KPLAN-EXIT=$?; sleep 600"  # keep the pane to read the end
    tmux = Tmux()
    try:
        tmux.start("launch", f"cd {ROOT} && env {env} {' '.join(launch)}{done}")
        first = tmux.wait_for("launch", r"step (\d+) .*\n.*\n?.*spend (\$[\d.,]+) of", 120)
        tmux.start("watch", f"env {env} {KPLAN} status {job} --watch --interval 0.5{done}")
        time.sleep(3.0)
        second = tmux.wait_for("launch", r"step (\d+) .*\n.*\n?.*spend (\$[\d.,]+) of", 30)
        assert int(second.group(1)) > int(first.group(1)), tmux.screen("launch")
        if price:
            assert second.group(2) != first.group(2), tmux.screen("launch")
        screen = tmux.screen("launch")
        assert screen.count("kplan launch") == 1  # one panel, redrawn in place
        assert re.search(r"node +instance +state", screen) and "running" in screen
        assert "samples/s" in screen and "ETA" in screen and "budget" in screen
        watch1 = tmux.wait_for("watch", r"step (\d+)", 30)
        time.sleep(2.0)
        watch2 = tmux.wait_for("watch", r"step (\d+)", 30)
        assert int(watch2.group(1)) > int(watch1.group(1))
        assert tmux.screen("watch").count("kplan status") == 1  # redrawn, not appended
        end = tmux.wait_for("launch", r"KPLAN-EXIT=(\d+)", 240)
        assert end.group(1) == "0", tmux.screen("launch")
        assert re.search(rf"job {job}: succeeded", tmux.screen("launch"))
        watched = tmux.wait_for("watch", r"KPLAN-EXIT=(\d+)", 30)
        assert watched.group(1) == "0", tmux.screen("watch")
    finally:
        with contextlib.suppress(Exception):
            tmux("send-keys", "-t", "launch", "C-c")  # the launcher tears down on SIGINT
            tmux.wait_for("launch", r"KPLAN-EXIT=", 60)
        tmux.close()


def test_local_storage_reads_a_growing_file_from_an_offset(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "jobs")
    assert storage.read_from(f"{JOB}/metrics/rank-0.jsonl", 0) == b""  # not written yet
    _write_metrics(storage, [_step(0, T0, 1.0)])
    first = storage.read_from(f"{JOB}/metrics/rank-0.jsonl", 0)
    _write_metrics(storage, [_step(1, T0 + 1, 2.0)])
    rest = storage.read_from(f"{JOB}/metrics/rank-0.jsonl", len(first))
    assert json.loads(first)["step"] == 0 and json.loads(rest)["step"] == 1
    assert storage.read_from(f"{JOB}/metrics/rank-0.jsonl", 10**6) == b""
    with pytest.raises(ValueError, match="escapes the storage root"):
        storage.read_from("../outside", 0)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_closing_the_terminal_stops_the_job_with_its_teardown(home: Path) -> None:
    """SIGHUP (the terminal closed) is Ctrl-C for the launcher: the job ends `cancelled`, every
    worker is gone, the launcher records it; nothing is left for `kplan down`."""
    from tests.test_provider_local import instance_pids

    job = "kp-live-hup"
    launch = [str(KPLAN), "launch", str(SCRIPT), "--budget", "0",
              "--nodes", "2", "--check-interval", "0.5", "--job-id", job,
              "--", "--epochs", "50", "--samples", "40000"]  # fmt: skip
    tmux = Tmux()
    try:
        tmux.start(
            "launch", f"cd {ROOT} && env KPLAN_HOME={home} OMP_NUM_THREADS=1 {' '.join(launch)}"
        )
        tmux.wait_for("launch", r"step \d+ ", 120)
    finally:
        tmux.close()  # the terminal goes away: SIGHUP to the launcher
    deadline = time.monotonic() + 60
    while True:
        with StateDB.open(home / "kplan.db", readonly=True) as db:
            rec = db.job(job)
        assert rec is not None
        if rec.terminal or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (rec.status, rec.reason) == ("cancelled", "interrupted")
    assert not instance_pids(home)
