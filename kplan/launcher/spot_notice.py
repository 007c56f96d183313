"""A spot node's watch for its interruption notice (runs on the node; the bootstrap starts it).

``python -m kplan.launcher.spot_notice --cloud aws|gcp --pid PID --stop-before S`` reads the
instance metadata every ``POLL_S`` seconds (kplan/planner/spotnotice.py):

- AWS: a session token (IMDSv2, ``PUT /latest/api/token``), then
  ``GET /latest/meta-data/spot/instance-action``: 404 until the notice, then
  ``{"action": "terminate" | "stop" | "hibernate", "time": "<UTC, ISO 8601>"}``;
- GCP: ``GET /computeMetadata/v1/instance/preempted`` (``Metadata-Flavor: Google``): ``TRUE``
  once the instance is being preempted, which leaves it 30 seconds.

At ``S`` seconds before the named time (GCP: at once) it sends SIGTERM to ``PID``, the node's
bootstrap script, which forwards it to torchrun and its workers: they finish the step in flight,
write a checkpoint and exit; the bootstrap uploads the checkpoint to the job's bucket. It exits
when ``PID`` is gone. A metadata server that does not answer (the node is shutting down, a
network hiccup) is polled again: the watch never ends the job on its own error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from typing import TextIO

from kplan.core.procs import alive
from kplan.planner.spotnotice import NOTICE_S, POLL_S

METADATA = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
METADATA_ENV = "KPLAN_METADATA_URL"  # another metadata server (tests run one on 127.0.0.1)
TIMEOUT_S = 2.0


def _read(req: urllib.request.Request) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), ""


def aws_notice(base: str, now: float) -> float | None:
    """The time (epoch seconds) AWS will take the instance, or None before a notice."""
    token_req = urllib.request.Request(
        f"{base}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"},
    )
    code, token = _read(token_req)
    if code != 200 or not token:
        raise OSError(f"no metadata token (HTTP {code})")
    req = urllib.request.Request(
        f"{base}/latest/meta-data/spot/instance-action",
        headers={"X-aws-ec2-metadata-token": token},
    )
    code, body = _read(req)
    if code == 404:
        return None
    if code != 200:
        raise OSError(f"instance-action: HTTP {code}")
    when = json.loads(body).get("time")
    if not isinstance(when, str):
        return now + NOTICE_S["aws"]  # a notice without its time: the documented two minutes
    return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()


def gcp_notice(base: str, now: float) -> float | None:
    """When GCP will take the instance at the earliest (30 s after the flag, which this read
    may see a poll late), or None before it."""
    req = urllib.request.Request(
        f"{base}/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
    )
    code, body = _read(req)
    if code != 200:
        raise OSError(f"preempted: HTTP {code}")
    return now + NOTICE_S["gcp"] - POLL_S if body.strip().upper() == "TRUE" else None


NOTICES: dict[str, Callable[[str, float], float | None]] = {"aws": aws_notice, "gcp": gcp_notice}


def watch(
    cloud: str,
    pid: int,
    stop_before_s: float,
    base: str | None = None,
    poll_s: float = POLL_S,
    out: TextIO = sys.stdout,
) -> str:
    """Watch until ``pid`` is gone ("gone") or was sent SIGTERM for a notice ("stopped")."""
    notice = NOTICES[cloud]
    url = (base or METADATA[cloud]).rstrip("/")
    said = False  # the first failed read is logged, not every one
    while alive(pid):
        err: Exception | None = None
        try:
            at = notice(url, time.time())
        except (OSError, ValueError) as e:  # no answer now: poll again
            at, err = None, e
        if at is not None:
            stop_at = at - stop_before_s
            print(
                f"kplan: spot interruption notice: the instance goes in "
                f"{at - time.time():.0f} s; the workers stop with a checkpoint in "
                f"{max(stop_at - time.time(), 0.0):.0f} s",
                file=out,
                flush=True,
            )
            while time.time() < stop_at and alive(pid):
                time.sleep(min(1.0, max(stop_at - time.time(), 0.0)))
            if alive(pid):
                os.kill(pid, signal.SIGTERM)
                return "stopped"
            return "gone"
        if err is not None and not said:
            print(f"kplan: spot notice watch: {err}; polling on", file=out, flush=True)
            said = True
        time.sleep(poll_s)
    return "gone"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kplan.launcher.spot_notice")
    ap.add_argument("--cloud", choices=sorted(NOTICES), required=True)
    ap.add_argument("--pid", type=int, required=True, help="the process to send SIGTERM")
    ap.add_argument("--stop-before", type=float, required=True, help="seconds before the time")
    ap.add_argument(
        "--metadata",
        default=os.environ.get(METADATA_ENV) or None,
        help=f"the metadata server's base URL (default: the cloud's; ${METADATA_ENV})",
    )
    ap.add_argument("--poll", type=float, default=POLL_S, help="seconds between reads")
    a = ap.parse_args(argv)
    if not (a.stop_before >= 0 and a.poll > 0):
        ap.error("--stop-before must be >= 0 and --poll > 0")
    watch(a.cloud, a.pid, a.stop_before, a.metadata, a.poll)
    return 0


if __name__ == "__main__":
    sys.exit(main())
