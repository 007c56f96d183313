"""The nodes' boot images and their Python: which one fits kplan's bootstrap.

The bootstrap needs Python >= 3.11 (kplan's own floor) and brings one itself (uv) when the
image's is older (kplan/launcher/bootstrap.py ``bring_python``). ``data/images.csv`` lists the
images kplan knows, each with its operating system, its ``python3`` version and where that
version is stated (``python_source``); ``default`` marks the providers' default image. An image
the catalog does not list is known by its name where the name says its system (``ubuntu-22.04``,
``debian-12``, a Deep Learning VM family's ``py310``); an AMI id says nothing offline, and its
Python is then found on the node.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

NODE_PYTHON = (3, 11)  # what the bootstrap runs kplan on (pyproject's requires-python)


@dataclass(frozen=True)
class ImagePython:
    """What kplan knows of an image's Python (``python`` None: nothing, offline)."""

    cloud: str
    image: str
    os: str | None
    python: tuple[int, int] | None
    source: str
    default: bool = False

    @property
    def fits(self) -> bool | None:
        """Whether its ``python3`` runs kplan as it is (None: unknown until the node boots)."""
        return None if self.python is None else self.python >= NODE_PYTHON

    def summary(self) -> str:
        """One line for the dry run."""
        want = ".".join(map(str, NODE_PYTHON))
        if self.python is None:
            return f"{self.image}: Python unknown offline; the bootstrap brings {want} if older"
        have = ".".join(map(str, self.python))
        where = f"{self.os}, Python {have}" if self.os else f"Python {have}"
        if self.fits:
            return f"{self.image} ({where}: fits)"
        return (
            f"{self.image} ({where}, below {want}: the bootstrap installs Python {want} with uv "
            "from the node's package index and GitHub's python-build-standalone)"
        )


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


@cache
def catalog_images() -> tuple[ImagePython, ...]:
    """``data/images.csv``, read once."""
    text = resources.files("kplan.catalogs.data").joinpath("images.csv").read_text()
    return tuple(
        ImagePython(
            row["cloud"],
            row["image"],
            row["os"] or None,
            _version(row["python"]),
            row["python_source"],
            row["default"] == "yes",
        )
        for row in csv.DictReader(text.splitlines())
    )


def default_image(cloud: str) -> ImagePython:
    """The catalog's row of ``cloud``'s default image."""
    return next(i for i in catalog_images() if i.cloud == cloud and i.default)


# (pattern in the image's name, its system, python3's version, where that is stated)
_BY_NAME = (
    (r"py3(\d{2})", None, None, "the image family's name (pyNNN)"),
    (r"ubuntu[-_ ]?24\.?04|noble", "Ubuntu 24.04", (3, 12), "Ubuntu 24.04's python3 (noble)"),
    (r"ubuntu[-_ ]?22\.?04|jammy", "Ubuntu 22.04", (3, 10), "Ubuntu 22.04's python3 (jammy)"),
    (r"ubuntu[-_ ]?20\.?04|focal", "Ubuntu 20.04", (3, 8), "Ubuntu 20.04's python3 (focal)"),
    (r"debian[-_ ]?12|bookworm", "Debian 12", (3, 11), "Debian 12's python3 (bookworm)"),
    (r"debian[-_ ]?11|bullseye", "Debian 11", (3, 9), "Debian 11's python3 (bullseye)"),
    (
        r"amazon[-_ ]linux[-_ ]2023|al2023",
        "Amazon Linux 2023",
        (3, 9),
        "Amazon Linux 2023's python3",
    ),
)


def image_python(cloud: str, image: str, described: str = "") -> ImagePython:
    """What the catalog, else the image's name (and ``described``: what the cloud says of it,
    an AMI's name and description), says of ``image``'s Python."""
    for known in catalog_images():
        if known.cloud == cloud and known.image == image:
            return known
    name = f"{image} {described}".lower()
    for pattern, system, version, source in _BY_NAME:
        match = re.search(pattern, name)
        if match is None:
            continue
        if version is not None:
            return ImagePython(cloud, image, system, version, source)
        # a Deep Learning VM family naming its Python
        named = next((s for p, s, _, _ in _BY_NAME[1:] if re.search(p, name)), None)
        return ImagePython(cloud, image, named, (3, int(match[1])), source)
    return ImagePython(cloud, image, None, None, "nothing offline (an image id names no system)")
