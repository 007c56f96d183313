"""Profile schema 1.4: the optional ``opgraph`` section (no torch needed to read it)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kplan.app import planning
from kplan.core.errors import DataFileError
from kplan.planner.opgraph import OpCall, OpGraph
from kplan.planner.profile import PROFILE_SCHEMA, profile_from_dict, profile_to_dict

GRAPH = OpGraph(
    ops=(
        OpCall("matmul", "aten.addmm", "forward", "fp32", (1, 32, 10, 64), 40960.0, 11304.0),
        OpCall("optimizer", "aten._foreach_add_.List", "optimizer", "fp32", (650,), 650, 7800.0, 2),
    ),
    local_batch=32,
    precision="fp32",
    how="test",
)


def _doc() -> dict[str, Any]:
    return profile_to_dict(planning.load_example("cifar10-resnet18"))


def test_a_1_3_profile_without_a_graph_still_loads() -> None:
    doc = _doc()
    doc["schema"] = "kplan.profile/1.3"
    doc.pop("opgraph", None)
    p = profile_from_dict(doc)
    assert p.opgraph is None
    assert "opgraph" not in profile_to_dict(p)
    assert PROFILE_SCHEMA == "kplan.profile/1.4"


def test_the_graph_round_trips_through_the_profile() -> None:
    doc = _doc()
    doc["opgraph"] = GRAPH.to_dict()
    p = profile_from_dict(json.loads(json.dumps(doc)))
    assert p.opgraph == GRAPH
    assert profile_to_dict(p)["opgraph"] == GRAPH.to_dict()
    assert p.opgraph.total("flops") == 40960.0 + 2 * 650


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda g: g.update(ops=[]), "non-empty list"),
        (lambda g: g["ops"][0].update(kind="fft"), "kind 'fft' is not one of"),
        (lambda g: g["ops"][0].update(dims=[1, 2]), "has 4 dims"),
        (lambda g: g["ops"][0].pop("flops"), "missing 'flops'"),
        (lambda g: g.update(local_batch=0), "local_batch"),
    ],
)
def test_a_bad_graph_names_the_entry(mutate: Any, message: str) -> None:
    doc = _doc()
    doc["opgraph"] = copy.deepcopy(GRAPH.to_dict())
    mutate(doc["opgraph"])
    with pytest.raises(DataFileError, match=message):
        profile_from_dict(doc)


def test_the_examples_ship_their_traced_graphs() -> None:
    for name in planning.example_names():
        p = planning.load_example(name)
        assert p.opgraph is not None, name
        g = p.opgraph
        assert g.local_batch == p.base_global_batch and g.precision == "fp32"
        assert {o.phase for o in g.ops} == {"forward", "backward", "optimizer"}
        # backward costs about twice the forward in the compute-bound classes
        heavy = ("matmul", "conv", "attention")
        fwd = sum(o.flops * o.count for o in g.ops if o.phase == "forward" and o.kind in heavy)
        bwd = sum(o.flops * o.count for o in g.ops if o.phase == "backward" and o.kind in heavy)
        assert 1.5 < bwd / fwd < 2.1, name
    bert = planning.load_example("bert-squad").opgraph
    assert bert is not None  # one fused attention per layer: 12 sequences x 12 heads, 384 tokens
    attention = [o for o in bert.ops if o.kind == "attention" and o.phase == "forward"]
    assert [(o.dims, o.count) for o in attention] == [((144, 384, 384, 64), 12)]
    r50 = planning.load_example("imagenet-resnet50").opgraph
    assert r50 is not None
    macs = sum(o.flops * o.count for o in r50.ops if o.phase == "forward" and o.kind in heavy) / 2
    assert macs / r50.local_batch == pytest.approx(4.1e9, rel=0.02)  # the published 4.1 GMACs
