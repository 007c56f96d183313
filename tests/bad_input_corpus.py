"""The bad-input corpus: argv and files for every command and every input file kind, with the
exit code and a piece of the message each must give (issue 10, item 9).

A case's ``argv`` may name ``{d}`` (the case's own folder). ``files`` maps a name in ``{d}`` to
its content: text, bytes, a ``Mut`` of a valid base document (``profile``, ``model``, ``plan``),
or a special: ``FIFO``, ``DIR``, ``HUGE`` (a 65 MiB sparse file), ``DEEP`` (200,000-deep nested
JSON). ``home`` sets up ``$KPLAN_HOME``: ``job`` (a database with one finished local job),
``corrupt`` (that database with garbage over a page mid-file), ``foreign`` (someone else's
SQLite file), ``text`` (not SQLite), ``magic`` (SQLite's header, then garbage), ``dir`` and
``fifo`` (kplan.db is a folder or a FIFO), ``readonly`` (``job`` on a read-only mount),
``batch0`` (``job`` whose step records hold a global batch of 0).
``env`` sets environment variables for the run (``KPLAN_AWS_IMAGE``, ``PYTHONIOENCODING``);
a ``files`` name may hold ``/`` (its folders are made). ``catalog-1e300`` is a user catalog (the
shipped one) whose p3.2xlarge prices are 1e300.
``sub`` runs the case in a subprocess with a timeout (a device, a FIFO that SQLite would open,
a read-only mount); the others run in-process under a SIGALRM timeout.

Generated families cover every numeric flag x {nan, inf, -inf, -1, 0, 1e308, a 31-digit
integer, abc}, every profile/model/plan/CSV field x wrong types and absurd sizes, and every file
slot x {FIFO, /dev/zero, folder, missing, 65 MiB, deep nesting, binary, empty, ...};
hand-written cases reproduce each example the issue lists. tests/data/bad_input_baseline.json
lists the cases kplan mishandled before issue 10 (measured by running this corpus on 7159eeb).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

FIFO = "<fifo>"
DIR = "<dir>"
HUGE = "<huge>"
DEEP = "<deep>"
DELETE = object()
JOB = "kp-corpus-done"
JOB2 = "kp-corpus-dead"  # the second job of the ``two-jobs`` home


@dataclass(frozen=True)
class Mut:
    """A valid base document (``profile``, ``model``, ``plan``; ``plan_v1`` and ``local_plan_v1``:
    plans saved by the release before the plan schema 2.0, tests/fixtures/) with one field set to
    ``value`` (``DELETE`` removes it); ``raw`` is spliced in as JSON text (for 400-digit
    integers, NaN)."""

    base: str
    path: tuple[str | int, ...] = ()
    value: Any = None
    raw: str | None = None
    # further fields set alike, (path, value) each: a case that must keep the rest consistent
    more: tuple[tuple[tuple[str | int, ...], Any], ...] = ()


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    match: str = ""
    files: dict[str, Any] = field(default_factory=dict)
    home: str | None = None
    sub: bool = False
    env: dict[str, str] = field(default_factory=dict)  # set for the run (issue 24)


MEASUREMENTS = (
    "nodes,workers,local_batch,step_time\n"
    "1,1,8,0.010\n1,1,16,0.018\n1,1,32,0.034\n1,2,16,0.021\n1,4,16,0.024\n2,8,16,0.040\n"
)
CONFIGS = "nodes,workers,local_batch\n1,1,16\n2,8,32\n"
FIT_OVER_TYPE = "nodes,workers,local_batch,step_time,instance_type\n" + "".join(
    f"1,8,{b},{b / 1000},g4dn.12xlarge\n" for b in (8, 16)
)
FIT_GPU_NOT_TYPE = "nodes,workers,local_batch,step_time,gpu,instance_type\n" + "".join(
    f"1,1,{b},{b / 1000},T4,p3.2xlarge\n" for b in (8, 16)
)
SCRIPT = "print('hello')\n"
SPOT_PLAN = Mut("plan", ("chosen", "market"), "spot")
SIM = ("simulate", "--plan", "{d}/p.json", "--trace", "{d}/t.csv")
ATTACH = ("attach", "kp-corpus-far", "--storage", "{d}/bucket")
SNAPSHOT = "bucket/kp-corpus-far/state/snapshot.json"  # the controller's (launcher/snapshot.py)
TRACE = "# end_s=36000\ntime_s,event,node\n0,add,a\n0,add,b\n1800,remove,a\n2000,add,c\n"
TRACE_ZONE = "# end_s=36000\ntime_s,event,node,zone\n0,add,a,us-west-2a\n"
SIM2 = ("simulate", "--plan", "{d}/p.json", "--trace", "us-east-1={d}/t.csv")  # several pools
# Work that grows with a trace (issue 24): 40,000 events at the default --runs, and GCP counts
# that flip between 0 and a million VMs (a million adds or removes per row).
TRACE_40K = "# end_s=400000\ntime_s,event,node\n" + "".join(
    f"{i * 9},add,n{i}\n" for i in range(40_000)
)
COUNTS_FLIP = "".join(f"2024-01-01, 00:{i:02d}:00, {(i % 2) * 10**6}\n" for i in range(40))

# Values for numeric flags; each maps to the expected exit code per flag kind below.
FLAG_VALUES = ("nan", "inf", "-inf", "-1", "0", "1e308", "1" + "0" * 30, "abc")
# Bad JSON values for a numeric field: (label, python value or raw JSON text).
BAD_FIELD = (
    ("str", "abc", None),
    ("bool", True, None),
    ("null", None, None),
    ("neg", -1, None),
    ("zero", 0, None),
    ("1e308", None, "1e308"),
    ("int400", None, "1" * 400),
    ("inf", None, "Infinity"),
    ("nan", None, "NaN"),
    ("list", [1], None),
    ("object", {"a": 1}, None),
)


def _flag_cases() -> list[Case]:
    out: list[Case] = []
    est = ("estimate", "--example", "cifar10-resnet18")
    # (command prefix, flag, kind, suffix); kind: float>0, int>=1, int>=0, float>=0
    specs: list[tuple[str, tuple[str, ...], str, str, tuple[str, ...]]] = [
        ("estimate", est, "--epochs", "pos", ()),
        ("estimate", est, "--dataset-size", "int1", ()),
        ("estimate", est, "--budget", "pos", ()),
        ("estimate", est, "--deadline", "pos", ()),
        ("estimate", est, "--max-nodes", "int1", ()),
        ("estimate", est, "--top", "int1", ()),
        ("estimate", est, "--capacity-wait", "pos", ()),
        ("estimate", est, "--data-gb", "nonneg", ()),
        ("simulate", ("simulate", "--plan", "{d}/p.json", "--trace", "{d}/t.csv"), "--runs",
         "int1", ()),
        ("simulate", ("simulate", "--plan", "{d}/p.json", "--trace", "{d}/t.csv"), "--row",
         "int0", ()),
        ("simulate", ("simulate", "--plan", "{d}/p.json", "--trace", "{d}/t.csv"),
         "--copy-gbps", "pos", ()),
        ("simulate", ("simulate", "--plan", "{d}/p.json", "--trace", "{d}/t.csv"),
         "--checkpoint-gb", "nonneg", ()),
        ("model fit", ("model", "fit", "-m", "{d}/m.csv", "--out", "{d}/model.json"),
         "--gradient-bytes", "pos", ()),
        ("model fit", ("model", "fit", "-m", "{d}/m.csv", "--out", "{d}/model.json"),
         "--intra-gbps", "pos", ()),
        ("model fit", ("model", "fit", "-m", "{d}/m.csv", "--out", "{d}/model.json"),
         "--inter-gbps", "pos", ()),
        ("status", ("status",), "--interval", "pos", ()),
        ("down", ("down", JOB), "--wait", "nonneg", ()),
        ("logs", ("logs", JOB), "--node", "int0", ()),
        ("catalog list", ("catalog", "list"), "--max-price", "pos", ("--json",)),
    ]  # fmt: skip
    prof = ("profile", "--example", "mlp-regression")
    for flag in ("--timeout", "--startup-timeout", "--step-timeout", "--epochs"):
        specs.append(("profile", prof, flag, "pos", ()))
    for flag in ("--workers", "--min-local-batch", "--max-local-batch", "--steps", "--gns-batch",
                 "--base-batch", "--dataset-size"):  # fmt: skip
        specs.append(("profile", prof, flag, "int1", ()))
    for flag in ("--warmup-steps", "--gns-steps"):
        specs.append(("profile", prof, flag, "int0", ()))
    launch = ("launch", "{d}/train.py", "--dry-run")
    for flag, kind in (
        ("--deadline", "pos"),
        ("--nodes", "int1"),
        ("--workers-per-node", "int1"),
        ("--check-interval", "pos"),
        ("--replan-interval", "pos"),
        ("--checkpoint-interval", "pos"),
        ("--max-restarts", "int0"),
        ("--explore-trials", "int1"),
        ("--max-nodes", "int1"),
        ("--max-replacements", "int0"),
        ("--capacity-wait", "nonneg"),
        ("--price", "nonneg"),
        ("--data-gb", "nonneg"),
        ("--lease-minutes", "pos"),
        ("--idle-minutes", "pos"),
    ):
        specs.append(("launch", (*launch, "--budget", "1"), flag, kind, ()))
    specs.append(("launch", launch, "--budget", "nonneg", ()))
    for command, prefix, flag, kind, suffix in specs:
        for value in FLAG_VALUES:
            code, match = 2, flag
            is_int = kind.startswith("int")
            if is_int and value in ("nan", "inf", "-inf", "1e308", "abc"):
                match = "Invalid value"  # click's own usage error
            elif value == "0" and kind in ("nonneg", "int0"):
                code, match = 0, ""
            elif (
                command == "launch"
                and value in ("-1", "0")
                and ("interval" in flag or "restarts" in flag)
            ):
                match = "must be"  # JobSpec's own message names the field its way
            elif command == "launch" and value in ("-1", "0") and flag == "--max-nodes":
                match = "below the job's"
            if code == 0 and command == "profile":
                continue  # a valid profile flag would run the profiler
            if code == 0 and command in ("down", "simulate"):
                continue  # covered by the job cases below / by tests/test_simulate_cli.py
            files: dict[str, Any] = {}
            if command == "model fit":
                files["m.csv"] = MEASUREMENTS
            if command == "launch":
                files["train.py"] = SCRIPT
            home = "job" if command in ("down", "logs") else None
            # Mishandled before issue 10: inf/huge went through (or hung), nan on --timeout.
            out.append(
                Case(
                    f"flag-{command.replace(' ', '-')}{flag}={value[:8]}",
                    (*prefix, flag, value, *suffix),
                    code,
                    match,
                    files=files,
                    home=home,
                )
            )
    return out


def _file_slots() -> list[tuple[str, str, tuple[str, ...], dict[str, Any], str | None]]:
    """(name, kind, argv with {f} for the file under test, other files, home)."""
    s = SCRIPT
    return [
        ("estimate-profile", "json", ("estimate", "--profile", "{f}"), {}, None),
        ("launch-aws-profile", "json",
         ("launch", "{d}/train.py", "--budget", "5", "--cloud", "aws", "--profile", "{f}",
          "--dry-run"), {"train.py": s}, None),
        ("launch-plan", "json",
         ("launch", "{d}/train.py", "--budget", "5", "--plan", "{f}", "--dry-run"),
         {"train.py": s}, None),
        ("model-predict-model", "json",
         ("model", "predict", "--model", "{f}", "-c", "{d}/c.csv"), {"c.csv": CONFIGS}, None),
        ("model-fit-measurements", "csv",
         ("model", "fit", "-m", "{f}", "--out", "{d}/out.json"), {}, None),
        ("model-predict-configs", "csv",
         ("model", "predict", "--model", "{d}/model.json", "-c", "{f}"),
         {"model.json": Mut("model")}, None),
        ("report-profile", "json", ("report", "--all", "--profile", "{f}"), {}, "job"),
        ("launch-script", "script", ("launch", "{f}", "--budget", "1", "--dry-run"), {}, None),
        ("launch-policy", "policy",
         ("launch", "{d}/train.py", "--budget", "1", "--policy", "{f}:Stop", "--dry-run"),
         {"train.py": s}, None),
        ("profile-script", "script", ("profile", "{f}"), {}, None),
        ("catalog-dir", "catalog", ("catalog", "list", "--catalog", "{f}"), {}, None),
        ("simulate-plan", "json", ("simulate", "--plan", "{f}", "--trace", "{d}/t.csv"),
         {"t.csv": TRACE}, None),
        ("simulate-trace", "trace", ("simulate", "--plan", "{d}/p.json", "--trace", "{f}"),
         {"p.json": Mut("plan")}, None),
    ]  # fmt: skip


def _special_contents(kind: str) -> list[tuple[str, Any, str]]:
    """(label, content, message piece) for a file slot of ``kind``."""
    out: list[tuple[str, Any, str]] = [
        ("fifo", FIFO, ""),
        ("devzero", "/dev/zero", ""),
        ("dir", DIR, ""),
        ("missing", None, ""),
    ]
    if kind in ("json", "csv"):
        out += [
            ("huge", HUGE, "bytes"),
            ("binary", b"\x00\xff\xfe\x80garbage\x00" * 50, ""),
            ("empty", "", ""),
            ("latin1", "na\xefve,\xe9\n".encode("latin-1"), "UTF-8"),
        ]
    if kind == "json":
        out += [
            ("deep", DEEP, "nested"),
            ("deep-objects", '{"a":' * 5000 + "1" + "}" * 5000, "nested"),
            ("array", "[1, 2, 3]", ""),
            ("null", "null", ""),
            ("nan", "NaN", ""),
            ("int400", "1" * 400, ""),
            ("truncated", '{"schema": "kplan.profile/1.0", "name": ', "JSON"),
            ("csv-as-json", MEASUREMENTS, "JSON"),
        ]
    if kind == "csv":
        out += [
            ("header-only", "nodes,workers,local_batch\n", ""),
            ("json-as-csv", '{"a": 1}\n', "column"),
            ("nul-bytes", "nodes,workers\x00,local_batch\n1,1,1\n", ""),
        ]
    return out


def _file_cases() -> list[Case]:
    out = []
    for slot, kind, argv, others, home in _file_slots():
        for label, content, message in _special_contents(kind):
            match = message
            name = "f.py" if kind in ("script", "policy") else f"f.{kind}"
            files = dict(others)
            path = "{d}/" + name
            if content == "/dev/zero":
                path = "/dev/zero"
            elif content is not None:
                files[name] = content
            if kind == "catalog" and label in ("dir",):
                files[name] = DIR  # an empty folder: a catalog with no files
            code = 2
            if kind == "script" and slot == "launch-script" and label == "dir":
                match = "not found"
            out.append(
                Case(
                    f"file-{slot}-{label}",
                    tuple(a.replace("{f}", path) for a in argv),
                    code,
                    match,
                    files=files,
                    home=home,
                    sub=content == "/dev/zero",  # a FIFO is cut by SIGALRM in-process
                )
            )
    return out


_PROFILE_FIELDS = (
    ("device", "gpus_per_node"),
    ("model", "gradient_bytes"),
    ("batch", "base_global_batch"),
    ("batch", "max_local_batch"),
    ("work", "dataset_size"),
    ("work", "epochs"),
    ("measurements", 0, "nodes"),
    ("measurements", 0, "workers"),
    ("measurements", 0, "local_batch"),
    ("measurements", 0, "step_time"),
)
_MODEL_FIELDS = ("compute_a", "compute_b", "gamma", "inter_beta", "log_sigma", "two_node")


# What the JSON reader says of a number no field may hold (it names no field: it stops parsing).
_RAW_MESSAGE = {
    "1e308": "out of range",
    "int400": "too large",
    "inf": "not a number kplan accepts",
    "nan": "not a number kplan accepts",
}


def _field_cases() -> list[Case]:
    out = []
    for path in _PROFILE_FIELDS:
        name = ".".join(str(p) for p in path)
        for label, value, raw in BAD_FIELD:
            out.append(
                Case(
                    f"profile-{name}={label}",
                    ("estimate", "--profile", "{d}/p.json"),
                    2,
                    _RAW_MESSAGE.get(label, str(path[-1])),
                    files={"p.json": Mut("profile", path, value, raw)},
                )
            )
    for key in _MODEL_FIELDS:
        for label, value, raw in BAD_FIELD:
            valid = label == "zero" and key != "gamma"  # 0 s (or no overlap) is a valid term
            out.append(
                Case(
                    f"model-{key}={label}",
                    ("model", "predict", "--model", "{d}/model.json", "-c", "{d}/c.csv"),
                    0 if valid else 2,
                    "" if valid else _RAW_MESSAGE.get(label, key),
                    files={"model.json": Mut("model", (key,), value, raw), "c.csv": CONFIGS},
                )
            )
    # CSV cells: measurements (fit) and configurations (predict).
    cells = ("abc", "nan", "inf", "-1", "0", "1e308", "1" * 400, "", "2.5", "1e9")
    for col, idx in (("nodes", 0), ("workers", 1), ("local_batch", 2), ("step_time", 3)):
        for value in cells:
            if col == "step_time" and value in ("2.5",):
                continue  # a valid step time
            cell = "1e8" if col == "step_time" and value == "1e9" else value  # > any step
            rows = MEASUREMENTS.splitlines()
            first = rows[1].split(",")
            first[idx] = cell
            rows[1] = ",".join(first)
            out.append(
                Case(
                    f"csv-measurements-{col}={cell[:8] or 'empty'}",
                    ("model", "fit", "-m", "{d}/m.csv", "--out", "{d}/o.json"),
                    2,
                    col,
                    files={"m.csv": "\n".join(rows) + "\n"},
                )
            )
    for col, idx in (("nodes", 0), ("workers", 1), ("local_batch", 2)):
        for cell in cells:
            rows = CONFIGS.splitlines()
            first = rows[1].split(",")
            first[idx] = cell
            rows[1] = ",".join(first)
            match = col if not (col == "nodes" and cell in ("2.5",)) else ""
            if col == "workers" and cell in ("2.5",):
                match = ""
            out.append(
                Case(
                    f"csv-configs-{col}={cell[:8] or 'empty'}",
                    ("model", "predict", "--model", "{d}/model.json", "-c", "{d}/c.csv"),
                    2,
                    match,
                    files={"model.json": Mut("model"), "c.csv": "\n".join(rows) + "\n"},
                )
            )
    # Absurd but well-typed sizes (the issue: "nodes: 10000000 hangs").
    big = 10_000_000
    for path in (("measurements", 0, "nodes"), ("measurements", 0, "workers"),
                 ("device", "gpus_per_node"), ("batch", "max_local_batch")):  # fmt: skip
        name = ".".join(str(p) for p in path)
        code = 0 if path[-1] == "max_local_batch" else 2  # 10**7 < 2**24: a valid batch cap
        out.append(
            Case(f"profile-{name}=10M", ("estimate", "--profile", "{d}/p.json"), code,
                 "" if code == 0 else str(path[-1]), files={"p.json": Mut("profile", path, big)})
        )  # fmt: skip
    out.append(
        Case("plan-chosen.groups.0.nodes=10M",
             ("launch", "{d}/train.py", "--budget", "5", "--plan", "{d}/plan.json", "--dry-run"),
             2, "nodes", files={"plan.json": Mut("plan", ("chosen", "groups", 0, "nodes"), big),
                                "train.py": SCRIPT})
    )  # fmt: skip
    # Plan fields (launch --plan ... --dry-run).
    plan_fields: list[tuple[str | int, ...]] = [
        (k,) for k in ("nodes", "global_batch", "usd_per_hour", "cost_usd", "hours",
                       "accum_steps", "groups")
    ]  # fmt: skip
    plan_fields += [("groups", 0, k) for k in ("nodes", "gpus_per_node", "usd_per_hour")]
    for fkey in plan_fields:
        plan_path = ("chosen", *fkey)
        for label, value, raw in BAD_FIELD:
            if label == "zero" and plan_path[-1] in ("usd_per_hour", "cost_usd", "hours"):
                continue  # zero is a valid number there (the price is re-read anyway)
            if label == "null" and plan_path == ("chosen", "usd_per_hour"):
                continue  # informational: the groups' and the catalog's prices count
            out.append(
                Case(
                    f"plan-{'.'.join(map(str, plan_path))}={label}",
                    ("launch", "{d}/train.py", "--budget", "5", "--plan", "{d}/plan.json",
                     "--dry-run"),
                    2,
                    "",
                    files={"plan.json": Mut("plan", plan_path, value, raw),
                           "train.py": SCRIPT},
                )
            )  # fmt: skip
    return out


def _enum_cases() -> list[Case]:
    est = ("estimate", "--example", "cifar10-resnet18")
    s = {"train.py": SCRIPT}
    rows: list[tuple[str, tuple[str, ...], int, str, dict[str, Any]]] = [
        ("objective-empty", (*est, "--objective", ""), 2, "--objective", {}),
        ("objective-bad", (*est, "--objective", "cheap"), 2, "objective", {}),
        ("cloud-empty", (*est, "--cloud", ""), 2, "--cloud", {}),
        ("cloud-bad", (*est, "--cloud", "azure"), 2, "azure", {}),
        ("gpu-empty", (*est, "--gpu", ""), 2, "--gpu", {}),
        ("region-ctrl", (*est, "--region", "us\x1b[31m"), 2, "--region", {}),
        ("data-region-bad", (*est, "--data-gb", "5", "--data-region", "mars-1"), 2,
         "unknown data region", {}),
        ("data-region-empty", (*est, "--data-region", ""), 2, "--data-region", {}),
        ("launch-data-no-plan-now", ("launch", "{d}/train.py", "--budget", "1", "--data-gb",
                                     "5", "--dry-run"), 2, "--data-gb", s),
        ("example-empty", ("estimate", "--example", ""), 2, "", {}),
        ("example-bad", ("estimate", "--example", "nope"), 2, "nope", {}),
        ("estimate-both", (*est, "--profile", "{d}/p.json"), 2, "exactly one", {}),
        ("estimate-none", ("estimate",), 2, "exactly one", {}),
        ("profile-device-empty", ("profile", "--example", "mlp-regression", "--device", ""), 2,
         "--device", {}),
        ("profile-name-empty", ("profile", "--example", "mlp-regression", "--name", ""), 2,
         "--name", {}),
        ("profile-no-input", ("profile",), 2, "SCRIPT", {}),
        ("profile-not-py", ("profile", "{d}/train.txt"), 2, "Python", {"train.txt": SCRIPT}),
        ("profile-script-needs-sizes", ("profile", "{d}/train.py"), 2, "--dataset-size", s),
        ("launch-cloud-empty", ("launch", "{d}/train.py", "--budget", "1", "--cloud", "",
                                "--dry-run"), 2, "cloud", s),
        ("launch-cloud-bad", ("launch", "{d}/train.py", "--budget", "1", "--cloud", "azure",
                              "--dry-run"), 2, "azure", s),
        ("launch-no-script", ("launch", "--budget", "1"), 2, "", {}),
        ("launch-region-empty", ("launch", "{d}/train.py", "--budget", "1", "--region", "",
                                 "--dry-run"), 2, "--region", s),
        ("launch-job-id-bad", ("launch", "{d}/train.py", "--budget", "1", "--job-id", "Bad Id",
                               "--dry-run"), 2, "job id", s),
        ("launch-example-empty", ("launch", "{d}/train.py", "--budget", "1", "--cloud",
                                  "aws", "--example", "", "--dry-run"), 2, "--example", s),
        # its old name, still read (issue 12)
        ("launch-example-profile-empty", ("launch", "{d}/train.py", "--budget", "1", "--cloud",
                                          "aws", "--example-profile", "", "--dry-run"), 2,
         "--example", s),
        ("launch-example-twice", ("launch", "{d}/train.py", "--budget", "1", "--cloud", "aws",
                                  "--example", "yolov3", "--example-profile", "yolov3",
                                  "--dry-run"), 2, "--example once", s),
        ("launch-cloud-no-budget", ("launch", "{d}/train.py", "--cloud", "aws", "--example",
                                    "yolov3", "--dry-run"), 2, "needs --budget", s),
        ("launch-price-no-budget", ("launch", "{d}/train.py", "--price", "1", "--dry-run"), 2,
         "give --budget", s),
        ("launch-clouds-with-local", ("launch", "{d}/train.py", "--budget", "1", "--cloud", "aws",
                                      "--cloud", "local", "--example", "yolov3", "--dry-run"), 2,
         "--cloud local", s),
        ("launch-regions-no-plan", ("launch", "{d}/train.py", "--budget", "1", "--region", "a",
                                    "--region", "b", "--dry-run"), 2, "--region", s),
        ("launch-local-no-budget-valid", ("launch", "{d}/train.py", "--dry-run"), 0, "", s),
        ("launch-local-cloud-plan", ("launch", "{d}/train.py", "--budget", "1", "--cloud",
                                     "local", "--plan", "{d}/plan.json", "--dry-run"), 2,
         "a local job runs on this machine", {**s, "plan.json": Mut("plan")}),
        ("launch-nodes-100000", ("launch", "{d}/train.py", "--budget", "1", "--nodes", "100000",
                                 "--dry-run"), 2, "--nodes", s),
        ("launch-wpn-10000", ("launch", "{d}/train.py", "--budget", "1", "--workers-per-node",
                              "10000", "--dry-run"), 2, "--workers-per-node", s),
        ("launch-policy-no-file", ("launch", "{d}/train.py", "--budget", "1", "--policy",
                                   "{d}/nope.py:X", "--dry-run"), 2, "no file", s),
        ("launch-local-valid", ("launch", "{d}/train.py", "--budget", "0", "--dry-run"), 0, "",
         s),
        ("catalog-market-empty", ("catalog", "list", "--market", ""), 2, "--market", {}),
        ("catalog-cloud-empty", ("catalog", "list", "--cloud", ""), 2, "--cloud", {}),
        ("catalog-update-cloud-empty", ("catalog", "update", "--cloud", ""), 2, "cloud", {}),
        ("catalog-update-cloud-bad", ("catalog", "update", "--cloud", "azure"), 2, "azure", {}),
        ("catalog-update-region-empty", ("catalog", "update", "--cloud", "aws", "--region", ""),
         2, "--region", {}),
        ("catalog-list-valid", ("catalog", "list", "--cloud", "aws", "--gpu", "T4", "--json"), 0,
         "", {}),
        ("check-cloud-bad", ("check", "--cloud", "azure"), 2, "azure", {}),
        ("check-cloud-empty", ("check", "--cloud", ""), 2, "--cloud", {}),
        ("check-region-empty", ("check", "--cloud", "aws", "--region", ""), 2, "--region", {}),
        ("check-storage-no-cloud", ("check", "--storage", "s3://b/k"), 2, "--storage needs", {}),
        ("check-storage-bad-uri", ("check", "--cloud", "gcp", "--storage", "s3://b/k"), 2,
         "--storage", {}),
        ("logs-node-neg", ("logs", JOB, "--node", "-1"), 2, "--node", {}),
        ("logs-bad-id", ("logs", "../../etc"), 2, "job id", {}),
        ("logs-unknown-job", ("logs", "kp-nope"), 2, "no job", {}),
        ("status-unknown-job", ("status", "kp-nope"), 2, "no job", {}),
        ("report-unknown-job", ("report", "kp-nope"), 2, "no job", {}),
        ("report-neither", ("report",), 2, "--all", {}),
        ("report-against-all", ("report", "--all", "--against", "kp-x"), 2, "not --all", {}),
        ("report-against-unknown", ("report", "kp-nope", "--against", "kp-x"), 2, "no job", {}),
        ("down-neither", ("down",), 2, "--all", {}),
        ("down-bad-id", ("down", "Bad Id"), 2, "job id", {}),
        ("down-unknown-no-cloud", ("down", "kp-nope"), 2, "--cloud", {}),
        # kplan attach: a storage without the job's controller snapshot, or with one that is
        # damaged or another's (issue 26): one line, a hint, nothing written
        ("attach-no-snapshot", ATTACH, 2, "no controller state snapshot",
         {"bucket/kp-corpus-far/logs/node-0.log": "hi\n"}),
        ("attach-empty-folder", ("attach", "kp-corpus-far", "--storage", "{d}"), 2,
         "no controller state snapshot", {}),
        ("attach-snapshot-damaged", ATTACH, 2, "not JSON",
         {SNAPSHOT: '{"format": "kplan-state-snapshot/1", "job_'}),
        ("attach-snapshot-empty", ATTACH, 2, "not JSON", {SNAPSHOT: ""}),
        ("attach-snapshot-binary", ATTACH, 2, "not JSON", {SNAPSHOT: b"\xff\xfe\x00snap"}),
        ("attach-snapshot-foreign", ATTACH, 2, "format 'other/1'",
         {SNAPSHOT: '{"format": "other/1", "job_id": "kp-corpus-far"}'}),
        ("attach-snapshot-other-job", ATTACH, 2, "not 'kp-corpus-far''s",
         {SNAPSHOT: '{"format": "kplan-state-snapshot/1", "job_id": "kp-corpus-near"}'}),
        ("attach-snapshot-fields", ATTACH, 2, "missing or of the wrong type",
         {SNAPSHOT: '{"format": "kplan-state-snapshot/1", "job_id": "kp-corpus-far", '
                    '"seq": "many"}'}),
        ("attach-snapshot-dir", ATTACH, 2, "no controller state snapshot", {SNAPSHOT: DIR}),
        ("attach-storage-bad", ("attach", "kp-corpus-far", "--storage", "ftp://h/x"), 2,
         "not a job storage URI", {}),
        ("attach-storage-empty", ("attach", "kp-corpus-far", "--storage", ""), 2,
         "not a job storage URI", {}),
        ("attach-storage-bucketless", ("attach", "kp-corpus-far", "--storage", "s3://"), 2,
         "not a job storage URI", {}),
        ("attach-bad-id", ("attach", "../../etc", "--storage", "{d}"), 2, "job id", {}),
        ("attach-no-storage", ("attach", "kp-corpus-far"), 2, "--storage", {}),
        # kplan simulate: traces that are not traces, plans it cannot replay (issue 11)
        ("simulate-no-trace", ("simulate", "--plan", "{d}/p.json"), 2, "exactly one",
         {"p.json": SPOT_PLAN}),
        ("simulate-two-traces", (*SIM, "--example-trace", "p3"), 2, "exactly one",
         {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        ("simulate-example-trace-bad", ("simulate", "--plan", "{d}/p.json", "--example-trace",
                                        "p9"), 2, "p9", {"p.json": SPOT_PLAN}),
        ("simulate-format-bad", (*SIM, "--format", "parquet"), 2, "--format",
         {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        ("simulate-trace-unsorted", SIM, 2, "",
         {"p.json": SPOT_PLAN, "t.csv": "time_s,event,node\n5,add,a\n1,remove,a\n"}),
        ("simulate-trace-event", SIM, 2, "event",
         {"p.json": SPOT_PLAN, "t.csv": "time_s,event,node\n0,add,a\n1,explode,a\n"}),
        ("simulate-trace-remove-dead", SIM, 2, "",
         {"p.json": SPOT_PLAN, "t.csv": "time_s,event,node\n0,add,a\n1,remove,b\n"}),
        ("simulate-trace-unknown", SIM, 2, "not a spot trace",
         {"p.json": SPOT_PLAN, "t.csv": "nodes,workers,local_batch\n1,1,1\n"}),
        ("simulate-trace-short", SIM, 2, "the trace spans",
         {"p.json": SPOT_PLAN, "t.csv": "# end_s=600\ntime_s,event,node\n0,add,a\n"}),
        ("simulate-plan-on-demand", SIM, 2, "on demand",
         {"p.json": Mut("plan", ("chosen", "market"), "on-demand",
                        more=((("chosen", "groups", 0, "market"), "on-demand"),)),
          "t.csv": TRACE}),
        ("simulate-plan-no-row", (*SIM, "--row", "9999"), 2, "no row",
         {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        ("simulate-plan-cloud-bad", SIM, 2, "azure",
         {"p.json": Mut("plan", ("chosen", "cloud"), "azure"), "t.csv": TRACE}),
        ("simulate-plan-bad-row", SIM, 2, "chosen.nodes 'four'",
         {"p.json": Mut("plan", ("chosen", "nodes"), "four"), "t.csv": TRACE}),
        ("simulate-bamboo-bad", (*SIM, "--format", "bamboo"), 2, "",
         {"p.json": SPOT_PLAN, "t.csv": "0,add\n"}),
        ("simulate-gcp-bad", (*SIM, "--format", "gcp-counts"), 2, "",
         {"p.json": SPOT_PLAN, "t.csv": "2021-12-11, 11:11:30, many\n"}),
        ("simulate-trace-40k-events", SIM, 2, "more replay work than the bound",
         {"p.json": SPOT_PLAN, "t.csv": TRACE_40K}),
        # kplan simulate over several pools (issue 27 item 3)
        ("simulate-pool-unknown", ("simulate", "--plan", "{d}/p.json", "--trace",
                                   "mars-9={d}/t.csv", "--trace", "us-east-1={d}/t.csv"), 2,
         "unknown pool 'mars-9'",
         {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        ("simulate-pool-zone-mismatch", ("simulate", "--plan", "{d}/p.json", "--trace",
                                         "us-east-2={d}/z.csv", "--trace", "x={d}/t.csv"),
         2, "is of zone us-west-2a", {"p.json": SPOT_PLAN, "z.csv": TRACE_ZONE, "t.csv": TRACE}),
        ("simulate-pool-unnamed", (*SIM2, "--trace", "{d}/t.csv"), 2, "no pool name",
         {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        ("simulate-pool-twice", (*SIM2, "--trace", "us-east-1={d}/t.csv"), 2, "named twice",
         {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        ("simulate-pool-trace-bad", (*SIM2, "--trace", "us-east-2={d}/u.csv"), 2, "event",
         {"p.json": SPOT_PLAN, "t.csv": TRACE, "u.csv": "time_s,event,node\n0,add,a\n1,boom,a\n"}),
        ("simulate-gcp-counts-flip", (*SIM, "--format", "gcp-counts"), 2, "more than 200,000",
         {"p.json": SPOT_PLAN, "t.csv": COUNTS_FLIP}),
        ("model-fit-missing-out", ("model", "fit", "-m", "{d}/m.csv"), 2, "--out",
         {"m.csv": MEASUREMENTS}),
        ("model-fit-valid", ("model", "fit", "-m", "{d}/m.csv", "--out", "{d}/o.json"), 0, "",
         {"m.csv": MEASUREMENTS}),
        ("model-predict-valid", ("model", "predict", "--model", "{d}/model.json", "-c",
                                 "{d}/c.csv"), 0, "step_time",
         {"model.json": Mut("model"), "c.csv": CONFIGS}),
        *[
            (f"model-nodes_measured={label}", ("model", "predict", "--model", "{d}/model.json",
                                               "-c", "{d}/c.csv"), code, match,
             {"model.json": Mut("model", ("nodes_measured",), value), "c.csv": CONFIGS})
            for label, value, code, match in (
                ("valid", [1, 2, 4], 0, "step_time"),
                ("string", "1,2", 2, "nodes_measured"),
                ("zero", [0, 2], 2, "nodes_measured"),
                ("float", [1, 2.5], 2, "nodes_measured"),
                ("empty", [], 2, "nodes_measured"),
                ("duplicates", [2, 2], 2, "nodes_measured"),
                ("bool", [True], 2, "nodes_measured"),
            )
        ],
        ("estimate-profile-valid", ("estimate", "--profile", "{d}/p.json", "--json", "--top",
                                    "2"), 0, "chosen", {"p.json": Mut("profile")}),
        ("estimate-dataset-size-1e30", (*est, "--dataset-size", "1e30"), 2, "Invalid value", {}),
        ("estimate-max-nodes-10M", (*est, "--max-nodes", "10000000"), 2, "--max-nodes", {}),
        ("estimate-top-huge", (*est, "--top", "10000000"), 2, "--top", {}),
        # issue 14: gradient compression
        ("estimate-compression-bad", (*est, "--compression", "zip"), 2, "not a compression", {}),
        ("estimate-compression-empty", (*est, "--compression", ""), 2, "--compression", {}),
        ("estimate-compression-topk-2", (*est, "--compression", "topk:2"), 2, "ratio", {}),
        ("estimate-compression-adaptive", (*est, "--compression", "adaptive"), 2,
         "no fixed price", {}),
        # a measured statistical cost (--compression-steps SPEC=MULT[/SIGMA])
        ("estimate-compression-steps-no-eq", (*est, "--compression-steps", "topk:0.01"), 2,
         "SPEC=MULT", {}),
        ("estimate-compression-steps-word", (*est, "--compression-steps", "topk:0.01=lots"), 2,
         "SPEC=MULT", {}),
        ("estimate-compression-steps-zero", (*est, "--compression-steps", "fp16=0"), 2,
         "multiplier must be", {}),
        ("estimate-compression-steps-nan", (*est, "--compression-steps", "fp16=nan"), 2,
         "multiplier must be", {}),
        ("estimate-compression-steps-sigma-0", (*est, "--compression-steps", "fp16=1.1/0"), 2,
         "SIGMA", {}),
        ("estimate-compression-steps-no-spec", (*est, "--compression-steps", "=1.2"), 2,
         "SPEC=MULT", {}),
        ("estimate-compression-steps-zip", (*est, "--compression-steps", "zip=1.2"), 2,
         "not a compression", {}),
        ("estimate-compression-steps-adaptive", (*est, "--compression-steps", "adaptive=1.2"),
         2, "no fixed price", {}),
        ("estimate-compression-steps-unpriced", (*est, "--compression-steps", "topk:0.2=1.2"),
         2, "does not price", {}),
        ("estimate-compression-steps-not-pinned", (*est, "--compression", "fp16",
                                                   "--compression-steps", "powersgd:4=1.1"),
         2, "does not price", {}),
        # issue 14, item 1: a plan's compression reaches the workers as KPLAN_COMPRESSION
        ("launch-plan-compression-topk-7", ("launch", "{d}/train.py", "--budget", "5", "--plan",
                                            "{d}/p.json", "--dry-run"), 2, "ratio '7'",
         {**s, "p.json": Mut("plan", ("chosen", "compression"), "topk:7")}),
        ("launch-plan-compression-zip", ("launch", "{d}/train.py", "--budget", "5", "--plan",
                                         "{d}/p.json", "--dry-run"), 2, "not a compression",
         {**s, "p.json": Mut("plan", ("chosen", "compression"), "zip")}),
        ("launch-plan-compression-powersgd-0", ("launch", "{d}/train.py", "--budget", "5",
                                                "--plan", "{d}/p.json", "--dry-run"), 2,
         "rank must be an integer", {**s, "p.json": Mut("plan", ("chosen", "compression"),
                                                         "powersgd:0")}),
        # issue 14: launch --compression / --sync-policy, parsed as the workers parse them
        ("launch-compression-topk-2", ("launch", "{d}/train.py", "--compression", "topk:2",
                                       "--dry-run"), 2, "ratio '2'", s),
        ("launch-compression-zip", ("launch", "{d}/train.py", "--compression", "zip",
                                    "--dry-run"), 2, "not a compression", s),
        ("launch-compression-with-plan", ("launch", "{d}/train.py", "--budget", "5", "--plan",
                                          "{d}/p.json", "--compression", "fp16", "--dry-run"),
         2, "priced with", {**s, "p.json": Mut("plan", ("chosen", "compression"), "none")}),
        ("launch-sync-policy-bad", ("launch", "{d}/train.py", "--sync-policy", "sometimes",
                                    "--dry-run"), 2, "not a sync policy", s),
        ("launch-sync-policy-delta-0", ("launch", "{d}/train.py", "--sync-policy",
                                        "selective:0", "--dry-run"), 2, "--sync-policy", s),
        # issue 14, item 2: a profile's gradient shapes and measured codec times
        ("profile-gradient-shapes-abc", ("estimate", "--profile", "{d}/p.json"), 2,
         "model.gradient_shapes",
         {"p.json": Mut("profile", ("model", "gradient_shapes"), "abc")}),
        ("profile-gradient-shapes-mismatch", ("estimate", "--profile", "{d}/p.json"), 2,
         "does not match model.gradient_bytes",
         {"p.json": Mut("profile", ("model", "gradient_shapes"), [[[10, 10], 1]])}),
        ("profile-gradient-shapes-count-10M", ("estimate", "--profile", "{d}/p.json"), 2,
         "gradient_shapes[0][1]",
         {"p.json": Mut("profile", ("model", "gradient_shapes"), [[[1], 10**7]])}),
        ("profile-gradient-shapes-dim-0", ("estimate", "--profile", "{d}/p.json"), 2,
         "gradient_shapes[0][0]",
         {"p.json": Mut("profile", ("model", "gradient_shapes"), [[[0, 5], 1]])}),
        ("profile-gradient-shapes-valid", ("estimate", "--profile", "{d}/p.json", "--json",
                                           "--top", "2"), 0, "chosen",
         {"p.json": Mut("profile", ("model", "gradient_shapes"), [[[11_170_000], 1]])}),
        ("profile-forward-share-1", ("estimate", "--profile", "{d}/p.json"), 2,
         "'model.forward_share' must be below 1",
         {"p.json": Mut("profile", ("model", "forward_share"), 1.0)}),
        ("profile-forward-share-str", ("estimate", "--profile", "{d}/p.json"), 2,
         "'model.forward_share' must be a number",
         {"p.json": Mut("profile", ("model", "forward_share"), "1/3")}),
        ("profile-forward-share-valid", ("estimate", "--profile", "{d}/p.json", "--json",
                                         "--top", "2"), 0, "chosen",
         {"p.json": Mut("profile", ("model", "forward_share"), 0.45)}),
        ("profile-codec-seconds-list", ("estimate", "--profile", "{d}/p.json"), 2,
         "codec_seconds.options", {"p.json": Mut("profile", ("codec_seconds",), [1])}),
        ("profile-codec-seconds-zip", ("estimate", "--profile", "{d}/p.json"), 2,
         "not a compression",
         {"p.json": Mut("profile", ("codec_seconds",), {"options": {"zip": 1.0}})}),
        ("profile-codec-seconds-neg", ("estimate", "--profile", "{d}/p.json"), 2,
         "codec_seconds.options.fp16",
         {"p.json": Mut("profile", ("codec_seconds",), {"options": {"fp16": -1}})}),
        ("profile-codec-seconds-nan", ("estimate", "--profile", "{d}/p.json"), 2,
         "not a number kplan accepts",
         {"p.json": Mut("profile", ("codec_seconds",), None, '{"options": {"fp16": NaN}}')}),
        ("profile-codec-seconds-valid", ("estimate", "--profile", "{d}/p.json", "--json",
                                         "--top", "2"), 0, "chosen",
         {"p.json": Mut("profile", ("codec_seconds",),
                        {"options": {"fp16": 0.01}, "device": "cuda", "how": "test"})}),
        # issue 15, item 4: the pinning flags
        ("estimate-nodes-0", (*est, "--nodes", "0"), 2, "--nodes", {}),
        ("estimate-nodes-8-2", (*est, "--nodes", "8-2"), 2, "--nodes", {}),
        ("estimate-nodes-abc", (*est, "--nodes", "abc"), 2, "--nodes", {}),
        ("estimate-nodes-and-max-nodes", (*est, "--nodes", "4", "--max-nodes", "8"), 2,
         "not both", {}),
        ("estimate-global-batch-0", (*est, "--global-batch", "0"), 2, "--global-batch", {}),
        ("estimate-global-batch-nan", (*est, "--global-batch", "nan"), 2, "Invalid value", {}),
        ("estimate-max-global-batch-0", (*est, "--max-global-batch", "0"), 2,
         "--max-global-batch", {}),
        ("estimate-global-and-fixed-batch", (*est, "--global-batch", "64", "--fixed-batch"), 2,
         "at most one", {}),
        ("estimate-precision-fp8", (*est, "--precision", "fp8"), 2, "precision", {}),
        ("estimate-instance-type-nope", (*est, "--instance-type", "nope"), 2,
         "unknown instance type", {}),
        ("estimate-pins-infeasible", (*est, "--instance-type", "p3.16xlarge", "--nodes", "8",
                                      "--global-batch", "16"), 2, "too small", {}),
        ("launch-local-global-batch", ("launch", "{d}/train.py", "--budget", "1",
                                       "--global-batch", "64", "--dry-run"), 2, "plan made now",
         s),
        ("launch-local-precision-fp8", ("launch", "{d}/train.py", "--budget", "1", "--precision",
                                        "fp8", "--dry-run"), 2, "not a precision", s),
        ("launch-price-aws", ("launch", "{d}/train.py", "--budget", "1", "--cloud", "aws",
                              "--example", "cifar10-resnet18", "--price", "1",
                              "--dry-run"), 2, "--price is for a local job", s),
        ("launch-local-example-profiler", ("launch", "{d}/train.py", "--budget", "1",
                                           "--example", "mlp-regression", "--dry-run"), 2,
         "kplan profile --example", s),
        ("launch-epochs-no-profile", ("launch", "{d}/train.py", "--budget", "1", "--epochs",
                                      "5", "--dry-run"), 2, "only for a plan made now", s),
        ("launch-dataset-size-no-profile", ("launch", "{d}/train.py", "--budget", "1",
                                            "--dataset-size", "100", "--dry-run"), 2,
         "only for a plan made now", s),
        ("launch-epochs-nan", ("launch", "{d}/train.py", "--budget", "1", "--epochs", "nan",
                               "--dry-run"), 2, "--epochs", s),
        ("launch-epochs-0", ("launch", "{d}/train.py", "--budget", "1", "--epochs", "0",
                             "--dry-run"), 2, "--epochs", s),
        ("launch-dataset-size-0", ("launch", "{d}/train.py", "--budget", "1", "--dataset-size",
                                   "0", "--dry-run"), 2, "--dataset-size", s),
        ("launch-plan-nodes-8-2", ("launch", "{d}/train.py", "--budget", "1", "--cloud", "aws",
                                   "--example", "cifar10-resnet18", "--plan-nodes",
                                   "8-2", "--dry-run"), 2, "--plan-nodes", s),
    ]  # fmt: skip
    return [
        Case(f"enum-{name}", argv, code, match, files=files,
             home="job" if argv[0] in ("logs", "status", "report") else None)
        for name, argv, code, match, files in rows
    ]  # fmt: skip


def _out_cases() -> list[Case]:
    """``--out``-like paths that are a folder, under a file, or a device."""
    outs: list[tuple[str, str, dict[str, Any]]] = [
        ("dir", "{d}/outdir", {"outdir": DIR}),
        ("under-file", "{d}/afile/x.json", {"afile": "x"}),
        # Never /dev/null: run as root, a regression would replace the system's /dev/null.
        ("fifo", "{d}/outfifo", {"outfifo": FIFO}),
        ("unwritable", "/proc/kplan-out.json", {}),  # no file can be made there, even by root
    ]
    commands: list[tuple[str, tuple[str, ...], str, dict[str, Any]]] = [
        ("estimate", ("estimate", "--example", "cifar10-resnet18", "--out"), "--out", {}),
        ("model-fit", ("model", "fit", "-m", "{d}/m.csv", "--out"), "--out",
         {"m.csv": MEASUREMENTS}),
        ("model-predict", ("model", "predict", "--model", "{d}/model.json", "-c", "{d}/c.csv",
                           "--out"), "--out", {"model.json": Mut("model"), "c.csv": CONFIGS}),
        ("profile", ("profile", "--example", "mlp-regression", "--out"), "--out", {}),
        ("profile-measurements", ("profile", "--example", "mlp-regression", "--out",
                                  "{d}/p.json", "--measurements"), "--measurements", {}),
        ("report-html", ("report", "--all", "--html"), "--html", {}),
    ]  # fmt: skip
    out = []
    for cname, argv, flag, files in commands:
        for oname, path, ofiles in outs:
            out.append(
                Case(
                    f"out-{cname}-{oname}",
                    (*argv, path),
                    2,
                    flag,
                    files={**files, **ofiles},
                    home="job" if cname.startswith("report") else None,
                )
            )
    return out


def _db_cases() -> list[Case]:
    commands = {
        "status": ("status",),
        "status-job": ("status", JOB),
        "logs": ("logs", JOB),
        "report": ("report", "--all"),
        "down": ("down", JOB),
        "down-all": ("down", "--all"),
        "down-by-tag": ("down", JOB, "--cloud", "local"),
        "launch": ("launch", "{d}/train.py", "--budget", "0"),
    }
    homes = {
        "corrupt": "damaged",
        "foreign": "not a kplan state database",
        "text": "not a kplan state database",
        "magic": "damaged",
        "dir": "not a regular file",
        "fifo": "not a regular file",
    }
    out = []
    for hname, match in homes.items():
        for cname, argv in commands.items():
            files = {"train.py": SCRIPT} if cname == "launch" else {}
            out.append(
                Case(
                    f"db-{hname}-{cname}",
                    argv,
                    2,
                    match,
                    files=files,
                    home=hname,
                    sub=hname == "fifo",
                )
            )
    # A read-only home with a healthy database: reading works; nothing says "move it away".
    for cname, argv, code, match in (
        ("status", ("status",), 0, JOB),
        ("status-job", ("status", JOB, "--json"), 0, JOB),
        ("report", ("report", JOB, "--json"), 0, JOB),
        ("logs", ("logs", JOB), 0, ""),
        ("down", ("down", JOB, "--wait", "0"), 1, "permissions"),
    ):
        out.append(
            Case(f"db-readonly-{cname}", argv, code, match, home="readonly", sub=True)
        )  # fmt: skip
    return out


def _catalog_cases() -> list[Case]:
    """The current user catalog ($KPLAN_HOME/catalogs/DATE) holds a FIFO."""
    s = {"train.py": SCRIPT}
    rows: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
        ("estimate", ("estimate", "--example", "cifar10-resnet18"), {}),
        ("catalog-list", ("catalog", "list"), {}),
        ("launch", ("launch", "{d}/train.py", "--budget", "5", "--cloud", "aws",
                    "--example", "cifar10-resnet18", "--dry-run"), s),
    ]  # fmt: skip
    return [
        Case(f"home-catalog-fifo-{name}", argv, 2, "FIFO", files=files, home="catalog-fifo")
        for name, argv, files in rows
    ]


def _job_id_cases() -> list[Case]:
    """A JOB argument is an id, a unique prefix of one or ``last`` (issue 12): a prefix of two
    jobs (``two-jobs``: JOB and JOB2) lists them; ``last`` with no job; text that is no id."""
    rows: list[tuple[str, tuple[str, ...], int, str, str | None]] = [
        ("status-ambiguous", ("status", "kp-corpus-"), 2, "matches 2 jobs", "two-jobs"),
        ("logs-ambiguous", ("logs", "kp-corpus"), 2, "matches 2 jobs", "two-jobs"),
        ("report-ambiguous", ("report", "kp-c"), 2, "matches 2 jobs", "two-jobs"),
        ("down-ambiguous", ("down", "kp-corpus-d"), 2, "matches 2 jobs", "two-jobs"),
        ("status-last-none", ("status", "last"), 2, "no jobs", None),
        ("logs-last-none", ("logs", "last"), 2, "no jobs", None),
        ("report-last-none", ("report", "last"), 2, "no jobs", None),
        ("down-last-none", ("down", "last"), 2, "no jobs", None),
        ("status-prefix-none", ("status", "kp-zz"), 2, "no job", "job"),
        ("status-id-spaces", ("status", "kp corpus"), 2, "job id", "job"),
        ("report-id-slash", ("report", "kp/../x"), 2, "job id", "job"),
        ("status-prefix-ok", ("status", "kp-corpus-do", "--json"), 0, "", "job"),
        ("status-last-ok", ("status", "last", "--json"), 0, "", "two-jobs"),
        ("report-last-ok", ("report", "last", "--json"), 0, "", "job"),
        ("report-against-unknown", ("report", "last", "--against", "kp-zz"), 2, "no job", "job"),
        ("report-against-no-steps", ("report", "last", "--against", "last"), 2,
         "no step records", "job"),
        ("report-against-batch-0", ("report", "last", "--against", "last"), 2,
         "'global_batch' is 0", "batch0"),
        ("logs-last-ok", ("logs", "last"), 0, "", "job"),
    ]  # fmt: skip
    return [Case(f"jobid-{name}", argv, code, match, home=home)
            for name, argv, code, match, home in rows]  # fmt: skip


def _plan_cases() -> list[Case]:
    """Issue 24: every reader of a plan checks it with the plan's one schema
    (kplan/planner/plan_schema.py): simulate as launch, every field typed and bounded, the
    counts consistent, the types the catalog's, a plan of the previous schema migrated."""
    s = {"train.py": SCRIPT}
    launch = ("launch", "{d}/train.py", "--budget", "5", "--plan", "{d}/p.json", "--dry-run")
    local = ("launch", "{d}/train.py", "--budget", "1", "--plan", "{d}/p.json", "--dry-run")

    def sim(path: tuple[str | int, ...], value: Any, **kw: Any) -> dict[str, Any]:
        return {"p.json": Mut("plan", path, value, **kw), "t.csv": TRACE}

    def plan(path: tuple[str | int, ...], value: Any, base: str = "plan", **kw: Any) -> Any:
        return {**s, "p.json": Mut(base, path, value, **kw)}

    four = ((("chosen", "workers"), 4),)
    sched = {"phases": [{"progress": 0, "global_batch": 10**15}], "hours": 1.0,
             "cost_usd": 1.0, "hours_p90": 1.0, "cost_p90_usd": 1.0}  # fmt: skip
    rows: list[tuple[str, tuple[str, ...], int, str, dict[str, Any]]] = [
        ("simulate-nodes-0", SIM, 2, "chosen.nodes 0", sim(("chosen", "nodes"), 0)),
        ("simulate-step-nan", SIM, 2, "chosen.step_time_s 'nan'",
         sim(("chosen", "step_time_s"), "nan")),
        ("simulate-steps-neg", SIM, 2, "chosen.steps -100", sim(("chosen", "steps"), -100)),
        ("simulate-hours-p90-neg", SIM, 2, "chosen.hours_p90 -5",
         sim(("chosen", "hours_p90"), -5)),
        ("simulate-market-bogus", SIM, 2, "chosen.market 'bogus'",
         sim(("chosen", "market"), "bogus")),
        ("simulate-type-unknown", SIM, 2, "'p9.mega' is not a type of aws",
         sim(("chosen", "groups", 0, "instance_type"), "p9.mega")),
        ("simulate-region-mars", SIM, 2, "'mars-1' is not a region of aws",
         sim(("chosen", "region"), "mars-1")),
        ("simulate-nodes-2.7", SIM, 2, "chosen.nodes 2.7", sim(("chosen", "nodes"), 2.7)),
        ("simulate-no-schema", SIM, 2, "not a kplan plan", sim(("schema",), DELETE)),
        ("simulate-schema-3", SIM, 2, "kplan.plan/3.0 is not supported",
         sim(("schema",), "kplan.plan/3.0")),
        ("simulate-nodes-1M", SIM, 2, "chosen.nodes 1000000", sim(("chosen", "nodes"), 10**6)),
        ("simulate-group-nodes-1M", SIM, 2, "chosen.groups[0].nodes 1000000",
         sim(("chosen", "groups", 0, "nodes"), 10**6, more=((("chosen", "nodes"), 10**6),))),
        ("simulate-plans-row-bad", (*SIM, "--row", "0"), 2, "plans[0].hours",
         sim(("plans", 0, "hours"), "soon")),
        ("launch-plan-allow-od-str", launch, 2, "allow_on_demand 'false'",
         plan(("chosen", "spot", "recovery", "allow_on_demand"), "false")),
        ("launch-plan-v1-allow-od-str", launch, 2, "chosen.allow_on_demand 'false'",
         plan(("chosen", "allow_on_demand"), "false", "plan_v1")),
        ("launch-plan-group-market-Spot", launch, 2, "chosen.groups[0].market 'Spot'",
         plan(("chosen", "groups", 0, "market"), "Spot")),
        ("launch-plan-gpus-over-type", launch, 2, "gpus_per_node 8 is more than",
         plan(("chosen", "groups", 0, "gpus_per_node"), 8, more=((("chosen", "workers"), 8),))),
        ("launch-plan-batch-below-workers", launch, 2, "global_batch 1 is below its 4 workers",
         plan(("chosen", "groups", 0, "gpus_per_node"), 4,
              more=(*four, (("chosen", "global_batch"), 1)))),
        ("launch-plan-schedule-batch-huge", launch, 2, "phases[0].global_batch 1000000000000000",
         plan(("chosen", "batch_schedule"), sched)),
        ("launch-plan-no-cloud", launch, 2, "chosen.cloud is missing",
         plan(("chosen", "cloud"), DELETE)),
        ("launch-plan-local-no-hours", local, 2, "chosen.hours is missing",
         plan(("chosen", "hours"), DELETE, "local_plan_v1")),
        ("launch-plan-p90-below", launch, 2, "step_time_p90_s 0.001 is below",
         plan(("chosen", "step_time_p90_s"), 0.001)),
        ("launch-plan-workers-disagree", launch, 2, "chosen.workers 3 is not",
         plan(("chosen", "workers"), 3)),
        ("launch-plan-v1-valid", launch, 0, "", plan((), None, "plan_v1")),
        ("launch-plan-v1-local-valid", local, 0, "", plan((), None, "local_plan_v1")),
        ("launch-plan-valid", launch, 0, "", plan((), None)),
    ]  # fmt: skip
    return [Case(f"plan24-{name}", argv, code, match, files=files)
            for name, argv, code, match, files in rows]  # fmt: skip


