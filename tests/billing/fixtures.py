"""Fixtures shared by the billing tests (import them into a test module to use them)."""

from __future__ import annotations

import uuid

import pytest
from conftest import require

from billing.pg import PgCluster, available
from gpulab.billing_service.db import make_engine, upgrade


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


# Registered under their fixture names, so that importing them into a test module does not clash
# with the `engine` / `sqlite_engine` arguments of its tests.
@pytest.fixture(name="sqlite_engine", scope="module")
def billing_sqlite_engine(tmp_path_factory):
    """The billing store on one SQLite file per test module, its schema at the newest revision."""
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('billing') / 'billing.sqlite'}")
    upgrade(engine)
    return engine


@pytest.fixture(name="engine", params=["sqlite", "postgresql"])
def billing_engine(request, sqlite_engine):
    """The billing store on the module's SQLite file, then on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_engine
    eng = make_engine(request.getfixturevalue("pg_url"))
    upgrade(eng)
    upgrade(eng)  # a second run at start is a no-op
    return eng
