"""Text a user or a job wrote, made safe to print: control characters and ESC sequences
stripped.

Reasons, names, zones, paths, instance ids, event messages and error messages come from plan
and profile files, policies, the clouds and the workers. Printed raw they can restyle the
terminal or rewrite what was printed before (``ESC[2J``, ``\\r``). Plain lines and HTML (which
has its own escaping) pass such text through :func:`clean`; the rich renderers use
``kplan.cli.render.text.safe``, which also escapes rich markup.
"""

from __future__ import annotations

import re

# ESC sequences first (CSI ``ESC [ params final``, OSC ``ESC ] ... BEL|ESC \\``, and two-byte
# ``ESC X``), then any C0 control but tab and newline, DEL, and the C1 controls.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def clean(value: object) -> str:
    """``str(value)`` without control characters (tab and newline stay) or ESC sequences."""
    return _CONTROL.sub("", str(value))


def clipped(text: str, limit: int) -> str:
    """``repr`` of at most ``limit`` characters of ``text``, with ``...`` where it was cut (a
    5,000-character value echoed whole in an error line)."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")