def _issue24_cases() -> list[Case]:
    """Issue 24's bad input that is not a plan: environment variables checked as their flags,
    job ids with a newline, a 300-byte file name, a terminal that is not UTF-8, an ignore file
    with a dozen ``**``, absurd catalog prices, a zero SIGMA, precisions a CPU cannot profile,
    two profiles of different jobs, and a model's field types (in a profile's fit)."""
    s = {"train.py": SCRIPT}
    aws = ("launch", "{d}/train.py", "--cloud", "aws", "--example", "cifar10-resnet18",
           "--budget", "5", "--dry-run")  # fmt: skip
    gcp = tuple("gcp" if a == "aws" else a for a in aws)
    est = ("estimate", "--example", "cifar10-resnet18")
    long = "{d}/" + "n" * 300 + ".json"
    deep = "/".join(["a"] * 25)
    stars = "\n".join("**/a/" * k + f"**/zz{k}" for k in range(1, 13)) + "\n"
    # fmt: off
    rows: list[Case] = [
        # environment variables: the flag's check (KPLAN_*_IMAGE is --image), or a name's
        Case("env-aws-image-space", aws, 2, "KPLAN_AWS_IMAGE", s, env={"KPLAN_AWS_IMAGE": " "}),
        Case("env-aws-image-newline", aws, 2, "KPLAN_AWS_IMAGE", s,
             env={"KPLAN_AWS_IMAGE": "ami-123\nx"}),
        Case("env-aws-instance-profile-newline", aws, 2, "KPLAN_AWS_INSTANCE_PROFILE", s,
             env={"KPLAN_AWS_INSTANCE_PROFILE": "role\n"}),
        Case("env-aws-vpc-space", aws, 2, "KPLAN_AWS_VPC", s, env={"KPLAN_AWS_VPC": "vpc 1"}),
        Case("env-aws-storage-tab", aws, 2, "KPLAN_AWS_STORAGE_URI", s,
             env={"KPLAN_AWS_STORAGE_URI": "s3://b/\tx"}),
        Case("env-aws-image-valid", aws, 0, "", s, env={"KPLAN_AWS_IMAGE": "ami-0123456789"}),
        Case("env-gcp-image-space", gcp, 2, "KPLAN_GCP_IMAGE", s, env={"KPLAN_GCP_IMAGE": " "}),
        Case("env-gcp-network-newline", gcp, 2, "KPLAN_GCP_NETWORK", s,
             env={"KPLAN_GCP_NETWORK": "vpc\n"}),
        Case("env-gcp-service-account-space", gcp, 2, "KPLAN_GCP_SERVICE_ACCOUNT", s,
             env={"KPLAN_GCP_SERVICE_ACCOUNT": "a b@c.d"}),
        # a job id with a trailing newline: refused by every command that takes one
        *[
            Case(f"jobid-newline-{name}", argv, 2, "job id", s if name == "launch" else {},
                 home="job")
            for name, argv in (
                ("status", ("status", JOB + "\n")),
                ("logs", ("logs", JOB + "\n")),
                ("report", ("report", JOB + "\n")),
                ("down", ("down", JOB + "\n")),
                ("report-against", ("report", JOB, "--against", JOB + "\n")),
                ("launch", ("launch", "{d}/train.py", "--job-id", "abc\n", "--dry-run")),
            )
        ],
        # an output name longer than a file system takes (NAME_MAX, 255 bytes)
        Case("out-name-300-estimate", (*est, "--out", long), 2, "shorter file name"),
        Case("out-name-300-model-fit", ("model", "fit", "-m", "{d}/m.csv", "--out", long), 2,
             "shorter file name", {"m.csv": MEASUREMENTS}),
        Case("out-name-300-profile", ("profile", "--example", "mlp-regression", "--out", long),
             2, "shorter file name"),
        # a terminal that is not UTF-8 and a profile named in another script: printed, escaped
        *[
            Case(f"terminal-{enc}-profile-name", ("estimate", "--profile", "{d}/p.json",
                                                  "--top", "2"), 0, "",
                 {"p.json": Mut("profile", ("name",), "modèle-日本")}, sub=True,
                 env={"PYTHONIOENCODING": enc})
            for enc in ("ascii", "latin-1")
        ],
        # a dozen "**" over 25 folders: linear matching, packed at once
        Case("packing-gitignore-double-stars", aws, 0, "", {**s, f"{deep}/f.txt": "x\n",
                                                           ".gitignore": stars}),
        # a user catalog priced at 1e300 USD/h: those rows are dropped (with a note), not planned
        Case("catalog-price-1e300-estimate", (*est, "--instance-type", "p3.2xlarge",
                                              "--on-demand"), 2, "no instance type",
             home="catalog-1e300"),
        Case("catalog-price-1e300-list", ("catalog", "list", "--cloud", "aws", "--gpu", "V100",
                                          "--json"), 0, "", home="catalog-1e300"),
        # --compression-steps SIGMA: bounded below (1e-300 divided by zero)
        Case("compression-steps-sigma-1e-300", (*est, "--compression-steps", "fp16=1.1/1e-300"),
             2, "SIGMA"),
        Case("compression-steps-sigma-0.01", (*est, "--compression-steps", "fp16=1.1/0.01"), 0),
        # every precision checked against the device before any profile runs (no GPU here)
        Case("profile-precisions-fp32-fp16-cpu", ("profile", "--example", "mlp-regression",
                                                  "--precision", "fp32", "--precision", "fp16",
                                                  "--out", "{d}/p.json"), 2, "--precision fp16",
             env={"CUDA_VISIBLE_DEVICES": ""}),
        # two profiles of different jobs are not one job's two precisions
        Case("profile-pair-different-jobs", ("estimate", "--profile", "{d}/a.json", "--profile",
                                             "{d}/b.json"), 2, "not of one job",
             {"a.json": Mut("profile", ("precision",), "fp16"),
              "b.json": Mut("profile", ("name",), "another-job")}),
        Case("profile-pair-one-job-valid", ("estimate", "--profile", "{d}/a.json", "--profile",
                                            "{d}/b.json", "--top", "2"), 0, "",
             {"a.json": Mut("profile", ("precision",), "fp16"), "b.json": Mut("profile")}),
        # a model's field types, checked by its one validator wherever it is read
        Case("profile-fit-gamma-str", ("estimate", "--profile", "{d}/p.json"), 2,
             "'gamma' must be a number", {"p.json": Mut("profile", ("fit", "gamma"), "2")}),
        Case("profile-fit-gpus-per-node-bool", ("estimate", "--profile", "{d}/p.json"), 2,
             "'gpus_per_node' must be an integer",
             {"p.json": Mut("profile", ("fit", "gpus_per_node"), True)}),
        Case("model-bucket-bytes-str", ("model", "predict", "--model", "{d}/model.json", "-c",
                                        "{d}/c.csv"), 2, "'bucket_bytes' must be a number",
             {"model.json": Mut("model", ("bucket_bytes",), "big"), "c.csv": CONFIGS}),
    ]
    # fmt: on
    return [replace(c, id=f"i24-{c.id}") for c in rows]


