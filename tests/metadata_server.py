"""A local instance-metadata server speaking the two clouds' spot-notice endpoints.

AWS (IMDSv2): ``PUT /latest/api/token`` returns a token; ``GET
/latest/meta-data/spot/instance-action`` without that token is 401, then 404 until the notice,
then its JSON. GCP: ``GET /computeMetadata/v1/instance/preempted`` needs ``Metadata-Flavor:
Google`` (else 403) and says ``FALSE``, then ``TRUE``. The notice is given when ``notice_at``
(epoch seconds of the instance's end) or ``notice_in`` (seconds from the first read that sees
it) is set and, if ``ready`` is set, that file exists.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "kplan-test-token"


class Metadata:
    def __init__(self) -> None:
        self.notice_at: float | None = None
        self.notice_in: float | None = None  # or: the end this long after the notice is seen
        self.ready: Path | None = None
        self.reads: list[str] = []

    def noticed(self) -> bool:
        if self.ready is not None and not self.ready.exists():
            return False
        if self.notice_at is None and self.notice_in is not None:
            self.notice_at = time.time() + self.notice_in
        return self.notice_at is not None


def _handler(md: Metadata) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, code: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            md.reads.append(f"PUT {self.path}")
            ok = self.path == "/latest/api/token" and self.headers.get(
                "X-aws-ec2-metadata-token-ttl-seconds"
            )
            self._send(200, TOKEN) if ok else self._send(400)

        def do_GET(self) -> None:
            md.reads.append(f"GET {self.path}")
            if self.path == "/latest/meta-data/spot/instance-action":
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    return self._send(401)
                if not md.noticed():
                    return self._send(404)
                assert md.notice_at is not None
                when = datetime.fromtimestamp(md.notice_at, UTC)
                doc = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
                return self._send(200, json.dumps(doc))
            if self.path == "/computeMetadata/v1/instance/preempted":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403)
                return self._send(200, "TRUE" if md.noticed() else "FALSE")
            return self._send(404)

    return Handler


@contextmanager
def metadata_server() -> Iterator[tuple[str, Metadata]]:
    """(base URL on 127.0.0.1, its state); stopped on exit."""
    md = Metadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(md))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", md
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
