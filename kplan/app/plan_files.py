"""Reading a saved plan: the file, its one validator (``Plan.from_dict``) and its catalog.

``read_plan`` is how ``kplan launch --plan`` and ``kplan simulate --plan`` (and the launch
flags' budget check) read a plan file: JSON through ``kplan.core.files.read_json``, then every
field through ``Plan.from_dict`` (kplan/planner/plan.py). ``plan_catalog`` finds the catalog the
plan was priced with (its ``catalog`` version: the shipped one or a user catalog under
``$KPLAN_HOME/catalogs``), else the user's current catalog, so that a type a user catalog
planned is not refused by a launch that re-prices against the shipped one.
"""

from __future__ import annotations

from pathlib import Path

from kplan.planner.catalog import Catalog
from kplan.planner.plan import Plan, PlanRow


def read_plan(path: Path) -> Plan:
    """The plan in ``path``, every field checked (a plan of the previous schema migrated)."""
    from kplan.core.files import read_json

    return Plan.from_dict(read_json(path, "plan"), str(path))


def plan_catalog(plan: Plan, directory: Path | None = None) -> Catalog:
    """``directory``'s catalog when given; else the one whose version the plan names (shipped or
    a user catalog), else the current one (the newest user catalog, else the shipped)."""
    from kplan.catalogs.current import current_catalog_dir, load_current, user_catalogs
    from kplan.catalogs.loader import load_catalog, shipped_catalog
    from kplan.core.files import check_folder_files

    if directory is not None:
        check_folder_files(directory, "catalog")
        return load_catalog(directory)
    shipped = shipped_catalog()
    if plan.catalog == shipped.version:
        return shipped
    for folder in reversed(user_catalogs()[-8:]):  # the newest few: each is read whole
        check_folder_files(folder, "catalog")
        catalog = load_catalog(folder)
        if catalog.version == plan.catalog:
            return catalog
    check_folder_files(current_catalog_dir(), "catalog")
    return load_current()


def checked_row(
    plan: Plan, source: str, index: int | None = None, catalog: Catalog | None = None
) -> PlanRow:
    """The chosen row (or ``plans[index]``), checked against the plan's catalog."""
    from kplan.planner.plan import check_against_catalog, row_at

    row, where = row_at(plan, index, source)
    if row.cloud != "local":
        check_against_catalog(row, catalog or plan_catalog(plan), source, where)
    return row
