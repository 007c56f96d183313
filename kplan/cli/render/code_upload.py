"""Terminal rendering of what ``kplan launch --dry-run`` would upload as the job's code (rich)."""

from __future__ import annotations

from typing import Any

SHOWN_FILES = 20  # the table lists the first ones; --json lists every file


def _visible(path: str) -> str:
    """A file name as printable text: control characters as ``\\xNN``, rich markup escaped."""
    from rich.markup import escape

    return escape("".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in path))


def code_lines(code: dict[str, Any]) -> list[str]:
    """Rich-markup lines: counts, the first files, and what was left out."""
    files = code["files"]
    lines = [
        f"   code: {code['file_count']:,} file(s), {code['total_bytes']:,} bytes "
        f"({code['archive_bytes']:,} packed) from {_visible(code['folder'])}"
        + (
            f"; {code['ignored']:,} path(s) left out by .gitignore/.kplanignore"
            if code["ignored"]
            else ""
        )
    ]
    width = max((len(_visible(f["path"])) for f in files[:SHOWN_FILES]), default=0)
    for f in files[:SHOWN_FILES]:
        lines.append(f"     {_visible(f['path']):<{width}}  {f['bytes']:>12,}")
    if code["file_count"] > SHOWN_FILES:
        lines.append(f"     ... and {code['file_count'] - SHOWN_FILES:,} more (--json lists all)")
    secrets = code["skipped_secrets"]
    lines.append(
        "   left out as secrets (always): "
        + (", ".join(_visible(p) for p in secrets) if secrets else "none found")
    )
    if code["skipped_links"]:
        links = ", ".join(_visible(p) for p in code["skipped_links"])
        lines.append(f"   left out, links pointing outside the folder: {links}")
    return lines
