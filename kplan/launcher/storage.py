"""Where a job's code, checkpoints, metrics and node status live: a local folder or a bucket.

Layout under the job's root (``<root>/<job_id>/``): ``code/`` (the packed job), ``ckpt/``
(runtime checkpoints), ``metrics/`` (the runtime's JSON-lines, one file per rank) and
``status/node-<rank>.json`` (``{"exit_code": int, "time": float}``, written by a node's
bootstrap when its worker group exits). ``LocalStorage`` is the local provider's; ``S3Storage``
(AWS) and ``GCSStorage`` (GCP) live with their providers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kplan.runtime.private import make_dirs, write_private


class Storage(Protocol):
    uri: str  # e.g. "file:///home/u/.kplan/jobs", "s3://bucket/prefix", "gs://bucket/prefix"

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    def list_keys(self, prefix: str) -> Sequence[str]: ...

    def delete_prefix(self, prefix: str) -> None: ...


class LocalStorage:
    """A folder on this machine (atomic writes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = root.resolve().as_uri()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents and path != self.root.resolve():
            raise ValueError(f"key {key!r} escapes the storage root")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        make_dirs(path.parent)  # 0700; the file 0600 (code, checkpoints, logs)
        tmp = path.with_name(f".{path.name}.tmp")
        write_private(tmp, data)
        tmp.replace(path)

    def get_bytes(self, key: str) -> bytes | None:
        path = self._path(key)
        return path.read_bytes() if path.is_file() else None

    def read_from(self, key: str, start: int) -> bytes:
        """The object's bytes from offset ``start`` (b"" when it is shorter or missing): the
        metrics readers poll growing files without reading them whole each time."""
        try:
            with open(self._path(key), "rb") as handle:
                handle.seek(start)
                return handle.read()
        except FileNotFoundError:
            return b""

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root.resolve()
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        root = self.root.resolve()
        return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list_keys(prefix):
            self._path(key).unlink(missing_ok=True)


def read_json(storage: Storage, key: str) -> Any | None:
    data = storage.get_bytes(key)
    return None if data is None else json.loads(data)
