"""The Daytona sandbox behind one Fleet session, and the rules for calling Daytona at all.

Idempotent calls (create a context, files, delete, start, list) are retried on connection errors,
rate limits and 5xx with jittered exponential backoff; ``run_code`` never is (see
``_daytona_session``). Errors that reach a user are explained once here: bad credentials, quota or
permission, rate limit, network, or Daytona itself failing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import urllib3.exceptions
from daytona import (
    DaytonaAuthenticationError,
    DaytonaBadGatewayError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaTimeoutError,
    SandboxState,
)

from fleet_kernel.errors import SandboxUnavailableError

logger = logging.getLogger(__name__)

T = TypeVar("T")
ATTEMPTS = 4
BACKOFF_S = 0.25
MAX_BACKOFF_S = 8.0
_RETRYABLE = (
    DaytonaConnectionError,
    DaytonaRateLimitError,
    DaytonaInternalServerError,
    DaytonaBadGatewayError,
    DaytonaServiceUnavailableError,
)
_NETWORK = (urllib3.exceptions.HTTPError, httpx.TransportError, ConnectionError, TimeoutError)
_RESTARTABLE = {SandboxState.STOPPED, SandboxState.ARCHIVED, SandboxState.PAUSED}
_USABLE = {
    SandboxState.STARTED,
    SandboxState.STARTING,
    SandboxState.RESTORING,
    SandboxState.RESUMING,
    SandboxState.CREATING,
}


def is_network(exc: BaseException) -> bool:
    """A transport failure, wherever the SDK wrapped it (urllib3 retries surface as a bare ``DaytonaError``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (DaytonaConnectionError, *_NETWORK)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, _RETRYABLE) or (isinstance(exc, DaytonaError) and is_network(exc))


def _delay(exc: BaseException, attempt: int) -> float:
    after: Any = (getattr(exc, "headers", None) or {}).get("Retry-After")
    if after is not None:
        try:
            return min(float(after), MAX_BACKOFF_S)
        except ValueError:
            pass
    return min(BACKOFF_S * 2.0**attempt, MAX_BACKOFF_S) * random.uniform(0.5, 1.5)  # noqa: S311 - retry jitter, not a secret


def retry(what: str, call: Callable[[], T], *, attempts: int = ATTEMPTS) -> T:
    """``call()``, retried while it fails in a way a retry can fix. Only for idempotent calls."""
    for attempt in range(attempts):
        try:
            return call()
        except DaytonaError as exc:
            if attempt == attempts - 1 or not retryable(exc):
                raise
            delay = _delay(exc, attempt)
            logger.warning("Daytona: %s failed (%s); retrying in %.2f s", what, exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def explain(exc: BaseException, api_url: str) -> str:
    """One sentence a user can act on."""
    detail = str(exc).strip() or type(exc).__name__
    if isinstance(exc, DaytonaAuthenticationError) or getattr(exc, "status_code", None) == 401:
        return (
            f"Daytona at {api_url} rejected FLEET_DAYTONA_API_KEY (401 Unauthorized): check the key "
            f"(Daytona dashboard, API keys) and FLEET_DAYTONA_API_URL"
        )
    if isinstance(exc, DaytonaForbiddenError):
        return (
            f"Daytona refused the request (403 Forbidden): {detail}. The key may lack sandbox permissions, or "
            f"the organization is over its CPU, memory or disk quota: stop or delete sandboxes, or raise it"
        )
    if isinstance(exc, DaytonaRateLimitError):
        return f"Daytona's rate limit or quota was reached (429): {detail}. Wait a little and try again"
    if is_network(exc):
        return f"cannot reach Daytona at {api_url}: {detail}. Check the network and FLEET_DAYTONA_API_URL"
    if isinstance(exc, (DaytonaInternalServerError, DaytonaBadGatewayError, DaytonaServiceUnavailableError)):
        return f"Daytona is failing ({detail}); try again later"
    if isinstance(exc, DaytonaTimeoutError):
        return f"Daytona did not finish in time: {detail}"
    return f"Daytona failed: {detail}"


def unavailable(exc: BaseException, api_url: str) -> SandboxUnavailableError:
    """The ``FleetError`` for a Daytona failure that stops a turn before any code ran."""
    if isinstance(exc, DaytonaAuthenticationError) or getattr(exc, "status_code", None) == 401:
        code = "daytona_auth"
    elif isinstance(exc, (DaytonaForbiddenError, DaytonaRateLimitError)):
        code = "daytona_quota"
    elif is_network(exc):
        code = "daytona_unreachable"
    else:
        code = "daytona_error"
    return SandboxUnavailableError(explain(exc, api_url), code=code)


class DaytonaBox:
    """One Fleet session's sandbox: shared by every interpreter of its turns, each in its own context."""

    def __init__(self, client: Any, sandbox: Any, *, session_id: str, api_url: str) -> None:
        self.client = client
        self.sandbox = sandbox
        self.session_id = session_id
        self.api_url = api_url
        self.baseline: dict[str, str] = {}  # workspace path -> sha256 both sides held after the last sync
        self._jobs: list[threading.Thread] = []
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        return str(self.sandbox.id)

    def retry(self, what: str, call: Callable[[], T]) -> T:
        return retry(what, call)

    def explain(self, exc: BaseException) -> str:
        return explain(exc, self.api_url)

    def background(self, what: str, call: Callable[[], Any]) -> None:
        """Run an idempotent call off the caller's thread (cleanup must never stall an execute)."""

        def work() -> None:
            try:
                retry(what, call)
            except DaytonaNotFoundError:
                pass
            except DaytonaError as exc:
                logger.warning("Daytona: could not %s: %s", what, self.explain(exc))

        thread = threading.Thread(target=work, name="fleet-daytona-cleanup", daemon=True)
        with self._lock:
            self._jobs = [job for job in self._jobs if job.is_alive()] + [thread]
        thread.start()

    def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) for background cleanup to finish."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.join(max(0.0, deadline - time.monotonic()))

    def ensure_running(self) -> bool:
        """Refresh and, if it was stopped, start the sandbox; false when it is gone or broken."""
        try:
            retry("refresh the sandbox", self.sandbox.refresh_data)
        except DaytonaNotFoundError:
            return False
        state = self.sandbox.state
        if state in _RESTARTABLE:
            logger.info("Daytona: starting sandbox %s again (it was %s)", self.id, state)
            retry("start the sandbox", lambda: self.sandbox.start(timeout=120))
            return True
        if state in _USABLE and state != SandboxState.STARTED:
            self.sandbox.wait_for_sandbox_start(timeout=120)
        return state in _USABLE
