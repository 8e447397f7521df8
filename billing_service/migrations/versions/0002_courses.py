"""Courses: credit pools with their own ledger, per-session splits, and a session's course.

Revision ID: 0002
Revises: 0001
"""

import json
import re

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COURSE_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def upgrade() -> None:
    with op.batch_alter_table("server_sessions") as batch:
        batch.add_column(sa.Column("course", sa.String(64), nullable=True))
        batch.create_index("ix_server_sessions_course", ["course"])
    # Sessions reported with a course before this revision (none are expected) get it.
    conn = op.get_bind()
    sessions = sa.table(
        "server_sessions",
        sa.column("id", sa.Integer),
        sa.column("options", sa.Text),
        sa.column("course", sa.String),
    )
    for sid, options in conn.execute(
        sa.select(sessions.c.id, sessions.c.options).where(sessions.c.options.like('%"course"%'))
    ).all():
        try:
            course = json.loads(options or "{}").get("course")
        except (ValueError, AttributeError):
            continue
        if isinstance(course, str) and len(course) <= 64 and COURSE_RE.match(course):
            conn.execute(sa.update(sessions).where(sessions.c.id == sid).values(course=course))
    op.create_table(
        "courses",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("balance_micro", sa.BigInteger, nullable=False),
        sa.Column("cap_micro", sa.BigInteger, nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("term_start", sa.String(10), nullable=True),
        sa.Column("term_end", sa.String(10), nullable=True),
        sa.Column("overflow", sa.String(16), nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("updated_us", sa.BigInteger, nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
    )
    op.create_table(
        "course_ledger",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("course", sa.String(64), sa.ForeignKey("courses.name"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_micro", sa.BigInteger, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("session_id", sa.Integer, sa.ForeignKey("server_sessions.id"), nullable=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.UniqueConstraint("idempotency_key", name="uq_course_ledger_idempotency_key"),
    )
    op.create_index("ix_course_ledger_course_created", "course_ledger", ["course", "created_us"])
    op.create_table(
        "course_charges",
        sa.Column("session_id", sa.Integer, sa.ForeignKey("server_sessions.id"), primary_key=True),
        sa.Column("period_start_us", sa.BigInteger, primary_key=True),
        sa.Column("period_end_us", sa.BigInteger, nullable=False),
        sa.Column("course", sa.String(64), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("amount_micro", sa.BigInteger, nullable=False),
        sa.Column("course_micro", sa.BigInteger, nullable=False),
        sa.Column("personal_micro", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_course_charges_course_user_period",
        "course_charges",
        ["course", "user", "period_start_us"],
    )


def downgrade() -> None:
    for table in ("course_charges", "course_ledger", "courses"):
        op.drop_table(table)
    with op.batch_alter_table("server_sessions") as batch:
        batch.drop_index("ix_server_sessions_course")
        batch.drop_column("course")
