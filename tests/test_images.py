"""Boot images and their Python (issue 26, item 5): the catalog states each image's Python with
its source, its defaults are the providers', a user's image is judged by its name where the name
says its system, and the dry run shows the image and whether the bootstrap must bring Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.catalogs.images import NODE_PYTHON, catalog_images, default_image, image_python
from kplan.cli.main import app
from kplan.launcher.providers.aws_common import DEFAULT_IMAGE as AWS_DEFAULT
from kplan.launcher.providers.gcp_config import DEFAULT_IMAGE as GCP_DEFAULT

SCRIPT = Path(__file__).resolve().parents[1] / "kplan" / "examples" / "mlp_regression.py"
PLAN_ARGS = ["--example-profile", "cifar10-resnet18", "--budget", "50"]


def test_every_catalog_image_states_its_python_and_where_it_is_said() -> None:
    rows = catalog_images()
    assert {r.cloud for r in rows} == {"aws", "gcp"}
    for row in rows:
        assert row.python is not None and row.os and len(row.source) > 20, row
    assert default_image("aws").image == AWS_DEFAULT
    assert default_image("gcp").image == GCP_DEFAULT
    # the AWS default fits; GCP's (Debian 11, python3 3.9) is the bootstrap's to fix
    assert default_image("aws").fits is True
    assert default_image("gcp").python == (3, 9) and default_image("gcp").fits is False
    assert NODE_PYTHON == (3, 11)


@pytest.mark.parametrize(
    ("image", "system", "python"),
    [
        ("projects/p/global/images/family/pytorch-2-4-cu124-ubuntu-2204-py310", "Ubuntu 22.04",
         (3, 10)),
        ("projects/debian-cloud/global/images/family/debian-12", "Debian 12", (3, 11)),
        ("resolve:ssm:/aws/service/deeplearning/ami/x86_64/x-ubuntu-24.04/latest/ami-id",
         "Ubuntu 24.04", (3, 12)),
        ("ami-0123456789abcdef0", None, None),
    ],
)  # fmt: skip
def test_a_users_image_is_known_by_its_name(
    image: str, system: str | None, python: tuple[int, int] | None
) -> None:
    info = image_python("gcp", image)
    assert (info.os, info.python) == (system, python)
    if python is None:
        assert info.fits is None and "unknown offline" in info.summary()


def test_the_dry_run_shows_the_image_and_its_python(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KPLAN_GCP_IMAGE", "KPLAN_AWS_IMAGE"):
        monkeypatch.delenv(var, raising=False)
    runner = CliRunner()
    out = runner.invoke(app, ["launch", str(SCRIPT), "--cloud", "gcp", *PLAN_ARGS, "--dry-run"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("image: "))
    assert "common-cu124-debian-11 (Debian 11, Python 3.9, below 3.11" in line
    assert "installs Python 3.11 with uv" in line
    aws = runner.invoke(app, ["launch", str(SCRIPT), "--cloud", "aws", *PLAN_ARGS, "--dry-run"])
    assert "(Ubuntu 24.04, Python 3.12: fits)" in aws.output
    given = runner.invoke(
        app,
        ["launch", str(SCRIPT), "--cloud", "aws", *PLAN_ARGS, "--dry-run", "--json",
         "--image", "ami-0123456789abcdef0"],
    )  # fmt: skip
    assert given.exit_code == 0, given.output
    doc = json.loads(given.output)["image"]
    assert doc["image"] == "ami-0123456789abcdef0"
    assert doc["python"] is None and doc["fits"] is None