def _issue25_cases() -> list[Case]:
    """Issue 25: `kplan model predict` refuses a row across a link the model knows nothing of
    (a one-node fit with no network speed priced the network at 0: 2 nodes of 8 workers came
    out 3x faster than the 1 node of 2 measured); a row past what was measured is answered,
    and says it is extrapolated."""
    predict = ("model", "predict", "--model", "{d}/model.json", "-c", "{d}/c.csv")
    one_node = Mut("model", ("inter_measured",), False, more=(
        (("inter_beta",), 0.0), (("max_nodes_measured",), 1), (("nodes_measured",), [1]),
    ))  # fmt: skip
    return [
        Case("i25-model-predict-across-unmeasured-nodes", predict, 2, "cannot predict 2 nodes",
             files={"model.json": one_node, "c.csv": CONFIGS}),
        Case("i25-model-predict-past-measured-workers", predict, 0, "",
             files={"model.json": Mut("model"),
                    "c.csv": "nodes,workers,local_batch\n64,512,32\n"}),
    ]  # fmt: skip


def _move_cases() -> list[Case]:
    """Issue 27 item 3: ``kplan launch --move-region`` refuses what cannot move, in one line
    with a hint: a region the cloud's catalog lacks, the job's own region, a local job, an AWS
    AMI id (it boots only in its own region), and the move's numbers without a region."""
    s = {"train.py": SCRIPT}
    aws = ("launch", "{d}/train.py", "--cloud", "aws", "--region", "us-east-1", "--example",
           "cifar10-resnet18", "--budget", "5", "--dry-run")  # fmt: skip
    west = ("--move-region", "us-west-2", "--checkpoint-gb", "10")
    local = ("launch", "{d}/train.py", "--dry-run", "--move-region", "us-west-2")
    # fmt: off
    return [
        Case("move-region-unknown", (*aws, "--move-region", "mars-1"), 2, "no region 'mars-1'",
             s),
        Case("move-region-gcp-name-on-aws", (*aws, "--move-region", "us-central1"), 2,
             "no region 'us-central1'", s),
        Case("move-region-home", (*aws, "--move-region", "us-east-1"), 2, "job's own region", s),
        Case("move-region-local", local, 2, "local job", s),
        Case("move-region-empty", (*aws, "--move-region", ""), 2, "--move-region", s),
        Case("move-region-ami-flag", (*aws, *west, "--image", "ami-0123456789"), 2, "AMI id", s),
        Case("move-region-ami-env", (*aws, *west), 2, "KPLAN_AWS_IMAGE ami-0123456789 is an AMI",
             s, env={"KPLAN_AWS_IMAGE": "ami-0123456789"}),
        Case("move-region-ssm-image", (*aws, *west, "--image", "resolve:ssm:/x/y"), 0, "", s),
        Case("move-region-valid", (*aws, *west), 0, "", s),
        Case("move-checkpoint-without-region", (*aws, "--checkpoint-gb", "5"), 2,
             "only with --move-region", s),
        Case("move-copy-gbps-zero", (*aws, *west, "--copy-gbps", "0"), 2, "--copy-gbps", s),
        Case("move-copy-gbps-inf", (*aws, *west, "--copy-gbps", "inf"), 2, "--copy-gbps", s),
        Case("move-checkpoint-nan", (*aws, "--move-region", "us-west-2", "--checkpoint-gb",
                                     "nan"), 2, "--checkpoint-gb", s),
        Case("move-checkpoint-negative", (*aws, "--move-region", "us-west-2", "--checkpoint-gb",
                                          "-1"), 2, "--checkpoint-gb", s),
    ]
    # fmt: on


