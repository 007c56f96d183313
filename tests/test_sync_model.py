"""The sync model's physics: ring bytes, per-node NIC, bucket floor, provenance of terms."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kplan.core.compression_spec import DDP_BUCKET_BYTES
from kplan.core.errors import InputError
from kplan.planner import perfmodel
from kplan.planner.perfmodel import PerfParams


def _params(**kw: object) -> PerfParams:
    base: dict[str, object] = {
        "compute_a": 0.0,
        "compute_b": 1e-3,
        "gamma": 10.0,
        "intra_alpha": 0.0,
        "intra_beta": 0.1,
        "intra_lat": 0.0,
        "inter_alpha": 0.0,
        "inter_beta": 1.0,
        "inter_lat": 0.0,
        "two_node": 0.0,
        "log_sigma": 0.1,
    }
    base.update(kw)
    return PerfParams(**base)  # type: ignore[arg-type]


def test_one_node_is_the_ring_whatever_the_inter_terms() -> None:
    p = _params(inter_beta=123.0, inter_alpha=5.0, intra_alpha=0.002, intra_lat=1e-5)
    for k in range(2, 9):
        want = 0.002 + 0.1 * 2 * (k - 1) / k + 1e-5 * 2 * (k - 1)
        assert float(perfmodel.sync_time(p, 1, k)) == pytest.approx(want)
    assert float(perfmodel.sync_time(p, 1, 1)) == 0.0


def test_large_message_bandwidth_term_is_bytes_over_bus_bandwidth() -> None:
    # 1 GiB over 8 GPUs at an eta * 2400 Gbit/s link: NCCL's busbw identity t = S*ring/busbw.
    size, gbps, eta = 2.0**30, 2400.0, 0.665
    p = _params(intra_beta=size / (eta * gbps * 1e9 / 8))
    busbw = eta * gbps * 1e9 / 8
    assert float(perfmodel.sync_time(p, 1, 8)) == pytest.approx(size * 2 * 7 / 8 / busbw)


def test_inter_node_bytes_cross_each_nodes_nic_once() -> None:
    # beta is P over the node's aggregate NIC: 8 GPUs per node do not multiply the NIC bytes.
    p = _params(inter_beta=1.0)
    two_nodes_one_gpu = float(perfmodel.sync_time(p, 2, 2))
    two_nodes_eight_gpus = float(perfmodel.sync_time(p, 2, 16))
    assert two_nodes_one_gpu == pytest.approx(1.0)  # ring(2) = 1
    assert two_nodes_eight_gpus == pytest.approx(2 * 15 / 16)  # ring(16), not 8 x ring
    assert two_nodes_eight_gpus < 2.0


def test_last_bucket_is_never_hidden() -> None:
    grad = 100 * 2**20  # four buckets of 25 MiB
    p = perfmodel.with_bucket_floor(
        _params(gamma=10.0, gradient_bytes=float(grad), intra_beta=0.4, intra_alpha=0.001)
    )
    assert p.bucket_bytes == DDP_BUCKET_BYTES
    tc = 10.0  # compute far longer than sync: the overlap formula alone hides nearly all of it
    exposed = float(perfmodel.exposed_sync_time(p, 1, 8, tc / p.compute_b))
    bucket = 0.001 + 0.4 * (DDP_BUCKET_BYTES / grad) * 2 * 7 / 8
    assert exposed == pytest.approx(bucket, rel=1e-6)
    no_floor = replace(p, bucket_bytes=None)
    assert float(perfmodel.exposed_sync_time(no_floor, 1, 8, tc / 1e-3)) < 1e-6
    # Without the gradient size there is nothing to floor.
    assert perfmodel.with_bucket_floor(_params()).bucket_bytes is None


def test_one_bucket_gradient_does_not_overlap() -> None:
    p = perfmodel.with_bucket_floor(_params(gamma=10.0, gradient_bytes=1e6, intra_beta=0.05))
    sync = float(perfmodel.sync_time(p, 1, 4))
    step = float(perfmodel.step_time(p, 1, 4, 1000))
    assert step == pytest.approx(1.0 + sync)


def test_floor_leaves_one_worker_alone_and_is_off_by_default() -> None:
    p = _params(gamma=3.0, gradient_bytes=1e9)
    assert p.bucket_bytes is None
    sync = float(perfmodel.sync_time(p, 4, 32))
    assert float(perfmodel.step_time(p, 4, 32, 100)) == pytest.approx(
        float(perfmodel.overlap(0.1, sync, 3.0))
    )
    floored = perfmodel.with_bucket_floor(p)
    assert float(perfmodel.step_time(floored, 1, 1, 100)) == pytest.approx(0.1)
    assert float(perfmodel.step_time(floored, 4, 32, 100)) > float(
        perfmodel.step_time(p, 4, 32, 100)
    )
    with pytest.raises(ValueError, match="bucket_bytes"):
        replace(p, bucket_bytes=-1.0)


def test_fit_with_the_floor_recovers_a_floored_truth() -> None:
    from kplan.planner.fit import fit_perf_params
    from kplan.planner.profile import Measurement

    truth = perfmodel.with_bucket_floor(
        _params(compute_a=0.02, compute_b=0.002, gamma=3.0, gradient_bytes=1e8, intra_beta=0.05)
    )
    rows = [
        Measurement(
            nodes=1,
            workers=k,
            local_batch=b,
            step_time=float(perfmodel.step_time(truth, 1, k, b)),
        )
        for k in (1, 2, 4, 8)
        for b in (16, 64, 256)
    ]
    fitted = fit_perf_params(rows, gradient_bytes=1e8, bucket_bytes=DDP_BUCKET_BYTES)
    assert fitted.bucket_bytes == DDP_BUCKET_BYTES
    pred = perfmodel.step_time(fitted, 1, 8, 512)
    assert float(pred) == pytest.approx(float(perfmodel.step_time(truth, 1, 8, 512)), rel=0.03)


def test_gradient_bytes_follow_the_gradient_dtype() -> None:
    assert perfmodel.projected_gradient_bytes(4e8, "fp32", "fp16") == 4e8  # DDP: FP32 grads
    assert perfmodel.projected_gradient_bytes(4e8, "bf16", "tf32") == 4e8
    with pytest.raises(InputError):
        perfmodel.projected_gradient_bytes(4e8, "fp8", "fp32")


def test_sync_uses_the_params_gradient_bytes() -> None:
    small = _params(gradient_bytes=1e6, intra_beta=1e6 / 1e10)
    big = _params(gradient_bytes=1e9, intra_beta=1e9 / 1e10)
    ratio = float(perfmodel.sync_time(big, 1, 8)) / float(perfmodel.sync_time(small, 1, 8))
    assert math.isclose(ratio, 1000.0)


def test_term_sources_say_what_was_measured() -> None:
    p = _params(gpu="T4", max_workers_measured=16, max_nodes_measured=4, inter_measured=True)
    assert perfmodel.term_sources(p, gpu="T4", nodes=1, workers=1) == {
        "compute": "measured",
        "intra_sync": "none",
        "inter_sync": "none",
    }
    assert perfmodel.term_sources(p, gpu="T4", nodes=8, workers=32)["inter_sync"] == (
        "extrapolated from 4 nodes"
    )
    moved = perfmodel.term_sources(p, gpu="V100", nodes=4, workers=32)
    assert moved["compute"] == "transferred from T4"
    assert moved["intra_sync"] == "prior"  # the profile's link is unknown: priors
    assert moved["inter_sync"] == "scaled by link bandwidth"
    one_node = _params(gpu="T4", max_workers_measured=4, intra_gbps=100.0)
    srcs = perfmodel.term_sources(one_node, gpu="A100", nodes=2, workers=16)
    assert srcs["intra_sync"] == "scaled by link bandwidth"
    assert srcs["inter_sync"] == "prior"


def test_priors_come_from_the_nccl_fit() -> None:
    from kplan.planner import fit

    # bench/sync_model.py part a: eta 0.665 on the vTrain nccl-tests rows.
    assert pytest.approx(0.665) == fit.PRIOR_ETA_INTRA
    assert fit.PRIOR_ETA_INTER == fit.PRIOR_ETA_INTRA
    assert 0 < fit.PRIOR_NCCL_CALL < 1e-3
    assert np.isfinite(fit.PRIOR_LAT_INTER)


def test_plan_rows_say_which_terms_were_measured() -> None:
    import json

    from typer.testing import CliRunner

    from kplan.cli.main import app

    # The example was profiled on T4 (g4dn, up to four nodes): on 4 x p3.16xlarge the compute
    # is transferred from the T4 and the links are scaled; on its own instance it is measured.
    args = ["estimate", "--example", "imagenet-resnet50", "--json", "--nodes", "4"]
    result = CliRunner().invoke(app, [*args, "--instance-type", "p3.16xlarge"])
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.output)["chosen"]
    assert chosen["terms"] == {
        "compute": "transferred from T4",
        "intra_sync": "scaled by link bandwidth",
        "inter_sync": "scaled by link bandwidth",
    }
    result = CliRunner().invoke(app, [*args, "--instance-type", "g4dn.12xlarge"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["chosen"]["terms"] == {
        "compute": "measured",
        "intra_sync": "measured",
        "inter_sync": "measured",
    }
