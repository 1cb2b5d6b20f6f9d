"""Which earlier turns a turn sees: the notebook as it stands, not the order its cells happened to run.

A *cell* is a chain of turns that supersede one another (``supersedes_turn_id``: a notebook cell run
again, or an API turn that replaces another), in its place from when its first turn ran. A cell is seen
through its latest completed turn only, so a re-run replaces what the cell said before and a cancelled
or failed re-run leaves the earlier answer in place. A turn with no cell id that nothing supersedes (the
console, the API, ``%%fleet`` outside a notebook) is append-only, as before: it is seen whatever its
outcome. A forgotten turn (``%fleet history forget``) is not seen, and neither are the turns of its cell
it replaced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class TurnLine:
    """What the rules read of a turn: one light row."""

    turn_id: str
    position: int
    status: str
    cell_id: str | None
    supersedes_turn_id: str | None
    forgotten_at: datetime | None


class Lineage:
    """The cells of a session's turns (``lines`` in any order), and what each cell stands for."""

    def __init__(self, lines: Iterable[TurnLine]) -> None:
        self.lines = sorted(lines, key=lambda line: line.position)
        self.by_id = {line.turn_id: line for line in self.lines}
        self.superseded_by: dict[str, str] = {}
        """Each superseded turn and the latest turn that names it in ``supersedes_turn_id``."""
        self.cells: dict[str, list[TurnLine]] = {}
        """The turns of each cell, oldest first, keyed by the cell's first turn (cells in order of first run)."""
        self._seen: set[str] | None = None
        self._cell_of: dict[str, str] = {}
        for line in self.lines:  # a turn only supersedes an earlier one, so its cell is known already
            earlier = line.supersedes_turn_id
            root = self._cell_of.get(earlier, line.turn_id) if earlier else line.turn_id
            self._cell_of[line.turn_id] = root
            self.cells.setdefault(root, []).append(line)
            if earlier:
                self.superseded_by[earlier] = line.turn_id

    def _is_notebook_cell(self, turns: list[TurnLine]) -> bool:
        return len(turns) > 1 or turns[0].cell_id is not None

    def standing(self) -> list[TurnLine]:
        """One turn per cell, in the order cells first ran: its latest completed turn, else its latest turn.

        What the notebook shows: the export's cells.
        """
        out = []
        for turns in self.cells.values():
            done = [t for t in turns if t.status == "completed"]
            out.append(done[-1] if done else turns[-1])
        return out

    def history(self) -> list[TurnLine]:
        """The turns a next turn sees, in the order their cells first ran (see the module's rules)."""
        out = []
        for turns in self.cells.values():
            if self._is_notebook_cell(turns):
                done = [t for t in turns if t.status == "completed"]
                seen = done[-1] if done else None
            else:
                seen = turns[0] if turns[0].status != "running" else None
            if seen is not None and seen.forgotten_at is None:
                out.append(seen)
        return out

    def in_history(self, turn_id: str) -> bool:
        if self._seen is None:
            self._seen = {line.turn_id for line in self.history()}
        return turn_id in self._seen

    def why_not_seen(self, turn_id: str) -> str | None:
        """Why a turn that is not forgotten is still out of the history, or ``None`` when it would be in it."""
        line = self.by_id[turn_id]
        turns = self.cells[self._cell_of[turn_id]]
        if line.status == "running":
            return f"turn {turn_id} is still running"
        if not self._is_notebook_cell(turns):
            return None
        done = [t for t in turns if t.status == "completed"]
        if line.status != "completed":
            return f"turn {turn_id} {line.status}: a notebook cell is seen through its latest completed turn only"
        if done[-1] is not line:
            return (
                f"turn {turn_id} is replaced by turn {done[-1].turn_id}, a later completed run of its cell; "
                f"forget that one to take the cell out"
            )
        return None
