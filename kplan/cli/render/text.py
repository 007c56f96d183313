"""Text a user or a job wrote, made safe to print: control characters stripped, rich markup
escaped.

Reasons, names, zones, paths, instance ids, event messages and error messages come from plan
and profile files, policies, the clouds and the workers. Printed raw they can crash rich
(``[/bold]`` is a ``MarkupError``), restyle the terminal or rewrite what was printed before
(``ESC[2J``, ``\\r``). Every renderer passes such text through :func:`safe` (rich markup) or
:func:`clean` (plain lines and HTML, which has its own escaping).
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


def safe(value: object) -> str:
    """``clean(value)`` with rich markup escaped: prints literally through ``console.print``."""
    from rich.markup import escape

    return escape(clean(value))
