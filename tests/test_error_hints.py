"""Every error kplan raises carries a hint (kplan/core/errors.py promises one; issue 24).

The product source is parsed (no import, no run): each call of ``KplanError`` or any subclass
defined under kplan/ must pass a hint, the second positional argument or ``hint=``, that is not
an empty or blank string literal. A call that spreads its arguments (``InfeasibleError(*why)``)
passes the (message, hint) pair its helper builds and is not judged here.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "kplan"


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(ROOT.rglob("*.py"))}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def error_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """KplanError and every class under kplan/ that derives from it (by name, transitively)."""
    names = {"KplanError"}
    classes = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
    grew = True
    while grew:
        grew = False
        for cls in classes:
            if cls.name not in names and any(_name(b) in names for b in cls.bases):
                names.add(cls.name)
                grew = True
    return names


def _hint(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "hint":
            return keyword.value
    return call.args[1] if len(call.args) >= 2 else None


def calls_without_a_hint(trees: dict[Path, ast.Module]) -> list[str]:
    """``path:line: call`` for each error built without a hint or with a blank literal one."""
    classes = error_classes(trees)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _name(node.func) in classes):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue
            hint = _hint(node)
            blank = isinstance(hint, ast.Constant) and not str(hint.value).strip()
            if hint is None or blank:
                where = path.relative_to(ROOT.parent)
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_the_scan_knows_kplans_error_classes() -> None:
    classes = error_classes(_trees())
    assert {"KplanError", "InputError", "DataFileError", "CloudError", "StateError"} <= classes


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ('raise InputError("x")', True),
        ('raise InputError("x", "")', True),
        ('raise InputError("x", hint="  ")', True),
        ('raise InputError("x", "give y")', False),
        ('raise InputError("x", hint=f"give {y}")', False),
        ("raise InfeasibleError(*why)", False),
    ],
)
def test_the_scan_finds_a_missing_or_blank_hint(source: str, bad: bool) -> None:
    trees = {ROOT / "x.py": ast.parse(f"class InfeasibleError(InputError): ...\n{source}\n")}
    trees.update({p: t for p, t in _trees().items() if p.name == "errors.py"})  # KplanError
    assert bool(calls_without_a_hint(trees)) is bad


def test_every_error_in_kplan_has_a_hint() -> None:
    missing = calls_without_a_hint(_trees())
    assert not missing, f"{len(missing)} error(s) without a hint:\n" + "\n".join(missing)
