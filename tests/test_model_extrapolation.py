"""Issue 25, item 5: `kplan model predict` refuses a row across a link no measurement crossed
(a one-node CPU fit once gave 2 nodes of 8 workers 3x less time than the measured 1 node of 2,
its network priced at 0, "two-node factor 0.00"), says when a row is past what was measured
(with a wider sigma), and `kplan model fit` never prints a factor of 0."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.app.modelio import predict_file
from kplan.cli.main import app
from kplan.core.errors import DataFileError
from kplan.planner import fit
from kplan.planner.perfmodel import params_from_dict

runner = CliRunner()
PROFILE = Path(__file__).parent / "data" / "mlp-regression.cpu.profile.json"


@pytest.fixture
def one_node(tmp_path: Path) -> Path:
    """The README's `kplan model fit` of a CPU profile: one node, two workers."""
    rows = json.loads(PROFILE.read_text())["measurements"]
    assert {(m["nodes"], m["workers"]) for m in rows} == {(1, 2)}
    lines = ["nodes,workers,local_batch,step_time"]
    lines += [f"{m['nodes']},{m['workers']},{m['local_batch']},{m['step_time']}" for m in rows]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    res = runner.invoke(
        app, ["model", "fit", "-m", str(tmp_path / "m.csv"), "--out", str(tmp_path / "model.json")]
    )
    assert res.exit_code == 0, res.output
    assert "two-node factor 0.00" not in res.output and "two-node sync factor x1.00" in res.output
    assert "not fitted" in res.output and "refused" in res.output
    return tmp_path / "model.json"


def _configs(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "c.csv"
    path.write_text("nodes,workers,local_batch\n" + "\n".join(rows) + "\n")
    return path


def test_a_row_across_unmeasured_nodes_is_refused(one_node: Path, tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "model",
            "predict",
            "--model",
            str(one_node),
            "-c",
            str(_configs(tmp_path, "1,2,64", "2,8,64")),
        ],
    )
    assert res.exit_code == 2
    assert "line 3: cannot predict 2 nodes" in res.output and "hint:" in res.output
    assert "Traceback" not in res.output


def test_rows_past_the_measured_say_so_with_a_wider_sigma(one_node: Path, tmp_path: Path) -> None:
    model = params_from_dict(json.loads(one_node.read_text()), "model")
    inside, past = predict_file(model, _configs(tmp_path, "1,2,64", "1,8,64"))
    assert inside.extrapolated == ""
    assert past.extrapolated == "8 workers > 2 measured"
    assert past.step_time_log_sigma > inside.step_time_log_sigma == pytest.approx(model.log_sigma)
    assert past.step_time_p90 > past.step_time > 0


def test_a_link_prior_makes_nodes_predictable_and_flagged(tmp_path: Path) -> None:
    rows = json.loads(PROFILE.read_text())["measurements"]
    m = tmp_path / "m.csv"
    m.write_text(
        "nodes,workers,local_batch,step_time\n"
        + "".join(f"1,2,{r['local_batch']},{r['step_time']}\n" for r in rows)
    )
    out = tmp_path / "model.json"
    args = ["model", "fit", "-m", str(m), "--out", str(out)]
    res = runner.invoke(app, [*args, "--gradient-bytes", "4e6", "--inter-gbps", "10"])
    assert res.exit_code == 0, res.output
    model = params_from_dict(json.loads(out.read_text()), "model")
    one, two = predict_file(model, _configs(tmp_path, "1,2,64", "2,8,64"))
    assert two.extrapolated == (
        "2 nodes > 1 measured; 8 workers > 2 measured; inter-node all-reduce from a prior"
    )
    assert two.sync_time > 0 and two.step_time_log_sigma > one.step_time_log_sigma


def test_the_two_node_factor_is_a_multiplier_never_zero() -> None:
    base = json.loads(
        (Path(__file__).parents[1] / "kplan/planner/examples/yolov3.json").read_text()
    )
    p = params_from_dict(base["fit"], "yolov3")
    factor, fitted = fit.two_node_factor(p)
    assert factor >= 1.0 and factor == pytest.approx(1.0 + p.two_node)
    # an example's fit names no nodes_measured: every count up to its largest (4) was measured
    assert p.nodes_measured is None and p.max_nodes_measured == 4
    assert fitted is True
    blind = replace(p, inter_measured=False)
    assert fit.two_node_factor(blind) == (factor, False)


def test_unknown_link_is_refused_in_the_library_too(tmp_path: Path) -> None:
    p = params_from_dict(
        json.loads((Path(__file__).parents[1] / "kplan/planner/examples/yolov3.json").read_text())[
            "fit"
        ],
        "yolov3",
    )
    assert fit.unknown_link(p, 4, 16) is None  # measured across nodes
    blind = replace(
        p, inter_measured=False, inter_beta=0.0, max_nodes_measured=1, nodes_measured=(1,)
    )
    assert "knows no network between nodes" in (fit.unknown_link(blind, 2, 8) or "")
    with pytest.raises(DataFileError, match="line 2: cannot predict 2 nodes"):
        predict_file(blind, _configs(tmp_path, "2,8,16"))
