"""``fleet doctor``: check configuration, store, sandbox and LM; print what is wrong and how to fix it."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from fleet_kernel.cassette import Cassette
from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import FleetError

Echo = Callable[[str], None]


def _line(echo: Echo, ok: bool, what: str, detail: str) -> bool:
    echo(f"[{'ok' if ok else 'FAIL'}] {what}: {detail}")
    return ok


async def check_store(settings: Settings, echo: Echo) -> bool:
    from fleet_kernel.store import Store  # SQLAlchemy (~1 s) only for the store check

    started = time.perf_counter()
    try:
        store = await Store.open(settings.database_url)
    except FleetError as exc:
        return _line(echo, False, "store", exc.message)
    try:
        revision = await store.schema_revision()
        return _line(
            echo,
            True,
            "store",
            f"{store.safe_url} at schema {revision} ({(time.perf_counter() - started) * 1000:.0f} ms)",
        )
    finally:
        await store.close()


async def check_sandbox(settings: Settings, echo: Echo) -> bool:
    """Start the configured sandbox and run one line of code in it."""
    from fleet_kernel.sandbox import open_sandbox, status  # loads dspy: `fleet doctor store` does not

    chosen = await asyncio.to_thread(status, settings)  # opening it below says what is wrong, with the fix
    name, why = chosen.backend, f" ({chosen.passed_over})" if chosen.passed_over else ""

    def probe() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            factory = open_sandbox(settings, Path(tmp))
            try:
                interpreter = factory()
                started = time.perf_counter()
                result = interpreter.execute("import sys; print(sys.version.split()[0])")
                elapsed = (time.perf_counter() - started) * 1000
                interpreter.shutdown()
                return f"{name} runs Python {str(result).strip()} (first execute {elapsed:.0f} ms){why}"
            finally:
                factory.close()

    try:
        return _line(echo, True, "sandbox", await asyncio.to_thread(probe))
    except FleetError as exc:
        return _line(echo, False, "sandbox", exc.message)
    except Exception as exc:  # noqa: BLE001 - report, never crash the doctor
        return _line(echo, False, "sandbox", f"{name} failed to run code: {exc}")


async def check_lm(settings: Settings, echo: Echo) -> bool:
    """Ask the configured model for one short completion; a replay model's cassette is read instead."""
    model = settings.lm_model or ""
    replayed = model.removeprefix("replay/") if model.startswith("replay/") else None
    if replayed is not None:
        ok, detail = read_cassette(replayed)
        if not ok:  # said before dspy loads: a bad cassette is the common mistake, and the check is instant
            return _line(echo, False, "lm", detail)
    from fleet_kernel.engine.lm import build_lms, explain_lm_error  # loads dspy: `fleet doctor store` does not

    try:
        root, _ = build_lms(settings)
    except FleetError as exc:
        return _line(echo, False, "lm", exc.message)
    if replayed is not None:
        return _line(echo, True, "lm", detail)

    def ping() -> str:
        started = time.perf_counter()
        root("Reply with the single word: ready", max_tokens=5)
        return f"{settings.lm_model} answered in {(time.perf_counter() - started) * 1000:.0f} ms"

    try:
        return _line(echo, True, "lm", await asyncio.to_thread(ping))
    except Exception as exc:  # noqa: BLE001 - report, never crash the doctor
        return _line(echo, False, "lm", explain_lm_error(exc, settings).message)


def read_cassette(path: str) -> tuple[bool, str]:
    """A replay model answers only what was recorded, so the doctor reads its cassette instead of asking it:
    whether it can replay anything, and what to say."""
    try:
        cassette = Cassette.load(path)
    except FleetError as exc:
        return False, exc.message
    count = len(cassette.exchanges)
    if not count:
        record = f"record some with FLEET_LM_RECORD={cassette.path} and a real FLEET_LM_MODEL"
        return False, f"the replay cassette {cassette.path} holds no exchanges: {record}"
    source = cassette.data.get("model") or "an unnamed model"
    when = f" at {cassette.data['recorded_at']}" if cassette.data.get("recorded_at") else ""
    return True, f"replays {cassette.path}: {count} exchanges recorded from {source}{when} (answers only those)"


async def check_daytona(settings: Settings, echo: Echo) -> bool:
    try:
        from fleet_kernel.sandbox.daytona import check_daytona as probe  # the optional daytona extra
    except ImportError as exc:
        return _line(echo, False, "daytona", f"the Daytona backend is unavailable: {exc}")
    return bool(await probe(settings, echo))


CHECKS: dict[str, Callable[[Settings, Echo], Awaitable[bool]]] = {
    "store": check_store,
    "sandbox": check_sandbox,
    "lm": check_lm,
    "daytona": check_daytona,
}


async def run_checks(target: str = "all", *, echo: Echo = print) -> bool:
    """Run the named check (or store, sandbox and lm for ``all``); true when all pass."""
    try:
        settings = load_settings()
    except FleetError as exc:
        return _line(echo, False, "config", exc.message)
    _line(echo, True, "config", f"FLEET_HOME={settings.home}, fleet.toml={settings.config_path or 'built-in defaults'}")
    names = ["store", "sandbox", "lm"] if target == "all" else [target]
    results = [await CHECKS[name](settings, echo) for name in names]
    return all(results)
