"""A small Cloud Storage JSON API server for ``GCSStorage`` tests: media upload, ``alt=media``
download, object metadata, list (``prefix``, ``maxResults``/``pageToken``) and delete, with the
API's error body for a missing bucket or object."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.gcp_http import serve_http

JSON = "application/json; charset=UTF-8"


def _error(code: int, reason: str, message: str) -> tuple[int, bytes, str]:
    detail = {"message": message, "domain": "global", "reason": reason}
    body = {"error": {"code": code, "message": message, "errors": [detail]}}
    return code, json.dumps(body).encode(), JSON


class FakeGCS:
    def __init__(self, *buckets: str) -> None:
        self.buckets = set(buckets)
        self.objects: dict[tuple[str, str], bytes] = {}
        self.page_size = 1000
        self.lock = threading.Lock()

    def _meta(self, bucket: str, name: str) -> dict[str, Any]:
        data = self.objects[(bucket, name)]
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data))}

    def respond(
        self, method: str, path: str, query: dict[str, str], raw: bytes
    ) -> tuple[int, bytes, str]:
        upload = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", path)
        one = re.fullmatch(r"/storage/v1/b/([^/]+)/o/(.+)", path)
        many = re.fullmatch(r"/storage/v1/b/([^/]+)/o", path)
        match = upload or one or many
        if match is None:
            return _error(404, "notFound", f"No route for {method} {path}")
        bucket = match[1]
        if bucket not in self.buckets:
            return _error(404, "notFound", "The specified bucket does not exist.")
        with self.lock:
            if upload and method == "POST" and query.get("uploadType") == "media":
                self.objects[(bucket, query["name"])] = raw
                return 200, json.dumps(self._meta(bucket, query["name"])).encode(), JSON
            if one and (bucket, one[2]) not in self.objects:
                return _error(404, "notFound", f"No such object: {bucket}/{one[2]}")
            if one and method == "GET":
                if query.get("alt") == "media":
                    return 200, self.objects[(bucket, one[2])], "application/octet-stream"
                return 200, json.dumps(self._meta(bucket, one[2])).encode(), JSON
            if one and method == "DELETE":
                del self.objects[(bucket, one[2])]
                return 204, b"", JSON
            if many and method == "GET":
                prefix = query.get("prefix", "")
                names = sorted(n for b, n in self.objects if b == bucket and n.startswith(prefix))
                start = int(query.get("pageToken") or 0)
                size = min(int(query.get("maxResults", self.page_size)), self.page_size)
                page: dict[str, Any] = {"kind": "storage#objects"}
                page["items"] = [self._meta(bucket, n) for n in names[start : start + size]]
                if start + size < len(names):
                    page["nextPageToken"] = str(start + size)
                return 200, json.dumps(page).encode(), JSON
        return _error(400, "invalid", f"Unsupported request {method} {path}")

    @contextmanager
    def serve(self) -> Iterator[str]:
        with serve_http(self.respond) as url:
            yield url
