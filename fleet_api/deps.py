"""What routes share: the settings, the store and the runner opened by the app's lifespan."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from fleet_api.frames import FrameCache
from fleet_api.tail import StoreTail
from fleet_kernel.config import Settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.engine.sessions import Sessions
from fleet_kernel.errors import FleetError, NotFoundError
from fleet_kernel.sandbox import status as sandbox_status
from fleet_kernel.store import Store

# Ids Fleet hands out (``ses_...``, ``turn_...``, ``run_...``); anything else cannot name a row.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ID_PATTERN = _ID  # for routes that answer an impossible id in another envelope (the fleet-rlm profile)
SANDBOX_CHECK_TTL_S = 30.0
# The store's ping and write probe run at most this often; health checks in between reuse the answer.
STORE_CHECK_TTL_S = 1.0


@dataclass
class FleetState:
    settings: Settings
    store: Store
    runner: TurnRunner
    heartbeat_s: float
    tail: StoreTail
    frames: FrameCache = field(default_factory=FrameCache)
    _sandbox: tuple[float, bool, str] | None = field(default=None, repr=False)
    _store_check: tuple[float, str | None] | None = field(default=None, repr=False)
    _store_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _sandbox_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def sessions(self) -> Sessions:
        """The engine's sessions service over this process's store and settings: routes go through it,
        as ``%fleet`` commands do, rather than to the store."""
        return Sessions(self.store, self.settings)

    async def refresh_sandbox(self) -> None:
        """Probe again once the answer has aged; one probe at a time, and callers meanwhile keep the old answer
        (a flood of health checks would otherwise start a probe process each)."""
        if not self.sandbox_stale() or self._sandbox_lock.locked():
            return
        async with self._sandbox_lock:
            await asyncio.to_thread(self.probe_sandbox)

    async def store_problem(self) -> str | None:
        """What keeps the store from serving turns, or None.

        The SQLite file and its disk are looked at on every call; the ping and the write probe (a
        transaction) at most once per ``STORE_CHECK_TTL_S``, one at a time, so a flood of health
        checks is not a flood of commits. The event writer's last error is always current.
        """
        problem = await self.store.check_writable(write=False)
        if problem is not None:
            return problem
        async with self._store_lock:
            if self._store_check is None or time.monotonic() - self._store_check[0] > STORE_CHECK_TTL_S:
                found = None if await self.store.ping() else "unreachable"
                self._store_check = (time.monotonic(), found or await self.store.check_writable())
        return self._store_check[1] or self.runner.store_error

    def sandbox_status(self) -> tuple[bool, str]:
        """Which sandbox turns would use and whether it can start; ``(False, "checking ...")`` until known.

        Probing imports the sandbox package (and dspy) and may start a process, so it runs in a thread
        (``probe_sandbox``) and its answer is kept for ``SANDBOX_CHECK_TTL_S``.
        """
        if self._sandbox is None:
            return False, "checking the sandbox backend"
        return self._sandbox[1], self._sandbox[2]

    def sandbox_stale(self) -> bool:
        """A known answer that has aged (the warm-up gives the first one)."""
        return self._sandbox is not None and time.monotonic() - self._sandbox[0] > SANDBOX_CHECK_TTL_S

    def probe_sandbox(self) -> None:
        """Blocking: find the backend and whether it works; call it from a thread."""
        try:
            status = sandbox_status(self.runner.settings)
            ok, detail = status.ok, status.detail
        except FleetError as exc:
            ok, detail = False, exc.message
        except ImportError as exc:
            ok, detail = False, f"the sandbox package cannot be imported: {exc}"
        self._sandbox = (time.monotonic(), ok, detail)


def get_state(request: Request) -> FleetState:
    state: FleetState = request.app.state.fleet
    return state


State = Annotated[FleetState, Depends(get_state)]


def check_id(value: str, kind: str, *, code: str | None = None) -> str:
    """A syntactically impossible id names nothing: 404, before the database sees it."""
    if not _ID.match(value):
        raise NotFoundError(f"no {kind} {value[:80]!r}", code=code)
    return value
