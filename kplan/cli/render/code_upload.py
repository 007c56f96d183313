"""Terminal rendering of what ``kplan launch --dry-run`` would upload as the job's code (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kplan.launcher.packing import PackedCode

SHOWN_FILES = 20  # the table lists the first ones; --json lists every file


def _visible(path: str) -> str:
    """A file name as printable text: control characters as ``\\xNN``, rich markup escaped."""
    from rich.markup import escape

    return escape("".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in path))


def code_lines(code: PackedCode) -> list[str]:
    """Rich-markup lines: counts, the first files, and what was left out."""
    count = len(code.files)
    lines = [
        f"   code: {count:,} file(s), {code.total_bytes:,} bytes "
        f"({code.archive_bytes:,} packed) from {_visible(code.folder)}"
        + (
            f"; {code.ignored:,} path(s) left out by .gitignore/.kplanignore"
            if code.ignored
            else ""
        )
    ]
    shown = code.files[:SHOWN_FILES]
    width = max((len(_visible(path)) for path, _ in shown), default=0)
    for path, size in shown:
        lines.append(f"     {_visible(path):<{width}}  {size:>12,}")
    if count > SHOWN_FILES:
        lines.append(f"     ... and {count - SHOWN_FILES:,} more (--json lists all)")
    secrets = code.skipped_secrets
    lines.append(
        "   left out as secrets (always): "
        + (", ".join(_visible(p) for p in secrets) if secrets else "none found")
    )
    if code.skipped_links:
        links = ", ".join(_visible(p) for p in code.skipped_links)
        lines.append(f"   left out, links pointing outside the folder: {links}")
    return lines
