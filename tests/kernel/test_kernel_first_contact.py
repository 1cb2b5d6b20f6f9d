"""A person's first minutes with the kernel: a terminal that types at once, a bad fleet.toml, no model yet."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from jupyter_console.ptshell import ZMQTerminalInteractiveShell
from jupyter_console.zmqhistory import ZMQHistoryManager
from kernel_harness import KERNEL, Kernel
from scripted_lm import step

CONSOLE_IS_COMPLETE_TIMEOUT = ZMQTerminalInteractiveShell.kernel_is_complete_timeout.default_value


@pytest.fixture
def silent_database() -> Iterator[str]:
    """A PostgreSQL URL on loopback whose server accepts the connection and never answers: a store that is
    slow to open, as on a first start."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        yield f"postgresql+asyncpg://fleet:fleet@127.0.0.1:{port}/fleet"


def test_console_start_gets_history_then_is_complete_while_the_store_opens(
    start_kernel: Any, silent_database: str
) -> None:
    """What ``jupyter console`` does at start, with its own timeouts: load 1000 history entries, then ask
    ``is_complete`` for the first line typed. Both replies come in time, each to its own request; otherwise
    the console prints a long warning and stops asking the kernel."""
    kernel: Kernel = start_kernel(FLEET_DATABASE_URL=silent_database)
    ZMQHistoryManager(client=kernel.kc).get_tail(1000, include_latest=True)
    msg_id = kernel.kc.is_complete("plot the sales by region")
    reply = kernel.kc.get_shell_msg(timeout=CONSOLE_IS_COMPLETE_TIMEOUT)
    assert reply["parent_header"]["msg_id"] == msg_id, reply["msg_type"]
    assert reply["content"]["status"] == "complete"


def test_is_complete_right_after_start_is_answered(kernel: Kernel) -> None:
    msg_id = kernel.kc.is_complete("a task\\")
    deadline = time.monotonic() + CONSOLE_IS_COMPLETE_TIMEOUT
    reply = kernel.kc.get_shell_msg(timeout=CONSOLE_IS_COMPLETE_TIMEOUT)
    while reply["msg_type"] == "kernel_info_reply":  # start-up's own requests, answered late
        reply = kernel.kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.01))
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "incomplete"


@pytest.mark.slow
def test_a_bad_fleet_toml_is_named_in_full(fleet_env: dict[str, str], tmp_path: Path) -> None:
    """The kernel reads ``fleet.toml`` from its working folder; the error says which file that was."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "fleet.toml").write_text('[limits]\nmax_iters = "many"\n', encoding="utf-8")
    kernel = Kernel(fleet_env, cwd=str(folder))
    try:
        reply = kernel.run("what is in the data?").reply["content"]
    finally:
        kernel.close()
    assert reply["status"] == "error" and reply["ename"] == "ConfigError"
    assert f"{folder / 'fleet.toml'} is invalid" in reply["evalue"] and "limits.max_iters" in reply["evalue"]


@pytest.mark.slow
def test_a_turn_with_no_model_configured_made_no_lm_call(start_kernel: Any, fleet_env: dict[str, str]) -> None:
    no_model = {key: "" for key in fleet_env if key.startswith("FLEET_LM_")}
    kernel = start_kernel(FLEET_OUTPUT="text", **no_model)
    text = kernel.run("what is in the data?").text()
    assert "FLEET_LM_MODEL" in text
    assert "0 LM calls" in text and "1 LM calls" not in text, text


@pytest.mark.slow
def test_notebook_clients_send_each_cells_own_id(fleet_env: dict[str, str], scripted_lm: Any, tmp_path: Path) -> None:
    """The demo's client (and papermill's, through Fleet's engine) runs each cell under its notebook id."""
    import nbformat

    from fleet_kernel.cell_ids import CellIdClient

    scripted_lm.add("count the boats", [step("done", "SUBMIT(answer='three boats')")])
    task = nbformat.v4.new_code_cell("count the boats")
    nb = nbformat.v4.new_notebook(cells=[task, nbformat.v4.new_code_cell("%fleet history")])
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Fleet RLM (test)", "language": "markdown"}
    env = {**os.environ, **fleet_env, "FLEET_OUTPUT": "text"}
    client = CellIdClient(nb, kernel_name=KERNEL, timeout=120, resources={"metadata": {"path": str(tmp_path)}})
    with patch.dict(os.environ, env):
        client.execute()
    history = "".join(output.get("text", "") for output in nb.cells[1].outputs)
    assert f"cell {task.id[:8]}" in history, history
