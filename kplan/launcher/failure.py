"""Why a node failed, in the words of its log: the lines a user needs to see in the job's error.

A node's log (``<job>/logs/node-<rank>.log`` in the job's storage) holds the training script's
output and torchrun's own messages. :func:`error_line` picks the line that says what went wrong
(the last ``SomeError: ...`` line of a traceback, else the last line that is not torchrun's
bookkeeping); :func:`log_tail` reads the last lines of a node's log, at most ``TAIL_BYTES``
from its end, optionally only the script's own lines (what a failed node's event keeps: torchrun
and noderun may add lines after the script's last words, more of them on a loaded machine).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kplan.launcher.bootstrap import log_key
from kplan.launcher.storage import Storage

TAIL_BYTES = 64 * 1024  # how much of a log's end is read
TAIL_LINES = 5  # the lines kept with a failure
MAX_LINE = 300  # characters of one line kept in a reason

# torchrun's own log lines ("E1123 18:18:10.456000 5162 torch/...] failed (exitcode: 1) ...")
_TORCH_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
# the last line of a Python traceback: "ModuleNotFoundError: No module named 'x'", "KeyError"
_EXCEPTION = re.compile(r"^(\[rank\d+\]: ?)?([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))(:|$)")
_NOISE = re.compile(r"^(=+|-+|\s*|kplan: not restarting .*)$")  # separators, noderun's note


def log_tail(
    storage: Storage, job_id: str, rank: int, lines: int = TAIL_LINES, script_only: bool = False
) -> list[str]:
    """The last ``lines`` non-empty lines of node ``rank``'s log (none if it has no log);
    ``script_only``: leave out torchrun's log lines, separators and noderun's notes."""
    try:
        data = storage.get_bytes(log_key(job_id, rank))
    except (OSError, ValueError):
        return []
    if not data:
        return []
    text = data[-TAIL_BYTES:].decode("utf-8", "replace")
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    if script_only:
        kept = [line for line in kept if not (_TORCH_LOG.match(line) or _NOISE.match(line))]
    return kept[-lines:] if lines > 0 else []


def error_line(lines: Sequence[str]) -> str | None:
    """The line of ``lines`` that says what failed: the last exception line, else the last line
    that is not torchrun's bookkeeping, else None. Shortened to ``MAX_LINE`` characters."""
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return _short(line.strip())
    for line in reversed(lines):
        if not _TORCH_LOG.match(line) and not _NOISE.match(line):
            return _short(line.strip())
    return None


def node_error(storage: Storage, job_id: str, rank: int) -> str | None:
    """The line of node ``rank``'s log that says why it failed (None: no log, or no such line)."""
    return error_line(log_tail(storage, job_id, rank, lines=200))


def _short(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."
