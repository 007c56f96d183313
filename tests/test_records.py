"""The metrics stream's typed records (kplan/core/records.py): what the runtime writes reads back
the same, bad values are refused with one line, unknown keys are ignored, old records read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kplan.core import records
from kplan.core.records import (
    STEP_KEYS,
    EpochsEvent,
    PolicyEvent,
    RecordError,
    StepRecord,
    parse,
    parse_lenient,
)
from kplan.runtime.metrics import MetricsWriter, read_records


def test_a_step_record_round_trips_and_keeps_the_keys_every_record_has() -> None:
    rec = StepRecord(
        step=3, rank=1, world_size=2, local_batch=8, global_batch=16, compute_time=0.1,
        sync_time=0.02, step_time=0.12, loss=1.5, time=10.0, collective=("ag",),
        compression="topk:0.01:ag", bytes_sent=400.0,
    )  # fmt: skip
    doc = rec.to_dict()
    assert set(STEP_KEYS) <= set(doc) and doc["collective"] == ["ag"]
    assert "phase" not in doc and "synced" not in doc  # the optional ones only where they apply
    assert StepRecord.from_dict(json.loads(json.dumps(doc))) == rec


def test_every_event_kind_round_trips() -> None:
    for kind, cls in records.EVENTS.items():
        ev = records.event(kind, step=4) if "step" in cls.__dataclass_fields__ else cls()
        back = parse(json.loads(json.dumps(ev.to_dict())))
        assert back == ev and kind == back.KIND


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"step": 1, "global_batch": 0}, "'global_batch' is 0, below 1"),
        ({"step": 1, "local_batch": -2}, "'local_batch' is -2, below 1"),
        ({"step": -1}, "'step' is -1, below 0"),
        ({"step": "3"}, "'step' is '3', not an integer"),
        ({"step": 1, "loss": "low"}, "'loss' is 'low', not a finite number"),
        ({"step": 1, "step_time": True}, "'step_time' is True, not a finite number"),
        ({"step": 1, "collective": "ag"}, "'collective' is 'ag', not a list"),
        ({"loss": 1.0}, "no 'step'"),
        ({"event": "bogus"}, "unknown event kind 'bogus'"),
        ({"event": "epochs", "total": 1.5}, "'total' is 1.5, not an integer"),
        ([1, 2], "not an object"),
    ],
)
def test_bad_records_are_refused_with_one_line(raw: object, match: str) -> None:
    with pytest.raises(RecordError, match=match) as err:
        parse(raw)
    assert "\n" not in str(err.value) and err.value.hint


def test_unknown_keys_are_ignored_and_non_finite_numbers_read_as_null() -> None:
    rec = parse({"step": 2, "loss": float("nan"), "from_a_newer_runtime": {"x": 1}})
    assert rec == StepRecord(step=2, loss=None)
    ev = parse({"event": "epochs", "rank": 0, "target_progress": 500.0, "base_batch": 32})
    assert ev == EpochsEvent(target_progress=500.0, base_batch=32)  # no total: an older runtime


def test_the_writer_checks_event_fields() -> None:
    with pytest.raises(ValueError, match="no field colour"):
        records.event("done", step=1, colour="red")
    with pytest.raises(ValueError, match="unknown event kind"):
        records.event("finished")


def test_a_lenient_reader_leaves_out_what_does_not_validate() -> None:
    got = parse_lenient(
        [
            {"step": 0, "global_batch": 8},
            {"step": 1, "global_batch": 0},
            {"event": "x"},
            {"event": "policy", "action": "stop", "policy": "P"},
        ]
    )
    assert got == [StepRecord(step=0, global_batch=8), PolicyEvent(action="stop", policy="P")]


def test_what_the_metrics_writer_writes_parses(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "m.jsonl", rank=0, job_id="j")
    writer.step(StepRecord(step=0, world_size=1, local_batch=4, global_batch=4, step_time=0.1))
    writer.event("done", step=1)
    writer.close()
    raws = read_records(tmp_path / "m.jsonl")
    step, done = (parse(r) for r in raws)
    assert isinstance(step, StepRecord) and step.job == "j" and step.time is not None
    assert done == records.DoneEvent(step=1, rank=0, time=raws[1]["time"], job="j")


def test_a_line_another_rank_is_still_writing_is_left_for_the_next_read(tmp_path: Path) -> None:
    # CI caught this: a rank read the shared metrics file while another's write was half seen
    path = tmp_path / "m.jsonl"
    writer = MetricsWriter(path, rank=0, job_id="j")
    writer.event("done", step=1)
    writer.close()
    whole = path.read_text()
    with open(path, "a") as handle:
        handle.write(whole[: len(whole) // 2])  # a torn copy of the line, no newline yet
    assert [r["event"] for r in read_records(path)] == ["done"]
    with open(path, "a") as handle:
        handle.write(whole[len(whole) // 2 :])
    assert [r["event"] for r in read_records(path)] == ["done", "done"]


def test_the_work_lost_is_read_from_typed_checkpoint_events(tmp_path: Path) -> None:
    from kplan.launcher.recovery import last_checkpoint_time
    from kplan.launcher.storage import LocalStorage

    lines = [
        {"event": "start", "rank": 0, "time": 1.0},
        {"step": 0, "rank": 0, "global_batch": 8, "time": 2.0},
        {"event": "checkpoint", "rank": 0, "step": 1, "time": 3.0},
        {"event": "checkpoint", "rank": 0, "step": "two", "time": 4.0},  # not a record: left out
        {"event": "checkpoint", "rank": 0, "step": 3, "time": 9.0},  # after the loss
    ]
    storage = LocalStorage(tmp_path)
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"event": "chec'
    storage.put_bytes("j/metrics/rank-0.jsonl", text.encode())
    assert last_checkpoint_time(storage, "j", before=5.0) == 3.0
    assert last_checkpoint_time(storage, "j", before=2.5) == 1.0  # no checkpoint yet: the first


def test_a_group_s_null_fields_are_written_where_the_step_has_the_group() -> None:
    dense_topk = StepRecord(step=1, bytes_sent=0.0, topk_ratio=0.05).to_dict()
    assert dense_topk["collective"] is None and dense_topk["compress_ratio"] is None
    assert "collective" not in StepRecord(step=1, bytes_sent=8.0).to_dict()  # not top-k
    assert "significance" not in StepRecord(step=1).to_dict()
