"""The ``daytona`` backend (``FLEET_SANDBOX=daytona``): model-written code runs in a Daytona cloud sandbox.

    pip install 'fleet-kernel[daytona]'
    FLEET_SANDBOX=daytona FLEET_DAYTONA_API_KEY=... [FLEET_DAYTONA_API_URL=...] fleet ...
    fleet doctor daytona

One sandbox per Fleet session, found again by its labels (``fleet_session``, ``fleet_store``) or
created, and kept warm across turns; every interpreter (the root RLM and each child) gets its own
code-interpreter context running Fleet's ``runtime.py`` (``_daytona_session``). The session folder
is a Daytona volume at ``/workspace`` (subpath ``sessions/<id>``), synced with the local folder
around each turn (``_daytona_sync``). No credential enters the sandbox: host tools run on the host
and answer through files. Leaks are bounded: sandboxes stop after ``AUTO_STOP_MIN`` idle minutes,
are deleted a day after stopping, this store's stopped sandboxes are deleted when a process
first uses the backend, and deleting a Fleet session deletes its sandbox (``delete_session_sandboxes``).
Credentials come only from ``FLEET_DAYTONA_API_KEY``/``FLEET_DAYTONA_API_URL``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import Settings
from fleet_kernel.errors import FleetError, SandboxUnavailableError
from fleet_kernel.sandbox.contract import describe
from fleet_kernel.sandbox.factory import SandboxFactory

try:
    import daytona as sdk
except ImportError as exc:  # the optional extra is not installed
    if not (exc.name or "").startswith("daytona"):
        raise
    sdk = None  # type: ignore[assignment]
else:
    from fleet_kernel.sandbox import _daytona_sync
    from fleet_kernel.sandbox._daytona_box import DaytonaBox, explain, retry, unavailable
    from fleet_kernel.sandbox._daytona_session import DaytonaSession

logger = logging.getLogger(__name__)

DEFAULT_API_URL = "https://app.daytona.io/api"
AUTO_STOP_MIN = 15  # idle minutes before Daytona stops a session's sandbox
AUTO_DELETE_MIN = 24 * 60  # minutes a stopped sandbox is kept before Daytona deletes it
CREATE_TIMEOUT_S = 120
USE_VOLUME = True
_STALE = {"stopped", "error", "build_failed", "archived"}

_lock = threading.Lock()  # guards the three process-wide caches below
_clients: dict[tuple[str, str], Any] = {}
_boxes: dict[tuple[str, str, str], DaytonaBox] = {}
_cleaned: set[tuple[str, str]] = set()


def _require_sdk() -> None:
    if sdk is None:
        raise SandboxUnavailableError(
            "The Daytona backend needs the Daytona SDK: pip install 'fleet-kernel[daytona]'", code="daytona_missing"
        )


def api_url(settings: Settings) -> str:
    return settings.daytona_api_url or DEFAULT_API_URL


def store_label(settings: Settings) -> str:
    """Names this Fleet store on Daytona (labels, volume) without revealing its URL."""
    return hashlib.sha256(settings.database_url.encode()).hexdigest()[:16]


def client_for(settings: Settings) -> Any:
    """One SDK client per credential pair, configured only from Fleet's own settings."""
    _require_sdk()
    if settings.daytona_api_key is None:
        raise SandboxUnavailableError(
            "FLEET_DAYTONA_API_KEY is not set: create a key in the Daytona dashboard and export it "
            "(FLEET_DAYTONA_API_URL too, for a self-hosted Daytona)",
            code="daytona_auth",
        )
    key, url = settings.daytona_api_key.get_secret_value(), api_url(settings)
    cache_key = (url, hashlib.sha256(key.encode()).hexdigest())
    with _lock:
        client = _clients.get(cache_key)
        if client is None:
            client = _clients[cache_key] = sdk.Daytona(sdk.DaytonaConfig(api_key=key, api_url=url))
    return client


def _instructions(settings: Settings) -> str:
    return describe(
        "Python 3 runs in a Daytona cloud sandbox (a Linux container)",
        exec_timeout_s=settings.limits.exec_timeout_s,
        notes="Output of subprocesses shows only when you capture and print it.",
    )


