"""Refuse to send AWS credentials to an instance (user data, tags): instances get theirs from the
IAM instance profile. User data is readable by anyone who may describe the instance and by every
process on it through the metadata service, and tags are visible account-wide.
"""

from __future__ import annotations

import re

from kplan.core.errors import InputError

# An access key id (long-term AKIA, temporary ASIA) or a variable that would carry a secret.
_PATTERNS = (
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    re.compile(r"\bAWS_(?:SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN)\s*[=:]", re.IGNORECASE),
    re.compile(r"\baws_secret_access_key\s*[=:]", re.IGNORECASE),
)
_MIN_SECRET_LEN = 16  # shorter values would match ordinary words


class CredentialGuard:
    """Checks text against credential patterns and the caller's own current credentials."""

    def __init__(self, profile: str | None = None) -> None:
        self._profile = profile
        self._secrets: list[str] | None = None

    def _current_secrets(self) -> list[str]:
        if self._secrets is None:
            self._secrets = _resolve(self._profile)
        return self._secrets

    def check(self, where: str, text: str) -> None:
        found = any(p.search(text) for p in _PATTERNS) or any(
            secret in text for secret in self._current_secrets()
        )
        if found:
            raise InputError(
                f"refusing to send AWS credentials in the {where}",
                hint="instances get credentials from the IAM instance profile (set "
                "KPLAN_AWS_INSTANCE_PROFILE); remove AWS keys from the job's script and "
                "environment",
            )


def _resolve(profile: str | None) -> list[str]:
    """The secret parts of the credentials boto3 would use now (empty if none resolve)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        credentials = boto3.session.Session(profile_name=profile).get_credentials()
        if credentials is None:
            return []
        frozen = credentials.get_frozen_credentials()
    except BotoCoreError:
        return []
    values = (frozen.access_key, frozen.secret_key, frozen.token)
    return [v for v in values if v and len(v) >= _MIN_SECRET_LEN]
