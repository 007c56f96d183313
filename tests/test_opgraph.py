"""The operator-graph record: validation, folding, and its JSON round trip."""

from __future__ import annotations

import pytest

from kplan.core.errors import DataFileError
from kplan.planner.opgraph import OpCall, OpGraph, fold, opgraph_from_dict


def _mm(count: int = 1, phase: str = "forward") -> OpCall:
    return OpCall(
        "matmul", "aten.mm", phase, "fp32", (1, 32, 64, 128), 2 * 32 * 64 * 128, 4e4, count
    )


def test_fold_sums_counts_of_identical_calls_only() -> None:
    folded = fold([_mm(), _mm(2), _mm(phase="backward")])
    assert sorted((o.phase, o.count) for o in folded) == [("backward", 1), ("forward", 3)]


def test_round_trip_and_totals() -> None:
    graph = OpGraph(fold([_mm(3), _mm(phase="backward")]), 32, "fp32", "test")
    back = opgraph_from_dict(graph.to_dict(), "p.json")
    assert back == graph
    assert back.total() == 4 * 2 * 32 * 64 * 128
    assert back.total("bytes", "backward") == 4e4


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"kind": "warp"}, "kind 'warp'"),
        ({"dims": [1, 2]}, "has 4 dims"),
        ({"flops": float("nan")}, "flops"),
        ({"count": 0}, "count=0"),
        ({"count": True}, "count True"),
        ({"dtype": "fp8x"}, "dtype"),
    ],
)
def test_a_bad_call_is_refused_naming_it(edit: dict[str, object], message: str) -> None:
    doc = OpGraph((_mm(),), 32, "fp32", "test").to_dict()
    doc["ops"][0].update(edit)  # type: ignore[index]
    with pytest.raises(DataFileError, match="opgraph.ops\\[0\\].*" + message):
        opgraph_from_dict(doc, "p.json")


def test_an_empty_or_batchless_graph_is_refused() -> None:
    with pytest.raises(DataFileError, match="non-empty"):
        opgraph_from_dict({"ops": [], "local_batch": 1, "precision": "fp32"}, "p.json")
    doc = OpGraph((_mm(),), 32, "fp32", "t").to_dict()
    doc["local_batch"] = 0
    with pytest.raises(DataFileError, match="local_batch"):
        opgraph_from_dict(doc, "p.json")
