"""HTTP plumbing for the tests' Google API servers (Compute Engine, Cloud Storage): a threaded
HTTP/1.1 server on 127.0.0.1, the APIs' error body, and the list ``filter`` expressions."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

Json = dict[str, Any]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> Json:
        detail = {"message": self.message, "domain": "global", "reason": self.reason}
        return {"error": {"code": self.code, "message": self.message, "errors": [detail]}}


def lookup(resource: Json, field: str) -> Any:
    value: Any = resource
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


_TERM = re.compile(r'\(?\s*([A-Za-z][\w.-]*)\s*(=|!=|\beq\b|\bne\b)\s*("[^"]*"|[^\s()]+)\s*\)?')


def parse_filter(text: str) -> list[tuple[str, str, str]]:
    """``field = "value"`` terms (AIP-160 subset, or ``eq``/``ne`` with a regex), ANDed."""
    terms = [(f, op, v.strip('"')) for f, op, v in _TERM.findall(text)]
    rest = re.sub(r"\bAND\b", "", _TERM.sub("", text)).strip()
    if rest or (text.strip() and not terms):
        raise ApiError(400, "invalid", f"Invalid value for field 'filter': '{text}'. Invalid.")
    return terms


def matches(resource: Json, terms: list[tuple[str, str, str]]) -> bool:
    for field, op, want in terms:
        value = lookup(resource, field)
        have = (
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        )
        hit = re.fullmatch(want, have) is not None if op in ("eq", "ne") else have == want
        if hit == (op in ("!=", "ne")):
            return False
    return True


Responder = Callable[[str, str, dict[str, str], bytes], tuple[int, bytes, str]]


@contextmanager
def serve_http(respond: Responder) -> Iterator[str]:
    """An HTTP/1.1 server on 127.0.0.1 (free port) in a thread, answering with ``respond(method,
    path, query, body) -> (status, body, content type)``; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes

        def _reply(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, data, kind = respond(self.command, unquote(url.path), query, raw)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _reply

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
