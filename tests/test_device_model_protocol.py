"""The held-out protocols of the device-model fit (scripts/fit_device_model.py): what each fold
fits on and what it is judged on. Synthetic samples, no shared data needed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

import scripts.fit_device_model as fdm
from kplan.catalogs.loader import load_catalog
from kplan.planner.catalog import GpuSpec
from scripts.fit_device_model import DIES, Dataset, Pair, Sample, fold_key, held_out

CAT = load_catalog().gpus
GPUS = ("V100", "V100-32GB", "A100", "A100-80GB")


def _data() -> Dataset:
    """Two jobs measured on every DLE GPU: one in fp16 everywhere, one in FP32 on the V100s
    and TF32 on the A100s (as NVIDIA's tables have them)."""
    samples = []
    for i, gpu in enumerate(GPUS):
        a100 = gpu.startswith("A100")
        samples.append(Sample(gpu, "dle:pt:amp", "dle:pt:amp:m:b8:n1", "fp16", 8.0, 10.0 + i))
        full = "tf32" if a100 else "fp32"
        samples.append(Sample(gpu, "dle:pt:full", "dle:pt:full:m:b8:n1", full, 8.0, 30.0 - i))
    return Dataset({g: CAT[g] for g in GPUS}, samples)


def _record_fits(monkeypatch: pytest.MonkeyPatch) -> list[list[Pair]]:
    seen: list[list[Pair]] = []

    def fake_fit(pairs: Sequence[Pair], specs: dict[str, GpuSpec]) -> NDArray[np.float64]:
        seen.append(list(pairs))
        return np.asarray(fdm.START, dtype=np.float64)

    monkeypatch.setattr(fdm, "fit_theta", fake_fit)
    return seen


def test_twins_on_one_die_leave_together(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fold_key(Sample("V100-32GB", "m", "j", "fp16", 1.0, 1.0), "die") == "GV100"
    assert DIES["NVIDIA_A100_80GB_PCIe"] == DIES["A100"] == "GA100"
    fits = _record_fits(monkeypatch)
    preds = held_out(_data(), "die")
    assert sorted({p.fold for p in preds}) == ["GA100", "GV100"]
    assert len(fits) == 2
    for train, die in zip(fits, ("GA100", "GV100"), strict=True):
        # nothing the fit saw has a GPU of the held-out die on either side
        assert all(DIES[p.src.gpu] != die and DIES[p.dst.gpu] != die for p in train)
        judged = [p for p in preds if p.fold == die]
        assert judged and all(p.pair.cross_gpu for p in judged)
        assert all(die in (DIES[p.pair.src.gpu], DIES[p.pair.dst.gpu]) for p in judged)
    # Leaving a GPU out keeps its twin in the fit (the GPU protocol's known optimism).
    fits.clear()
    held_out(_data(), "gpu")
    v100_fold = fits[sorted(GPUS).index("V100")]  # folds run in sorted order
    assert all("V100" not in (p.src.gpu, p.dst.gpu) for p in v100_fold)
    assert any("V100-32GB" in (p.src.gpu, p.dst.gpu) for p in v100_fold)


def test_a_change_of_unit_is_judged_only_where_the_fold_can_fit_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _record_fits(monkeypatch)
    preds = held_out(_data(), "die")
    # Every FP32 <-> TF32 pair joins a GV100 part to a GA100 part: no die fold keeps one to fit
    # on, so none is judged; fp16 pairs across the dies and TF32 ones between twins are.
    assert preds and all(p.pair.src.precision == p.pair.dst.precision for p in preds)
    assert any(p.pair.src.gpu == "V100" and p.pair.dst.gpu == "A100" for p in preds)
    assert any(p.pair.dst.precision == "tf32" for p in preds)
    gpu_folds = held_out(_data(), "gpu")  # the GPU protocol judges them
    assert any(p.pair.src.precision == "fp32" and p.pair.dst.precision == "tf32" for p in gpu_folds)
