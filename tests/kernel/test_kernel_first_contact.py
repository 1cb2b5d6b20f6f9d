"""A person's first minutes with the kernel: a terminal that types at once, a bad fleet.toml, no model yet."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_console.ptshell import ZMQTerminalInteractiveShell
from jupyter_console.zmqhistory import ZMQHistoryManager
from kernel_harness import Kernel

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
    reply = kernel.kc.get_shell_msg(timeout=CONSOLE_IS_COMPLETE_TIMEOUT)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "incomplete"
