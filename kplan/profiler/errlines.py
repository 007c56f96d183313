"""Find the line that explains a failed job in its stderr (torchrun's own noise removed).

Under torchrun the output ends with the agent's report: glog-style lines
(``E1122 04:35:24.724000 6412 torch/distributed/elastic/...``), its own traceback and a
``Root Cause (first observed failure)`` block naming the rank that failed first. Worker
tracebacks carry a ``[rankN]:`` prefix. The explanation is the failing rank's last exception
line, else the last exception line any worker printed, else the last line it printed at all.
"""

from __future__ import annotations

import re

_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
# "ValueError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure))\b(:.*)?$")
_AGENT_LOG = re.compile(r"^[WEIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ torch/distributed/elastic/")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):[\s\S]*?rank\s*:\s*(\d+)")
_NOISE = re.compile(r"^(\*{5,}|={5,}|-{5,}|Setting OMP_NUM_THREADS)")
_TRACEBACK_BODY = ("File ", "Traceback", "^", "~", "During handling", "The above exception")


def _worker_part(lines: list[str]) -> list[str]:
    """The lines before torchrun's agent started reporting the failure."""
    for i, line in enumerate(lines):
        if _AGENT_LOG.match(line):
            return lines[:i]
    return lines


def _last_exception(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return line.strip()
    return None


def last_error_line(stderr: str) -> str:
    """The job's last exception line (``ValueError: boom``), else its last meaningful line."""
    all_lines = stderr.splitlines()
    worker = _worker_part(all_lines)
    root = _ROOT_CAUSE.search(stderr)
    if root is not None:
        prefix = f"[rank{root.group(1)}]:"
        mine = [_RANK_PREFIX.sub("", ln) for ln in worker if ln.startswith(prefix)]
        found = _last_exception(mine)
        if found:
            return found
    cleaned = [_RANK_PREFIX.sub("", ln).rstrip() for ln in worker]
    cleaned = [ln for ln in cleaned if ln.strip() and not _NOISE.match(ln)]
    found = _last_exception(cleaned)
    if found:
        return found
    for line in reversed(cleaned):
        text = line.strip()
        if not text.startswith(_TRACEBACK_BODY):
            return text[:300]
    return ""
