"""Issue 25, item 5: with a pinned --global-batch, --epochs E means E passes over the data at
that batch (statistical efficiency's suggestion stays a note); without one, E epochs at the base
batch, scaled by statistical efficiency; the plan says which."""

from __future__ import annotations

import json
import math
from typing import Any

from typer.testing import CliRunner

from kplan.cli.main import app

runner = CliRunner()
PIN = [
    "estimate",
    "--example",
    "imagenet-resnet50",
    "--instance-type",
    "p3.16xlarge",
    "--nodes",
    "4",
    "--precision",
    "fp16",
    "--global-batch",
    "8192",
    "--compression",
    "none",
]
IMAGENET = 1_281_200


def _json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def test_pinned_batch_and_epochs_plan_that_many_passes_at_that_batch() -> None:
    doc = _json(*PIN, "--epochs", "30")
    for row in (doc["chosen"], *doc["plans"]):
        assert row["global_batch"] == 8192
        assert row["samples"] == IMAGENET * 30  # before: 30 epochs at B0=200, / efficiency 0.49
        assert row["steps"] == math.ceil(IMAGENET * 30 / 8192)  # 4,692 (before: 9,614)
        assert row["statistical_efficiency"] == 1.0
    basis = doc["assumptions"]["epochs_basis"]
    assert (basis["meaning"], basis["at_batch"]) == ("passes_at_batch", 8192)
    # what statistical efficiency would have asked for, kept as a note: more epochs at 8192
    assert basis["efficiency_epochs"] > 30
    assert any(n.startswith("epochs: 30 passes over the data") for n in doc["notes"])
    assert doc["assumptions"]["base_batch"] == 200  # the profile's B0, as measured


def test_the_efficiency_suggestion_plans_its_own_epochs_as_passes() -> None:
    suggested = _json(*PIN, "--epochs", "30")["assumptions"]["epochs_basis"]["efficiency_epochs"]
    scaled = _json(*PIN)  # no --epochs: the profile's epochs at B0, scaled to 8192
    assert scaled["assumptions"]["epochs_basis"]["meaning"] == "scaled_from_base_batch"
    epochs = scaled["assumptions"]["epochs"]
    # the same arithmetic both ways: E epochs at B0 scaled = E x factor passes at the batch
    factor = scaled["chosen"]["samples"] / (IMAGENET * epochs)
    assert math.isclose(suggested / 30, factor, rel_tol=1e-6)


def test_without_a_pinned_batch_epochs_are_at_the_base_batch_and_scaled() -> None:
    doc = _json("estimate", "--example", "imagenet-resnet50", "--epochs", "30", "--top", "2")
    basis = doc["assumptions"]["epochs_basis"]
    assert (basis["meaning"], basis["at_batch"]) == ("scaled_from_base_batch", 200)
    assert "statistical efficiency" in basis["text"]
    row = doc["chosen"]
    assert math.isclose(row["samples"] * row["statistical_efficiency"], IMAGENET * 30, rel_tol=1e-9)


def test_the_text_output_says_what_the_epochs_mean() -> None:
    result = runner.invoke(app, [*PIN, "--epochs", "30"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "30 passes over the data at the pinned global batch 8,192" in result.output
    assert "statistical efficiency" in result.output
