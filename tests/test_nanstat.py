"""``kplan/planner/nanstat.py`` gives numpy's medians and quantiles value for value (it exists
so that the planner never imports ``numpy.ma``), and the estimate path imports no ``numpy.ma``."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from kplan.planner import nanstat


def _arrays(seed: int) -> list[np.ndarray]:  # type: ignore[type-arg]
    """Random 2-d arrays: NaN, both infinities, whole numbers (ties), one wide array."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(60):
        shape = (int(rng.integers(1, 6)), int(rng.integers(1, 700 if t == 0 else 14)))
        a = rng.normal(size=shape) * 10.0 ** float(rng.integers(-3, 5))
        if t % 4 == 0:
            a[rng.random(shape) < 0.05] = np.nan
        if t % 3 == 0:
            a[rng.random(shape) < 0.1] = np.inf
        if t % 5 == 0:
            a[rng.random(shape) < 0.1] = -np.inf
        out.append(np.round(a) if t % 7 == 0 else a)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_quantile_and_median_are_numpys(seed: int) -> None:
    with np.errstate(invalid="ignore"):  # numpy's own inf - inf (nanstat sets its own)
        for a in _arrays(seed):
            for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0, 0.37):
                for axis in (0, 1):
                    want, got = np.quantile(a, q, axis=axis), nanstat.quantile(a, q, axis=axis)
                    assert np.array_equal(want, got, equal_nan=True), (q, axis, a)
                assert np.array_equal(
                    np.quantile(a[0], q), nanstat.quantile(a[0], q), equal_nan=True
                )
            for axis in (0, 1):
                want, got = np.median(a, axis=axis), nanstat.median(a, axis=axis)
                assert np.array_equal(want, got, equal_nan=True), (axis, a)
            assert np.array_equal(np.median(a[0]), nanstat.median(a[0]), equal_nan=True)


@pytest.mark.parametrize("seed", range(4))
def test_nan_median_is_numpys(seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN slice
        for a in _arrays(seed):
            a[0, : a.shape[1] // 2] = np.nan
            want, got = np.nanmedian(a, axis=1), nanstat.nan_median(a, axis=1)
            assert np.array_equal(want, got, equal_nan=True), a
            assert np.array_equal(np.nanmedian(a[-1]), nanstat.nan_median(a[-1]), equal_nan=True)


@pytest.mark.parametrize("seed", range(3))
def test_nan_quantile_is_numpys(seed: int) -> None:
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN slice, inf - inf
        for a in _arrays(seed):
            a[0, : a.shape[1] // 2] = np.nan
            for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0, 0.37):
                want, got = np.nanquantile(a, q, axis=1), nanstat.nan_quantile(a, q, axis=1)
                assert np.array_equal(want, got, equal_nan=True), (q, a)


def test_the_estimate_path_imports_no_numpy_ma() -> None:
    code = (
        "import sys\n"
        "from kplan.app import planning\n"
        "from kplan.planner.search import SearchOptions\n"
        "prof = planning.load_example('yolov3')\n"
        "planning.estimate(prof, SearchOptions(max_nodes=8, spot_runs=200))\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
