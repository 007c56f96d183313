"""Application Default Credentials, found fast or refused in one line.

``google.auth.default()`` ends its chain by probing the Compute Engine metadata server: three
tries of 3 s each plus backoff, longer where 169.254.169.254 drops packets. A launch without
credentials must fail at once, before any job exists, so :func:`find_credentials` asks the
metadata server only when nothing else can answer, and only once with a short timeout (or not
at all when this machine is a Compute Engine VM, which the SMBIOS product name tells).

The chain, in google.auth's order: ``GOOGLE_APPLICATION_CREDENTIALS`` (a key or an external
account file), gcloud's application default credentials file (``gcloud auth
application-default login``), the metadata server (a VM's service account).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kplan.core.errors import InputError

MISSING_SDK_HINT = (
    "scripts/setup.sh gcp (or, in kplan's folder, pip install -e '.[gcp]'); "
    "`kplan launch --dry-run` needs no SDK"
)
HINT = (
    "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
    "credentials file; `kplan launch --dry-run` needs none"
)
PROBE_TIMEOUT_S = 1.0
_PRODUCT_NAME = Path("/sys/class/dmi/id/product_name")  # "Google Compute Engine" on a GCE VM


def adc_file(environ: Mapping[str, str]) -> Path:
    """gcloud's application default credentials file (where ``gcloud auth application-default
    login`` writes it)."""
    config = environ.get("CLOUDSDK_CONFIG")
    if config:
        return Path(config) / "application_default_credentials.json"
    if os.name == "nt":
        return Path(environ.get("APPDATA", "")) / "gcloud" / "application_default_credentials.json"
    return (
        Path(environ.get("HOME", "~")).expanduser()
        / ".config/gcloud/application_default_credentials.json"
    )


def metadata_server(environ: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True if a Compute Engine metadata server answers (one try, ``timeout_s``)."""
    if environ.get("NO_GCE_CHECK", "").lower() in ("1", "true"):
        return False
    try:
        if _PRODUCT_NAME.read_text().strip().startswith("Google"):
            return True
    except OSError:
        pass
    host = environ.get("GCE_METADATA_IP") or "169.254.169.254"
    request = urllib.request.Request(f"http://{host}/", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bool(response.headers.get("Metadata-Flavor") == "Google")
    except (OSError, ValueError):
        return False


def tried(environ: Mapping[str, str]) -> str:
    path = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    return (
        f"GOOGLE_APPLICATION_CREDENTIALS ({path or 'unset'}), gcloud's file "
        f"{adc_file(environ)}, the Compute Engine metadata server"
    )


def sdk_installed(module: str) -> bool:
    """Whether ``module`` can be imported (loads nothing but its parent packages)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        return False


def find_credentials(environ: Mapping[str, str] | None = None) -> tuple[Any, str | None]:
    """``(credentials, project or None)`` from Application Default Credentials, in about a
    second at most; InputError naming the chain it tried when none are found."""
    env = os.environ if environ is None else environ
    if not sdk_installed("google.cloud.compute_v1"):
        raise InputError(
            "the gcp provider needs google-cloud-compute, not installed", MISSING_SDK_HINT
        )
    try:
        import google.auth
        from google.auth import exceptions
    except ModuleNotFoundError:
        raise InputError(
            "the gcp provider needs google-cloud-compute, not installed", MISSING_SDK_HINT
        ) from None
    explicit = bool(env.get("GOOGLE_APPLICATION_CREDENTIALS"))
    if not explicit and not adc_file(env).is_file() and not metadata_server(env):
        raise InputError(f"no Google credentials found; tried {tried(env)}", HINT)
    try:
        credentials, project = google.auth.default()
    except exceptions.DefaultCredentialsError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"no usable Google credentials ({first[:200]}); tried {tried(env)}", HINT
        ) from None
    return credentials, project or None
