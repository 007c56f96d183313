"""The versioned Profile document: round trip, validation, and the built-in examples."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kplan.app import planning
from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.planner.profile import profile_from_dict, profile_to_dict


def _doc() -> dict[str, Any]:
    return profile_to_dict(planning.load_example("imagenet-resnet50"))


def test_examples_round_trip_and_carry_a_fit() -> None:
    names = planning.example_names()
    assert names == ["bert-squad", "cifar10-resnet18", "deepspeech2", "imagenet-resnet50", "yolov3"]
    for name in names:
        p = planning.load_example(name)
        assert profile_from_dict(json.loads(json.dumps(profile_to_dict(p)))) == p
        assert p.fit is not None and p.gns and p.gpu == "T4"
        placements = {(m.nodes, m.workers) for m in p.measurements}
        assert placements == {(1, 1), (1, 2), (1, 4), (2, 8), (4, 16)}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("measurements"), "missing field 'measurements'"),
        (lambda d: d.update(measurements=[]), "non-empty list"),
        (lambda d: d["measurements"][0].update(step_time=-1), "must be > 0"),
        (lambda d: d["measurements"][0].update(nodes=3, workers=2), "nodes <= workers"),
        (lambda d: d["measurements"][0].update(local_batch=2.5), "must be an integer"),
        (lambda d: d["batch"].update(base_global_batch="big"), "must be a number"),
        (lambda d: d["gns"]["trajectory"][0].update(progress=1.5), "outside \\[0, 1\\]"),
        (lambda d: d["device"].update(gpu=""), "GPU name"),
        (lambda d: d.update(fit=[1, 2]), "'fit' must be an object"),
    ],
)
def test_bad_profiles_name_the_field(mutate: Any, message: str) -> None:
    doc = copy.deepcopy(_doc())
    mutate(doc)
    with pytest.raises(DataFileError, match=message):
        profile_from_dict(doc, "p.json")


def test_schema_versions() -> None:
    doc = _doc()
    profile_from_dict({**doc, "schema": "kplan.profile/1.7"})  # a newer minor is readable
    with pytest.raises(SchemaVersionError, match="not supported"):
        profile_from_dict({**doc, "schema": "kplan.profile/2.0"})
    with pytest.raises(DataFileError, match=r"not a 'kplan\.profile'"):
        profile_from_dict({**doc, "schema": "kplan.plan/1.0"})
    with pytest.raises(DataFileError, match="expected a JSON object"):
        profile_from_dict([1, 2])


@pytest.mark.parametrize(
    ("given", "stored"),
    [(None, "fp32"), ("fp32", "fp32"), ("bf16", "bf16"), ("AMP", "fp16"), ("tf32", "tf32")],
)
def test_the_profile_records_its_precision(given: str | None, stored: str) -> None:
    doc = _doc()
    if given is not None:
        doc["precision"] = given
    prof = profile_from_dict(doc)
    assert prof.precision == stored
    again = profile_to_dict(prof)
    assert again.get("precision", "fp32") == stored  # fp32 (the default) stays implicit
    assert profile_from_dict(again) == prof


@pytest.mark.parametrize("bad", ["fp8", "", 16, None, ["fp16"]])
def test_an_unknown_precision_is_refused_with_the_allowed_values(bad: Any) -> None:
    doc = {**_doc(), "precision": bad}
    if bad is None:
        doc["precision"] = "none"
    with pytest.raises(DataFileError, match="is not a precision") as info:
        profile_from_dict(doc)
    assert "fp32, tf32, bf16, fp16" in info.value.hint
