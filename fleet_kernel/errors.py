"""Fleet's errors: one base with a stable ``code`` and an HTTP ``status``, rendered once per edge.

Routes and kernel handlers only ``raise``; the API turns a ``FleetError`` into
``{"error": {"code", "message"}}`` and the kernel into one readable error output.
Errors in model-written code never become a ``FleetError``: they go back to the model as text.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error Fleet reports to a user. ``message`` says what to do next."""

    code = "fleet_error"
    status = 500

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status


class ConfigError(FleetError):
    """Invalid ``fleet.toml`` or environment value; names the key and the allowed values."""

    code = "config_error"
    status = 500


class NotFoundError(FleetError):
    code = "not_found"
    status = 404


class ConflictError(FleetError):
    """A second turn on a busy session, or deleting a session while a turn runs."""

    code = "conflict"
    status = 409

    def __init__(self, message: str, *, turn_id: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.turn_id = turn_id


class ValidationError(FleetError):
    code = "validation_error"
    status = 422


class PayloadTooLargeError(FleetError):
    code = "payload_too_large"
    status = 413


class InsufficientStorageError(FleetError):
    """A full disk (``disk_full``) or the workspace quota (``workspace_quota``): nothing was written."""

    code = "disk_full"
    status = 507


class StoreUnavailableError(FleetError):
    """The database cannot be reached or is not migrated."""

    code = "store_unavailable"
    status = 503


class LMError(FleetError):
    """No model configured, bad key, provider down: the turn ends with ``turn.failed``."""

    code = "lm_error"
    status = 502


class SandboxUnavailableError(FleetError):
    """The chosen sandbox backend cannot start here; the message says what to install or set."""

    code = "sandbox_unavailable"
    status = 503


class SandboxBusyError(FleetError):
    """As many local sandboxes run as ``[sandbox] max_sandboxes`` allows; a turn may start once one ends."""

    code = "sandbox_busy"
    status = 503
    retry_after_s = 5


class TurnCancelled(BaseException):
    """Raised inside a running turn when it is cancelled.

    A ``BaseException`` on purpose: dspy's callback wrapper and model-written ``except Exception``
    blocks must not swallow it.
    """

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class TurnDeadlineExceeded(TurnCancelled):
    """The turn ran past its configured deadline (``limits.turn_timeout_s``)."""

    code = "deadline_exceeded"


class TooManyErrors(TurnCancelled):
    """The model's code failed ``limits.max_errors`` steps in a row: the turn stops instead of looping."""

    code = "too_many_errors"
