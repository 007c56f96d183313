"""The local provider's chaos configuration and claims (no processes)."""

from __future__ import annotations

import multiprocessing
import statistics
from pathlib import Path

import pytest

from kplan.core.errors import InputError
from kplan.launcher.providers.local_chaos import (
    ChaosConfig,
    claim,
    claim_preemption,
)


def test_json_round_trip_and_defaults() -> None:
    config = ChaosConfig.from_json(
        '{"at_s": [20, 40.5], "targets": [1, null], "notice_factor": 0.05, "seed": 7}'
    )
    assert config.at_s == (20, 40.5)
    assert config.targets == (1, None)
    assert config.notice == pytest.approx(6.0)  # AWS's 120 s notice, shortened 20x
    assert config.enabled
    assert ChaosConfig.from_dict(config.to_dict()) == config
    assert not ChaosConfig().enabled
    assert not ChaosConfig(at_s=(1,), max_preemptions=0).enabled
    assert ChaosConfig.from_env({"KPLAN_LOCAL_CHAOS": "  "}) is None
    assert ChaosConfig.from_env({}) is None
    assert ChaosConfig.from_env({"KPLAN_LOCAL_CHAOS": '{"rate_per_hour": 2}'}) == ChaosConfig(
        rate_per_hour=2
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"at": [1]}', r"unknown keys \['at'\]"),
        ('{"at_s": 5}', "at_s=5 must be a list"),
        ('{"at_s": [-1]}', "at_s holds -1"),
        ('{"at_s": ["soon"]}', "at_s holds 'soon'"),
        ('{"at_s": [1, 2], "targets": [0]}', "one node rank .* per at_s time"),
        ('{"nodes": []}', "nodes=.* must list node ranks"),
        ('{"rate_per_hour": -3}', "rate_per_hour=-3 must be a number >= 0"),
        ('{"notice_factor": true}', "notice_factor=True"),
        ('{"seed": 1.5}', "seed=1.5 must be an integer"),
        ('{"max_preemptions": -1}', "max_preemptions=-1"),
        ("{oops", "not JSON"),
    ],
)
def test_bad_configurations_name_the_value(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        ChaosConfig.from_json(text)
    assert "KPLAN_LOCAL_CHAOS" in err.value.hint


def test_random_lifetimes_are_seeded_and_exponential() -> None:
    config = ChaosConfig(rate_per_hour=3600.0, seed=11)  # mean lifetime 1 s
    again = ChaosConfig(rate_per_hour=3600.0, seed=11)
    other = ChaosConfig(rate_per_hour=3600.0, seed=12)
    ids = [f"local-job-{n}" for n in range(2000)]
    lives = [config.lifetime(i) for i in ids]
    assert lives == [again.lifetime(i) for i in ids]
    assert lives != [other.lifetime(i) for i in ids]
    values = [life for life in lives if life is not None]
    assert statistics.fmean(values) == pytest.approx(1.0, rel=0.1)
    assert ChaosConfig(at_s=(1,)).lifetime("x") is None


def test_targets_nodes_and_stagger() -> None:
    config = ChaosConfig(at_s=(1, 2, 3), targets=(1, None, 0), nodes=(0, 1), seed=5)
    assert [config.event_hits(0, r) for r in (0, 1, 2)] == [False, True, False]
    assert [config.event_hits(1, r) for r in (0, 1, 2)] == [True, True, False]
    assert [config.event_hits(2, r) for r in (0, 1)] == [True, False]
    assert config.stagger(1, 0) == config.stagger(1, 0)
    assert 0 <= config.stagger(1, 0) < 0.5
    assert config.stagger(1, 0) != config.stagger(1, 1)


def _claim_all(folder: str, owner: str) -> list[bool]:
    return [claim(Path(folder), f"event-{k}", owner) for k in range(50)]


def test_claims_are_exclusive_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        a, b = pool.starmap(_claim_all, [(str(tmp_path), "a"), (str(tmp_path), "b")])
    assert all(x != y for x, y in zip(a, b, strict=True))  # each event taken exactly once
    capped = ChaosConfig(rate_per_hour=1.0, max_preemptions=2)
    slots = tmp_path / "slots"
    assert [claim_preemption(capped, slots, str(n)) for n in range(4)] == [
        True,
        True,
        False,
        False,
    ]
    assert claim_preemption(ChaosConfig(rate_per_hour=1.0), slots, "free")
