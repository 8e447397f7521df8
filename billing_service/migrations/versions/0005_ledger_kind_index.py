"""Ledger entries by kind and time: billing's metrics and the admin revenue report sum the
credits and charges of each kind (over all time, or per day of a window) at every scrape, which
without these indexes scans both books whole.

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


def downgrade() -> None:
    op.drop_index("ix_course_ledger_kind_created", "course_ledger")
    op.drop_index("ix_ledger_kind_created", "ledger")
