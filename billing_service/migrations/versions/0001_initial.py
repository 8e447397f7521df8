"""The first billing schema: events, server sessions, kernel spans, accounts, ledger.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("t_us", sa.BigInteger, nullable=False),
        sa.Column("kernel_id", sa.String(128), nullable=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("received_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_events_user_server_kind_t", "events", ["user", "server", "kind", "t_us"])
    op.create_table(
        "server_sessions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("start_event", sa.String(128), nullable=False, unique=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("pricing", sa.String(16), nullable=False),
        sa.Column("options", sa.Text, nullable=False),
        sa.Column("started_us", sa.BigInteger, nullable=False),
        sa.Column("stopped_us", sa.BigInteger, nullable=True),
        sa.Column("billed_us", sa.BigInteger, nullable=False),
        sa.Column("charged_micro", sa.BigInteger, nullable=False),
        sa.Column("last_busy_us", sa.BigInteger, nullable=True),
        sa.Column("last_heartbeat_us", sa.BigInteger, nullable=True),
    )
    op.create_index(
        "ix_sessions_user_server_started", "server_sessions", ["user", "server", "started_us"]
    )
    op.create_table(
        "kernel_spans",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("server", sa.String(255), primary_key=True),
        sa.Column("kernel_id", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("first_us", sa.BigInteger, nullable=False),
        sa.Column("last_us", sa.BigInteger, nullable=False),
        sa.Column("session_id", sa.Integer, sa.ForeignKey("server_sessions.id"), nullable=True),
    )
    op.create_index("ix_kernel_spans_session_id", "kernel_spans", ["session_id"])
    op.create_table(
        "accounts",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("balance_micro", sa.BigInteger, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(255), sa.ForeignKey("accounts.user"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_micro", sa.BigInteger, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("session_id", sa.Integer, sa.ForeignKey("server_sessions.id"), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.UniqueConstraint("idempotency_key", name="uq_ledger_idempotency_key"),
    )
    op.create_index("ix_ledger_user_created", "ledger", ["user", "created_us"])


def downgrade() -> None:
    for table in ("ledger", "accounts", "kernel_spans", "server_sessions", "events"):
        op.drop_table(table)
