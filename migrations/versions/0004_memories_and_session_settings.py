"""memories with full-text search; sessions can be archived and carry their own models

Revision ID: 0004
Revises: 0003_cells
Create Date: 2026-12-01 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003_cells"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("archived", sa.Boolean(), nullable=False, server_default=sa.text("false")))
        batch_op.add_column(sa.Column("model", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("sub_model", sa.String(length=200), nullable=True))

    op.create_table(
        "memories",
        sa.Column("memory_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.session_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("memory_id"),
    )
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.create_index("ix_memories_session_created", ["session_id", "created_at"], unique=False)

    # The full-text index over memories.content (see fleet_kernel/store/memories.py).
    if op.get_bind().dialect.name == "sqlite":
        # Its own content, kept in step by triggers (which also fire for a session's cascading delete).
        op.execute(
            "CREATE VIRTUAL TABLE memories_fts USING fts5("
            "memory_id UNINDEXED, session_id UNINDEXED, content, tokenize='unicode61 remove_diacritics 2')"
        )
        op.execute(
            "CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
            "INSERT INTO memories_fts(memory_id, session_id, content) "
            "VALUES (new.memory_id, new.session_id, new.content); END"
        )
        op.execute(
            "CREATE TRIGGER memories_fts_update AFTER UPDATE OF content ON memories BEGIN "
            "UPDATE memories_fts SET content = new.content WHERE memory_id = old.memory_id; END"
        )
        op.execute(
            "CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
            "DELETE FROM memories_fts WHERE memory_id = old.memory_id; END"
        )
    else:
        op.execute(
            "ALTER TABLE memories ADD COLUMN search tsvector "
            "GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED"
        )
        op.execute("CREATE INDEX ix_memories_search ON memories USING gin (search)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for trigger in ("memories_fts_insert", "memories_fts_update", "memories_fts_delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS memories_fts")
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.drop_index("ix_memories_session_created")
    op.drop_table("memories")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("sub_model")
        batch_op.drop_column("model")
        batch_op.drop_column("archived")
