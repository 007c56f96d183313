"""Versioned catalog data (CSV with a source column) and its validating loader."""

from kplan.catalogs.loader import load_catalog, shipped_catalog
from kplan.catalogs.names import resolve_gpu

__all__ = ["load_catalog", "resolve_gpu", "shipped_catalog"]
