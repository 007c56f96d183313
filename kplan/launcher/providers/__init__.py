"""Providers by name. Each module imports its cloud SDK inside its functions.

A provider module exposes a factory ``create(settings: ProviderSettings) -> Backend``; the map
below names it as ``"module:attribute"`` and :func:`get_backend` imports it only when asked, so
``kplan --help`` never loads boto3 or google.cloud. Adding a provider is a one-line edit of
``FACTORIES``. Cloud-specific settings (endpoints, projects) are read by the factory itself from
the environment (``KPLAN_<CLOUD>_...``) or the cloud SDK's own configuration; never credentials
in kplan's files.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from kplan.core.errors import InputError
from kplan.launcher.provider import Provider
from kplan.launcher.storage import Storage

FACTORIES: dict[str, str] = {
    "local": "kplan.launcher.providers.local:create",
    "aws": "kplan.launcher.providers.aws:create",
    "gcp": "kplan.launcher.providers.gcp:create",
}

# A job storage URI's scheme -> the cloud whose provider reads it (a bare path is a local folder).
STORAGE_CLOUDS = {"s3": "aws", "gs": "gcp", "file": "local"}


def storage_cloud(uri: str) -> tuple[str, str]:
    """(cloud, URI) of a job's storage given as ``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX``,
    ``file:///FOLDER`` or a local folder (made a ``file://`` URI)."""
    text = uri.strip()
    scheme = urlparse(text).scheme if "://" in text else ""
    if text and not scheme:
        return "local", Path(text).expanduser().resolve().as_uri()
    if scheme not in STORAGE_CLOUDS or not text.split("://", 1)[1].strip("/"):
        raise InputError(
            f"storage {uri[:80]!r} is not a job storage URI",
            hint="s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, or a local folder: the --storage "
            "the job was launched with",
        )
    return STORAGE_CLOUDS[scheme], text


def check_prefix(uri: str, prefix: str) -> None:
    """A storage URI's prefix is one line of printable text without spaces (``--storage
    s3://b/jobs`` with a newline or a tab at its end read and wrote keys under ``jobs\\n/``);
    ``parse_s3_uri`` and ``parse_gs_uri`` check it."""
    if not all(c.isprintable() and not c.isspace() for c in prefix):
        raise InputError(
            f"storage URI {uri[:80]!r} holds a space or a control character in its prefix",
            hint="give the storage as s3://BUCKET/PREFIX or gs://BUCKET/PREFIX on one line",
        )


@dataclass(frozen=True)
class ProviderSettings:
    """What a factory gets: kplan's home folder and the user's choices for this job."""

    home: Path  # $KPLAN_HOME (default ~/.kplan): the state database and local job folders
    region: str | None = None  # None: the provider's default region
    storage_uri: str | None = None  # s3://bucket/prefix, gs://bucket/prefix; None: default


@dataclass(frozen=True)
class Backend:
    """A provider and the storage its instances share with the launcher (code, status, logs)."""

    provider: Provider
    storage: Storage


Factory = Callable[[ProviderSettings], Backend]


def provider_names() -> list[str]:
    return sorted(FACTORIES)


def get_factory(name: str) -> Factory:
    """The factory for provider ``name``, importing its module now."""
    target = FACTORIES.get(name)
    if target is None:
        raise InputError(f"unknown cloud {name!r}", hint=f"one of: {', '.join(provider_names())}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise InputError(
            f"provider {name!r} is not available ({err})",
            hint=(
                f"scripts/setup.sh {name} (or, in kplan's folder, pip install -e '.[{name}]')"
                if name in ("aws", "gcp")
                else "check the installation"
            ),
        ) from None
    factory: Factory = getattr(module, attr)
    return factory


def get_backend(name: str, settings: ProviderSettings) -> Backend:
    """Create provider ``name`` and its storage."""
    return get_factory(name)(settings)
