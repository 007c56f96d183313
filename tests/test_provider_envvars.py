"""Provider settings from the environment are checked as their flags are (issue 24)."""

from __future__ import annotations

import pytest

from kplan.core.errors import InputError
from kplan.launcher.providers.aws import config_from_env
from kplan.launcher.providers.envvars import (
    SETTINGS,
    check_cloud_image,
    check_environment,
    check_image,
    setting,
)
from kplan.launcher.providers.gcp_config import GcpConfig


def test_unset_or_empty_is_no_setting_and_a_value_comes_back() -> None:
    assert setting("KPLAN_AWS_VPC", {}) is None
    assert setting("KPLAN_AWS_VPC", {"KPLAN_AWS_VPC": ""}) is None
    assert setting("KPLAN_AWS_VPC", {"KPLAN_AWS_VPC": "vpc-1"}) == "vpc-1"


@pytest.mark.parametrize("value", [" ", "ami-1\n", "a b", "x\x1b[31m", "i" * 1025])
def test_an_image_variable_gets_the_image_flags_own_check(value: str) -> None:
    with pytest.raises(InputError, match="not an image name") as flag:
        check_image(value, "--image")
    for name in ("KPLAN_AWS_IMAGE", "KPLAN_GCP_IMAGE"):
        with pytest.raises(InputError, match=f"{name} .* is not an image name") as env:
            setting(name, {name: value})
        assert env.value.hint.startswith(flag.value.hint)  # the flag's hint, + "or unset"


@pytest.mark.parametrize(
    ("cloud", "value", "ok"),
    [("aws", "ami-0123456789abcdef0", True), ("aws", "resolve:ssm:/aws/x", True),
     ("aws", "resolve:ssm:", False), ("aws", "projects/p/global/images/x", False),
     ("aws", "ami-xyz", False), ("gcp", "projects/p/global/images/family/f", True),
     ("gcp", "global/images/mine", True), ("gcp", "ami-0123", False),
     ("gcp", "resolve:ssm:/aws/x/images/y", False), ("gcp", "my-image", False)],
)  # fmt: skip
def test_an_image_is_of_the_jobs_cloud(cloud: str, value: str, ok: bool) -> None:
    """--image (and KPLAN_<CLOUD>_IMAGE) of the other cloud's kind was taken and sent to it."""
    name = f"KPLAN_{cloud.upper()}_IMAGE"
    if ok:
        assert check_cloud_image(cloud, value, "--image") == value
        assert setting(name, {name: value}) == value
        return
    with pytest.raises(InputError, match=f"is not an image of {cloud}"):
        check_cloud_image(cloud, value, "--image")
    with pytest.raises(InputError, match=f"{name} .* is not an image of {cloud}"):
        setting(name, {name: value})


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_every_setting_of_a_cloud_refuses_a_newline_before_anything_runs(cloud: str) -> None:
    for name in SETTINGS[cloud]:
        with pytest.raises(InputError, match=name):
            check_environment([cloud], {name: "value\n"})
    check_environment([cloud], {})  # none set: nothing to refuse


def test_the_configs_read_their_variables_through_the_checks() -> None:
    with pytest.raises(InputError, match="KPLAN_AWS_INSTANCE_PROFILE"):
        config_from_env("us-east-1", {"KPLAN_AWS_INSTANCE_PROFILE": "role\n"})
    assert config_from_env("us-east-1", {"KPLAN_AWS_IMAGE": "ami-9"}).image_id == "ami-9"
    env = {"KPLAN_GCP_PROJECT": "my-project-1"}
    with pytest.raises(InputError, match="KPLAN_GCP_NETWORK"):
        GcpConfig.from_env({**env, "KPLAN_GCP_NETWORK": "vpc\n"})
    with pytest.raises(InputError, match="not a network name"):  # --network's own check
        GcpConfig.from_env({**env, "KPLAN_GCP_NETWORK": "Bad_Name"})
