"""Fixtures more than one test directory uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.replicas.services import Redis, redis_server


@pytest.fixture(scope="session")
def redis() -> Iterator[Redis]:
    """A real Redis server on a loopback port, started once (each test keys its own prefix)."""
    with redis_server() as server:
        yield server
