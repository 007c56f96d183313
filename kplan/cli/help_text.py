"""One style for every command's help: an example epilog, named metavars, one way of defaults.

The commands declare their options as usual; ``KplanCommand`` and ``KplanGroup`` (set at
registration by ``kplan.cli.main``) bring each help page to these conventions:

- an "Examples:" epilog from ``EXAMPLES`` (tests/test_cli_conventions.py parses every example);
- a value's metavar from ``METAVARS`` (a unit or a kind: USD, HOURS, SECONDS, FILE, N), else
  from its type; flags and arguments show no ``<bool>`` / ``<list[str]>`` type column;
- a default is always shown as ``[default: X]`` at the end of the help: typer writes it for a
  fixed default, and a computed one written in the help as ``(default: X)`` moves there.

The help is click's plain layout (``rich_markup_mode=None`` in ``kplan.cli.main``): at 80 columns an
option's name and metavar are never cut, and ``kplan --help`` imports no rich.
"""

from __future__ import annotations

import re
from typing import Any

import typer.core

# Command path -> example command lines (each parses: tests/test_cli_conventions.py).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        "kplan estimate --example imagenet-resnet50 --budget 50 --out plan.json",
        "kplan launch train.py --plan plan.json --budget 50",
    ),
    "estimate": (
        "kplan estimate --example imagenet-resnet50 --budget 50",
        "kplan estimate --profile mlp.profile.json --cloud aws --deadline 12",
    ),
    "profile": (
        "kplan profile --example mlp-regression --out mlp.profile.json",
        "kplan profile train.py --base-batch 256 --dataset-size 50000 -- --lr 0.1",
    ),
    "launch": (
        "kplan launch kplan/examples/mlp_regression.py --nodes 2",
        "kplan launch train.py --plan plan.json --budget 20 -- --epochs 3",
        "kplan launch train.py -e cifar10-resnet18 --cloud aws --cloud gcp --budget 9",
        "kplan launch kplan/examples/mlp_regression.py --nodes 2 --detach",
    ),
    "check": ("kplan check", "kplan check --cloud aws --region us-west-2"),
    "controller": ("kplan controller kp-261123-101500-ab12 --detach",),
    "status": ("kplan status", "kplan status kp-261123-101500-ab12 --watch"),
    "logs": ("kplan logs kp-261123-101500-ab12 --node 0 --follow",),
    "down": ("kplan down kp-261123-101500-ab12", "kplan down --all"),
    "attach": (
        "kplan attach kp-261123-101500-ab12 --storage s3://my-bucket/kplan",
        "kplan attach kp-261123-101500-ab12 --storage gs://my-bucket/kplan --json",
    ),
    "report": (
        "kplan report kp-261123-101500-ab12 --html report.html",
        "kplan report --all --json",
        "kplan report kp-261123-101500-topk --against kp-261123-091500-dense",
    ),
    "simulate": (
        "kplan simulate --plan plan.json --example-trace p3 --runs 500",
        "kplan simulate --plan p.json --trace us-east-1=a.csv --trace us-east-2=b.csv",
    ),
    "model": ("kplan model fit --measurements m.csv --out model.json",),
    "model fit": ("kplan model fit --measurements m.csv --out model.json",),
    "model predict": ("kplan model predict --model model.json --configs configs.csv",),
    "catalog": ("kplan catalog list --gpu A100 --market spot",),
    "catalog list": (
        "kplan catalog list --gpu A100 --market spot --max-price 5",
        "kplan catalog list --cloud gcp --region us-central1 --json",
    ),
    "catalog update": ("kplan catalog update --cloud aws --region us-east-1",),
}

