"""Text a user or a job wrote, made safe to print through rich.

Printed raw, such text can crash rich (``[/bold]`` is a ``MarkupError``) as well as restyle the
terminal. Every rich renderer passes it through :func:`safe`: ``kplan.core.text.clean`` (control
characters and ESC sequences stripped), then rich markup escaped. Plain lines and the HTML report
use ``clean`` alone.
"""

from __future__ import annotations

from kplan.core.text import clean


def safe(value: object) -> str:
    """``clean(value)`` with rich markup escaped: prints literally through ``console.print``."""
    from rich.markup import escape

    return escape(clean(value))
