"""What the AWS provider and S3 storage share: the typed config, clients, retries, translation.

boto3 and botocore are imported inside functions only (``kplan --help`` must not load them).
Every SDK call goes through :func:`call`, which retries a few named transient error codes with
capped, jittered exponential backoff and turns everything else into a ``CloudError`` with a hint,
so nothing above this package sees a botocore exception.
"""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from kplan.core.errors import CapacityError, CloudError, InputError, QuotaError

# A boto3 client (generated at run time, so untyped for mypy).
Client = Any
ClientFactory = Callable[[str], Client]  # service name ("ec2", "s3") -> client

# EC2 resolves "resolve:ssm:<parameter>" itself at launch: the latest AWS Deep Learning Base AMI
# (NVIDIA driver, CUDA, EFA, Ubuntu 24.04, x86_64) in whatever region the instance starts.
DEFAULT_IMAGE = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
)

# Retried with backoff: the request may succeed unchanged a moment later.
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "SlowDown",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
    }
)
# No room for this request now: another zone, instance type, market or a later try may work.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "InsufficientReservedInstanceCapacity",
        "UnfulfillableCapacity",
        "SpotMaxPriceTooLow",
        "Unsupported",  # the instance type is not offered in this zone
    }
)
# An account limit: waiting does not help; a quota increase (or the other market) does.
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "ResourceLimitExceeded",
        "RulesPerSecurityGroupLimitExceeded",
        "SecurityGroupLimitExceeded",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidAccessKeyId",
    }
)

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")


class BotoOptions(TypedDict):
    """The botocore client configuration kplan sets."""

    retries: dict[str, int]
    connect_timeout: int
    read_timeout: int
    user_agent_extra: str
    s3: NotRequired[dict[str, str]]


@dataclass(frozen=True)
class AwsConfig:
    """Settings of the ``aws`` provider (all but ``region`` optional)."""

    region: str
    image_id: str = DEFAULT_IMAGE  # AMI id or "resolve:ssm:<parameter>"; InstanceSpec.image wins
    instance_profile: str | None = None  # IAM instance profile: the instances' only credentials
    vpc_id: str | None = None  # security group's VPC; None: the region's default VPC
    subnet_id: str | None = None  # None: the default subnet of each spec's zone
    key_name: str | None = None  # EC2 key pair for SSH (with ClusterSpec.ssh_cidr)
    # A cluster placement group packs nodes close together (fast NCCL) but makes capacity
    # errors likelier, spot above all; False trades that locality for availability.
    placement_groups: bool = True
    profile: str | None = None  # named profile in ~/.aws/config; None: the default chain
    endpoint_url: str | None = None  # another endpoint (a moto server, an S3-compatible store)
    max_attempts: int = 5  # tries of a call failing with a transient code
    backoff_s: float = 1.0  # first backoff; doubles per try, capped at 20 s, full jitter
    poll_s: float = 5.0  # waiter delay between polls
    cleanup_timeout_s: float = 300.0  # how long cleanup waits for terminations and dependencies

    def __post_init__(self) -> None:
        if not _REGION.fullmatch(self.region):
            raise InputError(
                f"AWS region {self.region!r} is not a region name",
                hint="use a region such as us-east-1 or eu-west-2",
            )
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
            ("http://", "https://")
        ):
            raise InputError(
                f"AWS endpoint_url {self.endpoint_url!r} is not an http(s) URL",
                hint="leave endpoint_url unset for AWS itself",
            )
        if not self.image_id:
            raise InputError("AWS image_id is empty", hint="give an AMI id or resolve:ssm:<name>")
        if self.max_attempts < 1:
            raise InputError(
                f"AWS max_attempts must be >= 1, got {self.max_attempts}",
                hint="1 tries each call once; the default is 5",
            )
        for name in ("backoff_s", "poll_s", "cleanup_timeout_s"):
            value = getattr(self, name)
            if value < 0:
                raise InputError(
                    f"AWS {name} must be >= 0, got {value}", hint=f"set {name} to 0 or more seconds"
                )


