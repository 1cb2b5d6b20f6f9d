"""A notebook client that sends each cell's own id, as JupyterLab does and nbclient does not.

JupyterLab puts the cell's id in the ``execute_request`` metadata (``cellId``); the kernel records it, and a
cell run again supersedes its earlier turn in the history. nbclient (under ``python -m fleet_kernel.demo``
and papermill) sends no metadata, so their turns were stored without a cell. The message metadata comes
from the client's session, so the id is set there just while the cell's request is sent and run.
"""

from __future__ import annotations

from typing import Any

from nbclient import NotebookClient
from nbclient.util import run_sync

CELL_ID_KEY = "cellId"


class CellIdClient(NotebookClient):
    """``NotebookClient`` whose ``execute_request`` for a cell carries ``metadata.cellId`` (nbformat 4.5 ids)."""

    async def async_execute_cell(
        self, cell: Any, cell_index: int, execution_count: int | None = None, store_history: bool = True
    ) -> Any:
        cell_id = cell.get("id")
        metadata = self.kc.session.metadata if self.kc is not None and isinstance(cell_id, str) else None
        if metadata is None:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        metadata[CELL_ID_KEY] = cell_id
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            metadata.pop(CELL_ID_KEY, None)

    # nbclient binds its synchronous wrapper to its own coroutine; papermill calls the wrapper
    execute_cell = run_sync(async_execute_cell)
