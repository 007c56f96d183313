from __future__ import annotations

import json

import numpy as np
import pytest

from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.planner import perfmodel
from kplan.planner.perfmodel import params_from_dict, params_to_dict
from tests.planner_fixtures import params


def test_single_worker_has_no_sync_and_linear_compute() -> None:
    p = params()
    assert perfmodel.sync_time(p, 1, 1) == 0.0
    t = perfmodel.step_time(p, [1, 1], [1, 1], [10, 20])
    np.testing.assert_allclose(t, [0.05 + 0.04, 0.05 + 0.08])


def test_ring_sync_formula_inside_and_across_nodes() -> None:
    p = params(two_node=0.5)
    k = 4
    ring = 2 * (k - 1) / k
    intra = 0.001 + 0.02 * ring + 1e-5 * 2 * (k - 1)
    assert perfmodel.sync_time(p, 1, k) == pytest.approx(intra)
    inter = 0.01 + 0.2 * ring + 5e-5 * 2 * (k - 1)
    assert perfmodel.sync_time(p, 4, k) == pytest.approx(inter)
    assert perfmodel.sync_time(p, 2, k) == pytest.approx(inter * 1.5)


def test_overlap_bounds() -> None:
    # (c^g + s^g)^(1/g) lies between max(c, s) and c + s, reaching the sum at g = 1.
    c, s = np.array([0.3]), np.array([0.2])
    for g in (1.0, 2.0, 10.0):
        t = perfmodel.overlap(c, s, g)[0]
        assert 0.3 <= t <= 0.5 + 1e-12
    assert perfmodel.overlap(c, s, 1.0)[0] == pytest.approx(0.5)


def test_accumulation_adds_compute_only() -> None:
    p = params()
    one = perfmodel.step_time(p, 2, 8, 16, 1)
    four = perfmodel.step_time(p, 2, 8, 16, 4)
    assert four - one == pytest.approx(3 * perfmodel.compute_time(p, 16))


def test_transfer_scales_compute_and_links() -> None:
    p = params()
    q = perfmodel.transfer(
        p, compute_factor=0.5, intra_gbps=200.0, inter_gbps=100.0, extra_log_sigma=0.2
    )
    assert q.compute_b == pytest.approx(p.compute_b * 0.5)
    assert q.intra_beta == pytest.approx(p.intra_beta / 2)
    assert q.inter_beta == pytest.approx(p.inter_beta / 2)
    assert q.log_sigma == pytest.approx(np.hypot(0.08, 0.2))


def test_efficiency_of_links() -> None:
    eta = params().efficiency()
    # P / (BW * eta) = beta  ->  eta = 1e8 / (50e9/8) / 0.2 = 0.08
    assert eta["inter"] == pytest.approx(0.08)


def test_model_json_round_trip_and_errors() -> None:
    p = params()
    assert params_from_dict(json.loads(json.dumps(params_to_dict(p)))) == p
    with pytest.raises(SchemaVersionError, match="not supported"):
        params_from_dict({**params_to_dict(p), "schema": "kplan.perfmodel/2.0"})
    with pytest.raises(DataFileError, match="gamma"):
        params_from_dict({**params_to_dict(p), "gamma": 20.0})
    with pytest.raises(DataFileError, match="not a kplan performance model"):
        params_from_dict({"schema": "kplan.perfmodel/1.0", "foo": 1})
    with pytest.raises(DataFileError, match="profile"):
        params_from_dict({"schema": "kplan.profile/1.0"})


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("compute_b", True, "a number"),
        ("gamma", "2", "a number"),
        ("bucket_bytes", "big", "a number"),
        ("gpus_per_node", 2.5, "an integer"),
        ("max_nodes_measured", 0, "an integer"),
        ("inter_measured", 1, "true or false"),
        ("nodes_measured", [1, True], "a list of node counts"),
        ("gpu", 7, "a GPU name"),
    ],
)
def test_one_validation_refuses_a_field_of_the_wrong_type(
    key: str, value: object, want: str
) -> None:
    """params_from_dict is the one reader of a model (kplan model's file and a profile's fit):
    a JSON boolean is no number, a count is a bounded integer."""
    with pytest.raises(DataFileError, match=f"'{key}' must be {want}"):
        params_from_dict({**params_to_dict(params()), key: value}, "m.json")


def test_inter_gamma_sets_the_overlap_across_nodes_only() -> None:
    p = params(gamma=4.0)
    q = perfmodel.replace_fields(p, inter_gamma=1.0)
    # inside a node nothing changes; across nodes gamma 1 adds compute and sync (no overlap)
    assert perfmodel.step_time(q, 1, 4, 16) == pytest.approx(perfmodel.step_time(p, 1, 4, 16))
    tc = float(perfmodel.compute_time(q, 16))
    sync = float(perfmodel.sync_time(q, 4, 16))
    assert perfmodel.step_time(q, 4, 16, 16) == pytest.approx(tc + sync)
    assert perfmodel.step_time(p, 4, 16, 16) < tc + sync
    # saved and loaded with the model; out of [1, 10] refused
    assert params_from_dict(json.loads(json.dumps(params_to_dict(q)))) == q
    with pytest.raises(ValueError, match="inter_gamma"):
        perfmodel.replace_fields(p, inter_gamma=0.5)
