"""``GCSStorage``: the Storage of ``kplan/launcher/storage.py`` in Cloud Storage (``gs://bucket/prefix``).

It speaks the Cloud Storage JSON API (media upload, ``alt=media`` download, list, delete) through
google-auth's ``AuthorizedSession``, so it needs no package beyond what google-cloud-compute
brings. Keys are relative to the prefix: ``<job>/status/node-0.json`` under ``gs://b/kplan`` is
the object ``kplan/<job>/status/node-0.json`` of bucket ``b``. The bucket must exist (kplan
creates no bucket on GCP): the user names it with ``KPLAN_GCP_STORAGE_URI``, and the instances'
service account needs ``roles/storage.objectAdmin`` on it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from kplan.core.errors import InputError
from kplan.launcher.providers import check_prefix, gcp_errors

GCS_ENDPOINT = "https://storage.googleapis.com"
READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_BUCKET = re.compile(r"[a-z0-9][-_.a-z0-9]{1,220}[a-z0-9]")


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/prefix`` as ``(bucket, prefix)``; the prefix has no slashes at its ends."""
    if not uri.startswith("gs://"):
        raise InputError(f"storage URI {uri!r} is not a gs:// URI", "e.g. gs://bucket/kplan")
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise InputError(
            f"storage URI {uri!r} names no valid bucket ({bucket!r})",
            "Cloud Storage bucket names are 3-222 lowercase letters, digits, '-', '_' and '.'",
        )
    check_prefix(uri, prefix)
    return bucket, prefix.strip("/")


class GCSStorage:
    """Objects under one bucket prefix."""

    def __init__(
        self,
        uri: str,
        *,
        credentials: Any = None,
        endpoint: str | None = None,
        retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
    ) -> None:
        self.uri = uri
        self.bucket, self.prefix = parse_gs_uri(uri)
        self._credentials = credentials  # None: Application Default Credentials
        self._endpoint = (endpoint or GCS_ENDPOINT).rstrip("/")
        self._retries, self._backoff_s, self._timeout_s = retries, backoff_s, timeout_s
        self._session: Any = None

    def _object(self, key: str) -> str:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise ValueError(f"key {key!r} is not a plain relative key")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _request(
        self, method: str, url: str, what: str, missing_ok: bool = False, **kw: Any
    ) -> Any:
        """One JSON API request; retried when transient; CloudError otherwise (None on a 404
        when ``missing_ok``)."""

        def send() -> Any:
            from google.api_core import exceptions as gexc

            if self._session is None:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                creds = self._credentials
                if creds is None:
                    creds, _ = google.auth.default(scopes=[READ_WRITE_SCOPE])
                self._session = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
            response = self._session.request(method, url, timeout=self._timeout_s, **kw)
            if response.status_code >= 400:
                raise gexc.from_http_response(response)  # type: ignore[no-untyped-call]
            return response

        if missing_ok:
            return gcp_errors.call_tolerating(
                send,
                what,
                gcp_errors.is_not_found,
                retries=self._retries,
                backoff_s=self._backoff_s,
            )
        return gcp_errors.call(send, what, retries=self._retries, backoff_s=self._backoff_s)

    def put_bytes(self, key: str, data: bytes) -> None:
        name = self._object(key)
        self._request(
            "POST",
            f"{self._endpoint}/upload/storage/v1/b/{self.bucket}/o",
            f"writing gs://{self.bucket}/{name}",
            params={"uploadType": "media", "name": name},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )

    def get_bytes(self, key: str) -> bytes | None:
        name = self._object(key)
        response = self._request(
            "GET",
            f"{self._endpoint}/storage/v1/b/{self.bucket}/o/{quote(name, safe='')}",
            f"reading gs://{self.bucket}/{name}",
            missing_ok=True,
            params={"alt": "media"},
        )
        return None if response is None else bytes(response.content)

    def list_keys(self, prefix: str) -> list[str]:
        base = self._object(prefix) if prefix.strip("/") else self.prefix
        start = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        token: str | None = None
        while True:
            params = {"prefix": base, "fields": "items(name),nextPageToken"}
            if token:
                params["pageToken"] = token
            page = self._request(
                "GET",
                f"{self._endpoint}/storage/v1/b/{self.bucket}/o",
                f"listing gs://{self.bucket}/{base}",
                params=params,
            ).json()
            for item in page.get("items", []):
                name = str(item["name"])
                # a folder's keys, as LocalStorage lists them: "a/b" holds "a/b/c", not "a/bc"
                if not base or name == base or name.startswith(base + "/"):
                    keys.append(name[len(start) :])
            token = page.get("nextPageToken")
            if not token:
                return sorted(keys)

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list_keys(prefix):
            name = self._object(key)
            self._request(
                "DELETE",
                f"{self._endpoint}/storage/v1/b/{self.bucket}/o/{quote(name, safe='')}",
                f"deleting gs://{self.bucket}/{name}",
                missing_ok=True,
            )
