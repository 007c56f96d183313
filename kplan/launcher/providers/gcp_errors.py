"""Compute Engine failures as ``CloudError``s with hints, and retries of the transient ones.

Two kinds of failure reach the provider: an HTTP error raised by the client (a
``google.api_core.exceptions.GoogleAPICallError`` carrying the error body's ``errors[].reason``),
and an Operation that ends ``DONE`` with ``error.errors[].code`` (a stockout or a quota found
after the request was accepted). Both are classified here by reason or code; only HTTP 429, 500,
502, 503 and 504 (and dropped connections) that are not about capacity or quota are retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from kplan.core.errors import CloudError

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
QUOTA = frozenset({"quotaExceeded", "QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED"})
CAPACITY = frozenset(
    {
        "resourceExhausted",
        "insufficientCapacity",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
    }
)
PERMISSION = frozenset(
    {
        "forbidden",
        "insufficientPermissions",
        "accessNotConfigured",
        "SERVICE_DISABLED",
        "IAM_PERMISSION_DENIED",
        "PERMISSIONS_ERROR",
    }
)

HINT_QUOTA = (
    "Raise the quota named above (console: IAM & Admin > Quotas, or `gcloud compute regions "
    "describe REGION`), or plan with fewer GPUs or another region."
)
HINT_CAPACITY = (
    "GCP has no capacity for this machine type in that zone right now (a stockout): try another "
    "zone or region, another instance type, or on-demand instead of spot."
)
HINT_PERMISSION = (
    "The credentials lack a Compute Engine permission (or the API is disabled): grant "
    "roles/compute.instanceAdmin.v1 and roles/compute.securityAdmin, plus "
    "roles/iam.serviceAccountUser on the instances' service account, and enable "
    "compute.googleapis.com in the project."
)
HINT_AUTH = (
    "Log in with `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service account key file."
)
HINT_NOT_FOUND = (
    "Check that the project, zone, machine type, GPU type and image exist "
    "(`gcloud compute machine-types list --zones ZONE`)."
)
HINT_TRANSIENT = "Compute Engine kept failing with a transient error: try again in a few minutes."
HINT_OTHER = "See the message above; `kplan --debug` shows the full error."


def _reasons(exc: BaseException) -> list[str]:
    """The ``reason``s of an api_core error: the error body's ``errors`` and its ErrorInfo."""
    found: list[str] = []
    for item in getattr(exc, "errors", None) or ():
        reason = item.get("reason") if isinstance(item, Mapping) else getattr(item, "reason", None)
        if reason:
            found.append(str(reason))
    info = getattr(exc, "reason", None)
    if isinstance(info, str) and info:
        found.append(info)
    return found


def _message(exc: BaseException) -> str:
    for item in getattr(exc, "errors", None) or ():
        if isinstance(item, Mapping) and item.get("message"):
            return str(item["message"])
    return str(getattr(exc, "message", None) or exc)


def hint_for(reasons: Iterable[str], status: int | None) -> str:
    names = set(reasons)
    if names & QUOTA:
        return HINT_QUOTA
    if names & CAPACITY:
        return HINT_CAPACITY
    if names & PERMISSION or status == 403:
        return HINT_PERMISSION
    if status == 401:
        return HINT_AUTH
    if status == 404:
        return HINT_NOT_FOUND
    if status in TRANSIENT_STATUS:
        return HINT_TRANSIENT
    return HINT_OTHER


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: throttling, server errors, dropped connections."""
    from google.api_core import exceptions as gexc
    from requests import exceptions as rexc

    if isinstance(exc, rexc.ConnectionError | rexc.Timeout):
        return True
    if isinstance(exc, gexc.GoogleAPICallError) and exc.code in TRANSIENT_STATUS:
        return not set(_reasons(exc)) & (QUOTA | CAPACITY)
    return False


def is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.NotFound)


def is_conflict(exc: BaseException) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.Conflict)


def is_cloud_failure(exc: BaseException) -> bool:
    """An exception the GCP SDK (or its HTTP layer) raises: translate it, never let it out."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc
    from requests import exceptions as rexc

    return isinstance(exc, gexc.GoogleAPIError | aexc.GoogleAuthError | rexc.RequestException)


def translate(exc: BaseException, what: str) -> CloudError:
    """``exc`` (from the SDK) as a CloudError: what failed, the API's message, a hint."""
    from google.auth import exceptions as aexc

    if isinstance(exc, aexc.DefaultCredentialsError | aexc.RefreshError):
        return CloudError(f"GCP {what}: no usable credentials ({exc})", HINT_AUTH)
    status = getattr(exc, "code", None)
    status = status if isinstance(status, int) else None
    reasons = _reasons(exc)
    detail = f"{status} {', '.join(reasons)}: " if status else ""
    return CloudError(f"GCP {what} failed: {detail}{_message(exc)}", hint_for(reasons, status))


def operation_error(op: Any, what: str) -> CloudError | None:
    """A CloudError for an Operation that ended with errors, else None."""
    errors = list(op.error.errors) if op.error and op.error.errors else []
    if not errors:
        return None
    codes = [e.code for e in errors if e.code]
    text = "; ".join(f"{e.code}: {e.message}" for e in errors)
    status = op.http_error_status_code or None
    return CloudError(f"GCP {what} failed: {text}", hint_for(codes, status))


def call(
    fn: Callable[[], T],
    what: str,
    *,
    retries: int,
    backoff_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; retry named transient errors with doubling backoff; translate the rest."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_cloud_failure(exc):
                raise
            if attempt >= retries or not is_transient(exc):
                raise translate(exc, what) from exc
        sleep(backoff_s * 2**attempt)
        attempt += 1


def call_tolerating(
    fn: Callable[[], T],
    what: str,
    tolerate: Callable[[BaseException], bool],
    *,
    retries: int,
    backoff_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """Like :func:`call`, but None when ``fn`` fails with an error that ``tolerate`` accepts
    (a 404 on delete, a 409 on insert)."""

    def attempt() -> T | None:
        try:
            return fn()
        except Exception as exc:
            if is_cloud_failure(exc) and tolerate(exc):
                return None
            raise

    return call(attempt, what, retries=retries, backoff_s=backoff_s, sleep=sleep)
