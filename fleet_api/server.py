"""``fleet serve``: run the app under uvicorn, loopback unless a token protects it.

The kernel starts the same server as a detached process (``fleet_kernel.kernel.sidecar.spawn_sidecar``),
so a notebook kernel can offer the API and the API keeps serving after the kernel exits.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from fleet_api.app import create_app
from fleet_api.auth import is_loopback
from fleet_api.connections import bounded_h11
from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import ConfigError
from fleet_kernel.redact import LOG_FORMAT, RedactingFormatter
from fleet_kernel.store import Store

GRACEFUL_SHUTDOWN_S = 5
KEEP_ALIVE_S = 30
# A request head (line and headers) must arrive within this long; slower clients get 408 and are closed.
HEADER_TIMEOUT_S = 10.0
# Open connections beyond this close the longest-idle one; SSE watchers count, browsers open six per host.
MAX_CONNECTIONS = 500
# A token that guards a network bind is at least this long (secrets.token_urlsafe(32) gives 43 characters).
MIN_TOKEN_CHARS = 32
MIN_TOKEN_KINDS = 10  # different characters: "t" * 40 is long but guessable; token_urlsafe(32) has ~30
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'  # noqa: S105 - a command that makes a token, not a token

__all__ = ["build_server", "check_bind", "serve"]


def _uvicorn_options(host: str, port: int) -> dict[str, object]:
    """What one process or each of several serves with, besides the app and the protocol's bounds."""
    return {
        "host": host,
        "port": port,
        "log_level": "info",
        "access_log": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        # Longer than uvicorn's 5 s, so a client reusing an idle connection rarely races its close.
        "timeout_keep_alive": KEEP_ALIVE_S,
        "lifespan": "on",
    }


def _redact_logs(settings: Settings) -> None:
    """Log at INFO through formatters that take out every key (the LM key, provider keys, the API token)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter(LOG_FORMAT, settings.redactor))


class WorkerConfig(uvicorn.Config):
    """uvicorn's config for ``fleet serve --workers N``: pickled into each worker process, where ``load`` builds
    Fleet's app from the settings that process reads, and its protocol with the bounds ``serve`` has."""

    def __init__(self, host: str, port: int, workers: int) -> None:
        # the app and the protocol are made in the worker (``load``): neither a built app nor a made class pickles
        super().__init__("fleet_api.app:create_app", workers=workers, **_uvicorn_options(host, port))  # type: ignore[arg-type]

    def load(self) -> None:
        self.http = bounded_h11(HEADER_TIMEOUT_S, MAX_CONNECTIONS)
        super().load()

    def load_app(self) -> object:
        settings = load_settings()
        _redact_logs(settings)
        return create_app(settings, bind_host=self.host)


def check_bind(host: str, settings: Settings) -> None:
    """Refuse a non-loopback bind without a token, or with one short or plain enough to guess: anyone on
    the network could run code otherwise.

    Raises:
        ConfigError: ``host`` is reachable from other machines and ``FLEET_API_TOKEN`` is unset, shorter
            than ``MIN_TOKEN_CHARS`` or made of fewer than ``MIN_TOKEN_KINDS`` different characters.
    """
    if is_loopback(host):
        return
    if settings.api_token is None:
        raise ConfigError(
            f"refusing to listen on {host}: other machines could run code through this API. "
            f"Set FLEET_API_TOKEN to require a bearer token (make one with: {MAKE_TOKEN}), or bind 127.0.0.1"
        )
    length = len(settings.api_token.get_secret_value())
    if length < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"refusing to listen on {host}: FLEET_API_TOKEN is {length} characters, and a token that guards a "
            f"network bind must have at least {MIN_TOKEN_CHARS} characters. Make one with: {MAKE_TOKEN}"
        )
    kinds = len(set(settings.api_token.get_secret_value()))
    if kinds < MIN_TOKEN_KINDS:
        raise ConfigError(
            f"refusing to listen on {host}: FLEET_API_TOKEN is made of only {kinds} different characters, and a token "
            f"that guards a network bind must be random, with at least {MIN_TOKEN_KINDS} different characters. "
            f"Make one with: {MAKE_TOKEN}"
        )


async def _check_store(settings: Settings) -> None:
    store = await Store.open(settings.database_url)
    await store.close()


def build_server(
    host: str,
    port: int,
    settings: Settings | None = None,
    *,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    **app_options: float,
) -> uvicorn.Server:
    """A configured uvicorn server for the app (not started); used by ``serve`` and the tests."""
    settings = settings or load_settings()
    check_bind(host, settings)
    config = uvicorn.Config(
        create_app(settings, bind_host=host, **app_options),
        http=bounded_h11(header_timeout_s, max_connections),
        **_uvicorn_options(host, port),  # type: ignore[arg-type]
    )
    return uvicorn.Server(config)


def serve(host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
    """Run until interrupted; ``workers`` > 1 runs that many processes on the one socket (uvicorn's supervisor
    restarts one that dies), each a replica of the others on the shared store.

    Raises:
        ConfigError: a non-loopback bind without ``FLEET_API_TOKEN``, or invalid settings.
        StoreUnavailableError: the store cannot be opened (checked before binding, to fail in one line).
    """
    settings = load_settings()
    _redact_logs(settings)
    check_bind(host, settings)
    asyncio.run(_check_store(settings))
    if workers > 1:
        config = WorkerConfig(host, port, workers)
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()  # until a signal, or until a worker fails its start-up (each would: the app is broken)
        started = all(worker.exitcode != STARTUP_FAILURE for worker in supervisor.processes)
    else:
        server = build_server(host, port, settings)
        server.run()
        started = server.started
    if not started:
        raise ConfigError(f"the API could not start on {host}:{port}; see the log above")