def make_client_factory(config: AwsConfig) -> ClientFactory:
    """Clients of one boto3 session in ``config.region``; botocore's own retries are off."""

    def factory(service: str) -> Client:
        import boto3
        import botocore.session
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        options: BotoOptions = {
            "retries": {"total_max_attempts": 1},  # :func:`call` retries, by name
            "connect_timeout": 10,
            "read_timeout": 60,
            "user_agent_extra": "kplan",
        }
        if config.endpoint_url is not None and service == "s3":
            options["s3"] = {"addressing_style": "path"}
        try:
            core = botocore.session.get_session()
            core.register_component("data_loader", _shared_loader())
            session = boto3.session.Session(
                botocore_session=core, profile_name=config.profile, region_name=config.region
            )
            return session.client(
                service, endpoint_url=config.endpoint_url, config=Config(**options)
            )
        except BotoCoreError as exc:
            raise translate(exc, f"create the {service} client") from exc

    return factory


@functools.cache
def _shared_loader() -> Any:
    """One botocore data loader per process, so each service model is parsed once (~0.5 s)."""
    from botocore.loaders import create_loader

    return create_loader()


@dataclass(frozen=True)
class Retry:
    """Backoff for transient codes: ``attempts`` tries, ``base_s * 2**i`` capped, full jitter."""

    attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 20.0
    sleep: Callable[[float], None] = time.sleep

    def delay(self, attempt: int) -> float:
        return random.uniform(0.0, min(self.cap_s, self.base_s * 2.0**attempt))


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (None for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code else None


@dataclass(frozen=True)
class Tolerated:
    """What :func:`call` returns when the call failed with a code the caller tolerates."""

    code: str


def call(
    retry: Retry,
    action: str,
    fn: Callable[..., Any],
    *,
    tolerate: Collection[str] = (),
    also_retry: Collection[str] = (),
    **kwargs: Any,
) -> Any:
    """``fn(**kwargs)``, retrying transient codes (and ``also_retry``) with backoff.

    Returns :class:`Tolerated` when the call fails with a code in ``tolerate`` (e.g. "already
    exists" in an idempotent create); raises a translated ``CloudError`` for every other failure.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    for attempt in range(retry.attempts):
        try:
            return fn(**kwargs)
        except ClientError as exc:
            code = error_code(exc)
            if code is not None and code in tolerate:
                return Tolerated(code)
            retryable = code in TRANSIENT_CODES or code in also_retry
            if retryable and attempt + 1 < retry.attempts:
                retry.sleep(retry.delay(attempt))
                continue
            raise translate(exc, action) from exc
        except BotoCoreError as exc:
            raise translate(exc, action) from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


def _client_error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", {})
    message = str(response.get("Error", {}).get("Message", "")).strip()
    # UnauthorizedOperation carries a long encoded authorization blob: keep the first sentence.
    head = message.split("Encoded authorization failure message")[0].strip()
    return head[:300]


def translate(exc: BaseException, action: str) -> CloudError:
    """A botocore exception as a kplan error: one line naming the action and code, plus a hint."""
    code = error_code(exc)
    if code is None:
        return _translate_botocore(exc, action)
    text = f"AWS could not {action}: {code}: {_client_error_message(exc)}".rstrip(": ")
    if code in CAPACITY_CODES:
        return CapacityError(
            text,
            hint="AWS has no capacity for this request now: try another zone, instance type or "
            "market (spot/on-demand), or retry later",
        )
    if code in QUOTA_CODES:
        return QuotaError(
            text,
            hint="an account quota is exhausted: request an increase in the Service Quotas "
            "console (EC2 'Running On-Demand ... instances' or '... Spot Instance Requests', "
            "counted in vCPUs), or use the other market",
        )
    if code in AUTH_CODES:
        return CloudError(
            text,
            hint="check the AWS credentials (aws sts get-caller-identity, AWS_PROFILE) and that "
            "their IAM policy allows this call (and iam:PassRole for the instance profile)",
        )
    if code.startswith("InvalidAMIID"):
        return CloudError(text, hint="set KPLAN_AWS_IMAGE to an AMI of this region")
    if code == "NoSuchBucket":
        return CloudError(text, hint="create the bucket, or give another --storage s3:// URI")
    if code in ("VPCIdNotSpecified", "InvalidVpcID.NotFound", "InvalidSubnetID.NotFound"):
        return CloudError(
            text,
            hint="the region has no default VPC (or the given one is gone): set KPLAN_AWS_VPC "
            "and KPLAN_AWS_SUBNET",
        )
    if code.startswith("InvalidParameterValue") and "iamInstanceProfile" in text:
        return CloudError(
            text, hint="set KPLAN_AWS_INSTANCE_PROFILE to an instance profile of this account"
        )
    if code == "OptInRequired":
        return CloudError(text, hint="enable this region (or service) for the AWS account")
    if code in TRANSIENT_CODES:
        return CloudError(text, hint="AWS is throttling or busy: wait a minute and retry")
    return CloudError(text, hint=f"see AWS's documentation of the error code {code}")


def _translate_botocore(exc: BaseException, action: str) -> CloudError:
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        ProfileNotFound,
        ReadTimeoutError,
    )

    text = f"AWS could not {action}: {type(exc).__name__}: {exc}"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        hint = "configure AWS credentials (aws configure, AWS_PROFILE or an instance role)"
    elif isinstance(exc, ProfileNotFound):
        hint = "set AWS_PROFILE to a profile of ~/.aws/config, or unset it"
    elif isinstance(exc, EndpointConnectionError | ConnectTimeoutError | ReadTimeoutError):
        hint = "check the network connection to AWS (and endpoint_url, if set)"
    elif isinstance(exc, NoRegionError):
        hint = "set the region in the AWS config"
    else:
        hint = "re-run with --debug for the traceback"
    return CloudError(text, hint=hint)


# botocore's credential providers (``CredentialResolver.providers[i].METHOD``), in its order.
_CHAIN_NAMES = {
    "env": "env vars AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
    "assume-role": "assume-role profile",
    "assume-role-with-web-identity": "web identity",
    "sso": "SSO",
    "login": "aws login",
    "shared-credentials-file": "~/.aws/credentials",
    "custom-process": "credential_process",
    "config-file": "~/.aws/config",
    "ec2-credentials-file": "/etc/boto.cfg",
    "boto-config": "boto config",
    "container-role": "container role",
    "iam-role": "EC2 instance metadata",
}
MISSING_SDK_HINT = (
    "scripts/setup.sh aws (or, in kplan's folder, pip install -e '.[aws]'); "
    "`kplan launch --dry-run` needs no SDK"
)


def sdk_installed(module: str) -> bool:
    """Whether ``module`` (``boto3``, ``google.cloud.compute_v1``) can be imported; loads
    nothing but its parent packages."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        return False


def check_credentials(config: AwsConfig) -> None:
    """InputError unless botocore's credential chain resolves credentials now.

    Runs before any client or job exists, so a launch without credentials fails in about a
    second instead of on its first call. The instance-metadata probe is bounded (1 s, one
    attempt); ``AWS_EC2_METADATA_DISABLED=true`` skips it as botocore itself does.
    """
    try:
        import boto3  # noqa: F401  # the clients need it; botocore alone is not enough
        import botocore.session
        from botocore.exceptions import BotoCoreError, ProfileNotFound
    except ModuleNotFoundError:
        raise InputError("the aws provider needs boto3, not installed", MISSING_SDK_HINT) from None
    try:
        core = botocore.session.Session(profile=config.profile)
        core.set_config_variable("metadata_service_timeout", 1)
        core.set_config_variable("metadata_service_num_attempts", 1)
        resolver = core.get_component("credential_provider")
        found = resolver.load_credentials()
    except ProfileNotFound as exc:
        raise InputError(
            f"AWS profile not found: {exc}",
            "set AWS_PROFILE to a profile of ~/.aws/config (`aws configure --profile NAME`), "
            "or unset it",
        ) from None
    except BotoCoreError as exc:  # a broken config file, an SSO token gone, ...
        raise InputError(
            f"AWS credentials could not be loaded: {type(exc).__name__}: {exc}",
            "fix the AWS configuration (`aws sts get-caller-identity` shows the problem)",
        ) from None
    if found is not None:
        return
    tried = [_CHAIN_NAMES.get(p.METHOD, p.METHOD) for p in resolver.providers]
    raise InputError(
        "no AWS credentials found; botocore's chain tried " + ", ".join(tried),
        "run `aws configure` (or `aws sso login`), set AWS_PROFILE, or export "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; `kplan launch --dry-run` needs none",
    )
