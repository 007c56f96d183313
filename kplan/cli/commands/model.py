"""``kplan model fit|predict``: the step-time model on the measurements CSV contract."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(
    help="Fit the step-time model to measurements; predict configurations.", no_args_is_help=True
)


@app.command("fit")
def fit_command(
    measurements: Path = typer.Option(
        ...,
        "--measurements",
        "-m",
        help="Measurements CSV: "
        "nodes, workers, local_batch, step_time [, sync_time, "
        "accum_steps, instance_type, gpu].",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the model JSON."),
    gradient_bytes: float | None = typer.Option(
        None, "--gradient-bytes", help="Gradient size in bytes (for efficiencies)."
    ),
    intra_gbps: float | None = typer.Option(
        None, "--intra-gbps", help="Nominal intra-node link, Gbit/s per GPU."
    ),
    inter_gbps: float | None = typer.Option(
        None, "--inter-gbps", help="Nominal NIC bandwidth, Gbit/s."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the model JSON."),
) -> None:
    """Fit compute, all-reduce and overlap parameters (robust, log-space least squares)."""
    from kplan.app.modelio import fit_file
    from kplan.core.files import check_writable, write_json
    from kplan.planner.fit import two_node_factor
    from kplan.planner.perfmodel import params_to_dict

    check_writable(out, "--out", [("the --measurements", measurements)])
    report = fit_file(
        measurements, gradient_bytes=gradient_bytes, intra_gbps=intra_gbps, inter_gbps=inter_gbps
    )
    doc = params_to_dict(report.params)
    write_json(out, doc)
    if as_json:
        typer.echo(
            json.dumps(
                {**doc, "fit_rows": report.rows, "fit_mape_percent": report.mape_percent}, indent=1
            )
        )
        return
    p = report.params
    typer.echo(
        f"fitted {report.rows} rows: MAPE {report.mape_percent:.1f}% on the fitted rows "
        f"(log sigma {p.log_sigma:.3f}); wrote {out}"
    )
    two, fitted = two_node_factor(p)
    typer.echo(
        f"compute {p.compute_a * 1e3:.2f} ms + {p.compute_b * 1e3:.3f} ms/sample; "
        f"overlap gamma {p.gamma:.2f}; two-node sync factor x{two:.2f}"
        + ("" if fitted else " (not fitted: needs rows at 2 nodes and at more; held at x1)")
    )
    if not p.inter_measured:
        typer.echo(
            f"measured {p.max_nodes_measured} node(s), up to {p.max_workers_measured} workers: "
            + (
                "rows across nodes are predicted from a prior (wider sigma)"
                if p.inter_beta > 0
                else "rows across nodes are refused by `kplan model predict` (give --inter-gbps "
                "and --gradient-bytes for a prior)"
            )
        )


@app.command("predict")
def predict_command(
    model: Path = typer.Option(..., "--model", help="Model JSON from `kplan model fit`."),
    configs: Path = typer.Option(
        ...,
        "--configs",
        "-c",
        help="Configurations CSV: nodes, workers, local_batch [, accum_steps, instance_type, gpu].",
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the CSV here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of CSV."),
) -> None:
    """Answer each configuration with step_time, its p90 and log sigma, compute_time and
    sync_time. A row whose gpu or instance_type names another GPU than the model's is
    transferred through the device model (wider sigma; transferred_from names the model's GPU);
    an unknown GPU or type, or a model that does not name its GPU, is refused. A row outside
    what was measured (more nodes or workers) says so in `extrapolated`, with a wider sigma; a
    row across a link the model knows nothing of (nodes when no row crossed nodes and no
    --inter-gbps was given) is refused."""
    from kplan.app.modelio import load_model, predict_file, to_csv
    from kplan.core.files import check_writable, write_atomic

    if out is not None:
        check_writable(out, "--out", [("the --model", model), ("the --configs", configs)])
    rows = predict_file(load_model(model), configs)
    if out is not None:
        write_atomic(out, to_csv(rows))
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=1))
    elif out is None:
        typer.echo(to_csv(rows), nl=False)
