"""A turn this process runs: what the runner, its preparation and its finish share about it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import Settings
from fleet_kernel.engine.choices import TurnChoices
from fleet_kernel.engine.host_tools import HostTool
from fleet_kernel.engine.memory import Memories
from fleet_kernel.engine.sink import TurnEmitter
from fleet_kernel.sandbox import contract as sandbox_contract
from fleet_kernel.skills import Catalogue
from fleet_kernel.store import TurnRow

CANCEL_GRACE_S = 1.0
"""How long a stopped turn's thread is given to unwind, and its artifacts to be collected."""


@dataclass
class RunningTurn:
    """A claimed turn running in this process, from its start to its terminal event."""

    turn: TurnRow
    emitter: TurnEmitter
    settings: Settings
    catalogue: Catalogue
    choices: TurnChoices
    cancel: CancelToken = field(default_factory=CancelToken)  # the turn's one cancel token, handed down to it
    task: asyncio.Task[None] | None = None
    memories: Memories | None = None  # the session's memories, as the turn's host tools change them
    started: float = field(default_factory=time.monotonic)  # the deadline counts from here
    inputs: list[Any] = field(default_factory=list)  # engine.inputs.NotebookValue: the turn's input variables
    notebook: Any = None  # kernel.notebook_bridge.NotebookBridge: a %%fleet turn's notebook (prompt, tools)
    setup_error: dict[str, str] | None = None  # the turn could not be set up (its files); it fails
    admission: sandbox_contract.Admission | None = None  # what the sandbox backend set aside for the turn
    collecting: bool = False  # the turn's own work is over: its artifacts are collected
    late: str | None = None  # why it was cancelled while collecting (the token is spent by then)
    host_tools: list[HostTool] | None = None  # the [[tools]] and MCP tools it named; None: all configured

    @property
    def reason(self) -> str:
        return self.cancel.reason or "cancelled"
