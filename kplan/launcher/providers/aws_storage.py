"""``S3Storage``: the Storage of ``kplan/launcher/storage.py`` in an S3 bucket (``s3://bucket/prefix``).

Keys are relative to the prefix, so ``<job>/status/node-0.json`` under ``s3://b/kplan`` is the
object ``kplan/<job>/status/node-0.json`` of bucket ``b``. The default location (no URI given) is
a bucket of the caller's account, ``kplan-<account>-<region>``, created on the first write with
public access blocked and the ``kplan-managed`` tag.
"""

from __future__ import annotations

import re
from typing import NotRequired, TypedDict

from kplan.core.errors import CloudError, InputError
from kplan.launcher.provider import TAG_MANAGED
from kplan.launcher.providers import check_prefix
from kplan.launcher.providers.aws_common import (
    AwsConfig,
    Client,
    ClientFactory,
    Retry,
    Tolerated,
    call,
    make_client_factory,
)

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_MISSING_BUCKET = "NoSuchBucket"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` as ``(bucket, prefix)``; the prefix has no slashes at its ends."""
    if not uri.startswith("s3://"):
        raise InputError(f"storage URI {uri!r} is not an s3:// URI", hint="e.g. s3://bucket/kplan")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise InputError(
            f"storage URI {uri!r} names no valid bucket ({bucket!r})",
            hint="S3 bucket names are 3-63 lowercase letters, digits, dots and hyphens",
        )
    check_prefix(uri, prefix)
    return bucket, prefix.strip("/")


def default_storage_uri(config: AwsConfig, client_factory: ClientFactory | None = None) -> str:
    """``s3://kplan-<account>-<region>/jobs``, the account read from STS."""
    factory = client_factory or make_client_factory(config)
    sts = factory("sts")
    identity = call(
        Retry(config.max_attempts, config.backoff_s), "read the account id", sts.get_caller_identity
    )
    return f"s3://kplan-{identity['Account']}-{config.region}/jobs"


# The S3 requests kplan builds (the boto3 keyword arguments, as the API names them).
class PutObjectRequest(TypedDict):
    Bucket: str
    Key: str
    Body: bytes


class ListRequest(TypedDict):
    Bucket: str
    Prefix: str
    MaxKeys: int
    ContinuationToken: NotRequired[str]


class CreateBucketRequest(TypedDict):
    Bucket: str
    CreateBucketConfiguration: NotRequired[dict[str, str]]


class S3Storage:
    """Objects under one bucket prefix; ``create_bucket`` makes the bucket on first write."""

    def __init__(
        self,
        uri: str,
        config: AwsConfig,
        *,
        client_factory: ClientFactory | None = None,
        create_bucket: bool = False,
        retry: Retry | None = None,
        page_size: int = 1000,
    ) -> None:
        if not 1 <= page_size <= 1000:
            raise InputError(
                f"S3 page size {page_size} is not in 1..1000",
                hint="S3 lists at most 1000 keys a page",
            )
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._config = config
        self._factory = client_factory or make_client_factory(config)
        self._retry = retry or Retry(config.max_attempts, config.backoff_s)
        self._create_bucket = create_bucket
        self._s3: Client | None = None
        self._page = page_size  # keys per ListObjectsV2 page and per DeleteObjects call

    @property
    def s3(self) -> Client:
        if self._s3 is None:
            self._s3 = self._factory("s3")
        return self._s3

    def _key(self, key: str) -> str:
        parts = key.split("/")
        if not key or key.startswith("/") or ".." in parts:
            raise InputError(
                f"storage key {key!r} is not a relative path inside the storage",
                hint="use a key such as JOB/code/job.tar.gz: no leading '/', no '..'",
            )
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def put_bytes(self, key: str, data: bytes) -> None:
        full = self._key(key)
        tolerate = (_MISSING_BUCKET,) if self._create_bucket else ()
        kwargs: PutObjectRequest = {"Bucket": self.bucket, "Key": full, "Body": data}
        result = call(
            self._retry,
            f"write {self._where(full)}",
            self.s3.put_object,
            tolerate=tolerate,
            **kwargs,
        )
        if isinstance(result, Tolerated):
            self._make_bucket()
            call(self._retry, f"write {self._where(full)}", self.s3.put_object, **kwargs)

    def get_bytes(self, key: str) -> bytes | None:
        full = self._key(key)
        tolerate = ("NoSuchKey", _MISSING_BUCKET) if self._create_bucket else ("NoSuchKey",)
        result = call(
            self._retry,
            f"read {self._where(full)}",
            self.s3.get_object,
            tolerate=tolerate,
            Bucket=self.bucket,
            Key=full,
        )
        if isinstance(result, Tolerated):
            return None
        body = result["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def list_keys(self, prefix: str) -> list[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs: ListRequest = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": self._page}
            if token:
                kwargs["ContinuationToken"] = token
            page = call(
                self._retry,
                f"list {self._where(full)}",
                self.s3.list_objects_v2,
                tolerate=(_MISSING_BUCKET,) if self._create_bucket else (),
                **kwargs,
            )
            if isinstance(page, Tolerated):
                return []
            keys.extend(self._relative(str(o["Key"])) for o in page.get("Contents", []))
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return sorted(keys)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list_keys(prefix)
        for start in range(0, len(keys), self._page):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._key(k)} for k in keys[start : start + self._page]]
            response = call(
                self._retry,
                f"delete under {self._where(self._key(prefix))}",
                self.s3.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": batch, "Quiet": True},
            )
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                raise CloudError(
                    f"S3 kept {len(errors)} objects under {self._where(self._key(prefix))}, "
                    f"e.g. {first.get('Key')}: {first.get('Code')} {first.get('Message', '')}",
                    hint="check s3:DeleteObject permission on the bucket",
                )

    def _where(self, full_key: str) -> str:
        return f"s3://{self.bucket}/{full_key}"

    def _make_bucket(self) -> None:
        """The default bucket, private and tagged (only when ``create_bucket``)."""
        kwargs: CreateBucketRequest = {"Bucket": self.bucket}
        if self._config.region != "us-east-1":  # us-east-1 refuses its own LocationConstraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self._config.region}
        call(
            self._retry,
            f"create the bucket {self.bucket}",
            self.s3.create_bucket,
            tolerate=("BucketAlreadyOwnedByYou",),
            **kwargs,
        )
        call(
            self._retry,
            f"block public access to {self.bucket}",
            self.s3.put_public_access_block,
            Bucket=self.bucket,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
        call(
            self._retry,
            f"tag the bucket {self.bucket}",
            self.s3.put_bucket_tagging,
            Bucket=self.bucket,
            Tagging={"TagSet": [{"Key": TAG_MANAGED, "Value": "true"}]},
        )
