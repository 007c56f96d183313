"""`kplan --help` and `kplan estimate` must not import torch, cloud SDKs or scikit-learn."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "boto3", "botocore", "google.cloud", "sklearn", "matplotlib")

_PROBE = """
import sys, json
from kplan.cli.main import app
from typer.testing import CliRunner
res = CliRunner().invoke(app, {args!r})
assert res.exit_code == 0, res.output
print(json.dumps(sorted(m for m in sys.modules)))
"""


def _modules(args: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(args=args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_help_and_estimate_import_no_heavy_modules() -> None:
    for args in (["--help"], ["estimate", "--example", "imagenet-resnet50", "--json"]):
        loaded = _modules(args)
        bad = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
        assert not bad, f"{args}: imported {bad[:5]}"
