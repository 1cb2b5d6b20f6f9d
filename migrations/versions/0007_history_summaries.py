"""history_summaries: a session's rolling summary of the turns past its history window

Revision ID: 0007_history_summaries
Revises: 0006_turn_extraction
Create Date: 2026-12-06 21:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_history_summaries"
down_revision = "0006_turn_extraction"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "history_summaries",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("covers", sa.JSON(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.session_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("session_id"),
    )


def downgrade() -> None:
    op.drop_table("history_summaries")
