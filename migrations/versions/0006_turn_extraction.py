"""turns.extraction_reason: why a turn's answer was extracted by dspy instead of submitted by the model

Revision ID: 0006_turn_extraction
Revises: 0005_feedback
Create Date: 2026-12-06 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_turn_extraction"
down_revision = "0005_feedback"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("extraction_reason", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("extraction_reason")
