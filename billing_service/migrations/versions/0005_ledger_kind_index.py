"""Ledger entries by kind and time, sessions by their stop: billing's metrics and the admin
revenue report sum the credits and charges of each kind posted in a window (the last minutes at
every scrape, or the days of the report), and the metrics' lag and the enforcer look for the
sessions still open; without these indexes each scans its table whole.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_ledger_kind_created", "ledger", ["kind", "created_us"])
    op.create_index("ix_course_ledger_kind_created", "course_ledger", ["kind", "created_us"])
    op.create_index("ix_sessions_stopped", "server_sessions", ["stopped_us"])


def downgrade() -> None:
    op.drop_index("ix_sessions_stopped", "server_sessions")
    op.drop_index("ix_course_ledger_kind_created", "course_ledger")
    op.drop_index("ix_ledger_kind_created", "ledger")
