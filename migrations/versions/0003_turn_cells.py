"""turns.cell_id, supersedes_turn_id, forgotten_at: the history follows the notebook's cells

Revision ID: 0003_cells
Revises: 0002
Create Date: 2026-12-01 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_cells"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("cell_id", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("supersedes_turn_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("forgotten_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("forgotten_at")
        batch.drop_column("supersedes_turn_id")
        batch.drop_column("cell_id")
