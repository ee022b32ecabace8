"""Shared fixtures: the Flask ``app`` and ``client`` built by the real factory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from hooks.shell.app import create_app
from hooks.shell.config import HookSettings
from tests.helpers import NO_AUTH, NOW, FakeProber

# The real 3-member Patroni cluster (session scope): see tests/patroni_fixtures.py; the real
# Kubernetes control plane (session scope): tests/controlplane_fixtures.py; which tests share
# a pytest-xdist worker: tests/worker_groups.py.
pytest_plugins = ["tests.patroni_fixtures", "tests.controlplane_fixtures", "tests.worker_groups"]


@pytest.fixture
def prober() -> FakeProber:
    """A prober whose answers each test sets; every member is down until told otherwise."""
    return FakeProber()


@pytest.fixture
def app(prober: FakeProber) -> Iterator[Flask]:
    flask_app = create_app(settings=HookSettings(auth=NO_AUTH), prober=prober, clock=lambda: NOW)
    flask_app.config["TESTING"] = True
    yield flask_app


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