# Option name -> metavar, where the unit or kind says more than the type.
METAVARS: dict[str, str] = {
    "--budget": "USD",
    "--max-price": "USD/H",
    "--price": "USD/H",
    "--deadline": "HOURS",
    "--epochs": "EPOCHS",
    "--capacity-wait": "SECONDS",
    "--lease-minutes": "MINUTES",
    "--idle-minutes": "MINUTES",
    "--check-interval": "SECONDS",
    "--replan-interval": "SECONDS",
    "--checkpoint-interval": "SECONDS",
    "--timeout": "SECONDS",
    "--startup-timeout": "SECONDS",
    "--step-timeout": "SECONDS",
    "--interval": "SECONDS",
    "--wait": "SECONDS",
    "--out": "FILE",
    "--plan": "FILE",
    "--profile": "FILE",
    "--measurements": "FILE",
    "--trace": "FILE",
    "--html": "FILE",
    "--model": "FILE",
    "--configs": "FILE",
    "--catalog": "DIR",
    "--example": "NAME",
    "--example-trace": "NAME",
    "--name": "NAME",
    "--instance-type": "TYPE",
    "--nodes": "N",
    "--plan-nodes": "N|MIN-MAX",
    "--node": "RANK",
    "--job-id": "ID",
    "--storage": "URI",
    "--pip-index-url": "URL",
    "--policy": "POLICY",
    "--service-account": "EMAIL",
    "--gradient-bytes": "BYTES",
    "--intra-gbps": "GBIT/S",
    "--inter-gbps": "GBIT/S",
    "--objective": "cost|time|knee",
    "--market": "on-demand|spot",
    "--precision": "fp32|tf32|bf16|fp16",
    "--device": "auto|cpu|cuda",
    "--format": "FORMAT",
}
_BY_TYPE = {"int": "N", "float": "NUMBER", "path": "FILE"}
_COMMAND_METAVARS = {("estimate", "--nodes"): "N|MIN-MAX"}  # estimate's --nodes takes a range

# "(default: X)" in a help text, X holding at most one level of parentheses; or a closing
# sentence "Default: X."
_DEFAULT = re.compile(r"\s*\(default:? ((?:[^()]|\([^()]*\))+)\)")
_DEFAULT_SENTENCE = re.compile(r"\s*Default: (.+?)\.?\s*$", re.DOTALL)


def examples_epilog(path: str) -> str | None:
    """The "Examples:" epilog of a command path ("" for kplan itself, "catalog list")."""
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    # "\b": click keeps the paragraph's lines as they are (one example a line).
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def _metavar(path: str, param: typer.core.TyperOption) -> str:
    name = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    known = _COMMAND_METAVARS.get((path, name)) or METAVARS.get(name)
    if known is not None:
        return known
    label = param.display_type(_NO_CTX).strip("<>")
    label = label.removeprefix("list[").removesuffix("]").lower()
    return _BY_TYPE.get(label, name.lstrip("-").upper().replace("-", "_"))


_NO_CTX: Any = None  # display_type reads the context only for choices, which kplan does not use


def _move_default(help_text: str) -> str:
    """``... (default: X) ...`` -> ``... ... [default: X]``: the one way defaults are shown."""
    found = _DEFAULT.search(help_text) or _DEFAULT_SENTENCE.search(help_text)
    if found is None:
        return help_text
    rest = (help_text[: found.start()] + help_text[found.end() :]).strip()
    return f"{rest}  [default: {found.group(1)}]"


def conform_param(path: str, param: Any) -> None:
    """Bring one option or argument to the conventions (metavar, type column, default)."""
    if isinstance(param, typer.core.TyperArgument):
        # typer shows an argument's type even beside its metavar: its name says enough.
        param.display_type_rich = _no_type  # type: ignore[method-assign]
    elif isinstance(param, typer.core.TyperOption):
        if param.is_flag or param.count:
            param.metavar = ""
        elif param.metavar is None:
            param.metavar = _metavar(path, param)
    if getattr(param, "help", None):
        param.help = _move_default(param.help)


def _no_type(ctx: Any = None) -> None:
    return None


def conform(path: str, command: Any) -> None:
    """Apply the conventions to a command's options and arguments and set its example epilog."""
    for param in command.params:
        conform_param(path, param)
    if command.epilog is None:
        command.epilog = examples_epilog(path)


class KplanCommand(typer.core.TyperCommand):
    """A typer command whose help follows kplan's conventions (module docstring)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # --help is a flag too
        return option

    def format_help(self, ctx: Any, formatter: Any) -> None:
        conform(_path(ctx), self)
        super().format_help(ctx, formatter)


class KplanGroup(typer.core.TyperGroup):
    """A typer group (``kplan model``, ``kplan catalog``) with the same conventions."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def format_help(self, ctx: Any, formatter: Any) -> None:
        conform(_path(ctx), self)
        super().format_help(ctx, formatter)


def _path(ctx: Any) -> str:
    """The command path without the program name: "", "estimate", "catalog list"."""
    return " ".join(str(ctx.command_path).split()[1:])
