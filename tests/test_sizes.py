"""Rooms of a size a person can hold: no product file over 650 lines, no function over 90.

Every file under ``kplan/`` is read with ``ast``; a function's length is from its ``def`` (or
first decorator) to its last line, nested functions counted in their parent too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ROOT / "kplan"
MAX_FILE_LINES = 650
MAX_FUNCTION_LINES = 90


def _product_files() -> list[Path]:
    return sorted(PRODUCT.rglob("*.py"))


def _function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function in ``path``."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                last = child.end_lineno or child.lineno
                out.append((f"{prefix}{child.name}", first, last - first + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_the_size_check_sees_long_functions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(100))
    src = tmp_path / "long.py"
    src.write_text(f"class A:\n  def f(self):\n{body}\n  def g(self):\n    return 1\n")
    found = {name: n for name, _, n in _function_lengths(src)}
    assert found["A.f"] == 101 and found["A.g"] == 2


def test_product_files_are_small_enough() -> None:
    files = _product_files()
    assert files, f"no product files under {PRODUCT}"
    over = []
    for path in files:
        lines = len(path.read_text("utf-8").splitlines())
        if lines > MAX_FILE_LINES:
            over.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not over, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(over)


def test_product_functions_are_small_enough() -> None:
    over = []
    for path in _product_files():
        for name, line, n in _function_lengths(path):
            if n > MAX_FUNCTION_LINES:
                over.append(f"{path.relative_to(ROOT)}:{line} {name}: {n} lines")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)
