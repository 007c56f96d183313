"""The plan file's JSON: the reader every field goes through (``JsonObject``: types, bounds and
enums, each refusal one line naming the field, with a hint), the schema's bounds, and the
migration of the previous schema. ``Plan.from_dict`` (kplan/planner/plan.py) is the one
validator built on it.

Every field is checked once, through here, for every reader (``kplan launch --plan``,
``kplan simulate --plan``, ``kplan report``): types (a bool is not a number, ``"false"`` is
not a bool), finite numbers inside sane bounds, the enums (market, zone type, precision,
objective), and the counts that must agree (a row's nodes are its groups', its workers their
GPUs, its global batch at least one sample per worker, a p90 at least its expected value).
Work that grows with a plan is bounded: at most ``MAX_ROWS`` rows, ``MAX_GROUPS`` groups and
``MAX_PHASES`` phases.

A plan of the previous schema (``kplan.plan/1.x``: flat ``batch_schedule_*`` and spot fields) is
migrated to the nested records; any other schema is refused with one line and a hint.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from kplan.core import flags
from kplan.core.errors import DataFileError

PLAN_SCHEMA = "kplan.plan/2.1"  # 2.1: rows have ``extras`` (2.0 rows load with zeros)
HINT = "re-create the plan with kplan estimate --out plan.json"
MAX_ROWS = 10_000  # rows in plans or frontier
MAX_GROUPS = 64  # groups of one row
MAX_PHASES = 64  # phases of a batch schedule
MAX_GPUS_PER_NODE = flags.MAX_LOCAL_WORKERS  # a local group's workers; clouds: the catalog's
MAX_TEXT = 100_000  # characters of a free-text field
CLOUDS = ("aws", "gcp", "local")
GROUP_MARKETS = ("spot", "on-demand")
ROW_MARKETS = ("spot", "on-demand", "mixed")
ZONE_TYPES = ("availability-zone", "local-zone", "wavelength-zone")
OBJECTIVE_NAMES = ("cost", "time", "knee", "local")
TERM_KEYS = 16  # entries of a row's ``terms``


class JsonObject:
    """One JSON object being read, with its path for messages (``chosen.groups[0]``)."""

    def __init__(self, value: object, where: str, source: str) -> None:
        self.where, self.source = where, source
        if not isinstance(value, dict):
            self.fail(f"{where or 'the plan'} is not a JSON object", value)
        self.doc: dict[str, Any] = value

    def fail(self, what: str, value: object = None) -> NoReturn:
        raise DataFileError(f"{self.source}: the plan's {what}", hint=HINT)

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, default: object = ...) -> object:
        if key in self.doc:
            return self.doc[key]
        if default is ...:
            self.fail(f"{self.name(key)} is missing")
        return default

    def _show(self, value: object) -> str:
        return repr(value)[:40]

    def integer(self, key: str, low: int, high: int, default: object = ...) -> int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            self.fail(f"{self.name(key)} {self._show(v)} is not an integer in [{low}, {high}]")
        return v

    def number(
        self, key: str, low: float, high: float, *, open_low: bool = False, default: object = ...
    ) -> float:
        v = self.get(key, default)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if ok:
            ok = (v > low if open_low else v >= low) and v <= high  # type: ignore[operator]
        if not ok:
            bracket = "(" if open_low else "["
            self.fail(
                f"{self.name(key)} {self._show(v)} is not a finite number in "
                f"{bracket}{low:g}, {high:g}]"
            )
        return float(v)  # type: ignore[arg-type]

    def optional_number(self, key: str, low: float, high: float) -> float | None:
        if self.doc.get(key) is None:
            return None
        return self.number(key, low, high)

    def boolean(self, key: str, default: object = ...) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            self.fail(f"{self.name(key)} {self._show(v)} is not true or false")
        return v

    def text(self, key: str, default: object = ..., *, empty: bool = True) -> str:
        v = self.get(key, default)
        if not isinstance(v, str) or len(v) > MAX_TEXT or (not empty and not v.strip()):
            self.fail(f"{self.name(key)} {self._show(v)} is not a text")
        return v

    def word(self, key: str, default: object = ...) -> str:
        """A name: non-empty, printable, no spaces, at most 200 characters."""
        v = self.get(key, default)
        if not (
            isinstance(v, str)
            and 0 < len(v) <= 200
            and all(c.isprintable() and not c.isspace() for c in v)
        ):
            self.fail(f"{self.name(key)} {self._show(v)} is not a name")
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: object = ...) -> str:
        v = self.get(key, default)
        if v not in choices:
            self.fail(f"{self.name(key)} {self._show(v)} is not one of {', '.join(choices)}")
        return str(v)

    def items(self, key: str, high: int, default: object = ...) -> list[Any]:
        v = self.get(key, default)
        if not isinstance(v, list) or len(v) > high:
            self.fail(f"{self.name(key)} is not a list of at most {high} entries")
        return v

    def sub(self, key: str, value: object) -> JsonObject:
        return JsonObject(value, self.name(key), self.source)


# ------------------------------------------------------------------------ the previous schema

_V1_SPOT = {
    "time_cost_basis": "basis",
    "fail_prob": "fail_prob",
    "spot_model": "model",
    "on_demand_cost_usd": "on_demand_cost_usd",
    "on_demand_hours": "on_demand_hours",
}
_V1_SCHEDULE = {
    "batch_schedule_hours": "hours",
    "batch_schedule_cost_usd": "cost_usd",
    "batch_schedule_hours_p90": "hours_p90",
    "batch_schedule_cost_p90_usd": "cost_p90_usd",
    "batch_schedule_forecast_log_sigma": "forecast_log_sigma",
    "batch_schedule_saving": "saving",
}
_V1_RECOVERY = ("max_replacements", "capacity_wait_s", "allow_on_demand")


def migrate_v1(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """A ``kplan.plan/1.x`` document in this schema's shape (values are checked afterwards, by
    the reader of this schema): flat ``batch_schedule_*`` fields become one ``batch_schedule``
    object, the spot fields one ``spot`` object (its recovery rules ``None`` where the plan
    simulated none)."""
    out = dict(doc, schema=PLAN_SCHEMA)
    d = JsonObject(doc, "", source)
    for key in ("plans", "frontier"):
        out[key] = [_v1_row(d.sub(f"{key}[{i}]", r)) for i, r in enumerate(d.items(key, MAX_ROWS))]
    out["chosen"] = _v1_row(d.sub("chosen", d.get("chosen")))
    return out


def _v1_row(d: JsonObject) -> dict[str, Any]:
    row = dict(d.doc)
    spot = {new: row.pop(old) for old, new in _V1_SPOT.items() if old in row}
    recovery = row.pop("recovery", None)
    flat = {k: row.pop(k) for k in _V1_RECOVERY if k in row}
    if recovery:  # the rules it was priced with; the flat copies must agree
        rec = d.sub("recovery", recovery)
        for key, value in flat.items():
            if key == "allow_on_demand":
                d.boolean(key)
            if rec.doc.get(key, value) != value:
                d.fail(f"{d.name(key)} {value!r} disagrees with its recovery rules")
        spot["recovery"] = recovery
    elif "allow_on_demand" in flat:
        d.boolean("allow_on_demand")
    row["spot"] = spot
    entries = row.pop("batch_schedule", None)
    sched = {new: row.pop(old) for old, new in _V1_SCHEDULE.items() if old in row}
    if entries is None:
        row["batch_schedule"] = None
    else:
        if not isinstance(entries, list):
            d.fail(f"{d.name('batch_schedule')} is not a list of phases")
        row["batch_schedule"] = {**sched, "phases": entries}
    return row
