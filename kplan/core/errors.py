"""One error hierarchy for kplan, rendered once at the CLI edge.

Every error carries a one-line ``message`` (what went wrong, echoing the bad value) and a
``hint`` (what to do about it). The CLI maps ``exit_code`` to the process exit status:
2 for bad input, 1 for a failure of the job or the cloud. tests/test_error_hints.py holds the
promise: it scans kplan/ and fails on any of these errors raised without a hint or a blank one.
"""

from __future__ import annotations


class KplanError(Exception):
    """Base class: a failure of the job, the cloud or kplan itself (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(KplanError):
    """Bad input from the user: a flag, a file, a value (exit code 2)."""

    exit_code = 2


class DataFileError(InputError):
    """A malformed input file (CSV or JSON): names the file and, where known, the row."""


class SchemaVersionError(InputError):
    """A versioned file (Profile, Plan, model) with a major version this kplan cannot read."""


class CatalogError(InputError):
    """A catalog row or file that fails validation."""


class InfeasibleError(InputError):
    """No configuration satisfies the constraints (budget, deadline, memory, filters)."""


class JobError(KplanError):
    """The user's training job failed (exit code 1)."""


class CloudError(KplanError):
    """A cloud provider call failed after translation at the provider boundary (exit code 1)."""


class CapacityError(CloudError):
    """The cloud has no capacity for this request now (e.g. AWS InsufficientInstanceCapacity,
    a GCP stockout): another zone, instance type, market or a later try may succeed."""


class QuotaError(CloudError):
    """An account quota or limit refuses the request: waiting does not help, an increase does
    (or the other market, whose quota is separate)."""
