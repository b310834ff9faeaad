"""One PostgreSQL server for the replica tests (each test a database of its own), started
once: a cluster takes seconds to create. Redis is ``tests/conftest.py``'s."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.replicas.services import postgres_server

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[str]:
    with postgres_server() as server:
        yield server.url


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own in the shared Redis."""
    return f"t{next(_names)}"


@pytest.fixture
async def database(postgres_cluster: str) -> str:
    """An empty database of this test's own; its URL."""
    import psycopg
    from psycopg import sql

    name = f"test_{next(_names)}"
    async with await psycopg.AsyncConnection.connect(postgres_cluster, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return postgres_cluster.rsplit("/", 1)[0] + f"/{name}"
