"""Tests for the rules of which earlier turns a turn sees (``fleet_kernel.store.cells``), and for the
migration that adds the cells to a store holding turns already."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import datetime
from pathlib import Path

from alembic import command

from fleet_kernel.store import Store, migrate
from fleet_kernel.store.cells import Lineage, TurnLine

FORGOTTEN = datetime(2026, 12, 1)


def line(n: int, status: str = "completed", cell: str | None = None, supersedes: int | None = None,
         forgotten: bool = False) -> TurnLine:  # fmt: skip
    earlier = f"t{supersedes}" if supersedes else None
    return TurnLine(f"t{n}", n, status, cell, earlier, FORGOTTEN if forgotten else None)


def seen(*lines: TurnLine) -> list[str]:
    return [t.turn_id for t in Lineage(lines).history()]


def test_each_cell_is_seen_through_its_latest_completed_turn_in_the_order_cells_first_ran() -> None:
    assert seen(line(1, cell="a"), line(2, cell="b"), line(3, cell="a", supersedes=1)) == ["t3", "t2"]


def test_a_failed_or_cancelled_rerun_leaves_the_earlier_answer() -> None:
    runs = [line(1, cell="a"), line(2, "cancelled", "a", 1), line(3, "failed", "a", 2)]
    assert seen(*runs) == ["t1"]
    assert seen(*runs, line(4, cell="a", supersedes=3)) == ["t4"]
    assert seen(line(1, "failed", "a"), line(2, cell="b")) == ["t2"]  # a cell that never completed


def test_turns_without_a_cell_are_append_only_and_running_turns_are_not_seen() -> None:
    assert seen(line(1), line(2, "failed"), line(3, "cancelled"), line(4, "running")) == ["t1", "t2", "t3"]


def test_a_forgotten_turn_is_not_seen_and_keeps_its_cells_earlier_runs_hidden() -> None:
    assert seen(line(1, cell="a"), line(2, cell="a", supersedes=1, forgotten=True), line(3)) == ["t3"]
    lineage = Lineage([line(1, cell="a"), line(2, cell="a", supersedes=1)])
    assert lineage.superseded_by == {"t1": "t2"} and lineage.why_not_seen("t2") is None
    assert "replaced by turn t2" in (lineage.why_not_seen("t1") or "")


def test_the_export_keeps_a_cell_that_never_completed_with_its_latest_turn() -> None:
    lineage = Lineage([line(1, "failed", "a"), line(2, cell="b"), line(3, "cancelled", "a", 1), line(4)])
    assert [t.turn_id for t in lineage.standing()] == ["t3", "t2", "t4"]


def test_a_store_with_turns_is_migrated_and_its_turns_stay_append_only(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fleet.db'}"
    command.upgrade(migrate.alembic_config(url), "0001")
    with sqlite3.connect(tmp_path / "fleet.db") as db:
        now = "2026-11-30 12:00:00"
        db.execute("INSERT INTO sessions VALUES ('ses_1', 'old', ?, ?, 1)", (now, now))
        db.execute(
            "INSERT INTO turns (turn_id, run_id, session_id, position, task, status, answer, owner, started_at,"
            " heartbeat_at, last_seq) VALUES ('turn_1', 'run_1', 'ses_1', 1, 'old task', 'completed', 'old answer',"
            " 'gone', ?, ?, 3)",
            (now, now),
        )

    async def read() -> list[str | None]:
        store = await Store.open(url)  # a SQLite store is upgraded on first use
        try:
            (turn,) = await store.history("ses_1", window=8)
            return [await store.schema_revision(), turn.turn_id, turn.cell_id, turn.supersedes_turn_id]
        finally:
            await store.close()

    assert asyncio.run(read()) == [migrate.head_revision(), "turn_1", None, None]
