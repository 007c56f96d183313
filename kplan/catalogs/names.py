"""GPU names as users and clouds write them, resolved to the catalog's canonical names.

Matching ignores case, spaces, dashes and underscores, and a leading ``NVIDIA`` or ``Tesla``, so
``a100-80gb``, ``A100_80GB``, ``nvidia-a100-80gb`` and ``NVIDIA A100 80GB`` all name
``A100-80GB``. A few cloud and vendor spellings that add a redundant size or form factor are
listed in ``ALIASES``.
"""

from __future__ import annotations

import re

from kplan.core.errors import InputError
from kplan.planner.catalog import Catalog, GpuSpec

# normalised spelling -> canonical catalog name (only used when that name is in the catalog)
ALIASES: dict[str, str] = {
    "A10040GB": "A100",  # GCP nvidia-tesla-a100 is the 40 GB part
    "A100SXM440GB": "A100",
    "A100SXM480GB": "A100-80GB",
    "H10080GB": "H100",  # GCP nvidia-h100-80gb
    "H100SXM": "H100",
    "H100SXM580GB": "H100",
    "H100MEGA": "H100",  # GCP a3-megagpu: the same H100 SXM, more NICs
    "H100MEGA80GB": "H100",
    "H200141GB": "H200",  # GCP nvidia-h200-141gb
    "V10016GB": "V100",
    "V100SXM216GB": "V100",
    "V100SXM232GB": "V100-32GB",
}
_PREFIX = re.compile(r"^(NVIDIA|TESLA)+")


def normalise(name: str) -> str:
    """Upper case, only letters and digits, without a leading NVIDIA/Tesla."""
    return _PREFIX.sub("", re.sub(r"[^A-Z0-9]", "", name.upper()))


def resolve_gpu(name: str, catalog: Catalog | None = None) -> GpuSpec:
    """The catalog's GPU that ``name`` means (shipped catalog by default).

    Raises ``InputError`` echoing ``name`` with the known names as the hint.
    """
    if catalog is None:
        from kplan.catalogs.loader import shipped_catalog

        catalog = shipped_catalog()
    key = normalise(name)
    by_key = {normalise(n): n for n in catalog.gpus}
    canonical = by_key.get(key) or ALIASES.get(key)
    if key and canonical in catalog.gpus:
        return catalog.gpus[canonical]
    raise InputError(
        f"unknown GPU {name!r}",
        hint=f"known GPUs: {', '.join(sorted(catalog.gpus))} (case and dashes do not matter)",
    )
