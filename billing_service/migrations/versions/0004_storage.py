"""Storage: each home's meter (the hub's latest measurement) and its charged pieces of time.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "storage_meters",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("measured_us", sa.BigInteger, nullable=False),
        sa.Column("used_bytes", sa.BigInteger, nullable=False),
        sa.Column("quota_bytes", sa.BigInteger, nullable=False),
        sa.Column("datasets_bytes", sa.BigInteger, nullable=False),
        sa.Column("billable_bytes", sa.BigInteger, nullable=False),
        sa.Column("received_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "storage_charges",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("from_us", sa.BigInteger, primary_key=True),
        sa.Column("to_us", sa.BigInteger, nullable=False),
        sa.Column("day_us", sa.BigInteger, nullable=False),
        sa.Column("billable_bytes", sa.BigInteger, nullable=False),
        sa.Column("price_micro", sa.BigInteger, nullable=False),
        sa.Column("charged_micro", sa.BigInteger, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_storage_charges_user_day", "storage_charges", ["user", "day_us"])


def downgrade() -> None:
    op.drop_index("ix_storage_charges_user_day", "storage_charges")
    op.drop_table("storage_charges")
    op.drop_table("storage_meters")
