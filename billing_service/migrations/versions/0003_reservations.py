"""Reservations: prepaid cards of a GPU type for a window, and the reservation a session runs on.

Revision ID: 0003
Revises: 0002
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("account", sa.String(300), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("cards", sa.Integer, nullable=False),
        sa.Column("start_us", sa.BigInteger, nullable=False),
        sa.Column("end_us", sa.BigInteger, nullable=False),
        sa.Column("price_micro", sa.BigInteger, nullable=False),
        sa.Column("amount_micro", sa.BigInteger, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
    )
    op.create_index("ix_reservations_account", "reservations", ["account"])
    with op.batch_alter_table("server_sessions") as batch:
        batch.add_column(sa.Column("reservation", sa.String(128), nullable=True))
        batch.create_index("ix_server_sessions_reservation", ["reservation"])
    # Sessions the hub reported with a reservation before this revision (none are expected).
    conn = op.get_bind()
    sessions = sa.table(
        "server_sessions",
        sa.column("id", sa.Integer),
        sa.column("options", sa.Text),
        sa.column("reservation", sa.String),
    )
    for sid, options in conn.execute(
        sa.select(sessions.c.id, sessions.c.options).where(
            sessions.c.options.like('%"reservation"%')
        )
    ).all():
        try:
            tag = json.loads(options or "{}").get("reservation")
        except (ValueError, AttributeError):
            continue
        if isinstance(tag, str) and 1 <= len(tag) <= 128:
            conn.execute(sa.update(sessions).where(sessions.c.id == sid).values(reservation=tag))


def downgrade() -> None:
    with op.batch_alter_table("server_sessions") as batch:
        batch.drop_index("ix_server_sessions_reservation")
        batch.drop_column("reservation")
    op.drop_index("ix_reservations_account", "reservations")
    op.drop_table("reservations")
