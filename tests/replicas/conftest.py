"""One Redis and one PostgreSQL server for the replica tests (each test its own key prefix or
database), started once: a cluster takes seconds to create."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.replicas.services import Redis, postgres_server, redis_server

_names = itertools.count()


@pytest.fixture(scope="session")
def redis() -> Iterator[Redis]:
    with redis_server() as server:
        yield server


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
