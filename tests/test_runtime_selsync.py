"""Selective synchronisation (runtime/selsync.py): parsing, the decision, and real 2-worker gloo
runs (fewer synchronisations at a comparable loss, exact resume with replicas that differ).
The torchrun scenario is tests/test_runtime_compress.py's (an option ``COMPRESSION@POLICY``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kplan.core.errors import InputError
from kplan.runtime import env
from kplan.runtime.selsync import SelSync, SyncPolicy, parse_sync_policy
from tests.test_runtime_compress import run_phases, run_scenario


def test_parse_sync_policy() -> None:
    assert parse_sync_policy("every") == SyncPolicy()
    assert parse_sync_policy("selective:0.01") == SyncPolicy("selective", 0.01, 10)
    assert parse_sync_policy("Selective:1e-3:4") == SyncPolicy("selective", 0.001, 4)
    assert parse_sync_policy(SyncPolicy("selective", 0.5, 3).spec()).avg_every == 3


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("sometimes", "'sometimes' is not a sync policy"),
        ("selective", "expected selective:DELTA"),
        ("selective:0", "DELTA '0' is not a number > 0"),
        ("selective:-1:4", "is not a number > 0"),
        ("selective:inf", "is not a number > 0"),
        ("selective:0.1:0", "AVG_EVERY '0' is not an integer >= 1"),
        ("selective:0.1:2.5", "AVG_EVERY"),
        ("selective:0.1:2:3", "expected selective:DELTA"),
    ],
)
def test_bad_sync_policy_is_one_line_with_hint(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match) as err:
        env.sync_policy({env.SYNC_POLICY: text})
    assert str(err.value).startswith("KPLAN_SYNC_POLICY=") and "\n" not in str(err.value)
    assert "selective:DELTA" in err.value.hint


def test_decision_counts_and_averaging() -> None:
    sel = SelSync(SyncPolicy("selective", 0.1, 4))
    assert sel.next_sync  # step 0 always synchronises
    plan = [  # (significance of both workers at step t) -> sync at t+1?
        ([0.5, 0.01], True),  # one significant worker is enough
        ([0.05, 0.09], False),
        ([0.01, 0.02], False),
        ([0.2, 0.0], True),
        ([float("nan"), 0.01], False),  # a non-finite value is ignored
    ]
    synced, averages = True, []
    for step, (sig, want) in enumerate(plan):
        averages.append(sel.after_step(step, synced, sig))
        assert sel.next_sync is want, step
        synced = sel.next_sync
    # steps 0, 1 synced (0 by rule, 1 by step 0's 0.5); 2, 3 skipped; 4 synced
    assert (sel.synced_steps, sel.skipped_steps) == (3, 2)
    # average after step 3 ((3+1) % 4 == 0) because steps 2 and 3 were skipped
    assert averages == [False, False, False, True, False] and not sel.diverged
    again = SelSync(sel.policy)
    again.load_state_dict(sel.state_dict())
    assert again.state_dict() == sel.state_dict()
    every = SelSync(SyncPolicy())
    every.after_step(0, True, [0.0, 0.0])
    assert every.next_sync and not every.after_step(3, True, [0.0])


@pytest.mark.slow
def test_selsync_skips_steps_and_trains_like_dense(tmp_path: Path) -> None:
    import torch

    options = ["none", "none@selective:0.015:8", "topk:0.05:ag@selective:0.015:8"]
    res = run_scenario(tmp_path, options, 96, "sel", None)
    dense = res[0]["none"]["eval_loss"]
    dense_bytes = sum(r["bytes_sent"] for r in res[0]["none"]["records"])
    for name in options[1:]:
        recs = res[0][name]["records"]
        last = recs[-1]
        assert last["synced_steps"] + last["skipped_steps"] == 96
        assert last["skipped_steps"] >= 10 and last["synced_steps"] >= 10, name
        assert [r["synced"] for r in recs].count(False) == last["skipped_steps"]
        # a skipped step sends no gradient bytes (only a parameter average, when due)
        assert all(r["bytes_sent"] == 0 for r in recs if not r["synced"] and not r.get("averaged"))
        assert sum(r["bytes_sent"] for r in recs) < 0.9 * dense_bytes, name
        assert res[0][name]["eval_loss"] <= 1.15 * dense + 0.02, (name, dense)
        # step 95 is an averaging step ((95 + 1) % 8 == 0): the replicas end equal
        assert torch.equal(res[0][name]["params"], res[1][name]["params"]), name
    # SelSync skipped steps are no GNS samples, but the GNS is still measured
    assert res[0]["none@selective:0.015:8"]["gns"] is not None


@pytest.mark.slow
def test_selsync_exact_resume_with_diverged_replicas(tmp_path: Path) -> None:
    # no average before the end (AVG_EVERY 1000): after the first skipped step the replicas
    # differ, so the checkpoint at 17 needs each rank's own model and optimizer state
    options = ["none@selective:0.03:1000", "topk:0.05:ar@selective:0.03:1000"]
    first = run_phases(tmp_path, options, [("ref", 34, tmp_path / "r"), ("a", 17, tmp_path / "c")])
    ref, part = first["ref"], first["a"]
    got = run_scenario(tmp_path, options, 34, "part2", tmp_path / "c")
    import torch

    # the checkpoint was taken while the replicas differed (so the rank files were needed)
    assert all(not torch.equal(part[0][n]["params"], part[1][n]["params"]) for n in options)
    for name in options:
        assert got[0][name]["resumed_at"] == 17
        assert part[0][name]["records"][-1]["skipped_steps"] > 0, name  # not vacuous
        for rank in (0, 1):
            diff = (got[rank][name]["params"] - ref[rank][name]["params"]).abs().max()
            assert float(diff) <= 1e-6, (name, rank, float(diff))