# -- finding and creating a session's sandbox -----------------------------------------------------


def cleanup_stale(client: Any, store: str, *, keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Delete this store's sandboxes that are stopped or broken (their REPL state is gone anyway)."""
    deleted = []
    query = sdk.ListSandboxesQuery(labels={"fleet_store": store})
    for sandbox in retry("list sandboxes", lambda: list(client.list(query))):
        state = getattr(sandbox.state, "value", sandbox.state)
        if sandbox.id in keep or state not in _STALE:
            continue
        try:
            retry("delete a stale sandbox", functools.partial(sandbox.delete, timeout=60))
            deleted.append(sandbox.id)
        except sdk.DaytonaError as exc:
            logger.warning("Daytona: could not delete stale sandbox %s: %s", sandbox.id, exc)
    if deleted:
        logger.info("Daytona: deleted %d stale sandbox(es) of this store: %s", len(deleted), ", ".join(deleted))
    return deleted


def _volume_mount(client: Any, store: str, session_id: str) -> Any:
    name = f"fleet-{store}"
    volume = retry("get the workspace volume", lambda: client.volume.get(name, create=True))
    deadline = time.monotonic() + 60
    while getattr(volume.state, "value", volume.state) != "ready":
        if time.monotonic() > deadline:
            raise SandboxUnavailableError(f"the Daytona volume {name} is not ready ({volume.state})")
        time.sleep(1)
        volume = retry("get the workspace volume", lambda: client.volume.get(name))
    return sdk.VolumeMount(volume_id=volume.id, mount_path="/workspace", subpath=f"sessions/{session_id}")


def _create(client: Any, store: str, session_id: str) -> Any:
    volumes = []
    if USE_VOLUME:
        try:
            volumes = [_volume_mount(client, store, session_id)]
        except (sdk.DaytonaForbiddenError, sdk.DaytonaNotFoundError, sdk.DaytonaBadRequestError) as exc:
            logger.warning("Daytona volumes unavailable (%s); /workspace will live in the sandbox only", exc)
    params = sdk.CreateSandboxFromSnapshotParams(
        language="python",
        env_vars={},
        volumes=volumes,  # no credential ever goes into the sandbox
        labels={"fleet": "1", "fleet_store": store, "fleet_session": session_id},
        auto_stop_interval=AUTO_STOP_MIN,
        auto_delete_interval=AUTO_DELETE_MIN,
    )
    try:
        return client.create(params, timeout=CREATE_TIMEOUT_S)  # not retried: a retry could leak a second one
    except sdk.DaytonaTimeoutError as exc:
        if exc.sandbox_id:  # created, then too slow to start: delete it rather than leak it
            try:
                client.get(exc.sandbox_id).delete(timeout=60)
            except sdk.DaytonaError:
                logger.warning("Daytona: could not delete sandbox %s after a create timeout", exc.sandbox_id)
        raise


def _find(client: Any, store: str, session_id: str, url: str) -> DaytonaBox | None:
    """The session's sandbox left by an earlier process (or another one sharing the store), started."""
    query = sdk.ListSandboxesQuery(labels={"fleet_store": store, "fleet_session": session_id})
    for sandbox in retry("list sandboxes", lambda: list(client.list(query))):
        box = DaytonaBox(client, sandbox, session_id=session_id, api_url=url)
        if box.ensure_running():
            return box
    return None


def acquire(settings: Settings, workspace: Path) -> DaytonaBox:
    """The session's warm sandbox: cached here, else found by labels, else created.

    Raises:
        SandboxUnavailableError: missing SDK or key, bad credentials, quota, network; the message says which.
    """
    client, url, store = client_for(settings), api_url(settings), store_label(settings)
    session_id = workspace.name
    key = (url, store, str(workspace.absolute()))
    try:
        with _lock:
            box = _boxes.get(key)
        if box is not None and box.ensure_running():
            return box
        box = _find(client, store, session_id, url)
        with _lock:
            first = (url, store) not in _cleaned
            _cleaned.add((url, store))
            keep = {b.id for b in [*_boxes.values(), box] if b is not None}
        if first:  # once per process and store: what earlier processes left stopped or broken
            try:
                cleanup_stale(client, store, keep=keep)
            except sdk.DaytonaError as exc:
                logger.warning("Daytona: cleaning up stale sandboxes failed: %s", exc)
        if box is None:
            box = DaytonaBox(client, _create(client, store, session_id), session_id=session_id, api_url=url)
        _daytona_sync.ensure_remote_dirs(box)
    except sdk.DaytonaError as exc:
        raise unavailable(exc, url) from exc
    with _lock:
        _boxes[key] = box
    return box


def delete_session_sandboxes(settings: Settings, session_id: str) -> int:
    """Delete the session's sandboxes now (its Fleet session is being deleted); return how many were deleted.

    Found by labels, so a sandbox created by another process sharing the store goes too; this process's
    cached box is dropped first, after its background cleanup drained. Returns once Daytona accepted each
    deletion. The session's files on the volume (subpath ``sessions/<id>``) are not deleted here.

    Raises:
        SandboxUnavailableError: missing SDK or key, or Daytona failed; the message says which.
    """
    client, url, store = client_for(settings), api_url(settings), store_label(settings)
    with _lock:
        keys = [k for k, box in _boxes.items() if k[:2] == (url, store) and box.session_id == session_id]
        cached = [_boxes.pop(k) for k in keys]
    for box in cached:
        box.drain()
    query = sdk.ListSandboxesQuery(labels={"fleet_store": store, "fleet_session": session_id})
    deleted = 0
    try:
        for sandbox in retry("list sandboxes", lambda: list(client.list(query))):
            if getattr(sandbox.state, "value", sandbox.state) in ("destroying", "destroyed"):
                continue
            try:
                retry("delete the session's sandbox", functools.partial(sandbox.delete, timeout=60))
            except sdk.DaytonaNotFoundError:
                continue  # gone meanwhile
            deleted += 1
    except sdk.DaytonaError as exc:
        raise unavailable(exc, url) from exc
    if deleted:
        logger.info("Daytona: deleted %d sandbox(es) of session %s", deleted, session_id)
    return deleted


# -- the backend ----------------------------------------------------------------------------------


def open_daytona(settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> SandboxFactory:
    """An interpreter factory whose interpreters each run in a context of the session's Daytona sandbox.

    Raises:
        SandboxUnavailableError: Daytona cannot be used; the message says why and what to do.
    """
    workspace = workspace.absolute()
    box = acquire(settings, workspace)
    storage = settings.policy.storage
    largest = int(max(storage.max_upload_mb, storage.max_artifact_mb) * 1024 * 1024)  # from an upload or a pull
    try:
        _daytona_sync.push(box, workspace, quota=_quota(settings), max_file_bytes=largest)
    except sdk.DaytonaError as exc:
        raise unavailable(exc, box.api_url) from exc
    except (RuntimeError, ValueError) as exc:
        raise SandboxUnavailableError(f"could not sync the workspace into the Daytona sandbox: {exc}") from exc
    limits = settings.limits
    new_session = functools.partial(
        DaytonaSession,
        box,
        max_output_bytes=settings.policy.sandbox.max_output_bytes,
        run_timeout_s=int(limits.turn_timeout_s + 60),
    )
    max_file_bytes = int(settings.policy.storage.max_artifact_mb * 1024 * 1024)
    return SandboxFactory(
        new_session,
        backend="daytona",
        execution_instructions=_instructions(settings),
        exec_timeout_s=limits.exec_timeout_s,
        cancel=cancel,
        on_close=functools.partial(_after_turn, box, workspace, max_file_bytes, _quota(settings)),
        max_output_bytes=settings.policy.sandbox.max_output_bytes,
    )


def _quota(settings: Settings) -> tuple[int, int]:
    """What the local copy of a Daytona workspace may hold; the sandbox's own disk is Daytona's to bound."""
    limits = settings.policy.sandbox
    return limits.workspace_mb * 1024 * 1024, limits.workspace_files


def _after_turn(box: Any, workspace: Path, max_file_bytes: int, quota: tuple[int, int]) -> None:
    """Contexts are deleted; files the code wrote come back into the local folder for the engine to scan."""
    box.drain()
    try:
        _daytona_sync.pull(box, workspace, max_file_bytes=max_file_bytes, quota=quota)
    except Exception as exc:  # noqa: BLE001 - the turn's outcome stands; say loudly what did not come back
        logger.error("Daytona: could not copy the sandbox's /workspace back to %s: %s", workspace, exc)


class DaytonaBackend:
    """``daytona``: a cloud sandbox per session, kept warm across its turns and deleted with it."""

    def status(self, settings: Settings) -> str | None:
        """What is missing locally (the SDK, the key); ``fleet doctor daytona`` checks the service itself."""
        try:
            _require_sdk()
            client_for(settings)
        except SandboxUnavailableError as exc:
            return exc.message
        return None

    def instructions(self, settings: Settings, workspace: Path) -> str:  # noqa: ARG002 - the backend contract's signature
        return _instructions(settings)

    def open(self, settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> SandboxFactory:
        return open_daytona(settings, workspace, cancel=cancel)

    def forget(self, settings: Settings, session_id: str) -> None:
        delete_session_sandboxes(settings, session_id)


BACKEND = DaytonaBackend()


# -- fleet doctor daytona -------------------------------------------------------------------------


async def check_daytona(settings: Settings, echo: Callable[[str], None]) -> bool:
    """Create a disposable sandbox, run code, write and read a file, delete it; one line per step."""
    return await asyncio.to_thread(_check, settings, echo)


def _check(settings: Settings, echo: Callable[[str], None]) -> bool:
    url = api_url(settings)
    sandbox: Any = None

    def step(what: str, call: Callable[[], Any], describe: Callable[[Any], str] = lambda _: "") -> Any:
        started = time.perf_counter()
        value = call()
        detail = describe(value)
        echo(f"[ok] daytona: {what}{': ' + detail if detail else ''} ({(time.perf_counter() - started) * 1000:.0f} ms)")
        return value

    try:
        client = step(f"client for {url}", lambda: client_for(settings))
        sandbox = step(
            "create a disposable sandbox",
            lambda: client.create(
                sdk.CreateSandboxFromSnapshotParams(
                    language="python", ephemeral=True, auto_stop_interval=5, labels={"fleet": "1", "fleet_doctor": "1"}
                ),
                timeout=CREATE_TIMEOUT_S,
            ),
            lambda s: s.id,
        )
        step(
            "run code",
            lambda: sandbox.code_interpreter.run_code("import sys; print(sys.version.split()[0])", timeout=60),
            lambda r: f"Python {r.stdout.strip()}",
        )
        step("write a file", lambda: sandbox.fs.upload_file(b"fleet doctor\n", "/tmp/fleet-doctor.txt"))  # noqa: S108 - inside the Daytona sandbox
        data = step("read it back", lambda: sandbox.fs.download_file("/tmp/fleet-doctor.txt"))  # noqa: S108 - inside the Daytona sandbox
        if data != b"fleet doctor\n":
            echo(f"[FAIL] daytona: the file read back differs: {data[:80]!r}")
            return False
        step("delete the sandbox", lambda: sandbox.delete(timeout=60))
        sandbox = None
        return True
    except FleetError as exc:
        echo(f"[FAIL] daytona: {exc.message}")
        return False
    except Exception as exc:  # noqa: BLE001 - the doctor reports, never crashes
        echo(f"[FAIL] daytona: {explain(exc, url)}")
        return False
    finally:
        if sandbox is not None:
            try:
                sandbox.delete(timeout=60)
            except Exception:  # noqa: BLE001 - ephemeral and auto-stopping anyway
                echo(f"[warn] daytona: could not delete sandbox {sandbox.id}; it stops by itself within 5 minutes")
