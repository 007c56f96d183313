"""The plan file's one validator: ``plan_from_dict`` reads a parsed plan into a typed ``Plan``.

Every field is checked once, here, for every reader (``kplan launch --plan``, ``kplan simulate
--plan``, ``kplan report``): types (a bool is not a number, ``"false"`` is not a bool), finite
numbers inside sane bounds, the enums (market, zone type, precision, objective), and the
counts that must agree (a row's nodes are its groups', its workers their GPUs, its global batch
at least one sample per worker, a p90 at least its expected value). Work that grows with a plan
is bounded: at most ``MAX_ROWS`` rows, ``MAX_GROUPS`` groups and ``MAX_PHASES`` phases.

A plan of the previous schema (``kplan.plan/1.x``: flat ``batch_schedule_*`` and spot fields) is
migrated to the nested records; any other schema is refused with one line and a hint.
``check_against_catalog`` checks a row's cloud, region and instance types against a catalog.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn, get_args

from kplan.core import flags
from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.core.precision import PRECISIONS
from kplan.planner.catalog import Catalog
from kplan.planner.plan import (
    PLAN_SCHEMA,
    BatchSchedule,
    Group,
    LocalMachine,
    Objective,
    Plan,
    PlanRow,
    SchedulePhase,
    SpotTerms,
)
from kplan.planner.spot import RecoveryPolicy

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
OBJECTIVE_NAMES: tuple[str, ...] = get_args(Objective)
TERM_KEYS = 16  # entries of a row's ``terms``


class _Doc:
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

    def sub(self, key: str, value: object) -> _Doc:
        return _Doc(value, self.name(key), self.source)


# --------------------------------------------------------------------------------- the schema


def plan_from_dict(doc: object, source: str = "plan") -> Plan:
    """The typed plan in ``doc``; a ``kplan.plan/1.x`` document is migrated first."""
    if not isinstance(doc, dict):
        raise DataFileError(f"{source}: not a kplan plan (not a JSON object)", hint=HINT)
    schema = doc.get("schema")
    if not isinstance(schema, str) or not schema.startswith("kplan.plan/"):
        raise DataFileError(
            f"{source}: not a kplan plan (schema {str(schema)[:40]!r})",
            hint="write one with kplan estimate ... --out plan.json",
        )
    major = schema.partition("/")[2].split(".")[0]
    if major == "1":
        doc = migrate_v1(doc, source)
    elif major != PLAN_SCHEMA.partition("/")[2].split(".")[0]:
        raise SchemaVersionError(
            f"{source}: plan schema {schema[:40]} is not supported",
            hint=f"this kplan reads {PLAN_SCHEMA} and kplan.plan/1.x; {HINT}",
        )
    d = _Doc(doc, "", source)
    rows = {k: [_row(d.sub(f"{k}[{i}]", r)) for i, r in enumerate(d.items(k, MAX_ROWS))]
            for k in ("plans", "frontier")}  # fmt: skip
    notes = d.items("notes", MAX_ROWS, [])
    if not all(isinstance(n, str) and len(n) <= MAX_TEXT for n in notes):
        d.fail("notes are not a list of texts")
    assumptions = d.get("assumptions", {})
    if not isinstance(assumptions, dict):
        d.fail("assumptions are not a JSON object")
    local = doc.get("local")
    return Plan(
        chosen=_row(d.sub("chosen", d.get("chosen"))),
        plans=tuple(rows["plans"]),
        frontier=tuple(rows["frontier"]),
        objective=d.choice("objective", OBJECTIVE_NAMES),  # type: ignore[arg-type]
        reason=d.text("reason", ""),
        considered=d.integer("considered", 0, 2**62),
        feasible=d.integer("feasible", 0, 2**62),
        notes=tuple(notes),
        uncertainty=d.text("uncertainty", ""),
        precision=d.choice("precision", PRECISIONS, "fp32"),
        precision_basis=d.text("precision_basis", "measured"),
        tie_tolerance=d.number("tie_tolerance", 0.0, 1.0, default=0.05),
        order=d.text("order", ""),
        profile=d.text("profile", ""),
        catalog=d.text("catalog", ""),
        assumptions=assumptions,
        next_command=d.text("next_command", ""),
        local=None if local is None else _local(d.sub("local", local)),
    )


def _local(d: _Doc) -> LocalMachine:
    gpus = d.items("gpus", 1024, [])
    if not all(isinstance(g, str) for g in gpus):
        d.fail(f"{d.name('gpus')} is not a list of names")
    return LocalMachine(
        cpu=d.text("cpu", ""),
        cores=d.integer("cores", 1, 2**20, 1),
        gpus=tuple(gpus),
        work=d.text("work", ""),
        start_s=d.number("start_s", 0.0, flags.MAX_SECONDS, default=0.0),
        log_sigma=d.number("log_sigma", 0.0, 100.0, default=0.0),
    )


def _row(d: _Doc) -> PlanRow:
    cloud = d.choice("cloud", CLOUDS)
    groups = d.items("groups", MAX_GROUPS)
    if not groups:
        d.fail(f"{d.name('groups')} is empty: a row has 1 to {MAX_GROUPS} groups")
    typed = tuple(_group(d.sub(f"groups[{i}]", g)) for i, g in enumerate(groups))
    nodes = d.integer("nodes", 1, flags.MAX_NODES)
    if nodes != sum(g.nodes for g in typed):
        d.fail(f"{d.name('nodes')} {nodes} is not the sum of its groups' nodes")
    workers = d.integer("workers", 1, flags.MAX_NODES * MAX_GPUS_PER_NODE)
    if workers != sum(g.nodes * g.gpus_per_node for g in typed):
        d.fail(f"{d.name('workers')} {workers} is not its groups' nodes x GPUs")
    batch = d.integer("global_batch", 1, flags.MAX_BATCH)
    if batch < workers:
        d.fail(f"{d.name('global_batch')} {batch} is below its {workers} workers (one each)")
    step = d.number("step_time_s", 0.0, flags.MAX_SECONDS, open_low=True)
    hours = d.number("hours", 0.0, flags.MAX_HOURS, open_low=True)
    cost = d.number("cost_usd", 0.0, flags.MAX_USD)
    spot = _spot(d.sub("spot", d.get("spot", {})))
    closed = spot.recovery is None  # no Monte-Carlo: the closed form's p90 >= its mean
    market = d.choice("market", ROW_MARKETS)
    if market != "mixed" and any(g.market != market for g in typed):
        d.fail(f"{d.name('market')} {market!r} is not its groups' market")
    return PlanRow(
        cloud=cloud,
        region=d.word("region"),
        zone=d.word("zone"),
        instance_type=d.word("instance_type"),
        market=market,
        nodes=nodes,
        workers=workers,
        local_batch=d.integer("local_batch", 1, flags.MAX_BATCH),
        accum_steps=d.integer("accum_steps", 1, flags.MAX_BATCH),
        global_batch=batch,
        step_time_s=step,
        step_time_p90_s=_p90(d, "step_time_p90_s", step, flags.MAX_SECONDS),
        steps=d.integer("steps", 1, flags.MAX_SAMPLES),
        samples=d.number("samples", 0.0, flags.MAX_SAMPLES, open_low=True),
        statistical_efficiency=d.number("statistical_efficiency", 0.0, 1.0, open_low=True),
        throughput_samples_s=d.number("throughput_samples_s", 0.0, 1e15, open_low=True),
        hours=hours,
        hours_p90=_p90(d, "hours_p90", hours, flags.MAX_HOURS, closed),
        cost_usd=cost,
        cost_p90_usd=_p90(d, "cost_p90_usd", cost, flags.MAX_USD, closed),
        usd_per_hour=d.number("usd_per_hour", 0.0, flags.MAX_USD),
        expected_preemptions=d.number("expected_preemptions", 0.0, 1e9),
        checkpoint_interval_s=d.number("checkpoint_interval_s", 0.0, flags.MAX_SECONDS),
        groups=typed,
        gpu=d.text("gpu", empty=False),
        precision=d.choice("precision", PRECISIONS, "fp32"),
        terms=_terms(d),
        spot=spot,
        zone_type=d.choice("zone_type", ZONE_TYPES, "availability-zone"),
        forecast_log_sigma=d.number("forecast_log_sigma", 0.0, 100.0, default=0.0),
        schedule=_schedule(d, batch),
        compression=d.word("compression", "none"),
        compression_why=d.text("compression_why", ""),
    )


def _p90(d: _Doc, key: str, value: float, high: float, ordered: bool = True) -> float:
    """A p90 in (0, high]; ``ordered``: at least its expected value (a closed form's p90; a
    Monte-Carlo's mean may lie above its p90 when a few runs wait very long)."""
    p90 = d.number(key, 0.0, high, open_low=value > 0)
    if ordered and p90 < value * (1 - 1e-9):
        d.fail(f"{d.name(key)} {p90:g} is below its expected value {value:g}")
    return p90


def _group(d: _Doc) -> Group:
    return Group(
        instance_type=d.word("instance_type"),
        market=d.choice("market", GROUP_MARKETS),
        zone=d.word("zone"),
        nodes=d.integer("nodes", 1, flags.MAX_NODES),
        gpus_per_node=d.integer("gpus_per_node", 1, MAX_GPUS_PER_NODE),
        gpu=d.text("gpu", empty=False),
        local_batch=d.integer("local_batch", 1, flags.MAX_BATCH),
        usd_per_hour=d.number("usd_per_hour", 0.0, flags.MAX_USD),
    )


def _terms(d: _Doc) -> dict[str, str]:
    terms = d.get("terms", {})
    if not (
        isinstance(terms, dict)
        and len(terms) <= TERM_KEYS
        and all(isinstance(k, str) and isinstance(v, str) for k, v in terms.items())
    ):
        d.fail(f"{d.name('terms')} is not an object of texts")
    return dict(terms)


def _spot(d: _Doc) -> SpotTerms:
    rec = d.get("recovery", None)
    return SpotTerms(
        basis=d.text("basis", "closed form"),
        fail_prob=d.number("fail_prob", 0.0, 1.0, default=0.0),
        model=d.text("model", ""),
        on_demand_cost_usd=d.optional_number("on_demand_cost_usd", 0.0, flags.MAX_USD),
        on_demand_hours=d.optional_number("on_demand_hours", 0.0, flags.MAX_HOURS),
        recovery=None if rec is None else _recovery(d.sub("recovery", rec)),
    )


def _recovery(d: _Doc) -> RecoveryPolicy:
    base = RecoveryPolicy()
    return RecoveryPolicy(
        restart_s=d.number("restart_s", 0.0, flags.MAX_SECONDS, default=base.restart_s),
        provisioning_s=d.number(
            "provisioning_s", 0.0, flags.MAX_SECONDS, default=base.provisioning_s
        ),
        checkpoint_interval_s=d.number(
            "checkpoint_interval_s",
            0.0,
            flags.MAX_SECONDS,
            open_low=True,
            default=base.checkpoint_interval_s,
        ),
        checkpoint_s=d.number("checkpoint_s", 0.0, flags.MAX_SECONDS, default=base.checkpoint_s),
        max_replacements=d.integer("max_replacements", 0, 10**6, base.max_replacements),
        capacity_wait_s=d.number(
            "capacity_wait_s", 0.0, flags.MAX_SECONDS, default=base.capacity_wait_s
        ),
        allow_on_demand=d.boolean("allow_on_demand", base.allow_on_demand),
        zone_failover=d.boolean("zone_failover", base.zone_failover),
    )


def _schedule(d: _Doc, single_batch: int) -> BatchSchedule | None:
    raw = d.get("batch_schedule", None)
    if raw is None:
        return None
    s = d.sub("batch_schedule", raw)
    phases = s.items("phases", MAX_PHASES)
    if not phases:
        s.fail(f"{s.name('phases')} is empty")
    typed: list[SchedulePhase] = []
    for i, ph in enumerate(phases):
        p = s.sub(f"phases[{i}]", ph)
        at = p.number("progress", 0.0, 1.0)
        if typed and at <= typed[-1].progress:
            p.fail(f"{p.name('progress')} {at:g} does not follow the phase before")
        typed.append(SchedulePhase(at, p.integer("global_batch", 1, flags.MAX_BATCH)))
    if typed[0].progress != 0.0:
        s.fail(f"{s.name('phases')} do not start at progress 0")
    hours = s.number("hours", 0.0, flags.MAX_HOURS, open_low=True)
    cost = s.number("cost_usd", 0.0, flags.MAX_USD)
    return BatchSchedule(
        phases=tuple(typed),
        hours=hours,
        cost_usd=cost,
        hours_p90=_p90(s, "hours_p90", hours, flags.MAX_HOURS, ordered=False),
        cost_p90_usd=_p90(s, "cost_p90_usd", cost, flags.MAX_USD, ordered=False),
        forecast_log_sigma=s.number("forecast_log_sigma", 0.0, 100.0, default=0.0),
        saving=s.number("saving", -1.0, 1.0, default=0.0),
    )


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
    d = _Doc(doc, "", source)
    for key in ("plans", "frontier"):
        out[key] = [_v1_row(d.sub(f"{key}[{i}]", r)) for i, r in enumerate(d.items(key, MAX_ROWS))]
    out["chosen"] = _v1_row(d.sub("chosen", d.get("chosen")))
    return out


def _v1_row(d: _Doc) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------- the catalog


def check_against_catalog(row: PlanRow, catalog: Catalog, source: str, where: str) -> None:
    """The row's cloud, region and instance types are ``catalog``'s, each group within its
    type's GPUs (a local row names this machine: nothing to check)."""
    if row.cloud == "local":
        return
    hint = f"plan again with this catalog (kplan estimate ... --out), or {HINT}"
    prefix = f"{source}: the plan's {where}"
    regions = {o.region for o in catalog.offers if o.cloud == row.cloud}
    if row.region not in regions:
        raise DataFileError(
            f"{prefix}.region {row.region[:40]!r} is not a region of {row.cloud} in catalog "
            f"{catalog.version}",
            hint=hint,
        )
    for i, g in enumerate(row.groups):
        inst = catalog.instances.get((row.cloud, g.instance_type))
        if inst is None:
            raise DataFileError(
                f"{prefix}.groups[{i}].instance_type {g.instance_type[:40]!r} is not a type "
                f"of {row.cloud} in catalog {catalog.version}",
                hint=hint,
            )
        if g.gpus_per_node > inst.gpu_count:
            raise DataFileError(
                f"{prefix}.groups[{i}].gpus_per_node {g.gpus_per_node} is more than "
                f"{g.instance_type}'s {inst.gpu_count} GPUs",
                hint=hint,
            )


def row_at(plan: Plan, index: int | None, source: str) -> tuple[PlanRow, str]:
    """``plans[index]`` (or the chosen row) and its name for messages."""
    if index is None:
        return plan.chosen, "chosen"
    if not 0 <= index < len(plan.plans):
        from kplan.core.errors import InputError

        raise InputError(
            f"{source}: the plan has no row {index}",
            hint=f"--row takes 0..{max(len(plan.plans) - 1, 0)}; {HINT}",
        )
    return plan.plans[index], f"plans[{index}]"
