"""One turn through a real ``TurnRunner`` with ``fleet.toml`` text of the test's own: its events, in order."""

from __future__ import annotations

from pathlib import Path

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.events import Event
from fleet_kernel.store import Store


async def one_turn(store: Store, fleet_env: dict[str, str], tmp_path: Path, task: str, toml: str = "") -> list[Event]:
    config = tmp_path / "fleet.toml"
    config.write_text(toml, encoding="utf-8")
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, task)
        return [event async for event in handle.events()]
    finally:
        await runner.close()