def _fuzz_cases() -> list[Case]:
    """Found by trying bad input on the newest surfaces from outside (branch fuzz): each row
    was mishandled before its fix (a traceback, a hang, or nonsense priced)."""
    aws = ("launch", "{d}/train.py", "--cloud", "aws", "--region", "us-east-1", "--example",
           "cifar10-resnet18", "--budget", "5", "--dry-run", "--move-region", "us-west-2",
           "--checkpoint-gb", "10")  # fmt: skip
    gcp = ("launch", "{d}/train.py", "--cloud", "gcp", "--example", "cifar10-resnet18",
           "--budget", "5", "--dry-run")  # fmt: skip
    # the base plan runs in us-east-2 (tests/test_bad_input_corpus.py ``bases``)
    pools = ("simulate", "--plan", "{d}/p.json", "--trace", "us-east-2={d}/t.csv", "--trace",
             "us-west-2={d}/t.csv")  # fmt: skip
    # fmt: off
    rows: list[Case] = [
        # KPLAN_HOME of a ~user that does not exist: RuntimeError from expanduser (exit 1)
        Case("env-home-unknown-user", ("status",), 2, "names no home",
             env={"KPLAN_HOME": "~kplan-no-such-user/x"}),
        # a newline or a byte that is not UTF-8: a local launch's progress thread died on it
        # and the job hung
        Case("env-home-newline", ("status",), 2, "control character",
             env={"KPLAN_HOME": "/tmp/kplan\nhome"}),
        Case("env-home-not-utf8", ("status",), 2, "non-UTF-8",
             env={"KPLAN_HOME": "/tmp/kplan-\udcff"}),
        # --copy-gbps 1e-300 priced a 10 GB copy at 8e301 s (a 300-digit line)
        Case("launch-copy-gbps-tiny", (*aws, "--copy-gbps", "1e-300"), 2, "--copy-gbps",
             {"train.py": SCRIPT}),
        Case("simulate-copy-gbps-tiny", (*pools, "--copy-gbps", "1e-300"), 2, "--copy-gbps",
             {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        # --compression-steps SPEC=1e-300 priced a plan "100% less time than dense"
        Case("compression-steps-mult-tiny", ("estimate", "--example", "cifar10-resnet18",
                                             "--compression-steps", "topk:0.01=1e-300"), 2,
             "must be in [0.25, 100]"),
        Case("compression-steps-mult-huge", ("estimate", "--example", "cifar10-resnet18",
                                             "--compression-steps", "topk:0.01=1.3e17"), 2,
             "must be in [0.25, 100]"),
        # --idle-minutes 1e-300 ended every cluster at the first monitor check after a step
        Case("launch-idle-minutes-tiny", ("launch", "{d}/train.py", "--budget", "1",
                                          "--idle-minutes", "1e-300", "--dry-run"), 2,
             "shorter than 1 min", {"train.py": SCRIPT}),
        # an image of the other cloud's kind (or an empty SSM parameter) was sent to the cloud
        Case("launch-aws-image-gcp-path", (*aws[:11], "--image", "projects/p/global/images/x"),
             2, "is not an image of aws", {"train.py": SCRIPT}),
        Case("launch-aws-image-ssm-empty", (*aws[:11], "--image", "resolve:ssm:"), 2,
             "is not an image of aws", {"train.py": SCRIPT}),
        Case("launch-gcp-image-ami", (*gcp, "--image", "ami-0123456789"), 2,
             "is not an image of gcp", {"train.py": SCRIPT}),
        Case("env-gcp-image-ami", gcp, 2, "KPLAN_GCP_IMAGE 'ami-0123456789' is not an image",
             {"train.py": SCRIPT}, env={"KPLAN_GCP_IMAGE": "ami-0123456789"}),
        Case("launch-gcp-image-family-valid", (*gcp, "--image",
                                               "projects/p/global/images/family/f"), 0, "",
             {"train.py": SCRIPT}),
        # a byte-order mark (a spreadsheet's "CSV UTF-8"): "missing column(s) nodes"
        Case("csv-configs-bom-valid", ("model", "predict", "--model", "{d}/model.json", "-c",
                                       "{d}/c.csv"), 0, "",
             {"model.json": Mut("model"), "c.csv": b"\xef\xbb\xbf" + CONFIGS.encode()}),
        Case("csv-measurements-bom-valid", ("model", "fit", "-m", "{d}/m.csv", "--out",
                                            "{d}/o.json"), 0, "",
             {"m.csv": b"\xef\xbb\xbf" + MEASUREMENTS.encode()}),
        Case("simulate-trace-bom-valid", (*SIM, "--runs", "20"), 0, "",
             {"p.json": SPOT_PLAN, "t.csv": b"\xef\xbb\xbf" + TRACE.encode()}),
        # the --job-id of a job that exists: the dry run took it; the launch refused it after
        # appending its own job line to that job's journal
        Case("launch-job-id-exists", ("launch", "{d}/train.py", "--budget", "1", "--job-id",
                                      JOB, "--dry-run"), 2, "already exists",
             {"train.py": SCRIPT}, home="job"),
        # an on-demand plan never runs dry: the move was taken, inert, and priced in the dry run
        Case("launch-move-region-on-demand", (*aws, "--on-demand"), 2, "every node on demand",
             {"train.py": SCRIPT}),
        # the move's numbers with one trace: taken and ignored (launch refuses them without
        # --move-region)
        Case("simulate-checkpoint-gb-one-trace", (*SIM, "--checkpoint-gb", "5"), 2,
             "only with a trace per pool", {"p.json": SPOT_PLAN, "t.csv": TRACE}),
        Case("simulate-copy-gbps-example-trace", ("simulate", "--plan", "{d}/p.json",
                                                  "--example-trace", "p3", "--copy-gbps", "5"),
             2, "only with a trace per pool", {"p.json": SPOT_PLAN}),
        # a deadline before the guard's first check: a job created and stopped (exit 1), and a
        # dry run that said it could start
        Case("launch-deadline-before-first-check", ("launch", "{d}/train.py", "--budget", "1",
                                                    "--deadline", "1e-300"), 2,
             "--deadline 1e-300 cannot start this cluster", {"train.py": SCRIPT}),
        # a 100 PB checkpoint: launch took up to 1e8 GB (simulate 1e6) and priced its move
        Case("launch-checkpoint-gb-100pb", (*aws[:-2], "--checkpoint-gb", "1e8"), 2,
             "--checkpoint-gb=1e+08 must be <= 1e+06", {"train.py": SCRIPT}),
        Case("simulate-copy-gbps-floor-valid", (*pools, "--copy-gbps", "0.001", "--runs", "20"),
             0, "", {"p.json": SPOT_PLAN, "t.csv": TRACE}),
    ]
    # fmt: on
    return [replace(c, id=f"fz-{c.id}") for c in rows]


def _fuzz2_cases() -> list[Case]:
    """Well-formed input that contradicts itself or the other inputs, or sits at a limit
    (fuzz2): an output path that is one of the command's inputs (the file would be lost), a
    measured compression cost outside what a measurement can be, the largest work, an epoch
    smaller than a step, a profile whose fields contradict each other or the catalog."""
    s = {"train.py": SCRIPT}
    predict = ("model", "predict", "--model", "{d}/model.json", "-c", "{d}/c.csv", "-o")
    est = ("estimate", "--example", "cifar10-resnet18", "--top", "2")
    sizes = ("--base-batch", "8", "--dataset-size", "100")
    # fmt: off
    return [
        Case("out-is-input-estimate-profile", ("estimate", "-p", "{d}/p.json", "-o",
             "{d}/./p.json"), 2, "is also the --profile",
             files={"p.json": Mut("profile")}),
        Case("out-is-input-model-fit", ("model", "fit", "-m", "{d}/m.csv", "-o", "{d}/m.csv"), 2,
             "is also the --measurements", files={"m.csv": MEASUREMENTS}),
        Case("out-is-input-model-predict-configs", (*predict, "{d}/c.csv"), 2,
             "is also the --configs", files={"model.json": Mut("model"), "c.csv": CONFIGS}),
        Case("out-is-input-model-predict-model", (*predict, "{d}/model.json"), 2,
             "is also the --model", files={"model.json": Mut("model"), "c.csv": CONFIGS}),
        Case("out-is-input-profile-script", ("profile", "{d}/train.py", *sizes, "-o",
             "{d}/train.py"), 2, "is also the SCRIPT", files=s),
        # a measured compression cost of 1e300 ran the Monte-Carlo for minutes, 1e-300 priced
        # the job at its start-up
        Case("compression-steps-mult-huge", (*est, "--compression", "topk:0.01",
             "--compression-steps", "topk:0.01=1e300/0.01"), 2, "must be in [0.25, 100]"),
        Case("compression-steps-mult-low-edge", (*est, "--compression-steps", "topk:0.01=0.25"),
             0),
        # the largest --dataset-size (2**53 - 1): 250,000 years, priced on demand, a hang on spot
        Case("dataset-size-max-work", (*est, "--dataset-size", str(2**53 - 1)), 2,
             "more than the 1,000,000 h kplan plans"),
        # an epoch smaller than a step: priced at its start-up (4 min, $0.010)
        Case("dataset-size-below-batch", (*est, "--dataset-size", "1", "--global-batch",
             "1024"), 2, "--dataset-size 1 is less than the profile's global batch 128"),
        Case("global-batch-above-epoch", (*est, "--global-batch", "50049"), 2,
             "is more than the 50,048 samples of an epoch"),
        Case("global-batch-epoch-edge", (*est, "--global-batch", "50048", "--on-demand"), 0),
        Case("profile-flags-epoch-below-batch", ("profile", "{d}/train.py", "--base-batch",
             "256", "--dataset-size", "100"), 2, "--dataset-size 100 is less than --base-batch",
             files=s),
        Case("profile-example-epoch-below-batch", ("profile", "--example", "mlp-regression",
             "--base-batch", "9999999"), 2, "is less than --base-batch 9,999,999"),
        Case("profile-epoch-below-batch", ("estimate", "-p", "{d}/p.json"), 2,
             "work.dataset_size 10 is less than batch.base_global_batch",
             files={"p.json": Mut("profile", ("work", "dataset_size"), 10)}),
        Case("profile-workers-above-gpus-per-node", ("estimate", "-p", "{d}/p.json"), 2,
             "more than device.gpus_per_node 2",
             files={"p.json": Mut("profile", ("device", "gpus_per_node"), 2)}),
        Case("profile-row-gpu-not-device-gpu", ("estimate", "-p", "{d}/p.json"), 2,
             "measurements[3] was measured on 'A100'",
             files={"p.json": Mut("profile", ("measurements", 3, "gpu"), "A100")}),
        Case("profile-gpu-not-instance-gpu", ("estimate", "-p", "{d}/p.json"), 2,
             "names GPU 'T4' but its instance type p3.2xlarge has V100",
             files={"p.json": Mut("profile", ("device", "instance_type"), "p3.2xlarge")}),
        Case("profile-gpu-case-folded", ("estimate", "-p", "{d}/p.json", "--top", "1"), 0,
             files={"p.json": Mut("profile", ("device", "gpu"), "t4")}),
        # spot-only flags with --on-demand were silently unused
        Case("on-demand-allow-on-demand", (*est, "--on-demand", "--allow-on-demand"), 2,
             "--allow-on-demand prices spot plans, and --on-demand plans none"),
        Case("on-demand-capacity-wait", (*est, "--on-demand", "--capacity-wait", "60"), 2,
             "--capacity-wait prices spot plans"),
        Case("spot-allow-on-demand-capacity-wait", (*est, "--spot", "--allow-on-demand",
             "--capacity-wait", "60"), 0),
        Case("data-region-without-data", (*est, "--data-region", "us-central1"), 2,
             "there is none: --data-gb is 0"),
        # a region of the other cloud said "no instance type matches the filters"
        Case("region-not-of-cloud", (*est, "--cloud", "aws", "--region", "us-central1"), 2,
             "is not a region of --cloud aws"),
        Case("region-one-of-cloud-valid", (*est, "--cloud", "aws", "--region", "us-central1",
             "--region", "us-east-1"), 0),
        # a 5,000-character job id was echoed whole
        Case("job-id-5000-chars", ("logs", "x" * 5000), 2, "'... is not valid"),
        Case("out-is-input-report-html-profile", ("report", "last", "--profile", "{d}/p.json",
             "--html", "{d}/p.json"), 2, "is also the --profile", files={"p.json": Mut("profile")},
             home="job"),
        # a row of more workers per node than its instance type has GPUs was answered
        Case("predict-workers-over-type", ("model", "predict", "--model", "{d}/model.json",
             "-c", "{d}/c.csv"), 2, "64 workers on 1 node(s) is 64 on a node, and "
             "g4dn.12xlarge has 4 GPUs", files={"model.json": Mut("model"),
             "c.csv": "nodes,workers,local_batch,instance_type\n1,64,32,g4dn.12xlarge\n"}),
        Case("fit-workers-over-type", ("model", "fit", "-m", "{d}/m.csv", "-o", "{d}/o.json"),
             2, "8 workers on 1 node(s) is 8 on a node", files={"m.csv": FIT_OVER_TYPE}),
        Case("fit-gpu-not-type-gpu", ("model", "fit", "-m", "{d}/m.csv", "-o", "{d}/o.json"), 2,
             "p3.2xlarge has V100 GPUs, not T4", files={"m.csv": FIT_GPU_NOT_TYPE}),
        Case("fit-own-machine-type", ("model", "fit", "-m", "{d}/m.csv", "-o", "{d}/o.json"), 0,
             files={"m.csv": FIT_OVER_TYPE.replace("g4dn.12xlarge", "mybox")}),
        Case("fit-type-catalog-fifo", ("model", "fit", "-m", "{d}/m.csv", "-o", "{d}/o.json"),
             2, "FIFO", files={"m.csv": FIT_GPU_NOT_TYPE}, home="catalog-fifo"),
        Case("predict-type-catalog-fifo", ("model", "predict", "--model", "{d}/model.json",
             "-c", "{d}/c.csv"), 2, "FIFO", files={"model.json": Mut("model"),
             "c.csv": "nodes,workers,local_batch,instance_type\n1,4,32,g4dn.12xlarge\n"},
             home="catalog-fifo"),
        # --out with --list-examples wrote nothing, silently
        Case("list-examples-out", ("estimate", "--list-examples", "--out", "{d}/l.json"), 2,
             "--out would be unused"),
        Case("list-examples-example", ("estimate", "--list-examples", "-e", "nope"), 2,
             "--example would be unused"),
        Case("out-is-input-profile-measurements", ("profile", "{d}/train.py", *sizes, "-o",
             "{d}/x.json", "--measurements", "{d}/x.json"), 2, "is also the --out", files=s),
        # a step of 1e-12 s (a unit slip) fitted a model and printed a 700% error
        Case("model-fit-step-below-kernel", ("model", "fit", "-m", "{d}/m.csv", "-o",
             "{d}/o.json"), 2, "is less than 1e-06",
             files={"m.csv": "nodes,workers,local_batch,step_time\n1,1,8,1e-12\n1,1,16,2e-12\n"}),
        Case("profile-step-below-kernel", ("estimate", "-p", "{d}/p.json"), 2,
             "shorter than a kernel",
             files={"p.json": Mut("profile", ("measurements", 0, "step_time"), 1e-9,
                                  more=((("measurements", 0, "sync_time"), 0.0),))}),
        # a region and one of its own zones were replayed as two pools (the same nodes twice)
        Case("simulate-pool-zone-of-region", ("simulate", "--plan", "{d}/p.json", "--trace",
             "us-east-2={d}/t.csv", "--trace", "use2-az1={d}/t.csv"), 2,
             "is a zone of pool 'us-east-2'", files={"p.json": SPOT_PLAN, "t.csv": TRACE}),
    ]
    # fmt: on


CASES: list[Case] = [
    *_job_id_cases(),
    *_flag_cases(),
    *_file_cases(),
    *_field_cases(),
    *_enum_cases(),
    *_out_cases(),
    *_db_cases(),
    *_catalog_cases(),
    *_plan_cases(),
    *_issue24_cases(),
    *_issue25_cases(),
    *_move_cases(),
    *_fuzz_cases(),
    *_fuzz2_cases(),
]
