"""Alembic environment: migrations run on the connection the billing service hands over."""

from __future__ import annotations

from alembic import context

from gpulab.billing_service.models import Base

config = context.config
target_metadata = Base.metadata

connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through gpulab.billing_service.db.upgrade()")
context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
