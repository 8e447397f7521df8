"""The few SQL constructs that differ between SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Connection, case, func
from sqlalchemy.dialects import postgresql, sqlite


def insert_ignore(conn: Connection, model, index_elements: list[str]):
    """``INSERT … ON CONFLICT (index_elements) DO NOTHING`` for the connection's dialect."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(model).on_conflict_do_nothing(index_elements=index_elements)


def upsert_span_extend(conn: Connection, model, rows: list[dict]):
    """Insert kernel spans, or widen existing ones: first = min(first), last = max(last); a span
    stored without a name (first listed by a heartbeat) takes the name a later event gives it."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(model)
    ex = stmt.excluded
    if conn.dialect.name == "postgresql":
        first = func.least(model.first_us, ex.first_us)
        last = func.greatest(model.last_us, ex.last_us)
    else:
        # SQLite's two-argument min()/max() are scalar functions.
        first = func.min(model.first_us, ex.first_us)
        last = func.max(model.last_us, ex.last_us)
    stmt = stmt.on_conflict_do_update(
        index_elements=["user", "server", "kernel_id"],
        set_={
            "first_us": first,
            "last_us": last,
            "name": case((model.name == "", ex.name), else_=model.name),
        },
    )
    conn.execute(stmt, rows)
