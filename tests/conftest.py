"""Test-session settings shared by every test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.aws_server import MotoAws, moto_server

_HOME: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Point KPLAN_HOME at a fresh folder: no test reads or writes the developer's ~/.kplan
    (state database, user catalogs from `kplan catalog update`). Tests that need their own home
    still set it themselves."""
    home = tempfile.mkdtemp(prefix="kplan-test-home-")
    _HOME.append(home)
    os.environ["KPLAN_HOME"] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    for home in _HOME:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoAws]:
    """One moto server per test module (reset when it starts), with the nodes' instance profile
    and the job bucket ``tests.aws_server.BUCKET``; ``moto_backend(moto)`` is the aws provider
    and storage against it. A module that needs another set-up defines its own ``moto``."""
    with moto_server() as server:
        yield server
