"""Fixtures shared by the billing tests (import them into a test module to use them)."""

from __future__ import annotations

import uuid

import pytest
from conftest import require

from billing.pg import PgCluster, available


@pytest.fixture(scope="session")
def pg_cluster():
    """One real PostgreSQL cluster for the billing tests."""
    require(available(), "PostgreSQL server binaries (apt-get install postgresql)")
    cluster = PgCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """A fresh, empty database on the shared cluster."""
    return pg_cluster.create_database(f"t{uuid.uuid4().hex[:12]}")
